//! Pass: loop unswitching of the vectorize pass's layout tests (CPU). `vectorize` versions a
//! vector loop on its strides being 1 (`if X.s1 == 1 { vector loop } else { scalar loop }`)
//! right around that loop; when the loop sits in a serial loop of its own (the `ko` loop of a
//! 16-lane partial sum), the test is repeated every iteration and, worse, the outer loop's
//! body is a branch whose arms touch the same buffer differently, which hides the vector
//! accumulators the code generator would keep in registers (`codegen/cranelift/hoist.rs`).
//! Here `for v { if c { A } else { B } }` becomes `if c { for v { A } } else { for v { B } }`
//! whenever `c` cannot change in the loop and cannot fault: no variable bound inside the loop,
//! no load, no division. Bottom-up, so a test rises through every serial loop around it.
//!
//! Invariant: the condition has the same value in every iteration and evaluating it has no
//! effect, so running the loop under the branch it selects is running the loop; a loop of no
//! iterations evaluates the condition once, harmlessly. Parallel and GPU loops are not
//! touched.

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

fn invariant_test(cond: &Expr, var: &crate::ir::Var, then: &Stmt, otherwise: &Stmt) -> bool {
    let mut bound: HashSet<u32> = HashSet::from([var.id]);
    for s in [then, otherwise] {
        s.visit(&mut |s| {
            if let Stmt::For { var, .. } | Stmt::Let { var, .. } = s {
                bound.insert(var.id);
            }
        });
    }
    let mut ok = true;
    cond.visit(&mut |n| match n.kind() {
        ExprKind::Var(v) if bound.contains(&v.id) => ok = false,
        ExprKind::Load { .. }
        | ExprKind::Read { .. }
        | ExprKind::Reduce { .. }
        | ExprKind::Invalid(_)
        | ExprKind::Binary(BinOp::Div | BinOp::FloorDiv | BinOp::FloorMod, ..) => ok = false,
        _ => {}
    });
    ok
}
