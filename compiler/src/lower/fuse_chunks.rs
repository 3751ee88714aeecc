//! Chunk fusion: a parallel loop over rows is taken into a later column reduction's chunk
//! loop, so each chunk of rows is read once for both.
//!
//! The default CPU schedule sums down columns in chunks of rows
//! (`schedule::cpu_default::column_reduce`): `parallel for c in [0, C): { init(c); for q in [0, R): update(c, lo + c*R + q) }`. A
//! layer_norm backward is a row loop (the row sums, then the input gradient, row by row) and
//! two such column sums (weight and bias) over the same rows: three sweeps of `x` and `dy`
//! where one would do. After this pass the row loop's body runs for row `lo + c*R + q` right
//! before the chunk update of the same row, inside the chunk loop, and the two bodies' loops
//! over the columns then fuse (`fuse_rows::fuse_siblings`): the row is read from memory once.
//!
//! Legal when the row loop `A = parallel for v in [lo, lo + M): a(v)` and the chunk loop `B`
//! commute (`fuse_rows::Effects::commutes`: neither writes a buffer the other reads or
//! writes), with `C == max(M, 0) // R` (simplified; for constants, the value): `A` is a
//! parallel loop, so its iterations may run in any order; `B` shares no state with it, so
//! `A`'s iterations may be interleaved with `B`'s statements anywhere, as long as each of them
//! runs exactly once. The fused loop runs `a(lo + c*R + q)` for every `c < C`, `q < R`, which
//! is the rows `[lo, lo + C*R)`, then `parallel for v in [lo + C*R, lo + M): a(v)`: the rows
//! left over (none when `M` is a constant multiple of `R`; an empty loop when `M <= 0`, since
//! then `C = 0` and the extent `M` is not positive). Each iteration of the fused loop touches
//! what one iteration of `B` did plus rows `c*R + q` of `A`'s buffers: disjoint between
//! chunks (`verify::parallel`'s rule with coefficient `R` and window `[0, R)`).
//!
//! The chunk loop may be up to `fuse_rows::WINDOW` statements on, past statements it commutes
//! with; one it does not commute with (the zeroing of a tail it adds into) moves before `A`
//! when it commutes with `A` and with what it passes (`fuse_rows::bring_up_past`).
//!
//! Taken only where it pays: `B`'s row loop must load some buffer at row `lo + c*R + q` (the
//! same rows as `A`). Runs after `row_locals` (a row's locals are allocated inside `A`'s body
//! and come with it) and, like row fusion, only on the default CPU schedule, on the nest: saved
//! modules keep the fused loop and loaded ones prove it again.

use crate::arith::simplify::simplify;
use crate::ir::expr::{Expr, ExprKind};
use crate::ir::stmt::{ForKind, PrimFunc, Stmt};
use crate::lower::fuse_rows::{
    as_parallel, at_root, bring_up_past, fuse_siblings, splice, Effects, Loop,
};
use std::collections::VecDeque;

/// Fuses each root-level parallel row loop of `f` with the first later chunk loop the rule
/// (module doc) allows.
pub fn fuse(f: &mut PrimFunc) {
    f.body = at_root(&f.body, &fuse_seq);
}

fn fuse_seq(items: &[Stmt]) -> Vec<Stmt> {
    let mut out = Vec::new();
    let mut rest: VecDeque<&Stmt> = items.iter().collect();
    while let Some(head) = rest.pop_front() {
        // A statement in the way that the chunk loop does not commute with (the zeroing of a
        // tail the chunk loop adds into) goes before the row loop when it commutes with it.
        let taken = as_parallel(head).and_then(|a| {
            let ea = Effects::of(head);
            bring_up_past(&mut rest, &ea, |s, e| {
                if ea.commutes(e) {
                    into_chunks(&a, s)
                } else {
                    None
                }
            })
        });
        match taken {
            Some((fused, _, before)) => {
                out.extend(before.into_iter().cloned());
                out.extend(fused)
            }
            None => out.push(head.clone()),
        }
    }
    out
}

