//! What the CPU backends (Cranelift and the interpreter) share at launch: their execution
//! policy and where their outputs live. Each backend owns these through `Kernel`; the
//! generic call path in `call/` only decides *what* to launch.

use crate::codegen::LaunchContext;
use crate::error::Result;
use rivet_runtime::{host_lock, parallel, DType, Tensor};

/// How a CPU call runs, decided from its work (`LaunchContext::work`: for compiled functions
/// the iteration count of `lower::work`, so a GEMM's multiply-adds count, not its arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// On this thread, the host lock (Python's GIL) kept: releasing it costs as much as the work.
    Inline,
    /// On this thread, the host lock released.
    InlineUnlocked,
    /// The host lock released; parallel loops use the pool (`parallel::chunks` sizes them).
    Pool,
}

/// The policy for `work` iterations: below `RELEASE_GRAIN` inline with the lock, below
/// `PARALLEL_GRAIN` inline without it, else the pool.
pub fn policy(work: i64) -> Policy {
    if work >= parallel::PARALLEL_GRAIN {
        Policy::Pool
    } else if work >= host_lock::RELEASE_GRAIN {
        Policy::InlineUnlocked
    } else {
        Policy::Inline
    }
}

/// Runs `run` under the CPU policy (`policy`), as the runtime's native functions do, with the
/// call's work recorded for the parallel loops' chunk sizes.
pub fn run_with_policy(ctx: &LaunchContext, run: impl FnOnce() -> Result<()>) -> Result<()> {
    if policy(ctx.work) == Policy::Inline {
        // The common small call: both settings with one thread-local lookup.
        return parallel::serially_with_call_work(ctx.work, run);
    }
    parallel::with_call_work(ctx.work, || match policy(ctx.work) {
        Policy::Pool => host_lock::without_host_lock(run),
        Policy::InlineUnlocked => parallel::serially(|| host_lock::without_host_lock(run)),
        // Not reached: `Inline` returned above.
        Policy::Inline => parallel::serially(run),
    })
}

/// A zeroed host tensor: where a CPU kernel's omitted outputs are allocated.
pub fn alloc_output(shape: &[i64], dtype: DType) -> Result<Tensor> {
    Ok(Tensor::zeros(shape, dtype)?)
}
