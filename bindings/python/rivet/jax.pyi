# Type stubs for rivet.jax (jax.py, owned by the JAX glue; keep in step with it).
from collections.abc import Callable
from typing import Any, Final

from ._native import Function

__all__ = ["ffi_func", "TARGET"]

TARGET: Final[str]

# Returns a JAX-traceable function of arrays: one array, or a tuple for several outputs.
def ffi_func(
    func: Function | str,
    *,
    backward: Function | str | None = "auto",
    vmap_method: str = "sequential",
) -> Callable[..., Any]: ...
