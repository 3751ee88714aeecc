//! Loop-invariant scalars of vector statements, computed once before their loop.
//!
//! A vector statement evaluates the scalar under each `broadcast` once per statement, that is
//! once per iteration of its loop: layer_norm's row mean and `rsqrt(var + eps)`, softmax's row
//! maximum and sum were loaded and recomputed for every four elements (Cranelift's own code
//! motion moves pure instructions, never loads). `invariant_broadcasts` finds, for a loop, the
//! broadcast values of the vector stores directly in its body (not in nested loops) that
//! cannot change inside it; `FnGen::counted_loop` computes them in a preheader that runs only
//! when the loop runs at least once (a load the bounds proof allowed inside the loop is never
//! made for an empty one), and `FnGen::scalar` takes them from `FnGen::hoisted`.
//!
//! A value is invariant when: no variable bound inside the loop (its own, `let`s, inner loops)
//! occurs in it; no buffer it loads is written anywhere in the loop body (outputs never share
//! memory with other arguments, the runtime's rule, and locals are separate allocations, so a
//! buffer the body does not write keeps its contents); and it has no integer division or
//! remainder (whose behaviour on zero stays where the program puts it). A value without a load
//! or a division is left alone: Cranelift hoists pure instructions itself.

use crate::ir::{BinOp, BufId, Expr, ExprKind, Stmt, Var};
use std::collections::HashSet;

/// The distinct broadcast values of the vector stores directly in `body` (the body of the
/// loop over `var`) that are invariant in the loop (module doc).
pub(super) fn invariant_broadcasts(var: &Var, body: &Stmt) -> Vec<Expr> {
    let mut bound: HashSet<u32> = HashSet::from([var.id]);
    let mut written: HashSet<BufId> = HashSet::new();
    let mut opaque = false;
    body.visit(&mut |s| match s {
        Stmt::For { var, .. } | Stmt::Let { var, .. } => {
            bound.insert(var.id);
        }
        Stmt::Store { buf, .. } => {
            written.insert(*buf);
        }
        Stmt::Call { regions, .. } => written.extend(regions.iter().map(|r| r.buf)),
        Stmt::AllReduce { .. } | Stmt::Launch { .. } => {
            // Not in CPU loop bodies; make nothing invariant if they ever are.
            opaque = true;
        }
        _ => {}
    });
    if opaque {
        return Vec::new();
    }
    let mut out: Vec<Expr> = Vec::new();
    let mut seen: HashSet<usize> = HashSet::new();
    direct_vector_stores(body, &mut |value| {
        value.visit(&mut |n| {
            if let ExprKind::Broadcast { value: v, .. } = n.kind() {
                let key = std::sync::Arc::as_ptr(&v.0) as usize;
                if seen.insert(key) && worth_hoisting(v) && invariant(v, &bound, &written) {
                    out.push(v.clone());
                }
            }
        })
    });
    out
}

/// The broadcast scalars that several vector stores of one iteration of a loop share
/// (`body`: the loop's body), each computed once at the top of the iteration instead of once
/// per statement (a statement's scalars are its own: `vector.rs` forgets them after each
/// store). A column reduction unrolled over eight vectors of a row reads the row's mean and
/// `rsqrt(var + eps)` in each of them. Only stores directly in the body (through sequences,
/// `let`s and `Allocate`s, not under an `if` or in a nested loop) count, so every value was
/// evaluated by the iteration anyway; a value qualifies under `invariant`'s rule with the
/// loop's own variable allowed: no variable bound inside the body, no load of a buffer the
/// body writes, no integer division. Returns each distinct value (structurally) with the
/// node addresses (`FnGen::hoisted` keys) of all its occurrences.
pub(super) fn per_iteration_broadcasts(body: &Stmt) -> Vec<(Expr, Vec<usize>)> {
    let mut bound: HashSet<u32> = HashSet::new();
    let mut written: HashSet<BufId> = HashSet::new();
    let mut opaque = false;
    body.visit(&mut |s| match s {
        Stmt::For { var, .. } | Stmt::Let { var, .. } => {
            bound.insert(var.id);
        }
        Stmt::Store { buf, .. } => {
            written.insert(*buf);
        }
        Stmt::Call { regions, .. } => written.extend(regions.iter().map(|r| r.buf)),
        Stmt::AllReduce { .. } | Stmt::Launch { .. } => opaque = true,
        _ => {}
    });
    if opaque {
        return Vec::new();
    }
    fn stores(s: &Stmt, f: &mut dyn FnMut(&Expr)) {
        match s {
            Stmt::Store { value, .. } if value.is_vector() => f(value),
            Stmt::Seq(v) => v.iter().for_each(|s| stores(s, f)),
            Stmt::Let { body, .. } | Stmt::Allocate { body, .. } => stores(body, f),
            _ => {}
        }
    }
    // (value, occurrences' addresses, number of statements using it)
    let mut found: Vec<(Expr, Vec<usize>, usize)> = Vec::new();
    stores(body, &mut |value| {
        let mut here: HashSet<usize> = HashSet::new();
        value.visit(&mut |n| {
            if let ExprKind::Broadcast { value: v, .. } = n.kind() {
                if !worth_hoisting(v) || !invariant(v, &bound, &written) {
                    return;
                }
                let key = std::sync::Arc::as_ptr(&v.0) as usize;
                let k = match found.iter().position(|(e, _, _)| e == v) {
                    Some(k) => k,
                    None => {
                        found.push((v.clone(), Vec::new(), 0));
                        found.len() - 1
                    }
                };
                if !found[k].1.contains(&key) {
                    found[k].1.push(key);
                }
                if here.insert(k) {
                    found[k].2 += 1;
                }
            }
        })
    });
    found
        .into_iter()
        .filter(|(_, _, n)| *n >= 2)
        .map(|(e, keys, _)| (e, keys))
        .collect()
}

