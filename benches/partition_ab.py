#!/usr/bin/env python
"""Side-by-side run time of kernels the partition pass (`lower::partition`) touches: the seed
GEMM (symbolic n, no schedule: the default packed GEMM, whose B pack has a ragged last panel)
and ResNet-like convolutions (their image packs and depthwise rows have padding guards),
each under several variants measured in the same run. A variant is `LABEL=PYTHONPATH` (a
wheel's install folder; empty: the interpreter's own rivet) with optional `,VAR=VALUE`
environment settings, e.g.

    RIVET_NUM_THREADS=1 .venv/bin/python benches/partition_ab.py \\
        --variant "main=$MAIN" --variant "main,off=$MAIN,RIVET_PARTITION=0" \\
        --variant "branch=$BRANCH" --rounds 7

Each round runs every variant once, in turn, in a fresh subprocess (one thread: RIVET /
OMP_NUM_THREADS=1), which builds each kernel, checks it once against numpy or torch, and
times it; a time is the process CPU time per call (`time.process_time`, not wall time: the
machine may be shared), the median over the calls of that subprocess; the table gives the
median over rounds. Interleaving the variants round by round spreads the machine's load over
all of them alike.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GEMM_SIZES = [97, 500, 1000]
if os.environ.get("PARTITION_AB_SIZES"):
    GEMM_SIZES = [int(x) for x in os.environ["PARTITION_AB_SIZES"].split(",")]
# name: (cin, cout, hw, k, stride, pad, depthwise), as benches/conv_bench.py.
CONVS = ["3x3-64@56", "dw3x3-128@56"]


def cpu_per_call(fn, budget):
    """Median CPU seconds of one call of `fn` over calls filling about `budget` seconds."""
    fn()
    t0 = time.process_time()
    fn()
    one = max(time.process_time() - t0, 1e-6)
    calls = max(3, min(200, int(budget / one)))
    times = []
    for _ in range(calls):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def child(budget):
    import numpy as np
    import torch
    import torch.nn.functional as F
    import rivet
    import build_time
    import conv_bench

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    res = {}
    s, args = build_time.program(False)
    mm = rivet.build(s, args, target="cpu", name="mm")["mm"]
    for n in GEMM_SIZES:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        c = np.full((n, n), np.nan, dtype=np.float32)
        mm(a, b, c)
        want = a.astype(np.float64) @ b.astype(np.float64)
        assert np.abs(c - want).max() <= 1e-3 * np.abs(want).max(), ("gemm", n)
        res["gemm %d" % n] = cpu_per_call(lambda: mm(a, b, c), budget)
    for name in CONVS:
        ci, co, hw, k, st, p, dw = conv_bench.LAYERS[name]
        f = conv_bench.rivet_conv(1, ci, co, hw, k, st, p, dw)
        x = torch.from_numpy(rng.standard_normal((1, ci, hw, hw), dtype=np.float32))
        w = torch.from_numpy(rng.standard_normal((co, 1 if dw else ci, k, k), dtype=np.float32))
        oh = (hw + 2 * p - k) // st + 1
        out = torch.full((1, co, oh, oh), float("nan"))
        f(x, w, out)
        want = F.conv2d(x.double(), w.double(), stride=st, padding=p, groups=ci if dw else 1)
        assert (out.double() - want).abs().max().item() <= 1e-3 * want.abs().max().item(), name
        res["conv " + name] = cpu_per_call(lambda: f(x, w, out), budget)
    print(json.dumps(res))


def parse(spec):
    label, rest = spec.split("=", 1)
    path, *envs = rest.split(",")
    env = dict(os.environ, RIVET_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("RIVET_PARTITION", None)
    if path:
        env["PYTHONPATH"] = path
    for e in envs:
        k, v = e.split("=", 1)
        env[k] = v
    return label, env


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="LABEL=PYTHONPATH[,VAR=VALUE...]")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.3, help="seconds of calls per kernel and subprocess")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.budget)
    variants = [parse(v) for v in a.variant]
    times = {label: {} for label, _ in variants}
    for r in range(a.rounds):
        for label, env in variants:
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", "--budget", str(a.budget), "--variant", "x=x"],
                env=env, capture_output=True, text=True, check=True,
            ).stdout
            for k, v in json.loads(out.strip().splitlines()[-1]).items():
                times[label].setdefault(k, []).append(v)
        print("round %d done" % (r + 1), file=sys.stderr)
    labels = [label for label, _ in variants]
    kernels = list(times[labels[0]])
    print("| kernel, 1 thread, CPU ms per call | " + " | ".join(labels) + " | " + " | ".join("%s / %s" % (l, labels[0]) for l in labels[1:]) + " |")
    print("| --- |" + " ---: |" * (2 * len(labels) - 1))
    for k in kernels:
        med = [statistics.median(times[l][k]) * 1e3 for l in labels]
        print("| %s | " % k + " | ".join("%.3f" % m for m in med) + " | " + " | ".join("%.3f" % (m / med[0]) for m in med[1:]) + " |")


if __name__ == "__main__":
    main()
