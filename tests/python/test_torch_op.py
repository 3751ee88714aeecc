"""rivet.torch.custom_op: rivet functions as torch custom operators.

What must hold: torch.compile(fullgraph=True) with no graph break, also
dynamic=True over two sizes with one graph; torch.export captures the op; gradcheck in
float64 with a backward given as a rivet function (and as a Python callable);
torch.library.opcheck with its default test utils; a clear error on backward without a
backward; clear errors for bad registrations and bad inputs (at trace time too); strided
views; outputs poisoned (allocated outputs through a NaN-filling torch.empty) before runs.
"""

import itertools
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import rivet  # noqa: E402
import rivet.torch as rt  # noqa: E402
from rivet import te  # noqa: E402

_ids = itertools.count()


def opname(tag):
    """A fresh op name: torch's op registry is process-global."""
    return f"rivet_test::{tag}_{next(_ids)}"


def randn(rng, *shape, dtype=torch.float32):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


# ---- rivet functions ------------------------------------------------------------------------


def build_gemm(dtype="float32"):
    m, k, n = te.var("m"), te.var("k"), te.var("n")
    A = te.placeholder((m, k), dtype, name="A")
    B = te.placeholder((k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return rivet.build(rivet.create_schedule(C), [A, B, C], target="cpu", name="gemm")["gemm"]


def build_gemm_backward(dtype="float64"):
    """(A, B, dC) -> (dA = dC @ B^T, dB = A^T @ dC): the backward convention of custom_op."""
    m, k, n = te.var("m"), te.var("k"), te.var("n")
    A = te.placeholder((m, k), dtype, name="A")
    B = te.placeholder((k, n), dtype, name="B")
    dC = te.placeholder((m, n), dtype, name="dC")
    rj = te.reduce_axis((0, n), name="rj")
    ri = te.reduce_axis((0, m), name="ri")
    dA = te.compute((m, k), lambda i, p: te.sum(dC[i, rj] * B[p, rj], axis=rj), name="dA")
    dB = te.compute((k, n), lambda p, j: te.sum(A[ri, p] * dC[ri, j], axis=ri), name="dB")
    s = rivet.create_schedule([dA, dB])
    return rivet.build(s, [A, B, dC, dA, dB], target="cpu", name="gemm_bwd")["gemm_bwd"]


def build_bias_gelu(dtype="float32"):
    m, n = te.var("m"), te.var("n")
    X = te.placeholder((m, n), dtype, name="X")
    b = te.placeholder((n,), dtype, name="b")

    def f(i, j):
        v = X[i, j] + b[j]
        return 0.5 * v * (1.0 + te.erf(v * 0.7071067811865476))

    Y = te.compute((m, n), f, name="Y")
    mod = rivet.build(rivet.create_schedule(Y), [X, b, Y], target="cpu", name="bias_gelu")
    return mod["bias_gelu"]


def build_sum_diff(dtype="float32"):
    """Two outputs: S = X + Y, D = X - Y over (n, 4) (a fixed dim too)."""
    n = te.var("n")
    X = te.placeholder((n, 4), dtype, name="X")
    Y = te.placeholder((n, 4), dtype, name="Y")
    S = te.compute((n, 4), lambda i, j: X[i, j] + Y[i, j], name="S")
    D = te.compute((n, 4), lambda i, j: X[i, j] - Y[i, j], name="D")
    s = rivet.create_schedule([S, D])
    return rivet.build(s, [X, Y, S, D], target="cpu", name="sum_diff")["sum_diff"]


@pytest.fixture(scope="module", autouse=True, params=["native", "python"])
def kernel_path(request):
    """Every test runs on both paths of custom_op: the C++ kernels (the default where the
    bridge builds; tests/python/test_torch_native.py covers what is specific to it) and the
    Python kernels of torch.library.custom_op (RIVET_TORCH_NATIVE=0)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("RIVET_TORCH_NATIVE", "0" if request.param == "python" else "")
    yield request.param
    mp.undo()


@pytest.fixture(scope="module")
def ops(kernel_path):
    return dict(
        mm=rt.custom_op(build_gemm(), opname("gemm")),
        bias_gelu=rt.custom_op(build_bias_gelu(), opname("bias_gelu")),
    )


@pytest.fixture
def poisoned_empty(monkeypatch):
    """Every torch.empty (the op's output allocation) is NaN-filled: an element the kernel
    does not write shows in the comparison."""
    real = torch.empty

    def empty(*a, **k):
        t = real(*a, **k)
        return t.fill_(float("nan")) if t.dtype.is_floating_point else t

    monkeypatch.setattr(torch, "empty", empty)


def reference(x, w, b):
    return torch.nn.functional.gelu(x @ w + b)


# ---- schema and eager calls -----------------------------------------------------------------


def test_schema_from_signature(ops):
    schema = str(ops["mm"].default._schema)
    assert schema.endswith("(Tensor A, Tensor B) -> Tensor"), schema
    f = rivet.get_global_func("testing.axpy")
    op = rt.custom_op(f, opname("axpy"), mutates=True)
    assert str(op.default._schema).endswith("(float alpha, Tensor x, Tensor(a2!) y) -> ()")
    two = rt.custom_op(build_sum_diff(), opname("sum_diff"))
    assert str(two.default._schema).endswith("(Tensor X, Tensor Y) -> (Tensor, Tensor)")


def test_eager_matches_torch(ops, rng, poisoned_empty):
    x, w, b = randn(rng, 6, 9), randn(rng, 9, 5), randn(rng, 5)
    y = ops["bias_gelu"](ops["mm"](x, w), b)
    assert y.dtype == torch.float32 and y.shape == (6, 5)
    torch.testing.assert_close(y, reference(x, w, b), rtol=1e-5, atol=1e-5)


def test_strided_views(ops, rng, poisoned_empty):
    # A transposed and a stepped view: rivet reads them in place (no contiguous copy).
    xt = randn(rng, 9, 6).t()
    w = randn(rng, 9, 10)[:, ::2]
    assert not xt.is_contiguous() and not w.is_contiguous()
    torch.testing.assert_close(ops["mm"](xt, w), xt @ w, rtol=1e-5, atol=1e-5)


def test_two_outputs(rng, poisoned_empty):
    op = rt.custom_op(build_sum_diff(), opname("sum_diff"))
    x, y = randn(rng, 7, 4), randn(rng, 7, 8)[:, ::2]
    s, d = op(x, y)
    torch.testing.assert_close(s, x + y)
    torch.testing.assert_close(d, x - y)


def test_mutates_writes_in_place(rng, poison):
    op = rt.custom_op(build_gemm(), opname("gemm_out"), mutates=True)
    assert str(op.default._schema).endswith("(Tensor A, Tensor B, Tensor(a2!) C) -> ()")
    x, w = randn(rng, 5, 3), randn(rng, 3, 4)
    c = poison(torch.empty(4, 5)).t()  # a strided output, written in place
    assert op(x, w, c) is None
    torch.testing.assert_close(c, x @ w, rtol=1e-5, atol=1e-5)
    axpy = rt.custom_op(rivet.get_global_func("testing.axpy"), opname("axpy"), mutates=True)
    a, y0 = randn(rng, 8, dtype=torch.float64), randn(rng, 8, dtype=torch.float64)
    y = y0.clone()
    axpy(2.5, a, y)
    torch.testing.assert_close(y, 2.5 * a + y0)


def test_mutates_refuses_grad(rng):
    op = rt.custom_op(build_gemm(), opname("gemm_out"), mutates=True)
    a, w, c = randn(rng, 3, 4).requires_grad_(), randn(rng, 4, 2), torch.empty(3, 2)
    # Never silently gradient-free: the written output would have no grad_fn.
    with pytest.raises(rivet.NotDifferentiableError, match=r"mutates=True.*requires grad"):
        op(a, w, c)
    with pytest.raises(rivet.NotDifferentiableError):
        op(a.detach(), w, c.requires_grad_())
    with torch.no_grad():
        c2 = torch.full((3, 2), float("nan"))
        op(a, w, c2)
    torch.testing.assert_close(c2, a.detach() @ w, rtol=1e-5, atol=1e-5)


def test_import_rivet_does_not_import_torch():
    code = "import sys, rivet; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- torch.compile and torch.export ---------------------------------------------------------


def test_compile_fullgraph_no_break(ops, rng):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    mm, bg = ops["mm"], ops["bias_gelu"]

    def model(x, w, b):
        return bg(mm(x, w), b) * 2.0

    compiled = torch.compile(model, fullgraph=True)
    x, w, b = randn(rng, 8, 16), randn(rng, 16, 4), randn(rng, 4)
    torch.testing.assert_close(compiled(x, w, b), model(x, w, b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled(x, w, b), 2 * reference(x, w, b), rtol=1e-5, atol=1e-5)
    assert not torch._dynamo.utils.counters["graph_break"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_compile_dynamic_symbolic_sizes(ops, rng):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    mm, bg = ops["mm"], ops["bias_gelu"]

    def model(x, w, b):
        return bg(mm(x, w), b)

    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for m, k, n in [(5, 7, 3), (11, 13, 6)]:
        x, w, b = randn(rng, m, k), randn(rng, k, n), randn(rng, n)
        y = compiled(x, w, b)
        assert y.shape == (m, n)
        torch.testing.assert_close(y, reference(x, w, b), rtol=1e-5, atol=1e-5)
    # One graph served both sizes: the dims stayed symbolic through the fake implementation.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["graph_break"]


def test_export_captures_op(ops, rng):
    mm, bg = ops["mm"], ops["bias_gelu"]

    class Model(torch.nn.Module):
        def forward(self, x, w, b):
            return bg(mm(x, w), b)

    x, w, b = randn(rng, 6, 5), randn(rng, 5, 3), randn(rng, 3)
    m = torch.export.Dim("m")
    ep = torch.export.export(Model(), (x, w, b), dynamic_shapes=({0: m}, None, None))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert mm.default in targets and bg.default in targets, targets
    x2 = randn(rng, 9, 5)
    torch.testing.assert_close(ep.module()(x2, w, b), reference(x2, w, b), rtol=1e-5, atol=1e-5)


# ---- autograd -------------------------------------------------------------------------------


def test_gradcheck_rivet_backward(rng):
    op = rt.custom_op(build_gemm("float64"), opname("gemm64"), backward=build_gemm_backward())
    a = randn(rng, 4, 3, dtype=torch.float64).requires_grad_()
    b = randn(rng, 3, 5, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(op, (a, b))
    # The gradients themselves, against torch's, through strided views too.
    at = randn(rng, 3, 4, dtype=torch.float64).t().detach().requires_grad_()
    g = randn(rng, 4, 5, dtype=torch.float64)
    op(at, b).backward(g)
    torch.testing.assert_close(at.grad, g @ b.detach().t())
    torch.testing.assert_close(b.grad, at.detach().t() @ g)


def test_gradcheck_python_backward(rng):
    def backward(ctx, grad):
        a, b = ctx.inputs
        return grad @ b.t(), a.t() @ grad

    op = rt.custom_op(build_gemm("float64"), opname("gemm64py"), backward=backward)
    a = randn(rng, 3, 2, dtype=torch.float64).requires_grad_()
    b = randn(rng, 2, 4, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(op, (a, b))


def test_compiled_training_step_uses_backward_op(rng):
    torch._dynamo.reset()
    bwd = build_gemm_backward("float32")
    op = rt.custom_op(build_gemm(), opname("gemm_train"), backward=bwd)

    def loss(x, w):
        return (op(x, w) ** 2).sum()

    x = randn(rng, 6, 4)
    w1 = randn(rng, 4, 3).requires_grad_()
    w2 = w1.detach().clone().requires_grad_()
    torch.compile(loss, fullgraph=True)(x, w1).backward()
    (x @ w2).pow(2).sum().backward()
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-4, atol=1e-4)


def test_no_backward_is_a_clear_error(rng):
    op = rt.custom_op(build_gemm(), opname("gemm_nobwd"), backward=None)
    a, w = randn(rng, 3, 4).requires_grad_(), randn(rng, 4, 2)
    y = op(a, w)  # the forward works
    torch.testing.assert_close(y.detach(), a.detach() @ w, rtol=1e-5, atol=1e-5)
    with pytest.raises(
        rivet.NotDifferentiableError, match=r"gemm.*has no backward \(it was registered with backward=None\).*backward="
    ):
        y.sum().backward()


# ---- automatic backward (Function.backward(), from te.gradient) -----------------------------


def build_two_outputs(dtype):
    """Several outputs, one read by the other, an int input and an int output:
    P = X * w (broadcast), S[i] = sum_j tanh(P[i, j]) * X[i, j] + idx[i], K = idx * 3."""
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), dtype, name="X")
    w = te.placeholder((m,), dtype, name="w")
    idx = te.placeholder((n,), "int64", name="idx")
    P = te.compute((n, m), lambda i, j: X[i, j] * w[j], name="P")
    r = te.reduce_axis((0, m), name="r")
    S = te.compute(
        (n,), lambda i: te.sum(te.tanh(P[i, r]) * X[i, r] + te.cast(dtype, idx[i]), axis=r), name="S"
    )
    K = te.compute((n,), lambda i: idx[i] * 3, name="K")
    s = rivet.create_schedule([P, S, K])
    return rivet.build(s, [X, w, idx, P, S, K], target="cpu", name="two_out")["two_out"]


def torch_two_outputs(x, w, idx):
    p = x * w
    return p, (torch.tanh(p) * x + idx.to(x.dtype)[:, None]).sum(1), idx * 3


def test_auto_backward_gradcheck_several_outputs_and_int_arguments(rng):
    op = rt.custom_op(build_two_outputs("float64"), opname("two_out"))
    x = randn(rng, 4, 5, dtype=torch.float64).requires_grad_()
    w = randn(rng, 5, dtype=torch.float64).requires_grad_()
    idx = torch.from_numpy(rng.integers(-9, 9, size=4))
    got = op(x, w, idx)
    for g, e in zip(got, torch_two_outputs(x, w, idx)):
        torch.testing.assert_close(g, e)
    assert torch.autograd.gradcheck(lambda x, w: op(x, w, idx)[:2], (x, w))
    # Against torch's autograd on fresh random cotangents.
    hp, hs = randn(rng, 4, 5, dtype=torch.float64), randn(rng, 4, dtype=torch.float64)
    gx, gw = torch.autograd.grad(got[:2], (x, w), (hp, hs))
    ex, ew = torch.autograd.grad(torch_two_outputs(x, w, idx)[:2], (x, w), (hp, hs))
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gw, ew)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_auto_backward_of_library_kernels_in_compiled_training(rng, dtype, poisoned_empty):
    """rivet.kernels' softmax and layer_norm are differentiable torch ops with no backward
    written: torch.compile(fullgraph, dynamic) over two sizes, gradients equal torch's."""
    torch._dynamo.reset()
    tdt = getattr(torch, dtype)
    sm = rt.custom_op(rivet.kernels.softmax(dtype), opname("sm"))
    ln = rt.custom_op(rivet.kernels.layer_norm(dtype), opname("ln"))

    def model(x, g, b):
        return (sm(ln(x, g, b)) * torch.arange(x.shape[1], dtype=x.dtype)).sum()

    def ref(x, g, b):
        y = torch.nn.functional.layer_norm(x, (x.shape[1],), g, b, eps=1e-5)
        return (torch.softmax(y, -1) * torch.arange(x.shape[1], dtype=x.dtype)).sum()

    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=1e-9, atol=1e-10)
    for rows in (3, 7):
        x = randn(rng, rows, 6, dtype=tdt).requires_grad_()
        g = randn(rng, 6, dtype=tdt).requires_grad_()
        b = randn(rng, 6, dtype=tdt).requires_grad_()
        got = torch.autograd.grad(compiled(x, g, b), (x, g, b))
        want = torch.autograd.grad(ref(x, g, b), (x, g, b))
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e, **tol)


def test_saved_activations_path(rng, poisoned_empty):
    """A backward that reads forward values (softmax's exponentials and row sums) runs on
    the saved-activations path: under autograd the op runs its ``_fwd`` op, which also
    writes them, and its ``_backward`` op reads them (docs/gradient.md). Gradients equal
    torch's on fresh data; gradcheck and opcheck pass; without grad nothing is saved."""
    fwd, bwd, n_res = rivet.kernels.softmax("float64").training_pair()
    assert n_res == 2
    name = opname("sm_saved")
    op = rt.custom_op(rivet.kernels.softmax("float64"), name)
    ns, short = name.split("::")
    fwd_op = getattr(getattr(torch.ops, ns), short + "_fwd")
    bwd_op = getattr(getattr(torch.ops, ns), short + "_backward")
    assert len(fwd_op.default._schema.returns) == 3  # Y, then the residuals sum and exp
    assert [a.name for a in bwd_op.default._schema.arguments] == [
        "X", "Y", "saved_sum", "saved_exp", "grad_Y"
    ]
    x = randn(rng, 4, 9, dtype=torch.float64).requires_grad_()
    y = op(x)
    assert type(y.grad_fn).__name__ == f"rivet_{short}Backward"
    torch.testing.assert_close(y, torch.softmax(x.detach(), -1))
    h = randn(rng, 4, 9, dtype=torch.float64)
    (g,) = torch.autograd.grad(y, x, h)
    (want,) = torch.autograd.grad(torch.softmax(x, -1), x, h)
    torch.testing.assert_close(g, want)
    assert torch.autograd.gradcheck(op, (x,))
    torch.library.opcheck(op, (x,))
    with torch.no_grad():
        assert op(x).grad_fn is None
    # torch.compile over the saved path: the joint graph calls both ops.
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: (op(t) * t).sum(), fullgraph=True)
    (gc_,) = torch.autograd.grad(compiled(x), x)
    (we,) = torch.autograd.grad((torch.softmax(x, -1) * x).sum(), x)
    torch.testing.assert_close(gc_, we)


