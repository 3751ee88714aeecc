//! The race-freedom rule for `Parallel` and `Vectorized` loops of functions read from a file
//! (`verify::verify_loaded` calls `check_loop` on every such loop of the multi-dimensional
//! function; the passes after it are rivet's own and keep the loop structure).
//!
//! A loop over `v` passes when, for every buffer `X` stored in its body and not allocated
//! inside it (a buffer allocated inside the body is private to one iteration), one of:
//!
//! 1. **Disjoint**: there is one *slot* — a dimension `d`, or a pair of slots holding
//!    `I1 + x // E` and `I2 + S * (x % E) + r` (`S` a positive constant, `r` the rest: the
//!    pair's key is `S * x + r`, a function of the element since
//!    `S * x + r = E * S * (first - I1) + (second - I2)`; with `S = 1, r = 0` it is `x`; `E`
//!    a positive constant or a product of factors of the loop's extent, so that `E = 0`,
//!    where `x // 0 = x % 0 = 0` breaks the identity, leaves the loop without iterations) —
//!    such that every store and every load of `X` in the body puts there a key of the form
//!    `C * v + r`, with one coefficient `C` for all accesses (a positive constant, or one
//!    invariant expression), and every `r` ranging over one window `[L, L + C - 1]`. Then
//!    iteration `v` only touches elements whose key is in `[C v + L, C v + L + C - 1]`:
//!    disjoint for distinct `v`. `r` may use invariants (dims, outer loop variables) and the
//!    variables of loops inside the body whose bounds are invariant; the window is proven by
//!    constant differences of linear forms, never by assumptions on the signs of variables.
//!    A reduction `C[i] = C[i] + ...` in a loop over the reduction variable has no slot with a
//!    coefficient on `v`, so it fails.
//! 2. **Idempotent** (what `compute_at` into a parallel loop produces: neighbouring
//!    iterations recompute overlapping halos of a local): `X` is a local, it is stored by
//!    exactly one `Store` in the body, whose value loads no buffer stored in the body and uses
//!    loop variables only inside copies of its own index expressions. Every write of an
//!    element then writes the same value, whichever iteration makes it.
//!
//! Anything else — data-dependent indices, inner loops whose bounds depend on `v`, `Let`
//! variables of the body in an index — is refused: the rule is sufficient, not complete.
//! Work is bounded: the walk stops after `budget` expression nodes.

use super::intrin::check_call;
use crate::arith::simplify::{linear, simplify};
use crate::ir::expr::{BinOp, BufId, Expr, ExprKind};
use crate::ir::intrin::model;
use crate::ir::stmt::{BufKind, PrimFunc, Stmt};
use std::collections::{HashMap, HashSet};

/// A refusal: the buffer concerned and why.
pub struct Race {
    pub buffer: String,
    pub why: String,
}

/// One access of a buffer inside the loop body.
struct Access<'a> {
    indices: &'a [Expr],
    /// The stored value, for stores.
    value: Option<&'a Expr>,
}

struct Body<'a> {
    v: u32,
    /// Variables bound inside the body: For variables with their (min, extent), Let ones None.
    inner: HashMap<u32, Option<(&'a Expr, &'a Expr)>>,
    /// Buffers allocated inside the body (private to an iteration).
    private: HashSet<BufId>,
    accesses: HashMap<BufId, Vec<Access<'a>>>,
    /// Buffers with at least one Store in the body, in first-seen order.
    stored: Vec<BufId>,
    store_count: HashMap<BufId, usize>,
    budget: &'a mut usize,
    /// The declared computations of the body's intrinsic calls, by the call's address: a
    /// call is checked as its model (`ir::intrin`), whose accesses are the call's.
    models: &'a HashMap<*const Stmt, Stmt>,
    /// The factors of the loop's extent (`a * (b * c)`: a, b, c), at most `MAX_FACTORS`: a
    /// symbolic divisor of a pair made only of them is 0 only when the loop has no iteration.
    extent_factors: Vec<Expr>,
}

/// Most factors of a loop extent `factors` collects (a fused loop has one per fused loop).
const MAX_FACTORS: usize = 16;

