//! Four float32 `exp`s at once, bit for bit `libm::expf` (the scalar `exp` every backend and
//! the interpreter use, `codegen::cpu_lib::math`), so vectorized code keeps the oracle's exact results.
//!
//! libm's `expf` (FreeBSD's) reduces `x = k ln2 + r` with `k = trunc(x / ln2 +- 0.5)` (or
//! `+-1`, or 0 by range), evaluates a rational approximation in float32, and scales by `2^k`.
//! On x86-64 the same float32 operations, in the same order, run on four lanes with SSE2 (the
//! baseline: no feature detection): multiplies and adds round exactly as the scalar ones (Rust
//! never contracts them into FMAs), `cvttps2dq` truncates as `as i32` does for the values that
//! occur, and the final `scalbnf(y, k)` is one multiplication by `2^k` for `|k| <= 126`. Lanes
//! outside the main range (`|x| <= 2^-14`, `|x| >= 87.3`, NaN, infinities) send all four to the
//! scalar function. Elsewhere (aarch64) the scalar function runs per lane.

/// `[expf(x[0]), ..., expf(x[3])]`, equal in bits to `libm::expf` lane by lane.
pub fn expf4(x: [f32; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE2 is part of the x86-64 baseline.
        if let Some(y) = unsafe { sse2(x) } {
            return y;
        }
    }
    x.map(libm::expf)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
unsafe fn sse2(x4: [f32; 4]) -> Option<[f32; 4]> {
    use std::arch::x86_64::*;
    // libm's constants, by their bits.
    const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
    const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
    const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
    const P1: f32 = 1.666_662_5e-1;
    const P2: f32 = -2.766_733_3e-3;
    // SAFETY: SSE2 intrinsics on values (SSE2 is enabled); the load reads `x4`'s four floats
    // and the store writes `out`'s.
    unsafe {
        let x = _mm_loadu_ps(x4.as_ptr());
        let bits = _mm_castps_si128(x);
        let hx = _mm_and_si128(bits, _mm_set1_epi32(0x7fff_ffff));
        // The main range of every lane: 2^-14 < |x| < 87.3 (libm's thresholds).
        let above = _mm_cmpgt_epi32(hx, _mm_set1_epi32(0x3900_0000));
        let below = _mm_cmplt_epi32(hx, _mm_set1_epi32(0x42ae_ac50));
        if _mm_movemask_ps(_mm_castsi128_ps(_mm_and_si128(above, below))) != 0xF {
            return None;
        }
        let sign = _mm_srli_epi32(bits, 31);
        // |x| > 1.5 ln2: k = trunc(INV_LN2 * x + (sign ? -0.5 : 0.5)).
        let half = _mm_or_ps(_mm_set1_ps(0.5), _mm_castsi128_ps(_mm_slli_epi32(sign, 31)));
        let k_big = _mm_cvttps_epi32(_mm_add_ps(_mm_mul_ps(_mm_set1_ps(INV_LN2), x), half));
        // 0.5 ln2 < |x| <= 1.5 ln2: k = 1 - 2 sign; below: k = 0.
        let k_mid = _mm_sub_epi32(_mm_set1_epi32(1), _mm_add_epi32(sign, sign));
        let big = _mm_cmpgt_epi32(hx, _mm_set1_epi32(0x3f85_1592));
        let mid = _mm_cmpgt_epi32(hx, _mm_set1_epi32(0x3eb1_7218));
        let pick = |m: __m128i, a: __m128i, b: __m128i| {
            _mm_or_si128(_mm_and_si128(m, a), _mm_andnot_si128(m, b))
        };
        let k = pick(big, k_big, _mm_and_si128(mid, k_mid));
        // With k = 0 these give hi = x, lo = 0, r = x exactly, as libm's small branch.
        let kf = _mm_cvtepi32_ps(k);
        let hi = _mm_sub_ps(x, _mm_mul_ps(kf, _mm_set1_ps(LN2_HI)));
        let lo = _mm_mul_ps(kf, _mm_set1_ps(LN2_LO));
        let r = _mm_sub_ps(hi, lo);
        let rr = _mm_mul_ps(r, r);
        let poly = _mm_add_ps(_mm_set1_ps(P1), _mm_mul_ps(rr, _mm_set1_ps(P2)));
        let c = _mm_sub_ps(r, _mm_mul_ps(rr, poly));
        let q = _mm_div_ps(_mm_mul_ps(r, c), _mm_sub_ps(_mm_set1_ps(2.0), c));
        let y = _mm_add_ps(_mm_set1_ps(1.0), _mm_add_ps(_mm_sub_ps(q, lo), hi));
        // scalbnf(y, k) = y * 2^k for |k| <= 126; k = 0 multiplies by 1.
        let scale = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(k, _mm_set1_epi32(127)), 23));
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), _mm_mul_ps(y, scale));
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::lanes_check::{around, check, check_all, sweep};
    use super::expf4;

    /// Every 61st float of the main range, both signs, plus the thresholds of each branch and
    /// what falls back (tiny, huge, NaN, infinities, subnormals, signed zeros) mixed into
    /// main-range vectors.
    #[test]
    fn expf4_equals_libm_bit_for_bit() {
        let mut xs = sweep(0x3900_0001, 0x42ae_ac50, 61);
        xs.extend(around(&[
            0x3900_0000,
            0x3eb1_7218,
            0x3f85_1592,
            0x42ae_ac50,
            0x42b1_7218,
            0x42cf_f1b5,
        ]));
        xs.extend([
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE / 3.0,
            88.0,
            -103.0,
            -200.0,
            1e-30,
            0.5,
        ]);
        check("expf4", expf4, libm::expf, &xs, 0.0);
        // Fallback lanes next to main-range ones.
        let mixed = [1.0, f32::NAN, -2.0, 3.0, 1e-20, 0.3, -0.7, 50.0];
        check("expf4", expf4, libm::expf, &mixed, 0.0);
    }

    /// Every float32 of the main range, both signs (324 million values; a few seconds in
    /// release): `cargo test --release -p rivet-compiler expf4 -- --ignored`.
    #[test]
    #[ignore]
    fn expf4_equals_libm_on_every_main_range_float() {
        check_all("expf4", expf4, libm::expf, 0x3900_0001, 0x42ae_ac50);
    }
}
