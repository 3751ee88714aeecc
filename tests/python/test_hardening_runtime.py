"""Hardening of the runtime surface: hostile hand-made DLPack capsules, huge
allocations, exceptions that must not be swallowed, the bounded type cache and torch
tensors that require grad. Every case ends in a typed rivet error or a correct result,
with the producer's memory unchanged and its deleter run exactly once.
"""

import ctypes
import gc
import resource
import weakref

import numpy as np
import pytest
import torch

import rivet
from rivet import te

from conftest import assert_bits_equal, bits, rss_bytes

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

# --------------------------------------------------------------------------------------
# hand-made DLPack capsules (ctypes mirrors of dlpack.h)
# --------------------------------------------------------------------------------------


from dlpack_abi import (  # noqa: E402
    DELETER,
    DLDataType,
    DLDevice,
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLPackVersion,
    DLTensor,
    capsule_of,
)


DTYPES = {"float32": (2, 32), "uint8": (1, 8), "float64": (2, 64)}

# Every Hostile producer stays alive for the whole session: a tensor imported from it runs
# its deleter (a ctypes callback inside it) whenever the tensor drops, like any producer.
_PRODUCERS = []


class Hostile:
    """A capsule over `buf` (or `data`) with any shape, strides, ndim and byte_offset.

    Keeps the ctypes structs alive and counts deleter calls; the capsule has no destructor,
    so only a consumer can run the deleter.
    """

    def __init__(self, shape, strides, *, buf, dtype="float32", byte_offset=0, ndim=None,
                 data=None, legacy=False):
        _PRODUCERS.append(self)
        self.buf = buf  # the memory, too, must outlive the tensors viewing it
        self.deleted = 0
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)
        code, nbits = DTYPES[dtype]
        t = DLTensor(
            data=buf.ctypes.data if data is None else data,
            device=DLDevice(1, 0),
            ndim=len(shape) if ndim is None else ndim,
            dtype=DLDataType(code, nbits, 1),
            shape=ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64)),
            strides=ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
            if self.strides is not None else None,
            byte_offset=byte_offset,
        )

        def deleter(_p):
            self.deleted += 1

        self.deleter = DELETER(deleter)
        if legacy:
            self.managed = DLManagedTensor(dl_tensor=t, deleter=self.deleter)
            name = b"dltensor"
        else:
            self.managed = DLManagedTensorVersioned(
                version=DLPackVersion(1, 0), deleter=self.deleter, dl_tensor=t)
            name = b"dltensor_versioned"
        self.capsule = capsule_of(self.managed, name)


def buffer():
    return np.arange(64, dtype=np.float32) + 1.0


# (shape, strides, extra kwargs, expected error class)
REFUSED = [
    # the case: the span overflowed and wrapped into a pass
    ((2, 2), (-(2**62), 2**62), {"dtype": "uint8"}, rivet.DLPackError),
    ((2, 2), (-(2**62), 2**62), {}, rivet.DLPackError),
    ((2**62,), (1,), {}, rivet.DLPackError),
    ((2**31, 2**31), (2**31, 1), {}, rivet.DLPackError),
    ((3,), (2**62,), {}, rivet.DLPackError),
    ((2,), (I64_MIN,), {"dtype": "uint8"}, rivet.DLPackError),
    ((1,), (I64_MIN,), {}, rivet.DLPackError),  # stride * itemsize overflows
    ((2, 2), (I64_MAX, I64_MAX), {"dtype": "uint8"}, rivet.DLPackError),
    ((8,), (-(2**45),), {}, rivet.DLPackError),  # reaches below address 0
    ((2**62, 4), (4, 1), {}, rivet.ShapeError),  # numel overflows int64
    ((2**40, 2**40, 0), (0, 0, 1), {}, rivet.ShapeError),  # empty, but its dims overflow
    ((-1,), (1,), {}, rivet.ShapeError),
    ((4, I64_MIN), (1, 1), {}, rivet.ShapeError),
    ((4,), (1,), {"byte_offset": 2**63}, rivet.DLPackError),
    ((4,), (1,), {"byte_offset": 2**64 - 1}, rivet.DLPackError),
    ((4,), (1,), {"data": 0}, rivet.DLPackError),  # NULL data with elements
    ((4,), (1,), {"ndim": 65}, rivet.DLPackError),
    ((4,), (1,), {"ndim": 2**31 - 1}, rivet.DLPackError),
    ((4,), (1,), {"ndim": -1}, rivet.DLPackError),
]


