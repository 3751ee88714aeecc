//! The default GPU schedule (TVM's fallback schedules): what `build(..., target="cuda")`
//! applies to a schedule that binds no loop (`apply_default_gpu`), and the per-stage GPU
//! schedules it is made of, which the kernel library's GPU strategy reuses
//! (`kernels::strategy`):
//!
//! - a contraction is the shared-memory tiled GEMM of `gpu_gemm` (64x64 outputs per block of
//!   16x16 threads, 4x4 per thread in registers, 16-deep reduction tiles of the inputs in
//!   shared memory);
//! - every other reduction stage (softmax's max and sum, layer_norm's moments, sum / max over
//!   an axis) is a block reduction (`block_reduce`): one block per output element, its
//!   reduction split across up to `REDUCE_THREADS` threads and combined across them (warp
//!   shuffles, then shared memory); reductions of fewer than `MIN_BLOCK_REDUCE` terms (known
//!   at build time) stay serial per thread;
//! - every other stage fuses its data axes and splits them by `THREADS` (blockIdx.x,
//!   threadIdx.x).
//!
//! Invariant: these use only the schedule primitives, so a default schedule never changes what
//! a program computes; a stage the user scheduled is left as it is, or refused with a message
//! saying why it cannot run on the GPU.

use crate::arith::simplify::simplify;
use crate::error::Result;
use crate::ir::expr::{Expr, Var};
use crate::ir::stmt::ThreadTag;
use crate::schedule::Schedule;
use crate::te::Tensor;

/// Threads per block of a flat (fused, split) GPU stage.
const THREADS: i64 = 256;
/// Threads per block of a block reduction (8 warps: enough loads in flight per row, and
/// rows stay many blocks).
const REDUCE_THREADS: i64 = 256;
/// A reduction of fewer terms than this (a constant extent) is left serial in one thread per
/// output: a block of threads would mostly idle.
const MIN_BLOCK_REDUCE: i64 = 64;
/// Side of a contraction's output tile on the GPU: one block per BLOCK x BLOCK outputs.
const BLOCK: i64 = 64;
/// Threads per side of a contraction's block (THREAD_SIDE^2 threads), each computing
/// (BLOCK / THREAD_SIDE)^2 outputs in registers.
const THREAD_SIDE: i64 = 16;
/// Reduction steps per shared-memory tile of a contraction.
const K_TILE: i64 = 16;

/// Fuses the data axes of `t`, splits them by `THREADS` and binds blocks and threads; its
/// reduction loops stay serial inside each thread. A 0-d stage is left to the host.
pub fn flat(s: &mut Schedule, t: &Tensor) -> Result<()> {
    if !t.reduce_axis().is_empty() && block_reduce(s, t)? {
        return Ok(());
    }
    let axes: Vec<Var> = t.axis().iter().map(|a| a.var.clone()).collect();
    let Some(first) = axes.first() else {
        return Ok(());
    };
    let st = s.stage(t)?;
    let mut fused = first.clone();
    for a in &axes[1..] {
        fused = st.fuse(&fused, a)?;
    }
    let (bx, tx) = st.split(&fused, Some(Expr::int(THREADS)), None)?;
    st.bind(&bx, ThreadTag::BlockX)?;
    st.bind(&tx, ThreadTag::ThreadX)
}

/// A contraction's GPU schedule: the shared-memory tiled GEMM of `gpu_gemm`. A stage that
/// is not one (fewer than two data axes, or not a single reduction) gets the flat schedule.
pub fn tiles(s: &mut Schedule, t: &Tensor) -> Result<()> {
    if t.axis().len() < 2 || t.reduce_axis().len() != 1 {
        return flat(s, t);
    }
    gpu_gemm(s, t)
}

