//! Row fusion: consecutive root-level parallel loops over the same range whose iterations
//! each touch only their own row of every buffer the loops write become one parallel loop.
//!
//! What the default CPU schedule (`schedule::cpu_default`) makes of a row-wise program —
//! softmax's maximum (its lane partials, tail and combination), exponentials, sum and
//! quotient; layer_norm's two sums and the normalisation — is one parallel loop over the rows
//! per stage: each sweeps the whole tensor, so a 4096 x 1024 softmax read or wrote 16 MiB ten
//! times from memory. Fused, one thread runs every stage on a row while it is in its cache.
//!
//! Legal when every buffer that two loops of the group touch and one of them writes is
//! accessed (load, store, or an intrinsic's region) only with the accessing loop's own
//! variable as its first index (after simplification; a region must also not extend along
//! the first dim): iteration `v` of every loop then reads and writes only row `v` of those
//! buffers, so running the loops' bodies one after the other per row computes exactly what
//! running the loops one after the other does — same operations on the same values in the
//! same order per element; buffers no loop writes cannot change, and a buffer only one loop
//! touches sees that loop's iterations in their order. A serial or vectorized loop must also
//! keep to its own rows in every buffer it writes (the fused loop is parallel); a parallel
//! one's iterations are independent by its schedule. The fused loop is still race-free by
//! `verify::parallel`'s disjointness rule, and the bounds proof runs after this pass, on the
//! fused loop. An implicit GEMM's image pack (rows `(n, y)` of panels) and its product
//! (`gemm_update` calls reading those panels, writing C's rows) fuse so: each thread packs
//! one image row's panels and multiplies them while they are in its cache.
//!
//! A serial or vectorized loop over the same range joins a group of parallel loops on the same
//! terms (a 1-d stage between two row loops, as layer_norm's backward has one: `sqsum_grad_Y`
//! from the row's sum of squares): under the rule its iterations are independent too, and in
//! the group it runs for each row between the loops it sat between. A group starts only at a
//! parallel loop, so a serial program stays serial.
//!
//! A loop that is not next in line may still join a group: a later parallel loop over the same
//! range (at most `WINDOW` statements on) is brought up when it commutes with every statement
//! it passes — it reads no buffer they write and writes none they read or write (an
//! intrinsic call touches its regions; a host callback, launch, barrier or cross-thread
//! reduction is passed by nothing) — so each of them and the loop see the same values in either order. A
//! statement it does not commute with may instead move before the group, when it commutes
//! with the group and with what it passes (`bring_up_past`). Two column sums of one input
//! (layer_norm's weight and bias gradients) are separated by the first one's zeroing and
//! combination; brought together, one thread sums its chunk of rows into both while the chunk
//! is in cache.
//!
//! Inside each parallel loop, sibling serial or vectorized loops over one range whose bodies
//! share no state are fused too (`fuse_siblings`, its doc has the rule).
//!
//! Runs only on programs under the default CPU schedule (`Options::fuse_rows`); a schedule
//! the user wrote keeps its loop structure.

use crate::arith::simplify::simplify;
use crate::ir::expr::{BufId, Expr, ExprKind, Var};
use crate::ir::intrin::Intrin;
use crate::ir::stmt::{ForKind, PrimFunc, Stmt};
use std::collections::{HashSet, VecDeque};

/// Fuses the groups of `f`'s root-level parallel loops that the rule (module doc) allows.
pub fn fuse(f: &mut PrimFunc) {
    f.body = fuse_stmt(&f.body);
}

/// Root level: through the `Allocate`s of the function's locals, to the sequence of nests.
fn fuse_stmt(s: &Stmt) -> Stmt {
    at_root(s, &fuse_seq)
}

/// `s` with each sequence reached through `Allocate`s from it (the root level of a function:
/// its locals' allocations, then the sequence of nests) replaced by `seq` of its statements.
/// A stage's nests (a reduction's init and update) come as a sequence of their own: spliced
/// first, so loops of different stages can meet.
pub(crate) fn at_root(s: &Stmt, seq: &dyn Fn(&[Stmt]) -> Vec<Stmt>) -> Stmt {
    match s {
        Stmt::Allocate { bufs, body } => Stmt::Allocate {
            bufs: bufs.clone(),
            body: Box::new(at_root(body, seq)),
        },
        Stmt::Seq(items) => {
            let mut flat = Vec::new();
            splice(items, &mut flat);
            Stmt::seq(seq(&flat))
        }
        other => other.clone(),
    }
}

