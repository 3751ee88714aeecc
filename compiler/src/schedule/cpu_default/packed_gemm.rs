//! The packed, tensorized GEMM as a schedule rewrite: what the default CPU schedule
//! (`cpu_default`) does to a matmul-like stage, for any shapes (symbolic or not), any operand
//! expressions (transposed, strided, batched, an elementwise prologue) and float32 / float64.
//!
//! A stage `C[d...] = sum_{r..} fa * fb` matches (`contraction::match_matmul`) when `fa` uses
//! a reduction axis and data axes `i..` that `fb` does not use, and `fb` uses a reduction axis
//! and data axes `j..` that `fa` does not (the other data axes are "batch" axes of whichever
//! factor uses them). The rows `i` are the innermost of `fa`'s own axes, fused with outer
//! ones while a tile would be mostly padding (likewise the columns `j`), and the depth `p`
//! runs over all the reduction axes: `r = r.min + unflatten(p)` (`contraction::unflatten`,
//! constant inner extents; a convolution's `(ci, kh, kw)`). The rewrite adds three stages and
//! redefines C (its id, name and shape stay: it is still the tensor the user asked for):
//!
//! ```text
//! Ap[ba.., io, p, ii] = fa(i = io*MR + ii, r.. = unflatten(p))   (0 where i >= M)   MR-tall panels
//! Bp[bb.., jo, p, ji] = fb(j = jo*NR + ji, r.. = unflatten(p))   (0 where j >= N)   NR-wide panels
//! Cp[d.. (i, j padded to whole tiles)] = sum_p Ap[.., i // MR, p, i % MR] * Bp[.., j // NR, p, j % NR]
//! C[d..] = Cp[d..]
//! ```
//!
//! With one row and one column axis, `Cp` has C's layout (`C.padded`; C itself when M and N
//! are constant multiples of the tile); with fused ones it is `C.packed_gemm[d.., i, j]` over
//! C's other axes and the fused rows and columns, read back through `flatten`. The packs'
//! depth loop is split into one loop per reduction axis (`schedule_pack`), so gathering a
//! window divides nothing: an implicit GEMM, no im2col buffer beyond the panels. When C is
//! padded and not an output of the schedule, C is inlined (its readers read `Cp` in place). Each
//! micro-kernel call runs all of K (no K padding, no guard), unless a deep constant K makes
//! the product blocked for the caches (`Blocks`: K blocks that divide K, blocks of row panels
//! and chunks of column panels, their ragged ends guarded outside the tile). `Cp`'s loops are
//! `[batch.., jo] (fused, parallel), io, ii, ji, p`, tensorized at `ii` onto `gemm_update`
//! (blocked: `[batch.., jo chunk] (parallel), p block, io block, jo, io, ii, ji, p`). The padded extents are `ceil(M / MR) * MR`, which the
//! loop nest splits by MR without a guard (`nest::split_divides`), so the tile loops match the
//! intrinsic for symbolic sizes too.
//!
//! Invariant: the rewritten program computes C exactly as the definition does except for the
//! fused rounding of each multiply-add (docs/cpu.md); padding adds exact zeros.

use super::contraction::{flatten, product, unflatten, used};
use crate::arith::simplify::simplify;
use crate::error::Result;
use crate::ir::expr::{BinOp, Expr, ExprKind, IterVar, Var};
use crate::ir::intrin::Intrin;
use crate::schedule::definitions::redefine;
use crate::schedule::{Schedule, Stage};
use crate::te::split_reduce::substitute_memo;
use crate::te::tensor::{compute_from, Tensor};
use std::collections::HashMap;

/// The register tile (rows, columns) of the micro-kernel the GEMM is tensorized onto, and the
/// depth of the product slices of the hand-scheduled GEMM (`tensorized`; the cache block of
/// B: 32 x 256 floats, 32 KiB). The rewrite here runs all of K per call (module header).
pub const MR: i64 = 12;
pub const NR: i64 = 32;
pub const KC: i64 = 256;

// `lower::partition` versions a ragged panel of at most this width (its `MAX_PANEL`, stated
// there because the lowering sits below the schedules): the B pack's panel must stay one.
const _: () = assert!(NR == crate::lower::partition::MAX_PANEL);

