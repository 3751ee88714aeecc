"""A trainer updates weights in place with rivet kernels while an inference process reads them
through a rivet.ipc handle: the weights never cross the process boundary as data.

Ordering is explicit: two events hand the weights back and forth. The trainer writes only
between `consumed` and `published`, the inference process reads only between `published` and
`consumed`, so it never sees a half-updated vector; and since setting an event after the
kernel's writes and waiting on it before the reads is a release / acquire pair between the
processes, the reads see every write. The inference process reports a checksum of each version
it saw, which must equal the trainer's. Prints "ipc trainer ok" (tests/python/test_ipc.py runs
this file; docs/ipc.md shows it).

    .venv/bin/python bindings/examples/ipc_trainer.py
"""

import multiprocessing as mp

import numpy as np

import rivet
from rivet import te

STEPS, M, D, LR, TIMEOUT = 20, 256, 32, 0.5, 60


def data(seed):
    """Inputs and targets of a linear model whose true weights are fixed."""
    w_true = np.random.default_rng(42).standard_normal(D).astype(np.float32)
    x = np.random.default_rng(seed).standard_normal((M, D)).astype(np.float32)
    return x, x @ w_true


def gradient_kernel():
    """G[j] = sum_i (X[i, :] . W - Y[i]) * X[i, j], the least-squares gradient times M."""
    m, d = te.var("m"), te.var("d")
    X = te.placeholder((m, d), "float32", name="X")
    Y = te.placeholder((m,), "float32", name="Y")
    W = te.placeholder((d,), "float32", name="W")
    k, i = te.reduce_axis((0, d), name="k"), te.reduce_axis((0, m), name="i")
    R = te.compute((m,), lambda r: te.sum(X[r, k] * W[k], axis=k), name="R")
    G = te.compute((d,), lambda j: te.sum((R[i] - Y[i]) * X[i, j], axis=i), name="G")
    return rivet.build(rivet.create_schedule(G), [X, Y, W, G], name="grad")["grad"]


def inference(handle, published, consumed, results):
    w = rivet.ipc.open(handle)  # the trainer's memory, mapped here: no copy
    x, y = data(seed=1)  # held-out data
    for version in range(1, STEPS + 1):
        if not published.wait(TIMEOUT):
            raise TimeoutError("the trainer did not publish")
        published.clear()
        weights = w.numpy()  # a view of the shared weights, stable until we set `consumed`
        loss = float(np.mean((x @ weights - y) ** 2))
        results.put((version, float(weights.astype(np.float64).sum()), loss))
        consumed.set()


def main():
    ctx = mp.get_context("spawn")
    w = rivet.zeros((D,), "float32", shared=True)  # the weights, in shared memory
    grad = gradient_kernel()
    # rivet's in-place y <- a * x + y (a compiled te kernel's outputs may not alias its inputs).
    axpy = rivet.get_global_func("testing.axpy")
    g = rivet.zeros((D,), "float32")
    x, y = data(seed=0)
    published, consumed, results = ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=inference, args=(rivet.ipc.share(w), published, consumed, results))
    reader.start()
    sums = []
    for version in range(1, STEPS + 1):
        grad(x, y, w, g)  # G from the current weights
        axpy(-LR / M, g, w)  # w <- w - lr * mean gradient, in place, in the shared memory
        sums.append(float(w.numpy().astype(np.float64).sum()))
        published.set()  # version `version` is complete: the reader may look
        if not consumed.wait(TIMEOUT):  # and the trainer writes again once it has looked
            raise TimeoutError("the inference process did not answer")
        consumed.clear()
    seen = [results.get(timeout=TIMEOUT) for _ in range(STEPS)]
    reader.join(TIMEOUT)
    assert reader.exitcode == 0, reader.exitcode
    assert [v for v, _, _ in seen] == list(range(1, STEPS + 1))
    assert [s for _, s, _ in seen] == sums, "the inference process saw other weights"
    losses = [loss for _, _, loss in seen]
    assert losses[-1] < 1e-3 * losses[0], losses
    print(f"loss on held-out data: {losses[0]:.4f} after step 1, {losses[-1]:.2e} after step {STEPS}")
    print("ipc trainer ok")


if __name__ == "__main__":
    main()
