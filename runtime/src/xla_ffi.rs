//! XLA FFI handlers (typed FFI, `api_version=1`; the C structs of `xla/ffi/api/c_api.h`, API
//! 0.3) that run a registered rivet function on XLA's buffers with no copy: `rivet.jax.ffi_func`
//! registers `rivet_xla_ffi_handler` with `jax.ffi.register_ffi_target("rivet", ...,
//! platform="cpu")` and `rivet_xla_ffi_handler_cuda` under the same name for
//! `platform="CUDA"`, and calls them through `jax.ffi.ffi_call("rivet", out_types)(*args,
//! rivet_function=name)`; XLA picks the handler of the platform the program runs on.
//!
//! Invariants:
//! - Every input buffer becomes a read-only rivet view, every result buffer a writable one
//!   (compact row-major: XLA gives the custom call default layouts), both borrowed for the
//!   call; the function is called with the inputs, then the results, as compiled rivet
//!   functions take them. On the CPU platform the views are host memory; on the CUDA platform
//!   they are on `cuda:N`, N being XLA's device ordinal for the call
//!   (`XLA_FFI_DeviceOrdinal_Get`), and the function runs with XLA's stream
//!   (`XLA_FFI_Stream_Get`) as its call stream ([`crate::stream`]): a CUDA function enqueues
//!   its kernels there and returns without synchronizing, ordered with XLA's own work. Its checks (dtypes, shapes, symbolic dims, overlap) run as for any
//!   caller, so a shape XLA got wrong is a clear error, never an out-of-bounds access.
//! - Nothing unwinds into XLA: errors and panics become `XLA_FFI_Error`s with rivet's message
//!   (kind first: "rivet ShapeError: ...").
//! - The frame is read defensively: struct sizes, counts, type tags and NULL pointers are
//!   checked before use, and an entry of XLA's API table is called only when the table's
//!   `struct_size` says the table has it (an older XLA's is shorter): a missing entry is an
//!   error naming it (XLA is trusted to pass a frame of its own making, not to be free of
//!   bugs). A malformed frame (a struct too small, a count out of range, a NULL array, a rank
//!   past 64, a negative device ordinal) is an `ArgumentError` (`DeviceError` for the
//!   ordinal) naming what is wrong, never an `InternalError`: that kind is kept for rivet's own
//!   bugs. Nothing is written past a struct's `struct_size` (the metadata query of an older
//!   XLA, whose struct ends at `traits`, gets no `state_type_id`).
//! - An error the frame gives no way to report (no API table, or one without
//!   `XLA_FFI_Error_Create`) aborts the process: returning NULL would tell XLA the results
//!   are there. `tests/src/fuzz/xla_gen.rs` fuzzes all of this on hand-made frames.
//!
//! The function is looked up in the registry by the attribute's name on every call. XLA's
//! FFI (0.3) could keep it per call site instead: an `instantiate` handler in a handler
//! bundle stores a state (`XLA_FFI_State_Set`, of a type registered with
//! `XLA_FFI_Type_Register` and declared in the metadata's `state_type_id`) that `execute`
//! fetches with `XLA_FFI_State_Get`. That is kept out on measurement: the lookup (the name
//! borrowed from the frame, a read lock, one hash of a ~15-byte name, an `Arc` clone) costs
//! about 33 ns (45 ns while the name was copied into a `String` first, as it was until this
//! was measured), while a jitted call of a 4x4 elementwise kernel costs 6.2-6.7 us and rivet's
//! whole share of it 1.1-1.4 us (`benches/frameworks_bench.py`, `jax_rivet` against `jax_empty`,
//! on the 2-vCPU development machine); `XLA_FFI_State_Get` is itself a call into XLA per
//! execution, and the state path would add a second handler, a registered type and an XLA
//! version dependence for a saving of tens of nanoseconds. Names are never re-registered
//! (`rivet.jax.ffi_func` makes a fresh one per wrapper), so caching would not change meaning.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{self, Dims};
use crate::registry;
use crate::tensor::Tensor;
use crate::value::Value;
use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The FFI API version this handler was written against (c_api.h's XLA_FFI_API_MAJOR/MINOR).
pub const API_MAJOR: i32 = 0;
pub const API_MINOR: i32 = 3;

/// The attribute naming the registered rivet function to run.
pub const FUNCTION_ATTR: &str = "rivet_function";

const EXTENSION_METADATA: i32 = 1;
const STAGE_EXECUTE: i32 = 3;
const ARG_BUFFER: i32 = 1;
const ATTR_STRING: i32 = 4;
const ERRC_INVALID_ARGUMENT: i32 = 3;
const ERRC_INTERNAL: i32 = 13;
/// Largest argument, result or attribute count read from a frame.
const MAX_COUNT: i64 = 1 << 16;

#[repr(C)]
pub struct ExtensionBase {
    pub struct_size: usize,
    pub type_: i32,
    pub next: *mut ExtensionBase,
}

#[repr(C)]
pub struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub major_version: i32,
    pub minor_version: i32,
}

