//! Reverse mode inside one stage body: the partial derivative of the body with respect to
//! each element it reads, as expressions over the stage's iteration variables.
//!
//! Invariants:
//! - The walk is over the body's DAG (nodes identified by pointer), iterative, parents before
//!   children, so a node shared by several parents gets the sum of their adjoints and no
//!   recursion depends on the body's depth.
//! - An adjoint is a list of `Term`s, `expr` where `guard` holds and 0 elsewhere. Guards come
//!   from `if_then_else` conditions (and the max/min reduction's "is the extremum" test):
//!   they are kept apart from `expr` instead of being multiplied in, because a factor such as
//!   `exp(X[y - 1])` under a padding condition reads out of bounds where the condition fails;
//!   `Term::value` wraps each term in a `Select`, which evaluates only the chosen arm.
//! - Only float nodes on a path to a wanted read carry adjoints ("active"): an int index, a
//!   cast from an int, a comparison or a constant contributes nothing, and a branch that
//!   cannot reach a wanted tensor is never differentiated (so `pow(x, c)` never builds
//!   `log(x)`).

use super::algebra::{add, and, cmp, constant, div, is_float, mul, neg, not, select, sub, un};
use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, CmpOp, Expr, ExprKind, UnOp};
use crate::te::tensor::Tensor;
use std::collections::HashMap;
use std::sync::Arc;

/// `expr` where `guard` holds (always when `None`), 0 elsewhere.
#[derive(Clone, Debug)]
pub struct Term {
    pub guard: Option<Expr>,
    pub expr: Expr,
}

impl Term {
    /// The term as one expression (`select(guard, expr, 0)`).
    pub fn value(&self) -> Result<Expr> {
        match &self.guard {
            None => Ok(self.expr.clone()),
            Some(g) => select(g, &self.expr, &constant(0.0, self.expr.dtype())),
        }
    }
}

/// The adjoint of one read `tensor[indices]` of a body (reads with equal tensor and indices
/// are merged).
#[derive(Debug)]
pub struct ReadAdjoint {
    pub tensor: Tensor,
    pub indices: Vec<Expr>,
    pub terms: Vec<Term>,
}

impl ReadAdjoint {
    /// The sum of the terms as one expression.
    pub fn value(&self) -> Result<Expr> {
        let vals = self
            .terms
            .iter()
            .map(Term::value)
            .collect::<Result<Vec<_>>>()?;
        super::algebra::sum_balanced(vals)
    }
}

fn key(e: &Expr) -> usize {
    Arc::as_ptr(&e.0) as usize
}

/// The children a derivative flows into (float operands; never indices or conditions).
fn flow_children(e: &Expr) -> Vec<Expr> {
    let kids: Vec<Expr> = match e.kind() {
        ExprKind::Unary(_, a) | ExprKind::Cast(a) => vec![a.clone()],
        ExprKind::Binary(_, a, b) => vec![a.clone(), b.clone()],
        ExprKind::Select(_, a, b) => vec![a.clone(), b.clone()],
        ExprKind::Fma(a, b, c) => vec![a.clone(), b.clone(), c.clone()],
        _ => vec![],
    };
    kids.into_iter().filter(is_float).collect()
}

/// Adds `t` to a list of terms, merging with a term of the same guard. Equal terms merge as
/// `t * 2` (exact): the product rule gives a square `c * c` two equal terms (layer_norm's
/// squared deviation), which as a sum would cost every element of the gradient pass a
/// second load, subtraction and multiply.
fn push(list: &mut Vec<Term>, t: Term) -> Result<()> {
    if let Some(old) = list.iter_mut().find(|o| o.guard == t.guard) {
        old.expr = if old.expr == t.expr {
            super::algebra::mul(&old.expr, &constant(2.0, t.expr.dtype()))?
        } else {
            add(&old.expr, &t.expr)?
        };
    } else {
        list.push(t);
    }
    Ok(())
}

