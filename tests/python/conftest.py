"""Shared helpers for the rivet Python test suite.

Backends (rivet's own list, rivet.targets(); every backend-parametrised test uses it):
  BACKENDS           -- pytest params, one per backend, the oracle ("interp") first
  backend_params(**caps) -- the subset with given capabilities (host_memory, gpu_schedules)
  backend_names()    -- their names; runnable=True keeps those this machine runs on host arrays
  target             -- fixture parametrised over BACKENDS (ids "interp", "cpu", ...)
  gpu_present(), cuda_usable() -- whether a CUDA GPU exists / rivet can run kernels on it;
                        tests marked ``gpu`` are skipped (never failed) unless cuda_usable()
  cuda_driver_reason() -- why rivet finds no CUDA driver device (None: it does, the double's
                        or a real one); tests marked ``cuda`` are skipped unless it is None,
                        failed instead under RIVET_REQUIRE_CUDA=1 (docs/testing.md)
  cuda_double_active() -- whether the libcuda.so.1 the loader finds is rivet's CUDA driver
                        double (tests/cuda_double): then there is no GPU, and torch.cuda is
                        never asked
Tolerance (docs/tolerance.md, implemented once here):
  assert_matches(got, want, op=..., against=..., ...) -- the written policy per op class
  ulp_distance(a, b) -- distance in units in the last place, per element
Fixtures:
  rng        -- a numpy Generator seeded from the test's node id (fresh data per test,
                reproducible across runs)
  poison     -- fill an array / tensor in place with a NaN / sentinel pattern
  rss_bytes  -- current resident set size of this process (from /proc/self/statm)
Plain helpers (also exposed through the ``h`` fixture):
  bits(a)            -- a bit-exact snapshot of an array's bytes (NaN-safe comparison)
  ref_axpy(...)      -- float64 reference of alpha*x + y, cast back to the dtype
  assert_close(...)  -- axpy-style comparison with a float64 reference (runtime functions)
  to_np(x)           -- numpy copy of a torch / jax / numpy / rivet value
"""

import gc
import os
import re
import sys
import types
import zlib

# JAX must not probe for accelerators in the test run; the suite is CPU-only.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# torch's compile caches key a custom op by its name only (docs/torch.md, "Compile caches"):
# a graph cached by an earlier run under the same test op name, with an older derivation of
# its backward, would be reused. Each run compiles into a fresh cache of its own.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="rivet-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], True)

import numpy as np
import pytest

PAGE = os.sysconf("SC_PAGE_SIZE")


# ---- backends -------------------------------------------------------------------------------
#
# The backends the suite runs (CubeCL's model: one parametrised suite) are rivet's own list,
# ``rivet.targets()`` (every target kind ``rivet.build`` accepts), the oracle ("interp") first.
# What each can do is written here; a kind rivet lists but this table lacks fails the
# collection, so a new backend is never silently left out. A backend that needs a GPU carries
# the ``gpu`` mark: its cases are collected everywhere and skipped (never failed), with the
# reason, where no usable GPU is; one whose functions take device memory carries
# ``device_memory``: the suite passes host arrays, so its cases are skipped with that reason
# even where a GPU is.

_CAPS = {
    # The IR interpreter: the oracle every other backend is compared with; it runs GPU
    # schedules with CUDA's semantics (blocks, threads phase by phase, races reported).
    "interp": dict(gpu=False, host_memory=True, gpu_schedules=True),
    # Cranelift; refuses GPU schedules.
    "cpu": dict(gpu=False, host_memory=True, gpu_schedules=False),
    # CUDA C through NVRTC: a GPU, device memory.
    "cuda": dict(gpu=True, host_memory=False, gpu_schedules=True),
}


def _backend(name):
    """One backend's pytest param: marked ``gpu`` / ``device_memory`` per _CAPS."""
    if name not in _CAPS:
        raise RuntimeError(
            "rivet.targets() lists %r, which tests/python/conftest.py's _CAPS does not describe" % name
        )
    caps = _CAPS[name]
    marks = ([pytest.mark.gpu] if caps["gpu"] else []) + ([] if caps["host_memory"] else [pytest.mark.device_memory])
    return pytest.param(name, id=name, marks=marks)


