"""tensorize (s[C].tensorize(axis, "gemm_update")): a tiled GEMM whose 12 x 32 register tile
becomes a micro-kernel call. The CPU result equals the interpreter's bit for bit (both fuse each
multiply-add in the same order) and float64 maths within the fused-sum bound (docs/cpu.md);
every micro-kernel variant forced by RIVET_MICROKERNEL gives the same bits; nests that are not
the intrinsic's computation raise CompileError.
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import rivet
from rivet import te

from conftest import backend_names, poison


def tiled(m, n, kk, body=lambda a, b: a * b, dtype="float32", axis=0):
    A = te.placeholder((m, kk), dtype, name="A")
    B = te.placeholder((kk, n), dtype, name="B")
    k = te.reduce_axis((0, kk), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(body(A[i, k], B[k, j]), axis=k), name="C")
    s = rivet.create_schedule(C)
    i, j = C.op.axis
    io, ii = s[C].split(i, factor=12)
    jo, ji = s[C].split(j, factor=32)
    s[C].reorder(io, jo, ii, ji, k)
    s[C].parallel(io)
    s[C].tensorize([ii, ji, k][axis], "gemm_update")
    return A, B, C, s


@pytest.mark.parametrize("kk", [1, 3, 17, 97])
def test_tensorized_tile_matches_interp_bitwise_and_float64(kk):
    rng = np.random.default_rng(kk)
    a = rng.standard_normal((24, kk), dtype=np.float32)
    b = rng.standard_normal((kk, 64), dtype=np.float32)
    outs = {}
    for target in backend_names(runnable=True):
        A, B, C, s = tiled(24, 64, kk)
        f = rivet.build(s, [A, B, C], target=target, name="t")["t"]
        c = poison(np.empty((24, 64), np.float32))
        # A transposed view and a stepped view: strided operands work in place.
        f(np.ascontiguousarray(a.T).T, np.repeat(b, 2, axis=1)[:, ::2], c)
        outs[target] = c
    assert outs["cpu"].tobytes() == outs["interp"].tobytes()
    want = a.astype(np.float64) @ b.astype(np.float64)
    bound = (kk + 1) * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(b))
    assert np.all(np.abs(outs["cpu"] - want) <= bound)


def test_every_forced_variant_gives_the_same_bits():
    script = (
        "import numpy as np, rivet, sys\n"
        "sys.path.insert(0, %r)\n"
        "from test_tensorize import tiled\n"
        "A, B, C, s = tiled(24, 64, 19)\n"
        "f = rivet.build(s, [A, B, C], target='cpu', name='t')['t']\n"
        "rng = np.random.default_rng(3)\n"
        "a = rng.standard_normal((24, 19), dtype=np.float32)\n"
        "b = rng.standard_normal((19, 64), dtype=np.float32)\n"
        "sys.stdout.write(f(a, b).numpy().tobytes().hex())\n"
    ) % os.path.dirname(__file__)
    results = {}
    for v in ("avx512", "avx2", "portable", "bogus"):
        env = dict(os.environ, RIVET_MICROKERNEL=v)
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        if r.returncode == 0:
            results[v] = r.stdout
        else:
            assert "RIVET_MICROKERNEL" in r.stderr and "CompileError" in r.stderr, r.stderr
    assert "bogus" not in results and "portable" in results
    assert len(set(results.values())) == 1, list(results)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(body=lambda a, b: a + b), "not a product"),
        (dict(dtype="int32"), "float32 or float64"),
        (dict(axis=1), "nest of 3 loops"),
        (dict(m=20), "a condition"),
    ],
)
def test_tensorize_refuses_other_computations(kwargs, needle):
    args = dict(m=24, n=64, kk=8)
    args.update(kwargs)
    A, B, C, s = tiled(**args)
    with pytest.raises(rivet.CompileError, match=needle):
        rivet.build(s, [A, B, C], target="cpu", name="t")


def test_tensorize_arguments_are_checked():
    A, B, C, s = tiled(24, 64, 8, axis=0)
    i, j = C.op.axis
    with pytest.raises(rivet.CompileError, match="gemm_update"):
        s[C].tensorize(s[C].op.axis[0] if hasattr(s[C], "op") else i, "conv")
    with pytest.raises(rivet.CompileError, match="already split"):
        s[C].tensorize(i, "gemm_update")


def _example():
    """compiler/examples/gemm_tensorized.py (the benchmarks' blocked GEMM), imported."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "compiler", "examples",
                        "gemm_tensorized.py")
    spec = importlib.util.spec_from_file_location("gemm_tensorized", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("m,n,k,trans", [(1, 1, 1, False), (3, 17, 97, True), (97, 3, 17, False),
                                         (25, 70, 300, True)])
def test_cranelift_register_tile_equals_the_micro_kernel_and_the_interpreter(m, n, k, trans):
    """The example's pure-Cranelift GEMM (tensorize off): a 12 x 4 register tile written with
    split / reorder / unroll / vectorize and fma=True. `unroll` unrolls the 12 rows (no loop
    left), the packed panels' strides are constants in the flattened IR, the multiply-adds are
    packed `fma`s; its bits equal the tensorized micro-kernel's (same fused operations in the
    same order) and the interpreter's running the same program."""
    ex = _example()
    rng = np.random.default_rng(m * 1000 + n + k)
    a = rng.standard_normal((k, m) if trans else (m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if trans else (k, n), dtype=np.float32)
    mod = ex.gemm(m, n, k, trans, trans, tensorize=False, module=True)
    ir, clif = mod.get_source("ir"), mod.get_source("cranelift")
    assert "unrolled for" not in ir and "fma(" in ir, ir
    # Offsets into the packed panels (locals) use constant strides, not stride variables.
    assert not re.search(r"\b[AB]p\[[^\]]*[AB]p\.s\d", ir), ir
    assert "= fma v" in clif and "f32x4" in clif, clif
    tile = mod["gemm"]
    outs = []
    for f in (tile, ex.gemm(m, n, k, trans, trans, tensorize=True),
              ex.gemm(m, n, k, trans, trans, tensorize=False, target="interp")):
        c = poison(np.empty((m, n), np.float32))
        f(a, b, c)
        outs.append(c)
    assert outs[0].tobytes() == outs[1].tobytes(), "the micro-kernel"
    assert outs[0].tobytes() == outs[2].tobytes(), "the interpreter"
    aa, bb = (a.T if trans else a), (b.T if trans else b)
    want = aa.astype(np.float64) @ bb.astype(np.float64)
    bound = (k + 1) * np.finfo(np.float32).eps * (np.abs(aa).astype(np.float64) @ np.abs(bb))
    assert np.all(np.abs(outs[0] - want) <= bound + 1e-30)
