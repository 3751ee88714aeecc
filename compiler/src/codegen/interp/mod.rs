//! The reference interpreter: runs a `PrimFunc` directly on memory. It is the oracle of the
//! test suite, so it favours obvious correctness over speed, and it implements exactly the
//! scalar semantics documented in `codegen::cpu_lib::math` and `ir::expr`:
//!
//! - integers are held in an `i64`, normalised to their dtype after every operation: signed
//!   types sign-extended, `uint8/16/32` zero-extended, `uint64` as its bit pattern (so its
//!   comparisons, `//`, `%`, `min`, `max` and conversions to float are done unsigned); `bool`
//!   is 0 or 1. Arithmetic wraps at the dtype's width; `//` and `%` are Python's (floor)
//!   with a zero divisor giving 0 (`math::floordiv_i64`, `math::floormod_i64`).
//! - `float32` is computed in `f32` (never widened), `float64` in `f64`; `float16`/`bfloat16`
//!   are loaded as `f32`, computed in `f32`, and rounded to their dtype only by a `Store`, a
//!   `Cast` to them, and a constant of their dtype (a float constant is the value rounded
//!   to the node's dtype, directly from the stored `f64`).
//! - transcendentals (`exp`, `log`, `tanh`, `erf`, `pow`) are `libm`'s in the dtype, except
//!   float32 `exp`: rivet's `codegen::cpu_lib::exp32`; `sqrt`, `abs`, `floor`, `ceil` are native
//!   (exact); `rsqrt = 1 / sqrt`, `sigmoid = 1 / (1 + exp(-x))`; float `min`/`max` propagate NaN (`math::fmin`/`fmax`);
//!   float `//`/`%` are `math::floordiv_f32`/`floormod_f32` (and the f64 versions).
//! - casts: int -> int wraps; float -> int saturates (Rust `as`, NaN -> 0); int -> float is
//!   `as` (unsigned for `uint64`; to float16/bfloat16 via `f32`); float -> float rounds to
//!   nearest, float64 -> float16 through float32 (rounded twice: the `half` crate's
//!   `from_f64` rounds directly without F16C and through float32 with it, so it would make
//!   the oracle depend on the CPU; every backend, CUDA included, converts through float32);
//!   float64 -> bfloat16 is `half`'s `from_f64` (no hardware path); anything -> bool is
//!   `x != 0`; bool -> number 0/1.
//! - `fma(a, b, c)` is `mul_add`: `a * b + c` rounded once, in the value type (`f32` for
//!   float16/bfloat16 too);
//! - comparisons of floats are IEEE (NaN compares unequal to everything); `Select` evaluates
//!   its condition and only the chosen arm; `&&`/`||` short-circuit.
//!
//! Execution: `For` loops of every kind (but those bound to GPU launch dimensions, which run
//! as kernels with CUDA's semantics: `gpu.rs`) run serially, in order; `min` and `extent` are
//! evaluated once, before the first iteration. `Let` binds an int64. `Allocate` evaluates the
//! local buffer's shape, binds its stride variables to compact row-major strides, and gives
//! it zeroed memory for the duration of its body.
//!
//! Memory: parameter `i`'s element 0 is at `frame.ptrs[i]`; a flattened index is an element
//! offset from there (negative for negative strides); an element is read and written with
//! unaligned accesses of `dtype.size()` bytes. As an oracle the interpreter trusts nothing it
//! can check cheaply: every access is bounds-checked (locals exactly; parameters against the
//! span of offsets their shape and strides allow), the frame's arity and `func.checks` are
//! checked at launch, and a violation is an `Error::Internal` naming the function, buffer and
//! offset, never undefined behaviour. In checked mode (`InterpBackend::new(true)`, run
//! on unflattened IR) an index outside its dim is the user's `Error::Index` instead; a local
//! buffer over `MAX_ALLOC_BYTES`, or one the system refuses, is `Error::Memory`.

use crate::codegen::cpu_lib::math;
use crate::codegen::{int_slots, Backend, CallFrame, Kernel, LaunchContext};
use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, CmpOp, Const, Expr, ExprKind, LogicOp, UnOp, Var};
use crate::ir::intrin::{gemm_extents, Intrin, Region};
use crate::ir::stmt::{Buffer, DeviceFunc, ForKind, PrimFunc, Stmt};
use crate::ir::verify::verify;
use crate::target::Target;
use half::{bf16, f16};
use rivet_runtime::{DType, Tensor};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

mod gpu;
#[cfg(test)]
mod tests_allreduce;
#[cfg(test)]
pub(crate) mod tests_cache;
#[cfg(test)]
mod tests_gpu;

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

/// A scalar value as the interpreter holds it (see the module documentation): integers and
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

// ---- the machine ----------------------------------------------------------------------------

/// The run-time state of one buffer.
struct BufState {
    name: String,
    dtype: DType,
    /// Element 0; null while a local is not allocated.
    ptr: *mut u8,
    /// Extents and strides in elements (evaluated at launch or at `Allocate`).
    shape: Vec<i64>,
    strides: Vec<i64>,
    /// The element offsets the shape and strides reach lie in `[lo, hi]` (empty if lo > hi).
    lo: i64,
    hi: i64,
    /// Parameters always; locals inside their `Allocate`.
    live: bool,
    /// A local's memory while it is allocated.
    storage: Option<Vec<u8>>,
}

impl Default for BufState {
    fn default() -> BufState {
        BufState {
            name: String::new(),
            dtype: DType::U8,
            ptr: std::ptr::null_mut(),
            shape: Vec::new(),
            strides: Vec::new(),
            lo: 0,
            hi: -1,
            live: false,
            storage: None,
        }
    }
}

impl BufState {
    /// Sets `[lo, hi]` from `shape` and `strides`: the smallest and largest offset
    /// `sum(i_k * stride_k)` with `0 <= i_k < shape_k`; empty when an extent is 0.
    fn set_span(&mut self) {
        let (mut lo, mut hi) = (0i128, 0i128);
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            if n <= 0 {
                (self.lo, self.hi) = (0, -1);
                return;
            }
            let far = (n as i128 - 1) * s as i128;
            lo += far.min(0);
            hi += far.max(0);
        }
        let clamp = |x: i128| x.clamp(i64::MIN as i128, i64::MAX as i128) as i64;
        (self.lo, self.hi) = (clamp(lo), clamp(hi));
    }
}

struct Machine<'a> {
    /// Function name, for messages.
    name: &'a str,
    /// The function's buffer declarations (empty for `eval_expr`).
    decls: &'a [Buffer],
    /// The function's outlined bodies (`Launch` runs them in place).
    kernels: &'a [DeviceFunc],
    /// The function's host callbacks (`Intrin::Callback`).
    callbacks: &'a [crate::ir::callback::Callback],
    flattened: bool,
    checked: bool,
    /// Values of the variables in scope.
    env: IdMap<i64>,
    /// Run-time buffer states, and their positions by buffer id.
    bufs: Vec<BufState>,
    index: IdMap<usize>,
    /// The state of the GPU kernel being run, if any (`gpu.rs`).
    gpu: Option<Box<gpu::Block>>,
    /// The lane being evaluated, inside a vector store (vector IR runs lane by lane: lane `l`
    /// of every node is the scalar meaning of the node with `ramp(b, s, n)` read as
    /// `b + s * l` and `broadcast(x, n)` as `x`).
    lane: Option<u32>,
}

