"""rivet's CUDA runtime through a driver only (no torch / CuPy / JAX): device allocations,
compiled functions on device memory, kDLCUDA capsules (rivet-made and hand-made, legacy and
versioned ABI) in and out with stream semantics, ``__cuda_array_interface__`` producers in
and out, DLPack deleters, mixed devices and a second device.

Runs on the CUDA driver double (tests/cuda_double: ``make test`` puts it on LD_LIBRARY_PATH)
and on a real GPU; the whole module skips where rivet sees no driver. The double is strict:
device memory is not host-readable, fresh memory is 0xFF poison, streams run lazily (queued
work runs only at a synchronize, an event wait or a blocking call), so a missing stream wait in
rivet gives poison here instead of a rare race. Data moves only through the driver
(tests/python/cuda_driver.py); every result is compared with numpy on fresh random data, and
outputs rivet writes into are poisoned first.
"""

import gc

import numpy as np
import pytest

import cuda_driver as cu
import rivet
from cuda_driver import no_driver_misuse  # noqa: F401 (autouse: the double's misuse reports fail a test)
from rivet import te

pytestmark = pytest.mark.cuda
N_DEVICES = cu.require_cuda()
SIZES = [1, 3, 17, 97, 1023]
GARBAGE = 0xA5  # bytes written into outputs before rivet writes them


def two_devices():
    if N_DEVICES < 2:
        pytest.skip("one CUDA device (the double: RIVET_CUDA_DOUBLE='devices=sm_90,sm_80')")


# ---- kernels with explicit GPU schedules -----------------------------------------------------


def _bind(s, stage, axis, factor):
    bx, tx = s[stage].split(axis, factor=factor)
    s[stage].bind(bx, "blockIdx.x")
    s[stage].bind(tx, "threadIdx.x")


def build_add(target="cuda", dtype="float32"):
    """C[i] = A[i] + B[i], n symbolic, 64 threads a block (ragged sizes leave partial blocks)."""
    n = te.var("n")
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    s = rivet.create_schedule(C)
    _bind(s, C, C.op.axis[0], 64)
    return rivet.build(s, [A, B, C], target=target, name="add")["add"]


def build_scale2d(target="cuda"):
    """C[i, j] = A[i, j] * 3 + 1 (any strides), both axes fused onto blocks and threads."""
    m, n = te.var("m"), te.var("n")
    A = te.placeholder((m, n), "float32", name="A")
    C = te.compute((m, n), lambda i, j: A[i, j] * 3.0 + 1.0, name="C")
    s = rivet.create_schedule(C)
    _bind(s, C, s[C].fuse(C.op.axis[0], C.op.axis[1]), 32)
    return rivet.build(s, [A, C], target=target, name="scale2d")["scale2d"]


def build_rowsum(target="cuda"):
    """R[i] = sum_j X[i, j]: a cross-thread reduction (threadIdx.x over j), a block per row."""
    m, n = te.var("m"), te.var("n")
    X = te.placeholder((m, n), "float32", name="X")
    j = te.reduce_axis((0, n), name="j")
    R = te.compute((m,), lambda i: te.sum(X[i, j], axis=j), name="R")
    s = rivet.create_schedule(R)
    s[R].bind(R.op.axis[0], "blockIdx.x")
    jo, ji = s[R].split(j, factor=32)
    s[R].reorder(R.op.axis[0], ji, jo)  # bound loops outermost: block, thread, then serial
    s[R].bind(ji, "threadIdx.x")
    return rivet.build(s, [X, R], target=target, name="rowsum")["rowsum"]


@pytest.fixture(scope="module")
def add():
    return build_add()


@pytest.fixture(scope="module")
def scale2d():
    return build_scale2d()


