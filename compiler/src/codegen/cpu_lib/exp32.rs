//! rivet's float32 `exp`: the definition every CPU path computes (the interpreter, scalar
//! Cranelift code through `rivet_expf`, and the packed f32x4 code of
//! `cranelift/vector_exp.rs`), bit for bit.
//!
//! Why not libm's `expf` (musl's, what float32 `exp` was until 2026-11): its algorithm
//! needs a division and a three-way choice of the reduction per lane; as f32x4 instructions
//! it was 55 instructions per four lanes and softmax's exponentials took three quarters of
//! its time. This one is a Cody-Waite reduction, a degree-6 polynomial and a scaling: about
//! 25 instructions per four lanes, no division, and every step is a float32 IEEE operation
//! (no fused multiply-add), so any implementation performing the same operations in the same
//! order gives the same bits.
//!
//! Accuracy: at most 1 ulp from the correctly rounded result on every float32 of the fast
//! range (`FAST_LO < x < FAST_HI`, checked exhaustively by `exhaustive_fast_range`, an
//! `--ignored` test: 99.2% correctly rounded), the same bound as musl's. Outside it: NaN gives
//! NaN, `x >= 89` gives +inf, `x <= -104` gives +0, and in between the same reduction with
//! the scaling split in two so subnormal results are rounded once and overflow gives +inf.
//!
//! Invariants (what a vector implementation must keep):
//! - a lane is on the fast path exactly when `FAST_LO < x < FAST_HI` (false for NaN);
//! - the fast path is `fast` below, operation for operation;
//! - a vector with any lane off the fast path may compute every lane with `exp32`.

/// `1 / ln 2` rounded to float32.
pub const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
/// The high part of `ln 2`: nine trailing zero bits, so `k * LN2_HI` is exact for `|k| < 2^8`.
pub const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
/// `ln 2 - LN2_HI`, rounded.
pub const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
/// `1.5 * 2^23`: `t = x / ln 2 + MAGIC` rounds `x / ln 2` to the nearest integer `k` (ties to
/// even) and holds `k` in the low bits of its significand (`t`'s bits are `MAGIC_BITS + k`).
pub const MAGIC: f32 = 12_582_912.0;
pub const MAGIC_BITS: i32 = 0x4b40_0000;
/// Added to `t`'s bits and shifted left by 23, gives the bits of `2^k` (`k + 127` is the
/// biased exponent; wrapping arithmetic).
pub const SCALE_BIAS: i32 = 127i32.wrapping_sub(MAGIC_BITS);
/// `e^r ~ 1 + r + r^2 * (C[0] + C[1] r + C[2] r^2 + C[3] r^3 + C[4] r^4)` on `|r| <= ln2 / 2`:
/// a weighted least-squares fit of the relative error at Chebyshev nodes (Lawson's
/// iteration, float64), rounded to float32; relative error 3.1e-9 before float32 rounding.
pub const C: [f32; 5] = [
    f32::from_bits(0x3eff_fffe),
    f32::from_bits(0x3e2a_aa48),
    f32::from_bits(0x3d2a_ac7c),
    f32::from_bits(0x3c09_1d81),
    f32::from_bits(0x3ab5_112b),
];
/// The fast range, exclusive: `k` stays in `[-126, 127]`, so `2^k` is a normal float32 and
/// the result is `y * 2^k` with one rounding.
pub const FAST_LO: f32 = -87.0;
pub const FAST_HI: f32 = 88.0;

/// `exp(x)` in float32, rivet's definition (module doc).
pub fn exp32(x: f32) -> f32 {
    if x > FAST_LO && x < FAST_HI {
        return fast(x);
    }
    if x.is_nan() {
        return x;
    }
    if x >= 89.0 {
        return f32::INFINITY;
    }
    if x <= -104.0 {
        return 0.0;
    }
    // 87 <= |x| < 104: k in [-151, 129]; 2^k split into two normal factors.
    let (k, y) = reduce(x);
    let k1 = k / 2;
    (y * pow2(k1)) * pow2(k - k1)
}

/// The fast path, `FAST_LO < x < FAST_HI`.
#[inline(always)]
pub fn fast(x: f32) -> f32 {
    let t = x * INV_LN2 + MAGIC;
    let y = poly(x, t);
    let scale = f32::from_bits(
        (t.to_bits() as i32)
            .wrapping_add(SCALE_BIAS)
            .wrapping_shl(23) as u32,
    );
    y * scale
}

/// `e^r` for the reduced argument of `x` given `t` (`fast`'s steps, in order).
#[inline(always)]
fn poly(x: f32, t: f32) -> f32 {
    let kf = t - MAGIC;
    let r = x - kf * LN2_HI;
    let r = r - kf * LN2_LO;
    let p = C[4] * r + C[3];
    let p = p * r + C[2];
    let p = p * r + C[1];
    let p = p * r + C[0];
    let q = r + (r * r) * p;
    1.0 + q
}

