"""rivet kernels inside the frameworks' compilers (`make demo`): a rivet GEMM as a torch custom
op inside `torch.compile(fullgraph=True)` with a backward pass, and a rivet kernel inside
`jax.jit` under `jax.grad`. Both backward kernels are rivet kernels too: the torch one written
by hand, the JAX one derived by rivet from the forward's te program (`Function.backward()`, what
both integrations use when no backward is given). Each result is checked against the
framework's own maths."""

import numpy as np

import rivet
from rivet import te


def gemm_and_backward(dtype):
    m, k, n = te.var("m"), te.var("k"), te.var("n")
    A = te.placeholder((m, k), dtype, name="A")
    B = te.placeholder((k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    fwd = rivet.build(rivet.create_schedule(C), [A, B, C], name="gemm")["gemm"]
    dC = te.placeholder((m, n), dtype, name="dC")
    rj, ri = te.reduce_axis((0, n), name="rj"), te.reduce_axis((0, m), name="ri")
    dA = te.compute((m, k), lambda i, p: te.sum(dC[i, rj] * B[p, rj], axis=rj), name="dA")
    dB = te.compute((k, n), lambda p, j: te.sum(A[ri, p] * dC[ri, j], axis=ri), name="dB")
    bwd = rivet.build(rivet.create_schedule([dA, dB]), [A, B, dC, dA, dB], name="gemm_bwd")
    return fwd, bwd["gemm_bwd"]


def torch_demo():
    import torch
    import rivet.torch

    fwd, bwd = gemm_and_backward("float32")
    mm = rivet.torch.custom_op(fwd, "demo::gemm", backward=bwd)

    @torch.compile(fullgraph=True, dynamic=True)
    def loss(x, w):
        return torch.nn.functional.gelu(mm(x, w)).sum()

    w = torch.randn(64, 32, requires_grad=True)
    for rows in (16, 40):  # one graph, two sizes
        x = torch.randn(rows, 64)
        w.grad = None
        loss(x, w).backward()
        w_ref = w.detach().clone().requires_grad_()
        torch.nn.functional.gelu(x @ w_ref).sum().backward()
        torch.testing.assert_close(w.grad, w_ref.grad, rtol=1e-4, atol=1e-4)
    print("torch.compile(fullgraph=True, dynamic=True): rivet op forward + rivet backward match torch")


def jax_demo():
    import jax
    import jax.numpy as jnp
    import rivet.jax

    fwd, _ = gemm_and_backward("float32")
    mm = rivet.jax.ffi_func(fwd)  # backward: fwd.backward(), from rivet.te.gradient
    x = np.random.rand(16, 64).astype(np.float32)
    w = np.random.rand(64, 32).astype(np.float32)
    grad = jax.jit(jax.grad(lambda w: jnp.sum(jnp.tanh(mm(x, w)))))(w)
    ref = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(ref), rtol=1e-3, atol=1e-4)
    print("jax.jit(jax.grad(...)): rivet kernel as an XLA FFI call + derived rivet backward match jax")


if __name__ == "__main__":
    torch_demo()
    jax_demo()
