"""Shared helpers for the rivet Python test suite.

Fixtures:
  rng        -- a numpy Generator seeded from the test's node id (fresh data per test,
                reproducible across runs)
  poison     -- fill an array / tensor in place with a NaN / sentinel pattern
  rss_bytes  -- current resident set size of this process (from /proc/self/statm)
Plain helpers (also exposed through the ``h`` fixture):
  bits(a)            -- a bit-exact snapshot of an array's bytes (NaN-safe comparison)
  ref_axpy(...)      -- float64 reference of alpha*x + y, cast back to the dtype
  assert_close(...)  -- dtype-appropriate comparison
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

import numpy as np
import pytest

PAGE = os.sysconf("SC_PAGE_SIZE")


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
