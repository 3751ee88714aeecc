//! The backends every cross-crate test runs: the one list (CubeCL's model: one suite,
//! parametrised by backend, instead of a list in each test file).
//!
//! Adding a backend is one line in `BACKENDS`. A backend that needs a GPU says so
//! (`needs_gpu`): `backends()` leaves it out where no usable GPU is, so the suite passes (and
//! skips it) on CPU-only machines, as the Python suite's `gpu` marker does:
//!
//! ```text
//!     Backend { name: "cuda", needs_gpu: true, gpu_schedules: true },
//! ```
//!
//! How results are compared across backends is docs/tolerance.md: the CPU backend equals the
//! interpreter bit for bit; CUDA will too but for transcendentals (ulp bounds).

use rivet_compiler::Target;

/// One backend of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    /// The target spelling (`Target::parse` accepts it).
    pub name: &'static str,
    /// Runs only where a CUDA GPU rivet can launch on is present (`cuda_usable`).
    pub needs_gpu: bool,
    /// Runs GPU-scheduled programs (loops bound to blockIdx / threadIdx); the CPU backend
    /// refuses them.
    pub gpu_schedules: bool,
}

/// Every backend, the oracle (the interpreter) first: tests compare the others with it.
pub const BACKENDS: &[Backend] = &[
    Backend {
        name: "interp",
        needs_gpu: false,
        gpu_schedules: true,
    },
    Backend {
        name: "cpu",
        needs_gpu: false,
        gpu_schedules: false,
    },
];

/// Whether rivet can run kernels on a CUDA GPU here. False for now: rivet's CUDA launch
/// (`codegen::cuda::driver`) has never run on a GPU, and there is no probe of a usable device
/// yet (`driver_present` only says that libcuda loads). Replace with that probe when the launch
/// path has been checked on a GPU.
pub fn cuda_usable() -> bool {
    false
}

fn runnable(b: &Backend) -> bool {
    !b.needs_gpu || cuda_usable()
}

/// The backends this machine can run, as targets, the oracle first.
pub fn backends() -> Vec<Target> {
    BACKENDS
        .iter()
        .filter(|b| runnable(b))
        .map(|b| Target::parse(b.name).expect("BACKENDS holds target spellings"))
        .collect()
}

/// Names of the backends this machine can run (for messages and APIs taking a spelling).
pub fn backend_names() -> Vec<&'static str> {
    BACKENDS
        .iter()
        .filter(|b| runnable(b))
        .map(|b| b.name)
        .collect()
}

/// The runnable backends that run GPU schedules: the explicit subset for those tests.
pub fn gpu_schedule_backends() -> Vec<Target> {
    BACKENDS
        .iter()
        .filter(|b| runnable(b) && b.gpu_schedules)
        .map(|b| Target::parse(b.name).expect("BACKENDS holds target spellings"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oracle_comes_first_and_every_name_parses() {
        assert_eq!(BACKENDS[0].name, "interp");
        for b in BACKENDS {
            let t = Target::parse(b.name).unwrap();
            assert_eq!(t.kind_name(), b.name);
        }
        assert_eq!(backends().len(), backend_names().len());
    }
}
