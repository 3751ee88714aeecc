"""The native path of rivet.torch.custom_op (rivet/_torch_native.cpp): the op's kernels in C++.

What must hold: both paths give the same results (fresh random data; contiguous, transposed,
sliced and empty inputs; one and two outputs; float32 and float64), gradients agree with
torch's, a call that records no gradient runs no rivet Python at all (checked with a
profiler hook), errors keep their rivet class and the op's wording (a callback's exception
comes back as the very object), calls from several threads at once, override=True replaces a
native op, and native=True where the bridge cannot be built is a clear error while the default
falls back to the Python path. Outputs are poisoned through a NaN-filling torch.empty on the
Python path; the native path allocates in C++, so every element is compared instead.
"""

import itertools
import os
import shutil
import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")

import rivet  # noqa: E402
import rivet.torch as rt  # noqa: E402
from rivet import te  # noqa: E402

_ids = itertools.count()


def opname(tag):
    return f"rivet_native_test::{tag}_{next(_ids)}"


def randn(rng, *shape, dtype=torch.float32):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def bias_tanh(dtype):
    """Y = tanh(X * w + b) over (m, n), w and b of (n,)."""
    m, n = te.var("m"), te.var("n")
    X = te.placeholder((m, n), dtype, name="X")
    w = te.placeholder((n,), dtype, name="w")
    b = te.placeholder((n,), dtype, name="b")
    Y = te.compute((m, n), lambda i, j: te.tanh(X[i, j] * w[j] + b[j]), name="Y")
    return rivet.build(rivet.create_schedule(Y), [X, w, b, Y], name="bias_tanh")["bias_tanh"]


def rows_and_sum(dtype):
    """Two outputs: P = X * X (m, n) and S = sum over rows (m,)."""
    m, n = te.var("m"), te.var("n")
    X = te.placeholder((m, n), dtype, name="X")
    P = te.compute((m, n), lambda i, j: X[i, j] * X[i, j], name="P")
    r = te.reduce_axis((0, n), name="r")
    S = te.compute((m,), lambda i: te.sum(X[i, r], axis=r), name="S")
    return rivet.build(rivet.create_schedule([P, S]), [X, P, S], name="rows_sum")["rows_sum"]


@pytest.fixture(scope="module")
def bridge():
    from rivet import _torch_native

    try:
        return _torch_native.extension()
    except _torch_native.NativeUnavailable as e:
        # With a C++ compiler present the bridge must build: a failure is a defect. Without
        # one (possible on a bare machine) the default falls back to the Python path, which
        # test_torch_op.py and the last test here cover.
        if shutil.which(os.environ.get("CXX", "c++")) is not None:
            raise
        pytest.skip(f"no C++ compiler here, so no C++ bridge: {e}")