impl<'a> Machine<'a> {
    fn new(
        name: &'a str,
        decls: &'a [Buffer],
        kernels: &'a [DeviceFunc],
        flattened: bool,
    ) -> Machine<'a> {
        Machine {
            name,
            decls,
            kernels,
            callbacks: &[],
            flattened,
            checked: false,
            env: IdMap::default(),
            bufs: Vec::new(),
            index: IdMap::default(),
            gpu: None,
            lane: None,
        }
    }

    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::Internal(format!("IR interpreter, function `{}`: {msg}", self.name))
    }

    fn var(&self, v: &Var) -> Result<i64> {
        self.env
            .get(&v.id)
            .copied()
            .ok_or_else(|| self.err(format!("unbound variable `{}` (id {})", v.name, v.id)))
    }

    /// Evaluates an expression that must be an integer (index, bound, shape, Let value).
    fn int(&mut self, e: &Expr) -> Result<i64> {
        match self.eval(e)? {
            Value::Int(v) => Ok(v),
            other => Err(self.err(format!(
                "`{e}` should be an integer, evaluated to {other:?}"
            ))),
        }
    }

    fn buf_pos(&self, id: u32) -> Result<usize> {
        self.index
            .get(&id)
            .copied()
            .ok_or_else(|| self.err(format!("access to unknown buffer id {id}")))
    }

    /// The checked element offset of an access to buffer `pos` with `indices`.
    fn offset(&mut self, pos: usize, indices: &[Expr], what: &str) -> Result<i64> {
        if !self.bufs[pos].live {
            return Err(self.err(format!(
                "{what} of `{}` which is not allocated here",
                self.bufs[pos].name
            )));
        }
        let off = if self.flattened {
            if indices.len() != 1 {
                return Err(self.err(format!(
                    "{what} of `{}` with {} indices in flattened IR",
                    self.bufs[pos].name,
                    indices.len()
                )));
            }
            self.int(&indices[0])?
        } else {
            if indices.len() != self.bufs[pos].shape.len() {
                return Err(self.err(format!(
                    "{what} of `{}` with {} indices",
                    self.bufs[pos].name,
                    indices.len()
                )));
            }
            let mut off = 0i64;
            for (k, e) in indices.iter().enumerate() {
                let i = self.int(e)?;
                let b = &self.bufs[pos];
                if (i < 0 || i >= b.shape[k]) && self.checked {
                    return Err(Error::Runtime(rivet_runtime::Error::Index(format!(
                        "{}: checked mode caught an out-of-bounds access: tensor '{}' dim {k}: index {i} is outside [0, {})",
                        self.name, b.name, b.shape[k]
                    ))));
                }
                if i < 0 || i >= b.shape[k] {
                    return Err(self.err(format!(
                        "out-of-bounds {what} of `{}`: index {k} is `{e}` = {i}, extent {}",
                        b.name, b.shape[k]
                    )));
                }
                off = off.wrapping_add(i.wrapping_mul(b.strides[k]));
            }
            off
        };
        let b = &self.bufs[pos];
        if off < b.lo || off > b.hi {
            let valid = if b.lo > b.hi {
                "none: the buffer is empty".to_string()
            } else {
                format!("{}..={}", b.lo, b.hi)
            };
            let idx: Vec<String> = indices.iter().map(|e| e.to_string()).collect();
            return Err(self.err(format!(
                "out-of-bounds {what} of `{}` at element offset {off} (valid offsets {valid}); index [{}]",
                b.name,
                idx.join(", ")
            )));
        }
        if self.gpu.is_some() {
            self.record_access(pos, off, what == "store")?;
        }
        Ok(off)
    }

    fn eval(&mut self, e: &Expr) -> Result<Value> {
        let dt = e.dtype();
        match e.kind() {
            ExprKind::Const(c) => Ok(constant(*c, dt)),
            ExprKind::Var(v) => Ok(Value::Int(self.var(v)?)),
            ExprKind::Unary(op, a) => {
                let x = self.eval(a)?;
                unary(*op, dt, x)
                    .ok_or_else(|| self.err(format!("unary {op:?} on {x:?} typed {dt} in `{e}`")))
            }
            ExprKind::Binary(op, a, b) => {
                let x = self.eval(a)?;
                let y = self.eval(b)?;
                binary(*op, dt, x, y).ok_or_else(|| {
                    self.err(format!(
                        "binary {op:?} of {x:?} and {y:?} typed {dt} in `{e}`"
                    ))
                })
            }
            ExprKind::Cmp(op, a, b) => {
                let x = self.eval(a)?;
                let y = self.eval(b)?;
                let r = compare(*op, a.dtype(), x, y).ok_or_else(|| {
                    self.err(format!("comparison {op:?} of {x:?} and {y:?} in `{e}`"))
                })?;
                Ok(Value::Int(r as i64))
            }
            ExprKind::Logic(op, a, b) => {
                let x = self.truth(a)?;
                let r = match op {
                    LogicOp::And => x && self.truth(b)?,
                    LogicOp::Or => x || self.truth(b)?,
                };
                Ok(Value::Int(r as i64))
            }
            ExprKind::Cast(a) => {
                let x = self.eval(a)?;
                Ok(cast(a.dtype(), dt, x))
            }
            ExprKind::Fma(a, b, c) => {
                let (x, y, z) = (self.eval(a)?, self.eval(b)?, self.eval(c)?);
                // One rounding, in the value type (float16/bfloat16 are f32 here, like the
                // rest of their arithmetic; the `Store` or `Cast` rounds them once more).
                match (x, y, z) {
                    (Value::F32(x), Value::F32(y), Value::F32(z)) if dt != DType::F64 => {
                        Ok(Value::F32(x.mul_add(y, z)))
                    }
                    (Value::F64(x), Value::F64(y), Value::F64(z)) if dt == DType::F64 => {
                        Ok(Value::F64(x.mul_add(y, z)))
                    }
                    _ => {
                        Err(self.err(format!("fma of {x:?}, {y:?} and {z:?} typed {dt} in `{e}`")))
                    }
                }
            }
            ExprKind::Select(c, a, b) => {
                if self.truth(c)? {
                    self.eval(a)
                } else {
                    self.eval(b)
                }
            }
            ExprKind::Read { .. } | ExprKind::Reduce { .. } | ExprKind::Invalid(_) => {
                Err(self.err(format!("te-only node in loop IR: `{e}`")))
            }
            ExprKind::Ramp {
                base,
                stride,
                lanes,
            } => {
                let l = match self.lane {
                    Some(l) if l < *lanes => l,
                    _ => {
                        return Err(self.err(format!(
                            "vector `{e}` evaluated outside a vector store of {lanes} lanes"
                        )))
                    }
                };
                let (b, s) = (self.int(base)?, self.int(stride)?);
                Ok(Value::Int(b.wrapping_add(s.wrapping_mul(i64::from(l)))))
            }
            ExprKind::Broadcast { value, .. } => self.eval(value),
            ExprKind::Load { buf, indices } => {
                let pos = self.buf_pos(buf.0)?;
                let off = self.offset(pos, indices, "load")?;
                let b = &self.bufs[pos];
                if b.dtype != dt {
                    return Err(self.err(format!(
                        "load typed {dt} of `{}` which is {}",
                        b.name, b.dtype
                    )));
                }
                let p = b
                    .ptr
                    .wrapping_offset((off as isize).wrapping_mul(dt.size() as isize));
                // SAFETY: `off` is within the span of the buffer's elements (checked above),
                // which the launch contract (parameters) or `Allocate` (locals) makes valid.
                Ok(unsafe { read_elem(p, dt) })
            }
        }
    }

    /// Evaluates a bool expression.
    fn truth(&mut self, e: &Expr) -> Result<bool> {
        Ok(self.eval(e)? != Value::Int(0))
    }

    /// Allocates local buffer `pos` (zeroed), binds its compact strides and marks it live.
    fn alloc_begin(&mut self, pos: usize) -> Result<()> {
        let decls = self.decls;
        let (shape_e, stride_v) = (&decls[pos].shape, &decls[pos].strides);
        let shape: Vec<i64> = shape_e.iter().map(|e| self.int(e)).collect::<Result<_>>()?;
        // Compact row-major strides; the element count exact (128-bit, saturating):
        // a zero extent makes an empty buffer even when the others' product overflows
        // (strides are then never used).
        let mut strides = vec![0i64; shape.len()];
        let mut count: u128 = 1;
        for k in (0..shape.len()).rev() {
            if shape[k] < 0 {
                return Err(self.err(format!(
                    "allocate `{}` with negative extent {} (`{}`)",
                    self.bufs[pos].name, shape[k], shape_e[k]
                )));
            }
            strides[k] = i64::try_from(count).unwrap_or(i64::MAX);
            count = count.saturating_mul(shape[k] as u128);
        }
        let numel = i64::try_from(count).unwrap_or(i64::MAX);
        let size = self.bufs[pos].dtype.size();
        let too_big = || {
            Error::Runtime(rivet_runtime::Error::Memory(format!(
                "{}: temporary `{}` of {numel} elements of {} bytes could not be allocated (over rivet.MAX_ALLOC_BYTES = {}, or refused by the system)",
                self.name,
                self.bufs[pos].name,
                size,
                crate::ir::limits::MAX_ALLOC_BYTES
            )))
        };
        let bytes = usize::try_from(numel)
            .ok()
            .and_then(|n| n.checked_mul(size))
            .filter(|&b| b <= crate::ir::limits::MAX_ALLOC_BYTES)
            .ok_or_else(too_big)?;
        // Fallible: a refused allocation is an error, never an abort.
        let mut storage: Vec<u8> = Vec::new();
        storage
            .try_reserve_exact(bytes.max(1))
            .map_err(|_| too_big())?;
        // A local `lower::overwrite` marked (stored in full before any read) gets a poison
        // pattern instead of zeros (all bits set: NaN for floats, float16 and bfloat16 too;
        // -1 or the maximum for ints). The compiled code does not zero it, so a wrong mark
        // must show here, in the oracle, as a wrong result.
        let fill = if decls[pos].overwritten { 0xFF } else { 0 };
        storage.resize(bytes.max(1), fill);
        for (v, s) in stride_v.iter().zip(&strides) {
            self.env.insert(v.id, *s);
        }
        let b = &mut self.bufs[pos];
        b.ptr = storage.as_mut_ptr();
        b.storage = Some(storage);
        b.shape = shape;
        b.strides = strides;
        b.set_span();
        b.live = true;
        Ok(())
    }

    /// Frees local buffer `pos` and unbinds its strides.
    /// `alloc_begin` of each of `bufs` in order; their positions. When one fails, those begun
    /// are ended again and the error returned.
    fn alloc_all(&mut self, bufs: &[crate::ir::BufId]) -> Result<Vec<usize>> {
        let mut begun = Vec::with_capacity(bufs.len());
        for b in bufs {
            match self
                .buf_pos(b.0)
                .and_then(|pos| self.alloc_begin(pos).map(|_| pos))
            {
                Ok(pos) => begun.push(pos),
                Err(e) => {
                    for &pos in begun.iter().rev() {
                        self.alloc_end(pos);
                    }
                    return Err(e);
                }
            }
        }
        Ok(begun)
    }

    fn alloc_end(&mut self, pos: usize) {
        let b = &mut self.bufs[pos];
        b.ptr = std::ptr::null_mut();
        b.storage = None;
        b.live = false;
        (b.lo, b.hi) = (0, -1);
        for v in &self.decls[pos].strides {
            self.env.remove(&v.id);
        }
    }

    /// A region's base element offset and the element strides of its axes, checked: in
    /// unflattened IR each dim's base and last index against the extent (checked mode: the
    /// user's `IndexError`), always the first and last element against the buffer's span.
    fn region(&mut self, r: &Region, extents: &[i64]) -> Result<(usize, i64, Vec<i64>)> {
        let pos = self.buf_pos(r.buf.0)?;
        let base = self.offset(pos, &r.base, "intrinsic region")?;
        let b = &self.bufs[pos];
        let steps: Vec<i64> = r.axes.iter().map(|a| b.strides[a.dim as usize]).collect();
        if extents.iter().any(|&e| e <= 0) {
            return Ok((pos, base, steps));
        }
        if !self.flattened {
            for (a, &e) in r.axes.iter().zip(extents) {
                let d = a.dim as usize;
                let first = self.int(&r.base[d])?;
                let b = &self.bufs[pos];
                let last = first + (e - 1);
                if last >= b.shape[d] {
                    let msg = format!(
                        "{}: the intrinsic region of tensor '{}' dim {d} reaches index {last}, outside [0, {})",
                        self.name, b.name, b.shape[d]
                    );
                    return Err(if self.checked {
                        Error::Runtime(rivet_runtime::Error::Index(msg))
                    } else {
                        self.err(msg)
                    });
                }
            }
        }
        let b = &self.bufs[pos];
        let (mut lo, mut hi) = (base as i128, base as i128);
        for (&s, &e) in steps.iter().zip(extents) {
            let far = s as i128 * (e as i128 - 1);
            lo += far.min(0);
            hi += far.max(0);
        }
        if lo < b.lo as i128 || hi > b.hi as i128 {
            return Err(self.err(format!(
                "intrinsic region of `{}` spans element offsets {lo}..={hi}, outside {}..={}",
                b.name, b.lo, b.hi
            )));
        }
        Ok((pos, base, steps))
    }

    /// Runs an intrinsic's reference: its exact definition (`ir::intrin`), the fused
    /// multiply-adds in the order every micro-kernel uses, so results agree bit for bit.
    ///
    /// # Safety
    /// As `exec`.
    unsafe fn call(&mut self, intrin: Intrin, regions: &[Region]) -> Result<()> {
        match intrin {
            Intrin::Callback(k) => {
                let cb = self
                    .callbacks
                    .get(k as usize)
                    .ok_or_else(|| self.err(format!("callback {k} is not in the table")))?;
                let mut args = Vec::with_capacity(regions.len());
                for r in regions {
                    let shape = r
                        .axes
                        .iter()
                        .map(|a| self.int(&a.extent))
                        .collect::<Result<Vec<i64>>>()?;
                    if shape.iter().any(|&e| e <= 0) {
                        // No element: nothing to address (an empty buffer has no element 0).
                        let pos = self.buf_pos(r.buf.0)?;
                        args.push(crate::codegen::cpu_lib::callback::RegionArg {
                            ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                            shape: shape.iter().map(|&e| e.max(0)).collect(),
                            strides: vec![0; shape.len()],
                            dtype: self.bufs[pos].dtype,
                        });
                        continue;
                    }
                    // Checked against the buffer's span, like any intrinsic region.
                    let (pos, base, steps) = self.region(r, &shape)?;
                    let b = &self.bufs[pos];
                    args.push(crate::codegen::cpu_lib::callback::RegionArg {
                        ptr: b
                            .ptr
                            .wrapping_offset((base as isize).wrapping_mul(b.dtype.size() as isize)),
                        shape: shape.iter().map(|&e| e.max(0)).collect(),
                        strides: steps,
                        dtype: b.dtype,
                    });
                }
                // SAFETY: every region was checked inside its buffer above; the output is a
                // buffer of its own (`check_call`).
                unsafe { crate::codegen::cpu_lib::callback::run(cb, &args) }.map_err(Error::Runtime)
            }
            Intrin::GemmUpdate => {
                if regions.len() != 3 {
                    return Err(self.err("gemm_update takes 3 regions"));
                }
                let (m, n, k) = gemm_extents(regions);
                let (m, n, k) = (self.int(&m)?, self.int(&n)?, self.int(&k)?);
                let (cp, c0, cs) = self.region(&regions[0], &[m, n])?;
                let (ap, a0, as_) = self.region(&regions[1], &[k, m])?;
                let (bp, b0, bs) = self.region(&regions[2], &[k, n])?;
                let dt = self.bufs[cp].dtype;
                let at = |m: &Machine, pos: usize, off: i64| {
                    let b = &m.bufs[pos];
                    b.ptr
                        .wrapping_offset((off as isize).wrapping_mul(b.dtype.size() as isize))
                };
                for i in 0..m.max(0) {
                    for j in 0..n.max(0) {
                        let pc = at(self, cp, c0 + i * cs[0] + j * cs[1]);
                        // SAFETY: inside the C region checked above.
                        let mut acc = unsafe { read_elem(pc, dt) };
                        for p in 0..k.max(0) {
                            let pa = at(self, ap, a0 + p * as_[0] + i * as_[1]);
                            let pb = at(self, bp, b0 + p * bs[0] + j * bs[1]);
                            // SAFETY: inside the A and B regions checked above.
                            let (x, y) = unsafe { (read_elem(pa, dt), read_elem(pb, dt)) };
                            acc = match (x, y, acc) {
                                (Value::F32(x), Value::F32(y), Value::F32(c)) => {
                                    Value::F32(x.mul_add(y, c))
                                }
                                (Value::F64(x), Value::F64(y), Value::F64(c)) => {
                                    Value::F64(x.mul_add(y, c))
                                }
                                _ => return Err(self.err(format!("gemm_update of {dt}"))),
                            };
                        }
                        // SAFETY: inside the C region checked above.
                        unsafe { write_elem(pc, dt, acc) };
                    }
                }
                Ok(())
            }
        }
    }

    /// # Safety
    /// Parameter buffers' pointers, shapes and strides in `self.bufs` must be valid.
    unsafe fn exec(&mut self, s: &Stmt) -> Result<()> {
        match s {
            // The outermost bound loop of a nest starts a kernel.
            Stmt::For {
                kind: ForKind::Thread(_),
                ..
            } => {
                // SAFETY: forwarded.
                unsafe { self.run_kernel(s) }
            }
            Stmt::Barrier => Err(self.err("barrier outside a kernel")),
            Stmt::Call {
                intrin, regions, ..
            } => {
                // SAFETY: forwarded; every element is checked against its buffer's span.
                unsafe { self.call(*intrin, regions) }
            }
            Stmt::AllReduce { .. } => Err(self.err("a cross-thread reduction outside a kernel")),
            // An outlined body runs in place (its captures are the variables bound here).
            Stmt::Launch { kernel } => {
                let kernels = self.kernels;
                let k = kernels
                    .get(*kernel)
                    .ok_or_else(|| self.err(format!("launch of unknown kernel {kernel}")))?;
                // SAFETY: forwarded.
                unsafe { self.exec(&k.body) }
            }
            Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } => {
                let lo = self.int(min)?;
                let n = self.int(extent)?;
                for i in 0..n.max(0) {
                    self.env.insert(var.id, lo.wrapping_add(i));
                    // SAFETY: forwarded.
                    unsafe { self.exec(body)? };
                }
                self.env.remove(&var.id);
                Ok(())
            }
            Stmt::Store {
                buf,
                indices,
                value,
            } if value.is_vector() => {
                // Every lane's value and offset first, then the writes, in lane order.
                let pos = self.buf_pos(buf.0)?;
                let mut lanes = Vec::with_capacity(value.lanes() as usize);
                for l in 0..value.lanes() {
                    self.lane = Some(l);
                    let r = self
                        .eval(value)
                        .and_then(|v| Ok((v, self.offset(pos, indices, "store")?)));
                    self.lane = None;
                    lanes.push(r?);
                }
                let b = &self.bufs[pos];
                if b.dtype != value.dtype() {
                    return Err(self.err(format!(
                        "store of a {} value into `{}` which is {}",
                        value.dtype(),
                        b.name,
                        b.dtype
                    )));
                }
                for (v, off) in lanes {
                    let p = b
                        .ptr
                        .wrapping_offset((off as isize).wrapping_mul(b.dtype.size() as isize));
                    // SAFETY: as for scalar stores: `off` is within the buffer's span.
                    if !unsafe { write_elem(p, b.dtype, v) } {
                        return Err(self.err(format!(
                            "store of {v:?} into `{}` which is {}",
                            b.name, b.dtype
                        )));
                    }
                }
                Ok(())
            }
            Stmt::Store {
                buf,
                indices,
                value,
            } => {
                let v = self.eval(value)?;
                let pos = self.buf_pos(buf.0)?;
                let off = self.offset(pos, indices, "store")?;
                let b = &self.bufs[pos];
                if b.dtype != value.dtype() {
                    return Err(self.err(format!(
                        "store of a {} value into `{}` which is {}",
                        value.dtype(),
                        b.name,
                        b.dtype
                    )));
                }
                let p = b
                    .ptr
                    .wrapping_offset((off as isize).wrapping_mul(b.dtype.size() as isize));
                // SAFETY: as for loads: `off` is within the buffer's span.
                if !unsafe { write_elem(p, b.dtype, v) } {
                    return Err(self.err(format!(
                        "store of {v:?} into `{}` which is {}",
                        b.name, b.dtype
                    )));
                }
                Ok(())
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                if self.truth(cond)? {
                    // SAFETY: forwarded.
                    unsafe { self.exec(then) }
                } else if let Some(o) = otherwise {
                    // SAFETY: forwarded.
                    unsafe { self.exec(o) }
                } else {
                    Ok(())
                }
            }
            Stmt::Let { var, value, body } => {
                let v = self.int(value)?;
                self.env.insert(var.id, v);
                // SAFETY: forwarded.
                unsafe { self.exec(body)? };
                self.env.remove(&var.id);
                Ok(())
            }
            Stmt::Allocate { bufs, body } => {
                let begun = self.alloc_all(bufs)?;
                // SAFETY: forwarded; the locals' memory lives until `alloc_end`.
                let r = unsafe { self.exec(body) };
                for &pos in begun.iter().rev() {
                    self.alloc_end(pos);
                }
                r
            }
            Stmt::Seq(v) => {
                for s in v {
                    // SAFETY: forwarded.
                    unsafe { self.exec(s)? };
                }
                Ok(())
            }
        }
    }
}

