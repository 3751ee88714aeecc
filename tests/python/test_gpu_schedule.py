"""GPU schedules (``Stage.bind``) without a GPU: built for ``target="interp"``, they run with
CUDA's semantics in the interpreter (blocks, threads phase by phase, races reported), so every
GPU schedule is checked against numpy on the CPU. The CPU backend refuses them.

The tests that run programs take ``gpu_target``: every backend of conftest.BACKENDS that runs
GPU schedules (today the interpreter; CUDA once it is added there)."""

import numpy as np
import pytest

import rivet
from rivet import te

from conftest import abs_mm, assert_matches, backend_params, random_array

SIZES = [1, 7, 56, 1000, 1023]


@pytest.fixture(params=backend_params(gpu_schedules=True))
def gpu_target(request):
    """A subset of the backends, on purpose: only those that run GPU schedules (the CPU
    backend refuses them, see test_the_cpu_backend_refuses_gpu_schedules)."""
    return request.param


def build(s, args, target="interp"):
    return rivet.build(s, args, target=target, name="f")["f"]


def elementwise():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    C = te.compute((n,), lambda i: A[i] * 2.0 + B[i], name="C")
    return A, B, C


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("threads", [1, 64, 256])
def test_one_dimensional_grid(rng, n, threads, gpu_target):
    A, B, C = elementwise()
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=threads)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, "threadIdx.x")
    f = build(s, [A, B, C], gpu_target)
    a, b = random_array(rng, (n,)), random_array(rng, (n,))
    c = np.full(n, np.nan, np.float32)
    f(a, b, c)
    np.testing.assert_array_equal(c, a * np.float32(2.0) + b)


def test_fused_two_dimensional_grid_on_strided_views(rng, gpu_target):
    m, n = te.var("m"), te.var("n")
    A = te.placeholder((m, n), "float64", name="A")
    C = te.compute((m, n), lambda i, j: A[i, j] - 1.0, name="C")
    s = rivet.create_schedule(C)
    fused = s[C].fuse(*C.op.axis)
    bx, tx = s[C].split(fused, factor=128)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    f = build(s, [A, C], gpu_target)
    base = random_array(rng, (40, 60), "float64")
    a = base[::2, ::-3]
    out = np.full((40, 40), np.nan)
    c = out[::2, :20]
    f(a, c)
    np.testing.assert_array_equal(c, a - 1.0)
    assert np.isnan(out[1::2]).all() and np.isnan(out[::2, 20:]).all()


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 5, 3), (37, 45, 29)])
def test_matmul_with_a_block_of_threads_per_tile(rng, shape, gpu_target):
    mm, kk, nn = shape
    m, k_, n = te.var("m"), te.var("k"), te.var("n")
    A = te.placeholder((m, k_), "float32", name="A")
    B = te.placeholder((k_, n), "float32", name="B")
    k = te.reduce_axis((0, k_), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = rivet.create_schedule(C)
    i, j = C.op.axis
    io, ii = s[C].split(i, factor=8)
    jo, ji = s[C].split(j, factor=8)
    s[C].reorder(io, jo, ii, ji, k)
    s[C].bind(io, "blockIdx.y")
    s[C].bind(jo, "blockIdx.x")
    s[C].bind(ii, "threadIdx.y")
    s[C].bind(ji, "threadIdx.x")
    f = build(s, [A, B, C], gpu_target)
    a, b = random_array(rng, (mm, kk)), random_array(rng, (kk, nn))
    c = np.full((mm, nn), np.nan, np.float32)
    f(a, b, c)
    # Each thread sums its k in order, as the unscheduled CPU kernel does: equal bits.
    want = np.empty_like(c)
    rivet.build(rivet.create_schedule(C), [A, B, C], target="cpu", name="g")["g"](a, b, want)
    assert_matches(c, want, op="contraction", against="interp", backend=gpu_target)
    assert_matches(c, a @ b, op="contraction", against="numpy", k=kk, terms=abs_mm(a, b))


def test_two_bound_stages_and_an_inlined_one(rng, gpu_target):
    n = te.var("n")
    X = te.placeholder((n, 16), "float32", name="X")
    Sq = te.compute((n, 16), lambda i, j: X[i, j] * X[i, j], name="Sq")
    k = te.reduce_axis((0, 16), name="k")
    R = te.compute((n,), lambda i: te.sum(Sq[i, k], axis=k), name="R")
    Y = te.compute((n,), lambda i: R[i] + 1.0, name="Y")
    s = rivet.create_schedule(Y)
    s[Sq].compute_inline()
    for t in (R, Y):
        bx, tx = s[t].split(t.op.axis[0], factor=32)
        s[t].bind(bx, "blockIdx.x")
        s[t].bind(tx, "threadIdx.x")
    f = build(s, [X, Y], gpu_target)
    for rows in [1, 33, 100]:
        x = random_array(rng, (rows, 16))
        y = np.full(rows, np.nan, np.float32)
        f(x, y)
        # 16 positive squares summed, then + 1: a reduction of 17 terms against numpy's float32.
        assert_matches(y, (x * x).sum(axis=1) + 1.0, op="reduction", against="numpy", k=17)


def test_the_cpu_backend_refuses_gpu_schedules():
    A, B, C = elementwise()
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=64)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    with pytest.raises(rivet.CompileError, match="target 'cpu' cannot run it.*'cuda'"):
        build(s, [A, B, C], target="cpu")


