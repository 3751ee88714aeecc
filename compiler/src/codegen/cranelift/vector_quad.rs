//! Sixteen-lane float32 vectors as four packed f32x4 registers ("quads"): what the CPU's
//! vectorize pass makes of a float32 loop computing `exp` or `erf` on an AVX-512 machine
//! (`lower::vectorize`'s wide lanes), so that one AVX-512 call computes the function for
//! sixteen lanes (`rivet_erff16`: libm's bits, `codegen::cpu_lib::erff16`; `exp` inline on each
//! quarter, `vector_exp.rs`) while the rest of the loop body stays packed SSE code.
//!
//! A 16-lane float32 expression is a quad when every node under it is: a broadcast, a
//! contiguous load (four 16-byte loads), float `+ - * /`, `min` / `max` (`packed_minmax`),
//! negation, `abs`, `sqrt`, `exp`, `erf`. Each part is computed exactly as the 4-lane packed
//! code computes its lanes (IEEE operations lane by lane), so the bits are the scalar code's.
//! Anything else is computed lane by lane (`vector.rs`).

use super::expr::flags;
use super::FnGen;
use crate::error::{Error, Result};
use crate::ir::{BinOp, BufId, Expr, ExprKind, UnOp};
use cranelift_codegen::ir::types::F32X4;
use cranelift_codegen::ir::{InstBuilder, Value};
use rivet_runtime::DType;

/// Lanes of a quad.
const QUAD_LANES: u32 = 16;

/// True when `e` is computed as four packed f32x4 values (module header).
pub(super) fn quad(e: &Expr) -> bool {
    if e.dtype() != DType::F32 || e.lanes() != QUAD_LANES {
        return false;
    }
    match e.kind() {
        ExprKind::Broadcast { .. } => true,
        ExprKind::Load { indices, .. } => {
            indices.len() == 1
                && matches!(indices[0].kind(), ExprKind::Ramp { stride, .. } if stride.as_int() == Some(1))
        }
        ExprKind::Binary(
            BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Min | BinOp::Max,
            a,
            b,
        ) => quad(a) && quad(b),
        ExprKind::Unary(UnOp::Neg | UnOp::Abs | UnOp::Sqrt | UnOp::Exp | UnOp::Erf, a) => quad(a),
        _ => false,
    }
}

impl FnGen<'_, '_> {
    /// `buf[ramp(base, 1, 16)] = value` for a quad `value`: four 16-byte stores.
    pub(super) fn quad_store(&mut self, buf: BufId, base: &Expr, value: &Expr) -> Result<()> {
        let parts = self.quad_value(value)?;
        let (addr, _) = self.offset_address(buf, base)?;
        for (k, p) in parts.iter().enumerate() {
            self.b.ins().store(flags(), *p, addr, (16 * k) as i32);
        }
        Ok(())
    }

    /// The four f32x4 parts of a quad (`quad(e)` holds), memoized per statement.
    fn quad_value(&mut self, e: &Expr) -> Result<[Value; 4]> {
        let ptr = std::sync::Arc::as_ptr(&e.0) as usize;
        // Keys below `vector.rs`'s (`u32::MAX` and `u32::MAX - 1`).
        let key = |k: usize| (ptr, u32::MAX - 8 - k as u32);
        if let Some(v0) = self.vmemo.get(&key(0)) {
            let mut out = [*v0; 4];
            for (k, o) in out.iter_mut().enumerate().skip(1) {
                *o = self.vmemo[&key(k)];
            }
            return Ok(out);
        }
        let out: [Value; 4] = match e.kind() {
            ExprKind::Broadcast { value, .. } => {
                let x = self.scalar(value)?;
                let v = self.b.ins().splat(F32X4, x);
                [v; 4]
            }
            ExprKind::Load { buf, indices } => {
                let ExprKind::Ramp { base, .. } = indices[0].kind() else {
                    return Err(Error::Internal(format!("quad load of a gather: {e}")));
                };
                let (addr, _) = self.offset_address(*buf, base)?;
                std::array::from_fn(|k| self.b.ins().load(F32X4, flags(), addr, (16 * k) as i32))
            }
            ExprKind::Binary(op, a, b) => {
                let (x, y) = (self.quad_value(a)?, self.quad_value(b)?);
                let mut out = x;
                for k in 0..4 {
                    out[k] = match op {
                        BinOp::Add => self.b.ins().fadd(x[k], y[k]),
                        BinOp::Sub => self.b.ins().fsub(x[k], y[k]),
                        BinOp::Mul => self.b.ins().fmul(x[k], y[k]),
                        BinOp::Div => self.b.ins().fdiv(x[k], y[k]),
                        BinOp::Max => self.packed_minmax(true, x[k], y[k], DType::F32),
                        BinOp::Min => self.packed_minmax(false, x[k], y[k], DType::F32),
                        _ => return Err(Error::Internal(format!("quad {op:?}"))),
                    };
                }
                out
            }
            // exp inline on each quarter (`vector_exp.rs`), erf one 16-lane call.
            ExprKind::Unary(UnOp::Exp, a) => {
                let x = self.quad_value(a)?;
                let mut out = x;
                for k in 0..4 {
                    out[k] = self.packed_expf(x[k])?;
                }
                out
            }
            ExprKind::Unary(UnOp::Erf, a) => {
                let x = self.quad_value(a)?;
                let y = self.slot_call("rivet_erff16", &x)?;
                [y[0], y[1], y[2], y[3]]
            }
            ExprKind::Unary(op, a) => {
                let x = self.quad_value(a)?;
                let mut out = x;
                for k in 0..4 {
                    out[k] = match op {
                        UnOp::Neg => self.b.ins().fneg(x[k]),
                        UnOp::Abs => self.b.ins().fabs(x[k]),
                        UnOp::Sqrt => self.b.ins().sqrt(x[k]),
                        _ => return Err(Error::Internal(format!("quad {op:?}"))),
                    };
                }
                out
            }
            _ => return Err(Error::Internal(format!("not a quad expression: {e}"))),
        };
        for (k, v) in out.iter().enumerate() {
            self.vmemo.insert(key(k), *v);
        }
        Ok(out)
    }
}
