"""The TVM peer of the CPU benchmarks: TVM's GEMM as a TVM user would hand-schedule it.

A 8 x 32 register tile over B repacked into 32-wide column panels (the repacking is part of
the kernel and of its time), loops io (parallel) jo k ii (unrolled) ji (vectorized), the
accumulator tile in a `local` cache_write block that LLVM keeps in registers. Written for
TVM 0.2x's `s_tir` schedule API; the LLVM target asks for AVX-512 where the CPU has it and
AVX2 otherwise (both with FMA), chosen at run time like rivet's own micro-kernels.
"""

import tvm
from tvm import s_tir, te


def cpu_target():
    """An LLVM target for this CPU's widest vector ISA (TVM 0.2x wants the dict form)."""
    try:
        flags = open("/proc/cpuinfo").read().split()
    except OSError:
        flags = []
    mattr = ["+avx512f", "+fma"] if "avx512f" in flags else ["+avx2", "+fma"]
    return {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mattr": mattr}


def _gemm_repacked(n, nr):
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), "k")
    Bp = te.compute((n // nr, n, nr), lambda jo, kk, ji: B[kk, jo * nr + ji], name="Bp")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * Bp[j // nr, k, j % nr], axis=k), name="C")
    return te.create_prim_func([A, B, C])


def gemm_hand_scheduled(n, mr=8, nr=32):
    """`C = A @ B` for n x n float32 (n a multiple of mr and nr), scheduled by hand."""
    if n % mr or n % nr:
        raise ValueError(f"n={n} must be a multiple of {mr} and {nr}")
    sch = s_tir.Schedule(_gemm_repacked(n, nr))
    blk = sch.get_sblock("C")
    i, j, k = sch.get_loops(blk)
    io, ii = sch.split(i, [None, mr])
    jo, ji = sch.split(j, [None, nr])
    sch.reorder(io, jo, k, ii, ji)
    acc = sch.cache_write(blk, 0, "local")  # the tile, written back once per (io, jo)
    sch.reverse_compute_at(acc, jo)
    sch.vectorize(ji)
    sch.unroll(ii)
    sch.vectorize(sch.get_loops(acc)[-1])
    sch.parallel(io)
    sch.decompose_reduction(blk, k)  # after vectorize: TVM's compact-dataflow check wants it so
    pack = sch.get_loops(sch.get_sblock("Bp"))
    sch.parallel(pack[0])
    sch.vectorize(pack[-1])
    return tvm.compile(sch.mod, target=tvm.target.Target(cpu_target()))
