#!/usr/bin/env python
"""Two or more rivet builds side by side on one GEMM shape: per-call time, rounds interleaved.

`C = A (M x K) @ B (K x N)`, constant shapes, no schedule (the default packed GEMM). Each
build (NAME=PYTHONPATH, "" the installed rivet) runs in its own subprocess per round with
RIVET_NUM_THREADS set (OpenBLAS held to one thread: numpy only makes the data), times CALLS
calls after 20 warm-up calls and prints the least call time and the median; the rounds
alternate the builds, so a noisy neighbour hits each alike. The summary keeps, per build,
the least of the minima and of the medians over the rounds: on these shared VMs single
medians move by 30 % between identical runs, the minima by a few percent.

    .venv/bin/python benches/gemm_ab.py --rivet before=build/a --rivet after=build/b \\
        --shape 256x256x256 --dtype float32 --threads 2 --rounds 5 --calls 1000
"""

import argparse
import os
import subprocess
import sys
import time


def worker(m, n, k, dtype, calls):
    import numpy as np

    import rivet
    from rivet import te

    A = te.placeholder((m, k), dtype=dtype, name="A")
    B = te.placeholder((k, n), dtype=dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    f = rivet.build(rivet.create_schedule(C), [A, B, C], name="g")["g"]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c = np.full((m, n), np.nan, dtype)
    f(a, b, c)
    err = np.abs(c - a.astype(np.float64) @ b.astype(np.float64)).max()
    assert err <= 1e-3 * max(1.0, k ** 0.5), f"wrong result: max abs error {err}"
    for _ in range(20):
        f(a, b, c)
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        f(a, b, c)
        ts.append(time.perf_counter() - t)
    ts.sort()
    print(f"{ts[0] * 1e3:.4f} {ts[len(ts) // 2] * 1e3:.4f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--rivet", action="append", required=True, metavar="NAME=PYTHONPATH")
    p.add_argument("--shape", default="256x256x256", help="MxNxK")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=1000)
    a = p.parse_args()
    m, n, k = (int(x) for x in a.shape.split("x"))
    if a.worker:
        return worker(m, n, k, a.dtype, a.calls)
    builds = [r.split("=", 1) for r in a.rivet]
    best = {name: [float("inf"), float("inf")] for name, _ in builds}
    for rnd in range(a.rounds):
        for name, path in builds:
            env = dict(os.environ, RIVET_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS="1",
                       OMP_NUM_THREADS="1")
            if path:
                env["PYTHONPATH"] = path
            out = subprocess.run([sys.executable, __file__, "--worker", *sys.argv[1:]], env=env,
                                 capture_output=True, text=True, check=True).stdout.split()
            lo, med = float(out[0]), float(out[1])
            print(f"round {rnd + 1} {name}: min {lo:.4f} ms, median {med:.4f} ms", flush=True)
            best[name] = [min(best[name][0], lo), min(best[name][1], med)]
    print(f"{a.shape} {a.dtype}, {a.threads} thread(s), {a.rounds} rounds of {a.calls} calls:")
    for name, (lo, med) in best.items():
        print(f"  {name:>10}: least min {lo:.4f} ms, least median {med:.4f} ms")


if __name__ == "__main__":
    main()
