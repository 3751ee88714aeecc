"""Helpers for the MXNet suite (runs in .venv-mxnet: mxnet 1.9.1, numpy<1.24, no torch/jax)."""

import ctypes
import os
import zlib

# MXNet's threaded engine makes every to_dlpack_for_write wait on a worker; the naive engine
# runs operations synchronously. Must be set before mxnet is imported.
os.environ.setdefault("MXNET_ENGINE_TYPE", "NaiveEngine")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


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
