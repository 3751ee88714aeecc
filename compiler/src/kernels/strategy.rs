//! Schedules for kernel definitions, per target (TVM's strategies). All the heuristics of
//! the library's schedules live here, in one file.
//!
//! - CPU: contractions run rows, then the reduction, then columns (the inner loop streams
//!   along rows of B and C), rows parallel; every other output has its outermost loop
//!   parallel; intermediate stages stay serial at root.
//! - GPU: every stage is a kernel of its own. A contraction is the shared-memory tiled GEMM
//!   of `gpu_gemm` (64x64 outputs per block of 16x16 threads, 4x4 per thread in registers,
//!   16-deep reduction tiles of the inputs in shared memory). Every other stage fuses its
//!   data axes and splits them by `THREADS` (blockIdx.x, threadIdx.x), reductions serial per
//!   thread (block reductions need cross-thread reductions, not there yet).

use super::defs::{Def, Pattern};
use crate::error::Result;
use crate::ir::expr::{Expr, Var};
use crate::ir::stmt::ThreadTag;
use crate::schedule::Schedule;
use crate::target::{Target, TargetKind};
use crate::te::Tensor;

/// Threads per block of a flat (fused, split) GPU stage.
const THREADS: i64 = 256;
/// Side of a contraction's output tile on the GPU: one block per BLOCK x BLOCK outputs.
const BLOCK: i64 = 64;
/// Threads per side of a contraction's block (THREAD_SIDE^2 threads), each computing
/// (BLOCK / THREAD_SIDE)^2 outputs in registers.
const THREAD_SIDE: i64 = 16;
/// Reduction steps per shared-memory tile of a contraction.
const K_TILE: i64 = 16;

/// Which family of schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    Cpu,
    Gpu,
}

impl Strategy {
    /// The target's own: GPU schedules for CUDA, CPU ones for the CPU and the interpreter
    /// (which runs either: `Strategy::Gpu` on `interp` checks a GPU schedule on the CPU).
    pub fn for_target(t: &Target) -> Strategy {
        match t.kind {
            TargetKind::Cuda => Strategy::Gpu,
            TargetKind::Cpu | TargetKind::Interp => Strategy::Cpu,
        }
    }

    pub fn parse(s: &str) -> Option<Strategy> {
        match s {
            "cpu" => Some(Strategy::Cpu),
            "gpu" => Some(Strategy::Gpu),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Cpu => "cpu",
            Strategy::Gpu => "gpu",
        }
    }
}

/// The schedule of `def` in `strategy`.
pub fn schedule(def: &Def, strategy: Strategy) -> Result<Schedule> {
    let out = def.out();
    let mut s = Schedule::new(std::slice::from_ref(out))?;
    match strategy {
        Strategy::Cpu => match &def.pattern {
            Pattern::Contraction { cpu_order } => {
                s.stage(out)?.reorder(cpu_order)?;
                s.stage(out)?.parallel(&cpu_order[0])?;
            }
            Pattern::Generic => {
                if let Some(a) = out.axis().first() {
                    s.stage(out)?.parallel(&a.var)?;
                }
            }
        },
        Strategy::Gpu => {
            let stages: Vec<Tensor> = s.stages.iter().map(|st| st.tensor.clone()).collect();
            for t in &stages {
                match &def.pattern {
                    Pattern::Contraction { .. } if t.id() == out.id() => tiles(&mut s, t)?,
                    _ => flat(&mut s, t)?,
                }
            }
        }
    }
    Ok(s)
}

/// Fuses the data axes of `t`, splits them by `THREADS` and binds blocks and threads; its
/// reduction loops stay serial inside each thread. A 0-d stage is left to the host.
fn flat(s: &mut Schedule, t: &Tensor) -> Result<()> {
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
fn tiles(s: &mut Schedule, t: &Tensor) -> Result<()> {
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
    // the union of both regions, not a constant shape; it is read from global memory.
    let mut reads: Vec<(u32, usize)> = Vec::new();
    if let Some(body) = def.body() {
        body.visit(&mut |e| {
            if let crate::ir::expr::ExprKind::Read { tensor, .. } = e.kind() {
                match reads.iter_mut().find(|(id, _)| *id == tensor.id()) {
                    Some((_, n)) => *n += 1,
                    None => reads.push((tensor.id(), 1)),
                }
            }
        });
    }
    let ins: Vec<Tensor> = crate::te::tensor::inputs(&def)
        .into_iter()
        .filter(|x| reads.iter().any(|&(id, n)| id == x.id() && n == 1))
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
