"""Tensor metadata: dtypes, shapes, strides, devices, byte offsets, odd layouts."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import rivet

TORCH_DTYPES = {
    "bool": torch.bool,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "uint16": torch.uint16,
    "uint32": torch.uint32,
    "uint64": torch.uint64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}

NUMPY_DTYPES = [n for n in TORCH_DTYPES if n != "bfloat16"]


def _torch_values(rng, shape, dt):
    if dt == torch.bool:
        return torch.from_numpy(rng.random(shape) < 0.5)
    if dt.is_floating_point:
        return torch.from_numpy(rng.uniform(-4, 4, size=shape)).to(dt)
    return torch.from_numpy(rng.integers(1, 100, size=shape)).to(dt)


def _np_values(rng, shape, name):
    if name == "bool":
        return rng.random(shape) < 0.5
    if name.startswith("float"):
        return rng.uniform(-4, 4, size=shape).astype(name)
    return rng.integers(1, 100, size=shape).astype(name)


def elem_strides(a):
    if isinstance(a, torch.Tensor):
        return tuple(a.stride())
    return tuple(s // a.itemsize for s in a.strides)


def check_common(r, shape, strides, ptr, dtype):
    assert isinstance(r, rivet.Tensor)
    assert tuple(r.shape) == tuple(shape)
    assert isinstance(r.shape, tuple)
    assert tuple(r.strides) == tuple(strides)
    assert r.data_ptr == ptr
    assert r.dtype == dtype
    assert r.device == "cpu"
    assert tuple(r.__dlpack_device__()) == (1, 0)


@pytest.mark.parametrize("name", list(TORCH_DTYPES))
def test_torch_dtypes(rng, name):
    dt = TORCH_DTYPES[name]
    t = _torch_values(rng, (3, 5), dt).contiguous()
    r = rivet.from_dlpack(t)
    check_common(r, (3, 5), (5, 1), t.data_ptr(), name)
    assert r.read_only is False
    back = torch.from_dlpack(r)
    assert back.dtype == dt
    assert back.data_ptr() == t.data_ptr()
    assert torch.equal(back.to(torch.float64), t.to(torch.float64))
    if name != "bfloat16":  # numpy has no bfloat16
        v = r.numpy()
        assert v.dtype == np.dtype(name)
        assert v.ctypes.data == t.data_ptr()
        np.testing.assert_array_equal(v, t.numpy())


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_numpy_dtypes(rng, name):
    a = _np_values(rng, (4, 2, 3), name)
    r = rivet.from_dlpack(a)
    check_common(r, (4, 2, 3), (6, 3, 1), a.ctypes.data, name)
    v = r.numpy()
    assert v.dtype == a.dtype
    assert v.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(v, a)
    back = np.from_dlpack(r)
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)


@pytest.mark.parametrize("name", ["bool", "int8", "int32", "uint8", "float16", "bfloat16", "float32"])
def test_jax_dtypes(rng, name):
    if name == "bfloat16":
        j = jnp.asarray(rng.uniform(-2, 2, size=(2, 3)), dtype=jnp.bfloat16)
    else:
        j = jnp.asarray(_np_values(rng, (2, 3), name))
    r = rivet.from_dlpack(j)
    # jax may export NULL strides (compact): rivet reports the compact strides
    check_common(r, (2, 3), (3, 1), j.unsafe_buffer_pointer(), name)
    assert r.read_only is True
    if name != "bfloat16":
        np.testing.assert_array_equal(r.numpy(), np.asarray(j))


def test_dtype_float16_values(rng):
    a = rng.uniform(-3, 3, size=17).astype(np.float16)
    t = torch.from_dlpack(rivet.from_dlpack(a))
    assert t.dtype == torch.float16
    np.testing.assert_array_equal(t.numpy(), a)


def test_bfloat16_bits_roundtrip():
    t = torch.tensor([1.5, -2.25, 3.0e38, 1e-30], dtype=torch.bfloat16)
    r = rivet.from_dlpack(t)
    assert r.dtype == "bfloat16"
    back = torch.from_dlpack(r)
    assert torch.equal(back.view(torch.int16), t.view(torch.int16))


def test_dlpack_device():
    for x in (np.ones(3), torch.ones(3), jnp.ones(3)):
        r = rivet.from_dlpack(x)
        assert r.device == "cpu"
        dev = r.__dlpack_device__()
        assert tuple(dev) == (1, 0)
        assert [int(d) for d in dev] == [1, 0]


# --------------------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("lib", ["torch", "numpy"])
def test_zero_size(lib):
    x = torch.empty(0, 3) if lib == "torch" else np.empty((0, 3), np.float32)
    r = rivet.from_dlpack(x)
    assert r.shape == (0, 3)
    assert r.dtype == "float32"
    assert len(r.strides) == 2
    assert r.numpy().shape == (0, 3)
    assert tuple(torch.from_dlpack(r).shape) == (0, 3)
    assert np.from_dlpack(r).shape == (0, 3)


@pytest.mark.parametrize("lib", ["torch", "numpy"])
def test_size_one_dims(rng, lib):
    a = rng.standard_normal((3, 1, 4))
    x = torch.from_numpy(a) if lib == "torch" else a
    r = rivet.from_dlpack(x)
    assert r.shape == (3, 1, 4)
    assert r.strides[0] == 4 and r.strides[2] == 1  # the size-1 stride is arbitrary
    assert r.data_ptr == (x.data_ptr() if lib == "torch" else x.ctypes.data)
    np.testing.assert_array_equal(r.numpy(), a)
    np.testing.assert_array_equal(torch.from_dlpack(r).numpy(), a)


@pytest.mark.parametrize("lib", ["torch", "numpy", "jax"])
def test_zero_dim(lib):
    x = {"torch": torch.tensor(3.5), "numpy": np.array(3.5, dtype=np.float32), "jax": jnp.array(3.5)}[lib]
    r = rivet.from_dlpack(x)
    assert r.shape == ()
    assert tuple(r.strides) == ()
    v = r.numpy()
    assert v.shape == ()
    assert float(v) == 3.5
    t = torch.from_dlpack(r)
    assert t.shape == () and t.item() == 3.5


# --------------------------------------------------------------------------------------
# byte offset and views
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("lib", ["torch", "numpy"])
@pytest.mark.parametrize("view", ["1:", "2:,1:", "1:,::2", "T", "::3", "T,1:"])
def test_views(rng, lib, view):
    base_np = rng.standard_normal((6, 8)).astype(np.float32)
    base = torch.from_numpy(base_np) if lib == "torch" else base_np
    v = {
        "1:": lambda b: b[1:],
        "2:,1:": lambda b: b[2:, 1:],
        "1:,::2": lambda b: b[1:, ::2],
        "T": lambda b: b.T,
        "::3": lambda b: b[::3],
        "T,1:": lambda b: b.T[1:],
    }[view](base)
    r = rivet.from_dlpack(v)
    ptr = v.data_ptr() if lib == "torch" else v.ctypes.data
    assert r.data_ptr == ptr
    assert tuple(r.shape) == tuple(v.shape)
    assert tuple(r.strides) == elem_strides(v)
    expect = v.numpy() if lib == "torch" else v
    np.testing.assert_array_equal(r.numpy(), expect)
    # round trip out again: same pointer, same values, same layout
    t = torch.from_dlpack(r)
    assert t.data_ptr() == ptr
    assert tuple(t.stride()) == elem_strides(v)
    np.testing.assert_array_equal(t.numpy(), expect)
    a = np.from_dlpack(r)
    assert a.ctypes.data == ptr
    np.testing.assert_array_equal(a, expect)
    # writes through the rivet view land in the right place of the base
    rv = r.numpy()
    rv[...] = -1.0
    np.testing.assert_array_equal(expect, -np.ones_like(expect))
    assert (base_np == -1.0).sum() == expect.size


def test_torch_offset_view_byte_address(rng):
    t = torch.from_numpy(rng.standard_normal(10).astype(np.float32))
    for k in range(1, 4):
        r = rivet.from_dlpack(t[k:])
        assert r.data_ptr == t.data_ptr() + 4 * k
        assert r.numpy()[0] == t[k].item()


def test_torch_storage_offset_via_capsule(rng):
    t = torch.from_numpy(rng.standard_normal((4, 4)))
    v = t[1:, 2:]
    for cap in (torch.utils.dlpack.to_dlpack(v), v.__dlpack__(max_version=(1, 0))):
        r = rivet.from_dlpack(cap)
        assert r.data_ptr == v.data_ptr()
        np.testing.assert_array_equal(r.numpy(), v.numpy())


def test_permuted_3d(rng):
    t = torch.from_numpy(rng.standard_normal((2, 3, 4))).permute(2, 0, 1)
    r = rivet.from_dlpack(t)
    assert r.shape == (4, 2, 3)
    assert r.strides == (1, 12, 4)
    np.testing.assert_array_equal(r.numpy(), t.numpy())


def test_numpy_negative_strides(rng):
    a = rng.standard_normal(10)
    v = a[::-1]
    r = rivet.from_dlpack(v)  # numpy 2.x exports negative strides
    assert r.strides == (-1,)
    assert r.data_ptr == v.ctypes.data
    np.testing.assert_array_equal(r.numpy(), v)
    m = rng.standard_normal((4, 5))[::-1, ::-2]
    rm = rivet.from_dlpack(m)
    assert rm.strides == elem_strides(m)
    assert rm.data_ptr == m.ctypes.data
    np.testing.assert_array_equal(rm.numpy(), m)
    np.testing.assert_array_equal(np.from_dlpack(rm), m)


def test_numpy_broadcast_zero_strides(rng):
    row = rng.standard_normal(5)
    b = np.broadcast_to(row, (4, 5))
    r = rivet.from_dlpack(b)
    assert r.shape == (4, 5)
    assert r.strides == (0, 1)
    assert r.read_only is True  # broadcast_to views are read-only
    np.testing.assert_array_equal(r.numpy(), b)


def test_torch_expand_zero_strides(rng):
    t = torch.from_numpy(rng.standard_normal((1, 5))).expand(4, 5)
    r = rivet.from_dlpack(t)
    assert r.strides == (0, 1)
    assert r.data_ptr == t.data_ptr()
    np.testing.assert_array_equal(r.numpy(), t.numpy())


def test_numpy_of_read_only_is_not_writeable(rng):
    a = rng.standard_normal(6)
    a.flags.writeable = False
    r = rivet.from_dlpack(a)
    assert r.read_only is True
    v = r.numpy()
    assert v.flags.writeable is False
    with pytest.raises(ValueError):
        v[0] = 0.0
    w = rivet.from_dlpack(np.ones(3))
    assert w.read_only is False
    assert w.numpy().flags.writeable is True
