//! The blocked, packed, tensorized f32/f64 GEMM written in the DSL (the schedule of the notes'
//! blocked GEMM, with its register tile as one `gemm_update` micro-kernel call):
//!
//! ```text
//! Ap[io, p, ii]     = A[io*MR + ii, p]      (0 past M)     A packed in MR-tall panels
//! Bp[jo, p, ji]     = B[p, jo*NR + ji]      (0 past N)     B packed in NR-wide panels
//! Cp[io, jo, ii, ji] = sum_p Ap[io, p, ii] * Bp[jo, p, ji] one tile per (io, jo)
//! C[i, j]           = Cp[i / MR, j / NR, i % MR, j % NR]
//! ```
//!
//! Schedule: `Cp`'s loops `jo` (parallel), `po` (KC-deep slices of the products), `io`, then
//! the tile `ii, ji, pi`, tensorized at `ii` onto `gemm_update` (per call a 32 x KC slice of
//! B, 32 KiB at KC = 256, stays in L1 while the A panels stream by; K is padded with zeros
//! to a multiple of KC, which adds exact zeros) (the AVX-512 kernel's 12x32 tile: a 6x16 AVX2 kernel covers it in
//! four calls, the portable loop anywhere). Padding the panels to whole tiles keeps the tile
//! loops free of guards (which tensorize refuses), so any M, N, K work. `a_t` / `b_t` take A
//! as `(K, M)` / B as `(N, K)` (transposed operands); any strides work, as everywhere.

use crate::error::Result;
use crate::ir::intrin::Intrin;
use crate::ir::Expr;
use crate::schedule::Schedule;
use crate::te::{self, ax, compute, ok, placeholder, Tensor};
use rivet_runtime::DType;

/// The register tile (rows, columns) of the tensorized GEMM.
pub const MR: i64 = 12;
pub const NR: i64 = 32;
/// Depth of the product slices one micro-kernel call runs (the cache block of B).
pub const KC: i64 = 256;

/// The tensors `[A, B, C]` (call order) and the schedule of `C = A @ B` for `(m, k) x (k, n)`.
pub fn gemm(
    (m, n, k): (i64, i64, i64),
    dtype: DType,
    a_t: bool,
    b_t: bool,
) -> Result<(Vec<Tensor>, Schedule)> {
    let int = Expr::int;
    let (mo, no) = ((m + MR - 1) / MR, (n + NR - 1) / NR);
    let kc = KC.min(k.max(1));
    let kp = (k + kc - 1) / kc * kc;
    let a_shape = if a_t {
        [int(k), int(m)]
    } else {
        [int(m), int(k)]
    };
    let b_shape = if b_t {
        [int(n), int(k)]
    } else {
        [int(k), int(n)]
    };
    let a = placeholder(&a_shape, dtype, "A")?;
    let b = placeholder(&b_shape, dtype, "B")?;
    let zero = te::constant(0.0, dtype);
    let inside = |a: &Expr, b: &Expr| ok(te::all(a.clone(), b.clone()));
    let ap = compute(
        &[int(mo), int(kp), int(MR)],
        |x| {
            let i = x[0].mul(&int(MR)).add(&x[2]);
            let v = if a_t {
                a.idx(&[x[1].clone(), i.clone()])
            } else {
                a.idx(&[i.clone(), x[1].clone()])
            };
            let ok_ = inside(&i.lt(&int(m)), &x[1].lt(&int(k)));
            ok(te::if_then_else(ok_, v, zero.clone()))
        },
        "A.packed",
    )?;
    let bp = compute(
        &[int(no), int(kp), int(NR)],
        |x| {
            let j = x[0].mul(&int(NR)).add(&x[2]);
            let v = if b_t {
                b.idx(&[j.clone(), x[1].clone()])
            } else {
                b.idx(&[x[1].clone(), j.clone()])
            };
            let ok_ = inside(&j.lt(&int(n)), &x[1].lt(&int(k)));
            ok(te::if_then_else(ok_, v, zero.clone()))
        },
        "B.packed",
    )?;
    let p = te::reduce_axis(int(0), int(kp), "p")?;
    let cp = compute(
        &[int(mo), int(no), int(MR), int(NR)],
        |x| {
            ok(te::sum(
                ap.idx(&[x[0].clone(), ax(&p), x[2].clone()])
                    * bp.idx(&[x[1].clone(), ax(&p), x[3].clone()]),
                std::slice::from_ref(&p),
            ))
        },
        "C.tiles",
    )?;
    let c = compute(
        &[int(m), int(n)],
        |x| {
            cp.idx(&[
                x[0].floordiv(&int(MR)),
                x[1].floordiv(&int(NR)),
                x[0].floormod(&int(MR)),
                x[1].floormod(&int(NR)),
            ])
        },
        "C",
    )?;
    let mut s = Schedule::new(std::slice::from_ref(&c))?;
    let v = |t: &Tensor, d: usize| t.axis()[d].var.clone();
    {
        let st = s.stage(&cp)?;
        let (po, pi) = st.split(&p.var, Some(int(kc)), None)?;
        st.reorder(&[v(&cp, 1), po, v(&cp, 0), v(&cp, 2), v(&cp, 3), pi])?;
        st.parallel(&v(&cp, 1))?;
        st.tensorize(&v(&cp, 2), Intrin::GemmUpdate)?;
    }
    s.stage(&ap)?.parallel(&v(&ap, 0))?;
    s.stage(&bp)?.parallel(&v(&bp, 0))?;
    s.stage(&c)?.parallel(&v(&c, 0))?;
    Ok((vec![a, b, c], s))
}
