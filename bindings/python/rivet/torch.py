"""rivet functions as torch custom operators: ``rivet.torch.custom_op(func, "ns::op")``.

The op is registered through ``torch.library.custom_op`` with everything derived from the
function's typed signature (``Function._params``), so torch.compile, torch.export and
autograd see through it with no user code:

- schema: tensor inputs are ``Tensor`` args, int / float / bool / str scalars their schema
  types, in the function's parameter order. Functional ops (the default) take the inputs and
  return the outputs, allocated by torch; ``mutates=True`` ops take every parameter, outputs
  as mutated arguments (``Tensor(a!)``), and return nothing.
- fake (meta) implementation: checks dtypes, ranks, fixed dims, symbolic dims bound twice and
  devices (with ``torch._check`` so symbolic sizes add no specialisation), and gives each
  output its declared dtype and a shape made of fixed dims and input sizes. An output whose
  dtype or dims the inputs do not determine is refused at registration.
- real implementation: allocates the outputs with ``torch.empty`` and calls the rivet
  function on the torch tensors themselves (no copy; strided views work in place).
- autograd: by default (``backward="auto"``) the function's own backward, derived from its te
  program with ``te.gradient`` (``Function.backward()``); or ``backward=`` a rivet function
  (either way registered as the op ``<name>_backward``, so it is traced like the forward) or
  a Python callable. Where there is none (``backward=None``, or a function rivet cannot
  differentiate), backward raises ``rivet.NotDifferentiableError`` naming the op and why.
- errors: whatever the tensors (sparse, nested, quantized, meta, negative views, huge
  stride-0 views...), a call raises the same rivet error class on both kernel paths and in
  the fake implementation: every failure is first put to ``_Op.check`` (the native path's
  error hook runs it too), outputs are refused over ``rivet.MAX_ALLOC_BYTES`` before any
  allocation, and kernels for the nested and negative/conjugate dispatch keys keep torch's
  own errors out (docs/torch.md "Errors"; tests/python/test_fuzz_torch_ops.py).

Invariant: the fake and real implementations derive output shapes from one table
(``_Op.out_shapes``), so they cannot disagree. torch is imported lazily: ``import rivet``
never needs it. docs/torch.md is the user documentation.
"""

import functools
import itertools
import keyword
import math
import re

from ._native import DTYPES, MAX_ALLOC_BYTES, Function
from .error import (
    ArgumentError,
    DeviceError,
    DLPackError,
    DTypeError,
    Error,
    MemoryError,
    NotDifferentiableError,
    RegistryError,
    ShapeError,
)

__all__ = ["custom_op"]

_SCALAR_SCHEMA = {"int": "int", "float": "float", "bool": "bool", "str": "str"}
_FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*$")
_ASCII_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The dtypes a rivet tensor can have (rivet_runtime::DType): a torch tensor of any other dtype
# (complex, quantized, float8, ...) cannot reach a rivet function.
_RIVET_DTYPES = frozenset(DTYPES)


