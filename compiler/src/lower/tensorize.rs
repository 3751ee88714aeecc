//! Pass (right after the loop nest): `tensorize`. For every loop a schedule marked
//! (`Stage::tensorize`), the nest under it — the loop and everything inside — is replaced by
//! one intrinsic call (`Stmt::Call`) when it computes exactly the intrinsic's declared
//! computation (`ir::intrin::model`), and is a `CompileError` naming the difference otherwise.
//!
//! `gemm_update` matches a perfect nest of three loops starting at 0 (any order, any
//! annotation but parallel) around one store `C[..] = C[..] + X[..] * Y[..]` (or `C + Y * X`,
//! `X * Y + C`) of float32 or float64 where:
//! - two of the loop variables (`i`, `j`) index C, each alone in one dim with coefficient 1
//!   (`base + v`, the base free of the three variables); the third (`p`) does not;
//! - one operand (A) is indexed by `p` and `i` only, the other (B) by `p` and `j` only, in the
//!   same form; the extents of `i` and `j` are constants (the register tile).
//!
//! The call's regions are then C (axes i, j), A (axes p, i), B (axes p, j) with bases at
//! `i = j = p = 0`: the same elements the nest touches, so the bounds proof that follows
//! proves the call as it would have proven the nest. Every loop order visits each C element's
//! products in ascending `p`, the order the intrinsic uses. The only change in results is the
//! fused multiply-add (one rounding instead of two; docs/cpu.md).
//!
//! Indices of the form `(K*e + c + v) // K` and `% K`, where `v` is a loop of the nest with
//! extent at most `K - c` (`0 <= c`) and `e` is integer (every other coefficient a multiple of
//! `K`), are first folded to `e + 0` and `c + v`: exact for those ranges, and what a tiled
//! index (`A[i // MR, p, i % MR]` with `i = io*MR + ii`) needs to be recognised.
//!
//! A guard around the store that names none of the three loops (a ragged split of a loop
//! outside the tile) is kept around the call instead.
//!
//! The loop found is the one (of the marked variable) whose nest updates its stage's tensor:
//! a reduction's init nest reuses the data-parallel loop variables and is left alone.

use crate::arith::simplify::{linear, simplify, Linear};
use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, BufId, Expr, ExprKind, Var};
use crate::ir::intrin::{Intrin, Region, RegionAxis};
use crate::ir::stmt::{ForKind, PrimFunc, Stmt};
use crate::ir::verify::intrin::check_call;
use rivet_runtime::DType;

/// A marked loop: its variable, the intrinsic, and the stage's name (for messages).
pub struct Mark {
    pub var: Var,
    pub intrin: Intrin,
    pub stage: String,
}

/// Replaces every marked nest of `func` by its call (module header).
pub fn apply(func: &mut PrimFunc, marks: &[Mark]) -> Result<()> {
    for m in marks {
        let mut found = 0usize;
        let mut failure: Option<String> = None;
        let f = func.clone();
        let body = func.body.rewrite(&mut |e| e.clone(), &mut |s| match &s {
            Stmt::For { var, .. } if *var == m.var => match match_nest(&f, &s, m.intrin) {
                Ok(call) => {
                    found += 1;
                    call
                }
                Err(why) => {
                    // Init nests (no load of what they store) are not candidates.
                    if updates_itself(&s) {
                        failure.get_or_insert(why);
                    }
                    s
                }
            },
            _ => s,
        });
        if let Some(why) = failure {
            return Err(Error::Compile(format!(
                "tensorize of '{}' at loop '{}' onto `{}`: {why}",
                m.stage,
                m.var.name,
                m.intrin.name()
            )));
        }
        if found == 0 {
            return Err(Error::Compile(format!(
                "tensorize of '{}' at loop '{}' onto `{}`: no loop nest of that loop updates the stage (was the loop split or fused after tensorize, or the stage inlined?)",
                m.stage,
                m.var.name,
                m.intrin.name()
            )));
        }
        func.body = body;
    }
    Ok(())
}

/// Whether a store inside `s` reads the buffer it writes (an update, not an init).
fn updates_itself(s: &Stmt) -> bool {
    let mut yes = false;
    s.visit(&mut |st| {
        if let Stmt::Store { buf, value, .. } = st {
            value.visit(&mut |n| {
                if let ExprKind::Load { buf: b, .. } = n.kind() {
                    yes |= b == buf;
                }
            });
        }
    });
    yes
}

