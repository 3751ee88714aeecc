//! Row locals: a local buffer that one root-level parallel loop touches only in the loop's own
//! row becomes one row allocated inside that loop, per iteration.
//!
//! After row fusion (`lower::fuse_rows`) a softmax is one parallel loop over the rows whose
//! stages pass their rows through locals of the whole tensor's size: `exp` alone was a
//! 4096 x 1024 float32 buffer, zeroed on every call and written then read back through memory
//! (16 MiB each way) although each row lived for one iteration. Allocated per iteration, it is
//! one row that stays in the cache; the small partials (`max.lanes`, `sum`, ...) become
//! constant-sized and go on the stack.
//!
//! Legal for a local `b` allocated in the function's root `Allocate`s when:
//! - exactly one statement of the sequence under that chain mentions `b`, and it is a
//!   parallel loop over `v`;
//! - every load and store of `b` in it has first index `v` (after simplification), as has
//!   the base of every intrinsic region of `b` (which does not extend along the first dim);
//!   `b` appears in no cross-thread reduction or launch, and no expression names its stride
//!   variables;
//! - `b` is not allocated again inside the loop.
//!
//! Then iteration `v` reads and writes only row `v` of `b`, which before the pass started zeroed
//! (`Allocate`) and was touched by no one else: giving each iteration a fresh zeroed row
//! (shape `[1, ...]`, first index `0`) computes the same values in the same order. The bounds
//! proof runs after this pass, on the new shapes; `verify::parallel` treats a buffer allocated
//! inside the body as private to an iteration. Runs where row fusion runs (default CPU
//! schedule only), on the nest, so saved modules keep it and loaded ones prove it again.

use crate::arith::simplify::simplify;
use crate::ir::expr::{BufId, Expr, ExprKind, Var};
use crate::ir::stmt::{ForKind, PrimFunc, Stmt};
use std::collections::{HashMap, HashSet};

/// Shrinks every local of `f` that the rule (module doc) allows to one row per iteration.
pub fn shrink(f: &mut PrimFunc) {
    // The root chain of Allocates (their buffers in order) and the statement under it.
    let mut chain = Vec::new();
    let mut inner = &f.body;
    while let Stmt::Allocate { bufs, body } = inner {
        chain.extend(bufs.iter().copied());
        inner = body;
    }
    let in_chain: HashSet<BufId> = chain.iter().copied().collect();
    let items: Vec<Stmt> = match inner {
        Stmt::Seq(v) => v.clone(),
        other => vec![other.clone()],
    };
    let stride_vars: HashMap<u32, BufId> = f
        .buffers
        .iter()
        .filter(|b| in_chain.contains(&b.id))
        .flat_map(|b| b.strides.iter().map(move |s| (s.id, b.id)))
        .collect();
    // For each item, the locals of the chain it mentions and those it touches only in its own
    // row (parallel loops only).
    let mut mentioned_by: HashMap<BufId, Vec<usize>> = HashMap::new();
    let mut row_only: Vec<HashSet<BufId>> = Vec::new();
    for (k, item) in items.iter().enumerate() {
        let u = Usage::of(item, &stride_vars);
        for b in u.mentioned.iter().filter(|b| in_chain.contains(b)) {
            mentioned_by.entry(*b).or_default().push(k);
        }
        row_only.push(
            u.mentioned
                .iter()
                .filter(|b| !u.not_row.contains(b))
                .copied()
                .collect(),
        );
    }
    let moved: Vec<(BufId, usize)> = chain
        .iter()
        .filter_map(|b| match mentioned_by.get(b).map(Vec::as_slice) {
            Some(&[k]) if row_only[k].contains(b) => Some((*b, k)),
            _ => None,
        })
        .collect();
    if moved.is_empty() {
        return;
    }
    let moved_set: HashSet<BufId> = moved.iter().map(|(b, _)| *b).collect();
    let items: Vec<Stmt> = items
        .into_iter()
        .enumerate()
        .map(|(k, item)| {
            let mine: Vec<BufId> = moved.iter().filter(|m| m.1 == k).map(|m| m.0).collect();
            if mine.is_empty() {
                return item;
            }
            let Stmt::For {
                var,
                min,
                extent,
                body,
                kind,
            } = item
            else {
                unreachable!("only parallel loops have row-only locals")
            };
            let first_to_zero = |e: &Expr| {
                e.rewrite(&mut |n| match n.kind() {
                    ExprKind::Load { buf, indices } if mine.contains(buf) => {
                        let mut ix = indices.clone();
                        ix[0] = Expr::int(0);
                        Some(Expr::load(*buf, ix, n.dtype()))
                    }
                    _ => None,
                })
            };
            let body = body.rewrite(&mut |e| first_to_zero(e), &mut |s| match s {
                Stmt::Store {
                    buf,
                    mut indices,
                    value,
                } if mine.contains(&buf) => {
                    indices[0] = Expr::int(0);
                    Stmt::Store {
                        buf,
                        indices,
                        value,
                    }
                }
                Stmt::Call {
                    intrin,
                    mut regions,
                    scalars,
                } => {
                    for r in regions.iter_mut().filter(|r| mine.contains(&r.buf)) {
                        r.base[0] = Expr::int(0);
                    }
                    Stmt::Call {
                        intrin,
                        regions,
                        scalars,
                    }
                }
                s => s,
            });
            let body = Stmt::allocate_all(mine, body);
            Stmt::For {
                var,
                min,
                extent,
                body: Box::new(body),
                kind,
            }
        })
        .collect();
    for b in f.buffers.iter_mut().filter(|b| moved_set.contains(&b.id)) {
        b.shape[0] = Expr::int(1);
    }
    let kept = chain
        .into_iter()
        .filter(|b| !moved_set.contains(b))
        .collect();
    f.body = Stmt::allocate_all(kept, Stmt::seq(items));
}

