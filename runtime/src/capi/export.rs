//! Rivet functions seen by another library: a `Function` handed out as a packed C function
//! (`export`, `export_types`) for another runtime's `RivetFunctionCreate[Typed]`, and the
//! body of a library's `rivet_library_init` (`library_init`, `register_in_host`), which is how
//! a Rust crate built as a `cdylib` hands its kernels to Python in one step
//! (`rivet.load_library(path)`, docs/c_abi.md "Functions from another library"). The other
//! direction, another library's function called by rivet, is `import.rs`.
//!
//! The exported function is the boxed `Function` as the `resource` of `exported_call`, which
//! reads its arguments as `RivetFunctionCall` does; an output rule is answered by
//! `exported_output_shapes` as JSON.
//!
//! Invariants:
//! - Only the C ABI crosses: `RivetAny` values, borrowed `DLTensor*`s and owned
//!   `DLManagedTensorVersioned*`s, never Rust types.
//! - Nothing unwinds into the host: every callback runs under `catch_unwind`, and a failure is
//!   a non-zero code with `*result` a `RIVET_STR` `"<Kind>: <message>"`, valid until the next
//!   call on that thread (`EXPORT_TEXT`).
//! - The boxed `Function` is released exactly once, by `exported_free`, when the host drops its
//!   function (or here, when the host refused to create it).
//! - `function_create_typed` is read from a host's table only when the host's C ABI minor
//!   version says it is there (`TYPED_SINCE_MINOR`).

use super::{
    any_of, c_string, error_code, values_of, RivetAny, RivetDeleter, RivetFunctionHandle,
    RivetHostApi, RivetOutputShapesFunc, RivetPackedCFunc, MAX_ARGS, RIVET_ERR_USER, RIVET_OK,
    RIVET_STR, TYPED_SINCE_MINOR,
};
use crate::error::{Error, Result};
use crate::function::Function;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    /// The callee side's last text (a failure, or an output rule's answer), handed out as a
    /// `RIVET_STR` result valid until the next call on this thread.
    static EXPORT_TEXT: RefCell<CString> = RefCell::new(CString::default());
}

/// `text` kept in this thread's `EXPORT_TEXT`, as a `RIVET_STR` value pointing there.
fn export_text(text: &str) -> RivetAny {
    let p = EXPORT_TEXT.with(|c| {
        let mut c = c.borrow_mut();
        *c = c_string(text);
        c.as_ptr() as *mut c_void
    });
    RivetAny::ptr(RIVET_STR, p)
}

/// `f` as a packed C function for another runtime's `RivetFunctionCreate`: the function
/// pointer, the resource (`f`, boxed) and its deleter.
pub fn export(f: Function) -> (RivetPackedCFunc, *mut c_void, RivetDeleter) {
    (
        exported_call,
        Box::into_raw(Box::new(f)) as *mut c_void,
        exported_free,
    )
}

/// What `RivetFunctionCreateTyped` takes besides `export`'s three: the signature's JSON and
/// the output rule, where `f` has them.
pub fn export_types(f: &Function) -> Result<(Option<CString>, Option<RivetOutputShapesFunc>)> {
    let Some(sig) = f.signature() else {
        return Ok((None, None));
    };
    let json = serde_json::to_string(sig)
        .map_err(|e| Error::Internal(format!("{}: signature to JSON: {e}", f.name())))?;
    let json = CString::new(json)
        .map_err(|_| Error::Argument(format!("{}: a NUL byte in its signature", f.name())))?;
    let rule = f
        .has_output_rule()
        .then_some(exported_output_shapes as RivetOutputShapesFunc);
    Ok((Some(json), rule))
}

