"""Cross-process tensors with no copy (CPU shared memory; CUDA IPC handles, docs/ipc.md "CUDA");
docs/ipc.md has the rules.

``share(tensor)`` gives a :class:`Handle`: small, picklable plain data naming a view of a
shared-memory segment; ``open(handle)`` in another process (same user, Linux) gives a
``rivet.Tensor`` over the same memory. A handle is valid while the sender keeps the tensor
alive; once opened, the receiver's mapping keeps the memory alive by itself.

Passing a ``rivet.Tensor`` through ``multiprocessing`` (``Queue``, ``Pipe``, a spawned
process's arguments) shares it instead of copying it: the reducer registered here sends the
segment's fd along (``multiprocessing.reduction.DupFd``, as torch's ``file_descriptor``
strategy does), so even a temporary put on a queue stays valid until it is received. A tensor
that is not in shared memory is copied once into a new segment on the way. ``pickle.dumps`` of
a tensor stays by value.

Only the pickling glue and torch's fd live here; the checks are in Rust (runtime/src/ipc.rs).
"""

from __future__ import annotations

import dataclasses
import os as _os
import sys as _sys
from multiprocessing import context as _mp_context
from multiprocessing import reduction as _mp_reduction
from typing import Any, Optional, Union

from . import _native
from ._native import Tensor
from .error import ArgumentError, DeviceError, IPCError

__all__ = ["Handle", "CudaHandle", "share", "open"]


@dataclasses.dataclass(frozen=True)
class Handle:
    """A view of CPU shared memory, as plain data (picklable; meaningful while the memory lives).

    ``kind`` ("cpu_shm") and ``device`` ("cpu") say what it names; ``pid`` and ``fd`` are the
    sending process and its file descriptor of the segment (the receiver opens
    ``/proc/<pid>/fd/<fd>``); ``st_dev`` / ``st_ino`` the segment file's identity and ``size``
    its bytes, which the receiver checks against what it opens; ``offset`` (bytes),
    ``shape``, ``strides`` (elements), ``dtype`` and ``read_only`` the view.
    """

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

    def __repr__(self) -> str:
        ro = ", read_only=True" if self.read_only else ""
        return (
            f"rivet.ipc.Handle({self.dtype}{list(self.shape)}, strides={list(self.strides)}, "
            f"offset={self.offset} of {self.size} bytes, pid={self.pid} fd={self.fd}, "
            f"st_dev={self.st_dev} st_ino={self.st_ino}{ro})"
        )

    # Pickled as its fields alone: a handle made by share(copy=True) keeps its copy alive in
    # the sending process through an attribute that is not a field (neither compared, shown
    # nor pickled). A plain tuple also halves the default's cost (dumps + loads 13 us -> 5.6
    # us here), which was half of a handle's round trip through a pipe.
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return Handle, (
            self.kind, self.device, self.pid, self.fd, self.st_dev, self.st_ino, self.size,
            self.offset, self.shape, self.strides, self.dtype, self.read_only,
        )


@dataclasses.dataclass(frozen=True)
class CudaHandle:
    """A view of CUDA device memory shared with CUDA IPC, as plain data (docs/ipc.md "CUDA").

    ``kind`` is "cuda_ipc"; ``pid`` the sending process; ``device`` the sender's CUDA device
    index; ``mem_handle`` the 64-byte ``cuIpcGetMemHandle`` of the allocation's *base* (bytes,
    or the same as a hex str), ``alloc_size`` that allocation's bytes and ``offset`` the view's
    byte offset inside it (torch's caching allocator sub-allocates, so a tensor is rarely at
    the base); ``shape``, ``strides`` (elements) and ``dtype`` the view; ``event_handle`` the
    64-byte ``cuIpcGetEventHandle`` of an event recorded after the sender's writes, or None.
    ``open`` checks every field (lengths, ranges, the view inside ``alloc_size``) before it
    touches the driver.
    """

    kind: str
    pid: int
    device: int
    mem_handle: bytes
    alloc_size: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    event_handle: Optional[bytes] = None

    def __repr__(self) -> str:
        ev = "event" if self.event_handle is not None else "no event"
        return (
            f"rivet.ipc.CudaHandle({self.dtype}{list(self.shape)}, strides={list(self.strides)}, "
            f"offset={self.offset} of {self.alloc_size} bytes on cuda:{self.device}, pid={self.pid}, {ev})"
        )