/// Calls `f` on the value of each vector store in `s`, not descending into loops.
fn direct_vector_stores(s: &Stmt, f: &mut dyn FnMut(&Expr)) {
    match s {
        Stmt::Store { value, .. } if value.is_vector() => f(value),
        Stmt::Seq(v) => v.iter().for_each(|s| direct_vector_stores(s, f)),
        Stmt::Let { body, .. } | Stmt::Allocate { body, .. } => direct_vector_stores(body, f),
        Stmt::If {
            then, otherwise, ..
        } => {
            direct_vector_stores(then, f);
            if let Some(o) = otherwise {
                direct_vector_stores(o, f)
            }
        }
        _ => {}
    }
}

fn worth_hoisting(e: &Expr) -> bool {
    let mut any = false;
    e.visit(&mut |n| {
        any |= matches!(
            n.kind(),
            ExprKind::Load { .. } | ExprKind::Unary(..) | ExprKind::Binary(BinOp::Div, ..)
        )
    });
    any
}

fn invariant(e: &Expr, bound: &HashSet<u32>, written: &HashSet<BufId>) -> bool {
    let mut ok = !e.is_vector();
    e.visit(&mut |n| match n.kind() {
        ExprKind::Var(v) if bound.contains(&v.id) => ok = false,
        ExprKind::Load { buf, .. } if written.contains(buf) => ok = false,
        ExprKind::Binary(BinOp::Div | BinOp::FloorDiv | BinOp::FloorMod, a, _)
            if !a.dtype().is_float() =>
        {
            ok = false
        }
        // Only plain data: anything the CPU backend does not evaluate as a scalar stays put.
        ExprKind::Read { .. }
        | ExprKind::Reduce { .. }
        | ExprKind::Invalid(_)
        | ExprKind::Ramp { .. }
        | ExprKind::Broadcast { .. } => ok = false,
        _ => {}
    });
    ok
}

