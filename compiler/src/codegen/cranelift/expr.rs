//! Expressions: values, arithmetic, casts, loads and stores.
//!
//! Every expression evaluates to one Cranelift value of its *value type*: `i8`/`i16`/`i32`/
//! `i64` for ints, uints and bool (`i8` holding 0 or 1), `f32` for float32, float16 and
//! bfloat16, `f64` for float64. Memory holds the *storage type* (`i16` bits for float16 and
//! bfloat16).

use super::FnGen;
use crate::error::{Error, Result};
use crate::ir::{BinOp, BufId, CmpOp, Const, Expr, ExprKind, LogicOp, UnOp};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, BlockArg, InstBuilder, MemFlagsData, Type, Value};
use rivet_runtime::DType;

/// Flags of every buffer access: the compiler proved it in bounds, so it cannot trap. (No
/// alignment is claimed: foreign tensors may be misaligned.)
pub(super) fn flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// The input parameters: memory nothing changes during a call. The verifier refuses any store
/// or intrinsic region writing one (`ir::verify`: inputs may be read-only memory), and outputs
/// never share memory with other arguments (the runtime's rule).
pub(super) fn readonly_inputs(func: &crate::ir::PrimFunc) -> std::collections::HashSet<BufId> {
    func.buffers
        .iter()
        .filter(|b| b.kind == crate::ir::BufKind::Param { output: false })
        .map(|b| b.id)
        .collect()
}

/// `(rest, k)` when the int64 `e` is `rest + k` with `k` a non-zero constant: the constant
/// terms of a tree of additions (and subtractions of constants) anywhere in it, so that a
/// vector of a row's `+ 4`, `+ 8`, `+ 12` (`(i * s0) + ((ko * 16) + 4)`) becomes a
/// displacement on one shared index. Reassociating int64 additions is exact in wrapping
/// arithmetic, and `rest + k` is the same value.
pub(super) fn split_constant(e: &Expr) -> Option<(Expr, i64)> {
    if e.dtype() != DType::I64 {
        return None;
    }
    /// `e` as (non-constant part, constant part); `None` when a constant sum overflows.
    fn terms(e: &Expr) -> Option<(Option<Expr>, i64)> {
        if let Some(k) = e.as_int() {
            return Some((None, k));
        }
        match e.kind() {
            ExprKind::Binary(BinOp::Add, a, b) => {
                let (ra, ka) = terms(a)?;
                let (rb, kb) = terms(b)?;
                let rest = match (ra, rb) {
                    (Some(x), Some(y)) => Some(x.add(&y)),
                    (x, None) => x,
                    (None, y) => y,
                };
                Some((rest, ka.checked_add(kb)?))
            }
            ExprKind::Binary(BinOp::Sub, a, b) if b.as_int().is_some() => {
                let (ra, ka) = terms(a)?;
                Some((ra, ka.checked_sub(b.as_int()?)?))
            }
            _ => Some((Some(e.clone()), 0)),
        }
    }
    match terms(e)? {
        (Some(rest), k) if k != 0 => Some((rest, k)),
        _ => None,
    }
}

/// Type of a value of `dt` in registers.
pub(super) fn value_ty(dt: DType) -> Type {
    match dt {
        DType::Bool | DType::I8 | DType::U8 => types::I8,
        DType::I16 | DType::U16 => types::I16,
        DType::I32 | DType::U32 => types::I32,
        DType::I64 | DType::U64 => types::I64,
        DType::F16 | DType::BF16 | DType::F32 => types::F32,
        DType::F64 => types::F64,
    }
}

/// Type of an element of `dt` in memory.
pub(super) fn storage_ty(dt: DType) -> Type {
    match dt {
        DType::F16 | DType::BF16 => types::I16,
        _ => value_ty(dt),
    }
}

pub(super) fn is_unsigned(dt: DType) -> bool {
    matches!(
        dt,
        DType::Bool | DType::U8 | DType::U16 | DType::U32 | DType::U64
    )
}

fn is_int(dt: DType) -> bool {
    !dt.is_float() && dt != DType::Bool
}

/// True when evaluating `e` reads memory.
pub(super) fn has_load(e: &Expr) -> bool {
    let mut found = false;
    e.visit(&mut |n| found |= matches!(n.kind(), ExprKind::Load { .. }));
    found
}

fn internal(msg: String) -> Error {
    Error::Internal(msg)
}

