//! Calling a compiled function: `make_function` turns a `Compiled` into a packed `Function`
//! with a typed signature (`signature`), an output rule (`output_shapes`) and a body that
//! takes the precomputed fast path (`plan`) when it can, else the full path in three steps:
//! `bind` (check the arguments, bind the dims), `allocate` (sizes for those dims, missing
//! outputs, bounds checks, temporaries), `launch` (aliasing, frame, launch).
//!
//! A compiled function is called with all its arguments (outputs written in place, through
//! their own strides) or with only its inputs (outputs allocated, compact, and returned).
//! Before any code runs, a call: checks every argument against the typed signature (dtype,
//! rank, fixed dims, consistent symbolic dims, device, writable and non-overlapping outputs);
//! binds the symbolic dims; checks dims given by expressions (`n - 2`); evaluates the
//! function's bounds checks; sizes its temporaries against `MAX_ALLOC_BYTES`; refuses outputs
//! sharing memory with another argument. Shapes, checks and sizes are evaluated exactly
//! (`arith::exact`): an int64 overflow fails the check, it never wraps into a pass.
//!
//! Invariant: the fast path accepts a call only when the full path would accept it and build
//! the same frame (`plan`'s header); every error is worded by the full path.

pub(crate) mod allocate;
mod bind;
mod dims;
mod launch;
pub mod output_shapes;
pub mod plan;
pub mod signature;

use crate::artifact::{Compiled, Module};
use crate::codegen::{CallFrame, FrameInts, FramePtrs, LaunchContext};
use crate::error::Result;
use crate::target::TargetKind;
use plan::CallPlan;
use rivet_runtime::{DeviceSpec, Function, ParamKind, Signature, Value};
use std::sync::Arc;

impl Module {
    /// `mod[name]` / `mod.get_function(name)`.
    pub fn get_function(&self, name: &str) -> Result<Function> {
        Ok(make_function(self.find(name)?.clone()))
    }
}

/// The packed function of a compiled function.
pub fn make_function(c: Arc<Compiled>) -> Function {
    make_function_with(c, true)
}

/// `make_function` without the fast path (`plan`): every call takes the full path. For the
/// tests that check the fast path accepts exactly what the full path accepts.
#[doc(hidden)]
pub fn make_function_full_path(c: Arc<Compiled>) -> Function {
    make_function_with(c, false)
}

fn make_function_with(c: Arc<Compiled>, fast: bool) -> Function {
    let device = match c.target.kind {
        TargetKind::Cuda => DeviceSpec::Any,
        _ => DeviceSpec::Host,
    };
    let sig = signature::signature_on(&c.func, device);
    let inputs_sig = Signature::new(
        sig.params
            .iter()
            .filter(|p| matches!(&p.kind, ParamKind::Tensor(t) if !t.output))
            .cloned()
            .collect(),
    );
    let name = c.func.name.clone();
    let body_sig = sig.clone();
    let plan = if fast { CallPlan::new(&c) } else { None };
    let rule_c = c.clone();
    let rule = move |shapes: &[&[i64]]| {
        output_shapes::output_shapes(&rule_c.func, shapes).map_err(rivet_runtime::Error::from)
    };
    let parts: Arc<dyn std::any::Any + Send + Sync> = c.clone();
    Function::with_output_rule(
        name.clone(),
        sig,
        move |args| {
            // Well-formed calls take the precomputed fast path; everything else (including every
            // error) the full one, which words the errors (`plan`'s header).
            if let Some(plan) = &plan {
                // The frame lives here, filled in place (`accept_into`), launched from here.
                let mut frame = CallFrame {
                    ptrs: FramePtrs::new(),
                    ints: FrameInts::new(),
                };
                if let Some(fast) = plan.accept_into(&c, args, &mut frame) {
                    if !fast.nothing_to_do {
                        let ctx = LaunchContext {
                            device: fast.device,
                            stream: rivet_runtime::stream::call_stream(),
                            work: fast.work,
                        };
                        // SAFETY: the plan made every check of the full path (module header
                        // of `plan`) on these arguments.
                        unsafe { c.kernel.launch(&frame, &ctx) }
                            .map_err(rivet_runtime::Error::from)?;
                    }
                    return Ok(Value::Null);
                }
            }
            call(&c, &name, &body_sig, &inputs_sig, args).map_err(rivet_runtime::Error::from)
        },
        rule,
    )
    // The body holds `c`, the output rule `rule_c`: two handles besides the parts' own.
    .with_parts(parts, 2)
}

/// The full path: bind, allocate, launch (module header).
fn call(
    c: &Compiled,
    name: &str,
    sig: &Signature,
    inputs_sig: &Signature,
    args: &[Value],
) -> Result<Value> {
    let mut bound = bind::bind(c, name, sig, inputs_sig, args)?;
    let (tensors, ctx) = allocate::allocate(c, name, &mut bound)?;
    launch::launch(
        c,
        name,
        tensors,
        &bound.env,
        ctx,
        bound.allocate,
        bound.n_out,
    )
}
