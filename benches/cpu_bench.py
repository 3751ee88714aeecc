#!/usr/bin/env python
"""CPU kernels side by side: rivet against what users would pick instead.

Every case runs in its own subprocess (``--worker CASE``) with every library's thread count
set to the same value (benches/README.md): on a shared
2-vCPU VM, pools of different libraries in one process fight over the cores. In each child:
build the kernel, check its result against numpy on the same data, warm up, then time
repeated runs (a slow case runs fewer times, so the script stays within minutes); the median
is reported with min and max.

    .venv/bin/python benches/cpu_bench.py                       # everything (~10 minutes)
    .venv/bin/python benches/cpu_bench.py --only gemm --sizes 1024
    .venv/bin/python benches/cpu_bench.py --plot-only benches/out/cpu_bench.json

Cases (f32):
  gemm n x n x n, n in --sizes, at 1 and 2 threads: numpy (OpenBLAS), torch, TVM's hand
    schedule (benches/tvm_peer.py, AVX-512 or AVX2 by CPU; skipped when TVM is missing), rivet with no schedule, rivet.kernels.matmul, rivet's tensorized blocked GEMM
    (compiler/examples/gemm_tensorized.py; micro-kernel chosen by CPU features) and the same
    with RIVET_MICROKERNEL=portable (no SIMD micro-kernel), and the same blocked GEMM with
    tensorize off (rivet_cranelift: the register tile is Cranelift f32x4 code);
  add of 2^24 floats and gelu(x + bias) (2^24, bias 1024): numpy, torch, rivet (GB/s counted as
    the bytes each must move: 12 and 8 bytes per element);
  row softmax and layer_norm 4096 x 1024: torch, rivet.kernels;
  build time of the te GEMM (rivet.build, no schedule): first in a process and median after.
Outputs: a table, benches/out/cpu_bench.json and benches/cpu_bench.png (ratios to numpy, or to
torch where numpy has no such op).
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
ROOT = os.path.dirname(HERE)
DEFAULT_JSON = os.path.join(HERE, "out", "cpu_bench.json")
DEFAULT_PNG = os.path.join(HERE, "cpu_bench.png")

GEMM_LIBS = ["numpy", "torch", "tvm_hand", "rivet_default", "rivet_matmul", "rivet_tensorized",
             "rivet_tensorized_portable", "rivet_cranelift"]


def thread_env(threads):
    t = str(threads)
    return {"OMP_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t, "MKL_NUM_THREADS": t,
            "RIVET_NUM_THREADS": t, "TVM_NUM_THREADS": t}


# --------------------------------------------------------------------------------------------
# Child side
# --------------------------------------------------------------------------------------------


def timed(fn, budget=6.0, max_reps=15):
    """Median / min / max seconds of `fn()`: one warm-up run, then as many as fit `budget`."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    reps = int(max(1, min(max_reps, budget / max(first, 1e-9))))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts), max(ts), reps


