//! `PyKeepalive`: a Python object that keeps a tensor view's memory alive (a torch tensor
//! read through the DLPack exchange API, a `__cuda_array_interface__` producer), and
//! `release`, how it and the other Python objects rivet's Rust values hold are let go.
//!
//! Invariant: the reference is released with the GIL really held. pyo3 decides whether it
//! holds the GIL from its own per-thread count, and that count can be stale: torch releases
//! the GIL while it destroys a tensor (`THPVariable_clear`), and if the storage it frees is
//! rivet's export of a view over another torch tensor, the view drops inside torch's
//! destructor, under pyo3's count from the outer `tp_dealloc`, without the GIL. A plain
//! `Py` decref there aborts the interpreter (rivet -> torch -> rivet -> torch -> rivet, then
//! `del`). So the release asks CPython (`PyGILState_Ensure`), which takes the GIL back when
//! this thread released it and is a no-op when it holds it.

use pyo3::ffi;
use pyo3::prelude::*;
use std::mem::ManuallyDrop;

pub struct PyKeepalive(ManuallyDrop<Py<PyAny>>);

impl PyKeepalive {
    pub fn new(obj: Py<PyAny>) -> PyKeepalive {
        PyKeepalive(ManuallyDrop::new(obj))
    }
}

impl Drop for PyKeepalive {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is never used again.
        release(unsafe { ManuallyDrop::take(&mut self.0) });
    }
}

/// Releases `obj` with the GIL really held (the module header says why `Py`'s own drop is
/// not enough); also used for the Python callables packed functions hold (`gc::PyCallable`).
pub fn release(obj: Py<PyAny>) {
    let p = obj.into_ptr();
    // SAFETY: `p` is a strong reference we own. During interpreter finalization nothing may
    // run Python code: the reference is leaked then (the process is ending).
    unsafe {
        if ffi::Py_IsInitialized() == 0 {
            return;
        }
        let state = ffi::PyGILState_Ensure();
        ffi::Py_DECREF(p);
        ffi::PyGILState_Release(state);
    }
}
