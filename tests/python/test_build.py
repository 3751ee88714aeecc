"""rivet.build and rivet.Module: functions, sources, saving and loading, and the checks a
compiled function makes before it runs (dtype, rank, shape, symbolic dims, read-only outputs,
bounds), each a clear rivet error. Static out-of-bounds programs are build errors.
"""

import re

import numpy as np
import pytest
import torch

import rivet
from rivet import te

from conftest import abs_mm, assert_bits_equal, assert_matches, bits, poison, random_array

# `target` (every backend) comes from conftest.py.


def gemm():
    n = te.var("n")
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, C


@pytest.fixture
def mm(target):
    A, B, C = gemm()
    return rivet.build(rivet.create_schedule(C), [A, B, C], target=target, name="mm")


def test_module_api(mm, target):
    assert isinstance(mm, rivet.Module)
    assert mm.function_names == ["mm"]
    assert "mm" in mm and "nope" not in mm
    f = mm["mm"]
    assert isinstance(f, rivet.Function) and f.name == "mm"
    assert mm.get_function("mm").name == "mm"
    sig = f.signature
    assert "A" in sig and "float32" in sig and "(n, n)" in sig
    with pytest.raises(rivet.FunctionNotFoundError, match="nope.*mm"):
        mm["nope"]
    assert "mm" in repr(mm)


def test_get_source(mm, target):
    ir = mm.get_source()
    assert ir == mm.get_source("ir")
    assert "func mm(" in ir
    # The CPU's default schedule packs the GEMM and calls a micro-kernel; the interpreter runs
    # the program as written.
    assert ("call gemm_update" in ir) if target == "cpu" else ("for k" in ir)
    nest = mm.get_source("nest")
    assert "func mm(" in nest
    code = mm.get_source("cranelift")
    assert isinstance(code, str)
    if target == "cpu":
        assert "function" in code and code.strip()
    with pytest.raises(rivet.CompileError, match=f"built for target '{target}' has no 'ptx' source"):
        mm.get_source("ptx")
    with pytest.raises(rivet.CompileError, match="unknown kind 'sass'"):
        mm.get_source("sass")


def test_default_name():
    A = te.placeholder((3,), "float32", name="A")
    C = te.compute((3,), lambda i: A[i] + 1, name="C")
    mod = rivet.build(rivet.create_schedule(C), [A, C], target="interp")
    assert mod.function_names == ["default_function"]


def test_save_and_load(mm, target, tmp_path, rng):
    path = tmp_path / "mm.rivet"
    mm.save(str(path))
    for p in (str(path), path):  # str and os.PathLike
        loaded = rivet.load_module(p)
        assert loaded.function_names == ["mm"]
        f = rivet.to_pytorch_func(loaded["mm"])
        for size in (1, 7, 30):
            x = torch.from_numpy(random_array(rng, (size, size)))
            y = torch.from_numpy(random_array(rng, (size, size)))
            z = poison(torch.empty(size, size))
            f(x, y, z)
            assert_matches(z, x @ y, op="contraction", against="torch", k=size, terms=abs_mm(x, y))
    # A corrupt or foreign file is a clear CompileError.
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x55
    bad = tmp_path / "bad.rivet"
    bad.write_bytes(bytes(data))
    with pytest.raises(rivet.CompileError, match="checksum"):
        rivet.load_module(bad)
    foreign = tmp_path / "foreign.rivet"
    foreign.write_bytes(b"not a module at all, just some bytes")
    with pytest.raises(rivet.CompileError, match="not a rivet module"):
        rivet.load_module(foreign)
    with pytest.raises(rivet.CompileError, match="cannot load"):
        rivet.load_module(tmp_path / "missing.rivet")


# ---- build-time errors ------------------------------------------------------------------------


def test_static_out_of_bounds_is_a_build_error(target):
    A = te.placeholder((16,), "float32", name="A")
    C = te.compute((16,), lambda i: A[i + 1], name="C")
    with pytest.raises(rivet.CompileError) as info:
        rivet.build(rivet.create_schedule(C), [A, C], target=target)
    msg = str(info.value)
    assert "'A'" in msg, msg  # the tensor
    assert re.search(r"index \(.*i\)? \+ 1\)", msg), msg  # the index expression
    assert "[0, 16)" in msg and "16 (out of bounds)" in msg, msg  # the extent, the bad value
    D = te.compute((16,), lambda i: A[i - 1], name="D")
    with pytest.raises(rivet.CompileError, match=r"tensor 'A' dim 0: index .*- 1\) must lie in \[0, 16\).*lowest value is -1"):
        rivet.build(rivet.create_schedule(D), [A, D], target=target)


