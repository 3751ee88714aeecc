"""The native path of ``rivet.torch.custom_op``: the op's kernels in C++ (``_torch_native.cpp``),
so a call through torch's dispatcher (eager, or inside a ``torch.compile`` graph) runs no
Python unless a gradient is being recorded. docs/torch.md "The native path" is the user
documentation.

The C++ file is compiled against the installed torch and rivet's C header (the package's copy
of ``runtime/include/rivet/c_api.h``, ``rivet/include``) on first use (the C++ compiler
``$CXX``, else ``c++``; about a minute) and cached under rivet's cache folder
(``RIVET_CACHE_DIR``, else ``$XDG_CACHE_HOME/rivet`` or ``~/.cache/rivet``), keyed by the
source, the header, torch's version and the Python version, so every later process loads it
at once. A file lock serialises the first compile between processes (``torch.distributed``
workers start together).

Invariants: the schema and the fake implementation are the Python path's (``_Op``), so both
paths trace identically; only the real kernel and the autograd dispatch move to C++. The
autograd formula is the Python path's too (``_Backward`` / ``_setup_context``), wrapped in an
``autograd.Function`` that the C++ Autograd kernel calls only when a gradient is needed.
"""

import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import itertools
import os
import subprocess
import sys
import sysconfig

from . import _native
from .error import Error

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = os.path.join(_HERE, "_torch_native.cpp")
# rivet's C header, shipped in the package (a copy of runtime/include/rivet/c_api.h; a test
# checks that the two are the same).
_INCLUDE = os.path.join(_HERE, "include")
_HEADER = os.path.join(_INCLUDE, "rivet", "c_api.h")
_KINDS = {"int": 2, "float": 3, "bool": 4, "str": 5}
_counter = itertools.count()
_state = {}  # "ext": the loaded module, or "error": why it could not be built


class NativeUnavailable(Exception):
    """The C++ bridge cannot be built or loaded here (no compiler, no torch headers...)."""


def _cache_dir():
    d = os.environ.get("RIVET_CACHE_DIR")
    if d in ("", "off"):
        import tempfile

        return os.path.join(tempfile.gettempdir(), f"rivet-{os.getuid()}")
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rivet")


def _compile(torch, out):
    from torch.utils import cpp_extension as ce

    cxx = os.environ.get("CXX", "c++")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [
        cxx, "-O2", "-shared", "-fPIC", "-std=c++20", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *[f"-I{p}" for p in ce.include_paths()],
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{_INCLUDE}",
        _SOURCE, "-o", out,
        *[f"-L{p}" for p in ce.library_paths()],
        "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
    ]  # fmt: skip
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise NativeUnavailable(f"no C++ compiler ({cxx!r}: {e}); set CXX") from None
    if p.returncode != 0:
        raise NativeUnavailable(f"compiling {_SOURCE} failed:\n{p.stderr[-4000:]}")


def _load(torch):
    src = b""
    for name in (_SOURCE, _HEADER):
        with open(name, "rb") as f:
            src += f.read()
    key = hashlib.sha256(
        src + torch.__version__.encode() + sys.version.encode() + sysconfig.get_config_var("EXT_SUFFIX").encode()
    ).hexdigest()[:20]
    folder = os.path.join(_cache_dir(), "torch_native")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rivet_torch_native-{key}{sysconfig.get_config_var('EXT_SUFFIX')}")
    if not os.path.exists(path):
        import fcntl

        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be compiling it
            if not os.path.exists(path):
                tmp = f"{path}.{os.getpid()}.tmp"
                try:
                    _compile(torch, tmp)
                    os.replace(tmp, path)  # atomic: readers never see a partial file
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
    loader = importlib.machinery.ExtensionFileLoader("rivet_torch_native", path)
    spec = importlib.util.spec_from_file_location("rivet_torch_native", path, loader=loader)
    ext = importlib.util.module_from_spec(spec)
    loader.exec_module(ext)
    lib = ctypes.CDLL(_native.__file__)
    addr = lambda sym: ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value  # noqa: E731
    ext.init(
        addr("RivetFunctionCall"), addr("RivetAnyFree"), addr("RivetGetLastError"),
        addr("RivetAbiVersion"), _native.MAX_ALLOC_BYTES,
    )  # fmt: skip
    return ext


