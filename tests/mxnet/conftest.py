"""Helpers for the MXNet suite (runs in .venv-mxnet: mxnet 1.9.1, numpy<1.24, no torch/jax).

This venv cannot import tests/python/conftest.py (it imports torch-era helpers), so the
backend list is defined once here, the same way: BACKENDS and the `target` fixture; a backend
that needs a GPU is marked ``gpu`` and skipped (never failed) where none is usable.
"""

import ctypes
import importlib.util
import os
import zlib

# MXNet's threaded engine makes every to_dlpack_for_write wait on a worker; the naive engine
# runs operations synchronously. Must be set before mxnet is imported.
os.environ.setdefault("MXNET_ENGINE_TYPE", "NaiveEngine")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def _load_tolerance_policy():
    """The one implementation of docs/tolerance.md lives in tests/python/conftest.py; loaded
    here as a plain module (its fixtures and hooks are not registered; torch is imported only
    by functions this suite does not call)."""
    path = os.path.join(os.path.dirname(__file__), os.pardir, "python", "conftest.py")
    spec = importlib.util.spec_from_file_location("rivet_tolerance_policy", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_policy = _load_tolerance_policy()
assert_matches = _policy.assert_matches
abs_mm = _policy.abs_mm


# ---- backends (mirrors tests/python/conftest.py; adding one is one line) --------------------


def _backend(name, gpu=False):
    return pytest.param(name, id=name, marks=[pytest.mark.gpu] if gpu else [])


BACKENDS = [
    _backend("interp"),  # the IR interpreter, the oracle
    _backend("cpu"),  # Cranelift
    # _backend("cuda", gpu=True),
]

# rivet's CUDA launch has not run on a GPU yet and rivet exposes no probe (see
# tests/python/conftest.py): no backend marked gpu runs until this is True.
RIVET_CUDA_LAUNCH = False


def gpu_present():
    """Whether MXNet sees a CUDA GPU (the CPU-only mxnet wheel reports none)."""
    try:
        return mx.context.num_gpus() > 0
    except Exception:
        return False


def cuda_usable():
    return RIVET_CUDA_LAUNCH and gpu_present()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "gpu: needs a CUDA GPU that rivet can launch on; skipped (never failed) without one",
    )


@pytest.hookimpl(tryfirst=True)  # before any fixture (a module-scoped build) is set up
def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and not cuda_usable():
        pytest.skip("no CUDA GPU on this machine" if not gpu_present() else "rivet's CUDA launch is not there yet")


@pytest.fixture(params=BACKENDS)
def target(request):
    return request.param


def mx_ptr(arr):
    """Address of the first element of an NDArray (MXNet has no Python pointer API)."""
    p = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(arr.handle, ctypes.byref(p)))
    return p.value


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def random_array(rng, shape, dtype=np.float32):
    """Fresh random data, never zero: uniform in +-[0.5, 1.5)."""
    mag = rng.uniform(0.5, 1.5, size=shape)
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return np.asarray(mag * sign).astype(dtype)


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(name="mx_ptr")
def mx_ptr_fixture():
    return mx_ptr


@pytest.fixture(name="random_array")
def random_array_fixture():
    return random_array


@pytest.fixture(name="rss_bytes")
def rss_fixture():
    return rss_bytes
