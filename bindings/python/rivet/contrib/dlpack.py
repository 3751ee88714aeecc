"""Wrap rivet functions for a framework's tensor type (TVM's ``contrib.dlpack`` API).

Arguments of the framework's type reach the function as DLPack tensors (no copy); tensors
the function returns come back as the framework's type. The conversion itself runs in Rust
(``Function._with_framework``); these helpers only name the framework's functions.
"""

from collections.abc import Callable
from typing import Any, Optional, Union

from .._native import Function, Tensor, get_global_func

__all__ = ["convert_func", "to_pytorch_func", "to_mxnet_func", "to_jax_func"]


def _as_function(func: Union[Function, str]) -> Function:
    if isinstance(func, Function):
        return func
    if isinstance(func, str):
        return get_global_func(func)
    raise TypeError(
        f"argument 0 ('func') must be a rivet.Function or a registered name, got {type(func).__name__}"
    )


def convert_func(
    func: Union[Function, str],
    tensor_type: type,
    to_dlpack_func: Optional[Callable[[Any], Any]],
    from_dlpack_func: Optional[Callable[[Tensor], Any]] = None,
) -> Function:
    """Wrap ``func`` so that arguments of ``tensor_type`` are passed through ``to_dlpack_func``.

    ``from_dlpack_func``, when given, turns tensor results into the framework's type.
    """
    if not isinstance(tensor_type, type):
        raise TypeError(f"argument 1 ('tensor_type') must be a type, got {type(tensor_type).__name__}")
    return _as_function(func)._with_framework(tensor_type, to_dlpack_func, from_dlpack_func)


def to_pytorch_func(func: Union[Function, str]) -> Function:
    """Wrap ``func`` for ``torch.Tensor`` arguments and results.

    torch tensors are imported natively (torch's C DLPack exchange API where available), so
    no per-argument Python conversion runs.
    """
    import torch

    return _as_function(func)._with_framework(torch.Tensor, None, torch.from_dlpack)


def to_mxnet_func(func: Union[Function, str]) -> Function:
    """Wrap ``func`` for ``mxnet.nd.NDArray`` arguments (``to_dlpack_for_write``) and results."""
    import mxnet

    def from_dlpack(t: Tensor) -> Any:
        return mxnet.nd.from_dlpack(t.__dlpack__())

    return _as_function(func)._with_framework(
        mxnet.nd.NDArray, mxnet.nd.NDArray.to_dlpack_for_write, from_dlpack
    )


def to_jax_func(func: Union[Function, str]) -> Function:
    """Wrap ``func`` for ``jax.Array`` arguments and results.

    JAX arrays are immutable: they can only be inputs (rivet refuses to write them), and the
    function's tensor results come back as new ``jax.Array``s.
    """
    import jax
    import jax.dlpack

    def from_dlpack(t: Tensor) -> Any:
        return jax.dlpack.from_dlpack(_ImmutableExport(t))

    return _as_function(func)._with_framework(jax.Array, None, from_dlpack)


class _ImmutableExport:
    """Hands a rivet tensor to JAX. JAX asks for legacy capsules only, which cannot carry the
    read-only flag, so read-only tensors (e.g. views of other jax arrays) would be refused;
    JAX never writes to imported memory, so the legacy export is safe for it alone."""

    __slots__ = ("_t",)

    def __init__(self, t: Tensor) -> None:
        self._t = t

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> object:
        # JAX passes its stream for GPU arrays: it waits for rivet's work (an event).
        return self._t._dlpack_for_immutable_consumer(stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._t.__dlpack_device__()
