"""CUDA cross-process handles (docs/ipc.md "CUDA"): the handle format and
its validation, which run without a GPU. The gpu-marked two-process tests are written for a GPU
session and have not run yet. Every hostile field is a rivet.IPCError naming it
before the driver is touched; a well-formed handle where there is no CUDA is a
rivet.DeviceError saying so. The gpu-marked tests run only where rivet can use a CUDA device."""

import dataclasses
import pickle

import pytest

import rivet
from conftest import cuda_usable, gpu_present

MEM = bytes(range(64))
EV = bytes(range(64, 128))


def handle(**kw):
    fields = dict(
        kind="cuda_ipc", pid=1234, device=0, mem_handle=MEM, alloc_size=4096, offset=512,
        shape=(2, 3), strides=(3, 1), dtype="float32", event_handle=EV,
    )
    fields.update(kw)
    return rivet.ipc.CudaHandle(**fields)


# (fields changed, a piece of the message): each one field wrong, the rest well-formed.
HOSTILE = [
    (dict(kind="cpu_shm"), "field 'kind' is 'cpu_shm'"),
    (dict(kind=3), "field 'kind' must be a str, got int"),
    (dict(pid=0), "field 'pid' is 0"),
    (dict(pid=True), "field 'pid' must be an int, got bool"),
    (dict(device=-1), "field 'device' is -1; expected a CUDA device index"),
    (dict(device=2**31), "field 'device' is 2147483648"),
    (dict(device=10**40), "field 'device'"),
    (dict(device="0"), "field 'device' must be an int, got str"),
    (dict(mem_handle=MEM[:63]), "field 'mem_handle' has 63 bytes; a CUDA IPC handle has exactly 64"),
    (dict(mem_handle=MEM + b"\0"), "field 'mem_handle' has 65 bytes"),
    (dict(mem_handle=b""), "field 'mem_handle' has 0 bytes"),
    (dict(mem_handle=MEM.hex()[:-2]), "field 'mem_handle' is a str of 126 characters"),
    (dict(mem_handle="zz" * 64), "field 'mem_handle' is not hex text"),
    (dict(mem_handle="ab" * 10**6), "field 'mem_handle' is a str of 2000000 characters"),
    (dict(mem_handle=list(MEM)), "field 'mem_handle' must be bytes (or hex str)"),
    (dict(mem_handle=None), "field 'mem_handle' must be bytes (or hex str)"),
    (dict(event_handle=EV[:10]), "field 'event_handle' has 10 bytes"),
    (dict(event_handle=7), "field 'event_handle' must be bytes (or hex str)"),
    (dict(alloc_size=0), "field 'alloc_size' is 0"),
    (dict(alloc_size=-4096), "field 'alloc_size' is -4096"),
    (dict(alloc_size=2**63), "field 'alloc_size' is 9223372036854775808"),
    (dict(offset=-1), "field 'offset' is -1"),
    (dict(offset=2**64), "field 'offset'"),
    (dict(offset=4096 - 23), "reaches bytes [4073, 4097) but the CUDA allocation has 4096 bytes ('alloc_size')"),
    (dict(shape=(1000,), strides=(1,)), "reaches bytes [512, 4512)"),
    (dict(shape=(2, 3), strides=(-3, 1), offset=0), "reaches bytes [-12, 12)"),
    (dict(shape=(2,), strides=(2**62,)), "not a valid layout"),
    (dict(shape=(2, 3), strides=(1,)), "not a valid layout"),
    (dict(shape=(-1,), strides=(1,)), "not a valid layout"),
    (dict(shape=(2**64,), strides=(1,)), "does not fit in int64"),
    (dict(shape=(1,) * 65, strides=(1,) * 65), "65 dims"),
    (dict(shape=[1] * 10**6), "field 'shape' has 1000000 dims"),
    (dict(dtype="float128"), "field 'dtype'"),
]


@pytest.mark.parametrize("change,msg", HOSTILE, ids=[m[:40] for _, m in HOSTILE])
def test_a_hostile_cuda_handle_is_an_ipc_error_naming_the_field(change, msg):
    with pytest.raises(rivet.IPCError) as e:
        rivet.ipc.open(handle(**change))
    text = str(e.value)
    assert "invalid handle" in text and msg in text, text


def test_an_empty_view_may_sit_at_the_end_of_the_allocation():
    # Not an IPCError: the validation passes; what follows needs CUDA (DeviceError here).
    h = handle(shape=(0,), strides=(1,), offset=4096)
    with pytest.raises(rivet.DeviceError):
        rivet.ipc.open(h)


