//! Pass: loop partitioning of `vectorized` loops on their guards (every target, after
//! flattening, before `unswitch::selects` and `vectorize`). A `select` whose arm loads memory
//! and whose condition varies with the loop variable keeps a vector loop scalar: `vectorize`
//! must not load, for any lane, what the scalar loop would skip. A convolution's padding
//! (`if_then_else(0 <= x + kw - 1 < W, X[.., x + kw - 1], 0)`) and the zero past a packed
//! GEMM's ragged last panel (`select(jo * 32 + ji < N, .., 0)`) are such guards: in every
//! row of the image pack, and of a depthwise convolution's output, only a lane or two at
//! either end is outside. Here, when each condition's conjuncts that use the loop variable
//! `v` are comparisons of `k * v + rest` with 0, `k` a non-zero constant (a stride) and `rest`
//! free of `v` (bounds of an interval of `v`),
//!
//! ```text
//! for v in [min, end) vectorized { body }
//! ```
//!
//! becomes (`lo`, `hi`: the largest lower and smallest upper bound the conjuncts give)
//!
//! ```text
//! a = min(max(lo, min), end); b = max(min(hi, end), a)
//! for v in [min, a) { body }                   // the edge before: guards kept, scalar
//! for v in [a, b) vectorized { body' }         // the interior: those conjuncts dropped
//! for v in [b, end) { body }                   // the edge after
//! ```
//!
//! Conjuncts that do not use `v` stay (`unswitch::selects` then takes them out of the
//! interior loop as a branch).
//!
//! Invariants (why the result means what the loop meant):
//! - the three loops run the iterations of the original, each once, in the original order;
//! - in the interior every dropped conjunct is true: `lo <= v < hi` is, conjunct by conjunct,
//!   the comparison rewritten by exact integer arithmetic (`k v + r < 0` iff
//!   `v < ceil(-r / k)` for `k > 0`), so each select there picks what it
//!   picked before, and no load is made that the original did not make;
//! - the bounds are computed in int64 at run time, after the bounds proof, so they must not
//!   wrap: as in `vectorize` (a guard's limit), each term of `rest`, `min` and the extent are
//!   first compared against `2^58` (at most 8 terms, a constant of at most `2^58`), so every
//!   partial sum stays under `2^62`; when a comparison fails the original loop runs instead.
//!
//! A loop whose guards are not all of that form, or that has none, is left as it is.
//!
//! Where it pays: a loop whose every varying conjunct is a tile's ragged end is left as it
//! is too. That is a loop of constant extent `E <= 32` (a GEMM panel) whose conjunct is `k * v + c * o + rest`
//! with `o` the variable of a loop around it, `|c| >= |k| * E` and `min` free of `o` (`jo *
//! 32 + ji < N` in a GEMM's B pack): per step of `o` the bound moves past the whole loop, so
//! the guard fails inside the loop for one `o` only, the last panel. Partitioning such a
//! loop vectorizes its full panels but copies its body four more times (the interior's
//! strip-mining and stride test, the edge, the loop kept for a wrap); measured on the default
//! GEMM with a symbolic `n`, that was a sixth more instructions in a first build for no
//! measured gain in its calls, where the pack is a percent or two of the time. A padding
//! guard (`x + kw - 1 >= 0`: the bound moves by 1 per step of `kw`, not by the row's length)
//! fails on many iterations of the loops around it, and is partitioned.

use super::vectorize::{
    coefficient_and_rest, conjuncts, has_load, unless_wrapping, within, NO_WRAP,
};
use crate::arith::simplify::{linear, simplify};
use crate::ir::expr::{CmpOp, Expr, ExprKind, LogicOp, Var};
use crate::ir::stmt::{ForKind, PrimFunc, Stmt};
use rivet_runtime::DType;
use std::collections::HashSet;

/// Most distinct varying conjuncts one loop is partitioned on (each adds a `max` or `min`).
const MAX_CONJUNCTS: usize = 8;

