//! Modules and kernels, run on the CPU.
//!
//! The interface the driver state uses (the rest of this folder implements it):
//! - [`Module::load`]: a cubin image as `cuModuleLoadData` gets it (a pointer; the length is
//!   read from the ELF headers), checked against the device's architecture, mapped back to
//!   the CUDA C rivet compiled it from (`$RIVET_CUBIN_SOURCES/<sha256 of the cubin>.cu`) and
//!   compiled for the host under the CUDA emulation;
//! - [`Module::function`]: a kernel by name (`cuModuleGetFunction`);
//! - [`Function::params`]: each parameter's size and whether it is a pointer, from the
//!   kernel's declared types, so `cuLaunchKernel` copies exactly those bytes at enqueue time;
//! - [`Function::run`]: the whole grid, now, on the calling thread (the executor calls it
//!   when the launch's turn comes, with device memory accessible).

use crate::error::Refusal;
use std::sync::Arc;

/// A kernel's parameters, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// `sizeof` of each declared parameter type.
    pub sizes: Vec<usize>,
    /// Whether each is a pointer (checked against live device memory at launch).
    pub is_ptr: Vec<bool>,
}

/// A loaded module.
#[derive(Debug)]
pub struct Module {
    _private: (),
}

/// One kernel of a loaded module.
#[derive(Debug)]
pub struct Function {
    _private: (),
}

impl Module {
    /// Loads the cubin at `image` for a device of compute capability `arch` (major, minor).
    ///
    /// # Safety
    /// `image` must point at a readable cubin (an ELF file) as `cuModuleLoadData` requires.
    pub unsafe fn load(_image: *const u8, _arch: (u32, u32)) -> Result<Module, Refusal> {
        Err(Refusal::new(
            crate::error::CUDA_ERROR_NOT_SUPPORTED,
            "kernels are not implemented yet",
        ))
    }

    /// The kernel `name`, if the module has it.
    pub fn function(&self, _name: &str) -> Option<Arc<Function>> {
        None
    }
}

impl Function {
    pub fn name(&self) -> &str {
        ""
    }

    pub fn params(&self) -> &ParamInfo {
        unimplemented!()
    }

    /// Bytes of static `__shared__` memory per block.
    pub fn static_shared_bytes(&self) -> usize {
        0
    }

    /// Runs the whole grid now with the parameter values copied at enqueue time
    /// (`params[i]` holds `params().sizes[i]` bytes). A kernel that cannot run (a trap, a
    /// failed host compilation) is an `Err` with the reason.
    ///
    /// # Safety
    /// Every pointer parameter must address device memory made accessible for the run.
    pub unsafe fn run(
        &self,
        _grid: [u32; 3],
        _block: [u32; 3],
        _dynamic_shared: u32,
        _params: &[Vec<u8>],
    ) -> Result<(), String> {
        Err("kernels are not implemented yet".into())
    }
}
