"""rivet.kernels (written in Rust with the DSL) against torch references, fresh random data,
poisoned outputs, several sizes per build (dims are symbolic)."""

import numpy as np
import pytest
import torch

import rivet

from conftest import BACKENDS, abs_mm, assert_matches

DTYPES = [("float32", torch.float32), ("float64", torch.float64)]


# Each kernel on every backend with that target's own schedule, and its GPU schedule run by the
# interpreter with GPU semantics (blocks, threads, races reported): one definition, every
# schedule checked against torch under the tolerance policy (docs/tolerance.md).
ON = [pytest.param({"target": p.values[0]}, id=p.id, marks=p.marks) for p in BACKENDS] + [
    pytest.param({"target": "interp", "schedule": "gpu"}, id="gpu-on-interp"),
]


@pytest.fixture(params=ON)
def on(request):
    return request.param


def rand(rng, shape, tdt):
    return torch.from_numpy(rng.standard_normal(shape)).to(tdt)


def poisoned(shape, tdt):
    return torch.full(shape, float("nan"), dtype=tdt)


@pytest.mark.parametrize("dtype,tdt", DTYPES)
def test_matmul_and_batch_matmul(rng, dtype, tdt, on):
    mm = rivet.kernels.matmul(dtype, **on)
    for m, k, n in [(1, 1, 1), (5, 7, 3), (33, 17, 29)]:
        a, b, c = rand(rng, (m, k), tdt), rand(rng, (k, n), tdt), poisoned((m, n), tdt)
        mm(a, b, c)
        assert_matches(c, a @ b, op="contraction", against="torch", k=k, terms=abs_mm(a, b))
    bmm = rivet.to_pytorch_func(rivet.kernels.batch_matmul(dtype, **on))
    a, b = rand(rng, (3, 4, 5), tdt), rand(rng, (3, 5, 6), tdt)
    assert_matches(bmm(a, b), torch.bmm(a, b), op="contraction", against="torch", k=5, terms=abs_mm(a, b))


@pytest.mark.parametrize("dtype,tdt", DTYPES)
def test_add_mul_broadcast(rng, dtype, tdt, on):
    add = rivet.kernels.add(dtype, ("n", 1), (1, "m"), **on)
    mul = rivet.kernels.mul(dtype, ("n", "m"), ("m",), **on)
    a, b = rand(rng, (4, 1), tdt), rand(rng, (1, 6), tdt)
    c = poisoned((4, 6), tdt)
    add(a, b, c)
    assert_matches(c, a + b, op="exact", against="torch")
    x, y = rand(rng, (5, 3), tdt), rand(rng, (3,), tdt)
    z = poisoned((5, 3), tdt)
    mul(x, y, z)
    assert_matches(z, x * y, op="exact", against="torch")
    with pytest.raises(rivet.CompileError, match="broadcast"):
        rivet.kernels.add(dtype, ("n", 2), (3,))


@pytest.mark.parametrize("dtype,tdt", DTYPES)
def test_activations_softmax_layernorm(rng, dtype, tdt, on):
    x = rand(rng, (6, 9), tdt)
    y = poisoned((6, 9), tdt)
    rivet.kernels.relu(dtype, 2, **on)(x, y)
    assert_matches(y, torch.relu(x), op="exact", against="torch")
    # gelu = 0.5 x (1 + erf(x / sqrt 2)): erf and four roundings, against torch's exact gelu;
    # relative to |0.5 x| + |want| (the 1 + erf(...) sum cancels for negative x).
    y = poisoned((6, 9), tdt)
    rivet.kernels.gelu(dtype, 2, **on)(x, y)
    want = torch.nn.functional.gelu(x)
    terms = (x.abs() * 0.5 + want.abs()).double()
    assert_matches(y, want, op="composite", against="torch", terms=terms)
    for axis in (0, 1, -1):
        y = poisoned((6, 9), tdt)
        rivet.kernels.softmax(dtype, 2, axis, **on)(x, y)
        assert_matches(y, torch.softmax(x, dim=axis), op="composite", against="torch", k=x.shape[axis])
    g, b = rand(rng, (9,), tdt), rand(rng, (9,), tdt)
    y = poisoned((6, 9), tdt)
    rivet.kernels.layer_norm(dtype, 2, 1e-5, **on)(x, g, b, y)
    ref = torch.nn.functional.layer_norm(x, (9,), g, b, eps=1e-5)
    # (x - mean) * rstd * g + b: the mean and variance are sums of 9 terms and x - mean cancels,
    # so the error is relative to (|x_hat| + 1) * |g| + |b|, x_hat the normalised input.
    xd = x.double()
    xhat = (xd - xd.mean(1, keepdim=True)) / torch.sqrt(xd.var(1, unbiased=False, keepdim=True) + 1e-5)
    terms = (xhat.abs() + 1) * g.double().abs() + b.double().abs()
    assert_matches(y, ref, op="composite", against="torch", k=2 * 9, terms=terms)


@pytest.mark.parametrize("dtype,tdt", DTYPES)
def test_reductions_and_transpose(rng, dtype, tdt, on):
    x = rand(rng, (4, 5, 6), tdt)
    for axis in (0, 1, 2):
        s = rivet.to_pytorch_func(rivet.kernels.sum(dtype, 3, axis, **on))(x)
        terms = x.double().abs().sum(axis)
        assert_matches(s, x.sum(axis), op="reduction", against="torch", k=x.shape[axis], terms=terms)
        m = rivet.to_pytorch_func(rivet.kernels.max(dtype, 3, axis, **on))(x)
        assert_matches(m, x.amax(axis), op="exact", against="torch")
    t = rivet.to_pytorch_func(rivet.kernels.transpose(dtype, (2, 0, 1), **on))(x)
    assert_matches(t, x.permute(2, 0, 1), op="exact", against="torch")


def test_kernels_on_strided_views_in_place(rng):
    mm = rivet.kernels.matmul("float32")
    a = rand(rng, (8, 12), torch.float32).t()          # a transposed view
    b = rand(rng, (16, 5), torch.float32)[::2]         # a stepped view
    base = torch.zeros(12, 10)
    c = base[:, ::2]                                   # a strided output
    mm(a, b, c)
    assert_matches(c, a @ b, op="contraction", against="torch", k=12, terms=abs_mm(a, b))
    assert torch.all(base[:, 1::2] == 0)


def test_kernel_bad_inputs():
    mm = rivet.kernels.matmul("float32")
    with pytest.raises(rivet.ShapeError, match="dim 'k'"):
        mm(torch.rand(3, 4), torch.rand(5, 6))
    with pytest.raises(rivet.DTypeError):
        mm(torch.rand(3, 4, dtype=torch.float64), torch.rand(4, 5))
    with pytest.raises(rivet.CompileError):
        rivet.kernels.relu("int32")
    with pytest.raises(rivet.CompileError, match="axis"):
        rivet.kernels.softmax("float32", 2, 5)
    with pytest.raises(rivet.DTypeError):
        rivet.kernels.matmul("float17")
