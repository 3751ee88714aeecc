"""A small ctypes wrapper over the CUDA driver API (``libcuda.so.1``), for tests that need only
rivet and a driver: a real GPU, or the CUDA driver double (tests/cuda_double, found through
LD_LIBRARY_PATH). No torch, CuPy or JAX: under the double none of them has CUDA.

Every call checks its CUresult and raises CudaError with cuGetErrorName's text. The current
context is per thread (as in the real driver) and rivet makes its own contexts current on the
threads it calls from, so every helper here that needs a context makes the device's primary
context current itself (and puts back what was current before).

Device memory is never read from the host: data moves with cuMemcpyHtoD / cuMemcpyDtoH (or their
Async forms on a stream).

Also here, for the tests' producers and consumers of device memory:
  DeviceBuffer         -- a cuMemAlloc allocation with upload / download helpers
  capsule(...)         -- a hand-made kDLCUDA DLPack capsule (legacy or versioned ABI) over it,
                          with a deleter that counts its calls (Deleter)
  CAI                  -- an object offering only ``__cuda_array_interface__`` (v2 or v3)
  download(t, ...)     -- a compact rivet CUDA tensor's elements as a numpy array
  read_capsule(cap)    -- what a C consumer of a kDLCUDA capsule sees, then its deleter called
"""

import contextlib
import ctypes
import threading

import numpy as np

from dlpack_abi import (
    DELETER,
    DLDataType,
    DLDevice,
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLPackVersion,
    DLTensor,
    capsule_of,
)

CUDA_SUCCESS = 0
CU_STREAM_DEFAULT = 0
CU_STREAM_NON_BLOCKING = 1
CU_STREAM_LEGACY = 1  # the legacy default stream, as a handle
CU_EVENT_DEFAULT = 0
CU_EVENT_DISABLE_TIMING = 2
CU_EVENT_INTERPROCESS = 4
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1

# CUpointer_attribute
CU_POINTER_ATTRIBUTE_CONTEXT = 1
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17
# CUmemorytype
CU_MEMORYTYPE_HOST = 1
CU_MEMORYTYPE_DEVICE = 2

KDLCUDA = 2

CUdeviceptr = ctypes.c_uint64
_VP = ctypes.c_void_p
_P = ctypes.POINTER


class CudaError(RuntimeError):
    """A driver call that did not return CUDA_SUCCESS."""

    def __init__(self, func, code, name):
        super().__init__(f"{func} failed: {name} ({code})")
        self.func, self.code, self.name = func, code, name


class CUipcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


