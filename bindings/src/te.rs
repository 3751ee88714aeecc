//! The compiler's Python face: `rivet.te` (expressions, tensors, iteration variables),
//! schedules and stages, `build` and `Module`. Thin: every rule (types, schedule legality,
//! bounds) lives in `rivet-compiler`; this file converts Python objects into DSL values and
//! compiler errors into `rivet` exceptions (`CompileError`, `ShapeError`, ...).
//!
//! Python numbers mixed with expressions take the expression's dtype (`A[i] * 2` stays
//! float32, `i + 1` stays int64), a Python bool becomes a bool constant; a number that the
//! dtype cannot hold exactly (`i * 0.5`, `x_int8 + 300`) is a `CompileError`. Where no
//! operand is an expression (`te.if_then_else(c, 1.0, 0.0)`), numbers default to bool,
//! int64 and float32.

use crate::errors::{to_pyerr, CompileResult};
use crate::function::PyFunction;
use pyo3::basic::CompareOp;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyTuple};
use pyo3::PyClassInitializer;
use rivet_compiler::ir::expr::{
    BinOp, CmpOp, Const, Expr, ExprKind, IterVar, LogicOp, ReduceOp, UnOp, Var,
};
use rivet_compiler::ir::stmt::ForKind;
use rivet_compiler::lower::simplify::simplify;
use rivet_compiler::schedule::{Attach, Relation, Schedule, Stage};
use rivet_compiler::te::{self, Tensor};
use rivet_runtime::DType;
use std::collections::HashMap;

// ---- errors -------------------------------------------------------------------------------

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

// ---- operands: expressions and Python numbers -----------------------------------------------

/// A Python value usable where an expression goes.
enum Operand {
    Expr(Expr),
    Bool(bool),
    Int(i64),
    Float(f64),
}