unsafe extern "C" fn exported_output_shapes(
    resource: *mut c_void,
    shapes: *const *const i64,
    ndims: *const i32,
    num_inputs: i32,
    result: *mut RivetAny,
) -> i32 {
    let run = || -> Result<RivetAny> {
        // SAFETY: `export` made `resource` a boxed Function, alive until `exported_free`.
        let f = unsafe { &*(resource as *const Function) };
        let n = usize::try_from(num_inputs)
            .ok()
            .filter(|n| *n <= MAX_ARGS as usize)
            .ok_or_else(|| Error::Argument(format!("{}: {num_inputs} input shapes", f.name())))?;
        if n > 0 && (shapes.is_null() || ndims.is_null()) {
            return Err(Error::Argument(format!(
                "{}: NULL shapes for {n} inputs",
                f.name()
            )));
        }
        let mut refs: Vec<&[i64]> = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: the host's promise: `n` entries in each array.
            let (p, d) = unsafe { (*shapes.add(i), *ndims.add(i)) };
            let d = usize::try_from(d)
                .ok()
                .filter(|d| *d <= crate::layout::MAX_NDIM)
                .ok_or_else(|| Error::Argument(format!("{}: input {i} has {d} dims", f.name())))?;
            if d > 0 && p.is_null() {
                return Err(Error::Argument(format!(
                    "{}: input {i}'s shape is NULL",
                    f.name()
                )));
            }
            refs.push(if d == 0 {
                &[]
            } else {
                // SAFETY: the host's promise: `d` dims at `p`, borrowed for the call.
                unsafe { std::slice::from_raw_parts(p, d) }
            });
        }
        let outs = f.output_shapes(&refs, None)?;
        let json = serde_json::to_string(&outs)
            .map_err(|e| Error::Internal(format!("{}: output shapes to JSON: {e}", f.name())))?;
        Ok(export_text(&json))
    };
    // SAFETY: the host's promise that `result` is NULL or writable.
    unsafe { answer(result, "output rule", run) }
}

/// The callee side's ending of every call: `run` under `catch_unwind`, its value written to
/// `*result` with `RIVET_OK`, or its error as a `RIVET_STR` `"<Kind>: <message>"` with the
/// error's code (`what` names a panic's origin).
///
/// # Safety
/// `result` NULL (the call fails with `RIVET_ERR_USER`, nothing written) or writable.
unsafe fn answer(result: *mut RivetAny, what: &str, run: impl FnOnce() -> Result<RivetAny>) -> i32 {
    let outcome = catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|_| {
        Err(Error::Internal(format!(
            "a panic in an exported rivet function's {what}"
        )))
    });
    if result.is_null() {
        return RIVET_ERR_USER;
    }
    let (value, code) = match outcome {
        Ok(v) => (v, RIVET_OK),
        Err(e) => (
            export_text(&format!("{}: {}", e.kind_name(), e)),
            error_code(&e),
        ),
    };
    // SAFETY: checked non-null; the caller's promise that it is writable.
    unsafe { *result = value };
    code
}

unsafe extern "C" fn exported_call(
    resource: *mut c_void,
    args: *const RivetAny,
    num_args: i32,
    result: *mut RivetAny,
) -> i32 {
    let run = || -> Result<RivetAny> {
        // SAFETY: `export` made `resource` a boxed Function, alive until `exported_free`.
        let f = unsafe { &*(resource as *const Function) };
        // SAFETY: the host's promise on `args`.
        let values = unsafe { values_of(args, num_args, f.name()) }?;
        any_of(f.call(&values)?)
    };
    // SAFETY: the host's promise that `result` is NULL or writable.
    unsafe { answer(result, "call", run) }
}

unsafe extern "C" fn exported_free(resource: *mut c_void) {
    if !resource.is_null() {
        // SAFETY: `export`'s box, released once (the host's contract).
        drop(unsafe { Box::from_raw(resource as *mut Function) });
    }
}