# name -> argtypes (every function returns CUresult, an int).
_SIGNATURES = {
    "cuInit": [ctypes.c_uint],
    "cuGetErrorName": [ctypes.c_int, _P(ctypes.c_char_p)],
    "cuDeviceGetCount": [_P(ctypes.c_int)],
    "cuDeviceGet": [_P(ctypes.c_int), ctypes.c_int],
    "cuDeviceGetAttribute": [_P(ctypes.c_int), ctypes.c_int, ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [_P(_VP), ctypes.c_int],
    "cuCtxGetCurrent": [_P(_VP)],
    "cuCtxSetCurrent": [_VP],
    "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [_P(CUdeviceptr), ctypes.c_size_t],
    "cuMemFree_v2": [CUdeviceptr],
    "cuMemcpyHtoD_v2": [CUdeviceptr, _VP, ctypes.c_size_t],
    "cuMemcpyDtoH_v2": [_VP, CUdeviceptr, ctypes.c_size_t],
    "cuMemcpyHtoDAsync_v2": [CUdeviceptr, _VP, ctypes.c_size_t, _VP],
    "cuMemcpyDtoHAsync_v2": [_VP, CUdeviceptr, ctypes.c_size_t, _VP],
    "cuMemsetD8_v2": [CUdeviceptr, ctypes.c_ubyte, ctypes.c_size_t],
    "cuMemsetD8Async": [CUdeviceptr, ctypes.c_ubyte, ctypes.c_size_t, _VP],
    "cuStreamCreate": [_P(_VP), ctypes.c_uint],
    "cuStreamDestroy_v2": [_VP],
    "cuStreamSynchronize": [_VP],
    "cuEventCreate": [_P(_VP), ctypes.c_uint],
    "cuEventRecord": [_VP, _VP],
    "cuStreamWaitEvent": [_VP, _VP, ctypes.c_uint],
    "cuEventSynchronize": [_VP],
    "cuEventDestroy_v2": [_VP],
    "cuPointerGetAttribute": [_VP, ctypes.c_int, CUdeviceptr],
    "cuMemGetAddressRange_v2": [_P(CUdeviceptr), _P(ctypes.c_size_t), CUdeviceptr],
    "cuIpcGetMemHandle": [_P(CUipcHandle), CUdeviceptr],
    "cuIpcGetEventHandle": [_P(CUipcHandle), _VP],
}

_lib = None
_funcs = {}
_lock = threading.Lock()
_primary = {}  # ordinal -> retained primary context (never released: the process's lifetime)


def lib():
    """The driver library, loaded once (``libcuda.so.1`` as the loader finds it)."""
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL("libcuda.so.1")
    return _lib


def _fn(name):
    f = _funcs.get(name)
    if f is None:
        f = getattr(lib(), name)  # AttributeError names a symbol this driver lacks
        f.restype = ctypes.c_int
        f.argtypes = _SIGNATURES[name]
        _funcs[name] = f
    return f


def error_name(code):
    s = ctypes.c_char_p()
    if _fn("cuGetErrorName")(code, ctypes.byref(s)) != CUDA_SUCCESS or not s.value:
        return f"unknown CUresult {code}"
    return s.value.decode()


def call(name, *args):
    """Calls driver function `name`; raises CudaError unless it returns CUDA_SUCCESS."""
    code = _fn(name)(*args)
    if code != CUDA_SUCCESS:
        raise CudaError(name, code, error_name(code))


# ---- devices and contexts ---------------------------------------------------------------------


def init():
    call("cuInit", 0)


def device_count():
    n = ctypes.c_int()
    call("cuDeviceGetCount", ctypes.byref(n))
    return n.value


def primary_context(ordinal=0):
    """The device's primary context (the one rivet, torch and JAX use), retained once."""
    with _lock:
        ctx = _primary.get(ordinal)
        if ctx is None:
            init()
            dev = ctypes.c_int()
            call("cuDeviceGet", ctypes.byref(dev), ordinal)
            c = _VP()
            call("cuDevicePrimaryCtxRetain", ctypes.byref(c), dev.value)
            ctx = _primary[ordinal] = c.value
        return ctx


def arch(ordinal=0):
    """The device's architecture as rivet spells it ("sm_90")."""
    init()
    dev = ctypes.c_int()
    call("cuDeviceGet", ctypes.byref(dev), ordinal)
    major, minor = ctypes.c_int(), ctypes.c_int()
    call("cuDeviceGetAttribute", ctypes.byref(major), 75, dev.value)  # COMPUTE_CAPABILITY_MAJOR
    call("cuDeviceGetAttribute", ctypes.byref(minor), 76, dev.value)  # COMPUTE_CAPABILITY_MINOR
    return f"sm_{major.value}{minor.value}"


def get_current():
    """The calling thread's current context (None when there is none)."""
    c = _VP()
    call("cuCtxGetCurrent", ctypes.byref(c))
    return c.value


def set_current(ctx):
    call("cuCtxSetCurrent", ctx)


@contextlib.contextmanager
def on(device=0):
    """Makes `device`'s primary context current on this thread for the block, then puts back
    the context that was current before."""
    ctx = primary_context(device)
    before = get_current()
    set_current(ctx)
    try:
        yield ctx
    finally:
        set_current(before)


def ctx_synchronize(device=0):
    with on(device):
        call("cuCtxSynchronize")


# ---- memory ---------------------------------------------------------------------------------


def alloc(nbytes, device=0):
    p = CUdeviceptr()
    with on(device):
        call("cuMemAlloc_v2", ctypes.byref(p), max(int(nbytes), 1))
    return p.value


def free(ptr, device=0):
    with on(device):
        call("cuMemFree_v2", ptr)


def _stream_handle(stream):
    if stream is None:
        return None
    return stream.handle if isinstance(stream, Stream) else int(stream)


def htod(ptr, array, device=0, stream=None):
    """Copies a numpy array's bytes to device memory at `ptr` (synchronous without `stream`;
    queued on `stream` with it: the array must then stay alive until the stream has run)."""
    a = np.ascontiguousarray(array)
    with on(device):
        if stream is None:
            call("cuMemcpyHtoD_v2", ptr, a.ctypes.data, a.nbytes)
        else:
            call("cuMemcpyHtoDAsync_v2", ptr, a.ctypes.data, a.nbytes, _stream_handle(stream))
    return a


def dtoh(ptr, shape, dtype, device=0, stream=None):
    """A numpy array of `shape` / `dtype` read from device memory at `ptr` (compact). Without
    `stream`: cuMemcpyDtoH (ordered after the legacy default stream's work); with it: queued on
    `stream`, which is then synchronized (so only that stream's ordering is relied on)."""
    out = np.empty(shape, dtype)
    with on(device):
        if stream is None:
            call("cuMemcpyDtoH_v2", out.ctypes.data, ptr, out.nbytes)
        else:
            h = _stream_handle(stream)
            call("cuMemcpyDtoHAsync_v2", out.ctypes.data, ptr, out.nbytes, h)
            call("cuStreamSynchronize", h)
    return out


def memset_d8(ptr, value, nbytes, device=0, stream=None):
    with on(device):
        if stream is None:
            call("cuMemsetD8_v2", ptr, value, nbytes)
        else:
            call("cuMemsetD8Async", ptr, value, nbytes, _stream_handle(stream))


def pointer_attribute(ptr, attr, ctype=ctypes.c_int):
    v = ctype()
    call("cuPointerGetAttribute", ctypes.byref(v), attr, ptr)
    return v.value


def pointer_device(ptr):
    return pointer_attribute(ptr, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)


def pointer_memory_type(ptr):
    return pointer_attribute(ptr, CU_POINTER_ATTRIBUTE_MEMORY_TYPE)


def pointer_mempool(ptr):
    """The memory pool of a pointer (None when it is not pool memory)."""
    return pointer_attribute(ptr, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, _VP)


def address_range(ptr, device=0):
    """(base, size) of the allocation holding `ptr`."""
    base, size = CUdeviceptr(), ctypes.c_size_t()
    with on(device):
        call("cuMemGetAddressRange_v2", ctypes.byref(base), ctypes.byref(size), ptr)
    return base.value, size.value


def ipc_mem_handle(ptr, device=0):
    """cuIpcGetMemHandle of an allocation's base: 64 bytes."""
    h = CUipcHandle()
    with on(device):
        call("cuIpcGetMemHandle", ctypes.byref(h), ptr)
    return bytes(ctypes.string_at(ctypes.addressof(h), 64))


def ipc_event_handle(event):
    h = CUipcHandle()
    with on(event.device):
        call("cuIpcGetEventHandle", ctypes.byref(h), event.handle)
    return bytes(ctypes.string_at(ctypes.addressof(h), 64))


# ---- streams and events ---------------------------------------------------------------------


class Stream:
    """A driver stream (non-blocking by default: no implicit ordering with the legacy default
    stream). ``int(s)`` / ``s.cuda_stream`` is its handle, as rivet's ``stream=`` takes it."""

    def __init__(self, device=0, non_blocking=True):
        self.device = device
        h = _VP()
        with on(device):
            call("cuStreamCreate", ctypes.byref(h), CU_STREAM_NON_BLOCKING if non_blocking else CU_STREAM_DEFAULT)
        self.handle = h.value

    @property
    def cuda_stream(self):
        return self.handle

    def __int__(self):
        return self.handle

    def synchronize(self):
        with on(self.device):
            call("cuStreamSynchronize", self.handle)

    def wait(self, event):
        with on(self.device):
            call("cuStreamWaitEvent", self.handle, event.handle, 0)

    def destroy(self):
        if self.handle is not None:
            with on(self.device):
                call("cuStreamDestroy_v2", self.handle)
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()


class Event:
    def __init__(self, device=0, flags=CU_EVENT_DISABLE_TIMING):
        self.device = device
        h = _VP()
        with on(device):
            call("cuEventCreate", ctypes.byref(h), flags)
        self.handle = h.value

    def record(self, stream=None):
        """Records on `stream` (None: the legacy default stream)."""
        with on(self.device):
            call("cuEventRecord", self.handle, CU_STREAM_LEGACY if stream is None else _stream_handle(stream))
        return self

    def synchronize(self):
        with on(self.device):
            call("cuEventSynchronize", self.handle)

    def destroy(self):
        if self.handle is not None:
            with on(self.device):
                call("cuEventDestroy_v2", self.handle)
            self.handle = None


def stream_wait_event(stream, event):
    with on(event.device):
        call("cuStreamWaitEvent", _stream_handle(stream), event.handle, 0)


# ---- dtypes ---------------------------------------------------------------------------------

# rivet dtype -> (numpy dtype holding its bits, DLPack code, bits)
DTYPES = {
    "bool": (np.bool_, 6, 8),
    "int8": (np.int8, 0, 8),
    "int16": (np.int16, 0, 16),
    "int32": (np.int32, 0, 32),
    "int64": (np.int64, 0, 64),
    "uint8": (np.uint8, 1, 8),
    "uint16": (np.uint16, 1, 16),
    "uint32": (np.uint32, 1, 32),
    "uint64": (np.uint64, 1, 64),
    "float16": (np.float16, 2, 16),
    "float32": (np.float32, 2, 32),
    "float64": (np.float64, 2, 64),
    "bfloat16": (np.uint16, 4, 16),  # bit patterns
}


def np_dtype(dtype):
    return np.dtype(DTYPES[str(dtype)][0])


def download(t, stream=None):
    """A compact rivet CUDA tensor's elements as a numpy array (bfloat16 as uint16 bits)."""
    dev = int(str(t.device).split(":")[1])
    shape = tuple(t.shape)
    dt = np_dtype(t.dtype)
    if 0 in shape:
        return np.empty(shape, dt)
    want = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))
    assert all(d <= 1 or s == w for d, s, w in zip(shape, t.strides, want)), (shape, t.strides)
    return dtoh(t.data_ptr, shape, dt, device=dev, stream=stream)


