"""The tolerance policy's implementation (conftest.assert_matches, docs/tolerance.md) refuses
what it must: a helper that passes everything would make every comparison test vacuous."""

import numpy as np
import pytest
import torch

from conftest import BACKENDS, assert_matches, backend_names, backend_params, tolerance, ulp_distance


def test_ulp_distance_counts_representable_numbers():
    one = np.float32(1.0)
    up = np.nextafter(one, np.float32(2), dtype=np.float32)
    assert ulp_distance(np.array([one]), np.array([up]))[0] == 1
    down = np.nextafter(one, np.float32(0), dtype=np.float32)
    assert ulp_distance(np.array([up]), np.array([down]))[0] == 2
    # Across zero: -0.0 and 0.0 are the same point; the smallest subnormals are 1 apart.
    tiny = np.float64(5e-324)
    assert ulp_distance(np.array([-0.0]), np.array([0.0]))[0] == 0
    assert ulp_distance(np.array([-tiny]), np.array([tiny]))[0] == 2
    # float64 distances are exact (not rounded through float64 arithmetic).
    x = np.float64(1e300)
    assert ulp_distance(np.array([x]), np.array([np.nextafter(x, np.inf)]))[0] == 1
    nan = np.float32(np.nan)
    assert ulp_distance(np.array([nan]), np.array([nan]))[0] == 0
    assert ulp_distance(np.array([nan]), np.array([one]))[0] == np.inf
    # bfloat16 through its bit pattern.
    b = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert list(ulp_distance(b, b + torch.tensor([2**-7, 0], dtype=torch.bfloat16))) == [1, 0]


def test_exact_refuses_one_ulp_and_accepts_signed_zero_and_nan():
    a = np.array([1.0, -0.0, np.nan], np.float32)
    assert_matches(a, np.array([1.0, 0.0, np.nan], np.float32), op="exact")
    b = a.copy()
    b[0] = np.nextafter(b[0], np.float32(2))
    with pytest.raises(AssertionError, match="not bit-exact"):
        assert_matches(b, a, op="exact")
    with pytest.raises(AssertionError):
        assert_matches(np.array([1, 2], np.int32), np.array([1, 3], np.int32), op="exact")
    # A float64 reference is rounded once to the dtype: exact for one correctly rounded op.
    x, y = np.float32(0.1), np.float32(0.7)
    assert_matches(np.array([x * y]), np.array([np.float64(x) * np.float64(y)]), op="exact")


def test_transcendental_bound_in_ulps():
    w = np.linspace(0.5, 2, 50).astype(np.float32)
    g = np.nextafter(np.nextafter(w, np.float32(9)), np.float32(9))  # 2 ulp up
    assert_matches(g, w, op="transcendental", against="numpy")  # float32 reference: 2 + 4 ulp
    assert_matches(g, w.astype(np.float64), op="transcendental", against="numpy")  # 2 ulp
    g3 = np.nextafter(g, np.float32(9))
    with pytest.raises(AssertionError, match="ulp apart"):
        assert_matches(g3, w.astype(np.float64), op="transcendental", against="numpy")


def test_reduction_bound_is_relative_to_the_terms():
    k = 100
    terms = np.full(3, 50.0)
    u = 2.0**-24
    want = np.array([1.0, 2.0, 3.0])
    inside = (want + 0.9 * k * u * terms).astype(np.float32)
    assert_matches(inside, want, op="reduction", k=k, terms=terms)
    outside = (want + 1.5 * k * u * terms).astype(np.float32)
    with pytest.raises(AssertionError, match="beyond reduction bound"):
        assert_matches(outside, want, op="reduction", k=k, terms=terms)


def test_backend_pairs():
    for name in [p.values[0] for p in backend_params(host_memory=True)]:
        for op in ("exact", "transcendental", "reduction", "contraction", "composite"):
            assert tolerance(op, "interp", "float32", backend=name) == ("exact", 0)
    # CUDA: exact but for the math library (provisional bounds, docs/tolerance.md).
    assert tolerance("reduction", "interp", "float32", backend="cuda") == ("exact", 0)
    assert tolerance("transcendental", "interp", "float32", backend="cuda")[0] == "ulps"
    with pytest.raises(AssertionError, match="no tolerance policy"):
        tolerance("exact", "interp", "float32", backend="tpu")


def test_backends_are_defined_once():
    names = backend_names()
    assert names[0] == "interp" and len(set(names)) == len(names) == len(BACKENDS)
    assert [p.id for p in BACKENDS] == names
    assert set(backend_names(runnable=True)) <= set(names)
    assert [p.values[0] for p in backend_params(gpu_schedules=True)] == ["interp", "cuda"]
    import rivet

    assert names == rivet.targets()
