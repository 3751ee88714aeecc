"""rivet with MXNet 1.9.1 NDArrays (legacy DLPack capsules only)."""

import gc
import sys

import mxnet as mx
import numpy as np
import pytest

import rivet

from conftest import abs_mm, assert_matches

MB = 1 << 20


@pytest.fixture(scope="module")
def axpy():
    return rivet.get_global_func("testing.axpy")


@pytest.fixture(scope="module")
def echo():
    return rivet.get_global_func("testing.echo")


def capsule_name(cap):
    return repr(cap).split('"')[1]


def ref_axpy(alpha, x, y):
    return (np.float64(alpha) * x.astype(np.float64) + y.astype(np.float64)).astype(y.dtype)


TOL = {np.dtype(np.float32): dict(rtol=1e-6, atol=1e-6), np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(7,), (4, 5), (2, 3, 4)])
def test_to_mxnet_axpy_in_place(rng, random_array, mx_ptr, axpy, dtype, shape):
    f = rivet.to_mxnet_func(axpy)
    x = mx.nd.array(random_array(rng, shape, dtype), dtype=dtype)
    y = mx.nd.array(random_array(rng, shape, dtype), dtype=dtype)
    xv, yv = x.asnumpy(), y.asnumpy()
    ptr = mx_ptr(y)
    alpha = float(rng.uniform(-3, 3))
    f(alpha, x, y)
    got = y.asnumpy()
    assert mx_ptr(y) == ptr  # the same buffer, written in place
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, ref_axpy(alpha, xv, yv), **TOL[np.dtype(dtype)])
    np.testing.assert_array_equal(x.asnumpy(), xv)  # input untouched


def test_contrib_to_mxnet_func(rng, random_array, axpy):
    import rivet.contrib.dlpack as cdl

    f = cdl.to_mxnet_func(axpy)
    x = mx.nd.array(random_array(rng, (9,)))
    y = mx.nd.array(random_array(rng, (9,)))
    xv, yv = x.asnumpy(), y.asnumpy()
    f(0.5, x, y)
    np.testing.assert_allclose(y.asnumpy(), ref_axpy(0.5, xv, yv), rtol=1e-6, atol=1e-6)


def test_axpy_large_parallel(rng, random_array, axpy):
    f = rivet.to_mxnet_func(axpy)
    n = 1 << 20
    x = mx.nd.array(random_array(rng, (n,)))
    y = mx.nd.array(random_array(rng, (n,)))
    xv, yv = x.asnumpy(), y.asnumpy()
    f(-1.5, x, y)
    np.testing.assert_allclose(y.asnumpy(), ref_axpy(-1.5, xv, yv), rtol=1e-6, atol=1e-6)


def test_axpy_with_raw_mx_capsules(rng, random_array, axpy):
    x = mx.nd.array(random_array(rng, (3, 4)))
    y = mx.nd.array(random_array(rng, (3, 4)))
    xv, yv = x.asnumpy(), y.asnumpy()
    axpy(2.0, x.to_dlpack_for_read(), y.to_dlpack_for_write())
    np.testing.assert_allclose(y.asnumpy(), ref_axpy(2.0, xv, yv), rtol=1e-6, atol=1e-6)


def test_mixed_numpy_input_mx_output(rng, random_array, axpy):
    f = rivet.to_mxnet_func(axpy)
    xv = random_array(rng, (6,))
    y = mx.nd.array(random_array(rng, (6,)))
    yv = y.asnumpy()
    f(1.25, xv, y)
    np.testing.assert_allclose(y.asnumpy(), ref_axpy(1.25, xv, yv), rtol=1e-6, atol=1e-6)


def test_pointer_equality(rng, random_array, mx_ptr):
    x = mx.nd.array(random_array(rng, (4, 3)))
    r = rivet.from_dlpack(x.to_dlpack_for_read())
    assert r.data_ptr == mx_ptr(x)
    assert r.shape == (4, 3)
    assert r.strides == (3, 1)  # MXNet exports NULL strides: compact
    assert r.dtype == "float32"
    assert r.device == "cpu"
    assert tuple(r.__dlpack_device__()) == (1, 0)
    np.testing.assert_array_equal(r.numpy(), x.asnumpy())


