//! rivet-compiler: the tensor-expression DSL, schedules, loop IR, passes and code generation
//! (Cranelift for the CPU). It produces `rivet_runtime::Function`s.
//!
//! Pipeline (see `build::build`): te program + schedule (the default one, `schedule::
//! cpu_default` / `schedule::gpu_default`, unless the user scheduled it) -> `lower` (bound
//! inference, loop nests, inlining, bounds proof, simplification, flattening; a verifier
//! between passes) -> `ir::PrimFunc` -> a backend (`codegen`) -> a compiled artefact
//! (`artifact::Compiled` in a `Module`) -> a packed function with a typed signature (`call`).
//! `backward` builds a function's derived functions from its te program (`vjp`,
//! `residuals`); `kernels` is the built-in kernel library on top of it all.

pub mod arith;
pub mod artifact;
pub mod backward;
pub mod build;
pub mod build_cache;
pub mod build_times;
pub mod call;
pub mod codegen;
pub mod error;
pub mod ir;
pub mod kernels;
pub mod lower;
pub mod residuals;
pub mod schedule;
pub mod target;
pub mod te;
pub mod vjp;

pub use artifact::Module;
pub use build::build;
pub use error::{Error, Result};
pub use rivet_runtime as runtime;
pub use schedule::Schedule;
pub use target::{Target, TargetKind, ToTarget};