/// The factors of a product tree `e` (`e` itself when it is no product), or none when there
/// are more than `MAX_FACTORS` (the pair rule then takes constant divisors only).
fn factors(e: &Expr) -> Vec<Expr> {
    let mut out = Vec::new();
    let mut todo = vec![e.clone()];
    while let Some(x) = todo.pop() {
        if out.len() + todo.len() >= MAX_FACTORS {
            return Vec::new();
        }
        match x.kind() {
            ExprKind::Binary(BinOp::Mul, a, b) => {
                todo.push(a.clone());
                todo.push(b.clone());
            }
            _ => out.push(x),
        }
    }
    out
}

/// Checks the loop `for v in ..: body`; `budget` is decremented per expression node walked
/// (an error once exhausted, so a hostile function cannot make verification slow).
pub fn check_loop(
    func: &PrimFunc,
    v: &crate::ir::expr::Var,
    extent: &Expr,
    body: &Stmt,
    budget: &mut usize,
) -> std::result::Result<(), Race> {
    let mut models = HashMap::new();
    body.visit(&mut |s| {
        if let Stmt::Call {
            intrin,
            regions,
            scalars,
        } = s
        {
            // A malformed call is the verifier's to report; model only well-formed ones.
            if check_call(func, *intrin, regions, scalars, false).is_ok() {
                models.insert(s as *const Stmt, model(func, *intrin, regions, false));
            }
        }
    });
    let mut b = Body {
        models: &models,
        extent_factors: factors(extent),
        v: v.id,
        inner: HashMap::new(),
        private: HashSet::new(),
        accesses: HashMap::new(),
        stored: Vec::new(),
        store_count: HashMap::new(),
        budget,
    };
    b.collect(body)?;
    for id in b.stored.clone() {
        if b.private.contains(&id) {
            continue;
        }
        // An undeclared buffer is refused by the verifier's buffer rules; never panic here.
        let Some(buf) = func.buffers.iter().find(|b| b.id == id) else {
            continue;
        };
        if buf.kind == (BufKind::Param { output: false }) {
            continue; // refused by the store rule, which names the problem better
        }
        let acc = &b.accesses[&id];
        let disjoint = b.disjoint(acc);
        if disjoint.is_ok() {
            continue;
        }
        if buf.kind == BufKind::Local && b.idempotent(id, acc) {
            continue;
        }
        return Err(Race {
            buffer: buf.name.clone(),
            why: disjoint.err().unwrap_or_default(),
        });
    }
    Ok(())
}

/// True when `e` uses one of `vars` (visits every node: callers keep `e` small or budgeted).
fn uses_any(e: &Expr, pred: &dyn Fn(u32) -> bool) -> bool {
    let mut found = false;
    e.visit(&mut |n| {
        if let ExprKind::Var(x) = n.kind() {
            found |= pred(x.id);
        }
    });
    found
}

/// A slot of an access: a dimension, or `x` recovered from `(I1 + x // E, I2 + x % E)`.
#[derive(Clone, PartialEq, Debug)]
enum Slot {
    Dim(usize),
    /// The two slots, `E`, `I1`, `I2` and `S` (module header): accesses share a pair only
    /// when all of them are equal, so the key is the same function of the element for all.
    Pair(Box<Slot>, Box<Slot>, Expr, Expr, Expr, i64),
}

impl<'a> Body<'a> {
    fn spend(&mut self, e: &Expr) -> std::result::Result<(), Race> {
        let mut over = false;
        let budget = &mut *self.budget;
        e.visit(&mut |_| {
            if *budget == 0 {
                over = true;
            } else {
                *budget -= 1;
            }
        });
        if over {
            return Err(Race {
                buffer: String::new(),
                why:
                    "the function is too large to verify its parallel loops (limit MAX_FUNC_NODES)"
                        .into(),
            });
        }
        Ok(())
    }

    fn loads(&mut self, e: &'a Expr) -> std::result::Result<(), Race> {
        self.spend(e)?;
        let mut found: Vec<(BufId, &'a [Expr])> = Vec::new();
        visit_ref(e, &mut |n: &'a Expr| {
            if let ExprKind::Load { buf, indices } = n.kind() {
                found.push((*buf, indices.as_slice()));
            }
        });
        for (buf, indices) in found {
            self.accesses.entry(buf).or_default().push(Access {
                indices,
                value: None,
            });
        }
        Ok(())
    }

