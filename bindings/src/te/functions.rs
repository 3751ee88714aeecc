//! The `te.*` functions of the DSL, called by `rivet/te.py`: `var`, `const`, `placeholder`,
//! `reduce_axis`, `compute`, reductions, and the generic binary / unary / logic / cast /
//! select builders behind `te.max`, `te.exp`, `te.all`, `te.cast`, `te.if_then_else`, ...;
//! and `te.gradient`.

use super::expr::PyExpr;
use super::itervar::{new_itervar, PyIterVar};
use super::operand::{
    binop_of, expr_arg, index_arg, new_expr, operand, operand_or_err, single, unop_of,
};
use super::tensor::{tensor_arg, tensors_arg, PyTeTensor};
use super::{arg_err, compile_err, parse_dtype, type_name};
use crate::errors::CompileResult;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use rivet_compiler::ir::expr::{Expr, IterVar, LogicOp, ReduceOp, Var};
use rivet_compiler::te::{self, number, Number, Operand};
use rivet_runtime::DType;

#[pyfunction]
#[pyo3(signature = (name="n", dtype="int64"))]
pub fn te_var(py: Python<'_>, name: &str, dtype: &str) -> PyResult<Py<PyAny>> {
    if parse_dtype(py, dtype)? != DType::I64 {
        return Err(compile_err(
            py,
            format!("te.var('{name}'): variables are int64 (dims and indices), not {dtype}"),
        ));
    }
    new_expr(py, te::var(name))
}

#[pyfunction]
#[pyo3(signature = (value, dtype=None))]
pub fn te_const(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    dtype: Option<&str>,
) -> PyResult<Py<PyAny>> {
    let o = match operand(value)? {
        Some(Operand::Expr(_)) | None => {
            return Err(arg_err(
                py,
                format!(
                    "te.const: value must be a Python bool, int or float, got {}",
                    type_name(value)
                ),
            ))
        }
        Some(o) => o,
    };
    let e = match dtype {
        None => single(o),
        Some(d) => {
            let dt = parse_dtype(py, d)?;
            match o {
                // te.const(1.7, "int32") truncates, as a cast would; te.const(True, "float32") is 1.0.
                Operand::Number(Number::Bool(b)) => Expr::const_int(b as i64, dt),
                Operand::Number(Number::Float(x)) if !dt.is_float() => {
                    Expr::cast(dt, Expr::constant(x, DType::F64))
                }
                Operand::Number(n) => number::number_as(n, dt, "te.const", &dt).cpy(py)?,
                Operand::Expr(e) => e,
            }
        }
    };
    new_expr(py, e)
}