// ---- memory ---------------------------------------------------------------------------------

/// Reads one element of dtype `dt` at `p` (unaligned).
///
/// # Safety
/// `p` must be valid for reads of `dt.size()` bytes.
unsafe fn read_elem(p: *const u8, dt: DType) -> Value {
    // SAFETY: the caller guarantees `dt.size()` readable bytes at `p`; reads are unaligned.
    unsafe {
        match dt {
            DType::Bool => Value::Int((p.read() != 0) as i64),
            DType::I8 => Value::Int(p.cast::<i8>().read() as i64),
            DType::I16 => Value::Int(p.cast::<i16>().read_unaligned() as i64),
            DType::I32 => Value::Int(p.cast::<i32>().read_unaligned() as i64),
            DType::I64 => Value::Int(p.cast::<i64>().read_unaligned()),
            DType::U8 => Value::Int(p.read() as i64),
            DType::U16 => Value::Int(p.cast::<u16>().read_unaligned() as i64),
            DType::U32 => Value::Int(p.cast::<u32>().read_unaligned() as i64),
            DType::U64 => Value::Int(p.cast::<u64>().read_unaligned() as i64),
            DType::F16 => Value::F32(f16::from_bits(p.cast::<u16>().read_unaligned()).to_f32()),
            DType::BF16 => Value::F32(bf16::from_bits(p.cast::<u16>().read_unaligned()).to_f32()),
            DType::F32 => Value::F32(p.cast::<f32>().read_unaligned()),
            DType::F64 => Value::F64(p.cast::<f64>().read_unaligned()),
        }
    }
}