def _make(fields: tuple[Any, ...], keep: Optional[Any] = None) -> Handle:
    kind, device, pid, fd, st_dev, st_ino, size, offset, shape, strides, dtype, ro = fields
    h = Handle(kind, device, pid, fd, st_dev, st_ino, size, offset, tuple(shape), tuple(strides), dtype, ro)
    if keep is not None:
        object.__setattr__(h, "_keep", keep)
    return h


def _is_torch(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "untyped_storage")


def _share_torch(t: Any, copy: bool) -> Handle:
    """A torch CPU tensor: no copy when its storage is in shared memory (``share_memory_()``
    under torch's default ``file_descriptor`` strategy) or it views rivet shared memory, else a
    copy when ``copy=True``."""
    import torch.multiprocessing as tmp

    if t.device.type == "cuda":
        return _share_torch_cuda(t)
    if t.device.type != "cpu":
        raise DeviceError(
            f"rivet.ipc.share: argument 0 ('tensor') is a torch tensor on {t.device}; rivet.ipc shares CPU "
            "and CUDA tensors only"
        )
    t = t.detach()
    if not t.is_shared():
        # Maybe a torch view of rivet shared memory (torch.from_dlpack(t)); else a copy when
        # asked, or the error saying how to get shared memory.
        fields, keep = _native._ipc_share(t, copy)
        return _make(fields, keep if copy else None)
    strategy = tmp.get_sharing_strategy()
    if strategy != "file_descriptor":
        raise IPCError(
            f"rivet.ipc.share: torch's sharing strategy is {strategy!r}; rivet shares torch memory through the "
            "storage's file descriptor: call torch.multiprocessing.set_sharing_strategy('file_descriptor') "
            "before share_memory_(), or pass a rivet tensor"
        )
    storage = t.untyped_storage()
    base = storage.data_ptr()
    fd, _ = storage._share_fd_cpu_()
    if storage.data_ptr() != base:
        # torch moved the storage into a new segment (it was not fd-shared): the handle
        # would not name the memory the caller's other views use.
        raise IPCError(
            "rivet.ipc.share: torch moved the tensor's storage to new shared memory when asked for its file "
            "descriptor (it was shared with another strategy); share the tensor again"
        )
    fields = _native._ipc_share_fd(t, fd)
    return _make(fields, storage if fields[3] >= 0 else None)


def _share_torch_cuda(t: Any) -> CudaHandle:
    """A torch CUDA tensor: the handle of its allocation's base and its byte offset there, and an
    interprocess event recorded on torch's current stream after the work queued so far (the
    receiver waits on it instead of a device-wide synchronize). Not yet run on a GPU."""
    import torch

    t = t.detach()
    dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(dev).cuda_stream
    mem, alloc_size, offset, event = _native._ipc_share_cuda(t.data_ptr(), dev, stream)
    # t.data_ptr() already includes the storage offset: `offset` is from the allocation base.
    return CudaHandle(
        "cuda_ipc", _os.getpid(), dev, mem, alloc_size, offset, tuple(t.shape), tuple(t.stride()),
        str(t.dtype).removeprefix("torch."), event,
    )


def _share_rivet_cuda(t: Tensor) -> CudaHandle:
    """A rivet CUDA tensor: shareable when its memory is a plain cuMemAlloc allocation (a tensor
    imported from such memory, or rivet's own on a device without memory pools); memory from a
    stream-ordered pool (cuMemAllocAsync, rivet's own tensors where the device has pools) is
    refused by the driver half with an IPCError saying so. The event is recorded on the legacy
    default stream, which comes after the work queued so far on every blocking stream."""
    dev = int(t.device.split(":")[1]) if ":" in t.device else 0
    mem, alloc_size, offset, event = _native._ipc_share_cuda(t.data_ptr, dev, 0)
    return CudaHandle(
        "cuda_ipc", _os.getpid(), dev, mem, alloc_size, offset, tuple(t.shape), tuple(t.strides), str(t.dtype), event,
    )


def _current_stream(device: Optional[str], handle: CudaHandle) -> int:
    """torch's current stream on the target device when torch is loaded (so torch work after
    open is ordered after the sender's writes), else 0, the legacy default stream."""
    torch = _sys.modules.get("torch")
    # Only where torch has set up CUDA: before that its current stream is the legacy default
    # one anyway, and asking (is_available) would initialise torch's CUDA as a side effect.
    if torch is None or not torch.cuda.is_initialized():
        return 0
    try:
        idx = handle.device if device is None else (0 if device == "cuda" else int(device.split(":")[-1]))
        return int(torch.cuda.current_stream(idx).cuda_stream)
    except Exception:  # an index torch does not see: rivet's own check names it
        return 0


