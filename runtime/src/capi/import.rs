//! Functions of another library called by rivet: a packed C function (another copy of
//! rivet-runtime, a user's `cdylib`, any C code) wrapped as a `Function` of this runtime by
//! `RivetFunctionCreate` / `RivetFunctionCreateTyped`, and everything that comes back from it
//! (results, failures, output-rule answers), checked before use. The other direction, a rivet
//! function handed to another library, is `export.rs`.
//!
//! A call passes tensors as borrowed `DLTensor`s built from the arguments' layouts (valid for
//! the call), scalars and strings by value, takes a managed-tensor result with
//! `dlpack::import_versioned` (the callee's deleter runs when the last view drops), and turns a
//! failure (`"<Kind>: <message>"`) back into the error of that kind.
//!
//! Typed functions (C ABI 1.1) also carry their signature, as JSON (the serde form of
//! `function::Signature`), and optionally an output rule (`RivetOutputShapesFunc`), so the
//! host's function is typed like the callee's: framework glue (`rivet.torch.custom_op`,
//! `rivet.jax.ffi_func`) reads its parameters and asks it for output shapes ahead of a call.
//!
//! Invariants:
//! - The signature JSON is checked (size, arity, rank, dims) and never trusted for memory
//!   safety: the callee still checks every call's arguments itself.
//! - `value_from_callee` is the one place a result crossing inward is checked; a callee's
//!   broken answer or own internal error is a `LibraryError`, never rivet's `InternalError`.
//! - A function value never crosses (a handle means nothing to another library's runtime):
//!   such an argument or result is an `ArgumentError`.
//! - The callee's `resource` is released exactly once, by its `deleter`, when the last clone
//!   of the wrapping `Function` drops; nothing unwinds into the callee.

use super::{
    guard, new_handle, str_arg, RivetAny, RivetDeleter, RivetFunctionHandle, RivetOutputShapesFunc,
    RivetPackedCFunc, MAX_ARGS, RIVET_BOOL, RIVET_DLTENSOR, RIVET_DLTENSOR_READONLY,
    RIVET_ERR_INTERNAL, RIVET_ERR_USER, RIVET_FLOAT, RIVET_FUNCTION, RIVET_INT,
    RIVET_MANAGED_TENSOR, RIVET_NULL, RIVET_OK, RIVET_STR,
};
use crate::dlpack;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::function::{Dim, Function, ParamKind, Signature};
use crate::value::Value;
use dlpack_rs::ffi::{DLManagedTensorVersioned, DLTensor};
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The longest signature JSON a host accepts (a signature of `MAX_ARGS` tensors of
/// `MAX_NDIM` dims is far below it).
pub const MAX_SIGNATURE_JSON: usize = 1 << 24;

/// The callee's function and resource, released with its deleter.
struct Foreign {
    call: RivetPackedCFunc,
    resource: *mut c_void,
    deleter: Option<RivetDeleter>,
    output_shapes: Option<RivetOutputShapesFunc>,
}

// SAFETY: `RivetFunctionCreate`'s contract: the callee is callable from any thread and its
// resource may be released from any thread.
unsafe impl Send for Foreign {}
// SAFETY: as for Send: the callee is callable from any thread, concurrently.
unsafe impl Sync for Foreign {}

impl Drop for Foreign {
    fn drop(&mut self) {
        if let Some(d) = self.deleter {
            // SAFETY: released once, here (the contract).
            let _ = catch_unwind(AssertUnwindSafe(|| unsafe { d(self.resource) }));
        }
    }
}

/// Wraps a packed C function as a function of this runtime named `name`: `*out` receives a
/// new handle (free it with `RivetFunctionFree`; register it with `RivetFunctionSetGlobal`).
///
/// # Safety
/// `name` a NUL-terminated string; `func` callable from any thread with `resource` until
/// `deleter` (may be NULL) is called with it, once, from any thread; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn RivetFunctionCreate(
    name: *const c_char,
    func: Option<RivetPackedCFunc>,
    resource: *mut c_void,
    deleter: Option<RivetDeleter>,
    out: *mut RivetFunctionHandle,
) -> i32 {
    // SAFETY: the caller's promises, passed on; no signature, no output rule.
    unsafe { RivetFunctionCreateTyped(name, func, resource, deleter, std::ptr::null(), None, out) }
}

