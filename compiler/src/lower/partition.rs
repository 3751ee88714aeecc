//! Pass: loop partitioning of `vectorized` loops on their guards (and versioning of serial
//! ones on a ragged panel end, below) (every target, after
//! flattening, before `unswitch::selects` and `vectorize`). A `select` whose arm loads memory
//! and whose condition varies with the loop variable keeps a vector loop scalar: `vectorize`
//! must not load, for any lane, what the scalar loop would skip. A convolution's padding
//! (`if_then_else(0 <= x + kw - 1 < W, X[.., x + kw - 1], 0)`) is such a guard: in every
//! row of the image pack, and of a depthwise convolution's output, only a lane or two at
//! either end is outside. Here, when each condition's conjuncts that use the loop variable
//! `v` are comparisons of `k * v + rest` with 0, `k` a non-zero constant (a stride) and `rest`
//! free of `v` (bounds of an interval of `v`), and not all of them are a panel's ragged end
//! (below: versioned),
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
//! Where a split costs more than it gives: a loop whose every varying conjunct is a panel's
//! ragged end is versioned instead. That is a loop of constant extent `E <= 32` (the default
//! GEMM's panel width) whose conjunct is `k * v + c * o + rest` compared with 0, `o` the
//! variable of a loop around it of 4 or more iterations (or a symbolic number),
//! `|c| >= |k| * E`, `min` free of `o` and `rest` free of every loop variable (the zero past
//! a packed GEMM's last panel, `select(jo * 32 + ji < N, .., 0)`): per step of `o` the bound
//! moves past the whole loop and no other loop moves it, so the guard fails inside the loop
//! in one panel only, the last. Such a loop becomes
//!
//! ```text
//! if no-wrap checks && lo <= min && end <= hi {
//!   for v in [min, end) vectorized { body' }   // a full panel: constant extent, no tail
//! } else {
//!   for v in [min, end) vectorized { body }    // the ragged panel (or a wrap): as written
//! }
//! ```
//!
//! the same iterations in the same order either way, each select in `body'` picking what it
//! picked (every dropped conjunct holds in the whole loop). A serial loop of that form (the
//! default GEMM's A pack, `select(io * 12 + ii < M, A[..], 0)`, whose panel gathers rows) is
//! versioned the same way, both copies serial (`unswitch` then lifts the test out of the
//! depth loop between): the full panels store without the select; measured at 252 (no
//! guard) against 256 rows of a 256 x 256 GEMM, the pack took 11.6 % of a call against
//! 18.6 %. A serial loop is never split. After `vectorize` that is three
//! loops of the body (the vector panel, its scalar copy for a strided source, the loop as
//! written) where the split makes six (the interior's vector loop, vector and scalar tails
//! and strided copy, the edge, the loop kept for a wrap). Measured on the default GEMM with a
//! symbolic `n` (benches/RESULTS.md, "The partition pass only where it pays"): its first
//! build takes 16 % more instructions than with no partition, the split's 29 %; leaving the
//! pack scalar instead took 5-12 % more instructions per call at `n` = 500 and 128, the
//! versioned pack 1.5-2.6 % fewer than the split's. Split, not ragged ends: a padding guard,
//! whose bound the window's offset moves (`x + kw - 1 >= 0`, and in panels `xo * 32 + xi +
//! kw - 1 >= 0`, `kw` a loop: it fails in a panel at either end of each row for several
//! offsets, a convolution's image pack); a loop longer than a panel (a chunk of an
//! elementwise stage); fewer than 4 panels, known when the nest is built (the ragged one a
//! large share of the runs, which the split keeps mostly vector).

use super::vectorize::{
    coefficient_and_rest, conjuncts, has_load, unless_wrapping, within, NO_WRAP,
};
use crate::arith::simplify::{linear, simplify};
use crate::ir::expr::{CmpOp, Expr, ExprKind, LogicOp, Var};
use crate::ir::stmt::{ForKind, PrimFunc, Stmt};
use rivet_runtime::DType;
use std::collections::HashMap;

