//! The producer side of DLPack's C exchange API: `rivet.Tensor.__dlpack_c_exchange_api__`,
//! a PyCapsule named `dlpack_exchange_api` on the type, pointing at one static
//! `DLPackExchangeAPI` table. Consumers that read it (tvm-ffi, rivet itself for torch
//! tensors, any C extension) import rivet tensors with no Python call and no capsule.
//!
//! Invariants:
//! - The table is a `static`: it lives for the whole process, as DLPack requires.
//! - Every export is a `DLManagedTensorVersioned` of the runtime (`dlpack::export_versioned`):
//!   no copy, the read-only flag kept, the rivet tensor's memory held until the consumer
//!   calls the deleter. The deleter is wrapped to count live exports (`_exchange_api_stats`).
//! - `dltensor_from_py_object_no_sync` (the borrowed, allocation-free DLTensor) is NULL on
//!   purpose: a bare `DLTensor` cannot carry the read-only flag, so a consumer could write
//!   into a read-only rivet tensor (a view of a jax array) without knowing. Consumers fall
//!   back to the managed export, which carries it (tvm-ffi only uses that one anyway).
//! - The functions taking a Python object are called with the GIL held (the API's
//!   contract); they check the object's type anyway and raise `TypeError` for a stranger,
//!   since a wrong cast here would be memory corruption, not an error message.
//! - No function unwinds: every failure is a -1 with a Python exception set (or `SetError`).
//! - CUDA: rivet has no current stream of its own; it launches on the legacy default stream
//!   unless told otherwise, so that is what `current_work_stream` answers, and an export
//!   makes that stream wait for the tensor's completion event (never a synchronisation).

use crate::tensor::PyTensor;
use dlpack_rs::ffi::{
    DLDeviceType, DLManagedTensorVersioned, DLPackExchangeAPI, DLPackExchangeAPIHeader, DLTensor,
};
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use rivet_runtime::{dlpack, stream as streams, DType, Device, Error, Tensor};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The capsule name DLPack fixes for the table.
pub const CAPSULE_NAME: &CStr = c"dlpack_exchange_api";

/// The table behind a type that is `Sync` (it holds a raw pointer, `prev_api`, always NULL).
struct Table(DLPackExchangeAPI);
// SAFETY: the table is immutable after initialisation and holds only function pointers and
// a NULL `prev_api`; sharing it between threads is sharing constants.
unsafe impl Sync for Table {}

static API: Table = Table(DLPackExchangeAPI {
    header: DLPackExchangeAPIHeader {
        version: dlpack::VERSION,
        prev_api: std::ptr::null_mut(),
    },
    managed_tensor_allocator: Some(allocator),
    managed_tensor_from_py_object_no_sync: Some(from_py_object),
    managed_tensor_to_py_object_no_sync: Some(to_py_object),
    dltensor_from_py_object_no_sync: None,
    current_work_stream: Some(current_work_stream),
});

/// Calls through each entry, and exports not yet deleted: how tests prove a consumer took
/// the C path (and released what it took). Relaxed counters: only read for diagnostics.
static FROM_PY: AtomicU64 = AtomicU64::new(0);
static TO_PY: AtomicU64 = AtomicU64::new(0);
static ALLOC: AtomicU64 = AtomicU64::new(0);
static STREAM: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicU64 = AtomicU64::new(0);

type Deleter = unsafe extern "C" fn(*mut DLManagedTensorVersioned);
/// The runtime's deleter of versioned exports (one function for all of them).
static RUNTIME_DELETER: OnceLock<Deleter> = OnceLock::new();

/// The class attribute: a capsule on the static table (no destructor: nothing to free).
pub fn capsule(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let p = &API.0 as *const DLPackExchangeAPI as *mut c_void;
    // SAFETY: `p` points at a static that outlives every capsule; consumers only read it
    // (the `*mut` is the C signature's, not a licence to write); the name is 'static.
    let cap = unsafe { ffi::PyCapsule_New(p, CAPSULE_NAME.as_ptr(), None) };
    if cap.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}