#[repr(C)]
pub struct ErrorCreateArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub message: *const c_char,
    pub errc: i32,
}

/// `XLA_FFI_Error_Create_Args_STRUCT_SIZE`: offsetof(errc) + sizeof(errc).
const ERROR_CREATE_ARGS_SIZE: usize = 28;

pub type ErrorCreate = unsafe extern "C" fn(*mut ErrorCreateArgs) -> *mut c_void;

pub type ErrorGetMessage = unsafe extern "C" fn(*mut ErrorGetMessageArgs);
pub type ErrorDestroy = unsafe extern "C" fn(*mut ErrorDestroyArgs);
pub type StreamGet = unsafe extern "C" fn(*mut StreamGetArgs) -> *mut c_void;
pub type DeviceOrdinalGet = unsafe extern "C" fn(*mut DeviceOrdinalGetArgs) -> *mut c_void;
/// An entry of the API table rivet never calls (kept for the layout).
pub type Unused = *const c_void;

#[repr(C)]
pub struct ErrorGetMessageArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub error: *mut c_void,
    pub message: *const c_char,
}

#[repr(C)]
pub struct ErrorDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub error: *mut c_void,
}

#[repr(C)]
pub struct StreamGetArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub ctx: *mut c_void,
    pub stream: *mut c_void,
}

#[repr(C)]
pub struct DeviceOrdinalGetArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub ctx: *mut c_void,
    pub device_ordinal: i32,
}

/// `XLA_FFI_Api`, in c_api.h's order, up to the last entry rivet calls
/// (`XLA_FFI_DeviceOrdinal_Get`). Only the entries inside the table's `struct_size` exist.
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub api_version: ApiVersion,
    pub internal_api: *const c_void,
    pub error_create: Option<ErrorCreate>,
    pub error_get_message: Option<ErrorGetMessage>,
    pub error_destroy: Option<ErrorDestroy>,
    pub handler_register: Unused,
    pub stream_get: Option<StreamGet>,
    pub type_register: Unused,
    pub execution_context_get: Unused,
    pub state_set: Unused,
    pub state_get: Unused,
    pub device_memory_allocate: Unused,
    pub device_memory_free: Unused,
    pub thread_pool_schedule: Unused,
    pub thread_pool_num_threads: Unused,
    pub future_create: Unused,
    pub future_set_available: Unused,
    pub future_set_error: Unused,
    pub run_id_get: Unused,
    pub device_ordinal_get: Option<DeviceOrdinalGet>,
}

/// The entry `$field` of XLA's API table `$api`, or None when the table (an older XLA's) ends
/// before it or holds NULL there: an entry past `struct_size` is never read.
macro_rules! entry {
    ($api:expr, $field:ident) => {
        $api.has(std::mem::offset_of!(Api, $field))
            .then_some($api.$field)
            .flatten()
    };
}

