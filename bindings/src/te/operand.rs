//! Python values where an expression goes: `te.Expr`s, Python and numpy numbers (as
//! constants), ints as int64 indices and extents; and the results handed back (`te.Expr`, or
//! a Python int for an int64 constant).
//!
//! Python numbers mixed with expressions take the expression's dtype (`A[i] * 2` stays
//! float32, `i + 1` stays int64), a Python bool becomes a bool constant; a number that the
//! dtype cannot hold exactly (`i * 0.5`, `x_int8 + 300`) is a `CompileError`. Where no
//! operand is an expression (`te.if_then_else(c, 1.0, 0.0)`), numbers default to bool,
//! int64 and float32.

use super::expr::PyExpr;
use super::{arg_err, compile_err, type_name};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};
use rivet_compiler::ir::expr::{BinOp, Expr, UnOp};
use rivet_runtime::DType;

/// A Python value usable where an expression goes.
pub(super) enum Operand {
    Expr(Expr),
    Bool(bool),
    Int(i64),
    Float(f64),
}

/// `obj` as an operand; `None` when it is no kind of operand (the caller answers
/// `NotImplemented` or raises).
pub(super) fn operand(obj: &Bound<'_, PyAny>) -> PyResult<Option<Operand>> {
    let py = obj.py();
    if let Ok(e) = obj.cast::<PyExpr>() {
        return Ok(Some(Operand::Expr(e.get().e.clone())));
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Some(Operand::Bool(b.is_true())));
    }
    if obj.is_instance_of::<PyInt>() {
        return match obj.extract::<i64>() {
            Ok(v) => Ok(Some(Operand::Int(v))),
            Err(_) => Err(compile_err(
                py,
                format!("the Python int {obj} does not fit in int64"),
            )),
        };
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(Some(Operand::Float(obj.extract::<f64>()?)));
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

fn int_range(dt: DType) -> (i128, i128) {
    match dt {
        DType::Bool => (0, 1),
        DType::I8 => (i8::MIN as i128, i8::MAX as i128),
        DType::I16 => (i16::MIN as i128, i16::MAX as i128),
        DType::I32 => (i32::MIN as i128, i32::MAX as i128),
        DType::I64 => (i64::MIN as i128, i64::MAX as i128),
        DType::U8 => (0, u8::MAX as i128),
        DType::U16 => (0, u16::MAX as i128),
        DType::U32 => (0, u32::MAX as i128),
        _ => (0, i64::MAX as i128),
    }
}

/// A Python number as a constant of `dt` (the dtype of the other operand, `like`).
pub(super) fn number_as(
    py: Python<'_>,
    o: &Operand,
    dt: DType,
    like: &dyn std::fmt::Display,
) -> PyResult<Expr> {
    match *o {
        Operand::Expr(ref e) => Ok(e.clone()),
        Operand::Bool(b) => Ok(Expr::bool(b)),
        Operand::Int(v) if dt.is_float() => Ok(Expr::const_int(v, dt)),
        Operand::Int(v) => {
            let (lo, hi) = int_range(dt);
            if (v as i128) < lo || (v as i128) > hi {
                return Err(compile_err(
                    py,
                    format!("the Python int {v} does not fit in {dt}, the dtype of the other operand ({like}); use te.cast to widen it"),
                ));
            }
            if dt == DType::Bool {
                return Ok(Expr::bool(v != 0));
            }
            Ok(Expr::const_int(v, dt))
        }
        Operand::Float(x) if dt.is_float() => Ok(Expr::constant(x, dt)),
        Operand::Float(x) => {
            let (lo, hi) = int_range(dt);
            if dt != DType::Bool
                && x.fract() == 0.0
                && x >= lo as f64
                && x <= hi as f64
                && x.abs() < 9.0e15
            {
                return Ok(Expr::const_int(x as i64, dt));
            }
            Err(compile_err(
                py,
                format!(
                    "the Python float {x:?} cannot be used as a {dt} constant (the other operand, {like}, is {dt}); \
                     cast the expression to a float dtype first, e.g. te.cast('float32', e) or e.astype('float32')"
                ),
            ))
        }
    }
}

/// The dtype a bare Python number takes when no expression gives one.
fn default_dtype(o: &Operand) -> DType {
    match o {
        Operand::Expr(e) => e.dtype(),
        Operand::Bool(_) => DType::Bool,
        Operand::Int(_) => DType::I64,
        Operand::Float(_) => DType::F32,
    }
}

pub(super) fn single(py: Python<'_>, o: Operand) -> PyResult<Expr> {
    let dt = default_dtype(&o);
    number_as(py, &o, dt, &"a Python number")
}

/// Two operands as expressions of one dtype where numbers are involved.
pub(super) fn pair(py: Python<'_>, a: Operand, b: Operand) -> PyResult<(Expr, Expr)> {
    match (&a, &b) {
        (Operand::Expr(x), Operand::Expr(y)) => Ok((x.clone(), y.clone())),
        (Operand::Expr(x), _) => Ok((x.clone(), number_as(py, &b, x.dtype(), x)?)),
        (_, Operand::Expr(y)) => Ok((number_as(py, &a, y.dtype(), y)?, y.clone())),
        _ => {
            // Two numbers: the wider kind decides (float > int > bool).
            let rank = |o: &Operand| match o {
                Operand::Float(_) => 2,
                Operand::Int(_) => 1,
                _ => 0,
            };
            let dt = if rank(&a) >= rank(&b) {
                default_dtype(&a)
            } else {
                default_dtype(&b)
            };
            Ok((number_as(py, &a, dt, &dt)?, number_as(py, &b, dt, &dt)?))
        }
    }
}

pub(super) fn expr_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Expr> {
    let o = operand_or_err(obj, what)?;
    single(obj.py(), o)
}

/// An int64 index / extent: a te.Expr or a Python int.
pub(super) fn index_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Expr> {
    let py = obj.py();
    match operand(obj)? {
        Some(Operand::Expr(e)) => Ok(e),
        Some(Operand::Int(v)) => Ok(Expr::int(v)),
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
