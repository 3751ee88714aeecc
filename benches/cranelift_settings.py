"""Cranelift settings side by side: build time and run time of the seed GEMM under each.

For each setting (a `RIVET_CLIF_SET` string of Cranelift shared flags, `""` for the
default), builds the unscheduled seed GEMM of `build_time.py` (symbolic n, default CPU
schedule, float32 and float64) in one process, checks every setting's result is bit-equal
to the default's, then times the kernels in interleaved rounds (setting A, B, C, A, B, C,
...), so every setting sees the same machine load. Times are process CPU time per call
(`time.process_time`, all threads), one thread (`RIVET_NUM_THREADS=1`), median over rounds.
Build time is the build's process CPU time in the same process, median over interleaved
rounds with the build cache off (warm builds: for the first build in a process,
`benches/build_phases.py` is the measure to read).

`RIVET_CLIF_SET` accepts the settings that change speed only (docs/python_api.md); the build
cache is off here, since a cached module keeps the settings it was built with.
Run: RIVET_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benches/cranelift_settings.py
"""

import os
import statistics
import sys
import time

os.environ["RIVET_BUILD_CACHE"] = "0"
os.environ.setdefault("RIVET_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_time  # noqa: E402

SETTINGS = [
    "",
    "unwind_info=false",
    "regalloc_algorithm=single_pass",
    "opt_level=none",
    "opt_level=none,regalloc_algorithm=single_pass",
]


def build(setting, dtype):
    import rivet
    from rivet import te

    os.environ["RIVET_CLIF_SET"] = setting
    n = te.var("n")
    A = te.placeholder((n, n), dtype, name="A")
    B = te.placeholder((n, n), dtype, name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = rivet.create_schedule(C)
    t0 = time.process_time()
    f = rivet.build(s, [A, B, C], target="cpu", name="mm")["mm"]
    return f, time.process_time() - t0


def main():
    sizes = [int(x) for x in (sys.argv[1:] or ["97", "256", "512"])]
    rounds = 21
    print(f"setting{'':40} build ms (f32)")
    funcs = {st: {dt: build(st, dt)[0] for dt in ("float32", "float64")} for st in SETTINGS}
    bt = {st: [] for st in SETTINGS}
    for _ in range(rounds):
        for st in SETTINGS:
            bt[st].append(build(st, "float32")[1])
    for st in SETTINGS:
        print(f"{st or 'default':47} {statistics.median(bt[st]) * 1e3:8.2f}")
    os.environ["RIVET_CLIF_SET"] = ""
    rng = np.random.default_rng(0)
    for dt in ("float32", "float64"):
        for n in sizes:
            a = rng.standard_normal((n, n)).astype(dt)
            b = rng.standard_normal((n, n)).astype(dt)
            outs = {}
            for st in SETTINGS:
                c = np.zeros((n, n), dt)
                funcs[st][dt](a, b, c)
                outs[st] = c
            for st in SETTINGS:
                if not np.array_equal(outs[st], outs[""]):
                    raise AssertionError(f"{st}: {dt} n={n} differs from the default")
            reps = max(1, int(2e7 / n**3))
            ts = {st: [] for st in SETTINGS}
            for _ in range(rounds):
                for st in SETTINGS:
                    c = outs[st]
                    t0 = time.process_time()
                    for _ in range(reps):
                        funcs[st][dt](a, b, c)
                    ts[st].append((time.process_time() - t0) / reps)
            base = statistics.median(ts[""])
            for st in SETTINGS:
                m = statistics.median(ts[st])
                print(f"{dt} n={n:4} {st or 'default':47} {m * 1e6:10.1f} us  x{m / base:.3f}")


if __name__ == "__main__":
    main()