def _targets():
    import rivet

    return rivet.targets()


BACKENDS = [_backend(name) for name in _targets()]


def backend_params(**caps):
    """The BACKENDS params whose capabilities match, e.g. backend_params(gpu_schedules=True)
    for tests of GPU schedules: the explicit way for a test to run on a subset."""
    return [p for p in BACKENDS if all(_CAPS[p.values[0]][c] == v for c, v in caps.items())]


def cuda_double_active():
    """Whether the `libcuda.so.1` the loader would find first on LD_LIBRARY_PATH is rivet's
    CUDA driver double (`make cuda-double`; its file carries its `rivet-cuda-double` message
    prefix). Read from the file, never loaded: asking torch would start its CUDA runtime on
    the double."""
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        path = os.path.join(d or ".", "libcuda.so.1")
        if os.path.isfile(path):
            try:
                with open(path, "rb") as f:
                    return b"rivet-cuda-double" in f.read()
            except OSError:
                return False
    return False


_DOUBLE = cuda_double_active()


def gpu_present():
    """Whether a CUDA GPU exists on this machine. rivet exposes no probe, so torch's is the
    signal (False where torch is missing or CPU-only). Under the CUDA driver double there is
    none, and torch.cuda is not asked (its runtime would start on the double, which gives it
    no entry points: a framework's CUDA needs a real GPU)."""
    if _DOUBLE:
        return False
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver is no GPU, for the tests
        return False


def rivet_cuda_launch():
    """Whether rivet itself can use a CUDA device here (its own probe: the driver library
    loads and reports a device; `rivet.cuda_device_count()` raises DeviceError otherwise)."""
    try:
        import rivet

        return rivet.cuda_device_count() > 0
    except Exception:
        return False


def cuda_driver_reason():
    """Why rivet cannot use a CUDA device through the driver here (None: it can, on a real
    GPU or on the driver double): what `rivet.cuda_device_count()` raised, or that it gave 0."""
    try:
        import rivet

        n = rivet.cuda_device_count()
    except Exception as e:  # DeviceError, or rivet itself missing
        return "rivet finds no CUDA device: %s: %s" % (type(e).__name__, e)
    return None if n > 0 else "rivet finds no CUDA device: rivet.cuda_device_count() is 0"


def cuda_usable():
    """Whether rivet can run kernels on a CUDA device here: a GPU and rivet's launch path."""
    return gpu_present() and rivet_cuda_launch()


def _runnable(name):
    caps = _CAPS[name]
    return caps["host_memory"] and (not caps["gpu"] or cuda_usable())


def backend_names(runnable=False):
    """The backends' names (for Hypothesis strategies and loops); with runnable=True only those
    this machine can run on the host arrays the suite passes."""
    return [p.values[0] for p in BACKENDS if not runnable or _runnable(p.values[0])]


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "gpu: needs a CUDA GPU that rivet can launch on; skipped (never failed) without one",
    )
    config.addinivalue_line(
        "markers",
        "cuda: needs only rivet and a CUDA driver (the double or a real one); skipped without "
        "one, failed instead under RIVET_REQUIRE_CUDA=1",
    )
    config.addinivalue_line(
        "markers",
        "device_memory: a backend whose functions take device memory; the suite's host arrays "
        "do not fit it, so its cases are skipped with that reason",
    )


@pytest.hookimpl(tryfirst=True)  # before any fixture (a module-scoped build) is set up
def pytest_runtest_setup(item):
    if item.get_closest_marker("cuda") is not None:
        why = _cuda_reason()
        if why is not None:
            if os.environ.get("RIVET_REQUIRE_CUDA") == "1":
                pytest.fail("RIVET_REQUIRE_CUDA=1 but " + why, pytrace=False)
            pytest.skip(why)
    if item.get_closest_marker("gpu") is not None and not cuda_usable():
        if _DOUBLE:
            why = "no CUDA GPU: the CUDA driver here is rivet's test double (tests/cuda_double)"
        elif not gpu_present():
            why = "no CUDA GPU on this machine"
        else:
            why = "a GPU is present but rivet cannot use it (rivet.cuda_device_count() raised)"
        pytest.skip(why)
    if item.get_closest_marker("device_memory") is not None:
        pytest.skip("the test passes host arrays; this backend's functions take device memory")


