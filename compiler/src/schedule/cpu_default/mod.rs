//! The default CPU schedule: what `build(..., target="cpu")` applies to a schedule the user
//! left as created (every stage at root, no split, fuse, annotation or cache stage). Every
//! heuristic of it is in this file; the user's own schedule always wins (one scheduled stage
//! and the whole schedule is built as written), and `RIVET_DEFAULT_SCHEDULE=0` (or
//! `build(..., default_schedule=False)`) turns it off.
//!
//! 1. Injective intermediate stages are inlined into their consumers (no intermediate buffer,
//!    one pass instead of two), except those a host callback needs whole (an extern stage,
//!    its inputs, a stage with a debug tap: `ir::callback`), and an expensive one (exp, log, erf, tanh, sigmoid, sqrt)
//!    read by more than one stage, which would be recomputed per reader.
//! 2. A matmul-like stage (`contraction::match_matmul`: a sum over one or more axes of a
//!    product of two float32/float64 factors, each walking a data axis the other does not; a
//!    convolution included) with enough work (symbolic sizes, or at least `MIN_GEMM_WORK`
//!    multiply-adds) becomes the packed, tensorized GEMM (`packed_gemm::rewrite`): operands
//!    packed into panels (the reduction axes fused into the depth, several row or column axes
//!    fused when a panel would be mostly padding), the register tile a micro-kernel chosen at
//!    run time by CPU features, parallel over column panels. A float sum over several axes of
//!    a product whose factors share every data axis but the reduction's (a depthwise
//!    convolution: `contraction::direct_contraction`) runs as rule 4's `columns`.
//! 3. A float sum / max / min over one axis read contiguously, with at least 32 terms or a
//!    symbolic count, is computed in `lane_reduce::LANES` lane partials (a vector loop with
//!    independent accumulators), then a tail and a combination (`lane_reduce`): float sums
//!    then differ from the plain nest by reassociation.
//! 4. A reduction down columns (`column_reduction`: the stage's last axis walks the last index
//!    of a read whose other indices walk the reduction, `G[j] = sum_r head[r, j] * xhat[r, j]`,
//!    layer_norm's weight and bias gradients): a float sum / max / min over one axis with at
//!    least `2 * column_reduce::ROWS` terms or a symbolic count is computed in chunks of rows
//!    (`column_reduce`: each chunk reads its rows contiguously into a row of partials, chunks
//!    in parallel, then the partials combined; sums reassociated); any other (fewer rows,
//!    several reduction axes) runs the reduction between a chunk of `COLUMNS` columns and its
//!    vectorized inside (`columns`: the same order per element, so the same bits). As written,
//!    each term was a load a row apart: layer_norm's backward at 1024 x 1024, one thread,
//!    14 ms before, 1.5 ms after.
//! 5. Every other stage: its outermost data loop is parallel (the pool is used only when the
//!    work pays, `lower::work`); an injective stage's innermost data axis is vectorized (the
//!    shared `vectorize` pass strip-mines it, tails and strided layouts stay correct). A 1-d
//!    injective stage is split into chunks of `CHUNK` elements: chunks parallel, each
//!    vectorized (one of at most `CHUNK` constant elements is only vectorized); one holding a
//!    value per row of a later stage (`per_row`) is one parallel loop over the rows, so row
//!    fusion can join it to the loop over those rows. An intermediate of three or more axes
//!    that rule 1 kept for its transcendental, with a first axis of at least `SLICES`
//!    (attention's exponentials, per head), is parallel over that axis alone, as its readers
//!    are, so row fusion runs them slice by slice (`sliced`). A contraction that is not packed runs rows, the reduction, then its last
//!    data axis, vectorized. Other reductions accumulate in registers (the loop nest's register accumulation,
//!    in the definition's order, so results are those of the plain nest bit for bit).
//! 6. (Checked before rule 5; docs/default_schedules.md numbers it 5.) An injective stage that transposes a
//!    read (`transposed_axis`: the read's last index is a data axis `k` and another of its
//!    indices walks the innermost, `B[i, j] = A[j, i]`) runs in `TILE` x `TILE` tiles of `k` and the innermost axis: the
//!    other axes and the tiles of `k` parallel, the tile's inner axis vectorized. As written,
//!    each output row walked a column of the input, one cache line per element and a
//!    thousand lines apart for 1024 columns; in tiles, each line read serves `TILE` outputs
//!    while it is still in L1. Every element is computed once by the same expression: the
//!    same bits as the plain nest.

