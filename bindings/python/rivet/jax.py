"""rivet functions inside ``jax.jit``, ``jax.grad`` and ``jax.vmap`` through XLA's typed FFI.

``ffi_func(f)`` returns a JAX-traceable function. Under ``jax.jit`` it lowers to one XLA custom
call of the target ``"rivet"``, whose handler (``rivet_xla_ffi_handler``, exported by rivet's
native library, see ``runtime/src/xla_ffi.rs``) runs ``f`` directly on XLA's buffers: no copy,
no DLPack round trip, no Python at run time. The output shapes come from the function itself
(``Function.output_shapes``), so no ``ShapeDtypeStruct`` is written by hand.

Rules (docs/jax.md):
- ``f`` is a compiled rivet function (``rivet.build``, ``rivet.kernels``): inputs first, outputs
  last, outputs written in place. XLA allocates the outputs; rivet checks every buffer against
  the signature at run time, as for any call.
- Platforms: the target is registered for XLA's CPU platform (``rivet_xla_ffi_handler``: host
  buffers) and its CUDA platform (``rivet_xla_ffi_handler_cuda``: device buffers on XLA's
  device for the call, the kernel launched on XLA's stream, no synchronize). A function built
  for ``target="cpu"`` runs where the program runs on the CPU, one built for ``"cuda"`` where
  it runs on a GPU; the other way round is a ``rivet.DeviceError`` (at the call for concrete
  ``jax.Array`` arguments, from the run as ``JaxRuntimeError("rivet DeviceError: ...")`` for
  traced ones, whose platform is only known when XLA runs them).
- ``jax.grad``: by default (``backward="auto"``) the function's own backward
  (derived from its te program with ``rivet.te.gradient``; when that backward reads forward
  values worth keeping, such as a softmax's exponentials, the forward run under
  differentiation is ``Function.training_pair()``'s, which also writes them, and the
  backward reads them instead of recomputing: JAX's residuals), or
  ``backward=`` a compiled rivet function taking the forward's inputs, then one cotangent per
  output, and returning one gradient per float input (or one per input), in order. Int inputs
  get zero (``float0``) cotangents. Where there is no backward (``backward=None``, or a
  function rivet cannot differentiate), differentiating through the call raises
  ``rivet.NotDifferentiableError`` naming the function and why.
- ``jax.shard_map``: the kernel runs once per shard on its local block; its outputs vary over
  the mesh axes its inputs vary over, and gradients of replicated inputs are summed over the
  shards (as for JAX's own ops).
- ``jax.vmap``: ``vmap_method="sequential"`` (the default here) runs the kernel once per batch
  element inside XLA (a loop, no Python); JAX's other methods hand the kernel batched
  arrays, which its signature refuses unless it was written for them.
- Each ``ffi_func`` registers ``f`` in rivet's global registry under a fresh name
  (``rivet.jax.<name>#<k>``) that the custom call names; compiled executables may outlive the
  wrapper, so the entry stays for the life of the process.
"""

import ctypes
import itertools
import threading

from . import _native
from ._native import Function, get_global_func
from .error import ArgumentError, DeviceError, NotDifferentiableError

__all__ = ["ffi_func", "TARGET"]

#: The XLA custom-call target rivet registers (once per process, on first use).
TARGET = "rivet"

_lock = threading.Lock()
_registered = False
_counter = itertools.count()


def _register_target():
    global _registered
    with _lock:
        if _registered:
            return
        import jax

        lib = ctypes.CDLL(_native.__file__)
        # A capsule of each handler's address. Not through jax.ffi.pycapsule: it sets argtypes on
        # the process-wide `ctypes.pythonapi.PyCapsule_New`, breaking other code that uses it.
        new_capsule = ctypes.PYFUNCTYPE(
            ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
        )(("PyCapsule_New", ctypes.pythonapi))
        for symbol, platform in _HANDLERS:
            handler = ctypes.cast(getattr(lib, symbol), ctypes.c_void_p)
            # Without a CUDA plugin jaxlib keeps the CUDA registration for when one loads.
            jax.ffi.register_ffi_target(TARGET, new_capsule(handler.value, None, None), platform=platform)
        _registered = True


#: The handler exported by rivet's native library for each of XLA's platforms.
_HANDLERS = (("rivet_xla_ffi_handler", "cpu"), ("rivet_xla_ffi_handler_cuda", "CUDA"))


