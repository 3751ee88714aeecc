//! Pass: loop unswitching of the vectorize pass's layout tests (CPU). `vectorize` versions a
//! vector loop on its strides being 1 (`if X.s1 == 1 { vector loop } else { scalar loop }`)
//! right around that loop; when the loop sits in a serial loop of its own (the `ko` loop of a
//! 16-lane partial sum), the test is repeated every iteration and, worse, the outer loop's
//! body is a branch whose arms touch the same buffer differently, which hides the vector
//! accumulators the code generator would keep in registers (`codegen/cranelift/hoist.rs`).
//! Here `for v { if c { A } else { B } }` becomes `if c { for v { A } } else { for v { B } }`
//! whenever `c` cannot change in the loop and cannot fault: no variable bound inside the loop,
//! no load, no division but by a positive constant. Bottom-up, so a test rises through every serial loop around it.
//!
//! Invariant: the condition has the same value in every iteration and evaluating it has no
//! effect, so running the loop under the branch it selects is running the loop; a loop of no
//! iterations evaluates the condition once, harmlessly. Parallel and GPU loops are not
//! touched.
//!
//! `selects` (every target, before `vectorize`) does the same for a `select` in a
//! `vectorized` loop: `for v { .. select(c, a, b) .. }` becomes `if c { for v { .. a .. } }
//! else { for v { .. b .. } }` when `c` is invariant in that sense and an arm loads memory.
//! Such a select keeps the loop scalar (`vectorize` evaluates both arms for every lane and
//! must not load what the scalar loop would skip); unswitched, each copy has one arm only, so
//! it evaluates exactly what the scalar loop evaluated in those iterations. The case that
//! matters: `te.gradient`'s guard `select(m >= 1, (sum_j f) * c, 0)` on a factored sum over a
//! symbolic extent, inside a row's loop. At most `MAX_SELECT_TESTS` conditions per loop (the
//! body is copied once per condition: at most 4 copies).

use crate::ir::expr::{BinOp, Expr, ExprKind};
use crate::ir::stmt::{ForKind, PrimFunc, Stmt};
use std::collections::HashSet;

/// Unswitches `f`'s serial loops (module doc).
pub fn unswitch(f: &mut PrimFunc) {
    f.body = f.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
        Stmt::For {
            var,
            min,
            extent,
            body,
            kind: kind @ (ForKind::Serial | ForKind::Vectorized | ForKind::Unrolled),
        } => match *body {
            Stmt::If {
                cond,
                then,
                otherwise: Some(otherwise),
            } if invariant_test(&cond, &var, &then, &otherwise) => {
                let wrap = |b: Box<Stmt>| Stmt::For {
                    var: var.clone(),
                    min: min.clone(),
                    extent: extent.clone(),
                    body: b,
                    kind,
                };
                Stmt::If {
                    cond,
                    then: Box::new(wrap(then)),
                    otherwise: Some(Box::new(wrap(otherwise))),
                }
            }
            body => Stmt::For {
                var,
                min,
                extent,
                body: Box::new(body),
                kind,
            },
        },
        other => other,
    });
}

/// Most distinct select conditions `selects` takes out of one loop.
const MAX_SELECT_TESTS: usize = 2;

/// Unswitches the invariant selects of `f`'s vectorized loops (module doc).
pub fn selects(f: &mut PrimFunc) {
    f.body = f.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
        Stmt::For {
            var,
            min,
            extent,
            body,
            kind: ForKind::Vectorized,
        } => split_on_selects(var, min, extent, *body, MAX_SELECT_TESTS),
        other => other,
    });
}

/// `for var { body }` (vectorized) with its first invariant select of a loading arm taken out
/// as a branch, then the same for each copy, `depth` conditions at most.
fn split_on_selects(
    var: crate::ir::Var,
    min: Expr,
    extent: Expr,
    body: Stmt,
    depth: usize,
) -> Stmt {
    let test = if depth == 0 {
        None
    } else {
        let mut bound: HashSet<u32> = HashSet::from([var.id]);
        collect_bound(&body, &mut bound);
        let mut found = None;
        body.visit_exprs(&mut |e| {
            e.visit_unique(&mut |n| {
                if let ExprKind::Select(c, a, b) = n.kind() {
                    if found.is_none() && (loads(a) || loads(b)) && invariant(c, &bound) {
                        found = Some(c.clone());
                    }
                }
            })
        });
        found
    };
    let Some(cond) = test else {
        return Stmt::For {
            var,
            min,
            extent,
            body: Box::new(body),
            kind: ForKind::Vectorized,
        };
    };
    let arm = |take_then: bool| {
        let chosen = body.rewrite(
            &mut |e| {
                e.rewrite(&mut |n| match n.kind() {
                    ExprKind::Select(c, a, b) if *c == cond => {
                        Some(if take_then { a.clone() } else { b.clone() })
                    }
                    _ => None,
                })
            },
            &mut |s| s,
        );
        Box::new(split_on_selects(
            var.clone(),
            min.clone(),
            extent.clone(),
            chosen,
            depth - 1,
        ))
    };
    Stmt::If {
        cond: cond.clone(),
        then: arm(true),
        otherwise: Some(arm(false)),
    }
}

fn loads(e: &Expr) -> bool {
    let mut l = false;
    e.visit_unique(&mut |n| l |= matches!(n.kind(), ExprKind::Load { .. }));
    l
}

/// The variables a loop body binds (inner loops and lets).
fn collect_bound(s: &Stmt, bound: &mut HashSet<u32>) {
    s.visit(&mut |s| {
        if let Stmt::For { var, .. } | Stmt::Let { var, .. } = s {
            bound.insert(var.id);
        }
    });
}

fn invariant_test(cond: &Expr, var: &crate::ir::Var, then: &Stmt, otherwise: &Stmt) -> bool {
    let mut bound: HashSet<u32> = HashSet::from([var.id]);
    for s in [then, otherwise] {
        collect_bound(s, &mut bound);
    }
    invariant(cond, &bound)
}

/// `cond` reads no variable of `bound`, loads nothing and divides by nothing but positive
/// integer constants (which cannot fault: a fused loop's `f // 40`, `f % 40`): the same value
/// in every iteration, evaluated with no effect.
fn invariant(cond: &Expr, bound: &HashSet<u32>) -> bool {
    let mut ok = true;
    cond.visit(&mut |n| match n.kind() {
        ExprKind::Var(v) if bound.contains(&v.id) => ok = false,
        ExprKind::Binary(BinOp::FloorDiv | BinOp::FloorMod, _, d)
            if d.as_int().is_some_and(|d| d > 0) => {}
        ExprKind::Load { .. }
        | ExprKind::Read { .. }
        | ExprKind::Reduce { .. }
        | ExprKind::Invalid(_)
        | ExprKind::Binary(BinOp::Div | BinOp::FloorDiv | BinOp::FloorMod, ..) => ok = false,
        _ => {}
    });
    ok
}
