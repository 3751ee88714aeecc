//! Locals written in full before they are read: their `Allocate` need not zero them.
//!
//! `Allocate` gives a local zeroed memory (the IR's meaning). A packed GEMM panel, a row of
//! softmax's exponentials, a padded copy are then zeroed on every call only to be overwritten
//! at once: the default 1024 GEMM zeroed 8 MiB of packed panels per call, on the calling
//! thread, before its parallel loops started. This pass marks such a local
//! (`Buffer::overwritten`); the Cranelift backend then skips the zeroing, and the interpreter
//! fills it with a poison pattern instead, so a wrong mark shows as a wrong result in the
//! oracle's own tests instead of passing silently.
//!
//! The rule, for a local `b` allocated by `Allocate { bufs, body }` (`b` one of `bufs`):
//! walking `body` in execution
//! order (through nested `Allocate`s and sequences), every statement before the first one that
//! mentions `b` mentions nothing of it, and that first statement is a *covering store*: a
//! loop nest `for v_1 in [0, e_1) .. for v_k in [0, e_k): b[i_1, .., i_n] = value` whose path
//! from the outer loop down to the one store of `b` passes only through loops, sequences,
//! `let`s and nested `Allocate`s (never an `if`), where every other statement of those
//! sequences (and every `let` value) mentions nothing of `b`, and where each index `i_d` is
//! either one of the path's loop variables, each used exactly once, with that loop's extent
//! equal to `b`'s extent in dim `d` (the same expression after simplification), or the
//! constant `0` where `b`'s extent is the constant 1; `value` does not read `b`. Every loop
//! variable of the path is used by an index, so the store runs for every index combination
//! exactly over `b`'s shape: every element is stored before the nest ends, and nothing in the
//! nest reads `b` at all (its siblings do not name it, the store's own `value` does not read
//! it), so nothing reads `b` before it is stored. The siblings let a pack or an accumulator's
//! initialisation that row fusion put inside a parallel loop with other stages qualify (the
//! second GEMM's pack and attention's padded scores, first written in the loop over heads).
//! Loops of any kind (parallel, vectorized, unrolled) qualify: each iteration runs once.
//! Directly inside the outermost loop `v`, statements after the store's branch may name `b`
//! when they touch only row `v` of it (first index `v`, a region not extending along the
//! first dim) and the store's first index is `v`: iteration `v` stores all of row `v` before
//! they run, and no iteration touches another's row (an accumulator's initialisation that
//! row fusion put in the loop over heads, before the product's calls that add into it).
//!
//! A store of `+0.0` qualifies only on such a non-perfect path: a perfect nest of zero stores
//! reached first is dropped by `lower::zero_init`, which keeps the `Allocate`'s zeroing (one
//! memset) instead; inside a loop with other statements `zero_init` leaves the zero stores in
//! place, and without the mark the buffer would be zeroed twice per call.
//! Runs on the multi-dimensional function after the bounds proof and simplification, for the
//! CPU and the interpreter (not CUDA); `overwritten` is never read from a file (`#[serde(skip)]`): a loaded module is
//! marked again by this pass, never by its file.

use crate::arith::simplify::simplify;
use crate::ir::expr::{BufId, Expr, ExprKind, Var};
use crate::ir::stmt::{BufKind, PrimFunc, Stmt};
use std::collections::HashSet;

/// Marks every local of `f` the rule (module doc) allows.
pub fn mark(f: &mut PrimFunc) {
    let mut found = Vec::new();
    f.body.visit(&mut |s| {
        if let Stmt::Allocate { bufs, body } = s {
            let mut pending: HashSet<BufId> = bufs.iter().copied().collect();
            first_uses(body, &mut pending, f, &mut found);
        }
    });
    for (id, ok) in found {
        if ok {
            if let Some(b) = f.buffers.iter_mut().find(|b| b.id == id) {
                b.overwritten = b.kind == BufKind::Local;
            }
        }
    }
}

