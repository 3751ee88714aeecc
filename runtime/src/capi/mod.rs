//! The C ABI of packed functions: how code in other languages (C, C++, an XLA FFI handler, a
//! `torch.library` kernel, `ctypes`) calls a rivet function with no Python in the loop.
//! tvm-ffi's model, kept small: one 16-byte tagged value (`RivetAny`), borrowed `DLTensor*`
//! arguments, owned `DLManagedTensorVersioned*` results, integer return codes and a
//! thread-local error channel. The header is `runtime/include/rivet/c_api.h`; the symbols are
//! exported by every library that links rivet-runtime (`rivet._native` included).
//!
//! This module holds the ABI's types (as the header declares them), the error channel, the
//! table of live function handles, the reading and writing of values, and the entry points
//! a caller uses (`RivetFunctionGetGlobal`, `RivetFunctionSetGlobal`, `RivetFunctionCall`,
//! `RivetFunctionFree`, `RivetAnyFree`, `RivetGetLastError`, `RivetAbiVersion`). Functions
//! crossing between two libraries (each with its own copy of rivet-runtime) live in:
//! - `import`: another library's function called by rivet (`RivetFunctionCreate[Typed]`),
//!   and the checking of everything it answers;
//! - `export`: a rivet function handed to another library (`export`, `library_init`).
//!
//! Invariants:
//! - No entry point unwinds into C: every body runs under `catch_unwind`; a panic is
//!   `RIVET_ERR_INTERNAL` with the panic's text.
//! - Return code 0 is success. Non-zero codes set the calling thread's last error (kind and
//!   message), readable with `RivetGetLastError` until the next failing rivet call on that
//!   thread. A successful call does not clear it (as errno).
//! - Arguments are borrowed for the duration of the call: rivet never frees or keeps a
//!   `DLTensor*`, string or function handle it was passed (a tensor argument's view dies
//!   with the call unless the function returns it, in which case the result aliases the
//!   caller's memory, which the caller keeps alive).
//! - Results are owned by the caller: a tensor is a fresh `DLManagedTensorVersioned*` (call its
//!   deleter, or `RivetAnyFree`), a function a fresh handle (`RivetFunctionFree`), a string a
//!   pointer into the calling thread's result buffer, valid until its next `RivetFunctionCall`.
//! - Every pointer, count and type code is checked before use; a tensor argument goes through
//!   the same validation as a DLPack import (`dlpack::view_of`). What cannot be checked is the
//!   caller's promise that a non-null pointer points at what its type code says.

pub mod export;
pub mod import;
#[cfg(test)]
mod tests;

use crate::dlpack;
use crate::error::{Error, Result};
use crate::function::Function;
use crate::registry;
use crate::value::Value;
use dlpack_rs::ffi::{DLManagedTensorVersioned, DLTensor};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `RivetAny::type_code` values (the header's `RivetTypeCode`).
pub const RIVET_NULL: i32 = 0;
pub const RIVET_INT: i32 = 1;
pub const RIVET_FLOAT: i32 = 2;
pub const RIVET_BOOL: i32 = 3;
/// A NUL-terminated UTF-8 string (`v_ptr`).
pub const RIVET_STR: i32 = 4;
/// Argument only: a borrowed `DLTensor*` the function may read and write.
pub const RIVET_DLTENSOR: i32 = 5;
/// Argument only: a borrowed `DLTensor*` the function may only read (a write is refused
/// with `ReadOnlyError`, as for a read-only DLPack import).
pub const RIVET_DLTENSOR_READONLY: i32 = 6;
/// Result only: an owned `DLManagedTensorVersioned*`.
pub const RIVET_MANAGED_TENSOR: i32 = 7;
/// A function handle (`RivetFunctionHandle`): borrowed as an argument, owned as a result.
pub const RIVET_FUNCTION: i32 = 8;

/// Return codes: 0, or the kind of error (also in the last error's kind string).
pub const RIVET_OK: i32 = 0;
/// A user error: bad arguments, shapes, dtypes, unknown names... (the kind string says which).
pub const RIVET_ERR_USER: i32 = -1;
/// A bug in rivet (or a panic caught at the boundary).
pub const RIVET_ERR_INTERNAL: i32 = -2;

/// Largest argument count accepted (a corrupt count must not make rivet read far).
pub const MAX_ARGS: i32 = 1 << 16;

/// The payload of a `RivetAny`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union RivetValue {
    pub v_int64: i64,
    pub v_float64: f64,
    pub v_ptr: *mut c_void,
}

