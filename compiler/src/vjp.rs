//! The backward *program* of a te-built function: its vector-Jacobian product as te stages,
//! derived with `te::gradient`, before any schedule or build. `backward.rs` builds it (and
//! caches the function); `residuals.rs` rewrites it to read saved forward values.
//!
//! Convention (the one `rivet.torch.custom_op` and `rivet.jax.ffi_func` take from a
//! user-given backward, docs/gradient.md): the backward's arguments are
//! 1. the forward's inputs: its placeholder arguments, in argument order;
//! 2. one cotangent per forward output (its computed arguments, in argument order), of that
//!    output's shape and dtype; an int or bool output's cotangent is taken and ignored;
//! 3. one gradient per differentiable input (a float placeholder), in order, written by the
//!    backward: `sum over outputs k of VJP(output_k, cotangent_k)`.
//!
//! Invariant: a construct with no derivative rule is a `NotDifferentiable` error naming the
//! output, never a silently zero gradient; an input no output reaches gets zeros.

use crate::error::{Error, Result};
use crate::te::{self, Tensor};

/// The backward program of the function whose build arguments are `args`: its arguments in
/// the module header's convention, and the gradient stages (the last of those arguments).
pub struct BackwardProgram {
    pub args: Vec<Tensor>,
    pub grads: Vec<Tensor>,
}

/// A build's argument list split into its inputs (placeholders) and outputs, in order.
pub(crate) fn inputs_and_outputs(args: &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>) {
    args.iter().cloned().partition(|t| t.is_placeholder())
}

/// Derives the backward program of `args` (a build's argument list).
pub fn backward_program(args: &[Tensor]) -> Result<BackwardProgram> {
    let (inputs, outputs) = inputs_and_outputs(args);
    let diff: Vec<Tensor> = inputs
        .iter()
        .filter(|t| t.dtype().is_float())
        .cloned()
        .collect();
    let heads = outputs
        .iter()
        .map(|o| te::placeholder(o.shape(), o.dtype(), &format!("grad_{}", o.name())))
        .collect::<Result<Vec<_>>>()?;
    // Per differentiable input, the VJP of each float output (te::gradient refuses int ones:
    // they carry no derivative, and contribute nothing).
    let mut parts: Vec<Vec<Tensor>> = vec![Vec::new(); diff.len()];
    if !diff.is_empty() {
        for (o, h) in outputs.iter().zip(&heads) {
            if !o.dtype().is_float() {
                continue;
            }
            let gs = te::gradient(o, &diff, Some(h)).map_err(|e| match e {
                Error::Runtime(rivet_runtime::Error::NotDifferentiable(m)) => {
                    not_diff(format!("output '{}' is not differentiable: {m}", o.name()))
                }
                e => e,
            })?;
            for (p, g) in parts.iter_mut().zip(gs) {
                p.push(g);
            }
        }
    }
    let grads = diff
        .iter()
        .zip(parts)
        .map(|(x, p)| sum_of(x, p))
        .collect::<Result<Vec<_>>>()?;
    let mut bargs = inputs;
    bargs.extend(heads);
    bargs.extend(grads.iter().cloned());
    Ok(BackwardProgram { args: bargs, grads })
}

/// The sum of one input's VJP parts: the part itself when there is one (a stage of its own
/// unless it is an argument already), zeros when no output reaches the input.
fn sum_of(x: &Tensor, parts: Vec<Tensor>) -> Result<Tensor> {
    let name = format!("{}_grad", x.name());
    match parts.len() {
        // A gradient stage that is an input tensor itself (the head of `y = x`) must be
        // copied: a build argument is either read or written, not both.
        1 if !parts[0].is_placeholder() => {
            Ok(parts.into_iter().next().unwrap_or_else(|| x.clone()))
        }
        0 => te::compute_dyn(x.shape(), |_| zero(x), &name),
        _ => te::compute_dyn(
            x.shape(),
            |j| {
                parts
                    .iter()
                    .map(|p| p.idx(j))
                    .reduce(|a, b| a + b)
                    .unwrap_or_else(|| zero(x))
            },
            &name,
        ),
    }
}

fn zero(x: &Tensor) -> crate::ir::expr::Expr {
    crate::ir::expr::Expr::constant(0.0, x.dtype())
}

/// A `NotDifferentiable` error saying why.
pub(crate) fn not_diff(m: String) -> Error {
    Error::Runtime(rivet_runtime::Error::NotDifferentiable(m))
}
