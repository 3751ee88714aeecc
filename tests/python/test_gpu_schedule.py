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
    rivet.build(rivet.create_schedule(C), [A, B, C], target="cpu", name="g", default_schedule=False)["g"](a, b, want)
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


def test_compute_at_of_a_global_stage_into_a_gpu_stage_is_refused():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    P = te.compute((n,), lambda i: A[i] + 1.0, name="P")
    C = te.compute((n,), lambda i: P[i] * 2.0, name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=32)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    s[P].compute_at(s[C], tx)
    with pytest.raises(rivet.CompileError, match="shared or local memory.*cache_read / s.cache_write"):
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
    with pytest.raises(rivet.CompileError, match="has 2048 iterations; that thread dimension has 1 to 1024"):
        build(s, [A, C])
    # CUDA's blockDim.z is at most 64.
    Z = te.compute((2, 65), lambda i, j: A[i * 65 + j] + 1.0, name="Z")
    s = rivet.create_schedule(Z)
    s[Z].bind(Z.op.axis[0], "blockIdx.x")
    s[Z].bind(Z.op.axis[1], "threadIdx.z")
    with pytest.raises(rivet.CompileError, match="'j' bound to threadIdx.z has 65 iterations; that thread dimension has 1 to 64"):
        build(s, [A, Z])
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
# ---- memory caches: cache_read / cache_write, barriers, the shared-memory tiled GEMM -------


