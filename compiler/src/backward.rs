//! The backward function of a te-built function: its vector-Jacobian product, derived with
//! `te::gradient` and built like any other program. This is what `rivet.torch.custom_op` and
//! `rivet.jax.ffi_func` use when no backward is given.
//!
//! Convention (the one those integrations take from a user-given backward, docs/gradient.md):
//! the backward's arguments are
//! 1. the forward's inputs: its placeholder arguments, in argument order;
//! 2. one cotangent per forward output (its computed arguments, in argument order), of that
//!    output's shape and dtype; an int or bool output's cotangent is taken and ignored;
//! 3. one gradient per differentiable input (a float placeholder), in order, written by the
//!    backward: `sum over outputs k of VJP(output_k, cotangent_k)`.
//!
//! Invariants: the backward is built for the forward's target with the forward's options, so
//! a CPU function gets a CPU backward under the default schedule unless the forward was built
//! as written. A function rivet cannot differentiate (loaded from a file, so its te program
//! is gone; a host callback on the path; a construct with no derivative rule) is a
//! `NotDifferentiable` error naming the function and why, never a silently zero gradient.
//! The backward is built once per compiled function and cached (`Recipe::backward`).

use crate::build::{build_with, make_function, Compiled, Options};
use crate::error::{Error, Result};
use crate::schedule::Schedule;
use crate::target::Target;
use crate::te::{self, Tensor};
use rivet_runtime::Function;
use std::sync::{Arc, OnceLock};

/// What a function was built from: enough to build its backward. (Not `lower::Source`, the
/// schedule or loaded nest one lowering starts from.)
pub struct Recipe {
    args: Vec<Tensor>,
    target: Target,
    opts: Options,
    backward: OnceLock<std::result::Result<Function, rivet_runtime::Error>>,
    saved: OnceLock<std::result::Result<Saved, rivet_runtime::Error>>,
}

/// `Recipe`'s former name, still used by `build.rs`; goes once that file says `Recipe`.
pub type Source = Recipe;

/// The saved-activations pair of a function (`residuals.rs`): the forward that also writes
/// `residuals` extra outputs, and the backward that reads them.
#[derive(Clone)]
pub struct Saved {
    pub forward: Function,
    pub backward: Function,
    pub residuals: usize,
}

impl Recipe {
    /// The build's arguments (te tensors), in order.
    pub fn args(&self) -> &[Tensor] {
        &self.args
    }

    /// The functions derived from this one so far (`backward`, `saved`).
    pub fn built_functions(&self) -> Vec<&Function> {
        let mut out = Vec::new();
        if let Some(Ok(f)) = self.backward.get() {
            out.push(f);
        }
        if let Some(Ok(s)) = self.saved.get() {
            out.push(&s.forward);
            out.push(&s.backward);
        }
        out
    }

    pub(crate) fn new(args: &[Tensor], target: &Target, opts: Options) -> Arc<Recipe> {
        Arc::new(Recipe {
            args: args.to_vec(),
            target: target.clone(),
            opts,
            backward: OnceLock::new(),
            saved: OnceLock::new(),
        })
    }
}

/// The te program `f` was built from, or why rivet cannot differentiate `f`.
fn source_of(f: &Function) -> Result<Arc<Recipe>> {
    let compiled = f
        .parts()
        .and_then(|p| p.object.clone().downcast::<Compiled>().ok())
        .ok_or_else(|| {
            not_diff(format!(
                "function '{}' has no te program rivet can differentiate (it was not built by rivet.build / rivet.kernels in this process: a loaded module or a registered function); give the backward explicitly",
                f.name()
            ))
        })?;
    compiled.source.clone().ok_or_else(|| {
        not_diff(format!(
            "function '{}' was loaded from a saved module, which keeps the loop IR but not the te program rivet differentiates; build it from its te program, or give the backward explicitly",
            f.name()
        ))
    })
}

/// A derivation error, with the function's name on a `NotDifferentiable` reason.
fn named(f: &Function, e: Error) -> rivet_runtime::Error {
    match rivet_runtime::Error::from(e) {
        rivet_runtime::Error::NotDifferentiable(m) => {
            rivet_runtime::Error::NotDifferentiable(format!("function '{}': {m}", f.name()))
        }
        e => e,
    }
}

/// The backward function of `f` (module header), built on first use and cached.
pub fn backward(f: &Function) -> Result<Function> {
    let src = source_of(f)?;
    src.backward
        .get_or_init(|| {
            let name = format!("{}_backward", f.name());
            build_backward(&src.args, &src.target, &name, src.opts).map_err(|e| named(f, e))
        })
        .clone()
        .map_err(Error::Runtime)
}

/// The saved-activations pair of `f` (`residuals.rs`), built on first use and cached: the
/// forward `<name>_fwd` and the backward `<name>_backward_saved`, for `f`'s target with its
/// options under the default schedule (a function built "as written" gets a default-scheduled
/// forward with residuals).
pub fn saved(f: &Function) -> Result<Saved> {
    let src = source_of(f)?;
    src.saved
        .get_or_init(|| build_saved(&src, f.name()).map_err(|e| named(f, e)))
        .clone()
        .map_err(Error::Runtime)
}

fn build_saved(src: &Recipe, name: &str) -> Result<Saved> {
    let p = crate::residuals::saved_program(&src.args)?;
    if p.grads.is_empty() {
        return Err(not_diff(
            "it has no float tensor inputs, so there is nothing to differentiate".into(),
        ));
    }
    let outputs: Vec<Tensor> = src
        .args
        .iter()
        .filter(|t| !t.is_placeholder())
        .chain(&p.residuals)
        .cloned()
        .collect();
    let mut fargs = src.args.clone();
    fargs.extend(p.residuals.iter().cloned());
    let forward = build_one(
        &outputs,
        &fargs,
        &src.target,
        &format!("{name}_fwd"),
        src.opts,
    )?;
    let backward = build_one(
        &p.grads,
        &p.args,
        &src.target,
        &format!("{name}_backward_saved"),
        src.opts,
    )?;
    Ok(Saved {
        forward,
        backward,
        residuals: p.residuals.len(),
    })
}

/// One function: `outputs` under the default schedule, with arguments `args`.
fn build_one(
    outputs: &[Tensor],
    args: &[Tensor],
    target: &Target,
    name: &str,
    opts: Options,
) -> Result<Function> {
    let sched = Schedule::new(outputs)?;
    let m = build_with(&sched, args, target, name, opts)?;
    let c = m
        .funcs
        .into_iter()
        .next()
        .ok_or_else(|| Error::Internal(format!("build of '{name}' returned no function")))?;
    Ok(make_function(c))
}

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

/// Builds the backward of the function whose build arguments are `args`, for `target`.
pub fn build_backward(
    args: &[Tensor],
    target: &Target,
    name: &str,
    opts: Options,
) -> Result<Function> {
    let p = backward_program(args)?;
    if p.grads.is_empty() {
        return Err(not_diff(
            "it has no float tensor inputs, so there is nothing to differentiate".into(),
        ));
    }
    build_one(&p.grads, &p.args, target, name, opts)
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

fn not_diff(m: String) -> Error {
    Error::Runtime(rivet_runtime::Error::NotDifferentiable(m))
}
