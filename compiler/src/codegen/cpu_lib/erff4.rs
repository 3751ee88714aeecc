//! Four float32 `erf`s at once, bit for bit `libm::erff` (the scalar `erf` every backend and
//! the interpreter use, `codegen::cpu_lib::math`), so vectorized code keeps the oracle's exact results.
//!
//! libm's `erff` (FreeBSD's) picks one of four rational approximations by `|x|` (below
//! 0.84375, below 1.25, below 1/0.35, below 6; `erfc` times two `expf`s for the last two) and
//! returns `+-(1 - 2^-120)` from 6 on. With SSE2 (the x86-64 baseline) every branch some lane
//! needs is computed on all four lanes with the same float32 operations in the same order
//! (Rust never contracts a multiply and an add), and each lane takes its own branch's value;
//! the `expf`s go through `expf4`. Lanes libm treats apart (`|x| < 2^-28`, NaN, infinities)
//! send all four to the scalar function, as does anything on other architectures.

/// `[erff(x[0]), ..., erff(x[3])]`, equal in bits to `libm::erff` lane by lane.
pub fn erff4(x: [f32; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE2 is part of the x86-64 baseline.
        if let Some(y) = unsafe { sse2(x) } {
            return y;
        }
    }
    x.map(libm::erff)
}