def _as_function(func, arg):
    if isinstance(func, Function):
        return func
    if isinstance(func, str):
        return get_global_func(func)
    raise ArgumentError(
        f"rivet.jax.ffi_func: argument '{arg}' must be a rivet.Function or a registered name, "
        f"got {type(func).__name__}"
    )


def _built_for(func):
    """``"cpu"`` for a function whose tensors live in host memory, ``"gpu"`` for one built for
    CUDA (its tensors may be on any device: it checks them itself), None when it does not say."""
    devices = {p["device"] for p in func._params or () if p["kind"] == "tensor"}
    if devices and devices <= {"host", "cpu"}:
        return "cpu"
    if devices and all(d == "any" or d.startswith("cuda") for d in devices):
        return "gpu"
    return None


def _check_platform(func, args):
    """A concrete ``jax.Array`` argument on a platform the function was not built for is a
    ``DeviceError`` now, naming it (traced arguments are checked when XLA runs the call)."""
    want = _built_for(func)
    if want is None:
        return
    import jax

    for i, a in enumerate(args):
        if not isinstance(a, jax.Array) or isinstance(a, jax.core.Tracer):
            continue
        try:
            platform = next(iter(a.devices())).platform
        except Exception:  # deleted or otherwise unreadable: leave it to XLA
            continue
        if platform != want:
            name = _input_name(func, i)
            raise DeviceError(
                f"{func.name}: argument {i}{name} is a jax.Array on {platform}, but the function "
                f"was built for {'cuda' if want == 'gpu' else 'cpu'}; build it with "
                f"target='{'cuda' if platform == 'gpu' else 'cpu'}' or put the array on "
                f"{'a GPU' if want == 'gpu' else 'the CPU'} (rivet does not copy between devices)"
            )


def _input_name(func, i):
    inputs = [p for p in func._params or () if not p.get("output")]
    return f" ('{inputs[i]['name']}')" if i < len(inputs) and inputs[i].get("name") else ""


def _dtype(name):
    import jax.numpy as jnp

    return jnp.dtype(name)


def _varying(x):
    """The manual mesh axes `x` varies over inside `jax.shard_map` (empty outside one, or on
    JAX versions without varying-axis types)."""
    import jax

    mat = getattr(jax.typeof(x), "mat", None) if hasattr(jax, "typeof") else None
    return frozenset(getattr(mat, "varying", ()) or ())


def _result_type(jax, shape, dtype, varying):
    # The kernel's outputs vary over every manual axis its inputs vary over: typing them as
    # replicated would make JAX skip the reductions their transposes need (wrong gradients).
    if varying:
        mat = jax.sharding.ManualAxisType(
            varying=varying, unreduced=frozenset(), reduced=frozenset()
        )
        mesh = jax.sharding.get_abstract_mesh()
        spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        return jax.ShapeDtypeStruct(shape, dtype, sharding=spec, manual_axis_type=mat)
    return jax.ShapeDtypeStruct(shape, dtype)


def _match_type(jax, grad, primal):
    """A gradient typed like its primal input inside `shard_map`: summed over the axes the
    primal is replicated on (the transpose of JAX's implicit broadcast), marked varying over
    the axes the primal varies on."""
    have, want = _varying(grad), _varying(primal)
    extra = tuple(sorted(have - want))
    if extra:
        grad = jax.lax.psum(grad, extra)
    missing = tuple(sorted(want - _varying(grad)))
    if missing:
        grad = jax.lax.pcast(grad, missing, to="varying")
    return grad


def _call(func, name, vmap_method, args):
    import jax

    for i, a in enumerate(args):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise ArgumentError(
                f"{func.name}: argument {i} must be an array (jax.Array, numpy array or tracer), "
                f"got {type(a).__name__}"
            )
    _check_platform(func, args)
    outs = func.output_shapes(
        [tuple(int(d) for d in a.shape) for a in args], [str(a.dtype) for a in args]
    )
    varying = frozenset().union(*(_varying(a) for a in args))
    types = [_result_type(jax, tuple(s), _dtype(d), varying) for s, d in outs]
    call = jax.ffi.ffi_call(TARGET, types, vmap_method=vmap_method)
    res = call(*args, rivet_function=name)
    return res[0] if len(res) == 1 else tuple(res)