@pytest.mark.parametrize("legacy", [False, True], ids=["versioned", "legacy"])
@pytest.mark.parametrize("shape,strides,kw,err", REFUSED)
def test_hostile_capsule_is_refused(shape, strides, kw, err, legacy):
    buf = buffer()
    before = bits(buf)
    h = Hostile(shape, strides, buf=buf, legacy=legacy, **kw)
    with pytest.raises(err) as ei:
        rivet.from_dlpack(h.capsule)
    assert isinstance(ei.value, rivet.Error)
    assert "from_dlpack: argument 0" in str(ei.value)
    assert h.deleted == 1  # refused, and released at once
    assert_bits_equal(buf, before)


def test_refusal_names_the_values():
    buf = buffer()
    h = Hostile((2, 2), (-(2**62), 2**62), buf=buf, dtype="uint8")
    with pytest.raises(rivet.DLPackError) as ei:
        rivet.from_dlpack(h.capsule)
    msg = str(ei.value)
    assert "[-4611686018427387904, 4611686018427387904]" in msg and "isize::MAX" in msg, msg
    h = Hostile((3,), (2**62,), buf=buf)
    with pytest.raises(rivet.DLPackError, match=r"dim 0: stride 4611686018427387904 times the item size 4"):
        rivet.from_dlpack(h.capsule)


@pytest.mark.parametrize("shape,strides,kw,err", REFUSED[:9])
def test_hostile_capsule_refused_by_a_call(shape, strides, kw, err):
    """Passed straight to a function, as input or as output: a typed error, nothing written."""
    axpy = rivet.get_global_func("testing.axpy")
    buf, y = buffer(), buffer()
    before, ybefore = bits(buf), bits(y)
    for args in lambda c: (1.0, c, y), lambda c: (1.0, y, c):
        h = Hostile(shape, strides, buf=buf, **kw)
        with pytest.raises(rivet.Error):
            axpy(*args(h.capsule))
        assert h.deleted == 1
    assert_bits_equal(buf, before)
    assert_bits_equal(y, ybefore)


