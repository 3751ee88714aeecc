"""Functions built by another library: ``rivet.load_library(path)`` loads a shared library a
Rust crate built with ``rivet::python_library!`` (or any C code with a ``rivet_library_init``
entry point) and registers the functions it hands over, in one step.

The library gets this process's C ABI entry points (``RivetFunctionCreate``,
``RivetFunctionCreateTyped``, ``RivetFunctionSetGlobal``, ``RivetFunctionFree``,
``RivetGetLastError`` of ``rivet._native``) in a ``RivetHostApi`` (a static of the runtime, valid
for the life of the process: ``rivet_runtime::library``, which does the loading) and registers
its functions through them, typed functions with their signatures and output rules (so
``rivet.torch.custom_op`` and ``rivet.jax.ffi_func`` take them); tensors cross as borrowed
``DLTensor``s, results as owned ``DLManagedTensorVersioned``s (docs/c_abi.md, "Functions from
another library"). The library stays loaded for the life of the process (its functions'
code lives there).
"""

import os

from . import _native
from .error import ArgumentError

__all__ = ["load_library"]


def load_library(path: "str | os.PathLike[str]", override: bool = False) -> "list[str]":
    """Loads the shared library at ``path`` and registers the functions it builds; returns
    their names (get them with ``rivet.get_global_func``). A name already registered is a
    ``rivet.RegistryError`` unless ``override=True``; a library without the entry point, or
    built against another C ABI major version, is a ``rivet.ArgumentError``; a failure while
    the library builds its functions comes back as the ``rivet`` error of its kind (one it
    calls internal as ``rivet.LibraryError``; functions registered before the failure stay
    registered). The host table the library receives stays valid for the life of the
    process (docs/c_abi.md, "Lifetimes and ownership")."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(
            f"rivet.load_library: argument 'path' must be a path, got {type(path).__name__}"
        )
    if not isinstance(override, bool):
        raise ArgumentError(
            f"rivet.load_library: argument 'override' must be a bool, got {type(override).__name__}"
        )
    path = os.fspath(path)
    if not isinstance(path, str):
        raise ArgumentError(
            f"rivet.load_library: argument 'path' must be a text path, got {type(path).__name__}"
        )
    return _native._load_library(path, override)