/// `obj` as an operand; `None` when it is no kind of operand (the caller answers
/// `NotImplemented` or raises).
fn operand(obj: &Bound<'_, PyAny>) -> PyResult<Option<Operand>> {
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

fn operand_or_err(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Operand> {
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
fn number_as(
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

fn single(py: Python<'_>, o: Operand) -> PyResult<Expr> {
    let dt = default_dtype(&o);
    number_as(py, &o, dt, &"a Python number")
}

/// Two operands as expressions of one dtype where numbers are involved.
fn pair(py: Python<'_>, a: Operand, b: Operand) -> PyResult<(Expr, Expr)> {
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

fn expr_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Expr> {
    let o = operand_or_err(obj, what)?;
    single(obj.py(), o)
}

/// An int64 index / extent: a te.Expr or a Python int.
fn index_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Expr> {
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

fn new_expr(py: Python<'_>, e: Expr) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, PyExpr { e })?.into_any())
}

/// A Python int for int64 constants, a te.Expr otherwise (shapes, extents).
fn expr_or_int(py: Python<'_>, e: &Expr) -> PyResult<Py<PyAny>> {
    match e.as_int() {
        Some(v) if e.dtype() == DType::I64 => Ok(v.into_pyobject(py)?.into_any().unbind()),
        _ => new_expr(py, e.clone()),
    }
}

fn binop_of(name: &str) -> Option<BinOp> {
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

fn unop_of(name: &str) -> Option<UnOp> {
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

// ---- Expr -------------------------------------------------------------------------------------

/// `rivet.te.Expr`: a typed expression (shared, immutable). Operators build new expressions;
/// a type error raises `rivet.CompileError` at once.
#[pyclass(name = "Expr", module = "rivet.te", subclass, frozen)]
pub struct PyExpr {
    pub e: Expr,
}

impl PyExpr {
    /// `a ** b` (three-argument pow with a modulus is refused).
    fn pow(
        &self,
        o: &Bound<'_, PyAny>,
        modulo: Option<&Bound<'_, PyAny>>,
        reflected: bool,
    ) -> PyResult<Py<PyAny>> {
        if modulo.is_some_and(|m| !m.is_none()) {
            return Err(compile_err(
                o.py(),
                "pow with a modulus is not supported on te.Expr".into(),
            ));
        }
        self.arith(o, BinOp::Pow, reflected)
    }

    fn arith(&self, other: &Bound<'_, PyAny>, op: BinOp, reflected: bool) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Some(o) = operand(other)? else {
            return Ok(py.NotImplemented());
        };
        let me = Operand::Expr(self.e.clone());
        let (a, b) = if reflected {
            pair(py, o, me)?
        } else {
            pair(py, me, o)?
        };
        new_expr(py, Expr::binary(op, a, b).cpy(py)?)
    }

    fn logic(
        &self,
        other: &Bound<'_, PyAny>,
        op: LogicOp,
        sym: &str,
        reflected: bool,
    ) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Some(o) = operand(other)? else {
            return Ok(py.NotImplemented());
        };
        let me = Operand::Expr(self.e.clone());
        let (a, b) = if reflected {
            pair(py, o, me)?
        } else {
            pair(py, me, o)?
        };
        if a.dtype() != DType::Bool || b.dtype() != DType::Bool {
            return Err(compile_err(
                py,
                format!(
                    "'{sym}' is logical {} and needs bool operands, got {} ({a}) and {} ({b}); \
                     compare first (e.g. x > 0) or use te.cast('bool', ...)",
                    if op == LogicOp::And { "and" } else { "or" },
                    a.dtype(),
                    b.dtype()
                ),
            ));
        }
        new_expr(py, Expr::logic(op, a, b).cpy(py)?)
    }
}

#[pymethods]
impl PyExpr {
    #[getter]
    fn dtype(&self) -> String {
        self.e.dtype().to_string()
    }

    /// The Python value of a constant (None for other expressions).
    #[getter]
    fn value(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match (self.e.kind(), self.e.dtype()) {
            (ExprKind::Const(Const::Int(v)), DType::Bool) => {
                PyBool::new(py, *v != 0).to_owned().into_any().unbind()
            }
            (ExprKind::Const(Const::Int(v)), _) => v.into_pyobject(py)?.into_any().unbind(),
            (ExprKind::Const(Const::Float(v)), _) => v.into_pyobject(py)?.into_any().unbind(),
            _ => py.None(),
        })
    }

    /// This expression converted to `dtype` (same as `te.cast(dtype, self)`).
    fn astype(&self, py: Python<'_>, dtype: &str) -> PyResult<Py<PyAny>> {
        new_expr(py, Expr::cast(parse_dtype(py, dtype)?, self.e.clone()))
    }

    /// True when both are the very same expression node.
    fn same_as(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyExpr>()
            .is_ok_and(|o| o.get().e.same(&self.e))
    }

    fn __repr__(&self) -> String {
        self.e.to_string()
    }

    fn __str__(&self) -> String {
        self.e.to_string()
    }

    /// Identity hash, so expressions (and iteration variables) can be dict keys even though
    /// `==` builds an expression.
    fn __hash__(slf: &Bound<'_, Self>) -> isize {
        slf.as_ptr() as isize
    }

    fn __bool__(&self) -> PyResult<bool> {
        Err(PyTypeError::new_err(format!(
            "a te.Expr has no truth value ({}): it is evaluated in the kernel, not in Python. \
             Use te.if_then_else(cond, a, b) to choose a value, te.all / te.any (or & and |) to \
             combine conditions, and te.max / te.min instead of Python's max / min",
            self.e
        )))
    }

    fn __add__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::Add, false)
    }
    fn __radd__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::Add, true)
    }
    fn __sub__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::Sub, false)
    }
    fn __rsub__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::Sub, true)
    }
    fn __mul__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::Mul, false)
    }
    fn __rmul__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::Mul, true)
    }
    fn __truediv__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::Div, false)
    }
    fn __rtruediv__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::Div, true)
    }
    fn __floordiv__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::FloorDiv, false)
    }
    fn __rfloordiv__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::FloorDiv, true)
    }
    fn __mod__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::FloorMod, false)
    }
    fn __rmod__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(o, BinOp::FloorMod, true)
    }
    fn __pow__(
        &self,
        o: &Bound<'_, PyAny>,
        modulo: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.pow(o, modulo, false)
    }
    fn __rpow__(
        &self,
        o: &Bound<'_, PyAny>,
        modulo: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.pow(o, modulo, true)
    }
    fn __and__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.logic(o, LogicOp::And, "&", false)
    }
    fn __rand__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.logic(o, LogicOp::And, "&", true)
    }
    fn __or__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.logic(o, LogicOp::Or, "|", false)
    }
    fn __ror__(&self, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.logic(o, LogicOp::Or, "|", true)
    }
    fn __neg__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        new_expr(py, Expr::unary(UnOp::Neg, self.e.clone()).cpy(py)?)
    }
    fn __pos__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        new_expr(slf.py(), slf.get().e.clone())
    }
    fn __abs__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        new_expr(py, Expr::unary(UnOp::Abs, self.e.clone()).cpy(py)?)
    }
    fn __invert__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if self.e.dtype() != DType::Bool {
            return Err(compile_err(
                py,
                format!(
                    "'~' is logical not and needs a bool expression, got {} ({}); compare first (e.g. x == 0)",
                    self.e.dtype(),
                    self.e
                ),
            ));
        }
        new_expr(py, Expr::unary(UnOp::Not, self.e.clone()).cpy(py)?)
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Some(o) = operand(other)? else {
            return Ok(py.NotImplemented());
        };
        let (a, b) = pair(py, Operand::Expr(self.e.clone()), o)?;
        let cop = match op {
            CompareOp::Lt => CmpOp::Lt,
            CompareOp::Le => CmpOp::Le,
            CompareOp::Eq => CmpOp::Eq,
            CompareOp::Ne => CmpOp::Ne,
            CompareOp::Gt => CmpOp::Gt,
            CompareOp::Ge => CmpOp::Ge,
        };
        new_expr(py, Expr::cmp(cop, a, b).cpy(py)?)
    }
}