def test_symbolic_always_out_of_bounds_is_a_build_error(target):
    # A[i + 1] over C's full extent with A and C both of shape (n,) reads A[n] for every
    # n >= 1: the proof refutes it symbolically, so it is a build error too.
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i + 1], name="C")
    with pytest.raises(rivet.CompileError, match=r"tensor 'A' dim 0: .*\+ 1\) must lie in \[0, n\)"):
        rivet.build(rivet.create_schedule(C), [A, C], target=target, default_schedule=False)
    if target == "cpu":
        # The default CPU schedule cuts the loop into parallel chunks, whose guard hides the
        # refutation from the proof: the access becomes a per-call check, which every call
        # fails before any code runs.
        f = rivet.build(rivet.create_schedule(C), [A, C], target=target, name="shift")["shift"]
        for size in (1, 5, 40000):
            c = poison(np.empty(size, np.float32))
            with pytest.raises(rivet.ShapeError, match="out-of-bounds"):
                f(np.ones(size, np.float32), c)
            assert np.isnan(c).all()


def test_symbolic_out_of_bounds_is_checked_per_call(target, rng):
    # In bounds only when m >= n + 1: built, then checked once per call before any code runs.
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((m,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i + 1], name="C")
    f = rivet.build(rivet.create_schedule(C), [A, C], target=target, name="shift")["shift"]
    for size in (1, 5):
        a = random_array(rng, (size,))
        c = poison(np.empty(size, np.float32))
        snapshot = bits(c)
        with pytest.raises(rivet.ShapeError, match="out-of-bounds") as info:
            f(a, c)
        assert isinstance(info.value, rivet.Error)
        msg = str(info.value)
        assert "'A'" in msg and f"n={size}" in msg and f"m={size}" in msg, msg
        assert_bits_equal(c, snapshot, "the kernel ran although the check failed")
    a = random_array(rng, (6,))
    for size in (0, 3, 5):
        c = poison(np.empty(size, np.float32))
        f(a, c)
        np.testing.assert_array_equal(c, a[1 : size + 1])
    # Dims given by expressions are checked too: D has n - 1 elements.
    k = te.var("k")
    X = te.placeholder((k,), "float32", name="X")
    D = te.compute((k - 1,), lambda i: X[i + 1], name="D")
    g = rivet.build(rivet.create_schedule(D), [X, D], target=target, name="g")["g"]
    d = poison(np.empty(5, np.float32))
    g(a, d)
    np.testing.assert_array_equal(d, a[1:])
    with pytest.raises(rivet.ShapeError, match="D.*size 6 in dim 0.*needs 5"):
        g(a, np.empty(6, np.float32))


def test_build_argument_errors(target):
    A, B, C = gemm()
    s = rivet.create_schedule(C)
    with pytest.raises(rivet.CompileError, match="output 'C' of the schedule must be in args"):
        rivet.build(s, [A, B], target=target)
    with pytest.raises(rivet.CompileError, match="placeholder 'B' is read but not passed"):
        rivet.build(s, [A, C], target=target)
    with pytest.raises(rivet.CompileError, match="passed twice"):
        rivet.build(s, [A, B, C, A], target=target)
    with pytest.raises(rivet.CompileError, match="unknown target 'tpu'"):
        rivet.build(s, [A, B, C], target="tpu")
    with pytest.raises(rivet.CompileError, match="name"):
        rivet.build(s, [A, B, C], target=target, name="has space")
    with pytest.raises(rivet.ArgumentError, match="te.Tensor"):
        rivet.build(s, [A, B, "C"], target=target)
    with pytest.raises(rivet.CompileError, match="placeholder"):
        rivet.create_schedule(A)
    with pytest.raises(rivet.CompileError):
        rivet.create_schedule([])


# ---- call-time errors -----------------------------------------------------------------------------


def test_wrong_dtype(mm):
    x = np.ones((4, 4), np.float64)
    y = np.ones((4, 4), np.float32)
    z = np.empty((4, 4), np.float32)
    with pytest.raises(rivet.DTypeError, match=r"argument 0 \('A'\) expected dtype float32, got float64"):
        mm["mm"](x, y, z)
    with pytest.raises(rivet.DTypeError, match="'B'.*int32"):
        rivet.to_pytorch_func(mm["mm"])(torch.ones(2, 2), torch.ones(2, 2, dtype=torch.int32), torch.empty(2, 2))


def test_wrong_rank_and_shape(mm):
    f = mm["mm"]
    y = np.ones((4, 4), np.float32)
    z = np.empty((4, 4), np.float32)
    with pytest.raises(rivet.ShapeError, match=r"argument 0 \('A'\) expected a 2-d tensor, got 3-d"):
        f(np.ones((4, 4, 1), np.float32), y, z)
    with pytest.raises(rivet.ShapeError):
        f(np.ones(16, np.float32), y, z)
    fixed = te.placeholder((3, 5), "float32", name="X")
    D = te.compute((3, 5), lambda i, j: fixed[i, j] * 2, name="D")
    g = rivet.build(rivet.create_schedule(D), [fixed, D], target="interp", name="g")["g"]
    with pytest.raises(rivet.ShapeError, match="X"):
        g(np.ones((3, 4), np.float32), np.empty((3, 5), np.float32))
    with pytest.raises(rivet.ShapeError, match="D"):
        g(np.ones((3, 5), np.float32), np.empty((5, 3), np.float32))