mod chunked;
pub mod column_reduce;
pub mod contraction;
pub mod lane_reduce;
pub mod packed_gemm;

use crate::arith::simplify::simplify;
use crate::error::Result;
use crate::ir::expr::{Expr, ExprKind, IterVar, UnOp, Var};
use crate::schedule::gpu_default::is_contraction;
use crate::schedule::{Attach, Schedule, Stage};
use crate::te::tensor::{inputs, Tensor};

/// The side of rule 6's tiles: eight float32 are half a cache line, eight rows of a tile
/// eight lines; 8 was the fastest of 8, 16, 32 and 64 for a 1024 x 1024 transpose here.
pub const TILE: i64 = 8;
/// Below this many multiply-adds (all sizes constant) a contraction stays a plain loop nest:
/// packing would cost more than it saves.
pub const MIN_GEMM_WORK: i64 = 32 * 32 * 32;
/// Elements per parallel chunk of a 1-d injective stage (each chunk a vector loop): 64 KiB of
/// float32 per operand, big enough to amortise a task, small enough to balance two threads.
pub const CHUNK: i64 = 16384;
/// Columns per chunk of a reduction down columns (`columns`): eight f32x4 accumulators, a
/// vector loop short enough to unroll (`lower::unroll::MAX`) so they stay in registers.
pub const COLUMNS: i64 = 32;

/// Whether `t`'s definition calls a transcendental function (costly to recompute per reader).
fn expensive(t: &Tensor) -> bool {
    let mut yes = false;
    if let Some(b) = t.body() {
        b.visit_unique(&mut |e| {
            if let ExprKind::Unary(op, _) = e.kind() {
                yes |= matches!(
                    op,
                    UnOp::Exp
                        | UnOp::Log
                        | UnOp::Erf
                        | UnOp::Tanh
                        | UnOp::Sigmoid
                        | UnOp::Sqrt
                        | UnOp::Rsqrt
                );
            }
        });
    }
    yes
}

/// Applies the default CPU schedule to `s` when every stage is unscheduled (module header).
pub fn apply_default_cpu(s: &mut Schedule) -> Result<()> {
    if !s.stages.iter().all(Stage::unscheduled) {
        return Ok(());
    }
    // 1. Inline injective intermediates.
    let readers = |s: &Schedule, t: &Tensor| {
        s.stages
            .iter()
            .filter(|st| inputs(&st.tensor).iter().any(|x| x.id() == t.id()))
            .count()
    };
    let candidates: Vec<Tensor> = s
        .stages
        .iter()
        .filter(|st| st.tensor.reduce_axis().is_empty() && !s.outputs.contains(&st.tensor))
        // Host callbacks need whole buffers: an extern stage, its inputs and a tapped stage
        // stay materialised.
        .filter(|st| {
            !st.tensor.is_extern()
                && st.taps.is_empty()
                && !s
                    .stages
                    .iter()
                    .any(|c| c.tensor.is_extern() && inputs(&c.tensor).contains(&st.tensor))
        })
        .map(|st| st.tensor.clone())
        .collect();
    for t in &candidates {
        if !(expensive(t) && readers(s, t) > 1) {
            s.compute_inline(t)?;
        }
    }
    // 2. and 3., stage by stage (a rewrite inserts stages: iterate over the original ones).
    let roots: Vec<Tensor> = s
        .stages
        .iter()
        .filter(|st| st.attach == Attach::Root)
        .map(|st| st.tensor.clone())
        .collect();
    for t in &roots {
        let t = s.current(t);
        if let Some(m) = packed_gemm::match_matmul(&t).filter(|_| worth_packing(&t)) {
            packed_gemm::rewrite(s, &t, &m)?;
            continue;
        }
        if contraction::direct_contraction(&t) {
            // A depthwise convolution: no rows to pack (module header, 2).
            columns(s, &t)?;
            continue;
        }
        if column_reduce::matches(&t) {
            column_reduce::rewrite(s, &t)?;
            continue;
        }
        if column_reduction(&t) {
            columns(s, &t)?;
            continue;
        }
        if lane_reduce::matches(&t) {
            lane_reduce::rewrite(s, &t)?;
            continue;
        }
        if let Some(k) = transposed_axis(&t) {
            tiles(s, &t, k)?;
            continue;
        }
        plain(s, &t)?;
    }
    Ok(())
}

