//! Packed functions across libraries: a rivet function implemented in another shared library
//! (another copy of rivet-runtime: a user's crate built as a `cdylib`, or any C code) becomes a
//! function of this runtime, registered under a name, through the C ABI only. This is how a
//! Rust crate hands its kernels to Python in one step (`rivet.load_library(path)`,
//! docs/c_abi.md "Functions from another library"): Rust types never cross the boundary, only
//! `RivetAny` values, borrowed `DLTensor*`s and owned `DLManagedTensorVersioned*`s.
//!
//! The callee side (`export`): a `Function` boxed as the `resource` of `exported_call`, which
//! reads its arguments as `RivetFunctionCall` does, and on failure writes `"<Kind>: <message>"`
//! as a `RIVET_STR` result (valid until its next call on that thread) with a non-zero code.
//! The host side (`RivetFunctionCreate`): a `Function` whose body passes tensors as borrowed
//! `DLTensor`s built from the arguments' layouts (valid for the call), scalars and strings by
//! value, takes a managed-tensor result with `dlpack::import_versioned` (the callee's deleter
//! runs when the last view drops), and turns a failure back into the error of that kind.
//!
//! Typed functions (`RivetFunctionCreateTyped`, C ABI 1.1) also carry their signature, as
//! JSON (the serde form of `function::Signature`), and optionally an output rule
//! (`RivetOutputShapesFunc`), so the host's function is typed like the callee's: framework
//! glue (`rivet.torch.custom_op`, `rivet.jax.ffi_func`) reads its parameters and asks it for
//! output shapes ahead of a call. The host checks the JSON (size, arity, rank) and never
//! trusts it for memory safety: the callee still checks every call's arguments itself.
//!
//! Invariants: nothing unwinds across the boundary (both sides run under `catch_unwind`); a
//! function value never crosses it (a handle is a `Function` of one library's own runtime and
//! means nothing to another): such an argument or result is an `ArgumentError`; the callee's
//! `resource` is released exactly once, by its `deleter`, when the host's function is dropped.

use crate::capi::{
    any_of, guard, new_handle, str_arg, value_from_callee, values_of, RivetAny,
    RivetFunctionHandle, RivetValue, MAX_ARGS, RIVET_BOOL, RIVET_DLTENSOR, RIVET_DLTENSOR_READONLY,
    RIVET_ERR_INTERNAL, RIVET_ERR_USER, RIVET_OK, RIVET_STR,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::function::{Dim, Function, ParamKind, Signature};
use crate::registry;
use crate::value::Value;
use dlpack_rs::ffi::DLTensor;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

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

/// The longest signature JSON a host accepts (a signature of `MAX_ARGS` tensors of
/// `MAX_NDIM` dims is far below it).
pub const MAX_SIGNATURE_JSON: usize = 1 << 24;

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
        .from_library();
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
        let f = crate::capi::function_of(func, "RivetFunctionSetGlobal: argument 1")?;
        registry::register(name, f, override_ != 0)
    })
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
            Value::Bool(b) => RivetAny {
                type_code: RIVET_BOOL,
                pad: 0,
                value: RivetValue { v_int64: *b as i64 },
            },
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

thread_local! {
    /// The callee side's last text (a failure, or an output rule's answer), handed out as a
    /// `RIVET_STR` result valid until the next call on this thread.
    static EXPORT_TEXT: RefCell<CString> = RefCell::new(CString::default());
}

