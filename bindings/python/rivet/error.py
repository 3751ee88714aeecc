"""rivet's exception classes.

Every error rivet raises is a :class:`Error`; the subclasses also derive from the builtin a
Python user would catch (``except ValueError`` keeps working). Messages name the argument
(position and name), what was expected and what came.
"""

import builtins


class Error(Exception):
    """Base class of every error raised by rivet."""


class ShapeError(Error, ValueError):
    """Wrong rank or shape; symbolic dims bound inconsistently."""


class DTypeError(Error, TypeError):
    """Wrong or unsupported dtype."""


class DeviceError(Error, ValueError):
    """Tensor on the wrong device, or the device is not available."""


class ArgumentError(Error, TypeError):
    """Wrong number or kind of arguments."""


class ReadOnlyError(Error, ValueError):
    """A write to a read-only tensor (jax.Array, non-writeable numpy array, read-only export)."""


class LayoutError(Error, ValueError):
    """An output whose elements overlap, or an output partially overlapping an input."""


class DLPackError(Error, BufferError):
    """A reused capsule, a malformed or unsupported DLPack tensor, a failed export."""


class FunctionNotFoundError(Error, LookupError):
    """No function is registered under the name."""


class KernelNotFoundError(FunctionNotFoundError, AttributeError):
    """``rivet.kernels`` has no kernel of that name (an ``AttributeError`` too, so ``hasattr``
    and ``getattr(rivet.kernels, name, default)`` keep working)."""


class RegistryError(Error, ValueError):
    """Registering a name that is taken, without override=True."""


class CompileError(Error):
    """The compiler rejected a program."""


class MemoryError(Error, builtins.MemoryError):
    """An allocation over rivet's size limit (``rivet.MAX_ALLOC_BYTES``), or one the system refused."""


class IndexError(Error, builtins.IndexError):
    """An element access outside its tensor caught at run time (checked mode)."""


class NotDifferentiableError(Error, RuntimeError):
    """A gradient rivet cannot give: ``Function.backward()`` of a function without a te program
    or through a host callback, or a gradient through an op registered without a backward
    (``rivet.torch.custom_op``, ``rivet.jax.ffi_func``)."""


class IPCError(Error, OSError):
    """Sharing a tensor with another process failed (``rivet.ipc``): memory that is not shared,
    a malformed, stale or foreign handle, a sending process that is gone or closed the memory."""


class LibraryError(Error, RuntimeError):
    """A function of another library (``rivet.load_library``, the C ABI's
    ``RivetFunctionCreate``) failed with what it calls an internal error, or broke the C ABI's
    contract (a NULL string result, an output rule answering shapes or dtypes its signature
    does not allow): a bug of that library, not of rivet nor of the caller."""


class InternalError(Error):
    """A bug in rivet (never the caller's fault); please report it."""


__all__ = [
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
