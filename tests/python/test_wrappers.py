"""Framework wrappers: to_pytorch_func, to_jax_func, convert_func (and rivet.contrib.dlpack)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.utils.dlpack

import rivet
import rivet.contrib.dlpack as cdl


def test_contrib_names_exist():
    for name in ("convert_func", "to_pytorch_func", "to_mxnet_func", "to_jax_func"):
        assert callable(getattr(rivet, name)), name
        assert callable(getattr(cdl, name)), name
    from rivet.contrib.dlpack import convert_func, to_jax_func, to_mxnet_func, to_pytorch_func  # noqa: F401


@pytest.mark.parametrize("mod", ["rivet", "contrib"])
def test_to_pytorch_echo_shares_memory(h, rng, echo, mod):
    wrap = (rivet if mod == "rivet" else cdl).to_pytorch_func
    f = wrap(echo)
    t = torch.from_numpy(h.random_array(rng, (3, 5), np.float32))
    out = f(t)
    assert isinstance(out, torch.Tensor)
    assert out.data_ptr() == t.data_ptr()
    assert out.dtype == t.dtype and tuple(out.shape) == (3, 5)
    assert tuple(out.stride()) == tuple(t.stride())
    out[1, 1] = 99.0
    assert t[1, 1].item() == 99.0


def test_to_pytorch_echo_view_and_scalars(h, rng, echo):
    f = rivet.to_pytorch_func(echo)
    base = torch.from_numpy(h.random_array(rng, (6, 8), np.float64))
    v = base[1:, ::2].T
    out = f(v)
    assert isinstance(out, torch.Tensor)
    assert out.data_ptr() == v.data_ptr()
    assert tuple(out.stride()) == tuple(v.stride())
    assert torch.equal(out, v)
    # non-tensor values pass through unchanged
    assert f(3) == 3
    assert f("s") == "s"


@pytest.mark.parametrize("mod", ["rivet", "contrib"])
def test_to_pytorch_axpy(h, rng, axpy, mod):
    f = (rivet if mod == "rivet" else cdl).to_pytorch_func(axpy)
    x = torch.from_numpy(h.random_array(rng, (4, 9), np.float32))
    y = torch.from_numpy(h.random_array(rng, (4, 9), np.float32))
    ref = h.ref_axpy(2.0, x, y)
    ptr = y.data_ptr()
    f(2.0, x, y)
    assert y.data_ptr() == ptr
    h.assert_close(y, ref)


def test_to_pytorch_errors_pass_through(h, rng, axpy):
    f = rivet.to_pytorch_func(axpy)
    x = torch.ones(3, dtype=torch.float32)
    y = torch.ones(3, dtype=torch.float64)
    with pytest.raises(rivet.DTypeError):
        f(1.0, x, y)
    assert torch.equal(y, torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("mod", ["rivet", "contrib"])
def test_to_jax_echo(h, rng, echo, mod):
    f = (rivet if mod == "rivet" else cdl).to_jax_func(echo)
    v = h.random_array(rng, (2, 7), np.float32)
    j = jnp.asarray(v)
    out = f(j)
    assert isinstance(out, jax.Array)
    assert out.shape == (2, 7)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), v)


def test_to_jax_axpy_into_jax_output_refused(h, rng, axpy):
    f = rivet.to_jax_func(axpy)
    xv = h.random_array(rng, (5,), np.float32)
    yv = h.random_array(rng, (5,), np.float32)
    x, y = jnp.asarray(xv), jnp.asarray(yv)
    with pytest.raises(rivet.ReadOnlyError):
        f(1.0, x, y)
    np.testing.assert_array_equal(np.asarray(y), yv)


def test_to_jax_axpy_numpy_output(h, rng, axpy):
    # a jax input, a numpy output: the jax array is only read
    f = rivet.to_jax_func(axpy)
    xv = h.random_array(rng, (5,), np.float32)
    y = h.random_array(rng, (5,), np.float32)
    ref = h.ref_axpy(1.5, xv, y)
    f(1.5, jnp.asarray(xv), y)
    h.assert_close(y, ref)


@pytest.mark.parametrize("mod", ["rivet", "contrib"])
def test_convert_func_torch_axpy(h, rng, axpy, mod):
    conv = (rivet if mod == "rivet" else cdl).convert_func
    f = conv(axpy, torch.Tensor, torch.utils.dlpack.to_dlpack)
    x = torch.from_numpy(h.random_array(rng, (33,), np.float64))
    y = torch.from_numpy(h.random_array(rng, (33,), np.float64))
    ref = h.ref_axpy(-0.75, x, y)
    f(-0.75, x, y)
    h.assert_close(y, ref)
    # twice with the same tensors: a fresh capsule each call
    ref2 = h.ref_axpy(0.5, x, y)
    f(0.5, x, y)
    h.assert_close(y, ref2)


def test_convert_func_numpy(h, rng, axpy):
    calls = []

    def to_dl(a):
        calls.append(a)
        return a.__dlpack__()

    f = rivet.convert_func(axpy, np.ndarray, to_dl)
    x = h.random_array(rng, (2, 3), np.float32)
    y = h.random_array(rng, (2, 3), np.float32)
    ref = h.ref_axpy(1.0, x, y)
    f(1.0, x, y)
    h.assert_close(y, ref)
    assert len(calls) == 2  # both ndarray arguments went through to_dlpack_func


def test_wrapped_function_with_python_callback(uname, h, rng):
    name = uname()

    def double_inplace(t):
        v = t.numpy()
        v *= 2
        return t

    rivet.register_func(name, double_inplace)
    f = rivet.to_pytorch_func(rivet.get_global_func(name))
    t = torch.from_numpy(h.random_array(rng, (4,), np.float32))
    before = t.clone()
    out = f(t)
    assert isinstance(out, torch.Tensor)
    assert out.data_ptr() == t.data_ptr()
    assert torch.equal(t, before * 2)
