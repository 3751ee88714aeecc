//! The compiler's Python face: `rivet.te` (expressions, tensors, iteration variables),
//! schedules and stages, `build` and `Module`. Thin: every rule (types, schedule legality,
//! bounds) lives in `rivet-compiler`; these files convert Python objects into DSL values and
//! compiler errors into `rivet` exceptions (`CompileError`, `ShapeError`, ...).
//!
//! One file per concept: `operand` (Python values as expressions), `expr` (`te.Expr` and its
//! operators), `itervar` (`te.IterVar`), `tensor` (`te.Tensor`, `te.Op`), `functions` (the
//! `te.*` functions behind `rivet/te.py`), `schedule` (`Schedule`, `Stage`), `build`
//! (`build`, `Module`, `load_module`). This file holds the error helpers they share and
//! `register`.

mod build;
mod expr;
mod functions;
mod itervar;
mod operand;
mod schedule;
mod tensor;

use crate::errors::to_pyerr;
use pyo3::prelude::*;
use rivet_runtime::DType;

fn compile_err(py: Python<'_>, msg: String) -> PyErr {
    to_pyerr(py, rivet_runtime::Error::Compile(msg))
}

fn arg_err(py: Python<'_>, msg: String) -> PyErr {
    to_pyerr(py, rivet_runtime::Error::Argument(msg))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn parse_dtype(py: Python<'_>, dtype: &str) -> PyResult<DType> {
    dtype.parse::<DType>().map_err(|e| to_pyerr(py, e))
}

/// Registers the classes and functions of this module on `rivet._native`.
pub fn register(m: &Bound<'_, pyo3::types::PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Expr", py.get_type::<expr::PyExpr>())?;
    m.add("IterVar", py.get_type::<itervar::PyIterVar>())?;
    m.add("TeTensor", py.get_type::<tensor::PyTeTensor>())?;
    m.add("Op", py.get_type::<tensor::PyTensorOp>())?;
    m.add("Schedule", py.get_type::<schedule::PySchedule>())?;
    m.add("Stage", py.get_type::<schedule::PyStage>())?;
    m.add("Module", py.get_type::<build::PyModule_>())?;
    m.add_function(wrap_pyfunction!(functions::te_var, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_const, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_placeholder, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_reduce_axis, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_axis, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_compute, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_reduce, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_binary, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_unary, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_logic, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_cast, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_select, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_gradient, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_stop_gradient, m)?)?;
    m.add_function(wrap_pyfunction!(functions::te_extern, m)?)?;
    m.add_function(wrap_pyfunction!(schedule::create_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(schedule::default_gpu_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(build::build, m)?)?;
    m.add_function(wrap_pyfunction!(build::load_module, m)?)?;
    m.add_function(wrap_pyfunction!(build::_build_cache_info, m)?)?;
    Ok(())
}
