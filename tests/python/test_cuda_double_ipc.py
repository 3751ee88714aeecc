"""CUDA IPC through a driver only (the CUDA driver double in CI, a GPU when lent): device memory
from cuMemAlloc shared with ``rivet.ipc`` and opened by a SECOND process, which reads it, runs a
compiled rivet function on it and writes its result into a second shared allocation, which the
first process reads back; rivet's pool memory (cuMemAllocAsync) refused with rivet's clear
error; a handle opened in the process that made it refused.

CUDA cannot open a handle in the process that made it, so each case has two processes: this
one and a child (``python -c``, the environment passed through: LD_LIBRARY_PATH,
RIVET_CUBIN_SOURCES, RIVET_CUDA_DOUBLE, ...). Handles travel pickled, as hex lines on the
child's stdin / stdout. The module skips where rivet sees no driver.
"""

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import cuda_driver as cu
import rivet
from cuda_driver import no_driver_misuse  # noqa: F401 (autouse: the double's misuse reports fail a test)

pytestmark = pytest.mark.cuda
N_DEVICES = cu.require_cuda()
T = 120  # seconds a child may take at most


PRELUDE = r"""
import json, pickle, sys
import numpy as np
import cuda_driver as cu
import rivet
from rivet import te
cu.init()

def build_add():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=64)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    return rivet.build(s, [A, B, C], target="cuda", name="add")["add"]

def report(**kw):
    print(json.dumps(kw), flush=True)
"""

# Opens an input and an output handle, reads the input, writes input + input into the output
# with a compiled rivet function, and opens the input a second time (the per-process cache:
# CUDA refuses a second cuIpcOpenMemHandle of one handle).
RECEIVER = PRELUDE + r"""
h_in, h_out = pickle.loads(bytes.fromhex(sys.stdin.readline()))
try:
    x = rivet.ipc.open(h_in)
    x2 = rivet.ipc.open(h_in)
    out = rivet.ipc.open(h_out)
    seen = cu.download(x)
    add = build_add()
    add(x, x, out)
    r = add(x2, x2)  # an allocated output, from the second open
    alloc = cu.download(r)
    cu.ctx_synchronize(int(x.device.split(":")[1]))
    report(ok=True, device=x.device, shape=list(x.shape), same=x.data_ptr == x2.data_ptr,
           seen=seen.tolist(), alloc=alloc.tolist())
except Exception as e:
    report(ok=False, error=type(e).__name__, message=str(e))
"""


def run_receiver(h_in, h_out, **env):
    r = subprocess.run(
        [sys.executable, "-c", RECEIVER],
        input=pickle.dumps((h_in, h_out)).hex() + "\n",
        env=cu.child_env(**env),
        capture_output=True,
        text=True,
        timeout=T,
    )
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert cu.DOUBLE_MARK not in r.stderr, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ok"], got
    return got


def hand_made_handle(buf, shape, offset=0, event=True, dtype="float32"):
    """A rivet.ipc.CudaHandle of cuMemAlloc memory made with the driver alone (what
    rivet.ipc.share would give): the allocation base's IPC handle, the view, and an
    interprocess event recorded after the writes so far."""
    base, size = cu.address_range(buf.ptr, buf.device)
    assert base == buf.ptr
    ev = None
    if event:
        e = cu.Event(buf.device, cu.CU_EVENT_INTERPROCESS | cu.CU_EVENT_DISABLE_TIMING).record()
        cu.KEEP.append(e)  # alive while a receiver may open it
        ev = cu.ipc_event_handle(e)
    strides = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))
    return rivet.ipc.CudaHandle(
        kind="cuda_ipc", pid=os.getpid(), device=buf.device, mem_handle=cu.ipc_mem_handle(buf.ptr, buf.device),
        alloc_size=size, offset=offset, shape=tuple(shape), strides=strides, dtype=dtype, event_handle=ev,
    )