def share(tensor: Any, copy: bool = False) -> Union[Handle, CudaHandle]:
    """A :class:`Handle` of ``tensor``'s memory, which must be shared memory: a rivet tensor from
    ``rivet.empty/zeros(..., shared=True)`` or opened from a handle, any view of one (numpy and
    torch views included), or a torch tensor after ``share_memory_()``. Anything else is a
    ``rivet.IPCError`` saying how to get one, or with ``copy=True`` is copied once into a new
    shared segment, which the returned handle keeps alive in this process.

    A torch CUDA tensor (torch's default caching allocator) gives a :class:`CudaHandle` instead
    (docs/ipc.md "CUDA"; not yet run on a GPU), and so does a rivet CUDA tensor in plain
    ``cuMemAlloc`` memory; one from a stream-ordered pool (``cuMemAllocAsync``) is a
    ``rivet.IPCError``.

    The sender must keep the tensor (or, with ``copy=True``, the handle) alive until receivers
    have opened the handle; after that each receiver's view keeps the memory alive by itself.
    """
    if not isinstance(copy, bool):
        raise ArgumentError(f"rivet.ipc.share: argument 'copy' must be a bool, got {type(copy).__name__}")
    if _is_torch(tensor):
        return _share_torch(tensor, copy)
    if isinstance(tensor, Tensor) and tensor.device.startswith("cuda"):
        return _share_rivet_cuda(tensor)
    fields, keep = _native._ipc_share(tensor, copy)
    return _make(fields, keep if copy else None)


def open(handle: Union[Handle, CudaHandle], device: Union[str, int, None] = None) -> Tensor:  # noqa: A001 (the issue's name)
    """A ``rivet.Tensor`` over the memory ``handle`` names (a view of this process's own mapping
    when it has one). For a :class:`Handle` ``device`` may be None or "cpu"; for a
    :class:`CudaHandle` None (the handle's device), a CUDA device ("cuda:1") or its index. A
    malformed, stale or foreign handle is a ``rivet.IPCError`` naming the field or the pid / fd
    and what went wrong; a CUDA handle where there is no CUDA driver or device is a
    ``rivet.DeviceError`` saying which."""
    if isinstance(handle, CudaHandle):
        if isinstance(device, int) and not isinstance(device, bool):
            device = f"cuda:{device}"
        if device is not None and not isinstance(device, str):
            raise ArgumentError(
                "rivet.ipc.open: argument 'device' must be None, a device str such as 'cuda:1' or a CUDA "
                f"device index, got {type(device).__name__}"
            )
        stream = _current_stream(device, handle) if device is None or device.startswith("cuda") else 0
        return _native._ipc_open_cuda(handle, device, stream)
    if not isinstance(handle, Handle):
        raise ArgumentError(
            "rivet.ipc.open: argument 0 ('handle') must be a rivet.ipc.Handle or rivet.ipc.CudaHandle, "
            f"got {type(handle).__name__}"
        )
    if device is not None and not isinstance(device, str):
        raise ArgumentError(
            f"rivet.ipc.open: argument 'device' must be None or 'cpu' for a CPU handle, got {type(device).__name__}"
        )
    return _native._ipc_open(handle, device)


# ---- multiprocessing ------------------------------------------------------------------------


def _rebuild_from_fd(dupfd: Any, handle: Handle) -> Tensor:
    return _native._ipc_open_fd(dupfd.detach(), handle)


def _reduce_for_multiprocessing(t: Tensor) -> tuple[Any, tuple[Any, ...]]:
    if t.device != "cpu":
        raise DeviceError(
            f"cannot send a rivet tensor on {t.device} to another process: rivet.ipc shares CPU tensors only "
            "(a rivet CUDA tensor lives in cuMemAllocAsync pool memory, which CUDA IPC cannot share; send "
            "rivet.ipc.share(torch_cuda_tensor) instead)"
        )
    fields, keep = _native._ipc_share(t, True)
    handle = _make(fields)
    popen = _mp_context.get_spawning_popen()
    if popen is not None and not t.is_shared:
        # A spawned process's arguments: the fd is passed when the child starts, after this
        # returns, so the copy must outlive this call; the Popen object lives as long.
        popen._rivet_keepalive = getattr(popen, "_rivet_keepalive", []) + [keep]
    # Queue / Pipe: DupFd duplicates the fd now and serves it to the receiver (resource_sharer).
    return _rebuild_from_fd, (_mp_reduction.DupFd(handle.fd), handle)


_mp_reduction.ForkingPickler.register(Tensor, _reduce_for_multiprocessing)