fn shape_arg(shape: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<Expr>> {
    let items: Vec<Bound<'_, PyAny>> =
        if shape.is_instance_of::<PyList>() || shape.is_instance_of::<PyTuple>() {
            shape.try_iter()?.collect::<PyResult<_>>()?
        } else {
            vec![shape.clone()]
        };
    items
        .iter()
        .enumerate()
        .map(|(d, x)| index_arg(x, &format!("{what}: dim {d}")))
        .collect()
}

#[pyfunction]
#[pyo3(signature = (shape, dtype="float32", name="placeholder"))]
pub fn te_placeholder(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: &str,
    name: &str,
) -> PyResult<PyTeTensor> {
    let shape = shape_arg(shape, &format!("placeholder '{name}' shape"))?;
    let dt = parse_dtype(py, dtype)?;
    Ok(PyTeTensor {
        t: te::placeholder(&shape, dt, name).cpy(py)?,
    })
}

#[pyfunction]
#[pyo3(signature = (lo, hi, name="rv"))]
pub fn te_reduce_axis(
    py: Python<'_>,
    lo: &Bound<'_, PyAny>,
    hi: &Bound<'_, PyAny>,
    name: &str,
) -> PyResult<Py<PyIterVar>> {
    let lo = index_arg(lo, &format!("reduce_axis '{name}': lower bound"))?;
    let hi = index_arg(hi, &format!("reduce_axis '{name}': upper bound"))?;
    let iv = te::reduce_axis(lo, hi, name).cpy(py)?;
    new_itervar(py, iv)
}

/// A data-parallel axis `[0, extent)` (the axes `te.compute` hands to its lambda).
#[pyfunction]
pub fn te_axis(py: Python<'_>, extent: &Bound<'_, PyAny>, name: &str) -> PyResult<Py<PyIterVar>> {
    let extent = index_arg(extent, &format!("axis '{name}': extent"))?;
    new_itervar(
        py,
        IterVar {
            var: Var::new(name),
            min: Expr::int(0),
            extent,
            reduce: false,
        },
    )
}

#[pyfunction]
pub fn te_compute(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    axis: Vec<Bound<'_, PyAny>>,
    body: &Bound<'_, PyAny>,
    name: &str,
) -> PyResult<PyTeTensor> {
    let shape = shape_arg(shape, &format!("compute '{name}' shape"))?;
    let axis: Vec<IterVar> = axis
        .iter()
        .map(|a| match a.cast::<PyIterVar>() {
            Ok(iv) => Ok(iv.get().iv.clone()),
            Err(_) => Err(arg_err(
                py,
                format!("compute '{name}': axis must be IterVars"),
            )),
        })
        .collect::<PyResult<_>>()?;
    if axis.len() != shape.len() {
        return Err(compile_err(
            py,
            format!(
                "compute '{name}': {} axes for {} dims",
                axis.len(),
                shape.len()
            ),
        ));
    }
    let body = match body.cast::<PyExpr>() {
        Ok(e) => e.get().e.clone(),
        Err(_) => {
            return Err(compile_err(
                py,
                format!(
                    "compute '{name}': the lambda must return a te.Expr, got {} ({body}); \
                     wrap a constant with te.const(value, dtype)",
                    type_name(body)
                ),
            ))
        }
    };
    Ok(PyTeTensor {
        t: te::compute_from(&shape, axis, body, name).cpy(py)?,
    })
}

#[pyfunction]
pub fn te_reduce(
    py: Python<'_>,
    op: &str,
    body: &Bound<'_, PyAny>,
    axes: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let rop = match op {
        "sum" => ReduceOp::Sum,
        "prod" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        other => return Err(arg_err(py, format!("unknown reduction '{other}'"))),
    };
    let items: Vec<Bound<'_, PyAny>> =
        if axes.is_instance_of::<PyList>() || axes.is_instance_of::<PyTuple>() {
            axes.try_iter()?.collect::<PyResult<_>>()?
        } else {
            vec![axes.clone()]
        };
    let axes: Vec<IterVar> = items
        .iter()
        .map(|a| match a.cast::<PyIterVar>() {
            Ok(iv) => Ok(iv.get().iv.clone()),
            Err(_) => Err(arg_err(
                py,
                format!(
                    "te.{op}: axis must be a te.reduce_axis (or a list of them), got {} ({a})",
                    type_name(a)
                ),
            )),
        })
        .collect::<PyResult<_>>()?;
    let body = expr_arg(body, &format!("te.{op}: the reduced expression"))?;
    new_expr(py, te::reduce(rop, body, &axes).cpy(py)?)
}

#[pyfunction]
pub fn te_binary(
    py: Python<'_>,
    op: &str,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let bop = binop_of(op).ok_or_else(|| arg_err(py, format!("unknown operator '{op}'")))?;
    let x = operand_or_err(a, &format!("te.{op}: argument 0"))?;
    let y = operand_or_err(b, &format!("te.{op}: argument 1"))?;
    new_expr(py, te::binary(bop, x, y).cpy(py)?)
}

#[pyfunction]
pub fn te_unary(py: Python<'_>, op: &str, a: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let uop = unop_of(op).ok_or_else(|| arg_err(py, format!("unknown function '{op}'")))?;
    let x = expr_arg(a, &format!("te.{op}: argument"))?;
    new_expr(py, Expr::unary(uop, x).cpy(py)?)
}

#[pyfunction]
pub fn te_logic(
    py: Python<'_>,
    op: &str,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let lop = match op {
        "and" => LogicOp::And,
        "or" => LogicOp::Or,
        other => return Err(arg_err(py, format!("unknown logical operator '{other}'"))),
    };
    let x = operand_or_err(a, "a condition")?;
    let y = operand_or_err(b, "a condition")?;
    new_expr(py, te::logic(lop, x, y).cpy(py)?)
}

#[pyfunction]
pub fn te_cast(py: Python<'_>, dtype: &str, a: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let dt = parse_dtype(py, dtype)?;
    let x = expr_arg(a, "te.cast: value")?;
    new_expr(py, Expr::cast(dt, x))
}

#[pyfunction]
pub fn te_select(
    py: Python<'_>,
    cond: &Bound<'_, PyAny>,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let c = operand_or_err(cond, "te.if_then_else: condition")?;
    let x = operand_or_err(a, "te.if_then_else: true value")?;
    let y = operand_or_err(b, "te.if_then_else: false value")?;
    new_expr(py, te::try_if_then_else(c, x, y).cpy(py)?)
}

/// `te.gradient(output, inputs, head=None)`: the gradient stages (`te::gradient`).
#[pyfunction]
#[pyo3(signature = (output, inputs, head=None))]
pub fn te_gradient(
    py: Python<'_>,
    output: &Bound<'_, PyAny>,
    inputs: &Bound<'_, PyAny>,
    head: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<PyTeTensor>> {
    let out = tensor_arg(output, "te.gradient: output")?;
    let xs = tensors_arg(inputs, "te.gradient: inputs")?;
    let h = head
        .map(|h| tensor_arg(h, "te.gradient: head"))
        .transpose()?;
    let grads = te::gradient(&out, &xs, h.as_ref()).cpy(py)?;
    Ok(grads.into_iter().map(|t| PyTeTensor { t }).collect())
}

/// `te.stop_gradient(tensor)`: `tensor`'s values, constant to `te.gradient`
/// (`te::stop_gradient`).
#[pyfunction]
pub fn te_stop_gradient(py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<PyTeTensor> {
    let t = tensor_arg(tensor, "te.stop_gradient: tensor")?;
    Ok(PyTeTensor {
        t: te::stop_gradient(&t).cpy(py)?,
    })
}

/// A callback argument: a registered name (`str`), a `rivet.Function`, or any Python callable
/// (wrapped as `rivet.register_func` wraps one: called with the GIL taken, its exception
/// carried through unchanged).
pub(super) fn callback_arg(
    py: Python<'_>,
    f: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<te::CallbackFn> {
    if let Ok(name) = f.extract::<String>() {
        return Ok(te::CallbackFn::Registered(name));
    }
    if let Ok(pf) = f.cast::<crate::function::PyFunction>() {
        return Ok(te::CallbackFn::Function(pf.get().func.clone()));
    }
    if f.is_callable() {
        return Ok(te::CallbackFn::Function(crate::convert::wrap_callable(
            f.clone().unbind(),
            None,
        )));
    }
    Err(arg_err(
        py,
        format!(
            "{what}: the callback must be a registered name (str), a rivet.Function or a callable, got {}",
            type_name(f)
        ),
    ))
}

/// `te.extern(shape, inputs, func, dtype, name)`: a stage a host callback computes.
#[pyfunction]
#[pyo3(signature = (shape, inputs, func, dtype="float32", name="extern"))]
pub fn te_extern(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    inputs: Vec<Bound<'_, PyAny>>,
    func: &Bound<'_, PyAny>,
    dtype: &str,
    name: &str,
) -> PyResult<PyTeTensor> {
    let shape = shape_arg(shape, &format!("extern '{name}' shape"))?;
    let dt = parse_dtype(py, dtype)?;
    let inputs = inputs
        .iter()
        .enumerate()
        .map(|(k, t)| match t.cast::<PyTeTensor>() {
            Ok(t) => Ok(t.get().t.clone()),
            Err(_) => Err(arg_err(
                py,
                format!(
                    "extern '{name}': input {k} must be a te.Tensor, got {}",
                    type_name(t)
                ),
            )),
        })
        .collect::<PyResult<Vec<_>>>()?;
    let f = callback_arg(py, func, &format!("extern '{name}'"))?;
    Ok(PyTeTensor {
        t: te::extern_(&shape, &inputs, f, dt, name).cpy(py)?,
    })
}
