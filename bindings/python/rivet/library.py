"""Functions built by another library: ``rivet.load_library(path)`` loads a shared library a
Rust crate built with ``rivet::python_library!`` (or any C code with a ``rivet_library_init``
entry point) and registers the functions it hands over, in one step.

The library gets this process's C ABI entry points (``RivetFunctionCreate``,
``RivetFunctionCreateTyped``, ``RivetFunctionSetGlobal``, ``RivetFunctionFree``,
``RivetGetLastError`` of ``rivet._native``) in a ``RivetHostApi`` and registers its functions
through them, typed functions with their signatures and output rules (so
``rivet.torch.custom_op`` and ``rivet.jax.ffi_func`` take them); tensors cross as borrowed
``DLTensor``s, results as owned ``DLManagedTensorVersioned``s (docs/c_abi.md, "Functions from
another library"). The library stays loaded for the life of the process (its functions'
code lives there).
"""

import ctypes
import os

from . import _native
from .error import ArgumentError, Error

__all__ = ["load_library"]

_LOADED: "list[ctypes.CDLL]" = []  # the CDLL objects: never unloaded while their functions may be called


class _HostApi(ctypes.Structure):
    abi_version: int
    override_: int
    function_create: "int | None"
    set_global: "int | None"
    function_free: "int | None"
    get_last_error: "int | None"
    function_create_typed: "int | None"
    _fields_ = [
        ("abi_version", ctypes.c_int32),
        ("override_", ctypes.c_int32),
        ("function_create", ctypes.c_void_p),
        ("set_global", ctypes.c_void_p),
        ("function_free", ctypes.c_void_p),
        ("get_last_error", ctypes.c_void_p),
        ("function_create_typed", ctypes.c_void_p),  # C ABI 1.1
    ]


_SET_GLOBAL = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int32)


def load_library(path: "str | os.PathLike[str]", override: bool = False) -> "list[str]":
    """Loads the shared library at ``path`` and registers the functions it builds; returns
    their names (get them with ``rivet.get_global_func``). A name already registered is a
    ``rivet.RegistryError`` unless ``override=True``; a library without the entry point, or
    built against another C ABI major version, is a ``rivet.ArgumentError``; a failure while
    the library builds its functions comes back as the ``rivet`` error of its kind (functions
    registered before the failure stay registered)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(
            f"rivet.load_library: argument 'path' must be a path, got {type(path).__name__}"
        )
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ArgumentError(f"rivet.load_library: no file at {path!r}")
    try:
        lib = ctypes.CDLL(os.path.abspath(path))
    except OSError as e:
        raise ArgumentError(f"rivet.load_library: cannot load {path!r}: {e}") from None
    try:
        init = lib.rivet_library_init
    except AttributeError:
        raise ArgumentError(
            f"rivet.load_library: {path!r} has no 'rivet_library_init' entry point (build it "
            "with rivet::python_library!)"
        ) from None
    init.restype = ctypes.c_int32
    init.argtypes = [ctypes.POINTER(_HostApi), ctypes.c_char_p, ctypes.c_size_t]
    host_lib = ctypes.CDLL(_native.__file__)

    def addr(name: str) -> "int | None":
        return ctypes.cast(getattr(host_lib, name), ctypes.c_void_p).value

    # The registrations go through a recorder, so the names registered (replaced ones too)
    # are known; it calls the host's RivetFunctionSetGlobal.
    set_global = host_lib.RivetFunctionSetGlobal
    set_global.restype = ctypes.c_int32
    set_global.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int32]
    registered: "list[str]" = []

    def record(name: bytes, handle: "int | None", override_: int) -> int:
        rc: int = set_global(name, handle, override_)
        if rc == 0:
            registered.append(name.decode("utf-8", "replace"))
        return rc

    record_c = _SET_GLOBAL(record)  # kept alive by this frame for the call
    host = _HostApi(
        host_lib.RivetAbiVersion(),
        1 if override else 0,
        addr("RivetFunctionCreate"),
        ctypes.cast(record_c, ctypes.c_void_p).value,
        addr("RivetFunctionFree"),
        addr("RivetGetLastError"),
        addr("RivetFunctionCreateTyped"),
    )
    err = ctypes.create_string_buffer(8192)
    rc = init(ctypes.byref(host), err, len(err))
    _LOADED.append(lib)
    if rc != 0:
        text = err.value.decode("utf-8", "replace") or f"rivet_library_init returned {rc}"
        kind, _, message = text.partition(": ")
        from . import error

        cls = getattr(error, kind, None)
        if not (isinstance(cls, type) and issubclass(cls, Error)):
            cls, message = Error, text
        raise cls(f"rivet.load_library({path!r}): {message}")
    return registered
