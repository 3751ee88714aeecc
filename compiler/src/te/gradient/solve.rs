//! Inverting a read's index map: from "stage C at iteration point (i, r) reads X[g(i, r)] with
//! partial derivative a(i, r)" to "dX[j] = sum over the points with g(i, r) == j of a(i, r)".
//!
//! Method (exact for every index map; fast for the common ones):
//! - each index of the read is put in linear form (`arith::simplify::linear`); where it is
//!   `±v + rest` with `v` an iteration variable not otherwise in that index, `v` is solved:
//!   `v = ±(j - rest)`, substituted everywhere, and guarded by `v`'s range
//!   (`min <= v < min + extent`; left out when it is provably `j`'s own range). Data-parallel
//!   variables are preferred to reduction ones (a convolution's `y + ry` solves `y` and sums
//!   over the small `ry`), then variables that occur in fewer indices;
//! - an index left unsolved (a constant, `i * 2`, `i // 2`, a variable already solved) becomes
//!   an equality guard `g(...) == j`;
//! - every iteration variable left unsolved is summed over with a fresh reduction axis of its
//!   range (one of extent 1 is replaced by its one value instead); an equality guard on a
//!   target dim of extent 1 is decided with that dim's only index, 0 (`S[i, 0]`, a keepdims
//!   row statistic, needs none). With nothing solved this is the masked reduction over the whole iteration space
//!   (correct, slow: the cost is the stage's iteration space per element of X).
//!
//! The guards wrap the whole term in a `Select`, so reads of the adjoint and of forward
//! tensors happen only at iteration points of the forward stage (in bounds by its own proof).

use super::algebra::{and_all, cmp, constant, select, substitute};
use crate::arith::simplify::{linear, simplify};
use crate::error::Result;
use crate::ir::expr::{CmpOp, Expr, IterVar, Var};
use std::collections::HashMap;

/// The gradient term for one read, over target indices `j`: `sum(body, raxes)` (or `body`
/// alone when `raxes` is empty).
pub struct Solved {
    pub body: Expr,
    pub raxes: Vec<IterVar>,
}

/// True when two int64 dims are provably equal.
pub fn same_dim(a: &Expr, b: &Expr) -> bool {
    a == b || simplify(&a.sub(b)).as_int() == Some(0)
}

/// Inverts the read `indices` of a tensor of `shape` over the iteration `domain` (the stage's
/// axes and reduction axes), for the term `a`, at target indices `j` (plain variables).
pub fn solve(
    shape: &[Expr],
    indices: &[Expr],
    a: &Expr,
    domain: &[IterVar],
    j: &[Var],
) -> Result<Solved> {
    let je: Vec<Expr> = j.iter().map(Expr::var).collect();
    let mut idx: Vec<Expr> = indices.to_vec();
    let mut solved: Vec<(usize, Var, Expr, usize)> = Vec::new(); // (domain pos, var, value, dim)
    let mut dim_done = vec![false; idx.len()];
    let is_free = |v: &Var, solved: &[(usize, Var, Expr, usize)]| {
        domain
            .iter()
            .position(|d| d.var == *v)
            .filter(|_| !solved.iter().any(|s| s.1 == *v))
    };
    loop {
        let mut progress = false;
        for d in 0..idx.len() {
            if dim_done[d] {
                continue;
            }
            let Some(lin) = linear(&idx[d]) else { continue };
            // Candidates: a free iteration variable with coefficient +-1 that no other atom
            // of this index mentions.
            let mut best: Option<(usize, usize, i64, (bool, usize))> = None; // (term, pos, coef, rank)
            for (t, (atom, coef)) in lin.terms.iter().enumerate() {
                let Some(v) = atom.as_var() else { continue };
                let Some(pos) = is_free(v, &solved) else {
                    continue;
                };
                if coef.abs() != 1 {
                    continue;
                }
                let elsewhere = lin
                    .terms
                    .iter()
                    .enumerate()
                    .any(|(u, (other, _))| u != t && other.uses(v));
                if elsewhere {
                    continue;
                }
                let occurrences = idx.iter().filter(|e| e.uses(v)).count();
                let rank = (domain[pos].reduce, occurrences);
                if best.as_ref().is_none_or(|b| rank < b.3) {
                    best = Some((t, pos, *coef, rank));
                }
            }
            let Some((t, pos, coef, _)) = best else {
                continue;
            };
            let v = domain[pos].var.clone();
            let mut rest = lin.clone();
            rest.terms.remove(t);
            let rest = rest.to_expr();
            let value = simplify(&if coef == 1 {
                je[d].sub(&rest)
            } else {
                rest.sub(&je[d])
            });
            let sub_v = |e: &Expr| substitute(e, &|x| (*x == v).then(|| value.clone()));
            for e in idx.iter_mut() {
                *e = simplify(&sub_v(e));
            }
            for s in solved.iter_mut() {
                s.2 = simplify(&sub_v(&s.2));
            }
            solved.push((pos, v, value, d));
            dim_done[d] = true;
            progress = true;
        }
        if !progress {
            break;
        }
    }
    // Fresh reduction axes for what is left; a variable of extent 1 takes its one value
    // instead (a sum of one term is the term: no loop, no per-element partial sum).
    let mut fresh: HashMap<Var, Expr> = HashMap::new();
    let mut raxes = Vec::new();
    for (pos, iv) in domain.iter().enumerate() {
        if solved.iter().any(|s| s.0 == pos) {
            continue;
        }
        if simplify(&iv.extent).as_int() == Some(1) {
            fresh.insert(iv.var.clone(), iv.min.clone());
            continue;
        }
        let nv = Var::new(&iv.var.name);
        fresh.insert(iv.var.clone(), Expr::var(&nv));
        raxes.push(IterVar {
            var: nv,
            min: iv.min.clone(),
            extent: iv.extent.clone(),
            reduce: true,
        });
    }
    let values: HashMap<Var, Expr> = solved.iter().map(|s| (s.1.clone(), s.2.clone())).collect();
    let rename = |e: &Expr| {
        substitute(e, &|x| {
            values
                .get(x)
                .or_else(|| fresh.get(x))
                .map(|v| substitute(v, &|y| fresh.get(y).cloned()))
        })
    };
    let mut guards = Vec::new();
    for (pos, _, value, d) in &solved {
        let iv = &domain[*pos];
        let value = rename(value);
        let own_range = value.as_var() == Some(&j[*d])
            && iv.min.as_int() == Some(0)
            && same_dim(&iv.extent, &shape[*d]);
        if !own_range {
            let hi = simplify(&iv.min.add(&iv.extent));
            guards.push(cmp(CmpOp::Ge, &value, &iv.min)?);
            guards.push(cmp(CmpOp::Lt, &value, &hi)?);
        }
    }
    for d in 0..idx.len() {
        if !dim_done[d] {
            let mut guard = cmp(CmpOp::Eq, &rename(&idx[d]), &je[d])?;
            if simplify(&shape[d]).as_int() == Some(1) {
                // `j[d]` of a dim of extent 1 is 0: a keepdims read `S[i, 0]` needs no guard.
                guard = simplify(&substitute(&guard, &|x| (*x == j[d]).then(|| Expr::int(0))));
                if guard.as_int() == Some(1) {
                    continue;
                }
            }
            guards.push(guard);
        }
    }
    let term = rename(a);
    let body = match and_all(guards)? {
        None => term,
        Some(g) => select(&g, &term, &constant(0.0, term.dtype()))?,
    };
    Ok(Solved { body, raxes })
}
