"""The CUDA backend against the interpreter, kernel by kernel.

Two halves:

* ``gpu``-marked (skipped without a GPU rivet can launch on; see conftest.cuda_usable): every
  ``rivet.kernels`` kernel built with ``target="cuda"`` and programs with explicit GPU
  schedules, run on torch CUDA tensors (outputs passed explicitly, poisoned first; inputs
  compact, or strided views with a byte offset) on fresh random data at tile-aligned and
  ragged sizes (1, 7, 56, 1000, 1023), compared with the SAME program -- the same definition
  and GPU schedule -- built for ``target="interp"`` on the same data, under the tolerance
  policy (docs/tolerance.md, conftest.assert_matches with backend="cuda": bit-exact except
  transcendental and composite results, CUDA_ULPS, provisional until measured on a device).
  None of these has run on a GPU yet.
* runs here: every one of those kernels, and the explicit schedules, compiled by NVRTC to PTX
  for sm_80 and sm_90 from Python (``get_source("ptx")``; the library's kernels, which are
  functions without a module, through the ``.ptx`` files ``RIVET_DUMP`` writes, in a fresh
  process per architecture so no in-process kernel cache hides a build).

The interpreter is slow (about a million scalar operations a second), so a case varies one
dimension over SIZES and keeps the others small: every size stays affordable on the oracle's
side while the GPU still sees grids with full and partial blocks in every bound dimension.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import rivet
from rivet import te

NVRTC_REQUIRED = os.environ.get("RIVET_REQUIRE_NVRTC") == "1"
SIZES = [1, 7, 56, 1000, 1023]
ARCHS = ["sm_80", "sm_90"]


# ---- the kernel library: one case per (kernel, dtype, shape pattern) -------------------------
#
# name, kwargs of rivet.kernels.<name>, dtype, shapes(s) -> (input shapes, output shape),
# op class for the tolerance policy.
class Case:
    def __init__(self, id, name, dtype, shapes, op, **kwargs):
        self.id, self.name, self.dtype, self.shapes, self.op, self.kwargs = id, name, dtype, shapes, op, kwargs

    def build(self, target, schedule=None):
        return getattr(rivet.kernels, self.name)(self.dtype, target=target, schedule=schedule, **self.kwargs)


CASES = [
    Case("matmul-rows", "matmul", "float32", lambda s: ([(s, 5), (5, 3)], (s, 3)), "contraction"),
    Case("matmul-k", "matmul", "float32", lambda s: ([(3, s), (s, 4)], (3, 4)), "contraction"),
    Case("matmul-f64", "matmul", "float64", lambda s: ([(2, 3), (3, s)], (2, s)), "contraction"),
    Case("batch_matmul", "batch_matmul", "float32", lambda s: ([(2, s, 3), (2, 3, 4)], (2, s, 4)), "contraction"),
    Case("add-broadcast", "add", "float32", lambda s: ([(s, 1), (1, 5)], (s, 5)), "exact", a_shape=("n", 1), b_shape=(1, "m")),
    Case("add-f16", "add", "float16", lambda s: ([(s,), (s,)], (s,)), "exact", a_shape=("n",), b_shape=("n",)),
    Case("add-i32", "add", "int32", lambda s: ([(3, s), (3, s)], (3, s)), "exact", a_shape=("m", "n"), b_shape=("m", "n")),
    Case("mul-bf16", "mul", "bfloat16", lambda s: ([(s,), (s,)], (s,)), "exact", a_shape=("n",), b_shape=("n",)),
    Case("relu", "relu", "float32", lambda s: ([(s, 3)], (s, 3)), "exact", ndim=2),
    Case("gelu", "gelu", "float32", lambda s: ([(s, 3)], (s, 3)), "composite", ndim=2),
    Case("gelu-f64", "gelu", "float64", lambda s: ([(2, s)], (2, s)), "composite", ndim=2),
    Case("softmax-row", "softmax", "float32", lambda s: ([(3, s)], (3, s)), "composite", ndim=2, axis=-1),
    Case("softmax-rows", "softmax", "float32", lambda s: ([(s, 4)], (s, 4)), "composite", ndim=2, axis=-1),
    Case("softmax-axis0-f64", "softmax", "float64", lambda s: ([(s, 2)], (s, 2)), "composite", ndim=2, axis=0),
    Case("layer_norm", "layer_norm", "float32", lambda s: ([(3, s), (s,), (s,)], (3, s)), "composite", ndim=2),
    Case("layer_norm-rows", "layer_norm", "float32", lambda s: ([(s, 6), (6,), (6,)], (s, 6)), "composite", ndim=2),
    Case("sum", "sum", "float32", lambda s: ([(3, s)], (3,)), "reduction", ndim=2, axis=1),
    Case("sum-i32", "sum", "int32", lambda s: ([(s, 3)], (s,)), "exact", ndim=2, axis=1),
    Case("max-axis0", "max", "float32", lambda s: ([(s, 3)], (3,)), "exact", ndim=2, axis=0),
    Case("transpose", "transpose", "float32", lambda s: ([(s, 3)], (3, s)), "exact", perm=(1, 0)),
    Case("transpose-3d-f16", "transpose", "float16", lambda s: ([(s, 2, 3)], (3, s, 2)), "exact", perm=(2, 0, 1)),
]

# Every kernel of the library has at least one case (a new kernel must add one).
assert {c.name for c in CASES} == set(rivet.kernels.__all__), set(rivet.kernels.__all__) - {c.name for c in CASES}


# Composite kernels whose result amplifies the math library's error by cancellation get a bound
# derived for the inputs drawn here (|x| in [0.5, 1.5]); docs/tolerance.md, "CUDA" (provisional,
# unmeasured). Others use conftest.CUDA_ULPS through assert_matches.
#  gelu = 0.5 x (1 + erf(x / sqrt 2)): only erf differs (<= 2 ulp CUDA + 1 musl = 3 ulp of
#    erf, relative <= 3 * 2^-23 * |erf|), and 1 + erf cancels for negative x: relative error of
#    the result <= 3 * 2^-23 * |e| / (1 + e), e = erf(x / sqrt 2) >= erf(-1.5 / sqrt 2) = -0.866,
#    so <= 3 * 6.5 * 2^-23 = 39 ulp of the result at worst, + 2 for roundings that may flip: 48.
#  softmax = exp(x - max) / sum exp(x - max): each exp <= 3 ulp apart (<= 6 * 2^-24 relative),
#    the sum of positive terms the same relative bound, the quotient both: 12 ulp, + 2: 16.
COMPOSITE_ULPS = {"gelu": 48, "softmax": 16}


# ---- data ----------------------------------------------------------------------------------

def torch_dtype(name):
    import torch

    return getattr(torch, name)


def fresh(rng, shape, dtype):
    """Fresh random data (never zero) as a CPU torch tensor of `dtype`."""
    import torch

    if dtype.startswith("int"):
        v = rng.integers(-1000, 1000, size=shape)
        v[v == 0] = 1
        return torch.from_numpy(v.astype(dtype))
    mag = rng.uniform(0.5, 1.5, size=shape)
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return torch.from_numpy(mag * sign).to(torch_dtype(dtype))


def on_device(t, layout):
    """`t` on the GPU: compact, or a strided view with a byte offset into a larger buffer
    (first dim offset by one, last dim every other element)."""
    import torch

    if layout == "compact" or t.dim() == 0:
        return t.cuda()
    shape = list(t.shape)
    big = [d + 1 for d in shape[:1]] + shape[1:-1] + [2 * shape[-1] + 1] if t.dim() > 1 else [2 * shape[0] + 1]
    base = torch.empty(big, dtype=t.dtype, device="cuda")
    if t.dim() > 1:
        idx = (slice(1, None),) + (slice(None),) * (t.dim() - 2) + (slice(1, None, 2),)
    else:
        idx = (slice(1, None, 2),)
    view = base[idx]
    # Offset always; non-compact strides wherever a dim has more than one element.
    assert tuple(view.shape) == tuple(shape) and view.storage_offset() > 0
    view.copy_(t.cuda())
    return view


def run_pair(h, f_cuda, f_interp, inputs, out_shape, dtype, layout):
    """Runs the CUDA function on device copies of `inputs` (as `layout`) and the interpreter's
    on the CPU tensors; both outputs poisoned first. Returns (cuda result on the CPU, oracle's)."""
    import torch

    dev_in = [on_device(t, layout) for t in inputs]
    before = [t.cpu().clone() for t in dev_in]
    out = torch.empty(out_shape, dtype=torch_dtype(dtype), device="cuda")
    h.poison(out)
    f_cuda(*dev_in, out)
    torch.cuda.synchronize()
    want = torch.empty(out_shape, dtype=torch_dtype(dtype))
    h.poison(want)
    f_interp(*inputs, want)
    for b, t in zip(before, dev_in):
        assert torch.equal(b, t.cpu()), "an input was written"
    return out.cpu(), want


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["compact", "strided"])
@pytest.mark.parametrize("s", SIZES)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_library_kernel_on_the_gpu_matches_the_interpreter(rng, h, case, s, layout):
    f_cuda = rivet.to_pytorch_func(case.build("cuda"))
    # The same definition and the same GPU schedule, run by the interpreter with GPU semantics.
    f_interp = rivet.to_pytorch_func(case.build("interp", schedule="gpu"))
    in_shapes, out_shape = case.shapes(s)
    inputs = [fresh(rng, sh, case.dtype) for sh in in_shapes]
    got, want = run_pair(h, f_cuda, f_interp, inputs, out_shape, case.dtype, layout)
    h.assert_matches(
        got,
        want,
        op=case.op,
        against="interp",
        backend="cuda",
        ulps=COMPOSITE_ULPS.get(case.name),
        err_msg=f"{case.id} s={s} {layout}",
    )


