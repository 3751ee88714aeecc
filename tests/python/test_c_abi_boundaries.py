"""The boundaries a hostile-input probe killed the process through, each run in a child
process (where the old behaviour was a crash, the child's death is the failure):

- a C library that keeps the ``RivetHostApi`` table ``rivet.load_library`` gave it and registers
  a function later (the table's entries were a ctypes thunk freed with the Python call);
- a library function that returns success with a NULL ``RIVET_STR`` (dereferenced), one that
  reports ``InternalError`` (surfaced as rivet's own ``InternalError``), one that returns a
  managed tensor with a failure code (its deleter never ran), an output rule claiming float64
  for a float32 output (believed);
- ``rivet.jax.ffi_func`` of a function whose output has rank 4 over one symbolic dim, jitted on
  65,536 elements: 2^64 output elements (XLA check-failed and aborted)."""

import os
import subprocess
import sys
import textwrap

import pytest


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import compile_c_library  # noqa: E402

LIBRARY = r"""
#include <rivet/c_api.h>
#include <stdio.h>
#include <stdlib.h>

static const RivetHostApi* kept;
static int deleted;

static int32_t seven(void* r, const RivetAny* a, int32_t n, RivetAny* out) {
  (void)r; (void)a; (void)n;
  out->type_code = RIVET_INT; out->value.v_int64 = 7; return RIVET_OK;
}
static int32_t null_string(void* r, const RivetAny* a, int32_t n, RivetAny* out) {
  (void)r; (void)a; (void)n;
  out->type_code = RIVET_STR; out->value.v_ptr = NULL; return RIVET_OK;
}
static int32_t says_internal(void* r, const RivetAny* a, int32_t n, RivetAny* out) {
  (void)r; (void)a; (void)n;
  out->type_code = RIVET_STR; out->value.v_ptr = "InternalError: my own bug"; return RIVET_ERR_USER;
}
static void del(DLManagedTensorVersioned* m) { deleted++; free(m->dl_tensor.shape); free(m); }
static int32_t tensor_and_failure(void* r, const RivetAny* a, int32_t n, RivetAny* out) {
  (void)r; (void)a; (void)n;
  static float x = 1;
  DLManagedTensorVersioned* m = calloc(1, sizeof *m);
  int64_t* shape = malloc(sizeof(int64_t)); shape[0] = 1;
  m->version.major = DLPACK_MAJOR_VERSION; m->deleter = del;
  m->dl_tensor.data = &x; m->dl_tensor.device.device_type = kDLCPU; m->dl_tensor.ndim = 1;
  m->dl_tensor.dtype.code = kDLFloat; m->dl_tensor.dtype.bits = 32; m->dl_tensor.dtype.lanes = 1;
  m->dl_tensor.shape = shape;
  out->type_code = RIVET_MANAGED_TENSOR; out->value.v_ptr = m; return RIVET_ERR_USER;
}
static int32_t wrong_dtype_rule(void* r, const int64_t* const* s, const int32_t* nd, int32_t n,
                                RivetAny* out) {
  (void)r; (void)s; (void)nd; (void)n;
  out->type_code = RIVET_STR; out->value.v_ptr = "[[[4], \"float64\"]]"; return RIVET_OK;
}
#define SIG "{\"params\": [" \
  "{\"name\": \"x\", \"kind\": {\"tensor\": {\"dtypes\": [\"float32\"], \"shape\": [{\"var\": \"n\"}], \"device\": \"host\", \"output\": false}}}," \
  "{\"name\": \"y\", \"kind\": {\"tensor\": {\"dtypes\": [\"float32\"], \"shape\": [{\"var\": \"n\"}], \"device\": \"host\", \"output\": true}}}]}"

static int32_t reg(const char* name, RivetPackedCFunc f, const char* sig, RivetOutputShapesFunc rule) {
  RivetFunctionHandle h = NULL;
  int32_t rc = sig ? kept->function_create_typed(name, f, NULL, NULL, sig, rule, &h)
                   : kept->function_create(name, f, NULL, NULL, &h);
  if (rc != RIVET_OK) return rc;
  rc = kept->set_global(name, h, 1);
  kept->function_free(h);
  return rc;
}

int32_t rivet_library_init(const RivetHostApi* host, char* err, size_t err_len) {
  kept = host;   /* kept, as a C programmer would: nothing says it expires */
  int32_t rc = reg("boundary.null_string", null_string, NULL, NULL);
  if (!rc) rc = reg("boundary.says_internal", says_internal, NULL, NULL);
  if (!rc) rc = reg("boundary.tensor_and_failure", tensor_and_failure, NULL, NULL);
  if (!rc) rc = reg("boundary.wrong_dtype", seven, SIG, wrong_dtype_rule);
  if (rc) snprintf(err, err_len, "%s", host->get_last_error(NULL));
  return rc;
}

/* Called from Python after load_library returned, through the kept table. */
int32_t register_later(void) { return reg("boundary.later", seven, NULL, NULL); }
int32_t deleted_count(void) { return deleted; }
"""

