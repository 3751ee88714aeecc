//! `rivet.te.Expr`: the Python class of typed expressions and its operators (arithmetic,
//! comparisons, `&` `|` `~`, `**`, `astype`). Numbers are converted by `operand`; the type
//! rules are the compiler's (`Expr::binary`, ...).

use super::operand::{new_expr, operand, pair};
use super::{compile_err, parse_dtype};
use crate::errors::CompileResult;
use pyo3::basic::CompareOp;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyBool;
use rivet_compiler::ir::expr::{BinOp, CmpOp, Const, Expr, ExprKind, LogicOp, UnOp};
use rivet_compiler::te::{self, Operand};
use rivet_runtime::DType;

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
        let e = if reflected {
            te::binary(op, o, me)
        } else {
            te::binary(op, me, o)
        };
        new_expr(py, e.cpy(py)?)
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
        let name = format!("{op:?}");
        let (a, b) = if reflected {
            pair(py, &name, o, me)?
        } else {
            pair(py, &name, me, o)?
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
        let cop = match op {
            CompareOp::Lt => CmpOp::Lt,
            CompareOp::Le => CmpOp::Le,
            CompareOp::Eq => CmpOp::Eq,
            CompareOp::Ne => CmpOp::Ne,
            CompareOp::Gt => CmpOp::Gt,
            CompareOp::Ge => CmpOp::Ge,
        };
        new_expr(py, te::compare(cop, self.e.clone(), o).cpy(py)?)
    }
}