def fresh(rng, shape, dtype="float32"):
    """Fresh random data, never zero, exactly representable sums (multiples of 1/8)."""
    if np.dtype(dtype).kind in "iu":
        v = rng.integers(1, 100, size=shape)
        return v.astype(dtype)
    v = rng.integers(-64, 64, size=shape) / 8.0
    v[v == 0] = 0.125
    return v.astype(dtype)


# ---- inputs of every kind a call takes -------------------------------------------------------


def device_input(kind, a, stream=None):
    """`a` (a numpy array) on cuda:0 as a call argument of `kind`; returns (argument, keep)."""
    if kind == "rivet":
        t = rivet.empty(a.shape, str(a.dtype), device="cuda")
        cu.htod(t.data_ptr, a)
        return t, t
    buf = cu.DeviceBuffer.from_array(a)
    if kind == "capsule":
        cap, d = cu.capsule(buf, a.shape, str(a.dtype))
        return rivet.from_dlpack(cap), (buf, d)
    if kind == "capsule-legacy":
        cap, d = cu.capsule(buf, a.shape, str(a.dtype), versioned=False)
        return rivet.from_dlpack(cap), (buf, d)
    if kind == "producer":
        p = cu.Producer(buf, a.shape, str(a.dtype))
        return p, p
    if kind == "cai2":
        c = cu.CAI(buf, a.shape, str(a.dtype), version=2)
        return c, c
    if kind == "cai3":
        c = cu.CAI(buf, a.shape, str(a.dtype), version=3, stream=stream)
        return c, c
    raise AssertionError(kind)


INPUT_KINDS = ["rivet", "capsule", "capsule-legacy", "producer", "cai2", "cai3"]


# =============================================================================================
# Allocations
# =============================================================================================


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "uint8", "float16", "bfloat16", "bool", "int64"])
def test_zeros_on_the_device_are_really_zero(dtype, n):
    t = rivet.zeros((n,), dtype, device="cuda")
    assert (t.device, t.shape, t.strides, t.dtype) == ("cuda:0", (n,), (1,), dtype)
    assert cu.pointer_device(t.data_ptr) == 0
    assert cu.pointer_memory_type(t.data_ptr) == cu.CU_MEMORYTYPE_DEVICE
    got = cu.download(t)  # cuMemcpyDtoH: after the legacy default stream's work (the memset)
    assert not got.view(np.uint8).any(), got


@pytest.mark.parametrize("shape", [(1,), (3, 17), (97, 3), (1023,), (0,), (2, 0, 5)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "bfloat16"])
def test_empty_on_the_device_round_trips_through_the_driver(rng, dtype, shape):
    t = rivet.empty(shape, dtype, device="cuda")
    strides = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))
    assert (t.device, t.shape, t.dtype) == ("cuda:0", shape, dtype)
    if 0 not in shape:
        assert t.strides == strides
    want = rng.integers(0, 1 << 15, size=shape).astype(cu.np_dtype(dtype)) if dtype in ("int16", "bfloat16") else fresh(rng, shape, dtype)
    if want.size:
        cu.htod(t.data_ptr, want)
    np.testing.assert_array_equal(cu.download(t), want)
    with pytest.raises(rivet.DeviceError, match="cuda:0"):
        t.numpy()  # device memory is never read from the host


def test_zeros_on_a_non_blocking_stream_are_zero_on_that_stream():
    # The memset is queued on the given stream: reading on that stream (and synchronizing only
    # it) must see zeros; the double runs nothing that no one waited for.
    with cu.Stream() as s:
        t = rivet.zeros((1023,), "float32", device="cuda", stream=s.handle)
        got = cu.download(t, stream=s)
    assert (got == 0).all(), got[:8]


def test_zeros_then_export_to_another_stream_is_ordered():
    # Allocated and zeroed on stream A; a consumer on stream B asks for it with
    # __dlpack__(stream=B): B must wait for A (an event) before B's read.
    with cu.Stream() as a, cu.Stream() as b:
        t = rivet.zeros((97, 3), "float64", device="cuda", stream=a.handle)
        got, dev, _ = cu.read_capsule(t.__dlpack__(stream=b.handle, max_version=(1, 0)), stream=b)
    assert dev == 0 and got.shape == (97, 3) and (got == 0).all()