# ---- device buffers and their producers -----------------------------------------------------

# Every producer (its ctypes deleter callback, shape arrays, buffers) lives for the session: a
# consumer may call a deleter at any later drop, and a freed callback would be a crash.
KEEP = []


class DeviceBuffer:
    """A cuMemAlloc allocation of `nbytes` on `device` (freed by free() or the last deleter)."""

    def __init__(self, nbytes, device=0):
        self.device, self.nbytes = device, int(nbytes)
        self.ptr = alloc(self.nbytes, device)
        self.freed = False
        KEEP.append(self)

    @classmethod
    def from_array(cls, array, device=0, pad=0):
        """A buffer holding `array`'s bytes (compact), with `pad` spare bytes after them."""
        a = np.ascontiguousarray(array)
        b = cls(a.nbytes + pad, device)
        if a.nbytes:
            htod(b.ptr, a, device)
        return b

    def fill(self, byte):
        memset_d8(self.ptr, byte, self.nbytes, self.device)
        return self

    def read(self, shape, dtype, offset=0, stream=None):
        return dtoh(self.ptr + offset, shape, np_dtype(dtype) if isinstance(dtype, str) else dtype, self.device, stream)

    def free(self):
        if not self.freed:
            self.freed = True
            free(self.ptr, self.device)