    fn collect(&mut self, s: &'a Stmt) -> std::result::Result<(), Race> {
        match s {
            Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } => {
                self.loads(min)?;
                self.loads(extent)?;
                // A variable re-bound by a sibling loop with other bounds has no single range.
                let range = match self.inner.get(&var.id) {
                    Some(Some((m, e))) if *m != min || *e != extent => None,
                    Some(None) => None,
                    _ => Some((min, extent)),
                };
                self.inner.insert(var.id, range);
                self.collect(body)
            }
            Stmt::Let { var, value, body } => {
                self.loads(value)?;
                self.inner.insert(var.id, None);
                self.collect(body)
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                self.loads(cond)?;
                self.collect(then)?;
                if let Some(o) = otherwise {
                    self.collect(o)?;
                }
                Ok(())
            }
            Stmt::Allocate { bufs, body } => {
                self.private.extend(bufs.iter().copied());
                self.collect(body)
            }
            Stmt::Seq(v) => v.iter().try_for_each(|s| self.collect(s)),
            // Loaded functions are never split (files hold the IR before the split).
            Stmt::Barrier | Stmt::Launch { .. } => Ok(()),
            // Only inside a kernel, which no parallel loop holds (`verify::gpu` refuses it
            // there); its loads are still accesses of the loop body.
            Stmt::AllReduce { value, .. } => self.loads(value),
            Stmt::Call { scalars, .. } => {
                for e in scalars {
                    self.loads(e)?;
                }
                let models = self.models;
                match models.get(&(s as *const Stmt)) {
                    Some(m) => self.collect(m),
                    None => Err(Race {
                        buffer: String::new(),
                        why: "a malformed intrinsic call".into(),
                    }),
                }
            }
            Stmt::Store {
                buf,
                indices,
                value,
            } => {
                for i in indices {
                    self.loads(i)?;
                }
                self.loads(value)?;
                if !self.store_count.contains_key(buf) {
                    self.stored.push(*buf);
                }
                *self.store_count.entry(*buf).or_default() += 1;
                self.accesses.entry(*buf).or_default().push(Access {
                    indices,
                    value: Some(value),
                });
                Ok(())
            }
        }
    }

    /// Variables that vary between or within iterations: `v` and the body's own.
    fn varying(&self, id: u32) -> bool {
        id == self.v || self.inner.contains_key(&id)
    }

    fn invariant(&self, e: &Expr) -> bool {
        !uses_any(e, &|id| self.varying(id))
    }

    /// Rule 1; on failure, why (for the message).
    fn disjoint(&self, acc: &[Access]) -> std::result::Result<(), String> {
        let cands: Vec<Vec<(Slot, Expr)>> = acc.iter().map(|a| self.candidates(a)).collect();
        let Some(first) = cands.first() else {
            return Ok(());
        };
        let mut last_why = String::from("no index varies with the loop variable");
        for (slot, _) in first {
            let mut keys = Vec::with_capacity(cands.len());
            for c in &cands {
                match c.iter().find(|(s, _)| s == slot) {
                    Some((_, k)) => keys.push(k),
                    None => break,
                }
            }
            if keys.len() != cands.len() {
                continue;
            }
            match self.window(&keys) {
                Ok(()) => return Ok(()),
                Err(w) => last_why = w,
            }
        }
        Err(last_why)
    }

    /// The slots of one access and the key each holds.
    fn candidates(&self, a: &Access) -> Vec<(Slot, Expr)> {
        let mut out: Vec<(Slot, Expr)> = a
            .indices
            .iter()
            .enumerate()
            .map(|(d, e)| (Slot::Dim(d), e.clone()))
            .collect();
        // Recover fused variables, a bounded number of rounds (one per nesting of fuse).
        let mut start = 0;
        for _ in 0..a.indices.len() {
            let end = out.len();
            let mut new = Vec::new();
            for p in 0..end {
                for q in 0..end {
                    if p == q || (p < start && q < start) {
                        continue;
                    }
                    if let Some(x) = self.pair(&out[p], &out[q]) {
                        new.push(x);
                    }
                }
            }
            if new.is_empty() || out.len() > 64 {
                break;
            }
            start = end;
            out.extend(new);
        }
        out
    }

    /// `(I1 + x // E, I2 + S * (x % E) + r)` -> `S * x + r`, with `I1`, `I2`, `E` invariant,
    /// `S` a positive constant and `r` the varying rest (module header; a fused loop's digits
    /// when the inner one was tiled: `(f % 4) * 32 + j`).
    fn pair(&self, a: &(Slot, Expr), b: &(Slot, Expr)) -> Option<(Slot, Expr)> {
        let (i1, q) = self.split_atom(&a.1, BinOp::FloorDiv)?;
        let ExprKind::Binary(_, x, e1) = q.kind() else {
            return None;
        };
        if !self.invariant(e1) {
            return None;
        }
        let (i2, scale, rest) = self.split_scaled_mod(&b.1, &x.floormod(e1))?;
        // `x = (x // E) * E + x % E` needs `E != 0` (rivet's `x // 0` and `x % 0` are 0: every
        // iteration would touch the same element): a positive constant, or a product of
        // factors of the loop's extent (`E = 0` then means no iteration: a fused loop's
        // extent is the product of the loops it fused).
        let nonzero = match e1.as_int() {
            Some(e) => e > 0,
            None => {
                let fe = factors(e1);
                !fe.is_empty() && fe.iter().all(|f| self.extent_factors.contains(f))
            }
        };
        if !nonzero {
            return None;
        }
        let key = if scale == 1 {
            x.clone()
        } else {
            Expr::int(scale).mul(x)
        };
        let key = match rest {
            Some(r) => key.add(&r),
            None => key,
        };
        Some((
            Slot::Pair(
                Box::new(a.0.clone()),
                Box::new(b.0.clone()),
                e1.clone(),
                i1,
                i2,
                scale,
            ),
            key,
        ))
    }

    /// `e = I + S * m + r` for the atom `m` (`x % E`), `S` a positive constant, `I` the
    /// invariant terms and `r` the varying ones (`None` when there are none).
    fn split_scaled_mod(&self, e: &Expr, m: &Expr) -> Option<(Expr, i64, Option<Expr>)> {
        let l = linear(e)?;
        let pos = l.terms.iter().position(|(t, c)| *c > 0 && t == m)?;
        let scale = l.terms[pos].1;
        let mut inv = crate::arith::simplify::Linear {
            constant: l.constant,
            ..Default::default()
        };
        let mut var = crate::arith::simplify::Linear::default();
        for (k, (t, c)) in l.terms.iter().enumerate() {
            if k == pos {
                continue;
            }
            if self.invariant(t) {
                inv.terms.push((t.clone(), *c));
            } else {
                var.terms.push((t.clone(), *c));
            }
        }
        let rest = (!var.terms.is_empty()).then(|| var.to_expr());
        Some((inv.to_expr(), scale, rest))
    }

    /// `e = rest + atom` with `atom` an `op` node (coefficient 1) and `rest` invariant.
    fn split_atom(&self, e: &Expr, op: BinOp) -> Option<(Expr, Expr)> {
        let l = linear(e)?;
        let pos = l.terms.iter().position(|(t, c)| {
            *c == 1 && matches!(t.kind(), ExprKind::Binary(o, _, _) if *o == op)
        })?;
        let atom = l.terms[pos].0.clone();
        let mut rest = l.clone();
        rest.terms.remove(pos);
        let rest = rest.to_expr();
        self.invariant(&rest).then_some((rest, atom))
    }

    /// The key forms `C * v + r` of `keys` share `C` and put every `r` in one window of
    /// width `C`.
    fn window(&self, keys: &[&Expr]) -> std::result::Result<(), String> {
        let mut coef: Option<Expr> = None;
        let mut ranges = Vec::with_capacity(keys.len());
        for k in keys {
            let (c, lo, hi) = self.affine(k)?;
            match &coef {
                None => coef = Some(c),
                Some(c0) if *c0 == c => {}
                Some(c0) => {
                    return Err(format!(
                        "indices step by different amounts per iteration (`{c0}` and `{c}`)"
                    ))
                }
            }
            ranges.push((lo, hi));
        }
        let Some(c) = coef else { return Ok(()) };
        let l0 = ranges[0].0.clone();
        let mut min_a = i64::MAX;
        let mut max_d = i64::MIN;
        for (lo, hi) in &ranges {
            let a = simplify(&lo.sub(&l0)).as_int();
            let d = simplify(&hi.sub(&l0).sub(&c).add(&Expr::int(1))).as_int();
            match (a, d) {
                (Some(a), Some(d)) => {
                    min_a = min_a.min(a);
                    max_d = max_d.max(d);
                }
                _ => {
                    return Err(format!(
                        "cannot prove that the elements of different iterations are disjoint (index range [{lo}, {hi}] per step of {c})"
                    ))
                }
            }
        }
        if max_d > min_a {
            return Err(format!(
                "iterations touch overlapping elements (the accesses span more than the step `{c}` of one iteration)"
            ));
        }
        Ok(())
    }

    /// `k = C * v + r`: `(C, lo(r), hi(r))`, with `r` bounded over the body's loops.
    fn affine(&self, k: &Expr) -> std::result::Result<(Expr, Expr, Expr), String> {
        let unprovable = || format!("index `{k}` is not of the form c * v + r with r bounded");
        let mut l = linear(k).ok_or_else(unprovable)?;
        merge_div_mod(&mut l.terms);
        let mut coef: Option<Expr> = None;
        let mut lo = Expr::int(l.constant);
        let mut hi = Expr::int(l.constant);
        for (atom, c) in &l.terms {
            let ck = Expr::int(*c);
            if atom.as_var().is_some_and(|x| x.id == self.v) {
                if *c <= 0 || coef.is_some() {
                    return Err(unprovable());
                }
                coef = Some(ck);
                continue;
            }
            if let ExprKind::Binary(BinOp::Mul, a, b) = atom.kind() {
                let is_v = |e: &Expr| e.as_var().is_some_and(|x| x.id == self.v);
                let other = if is_v(a) {
                    Some(b)
                } else if is_v(b) {
                    Some(a)
                } else {
                    None
                };
                if let Some(o) = other {
                    if *c != 1 || coef.is_some() || !self.invariant(o) {
                        return Err(unprovable());
                    }
                    coef = Some(o.clone());
                    continue;
                }
            }
            if self.invariant(atom) {
                let t = ck.mul(atom);
                lo = lo.add(&t);
                hi = hi.add(&t);
                continue;
            }
            let (alo, ahi) = self.atom_range(atom).ok_or_else(unprovable)?;
            let (tlo, thi) = if *c >= 0 {
                (ck.mul(&alo), ck.mul(&ahi))
            } else {
                (ck.mul(&ahi), ck.mul(&alo))
            };
            lo = lo.add(&tlo);
            hi = hi.add(&thi);
        }
        let coef = coef.ok_or_else(|| format!("index `{k}` does not vary with the loop"))?;
        Ok((coef, lo, hi))
    }

    /// Bounds of a non-invariant atom that does not use `v`: an inner loop variable with
    /// invariant bounds, or `y % K` for a positive constant `K`.
    fn atom_range(&self, atom: &Expr) -> Option<(Expr, Expr)> {
        if uses_any(atom, &|id| id == self.v) {
            return None;
        }
        match atom.kind() {
            ExprKind::Var(x) => {
                let (min, ext) = (*self.inner.get(&x.id)?)?;
                if !self.invariant(min) || !self.invariant(ext) {
                    return None;
                }
                Some((min.clone(), min.add(ext).sub(&Expr::int(1))))
            }
            ExprKind::Binary(BinOp::FloorMod, _, k) => match k.as_int() {
                Some(k) if k > 0 => Some((Expr::int(0), Expr::int(k - 1))),
                _ => None,
            },
            _ => None,
        }
    }

    /// Rule 2 for local `id`.
    fn idempotent(&self, id: BufId, acc: &[Access]) -> bool {
        if self.store_count.get(&id) != Some(&1) {
            return false;
        }
        let Some(st) = acc.iter().find(|a| a.value.is_some()) else {
            return false;
        };
        let value = st.value.expect("a store");
        let mut ok = true;
        value.visit(&mut |n| {
            if let ExprKind::Load { buf, .. } = n.kind() {
                ok &= !self.store_count.contains_key(buf);
            }
        });
        ok && self.only_through(value, st.indices)
    }

    /// True when every varying variable of `e` sits inside a copy of one of `indices`.
    fn only_through(&self, e: &Expr, indices: &[Expr]) -> bool {
        if indices
            .iter()
            .any(|i| i.depth() == e.depth() && (i.same(e) || i == e))
        {
            return true;
        }
        match e.kind() {
            ExprKind::Var(x) => !self.varying(x.id),
            ExprKind::Const(_) | ExprKind::Invalid(_) => true,
            ExprKind::Unary(_, a) | ExprKind::Cast(a) => self.only_through(a, indices),
            ExprKind::Binary(_, a, b) | ExprKind::Cmp(_, a, b) | ExprKind::Logic(_, a, b) => {
                self.only_through(a, indices) && self.only_through(b, indices)
            }
            ExprKind::Select(c, a, b) | ExprKind::Fma(c, a, b) => {
                self.only_through(c, indices)
                    && self.only_through(a, indices)
                    && self.only_through(b, indices)
            }
            ExprKind::Load { indices: li, .. } | ExprKind::Read { indices: li, .. } => {
                li.iter().all(|x| self.only_through(x, indices))
            }
            // Vector IR never reaches this rule (loaded nests hold none).
            ExprKind::Reduce { .. } | ExprKind::Ramp { .. } | ExprKind::Broadcast { .. } => false,
        }
    }
}