impl FnGen<'_, '_> {
    /// An integer constant of type `ty`, truncated to its width.
    pub(super) fn iconst(&mut self, ty: Type, v: i64) -> Value {
        let bits = ty.bits();
        let v = if bits >= 64 {
            v
        } else {
            v & ((1i64 << bits) - 1)
        };
        self.b.ins().iconst(ty, v)
    }

    pub(super) fn fconst(&mut self, ty: Type, v: f64) -> Value {
        if ty == types::F64 {
            self.b.ins().f64const(v)
        } else {
            self.b.ins().f32const(v as f32)
        }
    }

    fn var_value(&mut self, id: u32, name: &str) -> Result<Value> {
        match self.vars.get(&id) {
            Some((v, _)) => {
                let v = *v;
                Ok(self.b.use_var(v))
            }
            None => Err(internal(format!(
                "variable {name} (id {id}) is used outside its scope"
            ))),
        }
    }

    pub(super) fn buf_ptr(&mut self, buf: BufId) -> Result<Value> {
        match self.bufs.get(&buf) {
            Some(v) => {
                let v = *v;
                Ok(self.b.use_var(v))
            }
            None => Err(internal(format!(
                "buffer {} is used outside its allocation",
                self.func
                    .buffers
                    .iter()
                    .find(|b| b.id == buf)
                    .map(|b| b.name.as_str())
                    .unwrap_or("?")
            ))),
        }
    }

    /// The address of element `indices[0]` of `buf`.
    pub(super) fn address(&mut self, buf: BufId, indices: &[Expr]) -> Result<(Value, DType)> {
        let idx = if self.cx.checked {
            self.checked_offset(buf, indices)?
        } else {
            if indices.len() != 1 {
                return Err(internal(format!(
                    "the Cranelift backend needs flattened accesses (one index), got {} indices",
                    indices.len()
                )));
            }
            return self.offset_address(buf, &indices[0]);
        };
        self.address_of(buf, idx)
    }

    /// The address of element `offset` of `buf`, with a constant term of the offset kept out
    /// of the multiplication by the element size: `base + rest * size + k * size`, which x64
    /// folds into one addressing mode (`disp(base, rest, size)`). A register tile's rows of a
    /// packed panel (`Ap[... + 0]` .. `Ap[... + 11]`) then share one index register instead
    /// of computing twelve. Same value as `base + (rest + k) * size` in wrapping arithmetic.
    pub(super) fn offset_address(&mut self, buf: BufId, offset: &Expr) -> Result<(Value, DType)> {
        if let Some((rest, k)) = split_constant(offset) {
            let size = self.buf_dtype(buf)?.size() as i64;
            if let Some(disp) = k.checked_mul(size).filter(|d| i32::try_from(*d).is_ok()) {
                let (addr, dt) = self.row_address(buf, &rest)?;
                return Ok((self.b.ins().iadd_imm_s(addr, disp), dt));
            }
        }
        self.row_address(buf, offset)
    }

    /// The address of element `offset` of `buf`, as `(base + inv * size) + var * size` when the
    /// int64 sum `offset` has terms that do not mention the innermost loop's variable (`inv`: a
    /// row's offset) and terms that do (`var`): the first part is the same on every iteration,
    /// so the code generator computes it once before the loop (one register per array instead
    /// of a base and a row offset), and `var * size` is one value shared by every array walked
    /// with the same index. Same value as `base + offset * size` in wrapping arithmetic.
    fn row_address(&mut self, buf: BufId, offset: &Expr) -> Result<(Value, DType)> {
        if let Some((inv, var)) = self.split_invariant(offset) {
            let iv = self.expr(&inv)?;
            let iv = self.index_to_i64(iv, inv.dtype());
            let (row, dt) = self.address_of(buf, iv)?;
            let vv = self.expr(&var)?;
            let vv = self.index_to_i64(vv, var.dtype());
            let size = dt.size() as i64;
            let off = if size == 1 {
                vv
            } else {
                self.b.ins().imul_imm_s(vv, size)
            };
            return Ok((self.b.ins().iadd(row, off), dt));
        }
        let idx = self.expr(offset)?;
        let idx = self.index_to_i64(idx, offset.dtype());
        self.address_of(buf, idx)
    }

