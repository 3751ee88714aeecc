"""Zero-copy DLPack import and export with torch, numpy and jax; raw capsules; producers."""

import gc
import sys
import weakref

import jax
import jax.dlpack
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.utils.dlpack

import rivet


def capsule_name(cap):
    # repr of a PyCapsule: <capsule object "NAME" at 0x...>
    return repr(cap).split('"')[1]


# --------------------------------------------------------------------------------------
# 1. zero-copy import
# --------------------------------------------------------------------------------------


def test_import_torch_pointer(h, rng):
    t = torch.from_numpy(h.random_array(rng, (5, 7)))
    r = rivet.from_dlpack(t)
    assert isinstance(r, rivet.Tensor)
    assert r.data_ptr == t.data_ptr()
    assert r.shape == (5, 7)
    assert r.dtype == "float32"
    np.testing.assert_array_equal(r.numpy(), t.numpy())


def test_import_torch_native_allocation_pointer():
    t = torch.rand(3, 4, dtype=torch.float64) + 0.5
    r = rivet.from_dlpack(t)
    assert r.data_ptr == t.data_ptr()
    assert r.dtype == "float64"


def test_import_numpy_pointer(h, rng):
    a = h.random_array(rng, (4, 6), np.float64)
    r = rivet.from_dlpack(a)
    assert r.data_ptr == a.ctypes.data
    assert r.data_ptr == a.__array_interface__["data"][0]
    assert r.shape == a.shape
    assert r.dtype == "float64"


def test_import_jax_pointer(h, rng):
    j = jnp.asarray(h.random_array(rng, (3, 5)))
    r = rivet.from_dlpack(j)
    assert r.data_ptr == j.unsafe_buffer_pointer()
    assert r.shape == (3, 5)
    assert r.dtype == "float32"
    np.testing.assert_array_equal(r.numpy(), np.asarray(j))


def test_import_jax_is_read_only(h, rng):
    j = jnp.asarray(h.random_array(rng, (6,)))
    r = rivet.from_dlpack(j)
    assert r.read_only is True
    v = r.numpy()
    assert v.flags.writeable is False
    with pytest.raises(ValueError):
        v[0] = 1.0


def test_import_rivet_tensor_is_view(h, rng):
    a = h.random_array(rng, (8,))
    r = rivet.from_dlpack(a)
    r2 = rivet.from_dlpack(r)
    assert isinstance(r2, rivet.Tensor)
    assert r2.data_ptr == r.data_ptr == a.ctypes.data


def test_axpy_torch_output_seen_by_numpy_view(h, rng, axpy):
    x = torch.from_numpy(h.random_array(rng, (64,)))
    y = torch.from_numpy(h.random_array(rng, (64,)).copy())
    ref = h.ref_axpy(1.75, x, y)
    ynp = y.numpy()  # torch's own zero-copy numpy view
    axpy(1.75, x, y)
    h.assert_close(ynp, ref)
    h.assert_close(y, ref)


def test_axpy_numpy_output_seen_by_torch_view(h, rng, axpy):
    x = h.random_array(rng, (3, 17), np.float64)
    y = h.random_array(rng, (3, 17), np.float64)
    yt = torch.from_numpy(y)  # zero-copy torch view of y
    ref = h.ref_axpy(-0.5, x, y)
    axpy(-0.5, x, y)
    h.assert_close(yt, ref)
    h.assert_close(y, ref)


def test_numpy_view_shares_memory_with_torch(h, rng):
    t = torch.from_numpy(h.random_array(rng, (4, 4)).copy())
    r = rivet.from_dlpack(t)
    v = r.numpy()
    assert isinstance(v, np.ndarray)
    assert v.flags.writeable
    assert np.shares_memory(v, t.numpy())
    assert v.ctypes.data == t.data_ptr()
    v[2, 3] = 42.0
    assert t[2, 3].item() == 42.0
    t[0, 1] = -7.0
    assert v[0, 1] == -7.0


def test_numpy_view_shares_memory_with_numpy(h, rng):
    a = h.random_array(rng, (10,), np.float64)
    v = rivet.from_dlpack(a).numpy()
    assert np.shares_memory(v, a)
    v[:] = 3.25
    assert np.all(a == 3.25)


def test_memory_kept_alive_after_producer_dropped(h, rng):
    a = h.random_array(rng, (1000,), np.float64)
    expect = a.copy()
    r = rivet.from_dlpack(a)
    del a
    gc.collect()
    # allocate some garbage so freed memory would likely be reused
    junk = [np.full(1000, 9.0) for _ in range(50)]
    np.testing.assert_array_equal(r.numpy(), expect)
    del junk

    t = torch.from_numpy(h.random_array(rng, (1000,)))
    texpect = t.numpy().copy()
    r2 = rivet.from_dlpack(t)
    del t
    gc.collect()
    np.testing.assert_array_equal(r2.numpy(), texpect)


