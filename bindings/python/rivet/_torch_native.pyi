# Type stubs for rivet._torch_native (the native path of rivet.torch.custom_op; private).
from collections.abc import Callable
from types import ModuleType
from typing import Any

class NativeUnavailable(Exception): ...

def extension() -> ModuleType: ...
def register(
    ext: ModuleType,
    op: Any,
    bwd: Any,
    name: str,
    no_backward: Callable[..., Any],
    setup_context: Callable[..., None],
) -> tuple[Any, int]: ...
def compiled_kernel(name: str, dtypes: tuple[str, ...]) -> Callable[..., Any]: ...