/// Walks `s` in execution order, deciding each buffer of `pending` at the first statement
/// that mentions it: `(buf, true)` into `found` when that statement is a covering store,
/// `(buf, false)` when it mentions `buf` any other way. Decided buffers leave `pending`; the
/// walk stops when none is left. One walk decides all the buffers of an `Allocate` (a
/// program's root temporaries, one per stage, share one): each statement is inspected once,
/// not once per buffer.
fn first_uses(
    s: &Stmt,
    pending: &mut HashSet<BufId>,
    f: &PrimFunc,
    found: &mut Vec<(BufId, bool)>,
) {
    if pending.is_empty() {
        return;
    }
    match s {
        Stmt::Seq(items) => {
            for x in items {
                if pending.is_empty() {
                    return;
                }
                first_uses(x, pending, f, found);
            }
        }
        Stmt::Allocate { bufs, body } => {
            // Allocated again inside (the verifier refuses it): not a covering store.
            for b in bufs {
                if pending.remove(b) {
                    found.push((*b, false));
                }
            }
            first_uses(body, pending, f, found);
        }
        _ => {
            let decided: Vec<BufId> = match mentioned(s) {
                None => pending.iter().copied().collect(),
                Some(m) => m.into_iter().filter(|b| pending.contains(b)).collect(),
            };
            for b in decided {
                pending.remove(&b);
                found.push((b, matches!(s, Stmt::For { .. }) && covering(b, s, f)));
            }
        }
    }
}

/// The buffers `s` names anywhere (access, region, allocation, reduction target); `None`
/// when it may name any (a launch of an outlined body).
fn mentioned(s: &Stmt) -> Option<HashSet<BufId>> {
    let mut m = HashSet::new();
    let mut any = false;
    s.visit(&mut |x| match x {
        Stmt::Store { buf, .. } => {
            m.insert(*buf);
        }
        Stmt::Allocate { bufs, .. } => m.extend(bufs.iter().copied()),
        Stmt::AllReduce { dst, .. } => {
            m.insert(*dst);
        }
        Stmt::Call { regions, .. } => m.extend(regions.iter().map(|r| r.buf)),
        Stmt::Launch { .. } => any = true,
        _ => {}
    });
    s.visit_exprs(&mut |e| {
        e.visit(&mut |n| {
            if let ExprKind::Load { buf, .. } = n.kind() {
                m.insert(*buf);
            }
        })
    });
    (!any).then_some(m)
}

fn reads(buf: BufId, e: &Expr) -> bool {
    let mut r = false;
    e.visit(&mut |n| {
        if let ExprKind::Load { buf: b, .. } = n.kind() {
            r |= *b == buf;
        }
    });
    r
}

/// Whether `s` is a covering store of `buf` (module doc).
fn covering(buf: BufId, s: &Stmt, f: &PrimFunc) -> bool {
    // The path to the store: (variable, extent) per loop; whether a sequence, `let` or
    // allocation with other statements lies on it (the nest is not perfect).
    let mut loops: Vec<(&Var, &Expr)> = Vec::new();
    let mut perfect = true;
    // The outermost loop's variable, when statements after the store's nest touch its row.
    let mut rowed: Option<&Var> = None;
    let mut cur = s;
    let (indices, value) = loop {
        match cur {
            Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } => {
                if simplify(min).as_int() != Some(0) {
                    return false;
                }
                loops.push((var, extent));
                cur = body;
            }
            Stmt::Seq(items) => {
                // Exactly one item names `buf`; the others name nothing of it (a launch,
                // which may name anything, counts as naming it). Directly inside the
                // outermost loop, items after the first one naming `buf` may touch its row
                // of `buf` (`row_only`), when the store's first index is that loop's variable.
                let Some(at) = items.iter().position(|x| names(x, buf)) else {
                    return false;
                };
                let later = &items[at + 1..];
                if later.iter().any(|x| names(x, buf)) {
                    let [(v, _)] = loops[..] else {
                        return false;
                    };
                    if rowed.is_some() || !later.iter().all(|x| row_only(x, buf, v)) {
                        return false;
                    }
                    rowed = Some(v);
                }
                perfect &= items.len() == 1;
                cur = &items[at];
            }
            Stmt::Let { value, body, .. } => {
                if reads(buf, value) {
                    return false;
                }
                perfect = false;
                cur = body;
            }
            Stmt::Allocate { bufs, body } => {
                if bufs.contains(&buf) {
                    return false;
                }
                perfect = false;
                cur = body;
            }
            Stmt::Store {
                buf: b,
                indices,
                value,
            } if *b == buf => break (indices, value),
            _ => return false,
        }
    };
    if reads(buf, value) || indices.iter().any(|i| reads(buf, i)) {
        return false;
    }
    // A perfect nest of zero stores is left to `lower::zero_init`, which drops it and keeps
    // the zeroing `Allocate` (a memset) instead (module doc).
    if perfect && crate::lower::zero_init::is_zero(value) {
        return false;
    }
    let Some(b) = f.buffers.iter().find(|x| x.id == buf) else {
        return false;
    };
    if indices.len() != b.shape.len() {
        return false;
    }
    if let Some(v) = rowed {
        if simplify(&indices[0]).as_var() != Some(v) {
            return false;
        }
    }
    let mut used = vec![false; loops.len()];
    for (d, ix) in indices.iter().enumerate() {
        let ix = simplify(ix);
        let extent = simplify(&b.shape[d]);
        if ix.as_int() == Some(0) && extent.as_int() == Some(1) {
            continue;
        }
        let Some(v) = ix.as_var() else { return false };
        let Some(k) = loops.iter().position(|(lv, _)| *lv == v) else {
            return false;
        };
        if used[k] || simplify(loops[k].1) != extent {
            return false;
        }
        used[k] = true;
    }
    // A loop whose variable no index uses would store the same elements again (harmless) but
    // could also have an extent of 0, storing nothing: refused.
    used.iter().all(|u| *u)
}

