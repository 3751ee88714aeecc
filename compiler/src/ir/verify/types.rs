//! The dtype and lane rules of expressions, node by node (`check_types`); the verifier runs
//! them on every expression it checks, `verify_expr_types` on one expression alone.
//!
//! - types: indices, `For` min/extent, `Let` values and buffer shapes are int64; `If`/`Select`
//!   conditions are bool; a `Store`'s value and a `Load` node have the buffer's dtype; binary
//!   and comparison operands have equal dtypes; plus the constructor rules of `ir::expr`
//!   (float-only ops, bool-only `Not`, ...).
//! - lanes (vector IR, `lower::vectorize`): every operand of an elementwise vector node has
//!   its lanes (scalars are broadcast explicitly); a `Ramp`'s base and stride are scalar int64,
//!   a `Broadcast`'s value a scalar of its dtype, both with 2..=`MAX_LANES` lanes; a vector
//!   access has one (flattened) index; a store's index and value have equal lanes; loop
//!   bounds, `Let` values and conditions are scalars. Loaded nests hold no vector IR.

use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, Const, Expr, ExprKind, UnOp};
use rivet_runtime::DType;

/// Checks the dtype rules of one expression tree (no scoping, no buffers): see the module
/// documentation. Errors are `Error::Internal` naming the offending node and the rule.
pub fn verify_expr_types(e: &Expr) -> Result<()> {
    check_types(e)
        .map_err(|(node, rule)| Error::Internal(format!("{rule}: in `{node}` (of `{e}`)")))
}

