"""Regression tests for defects of the CUDA runtime: each one shows a defect fixed.

They need a CUDA driver: a GPU, or the tests' CUDA driver double (a ``libcuda.so.1`` that runs
kernels on the CPU, strict about stream order: work queued on a stream runs only when
something waits for it, so a missing wait reads poison bytes). Without a driver the whole
module is skipped. Driver calls of the tests themselves go through ctypes (the few wrappers
below); results are read back on a consumer stream, so a missing wait shows as wrong data.
"""

import contextlib
import ctypes
import gc
import os
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import pytest

import rivet
from rivet import te

pytestmark = pytest.mark.cuda

try:
    N_DEVICES = rivet.cuda_device_count()
except rivet.Error as e:  # no driver: nothing here can run
    pytest.skip(f"no CUDA driver: {e}", allow_module_level=True)
if N_DEVICES == 0:
    pytest.skip("no CUDA device", allow_module_level=True)

# ---- the driver calls of the tests (ctypes) -------------------------------------------------

_cu = ctypes.CDLL("libcuda.so.1")
_vp, _u64, _sz = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t


def _ok(r, what):
    assert r == 0, f"{what} returned CUDA error {r}"


def ctx_get_current():
    c = _vp()
    _ok(_cu.cuCtxGetCurrent(ctypes.byref(c)), "cuCtxGetCurrent")
    return c.value  # None: no current context


def ctx_set_current(c):
    _ok(_cu.cuCtxSetCurrent(_vp(c)), "cuCtxSetCurrent")


def primary_ctx(device):
    c = _vp()
    _ok(_cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), ctypes.c_int(device)), "cuDevicePrimaryCtxRetain")
    return c.value


def stream_create():
    s = _vp()
    _ok(_cu.cuStreamCreate(ctypes.byref(s), ctypes.c_uint(1)), "cuStreamCreate")  # non-blocking
    return s.value


def stream_destroy(s):
    _ok(_cu.cuStreamDestroy_v2(_vp(s)), "cuStreamDestroy")


def stream_sync(s):
    _ok(_cu.cuStreamSynchronize(_vp(s)), "cuStreamSynchronize")


def ctx_sync():
    _ok(_cu.cuCtxSynchronize(), "cuCtxSynchronize")


def htod(ptr, a):
    a = np.ascontiguousarray(a)
    _ok(_cu.cuMemcpyHtoD_v2(_u64(ptr), a.ctypes.data_as(_vp), _sz(a.nbytes)), "cuMemcpyHtoD")


def dtoh(ptr, n, dtype=np.float32):
    out = np.empty(n, dtype)
    _ok(_cu.cuMemcpyDtoH_v2(out.ctypes.data_as(_vp), _u64(ptr), _sz(out.nbytes)), "cuMemcpyDtoH")
    return out


def dtod_async(dst, src, nbytes, stream):
    _ok(_cu.cuMemcpyDtoDAsync_v2(_u64(dst), _u64(src), _sz(nbytes), _vp(stream)), "cuMemcpyDtoDAsync")


@pytest.fixture(autouse=True)
def bound_context():
    """The tests' own driver calls run in cuda:0's primary context (as torch's would)."""
    ctx_set_current(primary_ctx(0))
    yield


def read_on(stream, t, n, dtype=np.float32):
    """`t`'s first `n` elements as a consumer on `stream` sees them: copied on `stream` (after
    the wait `t.__dlpack__(stream=...)` queued), then read back."""
    rivet.from_dlpack(t.__dlpack__(stream=stream, max_version=(1, 0)))
    size = np.dtype(dtype).itemsize * n
    scratch = rivet.empty((n,), dtype=np.dtype(dtype).name, device="cuda")
    ctx_sync()  # the scratch allocation is done (it is not what is under test)
    dtod_async(scratch.data_ptr, t.data_ptr, size, stream)
    stream_sync(stream)
    return dtoh(scratch.data_ptr, n, dtype)


def no_double_reports(text):
    bad = [l for l in text.splitlines() if l.startswith("rivet-cuda-double:") or "rivet: warning" in l]
    assert not bad, "\n".join(bad)


# ---- kernels ---------------------------------------------------------------------------------


def _build_add():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=64)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    return rivet.build(s, [A, B, C], target="cuda", name="add")["add"]


@pytest.fixture(scope="module")
def add():
    return _build_add()


def filled(values, device="cuda"):
    """A rivet CUDA tensor holding `values` (float32), written synchronously."""
    a = np.asarray(values, np.float32)
    t = rivet.empty(a.shape, device=device)
    ctx_sync()
    htod(t.data_ptr, a)
    return t


