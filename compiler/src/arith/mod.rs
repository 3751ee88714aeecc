//! The arithmetic every layer shares: simplification of index expressions (`simplify`),
//! interval bounds with symbolic endpoints (`interval`), exact evaluation that reports overflow
//! (`exact`), and Python's floor division and modulo (`div`).
//!
//! It sits just above the IR's data types (`ir::expr`, `ir::stmt`) and below everything that
//! reasons about programs: the IR's verifiers, te, schedules, lowering, the backends and the
//! bindings all import it, and it imports nothing from them, so no layer has to reach up
//! into lowering or codegen for a fold or a bound.

pub mod div;
pub mod exact;
pub mod interval;
pub mod simplify;
