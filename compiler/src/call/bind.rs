//! The first step of a full-path call: check the arguments against the signature (and a CUDA
//! function's device rule), take the tensors given, and bind the symbolic dims from them.
//!
//! Invariant: nothing is allocated or launched here; every error names the argument (index
//! and parameter name) it is about, and comes before any work.

use super::signature::check_devices;
use crate::artifact::Compiled;
use crate::error::{Error, Result};
use crate::ir::expr::Var;
use crate::ir::stmt::BufKind;
use crate::target::TargetKind;
use rivet_runtime::{Signature, Tensor, Value};
use std::collections::HashMap;

/// A call's arguments, checked and bound.
pub(super) struct Bound {
    /// Called with inputs only: the outputs are allocated and returned.
    pub allocate: bool,
    /// How many outputs the function has.
    pub n_out: usize,
    /// Each dim's value, from the arguments whose dim is exactly that variable.
    pub env: HashMap<Var, i64>,
    /// Per parameter, the tensor given (`None`: an output to allocate).
    pub slots: Vec<Option<Tensor>>,
}

/// Checks `args` (all arguments, or the inputs only) and binds the dims.
pub(super) fn bind(
    c: &Compiled,
    name: &str,
    sig: &Signature,
    inputs_sig: &Signature,
    args: &[Value],
) -> Result<Bound> {
    let f = &c.func;
    let n_out = f.params.len() - inputs_sig.params.len();
    let allocate =
        args.len() == inputs_sig.params.len() && n_out > 0 && args.len() != f.params.len();
    if c.target.kind == TargetKind::Cuda {
        check_devices(name, if allocate { inputs_sig } else { sig }, args)?;
    }
    if allocate {
        inputs_sig.check(name, args)?;
    } else {
        sig.check(name, args)?;
    }
    // Bind the dims from arguments whose dim is exactly the variable.
    let mut env: HashMap<Var, i64> = HashMap::new();
    let mut inputs = args.iter();
    let mut slots: Vec<Option<Tensor>> = Vec::with_capacity(f.params.len());
    for id in &f.params {
        let b = f.buffer(*id);
        let is_out = b.kind == (BufKind::Param { output: true });
        slots.push(if allocate && is_out {
            None
        } else {
            Some(
                inputs
                    .next()
                    .and_then(|v| v.as_tensor())
                    .expect("checked")
                    .clone(),
            )
        });
    }
    for (slot, id) in slots.iter().zip(&f.params) {
        if let Some(t) = slot {
            for (d, e) in f.buffer(*id).shape.iter().enumerate() {
                if let Some(v) = e.as_var() {
                    env.entry(v.clone()).or_insert(t.shape()[d]);
                }
            }
        }
    }
    for v in &f.dims {
        if !env.contains_key(v) {
            return Err(Error::Runtime(rivet_runtime::Error::Argument(format!(
                "{name}: dim '{}' is only known from an output; pass the outputs too",
                v.name
            ))));
        }
    }
    Ok(Bound {
        allocate,
        n_out,
        env,
        slots,
    })
}
