"""rivet: native kernels as packed functions on PyTorch, JAX, NumPy, CuPy and MXNet memory.

Tensors cross in both directions through DLPack without copies; see README.md and docs/python_api.md for the API.
"""

from collections.abc import Callable as _Callable
from typing import Any as _Any
from typing import Optional as _Optional
from typing import TypeVar as _TypeVar
from typing import Union as _Union
from typing import overload as _overload

from ._native import (
    DLPACK_VERSION,
    MAX_ALLOC_BYTES,
    Function,
    Module,
    Schedule,
    Stage,
    Tensor,
    __version__,
    build,
    create_schedule,
    cuda_device_count,
    empty,
    from_dlpack,
    get_global_func,
    list_global_funcs,
    load_module,
    num_threads,
    remove_global_func,
    targets,
    zeros,
)
from ._native import _register
from .error import *  # noqa: F401,F403
from .contrib.dlpack import convert_func, to_jax_func, to_mxnet_func, to_pytorch_func
from . import te  # noqa: E402  (the DSL: rivet.te.placeholder / compute / ...)
from . import kernels  # noqa: E402  (kernels written in Rust: rivet.kernels.matmul(...))
from . import ipc  # noqa: E402  (cross-process tensors; registers the multiprocessing reducer)
from .library import load_library  # noqa: E402  (functions a Rust crate built: rivet::python_library!)


_F = _TypeVar("_F", bound=_Callable[..., _Any])

# Framework glue imported on first use, so ``import rivet`` then ``rivet.torch.custom_op(...)``
# works as it does for numpy's submodules, while ``import rivet`` stays as fast as it was (it
# never imports torch or jax itself: those imports cost seconds).
_LAZY_SUBMODULES = ("torch", "jax")


def __getattr__(name: str) -> _Any:
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'rivet' has no attribute {name!r}")


def __dir__() -> "list[str]":
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))


@_overload
def register_func(name: str, f: None = None, override: bool = False) -> _Callable[[_F], _F]: ...
@_overload
def register_func(name: str, f: _F, override: bool = False) -> _F: ...
def register_func(
    name: str, f: _Optional[_F] = None, override: bool = False
) -> _Union[_F, _Callable[[_F], _F]]:
    """Register ``f`` (a Python callable or a ``rivet.Function``) as the global function ``name``.

    Without ``f`` it returns a decorator::

        @rivet.register_func("my.add")
        def add(a, b):
            return a + b

    Registering a taken name raises ``rivet.RegistryError`` unless ``override=True``.
    Returns ``f`` unchanged.
    """
    if not isinstance(name, str):
        raise ArgumentError(  # noqa: F405
            f"register_func: argument 0 ('name') must be a str, got {type(name).__name__}"
        )

    def register(func: _F) -> _F:
        _register(name, func, override)
        return func

    return register if f is None else register(f)


__all__ = [
    "DLPACK_VERSION",
    "MAX_ALLOC_BYTES",
    "Function",
    "Module",
    "Schedule",
    "Stage",
    "Tensor",
    "__version__",
    "build",
    "convert_func",
    "create_schedule",
    "cuda_device_count",
    "empty",
    "from_dlpack",
    "get_global_func",
    "list_global_funcs",
    "load_library",
    "load_module",
    "num_threads",
    "register_func",
    "remove_global_func",
    "targets",
    "to_jax_func",
    "to_mxnet_func",
    "to_pytorch_func",
    "te",
    "kernels",
    "ipc",
    "zeros",
    # rivet.error's classes, written out so type checkers see them (tests/python/test_typing.py
    # checks that the list matches rivet.error.__all__).
    "Error",
    "ShapeError",
    "DTypeError",
    "DeviceError",
    "ArgumentError",
    "ReadOnlyError",
    "LayoutError",
    "DLPackError",
    "KernelNotFoundError",
    "FunctionNotFoundError",
    "RegistryError",
    "CompileError",
    "MemoryError",
    "IndexError",
    "NotDifferentiableError",
    "IPCError",
    "LibraryError",
    "InternalError",
]