# ---- programs with explicit GPU schedules --------------------------------------------------


def prog_exp_1d(threads):
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    # exp(a) * 2 + b * b: a sum of positives, so the exp's few ulps are not amplified by
    # cancellation (CUDA_ULPS holds: 3 ulp of the larger term + 1 rounding).
    C = te.compute((n,), lambda i: te.exp(A[i]) * 2.0 + B[i] * B[i], name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=threads)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    return s, [A, B, C], "transcendental", lambda s_: ([(s_,), (s_,)], (s_,)), "float32"


def prog_fused_2d():
    m, n = te.var("m"), te.var("n")
    A = te.placeholder((m, n), "float64", name="A")
    C = te.compute((m, n), lambda i, j: te.floor(A[i, j] * 3.0) - A[i, j], name="C")
    s = rivet.create_schedule(C)
    fused = s[C].fuse(*C.op.axis)
    bx, tx = s[C].split(fused, factor=128)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    return s, [A, C], "exact", lambda s_: ([(s_, 5)], (s_, 5)), "float64"


def prog_tiled_matmul():
    m, k_, n = te.var("m"), te.var("k"), te.var("n")
    A = te.placeholder((m, k_), "float32", name="A")
    B = te.placeholder((k_, n), "float32", name="B")
    k = te.reduce_axis((0, k_), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = rivet.create_schedule(C)
    i, j = C.op.axis
    io, ii = s[C].split(i, factor=16)
    jo, ji = s[C].split(j, factor=8)
    s[C].reorder(io, jo, ii, ji, k)
    s[C].bind(io, "blockIdx.y")
    s[C].bind(jo, "blockIdx.x")
    s[C].bind(ii, "threadIdx.y")
    s[C].bind(ji, "threadIdx.x")
    return s, [A, B, C], "contraction", lambda s_: ([(s_, 7), (7, 9)], (s_, 9)), "float32"


def prog_two_stages():
    n = te.var("n")
    X = te.placeholder((n, 16), "float32", name="X")
    Sq = te.compute((n, 16), lambda i, j: X[i, j] * X[i, j], name="Sq")
    k = te.reduce_axis((0, 16), name="k")
    R = te.compute((n,), lambda i: te.sum(Sq[i, k], axis=k), name="R")
    Y = te.compute((n,), lambda i: te.tanh(R[i]) + 1.0, name="Y")
    s = rivet.create_schedule(Y)
    s[Sq].compute_inline()
    for t in (R, Y):
        bx, tx = s[t].split(t.op.axis[0], factor=32)
        s[t].bind(bx, "blockIdx.x")
        s[t].bind(tx, "threadIdx.x")
    return s, [X, Y], "transcendental", lambda s_: ([(s_, 16)], (s_,)), "float32"


PROGRAMS = {
    "exp-1d-64": lambda: prog_exp_1d(64),
    "exp-1d-256": lambda: prog_exp_1d(256),
    "fused-2d-f64": prog_fused_2d,
    "tiled-matmul": prog_tiled_matmul,
    "two-stages-inlined": prog_two_stages,
}


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["compact", "strided"])
@pytest.mark.parametrize("s", SIZES)
@pytest.mark.parametrize("prog", sorted(PROGRAMS))
def test_scheduled_program_on_the_gpu_matches_the_interpreter(rng, h, prog, s, layout):
    sched, args, op, shapes, dtype = PROGRAMS[prog]()
    f_cuda = rivet.to_pytorch_func(rivet.build(sched, args, target="cuda", name="f")["f"])
    f_interp = rivet.to_pytorch_func(rivet.build(sched, args, target="interp", name="f")["f"])
    in_shapes, out_shape = shapes(s)
    inputs = [fresh(rng, sh, dtype) for sh in in_shapes]
    got, want = run_pair(h, f_cuda, f_interp, inputs, out_shape, dtype, layout)
    h.assert_matches(got, want, op=op, against="interp", backend="cuda", err_msg=f"{prog} s={s} {layout}")