// ---- IterVar ---------------------------------------------------------------------------------

/// `rivet.te.IterVar`: a loop axis (data-parallel or reduction), usable as an int64 expression.
#[pyclass(name = "IterVar", module = "rivet.te", extends = PyExpr, frozen)]
pub struct PyIterVar {
    pub iv: IterVar,
}

fn new_itervar(py: Python<'_>, iv: IterVar) -> PyResult<Py<PyIterVar>> {
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
fn axis_var(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Var> {
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

// ---- Tensor and Op ------------------------------------------------------------------------------

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
    new_expr(py, t.at(&indices).cpy(py)?)
}

#[pymethods]
impl PyTeTensor {
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
            } else {
                "compute"
            }
        )
    }
}

/// A te.Tensor (or its op) argument.
fn tensor_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Tensor> {
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
fn tensors_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<Tensor>> {
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return obj
            .try_iter()?
            .enumerate()
            .map(|(i, x)| tensor_arg(&x?, &format!("{what}[{i}]")))
            .collect();
    }
    Ok(vec![tensor_arg(obj, what)?])
}

// ---- DSL functions (wrapped by rivet/te.py) --------------------------------------------------------

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
        None => single(py, o)?,
        Some(d) => {
            let dt = parse_dtype(py, d)?;
            match o {
                // te.const(1.7, "int32") truncates, as a cast would; te.const(True, "float32") is 1.0.
                Operand::Bool(b) => Expr::const_int(b as i64, dt),
                Operand::Float(x) if !dt.is_float() => {
                    Expr::cast(dt, Expr::constant(x, DType::F64))
                }
                o => number_as(py, &o, dt, &dt)?,
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
    let (x, y) = pair(
        py,
        operand_or_err(a, &format!("te.{op}: argument 0"))?,
        operand_or_err(b, &format!("te.{op}: argument 1"))?,
    )?;
    new_expr(py, Expr::binary(bop, x, y).cpy(py)?)
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
    let (x, y) = pair(
        py,
        operand_or_err(a, "a condition")?,
        operand_or_err(b, "a condition")?,
    )?;
    new_expr(py, Expr::logic(lop, x, y).cpy(py)?)
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
    let c = expr_arg(cond, "te.if_then_else: condition")?;
    let (x, y) = pair(
        py,
        operand_or_err(a, "te.if_then_else: true value")?,
        operand_or_err(b, "te.if_then_else: false value")?,
    )?;
    new_expr(py, Expr::select(c, x, y).cpy(py)?)
}

// ---- Schedule and Stage ------------------------------------------------------------------------

/// `rivet.Schedule` (`rivet.create_schedule(C)`); `s[C]` is the stage of `C`.
#[pyclass(name = "Schedule", module = "rivet")]
pub struct PySchedule {
    pub sched: Schedule,
}

#[pyfunction]
pub fn create_schedule(py: Python<'_>, outputs: &Bound<'_, PyAny>) -> PyResult<PySchedule> {
    let outs = tensors_arg(outputs, "create_schedule: argument 0 ('outputs')")?;
    Ok(PySchedule {
        sched: Schedule::new(&outs).cpy(py)?,
    })
}

#[pymethods]
impl PySchedule {
    fn __getitem__(slf: &Bound<'_, Self>, t: &Bound<'_, PyAny>) -> PyResult<PyStage> {
        let py = slf.py();
        let t = tensor_arg(t, "s[...]")?;
        slf.borrow().sched.stage_index(&t).cpy(py)?;
        Ok(PyStage {
            sched: slf.clone().unbind(),
            t,
        })
    }
    #[getter]
    fn outputs(&self) -> Vec<PyTeTensor> {
        self.sched
            .outputs
            .iter()
            .map(|t| PyTeTensor { t: t.clone() })
            .collect()
    }
    /// Every stage, producers first.
    #[getter]
    fn stages(slf: &Bound<'_, Self>) -> Vec<PyStage> {
        slf.borrow()
            .sched
            .stages
            .iter()
            .map(|s| PyStage {
                sched: slf.clone().unbind(),
                t: s.tensor.clone(),
            })
            .collect()
    }
    fn __repr__(&self) -> String {
        let names: Vec<&str> = self.sched.stages.iter().map(|s| s.tensor.name()).collect();
        format!("rivet.Schedule(stages=[{}])", names.join(", "))
    }
}

/// The extents of every loop variable of a stage (root axes, then split / fused loops).
fn extents(st: &Stage) -> HashMap<Var, Expr> {
    let t = &st.tensor;
    let mut ext: HashMap<Var, Expr> = HashMap::new();
    for a in t.axis().iter().chain(t.reduce_axis()) {
        ext.insert(a.var.clone(), a.extent.clone());
    }
    for rel in &st.relations {
        match rel {
            Relation::Split {
                parent,
                outer,
                inner,
                factor,
                nparts,
            } => {
                let Some(pe) = ext.get(parent).cloned() else {
                    continue;
                };
                let (oe, ie) = match (factor, nparts) {
                    (Some(f), _) => (pe.add(f).sub(&Expr::int(1)).floordiv(f), f.clone()),
                    (None, Some(n)) => (n.clone(), pe.add(n).sub(&Expr::int(1)).floordiv(n)),
                    _ => continue,
                };
                ext.insert(outer.clone(), simplify(&oe));
                ext.insert(inner.clone(), simplify(&ie));
            }
            Relation::Fuse {
                outer,
                inner,
                fused,
            } => {
                if let (Some(o), Some(i)) = (ext.get(outer), ext.get(inner)) {
                    let f = simplify(&o.mul(i));
                    ext.insert(fused.clone(), f);
                }
            }
        }
    }
    ext
}

/// The IterVar of loop `v` of a stage.
fn leaf_itervar(py: Python<'_>, st: &Stage, v: &Var) -> PyResult<Py<PyIterVar>> {
    let ext = extents(st);
    let reduce = st
        .leaves
        .iter()
        .find(|l| &l.var == v)
        .map(|l| l.reduce)
        .unwrap_or(false);
    let extent = ext.get(v).cloned().unwrap_or_else(|| Expr::int(0));
    new_itervar(
        py,
        IterVar {
            var: v.clone(),
            min: Expr::int(0),
            extent,
            reduce,
        },
    )
}

fn factor_arg(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<Expr>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => Ok(Some(index_arg(o, what)?)),
    }
}

