//! Vector IR (made by `lower::vectorize`): vector stores and the expressions under them.
//!
//! A vector expression is computed as a packed 128-bit SIMD value (`f32x4`, `f64x2`, `i32x4`,
//! `i16x8`, `i8x16`, `i64x2`: the only width Cranelift's x64 backend emits) when its dtype
//! fills 128 bits and every node under it has a SIMD instruction with exactly the scalar
//! semantics: contiguous loads (`ramp(b, 1, n)` index), broadcasts, `+ - *` and float `/`,
//! float negation, `abs` and `sqrt` (IEEE operations, correctly rounded lane by lane, so
//! bit-identical with the scalar code and the interpreter), float min / max (the scalar
//! rule as masks and bit selects, `packed_minmax`), and float32 `exp` (inline,
//! `vector_exp.rs`: `codegen::cpu_lib::expf4`'s sequence, libm's `expf` bit for bit, checked on every
//! float of its main range; other lanes call `rivet_expf4`), float32 `erf` (one call of
//! `rivet_erff4` per four lanes: `codegen::cpu_lib::erff4`, libm's `erff` bit for bit). Everything else — gathers
//! (other ramps, computed vector indices), casts, comparisons, selects, integer division, other transcendentals (libm calls),
//! float16 / bfloat16 and bool — is computed lane by lane with the scalar code generation,
//! extracting lanes from any packed operand, so its results are the scalar results.
//!
//! Memory: vector loads and stores carry the scalar accesses' flags (`notrap`, no alignment
//! claimed: foreign tensors may be misaligned, and x64 vector loads then use `movups`).
//! A vector store computes all its lanes (values and offsets) before writing any, as the
//! interpreter does.

use super::expr::{flags, has_load, is_unsigned, value_ty};
use super::FnGen;
use crate::error::{Error, Result};
use crate::ir::{BinOp, BufId, Expr, ExprKind, UnOp};
use crate::lower::vectorize::informs_bounds;
use cranelift_codegen::ir::{InstBuilder, Type, Value};
use rivet_runtime::DType;

fn internal(msg: String) -> Error {
    Error::Internal(msg)
}

/// The packed SIMD type of `lanes` lanes of `dt`, when it is 128 bits and `dt` is held as
/// itself in registers (not float16 / bfloat16, computed in f32; not bool).
fn simd_ty(dt: DType, lanes: u32) -> Option<Type> {
    if matches!(dt, DType::F16 | DType::BF16 | DType::Bool) {
        return None;
    }
    let ty = value_ty(dt);
    (ty.bits() * lanes == 128).then(|| ty.by(lanes)).flatten()
}

/// The base of a contiguous ramp (`ramp(b, 1, n)`).
fn contiguous_base(index: &Expr) -> Option<&Expr> {
    match index.kind() {
        ExprKind::Ramp { base, stride, .. } if stride.as_int() == Some(1) => Some(base),
        _ => None,
    }
}

/// True when `e` is computed as one packed SIMD value (module header).
pub(super) fn packed(e: &Expr) -> bool {
    let dt = e.dtype();
    if !e.is_vector() || simd_ty(dt, e.lanes()).is_none() {
        return false;
    }
    let int_ok = |op: BinOp| match op {
        BinOp::Add | BinOp::Sub => true,
        // x64 has packed multiplies of 16- and 32-bit lanes only.
        BinOp::Mul => matches!(dt, DType::I16 | DType::U16 | DType::I32 | DType::U32),
        _ => false,
    };
    match e.kind() {
        ExprKind::Broadcast { .. } => true,
        ExprKind::Load { indices, .. } => {
            indices.len() == 1 && contiguous_base(&indices[0]).is_some()
        }
        ExprKind::Binary(op, a, b) => {
            let op_ok = if dt.is_float() {
                // min / max: compare, blend, then NaN where unordered (`packed_minmax`).
                matches!(
                    op,
                    BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Min | BinOp::Max
                )
            } else {
                int_ok(*op)
            };
            op_ok && packed(a) && packed(b)
        }
        ExprKind::Unary(op, a) => {
            let op_ok = if dt.is_float() {
                matches!(op, UnOp::Neg | UnOp::Abs | UnOp::Sqrt)
                    // float32 exp four lanes at a time (inline, `vector_exp.rs`: libm's bits).
                    || (*op == UnOp::Exp && dt == DType::F32 && e.lanes() == 4)
                    // float32 erf, one `rivet_erff4` call per four lanes (libm's bits).
                    || (*op == UnOp::Erf && dt == DType::F32 && e.lanes() == 4)
            } else {
                *op == UnOp::Neg || (*op == UnOp::Abs && is_unsigned(dt))
            };
            op_ok && packed(a)
        }
        // One rounding per lane: `vfmadd` where the ISA has FMA, else lane by lane through the
        // correctly rounded libcall (`packed_value`).
        ExprKind::Fma(a, b, c) => dt.is_float() && packed(a) && packed(b) && packed(c),
        // A float select on a comparison of packed floats of the same width: `cmpps` gives the
        // lane mask, a bit select the lanes (both arms are evaluated for every lane, which
        // `lower::vectorize` allows only for arms that cannot fault).
        ExprKind::Select(c, a, b) => {
            dt.is_float()
                && packed(a)
                && packed(b)
                && matches!(c.kind(), ExprKind::Cmp(_, x, y)
                    if x.dtype().is_float() && x.dtype().size() == dt.size()
                        && packed(x) && packed(y))
        }
        _ => false,
    }
}