def test_odd_but_valid_layouts_give_correct_results():
    buf = buffer()
    # A single element: any stride is allowed, even i64::MIN (in bytes for uint8).
    h = Hostile((1,), (I64_MIN,), buf=buf, dtype="uint8")
    t = rivet.from_dlpack(h.capsule)
    assert t.strides == (I64_MIN,)
    assert t.numpy()[0] == buf.view(np.uint8)[0]
    del t
    gc.collect()
    assert h.deleted == 1
    # 2**62 elements through a zero stride: a broadcast view of one float.
    h = Hostile((2**62,), (0,), buf=buf)
    t = rivet.from_dlpack(h.capsule)
    assert t.shape == (2**62,) and t.size == 2**62
    ai = t.__array_interface__
    assert ai["strides"] == (0,)
    # Empty with huge dims elsewhere and NULL data: touches nothing.
    h = Hostile((0, 2**40), (2**40, 1), buf=buf, data=0)
    e = rivet.from_dlpack(h.capsule)
    assert e.size == 0
    # Negative strides: byte strides reported exactly.
    a = np.arange(12, dtype=np.float64).reshape(3, 4)[::-1, ::-2]
    h = Hostile(a.shape, tuple(s // 8 for s in a.strides), buf=a, dtype="float64",
                data=a.ctypes.data)
    r = rivet.from_dlpack(h.capsule)
    assert r.numpy().strides == a.strides
    np.testing.assert_array_equal(r.numpy(), a)


# --------------------------------------------------------------------------------------
# allocations
# --------------------------------------------------------------------------------------


def test_max_alloc_bytes_is_exposed():
    assert rivet.MAX_ALLOC_BYTES == 2**48
    assert issubclass(rivet.MemoryError, MemoryError) and issubclass(rivet.MemoryError, rivet.Error)


@pytest.mark.parametrize(
    "shape,dtype",
    [((2**62,), "float32"), ((2**62,), "uint8"), ((2**40, 2**40), "float64"),
     ((I64_MAX, I64_MAX, I64_MAX), "uint8"), ((2**40, 2**40, 0), "float32"), ((2**46,), "float64")],
)
def test_huge_zeros_is_memory_error(shape, dtype):
    with pytest.raises(rivet.MemoryError) as ei:
        rivet.zeros(shape, dtype)
    assert isinstance(ei.value, MemoryError)
    msg = str(ei.value)
    assert dtype in msg and str(list(shape)) in msg and "bytes" in msg, msg


class address_space_limit:
    """Caps this process's address space at its current size plus `extra` bytes, so a
    large allocation is refused by the system whatever the machine's overcommit policy."""

    def __init__(self, extra=1 << 30):
        self.extra = extra

    def __enter__(self):
        self.old = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * resource.getpagesize()
        soft = vm + self.extra
        if self.old[1] != resource.RLIM_INFINITY:
            soft = min(soft, self.old[1])
        resource.setrlimit(resource.RLIMIT_AS, (soft, self.old[1]))

    def __exit__(self, *exc):
        resource.setrlimit(resource.RLIMIT_AS, self.old)


def test_refused_allocation_is_memory_error():
    # 2**40 float32 = 4 TiB: under rivet's limit, so the system is asked and says no.
    with address_space_limit():
        with pytest.raises(rivet.MemoryError) as ei:
            rivet.zeros((2**40,), "float32")
    msg = str(ei.value)
    assert "4398046511104 bytes" in msg and "float32" in msg and "[1099511627776]" in msg, msg
    # The process is fine afterwards.
    assert rivet.zeros((3,)).numpy().tolist() == [0.0, 0.0, 0.0]


def test_copy_of_huge_view_is_memory_error():
    buf = buffer()
    t = rivet.from_dlpack(Hostile((2**62,), (0,), buf=buf).capsule)
    with pytest.raises(rivet.MemoryError):
        t.__dlpack__(copy=True)
    t = rivet.from_dlpack(Hostile((2**40,), (0,), buf=buf).capsule)
    with address_space_limit():
        with pytest.raises(rivet.MemoryError):
            t.__dlpack__(copy=True)


@pytest.mark.parametrize("n", [2**40, 2**62])
def test_huge_outputs_of_a_call_are_memory_errors(target, n):
    """A call with only inputs allocates its outputs: a broadcast input of 2**40 or 2**62
    elements makes an output that cannot be had, which is a MemoryError, not an abort."""
    m = te.var("n")
    A = te.placeholder((m,), "float32", name="A")
    B = te.compute((m,), lambda i: A[i] + 1.0, name="B")
    f = rivet.build(rivet.create_schedule(B), [A, B], target=target, name="inc")["inc"]
    buf = buffer()
    before = bits(buf)
    h = Hostile((n,), (0,), buf=buf)
    with address_space_limit():
        with pytest.raises(rivet.MemoryError):
            f(h.capsule)
    gc.collect()
    assert h.deleted == 1
    assert_bits_equal(buf, before)


# --------------------------------------------------------------------------------------
# exceptions that are not failures to export
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_base_exceptions_from_dlpack_propagate(exc):
    class Producer:
        def __dlpack__(self, **kw):
            raise exc("stop")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(exc):
        rivet.from_dlpack(Producer())
    y = buffer()
    before = bits(y)
    with pytest.raises(exc):
        rivet.get_global_func("testing.axpy")(1.0, Producer(), y)
    assert_bits_equal(y, before)


def test_base_exception_from_old_style_producer_propagates():
    """The retry without max_version (for producers predating DLPack 1.0) lets it through too."""

    class Old:
        def __dlpack__(self, stream=None):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rivet.from_dlpack(Old())


def test_base_exception_from_dlpack_device_propagates():
    class Producer:
        def __init__(self):
            self.a = buffer()

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            raise KeyboardInterrupt

    try:
        t = rivet.from_dlpack(Producer())  # rivet need not ask for the device on the CPU
    except KeyboardInterrupt:
        return
    assert t.shape == (64,)


def test_ordinary_exceptions_still_become_dlpack_errors():
    class Producer:
        def __dlpack__(self, **kw):
            raise RuntimeError("no export today")

    with pytest.raises(rivet.DLPackError, match="no export today"):
        rivet.from_dlpack(Producer())


# --------------------------------------------------------------------------------------
# the type cache of the import path is bounded
# --------------------------------------------------------------------------------------


def test_dynamic_classes_do_not_grow_memory():
    a = buffer()

    def export(self, **kw):
        return a.__dlpack__(**kw)

    def churn(n):
        refs = []
        for i in range(n):
            cls = type(f"Dyn{i}", (), {"__dlpack__": export})
            assert rivet.from_dlpack(cls()).shape == (64,)
            refs.append(weakref.ref(cls))
            del cls
        gc.collect()
        return sum(r() is not None for r in refs)

    churn(2000)  # warm up allocator pools
    rss = rss_bytes()
    alive = churn(20000)
    grown = rss_bytes() - rss
    # The cache keeps at most 64 classes per thread alive; the rest were collected.
    assert alive <= 64, alive
    assert grown < 16 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"
    # Lookups still work (and are cached again) for an ordinary type afterwards.
    assert rivet.from_dlpack(a).shape == (64,)


# --------------------------------------------------------------------------------------
# torch tensors that require grad
# --------------------------------------------------------------------------------------


def test_requires_grad_output_is_refused_and_unchanged():
    axpy = rivet.get_global_func("testing.axpy")
    x = torch.rand(8)
    y = torch.rand(8, requires_grad=True)
    before = y.detach().clone()
    with pytest.raises(rivet.DLPackError) as ei:
        axpy(2.0, x, y)
    msg = str(ei.value)
    assert "argument 2 ('y')" in msg and "detach()" in msg and "requires_grad" in msg, msg
    assert torch.equal(y.detach(), before)
    assert y.grad is None and y.requires_grad
    # The documented way out works and writes.
    axpy(2.0, x, y.detach())
    torch.testing.assert_close(y.detach(), before + 2.0 * x)


def test_requires_grad_input_is_refused_like_torch_dlpack():
    axpy = rivet.get_global_func("testing.axpy")
    x = torch.rand(8, requires_grad=True)
    y = torch.rand(8)
    before = y.clone()
    with pytest.raises(rivet.DLPackError, match=r"argument 1 \('x'\).*detach\(\)"):
        axpy(2.0, x, y)
    assert torch.equal(y, before)
    with pytest.raises(BufferError):  # torch's own export refuses it the same way
        x.__dlpack__()
    with pytest.raises(rivet.DLPackError):
        rivet.from_dlpack(torch.nn.Parameter(torch.rand(3)))


def test_requires_grad_refused_through_wrapper():
    f = rivet.to_pytorch_func(rivet.get_global_func("testing.axpy"))
    y = torch.rand(4, requires_grad=True)
    before = y.detach().clone()
    with pytest.raises(rivet.DLPackError, match="detach"):
        f(1.0, torch.rand(4), y)
    assert torch.equal(y.detach(), before)


def test_requires_grad_read_through_overrides():
    """The grad check reads torch's C getter directly only when that is what the attribute
    lookup would do; a subclass overriding `requires_grad` or `__getattribute__` is asked the
    generic way, and its answer is honoured either way."""
    nop = rivet.get_global_func("testing.nop")

    class SaysGrad(torch.Tensor):
        @property
        def requires_grad(self):
            return True

    class Plain(torch.Tensor):
        pass

    class Hooked(torch.Tensor):
        def __getattribute__(self, name):
            if name == "requires_grad":
                return True
            return super().__getattribute__(name)

    with pytest.raises(rivet.DLPackError, match="SaysGrad requires grad"):
        nop(torch.rand(2).as_subclass(SaysGrad))
    with pytest.raises(rivet.DLPackError, match="Hooked requires grad"):
        nop(torch.rand(2).as_subclass(Hooked))
    nop(torch.rand(2).as_subclass(Plain))  # inherits TensorBase's getter: no grad
    with pytest.raises(rivet.DLPackError, match="Plain requires grad"):
        nop(torch.rand(2).as_subclass(Plain).requires_grad_())
    # A tensor whose flag changes between calls is read afresh on every call.
    t = torch.rand(3)
    nop(t)
    t.requires_grad_()
    with pytest.raises(rivet.DLPackError, match="requires grad"):
        nop(t)
    nop(t.detach())
