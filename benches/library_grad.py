#!/usr/bin/env python
"""The saved backward of every differentiable rivet.kernels function against torch autograd's
backward, side by side in one process (an audit: which library kernels' gradients are slow).

    RIVET_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benches/library_grad.py
    .venv/bin/python benches/library_grad.py --threads 2 --only relu gelu

For each kernel (float32; 1024 x 1024 unless said): `Function.training_pair()` (what
rivet.torch.custom_op and rivet.jax.ffi_func run under autograd) is built with the default CPU
schedule, its forward with residuals runs once, then its backward is checked against
torch.autograd.grad on the same data (NaN-poisoned outputs, assert_close) and timed,
alternating with torch.autograd.grad of the equivalent torch op (forward once, outside the
timing). Prints median milliseconds and rivet / torch. torch's backward of sum and transpose
is a view (an expand / a transpose of the incoming gradient): rivet writes the gradient out,
so those ratios compare a write of the whole gradient with no work.
"""

import argparse
import os
import statistics
import time


def cases(n):
    import torch
    import rivet.kernels as K

    return {
        "add_row_bcast": (lambda: K.add("float32", ("n", "m"), ("m",)), [(n, n), (n,)], lambda a, b: a + b),
        "mul": (lambda: K.mul("float32", ("n", "m"), ("n", "m")), [(n, n), (n, n)], lambda a, b: a * b),
        "relu": (lambda: K.relu(), [(n, n)], torch.relu),
        "gelu": (lambda: K.gelu(), [(n, n)], torch.nn.functional.gelu),
        "sum_last": (lambda: K.sum(), [(n, n)], lambda a: a.sum(-1)),
        "sum_first": (lambda: K.sum(axis=0), [(n, n)], lambda a: a.sum(0)),
        "max_last": (lambda: K.max(), [(n, n)], lambda a: a.max(-1).values),
        "softmax": (lambda: K.softmax(), [(n, n)], lambda a: torch.softmax(a, -1)),
        "layer_norm": (
            lambda: K.layer_norm(),
            [(n, n), (n,), (n,)],
            lambda x, g, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, 1e-5),
        ),
        "transpose": (lambda: K.transpose(), [(n, n)], lambda a: a.t()),
        "matmul": (lambda: K.matmul(), [(n, n), (n, n)], torch.mm),
        "batch_matmul_8x128": (lambda: K.batch_matmul(), [(8, 128, 128), (8, 128, 128)], torch.bmm),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("RIVET_NUM_THREADS", "1")))
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=60)
    a = ap.parse_args()
    os.environ.setdefault("RIVET_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch
    import rivet

    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {a.threads} thread(s), "
          f"rivet pool {rivet.num_threads()}, torch {torch.__version__}")
    for name, (make, shapes, ref) in cases(a.n).items():
        if a.only and name not in a.only:
            continue
        xs = [torch.randn(s, generator=g) for s in shapes]
        fwd, bwd, _ = make().training_pair()
        kept = fwd(*xs)
        kept = list(kept) if isinstance(kept, (tuple, list)) else [kept]
        gy = torch.randn(kept[0].shape, generator=g)
        got = [torch.full_like(x, float("nan")) for x in xs]
        leaves = [x.clone().requires_grad_() for x in xs]
        yt = ref(*leaves)
        calls = {"rivet": lambda: bwd(*xs, *kept, gy, *got),
                 "torch": lambda: torch.autograd.grad(yt, leaves, gy, retain_graph=True)}
        calls["rivet"]()
        want = calls["torch"]()
        for k, (x, y) in enumerate(zip(got, want)):
            torch.testing.assert_close(x, y, rtol=2e-4, atol=2e-4, msg=lambda m: f"{name} grad {k}: {m}")
        ts = {k: [] for k in calls}
        for _ in range(a.rounds):
            for k, c in calls.items():
                t0 = time.perf_counter()
                c()
                ts[k].append(time.perf_counter() - t0)
        r, t = (statistics.median(ts[k]) * 1e3 for k in ("rivet", "torch"))
        print(f"{name:<20} rivet {r:8.3f} ms   torch {t:8.3f} ms   rivet / torch {r / t:6.2f}", flush=True)


if __name__ == "__main__":
    main()
