//! The x86-64 kernels: AVX-512F 12x32 and AVX2+FMA 6x16 register tiles over packed panels
//! (float64: AVX-512F 12x16, AVX2+FMA 6x8),
//! and their drivers (cut a call into kernel tiles, or fall back to the generic loop).
//!
//! A kernel keeps its whole C tile in registers for the `k` loop: it loads the tile, applies
//! `fma(broadcast A[p, i], B[p, j..j+16 or 8], acc)` for each `p` in order, and stores the
//! tile. Per element that is exactly the generic loop's sequence (`portable::gemm_generic`),
//! so results are bit-identical to it. Only entered after `Variant::supported` (selection
//! refuses a variant the CPU lacks).

use super::portable::{gemm_generic, Fma};
use std::arch::x86_64::*;

/// Cuts the tile update into `tm x tn` kernel calls when the panels are packed (unit stride
/// along i in A and along j in B) and the tile is a multiple of the kernel's; otherwise runs
/// the generic loop. C with a non-unit column stride goes through a contiguous copy of the
/// kernel tile (same arithmetic).
///
/// # Safety
/// As `gemm_generic`; `kernel` must be runnable on this CPU and, given
/// `(k, a, a_ks, b, b_ks, c, c_rs)`, update the `tm x tn` tile with unit column stride.
#[allow(clippy::too_many_arguments)]
unsafe fn drive<T: Fma + Default>(
    (tm, tn): (i64, i64),
    kernel: &mut dyn FnMut(usize, *const T, isize, *const T, isize, *mut T, isize),
    mr: i64,
    nr: i64,
    k: i64,
    c: *mut T,
    c_rs: i64,
    c_cs: i64,
    a: *const T,
    a_ks: i64,
    a_ms: i64,
    b: *const T,
    b_ks: i64,
    b_ns: i64,
) {
    let packed = a_ms == 1 && b_ns == 1 && mr % tm == 0 && nr % tn == 0;
    if !packed || mr <= 0 || nr <= 0 {
        // SAFETY: forwarded contract.
        unsafe { gemm_generic(mr, nr, k, c, c_rs, c_cs, a, a_ks, a_ms, b, b_ks, b_ns) };
        return;
    }
    let ku = k.max(0) as usize;
    let mut tmp = [T::default(); 12 * 32];
    for i0 in (0..mr).step_by(tm as usize) {
        for j0 in (0..nr).step_by(tn as usize) {
            // SAFETY: sub-tiles of the tile the caller vouches for.
            let (asub, bsub, csub) = unsafe {
                (
                    a.offset(i0 as isize),
                    b.offset(j0 as isize),
                    c.offset((i0 * c_rs + j0 * c_cs) as isize),
                )
            };
            if c_cs == 1 {
                kernel(
                    ku,
                    asub,
                    a_ks as isize,
                    bsub,
                    b_ks as isize,
                    csub,
                    c_rs as isize,
                );
            } else {
                let t = tmp.as_mut_ptr();
                for i in 0..tm {
                    for j in 0..tn {
                        // SAFETY: inside the caller's tile and inside `tmp` (tm*tn <= 384).
                        unsafe {
                            *t.offset((i * tn + j) as isize) =
                                *csub.offset((i * c_rs + j * c_cs) as isize)
                        };
                    }
                }
                kernel(ku, asub, a_ks as isize, bsub, b_ks as isize, t, tn as isize);
                for i in 0..tm {
                    for j in 0..tn {
                        // SAFETY: as above.
                        unsafe {
                            *csub.offset((i * c_rs + j * c_cs) as isize) =
                                *t.offset((i * tn + j) as isize)
                        };
                    }
                }
            }
        }
    }
}

