#!/usr/bin/env python
"""ResNet-50-like convolution layers (NCHW, float32) written the obvious way in rivet's DSL
and built with no schedule (the default CPU schedule: an implicit, packed GEMM; a depthwise
one a direct loop), against torch.nn.functional.conv2d. Each library runs in its own
subprocess with RIVET_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS / OPENBLAS_NUM_THREADS
set to the thread count; each output is NaN-poisoned and checked once against torch before
timing; a time is the median over `--repeat` rounds of the mean of `--number` calls.

    .venv/bin/python benches/conv_bench.py                 # batches 1 and 8, 1 and 2 threads
    .venv/bin/python benches/conv_bench.py --batches 1 --threads 1 --layers 3x3-64

Prints one row per (layer, batch, threads): rivet ms, torch ms, and rivet / torch (time
ratio: below 1 is rivet faster). `--also-env RIVET_PARTITION=0` runs rivet a second time, in
its own subprocess with that variable set, and adds its time and ratio (a switch measured
side by side with the rest of the run).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# name: (cin, cout, hw, k, stride, pad, depthwise)
LAYERS = {
    "3x3-64@56": (64, 64, 56, 3, 1, 1, False),
    "3x3-128@28": (128, 128, 28, 3, 1, 1, False),
    "1x1-256to64@56": (256, 64, 56, 1, 1, 0, False),
    "3x3-512@7": (512, 512, 7, 3, 1, 1, False),
    "7x7s2-3to64@224": (3, 64, 224, 7, 2, 3, False),
    "dw3x3-128@56": (128, 128, 56, 3, 1, 1, True),
}


def rivet_conv(n, ci, co, hw, k, stride, pad, depthwise):
    import rivet
    from rivet import te

    X = te.placeholder((n, ci, hw, hw), "float32", name="X")
    W = te.placeholder((co, 1 if depthwise else ci, k, k), "float32", name="W")
    oh = (hw + 2 * pad - k) // stride + 1
    kh, kw = te.reduce_axis((0, k), name="kh"), te.reduce_axis((0, k), name="kw")
    rc = te.reduce_axis((0, ci), name="rc")

    def pixel(b, c, y, x):
        if not pad:
            return X[b, c, y, x]
        y, x = y - pad, x - pad
        return te.if_then_else(te.all(y >= 0, y < hw, x >= 0, x < hw), X[b, c, y, x], 0.0)

    if depthwise:
        body = lambda b, c, y, x: te.sum(pixel(b, c, y * stride + kh, x * stride + kw) * W[c, 0, kh, kw], axis=[kh, kw])
    else:
        body = lambda b, c, y, x: te.sum(
            pixel(b, rc, y * stride + kh, x * stride + kw) * W[c, rc, kh, kw], axis=[rc, kh, kw]
        )
    out = te.compute((n, co, oh, oh), body, name="Conv")
    return rivet.build(rivet.create_schedule(out), [X, W, out], target="cpu", name="conv")["conv"]


def child(lib, layers, batches, number, repeat):
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    rng = np.random.default_rng(0)
    res = {}
    for name in layers:
        ci, co, hw, k, s, p, dw = LAYERS[name]
        for n in batches:
            x = torch.from_numpy(rng.standard_normal((n, ci, hw, hw), dtype=np.float32))
            w = torch.from_numpy(rng.standard_normal((co, 1 if dw else ci, k, k), dtype=np.float32))
            groups = ci if dw else 1
            if lib == "torch":
                fn = lambda: F.conv2d(x, w, stride=s, padding=p, groups=groups)
            else:
                f = rivet_conv(n, ci, co, hw, k, s, p, dw)
                oh = (hw + 2 * p - k) // s + 1
                out = torch.full((n, co, oh, oh), float("nan"))
                f(x, w, out)
                want = F.conv2d(x.double(), w.double(), stride=s, padding=p, groups=groups)
                err = (out.double() - want).abs().max().item()
                assert err <= 1e-3 * want.abs().max().item(), (name, n, err)
                fn = lambda: f(x, w, out)
            fn()
            rounds = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                for _ in range(number):
                    fn()
                rounds.append((time.perf_counter() - t0) / number * 1e3)
            res["%s/%d" % (name, n)] = statistics.median(rounds)
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--number", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--also-env", default=None, help="VAR=VALUE: also run rivet with it set")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    layers = [l for l in args.layers.split(",") if l]
    for l in layers:
        if l not in LAYERS:
            ap.error("--layers: unknown layer %r (known: %s)" % (l, ", ".join(LAYERS)))
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        child(args.child, layers, batches, args.number, args.repeat)
        return
    rows = {}
    for t in [int(x) for x in args.threads.split(",")]:
        env = dict(os.environ)
        for v in ("RIVET_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[v] = str(t)
        runs = [("rivet", "rivet", env), ("torch", "torch", env)]
        if args.also_env:
            var, _, val = args.also_env.partition("=")
            runs.insert(1, ("rivet", "alt", dict(env, **{var: val})))
        for lib, col, cenv in runs:
            cmd = [sys.executable, __file__, "--child", lib, "--layers", ",".join(layers)]
            cmd += ["--batches", args.batches, "--number", str(args.number), "--repeat", str(args.repeat)]
            out = subprocess.run(cmd, env=cenv, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit("%s child failed:\n%s" % (lib, out.stderr))
            for key, ms in json.loads(out.stdout.strip().splitlines()[-1]).items():
                rows.setdefault((key, t), {})[col] = ms
    alt = " (%s)" % args.also_env if args.also_env else ""
    head = "%-26s %7s %10s %10s %8s" % ("layer/batch", "threads", "rivet ms", "torch ms", "ratio")
    print(head + ("   alt ms  alt ratio%s" % alt if alt else ""))
    for (key, t), v in rows.items():
        line = "%-26s %7d %10.2f %10.2f %8.2f" % (key, t, v["rivet"], v["torch"], v["rivet"] / v["torch"])
        if alt:
            line += " %8.2f %10.2f" % (v["alt"], v["alt"] / v["torch"])
        print(line)


if __name__ == "__main__":
    main()