/// The loops of a perfect nest, outermost first, and the statement inside them.
fn peel(s: &Stmt) -> (Vec<(&Var, &Expr, &Expr, ForKind)>, &Stmt) {
    let mut loops = Vec::new();
    let mut cur = s;
    while let Stmt::For {
        var,
        min,
        extent,
        kind,
        body,
    } = cur
    {
        loops.push((var, min, extent, *kind));
        cur = body;
    }
    (loops, cur)
}

fn what(s: &Stmt) -> &'static str {
    match s {
        Stmt::If { .. } => "a condition (a guard: a split whose factor does not divide the extent; pad the tensors to a multiple of the tile)",
        Stmt::Seq(_) => "several statements",
        Stmt::Let { .. } => "a let binding",
        Stmt::Allocate { .. } => "a local allocation",
        Stmt::Call { .. } => "another intrinsic call",
        _ => "a statement the intrinsic does not compute",
    }
}

/// For each dim of `idx`: which of `vars` it walks (with coefficient 1), or `None`; and the
/// index with every var at 0 (the region's base).
fn decompose(
    idx: &[Expr],
    vars: &[&Var],
    name: &str,
) -> std::result::Result<(Vec<Option<usize>>, Vec<Expr>), String> {
    let mut walks = Vec::new();
    let mut base = Vec::new();
    for (d, e) in idx.iter().enumerate() {
        let used: Vec<usize> = (0..vars.len()).filter(|&k| e.uses(vars[k])).collect();
        let b = simplify(&e.substitute(&|v| vars.contains(&v).then(|| Expr::int(0))));
        match used.as_slice() {
            [] => walks.push(None),
            [k] => {
                let rest = simplify(&e.sub(&b));
                if rest.as_var() != Some(vars[*k]) {
                    return Err(format!(
                        "{name}'s index {e} (dim {d}) is not `base + {}` (the intrinsic walks each dim with step 1)",
                        vars[*k].name
                    ));
                }
                walks.push(Some(*k));
            }
            _ => {
                return Err(format!(
                    "{name}'s index {e} (dim {d}) mixes several loop variables of the nest"
                ))
            }
        }
        base.push(b);
    }
    Ok((walks, base))
}

/// The dim of `walks` walking var `k`, when exactly one does.
fn dim_of(walks: &[Option<usize>], k: usize) -> Option<u32> {
    let ds: Vec<usize> = (0..walks.len()).filter(|&d| walks[d] == Some(k)).collect();
    match ds.as_slice() {
        [d] => Some(*d as u32),
        _ => None,
    }
}

fn match_nest(func: &PrimFunc, s: &Stmt, intrin: Intrin) -> std::result::Result<Stmt, String> {
    match intrin {
        Intrin::GemmUpdate => match_gemm(func, s),
        Intrin::Callback(_) => Err("a host callback is not a tensorize intrinsic".into()),
    }
}

/// Folds `(K*e + c + s) // K` to `e` and `(K*e + c + s) % K` to `c + s` where `s` is a sum of
/// the nest's loops (`ranges`: variable and constant extent, from 0) with positive
/// coefficients, `0 <= c` and the largest value of `c + s` below K, and every other term's
/// coefficient a multiple of K (module header). Exact under those ranges; anything else is
/// left as it is.
pub(crate) fn fold_tiles(e: &Expr, ranges: &[(&Var, Option<i64>)]) -> Expr {
    e.rewrite(&mut |n| {
        let ExprKind::Binary(op @ (BinOp::FloorDiv | BinOp::FloorMod), a, k) = n.kind() else {
            return None;
        };
        let k = k.as_int().filter(|k| *k > 0)?;
        let l = linear(a)?;
        // `a = k * (rest) + (small) + c` where `small` is loop variables from 0 with constant
        // extents and positive coefficients whose largest value plus `c` stays below `k`
        // (a split of a split: `jo * 32 + jio * 8 + jii` over `jio < 4`, `jii < 8`).
        let mut small = Vec::new();
        let mut rest = Vec::new();
        let mut top = l.constant;
        if top < 0 {
            return None;
        }
        for (t, c) in &l.terms {
            if c % k == 0 {
                rest.push((t.clone(), c / k));
                continue;
            }
            let ext = ranges
                .iter()
                .find(|(x, _)| t.as_var() == Some(*x))
                .and_then(|(_, e)| *e)
                .filter(|e| *e >= 1)?;
            if *c <= 0 {
                return None;
            }
            top = top.checked_add(c.checked_mul(ext - 1)?)?;
            small.push((t.clone(), *c));
        }
        if small.is_empty() || top >= k {
            return None;
        }
        Some(if *op == BinOp::FloorDiv {
            Linear {
                terms: rest,
                constant: 0,
            }
            .to_expr()
        } else {
            Linear {
                terms: small,
                constant: l.constant,
            }
            .to_expr()
        })
    })
}

