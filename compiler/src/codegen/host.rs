//! What the CPU backends (Cranelift and the interpreter) share at launch: their execution
//! policy and where their outputs live. Each backend owns these through `Kernel`; the
//! generic call path in `build.rs` only decides *what* to launch.

use super::LaunchContext;
use crate::error::Result;
use rivet_runtime::{host, parallel, DType, Tensor};

/// Runs `run` under the CPU policy, as the runtime's native functions do: small work stays on
/// this thread with the host lock (Python's GIL) kept; past `RELEASE_GRAIN` elements the lock
/// is released; past `PARALLEL_GRAIN` parallel loops may use the pool.
pub fn run_with_policy(ctx: &LaunchContext, run: impl FnOnce() -> Result<()>) -> Result<()> {
    if ctx.work >= parallel::PARALLEL_GRAIN {
        host::without_host_lock(run)
    } else if ctx.work >= host::RELEASE_GRAIN {
        parallel::serially(|| host::without_host_lock(run))
    } else {
        parallel::serially(run)
    }
}

/// A zeroed host tensor: where a CPU kernel's omitted outputs are allocated.
pub fn alloc_output(shape: &[i64], dtype: DType) -> Result<Tensor> {
    Ok(Tensor::zeros(shape, dtype)?)
}
