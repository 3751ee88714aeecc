"""Cross-process tensors on the CPU (docs/ipc.md): rivet.ipc handles and rivet
tensors through multiprocessing share memory (proved by writing on one side and reading on the
other, in spawned processes), torch tensors after share_memory_() are shared without a copy,
memory is released when the last process lets go (also when a receiver is SIGKILLed), and
stale, foreign or hostile handles are rivet.IPCErrors, never a read of other memory.

The bodies of the spawned processes are in ipc_children.py."""

import dataclasses
import gc
import multiprocessing as mp
import os
import pickle
import re
import reprlib
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

import ipc_children as kids
import rivet

T = 60
CTX = mp.get_context("spawn")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "bindings", "examples", "ipc_trainer.py")


def _get(q):
    return q.get(timeout=T)


def _join(p):
    p.join(T)
    if p.is_alive():
        p.kill()
        p.join()
        pytest.fail(f"child {p.name} hung")
    return p.exitcode


def holders(handle):
    """Pids of the processes that map or hold an fd of the handle's segment file."""
    dev, ino = handle.st_dev, handle.st_ino
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 5 and parts[4] == str(ino):
                        major, minor = (int(x, 16) for x in parts[3].split(":"))
                        if os.makedev(major, minor) == dev:
                            found.add(int(pid))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == (dev, ino):
                    found.add(int(pid))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def memfds_of_self():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:rivet-tensor"):
                n += 1
        except OSError:
            pass
    return n


def dev_shm():
    return set(os.listdir("/dev/shm"))


def new_shm_entries(before, pids):
    """/dev/shm entries made since `before` that name one of `pids` (torch names its files
    torch_<pid>_...) or rivet: what these tests could have left behind."""
    marks = {str(p) for p in pids} | {"rivet"}
    return sorted(e for e in dev_shm() - before if any(m in e for m in marks))


def shared_random(rng, shape, dtype="float32"):
    t = rivet.zeros(shape, dtype, shared=True)
    t.numpy()[...] = rng.standard_normal(shape).astype(dtype)
    return t


# ---- in one process ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "uint8", "float16", "bool"])
def test_share_and_open_views_in_process(rng, dtype):
    t = rivet.zeros((6, 10), dtype, shared=True)
    a = t.numpy()
    a[...] = (rng.standard_normal((6, 10)) * 50).astype(dtype)
    assert t.is_shared and not rivet.zeros((6, 10), dtype).is_shared
    # Views of every kind, as rivet tensors and as numpy views of the same memory.
    for view in [a, a[1:, 2:], a.T, a[::-1, ::3], a[2], a[3, 4:5], a[:0]]:
        h = rivet.ipc.share(view)
        assert (h.kind, h.device, h.pid, h.dtype) == ("cpu_shm", "cpu", os.getpid(), dtype)
        o = rivet.ipc.open(h)
        assert o.is_shared
        np.testing.assert_array_equal(o.numpy(), view)
        if view.size:
            # The local mapping is reused: the very same memory.
            assert o.data_ptr == view.__array_interface__["data"][0]
    h = rivet.ipc.share(t)
    assert pickle.loads(pickle.dumps(h)) == h
    assert "rivet.ipc.Handle(" in repr(h) and f"st_ino={h.st_ino}" in repr(h)


def test_read_only_views_stay_read_only(rng):
    t = shared_random(rng, (5,))
    a = t.numpy()
    a.flags.writeable = False
    h = rivet.ipc.share(a)
    assert h.read_only
    o = rivet.ipc.open(h)
    assert o.read_only
    with pytest.raises(rivet.ReadOnlyError):
        rivet.get_global_func("testing.axpy")(1.0, o, o)


def test_memory_not_shared_is_an_error_that_says_how_or_a_copy(rng):
    x = rng.standard_normal((3, 4))
    with pytest.raises(rivet.IPCError, match=r"numpy\.ndarray.*not in shared memory.*shared=True.*share_memory_\(\).*copy=True"):
        rivet.ipc.share(x)
    h = rivet.ipc.share(x, copy=True)
    np.testing.assert_array_equal(rivet.ipc.open(h).numpy(), x)
    # The copy lives as long as the handle (a copy, not the array).
    o = rivet.ipc.open(h)
    o.numpy()[0, 0] = 1e9
    assert x[0, 0] != 1e9
    with pytest.raises(rivet.IPCError, match="not in shared memory"):
        rivet.ipc.share(rivet.zeros((2,)))
    with pytest.raises(rivet.ArgumentError, match=r"argument 0 \('tensor'\).*list"):
        rivet.ipc.share([1.0, 2.0])
    with pytest.raises(rivet.ArgumentError, match="'copy' must be a bool"):
        rivet.ipc.share(x, copy="yes")
    with pytest.raises(rivet.ArgumentError, match=r"argument 0 \('handle'\).*dict"):
        rivet.ipc.open(dataclasses.asdict(h))


