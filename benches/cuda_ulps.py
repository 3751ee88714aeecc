"""CUDA's math functions against the interpreter's libm, in ulps, for the tolerance table.

For each transcendental rivet emits (exp, log, sqrt, rsqrt, tanh, sigmoid, erf, pow) in float32
and float64: one kernel built for "cuda" (one thread per element) and the same program on the
interpreter (the oracle, musl's libm), run on the same fresh random inputs (a wide range plus
the edge values), and the largest distance in ulps between the two, with the input that gave
it. conftest.CUDA_ULPS is a provisional bound until these numbers come from a real GPU.

On the CUDA driver double the kernels run on the host with the host's libm: the script runs end
to end and says so ("device": "driver double"), and its numbers say nothing about CUDA.

    python benches/cuda_ulps.py [--json out.json] [--n 65536]
"""

import argparse
import ctypes
import json
import sys

import numpy as np

import rivet
from rivet import te

sys.path.insert(0, __import__("os").path.dirname(__file__))
from gpu_smoke import Driver, device_ptr  # noqa: E402

UNARY = {
    "exp": (te.exp, (-80.0, 80.0)),
    "log": (te.log, (1e-30, 1e30)),
    "sqrt": (te.sqrt, (0.0, 1e30)),
    "rsqrt": (te.rsqrt, (1e-30, 1e30)),
    "tanh": (te.tanh, (-20.0, 20.0)),
    "sigmoid": (te.sigmoid, (-80.0, 80.0)),
    "erf": (te.erf, (-6.0, 6.0)),
}


def build(expr_of, dtype, target, name, binary=False):
    n = te.var("n")
    a = te.placeholder((n,), dtype, name="A")
    b = te.placeholder((n,), dtype, name="B")
    c = te.compute((n,), (lambda i: expr_of(a[i], b[i])) if binary else (lambda i: expr_of(a[i])), name="C")
    s = rivet.create_schedule(c)
    bx, tx = s[c].split(c.op.axis[0], factor=128)
    s[c].bind(bx, "blockIdx.x")
    s[c].bind(tx, "threadIdx.x")
    args = [a, b, c] if binary else [a, c]
    return rivet.build(s, args, target=target, name=name)[name]


def ulp_distance(x, y, dtype):
    """|x - y| in units in the last place, through the ordered integer view (0 where both
    are the same NaN class or equal)."""
    it = np.int32 if dtype == "float32" else np.int64
    mask = np.int64((1 << 31) - 1) if dtype == "float32" else np.int64((1 << 63) - 1)

    def ordered(v):
        # Sign-magnitude bits onto one monotonic integer line: -0.0 and 0.0 meet at 0.
        i = v.view(it).astype(np.int64)
        return np.where(i < 0, -(i & mask), i)

    xo, yo = ordered(x), ordered(y)
    same = (xo >= 0) == (yo >= 0)
    # Same sign: the exact integer difference; opposite signs: the sum of magnitudes, which
    # can pass int64's range for float64, so in floating point (it is huge anyway).
    d = np.where(same, np.abs(np.where(same, xo - yo, 0)).astype(np.float64), np.abs(xo.astype(np.float64)) + np.abs(yo.astype(np.float64)))
    both_nan = np.isnan(x) & np.isnan(y)
    d[both_nan] = 0
    d[np.isnan(x) ^ np.isnan(y)] = np.inf
    return d


def inputs(rng, lo, hi, n, dtype):
    if lo > 0:
        x = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    else:
        x = rng.uniform(lo, hi, n)
    edge = [lo, hi, 0.0, -0.0, 1.0, -1.0, 0.5, np.inf, -np.inf, np.nan]
    x[: len(edge)] = edge
    return x.astype(dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--n", type=int, default=65536)
    args = ap.parse_args()
    drv = Driver()
    try:
        import torch

        real = torch.cuda.is_available()
    except Exception:
        real = False
    device = "GPU (driver " + ("real" if real else "?") + ")" if real else "driver double (host libm: not CUDA's)"
    rng = np.random.default_rng()
    rows = []
    cases = [(k, f, r, False) for k, (f, r) in UNARY.items()] + [("pow", te.pow, (1e-3, 1e3), True)]
    for dtype in ("float32", "float64"):
        for name, fn, (lo, hi), binary in cases:
            x = inputs(rng, lo, hi, args.n, dtype)
            y = rng.uniform(-8.0, 8.0, args.n).astype(dtype) if binary else None
            ref_f = build(fn, dtype, "interp", f"{name}_{dtype}_ref", binary)
            cuda_f = build(fn, dtype, "cuda", f"{name}_{dtype}_cuda", binary)
            host_args = [x, y] if binary else [x]
            ref = np.asarray(ref_f(*[rivet.from_dlpack(a) for a in host_args]).numpy())
            drv.bind(0)
            dev = []
            for a in host_args:
                t = rivet.empty(a.shape, dtype=dtype, device="cuda")
                drv.upload(device_ptr(t), a)
                dev.append(t)
            out = cuda_f(*dev)
            drv.bind(0)
            got = drv.download(device_ptr(out), ref)
            d = ulp_distance(got, ref, dtype)
            k = int(np.argmax(d))
            rows.append(
                dict(fn=name, dtype=dtype, max_ulps=float(d[k]), at=float(x[k]), cuda=float(got[k]), interp=float(ref[k]), n=args.n)
            )
            print(f"{name:8} {dtype:8} max {d[k]:>6g} ulp at x={x[k]!r}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, rows=rows), f, indent=1)
    print(f"device: {device}")


if __name__ == "__main__":
    main()
