"""Deleters run exactly once; no reference or memory leaks."""

import gc
import sys
import weakref

import numpy as np
import torch
import torch.utils.dlpack

import rivet

MB = 1 << 20


def settle():
    gc.collect()
    gc.collect()


def test_numpy_refcount_from_dlpack(h, rng):
    a = h.random_array(rng, (16,), np.float32)
    settle()
    base = sys.getrefcount(a)
    t = rivet.from_dlpack(a)
    # the producer is kept alive by the view
    assert sys.getrefcount(a) > base
    del t
    settle()
    assert sys.getrefcount(a) == base
    # numpy() views and exports keep it alive too, and release it
    t = rivet.from_dlpack(a)
    v = t.numpy()
    tt = torch.from_dlpack(t)
    del t
    settle()
    assert sys.getrefcount(a) > base
    del v, tt
    settle()
    assert sys.getrefcount(a) == base


def test_numpy_refcount_through_calls(h, rng, axpy, echo):
    x = h.random_array(rng, (32,), np.float64)
    y = h.random_array(rng, (32,), np.float64)
    settle()
    bx, by = sys.getrefcount(x), sys.getrefcount(y)
    for _ in range(100):
        axpy(0.5, x, y)
    settle()
    assert (sys.getrefcount(x), sys.getrefcount(y)) == (bx, by)
    r = echo(x)
    assert r.data_ptr == x.ctypes.data
    del r
    settle()
    assert sys.getrefcount(x) == bx
    for _ in range(100):
        echo(x)
    settle()
    assert sys.getrefcount(x) == bx


def test_numpy_refcount_raw_capsules(h, rng, axpy):
    a = h.random_array(rng, (8,), np.float32)
    y = h.random_array(rng, (8,), np.float32)
    settle()
    base = sys.getrefcount(a)
    for make in (lambda: a.__dlpack__(), lambda: a.__dlpack__(max_version=(1, 0))):
        cap = make()
        t = rivet.from_dlpack(cap)
        del cap
        settle()
        assert sys.getrefcount(a) > base
        del t
        settle()
        assert sys.getrefcount(a) == base
        cap = make()
        axpy(1.0, cap, y)
        del cap
        settle()
        assert sys.getrefcount(a) == base


def test_numpy_refcount_after_failed_calls(h, rng, axpy):
    x = h.random_array(rng, (8,), np.float32)
    y64 = h.random_array(rng, (8,), np.float64)
    ro = h.random_array(rng, (8,), np.float32)
    ro.flags.writeable = False
    short = h.random_array(rng, (7,), np.float32)
    settle()
    base = [sys.getrefcount(o) for o in (x, y64, ro, short)]
    for args in [(1.0, x, y64), (1.0, x, ro), (1.0, x, short), (1.0, x), ("a", x, x)]:
        for _ in range(20):
            try:
                axpy(*args)
            except rivet.Error:
                pass
            else:
                raise AssertionError("expected an error for %r" % (args,))
        del args
    settle()
    assert [sys.getrefcount(o) for o in (x, y64, ro, short)] == base


def test_torch_refcount_and_use_count(h, rng, axpy, echo):
    t = torch.from_numpy(h.random_array(rng, (64,), np.float32))
    y = torch.from_numpy(h.random_array(rng, (64,), np.float32))
    settle()
    base_ref = sys.getrefcount(t)
    base_use = t._use_count()
    base_storage = torch._C._storage_Use_Count(t.untyped_storage()._cdata)
    r = rivet.from_dlpack(t)
    del r
    for _ in range(50):
        rivet.from_dlpack(t)
        rivet.from_dlpack(torch.utils.dlpack.to_dlpack(t))
        rivet.from_dlpack(t.__dlpack__(max_version=(1, 0)))
        axpy(0.1, t, y)
        echo(t)
    r = echo(t)
    del r
    settle()
    assert sys.getrefcount(t) == base_ref
    assert t._use_count() == base_use
    assert torch._C._storage_Use_Count(t.untyped_storage()._cdata) == base_storage


def test_torch_memory_kept_then_released():
    t = torch.empty(1 << 16, dtype=torch.float32).fill_(1.5)
    st = t.untyped_storage()
    base = torch._C._storage_Use_Count(st._cdata)
    r = rivet.from_dlpack(t)
    ptr = t.data_ptr()
    del t
    settle()
    # the rivet view still holds the torch memory
    assert r.data_ptr == ptr
    assert float(r.numpy()[-1]) == 1.5
    del r
    settle()
    assert torch._C._storage_Use_Count(st._cdata) == base - 1  # only `st` is left
    del st


class Producer:
    """A weakref-able producer whose exported buffer lives only inside the capsule."""

    def __init__(self, n, versioned):
        self.n = n
        self.versioned = versioned
        self.exports = 0
        self.buffer_ref = None
        self.finalized = []

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.exports += 1
        a = np.arange(1.0, self.n + 1.0)
        self.buffer_ref = weakref.ref(a)
        weakref.finalize(a, self.finalized.append, 1)
        if self.versioned and max_version is not None:
            return a.__dlpack__(max_version=max_version)
        return a.__dlpack__()

    def __dlpack_device__(self):
        return (1, 0)


