"""Hostile programs against the compiler's memory-safety promise:
index arithmetic that would wrap int64, temporaries whose size wraps or cannot be allocated,
expressions too deep for the passes' recursion, huge split factors, and checked mode.

Every case ends in a typed rivet.Error or a correct result, and no input is modified.
"""

import numpy as np
import pytest
import torch

import rivet
from rivet import te

from conftest import abs_mm, assert_bits_equal, assert_matches, bits, random_array

# `target` (every backend) comes from conftest.py.
BIG = [2**31 - 1, 2**31, 2**61, 2**62, 2**63 - 1, (2**64 + 5) // 7]


def build(outs, args, target, **kw):
    return rivet.build(rivet.create_schedule(outs), args, target=target, name="f", **kw)["f"]


# ---- 1. index arithmetic that wraps ------------------------------------------------------------


@pytest.mark.parametrize("k", BIG)
def test_symbolic_index_overflow_is_refused_per_call(target, rng, k):
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((m,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i * k], name="B")
    f = build(B, [A, B], target)
    a = random_array(rng, (8,), "float32")
    before = bits(a)
    # n = 1: only A[0] is read, which is in bounds: a correct result.
    out = np.full(1, np.nan, np.float32)
    f(a, out)
    assert out[0] == a[0]
    # n = 5: the index reaches 4 * k, out of bounds or past int64: a typed error, no read.
    with pytest.raises(rivet.ShapeError, match="A"):
        f(a, np.zeros(5, np.float32))
    assert_bits_equal(a, before)


def test_a_check_shared_by_two_loop_nests_holds_in_both(target, rng):
    # Soak finding 0x436a3da40ee8a398: the check "A dim 0: i < h" arises in P's nest, inside
    # a loop over h (vacuous when h == 0), and in C's nest, outside any such loop. The checks
    # were deduplicated by message, so only the vacuous form was kept and C read rows of an
    # empty A. Each nest now keeps its own form.
    h = te.var("h")
    A = te.placeholder((h, 5), "float64", name="A")
    P = te.compute((5, h), lambda i, j: A[i, (j * 4 + 7) % 5] + 1.0, name="P")
    k = te.reduce_axis((0, h), name="k")
    S = te.compute((5,), lambda i: te.sum(P[i, k], axis=k), name="S")
    C = te.compute((5,), lambda i: A[i, 0] + S[i], name="C")
    f = build(C, [A, C], target)
    for rows in [0, 1, 4]:
        with pytest.raises(rivet.ShapeError, match="A"):
            f(np.zeros((rows, 5)), np.zeros(5))
    a = random_array(rng, (6, 5), "float64")
    out = np.full(5, np.nan)
    f(a, out)
    want = a[:5, 0] + np.array([sum(a[i, (j * 4 + 7) % 5] + 1.0 for j in range(6)) for i in range(5)])
    # The same float64 additions in the same order (k ascending from 0): bit-exact.
    assert_matches(out, want, op="exact")


@pytest.mark.parametrize("k", BIG)
def test_static_index_overflow_is_a_build_error(target, k):
    A = te.placeholder((8,), "float32", name="A")
    B = te.compute((8,), lambda i: A[i * k], name="B")
    with pytest.raises(rivet.CompileError, match="A"):
        build(B, [A, B], target)


@pytest.mark.parametrize(
    "index",
    [
        lambda i: ((i + 2**62) * 4) // 4 - 2**62,  # wraps back into range: still refused
        lambda i: i * 2**62 // 2**62,
        lambda i: i * 2 + (2**63 - 8) - (2**63 - 8),
        lambda i: i * 3 + (2**63 - 1) - (2**63 - 1),
        lambda i: (0 - i - (2**63 - 1)) * -1 - (2**63 - 1),
    ],
)
def test_wrapping_intermediates_are_refused_statically(target, index):
    A = te.placeholder((8,), "float32", name="A")
    B = te.compute((8,), lambda i: A[index(i)], name="B")
    with pytest.raises(rivet.CompileError):
        build(B, [A, B], target)


@pytest.mark.parametrize(
    "index",
    [
        lambda i: (i + 2**62) - 2**62,
        lambda i: (i + (2**63 - 8)) - (2**63 - 8),
        lambda i: (i - 2**62) * 2 // 2 + 2**62,
    ],
)
def test_exact_arithmetic_near_the_limit_still_builds(target, rng, index):
    # Intermediates close to the int64 limits that never leave them: a correct result.
    A = te.placeholder((8,), "float32", name="A")
    B = te.compute((8,), lambda i: A[index(i)], name="B")
    f = build(B, [A, B], target)
    a = random_array(rng, (8,), "float32")
    out = np.full(8, np.nan, np.float32)
    f(a, out)
    np.testing.assert_array_equal(out, a)


def test_guard_on_an_overflowing_index_is_refused(target):
    # A guard that compares the wrapped value would make the read "in bounds" but wrong.
    A = te.placeholder((8,), "float32", name="A")
    B = te.compute(
        (8,), lambda i: te.if_then_else(i * 2**61 < 8, A[i * 2**61], 0.0), name="B"
    )
    with pytest.raises(rivet.CompileError, match="overflow"):
        build(B, [A, B], target)


def test_loop_extent_overflow_is_refused_per_call(target, rng):
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n * n,), lambda i: A[i % n], name="B")
    f = build(B, [A, B], target)
    a = torch.zeros(1).expand(2**32)  # n = 2**32: n * n = 2**64 wraps
    with pytest.raises(rivet.ShapeError):
        f(a, torch.zeros(4))