def test_auto_backward_refused_with_the_reason(rng, tmp_path):
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] * 2.0, name="C")
    mod = rivet.build(rivet.create_schedule(C), [A, C], target="cpu", name="dbl")
    mod.save(str(tmp_path / "dbl.rivet"))
    loaded = rivet.load_module(str(tmp_path / "dbl.rivet"))["dbl"]
    with pytest.raises(rivet.NotDifferentiableError, match="'dbl' was loaded from a saved module"):
        loaded.backward()
    op = rt.custom_op(loaded, opname("loaded"))  # registers: the forward works
    a = randn(rng, 5).requires_grad_()
    y = op(a)
    torch.testing.assert_close(y.detach(), a.detach() * 2)
    with pytest.raises(rivet.NotDifferentiableError, match="has no backward .*loaded from a saved module"):
        y.sum().backward()
    # A host callback on the path.
    E = te.extern((n,), [A], lambda a, out: None, dtype="float32", name="E")
    D = te.compute((n,), lambda i: E[i] * 2.0, name="D")
    ext = rivet.build(rivet.create_schedule(D), [A, D], target="cpu", name="ext")["ext"]
    with pytest.raises(rivet.NotDifferentiableError, match="function 'ext'.*'E'.*host callback"):
        ext.backward()


def test_auto_backward_is_built_once_and_named():
    f = build_gemm("float64")
    b1, b2 = f.backward(), f.backward()
    assert b1.name == b2.name == "gemm_backward"
    assert [p["name"] for p in b1._params][:3] == ["A", "B", "grad_C"]