impl Api {
    /// An empty table (every entry NULL) of the full size, for tests and hosts that fill in
    /// what they offer.
    pub fn empty() -> Api {
        let null = std::ptr::null::<c_void>();
        Api {
            struct_size: std::mem::size_of::<Api>(),
            extension_start: std::ptr::null_mut(),
            api_version: ApiVersion {
                struct_size: API_VERSION_SIZE,
                extension_start: std::ptr::null_mut(),
                major_version: API_MAJOR,
                minor_version: API_MINOR,
            },
            internal_api: null,
            error_create: None,
            error_get_message: None,
            error_destroy: None,
            handler_register: null,
            stream_get: None,
            type_register: null,
            execution_context_get: null,
            state_set: null,
            state_get: null,
            device_memory_allocate: null,
            device_memory_free: null,
            thread_pool_schedule: null,
            thread_pool_num_threads: null,
            future_create: null,
            future_set_available: null,
            future_set_error: null,
            run_id_get: null,
            device_ordinal_get: None,
        }
    }

    /// Whether the table reaches past the entry at byte `offset` (`offset_of!(Api, entry)`):
    /// an older XLA's table is shorter, and what lies past its `struct_size` is not its own.
    fn has(&self, offset: usize) -> bool {
        self.struct_size >= offset + std::mem::size_of::<usize>()
    }
}

#[repr(C)]
pub struct Buffer {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub dtype: i32,
    pub data: *mut c_void,
    pub rank: i64,
    pub dims: *mut i64,
}

#[repr(C)]
pub struct List {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *mut i32,
    pub items: *mut *mut c_void,
}

#[repr(C)]
pub struct ByteSpan {
    pub ptr: *const c_char,
    pub len: usize,
}

#[repr(C)]
pub struct Attrs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *mut i32,
    pub names: *mut *mut ByteSpan,
    pub attrs: *mut *mut c_void,
}

#[repr(C)]
pub struct CallFrame {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub api: *const Api,
    pub ctx: *mut c_void,
    pub stage: i32,
    pub args: List,
    pub rets: List,
    pub attrs: Attrs,
    pub future: *mut c_void,
}

#[repr(C)]
pub struct Metadata {
    pub struct_size: usize,
    pub api_version: ApiVersion,
    pub traits: u32,
    pub state_type_id: i64,
}

#[repr(C)]
pub struct MetadataExtension {
    pub extension_base: ExtensionBase,
    pub metadata: *mut Metadata,
}

/// `XLA_FFI_CallFrame_STRUCT_SIZE`: up to and including `attrs`.
const CALL_FRAME_SIZE: usize = std::mem::offset_of!(CallFrame, future);
/// The struct sizes of the metadata query (offset of the last field plus its size).
const METADATA_SIZE: usize = std::mem::offset_of!(Metadata, traits) + 4;
/// The size of a metadata struct that has `state_type_id` (a newer XLA's).
const METADATA_STATE_SIZE: usize = std::mem::offset_of!(Metadata, state_type_id) + 8;
const METADATA_EXTENSION_SIZE: usize = std::mem::size_of::<MetadataExtension>();
const API_VERSION_SIZE: usize = std::mem::offset_of!(ApiVersion, minor_version) + 4;
const BUFFER_SIZE: usize = std::mem::size_of::<Buffer>();

/// XLA's element types rivet has (`XLA_FFI_DataType`).
fn dtype_of(code: i32) -> Option<DType> {
    Some(match code {
        1 => DType::Bool,
        2 => DType::I8,
        3 => DType::I16,
        4 => DType::I32,
        5 => DType::I64,
        6 => DType::U8,
        7 => DType::U16,
        8 => DType::U32,
        9 => DType::U64,
        10 => DType::F16,
        11 => DType::F32,
        12 => DType::F64,
        16 => DType::BF16,
        _ => return None,
    })
}

