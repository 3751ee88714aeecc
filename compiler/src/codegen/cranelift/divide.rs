//! Integer division and remainder of the generated code, with the interpreter's meaning:
//! unsigned `//` and `%` with 0 for a zero divisor; signed ones floored as Python's, 0 for a
//! zero divisor, wrapping `MIN // -1`; no division ever traps. A constant divisor `d > 0` (tile
//! counts, loop bounds) gets a shorter sequence, a shift or a mask for powers of two: less
//! CLIF for Cranelift to fold on every build.

use super::FnGen;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{InstBuilder, Value};

impl FnGen<'_, '_> {
    /// Unsigned `//` or `%` (floor = truncation); divisor 0 gives 0.
    pub(super) fn udivmod(&mut self, x: Value, y: Value, rem: bool) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        let zero = self.iconst(ty, 0);
        let one = self.iconst(ty, 1);
        let is0 = self.b.ins().icmp(IntCC::Equal, y, zero);
        let safe = self.b.ins().select(is0, one, y);
        if rem {
            // x % 1 == 0: already the result for a zero divisor.
            self.b.ins().urem(x, safe)
        } else {
            let q = self.b.ins().udiv(x, safe);
            self.b.ins().select(is0, zero, q)
        }
    }

    /// The divisor with 0 and -1 replaced by 1 (so `sdiv`/`srem` cannot trap), and the flags
    /// `y == 0`, `y == -1`.
    fn safe_sdivisor(&mut self, y: Value) -> (Value, Value, Value) {
        let ty = self.b.func.dfg.value_type(y);
        let zero = self.iconst(ty, 0);
        let one = self.iconst(ty, 1);
        let m1 = self.iconst(ty, -1);
        let is0 = self.b.ins().icmp(IntCC::Equal, y, zero);
        let ism1 = self.b.ins().icmp(IntCC::Equal, y, m1);
        let bad = self.b.ins().bor(is0, ism1);
        (self.b.ins().select(bad, one, y), is0, ism1)
    }

    /// `r != 0 && sign(r) != sign(y)`: the truncated quotient must be floored.
    fn needs_floor(&mut self, r: Value, y: Value) -> Value {
        let ty = self.b.func.dfg.value_type(r);
        let zero = self.iconst(ty, 0);
        let rnz = self.b.ins().icmp(IntCC::NotEqual, r, zero);
        let xor = self.b.ins().bxor(r, y);
        let differ = self.b.ins().icmp(IntCC::SignedLessThan, xor, zero);
        self.b.ins().band(rnz, differ)
    }

    /// The constant `v` holds when it is a scalar `iconst` of this function (sign-extended
    /// from its type's width), else `None`.
    pub(super) fn scalar_const(&self, v: Value) -> Option<i64> {
        use cranelift_codegen::ir::{InstructionData, Opcode, ValueDef};
        let dfg = &self.b.func.dfg;
        let ty = dfg.value_type(v);
        if ty.is_vector() || !ty.is_int() || ty.bits() > 64 {
            return None;
        }
        let ValueDef::Result(inst, 0) = dfg.value_def(v) else {
            return None;
        };
        let InstructionData::UnaryImm {
            opcode: Opcode::Iconst,
            imm,
        } = dfg.insts[inst]
        else {
            return None;
        };
        let shift = 64 - ty.bits();
        Some((imm.bits() << shift) >> shift)
    }

    /// `x // d` and `x % d` for a constant divisor `d > 0` (loop bounds and tile counts, such as
    /// `(n - 1) // 12`): no zero or -1 divisor to guard, and the remainder is negative exactly
    /// when the quotient must be floored. A power of two is an arithmetic shift or a mask,
    /// which floor as Python does. The general sequence gave Cranelift four times the
    /// instructions to fold away, on every build. `None` when `y` is no such constant.
    fn const_floor_divmod(&mut self, x: Value, y: Value, rem: bool) -> Option<Value> {
        let d = self.scalar_const(y).filter(|&d| d > 0)?;
        let ty = self.b.func.dfg.value_type(x);
        if d.count_ones() == 1 {
            let k = i64::from(d.trailing_zeros());
            return Some(if rem {
                self.b.ins().band_imm_s(x, d - 1)
            } else if k == 0 {
                x
            } else {
                self.b.ins().sshr_imm_s(x, k)
            });
        }
        let r = self.b.ins().srem(x, y);
        let zero = self.iconst(ty, 0);
        let neg = self.b.ins().icmp(IntCC::SignedLessThan, r, zero);
        Some(if rem {
            let ry = self.b.ins().iadd(r, y);
            self.b.ins().select(neg, ry, r)
        } else {
            let q = self.b.ins().sdiv(x, y);
            let qm1 = self.b.ins().iadd_imm_s(q, -1);
            self.b.ins().select(neg, qm1, q)
        })
    }

    /// Python `x // y` on signed ints: 0 for y == 0, `-x` (wrapping) for y == -1.
    pub(super) fn sfloordiv(&mut self, x: Value, y: Value) -> Value {
        if let Some(q) = self.const_floor_divmod(x, y, false) {
            return q;
        }
        let ty = self.b.func.dfg.value_type(x);
        let (safe, is0, ism1) = self.safe_sdivisor(y);
        let q = self.b.ins().sdiv(x, safe);
        let r = self.b.ins().srem(x, safe);
        let adj = self.needs_floor(r, y);
        let qm1 = self.b.ins().iadd_imm_s(q, -1);
        let q = self.b.ins().select(adj, qm1, q);
        let zero = self.iconst(ty, 0);
        let q = self.b.ins().select(is0, zero, q);
        let neg = self.b.ins().ineg(x);
        self.b.ins().select(ism1, neg, q)
    }

    /// Python `x % y` on signed ints (the result takes y's sign); 0 for y == 0 and y == -1.
    pub(super) fn sfloormod(&mut self, x: Value, y: Value) -> Value {
        if let Some(r) = self.const_floor_divmod(x, y, true) {
            return r;
        }
        let (safe, _, _) = self.safe_sdivisor(y);
        // With the divisor replaced by 1, r is 0: the right result for y == 0 and y == -1.
        let r = self.b.ins().srem(x, safe);
        let adj = self.needs_floor(r, y);
        let ry = self.b.ins().iadd(r, y);
        self.b.ins().select(adj, ry, r)
    }
}
