//! The second step of a full-path call: the sizes the program needs for the bound dims. Dims
//! given by expressions (`n - 2`) are checked against the tensors given, missing outputs are
//! allocated (compact, on the arguments' device), the function's bounds checks are decided,
//! and its temporaries are sized against `MAX_ALLOC_BYTES`.
//!
//! Invariant: shapes, checks and sizes are evaluated exactly (`dims::eval_dims`): an int64
//! overflow fails the check, it never wraps into a pass. Nothing is launched here.

use super::bind::Bound;
use super::dims::{dims_text, eval_dims, shape_error};
use crate::artifact::Compiled;
use crate::codegen::LaunchContext;
use crate::error::{Error, Result};
use crate::ir::limits::MAX_ALLOC_BYTES;
use rivet_runtime::{ArgName, Tensor};

/// Every argument tensor (given or allocated) in parameter order, and the launch context
/// without its work (the arguments' device and the caller's stream).
pub(super) fn allocate(
    c: &Compiled,
    name: &str,
    bound: &mut Bound,
) -> Result<(Vec<Tensor>, LaunchContext)> {
    let f = &c.func;
    let env = &bound.env;
    // The launch context: the arguments' device (one device, checked by `bind` for CUDA; the
    // signature admits only host memory for the CPU backends), the stream the caller chose
    // (`rivet_runtime::stream`), and the call's size, for the backend's policy.
    let ctx = LaunchContext {
        device: bound
            .slots
            .iter()
            .flatten()
            .next()
            .map_or(rivet_runtime::Device::Cpu, |t| t.device()),
        stream: rivet_runtime::stream::call_stream(),
        work: 0,
    };
    // Dims given by expressions, and the allocation of missing outputs.
    for (i, (slot, id)) in bound.slots.iter_mut().zip(&f.params).enumerate() {
        let b = f.buffer(*id);
        let mut want: Vec<i64> = Vec::with_capacity(b.shape.len());
        for (d, e) in b.shape.iter().enumerate() {
            match eval_dims(e, &|v| env.get(v).copied())? {
                Ok(w) => want.push(w),
                Err(what) => {
                    return Err(shape_error(format!(
                        "{name}: the size of {} in dim {d} (= {e}) overflows int64 for these shapes ({}) at `{what}`",
                        ArgName {
                            index: i,
                            name: Some(&b.name)
                        },
                        dims_text(f, env)
                    )))
                }
            }
        }
        match slot {
            Some(t) => {
                for (d, (&w, &g)) in want.iter().zip(t.shape()).enumerate() {
                    if w != g {
                        return Err(shape_error(format!(
                            "{name}: {} has size {g} in dim {d} but the program needs {w} (= {})",
                            ArgName {
                                index: i,
                                name: Some(&b.name)
                            },
                            b.shape[d]
                        )));
                    }
                }
            }
            None => {
                if let Some(d) = want.iter().position(|&w| w < 0) {
                    return Err(shape_error(format!(
                        "{name}: output '{}' would have negative size {} in dim {d}",
                        b.name, want[d]
                    )));
                }
                *slot = Some(
                    c.kernel
                        .alloc_output(&want, b.dtype, &ctx)
                        .map_err(|e| match e {
                            Error::Runtime(r) => {
                                Error::Runtime(r.context(&format!("{name}: output '{}': ", b.name)))
                            }
                            other => other,
                        })?,
                );
            }
        }
    }
    let tensors: Vec<Tensor> = std::mem::take(&mut bound.slots)
        .into_iter()
        .map(|s| s.expect("filled"))
        .collect();
    for k in &f.checks {
        // An overflow while deciding a check fails it: it never wraps into a pass.
        let verdict = match eval_dims(&k.cond, &|v| env.get(v).copied())? {
            Ok(0) => Some(String::new()),
            Ok(_) => None,
            Err(what) => Some(format!(" (deciding it overflows int64 at `{what}`)")),
        };
        if let Some(why) = verdict {
            return Err(shape_error(format!(
                "{name}: out-of-bounds access for these shapes ({}): {}{why}",
                dims_text(f, env),
                k.message
            )));
        }
    }
    for (buf, shape, size) in &c.temps {
        let mut vals = Vec::with_capacity(shape.len());
        for e in shape {
            match eval_dims(e, &|v| env.get(v).copied())? {
                Ok(v) => vals.push(v),
                Err(_) => vals.push(i64::MAX),
            }
        }
        temp_fits(name, buf, &vals, *size)?;
    }
    Ok((tensors, ctx))
}

/// A temporary of `shape` (negative extents count as 0, as the backends allocate them) of
/// `size`-byte elements is at most `MAX_ALLOC_BYTES`. The pipeline applies it at build time
/// to temporaries of constant shape, each call to the others.
pub(crate) fn temp_fits(func: &str, buf: &str, shape: &[i64], size: usize) -> Result<()> {
    let mut bytes: u128 = size as u128;
    for &d in shape {
        bytes = bytes.saturating_mul(d.max(0) as u128);
    }
    if bytes > MAX_ALLOC_BYTES as u128 {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        return Err(Error::Runtime(rivet_runtime::Error::Memory(format!(
            "{func}: temporary '{buf}' of shape ({}) needs {bytes} bytes, over rivet.MAX_ALLOC_BYTES = {MAX_ALLOC_BYTES}",
            dims.join(", ")
        ))));
    }
    Ok(())
}