_CUDA_REASON = []


def _cuda_reason():
    """cuda_driver_reason(), asked once per session (the driver's answer does not change)."""
    if not _CUDA_REASON:
        _CUDA_REASON.append(cuda_driver_reason())
    return _CUDA_REASON[0]


@pytest.fixture(params=BACKENDS)
def target(request):
    """Each backend in turn (ids: the target spelling)."""
    return request.param


# ---- C libraries --------------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# rivet's C header (rivet/c_api.h).
HEADER_DIR = os.path.join(ROOT, "runtime", "include")


def dlpack_include(tmp_path):
    """A directory holding dlpack/dlpack.h: tvm-ffi's copy when installed (optional), else a
    shim over torch's `ATen/dlpack.h` (torch is a required test dependency)."""
    import importlib.util

    spec = importlib.util.find_spec("tvm_ffi")
    if spec and spec.origin:
        d = os.path.join(os.path.dirname(spec.origin), "include")
        if os.path.exists(os.path.join(d, "dlpack", "dlpack.h")):
            return [d]
    import torch

    inc = os.path.join(os.path.dirname(torch.__file__), "include")
    assert os.path.exists(os.path.join(inc, "ATen", "dlpack.h")), "torch ships no ATen/dlpack.h"
    (tmp_path / "shim" / "dlpack").mkdir(parents=True)
    (tmp_path / "shim" / "dlpack" / "dlpack.h").write_text("#include <ATen/dlpack.h>\n")
    return [str(tmp_path / "shim"), inc]


def compile_c_library(tmp_path, source, name):
    """Compiles the C11 `source` (warnings are errors) against rivet's header and DLPack's into
    tmp_path/lib<name>.so, and returns its path."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    # Rust's linker on Linux is `cc`: a machine that built rivet has one.
    assert cc, "no C compiler on PATH (rustc links with cc; install one)"
    incs = [x for d in dlpack_include(tmp_path) for x in ("-I", d)]
    src = tmp_path / ("%s.c" % name)
    src.write_text(source)
    so = tmp_path / ("lib%s.so" % name)
    subprocess.run(
        [cc, "-std=c11", "-Wall", "-Werror", "-shared", "-fPIC", "-I", HEADER_DIR, *incs, str(src), "-o", str(so)],
        check=True,
    )
    return so


def rss_bytes():
    """Resident set size in bytes (second field of /proc/self/statm, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def to_np(x):
    """A numpy copy of x (numpy, torch, jax, rivet.Tensor)."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        return x.detach().cpu().numpy().copy()
    if mod.startswith("jax") or mod.startswith("jaxlib"):
        return np.asarray(x).copy()
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        return np.array(x.numpy(), copy=True)
    return np.array(x, copy=True)


def bits(a):
    """Bit-exact snapshot of an array's values (works for NaN payloads)."""
    a = to_np(a)
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).copy()


def assert_bits_equal(a, b, msg=""):
    ba, bb = bits(a), bits(b)
    assert ba.shape == bb.shape, msg
    assert np.array_equal(ba, bb), msg or "memory changed"


def ref_axpy(alpha, x, y):
    """Reference alpha*x + y computed in float64 then cast to y's dtype (numpy arrays)."""
    x, y = to_np(x), to_np(y)
    return (np.float64(alpha) * x.astype(np.float64) + y.astype(np.float64)).astype(y.dtype)


TOL = {
    np.dtype(np.float32): dict(rtol=1e-6, atol=1e-6),
    np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12),
}


def assert_close(got, ref):
    got, ref = to_np(got), to_np(ref)
    assert got.shape == ref.shape
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    np.testing.assert_allclose(got, ref, **TOL[np.dtype(ref.dtype)])


