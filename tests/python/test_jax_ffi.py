"""rivet functions inside jax.jit / grad / vmap through XLA's typed FFI (rivet.jax.ffi_func).
References are numpy on fresh random data; outputs XLA allocates cannot be poisoned, so every
element is compared."""

import numpy as np
import pytest

import rivet
from rivet import te

jax = pytest.importorskip("jax")
jnp = jax.numpy
import rivet.jax as rjax  # noqa: E402


def _fn(outs, args, name="f"):
    return rivet.build(rivet.create_schedule(outs), args, name=name)[name]


@pytest.fixture(scope="module")
def scale_add():
    """C[n, m] = A * B[m] + 1 (symbolic n, m): one output."""
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n, m), "float32", name="A")
    B = te.placeholder((m,), "float32", name="B")
    C = te.compute((n, m), lambda i, j: A[i, j] * B[j] + 1.0, name="C")
    return _fn(C, [A, B, C])


@pytest.fixture(scope="module")
def mul_parts():
    """P = X * Y and S[n] = sum_j X[n, j] (float64): two outputs."""
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), "float64", name="X")
    Y = te.placeholder((n, m), "float64", name="Y")
    P = te.compute((n, m), lambda i, j: X[i, j] * Y[i, j], name="P")
    k = te.reduce_axis((0, m), name="k")
    S = te.compute((n,), lambda i: te.sum(X[i, k], axis=k), name="S")
    return _fn([P, S], [X, Y, P, S])


@pytest.fixture(scope="module")
def mul_backward():
    """The vector-Jacobian product of P = X * Y: dX = G * Y, dY = G * X."""
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), "float64", name="X")
    Y = te.placeholder((n, m), "float64", name="Y")
    G = te.placeholder((n, m), "float64", name="G")
    dX = te.compute((n, m), lambda i, j: G[i, j] * Y[i, j], name="dX")
    dY = te.compute((n, m), lambda i, j: G[i, j] * X[i, j], name="dY")
    return _fn([dX, dY], [X, Y, G, dX, dY], name="mul_bwd")


@pytest.fixture(scope="module")
def mul_only():
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), "float64", name="X")
    Y = te.placeholder((n, m), "float64", name="Y")
    P = te.compute((n, m), lambda i, j: X[i, j] * Y[i, j], name="P")
    return _fn(P, [X, Y, P], name="mul")


def test_jit_runs_the_kernel_as_one_custom_call(scale_add, rng):
    g = rjax.ffi_func(scale_add)
    for shape in [(3, 4), (17, 5), (1, 1), (0, 3)]:
        a = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal(shape[1]).astype(np.float32)
        f = jax.jit(lambda x, y: g(x, y) * 2.0)
        np.testing.assert_array_equal(np.asarray(f(a, b)), ((a * b + 1) * 2).astype(np.float32))
        np.testing.assert_array_equal(np.asarray(g(a, b)), a * b + 1)
    hlo = jax.jit(g).lower(a, b).as_text()
    assert "stablehlo.custom_call @rivet" in hlo and "rivet_function" in hlo
    # Inside jit with other JAX ops around it, and on a jax.Array input.
    x = jnp.asarray(rng.standard_normal((6, 2)).astype(np.float32))
    y = jnp.asarray(rng.standard_normal(2).astype(np.float32))
    out = jax.jit(lambda x, y: jnp.sum(g(jnp.sin(x), y), axis=1))(x, y)
    np.testing.assert_allclose(np.asarray(out), np.sum(np.sin(np.asarray(x)) * np.asarray(y) + 1, axis=1), rtol=1e-5)


def test_float64_inputs_without_x64_are_refused_at_trace_time(mul_parts, rng):
    # Without x64, JAX holds float64 numpy inputs as float32: the kernel's signature refuses
    # them before anything runs, with rivet's dtype error naming the argument.
    assert not jax.config.jax_enable_x64
    g = rjax.ffi_func(mul_parts)
    x = rng.standard_normal((5, 7))
    with pytest.raises(rivet.DTypeError, match="argument 0 .'X'. has dtype float32"):
        jax.jit(g)(x, x)


