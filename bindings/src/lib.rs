//! `rivet._native`: the thin pyo3 layer of the `rivet` Python package. Logic lives in
//! `rivet-runtime` (and later `rivet-compiler`); this crate only converts between Python
//! objects and runtime values, and maps errors to the classes of `rivet/error.py`.

mod capsule;
mod convert;
mod cuda;
mod errors;
mod exchange;
mod function;
mod gc;
mod ipc;
mod keepalive;
mod kernels;
mod te;
mod tensor;

use pyo3::prelude::*;

/// The runtime's host-lock hook: release the GIL around `f` if this thread holds it.
fn run_without_gil(f: &mut dyn FnMut()) {
    /// `f` runs on this very thread inside `detach`, so sending it is a formality.
    struct OnThisThread<'a>(&'a mut dyn FnMut());
    // SAFETY: `detach` runs the closure on the calling thread before returning.
    unsafe impl Send for OnThisThread<'_> {}
    if attached() {
        let job = OnThisThread(f);
        // SAFETY: this thread holds the GIL (checked above).
        let py = unsafe { Python::assume_attached() };
        py.detach(move || {
            let job = job;
            (job.0)()
        });
    } else {
        f()
    }
}

/// Whether this thread holds the GIL (is attached to the interpreter).
#[cfg(not(feature = "abi3"))]
fn attached() -> bool {
    // SAFETY: PyGILState_Check only reads the calling thread's state.
    unsafe { pyo3::ffi::PyGILState_Check() == 1 }
}

/// Whether this thread holds the GIL. The limited API has no `PyGILState_Check`;
/// `PyThreadState_GetDict` is NULL exactly when the thread has no current thread state
/// (documented: no exception is set then).
#[cfg(feature = "abi3")]
fn attached() -> bool {
    // SAFETY: reads the calling thread's current state; never raises.
    !unsafe { pyo3::ffi::PyThreadState_GetDict() }.is_null()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    rivet_runtime::host_lock::set_host_lock_hook(run_without_gil);
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<function::PyFunction>()?;
    m.add_function(wrap_pyfunction!(tensor::from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::zeros, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::empty, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(targets, m)?)?;
    m.add_function(wrap_pyfunction!(function::_register, m)?)?;
    m.add_function(wrap_pyfunction!(function::get_global_func, m)?)?;
    m.add_function(wrap_pyfunction!(function::list_global_funcs, m)?)?;
    m.add_function(wrap_pyfunction!(function::remove_global_func, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(_live_imports, m)?)?;
    m.add_function(wrap_pyfunction!(exchange::_exchange_api_stats, m)?)?;
    m.add_function(wrap_pyfunction!(_take_last_foreign_error, m)?)?;
    m.add_function(wrap_pyfunction!(_load_library, m)?)?;
    m.add_function(wrap_pyfunction!(ipc::_ipc_share, m)?)?;
    m.add_function(wrap_pyfunction!(ipc::_ipc_share_fd, m)?)?;
    m.add_function(wrap_pyfunction!(ipc::_ipc_open, m)?)?;
    m.add_function(wrap_pyfunction!(ipc::_ipc_open_cuda, m)?)?;
    m.add_function(wrap_pyfunction!(ipc::_ipc_share_cuda, m)?)?;
    m.add_function(wrap_pyfunction!(ipc::_ipc_open_fd, m)?)?;
    m.add_function(wrap_pyfunction!(ipc::_ipc_live_segments, m)?)?;
    m.add_function(wrap_pyfunction!(ipc::_tensor_from_bytes, m)?)?;
    te::register(m)?;
    m.add(
        "DLPACK_VERSION",
        (
            rivet_runtime::dlpack::VERSION.major,
            rivet_runtime::dlpack::VERSION.minor,
        ),
    )?;
    m.add("MAX_ALLOC_BYTES", rivet_runtime::MAX_ALLOC_BYTES)?;
    // The names of the dtypes a rivet tensor can have, in `DType::ALL`'s order.
    m.add(
        "DTYPES",
        pyo3::types::PyTuple::new(m.py(), rivet_runtime::DType::ALL.map(|d| d.name()))?,
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// Size of rivet's CPU thread pool (`RIVET_NUM_THREADS`).
#[pyfunction]
fn num_threads() -> usize {
    rivet_runtime::parallel::num_threads()
}

/// `rivet.targets()`: the target kinds `build` accepts, the interpreter (the oracle) first;
/// the Python test suite runs once per entry.
#[pyfunction]
fn targets() -> Vec<&'static str> {
    rivet_compiler::TargetKind::ALL
        .map(rivet_compiler::TargetKind::name)
        .to_vec()
}

/// `rivet.cuda_device_count()`: the number of CUDA devices rivet can launch on; raises
/// `rivet.DeviceError` saying why when there are none usable (no driver library, no device).
#[pyfunction]
fn cuda_device_count(py: Python<'_>) -> PyResult<usize> {
    use crate::errors::IntoPyResult;
    rivet_compiler::codegen::cuda::driver::device_count()
        .map_err(rivet_runtime::Error::from)
        .and_then(|n| {
            if n == 0 {
                Err(rivet_runtime::Error::Device(
                    "CUDA is not available: the driver reports no CUDA device".into(),
                ))
            } else {
                Ok(n)
            }
        })
        .py_err(py)
}

#[pyfunction]
fn _live_imports() -> usize {
    rivet_runtime::dlpack::live_imports()
}

/// The calling thread's last C ABI failure raised by a foreign callee (a Python exception in
/// a host callback), as that very exception object, taken; None when there is none. The torch
/// bridge (rivet/_torch_native.py) calls rivet through the C ABI and re-raises it, so an
/// exception from a callback keeps its type and traceback there too.
/// `rivet.load_library`'s work (`rivet_runtime::library::load`), the GIL released while the
/// library initialises (it may build and compile its kernels).
#[pyfunction]
fn _load_library(py: Python<'_>, path: &str, override_: bool) -> PyResult<Vec<String>> {
    use crate::errors::IntoPyResult;
    let path = path.to_owned();
    // SAFETY: the caller asked to load this library and run its code (`rivet.load_library`).
    py.detach(move || unsafe { rivet_runtime::library::load(&path, override_) })
        .py_err(py)
}

#[pyfunction]
fn _take_last_foreign_error(py: Python<'_>) -> Option<Py<PyAny>> {
    rivet_runtime::capi::take_last_foreign_error()
        .map(|e| errors::to_pyerr(py, e).into_value(py).into_any())
}
