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
//! A longer loop of vector stores (a row's elementwise update, a chunk of a column sum: 256
//! f32x4 steps) is unrolled by `BY`: `for u in [0, n // BY)` running the body at `lo + u*BY`,
//! `+ 1`, ..., `+ BY - 1`, then the `n % BY` iterations left over (unrolled when `n` is a
//! constant, else a loop from `lo + (max(n, 0) // BY) * BY`). One counter step and branch per
//! `BY` vectors, and the copies' constant offsets become addressing displacements: a row update
//! ran 0.145 -> 0.125 ms, a column sum 0.096 -> 0.073 (`benches/codegen_pieces.py`), softmax's
//! saved backward (its row sum's steps of sixteen lane partials too) 0.186 -> 0.166 ms. Not
//! unrolled: a loop known through `let`s to run at most `MAX` times, a body with a
//! transcendental function (long vector code; `exp_run` wants the one-store loop), and one
//! carrying more than `MAX_CARRIED` vectors from step to step.
//!
//! Invariant: the copies run the iterations in order, each once, with the same statements, so
//! the result is the loop's; only loops the backends would run serially are touched. The
//! bounds proof ran before this pass: the indices are the same values, in the same order.

use crate::ir::expr::{BinOp, Expr, ExprKind, UnOp, Var};
use crate::ir::stmt::{ForKind, PrimFunc, Stmt};
use std::collections::HashMap;

/// The longest loop of vector stores unrolled without being asked.
pub const MAX: i64 = 8;
/// The longest loop marked `unroll` that is unrolled.
pub const MAX_MARKED: i64 = 64;

/// The copies of a longer loop of vector stores per step of its unrolled loop.
pub const BY: i64 = 4;

/// The most carried vectors (`carried`) a loop unrolled by steps may have: one 16-lane sum's
/// four partials. With more (layer_norm's backward sums three rows at once: twelve), the
/// copies' loads come first and the partials no longer fit the sixteen xmm registers (spilled
/// on every step); one step per loop iteration keeps them in registers.
pub const MAX_CARRIED: usize = 4;

/// The most IR nodes (statements and expression nodes) a loop may have once unrolled: nested
/// `unroll` marks multiply (three nested loops of 64 would be 262,144 copies of the body), so
/// a loop whose copies would exceed this stays a loop (the same results, as for any extent).
pub const MAX_UNROLLED_NODES: usize = 1 << 14;

/// Unrolls every short loop of vector stores, and every loop marked `unroll` within the limits,
/// in `f` (module doc). Bottom-up: an inner loop is unrolled first, so an outer loop's size
/// counts its copies.
pub fn unroll(f: &mut PrimFunc) {
    // The `let` values by variable (ids are unique in a function): a vector loop's extent is
    // often `n // 4` of a `let n = max(min(4, ..), 0)` (a tile's last columns).
    let mut lets: HashMap<u32, Expr> = HashMap::new();
    f.body.visit(&mut |s| {
        if let Stmt::Let { var, value, .. } = s {
            lets.insert(var.id, value.clone());
        }
    });
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
                        .map(|k| at(&body, &var, &Expr::int(k)))
                        .collect(),
                ),
                _ if limit == MAX
                    && fits(BY)
                    && steps_apply(&min, &extent)
                    && upper_bound(&extent, &lets, 8).is_none_or(|hi| hi > MAX)
                    && light(&body)
                    && carried(&body, &var) <= MAX_CARRIED =>
                {
                    by_steps(var, min, extent, &body)
                }
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

/// Whether a loop of vector stores over `[min, min + extent)` is unrolled by steps: int64
/// bounds, and a symbolic extent or a constant one past `MAX` whose end does not overflow.
fn steps_apply(min: &Expr, extent: &Expr) -> bool {
    let int64 = |e: &Expr| e.dtype() == rivet_runtime::DType::I64;
    int64(min)
        && int64(extent)
        && match (min.as_int(), extent.as_int()) {
            (_, Some(n)) if n <= MAX => false,
            (Some(lo), Some(n)) => lo.checked_add(n).is_some(),
            _ => true,
        }
}