# ---- runs here: NVRTC compiles every one of them for sm_80 and sm_90 -------------------------


def nvrtc_or_skip():
    sched, args, *_ = prog_fused_2d()
    try:
        rivet.build(sched, args, target="cuda -arch=sm_80", name="probe").get_source("ptx")
    except rivet.CompileError as e:
        assert not NVRTC_REQUIRED, f"NVRTC required but not found: {e}"
        pytest.skip(f"NVRTC not found: {e}")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prog", sorted(PROGRAMS))
def test_scheduled_program_compiles_to_ptx(prog, arch):
    nvrtc_or_skip()
    sched, args, *_ = PROGRAMS[prog]()
    m = rivet.build(sched, args, target=f"cuda -arch={arch}", name="f")
    ptx = m.get_source("ptx")
    assert f".target {arch}" in ptx
    entries = re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", m.get_source("cuda"))
    assert entries
    for e in entries:
        assert f".entry {e}(" in ptx, ptx[:2000]
    # Each kernel has a 32-bit-index entry point (`_i32`), a 64-bit one, or both
    # (docs/cuda.md, "Index widths").
    kernels = {re.sub(r"_i32$", "", e) for e in entries}
    assert kernels == {f"f_kernel{i}" for i in range(len(kernels))}, entries


CHILD = r"""
import json, os, sys
import rivet
arch, out, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for cid, name, dtype, kwargs in cases:
    # RIVET_DUMP is read at every build: one folder per case, so same-named kernels
    # (add float32 / add float16) do not overwrite each other's files.
    os.environ["RIVET_DUMP"] = os.path.join(out, cid)
    getattr(rivet.kernels, name)(dtype, target="cuda -arch=" + arch, **kwargs)
print("built", len(cases))
"""


