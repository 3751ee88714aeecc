"""Targets are typed (``compiler/src/target.rs``): spelled as strings, parsed once, written
back canonically; bad spellings are CompileErrors that say what is accepted. Also the kernel
library's handling of unknown names and targets."""

import numpy as np
import pytest

import rivet
from rivet import te


def _add_one():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] + 1.0, name="C")
    return rivet.create_schedule(C), [A, C]


def test_target_spellings_build_and_show_in_repr(target):
    s, args = _add_one()
    mod = rivet.build(s, args, target=target, name="f")
    assert f"target={target}" in repr(mod)
    x = np.random.rand(5).astype(np.float32)
    y = np.full(5, np.nan, dtype=np.float32)
    mod["f"](x, y)
    np.testing.assert_array_equal(y, x + np.float32(1.0))


@pytest.mark.parametrize(
    "target, message",
    [
        ("llvm", "there is no LLVM backend"),
        ("cranelift", "spelled 'cpu'"),
        ("", "unknown target ''"),
        ("cpu -arch=sm_90", "takes no options"),
        ("cuda -arch=sm_70", "sm_80 and newer"),
        ("cuda -arch=ninety", "expected sm_<major><minor>"),
        ("cuda -O3", "unknown option '-O3'"),
    ],
)
def test_bad_targets_are_compile_errors(target, message):
    s, args = _add_one()
    with pytest.raises(rivet.CompileError, match=message):
        rivet.build(s, args, target=target)


def test_cuda_without_a_gpu_schedule_gets_the_default_one():
    s, args = _add_one()
    for t in ["cuda", "cuda -arch=sm_80", "cuda -arch=sm_90"]:
        src = rivet.build(s, args, target=t).get_source("cuda")
        assert "__global__" in src and "blockIdx.x" in src and "threadIdx.x" in src


def test_unknown_kernel_names_are_rivet_errors():
    with pytest.raises(rivet.KernelNotFoundError, match="no kernel 'convolution'.*matmul"):
        rivet.kernels.convolution
    assert isinstance(rivet.KernelNotFoundError("x"), rivet.Error)
    assert not hasattr(rivet.kernels, "convolution")
    assert getattr(rivet.kernels, "convolution", None) is None
    from rivet._native import _kernel

    with pytest.raises(rivet.FunctionNotFoundError, match="no kernel 'nope'.*transpose"):
        _kernel("nope", "float32")


def test_kernel_targets_are_parsed():
    with pytest.raises(rivet.CompileError, match="no LLVM backend"):
        rivet.kernels.relu("float32", target="llvm")
    f = rivet.kernels.relu("float32", ndim=1, target="interp")
    x = np.random.randn(9).astype(np.float32)
    y = np.full(9, np.nan, dtype=np.float32)
    f(x, y)
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_kernel_schedule_choice_is_checked():
    with pytest.raises(rivet.ArgumentError, match="schedule must be 'cpu' or 'gpu'"):
        rivet.kernels.relu("float32", schedule="tpu")
    # The GPU schedule cannot run on the CPU backend: the CompileError says where it can.
    with pytest.raises(rivet.CompileError, match="target 'cpu' cannot run it"):
        rivet.kernels.relu("float32", ndim=1, target="cpu", schedule="gpu")