def test_producer_deleter_runs_exactly_once():
    for versioned in (True, False):
        p = Producer(10, versioned)
        pref = weakref.ref(p)
        t = rivet.from_dlpack(p)
        assert p.exports == 1
        buf = p.buffer_ref
        fin = p.finalized
        del p
        settle()
        assert buf() is not None  # the exported memory lives while the view lives
        np.testing.assert_array_equal(t.numpy(), np.arange(1.0, 11.0))
        assert fin == []
        del t
        settle()
        assert pref() is None  # the producer object is freed
        assert buf() is None  # the deleter ran
        assert fin == [1]  # exactly once


def test_producer_deleter_after_call(axpy, echo):
    p = Producer(6, True)
    y = np.ones(6)
    axpy(2.0, p, y)
    np.testing.assert_array_equal(y, 1 + 2 * np.arange(1.0, 7.0))
    settle()
    assert p.buffer_ref() is None
    assert p.finalized == [1]
    r = echo(p)
    assert p.exports == 2
    assert p.buffer_ref() is not None
    del r
    settle()
    assert p.buffer_ref() is None
    assert p.finalized == [1, 1]


def test_producer_deleter_with_exports():
    p = Producer(4, True)
    t = rivet.from_dlpack(p)
    buf = p.buffer_ref
    tt = torch.from_dlpack(t)
    nn = np.from_dlpack(t)
    v = t.numpy()
    del t
    settle()
    assert buf() is not None
    del tt, nn
    settle()
    assert buf() is not None  # v still refers to it
    assert v[3] == 4.0
    del v
    settle()
    assert buf() is None
    assert p.finalized == [1]


def test_unconsumed_rivet_capsules_release(h, rng):
    a = h.random_array(rng, (8,), np.float32)
    settle()
    base = sys.getrefcount(a)
    t = rivet.from_dlpack(a)
    for _ in range(100):
        t.__dlpack__()
        t.__dlpack__(max_version=(1, 0))
    del t
    settle()
    assert sys.getrefcount(a) == base


def _loop_rss(rss, fn, n, warmup=1000):
    for _ in range(warmup):
        fn()
    settle()
    r0 = rss()
    for _ in range(n):
        fn()
    settle()
    return rss() - r0


def test_rss_numpy_imports(rss_bytes):
    a = np.ones((4, 4), np.float32)
    settle()
    base = sys.getrefcount(a)
    grew = _loop_rss(rss_bytes, lambda: rivet.from_dlpack(a), 100_000)
    assert grew < 20 * MB, grew / MB
    assert sys.getrefcount(a) == base


def test_rss_torch_imports(rss_bytes):
    t = torch.ones(4, 4)
    use = t._use_count()
    grew = _loop_rss(rss_bytes, lambda: rivet.from_dlpack(t), 100_000)
    assert grew < 20 * MB, grew / MB
    assert t._use_count() == use


def test_rss_fresh_buffers(rss_bytes):
    # a leaked deleter here would keep 8 KiB per iteration alive (> 150 MB in all)
    grew = _loop_rss(rss_bytes, lambda: rivet.from_dlpack(np.empty(1024)), 20_000, warmup=500)
    assert grew < 20 * MB, grew / MB
    grew = _loop_rss(rss_bytes, lambda: rivet.from_dlpack(torch.empty(2048)), 20_000, warmup=500)
    assert grew < 20 * MB, grew / MB


def test_rss_calls(rss_bytes, axpy):
    x = np.ones(16, np.float32)
    y = np.ones(16, np.float32)
    tx, ty = torch.ones(16), torch.ones(16)

    def call():
        axpy(0.0, x, y)
        axpy(0.0, tx, ty)

    grew = _loop_rss(rss_bytes, call, 50_000)
    assert grew < 20 * MB, grew / MB


def test_capsule_in_failed_call_released(h, rng, axpy):
    a = h.random_array(rng, (8,), np.float32)
    y64 = h.random_array(rng, (8,), np.float64)
    settle()
    base = sys.getrefcount(a)
    for make in (lambda: a.__dlpack__(), lambda: a.__dlpack__(max_version=(1, 0))):
        for _ in range(20):
            cap = make()
            try:
                axpy(1.0, cap, y64)
            except rivet.DTypeError:
                pass
            else:
                raise AssertionError("expected DTypeError")
            del cap
    settle()
    assert sys.getrefcount(a) == base


def test_fallback_producer_released(h, rng, axpy):
    class Old:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return (1, 0)

    a = h.random_array(rng, (8,), np.float32)
    y = h.random_array(rng, (8,), np.float32)
    p = Old(a)
    settle()
    base = sys.getrefcount(a)
    for _ in range(50):
        rivet.from_dlpack(p)
        axpy(0.5, p, y)
    settle()
    assert sys.getrefcount(a) == base