def ffi_func(func, *, backward="auto", vmap_method="sequential"):
    """Wrap a compiled rivet function for use inside ``jax.jit`` / ``grad`` / ``vmap``.

    ``func`` and ``backward`` are ``rivet.Function`` objects or registered names
    (``backward`` may also be ``"auto"``, the default, or None); see the module docstring for
    the conventions. Returns a function of JAX arrays returning one array, or a tuple when
    ``func`` has several outputs.
    """
    import jax

    func = _as_function(func, "func")
    why_not = "it was wrapped with backward=None"
    # With backward="auto", the saved-activations pair when the backward needs forward values
    # (a softmax's exp and sum): the forward under differentiation also writes them, the
    # backward reads them instead of recomputing (docs/gradient.md, "Saved activations").
    fwd_func, n_res = None, 0
    if isinstance(backward, str) and backward == "auto":
        bwd_func, why_not = _derived_backward(func)
        if bwd_func is not None:
            pair = func.training_pair()
            if pair[2] > 0:
                fwd_func, bwd_func, n_res = pair
    else:
        bwd_func = None if backward is None else _as_function(backward, "backward")
    _register_target()
    name = f"rivet.jax.{func.name}#{next(_counter)}"
    _native._register(name, func, False)
    fwd_name = None
    if fwd_func is not None:
        fwd_name = f"rivet.jax.{fwd_func.name}#{next(_counter)}"
        _native._register(fwd_name, fwd_func, False)
    bwd_name = None
    if bwd_func is not None:
        bwd_name = f"rivet.jax.{bwd_func.name}#{next(_counter)}"
        _native._register(bwd_name, bwd_func, False)
    floats = [
        k
        for k, p in enumerate(p for p in func._params or () if not p.get("output"))
        if p["kind"] == "tensor" and p["dtypes"] and set(p["dtypes"]) <= _FLOAT_NAMES
    ]

    def forward(*args):
        return _call(func, name, vmap_method, args)

    @jax.custom_vjp
    def wrapped(*args):
        return forward(*args)

    def fwd(*args):
        if fwd_func is None:
            return forward(*args), (args, ())
        got = _call(fwd_func, fwd_name, vmap_method, args)
        outs = got[: len(got) - n_res]
        return (outs[0] if len(outs) == 1 else tuple(outs)), (args, tuple(got))

    def bwd(saved, cts):
        args, kept = saved
        if bwd_func is None:
            raise NotDifferentiableError(
                f"rivet.jax.ffi_func({func.name}): the function has no backward ({why_not}), "
                "so it cannot be differentiated; pass backward= a rivet function (inputs, then "
                "output cotangents -> input gradients), e.g. one built from rivet.te.gradient"
            )
        cts = cts if isinstance(cts, tuple) else (cts,)
        # The saved backward takes the forward's outputs and residuals after its inputs.
        grads = _call(bwd_func, bwd_name, vmap_method, tuple(args) + kept + tuple(cts))
        grads = grads if isinstance(grads, tuple) else (grads,)
        if len(grads) == len(args):
            which = range(len(args))
        elif len(grads) == len(floats):
            which = floats
        else:
            raise ArgumentError(
                f"rivet.jax.ffi_func({func.name}): backward {bwd_func.name} returns "
                f"{len(grads)} gradient(s) but the function takes {len(args)} input(s), "
                f"{len(floats)} of them float"
            )
        out = [_zero_cotangent(jax, a) for a in args]
        for k, g in zip(which, grads):
            out[k] = _match_type(jax, g, args[k])
        return tuple(out)

    wrapped.defvjp(fwd, bwd)
    wrapped.__name__ = func.name
    wrapped.__doc__ = f"rivet function {func.name}{func.signature or ''} as an XLA FFI call"
    return wrapped


_FLOAT_NAMES = {"float16", "bfloat16", "float32", "float64"}


def _derived_backward(func):
    """``func.backward()`` and no reason, or None and why rivet cannot differentiate it."""
    try:
        return func.backward(), None
    except NotDifferentiableError as e:
        return None, str(e)


def _zero_cotangent(jax, primal):
    """JAX's cotangent for an input that gets no gradient: float0 zeros for ints and bools,
    zeros of the input's type for floats."""
    import numpy as np

    if jax.numpy.issubdtype(primal.dtype, jax.numpy.inexact):
        return jax.numpy.zeros_like(primal)
    return np.zeros(primal.shape, dtype=jax.dtypes.float0)