fn match_gemm(func: &PrimFunc, s: &Stmt) -> std::result::Result<Stmt, String> {
    let (loops, inner) = peel(s);
    // A guard that names none of the nest's loops (a split of a loop outside the tile whose
    // factor does not divide its extent: a ragged block of row panels) holds or fails for the
    // whole nest: it guards the call instead. Same iterations, same order.
    if let Stmt::If {
        cond,
        then,
        otherwise: None,
    } = inner
    {
        if !loops.iter().any(|l| cond.uses(l.0)) {
            let call = match_gemm_body(func, &loops, then)?;
            return Ok(Stmt::If {
                cond: canonical_sides(cond),
                then: Box::new(call),
                otherwise: None,
            });
        }
    }
    match_gemm_body(func, &loops, inner)
}

/// `cond` with each int64 comparison also written over linear forms (`a < b && a' < b`):
/// the bounds proof applies a guard where its expression occurs structurally
/// (`arith::interval`), and the call's regions index one operand with the tile fold's linear
/// form (`4 * io.o + io.i`) and another with the split's (`(io.o * 4 + io.i) * 12`). Both
/// comparisons have the same value, so the condition is the same.
fn canonical_sides(cond: &Expr) -> Expr {
    match cond.kind() {
        ExprKind::Logic(op, a, b) => Expr::new(
            ExprKind::Logic(*op, canonical_sides(a), canonical_sides(b)),
            cond.dtype(),
        ),
        ExprKind::Cmp(op, a, b) if a.dtype() == DType::I64 => {
            let Some(l) = linear(a) else {
                return cond.clone();
            };
            let a2 = simplify(&l.to_expr());
            if a2 == *a {
                return cond.clone();
            }
            let also = Expr::new(ExprKind::Cmp(*op, a2, b.clone()), cond.dtype());
            Expr::new(
                ExprKind::Logic(crate::ir::expr::LogicOp::And, cond.clone(), also),
                cond.dtype(),
            )
        }
        _ => cond.clone(),
    }
}