/// The shared-memory tiled GEMM schedule of a matmul-like stage `t` (data axes
/// `[batch..., i, j]`, one reduction axis), reusable by any GPU schedule:
/// - one block per `BLOCK` x `BLOCK` tile of `(i, j)` (leading batch axes fused on
///   blockIdx.z), `THREAD_SIDE` x `THREAD_SIDE` threads, each computing a
///   `BLOCK / THREAD_SIDE` square of outputs in registers (`cache_write(t, "local")`,
///   computed at the thread loop, its loops unrolled);
/// - the reduction tiled by `K_TILE`; per tile, every tensor the contraction reads is copied
///   into shared memory by all threads of the block (`cache_read(.., "shared")` computed at
///   the tile loop, its loops fused and split over the block's threads);
/// - barriers come from the lowering (`lower::sync`); ragged edges are guarded.
pub fn gpu_gemm(s: &mut Schedule, t: &Tensor) -> Result<()> {
    let axes: Vec<Var> = t.axis().iter().map(|a| a.var.clone()).collect();
    let n = axes.len();
    let def = s.current(t);
    // Inputs read at one place only: a tensor read twice (`A @ A`) would need a tile holding
    // the union of both regions, not a constant shape; it is read from global memory. So is
    // an input whose tile would not be a small matmul operand (`tiles_well`): read at both
    // tiled axes (`A[i, k, j]`: no reuse within a block, and a BLOCK x BLOCK x K_TILE tile
    // over the 48 KiB of shared memory), or with a tiled axis in two indices or scaled.
    // (Each distinct node once: the body may be a shared DAG.)
    let (ti, tj) = (&axes[n - 2], &axes[n - 1]);
    let Some(k) = t.reduce_axis().first().map(|r| r.var.clone()) else {
        return flat(s, t);
    };
    let mut reads: Vec<(u32, usize, bool)> = Vec::new();
    if let Some(body) = def.body() {
        body.visit_unique(&mut |e| {
            if let crate::ir::expr::ExprKind::Read { tensor, indices } = e.kind() {
                let both = !tiles_well(indices, ti, tj, &k);
                match reads.iter_mut().find(|(id, _, _)| *id == tensor.id()) {
                    Some((_, n, b)) => {
                        *n += 1;
                        *b |= both;
                    }
                    None => reads.push((tensor.id(), 1, both)),
                }
            }
        });
    }
    let ins: Vec<Tensor> = crate::te::tensor::inputs(&def)
        .into_iter()
        .filter(|x| {
            reads
                .iter()
                .any(|&(id, n, both)| id == x.id() && n == 1 && !both)
        })
        .collect();
    let local = s.cache_write(t, "local")?;
    let mut shared = Vec::new();
    for x in &ins {
        shared.push(s.cache_read(x, "shared", std::slice::from_ref(&local))?);
    }
    // The output stage: the grid, the block's threads, each thread's square of outputs.
    let st = s.stage(t)?;
    let mut batch: Option<Var> = None;
    for a in &axes[..n - 2] {
        batch = Some(match batch {
            None => a.clone(),
            Some(b) => st.fuse(&b, a)?,
        });
    }
    let per_thread = BLOCK / THREAD_SIDE;
    let (by, yi) = st.split(&axes[n - 2], Some(Expr::int(BLOCK)), None)?;
    let (bx, xi) = st.split(&axes[n - 1], Some(Expr::int(BLOCK)), None)?;
    let (ty, yr) = st.split(&yi, Some(Expr::int(per_thread)), None)?;
    let (tx, xr) = st.split(&xi, Some(Expr::int(per_thread)), None)?;
    let mut order: Vec<Var> = batch.iter().cloned().collect();
    order.extend([by.clone(), bx.clone(), ty.clone(), tx.clone(), yr, xr]);
    st.reorder(&order)?;
    if let Some(b) = &batch {
        st.bind(b, ThreadTag::BlockZ)?;
    }
    st.bind(&by, ThreadTag::BlockY)?;
    st.bind(&bx, ThreadTag::BlockX)?;
    st.bind(&ty, ThreadTag::ThreadY)?;
    st.bind(&tx, ThreadTag::ThreadX)?;
    // The block's size as lowering will see it (constant shapes smaller than a tile shrink it).
    let ext = st.extents();
    let side = |v: &Var| ext.get(v).and_then(|e| e.as_int()).unwrap_or(THREAD_SIDE);
    let (threads_y, threads_x) = (side(&ty), side(&tx));
    // The accumulators: computed per thread, the reduction tiled, the tile loop outermost.
    s.compute_at(&local, t, &tx)?;
    let lst = s.stage(&local)?;
    let red = lst
        .leaves
        .iter()
        .find(|l| l.reduce)
        .map(|l| l.var.clone())
        .expect("one reduction axis");
    let data: Vec<Var> = lst
        .leaves
        .iter()
        .filter(|l| !l.reduce)
        .map(|l| l.var.clone())
        .collect();
    let (ko, ki) = lst.split(&red, Some(Expr::int(K_TILE)), None)?;
    let mut order = vec![ko.clone(), ki.clone()];
    order.extend(data.iter().cloned());
    lst.reorder(&order)?;
    lst.unroll(&ki)?;
    for v in &data[data.len() - 2..] {
        lst.unroll(v)?;
    }
    // The shared tiles: all threads of the block copy one tile per reduction step.
    for x in &shared {
        s.compute_at(x, &local, &ko)?;
        let xs = s.stage(x)?;
        let vars: Vec<Var> = xs.leaves.iter().map(|l| l.var.clone()).collect();
        let mut fused = vars[0].clone();
        for v in &vars[1..] {
            fused = xs.fuse(&fused, v)?;
        }
        let (_, within) = xs.split(&fused, Some(Expr::int(threads_x * threads_y)), None)?;
        let (sy, sx) = xs.split(&within, Some(Expr::int(threads_x)), None)?;
        xs.bind(&sy, ThreadTag::ThreadY)?;
        xs.bind(&sx, ThreadTag::ThreadX)?;
    }
    Ok(())
}

