//! DLPack capsules (PEP-less but standard protocol): creating `dltensor[_versioned]`
//! capsules for exports and consuming them for imports.
//!
//! Invariants: a capsule we create calls its managed tensor's deleter in its destructor only
//! while it still bears its original name (an unconsumed capsule); a consumer renames it to
//! `used_dltensor[_versioned]` and takes over the deleter. A capsule is consumed at most once:
//! a used one is refused with `Error::DLPack`.

use dlpack_rs::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use pyo3::ffi;
use pyo3::prelude::*;
use rivet_runtime::{dlpack, Error, Result, Tensor};
use std::ffi::{c_void, CStr};

const VERSIONED: &CStr = c"dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const USED_LEGACY: &CStr = c"used_dltensor";

unsafe extern "C" fn destroy_versioned(cap: *mut ffi::PyObject) {
    // SAFETY: called by Python on our capsule; IsValid/GetPointer do not raise for a match.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, VERSIONED.as_ptr()) == 1 {
            let p =
                ffi::PyCapsule_GetPointer(cap, VERSIONED.as_ptr()) as *mut DLManagedTensorVersioned;
            if let Some(d) = (*p).deleter {
                d(p)
            }
        }
    }
}

unsafe extern "C" fn destroy_legacy(cap: *mut ffi::PyObject) {
    // SAFETY: as in destroy_versioned.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, LEGACY.as_ptr()) as *mut DLManagedTensor;
            if let Some(d) = (*p).deleter {
                d(p)
            }
        }
    }
}

/// Wraps a fresh export in a capsule; on failure the export is deleted.
fn new_capsule(
    py: Python<'_>,
    p: *mut c_void,
    name: &'static CStr,
    destroy: ffi::PyCapsule_Destructor,
) -> PyResult<Py<PyAny>> {
    // SAFETY: p is a valid managed tensor we own; the name is 'static.
    let cap = unsafe { ffi::PyCapsule_New(p, name.as_ptr(), Some(destroy)) };
    if cap.is_null() {
        // SAFETY: the capsule was not created, so we still own p; call its deleter.
        unsafe {
            if name == VERSIONED {
                let m = p as *mut DLManagedTensorVersioned;
                if let Some(d) = (*m).deleter {
                    d(m)
                }
            } else {
                let m = p as *mut DLManagedTensor;
                if let Some(d) = (*m).deleter {
                    d(m)
                }
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: cap is a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}

/// A legacy capsule even for a read-only tensor: only for consumers that never write (JAX).
pub fn export_for_immutable_consumer(py: Python<'_>, t: &Tensor) -> PyResult<Py<PyAny>> {
    let p = dlpack::export_legacy_for_immutable_consumer(t);
    new_capsule(py, p as *mut c_void, LEGACY, destroy_legacy)
}

pub fn export(py: Python<'_>, t: &Tensor, versioned: bool) -> PyResult<Py<PyAny>> {
    if versioned {
        new_capsule(
            py,
            dlpack::export_versioned(t) as *mut c_void,
            VERSIONED,
            destroy_versioned,
        )
    } else {
        let p = dlpack::export_legacy(t).map_err(|e| crate::errors::to_pyerr(py, e))?;
        new_capsule(py, p as *mut c_void, LEGACY, destroy_legacy)
    }
}

/// True when `obj` is a capsule (any name).
pub fn is_capsule(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: type check on a live object.
    unsafe { ffi::PyCapsule_CheckExact(obj.as_ptr()) == 1 }
}

/// Consumes a DLPack capsule: renames it `used_*` and imports the tensor (the deleter now
/// belongs to the returned tensor). `read_only` marks legacy tensors known to be immutable.
pub fn consume(obj: &Bound<'_, PyAny>, read_only: bool) -> Result<Tensor> {
    let cap = obj.as_ptr();
    // SAFETY: `cap` is a live capsule (checked by the caller); IsValid never raises; the
    // pointer is taken and the capsule renamed under the GIL, so no one else can consume it.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, VERSIONED.as_ptr()) == 1 {
            let p =
                ffi::PyCapsule_GetPointer(cap, VERSIONED.as_ptr()) as *mut DLManagedTensorVersioned;
            if ffi::PyCapsule_SetName(cap, USED_VERSIONED.as_ptr()) != 0 {
                ffi::PyErr_Clear();
                return Err(Error::DLPack(
                    "could not mark the DLPack capsule as used".into(),
                ));
            }
            let t = dlpack::import_versioned(p)?;
            return Ok(if read_only { t.to_read_only() } else { t });
        }
        if ffi::PyCapsule_IsValid(cap, LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, LEGACY.as_ptr()) as *mut DLManagedTensor;
            if ffi::PyCapsule_SetName(cap, USED_LEGACY.as_ptr()) != 0 {
                ffi::PyErr_Clear();
                return Err(Error::DLPack(
                    "could not mark the DLPack capsule as used".into(),
                ));
            }
            return dlpack::import_legacy(p, read_only);
        }
        let name = ffi::PyCapsule_GetName(cap);
        ffi::PyErr_Clear();
        let name = if name.is_null() {
            "<unnamed>".to_string()
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        };
        if name == "used_dltensor" || name == "used_dltensor_versioned" {
            Err(Error::DLPack(
                "this DLPack capsule was already consumed (a capsule can be used once); call __dlpack__() again for a new one".into(),
            ))
        } else {
            Err(Error::DLPack(format!(
                "capsule named '{name}' is not a DLPack capsule; expected 'dltensor_versioned' or 'dltensor'"
            )))
        }
    }
}
