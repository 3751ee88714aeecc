"""Hypothesis fuzzing of rivet.torch.custom_op's two kernel paths (docs/testing.md "Fuzzing";
docs/torch.md "Errors: one rivet error on both paths").

Each example draws a small rivet op (te programs: elementwise, outer product, a reduction, a
fixed dim with two outputs; rivet.kernels' softmax, which saves activations for its
backward, and a 3-d relu), dims, one tensor kind per input, and calls the op on both kernel
paths (the C++ one, native=True, and the Python one, native=False) in a drawn order. What
must hold:

(a) a call returns what torch computes (the Python path's outputs poisoned first through a
    NaN-filling torch.empty; the native path allocates in C++, so every element is compared)
    or raises a rivet.Error subclass, the one predicted by a model of the op's rules written
    here (per argument in order: layout, dtype, device, rank, dims; then each output's bytes
    against rivet.MAX_ALLOC_BYTES), never torch's RuntimeError or a builtin error;
(b) both paths give the same error class, or both the same result;
(c) the inputs, and the buffers their views are cut from, are unchanged.

The same inputs as fake tensors (FakeTensorMode: what torch.compile traces with) must give
the same error class or the model's output shapes; a smaller test runs examples under
torch.compile (the rivet error is then found in the chain dynamo wraps it in).

Kinds: dense; transposed, sliced (a step), flipped, as_strided (overlapping elements) and
expanded (stride 0) views; torch._neg_view; requires_grad; 0-size dims; all-meta and
meta-with-CPU; sparse COO / CSR, mkldnn, nested (strided and jagged), quantized, complex;
wrong dtype, rank and size. "Huge" examples bind a dim every output has to 2^47 or more
through stride-0 views, so some output is over rivet's allocation limit and every path
refuses the call before allocating or launching anything: no example can exhaust memory or
run for long, and none needs a subprocess. (The size the system refuses under the limit is
tests/python/test_torch_op.py's, skipped where memory is overcommitted.)

Profiles: by default (`make test`) a fixed-seed short run (derandomize=True, a few seconds);
RIVET_HYPOTHESIS_PROFILE=large (`make fuzz`) draws many more examples with random seeds and
compiles with aot_eager and inductor too, not only dynamo's eager backend.
"""

import contextlib
import itertools
import math
import os
import warnings

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import rivet  # noqa: E402
import rivet.kernels  # noqa: E402
import rivet.torch as rt  # noqa: E402
from rivet import te  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

LARGE = os.environ.get("RIVET_HYPOTHESIS_PROFILE", "small") == "large"