/// Which of XLA's platforms a handler serves: where its buffers live and what it asks XLA for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Platform {
    Cpu,
    Cuda,
}

/// The handler XLA's CPU platform calls (`XLA_FFI_Handler*`). NULL means success.
///
/// # Safety
/// `frame` must be a call frame made by XLA (or NULL, which is refused as best it can be).
#[no_mangle]
pub unsafe extern "C" fn rivet_xla_ffi_handler(frame: *mut CallFrame) -> *mut c_void {
    // SAFETY: the caller's promise.
    unsafe { entry(frame, Platform::Cpu) }
}

/// The handler XLA's CUDA platform calls: the buffers are device memory on XLA's device for
/// the call, and the function runs on XLA's stream (module header). NULL means success.
///
/// # Safety
/// As [`rivet_xla_ffi_handler`].
#[no_mangle]
pub unsafe extern "C" fn rivet_xla_ffi_handler_cuda(frame: *mut CallFrame) -> *mut c_void {
    // SAFETY: the caller's promise.
    unsafe { entry(frame, Platform::Cuda) }
}

/// # Safety
/// As [`rivet_xla_ffi_handler`].
unsafe fn entry(frame: *mut CallFrame, platform: Platform) -> *mut c_void {
    if frame.is_null() {
        // No API table to create an error with: nothing to report through.
        return std::ptr::null_mut();
    }
    // SAFETY: non-null, and XLA's promise that it is a call frame.
    let frame = unsafe { &mut *frame };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: XLA's frame, read defensively inside.
        unsafe { handle(frame, platform) }
    }))
    .unwrap_or_else(|_| Err(Error::Internal("panic in the rivet XLA FFI handler".into())));
    match outcome {
        Ok(()) => std::ptr::null_mut(),
        // SAFETY: as above.
        Err(e) => unsafe { xla_error(frame.api, &e) },
    }
}

/// Builds an `XLA_FFI_Error` carrying `e` (XLA copies the message).
///
/// # Safety
/// `api` must be NULL or XLA's API table.
unsafe fn xla_error(api: *const Api, e: &Error) -> *mut c_void {
    // SAFETY: the caller's promise; the size check keeps the read inside the table.
    let create = unsafe {
        match api.as_ref() {
            Some(a) if a.has(std::mem::offset_of!(Api, error_create)) => a.error_create,
            _ => None,
        }
    };
    let Some(create) = create else {
        // No way to report: a NULL error would read as success, so fail loudly instead.
        eprintln!("rivet: XLA FFI handler error with no API table to report it: {e}");
        std::process::abort();
    };
    let message = CString::new(format!("rivet {}: {e}", e.kind_name()).replace('\0', " "))
        .expect("NULs replaced");
    let mut args = ErrorCreateArgs {
        struct_size: ERROR_CREATE_ARGS_SIZE,
        extension_start: std::ptr::null_mut(),
        message: message.as_ptr(),
        errc: match e {
            Error::Internal(_) => ERRC_INTERNAL,
            _ => ERRC_INVALID_ARGUMENT,
        },
    };
    // SAFETY: XLA's Error_Create with well-formed arguments; it copies the message.
    unsafe { create(&mut args) }
}

