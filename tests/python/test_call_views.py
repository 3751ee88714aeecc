"""The argument views of a call (bindings/src/keepalive.rs) and the layout checks they pass.

A torch tensor passed to a rivet function is read through DLPack's exchange API as a view
that only borrows the tensor for the call. These tests check the contract that makes the
borrow safe: a view that outlives the call (returned, stored by a callback, kept after the
call failed) keeps its producer alive, and frees it when it goes; a view that does not
escape leaves no reference behind (the producer is freed as soon as the caller drops it).
They also check that the one-pass layout check (runtime/src/layout.rs) refuses every
hostile layout with the checked path's own message, and that compiled calls on torch tensors
(the fast path of a static call included) give torch's results on poisoned outputs.
"""

import ctypes
import gc
import sys
import threading
import weakref

import numpy as np
import pytest
import torch

import rivet
from rivet import te

from dlpack_abi import (
    DELETER,
    DLDataType,
    DLDevice,
    DLManagedTensorVersioned,
    DLPackVersion,
    DLTensor,
    capsule_of,
)

nop = rivet.get_global_func("testing.nop")
echo = rivet.get_global_func("testing.echo")


def values(t):
    """A numpy copy of a rivet or torch tensor's elements."""
    return torch.from_dlpack(t).clone().numpy() if isinstance(t, rivet.Tensor) else t.numpy().copy()


# ---- views that do not escape ----------------------------------------------------------------


def test_a_call_leaves_no_reference_to_its_arguments():
    x, y, z = torch.rand(4), torch.rand(3, 5).t(), torch.rand(2, 2)
    counts = [sys.getrefcount(t) for t in (x, y, z)]
    for _ in range(100):
        nop(x, y, z)
    assert [sys.getrefcount(t) for t in (x, y, z)] == counts
    w = weakref.ref(x)
    nop(x, x, x)
    del x
    assert w() is None  # freed by its last reference, no collection needed


def test_views_in_reused_allocations_are_each_calls_own():
    """A call's argument views are built in the allocations of the thread's last call's views
    (keepalive.rs, spares): calls of other ranks (past the 6 dims kept inline), dtypes,
    strides and argument counts, calls nested in a callback and views kept past their call
    in between, each still sees exactly its own tensors, and no producer stays referenced."""
    ts = [
        torch.arange(6, dtype=torch.float32).reshape(2, 3),
        torch.arange(24, dtype=torch.int64).reshape(2, 3, 4).transpose(0, 2),
        torch.tensor(2.5, dtype=torch.float64),
        torch.arange(8, dtype=torch.int16)[::2],
        torch.arange(256, dtype=torch.uint8).reshape([2] * 8),
        torch.zeros(0, 3),
    ]
    counts = [sys.getrefcount(t) for t in ts]
    name = "test_call_views.nested"
    inner = []
    rivet.register_func(name, lambda a, b: inner.append(echo(b)), override=True)
    nested = rivet.get_global_func(name)
    try:
        for i in range(60):
            args = [ts[(i + 5 * k) % len(ts)] for k in range(1 + i % 4)]
            nop(*args)
            if i % 5 == 0:
                nested(args[0], args[-1])
                r = inner.pop()
            else:
                r = echo(args[-1])
            want = args[-1]
            got = torch.from_dlpack(r)
            assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
            assert r.data_ptr == want.data_ptr()
            assert torch.equal(got, want)
            del r, got, want, args
    finally:
        rivet.remove_global_func(name)
    gc.collect()
    assert [sys.getrefcount(t) for t in ts] == counts


def test_a_failed_call_leaves_no_reference_either():
    axpy = rivet.get_global_func("testing.axpy")
    x = torch.rand(4)
    before = sys.getrefcount(x)
    with pytest.raises(rivet.Error):
        axpy(0.5, x, torch.rand(5))  # shapes differ
    with pytest.raises(rivet.Error):
        axpy(0.5, x, x, "one too many")
    assert sys.getrefcount(x) == before
    w = weakref.ref(x)
    del x
    assert w() is None


