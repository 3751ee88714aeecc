"""rivet.kernels (written in Rust with the DSL) against torch references, fresh random data,
poisoned outputs, several sizes per build (dims are symbolic)."""

import numpy as np
import pytest
import torch

import rivet

DTYPES = [("float32", torch.float32, 1e-5), ("float64", torch.float64, 1e-12)]


# Each kernel's CPU schedule on the CPU, and its GPU schedule run by the interpreter with GPU
# semantics (blocks, threads, races reported): one definition, both schedules checked.
ON = [{"target": "cpu"}, {"target": "interp", "schedule": "gpu"}]


@pytest.fixture(params=ON, ids=["cpu", "gpu-on-interp"])
def on(request):
    return request.param


def rand(rng, shape, tdt):
    return torch.from_numpy(rng.standard_normal(shape)).to(tdt)


def poisoned(shape, tdt):
    return torch.full(shape, float("nan"), dtype=tdt)


@pytest.mark.parametrize("dtype,tdt,tol", DTYPES)
def test_matmul_and_batch_matmul(rng, dtype, tdt, tol, on):
    mm = rivet.kernels.matmul(dtype, **on)
    for m, k, n in [(1, 1, 1), (5, 7, 3), (33, 17, 29)]:
        a, b, c = rand(rng, (m, k), tdt), rand(rng, (k, n), tdt), poisoned((m, n), tdt)
        mm(a, b, c)
        torch.testing.assert_close(c, a @ b, rtol=tol * 10, atol=tol * 10)
    bmm = rivet.to_pytorch_func(rivet.kernels.batch_matmul(dtype, **on))
    a, b = rand(rng, (3, 4, 5), tdt), rand(rng, (3, 5, 6), tdt)
    torch.testing.assert_close(bmm(a, b), torch.bmm(a, b), rtol=tol * 10, atol=tol * 10)


@pytest.mark.parametrize("dtype,tdt,tol", DTYPES)
def test_add_mul_broadcast(rng, dtype, tdt, tol, on):
    add = rivet.kernels.add(dtype, ("n", 1), (1, "m"), **on)
    mul = rivet.kernels.mul(dtype, ("n", "m"), ("m",), **on)
    a, b = rand(rng, (4, 1), tdt), rand(rng, (1, 6), tdt)
    c = poisoned((4, 6), tdt)
    add(a, b, c)
    torch.testing.assert_close(c, a + b, rtol=tol, atol=tol)
    x, y = rand(rng, (5, 3), tdt), rand(rng, (3,), tdt)
    z = poisoned((5, 3), tdt)
    mul(x, y, z)
    torch.testing.assert_close(z, x * y, rtol=tol, atol=tol)
    with pytest.raises(rivet.CompileError, match="broadcast"):
        rivet.kernels.add(dtype, ("n", 2), (3,))


@pytest.mark.parametrize("dtype,tdt,tol", DTYPES)
def test_activations_softmax_layernorm(rng, dtype, tdt, tol, on):
    x = rand(rng, (6, 9), tdt)
    for name, ref in [("relu", torch.relu), ("gelu", lambda t: torch.nn.functional.gelu(t))]:
        y = poisoned((6, 9), tdt)
        getattr(rivet.kernels, name)(dtype, 2, **on)(x, y)
        torch.testing.assert_close(y, ref(x), rtol=tol * 10, atol=tol * 10)
    for axis in (0, 1, -1):
        y = poisoned((6, 9), tdt)
        rivet.kernels.softmax(dtype, 2, axis, **on)(x, y)
        torch.testing.assert_close(y, torch.softmax(x, dim=axis), rtol=tol * 10, atol=tol * 10)
    g, b = rand(rng, (9,), tdt), rand(rng, (9,), tdt)
    y = poisoned((6, 9), tdt)
    rivet.kernels.layer_norm(dtype, 2, 1e-5, **on)(x, g, b, y)
    ref = torch.nn.functional.layer_norm(x, (9,), g, b, eps=1e-5)
    torch.testing.assert_close(y, ref, rtol=tol * 100, atol=tol * 100)


@pytest.mark.parametrize("dtype,tdt,tol", DTYPES)
def test_reductions_and_transpose(rng, dtype, tdt, tol, on):
    x = rand(rng, (4, 5, 6), tdt)
    for axis in (0, 1, 2):
        s = rivet.to_pytorch_func(rivet.kernels.sum(dtype, 3, axis, **on))(x)
        torch.testing.assert_close(s, x.sum(axis), rtol=tol * 10, atol=tol * 10)
        m = rivet.to_pytorch_func(rivet.kernels.max(dtype, 3, axis, **on))(x)
        torch.testing.assert_close(m, x.amax(axis))
    t = rivet.to_pytorch_func(rivet.kernels.transpose(dtype, (2, 0, 1), **on))(x)
    torch.testing.assert_close(t, x.permute(2, 0, 1))


def test_kernels_on_strided_views_in_place(rng):
    mm = rivet.kernels.matmul("float32")
    a = rand(rng, (8, 12), torch.float32).t()          # a transposed view
    b = rand(rng, (16, 5), torch.float32)[::2]         # a stepped view
    base = torch.zeros(12, 10)
    c = base[:, ::2]                                   # a strided output
    mm(a, b, c)
    torch.testing.assert_close(c, a @ b, rtol=1e-5, atol=1e-5)
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