/// The adjoints of the reads of `body` whose tensor `wanted` accepts, given the body's own
/// adjoint `root` and, for an elementwise stage, the read of its own element (`root_value`,
/// equal to the body's value); `stage` names the stage in errors.
pub fn read_adjoints(
    body: &Expr,
    root: Term,
    root_value: Option<Expr>,
    wanted: &dyn Fn(&Tensor) -> bool,
    stage: &str,
) -> Result<Vec<ReadAdjoint>> {
    if !is_float(body) {
        return Ok(vec![]);
    }
    // Post-order over the float DAG (children first), iterative.
    let mut order: Vec<Expr> = Vec::new();
    let mut seen: HashMap<usize, ()> = HashMap::new();
    let mut stack: Vec<(Expr, bool)> = vec![(body.clone(), false)];
    while let Some((e, expanded)) = stack.pop() {
        if expanded {
            order.push(e);
            continue;
        }
        if seen.insert(key(&e), ()).is_some() {
            continue;
        }
        stack.push((e.clone(), true));
        for k in flow_children(&e).into_iter().rev() {
            if !seen.contains_key(&key(&k)) {
                stack.push((k, false));
            }
        }
    }
    // Active nodes: a wanted read, or a node with an active child.
    let mut active: HashMap<usize, bool> = HashMap::new();
    for e in &order {
        let a = match e.kind() {
            ExprKind::Read { tensor, .. } => wanted(&Tensor::of(tensor)),
            _ => flow_children(e)
                .iter()
                .any(|k| active.get(&key(k)).copied().unwrap_or(false)),
        };
        active.insert(key(e), a);
    }
    let is_active = |e: &Expr| active.get(&key(e)).copied().unwrap_or(false);
    if !is_active(body) {
        return Ok(vec![]);
    }
    let mut adj: HashMap<usize, Vec<Term>> = HashMap::new();
    adj.insert(key(body), vec![root]);
    let mut reads: Vec<ReadAdjoint> = Vec::new();
    for n in order.iter().rev() {
        let Some(terms) = adj.remove(&key(n)) else {
            continue;
        };
        if let ExprKind::Read { tensor, indices } = n.kind() {
            let t = Tensor::of(tensor);
            match reads
                .iter_mut()
                .find(|r| r.tensor == t && r.indices == *indices)
            {
                Some(r) => {
                    for term in terms {
                        push(&mut r.terms, term)?;
                    }
                }
                None => reads.push(ReadAdjoint {
                    tensor: t,
                    indices: indices.clone(),
                    terms,
                }),
            }
            continue;
        }
        // The body's own value is the stage's element: read it rather than recompute it
        // (`exp`, `tanh`, ... derivatives are written with it).
        let v = match &root_value {
            Some(rv) if key(n) == key(body) => rv,
            _ => n,
        };
        for (child, t) in local_rule(n, v, &terms, &is_active, stage)? {
            let list = adj.entry(key(&child)).or_default();
            push(list, t)?;
        }
    }
    Ok(reads)
}

