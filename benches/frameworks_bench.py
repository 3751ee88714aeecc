#!/usr/bin/env python
"""rivet inside the frameworks' compilers (its targets): the cost of a rivet op on small
arrays inside `jax.jit` over an empty jitted function, and inside a `torch.compile`d function
against the same op called eagerly through `to_pytorch_func`.

Every case runs in its own subprocess (``--worker CASE``) with one thread for every library
(benches/README.md): build, check the result once against the framework's own maths, warm
up, then ``timeit.repeat`` (median, min, max in microseconds per call).

    .venv/bin/python benches/frameworks_bench.py            # all cases, about a minute
    .venv/bin/python benches/frameworks_bench.py --interleaved   # the torch target, side by side

`--interleaved` runs the six cases of the torch target (torch_eager_alloc, torch_compiled,
torch_compiled_dispatcher, torch_native_compiled, torch_compiled_alloc, torch_compiled_empty)
in one process, one thread, timing each in turn
for `--rounds` rounds (`--number` calls per timing), and reports per-round differences: the
op's share of the compiled call (compiled with the op minus each floor: inductor's own op,
a compiled function returning a fresh tensor, the empty compiled function) less the eager
call of the same round. One process and alternation
keep the machine's drift (frequency, other tenants) out of the differences, which separate
processes measured minutes apart do not.

Cases (float32, 4 x 4 inputs; the kernel is C = A * B + 1, elementwise):
  jax_empty     jax.jit(lambda a, b: a) called on two arrays (the dispatch floor)
  jax_rivet     jax.jit(rivet.jax.ffi_func(f)) on two arrays (one XLA custom call)
  jax_native    jax.jit(lambda a, b: a * b + 1) (what XLA makes of the same maths)
  torch_eager   rivet.to_pytorch_func(f)(a, b, c): the eager wrapper, output given
  torch_eager_alloc  the same, output allocated by rivet and returned
  torch_op      rivet.torch.custom_op(f) called eagerly (torch's dispatcher, output allocated;
                the native path: C++ kernels)
  torch_op_python   the same op on the Python path (custom_op(..., native=False))
  torch_compiled    torch.compile(fullgraph=True) of a function calling that op (native path;
                the generated code calls the C++ kernel directly, docs/torch.md)
  torch_compiled_dispatcher  the same with the generated code calling the op's OpOverload
                (torch's dispatcher, as before 2026-11-28): rivet's inductor hook removed
  torch_compiled_python  the same on the Python path
  torch_compiled_empty   torch.compile of lambda a, b: a (the per-call floor of a compiled function)
  torch_compiled_alloc   torch.compile of lambda a, b: torch.empty_like(a) (the floor of a
                compiled function that returns a fresh tensor, as the op's does)
  torch_native_compiled torch.compile of a * b + 1 (what inductor makes of the same maths)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import timeit

CHILD_ENV = {
    "OMP_NUM_THREADS": "1",
    "RIVET_NUM_THREADS": "1",
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}
CASES = ["jax_empty", "jax_rivet", "jax_native", "torch_eager", "torch_eager_alloc", "torch_op",
         "torch_op_python", "torch_compiled", "torch_compiled_dispatcher", "torch_compiled_python",
         "torch_compiled_empty",
         "torch_compiled_alloc", "torch_native_compiled"]


def kernel():
    import rivet
    from rivet import te

    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n, m), "float32", name="A")
    B = te.placeholder((n, m), "float32", name="B")
    C = te.compute((n, m), lambda i, j: A[i, j] * B[i, j] + 1.0, name="C")
    return rivet.build(rivet.create_schedule(C), [A, B, C], name="f")["f"]


def build_case(key):
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = (rng.random((4, 4), dtype=np.float32) for _ in range(2))
    want = a * b + 1
    if key.startswith("jax"):
        import jax
        import rivet.jax

        ja, jb = jax.numpy.asarray(a), jax.numpy.asarray(b)
        f = {
            "jax_empty": jax.jit(lambda x, y: x),
            "jax_rivet": jax.jit(rivet.jax.ffi_func(kernel())),
            "jax_native": jax.jit(lambda x, y: x * y + 1),
        }[key]
        out = np.asarray(f(ja, jb))
        if key != "jax_empty":
            np.testing.assert_allclose(out, want, rtol=1e-6)
        return lambda: f(ja, jb).block_until_ready()
    import torch

    torch.set_num_threads(1)
    ta, tb, tc = torch.from_numpy(a), torch.from_numpy(b), torch.empty(4, 4)
    if key in ("torch_eager", "torch_eager_alloc"):
        import rivet

        f = rivet.to_pytorch_func(kernel())
        if key == "torch_eager":
            f(ta, tb, tc)
            np.testing.assert_allclose(tc.numpy(), want, rtol=1e-6)
            return lambda: f(ta, tb, tc)
        np.testing.assert_allclose(f(ta, tb).numpy(), want, rtol=1e-6)
        return lambda: f(ta, tb)
    if key == "torch_native_compiled":
        g = torch.compile(lambda x, y: x * y + 1, fullgraph=True)
    elif key in ("torch_compiled_empty", "torch_compiled_alloc"):
        if key == "torch_compiled_empty":
            g = torch.compile(lambda x, y: x, fullgraph=True)
        else:
            g = torch.compile(lambda x, y: torch.empty_like(x), fullgraph=True)
        g(ta, tb)
        return lambda: g(ta, tb)
    else:
        import rivet.torch

        native = not key.endswith("_python")
        name = "bench::mul_add_dispatcher" if key.endswith("_dispatcher") else "bench::mul_add"
        op = rivet.torch.custom_op(kernel(), name, native=native)
        if key.endswith("_dispatcher"):
            from torch._inductor.codegen.custom_extern_kernel_codegen import (
                CUSTOM_EXTERN_KERNEL_CODEGEN,
            )

            del CUSTOM_EXTERN_KERNEL_CODEGEN["torch.ops.bench.mul_add_dispatcher.default"]
        if key.startswith("torch_op"):
            g = op
        else:
            g = torch.compile(lambda x, y: op(x, y), fullgraph=True)
    np.testing.assert_allclose(g(ta, tb).numpy(), want, rtol=1e-6)
    return lambda: g(ta, tb)


def worker(key, number, repeat):
    stmt = build_case(key)
    for _ in range(2000):
        stmt()
    times = [t / number * 1e6 for t in timeit.repeat(stmt, number=number, repeat=repeat)]
    print(json.dumps({"case": key, "median_us": statistics.median(times), "min_us": min(times),
                      "max_us": max(times), "number": number, "repeat": repeat}))


TORCH_TARGET = ["torch_eager_alloc", "torch_compiled", "torch_compiled_dispatcher",
                "torch_native_compiled",
                "torch_compiled_alloc", "torch_compiled_empty"]


def interleaved(number, rounds):
    """The torch target's cases alternately in this process (module doc)."""
    import torch

    torch.set_num_threads(1)
    stmts = {k: build_case(k) for k in TORCH_TARGET}
    for s in stmts.values():
        for _ in range(2000):
            s()
    per = {k: [] for k in TORCH_TARGET}
    for r in range(rounds):
        # Rotate the order so that no case always runs first (or after the same one).
        k0 = r % len(TORCH_TARGET)
        order = TORCH_TARGET[k0:] + TORCH_TARGET[:k0]
        for k in order:
            per[k].append(timeit.timeit(stmts[k], number=number) / number * 1e6)
    med = {k: statistics.median(v) for k, v in per.items()}
    for k in TORCH_TARGET:
        print(f"{k:24s} {med[k]:9.3f} us (min {min(per[k]):.3f}, max {max(per[k]):.3f})")
    out = {"cases": per, "number": number, "rounds": rounds}
    for case in ("torch_compiled", "torch_compiled_dispatcher"):
        for floor in ("torch_native_compiled", "torch_compiled_alloc", "torch_compiled_empty"):
            extra = [c - f - e for c, f, e in zip(per[case], per[floor], per["torch_eager_alloc"])]
            out[f"{case}_extra_over_{floor}"] = extra
            print(f"torch: {case} (against {floor}) minus the eager call: median "
                  f"{statistics.median(extra):+.3f} us per round (min {min(extra):+.3f}, max "
                  f"{max(extra):+.3f}; target <= +1 us)")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--interleaved", action="store_true")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--worker")
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "out", "frameworks.json"))
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.number, args.repeat)
    if args.interleaved:
        for k, v in CHILD_ENV.items():
            os.environ.setdefault(k, v)
        out = interleaved(args.number, args.rounds)
        path = os.path.join(os.path.dirname(args.json), "frameworks_interleaved.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
        return
    results = {}
    for key in CASES:
        env = dict(os.environ, **CHILD_ENV)
        p = subprocess.run([sys.executable, __file__, "--worker", key, "--number", str(args.number),
                            "--repeat", str(args.repeat)], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            print(f"{key}: FAILED\n{p.stderr[-2000:]}")
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        results[key] = r
        print(f"{key:24s} {r['median_us']:9.2f} us (min {r['min_us']:.2f}, max {r['max_us']:.2f})")
    if "jax_empty" in results and "jax_rivet" in results:
        d = results["jax_rivet"]["median_us"] - results["jax_empty"]["median_us"]
        print(f"jax: rivet op over an empty jitted function: {d:+.2f} us (target <= 2 us)")
    med = {k: r["median_us"] for k, r in results.items()}
    if {"torch_eager_alloc", "torch_compiled", "torch_compiled_empty", "torch_native_compiled"} <= set(med):
        eager = med["torch_eager_alloc"]
        for floor in ("torch_compiled_empty", "torch_native_compiled"):
            d = med["torch_compiled"] - med[floor]
            print(f"torch: the op inside torch.compile costs {d:.2f} us over {floor}; the eager "
                  f"to_pytorch_func call {eager:.2f} us: {d - eager:+.2f} us (target <= +1 us)")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