/// What one root-level statement does with buffers.
#[derive(Default)]
struct Usage {
    /// Every buffer it loads, stores, allocates, passes to a call or names a stride of.
    mentioned: HashSet<BufId>,
    /// Those it touches other than by a load or store in its own row (always all of them
    /// when it is not a parallel loop).
    not_row: HashSet<BufId>,
}

impl Usage {
    fn of(item: &Stmt, stride_vars: &HashMap<u32, BufId>) -> Usage {
        let mut u = Usage::default();
        let v: Option<&Var> = match item {
            Stmt::For {
                var,
                kind: ForKind::Parallel,
                ..
            } => Some(var),
            _ => None,
        };
        let own = |indices: &[Expr]| {
            v.is_some_and(|v| {
                indices
                    .first()
                    .is_some_and(|i| simplify(i).as_var() == Some(v))
            })
        };
        let touch = |u: &mut Usage, b: BufId, row: bool| {
            u.mentioned.insert(b);
            if !row {
                u.not_row.insert(b);
            }
        };
        item.visit(&mut |s| match s {
            Stmt::Store { buf, indices, .. } => touch(&mut u, *buf, own(indices)),
            Stmt::Allocate { bufs, .. } => {
                for b in bufs {
                    touch(&mut u, *b, false)
                }
            }
            Stmt::AllReduce { dst, .. } => touch(&mut u, *dst, false),
            // A region in the loop's own row: its base's first index is the loop's variable
            // and it does not extend along the first dim.
            Stmt::Call { regions, .. } => {
                for r in regions {
                    touch(
                        &mut u,
                        r.buf,
                        own(&r.base) && r.axes.iter().all(|a| a.dim != 0),
                    )
                }
            }
            _ => {}
        });
        // A launch names buffers only through its kernel's captures: none exist before the
        // split, but refuse everything rather than assume it.
        let mut opaque = false;
        item.visit(&mut |s| opaque |= matches!(s, Stmt::Launch { .. }));
        item.visit_exprs(&mut |e| {
            e.visit(&mut |n| match n.kind() {
                ExprKind::Load { buf, indices } => touch(&mut u, *buf, own(indices)),
                ExprKind::Var(x) => {
                    if let Some(b) = stride_vars.get(&x.id) {
                        touch(&mut u, *b, false)
                    }
                }
                _ => {}
            })
        });
        if opaque {
            u.not_row = u.mentioned.clone();
        }
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::expr::BinOp;
    use crate::ir::stmt::BufKind;
    use crate::ir::test_util::{buffer, func as prim, input, loop_over, output, store};
    use rivet_runtime::DType;

    const X: BufId = BufId(0);
    const Y: BufId = BufId(1);
    const T: BufId = BufId(2);

    /// `f(X[n, m], Y[n, m] out)` with local `T[n, m]` allocated at the root around `items`,
    /// each built from the dims and T's stride variables.
    fn func(items: impl FnOnce(&Expr, &Expr, &Expr) -> Vec<Stmt>) -> PrimFunc {
        let (n, m) = (Var::new("n"), Var::new("m"));
        let shape = vec![Expr::var(&n), Expr::var(&m)];
        let t = buffer(T.0, "T", DType::F32, shape.clone(), BufKind::Local);
        let ts0 = Expr::var(&t.strides[0]);
        let body = Stmt::Allocate {
            bufs: vec![T],
            body: Box::new(Stmt::seq(items(&Expr::var(&n), &Expr::var(&m), &ts0))),
        };
        let buffers = vec![
            input(X.0, "X", DType::F32, shape.clone()),
            output(Y.0, "Y", DType::F32, shape),
            t,
        ];
        prim("f", buffers, vec![n, m], body)
    }

    /// `kind for i in [0, n): for j in [0, m): body(i, j)`.
    fn rows(kind: ForKind, n: &Expr, m: &Expr, body: impl FnOnce(&Expr, &Expr) -> Stmt) -> Stmt {
        loop_over("i", n.clone(), kind, |i| {
            loop_over("j", m.clone(), ForKind::Serial, |j| body(i, j))
        })
    }

    fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::binary(op, a, b).unwrap()
    }

