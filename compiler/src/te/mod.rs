//! The tensor-expression DSL (Rust side; the Python DSL in the bindings mirrors it):
//! `var`, `placeholder`, `reduce_axis`, `compute`, reductions, math functions. Programs are
//! plain data (`Tensor`s whose bodies are `Expr`s) handed to `schedule` and `lower`. Numbers
//! mixed with expressions follow one rule in both languages (`number`).

pub mod number;
pub mod ops;
pub mod tensor;

pub use number::{Number, Operand};
pub use ops::*;
pub use tensor::{compute, compute_from, extern_, placeholder, CallbackFn, Op, Tensor};