def gemm_case(lib, n, threads):
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.full((n, n), np.nan, dtype=np.float32)
    if lib == "numpy":
        run = lambda: np.matmul(a, b, out=c)  # noqa: E731
    elif lib == "torch":
        import torch

        torch.set_num_threads(threads)
        ta, tb, tc = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c)
        run = lambda: torch.mm(ta, tb, out=tc)  # noqa: E731
    elif lib == "tvm_hand":
        sys.path.insert(0, HERE)
        import tvm
        import tvm_peer

        f = tvm_peer.gemm_hand_scheduled(n)
        ta, tb, tc = (tvm.runtime.tensor(x) for x in (a, b, c))
        run = lambda: f(ta, tb, tc)  # noqa: E731
        run()
        c[...] = tc.numpy()
    else:
        import rivet
        from rivet import te

        if lib == "rivet_default":
            A = te.placeholder((n, n), "float32", name="A")
            B = te.placeholder((n, n), "float32", name="B")
            k = te.reduce_axis((0, n), name="k")
            C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
            f = rivet.build(rivet.create_schedule(C), [A, B, C], target="cpu", name="mm")["mm"]
        elif lib == "rivet_matmul":
            f = rivet.kernels.matmul()
        else:
            sys.path.insert(0, os.path.join(ROOT, "compiler", "examples"))
            from gemm_tensorized import gemm

            f = gemm(n, n, n, tensorize=(lib != "rivet_cranelift"))
        run = lambda: f(a, b, c)  # noqa: E731
    med, lo, hi, reps = timed(run)
    # The float64 reference after the timing: OpenBLAS's worker threads spin for a while after
    # a call, and would compete with the timed library's own pool.
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = float(np.max(np.abs(c - ref)) / max(1.0, np.max(np.abs(ref))))
    if not err < 1e-4:
        raise AssertionError(f"{lib} gemm {n}: relative error {err}")
    gf = 2 * n ** 3 / 1e9
    return {"median_s": med, "min_s": lo, "max_s": hi, "reps": reps,
            "gflops": gf / med, "check": f"max rel err {err:.1e} vs float64 numpy"}


def elementwise_case(lib, op, threads):
    import numpy as np

    n = 1 << 24
    rng = np.random.default_rng(1)
    x = rng.standard_normal(n, dtype=np.float32)
    if op == "add":
        y = rng.standard_normal(n, dtype=np.float32)
        ref = x + y
        nbytes = 12 * n
    else:
        rows, cols = n // 1024, 1024
        x = x.reshape(rows, cols)
        y = rng.standard_normal(cols, dtype=np.float32)
        ref = None  # checked against torch's gelu below
        nbytes = 8 * n
    out = np.full(x.shape, np.nan, dtype=np.float32)
    if lib == "numpy":
        if op != "add":
            raise KeyError("numpy has no erf: gelu is torch-only")
        run = lambda: np.add(x, y, out=out)  # noqa: E731
    elif lib == "torch":
        import torch

        torch.set_num_threads(threads)
        tx, ty, to = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(out)
        if op == "add":
            run = lambda: torch.add(tx, ty, out=to)  # noqa: E731
        else:
            gelu = torch.nn.functional.gelu

            def run():  # eager: two passes, fresh results, as a torch user writes it
                to.copy_(gelu(tx + ty)) if run.check else gelu(tx + ty)

            run.check = False
    else:
        import rivet
        from rivet import te

        if op == "add":
            f = rivet.kernels.add()
        else:
            r, c_ = te.var("r"), te.var("c")
            X = te.placeholder((r, c_), "float32", name="X")
            Bias = te.placeholder((c_,), "float32", name="bias")

            def g(i, j):
                v = X[i, j] + Bias[j]
                return v * 0.5 * (te.erf(v * 0.7071067811865476) + 1.0)

            Y = te.compute((r, c_), g, name="Y")
            f = rivet.build(rivet.create_schedule(Y), [X, Bias, Y], target="cpu", name="gelu")["gelu"]
        run = lambda: f(x, y, out)  # noqa: E731
    med, lo, hi, reps = timed(run)
    if lib == "torch" and op == "gelu":
        run.check = True  # one more call, untimed, writes `out` for the check below
        run()
    if op == "add":
        ok = np.array_equal(out, ref)
    else:
        import torch

        expect = torch.nn.functional.gelu(torch.from_numpy(x) + torch.from_numpy(y)).numpy()
        # float32 erf near -1 cancels in both: compare absolutely at 1e-5 (values are O(1)).
        ok = np.allclose(out, expect, rtol=1e-5, atol=1e-5)
    if not ok:
        raise AssertionError(f"{lib} {op}: wrong result")
    return {"median_s": med, "min_s": lo, "max_s": hi, "reps": reps,
            "gbps": nbytes / med / 1e9, "check": "equal to numpy" if op == "add" else "close to torch gelu"}