def test_inconsistent_symbolic_dims(mm):
    x = np.ones((4, 4), np.float32)
    y = np.ones((5, 5), np.float32)
    z = np.empty((4, 4), np.float32)
    with pytest.raises(rivet.ShapeError) as info:
        mm["mm"](x, y, z)
    msg = str(info.value)
    assert re.search(r"dim 'n' is 4 from argument 0 \('A'\) but 5 from argument 1 \('B'\)", msg), msg
    # Non-square input: the two dims of A disagree.
    with pytest.raises(rivet.ShapeError, match=r"dim 'n' is 4 .* but 6 from argument 0 \('A'\)"):
        mm["mm"](np.ones((4, 6), np.float32), np.ones((4, 4), np.float32), z)
    # Through the torch wrapper too.
    with pytest.raises(rivet.ShapeError, match="dim 'n'"):
        rivet.to_pytorch_func(mm["mm"])(torch.ones(2, 2), torch.ones(3, 3), torch.empty(2, 2))


def test_read_only_outputs(mm):
    import jax.numpy as jnp

    x = np.ones((3, 3), np.float32)
    y = np.ones((3, 3), np.float32)
    z = np.zeros((3, 3), np.float32)
    z.flags.writeable = False
    with pytest.raises(rivet.ReadOnlyError, match="C"):
        mm["mm"](x, y, z)
    assert np.all(z == 0)
    zj = jnp.zeros((3, 3), jnp.float32)
    with pytest.raises(rivet.ReadOnlyError):
        mm["mm"](x, y, zj)
    with pytest.raises(rivet.ReadOnlyError):
        rivet.to_jax_func(mm["mm"])(jnp.ones((3, 3)), jnp.ones((3, 3)), zj)
    # JAX inputs are fine; the output comes back as a new jax.Array.
    out = rivet.to_jax_func(mm["mm"])(jnp.ones((3, 3), jnp.float32), jnp.ones((3, 3), jnp.float32))
    assert_matches(np.asarray(out), np.full((3, 3), 3.0, np.float32), op="exact")


def test_wrong_argument_count_and_kind(mm):
    x = np.ones((3, 3), np.float32)
    with pytest.raises(rivet.ArgumentError):
        mm["mm"](x)
    with pytest.raises(rivet.ArgumentError):
        mm["mm"](x, x, x, x)
    with pytest.raises(rivet.ArgumentError):
        mm["mm"](x, "y", np.empty((3, 3), np.float32))


def test_output_overlapping_input(mm):
    x = np.ones((3, 3), np.float32)
    y = np.ones((3, 3), np.float32)
    with pytest.raises(rivet.LayoutError):
        mm["mm"](x, y, x)


def test_unused_inputs_are_parameters_the_kernel_ignores(target, rng, tmp_path):
    # A backward function takes every input of its forward, and a gradient often reads only
    # some: an input placeholder no output reads is a parameter, still checked at the call.
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n,), "float32", name="A")
    U = te.placeholder((m,), "float64", name="U")  # its own dim: bound from it alone
    B = te.placeholder((n,), "float32", name="B")  # shares n with A
    C = te.compute((n,), lambda i: A[i] * 2.0, name="C")
    mod = rivet.build(rivet.create_schedule(C), [A, U, B, C], target=target, name="f")
    mod.save(str(tmp_path / "f.rivet"))
    for f in (mod["f"], rivet.load_module(str(tmp_path / "f.rivet"))["f"]):
        a = random_array(rng, (7,), "float32")
        c = poison(np.empty(7, np.float32))
        f(a, np.zeros(3), np.zeros(7, np.float32), c)
        np.testing.assert_array_equal(c, a * 2)
        with pytest.raises(rivet.ShapeError, match="'B'"):
            f(a, np.zeros(3), np.zeros(6, np.float32), c)
        with pytest.raises(rivet.DTypeError, match="'U'"):
            f(a, np.zeros(3, np.float32), np.zeros(7, np.float32), c)
    # A computed tensor no stage computes is still refused, saying what to do.
    D = te.compute((n,), lambda i: A[i] + 1.0, name="D")
    with pytest.raises(rivet.CompileError, match="'D' is computed, but no stage"):
        rivet.build(rivet.create_schedule(C), [A, D, C], target=target)