/// The AVX-512F 12x32 kernel: C (row stride `c_rs`, unit column stride) += A panel (12 wide,
/// row stride `a_ks`) x B panel (32 wide, row stride `b_ks`) over `k` rows.
///
/// # Safety
/// The CPU has AVX-512F; the 12x32 C tile and the `k` rows of both panels are valid.
#[target_feature(enable = "avx512f")]
unsafe fn k12x32(
    k: usize,
    a: *const f32,
    a_ks: isize,
    b: *const f32,
    b_ks: isize,
    c: *mut f32,
    c_rs: isize,
) {
    // SAFETY: every pointer below stays inside the tile and panels the caller vouches for.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; 12];
        for (i, row) in acc.iter_mut().enumerate() {
            let cp = c.offset(i as isize * c_rs);
            row[0] = _mm512_loadu_ps(cp);
            row[1] = _mm512_loadu_ps(cp.add(16));
        }
        let (mut ap, mut bp) = (a, b);
        for _ in 0..k {
            let b0 = _mm512_loadu_ps(bp);
            let b1 = _mm512_loadu_ps(bp.add(16));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*ap.add(i));
                row[0] = _mm512_fmadd_ps(av, b0, row[0]);
                row[1] = _mm512_fmadd_ps(av, b1, row[1]);
            }
            ap = ap.offset(a_ks);
            bp = bp.offset(b_ks);
        }
        for (i, row) in acc.iter().enumerate() {
            let cp = c.offset(i as isize * c_rs);
            _mm512_storeu_ps(cp, row[0]);
            _mm512_storeu_ps(cp.add(16), row[1]);
        }
    }
}

/// The AVX2+FMA 6x16 kernel (as `k12x32`, with 8-wide vectors).
///
/// # Safety
/// The CPU has AVX2 and FMA; the 6x16 C tile and the `k` rows of both panels are valid.
#[target_feature(enable = "avx2,fma")]
unsafe fn k6x16(
    k: usize,
    a: *const f32,
    a_ks: isize,
    b: *const f32,
    b_ks: isize,
    c: *mut f32,
    c_rs: isize,
) {
    // SAFETY: every pointer below stays inside the tile and panels the caller vouches for.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; 6];
        for (i, row) in acc.iter_mut().enumerate() {
            let cp = c.offset(i as isize * c_rs);
            row[0] = _mm256_loadu_ps(cp);
            row[1] = _mm256_loadu_ps(cp.add(8));
        }
        let (mut ap, mut bp) = (a, b);
        for _ in 0..k {
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ap.add(i));
                row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                row[1] = _mm256_fmadd_ps(av, b1, row[1]);
            }
            ap = ap.offset(a_ks);
            bp = bp.offset(b_ks);
        }
        for (i, row) in acc.iter().enumerate() {
            let cp = c.offset(i as isize * c_rs);
            _mm256_storeu_ps(cp, row[0]);
            _mm256_storeu_ps(cp.add(8), row[1]);
        }
    }
}

/// The AVX-512F f64 12x16 kernel (as `k12x32`, with 8-wide double vectors).
///
/// # Safety
/// The CPU has AVX-512F; the 12x16 C tile and the `k` rows of both panels are valid.
#[target_feature(enable = "avx512f")]
unsafe fn k12x16_f64(
    k: usize,
    a: *const f64,
    a_ks: isize,
    b: *const f64,
    b_ks: isize,
    c: *mut f64,
    c_rs: isize,
) {
    // SAFETY: every pointer below stays inside the tile and panels the caller vouches for.
    unsafe {
        let mut acc = [[_mm512_setzero_pd(); 2]; 12];
        for (i, row) in acc.iter_mut().enumerate() {
            let cp = c.offset(i as isize * c_rs);
            row[0] = _mm512_loadu_pd(cp);
            row[1] = _mm512_loadu_pd(cp.add(8));
        }
        let (mut ap, mut bp) = (a, b);
        for _ in 0..k {
            let b0 = _mm512_loadu_pd(bp);
            let b1 = _mm512_loadu_pd(bp.add(8));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_pd(*ap.add(i));
                row[0] = _mm512_fmadd_pd(av, b0, row[0]);
                row[1] = _mm512_fmadd_pd(av, b1, row[1]);
            }
            ap = ap.offset(a_ks);
            bp = bp.offset(b_ks);
        }
        for (i, row) in acc.iter().enumerate() {
            let cp = c.offset(i as isize * c_rs);
            _mm512_storeu_pd(cp, row[0]);
            _mm512_storeu_pd(cp.add(8), row[1]);
        }
    }
}