# ---- opcheck --------------------------------------------------------------------------------


def test_opcheck(ops, rng):
    x, w, b = randn(rng, 5, 4), randn(rng, 4, 3), randn(rng, 3)
    torch.library.opcheck(ops["mm"], (x, w))
    torch.library.opcheck(ops["mm"], (randn(rng, 4, 5).t(), w))
    torch.library.opcheck(ops["bias_gelu"], (randn(rng, 5, 3), b))
    two = rt.custom_op(build_sum_diff(), opname("sum_diff"))
    torch.library.opcheck(two, (randn(rng, 3, 4), randn(rng, 3, 4)))
    out = rt.custom_op(build_gemm(), opname("gemm_out"), mutates=True)
    torch.library.opcheck(out, (x, w, torch.empty(5, 3)))
    axpy = rt.custom_op(rivet.get_global_func("testing.axpy"), opname("axpy"), mutates=True)
    torch.library.opcheck(axpy, (1.5, randn(rng, 6), randn(rng, 6)))


def test_opcheck_with_backward(rng):
    op = rt.custom_op(build_gemm("float64"), opname("gemm64"), backward=build_gemm_backward())
    a = randn(rng, 4, 3, dtype=torch.float64).requires_grad_()
    b = randn(rng, 3, 2, dtype=torch.float64).requires_grad_()
    torch.library.opcheck(op, (a, b))


