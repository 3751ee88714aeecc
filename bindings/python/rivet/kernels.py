"""Kernels defined in Rust with rivet's DSL (``compiler/src/kernels``), compiled on first use
for the dtype and shape pattern asked, cached, and returned as ``rivet.Function``s.

Dims are symbolic: one function serves every size. Inputs come first, then the output; leave
the output out to have it allocated and returned (wrap with ``rivet.to_pytorch_func`` to get
torch tensors back).

Each kernel is defined once and scheduled per target: ``target="cuda"`` uses its GPU
schedule, ``"cpu"`` and ``"interp"`` its CPU one; ``schedule="gpu"`` with ``target="interp"``
runs the GPU schedule with GPU semantics on the CPU (how the GPU schedules are tested without
a GPU).
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn, Optional, Union

from ._native import Function, _kernel
from .error import KernelNotFoundError

# A broadcast shape entry: a size (1 broadcasts) or a dim name.
_Dim = Union[int, str]

__all__ = [
    "matmul", "batch_matmul", "add", "mul", "relu", "gelu", "softmax", "layer_norm",
    "sum", "max", "transpose",
]


def matmul(dtype: str = "float32", target: str = "cpu", schedule: Optional[str] = None) -> Function:
    """``(A[m, k], B[k, n], C[m, n])``: ``C = A @ B``."""
    return _kernel("matmul", dtype, target, schedule=schedule)


def batch_matmul(dtype: str = "float32", target: str = "cpu", schedule: Optional[str] = None) -> Function:
    """``(A[b, m, k], B[b, k, n], C[b, m, n])``: ``C[i] = A[i] @ B[i]``."""
    return _kernel("batch_matmul", dtype, target, schedule=schedule)


def add(
    dtype: str = "float32",
    a_shape: Sequence[_Dim] = ("n",),
    b_shape: Sequence[_Dim] = ("n",),
    target: str = "cpu",
    schedule: Optional[str] = None,
) -> Function:
    """``(A, B, C)``: ``C = A + B`` with numpy broadcasting. A shape entry is a size (1
    broadcasts) or a dim name, e.g. ``add("float32", ("n", 1), (1, "m"))``."""
    return _kernel("add", dtype, target, schedule=schedule, a_shape=list(a_shape), b_shape=list(b_shape))


def mul(
    dtype: str = "float32",
    a_shape: Sequence[_Dim] = ("n",),
    b_shape: Sequence[_Dim] = ("n",),
    target: str = "cpu",
    schedule: Optional[str] = None,
) -> Function:
    """``(A, B, C)``: ``C = A * B`` with numpy broadcasting (see ``add``)."""
    return _kernel("mul", dtype, target, schedule=schedule, a_shape=list(a_shape), b_shape=list(b_shape))


def relu(dtype: str = "float32", ndim: int = 2, target: str = "cpu", schedule: Optional[str] = None) -> Function:
    """``(X, Y)``: ``Y = max(X, 0)``."""
    return _kernel("relu", dtype, target, schedule=schedule, ndim=ndim)


def gelu(dtype: str = "float32", ndim: int = 2, target: str = "cpu", schedule: Optional[str] = None) -> Function:
    """``(X, Y)``: exact GELU, ``0.5 * x * (1 + erf(x / sqrt(2)))``."""
    return _kernel("gelu", dtype, target, schedule=schedule, ndim=ndim)


def softmax(
    dtype: str = "float32", ndim: int = 2, axis: int = -1, target: str = "cpu", schedule: Optional[str] = None
) -> Function:
    """``(X, Y)``: softmax over ``axis`` (max-subtracted)."""
    return _kernel("softmax", dtype, target, schedule=schedule, ndim=ndim, axis=axis)


def layer_norm(
    dtype: str = "float32", ndim: int = 2, eps: float = 1e-5, target: str = "cpu", schedule: Optional[str] = None
) -> Function:
    """``(X[..., n], gamma[n], beta[n], Y)``: normalisation over the last axis."""
    return _kernel("layer_norm", dtype, target, schedule=schedule, ndim=ndim, eps=eps)


def sum(  # noqa: A001 - mirrors numpy
    dtype: str = "float32", ndim: int = 2, axis: int = -1, target: str = "cpu", schedule: Optional[str] = None
) -> Function:
    """``(X, Y)``: sum over ``axis`` (removed from Y's shape)."""
    return _kernel("sum", dtype, target, schedule=schedule, ndim=ndim, axis=axis)


def max(  # noqa: A001 - mirrors numpy
    dtype: str = "float32", ndim: int = 2, axis: int = -1, target: str = "cpu", schedule: Optional[str] = None
) -> Function:
    """``(X, Y)``: maximum over ``axis`` (removed from Y's shape)."""
    return _kernel("max", dtype, target, schedule=schedule, ndim=ndim, axis=axis)


def transpose(
    dtype: str = "float32", perm: Sequence[int] = (1, 0), target: str = "cpu", schedule: Optional[str] = None
) -> Function:
    """``(X, Y)``: ``Y = X.permute(perm)`` (a compact copy)."""
    return _kernel("transpose", dtype, target, schedule=schedule, perm=list(perm))


# Hidden from type checkers, so a misspelt kernel is a static error, not NoReturn.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> NoReturn:
        # Unknown names are rivet errors that list what exists (and AttributeErrors, for hasattr).
        if name.startswith("__"):
            raise AttributeError(name)
        raise KernelNotFoundError(
            f"rivet.kernels has no kernel '{name}'; it has: {', '.join(__all__)}"
        )
