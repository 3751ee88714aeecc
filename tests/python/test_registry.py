"""The global function registry and Python callbacks."""

import traceback

import numpy as np
import pytest
import torch

import rivet


def test_builtin_functions_listed():
    names = list(rivet.list_global_funcs())
    assert all(isinstance(n, str) for n in names)
    assert "testing.axpy" in names
    assert "testing.echo" in names


def test_get_global_func_types(axpy, echo):
    assert isinstance(axpy, rivet.Function)
    assert isinstance(echo, rivet.Function)
    assert callable(axpy)
    assert rivet.get_global_func("nope.nothing", allow_missing=True) is None
    with pytest.raises(rivet.FunctionNotFoundError, match="nope.nothing"):
        rivet.get_global_func("nope.nothing")


def test_register_as_call(uname):
    name = uname()

    def add(a, b):
        return a + b

    rivet.register_func(name, add)
    assert name in rivet.list_global_funcs()
    f = rivet.get_global_func(name)
    assert isinstance(f, rivet.Function)
    assert f(2, 3) == 5
    assert f(1.5, 2.25) == 3.75
    assert f("ab", "cd") == "abcd"


def test_register_as_decorator(uname):
    name = uname()

    @rivet.register_func(name)
    def scale(a, k):
        return a * k

    assert callable(scale)
    assert name in rivet.list_global_funcs()
    assert rivet.get_global_func(name)(3, 4) == 12


def test_register_override(uname):
    name = uname()
    rivet.register_func(name, lambda: "first")
    with pytest.raises(rivet.RegistryError):
        rivet.register_func(name, lambda: "second")
    assert rivet.get_global_func(name)() == "first"
    rivet.register_func(name, lambda: "second", override=True)
    assert rivet.get_global_func(name)() == "second"

    @rivet.register_func(name, override=True)
    def third():
        return "third"

    assert rivet.get_global_func(name)() == "third"


def test_register_native_function_under_new_name(uname, h, rng, axpy):
    name = uname()
    rivet.register_func(name, axpy)
    f = rivet.get_global_func(name)
    x = h.random_array(rng, (5,), np.float64)
    y = h.random_array(rng, (5,), np.float64)
    ref = h.ref_axpy(2.0, x, y)
    f(2.0, x, y)
    h.assert_close(y, ref)


def test_echo_scalars(echo):
    for v in (0, 7, -3, 2**40, 1.5, -0.0, "hello", "", "ünïcode", None, True, False):
        out = echo(v)
        assert out == v
        assert type(out) is type(v), (v, out)


def test_echo_tensor_is_view(h, rng, echo):
    a = h.random_array(rng, (3, 4), np.float32)
    out = echo(a)
    assert isinstance(out, rivet.Tensor)
    assert out.data_ptr == a.ctypes.data
    assert out.shape == (3, 4)
    t = torch.from_numpy(h.random_array(rng, (5,), np.float64))
    out2 = echo(t)
    assert isinstance(out2, rivet.Tensor)
    assert out2.data_ptr == t.data_ptr()
    out2.numpy()[0] = 123.0
    assert t[0].item() == 123.0


def test_echo_python_callable_comes_back_callable(echo):
    g = echo(lambda a: a + 1)
    assert callable(g)
    assert g(41) == 42


def test_echo_rivet_function(h, rng, echo, axpy):
    f = echo(axpy)
    assert callable(f)
    x = h.random_array(rng, (4,), np.float32)
    y = h.random_array(rng, (4,), np.float32)
    ref = h.ref_axpy(3.0, x, y)
    f(3.0, x, y)
    h.assert_close(y, ref)


def test_python_callback_argument_types(h, rng, uname):
    seen = []

    def record(*args):
        seen.append(args)
        return len(args)

    name = uname()
    rivet.register_func(name, record)
    f = rivet.get_global_func(name)
    a = h.random_array(rng, (2, 3), np.float32)
    t = torch.from_numpy(h.random_array(rng, (4,), np.float64))
    n = f(1, 2.5, "s", True, None, a, t)
    assert n == 7
    args = seen[-1]
    assert args[0] == 1 and type(args[0]) is int
    assert args[1] == 2.5 and type(args[1]) is float
    assert args[2] == "s" and type(args[2]) is str
    assert args[3] is True
    assert args[4] is None
    assert isinstance(args[5], rivet.Tensor)
    assert args[5].data_ptr == a.ctypes.data
    assert args[5].shape == (2, 3) and args[5].dtype == "float32"
    assert isinstance(args[6], rivet.Tensor)
    assert args[6].data_ptr == t.data_ptr()
    assert args[6].dtype == "float64"
    # the callback may write through the tensor it got
    np.testing.assert_array_equal(args[5].numpy(), a)