class Deleter:
    """A DLPack deleter as a ctypes callback: counts its calls, notes the thread and the
    context current on it, and (free=True) frees the buffer the way a producer would: on the
    buffer's own context, putting back the caller's current context."""

    def __init__(self, buf=None, free=False):
        self.buf, self.free_buffer = buf, free
        self.calls = 0
        self.threads, self.contexts, self.errors = [], [], []
        self.callback = None  # set by capsule()

    def __call__(self, _managed):
        self.calls += 1
        self.threads.append(threading.get_ident())
        try:
            self.contexts.append(get_current())
            if self.free_buffer and self.buf is not None:
                self.buf.free()
        except Exception as e:  # reported by the test, never raised into C
            self.errors.append(repr(e))


DLPACK_FLAG_READ_ONLY = 1

_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_set_name = ctypes.pythonapi.PyCapsule_SetName
_capsule_set_name.restype = ctypes.c_int
_capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


def capsule(buf, shape, dtype, strides=None, byte_offset=0, versioned=True, deleter=None, read_only=False, device_id=None):
    """A kDLCUDA capsule over `buf` (hand-made, as a C producer builds one). `strides` in
    elements (None: compact). `deleter`: a Deleter (a fresh one if None); returns (capsule,
    deleter). The capsule has no destructor: every test hands it to a consumer."""
    deleter = deleter or Deleter(buf)
    deleter.callback = DELETER(deleter)
    _, code, bits = DTYPES[dtype]
    shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    strides_arr = None
    if strides is not None:
        strides_arr = (ctypes.c_int64 * max(len(strides), 1))(*strides)
    t = DLTensor(
        data=buf.ptr,
        device=DLDevice(KDLCUDA, buf.device if device_id is None else device_id),
        ndim=len(shape),
        dtype=DLDataType(code, bits, 1),
        shape=ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64)),
        strides=None if strides_arr is None else ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64)),
        byte_offset=byte_offset,
    )
    if versioned:
        managed = DLManagedTensorVersioned(
            version=DLPackVersion(1, 0),
            deleter=deleter.callback,
            flags=DLPACK_FLAG_READ_ONLY if read_only else 0,
            dl_tensor=t,
        )
        name = b"dltensor_versioned"
    else:
        assert not read_only, "the legacy ABI has no read-only flag"
        managed = DLManagedTensor(dl_tensor=t, deleter=deleter.callback)
        name = b"dltensor"
    KEEP.append((deleter, shape_arr, strides_arr, managed))
    return capsule_of(managed, name), deleter


