//! Numbers mixed with expressions: the one rule for mixed-type operands, followed by the Rust
//! DSL (`i * 2`, `x + 0.5`, `te::maximum(x, 0.0)`) and by the Python one (`i * 2`, `0.5 + x`,
//! `te.max(x, 0.0)`: the bindings hand their operands to `operands`).
//!
//! A number takes the dtype of the expression it is combined with, when that dtype holds it:
//! - an int into a float dtype: always (`x * 2` is `x * 2.0`);
//! - an int into an int dtype: when it is in the dtype's range (`x_int8 + 300` is an error);
//!   into bool: 0 or 1;
//! - a float into a float dtype: always (rounded to the dtype as a constant is);
//! - a float into an int dtype: only an integer in range (`i * 2.0` is `i * 2`; `i * 0.5` is an
//!   error, never a silent `i * 0`); never into bool;
//! - a bool is a bool constant whatever the other operand (`x + true` is then a dtype error of
//!   the operation).
//!
//! Two numbers (no expression): the wider kind decides, float (float32) over int (int64) over
//! bool. Two expressions are left to the operation's own rule (`Expr::binary`, ...). A refusal
//! is a `CompileError` naming the operation, the number, the other operand and both dtypes.

use crate::error::{Error, Result};
use crate::ir::expr::{int_range, Expr};
use rivet_runtime::DType;
use std::fmt;

/// A number written where an expression goes (a Rust or Python literal, a numpy scalar).
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// assert_eq!(te::Number::Int(3).default_dtype(), DType::I64);
/// assert_eq!(te::Number::Float(0.5).default_dtype(), DType::F32);
/// // A number beside an expression takes the expression's dtype, when that dtype holds it.
/// let x8 = te::placeholder([4], DType::I8, "X")?.at([0]);
/// assert_eq!(te::check(&x8 + 127)?.dtype(), DType::I8);
/// let e = te::check(&x8 + 300).unwrap_err();
/// assert!(e.to_string().contains("the int 300 does not fit in int8"), "{e}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    /// `true` / `false`: a bool constant whatever the other operand.
    Bool(bool),
    /// An integer literal.
    Int(i64),
    /// A float literal.
    Float(f64),
}

impl Number {
    /// The dtype of a number on its own (`te.const(v)`): bool, int64, float32.
    pub fn default_dtype(self) -> DType {
        match self {
            Number::Bool(_) => DType::Bool,
            Number::Int(_) => DType::I64,
            Number::Float(_) => DType::F32,
        }
    }

    /// Float over int over bool: the kind that decides between two numbers.
    fn rank(self) -> u8 {
        match self {
            Number::Bool(_) => 0,
            Number::Int(_) => 1,
            Number::Float(_) => 2,
        }
    }
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Number::Bool(b) => write!(f, "{b}"),
            Number::Int(v) => write!(f, "{v}"),
            Number::Float(x) => write!(f, "{x:?}"),
        }
    }
}

/// One operand of an operation: an expression or a number.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let ops: [te::Operand; 3] = [te::var("i").into(), 2.into(), 0.5.into()];
/// assert!(matches!(ops[1], te::Operand::Number(te::Number::Int(2))));
/// // What `maximum`, `if_then_else`, `binary`, ... take: expressions and numbers alike.
/// let x = te::placeholder([4], DType::F32, "X")?;
/// assert_eq!(te::check(te::maximum(2, x.at([0])))?.dtype(), DType::F32);
/// // Two numbers: the wider kind decides (float32 over int64).
/// assert_eq!(te::check(te::maximum(1, 2.5))?.dtype(), DType::F32);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub enum Operand {
    /// An expression (an axis becomes its variable's expression).
    Expr(Expr),
    /// A number, converted by the rule of this module when combined.
    Number(Number),
}

impl From<Expr> for Operand {
    fn from(e: Expr) -> Operand {
        Operand::Expr(e)
    }
}
impl From<&Expr> for Operand {
    fn from(e: &Expr) -> Operand {
        Operand::Expr(e.clone())
    }
}
impl From<&crate::ir::expr::IterVar> for Operand {
    fn from(a: &crate::ir::expr::IterVar) -> Operand {
        Operand::Expr(Expr::var(&a.var))
    }
}
impl From<Number> for Operand {
    fn from(n: Number) -> Operand {
        Operand::Number(n)
    }
}
impl From<bool> for Operand {
    fn from(b: bool) -> Operand {
        Operand::Number(Number::Bool(b))
    }
}
impl From<i64> for Operand {
    fn from(v: i64) -> Operand {
        Operand::Number(Number::Int(v))
    }
}
impl From<i32> for Operand {
    fn from(v: i32) -> Operand {
        Operand::Number(Number::Int(v.into()))
    }
}
impl From<u32> for Operand {
    fn from(v: u32) -> Operand {
        Operand::Number(Number::Int(v.into()))
    }
}
impl From<f64> for Operand {
    fn from(x: f64) -> Operand {
        Operand::Number(Number::Float(x))
    }
}
impl From<f32> for Operand {
    fn from(x: f32) -> Operand {
        Operand::Number(Number::Float(x.into()))
    }
}