/// Whether a matmul-like stage has enough work for the packed GEMM: any symbolic size, or at
/// least `MIN_GEMM_WORK` multiply-adds; never when a constant size is 0 or less.
fn worth_packing(t: &Tensor) -> bool {
    let mut work: i64 = 1;
    for a in t.axis().iter().chain(t.reduce_axis()) {
        match crate::arith::simplify::simplify(&a.extent).as_int() {
            Some(n) if n < 1 => return false,
            Some(n) => work = work.saturating_mul(n),
            None => return true,
        }
    }
    work >= MIN_GEMM_WORK
}

/// Whether `t` is a reduction down columns (rule 4): its last data axis `j` is the last index
/// of some read whose other indices use a reduction axis (`head[r, j]`), and no read walks a
/// reduction axis in its last index together with `j` (a read such as `mean[r]`, broadcast
/// along `j`, is fine). The gradients of layer_norm's weight and bias (`sum_r head[r, j] *
/// xhat[r, j]`) are such stages; as written, every term is a load a row apart. Contractions
/// (`gpu_default::is_contraction`, at least two data axes) are not: the packed GEMM or rule 5's
/// contraction order (rows, the reduction, then the last axis vectorized) handles them.
pub fn column_reduction(t: &Tensor) -> bool {
    let (Some(body), Some(last)) = (t.body(), t.axis().last()) else {
        return false;
    };
    if is_contraction(t) {
        return false;
    }
    let red: Vec<&Var> = t.reduce_axis().iter().map(|r| &r.var).collect();
    if red.is_empty() {
        return false;
    }
    let walks_red = |e: &Expr| red.iter().any(|r| e.uses(r));
    let (mut down, mut across) = (false, false);
    body.visit_unique(&mut |e| {
        if let ExprKind::Read { indices, .. } = e.kind() {
            let Some((l, rest)) = indices.split_last() else {
                return;
            };
            if l.uses(&last.var) {
                across |= walks_red(l);
                down |= !walks_red(l) && rest.iter().any(walks_red);
            }
        }
    });
    down && !across
}

/// Rule 4's schedule without the rewrite: the last data axis split by `COLUMNS` (not when it
/// is a constant of at most `COLUMNS`), the reduction loops between the two halves, the inner
/// half vectorized: each step of the reduction reads a contiguous piece of a row for `COLUMNS`
/// outputs at once, which accumulate in the output's own elements (eight vectors: unrolled,
/// and kept in registers across the reduction loop, `hoist::loop_carried`). Other data axes
/// (fused) or else the column chunks are the parallel loop. Every output element still sums
/// its terms in the definition's order: the same bits as the plain nest.
pub(super) fn columns(s: &mut Schedule, t: &Tensor) -> Result<()> {
    let axes: Vec<Var> = t.axis().iter().map(|a| a.var.clone()).collect();
    let red: Vec<Var> = t.reduce_axis().iter().map(|r| r.var.clone()).collect();
    let (outer_axes, last) = axes.split_at(axes.len() - 1);
    let last = last[0].clone();
    let narrow = crate::arith::simplify::simplify(&t.axis()[axes.len() - 1].extent)
        .as_int()
        .is_some_and(|n| n <= COLUMNS);
    let st = s.stage(t)?;
    let mut outer: Option<Var> = None;
    for a in outer_axes {
        outer = Some(match outer {
            None => a.clone(),
            Some(o) => st.fuse(&o, a)?,
        });
    }
    let (chunk, inner) = if narrow {
        (None, last)
    } else {
        let (o, i) = st.split(&last, Some(Expr::int(COLUMNS)), None)?;
        (Some(o), i)
    };
    let mut order: Vec<Var> = outer.iter().chain(chunk.iter()).cloned().collect();
    order.extend(red);
    order.push(inner.clone());
    st.reorder(&order)?;
    if let Some(p) = outer.as_ref().or(chunk.as_ref()) {
        st.parallel(p)?;
    }
    st.vectorize(&inner)
}

