"""The first CUDA benchmark, for a lent GPU (one command, CUDA events, median).

Cases, each against what a user would pick instead, measured side by side in this process:
  gemm N     rivet's default GPU schedule (a plain te matmul built for "cuda") vs torch.mm with
             TF32 off, f32, N = 1024 and 4096; TFLOP/s and the ratio (target >= 0.4x)
  add        elementwise add on 2^26 float32 vs torch.add; GB/s (bytes read + written) and the
             ratio (target >= 0.85x)
  call       Python wall time per call on three 1-element torch CUDA tensors vs torch.add
             (target <= 0.6x of torch.add's time)
Every case checks its result against torch first (float64 reference for GEMM, relative error
under 1e-4), on fresh random data, with a NaN-poisoned output. Prints a table last and writes
JSON to --json. Needs torch with CUDA and an installed rivet wheel; exits 2 without a GPU.

    python benches/gpu_bench.py [--json out.json] [--sizes 1024,4096] [--arch sm_90]
"""

import argparse
import json
import statistics
import sys
import time


def events_ms(torch, fn, warmup=5, reps=30):
    """Median milliseconds of fn() between CUDA events (after warm-up)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def wall_us(fn, number=2000, repeat=7):
    """Median microseconds per call of fn() on the host clock (launch-bound, no sync inside)."""
    import torch

    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t0) / number * 1e6)
    return statistics.median(per)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--sizes", default="1024,4096")
    ap.add_argument("--arch", default=None, help="e.g. sm_90 (default: what the device reports)")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark")
        return 2
    import rivet
    from rivet import te

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda:0")
    name = torch.cuda.get_device_name(0)
    major, minor = torch.cuda.get_device_capability(0)
    arch = args.arch or f"sm_{major}{minor}"
    target = f"cuda -arch={arch}"
    g = torch.Generator(device=dev).manual_seed(2026)
    rows = []

    # GEMM with no schedule at all: the default GPU schedule.
    m, k_, n = te.var("m"), te.var("k"), te.var("n")
    A = te.placeholder((m, k_), "float32", name="A")
    B = te.placeholder((k_, n), "float32", name="B")
    k = te.reduce_axis((0, k_), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    mm = rivet.build(rivet.create_schedule(C), [A, B, C], target=target, name="mm")["mm"]
    for size in [int(x) for x in args.sizes.split(",")]:
        a = torch.rand(size, size, device=dev, generator=g) - 0.5
        b = torch.rand(size, size, device=dev, generator=g) - 0.5
        c = torch.full((size, size), float("nan"), device=dev)
        mm(a, b, c)
        torch.cuda.synchronize()
        ref = (a.double() @ b.double())
        err = ((c.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-4, f"gemm {size}: relative error {err}"
        flop = 2.0 * size**3
        t_r = events_ms(torch, lambda: mm(a, b, c), reps=10 if size > 2048 else 30)
        t_t = events_ms(torch, lambda: torch.mm(a, b, out=c), reps=10 if size > 2048 else 30)
        rows.append((f"gemm f32 {size}", flop / t_r / 1e9, flop / t_t / 1e9, "TFLOP/s", t_t / t_r))

    # Elementwise add, default schedule.
    N = te.var("n")
    X = te.placeholder((N,), "float32", name="X")
    Y = te.placeholder((N,), "float32", name="Y")
    Z = te.compute((N,), lambda i: X[i] + Y[i], name="Z")
    add = rivet.build(rivet.create_schedule(Z), [X, Y, Z], target=target, name="add")["add"]
    size = 1 << 26
    x = torch.rand(size, device=dev, generator=g)
    y = torch.rand(size, device=dev, generator=g)
    z = torch.full((size,), float("nan"), device=dev)
    add(x, y, z)
    torch.cuda.synchronize()
    assert torch.equal(z, x + y), "add: wrong result"
    nbytes = 3 * 4 * size
    t_r = events_ms(torch, lambda: add(x, y, z))
    t_t = events_ms(torch, lambda: torch.add(x, y, out=z))
    rows.append(("add f32 2^26", nbytes / t_r / 1e9, nbytes / t_t / 1e9, "TB/s", t_t / t_r))

    # Python wall time per call on tiny tensors (what the call path costs).
    x1, y1, z1 = (torch.rand(1, device=dev, generator=g) for _ in range(3))
    add(x1, y1, z1)
    torch.cuda.synchronize()
    assert torch.equal(z1, x1 + y1)
    w_r = wall_us(lambda: add(x1, y1, z1))
    w_t = wall_us(lambda: torch.add(x1, y1, out=z1))
    rows.append(("call 3 x 1 elem", w_r, w_t, "us/call", w_r / w_t))

    print(f"\ndevice: {name} ({arch}); torch {torch.__version__}; rivet {getattr(rivet, '__version__', '?')}")
    print(f"{'case':<18} {'rivet':>10} {'torch':>10}  unit      ratio (rivet vs torch; call: time ratio)")
    for case, r, t, unit, ratio in rows:
        print(f"{case:<18} {r:>10.3f} {t:>10.3f}  {unit:<9} {ratio:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "arch": arch, "torch": torch.__version__,
                       "rows": [dict(zip(["case", "rivet", "torch", "unit", "ratio"], r)) for r in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