def test_float64_kernels_with_x64(mul_parts, mul_only, mul_backward, rng):
    with jax.enable_x64(True):
        g = rjax.ffi_func(mul_parts)
        x, y = rng.standard_normal((5, 7)), rng.standard_normal((5, 7))
        p, s = jax.jit(g)(x, y)  # several outputs: a tuple
        np.testing.assert_array_equal(np.asarray(p), x * y)
        np.testing.assert_allclose(np.asarray(s), x.sum(axis=1), rtol=1e-12)

        # grad through a given backward rivet function.
        h = rjax.ffi_func(mul_only, backward=mul_backward)
        loss = lambda x, y: jnp.sum(jnp.cos(h(x, y)))  # noqa: E731
        dx, dy = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, y)
        np.testing.assert_allclose(np.asarray(dx), -np.sin(x * y) * y, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(dy), -np.sin(x * y) * x, rtol=1e-12)
        # Numerical check of the whole VJP in float64 (JAX's own checker, reverse mode).
        from jax.test_util import check_grads

        check_grads(lambda x, y: jnp.sin(h(x, y)), (x, y), order=1, modes=["rev"])

        # No backward: a clear rivet error naming the function and why.
        plain = rjax.ffi_func(mul_only, backward=None)
        with pytest.raises(rivet.NotDifferentiableError, match=r"ffi_func\(mul\).*backward=None"):
            jax.grad(lambda x, y: jnp.sum(plain(x, y)))(x, y)
        # A backward that returns the wrong number of gradients.
        n, m = te.var("n"), te.var("m")
        X = te.placeholder((n, m), "float64", name="X")
        Y = te.placeholder((n, m), "float64", name="Y")
        G = te.placeholder((n, m), "float64", name="G")
        dX = te.compute((n, m), lambda i, j: G[i, j] * Y[i, j] + X[i, j] * 0.0, name="dX")
        only_dx = _fn(dX, [X, Y, G, dX], name="only_dx")
        wrong = rjax.ffi_func(mul_only, backward=only_dx)
        with pytest.raises(rivet.ArgumentError, match="returns 1 gradient.*2 input.*2 of them float"):
            jax.grad(lambda x, y: jnp.sum(wrong(x, y)))(x, y)


def test_auto_backward_matches_jax_grad(mul_parts, rng):
    """No backward written: jax.grad through the function's own backward (Function.backward(),
    from te.gradient), two outputs (their VJPs add up), jit, float64, checked numerically."""
    with jax.enable_x64(True):
        g = rjax.ffi_func(mul_parts)
        x, y = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))

        def loss(x, y):
            p, s = g(x, y)
            return jnp.sum(jnp.sin(p)) + jnp.sum(s * jnp.arange(4.0))

        def ref(x, y):
            return jnp.sum(jnp.sin(x * y)) + jnp.sum(jnp.sum(x, axis=1) * jnp.arange(4.0))

        got = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, y)
        want = jax.grad(ref, argnums=(0, 1))(x, y)
        for a, e in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-12, atol=1e-12)
        from jax.test_util import check_grads

        check_grads(lambda x, y: jnp.tanh(g(x, y)[0]), (x, y), order=1, modes=["rev"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_saved_activations_under_jax_grad(rng, dtype):
    """rivet.kernels' softmax and layer_norm under jax.grad: the forward JAX runs for the
    VJP is Function.training_pair()'s (it also writes the residuals), the backward reads
    them; the plain forward runs outside differentiation. Gradients equal JAX's own."""
    with jax.enable_x64(dtype == "float64"):
        sm = rjax.ffi_func(rivet.kernels.softmax(dtype))
        ln = rjax.ffi_func(rivet.kernels.layer_norm(dtype))
        x = rng.standard_normal((5, 8)).astype(dtype)
        gm, bt = rng.standard_normal(8).astype(dtype), rng.standard_normal(8).astype(dtype)
        w = jnp.arange(8.0, dtype=dtype)

        def loss(x, g, b):
            return jnp.sum(sm(ln(x, g, b)) * w)

        def ref(x, g, b):
            mu = x.mean(-1, keepdims=True)
            var = ((x - mu) ** 2).mean(-1, keepdims=True)
            y = (x - mu) / jnp.sqrt(var + 1e-5) * g + b
            return jnp.sum(jax.nn.softmax(y, -1) * w)

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, gm, bt))
        assert "rivet.jax.softmax_fwd#" in text and "softmax_backward_saved#" in text, text
        assert "rivet.jax.softmax#" not in text, text
        tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
        for a, e in zip(grad(x, gm, bt), jax.grad(ref, argnums=(0, 1, 2))(x, gm, bt)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(e), **tol)
        # Outside differentiation, the plain forward.
        np.testing.assert_allclose(np.asarray(jax.jit(sm)(x)), np.asarray(jax.nn.softmax(x, -1)),
                                   **tol)


