"""The tensor-expression DSL (rivet.te): every expression feature, built and run on both the
IR interpreter (the oracle) and the Cranelift CPU backend, against numpy / torch references.

Outputs are poisoned before each run; inputs are fresh random data from the seeded ``rng``.
"""

import math

import numpy as np
import pytest
import torch

import rivet
from rivet import te

from conftest import abs_mm, assert_matches, poison, random_array

# `target` (every backend) comes from conftest.py; tolerances follow docs/tolerance.md through
# conftest.assert_matches.


def build(outs, args, target, name="f", sched=None):
    s = sched if sched is not None else rivet.create_schedule(outs)
    return rivet.build(s, args, target=target, name=name)[name]


def run(f, inputs, out_specs):
    """Call f(*inputs, *outputs) on poisoned numpy outputs of (shape, dtype) each."""
    outs = [poison(np.empty(shape, dtype)) for shape, dtype in out_specs]
    f(*inputs, *outs)
    return outs


def close(got, ref, op="exact", **kw):
    ref = np.asarray(ref)
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    assert got.shape == ref.shape
    assert_matches(got, ref, op=op, against="numpy", **kw)


# ---- expression objects ------------------------------------------------------------------


def test_expr_dtypes_and_python_numbers():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    I = te.placeholder((n,), "int32", name="I")
    i = te.var("i")
    assert n.dtype == "int64"
    assert (A[i] * 2).dtype == "float32"
    assert (2 * A[i]).dtype == "float32"
    assert (A[i] * 2.5).dtype == "float32"
    assert (i + 1).dtype == "int64"
    assert (I[i] + 1).dtype == "int32"
    assert (I[i] * 2.0).dtype == "int32"  # an integral float is fine
    assert (A[i] < 1).dtype == "bool"
    assert (1 < A[i]).dtype == "bool"
    assert ((A[i] > 0) & True).dtype == "bool"
    assert (True | (A[i] > 0)).dtype == "bool"
    assert (~(A[i] > 0)).dtype == "bool"
    assert A[i].astype("float64").dtype == "float64"
    assert te.cast("int8", A[i]).dtype == "int8"
    assert te.const(1).dtype == "int64"
    assert te.const(1.0).dtype == "float32"
    assert te.const(True).dtype == "bool"
    assert te.const(3, "float64").dtype == "float64"
    assert te.const(3, "float64").value == 3.0
    assert te.const(7).value == 7
    assert (A[i] ** 2).dtype == "float32"
    assert te.if_then_else(A[i] > 0, 1.0, 0.0).dtype == "float32"
    assert te.if_then_else(A[i] > 0, A[i], 0).dtype == "float32"
    # numpy scalars act as Python numbers; numpy ints work in shapes and indices.
    assert (A[i] * np.float64(2.0)).dtype == "float32"
    assert (i + np.int64(1)).dtype == "int64"
    assert te.placeholder((np.int64(3), 4)).shape == (3, 4)
    assert "A[2]" in repr(A[np.int32(2)])
    # repr / str print the expression.
    r = repr(A[i] * 2 + 1)
    assert "A[i]" in r and "*" in r and "+" in r, r
    assert str(i + 1) == "(i + 1)"


def test_expr_hash_by_identity_and_no_truth_value():
    i = te.var("i")
    j = te.var("j")
    e = i + j
    d = {i: "i", j: "j", e: "e"}
    assert d[i] == "i" and d[j] == "j" and d[e] == "e"
    assert len({i, j, e, i}) == 3
    assert isinstance(i == j, te.Expr)  # == builds an expression
    with pytest.raises(TypeError, match="if_then_else"):
        bool(i < j)
    with pytest.raises(TypeError, match="if_then_else"):
        if i == j:
            pass
    with pytest.raises(TypeError):
        max(i, j)  # Python's max compares: the message points to te.max
    k = te.reduce_axis((0, 4), name="k")
    assert {k: 1}[k] == 1


def test_tensor_and_itervar_metadata():
    n = te.var("n")
    A = te.placeholder((n, 5), "float64", name="A")
    assert A.shape[1] == 5 and isinstance(A.shape[0], te.Expr) and A.shape[0].same_as(n)
    assert A.dtype == "float64" and A.name == "A" and A.ndim == 2
    k = te.reduce_axis((1, n), name="k")
    assert k.name == "k" and k.iter_type == "reduce" and k.min == 1
    assert isinstance(k, te.Expr) and k.dtype == "int64"
    assert "k" in repr(k)
    C = te.compute((n, 5), lambda row, col: te.sum(A[k, col] * 2, axis=k), name="C")
    assert C.op.name == "C" and C.name == "C" and C.dtype == "float64"
    ax = C.op.axis
    assert [a.name for a in ax] == ["row", "col"]  # the lambda's parameter names
    assert ax[1].extent == 5 and ax[0].iter_type == "data_par" and ax[0].dom[0] == 0
    assert [r.name for r in C.op.reduce_axis] == ["k"]
    assert [t.name for t in C.op.input_tensors] == ["A"]
    assert A.op.axis == [] and A.op.is_placeholder
    assert C.op.input_tensors[0] == A and hash(C.op.input_tensors[0]) == hash(A)
    D = te.compute((4,), lambda *idx: A[idx[0], idx[0]], name="D")
    assert [a.name for a in D.op.axis] == ["i"]
    # An IterVar is an expression: arithmetic, comparisons, indexing.
    assert (ax[0] * 2 + 1).dtype == "int64"
    assert (ax[0] < 3).dtype == "bool"
    with pytest.raises(TypeError):
        list(A)