/// A tagged value: 16 bytes, `type_code` first (tvm-ffi's `TVMFFIAny` layout idea).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RivetAny {
    pub type_code: i32,
    pub pad: i32,
    pub value: RivetValue,
}

impl RivetAny {
    pub const NULL: RivetAny = RivetAny {
        type_code: RIVET_NULL,
        pad: 0,
        value: RivetValue { v_int64: 0 },
    };
    pub fn int(v: i64) -> RivetAny {
        RivetAny {
            type_code: RIVET_INT,
            pad: 0,
            value: RivetValue { v_int64: v },
        }
    }
    pub fn float(v: f64) -> RivetAny {
        RivetAny {
            type_code: RIVET_FLOAT,
            pad: 0,
            value: RivetValue { v_float64: v },
        }
    }
    pub fn bool(b: bool) -> RivetAny {
        RivetAny {
            type_code: RIVET_BOOL,
            pad: 0,
            value: RivetValue { v_int64: b as i64 },
        }
    }
    pub fn ptr(type_code: i32, p: *mut c_void) -> RivetAny {
        RivetAny {
            type_code,
            pad: 0,
            value: RivetValue { v_ptr: p },
        }
    }
}

/// An opaque function handle: a boxed `Function` (one reference).
pub type RivetFunctionHandle = *mut c_void;

/// A packed function in C: `args` borrowed for the call, `*result` owned by the caller. On
/// failure: a non-zero code (`RIVET_ERR_USER` or `RIVET_ERR_INTERNAL`) and, optionally,
/// `*result` a `RIVET_STR` `"<Kind>: <message>"` valid until the callee's next call on the
/// thread (`Kind` a `rivet.error` class name).
pub type RivetPackedCFunc = unsafe extern "C" fn(
    resource: *mut c_void,
    args: *const RivetAny,
    num_args: i32,
    result: *mut RivetAny,
) -> i32;

/// Releases a packed function's `resource`.
pub type RivetDeleter = unsafe extern "C" fn(resource: *mut c_void);

/// A typed function's output rule in C: for `num_inputs` tensor inputs of shapes
/// `shapes[i][0..ndims[i]]` (borrowed for the call), `*result` a `RIVET_STR` JSON list of
/// `[shape, dtype]` pairs (`[[[2, 3], "float32"]]`), valid until the callee's next call on the
/// thread; on failure a non-zero code and `*result` a `RIVET_STR` `"<Kind>: <message>"`.
pub type RivetOutputShapesFunc = unsafe extern "C" fn(
    resource: *mut c_void,
    shapes: *const *const i64,
    ndims: *const i32,
    num_inputs: i32,
    result: *mut RivetAny,
) -> i32;

/// The C ABI minor version from which `RivetHostApi` has `function_create_typed`.
pub const TYPED_SINCE_MINOR: i32 = 1;

/// What a library's `rivet_library_init` receives from its host (`rivet.load_library`): the
/// host runtime's entry points, so the library registers its functions there.
#[repr(C)]
pub struct RivetHostApi {
    /// The host's `RivetAbiVersion()`: a library checks the major first.
    pub abi_version: i32,
    /// Whether a registration may replace a function of the same name.
    pub override_: i32,
    pub function_create: unsafe extern "C" fn(
        *const c_char,
        Option<RivetPackedCFunc>,
        *mut c_void,
        Option<RivetDeleter>,
        *mut RivetFunctionHandle,
    ) -> i32,
    pub set_global: unsafe extern "C" fn(*const c_char, RivetFunctionHandle, i32) -> i32,
    pub function_free: unsafe extern "C" fn(RivetFunctionHandle) -> i32,
    pub get_last_error: unsafe extern "C" fn(*mut *const c_char) -> *const c_char,
    /// `RivetFunctionCreateTyped`; present from C ABI 1.1 (`TYPED_SINCE_MINOR`): a library
    /// reads it only when the host's minor version says it is there.
    pub function_create_typed: unsafe extern "C" fn(
        *const c_char,
        Option<RivetPackedCFunc>,
        *mut c_void,
        Option<RivetDeleter>,
        *const c_char,
        Option<RivetOutputShapesFunc>,
        *mut RivetFunctionHandle,
    ) -> i32,
}