/// `_native._exchange_api_stats()`: calls through each entry, and live exports, by name.
#[pyfunction]
pub fn _exchange_api_stats() -> std::collections::BTreeMap<&'static str, u64> {
    [
        ("managed_tensor_from_py_object_no_sync", &FROM_PY),
        ("managed_tensor_to_py_object_no_sync", &TO_PY),
        ("managed_tensor_allocator", &ALLOC),
        ("current_work_stream", &STREAM),
        ("live_exports", &LIVE),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.load(Ordering::Relaxed)))
    .collect()
}

/// A runtime export whose deleter also counts it out of `LIVE`.
fn counted_export(t: &Tensor) -> *mut DLManagedTensorVersioned {
    let p = dlpack::export_versioned(t);
    // SAFETY: `p` is a fresh, valid export that nobody else has seen yet.
    unsafe {
        if let Some(d) = (*p).deleter {
            RUNTIME_DELETER.get_or_init(|| d);
        }
        (*p).deleter = Some(counted_delete);
    }
    LIVE.fetch_add(1, Ordering::Relaxed);
    p
}

unsafe extern "C" fn counted_delete(p: *mut DLManagedTensorVersioned) {
    if p.is_null() {
        return;
    }
    LIVE.fetch_sub(1, Ordering::Relaxed);
    if let Some(d) = RUNTIME_DELETER.get() {
        // SAFETY: `p` came from `counted_export`, whose original deleter is `d` (set before
        // the export left this file); the consumer calls us once, so `d` runs once.
        unsafe { d(p) }
    }
}

/// Raises `err` as the current Python exception (the GIL is held by the API's contract).
fn raise(err: PyErr) -> c_int {
    // SAFETY: every entry taking or making a Python object is called with the GIL held.
    let py = unsafe { Python::assume_attached() };
    err.restore(py);
    -1
}

/// `managed_tensor_from_py_object_no_sync`: an owning export of a `rivet.Tensor`.
unsafe extern "C" fn from_py_object(
    obj: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> c_int {
    FROM_PY.fetch_add(1, Ordering::Relaxed);
    // SAFETY: called with the GIL held (the API's contract).
    let py = unsafe { Python::assume_attached() };
    if obj.is_null() || out.is_null() {
        return raise(PyTypeError::new_err(
            "rivet.Tensor's DLPack exchange API: managed_tensor_from_py_object_no_sync was given a NULL pointer",
        ));
    }
    // SAFETY: a live object per the contract (non-NULL, checked above); borrowed, not stolen.
    let obj = unsafe { Bound::from_borrowed_ptr(py, obj as *mut ffi::PyObject) };
    let Ok(t) = obj.cast_exact::<PyTensor>() else {
        return raise(PyTypeError::new_err(format!(
            "rivet.Tensor's DLPack exchange API was given a {}; it exports rivet.Tensor only",
            obj.get_type()
                .fully_qualified_name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )));
    };
    let t = t.get();
    // The consumer launches on `current_work_stream` (the legacy default stream) and is
    // not synchronised by us: rivet's last work on the tensor goes before that stream.
    if let Err(e) = t.order_for_consumer(None) {
        return raise(crate::errors::to_pyerr(py, e));
    }
    // SAFETY: `out` is non-NULL (checked); the consumer now owns the export.
    unsafe { *out = counted_export(&t.tensor) };
    0
}

/// `managed_tensor_to_py_object_no_sync`: a `rivet.Tensor` owning the given export (stolen,
/// and deleted on failure too).
unsafe extern "C" fn to_py_object(
    tensor: *mut DLManagedTensorVersioned,
    out: *mut *mut c_void,
) -> c_int {
    TO_PY.fetch_add(1, Ordering::Relaxed);
    // SAFETY: called with the GIL held (the API's contract).
    let py = unsafe { Python::assume_attached() };
    // SAFETY: the caller hands over a valid, unconsumed managed tensor (or NULL, refused by
    // `import_versioned`, which runs the deleter on every path once it has the pointer).
    let imported = unsafe { dlpack::import_versioned(tensor) };
    if out.is_null() {
        return raise(PyTypeError::new_err(
            "rivet.Tensor's DLPack exchange API: managed_tensor_to_py_object_no_sync was given a NULL out pointer",
        ));
    }
    let made = imported
        .map_err(|e| crate::errors::to_pyerr(py, e))
        .and_then(|t| Py::new(py, PyTensor::new(t)));
    match made {
        Ok(obj) => {
            // SAFETY: `out` is non-NULL (checked); it receives a new reference.
            unsafe { *out = obj.into_ptr() as *mut c_void };
            0
        }
        Err(e) => raise(e),
    }
}

/// `managed_tensor_allocator`: a new tensor in rivet's memory shaped as `prototype` (its
/// dtype, ndim, shape and device only). Errors go through `set_error`, not Python.
unsafe extern "C" fn allocator(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char)>,
) -> c_int {
    ALLOC.fetch_add(1, Ordering::Relaxed);
    let fail = |kind: &str, msg: String| {
        if let Some(f) = set_error {
            let kind = CString::new(kind).unwrap_or_default();
            let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
            // SAFETY: the consumer's callback with its own context; the strings live for
            // the call (callers copy them, per the API).
            unsafe { f(error_ctx, kind.as_ptr(), msg.as_ptr()) };
        }
        -1
    };
    if prototype.is_null() || out.is_null() {
        return fail(
            "ValueError",
            "rivet.Tensor's DLPack exchange API: managed_tensor_allocator was given a NULL pointer"
                .into(),
        );
    }
    // SAFETY: non-NULL (checked) and valid for the call, per the API.
    let proto = unsafe { &*prototype };
    match allocate(proto) {
        Ok(t) => {
            // SAFETY: `out` is non-NULL (checked); the consumer owns the export.
            unsafe { *out = counted_export(&t) };
            0
        }
        Err(e) => fail(e.kind_name(), format!("managed_tensor_allocator: {e}")),
    }
}

