//! Exact integer evaluation for the decisions safety depends on: per-call bounds checks,
//! shape expressions, and the no-overflow obligations of the bounds proof.
//!
//! Generated code computes int64 index arithmetic with wrapping (as the interpreter does).
//! The bounds proof reasons about exact integers, so every check that guards memory must be
//! decided exactly: `eval_exact` computes in checked int64 arithmetic and reports an
//! overflow as `Err` — a check whose evaluation overflows has failed, never passed.
//! `static_range` bounds an expression over the symbolic dims (each in `[0, i64::MAX]`, being
//! sizes) in exact 128-bit arithmetic, so obligations that hold for every shape need no
//! per-call check at all.

use super::div::{floordiv_i64, floormod_i64};
use crate::ir::expr::{BinOp, CmpOp, Const, Expr, ExprKind, LogicOp, UnOp, Var};
use rivet_runtime::DType;

/// Why an exact evaluation failed.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalError {
    /// An int64 intermediate overflowed (the expression shown).
    Overflow(String),
    /// A variable with no value, or a node these checks never contain (a bug).
    Unsupported(String),
}

/// Evaluates an int64 / bool expression exactly (`&&`, `||` and `select` evaluate only what
/// they need, as generated code does).
pub fn eval_exact(e: &Expr, lookup: &dyn Fn(&Var) -> Option<i64>) -> Result<i64, EvalError> {
    let ov = || EvalError::Overflow(e.to_string());
    match e.kind() {
        ExprKind::Const(Const::Int(v)) if !e.dtype().is_float() => Ok(*v),
        ExprKind::Var(v) => lookup(v)
            .ok_or_else(|| EvalError::Unsupported(format!("unbound variable `{}`", v.name))),
        ExprKind::Unary(UnOp::Neg, a) => eval_exact(a, lookup)?.checked_neg().ok_or_else(ov),
        ExprKind::Unary(UnOp::Abs, a) => eval_exact(a, lookup)?.checked_abs().ok_or_else(ov),
        ExprKind::Unary(UnOp::Not, a) => Ok((eval_exact(a, lookup)? == 0) as i64),
        ExprKind::Binary(op, a, b) if e.dtype() == DType::I64 => {
            let (x, y) = (eval_exact(a, lookup)?, eval_exact(b, lookup)?);
            match op {
                BinOp::Add => x.checked_add(y).ok_or_else(ov),
                BinOp::Sub => x.checked_sub(y).ok_or_else(ov),
                BinOp::Mul => x.checked_mul(y).ok_or_else(ov),
                BinOp::FloorDiv if x == i64::MIN && y == -1 => Err(ov()),
                BinOp::FloorDiv => Ok(floordiv_i64(x, y)),
                BinOp::FloorMod => Ok(floormod_i64(x, y)),
                BinOp::Min => Ok(x.min(y)),
                BinOp::Max => Ok(x.max(y)),
                BinOp::Div | BinOp::Pow => Err(EvalError::Unsupported(e.to_string())),
            }
        }
        ExprKind::Cmp(op, a, b) if a.dtype() == DType::I64 => {
            let (x, y) = (eval_exact(a, lookup)?, eval_exact(b, lookup)?);
            Ok(match op {
                CmpOp::Eq => x == y,
                CmpOp::Ne => x != y,
                CmpOp::Lt => x < y,
                CmpOp::Le => x <= y,
                CmpOp::Gt => x > y,
                CmpOp::Ge => x >= y,
            } as i64)
        }
        ExprKind::Logic(op, a, b) => {
            let x = eval_exact(a, lookup)? != 0;
            Ok(match (op, x) {
                (LogicOp::And, false) => false,
                (LogicOp::Or, true) => true,
                _ => eval_exact(b, lookup)? != 0,
            } as i64)
        }
        ExprKind::Select(c, a, b) => {
            if eval_exact(c, lookup)? != 0 {
                eval_exact(a, lookup)
            } else {
                eval_exact(b, lookup)
            }
        }
        _ => Err(EvalError::Unsupported(e.to_string())),
    }
}

/// Whether [`eval_exact`] can evaluate every node of `e` (given its variables): int64 and
/// bool arithmetic, comparisons of int64s, logic and selects; no loads, floats or calls.
pub fn evaluable(e: &Expr) -> bool {
    let mut ok = true;
    e.visit(&mut |n| {
        ok &= match n.kind() {
            ExprKind::Const(Const::Int(_)) => !n.dtype().is_float(),
            ExprKind::Var(_) | ExprKind::Logic(..) | ExprKind::Select(..) => true,
            ExprKind::Unary(UnOp::Neg | UnOp::Abs | UnOp::Not, _) => true,
            ExprKind::Binary(BinOp::Div | BinOp::Pow, ..) => false,
            ExprKind::Binary(..) => n.dtype() == DType::I64,
            ExprKind::Cmp(_, a, _) => a.dtype() == DType::I64,
            _ => false,
        }
    });
    ok
}

