//! `rivet.build` (a schedule to a `Module`), `rivet.Module` (its functions, generated
//! code, `save`) and `rivet.load_module`.

use super::schedule::PySchedule;
use super::tensor::tensors_arg;
use super::{arg_err, type_name};
use crate::errors::CompileResult;
use crate::function::PyFunction;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

/// `rivet.Module`: the functions of one `build` (or of a loaded file).
#[pyclass(name = "Module", module = "rivet", frozen)]
pub struct PyModule_ {
    pub m: rivet_compiler::Module,
}

/// `checked=None` follows the environment (`RIVET_CHECKED=1`); True / False force it.
/// `fma=True` contracts float `a * b + c` into fused multiply-adds (one rounding).
/// `default_schedule=None` follows the environment (`RIVET_DEFAULT_SCHEDULE=0` turns it off);
/// False builds an untouched CPU schedule as written (serial loops, no packed GEMM).
#[pyfunction]
#[pyo3(signature = (s, args, target="cpu", name="default_function", checked=None, fma=false, default_schedule=None))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments, one parameter each
pub fn build(
    py: Python<'_>,
    s: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
    target: &str,
    name: &str,
    checked: Option<bool>,
    fma: bool,
    default_schedule: Option<bool>,
) -> PyResult<PyModule_> {
    let Ok(sched) = s.cast::<PySchedule>() else {
        return Err(arg_err(
            py,
            format!(
                "build: argument 0 ('s') must be a rivet.Schedule (rivet.create_schedule(C)), got {}",
                type_name(s)
            ),
        ));
    };
    let args = tensors_arg(args, "build: argument 1 ('args')")?;
    let sched = sched.borrow();
    let mut opts = rivet_compiler::build::Options::from_env();
    if let Some(c) = checked {
        opts.checked = c;
    }
    opts.fma = fma;
    if let Some(d) = default_schedule {
        opts.as_written = !d;
    }
    let m = rivet_compiler::build::build_with(&sched.sched, &args, target, name, opts).cpy(py)?;
    Ok(PyModule_ { m })
}

#[pymethods]
impl PyModule_ {
    /// Reports the Python callbacks of its functions that it alone holds (`gc.rs`).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        crate::gc::traverse(crate::gc::module_roots(&self.m), &visit)
    }
    fn __clear__(&self) {
        crate::gc::clear(crate::gc::module_roots(&self.m))
    }
    fn get_function(&self, py: Python<'_>, name: &str) -> PyResult<PyFunction> {
        Ok(PyFunction::new(self.m.get_function(name).cpy(py)?))
    }
    fn __getitem__(&self, py: Python<'_>, name: &str) -> PyResult<PyFunction> {
        self.get_function(py, name)
    }
    fn __contains__(&self, name: &str) -> bool {
        self.m.function_names().iter().any(|n| n == name)
    }
    #[getter]
    fn function_names(&self) -> Vec<String> {
        self.m.function_names()
    }
    /// Generated code: "ir" (final loop IR), "nest" (loop nests before the bounds proof),
    /// "cranelift" (the backend's code).
    #[pyo3(signature = (kind="ir"))]
    fn get_source(&self, py: Python<'_>, kind: &str) -> PyResult<String> {
        self.m.get_source(kind).cpy(py)
    }
    /// Saves the module (its loop IR, checksummed) to `path`; `rivet.load_module(path)`
    /// verifies, re-proves and re-compiles it.
    fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        self.m.save(&path).cpy(py)
    }
    fn __repr__(&self) -> String {
        let targets: Vec<String> = self.m.funcs.iter().map(|c| c.target.to_string()).collect();
        format!(
            "rivet.Module([{}], target={})",
            self.m.function_names().join(", "),
            targets.join(", ")
        )
    }
}

/// `rivet.load_module(path)`: a module saved by `Module.save` (from Python or Rust).
#[pyfunction]
pub fn load_module(py: Python<'_>, path: std::path::PathBuf) -> PyResult<PyModule_> {
    Ok(PyModule_ {
        m: rivet_compiler::Module::load(&path).cpy(py)?,
    })
}

/// `rivet._native._build_cache_info()`: the in-process build cache's counters (`hits`,
/// `misses`, `entries`, `key_bytes`, `evictions`) and whether the environment enables it
/// (`enabled`, 0 or 1), for tests and benchmarks.
#[pyfunction]
pub fn _build_cache_info() -> std::collections::HashMap<&'static str, u64> {
    let s = rivet_compiler::build_cache::stats();
    std::collections::HashMap::from([
        ("hits", s.hits),
        ("misses", s.misses),
        ("entries", s.entries as u64),
        ("key_bytes", s.key_bytes as u64),
        ("evictions", s.evictions),
        ("enabled", rivet_compiler::build_cache::enabled() as u64),
    ])
}
