"""Convolutions written the obvious way in the DSL, built with no schedule: the default CPU
schedule (docs/default_schedules.md, rule 2) makes a convolution an implicit, packed GEMM (its
depth over the input channels and the window, the packs gathering the windows) and a
depthwise one a direct loop of output columns. Checked against torch.nn.functional.conv2d on
fresh random data with poisoned outputs, within the bound of a reassociated, fused sum."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rivet
from rivet import te

from conftest import assert_matches, poison, random_array


def conv2d(n, ci, co, hw, k, stride, pad, dtype="float32", depthwise=False, pad_stage=False):
    """out = conv2d(X, W, stride, padding=pad), NCHW; the padding as `if_then_else` in the
    body, or (pad_stage) a padded stage of its own."""
    X = te.placeholder((n, ci, hw, hw), dtype, name="X")
    W = te.placeholder((co, 1 if depthwise else ci, k, k), dtype, name="W")
    oh = (hw + 2 * pad - k) // stride + 1
    kh = te.reduce_axis((0, k), name="kh")
    kw = te.reduce_axis((0, k), name="kw")
    rc = te.reduce_axis((0, ci), name="rc")

    def inside(y, x):
        return te.all(y >= 0, y < hw, x >= 0, x < hw)

    if pad_stage and pad:
        Xp = te.compute(
            (n, ci, hw + 2 * pad, hw + 2 * pad),
            lambda b, c, y, x: te.if_then_else(inside(y - pad, x - pad), X[b, c, y - pad, x - pad], 0.0),
            name="Xpad",
        )

        def pixel(b, c, y, x):
            return Xp[b, c, y, x]

    else:

        def pixel(b, c, y, x):
            if not pad:
                return X[b, c, y, x]
            return te.if_then_else(inside(y - pad, x - pad), X[b, c, y - pad, x - pad], 0.0)

    if depthwise:
        body = lambda b, c, y, x: te.sum(
            pixel(b, c, y * stride + kh, x * stride + kw) * W[c, 0, kh, kw], axis=[kh, kw]
        )
    else:
        body = lambda b, c, y, x: te.sum(
            pixel(b, rc, y * stride + kh, x * stride + kw) * W[c, rc, kh, kw], axis=[rc, kh, kw]
        )
    out = te.compute((n, co, oh, oh), body, name="Conv")
    return X, W, out, oh


def check(n, ci, co, hw, k, stride, pad, rng, dtype=np.float32, depthwise=False, pad_stage=False, symbolic=False):
    nd = te.var("n") if symbolic else n
    dname = "float64" if dtype == np.float64 else "float32"
    X, W, out, oh = conv2d(nd, ci, co, hw, k, stride, pad, dname, depthwise, pad_stage)
    mod = rivet.build(rivet.create_schedule(out), [X, W, out], target="cpu", name="conv")
    ir = mod.get_source("ir")
    if depthwise:
        assert "A_packed" not in ir
    else:
        # The path taken shows in the printed IR: the packs, and the micro-kernel call.
        assert "Conv.A_packed" in ir and "call gemm_update" in ir, ir[:2000]
    x = torch.from_numpy(random_array(rng, (n, ci, hw, hw), dtype))
    w = torch.from_numpy(random_array(rng, (co, 1 if depthwise else ci, k, k), dtype))
    got = poison(torch.empty((n, co, oh, oh), dtype=x.dtype))
    mod["conv"](x, w, got)
    groups = ci if depthwise else 1
    want = F.conv2d(x.double(), w.double(), stride=stride, padding=pad, groups=groups)
    terms = F.conv2d(x.double().abs(), w.double().abs(), stride=stride, padding=pad, groups=groups)
    kk = (1 if depthwise else ci) * k * k
    assert_matches(got, want, op="contraction", against="torch", k=kk, terms=terms)


@pytest.mark.parametrize(
    "n,ci,co,hw,k,stride,pad",
    [
        (1, 3, 17, 9, 3, 1, 1),
        (2, 17, 5, 17, 3, 2, 1),
        (3, 16, 32, 14, 3, 1, 1),
        (1, 8, 24, 7, 3, 1, 1),
        (2, 32, 12, 8, 1, 1, 0),
        (1, 3, 16, 23, 7, 2, 3),
        (2, 5, 7, 5, 3, 2, 0),
        (1, 1, 1, 1, 1, 1, 0),
    ],
)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic-batch"])
def test_conv2d_default_matches_torch(n, ci, co, hw, k, stride, pad, symbolic, rng):
    if not symbolic and n * co * ci * k * k * ((hw + 2 * pad - k) // stride + 1) ** 2 < 32**3:
        # Too little work for the packed path with constant sizes (rule 2's threshold).
        symbolic = True
    check(n, ci, co, hw, k, stride, pad, rng, symbolic=symbolic)


def test_conv2d_padded_stage_and_float64(rng):
    check(2, 17, 9, 13, 3, 1, 1, rng, pad_stage=True)
    check(1, 6, 20, 11, 3, 2, 1, rng, dtype=np.float64)
    check(2, 4, 8, 9, 5, 1, 2, rng, dtype=np.float64, pad_stage=True, symbolic=True)


@pytest.mark.parametrize("hw,k,stride,pad", [(17, 3, 1, 1), (40, 3, 1, 1), (9, 3, 2, 1), (12, 5, 2, 2)])
def test_depthwise_default_matches_torch(hw, k, stride, pad, rng):
    check(2, 17, 17, hw, k, stride, pad, rng, depthwise=True)
    check(1, 3, 3, hw, k, stride, pad, rng, dtype=np.float64, depthwise=True, symbolic=True)


@pytest.mark.parametrize("hw,stride", [(56, 1), (28, 1), (97, 2), (33, 1)])
def test_guarded_rows_partitioned_match_torch(hw, stride, rng):
    """Padded image rows with ragged last panels of 32 (56, 28, 49 and 33 wide), and a depthwise
    convolution's rows, split into guarded edges and a vector interior (`xi.lo` in the IR;
    checked at stride 1, where the interior's loads are contiguous), against torch."""
    if stride == 1:
        X, W, out, oh = conv2d(1, 4, 6, hw, 3, stride, 1)
        ir = rivet.build(rivet.create_schedule(out), [X, W, out], target="cpu", name="conv").get_source("ir")
        assert ".lo = " in ir and "ramp" in ir, ir[:3000]
    check(1, 4, 6, hw, 3, stride, 1, rng)
    check(2, 3, 5, hw, 3, stride, 1, rng, dtype=np.float64, symbolic=True)
    check(1, 5, 5, hw, 3, stride, 1, rng, depthwise=True)
    check(2, 3, 3, hw, 3, stride, 1, rng, dtype=np.float64, depthwise=True, symbolic=True)
