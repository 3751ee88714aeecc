"""The blocked GEMM of docs/cpu.md written with the Python DSL: A and B packed into zero-padded
panels, the 12 x 32 register tile tensorized onto the `gemm_update` micro-kernel (AVX-512 /
AVX2 / portable, chosen at run time; RIVET_MICROKERNEL forces one). Checked against numpy at a
few sizes (transposed and strided operands too), then timed informally at 1024 against numpy.

Run: python compiler/examples/gemm_tensorized.py [n]
"""
import sys
import time

import numpy as np

import rivet
from rivet import te

MR, NR, KC = 12, 32, 256


def gemm(m, n, k, a_t=False, b_t=False, tensorize=True, target="cpu", module=False):
    """`tensorize=False`: the same packing and blocking, the register tile written in the DSL
    for Cranelift: 12 rows (unrolled) by one f32x4 of columns, the 12 accumulators in
    registers across the k loop, A broadcast from the packed panel, fused multiply-adds
    (`fma=True`: the micro-kernel's own rounding, so both give the same bits) — the
    pure-Cranelift figure of the benchmarks (a 12x4 tile: what Cranelift's register allocator keeps in registers)."""
    mo, no = -(-m // MR), -(-n // NR)
    kc = min(KC, max(k, 1))
    kp = -(-k // kc) * kc
    A = te.placeholder((k, m) if a_t else (m, k), "float32", name="A")
    B = te.placeholder((n, k) if b_t else (k, n), "float32", name="B")

    def a_at(i, p):
        return A[p, i] if a_t else A[i, p]

    def b_at(p, j):
        return B[j, p] if b_t else B[p, j]

    Ap = te.compute((mo, kp, MR), lambda io, p, ii: te.if_then_else(
        te.all(io * MR + ii < m, p < k), a_at(io * MR + ii, p), te.const(0.0, "float32")), name="Ap")
    Bp = te.compute((no, kp, NR), lambda jo, p, ji: te.if_then_else(
        te.all(jo * NR + ji < n, p < k), b_at(p, jo * NR + ji), te.const(0.0, "float32")), name="Bp")
    p = te.reduce_axis((0, kp), name="p")
    # The reduction over the padded shape, indexed through the tile: once its loops are split
    # by the tile, tensorize folds i // MR, i % MR into the panel's (io, ii).
    aligned = m % MR == 0 and n % NR == 0
    Cp = te.compute((mo * MR, no * NR), lambda i, j: te.sum(
        Ap[i // MR, p, i % MR] * Bp[j // NR, p, j % NR], axis=p), name="C" if aligned else "Cp")
    C = Cp if aligned else te.compute((m, n), lambda i, j: Cp[i, j], name="C")
    s = rivet.create_schedule(C)
    i, j = Cp.op.axis
    io, ii = s[Cp].split(i, factor=MR)
    jo, ji = s[Cp].split(j, factor=NR)
    po, pi = s[Cp].split(p, factor=kc)
    s[Cp].parallel(jo)
    if tensorize:
        s[Cp].reorder(jo, po, io, ii, ji, pi)
        s[Cp].tensorize(ii, "gemm_update")
    else:
        jj, jv = s[Cp].split(ji, factor=4)
        s[Cp].reorder(jo, po, io, jj, pi, ii, jv)
        s[Cp].unroll(ii)
        s[Cp].vectorize(jv)
    s[Ap].parallel(Ap.op.axis[0])
    if b_t:
        s[Bp].parallel(Bp.op.axis[0])
    else:                                   # read B row by row
        jo_, p_, ji_ = Bp.op.axis
        s[Bp].reorder(p_, jo_, ji_)
        s[Bp].parallel(p_)
    if not aligned:
        s[C].parallel(C.op.axis[0])
    mod = rivet.build(s, [A, B, C], target=target, name="gemm", fma=not tensorize)
    return mod if module else mod["gemm"]


def check(m, n, k, a_t, b_t, rng):
    f = gemm(m, n, k, a_t, b_t)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    if b_t:
        b = np.ascontiguousarray(b.T).T      # b.T below is then a view of a compact (n, k)
    if a_t:
        a = np.ascontiguousarray(a.T).T
    # Transposed operands are passed as transposed views (strided, no copy); plain ones as
    # every-other-column views of a wider array (strided too).
    a_arg = a.T if a_t else np.repeat(a, 2, axis=1)[:, ::2]
    b_arg = b.T if b_t else np.repeat(b, 2, axis=1)[:, ::2]
    c = np.full((m, n), np.nan, np.float32)
    f(a_arg, b_arg, c)
    want = a.astype(np.float64) @ b.astype(np.float64)
    bound = (k + 1) * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(b))
    assert np.all(np.abs(c - want) <= bound + 1e-30), (m, n, k, a_t, b_t)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    rng = np.random.default_rng(0)
    for (m, nn, k) in [(1, 1, 1), (3, 17, 97), (97, 3, 17), (17, 97, 3)]:
        for a_t, b_t in [(False, False), (True, True)]:
            check(m, nn, k, a_t, b_t, rng)
    print("checked against numpy at 1, 3, 17, 97 (plain, transposed and strided operands)")
    t0 = time.perf_counter()
    f = gemm(n, n, n)
    build_ms = (time.perf_counter() - t0) * 1e3
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), np.float32)

    def median(fn, reps=9):
        fn()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2]

    t_r = median(lambda: f(a, b, c))
    t_np = median(lambda: np.matmul(a, b, out=c))
    flop = 2.0 * n ** 3
    print(f"n={n}: rivet tensorized {flop / t_r / 1e9:.1f} GFLOP/s (build {build_ms:.1f} ms), "
          f"numpy {flop / t_np / 1e9:.1f} GFLOP/s, ratio {t_np / t_r:.2f}x")


if __name__ == "__main__":
    main()
