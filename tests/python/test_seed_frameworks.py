"""The seed GEMM through each framework wrapper: torch in place, JAX (immutable:
inputs only, the output comes back as a jax.Array), numpy; built once with symbolic n."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import rivet
from rivet import te

from conftest import BACKENDS, abs_mm, assert_matches


# Built once per backend for the module (conftest.BACKENDS: the one list).
@pytest.fixture(scope="module", params=BACKENDS)
def gemm(request):
    n = te.var("n")
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = rivet.create_schedule(C)
    return rivet.build(s, [A, B, C], target=request.param, name="mm")["mm"]


def test_seed_gemm_56_torch(gemm, rng):
    f = rivet.to_pytorch_func(gemm)
    x = torch.from_numpy(rng.standard_normal((56, 56), dtype=np.float32))
    y = torch.from_numpy(rng.standard_normal((56, 56), dtype=np.float32))
    z = torch.full((56, 56), float("nan"))
    ptr = z.data_ptr()
    f(x, y, z)
    assert z.data_ptr() == ptr
    assert_matches(z, torch.mm(x, y), op="contraction", against="torch", k=56, terms=abs_mm(x, y))


@pytest.mark.parametrize("n", [1, 3, 56, 70])
def test_seed_gemm_jax(gemm, rng, n):
    f = rivet.to_jax_func(gemm)
    x = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    y = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    z = f(x, y)
    assert "jax" in type(z).__module__ or "jaxlib" in type(z).__module__
    want = np.asarray(jnp.matmul(x, y, precision="highest"))  # full float32, never bfloat16 passes
    assert_matches(np.asarray(z), want, op="contraction", against="jax", k=n, terms=abs_mm(x, y))
    # JAX arrays are immutable: passing one as the output is refused, nothing written.
    out = jnp.zeros((n, n), jnp.float32)
    with pytest.raises(rivet.ReadOnlyError):
        gemm(x, y, out)
    assert not np.any(np.asarray(out))


def test_seed_gemm_numpy_every_size(gemm, rng):
    for n in (1, 7, 56, 100):
        x = rng.standard_normal((n, n), dtype=np.float32)
        y = rng.standard_normal((n, n), dtype=np.float32)
        z = np.full((n, n), np.nan, np.float32)
        gemm(x, y, z)
        assert_matches(z, x @ y, op="contraction", against="numpy", k=n, terms=abs_mm(x, y))
