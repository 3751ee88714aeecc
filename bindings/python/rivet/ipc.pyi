# Type stubs for rivet.ipc (ipc.py: cross-process tensors, docs/ipc.md).
import dataclasses
from typing import Any, overload

from ._native import Tensor

__all__ = ["Handle", "CudaHandle", "share", "open"]

@dataclasses.dataclass(frozen=True)
class Handle:
    """A view of CPU shared memory, as plain data."""

    kind: str
    device: str
    pid: int
    fd: int
    st_dev: int
    st_ino: int
    size: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    read_only: bool = False
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]: ...

@dataclasses.dataclass(frozen=True)
class CudaHandle:
    """A view of CUDA device memory shared with CUDA IPC, as plain data."""

    kind: str
    pid: int
    device: int
    mem_handle: bytes
    alloc_size: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    event_handle: bytes | None = None

# A torch tensor, a rivet.Tensor or any array with __dlpack__ (typed Any to keep torch optional).
# A rivet.Tensor gives a CPU Handle (rivet's CUDA tensors are refused); a torch CUDA tensor a
# CudaHandle.
@overload
def share(tensor: Tensor, copy: bool = False) -> Handle: ...
@overload
def share(tensor: Any, copy: bool = False) -> Handle | CudaHandle: ...
def open(handle: Handle | CudaHandle, device: str | int | None = None) -> Tensor: ...
