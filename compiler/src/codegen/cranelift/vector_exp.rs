//! float32 `exp` on four packed lanes, inline: `codegen::cpu_lib::exp32::fast` (rivet's float32 `exp`)
//! written as Cranelift f32x4 instructions, so a vectorized loop computing `exp` keeps its
//! values in registers instead of spilling them around a call per four lanes.
//!
//! Invariant: the fast block performs exactly the float32 operations of `exp32::fast`, in the
//! same order (Cranelift never contracts a multiply and an add), so its lanes equal the
//! scalar `exp32`'s. A vector with a lane outside the fast range (`FAST_LO < x < FAST_HI`,
//! false for NaN) sends all four to `rivet_expf4` (a cold block), which runs `exp32` per lane.
//! Its constants are loaded from a static pool at each use (`POOL`: why there).
//! float32 `erf` (libm's four branches and two `expf`s per lane) is one call of `rivet_erff4`
//! per four lanes (`codegen::cpu_lib::erff4`), `slot_call`; a 16-lane float32 `erf` (the CPU's
//! vectorize pass gives erf loops 16 lanes) one call of `rivet_erff16`, `erf16_lanes`.

use super::expr::flags;
use super::FnGen;
use crate::codegen::cpu_lib::exp32;
use crate::error::{Error, Result};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::types::{F32X4, I32, I32X4, I64};
use cranelift_codegen::ir::Type;
use cranelift_codegen::ir::{BlockArg, Endianness, InstBuilder, MemFlagsData, Value};

/// Four lanes of one 32-bit pattern, 16-byte aligned (a `movups`/`movaps` operand).
#[repr(C, align(16))]
struct Lanes([u32; 4]);

/// Every 32-bit constant `packed_expf` uses, splatted. Loaded from here at each use rather
/// than built with `splat`: Cranelift hoists a `splat` of a constant out of the loop, and
/// with fourteen of them live across the loop body regalloc2 spilled them and stored every
/// one back to its slot on the back edge (13 stores and 14 reloads per four lanes, seen in
/// the disassembly of softmax's exp loop). A load that is not `can_move` stays where it is
/// and x64 folds it into its single use as a memory operand.
static POOL: [Lanes; 13] = {
    const fn f(v: f32) -> Lanes {
        Lanes([v.to_bits(); 4])
    }
    [
        f(exp32::FAST_LO),
        f(exp32::FAST_HI),
        f(exp32::INV_LN2),
        f(exp32::MAGIC),
        f(exp32::LN2_HI),
        f(exp32::LN2_LO),
        f(exp32::C[0]),
        f(exp32::C[1]),
        f(exp32::C[2]),
        f(exp32::C[3]),
        f(exp32::C[4]),
        f(1.0),
        Lanes([exp32::SCALE_BIAS as u32; 4]),
    ]
};

impl FnGen<'_, '_> {
    /// A 128-bit vector of type `ty` with every 32-bit lane `bits`, loaded from `POOL` (see
    /// there why not a `splat`).
    fn pooled_splat(&mut self, ty: Type, bits: u32) -> Result<Value> {
        let k = POOL.iter().position(|l| l.0[0] == bits).ok_or_else(|| {
            Error::Internal(format!("constant {bits:#x} missing from the exp pool"))
        })?;
        // The pool's address as an immediate: JIT code lives in this process (modules save
        // the loop IR, never machine code), and the static never moves.
        let base = self.b.ins().iconst(I64, POOL.as_ptr() as i64);
        let fl = MemFlagsData::new()
            .with_endianness(Endianness::Little)
            .with_notrap()
            .with_aligned()
            .with_readonly();
        Ok(self.b.ins().load(ty, fl, base, (k * 16) as i32))
    }