def profile(small, large):
    """Settings of one test: `small` examples from a fixed seed (make test), or `large` ones
    from random seeds (make fuzz). Per test, not a global profile: test_fuzz_hypothesis.py
    loads its own."""
    return settings(
        max_examples=large if LARGE else small,
        derandomize=not LARGE,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---- the ops ---------------------------------------------------------------------------------


class Spec:
    """An op: its rivet function, inputs (dtype, dims: ints or dim names) and outputs in
    parameter order, and the torch reference of its outputs."""

    def __init__(self, name, build, inputs, outputs, ref):
        self.name, self.build, self.ref = name, build, ref
        self.inputs, self.outputs = inputs, outputs
        self.vars = sorted({d for _, dims in inputs for d in dims if isinstance(d, str)})
        # The dims every output has: a huge one makes every output too large to allocate.
        self.out_vars = [v for v in self.vars if all(v in dims for _, dims in outputs)]

    def __repr__(self):
        return self.name


def _build(outs, args, name):
    s = rivet.create_schedule(outs if len(outs) > 1 else outs[0])
    return rivet.build(s, args, target="cpu", name=name)[name]


def build_add2():
    m, n = te.var("m"), te.var("n")
    A = te.placeholder((m, n), "float32", name="A")
    B = te.placeholder((m, n), "float32", name="B")
    C = te.compute((m, n), lambda i, j: A[i, j] + B[i, j] * 2.0, name="C")
    return _build([C], [A, B, C], "fz_add2")


def build_outer():
    m, n = te.var("m"), te.var("n")
    A = te.placeholder((m,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    C = te.compute((m, n), lambda i, j: A[i] * B[j], name="C")
    return _build([C], [A, B, C], "fz_outer")


def build_rowsum():
    m, n = te.var("m"), te.var("n")
    X = te.placeholder((m, n), "float64", name="X")
    r = te.reduce_axis((0, n), name="r")
    S = te.compute((m,), lambda i: te.sum(X[i, r], axis=r), name="S")
    return _build([S], [X, S], "fz_rowsum")


def build_sum_diff():
    n = te.var("n")
    X = te.placeholder((n, 4), "float32", name="X")
    Y = te.placeholder((n, 4), "float32", name="Y")
    S = te.compute((n, 4), lambda i, j: X[i, j] + Y[i, j], name="S")
    D = te.compute((n, 4), lambda i, j: X[i, j] - Y[i, j], name="D")
    return _build([S, D], [X, Y, S, D], "fz_sum_diff")


SPECS = [
    Spec("add2", build_add2, [("float32", ("m", "n"))] * 2, [("float32", ("m", "n"))],
         lambda a, b: a + b * 2.0),
    Spec("outer", build_outer, [("float32", ("m",)), ("float32", ("n",))],
         [("float32", ("m", "n"))], lambda a, b: a[:, None] * b[None, :]),
    Spec("rowsum", build_rowsum, [("float64", ("m", "n"))], [("float64", ("m",))],
         lambda x: x.sum(1)),
    Spec("sum_diff", build_sum_diff, [("float32", ("n", 4))] * 2,
         [("float32", ("n", 4))] * 2, lambda x, y: (x + y, x - y)),
    Spec("softmax", lambda: rivet.kernels.softmax("float64"), [("float64", ("d0", "d1"))],
         [("float64", ("d0", "d1"))], lambda x: torch.softmax(x, -1)),
    Spec("relu3", lambda: rivet.kernels.relu("float32", 3), [("float32", ("d0", "d1", "d2"))],
         [("float32", ("d0", "d1", "d2"))], torch.relu),
]  # fmt: skip
COMPILE_SPECS = [s for s in SPECS if s.name in ("add2", "outer", "rowsum")]

_ids = itertools.count()


def _native_available():
    from rivet import _torch_native

    try:
        _torch_native.extension()
        return True
    except _torch_native.NativeUnavailable:
        return False  # no C++ compiler: only the Python path (test_torch_native.py says why)


class Ops(tuple):
    """(table, paths): table[spec name, path] is the op; paths "native" (C++ kernels) and
    "python" (only the latter without a C++ compiler). Shown briefly in Hypothesis' reports."""

    def __repr__(self):
        return f"<the fuzzed ops on paths {self[1]}>"


@pytest.fixture(scope="module")
def ops():
    paths = ["native", "python"] if _native_available() else ["python"]
    table = {}
    for spec in SPECS:
        f = spec.build()
        for path in paths:
            table[spec.name, path] = rt.custom_op(
                f, f"rivet_fuzz::{spec.name}_{path}_{next(_ids)}", native=path == "native"
            )
    return Ops((table, paths))


# ---- tensors of every kind -------------------------------------------------------------------

VALID = ["dense", "transposed", "sliced", "flipped", "as_strided", "expanded", "neg", "grad"]
INVALID = [
    "sparse", "sparse_csr", "mkldnn", "nested", "jagged", "quantized", "complex",
    "wrong_dtype", "wrong_rank", "wrong_size",
]  # fmt: skip
# Kinds that stay views of a small buffer at any size (the others would allocate it).
HUGE_OK = {"expanded", "neg", "grad", "meta", "wrong_dtype", "wrong_rank", "wrong_size", "complex"}
# Kinds torch dispatches elsewhere than the CPU or Meta kernels: not mixed with meta tensors,
# where which backend wins is torch's business, not rivet's.
NOT_WITH_META = {"sparse", "sparse_csr", "mkldnn", "nested", "jagged", "quantized"}
OTHER_DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "bool"]


class Maker:
    """Builds one tensor of a kind, with data from one seeded torch.Generator."""

    def __init__(self, seed, draw):
        self.gen = torch.Generator().manual_seed(seed)
        self.draw = draw  # hypothesis' draw, for the kinds' own choices (strides, which dim)

    def fresh(self, shape, dtype):
        shape = tuple(shape)
        if dtype.is_complex or dtype.is_floating_point:
            # Multiples of 1/4 in [-4, 4): exact in every float dtype, sums exact in float64.
            t = torch.randint(-16, 16, shape, generator=self.gen).to(torch.float64) / 4
            return t.to(dtype)
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=self.gen).bool()
        return torch.randint(0, 100, shape, generator=self.gen).to(dtype)

    def make(self, kind, shape, dtype_name, huge):
        dt = getattr(torch, dtype_name)
        rank = len(shape)
        draw = self.draw
        if huge:
            # A stride-0 view of one element: no memory behind any size.
            def base(sh, t=dt):
                return self.fresh([1] * len(sh), t).expand(tuple(sh))
        else:
            base = lambda sh, t=dt: self.fresh(sh, t)  # noqa: E731
        if kind == "dense":
            return base(shape)
        if kind == "transposed":
            return self.fresh(shape[::-1], dt).permute(*reversed(range(rank)))
        if kind == "sliced":
            b = self.fresh([2 * s + 1 for s in shape], dt)
            return b[tuple(slice(1, 1 + 2 * s, 2) for s in shape)]
        if kind == "flipped":  # torch has no negative strides: flip copies
            return self.fresh(shape, dt).flip(tuple(range(rank)))
        if kind == "as_strided":
            strides = [draw(st.integers(0, 3)) for _ in shape]
            offset = draw(st.integers(0, 2))
            span = sum((s - 1) * k for s, k in zip(shape, strides)) if all(shape) else 0
            return self.fresh([offset + span + 1], dt).as_strided(shape, strides, offset)
        if kind == "expanded":
            return self.fresh([1] * rank, dt).expand(tuple(shape))
        if kind == "neg":
            return torch._neg_view(base(shape))
        if kind == "grad":
            if huge:
                return self.fresh([1] * rank, dt).requires_grad_().expand(tuple(shape))
            return self.fresh(shape, dt).requires_grad_()
        if kind == "meta":
            return torch.empty_strided(shape, [0] * rank, dtype=dt, device="meta")
        if kind == "sparse":
            return self.fresh(shape, dt).to_sparse()
        if kind == "sparse_csr":
            t = self.fresh(shape, dt)
            return t.to_sparse_csr() if rank == 2 else t.to_sparse()
        if kind == "mkldnn":
            try:
                return self.fresh(shape, torch.float32 if dt != torch.float32 else dt).to_mkldnn()
            except RuntimeError:
                return self.fresh(shape, dt).to_sparse()  # mkldnn missing from this torch
        if kind == "nested":
            inner = shape[1:] or (2,)
            return torch.nested.nested_tensor([self.fresh(inner, dt), self.fresh(inner, dt)])
        if kind == "jagged":
            inner = tuple(shape[1:])
            parts = [self.fresh((2, *inner), dt), self.fresh((3, *inner), dt)]
            return torch.nested.nested_tensor(parts, layout=torch.jagged)
        if kind == "quantized":
            return torch.quantize_per_tensor(self.fresh(shape, torch.float32), 0.25, 0, torch.qint8)
        if kind == "complex":
            return base(shape, torch.complex64)
        if kind == "wrong_dtype":
            other = draw(st.sampled_from([o for o in OTHER_DTYPES if o != dtype_name]))
            return base(shape, getattr(torch, other))
        if kind == "wrong_rank":
            shape = draw(st.sampled_from([shape[:-1], shape + (2,), (1, *shape)]))
            return base(shape)
        if kind == "wrong_size":
            k = draw(st.integers(0, rank - 1))
            return base(shape[:k] + (shape[k] + 1,) + shape[k + 1 :])
        raise AssertionError(kind)


class Case:
    """A drawn example: the op's spec, the inputs' kinds and the inputs (shown by kind,
    shape and dtype in Hypothesis' reports, not by their elements)."""

    def __init__(self, spec, kinds, args):
        self.spec, self.kinds, self.args = spec, kinds, args

    def __iter__(self):
        return iter((self.spec, self.kinds, self.args))

    def __repr__(self):
        return describe(self.spec, self.kinds, self.args)


# What an example centres on (the tests are parametrised by it, so that the short run covers
# every kind, whatever Hypothesis' draws favour): an input of that kind, with the other inputs
# drawn freely; "huge" (stride-0 views of a huge size), "zero" (a 0-size dim), "all_meta".
FOCUS = VALID + INVALID + ["meta", "all_meta", "huge", "zero"]


@st.composite
def examples(draw, specs, focus, kinds_valid=VALID, kinds_invalid=INVALID, allow_meta=True):
    """A Case: an op and its arguments of drawn kinds, one input (at least) of kind `focus`."""
    spec = draw(st.sampled_from(specs))
    huge = focus == "huge"
    dims = {v: draw(st.integers(0, 4)) for v in spec.vars}
    if focus == "zero":
        dims[draw(st.sampled_from(spec.vars))] = 0
    if huge:
        # One dim of every output huge, so every output is over MAX_ALLOC_BYTES; another dim
        # huge too only where no input has both (an outer product's output then overflows
        # int64), the others small: no input has more elements than int64 counts, even with a
        # dim grown by a wrong size or rank.
        big = st.sampled_from([2**47, 2**52, 2**56])
        v = draw(st.sampled_from(spec.out_vars))
        dims[v] = draw(big)
        for w in spec.vars:
            if w == v:
                continue
            apart = not any(v in ds and w in ds for _, ds in spec.inputs)
            dims[w] = draw(big) if apart and draw(st.booleans()) else draw(st.integers(1, 3))
    kinds = []
    for _ in spec.inputs:
        # More valid inputs than not, so that examples with every input valid stay common.
        pool = ["valid"] * 4 + ["invalid"] * (3 if kinds_invalid else 0) + ["meta"] * allow_meta
        pool = draw(st.sampled_from(pool))
        if focus == "all_meta" or pool == "meta":
            kind = "meta"
        else:
            kind = draw(st.sampled_from(kinds_valid if pool == "valid" else kinds_invalid))
        kinds.append(kind)
    if focus in kinds_valid + kinds_invalid + ["meta"]:
        kinds[draw(st.integers(0, len(kinds) - 1))] = focus
    if huge:
        kinds = [k if k in HUGE_OK else "expanded" for k in kinds]
    if "meta" in kinds and NOT_WITH_META & set(kinds):
        # Keep the focus: drop the meta tensors, or the kinds that may not go with them.
        drop = NOT_WITH_META if focus in ("meta", "all_meta") else {"meta"}
        kinds = ["dense" if k in drop else k for k in kinds]
    maker = Maker(draw(st.integers(0, 2**32 - 1)), draw)
    args = []
    for kind, (dtype, want) in zip(kinds, spec.inputs):
        shape = tuple(dims[x] if isinstance(x, str) else x for x in want)
        args.append(maker.make(kind, shape, dtype, huge))
    return Case(spec, kinds, args)


# ---- the model of what a call must do --------------------------------------------------------


def expected(spec, args):
    """The rivet error class the call must raise, or ("ok", output shapes): the op's rules
    from first principles, not rivet.torch's code."""
    bound, first_dev = {}, None
    for (dtype, dims), t in zip(spec.inputs, args):
        if t.is_nested or t.layout != torch.strided:
            return rivet.DLPackError  # DLPack describes dense strided tensors only
        if t.dtype != getattr(torch, dtype):
            return rivet.DTypeError
        if first_dev is None:
            first_dev = t.device
        elif t.device != first_dev:
            return rivet.DeviceError  # rivet never copies between devices
        if t.dim() != len(dims):
            return rivet.ShapeError
        for got, want in zip(t.shape, dims):
            if isinstance(want, int) and got != want:
                return rivet.ShapeError
            if isinstance(want, str) and bound.setdefault(want, got) != got:
                return rivet.ShapeError
    shapes = [tuple(bound.get(x, x) for x in dims) for _, dims in spec.outputs]
    for (dtype, _), shape in zip(spec.outputs, shapes):
        if math.prod(shape) * getattr(torch, dtype).itemsize > rivet.MAX_ALLOC_BYTES:
            return rivet.MemoryError
    return ("ok", shapes)


# ---- calling and checking --------------------------------------------------------------------


@contextlib.contextmanager
def poisoned_empty():
    """Every torch.empty NaN-filled (the Python path allocates its outputs with it): an
    element the kernel does not write shows in the comparison."""
    real = torch.empty

    def empty(*a, **k):
        t = real(*a, **k)
        if t.device.type != "meta" and t.dtype.is_floating_point:
            t.fill_(float("nan"))
        return t

    torch.empty = empty
    try:
        yield
    finally:
        torch.empty = real


def root(t):
    """The tensor whose memory `t` views (itself when it is no view)."""
    return t._base if t._base is not None else t


def snapshot(t):
    """A copy of what `t` and the buffer under it hold (None for meta tensors)."""
    if t.device.type == "meta":
        return None
    if t.is_nested:
        return [c.detach().clone() for c in t.unbind()]
    if t.is_quantized:
        return t.int_repr().clone()
    if t.layout != torch.strided:
        return t.to_dense().clone()
    return torch.resolve_neg(root(t).detach()).clone()


def assert_unchanged(args, snaps, path):
    for k, (t, snap) in enumerate(zip(args, snaps)):
        now = snapshot(t)
        if snap is None:
            continue
        same = (
            all(torch.equal(a, b) for a, b in zip(now, snap))
            if isinstance(snap, list)
            else torch.equal(now, snap)
        )
        assert same, f"{path} path: input {k} (or the buffer it views) was written"


def call(op, args, path):
    """(error class, None) or (None, outputs as a tuple); anything but a rivet error fails."""
    snaps = [snapshot(t) for t in args]
    ctx = poisoned_empty() if path == "python" else contextlib.nullcontext()
    try:
        with ctx:
            out = op(*args)
    except rivet.Error as e:
        assert_unchanged(args, snaps, path)
        return type(e), None
    except Exception as e:  # noqa: BLE001 - the point: nothing but rivet errors
        kind = f"{type(e).__module__}.{type(e).__qualname__}"
        pytest.fail(f"{path} path: {kind} is not a rivet.Error: {e}")
    assert_unchanged(args, snaps, path)
    return None, out if isinstance(out, tuple) else (out,)


def check_outputs(spec, args, want, outs, path):
    shapes = want[1]
    assert [tuple(o.shape) for o in outs] == shapes, path
    assert [o.dtype for o in outs] == [getattr(torch, d) for d, _ in spec.outputs], path
    if any(t.device.type == "meta" for t in args):
        assert all(o.device.type == "meta" for o in outs), path
        return
    ref = spec.ref(*[t.detach() for t in args])
    ref = ref if isinstance(ref, tuple) else (ref,)
    for got, exp in zip(outs, ref):
        torch.testing.assert_close(got.detach(), exp, msg=lambda m: f"{path} path: {m}")


def describe(spec, kinds, args):
    return f"{spec.name}: " + ", ".join(
        f"{k} {tuple(t.shape) if not t.is_nested else 'nested'} {t.dtype}"
        for k, t in zip(kinds, args)
    )


# ---- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("focus", FOCUS)
@profile(small=5, large=300)
@given(data=st.data(), native_first=st.booleans())
def test_both_paths_agree_with_torch_or_raise_one_rivet_error(ops, focus, data, native_first):
    table, paths = ops
    ex = data.draw(examples(SPECS, focus), label="case")
    spec, kinds, args = ex
    what = describe(spec, kinds, args)
    want = expected(spec, args)
    event(f"expected {'a result' if isinstance(want, tuple) else want.__name__}")
    order = paths if native_first else paths[::-1]
    got = {p: call(table[spec.name, p], args, p) for p in order}
    for p, (err, outs) in got.items():
        if isinstance(want, tuple):
            assert err is None, f"{what}: {p} path raised {err.__name__}, expected a result"
            check_outputs(spec, args, want, outs, p)
        else:
            gave = err.__name__ if err else "a result"
            assert err is want, f"{what}: {p} path gave {gave}, expected {want.__name__}"
    # (b): the same class on both paths; equal results (each matched torch above).
    classes = {p: got[p][0] for p in got}
    assert len(set(classes.values())) == 1, f"{what}: {classes}"


@pytest.mark.parametrize("focus", [f for f in FOCUS if "meta" not in f])
@profile(small=2, large=150)
@given(data=st.data())
def test_the_fake_implementation_gives_the_eager_error(ops, focus, data):
    """What torch.compile traces with: the drawn inputs as fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    table, paths = ops
    ex = data.draw(examples(SPECS, focus, allow_meta=False), label="case")
    spec, kinds, args = ex
    what = describe(spec, kinds, args)
    want = expected(spec, args)
    mode = FakeTensorMode()
    try:
        fakes = [mode.from_tensor(t) for t in args]
    except Exception:  # noqa: BLE001 - a kind fake tensors do not support (nested, quantized)
        return
    for p in paths:
        try:
            with mode:
                out = table[spec.name, p](*fakes)
        except rivet.Error as e:
            assert type(e) is want, f"{what}: fake gave {type(e).__name__}, expected {want}"
            continue
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"{what}: fake raised {type(e).__qualname__}: {e}")
        assert isinstance(want, tuple), f"{what}: fake gave a result, expected {want.__name__}"
        outs = out if isinstance(out, tuple) else (out,)
        assert [tuple(o.shape) for o in outs] == want[1]


def rivet_error_in_chain(e):
    """The rivet error dynamo wrapped (TorchRuntimeError -> ... -> the fake kernel's error)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, rivet.Error):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


COMPILE_VALID = ["dense", "transposed", "sliced", "expanded"]
COMPILE_INVALID = ["wrong_dtype", "wrong_rank", "wrong_size", "complex"]


@profile(small=3, large=200)
@given(
    focus=st.sampled_from(COMPILE_VALID + COMPILE_INVALID + ["huge", "zero"]),
    data=st.data(),
    path=st.sampled_from(["native", "python"]),
    backend=st.sampled_from(["eager", "aot_eager", "inductor"] if LARGE else ["eager"]),
    dynamic=st.booleans(),
)
def test_under_torch_compile(ops, focus, data, path, backend, dynamic):
    """A few examples (compiling costs about a second) on either path: the compiled call
    gives the eager result, or the eager error class (found in the chain of the exception
    dynamo raises when the fake implementation fails at trace time)."""
    table, paths = ops
    if path not in paths:
        return
    cases = examples(COMPILE_SPECS, focus, COMPILE_VALID, COMPILE_INVALID, allow_meta=False)
    ex = data.draw(cases, label="case")
    spec, kinds, args = ex
    what = describe(spec, kinds, args)
    want = expected(spec, args)
    event(f"{backend}: expected {'a result' if isinstance(want, tuple) else want.__name__}")
    op = table[spec.name, path]
    torch._dynamo.reset()
    f = torch.compile(lambda *a: op(*a), backend=backend, dynamic=dynamic)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = f(*args)
        except Exception as e:  # noqa: BLE001 - dynamo wraps trace-time errors
            err = rivet_error_in_chain(e)
            assert err is not None, f"{what}: {type(e).__qualname__} holds no rivet error: {e}"
            assert type(err) is want, f"{what}: {type(err).__name__}, expected {want}"
            return
    assert isinstance(want, tuple), f"{what}: a result, expected {want.__name__}"
    check_outputs(spec, args, want, out if isinstance(out, tuple) else (out,), f"{path}/{backend}")