/// A constant `hi` with `e <= hi` wherever `e` is defined (`lets` looked through, `depth` deep),
/// from constants, `min`, `max`, `+` and floor division by a positive constant; `None` when
/// none is found. Decides only whether a loop is worth unrolling by steps: a tile's last
/// columns, `let n = max(min(4, ..), 0)` then a loop to `n // 4`, run at most once.
fn upper_bound(e: &Expr, lets: &HashMap<u32, Expr>, depth: u32) -> Option<i64> {
    if let Some(k) = e.as_int() {
        return Some(k);
    }
    let depth = depth.checked_sub(1)?;
    let ub = |x: &Expr| upper_bound(x, lets, depth);
    match e.kind() {
        ExprKind::Var(v) => ub(lets.get(&v.id)?),
        ExprKind::Binary(BinOp::Min, a, b) => match (ub(a), ub(b)) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        },
        ExprKind::Binary(BinOp::Max, a, b) => Some(ub(a)?.max(ub(b)?)),
        ExprKind::Binary(BinOp::Add, a, b) => ub(a)?.checked_add(ub(b)?),
        ExprKind::Binary(BinOp::FloorDiv, a, b) => {
            let k = b.as_int().filter(|&k| k > 0)?;
            Some(ub(a)?.div_euclid(k))
        }
        _ => None,
    }
}

/// The vector stores of `body` at an index that does not use `var`: values carried from step
/// to step (a row sum's lane partials), which the code generator keeps in registers
/// (`codegen/cranelift/hoist.rs`).
fn carried(body: &Stmt, var: &Var) -> usize {
    let mut n = 0;
    body.visit(&mut |s| {
        if let Stmt::Store { indices, .. } = s {
            n += usize::from(!indices.iter().any(|i| i.uses(var)));
        }
    });
    n
}

/// True when `body` computes no transcendental function: their vector code is long (an inline
/// `exp` with its cold block, a 16-lane `erf`), so copies of it only grow the code, and a
/// loop storing only `exp(X[j] - s)` must stay one loop for `rivet_exp_run`
/// (`codegen/cranelift/exp_run.rs`).
fn light(body: &Stmt) -> bool {
    let mut ok = true;
    body.visit_exprs(&mut |e| {
        e.visit(&mut |n| {
            ok &= !matches!(
                n.kind(),
                ExprKind::Unary(
                    UnOp::Exp | UnOp::Log | UnOp::Tanh | UnOp::Sigmoid | UnOp::Erf,
                    _
                )
            )
        })
    });
    ok
}

/// `body` with `var` replaced by `value`.
fn at(body: &Stmt, var: &Var, value: &Expr) -> Stmt {
    body.rewrite(
        &mut |e| e.substitute(&|x| (*x == *var).then(|| value.clone())),
        &mut |s| s,
    )
}