def _bound(tags, factor=64):
    A, B, C = elementwise()
    s = rivet.create_schedule(C)
    o, i = s[C].split(C.op.axis[0], factor=factor)
    for ax, tag in zip((o, i), tags):
        if tag:
            s[C].bind(ax, tag)
    return s, [A, B, C], (o, i)


@pytest.mark.parametrize(
    "make, message",
    [
        # the same launch dimension bound twice in one stage
        (lambda: _bound(["threadIdx.x", "threadIdx.x"]), "already bound to it"),
        # a split by more than 1024 over a symbolic axis is clamped (min(2048, n)): symbolic
        (lambda: _bound(["blockIdx.x", "threadIdx.x"], factor=2048), "min\\(2048, n\\).*not a constant"),
        # a thread loop of symbolic extent
        (lambda: _bound(["threadIdx.x", None]), "not a constant"),
        # some loops bound, an outer one not
        (lambda: _bound([None, "blockIdx.x"]), "outside it is not"),
        # threads outside blocks
        (lambda: _bound(["threadIdx.x", "blockIdx.x"]), "block loops come before thread loops"),
    ],
)
def test_bad_gpu_schedules_are_compile_errors(make, message):
    # Refused at `bind` when the stage alone shows it, else at `build`.
    with pytest.raises(rivet.CompileError, match=message):
        s, args, _ = make()
        build(s, args)


def test_binding_a_reduction_axis_or_an_unknown_tag_is_refused():
    n = te.var("n")
    A = te.placeholder((n, n), "float32", name="A")
    k = te.reduce_axis((0, n), name="k")
    R = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="R")
    s = rivet.create_schedule(R)
    with pytest.raises(rivet.CompileError, match="reduction loop 'k'.*cross-thread"):
        s[R].bind(k, "blockIdx.x")
    with pytest.raises(rivet.CompileError, match="threadIdx.x"):
        s[R].bind(R.op.axis[0], "threadIdx.w")
    with pytest.raises(rivet.CompileError, match="te.thread_axis"):
        te.thread_axis("warp")
    assert repr(te.thread_axis("blockIdx.y")) == "te.thread_axis('blockIdx.y')"


def test_compute_at_into_a_gpu_stage_is_refused_until_scopes_exist():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    P = te.compute((n,), lambda i: A[i] + 1.0, name="P")
    C = te.compute((n,), lambda i: P[i] * 2.0, name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=32)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    s[P].compute_at(s[C], tx)
    with pytest.raises(rivet.CompileError, match="cache_read / cache_write"):
        build(s, [A, C])


def test_leaf_kinds_report_bindings():
    A, B, C = elementwise()
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=64)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    assert s[C].leaf_kinds == ["blockIdx.x", "threadIdx.x"]


def test_more_than_1024_threads_per_block_is_refused():
    A = te.placeholder((4096,), "float32", name="A")
    C = te.compute((4096,), lambda i: A[i] + 1.0, name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=2048)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    with pytest.raises(rivet.CompileError, match="has 2048 iterations; a thread dimension has 1 to 1024"):
        build(s, [A, C])
    X = te.placeholder((64, 64), "float32", name="X")
    Y = te.compute((64, 64), lambda i, j: X[i, j] + 1.0, name="Y")
    s = rivet.create_schedule(Y)
    s[Y].bind(Y.op.axis[0], "threadIdx.y")
    s[Y].bind(Y.op.axis[1], "threadIdx.x")
    with pytest.raises(rivet.CompileError, match="blocks of 4096 threads; a block has at most 1024"):
        build(s, [X, Y])


# ---- cross-thread reductions: a reduction loop bound to threadIdx.x ----------------------------