/// The tensor `allocator` hands out, validated as any DLPack import is.
fn allocate(proto: &DLTensor) -> Result<Tensor, Error> {
    if proto.ndim < 0 || proto.ndim > dlpack::MAX_NDIM {
        return Err(Error::DLPack(format!(
            "prototype has ndim {}; expected 0..={}",
            proto.ndim,
            dlpack::MAX_NDIM
        )));
    }
    if proto.ndim > 0 && proto.shape.is_null() {
        return Err(Error::DLPack(format!(
            "prototype has ndim {} but a NULL shape",
            proto.ndim
        )));
    }
    let shape: Vec<i64> = if proto.ndim == 0 {
        Vec::new()
    } else {
        // SAFETY: the consumer promises `shape` holds `ndim` entries (non-NULL, checked).
        unsafe { std::slice::from_raw_parts(proto.shape, proto.ndim as usize) }.to_vec()
    };
    let dtype = DType::from_dlpack(proto.dtype)?;
    match Device::from_dlpack(proto.device)? {
        Device::Cpu => Tensor::zeros(&shape, dtype),
        Device::Cuda(o) => rivet_compiler::codegen::cuda::driver::alloc_tensor(
            o as usize,
            &shape,
            dtype,
            streams::LEGACY,
            false,
        )
        .map_err(Error::from),
        other => Err(Error::Device(format!(
            "rivet cannot allocate on {other}; expected a CPU or CUDA prototype"
        ))),
    }
}

/// `current_work_stream`: NULL on the CPU; the legacy default stream on CUDA (where rivet
/// launches when no stream is given).
unsafe extern "C" fn current_work_stream(
    device_type: DLDeviceType::Type,
    _device_id: i32,
    out: *mut *mut c_void,
) -> c_int {
    STREAM.fetch_add(1, Ordering::Relaxed);
    if out.is_null() {
        return raise(PyTypeError::new_err(
            "rivet.Tensor's DLPack exchange API: current_work_stream was given a NULL out pointer",
        ));
    }
    let s = if device_type == DLDeviceType::kDLCUDA {
        streams::LEGACY as usize as *mut c_void
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: `out` is non-NULL (checked).
    unsafe { *out = s };
    0
}
