"""Builds the seed GEMM (symbolic n, no schedule: the default packed GEMM) and calls it K
times on numpy arrays, checking the result once against float64 numpy: a program to count
instructions of under callgrind, where the difference between K and 1 calls, over K - 1, is
one call's count (benches/RESULTS.md, "The partition pass only where it pays").

    PYTHONHASHSEED=0 RIVET_NUM_THREADS=1 valgrind --tool=callgrind python benches/gemm_calls.py N K

(`PYTHONHASHSEED` fixed: with a random one Python's dict lookups move the totals by about
half a million instructions between runs.)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np

import build_time
import rivet

n, calls = int(sys.argv[1]), int(sys.argv[2])
s, a = build_time.program(False)
mm = rivet.build(s, a, target="cpu", name="mm")["mm"]
rng = np.random.default_rng(0)
A = rng.standard_normal((n, n), dtype=np.float32)
B = rng.standard_normal((n, n), dtype=np.float32)
C = np.empty((n, n), np.float32)
for _ in range(calls):
    mm(A, B, C)
want = A.astype(np.float64) @ B.astype(np.float64)
assert np.abs(C - want).max() <= 1e-3 * np.abs(want).max(), n