/// `match_gemm` for the nest `loops` around the statement `inner`.
fn match_gemm_body(
    func: &PrimFunc,
    loops: &[(&Var, &Expr, &Expr, ForKind)],
    inner: &Stmt,
) -> std::result::Result<Stmt, String> {
    let ranges: Vec<(&Var, Option<i64>)> = loops.iter().map(|l| (l.0, l.2.as_int())).collect();
    let folded = inner.rewrite(&mut |e| fold_tiles(e, &ranges), &mut |s| s);
    let Stmt::Store {
        buf: c,
        indices: cidx,
        value,
    } = &folded
    else {
        return Err(format!("the nest holds {}", what(inner)));
    };
    if loops.len() != 3 {
        return Err(format!(
            "the intrinsic computes a nest of 3 loops (i, j over the C tile, p over the products); this one has {}",
            loops.len()
        ));
    }
    for (v, min, _, kind) in loops {
        if min.as_int() != Some(0) {
            return Err(format!("loop '{}' starts at {min}, not 0", v.name));
        }
        if matches!(kind, ForKind::Parallel | ForKind::Thread(_)) {
            return Err(format!("loop '{}' is {kind:?}", v.name));
        }
    }
    let dt = func.buffer(*c).dtype;
    if !matches!(dt, DType::F32 | DType::F64) {
        return Err(format!(
            "it stores {dt}; the intrinsic computes float32 or float64"
        ));
    }
    // C + X * Y, in either order of the sum and of the product.
    let parts = |e: &Expr| match e.kind() {
        ExprKind::Binary(BinOp::Add, a, b) => Some((a.clone(), b.clone())),
        _ => None,
    };
    let load = |e: &Expr| match e.kind() {
        ExprKind::Load { buf, indices } => Some((*buf, indices.clone())),
        _ => None,
    };
    let (acc, prod) = match parts(value) {
        Some((a, b)) if load(&a).is_some_and(|(x, i)| x == *c && i == *cidx) => (a, b),
        Some((a, b)) if load(&b).is_some_and(|(x, i)| x == *c && i == *cidx) => (b, a),
        _ => {
            return Err(format!(
                "its store {} = {value} is not `{0} + a * b` (an accumulation into the element it stores)",
                func.buffer(*c).name
            ))
        }
    };
    let _ = acc;
    let (x, y) = match prod.kind() {
        ExprKind::Binary(BinOp::Mul, a, b) => match (load(a), load(b)) {
            (Some(x), Some(y)) => (x, y),
            _ => {
                return Err(format!(
                    "the product {prod} is not of two tensor elements (a cast, a constant or another operation is not the intrinsic's)"
                ))
            }
        },
        _ => {
            return Err(format!(
                "the accumulated value {prod} is not a product `a * b`"
            ))
        }
    };
    for (b, _) in [&x, &y] {
        if func.buffer(*b).dtype != dt {
            return Err(format!(
                "operand '{}' is {}, C is {dt}",
                func.buffer(*b).name,
                func.buffer(*b).dtype
            ));
        }
        if *b == *c {
            return Err("an operand is the accumulated tensor itself".into());
        }
    }
    let vars: Vec<&Var> = loops.iter().map(|l| l.0).collect();
    let cname = func.buffer(*c).name.clone();
    let (cw, cbase) = decompose(cidx, &vars, &cname)?;
    let in_c: Vec<usize> = (0..3).filter(|&k| dim_of(&cw, k).is_some()).collect();
    let [c0, c1] = in_c.as_slice() else {
        return Err(format!(
            "C ('{cname}') is walked by {} of the nest's loops, not 2 (i and j of the tile)",
            in_c.len()
        ));
    };
    let p = (0..3).find(|k| !in_c.contains(k)).expect("3 loops");
    let (xw, xbase) = decompose(&x.1, &vars, &func.buffer(x.0).name)?;
    let (yw, ybase) = decompose(&y.1, &vars, &func.buffer(y.0).name)?;
    // A is the operand walked by p and C's first-found var i; B by p and j.
    let walked = |w: &[Option<usize>], k: usize| dim_of(w, k).is_some();
    let only = |w: &[Option<usize>], keep: [usize; 2]| w.iter().flatten().all(|k| keep.contains(k));
    let pick = |i: usize, j: usize| {
        if walked(&xw, p)
            && walked(&xw, i)
            && only(&xw, [p, i])
            && walked(&yw, p)
            && walked(&yw, j)
            && only(&yw, [p, j])
        {
            Some(((&x, &xw, &xbase), (&y, &yw, &ybase), i, j))
        } else if walked(&yw, p)
            && walked(&yw, i)
            && only(&yw, [p, i])
            && walked(&xw, p)
            && walked(&xw, j)
            && only(&xw, [p, j])
        {
            Some(((&y, &yw, &ybase), (&x, &xw, &xbase), i, j))
        } else {
            None
        }
    };
    let Some((a, b, i, j)) = pick(*c0, *c1).or_else(|| pick(*c1, *c0)) else {
        return Err(format!(
            "the operands {} and {} are not A[p, i] and B[p, j] for the loops of C's tile ('{}', '{}') and the product loop '{}' (each walked in one dim with step 1, and by no other loop of the nest)",
            Expr::load(x.0, x.1.clone(), dt),
            Expr::load(y.0, y.1.clone(), dt),
            vars[*c0].name,
            vars[*c1].name,
            vars[p].name
        ));
    };
    // C's region axes in the order (i, j) of the intrinsic: i is the var A walks.
    let ext = |k: usize| loops[k].2.clone();
    for k in [i, j] {
        if ext(k).as_int().is_none() {
            return Err(format!(
                "loop '{}' has extent {}: the tile's extents must be constants",
                vars[k].name,
                ext(k)
            ));
        }
    }
    let ax = |w: &[Option<usize>], k: usize| RegionAxis {
        dim: dim_of(w, k).expect("checked above"),
        extent: ext(k),
    };
    let regions = vec![
        Region {
            buf: *c,
            base: cbase,
            axes: vec![ax(&cw, i), ax(&cw, j)],
            write: true,
        },
        Region {
            buf: (a.0).0,
            base: a.2.clone(),
            axes: vec![ax(a.1, p), ax(a.1, i)],
            write: false,
        },
        Region {
            buf: (b.0).0,
            base: b.2.clone(),
            axes: vec![ax(b.1, p), ax(b.1, j)],
            write: false,
        },
    ];
    check_call(func, Intrin::GemmUpdate, &regions, &[], false)?;
    let _: BufId = regions[0].buf;
    Ok(Stmt::Call {
        intrin: Intrin::GemmUpdate,
        regions,
        scalars: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_divisions_fold_only_inside_their_ranges() {
        let (io, ii) = (Var::new("io"), Var::new("ii"));
        let i = Expr::var(&io).mul(&Expr::int(12)).add(&Expr::var(&ii));
        let k12 = Expr::int(12);
        let fold = |e: &Expr, ext: i64| simplify(&fold_tiles(e, &[(&ii, Some(ext))]));
        // ii in [0, 12): exact.
        assert_eq!(fold(&i.floordiv(&k12), 12), Expr::var(&io));
        assert_eq!(fold(&i.floormod(&k12), 12), Expr::var(&ii));
        // ii in [0, 13) can carry into the quotient: left alone.
        let e = i.floordiv(&k12);
        assert_eq!(fold(&e, 13), simplify(&e));
        // An offset that, with the range, reaches K: left alone; one that does not: folded.
        let shifted = i.add(&Expr::int(1));
        assert_eq!(
            fold(&shifted.floordiv(&k12), 12),
            simplify(&shifted.floordiv(&k12))
        );
        assert_eq!(
            fold(&shifted.floormod(&k12), 11),
            simplify(&Expr::var(&ii).add(&Expr::int(1)))
        );
        // A coefficient that is not a multiple of K: left alone.
        let odd = Expr::var(&io).mul(&Expr::int(5)).add(&Expr::var(&ii));
        assert_eq!(fold(&odd.floordiv(&k12), 12), simplify(&odd.floordiv(&k12)));
    }

    /// A tile split again (`jo * 32 + jio * 8 + jii`): folded when the inner loops' largest
    /// value stays below K, left alone when it can reach K, or with a loop of unknown extent.
    #[test]
    fn tiles_split_again_fold_when_their_sum_stays_below_k() {
        let (jo, jio, jii) = (Var::new("jo"), Var::new("jio"), Var::new("jii"));
        let j = Expr::var(&jo)
            .mul(&Expr::int(32))
            .add(&Expr::var(&jio).mul(&Expr::int(8)))
            .add(&Expr::var(&jii));
        let k = Expr::int(32);
        let fold = |e: &Expr, a: Option<i64>, b: Option<i64>| {
            simplify(&fold_tiles(e, &[(&jio, a), (&jii, b)]))
        };
        assert_eq!(fold(&j.floordiv(&k), Some(4), Some(8)), Expr::var(&jo));
        assert_eq!(
            fold(&j.floormod(&k), Some(4), Some(8)),
            simplify(&Expr::int(8).mul(&Expr::var(&jio)).add(&Expr::var(&jii)))
        );
        // 8 * 4 + 8 - 1 = 39 >= 32: the sum can carry.
        assert_eq!(
            fold(&j.floordiv(&k), Some(5), Some(8)),
            simplify(&j.floordiv(&k))
        );
        assert_eq!(
            fold(&j.floormod(&k), Some(4), None),
            simplify(&j.floormod(&k))
        );
        // A negative coefficient on a small term: left alone.
        let neg = Expr::var(&jo).mul(&Expr::int(32)).sub(&Expr::var(&jii));
        assert_eq!(
            fold(&neg.floordiv(&k), Some(4), Some(8)),
            simplify(&neg.floordiv(&k))
        );
        // Hostile extents and coefficients: the bound is checked arithmetic, never a wrap that
        // would let a huge sum pass for a small one (3 * (2^62 + 1) overflows: left alone).
        let huge = Expr::var(&jo)
            .mul(&Expr::int(32))
            .add(&Expr::var(&jio).mul(&Expr::int((1 << 62) + 1)))
            .add(&Expr::var(&jii));
        assert_eq!(
            fold(&huge.floormod(&k), Some(4), Some(8)),
            simplify(&huge.floormod(&k))
        );
        let k62 = Expr::int(1 << 62);
        let wide = Expr::var(&jo)
            .mul(&Expr::int(1 << 62))
            .add(&Expr::var(&jii).mul(&Expr::int(3)));
        assert_eq!(
            fold(&wide.floordiv(&k62), Some(4), Some(i64::MAX)),
            simplify(&wide.floordiv(&k62))
        );
    }
}