# ---- views that escape -----------------------------------------------------------------------


def test_a_returned_view_keeps_its_producer_alive():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    want = x.numpy().copy()
    w = weakref.ref(x)
    r = echo(x)
    assert isinstance(r, rivet.Tensor) and r.data_ptr == x.data_ptr()
    del x
    gc.collect()
    assert w() is not None  # only the returned view holds it now
    np.testing.assert_array_equal(values(r), want)
    # Still a live view: writes through it reach the producer's memory.
    torch.from_dlpack(r).fill_(7.0)
    np.testing.assert_array_equal(w().numpy(), np.full((2, 3), 7.0, np.float32))
    del r
    gc.collect()
    assert w() is None


def test_a_view_stored_by_a_callback_keeps_its_producer_alive():
    kept = []
    name = "test_call_views.keep"
    rivet.register_func(name, lambda t: kept.append(t), override=True)
    keep = rivet.get_global_func(name)
    try:
        assert_kept_view_holds_its_producer(keep, kept)
    finally:
        rivet.remove_global_func(name)


def assert_kept_view_holds_its_producer(call, kept):
    """`call(x)` leaves a view of a fresh tensor `x` in `kept`: the view keeps `x` alive with
    its values after the caller drops `x`, and frees it when the view goes."""
    x = torch.rand(5)
    want = x.numpy().copy()
    w = weakref.ref(x)
    call(x)
    del x
    gc.collect()
    assert w() is not None
    np.testing.assert_array_equal(values(kept[0]), want)
    kept.clear()
    gc.collect()
    assert w() is None


def test_a_view_kept_by_a_callback_that_raises_keeps_its_producer_alive():
    kept = []

    def keep_then_fail(t):
        kept.append(t)
        raise ValueError("kept it, then failed")

    name = "test_call_views.keep_then_fail"
    rivet.register_func(name, keep_then_fail, override=True)
    f = rivet.get_global_func(name)

    def call(x):
        with pytest.raises(ValueError, match="kept it, then failed"):
            f(x)

    try:
        assert_kept_view_holds_its_producer(call, kept)
    finally:
        rivet.remove_global_func(name)


def test_a_view_handed_to_another_thread_outlives_the_call():
    """A callback gives the view to a thread that reads it after the call returned."""
    handed, done, seen = [], threading.Event(), []
    go = threading.Event()

    def reader():
        go.wait()
        seen.append(values(handed.pop()))
        done.set()

    th = threading.Thread(target=reader)
    th.start()
    name = "test_call_views.hand_over"
    rivet.register_func(name, lambda t: handed.append(t), override=True)
    try:
        x = torch.arange(4, dtype=torch.float64)
        w = weakref.ref(x)
        rivet.get_global_func(name)(x)
        del x
        gc.collect()
        assert w() is not None
        go.set()
        assert done.wait(30)
        th.join()
        np.testing.assert_array_equal(seen[0], np.arange(4.0))
        gc.collect()
        assert w() is None
    finally:
        rivet.remove_global_func(name)


def test_one_view_returned_among_several_arguments():
    """Only the escaping view references its producer; the others are freed with the caller."""
    pick = "test_call_views.second"
    rivet.register_func(pick, lambda a, b, c: b, override=True)
    try:
        a, b, c = torch.rand(2), torch.rand(3), torch.rand(4)
        wa, wb, wc = weakref.ref(a), weakref.ref(b), weakref.ref(c)
        want = b.numpy().copy()
        r = rivet.get_global_func(pick)(a, b, c)
        del a, b, c
        gc.collect()
        assert wa() is None and wc() is None and wb() is not None
        np.testing.assert_array_equal(values(r), want)
        del r
        gc.collect()
        assert wb() is None
    finally:
        rivet.remove_global_func(pick)


