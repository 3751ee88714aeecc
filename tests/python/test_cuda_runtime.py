"""The CUDA runtime: device tensors in and out, allocated outputs, rivet.empty / zeros on a
GPU, DLPack export of CUDA tensors, streams, ``__cuda_array_interface__``, mixed devices.

Two halves. Without a GPU (here and in CI) the tests use hand-made kDLCUDA capsules and
``__cuda_array_interface__`` dicts whose pointers are never dereferenced: device rules,
argument validation, and the no-driver errors (each a clear ``rivet.Error``, never a crash).
Tests that would touch device memory run only without a driver (a fake pointer must never
reach a real launch). The ``gpu`` tests need a device and skip elsewhere (conftest); they
compare every result with numpy / torch after a final synchronize, never in between.
"""

import ctypes

import numpy as np
import pytest

import rivet
from rivet import te

def _driver_missing():
    try:
        rivet.cuda_device_count()
    except rivet.DeviceError as e:
        return "cannot be loaded" in str(e)
    return False


NO_DRIVER = _driver_missing()
no_driver = pytest.mark.skipif(not NO_DRIVER, reason="a CUDA driver is present: fake device pointers must not reach it")


# ---- hand-made kDLCUDA capsules (ctypes mirrors of dlpack.h) --------------------------------


from dlpack_abi import (  # noqa: E402
    DELETER,
    DLDataType,
    DLDevice,
    DLManagedTensorVersioned,
    DLPackVersion,
    DLTensor,
    capsule_of,
)


# Producers live for the session: a tensor's deleter (a ctypes callback) may run at any drop.
_PRODUCERS = []
# A host buffer whose address stands in for device memory: never dereferenced here.
_FAKE = np.zeros(1 << 16, np.float32)


class CudaCapsule:
    """A versioned capsule claiming `shape` float32 elements on cuda:`device_id`."""

    def __init__(self, shape, device_id=0, device_type=2, offset_elems=0):
        _PRODUCERS.append(self)
        self.deleted = 0
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        t = DLTensor(
            data=_FAKE.ctypes.data + 4 * offset_elems,
            device=DLDevice(device_type, device_id),
            ndim=len(shape),
            dtype=DLDataType(2, 32, 1),
            shape=ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64)),
            strides=None,
            byte_offset=0,
        )

        def deleter(_p):
            self.deleted += 1

        self.deleter = DELETER(deleter)
        self.managed = DLManagedTensorVersioned(version=DLPackVersion(1, 0), deleter=self.deleter, dl_tensor=t)
        self.capsule = capsule_of(self.managed)


def cuda_tensor(shape, device_id=0, offset_elems=0):
    return rivet.from_dlpack(CudaCapsule(shape, device_id, offset_elems=offset_elems).capsule)


class CAI:
    """An object offering only ``__cuda_array_interface__`` (Numba's protocol), as a property
    of its type like every real producer's (rivet probes the type, once)."""

    def __init__(self, **fields):
        d = dict(version=3, shape=(4,), typestr="<f4", data=(_FAKE.ctypes.data, False), strides=None)
        d.update(fields)
        self._cai = d

    @property
    def __cuda_array_interface__(self):
        return self._cai


# ---- kernels with an explicit GPU schedule ---------------------------------------------------


def _bind(s, stage, axis, factor=128):
    bx, tx = s[stage].split(axis, factor=factor)
    s[stage].bind(bx, "blockIdx.x")
    s[stage].bind(tx, "threadIdx.x")


def build_add(target="cuda", name="add"):
    """C[i] = A[i] + B[i], n symbolic."""
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    s = rivet.create_schedule(C)
    _bind(s, C, C.op.axis[0])
    return rivet.build(s, [A, B, C], target=target, name=name)[name]


def _scale2d_schedule():
    m, n = te.var("m"), te.var("n")
    A = te.placeholder((m, n), "float32", name="A")
    C = te.compute((m, n), lambda i, j: A[i, j] * 3.0 + 1.0, name="C")
    s = rivet.create_schedule(C)
    fused = s[C].fuse(C.op.axis[0], C.op.axis[1])
    _bind(s, C, fused)
    return s, [A, C]