    fn ld(b: BufId, i: &Expr, j: &Expr) -> Expr {
        Expr::load(b, vec![i.clone(), j.clone()], DType::F32)
    }

    fn st(b: BufId, i: &Expr, j: &Expr, value: Expr) -> Stmt {
        store(b, vec![i.clone(), j.clone()], value)
    }

    /// T = X + 1 then Y = T * 2 in one parallel loop over the rows.
    fn row_program(kind: ForKind) -> PrimFunc {
        func(|n, m, _| {
            vec![rows(kind, n, m, |i, j| {
                Stmt::seq(vec![
                    st(
                        T,
                        i,
                        j,
                        bin(BinOp::Add, ld(X, i, j), Expr::constant(1.0, DType::F32)),
                    ),
                    st(
                        Y,
                        i,
                        j,
                        bin(BinOp::Mul, ld(T, i, j), Expr::constant(2.0, DType::F32)),
                    ),
                ])
            })]
        })
    }

    fn allocated_at_root(f: &PrimFunc) -> bool {
        matches!(&f.body, Stmt::Allocate { bufs, .. } if bufs.contains(&T))
    }

    #[test]
    fn a_row_only_local_becomes_one_row_per_iteration() {
        let mut f = row_program(ForKind::Parallel);
        shrink(&mut f);
        assert!(!allocated_at_root(&f), "{}", f);
        assert_eq!(f.buffer(T).shape[0], Expr::int(1));
        let text = f.to_string();
        assert!(text.contains("allocate T"), "{text}");
        assert!(text.contains("T[0, "), "{text}");
        assert!(!text.contains("T[i"), "{text}");
        crate::ir::verify::verify(&f, false).unwrap();
    }

    /// T written in row i, then read by an intrinsic's region `T[i, 0; dim1: m]`: one row
    /// per iteration, the region's base moved to row 0 with the accesses. A region spanning
    /// T's first dim keeps it whole.
    #[test]
    fn a_local_read_by_an_intrinsic_in_its_own_row_becomes_one_row() {
        use crate::ir::intrin::{Intrin, Region, RegionAxis};
        let prog = |dims: &'static [u32]| {
            func(|n, m, _| {
                vec![loop_over("i", n.clone(), ForKind::Parallel, |i| {
                    let region = |buf: BufId, write: bool, dims: &[u32]| Region {
                        buf,
                        base: vec![i.clone(), Expr::int(0)],
                        axes: dims
                            .iter()
                            .map(|&dim| RegionAxis {
                                dim,
                                extent: m.clone(),
                            })
                            .collect(),
                        write,
                    };
                    Stmt::seq(vec![
                        loop_over("j", m.clone(), ForKind::Serial, |j| {
                            st(T, i, j, ld(X, i, j))
                        }),
                        Stmt::Call {
                            intrin: Intrin::GemmUpdate,
                            regions: vec![region(Y, true, &[1]), region(T, false, dims)],
                            scalars: vec![],
                        },
                    ])
                })]
            })
        };
        let mut f = prog(&[1]);
        shrink(&mut f);
        assert!(!allocated_at_root(&f), "{}", f);
        assert_eq!(f.buffer(T).shape[0], Expr::int(1));
        let text = f.to_string();
        assert!(text.contains("T[0, 0; dim1:m]"), "{text}");
        let mut f = prog(&[0, 1]);
        shrink(&mut f);
        assert!(allocated_at_root(&f), "{}", f);
    }

    #[test]
    fn locals_that_outlive_a_row_stay_whole() {
        // A serial loop: nothing to give a row to.
        let mut f = row_program(ForKind::Serial);
        shrink(&mut f);
        assert!(allocated_at_root(&f));
        // Two loops share T: row v of the first must reach the second.
        let mut f = func(|n, m, _| {
            vec![
                rows(ForKind::Parallel, n, m, |i, j| st(T, i, j, ld(X, i, j))),
                rows(ForKind::Parallel, n, m, |i, j| st(Y, i, j, ld(T, i, j))),
            ]
        });
        shrink(&mut f);
        assert!(allocated_at_root(&f));
        // A load of another row (the first index is not the loop's variable).
        let mut f = func(|n, m, _| {
            vec![rows(ForKind::Parallel, n, m, |i, j| {
                Stmt::seq(vec![
                    st(T, i, j, ld(X, i, j)),
                    st(Y, i, j, ld(T, &Expr::int(0), j)),
                ])
            })]
        });
        shrink(&mut f);
        assert!(allocated_at_root(&f));
        // A stride variable of T used in an expression.
        let mut f = func(|n, m, ts0| {
            vec![rows(ForKind::Parallel, n, m, |i, j| {
                Stmt::seq(vec![
                    st(T, i, j, ld(X, i, j)),
                    st(
                        Y,
                        i,
                        j,
                        bin(BinOp::Add, ld(T, i, j), Expr::cast(DType::F32, ts0.clone())),
                    ),
                ])
            })]
        });
        shrink(&mut f);
        assert!(allocated_at_root(&f));
    }
}
