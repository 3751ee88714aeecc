//! float32 `exp` on four packed lanes, inline: `codegen::expf4`'s SSE2 sequence (libm's
//! `expf`, bit for bit) written as Cranelift instructions, so a vectorized loop computing `exp`
//! keeps its values in registers instead of spilling them around a call per four lanes.
//!
//! Invariant: the fast block performs exactly the float32 operations of `expf4::sse2`, in the
//! same order (Cranelift never contracts a multiply and an add), so its lanes equal libm's
//! `expf`. Lanes outside libm's main range (`|x| <= 2^-14`, `|x| >= 87.3`, NaN, infinities)
//! send all four to `rivet_expf4` (a cold block), which falls back to the scalar function.
//! float32 `erf` (libm's four branches and two `expf`s per lane) is one call of `rivet_erff4`
//! per four lanes (`codegen::erff4`), `slot_call`; a 16-lane float32 `erf` (the CPU's
//! vectorize pass gives erf loops 16 lanes) one call of `rivet_erff16`, `erf16_lanes`.

use super::expr::flags;
use super::FnGen;
use crate::error::Result;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32X4, I32, I32X4};
use cranelift_codegen::ir::{BlockArg, Endianness, InstBuilder, MemFlagsData, Value};

impl FnGen<'_, '_> {
    /// `exp` of the four float32 lanes of `x` (an `F32X4` value).
    pub(super) fn packed_expf(&mut self, x: Value) -> Result<Value> {
        // libm's constants, by their bits (as in `expf4`).
        const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
        const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
        const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
        const P1: f32 = 1.666_662_5e-1;
        const P2: f32 = -2.766_733_3e-3;
        let le = MemFlagsData::new().with_endianness(Endianness::Little);
        let ci = |g: &mut Self, v: u32| {
            let c = g.b.ins().iconst(I32, i64::from(v));
            g.b.ins().splat(I32X4, c)
        };
        let cf = |g: &mut Self, v: f32| {
            let c = g.b.ins().f32const(v);
            g.b.ins().splat(F32X4, c)
        };
        let bits = self.b.ins().bitcast(I32X4, le, x);
        let abs_mask = ci(self, 0x7fff_ffff);
        let hx = self.b.ins().band(bits, abs_mask);
        let tiny = ci(self, 0x3900_0000);
        let huge = ci(self, 0x42ae_ac50);
        let above = self.b.ins().icmp(IntCC::SignedGreaterThan, hx, tiny);
        let below = self.b.ins().icmp(IntCC::SignedLessThan, hx, huge);
        let main = self.b.ins().band(above, below);
        let all_main = self.b.ins().vall_true(main);

        let fast = self.b.create_block();
        let slow = self.b.create_block();
        let join = self.b.create_block();
        let out = self.b.append_block_param(join, F32X4);
        self.b.ins().brif(all_main, fast, &[], slow, &[]);
        self.b.seal_block(fast);
        self.b.seal_block(slow);
        self.b.set_cold_block(slow);

        self.b.switch_to_block(fast);
        let sign = self.b.ins().ushr_imm_u(bits, 31);
        // |x| > 1.5 ln2: k = trunc(INV_LN2 * x + (sign ? -0.5 : 0.5)).
        let sign_bit = self.b.ins().ishl_imm_u(sign, 31);
        let half_bits = ci(self, 0.5f32.to_bits());
        let half = self.b.ins().bor(half_bits, sign_bit);
        let half = self.b.ins().bitcast(F32X4, le, half);
        let inv_ln2 = cf(self, INV_LN2);
        let t = self.b.ins().fmul(inv_ln2, x);
        let t = self.b.ins().fadd(t, half);
        // k is computed as a float (what libm converts it to next), with no float-to-int
        // conversion: `fcvt_to_sint_sat` of a vector expands to a dozen instructions on x64.
        // trunc(t) is exact (`roundps` with SSE4.1) and equals `(t as i32) as f32` here.
        let k_big = self.b.ins().trunc(t);
        let k_big = self.b.ins().bitcast(I32X4, le, k_big);
        // 0.5 ln2 < |x| <= 1.5 ln2: k = 1 - 2 sign, i.e. +-1.0; below: k = 0 (+0.0).
        let one_bits = ci(self, 1.0f32.to_bits());
        let k_mid = self.b.ins().bor(one_bits, sign_bit);
        let big_at = ci(self, 0x3f85_1592);
        let mid_at = ci(self, 0x3eb1_7218);
        let big = self.b.ins().icmp(IntCC::SignedGreaterThan, hx, big_at);
        let mid = self.b.ins().icmp(IntCC::SignedGreaterThan, hx, mid_at);
        let k_mid = self.b.ins().band(mid, k_mid);
        let kf = self.b.ins().bitselect(big, k_big, k_mid);
        let kf = self.b.ins().bitcast(F32X4, le, kf);
        // k as an integer: kf + 1.5 * 2^23 is exact for |k| < 2^22 and holds k in the low bits
        // of its significand.
        let magic = cf(self, 12_582_912.0);
        let km = self.b.ins().fadd(kf, magic);
        let km = self.b.ins().bitcast(I32X4, le, km);
        let magic_bits = ci(self, 0x4b40_0000);
        let k = self.b.ins().isub(km, magic_bits);
        // With k = 0 these give hi = x, lo = 0, r = x exactly, as libm's small branch.
        let ln2_hi = cf(self, LN2_HI);
        let ln2_lo = cf(self, LN2_LO);
        let khi = self.b.ins().fmul(kf, ln2_hi);
        let hi = self.b.ins().fsub(x, khi);
        let lo = self.b.ins().fmul(kf, ln2_lo);
        let r = self.b.ins().fsub(hi, lo);
        let rr = self.b.ins().fmul(r, r);
        let p1 = cf(self, P1);
        let p2 = cf(self, P2);
        let poly = self.b.ins().fmul(rr, p2);
        let poly = self.b.ins().fadd(p1, poly);
        let c = self.b.ins().fmul(rr, poly);
        let c = self.b.ins().fsub(r, c);
        let num = self.b.ins().fmul(r, c);
        let two = cf(self, 2.0);
        let den = self.b.ins().fsub(two, c);
        let q = self.b.ins().fdiv(num, den);
        let one = cf(self, 1.0);
        let y = self.b.ins().fsub(q, lo);
        let y = self.b.ins().fadd(y, hi);
        let y = self.b.ins().fadd(one, y);
        // scalbnf(y, k) = y * 2^k for |k| <= 126; k = 0 multiplies by 1.
        let bias = ci(self, 127);
        let e = self.b.ins().iadd(k, bias);
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
    /// lane): one `rivet_erff16` call (`codegen::erff16`, AVX-512 where the CPU has it),
    /// libm's bits.
    pub(super) fn erf16_lanes(&mut self, a: &crate::ir::Expr) -> Result<Vec<Value>> {
        let lanes = (0..crate::lower::vectorize::WIDE_LANES)
            .map(|l| self.lane(a, l))
            .collect::<Result<Vec<_>>>()?;
        self.slot_call("rivet_erff16", &lanes)
    }
}
