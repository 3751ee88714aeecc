"""rivet.Tensor as a producer of DLPack's C exchange API (``__dlpack_c_exchange_api__``).

A C consumer is played with ctypes (always available), reading the table exactly as a C
extension would; tvm-ffi, a real consumer of the API, is checked too when installed. Every
test asserts that the C path was taken (``_native._exchange_api_stats()`` counts calls through
each entry), that data is shared (same address), that the read-only flag travels, and that
exports are released (``live_exports`` back to where it was).

torch.from_dlpack (torch 2.15) does not read a foreign type's exchange table: it calls
``__dlpack__``; its results are checked here too, whatever path it takes.
"""

import ctypes
import gc

import numpy as np
import pytest
import torch

import rivet
from rivet import _native

# ---- the DLPack ABI, as a C consumer declares it -------------------------------------------


from dlpack_abi import DLDataType, DLDevice, DLTensor  # noqa: E402


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("major", ctypes.c_uint32),
    ("minor", ctypes.c_uint32),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]
READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY

MANAGED_P = ctypes.POINTER(DLManagedTensorVersioned)
# PYFUNCTYPE: called with the GIL held, and a Python error the callee sets is raised.
FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(MANAGED_P))
TO_PY = ctypes.PYFUNCTYPE(ctypes.c_int, MANAGED_P, ctypes.POINTER(ctypes.c_void_p))
SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
ALLOC = ctypes.PYFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(MANAGED_P), ctypes.c_void_p, SET_ERROR
)
STREAM = ctypes.PYFUNCTYPE(
    ctypes.c_int, ctypes.c_uint, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p)
)


