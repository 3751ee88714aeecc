"""rivet.te: the tensor-expression DSL (TVM's ``te`` shape).

::

    from rivet import te
    n = te.var("n")
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")

Expressions (:class:`Expr`) are typed and checked as they are built: a type-rule violation
(``i / 2`` on int64, adding float32 to float64, ``~`` on a non-bool) raises
``rivet.CompileError`` at once. Python numbers take the other operand's dtype (``A[i] * 2``
stays float32, ``i + 1`` stays int64, ``i * 2.0`` is ``i * 2``); a number that dtype cannot
hold (``i * 0.5``, ``x_int8 + 300``) raises ``rivet.CompileError``, as in the Rust DSL (one
rule, ``rivet_compiler::te::number``); a Python bool is a bool constant; where no operand is
an expression, numbers default to bool / int64 / float32. ``//`` and ``%`` follow Python
(round toward -inf, the remainder takes the divisor's sign) for ints and floats.

The classes and the type rules live in Rust (``rivet._native``); this module only shapes the
arguments.
"""

import builtins as _builtins
import inspect as _inspect

from . import _native
from .error import CompileError as _CompileError

Expr = _native.Expr
IterVar = _native.IterVar
Tensor = _native.TeTensor
Op = _native.Op

__all__ = [
    "Expr",
    "IterVar",
    "ThreadAxis",
    "thread_axis",
    "Tensor",
    "Op",
    "var",
    "size_var",
    "const",
    "placeholder",
    "reduce_axis",
    "compute",
    "extern",
    "create_schedule",
    "default_gpu_schedule",
    "sum",
    "prod",
    "max",
    "min",
    "cast",
    "if_then_else",
    "all",
    "any",
    "logical_not",
    "logical_and",
    "logical_or",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "tanh",
    "sigmoid",
    "abs",
    "pow",
    "floor",
    "ceil",
    "erf",
    "floordiv",
    "floormod",
    "gradient",
    "stop_gradient",
]

_AXIS_NAMES = ("i", "j", "k", "l", "m", "n", "o", "p")


def _dtype(dtype):
    """A dtype name from a str, a numpy dtype / scalar type or a torch dtype."""
    if isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "name", None)  # numpy dtype
    if isinstance(name, str):
        return name
    name = getattr(dtype, "__name__", None)  # numpy scalar type (np.float32)
    if isinstance(name, str):
        return name
    text = str(dtype)
    return text[len("torch."):] if text.startswith("torch.") else text


def _shape(shape):
    return list(shape) if isinstance(shape, (list, tuple)) else [shape]


def var(name="n", dtype="int64"):
    """A symbolic int64 dimension, bound from the arguments' shapes at call time."""
    return _native.te_var(name, _dtype(dtype))


size_var = var


def const(value, dtype=None):
    """A constant. Without ``dtype``: bool -> bool, int -> int64, float -> float32."""
    return _native.te_const(value, None if dtype is None else _dtype(dtype))


def placeholder(shape, dtype="float32", name="placeholder"):
    """An input tensor of ``shape`` (ints and int64 expressions such as ``te.var``)."""
    return _native.te_placeholder(_shape(shape), _dtype(dtype), name)


def reduce_axis(dom, name="rv"):
    """A reduction axis over ``[lo, hi)``, ``dom = (lo, hi)``."""
    if not isinstance(dom, (list, tuple)) or len(dom) != 2:
        raise _CompileError(f"reduce_axis '{name}': dom must be a (lo, hi) pair, got {dom!r}")
    return _native.te_reduce_axis(dom[0], dom[1], name)


