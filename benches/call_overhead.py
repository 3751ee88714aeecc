#!/usr/bin/env python
"""Python call overhead of packed functions: rivet vs apache-tvm-ffi vs torch.

Every case runs in its own subprocess (``--worker CASE``) with all thread pools set to one
thread, so that no library's spinning pool competes with the timed loop on this 2-core VM
(benches/README.md). In each child: build the arguments, check the result
once against a reference where that means something, warm up, then
``timeit.repeat(number=N, repeat=R)``; median / min / max are reported in microseconds per
call. All tensors are 4-element float32 unless the case says otherwise.

    .venv/bin/python benches/call_overhead.py                  # all cases, ~1-2 minutes
    .venv/bin/python benches/call_overhead.py --json out.json  # results elsewhere
    .venv/bin/python benches/call_overhead.py --plot-only benches/out/call_overhead.json

Outputs: a table on stdout, ``benches/out/call_overhead.json`` and ``benches/call_overhead.png``.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_JSON = os.path.join(HERE, "out", "call_overhead.json")
DEFAULT_PNG = os.path.join(HERE, "call_overhead.png")

# Set in every child. JAX_PLATFORMS / XLA_FLAGS keep JAX on the CPU with one compute thread.
CHILD_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "RIVET_NUM_THREADS": "1",
    "TVM_NUM_THREADS": "1",
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}

# (key, label, library the case needs besides rivet) in display order.
CASES = [
    ("rivet_axpy_torch", "rivet testing.axpy(0.5, x, y), torch", "rivet"),
    ("rivet_nop_torch3", "rivet testing.nop(x, y, z), 3 torch", "rivet"),
    ("tvmffi_nop_torch3", "tvm-ffi testing.nop(x, y, z), 3 torch", "tvm_ffi"),
    ("torch_add_out", "torch.add(x, y, out=z)", "torch"),
    ("rivet_nop_numpy3", "rivet testing.nop(a, b, c), 3 numpy", "rivet"),
    ("tvmffi_nop_numpy3", "tvm-ffi testing.nop(a, b, c), 3 numpy", "tvm_ffi"),
    ("rivet_nop_jax3", "rivet testing.nop(a, b, c), 3 jax", "rivet"),
    ("tvmffi_nop_jax3", "tvm-ffi testing.nop(a, b, c), 3 jax", "tvm_ffi"),
    ("rivet_pytorch_func_axpy", "rivet to_pytorch_func(axpy)(0.5, x, y)", "rivet"),
    ("rivet_nop_noargs", "rivet testing.nop()", "rivet"),
    ("rivet_add_static", "rivet compiled add, static (4,), 3 torch", "rivet"),
    ("rivet_add_symbolic", "rivet compiled add, symbolic (n,), 3 torch", "rivet"),
    ("rivet_add_checked", "rivet compiled add, symbolic + per-call bounds checks, 3 torch", "rivet"),
    ("tvmffi_nop_noargs", "tvm-ffi testing.nop()", "tvm_ffi"),
    ("tvm_add_static", "TVM compiled add (tvm.compile), static (4,), 3 torch", "tvm"),
    ("tvm_add_symbolic", "TVM compiled add (tvm.compile), symbolic (n,), 3 torch", "tvm"),
]
REFERENCE = "tvmffi_nop_torch3"
LABELS = {key: label for key, label, _ in CASES}


# --------------------------------------------------------------------------------------------
# Child side: build one case, check it, time it.
# --------------------------------------------------------------------------------------------


def _torch3():
    import torch

    torch.manual_seed(0)
    return torch.rand(4), torch.rand(4), torch.rand(4)


def _numpy3():
    import numpy as np

    rng = np.random.default_rng(0)
    return tuple(rng.random(4, dtype=np.float32) for _ in range(3))


def _jax3():
    import jax.numpy as jnp

    arrs = tuple(jnp.arange(4, dtype=jnp.float32) + i for i in range(3))
    for a in arrs:
        a.block_until_ready()
    return arrs


def _check_axpy(call, x, y):
    """One call of an axpy-like ``call(alpha, x, y)`` must give y <- 0.5*x + y, in place."""
    import torch

    expect = 0.5 * x + y
    ptr = y.data_ptr()
    call(0.5, x, y)
    if not torch.allclose(y, expect, rtol=1e-6, atol=1e-6):
        raise AssertionError(f"axpy result {y.tolist()} != reference {expect.tolist()}")
    if y.data_ptr() != ptr:
        raise AssertionError("axpy did not write y in place")
    return "axpy(0.5, x, y) == 0.5*x + y, in place"


def _check_none(result, what):
    if result is not None:
        raise AssertionError(f"{what} returned {result!r}, expected None")
    return f"{what} returned None"


def build_case(key):
    """Return (stmt, check message): a zero-argument callable to time and what was checked."""
    if key.startswith("rivet"):
        import rivet
    if key.startswith("tvmffi"):
        import tvm_ffi

    if key == "rivet_axpy_torch":
        f = rivet.get_global_func("testing.axpy")
        x, y, _ = _torch3()
        msg = _check_axpy(f, x, y)
        return (lambda: f(0.5, x, y)), msg
    if key == "rivet_pytorch_func_axpy":
        f = rivet.to_pytorch_func(rivet.get_global_func("testing.axpy"))
        x, y, _ = _torch3()
        msg = _check_axpy(f, x, y)
        return (lambda: f(0.5, x, y)), msg
    if key == "torch_add_out":
        import torch

        x, y, z = _torch3()
        torch.add(x, y, out=z)
        if not torch.equal(z, x + y):
            raise AssertionError("torch.add(x, y, out=z) != x + y")
        return (lambda: torch.add(x, y, out=z)), "z == x + y"

    if key.startswith("rivet_add_"):
        # Compiled te kernels: the generic call path (signature, dims, bounds and overflow
        # checks, frame) on top of the packed-function call. "checked" reads B at a shifted,
        # scaled index whose bounds and int64 safety are checked once per call.
        from rivet import te
        import torch

        kind = key[len("rivet_add_"):]
        n = te.var("n")
        shape = (4,) if kind == "static" else (n,)
        A = te.placeholder(shape, "float32", name="A")
        B = te.placeholder(shape, "float32", name="B")
        if kind == "checked":
            m = te.var("m")
            B = te.placeholder((m,), "float32", name="B")
            C = te.compute(shape, lambda i: A[i] + B[(i * 3 + 1) // 3], name="C")
        else:
            C = te.compute(shape, lambda i: A[i] + B[i], name="C")
        f = rivet.build(rivet.create_schedule(C), [A, B, C], target="cpu", name="add")["add"]
        src = rivet.build(rivet.create_schedule(C), [A, B, C], target="cpu", name="add").get_source("ir")
        checks = src.count("  check ")
        x, y, z = _torch3()
        f(x, y, z)
        if not torch.equal(z, x + y):
            raise AssertionError(f"compiled add: {z.tolist()} != {(x + y).tolist()}")
        return (lambda: f(x, y, z)), f"z == x + y, in place; {checks} per-call checks"

    if key.startswith("tvm_add_"):
        # The same kernel built by TVM (apache-tvm; `make bench` installs it): its generated
        # code checks the arguments itself, behind tvm-ffi's packed call.
        import torch
        import tvm
        from tvm import te as tte

        n = tte.var("n") if key.endswith("symbolic") else 4
        A = tte.placeholder((n,), "float32", name="A")
        B = tte.placeholder((n,), "float32", name="B")
        C = tte.compute((n,), lambda i: A[i] + B[i], name="C")
        prim = tte.create_prim_func([A, B, C]).with_attr("global_symbol", "add")
        f = tvm.compile(prim, target="llvm")["add"]
        x, y, z = _torch3()
        f(x, y, z)
        if not torch.equal(z, x + y):
            raise AssertionError(f"TVM add: {z.tolist()} != {(x + y).tolist()}")
        return (lambda: f(x, y, z)), "z == x + y, in place"

    lib, _, rest = key.partition("_nop_")
    if lib == "rivet":
        f = rivet.get_global_func("testing.nop")
    elif lib == "tvmffi":
        f = tvm_ffi.get_global_func("testing.nop")
    else:
        raise KeyError(key)
    args = {"torch3": _torch3, "numpy3": _numpy3, "jax3": _jax3, "noargs": tuple}[rest]()
    msg = _check_none(f(*args), f"{lib} nop")
    return (lambda: f(*args)), msg


def worker(key, number, repeat):
    stmt, check = build_case(key)
    # Warm up (and calibrate: slow cases get a smaller N so a repeat stays under ~1.5 s).
    t0 = time.perf_counter()
    for _ in range(20_000):
        stmt()
    per_call = (time.perf_counter() - t0) / 20_000
    n = number
    if per_call * n > 1.5:
        n = max(10_000, int(1.5 / per_call) // 10_000 * 10_000)
    times = timeit.repeat(stmt, number=n, repeat=repeat)
    us = sorted(t / n * 1e6 for t in times)
    json.dump(
        {
            "case": key,
            "number": n,
            "repeat": repeat,
            "samples_us": us,
            "median_us": statistics.median(us),
            "min_us": us[0],
            "max_us": us[-1],
            "check": check,
        },
        sys.stdout,
    )
    sys.stdout.write("\n")


# --------------------------------------------------------------------------------------------
# Parent side: environment, one subprocess per case, table, JSON, plot.
# --------------------------------------------------------------------------------------------


def _version(dist):
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment():
    date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    try:
        import rivet._native as native  # the extension only, no framework imports

        so = native.__file__
        so_mtime = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(os.path.getmtime(so)))
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        so, so_mtime = f"unavailable ({e})", None
    commit = subprocess.run(
        ["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "date_utc": date,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "tvm_ffi": _version("apache-tvm-ffi"),
        "tvm": _version("apache-tvm"),
        "rivet": _version("rivet"),
        "rivet_extension": so,
        "rivet_extension_mtime": so_mtime,
        "git_commit": commit or None,
        "loadavg_at_start": list(os.getloadavg()),
        "child_env": CHILD_ENV,
    }


def run_case(key, number, repeat, timeout):
    env = dict(os.environ, **CHILD_ENV)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", key,
           "--number", str(number), "--repeat", str(repeat)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"case": key, "error": f"timed out after {timeout} s"}
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return {"case": key, "error": f"exit {p.returncode}: {tail}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def table(results):
    ref = results.get(REFERENCE, {}).get("median_us")
    rows = []
    width = max(len(l) for l in LABELS.values())
    rows.append(f"{'case':<{width}}  {'median us':>9}  {'min':>6}  {'max':>6}  {'ratio':>6}  {'N':>7}")
    for key, label, _ in CASES:
        r = results.get(key)
        if r is None:
            continue
        if "error" in r or "skipped" in r:
            rows.append(f"{label:<{width}}  {r.get('skipped') or r.get('error')}")
            continue
        ratio = f"{r['median_us'] / ref:6.2f}" if ref else "     -"
        rows.append(
            f"{label:<{width}}  {r['median_us']:9.3f}  {r['min_us']:6.3f}  {r['max_us']:6.3f}  "
            f"{ratio}  {r['number']:>7}"
        )
    if ref:
        rows.append(f"ratio = median / median of '{LABELS[REFERENCE]}' ({ref:.3f} us)")
    return "\n".join(rows)


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    keys = [k for k, _, _ in CASES if "median_us" in results.get(k, {})]
    med = [results[k]["median_us"] for k in keys]
    lo = [results[k]["median_us"] - results[k]["min_us"] for k in keys]
    hi = [results[k]["max_us"] - results[k]["median_us"] for k in keys]
    colors = ["tab:orange" if k.startswith("rivet") else
              "tab:blue" if k.startswith("tvmffi") else "tab:gray" for k in keys]
    fig, ax = plt.subplots(figsize=(8, 4.6), dpi=90)
    ypos = range(len(keys))[::-1]
    ax.barh(list(ypos), med, xerr=[lo, hi], color=colors, capsize=3, height=0.65,
            error_kw={"elinewidth": 1})
    ax.set_yticks(list(ypos), [LABELS[k] for k in keys], fontsize=8)
    for y, k in zip(ypos, keys):
        ax.text(results[k]["max_us"] * 1.08, y, f"{results[k]['median_us']:.2f}", va="center", fontsize=7)
    ref = results.get(REFERENCE, {}).get("median_us")
    if ref:
        ax.axvline(ref, color="tab:blue", ls="--", lw=1,
                   label=f"tvm-ffi nop, 3 torch tensors: {ref:.2f} us")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xscale("log")
    ax.set_xlim(min(r["min_us"] for r in (results[k] for k in keys)) * 0.5,
                max(r["max_us"] for r in (results[k] for k in keys)) * 2.5)
    ax.set_xlabel("microseconds per call (log scale; bar = median, whiskers = min-max)")
    env = report["environment"]
    ax.set_title(f"Python call overhead, 4-element float32, 1 thread\n"
                 f"{env['cpu_model']}, {env['date_utc']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", metavar="CASE", help=argparse.SUPPRESS)
    ap.add_argument("--number", type=int, default=200_000, help="calls per repeat (N)")
    ap.add_argument("--repeat", type=int, default=9, help="repeats (R)")
    ap.add_argument("--cases", help="comma-separated subset of: " + ", ".join(k for k, _, _ in CASES))
    ap.add_argument("--json", default=DEFAULT_JSON, help="where to write the results")
    ap.add_argument("--png", default=DEFAULT_PNG, help="where to write the plot ('' for none)")
    ap.add_argument("--plot-only", metavar="JSON", help="re-plot an earlier results file")
    ap.add_argument("--timeout", type=float, default=120, help="per-case limit in seconds")
    a = ap.parse_args()

    if a.worker:
        worker(a.worker, a.number, a.repeat)
        return
    if a.plot_only:
        with open(a.plot_only) as f:
            report = json.load(f)
        print(table(report["results"]))
        plot(report, a.png)
        print(f"wrote {a.png}")
        return

    env = environment()
    print(f"# Python call overhead of packed functions ({env['date_utc']})")
    print(f"# CPU: {env['cpu_model']} ({env['cpu_count']} logical CPUs)")
    print(f"# python {env['python']}, torch {env['torch']}, numpy {env['numpy']}, "
          f"jax {env['jax']}, tvm-ffi {env['tvm_ffi'] or 'not installed'}, rivet {env['rivet']}")
    print(f"# rivet extension built {env['rivet_extension_mtime']}, git {env['git_commit']}, "
          f"load average {' '.join(f'{x:.2f}' for x in env['loadavg_at_start'])}")
    print(f"# each case in its own process, {' '.join(f'{k}={v}' for k, v in CHILD_ENV.items() if k.endswith('THREADS'))}; "
          f"N={a.number} calls x R={a.repeat} repeats", flush=True)

    def importable(mod):
        return subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True,
                              env=dict(os.environ, **CHILD_ENV)).returncode == 0

    have = {"tvm_ffi": importable("tvm_ffi"), "tvm": importable("tvm")}
    wanted = a.cases.split(",") if a.cases else [k for k, _, _ in CASES]
    unknown = set(wanted) - set(LABELS)
    if unknown:
        ap.error(f"unknown cases: {', '.join(sorted(unknown))}")

    results = {}
    t_start = time.perf_counter()
    for key, label, needs in CASES:
        if key not in wanted:
            continue
        if needs in have and not have[needs]:
            results[key] = {"case": key, "skipped": "not installed"}
        else:
            results[key] = run_case(key, a.number, a.repeat, a.timeout)
        r = results[key]
        status = (f"{r['median_us']:.3f} us (min {r['min_us']:.3f}, max {r['max_us']:.3f})"
                  if "median_us" in r else r.get("skipped") or r.get("error"))
        print(f"  {label:<42} {status}", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t_start

    print()
    print(table(results))
    print(f"\n# {elapsed:.0f} s in all")

    env["loadavg_at_end"] = list(os.getloadavg())
    so = env["rivet_extension"]
    if os.path.exists(so) and time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(os.path.getmtime(so))) != env["rivet_extension_mtime"]:
        env["warning"] = "the rivet extension was rebuilt during the run"
        print("# WARNING: the rivet extension was rebuilt during the run", file=sys.stderr)
    print(f"# load average (1, 5, 15 min) at start {env['loadavg_at_start']}, at end {env['loadavg_at_end']}")
    report = {
        "environment": env,
        "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
        "number": a.number,
        "repeat": a.repeat,
        "reference_case": REFERENCE,
        "elapsed_s": elapsed,
        "results": results,
    }
    ref = results.get(REFERENCE, {}).get("median_us")
    for r in results.values():
        if ref and "median_us" in r:
            r["ratio_to_reference"] = r["median_us"] / ref
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {a.json}")
    if a.png:
        plot(report, a.png)
        print(f"wrote {a.png}")
    if any("error" in r for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
