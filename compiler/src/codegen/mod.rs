//! Code generation: one `Backend` trait, one folder per backend implementing it (`interp`, the
//! IR interpreter and oracle; `cranelift`, the CPU; `cuda`, CUDA C through NVRTC), the call
//! ABI they share (below), and `cpu_lib`, the run-time library the CPU backends' code calls
//! (scalar math, vector exp/erf, micro-kernels, host callbacks, the launch policy).
//!
//! ABI: a compiled kernel receives a `CallFrame`: `ptrs[i]` is the address of element (0, ...)
//! of parameter buffer `i` (in `PrimFunc::params` order), `ints` holds the values of the
//! variables listed by `int_slots(func)`: first the symbolic dims (`func.dims`), then the
//! stride variables of each parameter buffer in order. Bounds checks (`func.checks`) have run
//! and passed before a kernel is launched; a kernel trusts its frame.

pub mod cpu_lib;
pub mod cranelift;
pub mod cuda;
pub mod interp;

use crate::error::Result;
use crate::ir::{PrimFunc, Var};
use crate::target::{Target, TargetKind};
use rivet_runtime::{DType, Device, Tensor};

/// Everything a kernel needs at launch. Inline up to 8 pointers and 16 ints, so the call
/// path of a small function allocates nothing for its frame.
#[derive(Debug, Clone)]
pub struct CallFrame {
    pub ptrs: FramePtrs,
    pub ints: FrameInts,
}

pub type FramePtrs = smallvec::SmallVec<[*mut u8; 8]>;
pub type FrameInts = smallvec::SmallVec<[i64; 16]>;

/// The variables whose values `CallFrame::ints` holds, in order.
pub fn int_slots(func: &PrimFunc) -> Vec<Var> {
    let mut v = func.dims.clone();
    for id in &func.params {
        v.extend(func.buffer(*id).strides.iter().cloned());
    }
    v
}

/// Where and how one call runs: what the generic call path knows and every backend needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchContext {
    /// The device of the call's tensors (all on one device, checked before the launch).
    pub device: Device,
    /// The stream to launch on (a CUDA `CUstream` handle; `None`: the device's default, and
    /// on the CPU). Launches are ordered on it and never synchronize the device.
    pub stream: Option<u64>,
    /// The call's work, the CPU policy's measure (`codegen::cpu_lib::launch::policy`): the function's
    /// iteration count (`lower::work`), at least the elements its tensors hold.
    pub work: i64,
}

impl LaunchContext {
    /// A host launch of unknown, possibly large work (tests, direct launches): parallel
    /// loops may use the pool.
    pub fn host() -> LaunchContext {
        LaunchContext {
            device: Device::Cpu,
            stream: None,
            work: i64::MAX,
        }
    }
}

/// A compiled function, ready to launch.
pub trait Kernel: Send + Sync {
    /// Runs the function on a frame built for it, under the backend's execution policy for
    /// `ctx` (the CPU's: release the host lock and use the pool for large work; a GPU's:
    /// enqueue on `ctx.stream`). A failure inside (a temporary that cannot be allocated; in
    /// checked mode, an out-of-bounds access) is an `Err`, never an abort.
    ///
    /// # Safety
    /// The frame's pointers must address memory matching the function's parameter buffers
    /// under the frame's dims and strides, on `ctx.device`, and `func.checks` must hold for
    /// them.
    unsafe fn launch(&self, frame: &CallFrame, ctx: &LaunchContext) -> Result<()>;

    /// A zeroed tensor for an output the caller omitted, where this kernel runs.
    fn alloc_output(&self, shape: &[i64], dtype: DType, ctx: &LaunchContext) -> Result<Tensor>;

    /// Generated code as text (Cranelift IR for the CPU backend, CUDA C for CUDA), for dumps
    /// and debugging.
    fn source(&self) -> String;

    /// `source`, given `func`, the function this kernel was compiled from: a backend that does
    /// not keep its text (the CPU backend under `build`, see `codegen::backend`) generates it
    /// again from `func`, only when asked.
    fn source_from(&self, func: &PrimFunc) -> String {
        let _ = func;
        self.source()
    }

    /// Other generated artefacts by kind (CUDA: "cuda", "ptx"); `None` when this backend has
    /// no such kind (or, for PTX, when NVRTC was not found at build time).
    fn source_of(&self, kind: &str) -> Option<String> {
        let _ = kind;
        None
    }

    /// The host callbacks this kernel holds its own handles of (its copy of
    /// `PrimFunc::callbacks`), for code that accounts for what a compiled function keeps
    /// alive (the Python bindings' garbage-collector support).
    fn host_callbacks(&self) -> Vec<&crate::ir::callback::Callback> {
        Vec::new()
    }
}

/// A code generator.
pub trait Backend: Send + Sync {
    /// The target it compiles for.
    fn target(&self) -> &Target;
    /// Compiles a verified function (flattened, unless the backend is in checked mode).
    fn compile(&self, func: &PrimFunc) -> Result<Box<dyn Kernel>>;

    /// `compile`, for a caller that has just run `ir::verify::verify(func, !checked)` itself
    /// on this very function (`lower::lower` does, last): a backend that verifies its input
    /// skips doing it a second time.
    fn compile_verified(&self, func: &PrimFunc) -> Result<Box<dyn Kernel>> {
        self.compile(func)
    }
}

/// The backend for `target`, in checked mode or not (see `build::Options::checked`).
pub fn backend(target: &Target, checked: bool) -> Result<Box<dyn Backend>> {
    match target.kind {
        // The pipeline's `Compiled` keeps the function, so the CLIF text is generated again
        // when asked for (`Kernel::source_from`) instead of being copied on every build.
        TargetKind::Cpu => Ok(Box::new(
            cranelift::CraneliftBackend::new()?
                .checked(checked)
                .keep_clif(false),
        )),
        TargetKind::Interp => Ok(Box::new(interp::InterpBackend::new(checked))),
        TargetKind::Cuda => Ok(Box::new(cuda::CudaBackend::new(target.clone(), checked))),
    }
}