def test_a_second_device_allocates_there():
    two_devices()
    t = rivet.zeros((17, 3), "int32", device="cuda:1")
    assert t.device == "cuda:1" and cu.pointer_device(t.data_ptr) == 1
    assert (cu.download(t) == 0).all()


# =============================================================================================
# Compiled functions on device memory
# =============================================================================================


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", INPUT_KINDS)
def test_allocated_outputs_of_a_compiled_function(add, rng, kind, n):
    a, b = fresh(rng, (n,)), fresh(rng, (n,))
    x, kx = device_input(kind, a)
    y, ky = device_input(kind, b)
    c = add(x, y)
    assert isinstance(c, rivet.Tensor) and (c.device, c.shape, c.dtype) == ("cuda:0", (n,), "float32")
    np.testing.assert_array_equal(cu.download(c), a + b)
    # The inputs were only read.
    for arg, want in ((x, a), (y, b)):
        if isinstance(arg, rivet.Tensor):
            np.testing.assert_array_equal(cu.download(arg), want)
    del kx, ky


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("out_kind", ["capsule", "capsule-legacy", "cai2", "cai3", "rivet"])
def test_outputs_passed_in_are_written_in_place(add, rng, out_kind, n):
    a, b = fresh(rng, (n,)), fresh(rng, (n,))
    x, _ = device_input("capsule", a)
    y, _ = device_input("cai2", b)
    pad = 16  # bytes after the output: must stay as they were
    if out_kind == "rivet":
        dst = rivet.empty((n,), "float32", device="cuda")
        cu.memset_d8(dst.data_ptr, GARBAGE, n * 4)
        ptr, pad = dst.data_ptr, 0
    else:
        buf = cu.DeviceBuffer(n * 4 + pad).fill(GARBAGE)
        ptr = buf.ptr
        if out_kind == "capsule":
            dst = rivet.from_dlpack(cu.capsule(buf, (n,), "float32")[0])
        elif out_kind == "capsule-legacy":
            dst = rivet.from_dlpack(cu.capsule(buf, (n,), "float32", versioned=False)[0])
        else:
            dst = cu.CAI(buf, (n,), "float32", version=2 if out_kind == "cai2" else 3)
    assert add(x, y, dst) is None
    np.testing.assert_array_equal(cu.dtoh(ptr, (n,), np.float32), a + b)
    if pad:
        assert (cu.dtoh(ptr + 4 * n, (pad,), np.uint8) == GARBAGE).all(), "rivet wrote past the output"


