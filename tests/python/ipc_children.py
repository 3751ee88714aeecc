"""Bodies of the processes tests/python/test_ipc.py spawns (a module of its own, so a spawned
child imports it by name without re-running the test module). Every function reports back on a
queue; none waits without a timeout."""

import os
import time

import numpy as np

import rivet

T = 60  # seconds any child waits for its parent at most


def build_axpb():
    """A compiled rivet kernel: W[i] = A[i] * 2 + B[i] (float32, any length)."""
    from rivet import te

    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    W = te.compute((n,), lambda i: A[i] * 2.0 + B[i], name="W")
    return rivet.build(rivet.create_schedule(W), [A, B, W], target="cpu", name="axpb")["axpb"]


def open_and_report(handle, out):
    """Opens a handle, sends back its values (a copy), then closes."""
    try:
        t = rivet.ipc.open(handle)
        out.put(("ok", np.array(t.numpy(), copy=True), t.is_shared))
    except Exception as e:  # the parent asserts on the type and the message
        out.put(("err", type(e).__name__, str(e), isinstance(e, rivet.IPCError), isinstance(e, OSError)))


def kernel_in_place(h_a, h_b, h_w, out):
    """Opens three handles and runs a compiled kernel writing the third in place."""
    f = build_axpb()
    a, b, w = (rivet.ipc.open(h) for h in (h_a, h_b, h_w))
    f(a, b, w)
    out.put("written")


def receive_and_write(src, out, value, wait=True):
    """Receives a rivet.Tensor from a Queue / Pipe (or as `src` itself, a spawn argument),
    reports what it saw, writes `value` into element 0, reports again, then (with `wait`)
    waits for the parent's write of `value + 1` into element 1 and reports what it saw."""
    if hasattr(src, "get"):
        t = src.get(timeout=T)
    elif hasattr(src, "recv"):
        if not src.poll(T):
            raise TimeoutError
        t = src.recv()
    else:
        t = src
    a = t.numpy()
    out.put(("got", np.array(a, copy=True), t.is_shared))
    a.reshape(-1)[0] = value
    out.put("wrote")
    if not wait:
        return
    deadline = time.monotonic() + T
    while a.reshape(-1)[1] != value + 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    out.put(("saw", float(a.reshape(-1)[1])))


def torch_receiver(handle, out):
    """Opens a handle of torch memory, checks it through torch.from_dlpack, writes through it."""
    import torch

    t = rivet.ipc.open(handle)
    v = torch.from_dlpack(t)
    out.put(("got", v.numpy().copy()))
    v.mul_(-1.0)
    out.put("wrote")


def hold_until_killed(handle, out):
    """Opens a handle, touches every page, says so, and sleeps until it is killed."""
    t = rivet.ipc.open(handle)
    a = t.numpy()
    out.put(("holding", float(a.sum()), os.getpid()))
    a[-1] = -1.0
    time.sleep(T)


def share_then_drop(out, reuse_fd):
    """Shares a tensor, drops it (its fd closes), with `reuse_fd` puts another file at that fd
    number, sends the now stale handle and stays alive until told to go."""
    t = rivet.zeros((256,), shared=True)
    h = rivet.ipc.share(t)
    del t
    import gc

    gc.collect()
    if reuse_fd:
        other = os.memfd_create("not-rivet", os.MFD_CLOEXEC)
        os.ftruncate(other, h.size)
        if other != h.fd:
            os.dup2(other, h.fd)
    out.put(h)
    time.sleep(T)


def share_and_exit(out):
    """Sends a handle and exits: the handle is stale once this process is gone."""
    t = rivet.zeros((16,), shared=True)
    out.put(rivet.ipc.share(t))
    out.put("exiting")


def sender_exits_first(out, go):
    """Shares a tensor holding 0..n-1 with a receiver, then exits while it still holds a view."""
    t = rivet.zeros((4096,), "float64", shared=True)
    t.numpy()[:] = np.arange(4096)
    out.put(rivet.ipc.share(t))
    go.wait(T)  # the receiver has opened it


def gather_handles(rank, world, port, seed, out):
    """torch.distributed (gloo, 2 processes): each rank shares a tensor, all_gather_object
    carries the handles, each rank opens the other's, checks its values and writes into it."""
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=__import__("datetime").timedelta(seconds=T))
    try:
        rng = np.random.default_rng(seed + rank)
        mine = rivet.zeros((64,), "float32", shared=True)
        mine.numpy()[:] = rng.standard_normal(64)
        handles = [None] * world
        dist.all_gather_object(handles, rivet.ipc.share(mine))
        peer = (rank + 1) % world
        theirs = rivet.ipc.open(handles[peer])
        want = np.random.default_rng(seed + peer).standard_normal(64).astype(np.float32)
        ok = bool(np.array_equal(theirs.numpy(), want))
        theirs.numpy()[0] = 1000.0 + rank  # the peer sees this after the barrier
        dist.barrier()
        seen = float(mine.numpy()[0])
        dist.barrier()
        out.put((rank, ok, seen))
    finally:
        dist.destroy_process_group()
