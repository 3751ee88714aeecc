//! The blocked, packed, tensorized f32/f64 GEMM written in the DSL (the schedule of the notes'
//! blocked GEMM, with its register tile as one `gemm_update` micro-kernel call):
//!
//! ```text
//! Ap[io, p, ii]     = A[io*MR + ii, p]      (0 past M)     A packed in MR-tall panels
//! Bp[jo, p, ji]     = B[p, jo*NR + ji]      (0 past N)     B packed in NR-wide panels
//! Cp[i, j]          = sum_p Ap[i / MR, p, i % MR] * Bp[j / NR, p, j % NR]   (padded)
//! C[i, j]           = Cp[i, j]
//! ```
//!
//! When M and N are multiples of the tile, `Cp` is `C` itself (no padded copy); the packing
//! conditions are only there for the dims that need padding. `i` and `j` are split by the
//! tile, so the packed reads are `Ap[io, p, ii]` once `lower::tensorize` folds the tile
//! divisions.
//!
//! Schedule: `Cp`'s loops `io, ii, jo, ji` (the splits of i and j), ordered `jo` (parallel), `po` (KC-deep slices of the products), `io`, then
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
use crate::te::{self, compute, placeholder, Tensor};
use rivet_runtime::DType;

/// The register tile (rows, columns) and slice depth: the default schedule's
/// (`schedule::cpu_default::packed_gemm`), which does the same as a schedule rewrite for any sizes.
pub use crate::schedule::cpu_default::packed_gemm::{KC, MR, NR};

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
    let a = placeholder(if a_t { [k, m] } else { [m, k] }, dtype, "A")?;
    let b = placeholder(if b_t { [n, k] } else { [k, n] }, dtype, "B")?;
    let zero = te::constant(0.0, dtype);
    // The condition of a packed element: only the bounds that padding can cross.
    let inside = |x: &Expr, xn: i64, tile: i64, p: &Expr| {
        let mut c: Option<Expr> = None;
        if xn % tile != 0 {
            c = Some(x.lt(&int(xn)));
        }
        if k != kp {
            let pk = p.lt(&int(k));
            c = Some(match c {
                Some(c) => te::all(c, pk),
                None => pk,
            });
        }
        c
    };
    let padded = |c: Option<Expr>, v: Expr| match c {
        Some(c) => te::if_then_else(c, v, &zero),
        None => v,
    };
    // Panels: A.packed[io, p, ii] = A[io * MR + ii, p] (zero past the edges), B likewise.
    let ap = compute(
        [mo, kp, MR],
        |[io, q, ii]| {
            let i = io * MR + ii;
            let v = if a_t { a.at([&q, &i]) } else { a.at([&i, &q]) };
            padded(inside(&i, m, MR, &q), v)
        },
        "A.packed",
    )?;
    let bp = compute(
        [no, kp, NR],
        |[jo, q, ji]| {
            let j = jo * NR + ji;
            let v = if b_t { b.at([&j, &q]) } else { b.at([&q, &j]) };
            padded(inside(&j, n, NR, &q), v)
        },
        "B.packed",
    )?;
    let p = te::reduce_axis(0, kp, "p")?;
    let aligned = m % MR == 0 && n % NR == 0;
    let cp = compute(
        [mo * MR, no * NR],
        |[i, j]| {
            let a_at = ap.at((te::floordiv(&i, MR), &p, te::floormod(&i, MR)));
            let b_at = bp.at((te::floordiv(&j, NR), &p, te::floormod(&j, NR)));
            te::sum(a_at * b_at, &p)
        },
        if aligned { "C" } else { "C.padded" },
    )?;
    let c = if aligned {
        cp.clone()
    } else {
        compute([m, n], |[i, j]| cp.at([i, j]), "C")?
    };
    let mut s = Schedule::new(std::slice::from_ref(&c))?;
    let v = |t: &Tensor, d: usize| t.axis()[d].var.clone();
    {
        let st = s.stage(&cp)?;
        let (io, ii) = st.split(&v(&cp, 0), Some(int(MR)), None)?;
        let (jo, ji) = st.split(&v(&cp, 1), Some(int(NR)), None)?;
        let (po, pi) = st.split(&p.var, Some(int(kc)), None)?;
        st.reorder(&[jo.clone(), po, io, ii.clone(), ji, pi])?;
        st.parallel(&jo)?;
        st.tensorize(&ii, Intrin::GemmUpdate)?;
    }
    if !aligned {
        s.stage(&c)?.parallel(&v(&c, 0))?;
    }
    s.stage(&ap)?.parallel(&v(&ap, 0))?;
    // Pack loops in the order that reads the source row by row: B[p, j] (row-major) is read
    // along j for each p; a transposed B like A, along the panel's rows.
    if b_t {
        s.stage(&bp)?.parallel(&v(&bp, 0))?;
    } else {
        let st = s.stage(&bp)?;
        st.reorder(&[v(&bp, 1), v(&bp, 0), v(&bp, 2)])?;
        st.parallel(&v(&bp, 1))?;
    }
    Ok((vec![a, b, c], s))
}