def test_the_same_tensor_returned_twice_is_released_once():
    x = torch.rand(3)
    w = weakref.ref(x)
    r1, r2 = echo(x), echo(x)
    del x
    gc.collect()
    assert w() is not None
    del r1
    gc.collect()
    assert w() is not None
    np.testing.assert_array_equal(values(r2), w().numpy())
    del r2
    gc.collect()
    assert w() is None


# ---- hostile layouts: the checked path's own messages ----------------------------------------

# Every producer lives for the session: its deleter is a ctypes callback inside it.
_PRODUCERS = []


def capsule(shape, strides, buf, code_bits=(2, 32)):
    """A versioned capsule over `buf` with any shape and strides; counts its deleter calls."""
    p = type("Producer", (), {})()
    _PRODUCERS.append(p)
    p.buf, p.deleted = buf, 0
    p.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    p.strides = (ctypes.c_int64 * max(len(strides), 1))(*strides)

    def deleter(_):
        p.deleted += 1

    p.deleter = DELETER(deleter)
    p.managed = DLManagedTensorVersioned(
        version=DLPackVersion(1, 0),
        deleter=p.deleter,
        dl_tensor=DLTensor(
            data=buf.ctypes.data,
            device=DLDevice(1, 0),
            ndim=len(shape),
            dtype=DLDataType(*code_bits, 1),
            shape=ctypes.cast(p.shape, ctypes.POINTER(ctypes.c_int64)),
            strides=ctypes.cast(p.strides, ctypes.POINTER(ctypes.c_int64)),
        ),
    )
    p.capsule = capsule_of(p.managed)
    return p


U8 = (1, 8)
# (shape, strides, dtype code/bits, error class, the whole message after "argument 0: ").
# Each sits at or just past a limit of the one-pass check (2^31 dims and strides, negative
# values, products and sums that leave int64), so the checked path decides and words it.
HOSTILE = [
    ((3,), (2**62,), (2, 32), rivet.DLPackError,
     "refused DLPack tensor: dim 0: stride 4611686018427387904 times the item size 4 overflows int64"),
    ((2, 2), (-(2**62), 2**62), U8, rivet.DLPackError,
     "refused DLPack tensor: shape [2, 2] with strides [-4611686018427387904, 4611686018427387904] "
     "spans 9223372036854775809 bytes of memory (from byte -4611686018427387904 to byte "
     "4611686018427387905 around the first element), more than isize::MAX"),
    ((2**62, 4), (4, 1), (2, 32), rivet.ShapeError,
     "shape [4611686018427387904, 4] has more elements than fit in int64"),
    ((2**31, 2**31, 2**31), (0, 0, 0), U8, rivet.ShapeError,
     "shape [2147483648, 2147483648, 2147483648] has more elements than fit in int64"),
    ((2**40, 2**40, 0), (0, 0, 1), (2, 32), rivet.ShapeError,
     "shape [1099511627776, 1099511627776, 0] has more elements than fit in int64"),
    ((-1,), (1,), (2, 32), rivet.ShapeError, "dim 0 has negative size -1"),
    ((4, -(2**31) - 1), (1, 1), (2, 32), rivet.ShapeError, "dim 1 has negative size -2147483649"),
    ((2**31, 2**31), (2**31, 1), (2, 32), rivet.DLPackError,
     "refused DLPack tensor: shape [2147483648, 2147483648] with strides [2147483648, 1] spans "
     "18446744073709551616 bytes of memory (from byte 0 to byte 18446744073709551616 around the "
     "first element), more than isize::MAX"),
    ((2,) * 62, (2**58,) * 62, U8, rivet.DLPackError,
     "refused DLPack tensor: shape [" + ", ".join(["2"] * 62) + "] with strides ["
     + ", ".join([str(2**58)] * 62) + "] spans 17870283321406128129 bytes of memory (from byte 0 "
     "to byte 17870283321406128129 around the first element), more than isize::MAX"),
]


