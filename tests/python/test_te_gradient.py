"""rivet.te.gradient: backward functions built from te programs, against torch.autograd.

For each program (matmul, softmax, layer_norm, gelu with erf, conv2d NCHW with padding, a max
reduction, if_then_else): the forward and the gradient stages are built with ``rivet.build``
for the CPU, run on fresh random data in float64 (tight tolerance) and float32 (looser), with
the gradient outputs poisoned with NaN first, and compared with torch.autograd's gradients
for the same head. Also: gradcheck of a rivet.torch.custom_op whose backward is built by
te.gradient (also over symbolic dims inside torch.compile(dynamic=True)), jax.grad through
rivet.jax.ffi_func with a te.gradient backward, the tie rule of max against torch.amax, and
the failure paths (a wrong head,
int tensors, non-tensors, an unrelated input, a chain of 3000 stages); te.prod with zeros.
"""

import pytest

torch = pytest.importorskip("torch")

import itertools  # noqa: E402

import rivet  # noqa: E402
from rivet import te  # noqa: E402

F = torch.nn.functional
TOL = {"float64": dict(rtol=1e-10, atol=1e-10), "float32": dict(rtol=2e-4, atol=2e-5)}
TORCH_DT = {"float64": torch.float64, "float32": torch.float32}


def build_pair(inputs, out):
    """(forward, backward) rivet functions; backward(*inputs, head, *grads) writes grads."""
    head = te.placeholder(out.shape, out.dtype, name="head")
    grads = te.gradient(out, inputs, head)
    assert len(grads) == len(inputs)
    for g, x in zip(grads, inputs):
        # (symbolic dims are expressions: compared as text)
        assert repr(g.shape) == repr(x.shape) and g.dtype == x.dtype
    fwd = rivet.build(rivet.create_schedule(out), [*inputs, out], target="cpu", name="fwd")["fwd"]
    s = rivet.create_schedule(grads)
    bwd = rivet.build(s, [*inputs, head, *grads], target="cpu", name="bwd")["bwd"]
    return fwd, bwd


def check_against_torch(inputs, out, torch_fn, rng, dtype, positive=()):
    fwd, bwd = build_pair(inputs, out)
    tdt = TORCH_DT[dtype]
    xs = []
    for k, x in enumerate(inputs):
        v = torch.from_numpy(rng.standard_normal(tuple(x.shape))).to(tdt)
        xs.append(v.abs() + 0.5 if k in positive else v)
    # Forward first: the rivet forward equals torch's.
    y = torch.full(tuple(out.shape), float("nan"), dtype=tdt)
    rivet.to_pytorch_func(fwd)(*xs, y)
    ref_in = [x.clone().requires_grad_() for x in xs]
    ref_out = torch_fn(*ref_in)
    torch.testing.assert_close(y, ref_out.detach(), **TOL[dtype])
    head = torch.from_numpy(rng.standard_normal(tuple(out.shape))).to(tdt)
    ref_out.backward(head)
    grads = [torch.full(tuple(x.shape), float("nan"), dtype=tdt) for x in inputs]
    rivet.to_pytorch_func(bwd)(*xs, head, *grads)
    for g, r, x in zip(grads, ref_in, inputs):
        assert not torch.isnan(g).any(), f"gradient of {x.name} not written everywhere"
        torch.testing.assert_close(g, r.grad, **TOL[dtype], msg=lambda m: f"d/d{x.name}: {m}")