/// `RivetFunctionCreate` for a typed function: `signature_json` (NULL: untyped) is its
/// signature as JSON (the serde form of `rivet_runtime::Signature`, docs/c_abi.md "Typed
/// functions"), `output_shapes` (may be NULL) its output rule. The host function describes
/// that signature (introspection, error wording) and answers `output_shapes` through the
/// rule; the callee checks every call's arguments itself. A malformed signature is an
/// `ArgumentError` and nothing is created (`resource` stays the caller's).
///
/// # Safety
/// As `RivetFunctionCreate`; `signature_json` NULL or a NUL-terminated string;
/// `output_shapes` callable from any thread with `resource` until `deleter` runs.
#[no_mangle]
pub unsafe extern "C" fn RivetFunctionCreateTyped(
    name: *const c_char,
    func: Option<RivetPackedCFunc>,
    resource: *mut c_void,
    deleter: Option<RivetDeleter>,
    signature_json: *const c_char,
    output_shapes: Option<RivetOutputShapesFunc>,
    out: *mut RivetFunctionHandle,
) -> i32 {
    guard(|| {
        if out.is_null() {
            return Err(Error::Argument(
                "RivetFunctionCreate: argument 'out': expected a pointer, got NULL".into(),
            ));
        }
        // SAFETY: the caller's promise on `name`.
        let name = unsafe { str_arg(name, "RivetFunctionCreate: argument 0 ('name')") }?;
        let Some(call) = func else {
            return Err(Error::Argument(
                "RivetFunctionCreate: argument 1 ('func'): expected a function pointer, got NULL"
                    .into(),
            ));
        };
        let signature = if signature_json.is_null() {
            None
        } else {
            // SAFETY: the caller's promise on `signature_json`.
            let text = unsafe { CStr::from_ptr(signature_json) };
            Some(parse_signature(name, text.to_bytes())?)
        };
        if output_shapes.is_some() && signature.is_none() {
            return Err(Error::Argument(format!(
                "RivetFunctionCreateTyped: '{name}': an output rule needs a signature (the rule's inputs are the signature's tensor inputs)"
            )));
        }
        let foreign = std::sync::Arc::new(Foreign {
            call,
            resource,
            deleter,
            output_shapes,
        });
        let fname = name.to_string();
        let callee = foreign.clone();
        let body = move |args: &[Value]| call_foreign(&callee, &fname, args);
        let f = match (signature, output_shapes) {
            (None, _) => Function::new(name, body),
            (Some(sig), None) => Function::with_described_signature(name, sig, body),
            (Some(sig), Some(_)) => {
                let fname = name.to_string();
                Function::with_output_rule(name, sig, body, move |shapes: &[&[i64]]| {
                    foreign_output_shapes(&foreign, &fname, shapes)
                })
            }
        }
        .into_foreign();
        // SAFETY: checked non-null; the caller's promise that it is writable.
        unsafe { *out = new_handle(f) };
        Ok(())
    })
}

/// A signature from its JSON, checked: bounded size, at most `MAX_ARGS` parameters, tensor
/// ranks at most `MAX_NDIM`, and fixed dims not negative.
fn parse_signature(name: &str, json: &[u8]) -> Result<Signature> {
    let what = || format!("RivetFunctionCreateTyped: '{name}': the signature");
    if json.len() > MAX_SIGNATURE_JSON {
        return Err(Error::Argument(format!(
            "{}: {} bytes of JSON; at most {MAX_SIGNATURE_JSON}",
            what(),
            json.len()
        )));
    }
    let sig: Signature = serde_json::from_slice(json)
        .map_err(|e| Error::Argument(format!("{}: not a signature's JSON: {e}", what())))?;
    if sig.params.len() > MAX_ARGS as usize {
        return Err(Error::Argument(format!(
            "{}: {} parameters; the C ABI carries at most {MAX_ARGS}",
            what(),
            sig.params.len()
        )));
    }
    for p in &sig.params {
        let ParamKind::Tensor(t) = &p.kind else {
            continue;
        };
        let Some(shape) = &t.shape else { continue };
        if shape.len() > crate::layout::MAX_NDIM {
            return Err(Error::Argument(format!(
                "{}: parameter '{}' has {} dims; at most {}",
                what(),
                p.name,
                shape.len(),
                crate::layout::MAX_NDIM
            )));
        }
        if let Some(Dim::Fixed(n)) = shape.iter().find(|d| matches!(d, Dim::Fixed(n) if *n < 0)) {
            return Err(Error::Argument(format!(
                "{}: parameter '{}' has a dim of {n}; dims are >= 0",
                what(),
                p.name
            )));
        }
    }
    Ok(sig)
}