def test_auto_backward_with_an_int_input_and_float32(rng):
    """An int input gets a float0 cotangent; its values still scale the float gradient."""
    n, m = te.var("n"), te.var("m")
    T = te.placeholder((n, m), "float32", name="T")
    k = te.placeholder((m,), "int32", name="k")
    G = te.compute((n, m), lambda i, j: T[i, j] * te.cast("float32", k[j]), name="G")
    h = rjax.ffi_func(_fn(G, [T, k, G], name="scale_by_int"))
    t = rng.standard_normal((5, 7)).astype(np.float32)
    ks = rng.integers(-4, 5, size=7).astype(np.int32)
    gt = jax.jit(jax.grad(lambda t, k: jnp.sum(h(t, k) ** 2)))(t, ks)
    want = jax.grad(lambda t, k: jnp.sum((t * k.astype(jnp.float32)) ** 2))(t, ks)
    np.testing.assert_allclose(np.asarray(gt), np.asarray(want), rtol=1e-5, atol=1e-6)
    # Both argnums: the int one's cotangent is float0, as for JAX's own functions.
    _, gk = jax.grad(lambda t, k: jnp.sum(h(t, k)), argnums=(0, 1), allow_int=True)(t, ks)
    assert gk.dtype == jax.dtypes.float0 and gk.shape == ks.shape


def test_auto_backward_refused_for_a_loaded_module(rng, tmp_path):
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] * 2.0, name="C")
    rivet.build(rivet.create_schedule(C), [A, C], name="dbl").save(str(tmp_path / "d.rivet"))
    h = rjax.ffi_func(rivet.load_module(str(tmp_path / "d.rivet"))["dbl"])
    a = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(h)(a)), a * 2)  # the forward works
    with pytest.raises(rivet.NotDifferentiableError, match="loaded from a saved module"):
        jax.grad(lambda a: jnp.sum(h(a)))(a)