def fresh(rng, n):
    v = rng.integers(-64, 64, size=n) / 8.0
    v[v == 0] = 0.125
    return v.astype(np.float32)


@pytest.mark.parametrize("event", [True, False], ids=["event", "no-event"])
@pytest.mark.parametrize("n", [1, 17, 1023])
def test_a_hand_made_handle_of_cumemalloc_memory_opens_in_another_process(rng, n, event):
    a = fresh(rng, n)
    pad = 64  # the view starts 64 bytes into the allocation
    src = cu.DeviceBuffer(pad + a.nbytes)
    cu.htod(src.ptr + pad, a)
    out = cu.DeviceBuffer(a.nbytes + 16).fill(0xA5)
    cu.ctx_synchronize(0)
    got = run_receiver(hand_made_handle(src, (n,), offset=pad, event=event), hand_made_handle(out, (n,), event=event))
    assert got["device"] == "cuda:0" and got["shape"] == [n] and got["same"], got
    np.testing.assert_array_equal(np.array(got["seen"], np.float32), a)
    np.testing.assert_array_equal(np.array(got["alloc"], np.float32), a + a)
    # The receiver's writes, seen here once it has synchronized and gone.
    np.testing.assert_array_equal(out.read((n,), np.float32), a + a)
    assert (out.read((16,), np.uint8, offset=a.nbytes) == 0xA5).all(), "written past the view"
    np.testing.assert_array_equal(src.read((n,), np.float32, offset=pad), a)


def test_a_handle_on_the_second_device_opens_there(rng):
    if N_DEVICES < 2:
        pytest.skip("one CUDA device (the double: RIVET_CUDA_DOUBLE='devices=sm_90,sm_80')")
    a = fresh(rng, 97)
    src = cu.DeviceBuffer.from_array(a, device=1)
    out = cu.DeviceBuffer(a.nbytes, device=1).fill(0xA5)
    cu.ctx_synchronize(1)
    got = run_receiver(hand_made_handle(src, (97,)), hand_made_handle(out, (97,)))
    assert got["device"] == "cuda:1", got
    np.testing.assert_array_equal(np.array(got["alloc"], np.float32), a + a)
    np.testing.assert_array_equal(out.read((97,), np.float32), a + a)


def test_a_rivet_tensor_over_cumemalloc_memory_is_shared_with_rivet_ipc(rng):
    # A rivet tensor importing cuMemAlloc memory (a hand-made capsule, byte offset included)
    # is not pool memory: rivet.ipc.share gives a CudaHandle a second process opens.
    n, pad = 97, 128
    a = fresh(rng, n)
    src = cu.DeviceBuffer(pad + a.nbytes)
    cu.htod(src.ptr + pad, a)
    out = cu.DeviceBuffer(a.nbytes).fill(0xA5)
    x = rivet.from_dlpack(cu.capsule(src, (n,), "float32", byte_offset=pad)[0])
    y = rivet.from_dlpack(cu.capsule(out, (n,), "float32")[0])
    h_in, h_out = rivet.ipc.share(x), rivet.ipc.share(y)
    assert isinstance(h_in, rivet.ipc.CudaHandle), h_in
    assert (h_in.offset, h_in.shape, h_in.device, h_in.pid) == (pad, (n,), 0, os.getpid()), h_in
    assert h_in.alloc_size >= pad + a.nbytes
    got = run_receiver(h_in, h_out)
    np.testing.assert_array_equal(np.array(got["seen"], np.float32), a)
    np.testing.assert_array_equal(out.read((n,), np.float32), a + a)


SENDER_POOLS_OFF = PRELUDE + r"""
n = int(sys.argv[1])
t = rivet.zeros((n,), "float32", device="cuda")
pooled = cu.pointer_mempool(t.data_ptr)
data = (np.arange(n, dtype=np.float32) * 0.5 - 3.0).astype(np.float32)
cu.htod(t.data_ptr, data)
try:
    h = rivet.ipc.share(t)
except Exception as e:
    report(ok=False, pooled=bool(pooled), error=type(e).__name__, message=str(e))
    sys.exit(0)
report(ok=True, pooled=bool(pooled), handle=pickle.dumps(h).hex())
sys.stdin.readline()  # the other process has read and written
report(after=cu.download(t).tolist())
"""


