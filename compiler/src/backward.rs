//! The backward function of a te-built function: its backward program (`vjp.rs`, whose
//! header gives the argument convention) built like any other program, and the
//! saved-activations pair (`residuals.rs`). This is what `rivet.torch.custom_op` and
//! `rivet.jax.ffi_func` use when no backward is given.
//!
//! Invariants: the backward is built for the forward's target with the forward's options, so
//! a CPU function gets a CPU backward under the default schedule unless the forward was built
//! as written. A function rivet cannot differentiate (loaded from a file, so its te program
//! is gone; a host callback on the path; a construct with no derivative rule) is a
//! `NotDifferentiable` error naming the function and why, never a silently zero gradient.
//! The backward is built once per compiled function and cached in what the artefact records
//! it was built from (`artifact::recipe::Recipe`): the pipeline stores that record and never
//! depends on this module, which sits above it.

use crate::artifact::recipe::{Recipe, Saved};
use crate::artifact::Compiled;
use crate::build::{build_with, Options};
use crate::call::make_function;
use crate::error::{Error, Result};
use crate::schedule::Schedule;
use crate::target::Target;
use crate::te::Tensor;
use crate::vjp::{backward_program, not_diff};
use rivet_runtime::Function;
use std::sync::Arc;

/// The te program `f` was built from, or why rivet cannot differentiate `f`.
fn recipe_of(f: &Function) -> Result<Arc<Recipe>> {
    let compiled = f
        .parts()
        .and_then(|p| p.object.clone().downcast::<Compiled>().ok())
        .ok_or_else(|| {
            not_diff(format!(
                "function '{}' has no te program rivet can differentiate (it was not built by rivet.build / rivet.kernels in this process: a loaded module or a registered function); give the backward explicitly",
                f.name()
            ))
        })?;
    compiled.recipe.clone().ok_or_else(|| {
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
    let src = recipe_of(f)?;
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
    let src = recipe_of(f)?;
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