pub use super::contraction::{match_matmul, Matmul};

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
    let ext = |g: &[usize]| -> Vec<Expr> { g.iter().map(|&d| simplify(&axes[d].extent)).collect() };
    let (row_ext, col_ext) = (ext(&m.rows), ext(&m.cols));
    let red_ext: Vec<Expr> = m.red.iter().map(|r| simplify(&r.extent)).collect();
    let (big_m, big_n, big_k) = (product(&row_ext), product(&col_ext), product(&red_ext));
    let (mo, no) = (ceil_div(&big_m, MR), ceil_div(&big_n, NR));
    // The depth is all of K (no padding); `Blocks` may cut a deep constant K into blocks
    // that divide it (below its threshold, one pass with B from L2 measured as fast).
    let kp = big_k.clone();
    let multiple = |e: &Expr, tile: i64| e.as_int().is_some_and(|v| v % tile == 0);
    // One row and one column axis: the product keeps C's layout (C itself when aligned).
    let simple = m.rows.len() == 1 && m.cols.len() == 1;
    let (ua, ub) = (used(&m.fa), used(&m.fb));
    // A factor's batch axes: the data axes it uses outside its own fused group.
    let batch = |u: &std::collections::HashSet<u32>, own: &[usize]| -> Vec<usize> {
        (0..axes.len())
            .filter(|&d| !m.rows.contains(&d) && !m.cols.contains(&d) && !own.contains(&d))
            .filter(|&d| u.contains(&axes[d].var.id))
            .collect()
    };
    // The reduction variables at depth `p` (module header: `r = r.min + unflatten(p)`).
    let depth = |p: &Expr| -> Vec<Expr> {
        unflatten(p, &red_ext)
            .iter()
            .zip(&m.red)
            .map(|(v, r)| simplify(&r.min.add(v)))
            .collect()
    };
    // One packed operand: `f` with its batch axes, its fused group `g` split by `tile`, and
    // the depth, zero past the tensor (`x >= X`). A fused group is one flat axis after the
    // depth instead (`X[ba.., p, x]`, x padded to whole tiles): the micro-kernel needs unit
    // stride along the tile only, and the pack's loops can then split `x` by the innermost
    // axis of the group, so that `x // W` and `x % W` fold to loops (`schedule_pack`) instead
    // of two divisions per element of a panel.
    let pack = |f: &Expr,
                u: &std::collections::HashSet<u32>,
                g: &[usize],
                gext: &[Expr],
                total: &Expr,
                tile: i64,
                outer: &Expr,
                name: &str,
                rows: bool|
     -> Result<(Tensor, Vec<usize>)> {
        let ba = batch(u, g);
        // `rows`: the batch axes as one dim (`Rows`), indexed by the product's parallel loop.
        let bext: Vec<Expr> = ba.iter().map(|&d| simplify(&axes[d].extent)).collect();
        let mut pax: Vec<IterVar> = if rows {
            vec![fresh(&format!("{name}.rows"), product(&bext), false)]
        } else {
            ba.iter()
                .map(|&d| {
                    fresh(
                        &format!("{}.{}", name, axes[d].var.name),
                        axes[d].extent.clone(),
                        false,
                    )
                })
                .collect()
        };
        let flat = g.len() > 1;
        let (xo, p, xi) = (
            fresh("xo", outer.clone(), false),
            fresh("p", kp.clone(), false),
            fresh("xi", int(tile), false),
        );
        let xf = fresh("x", simplify(&outer.mul(&int(tile))), false);
        let xval = if flat {
            Expr::var(&xf.var)
        } else {
            Expr::var(&xo.var).mul(&int(tile)).add(&Expr::var(&xi.var))
        };
        let mut map: HashMap<u32, Expr> = HashMap::new();
        if rows {
            for (&d, v) in ba.iter().zip(unflatten(&Expr::var(&pax[0].var), &bext)) {
                map.insert(axes[d].var.id, v);
            }
        } else {
            for (k, &d) in ba.iter().enumerate() {
                map.insert(axes[d].var.id, Expr::var(&pax[k].var));
            }
        }
        for (&d, v) in g.iter().zip(unflatten(&xval, gext)) {
            map.insert(axes[d].var.id, v);
        }
        for (r, v) in m.red.iter().zip(depth(&Expr::var(&p.var))) {
            map.insert(r.var.id, v);
        }
        let body = substitute_memo(f, &map);
        let body = if multiple(total, tile) {
            body
        } else {
            Expr::select(xval.lt(total), body, zero.clone())?
        };
        if flat {
            pax.extend([p, xf]);
        } else {
            pax.extend([xo, p, xi]);
        }
        let shape: Vec<Expr> = pax.iter().map(|a| a.extent.clone()).collect();
        Ok((
            compute_from(&shape, pax, body, &format!("{}.{name}", cur.name()))?,
            ba,
        ))
    };
    let aligned = simple && multiple(&big_m, MR) && multiple(&big_n, NR);
    let blocks = Blocks::choose(&big_k, &mo, &no, dt.size() as i64);
    let rows = Rows::choose(
        &axes,
        m,
        &blocks,
        &batch(&ua, &m.rows),
        &batch(&ub, &m.cols),
    );
    let (ap, ba) = pack(
        &m.fa, &ua, &m.rows, &row_ext, &big_m, MR, &mo, "A_packed", rows.a,
    )?;
    let (bp, bb) = pack(
        &m.fb, &ub, &m.cols, &col_ext, &big_n, NR, &no, "B_packed", rows.b,
    )?;
    // The reduction over the packed panels, on axes `cax` (C's own when aligned; C's with
    // the row and column axes padded when simple; else C's other axes, then the fused rows
    // `i` and columns `j`, padded), rows at `ci` and columns at `cj`.
    // Row by row with a padded product: its axes are the rows (C's other axes flattened, as
    // the packs' `rows` dim), then the fused rows and columns, padded: every loop over it
    // (its zeroing, the product, the copy into C) indexes it by the rows loop's variable, so
    // row fusion puts them in one loop and row locals keep one row of it (a convolution's
    // 72 x 64 outputs of one image row) instead of the whole padded output.
    let others_c: Vec<usize> = (0..axes.len())
        .filter(|d| !m.rows.contains(d) && !m.cols.contains(d))
        .collect();
    let others_ext: Vec<Expr> = others_c
        .iter()
        .map(|&d| simplify(&axes[d].extent))
        .collect();
    let rows_layout = rows.on && !aligned;
    let (cax, ci, cj): (Vec<IterVar>, usize, usize) = if aligned {
        (axes.clone(), m.rows[0], m.cols[0])
    } else if rows_layout {
        let cax = vec![
            fresh("rows", product(&others_ext), false),
            fresh("i", simplify(&mo.mul(&int(MR))), false),
            fresh("j", simplify(&no.mul(&int(NR))), false),
        ];
        (cax, 1, 2)
    } else if simple {
        let cax = axes
            .iter()
            .enumerate()
            .map(|(d, a)| {
                let e = if d == m.rows[0] {
                    mo.mul(&int(MR))
                } else if d == m.cols[0] {
                    no.mul(&int(NR))
                } else {
                    a.extent.clone()
                };
                fresh(&a.var.name, simplify(&e), false)
            })
            .collect();
        (cax, m.rows[0], m.cols[0])
    } else {
        let mut cax: Vec<IterVar> = (0..axes.len())
            .filter(|d| !m.rows.contains(d) && !m.cols.contains(d))
            .map(|d| fresh(&axes[d].var.name, axes[d].extent.clone(), false))
            .collect();
        cax.push(fresh("i", simplify(&mo.mul(&int(MR))), false));
        cax.push(fresh("j", simplify(&no.mul(&int(NR))), false));
        let n = cax.len();
        (cax, n - 2, n - 1)
    };
    // Where each of C's axes is among `cax` (None: inside the fused rows or columns).
    let cpos: Vec<Option<usize>> = if rows_layout {
        // Only the packs' `rows` dims read C's other axes, as the one rows axis (`read`).
        vec![None; axes.len()]
    } else if simple {
        (0..axes.len()).map(Some).collect()
    } else {
        let mut k = 0;
        (0..axes.len())
            .map(|d| {
                (!m.rows.contains(&d) && !m.cols.contains(&d)).then(|| {
                    k += 1;
                    k - 1
                })
            })
            .collect()
    };
    let p = crate::te::reduce_axis(int(0), kp.clone(), "p")?;
    let cv = |d: usize| Expr::var(&cax[d].var);
    let read = |t: &Tensor, bat: &[usize], x: usize, tile: i64, rows: bool| {
        let mut idx: Vec<Expr> = if rows && rows_layout {
            vec![cv(0)]
        } else {
            bat.iter()
                .map(|&d| cv(cpos[d].expect("a batch axis is not fused")))
                .collect()
        };
        if rows && !rows_layout {
            // The pack's one `rows` dim: the batch axes flattened (the product's parallel
            // loop fuses the same axes, so this simplifies to its variable).
            let bext: Vec<Expr> = bat.iter().map(|&d| simplify(&axes[d].extent)).collect();
            idx = vec![flatten(&idx, &bext)];
        }
        if t.ndim() == idx.len() + 2 {
            // A fused group's flat pack (`pack`).
            idx.extend([Expr::var(&p.var), cv(x)]);
        } else {
            idx.extend([
                cv(x).floordiv(&int(tile)),
                Expr::var(&p.var),
                cv(x).floormod(&int(tile)),
            ]);
        }
        t.idx(&idx)
    };
    let product = Expr::binary(
        BinOp::Mul,
        read(&ap, &ba, ci, MR, rows.a),
        read(&bp, &bb, cj, NR, rows.b),
    )?;
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
        // Named for the path taken (printed IR): a GEMM's padded C, or the product of an
        // implicit GEMM (several reduction axes, or fused rows or columns: a convolution).
        let name = if m.simple() { "padded" } else { "packed_gemm" };
        let cp = compute_from(&shape, cax.clone(), sum, &format!("{}.{name}", cur.name()))?;
        let var = |d: usize| Expr::var(&axes[d].var);
        let group =
            |g: &[usize], e: &[Expr]| flatten(&g.iter().map(|&d| var(d)).collect::<Vec<_>>(), e);
        let idx: Vec<Expr> = if rows_layout {
            vec![
                group(&others_c, &others_ext),
                group(&m.rows, &row_ext),
                group(&m.cols, &col_ext),
            ]
        } else if simple {
            (0..axes.len()).map(var).collect()
        } else {
            let mut idx: Vec<Expr> = (0..axes.len())
                .filter(|&d| cpos[d].is_some())
                .map(var)
                .collect();
            idx.push(group(&m.rows, &row_ext));
            idx.push(group(&m.cols, &col_ext));
            idx
        };
        (cp.clone(), redefine(&cur, cp.idx(&idx)))
    };
    s.restart_stage(ti, &new_t);
    s.set_definition(ti, new_t.clone());
    let mut added = vec![Stage::new(&ap), Stage::new(&bp)];
    if !aligned {
        added.push(Stage::new(&cp));
    }
    s.stages.splice(ti..ti, added);

    // Cp: [batch.., column chunks] fused and parallel, then per chunk K blocks, row blocks,
    // the chunk's column panels, the block's row panels, and the tile (ii, ji, p) as one
    // call (`Blocks`).
    let st = s.stage(&cp)?;
    let (io, ii) = st.split(&cax[ci].var, Some(int(MR)), None)?;
    let (jo, ji) = st.split(&cax[cj].var, Some(int(NR)), None)?;
    let (jo, jl) = match blocks.nb {
        Some(nb) => {
            let (jc, jl) = st.split(&jo, Some(int(nb)), None)?;
            (jc, Some(jl))
        }
        None => (jo, None),
    };
    let others: Vec<Var> = (0..cax.len())
        .filter(|&d| d != ci && d != cj)
        .map(|d| cax[d].var.clone())
        .collect();
    let mut order = others.clone();
    order.push(jo.clone());
    let pi = match blocks.kc {
        Some(kc) => {
            let (pko, pki) = st.split(&p.var, Some(int(kc)), None)?;
            order.push(pko);
            pki
        }
        None => p.var.clone(),
    };
    let io = if blocks.mb > 1 {
        let (iob, iol) = st.split(&io, Some(int(blocks.mb)), None)?;
        order.push(iob);
        iol
    } else {
        io
    };
    order.extend(jl);
    order.extend([io, ii.clone(), ji, pi]);
    st.reorder(&order)?;
    // The parallel loop: C's other axes and the column chunks, or (`Rows`) the other axes
    // alone, the column panels serial inside.
    let mut outer = if rows.on {
        others[others.len() - 1].clone()
    } else {
        jo
    };
    let fused = if rows.on {
        &others[..others.len() - 1]
    } else {
        &others[..]
    };
    for b in fused.iter().rev() {
        outer = st.fuse(b, &outer)?;
    }
    st.parallel(&outer)?;
    st.tensorize(&ii, Intrin::GemmUpdate)?;
    // The packs: outermost loop parallel. B is read along j when its source walks j in its
    // last index (a row-major B[k, j], an NCHW image row): then its loops run p, then the
    // panel, vectorized.
    let inner = |g: &[usize]| &axes[g[g.len() - 1]];
    let along_j = last_index_uses(&m.fb, &inner(&m.cols).var);
    let flat_inner = |g: &[usize]| (g.len() > 1).then(|| simplify(&inner(g).extent));
    schedule_pack(s, &ap, &red_ext, false, flat_inner(&m.rows))?;
    schedule_pack(s, &bp, &red_ext, along_j, flat_inner(&m.cols))?;
    if !aligned {
        // C stays a buffer of its own when the user asked for it (an output) or a host
        // callback needs it whole (a debug tap on C, an extern stage reading it).
        let whole = s.outputs.contains(&new_t)
            || !s.stage(&new_t)?.taps.is_empty()
            || s.stages.iter().any(|st| {
                st.tensor.is_extern()
                    && crate::te::tensor::inputs(&st.tensor)
                        .iter()
                        .any(|x| x.id() == new_t.id())
            });
        if whole && rows_layout {
            // The copy into C row by row: C's other axes fused into the parallel loop (the
            // product's rows), the rest inside in order, the innermost vectorized.
            let st = s.stage(&new_t)?;
            let mut order: Vec<Var> = others_c.iter().map(|&d| axes[d].var.clone()).collect();
            order.extend(
                (0..axes.len())
                    .filter(|d| !others_c.contains(d))
                    .map(|d| axes[d].var.clone()),
            );
            st.reorder(&order)?;
            let mut outer = order[0].clone();
            for a in &order[1..others_c.len()] {
                outer = st.fuse(&outer, a)?;
            }
            st.parallel(&outer)?;
            st.vectorize(&axes[axes.len() - 1].var)?;
        } else if whole {
            // The copy into C: every axis but the innermost fused into the parallel loop (a
            // batch of 1 leaves no thread idle), the innermost vectorized.
            let st = s.stage(&new_t)?;
            let mut outer = axes[0].var.clone();
            for a in axes.iter().take(axes.len().saturating_sub(1)).skip(1) {
                outer = st.fuse(&outer, &a.var)?;
            }
            st.parallel(&outer)?;
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

/// Whether the product runs row by row (`on`): its parallel loop over C's axes outside the
/// GEMM's rows and columns only (a convolution's `(n, y)`: image rows), the column panels
/// serial inside, and each pack whose batch axes are exactly those (`a`, `b`) indexed by that
/// loop's variable (its batch axes flattened into one `rows` dim). `lower::fuse_rows` then
/// fuses such a pack's loop with the product's, and `lower::row_locals` gives each iteration
/// its own row of the pack: an implicit GEMM packs one image row's panels (a convolution's
/// 3x3x64-deep windows of one row: 147 KiB) and multiplies them while they are in cache,
/// instead of writing and re-reading panels for the whole batch (66 MB for 8x64x56x56).
///
/// Taken when the product is not cache-blocked (`Blocks` off: the panels of a tile over all
/// of K fit in L2), a pack has batch axes and they are all of C's other axes in order (the
/// other pack has none or the same: NCHW's image is B, NHWC's is A), and their product is a
/// constant of at least `MIN_ROWS` (every thread gets many rows).
struct Rows {
    on: bool,
    a: bool,
    b: bool,
}

/// Fewest rows for `Rows`: a 16-thread pool still gets two each.
const MIN_ROWS: i64 = 32;

impl Rows {
    fn choose(axes: &[IterVar], m: &Matmul, blocks: &Blocks, ba: &[usize], bb: &[usize]) -> Rows {
        let off = Rows {
            on: false,
            a: false,
            b: false,
        };
        if blocks.nb.is_some() || blocks.kc.is_some() || blocks.mb != 1 {
            return off;
        }
        // C's axes outside the rows and columns, in order.
        let others: Vec<usize> = (0..axes.len())
            .filter(|d| !m.rows.contains(d) && !m.cols.contains(d))
            .collect();
        let fits = |x: &[usize]| x.is_empty() || x == others;
        if others.is_empty() || !(ba == others || bb == others) || !fits(ba) || !fits(bb) {
            return off;
        }
        // C's innermost axis is among the rows or columns (the copy into C vectorizes it).
        if others.contains(&(axes.len() - 1)) {
            return off;
        }
        let mut n: i64 = 1;
        for &d in &others {
            match simplify(&axes[d].extent).as_int() {
                Some(e) if e >= 1 => match n.checked_mul(e) {
                    Some(x) if x <= super::contraction::MAX_FUSED => n = x,
                    _ => return off,
                },
                _ => return off,
            }
        }
        if n < MIN_ROWS || std::env::var("RIVET_GEMM_ROWS").is_ok_and(|v| v == "0") {
            return off;
        }
        Rows {
            on: true,
            a: !ba.is_empty(),
            b: !bb.is_empty(),
        }
    }
}

/// How the product's tiles are blocked for the caches (Goto's order, each thread on its own
/// chunks of column panels): `nb` column panels per chunk (the parallel loop runs over the
/// chunks), `kc` products per K block (C's tiles stored and reloaded between blocks: each
/// element's multiply-adds stay in order of `p`, so the same bits), `mb` row panels per M
/// block. A block of row panels (`mb * MR` rows by the block's depth, about `A_BYTES`) is
/// reused from L2 by every column panel of the chunk, and the chunk's B panels (about
/// `B_BYTES`) by every row block, instead of all of packed A being re-read from L3 once per
/// column panel. Measured by `benches/gemm_blocking.rs` and `benches/gemm_threads.py`.
///
/// Invariants: `kc` divides K (a constant), so the tile's depth loop needs no guard (a guard
/// inside the tensorized nest would not match the micro-kernel); a ragged last M block or
/// column chunk is guarded outside the tile (`lower::tensorize` keeps the guard around the
/// call). `RIVET_GEMM_BLOCKS=0` turns blocking off (the order before it, for comparisons);
/// `RIVET_GEMM_BLOCKS=KCxMBxNB` forces the blocks (`Blocks::forced`).
struct Blocks {
    nb: Option<i64>,
    kc: Option<i64>,
    mb: i64,
}

/// The bytes of one tile's panels over all of K (`(MR + NR) * K` elements) above which the
/// product is blocked: half of the smallest L2 (512 KiB).
const PANELS_BYTES: i64 = 256 << 10;
/// The bytes of A's block the blocking aims at: a quarter of the smallest L2 of the x86
/// cores these builds run on (512 KiB).
const A_BYTES: i64 = 96 << 10;
/// The bytes of a chunk's B panels: half of that L2.
const B_BYTES: i64 = 256 << 10;
/// At least this many column chunks when N is constant (every thread of a 2- or 4-thread
/// pool gets work); a symbolic N gets chunks of at most `SYMBOLIC_NB` panels.
const MIN_CHUNKS: i64 = 4;
const SYMBOLIC_NB: i64 = 4;

impl Blocks {
    fn choose(k: &Expr, mo: &Expr, no: &Expr, elem: i64) -> Blocks {
        if let Some(forced) = Blocks::forced(k, mo, no) {
            return forced;
        }
        let elem = elem.max(1);
        let off = Blocks {
            nb: None,
            kc: None,
            mb: 1,
        };
        // Only when one tile's panels over all of K would crowd L2 (f32 from K = 1490, f64
        // from 745): below that the order without blocks measured as fast or faster (C is
        // then loaded and stored once per tile instead of once per K block). The K blocks
        // divide a constant K (the largest divisor from 128 to 256: 256 measured best at
        // 1024 and 2048); a symbolic K or one without such a divisor is not blocked.
        let Some(k) = k.as_int().filter(|&k| (MR + NR) * k * elem > PANELS_BYTES) else {
            return off;
        };
        let Some(kc) = (128..=256).rev().find(|d| k % d == 0) else {
            return off;
        };
        let mut mb = (A_BYTES / (MR * kc * elem)).clamp(1, 16);
        if let Some(m) = mo.as_int() {
            mb = mb.min(m.max(1));
        }
        let mut nb = (B_BYTES / (NR * kc * elem)).clamp(1, 16);
        nb = match no.as_int() {
            Some(n) => nb.min((n / MIN_CHUNKS).max(1)),
            None => nb.min(SYMBOLIC_NB),
        };
        Blocks {
            nb: (nb > 1).then_some(nb),
            kc: Some(kc),
            mb,
        }
    }

    /// `RIVET_GEMM_BLOCKS`: `0` turns blocking off; `KCxMBxNB` forces K blocks of KC products
    /// (0: none; ignored unless KC divides a constant K), M blocks of MB row panels and
    /// chunks of NB column panels, for comparisons (read per build: the build cache does not
    /// key on it).
    fn forced(k: &Expr, mo: &Expr, no: &Expr) -> Option<Blocks> {
        let v = std::env::var("RIVET_GEMM_BLOCKS").ok()?;
        let v = v.trim();
        if v == "0" {
            return Some(Blocks {
                nb: None,
                kc: None,
                mb: 1,
            });
        }
        let f: Vec<i64> = v
            .split('x')
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        let [kc, mb, nb] = f[..] else {
            return None;
        };
        let kc = k
            .as_int()
            .filter(|&k| kc > 0 && kc < k && k % kc == 0)
            .map(|_| kc);
        let cap = |b: i64, of: &Expr| {
            let b = b.clamp(1, 1 << 20);
            of.as_int().map_or(b, |n| b.min(n.max(1)))
        };
        let nb = cap(nb, no);
        Some(Blocks {
            nb: (nb > 1).then_some(nb),
            kc,
            mb: cap(mb, mo),
        })
    }
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

/// The loops of a pack `X_packed[ba.., xo, p, xi]` (or, for a fused group, `[ba.., p, x]`
/// with `w` the group's innermost extent): the depth `p` split into one loop per reduction
/// axis (`p = (r0 * e1 + r1) * e2 + r2`: the splits divide exactly, and after them
/// `lower::tile_fold` folds the packed body's `p // e2 % e1` back to the loop `r1`, so the
/// window gather divides nothing), a flat `x` split by `w` likewise (its last piece guarded),
/// the outermost loop parallel. `along`: the source is read contiguously along the panel, so
/// the panel loop runs innermost after the depth loops and is vectorized (a panel guarded by
/// padding is split by `lower::partition` into scalar edges and an unguarded vector
/// interior; one guarded only by N not a multiple of NR, its last panel ragged, is not).
fn schedule_pack(
    s: &mut Schedule,
    pack: &Tensor,
    red_ext: &[Expr],
    along: bool,
    flat: Option<Expr>,
) -> Result<()> {
    let ax: Vec<Var> = pack.axis().iter().map(|a| a.var.clone()).collect();
    let n = ax.len();
    let st = s.stage(pack)?;
    let mut depth = vec![ax[n - 2].clone()];
    for e in red_ext[1..].iter().rev() {
        let (o, i) = st.split(&depth[0], Some(e.clone()), None)?;
        depth[0] = i;
        depth.insert(0, o);
    }
    if let Some(w) = flat {
        let mut order = ax[..n - 2].to_vec();
        order.extend(depth);
        let x = &ax[n - 1];
        let inner = match w.as_int() {
            Some(c) if c > 1 => {
                let (o, i) = st.split(x, Some(w), None)?;
                order.push(o);
                i
            }
            _ => x.clone(),
        };
        order.push(inner.clone());
        st.reorder(&order)?;
        parallel_outer(st, &order, n - 2)?;
        if along {
            st.vectorize(&inner)?;
        }
        return Ok(());
    }
    let mut order = ax[..n - 3].to_vec();
    if along {
        order.extend(depth);
        order.extend([ax[n - 3].clone(), ax[n - 1].clone()]);
    } else {
        order.push(ax[n - 3].clone());
        order.extend(depth);
        order.push(ax[n - 1].clone());
    }
    st.reorder(&order)?;
    parallel_outer(st, &order, n - 3)?;
    if along {
        st.vectorize(&ax[n - 1])?;
    }
    Ok(())
}

/// The parallel loop of a pack whose loops are `order`, the first `batch` its batch axes:
/// those fused (an image's rows when the batch is 1: one parallel loop of useful size), or
/// else the first loop.
fn parallel_outer(st: &mut Stage, order: &[Var], batch: usize) -> Result<()> {
    let mut outer = order[0].clone();
    for a in &order[1..batch.max(1)] {
        outer = st.fuse(&outer, a)?;
    }
    st.parallel(&outer)
}