def test_shared_allocation_errors():
    with pytest.raises(rivet.DeviceError, match="shared=True.*cuda"):
        rivet.zeros((4,), device="cuda", shared=True)
    with pytest.raises(rivet.MemoryError, match="more than this machine's memory"):
        rivet.empty((1 << 40,), "float32", shared=True)
    with pytest.raises(rivet.ShapeError):
        rivet.zeros((-1,), shared=True)
    e = rivet.empty((0, 3), shared=True)
    assert e.shape == (0, 3) and e.is_shared
    assert rivet.ipc.open(rivet.ipc.share(e)).shape == (0, 3)


def test_segments_are_released_with_the_last_view(rng):
    base_live, base_fds = rivet._native._ipc_live_segments(), memfds_of_self()
    t = shared_random(rng, (1000,))
    h = rivet.ipc.share(t)
    views = [rivet.ipc.open(h), t.numpy()[10:], rivet.from_dlpack(t)]
    assert rivet._native._ipc_live_segments() == base_live + 1
    assert holders(h) == {os.getpid()}
    del t
    gc.collect()
    assert holders(h) == {os.getpid()}  # the views keep it
    views.clear()
    gc.collect()
    assert rivet._native._ipc_live_segments() == base_live
    assert memfds_of_self() == base_fds
    assert holders(h) == set()
    with pytest.raises(rivet.IPCError, match="closed the memory|another file now"):
        rivet.ipc.open(h)


def test_pickle_is_by_value(rng):
    t = shared_random(rng, (4, 6), "float64")
    view = rivet.from_dlpack(t.numpy()[1:, ::2])
    for x in [t, view, rivet.from_dlpack(rng.standard_normal((2, 3)).astype(np.float32))]:
        b = pickle.loads(pickle.dumps(x))
        assert not b.is_shared and b.shape == x.shape and b.dtype == x.dtype
        np.testing.assert_array_equal(b.numpy(), x.numpy())
    torch = pytest.importorskip("torch")
    bf = torch.randn(3, 5).to(torch.bfloat16)
    b = pickle.loads(pickle.dumps(rivet.from_dlpack(bf)))
    assert torch.equal(torch.from_dlpack(b), bf)
    ro = rivet.from_dlpack(np.ones(3))
    assert pickle.loads(pickle.dumps(ro.numpy())).sum() == 3


# ---- hostile handles ------------------------------------------------------------------------


BAD_FIELDS = [
    ("offset", 1 << 62),
    ("offset", -1),
    ("offset", -(1 << 63)),
    ("offset", 1 << 64),
    ("offset", 1.5),
    ("size", -1),
    ("size", 1 << 62),
    ("size", -(1 << 63)),
    ("pid", -1),
    ("pid", 0),
    ("pid", 1 << 31),
    ("pid", "1"),
    ("pid", True),
    ("fd", -1),
    ("fd", 1 << 40),
    ("fd", None),
    ("st_dev", -1),
    ("st_ino", 1 << 64),
    ("dtype", "float33"),
    ("dtype", 3),
    ("kind", "cuda_ipc"),
    ("device", "cuda:0"),
    ("shape", None),
    ("shape", "abc"),
    ("shape", (1 << 62,)),
    ("shape", (-1,)),
    ("shape", (1,) * 100),
    ("strides", [0] * 1_000_000),
    ("strides", (1 << 62,)),
    ("strides", (-(1 << 63),)),
    ("strides", (1, 1)),
    ("read_only", "yes"),
]


@pytest.mark.parametrize("field,value", BAD_FIELDS, ids=[f"{f}={reprlib.repr(v)}" for f, v in BAD_FIELDS])
def test_hostile_handle_fields_are_ipc_errors(rng, field, value):
    t = shared_random(rng, (64,))
    h = rivet.ipc.share(t)
    bad = dataclasses.replace(h, **{field: value})
    with pytest.raises(rivet.IPCError) as e:
        rivet.ipc.open(bad)
    assert isinstance(e.value, OSError)
    assert f"'{field}'" in str(e.value), str(e.value)  # names the field at fault
    np.testing.assert_array_equal(rivet.ipc.open(h).numpy(), t.numpy())  # the real one still works


