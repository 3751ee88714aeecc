//! The packed, tensorized GEMM as a schedule rewrite: what the default CPU schedule
//! (`cpu_default`) does to a matmul-like stage, for any shapes (symbolic or not), any operand
//! expressions (transposed, strided, batched, an elementwise prologue) and float32 / float64.
//!
//! A stage `C[d...] = sum_r fa * fb` matches when `fa` uses the reduction `r` and a data axis
//! `i` that `fb` does not use, and `fb` uses `r` and a data axis `j` that `fa` does not (the
//! last such axes; the other data axes are "batch" axes of whichever factor uses them). The
//! rewrite adds three stages and redefines C (its id, name and shape stay: it is still the
//! tensor the user asked for):
//!
//! ```text
//! Ap[ba.., io, p, ii] = fa(i = io*MR + ii, r = r.min + p)   (0 where i >= M)   MR-tall panels
//! Bp[bb.., jo, p, ji] = fb(j = jo*NR + ji, r = r.min + p)   (0 where j >= N)   NR-wide panels
//! Cp[d.. (i, j padded to whole tiles)] = sum_p Ap[.., i // MR, p, i % MR] * Bp[.., j // NR, p, j % NR]
//! C[d..] = Cp[d..]
//! ```
//!
//! When M and N are constant multiples of the tile, `Cp` is C itself; otherwise, when C is
//! not an output of the schedule, C is inlined (its readers read `Cp` in place). Each micro-kernel call
//! runs all of K (no K padding, no guard; measured faster than KC-deep slices, see
//! `rewrite`). `Cp`'s loops are `[batch.., jo] (fused, parallel), io, ii, ji, p`,
//! tensorized at `ii` onto `gemm_update`. The padded extents are `ceil(M / MR) * MR`, which the
//! loop nest splits by MR without a guard (`nest::split_divides`), so the tile loops match the
//! intrinsic for symbolic sizes too.
//!
//! Invariant: the rewritten program computes C exactly as the definition does except for the
//! fused rounding of each multiply-add (docs/cpu.md); padding adds exact zeros.

use crate::arith::simplify::simplify;
use crate::error::Result;
use crate::ir::expr::{BinOp, Expr, ExprKind, IterVar, ReduceOp, Var};
use crate::ir::intrin::Intrin;
use crate::schedule::definitions::redefine;
use crate::schedule::{Schedule, Stage};
use crate::te::tensor::{compute_from, top_reduce, Tensor};
use rivet_runtime::DType;

/// The register tile (rows, columns) of the micro-kernel the GEMM is tensorized onto, and the
/// depth of the product slices of the hand-scheduled GEMM (`tensorized`; the cache block of
/// B: 32 x 256 floats, 32 KiB). The rewrite here runs all of K per call (module header).
pub const MR: i64 = 12;
pub const NR: i64 = 32;
pub const KC: i64 = 256;

/// A matmul-like stage, as the rewrite sees it.
#[derive(Clone, Debug)]
pub struct Matmul {
    /// Positions, among the stage's data axes, of `i` (walked by `fa`) and `j` (by `fb`).
    pub i: usize,
    pub j: usize,
    pub fa: Expr,
    pub fb: Expr,
    pub r: IterVar,
}

/// `t` as a matmul-like stage: `sum` over one reduction axis of a product of two factors of
/// `t`'s dtype (float32 or float64), each using the reduction and a data axis the other does
/// not. `None` for anything else.
pub fn match_matmul(t: &Tensor) -> Option<Matmul> {
    let (ReduceOp::Sum, body, [r]) = top_reduce(t.body()?)? else {
        return None;
    };
    let dt = t.dtype();
    if !matches!(dt, DType::F32 | DType::F64) || body.dtype() != dt {
        return None;
    }
    let ExprKind::Binary(BinOp::Mul, a, b) = body.kind() else {
        return None;
    };
    if a.dtype() != dt || b.dtype() != dt || !a.uses(&r.var) || !b.uses(&r.var) {
        return None;
    }
    let axes = t.axis();
    let only = |x: &Expr, y: &Expr| {
        (0..axes.len())
            .rev()
            .find(|&d| x.uses(&axes[d].var) && !y.uses(&axes[d].var))
    };
    let (i, j) = (only(a, b)?, only(b, a)?);
    Some(Matmul {
        i,
        j,
        fa: a.clone(),
        fb: b.clone(),
        r: r.clone(),
    })
}