def test_vmap_runs_the_kernel_once_per_batch_element(scale_add, rng):
    g = rjax.ffi_func(scale_add)
    a = rng.standard_normal((4, 3, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    out = jax.jit(jax.vmap(g, in_axes=(0, None)))(a, b)
    np.testing.assert_array_equal(np.asarray(out), a * b + 1)
    bb = rng.standard_normal((4, 5)).astype(np.float32)
    out = jax.vmap(g)(a, bb)
    np.testing.assert_array_equal(np.asarray(out), a * bb[:, None, :] + 1)


def test_bad_calls_fail_at_trace_time_with_rivet_errors(scale_add, rng):
    g = rjax.ffi_func(scale_add)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(rivet.ShapeError, match="'B'"):
        g(a, np.zeros(5, np.float32))
    with pytest.raises(rivet.ShapeError, match="rank"):
        g(a, np.zeros((4, 1), np.float32))
    with pytest.raises(rivet.DTypeError, match="int32"):
        g(a, np.zeros(4, np.int32))
    with pytest.raises(rivet.ArgumentError, match="takes 2 inputs"):
        g(a)
    with pytest.raises(rivet.ArgumentError, match="must be an array"):
        g(a, [1.0, 2.0, 3.0, 4.0])
    # Functions that cannot say their outputs' shapes (not compiled) are refused clearly.
    nop = rjax.ffi_func("testing.nop")
    with pytest.raises(rivet.ArgumentError, match="cannot say"):
        nop(a)
    with pytest.raises(rivet.ArgumentError, match="must be a rivet.Function"):
        rjax.ffi_func(42)
    with pytest.raises(rivet.FunctionNotFoundError):
        rjax.ffi_func("no.such.function")


def test_a_custom_call_naming_an_unknown_function_is_an_xla_error(rng):
    # A hand-made custom call (as a stale persistent-cache entry would be): the handler reports
    # rivet's error through XLA instead of touching memory.
    rjax._register_target()
    a = rng.standard_normal(3).astype(np.float32)
    call = jax.ffi.ffi_call(rjax.TARGET, jax.ShapeDtypeStruct((3,), np.float32))
    with pytest.raises(Exception, match="rivet FunctionNotFoundError.*no.such"):
        np.asarray(jax.jit(lambda x: call(x, rivet_function="no.such"))(a))
    with pytest.raises(Exception, match="rivet_function"):
        np.asarray(jax.jit(lambda x: call(x, other=np.int64(3)))(a))


def test_static_shapes_and_an_expression_dim(rng):
    # Fixed sizes (no te.var), and an output whose size is an expression of an input's: the
    # output types come from the program, and a wrong fixed size is refused at trace time.
    A = te.placeholder((3, 5), "float32", name="A")
    C = te.compute((3, 5), lambda i, j: A[i, j] * 2.0, name="C")
    g = rjax.ffi_func(_fn(C, [A, C], name="static"))
    a = rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(g)(a)), a * 2)
    with pytest.raises(rivet.ShapeError, match="dim 1"):
        g(np.zeros((3, 4), np.float32))
    n = te.var("n")
    X = te.placeholder((n,), "float32", name="X")
    Y = te.compute((n + 1,), lambda i: te.if_then_else(i < n, X[te.min(i, n - 1)], 0.0), name="Y")
    h = rjax.ffi_func(_fn(Y, [X, Y], name="pad1"))
    x = rng.standard_normal(6).astype(np.float32)
    y = jax.jit(h)(x)
    assert y.shape == (7,)
    np.testing.assert_array_equal(np.asarray(y), np.append(x, 0))


def _cuda_double():
    """C = 2 A built for CUDA (compiles with NVRTC here; runs only on a GPU)."""
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] * 2.0, name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=64)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    return rivet.build(s, [A, C], target="cuda", name="dbl")["dbl"]


def test_a_cuda_function_on_the_cpu_platform_is_a_device_error():
    h = rjax.ffi_func(_cuda_double())  # wraps: XLA's CUDA platform has a handler
    x = jnp.asarray(np.random.default_rng(3).standard_normal(5).astype(np.float32))
    # A concrete CPU jax.Array: refused at the call, naming the argument and both sides.
    with pytest.raises(rivet.DeviceError, match=r"dbl: argument 0 \('A'\) is a jax.Array on cpu, but the function was built for cuda"):
        h(x)
    # Traced: the platform is known only when XLA runs it; the CPU handler's call reports it.
    with pytest.raises(Exception, match=r"rivet DeviceError: dbl: built for 'cuda', called with tensors on cpu"):
        jax.jit(h)(x).block_until_ready()


def test_a_cpu_function_checks_concrete_arrays_against_its_platform(scale_add):
    # On this machine every jax.Array is on the CPU: the check passes and the call runs.
    h = rjax.ffi_func(scale_add)
    a = jnp.asarray(np.ones((2, 3), np.float32))
    b = jnp.asarray(np.full(3, 2.0, np.float32))
    np.testing.assert_array_equal(np.asarray(h(a, b)), np.full((2, 3), 3.0, np.float32))
    assert rjax._built_for(scale_add) == "cpu"
    assert rjax._built_for(_cuda_double()) == "gpu"


