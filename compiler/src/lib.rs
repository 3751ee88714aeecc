//! rivet-compiler: the tensor-expression DSL, schedules, loop IR, passes and code generation
//! (Cranelift for the CPU). It produces `rivet_runtime::Function`s.
//!
//! Pipeline (see `build::build`): te program + schedule -> `lower` (bound inference, loop
//! nests, inlining, bounds proof, simplification, flattening; a verifier between passes) ->
//! `ir::PrimFunc` -> a backend (`codegen`) -> a packed function with a typed signature.

pub mod arith;
pub mod backward;
pub mod build;
pub mod call_plan;
pub mod codegen;
pub mod error;
pub mod ir;
pub mod kernels;
pub mod lower;
pub mod module_file;
pub mod output_shapes;
pub mod residuals;
pub mod schedule;
pub mod target;
pub mod te;

pub use build::{build, Module};
pub use error::{Error, Result};
pub use rivet_runtime as runtime;
pub use schedule::Schedule;
pub use target::{Target, TargetKind, ToTarget};
