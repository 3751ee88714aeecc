//! Pass: the bounds proof. Every `Load`/`Store` index of every dimension is bounded by
//! interval analysis (loop ranges, `let`s, guards of enclosing `if`s) and compared with the
//! buffer's extent:
//! - proven for all values of the symbolic dims: nothing to do;
//! - refuted by constants: a `CompileError` naming the tensor, the index expression and
//!   the extent (static shapes never reach run time with a possible out-of-bounds access);
//! - unknown but expressible over the dims alone: a `Check` evaluated once per call, before
//!   any code runs (it holds vacuously when an enclosing loop is empty, or when a guard over
//!   the dims alone that the access sits under is false: `if_then_else(k >= 1, Z[0], ..)`
//!   with `Z` of extent `k` reads `Z[0]` only where `k >= 1`, so `k = 0` is no error);
//! - not boundable at all: a `CompileError`.
//!
//! Interval arithmetic reasons about exact integers, while generated code computes int64 with
//! wrapping. So the proof also obliges every int64 node it relies on — each node of an index,
//! of a loop's bounds (and `min + extent`, the loop's end), of a `let` value, and each operand
//! of an int64 comparison in a condition — to stay within int64: the node's interval (before
//! guards about the node itself) must lie in `[i64::MIN, i64::MAX]`. Endpoints that hold for
//! every shape (`checked::static_range`) cost nothing; constant ones that overflow are a
//! `CompileError`; ones over the symbolic dims become per-call `Check`s decided exactly; any
//! other is a `CompileError`. With no node wrapping, the proof's integers are the program's.
//!
//! Runs before simplification, so guards still match the index expressions structurally.

use crate::arith::exact::{always_in_i64, eval_exact, evaluable};
use crate::arith::interval::{interval, prove_le, Env, Interval, Record};
use crate::arith::simplify::simplify;
use crate::error::{Error, Result};
use crate::ir::expr::{CmpOp, Expr, ExprKind, LogicOp, UnOp, Var};
use crate::ir::intrin::{model, Intrin, Region};
use crate::ir::stmt::{Check, PrimFunc, Stmt};
use crate::ir::verify::intrin::check_call;
use crate::ir::BufId;
use rivet_runtime::DType;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

struct Prover<'a> {
    func: &'a PrimFunc,
    dims: HashSet<Var>,
    checks: Vec<Check>,
    /// Messages of `checks` with the loop extents that make each vacuous, to add each check
    /// once. The same message from another loop nest is another check: in one nest an empty
    /// loop skips the access, in the other it does not (soak finding 0x436a3da40ee8a398).
    seen: HashMap<String, Vec<Vec<Expr>>>,
    /// Extents of the enclosing loops (a check is vacuous when one of them is empty).
    loop_extents: Vec<Expr>,
    /// Conditions over the dims alone that the code being proved runs under (an `if`'s test
    /// for its `then`, a select's for its arm, `&&`'s left operand for its right one): a
    /// check is vacuous when one of them is false, since the access is then never made.
    guards: Vec<Expr>,
    record: Record,
}