// libm's coefficients (erff.rs), by their bits.
pub(crate) const ERX: f32 = f32::from_bits(0x3f58_560b);
pub(crate) const PP: [f32; 5] = [
    f32::from_bits(0x3e03_75d4),
    f32::from_bits(0xbea6_6beb),
    f32::from_bits(0xbce9_528f),
    f32::from_bits(0xbbbd_1489),
    f32::from_bits(0xb7c7_56b1),
];
pub(crate) const QQ: [f32; 5] = [
    f32::from_bits(0x3ecb_bbce),
    f32::from_bits(0x3d85_2a63),
    f32::from_bits(0x3ba6_8116),
    f32::from_bits(0x390a_ee49),
    f32::from_bits(0xb684_e21a),
];
pub(crate) const PA: [f32; 7] = [
    f32::from_bits(0xbb1a_cdc6),
    f32::from_bits(0x3ed4_6805),
    f32::from_bits(0xbebe_9208),
    f32::from_bits(0x3ea2_fe54),
    f32::from_bits(0xbde3_1cc2),
    f32::from_bits(0x3d11_51b3),
    f32::from_bits(0xbb0d_f9c0),
];
pub(crate) const QA: [f32; 6] = [
    f32::from_bits(0x3dd9_f331),
    f32::from_bits(0x3f0a_5785),
    f32::from_bits(0x3d93_1ae7),
    f32::from_bits(0x3e01_3307),
    f32::from_bits(0x3c5f_6e13),
    f32::from_bits(0x3c44_5aa3),
];
pub(crate) const RA: [f32; 8] = [
    f32::from_bits(0xbc21_a093),
    f32::from_bits(0xbf31_a0b7),
    f32::from_bits(0xc128_f022),
    f32::from_bits(0xc279_8057),
    f32::from_bits(0xc322_658c),
    f32::from_bits(0xc338_9ae7),
    f32::from_bits(0xc2a2_932b),
    f32::from_bits(0xc11d_077e),
];
pub(crate) const SA: [f32; 8] = [
    f32::from_bits(0x419d_35ce),
    f32::from_bits(0x4309_a863),
    f32::from_bits(0x43d9_486f),
    f32::from_bits(0x4421_58c9),
    f32::from_bits(0x43d6_810b),
    f32::from_bits(0x42d9_451f),
    f32::from_bits(0x40d2_3f7c),
    f32::from_bits(0xbd77_7f97),
];
pub(crate) const RB: [f32; 7] = [
    f32::from_bits(0xbc21_a092),
    f32::from_bits(0xbf4c_9dd4),
    f32::from_bits(0xc18e_104b),
    f32::from_bits(0xc320_a2ea),
    f32::from_bits(0xc41f_6441),
    f32::from_bits(0xc480_230b),
    f32::from_bits(0xc3f1_c275),
];
pub(crate) const SB: [f32; 7] = [
    f32::from_bits(0x41f2_b459),
    f32::from_bits(0x43a2_e571),
    f32::from_bits(0x44c0_1759),
    f32::from_bits(0x4547_fdbb),
    f32::from_bits(0x451f_90ce),
    f32::from_bits(0x43ed_43a7),
    f32::from_bits(0xc1b3_8712),
];

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
unsafe fn sse2(x4: [f32; 4]) -> Option<[f32; 4]> {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 intrinsics on values (SSE2 is enabled); loads and stores go through
    // four-float arrays.
    unsafe {
        let x = _mm_loadu_ps(x4.as_ptr());
        let bits = _mm_castps_si128(x);
        let ix = _mm_and_si128(bits, _mm_set1_epi32(0x7fff_ffff));
        let below = |t: i32| _mm_castsi128_ps(_mm_cmplt_epi32(ix, _mm_set1_epi32(t)));
        // libm's special cases: |x| < 2^-28, NaN and infinities.
        let regular = _mm_andnot_ps(below(0x3180_0000), below(0x7f80_0000));
        if _mm_movemask_ps(regular) != 0xF {
            return None;
        }
        let set = _mm_set1_ps;
        // p0 + z * (p1 + z * (... + z * pn)), innermost first, as libm writes it.
        let horner = |z: __m128, c: &[f32]| {
            let mut acc = set(c[c.len() - 1]);
            for &k in c[..c.len() - 1].iter().rev() {
                acc = _mm_add_ps(set(k), _mm_mul_ps(z, acc));
            }
            acc
        };
        // 1 + z * (q1 + z * (... + z * qn)).
        let one_plus = |z: __m128, c: &[f32]| _mm_add_ps(set(1.0), _mm_mul_ps(z, horner(z, c)));
        let pick =
            |m: __m128, a: __m128, b: __m128| _mm_or_ps(_mm_and_ps(m, a), _mm_andnot_ps(m, b));
        let sign = _mm_castsi128_ps(_mm_and_si128(bits, _mm_set1_epi32(i32::MIN)));
        // `sign ? -y : y`, as a flip of y's sign bit (y >= 0 wherever it is used).
        let signed = |y: __m128| _mm_xor_ps(y, sign);
        let ax = _mm_castsi128_ps(ix);
        let (m_a, m_b, m_c) = (below(0x3f58_0000), below(0x3fa0_0000), below(0x40c0_0000));
        let any = |m: __m128| _mm_movemask_ps(m) != 0;
        // |x| >= 6: 1 - 2^-120.
        let mut y = signed(_mm_sub_ps(set(1.0), set(f32::from_bits(0x0380_0000))));
        // 1.25 <= |x| < 6: 1 - erfc, erfc = expf(-z z - 0.5625) expf((z - x)(z + x) + r / s) / x.
        let m_cd = _mm_andnot_ps(m_b, m_c);
        if any(m_cd) {
            // Other lanes compute with |x| = 2 (anything in range: no NaN, no expf fallback).
            let xa = pick(m_cd, ax, set(2.0));
            let s = _mm_div_ps(set(1.0), _mm_mul_ps(xa, xa));
            let near = _mm_castsi128_ps(_mm_cmplt_epi32(
                _mm_castps_si128(xa),
                _mm_set1_epi32(0x4036_db6d),
            ));
            // Each range's rational function only when a lane of this branch needs it (the
            // far one is rare for activations).
            let near_cd = _mm_and_ps(m_cd, near);
            let far_cd = _mm_andnot_ps(near, m_cd);
            let (r, big_s) = match (any(near_cd), any(far_cd)) {
                (true, false) => (horner(s, &RA), one_plus(s, &SA)),
                (false, true) => (horner(s, &RB), one_plus(s, &SB)),
                _ => (
                    pick(near, horner(s, &RA), horner(s, &RB)),
                    pick(near, one_plus(s, &SA), one_plus(s, &SB)),
                ),
            };
            let z = _mm_castsi128_ps(_mm_and_si128(
                _mm_castps_si128(xa),
                _mm_set1_epi32(0xffff_e000u32 as i32),
            ));
            let e1 = _mm_sub_ps(_mm_mul_ps(_mm_xor_ps(z, set(-0.0)), z), set(0.5625));
            let e2 = _mm_add_ps(
                _mm_mul_ps(_mm_sub_ps(z, xa), _mm_add_ps(z, xa)),
                _mm_div_ps(r, big_s),
            );
            let exp = |v: __m128| {
                let mut a = [0f32; 4];
                _mm_storeu_ps(a.as_mut_ptr(), v);
                let e = super::expf4::expf4(a);
                _mm_loadu_ps(e.as_ptr())
            };
            let erfc = _mm_div_ps(_mm_mul_ps(exp(e1), exp(e2)), xa);
            y = pick(m_cd, signed(_mm_sub_ps(set(1.0), erfc)), y);
        }
        // 0.84375 <= |x| < 1.25: 1 - erfc1, erfc1 = (1 - ERX) - p / q with s = |x| - 1.
        let m_b_only = _mm_andnot_ps(m_a, m_b);
        if any(m_b_only) {
            let s = _mm_sub_ps(ax, set(1.0));
            let p = horner(s, &PA);
            let q = one_plus(s, &QA);
            let erfc = _mm_sub_ps(_mm_sub_ps(set(1.0), set(ERX)), _mm_div_ps(p, q));
            y = pick(m_b_only, signed(_mm_sub_ps(set(1.0), erfc)), y);
        }
        // |x| < 0.84375: x + x * (r / s) with z = x * x.
        if any(m_a) {
            let z = _mm_mul_ps(x, x);
            let r = horner(z, &PP);
            let s = one_plus(z, &QQ);
            let ya = _mm_add_ps(x, _mm_mul_ps(x, _mm_div_ps(r, s)));
            y = pick(m_a, ya, y);
        }
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), y);
        Some(out)
    }
}