# --------------------------------------------------------------------------------------
# 1. export
# --------------------------------------------------------------------------------------


def test_export_to_torch(h, rng):
    a = h.random_array(rng, (3, 4))
    r = rivet.from_dlpack(a)
    t = torch.from_dlpack(r)
    assert isinstance(t, torch.Tensor)
    assert t.data_ptr() == a.ctypes.data
    assert t.dtype == torch.float32
    assert tuple(t.shape) == (3, 4)
    np.testing.assert_array_equal(t.numpy(), a)
    t[1, 2] = 11.0  # writable, same memory
    assert a[1, 2] == 11.0


def test_export_to_numpy(h, rng):
    t = torch.from_numpy(h.random_array(rng, (2, 5), np.float64))
    r = rivet.from_dlpack(t)
    a = np.from_dlpack(r)
    assert a.ctypes.data == t.data_ptr()
    assert a.dtype == np.float64
    np.testing.assert_array_equal(a, t.numpy())
    assert a.flags.writeable
    a[0, 0] = 5.5
    assert t[0, 0].item() == 5.5


def test_export_read_only_to_numpy_is_read_only(h, rng):
    a = h.random_array(rng, (5,))
    a.flags.writeable = False
    r = rivet.from_dlpack(a)
    assert r.read_only is True
    b = np.from_dlpack(r)
    assert b.ctypes.data == a.ctypes.data
    assert b.flags.writeable is False
    np.testing.assert_array_equal(b, a)


def test_export_read_only_legacy_refused(h, rng):
    a = h.random_array(rng, (5,))
    a.flags.writeable = False
    r = rivet.from_dlpack(a)
    # a legacy capsule cannot carry the read-only flag: refused, as numpy does
    with pytest.raises(rivet.DLPackError) as ei:
        r.__dlpack__()
    assert isinstance(ei.value, BufferError)
    cap = r.__dlpack__(max_version=(1, 0))
    assert capsule_name(cap) == "dltensor_versioned"


@pytest.mark.parametrize("via", ["jax.dlpack", "jnp"])
def test_export_to_jax(h, rng, via):
    a = h.random_array(rng, (4, 3))
    r = rivet.from_dlpack(a)
    f = jax.dlpack.from_dlpack if via == "jax.dlpack" else jnp.from_dlpack
    j = f(r)
    assert isinstance(j, jax.Array)
    assert j.shape == (4, 3)
    assert j.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(j), a)


def test_export_capsule_kinds(h, rng):
    r = rivet.from_dlpack(h.random_array(rng, (3,)))
    assert capsule_name(r.__dlpack__()) == "dltensor"
    assert capsule_name(r.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(r.__dlpack__(max_version=(1, 3))) == "dltensor_versioned"
    # a consumer that only knows DLPack 0.x gets a legacy capsule
    assert capsule_name(r.__dlpack__(max_version=(0, 8))) == "dltensor"
    # unused capsules are simply dropped: their destructor releases the view
    for _ in range(10):
        r.__dlpack__()
        r.__dlpack__(max_version=(1, 0))
    gc.collect()


def test_export_chain_keeps_memory(h, rng):
    a = h.random_array(rng, (6, 2), np.float64)
    expect = a.copy()
    t = torch.from_dlpack(rivet.from_dlpack(torch.from_dlpack(rivet.from_dlpack(a))))
    assert t.data_ptr() == a.ctypes.data
    del a
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), expect)


