//! Saved activations: the forward/backward split autograd frameworks use in training (JAX's
//! `custom_vjp` residuals, torch's `save_for_backward`). `vjp.rs`'s backward program takes only
//! the forward's inputs and recomputes every forward value its gradient reads (a softmax's
//! max, exp and sum: more work than torch's whole softmax backward); here the forward also
//! writes the values worth keeping, and the backward reads them.
//!
//! Two functions, built together from one te program (docs/gradient.md, "Saved activations"):
//! - the *forward with residuals*: the forward's arguments, then one extra output per residual
//!   (a forward stage, written whole);
//! - the *saved backward*: the forward's inputs (placeholders, in argument order), its outputs
//!   (one per computed argument, in order), the residuals (in the forward's order), one
//!   cotangent per output, then one gradient per differentiable input (written), as
//!   `vjp.rs`'s convention with outputs and residuals inserted after the inputs.
//!
//! Which forward values the backward reads, and how (the policy, one function: `keep`):
//! - a forward output: read from the output argument (never recomputed, never a residual);
//! - a reduction, an extern stage, or an elementwise stage calling a transcendental function
//!   (exp, log, tanh, sigmoid, erf, pow): a residual;
//! - any other elementwise stage (adds, products, casts, selects, square roots of what it
//!   reads): recomputed in the backward from its own reads, which this policy resolves in
//!   turn. This is the trade torch's fused kernels make (layer_norm keeps the mean and
//!   reciprocal deviation per row, recomputes the normalised input).
//!
//! Invariants: the saved backward's program reads no forward stage that is a residual or an
//! output (each is replaced by its argument, at the same indices), so it never recomputes
//! one; a stage recomputed is rebuilt only when something it reads was replaced (otherwise
//! shared). The saved backward computes the same values as `vjp.rs`'s, up to rounding:
//! tests/tests/grad_backward.rs compares both with central differences.

use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, ExprKind, UnOp};
use crate::te::tensor::{inputs as reads_of, post_order, post_order_by, top_reduce};
use crate::te::{self, Op, Tensor};
use crate::vjp::{backward_program, inputs_and_outputs};
use std::collections::{HashMap, HashSet};

/// The saved-activation programs of one forward (module doc).
pub struct SavedProgram {
    /// The forward stages the forward with residuals also writes, in order.
    pub residuals: Vec<Tensor>,
    /// The saved backward's arguments (module doc's order).
    pub args: Vec<Tensor>,
    /// Its gradient stages (the last of `args`).
    pub grads: Vec<Tensor>,
}

/// How the backward gets a forward stage's values.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Keep {
    Output,
    Residual,
    Recompute,
}

/// The policy (module doc).
fn keep(t: &Tensor, outputs: &HashSet<u32>) -> Keep {
    if outputs.contains(&t.id()) {
        return Keep::Output;
    }
    match t.op() {
        Op::Extern { .. } => Keep::Residual,
        Op::Placeholder => Keep::Recompute,
        Op::Compute { body, .. } => {
            if top_reduce(body).is_some() {
                return Keep::Residual;
            }
            let mut costly = false;
            body.visit_unique(&mut |e| {
                costly |= matches!(
                    e.kind(),
                    ExprKind::Unary(
                        UnOp::Exp | UnOp::Log | UnOp::Tanh | UnOp::Sigmoid | UnOp::Erf,
                        _
                    ) | ExprKind::Binary(BinOp::Pow, _, _)
                );
            });
            if costly {
                Keep::Residual
            } else {
                Keep::Recompute
            }
        }
    }
}

/// Derives the saved-activation programs of the function whose build arguments are `args`.
pub fn saved_program(args: &[Tensor]) -> Result<SavedProgram> {
    let plain = backward_program(args)?;
    let (inputs, outputs) = inputs_and_outputs(args);
    let heads = plain.args[inputs.len()..inputs.len() + outputs.len()].to_vec();
    let forward: HashSet<u32> = post_order(&outputs)
        .iter()
        .filter(|t| !t.is_placeholder())
        .map(Tensor::id)
        .collect();
    let out_ids: HashSet<u32> = outputs.iter().map(Tensor::id).collect();

    // Each output's argument in the backward: a placeholder of its shape, dtype and name.
    let mut replaced: HashMap<u32, Tensor> = HashMap::new();
    let mut out_args = Vec::with_capacity(outputs.len());
    for o in &outputs {
        let p = te::placeholder(o.shape(), o.dtype(), o.name())?;
        replaced.insert(o.id(), p.clone());
        out_args.push(p);
    }
    // The backward program, not descending into forward stages that become arguments.
    let kept = |t: &Tensor| forward.contains(&t.id()) && keep(t, &out_ids) != Keep::Recompute;
    let order = post_order_by(&plain.grads, &mut |t| {
        if kept(t) {
            Vec::new()
        } else {
            reads_of(t)
        }
    });
    let mut residuals = Vec::new();
    let mut res_args = Vec::new();
    for t in &order {
        if replaced.contains_key(&t.id()) {
            continue;
        }
        if kept(t) {
            // Outputs were replaced above; what is left here is a residual.
            let p = te::placeholder(t.shape(), t.dtype(), &format!("saved_{}", t.name()))?;
            replaced.insert(t.id(), p.clone());
            residuals.push(t.clone());
            res_args.push(p);
            continue;
        }
        let Op::Compute { axis, body } = t.op() else {
            continue; // a placeholder: an input or a head, read as it is
        };
        if !reads_of(t).iter().any(|x| replaced.contains_key(&x.id())) {
            continue;
        }
        let new_body = body.rewrite(&mut |n| match n.kind() {
            ExprKind::Read { tensor, indices } => {
                replaced.get(&tensor.id()).map(|to| to.idx(indices))
            }
            _ => None,
        });
        let rebuilt = te::compute_from(t.shape(), axis.clone(), new_body, t.name())?;
        replaced.insert(t.id(), rebuilt);
    }
    let grads: Vec<Tensor> = plain
        .grads
        .iter()
        .map(|g| replaced.get(&g.id()).cloned().unwrap_or_else(|| g.clone()))
        .collect();
    // What the rebuilt program reads must be arguments or stages of its own: a forward stage
    // still reachable would be recomputed against the module doc's promise.
    for t in post_order(&grads) {
        if forward.contains(&t.id()) && keep(&t, &out_ids) != Keep::Recompute {
            return Err(Error::Internal(format!(
                "saved backward: forward stage '{}' is still read, not replaced by its argument",
                t.name()
            )));
        }
    }
    let mut bargs = inputs;
    bargs.extend(out_args);
    bargs.extend(res_args);
    bargs.extend(heads);
    bargs.extend(grads.iter().cloned());
    Ok(SavedProgram {
        residuals,
        args: bargs,
        grads,
    })
}
