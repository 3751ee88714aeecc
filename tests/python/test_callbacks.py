"""Host callbacks in kernels: ``te.extern`` stages computed by numpy / torch callbacks between
compute stages, ``s[T].debug_tap``, exceptions passing through with their traceback, wrong
results refused, the GIL released around the compiled work, saved modules with registered
callbacks, and views a callback keeps after it returned (docs/callbacks.md)."""

import sys
import threading
import time
import traceback

import numpy as np
import pytest
import torch

import rivet
from rivet import te

from conftest import backend_names, backend_params

# The backends that run host callbacks: those on host memory (CUDA refuses them:
# test_cuda_refuses_callbacks).
CPU_TARGETS = backend_params(host_memory=True)
JOIN_TIMEOUT = 120  # only a guard against deadlock, never a timing assertion


def _program(func, dtype="float32", name="E"):
    """B = 2A + 1; E = func(B, A) (an extern stage); C = E * 3 + B. Returns (A, B, E, C)."""
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n, m), dtype, name="A")
    B = te.compute((n, m), lambda i, j: A[i, j] * 2 + 1, name="B")
    E = te.extern((n, m), [B, A], func, dtype=dtype, name=name)
    C = te.compute((n, m), lambda i, j: E[i, j] * 3 + B[i, j], name="C")
    return A, B, E, C


def _build(s, args, target):
    return rivet.build(s, args, target=target, name="f")["f"]


def _ref(a, e_of):
    b = a * 2 + 1
    return e_of(b, a) * 3 + b


def _np_sin_cb(b, a, out):
    # Write the output in place through numpy (DLPack views of rivet tensors).
    o = np.from_dlpack(out)
    assert o.flags.writeable and not np.from_dlpack(b).flags.writeable
    o[...] = np.sin(np.from_dlpack(b)) * np.from_dlpack(a)


def _torch_cb(b, a, out):
    # Return a new torch tensor: checked against the declared shape and dtype, then copied.
    return torch.from_dlpack(b) ** 2 - torch.from_dlpack(a)