def row_reduction(op, dtype="float32", threads=256, rows_per_block=None):
    """R[i] = op over k of A[i, k], the reduction split by `threads` with the inner loop on
    threadIdx.x (each thread reduces its share, the block combines the partials), rows on
    blockIdx.x, or `rows_per_block` of them on threadIdx.y."""
    n, kk = te.var("n"), te.var("k")
    A = te.placeholder((n, kk), dtype, name="A")
    k = te.reduce_axis((0, kk), name="k")
    R = te.compute((n,), lambda i: op(A[i, k], axis=k), name="R")
    s = rivet.create_schedule(R)
    (i,) = R.op.axis
    ko, ki = s[R].split(k, factor=threads)
    if rows_per_block is None:
        s[R].reorder(i, ki, ko)
        s[R].bind(i, "blockIdx.x")
    else:
        io, ii = s[R].split(i, factor=rows_per_block)
        s[R].reorder(io, ii, ki, ko)
        s[R].bind(io, "blockIdx.x")
        s[R].bind(ii, "threadIdx.y")
    s[R].bind(ki, "threadIdx.x")
    return s, [A, R]


@pytest.mark.parametrize("cols", [1, 7, 31, 32, 33, 256, 1000])
@pytest.mark.parametrize("threads", [32, 33, 256])
def test_row_sum_max_min_across_threads(rng, cols, threads, gpu_target):
    rows = 3
    a = random_array(rng, (rows, cols))
    for op, ref in [(te.sum, np.sum), (te.max, np.max), (te.min, np.min)]:
        s, args = row_reduction(op, threads=threads)
        f = build(s, args, gpu_target)
        r = np.full(rows, np.nan, np.float32)
        f(a, r)
        if op is te.sum:
            # A tree over the threads' partial sums: another order than numpy's pairwise sum.
            assert_matches(r, a.sum(axis=1), op="reduction", against="numpy", k=cols, terms=np.abs(a).sum(axis=1))
        else:
            np.testing.assert_array_equal(r, ref(a, axis=1))


def test_reduction_across_threads_with_several_rows_per_block(rng, gpu_target):
    # 4 rows of 8 threads per block (threadIdx.y), 10 rows: the last block is ragged.
    for threads, per_block in [(8, 4), (64, 4), (1, 16)]:
        s, args = row_reduction(te.max, threads=threads, rows_per_block=per_block)
        f = build(s, args, gpu_target)
        a = random_array(rng, (10, 77))
        r = np.full(10, np.nan, np.float32)
        f(a, r)
        np.testing.assert_array_equal(r, a.max(axis=1))


def test_integer_sums_across_threads_wrap_like_numpy(rng, gpu_target):
    s, args = row_reduction(te.sum, dtype="int32", threads=128)
    f = build(s, args, gpu_target)
    a = rng.integers(-(2**31), 2**31, size=(5, 999), dtype=np.int32)
    r = np.zeros(5, np.int32)
    f(a, r)
    np.testing.assert_array_equal(r, a.sum(axis=1, dtype=np.int32))


def test_float64_and_float16_sums_across_threads(rng, gpu_target):
    for dtype, k in [("float64", 300), ("float16", 40)]:
        s, args = row_reduction(te.sum, dtype=dtype, threads=64)
        f = build(s, args, gpu_target)
        a = random_array(rng, (4, k), dtype)
        r = np.full(4, np.nan, dtype)
        f(a, r)
        # float16 accumulates in float16 (rounded at every update, as the unscheduled program).
        assert_matches(r, a.astype(np.float64).sum(axis=1), op="reduction", against="numpy", k=k, terms=np.abs(a.astype(np.float64)).sum(axis=1))


def test_binding_a_reduction_loop_to_y_or_a_non_power_of_two_next_to_y_is_refused():
    n, kk = te.var("n"), te.var("k")
    A = te.placeholder((n, kk), "float32", name="A")
    k = te.reduce_axis((0, kk), name="k")
    R = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="R")
    s = rivet.create_schedule(R)
    ko, ki = s[R].split(k, factor=32)
    with pytest.raises(rivet.CompileError, match="reduction loop 'k.inner' to threadIdx.y: a cross-thread reduction runs over threadIdx.x"):
        s[R].bind(ki, "threadIdx.y")
    with pytest.raises(rivet.CompileError, match="reduction loop 'k.outer' to blockIdx.x.*blocks cannot combine"):
        s[R].bind(ko, "blockIdx.x")
    s, args = row_reduction(te.sum, threads=48, rows_per_block=2)
    with pytest.raises(rivet.CompileError, match="48 threads.*power-of-two threadIdx.x extent"):
        build(s, args)


def test_the_cpu_backend_refuses_a_cross_thread_reduction():
    s, args = row_reduction(te.sum, threads=64)
    with pytest.raises(rivet.CompileError, match="target 'cpu' cannot run it"):
        build(s, args, target="cpu")
    # The interpreter prints the collective in the lowered IR.
    ir = rivet.build(s, args, target="interp", name="f").get_source("ir")
    assert "R.acc[0] = allreduce sum over threadIdx.x of R.acc[0]" in ir, ir