/// Whether a read at `indices` has a small tile per block and reduction step, as a matmul
/// operand does: not both tiled axes `ti`, `tj` used; each of `ti`, `tj`, `k` in at most one
/// index, as a plain term (coefficient +-1, `i + k` allowed). Its tile then spans at most two
/// dims of at most BLOCK + K_TILE elements, a few KiB of shared memory.
fn tiles_well(indices: &[Expr], ti: &Var, tj: &Var, k: &Var) -> bool {
    use crate::arith::simplify::linear;
    let mut used = [0usize; 3];
    for x in indices {
        let Some(l) = linear(x) else {
            return false;
        };
        for (atom, c) in &l.terms {
            let var = [ti, tj, k].iter().position(|v| atom.as_var() == Some(*v));
            match var {
                Some(p) if *c == 1 || *c == -1 => used[p] += 1,
                Some(_) => return false,
                None if [ti, tj, k].iter().any(|v| atom.uses(v)) => return false,
                None => {}
            }
        }
    }
    !(used[0] > 0 && used[1] > 0) && used.iter().all(|&u| u <= 1)
}

/// Whether `t` is matmul-like: a sum, over axes of its own, of a product of two tensor
/// elements that both depend on the reduction (casts allowed around the factors), with at
/// least two data axes. Such stages get `tiles`; everything else `flat`.
pub fn is_contraction(t: &Tensor) -> bool {
    use crate::ir::expr::{BinOp, ExprKind, ReduceOp};
    let Some((ReduceOp::Sum, body, axes)) = t.body().and_then(crate::te::tensor::top_reduce) else {
        return false;
    };
    if t.axis().len() < 2 || axes.is_empty() {
        return false;
    }
    let mut e = body;
    while let ExprKind::Cast(x) = e.kind() {
        e = x;
    }
    let ExprKind::Binary(BinOp::Mul, a, b) = e.kind() else {
        return false;
    };
    // A factor qualifies when it reads a tensor at indices that use a reduction axis.
    let reads_reduction = |f: &Expr| {
        let mut found = false;
        f.visit_unique(&mut |x| {
            if let ExprKind::Read { indices, .. } = x.kind() {
                if indices.iter().any(|i| axes.iter().any(|r| i.uses(&r.var))) {
                    found = true;
                }
            }
        });
        found
    };
    reads_reduction(a) && reads_reduction(b)
}