impl FnGen<'_, '_> {
    /// `buf[index] = value` for a vector `value` (one flattened index of its lanes).
    pub(super) fn vector_store(
        &mut self,
        buf: BufId,
        indices: &[Expr],
        value: &Expr,
    ) -> Result<()> {
        let [index] = indices else {
            return Err(internal(format!(
                "a vector store has one flattened index, got {}",
                indices.len()
            )));
        };
        let dt = self.buf_dtype(buf)?;
        if value.dtype() != dt || index.lanes() != value.lanes() {
            return Err(internal(format!(
                "vector store of {} lanes of {} at an index of {} lanes into a {dt} buffer",
                value.lanes(),
                value.dtype(),
                index.lanes()
            )));
        }
        self.vmemo.clear();
        self.eager = crate::lower::vectorize::eager_loads(value);
        self.eager
            .extend(crate::lower::vectorize::eager_loads(index));
        let r = self.vector_store_inner(buf, index, value, dt);
        self.vmemo.clear();
        self.eager.clear();
        r
    }

    fn vector_store_inner(
        &mut self,
        buf: BufId,
        index: &Expr,
        value: &Expr,
        dt: DType,
    ) -> Result<()> {
        if let (Some(base), true) = (contiguous_base(index), super::vector_quad::quad(value)) {
            return self.quad_store(buf, base, value);
        }
        if let (Some(reg), true) = (self.promoted_var(buf, index), packed(value)) {
            let v = self.packed_value(value)?;
            self.b.def_var(reg, v);
            return Ok(());
        }
        if let (Some(base), true) = (contiguous_base(index), packed(value)) {
            let v = self.packed_value(value)?;
            // As packed loads: a constant term of the index becomes a displacement, a row's
            // offset part of a pointer computed before the loop (`offset_address`).
            let (addr, _) = self.offset_address(buf, base)?;
            self.b.ins().store(flags(), v, addr, 0);
            return Ok(());
        }
        // Lane by lane: every value and offset first, then the writes.
        let n = value.lanes();
        let mut vals = Vec::with_capacity(n as usize);
        for l in 0..n {
            let v = self.lane(value, l)?;
            let i = self.lane(index, l)?;
            vals.push((v, self.index_to_i64(i, index.dtype())));
        }
        for (v, i) in vals {
            let (addr, _) = self.address_of(buf, i)?;
            self.store_at(addr, dt, v)?;
        }
        Ok(())
    }

    /// The register holding `buf[index]` in the loop running now (`hoist::loop_carried`).
    fn promoted_var(&self, buf: BufId, index: &Expr) -> Option<cranelift_frontend::Variable> {
        self.promoted
            .iter()
            .rev()
            .find(|(b, i, _)| *b == buf && i == index)
            .map(|(_, _, v)| *v)
    }