struct LastError {
    kind: CString,
    message: CString,
}

thread_local! {
    static LAST_ERROR: RefCell<LastError> = RefCell::new(LastError {
        kind: CString::default(),
        message: CString::default(),
    });
    /// The last error itself when it came from a foreign callee (a Python exception inside a
    /// callback): kind and message flatten it, so a caller that can re-raise the original
    /// object takes it back with `take_last_foreign_error`. Replaced by the next failure.
    static LAST_FOREIGN: RefCell<Option<Error>> = const { RefCell::new(None) };
    /// Storage of the last string result on this thread.
    static STR_RESULT: RefCell<CString> = RefCell::new(CString::default());
}

/// A C string of `s`, with interior NULs (which C cannot carry) shown as U+FFFD.
pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\u{fffd}")).expect("NULs replaced")
}

fn set_last_error(e: &Error) -> i32 {
    LAST_ERROR.with(|l| {
        let mut l = l.borrow_mut();
        l.kind = c_string(e.kind_name());
        l.message = c_string(&e.to_string());
    });
    let foreign = matches!(e, Error::Foreign(_)).then(|| e.clone());
    LAST_FOREIGN.with(|f| *f.borrow_mut() = foreign);
    error_code(e)
}

/// The return code of a failure: `RIVET_ERR_INTERNAL` for rivet's own bugs, else
/// `RIVET_ERR_USER`.
pub(crate) fn error_code(e: &Error) -> i32 {
    if matches!(e, Error::Internal(_)) {
        RIVET_ERR_INTERNAL
    } else {
        RIVET_ERR_USER
    }
}

/// The calling thread's last C ABI failure, if a foreign callee raised it (see
/// `LAST_FOREIGN`), taken: a host language that called through the C ABI re-raises its own
/// exception object instead of the flattened text (the torch bridge does).
pub fn take_last_foreign_error() -> Option<Error> {
    LAST_FOREIGN.with(|f| f.borrow_mut().take())
}

/// Runs `f` at the C boundary: errors become codes and the last error, panics too.
pub(crate) fn guard(f: impl FnOnce() -> Result<()>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => RIVET_OK,
        Ok(Err(e)) => set_last_error(&e),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_last_error(&Error::Internal(format!("panic at the C ABI: {what}")))
        }
    }
}

/// # Safety
/// `p` must be NULL or a NUL-terminated string.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::Argument(format!(
            "{what}: expected a string, got NULL"
        )));
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|e| Error::Argument(format!("{what}: expected UTF-8, got invalid bytes ({e})")))
}

/// The live function handles: a handle is a key of this table, never a pointer rivet
/// dereferences, so a freed, double-freed or made-up handle is an `ArgumentError` and not a
/// use after free (what tvm-ffi leaves to the caller's discipline, rivet checks: one read
/// lock and one lookup per call). Keys count up from `FIRST_HANDLE` in steps of 16 and are
/// never reused, so a freed handle stays refused for the life of the process.
static HANDLES: std::sync::LazyLock<std::sync::RwLock<HashMap<usize, Function>>> =
    std::sync::LazyLock::new(Default::default);
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(FIRST_HANDLE);
/// Far from NULL and from small integers a caller may pass by mistake.
const FIRST_HANDLE: usize = 0x5256_0000_0010;

fn handles_read() -> std::sync::RwLockReadGuard<'static, HashMap<usize, Function>> {
    // A panic while the table was held leaves it intact (inserts and removes are single
    // operations), so a poisoned lock is taken over, never propagated.
    HANDLES.read().unwrap_or_else(|e| e.into_inner())
}