/// `k*E*(x // E) + k*(x % E)` -> `k*x` for a positive constant `E` (a split loop fused back).
fn merge_div_mod(terms: &mut Vec<(Expr, i64)>) {
    let mut changed = true;
    while changed {
        changed = false;
        'outer: for p in 0..terms.len() {
            let ExprKind::Binary(BinOp::FloorDiv, x, e) = terms[p].0.kind() else {
                continue;
            };
            let Some(ev) = e.as_int().filter(|v| *v > 0) else {
                continue;
            };
            for q in 0..terms.len() {
                let ExprKind::Binary(BinOp::FloorMod, x2, e2) = terms[q].0.kind() else {
                    continue;
                };
                if x2 != x || e2 != e {
                    continue;
                }
                let k = terms[q].1;
                if k.checked_mul(ev) != Some(terms[p].1) {
                    continue;
                }
                let x = x.clone();
                let (hi, lo) = (p.max(q), p.min(q));
                terms.remove(hi);
                terms.remove(lo);
                match linear(&x) {
                    Some(lx) if lx.constant == 0 => {
                        for (t, c) in lx.terms {
                            let Some(add) = c.checked_mul(k) else {
                                terms.push((x.clone(), k));
                                break;
                            };
                            match terms.iter_mut().find(|(a, _)| *a == t) {
                                Some((_, c0)) => *c0 = c0.saturating_add(add),
                                None => terms.push((t, add)),
                            }
                        }
                    }
                    _ => terms.push((x, k)),
                }
                terms.retain(|(_, c)| *c != 0);
                changed = true;
                break 'outer;
            }
        }
    }
}

