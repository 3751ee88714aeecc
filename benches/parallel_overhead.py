#!/usr/bin/env python
"""What starting a parallel loop costs: `Y = 2 X` at a few sizes, rivet (default CPU schedule)
against torch (`torch.mul(x, 2.0, out=y)`), each at RIVET_NUM_THREADS / OMP_NUM_THREADS and
torch.set_num_threads of the same value (benches/README.md), median of 2,000 calls after 200.
At 1 thread it is the kernel's time; at 2 the difference is what handing chunks to the second
thread costs or saves (benches/RESULTS.md, "Parallel loops").

    RIVET_NUM_THREADS=2 OMP_NUM_THREADS=2 .venv/bin/python benches/parallel_overhead.py
    PYTHONPATH=<other wheel> RIVET_NUM_THREADS=2 OMP_NUM_THREADS=2 .venv/bin/python benches/parallel_overhead.py
"""

import os

import torch

import rivet
from codegen_pieces import median_ms
from rivet import te


def main():
    threads = int(os.environ.get("RIVET_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    print(f"threads {threads}, rivet.num_threads() {rivet.num_threads()}")
    print(f"{'n x n':>12} {'rivet us':>9} {'torch us':>9}")
    for n in (128, 256, 512, 1024):
        X = te.placeholder((n, n), "float32", name="X")
        Y = te.compute((n, n), lambda i, j: X[i, j] * 2.0, name="Y")
        f = rivet.build(rivet.create_schedule(Y), [X, Y], target="cpu", name="scale")["scale"]
        x = torch.randn(n, n)
        y = torch.full((n, n), float("nan"))
        f(x, y)
        torch.testing.assert_close(y, x * 2.0, rtol=0, atol=0)
        r = median_ms(lambda: f(x, y), reps=2000, warmup=200) * 1e3
        t = median_ms(lambda: torch.mul(x, 2.0, out=y), reps=2000, warmup=200) * 1e3
        print(f"{n:>5} x {n:<5} {r:9.1f} {t:9.1f}")


if __name__ == "__main__":
    main()
