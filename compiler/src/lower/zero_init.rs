//! Pass: zero stores into a freshly allocated local dropped (CPU). `Allocate` zero-fills its
//! buffer (the IR's meaning, in the interpreter and every backend), so a statement of the
//! allocation's body that only stores zeros into that buffer, reached before any other
//! statement of the body writes it, stores what is already there. The default GEMM's
//! `C.padded[i, j] = 0` before its micro-kernels accumulate is such a pass over 4 MB at 1024.
//!
//! Invariant: a statement is dropped only when running it could change nothing: it is made of
//! loops, sequences, `let`s and `if`s whose bounds, bindings and conditions load nothing and
//! divide only by non-zero constants (so evaluating them cannot fail or read memory), and
//! stores of `+0.0` / `0` (scalar or broadcast; never `-0.0`, whose bits differ) into the
//! allocated buffer at indices that load nothing either; and it is a statement of the body's
//! top-level sequence (through nested `Allocate`s, `let`s and sequences, never inside a loop:
//! an init inside a loop re-zeroes what earlier iterations wrote) that no earlier top-level
//! statement writes the buffer in (a store or an intrinsic's region; anything opaque counts
//! as a write). Reads before it are harmless: they read the zeros the init would store.

use crate::ir::expr::{BinOp, Const, Expr, ExprKind};
use crate::ir::{BufId, PrimFunc, Stmt};
use std::collections::HashSet;

/// Drops the redundant zero initialisations of `f`'s locals (module doc).
pub fn drop_zero_inits(f: &mut PrimFunc) {
    // A local `lower::overwrite` marked is allocated without zeroing: its zero stores are
    // what zeroes it, so they stay (that pass does not mark locals whose covering store is a
    // zero, so this is a second guard).
    let unzeroed: Vec<BufId> = f
        .buffers
        .iter()
        .filter(|b| b.overwritten)
        .map(|b| b.id)
        .collect();
    f.body = f.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
        Stmt::Allocate { bufs, body } => {
            let mut fresh = Fresh {
                bufs: bufs
                    .iter()
                    .copied()
                    .filter(|b| !unzeroed.contains(b))
                    .collect(),
                written: HashSet::new(),
                all_written: false,
            };
            let body = if fresh.bufs.is_empty() {
                *body
            } else {
                scan(*body, &mut fresh)
            };
            Stmt::Allocate {
                bufs,
                body: Box::new(body),
            }
        }
        other => other,
    });
}

/// The freshly allocated (zeroed) buffers of one `Allocate`, and which of them the
/// statements scanned so far may have written. One scan of the body serves all of them, so
/// an allocation of many locals (a program's root temporaries) costs one pass, not one each.
struct Fresh {
    bufs: HashSet<BufId>,
    written: HashSet<BufId>,
    /// A statement scanned so far may write anything (it holds what this pass does not
    /// look into).
    all_written: bool,
}

/// The statements of an allocation's body in program order, at its top level.
fn scan(s: Stmt, fresh: &mut Fresh) -> Stmt {
    match s {
        Stmt::Seq(v) => Stmt::Seq(v.into_iter().map(|s| scan(s, fresh)).collect()),
        Stmt::Allocate { bufs, body } => Stmt::Allocate {
            bufs,
            body: Box::new(scan(*body, fresh)),
        },
        Stmt::Let { var, value, body } if pure(&value) => Stmt::Let {
            var,
            value,
            body: Box::new(scan(*body, fresh)),
        },
        s if fresh.all_written => s,
        s => {
            let mut w = HashSet::new();
            if writes_into(&s, &mut w) {
                fresh.all_written = true;
                return s;
            }
            if let [b] = w.iter().copied().collect::<Vec<_>>()[..] {
                if fresh.bufs.contains(&b) && !fresh.written.contains(&b) && only_zero_stores(&s, b)
                {
                    return Stmt::Seq(Vec::new());
                }
            }
            fresh.written.extend(w);
            s
        }
    }
}

/// `s` stores nothing but zeros into `buf`, and evaluating its control reads no memory and
/// cannot fail (module doc). At least one store: an empty statement is left to `simplify`.
fn only_zero_stores(s: &Stmt, buf: BufId) -> bool {
    fn walk(s: &Stmt, buf: BufId, stores: &mut usize) -> bool {
        match s {
            Stmt::Store {
                buf: b,
                indices,
                value,
            } => {
                *stores += 1;
                *b == buf && indices.iter().all(pure) && is_zero(value)
            }
            Stmt::For {
                min, extent, body, ..
            } => pure(min) && pure(extent) && walk(body, buf, stores),
            Stmt::Seq(v) => v.iter().all(|s| walk(s, buf, stores)),
            Stmt::Let { value, body, .. } => pure(value) && walk(body, buf, stores),
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                pure(cond)
                    && walk(then, buf, stores)
                    && otherwise.as_ref().is_none_or(|o| walk(o, buf, stores))
            }
            _ => false,
        }
    }
    let mut stores = 0;
    walk(s, buf, &mut stores) && stores > 0
}

/// `+0.0` or `0`, or a broadcast of one.
pub(crate) fn is_zero(e: &Expr) -> bool {
    match e.kind() {
        ExprKind::Const(Const::Int(0)) => true,
        ExprKind::Const(Const::Float(v)) => v.to_bits() == 0,
        ExprKind::Broadcast { value, .. } => is_zero(value),
        _ => false,
    }
}