class ExchangeAPI(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("prev_api", ctypes.c_void_p),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def api_of(obj):
    """What a C consumer does: the capsule on the *type*, then the table behind it."""
    cap = type(obj).__dlpack_c_exchange_api__
    return ExchangeAPI.from_address(_get_pointer(cap, b"dlpack_exchange_api"))


_decref = ctypes.pythonapi.Py_DecRef
_decref.argtypes = [ctypes.c_void_p]


def steal(ptr):
    """The object behind a new reference a C function handed back (ownership taken)."""
    obj = ctypes.cast(ptr, ctypes.py_object).value
    _decref(ptr)
    return obj


def stats():
    return dict(_native._exchange_api_stats())


def export(t):
    api = api_of(t)
    out = MANAGED_P()
    assert FROM_PY(api.managed_tensor_from_py_object_no_sync)(t, ctypes.byref(out)) == 0
    return out


def delete(m):
    m.contents.deleter(m)


# ---- the table ------------------------------------------------------------------------------


def test_capsule_on_the_type_and_the_table():
    t = rivet.zeros((2,))
    cap = rivet.Tensor.__dlpack_c_exchange_api__
    assert type(cap).__name__ == "PyCapsule"
    assert "dlpack_exchange_api" in repr(cap)
    # On the type, so a consumer can cache it per type; the same capsule every time.
    assert "__dlpack_c_exchange_api__" in vars(rivet.Tensor)
    assert t.__dlpack_c_exchange_api__ is cap
    api = api_of(t)
    assert (api.major, api.minor) == rivet.DLPACK_VERSION
    assert api.prev_api is None
    assert api.managed_tensor_allocator
    assert api.managed_tensor_from_py_object_no_sync
    assert api.managed_tensor_to_py_object_no_sync
    assert api.current_work_stream
    # NULL on purpose: a borrowed DLTensor cannot carry the read-only flag.
    assert api.dltensor_from_py_object_no_sync is None


# ---- managed_tensor_from_py_object_no_sync --------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "uint8", "bool"])
def test_export_is_zero_copy_and_exact(dtype):
    a = (np.arange(24).reshape(2, 3, 4) % 5).astype(dtype)
    t = rivet.from_dlpack(a)
    before = stats()
    m = export(t)
    after = stats()
    assert after["managed_tensor_from_py_object_no_sync"] == before["managed_tensor_from_py_object_no_sync"] + 1
    assert after["live_exports"] == before["live_exports"] + 1
    dl = m.contents.dl_tensor
    assert dl.data + dl.byte_offset == t.data_ptr == a.ctypes.data
    assert dl.ndim == 3
    assert [dl.shape[i] for i in range(3)] == [2, 3, 4]
    assert [dl.strides[i] for i in range(3)] == list(t.strides)
    assert (dl.device.device_type, dl.device.device_id) == (1, 0)
    np_dtype = np.dtype(dtype)
    assert dl.dtype.bits == (8 if dtype == "bool" else np_dtype.itemsize * 8)
    assert dl.dtype.lanes == 1
    assert (m.contents.major, m.contents.minor) == rivet.DLPACK_VERSION
    assert m.contents.flags & READ_ONLY == 0
    delete(m)
    assert stats()["live_exports"] == before["live_exports"]


def test_export_of_a_strided_view_keeps_its_strides():
    x = torch.arange(40, dtype=torch.float32).reshape(5, 8)[1:, ::2]
    t = rivet.from_dlpack(x)
    m = export(t)
    dl = m.contents.dl_tensor
    assert dl.data + dl.byte_offset == x.data_ptr()
    assert [dl.shape[i] for i in range(2)] == [4, 4]
    assert [dl.strides[i] for i in range(2)] == [8, 2]
    delete(m)


def test_read_only_flag_travels():
    a = np.arange(6, dtype=np.float32)
    a.flags.writeable = False
    t = rivet.from_dlpack(a)
    assert t.read_only
    m = export(t)
    assert m.contents.flags & READ_ONLY == READ_ONLY
    delete(m)
    w = export(rivet.zeros((3,)))
    assert w.contents.flags & READ_ONLY == 0
    delete(w)


def test_export_keeps_the_memory_alive():
    t = rivet.zeros((1000,), "float64")
    ptr = t.data_ptr
    np.from_dlpack(t)[:] = 7.0  # write through a view while the tensor is alive
    m = export(t)
    del t
    gc.collect()
    # The rivet tensor object is gone; the export still owns the memory.
    view = np.ctypeslib.as_array(ctypes.cast(m.contents.dl_tensor.data, ctypes.POINTER(ctypes.c_double)), (1000,))
    assert m.contents.dl_tensor.data == ptr
    assert (view == 7.0).all()
    live = stats()["live_exports"]
    delete(m)
    assert stats()["live_exports"] == live - 1


def test_export_of_a_stranger_is_a_type_error():
    # The table's contract says "same type"; a C caller breaking it gets an error, not a
    # wild cast.
    api = api_of(rivet.zeros((1,)))
    out = MANAGED_P()
    with pytest.raises(TypeError, match="exports rivet.Tensor only"):
        FROM_PY(api.managed_tensor_from_py_object_no_sync)(np.zeros(3), ctypes.byref(out))
    assert not out


# ---- managed_tensor_to_py_object_no_sync ----------------------------------------------------


def test_import_back_into_a_rivet_tensor():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    a.flags.writeable = False
    t = rivet.from_dlpack(a)
    api = api_of(t)
    imports = rivet._native._live_imports()
    m = export(t)
    obj = ctypes.c_void_p()
    before = stats()
    assert TO_PY(api.managed_tensor_to_py_object_no_sync)(m, ctypes.byref(obj)) == 0
    back = steal(obj.value)
    assert stats()["managed_tensor_to_py_object_no_sync"] == before["managed_tensor_to_py_object_no_sync"] + 1
    assert isinstance(back, rivet.Tensor)
    assert back.shape == (2, 3) and back.dtype == "int32"
    assert back.data_ptr == a.ctypes.data
    assert back.read_only
    np.testing.assert_array_equal(back.numpy(), a)
    assert rivet._native._live_imports() == imports + 1
    del back
    gc.collect()
    assert rivet._native._live_imports() == imports
    assert stats()["live_exports"] == before["live_exports"] - 1


# ---- managed_tensor_allocator and current_work_stream ----------------------------------------


def test_allocator_makes_a_cpu_tensor():
    api = api_of(rivet.zeros((1,)))
    shape = (ctypes.c_int64 * 2)(3, 5)
    proto = DLTensor(None, DLDevice(1, 0), 2, DLDataType(2, 64, 1), shape, None, 0)
    errors = []
    cb = SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg)))
    out = MANAGED_P()
    before = stats()
    assert ALLOC(api.managed_tensor_allocator)(ctypes.byref(proto), ctypes.byref(out), None, cb) == 0
    assert not errors
    assert stats()["managed_tensor_allocator"] == before["managed_tensor_allocator"] + 1
    obj = ctypes.c_void_p()
    assert TO_PY(api.managed_tensor_to_py_object_no_sync)(out, ctypes.byref(obj)) == 0
    t = steal(obj.value)
    assert t.shape == (3, 5) and t.dtype == "float64" and t.device == "cpu"
    assert not t.read_only
    assert (t.numpy() == 0).all()