def custom_op(
    func,
    name,
    *,
    backward="auto",
    mutates=False,
    device_types=None,
    override=False,
    native=None,
):
    """Register the rivet function ``func`` as the torch operator ``name`` ("ns::op").

    Returns the op, ``torch.ops.ns.op``. Keywords:

    - ``backward``: ``"auto"`` (the default: ``func.backward()``, the vector-Jacobian product
      rivet derives from the function's te program; a function it cannot differentiate, such
      as one loaded from a file, gets the error below, with the reason), None (backward
      through the op raises ``rivet.NotDifferentiableError``), a rivet function taking the forward's inputs then one gradient per forward output and
      writing one gradient per differentiable input (tensor inputs of floating dtypes), in
      order, or a Python callable ``backward(ctx, *grads)`` returning one gradient (or None)
      per op input, where ``ctx.inputs`` / ``ctx.outputs`` hold the forward's inputs and
      outputs. Functional ops only.
    - ``mutates``: False (outputs allocated and returned: best for torch.compile) or True
      (outputs passed by the caller and written in place; the op returns nothing).
    - ``device_types``: the torch device types the op accepts; default from the function's
      build (``"cpu"``; ``"cuda"`` for CUDA builds). A tensor on another device is a
      ``rivet.DeviceError`` naming the argument, at trace time and in eager calls.
    - ``override``: replace an op of the same name made by ``custom_op`` (else a taken name
      is a ``rivet.RegistryError``).
    - ``native``: run the op's kernels in C++ (``_torch_native.cpp``: no Python per call
      unless a gradient is recorded). None (default): where possible — a functional op of a
      CPU function, and the C++ bridge builds here (once per machine, cached), unless
      ``RIVET_TORCH_NATIVE=0``; True: required (``rivet.Error`` saying why when it cannot);
      False: the Python kernels of ``torch.library.custom_op``.
    """
    import torch

    op = _Op(func, name, mutates, device_types)
    _check_free(name, override)
    ext = _native_bridge(op, native)
    saved = None
    if isinstance(backward, str) and backward == "auto":
        backward = None if mutates else op.derived_backward()
        if backward is not None:
            # The saved-activations pair when the backward reads forward values worth
            # keeping (docs/gradient.md): the forward run under autograd also writes them.
            pair = func.training_pair()
            if pair[2] > 0:
                saved = pair
    if backward is not None and mutates:
        raise ArgumentError(
            f"rivet.torch.custom_op: argument 'backward' needs a functional op, but {name!r} "
            "is registered with mutates=True (torch has no autograd for ops that write "
            "their arguments); register it with mutates=False"
        )
    bwd = _Backward(op, backward, override, native, saved) if backward is not None else None
    ns, opname = name.split("::")
    _release(name)
    if ext is not None:
        from . import _torch_native

        _NATIVE_OPS[name] = _torch_native.register(
            ext, op, bwd, name, op.no_backward, _setup_context
        )
        _refuse_nested(op, _NATIVE_OPS[name][0], name)
        _resolve_views(op, _NATIVE_OPS[name][0], name)
        return getattr(getattr(torch.ops, ns), opname)
    cdef = torch.library.custom_op(name, op.run, mutates_args=op.mutated, schema=op.schema)
    cdef.register_fake(op.fake)
    _refuse_nested(op, cdef._lib, name)
    if not mutates:
        _resolve_views(op, cdef._lib, name)
    packet = getattr(getattr(torch.ops, ns), opname)
    if bwd is not None and bwd.saved is not None:
        # Autograd through the forward with residuals: an Autograd kernel of our own, as
        # the native path's (register_autograd would save only the op's own outputs).
        cdef._lib.impl(opname, bwd.autograd_kernel(packet.default), "Autograd", with_keyset=True)
    elif not mutates:
        cdef.register_autograd(
            bwd.backward if bwd else op.no_backward, setup_context=_setup_context
        )
    else:
        # torch has no autograd for ops that write their arguments, and custom_op's default
        # would run one silently, leaving the written output without a grad_fn: refuse at the
        # call instead. (`_lib` is the op's own torch.library.Library: replacing its Autograd
        # kernel there is an override, not a second registration.)
        kernel = op.mutating_autograd(packet.default)
        cdef._lib.impl(opname, kernel, "Autograd", with_keyset=True)
    return packet


