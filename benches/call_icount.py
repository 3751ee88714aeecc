#!/usr/bin/env python
"""N calls of one case in a loop, for instruction counts under callgrind (abi3 or not).

    valgrind --tool=callgrind --callgrind-out-file=out.N python benches/call_icount.py CASE N

(instructions at N=201,000 - at N=1,000) / 200,000 is the instructions per call, startup and
set-up cancelled; unlike wall clock it does not move with the load of a shared machine.
CASE: nop_torch3, add_static (a compiled add, static (4,), 3 torch tensors), nop_numpy3,
nop_noargs.

Instrumenting torch's import takes most of a run (some 13 minutes here). With a third
argument `toggle`, run valgrind with `--instr-atstart=no`: the script turns instrumentation
on (`callgrind_control -i on PID`) just before the loop, so imports and set-up run natively
and the counts hold the loop and the interpreter's exit, which the N=1,000 run cancels (two
runs of nop_torch3 here: 4 minutes in all, 7,229 instructions per call):

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=out.N \
        python benches/call_icount.py CASE N toggle
"""

import os
import subprocess
import sys

import numpy as np

import rivet
from rivet import te

case, n = sys.argv[1], int(sys.argv[2])
nop = rivet.get_global_func("testing.nop")
if case == "nop_numpy3":
    f, args = nop, tuple(np.zeros(4, np.float32) for _ in range(3))
elif case == "nop_noargs":
    f, args = nop, ()
else:
    import torch

    if case == "nop_torch3":
        f, args = nop, (torch.rand(4), torch.rand(4), torch.rand(4))
    elif case == "add_static":
        A = te.placeholder((4,), name="A")
        B = te.placeholder((4,), name="B")
        C = te.compute((4,), lambda i: A[i] + B[i], name="C")
        f = rivet.build(rivet.create_schedule(C), [A, B, C], name="add")["add"]
        args = (torch.rand(4), torch.rand(4), torch.zeros(4))
    else:
        sys.exit(f"unknown case {case!r}")
f(*args)  # the first call's one-time work (plans, imports) outside the counts
if sys.argv[3:] == ["toggle"]:
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True,
                   stdout=subprocess.DEVNULL)
for _ in range(n):
    f(*args)
