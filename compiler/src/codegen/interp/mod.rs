//! The reference interpreter: runs a `PrimFunc` directly on memory. It is the oracle of the
//! test suite, so it favours obvious correctness over speed, and it implements exactly the
//! scalar semantics documented in `codegen::cpu_lib::math` and `ir::expr`, which `scalar`
//! states and implements. `machine` runs the statements and holds the memory; `gpu` runs
//! kernels (loops bound to GPU launch dimensions) with CUDA's semantics.

mod gpu;
mod machine;
mod scalar;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_allreduce;
#[cfg(test)]
pub(crate) mod tests_cache;
#[cfg(test)]
mod tests_gpu;

use crate::codegen::{int_slots, Backend, CallFrame, Kernel, LaunchContext};
use crate::error::{Error, Result};
use crate::ir::expr::{Expr, ExprKind, Var};
use crate::ir::stmt::PrimFunc;
use crate::ir::verify::verify;
use crate::target::Target;
use machine::{BufState, Machine};
use rivet_runtime::{DType, Tensor};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

// ---- the backend ---------------------------------------------------------------------------

/// The IR interpreter as a backend (target "interp"). `checked`: the function is unflattened
/// (checked mode) and an index outside its dim is a user-facing `rivet.IndexError`.
#[derive(Debug, Clone)]
pub struct InterpBackend {
    pub checked: bool,
    target: Target,
}

impl InterpBackend {
    pub fn new(checked: bool) -> InterpBackend {
        InterpBackend {
            checked,
            target: Target::interp(),
        }
    }
}

impl Default for InterpBackend {
    fn default() -> InterpBackend {
        InterpBackend::new(false)
    }
}

impl Backend for InterpBackend {
    fn target(&self) -> &Target {
        &self.target
    }

    fn compile(&self, func: &PrimFunc) -> Result<Box<dyn Kernel>> {
        let mut p = Prepared::new(func, !self.checked)?;
        p.checked = self.checked;
        Ok(Box::new(InterpKernel(p)))
    }
}

/// A verified function with its lookup tables, ready to run any number of times.
struct InterpKernel(Prepared);

impl Kernel for InterpKernel {
    unsafe fn launch(&self, frame: &CallFrame, ctx: &LaunchContext) -> Result<()> {
        // SAFETY: forwarded contract: the frame matches the function (see `Kernel::launch`).
        super::cpu_lib::launch::run_with_policy(ctx, || unsafe { self.0.run(frame) })
    }

    fn alloc_output(&self, shape: &[i64], dtype: DType, _: &LaunchContext) -> Result<Tensor> {
        super::cpu_lib::launch::alloc_output(shape, dtype)
    }

    fn source(&self) -> String {
        self.0.func.to_string()
    }

    fn host_callbacks(&self) -> Vec<&crate::ir::callback::Callback> {
        self.0.func.callbacks.iter().collect()
    }
}

/// Verifies `func` (flattened: one element offset per access) and runs it on `frame`.
///
/// # Safety
/// As `Kernel::launch`: `frame.ptrs[i]` must address element 0 of memory laid out as
/// parameter `i` under the frame's dims and strides (every element the shape and strides
/// reach must be valid for reads, and for writes when the function writes the buffer), and
/// the buffers must not be accessed concurrently by anything else during the call.
pub unsafe fn run(func: &PrimFunc, frame: &CallFrame) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe { Prepared::new(func, true)?.run(frame) }
}

/// Like `run`, for a function that has not been flattened yet: every access has one index per
/// buffer dimension, each checked against its extent, and the element offset is the dot
/// product with the buffer's strides. Lets tests run the IR of early passes.
///
/// # Safety
/// As `run`.
pub unsafe fn run_unflattened(func: &PrimFunc, frame: &CallFrame) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe { Prepared::new(func, false)?.run(frame) }
}

/// A scalar value as the interpreter holds it (see `scalar`): integers and
/// bools normalised to their dtype in an `i64`, float32/float16/bfloat16 as `f32`, float64 as
/// `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    F32(f32),
    F64(f64),
}