class _Op:
    """The signature-derived pieces of one op: schema, checks, output shapes, kernels."""

    def __init__(self, func, name, mutates, device_types):
        if not isinstance(func, Function):
            raise ArgumentError(
                "rivet.torch.custom_op: argument 0 ('func') must be a rivet.Function, got "
                f"{type(func).__name__}"
            )
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ArgumentError(
                "rivet.torch.custom_op: argument 1 ('name') must be 'namespace::op_name' "
                f"(identifiers, e.g. 'mylib::gemm'), got {name!r}"
            )
        params = func._params
        if params is None:
            raise ArgumentError(
                f"rivet.torch.custom_op: rivet function {func.name!r} has no typed signature; "
                "only typed functions (compiled with rivet.build, rivet.kernels) can be torch ops"
            )
        self.func, self.name, self.mutates, self.params = func, name, mutates, params
        self.where = f"{name} (rivet function {func.name!r})"
        self._check_kinds()
        self.outputs = [i for i, p in enumerate(params) if _is_output(p)]
        if not self.outputs:
            raise ArgumentError(f"{self.where}: the function writes no output tensor")
        self.device_types = self._device_types(device_types)
        names = _schema_names(params)
        # The op's arguments: every parameter (mutating op) or the inputs (functional op).
        # pos[i] is parameter i's position among them; None marks an allocated output.
        taken = [mutates or not _is_output(p) for p in params]
        self.pos = list(itertools.accumulate(taken, initial=0))[:-1]
        self.pos = [k if t else None for k, t in zip(self.pos, taken)]
        self.mutated = [names[i] for i in self.outputs] if mutates else []
        schema_args = [
            f"{_schema_type(p, mutates, i)} {names[i]}" for i, p in enumerate(params) if taken[i]
        ]
        n_out = len(self.outputs)
        ret = "Tensor" if n_out == 1 else f"({', '.join(['Tensor'] * n_out)})"
        self.schema = f"({', '.join(schema_args)}) -> {'()' if mutates else ret}"
        self.out_table = None if mutates else [self._out_recipe(i) for i in self.outputs]

    def _check_kinds(self):
        for i, p in enumerate(self.params):
            if p["kind"] != "tensor" and p["kind"] not in _SCALAR_SCHEMA:
                raise ArgumentError(
                    f"{self.where}: argument {i} ('{p['name']}') is of kind {p['kind']!r}, "
                    "which a torch schema cannot express (tensors, int, float, bool, str only)"
                )

    def _device_types(self, given):
        rules = {p["device"] for p in self.params if p["kind"] == "tensor"}
        cuda = "any" in rules or any(r.startswith("cuda") for r in rules)
        built = ("cuda",) if cuda else ("cpu",)
        if given is None:
            return built
        given = (given,) if isinstance(given, str) else tuple(given)
        extra = [d for d in given if d not in built]
        if extra:
            raise DeviceError(
                f"{self.where}: device_types {given} includes {extra[0]!r}, but the function "
                f"was built for {built[0]!r}; build it for {extra[0]!r} (target=...) instead"
            )
        return given

    def _out_recipe(self, i):
        """(dtype, dims) of output parameter i: per dim an int or (arg position, dim)."""
        p = self.params[i]
        what = f"{self.where}: output {i} ('{p['name']}')"
        if len(p["dtypes"]) != 1:
            raise ArgumentError(
                f"{what} has dtype {'|'.join(p['dtypes']) or 'any'}, not one dtype: a "
                "functional op cannot tell which to allocate; register it with mutates=True"
            )
        if p["shape"] is None:
            raise ArgumentError(
                f"{what} has no declared rank: a functional op cannot allocate it; register "
                "it with mutates=True"
            )
        dims = []
        for d, dim in enumerate(p["shape"]):
            if isinstance(dim, int):
                dims.append(dim)
                continue
            src = self._binding(dim) if dim is not None else None
            if src is None:
                shown = "an expression of the dims" if dim is None else f"'{dim}'"
                raise ArgumentError(
                    f"{what} dim {d} is {shown}, which no input's shape gives, so its size "
                    "cannot be derived from the inputs; register it with mutates=True and "
                    "pass the output"
                )
            dims.append(src)
        return _dtype(p["dtypes"][0]), dims

    def _binding(self, var):
        for i, p in enumerate(self.params):
            if p["kind"] == "tensor" and not _is_output(p) and p["shape"] is not None:
                if var in p["shape"]:
                    return self.pos[i], p["shape"].index(var)
        return None

    def out_shapes(self, args):
        return [
            (dtype, [d if isinstance(d, int) else args[d[0]].shape[d[1]] for d in dims])
            for dtype, dims in self.out_table
        ]

    def check_size(self, args, k, shape, dtype, fake):
        """Refuses output ``k`` of ``shape`` when its bytes are over rivet's allocation limit
        (``rivet.MAX_ALLOC_BYTES``, which rivet's own allocations and the native kernel
        apply): a ``rivet.MemoryError`` worded as the native kernel words it, so both paths
        and the fake implementation agree. torch.empty would give a RuntimeError instead
        (an overflowing size) or try to allocate terabytes. Symbolic sizes (torch.compile
        with dynamic shapes) are left to the kernel, which sees their values at run time: a
        torch._check here would add a runtime assertion to every compiled graph."""
        if not all(type(d) is int for d in shape):
            return
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes <= MAX_ALLOC_BYTES:
            return
        if not fake:
            self.check(args, fake=False)  # a signature violation is reported first, as natively
        size = "more than 2^63 bytes" if nbytes >= 2**63 else f"{nbytes} bytes"
        raise MemoryError(
            f"{self.where}: cannot allocate output {k} of shape {list(shape)} "
            f"({str(dtype).removeprefix('torch.')}): {size}, over rivet's limit of "
            f"{MAX_ALLOC_BYTES} bytes (rivet.MAX_ALLOC_BYTES)"
        )

    def check(self, args, fake):
        """The signature's checks with the op's name; torch._check so symbolic sizes only
        add the constraints (no specialisation on a size)."""
        import torch

        bound = {}
        first = None  # (device, arg) of the first tensor argument
        for i, p in enumerate(self.params):
            k = self.pos[i]
            if k is None or p["kind"] != "tensor":
                continue
            t, arg = args[k], f"argument {k} ('{p['name']}')"
            # Tensors DLPack cannot describe, refused before anything reads their sizes
            # (a nested tensor has none): the Python kernel would get rivet's DLPackError
            # from the export, the native kernel torch's RuntimeError from data_ptr().
            kind = _undescribable(t)
            if kind is not None:
                raise DLPackError(
                    f"{self.name}: {arg} is {kind}, but rivet takes dense strided tensors "
                    "only (DLPack cannot describe it); "
                    + ("pass its components (.unbind())" if t.is_nested else "pass .to_dense()")
                )
            dtype = str(t.dtype).removeprefix("torch.")
            if p["dtypes"] and dtype not in p["dtypes"]:
                raise DTypeError(
                    f"{self.name}: {arg} expected dtype {' or '.join(p['dtypes'])}, got {dtype}"
                )
            if dtype not in _RIVET_DTYPES:
                raise DTypeError(
                    f"{self.name}: {arg} has dtype {dtype}, which rivet has no type for"
                )
            dev = t.device.type
            if dev not in self.device_types and not (fake and dev == "meta"):
                raise DeviceError(
                    f"{self.name}: {arg} is on {t.device}, but the rivet function "
                    f"{self.func.name!r} runs on {' or '.join(self.device_types)} tensors; "
                    "rivet does not copy between devices (build the function for that device)"
                )
            if first is None:
                first = (t.device, arg)
            elif t.device != first[0]:
                # Meta tensors mixed with real ones would otherwise reach the fake
                # implementation (the op's Meta kernel) and give a meta result for CPU data.
                raise DeviceError(
                    f"{self.name}: tensors on different devices: {first[1]} is on "
                    f"{first[0]} but {arg} is on {t.device}; rivet does not copy between devices"
                )
            shape = p["shape"]
            if shape is None:
                continue
            if t.dim() != len(shape):
                raise ShapeError(
                    f"{self.name}: {arg} expected a {len(shape)}-d tensor, got "
                    f"{t.dim()}-d of shape {tuple(t.shape)}"
                )
            for d, want in enumerate(shape):
                got = t.shape[d]
                if isinstance(want, int):
                    torch._check_with(
                        ShapeError,
                        got == want,
                        lambda: f"{self.name}: {arg} expected size {want} in dim {d}, "
                        f"got shape {tuple(t.shape)}",
                    )
                elif want is not None and want in bound:
                    val, where = bound[want]
                    torch._check_with(
                        ShapeError,
                        got == val,
                        lambda: f"{self.name}: dim '{want}' is {val} from {where} "
                        f"but {got} from {arg} (dim {d})",
                    )
                elif want is not None:
                    bound[want] = (got, arg)

    def fake(self, *args):
        self.check(args, fake=True)
        if self.mutates:
            return None
        return self.allocate(args, fake=True)

    def allocate(self, args, fake=False):
        """The outputs, from the output table; ``fake``: under fake tensors (the arguments
        checked already). The real kernel does not check before allocating (the success
        path stays cheap), so a failure here is first put to the signature check: the
        same error, worded the same, as the native kernel's (whose error hook runs the
        check first too)."""
        import torch

        dev = _first_device(args)
        try:
            shapes = self.out_shapes(args)
        except IndexError:
            # An input of lower rank than the signature's: the check words it (ShapeError).
            self.check(args, fake=fake)
            raise ShapeError(f"{self.where}: an input has the wrong rank") from None
        outs = []
        for k, (dt, s) in enumerate(shapes):
            self.check_size(args, k, s, dt, fake)
            try:
                outs.append(torch.empty(s, dtype=dt, device=dev))
            except RuntimeError as e:
                # The system refused the allocation (under rivet's limit): rivet's class, as
                # the native kernel and rivet's own allocations give, never torch's.
                if not fake:
                    self.check(args, fake=False)
                raise MemoryError(
                    f"{self.where}: cannot allocate output {k} of shape {list(s)}: "
                    f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                ) from None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run(self, *args):
        import torch

        types = self.device_types
        if any(isinstance(a, torch.Tensor) and a.device.type not in types for a in args):
            self.check(args, fake=False)  # words the device error
        # Tensors reaching the kernel below autograd still carry requires_grad, which rivet
        # refuses (writing them would corrupt autograd); detach() is a view, not a copy.
        args = [a.detach() if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args]
        if self.mutates:
            self.call(args, args)
            return None
        result = self.allocate(args)
        it = iter(result if isinstance(result, tuple) else (result,))
        self.call(args, [next(it) if k is None else args[k] for k in self.pos])
        return result

    def call(self, args, full):
        try:
            self.func(*full)
        except Error:
            # Reword a signature violation with the op's name and argument positions (the
            # check costs nothing on the success path); anything else is rivet's own error.
            self.check(args, fake=False)
            raise

    def mutating_autograd(self, overload):
        import torch

        def kernel(keyset, *args):
            if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
                raise NotDifferentiableError(
                    f"{self.where} writes its outputs in place (mutates=True), which autograd "
                    "cannot differentiate, but an argument requires grad; call it under "
                    "torch.no_grad() or on .detach()ed tensors, or register it with "
                    "mutates=False and backward="
                )
            with torch._C._AutoDispatchBelowAutograd():
                return overload.redispatch(keyset & torch._C._after_autograd_keyset, *args)

        return kernel

    def derived_backward(self):
        """The function's own backward (``Function.backward()``), or None when rivet cannot
        differentiate it; the reason is kept for the error a backward pass then raises."""
        if not any(_differentiable(p) for p in self.params if not _is_output(p)):
            self.why_not = "it has no float tensor inputs"
            return None
        try:
            return self.func.backward()
        except NotDifferentiableError as e:
            self.why_not = str(e)
            return None

    why_not = "it was registered with backward=None"

    def no_backward(self, ctx, *grads):
        raise NotDifferentiableError(
            f"{self.where} has no backward ({self.why_not}), so no gradient flows through it; "
            "pass backward= (a rivet function or a Python callable) to rivet.torch.custom_op, "
            "or call the op on tensors that do not require grad (.detach())"
        )