impl Prover<'_> {
    fn only_dims(&self, e: &Expr) -> bool {
        let mut ok = true;
        e.visit(&mut |n| {
            if let Some(v) = n.as_var() {
                ok &= self.dims.contains(v);
            }
        });
        ok
    }

    /// The extents of the enclosing loops that depend on dims only (each once): when one of
    /// them is below 1 the code inside never runs.
    fn vacuous_extents(&self) -> Vec<Expr> {
        let mut out: Vec<Expr> = Vec::new();
        for e in &self.loop_extents {
            if self.only_dims(e) && e.as_int().is_none() && !out.contains(e) {
                out.push(e.clone());
            }
        }
        out
    }

    fn add_check(&mut self, cond: Expr, message: String) {
        let extents = self.vacuous_extents();
        let mut key = extents.clone();
        key.extend(self.guards.iter().cloned());
        let known = self.seen.entry(message.clone()).or_default();
        if known.contains(&key) {
            return;
        }
        known.push(key);
        // `cond`, or true when an enclosing loop of symbolic extent runs zero times or a
        // guard the access sits under is false.
        let mut full = cond;
        for e in extents {
            let empty = e.lt(&Expr::int(1));
            full = Expr::new(ExprKind::Logic(LogicOp::Or, empty, full), DType::Bool);
        }
        for g in self.guards.iter().rev() {
            let unmet = Expr::new(ExprKind::Unary(UnOp::Not, g.clone()), DType::Bool);
            full = Expr::new(ExprKind::Logic(LogicOp::Or, unmet, full), DType::Bool);
        }
        self.checks.push(Check {
            cond: full,
            message,
        });
    }

    /// Runs `f` with `cond` among the guards when it is over the dims alone and int64 / bool
    /// arithmetic a check can evaluate exactly (a guard over loop variables, loads or floats
    /// cannot be evaluated per call, so it adds nothing).
    fn guarded(&mut self, cond: &Expr, f: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        let push = self.only_dims(cond) && evaluable(cond);
        if push {
            self.guards.push(cond.clone());
        }
        let r = f(self);
        if push {
            self.guards.pop();
        }
        r
    }

    /// Turns the intervals recorded since the last call into no-overflow obligations (see the
    /// module header); `what` names the statement or access they come from.
    fn discharge(&mut self, env: &Env, what: &dyn Fn() -> String) -> Result<()> {
        let items: Vec<(Expr, Interval)> = self.record.borrow_mut().drain(..).collect();
        for (node, iv) in items {
            let iv = self.over_dims(iv, env);
            for end in [&iv.lo, &iv.hi] {
                if end.as_int().is_some() || always_in_i64(end, &|v| self.dims.contains(v)) {
                    continue;
                }
                let mut vars = false;
                end.visit(&mut |n| vars |= n.as_var().is_some());
                if !vars {
                    // A constant that did not fold: folding stops at an overflow.
                    if eval_exact(end, &|_| None).is_ok() {
                        continue;
                    }
                    return Err(Error::Compile(format!(
                        "{}: the int64 arithmetic `{node}` overflows (it can reach {end}, outside [{}, {}])",
                        what(),
                        i64::MIN,
                        i64::MAX
                    )));
                }
                if !self.only_dims(end) {
                    return Err(Error::Compile(format!(
                        "{}: rivet cannot prove that the int64 arithmetic `{node}` does not overflow (its range is [{}, {}])",
                        what(),
                        iv.lo,
                        iv.hi
                    )));
                }
                // Decided exactly per call: the evaluation of `end` fails on an overflow.
                let cond = Expr::new(
                    ExprKind::Cmp(CmpOp::Ge, end.clone(), Expr::int(i64::MIN)),
                    DType::Bool,
                );
                self.add_check(
                    cond,
                    format!(
                        "{}: the int64 arithmetic `{node}` would overflow (it can reach {end})",
                        what()
                    ),
                );
            }
        }
        Ok(())
    }

    /// An interval whose endpoints still mention ranged loop variables (fused-loop and region
    /// forms keep them) widened to endpoints over the dims: the low end by its own lowest
    /// value, the high end by its highest.
    fn over_dims(&self, iv: Interval, env: &Env) -> Interval {
        if self.only_dims(&iv.lo) && self.only_dims(&iv.hi) {
            return iv;
        }
        let quiet = Env {
            record: None,
            ..env.clone()
        };
        let widen = |e: &Expr, low: bool| -> Expr {
            if self.only_dims(e) {
                return e.clone();
            }
            match interval(e, &quiet) {
                Some(w) if low => w.lo,
                Some(w) => w.hi,
                None => e.clone(),
            }
        };
        Interval {
            lo: widen(&iv.lo, true),
            hi: widen(&iv.hi, false),
        }
    }

    /// Records the operands of the int64 comparisons in a condition (what `Env::assume` learns
    /// from) and discharges them.
    fn condition(&mut self, c: &Expr, env: &Env) -> Result<()> {
        let mut cmps = Vec::new();
        c.visit(&mut |n| {
            if let ExprKind::Cmp(_, a, b) = n.kind() {
                if a.dtype() == DType::I64 {
                    cmps.push((a.clone(), b.clone()));
                }
            }
        });
        if cmps.is_empty() {
            return Ok(());
        }
        for (a, b) in &cmps {
            interval(a, env);
            interval(b, env);
        }
        self.discharge(env, &|| format!("condition {}", simplify(c)))
    }

    fn access(&mut self, buf: BufId, indices: &[Expr], env: &Env) -> Result<()> {
        let b = self.func.buffer(buf);
        for (d, (i, extent)) in indices.iter().zip(&b.shape).enumerate() {
            let shown = simplify(i);
            let what = || {
                format!(
                    "tensor '{}' dim {d}: index {shown} must lie in [0, {extent})",
                    b.name
                )
            };
            let Some(Interval { lo, hi }) = interval(i, env) else {
                self.record.borrow_mut().clear();
                return Err(Error::Compile(format!(
                    "{}, and rivet cannot bound that index expression",
                    what()
                )));
            };
            self.discharge(env, &what)?;
            let last = simplify(&extent.sub(&Expr::int(1)));
            for (ok, a, c, side) in [
                (
                    prove_le(&Expr::int(0), &lo),
                    Expr::int(0),
                    lo.clone(),
                    "lowest",
                ),
                (prove_le(&hi, &last), hi.clone(), last.clone(), "highest"),
            ] {
                match ok {
                    Some(true) => {}
                    Some(false) => {
                        return Err(Error::Compile(format!(
                            "{}, but its {side} value is {} (out of bounds)",
                            what(),
                            if side == "lowest" { &c } else { &a }
                        )))
                    }
                    None => {
                        let cond = a.lt(&c.add(&Expr::int(1)));
                        let mut vars = false;
                        cond.visit(&mut |n| vars |= n.as_var().is_some());
                        if !vars {
                            // Constants the simplifier left alone (an overflow): decide now.
                            if eval_exact(&cond, &|_| None) == Ok(1) {
                                continue;
                            }
                            return Err(Error::Compile(format!(
                                "{}, but its {side} value {} is out of bounds or overflows int64",
                                what(),
                                if side == "lowest" { &c } else { &a }
                            )));
                        }
                        if !self.only_dims(&cond) {
                            return Err(Error::Compile(format!(
                                "{}, and rivet cannot prove it (its {side} value is {})",
                                what(),
                                if side == "lowest" { &c } else { &a }
                            )));
                        }
                        // Vacuous when an enclosing loop runs zero times.
                        let message = format!(
                            "{} (its {side} value is {})",
                            what(),
                            if side == "lowest" { &c } else { &a }
                        );
                        self.add_check(cond, message);
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks the loads of an expression in evaluation order: an `if_then_else` arm under its
    /// condition (or its negation), the right operand of `&&` / `||` under the left one's
    /// outcome. Backends evaluate exactly what the interpreter does, so a guarded read that
    /// would be out of bounds (padding) is never performed.
    fn exprs(&mut self, e: &Expr, env: &Env) -> Result<()> {
        match e.kind() {
            ExprKind::Load { buf, indices } => {
                self.access(*buf, indices, env)?;
                indices.iter().try_for_each(|i| self.exprs(i, env))
            }
            ExprKind::Select(c, a, b) => {
                self.exprs(c, env)?;
                self.condition(c, env)?;
                let (mut ta, mut tb) = (env.clone(), env.clone());
                ta.assume(c);
                tb.assume(&negate(c));
                self.guarded(c, |p| p.exprs(a, &ta))?;
                self.guarded(&not(c), |p| p.exprs(b, &tb))
            }
            ExprKind::Logic(op, a, b) => {
                self.exprs(a, env)?;
                self.condition(a, env)?;
                let mut tb = env.clone();
                let taken = if *op == LogicOp::And {
                    a.clone()
                } else {
                    not(a)
                };
                tb.assume(&if *op == LogicOp::And {
                    a.clone()
                } else {
                    negate(a)
                });
                self.guarded(&taken, |p| p.exprs(b, &tb))
            }
            _ => {
                let mut r = Ok(());
                let mut first = true;
                // Children only (this node is not a load / select / logic).
                e.map_children(&mut |c| {
                    if first || r.is_ok() {
                        first = false;
                        if r.is_ok() {
                            r = self.exprs(c, env);
                        }
                    }
                    c.clone()
                });
                r
            }
        }
    }

    /// Out of line, so that `stmt`, which recurses per nesting level, keeps a small frame.
    #[inline(never)]
    fn call(
        &mut self,
        intrin: Intrin,
        regions: &[Region],
        scalars: &[Expr],
        env: &Env,
    ) -> Result<()> {
        check_call(self.func, intrin, regions, scalars, false).map_err(Error::Compile)?;
        for e in scalars {
            self.exprs(e, env)?;
        }
        let m = model(self.func, intrin, regions, false);
        self.stmt(&m, env)
    }

    fn stmt(&mut self, s: &Stmt, env: &Env) -> Result<()> {
        match s {
            Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } => {
                // A loop that never runs has nothing to prove (and its variable's range is empty).
                if simplify(extent).as_int().is_some_and(|n| n <= 0) {
                    return Ok(());
                }
                let mut inner = env.clone();
                // Simplified first: a compute_at region's start cancels out of `min + extent`.
                let hi = simplify(&min.add(extent).sub(&Expr::int(1)));
                // Ranges of the bounds themselves (they may use outer loop vars).
                let lo_iv = interval(min, env)
                    .map(|i| i.lo)
                    .unwrap_or_else(|| min.clone());
                let hi_iv = interval(&hi, env).map(|i| i.hi).unwrap_or(hi);
                // What the code computes: the bounds and the end `min + extent`.
                interval(min, env);
                interval(extent, env);
                interval(&min.add(extent), env);
                self.discharge(env, &|| format!("the bounds of loop '{}'", var.name))?;
                inner.vars.insert(
                    var.clone(),
                    Interval {
                        lo: lo_iv,
                        hi: hi_iv,
                    },
                );
                inner
                    .loops
                    .insert(var.clone(), (min.clone(), extent.clone()));
                self.loop_extents.push(extent.clone());
                let r = self.stmt(body, &inner);
                self.loop_extents.pop();
                r
            }
            Stmt::Store {
                buf,
                indices,
                value,
            } => {
                self.access(*buf, indices, env)?;
                for i in indices {
                    self.exprs(i, env)?;
                }
                self.exprs(value, env)
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                self.exprs(cond, env)?;
                self.condition(cond, env)?;
                let mut t = env.clone();
                t.assume(cond);
                self.guarded(cond, |p| p.stmt(then, &t))?;
                match otherwise {
                    Some(o) => self.guarded(&not(cond), |p| p.stmt(o, env)),
                    None => Ok(()),
                }
            }
            Stmt::Let { var, value, body } => {
                self.exprs(value, env)?;
                let mut inner = env.clone();
                if let Some(iv) = interval(value, env) {
                    inner.vars.insert(var.clone(), iv);
                }
                self.discharge(env, &|| format!("let {}", var.name))?;
                self.stmt(body, &inner)
            }
            Stmt::Allocate { body, .. } => self.stmt(body, env),
            Stmt::Seq(v) => v.iter().try_for_each(|s| self.stmt(s, env)),
            // The split runs after the proof; barriers touch no memory.
            Stmt::Barrier | Stmt::Launch { .. } => Ok(()),
            // Its destination is element 0 of a one-element local buffer (`verify::gpu`); what
            // the value reads is proved as any expression's loads.
            Stmt::AllReduce { value, .. } => self.exprs(value, env),
            // The declared computation has exactly the accesses the intrinsic may make (every
            // element of every region): proving it proves the opaque call (`ir::intrin`).
            Stmt::Call {
                intrin,
                regions,
                scalars,
            } => self.call(*intrin, regions, scalars, env),
        }
    }
}

/// `!c` as an expression (any bool).
fn not(c: &Expr) -> Expr {
    Expr::new(ExprKind::Unary(UnOp::Not, c.clone()), DType::Bool)
}

/// `!c` for the comparison forms `Env::assume` understands (others: no information).
fn negate(c: &Expr) -> Expr {
    use crate::ir::expr::CmpOp;
    match c.kind() {
        ExprKind::Cmp(op, a, b) => {
            let n = match op {
                CmpOp::Lt => CmpOp::Ge,
                CmpOp::Le => CmpOp::Gt,
                CmpOp::Gt => CmpOp::Le,
                CmpOp::Ge => CmpOp::Lt,
                CmpOp::Eq => CmpOp::Ne,
                CmpOp::Ne => CmpOp::Eq,
            };
            Expr::cmp(n, a.clone(), b.clone()).expect("same dtypes")
        }
        _ => Expr::bool(true),
    }
}

/// Proves every access of `func` in bounds, adding per-call checks where needed.
pub fn prove(func: &mut PrimFunc) -> Result<()> {
    let record: Record = Rc::default();
    let mut p = Prover {
        func,
        dims: func.dims.iter().cloned().collect(),
        checks: vec![],
        seen: HashMap::new(),
        loop_extents: vec![],
        guards: vec![],
        record: record.clone(),
    };
    let env = Env {
        record: Some(record),
        ..Env::default()
    };
    p.stmt(&func.body, &env)?;
    let checks = p.checks;
    func.checks.extend(checks);
    Ok(())
}
