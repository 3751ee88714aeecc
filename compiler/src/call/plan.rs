//! The fast path of a compiled function's call: what the full path (`bind`, `allocate`,
//! `launch`) decides from the IR on every call, decided once when the function is made
//! (`CallPlan::new`), so that a call with well-formed arguments costs a few comparisons per
//! dimension.
//!
//! Invariant: the fast path accepts a call only when the full path would accept it and build
//! the same frame. It never reports an error: on anything unusual (a non-tensor argument, a
//! wrong dtype, rank, size, device, a read-only or self-overlapping output, overlapping
//! arguments, a failed bounds check, an oversized temporary, omitted outputs, a CUDA target,
//! dims given by expressions) it returns `None` and the full path runs, finds the problem and
//! words the error. So there is one set of error messages, and the fast path can only be
//! stricter than the full one, never looser: every check the full path makes is made here too
//! (the `fast_path_*` tests in `tests/tests/call_fast_path.rs` compare the two on hostile
//! arguments).

use super::allocate::temp_fits;
use super::dims::eval_dims;
use crate::artifact::Compiled;
use crate::codegen::{CallFrame, FrameInts, FramePtrs};
use crate::ir::expr::Var;
use crate::ir::stmt::BufKind;
use crate::target::TargetKind;
use rivet_runtime::layout::may_self_overlap;
use rivet_runtime::{DType, Value};
use smallvec::SmallVec;
use std::sync::Mutex;

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
#[derive(Debug)]
pub struct CallPlan {
    params: Vec<ParamPlan>,
    n_dims: usize,
    /// Bounds checks or temporaries exist: their conditions need the dims by variable.
    needs_env: bool,
    /// The function calls host callbacks: it is launched even when every output is empty, so
    /// each callback still runs exactly once per call (docs/callbacks.md).
    has_callbacks: bool,
    /// The iteration count when it does not depend on the dims (static shapes): then no
    /// expression is evaluated per call.
    work_const: Option<i64>,
    /// A function without symbolic dims: its checks, temporaries and work are constants,
    /// decided once here (`Some(work)`: they pass; `None`: they fail, and every call takes
    /// the full path, which reports why). No memo is locked per call.
    fixed: Option<Option<i64>>,
    /// The dims of the last accepted call and its loops' iteration count. The bounds checks,
    /// the temporaries' sizes and the work are functions of the dims alone (`checks_pass` and
    /// `work` look up nothing else), and calls repeat shapes: a call with the same dims skips
    /// evaluating them (a symbolic kernel's checks cost more than the rest of the call).
    memo: Mutex<Option<(SmallVec<[i64; 8]>, i64)>>,
}

/// The frame of an accepted call, the device of its first tensor (as the full path's
/// launch context), and the work it measures (elements of all tensors).
pub struct FastCall {
    pub frame: CallFrame,
    pub device: rivet_runtime::Device,
    pub work: i64,
    /// Every output is empty: the call computes nothing and launches nothing (the loops
    /// would still run over the other dims: [2^61, 0] is 2^61 empty iterations).
    pub nothing_to_do: bool,
}

