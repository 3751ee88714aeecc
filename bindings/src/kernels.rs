//! `rivet.kernels.*`: the Rust kernel library (`rivet_compiler::kernels`) for Python. One
//! entry point; `rivet/kernels.py` gives each kernel its documented signature.

use crate::errors::{to_pyerr, CompileResult, IntoPyResult};
use crate::function::PyFunction;
use pyo3::prelude::*;
use rivet_compiler::kernels::{self, DimSpec};
use rivet_runtime::DType;

fn dims(spec: Option<Vec<Bound<'_, PyAny>>>, arg: &str) -> PyResult<Vec<DimSpec>> {
    spec.unwrap_or_default()
        .iter()
        .map(|d| {
            if let Ok(n) = d.extract::<i64>() {
                Ok(DimSpec::Size(n))
            } else if let Ok(s) = d.extract::<String>() {
                Ok(DimSpec::Name(s))
            } else {
                Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "{arg}: each dim must be an int or a dim name (str)"
                )))
            }
        })
        .collect()
}

#[pyfunction]
#[pyo3(signature = (name, dtype, target="cpu", ndim=None, axis=None, eps=None, perm=None, a_shape=None, b_shape=None, schedule=None))]
#[allow(clippy::too_many_arguments)]
pub fn _kernel(
    py: Python<'_>,
    name: &str,
    dtype: &str,
    target: &str,
    ndim: Option<usize>,
    axis: Option<i64>,
    eps: Option<f64>,
    perm: Option<Vec<usize>>,
    a_shape: Option<Vec<Bound<'_, PyAny>>>,
    b_shape: Option<Vec<Bound<'_, PyAny>>>,
    schedule: Option<&str>,
) -> PyResult<PyFunction> {
    let dt: DType = dtype.parse().py_err(py)?;
    let target = rivet_compiler::Target::parse(target).cpy(py)?;
    let mut on = kernels::On::from(&target);
    if let Some(sname) = schedule {
        on.strategy = kernels::Strategy::parse(sname).ok_or_else(|| {
            to_pyerr(
                py,
                rivet_runtime::Error::Argument(format!(
                    "rivet.kernels: schedule must be 'cpu' or 'gpu' (or None for the target's own), got '{sname}'"
                )),
            )
        })?;
    }
    let target = on;
    let nd = ndim.unwrap_or(2);
    let r = match name {
        "matmul" => kernels::matmul(dt, target.clone()),
        "batch_matmul" => kernels::batch_matmul(dt, target.clone()),
        "add" => kernels::add(
            dt,
            &dims(a_shape, "a_shape")?,
            &dims(b_shape, "b_shape")?,
            target.clone(),
        ),
        "mul" => kernels::mul(
            dt,
            &dims(a_shape, "a_shape")?,
            &dims(b_shape, "b_shape")?,
            target.clone(),
        ),
        "relu" => kernels::relu(dt, nd, target.clone()),
        "gelu" => kernels::gelu(dt, nd, target.clone()),
        "softmax" => kernels::softmax(dt, nd, axis.unwrap_or(-1), target.clone()),
        "layer_norm" => kernels::layer_norm(dt, nd, eps.unwrap_or(1e-5), target.clone()),
        "sum" => kernels::reduce_sum(dt, nd, axis.unwrap_or(-1), target.clone()),
        "max" => kernels::reduce_max(dt, nd, axis.unwrap_or(-1), target.clone()),
        "transpose" => kernels::transpose(dt, &perm.unwrap_or_else(|| vec![1, 0]), target.clone()),
        other => {
            return Err(rivet_runtime::Error::NotFound(format!(
                "rivet.kernels has no kernel '{other}'; it has: {}",
                kernels::NAMES.join(", ")
            )))
            .py_err(py)
        }
    };
    let f = r.map_err(rivet_runtime::Error::from).py_err(py)?;
    Ok(PyFunction::new(f))
}
