"""Checks the modules the Rust examples in rivet/examples/ saved (`cargo run -p rivet --example
NAME -- DIR/NAME.rivet`) from Python against torch, on fresh random data, outputs NaN-poisoned
first: the user's workflow of defining kernels in Rust and verifying them in Python.

    python rivet/examples/check.py DIR              # checks every example's module found in DIR
    python rivet/examples/check.py DIR cuda SUFFIX  # modules NAME.SUFFIX.rivet built for the GPU,
                                                    # on torch CUDA tensors (TF32 off)
"""

import os
import sys

import numpy as np
import torch

import rivet

F = torch.nn.functional
TOL = dict(rtol=2e-5, atol=2e-5)


DEVICE = "cpu"


def randn(rng, *shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(DEVICE)


def poisoned(*shape):
    return torch.full(shape, float("nan"), dtype=torch.float32, device=DEVICE)


def check_gemm(f, rng):
    for n in (1, 7, 64):
        a, b, c = randn(rng, n, n), randn(rng, n, n), poisoned(n, n)
        f(a, b, c)
        torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)


def check_softmax(f, rng):
    for n, m in ((1, 1), (3, 17), (8, 1000)):
        x, y = randn(rng, n, m) * 4, poisoned(n, m)
        f(x, y)
        torch.testing.assert_close(y, torch.softmax(x, -1), **TOL)


def check_conv2d(f, rng):
    for (n, c, h, w, o, kh, kw) in ((1, 1, 3, 3, 1, 1, 1), (2, 3, 9, 7, 4, 3, 2)):
        x, wt = randn(rng, n, c, h, w), randn(rng, o, c, kh, kw)
        y = poisoned(n, o, h - kh + 1, w - kw + 1)
        f(x, wt, y)
        torch.testing.assert_close(y, F.conv2d(x, wt), rtol=1e-4, atol=1e-4)


def check_gemm_bias_gelu(f, rng):
    for n, k, m in ((1, 1, 1), (5, 13, 9), (33, 64, 40)):
        a, b, bias = randn(rng, n, k), randn(rng, k, m), randn(rng, m)
        y = poisoned(n, m)
        f(a, b, bias, y)
        torch.testing.assert_close(y, F.gelu(a @ b + bias), rtol=1e-4, atol=1e-4)


CHECKS = {
    "gemm": ("mm", check_gemm),
    "softmax": ("softmax", check_softmax),
    "conv2d": ("conv2d", check_conv2d),
    "gemm_bias_gelu": ("gemm_bias_gelu", check_gemm_bias_gelu),
}


def main(directory, device="cpu", suffix="", only=None):
    global DEVICE
    DEVICE = device
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng()
    checked = []
    for example, (func, check) in CHECKS.items():
        if only is not None and example not in only:
            continue
        path = os.path.join(directory, f"{example}{suffix}.rivet")
        f = rivet.to_pytorch_func(rivet.load_module(path)[func])
        check(f, rng)
        checked.append(example)
        print(f"{example}: {func} from {path} matches torch on {device}")
    return checked


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else ".", *(args[1:2] or ["cpu"]), *(["." + args[2]] if len(args) > 2 else []))