# ---- tolerance policy ------------------------------------------------------------------------
#
# docs/tolerance.md writes the policy down; this is its one implementation. Every comparison
# of a rivet result with a reference names the class of operation that produced it and what
# it is compared with, and the bound follows from those (never a per-test rtol):
#
#   op="exact"          integer ops, comparisons, selects, casts, float + - * / neg abs min max
#                       floor ceil sqrt and chains of them, max/min reductions, copies: the
#                       reference performs the same IEEE operations (or computes in float64
#                       and rounds once, which is the same for one operation): bit-exact
#   op="transcendental" exp log tanh erf pow sigmoid and short chains around them: a bound in
#                       ulps of the dtype (ulp_distance)
#   op="reduction"      sum / prod of k terms, accumulated in the dtype in loop order:
#                       |got - want| <= c * k * u * terms (u = eps / 2, the unit roundoff;
#                       terms = sum of |term| per output, default |want|; c = 1 against a
#                       float64 reference, 2 against one in the dtype, which has its own error)
#   op="contraction"    sum over k of products (matmul): as reduction with k + 1 roundings;
#                       terms = |a| @ |b|
#   op="composite"      softmax, layer_norm, gelu...: (ulps + c * k) * u * terms
#
# against="interp": the result of another rivet backend (backend=...) against the oracle.
# The Cranelift backend runs the same operations in the same order with the same libm: every
# class is bit-exact. CUDA (future) is bit-exact but for the math library (libdevice is not
# musl): transcendental and composite classes get CUDA_ULPS until measured on a GPU.

# rivet's transcendentals are musl's (< 1 ulp); a float64 reference rounded to the dtype is
# within 0.5 ulp of the true value, so the two are at most 1 ulp apart; 2 leaves room for a
# result at a binade edge (where the ulp halves).
REF_ULPS = 2
# What a reference computed in the dtype by its own library adds (numpy's float32 SIMD exp /
# log are documented at < 4 ulp, torch's vectorised kernels (SLEEF u10) at 1 ulp, XLA's at a
# few): the bound against such a reference is REF_ULPS + LIB_ULPS.
LIB_ULPS = {"numpy": 4, "torch": 2, "jax": 4}
# CUDA's libdevice against musl, per the CUDA C Programming Guide's maximum errors (float32:
# expf 2, logf 1, tanhf 2, erff 2, powf 4 ulp; double: 1-2 ulp) plus musl's < 1 ulp.
# PROVISIONAL: never measured (no GPU was available); measure with the gpu tests and tighten.
# float16/bfloat16 are computed in float32 and rounded once: at most 1 ulp of the 16-bit type.
CUDA_ULPS = {"float32": 5, "float64": 3, "float16": 1, "bfloat16": 1}
# Default ulps of the composite class (a few transcendentals and divisions per output).
COMPOSITE_ULPS = 8

OPS = ("exact", "transcendental", "reduction", "contraction", "composite")
AGAINST = ("interp", "numpy", "torch", "jax")
_FLOATS = ("float16", "bfloat16", "float32", "float64")
_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
_INT_OF = {2: np.int16, 4: np.int32, 8: np.int64}


def _values(x):
    """(numpy values, dtype name, raw bit pattern or None) of a numpy / torch / jax / rivet
    value; bfloat16 (no numpy dtype) comes as float32 values with its int16 bits."""
    if type(x).__module__.startswith("torch"):
        import torch

        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            return x.float().numpy().copy(), "bfloat16", x.contiguous().view(torch.int16).numpy().copy()
    a = to_np(x)
    return a, a.dtype.name, None


def _ordered(bits_, itemsize):
    """int64s ordered as the floats whose bit patterns they are (-0.0 and 0.0 both 0)."""
    it = _INT_OF[itemsize]
    i = np.ascontiguousarray(bits_).view(it).astype(np.int64)
    return np.where(i < 0, np.int64(np.iinfo(it).min) - i, i)