pub(crate) fn splice(items: &[Stmt], out: &mut Vec<Stmt>) {
    for s in items {
        match s {
            Stmt::Seq(inner) => splice(inner, out),
            other => out.push(other.clone()),
        }
    }
}

/// A loop of the sequence being fused, its range simplified.
pub(crate) struct Loop<'a> {
    pub var: &'a Var,
    pub kind: ForKind,
    pub min: Expr,
    pub extent: Expr,
    pub body: &'a Stmt,
}

impl Loop<'_> {
    /// Same kind and same range (both simplified): the two can become one loop.
    fn matches(&self, o: &Loop<'_>) -> bool {
        self.kind == o.kind && self.min == o.min && self.extent == o.extent
    }
}

/// `s` as a loop, when it is one of a kind `accept` takes.
fn as_loop(s: &Stmt, accept: fn(ForKind) -> bool) -> Option<Loop<'_>> {
    match s {
        Stmt::For {
            var,
            min,
            extent,
            body,
            kind,
        } if accept(*kind) => Some(Loop {
            var,
            kind: *kind,
            min: simplify(min),
            extent: simplify(extent),
            body,
        }),
        _ => None,
    }
}

pub(crate) fn as_parallel(s: &Stmt) -> Option<Loop<'_>> {
    as_loop(s, |k| k == ForKind::Parallel)
}

fn as_sibling(s: &Stmt) -> Option<Loop<'_>> {
    as_loop(s, |k| matches!(k, ForKind::Serial | ForKind::Vectorized))
}

/// How far ahead (in statements) a loop may be brought up to join a group, past statements it
/// commutes with (`Effects::commutes`).
const WINDOW: usize = 8;

/// The first of the next `WINDOW` statements of `rest` that `join` takes (given its effects)
/// and that every statement before it commutes with, removed from `rest`, with its effects:
/// bringing it up to the group does not change what any statement it passes sees. Each
/// statement's effects are summarised once.
pub(crate) fn bring_up<'a, T>(
    rest: &mut VecDeque<&'a Stmt>,
    mut join: impl FnMut(&'a Stmt, &Effects) -> Option<T>,
) -> Option<(T, Effects)> {
    let mut skipped = Effects::default();
    for p in 0..rest.len().min(WINDOW) {
        let s = rest[p];
        let e = Effects::of(s);
        if p == 0 || skipped.commutes(&e) {
            if let Some(t) = join(s, &e) {
                rest.remove(p);
                return Some((t, e));
            }
        }
        skipped.extend(e);
    }
    None
}

fn fuse_seq(items: &[Stmt]) -> Vec<Stmt> {
    let mut out = Vec::new();
    // Statements not yet placed, in order; a loop brought up into a group leaves its place.
    let mut rest: VecDeque<&Stmt> = items.iter().collect();
    while let Some(head) = rest.pop_front() {
        let Some(first) = as_parallel(head) else {
            out.push(fuse_stmt(head));
            continue;
        };
        // Each loop's accesses are summarised once; a group's legality is then a check of the
        // summaries' unions, so joining a loop costs its own size, not the group's.
        let mut acc = Accesses::of(&first);
        let mut effects = Effects::of(head);
        let mut group = vec![first];
        // Statements taken out from between the group and a loop joining it, placed before
        // the group (`bring_up_past`).
        let mut before: Vec<&Stmt> = Vec::new();
        while !acc.opaque {
            let Some(((l, a), e, hoisted)) = bring_up_past(&mut rest, &effects, |s, _| {
                // A serial or vectorized loop over the same rows joins too, when its own
                // iterations are independent (`Accesses::can_join`).
                let l = as_loop(s, |k| {
                    matches!(k, ForKind::Parallel | ForKind::Serial | ForKind::Vectorized)
                })
                .filter(|l| l.min == group[0].min && l.extent == group[0].extent)?;
                let a = Accesses::of(&l);
                acc.can_join(&a, l.kind == ForKind::Parallel)
                    .then_some((l, a))
            }) else {
                break;
            };
            acc.extend(a);
            effects.extend(e);
            group.push(l);
            before.extend(hoisted);
        }
        for s in before {
            out.push(match as_parallel(s) {
                Some(_) => fuse_siblings(s),
                None => fuse_stmt(s),
            });
        }
        if group.len() == 1 {
            out.push(fuse_siblings(head));
        } else {
            out.push(fuse_siblings(&fused(&group)));
        }
    }
    out
}

