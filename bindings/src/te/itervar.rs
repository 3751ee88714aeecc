//! `rivet.te.IterVar`: a loop axis (a compute's axis, a reduce_axis, or a loop made by a
//! schedule), an int64 expression with a domain; and axis arguments of schedule primitives.

use super::expr::PyExpr;
use super::operand::{expr_or_int, new_expr};
use super::{arg_err, type_name};
use pyo3::prelude::*;
use pyo3::PyClassInitializer;
use rivet_compiler::arith::simplify::simplify;
use rivet_compiler::ir::expr::{Expr, IterVar, Var};

/// `rivet.te.IterVar`: a loop axis (data-parallel or reduction), usable as an int64 expression.
#[pyclass(name = "IterVar", module = "rivet.te", extends = PyExpr, frozen)]
pub struct PyIterVar {
    pub iv: IterVar,
}

pub(super) fn new_itervar(py: Python<'_>, iv: IterVar) -> PyResult<Py<PyIterVar>> {
    let base = PyExpr {
        e: Expr::var(&iv.var),
    };
    Py::new(
        py,
        PyClassInitializer::from(base).add_subclass(PyIterVar { iv }),
    )
}

#[pymethods]
impl PyIterVar {
    /// The loop variable as a plain expression.
    #[getter]
    fn var(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        new_expr(py, Expr::var(&self.iv.var))
    }
    #[getter]
    fn name(&self) -> String {
        self.iv.var.name.to_string()
    }
    #[getter]
    fn min(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        expr_or_int(py, &self.iv.min)
    }
    #[getter]
    fn extent(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        expr_or_int(py, &self.iv.extent)
    }
    /// `(min, extent)`.
    #[getter]
    fn dom(&self, py: Python<'_>) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
        Ok((
            expr_or_int(py, &self.iv.min)?,
            expr_or_int(py, &self.iv.extent)?,
        ))
    }
    /// "reduce" or "data_par".
    #[getter]
    fn iter_type(&self) -> &'static str {
        if self.iv.reduce {
            "reduce"
        } else {
            "data_par"
        }
    }
    fn __repr__(&self) -> String {
        format!(
            "IterVar({}, [{}, {}){})",
            self.iv.var.name,
            self.iv.min,
            simplify(&self.iv.min.add(&self.iv.extent)),
            if self.iv.reduce { ", reduce" } else { "" }
        )
    }
}

/// The loop variable of an axis argument (an IterVar, or a bare variable expression).
pub(super) fn axis_var(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Var> {
    if let Ok(iv) = obj.cast::<PyIterVar>() {
        return Ok(iv.get().iv.var.clone());
    }
    if let Ok(e) = obj.cast::<PyExpr>() {
        if let Some(v) = e.get().e.as_var() {
            return Ok(v.clone());
        }
    }
    Err(arg_err(
        obj.py(),
        format!(
            "{what} must be an IterVar (C.op.axis[d], C.op.reduce_axis[d], or a result of split / fuse / tile), got {} ({obj})",
            type_name(obj)
        ),
    ))
}