/// Loads nothing and divides only by non-zero constants: evaluating it reads no memory and
/// cannot fail.
fn pure(e: &Expr) -> bool {
    let mut ok = true;
    e.visit(&mut |n| match n.kind() {
        ExprKind::Load { .. } | ExprKind::Read { .. } | ExprKind::Reduce { .. } => ok = false,
        ExprKind::Binary(BinOp::Div | BinOp::FloorDiv | BinOp::FloorMod, _, d)
            if !matches!(d.as_int(), Some(k) if k != 0) =>
        {
            ok = false
        }
        _ => {}
    });
    ok
}

/// Adds to `out` the buffers `s` may write (stores, intrinsics' regions); true when it holds
/// something this pass does not look into (which may write anything).
fn writes_into(s: &Stmt, out: &mut HashSet<BufId>) -> bool {
    let mut opaque = false;
    s.visit(&mut |s| match s {
        Stmt::Store { buf, .. } => {
            out.insert(*buf);
        }
        Stmt::Call { regions, .. } => out.extend(regions.iter().map(|r| r.buf)),
        Stmt::AllReduce { .. } | Stmt::Launch { .. } => opaque = true,
        _ => {}
    });
    opaque
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::expr::Var;
    use crate::ir::stmt::ForKind;
    use crate::ir::test_util::{self, loop_over};
    use rivet_runtime::DType;

    const T: BufId = BufId(7);
    const OTHER: BufId = BufId(8);

    fn lp(kind: ForKind, extent: Expr, body: impl FnOnce(&Expr) -> Stmt) -> Stmt {
        loop_over("i", extent, kind, body)
    }

    fn store(buf: BufId, i: &Expr, value: Expr) -> Stmt {
        test_util::store(buf, vec![i.clone()], value)
    }

    fn zero_loop(n: i64) -> Stmt {
        lp(ForKind::Parallel, Expr::int(n), |i| {
            store(T, i, Expr::constant(0.0, DType::F32))
        })
    }

    fn run(body: Vec<Stmt>) -> Vec<Stmt> {
        let mut fresh = Fresh {
            bufs: [T].into_iter().collect(),
            written: HashSet::new(),
            all_written: false,
        };
        match scan(Stmt::Seq(body), &mut fresh) {
            Stmt::Seq(v) => v,
            other => panic!("{other:?}"),
        }
    }

    fn dropped(s: &Stmt) -> bool {
        matches!(s, Stmt::Seq(v) if v.is_empty())
    }

    #[test]
    fn a_first_zero_pass_is_dropped_and_later_ones_are_kept() {
        let writes_t = lp(ForKind::Serial, Expr::int(4), |i| {
            store(T, i, Expr::constant(1.0, DType::F32))
        });
        let reads_t = lp(ForKind::Serial, Expr::int(4), |i| {
            store(OTHER, i, Expr::load(T, vec![i.clone()], DType::F32))
        });
        let out = run(vec![reads_t, zero_loop(4), writes_t, zero_loop(4)]);
        assert!(!dropped(&out[0]), "a read of the buffer stays");
        assert!(
            dropped(&out[1]),
            "the first zero pass goes (reads before it see zeros)"
        );
        assert!(!dropped(&out[2]));
        assert!(
            !dropped(&out[3]),
            "a zero pass after a write re-zeroes: kept"
        );
    }

    #[test]
    fn zero_passes_that_could_change_something_are_kept() {
        // -0.0 has other bits than the zero fill.
        let neg = lp(ForKind::Serial, Expr::int(4), |i| {
            store(T, i, Expr::constant(-0.0, DType::F32))
        });
        // An index that loads memory, an extent dividing by a variable.
        let gather = lp(ForKind::Serial, Expr::int(4), |i| {
            store(
                T,
                &Expr::load(OTHER, vec![i.clone()], DType::I64),
                Expr::constant(0.0, DType::F32),
            )
        });
        let n = Expr::var(&Var::new("n"));
        let div = Expr::binary(BinOp::FloorDiv, Expr::int(8), n).unwrap();
        let divides = lp(ForKind::Serial, div, |i| {
            store(T, i, Expr::constant(0.0, DType::F32))
        });
        // Stores into another buffer too.
        let mixed = lp(ForKind::Serial, Expr::int(4), |i| {
            Stmt::Seq(vec![
                store(T, i, Expr::constant(0.0, DType::F32)),
                store(OTHER, i, Expr::constant(0.0, DType::F32)),
            ])
        });
        for s in [neg, gather, divides, mixed] {
            let out = run(vec![s]);
            assert!(!dropped(&out[0]), "{:?}", out[0]);
        }
    }

    #[test]
    fn an_init_inside_a_loop_is_kept() {
        // for r { T = 0; T += ... }: each row re-zeroes what the last one accumulated.
        let rows = lp(ForKind::Parallel, Expr::int(3), |_| {
            Stmt::Seq(vec![
                zero_loop(4),
                lp(ForKind::Serial, Expr::int(4), |i| {
                    store(T, i, Expr::constant(2.0, DType::F32))
                }),
            ])
        });
        let out = run(vec![rows]);
        assert!(!dropped(&out[0]));
        match &out[0] {
            Stmt::For { body, .. } => match &**body {
                Stmt::Seq(v) => assert!(!dropped(&v[0]), "inner init kept"),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }
}