class Producer:
    """A ``__dlpack__`` producer of device memory that works on its own stream: asked for
    ``stream=s``, it makes `s` wait for its stream (an event), as the protocol says, and notes
    what it was asked."""

    def __init__(self, buf, shape, dtype, work_stream=None, versioned=True):
        self.buf, self.shape, self.dtype = buf, shape, dtype
        self.work_stream, self.versioned = work_stream, versioned
        self.asked = []
        self.deleters = []

    def __dlpack_device__(self):
        return (KDLCUDA, self.buf.device)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.asked.append(stream)
        if self.work_stream is not None and stream is not None and stream != -1:
            ev = Event(self.buf.device).record(self.work_stream)
            stream_wait_event(stream, ev)
            ev.destroy()
        cap, d = capsule(self.buf, self.shape, self.dtype, versioned=self.versioned and max_version is not None)
        self.deleters.append(d)
        return cap


class CAI:
    """An object offering only ``__cuda_array_interface__`` (a property of its type, as every
    real producer defines it). `version` 2 has no stream; 3 may name one."""

    def __init__(self, buf, shape, dtype, strides=None, byte_offset=0, version=3, stream=None, read_only=False):
        typestr = np_dtype(dtype).str
        if dtype == "bfloat16":
            raise ValueError("__cuda_array_interface__ has no bfloat16")
        d = dict(
            version=version,
            shape=tuple(shape),
            typestr=typestr,
            data=(buf.ptr + byte_offset, read_only),
            strides=None if strides is None else tuple(s * np_dtype(dtype).itemsize for s in strides),
        )
        if version >= 3:
            d["stream"] = None if stream is None else _stream_handle(stream)
        self.buf, self._cai = buf, d

    @property
    def __cuda_array_interface__(self):
        return self._cai