/// Whether `s` touches `buf` only in row `v`: every load, store and intrinsic region of it
/// has first index `v` (a region not extending along the first dim), and nothing allocates,
/// reduces into or may name it otherwise (a launch).
fn row_only(s: &Stmt, buf: BufId, v: &Var) -> bool {
    let own = |ix: &[Expr]| ix.first().is_some_and(|i| simplify(i).as_var() == Some(v));
    let mut ok = true;
    s.visit(&mut |x| match x {
        Stmt::Store {
            buf: b, indices, ..
        } if *b == buf => ok &= own(indices),
        Stmt::Allocate { bufs, .. } if bufs.contains(&buf) => ok = false,
        Stmt::AllReduce { dst, .. } if *dst == buf => ok = false,
        Stmt::Call { regions, .. } => {
            for r in regions.iter().filter(|r| r.buf == buf) {
                ok &= own(&r.base) && r.axes.iter().all(|a| a.dim != 0);
            }
        }
        Stmt::Launch { .. } => ok = false,
        _ => {}
    });
    s.visit_exprs(&mut |e| {
        e.visit(&mut |n| {
            if let ExprKind::Load { buf: b, indices } = n.kind() {
                if *b == buf {
                    ok &= own(indices);
                }
            }
        })
    });
    ok
}

