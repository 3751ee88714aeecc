# Type stubs for rivet.torch (torch.py, owned by the torch glue; keep in step with it).
from collections.abc import Callable, Sequence
from typing import Any

from torch._ops import OpOverloadPacket

from ._native import Function

__all__ = ["custom_op"]

def custom_op(
    func: Function | str,
    name: str,
    *,
    backward: Function | str | Callable[..., Any] | None = "auto",
    mutates: bool = False,
    device_types: str | Sequence[str] | None = None,
    override: bool = False,
    native: bool | None = None,
) -> OpOverloadPacket: ...
