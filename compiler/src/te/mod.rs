//! The tensor-expression DSL (Rust side; the Python DSL in the bindings mirrors it):
//! `var`, `placeholder`, `reduce_axis`, `compute`, reductions, math functions, and
//! `gradient` (reverse-mode differentiation of a program). Programs are plain data
//! (`Tensor`s whose bodies are `Expr`s) handed to `schedule` and `lower`. Numbers mixed with
//! expressions follow one rule in both languages (`number`).

pub mod dsl;
pub mod gradient;
pub mod number;
pub mod ops;
pub(crate) mod split_reduce;
pub mod tensor;

pub use dsl::{Axes, Body, Indices};
pub use gradient::gradient;
pub use number::{Number, Operand};
pub use ops::*;
pub use tensor::{
    compute, compute_dyn, compute_from, extern_, placeholder, stop_gradient, CallbackFn, Op, Tensor,
};
