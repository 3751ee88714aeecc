"""The C ABI of packed functions (runtime/include/rivet/c_api.h) from outside Rust: through
ctypes, and from C code compiled here against the header (so the header's struct layout is
checked against the library, not just the Rust side). Results are compared with numpy on
fresh random data; outputs are poisoned with NaN first."""

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

import rivet
from rivet import te

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER_DIR = os.path.join(ROOT, "runtime", "include")


from dlpack_abi import DLDataType, DLDevice, DLTensor  # noqa: E402


class _Value(ctypes.Union):
    _fields_ = [("v_int64", ctypes.c_int64), ("v_float64", ctypes.c_double), ("v_ptr", ctypes.c_void_p)]


class RivetAny(ctypes.Structure):
    _fields_ = [("type_code", ctypes.c_int32), ("pad", ctypes.c_int32), ("value", _Value)]


@pytest.fixture(scope="module")
def capi():
    lib = ctypes.CDLL(rivet._native.__file__)
    lib.RivetFunctionGetGlobal.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.RivetFunctionCall.argtypes = [
        ctypes.c_void_p, ctypes.POINTER(RivetAny), ctypes.c_int32, ctypes.POINTER(RivetAny)
    ]
    lib.RivetFunctionFree.argtypes = [ctypes.c_void_p]
    lib.RivetAnyFree.argtypes = [ctypes.POINTER(RivetAny)]
    lib.RivetGetLastError.argtypes = [ctypes.POINTER(ctypes.c_char_p)]
    lib.RivetGetLastError.restype = ctypes.c_char_p
    return lib


@pytest.fixture(scope="module")
def scale_add():
    """C[n, m] = A * B[m] + 1 (symbolic n, m), registered as capi_py.scale_add."""
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n, m), "float32", name="A")
    B = te.placeholder((m,), "float32", name="B")
    C = te.compute((n, m), lambda i, j: A[i, j] * B[j] + 1.0, name="C")
    f = rivet.build(rivet.create_schedule(C), [A, B, C], name="f")["f"]
    rivet.register_func("capi_py.scale_add", f, override=True)
    return f