/// The dtype rules of one node and, recursively, its children. On failure: the offending node
/// and the rule it breaks.
pub(super) fn check_types(e: &Expr) -> std::result::Result<(), (Expr, String)> {
    let dt = e.dtype();
    let bad = |rule: String| Err((e.clone(), rule));
    if let Some(rule) = lane_rule(e) {
        return bad(rule);
    }
    match e.kind() {
        ExprKind::Ramp { base, stride, .. } => {
            check_types(base)?;
            check_types(stride)?;
            if base.dtype() != DType::I64 || stride.dtype() != DType::I64 || dt != DType::I64 {
                return bad(format!(
                    "ramp base and stride must be int64, are {} and {}",
                    base.dtype(),
                    stride.dtype()
                ));
            }
        }
        ExprKind::Broadcast { value, .. } => {
            check_types(value)?;
            if value.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: broadcast of {} typed {dt}",
                    value.dtype()
                ));
            }
        }
        ExprKind::Const(Const::Int(v)) => {
            if dt.is_float() {
                return bad(format!(
                    "constant kind mismatch: integer constant with float dtype {dt}"
                ));
            }
            if dt == DType::Bool && *v != 0 && *v != 1 {
                return bad(format!(
                    "constant kind mismatch: bool constant {v} is not 0 or 1"
                ));
            }
        }
        ExprKind::Const(Const::Float(_)) => {
            if !dt.is_float() {
                return bad(format!(
                    "constant kind mismatch: float constant with non-float dtype {dt}"
                ));
            }
        }
        ExprKind::Var(_) => {
            if dt != DType::I64 {
                return bad(format!("variables are int64, this one is typed {dt}"));
            }
        }
        ExprKind::Unary(op, a) => {
            check_types(a)?;
            if a.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: {op:?} of {} typed {dt}",
                    a.dtype()
                ));
            }
            let ok = match op {
                UnOp::Not => dt == DType::Bool,
                UnOp::Neg | UnOp::Abs => dt != DType::Bool,
                _ => dt.is_float(),
            };
            if !ok {
                return bad(format!("unary {op:?} is not defined on {dt}"));
            }
        }
        ExprKind::Binary(op, a, b) => {
            check_types(a)?;
            check_types(b)?;
            if a.dtype() != b.dtype() || a.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: {op:?} of {} and {} typed {dt}",
                    a.dtype(),
                    b.dtype()
                ));
            }
            if dt == DType::Bool {
                return bad(format!("binary {op:?} is not defined on bool"));
            }
            if matches!(op, BinOp::Div | BinOp::Pow) && !dt.is_float() {
                return bad(format!("binary {op:?} needs floats, got {dt}"));
            }
        }
        ExprKind::Cmp(op, a, b) => {
            check_types(a)?;
            check_types(b)?;
            if a.dtype() != b.dtype() {
                return bad(format!(
                    "operand dtypes differ: comparison {op:?} of {} and {}",
                    a.dtype(),
                    b.dtype()
                ));
            }
            if dt != DType::Bool {
                return bad(format!("comparison {op:?} must be typed bool, is {dt}"));
            }
        }
        ExprKind::Logic(op, a, b) => {
            check_types(a)?;
            check_types(b)?;
            if a.dtype() != DType::Bool || b.dtype() != DType::Bool || dt != DType::Bool {
                return bad(format!(
                    "condition must be bool: logical {op:?} of {} and {} typed {dt}",
                    a.dtype(),
                    b.dtype()
                ));
            }
        }
        ExprKind::Cast(a) => check_types(a)?,
        ExprKind::Fma(a, b, c) => {
            check_types(a)?;
            check_types(b)?;
            check_types(c)?;
            if a.dtype() != dt || b.dtype() != dt || c.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: fma of {}, {} and {} typed {dt}",
                    a.dtype(),
                    b.dtype(),
                    c.dtype()
                ));
            }
            if !dt.is_float() {
                return bad(format!("fma needs floats, got {dt}"));
            }
        }
        ExprKind::Select(c, a, b) => {
            check_types(c)?;
            check_types(a)?;
            check_types(b)?;
            if c.dtype() != DType::Bool {
                return bad(format!(
                    "condition must be bool: select condition is {}",
                    c.dtype()
                ));
            }
            if a.dtype() != b.dtype() || a.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: select arms {} and {} typed {dt}",
                    a.dtype(),
                    b.dtype()
                ));
            }
        }
        ExprKind::Read { indices, .. } | ExprKind::Load { indices, .. } => {
            for i in indices {
                check_types(i)?;
                if i.dtype() != DType::I64 {
                    return Err((i.clone(), format!("index must be int64, is {}", i.dtype())));
                }
            }
        }
        ExprKind::Invalid(msg) => {
            return bad(format!(
                "invalid expression (a DSL misuse that reached the IR): {msg}"
            ))
        }
        ExprKind::Reduce { body, axes, .. } => {
            check_types(body)?;
            if body.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: reduction of {} typed {dt}",
                    body.dtype()
                ));
            }
            for a in axes {
                for x in [&a.min, &a.extent] {
                    check_types(x)?;
                    if x.dtype() != DType::I64 {
                        return Err((
                            x.clone(),
                            format!("axis bounds must be int64, is {}", x.dtype()),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Most lanes a vector expression may have (a 16-byte vector of bytes; CUDA's widest
/// access is 16 bytes too).
pub const MAX_LANES: u32 = 16;

/// The lane rule of one node (children are checked by the caller's recursion): a `Ramp`'s
/// base and stride and a `Broadcast`'s value are scalars and it has 2..=`MAX_LANES` lanes;
/// lanes are never mixed: every operand of an elementwise vector node has exactly its lanes
/// (the vectorize pass broadcasts scalars explicitly); a vector `Load` has one index.
// Kept out of line: `check_types` recurses once per level of the expression, so its frame
// must stay small (the depth limit is checked with the stack the test threads have).
#[inline(never)]
fn lane_rule(e: &Expr) -> Option<String> {
    let n = e.lanes();
    let same = |kids: &[&Expr]| -> Option<String> {
        kids.iter().find(|k| k.lanes() != n).map(|k| {
            format!(
                "lane mismatch: a {n}-lane node has an operand of {} lanes (`{k}`)",
                k.lanes()
            )
        })
    };
    match e.kind() {
        ExprKind::Ramp {
            base,
            stride,
            lanes,
        } => {
            if !(2..=MAX_LANES).contains(lanes) {
                return Some(format!(
                    "a ramp has 2..={MAX_LANES} lanes, this one {lanes}"
                ));
            }
            if base.lanes() != 1 || stride.lanes() != 1 {
                return Some("lane mismatch: a ramp's base and stride are scalars".into());
            }
            None
        }
        ExprKind::Broadcast { value, lanes } => {
            if !(2..=MAX_LANES).contains(lanes) {
                return Some(format!(
                    "a broadcast has 2..={MAX_LANES} lanes, this one {lanes}"
                ));
            }
            if value.lanes() != 1 {
                return Some("lane mismatch: a broadcast's value is a scalar".into());
            }
            None
        }
        ExprKind::Unary(_, a) | ExprKind::Cast(a) => same(&[a]),
        ExprKind::Binary(_, a, b) | ExprKind::Cmp(_, a, b) | ExprKind::Logic(_, a, b) => {
            same(&[a, b])
        }
        ExprKind::Select(c, a, b) | ExprKind::Fma(a, b, c) => same(&[c, a, b]),
        ExprKind::Load { indices, .. } => {
            if n > 1 && indices.len() != 1 {
                return Some(format!(
                    "a vector load has one (flattened) index, this one {}",
                    indices.len()
                ));
            }
            None
        }
        ExprKind::Read { indices, .. } => same(&indices.iter().collect::<Vec<_>>()),
        ExprKind::Reduce { .. } | ExprKind::Const(_) | ExprKind::Var(_) | ExprKind::Invalid(_) => {
            None
        }
    }
}