fn handles_write() -> std::sync::RwLockWriteGuard<'static, HashMap<usize, Function>> {
    HANDLES.write().unwrap_or_else(|e| e.into_inner())
}

/// The function behind a handle (`what` names the argument in errors): NULL, freed or
/// unknown handles are `ArgumentError`s.
pub(crate) fn function_of(h: RivetFunctionHandle, what: &str) -> Result<Function> {
    if h.is_null() {
        return Err(Error::Argument(format!(
            "{what}: expected a function handle, got NULL"
        )));
    }
    handles_read().get(&(h as usize)).cloned().ok_or_else(|| {
        Error::Argument(format!(
            "{what}: expected a live function handle, got {h:p}, which is freed or was never one"
        ))
    })
}

/// A new handle of `f` (one table entry: free it with `RivetFunctionFree`).
pub(crate) fn new_handle(f: Function) -> RivetFunctionHandle {
    let key = NEXT_HANDLE.fetch_add(16, Ordering::Relaxed);
    handles_write().insert(key, f);
    key as RivetFunctionHandle
}

/// Removes a handle from the table (`what` names the argument in errors).
fn free_handle(h: RivetFunctionHandle, what: &str) -> Result<()> {
    match handles_write().remove(&(h as usize)) {
        Some(f) => {
            drop(f); // outside no lock: the write guard is a temporary of the match
            Ok(())
        }
        None => Err(Error::Argument(format!(
            "{what}: expected a live function handle, got {h:p}, which is freed or was never one"
        ))),
    }
}

/// The function behind a live handle, for Rust callers of the C ABI (tests, hosts written in
/// Rust): `None` for NULL, freed or unknown handles.
pub fn handle_function(h: RivetFunctionHandle) -> Option<Function> {
    function_of(h, "handle").ok()
}

/// How many function handles are live (tests check that calls leak none).
pub fn live_handles() -> usize {
    handles_read().len()
}

/// Reads one argument into a `Value` (tensors as views borrowed for the call).
///
/// # Safety
/// Pointers inside `a` must be valid for the type code, for the duration of the call.
pub(crate) unsafe fn value_of(a: &RivetAny, index: usize) -> Result<Value> {
    let what = || format!("argument {index}");
    // SAFETY: each arm reads the union member its type code names.
    unsafe {
        Ok(match a.type_code {
            RIVET_NULL => Value::Null,
            RIVET_INT => Value::Int(a.value.v_int64),
            RIVET_FLOAT => Value::Float(a.value.v_float64),
            RIVET_BOOL => Value::Bool(a.value.v_int64 != 0),
            RIVET_STR => Value::Str(str_arg(a.value.v_ptr as *const c_char, &what())?.into()),
            RIVET_DLTENSOR | RIVET_DLTENSOR_READONLY => {
                let p = a.value.v_ptr as *const DLTensor;
                if p.is_null() {
                    return Err(Error::Argument(format!(
                        "{}: expected a DLTensor*, got NULL",
                        what()
                    )));
                }
                // The view is borrowed: the caller keeps the memory alive for the call.
                dlpack::view_of(&*p, (), a.type_code == RIVET_DLTENSOR_READONLY)
                    .map_err(|e| e.context(&format!("{}: ", what())))?
                    .into()
            }
            RIVET_FUNCTION => Value::Function(function_of(a.value.v_ptr, &what())?),
            RIVET_MANAGED_TENSOR => {
                return Err(Error::Argument(format!(
                    "{}: type code {RIVET_MANAGED_TENSOR} (managed tensor) is for results; pass tensors as borrowed DLTensor* (type code {RIVET_DLTENSOR} or {RIVET_DLTENSOR_READONLY})",
                    what()
                )))
            }
            c => {
                return Err(Error::Argument(format!(
                    "{}: unknown type code {c}; expected 0..={RIVET_FUNCTION} (runtime/include/rivet/c_api.h)",
                    what()
                )))
            }
        })
    }
}

