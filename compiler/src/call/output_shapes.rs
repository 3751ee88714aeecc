//! The output rule of a compiled function (`Function::output_shapes`): which outputs a call
//! with inputs of given shapes allocates, computed from the shapes alone, without tensors or
//! a launch. Frameworks that trace shapes before running (XLA through `rivet.jax.ffi_func`,
//! torch's fake tensors) ask it.
//!
//! Invariant: it accepts exactly the input shapes the full call path accepts when given only
//! the inputs (ranks, fixed dims, symbolic dims bound consistently, dims given by
//! expressions, no dim known only from an output, no overflowing size) and answers the shapes
//! that path would allocate; the `output_shapes_*` tests compare the two.

use super::dims::eval_dims;
use crate::error::{Error, Result};
use crate::ir::expr::Var;
use crate::ir::stmt::{BufKind, PrimFunc};
use rivet_runtime::{ArgName, DType};
use std::collections::HashMap;

fn shape_error(msg: String) -> Error {
    Error::Runtime(rivet_runtime::Error::Shape(msg))
}

/// The outputs' shapes and dtypes, in parameter order, for inputs of `shapes`.
pub fn output_shapes(f: &PrimFunc, shapes: &[&[i64]]) -> Result<Vec<(Vec<i64>, DType)>> {
    let name = &f.name;
    let is_out = |id| f.buffer(id).kind == (BufKind::Param { output: true });
    let inputs: Vec<usize> = (0..f.params.len())
        .filter(|&i| !is_out(f.params[i]))
        .collect();
    if shapes.len() != inputs.len() {
        return Err(Error::Runtime(rivet_runtime::Error::Argument(format!(
            "{name}: takes {} input{} but {} shape{} were given",
            inputs.len(),
            if inputs.len() == 1 { "" } else { "s" },
            shapes.len(),
            if shapes.len() == 1 { "" } else { "s" },
        ))));
    }
    let arg = |i: usize| ArgName {
        index: i,
        name: Some(&f.buffer(f.params[i]).name),
    };
    // Bind the dims from the inputs whose dim is exactly the variable (as `call` does).
    let mut env: HashMap<Var, i64> = HashMap::new();
    for (&i, shape) in inputs.iter().zip(shapes) {
        let b = f.buffer(f.params[i]);
        if shape.len() != b.shape.len() {
            return Err(shape_error(format!(
                "{name}: {} has rank {} but the program needs rank {}",
                arg(i),
                shape.len(),
                b.shape.len()
            )));
        }
        if let Some(d) = shape.iter().position(|&s| s < 0) {
            return Err(shape_error(format!(
                "{name}: {} has negative size {} in dim {d}",
                arg(i),
                shape[d]
            )));
        }
        for (e, &s) in b.shape.iter().zip(shape.iter()) {
            if let Some(v) = e.as_var() {
                env.entry(v.clone()).or_insert(s);
            }
        }
    }
    if let Some(v) = f.dims.iter().find(|v| !env.contains_key(*v)) {
        return Err(Error::Runtime(rivet_runtime::Error::Argument(format!(
            "{name}: dim '{}' is only known from an output; its outputs' shapes cannot be derived from the inputs",
            v.name
        ))));
    }
    let lookup = |v: &Var| env.get(v).copied();
    let mut outs = Vec::new();
    let mut given = shapes.iter();
    for (i, &id) in f.params.iter().enumerate() {
        let b = f.buffer(id);
        let mut want = Vec::with_capacity(b.shape.len());
        for (d, e) in b.shape.iter().enumerate() {
            match eval_dims(e, &lookup)? {
                Ok(w) => want.push(w),
                Err(what) => {
                    return Err(shape_error(format!(
                        "{name}: the size of {} in dim {d} (= {e}) overflows int64 for these shapes at `{what}`",
                        arg(i)
                    )))
                }
            }
        }
        if is_out(id) {
            if let Some(d) = want.iter().position(|&w| w < 0) {
                return Err(shape_error(format!(
                    "{name}: output '{}' would have negative size {} in dim {d}",
                    b.name, want[d]
                )));
            }
            outs.push((want, b.dtype));
        } else {
            let got = given.next().expect("one shape per input, counted above");
            if let Some(d) = (0..want.len()).find(|&d| want[d] != got[d]) {
                return Err(shape_error(format!(
                    "{name}: {} has size {} in dim {d} but the program needs {} (= {})",
                    arg(i),
                    got[d],
                    want[d],
                    b.shape[d]
                )));
            }
        }
    }
    Ok(outs)
}
