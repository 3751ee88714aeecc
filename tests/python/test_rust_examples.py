"""The Rust examples of the `rivet` crate (rivet/examples/*.rs): each builds its kernel for the
CPU and saves it; rivet/examples/check.py loads every module in Python and checks it against
torch on fresh random data with poisoned outputs. And docs/rust.md's Rust tutorial is the seed
GEMM example's `tutorial` block, so it cannot drift from code the tests run."""

import importlib.util
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "rivet", "examples")
NAMES = ["gemm", "softmax", "conv2d", "gemm_bias_gelu"]


def _build_example(name, out, target, env):
    """`cargo run --example NAME -- OUT TARGET` of the rivet crate; fails with cargo's stderr."""
    p = subprocess.run(
        ["cargo", "run", "--release", "-q", "-p", "rivet", "--example", name, "--", str(out), target],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]


def _check_module():
    spec = importlib.util.spec_from_file_location("rivet_examples_check", os.path.join(EXAMPLES, "check.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(shutil.which("cargo") is None, reason="needs cargo (the Rust toolchain)")
def test_every_rust_example_builds_saves_and_matches_torch(tmp_path):
    for name in NAMES:
        out = tmp_path / f"{name}.rivet"
        p = subprocess.run(
            ["cargo", "run", "--release", "-q", "-p", "rivet", "--example", name, "--", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        assert out.stat().st_size > 0
    assert _check_module().main(str(tmp_path)) == NAMES


def _nvrtc_dir():
    if os.environ.get("RIVET_NVRTC_PATH"):
        return os.environ["RIVET_NVRTC_PATH"]
    try:
        import nvidia
    except ImportError:
        return None
    d = os.path.join(list(nvidia.__path__)[0], "cu13", "lib")
    return d if os.path.isdir(d) else None


@pytest.mark.skipif(shutil.which("cargo") is None, reason="needs cargo (the Rust toolchain)")
def test_examples_build_for_cuda_with_nvrtc(tmp_path):
    """The same examples built for the GPU (sm_80, sm_90): NVRTC compiles every kernel to PTX
    here, no GPU needed; the saved modules load in Python (compiled again). Where a GPU is
    usable, the gpu-marked test below runs them against torch."""
    nvrtc = _nvrtc_dir()
    if nvrtc is None:
        assert os.environ.get("RIVET_REQUIRE_NVRTC") != "1", "RIVET_REQUIRE_NVRTC=1 but no NVRTC found"
        pytest.skip("no NVRTC (the nvidia-cuda-nvrtc wheel) here")
    import rivet

    env = dict(os.environ, RIVET_NVRTC_PATH=nvrtc)
    for name, func in [("softmax", "softmax"), ("conv2d", "conv2d"), ("gemm_bias_gelu", "gemm_bias_gelu")]:
        for arch in ("sm_80", "sm_90"):
            out = tmp_path / f"{name}.{arch}.rivet"
            _build_example(name, out, f"cuda -arch={arch}", env)
            m = rivet.load_module(str(out))
            assert m[func].name == func
            ptx = m.get_source("ptx")
            assert f".target {arch}" in ptx and ".entry" in ptx, ptx[:400]


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("cargo") is None, reason="needs cargo (the Rust toolchain)")
def test_examples_run_on_the_gpu(tmp_path):
    """Built for this GPU's arch (a cubin: the driver may refuse PTX from a newer NVRTC), run
    on torch CUDA tensors, poisoned outputs, against torch (TF32 off)."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    env = dict(os.environ)
    if _nvrtc_dir():
        env["RIVET_NVRTC_PATH"] = _nvrtc_dir()
    names = ["softmax", "conv2d", "gemm_bias_gelu"]
    for name in names:
        _build_example(name, tmp_path / f"{name}.{arch}.rivet", f"cuda -arch={arch}", env)
    assert _check_module().main(str(tmp_path), "cuda", f".{arch}", only=names) == names


@pytest.fixture(scope="module")
def example_library():
    """examples/rust_library built as a shared library (cargo), its path."""
    if shutil.which("cargo") is None:
        pytest.skip("needs cargo (the Rust toolchain)")
    p = subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "rivet-example-library"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return os.path.join(ROOT, "target", "release", "librivet_example_library.so")


LIBRARY_NAMES = ["example.gemm", "example.gemm_backward", "example.relu6"]


def test_a_rust_crate_hands_its_functions_to_python_in_one_step(rng, example_library):
    """examples/rust_library (rivet::python_library!): built as a shared library, loaded with
    rivet.load_library, its functions registered and called on torch tensors (poisoned
    outputs, fresh data) against torch; errors keep their kinds across the C ABI; a second
    load is a RegistryError unless override=True; a library without the entry point or a
    missing file is an ArgumentError."""
    import torch

    import rivet

    lib = example_library
    names = rivet.load_library(lib, override=True)
    assert names == LIBRARY_NAMES
    mm = rivet.to_pytorch_func(rivet.get_global_func("example.gemm"))
    for n, k, m in ((1, 1, 1), (5, 7, 3), (64, 33, 17)):
        a = torch.from_numpy(rng.standard_normal((n, k)).astype("float32"))
        b = torch.from_numpy(rng.standard_normal((k, m)).astype("float32"))
        c = torch.full((n, m), float("nan"))
        mm(a, b, c)
        torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
        # A transposed view crosses as its strides.
        bt = b.t().contiguous().t()
        c2 = torch.full((n, m), float("nan"))
        mm(a, bt, c2)
        torch.testing.assert_close(c2, a @ b, rtol=1e-4, atol=1e-4)
    x = torch.from_numpy(rng.standard_normal((4, 9)).astype("float32")) * 10
    y = torch.full((4, 9), float("nan"))
    rivet.to_pytorch_func(rivet.get_global_func("example.relu6"))(x, y)
    torch.testing.assert_close(y, x.clamp(0, 6))
    with pytest.raises(rivet.ShapeError, match="example.gemm: gemm: dim 'k'"):
        mm(torch.zeros(2, 3), torch.zeros(4, 2), torch.zeros(2, 2))
    with pytest.raises(rivet.DTypeError):
        mm(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(3, 2), torch.zeros(2, 2))
    with pytest.raises(rivet.RegistryError, match="already registered"):
        rivet.load_library(lib)
    assert rivet.load_library(lib, override=True) == names
    with pytest.raises(rivet.ArgumentError, match="no 'rivet_library_init'"):
        rivet.load_library(rivet._native.__file__)
    with pytest.raises(rivet.ArgumentError, match="no file"):
        rivet.load_library(os.path.join(str(ROOT), "no-such-library.so"))


def test_library_functions_keep_their_types_and_become_torch_ops(rng, example_library):
    """Functions from a Rust library cross typed (C ABI 1.1): the same signature as the
    function built in Python, output shapes answered ahead of a call (and their errors), and
    rivet.torch.custom_op takes them: the GEMM with its backward from the same library, under
    torch.compile(fullgraph=True, dynamic=True), forward and gradients against torch's
    autograd on fresh data."""
    import torch

    import rivet
    import rivet.torch
    from rivet import te

    rivet.load_library(example_library, override=True)
    gemm = rivet.get_global_func("example.gemm")
    n, m, k = te.var("n"), te.var("m"), te.var("k")
    A = te.placeholder((n, k), "float32", name="A")
    B = te.placeholder((k, m), "float32", name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    twin = rivet.build(rivet.create_schedule(C), [A, B, C], name="gemm")["gemm"]
    assert gemm.signature == twin.signature, (gemm.signature, twin.signature)
    assert gemm._params == twin._params
    assert gemm.output_shapes([[5, 7], [7, 3]]) == [([5, 3], "float32")]
    with pytest.raises(rivet.ShapeError, match="example.gemm"):
        gemm.output_shapes([[5, 7], [6, 3]])
    bwd = rivet.get_global_func("example.gemm_backward")
    assert bwd._params is not None and [p["name"] for p in bwd._params][:2] == ["A", "B"]

    op = rivet.torch.custom_op(gemm, "rivet_example_lib::gemm", backward=bwd, override=True)

    def model(a, b):
        return torch.tanh(op(a, b)).sum()

    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for nn, kk, mm in ((3, 5, 4), (17, 9, 6)):
        a = torch.from_numpy(rng.standard_normal((nn, kk)).astype("float32")).requires_grad_()
        b = torch.from_numpy(rng.standard_normal((kk, mm)).astype("float32")).requires_grad_()
        a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        out = compiled(a, b)
        out.backward()
        ref = torch.tanh(a2 @ b2).sum()
        ref.backward()
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a.grad, a2.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b.grad, b2.grad, rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match="k"):
        op(torch.zeros(2, 3), torch.zeros(4, 2))


def test_library_functions_run_inside_jax_jit_with_grad(rng, example_library):
    """The same typed library GEMM through rivet.jax.ffi_func (XLA's FFI, output shapes from
    the crossed output rule) inside jax.jit, and jax.grad through its library backward."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import rivet
    import rivet.jax

    rivet.load_library(example_library, override=True)
    f = rivet.jax.ffi_func("example.gemm", backward="example.gemm_backward")
    a = rng.standard_normal((6, 4)).astype("float32")
    b = rng.standard_normal((4, 5)).astype("float32")
    np_out = np.asarray(jax.jit(f)(a, b))
    np.testing.assert_allclose(np_out, a @ b, rtol=1e-4, atol=1e-4)
    ga, gb = jax.jit(jax.grad(lambda x, y: jnp.tanh(f(x, y)).sum(), argnums=(0, 1)))(a, b)
    ra, rb = jax.grad(lambda x, y: jnp.tanh(x @ y).sum(), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(ra), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gb), np.asarray(rb), rtol=1e-4, atol=1e-4)


def test_rust_tutorial_is_the_example():
    """docs/rust.md's first Rust block is rivet/examples/gemm.rs between its tutorial markers,
    and it is no longer than its Python twin (the block after it)."""
    src = open(os.path.join(EXAMPLES, "gemm.rs")).read()
    block = re.search(r"// tutorial: begin\n(.*?)\n\s*// tutorial: end", src, re.S).group(1)
    lines = [line[4:] if line.startswith("    ") else line for line in block.splitlines()]
    page = open(os.path.join(ROOT, "docs", "rust.md")).read()
    rust_block = re.search(r"```rust\n(.*?)```", page, re.S).group(1)
    visible = [line for line in rust_block.splitlines() if not line.startswith("# ") and line != "#"]
    assert visible == lines, "docs/rust.md's Rust tutorial differs from rivet/examples/gemm.rs"
    python = re.search(r"```text\n(.*?)```", page, re.S).group(1).strip().splitlines()
    assert len(lines) <= len(python), (len(lines), len(python))
