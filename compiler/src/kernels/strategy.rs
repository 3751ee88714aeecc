//! Schedules for kernel definitions, per target (TVM's strategies). All the heuristics of
//! the library's schedules live here, in one file.
//!
//! - CPU: contractions run rows, then the reduction, then columns (the inner loop streams
//!   along rows of B and C), rows parallel; every other output has its outermost loop
//!   parallel; intermediate stages stay serial at root.
//! - GPU: every stage is a kernel of its own. A contraction tiles its last two data axes by
//!   `TILE` x `TILE` (one block per tile, one thread per output, leading batch axes on
//!   blockIdx.z), the reduction serial in each thread. Every other stage fuses its data axes
//!   and splits them by `THREADS` (blockIdx.x, threadIdx.x), reductions serial per thread.
//!   Shared-memory tiles and block reductions need `cache_read` and cross-thread
//!   reductions (not there yet): these schedules are correct first, fast later (issue 12).

use super::defs::{Def, Pattern};
use crate::error::Result;
use crate::ir::expr::{Expr, Var};
use crate::ir::stmt::ThreadTag;
use crate::schedule::Schedule;
use crate::target::{Target, TargetKind};
use crate::te::Tensor;

/// Threads per block of a flat (fused, split) GPU stage.
const THREADS: i64 = 256;
/// Side of a contraction's output tile on the GPU (TILE * TILE threads per block).
const TILE: i64 = 16;

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

/// One block per `TILE` x `TILE` tile of the last two data axes, one thread per output.
fn tiles(s: &mut Schedule, t: &Tensor) -> Result<()> {
    let axes: Vec<Var> = t.axis().iter().map(|a| a.var.clone()).collect();
    let n = axes.len();
    if n < 2 {
        return flat(s, t);
    }
    let st = s.stage(t)?;
    let mut batch: Option<Var> = None;
    for a in &axes[..n - 2] {
        batch = Some(match batch {
            None => a.clone(),
            Some(b) => st.fuse(&b, a)?,
        });
    }
    let (io, ii) = st.split(&axes[n - 2], Some(Expr::int(TILE)), None)?;
    let (jo, ji) = st.split(&axes[n - 1], Some(Expr::int(TILE)), None)?;
    let mut order: Vec<Var> = batch.iter().cloned().collect();
    order.extend([io.clone(), jo.clone(), ii.clone(), ji.clone()]);
    order.extend(st.leaves.iter().filter(|l| l.reduce).map(|l| l.var.clone()));
    st.reorder(&order)?;
    if let Some(b) = &batch {
        st.bind(b, ThreadTag::BlockZ)?;
    }
    st.bind(&io, ThreadTag::BlockY)?;
    st.bind(&jo, ThreadTag::BlockX)?;
    st.bind(&ii, ThreadTag::ThreadY)?;
    st.bind(&ji, ThreadTag::ThreadX)
}