/// Asks the callee's output rule, and checks its answer (JSON of `[shape, dtype]` pairs,
/// dims >= 0, ranks at most `MAX_NDIM`).
fn foreign_output_shapes(
    fr: &Foreign,
    name: &str,
    shapes: &[&[i64]],
) -> Result<Vec<(Vec<i64>, DType)>> {
    let Some(rule) = fr.output_shapes else {
        return Err(Error::Internal(format!("{name}: no output rule")));
    };
    let num = i32::try_from(shapes.len())
        .ok()
        .filter(|n| *n <= MAX_ARGS)
        .ok_or_else(|| Error::Argument(format!("{name}: {} input shapes", shapes.len())))?;
    let ptrs: Vec<*const i64> = shapes.iter().map(|s| s.as_ptr()).collect();
    let ndims: Vec<i32> = shapes
        .iter()
        .map(|s| i32::try_from(s.len()).unwrap_or(i32::MAX))
        .collect();
    let mut result = RivetAny::NULL;
    // SAFETY: the callee's contract (`RivetFunctionCreateTyped`); `ptrs` and `ndims` point
    // into `shapes`, alive until the call returns.
    let code = unsafe { rule(fr.resource, ptrs.as_ptr(), ndims.as_ptr(), num, &mut result) };
    // SAFETY: the callee's contract on its result.
    let answer = unsafe { value_from_callee(name, code, result) }?;
    let Value::Str(text) = answer else {
        return Err(Error::Library(format!(
            "{name}: the output rule answered a {} instead of a string of JSON",
            answer.kind()
        )));
    };
    let text = text.as_bytes();
    let outs: Vec<(Vec<i64>, DType)> = serde_json::from_slice(text).map_err(|e| {
        Error::Library(format!(
            "{name}: the output rule's answer is not a JSON list of [shape, dtype]: {e}"
        ))
    })?;
    Ok(outs)
}

/// A borrowed `DLTensor` of `t`'s layout: its shape and strides point into `t`, which the
/// caller keeps alive for the call.
fn dltensor_of(t: &crate::tensor::Tensor) -> Result<DLTensor> {
    let ndim = i32::try_from(t.ndim())
        .map_err(|_| Error::Internal(format!("a tensor of {} dims", t.ndim())))?;
    Ok(DLTensor {
        data: t.raw_data() as *mut c_void,
        device: t.device().to_dlpack(),
        ndim,
        dtype: t.dtype().to_dlpack(),
        shape: t.shape().as_ptr() as *mut i64,
        strides: t.strides().as_ptr() as *mut i64,
        byte_offset: t.byte_offset(),
    })
}

fn call_foreign(fr: &Foreign, name: &str, args: &[Value]) -> Result<Value> {
    if args.len() > MAX_ARGS as usize {
        return Err(Error::Argument(format!(
            "{name}: {} arguments; the C ABI carries at most {MAX_ARGS}",
            args.len()
        )));
    }
    // Every DLTensor and string lives in a buffer sized up front, so the pointers handed to
    // the callee stay put while the arguments are assembled.
    let mut tensors: Vec<DLTensor> = Vec::with_capacity(args.len());
    let mut strings: Vec<CString> = Vec::with_capacity(args.len());
    let mut anys: Vec<RivetAny> = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        let any = match a {
            Value::Null => RivetAny::NULL,
            Value::Int(v) => RivetAny::int(*v),
            Value::Float(v) => RivetAny::float(*v),
            Value::Bool(b) => RivetAny::bool(*b),
            Value::Str(s) => {
                strings.push(CString::new(s.as_bytes()).map_err(|_| {
                    Error::Argument(format!(
                        "{name}: argument {i}: a string with a NUL byte cannot cross the C ABI"
                    ))
                })?);
                let p = strings.last().map_or(std::ptr::null(), |c| c.as_ptr());
                RivetAny::ptr(RIVET_STR, p as *mut c_void)
            }
            Value::Tensor(t) => {
                tensors.push(dltensor_of(t)?);
                let p = tensors.last().map_or(std::ptr::null(), |d| d as *const DLTensor);
                let code = if t.is_read_only() {
                    RIVET_DLTENSOR_READONLY
                } else {
                    RIVET_DLTENSOR
                };
                RivetAny::ptr(code, p as *mut c_void)
            }
            other => {
                return Err(Error::Argument(format!(
                    "{name}: argument {i} is a {}, which cannot cross to a function of another library (it takes none, int, float, bool, str and tensor arguments)",
                    other.kind()
                )))
            }
        };
        anys.push(any);
    }
    let mut result = RivetAny::NULL;
    // SAFETY: the callee's contract (`RivetFunctionCreate`); every pointer in `anys` points
    // into `tensors`, `strings` or `args`, all alive until the call returns.
    let code = unsafe { (fr.call)(fr.resource, anys.as_ptr(), anys.len() as i32, &mut result) };
    // SAFETY: the callee's contract on its result.
    unsafe { value_from_callee(name, code, result) }
}

