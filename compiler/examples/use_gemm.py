"""The user's workflow, Python half: load the module that gemm_module.rs saved, wrap its
function with rivet.to_pytorch_func, and verify it against torch.mm on fresh random data.

Run: python compiler/examples/use_gemm.py gemm.rivet
"""
import sys

import torch

import rivet

path = sys.argv[1] if len(sys.argv) > 1 else "gemm.rivet"
mod = rivet.load_module(path)          # re-verified, re-proven in bounds, JIT-compiled again
mm = rivet.to_pytorch_func(mod["mm"])
print("loaded", path, "->", mod["mm"])

gen = torch.Generator().manual_seed(0)
for n in (1, 7, 56, 200):
    x = torch.rand(n, n, generator=gen)
    y = torch.rand(n, n, generator=gen)
    z = torch.full((n, n), float("nan"))   # poisoned: every element must be written
    mm(x, y, z)                            # in place, into z's own memory
    torch.testing.assert_close(z, x @ y, rtol=1e-5, atol=1e-5)
    # Inputs only: rivet allocates the output and hands it back as a torch tensor.
    w = mm(x, y)
    assert isinstance(w, torch.Tensor)
    torch.testing.assert_close(w, x @ y, rtol=1e-5, atol=1e-5)
    print(f"  n={n:<4} matches torch.mm (in place and allocated)")

# A transposed view and a strided output work in place, without copies.
x = torch.rand(56, 56, generator=gen).t()
y = torch.rand(56, 56, generator=gen)
base = torch.zeros(56, 112)
z = base[:, ::2]
mm(x, y, z)
torch.testing.assert_close(z, x @ y, rtol=1e-5, atol=1e-5)
assert torch.all(base[:, 1::2] == 0), "gaps of the strided output were written"
print("  transposed input, strided output: OK")
print("use_gemm: all checks passed")
