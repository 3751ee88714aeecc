"""Build time of a GEMM kernel for the CPU.

Builds the seed GEMM (`C[i, j] = sum_k A[i, k] * B[k, j]`, symbolic n) unscheduled (the
default CPU schedule's packed GEMM) and with the split/reorder/parallel schedule of the README
tutorial.

Run: .venv/bin/python benches/build_time.py [N]
  N builds of each program in one process, each of a freshly made program (first / median /
  min in ms); with the in-process build cache on (the default) every build after the first
  is a cache hit, so the line with RIVET_BUILD_CACHE=0 is the uncached build.

Run: .venv/bin/python benches/build_time.py --fresh P
  P fresh processes per line (median, min and max over them), the unscheduled GEMM:
  - the first build in a process, wall and CPU time (the CPU time is what to read on a
    loaded machine);
  - `rivet.load_module` of the saved GEMM in a fresh process: what a disk cache of the
    lowered IR would cost on a hit (a loaded module is verified, proven and compiled again);
  - the same build again in that process: the program object built again, and an equal
    program made anew (medians over 200 builds each; in-process cache hits).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def program(scheduled):
    import rivet
    from rivet import te

    n = te.var("n")
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = rivet.create_schedule(C)
    if scheduled:
        i, j = C.op.axis
        io, ii = s[C].split(i, factor=32)
        s[C].reorder(io, k, ii, j)
        s[C].vectorize(j)
        s[C].parallel(io)
    return s, [A, B, C]


def in_process(reps):
    import rivet

    for scheduled in (False, True):
        times = []
        for _ in range(reps):
            s, args = program(scheduled)
            t0 = time.perf_counter()
            rivet.build(s, args, target="cpu", name="mm")
            times.append((time.perf_counter() - t0) * 1e3)
        label = "scheduled" if scheduled else "no schedule"
        cache = os.environ.get("RIVET_BUILD_CACHE", "1")
        print(f"GEMM build ({label:11}, RIVET_BUILD_CACHE={cache}): first {times[0]:.2f} ms, "
              f"median {statistics.median(times):.3f} ms, min {min(times):.3f} ms over {reps} builds")


def child():
    """One fresh process: the first build, then repeats; prints a JSON line."""
    import rivet

    s, args = program(False)
    t0, c0 = time.perf_counter(), time.process_time()
    m = rivet.build(s, args, target="cpu", name="mm")
    first, first_cpu = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
    same, equal = [], []
    for _ in range(200):
        t0 = time.perf_counter()
        rivet.build(s, args, target="cpu", name="mm")
        same.append((time.perf_counter() - t0) * 1e6)
    for _ in range(200):
        s2, args2 = program(False)
        t0 = time.perf_counter()
        rivet.build(s2, args2, target="cpu", name="mm")
        equal.append((time.perf_counter() - t0) * 1e6)
    if len(sys.argv) > 2:
        m.save(sys.argv[2])
    print(json.dumps({"first_ms": first, "first_cpu_ms": first_cpu, "same_us": statistics.median(same),
                      "equal_us": statistics.median(equal)}))


def child_load(path):
    import rivet

    t0, c0 = time.perf_counter(), time.process_time()
    rivet.load_module(path)
    print(json.dumps({"first_ms": (time.perf_counter() - t0) * 1e3,
                      "first_cpu_ms": (time.process_time() - c0) * 1e3}))


def run_child(env, *extra):
    out = subprocess.run([sys.executable, __file__, *extra] if extra else [sys.executable, __file__, "--child"],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def summary(xs, unit):
    return (f"median {statistics.median(xs):.3f} {unit} (min {min(xs):.3f}, max {max(xs):.3f}, "
            f"{len(xs)} processes)")


def fresh(procs):
    base = dict(os.environ)
    for k in ("RIVET_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        base.setdefault(k, "1")
    base.pop("RIVET_BUILD_CACHE", None)
    first, first_cpu, same, equal, load, load_cpu = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(base, RIVET_CACHE_DIR=tmp)
        saved = os.path.join(tmp, "mm.rivet")
        run_child(env, "--child", saved)
        for _ in range(procs):
            # Interleaved, so the machine's drift touches both alike.
            r = run_child(env)
            first.append(r["first_ms"])
            first_cpu.append(r["first_cpu_ms"])
            same.append(r["same_us"])
            equal.append(r["equal_us"])
            r = run_child(env, "--child-load", saved)
            load.append(r["first_ms"])
            load_cpu.append(r["first_cpu_ms"])
    print(f"first build in a fresh process, wall     : {summary(first, 'ms')}")
    print(f"first build in a fresh process, CPU      : {summary(first_cpu, 'ms')}")
    print(f"load_module of the saved GEMM, wall      : {summary(load, 'ms')}")
    print(f"load_module of the saved GEMM, CPU       : {summary(load_cpu, 'ms')}")
    print(f"same schedule built again (in-process)   : {summary(same, 'us')}")
    print(f"equal program made and built again       : {summary(equal, 'us')}")


def main():
    if sys.argv[1:2] == ["--child"]:
        child()
    elif sys.argv[1:2] == ["--child-load"]:
        child_load(sys.argv[2])
    elif len(sys.argv) > 2 and sys.argv[1] == "--fresh":
        fresh(int(sys.argv[2]))
    else:
        in_process(int(sys.argv[1]) if len(sys.argv) > 1 else 50)


if __name__ == "__main__":
    main()