def _axis_names(fcompute, ndim):
    """The lambda's parameter names when it takes exactly ``ndim`` plain positional ones."""
    default = [_AXIS_NAMES[d] if d < len(_AXIS_NAMES) else f"ax{d}" for d in range(ndim)]
    try:
        params = list(_inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        return default, True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = _builtins.any(p.kind == p.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is p.empty]
    if varargs:
        return default, True
    if len(required) > ndim or len(positional) < ndim:
        return default, False
    return [p.name for p in positional[:ndim]], True


def extern(shape, inputs, func, dtype="float32", name="extern"):
    """A stage whose values a host callback computes (TVM's ``te.extern``).

    ``func`` is a Python callable, a ``rivet.Function`` or a registered function's name. On
    every call of the built function, once ``inputs`` (te tensors: placeholders or stages) are
    computed, it is called as ``func(in_0, ..., in_k, out)`` with ``rivet.Tensor`` s:
    read-only copies of the inputs and a fresh writable ``out`` of ``shape`` and ``dtype``
    (use them through DLPack, e.g. ``np.from_dlpack``). It fills ``out`` and returns None, or
    returns an array of that shape and dtype (anything with ``__dlpack__``), which is copied
    into the stage (another shape: ``rivet.ShapeError``; dtype: ``rivet.DTypeError``). Later
    stages read the result like any tensor. See docs/callbacks.md.
    """
    return _native.te_extern(_shape(shape), list(inputs), func, _dtype(dtype), name)


def compute(shape, fcompute, name="compute"):
    """A tensor of ``shape`` whose element at ``(i, j, ...)`` is ``fcompute(i, j, ...)``.

    ``fcompute`` is called once, with one int64 index expression per dim, and must return a
    :class:`Expr` (a reduction such as ``te.sum`` may be the whole body or part of it: a
    reduction inside a larger expression becomes a stage of its own, see docs/dsl.md).
    """
    dims = _shape(shape)
    names, ok = _axis_names(fcompute, len(dims))
    if not ok:
        raise _CompileError(
            f"compute '{name}': the function must take one index argument per dim "
            f"({len(dims)} dims for shape {tuple(dims)!r})"
        )
    axis = [_native.te_axis(ext, nm) for ext, nm in zip(dims, names)]
    body = fcompute(*[a.var for a in axis])
    if isinstance(body, (list, tuple)):
        raise _CompileError(
            f"compute '{name}': the function returned a {type(body).__name__}; "
            "multi-output computes are not supported, make one compute per output"
        )
    return _native.te_compute(dims, axis, body, name)


class ThreadAxis:
    """A GPU launch dimension for ``Stage.bind`` (TVM's ``te.thread_axis``)."""

    __slots__ = ("tag",)

    def __init__(self, tag):
        self.tag = tag

    def __repr__(self):
        return f"te.thread_axis({self.tag!r})"


_THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")


def thread_axis(tag):
    """``"blockIdx.x"`` ... ``"threadIdx.z"``: pass it (or the string) to ``s[C].bind(axis, ...)``."""
    if tag not in _THREAD_TAGS:
        raise _CompileError(f"te.thread_axis: expected one of {', '.join(_THREAD_TAGS)}, got {tag!r}")
    return ThreadAxis(tag)


def create_schedule(outputs):
    """A default schedule of ``outputs`` (a tensor or a list), same as ``rivet.create_schedule``."""
    return _native.create_schedule(outputs)


def default_gpu_schedule(outputs):
    """The default GPU schedule of ``outputs``: what ``rivet.build(..., target="cuda")`` applies
    to a schedule that binds no loop. Injective intermediate stages are inlined; every other
    stage is one kernel (contractions tiled over blocks of threads, the rest fused and spread
    1-D over blocks of 256 threads). Build it for ``"interp"`` to check it on the CPU."""
    return _native.default_gpu_schedule(outputs)


def _is_axis(x):
    if isinstance(x, IterVar):
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and _builtins.all(isinstance(a, IterVar) for a in x)


def _reduction(op, expr, b, axis):
    if axis is None and b is not None and _is_axis(b):
        axis, b = b, None
    if axis is not None:
        if b is not None:
            raise _CompileError(f"te.{op}: give either axis= (a reduction) or a second expression, not both")
        return _native.te_reduce(op, expr, axis)
    return None


def sum(expr, axis=None):
    """Sum of ``expr`` over the reduction axis (or list of axes) ``axis``."""
    if axis is None:
        raise _CompileError("te.sum needs axis= (a te.reduce_axis or a list of them)")
    return _native.te_reduce("sum", expr, axis)


def prod(expr, axis=None):
    """Product of ``expr`` over ``axis``."""
    if axis is None:
        raise _CompileError("te.prod needs axis= (a te.reduce_axis or a list of them)")
    return _native.te_reduce("prod", expr, axis)


def max(expr, b=None, axis=None):
    """``te.max(expr, axis=k)``: maximum over reduction axes; ``te.max(a, b)``: elementwise."""
    r = _reduction("max", expr, b, axis)
    if r is not None:
        return r
    if b is None:
        raise _CompileError("te.max needs axis= (a reduction) or two expressions (elementwise)")
    return _native.te_binary("max", expr, b)


def min(expr, b=None, axis=None):
    """``te.min(expr, axis=k)``: minimum over reduction axes; ``te.min(a, b)``: elementwise."""
    r = _reduction("min", expr, b, axis)
    if r is not None:
        return r
    if b is None:
        raise _CompileError("te.min needs axis= (a reduction) or two expressions (elementwise)")
    return _native.te_binary("min", expr, b)


def cast(dtype, expr):
    """``expr`` converted to ``dtype`` (floats to ints truncate toward zero)."""
    return _native.te_cast(_dtype(dtype), expr)


def if_then_else(cond, t, f):
    """``t`` where the bool ``cond`` holds, else ``f`` (both arms of one dtype)."""
    return _native.te_select(cond, t, f)


def _conds(args, fname):
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = tuple(args[0])
    if not args:
        raise _CompileError(f"te.{fname} needs at least one condition")
    return args


def _one_cond(c, fname):
    if isinstance(c, bool):
        return const(c)
    if not isinstance(c, Expr) or c.dtype != "bool":
        what = f"a {c.dtype} expression ({c!r})" if isinstance(c, Expr) else type(c).__name__
        raise _CompileError(f"te.{fname} needs bool conditions, got {what}")
    return c


def all(*conds):
    """Logical and of bool expressions: ``te.all(a, b, c)``."""
    conds = _conds(conds, "all")
    out = conds[0]
    if len(conds) == 1:
        return _one_cond(out, "all")
    for c in conds[1:]:
        out = _native.te_logic("and", out, c)
    return out


def any(*conds):
    """Logical or of bool expressions: ``te.any(a, b, c)``."""
    conds = _conds(conds, "any")
    out = conds[0]
    if len(conds) == 1:
        return _one_cond(out, "any")
    for c in conds[1:]:
        out = _native.te_logic("or", out, c)
    return out


def logical_and(a, b):
    return _native.te_logic("and", a, b)


def logical_or(a, b):
    return _native.te_logic("or", a, b)


def logical_not(cond):
    """Logical not of a bool expression (same as ``~cond``)."""
    return _native.te_unary("not", cond)


def _unary(opname, doc):
    def f(x):
        return _native.te_unary(opname, x)

    f.__name__ = f.__qualname__ = opname
    f.__doc__ = doc
    return f


exp = _unary("exp", "e ** x (floats).")
log = _unary("log", "Natural logarithm (floats).")
sqrt = _unary("sqrt", "Square root (floats).")
rsqrt = _unary("rsqrt", "1 / sqrt(x) (floats).")
tanh = _unary("tanh", "Hyperbolic tangent (floats).")
sigmoid = _unary("sigmoid", "1 / (1 + exp(-x)) (floats).")
abs = _unary("abs", "Absolute value (ints and floats).")
floor = _unary("floor", "Round toward -inf (floats).")
ceil = _unary("ceil", "Round toward +inf (floats).")
erf = _unary("erf", "The error function (floats).")


def pow(x, y):
    """``x ** y`` (floats)."""
    return _native.te_binary("pow", x, y)


def floordiv(a, b):
    """Python's ``a // b`` (round toward -inf)."""
    return _native.te_binary("floordiv", a, b)


def floormod(a, b):
    """Python's ``a % b`` (the result takes the divisor's sign)."""
    return _native.te_binary("floormod", a, b)


def stop_gradient(tensor):
    """``tensor``'s values as a stage that ``te.gradient`` treats as a constant (JAX's
    ``lax.stop_gradient``): no gradient flows through it into what it reads. An elementwise
    copy that the default schedule inlines (free at run time). The classic use is the max a
    softmax subtracts, whose derivative is zero in exact maths (see docs/gradient.md)."""
    return _native.te_stop_gradient(tensor)


def gradient(output, inputs, head=None):
    """The gradients of ``output`` with respect to ``inputs`` (TVM's ``te.gradient``, as a
    vector-Jacobian product): a list of te tensors, one per input, of its shape and dtype.

    ``head`` is the adjoint of ``output`` (a te tensor of exactly its shape and dtype, usually
    a placeholder); with ``head=None`` the result is the gradient of ``sum(output)``. The
    gradients are ordinary compute stages, so ``rivet.build(rivet.create_schedule(grads),
    [*inputs, head, *grads])`` is the backward function. An input the output does not depend
    on gets zeros; int and bool tensors are refused (``rivet.ArgumentError``); an input reached
    only through a host callback (``te.extern``) is a ``rivet.NotDifferentiableError``. See
    docs/gradient.md.
    """
    return _native.te_gradient(output, inputs, head)