/// Whether `s` names `buf` anywhere (or may: a launch).
fn names(s: &Stmt, buf: BufId) -> bool {
    mentioned(s).is_none_or(|m| m.contains(&buf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::expr::BinOp;
    use crate::ir::stmt::ForKind;
    use crate::ir::test_util::{buffer, func, loop_over, output, store as st};
    use rivet_runtime::DType;

    const X: BufId = BufId(0);
    const T: BufId = BufId(1);

    /// `f(X[n] out)` with local `T` of `shape(n)` allocated around `body(n)`; whether `mark`
    /// marks `T`.
    fn marks(shape: impl FnOnce(&Expr) -> Vec<Expr>, body: impl FnOnce(&Expr) -> Stmt) -> bool {
        let nv = Var::new("n");
        let n = Expr::var(&nv);
        let buffers = vec![
            output(X.0, "X", DType::F32, vec![n.clone()]),
            buffer(T.0, "T", DType::F32, shape(&n), BufKind::Local),
        ];
        let body = Stmt::Allocate {
            bufs: vec![T],
            body: Box::new(body(&n)),
        };
        let mut f = func("f", buffers, vec![nv], body);
        mark(&mut f);
        f.buffers[1].overwritten
    }

    fn lp(extent: Expr, kind: ForKind, body: impl FnOnce(&Expr) -> Stmt) -> Stmt {
        loop_over("i", extent, kind, body)
    }

    fn one() -> Expr {
        Expr::constant(1.0, DType::F32)
    }

    fn ser(n: i64, body: impl FnOnce(&Expr) -> Stmt) -> Stmt {
        lp(Expr::int(n), ForKind::Serial, body)
    }

    #[test]
    fn a_full_nest_in_any_order_marks_the_local() {
        // T[n, 4]: for j in [0, 4): parallel for i in [0, n): T[i, j] = 1, after a statement
        // that does not name T and before one that reads it.
        assert!(marks(
            |n| vec![n.clone(), Expr::int(4)],
            |n| Stmt::seq(vec![
                lp(n.clone(), ForKind::Serial, |i| st(
                    X,
                    vec![i.clone()],
                    one()
                )),
                ser(4, |j| {
                    lp(n.clone(), ForKind::Parallel, |i| {
                        st(T, vec![i.clone(), j.clone()], one())
                    })
                }),
                lp(n.clone(), ForKind::Serial, |i| {
                    let t = Expr::load(T, vec![i.clone(), Expr::int(0)], DType::F32);
                    st(X, vec![i.clone()], t)
                }),
            ])
        ));
        // A row local: index 0 where the extent is 1.
        assert!(marks(
            |_| vec![Expr::int(1), Expr::int(8)],
            |_| lp(Expr::int(8), ForKind::Vectorized, |j| {
                st(T, vec![Expr::int(0), j.clone()], one())
            })
        ));
        // `i + 0` simplifies to `i`.
        assert!(marks(
            |_| vec![Expr::int(8)],
            |_| ser(8, |i| st(T, vec![i.add(&Expr::int(0))], one()))
        ));
    }

    /// The interpreter fills a marked local with NaN (all bits set), so a wrong mark shows
    /// in the oracle: here a local marked by hand but read before it is written.
    #[test]
    fn the_interpreter_poisons_marked_locals() {
        use crate::codegen::interp::InterpBackend;
        use crate::codegen::{Backend, CallFrame, LaunchContext};
        for marked in [false, true] {
            let n = Var::new("n");
            let mut t = buffer(T.0, "T", DType::F32, vec![Expr::int(4)], BufKind::Local);
            t.overwritten = marked;
            let buffers = vec![output(X.0, "X", DType::F32, vec![Expr::var(&n)]), t];
            let body = Stmt::Allocate {
                bufs: vec![T],
                body: Box::new(ser(4, |i| {
                    st(
                        X,
                        vec![i.clone()],
                        Expr::load(T, vec![i.clone()], DType::F32),
                    )
                })),
            };
            let f = func("f", buffers, vec![n], body);
            let k = InterpBackend::default().compile(&f).unwrap();
            let mut out = vec![7.0f32; 4];
            let frame = CallFrame {
                ptrs: vec![out.as_mut_ptr() as *mut u8].into(),
                ints: vec![4i64, 1].into(),
            };
            // SAFETY: one compact buffer of 4 floats, n = 4, stride 1.
            unsafe { k.launch(&frame, &LaunchContext::host()) }.unwrap();
            if marked {
                assert!(out.iter().all(|x| x.is_nan()), "{out:?}");
            } else {
                assert_eq!(out, vec![0.0; 4]);
            }
        }
    }

    /// Inside the outermost loop `i`, the row's initialisation first, then statements that
    /// read and write only row `i` of T (a load, and an intrinsic's region along dim 1): the
    /// initialisation covers. Reading another row (`i // 2`), a region spanning dim 0, or an
    /// initialisation whose first index is not `i` keeps the zeroing.
    #[test]
    fn a_row_initialised_before_its_own_row_is_used_marks_the_local() {
        use crate::ir::intrin::{Intrin, Region, RegionAxis};
        let shape = |n: &Expr| vec![n.clone(), Expr::int(4)];
        let zero = || Expr::constant(0.0, DType::F32);
        let prog = |n: &Expr, later: &dyn Fn(&Expr) -> Stmt, swap: bool| {
            lp(n.clone(), ForKind::Parallel, |i| {
                let init = ser(4, |j| {
                    let ix = if swap {
                        vec![j.clone(), i.clone()]
                    } else {
                        vec![i.clone(), j.clone()]
                    };
                    st(T, ix, zero())
                });
                Stmt::seq(vec![init, later(i)])
            })
        };
        let read_row = |row: fn(&Expr) -> Expr| {
            move |i: &Expr| {
                let t = Expr::load(T, vec![row(i), Expr::int(1)], DType::F32);
                st(X, vec![i.clone()], t)
            }
        };
        let call = |dims: &'static [u32]| {
            move |i: &Expr| Stmt::Call {
                intrin: Intrin::GemmUpdate,
                regions: vec![Region {
                    buf: T,
                    base: vec![i.clone(), Expr::int(0)],
                    axes: dims
                        .iter()
                        .map(|&dim| RegionAxis {
                            dim,
                            extent: Expr::int(4),
                        })
                        .collect(),
                    write: true,
                }],
                scalars: vec![],
            }
        };
        assert!(marks(shape, |n| prog(n, &read_row(|i| i.clone()), false)));
        assert!(marks(shape, |n| prog(n, &call(&[1]), false)));
        assert!(!marks(shape, |n| prog(
            n,
            &read_row(|i| i.floordiv(&Expr::int(2))),
            false
        )));
        assert!(!marks(shape, |n| prog(n, &call(&[0, 1]), false)));
        // T[4, 4] stored transposed (`T[j, i]`), then row i read: not its own row.
        assert!(!marks(
            |_| vec![Expr::int(4), Expr::int(4)],
            |_| prog(&Expr::int(4), &read_row(|i| i.clone()), true)
        ));
    }

    #[test]
    fn partial_conditional_or_self_reading_writes_keep_the_zeroing() {
        let v8 = |_: &Expr| vec![Expr::int(8)];
        // Part of the extent.
        assert!(!marks(v8, |_| ser(7, |i| st(T, vec![i.clone()], one()))));
        // A store under a condition.
        assert!(!marks(v8, |_| ser(8, |i| Stmt::If {
            cond: i.lt(&Expr::int(4)),
            then: Box::new(st(T, vec![i.clone()], one())),
            otherwise: None,
        })));
        // Reads itself (an accumulation: the zeros matter).
        assert!(!marks(v8, |_| ser(8, |i| {
            let t = Expr::load(T, vec![i.clone()], DType::F32);
            st(
                T,
                vec![i.clone()],
                Expr::binary(BinOp::Add, t, one()).unwrap(),
            )
        })));
        // Read before the covering store.
        assert!(!marks(v8, |_| Stmt::seq(vec![
            ser(8, |i| st(
                X,
                vec![i.clone()],
                Expr::load(T, vec![i.clone()], DType::F32)
            )),
            ser(8, |i| st(T, vec![i.clone()], one())),
        ])));
        // One variable for two dims (the diagonal only).
        assert!(!marks(
            |_| vec![Expr::int(8), Expr::int(8)],
            |_| ser(8, |i| st(T, vec![i.clone(), i.clone()], one()))
        ));
        // A loop whose variable no index uses (an extent of 0 would store nothing).
        assert!(!marks(v8, |n| lp(n.clone(), ForKind::Serial, |_| {
            ser(8, |i| st(T, vec![i.clone()], one()))
        })));
        // A store of +0.0: `zero_init` drops it and keeps the zeroing.
        assert!(!marks(v8, |_| {
            ser(8, |i| {
                st(T, vec![i.clone()], Expr::constant(0.0, DType::F32))
            })
        }));
        // A shifted index, a symbolic extent against a constant shape, a nonzero start.
        assert!(!marks(v8, |_| ser(8, |i| st(
            T,
            vec![i.add(&Expr::int(1))],
            one()
        ))));
        assert!(!marks(v8, |n| lp(n.clone(), ForKind::Serial, |i| st(
            T,
            vec![i.clone()],
            one()
        ))));
        assert!(!marks(v8, |_| {
            let v = Var::new("i");
            let e = Expr::var(&v);
            Stmt::For {
                var: v,
                min: Expr::int(1),
                extent: Expr::int(8),
                kind: ForKind::Serial,
                body: Box::new(st(T, vec![e], one())),
            }
        }));
    }

    /// `parallel for h in [0, n): { X[h] = 1; <inner(h)>; X[h] = 1 }`: a loop over rows with
    /// another stage's stores around the one that covers `T[n, 4]` (row fusion's shape).
    fn fused(inner: impl FnOnce(&Expr, &Expr) -> Stmt) -> impl FnOnce(&Expr) -> Stmt {
        move |n: &Expr| {
            let n = n.clone();
            lp(n.clone(), ForKind::Parallel, |h| {
                Stmt::seq(vec![
                    st(X, vec![h.clone()], one()),
                    inner(h, &n),
                    st(X, vec![h.clone()], one()),
                ])
            })
        }
    }

    fn rows4(n: &Expr) -> Vec<Expr> {
        vec![n.clone(), Expr::int(4)]
    }

    #[test]
    fn a_covering_store_beside_other_stages_in_a_loop_marks_the_local() {
        // The pack of a fused loop: one row of T per iteration, beside stores into X.
        assert!(marks(
            rows4,
            fused(|h, _| ser(4, |j| st(T, vec![h.clone(), j.clone()], one())))
        ));
        // Through a nested allocation and a `let` (a row local's scope, a bound index).
        assert!(marks(
            rows4,
            fused(|h, _| {
                let v = Var::new("w");
                Stmt::Allocate {
                    bufs: vec![BufId(9)],
                    body: Box::new(Stmt::Let {
                        var: v.clone(),
                        value: h.add(&Expr::int(1)),
                        body: Box::new(ser(4, |j| {
                            st(
                                T,
                                vec![h.clone(), j.clone()],
                                Expr::cast(DType::F32, Expr::var(&v)),
                            )
                        })),
                    }),
                }
            })
        ));
        // An accumulator's zero initialisation inside the loop: `zero_init` leaves it there
        // (not a top-level statement), so without the mark T would be zeroed twice.
        assert!(marks(
            rows4,
            fused(|h, _| ser(4, |j| {
                st(
                    T,
                    vec![h.clone(), j.clone()],
                    Expr::constant(0.0, DType::F32),
                )
            }))
        ));
    }

    #[test]
    fn a_sibling_naming_the_local_keeps_the_zeroing() {
        let load = |i: Expr, j: Expr| Expr::load(T, vec![i, j], DType::F32);
        // A later statement of the same iteration reads a row not yet stored (the last row,
        // read by every iteration): the zeros are what it reads.
        assert!(!marks(
            rows4,
            fused(|h, n| Stmt::seq(vec![
                ser(4, |j| st(T, vec![h.clone(), j.clone()], one())),
                st(X, vec![h.clone()], load(n.sub(&Expr::int(1)), Expr::int(0))),
            ]))
        ));
        // An earlier statement of the iteration reads its own row before it is stored.
        assert!(!marks(
            rows4,
            fused(|h, _| Stmt::seq(vec![
                st(X, vec![h.clone()], load(h.clone(), Expr::int(0))),
                ser(4, |j| st(T, vec![h.clone(), j.clone()], one())),
            ]))
        ));
        // An initialisation then an accumulation reading it (a GEMM's tile): the second
        // statement touches only the iteration's own row, which the first stored in full, so
        // the zeros of the `Allocate` are not needed (the module doc's row rule).
        assert!(marks(
            rows4,
            fused(|h, _| Stmt::seq(vec![
                ser(4, |j| st(T, vec![h.clone(), j.clone()], one())),
                ser(4, |j| st(
                    T,
                    vec![h.clone(), j.clone()],
                    Expr::binary(BinOp::Add, load(h.clone(), j.clone()), one()).unwrap()
                )),
            ]))
        ));
        // Two halves of each row in two statements: each alone covers nothing.
        assert!(!marks(
            rows4,
            fused(|h, _| Stmt::seq(vec![
                ser(2, |j| st(T, vec![h.clone(), j.clone()], one())),
                ser(2, |j| st(T, vec![h.clone(), j.add(&Expr::int(2))], one())),
            ]))
        ));
        // The store under a condition inside the loop.
        assert!(!marks(
            rows4,
            fused(|h, _| Stmt::If {
                cond: h.lt(&Expr::int(2)),
                then: Box::new(ser(4, |j| st(T, vec![h.clone(), j.clone()], one()))),
                otherwise: None,
            })
        ));
        // A `let` whose value reads T.
        assert!(!marks(
            rows4,
            fused(|h, _| {
                let v = Var::new("w");
                Stmt::Let {
                    var: v.clone(),
                    value: load(h.clone(), Expr::int(0)),
                    body: Box::new(ser(4, |j| st(T, vec![h.clone(), j.clone()], Expr::var(&v)))),
                }
            })
        ));
        // The loop over rows stores only row 0 each time (its variable unused by the index).
        assert!(!marks(
            rows4,
            fused(|_, _| ser(4, |j| st(T, vec![Expr::int(0), j.clone()], one())))
        ));
    }
}