def read_capsule(cap, stream=None):
    """Plays a C consumer of a kDLCUDA capsule (legacy or versioned): reads the tensor it
    describes (compact or strided) from the device, on `stream` when given, then marks the
    capsule used and calls its deleter exactly once. Returns (numpy array, device id, flags)."""
    name = _capsule_name(cap)
    ptr = _capsule_get(cap, name)
    if name == b"dltensor_versioned":
        m = DLManagedTensorVersioned.from_address(ptr)
        t, flags = m.dl_tensor, m.flags
        used = b"used_dltensor_versioned"
    else:
        assert name == b"dltensor", name
        m = DLManagedTensor.from_address(ptr)
        t, flags = m.dl_tensor, None
        used = b"used_dltensor"
    assert t.device.device_type == KDLCUDA, t.device.device_type
    dev = t.device.device_id
    shape = tuple(t.shape[i] for i in range(t.ndim))
    code_bits = (t.dtype.code, t.dtype.bits)
    dt = next(np.dtype(v[0]) for k, v in DTYPES.items() if (v[1], v[2]) == code_bits)
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    n = int(np.prod(shape, dtype=np.int64))
    base = t.data + t.byte_offset
    if n == 0:
        out = np.empty(shape, dt)
    elif strides is None or strides == tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape))):
        out = dtoh(base, shape, dt, device=dev, stream=stream)
    else:
        # The span the view touches (non-negative strides), read whole, then viewed.
        span = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
        flat = dtoh(base, (span,), dt, device=dev, stream=stream)
        out = np.lib.stride_tricks.as_strided(flat, shape, tuple(s * dt.itemsize for s in strides)).copy()
    _capsule_set_name(cap, used)
    if m.deleter:  # DLPack allows a NULL deleter
        m.deleter(ptr)
    return out, dev, flags


# ---- for the test modules -------------------------------------------------------------------


def require_cuda():
    """At a test module's top: skips the whole module, saying why, unless rivet sees a CUDA
    driver with a device (the double through LD_LIBRARY_PATH, or a GPU). Returns the count."""
    import pytest

    import rivet

    try:
        n = rivet.cuda_device_count()
    except Exception as e:  # rivet.DeviceError without a driver
        pytest.skip(f"no CUDA driver rivet can use: {e}", allow_module_level=True)
    if n < 1:
        pytest.skip("the CUDA driver reports no device", allow_module_level=True)
    init()
    return n


def is_double():
    """Whether the loaded driver is rivet's CUDA driver double: the file this process maps as
    libcuda.so.1 holds the double's message prefix."""
    try:
        lib()
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcuda.so" in line and "/" in line}
        for path in paths:
            with open(path, "rb") as g:
                if DOUBLE_MARK.encode() in g.read():
                    return True
    except OSError:
        pass
    return False


DOUBLE_MARK = "rivet-cuda-double:"


def _make_misuse_fixture():
    import pytest

    @pytest.fixture(autouse=True)
    def no_driver_misuse(capfd):
        """Fails a test during which the driver double reported a misuse on stderr (a wrong
        context, a freed pointer, a host read of device memory...): rivet must never misuse the
        driver, even where the result happens to be right. What was captured is passed on."""
        yield
        out, err = capfd.readouterr()
        import sys

        sys.stdout.write(out)
        sys.stderr.write(err)
        bad = [line for line in err.splitlines() if DOUBLE_MARK in line]
        assert not bad, "the CUDA driver double reported misuse:\n" + "\n".join(bad)

    return no_driver_misuse


no_driver_misuse = _make_misuse_fixture()


def child_env(**extra):
    """The environment for a child process: this one's (LD_LIBRARY_PATH, RIVET_CUBIN_SOURCES,
    RIVET_CUDA_DOUBLE, RIVET_NVRTC_PATH...), with tests/python on PYTHONPATH so the child
    can import cuda_driver; `extra` entries set (None: removed)."""
    import os

    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env