/// Partitions `f`'s vectorized loops (module header).
pub fn partition(f: &mut PrimFunc) {
    // Every loop variable of the function: a variable one of them uses in a guard is that of
    // a loop around it (a variable is bound once, and used only in its scope).
    let mut loops: HashSet<u32> = HashSet::new();
    f.body.visit(&mut |s| {
        if let Stmt::For { var, .. } = s {
            loops.insert(var.id);
        }
    });
    f.body = f.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
        Stmt::For {
            var,
            min,
            extent,
            body,
            kind: ForKind::Vectorized,
        } => match partitioned(&var, &min, &extent, &body, &loops) {
            Some(p) => p,
            None => Stmt::For {
                var,
                min,
                extent,
                body,
                kind: ForKind::Vectorized,
            },
        },
        other => other,
    });
}

/// One bound on `v` from a conjunct: `v >= e` (lower) or `v < e` (upper).
enum Bound {
    Lower(Expr),
    Upper(Expr),
}

/// Largest coefficient of the loop variable in a partitioned conjunct (a stride).
const MAX_COEF: i64 = 1 << 20;

/// The bound conjunct `c` (which uses `v`) puts on `v`, with the comparisons that keep its
/// computation from wrapping pushed onto `no_wrap`; `None` when `c` is not `k * v + rest`
/// compared with 0 (after moving everything to one side; `0 < |k| <= MAX_COEF`, a strided
/// window `(x * 2 + kw - 1 >= 0)` included), `rest` free of `v`.
fn bound(c: &Expr, v: &Var, no_wrap: &mut Vec<Expr>) -> Option<Bound> {
    let ExprKind::Cmp(op, a, b) = c.kind() else {
        return None;
    };
    if a.dtype() != DType::I64 || matches!(op, CmpOp::Eq | CmpOp::Ne) {
        return None;
    }
    let l = linear(&a.sub(b))?;
    let (coef, rest) = coefficient_and_rest(&l, v)?;
    if coef == 0
        || coef.unsigned_abs() > MAX_COEF as u64
        || rest.terms.len() > 8
        || rest.constant.unsigned_abs() > NO_WRAP as u64
    {
        return None;
    }
    for (t, k) in &rest.terms {
        no_wrap.push(within(t, NO_WRAP / k.unsigned_abs().max(1) as i64)?);
    }
    // `k * v + rest OP 0` with k < 0 is `-k * v - rest OP' 0`, OP' the mirrored comparison.
    let (k, r, op) = if coef > 0 {
        (coef, rest.to_expr(), *op)
    } else {
        let mirrored = match op {
            CmpOp::Lt => CmpOp::Gt,
            CmpOp::Le => CmpOp::Ge,
            CmpOp::Gt => CmpOp::Lt,
            _ => CmpOp::Le,
        };
        (-coef, Expr::int(0).sub(&rest.to_expr()), mirrored)
    };
    // With k > 0: `k v + r < 0` is `v < ceil(-r / k)`, `k v + r >= 0` is `v >= ceil(-r / k)`;
    // `<= 0` and `> 0` are those of `r - 1`. `ceil(x / k) = (x + k - 1) // k` (floor
    // division by a positive constant: exact, and |x| stays under 2^62 + 2^20).
    let ceil = |extra: i64| {
        Expr::int(0)
            .sub(&r)
            .add(&Expr::int(k - 1 + extra))
            .floordiv(&Expr::int(k))
    };
    Some(match op {
        CmpOp::Lt => Bound::Upper(ceil(0)),
        CmpOp::Le => Bound::Upper(ceil(1)),
        CmpOp::Gt => Bound::Lower(ceil(1)),
        _ => Bound::Lower(ceil(0)),
    })
}

