//! Pass (after the bounds proof): tile divisions folded. A split writes an index as
//! `outer * K + inner`; a stage that reads a tiled tensor (a packed panel `Ap[i // 12, p, i %
//! 12]`) then divides it again. Where the loop ranges make it exact, `(K*e + c + s) // K`
//! becomes `e` and `% K` becomes `c + s` (`tensorize::fold_tiles`: `s` a sum of loops from 0
//! of constant extents with positive coefficients whose largest value plus `c` is below K —
//! a tile split again, `jo * 32 + jio * 8 + jii` — every other coefficient a multiple of K), so the
//! access is affine in the loops: `vectorize` sees a contiguous ramp instead of a per-lane
//! division. It runs after the bounds proof, which matches split guards structurally against
//! the indices they guard, and before simplification (which, like this pass, only rewrites
//! expressions into exactly equal ones).
//!
//! Invariant: every rewrite is exact for every value the loops take, so the program computes
//! the same values; loop variables are unique to their loop (a variable bound by loops of
//! different ranges is left out).

use super::tensorize::fold_tiles;
use crate::ir::expr::{Expr, Var};
use crate::ir::stmt::{PrimFunc, Stmt};
use std::collections::HashMap;

/// Folds the tile divisions of `f` (module header).
pub fn fold(f: &mut PrimFunc) {
    let mut ranges: HashMap<Var, Option<i64>> = HashMap::new();
    f.body.visit(&mut |s| {
        if let Stmt::For {
            var, min, extent, ..
        } = s
        {
            let r = (min.as_int() == Some(0)).then(|| extent.as_int()).flatten();
            ranges
                .entry(var.clone())
                .and_modify(|old| {
                    if *old != r {
                        *old = None;
                    }
                })
                .or_insert(r);
        }
    });
    let known: Vec<(&Var, Option<i64>)> = ranges
        .iter()
        .filter(|(_, r)| r.is_some())
        .map(|(v, r)| (v, *r))
        .collect();
    if known.is_empty() {
        return;
    }
    f.body = f
        .body
        .rewrite(&mut |e: &Expr| fold_tiles(e, &known), &mut |s| s);
}