@pytest.mark.parametrize(
    "ndim, dtype, device, kind, words",
    [
        (-1, (2, 32, 1), (1, 0), b"DLPackError", b"ndim -1"),
        (1, (2, 7, 1), (1, 0), b"DTypeError", b""),
        (1, (2, 32, 1), (4, 0), b"", b""),  # OpenCL: not a device rivet allocates on
    ],
)
def test_allocator_errors_go_through_set_error(ndim, dtype, device, kind, words):
    api = api_of(rivet.zeros((1,)))
    shape = (ctypes.c_int64 * 1)(4)
    proto = DLTensor(None, DLDevice(*device), ndim, DLDataType(*dtype), shape, None, 0)
    errors = []
    cb = SET_ERROR(lambda ctx, k, msg: errors.append((k, msg)))
    out = MANAGED_P()
    live = stats()["live_exports"]
    assert ALLOC(api.managed_tensor_allocator)(ctypes.byref(proto), ctypes.byref(out), None, cb) == -1
    assert len(errors) == 1
    k, msg = errors[0]
    assert k.endswith(b"Error") and (not kind or k == kind)
    assert msg.startswith(b"managed_tensor_allocator: ") and words in msg
    assert stats()["live_exports"] == live


def test_current_work_stream_on_the_cpu_is_null():
    api = api_of(rivet.zeros((1,)))
    out = ctypes.c_void_p(123)
    assert STREAM(api.current_work_stream)(1, 0, ctypes.byref(out)) == 0
    assert out.value is None


# ---- real consumers ---------------------------------------------------------------------------


def test_tvm_ffi_imports_through_the_c_path():
    tvm_ffi = pytest.importorskip("tvm_ffi")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = rivet.from_dlpack(x)
    before = stats()
    y = tvm_ffi.from_dlpack(t)
    after = stats()
    assert after["managed_tensor_from_py_object_no_sync"] == before["managed_tensor_from_py_object_no_sync"] + 1
    assert after["live_exports"] == before["live_exports"] + 1
    assert tuple(y.shape) == (3, 4)
    back = torch.from_dlpack(y)
    assert back.data_ptr() == x.data_ptr()
    torch.testing.assert_close(back, x)
    del t, x
    gc.collect()
    torch.testing.assert_close(back, torch.arange(12, dtype=torch.float32).reshape(3, 4))
    del back, y
    gc.collect()
    assert stats()["live_exports"] == before["live_exports"]


def test_torch_from_dlpack_results():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = rivet.from_dlpack(x)
    y = torch.from_dlpack(t)
    assert y.data_ptr() == x.ctypes.data
    torch.testing.assert_close(y, torch.from_numpy(x))
    del t
    gc.collect()
    y[0, 0] = 5.0  # still rivet-owned (numpy's) memory, alive through the export
    assert x[0, 0] == 5.0
    # torch 2.15 ignores DLPack's read-only flag on import (numpy's own read-only exports
    # come out writable too); what rivet hands over carries it.
    ro = np.arange(3, dtype=np.float32)
    ro.flags.writeable = False
    cap = rivet.from_dlpack(ro).__dlpack__(max_version=(1, 0))
    m = ctypes.cast(_get_pointer(cap, b"dltensor_versioned"), MANAGED_P)
    assert m.contents.flags & READ_ONLY == READ_ONLY