# ---- 2 and 3. temporaries -------------------------------------------------------------------


# The temporaries below exist as written only: the default CPU schedule would inline them
# (no temporary at all), so those builds say `default_schedule=False`.
def square_temp():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    T = te.compute((n, n), lambda i, j: A[i] + A[j], name="T")
    B = te.compute((1,), lambda _: T[0, 0] * 2.0, name="B")
    return A, B


@pytest.mark.parametrize("n", [2**31, 2**32 + 1, 2**62])
def test_temporary_size_that_wraps_is_a_memory_error(target, n):
    A, B = square_temp()
    f = build(B, [A, B], target, default_schedule=False)
    a = torch.ones(1).expand(n)
    out = torch.full((1,), float("nan"))
    with pytest.raises(rivet.MemoryError, match="T"):
        f(a, out)
    assert torch.isnan(out).all()


def test_temporary_the_system_refuses_is_a_memory_error(target):
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    T = te.compute((n,), lambda i: A[i] * 2.0, name="T")
    B = te.compute((1,), lambda _: T[0] + 1.0, name="B")
    f = build(B, [A, B], target, default_schedule=False)
    # 2**40 float32 = 4 TiB: under MAX_ALLOC_BYTES, but no machine here has it.
    with pytest.raises(rivet.MemoryError) as e:
        f(torch.ones(1).expand(2**40), torch.zeros(1))
    assert isinstance(e.value, MemoryError) and isinstance(e.value, rivet.Error)
    # The kernel still works afterwards.
    out = torch.zeros(1)
    f(torch.ones(3), out)
    assert out.item() == 3.0


def test_static_temporary_over_the_limit_is_refused_at_build(target):
    A = te.placeholder((4,), "float32", name="A")
    T = te.compute((2**24, 2**24), lambda i, j: A[0] + 1.0, name="T")
    B = te.compute((1,), lambda _: T[0, 0], name="B")
    with pytest.raises(rivet.MemoryError, match="MAX_ALLOC_BYTES"):
        build(B, [A, B], target, default_schedule=False)


def test_temporary_inside_a_parallel_loop(target, rng):
    # Each parallel iteration allocates; a refused allocation leaves every chunk cleanly.
    n = te.var("n")
    A = te.placeholder((n, n), "float32", name="A")
    T = te.compute((n, n), lambda i, j: A[i, j] * 2.0, name="T")
    B = te.compute((n, n), lambda i, j: T[i, j] + 1.0, name="B")
    s = rivet.create_schedule(B)
    i, j = B.op.axis
    s[T].compute_at(s[B], i)
    s[B].parallel(i)
    f = rivet.build(s, [A, B], target=target, name="f")["f"]
    a = random_array(rng, (64, 64), "float32")
    out = np.full((64, 64), np.nan, np.float32)
    f(a, out)
    assert_matches(out, a * 2 + 1, op="exact")


# ---- 6. deep expressions --------------------------------------------------------------------


