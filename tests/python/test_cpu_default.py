"""The default CPU schedule (docs/default_schedules.md): an untouched schedule built
for the CPU gets parallel, vectorised loops and, for matmul-like stages, the packed,
tensorized GEMM; results checked against torch / numpy on fresh random data with poisoned
outputs; the user's schedule, `default_schedule=False` and `RIVET_DEFAULT_SCHEDULE=0` build
the program as written."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import rivet
from rivet import te

from conftest import abs_mm, assert_matches, poison, random_array


def matmul(m, k, n, a_t=False, b_t=False, batch=None, dtype="float32"):
    lead = (batch,) if batch is not None else ()
    A = te.placeholder(lead + ((k, m) if a_t else (m, k)), dtype, name="A")
    B = te.placeholder(lead + ((n, k) if b_t else (k, n)), dtype, name="B")
    r = te.reduce_axis((0, k), name="r")

    def body(*ix):
        pre, i, j = ix[:-2], ix[-2], ix[-1]
        a = A[pre + ((r, i) if a_t else (i, r))]
        b = B[pre + ((j, r) if b_t else (r, j))]
        return te.sum(a * b, axis=r)

    C = te.compute(lead + (m, n), body, name="C")
    return A, B, C


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "static"])
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 17, 5), (97, 33, 130), (12, 300, 32)])
def test_default_gemm_matches_torch(symbolic, a_t, b_t, shape, rng):
    m, k, n = shape
    dims = (te.var("m"), te.var("k"), te.var("n")) if symbolic else shape
    A, B, C = matmul(*dims, a_t=a_t, b_t=b_t)
    mod = rivet.build(rivet.create_schedule(C), [A, B, C], target="cpu", name="mm")
    packed = "call gemm_update" in mod.get_source("ir")
    assert packed == (symbolic or m * n * k >= 32**3)
    a = torch.from_numpy(random_array(rng, (k, m) if a_t else (m, k)))
    b = torch.from_numpy(random_array(rng, (n, k) if b_t else (k, n)))
    c = poison(torch.empty(m, n))
    mod["mm"](a, b, c)
    la, lb = (a.T if a_t else a), (b.T if b_t else b)
    assert_matches(c, la.double() @ lb.double(), op="contraction", against="torch", k=k, terms=abs_mm(la, lb))


def test_default_gemm_on_views_and_batches(rng):
    b_, m, k, n = te.var("b"), te.var("m"), te.var("k"), te.var("n")
    A, B, C = matmul(m, k, n, batch=b_)
    f = rivet.build(rivet.create_schedule(C), [A, B, C], target="cpu", name="bmm")["bmm"]
    a = torch.from_numpy(random_array(rng, (3, 40, 70)))
    bb = torch.from_numpy(random_array(rng, (3, 70 * 2, 50)))[:, ::2, :]  # a strided view
    out = poison(torch.empty(3, 50, 40)).transpose(1, 2)  # written through a transposed view
    f(a, bb, out)
    want = torch.bmm(a.double(), bb.double())
    terms = torch.bmm(a.abs().double(), bb.abs().double())
    assert_matches(out, want, op="contraction", against="torch", k=70, terms=terms)


def test_kernels_matmul_is_packed_and_float64_works(rng):
    a = random_array(rng, (33, 65), np.float64)
    b = random_array(rng, (65, 17), np.float64)
    c = poison(np.empty((33, 17)))
    rivet.kernels.matmul("float64")(a, b, c)
    assert_matches(c, a @ b, op="contraction", against="numpy", k=65, terms=abs_mm(a, b))


def test_default_rowwise_and_elementwise_match_torch(rng):
    r, c_ = te.var("r"), te.var("c")
    X = te.placeholder((r, c_), "float32", name="X")
    bias = te.placeholder((c_,), "float32", name="bias")
    Y = te.compute((r, c_), lambda i, j: te.erf(X[i, j] + bias[j]) * 0.5, name="Y")
    k = te.reduce_axis((0, c_), name="k")
    S = te.compute((r,), lambda i: te.sum(Y[i, k], axis=k), name="S")
    mod = rivet.build(rivet.create_schedule(S), [X, bias, S], target="cpu", name="f")
    ir = mod.get_source("ir")
    assert "local Y:" not in ir and "parallel for i" in ir  # Y inlined into S; rows parallel
    x = torch.from_numpy(random_array(rng, (37, 1029)))
    bv = torch.from_numpy(random_array(rng, (1029,)))
    s = poison(torch.empty(37))
    mod["f"](x, bv, s)
    want = (torch.erf((x + bv).double()) * 0.5).sum(1)
    assert_matches(s, want, op="composite", against="torch", k=1029, terms=(torch.erf((x + bv).double()) * 0.5).abs().sum(1), ulps=64)
    # Elementwise over more than one parallel chunk, and a vector tail.
    n = te.var("n")
    P = te.placeholder((n,), "float32", name="P")
    Q = te.compute((n,), lambda i: P[i] * 2.0 + 1.0, name="Q")
    g = rivet.build(rivet.create_schedule(Q), [P, Q], target="cpu", name="g")
    assert "parallel" in g.get_source("ir") and "ramp(" in g.get_source("ir")
    p = random_array(rng, (16384 * 3 + 5,))
    q = poison(np.empty_like(p))
    g["g"](p, q)
    np.testing.assert_array_equal(q, p * np.float32(2.0) + np.float32(1.0))


def test_the_users_schedule_wins_and_the_default_can_be_turned_off():
    A, B, C = matmul(te.var("m"), te.var("k"), te.var("n"))
    s = rivet.create_schedule(C)
    assert "call gemm_update" in rivet.build(s, [A, B, C], target="cpu").get_source("ir")
    off = rivet.build(s, [A, B, C], target="cpu", default_schedule=False).get_source("ir")
    assert "gemm_update" not in off and "parallel" not in off
    # Touching one loop of one stage: the whole schedule is built as written.
    s2 = rivet.create_schedule(C)
    s2[C].parallel(C.op.axis[0])
    ir = rivet.build(s2, [A, B, C], target="cpu").get_source("ir")
    assert "gemm_update" not in ir and "parallel for i" in ir
    # The interpreter runs the program as written.
    assert "gemm_update" not in rivet.build(s, [A, B, C], target="interp").get_source("ir")
    code = (
        "import rivet; from rivet import te; import test_cpu_default as t; "
        "A, B, C = t.matmul(te.var('m'), te.var('k'), te.var('n')); "
        "print('gemm_update' in rivet.build(rivet.create_schedule(C), [A, B, C]).get_source('ir'))"
    )
    env = dict(os.environ, RIVET_DEFAULT_SCHEDULE="0", PYTHONPATH=os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("k", [2**40, 2**45])
def test_default_gemm_with_a_hostile_depth_is_a_memory_error(k):
    # Broadcast views (stride 0) of a reduction depth near 2^40 / 2^45: the plain nest would run
    # 2^42+ multiply-adds; the packed GEMM's panels cannot be allocated (refused by the system,
    # or over MAX_ALLOC_BYTES) and the call says so before anything is written.
    f = rivet.kernels.matmul("float32")
    a = torch.ones(2, 1).expand(2, k)
    b = torch.ones(1, 2).expand(k, 2)
    c = torch.full((2, 2), float("nan"))
    with pytest.raises(rivet.MemoryError, match="MAX_ALLOC_BYTES"):
        f(a, b, c)
    assert torch.isnan(c).all()
    # The function still works afterwards.
    f(torch.ones(2, 3), torch.ones(3, 2), c)
    assert (c == 3).all()


@pytest.mark.parametrize("cols", [2**47, 2**60])
def test_a_row_temporary_too_large_is_a_memory_error_inside_the_row_loop(cols):
    # `lower::row_locals` gives T (read by two reductions, so not inlined) one row per
    # iteration of the parallel row loop: a row of 2^47 / 2^60 floats (over MAX_ALLOC_BYTES;
    # a broadcast view input, small outputs) is allocated there, inside the outlined body,
    # and must fail as a MemoryError from the worker, never crash or run. Then the function
    # still works.
    r, c = te.var("r"), te.var("c")
    X = te.placeholder((r, c), "float32", name="X")
    T = te.compute((r, c), lambda i, j: te.exp(X[i, j]), name="T")
    k1, k2 = te.reduce_axis((0, c), name="k1"), te.reduce_axis((0, c), name="k2")
    S1 = te.compute((r,), lambda i: te.sum(T[i, k1], axis=k1), name="S1")
    S2 = te.compute((r,), lambda i: te.max(T[i, k2], axis=k2), name="S2")
    m = rivet.build(rivet.create_schedule([S1, S2]), [X, S1, S2], target="cpu", name="f")
    assert "local T: float32[1, c]" in m.get_source("ir")
    f = m["f"]
    s1, s2 = torch.full((4,), float("nan")), torch.full((4,), float("nan"))
    with pytest.raises(rivet.MemoryError, match="MAX_ALLOC_BYTES"):
        f(torch.zeros(1).expand(4, cols), s1, s2)
    x = torch.randn(4, 37)
    f(x, s1, s2)
    assert_matches(s1.numpy(), x.double().exp().sum(1).numpy(), op="composite", k=37,
                   terms=x.double().exp().sum(1).numpy())
    # The max of exps: exactly one exp's value (rivet's float32 exp, <= 1 ulp).
    assert_matches(s2.numpy(), x.double().exp().max(1).values.numpy(), op="transcendental")