/// `(x.outer, y.outer, x.inner, y.inner)` of `Stage.tile`.
type TileAxes = (Py<PyIterVar>, Py<PyIterVar>, Py<PyIterVar>, Py<PyIterVar>);

/// `s[C]`: the loops of one stage; the primitives reshape and annotate them.
#[pyclass(name = "Stage", module = "rivet", frozen)]
pub struct PyStage {
    sched: Py<PySchedule>,
    t: Tensor,
}

impl PyStage {
    /// Runs `f` on this stage (inside the schedule, mutably).
    fn with<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Stage) -> rivet_compiler::Result<R>,
    ) -> PyResult<R> {
        let mut s = self.sched.bind(py).borrow_mut();
        let st = s.sched.stage(&self.t).cpy(py)?;
        f(st).cpy(py)
    }

    fn itervar(&self, py: Python<'_>, v: &Var) -> PyResult<Py<PyIterVar>> {
        let s = self.sched.bind(py).borrow();
        let i = s.sched.stage_index(&self.t).cpy(py)?;
        leaf_itervar(py, &s.sched.stages[i], v)
    }
}

#[pymethods]
impl PyStage {
    #[getter]
    fn op(&self) -> PyTensorOp {
        PyTensorOp { t: self.t.clone() }
    }

    /// The current loops, outermost first.
    #[getter]
    fn leaf_iter_vars(&self, py: Python<'_>) -> PyResult<Vec<Py<PyIterVar>>> {
        let s = self.sched.bind(py).borrow();
        let i = s.sched.stage_index(&self.t).cpy(py)?;
        let st = &s.sched.stages[i];
        st.leaves
            .iter()
            .map(|l| leaf_itervar(py, st, &l.var))
            .collect()
    }