def with_pools_off(value):
    """RIVET_CUDA_DOUBLE with pools=0 (the double's other settings kept)."""
    parts = [p for p in (value or "").split(";") if p and not p.strip().startswith("pools=")]
    return ";".join(parts + ["pools=0"])


def test_rivet_zeros_without_memory_pools_is_shared_and_opened_by_another_process():
    # Under the double with pools=0 rivet allocates with cuMemAlloc, which CUDA IPC can share:
    # a child allocates and shares, this process opens, reads, writes; the child sees it.
    if not cu.is_double():
        pytest.skip("pools=0 is a setting of the CUDA driver double")
    n = 97
    env = cu.child_env(RIVET_CUDA_DOUBLE=with_pools_off(os.environ.get("RIVET_CUDA_DOUBLE")))
    p = subprocess.Popen(
        [sys.executable, "-c", SENDER_POOLS_OFF, str(n)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = p.stdout.readline()
        if not line:  # the child died before reporting: show why
            _, err = p.communicate(timeout=T)
            raise AssertionError(f"the sharing child exited with {p.returncode}:\n{err}")
        first = json.loads(line)
        assert first.get("ok"), first
        assert not first["pooled"], "pools=0, yet rivet's allocation is pool memory"
        h = pickle.loads(bytes.fromhex(first["handle"]))
        assert isinstance(h, rivet.ipc.CudaHandle) and h.pid == p.pid
        v = rivet.ipc.open(h)
        data = (np.arange(n, dtype=np.float32) * 0.5 - 3.0).astype(np.float32)
        np.testing.assert_array_equal(cu.download(v), data)
        cu.htod(v.data_ptr, data * 2)
        cu.ctx_synchronize(0)
        del v
        p.stdin.write("go\n")
        p.stdin.flush()
        after = json.loads(p.stdout.readline())
        np.testing.assert_array_equal(np.array(after["after"], np.float32), data * 2)
        _, err = p.communicate(timeout=T)
        assert p.returncode == 0, err
        assert cu.DOUBLE_MARK not in err, err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_pool_memory_is_refused_with_a_clear_error():
    t = rivet.zeros((64,), "float32", device="cuda")
    if cu.pointer_mempool(t.data_ptr) is None:
        pytest.skip("rivet allocated without a memory pool here (the double's pools=0)")
    with pytest.raises(rivet.IPCError) as e:
        rivet.ipc.share(t)
    msg = str(e.value)
    assert "stream-ordered pool" in msg and "cuMemAllocAsync" in msg and "cuda:0" in msg, msg
    # A view of it (an import of its DLPack export) is the same pool memory: refused too.
    v = rivet.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    with pytest.raises(rivet.IPCError, match="stream-ordered pool"):
        rivet.ipc.share(v)


def test_a_handle_opened_in_the_process_that_made_it_is_an_ipc_error(rng):
    buf = cu.DeviceBuffer.from_array(fresh(rng, 17))
    with pytest.raises(rivet.IPCError, match="made by this process"):
        rivet.ipc.open(hand_made_handle(buf, (17,)))


def test_a_device_index_past_the_devices_is_a_device_error(rng):
    buf = cu.DeviceBuffer.from_array(fresh(rng, 4))
    h = hand_made_handle(buf, (4,), event=False)
    n = N_DEVICES
    with pytest.raises(rivet.DeviceError, match=rf"argument 'device' is CUDA device {n} but this process sees {n}"):
        rivet.ipc.open(h, device=n)
    import dataclasses

    with pytest.raises(rivet.DeviceError, match=rf"handle's 'device' is CUDA device {n} but this process sees {n}"):
        rivet.ipc.open(dataclasses.replace(h, device=n))