    /// The address and packed type of the contiguous vector access `buf[index]`.
    pub(super) fn vector_address(&mut self, buf: BufId, index: &Expr) -> Result<(Value, Type)> {
        let base = contiguous_base(index)
            .ok_or_else(|| internal(format!("a register vector at a gather: {index}")))?;
        let dt = self.buf_dtype(buf)?;
        let ty = simd_ty(dt, index.lanes())
            .ok_or_else(|| internal(format!("no SIMD type for {} lanes of {dt}", index.lanes())))?;
        let (addr, _) = self.offset_address(buf, base)?;
        Ok((addr, ty))
    }

    /// A scalar expression inside a vector statement (computed once per statement).
    pub(super) fn scalar(&mut self, e: &Expr) -> Result<Value> {
        let key = (std::sync::Arc::as_ptr(&e.0) as usize, u32::MAX);
        if let Some(v) = self.vmemo.get(&key) {
            return Ok(*v);
        }
        if let Some(v) = self.hoisted.get(&key.0) {
            return Ok(*v);
        }
        let v = self.expr(e)?;
        self.vmemo.insert(key, v);
        Ok(v)
    }

    /// The packed SIMD value of `e` (`packed(e)` holds).
    fn packed_value(&mut self, e: &Expr) -> Result<Value> {
        let key = (std::sync::Arc::as_ptr(&e.0) as usize, u32::MAX - 1);
        if let Some(v) = self.vmemo.get(&key) {
            return Ok(*v);
        }
        let dt = e.dtype();
        let ty = simd_ty(dt, e.lanes())
            .ok_or_else(|| internal(format!("no SIMD type for {} lanes of {dt}", e.lanes())))?;
        let v = match e.kind() {
            ExprKind::Broadcast { value, .. } => {
                let x = self.scalar(value)?;
                self.b.ins().splat(ty, x)
            }
            ExprKind::Load { buf, indices } if self.promoted_var(*buf, &indices[0]).is_some() => {
                let reg = self.promoted_var(*buf, &indices[0]).expect("checked");
                self.b.use_var(reg)
            }
            ExprKind::Load { buf, indices } => {
                let base = contiguous_base(&indices[0])
                    .ok_or_else(|| internal(format!("packed load of a gather: {e}")))?;
                // Through `offset_address`: a constant term of the index becomes the
                // addressing mode's displacement, so a row's vectors share one index register.
                let (addr, _) = self.offset_address(*buf, base)?;
                let fl = self.load_flags(*buf, base);
                self.b.ins().load(ty, fl, addr, 0)
            }
            ExprKind::Binary(op @ (BinOp::Min | BinOp::Max), a, b) if dt.is_float() => {
                let x = self.packed_value(a)?;
                let y = self.packed_value(b)?;
                self.packed_minmax(*op == BinOp::Max, x, y, dt)
            }
            ExprKind::Binary(op, a, b) => {
                let x = self.packed_value(a)?;
                let y = self.packed_value(b)?;
                let ins = self.b.ins();
                match (op, dt.is_float()) {
                    (BinOp::Add, true) => ins.fadd(x, y),
                    (BinOp::Sub, true) => ins.fsub(x, y),
                    (BinOp::Mul, true) => ins.fmul(x, y),
                    (BinOp::Div, true) => ins.fdiv(x, y),
                    (BinOp::Add, false) => ins.iadd(x, y),
                    (BinOp::Sub, false) => ins.isub(x, y),
                    (BinOp::Mul, false) => ins.imul(x, y),
                    _ => return Err(internal(format!("packed {op:?} on {dt}"))),
                }
            }
            ExprKind::Unary(UnOp::Exp, a) if dt == DType::F32 && e.lanes() == 4 => {
                let x = self.packed_value(a)?;
                self.packed_expf(x)?
            }
            ExprKind::Fma(a, b, c) => {
                let (x, y, z) = (
                    self.packed_value(a)?,
                    self.packed_value(b)?,
                    self.packed_value(c)?,
                );
                if self.cx.has_fma {
                    self.b.ins().fma(x, y, z)
                } else {
                    // Cranelift's x64 backend has no vector FMA without the instruction: the
                    // scalar `fma` of each lane (a libcall of the correctly rounded `fmaf`).
                    let mut out = x;
                    for l in 0..e.lanes() as u8 {
                        let (xl, yl, zl) = (
                            self.b.ins().extractlane(x, l),
                            self.b.ins().extractlane(y, l),
                            self.b.ins().extractlane(z, l),
                        );
                        let r = self.b.ins().fma(xl, yl, zl);
                        out = self.b.ins().insertlane(out, r, l);
                    }
                    out
                }
            }
            ExprKind::Unary(UnOp::Erf, a) if dt == DType::F32 && e.lanes() == 4 => {
                let x = self.packed_value(a)?;
                self.slot_call("rivet_erff4", &[x])?[0]
            }
            ExprKind::Select(c, a, b) => {
                let ExprKind::Cmp(op, p, q) = c.kind() else {
                    return Err(internal(format!("packed select on {c}")));
                };
                if informs_bounds(c) && (self.may_fault(a) || self.may_fault(b)) {
                    return Err(internal(format!(
                        "a select arm that may fault, vectorized: {e}"
                    )));
                }
                let (x, y) = (self.packed_value(p)?, self.packed_value(q)?);
                let mask = self.compare(*op, x, y, p.dtype());
                let mask = self.b.ins().bitcast(
                    ty,
                    cranelift_codegen::ir::MemFlagsData::new()
                        .with_endianness(cranelift_codegen::ir::Endianness::Little),
                    mask,
                );
                let (x, y) = (self.packed_value(a)?, self.packed_value(b)?);
                self.b.ins().bitselect(mask, x, y)
            }
            ExprKind::Unary(op, a) => {
                let x = self.packed_value(a)?;
                let ins = self.b.ins();
                match (op, dt.is_float()) {
                    (UnOp::Neg, true) => ins.fneg(x),
                    (UnOp::Abs, true) => ins.fabs(x),
                    (UnOp::Sqrt, true) => ins.sqrt(x),
                    (UnOp::Neg, false) => ins.ineg(x),
                    // |x| of an unsigned int is x.
                    (UnOp::Abs, false) => x,
                    _ => return Err(internal(format!("packed {op:?} on {dt}"))),
                }
            }
            _ => return Err(internal(format!("not a packed expression: {e}"))),
        };
        self.vmemo.insert(key, v);
        Ok(v)
    }

