#!/usr/bin/env python
"""Gradient kernels from `te.gradient` against torch autograd's backward (target:
rivet's backward time within 1.5x of torch's for matmul, softmax and layer_norm at 1024).

Every case runs in its own subprocess (``--worker CASE``) with every library's thread count
set to the same value (OMP_NUM_THREADS, RIVET_NUM_THREADS, torch.set_num_threads;
benches/README.md): at 1 and 2 threads. In each child: build, check rivet's gradients against
torch.autograd's on the same data (NaN-poisoned outputs, assert_close), warm up, then time
repeated calls (median, min and max).

    .venv/bin/python benches/grad_bench.py                     # everything, ~2 minutes
    .venv/bin/python benches/grad_bench.py --only softmax --threads 1
    PYTHONPATH=<other wheel> .venv/bin/python benches/grad_bench.py --libs rivet --json out/x.json
    .venv/bin/python benches/grad_bench.py --interleaved      # both alternately, one process, 1 thread
    .venv/bin/python benches/grad_bench.py --plot-only benches/out/grad_bench.json

Problems (float32, 1024 x 1024):
  matmul      C = A @ B, gradients for A and B
  softmax     over the last axis, gradient for x
  layer_norm  over the last axis, weight and bias of 1024, eps = 1e-5; gradients for x,
              weight and bias
What is timed:
  torch  torch.autograd.grad(y, inputs, gy, retain_graph=True), the forward run once outside
         the timing: torch's backward uses the activations its forward saved.
  torch_fwd_bwd (context, not the target's measure) the forward and torch.autograd.grad in each
         timed call: what torch pays when it has no saved activations.
  rivet  the saved backward of Function.training_pair() (docs/gradient.md, "Saved
         activations": what rivet.torch.custom_op and rivet.jax.ffi_func run under autograd),
         derived with te.gradient and built with the default CPU schedule, called on torch
         tensors with its outputs preallocated; the forward with residuals runs once outside
         the timing, as torch's forward: the backward reads the forward's outputs and the
         values it kept (softmax's exponentials and row sums; layer_norm's row sums).
  rivet_library  the same saved backward of the kernel library's function (rivet.kernels.matmul /
         softmax / layer_norm, float32): symbolic shapes and keepdims row statistics (`S[i, 0]`),
         what a user of rivet.torch.custom_op(rivet.kernels.layer_norm()) runs; judged by the
         same target.
  rivet_recompute (context) the plain backward, Function.backward(): only the forward's
         inputs and the head, so it recomputes the forward values it needs inside the timed call
         (rivet.build(rivet.create_schedule(grads), [*inputs, head, *grads], target="cpu")).
Outputs: a table, benches/out/grad_bench.json and benches/grad_bench.png (rivet's time over
torch's per case and thread count; the issue's target is <= 1.5).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_JSON = os.path.join(HERE, "out", "grad_bench.json")
DEFAULT_PNG = os.path.join(HERE, "grad_bench.png")
OPS = ["matmul", "softmax", "layer_norm"]
LIBS = ["torch", "rivet", "rivet_library", "rivet_recompute", "torch_fwd_bwd"]
N = 1024
EPS = 1e-5
TARGET = 1.5


def thread_env(threads):
    t = str(threads)
    return {"OMP_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t, "MKL_NUM_THREADS": t,
            "RIVET_NUM_THREADS": t}


# --------------------------------------------------------------------------------------------
# Child side
# --------------------------------------------------------------------------------------------


def timed(fn, budget=3.0, min_reps=5, max_reps=200, warmup=0.25):
    """Median / min / max seconds of `fn()`: warm-up calls for `warmup` seconds (at least two),
    then as many as fit `budget` (between `min_reps` and `max_reps`).

    The warm-up is that long because of this VM: a two-thread run of a 0.1-0.2 ms kernel
    (either library) starts in a slow phase, often at its one-thread speed, for tens of
    milliseconds after the process was idle or single-threaded (the second vCPU's wake-up);
    40 timed calls after two warm-ups fell entirely inside it in some runs (2026-11-25)."""
    fn()
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        fn()
    reps = int(max(min_reps, min(max_reps, budget / max(first, 1e-9))))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts), max(ts), reps


def rivet_program(op, n=N):
    """(inputs, output) te tensors of the forward, written as rivet.kernels writes it."""
    from rivet import te

    if op == "matmul":
        A = te.placeholder((n, n), "float32", name="A")
        B = te.placeholder((n, n), "float32", name="B")
        k = te.reduce_axis((0, n), name="k")
        C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        return [A, B], C
    if op == "softmax":
        X = te.placeholder((n, n), "float32", name="X")
        r1 = te.reduce_axis((0, n), name="r1")
        # As rivet.kernels.softmax: the max is a constant to te.gradient (shift invariance).
        mx = te.stop_gradient(te.compute((n,), lambda i: te.max(X[i, r1], axis=r1), name="max"))
        e = te.compute((n, n), lambda i, j: te.exp(X[i, j] - mx[i]), name="exp")
        r2 = te.reduce_axis((0, n), name="r2")
        s = te.compute((n,), lambda i: te.sum(e[i, r2], axis=r2), name="sum")
        Y = te.compute((n, n), lambda i, j: e[i, j] * (1.0 / s[i]), name="Y")
        return [X], Y
    if op == "layer_norm":
        X = te.placeholder((n, n), "float32", name="X")
        G = te.placeholder((n,), "float32", name="gamma")
        Bt = te.placeholder((n,), "float32", name="beta")
        r1 = te.reduce_axis((0, n), name="r1")
        total = te.compute((n,), lambda i: te.sum(X[i, r1], axis=r1), name="total")
        cen = te.compute((n, n), lambda i, j: X[i, j] - total[i] / float(n), name="centered")
        r2 = te.reduce_axis((0, n), name="r2")
        sq = te.compute((n,), lambda i: te.sum(cen[i, r2] * cen[i, r2], axis=r2), name="sqsum")
        Y = te.compute(
            (n, n),
            lambda i, j: cen[i, j] * te.rsqrt(sq[i] / float(n) + EPS) * G[j] + Bt[j],
            name="Y",
        )
        return [X, G, Bt], Y
    raise KeyError(op)


def build_rivet_backward(op, n=N):
    import rivet
    from rivet import te

    inputs, out = rivet_program(op, n)
    head = te.placeholder(out.shape, out.dtype, name="head")
    grads = te.gradient(out, inputs, head)
    mod = rivet.build(rivet.create_schedule(grads), [*inputs, head, *grads], target="cpu",
                      name="bwd")
    return mod, mod["bwd"]


def build_rivet_saved(op, n=N):
    """The saved-activations pair (Function.training_pair(): what rivet.torch.custom_op and
    rivet.jax.ffi_func run under autograd) of the forward, built with the default schedule."""
    import rivet

    inputs, out = rivet_program(op, n)
    f = rivet.build(rivet.create_schedule(out), [*inputs, out], target="cpu", name=op)[op]
    return f.training_pair()


def rivet_saved_call(op, xs, gy, got, library=False):
    """The saved backward's call on `xs` (forward with residuals run once, untimed); with
    `library`, of the kernel library's function (symbolic shapes) instead of this file's
    constant-shape program."""
    import torch

    if library:
        import rivet.kernels

        fwd, bwd, _ = getattr(rivet.kernels, op)("float32").training_pair()
    else:
        fwd, bwd, _ = build_rivet_saved(op)
    kept = fwd(*xs)
    kept = [torch.from_dlpack(t) for t in (kept if isinstance(kept, (tuple, list)) else (kept,))]
    return lambda: bwd(*xs, *kept, gy, *got)


def torch_forward(op, xs):
    import torch

    if op == "matmul":
        return xs[0] @ xs[1]
    if op == "softmax":
        return torch.softmax(xs[0], dim=-1)
    return torch.nn.functional.layer_norm(xs[0], (xs[0].shape[-1],), xs[1], xs[2], eps=EPS)


def grad_case(op, lib, threads):
    import torch

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    shapes = {"matmul": [(N, N), (N, N)], "softmax": [(N, N)],
              "layer_norm": [(N, N), (N,), (N,)]}[op]
    xs = [torch.randn(s, generator=g, dtype=torch.float32) for s in shapes]
    gy = torch.randn((N, N), generator=g, dtype=torch.float32)
    # The reference gradients (and torch's timed backward): the forward once, then autograd.
    leaves = [x.clone().requires_grad_() for x in xs]
    y = torch_forward(op, leaves)
    ref = torch.autograd.grad(y, leaves, gy, retain_graph=True)
    if lib == "torch":
        last = {}

        def run():
            last["g"] = torch.autograd.grad(y, leaves, gy, retain_graph=True)

        med, lo, hi, reps = timed(run)
        got = last["g"]
        check = "torch itself"
    elif lib == "torch_fwd_bwd":
        last = {}

        def run():
            last["g"] = torch.autograd.grad(torch_forward(op, leaves), leaves, gy)

        med, lo, hi, reps = timed(run)
        got = last["g"]
        check = "torch itself"
    else:
        import rivet

        got = [torch.full_like(x, float("nan")) for x in xs]
        if lib in ("rivet", "rivet_library"):
            run = rivet_saved_call(op, xs, gy, got, library=lib == "rivet_library")
        else:
            _, f = build_rivet_backward(op)
            run = lambda: f(*xs, gy, *got)  # noqa: E731
        run()
        for k, (a, b) in enumerate(zip(got, ref)):
            torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4,
                                       msg=lambda m: f"{op} gradient {k}: {m}")
        med, lo, hi, reps = timed(run)
        check = "assert_close(rtol=2e-4, atol=2e-4) to torch.autograd.grad"
        if rivet.num_threads() != threads:
            raise AssertionError(f"rivet pool has {rivet.num_threads()} threads, not {threads}")
    # The gradients of the last timed call are still right (nothing stale, nothing racy).
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4)
    return {"median_s": med, "min_s": lo, "max_s": hi, "reps": reps, "check": check}


def interleaved_case(op, threads, rounds=200):
    """rivet's backward and torch's, called alternately in one process (`rounds` each): on a
    loaded machine both see the same load, so their ratio drifts less than between
    subprocesses run minutes apart."""
    import torch

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    shapes = {"matmul": [(N, N), (N, N)], "softmax": [(N, N)],
              "layer_norm": [(N, N), (N,), (N,)]}[op]
    xs = [torch.randn(s, generator=g, dtype=torch.float32) for s in shapes]
    gy = torch.randn((N, N), generator=g, dtype=torch.float32)
    leaves = [x.clone().requires_grad_() for x in xs]
    y = torch_forward(op, leaves)
    ref = torch.autograd.grad(y, leaves, gy, retain_graph=True)
    calls = {}
    for lib in ("rivet", "rivet_library"):
        got = [torch.full_like(x, float("nan")) for x in xs]
        calls[lib] = rivet_saved_call(op, xs, gy, got, library=lib == "rivet_library")
        calls[lib]()
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4)
    if op == "matmul":
        rounds = max(10, rounds // 20)
    calls["torch"] = lambda: torch.autograd.grad(y, leaves, gy, retain_graph=True)
    ts = {k: [] for k in calls}
    for c in calls.values():
        c()
    for _ in range(rounds):
        for k, c in calls.items():
            t0 = time.perf_counter()
            c()
            ts[k].append(time.perf_counter() - t0)
    out = {k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "reps": len(v)}
           for k, v in ts.items()}
    out["ratio_median"] = out["rivet"]["median_s"] / out["torch"]["median_s"]
    out["ratio_min"] = out["rivet"]["min_s"] / out["torch"]["min_s"]
    out["library_ratio_median"] = out["rivet_library"]["median_s"] / out["torch"]["median_s"]
    out["library_ratio_min"] = out["rivet_library"]["min_s"] / out["torch"]["min_s"]
    return out


def show_ir(op):
    mod, _ = build_rivet_backward(op)
    print(mod.get_source("ir"))


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------


def run_case(spec, threads, timeout):
    env = dict(os.environ, **thread_env(threads))
    try:
        p = subprocess.run([sys.executable, __file__, "--worker", spec], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:200]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def ratios(results, ref_lib="torch"):
    """rivet's median time over `ref_lib`'s, per (op, threads): the issue's target is <= 1.5
    against torch's backward ("torch")."""
    out = {}
    for spec, r in results.items():
        op, lib, threads = spec.split(":")
        ref = results.get(f"{op}:{ref_lib}:{threads}")
        if lib in ("rivet", "rivet_library") and "error" not in r and ref and "error" not in ref:
            name = op if lib == "rivet" else f"{op} (library)"
            out[f"{name}:{threads}"] = r["median_s"] / ref["median_s"]
    return out


def table(results):
    rows = []
    for spec, r in results.items():
        if "error" in r:
            rows.append(f"{spec:<24} {r['error']}")
        else:
            rows.append(f"{spec:<24} {r['median_s'] * 1e3:9.3f} ms (min {r['min_s'] * 1e3:.3f}, "
                        f"max {r['max_s'] * 1e3:.3f}, {r['reps']} runs)")
    return "\n".join(rows)


def plot(results, png, title=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rs = ratios(results)
    ctx = ratios(results, "torch_fwd_bwd")
    labels = list(rs)
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(labels) + 2.2))
    ys = list(range(len(labels)))
    ax.barh([y - 0.2 for y in ys], [rs[k] for k in labels], height=0.4,
            color=["tab:green" if rs[k] <= TARGET else "tab:red" for k in labels],
            label="vs torch backward (saved activations): the target")
    ax.barh([y + 0.2 for y in ys], [ctx.get(k, 0) for k in labels], height=0.4, color="tab:gray",
            label="vs torch forward + backward (context)")
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{k.split(':')[0]}, {k.split(':')[1]} thread(s)" for k in labels])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(TARGET, color="tab:red", lw=0.8, ls="--", label=f"target {TARGET}x")
    ax.set_xscale("log")
    ax.set_xlabel("rivet backward time / torch time, same run (lower is better)")
    ax.set_title(title or f"te.gradient kernels vs torch autograd, float32 {N}x{N}", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=7)
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator([0.1, 0.2, 0.5, 1, 1.5, 2, 5, 10, 20]))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker")
    ap.add_argument("--only", choices=OPS, nargs="+")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--libs", choices=LIBS, nargs="+", help="a subset of the sides timed (e.g. rivet only, "
                    "to compare two rivet builds: PYTHONPATH=<wheel dir>)")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--json", default=None, help=f"default {DEFAULT_JSON} (a partial run: out/grad_bench_partial.json)")
    ap.add_argument("--png", default=None, help=f"default {DEFAULT_PNG} (a partial run: no plot)")
    ap.add_argument("--plot-only")
    ap.add_argument("--interleaved", action="store_true",
                    help="rivet and torch backward called alternately in one process per case "
                         "(200 rounds; matmul 10), one thread unless --threads: ratios robust to a "
                         "machine's changing load")
    ap.add_argument("--ir", choices=OPS, help="print the IR the default schedule built for this backward")
    a = ap.parse_args()
    if a.ir:
        show_ir(a.ir)
        return
    if a.worker:
        op, lib, threads = a.worker.split(":")
        if lib == "interleaved":
            print(json.dumps(interleaved_case(op, int(threads))))
        else:
            print(json.dumps(grad_case(op, lib, int(threads))))
        return
    if a.interleaved:
        # One thread unless asked: two libraries' pools in one process fight over the cores
        # (an OpenMP pool spins after its work while rivet's runs), the reason every other
        # case runs in a subprocess of its own.
        rows = {}
        for threads in ([1] if a.threads == [1, 2] else a.threads):
            for op in a.only or OPS:
                spec = f"{op}:interleaved:{threads}"
                r = rows[spec] = run_case(spec, threads, a.timeout)
                if "error" in r:
                    print(f"{spec:<26} {r['error']}")
                    continue
                print(f"{spec:<26} rivet {r['rivet']['median_s'] * 1e3:8.3f} ms (min {r['rivet']['min_s'] * 1e3:.3f})"
                      f"  torch {r['torch']['median_s'] * 1e3:8.3f} ms (min {r['torch']['min_s'] * 1e3:.3f})"
                      f"  rivet / torch {r['ratio_median']:.2f} (by minimums {r['ratio_min']:.2f})"
                      f"  library {r['rivet_library']['median_s'] * 1e3:8.3f} ms, / torch "
                      f"{r['library_ratio_median']:.2f}", flush=True)
        path = a.json or os.path.join(HERE, "out", "grad_bench_interleaved.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        json.dump({"meta": {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                            "load": os.getloadavg()}, "results": rows}, open(path, "w"), indent=1)
        print(f"wrote {path}")
        return
    partial = a.only is not None or a.threads != [1, 2] or a.libs is not None
    if a.json is None:
        a.json = os.path.join(HERE, "out", "grad_bench_partial.json") if partial else DEFAULT_JSON
    if a.png is None and not (partial and not a.plot_only):
        a.png = DEFAULT_PNG
    if a.plot_only:
        data = json.load(open(a.plot_only))
        results = data["results"]
        plot(results, a.png, data.get("meta", {}).get("title"))
        print(table(results))
        return
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": platform.processor() or platform.machine(),
            "cpu": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                         if line.startswith("model name")), "?"),
            "cores": os.cpu_count(), "load_start": os.getloadavg()}
    print(f"# {meta['date']}  {meta['cpu']}  {meta['cores']} cores  load {meta['load_start']}")
    results = {}
    for threads in a.threads:
        for op in a.only or OPS:
            for lib in a.libs or LIBS:
                spec = f"{op}:{lib}:{threads}"
                results[spec] = r = run_case(spec, threads, a.timeout)
                print(f"{spec:<24} " + (r["error"] if "error" in r else f"{r['median_s'] * 1e3:.3f} ms"),
                      flush=True)
    meta["load_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    json.dump({"meta": meta, "results": results}, open(a.json, "w"), indent=1)
    print()
    print(table(results))
    print()
    ctx = ratios(results, "torch_fwd_bwd")
    for key, x in ratios(results).items():
        op, threads = key.split(":")
        verdict = "within" if x <= TARGET else "NOT within"
        extra = f"; vs torch forward + backward {ctx[key]:.2f}" if key in ctx else ""
        print(f"{op:<12} {threads} thread(s): rivet / torch backward = {x:5.2f}  ({1 / x:.2f}x torch's "
              f"speed; {verdict} {TARGET}x{extra})")
    if a.png:
        plot(results, a.png)
    print(f"wrote {a.json}" + (f" and {a.png}" if a.png else " (a partial run: no plot; --png PATH for one)"))


if __name__ == "__main__":
    main()
