//! The fast path of a compiled function's call: what `build::call` decides from the IR on
//! every call, decided once when the function is made (`CallPlan::new`), so that a call
//! with well-formed arguments costs a few comparisons per dimension.
//!
//! Invariant: the fast path accepts a call only when the full path (`build::call`) would
//! accept it and build the same frame. It never reports an error: on anything unusual (a
//! non-tensor argument, a wrong dtype, rank, size, device, a read-only or self-overlapping
//! output, overlapping arguments, a failed bounds check, an oversized temporary, omitted
//! outputs, a CUDA target, dims given by expressions) it returns `None` and the full path
//! runs, finds the problem and words the error. So there is one set of error messages, and
//! the fast path can only be stricter than the full one, never looser: every check the full
//! path makes is made here too (the `fast_path_*` tests in `tests/tests/call_fast_path.rs`
//! compare the two on hostile arguments).

use crate::build::Compiled;
use crate::codegen::CallFrame;
use crate::ir::expr::Var;
use crate::ir::stmt::BufKind;
use crate::target::TargetKind;
use rivet_runtime::{ArgName, DType, Tensor, Value};
use smallvec::SmallVec;
use std::collections::HashMap;

/// One dimension of a parameter's shape.
#[derive(Debug, Clone, Copy)]
enum DimPlan {
    Fixed(i64),
    /// The value of `func.dims[k]`.
    Dim(usize),
}

#[derive(Debug, Clone)]
struct ParamPlan {
    dtype: DType,
    shape: Vec<DimPlan>,
    output: bool,
}

/// What the fast path checks, per parameter in `func.params` order.
#[derive(Debug, Clone)]
pub struct CallPlan {
    params: Vec<ParamPlan>,
    n_dims: usize,
    /// Bounds checks or temporaries exist: their conditions need the dims by variable.
    needs_env: bool,
    /// The iteration count when it does not depend on the dims (static shapes): then no
    /// expression is evaluated per call.
    work_const: Option<i64>,
}

/// The frame of an accepted call, the device of its first tensor (as the full path's
/// launch context), and the work it measures (elements of all tensors).
pub struct FastCall {
    pub frame: CallFrame,
    pub device: rivet_runtime::Device,
    pub work: i64,
}

impl CallPlan {
    /// The plan of `c`, or `None` when its calls always take the full path (CUDA functions,
    /// whose device rule and stream handling live there; dims given by expressions).
    pub fn new(c: &Compiled) -> Option<CallPlan> {
        if c.target.kind == TargetKind::Cuda {
            return None;
        }
        let f = &c.func;
        let mut params = Vec::with_capacity(f.params.len());
        for id in &f.params {
            let b = f.buffer(*id);
            let mut shape = Vec::with_capacity(b.shape.len());
            for e in &b.shape {
                shape.push(match (e.as_int(), e.as_var()) {
                    (Some(n), _) => DimPlan::Fixed(n),
                    (None, Some(v)) => DimPlan::Dim(f.dims.iter().position(|d| d == v)?),
                    _ => return None,
                });
            }
            params.push(ParamPlan {
                dtype: b.dtype,
                shape,
                output: b.kind == (BufKind::Param { output: true }),
            });
        }
        // Every dim must be bound by some input or output's shape, as the full path requires.
        for k in 0..f.dims.len() {
            let bound = params.iter().any(|p| {
                p.shape
                    .iter()
                    .any(|d| matches!(d, DimPlan::Dim(j) if *j == k))
            });
            if !bound {
                return None;
            }
        }
        Some(CallPlan {
            params,
            n_dims: f.dims.len(),
            needs_env: !f.checks.is_empty() || !c.temps.is_empty(),
            work_const: c.work.constant(),
        })
    }