/// The terms `n`'s adjoint `terms` sends to each active child; `v` is `n`'s value (`n`
/// itself, or the stage's stored element when `n` is the whole body).
fn local_rule(
    n: &Expr,
    v: &Expr,
    terms: &[Term],
    is_active: &dyn Fn(&Expr) -> bool,
    stage: &str,
) -> Result<Vec<(Expr, Term)>> {
    let dt = n.dtype();
    let c = |v: f64| constant(v, dt);
    let mut out: Vec<(Expr, Term)> = Vec::new();
    // Each term times `factor` (the same guard), sent to `child`.
    let mut scaled = |child: &Expr, f: &dyn Fn(&Expr) -> Result<Expr>| -> Result<()> {
        if !is_active(child) {
            return Ok(());
        }
        for t in terms {
            out.push((
                child.clone(),
                Term {
                    guard: t.guard.clone(),
                    expr: f(&t.expr)?,
                },
            ));
        }
        Ok(())
    };
    match n.kind() {
        ExprKind::Unary(op, a) => match op {
            UnOp::Neg => scaled(a, &|g| neg(g))?,
            // d exp(a) = exp(a): the node's own value.
            UnOp::Exp => scaled(a, &|g| mul(g, v))?,
            UnOp::Log => scaled(a, &|g| div(g, a))?,
            // d sqrt(a) = 0.5 / sqrt(a).
            UnOp::Sqrt => scaled(a, &|g| div(&mul(g, &c(0.5))?, v))?,
            // d a^-1/2 = -1/2 a^-3/2 = -1/2 n^3 (no division by a).
            UnOp::Rsqrt => scaled(a, &|g| mul(g, &mul(&c(-0.5), &mul(v, &mul(v, v)?)?)?))?,
            UnOp::Tanh => scaled(a, &|g| mul(g, &sub(&c(1.0), &mul(v, v)?)?))?,
            UnOp::Sigmoid => scaled(a, &|g| mul(g, &mul(v, &sub(&c(1.0), v)?)?))?,
            // d erf(a) = 2/sqrt(pi) exp(-a^2).
            UnOp::Erf => scaled(a, &|g| {
                let e = un(UnOp::Exp, &neg(&mul(a, a)?)?)?;
                mul(g, &mul(&c(std::f64::consts::FRAC_2_SQRT_PI), &e)?)
            })?,
            // sign(a), 0 at 0 (torch's rule).
            UnOp::Abs => scaled(a, &|g| {
                let zero = c(0.0);
                let sign = select(
                    &cmp(CmpOp::Gt, a, &zero)?,
                    &c(1.0),
                    &select(&cmp(CmpOp::Lt, a, &zero)?, &c(-1.0), &zero)?,
                )?;
                mul(g, &sign)
            })?,
            // Piecewise constant: zero almost everywhere.
            UnOp::Floor | UnOp::Ceil => {}
            UnOp::Not => {}
        },
        ExprKind::Binary(op, a, b) => match op {
            BinOp::Add => {
                scaled(a, &|g| Ok(g.clone()))?;
                scaled(b, &|g| Ok(g.clone()))?;
            }
            BinOp::Sub => {
                scaled(a, &|g| Ok(g.clone()))?;
                scaled(b, &|g| neg(g))?;
            }
            BinOp::Mul => {
                scaled(a, &|g| mul(g, b))?;
                scaled(b, &|g| mul(g, a))?;
            }
            BinOp::Div => {
                scaled(a, &|g| div(g, b))?;
                // d(a/b)/db = -a/b^2 = -(a/b)/b.
                scaled(b, &|g| neg(&div(&mul(g, v)?, b)?))?;
            }
            BinOp::Pow => {
                // d a^b/da = b a^(b-1).
                scaled(a, &|g| {
                    let p = super::algebra::bin(BinOp::Pow, a, &sub(b, &c(1.0))?)?;
                    mul(g, &mul(b, &p)?)
                })?;
                // d a^b/db = a^b log(a); 0 where a == 0 and b >= 0 (torch's rule: the limit,
                // where the formula would give 0 * -inf).
                scaled(b, &|g| {
                    let lg = mul(v, &un(UnOp::Log, a)?)?;
                    let at0 = and(&cmp(CmpOp::Eq, a, &c(0.0))?, &cmp(CmpOp::Ge, b, &c(0.0))?)?;
                    mul(g, &select(&at0, &c(0.0), &lg)?)
                })?;
            }
            BinOp::Max | BinOp::Min => {
                // The larger (smaller) operand gets the adjoint; on a tie each gets half
                // (torch.maximum / torch.minimum's rule).
                let wins = if *op == BinOp::Max {
                    CmpOp::Gt
                } else {
                    CmpOp::Lt
                };
                let share = |x: &Expr, y: &Expr| -> Result<Expr> {
                    select(
                        &cmp(wins, x, y)?,
                        &c(1.0),
                        &select(&cmp(CmpOp::Eq, x, y)?, &c(0.5), &c(0.0))?,
                    )
                };
                scaled(a, &|g| mul(g, &share(a, b)?))?;
                scaled(b, &|g| mul(g, &share(b, a)?))?;
            }
            // a // b is piecewise constant.
            BinOp::FloorDiv => {}
            // a % b = a - b * floor(a / b).
            BinOp::FloorMod => {
                scaled(a, &|g| Ok(g.clone()))?;
                scaled(b, &|g| {
                    let q = un(UnOp::Floor, &div(a, b)?)?;
                    neg(&mul(g, &q)?)
                })?;
            }
        },
        ExprKind::Cast(a) => {
            let to = a.dtype();
            scaled(a, &|g| Ok(Expr::cast(to, g.clone())))?;
        }
        ExprKind::Select(cond, a, b) => {
            // Through the chosen arm only: the condition joins the guard.
            for (arm, cnd) in [(a, cond.clone()), (b, not(cond)?)] {
                if !is_active(arm) {
                    continue;
                }
                for t in terms {
                    let guard = match &t.guard {
                        None => cnd.clone(),
                        Some(g) => and(g, &cnd)?,
                    };
                    out.push((
                        arm.clone(),
                        Term {
                            guard: Some(guard),
                            expr: t.expr.clone(),
                        },
                    ));
                }
            }
        }
        ExprKind::Fma(a, b, cc) => {
            scaled(a, &|g| mul(g, b))?;
            scaled(b, &|g| mul(g, a))?;
            scaled(cc, &|g| Ok(g.clone()))?;
        }
        other => {
            return Err(Error::Runtime(rivet_runtime::Error::NotDifferentiable(
                format!(
                    "te.gradient: stage '{stage}': no derivative for {} ({n})",
                    kind_name(other)
                ),
            )))
        }
    }
    Ok(out)
}

fn kind_name(k: &ExprKind) -> &'static str {
    match k {
        ExprKind::Reduce { .. } => "a nested reduction",
        ExprKind::Load { .. } => "a loop-IR load",
        ExprKind::Ramp { .. } | ExprKind::Broadcast { .. } => "a vector expression",
        ExprKind::Invalid(_) => "an invalid expression",
        _ => "this expression",
    }
}