def _dl(arr):
    shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
    strides = (ctypes.c_int64 * arr.ndim)(*[s // arr.itemsize for s in arr.strides])
    t = DLTensor(arr.ctypes.data, DLDevice(1, 0), arr.ndim, DLDataType(2, 32, 1), shape, strides, 0)
    t._keep = (shape, strides)
    return t


def test_ctypes_calls_a_compiled_kernel_in_place(capi, scale_add, rng):
    h = ctypes.c_void_p()
    assert capi.RivetFunctionGetGlobal(b"capi_py.scale_add", ctypes.byref(h)) == 0
    a = rng.standard_normal((4, 6)).astype(np.float32)[:, ::2]  # a strided view
    b = rng.standard_normal(3).astype(np.float32)
    c = np.full((4, 3), np.nan, np.float32)
    ta, tb, tc = _dl(a), _dl(b), _dl(c)
    args = (RivetAny * 3)()
    for i, (code, t) in enumerate([(6, ta), (6, tb), (5, tc)]):
        args[i].type_code = code
        args[i].value.v_ptr = ctypes.cast(ctypes.pointer(t), ctypes.c_void_p)
    out = RivetAny()
    assert capi.RivetFunctionCall(h, args, 3, ctypes.byref(out)) == 0, capi.RivetGetLastError(None)
    assert out.type_code == 0
    np.testing.assert_array_equal(c, a * b + 1)
    # Inputs only: the output comes back as an owned DLManagedTensorVersioned.
    assert capi.RivetFunctionCall(h, args, 2, ctypes.byref(out)) == 0
    assert out.type_code == 7
    assert capi.RivetAnyFree(ctypes.byref(out)) == 0 and out.type_code == 0
    # The read-only flag on the output argument is honoured, and the error names it.
    args[2].type_code = 6
    assert capi.RivetFunctionCall(h, args, 3, ctypes.byref(out)) == -1
    kind = ctypes.c_char_p()
    msg = capi.RivetGetLastError(ctypes.byref(kind))
    assert kind.value == b"ReadOnlyError" and b"'C'" in msg, (kind.value, msg)
    assert capi.RivetFunctionFree(h) == 0


C_SOURCE = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <rivet/c_api.h>

/* The ABI's entry points, handed over by the host (the library is already loaded there). */
typedef struct {
  int32_t (*version)(void);
  int32_t (*get_global)(const char*, RivetFunctionHandle*);
  int32_t (*call)(RivetFunctionHandle, const RivetAny*, int32_t, RivetAny*);
  int32_t (*free_func)(RivetFunctionHandle);
  int32_t (*free_any)(RivetAny*);
  const char* (*last_error)(const char**);
} Api;

/* c = a * b + 1 through rivet; returns 0, or a line saying what went wrong in `err`. */
int run(const Api* api, float* a, float* b, float* c, int64_t n, int64_t m, char* err) {
  if ((api->version() >> 16) != RIVET_ABI_MAJOR) { strcpy(err, "ABI major"); return 1; }
  if (sizeof(RivetAny) != 16) { strcpy(err, "sizeof(RivetAny)"); return 1; }
  RivetFunctionHandle f = NULL;
  if (api->get_global("capi_py.scale_add", &f) != RIVET_OK) {
    snprintf(err, 200, "get_global: %s", api->last_error(NULL)); return 1;
  }
  int64_t sa[2] = {n, m}, sb[1] = {m}, sc[2] = {n, m};
  DLTensor ta = {a, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, sa, NULL, 0};
  DLTensor tb = {b, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, sb, NULL, 0};
  DLTensor tc = {c, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, sc, NULL, 0};
  RivetAny args[3];
  args[0].type_code = RIVET_DLTENSOR_READONLY; args[0].value.v_ptr = &ta;
  args[1].type_code = RIVET_DLTENSOR_READONLY; args[1].value.v_ptr = &tb;
  args[2].type_code = RIVET_DLTENSOR;          args[2].value.v_ptr = &tc;
  RivetAny result;
  if (api->call(f, args, 3, &result) != RIVET_OK) {
    snprintf(err, 200, "call: %s", api->last_error(NULL)); api->free_func(f); return 1;
  }
  /* A wrong call: the error kind and message come back through the thread's last error. */
  args[2].type_code = 99;
  const char* kind = NULL;
  if (api->call(f, args, 3, &result) != RIVET_ERR_USER || result.type_code != RIVET_NULL) {
    strcpy(err, "type code 99 accepted"); api->free_func(f); return 1;
  }
  const char* msg = api->last_error(&kind);
  if (strcmp(kind, "ArgumentError") != 0 || !strstr(msg, "unknown type code 99")) {
    snprintf(err, 200, "error channel: %s: %s", kind, msg); api->free_func(f); return 1;
  }
  return api->free_func(f);
}
"""


def _dlpack_include(tmp_path):
    """A directory holding dlpack/dlpack.h: tvm-ffi's copy when installed (optional), else a
    shim over torch's `ATen/dlpack.h` (torch is a required test dependency)."""
    import importlib.util

    spec = importlib.util.find_spec("tvm_ffi")
    if spec and spec.origin:
        d = os.path.join(os.path.dirname(spec.origin), "include")
        if os.path.exists(os.path.join(d, "dlpack", "dlpack.h")):
            return [d]
    import torch

    inc = os.path.join(os.path.dirname(torch.__file__), "include")
    assert os.path.exists(os.path.join(inc, "ATen", "dlpack.h")), "torch ships no ATen/dlpack.h"
    (tmp_path / "shim" / "dlpack").mkdir(parents=True)
    (tmp_path / "shim" / "dlpack" / "dlpack.h").write_text("#include <ATen/dlpack.h>\n")
    return [str(tmp_path / "shim"), inc]


def test_c_code_compiled_against_the_header_runs_a_kernel(capi, scale_add, rng, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    # Rust's linker on Linux is `cc`: a machine that built rivet has one.
    assert cc, "no C compiler on PATH (rustc links with cc; install one)"
    incs = [x for d in _dlpack_include(tmp_path) for x in ("-I", d)]
    src = tmp_path / "user.c"
    src.write_text(C_SOURCE)
    so = tmp_path / "libuser.so"
    subprocess.run(
        [cc, "-std=c11", "-Wall", "-Werror", "-shared", "-fPIC", "-I", HEADER_DIR, *incs,
         str(src), "-o", str(so)],
        check=True,
    )
    user = ctypes.CDLL(str(so))

    def fp(name):
        return ctypes.cast(getattr(capi, name), ctypes.c_void_p).value

    api = (ctypes.c_void_p * 6)(*[fp(n) for n in [
        "RivetAbiVersion", "RivetFunctionGetGlobal", "RivetFunctionCall", "RivetFunctionFree",
        "RivetAnyFree", "RivetGetLastError"]])
    n, m = 5, 7
    a = rng.standard_normal((n, m)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    c = np.full((n, m), np.nan, np.float32)
    err = ctypes.create_string_buffer(256)
    f32p = ctypes.POINTER(ctypes.c_float)
    rc = user.run(api, a.ctypes.data_as(f32p), b.ctypes.data_as(f32p), c.ctypes.data_as(f32p),
                  ctypes.c_int64(n), ctypes.c_int64(m), err)
    assert rc == 0, err.value
    np.testing.assert_array_equal(c, a * b + 1)