/// Like `bring_up`, for a loop joining a group of loops whose effects are `group`: a
/// statement between the group and the loop that the loop does not commute with may instead
/// move before the group, when it commutes with the group and with every statement it passes
/// on the way (those that stay between). So the product of an implicit GEMM joins the pack
/// of its image rows although the product's zeroing (which it does not commute with) sits
/// between them: the zeroing runs first. Returns the loop, its effects and the statements to
/// place before the group (in their order).
pub(crate) fn bring_up_past<'a, T>(
    rest: &mut VecDeque<&'a Stmt>,
    group: &Effects,
    mut join: impl FnMut(&'a Stmt, &Effects) -> Option<T>,
) -> Option<(T, Effects, Vec<&'a Stmt>)> {
    let mut effects: Vec<Effects> = Vec::new();
    for p in 0..rest.len().min(WINDOW) {
        let s = rest[p];
        let e = Effects::of(s);
        if let Some(t) = join(s, &e) {
            // Which of the statements before it stay (the loop passes them) and which go
            // before the group.
            let mut stay = Effects::default();
            let mut hoist = Vec::new();
            let mut ok = true;
            for (q, eq) in effects.iter().enumerate() {
                if eq.commutes(&e) {
                    stay.extend_ref(eq);
                } else if group.commutes(eq) && stay.commutes(eq) {
                    hoist.push(q);
                } else {
                    ok = false;
                    break;
                }
            }
            if ok {
                let hoisted: Vec<&Stmt> = hoist.iter().map(|&q| rest[q]).collect();
                rest.remove(p);
                for &q in hoist.iter().rev() {
                    rest.remove(q);
                }
                return Some((t, e, hoisted));
            }
        }
        effects.push(e);
    }
    None
}

/// Inside a parallel loop: consecutive serial (or vectorized) loops over one range whose
/// bodies touch disjoint state — neither writes a buffer the other reads or writes
/// (`Effects::commutes`) — become one loop, with the same window as above for a later one
/// brought up past statements it commutes with; then the same inside the fused bodies.
/// Legal for any index pattern: the two bodies share no state, so interleaving their
/// iterations keeps each one's own order and every value it sees. The chunk loops of two
/// column sums of one input then read each row once for both sums.
pub(crate) fn fuse_siblings(s: &Stmt) -> Stmt {
    // Bottom-up: the sequences inside a loop body are done before the body's own.
    s.rewrite(&mut |e| e.clone(), &mut |s| match s {
        Stmt::Seq(items) => {
            let mut flat = Vec::new();
            splice(&items, &mut flat);
            Stmt::seq(sibling_seq(&flat))
        }
        other => other,
    })
}

/// One sequence's sibling groups (its statements were already done: `fuse_siblings`).
fn sibling_seq(items: &[Stmt]) -> Vec<Stmt> {
    let mut out = Vec::new();
    let mut rest: VecDeque<&Stmt> = items.iter().collect();
    while let Some(head) = rest.pop_front() {
        let Some(first) = as_sibling(head) else {
            out.push(head.clone());
            continue;
        };
        let mut effects = Effects::of(head);
        let mut group = vec![first];
        while let Some((l, e)) = bring_up(&mut rest, |s, e| {
            as_sibling(s).filter(|l| l.matches(&group[0]) && effects.commutes(e))
        }) {
            effects.extend(e);
            group.push(l);
        }
        if group.len() == 1 {
            out.push(head.clone());
        } else {
            // The bodies now side by side may hold siblings of their own.
            out.push(fuse_siblings(&fused(&group)));
        }
    }
    out
}

/// The buffers a statement reads and writes, for moving a loop past it.
#[derive(Default)]
pub(crate) struct Effects {
    reads: HashSet<BufId>,
    writes: HashSet<BufId>,
    /// A call, launch, barrier or cross-thread reduction: nothing moves past it.
    opaque: bool,
}

impl Effects {
    pub(crate) fn of(s: &Stmt) -> Effects {
        let mut e = Effects::default();
        s.visit(&mut |x| match x {
            Stmt::Store { buf, .. } => {
                e.writes.insert(*buf);
            }
            // A tensor intrinsic touches exactly its regions (the bounds proof checks each);
            // a host callback is user code: nothing moves past it.
            Stmt::Call {
                intrin: Intrin::Callback(_),
                ..
            } => e.opaque = true,
            Stmt::Call { regions, .. } => {
                for r in regions {
                    if r.write {
                        e.writes.insert(r.buf);
                    } else {
                        e.reads.insert(r.buf);
                    }
                }
            }
            Stmt::Launch { .. } | Stmt::AllReduce { .. } | Stmt::Barrier => e.opaque = true,
            _ => {}
        });
        s.visit_exprs(&mut |x| {
            x.visit(&mut |n| {
                if let ExprKind::Load { buf, .. } = n.kind() {
                    e.reads.insert(*buf);
                }
            })
        });
        e
    }