class CAI:
    """A ``__cuda_array_interface__`` v2 producer (no stream) over `t`'s memory."""

    def __init__(self, t):
        self.t = t  # keeps the memory alive
        self.d = dict(version=2, shape=tuple(t.shape), typestr="<f4", data=(t.data_ptr, False), strides=None)

    @property
    def __cuda_array_interface__(self):
        return self.d


N = 1000


# ---- 1: a call whose arguments name no stream still orders its results --------------------


@pytest.mark.parametrize("kind", ["cai_v2", "capsule"])
def test_results_of_a_call_on_stream_less_inputs_make_consumers_wait(add, kind):
    a, b = filled(np.arange(N)), filled(np.ones(N))
    if kind == "cai_v2":
        args = (CAI(a), CAI(b))
    else:
        args = (a.__dlpack__(), b.__dlpack__())
    c = add(*args)  # runs on the legacy default stream: no argument names a stream
    s = stream_create()
    try:
        np.testing.assert_array_equal(read_on(s, c, N), np.arange(N) + 1.0)
    finally:
        stream_destroy(s)


# ---- 2: blockDim.z is at most 64 -----------------------------------------------------------


def _zcube(tz):
    """C[i, j] = A[i, j] * 2 with j on threadIdx.z (tz threads) and i on blockIdx.x."""
    m = te.var("m")
    A = te.placeholder((m, tz), "float32", name="A")
    C = te.compute((m, tz), lambda i, j: A[i, j] * 2.0, name="C")
    s = rivet.create_schedule(C)
    i, j = C.op.axis
    s[C].bind(i, "blockIdx.x")
    s[C].bind(j, "threadIdx.z")
    return s, [A, C]


def test_a_threadidx_z_of_64_runs_and_65_is_refused_at_build():
    f = rivet.build(*_zcube(64), target="cuda", name="z64")["z64"]
    a = np.random.default_rng().standard_normal((3, 64)).astype(np.float32)
    t = filled(a)
    out = f(t)
    ctx_sync()
    np.testing.assert_array_equal(dtoh(out.data_ptr, a.size, np.float32).reshape(a.shape), a * 2)
    with pytest.raises(rivet.CompileError, match=r"threadIdx.z.*65.*64"):
        rivet.build(*_zcube(65), target="cuda", name="z65")


# ---- 3: rivet leaves the caller's current context as it found it ---------------------------


@contextlib.contextmanager
def expected_refusals():
    """Points the driver double's report log at a scratch file for a block that makes the driver
    refuse something on purpose (an allocation past the device's memory): the shared log must
    hold only misuse no test expected. The double reads the variable at each report."""
    key = "RIVET_CUDA_DOUBLE_LOG"
    old = os.environ.get(key)
    fd, scratch = tempfile.mkstemp(prefix="double-expected-")
    os.close(fd)
    os.environ[key] = scratch
    try:
        yield
    finally:
        if old is None:
            del os.environ[key]
        else:
            os.environ[key] = old
        os.unlink(scratch)


@pytest.mark.skipif(N_DEVICES < 2, reason="needs two CUDA devices")
def test_calls_on_another_device_restore_the_callers_context(add):
    ctx0 = primary_ctx(0)
    for before in (ctx0, None):
        ctx_set_current(before)
        x = rivet.zeros((N,), device="cuda:1")  # allocation (and the device's first use)
        assert ctx_get_current() == before
        y = add(x, x)  # module load, launch, completion event
        assert ctx_get_current() == before
        rivet.from_dlpack(y.__dlpack__(stream=1))  # an ordering
        assert ctx_get_current() == before
        rivet.from_dlpack(CAI(y))  # pointer attributes
        assert ctx_get_current() == before
        with pytest.raises(rivet.MemoryError), expected_refusals():
            rivet.empty((1 << 40,), device="cuda:1")  # an error path
        assert ctx_get_current() == before
        del x, y
        gc.collect()  # frees
        assert ctx_get_current() == before
    ctx_set_current(ctx0)


def test_an_error_inside_a_bound_call_restores_the_context(add):
    ctx_set_current(None)
    with pytest.raises(rivet.MemoryError), expected_refusals():
        rivet.zeros((1 << 40,), device="cuda")
    assert ctx_get_current() is None


# ---- 4: a tensor carries an event, not a stream that may be gone ---------------------------


def test_a_tensor_outlives_the_stream_it_was_made_on(add, capfd):
    s1 = stream_create()
    x = rivet.zeros((N,), device="cuda", stream=s1)
    y = add(filled(np.arange(N)), x, stream=s1)
    stream_destroy(s1)  # the producer's stream is gone; its queued work still completes
    s2 = stream_create()
    try:
        np.testing.assert_array_equal(read_on(s2, x, N), np.zeros(N))
        np.testing.assert_array_equal(read_on(s2, y, N), np.arange(N, dtype=np.float32))
        # As an input of a call on another stream: that stream waits for the event.
        z = add(y, y, stream=s2)
        np.testing.assert_array_equal(read_on(s2, z, N), 2.0 * np.arange(N))
    finally:
        stream_destroy(s2)
    no_double_reports(capfd.readouterr().err)