/// The data axis rule 6 tiles with the innermost one, where `t` is an injective stage of two
/// or more axes that transposes a read: a read whose last index is another data axis `k` and
/// one of whose other indices is the innermost axis (`B[i, j] = A[j, i]`: `k` = `i`). None when
/// either axis is a constant of at most `TILE` (nothing to tile), or for any other stage.
pub fn transposed_axis(t: &Tensor) -> Option<usize> {
    let (Some(body), Some(last)) = (t.body(), t.axis().last()) else {
        return None;
    };
    if !t.reduce_axis().is_empty() {
        return None;
    }
    let small = |a: &IterVar| simplify(&a.extent).as_int().is_some_and(|n| n <= TILE);
    let inner = t.axis().len() - 1;
    // Plain variables only (`A[j, i]`), compared in O(1) per read, over each distinct node
    // once: a `uses` walk of each read's other indices, or a tree walk of a shared DAG, would
    // be quadratic or exponential on the hostile deep-nesting programs (a CI hang).
    let mut found = None;
    body.visit_unique(&mut |e| {
        if let ExprKind::Read { indices, .. } = e.kind() {
            if let Some((l, rest)) = indices.split_last() {
                let k = t.axis()[..inner]
                    .iter()
                    .position(|a| l.as_var() == Some(&a.var));
                if k.is_some() && rest.iter().any(|x| x.as_var() == Some(&last.var)) {
                    found = found.or(k);
                }
            }
        }
    });
    found.filter(|&k| !small(&t.axis()[k]) && !small(last))
}

/// Rule 6's schedule: axis `k` (`transposed_axis`) and the innermost split by `TILE`, ordered
/// (the other axes, tile of `k`, tile of the innermost, `k` in the tile, innermost in the
/// tile); the other axes and the tiles of `k` fused into the parallel loop, the innermost in
/// the tile vectorized.
fn tiles(s: &mut Schedule, t: &Tensor, k: usize) -> Result<()> {
    let axes: Vec<Var> = t.axis().iter().map(|a| a.var.clone()).collect();
    let last = axes.len() - 1;
    let others: Vec<Var> = (0..last)
        .filter(|&d| d != k)
        .map(|d| axes[d].clone())
        .collect();
    let st = s.stage(t)?;
    let (ko, ki) = st.split(&axes[k], Some(Expr::int(TILE)), None)?;
    let (jo, ji) = st.split(&axes[last], Some(Expr::int(TILE)), None)?;
    let mut order = others.clone();
    order.extend([ko.clone(), jo, ki, ji.clone()]);
    st.reorder(&order)?;
    let mut par = ko;
    for a in others.iter().rev() {
        par = st.fuse(a, &par)?;
    }
    st.parallel(&par)?;
    st.vectorize(&ji)
}

/// Whether the 1-d stage `t` holds a value per row of a stage of `stages` with two or more axes:
/// one reads it, every read of it there is at that stage's first axis, and that axis has `t`'s
/// extent.
fn per_row(stages: &[Stage], t: &Tensor) -> bool {
    let [n] = t.shape() else { return false };
    let n = simplify(n);
    stages.iter().map(|st| &st.tensor).any(|c| {
        let (Some(body), [row, _, ..]) = (c.body(), c.axis()) else {
            return false;
        };
        let mut reads = 0usize;
        let mut per_row = true;
        body.visit_unique(&mut |e| {
            if let ExprKind::Read { tensor, indices } = e.kind() {
                if tensor.id() == t.id() {
                    reads += 1;
                    per_row &= matches!(indices.as_slice(), [i] if i.as_var() == Some(&row.var));
                }
            }
        });
        reads > 0 && per_row && simplify(&row.extent) == n && simplify(&row.min).as_int() == Some(0)
    })
}