def build_scale2d(target="cuda", name="scale2d"):
    """C[i, j] = A[i, j] * 3 + 1 over a 2-d tensor (any strides), both axes fused, then
    split onto blocks and threads."""
    s, args = _scale2d_schedule()
    return rivet.build(s, args, target=target, name=name)[name]


@pytest.fixture(scope="module")
def add():
    return build_add()


@pytest.fixture(scope="module")
def scale2d():
    return build_scale2d()


# =============================================================================================
# Without a GPU: device rules, validation, no-driver errors
# =============================================================================================


def test_the_gpu_kernels_of_this_file_are_right_on_the_interpreter(rng):
    # The very schedules the gpu tests launch, run by the oracle with CUDA's semantics
    # (every block and thread), on ragged sizes and on strided / offset views.
    add_i, scale_i = build_add("interp"), build_scale2d("interp")
    for n in (1, 7, 129, 1000):
        a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        np.testing.assert_array_equal(add_i(a, b).numpy(), a + b)
    base = rng.standard_normal((9, 31)).astype(np.float32)
    for view in (base, base[:, ::3], base.T, base[2:, 5:], base[1:8:2, 1::4]):
        np.testing.assert_array_equal(scale_i(view).numpy(), view * np.float32(3.0) + np.float32(1.0))
    m_src = rivet.build(*_scale2d_schedule(), target="cuda", name="scale2d").get_source("cuda")
    assert "blockIdx.x" in m_src and "threadIdx.x" in m_src


def test_crafted_cuda_capsules_import_with_their_device_and_refuse_host_access():
    p = CudaCapsule((3, 4), device_id=1)
    t = rivet.from_dlpack(p.capsule)
    assert (t.device, t.shape, t.dtype) == ("cuda:1", (3, 4), "float32")
    assert t.__dlpack_device__() == (2, 1)
    with pytest.raises(rivet.DeviceError, match="needs a CPU tensor.*cuda:1"):
        t.numpy()
    del t
    assert p.deleted == 1


def test_a_negative_cuda_ordinal_is_refused_and_the_capsule_released():
    p = CudaCapsule((2,), device_id=-1)
    with pytest.raises(rivet.DLPackError, match="CUDA device -1: a device ordinal is >= 0"):
        rivet.from_dlpack(p.capsule)
    assert p.deleted == 1


def test_mixed_devices_name_the_arguments_and_their_devices(add):
    x0, y0, z1 = cuda_tensor((4,)), cuda_tensor((4,), offset_elems=8), cuda_tensor((4,), 1, 16)
    with pytest.raises(rivet.DeviceError) as e:
        add(x0, y0, z1)
    msg = str(e.value)
    assert "argument 0 ('A') is on cuda:0" in msg and "argument 2 ('C') is on cuda:1" in msg, msg
    host = np.zeros(4, np.float32)
    with pytest.raises(rivet.DeviceError) as e:
        add(x0, host, z1)
    msg = str(e.value)
    assert "argument 0 ('A') is on cuda:0" in msg and "argument 1 ('B') is on cpu" in msg, msg
    # Omitted outputs: the rule holds for the inputs alone.
    with pytest.raises(rivet.DeviceError, match=r"argument 1 \('B'\) is on cpu"):
        add(x0, host)


def test_a_cpu_function_called_with_cuda_tensors_stays_a_device_error():
    # Views of hand-made capsules live in variables: their deleters are Python callbacks,
    # which must not run while the call's exception is being raised.
    y, x = np.zeros(4, np.float32), cuda_tensor((4,))
    axpy = rivet.get_global_func("testing.axpy")
    with pytest.raises(rivet.DeviceError, match=r"argument 1 \('x'\) expected a CPU tensor, got one on cuda:0"):
        axpy(1.0, x, y)
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] + 1.0, name="C")
    f = rivet.build(rivet.create_schedule(C), [A, C], target="cpu", name="inc")["inc"]
    with pytest.raises(rivet.DeviceError, match=r"argument 0 \('A'\) expected a CPU tensor, got one on cuda:0"):
        f(x)
    assert (y == 0).all()


