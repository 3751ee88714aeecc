#!/usr/bin/env python
"""The torch case of frameworks_bench.py under inductor's C++ wrapper (`cpp_wrapper=True`):
the compiled function calls the rivet op (native path) without Python. Prints the compiled
call with the rivet op and with inductor's own `a * b + 1` (min of 5 x 5000 calls, us).

    OMP_NUM_THREADS=1 .venv/bin/python benches/frameworks_cpp_wrapper.py
"""
import torch, timeit, sys
sys.path.insert(0, "benches")
import frameworks_bench as fb
torch.set_num_threads(1)
import rivet.torch
import torch._inductor.config as cfg
cfg.cpp_wrapper = True
a=torch.rand(4,4); b=torch.rand(4,4)
op = rivet.torch.custom_op(fb.kernel(), "bench::cw", native=True)
g = torch.compile(lambda x, y: op(x, y), fullgraph=True)
h = torch.compile(lambda x, y: x * y + 1, fullgraph=True)
torch.testing.assert_close(g(a,b), a*b+1); h(a,b)
t=lambda f: min(timeit.repeat(f, number=5000, repeat=5))/5000*1e6
print("cpp_wrapper op", t(lambda: g(a,b)), "inductor", t(lambda: h(a,b)))
