//! The DSL's functions and Rust operators: `var`, `reduce_axis`, reductions, math functions,
//! `if_then_else`, `cast`, and `+ - * / %` on `Expr` (with numbers taking the other operand's
//! dtype). Checked functions return `Result`; the operators cannot, so a type error inside an
//! operator yields an `Invalid` expression that `compute` reports as a `CompileError`.

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

/// Elementwise maximum / minimum of two expressions.
pub fn maximum(a: Expr, b: Expr) -> Result<Expr> {
    Expr::binary(BinOp::Max, a, b)
}
pub fn minimum(a: Expr, b: Expr) -> Result<Expr> {
    Expr::binary(BinOp::Min, a, b)
}

pub fn constant(value: f64, dtype: DType) -> Expr {
    Expr::constant(value, dtype)
}

pub fn cast(dtype: DType, e: Expr) -> Expr {
    Expr::cast(dtype, e)
}

pub fn if_then_else(cond: Expr, a: Expr, b: Expr) -> Result<Expr> {
    Expr::select(cond, a, b)
}

pub fn all(a: Expr, b: Expr) -> Result<Expr> {
    Expr::logic(LogicOp::And, a, b)
}
pub fn any(a: Expr, b: Expr) -> Result<Expr> {
    Expr::logic(LogicOp::Or, a, b)
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

pub fn pow(a: Expr, b: Expr) -> Result<Expr> {
    Expr::binary(BinOp::Pow, a, b)
}
pub fn floordiv(a: Expr, b: Expr) -> Result<Expr> {
    Expr::binary(BinOp::FloorDiv, a, b)
}
pub fn floormod(a: Expr, b: Expr) -> Result<Expr> {
    Expr::binary(BinOp::FloorMod, a, b)
}
pub fn compare(op: CmpOp, a: Expr, b: Expr) -> Result<Expr> {
    Expr::cmp(op, a, b)
}

/// A number as a constant of `like`'s dtype (Python's rule: numbers adapt to the expression).
pub fn number_like(v: f64, like: &Expr) -> Expr {
    Expr::constant(v, like.dtype())
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
                or_invalid(Expr::binary(BinOp::$op, self, rhs), dt)
            }
        }
        impl std::ops::$trait<&Expr> for &Expr {
            type Output = Expr;
            fn $method(self, rhs: &Expr) -> Expr {
                std::ops::$trait::$method(self.clone(), rhs.clone())
            }
        }
        impl std::ops::$trait<f64> for Expr {
            type Output = Expr;
            fn $method(self, rhs: f64) -> Expr {
                let r = number_like(rhs, &self);
                std::ops::$trait::$method(self, r)
            }
        }
        impl std::ops::$trait<i64> for Expr {
            type Output = Expr;
            fn $method(self, rhs: i64) -> Expr {
                let r = number_like(rhs as f64, &self);
                std::ops::$trait::$method(self, r)
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
