//! Pass: short vector loops unrolled (CPU). After `vectorize`, a serial loop of a constant trip
//! count of at most `MAX` whose body is only vector stores — the strip of a 16-lane partial
//! sum (four f32x4 iterations), a 32-wide row of a register tile (eight) — becomes its body
//! repeated with the loop variable a constant, then simplified: no counter, no branch,
//! constant offsets, and each copy's accesses visible as they are to the code generator's
//! promotion of loop-carried vectors to registers (`codegen/cranelift/hoist.rs`).
//!
//! A loop the schedule marked `unroll` (`ForKind::Unrolled`) of a constant trip count of at
//! most `MAX_MARKED` is unrolled whatever its body (a register tile's rows: each row's
//! accumulator then has a constant address the promotion can keep in a register); longer or
//! symbolic ones stay loops, and so does any loop whose copies would exceed
//! `MAX_UNROLLED_NODES` (nested marks multiply).
//!
//! Invariant: the copies run the iterations in order, each once, with the same statements, so
//! the result is the loop's; only loops the backends would run serially are touched.

use crate::ir::expr::Expr;
use crate::ir::stmt::{ForKind, PrimFunc, Stmt};

/// The longest loop of vector stores unrolled without being asked.
pub const MAX: i64 = 8;
/// The longest loop marked `unroll` that is unrolled.
pub const MAX_MARKED: i64 = 64;

/// The most IR nodes (statements and expression nodes) a loop may have once unrolled: nested
/// `unroll` marks multiply (three nested loops of 64 would be 262,144 copies of the body), so
/// a loop whose copies would exceed this stays a loop (the same results, as for any extent).
pub const MAX_UNROLLED_NODES: usize = 1 << 14;

/// Unrolls every short loop of vector stores, and every loop marked `unroll` within the limits,
/// in `f` (module doc). Bottom-up: an inner loop is unrolled first, so an outer loop's size
/// counts its copies.
pub fn unroll(f: &mut PrimFunc) {
    f.body = f.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
        Stmt::For {
            var,
            min,
            extent,
            body,
            kind,
        } => {
            let limit = if kind == ForKind::Unrolled {
                MAX_MARKED
            } else if kind != ForKind::Parallel
                && !matches!(kind, ForKind::Thread(_))
                && only_vector_stores(&body)
            {
                MAX
            } else {
                0
            };
            let trips = min.as_int().zip(extent.as_int()).and_then(|(lo, n)| {
                // `lo + n` checked: a constant start near i64::MAX keeps its loop.
                ((0..=limit).contains(&n) && lo.checked_add(n).is_some()).then_some((lo, n))
            });
            let fits = |n: i64| (size(&body).saturating_mul(n as usize)) <= MAX_UNROLLED_NODES;
            match trips {
                Some((lo, n)) if limit > 0 && fits(n) => Stmt::Seq(
                    (lo..lo + n)
                        .map(|k| {
                            let c = Expr::int(k);
                            body.rewrite(
                                &mut |e| e.substitute(&|x| (*x == var).then(|| c.clone())),
                                &mut |s| s,
                            )
                        })
                        .collect(),
                ),
                _ => Stmt::For {
                    var,
                    min,
                    extent,
                    body,
                    kind,
                },
            }
        }
        other => other,
    });
}

/// Statements and expression nodes of `s`, up to `MAX_UNROLLED_NODES + 1`.
fn size(s: &Stmt) -> usize {
    let mut n = 0usize;
    s.visit(&mut |_| n += 1);
    s.visit_exprs(&mut |e| n = n.saturating_add(e.tree_size_upto(MAX_UNROLLED_NODES + 1)));
    n.min(MAX_UNROLLED_NODES + 1)
}

/// True when `s` is vector stores (under `let`s and sequences) and nothing else.
pub fn only_vector_stores(s: &Stmt) -> bool {
    match s {
        Stmt::Store { value, .. } => value.is_vector(),
        Stmt::Seq(v) => v.iter().all(only_vector_stores),
        Stmt::Let { body, .. } => only_vector_stores(body),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::expr::{BufId, Var};
    use crate::ir::test_util::{func, loop_over, output, store};
    use rivet_runtime::DType;

    fn one_store(i: &Expr) -> Stmt {
        store(BufId(0), vec![i.clone()], Expr::constant(1.0, DType::F32))
    }

    fn unrolled(body: Stmt) -> Stmt {
        let out = output(0, "Y", DType::F32, vec![Expr::int(1 << 20)]);
        let mut f = func("f", vec![out], vec![], body);
        unroll(&mut f);
        f.body
    }

    fn loops(s: &Stmt) -> usize {
        let mut n = 0;
        s.visit(&mut |x| n += matches!(x, Stmt::For { .. }) as usize);
        n
    }

    #[test]
    fn a_marked_loop_unrolls_and_nested_marks_stop_at_the_size_limit() {
        // One marked loop of 12: twelve stores, no loop.
        let s = unrolled(loop_over("i", Expr::int(12), ForKind::Unrolled, one_store));
        assert_eq!(loops(&s), 0, "{s:?}");
        // Three nested marked loops of 64 (262,144 copies of the store): the innermost unrolls
        // (64 stores of about a dozen nodes each), the next would exceed MAX_UNROLLED_NODES, so
        // it and the outer one stay loops.
        let s = unrolled(loop_over("i", Expr::int(64), ForKind::Unrolled, |i| {
            loop_over("j", Expr::int(64), ForKind::Unrolled, |j| {
                loop_over("k", Expr::int(64), ForKind::Unrolled, |k| {
                    store(
                        BufId(0),
                        vec![i.mul(&Expr::int(4096)).add(&j.mul(&Expr::int(64))).add(k)],
                        Expr::constant(1.0, DType::F32),
                    )
                })
            })
        }));
        assert_eq!(loops(&s), 2);
        let mut stores = 0;
        s.visit(&mut |x| stores += matches!(x, Stmt::Store { .. }) as usize);
        assert_eq!(stores, 64);
        assert!(size(&s) <= MAX_UNROLLED_NODES);
        // Longer than MAX_MARKED, or not constant: loops.
        let s = unrolled(loop_over("i", Expr::int(65), ForKind::Unrolled, one_store));
        assert_eq!(loops(&s), 1);
    }

    #[test]
    fn a_start_near_i64_max_keeps_its_loop() {
        for (lo, n) in [(i64::MAX - 3, 8), (i64::MAX, 1), (i64::MIN, 4)] {
            let v = Var::new("i");
            let e = Expr::var(&v);
            let s = unrolled(Stmt::For {
                var: v,
                min: Expr::int(lo),
                extent: Expr::int(n),
                kind: ForKind::Unrolled,
                body: Box::new(one_store(&e)),
            });
            // lo + n overflows for the first two: not unrolled (no panic, no wrapped range).
            let expect = usize::from(lo.checked_add(n).is_none());
            assert_eq!(loops(&s), expect, "lo {lo} n {n}");
        }
    }
}
