//! Row fusion: consecutive root-level parallel loops over the same range whose iterations
//! each touch only their own row of every buffer the loops write become one parallel loop.
//!
//! What the default CPU schedule (`schedule::cpu_default`) makes of a row-wise program —
//! softmax's maximum (its lane partials, tail and combination), exponentials, sum and
//! quotient; layer_norm's two sums and the normalisation — is one parallel loop over the rows
//! per stage: each sweeps the whole tensor, so a 4096 x 1024 softmax read or wrote 16 MiB ten
//! times from memory. Fused, one thread runs every stage on a row while it is in its cache.
//!
//! Legal when, in every loop of the group, every access (load or store) to a buffer that any
//! loop of the group stores to has the loop's own variable as its first index (after
//! simplification): iteration `v` of every loop then reads and writes only row `v` of those
//! buffers, so running the loops' bodies one after the other per row computes exactly what
//! running the loops one after the other does — same operations on the same values in the
//! same order per element; buffers no loop writes cannot change. A loop with an intrinsic
//! call (whose regions are not plain indexed accesses) is never fused. The fused loop is still
//! race-free by `verify::parallel`'s disjointness rule (a slot holding `v` in every access), and
//! the bounds proof runs after this pass, on the fused loop.
//!
//! A serial or vectorized loop over the same range joins a group of parallel loops on the same
//! terms (a 1-d stage between two row loops, as layer_norm's backward has one: `sqsum_grad_Y`
//! from the row's sum of squares): under the rule its iterations are independent too, and in
//! the group it runs for each row between the loops it sat between. A group starts only at a
//! parallel loop, so a serial program stays serial.
//!
//! A loop that is not next in line may still join a group: a later parallel loop over the same
//! range (at most `WINDOW` statements on) is brought up when it commutes with every statement
//! it passes — it reads no buffer they write and writes none they read or write (a statement
//! with a call, launch, barrier or cross-thread reduction is passed by nothing) — so each of
//! them and the loop see the same values in either order. Two column sums of one input
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
        let mut group = vec![first];
        // A loop that strays into a buffer it writes itself starts no group (`can_join` checks
        // only what a newcomer adds to a group that passes the rule).
        while acc.row_local() {
            let Some(((l, a), _)) = bring_up(&mut rest, |s, _| {
                // A serial or vectorized loop over the same rows joins too: under the rule its
                // iterations touch only their own rows, so they may run in any order.
                let l = as_loop(s, |k| {
                    matches!(k, ForKind::Parallel | ForKind::Serial | ForKind::Vectorized)
                })
                .filter(|l| l.min == group[0].min && l.extent == group[0].extent)?;
                let a = Accesses::of(&l);
                acc.can_join(&a).then_some((l, a))
            }) else {
                break;
            };
            acc.extend(a);
            group.push(l);
        }
        if group.len() == 1 {
            out.push(fuse_siblings(head));
        } else {
            out.push(fuse_siblings(&fused(&group)));
        }
    }
    out
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
            Stmt::Call { .. } | Stmt::Launch { .. } | Stmt::AllReduce { .. } | Stmt::Barrier => {
                e.opaque = true
            }
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
    /// Buffers stored to.
    written: HashSet<BufId>,
    /// Buffers allocated inside a body: private to one iteration of its loop.
    private: HashSet<BufId>,
    /// Buffers loaded or stored somewhere other than the loop's own row.
    strays: HashSet<BufId>,
    /// An intrinsic call, launch, barrier or cross-thread reduction: never fused.
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
        l.body.visit(&mut |s| match s {
            Stmt::Store { buf, indices, .. } => {
                a.written.insert(*buf);
                if !own(indices) {
                    a.strays.insert(*buf);
                }
            }
            Stmt::Allocate { bufs, .. } => {
                a.private.extend(bufs.iter().copied());
            }
            Stmt::Call { .. } | Stmt::Launch { .. } | Stmt::AllReduce { .. } | Stmt::Barrier => {
                a.opaque = true
            }
            _ => {}
        });
        l.body.visit_exprs(&mut |e| {
            e.visit(&mut |n| {
                if let ExprKind::Load { buf, indices } = n.kind() {
                    if !own(indices) {
                        a.strays.insert(*buf);
                    }
                }
            })
        });
        a
    }

    /// The rule for the loops summarised by `self`: no stray into a buffer they write (private
    /// buffers aside), nothing opaque.
    fn row_local(&self) -> bool {
        !self.opaque
            && self
                .strays
                .iter()
                .all(|b| !self.written.contains(b) || self.private.contains(b))
    }

    /// Whether the loops summarised by `self` (a legal group) and `o` make a legal group:
    /// `o`'s strays must not be written by anyone, nor `o`'s writes strayed into by anyone
    /// (private buffers aside). Costs `o`'s size.
    fn can_join(&self, o: &Accesses) -> bool {
        let private = |b: &BufId| self.private.contains(b) || o.private.contains(b);
        !self.opaque
            && !o.opaque
            && o.strays
                .iter()
                .all(|b| !(self.written.contains(b) || o.written.contains(b)) || private(b))
            && o.written
                .iter()
                .all(|b| !self.strays.contains(b) || private(b))
    }

    fn extend(&mut self, o: Accesses) {
        self.written.extend(o.written);
        self.private.extend(o.private);
        self.strays.extend(o.strays);
        self.opaque |= o.opaque;
    }
}
