//! The values of shape and check expressions at call time, shared by the full call path
//! (`bind`, `allocate`), its fast path (`plan`) and the output rule (`output_shapes`), so
//! that the three agree on what an expression means.
//!
//! Invariant: evaluation is exact (`arith::exact`): an int64 overflow is reported (`Err` in
//! the inner result), it never wraps into a value.

use crate::arith::exact::{eval_exact, EvalError};
use crate::error::{Error, Result};
use crate::ir::expr::{Expr, Var};
use crate::ir::stmt::PrimFunc;
use std::collections::HashMap;

/// The value of a shape or check expression at call time: constants and bare dims directly
/// (the common case, on every call), anything else with the interpreter's semantics, so there
/// is one definition of what an expression means.
/// `lookup` gives a dim's value (`env_lookup` over a map; the call fast path reads its slots).
pub(crate) fn eval_dims(
    e: &Expr,
    lookup: &dyn Fn(&Var) -> Option<i64>,
) -> Result<Result<i64, String>> {
    if let Some(v) = e.as_int() {
        return Ok(Ok(v));
    }
    if let Some(x) = e.as_var().and_then(lookup) {
        return Ok(Ok(x));
    }
    match eval_exact(e, lookup) {
        Ok(v) => Ok(Ok(v)),
        Err(EvalError::Overflow(what)) => Ok(Err(what)),
        Err(EvalError::Unsupported(what)) => Err(Error::Internal(format!(
            "cannot evaluate `{e}` at call time: {what}"
        ))),
    }
}

/// The function's dims as `n=3, m=4`, for error messages.
pub(super) fn dims_text(f: &PrimFunc, env: &HashMap<Var, i64>) -> String {
    f.dims
        .iter()
        .map(|v| format!("{}={}", v.name, env.get(v).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn shape_error(msg: String) -> Error {
    Error::Runtime(rivet_runtime::Error::Shape(msg))
}
