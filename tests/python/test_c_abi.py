"""The C ABI of packed functions (runtime/include/rivet/c_api.h) from outside Rust: through
ctypes, and from C code compiled here against the header (so the header's struct layout is
checked against the library, not just the Rust side). Results are compared with numpy on
fresh random data; outputs are poisoned with NaN first."""

import ctypes
import os

import numpy as np
import pytest

import rivet
from rivet import te

from conftest import HEADER_DIR, compile_c_library
from dlpack_abi import DLDataType, DLDevice, DLTensor


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


def test_the_package_ships_the_c_header_unchanged():
    """The torch bridge compiles against the package's copy of the header (an installed wheel
    has no runtime/ folder): it is runtime/include/rivet/c_api.h, byte for byte."""
    shipped = os.path.join(os.path.dirname(rivet.__file__), "include", "rivet", "c_api.h")
    with open(shipped, "rb") as a, open(os.path.join(HEADER_DIR, "rivet", "c_api.h"), "rb") as b:
        assert a.read() == b.read(), f"{shipped} is not runtime/include/rivet/c_api.h"


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


def test_c_code_compiled_against_the_header_runs_a_kernel(capi, scale_add, rng, tmp_path):
    so = compile_c_library(tmp_path, C_SOURCE, "user")
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


TYPED_LIBRARY = r"""
#include <stdio.h>
#include <string.h>
#include "rivet/c_api.h"

static const char* SIG =
  "{\"params\": ["
  "{\"name\": \"x\", \"kind\": {\"tensor\": {\"dtypes\": [\"float64\"], \"shape\": [{\"var\": \"n\"}],"
  " \"device\": \"host\", \"output\": false}}},"
  "{\"name\": \"y\", \"kind\": {\"tensor\": {\"dtypes\": [\"float64\"], \"shape\": [{\"var\": \"n\"}],"
  " \"device\": \"host\", \"output\": true}}}]}";
static char answer[256];

static int32_t fail(RivetAny* result, const char* text) {
  snprintf(answer, sizeof answer, "%s", text);
  result->type_code = RIVET_STR; result->value.v_ptr = answer;
  return RIVET_ERR_USER;
}

/* y = 2 x over float64 vectors of one length, any strides: the callee checks its arguments. */
static int32_t twice(void* resource, const RivetAny* args, int32_t n, RivetAny* result) {
  (void)resource;
  if (n != 2 || args[0].type_code < RIVET_DLTENSOR || args[0].type_code > RIVET_DLTENSOR_READONLY
      || args[1].type_code != RIVET_DLTENSOR)
    return fail(result, "ArgumentError: c_lib.twice takes (x, y), y writable");
  const DLTensor* x = args[0].value.v_ptr;
  const DLTensor* y = args[1].value.v_ptr;
  if (x->ndim != 1 || y->ndim != 1 || x->shape[0] != y->shape[0])
    return fail(result, "ShapeError: c_lib.twice: x and y must be vectors of one length");
  if (x->dtype.code != kDLFloat || x->dtype.bits != 64 || y->dtype.code != kDLFloat || y->dtype.bits != 64)
    return fail(result, "DTypeError: c_lib.twice: float64 only");
  int64_t sx = x->strides ? x->strides[0] : 1, sy = y->strides ? y->strides[0] : 1;
  const double* px = (const double*)((const char*)x->data + x->byte_offset);
  double* py = (double*)((char*)y->data + y->byte_offset);
  for (int64_t i = 0; i < x->shape[0]; i++) py[i * sy] = 2.0 * px[i * sx];
  result->type_code = RIVET_NULL;
  return RIVET_OK;
}

static int32_t twice_shapes(void* resource, const int64_t* const* shapes, const int32_t* ndims,
                            int32_t num_inputs, RivetAny* result) {
  (void)resource;
  if (num_inputs != 1 || ndims[0] != 1) return fail(result, "ShapeError: c_lib.twice: one vector");
  snprintf(answer, sizeof answer, "[[[%lld], \"float64\"]]", (long long)shapes[0][0]);
  result->type_code = RIVET_STR; result->value.v_ptr = answer;
  return RIVET_OK;
}

int32_t rivet_library_init(const RivetHostApi* host, char* err, size_t err_len) {
  if ((host->abi_version >> 16) != RIVET_ABI_MAJOR || (host->abi_version & 0xffff) < 1) {
    snprintf(err, err_len, "ArgumentError: needs a host of C ABI 1.1"); return RIVET_ERR_USER;
  }
  RivetFunctionHandle h = NULL;
  /* A malformed signature is refused and creates nothing. */
  if (host->function_create_typed("c_lib.bad", twice, NULL, NULL, "{\"params\": 7}", NULL, &h)
      != RIVET_ERR_USER || h != NULL) {
    snprintf(err, err_len, "InternalError: a malformed signature was accepted"); return RIVET_ERR_USER;
  }
  const char* kind = NULL;
  const char* msg = host->get_last_error(&kind);
  if (strcmp(kind, "ArgumentError") != 0 || !strstr(msg, "'c_lib.bad'")) {
    snprintf(err, err_len, "InternalError: unexpected error %s: %s", kind, msg); return RIVET_ERR_USER;
  }
  if (host->function_create_typed("c_lib.twice", twice, NULL, NULL, SIG, twice_shapes, &h) != RIVET_OK) {
    snprintf(err, err_len, "%s", host->get_last_error(NULL)); return RIVET_ERR_USER;
  }
  int32_t rc = host->set_global("c_lib.twice", h, host->override_);
  host->function_free(h);
  if (rc != RIVET_OK) snprintf(err, err_len, "RegistryError: %s", host->get_last_error(NULL));
  return rc;
}
"""


def test_a_c_library_hands_over_a_typed_function(rng, tmp_path):
    """A library written in C against the header (C ABI 1.1): rivet.load_library gives it the
    host table, it registers a typed function with a signature and an output rule (after a
    malformed signature is refused with an ArgumentError naming it), and Python sees the
    signature, asks the output rule, calls it on strided numpy data (poisoned output) and
    makes a torch op of it under torch.compile(fullgraph=True)."""
    torch = pytest.importorskip("torch")
    import rivet.torch

    so = compile_c_library(tmp_path, TYPED_LIBRARY, "typed")
    assert rivet.load_library(str(so), override=True) == ["c_lib.twice"]
    f = rivet.get_global_func("c_lib.twice")
    assert f.signature == "(x: Tensor[float64, (n)], y: Tensor[float64, (n)])", f.signature
    assert [p["output"] for p in f._params] == [False, True]
    assert f.output_shapes([[7]]) == [([7], "float64")]
    with pytest.raises(rivet.ShapeError, match="c_lib.twice: one vector"):
        f.output_shapes([[7, 2]])
    x = rng.standard_normal(20)[::2]
    y = np.full(10, np.nan)
    f(x, y)
    np.testing.assert_array_equal(y, 2 * x)
    with pytest.raises(rivet.ShapeError, match="one length"):
        f(x, np.zeros(3))
    op = rivet.torch.custom_op(f, "c_lib::twice", backward=None, override=True)
    g = torch.compile(lambda t: op(t) + 1, fullgraph=True)
    t = torch.from_numpy(rng.standard_normal(9))
    torch.testing.assert_close(g(t), 2 * t + 1)