def test_python_callback_return_types(uname, h, rng):
    name = uname()
    rivet.register_func(name, lambda v: v)
    f = rivet.get_global_func(name)
    for v in (3, -1.25, "x", None, True, False):
        out = f(v)
        assert out == v and type(out) is type(v)
    a = h.random_array(rng, (3,), np.float32)
    r = f(rivet.from_dlpack(a))
    assert isinstance(r, rivet.Tensor)
    assert r.data_ptr == a.ctypes.data


def test_python_callback_writes_tensor(uname, h, rng):
    name = uname()

    def fill(t, v):
        t.numpy()[...] = v

    rivet.register_func(name, fill)
    y = torch.from_numpy(h.random_array(rng, (6,), np.float32))
    assert rivet.get_global_func(name)(y, 2.5) is None
    assert torch.all(y == 2.5)


def test_python_callback_receives_function(uname):
    name = uname()

    def apply(fn, v):
        return fn(v)

    rivet.register_func(name, apply)
    f = rivet.get_global_func(name)
    assert f(lambda v: v * 2, 21) == 42
    # and a native function handed to a Python callback
    echo = rivet.get_global_func("testing.echo")
    assert f(echo, "round") == "round"


def test_python_callback_calls_native(uname, h, rng):
    name = uname()

    def twice(alpha, x, y):
        axpy = rivet.get_global_func("testing.axpy")
        axpy(alpha, x, y)
        axpy(alpha, x, y)

    rivet.register_func(name, twice)
    x = h.random_array(rng, (10,), np.float64)
    y = h.random_array(rng, (10,), np.float64)
    ref = (2 * 0.5 * x.astype(np.float64) + y).astype(np.float64)
    rivet.get_global_func(name)(0.5, x, y)
    h.assert_close(y, ref)


class MyErr(Exception):
    pass


def test_callback_exception_propagates(uname):
    raised = []

    def failing_callback_xyz(a):
        e = MyErr("bad value %r" % (a,))
        raised.append(e)
        raise e

    name = uname()
    rivet.register_func(name, failing_callback_xyz)
    f = rivet.get_global_func(name)
    with pytest.raises(MyErr) as ei:
        f(17)
    assert ei.value is raised[0]
    assert "bad value 17" in str(ei.value)
    text = "".join(traceback.format_exception(ei.value))
    assert "failing_callback_xyz" in text
    assert "MyErr" in text
    # the registry still works afterwards
    assert rivet.get_global_func("testing.echo")(5) == 5


def test_callback_exception_through_echo(echo):
    def raiser_fn_abc():
        raise MyErr("from inside")

    g = echo(raiser_fn_abc)
    with pytest.raises(MyErr, match="from inside") as ei:
        g()
    assert "raiser_fn_abc" in "".join(traceback.format_exception(ei.value))


def test_callback_exception_nested(uname):
    inner_name, outer_name = uname("inner"), uname("outer")

    def inner_raiser_q(v):
        raise KeyError(v)

    def outer_caller_q(v):
        return rivet.get_global_func(inner_name)(v)

    rivet.register_func(inner_name, inner_raiser_q)
    rivet.register_func(outer_name, outer_caller_q)
    with pytest.raises(KeyError) as ei:
        rivet.get_global_func(outer_name)("k")
    text = "".join(traceback.format_exception(ei.value))
    assert "inner_raiser_q" in text and "outer_caller_q" in text


def test_callback_builtin_exception_types(uname):
    for exc in (ValueError("v"), TypeError("t"), ZeroDivisionError("z"), RuntimeError("r")):
        name = uname()

        def f(exc=exc):
            raise exc

        rivet.register_func(name, f)
        with pytest.raises(type(exc)) as ei:
            rivet.get_global_func(name)()
        assert ei.value is exc


def test_callback_wrong_arity_is_python_typeerror(uname):
    name = uname()
    rivet.register_func(name, lambda a: a)
    with pytest.raises(TypeError):
        rivet.get_global_func(name)(1, 2)
