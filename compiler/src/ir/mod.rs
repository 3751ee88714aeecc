//! The loop IR: typed expressions (shared with the DSL), statements, functions, and the
//! tools every pass and backend uses: printer and verifier. The arithmetic on index
//! expressions (simplification, intervals, exact evaluation) is `arith`; the interpreter that
//! runs whole functions is a backend, `codegen::interp`.
//!
//! GPU constructs: loops bound to launch dimensions, storage scopes, `Barrier`, and the one
//! collective, the cross-thread reduction `Stmt::AllReduce` (its meaning and fixed combination
//! order in `stmt`'s header); where each may stand is `verify::gpu`'s.

pub mod callback;
pub mod deferred_drop;
pub mod expr;
pub mod float_serde;
pub mod intrin;
pub mod limits;
pub mod printer;
pub mod stmt;
#[cfg(test)]
pub(crate) mod test_util;
pub mod uses;
pub mod verify;

pub use callback::{Callback, CallbackKind};
pub use expr::{BinOp, BufId, CmpOp, Const, Expr, ExprKind, IterVar, LogicOp, ReduceOp, UnOp, Var};
pub use intrin::{Intrin, Region, RegionAxis};
pub use stmt::{
    BufKind, Buffer, Check, DeviceFunc, DeviceKind, ForKind, PrimFunc, Scope, Stmt, ThreadTag,
};
