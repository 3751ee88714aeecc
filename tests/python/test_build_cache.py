"""The in-process build cache (docs/python_api.md, "Build caches"): building a program again,
the same schedule object or an equal program made anew, returns a working function from the
cache (counted by ``rivet._native._build_cache_info()``); a program that differs is built,
never served another's function; ``RIVET_BUILD_CACHE=0`` turns the cache off. Results checked
against torch on fresh random data with poisoned outputs, at sizes no tile divides."""

import os
import subprocess
import sys

import pytest
import torch

import rivet
from rivet import te
from rivet._native import _build_cache_info

from conftest import abs_mm, assert_matches, poison, random_array

CACHE_ON = os.environ.get("RIVET_BUILD_CACHE", "1") != "0" and "RIVET_DUMP" not in os.environ


def gemm(dtype, scale=None, name_n="n"):
    n = te.var(name_n)
    A = te.placeholder((n, n), dtype, name="A")
    B = te.placeholder((n, n), dtype, name="B")
    k = te.reduce_axis((0, n), name="k")
    if scale is None:
        C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    else:
        C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k) * scale, name="C")
    return rivet.create_schedule(C), [A, B, C]


def check(f, dtype, rng, scale=1.0):
    tdt = torch.float32 if dtype == "float32" else torch.float64
    for n in (1, 3, 17, 97):
        a = torch.from_numpy(random_array(rng, (n, n), dtype))
        b = torch.from_numpy(random_array(rng, (n, n), dtype))
        c = poison(torch.empty(n, n, dtype=tdt))
        f(a, b, c)
        want = (a.double() @ b.double()) * scale
        assert_matches(c, want, op="contraction", against="torch", k=n, terms=abs_mm(a, b) * abs(scale))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_building_twice_returns_a_working_function_from_the_cache(dtype, rng):
    s, args = gemm(dtype)
    name = f"cache_twice_{dtype}"
    first = rivet.build(s, args, target="cpu", name=name)
    before = _build_cache_info()
    again = rivet.build(s, args, target="cpu", name=name)
    s2, args2 = gemm(dtype)  # an equal program made anew: fresh variables and tensors
    equal = rivet.build(s2, args2, target="cpu", name=name)
    after = _build_cache_info()
    assert after["enabled"] == int(CACHE_ON)
    if CACHE_ON:
        assert after["hits"] - before["hits"] >= 2
        assert after["entries"] >= 1
    for m in (first, again, equal):
        check(m[name], dtype, rng)
    # The cached module is the same one: same IR and generated code.
    assert again.get_source("ir") == first.get_source("ir") == equal.get_source("ir")


def test_a_program_that_differs_is_built_not_served_from_the_cache(rng):
    name = "cache_differs"
    s1, a1 = gemm("float32", scale=2.0)
    s2, a2 = gemm("float32", scale=3.0)
    s3, a3 = gemm("float64", scale=2.0)
    m1 = rivet.build(s1, a1, target="cpu", name=name)
    before = _build_cache_info()
    m2 = rivet.build(s2, a2, target="cpu", name=name)
    m3 = rivet.build(s3, a3, target="cpu", name=name)
    m4 = rivet.build(s1, a1, target="cpu", name=name, checked=True)
    after = _build_cache_info()
    assert after["hits"] == before["hits"]
    check(m1[name], "float32", rng, 2.0)
    check(m2[name], "float32", rng, 3.0)
    check(m3[name], "float64", rng, 2.0)
    check(m4[name], "float32", rng, 2.0)


CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import rivet
from rivet import te
from rivet._native import _build_cache_info

def gemm():
    n = te.var("n")
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return rivet.create_schedule(C), [A, B, C]

rng = np.random.default_rng(7)
ok = True
for _ in range(3):
    s, args = gemm()
    f = rivet.build(s, args, target="cpu", name="mm")["mm"]
    a = rng.standard_normal((17, 17)).astype(np.float32)
    b = rng.standard_normal((17, 17)).astype(np.float32)
    c = np.full((17, 17), np.nan, np.float32)
    f(a, b, c)
    ok &= bool(np.allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4))
print(json.dumps(dict(_build_cache_info(), ok=ok)))
"""


@pytest.mark.parametrize("setting", ["0", "1", None])
def test_the_environment_turns_the_cache_off(setting):
    env = dict(os.environ)
    env.pop("RIVET_DUMP", None)
    if setting is None:
        env.pop("RIVET_BUILD_CACHE", None)
    else:
        env["RIVET_BUILD_CACHE"] = setting
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", CHILD, here], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import json

    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["ok"]
    if setting == "0":
        assert (info["enabled"], info["hits"], info["entries"]) == (0, 0, 0)
    else:
        assert (info["enabled"], info["hits"], info["entries"]) == (1, 2, 1)
