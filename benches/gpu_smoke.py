"""The first 30 seconds of a GPU session: is rivet's CUDA path alive at all?

Prints, one line each: the devices rivet sees and their compute capability, the NVRTC rivet
compiles with, one device allocation, one launch of a compiled kernel checked against numpy,
and (with torch's CUDA) one DLPack round trip each way. On the CUDA driver double (no GPU) the
torch step says it was skipped. Exits non-zero on the first failure, with the reason; writes
its findings as JSON to --json.

    python benches/gpu_smoke.py [--json smoke.json]
"""

import argparse
import ctypes
import json
import sys

import numpy as np


class Driver:
    """The few driver calls the smoke test needs to move bytes (rivet has no copy API): the
    real libcuda.so.1 or the double, whichever the loader finds."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0), "cuInit")

    def check(self, rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")

    def bind(self, ordinal):
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        return dev

    def capability(self, ordinal):
        dev = self.bind(ordinal)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev), "compute capability major")
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev), "compute capability minor")
        return major.value, minor.value

    def upload(self, ptr, array):
        a = np.ascontiguousarray(array)
        self.check(self.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr), a.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(a.nbytes)), "cuMemcpyHtoD")

    def download(self, ptr, like):
        out = np.empty_like(like)
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        self.check(self.lib.cuMemcpyDtoH_v2(out.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(ptr), ctypes.c_size_t(out.nbytes)), "cuMemcpyDtoH")
        return out


def device_ptr(t):
    return t.__cuda_array_interface__["data"][0]


def build_add(rivet):
    """C[i] = A[i] + B[i], n symbolic, one thread per element in blocks of 128."""
    from rivet import te

    n = te.var("n")
    a = te.placeholder((n,), "float32", name="A")
    b = te.placeholder((n,), "float32", name="B")
    c = te.compute((n,), lambda i: a[i] + b[i], name="C")
    s = rivet.create_schedule(c)
    bx, tx = s[c].split(c.op.axis[0], factor=128)
    s[c].bind(bx, "blockIdx.x")
    s[c].bind(tx, "threadIdx.x")
    m = rivet.build(s, [a, b, c], target="cuda", name="smoke_add")
    return m, m["smoke_add"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    found = {}

    def say(key, value):
        found[key] = value
        print(f"{key}: {value}", flush=True)

    def done(rc):
        if args.json:
            with open(args.json, "w") as f:
                json.dump(found, f, indent=1)
        sys.exit(rc)

    try:
        import rivet

        n = rivet.cuda_device_count()
        drv = Driver()
        say("devices", [f"cuda:{i} sm_{''.join(map(str, drv.capability(i)))}" for i in range(n)])
        n_el = 1000
        m, f = build_add(rivet)
        try:
            ptx = m.get_source("ptx")
        except Exception:  # no PTX without NVRTC
            ptx = ""
        nvrtc = next((l.strip("/ ") for l in ptx.splitlines() if "compilation tools" in l.lower()), "no PTX header")
        say("nvrtc", nvrtc)
        drv.bind(0)
        x = rivet.empty((n_el,), dtype="float32", device="cuda")
        y = rivet.empty((n_el,), dtype="float32", device="cuda")
        say("allocation", f"2 x {n_el} float32 at {device_ptr(x):#x}, {device_ptr(y):#x}")
        rng = np.random.default_rng()
        hx, hy = rng.standard_normal(n_el).astype(np.float32), rng.standard_normal(n_el).astype(np.float32)
        drv.upload(device_ptr(x), hx)
        drv.upload(device_ptr(y), hy)
        z = f(x, y)
        got = drv.download(device_ptr(z), hx)
        if not np.array_equal(got, hx + hy):
            raise RuntimeError(f"launch: wrong result, {int((got != hx + hy).sum())} of {n_el} elements differ")
        say("launch", "add of 1000 float32 equals numpy bit for bit")
        try:
            import torch

            cuda = torch.cuda.is_available()
        except Exception as e:  # a CPU-only torch, or the double's refused runtime
            torch, cuda = None, False
            say("torch", f"not usable: {e}")
        if cuda:
            t = torch.randn(n_el, device="cuda")
            back = torch.from_dlpack(f(rivet.from_dlpack(t), rivet.from_dlpack(t)))
            torch.cuda.synchronize()
            if not torch.equal(back, t + t):
                raise RuntimeError("DLPack round trip with torch: wrong result")
            say("dlpack", f"torch {torch.__version__} -> rivet -> torch on {torch.cuda.get_device_name(0)}: equal")
        else:
            say("dlpack", "SKIPPED: torch has no CUDA here (the driver double, or no GPU)")
    except Exception as e:
        say("error", f"{type(e).__name__}: {e}")
        done(1)
    done(0)


if __name__ == "__main__":
    main()