/// `A`'s iterations taken into the chunk loop `s` (the fused chunk loop, then the loop over
/// the rows left over when there can be any), or `None` when `s` is not a chunk loop over
/// `A`'s rows. The caller has checked that `A` and `s` commute.
fn into_chunks(a: &Loop<'_>, s: &Stmt) -> Option<Vec<Stmt>> {
    let Stmt::For {
        var: c,
        min: cmin,
        extent: cext,
        body: cbody,
        kind: ForKind::Parallel,
    } = s
    else {
        return None;
    };
    if simplify(cmin).as_int() != Some(0) {
        return None;
    }
    let mut items = Vec::new();
    splice(std::slice::from_ref(cbody.as_ref()), &mut items);
    // The first serial loop over `[0, R)` whose body loads a row `lo + c*R + q`.
    let (at, q, r, qbody, row) = items.iter().enumerate().find_map(|(at, x)| match x {
        Stmt::For {
            var: q,
            min,
            extent,
            body,
            kind: ForKind::Serial,
        } if simplify(min).as_int() == Some(0) => {
            let r = simplify(extent).as_int().filter(|&r| r > 0)?;
            let row = simplify(
                &a.min
                    .add(&Expr::var(c).mul(&Expr::int(r)))
                    .add(&Expr::var(q)),
            );
            reads_row(body, &row).then(|| (at, q.clone(), r, body, row))
        }
        _ => None,
    })?;
    // C == max(M, 0) // R: the chunks cover the rows [lo, lo + C*R) of A, and no more.
    let chunks = simplify(&a.extent.max_(&Expr::int(0)).floordiv(&Expr::int(r)));
    if simplify(cext) != chunks {
        return None;
    }
    let av = a.var.clone();
    let a_row = a.body.rewrite(
        &mut |e| e.substitute(&|x| (*x == av).then(|| row.clone())),
        &mut |s| s,
    );
    let mut fused_items = items.clone();
    fused_items[at] = Stmt::For {
        var: q,
        min: Expr::int(0),
        extent: Expr::int(r),
        body: Box::new(append_inside(a_row, qbody)),
        kind: ForKind::Serial,
    };
    let fused = Stmt::For {
        var: c.clone(),
        min: cmin.clone(),
        extent: cext.clone(),
        body: Box::new(Stmt::seq(fused_items)),
        kind: ForKind::Parallel,
    };
    let mut out = vec![fuse_siblings(&fused)];
    let whole = a.extent.as_int().is_some_and(|m| m >= 0 && m % r == 0);
    if !whole {
        // The rows past the last whole chunk: [lo + C*R, lo + M).
        let done = chunks.mul(&Expr::int(r));
        out.push(Stmt::For {
            var: a.var.clone(),
            min: simplify(&a.min.add(&done)),
            extent: simplify(&a.extent.sub(&done)),
            body: Box::new(a.body.clone()),
            kind: ForKind::Parallel,
        });
    }
    Some(out)
}

/// Whether some load in `s` has `row` (simplified) as its first index.
fn reads_row(s: &Stmt, row: &Expr) -> bool {
    let mut found = false;
    s.visit_exprs(&mut |e| {
        e.visit(&mut |n| {
            if let ExprKind::Load { indices, .. } = n.kind() {
                found |= indices.first().is_some_and(|i| simplify(i) == *row);
            }
        })
    });
    found
}

/// `first` then `then`, with `then` placed inside `first`'s `Allocate`s (which hold buffers
/// private to `first`, so `then` cannot name them): the two bodies' loops over the columns
/// meet in one sequence, where sibling fusion can join them.
fn append_inside(first: Stmt, then: &Stmt) -> Stmt {
    match first {
        Stmt::Allocate { bufs, body } => Stmt::Allocate {
            bufs,
            body: Box::new(append_inside(*body, then)),
        },
        other => Stmt::seq(vec![other, then.clone()]),
    }
}
