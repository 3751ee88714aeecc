#!/usr/bin/env python
"""Thread scaling of the default GEMM: rivet (no schedule) against numpy (OpenBLAS).

Every case runs in its own subprocess with every library's thread count set to the same
value (benches/README.md). A case builds `C[i, j] = sum_k A[i, k] * B[k, j]` with no schedule
(the default CPU schedule's packed GEMM), checks it against float64 numpy, warms up and times
repeated calls (median). Cases: n in --sizes, float32 and float64, 1 and 2 threads.

    .venv/bin/python benches/gemm_threads.py
    .venv/bin/python benches/gemm_threads.py --sizes 1024 --dtypes float32
    # two rivet builds side by side (each NAME=PYTHONPATH; "" is the installed rivet):
    .venv/bin/python benches/gemm_threads.py --rivet before=build/a --rivet after=build/b
    # one build under two settings (NAME:VAR=VALUE, @dtype: only for that dtype):
    .venv/bin/python benches/gemm_threads.py --rivet old= --rivet new= \
        --rivet-env old:RIVET_GEMM_KC=0 --rivet-env old:RIVET_MICROKERNEL=portable@float64

Printed per case: each library's median, rivet / numpy speed (above 1: rivet faster) and,
per rivet build, its 2-thread speed over its own 1-thread speed. --rounds repeats the whole
plan (interleaved, so a noisy neighbour hits every library alike) and keeps each case's best
median. On a machine other processes load, `--stat cpu` compares CPU time instead (the
threads' time on the cores, which waiting for a core does not add to).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def thread_env(threads):
    t = str(threads)
    return {"OMP_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t, "MKL_NUM_THREADS": t,
            "RIVET_NUM_THREADS": t}


def timed(fn, budget):
    fn()
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    reps = int(max(3, min(50, budget / max(first, 1e-9))))
    ts, cpu = [], []
    for _ in range(reps):
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(ts), min(ts), min(cpu), reps


def worker(spec, budget):
    import numpy as np

    lib, dtype, n = spec.split(":")
    n = int(n)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    c = np.full((n, n), np.nan, dtype=dtype)
    if lib == "numpy":
        run = lambda: np.matmul(a, b, out=c)  # noqa: E731
    else:
        import rivet
        from rivet import te

        A = te.placeholder((n, n), dtype, name="A")
        B = te.placeholder((n, n), dtype, name="B")
        k = te.reduce_axis((0, n), name="k")
        C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        f = rivet.build(rivet.create_schedule(C), [A, B, C], target="cpu", name="mm")["mm"]
        run = lambda: f(a, b, c)  # noqa: E731
    med, lo, cpu, reps = timed(run, budget)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = float(np.max(np.abs(c - ref)) / max(1.0, np.max(np.abs(ref))))
    tol = 1e-4 if dtype == "float32" else 1e-12
    if not err < tol:
        raise AssertionError(f"{spec}: relative error {err}")
    return {"median_s": med, "min_s": lo, "cpu_s": cpu, "reps": reps}


def run_case(lib, path, dtype, n, threads, budget, timeout, extra=()):
    env = dict(os.environ, **thread_env(threads))
    for spec in extra:
        name, rest = spec.split(":", 1)
        var, val = rest.split("=", 1)
        val, _, only = val.partition("@")
        if name == lib and only in ("", dtype):
            env[var] = val
    if path:
        env["PYTHONPATH"] = path + os.pathsep + env.get("PYTHONPATH", "")
    spec = f"{'numpy' if lib == 'numpy' else 'rivet'}:{dtype}:{n}"
    try:
        p = subprocess.run([sys.executable, __file__, "--worker", spec, "--budget", str(budget)],
                           env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if p.returncode != 0:
        return {"error": ((p.stderr.strip().splitlines() or ["?"])[-1])[:160]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker")
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rivet", action="append", default=None, metavar="NAME=PYTHONPATH")
    ap.add_argument("--rivet-env", action="append", default=[], metavar="NAME:VAR=VALUE[@dtype]")
    ap.add_argument("--stat", choices=["median", "min", "cpu"], default="median",
                    help="min: the best call, steadier on a machine others load; cpu: the least "
                    "CPU time of a call, all threads together (then 2T/1T is parallel "
                    "efficiency: 1.0 when the second thread adds no work, stalls or spinning)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timed calls per case")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--json", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "gemm_threads.json"))
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.budget)))
        return
    rivets = [tuple(r.split("=", 1)) for r in (a.rivet or ["rivet="])]
    libs = [("numpy", "")] + [(name, path) for name, path in rivets]
    best = {}
    for _ in range(a.rounds):
        for n in a.sizes:
            for dtype in a.dtypes:
                for threads in a.threads:
                    for lib, path in libs:
                        key = (n, dtype, threads, lib)
                        r = run_case(lib, path, dtype, n, threads, a.budget, a.timeout, a.rivet_env)
                        old = best.get(key)
                        if old is None or "error" in old or ("error" not in r and r[a.stat + "_s"] < old[a.stat + "_s"]):
                            best[key] = r
    names = [lib for lib, _ in libs]
    head = f"{'n':>5} {'dtype':<8} {'thr':>3} " + " ".join(f"{x + ' ms':>12}" for x in names)
    head += " " + " ".join(f"{x + '/np':>10}" for x in names[1:])
    head += " " + " ".join(f"{x + ' 2T/1T':>12}" for x in names[1:])
    print(head)
    ms = lambda r: r[a.stat + "_s"] * 1e3 if "error" not in r else float("nan")  # noqa: E731
    for n in a.sizes:
        for dtype in a.dtypes:
            for threads in a.threads:
                row = [best[(n, dtype, threads, x)] for x in names]
                line = f"{n:>5} {dtype:<8} {threads:>3} " + " ".join(f"{ms(r):12.3f}" for r in row)
                line += " " + " ".join(f"{ms(row[0]) / ms(r):10.2f}x" for r in row[1:])
                if threads != 1 and 1 in a.threads:
                    one = [best[(n, dtype, 1, x)] for x in names]
                    line += " " + " ".join(f"{ms(o) / ms(r):11.2f}x" for o, r in zip(one[1:], row[1:]))
                print(line)
                for x, r in zip(names, row):
                    if "error" in r:
                        print(f"      {x}: {r['error']}")
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as fh:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "results": {":".join(map(str, k)): v for k, v in best.items()}}, fh, indent=1)


if __name__ == "__main__":
    main()