/// `n` as a constant of `dt`: the dtype of `other`, the other operand of the operation `op`
/// (`op` and `other` only name things in the error message).
pub fn number_as(n: Number, dt: DType, op: &str, other: &dyn fmt::Display) -> Result<Expr> {
    match n {
        Number::Bool(b) => Ok(Expr::bool(b)),
        Number::Int(v) if dt.is_float() => Ok(Expr::const_int(v, dt)),
        Number::Int(v) => {
            let (lo, hi) = int_range(dt);
            if i128::from(v) < lo || i128::from(v) > hi {
                return Err(Error::Compile(format!(
                    "{op}: the int {v} does not fit in {dt}, the dtype of the other operand ({other}); \
                     use te.cast to widen it"
                )));
            }
            if dt == DType::Bool {
                return Ok(Expr::bool(v != 0));
            }
            Ok(Expr::const_int(v, dt))
        }
        Number::Float(x) if dt.is_float() => Ok(Expr::constant(x, dt)),
        Number::Float(x) => {
            let (lo, hi) = int_range(dt);
            // |x| < 9e15: below 2^53, so the integer is exact and inside int64.
            if dt != DType::Bool
                && x.fract() == 0.0
                && x >= lo as f64
                && x <= hi as f64
                && x.abs() < 9.0e15
            {
                return Ok(Expr::const_int(x as i64, dt));
            }
            Err(Error::Compile(format!(
                "{op}: the float {x:?} cannot be used as a {dt} constant (the other operand, {other}, \
                 is {dt}); cast the expression to a float dtype first, e.g. te.cast('float32', e)"
            )))
        }
    }
}

/// One operand on its own: a number takes its default dtype.
pub fn operand(a: Operand) -> Expr {
    match a {
        Operand::Expr(e) => e,
        Operand::Number(n) => match n {
            Number::Bool(b) => Expr::bool(b),
            Number::Int(v) => Expr::int(v),
            Number::Float(x) => Expr::constant(x, DType::F32),
        },
    }
}

/// The two operands of `op` as expressions, numbers converted by the rule of this module.
pub fn operands(op: &str, a: Operand, b: Operand) -> Result<(Expr, Expr)> {
    match (a, b) {
        (Operand::Expr(x), Operand::Expr(y)) => Ok((x, y)),
        (Operand::Expr(x), Operand::Number(n)) => {
            let y = number_as(n, x.dtype(), op, &x)?;
            Ok((x, y))
        }
        (Operand::Number(n), Operand::Expr(y)) => Ok((number_as(n, y.dtype(), op, &y)?, y)),
        (Operand::Number(m), Operand::Number(n)) => {
            let dt = if m.rank() >= n.rank() {
                m.default_dtype()
            } else {
                n.default_dtype()
            };
            Ok((number_as(m, dt, op, &dt)?, number_as(n, dt, op, &dt)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::expr::Var;

    fn of(dt: DType) -> Expr {
        crate::te::placeholder(&[Expr::int(4)], dt, "X")
            .unwrap()
            .try_at(&[Expr::int(0)])
            .unwrap()
    }

    fn err(r: Result<(Expr, Expr)>) -> String {
        match r {
            Err(Error::Compile(m)) => m,
            other => panic!("expected a CompileError, got {other:?}"),
        }
    }

    #[test]
    fn ints_take_the_expression_dtype_when_they_fit() {
        let (_, c) = operands("Add", of(DType::I8).into(), 127.into()).unwrap();
        assert_eq!((c.dtype(), c.as_int()), (DType::I8, Some(127)));
        let (_, c) = operands("Mul", of(DType::F32).into(), 2.into()).unwrap();
        assert_eq!(c.dtype(), DType::F32);
        let (c, _) = operands("Sub", 3.into(), of(DType::U8).into()).unwrap();
        assert_eq!(c.dtype(), DType::U8);
        let m = err(operands("Add", of(DType::I8).into(), 300.into()));
        assert!(
            m.contains("Add") && m.contains("300") && m.contains("int8"),
            "{m}"
        );
        let m = err(operands("Add", (-1).into(), of(DType::U32).into()));
        assert!(m.contains("does not fit in uint32"), "{m}");
        let (_, c) = operands("And", of(DType::Bool).into(), 1.into()).unwrap();
        assert_eq!(c.dtype(), DType::Bool);
        assert!(operands("And", of(DType::Bool).into(), 2.into()).is_err());
    }

    #[test]
    fn floats_into_int_dtypes_only_when_integral() {
        let i = Expr::var(&Var::new("i"));
        let m = err(operands("Mul", i.clone().into(), 0.5.into()));
        assert!(
            m.contains("Mul")
                && m.contains("0.5")
                && m.contains("float")
                && m.contains("int64")
                && m.contains("the other operand, i,"),
            "{m}"
        );
        let (_, c) = operands("Mul", i.clone().into(), 2.0.into()).unwrap();
        assert_eq!((c.dtype(), c.as_int()), (DType::I64, Some(2)));
        for bad in [f64::NAN, f64::INFINITY, 1e300, 2f64.powi(62)] {
            assert!(
                operands("Add", i.clone().into(), bad.into()).is_err(),
                "{bad}"
            );
        }
        assert!(operands("Add", of(DType::I8).into(), 128.0.into()).is_err());
        assert!(operands("And", of(DType::Bool).into(), 1.0.into()).is_err());
        let (c, _) = operands("Mul", 0.5.into(), of(DType::F16).into()).unwrap();
        assert_eq!(c.dtype(), DType::F16);
    }

    #[test]
    fn bools_stay_bool_and_two_numbers_take_the_wider_kind() {
        let (_, c) = operands("Add", of(DType::F32).into(), true.into()).unwrap();
        assert_eq!(c.dtype(), DType::Bool); // then Add refuses float32 + bool
        let (a, b) = operands("Select", 1.into(), 0.5.into()).unwrap();
        assert_eq!((a.dtype(), b.dtype()), (DType::F32, DType::F32));
        let (a, b) = operands("Select", true.into(), 3.into()).unwrap();
        assert_eq!((a.dtype(), b.dtype()), (DType::Bool, DType::I64));
        assert_eq!(operand(1.5.into()).dtype(), DType::F32);
        assert_eq!(operand(7.into()).as_int(), Some(7));
    }
}