/// The distinct conjuncts that use `v` in the conditions of `body`'s selects of a loading arm
/// (`bound` then checks their shape); `None` when there are none or too many.
fn varying(body: &Stmt, v: &Var) -> Option<Vec<Expr>> {
    let mut found: Vec<Expr> = Vec::new();
    body.visit_exprs(&mut |e| {
        e.visit_unique(&mut |n| {
            if let ExprKind::Select(c, a, b) = n.kind() {
                if !(has_load(a) || has_load(b)) || has_load(c) {
                    return;
                }
                let mut cs = Vec::new();
                conjuncts(c, &mut cs);
                for x in cs.into_iter().filter(|x| x.uses(v)) {
                    // One past the cap is enough to refuse: no quadratic search on many.
                    if found.len() <= MAX_CONJUNCTS && !found.contains(&x) {
                        found.push(x);
                    }
                }
            }
        })
    });
    (!found.is_empty() && found.len() <= MAX_CONJUNCTS).then_some(found)
}

/// `body` with the conjuncts `drop` removed from every select condition (a select left with
/// none becomes its first arm).
fn strip(body: &Stmt, drop: &[Expr]) -> Stmt {
    let mut fe = |e: &Expr| {
        e.rewrite(&mut |n| {
            let ExprKind::Select(c, a, b) = n.kind() else {
                return None;
            };
            let mut cs = Vec::new();
            conjuncts(c, &mut cs);
            if !cs.iter().any(|x| drop.contains(x)) {
                return None;
            }
            let kept = cs
                .into_iter()
                .filter(|x| !drop.contains(x))
                .reduce(|x, y| Expr::new(ExprKind::Logic(LogicOp::And, x, y), DType::Bool));
            Some(match kept {
                None => a.clone(),
                Some(k) => Expr::new(ExprKind::Select(k, a.clone(), b.clone()), n.dtype()),
            })
        })
    };
    body.rewrite(&mut fe, &mut |s| s)
}

/// Longest loop whose ragged end is left whole: the default GEMM's panel (`NR` columns). A
/// longer constant loop with such a guard is a chunk of an elementwise stage (a 1-d pad split
/// by `schedule::cpu_default::CHUNK`), which is the kernel's whole work, not a pack beside it.
const MAX_PANEL: i64 = crate::schedule::cpu_default::packed_gemm::NR;

/// Whether conjunct `c` is a tile's ragged end on the loop `for v in [min, min + E)`, `E` a
/// constant of at most `MAX_PANEL`: `k * v + c_o * o + rest` compared with 0, `o` the variable of a loop around it
/// (in `loops`), `|c_o| >= |k| * E`, and `min` free of `o`. From one iteration of `o` to the
/// next the bound on `v` the conjunct gives moves by at least `E` (the ceiling of a value
/// moved by an integer `>= E` moves by `>= E`), so it falls strictly inside the loop's range
/// (the loop neither all true nor all false) for at most one value of `o`, the others fixed:
/// the guard can fail only on the last panel. `min` free of every such `o` is asked, not of
/// the one found, which refuses more and is simpler to state.
fn ragged_end(c: &Expr, v: &Var, min: &Expr, extent: &Expr, loops: &HashSet<u32>) -> bool {
    let Some(e) = extent.as_int().filter(|&e| e > 0 && e <= MAX_PANEL) else {
        return false;
    };
    let ExprKind::Cmp(op, a, b) = c.kind() else {
        return false;
    };
    if matches!(op, CmpOp::Eq | CmpOp::Ne) {
        return false;
    }
    let Some((k, rest)) = linear(&a.sub(b)).and_then(|l| coefficient_and_rest(&l, v)) else {
        return false;
    };
    let span = (k as i128).abs() * e as i128;
    k != 0
        && rest.terms.iter().any(|(t, c_o)| {
            t.as_var()
                .is_some_and(|o| loops.contains(&o.id) && !min.uses(o))
                && (*c_o as i128).abs() >= span
        })
}