@no_driver
def test_calling_with_cuda_tensors_without_a_driver_says_what_is_missing(add):
    x, y, z = cuda_tensor((4,)), cuda_tensor((4,), offset_elems=8), cuda_tensor((4,), offset_elems=16)
    with pytest.raises(rivet.DeviceError, match=r"driver library \(libcuda\.so\.1\) cannot be loaded"):
        add(x, y, z)
    # An omitted output needs the driver to be allocated: same error, naming the output.
    with pytest.raises(rivet.DeviceError, match=r"output 'C'.*libcuda\.so\.1"):
        add(x, y)
    with pytest.raises(rivet.DeviceError, match="libcuda"):
        add(x, y, z, stream=7)


@no_driver
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
@pytest.mark.parametrize("make", [rivet.empty, rivet.zeros], ids=["empty", "zeros"])
def test_device_allocation_without_a_driver_is_a_device_error(make, device):
    with pytest.raises(rivet.DeviceError, match=r"libcuda\.so\.1\) cannot be loaded") as e:
        make((2, 3), "float32", device=device)
    assert make.__name__ in str(e.value)
    with pytest.raises(rivet.DeviceError, match="libcuda"):
        rivet.cuda_device_count()


@pytest.mark.parametrize("make", [rivet.empty, rivet.zeros], ids=["empty", "zeros"])
def test_allocation_arguments_are_checked(make):
    t = make((2, 3), "float64")
    assert (t.device, t.shape, t.dtype) == ("cpu", (2, 3), "float64")
    assert (t.numpy() == 0).all()  # rivet's CPU memory is always zeroed
    with pytest.raises(rivet.DeviceError, match="argument 'device': unknown device 'tpu'"):
        make((2,), device="tpu")
    with pytest.raises(rivet.DeviceError, match="cannot allocate on cuda_host"):
        make((2,), device="cuda_host")
    with pytest.raises(rivet.ArgumentError, match="'stream' must be None for device 'cpu'"):
        make((2,), device="cpu", stream=1)
    with pytest.raises(rivet.ArgumentError, match="argument 'stream' must be None, an int stream handle"):
        make((2,), device="cuda", stream="s")
    with pytest.raises(rivet.ArgumentError, match="argument 'stream' is -3"):
        make((2,), device="cuda", stream=-3)
    with pytest.raises(rivet.DTypeError):
        make((2,), "complex64", device="cuda")


class TorchLikeStream:
    def __init__(self, h):
        self.cuda_stream = h


class CupyLikeStream:
    def __init__(self, h):
        self.ptr = h


@pytest.mark.parametrize(
    "stream, err",
    [
        ("default", "must be None, an int stream handle, or a stream object"),
        (1.5, "got float"),
        (True, "got bool"),
        (object(), "got object"),
        (-1, "is -1: a stream handle is a CUstream"),
        (TorchLikeStream(-2), "is -2"),
        (CupyLikeStream(-7), "is -7"),
        (TorchLikeStream("x"), "with an int .cuda_stream"),
        (2**64, "does not fit in 64 bits"),
    ],
    ids=["str", "float", "bool", "object", "negative", "torch-negative", "cupy-negative", "non-int-attr", "huge"],
)
def test_a_bad_stream_argument_is_a_clear_error(stream, err, add):
    y = np.zeros(4, np.float32)
    axpy = rivet.get_global_func("testing.axpy")
    with pytest.raises(rivet.ArgumentError, match="testing.axpy: argument 'stream'") as e:
        axpy(1.0, np.ones(4, np.float32), y, stream=stream)
    assert err in str(e.value), str(e.value)
    assert (y == 0).all()
    a, b = cuda_tensor((4,)), cuda_tensor((4,), offset_elems=4)
    with pytest.raises(rivet.ArgumentError, match="add: argument 'stream'"):
        add(a, b, stream=stream)


