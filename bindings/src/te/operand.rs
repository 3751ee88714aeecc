//! Python values where an expression goes: `te.Expr`s, Python and numpy numbers (as
//! constants), ints as int64 indices and extents; and the results handed back (`te.Expr`, or
//! a Python int for an int64 constant).
//!
//! Python numbers mixed with expressions follow the compiler's one mixed-type rule
//! (`rivet_compiler::te::number`, the Rust DSL's rule too): they take the expression's dtype
//! (`A[i] * 2` stays float32, `i + 1` stays int64, `i * 2.0` is `i * 2`), a Python bool
//! becomes a bool constant; a number that the dtype cannot hold (`i * 0.5`, `x_int8 + 300`) is
//! a `CompileError`. Where no operand is an expression (`te.if_then_else(c, 1.0, 0.0)`),
//! numbers default to bool, int64 and float32.

use super::expr::PyExpr;
use super::{arg_err, compile_err, type_name};
use crate::errors::CompileResult;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};
use rivet_compiler::ir::expr::{BinOp, Expr, UnOp};
use rivet_compiler::te::{number, Number, Operand};
use rivet_runtime::DType;

/// `obj` as an operand; `None` when it is no kind of operand (the caller answers
/// `NotImplemented` or raises).
pub(super) fn operand(obj: &Bound<'_, PyAny>) -> PyResult<Option<Operand>> {
    let py = obj.py();
    if let Ok(e) = obj.cast::<PyExpr>() {
        return Ok(Some(Operand::Expr(e.get().e.clone())));
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Some(Operand::Number(Number::Bool(b.is_true()))));
    }
    if obj.is_instance_of::<PyInt>() {
        return match obj.extract::<i64>() {
            Ok(v) => Ok(Some(Operand::Number(Number::Int(v)))),
            Err(_) => Err(compile_err(
                py,
                format!("the Python int {obj} does not fit in int64"),
            )),
        };
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(Some(Operand::Number(Number::Float(obj.extract::<f64>()?))));
    }
    // numpy scalars (np.int64(3), np.float32(0.5), np.bool_(True)): their Python value.
    let ty = obj.get_type();
    if ty
        .module()
        .is_ok_and(|m| m.to_str().is_ok_and(|m| m == "numpy"))
        && obj.hasattr("item")?
    {
        let item = obj.call_method0("item")?;
        if !item.is(obj) {
            return operand(&item);
        }
    }
    Ok(None)
}

pub(super) fn operand_or_err(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Operand> {
    match operand(obj)? {
        Some(o) => Ok(o),
        None => Err(arg_err(
            obj.py(),
            format!(
                "{what} must be a te.Expr or a Python number, got {}",
                type_name(obj)
            ),
        )),
    }
}

/// A Python value on its own as an expression (a number takes its default dtype).
pub(super) fn single(o: Operand) -> Expr {
    number::operand(o)
}

/// The two operands of `op` as expressions (numbers converted by the compiler's rule).
pub(super) fn pair(py: Python<'_>, op: &str, a: Operand, b: Operand) -> PyResult<(Expr, Expr)> {
    number::operands(op, a, b).cpy(py)
}

pub(super) fn expr_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Expr> {
    Ok(single(operand_or_err(obj, what)?))
}

/// An int64 index / extent: a te.Expr or a Python int.
pub(super) fn index_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Expr> {
    let py = obj.py();
    match operand(obj)? {
        Some(Operand::Expr(e)) => Ok(e),
        Some(Operand::Number(Number::Int(v))) => Ok(Expr::int(v)),
        _ => Err(arg_err(
            py,
            format!(
                "{what} must be an int or an int64 te.Expr, got {} ({obj})",
                type_name(obj)
            ),
        )),
    }
}

pub(super) fn new_expr(py: Python<'_>, e: Expr) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, PyExpr { e })?.into_any())
}

/// A Python int for int64 constants, a te.Expr otherwise (shapes, extents).
pub(super) fn expr_or_int(py: Python<'_>, e: &Expr) -> PyResult<Py<PyAny>> {
    match e.as_int() {
        Some(v) if e.dtype() == DType::I64 => Ok(v.into_pyobject(py)?.into_any().unbind()),
        _ => new_expr(py, e.clone()),
    }
}

pub(super) fn binop_of(name: &str) -> Option<BinOp> {
    Some(match name {
        "add" => BinOp::Add,
        "sub" => BinOp::Sub,
        "mul" => BinOp::Mul,
        "div" => BinOp::Div,
        "floordiv" => BinOp::FloorDiv,
        "floormod" => BinOp::FloorMod,
        "min" => BinOp::Min,
        "max" => BinOp::Max,
        "pow" => BinOp::Pow,
        _ => return None,
    })
}

pub(super) fn unop_of(name: &str) -> Option<UnOp> {
    Some(match name {
        "neg" => UnOp::Neg,
        "not" => UnOp::Not,
        "exp" => UnOp::Exp,
        "log" => UnOp::Log,
        "sqrt" => UnOp::Sqrt,
        "rsqrt" => UnOp::Rsqrt,
        "tanh" => UnOp::Tanh,
        "sigmoid" => UnOp::Sigmoid,
        "abs" => UnOp::Abs,
        "floor" => UnOp::Floor,
        "ceil" => UnOp::Ceil,
        "erf" => UnOp::Erf,
        _ => return None,
    })
}