/// # Safety
/// `frame` is XLA's.
unsafe fn handle(frame: &mut CallFrame, platform: Platform) -> Result<()> {
    let bad = |m: String| Error::Argument(format!("malformed XLA FFI call frame: {m}"));
    if frame.struct_size < CALL_FRAME_SIZE {
        return Err(bad(format!(
            "struct_size {} < {CALL_FRAME_SIZE}",
            frame.struct_size
        )));
    }
    // The registration-time query of the handler's API version and traits.
    // SAFETY: a non-null extension is XLA's; its type says which extension it is.
    if let Some(ext) = unsafe { frame.extension_start.as_ref() } {
        if ext.type_ == EXTENSION_METADATA {
            if ext.struct_size < METADATA_EXTENSION_SIZE {
                return Err(bad("metadata extension too small".into()));
            }
            // SAFETY: the type tag says this is a metadata extension; its size is checked.
            let ext = unsafe { &mut *(frame.extension_start as *mut MetadataExtension) };
            // SAFETY: XLA's metadata struct, size checked before the write.
            let md = unsafe { ext.metadata.as_mut() }.ok_or_else(|| bad("NULL metadata".into()))?;
            if md.struct_size < METADATA_SIZE {
                return Err(bad("metadata struct too small".into()));
            }
            md.api_version = ApiVersion {
                struct_size: API_VERSION_SIZE,
                extension_start: std::ptr::null_mut(),
                major_version: API_MAJOR,
                minor_version: API_MINOR,
            };
            md.traits = 0;
            // An older XLA's metadata ends at `traits`: nothing is written past its size.
            if md.struct_size >= METADATA_STATE_SIZE {
                md.state_type_id = 0;
            }
            return Ok(());
        }
    }
    if frame.stage != STAGE_EXECUTE {
        // Registered for execution only; other stages have nothing to do.
        return Ok(());
    }
    // The function is looked up by name on every call (no per-call-site state): about 33 ns
    // of a jitted call's 6 us, see the module header.
    // SAFETY: XLA's attribute list, read within its checked count.
    let name = unsafe { function_attr(&frame.attrs) }?;
    let f = registry::get(name)?;
    let (device, stream) = match platform {
        Platform::Cpu => (Device::Cpu, None),
        // SAFETY: XLA's API table and execution context.
        Platform::Cuda => unsafe { cuda_context(frame.api, frame.ctx) }?,
    };
    let mut values = Vec::new();
    // SAFETY: XLA's argument and result lists.
    unsafe {
        buffers(&frame.args, true, device, &mut values, "argument")?;
        buffers(&frame.rets, false, device, &mut values, "result")?;
    }
    let result = match stream {
        None => f.call(&values)?,
        Some(s) => crate::stream::with_call_stream(Some(s), || f.call(&values))?,
    };
    match result {
        Value::Null => Ok(()),
        other => Err(Error::Argument(format!(
            "{}: returned a {} where an XLA custom call expects the results written in place; wrap a function that takes its outputs as arguments (compiled rivet functions do)",
            f.name(),
            other.kind()
        ))),
    }
}

/// The CUDA device and stream XLA runs this call on (`XLA_FFI_DeviceOrdinal_Get`,
/// `XLA_FFI_Stream_Get`: a `CUstream`, NULL meaning the legacy default stream).
///
/// # Safety
/// `api` is NULL or XLA's table; `ctx` XLA's execution context for the call.
unsafe fn cuda_context(api: *const Api, ctx: *mut c_void) -> Result<(Device, Option<u64>)> {
    // SAFETY: the caller's promise.
    let api = unsafe { api.as_ref() }
        .ok_or_else(|| Error::Argument("malformed XLA FFI call frame: NULL API table".into()))?;
    let missing = |what: &str| {
        Error::Device(format!(
            "the XLA FFI API table (version {}.{}, {} bytes) has no {what}, which rivet's CUDA handler needs; use a newer jaxlib (XLA FFI API >= 0.3)",
            api.api_version.major_version, api.api_version.minor_version, api.struct_size
        ))
    };
    let ordinal_get =
        entry!(api, device_ordinal_get).ok_or_else(|| missing("XLA_FFI_DeviceOrdinal_Get"))?;
    let stream_get = entry!(api, stream_get).ok_or_else(|| missing("XLA_FFI_Stream_Get"))?;
    let mut ord = DeviceOrdinalGetArgs {
        struct_size: std::mem::offset_of!(DeviceOrdinalGetArgs, device_ordinal) + 4,
        extension_start: std::ptr::null_mut(),
        ctx,
        device_ordinal: -1,
    };
    // SAFETY: XLA's entry with well-formed arguments.
    let err = unsafe { ordinal_get(&mut ord) };
    // SAFETY: `err` is NULL or XLA's error, from this table.
    unsafe { xla_failure(api, err, "XLA_FFI_DeviceOrdinal_Get") }?;
    if ord.device_ordinal < 0 {
        return Err(Error::Device(format!(
            "XLA_FFI_DeviceOrdinal_Get gave device ordinal {}",
            ord.device_ordinal
        )));
    }
    let mut st = StreamGetArgs {
        struct_size: std::mem::size_of::<StreamGetArgs>(),
        extension_start: std::ptr::null_mut(),
        ctx,
        stream: std::ptr::null_mut(),
    };
    // SAFETY: as above.
    let err = unsafe { stream_get(&mut st) };
    // SAFETY: as above.
    unsafe { xla_failure(api, err, "XLA_FFI_Stream_Get") }?;
    Ok((Device::Cuda(ord.device_ordinal), Some(st.stream as u64)))
}