def test_views_past_the_segment_are_refused(rng):
    t = shared_random(rng, (64,))
    h = rivet.ipc.share(t)
    for fields in [
        dict(shape=(65,)),
        dict(offset=4, shape=(64,)),
        dict(offset=256),  # one past the end, non-empty
        dict(strides=(-1,)),  # reaches below byte 0
        dict(shape=(2,), strides=(1 << 60,)),
        dict(dtype="float64"),  # 64 float64 are 512 bytes
        dict(offset=257, shape=(0,)),
    ]:
        with pytest.raises(rivet.IPCError, match=r"reaches bytes|not a valid layout") as e:
            rivet.ipc.open(dataclasses.replace(h, **fields))
        assert "segment has 256 bytes" in str(e.value) or "layout" in str(e.value)
    # A size that is not the file's is refused by the identity check of what is opened.
    other = dataclasses.replace(h, st_ino=h.st_ino + 10_000, size=h.size)
    with pytest.raises(rivet.IPCError, match=rf"fd {h.fd} of process {os.getpid()} is another file now"):
        rivet.ipc.open(other)
    with pytest.raises(rivet.IPCError, match=r"has 256 bytes but the handle's 'size' is 512"):
        rivet.ipc.open(dataclasses.replace(h, size=512))


def test_foreign_pid_and_fd_are_refused(rng):
    t = shared_random(rng, (16,))
    h = rivet.ipc.share(t)
    # Not mapped here (another identity), so rivet must go through /proc: every outcome is an error.
    for pid, fd in [(1, h.fd), (os.getpid(), 0), (os.getpid(), 1 << 20), ((1 << 31) - 1, h.fd)]:
        bad = dataclasses.replace(h, pid=pid, fd=fd, st_ino=h.st_ino + 12345)
        with pytest.raises(rivet.IPCError, match=rf"(fd {fd} of process {pid})|(process {pid} is gone)"):
            rivet.ipc.open(bad)


def test_a_reused_fd_number_is_refused_in_process(rng):
    t = rivet.zeros((256,), shared=True)
    h = rivet.ipc.share(t)
    del t
    gc.collect()
    other = os.memfd_create("not-rivet", os.MFD_CLOEXEC)
    try:
        os.ftruncate(other, h.size)
        if other != h.fd:
            os.dup2(other, h.fd)
        with pytest.raises(rivet.IPCError, match=rf"fd {h.fd} of process {os.getpid()} is another file now"):
            rivet.ipc.open(h)
    finally:
        os.close(other)
        if other != h.fd:
            os.close(h.fd)


def test_open_device_argument(rng):
    t = shared_random(rng, (3,))
    h = rivet.ipc.share(t)
    assert rivet.ipc.open(h, device="cpu").device == "cpu"
    with pytest.raises(rivet.DeviceError, match="'device' is 'cuda:0'.*CPU memory"):
        rivet.ipc.open(h, device="cuda:0")


# ---- across processes -------------------------------------------------------------------------


def test_receiver_runs_a_kernel_in_place_and_the_sender_sees_it(rng, h):
    a, b = shared_random(rng, (1000,)), shared_random(rng, (1000,))
    w = rivet.zeros((1000,), shared=True)
    w.numpy()[:] = np.nan  # poison
    out = CTX.Queue()
    p = CTX.Process(target=kids.kernel_in_place, args=(rivet.ipc.share(a), rivet.ipc.share(b), rivet.ipc.share(w), out))
    p.start()
    assert _get(out) == "written"
    assert _join(p) == 0
    h.assert_matches(w.numpy(), a.numpy() * np.float32(2) + b.numpy(), op="exact")


def test_a_child_opens_a_handle_and_the_values_match(rng):
    t = shared_random(rng, (32, 17), "float64")
    v = t.numpy()[3:, ::-2]
    out = CTX.Queue()
    p = CTX.Process(target=kids.open_and_report, args=(rivet.ipc.share(v), out))
    p.start()
    status, got, shared = _get(out)
    assert _join(p) == 0
    assert status == "ok" and shared
    np.testing.assert_array_equal(got, v)