def test_the_target_is_registered_for_the_cpu_and_cuda_platforms():
    import ctypes

    from jaxlib import xla_client

    rjax._register_target()
    lib = ctypes.CDLL(rivet._native.__file__)
    want = {
        "cpu": ctypes.cast(lib.rivet_xla_ffi_handler, ctypes.c_void_p).value,
        "CUDA": ctypes.cast(lib.rivet_xla_ffi_handler_cuda, ctypes.c_void_p).value,
    }
    assert want["cpu"] != want["CUDA"]
    pointer = ctypes.pythonapi.PyCapsule_GetPointer
    pointer.restype, pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    # Without a CUDA plugin jaxlib queues the CUDA registration for when one loads (and the CPU
    # one went straight to XLA); the queue is jaxlib's, so this reads what rivet handed it.
    queued = getattr(xla_client, "_custom_callback", {}).get("CUDA", [])
    entries = [e for e in queued if e[0] == rjax.TARGET]
    if not entries and not hasattr(xla_client, "_custom_callback"):
        pytest.skip("this jaxlib keeps no queue of registrations to read back")
    if entries:
        assert pointer(entries[0][1], None) == want["CUDA"]
        assert entries[0][2] == 1, "typed FFI (api_version 1)"
    else:
        # A CUDA plugin is loaded: the registration went to XLA directly.
        assert any(d.platform == "gpu" for d in jax.devices()), queued


def test_a_program_with_a_rivet_call_lowers_for_cuda():
    # The custom call is the same on every platform: a GPU program holds it as the CPU one does.
    h = rjax.ffi_func(_cuda_double())
    exp = jax.export.export(
        jax.jit(h),
        platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(rjax.TARGET)],
    )(jax.ShapeDtypeStruct((5,), np.float32))
    text = exp.mlir_module()
    assert exp.platforms == ("cuda",)
    assert "stablehlo.custom_call @rivet" in text and 'rivet_function = "rivet.jax.dbl#' in text


@pytest.mark.gpu
def test_a_cuda_function_runs_inside_jit_and_grad_on_xlas_stream():
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX has no GPU here (jax[cuda] not installed)")
    f = _cuda_double()
    h = rjax.ffi_func(f)
    rng = np.random.default_rng(11)
    for size in (1, 7, 56, 1000, 1023):
        x = jax.device_put(rng.standard_normal(size).astype(np.float32), gpus[0])
        y = jax.jit(lambda v: h(v) + 1.0)(x)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x) * 2 + 1)
    # Queued behind XLA's own work on its stream, no synchronize in between.
    x = jax.device_put(rng.standard_normal(1 << 20).astype(np.float32), gpus[0])
    y = jax.jit(lambda v: h(jnp.sin(v) * 3.0).sum())(x)
    np.testing.assert_allclose(float(y), float(np.sum(np.sin(np.asarray(x)) * 6.0)), rtol=1e-4)
    g = jax.grad(lambda v: jnp.sum(h(v) ** 2))(x[:1000])
    np.testing.assert_allclose(np.asarray(g), 8.0 * np.asarray(x[:1000]), rtol=1e-6)


def test_registering_the_target_leaves_ctypes_pythonapi_alone():
    # jax.ffi.pycapsule sets argtypes on the shared ctypes.pythonapi.PyCapsule_New; rivet makes
    # its capsule without touching it (other code, e.g. these tests' DLPack producers, uses it).
    import ctypes

    before = (ctypes.pythonapi.PyCapsule_New.argtypes, ctypes.pythonapi.PyCapsule_New.restype)
    rjax._registered = False
    try:
        rjax._register_target()
    finally:
        rjax._registered = True
    after = (ctypes.pythonapi.PyCapsule_New.argtypes, ctypes.pythonapi.PyCapsule_New.restype)
    assert before == after