/// `FastCall` without its frame, which `CallPlan::accept_into` fills in the caller's place:
/// the frame's inline arrays (some 200 bytes) are not moved through the return value.
pub struct Accepted {
    pub device: rivet_runtime::Device,
    pub work: i64,
    pub nothing_to_do: bool,
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
        let mut plan = CallPlan {
            params,
            n_dims: f.dims.len(),
            needs_env: !f.checks.is_empty() || !c.temps.is_empty(),
            has_callbacks: !f.callbacks.is_empty(),
            work_const: c.work.constant(),
            fixed: None,
            memo: Mutex::new(None),
        };
        if plan.n_dims == 0 {
            let pass = !plan.needs_env || plan.checks_pass(c, &[]);
            plan.fixed = Some(pass.then(|| plan.work(c, &[])));
        }
        Some(plan)
    }

    /// The frame for `args` when the call is well formed (module header), else `None`.
    pub fn accept(&self, c: &Compiled, args: &[Value]) -> Option<FastCall> {
        let mut frame = CallFrame {
            ptrs: FramePtrs::new(),
            ints: FrameInts::new(),
        };
        let a = self.accept_into(c, args, &mut frame)?;
        Some(FastCall {
            frame,
            device: a.device,
            work: a.work,
            nothing_to_do: a.nothing_to_do,
        })
    }

    /// `accept`, filling `frame` (empty on entry; its contents are unspecified when the
    /// call is refused). One pass over the arguments fills it (the dims' slots first, bound
    /// as they are met), so a small call allocates nothing (`FramePtrs` / `FrameInts` are
    /// inline) and copies no frame.
    pub fn accept_into(
        &self,
        c: &Compiled,
        args: &[Value],
        frame: &mut CallFrame,
    ) -> Option<Accepted> {
        // A bit per dim records which are bound; more dims than bits take the full path.
        if args.len() != self.params.len() || self.n_dims > 64 {
            return None;
        }
        let CallFrame { ptrs, ints } = frame;
        debug_assert!(ptrs.is_empty() && ints.is_empty());
        for _ in 0..self.n_dims {
            ints.push(0);
        }
        let mut seen = 0u64;
        // Byte ranges of the non-empty arguments, with whether each is an output.
        let mut ranges: SmallVec<[(usize, usize, bool); 8]> = SmallVec::new();
        let mut elements = 0i64;
        let mut device = None;
        // Whether every output is empty: then nothing is launched (as on the full path).
        let mut outputs_empty = true;
        for (p, a) in self.params.iter().zip(args) {
            let Value::Tensor(t) = a else { return None };
            if t.dtype() != p.dtype || !t.device().is_host() || t.ndim() != p.shape.len() {
                return None;
            }
            for (want, &got) in p.shape.iter().zip(t.shape()) {
                match *want {
                    DimPlan::Fixed(n) if n == got => {}
                    DimPlan::Fixed(_) => return None,
                    DimPlan::Dim(k) if seen & (1 << k) != 0 => {
                        if ints[k] != got {
                            return None;
                        }
                    }
                    DimPlan::Dim(k) => {
                        ints[k] = got;
                        seen |= 1 << k;
                    }
                }
            }
            if p.output && (t.is_read_only() || may_self_overlap(t.shape(), t.strides())) {
                return None;
            }
            if let Some((lo, hi)) = t.byte_range() {
                ranges.push((lo, hi, p.output));
            }
            if p.output && t.numel() != 0 {
                outputs_empty = false;
            }
            // The ABI's int slots (`codegen::int_slots`): the dims, then every parameter's
            // strides. Pushed one by one: a rank is a few entries, and `extend_from_slice`
            // calls `memmove` and `memcpy` for them.
            for &s in t.strides() {
                ints.push(s);
            }
            ptrs.push(t.data_ptr());
            // Saturating: stride-0 views may claim i64::MAX elements each.
            elements = elements.saturating_add(t.numel());
            device.get_or_insert(t.device());
        }
        let dims = &ints[..self.n_dims];
        let work = match self.fixed {
            Some(fixed) => fixed?,
            None => match self.remembered(dims) {
                Some(w) => w,
                None => {
                    if self.needs_env && !self.checks_pass(c, dims) {
                        return None;
                    }
                    let w = self.work(c, dims);
                    self.remember(dims, w);
                    w
                }
            },
        };
        // Outputs may not share memory with any other argument.
        for (i, &(lo, hi, output)) in ranges.iter().enumerate() {
            if output
                && ranges
                    .iter()
                    .enumerate()
                    .any(|(j, &(l2, h2, _))| i != j && lo < h2 && l2 < hi)
            {
                return None;
            }
        }
        // As the full path: the loops' iteration count, or the arguments' elements when that
        // is more.
        let work = work.max(elements);
        Some(Accepted {
            device: device.unwrap_or(rivet_runtime::Device::Cpu),
            work,
            nothing_to_do: outputs_empty
                && !self.has_callbacks
                && self.params.iter().any(|p| p.output),
        })
    }

    /// The work remembered for `dims` when the last accepted call had them. A contended lock
    /// (another thread calling) is a miss, never a wait.
    fn remembered(&self, dims: &[i64]) -> Option<i64> {
        let memo = self.memo.try_lock().ok()?;
        match &*memo {
            Some((d, w)) if d.as_slice() == dims => Some(*w),
            _ => None,
        }
    }

    fn remember(&self, dims: &[i64], work: i64) {
        if let Ok(mut memo) = self.memo.try_lock() {
            *memo = Some((SmallVec::from_slice(dims), work));
        }
    }

    /// The loops' iteration count for these dims (`lower::work`), as the full path (`launch`) counts it.
    fn work(&self, c: &Compiled, dims: &[i64]) -> i64 {
        if let Some(w) = self.work_const {
            return w;
        }
        c.work.eval(&|v| dim_value(c, dims, v))
    }

    /// The bounds checks hold and every temporary fits, evaluated exactly as the full path
    /// does (an overflow or any doubt: `false`, and the full path reports it).
    fn checks_pass(&self, c: &Compiled, dims: &[i64]) -> bool {
        let f = &c.func;
        let lookup = |v: &Var| dim_value(c, dims, v);
        let eval = |e| eval_dims(e, &lookup);
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
            if temp_fits(&f.name, buf, &vals, *size).is_err() {
                return false;
            }
        }
        true
    }
}

/// The value of dim `v` in a call whose dims are `dims` (in `func.dims` order): a scan of a
/// few ids, no map built per call. Anything else (a stride) is `None`.
fn dim_value(c: &Compiled, dims: &[i64], v: &Var) -> Option<i64> {
    c.func
        .dims
        .iter()
        .position(|d| d.id == v.id)
        .map(|k| dims[k])
}
