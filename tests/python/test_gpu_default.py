"""The default GPU schedule: what ``rivet.build(..., target="cuda")`` applies to a schedule that
binds no loop, also available as ``rivet.te.default_gpu_schedule(outputs)``. Built for the
backends that run GPU schedules (the interpreter, with CUDA's semantics: blocks, threads
phase by phase, races reported), it must compute what numpy computes; built for ``cuda`` it
must compile with NVRTC. No GPU needed."""

import numpy as np
import pytest

import rivet
from rivet import te

from conftest import abs_mm, assert_matches, backend_params, random_array

SIZES = [1, 7, 56, 1000, 1023]


@pytest.fixture(params=backend_params(gpu_schedules=True))
def gpu_target(request):
    return request.param


def tags(s, t):
    return [k for k in s[t].leaf_kinds if k.startswith(("blockIdx", "threadIdx"))]


def chain():
    """Y = relu(X * 2 + 1) - rowmax(X): injective stages, a reduction, an epilogue."""
    m, n = te.var("m"), te.var("n")
    X = te.placeholder((m, n), "float32", name="X")
    A = te.compute((m, n), lambda i, j: X[i, j] * 2.0 + 1.0, name="A")
    k = te.reduce_axis((0, n), name="k")
    R = te.compute((m,), lambda i: te.max(X[i, k], axis=k), name="R")
    Y = te.compute((m, n), lambda i, j: te.max(A[i, j], 0.0) - R[i], name="Y")
    return X, A, R, Y


@pytest.mark.parametrize("m,n", [(1, 1), (7, 3), (3, 300), (56, 1000), (2, 1023)])
def test_injective_chain_with_a_reduction(rng, m, n, gpu_target):
    X, A, R, Y = chain()
    s = te.default_gpu_schedule(Y)
    assert s[A].attach == "inline"
    assert tags(s, Y) == ["blockIdx.x", "threadIdx.x"]
    assert tags(s, R) == ["blockIdx.x", "threadIdx.x"]
    f = rivet.build(s, [X, Y], target=gpu_target, name="f")["f"]
    x = random_array(rng, (m, n))
    y = np.full((m, n), np.nan, np.float32)
    f(x, y)
    want = np.maximum(x * np.float32(2.0) + np.float32(1.0), np.float32(0.0)) - x.max(axis=1, keepdims=True)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("n", SIZES)
def test_elementwise_1d_over_every_size(rng, n, gpu_target):
    N = te.var("n")
    A = te.placeholder((N,), "float64", name="A")
    B = te.placeholder((N,), "float64", name="B")
    C = te.compute((N,), lambda i: A[i] * B[i] - 3.0, name="C")
    f = rivet.build(te.default_gpu_schedule(C), [A, B, C], target=gpu_target, name="f")["f"]
    a, b = random_array(rng, (n,), np.float64), random_array(rng, (n,), np.float64)
    c = np.full(n, np.nan)
    f(a, b, c)
    np.testing.assert_array_equal(c, a * b - 3.0)


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 5, 3), (56, 33, 70), (17, 1023, 2)])
def test_matmul_is_tiled(rng, shape, gpu_target):
    mm, kk, nn = shape
    m, k_, n = te.var("m"), te.var("k"), te.var("n")
    A = te.placeholder((m, k_), "float32", name="A")
    B = te.placeholder((k_, n), "float32", name="B")
    k = te.reduce_axis((0, k_), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.default_gpu_schedule(C)
    assert sorted(tags(s, C)) == ["blockIdx.x", "blockIdx.y", "threadIdx.x", "threadIdx.y"]
    f = rivet.build(s, [A, B, C], target=gpu_target, name="f")["f"]
    a, b = random_array(rng, (mm, kk)), random_array(rng, (kk, nn))
    c = np.full((mm, nn), np.nan, np.float32)
    f(a, b, c)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert_matches(c, want, op="contraction", against="numpy", k=kk, terms=abs_mm(a, b))


@pytest.mark.parametrize("n", SIZES + [70000])
def test_a_reduction_to_a_scalar_is_one_block(rng, n, gpu_target):
    N = te.var("n")
    A = te.placeholder((N,), "float32", name="A")
    k = te.reduce_axis((0, N), name="k")
    S = te.compute((), lambda: te.sum(A[k], axis=k), name="S")
    s = te.default_gpu_schedule(S)
    assert tags(s, S) == ["threadIdx.x"]  # no data axis: a single block
    f = rivet.build(s, [A, S], target=gpu_target, name="f")["f"]
    a = random_array(rng, (n,))
    out = np.full((), np.nan, np.float32)
    f(a, out)
    assert_matches(out, a.astype(np.float64).sum(), op="reduction", against="numpy", k=n, terms=np.abs(a.astype(np.float64)).sum())
    assert "__global__" in rivet.build(rivet.create_schedule(S), [A, S], target="cuda").get_source("cuda")


def test_strided_views_in_and_out(rng, gpu_target):
    X, _, _, Y = chain()
    f = rivet.build(te.default_gpu_schedule(Y), [X, Y], target=gpu_target, name="f")["f"]
    base = random_array(rng, (30, 40))
    x = base[::3, ::-2]
    out = np.full((20, 40), np.nan, np.float32)
    y = out[::2, 5:25]
    f(x, y)
    want = np.maximum(x * np.float32(2.0) + np.float32(1.0), np.float32(0.0)) - x.max(axis=1, keepdims=True)
    np.testing.assert_array_equal(y, want)
    assert np.isnan(out[1::2]).all() and np.isnan(out[::2, :5]).all() and np.isnan(out[::2, 25:]).all()


def test_build_for_cuda_uses_it_and_nvrtc_compiles_it():
    X, _, _, Y = chain()
    mod = rivet.build(rivet.create_schedule(Y), [X, Y], target="cuda -arch=sm_90", name="f")
    src = mod.get_source("cuda")
    assert "__global__" in src and "blockIdx.x" in src and "threadIdx.x" in src
    assert "writes A" not in src  # the injective stage is inlined, never materialised
    try:
        ptx = mod.get_source("ptx")
    except rivet.Error as e:  # no NVRTC on this machine: say so, do not pass silently
        pytest.skip(f"NVRTC not found: {e}")
    assert ".visible .entry" in ptx


def test_a_schedule_with_bindings_is_taken_as_it_is():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] + 1.0, name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=32)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    src = rivet.build(s, [A, C], target="cuda", name="f").get_source("cuda")
    assert "__launch_bounds__(32)" in src


def test_stages_the_user_scheduled_are_left_alone():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] + 1.0, name="C")
    s = rivet.create_schedule(C)
    s[C].parallel(C.op.axis[0])
    with pytest.raises(rivet.CompileError, match="parallel"):
        rivet.build(s, [A, C], target="cuda")


def test_bad_arguments_are_errors():
    with pytest.raises(rivet.Error, match="default_gpu_schedule"):
        te.default_gpu_schedule(3)
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    with pytest.raises(rivet.CompileError, match="placeholder"):
        te.default_gpu_schedule(A)
