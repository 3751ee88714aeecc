"""Concurrent calls from Python threads, and the GIL released during native work."""

import sys
import threading
import time

import numpy as np
import torch

import rivet

N_THREADS = 8
JOIN_TIMEOUT = 120  # only a guard against deadlock, never a timing assertion


def _run_threads(target, n):
    errors = []

    def wrap(i):
        try:
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "threads deadlocked"
    assert not errors, errors


def test_concurrent_axpy_own_tensors(h, rng, axpy):
    n = 1 << 18
    iters = 25
    xs = [h.random_array(rng, (n,), np.float32) for _ in range(N_THREADS)]
    ys = [h.random_array(rng, (n,), np.float32) for _ in range(N_THREADS)]
    alphas = [float(rng.uniform(-1, 1)) for _ in range(N_THREADS)]
    refs = [
        (ys[i].astype(np.float64) + iters * alphas[i] * xs[i].astype(np.float64)) for i in range(N_THREADS)
    ]
    # half the threads use torch views of their buffers
    args = [
        (xs[i], ys[i]) if i % 2 == 0 else (torch.from_numpy(xs[i]), torch.from_numpy(ys[i]))
        for i in range(N_THREADS)
    ]

    def work(i):
        x, y = args[i]
        for _ in range(iters):
            axpy(alphas[i], x, y)

    _run_threads(work, N_THREADS)
    for i in range(N_THREADS):
        # float32 accumulation over `iters` steps: a few ulps per step
        np.testing.assert_allclose(ys[i], refs[i], rtol=1e-5, atol=1e-5)


def test_concurrent_axpy_float64_strided(h, rng, axpy):
    base = [np.empty((256, 512), np.float64) for _ in range(N_THREADS)]
    for b in base:
        h.poison(b)
        b[:, ::2] = h.random_array(rng, (256, 256), np.float64)
    x = h.random_array(rng, (256, 256), np.float64)  # shared read-only input
    refs = [(b[:, ::2] + 5 * 0.5 * x) for b in base]

    def work(i):
        for _ in range(5):
            axpy(0.5, x, base[i][:, ::2])

    _run_threads(work, N_THREADS)
    for i in range(N_THREADS):
        np.testing.assert_allclose(base[i][:, ::2], refs[i], rtol=1e-12, atol=1e-12)
        assert np.isnan(base[i][:, 1::2]).all()


def test_concurrent_python_callbacks(uname):
    name = uname()
    lock = threading.Lock()
    calls = [0]

    def cb(a, b):
        with lock:
            calls[0] += 1
        return a * b

    rivet.register_func(name, cb)
    f = rivet.get_global_func(name)
    results = [[] for _ in range(N_THREADS)]

    def work(i):
        for k in range(200):
            results[i].append(f(i, k))

    _run_threads(work, N_THREADS)
    assert calls[0] == N_THREADS * 200
    for i in range(N_THREADS):
        assert results[i] == [i * k for k in range(200)]


def test_concurrent_imports_and_registry(h, rng, uname):
    a = h.random_array(rng, (100,), np.float32)
    names = [uname("t%d" % i) for i in range(N_THREADS)]

    def work(i):
        rivet.register_func(names[i], lambda v, i=i: v + i)
        for _ in range(300):
            r = rivet.from_dlpack(a)
            assert r.data_ptr == a.ctypes.data
        assert rivet.get_global_func(names[i])(10) == 10 + i
        assert "testing.axpy" in rivet.list_global_funcs()

    _run_threads(work, N_THREADS)
    listed = set(rivet.list_global_funcs())
    assert set(names) <= listed


def test_gil_released_during_native_call(h, rng, axpy):
    """While one thread runs a long native axpy, another Python thread keeps running.

    The switch interval is raised so that, were the GIL held through the native call, the
    counting thread could not get it back before the call returns (it would have to wait for
    the interpreter's forced switch). The counting thread sleeps briefly between increments,
    so it never delays the main thread. Behaviour check only: no timing is asserted.
    """
    n = 1 << 24
    x = np.full(n, 0.5, np.float32)
    y = h.random_array(rng, (1024,), np.float32)
    y = np.resize(y, n)  # random-ish, non-zero
    y_head = y[:1024].astype(np.float64)
    counter = [0]
    stop = threading.Event()
    started = threading.Event()

    def count():
        started.set()
        while not stop.is_set():
            counter[0] += 1
            time.sleep(0.0002)

    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    th = threading.Thread(target=count, daemon=True)
    try:
        th.start()
        started.wait(JOIN_TIMEOUT)
        advanced = 0
        calls = 0
        for _ in range(10):
            c0 = counter[0]
            axpy(1.0, x, y)
            c1 = counter[0]
            calls += 1
            if c1 > c0:
                advanced += 1
                if advanced >= 2:
                    break
    finally:
        stop.set()
        sys.setswitchinterval(old)
        th.join(JOIN_TIMEOUT)
    assert advanced >= 1, "no Python thread ran during %d native calls: GIL held?" % calls
    # the work itself was done right
    np.testing.assert_allclose(y[:1024], y_head + np.float32(0.5) * calls, rtol=1e-5, atol=1e-5)
