"""Hypothesis property tests of rivet's Python surface (docs/testing.md, "Fuzzing").

- rivet.te programs built from drawn elementwise expressions and shapes, on both targets,
  against a numpy reference on fresh random data, outputs poisoned first, inputs unchanged;
- rivet.from_dlpack on numpy views with drawn shapes, strides and offsets
  (np.lib.stride_tricks.as_strided over a larger buffer), compared with numpy;
- calls with drawn wrong dtypes and shapes: typed rivet errors, never a crash.

Profiles: "small" (30 examples per test, the default, run by `make test`) and "large"
(`RIVET_HYPOTHESIS_PROFILE=large`, run by `make fuzz`).
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rivet
from rivet import te

from conftest import assert_matches, backend_names

settings.register_profile(
    "small", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "large", max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("RIVET_HYPOTHESIS_PROFILE", "small"))

# The backends this machine can run (conftest.BACKENDS: the one list).
TARGETS = backend_names(runnable=True)
dims = st.lists(st.integers(1, 5), min_size=1, max_size=3)

# ---- drawn expressions ----------------------------------------------------------------------

# An expression is a tuple tree: ("in", k) | ("c", value) | (op, a, b) | ("neg", a)
leaf = st.one_of(
    st.tuples(st.just("in"), st.integers(0, 1)),
    st.tuples(st.just("c"), st.sampled_from([0.5, -1.0, 2.0, 3.0])),
)
tree = st.recursive(
    leaf,
    lambda kids: st.one_of(
        st.tuples(st.sampled_from(["+", "-", "*", "max", "min"]), kids, kids),
        st.tuples(st.just("neg"), kids),
    ),
    max_leaves=8,
)


def te_of(e, reads):
    kind = e[0]
    if kind == "in":
        return reads[e[1]]
    if kind == "c":
        return e[1]
    if kind == "neg":
        return -te_of(e[1], reads)
    a, b = te_of(e[1], reads), te_of(e[2], reads)
    if kind == "max" or kind == "min":
        if not isinstance(a, te.Expr) and not isinstance(b, te.Expr):
            return a  # both constants (np_of does the same)
        a = a if isinstance(a, te.Expr) else te.const(a, "float64")
        b = b if isinstance(b, te.Expr) else te.const(b, "float64")
        return (te.max if kind == "max" else te.min)(a, b)
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b}[kind]()


def np_of(e, xs):
    kind = e[0]
    if kind == "in":
        return xs[e[1]]
    if kind == "c":
        return np.float64(e[1])
    if kind == "neg":
        return -np_of(e[1], xs)
    a, b = np_of(e[1], xs), np_of(e[2], xs)
    if kind == "max" or kind == "min":
        if np.ndim(a) == 0 and np.ndim(b) == 0:
            return a
        return np.maximum(a, b) if kind == "max" else np.minimum(a, b)
    return {"+": a + b, "-": a - b, "*": a * b}[kind]


@given(shape=dims, e=tree, seed=st.integers(0, 2**32 - 1), target=st.sampled_from(TARGETS))
def test_drawn_elementwise_programs_match_numpy(shape, e, seed, target):
    # Both inputs are arguments, so both must be read: add 0 * each.
    e = ("+", ("+", e, ("*", ("in", 0), ("c", 0.0))), ("*", ("in", 1), ("c", 0.0)))
    A = te.placeholder(tuple(shape), "float64", name="A")
    B = te.placeholder(tuple(shape), "float64", name="B")
    try:
        C = te.compute(tuple(shape), lambda *i: te_of(e, [A[i], B[i]]) + 0.0, name="C")
    except rivet.Error:
        return  # the DSL refused the drawn expression: a typed error is fine
    f = rivet.build(rivet.create_schedule(C), [A, B, C], target=target, name="f")["f"]
    rng = np.random.default_rng(seed)
    x = rng.integers(-8, 8, size=shape).astype(np.float64) * 0.5
    y = rng.integers(-8, 8, size=shape).astype(np.float64) * 0.5
    x0, y0 = x.copy(), y.copy()
    out = np.full(shape, np.nan)
    f(x, y, out)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)
    # The same float64 operations as the kernel (its trailing + 0.0 included): bit-exact.
    want = np.broadcast_to(np_of(e, [x, y]) + 0.0, shape)
    assert_matches(out, want, op="exact")


# ---- strided numpy views through DLPack ------------------------------------------------------


@st.composite
def strided_views(draw):
    shape = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int32]))
    steps = [draw(st.sampled_from([0, 1, 2, 3, -1, -2])) for _ in shape]
    item = np.dtype(dtype).itemsize
    # Element strides; the base is large enough for every element of the view.
    span_pos = sum((n - 1) * s for n, s in zip(shape, steps) if s > 0 and n > 0)
    span_neg = sum((n - 1) * -s for n, s in zip(shape, steps) if s < 0 and n > 0)
    extra = draw(st.integers(0, 3))
    base = np.arange(span_pos + span_neg + 1 + 2 * extra + 8).astype(dtype)
    start = span_neg + extra
    # Contiguous row-major strides when the step is 1 everywhere, else the drawn ones.
    strides = tuple(s * item for s in steps)
    view = np.lib.stride_tricks.as_strided(base[start:], shape=tuple(shape), strides=strides)
    return base, view


@given(bv=strided_views())
def test_from_dlpack_of_strided_numpy_views_matches_numpy(bv):
    base, view = bv
    snapshot = base.copy()
    try:
        t = rivet.from_dlpack(view)
    except (rivet.Error, BufferError, TypeError, ValueError):
        return  # e.g. numpy refuses to export negative / zero strides on some versions
    assert tuple(t.shape) == view.shape
    np.testing.assert_array_equal(np.asarray(t.numpy()), view)
    np.testing.assert_array_equal(base, snapshot)


@given(bv=strided_views(), alpha=st.sampled_from([0.0, 1.0, -2.5]))
def test_axpy_on_strided_views(bv, alpha):
    base, view = bv
    if view.dtype not in (np.float32, np.float64):
        return
    x = np.ascontiguousarray(view)
    y = np.array(view, copy=True)
    want = (alpha * x.astype(np.float64) + y.astype(np.float64)).astype(view.dtype)
    axpy = rivet.get_global_func("testing.axpy")
    axpy(alpha, view, y)
    np.testing.assert_allclose(y, want, rtol=1e-6)


# ---- wrong dtypes and shapes -----------------------------------------------------------------


@given(
    dtype=st.sampled_from(["float32", "float64", "int32", "int64", "uint8", "bool"]),
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
    target=st.sampled_from(TARGETS),
)
def test_wrong_dtypes_and_shapes_are_typed_errors(dtype, shape, target):
    n = te.var("n")
    A = te.placeholder((n, 3), "float32", name="A")
    C = te.compute((n, 3), lambda i, j: A[i, j] * 2.0, name="C")
    f = rivet.build(rivet.create_schedule(C), [A, C], target=target, name="f")["f"]
    x = np.zeros(shape, dtype=dtype)
    ok = dtype == "float32" and len(shape) == 2 and shape[1] == 3
    if ok:
        out = f(x)
        np.testing.assert_array_equal(np.asarray(out.numpy() if hasattr(out, "numpy") else out), x * 2)
    else:
        with pytest.raises(rivet.Error):
            f(x)
