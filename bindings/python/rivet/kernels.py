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

from ._native import _kernel
from .error import KernelNotFoundError

__all__ = [
    "matmul", "batch_matmul", "add", "mul", "relu", "gelu", "softmax", "layer_norm",
    "sum", "max", "transpose",
]


def matmul(dtype="float32", target="cpu", schedule=None):
    """``(A[m, k], B[k, n], C[m, n])``: ``C = A @ B``."""
    return _kernel("matmul", dtype, target, schedule=schedule)


def batch_matmul(dtype="float32", target="cpu", schedule=None):
    """``(A[b, m, k], B[b, k, n], C[b, m, n])``: ``C[i] = A[i] @ B[i]``."""
    return _kernel("batch_matmul", dtype, target, schedule=schedule)


def add(dtype="float32", a_shape=("n",), b_shape=("n",), target="cpu", schedule=None):
    """``(A, B, C)``: ``C = A + B`` with numpy broadcasting. A shape entry is a size (1
    broadcasts) or a dim name, e.g. ``add("float32", ("n", 1), (1, "m"))``."""
    return _kernel("add", dtype, target, schedule=schedule, a_shape=list(a_shape), b_shape=list(b_shape))


def mul(dtype="float32", a_shape=("n",), b_shape=("n",), target="cpu", schedule=None):
    """``(A, B, C)``: ``C = A * B`` with numpy broadcasting (see ``add``)."""
    return _kernel("mul", dtype, target, schedule=schedule, a_shape=list(a_shape), b_shape=list(b_shape))


def relu(dtype="float32", ndim=2, target="cpu", schedule=None):
    """``(X, Y)``: ``Y = max(X, 0)``."""
    return _kernel("relu", dtype, target, schedule=schedule, ndim=ndim)


def gelu(dtype="float32", ndim=2, target="cpu", schedule=None):
    """``(X, Y)``: exact GELU, ``0.5 * x * (1 + erf(x / sqrt(2)))``."""
    return _kernel("gelu", dtype, target, schedule=schedule, ndim=ndim)


def softmax(dtype="float32", ndim=2, axis=-1, target="cpu", schedule=None):
    """``(X, Y)``: softmax over ``axis`` (max-subtracted)."""
    return _kernel("softmax", dtype, target, schedule=schedule, ndim=ndim, axis=axis)


def layer_norm(dtype="float32", ndim=2, eps=1e-5, target="cpu", schedule=None):
    """``(X[..., n], gamma[n], beta[n], Y)``: normalisation over the last axis."""
    return _kernel("layer_norm", dtype, target, schedule=schedule, ndim=ndim, eps=eps)


def sum(dtype="float32", ndim=2, axis=-1, target="cpu", schedule=None):  # noqa: A001 - mirrors numpy
    """``(X, Y)``: sum over ``axis`` (removed from Y's shape)."""
    return _kernel("sum", dtype, target, schedule=schedule, ndim=ndim, axis=axis)


def max(dtype="float32", ndim=2, axis=-1, target="cpu", schedule=None):  # noqa: A001 - mirrors numpy
    """``(X, Y)``: maximum over ``axis`` (removed from Y's shape)."""
    return _kernel("max", dtype, target, schedule=schedule, ndim=ndim, axis=axis)


def transpose(dtype="float32", perm=(1, 0), target="cpu", schedule=None):
    """``(X, Y)``: ``Y = X.permute(perm)`` (a compact copy)."""
    return _kernel("transpose", dtype, target, schedule=schedule, perm=list(perm))


def __getattr__(name):
    # Unknown names are rivet errors that list what exists (and AttributeErrors, for hasattr).
    if name.startswith("__"):
        raise AttributeError(name)
    raise KernelNotFoundError(
        f"rivet.kernels has no kernel '{name}'; it has: {', '.join(__all__)}"
    )