/// Whether any loop of `s` is bound to a block or thread index.
pub fn binds_anything(s: &Schedule) -> bool {
    s.stages.iter().any(|st| {
        st.leaves
            .iter()
            .any(|l| matches!(l.kind, crate::ir::stmt::ForKind::Thread(_)))
    })
}

/// The default GPU schedule (TVM's fallback schedules): what `build(..., target="cuda")`
/// applies to a schedule that binds no loop. Stages the user scheduled otherwise (split,
/// annotated, attached) are left as they are (and the CUDA backend says what it cannot run).
///
/// 1. Injective intermediate stages are inlined into their consumers (one kernel per
///    reduction or output instead of one per stage, no intermediate buffers), except
///    producers of a contraction, which stay their own kernels (they are read many times
///    each: inlining would recompute them per multiply-add).
/// 2. Every remaining stage at root is one kernel: a contraction gets `tiles`, everything
///    else `flat` (data axes fused into one, `THREADS` per block). A 0-d stage has no data
///    axis to spread and stays on the host, which the CUDA backend refuses with a message.
pub fn apply_default_gpu(s: &mut Schedule) -> Result<()> {
    // A stage computed at a loop of a stage this schedule will split and bind would be
    // attached inside a kernel, where only cache stages can go (and its loop would be gone):
    // computed at root instead it is an injective producer like any other, inlined below or
    // its own kernel. The values are the same (compute_at only chooses where they are made).
    let rescheduled: Vec<u32> = s
        .stages
        .iter()
        .filter(|st| st.unscheduled())
        .map(|st| st.tensor.id())
        .collect();
    for st in &mut s.stages {
        if let crate::schedule::Attach::At { consumer, .. } = &st.attach {
            if rescheduled.contains(consumer)
                && st.relations.is_empty()
                && st.scope == crate::ir::stmt::Scope::Global
            {
                st.attach = crate::schedule::Attach::Root;
            }
        }
    }
    let contraction_inputs: Vec<Tensor> = s
        .stages
        .iter()
        .filter(|st| is_contraction(&st.tensor))
        .flat_map(|st| crate::te::tensor::inputs(&st.tensor))
        .collect();
    let candidates: Vec<Tensor> = s
        .stages
        .iter()
        .filter(|st| {
            st.unscheduled()
                && st.tensor.reduce_axis().is_empty()
                && !s.outputs.contains(&st.tensor)
                && !contraction_inputs.contains(&st.tensor)
                // Host callbacks need whole buffers (and a CUDA build refuses them anyway,
                // with a message of its own rather than an inlining refusal).
                && !st.tensor.is_extern()
                && st.taps.is_empty()
                && !s
                    .stages
                    .iter()
                    .any(|c| c.tensor.is_extern() && crate::te::tensor::inputs(&c.tensor).contains(&st.tensor))
        })
        .map(|st| st.tensor.clone())
        .collect();
    for t in &candidates {
        s.compute_inline(t)?;
    }
    let roots: Vec<Tensor> = s
        .stages
        .iter()
        .filter(|st| st.unscheduled())
        .map(|st| st.tensor.clone())
        .collect();
    for t in &roots {
        if is_contraction(t) {
            tiles(s, t)?;
        } else {
            flat(s, t)?;
        }
    }
    // A stage at root that the user scheduled for the CPU would stay on the host, which the
    // CUDA backend cannot run: say which and why here, where the cause is known.
    for st in &s.stages {
        let bound = st
            .leaves
            .iter()
            .any(|l| matches!(l.kind, crate::ir::stmt::ForKind::Thread(_)));
        if st.attach != crate::schedule::Attach::Root || st.unscheduled() || bound {
            continue;
        }
        let kinds: Vec<String> = st
            .leaves
            .iter()
            .filter(|l| l.kind != crate::ir::stmt::ForKind::Serial)
            .map(|l| format!("'{}' is {:?}", l.var.name, l.kind).to_lowercase())
            .collect();
        let what = if kinds.is_empty() {
            "its loops were split, fused or reordered".to_string()
        } else {
            format!("loop {}", kinds.join(", "))
        };
        return Err(crate::error::Error::Compile(format!(
            "default GPU schedule: stage '{}' was scheduled ({what}) but binds no loop to blockIdx/threadIdx, so it would run on the host, which a CUDA function cannot; bind its loops (split an axis and bind the parts to 'blockIdx.x' and 'threadIdx.x'), or leave the stage unscheduled for the default GPU schedule",
            st.tensor.name()
        )));
    }
    Ok(())
}

