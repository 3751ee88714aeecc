"""Every ``rivet.kernels`` kernel with ``target="cuda"``, run on a device through a driver only
(the CUDA driver double in CI, a GPU when lent), at small ragged shapes, against numpy under the
tolerance policy (docs/tolerance.md, conftest.assert_matches). Inputs are uploaded with the
driver (tests/python/cuda_driver.py) and passed as hand-made kDLCUDA capsules; the output is
passed in poisoned, then allocated by rivet. The module skips where rivet sees no driver.
"""

import numpy as np
import pytest

import cuda_driver as cu
import rivet
from conftest import CUDA_ULPS, assert_matches
from cuda_driver import no_driver_misuse  # noqa: F401 (autouse: the double's misuse reports fail a test)

pytestmark = pytest.mark.cuda
N_DEVICES = cu.require_cuda()
SIZES = [1, 3, 17, 33]  # the double runs a CPU thread per CUDA thread: one block per row adds up


# ---- bfloat16 as numpy bit patterns ----------------------------------------------------------


def bf16_bits(x):
    """float32 values rounded to bfloat16 (nearest even), as uint16 bits (no NaN in the data)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


# ---- data and references ---------------------------------------------------------------------


def fresh(rng, shape, dtype):
    """Fresh random data (never zero): ints in +-[1, 1000), floats in +-[0.5, 1.5). Returns the
    array to upload (bfloat16 as bits) and its values as float64 (or int64)."""
    if dtype.startswith("int"):
        v = rng.integers(1, 1000, size=shape) * np.where(rng.random(size=shape) < 0.5, -1, 1)
        return v.astype(dtype), v.astype(np.int64)
    v = rng.uniform(0.5, 1.5, size=shape) * np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    if dtype == "bfloat16":
        bits = bf16_bits(v.astype(np.float32))
        return bits, bf16_values(bits).astype(np.float64)
    a = v.astype(dtype)
    return a, a.astype(np.float64)


def erf(x):
    import math

    return np.vectorize(math.erf)(x)


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


# name, kwargs, dtype, shapes(s) -> (input shapes, output shape), reference(values...) in
# float64 (int64 for integers), tolerance: (op, k(s), ulps) for assert_matches.
class Case:
    def __init__(self, id, name, dtype, shapes, ref, op, k=lambda s: 1, ulps=None, **kwargs):
        self.id, self.name, self.dtype, self.shapes, self.ref = id, name, dtype, shapes, ref
        self.op, self.k, self.ulps, self.kwargs = op, k, ulps, kwargs

    def build(self):
        return getattr(rivet.kernels, self.name)(self.dtype, target="cuda", **self.kwargs)


# Composite bounds: gelu and softmax amplify CUDA's math-library ulps (see test_cuda_kernels.py,
# COMPOSITE_ULPS, where the numbers are derived for inputs drawn from +-[0.5, 1.5)).
CASES = [
    Case("matmul", "matmul", "float32", lambda s: ([(s, 5), (5, 3)], (s, 3)), lambda a, b: a @ b, "contraction", k=lambda s: 5),
    Case("matmul-k", "matmul", "float32", lambda s: ([(3, s), (s, 4)], (3, 4)), lambda a, b: a @ b, "contraction", k=lambda s: s),
    Case("matmul-f64", "matmul", "float64", lambda s: ([(2, 3), (3, s)], (2, s)), lambda a, b: a @ b, "contraction", k=lambda s: 3),
    Case("batch_matmul", "batch_matmul", "float32", lambda s: ([(2, s, 3), (2, 3, 4)], (2, s, 4)), lambda a, b: a @ b, "contraction", k=lambda s: 3),
    Case("add-broadcast", "add", "float32", lambda s: ([(s, 1), (1, 5)], (s, 5)), np.add, "exact", a_shape=("n", 1), b_shape=(1, "m")),
    Case("add-f16", "add", "float16", lambda s: ([(s,), (s,)], (s,)), np.add, "exact", a_shape=("n",), b_shape=("n",)),
    Case("add-i32", "add", "int32", lambda s: ([(3, s), (3, s)], (3, s)), np.add, "exact", a_shape=("m", "n"), b_shape=("m", "n")),
    Case("mul-bf16", "mul", "bfloat16", lambda s: ([(s,), (s,)], (s,)), np.multiply, "exact", a_shape=("n",), b_shape=("n",)),
    Case("mul-f64", "mul", "float64", lambda s: ([(s, 2), (s, 2)], (s, 2)), np.multiply, "exact", a_shape=("m", "n"), b_shape=("m", "n")),
    Case("relu", "relu", "float32", lambda s: ([(s, 3)], (s, 3)), lambda x: np.maximum(x, 0.0), "exact", ndim=2),
    Case("gelu", "gelu", "float32", lambda s: ([(s, 3)], (s, 3)), lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2))), "composite", ulps=48, ndim=2),
    Case("gelu-f64", "gelu", "float64", lambda s: ([(2, s)], (2, s)), lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2))), "composite", ulps=48, ndim=2),
    Case("softmax-row", "softmax", "float32", lambda s: ([(3, s)], (3, s)), lambda x: softmax(x, -1), "composite", k=lambda s: s, ulps=16, ndim=2, axis=-1),
    Case("softmax-rows", "softmax", "float32", lambda s: ([(s, 4)], (s, 4)), lambda x: softmax(x, -1), "composite", k=lambda s: 4, ulps=16, ndim=2, axis=-1),
    Case("softmax-axis0-f64", "softmax", "float64", lambda s: ([(s, 2)], (s, 2)), lambda x: softmax(x, 0), "composite", k=lambda s: s, ulps=16, ndim=2, axis=0),
    Case("layer_norm", "layer_norm", "float32", lambda s: ([(3, s), (s,), (s,)], (3, s)), layer_norm, "composite", k=lambda s: s * (s + 4), ndim=2),
    Case("layer_norm-rows", "layer_norm", "float32", lambda s: ([(s, 6), (6,), (6,)], (s, 6)), layer_norm, "composite", k=lambda s: 60, ndim=2),
    Case("sum", "sum", "float32", lambda s: ([(3, s)], (3,)), lambda x: x.sum(axis=1), "reduction", k=lambda s: s, ndim=2, axis=1),
    Case("sum-i32", "sum", "int32", lambda s: ([(s, 3)], (s,)), lambda x: x.sum(axis=1), "exact", ndim=2, axis=1),
    Case("max-axis0", "max", "float32", lambda s: ([(s, 3)], (3,)), lambda x: x.max(axis=0), "exact", ndim=2, axis=0),
    Case("transpose", "transpose", "float32", lambda s: ([(s, 3)], (3, s)), lambda x: x.T, "exact", perm=(1, 0)),
    Case("transpose-3d-f16", "transpose", "float16", lambda s: ([(s, 2, 3)], (3, s, 2)), lambda x: x.transpose(2, 0, 1), "exact", perm=(2, 0, 1)),
]

# Every kernel of the library has a case here (a new kernel must add one).
assert {c.name for c in CASES} == set(rivet.kernels.__all__), set(rivet.kernels.__all__) ^ {c.name for c in CASES}


def terms_of(case, vals):
    """The per-output sum of |term| a rounding error is relative to (None: |want|)."""
    if case.op == "contraction":
        return np.abs(vals[0]) @ np.abs(vals[1])
    if case.op == "reduction":
        return np.abs(vals[0]).sum(axis=1)
    if case.name == "layer_norm":
        x, g, b = vals
        # x - mean cancels: its error is relative to |x| + mean |x|, scaled by 1 / std, then
        # by |gamma|; the variance's error feeds back through the (up to n) squared
        # deviations, which the k of these cases (n (n + 4) terms) covers.
        std = np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5)
        return (np.abs(x) + np.abs(x).mean(axis=-1, keepdims=True)) / std * np.abs(g) + np.abs(b)
    return None


def check(case, got, want, vals, s, how):
    """assert_matches against the float64 reference, rounded to the dtype (bfloat16 by bits)."""
    msg = f"{case.id} s={s} {how}"
    if case.dtype == "bfloat16":
        # One multiply of two bfloat16 values is exact in float32: rounding it once is the
        # correctly rounded product, which the kernel must give bit for bit.
        want_bits = bf16_bits(want.astype(np.float32))
        assert np.array_equal(got, want_bits), (msg, got[:8], want_bits[:8])
        return
    if case.dtype.startswith("int"):
        want = want.astype(case.dtype)  # wrapping, as the kernel's integer arithmetic
    ulps = None
    if case.op in ("transcendental", "composite"):
        # Against numpy's float64: the composite bound in ulps of the result, widened by CUDA's
        # math library distance (libdevice is not musl). assert_matches counts a composite
        # bound in units of u = eps / 2, half an ulp: hence the factor 2.
        ulps = 2 * ((case.ulps or 8) + CUDA_ULPS[case.dtype])
    assert_matches(got, want, op=case.op, against="numpy", k=case.k(s), terms=terms_of(case, vals), ulps=ulps, err_msg=msg)


@pytest.fixture(scope="module")
def built():
    """Each case's CUDA function, built once (the library also caches them in process)."""
    return {}