/// The AVX2+FMA f64 6x8 kernel (as `k6x16`, with 4-wide double vectors: 12 ymm accumulators).
/// Without it, float64 tiles on AVX2 ran the generic loop, whose `mul_add` is a library call
/// per product on a target built without FMA (a 256^3 float64 GEMM: 0.4 s against numpy's
/// 1.2 ms).
///
/// # Safety
/// The CPU has AVX2 and FMA; the 6x8 C tile and the `k` rows of both panels are valid.
#[target_feature(enable = "avx2,fma")]
unsafe fn k6x8_f64(
    k: usize,
    a: *const f64,
    a_ks: isize,
    b: *const f64,
    b_ks: isize,
    c: *mut f64,
    c_rs: isize,
) {
    // SAFETY: every pointer below stays inside the tile and panels the caller vouches for.
    unsafe {
        let mut acc = [[_mm256_setzero_pd(); 2]; 6];
        for (i, row) in acc.iter_mut().enumerate() {
            let cp = c.offset(i as isize * c_rs);
            row[0] = _mm256_loadu_pd(cp);
            row[1] = _mm256_loadu_pd(cp.add(4));
        }
        let (mut ap, mut bp) = (a, b);
        for _ in 0..k {
            let b0 = _mm256_loadu_pd(bp);
            let b1 = _mm256_loadu_pd(bp.add(4));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_sd(&*ap.add(i));
                row[0] = _mm256_fmadd_pd(av, b0, row[0]);
                row[1] = _mm256_fmadd_pd(av, b1, row[1]);
            }
            ap = ap.offset(a_ks);
            bp = bp.offset(b_ks);
        }
        for (i, row) in acc.iter().enumerate() {
            let cp = c.offset(i as isize * c_rs);
            _mm256_storeu_pd(cp, row[0]);
            _mm256_storeu_pd(cp.add(4), row[1]);
        }
    }
}

/// An `extern "C"` entry (`GemmF32Entry` / `GemmF64Entry`) running `$kernel` on the tiles of
/// `$tile` through `drive` (the generic loop for the rest). One per variant and dtype: the
/// JIT binds the symbol of the selected one.
macro_rules! entry {
    ($(#[$doc:meta])* $name:ident, $t:ty, $tile:expr, $kernel:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As `gemm_generic`, and the CPU has the variant's features (`Variant::supported`).
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe extern "C" fn $name(
            mr: i64,
            nr: i64,
            k: i64,
            c: *mut $t,
            c_rs: i64,
            c_cs: i64,
            a: *const $t,
            a_ks: i64,
            a_ms: i64,
            b: *const $t,
            b_ks: i64,
            b_ns: i64,
        ) {
            let mut kern = |k, a, a_ks, b, b_ks, c, c_rs| {
                // SAFETY: `drive` passes kernel tiles inside the caller's regions; the CPU
                // has the kernel's features (entry contract).
                unsafe { $kernel(k, a, a_ks, b, b_ks, c, c_rs) }
            };
            // SAFETY: forwarded contract.
            unsafe {
                drive(
                    $tile, &mut kern, mr, nr, k, c, c_rs, c_cs, a, a_ks, a_ms, b, b_ks, b_ns,
                )
            }
        }
    };
}

entry!(
    /// The AVX-512 variant's f32 entry.
    gemm_f32_avx512, f32, (12, 32), k12x32
);
entry!(
    /// The AVX2 variant's f32 entry (AVX2 and FMA).
    gemm_f32_avx2, f32, (6, 16), k6x16
);
entry!(
    /// The AVX-512 variant's f64 entry.
    gemm_f64_avx512, f64, (12, 16), k12x16_f64
);
entry!(
    /// The AVX2 variant's f64 entry (AVX2 and FMA).
    gemm_f64_avx2, f64, (6, 8), k6x8_f64
);