class _Backward:
    """The autograd formula of an op: a rivet backward function registered as the op
    ``<name>_backward`` (so torch.compile traces the backward too), or a Python callable."""

    def __init__(self, op, backward, override, native, saved=None):
        self.op = op
        inputs = [p for p in op.params if not _is_output(p)]
        self.diff = [k for k, p in enumerate(inputs) if _differentiable(p)]
        self.saved = None
        if saved is not None:
            # `Function.training_pair()`: `<name>_fwd` returns the outputs then the residuals;
            # `<name>_backward` takes inputs, outputs, residuals, then the output gradients.
            fwd, bwd, n_res = saved
            self.fwd_op = custom_op(
                fwd, op.name + "_fwd", backward=None, override=override, native=native
            )
            self.bwd_op = custom_op(
                bwd, op.name + "_backward", backward=None, override=override, native=native
            )
            self.user = None
            self.saved = self.saved_function(n_res)
        elif isinstance(backward, Function):
            self.check_rivet(backward, len(inputs))
            # The backward op itself is not differentiated (no double backward): deriving a
            # second-order program at every registration would cost a build nobody asked for.
            self.bwd_op = custom_op(
                backward, op.name + "_backward", backward=None, override=override, native=native
            )
            self.user = None
        elif callable(backward):
            self.bwd_op, self.user = None, backward
        else:
            raise ArgumentError(
                f"rivet.torch.custom_op: argument 'backward' must be a rivet.Function, a "
                f"callable or None, got {type(backward).__name__}"
            )

    def check_rivet(self, backward, n_in):
        params = backward._params or []
        n_out = len(self.op.outputs)
        ins = [p for p in params if not _is_output(p)]
        outs = [p for p in params if _is_output(p)]
        if len(ins) != n_in + n_out or len(outs) != len(self.diff):
            raise ArgumentError(
                f"{self.op.where}: the backward rivet function {backward.name!r} must take "
                f"the forward's {n_in} input(s) then {n_out} output gradient(s), and write "
                f"{len(self.diff)} gradient(s) (one per differentiable input), but it takes "
                f"{len(ins)} input(s) and writes {len(outs)}"
            )

    def backward(self, ctx, *grads):
        saved = list(ctx.saved_tensors)
        inputs = [saved.pop(0) if s is None else s[0] for s in ctx.rivet_scalars]
        if self.user is not None:
            ctx.inputs, ctx.outputs = tuple(inputs), tuple(saved)
            return self.user(ctx, *grads)
        got = self.bwd_op(*inputs, *grads)
        got = (got,) if not isinstance(got, tuple) else got
        result = [None] * len(inputs)
        for k, g in zip(self.diff, got):
            result[k] = g
        return tuple(result)


    def saved_function(self, n_res):
        """The autograd.Function of the saved-activations path: its forward runs the
        ``_fwd`` op (outputs, then residuals), all of which it returns (the residuals marked
        non-differentiable; `autograd_kernel` hands back only the outputs) and saves."""
        import torch

        fwd_op, bwd_op, diff = self.fwd_op, self.bwd_op, self.diff

        def forward(*args):
            return fwd_op(*args)

        def setup_context(ctx, inputs, output):
            _setup_context(ctx, inputs, output)
            ctx.mark_non_differentiable(*output[len(output) - n_res :])

        def backward(ctx, *grads):
            saved = list(ctx.saved_tensors)
            inputs = [saved.pop(0) if s is None else s[0] for s in ctx.rivet_scalars]
            n_out = len(saved) - n_res
            got = bwd_op(*inputs, *saved, *grads[:n_out])
            got = got if isinstance(got, tuple) else (got,)
            result = [None] * len(inputs)
            for k, g in zip(diff, got):
                result[k] = g
            return tuple(result)

        # Named after the op: grad_fn shows as <rivet_<op>Backward>.
        return type(
            f"rivet_{self.op.name.split('::')[1]}",
            (torch.autograd.Function,),
            {
                "forward": staticmethod(forward),
                "setup_context": staticmethod(setup_context),
                "backward": staticmethod(backward),
            },
        )

    def apply_saved(self, *args):
        """The op's outputs, computed under autograd through the saved-activations path."""
        got = self.saved.apply(*args)
        n_out = len(self.op.outputs)
        return got[0] if n_out == 1 else tuple(got[:n_out])

    def autograd_kernel(self, overload):
        """The op's Autograd kernel on the Python path: the saved-activations Function when
        a gradient is recorded, else the kernel below autograd."""
        import torch

        def kernel(keyset, *args):
            if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
                return self.apply_saved(*args)
            with torch._C._AutoDispatchBelowAutograd():
                return overload.redispatch(keyset & torch._C._after_autograd_keyset, *args)

        return kernel


