//! Reductions in lane partials: what the default CPU schedule (`cpu_default`) does to a float
//! sum / max / min over a contiguous axis, so its inner loop is vector code with `LANES`
//! independent accumulators instead of one serial chain (a float add waits for the previous
//! one: one element per add latency).
//!
//! `S[d..] = R_r f(d.., r)` over `r in [lo, lo + K)` becomes three stages (S keeps its id,
//! name and shape):
//!
//! ```text
//! S.lanes[d.., l] = R_{ko < K // L} f(d.., lo + ko*L + l)        (l < L: the lane partials)
//! S.tail[d..]     = R_{t in [lo + K // L * L, lo + K)} f(d.., t) (the last K % L terms)
//! S[d..]          = R_{l < L} (P[d.., l] (+) S.tail[d..])        sum: the tail added to lane 0 only
//! ```
//!
//! `S.lanes` runs `d.., ko, l` with `l` vectorized: the stores `S.lanes[d.., ramp]` and the
//! reads `f(.., ko*L + ramp)` are contiguous vectors. Every stage is at root with its first
//! data loop parallel.
//!
//! Invariant: the same terms are combined, in another order (lanes, then the tail, then the
//! lanes together): float sums then differ from the plain nest by rounding, as any vectorised
//! or parallel sum does (numpy's pairwise sum, torch's vectorised one); max and min are exact.
//! The interpreter running the defaulted schedule computes the same bits.

use super::chunked::{fresh, Chunked};
use crate::arith::simplify::simplify;
use crate::error::Result;
use crate::ir::expr::{BinOp, CmpOp, Expr, ExprKind, ReduceOp, Var};
use crate::schedule::definitions::redefine;
use crate::schedule::{Schedule, Stage};
use crate::te::tensor::{compute_from, top_reduce, Tensor};
use rivet_runtime::DType;

/// Lane partials per reduction: four f32x4 (or eight f64x2) accumulators.
pub const LANES: i64 = 16;

/// Whether `t` is a reduction the rewrite applies to: float sum / max / min over one axis,
/// read contiguously (some read's last index walks the axis), with at least `2 * LANES` terms
/// or a symbolic count.
pub fn matches(t: &Tensor) -> bool {
    let Some((op, body, [r])) = t.body().and_then(top_reduce) else {
        return false;
    };
    if !matches!(op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min)
        || !matches!(t.dtype(), DType::F32 | DType::F64)
        || body.dtype() != t.dtype()
    {
        return false;
    }
    if simplify(&r.extent).as_int().is_some_and(|k| k < 2 * LANES) {
        return false;
    }
    let mut contiguous = false;
    body.visit_unique(&mut |e| {
        if let ExprKind::Read { indices, .. } = e.kind() {
            contiguous |= indices.last().is_some_and(|x| x.uses(&r.var));
        }
    });
    contiguous
}

/// Rewrites stage `t` (unscheduled, at root, `matches(t)`) as the module header says and
/// schedules the new stages.
pub fn rewrite(s: &mut Schedule, t: &Tensor) -> Result<()> {
    let int = Expr::int;
    let Some(red) = Chunked::of(s, t, LANES) else {
        return Ok(());
    };
    let (cur, op, r, axes) = (&red.cur, red.op, &red.r, &red.axes);
    // The lane partials.
    let mut lax = red.fresh_axes();
    let l = fresh("l", int(0), int(LANES), false);
    let ko = fresh("ko", int(0), red.full.clone(), true);
    let lbody = red.term(
        &lax,
        r.min
            .add(&Expr::var(&ko.var).mul(&int(LANES)))
            .add(&Expr::var(&l.var)),
    );
    let lanes_body = crate::te::reduce(op, lbody, std::slice::from_ref(&ko))?;
    lax.push(l.clone());
    let shape: Vec<Expr> = lax.iter().map(|a| a.extent.clone()).collect();
    let lanes = compute_from(&shape, lax, lanes_body, &format!("{}.lanes", cur.name()))?;
    // The tail.
    let tail = red.tail()?;
    // The combination, on S's own axes.
    let own: Vec<Expr> = axes.iter().map(|a| Expr::var(&a.var)).collect();
    let l2 = fresh("l", int(0), int(LANES), true);
    let mut li = own.clone();
    li.push(Expr::var(&l2.var));
    let part = lanes.idx(&li);
    let tl = tail.idx(&own);
    let term = match op {
        ReduceOp::Sum => Expr::select(
            Expr::cmp(CmpOp::Eq, Expr::var(&l2.var), int(0))?,
            Expr::binary(BinOp::Add, part.clone(), tl)?,
            part,
        )?,
        ReduceOp::Max => Expr::binary(BinOp::Max, part, tl)?,
        _ => Expr::binary(BinOp::Min, part, tl)?,
    };
    let combined = redefine(cur, crate::te::reduce(op, term, std::slice::from_ref(&l2))?);
    let ti = s.stage_index(t)?;
    s.restart_stage(ti, &combined);
    s.set_definition(ti, combined.clone());
    s.stages
        .splice(ti..ti, [Stage::new(&lanes), Stage::new(&tail)]);
    // Schedules: lanes `d.., ko, l` with l vectorized; first data loops parallel.
    {
        let st = s.stage(&lanes)?;
        let mut order: Vec<Var> = lanes.axis()[..axes.len()]
            .iter()
            .map(|a| a.var.clone())
            .collect();
        order.extend([ko.var.clone(), l.var.clone()]);
        st.reorder(&order)?;
        st.vectorize(&l.var)?;
        if let Some(first) = order.first().filter(|_| !axes.is_empty()) {
            st.parallel(first)?;
        }
    }
    if let Some(first) = tail.axis().first() {
        s.stage(&tail)?.parallel(&first.var)?;
    }
    if let Some(first) = axes.first() {
        s.stage(&combined)?.parallel(&first.var)?;
    }
    Ok(())
}