def ulp_distance(got, want):
    """Per-element distance in ulps of the dtype (both of the same float dtype; bfloat16 as
    torch tensors). NaN against NaN is 0, NaN against a number infinite."""
    g, gdt, gbits = _values(got)
    w, wdt, wbits = _values(want)
    assert gdt == wdt, (gdt, wdt)
    size = 2 if gdt == "bfloat16" else g.dtype.itemsize
    og = _ordered(gbits if gbits is not None else g, size)
    ow = _ordered(wbits if wbits is not None else w, size)
    # Exact in int64 where the signs agree; across zero the distance is huge anyway (float).
    same = (og < 0) == (ow < 0)
    with np.errstate(over="ignore"):
        d = np.where(same, np.abs(og - ow).astype(np.float64), np.abs(og.astype(np.float64) - ow.astype(np.float64)))
    gn, wn = np.isnan(g), np.isnan(w)
    return np.where(gn & wn, 0.0, np.where(gn | wn, np.inf, d))


def _round_to(want, wdt, dtype):
    """A wider reference rounded to `dtype` (float64 -> float32 / float16 / bfloat16)."""
    if wdt == dtype:
        return want
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(np.asarray(want, np.float32)).to(torch.bfloat16)
    return np.asarray(want).astype(dtype)


def _fail(msg, got, want, bad, err_msg):
    idx = np.argwhere(bad)[:5]
    shown = "; ".join(
        "at %s got %r want %r" % (tuple(int(v) for v in i), got[tuple(i)], want[tuple(i)]) for i in idx
    )
    raise AssertionError("%s%s: %d of %d elements: %s" % (err_msg + ": " if err_msg else "", msg, int(bad.sum()), bad.size, shown))


def tolerance(op, against, dtype, backend="cpu", k=1, ulps=None, wide_ref=False):
    """The bound the policy gives: ("exact", 0), ("ulps", n) or ("abs", factor), the last
    meaning |got - want| <= factor * terms."""
    assert op in OPS, op
    assert against in AGAINST, against
    if dtype not in _FLOATS:
        return ("exact", 0)
    if against == "interp":
        if backend in ("interp", "cpu"):
            return ("exact", 0)
        if backend == "cuda":
            if op in ("transcendental", "composite"):
                return ("ulps", CUDA_ULPS[dtype] if ulps is None else ulps)
            return ("exact", 0)
        raise AssertionError("no tolerance policy for backend %r (docs/tolerance.md)" % backend)
    if op == "exact":
        return ("exact", 0)
    if op == "transcendental":
        if ulps is None:
            ulps = REF_ULPS if wide_ref else REF_ULPS + LIB_ULPS[against]
        return ("ulps", ulps)
    u = _EPS[dtype] / 2
    c = 1 if wide_ref else 2
    if op == "reduction":
        return ("abs", c * k * u)
    if op == "contraction":
        return ("abs", c * (k + 1) * u)
    return ("abs", ((COMPOSITE_ULPS if ulps is None else ulps) + c * k) * u)


def abs_mm(a, b):
    """|a| @ |b| in float64: the terms a matmul's rounding error is relative to."""
    return np.abs(to_np(a).astype(np.float64)) @ np.abs(to_np(b).astype(np.float64))