impl Value {
    /// The value as an f64 (for tests and messages; uint64 is read as signed bits).
    pub fn to_f64(self) -> f64 {
        match self {
            Value::Int(v) => v as f64,
            Value::F32(v) => v as f64,
            Value::F64(v) => v,
        }
    }
}

/// Evaluates a memory-free expression (no `Load`) with the interpreter's semantics, looking
/// variables up with `lookup`: a reference for simplifier and backend tests (shapes and checks
/// are decided exactly by `arith::exact::eval_exact`).
pub fn eval_expr(e: &Expr, lookup: &dyn Fn(&Var) -> Option<i64>) -> Result<Value> {
    let mut m = Machine::new("<expression>", &[], &[], true);
    let mut missing = None;
    e.visit(&mut |n| {
        if let ExprKind::Var(v) = n.kind() {
            match lookup(v) {
                Some(x) => {
                    m.env.insert(v.id, x);
                }
                None => missing = Some(v.clone()),
            }
        }
    });
    if let Some(v) = missing {
        return Err(Error::Internal(format!(
            "eval_expr: unbound variable `{}` (id {}) in `{e}`",
            v.name, v.id
        )));
    }
    m.eval(e)
}

// ---- preparation ----------------------------------------------------------------------------

/// Map keyed by small integer ids (var ids, buffer ids); ids are already well spread.
type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ *b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

struct Prepared {
    func: PrimFunc,
    flattened: bool,
    /// Checked mode: per-dim violations are user errors (`rivet.IndexError`).
    checked: bool,
    /// `int_slots(func)`: the variables `frame.ints` binds, in order.
    slots: Vec<Var>,
}

impl Prepared {
    fn new(func: &PrimFunc, flattened: bool) -> Result<Prepared> {
        verify(func, flattened)?;
        Ok(Prepared {
            func: func.clone(),
            flattened,
            checked: false,
            slots: int_slots(func),
        })
    }

    /// # Safety
    /// As `run`.
    unsafe fn run(&self, frame: &CallFrame) -> Result<()> {
        let f = &self.func;
        let mut m = Machine::new(&f.name, &f.buffers, &f.kernels, self.flattened);
        m.checked = self.checked;
        m.callbacks = &f.callbacks;
        if frame.ptrs.len() != f.params.len() || frame.ints.len() != self.slots.len() {
            return Err(m.err(format!(
                "call frame has {} pointers and {} ints, the function takes {} buffers and {} ints",
                frame.ptrs.len(),
                frame.ints.len(),
                f.params.len(),
                self.slots.len()
            )));
        }
        for (v, x) in self.slots.iter().zip(&frame.ints) {
            m.env.insert(v.id, *x);
        }
        for (i, b) in f.buffers.iter().enumerate() {
            let mut st = BufState {
                name: b.name.clone(),
                dtype: b.dtype,
                ..BufState::default()
            };
            if i < f.params.len() {
                st.shape = b.shape.iter().map(|e| m.int(e)).collect::<Result<_>>()?;
                st.strides = b.strides.iter().map(|v| m.var(v)).collect::<Result<_>>()?;
                st.set_span();
                st.ptr = frame.ptrs[i];
                st.live = true;
            }
            m.index.insert(b.id.0, m.bufs.len());
            m.bufs.push(st);
        }
        for c in &f.checks {
            // Exactly as `call::allocate` decides them: an overflow fails the check.
            let env = &m.env;
            let holds = crate::arith::exact::eval_exact(&c.cond, &|v| env.get(&v.id).copied());
            if holds.map_or(true, |x| x == 0) {
                return Err(m.err(format!(
                    "launched although check `{}` fails ({}); checks must pass before a launch",
                    c.cond, c.message
                )));
            }
        }
        // SAFETY: the parameters' pointers, shapes and strides are valid per the contract,
        // and every access is checked against them.
        unsafe { m.exec(&f.body) }
    }
}