    /// The frame for `args` when the call is well formed (module header), else `None`.
    pub fn accept(&self, c: &Compiled, args: &[Value]) -> Option<FastCall> {
        if args.len() != self.params.len() {
            return None;
        }
        let mut dims: SmallVec<[i64; 8]> = SmallVec::from_elem(0, self.n_dims);
        let mut seen: SmallVec<[bool; 8]> = SmallVec::from_elem(false, self.n_dims);
        let mut tensors: SmallVec<[&Tensor; 8]> = SmallVec::with_capacity(args.len());
        for (p, a) in self.params.iter().zip(args) {
            let Value::Tensor(t) = a else { return None };
            if t.dtype() != p.dtype || !t.device().is_host() || t.ndim() != p.shape.len() {
                return None;
            }
            for (want, &got) in p.shape.iter().zip(t.shape()) {
                match *want {
                    DimPlan::Fixed(n) if n == got => {}
                    DimPlan::Fixed(_) => return None,
                    DimPlan::Dim(k) if seen[k] => {
                        if dims[k] != got {
                            return None;
                        }
                    }
                    DimPlan::Dim(k) => {
                        dims[k] = got;
                        seen[k] = true;
                    }
                }
            }
            if p.output
                && t.check_writable(
                    ArgName {
                        index: 0,
                        name: None,
                    },
                    "",
                )
                .is_err()
            {
                return None;
            }
            tensors.push(t);
        }
        if self.needs_env && !self.checks_pass(c, &dims) {
            return None;
        }
        // Outputs may not share memory with any other argument.
        let ranges: SmallVec<[Option<(usize, usize)>; 8]> =
            tensors.iter().map(|t| t.byte_range()).collect();
        for (i, p) in self.params.iter().enumerate() {
            let (true, Some((lo, hi))) = (p.output, ranges[i]) else {
                continue;
            };
            for (j, r) in ranges.iter().enumerate() {
                if let (true, Some((l2, h2))) = (i != j, r) {
                    if lo < *h2 && *l2 < hi {
                        return None;
                    }
                }
            }
        }
        // The ABI's int slots (`codegen::int_slots`): the dims, then every parameter's strides.
        let n_ints = self.n_dims + tensors.iter().map(|t| t.ndim()).sum::<usize>();
        let mut ints = Vec::with_capacity(n_ints);
        ints.extend_from_slice(&dims);
        for t in &tensors {
            ints.extend_from_slice(t.strides());
        }
        Some(FastCall {
            frame: CallFrame {
                ptrs: tensors.iter().map(|t| t.data_ptr()).collect(),
                ints,
            },
            device: tensors
                .first()
                .map_or(rivet_runtime::Device::Cpu, |t| t.device()),
            // As the full path: the loops' iteration count, or the arguments' elements when
            // that is more; saturating (stride-0 views may claim i64::MAX elements each).
            work: self.work(c, &dims, &tensors),
        })
    }

    /// The call's work, as `build::call` measures it (`lower::work`).
    fn work(&self, c: &Compiled, dims: &[i64], tensors: &[&Tensor]) -> i64 {
        let elements = tensors
            .iter()
            .fold(0i64, |w, t| w.saturating_add(t.numel()));
        if let Some(w) = self.work_const {
            return w.max(elements);
        }
        let f = &c.func;
        let lookup = |v: &Var| f.dims.iter().position(|d| d == v).map(|k| dims[k]);
        c.work.eval(&lookup).max(elements)
    }

    /// The bounds checks hold and every temporary fits, evaluated exactly as the full path
    /// does (an overflow or any doubt: `false`, and the full path reports it).
    fn checks_pass(&self, c: &Compiled, dims: &[i64]) -> bool {
        let f = &c.func;
        let env: HashMap<Var, i64> = f.dims.iter().cloned().zip(dims.iter().copied()).collect();
        let eval = |e| crate::build::eval_dims(e, &env);
        for k in &f.checks {
            if !matches!(eval(&k.cond), Ok(Ok(v)) if v != 0) {
                return false;
            }
        }
        for (buf, shape, size) in &c.temps {
            let mut vals: SmallVec<[i64; 8]> = SmallVec::new();
            for e in shape {
                match eval(e) {
                    Ok(Ok(v)) => vals.push(v),
                    _ => return false,
                }
            }
            if crate::build::temp_fits(&f.name, buf, &vals, *size).is_err() {
                return false;
            }
        }
        true
    }
}