    /// Float `max` / `min` of packed `x`, `y` with the scalar code's semantics lane by lane
    /// (`expr.rs`, `fminmax`; `codegen::cpu_lib::math::fmax`): `x > y ? x : y` (`<` for min), then NaN
    /// where either lane is NaN: `cmpps` masks and bit selects.
    pub(super) fn packed_minmax(&mut self, max: bool, x: Value, y: Value, dt: DType) -> Value {
        use cranelift_codegen::ir::condcodes::FloatCC;
        use cranelift_codegen::ir::{Endianness, MemFlagsData};
        let ty = self.b.func.dfg.value_type(x);
        let lanes = MemFlagsData::new().with_endianness(Endianness::Little);
        let cc = if max {
            FloatCC::GreaterThan
        } else {
            FloatCC::LessThan
        };
        let pick = self.b.ins().fcmp(cc, x, y);
        let pick = self.b.ins().bitcast(ty, lanes, pick);
        let r = self.b.ins().bitselect(pick, x, y);
        let uno = self.b.ins().fcmp(FloatCC::Unordered, x, y);
        let uno = self.b.ins().bitcast(ty, lanes, uno);
        let nan = if dt == DType::F64 {
            self.b.ins().f64const(f64::NAN)
        } else {
            self.b.ins().f32const(f32::NAN)
        };
        let nan = self.b.ins().splat(ty, nan);
        self.b.ins().bitselect(uno, nan, r)
    }

    /// Whether evaluating `e` for a lane the scalar code would skip might load memory that
    /// could fault: any load but a constant index inside a constant-size local
    /// (`lower::vectorize::harmless_load`) or a load the statement makes eagerly anyway
    /// (`self.eager`): the rules the vectorize pass applied. Asked only for arms under a
    /// condition the bounds proof may have relied on (`lower::vectorize::informs_bounds`).
    fn may_fault(&self, e: &Expr) -> bool {
        if !has_load(e) {
            return false;
        }
        let sizes = crate::lower::vectorize::local_sizes(&self.func.buffers);
        let mut bad = false;
        e.visit(&mut |n| {
            if let ExprKind::Load { buf, indices } = n.kind() {
                bad |= !crate::lower::vectorize::harmless_load(&sizes, *buf, indices)
                    && !self.eager.iter().any(|(b, i)| b == buf && i == indices);
            }
        });
        bad
    }