    /// The loop kinds, outermost first ("serial", "parallel", "vectorized", "unrolled").
    #[getter]
    fn leaf_kinds(&self, py: Python<'_>) -> PyResult<Vec<&'static str>> {
        let s = self.sched.bind(py).borrow();
        let i = s.sched.stage_index(&self.t).cpy(py)?;
        Ok(s.sched.stages[i]
            .leaves
            .iter()
            .map(|l| match l.kind {
                ForKind::Serial => "serial",
                ForKind::Parallel => "parallel",
                ForKind::Vectorized => "vectorized",
                ForKind::Unrolled => "unrolled",
            })
            .collect())
    }

    /// "root", "inline" or "at".
    #[getter]
    fn attach(&self, py: Python<'_>) -> PyResult<&'static str> {
        let s = self.sched.bind(py).borrow();
        let i = s.sched.stage_index(&self.t).cpy(py)?;
        Ok(match s.sched.stages[i].attach {
            Attach::Root => "root",
            Attach::Inline => "inline",
            Attach::At { .. } => "at",
        })
    }

    /// Splits `parent` into `(outer, inner)`: `inner` has extent `factor`, or `outer` has
    /// extent `nparts`. Extents that do not divide are guarded.
    #[pyo3(signature = (parent, factor=None, nparts=None))]
    fn split(
        &self,
        py: Python<'_>,
        parent: &Bound<'_, PyAny>,
        factor: Option<&Bound<'_, PyAny>>,
        nparts: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Py<PyIterVar>, Py<PyIterVar>)> {
        let v = axis_var(parent, "split: argument 0 ('parent')")?;
        let factor = factor_arg(factor, "split: factor")?;
        let nparts = factor_arg(nparts, "split: nparts")?;
        let (o, i) = self.with(py, |st| st.split(&v, factor, nparts))?;
        Ok((self.itervar(py, &o)?, self.itervar(py, &i)?))
    }

    /// Fuses adjacent loops, outer first: `fuse(a, b, c)` is `fuse(fuse(a, b), c)`.
    #[pyo3(signature = (*axes))]
    fn fuse(&self, py: Python<'_>, axes: &Bound<'_, PyTuple>) -> PyResult<Py<PyIterVar>> {
        let vars: Vec<Var> = axes
            .iter()
            .enumerate()
            .map(|(i, a)| axis_var(&a, &format!("fuse: argument {i}")))
            .collect::<PyResult<_>>()?;
        let Some(first) = vars.first().cloned() else {
            return Err(compile_err(
                py,
                format!(
                    "schedule of '{}': fuse needs at least one loop",
                    self.t.name()
                ),
            ));
        };
        let fused = self.with(py, |st| {
            let mut acc = first;
            for v in &vars[1..] {
                acc = st.fuse(&acc, v)?;
            }
            Ok(acc)
        })?;
        self.itervar(py, &fused)
    }

    /// Puts the given loops in this order (in the positions they occupy now).
    #[pyo3(signature = (*axes))]
    fn reorder(&self, py: Python<'_>, axes: &Bound<'_, PyTuple>) -> PyResult<()> {
        let vars: Vec<Var> = axes
            .iter()
            .enumerate()
            .map(|(i, a)| axis_var(&a, &format!("reorder: argument {i}")))
            .collect::<PyResult<_>>()?;
        self.with(py, |st| st.reorder(&vars))
    }

    /// Tiles two loops: `(x.outer, y.outer, x.inner, y.inner)` in that loop order.
    fn tile(
        &self,
        py: Python<'_>,
        x_parent: &Bound<'_, PyAny>,
        y_parent: &Bound<'_, PyAny>,
        x_factor: &Bound<'_, PyAny>,
        y_factor: &Bound<'_, PyAny>,
    ) -> PyResult<TileAxes> {
        let x = axis_var(x_parent, "tile: argument 0 ('x_parent')")?;
        let y = axis_var(y_parent, "tile: argument 1 ('y_parent')")?;
        let xf = index_arg(x_factor, "tile: x_factor")?;
        let yf = index_arg(y_factor, "tile: y_factor")?;
        let (xo, yo, xi, yi) = self.with(py, |st| st.tile(&x, &y, xf, yf))?;
        Ok((
            self.itervar(py, &xo)?,
            self.itervar(py, &yo)?,
            self.itervar(py, &xi)?,
            self.itervar(py, &yi)?,
        ))
    }

    fn unroll(&self, py: Python<'_>, axis: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = axis_var(axis, "unroll: argument 0")?;
        self.with(py, |st| st.unroll(&v))
    }

    fn vectorize(&self, py: Python<'_>, axis: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = axis_var(axis, "vectorize: argument 0")?;
        self.with(py, |st| st.vectorize(&v))
    }

    fn parallel(&self, py: Python<'_>, axis: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = axis_var(axis, "parallel: argument 0")?;
        self.with(py, |st| st.parallel(&v))
    }

    /// Substitutes this stage into its consumers (no buffer, no loops of its own).
    fn compute_inline(&self, py: Python<'_>) -> PyResult<()> {
        let mut s = self.sched.bind(py).borrow_mut();
        s.sched.compute_inline(&self.t).cpy(py)
    }

    /// Computes this stage inside loop `axis` of `parent` (a stage or a tensor), over the
    /// region one iteration of that loop reads.
    fn compute_at(
        &self,
        py: Python<'_>,
        parent: &Bound<'_, PyAny>,
        axis: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let consumer = match parent.cast::<PyStage>() {
            Ok(st) => {
                let st = st.get();
                if !st.sched.is(&self.sched) {
                    return Err(compile_err(
                        py,
                        format!(
                            "schedule of '{}': compute_at target belongs to another schedule",
                            self.t.name()
                        ),
                    ));
                }
                st.t.clone()
            }
            Err(_) => tensor_arg(parent, "compute_at: argument 0 ('parent')")?,
        };
        let v = axis_var(axis, "compute_at: argument 1 ('axis')")?;
        let mut s = self.sched.bind(py).borrow_mut();
        s.sched.compute_at(&self.t, &consumer, &v).cpy(py)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let s = self.sched.bind(py).borrow();
        let loops = match s.sched.stage_index(&self.t) {
            Ok(i) => s.sched.stages[i]
                .leaves
                .iter()
                .map(|l| l.var.name.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            Err(_) => String::new(),
        };
        format!("rivet.Stage({}, loops=[{loops}])", self.t.name())
    }
}

// ---- build and Module ----------------------------------------------------------------------------

/// `rivet.Module`: the functions of one `build` (or of a loaded file).
#[pyclass(name = "Module", module = "rivet", frozen)]
pub struct PyModule_ {
    pub m: rivet_compiler::Module,
}

/// `checked=None` follows the environment (`RIVET_CHECKED=1`); True / False force it.
#[pyfunction]
#[pyo3(signature = (s, args, target="cpu", name="default_function", checked=None))]
pub fn build(
    py: Python<'_>,
    s: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
    target: &str,
    name: &str,
    checked: Option<bool>,
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
    let m = rivet_compiler::build::build_with(&sched.sched, &args, target, name, opts).cpy(py)?;
    Ok(PyModule_ { m })
}

#[pymethods]
impl PyModule_ {
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

/// Registers the classes and functions of this file on `rivet._native`.
pub fn register(m: &Bound<'_, pyo3::types::PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Expr", py.get_type::<PyExpr>())?;
    m.add("IterVar", py.get_type::<PyIterVar>())?;
    m.add("TeTensor", py.get_type::<PyTeTensor>())?;
    m.add("Op", py.get_type::<PyTensorOp>())?;
    m.add("Schedule", py.get_type::<PySchedule>())?;
    m.add("Stage", py.get_type::<PyStage>())?;
    m.add("Module", py.get_type::<PyModule_>())?;
    m.add_function(wrap_pyfunction!(te_var, m)?)?;
    m.add_function(wrap_pyfunction!(te_const, m)?)?;
    m.add_function(wrap_pyfunction!(te_placeholder, m)?)?;
    m.add_function(wrap_pyfunction!(te_reduce_axis, m)?)?;
    m.add_function(wrap_pyfunction!(te_axis, m)?)?;
    m.add_function(wrap_pyfunction!(te_compute, m)?)?;
    m.add_function(wrap_pyfunction!(te_reduce, m)?)?;
    m.add_function(wrap_pyfunction!(te_binary, m)?)?;
    m.add_function(wrap_pyfunction!(te_unary, m)?)?;
    m.add_function(wrap_pyfunction!(te_logic, m)?)?;
    m.add_function(wrap_pyfunction!(te_cast, m)?)?;
    m.add_function(wrap_pyfunction!(te_select, m)?)?;
    m.add_function(wrap_pyfunction!(create_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(build, m)?)?;
    m.add_function(wrap_pyfunction!(load_module, m)?)?;
    Ok(())
}