def test_all_outputs_of_a_call_share_one_event_and_readers_see_them_written(add):
    s1, s2 = stream_create(), stream_create()
    try:
        a = filled(np.full(N, 2.0))
        c = add(a, a, stream=s1)
        d = rivet.from_dlpack(c)  # a view: same event
        np.testing.assert_array_equal(read_on(s2, d, N), np.full(N, 4.0))
    finally:
        stream_destroy(s1)
        stream_destroy(s2)


# ---- 7: every driver call that needs a context binds one ----------------------------------


def test_a_thread_with_no_current_context_can_import_and_free(add):
    t = filled(np.arange(N))
    seen = {}

    def work():
        seen["before"] = ctx_get_current()
        v = rivet.from_dlpack(CAI(t))  # pointer attributes on a thread with no context
        seen["device"] = v.device
        w = add(v, v)  # a call, its frees at the end
        seen["sum"] = dtoh_after_sync(w)
        del v, w
        gc.collect()
        seen["after"] = ctx_get_current()

    def dtoh_after_sync(w):
        ctx_set_current(primary_ctx(0))
        ctx_sync()
        r = dtoh(w.data_ptr, N)
        ctx_set_current(None)
        return r

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert seen["before"] is None and seen["after"] is None
    assert seen["device"] == "cuda:0"
    np.testing.assert_array_equal(seen["sum"], 2.0 * np.arange(N))


# ---- 5, 9: without memory pools; frees at process exit -------------------------------------

_SCRIPT = textwrap.dedent(
    """
    import ctypes, sys
    import numpy as np
    sys.path.insert(0, {here!r})
    import test_cuda_defects as T
    add = T._build_add()
    T.ctx_set_current(T.primary_ctx(0))
    s1, s2 = T.stream_create(), T.stream_create()
    x = T.rivet.zeros(({n},), device="cuda", stream=s1)
    np.testing.assert_array_equal(T.read_on(s2, x, {n}), np.zeros({n}))
    a = T.filled(np.arange({n}))
    y = add(a, x, stream=s1)
    np.testing.assert_array_equal(T.read_on(s2, y, {n}), np.arange({n}, dtype=np.float32))
    for _ in range(20):  # frees while work is queued
        y = add(y, a, stream=s1)
    np.testing.assert_array_equal(T.read_on(s2, y, {n}), 21.0 * np.arange({n}))
    # Left for the exit: tensors, a capsule, work still queued on s1.
    KEEP = [x, y, add(y, y, stream=s1), y.__dlpack__()]
    print("ok")
    """
)


def _run(env_extra, tmp_path):
    env = dict(os.environ)
    env.update(env_extra)
    log = tmp_path / "double.log"
    env["RIVET_CUDA_DOUBLE_LOG"] = str(log)
    here = os.path.dirname(os.path.abspath(__file__))
    code = _SCRIPT.format(here=here, n=N)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok", r.stdout + r.stderr
    no_double_reports(r.stderr)
    if log.exists():
        no_double_reports(log.read_text())
    return r


def _double_config(**kv):
    parts = [p for p in os.environ.get("RIVET_CUDA_DOUBLE", "devices=sm_90").split(";") if p]
    keys = set(kv)
    parts = [p for p in parts if p.split("=", 1)[0] not in keys]
    parts += [f"{k}={v}" for k, v in kv.items()]
    return ";".join(parts)


@pytest.mark.skipif("RIVET_CUDA_DOUBLE" not in os.environ and "rivet-cuda-double" not in os.environ.get("LD_LIBRARY_PATH", ""),
                    reason="memory pools can only be switched off on the driver double")
def test_without_memory_pools_allocations_and_frees_are_ordered(tmp_path):
    _run({"RIVET_CUDA_DOUBLE": _double_config(pools=0)}, tmp_path)


def test_tensors_alive_at_exit_are_freed_once_before_the_driver_goes(tmp_path):
    _run({}, tmp_path)


# ---- 10: errors of drops are reported where they happen ------------------------------------


def test_dropping_a_function_reports_nothing_and_leaves_later_calls_clean(add, capfd):
    f = _build_add()
    a = filled(np.arange(N))
    f(a, a)
    del f
    gc.collect()  # unloads its module
    c = add(a, a)
    s = stream_create()
    try:
        np.testing.assert_array_equal(read_on(s, c, N), 2.0 * np.arange(N))
    finally:
        stream_destroy(s)
    no_double_reports(capfd.readouterr().err)