    /// `(inv, var)` when the int64 sum `e` has both terms that do not use the innermost loop's
    /// variable and terms that do (`None` outside loops, or when either part is empty).
    fn split_invariant(&self, e: &Expr) -> Option<(Expr, Expr)> {
        let v = self.loop_vars.last()?;
        if e.dtype() != DType::I64 {
            return None;
        }
        fn terms<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
            match e.kind() {
                ExprKind::Binary(BinOp::Add, a, b) => {
                    terms(a, out);
                    terms(b, out);
                }
                _ => out.push(e),
            }
        }
        let mut all = Vec::new();
        terms(e, &mut all);
        let (var, inv): (Vec<&Expr>, Vec<&Expr>) = all.into_iter().partition(|t| t.uses(v));
        let sum = |ts: Vec<&Expr>| ts.into_iter().cloned().reduce(|a, b| a.add(&b));
        Some((sum(inv)?, sum(var)?))
    }

    /// The dtype of `buf`'s elements.
    pub(super) fn buf_dtype(&self, buf: BufId) -> Result<DType> {
        self.func
            .buffers
            .iter()
            .find(|b| b.id == buf)
            .map(|b| b.dtype)
            .ok_or_else(|| internal(format!("unknown buffer id {}", buf.0)))
    }

    /// The address of element `idx` (an i64 value) of `buf`.
    pub(super) fn address_of(&mut self, buf: BufId, idx: Value) -> Result<(Value, DType)> {
        let dt = self.buf_dtype(buf)?;
        let base = self.buf_ptr(buf)?;
        let size = dt.size() as i64;
        let off = if size == 1 {
            idx
        } else {
            self.b.ins().imul_imm_s(idx, size)
        };
        Ok((self.b.ins().iadd(base, off), dt))
    }

    /// Checked mode: the element offset of an unflattened access, `sum(index_k * stride_k)`,
    /// after checking each `index_k` against its dim's extent (a failure reports the access
    /// site through `rivet_oob` and leaves the function).
    fn checked_offset(&mut self, buf: BufId, indices: &[Expr]) -> Result<Value> {
        let b = self
            .func
            .buffers
            .iter()
            .find(|b| b.id == buf)
            .ok_or_else(|| internal(format!("unknown buffer id {}", buf.0)))?;
        if indices.len() != b.shape.len() || b.strides.len() != b.shape.len() {
            return Err(internal(format!(
                "checked access to `{}` with {} indices ({} dims, {} strides)",
                b.name,
                indices.len(),
                b.shape.len(),
                b.strides.len()
            )));
        }
        let site = self.cx.sites.len() as i64;
        self.cx.sites.push(b.name.clone());
        let mut off = self.iconst(types::I64, 0);
        for (k, (i, extent)) in indices.iter().zip(&b.shape).enumerate() {
            let iv = self.expr(i)?;
            let iv = self.index_to_i64(iv, i.dtype());
            let ev = self.expr(extent)?;
            let ev = self.index_to_i64(ev, extent.dtype());
            // One unsigned compare: a negative index is a huge unsigned one.
            let ok = self.b.ins().icmp(IntCC::UnsignedLessThan, iv, ev);
            let bad = self.b.ins().bxor_imm_u(ok, 1);
            let args = vec![
                self.iconst(types::I64, site),
                self.iconst(types::I64, k as i64),
                iv,
                ev,
            ];
            self.fail_if(bad, Some(("rivet_oob", args)))?;
            let stride = self.var_value(b.strides[k].id, &b.strides[k].name)?;
            let term = self.b.ins().imul(iv, stride);
            off = self.b.ins().iadd(off, term);
        }
        Ok(off)
    }

    /// An index value widened (or narrowed) to i64.
    pub(super) fn index_to_i64(&mut self, v: Value, dt: DType) -> Value {
        let ty = self.b.func.dfg.value_type(v);
        if ty == types::I64 {
            v
        } else if is_unsigned(dt) {
            self.b.ins().uextend(types::I64, v)
        } else {
            self.b.ins().sextend(types::I64, v)
        }
    }

    /// Loads element `indices[0]` of `buf` as a value of its dtype.
    fn load(&mut self, buf: BufId, indices: &[Expr]) -> Result<Value> {
        if let Some(&var) = self.reg_locals.get(&buf) {
            return Ok(self.b.use_var(var));
        }
        let (addr, dt) = self.address(buf, indices)?;
        let fl = match indices {
            [index] => self.load_flags(buf, index),
            _ => flags(),
        };
        self.load_at(addr, dt, fl)
    }

    /// The flags of a load of `buf` at `index` (flattened). A load of an input (nothing in the
    /// function writes one), at an index that mentions the innermost loop's variable, is marked
    /// `readonly` and `can_move`: pure to Cranelift's egraph, which then places it where its
    /// value is first used instead of where it was written. Without that, a reduction's twelve
    /// loads per step all came first and their arithmetic last (pure instructions are placed
    /// at their first use, the loop's back edge): seventeen live vectors, a spilled
    /// accumulator, a store-to-load round trip per step. Safe because such a load can move
    /// only within one iteration of its loop: its address depends on the loop's variable, so
    /// it is never hoisted out of the loop, and the egraph places pure values at (or before,
    /// in blocks dominating) their uses, which the original load dominated: it runs only
    /// where the program ran it. Two such loads of one address merge, as the memory does not
    /// change. Not in checked mode, where an index check guards each access.
    pub(super) fn load_flags(&self, buf: BufId, index: &Expr) -> MemFlagsData {
        let movable = !self.cx.checked
            && self.readonly.contains(&buf)
            && self.loop_vars.last().is_some_and(|v| index.uses(v));
        if movable {
            flags().with_readonly().with_can_move()
        } else {
            flags()
        }
    }

    /// Loads the element of dtype `dt` at `addr` as a value of its dtype.
    pub(super) fn load_at(&mut self, addr: Value, dt: DType, fl: MemFlagsData) -> Result<Value> {
        let raw = self.b.ins().load(storage_ty(dt), fl, addr, 0);
        Ok(match dt {
            DType::F16 => {
                let w = self.b.ins().uextend(types::I32, raw);
                self.call1("rivet_f16_to_f32", &[types::I32], types::F32, &[w])?
            }
            DType::BF16 => self.bf16_bits_to_f32(raw),
            _ => raw,
        })
    }

    fn bf16_bits_to_f32(&mut self, bits16: Value) -> Value {
        let w = self.b.ins().uextend(types::I32, bits16);
        let w = self.b.ins().ishl_imm_u(w, 16);
        self.b.ins().bitcast(types::F32, MemFlagsData::new(), w)
    }

    /// Stores `value` (a value of `buf`'s dtype) at element `indices[0]` of `buf`.
    pub(super) fn store(&mut self, buf: BufId, indices: &[Expr], value: &Expr) -> Result<()> {
        if value.is_vector() {
            return self.vector_store(buf, indices, value);
        }
        let v = self.expr(value)?;
        if let Some(&var) = self.reg_locals.get(&buf) {
            // The value a store then a load would give: float16/bfloat16 rounded to their
            // precision (and widened back), everything else as it is.
            let dt = value.dtype();
            let v = if matches!(dt, DType::F16 | DType::BF16) {
                self.round_half(v, dt)?
            } else {
                v
            };
            self.b.def_var(var, v);
            return Ok(());
        }
        let (addr, dt) = self.address(buf, indices)?;
        if value.dtype() != dt {
            return Err(internal(format!(
                "store of a {} value into a {} buffer",
                value.dtype(),
                dt
            )));
        }
        self.store_at(addr, dt, v)
    }

    /// Stores `v` (a value of dtype `dt`) at `addr`.
    pub(super) fn store_at(&mut self, addr: Value, dt: DType, v: Value) -> Result<()> {
        let raw = match dt {
            DType::F16 => {
                let bits = self.call1("rivet_f32_to_f16", &[types::F32], types::I32, &[v])?;
                self.b.ins().ireduce(types::I16, bits)
            }
            DType::BF16 => {
                let bits = self.call1("rivet_f32_to_bf16", &[types::F32], types::I32, &[v])?;
                self.b.ins().ireduce(types::I16, bits)
            }
            _ => v,
        };
        self.b.ins().store(flags(), raw, addr, 0);
        Ok(())
    }

    /// Evaluates an expression to a value of its dtype's value type.
    pub(super) fn expr(&mut self, e: &Expr) -> Result<Value> {
        let dt = e.dtype();
        match e.kind() {
            ExprKind::Const(c) => Ok(self.constant(*c, dt)),
            ExprKind::Var(v) => {
                let x = self.var_value(v.id, &v.name)?;
                // Vars are int64; a binding of another type (never produced by lowering) is
                // converted like a cast.
                let ty = self.b.func.dfg.value_type(x);
                if ty == value_ty(dt) {
                    Ok(x)
                } else {
                    Err(internal(format!(
                        "variable {} has type {ty} but is used as {dt}",
                        v.name
                    )))
                }
            }
            ExprKind::Unary(op, a) => {
                let x = self.expr(a)?;
                self.unary(*op, x, a.dtype())
            }
            ExprKind::Binary(op, a, b) => {
                let x = self.expr(a)?;
                let y = self.expr(b)?;
                self.binary(*op, x, y, a.dtype())
            }
            ExprKind::Cmp(op, a, b) => {
                let x = self.expr(a)?;
                let y = self.expr(b)?;
                Ok(self.compare(*op, x, y, a.dtype()))
            }
            ExprKind::Logic(op, a, b) => {
                let x = self.expr(a)?;
                if has_load(b) {
                    // Short-circuit, as the interpreter: the right operand's loads may be
                    // valid only when the left one does not decide the result.
                    let rhs = self.b.create_block();
                    let merge = self.b.create_block();
                    let r = self.b.append_block_param(merge, types::I8);
                    match op {
                        LogicOp::And => {
                            self.b.ins().brif(x, rhs, &[], merge, &[BlockArg::Value(x)])
                        }
                        LogicOp::Or => self.b.ins().brif(x, merge, &[BlockArg::Value(x)], rhs, &[]),
                    };
                    self.b.seal_block(rhs);
                    self.b.switch_to_block(rhs);
                    let y = self.expr(b)?;
                    self.b.ins().jump(merge, &[BlockArg::Value(y)]);
                    self.b.seal_block(merge);
                    self.b.switch_to_block(merge);
                    return Ok(r);
                }
                let y = self.expr(b)?;
                Ok(match op {
                    LogicOp::And => self.b.ins().band(x, y),
                    LogicOp::Or => self.b.ins().bor(x, y),
                })
            }
            ExprKind::Cast(a) => {
                let x = self.expr(a)?;
                self.cast(x, a.dtype(), dt)
            }
            ExprKind::Fma(a, b, c) => {
                if !dt.is_float() {
                    return Err(internal(format!("fma on {dt}")));
                }
                let x = self.expr(a)?;
                let y = self.expr(b)?;
                let z = self.expr(c)?;
                // One rounding: `vfmadd` where the ISA has FMA, else Cranelift's libcall to
                // `fmaf`/`fma`, which `compile_kernel` binds to `math`'s correctly rounded
                // helpers (never a separate multiply and add).
                Ok(self.b.ins().fma(x, y, z))
            }
            ExprKind::Select(c, a, b) => {
                let c = self.expr(c)?;
                if has_load(a) || has_load(b) {
                    // Only the chosen arm runs (as in the interpreter), so a load guarded by
                    // the condition is never performed out of bounds.
                    let then_b = self.b.create_block();
                    let else_b = self.b.create_block();
                    let merge = self.b.create_block();
                    let r = self.b.append_block_param(merge, value_ty(dt));
                    self.b.ins().brif(c, then_b, &[], else_b, &[]);
                    self.b.seal_block(then_b);
                    self.b.seal_block(else_b);
                    self.b.switch_to_block(then_b);
                    let x = self.expr(a)?;
                    self.b.ins().jump(merge, &[BlockArg::Value(x)]);
                    self.b.switch_to_block(else_b);
                    let y = self.expr(b)?;
                    self.b.ins().jump(merge, &[BlockArg::Value(y)]);
                    self.b.seal_block(merge);
                    self.b.switch_to_block(merge);
                    return Ok(r);
                }
                // Arms without memory accesses cannot trap: evaluate both, pick without a
                // branch.
                let x = self.expr(a)?;
                let y = self.expr(b)?;
                Ok(self.b.ins().select(c, x, y))
            }
            ExprKind::Load { .. } | ExprKind::Ramp { .. } | ExprKind::Broadcast { .. }
                if e.is_vector() =>
            {
                Err(internal(format!(
                    "vector expression outside a vector store: {e}"
                )))
            }
            ExprKind::Load { buf, indices } => self.load(*buf, indices),
            ExprKind::Ramp { .. } | ExprKind::Broadcast { .. } => {
                Err(internal(format!("a vector node of one lane: {e}")))
            }
            ExprKind::Read { .. } | ExprKind::Reduce { .. } | ExprKind::Invalid(_) => Err(
                internal(format!("te-only expression in a lowered function: {e}")),
            ),
        }
    }

    /// A constant of dtype `dt`: an integer constant converted as by a cast from int64, a
    /// float one as by a cast from float64 (so a float16 constant is rounded to float16, and
    /// a float constant of an int dtype saturates), as the interpreter does.
    fn constant(&mut self, c: Const, dt: DType) -> Value {
        let ty = value_ty(dt);
        match c {
            Const::Int(v) => match dt {
                DType::Bool => self.iconst(ty, (v != 0) as i64),
                DType::F64 => self.b.ins().f64const(v as f64),
                DType::F32 => self.b.ins().f32const(v as f32),
                DType::F16 => self
                    .b
                    .ins()
                    .f32const(half::f16::from_f32(v as f32).to_f32()),
                DType::BF16 => self
                    .b
                    .ins()
                    .f32const(half::bf16::from_f32(v as f32).to_f32()),
                _ => self.iconst(ty, v),
            },
            Const::Float(x) => match dt {
                DType::Bool => self.iconst(ty, (x != 0.0) as i64),
                DType::F64 => self.b.ins().f64const(x),
                DType::F32 => self.b.ins().f32const(x as f32),
                DType::F16 => self
                    .b
                    .ins()
                    .f32const(half::f16::from_f32(x as f32).to_f32()),
                DType::BF16 => self.b.ins().f32const(half::bf16::from_f64(x).to_f32()),
                DType::I8 => self.iconst(ty, x as i8 as i64),
                DType::I16 => self.iconst(ty, x as i16 as i64),
                DType::I32 => self.iconst(ty, x as i32 as i64),
                DType::I64 => self.iconst(ty, x as i64),
                DType::U8 => self.iconst(ty, x as u8 as i64),
                DType::U16 => self.iconst(ty, x as u16 as i64),
                DType::U32 => self.iconst(ty, x as u32 as i64),
                DType::U64 => self.iconst(ty, x as u64 as i64),
            },
        }
    }

    pub(super) fn unary(&mut self, op: UnOp, x: Value, dt: DType) -> Result<Value> {
        let f64_ = value_ty(dt) == types::F64;
        let ins = self.b.ins();
        Ok(match op {
            UnOp::Neg if dt.is_float() => ins.fneg(x),
            UnOp::Neg => ins.ineg(x),
            UnOp::Not => ins.bxor_imm_u(x, 1),
            UnOp::Abs if dt.is_float() => ins.fabs(x),
            UnOp::Abs if is_unsigned(dt) => x,
            UnOp::Abs => {
                let neg = self.b.ins().ineg(x);
                let lt = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                self.b.ins().select(lt, neg, x)
            }
            _ if !dt.is_float() => return Err(internal(format!("{op:?} on {dt}"))),
            UnOp::Sqrt => ins.sqrt(x),
            UnOp::Floor => ins.floor(x),
            UnOp::Ceil => ins.ceil(x),
            UnOp::Rsqrt => {
                let s = self.b.ins().sqrt(x);
                let one = self.fconst(value_ty(dt), 1.0);
                self.b.ins().fdiv(one, s)
            }
            UnOp::Exp => self.math1(if f64_ { "rivet_exp" } else { "rivet_expf" }, x)?,
            UnOp::Log => self.math1(if f64_ { "rivet_log" } else { "rivet_logf" }, x)?,
            UnOp::Tanh => self.math1(if f64_ { "rivet_tanh" } else { "rivet_tanhf" }, x)?,
            UnOp::Erf => self.math1(if f64_ { "rivet_erf" } else { "rivet_erff" }, x)?,
            UnOp::Sigmoid => {
                let n = self.b.ins().fneg(x);
                let e = self.math1(if f64_ { "rivet_exp" } else { "rivet_expf" }, n)?;
                let one = self.fconst(value_ty(dt), 1.0);
                let d = self.b.ins().fadd(one, e);
                self.b.ins().fdiv(one, d)
            }
        })
    }

    /// Calls a one-argument float helper of `math::symbols()`.
    fn math1(&mut self, name: &'static str, x: Value) -> Result<Value> {
        let ty = self.b.func.dfg.value_type(x);
        self.call1(name, &[ty], ty, &[x])
    }

    fn math2(&mut self, name: &'static str, x: Value, y: Value) -> Result<Value> {
        let ty = self.b.func.dfg.value_type(x);
        self.call1(name, &[ty, ty], ty, &[x, y])
    }

    pub(super) fn binary(&mut self, op: BinOp, x: Value, y: Value, dt: DType) -> Result<Value> {
        if dt.is_float() {
            let f64_ = value_ty(dt) == types::F64;
            let ins = self.b.ins();
            return Ok(match op {
                BinOp::Add => ins.fadd(x, y),
                BinOp::Sub => ins.fsub(x, y),
                BinOp::Mul => ins.fmul(x, y),
                BinOp::Div => ins.fdiv(x, y),
                BinOp::Min => self.fminmax(x, y, FloatCC::LessThan),
                BinOp::Max => self.fminmax(x, y, FloatCC::GreaterThan),
                BinOp::Pow => self.math2(if f64_ { "rivet_pow" } else { "rivet_powf" }, x, y)?,
                BinOp::FloorDiv => self.math2(
                    if f64_ {
                        "rivet_floordiv"
                    } else {
                        "rivet_floordivf"
                    },
                    x,
                    y,
                )?,
                BinOp::FloorMod => self.math2(
                    if f64_ {
                        "rivet_floormod"
                    } else {
                        "rivet_floormodf"
                    },
                    x,
                    y,
                )?,
            });
        }
        if !is_int(dt) {
            return Err(internal(format!("{op:?} on {dt}")));
        }
        let unsigned = is_unsigned(dt);
        let ins = self.b.ins();
        Ok(match op {
            BinOp::Add => ins.iadd(x, y),
            BinOp::Sub => ins.isub(x, y),
            BinOp::Mul => ins.imul(x, y),
            BinOp::Min if unsigned => ins.umin(x, y),
            BinOp::Min => ins.smin(x, y),
            BinOp::Max if unsigned => ins.umax(x, y),
            BinOp::Max => ins.smax(x, y),
            BinOp::FloorDiv if unsigned => self.udivmod(x, y, false),
            BinOp::FloorMod if unsigned => self.udivmod(x, y, true),
            BinOp::FloorDiv => self.sfloordiv(x, y),
            BinOp::FloorMod => self.sfloormod(x, y),
            BinOp::Div | BinOp::Pow => {
                return Err(internal(format!("{op:?} on {dt} (needs floats)")))
            }
        })
    }

    /// `math::fmin`/`fmax`: the canonical NaN if either is NaN, else `x` if `x cc y`, else `y`
    /// (so `min(-0.0, 0.0)` is `0.0`, as in the interpreter; Cranelift's `fmin` would give
    /// `-0.0`).
    fn fminmax(&mut self, x: Value, y: Value, cc: FloatCC) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        let pick = self.b.ins().fcmp(cc, x, y);
        let r = self.b.ins().select(pick, x, y);
        let uno = self.b.ins().fcmp(FloatCC::Unordered, x, y);
        let nan = if ty == types::F64 {
            self.b.ins().f64const(f64::NAN)
        } else {
            self.b.ins().f32const(f32::NAN)
        };
        self.b.ins().select(uno, nan, r)
    }

    pub(super) fn compare(&mut self, op: CmpOp, x: Value, y: Value, dt: DType) -> Value {
        if dt.is_float() {
            // Rust's operators: every comparison with NaN is false except `!=`.
            let cc = match op {
                CmpOp::Eq => FloatCC::Equal,
                CmpOp::Ne => FloatCC::NotEqual,
                CmpOp::Lt => FloatCC::LessThan,
                CmpOp::Le => FloatCC::LessThanOrEqual,
                CmpOp::Gt => FloatCC::GreaterThan,
                CmpOp::Ge => FloatCC::GreaterThanOrEqual,
            };
            return self.b.ins().fcmp(cc, x, y);
        }
        let u = is_unsigned(dt);
        let cc = match op {
            CmpOp::Eq => IntCC::Equal,
            CmpOp::Ne => IntCC::NotEqual,
            CmpOp::Lt if u => IntCC::UnsignedLessThan,
            CmpOp::Le if u => IntCC::UnsignedLessThanOrEqual,
            CmpOp::Gt if u => IntCC::UnsignedGreaterThan,
            CmpOp::Ge if u => IntCC::UnsignedGreaterThanOrEqual,
            CmpOp::Lt => IntCC::SignedLessThan,
            CmpOp::Le => IntCC::SignedLessThanOrEqual,
            CmpOp::Gt => IntCC::SignedGreaterThan,
            CmpOp::Ge => IntCC::SignedGreaterThanOrEqual,
        };
        self.b.ins().icmp(cc, x, y)
    }

    /// An int (or bool) value of type `from` resized to `to` (wrapping or extending by `from`'s
    /// signedness).
    fn resize_int(&mut self, x: Value, from: DType, to: Type) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        if ty.bits() == to.bits() {
            x
        } else if ty.bits() > to.bits() {
            self.b.ins().ireduce(to, x)
        } else if is_unsigned(from) {
            self.b.ins().uextend(to, x)
        } else {
            self.b.ins().sextend(to, x)
        }
    }

    /// Rounds an f32 value to the nearest float16 / bfloat16 (as `half`), returned as f32.
    fn round_half(&mut self, x: Value, to: DType) -> Result<Value> {
        match to {
            DType::F16 => {
                let bits = self.call1("rivet_f32_to_f16", &[types::F32], types::I32, &[x])?;
                self.call1("rivet_f16_to_f32", &[types::I32], types::F32, &[bits])
            }
            _ => {
                let bits = self.call1("rivet_f32_to_bf16", &[types::F32], types::I32, &[x])?;
                let bits = self.b.ins().ireduce(types::I16, bits);
                Ok(self.bf16_bits_to_f32(bits))
            }
        }
    }

    /// Converts a value of dtype `from` to dtype `to` (`Cast`'s semantics, see the module doc).
    pub(super) fn cast(&mut self, x: Value, from: DType, to: DType) -> Result<Value> {
        if from == to {
            return Ok(x);
        }
        let to_ty = value_ty(to);
        if to == DType::Bool {
            return Ok(if from.is_float() {
                let zero = self.fconst(value_ty(from), 0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
            } else {
                self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0)
            });
        }
        if !from.is_float() {
            if !to.is_float() {
                return Ok(self.resize_int(x, from, to_ty));
            }
            // int/bool -> float: exact widening to i64 first, then one rounding.
            let wide = self.resize_int(x, from, types::I64);
            let f = if is_unsigned(from) {
                self.b.ins().fcvt_from_uint(to_ty, wide)
            } else {
                self.b.ins().fcvt_from_sint(to_ty, wide)
            };
            return if matches!(to, DType::F16 | DType::BF16) {
                self.round_half(f, to)
            } else {
                Ok(f)
            };
        }
        if !to.is_float() {
            // float -> int: saturating, NaN -> 0 (Rust's `as`).
            return Ok(match to_ty.bits() {
                32 | 64 if is_unsigned(to) => self.b.ins().fcvt_to_uint_sat(to_ty, x),
                32 | 64 => self.b.ins().fcvt_to_sint_sat(to_ty, x),
                _ => {
                    let bits = to_ty.bits();
                    let t = if is_unsigned(to) {
                        let t = self.b.ins().fcvt_to_uint_sat(types::I32, x);
                        let max = self.iconst(types::I32, (1i64 << bits) - 1);
                        self.b.ins().umin(t, max)
                    } else {
                        let t = self.b.ins().fcvt_to_sint_sat(types::I32, x);
                        let max = self.iconst(types::I32, (1i64 << (bits - 1)) - 1);
                        let min = self.iconst(types::I32, -(1i64 << (bits - 1)));
                        let t = self.b.ins().smin(t, max);
                        self.b.ins().smax(t, min)
                    };
                    self.b.ins().ireduce(to_ty, t)
                }
            });
        }
        // float -> float.
        Ok(match (from, to) {
            (DType::F64, DType::F32) => self.b.ins().fdemote(types::F32, x),
            (_, DType::F64) => self.b.ins().fpromote(types::F64, x),
            (DType::F64, DType::F16) => {
                let bits = self.call1("rivet_f64_to_f16", &[types::F64], types::I32, &[x])?;
                self.call1("rivet_f16_to_f32", &[types::I32], types::F32, &[bits])?
            }
            (DType::F64, _) => {
                let bits = self.call1("rivet_f64_to_bf16", &[types::F64], types::I32, &[x])?;
                let bits = self.b.ins().ireduce(types::I16, bits);
                self.bf16_bits_to_f32(bits)
            }
            // float16/bfloat16 values are already f32.
            (_, DType::F32) => x,
            (_, _) => self.round_half(x, to)?,
        })
    }
}