def test_dsl_type_errors_raise_compile_error():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.placeholder((n,), "float64", name="B")
    I = te.placeholder((n,), "int32", name="I")
    i = te.var("i")
    cases = [
        (lambda: i / 2, "Div needs float"),
        (lambda: I[i] / I[i], "Div needs float"),
        (lambda: A[i] + B[i], "different dtypes"),
        (lambda: A[i] < B[i], "different dtypes"),
        (lambda: i * 0.5, "cannot be used as a int64 constant"),
        (lambda: I[i] + 2**40, "does not fit in int32"),
        (lambda: A[i] & (A[i] > 0), "bool operands"),
        (lambda: ~A[i], "needs a bool"),
        (lambda: I[i] ** 2, "Pow needs float"),
        (lambda: te.exp(I[i]), "Exp is not defined on int32"),
        (lambda: te.if_then_else(A[i], 1.0, 0.0), "condition must be bool"),
        (lambda: te.if_then_else(A[i] > 0, A[i], B[i]), "arms have different dtypes"),
        (lambda: A[i, i], "has 1 dims but was indexed with 2"),
        (lambda: A[i.astype("int32")], "must be an int64"),
        (lambda: A[1:2], "only element access"),
        (lambda: te.sum(A[i], axis=te.compute((n,), lambda j: A[j]).op.axis[0]), "not a reduce_axis"),
        (lambda: te.max(A[i]), "needs axis="),
        (lambda: te.all(A[i]), "bool conditions"),
        (lambda: te.all(), "at least one"),
        (lambda: te.var("x", dtype="int32"), "int64"),
        (lambda: te.sum(A[i] > 0, axis=te.reduce_axis((0, 3))), "cannot reduce bool"),
    ]
    for make, pattern in cases:
        with pytest.raises(rivet.CompileError, match=pattern):
            make()


def test_compute_errors():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    k = te.reduce_axis((0, n), name="k")
    with pytest.raises(rivet.CompileError, match="must return a te.Expr"):
        te.compute((n,), lambda i: 1.0, name="C")
    with pytest.raises(rivet.CompileError, match="one index argument per dim"):
        te.compute((n, n), lambda i: A[i], name="C")
    # A reduction inside another reduction's body has no stage of its own to go to.
    k2 = te.reduce_axis((0, n), name="k2")
    with pytest.raises(rivet.CompileError, match="compute 'C': a reduction .* must be the whole body"):
        te.compute((n,), lambda i: te.sum(A[k] * te.sum(A[k2], axis=k2), axis=k), name="C")
    with pytest.raises(rivet.CompileError, match="multi-output"):
        te.compute((n,), lambda i: (A[i], A[i]), name="C")
    # Reversed or overflowing constant ranges are refused where they are written (a reversed
    # one was an internal error at build; [MAX, MIN) wrapped to an extent of 1).
    with pytest.raises(rivet.CompileError, match=r"reduce_axis 'r': the range \[5, 2\) is reversed"):
        te.reduce_axis((5, 2), name="r")
    with pytest.raises(rivet.CompileError, match="reversed"):
        te.reduce_axis((2**63 - 1, -(2**63)), name="r")
    with pytest.raises(rivet.CompileError, match="more than an int64 extent"):
        te.reduce_axis((-(2**63), 2**63 - 1), name="r")
    # An exception inside fcompute comes out unchanged.
    with pytest.raises(ZeroDivisionError):
        te.compute((n,), lambda i: A[i] * (1 / 0), name="C")


# ---- math functions -------------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])