fn partitioned(
    v: &Var,
    min: &Expr,
    extent: &Expr,
    body: &Stmt,
    loops: &HashSet<u32>,
) -> Option<Stmt> {
    let conds = varying(body, v)?;
    // A loop whose every guard is a tile's ragged end (a pack's last panel padded with zeros:
    // the default GEMM's B pack) is left whole. Its full panels would run as vectors, but
    // the split costs the body four more copies (the vector interior with its strip-mining
    // tail and stride test, the scalar edge, the loop kept for a wrap), a sixth more
    // instructions in a first build of the GEMM, for a pack that is a percent or two of the
    // product it feeds (benches/RESULTS.md). A padding guard (a convolution's window) moves
    // by less than the loop's range per outer iteration and fails in many: those stay.
    if conds.iter().all(|c| ragged_end(c, v, min, extent, loops)) {
        return None;
    }
    let mut no_wrap: Vec<Expr> = Vec::new();
    let (mut lo, mut hi): (Option<Expr>, Option<Expr>) = (None, None);
    for c in &conds {
        match bound(c, v, &mut no_wrap)? {
            Bound::Lower(e) => lo = Some(lo.map_or(e.clone(), |l| l.max_(&e))),
            Bound::Upper(e) => hi = Some(hi.map_or(e.clone(), |h| h.min_(&e))),
        }
    }
    for e in [min, extent] {
        match e.as_int() {
            Some(x) if x.unsigned_abs() <= NO_WRAP as u64 => {}
            Some(_) => return None,
            None => no_wrap.push(within(e, NO_WRAP)?),
        }
    }
    let (has_lo, has_hi) = (lo.is_some(), hi.is_some());
    let end = simplify(&min.add(extent));
    let (a, b) = (
        Var::new(&format!("{}.lo", v.name)),
        Var::new(&format!("{}.hi", v.name)),
    );
    let (ea, eb) = (Expr::var(&a), Expr::var(&b));
    let a_val = simplify(&lo.map_or(min.clone(), |l| l.max_(min)).min_(&end));
    let b_val = simplify(&hi.map_or(end.clone(), |h| h.min_(&end)).max_(&ea));
    let lp = |from: &Expr, to: &Expr, kind: ForKind, body: Stmt| Stmt::For {
        var: v.clone(),
        min: from.clone(),
        extent: simplify(&to.sub(from)),
        kind,
        body: Box::new(body),
    };
    let split = Stmt::Let {
        var: a,
        value: a_val,
        body: Box::new(Stmt::Let {
            var: b,
            value: b_val,
            // No edge loop on a side no conjunct bounds (a ragged panel's guard bounds
            // only the top).
            body: Box::new(Stmt::Seq(
                [
                    has_lo.then(|| lp(min, &ea, ForKind::Serial, body.clone())),
                    Some(lp(&ea, &eb, ForKind::Vectorized, strip(body, &conds))),
                    has_hi.then(|| lp(&eb, &end, ForKind::Serial, body.clone())),
                ]
                .into_iter()
                .flatten()
                .collect(),
            )),
        }),
    };
    Some(unless_wrapping(no_wrap, split, (v, min, extent, body)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::test_util::{func, input, loop_over, output, store};
    use crate::ir::verify::verify;

    /// `for o in [0, outer): for v in [0, extent) vectorized: P[o * extent + v] =
    /// select(guard(o, v), X[index(o, v)], 0)` over float32 buffers of `len` elements,
    /// partitioned; the function's text.
    fn partitioned_text(
        outer: i64,
        extent: i64,
        len: Expr,
        dims: Vec<Var>,
        guard: impl Fn(&Expr, &Expr) -> Expr,
        index: impl Fn(&Expr, &Expr) -> Expr,
    ) -> String {
        let x = input(0, "X", DType::F32, vec![len.clone()]);
        let p = output(1, "P", DType::F32, vec![Expr::int(outer * extent)]);
        let (xi, pi) = (x.id, p.id);
        let body = loop_over("o", Expr::int(outer), ForKind::Serial, |o| {
            loop_over("v", Expr::int(extent), ForKind::Vectorized, |v| {
                let value = Expr::select(
                    guard(o, v),
                    Expr::load(xi, vec![index(o, v)], DType::F32),
                    Expr::constant(0.0, DType::F32),
                )
                .unwrap();
                store(pi, vec![o.mul(&Expr::int(extent)).add(v)], value)
            })
        });
        let mut f = func("f", vec![x, p], dims, body);
        partition(&mut f);
        verify(&f, true).unwrap();
        f.to_string()
    }

    /// A ragged last panel (a GEMM's B pack: `o * 32 + v < n`) is left whole; a guard whose
    /// bound moves by less than the loop's range per outer step (tiles overlapping) is not a
    /// ragged end, and is partitioned.
    #[test]
    fn a_ragged_last_panel_is_left_whole() {
        let n = Var::new("n");
        let flat = |o: &Expr, v: &Expr| o.mul(&Expr::int(32)).add(v);
        let t = partitioned_text(
            4,
            32,
            Expr::var(&n),
            vec![n.clone()],
            |o, v| flat(o, v).lt(&Expr::var(&n)),
            flat,
        );
        assert!(!t.contains(".lo") && !t.contains(".hi"), "{t}");
        assert!(t.contains("vectorized for v in [0, 32)"), "{t}");
        // The same guard with the panels 16 apart: it fails inside the loop for two values
        // of `o`, so it is not a ragged end.
        let half = |o: &Expr, v: &Expr| o.mul(&Expr::int(16)).add(v);
        let t = partitioned_text(
            4,
            32,
            Expr::var(&n),
            vec![n.clone()],
            |o, v| half(o, v).lt(&Expr::var(&n)),
            half,
        );
        assert!(t.contains("v.hi"), "{t}");
        // A ragged end on a loop longer than a panel (an elementwise stage's chunk, the whole
        // kernel's work): partitioned.
        let wide = |o: &Expr, v: &Expr| o.mul(&Expr::int(64)).add(v);
        let t = partitioned_text(
            4,
            64,
            Expr::var(&n),
            vec![n.clone()],
            |o, v| wide(o, v).lt(&Expr::var(&n)),
            wide,
        );
        assert!(t.contains("v.hi"), "{t}");
    }

    /// A convolution's padded row (`0 <= v + o - 1 < 16`, `o` the window's offset) keeps its
    /// partition: scalar edges around an unguarded interior; so does a ragged panel that also
    /// carries a padding guard.
    #[test]
    fn a_padded_row_is_partitioned() {
        let w = Expr::int(16);
        let shifted = |o: &Expr, v: &Expr| v.add(o).sub(&Expr::int(1));
        let inside = |e: Expr, len: &Expr| {
            let lo = Expr::cmp(CmpOp::Le, Expr::int(0), e.clone()).unwrap();
            Expr::new(ExprKind::Logic(LogicOp::And, lo, e.lt(len)), DType::Bool)
        };
        let t = partitioned_text(
            3,
            16,
            w.clone(),
            vec![],
            |o, v| inside(shifted(o, v), &w),
            shifted,
        );
        assert!(
            t.contains("let v.lo = ") && t.contains("let v.hi = "),
            "{t}"
        );
        // The interior's store is the unguarded load.
        assert!(t.contains("= X[((v + o) - 1)]"), "{t}");
        // A ragged end (`o * 32 + v < n`) beside a padding (`0 <= v + o - 1`): partitioned.
        // (`0 <= o * 32 + v - 1` would be a ragged end too: it fails inside the loop for
        // `o = 0` only.)
        let n = Var::new("n");
        let t = partitioned_text(
            4,
            32,
            Expr::var(&n),
            vec![n.clone()],
            |o, v| {
                let pad = Expr::cmp(CmpOp::Le, Expr::int(0), shifted(o, v)).unwrap();
                let end = o.mul(&Expr::int(32)).add(v).lt(&Expr::var(&n));
                Expr::new(ExprKind::Logic(LogicOp::And, pad, end), DType::Bool)
            },
            shifted,
        );
        assert!(
            t.contains("let v.lo = ") && t.contains("let v.hi = "),
            "{t}"
        );
    }
}