    /// `exp` of the four float32 lanes of `x` (an `F32X4` value): `exp32::fast` lane by lane
    /// when every lane is in its fast range, else `exp32` per lane in a cold call.
    pub(super) fn packed_expf(&mut self, x: Value) -> Result<Value> {
        let le = MemFlagsData::new().with_endianness(Endianness::Little);
        let cf = |g: &mut Self, v: f32| g.pooled_splat(F32X4, v.to_bits());
        // `FAST_LO < x < FAST_HI` in every lane (false for NaN), as `exp32` tests it.
        let lo = cf(self, exp32::FAST_LO)?;
        let hi = cf(self, exp32::FAST_HI)?;
        let above = self.b.ins().fcmp(FloatCC::GreaterThan, x, lo);
        let below = self.b.ins().fcmp(FloatCC::LessThan, x, hi);
        let fast_lanes = self.b.ins().band(above, below);
        let all_fast = self.b.ins().vall_true(fast_lanes);

        let fast = self.b.create_block();
        let slow = self.b.create_block();
        let join = self.b.create_block();
        let out = self.b.append_block_param(join, F32X4);
        self.b.ins().brif(all_fast, fast, &[], slow, &[]);
        self.b.seal_block(fast);
        self.b.seal_block(slow);
        self.b.set_cold_block(slow);

        // `exp32::fast`, operation for operation.
        self.b.switch_to_block(fast);
        let inv_ln2 = cf(self, exp32::INV_LN2)?;
        let t = self.b.ins().fmul(x, inv_ln2);
        let magic = cf(self, exp32::MAGIC)?;
        let t = self.b.ins().fadd(t, magic);
        let magic = cf(self, exp32::MAGIC)?;
        let kf = self.b.ins().fsub(t, magic);
        let ln2_hi = cf(self, exp32::LN2_HI)?;
        let khi = self.b.ins().fmul(kf, ln2_hi);
        let r = self.b.ins().fsub(x, khi);
        let ln2_lo = cf(self, exp32::LN2_LO)?;
        let klo = self.b.ins().fmul(kf, ln2_lo);
        let r = self.b.ins().fsub(r, klo);
        let c4 = cf(self, exp32::C[4])?;
        let mut p = self.b.ins().fmul(c4, r);
        for k in (0..4).rev() {
            let cv = cf(self, exp32::C[k])?;
            p = self.b.ins().fadd(p, cv);
            if k > 0 {
                p = self.b.ins().fmul(p, r);
            }
        }
        let rr = self.b.ins().fmul(r, r);
        let rrp = self.b.ins().fmul(rr, p);
        let q = self.b.ins().fadd(r, rrp);
        let one = cf(self, 1.0)?;
        let y = self.b.ins().fadd(one, q);
        // 2^k: t's bits plus SCALE_BIAS, shifted into the exponent field.
        let tb = self.b.ins().bitcast(I32X4, le, t);
        let bias = self.pooled_splat(I32X4, exp32::SCALE_BIAS as u32)?;
        let e = self.b.ins().iadd(tb, bias);
        let e = self.b.ins().ishl_imm_u(e, 23);
        let scale = self.b.ins().bitcast(F32X4, le, e);
        let y = self.b.ins().fmul(y, scale);
        self.b.ins().jump(join, &[BlockArg::Value(y)]);

        self.b.switch_to_block(slow);
        let y = self.slot_call("rivet_expf4", &[x])?[0];
        self.b.ins().jump(join, &[BlockArg::Value(y)]);

        self.b.seal_block(join);
        self.b.switch_to_block(join);
        Ok(out)
    }

    /// `helper(values)` for a helper of signature `(ptr) -> i32` that replaces, in place, the
    /// values laid out one after the other in a stack slot (`rivet_expf4` / `rivet_erff4`: one
    /// f32x4; `rivet_expf16` / `rivet_erff16`: four f32x4 or sixteen f32): each value stored
    /// at its offset, one call, each reloaded with its own type.
    pub(super) fn slot_call(
        &mut self,
        helper: &'static str,
        values: &[Value],
    ) -> Result<Vec<Value>> {
        let tys: Vec<_> = values
            .iter()
            .map(|v| self.b.func.dfg.value_type(*v))
            .collect();
        let bytes: u32 = tys.iter().map(|t| t.bytes()).sum();
        let slot = self
            .b
            .create_sized_stack_slot(cranelift_codegen::ir::StackSlotData::new(
                cranelift_codegen::ir::StackSlotKind::ExplicitSlot,
                bytes,
                6,
            ));
        let ptr = self.b.ins().stack_addr(super::PTR, slot, 0);
        let mut off = 0i32;
        for v in values {
            self.b.ins().store(flags(), *v, ptr, off);
            off += self.b.func.dfg.value_type(*v).bytes() as i32;
        }
        self.call1(helper, &[super::PTR], I32, &[ptr])?;
        let mut off = 0i32;
        Ok(tys
            .into_iter()
            .map(|t| {
                let v = self.b.ins().load(t, flags(), ptr, off);
                off += t.bytes() as i32;
                v
            })
            .collect())
    }

    /// The sixteen float32 `erf`s of `a`'s lanes (`a` has `WIDE_LANES` lanes, computed lane by
    /// lane): one `rivet_erff16` call (`codegen::cpu_lib::erff16`, AVX-512 where the CPU has it),
    /// libm's bits.
    pub(super) fn erf16_lanes(&mut self, a: &crate::ir::Expr) -> Result<Vec<Value>> {
        let lanes = (0..crate::lower::vectorize::WIDE_LANES)
            .map(|l| self.lane(a, l))
            .collect::<Result<Vec<_>>>()?;
        self.slot_call("rivet_erff16", &lanes)
    }
}
