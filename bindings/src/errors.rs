//! Mapping of `rivet_runtime::Error` to the Python exception classes of `rivet.error`.
//! A `Foreign` error that carries a Python exception is re-raised as that very exception
//! (same type, same traceback).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use rivet_runtime::{Error, ForeignError};
use std::sync::Arc;

/// A Python exception travelling through Rust inside `Error::Foreign`.
pub struct PyErrPayload(pub PyErr);

static ERROR_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

pub fn to_pyerr(py: Python<'_>, e: Error) -> PyErr {
    if let Error::Foreign(f) = &e {
        if let Some(p) = f.payload.downcast_ref::<PyErrPayload>() {
            return p.0.clone_ref(py);
        }
    }
    let module = ERROR_MODULE.get_or_try_init(py, || py.import("rivet.error").map(|m| m.unbind()));
    let class = module.and_then(|m| m.bind(py).getattr(e.kind_name()));
    match class {
        Ok(cls) => match cls.call1((e.to_string(),)) {
            Ok(inst) => PyErr::from_value(inst),
            Err(err) => err,
        },
        Err(err) => err,
    }
}

/// Wraps a Python exception so it can cross Rust frames and come back out unchanged.
pub fn from_pyerr(_py: Python<'_>, err: PyErr) -> Error {
    let message = err.to_string();
    Error::Foreign(ForeignError {
        message,
        payload: Arc::new(PyErrPayload(err)),
    })
}

/// `Result<T, Error>` -> `PyResult<T>`.
pub trait IntoPyResult<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_pyerr(py, e))
    }
}

/// `rivet_compiler::Result<T>` -> `PyResult<T>` (through `rivet_runtime::Error`).
pub trait CompileResult<T> {
    fn cpy(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> CompileResult<T> for Result<T, rivet_compiler::Error> {
    fn cpy(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_pyerr(py, e.into()))
    }
}
