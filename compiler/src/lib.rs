//! rivet-compiler: the tensor-expression DSL, schedules, loop IR, passes and code generation
//! (Cranelift for the CPU, CUDA C through NVRTC). It produces `rivet_runtime::Function`s.
//!
//! The compiler is the subject of issue 3; this crate holds the workspace slot and the
//! dependency direction (`bindings -> compiler -> runtime`) until then.

pub use rivet_runtime as runtime;