@pytest.mark.parametrize("how", ["capsule", "cai"])
def test_strided_and_offset_views_in_and_out(scale2d, rng, how):
    base = fresh(rng, (40, 50))
    src = cu.DeviceBuffer.from_array(base)
    out_buf = cu.DeviceBuffer(40 * 50 * 4).fill(GARBAGE)
    # Views of the (40, 50) buffers: (rows 3.., cols 5..) every other column, and a transpose.
    views = [
        ((37, 20), (50, 2), 3 * 50 + 5, lambda m: m[3:, 5:45:2]),
        ((50, 40), (1, 50), 0, lambda m: m.T),
        ((9, 7), (100, 3), 51, lambda m: m[1::2, 1::3][:9, :7]),
    ]
    for shape, strides, off, view in views:
        cu.memset_d8(out_buf.ptr, GARBAGE, out_buf.nbytes)
        if how == "capsule":
            x = rivet.from_dlpack(cu.capsule(src, shape, "float32", strides=strides, byte_offset=4 * off)[0])
            y = rivet.from_dlpack(cu.capsule(out_buf, shape, "float32", strides=strides, byte_offset=4 * off)[0])
            assert (x.shape, x.strides) == (shape, strides)
        else:
            x = cu.CAI(src, shape, "float32", strides=strides, byte_offset=4 * off, version=2)
            y = cu.CAI(out_buf, shape, "float32", strides=strides, byte_offset=4 * off, version=2)
        scale2d(x, y)
        got = out_buf.read((40, 50), np.float32)
        want_view = view(base) * np.float32(3.0) + np.float32(1.0)
        np.testing.assert_array_equal(view(got), want_view)
        # Everything outside the view is untouched garbage.
        mask = np.ones((40, 50), bool)
        view(mask)[...] = False
        assert (got.view(np.uint32)[mask] == 0xA5A5A5A5).all(), "written outside the view"
        # An allocated output of a strided input is compact.
        r = scale2d(x)
        assert r.strides == (shape[1], 1)
        np.testing.assert_array_equal(cu.download(r), want_view)


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (17, 97), (5, 1023)])
def test_a_cross_thread_reduction(rng, shape):
    f = build_rowsum()
    x = fresh(rng, shape)  # multiples of 1/8, few terms: every sum is exact in any order
    r = f(device_input("cai2", x)[0])
    np.testing.assert_array_equal(cu.download(r), x.sum(axis=1, dtype=np.float64).astype(np.float32))


def test_many_outputs_freed_in_a_loop_stay_correct(add, rng):
    a = fresh(rng, (4096,))
    x, _ = device_input("capsule", a)
    acc = np.zeros(4096, np.float32)
    for i in range(30):
        c = add(x, x)  # each previous output dropped here: the reaper frees it after a sync
        if i % 10 == 0:
            acc = cu.download(c)
        del c
    gc.collect()
    np.testing.assert_array_equal(acc, a + a)


# =============================================================================================
# Streams
# =============================================================================================


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_dlpack_export_orders_the_consumer_stream_after_rivet_work(add, rng, versioned):
    # rivet computes on non-blocking stream A; a consumer on non-blocking stream B takes the
    # result with __dlpack__(stream=B) and synchronizes B only. Without rivet's event wait, A's
    # queued kernel never ran when B reads (poison on the double).
    a, b = fresh(rng, (1023,)), fresh(rng, (1023,))
    x, _ = device_input("capsule", a)
    y, _ = device_input("capsule", b)
    with cu.Stream() as sa, cu.Stream() as sb:
        c = add(x, y, stream=sa.handle)
        kw = dict(max_version=(1, 0)) if versioned else {}
        got, dev, flags = cu.read_capsule(c.__dlpack__(stream=sb.handle, **kw), stream=sb)
        assert dev == 0 and (flags == 0 if versioned else flags is None)
        np.testing.assert_array_equal(got, a + b)
        # The consumer may ask again (a second export, same ordering), and the legacy default
        # stream (None) too.
        again, _, _ = cu.read_capsule(c.__dlpack__(stream=None, **kw))
        np.testing.assert_array_equal(again, a + b)


def test_a_rivet_export_imported_back_is_the_same_memory(add, rng):
    a = fresh(rng, (97,))
    x, _ = device_input("cai2", a)
    with cu.Stream() as s:
        c = add(x, x, stream=s.handle)
        back = rivet.from_dlpack(c.__dlpack__(stream=s.handle, max_version=(1, 0)))
        assert (back.device, back.shape, back.data_ptr) == ("cuda:0", (97,), c.data_ptr)
        d = add(back, x, stream=s.handle)
        np.testing.assert_array_equal(cu.download(d, stream=s), a + a + a)