@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.parametrize(
    "cb, e_of",
    [
        (_np_sin_cb, lambda b, a: np.sin(b) * a),
        (_torch_cb, lambda b, a: b * b - a),
    ],
    ids=["numpy_in_place", "torch_returned"],
)
@pytest.mark.parametrize("shape", [(7, 5), (300, 129)])
def test_extern_stage_between_computes(h, rng, target, cb, e_of, shape):
    A, _, _, C = _program(cb)
    f = _build(te.create_schedule(C), [A, C], target)
    for _ in range(2):
        a = h.random_array(rng, shape, np.float32)
        c = h.poison(np.empty(shape, np.float32))
        f(a, c)
        want = _ref(a.astype(np.float64), e_of)
        np.testing.assert_allclose(c, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_extern_float64_with_torch_tensors_as_arguments(rng, target):
    A, _, _, C = _program(_torch_cb, dtype="float64")
    f = _build(te.create_schedule(C), [A, C], target)
    a = torch.from_numpy(rng.uniform(-1.5, 1.5, (9, 4)))
    c = torch.full((9, 4), float("nan"), dtype=torch.float64)
    f(a, c)
    b = a * 2 + 1
    torch.testing.assert_close(c, (b * b - a) * 3 + b)


class CallbackFailed(Exception):
    pass


def test_an_exception_comes_out_unchanged_with_its_traceback(h, rng):
    raised = []
    fail = [True]

    def failing_callback(b, a, out):
        if fail[0]:
            e = CallbackFailed("from the callback")
            raised.append(e)
            raise e
        np.from_dlpack(out)[...] = np.from_dlpack(b)

    # Small (the GIL kept through the call) and large (released around the compiled work).
    for target, shape in [(t, s) for t in backend_names(runnable=True) for s in [(40, 30), (400, 300)]]:
        A, _, _, C = _program(failing_callback)
        f = _build(te.create_schedule(C), [A, C], target)
        a = h.random_array(rng, shape, np.float32)
        fail[0] = True
        with pytest.raises(CallbackFailed) as info:
            f(a)
        assert info.value is raised[-1]
        frames = [fr.name for fr in traceback.extract_tb(info.value.__traceback__)]
        assert "failing_callback" in frames, frames
        # The function works again afterwards (no fault, no lock left behind).
        fail[0] = False
        got = f(a)
        b = a * 2 + 1
        np.testing.assert_allclose(np.from_dlpack(got), b * 3 + b, rtol=1e-6)


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_wrong_results_are_shape_and_dtype_errors(rng, target):
    a = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    cases = [
        (lambda b, a_, out: np.zeros((4, 3), np.float32), rivet.ShapeError, "expected shape [3, 4]"),
        (lambda b, a_, out: np.zeros((3, 4), np.float64), rivet.DTypeError, "expected dtype float32"),
        (lambda b, a_, out: torch.zeros(12, dtype=torch.float32), rivet.ShapeError, "shape [12]"),
        (lambda b, a_, out: "not a tensor", rivet.Error, "expected None"),
    ]
    for cb, err, text in cases:
        A, _, _, C = _program(cb, name="Ext")
        f = _build(te.create_schedule(C), [A, C], target)
        with pytest.raises(err) as info:
            f(a)
        msg = str(info.value)
        assert "extern stage 'Ext'" in msg and text in msg, msg
    # The builtin classes too: ShapeError is a ValueError, DTypeError a TypeError.
    assert issubclass(rivet.ShapeError, ValueError) and issubclass(rivet.DTypeError, TypeError)


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_debug_tap_sees_intermediates_in_order_and_changes_nothing(h, rng, target):
    log = []
    taps = {}

    def tap(name):
        def f(t):
            arr = np.from_dlpack(t)
            assert not arr.flags.writeable
            log.append(name)
            taps[name] = arr.copy()

        return f

    def ext(b, a, out):
        log.append("E")
        np.from_dlpack(out)[...] = np.from_dlpack(b) * np.from_dlpack(a)

    A, B, E, C = _program(ext)
    plain = _build(te.create_schedule(C), [A, C], target)
    s = te.create_schedule(C)
    s[C].debug_tap(tap("C"))
    s[B].debug_tap(tap("B"))
    s[E].debug_tap(tap("E.tap"))
    f = _build(s, [A, C], target)
    a = h.random_array(rng, (64, 48), np.float32)
    log.clear()
    c = f(a)
    # Stage order (producers first), each exactly once per call.
    assert log == ["B", "E", "E.tap", "C"], log
    b = a * 2 + 1
    np.testing.assert_array_equal(taps["B"], b)
    np.testing.assert_array_equal(taps["E.tap"], b * a)
    np.testing.assert_array_equal(taps["C"], np.from_dlpack(c))
    np.testing.assert_array_equal(np.from_dlpack(c), np.from_dlpack(plain(a)))
    # A tapped stage stays materialised: inlining it is refused.
    with pytest.raises(rivet.CompileError, match="debug_tap"):
        s[B].compute_inline()


def test_callbacks_are_refused_inside_loops_and_on_cuda():
    A, B, E, C = _program(_np_sin_cb)
    s = te.create_schedule(C)
    i, _ = C.op.axis
    s[C].parallel(i)
    with pytest.raises(rivet.CompileError, match="never inside a loop"):
        s[E].compute_at(s[C], i)
    with pytest.raises(rivet.CompileError, match="host callbacks in device code are not supported"):
        rivet.build(te.create_schedule(C), [A, C], target="cuda", name="f")


def test_the_gil_is_released_around_compiled_work_and_taken_for_the_callback(h, rng):
    """While the compute stages after a callback run, another Python thread runs.

    The switch interval is raised so that, were the GIL held through the compiled work, the
    counting thread could not take it before the call returns. The callback notes the count
    (it runs Python, so it holds the GIL then); the stages after it are long. Behaviour only:
    no timing is asserted."""
    n = 1 << 22
    counter = [0]
    at_callback = []
    stop = threading.Event()
    started = threading.Event()

    def count():
        started.set()
        while not stop.is_set():
            counter[0] += 1
            time.sleep(0.0002)

    def ext(a, out):
        at_callback.append(counter[0])
        assert threading.current_thread() is threading.main_thread()

    N = te.var("n")
    A = te.placeholder((N,), "float32", name="A")
    E = te.extern((N,), [A], ext, name="E")
    C = te.compute((N,), lambda i: te.exp(te.tanh(E[i] + A[i])) * te.sqrt(te.abs(A[i]) + 1), name="C")
    D = te.compute((N,), lambda i: te.tanh(C[i]) + te.exp(C[i] * 0.5), name="D")
    f = _build(te.create_schedule(D), [A, D], "cpu")
    a = h.random_array(rng, (n,), np.float32)
    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    th = threading.Thread(target=count, daemon=True)
    advanced = 0
    try:
        th.start()
        started.wait(JOIN_TIMEOUT)
        for _ in range(10):
            d = f(a)
            if counter[0] > at_callback[-1]:
                advanced += 1
                if advanced >= 2:
                    break
    finally:
        stop.set()
        sys.setswitchinterval(old)
        th.join(JOIN_TIMEOUT)
    assert advanced >= 1, "no Python thread ran during the compiled work after the callback"
    c = np.exp(np.tanh(a.astype(np.float64))) * np.sqrt(np.abs(a) + 1.0)
    np.testing.assert_allclose(np.from_dlpack(d), np.tanh(c) + np.exp(c * 0.5), rtol=1e-4)


def test_saved_module_with_a_registered_callback(tmp_path, h, rng):
    name = "tests.callbacks.sin_times"
    rivet.register_func(name, _np_sin_cb, override=True)
    try:
        A, _, _, C = _program(name)
        path = str(tmp_path / "cb.rivet")
        rivet.build(te.create_schedule(C), [A, C], target="cpu", name="f").save(path)
        f = rivet.load_module(path)["f"]
        a = h.random_array(rng, (17, 6), np.float32)
        c = h.poison(np.empty((17, 6), np.float32))
        f(a, c)
        np.testing.assert_allclose(c, _ref(a.astype(np.float64), lambda b, a_: np.sin(b) * a_), rtol=2e-5, atol=2e-5)
    finally:
        rivet.remove_global_func(name)
    # Not registered in this process any more: loading says which name is missing.
    with pytest.raises(rivet.Error, match="tests.callbacks.sin_times"):
        rivet.load_module(path)
    # A bare callable cannot be saved: the error says how to make it savable.
    A, _, _, C = _program(_np_sin_cb)
    with pytest.raises(rivet.CompileError, match="register_func"):
        rivet.build(te.create_schedule(C), [A, C], target="cpu", name="f").save(str(tmp_path / "x.rivet"))
    with pytest.raises(rivet.CompileError, match="no.such.callback"):
        _program("no.such.callback")


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_a_view_kept_after_the_callback_stays_valid(h, rng, target):
    kept = []

    def keeper(b, a, out):
        o = np.from_dlpack(out)
        o[...] = np.from_dlpack(b) - np.from_dlpack(a)
        # Keep both the rivet tensors and numpy views of them past the call.
        kept.append((out, o, np.from_dlpack(b)))

    A, _, _, C = _program(keeper)
    f = _build(te.create_schedule(C), [A, C], target)
    xs = [h.random_array(rng, (50, 40), np.float32) for _ in range(3)]
    for x in xs:
        f(x)
    import gc

    gc.collect()
    for (out, o, b), x in zip(kept, xs):
        bb = x * 2 + 1
        np.testing.assert_array_equal(b, bb)
        np.testing.assert_array_equal(o, bb - x)
        np.testing.assert_array_equal(np.from_dlpack(out), bb - x)


def test_gradient_through_an_extern_stage_is_refused_not_zero():
    from rivet import te as _te

    n = _te.var("n")
    A = _te.placeholder((n,), "float32", name="A")
    E = _te.extern((n,), [A], lambda a, out: None, dtype="float32", name="E")
    C = _te.compute((n,), lambda i: E[i] * 2.0, name="C")
    with pytest.raises(rivet.NotDifferentiableError, match="'E' is computed by a host callback"):
        _te.gradient(C, [A])
    # Inputs not reached through the callback still differentiate.
    B = _te.placeholder((n,), "float32", name="B")
    D = _te.compute((n,), lambda i: E[i] * B[i], name="D")
    (gb,) = _te.gradient(D, [B])
    assert gb.shape[0] is not None
