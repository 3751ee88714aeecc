//! `rivet.te.Tensor` (placeholders and computes, indexed to read elements) and `te.Op` (the
//! operation behind a tensor: axes, inputs, body); and tensor arguments.

use super::itervar::{new_itervar, PyIterVar};
use super::operand::{expr_or_int, index_arg, new_expr};
use super::{arg_err, compile_err, type_name};
use crate::errors::CompileResult;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};
use rivet_compiler::ir::expr::Expr;
use rivet_compiler::te::{self, Tensor};

/// `rivet.te.Tensor`: a placeholder or a compute; index it (`A[i, j]`) to read an element.
#[pyclass(name = "Tensor", module = "rivet.te", frozen)]
pub struct PyTeTensor {
    pub t: Tensor,
}

fn shape_tuple<'py>(py: Python<'py>, shape: &[Expr]) -> PyResult<Bound<'py, PyTuple>> {
    let items = shape
        .iter()
        .map(|e| expr_or_int(py, e))
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, items)
}

fn read(py: Python<'_>, t: &Tensor, idx: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let items: Vec<Bound<'_, PyAny>> = match idx.cast::<PyTuple>() {
        Ok(tup) => tup.iter().collect(),
        Err(_) => vec![idx.clone()],
    };
    let mut indices = Vec::with_capacity(items.len());
    for (d, it) in items.iter().enumerate() {
        if it.is_instance_of::<pyo3::types::PySlice>()
            || it.is_none()
            || it.is(py.Ellipsis().bind(py))
        {
            return Err(compile_err(
                py,
                format!("tensor '{}': index {d} is {it}; only element access is supported (one int64 expression per dim)", t.name()),
            ));
        }
        indices.push(index_arg(
            it,
            &format!("index {d} of tensor '{}'", t.name()),
        )?);
    }
    new_expr(py, t.try_at(&indices).cpy(py)?)
}

#[pymethods]
impl PyTeTensor {
    /// Reports the Python callbacks of its program that it alone holds (`gc.rs`).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        crate::gc::traverse([crate::gc::Root::Tensor(&self.t)], &visit)
    }
    fn __clear__(&self) {
        crate::gc::clear([crate::gc::Root::Tensor(&self.t)])
    }
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        shape_tuple(py, self.t.shape())
    }
    #[getter]
    fn dtype(&self) -> String {
        self.t.dtype().to_string()
    }
    #[getter]
    fn name(&self) -> String {
        self.t.name().to_string()
    }
    #[getter]
    fn ndim(&self) -> usize {
        self.t.ndim()
    }
    #[getter]
    fn op(&self) -> PyTensorOp {
        PyTensorOp { t: self.t.clone() }
    }
    fn __getitem__(&self, py: Python<'_>, idx: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        read(py, &self.t, idx)
    }
    /// `A(i, j)`, same as `A[i, j]`.
    #[pyo3(signature = (*idx))]
    fn __call__(&self, py: Python<'_>, idx: &Bound<'_, PyTuple>) -> PyResult<Py<PyAny>> {
        read(py, &self.t, idx.as_any())
    }
    fn __iter__(&self) -> PyResult<()> {
        Err(PyTypeError::new_err(format!(
            "te.Tensor '{}' cannot be iterated; index it with one expression per dim (A[i, j])",
            self.t.name()
        )))
    }
    fn same_as(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyTeTensor>()
            .is_ok_and(|o| o.get().t == self.t)
    }
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        self.same_as(other)
    }
    fn __hash__(&self) -> u64 {
        self.t.id() as u64
    }
    fn __repr__(&self) -> String {
        let dims: Vec<String> = self.t.shape().iter().map(|e| e.to_string()).collect();
        format!(
            "te.Tensor({}, shape=({}{}), dtype={})",
            self.t.name(),
            dims.join(", "),
            if dims.len() == 1 { "," } else { "" },
            self.t.dtype()
        )
    }
}

/// `C.op`: the operation computing a tensor (`axis`, `reduce_axis`, `input_tensors`, ...).
#[pyclass(name = "Op", module = "rivet.te", frozen)]
pub struct PyTensorOp {
    pub t: Tensor,
}

#[pymethods]
impl PyTensorOp {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        crate::gc::traverse([crate::gc::Root::Tensor(&self.t)], &visit)
    }
    fn __clear__(&self) {
        crate::gc::clear([crate::gc::Root::Tensor(&self.t)])
    }
    #[getter]
    fn name(&self) -> String {
        self.t.name().to_string()
    }
    /// The data-parallel axes (one per output dim; empty for a placeholder).
    #[getter]
    fn axis(&self, py: Python<'_>) -> PyResult<Vec<Py<PyIterVar>>> {
        self.t
            .axis()
            .iter()
            .map(|iv| new_itervar(py, iv.clone()))
            .collect()
    }
    #[getter]
    fn reduce_axis(&self, py: Python<'_>) -> PyResult<Vec<Py<PyIterVar>>> {
        self.t
            .reduce_axis()
            .iter()
            .map(|iv| new_itervar(py, iv.clone()))
            .collect()
    }
    #[getter]
    fn input_tensors(&self) -> Vec<PyTeTensor> {
        te::tensor::inputs(&self.t)
            .into_iter()
            .map(|t| PyTeTensor { t })
            .collect()
    }
    /// The body as a one-element list (empty for a placeholder), as in TVM.
    #[getter]
    fn body(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        self.t
            .body()
            .map(|b| new_expr(py, b.clone()))
            .into_iter()
            .collect()
    }
    #[getter]
    fn is_placeholder(&self) -> bool {
        self.t.is_placeholder()
    }
    #[getter]
    fn num_outputs(&self) -> usize {
        1
    }
    fn output(&self, py: Python<'_>, index: usize) -> PyResult<PyTeTensor> {
        if index != 0 {
            return Err(arg_err(
                py,
                format!(
                    "op '{}' has one output, asked for output {index}",
                    self.t.name()
                ),
            ));
        }
        Ok(PyTeTensor { t: self.t.clone() })
    }
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyTensorOp>()
            .is_ok_and(|o| o.get().t == self.t)
    }
    fn __hash__(&self) -> u64 {
        self.t.id() as u64
    }
    fn __repr__(&self) -> String {
        format!(
            "te.Op({}, {})",
            self.t.name(),
            if self.t.is_placeholder() {
                "placeholder"
            } else if self.t.is_extern() {
                "extern"
            } else {
                "compute"
            }
        )
    }
}

/// A te.Tensor (or its op) argument.
pub(super) fn tensor_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Tensor> {
    if let Ok(t) = obj.cast::<PyTeTensor>() {
        return Ok(t.get().t.clone());
    }
    if let Ok(op) = obj.cast::<PyTensorOp>() {
        return Ok(op.get().t.clone());
    }
    Err(arg_err(
        obj.py(),
        format!("{what} must be a te.Tensor, got {} ({obj})", type_name(obj)),
    ))
}

/// One tensor or a list / tuple of them.
pub(super) fn tensors_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<Tensor>> {
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return obj
            .try_iter()?
            .enumerate()
            .map(|(i, x)| tensor_arg(&x?, &format!("{what}[{i}]")))
            .collect();
    }
    Ok(vec![tensor_arg(obj, what)?])
}