    /// Whether `o` can run before the statements summarised by `self`: it reads nothing they
    /// write and writes nothing they read or write (so every value either side sees is the
    /// same in both orders).
    pub(crate) fn commutes(&self, o: &Effects) -> bool {
        !self.opaque
            && !o.opaque
            && o.reads.is_disjoint(&self.writes)
            && o.writes.is_disjoint(&self.writes)
            && o.writes.is_disjoint(&self.reads)
    }

    fn extend(&mut self, o: Effects) {
        self.reads.extend(o.reads);
        self.writes.extend(o.writes);
        self.opaque |= o.opaque;
    }

    fn extend_ref(&mut self, o: &Effects) {
        self.reads.extend(o.reads.iter().copied());
        self.writes.extend(o.writes.iter().copied());
        self.opaque |= o.opaque;
    }
}

/// The group's loops (of one kind) as one loop over the first one's variable.
fn fused(group: &[Loop<'_>]) -> Stmt {
    let v = group[0].var.clone();
    let ve = Expr::var(&v);
    let bodies: Vec<Stmt> = group
        .iter()
        .map(|l| {
            if l.var == &v {
                return l.body.clone();
            }
            let old = l.var.clone();
            l.body.rewrite(
                &mut |e| e.substitute(&|x| (*x == old).then(|| ve.clone())),
                &mut |s| s,
            )
        })
        .collect();
    Stmt::For {
        var: v,
        min: group[0].min.clone(),
        extent: group[0].extent.clone(),
        body: Box::new(Stmt::seq(bodies)),
        kind: group[0].kind,
    }
}

/// What loops do to buffers, for the legality rule of the module doc.
#[derive(Default)]
struct Accesses {
    /// Buffers loaded, stored or passed to an intrinsic.
    touched: HashSet<BufId>,
    /// Buffers stored to (or written by an intrinsic).
    written: HashSet<BufId>,
    /// Buffers allocated inside a body: private to one iteration of its loop.
    private: HashSet<BufId>,
    /// Buffers loaded or stored somewhere other than the loop's own row.
    strays: HashSet<BufId>,
    /// A host callback, launch, barrier or cross-thread reduction: never fused.
    opaque: bool,
}

impl Accesses {
    fn of(l: &Loop<'_>) -> Accesses {
        let mut a = Accesses::default();
        let own = |indices: &[Expr]| {
            indices
                .first()
                .is_some_and(|i| simplify(i).as_var() == Some(l.var))
        };
        let touch = |a: &mut Accesses, buf: BufId, write: bool, own: bool| {
            a.touched.insert(buf);
            if write {
                a.written.insert(buf);
            }
            if !own {
                a.strays.insert(buf);
            }
        };
        l.body.visit(&mut |s| match s {
            Stmt::Store { buf, indices, .. } => touch(&mut a, *buf, true, own(indices)),
            Stmt::Allocate { bufs, .. } => {
                a.private.extend(bufs.iter().copied());
            }
            // An intrinsic's region is in the loop's own row when its base's first index is
            // the loop's variable and it does not extend along the first dim; a host callback
            // is never fused.
            Stmt::Call {
                intrin: Intrin::Callback(_),
                ..
            } => a.opaque = true,
            Stmt::Call { regions, .. } => {
                for r in regions {
                    let row = own(&r.base) && r.axes.iter().all(|x| x.dim != 0);
                    touch(&mut a, r.buf, r.write, row);
                }
            }
            Stmt::Launch { .. } | Stmt::AllReduce { .. } | Stmt::Barrier => a.opaque = true,
            _ => {}
        });
        l.body.visit_exprs(&mut |e| {
            e.visit(&mut |n| {
                if let ExprKind::Load { buf, indices } = n.kind() {
                    touch(&mut a, *buf, false, own(indices));
                }
            })
        });
        a
    }

    /// Whether the loops summarised by `self` (a legal group) and `o` make a legal group.
    /// Every buffer both touch (private buffers aside) is either written by neither or
    /// touched by both only in their own rows; a buffer only one of them touches may be
    /// anywhere (only that loop's iterations see it, in their order). `o`, unless it is a
    /// parallel loop (whose iterations are independent by its schedule, which
    /// `verify::parallel` proves), must also keep to its own rows in the buffers it writes:
    /// the fused loop runs its iterations in parallel. Costs `o`'s size.
    fn can_join(&self, o: &Accesses, parallel: bool) -> bool {
        let private = |b: &BufId| self.private.contains(b) || o.private.contains(b);
        !self.opaque
            && !o.opaque
            && o.touched.iter().all(|b| {
                private(b)
                    || !self.touched.contains(b)
                    || !(self.written.contains(b) || o.written.contains(b))
                    || !(self.strays.contains(b) || o.strays.contains(b))
            })
            && (parallel
                || o.strays
                    .iter()
                    .all(|b| !o.written.contains(b) || private(b)))
    }

    fn extend(&mut self, o: Accesses) {
        self.touched.extend(o.touched);
        self.written.extend(o.written);
        self.private.extend(o.private);
        self.strays.extend(o.strays);
        self.opaque |= o.opaque;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::intrin::{Region, RegionAxis};
    use crate::ir::stmt::BufKind;
    use crate::ir::test_util::{buffer, func as prim, input, loop_over, output, store};
    use rivet_runtime::DType;

    const X: BufId = BufId(0);
    const Y: BufId = BufId(1);
    const T: BufId = BufId(2);
    const Z: BufId = BufId(3);

    /// `f(X[n, m], Y[n, m] out)` with locals `T`, `Z` (`[n, m]`) around `items(n, m)`.
    fn func(items: impl FnOnce(&Expr, &Expr) -> Vec<Stmt>) -> PrimFunc {
        let (n, m) = (Var::new("n"), Var::new("m"));
        let shape = vec![Expr::var(&n), Expr::var(&m)];
        let body = Stmt::Allocate {
            bufs: vec![T, Z],
            body: Box::new(Stmt::seq(items(&Expr::var(&n), &Expr::var(&m)))),
        };
        let buffers = vec![
            input(X.0, "X", DType::F32, shape.clone()),
            output(Y.0, "Y", DType::F32, shape.clone()),
            buffer(T.0, "T", DType::F32, shape.clone(), BufKind::Local),
            buffer(Z.0, "Z", DType::F32, shape, BufKind::Local),
        ];
        prim("f", buffers, vec![n, m], body)
    }

    /// `kind for i in [0, rows): for j in [0, m): body(i, j)`.
    fn rows(kind: ForKind, rows: &Expr, m: &Expr, body: impl FnOnce(&Expr, &Expr) -> Stmt) -> Stmt {
        loop_over("i", rows.clone(), kind, |i| {
            loop_over("j", m.clone(), ForKind::Serial, |j| body(i, j))
        })
    }

    fn ld(b: BufId, i: &Expr, j: &Expr) -> Expr {
        Expr::load(b, vec![i.clone(), j.clone()], DType::F32)
    }

    fn st(b: BufId, i: &Expr, j: &Expr, value: Expr) -> Stmt {
        store(b, vec![i.clone(), j.clone()], value)
    }

    /// A `gemm_update`-like call writing row `i` of Y from `from`'s region at `base` spanning
    /// `dims` (extent `m` each).
    fn call(from: BufId, base: [Expr; 2], dims: &[u32], i: &Expr, m: &Expr) -> Stmt {
        let axes = |dims: &[u32]| {
            dims.iter()
                .map(|&dim| RegionAxis {
                    dim,
                    extent: m.clone(),
                })
                .collect::<Vec<_>>()
        };
        Stmt::Call {
            intrin: Intrin::GemmUpdate,
            regions: vec![
                Region {
                    buf: Y,
                    base: vec![i.clone(), Expr::int(0)],
                    axes: axes(&[1]),
                    write: true,
                },
                Region {
                    buf: from,
                    base: base.to_vec(),
                    axes: axes(dims),
                    write: false,
                },
            ],
            scalars: vec![],
        }
    }

    /// The root statements after fusion (under the locals' `Allocate`).
    fn roots(f: &PrimFunc) -> Vec<Stmt> {
        let Stmt::Allocate { body, .. } = &f.body else {
            panic!("{f}")
        };
        match &**body {
            Stmt::Seq(v) => v.clone(),
            s => vec![s.clone()],
        }
    }

    fn parallel_loops(f: &PrimFunc) -> usize {
        roots(f)
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    Stmt::For {
                        kind: ForKind::Parallel,
                        ..
                    }
                )
            })
            .count()
    }

    #[test]
    fn a_loop_of_intrinsic_calls_joins_in_its_own_rows() {
        // T's row i packed, then a call reading T's row i (its region along dim 1 only).
        let prog = |dims: &'static [u32]| {
            func(|n, m| {
                vec![
                    rows(ForKind::Parallel, n, m, |i, j| st(T, i, j, ld(X, i, j))),
                    loop_over("i", n.clone(), ForKind::Parallel, |i| {
                        call(T, [i.clone(), Expr::int(0)], dims, i, m)
                    }),
                ]
            })
        };
        let mut f = prog(&[1]);
        fuse(&mut f);
        assert_eq!(parallel_loops(&f), 1, "{f}");
        // A region spanning T's first dim reads other rows of T: not fused.
        let mut f = prog(&[0, 1]);
        fuse(&mut f);
        assert_eq!(parallel_loops(&f), 2, "{f}");
    }

    #[test]
    fn a_buffer_only_one_loop_touches_may_be_anywhere() {
        // The second loop writes Z at rows other than its own (`i // 2`), and no other loop
        // touches Z: fused when the loop is parallel (its own schedule makes its iterations
        // independent), not when it is serial (the fused loop would run them in parallel).
        let prog = |kind: ForKind| {
            func(|n, m| {
                vec![
                    rows(ForKind::Parallel, n, m, |i, j| st(T, i, j, ld(X, i, j))),
                    rows(kind, n, m, |i, j| {
                        let half = i.floordiv(&Expr::int(2));
                        Stmt::seq(vec![st(Z, &half, j, ld(T, i, j)), st(Y, i, j, ld(T, i, j))])
                    }),
                ]
            })
        };
        let mut f = prog(ForKind::Parallel);
        fuse(&mut f);
        assert_eq!(roots(&f).len(), 1, "{f}");
        let mut f = prog(ForKind::Serial);
        fuse(&mut f);
        assert_eq!(roots(&f).len(), 2, "{f}");
        // Shared with a stray: the second loop reads row `i // 2` of T, which the first writes.
        let mut f = func(|n, m| {
            vec![
                rows(ForKind::Parallel, n, m, |i, j| st(T, i, j, ld(X, i, j))),
                rows(ForKind::Parallel, n, m, |i, j| {
                    st(Y, i, j, ld(T, &i.floordiv(&Expr::int(2)), j))
                }),
            ]
        });
        fuse(&mut f);
        assert_eq!(parallel_loops(&f), 2, "{f}");
    }

    #[test]
    fn a_statement_in_the_way_moves_before_the_group() {
        // Z zeroed over 2 rows between the pack of T and the loop that reads T and adds into
        // Z: the zeroing does not commute with the second loop but does with the first, so it
        // runs first and the two loops fuse.
        let two = Expr::int(2);
        let mut f = func(|n, m| {
            vec![
                rows(ForKind::Parallel, n, m, |i, j| st(T, i, j, ld(X, i, j))),
                rows(ForKind::Parallel, &two, m, |i, j| {
                    st(Z, i, j, Expr::constant(0.0, DType::F32))
                }),
                rows(ForKind::Parallel, n, m, |i, j| {
                    let z = ld(Z, i, j);
                    st(
                        Z,
                        i,
                        j,
                        Expr::binary(crate::ir::expr::BinOp::Add, z, ld(T, i, j)).unwrap(),
                    )
                }),
            ]
        });
        fuse(&mut f);
        let r = roots(&f);
        assert_eq!(r.len(), 2, "{f}");
        let Stmt::For { extent, .. } = &r[0] else {
            panic!("{f}")
        };
        assert_eq!(extent, &two, "the zeroing first: {f}");
        // It may not move when it does not commute with the group either (it reads T).
        let mut f = func(|n, m| {
            vec![
                rows(ForKind::Parallel, n, m, |i, j| st(T, i, j, ld(X, i, j))),
                rows(ForKind::Parallel, &two, m, |i, j| st(Z, i, j, ld(T, i, j))),
                rows(ForKind::Parallel, n, m, |i, j| st(Z, i, j, ld(T, i, j))),
            ]
        });
        fuse(&mut f);
        assert_eq!(roots(&f).len(), 3, "{f}");
    }
}