/// What a callee in another library answered (`code`, `*result`), as a value of this
/// runtime or the error it reports: the one place where a result crossing the C ABI inward
/// is checked before use (`values_of` is the one for arguments). `name` names the function.
///
/// - Success: the type code must be one a result may have; a `RIVET_STR` is a non-NULL
///   NUL-terminated UTF-8 string, a `RIVET_MANAGED_TENSOR` a non-NULL managed tensor
///   (imported: its deleter runs when the last view drops, or at once when it is refused).
///   Anything else is a `LibraryError`: the library broke the ABI's contract.
/// - Failure: `"<Kind>: <message>"` in a `RIVET_STR` (optional) becomes the error of that kind,
///   `name` prepended; a callee's own internal error (code `RIVET_ERR_INTERNAL`, or kind
///   `InternalError`) is a `LibraryError`, never rivet's `InternalError`; a managed tensor
///   returned with a failure code is released (its deleter runs), never leaked.
///
/// # Safety
/// The callee's contract: a pointer in `result` points at what its type code says (a string
/// valid until the callee's next call on this thread, a managed tensor not yet consumed).
pub(crate) unsafe fn value_from_callee(name: &str, code: i32, result: RivetAny) -> Result<Value> {
    // SAFETY: `v_ptr` is the member the pointer type codes set; read only for them.
    let ptr = unsafe { result.value.v_ptr };
    let text = |p: *mut c_void| -> Result<String> {
        if p.is_null() {
            return Err(Error::Library(format!(
                "{name}: returned a string result (type code {RIVET_STR}) whose pointer is NULL"
            )));
        }
        // SAFETY: the callee's contract: NUL-terminated, valid until its next call here.
        let bytes = unsafe { CStr::from_ptr(p as *const c_char) }.to_bytes();
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|e| {
            Error::Library(format!("{name}: returned a string that is not UTF-8 ({e})"))
        })
    };
    if code != RIVET_OK {
        let message = match result.type_code {
            RIVET_STR if !ptr.is_null() => Some(text(ptr).unwrap_or_else(|e| e.to_string())),
            RIVET_MANAGED_TENSOR if !ptr.is_null() => {
                // SAFETY: the callee's contract; importing runs the deleter on every path.
                drop(unsafe { dlpack::import_versioned(ptr as *mut DLManagedTensorVersioned) });
                None
            }
            _ => None,
        };
        return Err(callee_error(name, code, message));
    }
    // Each arm reads the union member its type code names.
    Ok(match result.type_code {
        RIVET_NULL => Value::Null,
        // SAFETY: an int's member.
        RIVET_INT => Value::Int(unsafe { result.value.v_int64 }),
        // SAFETY: a float's member.
        RIVET_FLOAT => Value::Float(unsafe { result.value.v_float64 }),
        // SAFETY: a bool is carried in the int member.
        RIVET_BOOL => Value::Bool(unsafe { result.value.v_int64 } != 0),
        RIVET_STR => Value::Str(text(ptr)?.into()),
        RIVET_MANAGED_TENSOR => {
            if ptr.is_null() {
                return Err(Error::Library(format!(
                    "{name}: returned a managed tensor (type code {RIVET_MANAGED_TENSOR}) whose pointer is NULL"
                )));
            }
            // SAFETY: the callee's contract: an owned, not yet consumed managed tensor.
            unsafe { dlpack::import_versioned(ptr as *mut DLManagedTensorVersioned) }
                .map_err(|e| e.context(&format!("{name}: its result: ")))?
                .into()
        }
        RIVET_FUNCTION => {
            return Err(Error::Argument(format!(
                "{name}: returned a function, which cannot cross from another library (its handle is leaked, not freed: it belongs to that library's runtime)"
            )))
        }
        c => {
            return Err(Error::Library(format!(
                "{name}: returned type code {c}, which no result may have (0..={RIVET_STR} or {RIVET_MANAGED_TENSOR})"
            )))
        }
    })
}

/// A callee's failure (`"<Kind>: <message>"`, or none) as the error of its kind, `name`
/// prepended; see `value_from_callee`.
pub(crate) fn callee_error(name: &str, code: i32, text: Option<String>) -> Error {
    let text = text.unwrap_or_else(|| format!("failed with code {code} and no message"));
    let (kind, message) = text.split_once(": ").unwrap_or(("", text.as_str()));
    if code != RIVET_ERR_USER || kind == "InternalError" {
        let why = if code == RIVET_ERR_USER || code == RIVET_ERR_INTERNAL {
            "an internal error of its own"
        } else {
            "an unknown return code"
        };
        return Error::Library(format!("{name}: failed with {why} (code {code}): {text}"));
    }
    let message = format!("{name}: {message}");
    match Error::from_kind_name(kind, message.clone()) {
        Some(e) => e,
        None => Error::Argument(format!("{name}: {text}")),
    }
}
