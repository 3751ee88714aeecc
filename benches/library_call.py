"""Call overhead of a function handed over by a Rust library (rivet.load_library, the C ABI
crossing) against the same function built in this process, on three 2x2 torch tensors.

    cargo build --release -p rivet-example-library
    OMP_NUM_THREADS=1 .venv/bin/python benches/library_call.py

Prints the best of 5 x 20,000 calls per round, three alternating rounds, and the ratio.
"""

import os
import timeit

import torch

import rivet
from rivet import te

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    rivet.load_library(
        os.path.join(ROOT, "target", "release", "librivet_example_library.so"), override=True
    )
    lib = rivet.get_global_func("example.gemm")
    n, m, k = te.var("n"), te.var("m"), te.var("k")
    A = te.placeholder((n, k), "float32", name="A")
    B = te.placeholder((k, m), "float32", name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    own = rivet.build(rivet.create_schedule(C), [A, B, C], name="gemm")["gemm"]
    a, b, c = torch.rand(2, 2), torch.rand(2, 2), torch.empty(2, 2)
    best = {}
    for name, f in [("in-process", own), ("library", lib)] * 3:
        t = min(timeit.repeat(lambda: f(a, b, c), number=20000, repeat=5)) / 20000 * 1e6
        best[name] = min(best.get(name, t), t)
        print(f"{name}: {t:.2f} us")
    print(f"library / in-process: {best['library'] / best['in-process']:.2f}"
          f" (+{best['library'] - best['in-process']:.2f} us per call)")


if __name__ == "__main__":
    main()