/// Reads `num_args` arguments at `args` (`what` names the entry point in errors): the count
/// checked against `MAX_ARGS`, NULL refused for a non-empty list.
///
/// # Safety
/// `args` must be NULL or point at `num_args` values whose pointers are valid for their type
/// codes during the call.
pub(crate) unsafe fn values_of(
    args: *const RivetAny,
    num_args: i32,
    what: &str,
) -> Result<Vec<Value>> {
    if !(0..=MAX_ARGS).contains(&num_args) {
        return Err(Error::Argument(format!(
            "{what}: argument 2 ('num_args'): expected 0..={MAX_ARGS}, got {num_args}"
        )));
    }
    if num_args > 0 && args.is_null() {
        return Err(Error::Argument(format!(
            "{what}: argument 1 ('args'): expected {num_args} values, got NULL"
        )));
    }
    let raw: &[RivetAny] = if num_args == 0 {
        &[]
    } else {
        // SAFETY: checked non-null; the caller's promise of `num_args` values.
        unsafe { std::slice::from_raw_parts(args, num_args as usize) }
    };
    let mut values = Vec::with_capacity(raw.len());
    for (i, a) in raw.iter().enumerate() {
        // SAFETY: the caller's promise on each value's pointers.
        values.push(unsafe { value_of(a, i) }?);
    }
    Ok(values)
}

/// Writes a result value as an owned `RivetAny`.
pub(crate) fn any_of(v: Value) -> Result<RivetAny> {
    Ok(match v {
        Value::Null => RivetAny::NULL,
        Value::Int(i) => RivetAny::int(i),
        Value::Float(x) => RivetAny::float(x),
        Value::Bool(b) => RivetAny::bool(b),
        Value::Str(s) => {
            let p = STR_RESULT.with(|r| {
                let mut r = r.borrow_mut();
                *r = c_string(&s);
                r.as_ptr() as *mut c_void
            });
            RivetAny::ptr(RIVET_STR, p)
        }
        Value::Tensor(t) => RivetAny::ptr(
            RIVET_MANAGED_TENSOR,
            dlpack::export_versioned(&t) as *mut c_void,
        ),
        Value::Function(f) => RivetAny::ptr(RIVET_FUNCTION, new_handle(f)),
        other => {
            return Err(Error::Argument(format!(
                "the function returned a {}, which the C ABI cannot carry (it carries none, int, float, bool, str, tensor and function results); pass the outputs as arguments instead",
                other.kind()
            )))
        }
    })
}

/// Looks up a registered function: `*out` receives a new handle (free it with
/// `RivetFunctionFree`).
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn RivetFunctionGetGlobal(
    name: *const c_char,
    out: *mut RivetFunctionHandle,
) -> i32 {
    guard(|| {
        if out.is_null() {
            return Err(Error::Argument(
                "RivetFunctionGetGlobal: argument 1 ('out'): expected a pointer, got NULL".into(),
            ));
        }
        // SAFETY: the caller's promise on `name`.
        let name = unsafe { str_arg(name, "RivetFunctionGetGlobal: argument 0 ('name')") }?;
        let f = registry::get(name)?;
        // SAFETY: checked non-null; the caller's promise that it is writable.
        unsafe { *out = new_handle(f) };
        Ok(())
    })
}

/// Registers `func` under `name` in this runtime's global registry (`override_` non-zero:
/// replace a function of that name). The handle stays the caller's.
///
/// # Safety
/// `name` a NUL-terminated string; `func` a live handle.
#[no_mangle]
pub unsafe extern "C" fn RivetFunctionSetGlobal(
    name: *const c_char,
    func: RivetFunctionHandle,
    override_: i32,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's promise on `name`.
        let name = unsafe { str_arg(name, "RivetFunctionSetGlobal: argument 0 ('name')") }?;
        let f = function_of(func, "RivetFunctionSetGlobal: argument 1")?;
        registry::register(name, f, override_ != 0)
    })
}