@pytest.mark.parametrize("s", SIZES)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_library_kernel_on_the_device_matches_numpy(rng, built, case, s):
    f = built.get(case.id)
    if f is None:
        f = built[case.id] = case.build()
    in_shapes, out_shape = case.shapes(s)
    data = [fresh(rng, sh, case.dtype) for sh in in_shapes]
    args = []
    for host, _ in data:
        buf = cu.DeviceBuffer.from_array(host)
        args.append(rivet.from_dlpack(cu.capsule(buf, host.shape, case.dtype)[0]))
    vals = [v for _, v in data]
    want = case.ref(*vals)
    out_dt = cu.np_dtype(case.dtype)
    n_out = int(np.prod(out_shape, dtype=np.int64))
    out = cu.DeviceBuffer(n_out * out_dt.itemsize).fill(0xFF)  # NaN / -1 poison
    f(*args, rivet.from_dlpack(cu.capsule(out, out_shape, case.dtype)[0]))
    check(case, out.read(out_shape, out_dt), want, vals, s, "given")
    r = f(*args)
    assert (r.device, r.shape, r.dtype) == ("cuda:0", tuple(out_shape), case.dtype)
    check(case, cu.download(r), want, vals, s, "allocated")
    # The inputs were only read.
    for (host, _), t in zip(data, args):
        np.testing.assert_array_equal(cu.download(t), host)


@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("matmul", "softmax-row", "add-broadcast")], ids=lambda c: c.id)
def test_library_kernels_run_on_the_second_device(rng, case):
    if N_DEVICES < 2:
        pytest.skip("one CUDA device (the double: RIVET_CUDA_DOUBLE='devices=sm_90,sm_80')")
    f = case.build()
    in_shapes, out_shape = case.shapes(17)
    data = [fresh(rng, sh, case.dtype) for sh in in_shapes]
    args = [cu.CAI(cu.DeviceBuffer.from_array(h, device=1), h.shape, case.dtype, version=2) for h, _ in data]
    r = f(*args)
    assert r.device == "cuda:1"
    vals = [v for _, v in data]
    check(case, cu.download(r), case.ref(*vals), vals, 17, "cuda:1")
