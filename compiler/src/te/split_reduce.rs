//! Stages as users write them: a body that uses a reduction inside a larger expression
//! (`te.sum(A[i, k], k) * c`, `A[i, j] / te.sum(A[i, k], k)`) is split into one reduction
//! stage per distinct reduction and the elementwise stage the user named, which reads them.
//!
//! Invariants:
//! - each reduction stage ranges over exactly the data axes its reduction uses, in the
//!   consumer's axis order (a row statistic is computed once per row, not once per element);
//!   it is named `<stage>_<op><k>` (`C_sum0`), so errors inside it name the user's stage;
//! - distinct reductions are found node by node (a shared reduction, or a shared DAG inside
//!   one, is visited once: the rewrite is memoised by node identity);
//! - at most `MAX_SPLIT_REDUCTIONS` reductions per body (a `CompileError` past it);
//! - a reduction nested inside another reduction's body keeps the old refusal (the outer
//!   reduction's axes would be free in a stage of its own);
//! - the values are the program's as written: the consumer reads exactly the element the
//!   reduction computed for its indices (the default schedules may inline or fuse it back).

use super::tensor::{compute_from, Tensor};
use crate::error::Result;
use crate::ir::expr::{Expr, ExprKind, IterVar, Var};
use std::collections::HashMap;
use std::sync::Arc;

/// Most reductions one stage's body may hold: each becomes a stage, and each is walked once
/// (a hostile body of many reductions sharing one large expression would cost their number
/// times its size).
pub const MAX_SPLIT_REDUCTIONS: usize = 64;

/// Rebuilds `e` bottom-up, each distinct node once: `f` may replace a node before its
/// children are visited (its replacement is not rewritten further).
fn rewrite_memo(
    e: &Expr,
    memo: &mut HashMap<usize, Expr>,
    f: &mut dyn FnMut(&Expr) -> Result<Option<Expr>>,
) -> Result<Expr> {
    let key = Arc::as_ptr(&e.0) as usize;
    if let Some(done) = memo.get(&key) {
        return Ok(done.clone());
    }
    let out = match f(e)? {
        Some(r) => r,
        None => {
            let mut err = None;
            let rebuilt = e.map_children(&mut |c| match rewrite_memo(c, memo, f) {
                Ok(x) => x,
                Err(x) => {
                    err.get_or_insert(x);
                    c.clone()
                }
            });
            if let Some(x) = err {
                return Err(x);
            }
            rebuilt
        }
    };
    memo.insert(key, out.clone());
    Ok(out)
}

/// `e` with the variables of `map` (by id) replaced, each distinct node visited once.
pub(crate) fn substitute_memo(e: &Expr, map: &HashMap<u32, Expr>) -> Expr {
    let mut memo = HashMap::new();
    rewrite_memo(e, &mut memo, &mut |n| {
        Ok(match n.kind() {
            ExprKind::Var(v) => map.get(&v.id).cloned(),
            _ => None,
        })
    })
    .unwrap_or_else(|_| e.clone())
}

/// Whether `e` uses variable `v` (each distinct node once).
fn uses(e: &Expr, v: &Var) -> bool {
    let mut found = false;
    e.visit_unique(&mut |n| found |= matches!(n.kind(), ExprKind::Var(x) if x.id == v.id));
    found
}

/// Splits `body`'s reductions into stages of their own (module header); `None` when a
/// reduction sits inside another reduction's body (the caller refuses that as before).
pub(super) fn split(
    shape: &[Expr],
    axis: &[IterVar],
    body: &Expr,
    name: &str,
) -> Result<Option<Tensor>> {
    let mut stages = 0usize;
    let mut nested_in_reduce = false;
    let mut memo = HashMap::new();
    let new_body = rewrite_memo(body, &mut memo, &mut |e| {
        let ExprKind::Reduce { body: inner, .. } = e.kind() else {
            return Ok(None);
        };
        if stages == MAX_SPLIT_REDUCTIONS {
            return Err(crate::error::Error::Compile(format!(
                "compute '{name}': more than {MAX_SPLIT_REDUCTIONS} reductions in one stage's body; compute some of them in stages of their own"
            )));
        }
        let mut inner_reduce = false;
        inner.visit_unique(&mut |n| inner_reduce |= matches!(n.kind(), ExprKind::Reduce { .. }));
        if inner_reduce {
            nested_in_reduce = true;
            return Ok(None);
        }
        // The data axes this reduction reads, in the consumer's order, as fresh axes of the
        // new stage (every stage owns its axis variables).
        let used: Vec<&IterVar> = axis.iter().filter(|a| uses(e, &a.var)).collect();
        let fresh: Vec<IterVar> = used
            .iter()
            .map(|a| IterVar {
                var: Var::new(&a.var.name),
                min: a.min.clone(),
                extent: a.extent.clone(),
                reduce: false,
            })
            .collect();
        let map: HashMap<u32, Expr> = used
            .iter()
            .zip(&fresh)
            .map(|(a, f)| (a.var.id, Expr::var(&f.var)))
            .collect();
        let sub_shape: Vec<Expr> = fresh.iter().map(|a| a.extent.clone()).collect();
        let stage_name = format!("{name}_{}{stages}", op_name(e));
        stages += 1;
        let t = compute_from(&sub_shape, fresh, substitute_memo(e, &map), &stage_name)?;
        let idx: Vec<Expr> = used.iter().map(|a| Expr::var(&a.var)).collect();
        Ok(Some(t.idx(&idx)))
    })?;
    if nested_in_reduce || stages == 0 {
        return Ok(None);
    }
    compute_from(shape, axis.to_vec(), new_body, name).map(Some)
}

fn op_name(e: &Expr) -> &'static str {
    match e.kind() {
        ExprKind::Reduce { op, .. } => match op {
            crate::ir::expr::ReduceOp::Sum => "sum",
            crate::ir::expr::ReduceOp::Prod => "prod",
            crate::ir::expr::ReduceOp::Max => "max",
            crate::ir::expr::ReduceOp::Min => "min",
        },
        _ => "reduce",
    }
}