def test_pointer_equality_slice(rng, random_array, mx_ptr):
    x = mx.nd.array(random_array(rng, (5, 3)))
    v = x[2:]
    assert mx_ptr(v) == mx_ptr(x) + 2 * 3 * 4
    r = rivet.from_dlpack(v.to_dlpack_for_read())
    assert r.data_ptr == mx_ptr(v)
    assert r.shape == (3, 3)
    np.testing.assert_array_equal(r.numpy(), x.asnumpy()[2:])


def test_write_capsule_writes_show(rng, random_array):
    x = mx.nd.array(random_array(rng, (3, 5)))
    r = rivet.from_dlpack(x.to_dlpack_for_write())
    v = r.numpy()
    assert v.flags.writeable
    new = random_array(rng, (3, 5))
    v[...] = new
    np.testing.assert_array_equal(x.asnumpy(), new)


@pytest.mark.parametrize("which", ["read", "write"])
def test_legacy_capsule_reuse(rng, random_array, mx_ptr, which):
    x = mx.nd.array(random_array(rng, (4,)))
    cap = x.to_dlpack_for_read() if which == "read" else x.to_dlpack_for_write()
    assert capsule_name(cap) == "dltensor"
    r = rivet.from_dlpack(cap)
    assert r.data_ptr == mx_ptr(x)
    assert capsule_name(cap) == "used_dltensor"
    with pytest.raises(rivet.DLPackError) as ei:
        rivet.from_dlpack(cap)
    assert isinstance(ei.value, BufferError)
    # mxnet itself refuses the consumed capsule too, and nothing crashed
    with pytest.raises(Exception):
        mx.nd.from_dlpack(cap)
    np.testing.assert_array_equal(r.numpy(), x.asnumpy())


def test_reused_capsule_in_call(rng, random_array, axpy):
    x = mx.nd.array(random_array(rng, (4,)))
    y = np.ones(4, np.float32)
    cap = x.to_dlpack_for_read()
    axpy(1.0, cap, y)
    with pytest.raises(rivet.DLPackError):
        axpy(1.0, cap, y)
    np.testing.assert_allclose(y, 1.0 + x.asnumpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "float16", "float32", "float64"])
def test_dtypes(rng, mx_ptr, dtype):
    vals = rng.integers(1, 50, size=(2, 3)).astype(dtype)
    x = mx.nd.array(vals, dtype=dtype)
    r = rivet.from_dlpack(x.to_dlpack_for_read())
    assert r.dtype == dtype
    assert r.data_ptr == mx_ptr(x)
    np.testing.assert_array_equal(r.numpy(), vals)


def test_export_to_mxnet(rng, random_array, mx_ptr):
    a = random_array(rng, (3, 4))
    r = rivet.from_dlpack(a)  # numpy 1.23: __dlpack__ without max_version (fallback path)
    assert r.data_ptr == a.ctypes.data
    m = mx.nd.from_dlpack(r.__dlpack__())
    assert isinstance(m, mx.nd.NDArray)
    assert m.shape == (3, 4)
    assert m.dtype == np.float32
    assert mx_ptr(m) == a.ctypes.data  # zero copy
    np.testing.assert_array_equal(m.asnumpy(), a)
    a[1, 1] = 77.0
    assert m.asnumpy()[1, 1] == 77.0


def test_round_trip_mx_rivet_mx(rng, random_array, mx_ptr):
    x = mx.nd.array(random_array(rng, (2, 6)))
    xv = x.asnumpy()
    r = rivet.from_dlpack(x.to_dlpack_for_write())
    m = mx.nd.from_dlpack(r.__dlpack__())
    assert mx_ptr(m) == mx_ptr(x)
    del x, r
    gc.collect()
    np.testing.assert_array_equal(m.asnumpy(), xv)


def test_export_to_mxnet_releases_producer(rng, random_array):
    a = random_array(rng, (16,))
    gc.collect()
    base = sys.getrefcount(a)
    m = mx.nd.from_dlpack(rivet.from_dlpack(a).__dlpack__())
    gc.collect()
    assert sys.getrefcount(a) > base  # mxnet's view keeps a alive through rivet
    np.testing.assert_array_equal(m.asnumpy(), a)
    del m
    gc.collect()
    assert sys.getrefcount(a) == base


