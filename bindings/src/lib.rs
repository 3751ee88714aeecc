//! `rivet._native`: the thin pyo3 layer of the `rivet` Python package. Logic lives in
//! `rivet-runtime` (and later `rivet-compiler`); this crate only converts between Python
//! objects and runtime values, and maps errors to the classes of `rivet/error.py`.

mod capsule;
mod convert;
mod errors;
mod function;
mod tensor;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<function::PyFunction>()?;
    m.add_function(wrap_pyfunction!(tensor::from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::zeros, m)?)?;
    m.add_function(wrap_pyfunction!(function::_register, m)?)?;
    m.add_function(wrap_pyfunction!(function::get_global_func, m)?)?;
    m.add_function(wrap_pyfunction!(function::list_global_funcs, m)?)?;
    m.add_function(wrap_pyfunction!(function::remove_global_func, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(_live_imports, m)?)?;
    m.add(
        "DLPACK_VERSION",
        (
            rivet_runtime::dlpack::VERSION.major,
            rivet_runtime::dlpack::VERSION.minor,
        ),
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// Size of rivet's CPU thread pool (`RIVET_NUM_THREADS`).
#[pyfunction]
fn num_threads() -> usize {
    rivet_runtime::parallel::num_threads()
}

#[pyfunction]
fn _live_imports() -> usize {
    rivet_runtime::dlpack::live_imports()
}