/// `(k, e^r)` with `x = k ln2 + r`, for `|x| < 104`.
fn reduce(x: f32) -> (i32, f32) {
    let t = x * INV_LN2 + MAGIC;
    ((t.to_bits() as i32).wrapping_sub(MAGIC_BITS), poly(x, t))
}

/// `2^k` for `-126 <= k <= 127`.
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Whether generated code computes a contiguous run of float32 `exp(x - s)` with one call of
/// `exp_sub_run` (AVX-512: sixteen lanes per instruction) instead of an inline f32x4 loop:
/// only on a CPU with AVX-512F, detected where the code is compiled, which is where it runs;
/// `RIVET_EXP_RUN=inline` keeps the inline loop (tests cover both on one machine).
pub fn run_wide() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static INLINE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let inline =
            *INLINE.get_or_init(|| std::env::var("RIVET_EXP_RUN").is_ok_and(|v| v == "inline"));
        std::arch::is_x86_feature_detected!("avx512f") && !inline
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `y[i] = exp32(x[i] - s)` for `i < n`, in order of chunks; `y == x` (in place) allowed.
/// AVX-512 when the CPU has it (each lane the same float32 operations as `fast`, so the bits
/// are `exp32`'s), else lane by lane.
///
/// # Safety
/// `x` valid for reads and `y` for writes of `n` floats; the two runs are the same or do not
/// overlap.
pub unsafe fn exp_sub_run(y: *mut f32, x: *const f32, n: usize, s: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the feature was detected; the caller's contract.
        return unsafe { avx512::exp_sub_run(y, x, n, s) };
    }
    for i in 0..n {
        // SAFETY: the caller's contract; element i is read before it is written.
        unsafe { *y.add(i) = exp32(*x.add(i) - s) };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{exp32, C, FAST_HI, FAST_LO, INV_LN2, LN2_HI, LN2_LO, MAGIC, SCALE_BIAS};
    use std::arch::x86_64::*;

    /// `super::exp_sub_run` on sixteen lanes at a time; the last partial chunk masked.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn exp_sub_run(y: *mut f32, x: *const f32, n: usize, s: f32) {
        let sv = _mm512_set1_ps(s);
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: elements i..i + 16 are inside both runs.
            unsafe {
                let v = _mm512_sub_ps(_mm512_loadu_ps(x.add(i)), sv);
                _mm512_storeu_ps(y.add(i), exp16(v));
            }
            i += 16;
        }
        if i < n {
            let m: __mmask16 = ((1u32 << (n - i)) - 1) as u16;
            // SAFETY: masked lanes are neither read nor written.
            unsafe {
                let v = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x.add(i)), sv);
                _mm512_mask_storeu_ps(y.add(i), m, exp16(v));
            }
        }
    }

    /// `exp32` of sixteen lanes: `super::fast` operation for operation on every lane, then the
    /// lanes outside the fast range recomputed by the scalar function.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp16(x: __m512) -> __m512 {
        let c = _mm512_set1_ps;
        let ok = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, c(FAST_LO))
            & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, c(FAST_HI));
        let t = _mm512_add_ps(_mm512_mul_ps(x, c(INV_LN2)), c(MAGIC));
        let kf = _mm512_sub_ps(t, c(MAGIC));
        let r = _mm512_sub_ps(x, _mm512_mul_ps(kf, c(LN2_HI)));
        let r = _mm512_sub_ps(r, _mm512_mul_ps(kf, c(LN2_LO)));
        let p = _mm512_add_ps(_mm512_mul_ps(c(C[4]), r), c(C[3]));
        let p = _mm512_add_ps(_mm512_mul_ps(p, r), c(C[2]));
        let p = _mm512_add_ps(_mm512_mul_ps(p, r), c(C[1]));
        let p = _mm512_add_ps(_mm512_mul_ps(p, r), c(C[0]));
        let q = _mm512_add_ps(r, _mm512_mul_ps(_mm512_mul_ps(r, r), p));
        let yv = _mm512_add_ps(c(1.0), q);
        let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_castps_si512(t),
            _mm512_set1_epi32(SCALE_BIAS),
        ));
        let out = _mm512_mul_ps(yv, _mm512_castsi512_ps(e));
        if ok == 0xffff {
            return out;
        }
        slow_lanes(x, out, ok)
    }

    /// `out` with the lanes not in `ok` replaced by the scalar `exp32` of `x`'s.
    #[cold]
    #[inline(never)]
    #[target_feature(enable = "avx512f")]
    fn slow_lanes(x: __m512, out: __m512, ok: __mmask16) -> __m512 {
        let mut xs = [0f32; 16];
        let mut ys = [0f32; 16];
        // SAFETY: sixteen floats each.
        unsafe {
            _mm512_storeu_ps(xs.as_mut_ptr(), x);
            _mm512_storeu_ps(ys.as_mut_ptr(), out);
        }
        for l in 0..16 {
            if ok & (1 << l) == 0 {
                ys[l] = exp32(xs[l]);
            }
        }
        // SAFETY: as above.
        unsafe { _mm512_loadu_ps(ys.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in ulps between two finite float32s of the same sign (or zeros).
    fn ulps(a: f32, b: f32) -> u32 {
        let key = |v: f32| {
            let i = v.to_bits() as i32;
            if i < 0 {
                i32::MIN - i
            } else {
                i
            }
        };
        key(a).abs_diff(key(b))
    }

    /// The correctly rounded float32 exp, through float64 (double rounding is rare and would
    /// show as a 1-ulp difference, within the bound checked).
    fn reference(x: f32) -> f32 {
        (x as f64).exp() as f32
    }

    /// `exp32` within 1 ulp of the reference on every `step`-th bit pattern.
    fn check_every(step: u32) {
        for bits in (0..=u32::MAX).step_by(step as usize) {
            let x = f32::from_bits(bits);
            let got = exp32(x);
            let want = reference(x);
            if x.is_nan() {
                assert!(got.is_nan(), "exp32({bits:#x}) = {got}");
                continue;
            }
            let d = ulps(got, want);
            assert!(d <= 1, "exp32({x:e}) = {got:e}, want {want:e}: {d} ulp");
        }
    }

    #[test]
    fn within_one_ulp_on_a_sample_of_every_float32() {
        // Every 997th bit pattern: all signs, NaNs, subnormal results, overflow.
        check_every(997);
    }

    #[test]
    fn special_values_and_range_edges() {
        assert_eq!(exp32(0.0), 1.0);
        assert_eq!(exp32(-0.0), 1.0);
        assert_eq!(exp32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp32(f32::NEG_INFINITY), 0.0);
        assert!(exp32(f32::NAN).is_nan());
        assert_eq!(exp32(88.8), f32::INFINITY);
        assert_eq!(exp32(-105.0), 0.0);
        assert_eq!(exp32(1.0), std::f32::consts::E);
        for x in [
            FAST_LO,
            FAST_HI,
            f32::from_bits(FAST_LO.to_bits() - 1),
            f32::from_bits(FAST_HI.to_bits() - 1),
            88.72,
            88.7228,
            -87.33655,
            -100.0,
            -103.9,
            1e-30,
            -1e-30,
            f32::MIN_POSITIVE,
        ] {
            let (got, want) = (exp32(x), reference(x));
            assert!(
                ulps(got, want) <= 1,
                "exp32({x:e}) = {got:e}, want {want:e}"
            );
        }
    }

    #[test]
    fn runs_equal_the_scalar_function_bit_for_bit() {
        // Fast and slow lanes mixed, every length up to 40 (masked tails), and in place.
        let pick = |k: usize| match k % 13 {
            0 => f32::NAN,
            1 => 95.0,
            2 => -100.0,
            3 => f32::INFINITY,
            4 => -0.0,
            5 => f32::NEG_INFINITY,
            _ => (k as f32 - 300.0) * 0.37,
        };
        for n in (0..=40).chain([1023, 1024]) {
            for s in [0.0f32, 1.5, -7.25] {
                let x: Vec<f32> = (0..n).map(pick).collect();
                let mut y = vec![f32::from_bits(0x7fc0_1234); n + 1];
                // SAFETY: n floats each; y has one more, which must stay untouched.
                unsafe { exp_sub_run(y.as_mut_ptr(), x.as_ptr(), n, s) };
                let mut inplace = x.clone();
                let p = inplace.as_mut_ptr();
                // SAFETY: the same run, in place.
                unsafe { exp_sub_run(p, p, n, s) };
                for k in 0..n {
                    let want = exp32(x[k] - s);
                    for got in [y[k], inplace[k]] {
                        assert!(
                            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                            "n {n} s {s} lane {k}: exp({:e} - s) = {got:e}, want {want:e}",
                            x[k]
                        );
                    }
                }
                assert_eq!(y[n].to_bits(), 0x7fc0_1234, "past the run");
            }
        }
    }

    #[test]
    #[ignore = "every float32 of the fast range, about a minute"]
    fn exhaustive_fast_range() {
        let mut worst = 0;
        let mut x = f32::from_bits(FAST_LO.to_bits() - 1);
        while x < FAST_HI {
            let d = ulps(exp32(x), reference(x));
            assert!(d <= 1, "exp32({x:e}): {d} ulp");
            worst = worst.max(d);
            x = if x == 0.0 {
                f32::from_bits(1)
            } else if x < 0.0 {
                f32::from_bits(x.to_bits() - 1)
            } else {
                f32::from_bits(x.to_bits() + 1)
            };
        }
        assert_eq!(worst, 1);
    }
}