/// `ceil(e / k)` for `k > 0`, written `(e - 1) // k + 1` as `schedule::loops::split_extents` writes a
/// split's outer extent, so that `nest::split_divides` recognises `ceil_div(e, k) * k` split by
/// `k` (0 for `e = 0`; negative for a negative `e`, where every loop over it is empty).
fn ceil_div(e: &Expr, k: i64) -> Expr {
    simplify(
        &e.sub(&Expr::int(1))
            .floordiv(&Expr::int(k))
            .add(&Expr::int(1)),
    )
}

fn fresh(name: &str, extent: Expr, reduce: bool) -> IterVar {
    IterVar {
        var: Var::new(name),
        min: Expr::int(0),
        extent,
        reduce,
    }
}

/// Rewrites stage `t` of `s` (unscheduled, at root) into the packed, tensorized GEMM of the
/// module header, and schedules the new stages.
pub fn rewrite(s: &mut Schedule, t: &Tensor, m: &Matmul) -> Result<()> {
    let int = Expr::int;
    let cur = s.current(t);
    let axes: Vec<IterVar> = cur.axis().to_vec();
    let dt = cur.dtype();
    let zero = Expr::constant(0.0, dt);
    let (big_m, big_n, big_k) = (
        simplify(&axes[m.i].extent),
        simplify(&axes[m.j].extent),
        simplify(&m.r.extent),
    );
    let (mo, no) = (ceil_div(&big_m, MR), ceil_div(&big_n, NR));
    // One slice of products spans all of K (no padding): measured side by side, cutting a
    // constant K into KC-deep slices (B's slice in L1, C's tile loaded and stored once per
    // slice) was no faster at 1024 and 15% slower at 2048 than one pass with B from L2.
    let kp = big_k.clone();
    let multiple = |e: &Expr, tile: i64| e.as_int().is_some_and(|v| v % tile == 0);
    let batch = |f: &Expr, own: usize| -> Vec<usize> {
        (0..axes.len())
            .filter(|&d| d != m.i && d != m.j && d != own && f.uses(&axes[d].var))
            .collect()
    };
    // One packed operand: `f` with its batch axes, its tile axis `x` split by `tile`, and the
    // reduction, zero past the tensor (`x >= X`).
    let pack =
        |f: &Expr, x: usize, tile: i64, outer: &Expr, name: &str| -> Result<(Tensor, Vec<usize>)> {
            let ba = batch(f, x);
            let mut pax: Vec<IterVar> = ba
                .iter()
                .map(|&d| {
                    fresh(
                        &format!("{}.{}", name, axes[d].var.name),
                        axes[d].extent.clone(),
                        false,
                    )
                })
                .collect();
            let (xo, p, xi) = (
                fresh("xo", outer.clone(), false),
                fresh("p", kp.clone(), false),
                fresh("xi", int(tile), false),
            );
            let xval = Expr::var(&xo.var).mul(&int(tile)).add(&Expr::var(&xi.var));
            let pval = Expr::var(&p.var);
            let body = f.substitute(&|v| {
                if let Some(k) = ba.iter().position(|&d| axes[d].var == *v) {
                    return Some(Expr::var(&pax[k].var));
                }
                if *v == axes[x].var {
                    return Some(xval.clone());
                }
                if *v == m.r.var {
                    return Some(m.r.min.add(&pval));
                }
                None
            });
            let mut inside: Vec<Expr> = Vec::new();
            if !multiple(&axes[x].extent, tile) {
                inside.push(xval.lt(&axes[x].extent));
            }
            let body = match inside
                .into_iter()
                .reduce(|a, b| Expr::logic(crate::ir::LogicOp::And, a, b).expect("bool operands"))
            {
                Some(c) => Expr::select(c, body, zero.clone())?,
                None => body,
            };
            pax.extend([xo, p, xi]);
            let shape: Vec<Expr> = pax.iter().map(|a| a.extent.clone()).collect();
            Ok((
                compute_from(&shape, pax, body, &format!("{}.{name}", cur.name()))?,
                ba,
            ))
        };
    let (ap, ba) = pack(&m.fa, m.i, MR, &mo, "A_packed")?;
    let (bp, bb) = pack(&m.fb, m.j, NR, &no, "B_packed")?;
    let aligned = multiple(&big_m, MR) && multiple(&big_n, NR);
    // The reduction over the packed panels, on axes `cax` (C's own when aligned).
    let cax: Vec<IterVar> = if aligned {
        axes.clone()
    } else {
        axes.iter()
            .enumerate()
            .map(|(d, a)| {
                let e = if d == m.i {
                    mo.mul(&int(MR))
                } else if d == m.j {
                    no.mul(&int(NR))
                } else {
                    a.extent.clone()
                };
                fresh(&a.var.name, simplify(&e), false)
            })
            .collect()
    };
    let p = crate::te::reduce_axis(int(0), kp.clone(), "p")?;
    let cv = |d: usize| Expr::var(&cax[d].var);
    let read = |t: &Tensor, bat: &[usize], x: usize, tile: i64| {
        let mut idx: Vec<Expr> = bat.iter().map(|&d| cv(d)).collect();
        idx.extend([
            cv(x).floordiv(&int(tile)),
            Expr::var(&p.var),
            cv(x).floormod(&int(tile)),
        ]);
        t.idx(&idx)
    };
    let product = Expr::binary(BinOp::Mul, read(&ap, &ba, m.i, MR), read(&bp, &bb, m.j, NR))?;
    let sum = crate::te::reduce(
        crate::ir::expr::ReduceOp::Sum,
        product,
        std::slice::from_ref(&p),
    )?;
    let ti = s.stage_index(t)?;
    let (cp, new_t) = if aligned {
        let c = redefine(&cur, sum);
        (c.clone(), c)
    } else {
        let shape: Vec<Expr> = cax.iter().map(|a| a.extent.clone()).collect();
        let cp = compute_from(&shape, cax.clone(), sum, &format!("{}.padded", cur.name()))?;
        let idx: Vec<Expr> = axes.iter().map(|a| Expr::var(&a.var)).collect();
        (cp.clone(), redefine(&cur, cp.idx(&idx)))
    };
    s.restart_stage(ti, &new_t);
    s.set_definition(ti, new_t.clone());
    let mut added = vec![Stage::new(&ap), Stage::new(&bp)];
    if !aligned {
        added.push(Stage::new(&cp));
    }
    s.stages.splice(ti..ti, added);

    // Cp: [batch.., jo] fused and parallel, io, then the tile (ii, ji, p) as one call.
    let st = s.stage(&cp)?;
    let (io, ii) = st.split(&cax[m.i].var, Some(int(MR)), None)?;
    let (jo, ji) = st.split(&cax[m.j].var, Some(int(NR)), None)?;
    let pi = p.var.clone();
    let others: Vec<Var> = (0..cax.len())
        .filter(|&d| d != m.i && d != m.j)
        .map(|d| cax[d].var.clone())
        .collect();
    let mut order = others.clone();
    order.push(jo.clone());
    order.extend([io, ii.clone(), ji, pi]);
    st.reorder(&order)?;
    let mut outer = jo;
    for b in others.iter().rev() {
        outer = st.fuse(b, &outer)?;
    }
    st.parallel(&outer)?;
    st.tensorize(&ii, Intrin::GemmUpdate)?;
    // The packs: outermost loop parallel. B is read along j when its source walks j in its
    // last index (a row-major B[k, j]): then its loops run p, then the panel.
    s.stage(&ap)?.parallel(&ap.axis()[0].var)?;
    let bax: Vec<Var> = bp.axis().iter().map(|a| a.var.clone()).collect();
    let n = bax.len();
    let along_j = last_index_uses(&m.fb, &axes[m.j].var);
    let st = s.stage(&bp)?;
    if along_j {
        let mut order = bax[..n - 3].to_vec();
        order.extend([bax[n - 2].clone(), bax[n - 3].clone(), bax[n - 1].clone()]);
        st.reorder(&order)?;
        st.parallel(&order[0])?;
        // A panel row is a contiguous copy of a row of B: packed when B's rows are compact
        // (a pad-guarded panel, N not a multiple of NR, stays scalar: the guard's load).
        st.vectorize(&bax[n - 1])?;
    } else {
        st.parallel(&bax[0])?;
    }
    if !aligned {
        if s.outputs.contains(&new_t) {
            let st = s.stage(&new_t)?;
            st.parallel(&axes[0].var)?;
            if axes.len() > 1 {
                st.vectorize(&axes[axes.len() - 1].var)?;
            }
        } else {
            // An intermediate (attention's scores, a GEMM before its epilogue): its readers
            // read the padded result in place, instead of a copy of it made, zeroed and read
            // back per call (the same elements, so the same bits).
            s.compute_inline(&new_t)?;
        }
    }
    Ok(())
}

/// Whether some tensor read in `f` indexes its last dim with `v` (the read walks `v`
/// contiguously in a row-major source).
fn last_index_uses(f: &Expr, v: &Var) -> bool {
    let mut yes = false;
    f.visit_unique(&mut |e| {
        if let ExprKind::Read { indices, .. } = e.kind() {
            yes |= indices.last().is_some_and(|x| x.uses(v));
        }
    });
    yes
}