def _setup_context(ctx, inputs, output):
    import torch

    # Tensors go through save_for_backward (version-checked); scalars ride on ctx as (value,).
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    outs = output if isinstance(output, tuple) else (output,)
    ctx.save_for_backward(*tensors, *outs)
    ctx.rivet_scalars = [None if isinstance(a, torch.Tensor) else (a,) for a in inputs]


def _check_free(name, override):
    import torch

    ns, opname = name.split("::")
    from torch._library.custom_ops import OPDEFS

    ours = name in OPDEFS or name in _NATIVE_OPS
    if hasattr(getattr(torch.ops, ns), opname) and not (override and ours):
        how = "" if ours else " (not by rivet.torch.custom_op: it cannot be replaced)"
        raise RegistryError(
            f"rivet.torch.custom_op: the torch op {name!r} exists already{how}; choose another "
            "name" + (", or pass override=True" if ours else "")
        )


# Ops registered on the native path: name -> (torch.library.Library, C++ registration id).
_NATIVE_OPS = {}


def _release(name):
    """Before (re)defining ``name``: drop a previous native registration's C++ kernels, and
    forget a previous custom_op definition (its library is dropped by the new definition)."""
    from torch._library.custom_ops import OPDEFS

    old = _NATIVE_OPS.pop(name, None)
    if old is not None:
        from . import _torch_native

        _torch_native.extension().unregister(old[1])
    OPDEFS.pop(name, None)