    /// Lane `l` of `e`, as a scalar value of `e`'s dtype.
    pub(super) fn lane(&mut self, e: &Expr, l: u32) -> Result<Value> {
        if !e.is_vector() {
            return self.scalar(e);
        }
        if l >= e.lanes() {
            return Err(internal(format!("lane {l} of a {}-lane `{e}`", e.lanes())));
        }
        if packed(e) {
            let v = self.packed_value(e)?;
            return Ok(self.b.ins().extractlane(v, l as u8));
        }
        let key = (std::sync::Arc::as_ptr(&e.0) as usize, l);
        if let Some(v) = self.vmemo.get(&key) {
            return Ok(*v);
        }
        let dt = e.dtype();
        let v = match e.kind() {
            ExprKind::Ramp { base, stride, .. } => {
                let b = self.scalar(base)?;
                let s = self.scalar(stride)?;
                let off = self.b.ins().imul_imm_s(s, i64::from(l));
                self.b.ins().iadd(b, off)
            }
            ExprKind::Broadcast { value, .. } => self.scalar(value)?,
            // Sixteen lanes of float32 erf: one `rivet_erff16` call computes all of them.
            ExprKind::Unary(UnOp::Erf, a)
                if dt == DType::F32 && e.lanes() == crate::lower::vectorize::WIDE_LANES =>
            {
                let all = self.erf16_lanes(a)?;
                for (k, v) in all.iter().enumerate() {
                    self.vmemo.insert((key.0, k as u32), *v);
                }
                all[l as usize]
            }
            ExprKind::Unary(op, a) => {
                let x = self.lane(a, l)?;
                self.unary(*op, x, a.dtype())?
            }
            ExprKind::Binary(op, a, b) => {
                let x = self.lane(a, l)?;
                let y = self.lane(b, l)?;
                self.binary(*op, x, y, a.dtype())?
            }
            ExprKind::Cmp(op, a, b) => {
                let x = self.lane(a, l)?;
                let y = self.lane(b, l)?;
                self.compare(*op, x, y, a.dtype())
            }
            ExprKind::Cast(a) => {
                let x = self.lane(a, l)?;
                self.cast(x, a.dtype(), dt)?
            }
            // One rounding per lane, as the scalar code (`expr.rs`): `vfmadd` where the ISA
            // has FMA, else the libcall `compile_kernel` binds.
            ExprKind::Fma(a, b, c) if dt.is_float() => {
                let x = self.lane(a, l)?;
                let y = self.lane(b, l)?;
                let z = self.lane(c, l)?;
                self.b.ins().fma(x, y, z)
            }
            // Operands evaluated lazily by the scalar code must not touch memory here: the
            // vectorize pass keeps such loops scalar.
            ExprKind::Logic(op, a, b) if !informs_bounds(a) || !self.may_fault(b) => {
                let x = self.lane(a, l)?;
                let y = self.lane(b, l)?;
                match op {
                    crate::ir::LogicOp::And => self.b.ins().band(x, y),
                    crate::ir::LogicOp::Or => self.b.ins().bor(x, y),
                }
            }
            ExprKind::Select(c, a, b)
                if !informs_bounds(c) || !self.may_fault(a) && !self.may_fault(b) =>
            {
                let c = self.lane(c, l)?;
                let x = self.lane(a, l)?;
                let y = self.lane(b, l)?;
                self.b.ins().select(c, x, y)
            }
            ExprKind::Load { buf, indices } if indices.len() == 1 => {
                let i = self.lane(&indices[0], l)?;
                let i = self.index_to_i64(i, indices[0].dtype());
                let (addr, bdt) = self.address_of(*buf, i)?;
                if bdt != dt {
                    return Err(internal(format!("load typed {dt} of a {bdt} buffer")));
                }
                let fl = self.load_flags(*buf, &indices[0]);
                self.load_at(addr, dt, fl)?
            }
            _ => return Err(internal(format!("vector expression not supported: {e}"))),
        };
        self.vmemo.insert(key, v);
        Ok(v)
    }
}