def test_an_explicit_stream_runs_the_kernel_there(add, rng):
    a, b = fresh(rng, (1023,)), fresh(rng, (1023,))
    with cu.Stream() as s:
        # Inputs uploaded lazily on s itself: the call on s is ordered after them.
        bx, by = cu.DeviceBuffer(a.nbytes), cu.DeviceBuffer(b.nbytes)
        keep = cu.htod(bx.ptr, a, stream=s), cu.htod(by.ptr, b, stream=s)
        out = cu.DeviceBuffer(a.nbytes).fill(GARBAGE)
        add(cu.CAI(bx, a.shape, "float32", version=2), cu.CAI(by, b.shape, "float32", version=2),
            cu.CAI(out, a.shape, "float32", version=2), stream=s.handle)
        np.testing.assert_array_equal(out.read(a.shape, np.float32, stream=s), a + b)
        c = add(cu.CAI(bx, a.shape, "float32", version=2), cu.CAI(by, b.shape, "float32", version=2), stream=s)
        np.testing.assert_array_equal(cu.download(c, stream=s), a + b)
        del keep


@pytest.mark.parametrize("explicit", [False, True], ids=["producer-stream", "explicit-stream"])
def test_dlpack_producers_are_given_the_call_stream(add, rng, explicit):
    # Producers whose data is still queued on their own non-blocking stream P: asked with
    # __dlpack__(stream=S), they make S wait for P. rivet must pass the call's stream.
    a, b = fresh(rng, (1023,)), fresh(rng, (1023,))
    with cu.Stream() as p, cu.Stream() as s:
        bx, by = cu.DeviceBuffer(a.nbytes), cu.DeviceBuffer(b.nbytes)
        keep = cu.htod(bx.ptr, a, stream=p), cu.htod(by.ptr, b, stream=p)
        px = cu.Producer(bx, a.shape, "float32", work_stream=p)
        py = cu.Producer(by, b.shape, "float32", work_stream=p)
        if explicit:
            c = add(px, py, stream=s.handle)
            assert px.asked == [s.handle] and py.asked == [s.handle], (px.asked, py.asked)
            got = cu.download(c, stream=s)
        else:
            c = add(px, py)
            assert px.asked == [cu.CU_STREAM_LEGACY] and py.asked == [cu.CU_STREAM_LEGACY], px.asked
            got = cu.download(c)  # cuMemcpyDtoH: the legacy default stream
        np.testing.assert_array_equal(got, a + b)
        del keep


def test_a_cai_v3_stream_orders_the_call_and_sees_its_writes(add, rng):
    # Inputs and the output are __cuda_array_interface__ v3 objects whose producer works on
    # stream P (the inputs' upload still queued there). The call runs on its own stream S: S
    # waits for P before the kernel, and P waits for S after it, so P's later work (our
    # read, queued on P) sees rivet's writes without any synchronize of S.
    a, b = fresh(rng, (1023,)), fresh(rng, (1023,))
    with cu.Stream() as p, cu.Stream() as s:
        bx, by = cu.DeviceBuffer(a.nbytes), cu.DeviceBuffer(b.nbytes)
        out = cu.DeviceBuffer(a.nbytes).fill(GARBAGE)
        keep = cu.htod(bx.ptr, a, stream=p), cu.htod(by.ptr, b, stream=p)
        mk = lambda buf: cu.CAI(buf, a.shape, "float32", version=3, stream=p)  # noqa: E731
        add(mk(bx), mk(by), mk(out), stream=s.handle)
        np.testing.assert_array_equal(out.read(a.shape, np.float32, stream=p), a + b)
        # Without an explicit stream the call runs on P itself: the result is on P.
        c = add(mk(bx), mk(by))
        np.testing.assert_array_equal(cu.download(c, stream=p), a + b)
        del keep


def test_cai_v2_and_v3_inputs_agree(add, rng):
    a, b = fresh(rng, (97,)), fresh(rng, (97,))
    for version in (2, 3):
        x = cu.CAI(cu.DeviceBuffer.from_array(a), a.shape, "float32", version=version)
        y = cu.CAI(cu.DeviceBuffer.from_array(b), b.shape, "float32", version=version)
        t = rivet.from_dlpack(x)
        assert (t.device, t.shape, t.data_ptr) == ("cuda:0", (97,), x.buf.ptr)
        np.testing.assert_array_equal(cu.download(add(x, y)), a + b)