/// Most distinct varying conjuncts one loop is partitioned on (each adds a `max` or `min`).
const MAX_CONJUNCTS: usize = 8;

/// Partitions `f`'s vectorized loops (module header).
pub fn partition(f: &mut PrimFunc) {
    // Every loop variable of the function, with its extent: a variable a guard uses is bound
    // by a loop around it, or by none (a variable is bound once, used only in its scope).
    let mut loops: HashMap<u32, Expr> = HashMap::new();
    let mut ranges = Ranges::new();
    f.body.visit(&mut |s| {
        if let Stmt::For {
            var, min, extent, ..
        } = s
        {
            let extent = simplify(extent);
            if let (Some(lo), Some(n)) = (simplify(min).as_int(), extent.as_int()) {
                ranges.insert(var.id, (lo, n));
            }
            loops.insert(var.id, extent);
        }
    });
    f.body = f.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
        Stmt::For {
            var,
            min,
            extent,
            body,
            kind: kind @ (ForKind::Vectorized | ForKind::Serial),
        } => match partitioned(&var, &min, &extent, &body, kind, &loops, &ranges) {
            Some(p) => p,
            None => Stmt::For {
                var,
                min,
                extent,
                body,
                kind,
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
/// The loops of constant range: variable id -> (min, extent).
type Ranges = HashMap<u32, (i64, i64)>;

/// `within(t, lim)` pushed onto `no_wrap`, unless `t` is a loop variable whose constant range
/// already lies in `[-lim, lim]` (a panel index `xo in [0, 2)`: the check would be true on
/// every iteration, and it runs once per row of a pack). `None` when `within` fails.
fn push_within(no_wrap: &mut Vec<Expr>, t: &Expr, lim: i64, ranges: &Ranges) -> Option<()> {
    let known = t
        .as_var()
        .and_then(|x| ranges.get(&x.id))
        .is_some_and(|&(lo, n)| {
            let last = lo.checked_add(n.max(1) - 1);
            lo >= -lim && last.is_some_and(|l| l <= lim)
        });
    if !known {
        no_wrap.push(within(t, lim)?);
    }
    Some(())
}

fn bound(c: &Expr, v: &Var, no_wrap: &mut Vec<Expr>, ranges: &Ranges) -> Option<Bound> {
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
        push_within(no_wrap, t, NO_WRAP / k.unsigned_abs().max(1) as i64, ranges)?;
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

/// Longest loop whose ragged end is versioned rather than split: the default GEMM's panel (`NR` columns). A
/// longer constant loop with such a guard is a chunk of an elementwise stage (a 1-d pad split
/// by `schedule::cpu_default::CHUNK`), which is the kernel's whole work, not a pack beside it.
/// The value is the default GEMM's `packed_gemm::NR`, stated here because this pass sits
/// below the schedules (tests/module_graph.py); a test there checks that the two agree.
pub(crate) const MAX_PANEL: i64 = 32;

/// Fewest panels (iterations of the loop `o` around) for a ragged end to be versioned: with
/// fewer, known when the nest is built, the ragged panel is a large share of the runs (an
/// unpadded convolution's image rows of 56 in two panels of 32).
const MIN_PANELS: i64 = 4;

/// Whether conjunct `c` is a panel's ragged end on the loop `for v in [min, min + E)`, `E` a
/// constant of at most `MAX_PANEL`: `k * v + c_o * o + rest` compared with 0, `o` the
/// variable of a loop around it (in `loops`, with its extent) running `MIN_PANELS` or more
/// times (or a symbolic number), `|c_o| >= |k| * E`, `min` free of `o`, and `rest` free of
/// every loop variable. From one iteration of `o` to the next the bound on `v` the conjunct
/// gives moves by at least `E` (`ceil(x + d) >= ceil(x) + E` for `d >= E`, `E` an integer),
/// so it falls strictly inside the loop's range (the loop neither all true nor all false) for
/// one value of `o` at most, and no other loop moves it: the guard fails inside the loop in
/// one panel only, the last (or the first). A padding guard moves with the window's offset
/// (`xo * 32 + xi + kw - 1 >= 0`: `kw` a loop), so it fails in a panel at either end of
/// every row for several offsets; it is not a ragged end.
fn ragged_end(c: &Expr, v: &Var, min: &Expr, extent: &Expr, loops: &HashMap<u32, Expr>) -> bool {
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
    let is_panel = |t: &Expr, c_o: i64| {
        t.as_var().is_some_and(|o| {
            loops
                .get(&o.id)
                .is_some_and(|n| n.as_int().is_none_or(|n| n >= MIN_PANELS))
                && !min.uses(o)
                && (c_o as i128).abs() >= span
        })
    };
    let Some(i) = rest.terms.iter().position(|(t, c_o)| is_panel(t, *c_o)) else {
        return false;
    };
    let mut loop_free = true;
    for (j, (t, _)) in rest.terms.iter().enumerate() {
        if j != i {
            t.visit_unique(&mut |x| {
                loop_free &= x.as_var().is_none_or(|w| !loops.contains_key(&w.id));
            });
        }
    }
    k != 0 && loop_free
}

fn partitioned(
    v: &Var,
    min: &Expr,
    extent: &Expr,
    body: &Stmt,
    kind: ForKind,
    loops: &HashMap<u32, Expr>,
    ranges: &Ranges,
) -> Option<Stmt> {
    let conds = varying(body, v)?;
    // A loop whose every guard is a panel's ragged end (the GEMM's B pack) is versioned on
    // the whole panel instead: the vector loop of constant extent, with no strip-mining
    // tail, and no edge loop (module header). A serial loop is versioned in that case only
    // (the GEMM's A pack, whose panel gathers rows): its full panels drop the select.
    let ragged = conds.iter().all(|c| ragged_end(c, v, min, extent, loops));
    if kind != ForKind::Vectorized && !ragged {
        return None;
    }
    let mut no_wrap: Vec<Expr> = Vec::new();
    let (mut lo, mut hi): (Option<Expr>, Option<Expr>) = (None, None);
    for c in &conds {
        match bound(c, v, &mut no_wrap, ranges)? {
            Bound::Lower(e) => lo = Some(lo.map_or(e.clone(), |l| l.max_(&e))),
            Bound::Upper(e) => hi = Some(hi.map_or(e.clone(), |h| h.min_(&e))),
        }
    }
    for e in [min, extent] {
        match e.as_int() {
            Some(x) if x.unsigned_abs() <= NO_WRAP as u64 => {}
            Some(_) => return None,
            None => push_within(&mut no_wrap, e, NO_WRAP, ranges)?,
        }
    }
    let (has_lo, has_hi) = (lo.is_some(), hi.is_some());
    let end = simplify(&min.add(extent));
    if ragged {
        // `lo <= min && end <= hi`: every dropped conjunct holds in the whole loop; with the
        // no-wrap comparisons in the same `&&` (a bound that wrapped, computed by wrapping
        // int64 arithmetic in every backend, is only compared where the condition is false
        // anyway: the loop as written runs).
        let and = |a: Expr, b: Expr| Expr::new(ExprKind::Logic(LogicOp::And, a, b), DType::Bool);
        let inside = [
            lo.map(|l| Expr::cmp(CmpOp::Le, l, min.clone())),
            hi.map(|h| Expr::cmp(CmpOp::Le, end.clone(), h)),
        ]
        .into_iter()
        .flatten()
        .collect::<crate::error::Result<Vec<Expr>>>()
        .ok()?;
        let cond = no_wrap.into_iter().chain(inside).reduce(and)?;
        let whole = |kind: ForKind, body: Stmt| Stmt::For {
            var: v.clone(),
            min: min.clone(),
            extent: extent.clone(),
            kind,
            body: Box::new(body),
        };
        return Some(Stmt::If {
            cond: simplify(&cond),
            then: Box::new(whole(kind, strip(body, &conds))),
            otherwise: Some(Box::new(whole(kind, body.clone()))),
        });
    }
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

    /// A load of `X` guarded by a condition on its index.
    type Guard<'a> = dyn Fn(&[&Expr]) -> Expr + 'a;

    /// `for w in [0, 3): for o in [0, outer): for v in [0, extent) (of kind `kind`): P[(w * outer
    /// + o) * extent + v] = select(guard(w, o, v), X[index(w, o, v)], 0)` over float32
    /// buffers (`X` of `len` elements), partitioned; the function's text.
    fn partitioned_text_of(
        kind: ForKind,
        outer: Expr,
        extent: i64,
        len: Expr,
        dims: Vec<Var>,
        guard: &Guard<'_>,
        index: &Guard<'_>,
    ) -> String {
        let x = input(0, "X", DType::F32, vec![len.clone()]);
        let size = outer.mul(&Expr::int(3 * extent));
        let p = output(1, "P", DType::F32, vec![size]);
        let (xi, pi) = (x.id, p.id);
        let body = loop_over("w", Expr::int(3), ForKind::Serial, |w| {
            loop_over("o", outer.clone(), ForKind::Serial, |o| {
                loop_over("v", Expr::int(extent), kind, |v| {
                    let value = Expr::select(
                        guard(&[w, o, v]),
                        Expr::load(xi, vec![index(&[w, o, v])], DType::F32),
                        Expr::constant(0.0, DType::F32),
                    )
                    .unwrap();
                    let at = w.mul(&outer).add(o).mul(&Expr::int(extent)).add(v);
                    store(pi, vec![at], value)
                })
            })
        });
        let mut f = func("f", vec![x, p], dims, body);
        partition(&mut f);
        verify(&f, true).unwrap();
        f.to_string()
    }

    /// `o * step + v + shift`.
    fn at(step: i64, shift: Expr) -> impl Fn(&[&Expr]) -> Expr {
        move |l: &[&Expr]| l[1].mul(&Expr::int(step)).add(l[2]).add(&shift)
    }

    fn and(a: Expr, b: Expr) -> Expr {
        Expr::new(ExprKind::Logic(LogicOp::And, a, b), DType::Bool)
    }

    /// `0 <= e < len`.
    fn inside(e: Expr, len: &Expr) -> Expr {
        and(
            Expr::cmp(CmpOp::Le, Expr::int(0), e.clone()).unwrap(),
            e.lt(len),
        )
    }

    fn split(t: &str) -> bool {
        t.contains("let v.lo = ") && t.contains("let v.hi = ")
    }

    /// Versioned on the whole panel: the guard checked once, then the loop with no select
    /// (an unguarded load), else the loop as written.
    fn versioned(t: &str) -> bool {
        !t.contains(".lo")
            && t.matches("vectorized for v in [0, 32)").count() == 2
            && t.contains("] = X[")
            && t.contains("else:")
    }

    /// A ragged last panel (a GEMM's B pack: `o * 32 + v < n`, the panels counted by `n`) is
    /// versioned, not split. Not a ragged end, so split: panels 16 apart (the guard fails inside
    /// the loop for two values of `o`), a loop longer than a panel (an elementwise chunk), a
    /// constant of fewer than `MIN_PANELS` panels (the ragged one a large share).
    #[test]
    fn a_ragged_last_panel_is_versioned() {
        let n = Var::new("n");
        let (en, zero) = (Expr::var(&n), Expr::int(0));
        let panels = en.add(&Expr::int(31)).floordiv(&Expr::int(32));
        let ragged = |step: i64| {
            let at = at(step, Expr::int(0));
            let en = en.clone();
            move |l: &[&Expr]| at(l).lt(&en)
        };
        let t = partitioned_text_of(
            ForKind::Vectorized,
            panels.clone(),
            32,
            en.clone(),
            vec![n.clone()],
            &ragged(32),
            &at(32, zero.clone()),
        );
        assert!(versioned(&t), "{t}");
        // A constant number of panels, at least `MIN_PANELS`: versioned too.
        let t = partitioned_text_of(
            ForKind::Vectorized,
            Expr::int(4),
            32,
            en.clone(),
            vec![n.clone()],
            &ragged(32),
            &at(32, zero.clone()),
        );
        assert!(versioned(&t), "{t}");
        for (outer, extent, step) in [
            (panels.clone(), 32, 16),
            (panels, 64, 64),
            (Expr::int(2), 32, 32),
        ] {
            let t = partitioned_text_of(
                ForKind::Vectorized,
                outer,
                extent,
                en.clone(),
                vec![n.clone()],
                &ragged(step),
                &at(step, zero.clone()),
            );
            assert!(t.contains("v.hi"), "{extent} {step}: {t}");
        }
    }

    /// A convolution's padded row (`0 <= v + w - 1 < 16`, `w` the window's offset) keeps its
    /// partition: scalar edges around an unguarded interior. So does a row in panels of 32
    /// (an image pack's: `0 <= o * 32 + v + w - 1 < n` beside the ragged end `o * 32 + v <
    /// n`): the offset `w` moves the padding's bound, so it fails in several panels.
    /// A serial loop (the GEMM's A pack: a row panel of 12 whose loads gather rows) guarded
    /// by its ragged end is versioned, both copies serial; with a padding guard (moved by the
    /// window's offset `w`) it is left as it is: serial loops are never split.
    #[test]
    fn a_serial_ragged_panel_is_versioned_and_never_split() {
        let n = Var::new("n");
        let en = Expr::var(&n);
        let rows = en.add(&Expr::int(11)).floordiv(&Expr::int(12));
        let en2 = en.clone();
        let t = partitioned_text_of(
            ForKind::Serial,
            rows.clone(),
            12,
            en.clone(),
            vec![n.clone()],
            &move |l: &[&Expr]| at(12, Expr::int(0))(l).lt(&en2),
            &at(12, Expr::int(0)),
        );
        assert!(
            !t.contains(".lo")
                && !t.contains("vectorized")
                && t.matches("for v in [0, 12)").count() == 2
                && t.contains("] = X[")
                && t.contains("else:"),
            "{t}"
        );
        // The window's offset `w` moves the bound: not a ragged end, and a serial loop is not
        // split, so the loop stays as written.
        let en3 = en.clone();
        let padded = move |l: &[&Expr]| {
            at(12, Expr::int(0))(l)
                .add(l[0])
                .sub(&Expr::int(1))
                .lt(&en3)
        };
        let t = partitioned_text_of(
            ForKind::Serial,
            rows,
            12,
            en.add(&Expr::int(2)),
            vec![n.clone()],
            &padded,
            &at(12, Expr::int(0)),
        );
        assert!(
            !t.contains(".lo")
                && !t.contains("else:")
                && t.matches("for v in [0, 12)").count() == 1,
            "{t}"
        );
    }

    #[test]
    fn a_padded_row_is_partitioned() {
        let len = Expr::int(16);
        let shifted = |l: &[&Expr]| l[2].add(l[0]).sub(&Expr::int(1));
        let t = partitioned_text_of(
            ForKind::Vectorized,
            Expr::int(1),
            16,
            len.clone(),
            vec![],
            &|l| inside(shifted(l), &len),
            &shifted,
        );
        assert!(split(&t), "{t}");
        // The interior's store is the unguarded load.
        assert!(t.contains("= X[((v + w) - 1)]"), "{t}");
        let n = Var::new("n");
        let en = Expr::var(&n);
        let panels = en.add(&Expr::int(31)).floordiv(&Expr::int(32));
        let pad = |l: &[&Expr]| at(32, Expr::int(-1))(l).add(l[0]);
        let t = partitioned_text_of(
            ForKind::Vectorized,
            panels,
            32,
            en.clone(),
            vec![n.clone()],
            &|l| and(at(32, Expr::int(0))(l).lt(&en), inside(pad(l), &en)),
            &pad,
        );
        assert!(split(&t), "{t}");
    }
}