/// The thresholds of libm's `erff` branches, by bits (for the tests).
#[cfg(test)]
pub(crate) const THRESHOLDS: [u32; 5] = [
    0x3180_0000,
    0x3f58_0000,
    0x3fa0_0000,
    0x4036_db6d,
    0x40c0_0000,
];

#[cfg(test)]
mod tests {
    use super::super::lanes_check::{around, check, check_all, sweep};
    use super::{erff4, THRESHOLDS};

    /// Every 61st float from 2^-28 up, both signs, plus each branch's thresholds and what
    /// falls back (tiny, NaN, infinities, signed zeros) mixed into vectors of regular lanes.
    #[test]
    fn erff4_equals_libm_bit_for_bit() {
        let mut xs = sweep(0x3180_0000, 0x7f80_0000, 61);
        xs.extend(around(&THRESHOLDS));
        xs.extend([
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-30,
            0.5,
            7.0,
        ]);
        check("erff4", erff4, libm::erff, &xs, 0.0);
        let mixed = [
            1.0,
            f32::NAN,
            -2.0,
            3.0,
            1e-20,
            0.3,
            -0.7,
            50.0,
            0.1,
            1.0,
            2.5,
            5.9,
        ];
        check("erff4", erff4, libm::erff, &mixed, 0.0);
    }

    /// Every float32 from 2^-28 to infinity, both signs (about 2.1 billion values; a minute or
    /// two in release): `cargo test --release -p rivet-compiler erff4 -- --ignored`.
    #[test]
    #[ignore]
    fn erff4_equals_libm_on_every_regular_float() {
        check_all("erff4", erff4, libm::erff, 0x3180_0000, 0x7f80_0000);
    }
}