def rowwise_case(lib, op, threads):
    import numpy as np

    rows, cols = 4096, 1024
    rng = np.random.default_rng(2)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    g = rng.standard_normal(cols, dtype=np.float32)
    b = rng.standard_normal(cols, dtype=np.float32)
    out = np.full_like(x, np.nan)
    import torch

    torch.set_num_threads(threads)
    tx, tg, tb = torch.from_numpy(x), torch.from_numpy(g), torch.from_numpy(b)
    expect = (torch.softmax(tx, dim=-1) if op == "softmax"
              else torch.nn.functional.layer_norm(tx, (cols,), tg, tb, eps=1e-5)).numpy()
    if lib == "torch":
        # The call a torch user makes: a fresh result, no copy into `out` (torch has no out=
        # for these; an extra copy_ would charge torch a 16 MB pass rivet does not make). The
        # result of the last timed call is what gets checked.
        to = torch.from_numpy(out)
        last = {}
        if op == "softmax":
            def run():
                last["y"] = torch.softmax(tx, dim=-1)
        else:
            def run():
                last["y"] = torch.nn.functional.layer_norm(tx, (cols,), tg, tb, eps=1e-5)
        med, lo, hi, reps = timed(run)
        to.copy_(last["y"])
        if not np.allclose(out, expect, rtol=1e-4, atol=1e-5):
            raise AssertionError(f"{lib} {op}: wrong result")
        return {"median_s": med, "min_s": lo, "max_s": hi, "reps": reps, "check": "close to torch"}
    else:
        import rivet

        if op == "softmax":
            f = rivet.kernels.softmax()
            run = lambda: f(x, out)  # noqa: E731
        else:
            f = rivet.kernels.layer_norm()
            run = lambda: f(x, g, b, out)  # noqa: E731
    med, lo, hi, reps = timed(run)
    if not np.allclose(out, expect, rtol=1e-4, atol=1e-5):
        raise AssertionError(f"{lib} {op}: wrong result")
    return {"median_s": med, "min_s": lo, "max_s": hi, "reps": reps, "check": "close to torch"}


def build_case():
    import rivet
    from rivet import te

    def one():
        n = te.var("n")
        A = te.placeholder((n, n), "float32", name="A")
        B = te.placeholder((n, n), "float32", name="B")
        k = te.reduce_axis((0, n), name="k")
        C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        t0 = time.perf_counter()
        rivet.build(rivet.create_schedule(C), [A, B, C], target="cpu", name="mm")
        return time.perf_counter() - t0

    first = one()
    ts = [one() for _ in range(50)]
    return {"first_s": first, "median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
            "reps": 50, "check": "builds"}


def worker(spec):
    kind, *rest = spec.split(":")
    if kind == "gemm":
        lib, n, threads = rest[0], int(rest[1]), int(rest[2])
        return gemm_case(lib, n, threads)
    if kind in ("add", "gelu"):
        return elementwise_case(rest[0], kind, int(rest[1]))
    if kind in ("softmax", "layer_norm"):
        return rowwise_case(rest[0], kind, int(rest[1]))
    if kind == "build":
        return build_case()
    raise KeyError(spec)


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------


def run_case(spec, threads, timeout):
    env = dict(os.environ, **thread_env(threads))
    if spec.startswith("gemm:rivet_tensorized_portable"):
        env["RIVET_MICROKERNEL"] = "portable"
        spec = spec.replace("rivet_tensorized_portable", "rivet_tensorized")
    try:
        p = subprocess.run([sys.executable, __file__, "--worker", spec], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:160]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def plan(args):
    specs = []
    if args.only in (None, "gemm"):
        for n in args.sizes:
            for threads in (1, 2):
                for lib in GEMM_LIBS:
                    specs.append((f"gemm:{lib}:{n}:{threads}", threads))
    if args.only in (None, "elementwise"):
        for lib in ("numpy", "torch", "rivet"):
            specs.append((f"add:{lib}:2", 2))
        for lib in ("torch", "rivet"):
            specs.append((f"gelu:{lib}:2", 2))
    if args.only in (None, "rowwise"):
        for op in ("softmax", "layer_norm"):
            for lib in ("torch", "rivet"):
                specs.append((f"{op}:{lib}:2", 2))
    if args.only in (None, "build"):
        specs.append(("build", 1))
    return specs


