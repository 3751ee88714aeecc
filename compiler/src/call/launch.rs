//! The last step of a full-path call: refuse outputs that share memory with another argument,
//! build the kernel's frame (pointers, then the ABI's int slots), size the call's work for
//! the backend's policy, launch, and return the allocated outputs, if any.
//!
//! Invariant: the kernel is launched only on tensors `bind` and `allocate` checked against
//! the signature, the dims, the bounds checks and the temporaries' limit, and never when
//! every output is empty (unless host callbacks must run).

use crate::artifact::Compiled;
use crate::codegen::{CallFrame, FrameInts, LaunchContext};
use crate::error::{Error, Result};
use crate::ir::expr::Var;
use crate::ir::stmt::BufKind;
use rivet_runtime::{ArgName, Tensor, Value};
use std::collections::HashMap;

/// Checks that outputs overlap nothing, launches, and returns the call's value (the
/// allocated outputs when `allocate`, else `Null`).
pub(super) fn launch(
    c: &Compiled,
    name: &str,
    tensors: Vec<Tensor>,
    env: &HashMap<Var, i64>,
    ctx: LaunchContext,
    allocate: bool,
    n_out: usize,
) -> Result<Value> {
    let f = &c.func;
    // Outputs may not share memory with any other argument.
    for (i, id) in f.params.iter().enumerate() {
        if f.buffer(*id).kind != (BufKind::Param { output: true }) {
            continue;
        }
        let Some((lo, hi)) = tensors[i].byte_range() else {
            continue;
        };
        for (j, other) in tensors.iter().enumerate() {
            if i == j {
                continue;
            }
            if let Some((l2, h2)) = other.byte_range() {
                if lo < h2 && l2 < hi {
                    return Err(Error::Runtime(rivet_runtime::Error::Layout(format!(
                        "{name}: output {} shares memory with {}; outputs must not overlap other arguments",
                        ArgName { index: i, name: Some(&f.buffer(*id).name) },
                        ArgName { index: j, name: Some(&f.buffer(f.params[j]).name) },
                    ))));
                }
            }
        }
    }
    // The ABI's int slots (`codegen::int_slots`): the dims, then every parameter's strides.
    let mut ints: FrameInts = f.dims.iter().map(|v| env[v]).collect();
    for t in &tensors {
        ints.extend_from_slice(t.strides());
    }
    let frame = CallFrame {
        ptrs: tensors.iter().map(|t| t.data_ptr()).collect(),
        ints,
    };
    // The work: the loops' iteration count (a GEMM's multiply-adds), or the elements the
    // arguments hold when that is more (a loop nest the count underestimates).
    let elements: i64 = tensors
        .iter()
        .fold(0i64, |a, t| a.saturating_add(t.numel()));
    let ctx = LaunchContext {
        work: c.work.eval(&|v| env.get(v).copied()).max(elements),
        ..ctx
    };
    // Every output empty: nothing to compute, so nothing is launched. The loops would still
    // run over the other dims (an output of shape [2^61, 0] is 2^61 empty outer iterations:
    // a hang, found by the C ABI fuzzer, `tests/src/fuzz/capi_gen.rs`).
    // A function with host callbacks is launched all the same: each runs exactly once per
    // call (docs/callbacks.md), whatever the outputs' sizes.
    let outputs_empty = n_out > 0
        && f.callbacks.is_empty()
        && tensors
            .iter()
            .zip(&f.params)
            .filter(|(_, id)| f.buffer(**id).kind == (BufKind::Param { output: true }))
            .all(|(t, _)| t.numel() == 0);
    if !outputs_empty {
        // SAFETY: the frame describes the argument tensors, checked by `bind` and `allocate`
        // against the signature, the dims and the bounds checks; the backend applies its own
        // execution policy.
        unsafe { c.kernel.launch(&frame, &ctx) }?;
    }
    if allocate {
        let outs: Vec<Tensor> = tensors
            .into_iter()
            .zip(&f.params)
            .filter(|(_, id)| f.buffer(**id).kind == (BufKind::Param { output: true }))
            .map(|(t, _)| t)
            .collect();
        if outs.len() == 1 {
            return Ok(Value::Tensor(outs.into_iter().next().unwrap()));
        }
        return Ok(Value::List(outs.into_iter().map(Value::Tensor).collect()));
    }
    Ok(Value::Null)
}
