//! Schedules for the library's kernel definitions, per target (TVM's compute/strategy split:
//! `defs.rs` says what a kernel computes, this file how each target runs it).
//!
//! - CPU: the default CPU schedule (`schedule::cpu_default`, whose heuristics live there): the
//!   packed, tensorized GEMM for contractions, parallel and vectorized loops for every other
//!   stage.
//! - GPU: every stage is a kernel of its own: a contraction the tiled GEMM
//!   (`schedule::gpu_default::tiles`), every other stage `schedule::gpu_default::flat` (a block
//!   reduction, or its data axes fused and spread over blocks and threads). Unlike the default
//!   GPU schedule, nothing is inlined: the definition's pattern, not a heuristic, picks the
//!   contraction.

use super::defs::{Def, Pattern};
use crate::error::Result;
use crate::schedule::cpu_default::apply_default_cpu;
use crate::schedule::gpu_default::{flat, tiles};
use crate::schedule::Schedule;
use crate::target::{Target, TargetKind};
use crate::te::Tensor;

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
        // The default CPU schedule (`cpu_default`): packed, tensorized GEMM for contractions,
        // parallel and vectorized loops for the rest.
        Strategy::Cpu => apply_default_cpu(&mut s)?,
        Strategy::Gpu => {
            let stages: Vec<Tensor> = s.stages.iter().map(|st| st.tensor.clone()).collect();
            for t in &stages {
                match &def.pattern {
                    Pattern::Contraction if t.id() == out.id() => tiles(&mut s, t)?,
                    _ => flat(&mut s, t)?,
                }
            }
        }
    }
    Ok(s)
}
