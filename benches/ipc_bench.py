#!/usr/bin/env python
"""Cross-process tensors: what it costs another process to get a big CPU tensor, and
a handle's round trip.

    PYTHONPATH=<dir with the rivet wheel installed> .venv/bin/python benches/ipc_bench.py [--gib 1]

(a) A 1 GiB float32 tensor (filled, so every page exists) goes to an already running, warmed-up
    spawned child: as a numpy array through ``mp.Queue`` (pickled, copied through a pipe), as a
    ``rivet.ipc.Handle`` through the same queue then ``rivet.ipc.open``, and as a ``rivet.Tensor``
    through the queue (the multiprocessing reducer: the fd travels by ``SCM_RIGHTS``). The child
    reads one element (first touch of one page, not the whole GiB) and reports the moment it
    had it (``CLOCK_MONOTONIC``, one clock for both processes) and its ``VmRSS`` before and
    after (``/proc/self/status``). Median of ``--reps`` runs; ratio = numpy time / rivet time.
(b) Round trip producer -> consumer -> producer of a small message through ``mp.Queue`` and
    ``mp.Pipe``: a bare handle sent back; a handle the consumer opens (its mapping reused after
    the first) and reads before answering; a handle of a fresh segment every time (a new
    mapping per message); a ``rivet.Tensor`` through the reducer. Median and min/max microseconds
    over ``--iters`` round trips after 50 warm-up ones.

Timings go here, never into tests. Check ``uptime`` first: the VM is shared.
"""

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import time

import numpy as np

import rivet

CLOCK = time.CLOCK_MONOTONIC


def now():
    return time.clock_gettime(CLOCK)


def vmrss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


# ---- (a) 1 GiB -----------------------------------------------------------------------------


def receiver(inbox, outbox):
    """Waits for (kind, payload) messages; reports when it has the tensor and its RSS."""
    import gc

    while True:
        before = vmrss()  # idle, waiting
        msg = inbox.get()  # unpickled here: a numpy array arrives whole
        if msg is None:
            return
        inbox_kind, payload = msg
        if inbox_kind == "handle":
            t = rivet.ipc.open(payload).numpy()
        elif inbox_kind == "tensor":
            t = payload.numpy()
        else:
            t = payload
        first = float(t[len(t) // 2])  # one page touched
        got = now()
        after = vmrss()
        outbox.put((got, before, after, first))
        del t, payload, msg
        gc.collect()


def big_transfer(n, reps):
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=receiver, args=(inbox, outbox))
    p.start()
    inbox.put(("numpy", np.zeros(4, np.float32)))  # warm the child up (imports, queue thread)
    outbox.get()
    value = np.float32(3.5)
    arr = np.full(n, value, np.float32)
    shared = rivet.empty((n,), "float32", shared=True)
    shared.numpy()[:] = value  # every page exists, as in the numpy case
    h = rivet.ipc.share(shared)
    rows = {}
    for kind, payload in [("numpy", arr), ("handle", h), ("tensor", shared)]:
        times, growth = [], []
        for _ in range(reps):
            t0 = now()
            inbox.put((kind, payload))
            got, before, after, first = outbox.get(timeout=600)
            assert first == value, (kind, first)
            times.append(got - t0)
            growth.append(after - before)
        rows[kind] = (statistics.median(times), min(times), max(times), statistics.median(growth))
    inbox.put(None)
    p.join(60)
    return rows


# ---- (b) round trips -----------------------------------------------------------------------


def echo(conn_kind, a, b):
    """The consumer: answers every message; 'open' messages are opened and read first."""
    get = a.get if conn_kind == "queue" else a.recv
    put = b.put if conn_kind == "queue" else b.send
    while True:
        kind, payload = get()
        if kind == "stop":
            return
        if kind == "open":
            t = rivet.ipc.open(payload)
            put(float(t.numpy()[0]))
        elif kind == "tensor":
            put(float(payload.numpy()[0]))
        else:
            put(payload)


def round_trips(conn_kind, iters):
    ctx = mp.get_context("spawn")
    if conn_kind == "queue":
        to, back = ctx.Queue(), ctx.Queue()
        args, put, get = (to, back), to.put, back.get
    else:
        here_a, there_a = ctx.Pipe()
        p_args = (there_a, there_a)
        args, put, get = p_args, here_a.send, here_a.recv
    p = ctx.Process(target=echo, args=(conn_kind, *args))
    p.start()
    t = rivet.zeros((1024,), shared=True)
    t.numpy()[:] = 2.0
    h = rivet.ipc.share(t)
    keep = []

    def fresh(i):
        # A new segment per message, made before the clock starts (allocation is not the
        # transport), kept alive until the consumer has answered.
        f = rivet.zeros((1024,), shared=True)
        f.numpy()[0] = 2.0
        keep[:] = [f]
        return ("open", rivet.ipc.share(f))

    cases = {
        "baseline: a small tuple, no rivet": lambda i: ("echo", (1, 2.0, "x")),
        "bare handle": lambda i: ("echo", h),
        "handle, opened and read": lambda i: ("open", h),
        "handle of a fresh segment, opened and read": fresh,
        "rivet.Tensor (reducer, fd by SCM_RIGHTS), read": lambda i: ("tensor", t),
    }
    out = {}
    for name, msg in cases.items():
        samples = []
        for i in range(iters + 50):
            m = msg(i)
            t0 = time.perf_counter()
            put(m)
            r = get()
            dt = time.perf_counter() - t0
            if i >= 50:
                samples.append(dt)
            assert r == 2.0 or r == m[1], r
        out[name] = (statistics.median(samples) * 1e6, min(samples) * 1e6, max(samples) * 1e6)
    put(("stop", None))
    p.join(60)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="size of the big tensor in GiB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iters", type=int, default=1000)
    a = ap.parse_args()
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {model}, {os.cpu_count()} CPUs, Python {platform.python_version()}, rivet {rivet.__version__} "
          f"(git {commit}), load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at start")
    n = int(a.gib * (1 << 30)) // 4
    rows = big_transfer(n, a.reps)
    print(f"\n(a) {a.gib:g} GiB float32 to a running child, median of {a.reps} (min-max)\n")
    print("| how | time to have it | RSS growth of the receiver | ratio |")
    print("| --- | ---: | ---: | ---: |")
    base = rows["numpy"][0]
    for kind, label in [("numpy", "numpy array through mp.Queue"), ("handle", "rivet.ipc handle through mp.Queue + open"),
                        ("tensor", "rivet.Tensor through mp.Queue (reducer)")]:
        med, lo, hi, grow = rows[kind]
        print(f"| {label} | {med * 1e3:.3f} ms ({lo * 1e3:.3f}-{hi * 1e3:.3f}) | {grow / 2**20:.2f} MiB | "
              f"{base / med:.0f}x |")
    for conn in ["queue", "pipe"]:
        print(f"\n(b) round trip through mp.{conn.capitalize()}, {a.iters} after 50 warm-up, microseconds\n")
        print("| message | median | min | max |")
        print("| --- | ---: | ---: | ---: |")
        for name, (med, lo, hi) in round_trips(conn, a.iters).items():
            print(f"| {name} | {med:.1f} | {lo:.1f} | {hi:.1f} |")
    print(f"\nload {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at the end")


if __name__ == "__main__":
    main()
