"""`rivet.build(..., fma=True)`: float `a * b + c` contracted into fused multiply-adds, one
rounding, identically on every backend (the interpreter included), so results stay bit-exact
across backends and equal a numpy reference computed with one rounding per step; off by
default (two roundings, the naive loop's bits)."""

import numpy as np
import pytest

import rivet
from rivet import te

from conftest import backend_names, random_array


def gemm(dtype):
    n = te.var("n")
    A = te.placeholder((n, n), dtype, name="A")
    B = te.placeholder((n, n), dtype, name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, C


def fused_reference(a, b):
    """acc = fma(a[i, k], b[k, j], acc) in k order: the float32 product and sum are exact in
    float64 but for the sum's last bits, so rounding the float64 result to float32 is the
    one rounding (a double rounding could differ on an exact float32 tie; the data is fixed,
    so this is checked once, not by chance)."""
    n = a.shape[0]
    acc = np.zeros((n, n), dtype=np.float32)
    for q in range(n):
        prod = a[:, q : q + 1].astype(np.float64) * b[q : q + 1, :].astype(np.float64)
        acc = (prod + acc.astype(np.float64)).astype(np.float32)
    return acc


@pytest.mark.parametrize("dtype", ["float32"])
def test_fma_gemm_is_one_rounding_on_every_backend(dtype):
    A, B, C = gemm(dtype)
    s = rivet.create_schedule(C)
    n = 23
    rng = np.random.default_rng(8)
    a = random_array(rng, (n, n), dtype)
    b = random_array(rng, (n, n), dtype)
    outs = {}
    for target in backend_names(runnable=True):
        m = rivet.build(s, [A, B, C], target=target, name="mm", fma=True, default_schedule=False)
        assert "fma(" in m.get_source("ir")
        outs[target] = m["mm"](a, b).numpy()
        plain = rivet.build(s, [A, B, C], target=target, name="mm", default_schedule=False)
        assert "fma(" not in plain.get_source("ir")
    assert outs["interp"].tobytes() == outs["cpu"].tobytes()
    np.testing.assert_array_equal(outs["cpu"], fused_reference(a, b))
    # The default CPU schedule's packed GEMM fuses every multiply-add in k order too (the
    # micro-kernel): the same bits, with or without fma=True.
    for fma in (False, True):
        packed = rivet.build(s, [A, B, C], target="cpu", name="mm", fma=fma)
        assert "call gemm_update" in packed.get_source("ir")
        np.testing.assert_array_equal(packed["mm"](a, b).numpy(), fused_reference(a, b))
    # Unfused, the naive loop's bits differ somewhere (two roundings per step).
    np.testing.assert_allclose(outs["cpu"], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_fma_must_be_a_bool():
    A, B, C = gemm("float32")
    with pytest.raises(TypeError):
        rivet.build(rivet.create_schedule(C), [A, B, C], fma="yes")
