#!/usr/bin/env python
"""Programs a user writes in rivet's DSL, built with no schedule, against the call they would
make instead.

Every program here is written the obvious way, as docs/dsl.md and the README teach
(`rivet.te` placeholders, `compute`, `reduce_axis`, `te.sum`, ...), and built with
`rivet.build(rivet.create_schedule(out), args, target="cpu")`: no schedule, so what is timed
is rivet's default CPU schedule (docs/default_schedules.md). Where the library has the op
(`rivet.kernels.softmax`, `layer_norm`), the library kernel is what a user calls.

Each case and each library runs in its own subprocess (`--worker CASE:LIB:THREADS`) with every
library's thread count set alike (RIVET_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
MKL_NUM_THREADS, and torch.set_num_threads): pools of two libraries in one process fight over
the cores. The rivet child first checks its result once against the peer's on the same data
(output poisoned with NaN first), then times; the peer child times the peer's call. The ratio
printed is rivet's speed over the peer's (peer time / rivet time: above 1, rivet is faster).

    .venv/bin/python benches/user_kernels.py                  # everything, 1 and 2 threads
    .venv/bin/python benches/user_kernels.py --quick          # shorter timing budget
    .venv/bin/python benches/user_kernels.py --cases attention,rmsnorm --threads 1

Outputs: the machine, the ISA the CPU offers (rivet picks its GEMM micro-kernel from it: the
AVX-512 one with avx512f, else AVX2+FMA, else portable; RIVET_MICROKERNEL forces one), a table,
benches/out/user_kernels.json (a partial run: out/user_kernels_partial.json) and
benches/user_kernels.png (a full run only, or --png PATH).
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_JSON = os.path.join(HERE, "out", "user_kernels.json")
DEFAULT_PNG = os.path.join(HERE, "user_kernels.png")

# case -> (peer library, what the peer call is)
CASES = {
    "add": ("numpy", "np.add(x, y, out=z), 2^24 float32"),
    "rmsnorm": ("torch", "F.rms_norm(x, (1024,), w, eps=1e-6), 4096 x 1024"),
    "colsum": ("numpy", "x.sum(0), 4096 x 4096 float32"),
    "softmax": ("torch", "torch.softmax(x, -1) vs rivet.kernels.softmax, 4096 x 1024"),
    "layer_norm": ("torch", "F.layer_norm vs rivet.kernels.layer_norm, 4096 x 1024"),
    "gemm256_f32": ("numpy", "np.matmul(a, b, out=c)"),
    "gemm1024_f32": ("numpy", "np.matmul(a, b, out=c)"),
    "gemm2048_f32": ("numpy", "np.matmul(a, b, out=c)"),
    "gemm256_f64": ("numpy", "np.matmul(a, b, out=c)"),
    "gemm1024_f64": ("numpy", "np.matmul(a, b, out=c)"),
    "gemm2048_f64": ("numpy", "np.matmul(a, b, out=c)"),
    "gemm_bias_gelu": ("torch", "F.gelu(torch.addmm(bias, a, b)), 1024, exact gelu"),
    "conv2d": ("torch", "F.conv2d(x, w, padding=1), NCHW 8x64x56x56, 3x3, 64 -> 64"),
    "attention": ("torch", "F.scaled_dot_product_attention(q, k, v), 16 heads x 512 x 64"),
    # The same program at other sizes: heads x sequence x head dim.
    "attention_16x128x64": ("torch", "the same, 16 heads x 128 x 64"),
    "attention_16x512x128": ("torch", "the same, 16 heads x 512 x 128"),
    "attention_4x2048x64": ("torch", "the same, 4 heads x 2048 x 64"),
    "attention_2x2048x128": ("torch", "the same, 2 heads x 2048 x 128"),
}


def thread_env(threads):
    t = str(threads)
    return {"OMP_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t, "MKL_NUM_THREADS": t,
            "RIVET_NUM_THREADS": t}


def cpu_isa():
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    if "avx512f" in flags:
        isa = "avx512f"
    elif "avx2" in flags and "fma" in flags:
        isa = "avx2+fma"
    elif "avx2" in flags:
        isa = "avx2 (no fma)"
    else:
        isa = "no avx2" if flags else "unknown (no /proc/cpuinfo)"
    return isa


def microkernel_note(isa):
    forced = os.environ.get("RIVET_MICROKERNEL", "").strip()
    if forced:
        return f"RIVET_MICROKERNEL={forced} (forced)"
    # rivet does not report its choice to Python; the rule (codegen/cpu_lib/microkernel) is
    # the widest variant the CPU has.
    guess = {"avx512f": "avx512", "avx2+fma": "avx2"}.get(isa, "portable")
    return f"not reported by rivet; by its rule for this ISA: {guess}"


# --------------------------------------------------------------------------------------------
# Child side
# --------------------------------------------------------------------------------------------


def timed(fn, budget, max_reps, first=None):
    """Median / min / max seconds of `fn()`, and the median CPU seconds of the process per call
    (all its threads: on a loaded machine the wall time also counts the wait for a core, the
    CPU time does not): one warm-up call (skipped when the caller made one and passes its time
    as `first`), then as many as fit `budget` (at least one)."""
    if first is None:
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0
    reps = int(max(1, min(max_reps, budget / max(first, 1e-9))))
    ts, cs = [], []
    for _ in range(reps):
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        cs.append(time.process_time() - c0)
    return statistics.median(ts), min(ts), max(ts), reps, statistics.median(cs)


def build(out, args, name):
    import rivet

    t0 = time.perf_counter()
    f = rivet.build(rivet.create_schedule(out), args, target="cpu", name=name)[name]
    return f, time.perf_counter() - t0


# Each case returns (inputs as numpy arrays, output shape and dtype, peer(inputs) -> a fresh
# numpy result or writes `out`, rivet builder() -> (function, build seconds), tolerance).


def case_add():
    import numpy as np
    from rivet import te

    n = 1 << 24
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal(n, dtype=np.float32) for _ in range(2))

    def peer(out):
        np.add(x, y, out=out)

    def rivet_fn():
        X = te.placeholder((n,), "float32", name="X")
        Y = te.placeholder((n,), "float32", name="Y")
        Z = te.compute((n,), lambda i: X[i] + Y[i], name="Z")
        return build(Z, [X, Y, Z], "add")

    return [x, y], ((n,), np.float32), peer, rivet_fn, 0.0


def case_rmsnorm():
    import numpy as np
    import torch
    from rivet import te

    rows, cols, eps = 4096, 1024, 1e-6
    rng = np.random.default_rng(2)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    w = rng.standard_normal(cols, dtype=np.float32)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)

    def peer(out):
        return torch.nn.functional.rms_norm(tx, (cols,), tw, eps=eps)

    def rivet_fn():
        X = te.placeholder((rows, cols), "float32", name="X")
        W = te.placeholder((cols,), "float32", name="W")
        k = te.reduce_axis((0, cols), name="k")
        SS = te.compute((rows,), lambda i: te.sum(X[i, k] * X[i, k], axis=k), name="SS")
        Y = te.compute((rows, cols),
                       lambda i, j: X[i, j] * te.rsqrt(SS[i] / float(cols) + eps) * W[j], name="Y")
        return build(Y, [X, W, Y], "rmsnorm")

    return [x, w], ((rows, cols), np.float32), peer, rivet_fn, 1e-5


def case_colsum():
    import numpy as np
    from rivet import te

    n = 4096
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, n), dtype=np.float32)

    def peer(out):
        np.sum(x, axis=0, out=out)

    def rivet_fn():
        X = te.placeholder((n, n), "float32", name="X")
        r = te.reduce_axis((0, n), name="r")
        S = te.compute((n,), lambda j: te.sum(X[r, j], axis=r), name="S")
        return build(S, [X, S], "colsum")

    return [x], ((n,), np.float32), peer, rivet_fn, 1e-5


def case_rowwise(op):
    import numpy as np
    import torch

    rows, cols = 4096, 1024
    rng = np.random.default_rng(4)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    g = rng.standard_normal(cols, dtype=np.float32)
    b = rng.standard_normal(cols, dtype=np.float32)
    tx, tg, tb = torch.from_numpy(x), torch.from_numpy(g), torch.from_numpy(b)

    def peer(out):
        if op == "softmax":
            return torch.softmax(tx, dim=-1)
        return torch.nn.functional.layer_norm(tx, (cols,), tg, tb, eps=1e-5)

    def rivet_fn():
        import rivet

        t0 = time.perf_counter()
        f = rivet.kernels.softmax() if op == "softmax" else rivet.kernels.layer_norm()
        return f, time.perf_counter() - t0

    ins = [x] if op == "softmax" else [x, g, b]
    return ins, ((rows, cols), np.float32), peer, rivet_fn, 1e-5


def case_gemm(n, dtype):
    import numpy as np
    from rivet import te

    rng = np.random.default_rng(5)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)

    def peer(out):
        np.matmul(a, b, out=out)

    def rivet_fn():
        A = te.placeholder((n, n), dtype, name="A")
        B = te.placeholder((n, n), dtype, name="B")
        k = te.reduce_axis((0, n), name="k")
        C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        return build(C, [A, B, C], "mm")

    return [a, b], ((n, n), np.dtype(dtype)), peer, rivet_fn, (1e-5 if dtype == "float32" else 1e-12)


def case_gemm_bias_gelu():
    import numpy as np
    import torch
    from rivet import te

    n = 1024
    rng = np.random.default_rng(6)
    a = rng.standard_normal((n, n), dtype=np.float32) / 32
    b = rng.standard_normal((n, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    ta, tb, tbias = (torch.from_numpy(v) for v in (a, b, bias))

    def peer(out):
        return torch.nn.functional.gelu(torch.addmm(tbias, ta, tb))

    def rivet_fn():
        A = te.placeholder((n, n), "float32", name="A")
        B = te.placeholder((n, n), "float32", name="B")
        Bias = te.placeholder((n,), "float32", name="bias")
        k = te.reduce_axis((0, n), name="k")
        C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")

        def gelu(i, j):
            v = C[i, j] + Bias[j]
            return 0.5 * v * (1.0 + te.erf(v * 0.7071067811865476))

        Y = te.compute((n, n), gelu, name="Y")
        return build(Y, [A, B, Bias, Y], "mm_gelu")

    return [a, b, bias], ((n, n), np.float32), peer, rivet_fn, 1e-5


def case_conv2d():
    import numpy as np
    import torch
    from rivet import te

    N, C, F, H, W, R = 8, 64, 64, 56, 56, 3
    rng = np.random.default_rng(7)
    x = rng.standard_normal((N, C, H, W), dtype=np.float32)
    w = rng.standard_normal((F, C, R, R), dtype=np.float32) / 24
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)

    def peer(out):
        return torch.nn.functional.conv2d(tx, tw, padding=1)

    def rivet_fn():
        X = te.placeholder((N, C, H, W), "float32", name="X")
        Wt = te.placeholder((F, C, R, R), "float32", name="W")
        rc = te.reduce_axis((0, C), name="rc")
        ry = te.reduce_axis((0, R), name="ry")
        rx = te.reduce_axis((0, R), name="rx")

        def conv(n, f, y, xx):
            yy, xi = y + ry - 1, xx + rx - 1
            inside = te.all(yy >= 0, yy < H, xi >= 0, xi < W)
            v = te.if_then_else(inside, X[n, rc, yy, xi], 0.0)
            return te.sum(v * Wt[f, rc, ry, rx], axis=[rc, ry, rx])

        Y = te.compute((N, F, H, W), conv, name="Y")
        return build(Y, [X, Wt, Y], "conv")

    return [x, w], ((N, F, H, W), np.float32), peer, rivet_fn, 1e-5


def case_attention(Hd=16, S=512, D=64):
    import numpy as np
    import torch
    from rivet import te

    scale = 1.0 / math.sqrt(D)
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((Hd, S, D), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(t) for t in (q, k, v))

    def peer(out):
        return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)

    def rivet_fn():
        return build_attention(Hd, S, D, "float32")

    return [q, k, v], ((Hd, S, D), np.float32), peer, rivet_fn, 1e-5


def attention_program(heads, n, d, dtype, te):
    """softmax(Q K^T / sqrt(d)) V written as its obvious stages (the tests build the same)."""
    scale = 1.0 / math.sqrt(d)
    Q = te.placeholder((heads, n, d), dtype, name="Q")
    K = te.placeholder((heads, n, d), dtype, name="K")
    V = te.placeholder((heads, n, d), dtype, name="V")
    c = te.reduce_axis((0, d), name="c")
    Sc = te.compute((heads, n, n), lambda h, i, j: te.sum(Q[h, i, c] * K[h, j, c], axis=c) * scale,
                    name="S")
    j1 = te.reduce_axis((0, n), name="j1")
    M = te.compute((heads, n), lambda h, i: te.max(Sc[h, i, j1], axis=j1), name="M")
    E = te.compute((heads, n, n), lambda h, i, j: te.exp(Sc[h, i, j] - M[h, i]), name="E")
    j2 = te.reduce_axis((0, n), name="j2")
    L = te.compute((heads, n), lambda h, i: te.sum(E[h, i, j2], axis=j2), name="L")
    j3 = te.reduce_axis((0, n), name="j3")
    O = te.compute((heads, n, d), lambda h, i, e: te.sum(E[h, i, j3] / L[h, i] * V[h, j3, e], axis=j3),
                   name="O")
    return [Q, K, V, O]


def build_attention(heads, n, d, dtype):
    from rivet import te

    args = attention_program(heads, n, d, dtype, te)
    return build(args[-1], args, "attention")


def make_case(name):
    if name == "add":
        return case_add()
    if name == "rmsnorm":
        return case_rmsnorm()
    if name == "colsum":
        return case_colsum()
    if name in ("softmax", "layer_norm"):
        return case_rowwise(name)
    if name.startswith("gemm") and name[4].isdigit():
        n, dt = name[4:].split("_")
        return case_gemm(int(n), {"f32": "float32", "f64": "float64"}[dt])
    if name == "gemm_bias_gelu":
        return case_gemm_bias_gelu()
    if name == "conv2d":
        return case_conv2d()
    if name == "attention":
        return case_attention()
    if name.startswith("attention_"):
        return case_attention(*(int(x) for x in name[len("attention_"):].split("x")))
    raise KeyError(name)


def worker(spec, budget, max_reps):
    import numpy as np

    name, lib, threads = spec.split(":")
    threads = int(threads)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass
    ins, (shape, dtype), peer, rivet_fn, tol = make_case(name)
    out = np.full(shape, np.nan, dtype=dtype)
    res = {}
    if lib == "peer":
        # The call the user makes: torch returns a fresh result (no out= for these ops), numpy
        # writes `out`; neither is charged a copy rivet does not make.
        run = lambda: peer(out)  # noqa: E731
        r = run()
        got = out if r is None else r.numpy()
        if not np.all(np.isfinite(got)):
            raise AssertionError(f"{name}: the peer's result is not finite")
        res["check"] = "peer: finite"
    else:
        f, build_s = rivet_fn()
        res["build_s"] = build_s
        # Check once, before timing, against the peer on the same data, into a NaN-poisoned out.
        buf = np.full(shape, np.nan, dtype=dtype)
        r = peer(buf)
        ref = buf if r is None else r.numpy()
        t0 = time.perf_counter()
        f(*ins, out)  # also the warm-up call: some cases take minutes per call
        first = time.perf_counter() - t0
        if tol == 0.0:
            ok = np.array_equal(out, ref)
            res["check"] = "bit-equal to the peer"
        else:
            scale = max(1.0, float(np.max(np.abs(ref))))
            err = float(np.max(np.abs(out.astype(np.float64) - ref)) / scale)
            ok = err <= tol and np.all(np.isfinite(out))
            res["check"] = f"max abs err / max(1, max|ref|) = {err:.1e} (<= {tol:.0e})"
        if not ok:
            raise AssertionError(f"{name}: rivet's result differs from the peer's: {res['check']}")
        del ref, r, buf
        time.sleep(0.3)  # let the peer's pool (used once for the reference) go idle
        run = lambda: f(*ins, out)  # noqa: E731
    med, lo, hi, reps, cpu = timed(run, budget, max_reps, first if lib == "rivet" else None)
    res.update({"median_s": med, "min_s": lo, "max_s": hi, "reps": reps, "cpu_s": cpu})
    return res


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------


def run_case(spec, threads, args):
    env = dict(os.environ, **thread_env(threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", spec,
           "--budget", str(args.budget), "--max-reps", str(args.max_reps)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:200]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def ratio(results, name, threads):
    p = results.get(f"{name}:peer:{threads}")
    r = results.get(f"{name}:rivet:{threads}")
    if not p or not r or "error" in p or "error" in r:
        return None
    return p["median_s"] / r["median_s"]


def table(results, cases, threads_list):
    lines = [f"{'case':<20} {'thr':>3} {'peer':<6} {'peer ms':>10} {'rivet ms':>10} {'rivet/peer':>10} {'by CPU':>7}  check"]
    for name in cases:
        for t in threads_list:
            p = results.get(f"{name}:peer:{t}", {})
            r = results.get(f"{name}:rivet:{t}", {})
            pm = f"{p['median_s'] * 1e3:10.3f}" if "median_s" in p else f"{'error':>10}"
            rm = f"{r['median_s'] * 1e3:10.3f}" if "median_s" in r else f"{'error':>10}"
            x = ratio(results, name, t)
            xs = f"{x:9.2f}x" if x is not None else f"{'-':>10}"
            # The same ratio by CPU time per call (robust to a loaded machine; at one thread).
            xc = (f"{p['cpu_s'] / r['cpu_s']:6.2f}x" if x is not None and p.get("cpu_s") and r.get("cpu_s")
                  else f"{'-':>7}")
            note = r.get("check", "") if "error" not in r else r["error"]
            if "error" in p:
                note += f" | peer: {p['error']}"
            lines.append(f"{name:<20} {t:>3} {CASES[name][0]:<6} {pm} {rm} {xs} {xc}  {note}")
    return "\n".join(lines)


def plot(results, cases, threads_list, png, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, max(4, 0.42 * len(cases) * len(threads_list))))
    h = 0.8 / len(threads_list)
    colors = ["tab:orange", "tab:blue", "tab:green", "tab:red"]
    for ti, t in enumerate(threads_list):
        ys, xs = [], []
        for ci, name in enumerate(cases):
            x = ratio(results, name, t)
            if x is not None:
                ys.append(ci + ti * h)
                xs.append(x)
        ax.barh(ys, xs, height=h, color=colors[ti % len(colors)], label=f"{t} thread(s)")
        for y, x in zip(ys, xs):
            ax.text(x, y, f" {x:.2f}", va="center", fontsize=7)
    ax.set_yticks([ci + h * (len(threads_list) - 1) / 2 for ci in range(len(cases))])
    ax.set_yticklabels([f"{n} (vs {CASES[n][0]})" for n in cases], fontsize=8)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("rivet speed / peer speed, same run (higher: rivet faster)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def git_rev():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of: " + ", ".join(CASES))
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--quick", action="store_true", help="a 0.5 s timing budget per case (at most 5 runs)")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timed calls per case (default 3)")
    ap.add_argument("--max-reps", type=int, default=None, help="at most this many timed calls (default 20)")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per subprocess (default 1200)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    a = ap.parse_args()
    if a.budget is None:
        a.budget = 0.5 if a.quick else 3.0
    if a.max_reps is None:
        a.max_reps = 5 if a.quick else 20
    if a.worker:
        print(json.dumps(worker(a.worker, a.budget, a.max_reps)))
        return
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)}; expected some of {', '.join(CASES)}")
    try:
        threads_list = [int(t) for t in a.threads.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--threads: expected comma-separated integers, got {a.threads!r}")
    if not threads_list or min(threads_list) < 1:
        ap.error(f"--threads: expected positive integers, got {a.threads!r}")
    full = cases == list(CASES) and threads_list == [1, 2] and not a.quick
    if a.json is None:
        a.json = DEFAULT_JSON if full else os.path.join(HERE, "out", "user_kernels_partial.json")
    if a.png is None and full:
        a.png = DEFAULT_PNG
    isa = cpu_isa()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": platform.machine(),
            "cpu": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                         if line.startswith("model name")), platform.processor() or "?"),
            "cores": os.cpu_count(), "isa": isa, "microkernel": microkernel_note(isa),
            "git_rev": git_rev(), "command": " ".join(["benches/user_kernels.py", *sys.argv[1:]]),
            "budget_s": a.budget, "load_start": os.getloadavg()}
    print(f"# {meta['date']}  {meta['cpu']} ({meta['machine']}, {meta['cores']} cores)  git {meta['git_rev']}")
    print(f"# ISA: {isa}; rivet's GEMM micro-kernel: {meta['microkernel']}")
    print(f"# load at start {meta['load_start']}")
    results = {}
    for name in cases:
        for t in threads_list:
            for lib in ("peer", "rivet"):
                spec = f"{name}:{lib}:{t}"
                results[spec] = r = run_case(spec, t, a)
                msg = r["error"] if "error" in r else (
                    f"{r['median_s'] * 1e3:.3f} ms ({r['reps']} runs), CPU {r['cpu_s'] * 1e3:.3f} ms")
                print(f"{spec:<28} {msg}", flush=True)
    meta["load_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    json.dump({"meta": meta, "cases": {n: CASES[n] for n in cases}, "results": results},
              open(a.json, "w"), indent=1)
    print()
    print(table(results, cases, threads_list))
    print(f"# load at end {meta['load_end']}")
    if a.png:
        plot(results, cases, threads_list, a.png,
             f"rivet (no schedule) vs peer, {meta['cpu']}, {isa}, {meta['date']}, {meta['git_rev']}")
    print(f"wrote {a.json}" + (f" and {a.png}" if a.png else " (partial run: no plot; --png PATH for one)"))


if __name__ == "__main__":
    main()