@pytest.mark.parametrize("transport", ["queue", "pipe", "spawn_args"])
def test_multiprocessing_shares_rivet_tensors(rng, transport):
    t = shared_random(rng, (8, 16))
    ref = t.numpy().copy()
    out = CTX.Queue()
    if transport == "queue":
        src = CTX.Queue()
        p = CTX.Process(target=kids.receive_and_write, args=(src, out, 5.0))
        p.start()
        src.put(t)
    elif transport == "pipe":
        mine, theirs = CTX.Pipe()
        p = CTX.Process(target=kids.receive_and_write, args=(theirs, out, 5.0))
        p.start()
        mine.send(t)
    else:
        p = CTX.Process(target=kids.receive_and_write, args=(t, out, 5.0))
        p.start()
    tag, got, shared = _get(out)
    assert tag == "got" and shared
    np.testing.assert_array_equal(got, ref)
    assert _get(out) == "wrote"
    assert t.numpy()[0, 0] == 5.0  # the child's write, seen here: shared, not copied
    t.numpy()[0, 1] = 6.0
    assert _get(out) == ("saw", 6.0)  # and ours, seen there
    assert _join(p) == 0


def test_a_temporary_put_on_a_queue_stays_valid_until_received(rng):
    out, src = CTX.Queue(), CTX.Queue()
    vals = rng.standard_normal(100).astype(np.float32)
    tmp = rivet.zeros((100,), shared=True)
    tmp.numpy()[:] = vals
    src.put(tmp)
    del tmp
    gc.collect()
    p = CTX.Process(target=kids.receive_and_write, args=(src, out, 1.0, False))
    p.start()
    tag, got, shared = _get(out)
    assert _get(out) == "wrote"
    assert _join(p) == 0
    assert shared
    np.testing.assert_array_equal(got, vals)


def test_a_tensor_not_in_shared_memory_is_copied_once_through_a_queue(rng):
    x = rng.standard_normal((3, 7)).astype(np.float32)
    t = rivet.from_dlpack(x)
    out, src = CTX.Queue(), CTX.Queue()
    p = CTX.Process(target=kids.receive_and_write, args=(src, out, 9.0, False))
    p.start()
    src.put(t)
    tag, got, shared = _get(out)
    assert _get(out) == "wrote"
    assert _join(p) == 0
    np.testing.assert_array_equal(got, x)
    assert shared  # the receiver holds the copy's segment
    assert x[0, 0] != 9.0  # a copy: the child's write stays there