def table(results):
    rows = []
    for spec, r in results.items():
        if "error" in r:
            rows.append(f"{spec:<42} {r['error']}")
            continue
        extra = ""
        if "gflops" in r:
            extra = f"{r['gflops']:8.1f} GFLOP/s"
        elif "gbps" in r:
            extra = f"{r['gbps']:8.1f} GB/s"
        elif "first_s" in r:
            extra = f"first {r['first_s'] * 1e3:.2f} ms"
        rows.append(f"{spec:<42} {r['median_s'] * 1e3:10.3f} ms (min {r['min_s'] * 1e3:.3f}, "
                    f"max {r['max_s'] * 1e3:.3f}, {r['reps']} runs) {extra}")
    return "\n".join(rows)


def ratios(results):
    """Each case's speed relative to the reference of its group (numpy, else torch)."""
    out = {}
    for spec, r in results.items():
        if "error" in r or spec == "build":
            continue
        kind, lib, *rest = spec.split(":")
        for ref_lib in ("numpy", "torch"):
            ref = results.get(":".join([kind, ref_lib, *rest]))
            if ref and "error" not in ref:
                out[spec] = (ref["median_s"] / r["median_s"], ref_lib)
                break
    return out


def plot(results, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = ratios(results)
    labels = list(rs)
    fig, ax = plt.subplots(figsize=(10, max(4, 0.28 * len(labels))))
    ax.barh(range(len(labels)), [rs[k][0] for k in labels], color=[
        "tab:orange" if ":rivet" in k else "tab:gray" for k in labels])
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels([f"{k} (vs {rs[k][1]})" for k in labels], fontsize=7)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("speed relative to numpy (or torch), same run, higher is faster")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker")
    ap.add_argument("--only", choices=["gemm", "elementwise", "rowwise", "build"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--json", default=None, help=f"default {DEFAULT_JSON} (a partial run: out/cpu_bench_partial.json)")
    ap.add_argument("--png", default=None, help=f"default {DEFAULT_PNG} (a partial run: no plot, so it never replaces the full run's)")
    ap.add_argument("--plot-only")
    a = ap.parse_args()
    partial = a.only is not None or a.sizes != [256, 1024, 2048]
    if a.json is None:
        a.json = os.path.join(HERE, "out", "cpu_bench_partial.json") if partial else DEFAULT_JSON
    if a.png is None and not (partial and not a.plot_only):
        a.png = DEFAULT_PNG
    if a.worker:
        print(json.dumps(worker(a.worker)))
        return
    if a.plot_only:
        results = json.load(open(a.plot_only))["results"]
        plot(results, a.png)
        print(table(results))
        return
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": platform.processor() or platform.machine(),
            "cpu": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                         if line.startswith("model name")), "?"),
            "cores": os.cpu_count(), "load_start": os.getloadavg()}
    print(f"# {meta['date']}  {meta['cpu']}  {meta['cores']} cores  load {meta['load_start']}")
    results = {}
    for spec, threads in plan(a):
        results[spec] = run_case(spec, threads, a.timeout)
        r = results[spec]
        print(f"{spec:<42} " + (r["error"] if "error" in r else f"{r['median_s'] * 1e3:.3f} ms"), flush=True)
    meta["load_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    json.dump({"meta": meta, "results": results}, open(a.json, "w"), indent=1)
    print()
    print(table(results))
    print()
    for spec, (x, ref) in ratios(results).items():
        print(f"{spec:<42} {x:6.2f}x {ref}")
    if a.png:
        plot(results, a.png)
    print(f"wrote {a.json}" + (f" and {a.png}" if a.png else " (a partial run: no plot; --png PATH for one)"))


if __name__ == "__main__":
    main()