def test_a_read_only_cai_cannot_be_an_output(add, rng):
    a = fresh(rng, (17,))
    buf = cu.DeviceBuffer.from_array(a)
    ro = cu.CAI(buf, a.shape, "float32", version=2, read_only=True)
    with pytest.raises(rivet.ReadOnlyError):
        add(ro, ro, ro)
    np.testing.assert_array_equal(buf.read(a.shape, np.float32), a)


# =============================================================================================
# DLPack deleters
# =============================================================================================


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_a_hand_made_capsule_deleter_runs_once_after_the_tensor_dies(add, rng, versioned):
    a = fresh(rng, (97,))
    buf = cu.DeviceBuffer.from_array(a)
    cap, d = cu.capsule(buf, a.shape, "float32", versioned=versioned, deleter=cu.Deleter(buf, free=True))
    t = rivet.from_dlpack(cap)
    c = add(t, t)
    view = rivet.from_dlpack(t.__dlpack__(max_version=(1, 0)))  # a second owner of the import
    np.testing.assert_array_equal(cu.download(c), a + a)  # the kernel is done
    del t
    gc.collect()
    assert d.calls == 0, "the deleter ran while a view still held the memory"
    del view, cap
    gc.collect()
    assert d.calls == 1 and not d.errors, (d.calls, d.errors)
    assert buf.freed
    # The caller's thread is left usable: rivet makes its own context current for each call.
    np.testing.assert_array_equal(cu.download(add(c, c)), 2 * (a + a))


def test_producer_capsules_are_released_once_each(add, rng):
    a = fresh(rng, (17,))
    p = cu.Producer(cu.DeviceBuffer.from_array(a), a.shape, "float32")
    for _ in range(3):
        c = add(p, p)
        np.testing.assert_array_equal(cu.download(c), a + a)
    del c
    gc.collect()
    assert len(p.deleters) == 6 and [d.calls for d in p.deleters] == [1] * 6, [d.calls for d in p.deleters]


def test_a_capsule_refused_at_import_is_released_once(add):
    buf = cu.DeviceBuffer(64)
    cap, d = cu.capsule(buf, (4,), "float32", device_id=N_DEVICES + 3)
    t = rivet.from_dlpack(cap)
    with pytest.raises(rivet.DeviceError, match=str(N_DEVICES)):
        add(t, t)
    del t, cap
    gc.collect()
    assert d.calls == 1


def test_a_capsule_of_the_second_device_is_released_on_its_context(rng):
    two_devices()
    f = build_add()
    a = fresh(rng, (97,))
    buf = cu.DeviceBuffer.from_array(a, device=1)
    cap, d = cu.capsule(buf, a.shape, "float32", deleter=cu.Deleter(buf, free=True))
    t = rivet.from_dlpack(cap)
    assert t.device == "cuda:1"
    c = f(t, t)
    assert c.device == "cuda:1"
    np.testing.assert_array_equal(cu.download(c), a + a)
    del t, cap
    gc.collect()
    # Freed through the buffer's own context (cuda:1's), from whatever thread rivet used.
    assert d.calls == 1 and not d.errors and buf.freed, (d.calls, d.errors)


@pytest.mark.parametrize("device", [0, 1])
def test_rivet_made_capsules_consumed_by_a_c_consumer(rng, device):
    if device == 1:
        two_devices()
    f = build_add()
    a = fresh(rng, (3, 17)).reshape(-1)
    x = cu.CAI(cu.DeviceBuffer.from_array(a, device=device), a.shape, "float32", version=2)
    c = f(x, x)
    assert c.device == f"cuda:{device}"
    for kw in (dict(max_version=(1, 0)), {}):
        got, dev, _ = cu.read_capsule(c.__dlpack__(**kw))  # its deleter called, once
        assert dev == device
        np.testing.assert_array_equal(got, a + a)
    ptr = c.data_ptr
    del c  # the last owner: rivet frees the memory (its reaper, on cuda:<device>'s context)
    gc.collect()
    cu.ctx_synchronize(device)
    assert ptr != 0


