//! The prologue the default CPU schedule's two reduction rewrites share (`lane_reduce`,
//! `column_reduce`): a one-axis reduction `S[d..] = R_r f(d.., r)` over `r in [lo, lo + K)`
//! cut into `K // size` whole pieces of `size` terms, then a tail of the last `K % size`.
//! Each rewrite lays the pieces out its own way (lanes of a vector, chunks of rows); what a
//! piece, the tail and a term are is defined here once.
//!
//! Invariants: a negative extent is an empty reduction, so `K` is clamped at 0 and the tail
//! stays empty too; fresh axes are made in the order the callers ask for them (variable ids
//! follow creation order, so the rewritten programs are the same from run to run).

use crate::arith::simplify::simplify;
use crate::error::Result;
use crate::ir::expr::{Expr, IterVar, ReduceOp, Var};
use crate::schedule::Schedule;
use crate::te::tensor::{compute_from, top_reduce, Tensor};

/// A one-axis reduction stage and the bounds of its pieces (module doc).
pub(super) struct Chunked {
    /// The stage's current definition.
    pub cur: Tensor,
    pub op: ReduceOp,
    /// `f`, over the stage's axes and `r`.
    pub body: Expr,
    /// The reduction axis `r`.
    pub r: IterVar,
    /// The stage's data axes.
    pub axes: Vec<IterVar>,
    /// The term count `K`, clamped at 0.
    pub k: Expr,
    /// Whole pieces: `K // size`.
    pub full: Expr,
    /// Where the tail starts: `lo + K // size * size`.
    pub split: Expr,
}

/// A fresh loop axis over `[min, min + extent)`.
pub(super) fn fresh(name: &str, min: Expr, extent: Expr, reduce: bool) -> IterVar {
    IterVar {
        var: Var::new(name),
        min,
        extent,
        reduce,
    }
}

impl Chunked {
    /// The pieces of `size` terms of stage `t`'s current definition; `None` unless it is a
    /// reduction over exactly one axis.
    pub fn of(s: &Schedule, t: &Tensor, size: i64) -> Option<Chunked> {
        let int = Expr::int;
        let cur = s.current(t);
        let (op, body, r) = match cur.body().and_then(top_reduce) {
            Some((op, body, [r])) => (op, body.clone(), r.clone()),
            _ => return None,
        };
        let axes: Vec<IterVar> = cur.axis().to_vec();
        let k = simplify(&r.extent.max_(&int(0)));
        let full = simplify(&k.floordiv(&int(size)));
        let split = simplify(&r.min.add(&full.mul(&int(size))));
        Some(Chunked {
            cur,
            op,
            body,
            r,
            axes,
            k,
            full,
            split,
        })
    }

    /// Fresh data axes named like the stage's, from 0 over the same extents (a new stage's
    /// own axes).
    pub fn fresh_axes(&self) -> Vec<IterVar> {
        self.axes
            .iter()
            .map(|a| fresh(&a.var.name, Expr::int(0), a.extent.clone(), false))
            .collect()
    }

    /// The term `f` on the axes `own` (in place of the stage's) at reduction index `rv`.
    pub fn term(&self, own: &[IterVar], rv: Expr) -> Expr {
        self.body.substitute(&|v| {
            if *v == self.r.var {
                return Some(rv.clone());
            }
            self.axes
                .iter()
                .position(|a| a.var == *v)
                .map(|d| Expr::var(&own[d].var))
        })
    }

    /// The tail: `<S>.tail[d..] = R_{t in [split, lo + K)} f(d.., t)`, on fresh axes.
    pub fn tail(&self) -> Result<Tensor> {
        let tax = self.fresh_axes();
        let tr = fresh(
            "t",
            self.split.clone(),
            simplify(&self.r.min.add(&self.k).sub(&self.split)),
            true,
        );
        let tbody = crate::te::reduce(
            self.op,
            self.term(&tax, Expr::var(&tr.var)),
            std::slice::from_ref(&tr),
        )?;
        let shape: Vec<Expr> = self.axes.iter().map(|a| a.extent.clone()).collect();
        compute_from(&shape, tax, tbody, &format!("{}.tail", self.cur.name()))
    }
}
