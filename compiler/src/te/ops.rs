//! The DSL's functions and Rust operators: `var`, `reduce_axis`, reductions, math functions,
//! `if_then_else`, `cast`, and `+ - * / %` on `Expr`. Operands are expressions or numbers
//! (`impl Into<Operand>`); numbers follow the one mixed-type rule of `te::number`, shared with
//! the Python DSL (`i * 2.0` is `i * 2`, `i * 0.5` is an error). Checked functions return
//! `Result`; the operators cannot, so a type error inside an operator yields an `Invalid`
//! expression that `compute` reports as a `CompileError`.

use super::number::{number_as, operand, operands, Number, Operand};
use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, CmpOp, Expr, ExprKind, IterVar, LogicOp, ReduceOp, UnOp, Var};
use rivet_runtime::DType;

/// A symbolic int64 dim, bound from the arguments' shapes at call time.
pub fn var(name: &str) -> Expr {
    Expr::var(&Var::new(name))
}

/// A reduction axis over `[lo, hi)`.
pub fn reduce_axis(lo: Expr, hi: Expr, name: &str) -> Result<IterVar> {
    if lo.dtype() != DType::I64 || hi.dtype() != DType::I64 {
        return Err(Error::Compile(format!(
            "reduce_axis '{name}': bounds must be int64 expressions"
        )));
    }
    let extent = crate::lower::simplify::simplify(&hi.sub(&lo));
    Ok(IterVar {
        var: Var::new(name),
        min: lo,
        extent,
        reduce: true,
    })
}

pub fn reduce(op: ReduceOp, body: Expr, axes: &[IterVar]) -> Result<Expr> {
    if body.dtype() == DType::Bool {
        return Err(Error::Compile(format!(
            "cannot reduce bool values ({body}); cast them first"
        )));
    }
    if axes.is_empty() {
        return Err(Error::Compile("a reduction needs at least one axis".into()));
    }
    if let Some(a) = axes.iter().find(|a| !a.reduce) {
        return Err(Error::Compile(format!(
            "'{}' is not a reduce_axis",
            a.var.name
        )));
    }
    let dt = body.dtype();
    Ok(Expr::new(
        ExprKind::Reduce {
            op,
            body,
            axes: axes.to_vec(),
        },
        dt,
    ))
}

pub fn sum(body: Expr, axes: &[IterVar]) -> Result<Expr> {
    reduce(ReduceOp::Sum, body, axes)
}
pub fn prod(body: Expr, axes: &[IterVar]) -> Result<Expr> {
    reduce(ReduceOp::Prod, body, axes)
}
pub fn max_over(body: Expr, axes: &[IterVar]) -> Result<Expr> {
    reduce(ReduceOp::Max, body, axes)
}
pub fn min_over(body: Expr, axes: &[IterVar]) -> Result<Expr> {
    reduce(ReduceOp::Min, body, axes)
}

/// `op` on two operands (expressions or numbers): what the operators `+ - * / %` build, in
/// checked form (`binary(BinOp::Mul, 0.5, x)` for Python's `0.5 * x`).
pub fn binary(op: BinOp, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    let (x, y) = operands(&format!("{op:?}"), a.into(), b.into())?;
    Expr::binary(op, x, y)
}

/// Elementwise maximum / minimum of two operands.
pub fn maximum(a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    binary(BinOp::Max, a, b)
}
pub fn minimum(a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    binary(BinOp::Min, a, b)
}

pub fn constant(value: f64, dtype: DType) -> Expr {
    Expr::constant(value, dtype)
}

pub fn cast(dtype: DType, e: Expr) -> Expr {
    Expr::cast(dtype, e)
}

/// `a` where `cond` holds, else `b`; a number for `cond` is a constant of its own dtype.
pub fn if_then_else(
    cond: impl Into<Operand>,
    a: impl Into<Operand>,
    b: impl Into<Operand>,
) -> Result<Expr> {
    let (x, y) = operands("if_then_else", a.into(), b.into())?;
    Expr::select(operand(cond.into()), x, y)
}

/// Logical and / or of two bool operands.
pub fn logic(op: LogicOp, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    let (x, y) = operands(&format!("{op:?}"), a.into(), b.into())?;
    Expr::logic(op, x, y)
}
pub fn all(a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    logic(LogicOp::And, a, b)
}
pub fn any(a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    logic(LogicOp::Or, a, b)
}
pub fn not(a: Expr) -> Result<Expr> {
    Expr::unary(UnOp::Not, a)
}

macro_rules! unary_fns {
    ($($name:ident => $op:ident),*) => {
        $(pub fn $name(a: Expr) -> Result<Expr> { Expr::unary(UnOp::$op, a) })*
    };
}
unary_fns!(exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt, tanh => Tanh, sigmoid => Sigmoid,
           abs => Abs, floor => Floor, ceil => Ceil, erf => Erf);

pub fn pow(a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    binary(BinOp::Pow, a, b)
}
pub fn floordiv(a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    binary(BinOp::FloorDiv, a, b)
}
pub fn floormod(a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    binary(BinOp::FloorMod, a, b)
}
pub fn compare(op: CmpOp, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    let (x, y) = operands(&format!("{op:?}"), a.into(), b.into())?;
    Expr::cmp(op, x, y)
}