/// Slices of the first axis from which a kept expensive stage runs parallel over that axis
/// alone (`plain`): enough tasks for the threads without fusing in the next axis.
pub const SLICES: i64 = 16;

/// Whether the injective stage `t` computes a transcendental (rule 1 keeps such an
/// intermediate when several stages read it), has three or more axes, and a first axis that
/// is a constant of at least `SLICES` from 0.
fn sliced(t: &Tensor) -> bool {
    t.axis().len() >= 3
        && t.reduce_axis().is_empty()
        && expensive(t)
        && simplify(&t.axis()[0].extent)
            .as_int()
            .is_some_and(|n| n >= SLICES)
        && simplify(&t.axis()[0].min).as_int() == Some(0)
}

/// Rule 5: parallel outer data loop, vectorized inner data axis of injective stages.
pub(super) fn plain(s: &mut Schedule, t: &Tensor) -> Result<()> {
    let axes: Vec<Var> = t.axis().iter().map(|a| a.var.clone()).collect();
    let injective = t.reduce_axis().is_empty();
    let row_value = axes.len() == 1 && injective && per_row(&s.stages, t);
    let slices = sliced(t) && !s.outputs.contains(t);
    let st = s.stage(t)?;
    match (axes.as_slice(), injective) {
        ([], _) => {}
        // Small enough for one chunk (a constant): vectorized only, not split (its indices
        // stay as written, in errors too).
        ([x], true) if t.shape()[0].as_int().is_some_and(|n| n <= CHUNK) => st.vectorize(x)?,
        // A row's value read by a stage over those rows (layer_norm backward's
        // `sqsum_grad_Y`): one parallel loop over the rows, which row fusion can put in the
        // loop over the same rows (`lower::fuse_rows`); cut into chunks it could not.
        ([x], true) if row_value => st.parallel(x)?,
        ([x], true) => {
            let (o, i) = st.split(x, Some(crate::ir::Expr::int(CHUNK)), None)?;
            st.parallel(&o)?;
            st.vectorize(&i)?;
        }
        // A kept `exp` (rule 1: read by several stages) of three or more axes whose first
        // axis has at least `SLICES` constant slices (attention's exponentials per head):
        // parallel over that axis alone, as its readers' loops are (the row reductions, the
        // next GEMM's packing), so row fusion runs them slice by slice and row locals keep
        // one slice of it alive instead of the whole tensor (`lower::fuse_rows`,
        // `lower::row_locals`). Same elements, same expression: the same bits.
        ([first, _, .., last], true) if slices => {
            st.parallel(first)?;
            st.vectorize(last)?;
        }
        ([first, .., last], true) => {
            // All but the innermost axis fused into one parallel loop (a leading axis of 1 or
            // 2 would leave a thread idle); the innermost vectorized.
            let mut outer = first.clone();
            for a in &axes[1..axes.len() - 1] {
                outer = st.fuse(&outer, a)?;
            }
            st.parallel(&outer)?;
            st.vectorize(last)?;
        }
        // A contraction that is not packed (integers, little work): rows, the reduction, then
        // the last data axis, vectorized (it streams along rows of B and C).
        ([first, .., last], false)
            if is_contraction(t) && t.body().is_some_and(|b| b.uses(last)) =>
        {
            let mut order: Vec<Var> = axes[..axes.len() - 1].to_vec();
            order.extend(t.reduce_axis().iter().map(|r| r.var.clone()));
            order.push(last.clone());
            st.reorder(&order)?;
            st.parallel(first)?;
            st.vectorize(last)?;
        }
        ([first, ..], false) => st.parallel(first)?,
    }
    Ok(())
}