@pytest.mark.parametrize("stream", [None, 0, 1, 2, 12345, TorchLikeStream(99), CupyLikeStream(98)])
def test_stream_handles_are_accepted_and_cpu_calls_run_unchanged(stream):
    # A CPU function has no stream to run on: the argument is checked, then unused.
    x, y = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    rivet.get_global_func("testing.axpy")(2.0, x, y, stream=stream)
    np.testing.assert_array_equal(y, 2 * np.arange(4, dtype=np.float32) + 1)


def test_dlpack_export_of_a_cuda_tensor_without_rivet_work_needs_no_driver():
    p = CudaCapsule((2, 3))
    t = rivet.from_dlpack(p.capsule)
    # No rivet work was queued on it (no stream recorded): nothing to order, on any stream.
    for stream in (None, -1, 1, 2, 0, 777):
        back = rivet.from_dlpack(t.__dlpack__(stream=stream, max_version=(1, 0)))
        assert (back.device, back.shape, back.data_ptr) == ("cuda:0", (2, 3), t.data_ptr)
        del back
    legacy = rivet.from_dlpack(t.__dlpack__())
    assert legacy.device == "cuda:0"
    del legacy
    with pytest.raises(rivet.DLPackError, match="'stream' must be None, -1 or a CUDA stream handle.*got x"):
        t.__dlpack__(stream="x")
    with pytest.raises(rivet.DLPackError, match="got -5"):
        t.__dlpack__(stream=-5)
    with pytest.raises(rivet.DeviceError, match="copy=True is not supported for a tensor on cuda:0"):
        t.__dlpack__(stream=None, copy=True)
    with pytest.raises(rivet.DLPackError, match=r"'dl_device' is \(1, 0\) but the tensor is on cuda:0"):
        t.__dlpack__(dl_device=(1, 0))
    del t
    assert p.deleted == 1


class CudaProducer:
    """A ``__dlpack__`` producer on cuda:0 that records the ``stream`` it is asked for."""

    def __init__(self, takes_max_version=True):
        self.streams = []
        self.takes_max_version = takes_max_version

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kw):
        if "max_version" in kw and not self.takes_max_version:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.streams.append(stream)
        return CudaCapsule((4,)).capsule


@no_driver  # fake stream handles (77, 5) must not reach a driver
@pytest.mark.parametrize("takes_max_version", [True, False], ids=["versioned", "pre-1.0"])
def test_the_generic_path_gives_cuda_producers_the_call_stream(takes_max_version):
    echo = rivet.get_global_func("testing.echo")  # takes anything: no device rule, no launch
    p = CudaProducer(takes_max_version)
    t = echo(p)
    assert t.device == "cuda:0" and p.streams == [1]  # the legacy default stream
    t2 = echo(p, stream=77)
    assert p.streams == [1, 77]
    t3 = rivet.from_dlpack(p)
    assert p.streams == [1, 77, 1]
    # A CPU producer that is not numpy is asked for its device, and gets no stream.
    class CpuProducer:
        def __init__(self):
            self.a = np.arange(3.0)

        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            assert kw.get("stream") is None, kw
            return self.a.__dlpack__()

    assert echo(CpuProducer()).numpy().tolist() == [0.0, 1.0, 2.0]
    # A call's results carry the completion event recorded where its work ran (none here: no
    # driver, so no work could be queued and nothing is recorded); exporting on any stream,
    # or asking for no ordering, then needs nothing from the driver.
    for stream in (77, -1, 5):
        rivet.from_dlpack(t2.__dlpack__(stream=stream, max_version=(1, 0)))
    for stream in (1, 0, None):
        rivet.from_dlpack(t.__dlpack__(stream=stream, max_version=(1, 0)))
        rivet.from_dlpack(t3.__dlpack__(stream=stream, max_version=(1, 0)))


def test_a_producer_whose_device_query_fails_is_a_dlpack_error():
    class Broken:
        def __dlpack_device__(self):
            raise RuntimeError("no device today")

        def __dlpack__(self, **kw):
            raise AssertionError("not reached")

    with pytest.raises(rivet.DLPackError, match="could not export it through DLPack: RuntimeError: no device today"):
        rivet.get_global_func("testing.echo")(Broken())