PRELUDE = r"""
import ctypes, gc, sys
import rivet
names = rivet.load_library(sys.argv[1])
assert sorted(names) == ["boundary.null_string", "boundary.says_internal",
                         "boundary.tensor_and_failure", "boundary.wrong_dtype"], names
lib = ctypes.CDLL(sys.argv[1])
get = rivet.get_global_func

def expect(cls, text, fn, *args):
    try:
        fn(*args)
    except rivet.Error as e:
        assert type(e) is cls, (type(e), e)
        assert text in str(e), str(e)
    else:
        raise AssertionError(f"no error from {fn}")
"""

# One child per defect, so each is seen failing on its own before its fix.
CHILDREN = {
    "kept_host_table": r"""
gc.collect()
# Python work between the load and the later registration reuses freed memory.
junk = [ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 1) for _ in range(200)]
assert lib.register_later() == 0
assert get("boundary.later")() == 7
""",
    "null_string_result": r"""
expect(rivet.LibraryError, "pointer is NULL", get("boundary.null_string"))
""",
    "callee_internal_error": r"""
expect(rivet.LibraryError, "my own bug", get("boundary.says_internal"))
""",
    "tensor_with_failure_code": r"""
before = lib.deleted_count()
expect(rivet.ArgumentError, "failed with code", get("boundary.tensor_and_failure"))
assert lib.deleted_count() == before + 1, "the deleter of a tensor returned with a failure ran"
""",
    "rule_breaks_signature": r"""
expect(rivet.LibraryError, "float64", get("boundary.wrong_dtype").output_shapes, [[4]])
""",
}


def _run(args, timeout=300):
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (
        f"child exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    )


@pytest.fixture(scope="module")
def boundary_library(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("boundary")
    return compile_c_library(tmp_path, LIBRARY, "boundary")


@pytest.mark.parametrize("case", sorted(CHILDREN))
def test_a_library_breaking_the_c_abi_contract_gets_a_typed_error(boundary_library, tmp_path, case):
    child = tmp_path / f"{case}.py"
    child.write_text(PRELUDE + CHILDREN[case] + 'print("ok")\n')
    _run([str(child), str(boundary_library)])


JAX_CHILD = textwrap.dedent(
    r"""
    import jax, jax.numpy as jnp
    import rivet, rivet.jax
    from rivet import te
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n, n, n, n), lambda i, j, k, l: A[i], name="C")
    f = rivet.build(rivet.create_schedule(C), [A, C], name="rank4")["rank4"]
    g = rivet.jax.ffi_func(f)
    small = jax.jit(g)(jnp.ones(3, jnp.float32))
    assert small.shape == (3, 3, 3, 3)
    for call in (lambda x: jax.jit(g)(x), lambda x: f(x.__array__())):
        try:
            call(jnp.ones(65536, jnp.float32))
        except rivet.MemoryError as e:
            assert "65536" in str(e), str(e)
        else:
            raise AssertionError("2^64 output elements were not refused")
    print("ok")
    """
)


def test_jax_ffi_func_refuses_an_output_of_two_to_the_64_elements(tmp_path):
    pytest.importorskip("jax")
    child = tmp_path / "jax_child.py"
    child.write_text(JAX_CHILD)
    _run([str(child)])