def test_deep_float_expression_is_a_compile_error():
    A = te.placeholder((4,), "float32", name="A")
    e = A[0]
    with pytest.raises(rivet.CompileError, match="MAX_EXPR_DEPTH"):
        for _ in range(10_000):
            e = e + 1.0


def test_deep_index_expression_is_a_compile_error():
    A = te.placeholder((4,), "float32", name="A")
    with pytest.raises(rivet.CompileError, match="MAX_EXPR_DEPTH"):
        te.compute((4,), lambda i: A[_deep(i)], name="B")


def _deep(i):
    for _ in range(10_000):
        i = i + 1
    return i


def test_expression_at_the_depth_limit_builds_and_runs(target, rng):
    A = te.placeholder((4,), "float32", name="A")
    B = te.compute((4,), lambda i: _chain(A[i], 900), name="B")
    f = build(B, [A, B], target)
    a = random_array(rng, (4,), "float32")
    out = np.full(4, np.nan, np.float32)
    f(a, out)
    ref = a.copy()
    for _ in range(900):
        ref = ref + np.float32(1.0)
    np.testing.assert_array_equal(out, ref)


def _chain(e, n):
    for _ in range(n):
        e = e + 1.0
    return e


def test_exponential_inlining_is_refused():
    # Each stage reads the previous one twice: 2**40 nodes once inlined.
    A = te.placeholder((4,), "float32", name="A")
    stages = [A]
    for k in range(40):
        p = stages[-1]
        stages.append(te.compute((4,), lambda i, p=p: p[i] + p[i], name=f"T{k}"))
    s = rivet.create_schedule(stages[-1])
    for t in stages[1:-1]:
        s[t].compute_inline()
    with pytest.raises(rivet.CompileError, match="MAX_FUNC_NODES"):
        rivet.build(s, [A, stages[-1]], target="cpu", name="f")


def test_shared_subexpressions_build_in_linear_time(target, rng):
    # A DAG of 60 levels (2**60 nodes as a tree) is refused quickly, not walked.
    A = te.placeholder((4,), "float32", name="A")
    e = A[0]
    for _ in range(60):
        e = e * 0.5 + e * 0.5
    B = te.compute((4,), lambda i: e, name="B")
    with pytest.raises(rivet.CompileError, match="MAX_FUNC_NODES"):
        build(B, [A, B], target)


def _dag(e, levels=60):
    for _ in range(levels):
        e = e * 0.5 + e * 0.5
    return e


def _int_dag(e, levels=60):
    for _ in range(levels):
        e = (e + e) - e
    return e


_K = te.reduce_axis((0, 64), name="k")
_M = te.placeholder((64, 64), "float32", name="M")


@pytest.mark.parametrize(
    "stage",
    [
        # One per default-schedule rule that rewrites a stage's body: tiles, columns, lanes,
        # packed GEMM. The row sum ran lane_reduce's tree substitution out of memory.
        lambda: te.compute((64, 64), lambda i, j: _dag(_M[j, i]), name="B"),
        lambda: te.compute((64,), lambda j: te.sum(_dag(_M[_K, j]), axis=_K), name="B"),
        lambda: te.compute((64,), lambda i: te.sum(_dag(_M[i, _K]), axis=_K), name="B"),
        lambda: te.compute((64, 64), lambda i, j: te.sum(_dag(_M[i, _K]) * _M[_K, j], axis=_K), name="B"),
        lambda: te.compute((64, 64), lambda i, j: _M[_int_dag(i), j], name="B"),
    ],
    ids=["transpose", "column_sum", "row_sum", "matmul", "dag_index"],
)
def test_shared_dags_are_refused_before_the_default_schedule(stage):
    B = stage()
    with pytest.raises(rivet.CompileError, match="MAX_FUNC_NODES"):
        rivet.build(rivet.create_schedule(B), [_M, B], target="cpu", name="f")


def _extern_of_dag_shape(n, levels):
    A = te.placeholder((n,), "float32", name="A")
    return [A], te.extern((_int_dag(n, levels),), [A], lambda a, out: None, name="E")


def _compute_of_dag_shape(n, levels):
    A = te.placeholder((n,), "float32", name="A")
    return [A], te.compute((_int_dag(n, levels),), lambda i: A[0], name="E")


@pytest.mark.parametrize("levels", [9, 40])
@pytest.mark.parametrize("make", [_extern_of_dag_shape, _compute_of_dag_shape],
                         ids=["extern_shape", "compute_shape"])