def _native_bridge(op, native):
    """The C++ bridge when the op takes the native path (see ``custom_op``), else None."""
    import os

    if native not in (None, True, False):
        raise ArgumentError(
            f"rivet.torch.custom_op: argument 'native' must be None, True or False, got {native!r}"
        )
    env = os.environ.get("RIVET_TORCH_NATIVE")
    if native is False or (native is None and env == "0"):
        return None
    why = None
    if op.mutates:
        why = "ops with mutates=True take the Python path"
    elif op.device_types != ("cpu",):
        why = f"the op runs on {op.device_types} (the native path is CPU only for now)"
    if why is None:
        from . import _torch_native

        try:
            return _torch_native.extension()
        except _torch_native.NativeUnavailable as e:
            why = f"the C++ bridge is unavailable: {e}"
    if native or env == "1":
        raise Error(f"{op.where}: native=True, but {why}")
    return None


def _is_output(p):
    return p["kind"] == "tensor" and p["output"]


def _differentiable(p):
    return p["kind"] == "tensor" and bool(p["dtypes"]) and set(p["dtypes"]) <= _FLOAT_DTYPES


def _schema_type(p, mutates, i):
    if mutates and _is_output(p):
        return f"Tensor(a{i}!)"  # written in place: an alias set of its own
    return "Tensor" if p["kind"] == "tensor" else _SCALAR_SCHEMA[p["kind"]]