@pytest.fixture(scope="module", params=ARCHS)
def library_ptx(request, tmp_path_factory):
    """{case id: (CUDA C, PTX)} of every library case built for the arch in a fresh process."""
    nvrtc_or_skip()
    arch = request.param
    out = tmp_path_factory.mktemp("ptx-" + arch)
    # Cases that differ only in the shapes they are run at are one kernel: build it once
    # (a second build would come from the in-process kernel cache and dump nothing).
    first = {}
    for c in CASES:
        kw = {k: list(v) if isinstance(v, tuple) else v for k, v in c.kwargs.items()}
        first.setdefault(json.dumps([c.name, c.dtype, kw], sort_keys=True), (c.id, c.name, c.dtype, kw))
    env = dict(os.environ, RIVET_REQUIRE_NVRTC="1")
    r = subprocess.run(
        [sys.executable, "-c", CHILD, arch, str(out), json.dumps(list(first.values()))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    got = {}
    for c in CASES:
        kw = {k: list(v) if isinstance(v, tuple) else v for k, v in c.kwargs.items()}
        d = out / first[json.dumps([c.name, c.dtype, kw], sort_keys=True)][0]
        cu = sorted(d.glob("*.06.cu"))
        ptx = sorted(d.glob("*.06.ptx"))
        assert len(cu) == 1 and len(ptx) == 1, (c.id, sorted(p.name for p in d.iterdir()))
        got[c.id] = (cu[0].read_text(), ptx[0].read_text())
    return arch, got


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_library_kernel_compiles_to_ptx(library_ptx, case):
    arch, got = library_ptx
    cu, ptx = got[case.id]
    assert f".target {arch}" in ptx
    n_kernels = cu.count("__global__")
    assert n_kernels >= 1
    assert ptx.count(".entry ") == n_kernels, ptx[:2000]
    assert f"(target {arch})" in cu