/// `for var in [min, min + extent): body` (a loop of vector stores longer than `MAX`, or of a
/// symbolic trip count) as steps of `BY` copies, then the iterations left over (module doc).
fn by_steps(var: Var, min: Expr, extent: Expr, body: &Stmt) -> Stmt {
    let u = Var::new(&format!("{}.u", var.name));
    let ue = Expr::var(&u);
    let by = Expr::int(BY);
    // max(n, 0): a negative extent is an empty loop, and stays one.
    let steps = extent.max_(&Expr::int(0)).floordiv(&by);
    let start = min.add(&ue.mul(&by));
    let main = Stmt::For {
        var: u,
        min: Expr::int(0),
        extent: steps.clone(),
        body: Box::new(Stmt::Seq(
            (0..BY)
                .map(|k| at(body, &var, &start.add(&Expr::int(k))))
                .collect(),
        )),
        kind: ForKind::Serial,
    };
    let done = min.add(&steps.mul(&by));
    let rest = match extent.as_int() {
        Some(n) => Stmt::Seq(
            (0..n.max(0) % BY)
                .map(|k| at(body, &var, &done.add(&Expr::int(k))))
                .collect(),
        ),
        None => Stmt::For {
            var,
            min: done,
            extent: extent.sub(&steps.mul(&by)),
            body: Box::new(body.clone()),
            kind: ForKind::Serial,
        },
    };
    Stmt::seq(vec![main, rest])
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
    use crate::ir::expr::BufId;
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

    /// `Y[ramp(v * 4, 1, 4)] = 1.0`: a vector store whose ramp base is `4 v`.
    fn vector_store(v: &Expr) -> Stmt {
        store(
            BufId(0),
            vec![Expr::ramp(v.mul(&Expr::int(4)), Expr::int(1), 4)],
            Expr::broadcast(Expr::constant(1.0, DType::F32), 4),
        )
    }

    /// Runs `s` with `env`'s values of its free variables, recording the ramp base of every
    /// store in order (a loop's bounds and each index evaluated by substitution and
    /// simplification to a constant).
    fn trace(s: &Stmt, env: &mut HashMap<u32, i64>, out: &mut Vec<i64>) {
        let eval = |e: &Expr, env: &HashMap<u32, i64>| {
            crate::arith::simplify::simplify(
                &e.substitute(&|x| env.get(&x.id).map(|&k| Expr::int(k))),
            )
            .as_int()
            .unwrap_or_else(|| panic!("not constant: {e}"))
        };
        match s {
            Stmt::Seq(v) => v.iter().for_each(|x| trace(x, env, out)),
            Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } => {
                let (lo, n) = (eval(min, env), eval(extent, env));
                for k in lo..lo + n.max(0) {
                    env.insert(var.id, k);
                    trace(body, env, out);
                }
                env.remove(&var.id);
            }
            Stmt::Store { indices, .. } => {
                let ExprKind::Ramp { base, .. } = indices[0].kind() else {
                    panic!("a ramp")
                };
                out.push(eval(base, env));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    // A loop of vector stores longer than MAX runs in steps of BY copies, then what is left
    // (unrolled for a constant trip count, a loop for a symbolic one): the same stores in the
    // same order, for constant trip counts around multiples of BY and symbolic ones (including
    // zero, negative, and i64::MIN at run time).
    #[test]
    fn long_vector_loops_run_in_steps_with_the_same_stores() {
        for n in [9i64, 12, 13, 256, 259] {
            let s = unrolled(loop_over("j", Expr::int(n), ForKind::Serial, vector_store));
            let mut got = Vec::new();
            trace(&s, &mut HashMap::new(), &mut got);
            assert_eq!(got, (0..n).map(|k| 4 * k).collect::<Vec<_>>(), "n = {n}");
            // One loop (the steps), BY stores in it, and n % BY after it.
            assert_eq!(loops(&s), 1, "n = {n}: {s:?}");
        }
        let m = Var::new("m");
        let s = unrolled(loop_over("j", Expr::var(&m), ForKind::Serial, vector_store));
        // The steps and the loop over what is left.
        assert_eq!(loops(&s), 2, "{s:?}");
        for value in [0i64, 1, 3, 4, 5, 17, -5] {
            let mut got = Vec::new();
            trace(&s, &mut HashMap::from([(m.id, value)]), &mut got);
            let want: Vec<i64> = (0..value.max(0)).map(|k| 4 * k).collect();
            assert_eq!(got, want, "m = {value}");
        }
        // Hostile run-time extents: no store, and no overflow in the bounds.
        for value in [i64::MIN, i64::MIN + 1] {
            let mut got = Vec::new();
            trace(&s, &mut HashMap::from([(m.id, value)]), &mut got);
            assert!(got.is_empty());
        }
    }

    // Not unrolled in steps: at most MAX iterations known through a `let` (a tile's last
    // columns), a transcendental in the body (`exp_run` needs the one-store loop), a constant
    // start whose end would overflow, a non-positive constant extent.
    #[test]
    fn short_exp_or_overflowing_vector_loops_keep_their_shape() {
        let n = Var::new("n");
        let t = Var::new("t.n");
        let s = unrolled(Stmt::Let {
            var: t.clone(),
            value: Expr::var(&n).min_(&Expr::int(16)).max_(&Expr::int(0)),
            body: Box::new(loop_over(
                "j",
                Expr::var(&t).floordiv(&Expr::int(4)),
                ForKind::Serial,
                vector_store,
            )),
        });
        assert_eq!(loops(&s), 1, "{s:?}");
        let Stmt::Let { body, .. } = &s else { panic!() };
        assert!(matches!(**body, Stmt::For { .. }), "{s:?}");
        let s = unrolled(loop_over("j", Expr::int(256), ForKind::Serial, |v| {
            store(
                BufId(0),
                vec![Expr::ramp(v.mul(&Expr::int(4)), Expr::int(1), 4)],
                Expr::unary(
                    UnOp::Exp,
                    Expr::broadcast(Expr::constant(1.0, DType::F32), 4),
                )
                .unwrap(),
            )
        }));
        let Stmt::For { extent, .. } = &s else {
            panic!("{s:?}")
        };
        assert_eq!(extent.as_int(), Some(256));
        for (lo, n) in [(i64::MAX - 10, 100i64), (0, -5), (0, i64::MIN)] {
            let v = Var::new("j");
            let e = Expr::var(&v);
            let s = unrolled(Stmt::For {
                var: v,
                min: Expr::int(lo),
                extent: Expr::int(n),
                kind: ForKind::Serial,
                body: Box::new(vector_store(&e)),
            });
            let Stmt::For { extent, .. } = &s else {
                panic!("{s:?}")
            };
            assert_eq!(extent.as_int(), Some(n), "lo {lo} n {n}");
        }
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