/// `Ok` for a NULL error; otherwise XLA's message as a rivet error, the error destroyed.
///
/// # Safety
/// `err` is NULL or an `XLA_FFI_Error` made by `api`'s XLA.
unsafe fn xla_failure(api: &Api, err: *mut c_void, what: &str) -> Result<()> {
    if err.is_null() {
        return Ok(());
    }
    let mut message = String::from("(no message: the API table has no XLA_FFI_Error_GetMessage)");
    if let Some(get) = entry!(api, error_get_message) {
        let mut args = ErrorGetMessageArgs {
            struct_size: std::mem::size_of::<ErrorGetMessageArgs>(),
            extension_start: std::ptr::null_mut(),
            error: err,
            message: std::ptr::null(),
        };
        // SAFETY: XLA's entry with its own error.
        unsafe { get(&mut args) };
        if !args.message.is_null() {
            // SAFETY: a NUL-terminated message owned by the error, read before it is destroyed.
            message = unsafe { std::ffi::CStr::from_ptr(args.message) }
                .to_string_lossy()
                .into_owned();
        }
    }
    if let Some(destroy) = entry!(api, error_destroy) {
        let mut args = ErrorDestroyArgs {
            struct_size: std::mem::size_of::<ErrorDestroyArgs>(),
            extension_start: std::ptr::null_mut(),
            error: err,
        };
        // SAFETY: XLA's entry, its own error, destroyed once.
        unsafe { destroy(&mut args) };
    }
    Err(Error::Device(format!("{what} failed: {message}")))
}

/// The value of the `rivet_function` string attribute, borrowed from the frame (no copy).
///
/// # Safety
/// `attrs` is XLA's, its strings alive as long as it is borrowed (the call).
unsafe fn function_attr(attrs: &Attrs) -> Result<&str> {
    let missing = || {
        Error::Argument(format!(
            "the XLA custom call has no string attribute '{FUNCTION_ATTR}' naming the rivet function to run (call it through rivet.jax.ffi_func)"
        ))
    };
    if !(0..=MAX_COUNT).contains(&attrs.size)
        || attrs.size > 0
            && (attrs.types.is_null() || attrs.names.is_null() || attrs.attrs.is_null())
    {
        return Err(Error::Argument(format!(
            "malformed XLA FFI attributes (size {})",
            attrs.size
        )));
    }
    for i in 0..attrs.size as usize {
        // SAFETY: i < size, the arrays hold `size` entries.
        let (ty, name, value) = unsafe {
            (
                *attrs.types.add(i),
                *attrs.names.add(i),
                *attrs.attrs.add(i),
            )
        };
        // SAFETY: XLA's byte spans.
        let Some(name) = (unsafe { span(name) }) else {
            continue;
        };
        if name != FUNCTION_ATTR.as_bytes() {
            continue;
        }
        if ty != ATTR_STRING {
            return Err(Error::Argument(format!(
                "the XLA attribute '{FUNCTION_ATTR}' must be a string, got attribute type {ty}"
            )));
        }
        // SAFETY: a string attribute is a byte span.
        let bytes = unsafe { span(value as *mut ByteSpan) }.ok_or_else(missing)?;
        return std::str::from_utf8(bytes).map_err(|_| {
            Error::Argument(format!("the XLA attribute '{FUNCTION_ATTR}' is not UTF-8"))
        });
    }
    Err(missing())
}