def test_dtype_mismatch(rng, random_array, axpy):
    f = rivet.to_mxnet_func(axpy)
    x = mx.nd.array(random_array(rng, (5,)), dtype="float32")
    y = mx.nd.array(random_array(rng, (5,), np.float64), dtype="float64")
    yv = y.asnumpy()
    with pytest.raises(rivet.DTypeError) as ei:
        f(1.0, x, y)
    assert isinstance(ei.value, TypeError)
    msg = str(ei.value)
    assert "float32" in msg and "float64" in msg, msg
    np.testing.assert_array_equal(y.asnumpy(), yv)


def test_int_dtype_rejected(rng, axpy):
    f = rivet.to_mxnet_func(axpy)
    x = mx.nd.array(rng.integers(1, 9, size=4), dtype="int32")
    y = mx.nd.array(rng.integers(1, 9, size=4), dtype="int32")
    yv = y.asnumpy()
    with pytest.raises(rivet.DTypeError, match="int32"):
        f(1.0, x, y)
    np.testing.assert_array_equal(y.asnumpy(), yv)


def test_shape_mismatch(rng, random_array, axpy):
    f = rivet.to_mxnet_func(axpy)
    x = mx.nd.array(random_array(rng, (4,)))
    y = mx.nd.array(random_array(rng, (5,)))
    yv = y.asnumpy()
    with pytest.raises(rivet.ShapeError):
        f(1.0, x, y)
    np.testing.assert_array_equal(y.asnumpy(), yv)


def test_to_mxnet_echo_returns_ndarray(rng, random_array, mx_ptr, echo):
    f = rivet.to_mxnet_func(echo)
    x = mx.nd.array(random_array(rng, (3, 2)))
    out = f(x)
    assert isinstance(out, mx.nd.NDArray)
    assert out.shape == (3, 2)
    assert out.dtype == np.float32
    assert mx_ptr(out) == mx_ptr(x)
    np.testing.assert_array_equal(out.asnumpy(), x.asnumpy())
    assert f(5) == 5


def test_numpy_fallback_producer(rng, random_array, axpy):
    # numpy 1.23's __dlpack__ has no max_version keyword: rivet falls back
    a = random_array(rng, (8,))
    r = rivet.from_dlpack(a)
    assert r.data_ptr == a.ctypes.data
    y = random_array(rng, (8,))
    ref = ref_axpy(2.0, a, y)
    axpy(2.0, a, y)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    b = np.from_dlpack(r)
    assert b.ctypes.data == a.ctypes.data


def test_no_leak_mx_imports(rss_bytes):
    # a leaked deleter would keep 8 KiB (the array) per iteration alive
    def once():
        rivet.from_dlpack(mx.nd.empty((2048,)).to_dlpack_for_read())

    for _ in range(300):
        once()
    gc.collect()
    r0 = rss_bytes()
    for _ in range(8000):
        once()
    gc.collect()
    grew = rss_bytes() - r0
    assert grew < 20 * MB, grew / MB


def test_seed_gemm_to_mxnet_func(rng, random_array, target):
    """The seed GEMM: the te GEMM through to_mxnet_func against numpy's dot."""
    from rivet import te

    n = te.var("n")
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = rivet.create_schedule(C)
    f = rivet.to_mxnet_func(rivet.build(s, [A, B, C], target=target, name="mm")["mm"])
    for size in (1, 56):
        x = mx.nd.array(random_array(rng, (size, size)))
        y = mx.nd.array(random_array(rng, (size, size)))
        z = mx.nd.full((size, size), float("nan"))
        f(x, y, z)
        want, terms = x.asnumpy().dot(y.asnumpy()), abs_mm(x.asnumpy(), y.asnumpy())
        assert_matches(z.asnumpy(), want, op="contraction", against="numpy", k=size, terms=terms)
        w = f(x, y)  # inputs only: allocated and returned as an MXNet NDArray
        assert isinstance(w, mx.nd.NDArray)
        assert_matches(w.asnumpy(), want, op="contraction", against="numpy", k=size, terms=terms)