/// Registers `functions` in the host runtime `host` (a library's `rivet_library_init`):
/// each exported and created there, then set global under its name.
///
/// # Safety
/// `host` must point at a live `RivetHostApi` (what `rivet.load_library` passes).
pub unsafe fn register_in_host(
    host: *const RivetHostApi,
    functions: Vec<(String, Function)>,
) -> Result<()> {
    if host.is_null() {
        return Err(Error::Argument(
            "rivet_library_init: the host API is NULL".into(),
        ));
    }
    // SAFETY: the caller's promise.
    let host = unsafe { &*host };
    if host.abi_version >> 16 != crate::capi::ABI_MAJOR {
        return Err(Error::Argument(format!(
            "rivet_library_init: the host's C ABI is {}.{}, this library's {}.{}: rebuild it against the same rivet",
            host.abi_version >> 16,
            host.abi_version & 0xffff,
            crate::capi::ABI_MAJOR,
            crate::capi::ABI_MINOR
        )));
    }
    let host_error = |what: &str| -> Error {
        let mut kind: *const c_char = std::ptr::null();
        // SAFETY: the host's entry point; its strings live until its next failing call.
        let msg = unsafe { (host.get_last_error)(&mut kind) };
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: as above.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        let (k, m) = (text(kind), text(msg));
        Error::from_kind_name(&k, format!("{what}: {m}"))
            .unwrap_or_else(|| Error::Argument(format!("{what}: {m}")))
    };
    for (name, f) in functions {
        let cname = CString::new(name.as_str())
            .map_err(|_| Error::Argument(format!("a function name with a NUL byte: {name:?}")))?;
        let (signature, rule) = export_types(&f)?;
        let typed = host.abi_version & 0xffff >= TYPED_SINCE_MINOR;
        let (call, resource, deleter) = export(f);
        let mut h: RivetFunctionHandle = std::ptr::null_mut();
        // SAFETY: the host's entry points, with valid arguments (`function_create_typed` read
        // only from a host whose minor version has it); on failure the host does not keep
        // `resource`, so it is released here.
        let rc = unsafe {
            match (typed, &signature) {
                (true, Some(json)) => (host.function_create_typed)(
                    cname.as_ptr(),
                    Some(call),
                    resource,
                    Some(deleter),
                    json.as_ptr(),
                    rule,
                    &mut h,
                ),
                _ => (host.function_create)(
                    cname.as_ptr(),
                    Some(call),
                    resource,
                    Some(deleter),
                    &mut h,
                ),
            }
        };
        if rc != RIVET_OK {
            // SAFETY: not taken by the host.
            unsafe { deleter(resource) };
            return Err(host_error(&format!("registering '{name}'")));
        }
        // SAFETY: `h` is the host's live handle.
        let rc = unsafe { (host.set_global)(cname.as_ptr(), h, host.override_) };
        // SAFETY: the handle is ours to free; the registry holds its own reference.
        unsafe { (host.function_free)(h) };
        if rc != RIVET_OK {
            return Err(host_error(&format!("registering '{name}'")));
        }
    }
    Ok(())
}

/// The body of a library's `rivet_library_init`: runs `build` (which returns the functions
/// to register), registers them in `host`, and writes a failure's text into `err` (at most
/// `err_len` bytes, NUL-terminated). Returns a C ABI code. Never unwinds.
///
/// # Safety
/// `host` as for `register_in_host`; `err` NULL or writable for `err_len` bytes.
pub unsafe fn library_init<E: std::fmt::Display>(
    host: *const RivetHostApi,
    err: *mut c_char,
    err_len: usize,
    build: impl FnOnce() -> std::result::Result<Vec<(String, Function)>, E>,
) -> i32 {
    let outcome = catch_unwind(AssertUnwindSafe(|| -> std::result::Result<(), String> {
        let functions = build().map_err(|e| e.to_string())?;
        // SAFETY: the caller's promise on `host`.
        unsafe { register_in_host(host, functions) }.map_err(|e| format!("{}: {e}", e.kind_name()))
    }))
    .unwrap_or_else(|_| Err("InternalError: a panic in rivet_library_init".into()));
    match outcome {
        Ok(()) => RIVET_OK,
        Err(text) => {
            if !err.is_null() && err_len > 0 {
                let bytes = text.as_bytes();
                let n = bytes.len().min(err_len - 1);
                // SAFETY: the caller's promise: `err` holds `err_len` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, err, n);
                    *err.add(n) = 0;
                }
            }
            RIVET_ERR_USER
        }
    }
}