def _schema_names(params):
    """The parameters' names in the op's schema (what keyword arguments of the op use).

    torch's schema parser takes ASCII identifiers only, and refuses words of its own besides
    Python's keywords ('Ellipsis'): a rivet name such as 'α', a valid Python identifier, made
    ``torch.library`` raise a RuntimeError at registration. A name torch accepts is kept
    as it is; any other one (and a repeated one after its first use) becomes ``argN``, N
    the parameter's position (``argN_1``, ``argN_2``, ... if a kept name is ``argN``).
    Kept names are chosen first, so a replacement never takes a real parameter's name and
    the result depends on the names alone."""
    keep = [None] * len(params)
    taken = set()
    for i, p in enumerate(params):
        n = p["name"]
        if _schema_accepts(n) and n not in taken:
            keep[i] = n
            taken.add(n)
    names = []
    for i, n in enumerate(keep):
        if n is None:
            n, k = f"arg{i}", 0
            while n in taken:
                k += 1
                n = f"arg{i}_{k}"
            taken.add(n)
        names.append(n)
    return names


@functools.lru_cache(maxsize=1024)
def _schema_accepts(name):
    """Whether ``name`` can be an argument's name in a torch schema (asked of torch's own
    parser, so a word torch reserves is found whatever torch's version)."""
    import torch

    if not isinstance(name, str) or not _ASCII_IDENT.fullmatch(name):
        return False
    if keyword.iskeyword(name) or name.startswith("__"):
        return False
    try:
        torch._C.parse_schema(f"rivet_probe::f(Tensor {name}) -> ()")
    except RuntimeError:
        return False
    return True