def test_cpu_tensors_still_refuse_a_stream():
    t = rivet.zeros((2,))
    with pytest.raises(rivet.DLPackError, match="'stream' must be None for a tensor on cpu"):
        t.__dlpack__(stream=1)


@pytest.mark.parametrize(
    "fields, cls, msg",
    [
        (dict(typestr=">f4"), rivet.DTypeError, "typestr '>f4' is not a dtype rivet supports"),
        (dict(typestr="<c8"), rivet.DTypeError, "typestr '<c8'"),
        (dict(version=1), rivet.DLPackError, "version 1 is not supported"),
        (dict(mask=object()), rivet.DLPackError, "has a mask"),
        (dict(strides=(6,)), rivet.DLPackError, "stride 6 bytes in dim 0 is not a multiple of the item size 4"),
        (dict(strides=(4, 4)), rivet.DLPackError, "has 2 strides for 1 dims"),
        (dict(stream=0), rivet.DLPackError, "stream is 0, which the protocol forbids"),
        (dict(stream=-4), rivet.DLPackError, "stream -4 is negative"),
        (dict(shape=None), rivet.DLPackError, "has no 'shape'"),
        (dict(data="x"), rivet.DLPackError, "'data' is malformed"),
        (dict(shape=(-2,)), rivet.ShapeError, "negative"),
    ],
    ids=["big-endian", "complex", "version", "mask", "stride", "nstrides", "stream0", "stream-neg", "no-shape", "data", "neg-shape"],
)
def test_a_malformed_cuda_array_interface_is_refused_before_the_driver(fields, cls, msg):
    with pytest.raises(cls) as e:
        rivet.from_dlpack(CAI(**fields))
    assert msg in str(e.value) and "__cuda_array_interface__" in str(e.value), str(e.value)


def test_a_cuda_array_interface_that_is_not_a_dict_is_refused():
    class Bad:
        @property
        def __cuda_array_interface__(self):
            return [1, 2]

    with pytest.raises(rivet.DLPackError, match="the interface is a list, not a dict"):
        rivet.from_dlpack(Bad())


@no_driver
def test_a_cuda_array_interface_needs_the_driver_for_its_device(add):
    with pytest.raises(rivet.DeviceError, match=r"finding the device of a CUDA pointer needs the CUDA driver.*libcuda\.so\.1"):
        rivet.from_dlpack(CAI(strides=(4,), stream=1))
    # The same inside a call: the argument is named.
    with pytest.raises(rivet.DeviceError, match=r"add: argument 0 \('A'\).*needs the CUDA driver"):
        add(CAI(), CAI())


def test_an_empty_cuda_array_interface_with_no_pointer_needs_no_driver():
    t = rivet.from_dlpack(CAI(shape=(0, 3), data=(0, True)))
    assert (t.device, t.shape, t.read_only) == ("cuda:0", (0, 3), True)


# =============================================================================================
# With a GPU (skipped elsewhere; never run on a GPU while this was written: see docs/cuda.md)
# =============================================================================================

N_BIG = 1 << 22


def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 56, 1000, 1023])
def test_allocated_outputs_come_back_as_torch_tensors(add, n):
    torch = torch_cuda()
    f = rivet.to_pytorch_func(add)
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    c = f(a, b)
    assert isinstance(c, torch.Tensor) and c.device == a.device and c.shape == (n,)
    torch.cuda.synchronize()
    assert torch.equal(c, a + b)
    # The generic path gives a rivet tensor on the same device, readable through DLPack.
    r = add(a, b)
    assert isinstance(r, rivet.Tensor) and r.device == "cuda:0"
    back = torch.from_dlpack(r)
    torch.cuda.synchronize()
    assert torch.equal(back, a + b)


@pytest.mark.gpu
def test_outputs_passed_in_are_written_in_place(add):
    torch = torch_cuda()
    a, b = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    c = torch.full((1000,), float("nan"), device="cuda")
    assert add(a, b, c) is None
    torch.cuda.synchronize()
    assert torch.equal(c, a + b)