def assert_matches(got, want, op="exact", against="numpy", backend="cpu", k=1, terms=None, ulps=None, err_msg=""):
    """Asserts that a rivet result `got` matches `want` under the tolerance policy.

    op: the class of operation that produced it (OPS); against: what `want` is ("interp": the
    oracle's result for `got` from `backend`; "numpy" / "torch" / "jax": a reference library's,
    computed in the dtype or in float64, in which case it is rounded to the dtype here and
    counts as exact); k: terms per output of a reduction / contraction; terms: per-output sum of
    |term| the error of a sum is relative to (default |want|); ulps: a documented override.
    """
    g, gdt, _ = _values(got)
    w, wdt, _ = _values(want)
    assert g.shape == w.shape, (g.shape, w.shape, err_msg)
    wide_ref = gdt in _FLOATS and wdt != gdt
    if gdt not in _FLOATS:
        assert gdt == wdt, (gdt, wdt, err_msg)
    kind, bound = tolerance(op, against, gdt, backend, k, ulps, wide_ref)
    if kind == "abs":
        w64 = w.astype(np.float64)
        t = np.abs(w64) if terms is None else np.abs(np.asarray(to_np(terms), np.float64))
        diff = np.abs(g.astype(np.float64) - w64)
        same = (g.astype(np.float64) == w64) | (np.isnan(g) & np.isnan(w64))
        bad = ~same & ~(diff <= bound * t)
        if bad.any():
            _fail("beyond %s bound %.3g * terms (%s against %s)" % (op, bound, gdt, against), g, w64, bad, err_msg)
        return
    w_r = _round_to(w, wdt, gdt) if wide_ref else want
    if kind == "exact":
        wv, _, _ = _values(w_r)
        if gdt in _FLOATS:
            # Bit-exact up to NaN payloads and the sign of zero (on a tie of -0.0 and 0.0,
            # max/min return the second operand in rivet and numpy, the first in torch).
            bad = ulp_distance(got, w_r) != 0
        else:
            bad = g != wv
        if bad.any():
            _fail("not bit-exact (%s %s against %s)" % (op, gdt, against), g, wv, bad, err_msg)
        return
    d = ulp_distance(got, w_r)
    bad = d > bound
    if bad.any():
        wv, _, _ = _values(w_r)
        _fail("more than %d ulp apart (max %g; %s %s against %s)" % (bound, d.max(), op, gdt, against), g, wv, bad, err_msg)


def poison(x):
    """Fill x (numpy array or torch tensor) in place with NaN (floats) or a sentinel."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        if x.dtype.is_floating_point:
            x.fill_(float("nan"))
        elif x.dtype == __import__("torch").bool:
            x.fill_(True)
        else:
            x.fill_(0x5A)
        return x
    if np.issubdtype(x.dtype, np.floating):
        x[...] = np.nan
    elif x.dtype == np.bool_:
        x[...] = True
    else:
        x[...] = 0x5A
    return x


def random_array(rng, shape, dtype=np.float32):
    """Fresh random data, never zero: uniform in +-[0.5, 1.5)."""
    mag = rng.uniform(0.5, 1.5, size=shape)
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return np.asarray(mag * sign).astype(dtype)


def names_arg(msg, name, index0=None):
    """True when msg names the argument `name` (as a word) and, if given, its position
    (0- or 1-based, as a standalone number)."""
    ok = re.search(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])", msg) is not None
    if ok and index0 is not None:
        ok = re.search(r"(?<![A-Za-z0-9_.])(%d|%d)(?![A-Za-z0-9_])" % (index0, index0 + 1), msg) is not None
    return ok


def refcount_settled(obj):
    gc.collect()
    return sys.getrefcount(obj)


@pytest.fixture
def rng(request):
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


@pytest.fixture(name="poison")
def poison_fixture():
    return poison


@pytest.fixture(name="rss_bytes")
def rss_fixture():
    return rss_bytes


@pytest.fixture
def h():
    return types.SimpleNamespace(
        bits=bits,
        assert_bits_equal=assert_bits_equal,
        ref_axpy=ref_axpy,
        assert_close=assert_close,
        assert_matches=assert_matches,
        abs_mm=abs_mm,
        ulp_distance=ulp_distance,
        poison=poison,
        random_array=random_array,
        to_np=to_np,
        rss_bytes=rss_bytes,
        names_arg=names_arg,
        refcount_settled=refcount_settled,
    )


@pytest.fixture(scope="session")
def axpy():
    import rivet

    return rivet.get_global_func("testing.axpy")


@pytest.fixture(scope="session")
def echo():
    import rivet

    return rivet.get_global_func("testing.echo")


_counter = [0]


@pytest.fixture
def uname(request):
    """A unique registry name for this test (the registry is process-global)."""

    def make(tag="f"):
        _counter[0] += 1
        base = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)
        return "pytest.%s.%s_%d" % (base, tag, _counter[0])

    return make
