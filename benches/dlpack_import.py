#!/usr/bin/env python
"""What importing a rivet tensor costs elsewhere (rivet as a DLPack exchange producer).

    PYTHONPATH=<dir with the rivet wheel installed> .venv/bin/python benches/dlpack_import.py LABEL

Times ``torch.from_dlpack(t)`` (torch 2.15 goes through ``__dlpack__``), ``tvm_ffi.from_dlpack(t)``
(reads ``rivet.Tensor.__dlpack_c_exchange_api__`` when the wheel has it) and
``t.__dlpack__(max_version=(1, 0))`` for a 16-element float32 tensor: best of 7 x 20,000,
microseconds per call. One process per wheel (both wheels are the module ``rivet``).
"""

import sys
import timeit

import torch
import tvm_ffi

import rivet

t = rivet.zeros((16,), "float32")
CASES = {
    "torch.from_dlpack(t)": lambda: torch.from_dlpack(t),
    "tvm_ffi.from_dlpack(t)": lambda: tvm_ffi.from_dlpack(t),
    "t.__dlpack__(max_version=(1, 0))": lambda: t.__dlpack__(max_version=(1, 0)),
}


def best(f, number=20000, repeat=7):
    return min(timeit.repeat(f, number=number, repeat=repeat)) / number * 1e6


label = sys.argv[1] if len(sys.argv) > 1 else rivet.__file__
print(label, "  ".join(f"{k} {best(f):.3f} us" for k, f in CASES.items()))