def ref_bias_tanh(x, w, b):
    return torch.tanh(x * w + b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_both_paths_agree_on_layouts_and_sizes(bridge, rng, dtype):
    name = str(dtype).removeprefix("torch.")
    fn = bias_tanh(name)
    ops = {nat: rt.custom_op(fn, opname(f"bt_{nat}"), native=nat) for nat in (True, False)}
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    big = randn(rng, 9, 12, dtype=dtype)
    cases = [
        randn(rng, 5, 7, dtype=dtype),
        randn(rng, 7, 5, dtype=dtype).t(),  # transposed
        big[1:8:2, 3:10],  # sliced with steps: strided, offset
        randn(rng, 0, 7, dtype=dtype),  # empty
        randn(rng, 1, 1, dtype=dtype),
    ]
    for x in cases:
        n = x.shape[1]
        w, b = randn(rng, n, dtype=dtype), randn(rng, n, dtype=dtype)
        want = ref_bias_tanh(x, w, b)
        for nat, op in ops.items():
            got = op(x, w, b)
            assert got.shape == want.shape and got.dtype == dtype, nat
            torch.testing.assert_close(got, want, **tol)


def test_two_outputs_and_gradients_match_torch(bridge, rng):
    op = rt.custom_op(rows_and_sum("float64"), opname("rows_sum"), native=True)
    x = randn(rng, 4, 6, dtype=torch.float64).requires_grad_()
    p, s = op(x)
    torch.testing.assert_close(p, x * x)
    torch.testing.assert_close(s, x.sum(1))
    assert "rivet_" in type(p.grad_fn).__name__  # the Python autograd formula recorded it
    hp, hs = randn(rng, 4, 6, dtype=torch.float64), randn(rng, 4, dtype=torch.float64)
    (g,) = torch.autograd.grad((p, s), (x,), (hp, hs))
    torch.testing.assert_close(g, 2 * x.detach() * hp + hs[:, None])
    assert torch.autograd.gradcheck(lambda x: op(x), (x,))
    bt = rt.custom_op(bias_tanh("float64"), opname("bt_grad"), native=True)
    xs = [randn(rng, 3, 5, dtype=torch.float64).requires_grad_() for _ in range(1)]
    w = randn(rng, 5, dtype=torch.float64).requires_grad_()
    b = randn(rng, 5, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(bt, (xs[0], w, b))


def test_a_call_recording_no_gradient_runs_no_rivet_python(bridge, rng):
    op = rt.custom_op(bias_tanh("float32"), opname("bt_nopy"), native=True)
    x, w, b = randn(rng, 8, 4), randn(rng, 4), randn(rng, 4)
    op(x, w, b)
    pkg = os.path.dirname(rivet.__file__)
    seen = []

    def prof(frame, event, arg):
        if event in ("call", "c_call") and frame.f_code.co_filename.startswith(pkg):
            seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    for ctx in (torch.no_grad(), torch.enable_grad()):  # grad on, but nothing requires it
        with ctx:
            sys.setprofile(prof)
            try:
                y = op.default(x, w, b)
            finally:
                sys.setprofile(None)
        assert y.grad_fn is None
        torch.testing.assert_close(y, ref_bias_tanh(x, w, b))
    assert not seen, seen
    # Inside a compiled graph too.
    f = torch.compile(lambda x, w, b: op(x, w, b) * 2, fullgraph=True)
    torch.testing.assert_close(f(x, w, b), ref_bias_tanh(x, w, b) * 2)


def test_errors_keep_their_class_and_the_ops_wording(bridge, rng):
    name = opname("bt_err")
    op = rt.custom_op(bias_tanh("float32"), name, native=True)
    x, w, b = randn(rng, 3, 4), randn(rng, 4), randn(rng, 4)
    with pytest.raises(rivet.DTypeError, match=rf"{name}: argument 0 \('X'\) expected dtype float32"):
        op(x.double(), w, b)
    with pytest.raises(rivet.ShapeError, match=rf"{name}: dim 'n' is 4 from argument 0 .* but 5"):
        op(x, randn(rng, 5), b)
    with pytest.raises(rivet.ShapeError, match="expected a 2-d tensor"):
        op(randn(rng, 12), w, b)


def test_a_callbacks_exception_comes_back_as_that_object(bridge, rng):
    class Boom(Exception):
        pass

    raised = []

    def cb(a, out):
        e = Boom("from the callback")
        raised.append(e)
        raise e

    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    E = te.extern((n,), [A], cb, dtype="float32", name="E")
    C = te.compute((n,), lambda i: E[i] + 1.0, name="C")
    fn = rivet.build(rivet.create_schedule(C), [A, C], name="cb_op")["cb_op"]
    op = rt.custom_op(fn, opname("cb"), native=True, backward=None)
    with pytest.raises(Boom) as info:
        op(randn(rng, 4))
    assert info.value is raised[0]


def test_threads_call_one_op_at_once(bridge, rng):
    op = rt.custom_op(bias_tanh("float64"), opname("bt_threads"), native=True)
    data = [(randn(rng, 64, 33, dtype=torch.float64), randn(rng, 33, dtype=torch.float64),
             randn(rng, 33, dtype=torch.float64)) for _ in range(8)]
    bad = []

    def work(k):
        for _ in range(50):
            x, w, b = data[k]
            if not torch.allclose(op(x, w, b), ref_bias_tanh(x, w, b), rtol=1e-12, atol=1e-12):
                bad.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_override_replaces_a_native_op(bridge, rng):
    name = opname("swap")
    rt.custom_op(bias_tanh("float32"), name, native=True)
    with pytest.raises(rivet.RegistryError, match="exists already"):
        rt.custom_op(bias_tanh("float32"), name, native=True)
    n = te.var("n")
    X = te.placeholder((n,), "float32", name="X")
    Y = te.compute((n,), lambda i: X[i] * 3.0, name="Y")
    triple = rivet.build(rivet.create_schedule(Y), [X, Y], name="triple")["triple"]
    op = rt.custom_op(triple, name, native=True, override=True)
    x = randn(rng, 5)
    torch.testing.assert_close(op(x), x * 3)
    # And back to the Python path under the same name.
    op = rt.custom_op(bias_tanh("float32"), name, native=False, override=True)
    x, w, b = randn(rng, 2, 3), randn(rng, 3), randn(rng, 3)
    torch.testing.assert_close(op(x, w, b), ref_bias_tanh(x, w, b))


def test_bad_native_argument():
    with pytest.raises(rivet.ArgumentError, match="'native' must be None, True or False"):
        rt.custom_op(bias_tanh("float32"), opname("bad"), native="yes")


def test_without_a_compiler_native_true_is_an_error_and_the_default_falls_back(tmp_path):
    code = f"""
import torch, rivet, rivet.torch as rt
from rivet import te
n = te.var("n")
X = te.placeholder((n,), "float32", name="X")
Y = te.compute((n,), lambda i: X[i] * 2.0, name="Y")
f = rivet.build(rivet.create_schedule(Y), [X, Y], name="dbl")["dbl"]
try:
    rt.custom_op(f, "nocxx::a", native=True)
    raise SystemExit("native=True did not fail")
except rivet.Error as e:
    assert "C++ bridge is unavailable" in str(e) and "no C++ compiler" in str(e), e
op = rt.custom_op(f, "nocxx::b")  # the default: the Python path
x = torch.randn(4)
torch.testing.assert_close(op(x), x * 2)
print("ok")
"""
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), RIVET_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("RIVET_TORCH_NATIVE", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


def test_an_output_too_large_to_allocate_is_a_memory_error(bridge):
    """Outputs sized from inputs that are stride-0 views of 2^40 and 2^31 elements: the
    2^71-element outer product is refused as rivet.MemoryError naming the op, not a crash."""
    m, n = te.var("m"), te.var("n")
    A = te.placeholder((m,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    C = te.compute((m, n), lambda i, j: A[i] * B[j], name="C")
    name = opname("outer")
    fn = rivet.build(rivet.create_schedule(C), [A, B, C], name="outer")["outer"]
    op = rt.custom_op(fn, name, native=True)
    a = torch.ones(1).expand(2**40)
    b = torch.ones(1).expand(2**31)
    with pytest.raises(rivet.MemoryError, match=rf"{name} .*cannot allocate output 0 of shape \[1099511627776, 2147483648\]"):
        op(a, b)
    # Small ones still work after the failure.
    x, y = torch.arange(3.0), torch.arange(4.0)
    torch.testing.assert_close(op(x, y), x[:, None] * y[None, :])


def test_sparse_inputs_are_the_python_paths_dlpack_error(bridge, rng):
    """The kernel read data_ptr() of a sparse tensor: torch's RuntimeError, where the Python
    path gave rivet.DLPackError. Both now refuse it in the op's words before the call."""
    x, w, b = randn(rng, 3, 4), randn(rng, 4), randn(rng, 4)
    for native in (True, False):
        name = opname("bt_sparse")
        op = rt.custom_op(bias_tanh("float32"), name, native=native)
        for t in (x.to_sparse(), x.to_sparse_csr(), x.to_mkldnn()):
            with pytest.raises(rivet.DLPackError, match=rf"{name}: argument 0 \('X'\) is a "):
                op(t, w, b)
        with pytest.raises(rivet.DLPackError, match=r"argument 2 \('b'\) is a sparse_coo tensor"):
            op(x, w, b.to_sparse())
        # The direct entry of compiled graphs refuses it the same way.
        if native:
            from rivet._torch_native import compiled_kernel

            with pytest.raises(rivet.DLPackError, match=r"argument 0 \('X'\) is a sparse_coo"):
                compiled_kernel(name, ("float32",))(x.to_sparse(), w, b)


def test_unsigned_dtypes_beyond_uint8(bridge):
    """uint16/32/64 are rivet dtypes; the bridge knew only uint8, so a function with a uint16
    output could not be registered at all (ValueError "unknown dtype uint16")."""
    for dtype in ("uint16", "uint32", "uint64"):
        n = te.var("n")
        A = te.placeholder((n,), dtype, name="A")
        C = te.compute((n,), lambda i: A[i] + A[i], name="C")
        f = rivet.build(rivet.create_schedule(C), [A, C], name=f"dbl_{dtype}")[f"dbl_{dtype}"]
        op = rt.custom_op(f, opname(f"dbl_{dtype}"), native=True)
        x = torch.tensor([0, 1, 7, 300], dtype=getattr(torch, dtype))
        got = op(x)
        assert got.dtype == x.dtype
        assert got.to(torch.int64).tolist() == [0, 2, 14, 600]


# ---- inside torch.compile: inductor's generated code calls the kernel directly ---------------


def compiled_code(f, *args):
    """(result, generated Python wrapper source) of a fresh compile of ``f``."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    out, codes = run_and_get_code(f, *args)
    return out, "\n".join(codes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_graphs_call_the_kernel_without_the_dispatcher(bridge, rng, dtype):
    name = opname("bt_direct")
    op = rt.custom_op(bias_tanh(str(dtype).removeprefix("torch.")), name, native=True)
    f = torch.compile(lambda x, w, b: op(x, w, b) * 2, fullgraph=True, dynamic=True)
    x, w, b = randn(rng, 6, 5, dtype=dtype), randn(rng, 5, dtype=dtype), randn(rng, 5, dtype=dtype)
    y, code = compiled_code(f, x, w, b)
    torch.testing.assert_close(y, ref_bias_tanh(x, w, b) * 2)
    ns, op_name = name.split("::")
    dt = str(dtype).removeprefix("torch.")
    assert f"_rivet_compiled_kernel({name!r}, ({dt!r},))" in code, code
    assert f"torch.ops.{ns}.{op_name}.default(" not in code, code
    # inductor's output check stays, as a C++ size/stride check (the dtype is checked by the
    # callable).
    assert "assert_size_stride(buf" in code and "assert_tensor_metadata(" not in code, code
    # The same graph at other sizes (symbolic dims), and on transposed and sliced inputs.
    for m, n in [(1, 1), (9, 3), (0, 4)]:
        x, w, b = randn(rng, m, n, dtype=dtype), randn(rng, n, dtype=dtype), randn(rng, n, dtype=dtype)
        torch.testing.assert_close(f(x, w, b), ref_bias_tanh(x, w, b) * 2)
    xt = randn(rng, 7, 4, dtype=dtype).t()
    ws = randn(rng, 14, dtype=dtype)[::2]
    torch.testing.assert_close(f(xt, ws, b[:1].expand(7)), ref_bias_tanh(xt, ws, b[:1].expand(7)) * 2)


def test_compiled_two_outputs_and_training_step_call_directly(bridge, rng):
    name = opname("rows_sum_direct")
    op = rt.custom_op(rows_and_sum("float64"), name, native=True)

    def loss(x):
        p, s = op(x)
        return (p * 3).sum() + (s * s).sum()

    f = torch.compile(loss, fullgraph=True)
    x = randn(rng, 5, 4, dtype=torch.float64).requires_grad_()
    y, code = compiled_code(f, x)
    assert f"_rivet_compiled_kernel({name!r}, ('float64', 'float64'))" in code, code
    xe = x.detach().clone().requires_grad_()
    ye = loss(xe)
    torch.testing.assert_close(y, ye)
    (g,) = torch.autograd.grad(y, x)
    (ge,) = torch.autograd.grad(ye, xe)
    torch.testing.assert_close(g, ge)
    torch.testing.assert_close(g, 6 * x.detach() + 2 * x.detach().sum(1, keepdim=True))


def test_a_compiled_graph_follows_the_op_when_it_is_replaced(bridge, rng):
    """The generated code reaches the op through its slot: replaced by another native kernel or
    by a Python-path op under the same name, a graph compiled before calls what the
    dispatcher would."""
    from rivet import _torch_native

    name = opname("swap_direct")

    def scale(k):
        n = te.var("n")
        X = te.placeholder((n,), "float32", name="X")
        Y = te.compute((n,), lambda i: X[i] * float(k), name="Y")
        return rivet.build(rivet.create_schedule(Y), [X, Y], name="scale")["scale"]

    rt.custom_op(scale(2), name, native=True)
    kernel = _torch_native.compiled_kernel(name, ("float32",))
    x = randn(rng, 5)
    torch.testing.assert_close(kernel(x), x * 2)
    rt.custom_op(scale(3), name, native=True, override=True)
    torch.testing.assert_close(kernel(x), x * 3)
    rt.custom_op(scale(5), name, native=False, override=True)
    torch.testing.assert_close(kernel(x), x * 5)
    # And a fresh lookup for an op registered on the Python path gives its dispatcher path.
    torch.testing.assert_close(_torch_native.compiled_kernel(name, ("float32",))(x), x * 5)
    # Replaced by an op of another output dtype: the graph's callable refuses the outputs.
    def half(dtype, native):
        n = te.var("n")
        X = te.placeholder((n,), "float32", name="X")
        Y = te.compute((n,), lambda i: te.cast(dtype, X[i] * 0.5), name="Y")
        fn = rivet.build(rivet.create_schedule(Y), [X, Y], name="half")["half"]
        return rt.custom_op(fn, name, native=native, override=True)

    for native in (True, False):
        half("float64", native)
        with pytest.raises(rivet.DTypeError, match=rf"{name}: output 0 is a float64 tensor, but the torch.compile graph calling the op expects a float32 tensor .*compile it again"):
            kernel(x)


def test_the_direct_entry_keeps_errors_and_refuses_bad_calls(bridge, rng):
    name = opname("bt_direct_err")
    rt.custom_op(bias_tanh("float32"), name, native=True)
    from rivet import _torch_native

    kernel = _torch_native.compiled_kernel(name, ("float32",))
    x, w, b = randn(rng, 3, 4), randn(rng, 4), randn(rng, 4)
    torch.testing.assert_close(kernel(x, w, b), ref_bias_tanh(x, w, b))
    with pytest.raises(rivet.DTypeError, match=rf"{name}: argument 0 \('X'\) expected dtype float32"):
        kernel(x.double(), w, b)
    with pytest.raises(rivet.ShapeError, match=rf"{name}: dim 'n' is 4 from argument 0 .* but 5"):
        kernel(x, randn(rng, 5), b)
    with pytest.raises(rivet.DeviceError, match=name):
        kernel(x.to("meta"), w, b)
    with pytest.raises(TypeError, match="takes 3 arguments, got 2"):
        kernel(x, w)
    with pytest.raises(TypeError, match="argument 1 must be a Tensor"):
        kernel(x, [1.0] * 4, b)
    two = _torch_native.compiled_kernel(name, ("float32", "float32"))
    with pytest.raises(rivet.DTypeError, match=r"output 1 is missing, but .* expects a float32 tensor \(2 outputs\)"):
        two(x, w, b)
    ext = _torch_native.extension()
    for binding in (-1, 2**62, -(2**63)):
        with pytest.raises(ValueError, match="no binding"):
            ext.call(binding, x, w, b)
    with pytest.raises(OverflowError):
        ext.call(2**64, x, w, b)
    with pytest.raises(ValueError, match="no binding"):
        ext.call()
    with pytest.raises(ValueError, match="unknown dtype complex32"):
        ext.binding(0, ("complex32",))
    with pytest.raises(ValueError, match="no such slot"):
        ext.binding(2**62, ("float32",))


def test_without_the_bridge_the_compiled_kernel_is_the_op_itself():
    """A graph cached on disk by a process with the bridge may be loaded by one without it
    (RIVET_TORCH_NATIVE=0): its generated code then calls the OpOverload, outputs' dtypes
    checked."""
    code = """
import torch, rivet, rivet.torch as rt
from rivet import te, _torch_native
n = te.var("n")
X = te.placeholder((n,), "float32", name="X")
Y = te.compute((n,), lambda i: X[i] * 2.0, name="Y")
f = rivet.build(rivet.create_schedule(Y), [X, Y], name="dbl")["dbl"]
op = rt.custom_op(f, "nobridge::dbl")
k = _torch_native.compiled_kernel("nobridge::dbl", ("float32",))
assert "ext" not in _torch_native._state
x = torch.randn(4)
torch.testing.assert_close(k(x), x * 2)
k64 = _torch_native.compiled_kernel("nobridge::dbl", ("float64",))
try:
    k64(x)
    raise SystemExit("a float32 output passed a float64 graph's check")
except rivet.DTypeError as e:
    assert "nobridge::dbl: outputs of dtypes ['torch.float32']" in str(e), e
print("ok")
"""
    env = dict(os.environ, RIVET_TORCH_NATIVE="0")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


def test_direct_calls_while_other_threads_add_bindings(bridge, rng):
    """Generated modules loaded in other threads add bindings and slots while a direct call
    runs with the GIL released: the call keeps its own copies (no dangling reference into the
    moved vectors)."""
    from rivet import _torch_native

    name = opname("bt_direct_threads")
    rt.custom_op(bias_tanh("float64"), name, native=True)
    kernel = _torch_native.compiled_kernel(name, ("float64",))
    x, w, b = (randn(rng, 256, 64, dtype=torch.float64), randn(rng, 64, dtype=torch.float64),
               randn(rng, 64, dtype=torch.float64))
    want = kernel(x, w, b)
    torch.testing.assert_close(want, ref_bias_tanh(x, w, b))
    stop, bad = threading.Event(), []

    def add_bindings():
        while not stop.is_set():
            for _ in range(64):
                _torch_native.compiled_kernel(name, ("float64",))

    t = threading.Thread(target=add_bindings)
    t.start()
    try:
        for _ in range(300):
            if not torch.equal(kernel(x, w, b), want):
                bad.append(1)
    finally:
        stop.set()
        t.join()
    assert not bad
