"""Reference cycles through Python callbacks held by rivet objects are collected.

A callback (``te.extern``'s function, ``Stage.debug_tap``, a ``convert_func`` converter) that
refers back to the rivet object holding it (a te tensor, a schedule or stage, a module, a
``rivet.Function``) makes a cycle the garbage collector must see through: the rivet objects
report the Python objects they alone hold (bindings/src/gc.rs, docs/callbacks.md). Each case
builds the cycle in a function, drops every outside reference, and checks with a weakref
that ``gc.collect()`` frees the callback. The converse is checked too: while another live
holder (a module built from the program) still needs the callback, collecting frees nothing
and the callback still runs, with results against numpy on fresh random data.
"""

import gc
import weakref

import numpy as np

import rivet
from rivet import te


def collected(ref):
    gc.collect()
    return ref() is None


def doubling(box, key):
    """A callback writing 2 * input, referring to ``box[key]`` (the object that holds it)."""

    def cb(a, out):
        assert box[key] is not None
        np.from_dlpack(out)[...] = 2 * np.from_dlpack(a)

    return cb


def test_an_extern_callback_holding_its_own_stage_is_collected():
    def make():
        box = {}
        n = te.var("n")
        A = te.placeholder((n,), "float32", name="A")
        cb = doubling(box, "E")
        box["E"] = te.extern((n,), [A], cb, name="E")
        assert gc.is_tracked(box["E"])
        return weakref.ref(cb)

    assert collected(make())


def test_a_callback_a_live_module_needs_survives_collection_and_runs(target, rng):
    def make():
        box = {}
        n = te.var("n")
        A = te.placeholder((n,), "float32", name="A")
        cb = doubling(box, "E")
        E = te.extern((n,), [A], cb, name="E")
        box["E"] = E
        C = te.compute((n,), lambda i: E[i] + 1, name="C")
        mod = rivet.build(te.create_schedule(C), [A, C], target=target, name="f")
        return mod, weakref.ref(cb)

    mod, ref = make()
    # The te program and its callback form a cycle; the module holds the callback too.
    assert not collected(ref)
    a = rng.standard_normal(37).astype(np.float32)
    got = np.from_dlpack(mod["f"](a))
    np.testing.assert_allclose(got, 2 * a + 1, rtol=1e-6)
    del mod
    assert collected(ref)


def test_a_stage_a_live_consumer_reads_keeps_its_callback(rng):
    def make():
        box = {}
        n = te.var("n")
        A = te.placeholder((n,), "float32", name="A")
        cb = doubling(box, "E")
        E = te.extern((n,), [A], cb, name="E")
        box["E"] = E
        C = te.compute((n,), lambda i: E[i] * 3, name="C")
        return A, C, weakref.ref(cb)

    A, C, ref = make()
    assert not collected(ref)
    f = rivet.build(te.create_schedule(C), [A, C], target="cpu", name="f")["f"]
    a = rng.standard_normal(11).astype(np.float32)
    np.testing.assert_allclose(np.from_dlpack(f(a)), 6 * a, rtol=1e-6)
    del C, f
    assert collected(ref)


def test_a_module_whose_callback_holds_the_module_is_collected(target, rng):
    def make():
        box = {}
        n = te.var("n")
        A = te.placeholder((n,), "float32", name="A")
        cb = doubling(box, "m")
        E = te.extern((n,), [A], cb, name="E")
        box["m"] = rivet.build(te.create_schedule(E), [A, E], target=target, name="f")
        a = rng.standard_normal(9).astype(np.float32)
        np.testing.assert_allclose(np.from_dlpack(box["m"]["f"](a)), 2 * a, rtol=1e-6)
        return weakref.ref(cb)

    assert collected(make())


def test_a_function_whose_callback_holds_the_function_is_collected(target, rng):
    def make():
        box = {}
        n = te.var("n")
        A = te.placeholder((n,), "float32", name="A")
        cb = doubling(box, "f")
        E = te.extern((n,), [A], cb, name="E")
        box["f"] = rivet.build(te.create_schedule(E), [A, E], target=target, name="f")["f"]
        a = rng.standard_normal(9).astype(np.float32)
        np.testing.assert_allclose(np.from_dlpack(box["f"](a)), 2 * a, rtol=1e-6)
        return weakref.ref(cb)

    assert collected(make())


def test_a_debug_tap_holding_its_schedule_or_stage_is_collected():
    def make(via_stage):
        n = te.var("n")
        A = te.placeholder((n,), "float32", name="A")
        B = te.compute((n,), lambda i: A[i] * 2, name="B")
        C = te.compute((n,), lambda i: B[i] + 1, name="C")
        s = te.create_schedule(C)
        st = s[B]
        held = st if via_stage else s

        def tap(t):
            assert held is not None

        st.debug_tap(tap)
        return weakref.ref(tap)

    assert collected(make(via_stage=False))
    assert collected(make(via_stage=True))


def test_a_bound_method_callback_of_an_object_keeping_the_function_is_collected(rng):
    class Layer:
        def __init__(self):
            n = te.var("n")
            A = te.placeholder((n,), "float32", name="A")
            B = te.compute((n,), lambda i: A[i] * 3, name="B")
            C = te.compute((n,), lambda i: B[i] - 1, name="C")
            s = te.create_schedule(C)
            s[B].debug_tap(self.record)
            self.seen = []
            self.f = rivet.build(s, [A, C], target="cpu", name="layer")["layer"]

        def record(self, t):
            self.seen.append(np.from_dlpack(t).copy())

    def make():
        layer = Layer()
        a = rng.standard_normal(16).astype(np.float32)
        np.testing.assert_allclose(np.from_dlpack(layer.f(a)), 3 * a - 1, rtol=1e-6)
        np.testing.assert_allclose(layer.seen[-1], 3 * a, rtol=1e-6)
        return weakref.ref(layer)

    assert collected(make())


def test_a_converter_holding_its_wrapper_is_collected(rng):
    rivet.register_func("test_gc.copy", lambda a, out: np.copyto(np.from_dlpack(out), np.from_dlpack(a)), override=True)

    def make():
        box = {}

        def to_dlpack(x):
            assert box["w"] is not None
            return x

        box["w"] = rivet.convert_func("test_gc.copy", np.ndarray, to_dlpack)
        a = rng.standard_normal(5)
        out = np.zeros(5)
        box["w"](a, out)
        np.testing.assert_array_equal(out, a)
        return weakref.ref(to_dlpack)

    try:
        assert collected(make())
    finally:
        rivet.remove_global_func("test_gc.copy")


def test_a_registered_callback_is_never_collected_from_under_the_registry(rng):
    box = {}

    def cb(a, out):
        np.from_dlpack(out)[...] = -np.from_dlpack(a)

    rivet.register_func("test_gc.negate", cb, override=True)
    try:
        n = te.var("n")
        A = te.placeholder((n,), "float32", name="A")
        E = te.extern((n,), [A], "test_gc.negate", name="E")
        box["E"] = E
        f = rivet.build(te.create_schedule(E), [A, E], target="cpu", name="neg")["neg"]
        del E, box
        ref = weakref.ref(cb)
        del cb
        assert not collected(ref)
        a = rng.standard_normal(7).astype(np.float32)
        np.testing.assert_array_equal(np.from_dlpack(f(a)), -a)
    finally:
        rivet.remove_global_func("test_gc.negate")
