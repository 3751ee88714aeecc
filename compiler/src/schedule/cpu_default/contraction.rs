//! Which contractions the packed GEMM takes (`match_matmul`), and how several axes become
//! one of the GEMM's: a convolution `out[n, co, h, w] = sum_{ci, kh, kw} X[n, ci, h*s + kh,
//! w*s + kw] * W[co, ci, kh, kw]` is a GEMM whose depth `p` runs over `(ci, kh, kw)`, whose
//! rows are `co` and whose columns are `w` (or `(h, w)` fused, when a row of `w` alone would
//! leave most of a panel as padding). The packing stages then gather the windows (an implicit
//! GEMM: no im2col buffer beyond the panels).
//!
//! Invariants:
//! - a group of axes (`unflatten`) is fused outermost first, `x = ((g0 * e1) + g1) * e2 + g2`;
//!   every extent but the outermost is a constant of at least 1, so only constants divide, and
//!   every product the rewrite needs of constants is computed with checked arithmetic (a
//!   contraction whose constant sizes overflow `MAX_FUSED` is not matched: it falls to the plain
//!   schedule);
//! - each factor's variables are collected once, node by node (`used`): a factor that is a
//!   shared DAG costs its distinct nodes, not its tree size;
//! - the reduction axes' bounds may not use a data axis (the packs evaluate them outside C's
//!   loops).

use crate::arith::simplify::simplify;
use crate::ir::expr::{BinOp, Expr, ExprKind, IterVar, ReduceOp};
use crate::te::tensor::{top_reduce, Tensor};
use rivet_runtime::DType;
use std::collections::HashSet;

use super::packed_gemm::{MR, NR};

/// Largest product of constant extents fused into one GEMM axis (and of its padded tile
/// count): far below `i64::MAX`, so that indices derived from it cannot overflow either.
pub const MAX_FUSED: i64 = 1 << 40;
/// Most reduction axes folded into the GEMM's depth (a convolution has three, a 3-d one four).
pub const MAX_DEPTH_AXES: usize = 8;

/// A contraction the packed GEMM computes, as the rewrite (`packed_gemm::rewrite`) sees it.
#[derive(Clone, Debug)]
pub struct Matmul {
    /// Positions, among the stage's data axes (outermost first), of the axes fused into the
    /// GEMM's rows: walked by `fa` and not by `fb`. At least one; every extent but the first
    /// a positive constant.
    pub rows: Vec<usize>,
    /// The same for the columns, walked by `fb` and not by `fa`.
    pub cols: Vec<usize>,
    pub fa: Expr,
    pub fb: Expr,
    /// The reduction axes, outermost first: the GEMM's depth `p` runs over their product
    /// (every extent but the first a positive constant).
    pub red: Vec<IterVar>,
}

impl Matmul {
    /// Whether this is the one-axis GEMM (`C[.., i, .., j] = sum_k A[i, k] * B[k, j]`): one
    /// row axis, one column axis, one reduction axis (the name of its padded product says so).
    pub fn simple(&self) -> bool {
        self.rows.len() == 1 && self.cols.len() == 1 && self.red.len() == 1
    }
}

/// The ids of the variables `e` uses, each distinct node visited once.
pub(crate) fn used(e: &Expr) -> HashSet<u32> {
    let mut out = HashSet::new();
    e.visit_unique(&mut |n| {
        if let ExprKind::Var(v) = n.kind() {
            out.insert(v.id);
        }
    });
    out
}

/// The constant value of `e` (after simplification), if any.
fn constant(e: &Expr) -> Option<i64> {
    simplify(e).as_int()
}

/// `t` as a contraction for the packed GEMM: a `sum` over one or more reduction axes of a
/// product of two factors of `t`'s dtype (float32 or float64), each using a reduction axis and
/// a data axis the other does not. The factor walking C's innermost axis (when only one does)
/// gives the columns. `None` for anything else, and for sizes the rewrite refuses (a
/// non-constant inner reduction extent, a product of constants past `MAX_FUSED`).
pub fn match_matmul(t: &Tensor) -> Option<Matmul> {
    let (ReduceOp::Sum, body, red) = top_reduce(t.body()?)? else {
        return None;
    };
    if red.is_empty() || red.len() > MAX_DEPTH_AXES {
        return None;
    }
    let dt = t.dtype();
    if !matches!(dt, DType::F32 | DType::F64) || body.dtype() != dt {
        return None;
    }
    let ExprKind::Binary(BinOp::Mul, a, b) = body.kind() else {
        return None;
    };
    if a.dtype() != dt || b.dtype() != dt {
        return None;
    }
    let axes = t.axis();
    let (ua, ub) = (used(a), used(b));
    let uses_red = |u: &HashSet<u32>| red.iter().any(|r| u.contains(&r.var.id));
    if !uses_red(&ua) || !uses_red(&ub) {
        return None;
    }
    // The reduction's bounds are evaluated in the packs, outside C's loops.
    let mut all: HashSet<u32> = axes.iter().map(|a| a.var.id).collect();
    all.extend(red.iter().map(|r| r.var.id));
    for r in red {
        if used(&r.min)
            .iter()
            .chain(&used(&r.extent))
            .any(|v| all.contains(v))
        {
            return None;
        }
    }
    // Depth: every inner extent a positive constant, the product of constants checked.
    let mut depth: i64 = 1;
    for (n, r) in red.iter().enumerate().rev() {
        match constant(&r.extent) {
            Some(e) if e >= 1 => depth = depth.checked_mul(e).filter(|d| *d <= MAX_FUSED)?,
            None if n == 0 => {}
            _ => return None,
        }
    }
    let own = |x: &HashSet<u32>, y: &HashSet<u32>| -> Vec<usize> {
        (0..axes.len())
            .filter(|&d| x.contains(&axes[d].var.id) && !y.contains(&axes[d].var.id))
            .collect()
    };
    let (oa, ob) = (own(&ua, &ub), own(&ub, &ua));
    if oa.is_empty() || ob.is_empty() {
        return None;
    }
    // Columns are contiguous in the GEMM's product: give them to the factor that walks C's
    // innermost axis (NCHW's image, whichever order the product was written in).
    let last = axes.len() - 1;
    let (fa, fb, oa, ob) = if oa.contains(&last) && !ob.contains(&last) {
        (b, a, ob, oa)
    } else {
        (a, b, oa, ob)
    };
    Some(Matmul {
        rows: fused(axes, &oa, MR),
        cols: fused(axes, &ob, NR),
        fa: fa.clone(),
        fb: fb.clone(),
        red: red.to_vec(),
    })
}