/// A number as a constant of `like`'s dtype, by the mixed-type rule of `te::number` (an
/// `Invalid` expression, reported by `compute`, where that dtype cannot hold it).
pub fn number_like(v: f64, like: &Expr) -> Expr {
    or_invalid(
        number_as(Number::Float(v), like.dtype(), "number_like", like),
        like.dtype(),
    )
}

fn or_invalid(r: Result<Expr>, dt: DType) -> Expr {
    r.unwrap_or_else(|e| Expr::new(ExprKind::Invalid(e.to_string()), dt))
}

macro_rules! binop_impl {
    ($trait:ident, $method:ident, $op:ident) => {
        impl std::ops::$trait<Expr> for Expr {
            type Output = Expr;
            fn $method(self, rhs: Expr) -> Expr {
                let dt = self.dtype();
                or_invalid(binary(BinOp::$op, self, rhs), dt)
            }
        }
        impl std::ops::$trait<&Expr> for &Expr {
            type Output = Expr;
            fn $method(self, rhs: &Expr) -> Expr {
                std::ops::$trait::$method(self.clone(), rhs.clone())
            }
        }
        // Numbers follow the mixed-type rule (`i * 0.5` is an error, not `i * 0`).
        impl std::ops::$trait<f64> for Expr {
            type Output = Expr;
            fn $method(self, rhs: f64) -> Expr {
                let dt = self.dtype();
                or_invalid(binary(BinOp::$op, self, rhs), dt)
            }
        }
        impl std::ops::$trait<i64> for Expr {
            type Output = Expr;
            fn $method(self, rhs: i64) -> Expr {
                let dt = self.dtype();
                or_invalid(binary(BinOp::$op, self, rhs), dt)
            }
        }
    };
}
binop_impl!(Add, add, Add);
binop_impl!(Sub, sub, Sub);
binop_impl!(Mul, mul, Mul);
binop_impl!(Div, div, Div);
binop_impl!(Rem, rem, FloorMod);

impl std::ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        let dt = self.dtype();
        or_invalid(Expr::unary(UnOp::Neg, self), dt)
    }
}

/// For DSL closures (which return `Expr`): a failed construction becomes an `Invalid`
/// expression that `compute` reports as a `CompileError`.
pub fn ok(r: Result<Expr>) -> Expr {
    r.unwrap_or_else(|e| Expr::new(ExprKind::Invalid(e.to_string()), DType::F32))
}

/// An index variable as an expression (for `A.idx(&[i.clone(), ax(&k)])`).
pub fn ax(iv: &IterVar) -> Expr {
    Expr::var(&iv.var)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(e: &Expr) -> Option<&str> {
        match e.kind() {
            ExprKind::Invalid(m) => Some(m),
            _ => None,
        }
    }

    #[test]
    fn operators_refuse_a_float_that_an_int_expression_cannot_hold() {
        let i = var("i");
        // Was `i * 0`: the number was truncated to the expression's dtype.
        let e = i.clone() * 0.5;
        let m = invalid(&e).expect("i * 0.5 refused");
        assert!(
            m.contains("Mul") && m.contains("0.5") && m.contains("int64"),
            "{m}"
        );
        for e in [i.clone() + 0.5, i.clone() - 1.5, i.clone() % 0.25] {
            assert!(invalid(&e).is_some(), "{e}");
        }
        // Integral floats and ints are the int.
        assert_eq!((i.clone() * 2.0).to_string(), "(i * 2)");
        assert_eq!((i.clone() + 1).to_string(), "(i + 1)");
        assert!(binary(BinOp::Mul, 0.5, i.clone()).is_err());
        assert!(maximum(i.clone(), 0.5).is_err());
        assert!(compare(CmpOp::Lt, i.clone(), 0.5).is_err());
        assert_eq!(floordiv(i.clone(), 2.0).unwrap().to_string(), "(i // 2)");
    }

    #[test]
    fn numbers_adapt_to_float_expressions() {
        let x = crate::te::placeholder(&[Expr::int(4)], DType::F32, "X")
            .unwrap()
            .idx(&[Expr::int(0)]);
        for e in [
            x.clone() * 2,
            x.clone() * 0.5,
            x.clone() / 3,
            x.clone() % 1.5,
        ] {
            assert!(invalid(&e).is_none(), "{e}");
            assert_eq!(e.dtype(), DType::F32);
        }
        assert_eq!(maximum(x.clone(), 0).unwrap().dtype(), DType::F32);
        assert_eq!(pow(2.0, x.clone()).unwrap().dtype(), DType::F32);
        let positive = compare(CmpOp::Gt, x.clone(), 0.0).unwrap();
        assert_eq!(
            if_then_else(positive, x.clone(), 0).unwrap().dtype(),
            DType::F32
        );
        assert_eq!(number_like(0.5, &x).dtype(), DType::F32);
        // number_like follows the same rule: no silent truncation on an int expression.
        assert!(invalid(&number_like(0.5, &var("n"))).is_some());
        assert_eq!(number_like(3.0, &var("n")).as_int(), Some(3));
    }
}