/// Writes `v` as one element of dtype `dt` at `p` (unaligned), rounding float16/bfloat16.
/// False when the value's kind does not fit the dtype (nothing is written).
///
/// # Safety
/// `p` must be valid for writes of `dt.size()` bytes.
unsafe fn write_elem(p: *mut u8, dt: DType, v: Value) -> bool {
    // SAFETY: the caller guarantees `dt.size()` writable bytes at `p`; writes are unaligned.
    unsafe {
        match (dt, v) {
            (DType::Bool, Value::Int(x)) => p.write((x != 0) as u8),
            (DType::I8 | DType::U8, Value::Int(x)) => p.write(x as u8),
            (DType::I16 | DType::U16, Value::Int(x)) => p.cast::<u16>().write_unaligned(x as u16),
            (DType::I32 | DType::U32, Value::Int(x)) => p.cast::<u32>().write_unaligned(x as u32),
            (DType::I64 | DType::U64, Value::Int(x)) => p.cast::<i64>().write_unaligned(x),
            (DType::F16, Value::F32(x)) => {
                p.cast::<u16>().write_unaligned(f16::from_f32(x).to_bits())
            }
            (DType::BF16, Value::F32(x)) => {
                p.cast::<u16>().write_unaligned(bf16::from_f32(x).to_bits())
            }
            (DType::F32, Value::F32(x)) => p.cast::<f32>().write_unaligned(x),
            (DType::F64, Value::F64(x)) => p.cast::<f64>().write_unaligned(x),
            _ => return false,
        }
    }
    true
}

// ---- scalar semantics -----------------------------------------------------------------------

/// Normalises an integer result to dtype `dt` (see the module documentation).
fn wrap(v: i64, dt: DType) -> i64 {
    match dt {
        DType::Bool => (v != 0) as i64,
        DType::I8 => v as i8 as i64,
        DType::I16 => v as i16 as i64,
        DType::I32 => v as i32 as i64,
        DType::U8 => v as u8 as i64,
        DType::U16 => v as u16 as i64,
        DType::U32 => v as u32 as i64,
        DType::I64 | DType::U64 => v,
        // Not an integer dtype: callers never get here (floats are not `Value::Int`).
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => v,
    }
}

/// A constant of dtype `dt`: an integer constant is converted as by a cast from int64, a
/// float one as by a cast from float64 (so a float16 constant is rounded to float16).
fn constant(c: Const, dt: DType) -> Value {
    match c {
        Const::Int(v) => cast(DType::I64, dt, Value::Int(v)),
        Const::Float(v) => cast(DType::F64, dt, Value::F64(v)),
    }
}

