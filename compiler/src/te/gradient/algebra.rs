//! Expression builders for derivative code: the DSL's checked constructors (so every type
//! rule and the depth limit still hold, reported as `CompileError`), with the folds that keep
//! adjoints readable and cheap: `1 * x = x`, `x * 1 = x`, `0 + x = x`, `--x = x`, `true && c`.
//! Folding only drops multiplications by exactly one and additions of exactly zero, which
//! are exact in IEEE arithmetic except for the sign of a zero sum, which a gradient does not
//! promise.

use crate::error::Result;
use crate::ir::expr::{BinOp, CmpOp, Const, Expr, ExprKind, LogicOp, UnOp};
use rivet_runtime::DType;

pub fn is_float(e: &Expr) -> bool {
    e.dtype().is_float()
}

fn float_const(e: &Expr) -> Option<f64> {
    match e.kind() {
        ExprKind::Const(Const::Float(v)) if e.dtype().is_float() => Some(*v),
        _ => None,
    }
}

fn bool_const(e: &Expr) -> Option<bool> {
    match e.kind() {
        ExprKind::Const(Const::Int(v)) if e.dtype() == DType::Bool => Some(*v != 0),
        _ => None,
    }
}

pub fn constant(v: f64, dt: DType) -> Expr {
    Expr::constant(v, dt)
}

pub fn bin(op: BinOp, a: &Expr, b: &Expr) -> Result<Expr> {
    Expr::binary(op, a.clone(), b.clone())
}

pub fn add(a: &Expr, b: &Expr) -> Result<Expr> {
    if float_const(a) == Some(0.0) {
        return Ok(b.clone());
    }
    if float_const(b) == Some(0.0) {
        return Ok(a.clone());
    }
    bin(BinOp::Add, a, b)
}

pub fn sub(a: &Expr, b: &Expr) -> Result<Expr> {
    if float_const(b) == Some(0.0) {
        return Ok(a.clone());
    }
    bin(BinOp::Sub, a, b)
}

pub fn mul(a: &Expr, b: &Expr) -> Result<Expr> {
    if float_const(a) == Some(1.0) {
        return Ok(b.clone());
    }
    if float_const(b) == Some(1.0) {
        return Ok(a.clone());
    }
    bin(BinOp::Mul, a, b)
}

pub fn div(a: &Expr, b: &Expr) -> Result<Expr> {
    if float_const(b) == Some(1.0) {
        return Ok(a.clone());
    }
    bin(BinOp::Div, a, b)
}

pub fn neg(a: &Expr) -> Result<Expr> {
    if let ExprKind::Unary(UnOp::Neg, x) = a.kind() {
        return Ok(x.clone());
    }
    Expr::unary(UnOp::Neg, a.clone())
}

pub fn un(op: UnOp, a: &Expr) -> Result<Expr> {
    Expr::unary(op, a.clone())
}

pub fn cmp(op: CmpOp, a: &Expr, b: &Expr) -> Result<Expr> {
    Expr::cmp(op, a.clone(), b.clone())
}

pub fn not(a: &Expr) -> Result<Expr> {
    Expr::unary(UnOp::Not, a.clone())
}

pub fn and(a: &Expr, b: &Expr) -> Result<Expr> {
    if bool_const(a) == Some(true) {
        return Ok(b.clone());
    }
    if bool_const(b) == Some(true) {
        return Ok(a.clone());
    }
    Expr::logic(LogicOp::And, a.clone(), b.clone())
}

pub fn select(c: &Expr, a: &Expr, b: &Expr) -> Result<Expr> {
    Expr::select(c.clone(), a.clone(), b.clone())
}

/// The conjunction of `conds` (`None` when empty), as a balanced tree.
pub fn and_all(conds: Vec<Expr>) -> Result<Option<Expr>> {
    balanced(conds, &|a, b| and(a, b))
}

/// The sum of `terms` as a balanced tree (depth log2(n), so a tensor read from thousands of
/// places stays within the depth limit); an empty sum is an error for the caller to avoid.
pub fn sum_balanced(terms: Vec<Expr>) -> Result<Expr> {
    balanced(terms, &|a, b| add(a, b))?.ok_or_else(|| {
        crate::error::Error::Internal("te.gradient: an empty sum of adjoint terms".into())
    })
}

fn balanced(mut xs: Vec<Expr>, f: &dyn Fn(&Expr, &Expr) -> Result<Expr>) -> Result<Option<Expr>> {
    while xs.len() > 1 {
        let mut next = Vec::with_capacity(xs.len().div_ceil(2));
        let mut it = xs.into_iter();
        while let Some(a) = it.next() {
            match it.next() {
                Some(b) => next.push(f(&a, &b)?),
                None => next.push(a),
            }
        }
        xs = next;
    }
    Ok(xs.pop())
}

/// `e` with variables replaced, memoised on shared nodes (a body's DAG may be far smaller
/// than its tree; `Expr::substitute` walks the tree).
pub fn substitute(e: &Expr, map: &dyn Fn(&crate::ir::expr::Var) -> Option<Expr>) -> Expr {
    use std::collections::HashMap;
    use std::sync::Arc;
    fn go(
        e: &Expr,
        map: &dyn Fn(&crate::ir::expr::Var) -> Option<Expr>,
        memo: &mut HashMap<usize, Expr>,
    ) -> Expr {
        let k = Arc::as_ptr(&e.0) as usize;
        if let Some(r) = memo.get(&k) {
            return r.clone();
        }
        let r = match e.as_var().and_then(map) {
            Some(r) => r,
            None => {
                let mut kids = |c: &Expr| go(c, map, memo);
                e.map_children(&mut kids)
            }
        };
        memo.insert(k, r.clone());
        r
    }
    go(e, map, &mut HashMap::new())
}
