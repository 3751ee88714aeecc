"""Build time of a GEMM kernel for the CPU (the target: a few milliseconds).

Builds the seed GEMM (symbolic n) unscheduled and with the split/reorder/parallel schedule
of the README tutorial, N times each in one process, and prints first / median / min in ms.
Run: .venv/bin/python benches/build_time.py [N]
"""

import statistics
import sys
import time

import rivet
from rivet import te


def program(scheduled):
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


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    for scheduled in (False, True):
        times = []
        for _ in range(reps):
            s, args = program(scheduled)
            t0 = time.perf_counter()
            rivet.build(s, args, target="cpu", name="mm")
            times.append((time.perf_counter() - t0) * 1e3)
        label = "scheduled" if scheduled else "no schedule"
        print(f"GEMM build ({label:11}): first {times[0]:.2f} ms, median {statistics.median(times):.2f} ms, "
              f"min {min(times):.2f} ms over {reps} builds")


if __name__ == "__main__":
    main()
