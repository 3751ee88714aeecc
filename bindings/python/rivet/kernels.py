"""Kernels defined in Rust with rivet's DSL (``compiler/src/kernels``), compiled on first use
for the dtype and shape pattern asked, cached, and returned as ``rivet.Function``s.

Dims are symbolic: one function serves every size. Inputs come first, then the output; leave
the output out to have it allocated and returned (wrap with ``rivet.to_pytorch_func`` to get
torch tensors back).
"""

from ._native import _kernel
from .error import KernelNotFoundError

__all__ = [
    "matmul", "batch_matmul", "add", "mul", "relu", "gelu", "softmax", "layer_norm",
    "sum", "max", "transpose",
]


def matmul(dtype="float32", target="cpu"):
    """``(A[m, k], B[k, n], C[m, n])``: ``C = A @ B``."""
    return _kernel("matmul", dtype, target)


def batch_matmul(dtype="float32", target="cpu"):
    """``(A[b, m, k], B[b, k, n], C[b, m, n])``: ``C[i] = A[i] @ B[i]``."""
    return _kernel("batch_matmul", dtype, target)


def add(dtype="float32", a_shape=("n",), b_shape=("n",), target="cpu"):
    """``(A, B, C)``: ``C = A + B`` with numpy broadcasting. A shape entry is a size (1
    broadcasts) or a dim name, e.g. ``add("float32", ("n", 1), (1, "m"))``."""
    return _kernel("add", dtype, target, a_shape=list(a_shape), b_shape=list(b_shape))


def mul(dtype="float32", a_shape=("n",), b_shape=("n",), target="cpu"):
    """``(A, B, C)``: ``C = A * B`` with numpy broadcasting (see ``add``)."""
    return _kernel("mul", dtype, target, a_shape=list(a_shape), b_shape=list(b_shape))


def relu(dtype="float32", ndim=2, target="cpu"):
    """``(X, Y)``: ``Y = max(X, 0)``."""
    return _kernel("relu", dtype, target, ndim=ndim)


def gelu(dtype="float32", ndim=2, target="cpu"):
    """``(X, Y)``: exact GELU, ``0.5 * x * (1 + erf(x / sqrt(2)))``."""
    return _kernel("gelu", dtype, target, ndim=ndim)


def softmax(dtype="float32", ndim=2, axis=-1, target="cpu"):
    """``(X, Y)``: softmax over ``axis`` (max-subtracted)."""
    return _kernel("softmax", dtype, target, ndim=ndim, axis=axis)


def layer_norm(dtype="float32", ndim=2, eps=1e-5, target="cpu"):
    """``(X[..., n], gamma[n], beta[n], Y)``: normalisation over the last axis."""
    return _kernel("layer_norm", dtype, target, ndim=ndim, eps=eps)


def sum(dtype="float32", ndim=2, axis=-1, target="cpu"):  # noqa: A001 - mirrors numpy
    """``(X, Y)``: sum over ``axis`` (removed from Y's shape)."""
    return _kernel("sum", dtype, target, ndim=ndim, axis=axis)


def max(dtype="float32", ndim=2, axis=-1, target="cpu"):  # noqa: A001 - mirrors numpy
    """``(X, Y)``: maximum over ``axis`` (removed from Y's shape)."""
    return _kernel("max", dtype, target, ndim=ndim, axis=axis)


def transpose(dtype="float32", perm=(1, 0), target="cpu"):
    """``(X, Y)``: ``Y = X.permute(perm)`` (a compact copy)."""
    return _kernel("transpose", dtype, target, perm=list(perm))


def __getattr__(name):
    # Unknown names are rivet errors that list what exists (and AttributeErrors, for hasattr).
    if name.startswith("__"):
        raise AttributeError(name)
    raise KernelNotFoundError(
        f"rivet.kernels has no kernel '{name}'; it has: {', '.join(__all__)}"
    )