@pytest.mark.skipif(gpu_present(), reason="checks the no-CUDA path")
@pytest.mark.parametrize("mem", [MEM, bytearray(MEM), MEM.hex(), MEM.hex().upper()], ids=["bytes", "bytearray", "hex", "HEX"])
def test_a_well_formed_cuda_handle_without_cuda_is_a_device_error_saying_so(mem):
    with pytest.raises(rivet.DeviceError, match=r"rivet.ipc.open: cannot open a CUDA handle: CUDA is not available"):
        rivet.ipc.open(handle(mem_handle=mem, event_handle=None))


@pytest.mark.parametrize(
    "device,exc,msg",
    [
        ("cpu", rivet.DeviceError, "argument 'device' is 'cpu' but the handle is of CUDA memory (device 0)"),
        ("tpu:0", rivet.Error, "argument 'device'"),
        (1.5, rivet.ArgumentError, "argument 'device' must be None, a device str"),
        ([0], rivet.ArgumentError, "got list"),
    ],
)
def test_the_device_argument_is_checked_before_the_driver(device, exc, msg):
    with pytest.raises(exc) as e:
        rivet.ipc.open(handle(), device=device)
    assert msg in str(e.value)


def test_a_cpu_handle_with_a_non_str_device_is_an_argument_error():
    h = rivet.ipc.share(rivet.zeros([2], dtype="float32", shared=True))
    with pytest.raises(rivet.ArgumentError, match="argument 'device' must be None or 'cpu'"):
        rivet.ipc.open(h, device=0)


def test_a_cuda_handle_is_plain_picklable_data():
    h = handle()
    assert pickle.loads(pickle.dumps(h)) == h
    assert dataclasses.asdict(h)["mem_handle"] == MEM
    r = repr(h)
    assert "float32[2, 3]" in r and "offset=512 of 4096 bytes on cuda:0" in r and "pid=1234" in r


def test_open_names_both_handle_kinds_when_given_something_else():
    with pytest.raises(rivet.ArgumentError, match=r"rivet.ipc.Handle or rivet.ipc.CudaHandle, got dict"):
        rivet.ipc.open({"kind": "cuda_ipc"})


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_usable(), reason="needs a CUDA device rivet can use")
def test_a_device_index_past_the_devices_is_a_device_error():
    n = rivet.cuda_device_count()
    with pytest.raises(rivet.DeviceError, match=rf"handle's 'device' is CUDA device {n} but this process sees {n}"):
        rivet.ipc.open(handle(device=n))
    with pytest.raises(rivet.DeviceError, match=rf"argument 'device' is CUDA device {n} but this process sees {n}"):
        rivet.ipc.open(handle(), device=n)


def test_a_rivet_cuda_tensor_is_refused_by_share_saying_why():
    # rivet's CUDA memory is cuMemAllocAsync pool memory; the check needs no GPU (a stand-in
    # object with a CUDA device string would not be a rivet.Tensor, so this runs only with one).
    if not cuda_usable():
        pytest.skip("needs a rivet CUDA tensor")
    t = rivet.zeros([4], dtype="float32", device="cuda")
    with pytest.raises(rivet.IPCError, match="stream-ordered pool"):
        rivet.ipc.share(t)


# ---- two processes, one GPU (written for a GPU session; not yet run) -------------------------


def _cuda_receiver(h, q):
    import torch

    try:
        v = rivet.ipc.open(h)
        w = rivet.ipc.open(h)  # the per-process cache: CUDA refuses a second cuIpcOpenMemHandle
        tv = torch.from_dlpack(v)
        q.put(("read", tv.cpu().tolist()))
        tv.add_(1.0)  # ordered after the sender's writes by its event, on torch's stream
        torch.cuda.current_stream().synchronize()
        q.put(("same", torch.from_dlpack(w).data_ptr() == tv.data_ptr()))
    except Exception as e:  # the parent reports it
        q.put(("error", repr(e)))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU")
def test_a_torch_cuda_tensor_is_shared_and_the_receiver_writes_into_it():
    import multiprocessing as mp

    import torch

    big = torch.zeros(1024, device="cuda")  # caching allocator: a sub-allocation, offset > 0
    t = big[256:262]
    t.copy_(torch.arange(6.0, device="cuda"))  # the sender's write, before the event
    h = rivet.ipc.share(t)
    assert isinstance(h, rivet.ipc.CudaHandle) and h.offset >= 256 * 4 and h.event_handle is not None
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_cuda_receiver, args=(h, q))
    p.start()
    got = [q.get(timeout=120) for _ in range(2)]
    p.join(60)
    assert got[0] == ("read", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), got
    assert got[1] == ("same", True), got
    torch.cuda.synchronize()
    assert t.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU")
def test_opening_a_handle_in_the_process_that_made_it_is_an_ipc_error():
    import torch

    h = rivet.ipc.share(torch.ones(4, device="cuda"))
    with pytest.raises(rivet.IPCError, match="made by this process"):
        rivet.ipc.open(h)
