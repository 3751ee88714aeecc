//! The interpreter's machine: the run-time state of a call (variables, buffers), the
//! evaluation of expressions and the execution of statements on memory.
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

use super::scalar::{binary, cast, compare, constant, unary};
use super::{gpu, IdMap, Value};
use crate::error::{Error, Result};
use crate::ir::expr::{Expr, ExprKind, LogicOp, Var};
use crate::ir::intrin::{gemm_extents, Intrin, Region};
use crate::ir::stmt::{Buffer, DeviceFunc, ForKind, Stmt};
use half::{bf16, f16};
use rivet_runtime::DType;

/// The run-time state of one buffer.
pub(super) struct BufState {
    pub(super) name: String,
    pub(super) dtype: DType,
    /// Element 0; null while a local is not allocated.
    pub(super) ptr: *mut u8,
    /// Extents and strides in elements (evaluated at launch or at `Allocate`).
    pub(super) shape: Vec<i64>,
    pub(super) strides: Vec<i64>,
    /// The element offsets the shape and strides reach lie in `[lo, hi]` (empty if lo > hi).
    pub(super) lo: i64,
    pub(super) hi: i64,
    /// Parameters always; locals inside their `Allocate`.
    pub(super) live: bool,
    /// A local's memory while it is allocated.
    pub(super) storage: Option<Vec<u8>>,
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
    pub(super) fn set_span(&mut self) {
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

pub(super) struct Machine<'a> {
    /// Function name, for messages.
    pub(super) name: &'a str,
    /// The function's buffer declarations (empty for `eval_expr`).
    pub(super) decls: &'a [Buffer],
    /// The function's outlined bodies (`Launch` runs them in place).
    pub(super) kernels: &'a [DeviceFunc],
    /// The function's host callbacks (`Intrin::Callback`).
    pub(super) callbacks: &'a [crate::ir::callback::Callback],
    pub(super) flattened: bool,
    pub(super) checked: bool,
    /// Values of the variables in scope.
    pub(super) env: IdMap<i64>,
    /// Run-time buffer states, and their positions by buffer id.
    pub(super) bufs: Vec<BufState>,
    pub(super) index: IdMap<usize>,
    /// The state of the GPU kernel being run, if any (`gpu.rs`).
    pub(super) gpu: Option<Box<gpu::Block>>,
    /// The lane being evaluated, inside a vector store (vector IR runs lane by lane: lane `l`
    /// of every node is the scalar meaning of the node with `ramp(b, s, n)` read as
    /// `b + s * l` and `broadcast(x, n)` as `x`).
    lane: Option<u32>,
}

impl<'a> Machine<'a> {
    pub(super) fn new(
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

    pub(super) fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::Internal(format!("IR interpreter, function `{}`: {msg}", self.name))
    }

    pub(super) fn var(&self, v: &Var) -> Result<i64> {
        self.env
            .get(&v.id)
            .copied()
            .ok_or_else(|| self.err(format!("unbound variable `{}` (id {})", v.name, v.id)))
    }

    /// Evaluates an expression that must be an integer (index, bound, shape, Let value).
    pub(super) fn int(&mut self, e: &Expr) -> Result<i64> {
        match self.eval(e)? {
            Value::Int(v) => Ok(v),
            other => Err(self.err(format!(
                "`{e}` should be an integer, evaluated to {other:?}"
            ))),
        }
    }

    pub(super) fn buf_pos(&self, id: u32) -> Result<usize> {
        self.index
            .get(&id)
            .copied()
            .ok_or_else(|| self.err(format!("access to unknown buffer id {id}")))
    }

    /// The checked element offset of an access to buffer `pos` with `indices`.
    pub(super) fn offset(&mut self, pos: usize, indices: &[Expr], what: &str) -> Result<i64> {
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

    pub(super) fn eval(&mut self, e: &Expr) -> Result<Value> {
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
    pub(super) fn truth(&mut self, e: &Expr) -> Result<bool> {
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
    pub(super) fn alloc_all(&mut self, bufs: &[crate::ir::BufId]) -> Result<Vec<usize>> {
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

    pub(super) fn alloc_end(&mut self, pos: usize) {
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
    pub(super) fn region(&mut self, r: &Region, extents: &[i64]) -> Result<(usize, i64, Vec<i64>)> {
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
    pub(super) unsafe fn call(&mut self, intrin: Intrin, regions: &[Region]) -> Result<()> {
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
    pub(super) unsafe fn exec(&mut self, s: &Stmt) -> Result<()> {
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
pub(super) unsafe fn write_elem(p: *mut u8, dt: DType, v: Value) -> bool {
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
