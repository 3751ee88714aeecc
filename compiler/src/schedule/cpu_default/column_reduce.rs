//! Reductions down columns in row chunks: what the default CPU schedule (`cpu_default`, rule
//! 4) does to a float sum / max / min over one axis that walks rows while the stage's last
//! axis walks the columns (`G[j] = sum_r head[r, j] * xhat[r, j]`, layer_norm's weight and bias
//! gradients). As written, each term is a load a row apart; here every chunk of `ROWS` rows is
//! read row by row, contiguously, into a row of partial results, and the chunks run in
//! parallel.
//!
//! `G[d.., j] = R_r f(d.., j, r)` over `r in [lo, lo + K)` becomes (G keeps its id, name and
//! shape):
//!
//! ```text
//! G.chunks[c, d.., j] = R_{q < ROWS} f(d.., j, lo + c*ROWS + q)      c < K // ROWS
//! G.tail[d.., j]      = R_{t in [lo + K // ROWS * ROWS, lo + K)} f(d.., j, t)
//! G.rows[d.., j]      = R_{c < K // ROWS} G.chunks[c, d.., j]
//! G[d.., j]           = G.rows[d.., j] (+) G.tail[d.., j]
//! ```
//!
//! (no tail, and `G` is the combination itself, when K is a constant multiple of `ROWS`).
//! `G.chunks` runs `c` (parallel), `d..`, `q`, then `j` vectorized: each step of `q` adds a
//! contiguous row into the chunk's row of partials. The tail and the combination are
//! reductions down columns themselves, scheduled by `cpu_default::columns` (the reduction
//! loop between a chunk of columns and its vectorized inside). The chunk count depends on K
//! only, never on the thread count: results are the same on any number of threads.
//!
//! Invariant: the same terms are combined, in another order (each chunk in order, then the
//! chunks in order, then the tail): max and min are exact, float sums differ from the plain
//! nest by reassociation, as `lane_reduce`'s do. The interpreter running the defaulted
//! schedule computes the same bits.

use super::chunked::{fresh, Chunked};
use crate::arith::simplify::simplify;
use crate::error::Result;
use crate::ir::expr::{BinOp, Expr, IterVar, ReduceOp, Var};
use crate::schedule::definitions::redefine;
use crate::schedule::{Schedule, Stage};
use crate::te::tensor::{compute_from, top_reduce, Tensor};
use rivet_runtime::DType;

/// Rows per chunk: 16 chunks of a 1024-row reduction (two threads balance), and a chunk of
/// 1024 float32 columns reads 256 KiB per operand.
pub const ROWS: i64 = 64;

/// Whether `t` gets the row-chunk rewrite: `cpu_default::column_reduction(t)`, one reduction
/// axis, a float sum / max / min of the stage's dtype, and at least `2 * ROWS` terms or a
/// symbolic count.
pub fn matches(t: &Tensor) -> bool {
    let Some((op, body, [r])) = t.body().and_then(top_reduce) else {
        return false;
    };
    matches!(op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min)
        && matches!(t.dtype(), DType::F32 | DType::F64)
        && body.dtype() == t.dtype()
        && simplify(&r.extent).as_int().is_none_or(|k| k >= 2 * ROWS)
        && super::column_reduction(t)
}

/// Rewrites stage `t` (unscheduled, at root, `matches(t)`) as the module header says and
/// schedules the new stages.
pub fn rewrite(s: &mut Schedule, t: &Tensor) -> Result<()> {
    let int = Expr::int;
    let Some(red) = Chunked::of(s, t, ROWS) else {
        return Ok(());
    };
    let (cur, op, r, axes, full) = (&red.cur, red.op, &red.r, &red.axes, &red.full);
    let no_tail = red.k.as_int().is_some_and(|k| k % ROWS == 0);
    // The chunks: `c` first, then G's axes.
    let c = fresh("c", int(0), full.clone(), false);
    let q = fresh("q", int(0), int(ROWS), true);
    let own = red.fresh_axes();
    let cbody = red.term(
        &own,
        r.min
            .add(&Expr::var(&c.var).mul(&int(ROWS)))
            .add(&Expr::var(&q.var)),
    );
    let cbody = crate::te::reduce(op, cbody, std::slice::from_ref(&q))?;
    let mut cax = vec![c.clone()];
    cax.extend(own.iter().cloned());
    let cshape: Vec<Expr> = cax.iter().map(|a| a.extent.clone()).collect();
    let chunks = compute_from(&cshape, cax, cbody, &format!("{}.chunks", cur.name()))?;
    // The combination of the chunks, over G's own axes (or fresh ones when it is a stage of
    // its own).
    let c2 = fresh("c", int(0), full.clone(), true);
    let combine = |axes_of: &[IterVar]| -> Result<Expr> {
        let mut idx = vec![Expr::var(&c2.var)];
        idx.extend(axes_of.iter().map(|a| Expr::var(&a.var)));
        crate::te::reduce(op, chunks.idx(&idx), std::slice::from_ref(&c2))
    };
    let ti = s.stage_index(t)?;
    let mut new_stages = vec![Stage::new(&chunks)];
    let mut columns_of: Vec<Tensor> = Vec::new();
    let combined = if no_tail {
        redefine(cur, combine(axes)?)
    } else {
        // The tail, and the chunks' combination as a stage of its own.
        let tail = red.tail()?;
        let shape: Vec<Expr> = axes.iter().map(|a| a.extent.clone()).collect();
        let rax = red.fresh_axes();
        let rows = compute_from(
            &shape,
            rax.clone(),
            combine(&rax)?,
            &format!("{}.rows", cur.name()),
        )?;
        let at: Vec<Expr> = axes.iter().map(|a| Expr::var(&a.var)).collect();
        let bop = match op {
            ReduceOp::Sum => BinOp::Add,
            ReduceOp::Max => BinOp::Max,
            _ => BinOp::Min,
        };
        new_stages.push(Stage::new(&tail));
        new_stages.push(Stage::new(&rows));
        columns_of.extend([tail.clone(), rows.clone()]);
        redefine(cur, Expr::binary(bop, rows.idx(&at), tail.idx(&at))?)
    };
    s.restart_stage(ti, &combined);
    s.set_definition(ti, combined.clone());
    s.stages.splice(ti..ti, new_stages);
    // Schedules. The chunks: `c` parallel, G's other axes, `q`, then the last axis vectorized.
    {
        let st = s.stage(&chunks)?;
        let mut order: Vec<Var> = chunks.axis()[..axes.len()]
            .iter()
            .map(|a| a.var.clone())
            .collect();
        let last = chunks.axis()[axes.len()].var.clone();
        order.extend([q.var.clone(), last.clone()]);
        st.reorder(&order)?;
        st.parallel(&c.var)?;
        st.vectorize(&last)?;
    }
    for x in &columns_of {
        super::columns(s, x)?;
    }
    if no_tail {
        super::columns(s, &combined)?;
    } else {
        super::plain(s, &combined)?;
    }
    Ok(())
}