def test_round_trips_through_torch_drop_cleanly():
    """rivet -> torch -> rivet -> torch ... then drop: torch releases the GIL while it destroys
    a tensor, and rivet's views over torch tensors used to release their reference inside that
    destructor without the GIL (a fatal error from the second round trip on). Run in a child
    process, since the failure aborts the interpreter; values checked after each depth."""
    import subprocess
    import textwrap

    code = textwrap.dedent("""
        import sys, numpy as np, torch, rivet
        for depth in (1, 2, 3, 50, 5000):
            base = np.arange(6.0).reshape(2, 3)
            t = rivet.from_dlpack(base)
            for _ in range(depth):
                t = rivet.from_dlpack(torch.from_dlpack(t))
            assert t.numpy().tolist() == base.tolist()
            del t
            # a view of the chain, a torch tensor at the end, and a garbage collection
            t = rivet.from_dlpack(torch.from_dlpack(rivet.from_dlpack(base))[1:])
            tt = torch.from_dlpack(t)
            del t
            assert tt.tolist() == [[3.0, 4.0, 5.0]]
            del tt
            import gc; gc.collect()
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stderr[-2000:])


def test_export_dl_device_and_copy_keywords(h, rng):
    r = rivet.from_dlpack(h.random_array(rng, (3,)))
    cap = r.__dlpack__(stream=None, max_version=(1, 0), dl_device=(1, 0), copy=False)
    assert capsule_name(cap) == "dltensor_versioned"
    t = torch.from_dlpack(cap)
    assert t.data_ptr() == r.data_ptr


def test_export_to_other_device_refused(h, rng):
    r = rivet.from_dlpack(h.random_array(rng, (3,)))
    # kDLCUDA: a CPU tensor cannot be handed over without a cross-device copy
    with pytest.raises(rivet.DLPackError) as ei:
        r.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    assert isinstance(ei.value, BufferError)


def test_import_meta_tensor_clean_error(axpy):
    # torch refuses to export meta tensors; rivet must surface a clean rivet error
    # (not torch's C++ RuntimeError with its stack dump)
    m = torch.empty(3, device="meta")
    for call in (lambda: rivet.from_dlpack(m), lambda: axpy(1.0, torch.ones(3), m)):
        with pytest.raises(rivet.Error) as ei:
            call()
        assert isinstance(ei.value, (rivet.DeviceError, rivet.DLPackError)), type(ei.value)
        assert "frame #" not in str(ei.value)


# --------------------------------------------------------------------------------------
# 2. raw capsules
# --------------------------------------------------------------------------------------


def _capsules(h, rng):
    t = torch.from_numpy(h.random_array(rng, (4, 3)))
    a = h.random_array(rng, (4, 3))
    return [
        ("torch-legacy", t, t.data_ptr(), lambda: torch.utils.dlpack.to_dlpack(t), "dltensor"),
        ("torch-versioned", t, t.data_ptr(), lambda: t.__dlpack__(max_version=(1, 0)), "dltensor_versioned"),
        ("numpy-versioned", a, a.ctypes.data, lambda: a.__dlpack__(max_version=(1, 0)), "dltensor_versioned"),
        ("numpy-legacy", a, a.ctypes.data, lambda: a.__dlpack__(), "dltensor"),
    ]


@pytest.mark.parametrize("kind", ["torch-legacy", "torch-versioned", "numpy-versioned", "numpy-legacy"])
def test_capsule_from_dlpack_and_reuse(h, rng, kind):
    (_, src, ptr, make, name) = [c for c in _capsules(h, rng) if c[0] == kind][0]
    cap = make()
    assert capsule_name(cap) == name
    r = rivet.from_dlpack(cap)
    assert r.data_ptr == ptr
    assert r.shape == (4, 3)
    np.testing.assert_array_equal(r.numpy(), h.to_np(src))
    assert capsule_name(cap) == "used_" + name
    with pytest.raises(rivet.DLPackError) as ei:
        rivet.from_dlpack(cap)
    assert isinstance(ei.value, BufferError)
    assert isinstance(ei.value, rivet.Error)
    # still usable afterwards, nothing crashed
    np.testing.assert_array_equal(r.numpy(), h.to_np(src))


@pytest.mark.parametrize("kind", ["torch-legacy", "torch-versioned", "numpy-versioned"])
def test_capsule_in_call_and_reuse(h, rng, axpy, kind):
    t = torch.from_numpy(h.random_array(rng, (4, 3)))
    a = h.random_array(rng, (4, 3))
    y = h.random_array(rng, (4, 3))
    make = {
        "torch-legacy": lambda: torch.utils.dlpack.to_dlpack(t),
        "torch-versioned": lambda: t.__dlpack__(max_version=(1, 0)),
        "numpy-versioned": lambda: a.__dlpack__(max_version=(1, 0)),
    }[kind]
    src = t.numpy() if kind.startswith("torch") else a
    cap = make()
    ref = h.ref_axpy(2.0, src, y)
    axpy(2.0, cap, y)  # capsule as the input x
    h.assert_close(y, ref)
    before = h.bits(y)
    with pytest.raises(rivet.DLPackError) as ei:
        axpy(2.0, cap, y)
    assert isinstance(ei.value, BufferError)
    h.assert_bits_equal(y, before)


def test_capsule_as_output(h, rng, axpy):
    x = h.random_array(rng, (9,))
    yt = torch.from_numpy(h.random_array(rng, (9,)).copy())
    ref = h.ref_axpy(0.25, x, yt)
    cap = yt.__dlpack__(max_version=(1, 0))
    axpy(0.25, x, cap)
    h.assert_close(yt, ref)
    cap2 = torch.utils.dlpack.to_dlpack(yt)
    ref2 = h.ref_axpy(3.0, x, yt)
    axpy(3.0, x, cap2)
    h.assert_close(yt, ref2)


def test_capsule_read_only_flag_as_output(h, rng, axpy):
    x = h.random_array(rng, (5,))
    y = h.random_array(rng, (5,))
    y.flags.writeable = False
    cap = y.__dlpack__(max_version=(1, 0))
    before = h.bits(y)
    with pytest.raises(rivet.ReadOnlyError):
        axpy(1.0, x, cap)
    h.assert_bits_equal(y, before)


def test_capsule_of_rivet_tensor_reuse(h, rng):
    r = rivet.from_dlpack(h.random_array(rng, (3,)))
    for cap in (r.__dlpack__(), r.__dlpack__(max_version=(1, 0))):
        r2 = rivet.from_dlpack(cap)
        assert r2.data_ptr == r.data_ptr
        with pytest.raises(rivet.DLPackError):
            rivet.from_dlpack(cap)


def test_capsule_consumed_by_torch_then_rivet(h, rng):
    r = rivet.from_dlpack(h.random_array(rng, (3,)))
    cap = r.__dlpack__(max_version=(1, 0))
    torch.from_dlpack(cap)
    with pytest.raises(rivet.DLPackError):
        rivet.from_dlpack(cap)


# --------------------------------------------------------------------------------------
# 10. producers: fallback without max_version, exceptions, garbage
# --------------------------------------------------------------------------------------


class OldProducer:
    """A producer from before DLPack 1.0: __dlpack__ rejects max_version."""

    def __init__(self, a):
        self.a = a
        self.calls = 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_producer_without_max_version(h, rng):
    a = h.random_array(rng, (3, 4), np.float64)
    p = OldProducer(a)
    r = rivet.from_dlpack(p)
    assert r.data_ptr == a.ctypes.data
    assert r.shape == (3, 4)
    np.testing.assert_array_equal(r.numpy(), a)
    assert p.calls == 1


def test_producer_without_max_version_in_call(h, rng, axpy):
    x = h.random_array(rng, (7,))
    y = h.random_array(rng, (7,))
    ref = h.ref_axpy(1.5, x, y)
    axpy(1.5, OldProducer(x), OldProducer(y))
    h.assert_close(y, ref)


class VersionedProducer:
    def __init__(self, a):
        self.a = a
        self.kwargs = []

    def __dlpack__(self, **kw):
        self.kwargs.append(kw)
        return self.a.__dlpack__(**{k: v for k, v in kw.items() if k in ("stream", "max_version")})

    def __dlpack_device__(self):
        return (1, 0)


def test_producer_asked_for_max_version(h, rng):
    a = h.random_array(rng, (5,))
    p = VersionedProducer(a)
    r = rivet.from_dlpack(p)
    assert r.data_ptr == a.ctypes.data
    assert len(p.kwargs) == 1
    mv = p.kwargs[0].get("max_version")
    assert mv is not None and tuple(mv)[0] >= 1


class RaisingProducer:
    class Boom(RuntimeError):
        pass

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        raise self.Boom("producer says no")

    def __dlpack_device__(self):
        return (1, 0)


def test_producer_exception_becomes_dlpack_error():
    # A producer that fails to export is reported as rivet.DLPackError naming the argument
    # and quoting the producer's exception type and message (README "Errors").
    with pytest.raises(rivet.DLPackError, match="argument 0 .*Boom: producer says no"):
        rivet.from_dlpack(RaisingProducer())


class GarbageProducer:
    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return 42

    def __dlpack_device__(self):
        return (1, 0)


def test_producer_returning_garbage():
    with pytest.raises(rivet.Error):
        rivet.from_dlpack(GarbageProducer())


def test_from_dlpack_not_a_tensor():
    for bad in ("abc", [1.0, 2.0], 3, None, object()):
        with pytest.raises(rivet.Error) as ei:
            rivet.from_dlpack(bad)
        assert isinstance(ei.value, (TypeError, BufferError))


def test_foreign_capsule_name_rejected():
    import ctypes

    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    buf = ctypes.create_string_buffer(256)
    cap = new(ctypes.addressof(buf), b"not_a_dltensor", None)
    with pytest.raises(rivet.Error) as ei:
        rivet.from_dlpack(cap)
    assert isinstance(ei.value, (TypeError, BufferError))


def test_complex_import_is_clean(h):
    # complex is not in rivet's dtype list today: either a clear error or a correct view,
    # and in both cases the producer's deleter runs (no leak)
    a = (np.arange(4) + 1j).astype(np.complex128)
    base = h.refcount_settled(a)
    try:
        r = rivet.from_dlpack(a)
    except rivet.Error as e:
        assert isinstance(e, (rivet.DTypeError, rivet.DLPackError)), type(e)
    else:
        assert r.data_ptr == a.ctypes.data
        assert "complex" in r.dtype
        del r
    assert h.refcount_settled(a) == base