def matmul_program(dtype="float32"):
    m, k_, n = te.var("m"), te.var("k"), te.var("n")
    A = te.placeholder((m, k_), dtype, name="A")
    B = te.placeholder((k_, n), dtype, name="B")
    k = te.reduce_axis((0, k_), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, C, k


def tiled_gemm_schedule(tile=64, threads=16, ktile=16):
    """TVM's shared-memory GEMM schedule, written with the Python API: a tile x tile output
    block per CUDA block, threads x threads threads each computing a square of outputs in a
    local cache, A and B tiles of ktile along k staged through shared memory by all threads."""
    A, B, C, k = matmul_program()
    s = rivet.create_schedule(C)
    CL = s.cache_write(C, "local")
    AA = s.cache_read(A, "shared", [CL])
    BB = s.cache_read(B, "shared", CL)
    i, j = C.op.axis
    by, yi = s[C].split(i, factor=tile)
    bx, xi = s[C].split(j, factor=tile)
    ty, yr = s[C].split(yi, factor=tile // threads)
    tx, xr = s[C].split(xi, factor=tile // threads)
    s[C].reorder(by, bx, ty, tx, yr, xr)
    s[C].bind(by, "blockIdx.y")
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(ty, "threadIdx.y")
    s[C].bind(tx, "threadIdx.x")
    s[CL].compute_at(s[C], tx)
    ko, ki = s[CL].split(k, factor=ktile)
    ci, cj = CL.op.axis
    s[CL].reorder(ko, ki, ci, cj)
    s[CL].unroll(ki)
    s[CL].unroll(ci)
    s[CL].unroll(cj)
    for X in (AA, BB):
        s[X].compute_at(s[CL], ko)
        fused = s[X].fuse(*X.op.axis)
        _, t = s[X].split(fused, factor=threads * threads)
        y, x = s[X].split(t, factor=threads)
        s[X].bind(y, "threadIdx.y")
        s[X].bind(x, "threadIdx.x")
    assert s[AA].scope == "shared" and s[CL].scope == "local" and s[C].scope == "global"
    assert s[CL].leaf_kinds == ["serial", "unrolled", "unrolled", "unrolled"]
    return s, [A, B, C]


_TILED_GEMM = {}


@pytest.fixture
def tiled_gemm(gpu_target):
    """The tiled GEMM built once per backend that runs GPU schedules."""
    if gpu_target not in _TILED_GEMM:
        s, args = tiled_gemm_schedule()
        _TILED_GEMM[gpu_target] = rivet.build(s, args, target=gpu_target, name="mm")
    return _TILED_GEMM[gpu_target]


@pytest.mark.parametrize("size", SIZES)
def test_shared_memory_tiled_gemm_from_python_on_ragged_sizes(rng, tiled_gemm, size):
    # One big dim at a time: the interpreter runs every thread of every block.
    for mm, kk, nn in {(size, 9, 5), (5, size, 3), (3, 4, size)}:
        a, b = random_array(rng, (mm, kk)), random_array(rng, (kk, nn))
        c = np.full((mm, nn), np.nan, np.float32)
        tiled_gemm["mm"](a, b, c)
        assert_matches(c, a @ b, op="contraction", against="numpy", k=kk, terms=abs_mm(a, b))


def test_shared_memory_tiled_gemm_against_torch_on_views(rng, tiled_gemm):
    torch = pytest.importorskip("torch")
    a = torch.from_numpy(random_array(rng, (130, 70)))
    b = torch.from_numpy(random_array(rng, (22, 70))).t()  # a transposed view, strides (1, 70)
    c = torch.full((130, 22), float("nan"))
    tiled_gemm["mm"](a, b, c)
    assert_matches(c.numpy(), (a @ b).numpy(), op="contraction", against="torch", k=70, terms=abs_mm(a, b))


def test_the_tiled_gemm_has_its_barriers_shared_tiles_and_unrolled_loops(tiled_gemm):
    ir = tiled_gemm.get_source("ir")
    assert ir.count("barrier") == 2, ir
    assert "A.shared: float32[64, 16] shared" in ir and "B.shared: float32[16, 64] shared" in ir
    assert "C.local: float32[4, 4] local" in ir
    assert "unrolled for" in ir


def test_library_matmul_gpu_schedule_runs_in_the_interpreter(rng):
    mm = rivet.kernels.matmul("float32", target="interp", schedule="gpu")
    for shape in [(1, 1, 1), (65, 33, 70), (7, 100, 56)]:
        m_, k_, n_ = shape
        a, b = random_array(rng, (m_, k_)), random_array(rng, (k_, n_))
        c = np.full((m_, n_), np.nan, np.float32)
        mm(a, b, c)
        assert_matches(c, a @ b, op="contraction", against="numpy", k=k_, terms=abs_mm(a, b))


def _block_gemm(bind_loads=True):
    A, B, C, k = matmul_program()
    s = rivet.create_schedule(C)
    AA = s.cache_read(A, "shared", [C])
    i, j = C.op.axis
    by, bx, ty, tx = s[C].tile(i, j, 8, 8)
    s[C].bind(by, "blockIdx.y")
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(ty, "threadIdx.y")
    s[C].bind(tx, "threadIdx.x")
    ko, ki = s[C].split(k, factor=8)
    s[C].reorder(by, bx, ty, tx, ko, ki)
    s[AA].compute_at(s[C], ko)
    if bind_loads:
        s[AA].bind(AA.op.axis[0], "threadIdx.y")
        s[AA].bind(AA.op.axis[1], "threadIdx.x")
    return s, [A, B, C]


@pytest.mark.parametrize("bind_loads", [True, False])
def test_cache_read_at_the_k_tile_loop_of_the_output_stage(rng, bind_loads):
    # Unbound, only thread (0, 0) of each block copies the tile (slow but right).
    s, args = _block_gemm(bind_loads)
    f = build(s, args)
    for mm, kk, nn in [(1, 1, 1), (9, 17, 23), (16, 8, 8)]:
        a, b = random_array(rng, (mm, kk)), random_array(rng, (kk, nn))
        c = np.full((mm, nn), np.nan, np.float32)
        f(a, b, c)
        assert_matches(c, a @ b, op="contraction", against="numpy", k=kk, terms=abs_mm(a, b))


def test_local_cache_write_accumulates_per_thread(rng):
    A, B, C, k = matmul_program("float64")
    s = rivet.create_schedule(C)
    CL = s.cache_write(C, "local")
    bx, tx = s[C].split(C.op.axis[0], factor=32)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    jo, ji = s[C].split(C.op.axis[1], factor=4)
    s[CL].compute_at(s[C], jo)
    f = build(s, [A, B, C])
    a, b = random_array(rng, (40, 13), "float64"), random_array(rng, (13, 10), "float64")
    c = np.full((40, 10), np.nan)
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-12)


def test_cache_errors_name_what_is_wrong():
    A, B, C, k = matmul_program()
    s = rivet.create_schedule(C)
    with pytest.raises(rivet.CompileError, match="scope must be 'shared' or 'local', got 'texture'"):
        s.cache_read(A, "texture", [C])
    with pytest.raises(rivet.CompileError, match="scope must be 'local', got 'shared'"):
        s.cache_write(C, "shared")
    with pytest.raises(rivet.CompileError, match="cache_write of 'A': it is a placeholder"):
        s.cache_write(A, "local")
    with pytest.raises(rivet.CompileError, match="reader 'A' is not a stage"):
        s.cache_read(B, "shared", [A])
    with pytest.raises(rivet.CompileError, match="at least one"):
        s.cache_read(B, "shared", [])
    with pytest.raises(Exception, match="scope"):
        s.cache_read(A, 3, [C])
    with pytest.raises(Exception, match="readers"):
        s.cache_read(A, "shared", [3])
    D = te.compute((A.shape[0],), lambda i: A[i, 0] + 1.0, name="D")
    s2 = rivet.create_schedule([C, D])
    with pytest.raises(rivet.CompileError, match="reader 'D' does not read 'B'"):
        s2.cache_read(B, "shared", [D])
    s3 = rivet.create_schedule(C)
    s3[C].split(C.op.axis[0], factor=4)
    with pytest.raises(rivet.CompileError, match="before the stage is scheduled"):
        s3.cache_write(C, "local")
    # A cache never attached inside a kernel: refused at build, not a verifier error.
    s4 = rivet.create_schedule(C)
    s4.cache_read(A, "shared", [C])
    with pytest.raises(rivet.CompileError, match="must be compute_at inside a loop of a stage bound to a GPU"):
        build(s4, [A, B, C])
    # A shared region that is not a constant (the whole symbolic k at the block loop).
    s5, args = _block_gemm()
    AA = [st for st in s5.stages if st.scope == "shared"][0]
    C5 = args[2]
    bx = s5[C5].leaf_iter_vars[1]
    AA.compute_at(s5[C5], bx)
    with pytest.raises(rivet.CompileError, match="not a constant"):
        build(s5, args)


def test_unroll_inside_a_kernel(rng):
    A, B, C = elementwise()
    s = rivet.create_schedule(C)
    bx, rest = s[C].split(C.op.axis[0], factor=64)
    tx, u = s[C].split(rest, factor=4)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    s[C].unroll(u)
    f = build(s, [A, B, C])
    for n in [1, 63, 130]:
        a, b = random_array(rng, (n,)), random_array(rng, (n,))
        c = np.full(n, np.nan, np.float32)
        f(a, b, c)
        np.testing.assert_array_equal(c, a * np.float32(2.0) + b)
