"""testing.axpy (y <- alpha*x + y, in place) against numpy / torch references."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import rivet

DTYPES = [np.float32, np.float64]
TDT = {np.float32: torch.float32, np.float64: torch.float64}


def _alpha(rng):
    return float(rng.uniform(-3, 3))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (37,), (8, 13), (3, 5, 7), (2, 3, 4, 5)])
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_axpy_contiguous(h, rng, axpy, dtype, shape, lib):
    xn = h.random_array(rng, shape, dtype)
    yn = h.random_array(rng, shape, dtype)
    alpha = _alpha(rng)
    ref = h.ref_axpy(alpha, xn, yn)
    if lib == "torch":
        x, y = torch.from_numpy(xn), torch.from_numpy(yn)
        # torch's own reference as well
        tref = torch.from_numpy(yn.copy()).add(torch.from_numpy(xn), alpha=alpha)
    else:
        x, y = xn, yn
    ret = axpy(alpha, x, y)
    assert ret is None
    h.assert_close(y, ref)
    if lib == "torch":
        np.testing.assert_allclose(y.numpy(), tref.numpy(), **h_tol(dtype))


def h_tol(dtype):
    return dict(rtol=1e-6, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy_torch_native_tensors(h, axpy, dtype):
    g = torch.Generator().manual_seed(1234)
    x = torch.rand(64, 33, generator=g, dtype=TDT[dtype]) + 0.5
    y = torch.rand(64, 33, generator=g, dtype=TDT[dtype]) - 1.5
    ref = h.ref_axpy(0.75, x, y)
    axpy(0.75, x, y)
    h.assert_close(y, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_axpy_strided_output_keeps_gaps(h, rng, axpy, dtype, lib):
    base = np.empty((6, 20), dtype)
    h.poison(base)
    ys = base[:, ::2]
    ys[...] = h.random_array(rng, ys.shape, dtype)
    gaps_before = h.bits(base[:, 1::2])
    x = h.random_array(rng, ys.shape, dtype)
    alpha = _alpha(rng)
    ref = h.ref_axpy(alpha, x, ys)
    if lib == "torch":
        y = torch.from_numpy(base)[:, ::2]
        axpy(alpha, torch.from_numpy(x), y)
    else:
        axpy(alpha, x, ys)
    h.assert_close(base[:, ::2], ref)
    h.assert_bits_equal(base[:, 1::2], gaps_before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy_strided_3d_with_offset(h, rng, axpy, dtype):
    base = np.empty((5, 6, 9), dtype)
    h.poison(base)
    sel = (slice(1, 5, 2), slice(0, 6, 2), slice(2, 9, 3))
    y = base[sel]
    y[...] = h.random_array(rng, y.shape, dtype)
    mask = np.ones(base.shape, bool)
    mask[sel] = False
    outside = h.bits(base[mask])
    x = torch.from_numpy(h.random_array(rng, (2, 3, 3), dtype).transpose(2, 0, 1).copy()).permute(1, 2, 0)
    assert tuple(x.shape) == y.shape
    alpha = _alpha(rng)
    ref = h.ref_axpy(alpha, x, y)
    axpy(alpha, x, y)
    h.assert_close(base[sel], ref)
    h.assert_bits_equal(base[mask], outside)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_axpy_transposed_output(h, rng, axpy, dtype, lib):
    yb = h.random_array(rng, (9, 14), dtype)
    x = h.random_array(rng, (14, 9), dtype)
    alpha = _alpha(rng)
    ref = h.ref_axpy(alpha, x, yb.T)
    if lib == "torch":
        y = torch.from_numpy(yb).T
        axpy(alpha, torch.from_numpy(x), y)
    else:
        axpy(alpha, x, yb.T)
    h.assert_close(yb.T, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy_transposed_input_contiguous_output(h, rng, axpy, dtype):
    xb = h.random_array(rng, (7, 11, 3), dtype)
    x = xb.transpose(2, 0, 1)
    y = h.random_array(rng, x.shape, dtype)
    ref = h.ref_axpy(-1.25, x, y)
    axpy(-1.25, x, y)
    h.assert_close(y, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy_zero_stride_x_torch_expand(h, rng, axpy, dtype):
    row = torch.from_numpy(h.random_array(rng, (1, 5), dtype))
    x = row.expand(4, 5)
    assert x.stride() == (0, 1)
    y = torch.from_numpy(h.random_array(rng, (4, 5), dtype))
    ref = h.ref_axpy(2.5, x, y)
    axpy(2.5, x, y)
    h.assert_close(y, ref)
    # the broadcast source is untouched
    assert row.shape == (1, 5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy_zero_stride_x_numpy_broadcast(h, rng, axpy, dtype):
    col = h.random_array(rng, (6, 1), dtype)
    x = np.broadcast_to(col, (6, 8))  # read-only input: fine
    y = h.random_array(rng, (6, 8), dtype)
    ref = h.ref_axpy(-0.5, x, y)
    axpy(-0.5, x, y)
    h.assert_close(y, ref)
    scalar = np.broadcast_to(h.random_array(rng, (), dtype), (3, 4, 5))
    assert scalar.strides == (0, 0, 0)
    y2 = h.random_array(rng, (3, 4, 5), dtype)
    ref2 = h.ref_axpy(1.5, scalar, y2)
    axpy(1.5, scalar, y2)
    h.assert_close(y2, ref2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_axpy_same_tensor(h, rng, axpy, dtype, lib):
    yn = h.random_array(rng, (5, 6), dtype)
    alpha = _alpha(rng)
    ref = (np.float64(alpha + 1.0) * yn.astype(np.float64)).astype(dtype)
    y = torch.from_numpy(yn) if lib == "torch" else yn
    axpy(alpha, y, y)
    h.assert_close(yn, ref)


def test_axpy_same_memory_different_objects(h, rng, axpy):
    yn = h.random_array(rng, (33,), np.float32)
    ref = (np.float64(3.0) * yn.astype(np.float64)).astype(np.float32)
    yt = torch.from_numpy(yn)
    axpy(2.0, yn, yt)  # x and y are the same memory, same layout: allowed
    h.assert_close(yn, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_axpy_large_parallel(h, rng, axpy, dtype, lib):
    n = 1 << 20
    xn = h.random_array(rng, (n,), dtype)
    yn = h.random_array(rng, (n,), dtype)
    alpha = _alpha(rng)
    ref = h.ref_axpy(alpha, xn, yn)
    if lib == "torch":
        axpy(alpha, torch.from_numpy(xn), torch.from_numpy(yn))
    else:
        axpy(alpha, xn, yn)
    h.assert_close(yn, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy_large_strided_parallel(h, rng, axpy, dtype):
    base = np.empty((512, 1024), dtype)
    h.poison(base)
    y = base[:, 1::2]
    y[...] = h.random_array(rng, y.shape, dtype)
    gaps = h.bits(base[:, ::2])
    x = torch.from_numpy(h.random_array(rng, (512, 512), dtype)).T  # transposed, 1<<18 elements
    alpha = _alpha(rng)
    ref = h.ref_axpy(alpha, x, y)
    axpy(alpha, x, y)
    h.assert_close(base[:, 1::2], ref)
    h.assert_bits_equal(base[:, ::2], gaps)


def test_axpy_large_transposed_output(h, rng, axpy):
    yb = torch.from_numpy(h.random_array(rng, (700, 300), np.float32))
    y = yb.T
    x = torch.from_numpy(h.random_array(rng, (300, 700), np.float32))
    ref = h.ref_axpy(0.5, x, y)
    axpy(0.5, x, y)
    h.assert_close(y, ref)


def test_axpy_large_broadcast_x(h, rng, axpy):
    x = torch.from_numpy(h.random_array(rng, (1, 2048), np.float64)).expand(512, 2048)
    y = h.random_array(rng, (512, 2048), np.float64)
    ref = h.ref_axpy(-2.0, x, y)
    axpy(-2.0, x, y)
    h.assert_close(y, ref)


def test_axpy_large_same_tensor(h, rng, axpy):
    y = h.random_array(rng, (1 << 18,), np.float32)
    ref = (np.float64(1.5) * y.astype(np.float64)).astype(np.float32)
    axpy(0.5, y, y)
    h.assert_close(y, ref)


@pytest.mark.parametrize("combo", ["np->torch", "torch->np", "jax->np", "jax->torch", "rivet->np", "capsule->torch"])
def test_axpy_mixed_frameworks(h, rng, axpy, combo):
    xn = h.random_array(rng, (12, 10), np.float32)
    yn = h.random_array(rng, (12, 10), np.float32)
    alpha = _alpha(rng)
    ref = h.ref_axpy(alpha, xn, yn)
    src, dst = combo.split("->")
    x = {
        "np": lambda: xn,
        "torch": lambda: torch.from_numpy(xn.copy()),
        "jax": lambda: jnp.asarray(xn),
        "rivet": lambda: rivet.from_dlpack(xn),
        "capsule": lambda: xn.__dlpack__(max_version=(1, 0)),
    }[src]()
    y = torch.from_numpy(yn) if dst == "torch" else yn
    axpy(alpha, x, y)
    h.assert_close(yn, ref)


def test_axpy_output_as_rivet_tensor(h, rng, axpy):
    xn = h.random_array(rng, (40,), np.float64)
    yt = torch.from_numpy(h.random_array(rng, (40,), np.float64))
    ref = h.ref_axpy(0.3, xn, yt)
    ry = rivet.from_dlpack(yt)
    axpy(0.3, xn, ry)
    h.assert_close(yt, ref)
    h.assert_close(ry.numpy(), ref)


def test_axpy_unaligned_view(h, rng, axpy):
    # 4-byte aligned, not 64-byte aligned views (TVM segfaults on these)
    xb = h.random_array(rng, (101,), np.float32)
    yb = torch.from_numpy(h.random_array(rng, (101,), np.float32))
    x, y = xb[1:], yb[1:]
    head = h.bits(yb[:1])
    ref = h.ref_axpy(1.25, x, y)
    axpy(1.25, x, y)
    h.assert_close(y, ref)
    h.assert_bits_equal(yb[:1], head)


def test_axpy_alpha_int_and_special_values(h, rng, axpy):
    x = h.random_array(rng, (8,), np.float64)
    y = h.random_array(rng, (8,), np.float64)
    ref = h.ref_axpy(2, x, y)
    axpy(2, x, y)  # an int alpha converts to float, as a TVM user expects
    h.assert_close(y, ref)
    before = y.copy()
    axpy(0.0, x, y)
    np.testing.assert_array_equal(y, before)


def test_axpy_zero_size_and_zero_dim(h, rng, axpy):
    x = np.empty((0, 3), np.float32)
    y = np.empty((0, 3), np.float32)
    axpy(1.0, x, y)  # nothing to do, no error
    xs = np.array(1.5, np.float64)
    ys = np.array(-0.25, np.float64)
    axpy(2.0, xs, ys)
    assert float(ys) == 2.75
    yt = torch.tensor(4.0, dtype=torch.float32)
    axpy(0.5, torch.tensor(2.0), yt)
    assert yt.item() == 5.0


def test_axpy_repeated_accumulates(h, rng, axpy):
    x = h.random_array(rng, (1000,), np.float64)
    y = h.random_array(rng, (1000,), np.float64)
    y0 = y.copy()
    for _ in range(10):
        axpy(0.1, x, y)
    np.testing.assert_allclose(y, y0 + 10 * 0.1 * x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy_negative_strides(h, rng, axpy, dtype):
    # numpy 2.x exports negative strides; rivet handles them in place
    base = np.empty((4, 12), dtype)
    h.poison(base)
    y = base[::-1, ::-2]
    y[...] = h.random_array(rng, y.shape, dtype)
    gaps = h.bits(base[:, ::2])  # y covers columns 11, 9, ..., 1
    x = h.random_array(rng, (4, 12), dtype)[::-1, 1::2]
    alpha = _alpha(rng)
    ref = h.ref_axpy(alpha, x, y)
    axpy(alpha, x, y)
    h.assert_close(base[::-1, ::-2], ref)
    h.assert_bits_equal(base[:, ::2], gaps)


@pytest.mark.parametrize(
    "layout", ["size1-stride0", "row-expand-to-1", "size1-big-stride", "numpy-size1-T", "non-compact-disjoint"]
)
def test_axpy_output_size_one_and_odd_layouts(h, rng, axpy, layout):
    # outputs that look unusual but have no overlapping elements: accepted
    buf = torch.from_numpy(h.random_array(rng, (64,), np.float32))
    y = {
        "size1-stride0": lambda: buf.as_strided((4, 1, 5), (5, 0, 1)),
        "row-expand-to-1": lambda: buf[:5][None].expand(1, 5),
        "size1-big-stride": lambda: buf.as_strided((2, 1, 3), (3, 1000, 1)),
        "numpy-size1-T": lambda: torch.from_numpy(h.random_array(rng, (4, 1, 3), np.float32).T),
        "non-compact-disjoint": lambda: buf.as_strided((2, 2), (2, 3)),
    }[layout]()
    x = torch.from_numpy(h.random_array(rng, tuple(y.shape), np.float32))
    ref = h.ref_axpy(0.75, x, y)
    axpy(0.75, x, y)
    h.assert_close(y, ref)
