"""A rivet FFI op per shard: `jax.shard_map` over 2 host devices, each calling the rivet kernel
on its half of the batch inside one jitted program; the result, and the gradient through the
op's rivet backward, equal the unsharded computation. Prints "shard_map ok" and exits 0 when
they do (tests/python/test_distributed.py runs this file).

    .venv/bin/python bindings/examples/jax_shard_map.py
"""

import os

# Two CPU devices for XLA; must be set before JAX initialises its backend.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import rivet  # noqa: E402
import rivet.jax  # noqa: E402
from rivet import te  # noqa: E402


def rivet_ops():
    """Y = X @ W + b[n] (float32) and its backward (dX = G W^T, dW = X^T G, db = sum_i G)."""
    m, k, n = te.var("m"), te.var("k"), te.var("n")
    X = te.placeholder((m, k), "float32", name="X")
    W = te.placeholder((k, n), "float32", name="W")
    B = te.placeholder((n,), "float32", name="B")
    r = te.reduce_axis((0, k), name="r")
    XW = te.compute((m, n), lambda i, j: te.sum(X[i, r] * W[r, j], axis=r), name="XW")
    Y = te.compute((m, n), lambda i, j: XW[i, j] + B[j], name="Y")
    fwd = rivet.build(rivet.create_schedule(Y), [X, W, B, Y], name="affine")["affine"]
    G = te.placeholder((m, n), "float32", name="G")
    rj, ri = te.reduce_axis((0, n), name="rj"), te.reduce_axis((0, m), name="ri")
    ri2 = te.reduce_axis((0, m), name="ri2")
    dX = te.compute((m, k), lambda i, p: te.sum(G[i, rj] * W[p, rj], axis=rj), name="dX")
    dW = te.compute((k, n), lambda p, j: te.sum(X[ri, p] * G[ri, j], axis=ri), name="dW")
    dB = te.compute((n,), lambda j: te.sum(G[ri2, j], axis=ri2), name="dB")  # B itself unused
    bwd = rivet.build(rivet.create_schedule([dX, dW, dB]), [X, W, B, G, dX, dW, dB], name="affine_bwd")
    return rivet.jax.ffi_func(fwd, backward=bwd["affine_bwd"])


def main():
    assert len(jax.devices()) == 2, jax.devices()
    affine = rivet_ops()
    mesh = jax.make_mesh((2,), ("batch",))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    # The batch split across the two devices, the parameters on both.
    xs = jax.device_put(x, jax.NamedSharding(mesh, P("batch")))
    ws, bs = (jax.device_put(v, jax.NamedSharding(mesh, P())) for v in (w, b))

    def local(x, w, b):  # runs once per device on its (4, 6) shard
        return jnp.tanh(affine(x, w, b))

    sharded = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(P("batch"), P(), P()), out_specs=P("batch"))
    )
    y = sharded(xs, ws, bs)
    want = np.tanh(x @ w + b)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-6)
    assert len(y.sharding.device_set) == 2
    np.testing.assert_allclose(np.asarray(jax.jit(local)(x, w, b)), want, rtol=1e-5, atol=1e-6)

    # Gradients through the sharded program equal torch-free numpy references.
    loss = lambda w, b: jnp.sum(sharded(xs, w, b) ** 2)  # noqa: E731
    gw, gb = jax.jit(jax.grad(loss, argnums=(0, 1)))(ws, bs)
    g = 2 * want * (1 - want**2)
    np.testing.assert_allclose(np.asarray(gw), x.T @ g, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gb), g.sum(axis=0), rtol=1e-4, atol=1e-5)
    print("shard_map ok: 2 host devices, one rivet kernel per shard, values and gradients match")


if __name__ == "__main__":
    main()