def extension():
    """The loaded bridge; ``NativeUnavailable`` (with the reason, remembered) if it cannot be."""
    import torch

    if "ext" not in _state and "error" not in _state:
        try:
            _state["ext"] = _load(torch)
        except NativeUnavailable as e:
            _state["error"] = str(e)
        except (OSError, ImportError) as e:
            _state["error"] = f"{type(e).__name__}: {e}"
    if "error" in _state:
        raise NativeUnavailable(_state["error"])
    return _state["ext"]


def _handle(func, regname):
    """A C ABI handle of ``func``, registered under ``regname`` (kept for the process)."""
    _native._register(regname, func, False)
    lib = ctypes.CDLL(_native.__file__)
    h = ctypes.c_void_p()
    name = regname.encode()
    if lib.RivetFunctionGetGlobal(ctypes.c_char_p(name), ctypes.byref(h)) != 0:
        raise Error(f"rivet.torch: could not get a handle of {regname!r}")
    return h.value


def register(ext, op, bwd, name, no_backward, setup_context):
    """Defines the op ``name`` with ``op``'s schema and fake implementation (Python) and its
    kernels in C++; returns (torch.library.Library, registration id)."""
    import torch

    from torch._library.custom_ops import get_library_allowing_overwrite

    ns, opname = name.split("::")
    lib = get_library_allowing_overwrite(ns, opname)  # drops a replaced op's definition
    lib.define(f"{opname}{op.schema}")
    torch.library.register_fake(name, op.fake, lib=lib)
    overload = getattr(getattr(torch.ops, ns), opname).default
    formula = bwd.backward if bwd is not None else no_backward

    def forward(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return overload(*args)

    def backward(ctx, *grads):
        return formula(ctx, *grads)

    # Named after the op: grad_fn shows as <rivet_<op>Backward>.
    Forward = type(
        f"rivet_{opname}",
        (torch.autograd.Function,),
        {
            "forward": staticmethod(forward),
            "setup_context": staticmethod(setup_context),
            "backward": staticmethod(backward),
        },
    )

    def on_error(kind, message, *args):
        # A callback's own exception comes back as that object; signature violations are
        # worded with the op's name (the Python path's checks); anything else is the rivet
        # error of the failure's kind, as rivet raised it.
        foreign = _native._take_last_foreign_error()
        if foreign is not None:
            raise foreign
        op.check(args, fake=False)
        from . import error

        cls = getattr(error, kind, None)
        if not (isinstance(cls, type) and issubclass(cls, Error)):
            cls = Error
        if not message.startswith(op.func.name):
            message = f"{op.where}: {message or 'failed'}"
        raise cls(message)

    params, arg_of = [], []
    for i, p in enumerate(op.params):
        if p["kind"] == "tensor":
            params.append(1 if p["output"] else 0)
        else:
            params.append(_KINDS[p["kind"]])
        arg_of.append(-1 if op.pos[i] is None else op.pos[i])
    outs = [
        (op.params[i]["dtypes"][0], [(-1, d) if isinstance(d, int) else tuple(d) for d in dims])
        for i, (_, dims) in zip(op.outputs, op.out_table)
    ]
    handle = _handle(op.func, f"rivet.torch.{name}#{next(_counter)}")
    num_args = sum(1 for k in op.pos if k is not None)
    # With saved activations, the autograd path is the backward's own Function (outputs and
    # residuals from the `_fwd` op, the outputs handed back).
    grad_path = bwd.apply_saved if bwd is not None and bwd.saved is not None else Forward.apply
    reg = ext.register(ns, opname, handle, params, arg_of, outs, num_args, grad_path, on_error)
    ext.bind(ext.slot(name, overload), reg)
    _install_codegen(name, overload)
    return lib, reg


def compiled_kernel(name, dtypes):
    """What the code torch.compile generates calls for the op ``name`` (see _install_codegen),
    whose graph expects outputs of ``dtypes`` (rivet dtype names, one per output): the op's C++
    kernel without torch's dispatcher, through the op's slot (so a replaced op is followed), or
    the op's OpOverload where this process has no native bridge (a graph cached on disk, loaded
    by a process that registered the op on the Python path). Either way the outputs' dtypes are
    checked on every call: the generated code checks only sizes and strides."""
    import torch

    ns, opname = name.split("::")
    overload = getattr(getattr(torch.ops, ns), opname).default
    ext = _state.get("ext")
    if ext is not None:
        return functools.partial(ext.call, ext.binding(ext.slot(name, overload), tuple(dtypes)))
    want = [getattr(torch, d) for d in dtypes]

    def call(*args):
        out = overload(*args)
        got = [out] if len(want) == 1 else list(out)
        if [t.dtype for t in got] != want:
            from .error import DTypeError

            raise DTypeError(
                f"{name}: outputs of dtypes {[str(t.dtype) for t in got]}, but the torch.compile "
                f"graph calling the op expects {[str(d) for d in want]}: the op changed after "
                "the graph was compiled; compile it again (torch._dynamo.reset())"
            )
        return out

    return call


def _install_codegen(name, overload):
    """Makes inductor's Python wrapper call the op through ``compiled_kernel`` instead of
    ``torch.ops.ns.op.default``: the dispatcher's argument parsing and boxed kernels cost more
    than the kernel itself on small tensors (docs/torch.md "The native path"). Uses inductor's
    registry of custom extern-kernel code generators (a private API of torch 2.15); where it is
    missing, the generated code keeps calling the OpOverload, which runs the same kernel.

    The output checks inductor emits after a fallback kernel (``assert_tensor_metadata``: size,
    stride and dtype, in Python) become ``assert_size_stride`` (size and stride, in C++) with
    the dtypes checked by ``compiled_kernel``'s callable: the same checks, for about a
    microsecond less per call. Returns whether the hook is installed."""
    try:
        from torch._inductor import config, ir
        from torch._inductor.codegen import custom_extern_kernel_codegen as cg
        from torch._inductor.virtualized import V
    except ImportError:
        return False
    ns, opname = name.split("::")
    key = f"{overload.__module__.replace('._ops.', '.ops.')}.{overload.__name__}"

    def size_stride_asserts(node, wrapper):
        if config.size_asserts:
            wrapper.write_assert_size_stride(
                node.get_assert_name(),
                V.graph.wrapper_code.codegen_shape_tuple(node.get_size()),
                V.graph.wrapper_code.codegen_shape_tuple(node.get_stride()),
                node.get_op_name(),
                None,
            )

    def python(node, writeline):
        w = V.graph.wrapper_code
        if V.graph.cpp_wrapper:
            # inductor's C++ wrapper reaches here only for ops in its C-shim table: its own
            # line, as without this hook.
            from torch._inductor.codegen.wrapper import ExternKernelAllocLine

            writeline(ExternKernelAllocLine(w, node))
            return
        outs = [node] if isinstance(node.layout, ir.Layout) else list(node.outputs)
        dtypes = tuple(str(o.get_dtype()).removeprefix("torch.") for o in outs)
        var = f"_rivet_op_{len(ns)}_{ns}_{opname}_{'_'.join(dtypes)}"
        w.add_import_once("from rivet._torch_native import compiled_kernel as _rivet_compiled_kernel")
        w.add_import_once(f"{var} = _rivet_compiled_kernel({name!r}, {dtypes!r})")
        args = ", ".join([*node.codegen_args(), *node.codegen_kwargs()])
        writeline(f"{w.declare}{node.get_name()} = {var}({args}){w.ending}")
        for o in outs:
            # Runs after this function in each output's codegen (FallbackKernel.codegen /
            # MultiOutput.codegen): the dtype part of the check is compiled_kernel's.
            o.codegen_size_asserts = functools.partial(size_stride_asserts, o)

    cg.CUSTOM_EXTERN_KERNEL_CODEGEN[key] = cg.CustomCodegen(python=python)
    return True
