#!/usr/bin/env python
"""Single loops of the CPU code generator against torch, one thread, 1024 x 1024 float32: what
a change to `codegen/cranelift` or `lower/` does to the passes a row-wise kernel is made of
(benches/RESULTS.md, "Code generation, 2026-11-25").

    RIVET_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benches/codegen_pieces.py
    PYTHONPATH=<other wheel> RIVET_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benches/codegen_pieces.py

Each kernel is built with the default CPU schedule and timed alone (median of 300 calls after
a warm-up, outputs preallocated); its result is checked against torch on the same data first.
  row_reduction  S[i] = sum_j dy[i, j] * g[j] * (x[i, j] - t[i] / n)   (layer_norm's backward sum)
  row_sum        S[i] = sum_j dy[i, j]                                    (torch: dy.sum(1))
  scale          Y = 2 * X                                                (torch: X * 2)
  column_sum     S[j] = sum_i dy[i, j]                                    (torch: dy.sum(0))
  row_update     Y[i, j] = dy[i, j] g[j] a[i] + (x[i, j] - b[i]) a[i]    (a backward's write pass)
Compare wheels side by side in one sitting (the machine's speed drifts between runs).
"""

import statistics
import time

import torch

import rivet
from rivet import te

N = 1024


def median_ms(fn, reps=300, warmup=20):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main():
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    X, dy = torch.randn(N, N, generator=g), torch.randn(N, N, generator=g)
    G, a, b = (torch.randn(N, generator=g) for _ in range(3))
    tX = te.placeholder((N, N), "float32", name="X")
    tdy = te.placeholder((N, N), "float32", name="dy")
    tg = te.placeholder((N,), "float32", name="g")
    ta = te.placeholder((N,), "float32", name="a")
    tb = te.placeholder((N,), "float32", name="b")
    r = te.reduce_axis((0, N), name="r")
    cases = {
        "row_reduction": (
            te.compute((N,), lambda i: te.sum(tdy[i, r] * tg[r] * (tX[i, r] - ta[i] / float(N)),
                                              axis=r), name="S"),
            [tdy, tg, tX, ta], [dy, G, X, a],
            lambda: (dy * G * (X - a[:, None] / N)).sum(1)),
        "row_sum": (te.compute((N,), lambda i: te.sum(tdy[i, r], axis=r), name="S"),
                    [tdy], [dy], lambda: dy.sum(1)),
        "scale": (te.compute((N, N), lambda i, j: tX[i, j] * 2.0, name="Y"), [tX], [X],
                  lambda: X * 2.0),
        "column_sum": (te.compute((N,), lambda j: te.sum(tdy[r, j], axis=r), name="S"),
                       [tdy], [dy], lambda: dy.sum(0)),
        "row_update": (
            te.compute((N, N), lambda i, j: tdy[i, j] * tg[j] * ta[i] + (tX[i, j] - tb[i]) * ta[i],
                       name="Y"),
            [tdy, tg, ta, tX, tb], [dy, G, a, X, b],
            lambda: dy * G * a[:, None] + (X - b[:, None]) * a[:, None]),
    }
    print(f"{'case':16s} {'rivet ms':>9s} {'torch ms':>9s}")
    for name, (out, targs, args, ref) in cases.items():
        f = rivet.build(rivet.create_schedule(out), [*targs, out], target="cpu", name=name)[name]
        res = torch.full([int(d) for d in out.shape], float("nan"))
        f(*args, res)
        torch.testing.assert_close(res, ref(), rtol=1e-4, atol=1e-2)
        print(f"{name:16s} {median_ms(lambda: f(*args, res)):9.3f} {median_ms(ref):9.3f}")


if __name__ == "__main__":
    main()