/// `Expr::visit` with the nodes' lifetime (so loads can be kept by reference).
fn visit_ref<'a>(e: &'a Expr, f: &mut dyn FnMut(&'a Expr)) {
    f(e);
    match e.kind() {
        ExprKind::Const(_) | ExprKind::Var(_) | ExprKind::Invalid(_) => {}
        ExprKind::Unary(_, a) | ExprKind::Cast(a) => visit_ref(a, f),
        ExprKind::Binary(_, a, b) | ExprKind::Cmp(_, a, b) | ExprKind::Logic(_, a, b) => {
            visit_ref(a, f);
            visit_ref(b, f)
        }
        ExprKind::Select(c, a, b) | ExprKind::Fma(c, a, b) => {
            visit_ref(c, f);
            visit_ref(a, f);
            visit_ref(b, f)
        }
        ExprKind::Read { indices, .. } | ExprKind::Load { indices, .. } => {
            indices.iter().for_each(|i| visit_ref(i, f))
        }
        ExprKind::Reduce { body, axes, .. } => {
            visit_ref(body, f);
            for a in axes {
                visit_ref(&a.min, f);
                visit_ref(&a.extent, f);
            }
        }
        ExprKind::Ramp { base, stride, .. } => {
            visit_ref(base, f);
            visit_ref(stride, f)
        }
        ExprKind::Broadcast { value, .. } => visit_ref(value, f),
    }
}