@pytest.mark.parametrize("shape,strides,code,err,msg", HOSTILE)
def test_hostile_layouts_are_refused_with_the_checked_message(shape, strides, code, err, msg):
    buf = np.arange(16, dtype=np.float32)
    before = buf.copy()
    p = capsule(shape, strides, buf, code)
    with pytest.raises(err) as ei:
        nop(p.capsule)
    assert str(ei.value) == f"testing.nop: argument 0: {msg}"
    assert p.deleted == 1
    np.testing.assert_array_equal(buf, before)


def test_layouts_near_the_limits_are_accepted():
    """Zero dims with any stride, size-one dims with huge strides: valid, accepted by both paths."""
    buf = np.arange(16, dtype=np.float32)
    for shape, strides in [((0, 2**31 + 1), (2**40, 1)), ((1, 4), (2**50, 1)),
                           ((4,), (2**31,)), ((2, 0), (-(2**40), 3))]:
        p = capsule(shape, strides, buf)
        t = rivet.from_dlpack(p.capsule)
        assert t.shape == shape and t.strides == strides
        del t
        gc.collect()
        assert p.deleted == 1


# ---- compiled calls on torch tensors ---------------------------------------------------------


@pytest.fixture(scope="module")
def add_static():
    A = te.placeholder((4, 3), name="A")
    B = te.placeholder((4, 3), name="B")
    C = te.compute((4, 3), lambda i, j: A[i, j] + B[i, j], name="C")
    return rivet.build(rivet.create_schedule(C), [A, B, C], name="add")["add"]


@pytest.fixture(scope="module")
def add_symbolic():
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] * 2.0 + B[i], name="C")
    return rivet.build(rivet.create_schedule(C), [A, B, C], name="axpb")["axpb"]


def test_static_add_matches_torch_on_poisoned_outputs(add_static):
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        x, y = torch.rand(4, 3, generator=g), torch.rand(4, 3, generator=g)
        z = torch.full((4, 3), float("nan"))
        add_static(x, y, z)
        torch.testing.assert_close(z, x + y, rtol=0, atol=0)
    # Strided views run in place, through their own strides.
    x = torch.rand(3, 4, generator=g).t()
    y = torch.rand(4, 6, generator=g)[:, ::2]
    zbig = torch.full((4, 6), float("nan"))
    z = zbig[:, 1::2]
    add_static(x, y, z)
    torch.testing.assert_close(z, x + y, rtol=0, atol=0)
    assert torch.isnan(zbig[:, ::2]).all()  # nothing written beside the view
    # Inputs only: the output is allocated and returned.
    r = add_static(x, y)
    torch.testing.assert_close(torch.from_dlpack(r), x + y, rtol=0, atol=0)


def test_static_add_refusals_are_unchanged(add_static):
    x, y = torch.rand(4, 3), torch.rand(4, 3)
    with pytest.raises(rivet.ShapeError, match="dim 0"):
        add_static(torch.rand(5, 3), y, torch.empty(4, 3))
    with pytest.raises(rivet.DTypeError):
        add_static(x.double(), y, torch.empty(4, 3))
    with pytest.raises(rivet.LayoutError, match="shares memory"):
        add_static(x, y, x)
    with pytest.raises(rivet.DLPackError, match="requires grad"):
        add_static(x.requires_grad_(), y, torch.empty(4, 3))
    # A self-overlapping output (stride 0) is refused.
    with pytest.raises(rivet.Error):
        add_static(torch.rand(4, 3), y, torch.zeros(1, 3).expand(4, 3))


def test_symbolic_call_matches_torch_across_sizes(add_symbolic):
    g = torch.Generator().manual_seed(11)
    for n in [1, 7, 7, 64, 0, 7, 1000]:
        x, y = torch.rand(n, generator=g), torch.rand(n, generator=g)
        z = torch.full((n,), float("nan"))
        add_symbolic(x, y, z)
        torch.testing.assert_close(z, x * 2.0 + y, rtol=0, atol=0)