/// # Safety
/// `s` NULL or a valid byte span.
unsafe fn span<'a>(s: *mut ByteSpan) -> Option<&'a [u8]> {
    // SAFETY: the caller's promise.
    let s = unsafe { s.as_ref() }?;
    if s.len == 0 {
        return Some(&[]);
    }
    if s.ptr.is_null() || s.len > isize::MAX as usize {
        return None;
    }
    // SAFETY: a valid span of `len` bytes.
    Some(unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) })
}

/// Appends one borrowed view per buffer of `list` to `out`, on `device`.
///
/// # Safety
/// `list` is XLA's.
unsafe fn buffers(
    list: &List,
    read_only: bool,
    device: Device,
    out: &mut Vec<Value>,
    what: &str,
) -> Result<()> {
    if !(0..=MAX_COUNT).contains(&list.size)
        || list.size > 0 && (list.types.is_null() || list.items.is_null())
    {
        return Err(Error::Argument(format!(
            "malformed XLA FFI {what} list (size {})",
            list.size
        )));
    }
    for i in 0..list.size as usize {
        // SAFETY: i < size.
        let (ty, item) = unsafe { (*list.types.add(i), *list.items.add(i)) };
        if ty != ARG_BUFFER {
            return Err(Error::Argument(format!(
                "XLA {what} {i}: expected a buffer, got type {ty} (tokens are not rivet tensors)"
            )));
        }
        // SAFETY: a buffer-typed entry points at an XLA_FFI_Buffer.
        let b = unsafe { (item as *const Buffer).as_ref() }
            .ok_or_else(|| Error::Argument(format!("XLA {what} {i}: NULL buffer")))?;
        if b.struct_size < BUFFER_SIZE {
            return Err(Error::Argument(format!(
                "XLA {what} {i}: buffer struct too small ({} bytes, expected {BUFFER_SIZE})",
                b.struct_size
            )));
        }
        let dtype = dtype_of(b.dtype).ok_or_else(|| {
            Error::DType(format!(
                "XLA {what} {i}: element type {} (XLA_FFI_DataType) has no rivet dtype",
                b.dtype
            ))
        })?;
        if !(0..=layout::MAX_NDIM as i64).contains(&b.rank) || b.rank > 0 && b.dims.is_null() {
            return Err(Error::Argument(format!(
                "XLA {what} {i}: rank {}{}; expected 0..={}",
                b.rank,
                if b.rank > 0 && b.dims.is_null() {
                    " with NULL dims"
                } else {
                    ""
                },
                layout::MAX_NDIM
            )));
        }
        let shape: Dims = if b.rank == 0 {
            Dims::new()
        } else {
            // SAFETY: `rank` dims.
            Dims::from_slice(unsafe { std::slice::from_raw_parts(b.dims, b.rank as usize) })
        };
        let strides = layout::compact_strides(&shape);
        // SAFETY: XLA keeps the buffer alive for the call, compact row-major; the view is
        // validated by `from_raw_parts` and dies with the call (it is borrowed).
        let t = unsafe {
            Tensor::from_raw_parts(
                (),
                b.data as *mut u8,
                0,
                shape,
                strides,
                dtype,
                device,
                read_only,
            )
        }
        .map_err(|e| e.context(&format!("XLA {what} {i}: ")))?;
        out.push(Value::Tensor(t));
    }
    Ok(())
}