def test_shared_dag_shapes_are_refused_quickly(make, levels):
    # A shape of shared terms (3^40 nodes as a tree): build's free-variable check walked it
    # as a tree and never finished; at 3^10 the bounds prover's simplifications did not
    # finish in a minute. Refused, in time linear in the DAG.
    inputs, E = make(te.var("n"), levels)
    with pytest.raises(rivet.CompileError, match="MAX_SHAPE_NODES"):
        rivet.build(rivet.create_schedule(E), [*inputs, E], target="cpu", name="f")


# ---- 7. huge split factors ------------------------------------------------------------------


@pytest.mark.parametrize("factor", [2**31, 2**62, 2**63 - 1])
def test_huge_split_factor_runs_the_axis_only(target, rng, factor):
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    s = rivet.create_schedule(B)
    (i,) = B.op.axis
    s[B].split(i, factor=factor)
    f = rivet.build(s, [A, B], target=target, name="f")["f"]
    a = random_array(rng, (5,), "float32")
    out = np.full(5, np.nan, np.float32)
    f(a, out)  # 5 iterations, not 2**62 guarded ones
    np.testing.assert_array_equal(out, a * 2)


@pytest.mark.parametrize("nparts", [2**31, 2**62])
def test_huge_nparts_runs_the_axis_only(target, rng, nparts):
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    s = rivet.create_schedule(B)
    (i,) = B.op.axis
    s[B].split(i, nparts=nparts)
    f = rivet.build(s, [A, B], target=target, name="f")["f"]
    a = random_array(rng, (7,), "float32")
    out = np.full(7, np.nan, np.float32)
    f(a, out)
    np.testing.assert_array_equal(out, a + 1)


# ---- checked mode ---------------------------------------------------------------------------


def test_checked_mode_gives_the_same_results(target, rng):
    n = te.var("n")
    A = te.placeholder((n, n), "float32", name="A")
    Bt = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * Bt[k, j], axis=k), name="C")
    s = rivet.create_schedule(C)
    i, j = C.op.axis
    io, ii = s[C].split(i, factor=4)
    s[C].parallel(io)
    checked = rivet.build(s, [A, Bt, C], target=target, name="f", checked=True)
    assert checked.get_source("ir").count("[") >= 3  # unflattened: one index per dim
    f = checked["f"]
    a = random_array(rng, (33, 33), "float32")
    b = random_array(rng, (33, 33), "float32")
    out = np.full((33, 33), np.nan, np.float32)
    f(a, b, out)
    assert_matches(out, a @ b, op="contraction", against="numpy", k=33, terms=abs_mm(a, b))


def test_checked_mode_from_the_environment(monkeypatch, target, rng):
    monkeypatch.setenv("RIVET_CHECKED", "1")
    A = te.placeholder((2, 3), "float32", name="A")
    B = te.compute((2, 3), lambda i, j: A[i, j] * 3.0, name="B")
    mod = rivet.build(rivet.create_schedule(B), [A, B], target=target, name="f")
    assert "A[i, j]" in mod.get_source("ir")
    a = random_array(rng, (2, 3), "float32")
    out = np.full((2, 3), np.nan, np.float32)
    mod["f"](a, out)
    np.testing.assert_array_equal(out, a * 3)


def test_nested_unroll_marks_stay_bounded():
    # `unroll` really unrolls (constant extents up to 64), but nested marks multiply: three
    # nested loops of 64 would be 262,144 copies of the body. Copies past
    # lower::unroll::MAX_UNROLLED_NODES stay loops, so the build stays small and the result
    # is the same.
    A = te.placeholder((64, 64, 64), "float32", name="A")
    B = te.compute((64, 64, 64), lambda i, j, k: A[i, j, k] * 2.0, name="B")
    s = rivet.create_schedule(B)
    for ax in B.op.axis:
        s[B].unroll(ax)
    m = rivet.build(s, [A, B], target="cpu", name="f")
    ir = m.get_source("ir")
    assert ir.count("for ") == 2 and len(ir) < 200_000, ir[:2000]
    a = np.random.default_rng(0).random((64, 64, 64), dtype=np.float32)
    b = np.full_like(a, np.nan)
    m["f"](a, b)
    assert np.array_equal(b, a * 2)