/// A float (f64-exact) converted to integer dtype `to`, saturating (Rust `as`).
fn float_to_int(x: f64, to: DType) -> i64 {
    match to {
        DType::Bool => (x != 0.0) as i64,
        DType::I8 => x as i8 as i64,
        DType::I16 => x as i16 as i64,
        DType::I32 => x as i32 as i64,
        DType::I64 => x as i64,
        DType::U8 => x as u8 as i64,
        DType::U16 => x as u16 as i64,
        DType::U32 => x as u32 as i64,
        DType::U64 => x as u64 as i64,
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => unreachable!("float_to_int to {to}"),
    }
}

/// Rounds an f32 to a float dtype computed in f32 (float16/bfloat16), or keeps it (float32).
fn round_f32(x: f32, to: DType) -> f32 {
    match to {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// `Cast` from `from` to `to` (see the module documentation).
fn cast(from: DType, to: DType, x: Value) -> Value {
    match x {
        Value::Int(v) => match to {
            DType::F64 => Value::F64(if from == DType::U64 {
                v as u64 as f64
            } else {
                v as f64
            }),
            DType::F32 | DType::F16 | DType::BF16 => {
                let f = if from == DType::U64 {
                    v as u64 as f32
                } else {
                    v as f32
                };
                Value::F32(round_f32(f, to))
            }
            _ => Value::Int(wrap(v, to)),
        },
        Value::F32(f) => match to {
            DType::F64 => Value::F64(f as f64),
            DType::F32 | DType::F16 | DType::BF16 => Value::F32(round_f32(f, to)),
            _ => Value::Int(float_to_int(f as f64, to)),
        },
        Value::F64(f) => match to {
            DType::F64 => Value::F64(f),
            DType::F32 => Value::F32(f as f32),
            DType::F16 => Value::F32(f16::from_f32(f as f32).to_f32()),
            DType::BF16 => Value::F32(bf16::from_f64(f).to_f32()),
            _ => Value::Int(float_to_int(f, to)),
        },
    }
}

fn unary(op: UnOp, dt: DType, x: Value) -> Option<Value> {
    Some(match x {
        Value::Int(a) => {
            let unsigned = matches!(dt, DType::U8 | DType::U16 | DType::U32 | DType::U64);
            Value::Int(match op {
                UnOp::Neg => wrap(a.wrapping_neg(), dt),
                UnOp::Abs if unsigned => a,
                UnOp::Abs => wrap(a.wrapping_abs(), dt),
                UnOp::Not => (a == 0) as i64,
                _ => return None,
            })
        }
        Value::F32(a) => Value::F32(match op {
            UnOp::Neg => -a,
            UnOp::Exp => crate::codegen::cpu_lib::exp32::exp32(a),
            UnOp::Log => libm::logf(a),
            UnOp::Sqrt => a.sqrt(),
            UnOp::Rsqrt => 1.0 / a.sqrt(),
            UnOp::Tanh => libm::tanhf(a),
            UnOp::Sigmoid => 1.0 / (1.0 + crate::codegen::cpu_lib::exp32::exp32(-a)),
            UnOp::Abs => a.abs(),
            UnOp::Floor => a.floor(),
            UnOp::Ceil => a.ceil(),
            UnOp::Erf => libm::erff(a),
            UnOp::Not => return None,
        }),
        Value::F64(a) => Value::F64(match op {
            UnOp::Neg => -a,
            UnOp::Exp => libm::exp(a),
            UnOp::Log => libm::log(a),
            UnOp::Sqrt => a.sqrt(),
            UnOp::Rsqrt => 1.0 / a.sqrt(),
            UnOp::Tanh => libm::tanh(a),
            UnOp::Sigmoid => 1.0 / (1.0 + libm::exp(-a)),
            UnOp::Abs => a.abs(),
            UnOp::Floor => a.floor(),
            UnOp::Ceil => a.ceil(),
            UnOp::Erf => libm::erf(a),
            UnOp::Not => return None,
        }),
    })
}

fn binary(op: BinOp, dt: DType, x: Value, y: Value) -> Option<Value> {
    Some(match (x, y) {
        (Value::Int(a), Value::Int(b)) => {
            let u64_ = dt == DType::U64;
            let (ua, ub) = (a as u64, b as u64);
            let r = match op {
                BinOp::Add => a.wrapping_add(b),
                BinOp::Sub => a.wrapping_sub(b),
                BinOp::Mul => a.wrapping_mul(b),
                // uint64 needs unsigned division; narrower unsigned values are non-negative,
                // where floor and truncating division agree.
                BinOp::FloorDiv if u64_ => ua.checked_div(ub).unwrap_or(0) as i64,
                BinOp::FloorMod if u64_ => ua.checked_rem(ub).unwrap_or(0) as i64,
                BinOp::FloorDiv => math::floordiv_i64(a, b),
                BinOp::FloorMod => math::floormod_i64(a, b),
                BinOp::Min if u64_ => ua.min(ub) as i64,
                BinOp::Max if u64_ => ua.max(ub) as i64,
                BinOp::Min => a.min(b),
                BinOp::Max => a.max(b),
                BinOp::Div | BinOp::Pow => return None,
            };
            Value::Int(wrap(r, dt))
        }
        (Value::F32(a), Value::F32(b)) => Value::F32(match op {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
            BinOp::Div => a / b,
            BinOp::FloorDiv => math::floordiv_f32(a, b),
            BinOp::FloorMod => math::floormod_f32(a, b),
            BinOp::Min => math::fmin(a, b),
            BinOp::Max => math::fmax(a, b),
            BinOp::Pow => libm::powf(a, b),
        }),
        (Value::F64(a), Value::F64(b)) => Value::F64(match op {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
            BinOp::Div => a / b,
            BinOp::FloorDiv => math::floordiv_f64(a, b),
            BinOp::FloorMod => math::floormod_f64(a, b),
            BinOp::Min => math::fmin(a, b),
            BinOp::Max => math::fmax(a, b),
            BinOp::Pow => libm::pow(a, b),
        }),
        _ => return None,
    })
}

/// A comparison of two values of dtype `dt` (IEEE for floats, unsigned for uint64).
fn compare(op: CmpOp, dt: DType, x: Value, y: Value) -> Option<bool> {
    fn apply<T: PartialOrd>(op: CmpOp, a: T, b: T) -> bool {
        match op {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
        }
    }
    Some(match (x, y) {
        (Value::Int(a), Value::Int(b)) if dt == DType::U64 => apply(op, a as u64, b as u64),
        (Value::Int(a), Value::Int(b)) => apply(op, a, b),
        (Value::F32(a), Value::F32(b)) => apply(op, a, b),
        (Value::F64(a), Value::F64(b)) => apply(op, a, b),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BufKind, Check, ForKind};

    // ---- builders ----

    use crate::ir::test_util::{buffer, input, output};
    fn func(
        name: &str,
        params: &[&Buffer],
        locals: &[&Buffer],
        dims: &[&Var],
        body: Stmt,
    ) -> PrimFunc {
        let buffers = params.iter().chain(locals).map(|b| (*b).clone()).collect();
        crate::ir::test_util::func(
            name,
            buffers,
            dims.iter().map(|v| (*v).clone()).collect(),
            body,
        )
    }
    /// The flattened offset `sum(idx_k * stride_k)` of buffer `b`.
    fn at(b: &Buffer, idx: &[&Var]) -> Expr {
        idx.iter()
            .zip(&b.strides)
            .map(|(i, s)| Expr::var(i).mul(&Expr::var(s)))
            .reduce(|x, y| x.add(&y))
            .unwrap_or_else(|| Expr::int(0))
    }
    fn ld(b: &Buffer, idx: &[&Var]) -> Expr {
        Expr::load(b.id, vec![at(b, idx)], b.dtype)
    }
    fn st(b: &Buffer, idx: &[&Var], value: Expr) -> Stmt {
        Stmt::Store {
            buf: b.id,
            indices: vec![at(b, idx)],
            value,
        }
    }
    fn for_(v: &Var, extent: Expr, body: Stmt) -> Stmt {
        Stmt::For {
            var: v.clone(),
            min: Expr::int(0),
            extent,
            kind: ForKind::Serial,
            body: Box::new(body),
        }
    }
    fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::binary(op, a, b).unwrap()
    }
    fn call(f: &PrimFunc, ptrs: Vec<*mut u8>, ints: Vec<i64>) -> Result<()> {
        // SAFETY: every test passes pointers into live Vecs laid out as the frame says.
        unsafe {
            run(
                f,
                &CallFrame {
                    ptrs: ptrs.into(),
                    ints: ints.into(),
                },
            )
        }
    }
    fn p<T>(v: &mut [T]) -> *mut u8 {
        v.as_mut_ptr().cast()
    }
    fn none(_: &Var) -> Option<i64> {
        None
    }
    fn ev(e: &Expr) -> Value {
        eval_expr(e, &none).unwrap()
    }

    // ---- programs ----

    /// `C[i] = A[i] + B[i]` over `n`, each operand with its own stride.
    #[test]
    fn add_1d_strided() {
        let n = Var::new("n");
        let i = Var::new("i");
        let sh = vec![Expr::var(&n)];
        let (a, b, c) = (
            input(0, "A", DType::F32, sh.clone()),
            input(1, "B", DType::F32, sh.clone()),
            output(2, "C", DType::F32, sh),
        );
        let body = for_(
            &i,
            Expr::var(&n),
            st(&c, &[&i], bin(BinOp::Add, ld(&a, &[&i]), ld(&b, &[&i]))),
        );
        let f = func("add1d", &[&a, &b, &c], &[], &[&n], body);
        // A: stride 2 over 8 floats; B: stride -1 (element 0 is the last float); C compact.
        let mut av: Vec<f32> = (0..8).map(|x| x as f32).collect();
        let mut bv = vec![100.0f32, 200.0, 300.0, 400.0];
        let mut cv = vec![-1.0f32; 4];
        let bptr = p(&mut bv).wrapping_add(3 * 4);
        call(&f, vec![p(&mut av), bptr, p(&mut cv)], vec![4, 2, -1, 1]).unwrap();
        assert_eq!(cv, vec![400.0, 302.0, 204.0, 106.0]);

        // The same through the backend interface.
        let k = InterpBackend::default().compile(&f).unwrap();
        assert_eq!(InterpBackend::default().target().to_string(), "interp");
        assert!(k.source().starts_with("func add1d("), "{}", k.source());
        let mut cv2 = vec![0.0f32; 4];
        // SAFETY: as above.
        unsafe {
            k.launch(
                &CallFrame {
                    ptrs: vec![p(&mut av), bptr, p(&mut cv2)].into(),
                    ints: vec![4, 2, -1, 1].into(),
                },
                &LaunchContext::host(),
            )
        }
        .unwrap();
        assert_eq!(cv2, cv);
    }

    /// `C[i, j] = A[i, j] * B[i, j]` with A transposed in memory and C row-major.
    #[test]
    fn mul_2d_strided() {
        let (m, n) = (Var::new("m"), Var::new("n"));
        let (i, j) = (Var::new("i"), Var::new("j"));
        let sh = vec![Expr::var(&m), Expr::var(&n)];
        let (a, b, c) = (
            input(0, "A", DType::I32, sh.clone()),
            input(1, "B", DType::I32, sh.clone()),
            output(2, "C", DType::I32, sh),
        );
        let body = for_(
            &i,
            Expr::var(&m),
            for_(
                &j,
                Expr::var(&n),
                st(
                    &c,
                    &[&i, &j],
                    bin(BinOp::Mul, ld(&a, &[&i, &j]), ld(&b, &[&i, &j])),
                ),
            ),
        );
        let f = func("mul2d", &[&a, &b, &c], &[], &[&m, &n], body);
        let (mm, nn) = (2usize, 3usize);
        // A[i, j] = 10 i + j stored column-major; B[i, j] = j + 1 row-major.
        let mut av = vec![0i32; mm * nn];
        let mut bv = vec![0i32; mm * nn];
        for ii in 0..mm {
            for jj in 0..nn {
                av[ii + jj * mm] = (10 * ii + jj) as i32;
                bv[ii * nn + jj] = jj as i32 + 1;
            }
        }
        let mut cv = vec![0i32; mm * nn];
        let ints = vec![
            mm as i64, nn as i64, 1, mm as i64, nn as i64, 1, nn as i64, 1,
        ];
        call(&f, vec![p(&mut av), p(&mut bv), p(&mut cv)], ints).unwrap();
        assert_eq!(cv, vec![0, 2, 6, 10, 22, 36]);
    }

    /// `out[i] = sum_j A[i, j]` accumulated in a zeroed local, then a transposed copy through a
    /// 2-d local whose stride variables `Allocate` binds.
    #[test]
    fn reduction_and_locals() {
        let (m, n) = (Var::new("m"), Var::new("n"));
        let (i, j) = (Var::new("i"), Var::new("j"));
        let a = input(0, "A", DType::F64, vec![Expr::var(&m), Expr::var(&n)]);
        let out = output(1, "out", DType::F64, vec![Expr::var(&m)]);
        let tr = output(2, "tr", DType::F64, vec![Expr::var(&n), Expr::var(&m)]);
        let acc = buffer(3, "acc", DType::F64, vec![Expr::int(1)], BufKind::Local);
        let tmp = buffer(
            4,
            "tmp",
            DType::F64,
            vec![Expr::var(&m), Expr::var(&n)],
            BufKind::Local,
        );
        let acc0 = Expr::load(acc.id, vec![Expr::int(0)], DType::F64);
        let sum = for_(
            &i,
            Expr::var(&m),
            Stmt::Allocate {
                bufs: vec![acc.id],
                body: Box::new(Stmt::Seq(vec![
                    for_(
                        &j,
                        Expr::var(&n),
                        Stmt::Store {
                            buf: acc.id,
                            indices: vec![Expr::int(0)],
                            value: bin(BinOp::Add, acc0.clone(), ld(&a, &[&i, &j])),
                        },
                    ),
                    st(&out, &[&i], acc0.clone()),
                ])),
            },
        );
        let copy = Stmt::Allocate {
            bufs: vec![tmp.id],
            body: Box::new(Stmt::Seq(vec![
                for_(
                    &i,
                    Expr::var(&m),
                    for_(&j, Expr::var(&n), st(&tmp, &[&i, &j], ld(&a, &[&i, &j]))),
                ),
                for_(
                    &j,
                    Expr::var(&n),
                    for_(&i, Expr::var(&m), st(&tr, &[&j, &i], ld(&tmp, &[&i, &j]))),
                ),
            ])),
        };
        let f = func(
            "rowsum",
            &[&a, &out, &tr],
            &[&acc, &tmp],
            &[&m, &n],
            Stmt::Seq(vec![sum, copy]),
        );
        let mut av: Vec<f64> = (0..6).map(|x| x as f64).collect();
        let mut ov = vec![f64::NAN; 2];
        let mut tv = vec![f64::NAN; 6];
        call(
            &f,
            vec![p(&mut av), p(&mut ov), p(&mut tv)],
            vec![2, 3, 3, 1, 1, 2, 1],
        )
        .unwrap();
        assert_eq!(ov, vec![3.0, 12.0]);
        assert_eq!(tv, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    /// Python floor semantics on negative int32 operands, zero divisors, and MIN // -1.
    #[test]
    fn floordiv_floormod_ints() {
        let i = Var::new("i");
        let (a, b) = (
            input(0, "a", DType::I32, vec![Expr::int(6)]),
            input(1, "b", DType::I32, vec![Expr::int(6)]),
        );
        let (q, r) = (
            output(2, "q", DType::I32, vec![Expr::int(6)]),
            output(3, "r", DType::I32, vec![Expr::int(6)]),
        );
        let body = for_(
            &i,
            Expr::int(6),
            Stmt::Seq(vec![
                st(
                    &q,
                    &[&i],
                    bin(BinOp::FloorDiv, ld(&a, &[&i]), ld(&b, &[&i])),
                ),
                st(
                    &r,
                    &[&i],
                    bin(BinOp::FloorMod, ld(&a, &[&i]), ld(&b, &[&i])),
                ),
            ]),
        );
        let f = func("divmod", &[&a, &b, &q, &r], &[], &[], body);
        let mut av = vec![7, -7, 7, -7, 5, i32::MIN];
        let mut bv = vec![2, 2, -2, -2, 0, -1];
        let (mut qv, mut rv) = (vec![9; 6], vec![9; 6]);
        call(
            &f,
            vec![p(&mut av), p(&mut bv), p(&mut qv), p(&mut rv)],
            vec![1, 1, 1, 1],
        )
        .unwrap();
        assert_eq!(qv, vec![3, -4, -4, 3, 0, i32::MIN]);
        assert_eq!(rv, vec![1, 1, -1, -1, 0, 0]);
        // Floats: floor division and a remainder with the divisor's sign.
        let fdiv = bin(
            BinOp::FloorDiv,
            Expr::constant(-7.0, DType::F32),
            Expr::constant(2.0, DType::F32),
        );
        let fmod = bin(
            BinOp::FloorMod,
            Expr::constant(-7.0, DType::F64),
            Expr::constant(2.0, DType::F64),
        );
        assert_eq!((ev(&fdiv), ev(&fmod)), (Value::F32(-4.0), Value::F64(1.0)));
    }

    /// float32 is computed in f32: (a + b) - a with a = 1e8, b = 1 is 0 in f32, 1 in f64.
    #[test]
    fn float32_is_not_widened() {
        let i = Var::new("i");
        for (dt, expect) in [(DType::F32, 0.0), (DType::F64, 1.0)] {
            let x = input(0, "x", dt, vec![Expr::int(2)]);
            let y = output(1, "y", dt, vec![Expr::int(1)]);
            let (a, b) = (
                Expr::load(x.id, vec![Expr::int(0)], dt),
                Expr::load(x.id, vec![Expr::int(1)], dt),
            );
            let body = for_(
                &i,
                Expr::int(1),
                st(&y, &[&i], bin(BinOp::Sub, bin(BinOp::Add, a.clone(), b), a)),
            );
            let f = func("cancel", &[&x, &y], &[], &[], body);
            if dt == DType::F32 {
                let mut xv = vec![1e8f32, 1.0];
                let mut yv = vec![9.0f32];
                call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
                assert_eq!(yv[0] as f64, expect);
            } else {
                let mut xv = vec![1e8f64, 1.0];
                let mut yv = vec![9.0f64];
                call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
                assert_eq!(yv[0], expect);
            }
        }
        let s = bin(
            BinOp::Add,
            Expr::constant(0.1, DType::F32),
            Expr::constant(0.2, DType::F32),
        );
        assert_eq!(ev(&s), Value::F32(0.1f32 + 0.2f32));
        let s = bin(
            BinOp::Add,
            Expr::constant(0.1, DType::F64),
            Expr::constant(0.2, DType::F64),
        );
        assert_eq!(ev(&s), Value::F64(0.1 + 0.2));
    }

    /// Integer arithmetic wraps at the dtype's width.
    #[test]
    fn integer_wraparound() {
        let i = Var::new("i");
        let x = input(0, "x", DType::I8, vec![Expr::int(3)]);
        let y = output(1, "y", DType::I8, vec![Expr::int(3)]);
        let body = for_(
            &i,
            Expr::int(3),
            st(
                &y,
                &[&i],
                bin(BinOp::Add, ld(&x, &[&i]), Expr::const_int(1, DType::I8)),
            ),
        );
        let f = func("inc8", &[&x, &y], &[], &[], body);
        let mut xv = vec![127i8, -1, -128];
        let mut yv = vec![0i8; 3];
        call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
        assert_eq!(yv, vec![-128, 0, -127]);

        let c = |v: i64, dt| Expr::const_int(v, dt);
        assert_eq!(
            ev(&bin(BinOp::Sub, c(0, DType::U8), c(1, DType::U8))),
            Value::Int(255)
        );
        assert_eq!(
            ev(&bin(BinOp::FloorDiv, c(-128, DType::I8), c(-1, DType::I8))),
            Value::Int(-128)
        );
        assert_eq!(
            ev(&Expr::unary(UnOp::Abs, c(-128, DType::I8)).unwrap()),
            Value::Int(-128)
        );
        assert_eq!(
            ev(&Expr::unary(UnOp::Neg, c(1, DType::U32)).unwrap()),
            Value::Int(u32::MAX as i64)
        );
        assert_eq!(
            ev(&bin(
                BinOp::Mul,
                c(1 << 20, DType::I32),
                c(1 << 12, DType::I32)
            )),
            Value::Int(0)
        );
        // uint64 is unsigned in comparisons, division, min/max and conversions.
        let big = c(-1, DType::U64); // u64::MAX
        assert_eq!(
            ev(&Expr::cmp(CmpOp::Gt, big.clone(), c(1, DType::U64)).unwrap()),
            Value::Int(1)
        );
        assert_eq!(
            ev(&bin(BinOp::FloorDiv, big.clone(), c(2, DType::U64))),
            Value::Int((u64::MAX / 2) as i64)
        );
        assert_eq!(
            ev(&bin(BinOp::Max, big.clone(), c(1, DType::U64))),
            Value::Int(-1)
        );
        assert_eq!(
            ev(&Expr::cast(DType::F64, big.clone())),
            Value::F64(u64::MAX as f64)
        );
        assert_eq!(ev(&Expr::cast(DType::U8, big)), Value::Int(255));
    }

    /// Casts: float -> int saturates, anything -> bool is `!= 0`, bool -> number is 0/1.
    #[test]
    fn casts() {
        let f = |v: f64, dt| Expr::constant(v, dt);
        assert_eq!(
            ev(&Expr::cast(DType::I8, f(300.0, DType::F32))),
            Value::Int(127)
        );
        assert_eq!(
            ev(&Expr::cast(DType::U8, f(-5.0, DType::F64))),
            Value::Int(0)
        );
        assert_eq!(
            ev(&Expr::cast(DType::I32, f(f64::NAN, DType::F64))),
            Value::Int(0)
        );
        assert_eq!(
            ev(&Expr::cast(DType::I64, f(-2.7, DType::F32))),
            Value::Int(-2)
        );
        assert_eq!(
            ev(&Expr::cast(DType::Bool, f(0.5, DType::F32))),
            Value::Int(1)
        );
        assert_eq!(
            ev(&Expr::cast(DType::Bool, Expr::const_int(256, DType::I32))),
            Value::Int(1)
        );
        assert_eq!(
            ev(&Expr::cast(DType::F32, Expr::bool(true))),
            Value::F32(1.0)
        );
        assert_eq!(
            ev(&Expr::cast(DType::I16, Expr::const_int(70000, DType::I32))),
            Value::Int(70000i32 as i16 as i64)
        );
        assert_eq!(
            ev(&Expr::cast(DType::F32, f(0.1, DType::F64))),
            Value::F32(0.1f32)
        );
    }

    /// float16/bfloat16: loaded as f32, computed in f32, rounded on store and cast.
    #[test]
    fn half_precision() {
        let i = Var::new("i");
        let x = input(0, "x", DType::F16, vec![Expr::int(3)]);
        let y = output(1, "y", DType::F16, vec![Expr::int(3)]);
        let k = Expr::constant(1000.0, DType::F16);
        // (x * 1000) / 1000: 60000 * 1000 overflows float16 but not the f32 intermediate.
        let body = for_(
            &i,
            Expr::int(3),
            st(
                &y,
                &[&i],
                bin(BinOp::Div, bin(BinOp::Mul, ld(&x, &[&i]), k.clone()), k),
            ),
        );
        let f = func("scale16", &[&x, &y], &[], &[], body);
        let mut xv: Vec<u16> = [60000.0f32, 1.0 / 3.0, -2.5]
            .iter()
            .map(|v| f16::from_f32(*v).to_bits())
            .collect();
        let mut yv = vec![0u16; 3];
        call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
        let back: Vec<f32> = yv.iter().map(|b| f16::from_bits(*b).to_f32()).collect();
        let want: Vec<f32> = xv
            .iter()
            .map(|b| f16::from_f32(f16::from_bits(*b).to_f32() * 1000.0 / 1000.0).to_f32())
            .collect();
        assert_eq!(back, want);
        assert_eq!(back[0], 60000.0);

        // Casts round to the dtype; constants are rounded to theirs.
        let third = Expr::cast(DType::F16, Expr::constant(1.0 / 3.0, DType::F32));
        assert_eq!(ev(&third), Value::F32(f16::from_f32(1.0f32 / 3.0).to_f32()));
        assert_eq!(
            ev(&Expr::constant(0.1, DType::BF16)),
            Value::F32(bf16::from_f64(0.1).to_f32())
        );
        assert_eq!(
            ev(&Expr::cast(DType::F16, Expr::constant(1e6, DType::F64))),
            Value::F32(f32::INFINITY)
        );

        // bfloat16 round trip through memory.
        let xb = input(0, "xb", DType::BF16, vec![Expr::int(2)]);
        let yb = output(1, "yb", DType::BF16, vec![Expr::int(2)]);
        let f = func(
            "copy_bf16",
            &[&xb, &yb],
            &[],
            &[],
            for_(&i, Expr::int(2), st(&yb, &[&i], ld(&xb, &[&i]))),
        );
        let mut xv: Vec<u16> = [3.140625f32, -0.0078125]
            .iter()
            .map(|v| bf16::from_f32(*v).to_bits())
            .collect();
        let mut yv = vec![0u16; 2];
        call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
        assert_eq!(xv, yv);
    }

    /// Transcendentals are libm's in the dtype; min/max propagate NaN; comparisons are IEEE.
    #[test]
    fn float_functions() {
        let x32 = Expr::constant(0.7, DType::F32);
        let x64 = Expr::constant(0.7, DType::F64);
        let u = |op, e: &Expr| ev(&Expr::unary(op, e.clone()).unwrap());
        assert_eq!(
            u(UnOp::Exp, &x32),
            Value::F32(crate::codegen::cpu_lib::exp32::exp32(0.7f32))
        );
        assert_eq!(u(UnOp::Exp, &x64), Value::F64(libm::exp(0.7)));
        assert_eq!(
            u(UnOp::Sigmoid, &x32),
            Value::F32(1.0 / (1.0 + crate::codegen::cpu_lib::exp32::exp32(-0.7f32)))
        );
        assert_eq!(u(UnOp::Rsqrt, &x64), Value::F64(1.0 / 0.7f64.sqrt()));
        assert_eq!(u(UnOp::Erf, &x32), Value::F32(libm::erff(0.7f32)));
        assert_eq!(u(UnOp::Tanh, &x64), Value::F64(libm::tanh(0.7)));
        assert_eq!(u(UnOp::Log, &x32), Value::F32(libm::logf(0.7f32)));
        assert_eq!(
            u(UnOp::Floor, &Expr::constant(-0.5, DType::F32)),
            Value::F32(-1.0)
        );
        assert_eq!(
            u(UnOp::Ceil, &Expr::constant(-0.5, DType::F64)),
            Value::F64(-0.0)
        );
        assert_eq!(
            ev(&bin(
                BinOp::Pow,
                x32.clone(),
                Expr::constant(2.5, DType::F32)
            )),
            Value::F32(libm::powf(0.7, 2.5))
        );
        let nan = Expr::constant(f64::NAN, DType::F32);
        let Value::F32(m) = ev(&bin(BinOp::Min, nan.clone(), x32.clone())) else {
            panic!()
        };
        assert!(m.is_nan());
        let Value::F32(m) = ev(&bin(BinOp::Max, x32.clone(), nan.clone())) else {
            panic!()
        };
        assert!(m.is_nan());
        assert_eq!(
            ev(&Expr::cmp(CmpOp::Ne, nan.clone(), nan.clone()).unwrap()),
            Value::Int(1)
        );
        assert_eq!(
            ev(&Expr::cmp(CmpOp::Ge, nan.clone(), x32).unwrap()),
            Value::Int(0)
        );
    }

    /// `Select` evaluates only the chosen arm and `&&` short-circuits: guarded loads past the
    /// end of a buffer are never performed.
    #[test]
    fn select_and_logic_evaluate_lazily() {
        let i = Var::new("i");
        let x = input(0, "x", DType::F32, vec![Expr::int(2)]);
        let y = output(1, "y", DType::F32, vec![Expr::int(4)]);
        let in_bounds = Expr::var(&i).lt(&Expr::int(2));
        let guarded = Expr::select(
            in_bounds.clone(),
            ld(&x, &[&i]),
            Expr::constant(-1.0, DType::F32),
        )
        .unwrap();
        let positive =
            Expr::cmp(CmpOp::Gt, ld(&x, &[&i]), Expr::constant(0.0, DType::F32)).unwrap();
        let both = Expr::logic(LogicOp::And, in_bounds, positive).unwrap();
        let body = for_(
            &i,
            Expr::int(4),
            Stmt::If {
                cond: both,
                then: Box::new(st(&y, &[&i], guarded.clone())),
                otherwise: Some(Box::new(st(&y, &[&i], guarded))),
            },
        );
        let f = func("pad", &[&x, &y], &[], &[], body);
        let mut xv = vec![5.0f32, -6.0];
        let mut yv = vec![0.0f32; 4];
        call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
        assert_eq!(yv, vec![5.0, -6.0, -1.0, -1.0]);
    }

    /// Out-of-bounds accesses are reported, not performed.
    #[test]
    fn out_of_bounds_is_an_error() {
        let n = Var::new("n");
        let i = Var::new("i");
        let x = output(0, "x", DType::I64, vec![Expr::var(&n)]);
        let body = for_(
            &i,
            Expr::var(&n).add(&Expr::int(1)),
            st(&x, &[&i], Expr::var(&i)),
        );
        let f = func("overrun", &[&x], &[], &[&n], body);
        let mut xv = vec![0i64; 4];
        let err = call(&f, vec![p(&mut xv)], vec![3, 1]).unwrap_err();
        assert!(
            matches!(&err, Error::Internal(m) if m.contains("out-of-bounds store of `x` at element offset 3")),
            "{err}"
        );
        assert_eq!(xv, vec![0, 1, 2, 0]);
        // Frame arity and failing checks are caught too.
        assert!(matches!(
            call(&f, vec![p(&mut xv)], vec![3]),
            Err(Error::Internal(_))
        ));
        let mut g = f.clone();
        g.checks.push(Check {
            cond: Expr::var(&n).lt(&Expr::int(3)),
            message: "n < 3".into(),
        });
        let err = call(&g, vec![p(&mut xv)], vec![3, 1]).unwrap_err();
        assert!(err.to_string().contains("n < 3"), "{err}");
        // A buffer of extent 0 admits no access at all (the loop still runs once here).
        let err = call(&f, vec![std::ptr::null_mut()], vec![0, 1]).unwrap_err();
        assert!(err.to_string().contains("valid offsets none"), "{err}");
    }

    /// Unverified IR is refused before anything runs.
    #[test]
    fn compile_verifies() {
        let x = output(0, "x", DType::F32, vec![Expr::int(2)]);
        let f = func(
            "bad",
            &[&x],
            &[],
            &[],
            Stmt::Store {
                buf: x.id,
                indices: vec![Expr::int(0)],
                value: Expr::constant(1.0, DType::F64),
            },
        );
        assert!(matches!(
            InterpBackend::default().compile(&f),
            Err(Error::Internal(_))
        ));
    }

    /// Multi-index (pre-flatten) IR runs with per-dimension bounds checks.
    #[test]
    fn unflattened() {
        let (i, j) = (Var::new("i"), Var::new("j"));
        let a = input(0, "A", DType::U16, vec![Expr::int(2), Expr::int(2)]);
        let b = output(1, "B", DType::U16, vec![Expr::int(2), Expr::int(2)]);
        let load = Expr::load(a.id, vec![Expr::var(&j), Expr::var(&i)], DType::U16);
        let store = Stmt::Store {
            buf: b.id,
            indices: vec![Expr::var(&i), Expr::var(&j)],
            value: load,
        };
        let f = func(
            "transpose",
            &[&a, &b],
            &[],
            &[],
            for_(&i, Expr::int(2), for_(&j, Expr::int(2), store)),
        );
        let mut av = vec![1u16, 2, 3, 4];
        let mut bv = vec![0u16; 4];
        // SAFETY: compact 2x2 buffers.
        unsafe {
            run_unflattened(
                &f,
                &CallFrame {
                    ptrs: vec![p(&mut av), p(&mut bv)].into(),
                    ints: vec![2, 1, 2, 1].into(),
                },
            )
        }
        .unwrap();
        assert_eq!(bv, vec![1, 3, 2, 4]);
    }

    /// `Let` binds an int64 visible in its body; loops start at `min`.
    #[test]
    fn let_and_loop_min() {
        let (i, t) = (Var::new("i"), Var::new("t"));
        let y = output(0, "y", DType::I64, vec![Expr::int(5)]);
        let body = Stmt::For {
            var: i.clone(),
            min: Expr::int(2),
            extent: Expr::int(3),
            kind: ForKind::Unrolled,
            body: Box::new(Stmt::Let {
                var: t.clone(),
                value: Expr::var(&i).mul(&Expr::int(10)),
                body: Box::new(Stmt::Store {
                    buf: y.id,
                    indices: vec![Expr::var(&i)],
                    value: Expr::var(&t).floordiv(&Expr::int(-3)),
                }),
            }),
        };
        let f = func("lets", &[&y], &[], &[], body);
        let mut yv = vec![0i64; 5];
        call(&f, vec![p(&mut yv)], vec![1]).unwrap();
        assert_eq!(yv, vec![0, 0, -7, -10, -14]);
    }
}