@pytest.mark.gpu
def test_strided_and_offset_views(scale2d):
    torch = torch_cuda()
    f = rivet.to_pytorch_func(scale2d)
    base = torch.randn(64, 96, device="cuda")
    for view in (base[:, ::3], base.t(), base[5:, 7:], base[3:40:2, 1::5]):
        out = f(view)
        torch.cuda.synchronize()
        assert torch.equal(out, view * 3.0 + 1.0), view.stride()
    # Offset / strided outputs too.
    out_base = torch.zeros(64, 200, device="cuda")
    view = base[:, 1:65]
    dst = out_base[:, 10:74]
    scale2d(view, dst)
    torch.cuda.synchronize()
    assert torch.equal(dst, view * 3.0 + 1.0)
    assert (out_base[:, :10] == 0).all() and (out_base[:, 74:] == 0).all()


@pytest.mark.gpu
def test_stream_ordering_with_torch_work_before_and_after_on_a_non_default_stream(add):
    torch = torch_cuda()
    f = rivet.to_pytorch_func(add)
    s = torch.cuda.Stream()
    x = torch.randn(N_BIG, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        # Slow work queued first: the kernel must wait for it, on this stream, unsynchronised.
        a = x
        for _ in range(20):
            a = torch.sin(a) + 1.0
        b = a * 2.0
        c = f(a, b)  # launches on torch.cuda.current_stream() == s
        d = c * 0.5 - a  # queued after the kernel: must see its result
    torch.cuda.synchronize()
    ref = x
    for _ in range(20):
        ref = torch.sin(ref) + 1.0
    assert torch.equal(c, ref + ref * 2.0)
    assert torch.equal(d, (ref + ref * 2.0) * 0.5 - ref)


@pytest.mark.gpu
def test_an_explicit_stream_is_ordered_with_torch_current_stream(add):
    torch = torch_cuda()
    s_torch, s_rivet = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.randn(N_BIG, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s_torch):
        a = x
        for _ in range(20):
            a = torch.cos(a) * 1.5
        out = torch.empty_like(a)
        # rivet runs on its own stream: it waits for torch's (an event), and torch's later
        # work waits for it (another event); nothing synchronises.
        add(a, a, out, stream=s_rivet)
        after = out + 1.0
    torch.cuda.synchronize()
    ref = x
    for _ in range(20):
        ref = torch.cos(ref) * 1.5
    assert torch.equal(out, ref + ref)
    assert torch.equal(after, ref + ref + 1.0)
    # The handle as an int, and the stream object's own attribute, work the same.
    out2 = torch.empty_like(a)
    add(a, a, out2, stream=s_rivet.cuda_stream)
    torch.cuda.synchronize()
    assert torch.equal(out2, ref + ref)


@pytest.mark.gpu
def test_device_mismatch_with_real_tensors(add):
    torch = torch_cuda()
    a = torch.randn(8, device="cuda")
    with pytest.raises(rivet.DeviceError, match=r"argument 1 \('B'\) is on cpu"):
        add(a, torch.randn(8))
    with pytest.raises(rivet.DeviceError, match="built for 'cuda', called with tensors on cpu"):
        add(torch.randn(8), torch.randn(8))
    if torch.cuda.device_count() > 1:
        b = torch.randn(8, device="cuda:1")
        with pytest.raises(rivet.DeviceError, match=r"argument 0 \('A'\) is on cuda:0 but argument 1 \('B'\) is on cuda:1"):
            add(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("make", [rivet.empty, rivet.zeros], ids=["empty", "zeros"])
def test_empty_and_zeros_on_the_gpu_round_trip_through_dlpack(make):
    torch = torch_cuda()
    t = make((3, 5), "float32", device="cuda")
    assert (t.device, t.shape, t.strides) == ("cuda:0", (3, 5), (5, 1))
    tt = torch.from_dlpack(t)  # torch passes its current stream: it waits for the memset
    assert tt.device == torch.device("cuda:0") and tt.data_ptr() == t.data_ptr
    if make is rivet.zeros:
        assert (tt == 0).all()
    tt.fill_(2.5)
    back = rivet.from_dlpack(tt)
    assert back.data_ptr == t.data_ptr and back.device == "cuda:0"
    del t, back
    torch.cuda.synchronize()
    assert (tt == 2.5).all()  # torch's view keeps rivet's memory alive
    e = make((0, 4), "float64", device="cuda")
    assert torch.from_dlpack(e).shape == (0, 4)
    s = torch.cuda.Stream()
    z = rivet.zeros((1000,), device="cuda", stream=s)
    with torch.cuda.stream(s):
        assert (torch.from_dlpack(z) == 0).all()


@pytest.mark.gpu
def test_many_allocated_outputs_in_a_loop_stay_correct(add):
    torch = torch_cuda()
    f = rivet.to_pytorch_func(add)
    # Small integers: every sum below is exact, so the comparison can be too.
    a = torch.randint(-8, 8, (1 << 20,), device="cuda").float()
    total = torch.zeros_like(a)
    # 800 MB if nothing were freed: each output is freed by the reaper once the device has
    # drained the work queued before its drop, while the loop keeps queueing.
    for _ in range(200):
        total += f(a, a)
    torch.cuda.synchronize()
    assert torch.equal(total, a * 400.0)


@pytest.mark.gpu
def test_cuda_array_interface_producers(add):
    torch = torch_cuda()
    a, b = torch.randn(100, device="cuda"), torch.randn(100, device="cuda")

    class Only:
        def __init__(self, t):
            self.t = t

        @property
        def __cuda_array_interface__(self):
            return self.t.__cuda_array_interface__

    r = add(Only(a), Only(b))
    assert rivet.from_dlpack(Only(a)).data_ptr == a.data_ptr()
    torch.cuda.synchronize()
    assert torch.equal(torch.from_dlpack(r), a + b)
    view = a[10:70:3]
    t = rivet.from_dlpack(Only(view))
    assert (t.shape, t.strides, t.data_ptr) == ((20,), (3,), view.data_ptr())


@pytest.mark.gpu
def test_cupy_arrays_in_and_out(add):
    cp = pytest.importorskip("cupy")
    a = cp.arange(1000, dtype=cp.float32)
    b = cp.ones(1000, dtype=cp.float32)
    out = cp.empty_like(a)
    add(a, b, out)
    r = cp.from_dlpack(add(a, b))
    cp.cuda.runtime.deviceSynchronize()
    assert bool((out == a + b).all()) and bool((r == a + b).all())
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        c = a * 2
        add(c, b, out, stream=s)
    s.synchronize()
    assert bool((out == a * 2 + b).all())


@pytest.mark.gpu
def test_jax_arrays_in_and_out(add):
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU here (the suite pins JAX_PLATFORMS=cpu)")
    import jax.numpy as jnp

    a = jax.device_put(jnp.arange(1000, dtype=jnp.float32), gpu)
    b = jax.device_put(jnp.ones(1000, dtype=jnp.float32), gpu)
    r = rivet.to_jax_func(add)(a, b)
    np.testing.assert_array_equal(np.asarray(r), np.arange(1000, dtype=np.float32) + 1)
    with pytest.raises(rivet.ReadOnlyError):
        add(a, b, a)


@pytest.mark.gpu
def test_a_second_device_when_present(add):
    torch = torch_cuda()
    if torch.cuda.device_count() < 2:
        pytest.skip("one CUDA device")
    f = rivet.to_pytorch_func(add)
    a, b = torch.randn(1000, device="cuda:1"), torch.randn(1000, device="cuda:1")
    c = f(a, b)
    assert c.device == torch.device("cuda:1")
    z = rivet.zeros((4,), device="cuda:1")
    assert z.device == "cuda:1"
    torch.cuda.synchronize(1)
    assert torch.equal(c, a + b)


def test_the_gpu_half_is_collected_and_skipped_without_a_gpu(request):
    # Guard against the gpu tests silently never existing: they are here, marked, and skip
    # only where conftest says no usable GPU exists.
    items = [i for i in request.session.items if i.module is request.module and i.get_closest_marker("gpu")]
    assert len(items) >= 12