/// Releases a handle from `RivetFunctionGetGlobal`, `RivetFunctionCreate` or a function
/// result. NULL is a no-op; a freed or unknown handle is an `ArgumentError` (handles are
/// checked, never dereferenced).
///
/// # Safety
/// None beyond the C ABI's: any value is checked against the table of live handles.
#[no_mangle]
pub unsafe extern "C" fn RivetFunctionFree(h: RivetFunctionHandle) -> i32 {
    guard(|| {
        if h.is_null() {
            return Ok(());
        }
        free_handle(h, "RivetFunctionFree: argument 0 ('func')")
    })
}

/// Calls `func` on `num_args` arguments; `*result` receives the result (owned by the caller;
/// `RIVET_NULL` for functions that write their outputs in place). On error `*result` is
/// `RIVET_NULL` and the return code is non-zero.
///
/// # Safety
/// `func` is checked (a freed or unknown handle is an `ArgumentError`); `args` must point at `num_args` values (or be NULL when
/// `num_args` is 0) whose pointers are valid for their type codes during the call; `result`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn RivetFunctionCall(
    func: RivetFunctionHandle,
    args: *const RivetAny,
    num_args: i32,
    result: *mut RivetAny,
) -> i32 {
    guard(|| {
        if result.is_null() {
            return Err(Error::Argument(
                "RivetFunctionCall: argument 3 ('result'): expected a pointer, got NULL".into(),
            ));
        }
        // SAFETY: checked non-null; the caller's promise that it is writable.
        unsafe { *result = RivetAny::NULL };
        let f = function_of(func, "RivetFunctionCall: argument 0 ('func')")?;
        // SAFETY: the caller's promise on `args`.
        let values = unsafe { values_of(args, num_args, "RivetFunctionCall") }
            .map_err(|e| e.context(&format!("{}: ", f.name())))?;
        let out = any_of(f.call(&values)?)?;
        // SAFETY: as above.
        unsafe { *result = out };
        Ok(())
    })
}

/// Releases an owned result value (a managed tensor's deleter, a function handle) and sets it
/// to `RIVET_NULL`. Values that own nothing are only reset.
///
/// # Safety
/// `v` must be NULL or a result from `RivetFunctionCall`, released once.
#[no_mangle]
pub unsafe extern "C" fn RivetAnyFree(v: *mut RivetAny) -> i32 {
    guard(|| {
        if v.is_null() {
            return Ok(());
        }
        // SAFETY: the caller's promise: a result of ours.
        let a = unsafe { &mut *v };
        // SAFETY: the union member named by the type code.
        unsafe {
            match a.type_code {
                RIVET_MANAGED_TENSOR => {
                    let m = a.value.v_ptr as *mut DLManagedTensorVersioned;
                    if !m.is_null() {
                        if let Some(d) = (*m).deleter {
                            d(m)
                        }
                    }
                }
                // A NULL handle owns nothing, as for `RivetFunctionFree(NULL)`.
                RIVET_FUNCTION if a.value.v_ptr.is_null() => {}
                RIVET_FUNCTION => {
                    free_handle(a.value.v_ptr, "RivetAnyFree: the value's function handle")?
                }
                _ => {}
            }
        }
        *a = RivetAny::NULL;
        Ok(())
    })
}

/// The calling thread's last error: `*kind` (if non-NULL) receives its kind ("ArgumentError",
/// "ShapeError", ... the names of `rivet.error`'s classes); returns the message. Both point
/// into thread-local storage valid until the next failing rivet call on this thread. Empty
/// strings when no call has failed on this thread.
///
/// # Safety
/// `kind` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn RivetGetLastError(kind: *mut *const c_char) -> *const c_char {
    LAST_ERROR.with(|l| {
        let l = l.borrow();
        if !kind.is_null() {
            // SAFETY: the caller's promise. The CString's buffer lives in the thread-local,
            // which is replaced (not mutated) only by the next failing call.
            unsafe { *kind = l.kind.as_ptr() };
        }
        l.message.as_ptr()
    })
}

/// The ABI version (major << 16 | minor): callers check the major before anything else.
#[no_mangle]
pub extern "C" fn RivetAbiVersion() -> i32 {
    ABI_MAJOR << 16 | ABI_MINOR
}

pub const ABI_MAJOR: i32 = 1;
pub const ABI_MINOR: i32 = 1;
