"""The CUDA backend on a machine without a GPU: GPU-scheduled programs and the kernel library
build for ``target="cuda"``, their CUDA C and (with NVRTC, which the torch wheel ships) PTX
for the asked architecture are readable through ``get_source``, and calling them raises a
``DeviceError`` that says why, never a crash. What runs on a GPU is in docs/cuda.md; the
GPU semantics of the same schedules are checked by the interpreter (test_gpu_schedule.py)."""

import os

import numpy as np
import pytest

import rivet
from rivet import te

NVRTC_REQUIRED = os.environ.get("RIVET_REQUIRE_NVRTC") == "1"


def bound_double(factor=256):
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] * 2.0, name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=factor)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    return s, [A, C]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_a_bound_program_builds_to_cuda_c_and_ptx(arch):
    s, args = bound_double()
    m = rivet.build(s, args, target=f"cuda -arch={arch}", name="dbl")
    assert repr(m) == f"rivet.Module([dbl], target=cuda -arch={arch})"
    src = m.get_source("cuda")
    assert 'extern "C" __global__' in src and "dbl_kernel0" in src and "threadIdx.x" in src
    # The IR the kernel came from is still readable, split into its launch.
    assert "launch dbl_kernel0" in m.get_source("ir")
    try:
        ptx = m.get_source("ptx")
    except rivet.CompileError as e:
        assert not NVRTC_REQUIRED, f"NVRTC required but not found: {e}"
        pytest.skip(f"NVRTC not found: {e}")
    assert f".target {arch}" in ptx and ".entry dbl_kernel0" in ptx
    with pytest.raises(rivet.CompileError, match="has no 'cranelift' source"):
        m.get_source("cranelift")


def test_calling_a_cuda_function_without_a_gpu_is_a_device_error():
    s, args = bound_double()
    f = rivet.build(s, args, target="cuda", name="dbl")["dbl"]
    x = np.ones(4, np.float32)
    y = np.zeros(4, np.float32)
    with pytest.raises(rivet.DeviceError, match="built for 'cuda', called with tensors on cpu"):
        f(x, y)
    assert (y == 0).all()


def f32(*shape):
    return np.ones(shape, np.float32)


@pytest.mark.parametrize(
    "make, args",
    [
        (lambda: rivet.kernels.matmul("float32", target="cuda"), (f32(2, 3), f32(3, 2), f32(2, 2))),
        (lambda: rivet.kernels.add("float32", ("n", 1), (1, "m"), target="cuda"), (f32(2, 1), f32(1, 3), f32(2, 3))),
        (lambda: rivet.kernels.softmax("float32", ndim=2, target="cuda"), (f32(2, 5), f32(2, 5))),
        (lambda: rivet.kernels.layer_norm("float32", ndim=2, target="cuda"), (f32(2, 5), f32(5), f32(5), f32(2, 5))),
        (lambda: rivet.kernels.sum("float32", ndim=2, axis=1, target="cuda"), (f32(2, 5), f32(2))),
        (lambda: rivet.kernels.transpose("float32", (1, 0), target="cuda"), (f32(2, 5), f32(5, 2))),
    ],
    ids=["matmul", "add", "softmax", "layer_norm", "sum", "transpose"],
)
def test_the_kernel_library_builds_for_cuda(make, args):
    f = make()
    with pytest.raises(rivet.DeviceError, match="built for 'cuda', called with tensors on cpu"):
        f(*args)


def test_cuda_refuses_what_it_cannot_run_yet():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] + 1.0, name="C")
    # A CPU parallel loop has no place in a CUDA function.
    s = rivet.create_schedule(C)
    s[C].parallel(C.op.axis[0])
    with pytest.raises(rivet.CompileError, match="not available yet|parallel"):
        rivet.build(s, [A, C], target="cuda")