# =============================================================================================
# Devices
# =============================================================================================


def test_mixed_devices_name_the_arguments(add, rng):
    two_devices()
    a = fresh(rng, (17,))
    x0 = rivet.from_dlpack(cu.capsule(cu.DeviceBuffer.from_array(a, device=0), a.shape, "float32")[0])
    x1 = rivet.from_dlpack(cu.capsule(cu.DeviceBuffer.from_array(a, device=1), a.shape, "float32")[0])
    out = cu.DeviceBuffer(a.nbytes, device=1).fill(GARBAGE)
    with pytest.raises(rivet.DeviceError) as e:
        add(x0, x1, cu.CAI(out, a.shape, "float32", version=2))
    msg = str(e.value)
    assert "argument 0 ('A') is on cuda:0" in msg and "argument 1 ('B') is on cuda:1" in msg, msg
    with pytest.raises(rivet.DeviceError) as e:
        add(x1, x1, cu.CAI(cu.DeviceBuffer(a.nbytes, device=0), a.shape, "float32", version=2))
    msg = str(e.value)
    assert "is on cuda:1" in msg and "argument 2 ('C') is on cuda:0" in msg, msg
    with pytest.raises(rivet.DeviceError, match=r"argument 1 \('B'\) is on cpu"):
        add(x0, a)
    # Nothing was written by the refused calls.
    assert (out.read(a.shape, np.uint8) == GARBAGE).all()


@pytest.mark.parametrize("target", ["cuda", "cuda -arch=sm_90", "cuda -arch=sm_80"])
def test_every_device_runs_a_function_built_for_any_arch(rng, target):
    # The cubin built for the target's arch runs where the device has it; any other device gets
    # the source compiled again for its own arch (under the double: sm_90 and sm_80).
    f = build_add(target)
    for dev in range(min(N_DEVICES, 2)):
        a, b = fresh(rng, (1023,)), fresh(rng, (1023,))
        x = cu.CAI(cu.DeviceBuffer.from_array(a, device=dev), a.shape, "float32", version=2)
        y = cu.CAI(cu.DeviceBuffer.from_array(b, device=dev), b.shape, "float32", version=2)
        c = f(x, y)
        assert c.device == f"cuda:{dev}"
        np.testing.assert_array_equal(cu.download(c), a + b)
        out = cu.DeviceBuffer(a.nbytes, device=dev).fill(GARBAGE)
        f(x, y, cu.CAI(out, a.shape, "float32", version=2))
        np.testing.assert_array_equal(out.read(a.shape, np.float32), a + b)


def test_a_device_past_the_count_is_a_device_error():
    with pytest.raises(rivet.DeviceError, match=str(N_DEVICES)):
        rivet.zeros((4,), device=f"cuda:{N_DEVICES}")


def test_threads_each_get_their_device(rng):
    # rivet makes the device's context current on the calling thread before each driver call:
    # two threads, each on its own device (or both on cuda:0), interleaved.
    import threading

    f = build_add()
    errors, results = [], {}

    def work(dev, seed):
        try:
            r = np.random.default_rng(seed)
            for i in range(5):
                a = fresh(r, (97,))
                x = cu.CAI(cu.DeviceBuffer.from_array(a, device=dev), a.shape, "float32", version=2)
                c = f(x, x)
                results[(dev, seed, i)] = bool(np.array_equal(cu.download(c), a + a))
        except Exception as e:
            errors.append(repr(e))

    devs = [0, 1] if N_DEVICES > 1 else [0, 0]
    ts = [threading.Thread(target=work, args=(d, k)) for k, d in enumerate(devs)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors
    assert len(results) == 10 and all(results.values()), results