/// The innermost axes of `group` (positions, outermost first) fused into one GEMM axis tiled
/// by `tile`: the last axis alone, extended outwards while a tile would still be more than a
/// quarter padding (a 7-wide image row in 32-wide panels) and the axes inside are constants
/// (the product checked against `MAX_FUSED`). The axes left out stay batch axes of their
/// factor.
fn fused(axes: &[IterVar], group: &[usize], tile: i64) -> Vec<usize> {
    let mut n = group.len() - 1;
    let mut size = constant(&axes[group[n]].extent);
    while n > 0 {
        let Some(p) = size.filter(|p| *p >= 1) else {
            break;
        };
        let Some(padded) = p.checked_add(tile - 1).map(|x| x / tile * tile) else {
            break;
        };
        if (padded - p) * 4 <= padded {
            break;
        }
        size = match constant(&axes[group[n - 1]].extent) {
            Some(e) if e >= 1 => match p.checked_mul(e).filter(|x| *x <= MAX_FUSED) {
                Some(x) => Some(x),
                None => break,
            },
            Some(_) => break,
            None => None,
        };
        n -= 1;
    }
    group[n..].to_vec()
}

/// The values of the axes of extents `extents` (outermost first; all but the first positive
/// constants) fused into `x` (`x = ((g0 * e1) + g1) * e2 + g2`): `g_t = (x // s_t) % e_t`
/// with `s_t` the product of the extents inside (no division for the innermost, no modulo for
/// the outermost).
pub(crate) fn unflatten(x: &Expr, extents: &[Expr]) -> Vec<Expr> {
    let n = extents.len();
    let mut out = vec![Expr::int(0); n];
    let mut stride: i64 = 1;
    for t in (0..n).rev() {
        let q = if stride == 1 {
            x.clone()
        } else {
            x.floordiv(&Expr::int(stride))
        };
        out[t] = if t == 0 { q } else { q.floormod(&extents[t]) };
        if t > 0 {
            // Checked by the match (`MAX_FUSED`); saturate rather than wrap if ever not.
            stride = stride.saturating_mul(constant(&extents[t]).unwrap_or(1));
        }
    }
    out
}

/// The fused index of a group of axes at values `vals` (outermost first), the inverse of
/// `unflatten`.
pub(crate) fn flatten(vals: &[Expr], extents: &[Expr]) -> Expr {
    let mut x = vals[0].clone();
    for t in 1..vals.len() {
        x = x.mul(&extents[t]).add(&vals[t]);
    }
    simplify(&x)
}

/// The product of `extents` (simplified).
pub(crate) fn product(extents: &[Expr]) -> Expr {
    let mut x = Expr::int(1);
    for e in extents {
        x = x.mul(e);
    }
    simplify(&x)
}

/// Whether `t` is a direct convolution-like contraction the packed GEMM does not take: a
/// float sum over several reduction axes of a product whose last data axis the body walks
/// (a depthwise convolution, `sum_{kh, kw} X[n, c, h + kh, w + kw] * W[c, kh, kw]`: the channel
/// is walked by both factors, so there are no rows). The default schedule runs it as columns
/// of outputs with the reduction inside (`super::columns`): the same order per element.
pub fn direct_contraction(t: &Tensor) -> bool {
    let Some((ReduceOp::Sum, body, red)) = t.body().and_then(top_reduce) else {
        return false;
    };
    let (Some(last), true) = (t.axis().last(), red.len() >= 2) else {
        return false;
    };
    t.dtype().is_float()
        && crate::schedule::gpu_default::is_contraction(t)
        && used(body).contains(&last.var.id)
}
