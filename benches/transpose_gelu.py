#!/usr/bin/env python
"""Forward of a 1024 x 1024 float32 transpose and gelu with rivet's default CPU schedule,
against torch and numpy, side by side in one process (the two default-schedule changes of
2026-11-28: transposing stages in 8 x 8 tiles, float32 erf on AVX2 machines).

    RIVET_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benches/transpose_gelu.py
    RIVET_ERF16=portable RIVET_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benches/transpose_gelu.py

The second command times gelu with the four-lane erf path (what AVX2-only machines ran
before). Each output is NaN-poisoned and checked once before timing; timings alternate
between the libraries and report the median over `--repeat` rounds of the mean of `--number`
calls.
"""

import argparse
import datetime
import os
import statistics
import time

import numpy as np
import torch

import rivet
import rivet.kernels as K
from rivet import te


def transpose():
    n, m = te.var("n"), te.var("m")
    a = te.placeholder((n, m), "float32", name="A")
    b = te.compute((m, n), lambda i, j: a[j, i], name="B")
    return rivet.build(rivet.create_schedule(b), [a, b], name="tr")["tr"]


def mean_ms(fn, number):
    fn()
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rng = np.random.default_rng()
    x = rng.standard_normal((args.n, args.n), dtype=np.float32)
    y = np.full_like(x, np.nan)
    tx = torch.from_numpy(x)

    tr = transpose()
    tr(x, y)
    assert (y == x.T).all(), "transpose differs from numpy's"
    gelu = K.gelu()
    y.fill(np.nan)
    gelu(x, y)
    torch.testing.assert_close(torch.from_numpy(y), torch.nn.functional.gelu(tx), rtol=1e-5, atol=1e-6)

    cases = {
        "transpose": {
            "rivet": lambda: tr(x, y),
            "torch": lambda: tx.t().contiguous(),
            "numpy": lambda: np.ascontiguousarray(x.T),
        },
        "gelu": {
            "rivet": lambda: gelu(x, y),
            "torch": lambda: torch.nn.functional.gelu(tx),
        },
    }
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    erf = os.environ.get("RIVET_ERF16", "default")
    print(f"# {now}, {args.n}^2 float32, rivet pool {rivet.num_threads()}, torch {torch.__version__}, RIVET_ERF16={erf}")
    for name, libs in cases.items():
        times = {lib: [] for lib in libs}
        for _ in range(args.repeat):
            for lib, fn in libs.items():
                times[lib].append(mean_ms(fn, args.number))
        med = {lib: statistics.median(ts) for lib, ts in times.items()}
        parts = "  ".join(f"{lib} {ms:7.3f} ms" for lib, ms in med.items())
        ratios = "  ".join(f"rivet/{lib} {med['rivet'] / ms:5.2f}" for lib, ms in med.items() if lib != "rivet")
        print(f"{name:10s} {parts}  {ratios}")


if __name__ == "__main__":
    main()