UNARY = {
    # name: (te function, numpy float64 reference, input transform, tolerance class)
    # sqrt, abs, floor, ceil, neg are exact (IEEE); the float64 reference rounded to the dtype
    # is the correctly rounded result, so they are bit-exact. rsqrt (1 / sqrt: two roundings)
    # and sigmoid (1 / (1 + exp(-x)) in the dtype) count as transcendentals.
    "exp": (te.exp, np.exp, lambda x: x * 3, "transcendental"),
    "log": (te.log, np.log, lambda x: np.abs(x) * 4, "transcendental"),
    "sqrt": (te.sqrt, np.sqrt, lambda x: np.abs(x) * 9, "exact"),
    "rsqrt": (te.rsqrt, lambda x: 1 / np.sqrt(x), lambda x: np.abs(x) * 9, "transcendental"),
    "tanh": (te.tanh, np.tanh, lambda x: x * 2, "transcendental"),
    "sigmoid": (te.sigmoid, lambda x: 1 / (1 + np.exp(-x)), lambda x: x * 5, "transcendental"),
    "abs": (te.abs, np.abs, lambda x: x, "exact"),
    "floor": (te.floor, np.floor, lambda x: x * 7, "exact"),
    "ceil": (te.ceil, np.ceil, lambda x: x * 7, "exact"),
    "erf": (te.erf, _erf, lambda x: x * 2, "transcendental"),
    "neg": (lambda e: -e, np.negative, lambda x: x, "exact"),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fname", sorted(UNARY))
def test_unary_math(fname, dtype, target, rng):
    fn, ref, prep, op = UNARY[fname]
    n = te.var("n")
    A = te.placeholder((n,), dtype, name="A")
    C = te.compute((n,), lambda i: fn(A[i]), name="C")
    f = build(C, [A, C], target)
    a = prep(random_array(rng, (67,), np.float64)).astype(dtype)
    (c,) = run(f, [a], [((67,), dtype)])
    # The float64 reference is rounded to the dtype by assert_matches. sigmoid rounds twice
    # after its exp (1 + e, then 1 / that): one more ulp than the policy's default 2.
    ulps = 3 if fname == "sigmoid" else None
    assert_matches(c, ref(a.astype(np.float64)), op=op, against="numpy", ulps=ulps)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pow(dtype, target, rng):
    n = te.var("n")
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    P = te.compute((n,), lambda i: te.pow(A[i], B[i]), name="P")
    Q = te.compute((n,), lambda i: A[i] ** 2 + 2 ** B[i] + te.pow(A[i], 0.5), name="Q")
    f = build([P, Q], [A, B, P, Q], target)
    a = np.abs(random_array(rng, (41,), np.float64)).astype(dtype) * 2
    b = random_array(rng, (41,), dtype) * 3
    p, q = run(f, [a, b], [((41,), dtype)] * 2)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert_matches(p, a64**b64, op="transcendental", against="numpy")
    # Three positive terms of <= 1 ulp each and two additions (0.5 ulp each): <= 4 ulp.
    assert_matches(q, a64**2 + 2**b64 + np.sqrt(a64), op="transcendental", against="numpy", ulps=4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_is_computed_in_float32_and_rounded_at_the_store(dtype, target):
    # docs/tolerance.md: float16 / bfloat16 are loaded as float32, computed in float32 and
    # rounded by the store (and constants to their dtype): a float32 reference of the same
    # operations, rounded once, is bit-exact. (torch's own half ops round after each one.)
    tdt = getattr(torch, dtype)
    n = te.var("n")
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    C = te.compute((n,), lambda i: A[i] * B[i] + A[i] * 0.1 - te.exp(B[i]), name="C")
    f = rivet.to_pytorch_func(build(C, [A, B, C], target))
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(300, generator=gen).to(tdt)
    b = torch.randn(300, generator=gen).to(tdt)
    c = poison(torch.empty(300, dtype=tdt))
    f(a, b, c)
    k = torch.tensor(0.1, dtype=tdt).float()  # the constant, rounded to the dtype
    exp32 = torch.from_numpy(np.exp(b.float().numpy().astype(np.float64)).astype(np.float32))
    want = (a.float() * b.float() + a.float() * k - exp32).to(tdt)
    # exp is musl's in float32 (<= 1 ulp of float32 from the rounded float64 value): it can
    # move the rounding to the 16-bit dtype by one ulp of that dtype, nothing else can.
    assert_matches(c, want, op="transcendental", against="numpy", ulps=1)
    ok = (a.float() * b.float() + a.float() * k).to(tdt)
    D = te.compute((n,), lambda i: A[i] * B[i] + A[i] * 0.1, name="D")
    g = rivet.to_pytorch_func(build(D, [A, B, D], target))
    d = poison(torch.empty(300, dtype=tdt))
    g(a, b, d)
    assert_matches(d, ok, op="exact", against="torch")


# ---- operators ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_operators(dtype, target, rng):
    n = te.var("n")
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    exprs = {
        "add": (lambda i: A[i] + B[i], lambda a, b: a + b),
        "sub": (lambda i: A[i] - B[i], lambda a, b: a - b),
        "mul": (lambda i: A[i] * B[i], lambda a, b: a * b),
        "div": (lambda i: A[i] / B[i], lambda a, b: a / b),
        "rsub": (lambda i: 2 - A[i], lambda a, b: 2 - a),
        "rdiv": (lambda i: 3.0 / A[i], lambda a, b: 3.0 / a),
        "scaled": (lambda i: A[i] * 2 + 0.5, lambda a, b: a * 2 + 0.5),
        "neg": (lambda i: -A[i] + (+B[i]), lambda a, b: -a + b),
        "abs": (lambda i: abs(A[i]), lambda a, b: np.abs(a)),
        "max": (lambda i: te.max(A[i], B[i]), np.maximum),
        "min": (lambda i: te.min(A[i], 0.25), lambda a, b: np.minimum(a, 0.25)),
        "rmax": (lambda i: te.max(0.0, A[i]), lambda a, b: np.maximum(0.0, a)),
    }
    names = sorted(exprs)
    outs = [te.compute((n,), exprs[k][0], name=k) for k in names]
    f = build(outs, [A, B, *outs], target)
    a = random_array(rng, (53,), dtype) * 4
    b = random_array(rng, (53,), dtype)
    got = run(f, [a, b], [((53,), dtype)] * len(names))
    for k, g in zip(names, got):
        ref = exprs[k][1](a, b)  # numpy in the same dtype: one rounding per operation
        assert_matches(g, np.asarray(ref, dtype=dtype), op="exact", err_msg=k)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_floordiv_mod_python_semantics(dtype, target, rng):
    n = te.var("n")
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    Q = te.compute((n,), lambda i: A[i] // B[i], name="Q")
    R = te.compute((n,), lambda i: A[i] % B[i], name="R")
    f = build([Q, R], [A, B, Q, R], target)
    a = random_array(rng, (64,), dtype) * 10
    b = random_array(rng, (64,), dtype) * 3
    q, r = run(f, [a, b], [((64,), dtype)] * 2)
    # The documented semantics, in the dtype: floor(a / b), a - floor(a / b) * b.
    qref = np.floor(a / b)
    close(q, qref)
    close(r, a - qref * b)
    # Same sign as the divisor, as in Python.
    nz = r != 0
    assert np.all(np.sign(r[nz]) == np.sign(b[nz]))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_int_operators_python_semantics(dtype, target, rng):
    n = te.var("n")
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    exprs = {
        "fdiv": (lambda i: A[i] // B[i], lambda a, b: a // b),
        "fmod": (lambda i: A[i] % B[i], lambda a, b: a % b),
        "fdiv3": (lambda i: A[i] // 3, lambda a, b: a // 3),
        "fmodm3": (lambda i: A[i] % -3, lambda a, b: a % -3),
        "rfdiv": (lambda i: -7 // B[i], lambda a, b: -7 // b),
        "rmod": (lambda i: 7 % B[i], lambda a, b: 7 % b),
        "tefdiv": (lambda i: te.floordiv(A[i], B[i]), lambda a, b: a // b),
        "tefmod": (lambda i: te.floormod(A[i], 4), lambda a, b: a % 4),
        "arith": (lambda i: (A[i] + 3) * B[i] - A[i], lambda a, b: (a + 3) * b - a),
        "neg": (lambda i: -A[i], lambda a, b: -a),
        "abs": (lambda i: te.abs(A[i]), lambda a, b: np.abs(a)),
        "max": (lambda i: te.max(A[i], B[i]), np.maximum),
        "min": (lambda i: te.min(A[i], 2), lambda a, b: np.minimum(a, 2)),
    }
    names = sorted(exprs)
    outs = [te.compute((n,), exprs[k][0], name=k) for k in names]
    f = build(outs, [A, B, *outs], target)
    a = rng.integers(-50, 51, size=97).astype(dtype)
    b = rng.integers(1, 12, size=97).astype(dtype) * np.where(rng.random(97) < 0.5, -1, 1).astype(dtype)
    got = run(f, [a, b], [((97,), dtype)] * len(names))
    for k, g in zip(names, got):
        np.testing.assert_array_equal(g, np.asarray(exprs[k][1](a, b), dtype=dtype), err_msg=k)


def test_index_arithmetic(target, rng):
    A = te.placeholder((8,), "float32", name="A")
    C = te.compute(
        (8,),
        lambda i: A[(i * 3 + 1) % 8] + A[7 - i] * te.cast("float32", i // 2) + te.cast("float32", i % 3),
        name="C",
    )
    f = build(C, [A, C], target)
    a = random_array(rng, (8,))
    (c,) = run(f, [a], [((8,), "float32")])
    i = np.arange(8)
    ref = a[(i * 3 + 1) % 8] + a[7 - i] * (i // 2).astype(np.float32) + (i % 3).astype(np.float32)
    close(c, ref)  # the same float32 operations: bit-exact


# ---- comparisons, selection, logic, casts -----------------------------------------------------


def test_comparisons_and_if_then_else(target, rng):
    n = te.var("n")
    A = te.placeholder((n,), "int32", name="A")
    B = te.placeholder((n,), "int32", name="B")
    X = te.placeholder((n,), "float32", name="X")
    cmps = {
        "lt": (lambda a, b: a < b, np.less),
        "le": (lambda a, b: a <= b, np.less_equal),
        "gt": (lambda a, b: a > b, np.greater),
        "ge": (lambda a, b: a >= b, np.greater_equal),
        "eq": (lambda a, b: a == b, np.equal),
        "ne": (lambda a, b: a != b, np.not_equal),
    }
    names = sorted(cmps)
    bools = [te.compute((n,), lambda i, op=cmps[k][0]: op(A[i], B[i]), name=k) for k in names]
    sel = te.compute((n,), lambda i: te.if_then_else(A[i] < B[i], X[i], X[i] * 2), name="sel")
    num = te.compute((n,), lambda i: te.if_then_else(0 < X[i], 1.0, -1.0), name="num")
    isel = te.compute((n,), lambda i: te.if_then_else(A[i] == 3, A[i] + 100, B[i]), name="isel")
    outs = [*bools, sel, num, isel]
    f = build(outs, [A, B, X, *outs], target)
    a = rng.integers(-4, 5, size=61).astype(np.int32)
    b = rng.integers(-4, 5, size=61).astype(np.int32)
    x = random_array(rng, (61,))
    got = run(f, [a, b, x], [((61,), "bool")] * 6 + [((61,), "float32")] * 2 + [((61,), "int32")])
    for k, g in zip(names, got):
        np.testing.assert_array_equal(g, cmps[k][1](a, b), err_msg=k)
    np.testing.assert_array_equal(got[6], np.where(a < b, x, x * 2))
    np.testing.assert_array_equal(got[7], np.where(x > 0, 1.0, -1.0).astype(np.float32))
    np.testing.assert_array_equal(got[8], np.where(a == 3, a + 100, b))


def test_logical_ops(target, rng):
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    exprs = {
        "and": (lambda i: (A[i] > 0) & (B[i] > 0), lambda a, b: (a > 0) & (b > 0)),
        "or": (lambda i: (A[i] > 0) | (B[i] > 0), lambda a, b: (a > 0) | (b > 0)),
        "inv": (lambda i: ~(A[i] > 0), lambda a, b: ~(a > 0)),
        "not": (lambda i: te.logical_not(B[i] > 0), lambda a, b: ~(b > 0)),
        "all": (lambda i: te.all(A[i] > 0, B[i] > 0, A[i] < B[i]), lambda a, b: (a > 0) & (b > 0) & (a < b)),
        "any": (lambda i: te.any(A[i] > 0, B[i] > 0, A[i] < -1.2), lambda a, b: (a > 0) | (b > 0) | (a < -1.2)),
        "pyb": (lambda i: ((A[i] > 0) & True) | False, lambda a, b: a > 0),
        "rpyb": (lambda i: False | (True & (B[i] < 0)), lambda a, b: b < 0),
        "eqb": (lambda i: (A[i] > 0) == (B[i] > 0), lambda a, b: (a > 0) == (b > 0)),
    }
    names = sorted(exprs)
    outs = [te.compute((n,), exprs[k][0], name=k) for k in names]
    sel = te.compute((n,), lambda i: te.if_then_else(te.all(A[i] > 0, ~(B[i] > 0)), A[i], B[i]), name="sel")
    f = build([*outs, sel], [A, B, *outs, sel], target)
    a = random_array(rng, (47,))
    b = random_array(rng, (47,))
    got = run(f, [a, b], [((47,), "bool")] * len(names) + [((47,), "float32")])
    for k, g in zip(names, got):
        np.testing.assert_array_equal(g, exprs[k][1](a, b), err_msg=k)
    np.testing.assert_array_equal(got[-1], np.where((a > 0) & ~(b > 0), a, b))


def test_casts(target, rng):
    n = te.var("n")
    F = te.placeholder((n,), "float32", name="F")
    I = te.placeholder((n,), "int32", name="I")
    outs = {
        "f2i": (lambda i: te.cast("int32", F[i]), "int32", lambda f, x: f.astype(np.int32)),
        "f2i64": (lambda i: F[i].astype("int64"), "int64", lambda f, x: f.astype(np.int64)),
        "f2b": (lambda i: te.cast("bool", F[i]), "bool", lambda f, x: f != 0),
        "i2f": (lambda i: te.cast("float32", I[i]) / 4, "float32", lambda f, x: x.astype(np.float32) / 4),
        "i2f64": (lambda i: I[i].astype("float64"), "float64", lambda f, x: x.astype(np.float64)),
        "i2b": (lambda i: te.cast("bool", I[i]), "bool", lambda f, x: x != 0),
        "i2i64": (lambda i: te.cast("int64", I[i]) * 3_000_000_000, "int64", lambda f, x: x.astype(np.int64) * 3_000_000_000),
        "b2f": (lambda i: te.cast("float32", F[i] > 0), "float32", lambda f, x: (f > 0).astype(np.float32)),
        "b2i": (lambda i: te.cast("int32", I[i] > 0) + te.cast("int32", F[i] < 0), "int32", lambda f, x: (x > 0).astype(np.int32) + (f < 0)),
        "f2f64": (lambda i: F[i].astype("float64") * 0.1, "float64", lambda f, x: f.astype(np.float64) * 0.1),
        "idx": (lambda i: te.cast("float32", i) + F[i], "float32", lambda f, x: np.arange(len(f), dtype=np.float32) + f),
    }
    names = sorted(outs)
    ts = [te.compute((n,), outs[k][0], name=k) for k in names]
    f = build(ts, [F, I, *ts], target)
    fv = random_array(rng, (59,)) * 20
    fv[:3] = [0.0, -0.0, 2.9999]
    iv = rng.integers(-9, 10, size=59).astype(np.int32)
    got = run(f, [fv, iv], [((59,), outs[k][1]) for k in names])
    for k, g in zip(names, got):
        ref = np.asarray(outs[k][2](fv, iv), dtype=outs[k][1])
        assert_matches(g, ref, op="exact", err_msg=k)


# ---- reductions ------------------------------------------------------------------------------

REDUCERS = {
    "sum": (te.sum, np.sum),
    "max": (te.max, np.max),
    "min": (te.min, np.min),
    "prod": (te.prod, np.prod),
}


@pytest.mark.parametrize("op", sorted(REDUCERS))
def test_reductions_one_and_two_axes(op, target, rng):
    red, ref = REDUCERS[op]
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n, m, 4), "float32", name="A")
    k = te.reduce_axis((0, 4), name="k")
    j = te.reduce_axis((0, m), name="j")
    j2 = te.reduce_axis((0, m), name="j2")
    k2 = te.reduce_axis((0, 4), name="k2")
    one = te.compute((n, m), lambda a, b: red(A[a, b, k], axis=k), name="one")
    two = te.compute((n,), lambda a: red(A[a, j2, k2] * 2, axis=[j2, k2]), name="two")
    # Positional axis, TVM style, and a sub-range reduce axis.
    part = te.compute((n, 4), lambda a, c: red(A[a, j, c], j), name="part")
    f = build([one, two, part], [A, one, two, part], target)
    a = random_array(rng, (6, 5, 4))
    o1, o2, o3 = run(f, [a], [((6, 5), "float32"), ((6,), "float32"), ((6, 4), "float32")])
    a64 = a.astype(np.float64)
    for got, x, axis, k in [(o1, a64, 2, 4), (o2, a64 * 2, (1, 2), 5 * 4), (o3, a64, 1, 5)]:
        want = ref(x, axis=axis)  # float64: exact for these sizes
        if op in ("max", "min"):
            assert_matches(got, want, op="exact")
        else:
            # sum: error relative to the sum of |terms|; prod: relative to |prod|.
            terms = np.abs(x).sum(axis=axis) if op == "sum" else None
            assert_matches(got, want, op="reduction", k=k, terms=terms)


def test_int_reductions_and_offset_axis(target, rng):
    A = te.placeholder((5, 9), "int32", name="A")
    k = te.reduce_axis((2, 7), name="k")
    S = te.compute((5,), lambda i: te.sum(A[i, k], axis=k), name="S")
    M = te.compute((5,), lambda i: te.max(A[i, k] * -1, axis=k), name="M")
    f = build([S, M], [A, S, M], target)
    a = rng.integers(-100, 100, size=(5, 9)).astype(np.int32)
    s, mx = run(f, [a], [((5,), "int32")] * 2)
    np.testing.assert_array_equal(s, a[:, 2:7].sum(axis=1))
    np.testing.assert_array_equal(mx, (-a[:, 2:7]).max(axis=1))


# ---- multi-stage programs ------------------------------------------------------------------------


def softmax(n, m):
    A = te.placeholder((n, m), "float32", name="A")
    k = te.reduce_axis((0, m), name="k")
    M = te.compute((n,), lambda i: te.max(A[i, k], axis=k), name="M")
    E = te.compute((n, m), lambda i, j: te.exp(A[i, j] - M[i]), name="E")
    k2 = te.reduce_axis((0, m), name="k2")
    S = te.compute((n,), lambda i: te.sum(E[i, k2], axis=k2), name="S")
    C = te.compute((n, m), lambda i, j: E[i, j] / S[i], name="C")
    return A, M, E, S, C


@pytest.mark.parametrize("inline", [False, True], ids=["root", "inline"])
def test_softmax(inline, target, rng):
    n, m = te.var("n"), te.var("m")
    A, M, E, S, C = softmax(n, m)
    s = rivet.create_schedule(C)
    if inline:
        s[E].compute_inline()
    f = build(C, [A, C], target, sched=s)
    for shape in [(3, 17), (1, 1)]:
        x = torch.from_numpy(random_array(rng, shape) * 4)
        z = poison(torch.empty(shape))
        rivet.to_pytorch_func(f)(x, z)
        assert_matches(z, torch.softmax(x, dim=1), op="composite", against="torch", k=shape[1])


def test_intermediates_as_outputs(target, rng):
    n, m = te.var("n"), te.var("m")
    A, M, E, S, C = softmax(n, m)
    f = build([C, M], [A, M, C], target)
    x = random_array(rng, (4, 9))
    mx, c = run(f, [x], [((4,), "float32"), ((4, 9), "float32")])
    np.testing.assert_array_equal(mx, x.max(axis=1))
    ref = torch.softmax(torch.from_numpy(x), dim=1).numpy()
    assert_matches(c, ref, op="composite", against="torch", k=9)


# ---- the seed GEMM --------------------------------------------------------------------------------


def gemm(n=None):
    n = te.var("n") if n is None else n
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, C


def test_seed_gemm_56_through_torch(target, rng):
    A, B, C = gemm()
    s = rivet.create_schedule(C)
    mod = rivet.build(s, [A, B, C], target=target, name="mm")
    f = rivet.to_pytorch_func(mod["mm"])
    x = torch.from_numpy(random_array(rng, (56, 56)))
    y = torch.from_numpy(random_array(rng, (56, 56)))
    z = poison(torch.empty(56, 56))
    ptr = z.data_ptr()
    assert f(x, y, z) is None
    assert z.data_ptr() == ptr
    assert_matches(z, torch.mm(x, y), op="contraction", against="torch", k=56, terms=abs_mm(x, y))


def test_gemm_symbolic_sizes_one_build(target, rng):
    A, B, C = gemm()
    f = rivet.to_pytorch_func(build(C, [A, B, C], target, name="mm"))
    for size in (1, 7, 56, 100):
        x = torch.from_numpy(random_array(rng, (size, size)))
        y = torch.from_numpy(random_array(rng, (size, size)))
        z = poison(torch.empty(size, size))
        f(x, y, z)
        assert_matches(z, torch.mm(x, y), op="contraction", against="torch", k=size, terms=abs_mm(x, y))


def test_gemm_views_in_place(target, rng):
    A, B, C = gemm()
    f = rivet.to_pytorch_func(build(C, [A, B, C], target, name="mm"))
    xt = torch.from_numpy(random_array(rng, (33, 33)))
    x = xt.t()  # transposed view
    ybig = torch.from_numpy(random_array(rng, (50, 70)))
    y = ybig[5:38, 3:69:2]  # sliced, strided view
    assert not x.is_contiguous() and not y.is_contiguous()
    base = torch.from_numpy(random_array(rng, (70, 100)))
    before = base.clone()
    z = base[2:68:2, 1:100:3]  # strided output with gaps
    assert z.shape == (33, 33)
    poison(z)
    f(x, y, z)
    assert_matches(z, x @ y, op="contraction", against="torch", k=33, terms=abs_mm(x, y))
    mask = torch.ones_like(base, dtype=torch.bool)
    mask[2:68:2, 1:100:3] = False
    assert torch.equal(base[mask], before[mask]), "elements outside the output view were written"
    # Inputs were not touched.
    assert torch.equal(xt.t(), x) and torch.equal(ybig[5:38, 3:69:2], y)


def test_inputs_only_call_allocates(target, rng):
    A, B, C = gemm()
    mod = rivet.build(rivet.create_schedule(C), [A, B, C], target=target, name="mm")
    x = random_array(rng, (9, 9))
    y = random_array(rng, (9, 9))
    raw = mod["mm"](x, y)
    assert isinstance(raw, rivet.Tensor) and raw.shape == (9, 9) and raw.dtype == "float32"
    assert_matches(raw.numpy(), x @ y, op="contraction", against="numpy", k=9, terms=abs_mm(x, y))
    t = rivet.to_pytorch_func(mod["mm"])(torch.from_numpy(x), torch.from_numpy(y))
    assert isinstance(t, torch.Tensor) and t.shape == (9, 9)
    assert_matches(t, x @ y, op="contraction", against="numpy", k=9, terms=abs_mm(x, y))
    # Several outputs come back as a tuple, in argument order.
    n = te.var("n")
    P = te.placeholder((n,), "float64", name="P")
    D = te.compute((n,), lambda i: P[i] * 2, name="D")
    E = te.compute((n,), lambda i: P[i] + 1, name="E")
    g = build([D, E], [P, D, E], target)
    p = random_array(rng, (5,), np.float64)
    d, e = g(p)
    np.testing.assert_array_equal(d.numpy(), p * 2)
    np.testing.assert_array_equal(e.numpy(), p + 1)


@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_a_reduction_inside_an_expression_becomes_a_stage_of_its_own(target):
    """`A[i, j] / te.sum(A[i, k], k)` and `te.sum(...) * 2 + te.max(...)` in one stage, as users
    write them: each distinct reduction becomes a stage over the data axes it uses (a row
    statistic once per row), named after the user's stage, and the results are numpy's."""
    m, n = te.var("m"), te.var("n")
    A = te.placeholder((m, n), "float32", name="A")
    k = te.reduce_axis((0, n), name="k")
    k2 = te.reduce_axis((0, n), name="k2")
    N = te.compute((m, n), lambda i, j: A[i, j] / te.sum(A[i, k], axis=k), name="N")
    k3 = te.reduce_axis((0, n), name="k3")
    D = te.compute((m,), lambda i: te.sum(A[i, k2], axis=k2) * 2.0 + te.max(A[i, k3], axis=k3), name="D")
    s = rivet.create_schedule([N, D])
    mod = rivet.build(s, [A, N, D], target=target, name="f")
    ir = mod.get_source("ir")
    assert "N_sum0" in ir and "D_sum0" in ir and "D_max1" in ir, ir
    f = mod["f"]
    rng = np.random.default_rng()
    for rows, cols in [(1, 1), (3, 17), (17, 97)]:
        a = rng.uniform(0.5, 2.0, (rows, cols)).astype(np.float32)
        nv = np.full((rows, cols), np.nan, np.float32)
        dv = np.full((rows,), np.nan, np.float32)
        f(a, nv, dv)
        np.testing.assert_allclose(nv, a / a.sum(1, keepdims=True), rtol=2e-6)
        np.testing.assert_allclose(dv, a.sum(1) * 2 + a.max(1), rtol=2e-6)


def test_more_reductions_in_one_body_than_the_limit_is_a_clear_error():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    ks = [te.reduce_axis((0, n), name=f"k{q}") for q in range(65)]

    def body(i):
        e = A[i]
        for k in ks:
            e = e + te.sum(A[k], axis=k)
        return e

    with pytest.raises(rivet.CompileError, match="compute 'C': more than 64 reductions in one stage's body"):
        te.compute((n,), body, name="C")


def test_a_reduction_used_twice_is_one_stage():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    k = te.reduce_axis((0, n), name="k")
    total = te.sum(A[k], axis=k)  # one node, read twice
    C = te.compute((n,), lambda i: A[i] * total + total, name="C")
    mod = rivet.build(rivet.create_schedule(C), [A, C], target="cpu", name="f")
    ir = mod.get_source("ir")
    assert "C_sum0" in ir and "C_sum1" not in ir, ir
    a = np.random.default_rng().uniform(-1, 1, 33).astype(np.float32)
    out = np.full(33, np.nan, np.float32)
    mod["f"](a, out)
    np.testing.assert_allclose(out, a * a.sum() + a.sum(), rtol=1e-5, atol=1e-5)


def test_the_gradient_goes_through_a_reduction_inside_an_expression():
    """d(A / rowsum(A)) against torch's autograd in float64, on fresh data."""
    m, n = te.var("m"), te.var("n")
    A = te.placeholder((m, n), "float32", name="A")
    k = te.reduce_axis((0, n), name="k")
    N = te.compute((m, n), lambda i, j: A[i, j] / te.sum(A[i, k], axis=k), name="N")
    H = te.placeholder((m, n), "float32", name="H")
    (G,) = te.gradient(N, [A], H)
    g_fn = rivet.build(rivet.create_schedule(G), [A, H, G], target="cpu", name="g")["g"]
    rng = np.random.default_rng()
    for rows, cols in [(1, 1), (4, 7), (9, 33)]:
        a = rng.uniform(0.5, 2, (rows, cols)).astype(np.float32)
        h = rng.standard_normal((rows, cols)).astype(np.float32)
        g = np.full_like(a, np.nan)
        g_fn(a, h, g)
        ta = torch.tensor(a, dtype=torch.float64, requires_grad=True)
        (ta / ta.sum(1, keepdim=True)).backward(torch.tensor(h, dtype=torch.float64))
        np.testing.assert_allclose(g, ta.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_a_shared_dag_around_a_reduction_is_split_once_and_refused_fast():
    """A body of 2^60 tree nodes (`e = e + e` over one reduction) is split node by node: the
    compute returns with one reduction stage (a tree walk would never end), and the build
    refuses its size."""
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    k = te.reduce_axis((0, n), name="k")
    e = te.sum(A[k], axis=k)
    for _ in range(60):
        e = e + e
    C = te.compute((n,), lambda i: A[i] + e, name="C")
    with pytest.raises(rivet.CompileError, match="stage 'C' expands to up to .* expression nodes"):
        rivet.build(rivet.create_schedule(C), [A, C], target="cpu", name="f")
