//! The CPU run-time library: the routines generated CPU code calls and the interpreter shares,
//! so both compute the same bits. Scalar semantics (`math`, Python's `//` and `%` from
//! `arith::div`), float32 `exp` (`exp32`) and its vector forms (`expf4`), vector `erf`
//! (`erff4`, `erff16` per CPU feature level), the packed GEMM micro-kernels (`microkernel`),
//! host callbacks (`callback`), and what the CPU backends share at launch (`launch`: the
//! threading policy and output allocation). Nothing here generates code; the backends in the
//! sibling folders do.

pub mod callback;
pub mod erff16;
pub mod erff4;
pub mod exp32;
pub mod expf4;
#[cfg(test)]
mod lanes_check;
pub mod launch;
pub mod math;
pub mod microkernel;