DTYPES = ["float64", "float32"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul(rng, dtype, transpose_b):
    A = te.placeholder((5, 7), dtype, name="A")
    B = te.placeholder((6, 7) if transpose_b else (7, 6), dtype, name="B")
    k = te.reduce_axis((0, 7), name="k")
    if transpose_b:
        C = te.compute((5, 6), lambda i, j: te.sum(A[i, k] * B[j, k], axis=k), name="C")
        ref = lambda a, b: a @ b.t()  # noqa: E731
    else:
        C = te.compute((5, 6), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        ref = lambda a, b: a @ b  # noqa: E731
    check_against_torch([A, B], C, ref, rng, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_matmul_broadcast(rng, dtype):
    A = te.placeholder((3, 4, 5), dtype, name="A")
    B = te.placeholder((5, 2), dtype, name="B")
    k = te.reduce_axis((0, 5), name="k")
    C = te.compute((3, 4, 2), lambda b, i, j: te.sum(A[b, i, k] * B[k, j], axis=k), name="C")
    check_against_torch([A, B], C, lambda a, b: a @ b, rng, dtype)


def softmax_program(dtype, n=4, m=9, stop=False):
    X = te.placeholder((n, m), dtype, name="X")
    k1 = te.reduce_axis((0, m), name="k1")
    mx = te.compute((n,), lambda i: te.max(X[i, k1], axis=k1), name="mx")
    if stop:
        mx = te.stop_gradient(mx)
    e = te.compute((n, m), lambda i, j: te.exp(X[i, j] - mx[i]), name="e")
    k2 = te.reduce_axis((0, m), name="k2")
    s = te.compute((n,), lambda i: te.sum(e[i, k2], axis=k2), name="s")
    y = te.compute((n, m), lambda i, j: e[i, j] / s[i], name="softmax")
    return X, y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stop", [False, True])
def test_softmax(rng, dtype, stop):
    """With or without te.stop_gradient on the max (zero derivative in exact maths)."""
    X, y = softmax_program(dtype, stop=stop)
    check_against_torch([X], y, lambda x: torch.softmax(x, dim=-1), rng, dtype)


def test_stop_gradient_is_a_constant_to_te_gradient(rng):
    """y = x * stop_gradient(x): values x * x, gradient x (torch's x * x.detach())."""
    X = te.placeholder((6,), "float64", name="X")
    S = te.stop_gradient(X)
    assert S.name == "X_nograd"
    y = te.compute((6,), lambda i: X[i] * S[i], name="y")
    check_against_torch([X], y, lambda x: x * x.detach(), rng, "float64")
    with pytest.raises(TypeError, match="te.stop_gradient: tensor"):
        te.stop_gradient(3.0)


def layer_norm_program(dtype, n=3, m=8, eps=1e-5):
    X = te.placeholder((n, m), dtype, name="X")
    G = te.placeholder((m,), dtype, name="G")
    Bb = te.placeholder((m,), dtype, name="Bb")
    k1 = te.reduce_axis((0, m), name="k1")
    mean = te.compute((n,), lambda i: te.sum(X[i, k1] / m, axis=k1), name="mean")
    k2 = te.reduce_axis((0, m), name="k2")
    var = te.compute(
        (n,), lambda i: te.sum((X[i, k2] - mean[i]) * (X[i, k2] - mean[i]) / m, axis=k2), name="var"
    )
    y = te.compute(
        (n, m),
        lambda i, j: (X[i, j] - mean[i]) * te.rsqrt(var[i] + eps) * G[j] + Bb[j],
        name="ln",
    )
    return [X, G, Bb], y


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm(rng, dtype):
    m = 8
    ins, y = layer_norm_program(dtype, 3, m)
    check_against_torch(ins, y, lambda x, g, b: F.layer_norm(x, (m,), g, b, eps=1e-5), rng, dtype)


# Sizes where the default CPU schedule's rewrites apply to the gradient stages: lane partials
# of the row reductions (from 32 terms), the softmax gradient's vectorized select, layer_norm's
# weight and bias gradients (reductions down columns) in chunks of 64 rows from 128 rows, with
# and without a tail; and the odd sizes around them.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,m", [(1, 1), (3, 17), (17, 97), (128, 33), (129, 5), (1023, 40)])
def test_softmax_and_layer_norm_at_default_schedule_sizes(rng, dtype, n, m):
    X, y = softmax_program(dtype, n, m)
    check_against_torch([X], y, lambda x: torch.softmax(x, dim=-1), rng, dtype)
    ins, y = layer_norm_program(dtype, n, m)
    check_against_torch(ins, y, lambda x, g, b: F.layer_norm(x, (m,), g, b, eps=1e-5), rng, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_erf(rng, dtype):
    X = te.placeholder((4, 6), dtype, name="X")
    y = te.compute(
        (4, 6), lambda i, j: X[i, j] * 0.5 * (1.0 + te.erf(X[i, j] * 0.7071067811865476)), name="gelu"
    )
    # rivet's erf is accurate to 1.5e-7 (docs/dsl.md), so float64 is compared at that level.
    fwd, bwd = build_pair([X], y)
    tdt = TORCH_DT[dtype]
    x = torch.from_numpy(rng.standard_normal((4, 6))).to(tdt)
    h = torch.from_numpy(rng.standard_normal((4, 6))).to(tdt)
    xr = x.clone().requires_grad_()
    F.gelu(xr).backward(h)
    g = torch.full((4, 6), float("nan"), dtype=tdt)
    rivet.to_pytorch_func(bwd)(x, h, g)
    torch.testing.assert_close(g, xr.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pad", [0, 1])
def test_conv2d_nchw(rng, dtype, pad):
    N, C, H, W, K, R, S = 2, 3, 6, 5, 4, 3, 3
    X = te.placeholder((N, C, H, W), dtype, name="X")
    Wt = te.placeholder((K, C, R, S), dtype, name="Wt")
    rc = te.reduce_axis((0, C), name="rc")
    ry = te.reduce_axis((0, R), name="ry")
    rx = te.reduce_axis((0, S), name="rx")
    OH, OW = H + 2 * pad - R + 1, W + 2 * pad - S + 1

    def body(n, f, y, x):
        yy, xx = y + ry - pad, x + rx - pad
        v = X[n, rc, yy, xx]
        if pad:
            inside = te.all(yy >= 0, yy < H, xx >= 0, xx < W)
            v = te.if_then_else(inside, v, 0.0)
        return te.sum(v * Wt[f, rc, ry, rx], axis=[rc, ry, rx])

    Y = te.compute((N, K, OH, OW), body, name="conv")
    check_against_torch([X, Wt], Y, lambda x, w: F.conv2d(x, w, padding=pad), rng, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_reduction(rng, dtype):
    X = te.placeholder((5, 7), dtype, name="X")
    k = te.reduce_axis((0, 7), name="k")
    y = te.compute((5,), lambda i: te.max(X[i, k], axis=k), name="rowmax")
    check_against_torch([X], y, lambda x: torch.amax(x, dim=1), rng, dtype)


def test_max_ties_split_like_torch_amax():
    X = te.placeholder((2, 4), "float64", name="X")
    k = te.reduce_axis((0, 4), name="k")
    y = te.compute((2,), lambda i: te.max(X[i, k], axis=k), name="rowmax")
    _, bwd = build_pair([X], y)
    x = torch.tensor([[3.0, 1.0, 3.0, 3.0], [2.0, 2.0, -1.0, 0.0]], dtype=torch.float64)
    h = torch.tensor([1.5, -2.0], dtype=torch.float64)
    xr = x.clone().requires_grad_()
    torch.amax(xr, dim=1).backward(h)
    g = torch.full((2, 4), float("nan"), dtype=torch.float64)
    rivet.to_pytorch_func(bwd)(x, h, g)
    torch.testing.assert_close(g, xr.grad, rtol=0, atol=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
def test_if_then_else(rng, dtype):
    X = te.placeholder((4, 5), dtype, name="X")
    Yt = te.placeholder((4, 5), dtype, name="Yt")
    out = te.compute(
        (4, 5),
        lambda i, j: te.if_then_else(X[i, j] > 0.2, te.exp(X[i, j]) * Yt[i, j], Yt[i, j] * Yt[i, j]),
        name="sel",
    )
    check_against_torch(
        [X, Yt], out, lambda x, y: torch.where(x > 0.2, torch.exp(x) * y, y * y), rng, dtype
    )


def test_mlp_with_shared_stage_and_head_none(rng):
    """A stage read twice (tanh(h) feeds two consumers); head=None is d sum(out)."""
    X = te.placeholder((3, 4), "float64", name="X")
    W = te.placeholder((4, 5), "float64", name="W")
    k = te.reduce_axis((0, 4), name="k")
    h = te.compute((3, 5), lambda i, j: te.sum(X[i, k] * W[k, j], axis=k), name="h")
    t = te.compute((3, 5), lambda i, j: te.tanh(h[i, j]), name="t")
    out = te.compute((3, 5), lambda i, j: t[i, j] * t[i, j] + te.sigmoid(t[i, j]), name="out")
    gX, gW = te.gradient(out, [X, W])
    f = rivet.build(rivet.create_schedule([gX, gW]), [X, W, gX, gW], target="cpu", name="g")["g"]
    x = torch.from_numpy(rng.standard_normal((3, 4)))
    w = torch.from_numpy(rng.standard_normal((4, 5)))
    ox = torch.full((3, 4), float("nan"), dtype=torch.float64)
    ow = torch.full((4, 5), float("nan"), dtype=torch.float64)
    rivet.to_pytorch_func(f)(x, w, ox, ow)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    tt = torch.tanh(xr @ wr)
    (tt * tt + torch.sigmoid(tt)).sum().backward()
    torch.testing.assert_close(ox, xr.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ow, wr.grad, rtol=1e-10, atol=1e-10)


# ---- through rivet.torch.custom_op ---------------------------------------------------------

_ids = itertools.count()


def test_gradcheck_custom_op_with_te_gradient_backward(rng):
    import rivet.torch as rt

    X, y = softmax_program("float64", n=3, m=5)
    W = te.placeholder((5, 5), "float64", name="W")
    k = te.reduce_axis((0, 5), name="k")
    z = te.compute((3, 5), lambda i, j: te.sum(y[i, k] * W[k, j], axis=k), name="z")
    fwd, bwd = build_pair([X, W], z)
    op = rt.custom_op(fwd, f"rivet_grad_test::softmax_mm_{next(_ids)}", backward=bwd)
    x = torch.from_numpy(rng.standard_normal((3, 5))).requires_grad_()
    w = torch.from_numpy(rng.standard_normal((5, 5))).requires_grad_()
    assert torch.autograd.gradcheck(op, (x, w))


def test_symbolic_shapes_under_torch_compile_dynamic(rng):
    """One forward and one te.gradient backward over symbolic dims, registered as a torch
    op, differentiated inside torch.compile(dynamic=True) at two sizes and by gradcheck."""
    import rivet.torch as rt

    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), "float64", name="X")
    W = te.placeholder((m,), "float64", name="W")
    k = te.reduce_axis((0, m), name="k")
    s = te.compute((n,), lambda i: te.sum(te.exp(X[i, k] * W[k]), axis=k), name="s")
    y = te.compute((n, m), lambda i, j: te.log(s[i]) * X[i, j], name="y")
    fwd, bwd = build_pair([X, W], y)
    op = rt.custom_op(fwd, f"rivet_grad_test::sym_{next(_ids)}", backward=bwd)

    def ref(x, w):
        return torch.log(torch.exp(x * w).sum(dim=1, keepdim=True)) * x

    loss = torch.compile(lambda x, w: op(x, w).sum(), fullgraph=True, dynamic=True)
    for rows, cols in [(3, 4), (6, 2)]:
        x = torch.from_numpy(rng.standard_normal((rows, cols))).requires_grad_()
        w = torch.from_numpy(rng.standard_normal(cols)).requires_grad_()
        loss(x, w).backward()
        xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        ref(xr, wr).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(w.grad, wr.grad, rtol=1e-10, atol=1e-10)
        assert torch.autograd.gradcheck(op, (x.detach().requires_grad_(), w.detach().requires_grad_()))


def test_jax_grad_through_ffi_func_with_te_gradient_backward(rng):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np
    import rivet.jax as rjax
    from jax.test_util import check_grads

    with jax.enable_x64(True):
        X, y = softmax_program("float64", n=4, m=6)
        fwd, bwd = build_pair([X], y)
        f = rjax.ffi_func(fwd, backward=bwd)
        x = rng.standard_normal((4, 6))
        c = rng.standard_normal((4, 6))
        got = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(f(x)) * c)))(x)
        want = jax.grad(lambda x: jnp.sum(jnp.sin(jax.nn.softmax(x, axis=-1)) * c))(x)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)
        check_grads(f, (x,), order=1, modes=["rev"])


# ---- failure paths -------------------------------------------------------------------------


def small_program():
    X = te.placeholder((2, 3), "float32", name="X")
    Y = te.compute((2, 3), lambda i, j: te.exp(X[i, j]), name="Y")
    return X, Y


def test_head_of_wrong_shape_or_dtype():
    X, Y = small_program()
    with pytest.raises(rivet.ArgumentError, match=r"head.*'H'.*\(3, 2\)|head.*'H'"):
        te.gradient(Y, [X], te.placeholder((3, 2), "float32", name="H"))
    with pytest.raises(rivet.ArgumentError, match=r"head.*float32.*'H64'.*float64"):
        te.gradient(Y, [X], te.placeholder((2, 3), "float64", name="H64"))
    with pytest.raises(rivet.ArgumentError, match=r"head must be a te.Tensor.*int"):
        te.gradient(Y, [X], 3)


def test_int_tensors_and_non_tensors_are_refused():
    X, Y = small_program()
    I = te.placeholder((2, 3), "int32", name="I")  # noqa: E741
    with pytest.raises(rivet.ArgumentError, match=r"inputs\[1\] 'I' is int32"):
        te.gradient(Y, [X, I])
    Z = te.compute((2, 3), lambda i, j: I[i, j] * 2, name="Z")
    with pytest.raises(rivet.ArgumentError, match=r"output 'Z' is int32"):
        te.gradient(Z, [X])
    with pytest.raises(rivet.ArgumentError, match=r"inputs\[0\] must be a te.Tensor.*str"):
        te.gradient(Y, ["X"])
    with pytest.raises(rivet.ArgumentError, match=r"output must be a te.Tensor"):
        te.gradient(None, [X])


@pytest.mark.parametrize("dtype", DTYPES)
def test_prod_with_zeros_matches_torch(rng, dtype):
    X = te.placeholder((4, 5), dtype, name="X")
    k = te.reduce_axis((0, 5), name="k")
    P = te.compute((4,), lambda i: te.prod(X[i, k], axis=k), name="P")
    _, bwd = build_pair([X], P)
    tdt = TORCH_DT[dtype]
    x = torch.from_numpy(rng.standard_normal((4, 5))).to(tdt)
    x[1, 2] = 0.0  # one zero: only it gets a gradient
    x[2, 0] = x[2, 3] = 0.0  # two zeros: none does
    h = torch.from_numpy(rng.standard_normal(4)).to(tdt)
    xr = x.clone().requires_grad_()
    torch.prod(xr, dim=1).backward(h)
    g = torch.full((4, 5), float("nan"), dtype=tdt)
    rivet.to_pytorch_func(bwd)(x, h, g)
    torch.testing.assert_close(g, xr.grad, **TOL[dtype])
    assert g[1, 2] != 0 and torch.equal(g[2], torch.zeros(5, dtype=tdt))


def test_input_not_in_the_program_gets_zeros():
    X, Y = small_program()
    Other = te.placeholder((4,), "float32", name="Other")
    gO, gX = te.gradient(Y, [Other, X])
    f = rivet.build(rivet.create_schedule([gO, gX]), [X, Other, gO, gX], target="cpu", name="g")["g"]
    x = torch.rand(2, 3)
    o = torch.full((4,), float("nan"))
    ox = torch.full((2, 3), float("nan"))
    rivet.to_pytorch_func(f)(x, torch.rand(4), o, ox)
    assert torch.equal(o, torch.zeros(4))
    torch.testing.assert_close(ox, torch.exp(x))


def test_a_chain_of_3000_stages():
    X = te.placeholder((2,), "float64", name="X")
    t = X
    for s in range(3000):
        prev = t
        t = te.compute((2,), lambda i: prev[i] * 1.0001, name=f"s{s}")
    (g,) = te.gradient(t, [X])
    assert g.shape == (2,)