# ---- errors at trace time -------------------------------------------------------------------


def test_trace_time_shape_error_names_op_and_dim(ops, rng):
    torch._dynamo.reset()
    f = torch.compile(lambda x, w: ops["mm"](x, w), fullgraph=True, dynamic=True)
    with pytest.raises(Exception) as e:
        f(randn(rng, 3, 4), randn(rng, 5, 2))
    text = str(e.value)
    assert "rivet_test::gemm" in text and "dim 'k'" in text, text


def test_fake_checks_dtype_rank_dims_device(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    mm = ops["mm"]
    name = mm.default.name()
    with FakeTensorMode():
        ok = mm(torch.empty(3, 4), torch.empty(4, 2))
        assert ok.shape == (3, 2) and ok.dtype == torch.float32
        dtype_msg = r"argument 1 \('B'\) expected dtype float32, got float64"
        with pytest.raises(rivet.DTypeError, match=dtype_msg):
            mm(torch.empty(3, 4), torch.empty(4, 2, dtype=torch.float64))
        with pytest.raises(rivet.ShapeError, match=r"\('A'\) expected a 2-d tensor, got 3-d"):
            mm(torch.empty(3, 4, 1), torch.empty(4, 2))
        with pytest.raises(rivet.ShapeError, match=r"dim 'k' is 4 from argument 0 \('A'\) but 5"):
            mm(torch.empty(3, 4), torch.empty(5, 2))
        with pytest.raises(rivet.DeviceError, match=r"\('A'\) is on cuda:0.*runs on cpu"):
            mm(torch.empty(3, 4, device="cuda"), torch.empty(4, 2, device="cuda"))
    assert name.startswith("rivet_test::gemm")
    two = rt.custom_op(build_sum_diff(), opname("sum_diff"))
    with FakeTensorMode():
        with pytest.raises(rivet.ShapeError, match=r"argument 1 \('Y'\) expected size 4 in dim 1"):
            two(torch.empty(3, 4), torch.empty(3, 5))


def test_eager_errors(ops, rng):
    name = ops["mm"].default.name()
    with pytest.raises(rivet.ShapeError, match=f"{name}: dim 'k' is 4 from argument 0"):
        ops["mm"](randn(rng, 3, 4), randn(rng, 5, 2))
    with pytest.raises(rivet.DTypeError, match=f"{name}: argument 0 \\('A'\\) expected dtype"):
        ops["mm"](randn(rng, 3, 4, dtype=torch.float64), randn(rng, 4, 2, dtype=torch.float64))
    out = rt.custom_op(build_gemm(), opname("gemm_out"), mutates=True)
    with pytest.raises(rivet.ShapeError, match=r"dim 'n' is 2 from argument 1 \('B'\) but 3"):
        out(randn(rng, 3, 4), randn(rng, 4, 2), torch.empty(3, 3))


# ---- one rivet error on both paths, whatever the tensor -------------------------------------
# Found by a probe: the Python path raised a builtin IndexError for an input of the wrong rank
# and torch's RuntimeError for an output too large to allocate, the native path torch's
# RuntimeError for a sparse input, both torch's NotImplementedError for a nested one, and a
# parameter named 'α' failed in torch's schema parser. tests/python/test_fuzz_torch_ops.py
# draws many more combinations.


def build_outer():
    m, n = te.var("m"), te.var("n")
    A = te.placeholder((m,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    C = te.compute((m, n), lambda i, j: A[i] * B[j], name="C")
    return rivet.build(rivet.create_schedule(C), [A, B, C], target="cpu", name="outer")["outer"]


def test_wrong_rank_is_a_shape_error(ops, rng):
    mm = ops["mm"]
    name = mm.default.name()
    with pytest.raises(rivet.ShapeError, match=rf"{name}: argument 0 \('A'\) expected a 2-d tensor, got 1-d"):
        mm(randn(rng, 4), randn(rng, 4, 2))
    with pytest.raises(rivet.ShapeError, match=r"argument 1 \('B'\) expected a 2-d tensor, got 1-d"):
        mm(randn(rng, 3, 4), randn(rng, 4))
    with pytest.raises(rivet.ShapeError, match=r"argument 0 \('A'\) expected a 2-d tensor, got 0-d"):
        mm(torch.tensor(1.0), randn(rng, 4, 2))


def test_an_output_too_large_is_a_memory_error_eager_and_fake():
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = rt.custom_op(build_outer(), opname("outer"))
    name = op.default.name()
    # Stride-0 views of 2^40, 2^31 and 2^24 elements (no memory behind them): the outer
    # product's bytes overflow int64, or are 2^50, over rivet.MAX_ALLOC_BYTES (2^48).
    for m, n, size in [(2**40, 2**31, "more than 2\\^63 bytes"), (2**24, 2**24, f"{2**50} bytes")]:
        a, b = torch.ones(1).expand(m), torch.ones(1).expand(n)
        msg = (
            rf"{name} .*: cannot allocate output 0 of shape \[{m}, {n}\] \(float32\): {size}, "
            r"over rivet's limit of 281474976710656 bytes \(rivet.MAX_ALLOC_BYTES\)"
        )
        with pytest.raises(rivet.MemoryError, match=msg):
            op(a, b)
        with FakeTensorMode() as mode:  # the fake implementation (torch.compile) says the same
            with pytest.raises(rivet.MemoryError, match=msg):
                op(mode.from_tensor(a), mode.from_tensor(b))
    x, y = torch.arange(3.0), torch.arange(4.0)
    torch.testing.assert_close(op(x, y), x[:, None] * y[None, :])


def overcommit_always():
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return f.read().strip() == "1"
    except OSError:
        return True  # not Linux: unknown, so assume the worst


@pytest.mark.skipif(
    overcommit_always(),
    reason="where the system grants any allocation, the kernel's write to 4 TB would kill the process",
)
def test_an_output_the_system_refuses_is_a_memory_error():
    # 4 TB: under rivet's limit, so torch's allocator is asked, and refuses.
    op = rt.custom_op(build_outer(), opname("outer"))
    a = torch.ones(1).expand(2**20)
    with pytest.raises(rivet.MemoryError, match=r"cannot allocate output 0 of shape \[1048576, 1048576\]"):
        op(a, a)


def test_sparse_mkldnn_and_nested_inputs_are_dlpack_errors(ops, rng):
    from torch._subclasses.fake_tensor import FakeTensorMode

    mm = ops["mm"]
    name = mm.default.name()
    x, w = randn(rng, 3, 4), randn(rng, 4, 2)
    for kind, t in [
        ("a sparse_coo", x.to_sparse()),
        ("a sparse_csr", x.to_sparse_csr()),
        ("a _mkldnn", x.to_mkldnn()),
        ("a sparse_coo", x.to_sparse().requires_grad_()),
        ("a nested", torch.nested.nested_tensor([x[0], x[1]])),
        ("a nested", torch.nested.nested_tensor([x, x[:2]], layout=torch.jagged)),
    ]:
        msg = rf"{name}: argument 0 \('A'\) is {kind} tensor, but rivet takes dense strided"
        with pytest.raises(rivet.DLPackError, match=msg):
            mm(t, w)
    with pytest.raises(rivet.DLPackError, match=r"argument 1 \('B'\) is a sparse_coo tensor"):
        mm(x, w.to_sparse())
    # Nested and dense together: the first bad argument is named, whichever kernel runs.
    with pytest.raises(rivet.DTypeError, match=r"argument 0 \('A'\) expected dtype float32"):
        mm(x.double(), torch.nested.nested_tensor([w[0], w[1]], layout=torch.jagged))
    xs = x.to_sparse()
    with FakeTensorMode() as mode:  # the fake implementation (torch.compile) says the same
        with pytest.raises(rivet.DLPackError, match=r"argument 0 \('A'\) is a sparse_coo tensor"):
            mm(mode.from_tensor(xs), mode.from_tensor(w))
    # Quantized and complex tensors: their dtypes are not the signature's.
    q = torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)
    with pytest.raises(rivet.DTypeError, match=r"argument 0 \('A'\) expected dtype float32, got qint8"):
        mm(q, w)
    with pytest.raises(rivet.DTypeError, match=r"argument 1 \('B'\) expected dtype float32, got complex64"):
        mm(x, w.to(torch.complex64))


def test_negative_views_compute_and_huge_ones_are_memory_errors(ops, rng):
    """torch resolves a negative view (a copy) before any kernel of the op: of a huge
    stride-0 tensor that copy was torch's RuntimeError from its allocator (found by the
    fuzzer), now the op's checks come first and the copy is checked against rivet's limit."""
    mm = ops["mm"]
    name = mm.default.name()
    x, w = randn(rng, 3, 4), randn(rng, 4, 2)
    torch.testing.assert_close(mm(torch._neg_view(x), w), -x @ w)
    torch.testing.assert_close(mm(x, torch._neg_view(w)), -x @ w)
    xg = x.clone().requires_grad_()
    mm(torch._neg_view(xg), w).sum().backward()
    torch.testing.assert_close(xg.grad, -torch.ones(3, 2) @ w.t())
    with pytest.raises(rivet.DTypeError, match=r"argument 1 \('B'\) expected dtype float32"):
        mm(torch._neg_view(x), w.double())
    big = torch.ones(1, 1).expand(2**47, 4)  # the output, 2^47 x 2 floats, is over the limit
    msg = rf"{name} .*cannot allocate output 0 of shape \[{2**47}, 2\]"
    with pytest.raises(rivet.MemoryError, match=msg):
        mm(torch._neg_view(big), w)
    # The output is small, but the copy of the input is 2^50 bytes.
    huge_k = torch.ones(1, 1).expand(2, 2**47)
    msg = r"argument 0 \('A'\) is a negative or conjugate view.*copy of shape \[2, 140737488355328\]"
    with pytest.raises(rivet.MemoryError, match=msg):
        mm(torch._neg_view(huge_k), torch.ones(1, 1).expand(2**47, 2))


def test_meta_tensors_give_shapes_and_mixed_devices_are_device_errors(ops, rng):
    mm = ops["mm"]
    out = mm(torch.empty(3, 4, device="meta"), torch.empty(4, 2, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 2)
    # A meta tensor with a CPU one used to give a meta result (the op's Meta kernel ran).
    msg = r"different devices: argument 0 \('A'\) is on meta but argument 1 \('B'\) is on cpu"
    with pytest.raises(rivet.DeviceError, match=msg):
        mm(torch.empty(3, 4, device="meta"), randn(rng, 4, 2))
    with pytest.raises(rivet.DeviceError, match=r"\('A'\) is on cpu but argument 1 \('B'\) is on meta"):
        mm(randn(rng, 3, 4), torch.empty(4, 2, device="meta"))


def test_parameter_names_torch_cannot_parse_get_argN(rng):
    # 'α' is a Python identifier, but torch's schema takes ASCII ones; 'Ellipsis' is reserved
    # by torch's parser. A real parameter named 'arg0' keeps its name: the replacement moves.
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="α")
    B = te.placeholder((n,), "float32", name="arg0")
    E = te.placeholder((n,), "float32", name="Ellipsis")
    C = te.compute((n,), lambda i: A[i] * 2.0 + B[i] - E[i], name="γ")
    f = rivet.build(rivet.create_schedule(C), [A, B, E, C], target="cpu", name="greek")["greek"]
    op = rt.custom_op(f, opname("greek"))
    assert str(op.default._schema).endswith("(Tensor arg0_1, Tensor arg0, Tensor arg2) -> Tensor")
    x, y, z = randn(rng, 5), randn(rng, 5), randn(rng, 5)
    torch.testing.assert_close(op(x, y, z), x * 2 + y - z)
    torch.testing.assert_close(op(arg0_1=x, arg0=y, arg2=z), x * 2 + y - z)
    # Errors name the rivet parameter.
    with pytest.raises(rivet.DTypeError, match=r"argument 0 \('α'\) expected dtype float32"):
        op(x.double(), y, z)


def test_mutates_under_compile(rng, poison):
    torch._dynamo.reset()
    op = rt.custom_op(build_gemm(), opname("gemm_out"), mutates=True)

    def f(x, w, out):
        op(x, w, out)
        return out + 1.0

    x, w = randn(rng, 5, 3), randn(rng, 3, 4)
    out = poison(torch.empty(5, 4))
    y = torch.compile(f, fullgraph=True)(x, w, out)
    torch.testing.assert_close(out, x @ w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, x @ w + 1.0, rtol=1e-5, atol=1e-5)


# ---- bad registrations ----------------------------------------------------------------------


def test_bad_registrations(uname):
    gemm = build_gemm()
    for bad in ["gemm", "a::b::c", "ns::", "1ns::op", "ns::op.default", "ns::op\n", 3]:
        with pytest.raises(rivet.ArgumentError, match="'namespace::op_name'"):
            rt.custom_op(gemm, bad)
    with pytest.raises(rivet.ArgumentError, match=r"\('func'\) must be a rivet.Function"):
        rt.custom_op(lambda x: x, opname("py"))
    name = uname()
    rivet.register_func(name, lambda x: x)
    untyped = rivet.get_global_func(name)
    with pytest.raises(rivet.ArgumentError, match="has no typed signature"):
        rt.custom_op(untyped, opname("untyped"))
    with pytest.raises(rivet.ArgumentError, match=r"argument 0 \('x'\) is of kind 'any'"):
        rt.custom_op(rivet.get_global_func("testing.echo"), opname("echo"))


def test_taken_name():
    name = opname("taken")
    rt.custom_op(build_gemm(), name)
    with pytest.raises(rivet.RegistryError, match="exists already.*override=True"):
        rt.custom_op(build_gemm(), name)
    rt.custom_op(build_bias_gelu(), name, override=True)  # replaced on request
    with pytest.raises(rivet.RegistryError, match="not by rivet.torch.custom_op"):
        rt.custom_op(build_gemm(), "aten::mm")


def test_output_not_derivable():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n - 2,), lambda i: A[i + 1], name="C")
    f = rivet.build(rivet.create_schedule(C), [A, C], target="cpu", name="interior")["interior"]
    with pytest.raises(rivet.ArgumentError, match=r"output 1 \('C'\) dim 0 is an expression"):
        rt.custom_op(f, opname("interior"))
    rt.custom_op(f, opname("interior"), mutates=True)  # the caller passes the output
    m = te.var("m")
    B = te.placeholder((n,), "float32", name="B")
    D = te.compute((m,), lambda i: B[0], name="D")
    g = rivet.build(rivet.create_schedule(D), [B, D], target="cpu", name="free_dim")["free_dim"]
    with pytest.raises(rivet.ArgumentError, match=r"output 1 \('D'\) dim 0 is 'm', which no input"):
        rt.custom_op(g, opname("free_dim"))
    with pytest.raises(rivet.ArgumentError, match=r"output 2 \('y'\) has dtype float32\|float64"):
        rt.custom_op(rivet.get_global_func("testing.axpy"), opname("axpy"))


def test_bad_backward():
    with pytest.raises(rivet.ArgumentError, match=r"must take the forward's 2 input\(s\) then 1"):
        rt.custom_op(build_gemm("float64"), opname("g"), backward=build_gemm("float64"))
    with pytest.raises(rivet.ArgumentError, match="mutates=True"):
        rt.custom_op(build_gemm(), opname("g"), mutates=True, backward=lambda ctx, g: g)
    with pytest.raises(rivet.ArgumentError, match="argument 'backward' must be"):
        rt.custom_op(build_gemm(), opname("g"), backward=3)
    with pytest.raises(rivet.DeviceError, match="built for 'cpu'"):
        rt.custom_op(build_gemm(), opname("g"), device_types="cuda")
