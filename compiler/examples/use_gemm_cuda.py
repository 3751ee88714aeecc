"""The user's workflow for the GPU, Python half: load the module that gemm_cuda.rs saved and
run its GEMM on torch CUDA tensors, in place, checked against torch.mm (TF32 off).

Without a CUDA device (or without torch's CUDA build) it says so and does what can be done
here instead: calls the function once to show the DeviceError, reads the PTX NVRTC made for
it, then runs the same saved IR -- the GPU schedule, blocks and threads -- on rivet's IR
interpreter (which executes GPU schedules with CUDA's semantics) and checks it against numpy.

Run: python compiler/examples/use_gemm_cuda.py gemm_cuda.rivet
"""
import struct
import sys
import tempfile
import zlib

import numpy as np
import torch

import rivet

path = sys.argv[1] if len(sys.argv) > 1 else "gemm_cuda.rivet"
mod = rivet.load_module(path)  # re-verified, re-proven in bounds, compiled again (or from the disk cache)
print("loaded", path, "->", mod)

try:
    ptx = mod.get_source("ptx")
    target_line = next(l for l in ptx.splitlines() if l.startswith(".target"))
    ptx_note = "%d bytes of PTX (%s)" % (len(ptx), target_line)
except rivet.CompileError as e:  # NVRTC not found: the CUDA C is still there
    ptx_note = "no PTX (%s)" % e
print("  CUDA C: %d bytes; %s" % (len(mod.get_source("cuda")), ptx_note))


def contraction_bound(a, b, k):
    """|got - want| <= 2 (k + 1) u (|A| @ |B|): docs/tolerance.md, a contraction of k terms
    against a reference with its own order of operations (u = 2^-24, float32)."""
    return 2 * (k + 1) * 2.0**-24 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))


SIZES = [(1, 1, 1), (7, 7, 7), (56, 56, 56), (67, 45, 33), (1000, 1023, 1000)]

if torch.cuda.is_available():
    torch.backends.cuda.matmul.allow_tf32 = False  # torch.mm in IEEE float32, as rivet
    mm = rivet.to_pytorch_func(mod["mm"])
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m, k, n in SIZES:
        x = torch.rand(m, k, device="cuda", generator=gen) - 0.5
        y = torch.rand(k, n, device="cuda", generator=gen) - 0.5
        z = torch.full((m, n), float("nan"), device="cuda")  # poisoned: every element must be written
        mm(x, y, z)  # on torch's current stream, into z's own memory
        want = torch.mm(x, y)
        torch.cuda.synchronize()
        bound = contraction_bound(x.cpu().numpy(), y.cpu().numpy(), k)
        err = np.abs(z.cpu().numpy().astype(np.float64) - want.cpu().numpy())
        assert not np.isnan(err).any(), "unwritten outputs"
        assert (err <= bound).all(), "m=%d k=%d n=%d: error %g over the bound" % (m, k, n, (err - bound).max())
        print("  %4d x %4d @ %4d x %4d on %s: matches torch.mm" % (m, k, k, n, torch.cuda.get_device_name()))
    # A transposed view as input, in place, no copy.
    x = (torch.rand(56, 56, device="cuda", generator=gen) - 0.5).t()
    y = torch.rand(56, 56, device="cuda", generator=gen) - 0.5
    z = torch.full((56, 56), float("nan"), device="cuda")
    mm(x, y, z)
    torch.cuda.synchronize()
    assert (np.abs(z.cpu().numpy() - torch.mm(x, y).cpu().numpy()) <= contraction_bound(x.cpu().numpy(), y.cpu().numpy(), 56)).all()
    print("  transposed input view: OK")
    print("use_gemm_cuda: all checks passed on the GPU")
    sys.exit(0)

# ---- no CUDA device --------------------------------------------------------------------------
why = "torch has no CUDA device" if torch.version.cuda else "torch is a CPU-only build"
a = np.ones((2, 3), np.float32)
try:
    mod["mm"](a, np.ones((3, 2), np.float32), np.zeros((2, 2), np.float32))
    raise SystemExit("a CUDA function ran on CPU arrays")
except rivet.DeviceError as e:
    print("  calling it here: rivet.DeviceError:", e)

# The same IR on the interpreter: the saved file with its target rewritten from "cuda" to
# "interp" (format in docs/saved_modules.md: magic, version, length, CRC-32, JSON).
with open(path, "rb") as f:
    raw = f.read()
magic, version, length, crc = struct.unpack("<8sIQI", raw[:24])
payload = raw[24:]
assert magic == b"RIVETMOD" and length == len(payload) and zlib.crc32(payload) == crc
assert payload.count(b'"target":"cuda"') == 1, "expected one function built for 'cuda'"
payload = payload.replace(b'"target":"cuda"', b'"target":"interp"')
with tempfile.NamedTemporaryFile(suffix=".rivet") as tmp:
    tmp.write(struct.pack("<8sIQI", magic, version, len(payload), zlib.crc32(payload)) + payload)
    tmp.flush()
    interp = rivet.load_module(tmp.name)
assert interp.get_source("ir") == mod.get_source("ir"), "not the same IR"
assert "blockIdx.x" in interp.get_source("ir") and "threadIdx.y" in interp.get_source("ir")

rng = np.random.default_rng(0)
checked = []
for m, k, n in SIZES[:4]:  # the interpreter is slow: small and ragged sizes only
    x = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    y = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    z = np.full((m, n), np.nan, np.float32)
    interp["mm"](x, y, z)
    want = x.astype(np.float64) @ y.astype(np.float64)
    assert (np.abs(z - want) <= contraction_bound(x, y, k) / 2).all(), (m, k, n)  # c = 1: float64 reference
    checked.append("%dx%dx%d" % (m, k, n))
print(
    "no CUDA device (%s): built the GEMM for 'cuda' (%s), ran the same module's IR -- %s of blocks and "
    "threads -- on the interpreter at m x k x n = %s and checked it against numpy"
    % (why, ptx_note, "the GPU schedule", ", ".join(checked))
)
print("use_gemm_cuda: all checks passed (nothing ran on a GPU)")
