"""Attention written as its obvious stages (scores with the reduction inside an expression, row
max, exponentials, row sum, the normalised second contraction), built with no schedule for the
CPU, against torch's scaled_dot_product_attention in float64 on fresh random data, into a
NaN-poisoned output; float32 and float64, sizes that are no multiple of any tile, constant and
symbolic dims. The bound is derived in docs/tolerance.md ("Attention")."""

import math

import numpy as np
import pytest
import torch

import rivet
from rivet import te

from conftest import poison, random_array

EPS = {"float32": 2.0**-24, "float64": 2.0**-53}


def attention(heads, n, d, dtype, scale):
    Q = te.placeholder((heads, n, d), dtype, name="Q")
    K = te.placeholder((heads, n, d), dtype, name="K")
    V = te.placeholder((heads, n, d), dtype, name="V")
    c = te.reduce_axis((0, d), name="c")
    S = te.compute((heads, n, n), lambda h, i, j: te.sum(Q[h, i, c] * K[h, j, c], axis=c) * scale, name="S")
    j1 = te.reduce_axis((0, n), name="j1")
    M = te.compute((heads, n), lambda h, i: te.max(S[h, i, j1], axis=j1), name="M")
    E = te.compute((heads, n, n), lambda h, i, j: te.exp(S[h, i, j] - M[h, i]), name="E")
    j2 = te.reduce_axis((0, n), name="j2")
    L = te.compute((heads, n), lambda h, i: te.sum(E[h, i, j2], axis=j2), name="L")
    j3 = te.reduce_axis((0, n), name="j3")
    O = te.compute((heads, n, d), lambda h, i, e: te.sum(E[h, i, j3] / L[h, i] * V[h, j3, e], axis=j3), name="O")
    return [Q, K, V, O]


def bound(q, k, v, d, n, scale, dtype):
    """Per-element bound of docs/tolerance.md ("Attention"), in float64."""
    q, k, v = (x.double() for x in (q, k, v))
    a = scale * (q.abs() @ k.abs().transpose(-1, -2)).amax(-1, keepdim=True)  # |scores| bound, per row
    p = torch.softmax(scale * q @ k.transpose(-1, -2), -1)
    t = p @ v.abs()  # the terms of the second contraction
    return 2 * EPS[dtype] * (4 * (d + 3) * a + 2 * n + 8) * t


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 5), (3, 17, 8), (2, 97, 33), (4, 128, 64)])
def test_attention_matches_torch_sdpa(dtype, symbolic, shape, rng):
    heads, n, d = shape
    scale = 1.0 / math.sqrt(d)
    dims = (te.var("h"), te.var("n"), te.var("d")) if symbolic else shape
    args = attention(*dims, dtype, scale)
    mod = rivet.build(rivet.create_schedule(args[-1]), args, target="cpu", name="attn")
    ir = mod.get_source("ir")
    if symbolic or heads * n * n * d >= 32**3:
        # Both contractions take the packed GEMM path, and the scores are read where their GEMM
        # wrote them (no copy of them).
        assert ir.count("call gemm_update") == 2, ir
        assert "local S_sum0:" not in ir, ir
    npdt = np.float32 if dtype == "float32" else np.float64
    q, k, v = (torch.from_numpy(random_array(rng, shape, npdt)) for _ in range(3))
    o = poison(torch.empty(shape, dtype=q.dtype))
    mod["attn"](q, k, v, o)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert not torch.isnan(o).any()
    err = (o.double() - want).abs()
    tol = bound(q, k, v, d, n, scale, dtype)
    assert bool((err <= tol).all()), f"max err {err.max().item():.3g}, at most {(err / tol).max().item():.3g}x the bound"