def _resolve_views(op, lib, name):
    """Kernels of a functional op for tensors with the negative or conjugate bit
    (``torch._neg_view``, ``.conj()``): what torch's fallback for those keys does, a copy of
    each such input with the bit resolved, then the op, but with the op's checks first.

    torch's fallback copies before any kernel of the op runs, so a negative view of a huge
    stride-0 tensor (found by tests/python/test_fuzz_torch_ops.py) gave torch's RuntimeError
    from its allocator, or a copy of terabytes where memory is overcommitted, instead of the
    op's own error: here the signature and the outputs' sizes are checked first, and a copy
    over rivet's allocation limit, or one the system refuses, is rivet's MemoryError. The
    dispatcher reaches these keys only for such tensors: other calls never run this."""
    import torch

    ns, opname = name.split("::")
    overload = getattr(getattr(torch.ops, ns), opname).default
    bits = (torch._C.DispatchKey.Negative, torch._C.DispatchKey.Conjugate)
    names = {k: p["name"] for k, p in zip(op.pos, op.params) if k is not None}

    def kernel(keyset, *args):
        from torch._subclasses.fake_tensor import is_fake

        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        fake = any(t.is_meta or is_fake(t) for t in tensors)
        op.check(args, fake=fake)
        for k, (dt, s) in enumerate(op.out_shapes(args)):
            op.check_size(args, k, s, dt, fake)
        resolved = []
        for k, a in enumerate(args):
            if isinstance(a, torch.Tensor) and (a.is_neg() or a.is_conj()):
                nbytes = math.prod(a.shape) * a.dtype.itemsize
                why = None
                if nbytes > MAX_ALLOC_BYTES:
                    why = f"{nbytes} bytes, over rivet's limit of {MAX_ALLOC_BYTES} bytes"
                else:
                    try:
                        a = a.resolve_neg().resolve_conj()
                    except RuntimeError as e:
                        why = str(e).splitlines()[0] if str(e) else type(e).__name__
                if why is not None:
                    raise MemoryError(
                        f"{op.where}: argument {k} ('{names[k]}') is a negative or conjugate "
                        "view, which torch copies to resolve before any kernel, and the copy "
                        f"of shape {list(a.shape)} cannot be allocated: {why}"
                    )
            resolved.append(a)
        for key in bits:
            keyset = keyset.remove(key)
        return overload.redispatch(keyset, *resolved)

    for key in ("Negative", "Conjugate"):
        lib.impl(opname, kernel, key, with_keyset=True)


def _undescribable(t):
    """What a torch tensor DLPack cannot describe is ("a nested tensor", "a sparse_coo
    tensor", ...), or None for a dense strided one."""
    import torch

    if t.is_nested:
        return "a nested tensor"
    if t.layout != torch.strided:
        return f"a {str(t.layout).removeprefix('torch.')} tensor"
    return None


def _refuse_nested(op, lib, name):
    """Kernels refusing nested tensors (torch.nested) with the op's DLPackError. torch's
    dispatcher has no kernel of the op for them (CompositeExplicitAutograd does not cover the
    NestedTensor keys, and a jagged nested tensor is a Python subclass that knows only its
    own ops), so the call would be torch's NotImplementedError on both paths."""
    import torch

    ns, opname = name.split("::")

    def kernel(*args):
        op.check(args, fake=False)  # raises DLPackError naming the argument
        raise DLPackError(f"{op.where}: nested tensors cannot be passed to rivet")

    for key in ("NestedTensorCPU", "NestedTensorCUDA", "NestedTensorMeta"):
        if hasattr(torch._C.DispatchKey, key):
            lib.impl(opname, kernel, key)
    try:
        from torch.nested._internal.nested_tensor import NestedTensor
    except ImportError:
        return

    def rule(cls, func, types, args=(), kwargs=None):
        return kernel(*args, *(kwargs or {}).values())

    torch.library.register_torch_dispatch(name, NestedTensor, rule, lib=lib)


def _dtype(name):
    import torch

    return getattr(torch, name)


def _first_device(args):
    import torch

    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")