/// Loop-carried vectors kept in registers: the `(buffer, index)` of the vector stores directly
/// in `body` (the body of the loop over `var`, through sequences and `let`s) whose index is a
/// contiguous ramp that cannot change inside the loop, when every access to that buffer
/// anywhere in the loop is at one of those indices (as a vector of the same lanes) and the
/// indices of one buffer are at least a vector apart (constant differences) or in different
/// rows (`other_rows`): then the
/// buffer's elements there are only ever read and written whole, by this loop, so a register
/// per index holds them from before the loop (one load) to after it (one store). A 16-lane
/// partial sum accumulated over a row (`S.lanes[.., l.v * 4 ..]` in `for ko`) and a row of a
/// register tile accumulated over `p` are such. `packed`: whether the code generator computes
/// a value as one packed register (`vector.rs`); stores of other values are not candidates.
pub(super) fn loop_carried(
    var: &Var,
    body: &Stmt,
    packed: &dyn Fn(&Expr) -> bool,
    func: &crate::ir::PrimFunc,
) -> Vec<(BufId, Expr)> {
    let mut bound: HashSet<u32> = HashSet::from([var.id]);
    let mut opaque = false;
    body.visit(&mut |s| match s {
        Stmt::For { var, .. } | Stmt::Let { var, .. } => {
            bound.insert(var.id);
        }
        Stmt::Call { .. }
        | Stmt::AllReduce { .. }
        | Stmt::Launch { .. }
        | Stmt::Allocate { .. } => opaque = true,
        _ => {}
    });
    if opaque {
        return Vec::new();
    }
    let mut cands: Vec<(BufId, Expr)> = Vec::new();
    direct_stores(body, &mut |buf, index, value| {
        let invariant_ramp = matches!(index.kind(), ExprKind::Ramp { base, stride, .. }
            if stride.as_int() == Some(1) && invariant(base, &bound, &HashSet::new()));
        if invariant_ramp && packed(value) && !cands.iter().any(|(b, i)| *b == buf && i == index) {
            cands.push((buf, index.clone()));
        }
    });
    // Every access to a candidate's buffer in the loop must be at one of its indices.
    let mut refused: HashSet<BufId> = HashSet::new();
    let at_candidate = |buf: BufId, index: &[Expr]| {
        index.len() == 1 && cands.iter().any(|(b, i)| *b == buf && *i == index[0])
    };
    body.visit(&mut |s| {
        if let Stmt::Store { buf, indices, .. } = s {
            if !at_candidate(*buf, indices) {
                refused.insert(*buf);
            }
        }
    });
    body.visit_exprs(&mut |e| {
        e.visit(&mut |n| {
            if let ExprKind::Load { buf, indices } = n.kind() {
                if !at_candidate(*buf, indices) {
                    refused.insert(*buf);
                }
            }
        })
    });
    // Distinct indices of one buffer must not overlap.
    for (k, (b1, i1)) in cands.iter().enumerate() {
        for (b2, i2) in &cands[k + 1..] {
            if b1 != b2 {
                continue;
            }
            let (ExprKind::Ramp { base: x, lanes, .. }, ExprKind::Ramp { base: y, .. }) =
                (i1.kind(), i2.kind())
            else {
                refused.insert(*b1);
                continue;
            };
            let diff = crate::arith::simplify::simplify(&x.sub(y));
            let apart = diff
                .as_int()
                .is_some_and(|d| d.unsigned_abs() >= u64::from(*lanes))
                || other_rows(func, *b1, &diff);
            if !apart {
                refused.insert(*b1);
            }
        }
    }
    cands.retain(|(b, _)| !refused.contains(b));
    cands
}

/// Whether two contiguous vectors of `buf` whose first offsets differ by `diff` lie in
/// different rows: `diff` is `k * S` for a constant `k != 0` and `S` the stride variable of a
/// dimension of `buf` other than its last (checked by evaluating `diff` at S = 0, 1, 2). Flattened offsets are `sum(index_d * S_d)` with
/// indices that never mention strides, so the two accesses' logical indices differ by exactly
/// `k` in that dimension and agree in every other, for every lane: distinct elements. Distinct
/// in-bounds elements of a buffer the function writes have distinct addresses — an output
/// parameter is checked free of self-overlap at call time, a local is compact — so the vectors
/// never share memory. (The lanes run along the last dimension, whose stride the vector loop's
/// layout test made 1.)
fn other_rows(func: &crate::ir::PrimFunc, buf: BufId, diff: &Expr) -> bool {
    let Some(b) = func.buffers.iter().find(|b| b.id == buf) else {
        return false;
    };
    let writable = matches!(
        b.kind,
        crate::ir::BufKind::Local | crate::ir::BufKind::Param { output: true }
    );
    if !writable {
        return false;
    }
    // `diff` is `k * S + c` when it is c, c + k and c + 2k at S = 0, 1, 2 (it is a polynomial
    // of degree at most 1 in S: indices never mention strides; the third point rules out S^2
    // terms anyway); `c` is what the other dims contribute (here constants: the contiguous
    // dim's offsets, its stride made 1 by the layout test).
    let at = |s: &Var, v: i64| {
        crate::arith::simplify::simplify(&diff.substitute(&|x| (x == s).then(|| Expr::int(v))))
            .as_int()
    };
    b.strides
        .iter()
        .any(|s| match (at(s, 0), at(s, 1), at(s, 2)) {
            (Some(a0), Some(a1), Some(a2)) => {
                let k = a1.checked_sub(a0);
                k.is_some_and(|k| k != 0) && a2.checked_sub(a1) == k
            }
            _ => false,
        })
}

/// Calls `f` on each store directly in `s` (through sequences and `let`s).
fn direct_stores(s: &Stmt, f: &mut dyn FnMut(BufId, &Expr, &Expr)) {
    match s {
        Stmt::Store {
            buf,
            indices,
            value,
        } if indices.len() == 1 => f(*buf, &indices[0], value),
        Stmt::Seq(v) => v.iter().for_each(|s| direct_stores(s, f)),
        Stmt::Let { body, .. } => direct_stores(body, f),
        _ => {}
    }
}