/// `text` kept in this thread's `EXPORT_TEXT`, as a `RIVET_STR` value pointing there.
fn export_text(text: &str) -> RivetAny {
    let p = EXPORT_TEXT.with(|c| {
        let mut c = c.borrow_mut();
        *c = CString::new(text.replace('\0', "\u{fffd}")).expect("NULs replaced");
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

fn error_code(e: &Error) -> i32 {
    if matches!(e, Error::Internal(_)) {
        RIVET_ERR_INTERNAL
    } else {
        RIVET_ERR_USER
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Both sides of the protocol in one runtime: `export` then `RivetFunctionCreate`.
    fn crossed(f: Function) -> Function {
        let (call, resource, deleter) = export(f);
        let mut h: RivetFunctionHandle = std::ptr::null_mut();
        let name = CString::new("crossed").unwrap();
        // SAFETY: valid arguments; the handle is freed below.
        let rc = unsafe {
            RivetFunctionCreate(name.as_ptr(), Some(call), resource, Some(deleter), &mut h)
        };
        assert_eq!(rc, RIVET_OK);
        let f = crate::capi::handle_function(h).expect("a live handle");
        // SAFETY: freed once.
        unsafe { crate::capi::RivetFunctionFree(h) };
        f
    }

    #[test]
    fn tensors_scalars_results_and_errors_cross_with_their_kinds() {
        let axpy = crossed(crate::testing::functions().remove(2));
        let x = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
        let y = Tensor::from_slice(&[10f32, 20., 30., 40., 50., 60.], &[2, 3]).unwrap();
        // A transposed view crosses as its layout (strides), written in place.
        let yt = y.as_strided(&[3, 2], &[1, 3], 0).unwrap();
        let xt = x.as_strided(&[3, 2], &[1, 3], 0).unwrap();
        axpy.call(&[Value::Float(2.0), xt.into(), yt.into()])
            .unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), [12., 24., 36., 48., 60., 72.]);
        // The callee's signature check, its kind kept, the name of the crossing added.
        let bad = Tensor::from_slice(&[1f32, 2.], &[2]).unwrap();
        let e = axpy
            .call(&[Value::Float(1.0), bad.into(), y.clone().into()])
            .unwrap_err();
        assert!(matches!(e, Error::Shape(_)), "{e:?}");
        assert!(e.to_string().starts_with("crossed: testing.axpy"), "{e}");
        // A read-only tensor stays read-only across.
        let e = axpy
            .call(&[Value::Float(1.0), x.clone().into(), y.to_read_only().into()])
            .unwrap_err();
        assert!(matches!(e, Error::ReadOnly(_)), "{e:?}");
        // A function argument cannot cross: a clear error, nothing called.
        let e = axpy
            .call(&[
                Value::Function(axpy.clone()),
                x.clone().into(),
                y.clone().into(),
            ])
            .unwrap_err();
        assert!(
            matches!(e, Error::Argument(_)) && e.to_string().contains("cannot cross"),
            "{e}"
        );
        // Results: a tensor comes back as a managed tensor of the callee (echo returns it).
        let echo = crossed(crate::testing::functions().remove(0));
        let out = echo.call(&[x.clone().into()]).unwrap();
        let Value::Tensor(t) = out else {
            panic!("{}", out.kind())
        };
        assert_eq!(t.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
        assert_eq!(t.data_ptr(), x.data_ptr(), "no copy");
        assert!(matches!(
            echo.call(&[Value::Str("a\u{e9}".into())]).unwrap(),
            Value::Str(s) if &*s == "a\u{e9}"
        ));
        assert!(matches!(
            echo.call(&[Value::Int(i64::MIN)]).unwrap(),
            Value::Int(i64::MIN)
        ));
    }

    static RELEASED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn failing(
        _resource: *mut c_void,
        _args: *const RivetAny,
        _n: i32,
        result: *mut RivetAny,
    ) -> i32 {
        static MSG: &[u8] = b"DTypeError: wrong dtype over there\0";
        // SAFETY: the host passes a writable result.
        unsafe { *result = RivetAny::ptr(RIVET_STR, MSG.as_ptr() as *mut c_void) };
        RIVET_ERR_USER
    }

    unsafe extern "C" fn count_release(_resource: *mut c_void) {
        RELEASED.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn a_foreign_failure_keeps_its_kind_and_the_resource_is_released_once() {
        let mut h: RivetFunctionHandle = std::ptr::null_mut();
        let name = CString::new("foreign.fail").unwrap();
        // SAFETY: valid arguments.
        let rc = unsafe {
            RivetFunctionCreate(
                name.as_ptr(),
                Some(failing),
                std::ptr::null_mut(),
                Some(count_release),
                &mut h,
            )
        };
        assert_eq!(rc, RIVET_OK);
        let f = crate::capi::handle_function(h).expect("a live handle");
        let e = f.call(&[]).unwrap_err();
        assert!(matches!(e, Error::DType(_)), "{e:?}");
        assert_eq!(e.to_string(), "foreign.fail: wrong dtype over there");
        // SAFETY: freed once.
        unsafe { crate::capi::RivetFunctionFree(h) };
        assert_eq!(RELEASED.load(Ordering::SeqCst), 0, "a clone is still alive");
        drop(f);
        assert_eq!(RELEASED.load(Ordering::SeqCst), 1);
        // NULL function pointer and NULL out: user errors, nothing created.
        let mut h2: RivetFunctionHandle = std::ptr::null_mut();
        // SAFETY: the NULLs are what is being checked.
        unsafe {
            assert_eq!(
                RivetFunctionCreate(name.as_ptr(), None, std::ptr::null_mut(), None, &mut h2),
                RIVET_ERR_USER
            );
            assert_eq!(
                RivetFunctionCreate(
                    name.as_ptr(),
                    Some(failing),
                    std::ptr::null_mut(),
                    None,
                    std::ptr::null_mut()
                ),
                RIVET_ERR_USER
            );
        }
        assert!(h2.is_null());
    }

    /// `f` crossed the typed way: `export`, `export_types`, `RivetFunctionCreateTyped`.
    fn crossed_typed(f: Function) -> Function {
        let (json, rule) = export_types(&f).unwrap();
        let (call, resource, deleter) = export(f);
        let mut h: RivetFunctionHandle = std::ptr::null_mut();
        let name = CString::new("crossed").unwrap();
        let json_ptr = json.as_ref().map_or(std::ptr::null(), |j| j.as_ptr());
        // SAFETY: valid arguments; the handle is freed below.
        let rc = unsafe {
            RivetFunctionCreateTyped(
                name.as_ptr(),
                Some(call),
                resource,
                Some(deleter),
                json_ptr,
                rule,
                &mut h,
            )
        };
        assert_eq!(rc, RIVET_OK);
        let f = crate::capi::handle_function(h).expect("a live handle");
        // SAFETY: freed once.
        unsafe { crate::capi::RivetFunctionFree(h) };
        f
    }

    /// `y = 2 x` over (n, 3) float32 tensors, typed, with an output rule.
    fn doubler() -> Function {
        use crate::function::{DeviceSpec, Param, TensorSpec};
        let spec = |output| {
            ParamKind::Tensor(TensorSpec {
                dtypes: vec![DType::F32],
                shape: Some(vec![Dim::Var("n".into()), Dim::Fixed(3)]),
                device: DeviceSpec::Host,
                output,
            })
        };
        let sig = Signature::new(vec![
            Param::new("x", spec(false)),
            Param::new("y", spec(true)),
        ]);
        Function::with_output_rule(
            "doubler",
            sig,
            |args| {
                // y is zeros in the test: y <- 2 x + y is 2 x.
                let axpy = crate::testing::functions().remove(2);
                let mut with_alpha = vec![Value::Float(2.0)];
                with_alpha.extend_from_slice(args);
                axpy.call(&with_alpha)
            },
            |shapes| match shapes {
                [s] if s.len() == 2 && s[1] == 3 => Ok(vec![(s.to_vec(), DType::F32)]),
                _ => Err(Error::Shape(format!("doubler: input shapes {shapes:?}"))),
            },
        )
    }

    #[test]
    fn a_typed_function_crosses_with_its_signature_and_output_rule() {
        let f = crossed_typed(doubler());
        assert_eq!(f.signature(), doubler().signature());
        assert_eq!(
            f.output_shapes(&[&[5, 3]], None).unwrap(),
            vec![(vec![5, 3], DType::F32)]
        );
        // The rule's failure keeps its kind; the crossing's name comes first.
        let e = f.output_shapes(&[&[5, 4]], None).unwrap_err();
        assert!(matches!(e, Error::Shape(_)), "{e:?}");
        assert!(
            e.to_string().starts_with("crossed: doubler: input shapes"),
            "{e}"
        );
        // Dims near the limits cross unchanged (the rule sees what was asked).
        let e = f.output_shapes(&[&[i64::MAX, i64::MIN]], None).unwrap_err();
        assert!(e.to_string().contains(&i64::MIN.to_string()), "{e}");
        // Calls still run (and are checked) in the callee.
        let x = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
        let y = Tensor::zeros(&[2, 3], DType::F32).unwrap();
        f.call(&[x.clone().into(), y.clone().into()]).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), [2., 4., 6., 8., 10., 12.]);
        let e = f.call(&[x.into(), Tensor::zeros(&[2, 4], DType::F32).unwrap().into()]);
        assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
        // An untyped function crosses untyped.
        let echo = crossed_typed(crate::testing::functions().remove(0));
        assert!(echo.signature().is_some(), "testing.echo is typed");
        let untyped = crossed_typed(Function::new("plain", |_| Ok(Value::Null)));
        assert!(untyped.signature().is_none() && !untyped.has_output_rule());
    }

    #[test]
    fn a_malformed_signature_is_an_argument_error_and_creates_nothing() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let many_dims = format!(
            r#"{{"params": [{{"name": "x", "kind": {{"tensor": {{"dtypes": [], "shape": [{}], "device": "host", "output": false}}}}}}]}}"#,
            vec![r#""any""#; 65].join(", ")
        );
        let cases: Vec<(String, &str)> = vec![
            ("not json".into(), "not a signature's JSON"),
            (r#"{"params": [], "extra": 1}"#.into(), "unknown field"),
            (r#"{"params": [{"name": "x", "kind": "tensor"}]}"#.into(), "not a signature's JSON"),
            (
                r#"{"params": [{"name": "x", "kind": {"tensor": {"dtypes": ["float128"], "shape": null, "device": "host", "output": false}}}]}"#.into(),
                "float128",
            ),
            (
                r#"{"params": [{"name": "x", "kind": {"tensor": {"dtypes": [], "shape": [{"fixed": -9223372036854775808}], "device": "host", "output": false}}}]}"#.into(),
                "dims are >= 0",
            ),
            (
                r#"{"params": [{"name": "x", "kind": {"tensor": {"dtypes": [], "shape": null, "device": {"exactly": "cuda:-1"}, "output": false}}}]}"#.into(),
                "unknown device",
            ),
            (many_dims, "65 dims"),
            (deep, "not a signature's JSON"),
            // Past the size cap: refused before parsing (16 MiB of spaces, then valid JSON).
            (
                format!("{}{{\"params\": []}}", " ".repeat(MAX_SIGNATURE_JSON)),
                "bytes of JSON; at most",
            ),
        ];
        for (json, want) in cases {
            let mut h: RivetFunctionHandle = std::ptr::null_mut();
            let name = CString::new("bad").unwrap();
            let json = CString::new(json).unwrap();
            // SAFETY: valid pointers; the malformed JSON is what is checked.
            let rc = unsafe {
                RivetFunctionCreateTyped(
                    name.as_ptr(),
                    Some(failing),
                    std::ptr::null_mut(),
                    None,
                    json.as_ptr(),
                    None,
                    &mut h,
                )
            };
            assert_eq!(rc, RIVET_ERR_USER, "{want}");
            assert!(h.is_null());
            let mut kind: *const c_char = std::ptr::null();
            // SAFETY: reads this thread's last error.
            let msg = unsafe { CStr::from_ptr(crate::capi::RivetGetLastError(&mut kind)) }
                .to_string_lossy()
                .into_owned();
            assert!(msg.contains(want) && msg.contains("'bad'"), "{want}: {msg}");
        }
    }

    unsafe extern "C" fn garbage_rule(
        resource: *mut c_void,
        _shapes: *const *const i64,
        _ndims: *const i32,
        _n: i32,
        result: *mut RivetAny,
    ) -> i32 {
        // The resource picks the answer.
        static ANSWERS: [&[u8]; 3] = [b"[[[2, 3]]]\0", b"[[[-1], \"float32\"]]\0", b"{}\0"];
        let text = ANSWERS[resource as usize % 3];
        // SAFETY: the host passes a writable result.
        unsafe { *result = RivetAny::ptr(RIVET_STR, text.as_ptr() as *mut c_void) };
        RIVET_OK
    }

    #[test]
    fn a_foreign_output_rule_answer_is_checked() {
        let json = CString::new(
            r#"{"params": [{"name": "y", "kind": {"tensor": {"dtypes": [], "shape": null, "device": "host", "output": true}}}]}"#,
        )
        .unwrap();
        for (which, want) in [
            (0usize, "not a JSON list"),
            (1, "negative size -1"),
            (2, "not a JSON list"),
        ] {
            let mut h: RivetFunctionHandle = std::ptr::null_mut();
            let name = CString::new("rule").unwrap();
            // SAFETY: valid arguments; `resource` is only an index for `garbage_rule`.
            let rc = unsafe {
                RivetFunctionCreateTyped(
                    name.as_ptr(),
                    Some(failing),
                    which as *mut c_void,
                    None,
                    json.as_ptr(),
                    Some(garbage_rule),
                    &mut h,
                )
            };
            assert_eq!(rc, RIVET_OK);
            let f = crate::capi::handle_function(h).expect("a live handle");
            // SAFETY: freed once.
            unsafe { crate::capi::RivetFunctionFree(h) };
            let e = f.output_shapes(&[], None).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
            // A broken answer is the library's bug, never rivet's internal error.
            assert!(matches!(e, Error::Library(_)), "{e:?}");
        }
    }

    static TYPED_CREATES: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn counting_create_typed(
        name: *const c_char,
        func: Option<RivetPackedCFunc>,
        resource: *mut c_void,
        deleter: Option<RivetDeleter>,
        signature_json: *const c_char,
        output_shapes: Option<RivetOutputShapesFunc>,
        out: *mut RivetFunctionHandle,
    ) -> i32 {
        TYPED_CREATES.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the arguments `register_in_host` passes, handed on.
        unsafe {
            RivetFunctionCreateTyped(
                name,
                func,
                resource,
                deleter,
                signature_json,
                output_shapes,
                out,
            )
        }
    }

    #[test]
    fn a_library_registers_typed_only_in_a_host_that_has_the_typed_entry() {
        let host = |minor: i32| RivetHostApi {
            abi_version: crate::capi::ABI_MAJOR << 16 | minor,
            override_: 1,
            function_create: RivetFunctionCreate,
            set_global: RivetFunctionSetGlobal,
            function_free: crate::capi::RivetFunctionFree,
            get_last_error: crate::capi::RivetGetLastError,
            function_create_typed: counting_create_typed,
        };
        // A 1.0 host's table ends before `function_create_typed`: never read there, so the
        // function arrives untyped (and still runs, checked by the callee).
        let old = host(0);
        // SAFETY: a live table of this runtime's entry points.
        unsafe { register_in_host(&old, vec![("foreign_test.old_host".into(), doubler())]) }
            .unwrap();
        assert_eq!(TYPED_CREATES.load(Ordering::SeqCst), 0);
        let f = registry::get("foreign_test.old_host").unwrap();
        assert!(f.signature().is_none() && !f.has_output_rule());
        let x = Tensor::from_slice(&[1f32, 2., 3.], &[1, 3]).unwrap();
        let y = Tensor::zeros(&[1, 3], DType::F32).unwrap();
        f.call(&[x.into(), y.clone().into()]).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), [2., 4., 6.]);
        // A 1.1 host: typed, through the typed entry.
        let new = host(TYPED_SINCE_MINOR);
        // SAFETY: as above.
        unsafe { register_in_host(&new, vec![("foreign_test.new_host".into(), doubler())]) }
            .unwrap();
        assert_eq!(TYPED_CREATES.load(Ordering::SeqCst), 1);
        let f = registry::get("foreign_test.new_host").unwrap();
        assert_eq!(f.signature(), doubler().signature());
        // Another major version is refused before anything is created.
        let other = RivetHostApi {
            abi_version: (crate::capi::ABI_MAJOR + 1) << 16,
            ..host(0)
        };
        // SAFETY: as above.
        let e = unsafe { register_in_host(&other, vec![("foreign_test.other".into(), doubler())]) }
            .unwrap_err();
        assert!(
            e.to_string().contains("rebuild it against the same rivet"),
            "{e}"
        );
        assert!(registry::get("foreign_test.other").is_err());
    }
}
