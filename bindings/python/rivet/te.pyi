# Type stubs for rivet.te (te.py). Every name of te.__all__ has an entry here;
# tests/python/test_typing.py checks that none is missing.
from collections.abc import Callable, Sequence
from typing import Protocol, TypeAlias, overload, type_check_only

from ._native import Expr as Expr
from ._native import IterVar as IterVar
from ._native import Function, Schedule
from ._native import Op as Op
from ._native import TeTensor as Tensor

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

@type_check_only
class _NamedDType(Protocol):
    # numpy.dtype
    @property
    def name(self) -> str: ...

@type_check_only
class _TorchDType(Protocol):
    # torch.dtype (its str() is "torch.float32")
    @property
    def is_floating_point(self) -> bool: ...
    @property
    def itemsize(self) -> int: ...

# A dtype: a name ("float32"), a numpy dtype or scalar type (np.float32), a torch dtype.
_DTypeLike: TypeAlias = str | type | _NamedDType | _TorchDType
# A number or an expression, where the DSL takes an expression.
_ExprLike: TypeAlias = Expr | int | float | bool
# A te shape entry: a size or an int64 expression (te.var).
_Dim: TypeAlias = int | Expr
_Shape: TypeAlias = _Dim | Sequence[_Dim]
# A reduction's axes: one te.reduce_axis or several.
_Axes: TypeAlias = IterVar | Sequence[IterVar]

class ThreadAxis:
    tag: str
    def __init__(self, tag: str) -> None: ...

def thread_axis(tag: str) -> ThreadAxis: ...
def var(name: str = "n", dtype: _DTypeLike = "int64") -> Expr: ...

size_var = var

def const(value: int | float | bool, dtype: _DTypeLike | None = None) -> Expr: ...
def placeholder(shape: _Shape, dtype: _DTypeLike = "float32", name: str = "placeholder") -> Tensor: ...
def reduce_axis(dom: tuple[_Dim, _Dim] | Sequence[_Dim], name: str = "rv") -> IterVar: ...
def compute(shape: _Shape, fcompute: Callable[..., _ExprLike], name: str = "compute") -> Tensor: ...
def extern(
    shape: _Shape,
    inputs: Sequence[Tensor],
    func: str | Function | Callable[..., object],
    dtype: str = "float32",
    name: str = "extern",
) -> Tensor: ...
def stop_gradient(tensor: Tensor) -> Tensor: ...
def gradient(
    output: Tensor, inputs: Sequence[Tensor], head: Tensor | None = None
) -> list[Tensor]: ...
def create_schedule(outputs: Tensor | Sequence[Tensor]) -> Schedule: ...
def default_gpu_schedule(outputs: Tensor | Sequence[Tensor]) -> Schedule: ...
def sum(expr: _ExprLike, axis: _Axes | None = None) -> Expr: ...
def prod(expr: _ExprLike, axis: _Axes | None = None) -> Expr: ...
# te.max(x, axis=k): a reduction; te.max(a, b): elementwise.
def max(expr: _ExprLike, b: _ExprLike | _Axes | None = None, axis: _Axes | None = None) -> Expr: ...
def min(expr: _ExprLike, b: _ExprLike | _Axes | None = None, axis: _Axes | None = None) -> Expr: ...
def cast(dtype: _DTypeLike, expr: _ExprLike) -> Expr: ...
def if_then_else(cond: _ExprLike, t: _ExprLike, f: _ExprLike) -> Expr: ...
@overload
def all(conds: Sequence[_ExprLike], /) -> Expr: ...
@overload
def all(*conds: _ExprLike) -> Expr: ...
@overload
def any(conds: Sequence[_ExprLike], /) -> Expr: ...
@overload
def any(*conds: _ExprLike) -> Expr: ...
def logical_and(a: _ExprLike, b: _ExprLike) -> Expr: ...
def logical_or(a: _ExprLike, b: _ExprLike) -> Expr: ...
def logical_not(cond: _ExprLike) -> Expr: ...
def exp(x: _ExprLike) -> Expr: ...
def log(x: _ExprLike) -> Expr: ...
def sqrt(x: _ExprLike) -> Expr: ...
def rsqrt(x: _ExprLike) -> Expr: ...
def tanh(x: _ExprLike) -> Expr: ...
def sigmoid(x: _ExprLike) -> Expr: ...
def abs(x: _ExprLike) -> Expr: ...
def floor(x: _ExprLike) -> Expr: ...
def ceil(x: _ExprLike) -> Expr: ...
def erf(x: _ExprLike) -> Expr: ...
def pow(x: _ExprLike, y: _ExprLike) -> Expr: ...
def floordiv(a: _ExprLike, b: _ExprLike) -> Expr: ...
def floormod(a: _ExprLike, b: _ExprLike) -> Expr: ...

