//! What a function was built from: its te program (the build's arguments), target and
//! options, and the functions derived from it so far (its backward, its saved-activations
//! pair), cached here so that each is built once per compiled function.
//!
//! Invariants: only `build` makes a `Recipe` (a loaded module has none: its te program is
//! gone); the caches are filled by `backward.rs`, at most once each, and hold the outcome,
//! an error included, so a function rivet cannot differentiate is not derived again on every
//! request. The artefact stores this so that the pipeline never depends on `backward`.

use crate::lower::Options;
use crate::target::Target;
use crate::te::Tensor;
use rivet_runtime::Function;
use std::sync::{Arc, OnceLock};

/// What a function was built from: enough to build its backward.
pub struct Recipe {
    pub(crate) args: Vec<Tensor>,
    pub(crate) target: Target,
    pub(crate) opts: Options,
    pub(crate) backward: OnceLock<std::result::Result<Function, rivet_runtime::Error>>,
    pub(crate) saved: OnceLock<std::result::Result<Saved, rivet_runtime::Error>>,
}

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