/// A fresh schedule of `outputs` with `apply_default_gpu` applied (`rivet.te.default_gpu_schedule`).
pub fn default_gpu_schedule(outputs: &[Tensor]) -> Result<Schedule> {
    let mut s = Schedule::new(outputs)?;
    apply_default_gpu(&mut s)?;
    Ok(s)
}

/// A block reduction: the data axes of `t` fused on blockIdx.x (one block per output element;
/// none for a 0-d output: one block), its reduction axes fused and split by the thread count,
/// the inner part bound to threadIdx.x (a cross-thread reduction: each thread sums its share
/// serially, the block combines the partials). The thread count is `REDUCE_THREADS`, or the
/// extent when it is a smaller constant (no idle thread, no guard). `false` (nothing done)
/// for a reduction of fewer than `MIN_BLOCK_REDUCE` terms known at build time.
fn block_reduce(s: &mut Schedule, t: &Tensor) -> Result<bool> {
    let axes: Vec<Var> = t.axis().iter().map(|a| a.var.clone()).collect();
    let raxes: Vec<Var> = t.reduce_axis().iter().map(|a| a.var.clone()).collect();
    let terms = t.reduce_axis().iter().try_fold(1i64, |acc, a| {
        acc.checked_mul(simplify(&a.extent).as_int()?)
    });
    // An axis of constant extent 0 (or less) empties the whole reduction, whatever the
    // others: nothing to spread over threads (fusing it would leave a thread loop of 0
    // iterations, which `bind` rightly refuses).
    let empty = t
        .reduce_axis()
        .iter()
        .any(|a| simplify(&a.extent).as_int().is_some_and(|n| n < 1));
    if empty {
        return Ok(false);
    }
    let threads = match terms {
        Some(n) if n < MIN_BLOCK_REDUCE => return Ok(false),
        Some(n) => n.min(REDUCE_THREADS),
        None => REDUCE_THREADS,
    };
    let st = s.stage(t)?;
    let mut rows = None;
    for a in &axes {
        rows = Some(match rows {
            None => a.clone(),
            Some(r) => st.fuse(&r, a)?,
        });
    }
    let mut r = raxes[0].clone();
    for a in &raxes[1..] {
        r = st.fuse(&r, a)?;
    }
    let (ro, ri) = st.split(&r, Some(Expr::int(threads)), None)?;
    let mut order: Vec<Var> = rows.iter().cloned().collect();
    order.extend([ri.clone(), ro]);
    st.reorder(&order)?;
    if let Some(b) = &rows {
        st.bind(b, ThreadTag::BlockX)?;
    }
    st.bind(&ri, ThreadTag::ThreadX)?;
    Ok(true)
}