/// An exact range `[lo, hi]` of an int64 expression for every value of the variables that
/// `is_dim` accepts (each in `[0, i64::MAX]`); `None` when another variable occurs, a node is
/// not understood, or the bounds leave 128 bits.
pub fn static_range(e: &Expr, is_dim: &dyn Fn(&Var) -> bool) -> Option<(i128, i128)> {
    if e.dtype() != DType::I64 {
        return None;
    }
    let r = |x: &Expr| static_range(x, is_dim);
    match e.kind() {
        ExprKind::Const(Const::Int(v)) => Some((*v as i128, *v as i128)),
        ExprKind::Var(v) if is_dim(v) => Some((0, i64::MAX as i128)),
        ExprKind::Unary(UnOp::Neg, a) => {
            let (l, h) = r(a)?;
            Some((h.checked_neg()?, l.checked_neg()?))
        }
        ExprKind::Binary(op, a, b) => {
            let ((al, ah), (bl, bh)) = (r(a)?, r(b)?);
            match op {
                BinOp::Add => Some((al.checked_add(bl)?, ah.checked_add(bh)?)),
                BinOp::Sub => Some((al.checked_sub(bh)?, ah.checked_sub(bl)?)),
                BinOp::Mul => {
                    let c = [
                        al.checked_mul(bl)?,
                        al.checked_mul(bh)?,
                        ah.checked_mul(bl)?,
                        ah.checked_mul(bh)?,
                    ];
                    Some((*c.iter().min()?, *c.iter().max()?))
                }
                // Divisors >= 0 (a zero divisor gives 0): `|x // d| <= |x|`, and the
                // quotient keeps x's sign; a constant divisor is exact.
                BinOp::FloorDiv if bl == bh && bl > 0 => {
                    Some((al.div_euclid(bl), ah.div_euclid(bl)))
                }
                BinOp::FloorDiv if bl >= 0 => Some((al.min(0), ah.max(0))),
                BinOp::FloorMod if bl >= 0 => Some((0, (bh - 1).max(0))),
                BinOp::Min => Some((al.min(bl), ah.min(bh))),
                BinOp::Max => Some((al.max(bl), ah.max(bh))),
                _ => None,
            }
        }
        ExprKind::Select(_, a, b) => {
            let ((al, ah), (bl, bh)) = (r(a)?, r(b)?);
            Some((al.min(bl), ah.max(bh)))
        }
        _ => None,
    }
}

/// True when `static_range` proves `e` within int64 for every value of the dims.
pub fn always_in_i64(e: &Expr, is_dim: &dyn Fn(&Var) -> bool) -> bool {
    static_range(e, is_dim).is_some_and(|(l, h)| l >= i64::MIN as i128 && h <= i64::MAX as i128)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let big = Expr::int(1 << 61);
        let e = Expr::int(8).mul(&big);
        assert!(matches!(
            eval_exact(&e, &|_| None),
            Err(EvalError::Overflow(_))
        ));
        let m = Expr::int(i64::MIN).floordiv(&Expr::int(-1));
        assert!(matches!(
            eval_exact(&m, &|_| None),
            Err(EvalError::Overflow(_))
        ));
        let n = Var::new("n");
        let e = Expr::var(&n).mul(&big);
        assert_eq!(eval_exact(&e, &|_| Some(3)), Ok(3 << 61));
        assert!(eval_exact(&e, &|_| Some(4)).is_err());
        // `||` does not evaluate its right side when the left one holds.
        let c = Expr::logic(LogicOp::Or, Expr::bool(true), Expr::int(0).lt(&e)).unwrap();
        assert_eq!(eval_exact(&c, &|_| Some(i64::MAX)), Ok(1));
    }

    #[test]
    fn static_ranges_over_dims() {
        let n = Var::new("n");
        let dim = |v: &Var| v.name.as_ref() == "n";
        let ne = Expr::var(&n);
        // (n - 1) // 32 * 32 + 31 never leaves int64; n + 31 may.
        let e = ne
            .sub(&Expr::int(1))
            .floordiv(&Expr::int(32))
            .mul(&Expr::int(32))
            .add(&Expr::int(31));
        assert!(always_in_i64(&e, &dim));
        assert!(!always_in_i64(&ne.add(&Expr::int(31)), &dim));
        assert!(!always_in_i64(&ne.mul(&ne), &dim));
        assert!(always_in_i64(&ne.sub(&Expr::int(1)), &dim));
        let m = Var::new("m");
        assert!(static_range(&Expr::var(&m), &dim).is_none());
    }
}
