//! Idiom: a 4-lane vector loop whose body only stores `exp(X[j] - s)` (or `exp(X[j])`) into
//! `Y[j]`, both contiguous and float32, becomes one call of `rivet_exp_run` over the whole run
//! (`codegen::cpu_lib::exp32::exp_sub_run`: sixteen lanes per AVX-512 instruction) where
//! `exp32::run_wide()` says the CPU has AVX-512 — softmax's exponentials, which Cranelift's
//! 128-bit vectors computed at a quarter of the machine's width.
//!
//! Why this is the same computation: the loop `for v in [lo, lo + n)` stores lane `l` of
//! iteration `v` at `Y[base_y(v) + l]` from `X[base_x(v) + l]` with `base(v) = base(lo) + 4 (v -
//! lo)`, so the iterations cover exactly `4 n` consecutive elements from `base(lo)`, the same
//! elements the call reads and writes, in the same order of chunks; each element gets
//! `exp32(x - s)` with the float32 subtraction first, as the vector code computes it (`exp(x)`
//! is called with `s = +0.0`: `x - 0.0` is `x`, NaN stays NaN). `s` is a broadcast, so the
//! vectorize pass made it loop-invariant, and no buffer the loop writes is read at another
//! index (its rule), so `X` is `Y` only at the same base: in place. `s` is evaluated only when
//! the loop runs at least once, as the loop would (it may load memory).

use super::FnGen;
use crate::arith::simplify::simplify;
use crate::codegen::cpu_lib::exp32;
use crate::error::Result;
use crate::ir::expr::{BinOp, BufId, Expr, ExprKind, UnOp, Var};
use crate::ir::stmt::Stmt;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32, I64};
use cranelift_codegen::ir::InstBuilder;
use rivet_runtime::DType;

/// A loop the idiom applies to: `Y[ramp(y_base, 1, 4)] = exp(X[ramp(x_base, 1, 4)] - s)`.
pub(super) struct ExpRun {
    y: BufId,
    y_base: Expr,
    x: BufId,
    x_base: Expr,
    s: Option<Expr>,
}

/// `ramp(base, 1, 4)` with `base = 4 * var + rest` (rest free of `var`): `base`.
fn contiguous(index: &[Expr], var: &Var) -> Option<Expr> {
    let [ix] = index else { return None };
    let ExprKind::Ramp {
        base,
        stride,
        lanes: 4,
    } = ix.kind()
    else {
        return None;
    };
    if stride.as_int() != Some(1) {
        return None;
    }
    // base(v + 1) - base(v) must be exactly 4.
    let v = Expr::var(var);
    let step = simplify(
        &base
            .substitute(&|x| (x == var).then(|| v.add(&Expr::int(1))))
            .sub(base),
    );
    (step.as_int() == Some(4)).then(|| base.clone())
}

/// The idiom in `for var: body`, if `body` is exactly it (module doc) and the CPU runs it wide.
pub(super) fn matches(var: &Var, body: &Stmt) -> Option<ExpRun> {
    let Stmt::Store {
        buf: y,
        indices,
        value,
    } = body
    else {
        return None;
    };
    if value.dtype() != DType::F32 || value.lanes() != 4 {
        return None;
    }
    let y_base = contiguous(indices, var)?;
    let ExprKind::Unary(UnOp::Exp, arg) = value.kind() else {
        return None;
    };
    let (load, s) = match arg.kind() {
        ExprKind::Binary(BinOp::Sub, a, b) => match b.kind() {
            ExprKind::Broadcast { value: s, lanes: 4 } if !s.uses(var) => (a, Some(s.clone())),
            _ => return None,
        },
        _ => (arg, None),
    };
    let ExprKind::Load { buf: x, indices } = load.kind() else {
        return None;
    };
    let x_base = contiguous(indices, var)?;
    if x == y && simplify(&x_base.sub(&y_base)).as_int() != Some(0) {
        return None;
    }
    if !exp32::run_wide() {
        return None;
    }
    Some(ExpRun {
        y: *y,
        y_base,
        x: *x,
        x_base,
        s,
    })
}

impl FnGen<'_, '_> {
    /// `for var in [min, min + extent)` over `run`'s store, as one call (module doc).
    pub(super) fn exp_run(
        &mut self,
        var: &Var,
        min: &Expr,
        extent: &Expr,
        run: &ExpRun,
    ) -> Result<()> {
        let ext = self.expr(extent)?;
        let ext = self.index_i64(ext, extent.dtype());
        let go = self.b.create_block();
        let done = self.b.create_block();
        let any = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, ext, 0);
        self.b.ins().brif(any, go, &[], done, &[]);
        self.b.seal_block(go);
        self.b.switch_to_block(go);
        let at_min = |e: &Expr| e.substitute(&|x| (x == var).then(|| min.clone()));
        let (y, _) = self.address(run.y, &[at_min(&run.y_base)])?;
        let (x, _) = self.address(run.x, &[at_min(&run.x_base)])?;
        let s = match &run.s {
            Some(s) => self.expr(s)?,
            None => self.b.ins().f32const(0.0),
        };
        // 4 * extent elements: the extent is at most an element count over 4 (the loop's
        // accesses were proven), so this cannot overflow.
        let n = self.b.ins().imul_imm_s(ext, 4);
        self.call("rivet_exp_run", &[I64, I64, I64, F32], &[], &[y, x, n, s])?;
        self.b.ins().jump(done, &[]);
        self.b.seal_block(done);
        self.b.switch_to_block(done);
        Ok(())
    }
}