def test_torch_shared_memory_is_shared_without_a_copy(rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(rng.standard_normal((8, 6)).astype(np.float32)).share_memory_()
    ref = x.clone()
    v = x[2:, ::2]
    h = rivet.ipc.share(v)
    fd, _ = x.untyped_storage()._share_fd_cpu_()
    st = os.fstat(fd)
    assert (h.st_dev, h.st_ino, h.fd, h.offset) == (st.st_dev, st.st_ino, fd, 2 * 6 * 4)
    out = CTX.Queue()
    p = CTX.Process(target=kids.torch_receiver, args=(h, out))
    p.start()
    tag, got = _get(out)
    np.testing.assert_array_equal(got, ref[2:, ::2].numpy())
    assert _get(out) == "wrote"
    assert _join(p) == 0
    want = ref.clone()
    want[2:, ::2] *= -1
    assert torch.equal(x, want)  # written in place by the child, seen through torch here


def test_torch_tensors_not_shared_or_shared_another_way(rng):
    torch = pytest.importorskip("torch")
    import torch.multiprocessing as tmp

    x = torch.from_numpy(rng.standard_normal(5).astype(np.float32))
    with pytest.raises(rivet.IPCError, match=r"torch\.Tensor.*not in shared memory.*share_memory_\(\).*copy=True"):
        rivet.ipc.share(x)
    # A torch view of rivet shared memory is rivet's to share, without a copy.
    r = rivet.zeros((4, 5), shared=True)
    r.numpy()[...] = rng.standard_normal((4, 5))
    tv = torch.from_dlpack(r)[1:, ::2]
    ht = rivet.ipc.share(tv)
    assert rivet.ipc.open(ht).data_ptr == tv.data_ptr()
    np.testing.assert_array_equal(rivet.ipc.open(ht).numpy(), tv.numpy())
    np.testing.assert_array_equal(rivet.ipc.open(rivet.ipc.share(x, copy=True)).numpy(), x.numpy())
    assert not x.is_shared()  # the copy left the tensor alone
    y = x.clone().share_memory_()
    old = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy("file_system")
    try:
        with pytest.raises(rivet.IPCError, match="sharing strategy is 'file_system'.*file_descriptor"):
            rivet.ipc.share(y)
    finally:
        tmp.set_sharing_strategy(old)
    e = torch.empty(0, 3).share_memory_()
    assert rivet.ipc.open(rivet.ipc.share(e)).shape == (0, 3)
    g = torch.ones(3, requires_grad=True).share_memory_()
    assert rivet.ipc.open(rivet.ipc.share(g)).numpy().sum() == 3


def test_a_killed_receiver_leaks_nothing(rng):
    shm_before = dev_shm()
    base_fds = memfds_of_self()
    t = shared_random(rng, (1 << 18,))  # 1 MiB
    ref = t.numpy().copy()
    h = rivet.ipc.share(t)
    out = CTX.Queue()
    p = CTX.Process(target=kids.hold_until_killed, args=(h, out))
    p.start()
    tag, total, pid = _get(out)
    assert tag == "holding" and total == pytest.approx(float(ref.astype(np.float64).sum()), rel=1e-4)
    assert holders(h) == {os.getpid(), pid}
    os.kill(pid, signal.SIGKILL)
    p.join(T)
    assert p.exitcode == -signal.SIGKILL
    a = t.numpy()
    np.testing.assert_array_equal(a[:-1], ref[:-1])  # intact
    assert a[-1] == -1.0  # the receiver's write before it died
    assert holders(h) == {os.getpid()}  # the kernel dropped the dead receiver's mapping
    del t, a
    gc.collect()
    assert holders(h) == set()  # the last process let go: the memory is freed
    assert memfds_of_self() == base_fds
    assert new_shm_entries(shm_before, [os.getpid(), pid]) == []


def test_the_view_outlives_a_sender_that_exits(rng):
    out, go = CTX.Queue(), CTX.Event()
    p = CTX.Process(target=kids.sender_exits_first, args=(out, go))
    p.start()
    h = _get(out)
    v = rivet.ipc.open(h)
    go.set()
    assert _join(p) == 0
    assert holders(h) == {os.getpid()}
    np.testing.assert_array_equal(v.numpy(), np.arange(4096.0))
    v.numpy()[:] = 1.0
    assert v.numpy().sum() == 4096.0
    del v
    gc.collect()
    assert holders(h) == set()


@pytest.mark.parametrize("reuse_fd", [False, True], ids=["fd_closed", "fd_reused"])
def test_a_stale_handle_from_another_process_is_an_error(reuse_fd):
    out = CTX.Queue()
    p = CTX.Process(target=kids.share_then_drop, args=(out, reuse_fd))
    p.start()
    try:
        h = _get(out)
        want = "is another file now" if reuse_fd else "closed the memory"
        with pytest.raises(rivet.IPCError, match=rf"(fd {h.fd} of process {p.pid}.*{want})|({want}.*fd {h.fd} of process {p.pid})"):
            rivet.ipc.open(h)
    finally:
        p.kill()
        p.join(T)


def test_a_handle_of_a_process_that_is_gone_is_an_error():
    out = CTX.Queue()
    p = CTX.Process(target=kids.share_and_exit, args=(out,))
    p.start()
    h = _get(out)
    assert _get(out) == "exiting"
    assert _join(p) == 0
    with pytest.raises(rivet.IPCError, match=rf"sending process {p.pid} is gone"):
        rivet.ipc.open(h)


def test_handles_travel_through_all_gather_object():
    pytest.importorskip("torch.distributed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = CTX.Queue()
    ps = [CTX.Process(target=kids.gather_handles, args=(r, 2, port, 1234, out)) for r in range(2)]
    for p in ps:
        p.start()
    got = sorted(_get(out) for _ in ps)
    for p in ps:
        assert _join(p) == 0
    # Each rank read the other's values exactly, and saw the other's write into its own.
    assert got == [(0, True, 1001.0), (1, True, 1000.0)]


# ---- the example ---------------------------------------------------------------------------------


def test_the_trainer_example_runs():
    env = dict(os.environ, OMP_NUM_THREADS="1", RIVET_NUM_THREADS="1")
    p = subprocess.run([sys.executable, EXAMPLE], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ipc trainer ok" in p.stdout, p.stdout
