/* rivet's C ABI for packed functions (ABI 1.1; runtime/src/capi/ is the implementation and
 * its module headers the contract). Exported by every library that links rivet-runtime,
 * including the Python extension `rivet._native` (load it with dlopen / ctypes.CDLL after
 * `import rivet`, or link a Rust cdylib of your own against rivet-runtime).
 *
 *   RivetFunctionHandle f;
 *   if (RivetFunctionGetGlobal("my.kernel", &f) != 0) { puts(RivetGetLastError(NULL)); ... }
 *   RivetAny args[3] = {{RIVET_DLTENSOR_READONLY, 0, {.v_ptr = &a}},
 *                       {RIVET_DLTENSOR_READONLY, 0, {.v_ptr = &b}},
 *                       {RIVET_DLTENSOR, 0, {.v_ptr = &c}}};
 *   RivetAny result;
 *   int rc = RivetFunctionCall(f, args, 3, &result);   // 0: ok; result owned by the caller
 *   RivetAnyFree(&result);
 *   RivetFunctionFree(f);
 *
 * Rules: arguments are borrowed for the call (DLTensor memory stays the caller's); results
 * are owned by the caller (a tensor is a DLManagedTensorVersioned* whose deleter must run
 * once; RivetAnyFree does it). A non-zero return code sets the thread's last error (kind,
 * message), readable with RivetGetLastError until the next failing call on that thread.
 * Nothing unwinds across the boundary: a panic inside rivet is RIVET_ERR_INTERNAL.
 */
#ifndef RIVET_C_API_H_
#define RIVET_C_API_H_

#include <stdint.h>
/* DLPack, unless the includer already has it under its standard guard (torch's copy,
 * ATen/dlpack.h, is included by rivet's torch bridge; torch ships no dlpack/dlpack.h). */
#ifndef DLPACK_DLPACK_H_
#include <dlpack/dlpack.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define RIVET_ABI_MAJOR 1
#define RIVET_ABI_MINOR 1

typedef enum {
  RIVET_NULL = 0,
  RIVET_INT = 1,               /* v_int64 */
  RIVET_FLOAT = 2,             /* v_float64 */
  RIVET_BOOL = 3,              /* v_int64, 0 or 1 */
  RIVET_STR = 4,               /* v_ptr: NUL-terminated UTF-8 */
  RIVET_DLTENSOR = 5,          /* argument: borrowed DLTensor*, may be written */
  RIVET_DLTENSOR_READONLY = 6, /* argument: borrowed DLTensor*, read only */
  RIVET_MANAGED_TENSOR = 7,    /* result: owned DLManagedTensorVersioned* */
  RIVET_FUNCTION = 8,          /* RivetFunctionHandle: borrowed argument, owned result */
} RivetTypeCode;

enum { RIVET_OK = 0, RIVET_ERR_USER = -1, RIVET_ERR_INTERNAL = -2 };

typedef struct {
  int32_t type_code;
  int32_t pad;
  union {
    int64_t v_int64;
    double v_float64;
    void* v_ptr;
  } value;
} RivetAny;

typedef void* RivetFunctionHandle;

/* (RIVET_ABI_MAJOR << 16) | RIVET_ABI_MINOR of the loaded library. */
int32_t RivetAbiVersion(void);
/* *out receives a new handle to the function registered under `name`. */
int32_t RivetFunctionGetGlobal(const char* name, RivetFunctionHandle* out);
/* Releases a handle (NULL is a no-op). */
int32_t RivetFunctionFree(RivetFunctionHandle func);
/* Calls `func`; *result is RIVET_NULL on error or for functions that write in place. */
int32_t RivetFunctionCall(RivetFunctionHandle func, const RivetAny* args, int32_t num_args,
                          RivetAny* result);
/* Releases an owned result and resets it to RIVET_NULL. */
int32_t RivetAnyFree(RivetAny* value);
/* The thread's last error message; *kind (if non-NULL) its kind, e.g. "ShapeError". */
const char* RivetGetLastError(const char** kind);

/* Functions implemented elsewhere (another library, another language; docs/c_abi.md,
 * "Functions from another library"). A packed C function: args borrowed for the call,
 * *result owned by the caller; on failure a non-zero code and, optionally, *result a
 * RIVET_STR "<Kind>: <message>" valid until the callee's next call on the thread. */
typedef int32_t (*RivetPackedCFunc)(void* resource, const RivetAny* args, int32_t num_args,
                                    RivetAny* result);
typedef void (*RivetDeleter)(void* resource);
/* *out receives a new handle of a function that calls `func` with `resource`; `deleter`
 * (may be NULL) releases `resource` once, when the function is dropped. `func` must be
 * callable from any thread. Function values cannot cross (an argument or result is refused). */
int32_t RivetFunctionCreate(const char* name, RivetPackedCFunc func, void* resource,
                            RivetDeleter deleter, RivetFunctionHandle* out);
/* A typed function's output rule (ABI 1.1): for num_inputs tensor inputs of shapes
 * shapes[i][0..ndims[i]], *result a RIVET_STR JSON list of [shape, dtype] pairs
 * ([[[2, 3], "float32"]]) valid until the callee's next call on the thread; on failure a
 * non-zero code and *result a RIVET_STR "<Kind>: <message>". */
typedef int32_t (*RivetOutputShapesFunc)(void* resource, const int64_t* const* shapes,
                                         const int32_t* ndims, int32_t num_inputs,
                                         RivetAny* result);
/* RivetFunctionCreate for a typed function (ABI 1.1): `signature_json` (NULL: untyped) its
 * signature as JSON (docs/c_abi.md, "Typed functions"), `output_shapes` (may be NULL) its
 * output rule. A malformed signature is an ArgumentError; nothing is created then. */
int32_t RivetFunctionCreateTyped(const char* name, RivetPackedCFunc func, void* resource,
                                 RivetDeleter deleter, const char* signature_json,
                                 RivetOutputShapesFunc output_shapes, RivetFunctionHandle* out);
/* Registers `func` under `name` (override_ != 0: replace one of that name); the handle stays
 * the caller's. */
int32_t RivetFunctionSetGlobal(const char* name, RivetFunctionHandle func, int32_t override_);
/* What rivet.load_library passes to a library's entry point
 * `int32_t rivet_library_init(const RivetHostApi* host, char* err, size_t err_len)`. */
typedef struct {
  int32_t abi_version;
  int32_t override_;
  int32_t (*function_create)(const char*, RivetPackedCFunc, void*, RivetDeleter,
                             RivetFunctionHandle*);
  int32_t (*set_global)(const char*, RivetFunctionHandle, int32_t);
  int32_t (*function_free)(RivetFunctionHandle);
  const char* (*get_last_error)(const char**);
  /* From ABI 1.1 (read it only when the host's minor version is >= 1). */
  int32_t (*function_create_typed)(const char*, RivetPackedCFunc, void*, RivetDeleter,
                                   const char*, RivetOutputShapesFunc, RivetFunctionHandle*);
} RivetHostApi;

/* XLA FFI handler (typed FFI, api_version 1) running the registered function named by the
 * string attribute `rivet_function` on XLA's buffers: inputs, then results (README "JAX"). */
void* rivet_xla_ffi_handler(void* xla_ffi_call_frame);

#ifdef __cplusplus
}
#endif

#endif /* RIVET_C_API_H_ */
