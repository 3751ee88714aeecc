//! Sixteen float32 `erf`s at once, bit for bit `libm::erff`: `erff4`'s algorithm on AVX-512
//! registers, else on two AVX2 registers, chosen at run time (`is_x86_feature_detected!`),
//! else four `erff4` calls.
//!
//! Why sixteen: `erf` is the cost of a GELU, and with 128-bit vectors (all Cranelift emits)
//! each call of `rivet_erff4` computes four lanes; one AVX-512 call computes sixteen with the
//! same instruction count. The CPU's vectorize pass gives a float32 loop that computes `erf`
//! sixteen lanes (`lower::vectorize`), and the Cranelift code makes one `rivet_erff16` call
//! per sixteen (`cranelift/vector.rs`, `erf16_lanes`).
//!
//! Same float32 operations in the same order as libm, lane by lane (Rust never contracts a
//! multiply and an add; masked blends pick each lane's branch), `expf` as `expf4` computes it
//! (libm's sequence) on sixteen lanes. Lanes libm treats apart (`|x| < 2^-28`, NaN,
//! infinities for `erf`; outside `2^-14 < |x| < 87.3` for `exp`) take the scalar function,
//! lane by lane.

/// `erff` of each of the sixteen lanes, equal in bits to `libm::erff`.
pub fn erff16(x: [f32; 16]) -> [f32; 16] {
    #[cfg(target_arch = "x86_64")]
    {
        match path() {
            // SAFETY: AVX-512F is present (`path` checked it).
            Path::Avx512 => return unsafe { avx512::erff16(x) },
            Path::Avx2 => return by_eights(x),
            Path::Fours => {}
        }
    }
    by_fours(x)
}

/// Two AVX2 `erff8` calls (machines with AVX2 and no AVX-512); four `erff4` calls without AVX2.
pub fn by_eights(x: [f32; 16]) -> [f32; 16] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut y = x;
            // SAFETY: AVX2 is present; `y` holds sixteen floats.
            unsafe { avx2::erff16_at(y.as_mut_ptr()) };
            return y;
        }
    }
    by_fours(x)
}

use crate::target::{erf16_path as path, Erf16Path as Path};

/// `expf` of each of the sixteen lanes, equal in bits to `libm::expf` (`expf4`'s sequence on
/// AVX-512 registers, else four `expf4` calls).
pub fn expf16(x: [f32; 16]) -> [f32; 16] {
    let mut y = x;
    // SAFETY: `y` holds sixteen floats.
    unsafe { expf16_in_place(y.as_mut_ptr()) };
    y
}

/// `expf16` of the sixteen floats at `p`, in place (the generated code's helper).
///
/// # Safety
/// `p` must be valid for reads and writes of sixteen f32.
pub unsafe fn expf16_in_place(p: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    {
        match path() {
            // SAFETY: the feature is present (`path` checked it); the caller's contract.
            Path::Avx512 => return unsafe { avx512::expf16_at(p) },
            // SAFETY: as above.
            Path::Avx2 => return unsafe { avx2::expf16_at(p) },
            Path::Fours => {}
        }
    }
    for q in 0..4 {
        // SAFETY: the caller's contract: four floats at `p + 4q`.
        unsafe {
            let v = p.add(4 * q).cast::<[f32; 4]>().read_unaligned();
            p.add(4 * q)
                .cast::<[f32; 4]>()
                .write_unaligned(super::expf4::expf4(v));
        }
    }
}

/// `erff16` of the sixteen floats at `p`, in place (the generated code's helper).
///
/// # Safety
/// `p` must be valid for reads and writes of sixteen f32.
pub unsafe fn erff16_in_place(p: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    {
        match path() {
            // SAFETY: the feature is present (`path` checked it); the caller's contract.
            Path::Avx512 => return unsafe { avx512::erff16_at(p) },
            // SAFETY: as above.
            Path::Avx2 => return unsafe { avx2::erff16_at(p) },
            Path::Fours => {}
        }
    }
    // SAFETY: the caller's contract.
    unsafe {
        let x = p.cast::<[f32; 16]>().read_unaligned();
        p.cast::<[f32; 16]>().write_unaligned(by_fours(x));
    }
}

/// Four `erff4` calls (machines without AVX2, or `RIVET_ERF16=portable`).
pub fn by_fours(x: [f32; 16]) -> [f32; 16] {
    let mut out = [0f32; 16];
    for q in 0..4 {
        let mut v = [0f32; 4];
        v.copy_from_slice(&x[4 * q..4 * q + 4]);
        out[4 * q..4 * q + 4].copy_from_slice(&super::erff4::erff4(v));
    }
    out
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::super::erff4::{ERX, PA, PP, QA, QQ, RA, RB, SA, SB};
    use std::arch::x86_64::*;

    /// libm's `expf` on sixteen lanes (`expf4`'s sequence); lanes outside its main range
    /// take `libm::expf`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn expf16(x: __m512) -> __m512 {
        const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
        const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
        const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
        const P1: f32 = 1.666_662_5e-1;
        const P2: f32 = -2.766_733_3e-3;
        let seti = _mm512_set1_epi32;
        let set = _mm512_set1_ps;
        let bits = _mm512_castps_si512(x);
        let hx = _mm512_and_si512(bits, seti(0x7fff_ffff));
        let main = _mm512_cmpgt_epi32_mask(hx, seti(0x3900_0000))
            & _mm512_cmplt_epi32_mask(hx, seti(0x42ae_ac50));
        let sign = _mm512_srli_epi32::<31>(bits);
        let half = _mm512_castsi512_ps(_mm512_or_si512(
            seti(0.5f32.to_bits() as i32),
            _mm512_slli_epi32::<31>(sign),
        ));
        let k_big = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(set(INV_LN2), x), half));
        let k_mid = _mm512_sub_epi32(seti(1), _mm512_add_epi32(sign, sign));
        let big = _mm512_cmpgt_epi32_mask(hx, seti(0x3f85_1592));
        let mid = _mm512_cmpgt_epi32_mask(hx, seti(0x3eb1_7218));
        // big ? k_big : (mid ? k_mid : 0).
        let k = _mm512_mask_blend_epi32(big, _mm512_maskz_mov_epi32(mid, k_mid), k_big);
        let kf = _mm512_cvtepi32_ps(k);
        let hi = _mm512_sub_ps(x, _mm512_mul_ps(kf, set(LN2_HI)));
        let lo = _mm512_mul_ps(kf, set(LN2_LO));
        let r = _mm512_sub_ps(hi, lo);
        let rr = _mm512_mul_ps(r, r);
        let poly = _mm512_add_ps(set(P1), _mm512_mul_ps(rr, set(P2)));
        let c = _mm512_sub_ps(r, _mm512_mul_ps(rr, poly));
        let q = _mm512_div_ps(_mm512_mul_ps(r, c), _mm512_sub_ps(set(2.0), c));
        let y = _mm512_add_ps(set(1.0), _mm512_add_ps(_mm512_sub_ps(q, lo), hi));
        let scale = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(k, seti(127))));
        let y = _mm512_mul_ps(y, scale);
        if main == 0xFFFF {
            return y;
        }
        let (mut xs, mut ys) = ([0f32; 16], [0f32; 16]);
        // SAFETY: sixteen floats each.
        unsafe {
            _mm512_storeu_ps(xs.as_mut_ptr(), x);
            _mm512_storeu_ps(ys.as_mut_ptr(), y);
        }
        for l in 0..16 {
            if main & (1 << l) == 0 {
                ys[l] = libm::expf(xs[l]);
            }
        }
        // SAFETY: as above.
        unsafe { _mm512_loadu_ps(ys.as_ptr()) }
    }

    /// `expf16` in place at `p` (loads and stores inlined into the AVX-512 code).
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `p` valid for reads and writes of sixteen f32.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn expf16_at(p: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe { _mm512_storeu_ps(p, expf16(_mm512_loadu_ps(p))) }
    }

    /// `erff16` in place at `p`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `p` valid for reads and writes of sixteen f32.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn erff16_at(p: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe {
            let y = erff16(p.cast::<[f32; 16]>().read_unaligned());
            p.cast::<[f32; 16]>().write_unaligned(y);
        }
    }

    /// # Safety
    /// The CPU must have AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn erff16(x16: [f32; 16]) -> [f32; 16] {
        let seti = _mm512_set1_epi32;
        let set = _mm512_set1_ps;
        // SAFETY: sixteen floats.
        let x = unsafe { _mm512_loadu_ps(x16.as_ptr()) };
        let bits = _mm512_castps_si512(x);
        let ix = _mm512_and_si512(bits, seti(0x7fff_ffff));
        let below = |t: i32| _mm512_cmplt_epi32_mask(ix, seti(t));
        // p0 + z * (p1 + z * (... + z * pn)), innermost first, as libm writes it.
        let horner = |z: __m512, c: &[f32]| {
            let mut acc = set(c[c.len() - 1]);
            for &k in c[..c.len() - 1].iter().rev() {
                acc = _mm512_add_ps(set(k), _mm512_mul_ps(z, acc));
            }
            acc
        };
        let one_plus =
            |z: __m512, c: &[f32]| _mm512_add_ps(set(1.0), _mm512_mul_ps(z, horner(z, c)));
        let sign = _mm512_and_si512(bits, seti(i32::MIN));
        // `sign ? -y : y` as a flip of y's sign bit (y >= 0 wherever it is used).
        let signed =
            |y: __m512| _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(y), sign));
        let ax = _mm512_castsi512_ps(ix);
        let (m_a, m_b, m_c) = (below(0x3f58_0000), below(0x3fa0_0000), below(0x40c0_0000));
        // |x| >= 6: 1 - 2^-120.
        let mut y = signed(_mm512_sub_ps(set(1.0), set(f32::from_bits(0x0380_0000))));
        // 1.25 <= |x| < 6: 1 - erfc, erfc = expf(-z z - 0.5625) expf((z - x)(z + x) + r / s) / x.
        let m_cd = m_c & !m_b;
        if m_cd != 0 {
            // Other lanes compute with |x| = 2 (in range: no NaN, no expf fallback).
            let xa = _mm512_mask_blend_ps(m_cd, set(2.0), ax);
            let s = _mm512_div_ps(set(1.0), _mm512_mul_ps(xa, xa));
            let near = _mm512_cmplt_epi32_mask(_mm512_castps_si512(xa), seti(0x4036_db6d));
            let (near_cd, far_cd) = (m_cd & near, m_cd & !near);
            let (r, big_s) = match (near_cd != 0, far_cd != 0) {
                (true, false) => (horner(s, &RA), one_plus(s, &SA)),
                (false, true) => (horner(s, &RB), one_plus(s, &SB)),
                _ => (
                    _mm512_mask_blend_ps(near, horner(s, &RB), horner(s, &RA)),
                    _mm512_mask_blend_ps(near, one_plus(s, &SB), one_plus(s, &SA)),
                ),
            };
            let z = _mm512_castsi512_ps(_mm512_and_si512(
                _mm512_castps_si512(xa),
                seti(0xffff_e000u32 as i32),
            ));
            let neg_z =
                _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(z), seti(i32::MIN)));
            let e1 = _mm512_sub_ps(_mm512_mul_ps(neg_z, z), set(0.5625));
            let e2 = _mm512_add_ps(
                _mm512_mul_ps(_mm512_sub_ps(z, xa), _mm512_add_ps(z, xa)),
                _mm512_div_ps(r, big_s),
            );
            // SAFETY: AVX-512F is enabled here.
            let (x1, x2) = unsafe { (expf16(e1), expf16(e2)) };
            let erfc = _mm512_div_ps(_mm512_mul_ps(x1, x2), xa);
            y = _mm512_mask_blend_ps(m_cd, y, signed(_mm512_sub_ps(set(1.0), erfc)));
        }
        // 0.84375 <= |x| < 1.25: 1 - erfc1, erfc1 = (1 - ERX) - p / q with s = |x| - 1.
        let m_b_only = m_b & !m_a;
        if m_b_only != 0 {
            let s = _mm512_sub_ps(ax, set(1.0));
            let p = horner(s, &PA);
            let q = one_plus(s, &QA);
            let erfc = _mm512_sub_ps(_mm512_sub_ps(set(1.0), set(ERX)), _mm512_div_ps(p, q));
            y = _mm512_mask_blend_ps(m_b_only, y, signed(_mm512_sub_ps(set(1.0), erfc)));
        }
        // |x| < 0.84375: x + x * (r / s) with z = x * x.
        if m_a != 0 {
            let z = _mm512_mul_ps(x, x);
            let r = horner(z, &PP);
            let s = one_plus(z, &QQ);
            let ya = _mm512_add_ps(x, _mm512_mul_ps(x, _mm512_div_ps(r, s)));
            y = _mm512_mask_blend_ps(m_a, y, ya);
        }
        let mut out = [0f32; 16];
        // SAFETY: sixteen floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), y) };
        // libm's special cases: |x| < 2^-28, NaN and infinities.
        let regular = !below(0x3180_0000) & below(0x7f80_0000);
        if regular != 0xFFFF {
            for l in 0..16 {
                if regular & (1 << l) == 0 {
                    out[l] = libm::erff(x16[l]);
                }
            }
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! `avx512`'s sequences on eight AVX2 lanes (comparison masks as vectors, `blendv` for
    //! the masked blends): for machines with AVX2 and no AVX-512, where sixteen lanes are two
    //! of these instead of four `erff4` (SSE2) calls.
    use super::super::erff4::{ERX, PA, PP, QA, QQ, RA, RB, SA, SB};
    use std::arch::x86_64::*;

    /// Whether any lane of the comparison mask `m` is set.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn any(m: __m256i) -> bool {
        _mm256_movemask_ps(_mm256_castsi256_ps(m)) != 0
    }

    /// libm's `expf` on eight lanes (`expf4`'s sequence); lanes outside its main range take
    /// `libm::expf`.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub unsafe fn expf8(x: __m256) -> __m256 {
        const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
        const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
        const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
        const P1: f32 = 1.666_662_5e-1;
        const P2: f32 = -2.766_733_3e-3;
        let seti = _mm256_set1_epi32;
        let set = _mm256_set1_ps;
        let bits = _mm256_castps_si256(x);
        let hx = _mm256_and_si256(bits, seti(0x7fff_ffff));
        let main = _mm256_and_si256(
            _mm256_cmpgt_epi32(hx, seti(0x3900_0000)),
            _mm256_cmpgt_epi32(seti(0x42ae_ac50), hx),
        );
        let sign = _mm256_srli_epi32::<31>(bits);
        let half = _mm256_castsi256_ps(_mm256_or_si256(
            seti(0.5f32.to_bits() as i32),
            _mm256_slli_epi32::<31>(sign),
        ));
        let k_big = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(set(INV_LN2), x), half));
        let k_mid = _mm256_sub_epi32(seti(1), _mm256_add_epi32(sign, sign));
        let big = _mm256_cmpgt_epi32(hx, seti(0x3f85_1592));
        let mid = _mm256_cmpgt_epi32(hx, seti(0x3eb1_7218));
        // big ? k_big : (mid ? k_mid : 0).
        let k = _mm256_blendv_epi8(_mm256_and_si256(mid, k_mid), k_big, big);
        let kf = _mm256_cvtepi32_ps(k);
        let hi = _mm256_sub_ps(x, _mm256_mul_ps(kf, set(LN2_HI)));
        let lo = _mm256_mul_ps(kf, set(LN2_LO));
        let r = _mm256_sub_ps(hi, lo);
        let rr = _mm256_mul_ps(r, r);
        let poly = _mm256_add_ps(set(P1), _mm256_mul_ps(rr, set(P2)));
        let c = _mm256_sub_ps(r, _mm256_mul_ps(rr, poly));
        let q = _mm256_div_ps(_mm256_mul_ps(r, c), _mm256_sub_ps(set(2.0), c));
        let y = _mm256_add_ps(set(1.0), _mm256_add_ps(_mm256_sub_ps(q, lo), hi));
        let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k, seti(127))));
        let y = _mm256_mul_ps(y, scale);
        let main = _mm256_movemask_ps(_mm256_castsi256_ps(main));
        if main == 0xFF {
            return y;
        }
        let (mut xs, mut ys) = ([0f32; 8], [0f32; 8]);
        // SAFETY: eight floats each.
        unsafe {
            _mm256_storeu_ps(xs.as_mut_ptr(), x);
            _mm256_storeu_ps(ys.as_mut_ptr(), y);
        }
        for l in 0..8 {
            if main & (1 << l) == 0 {
                ys[l] = libm::expf(xs[l]);
            }
        }
        // SAFETY: as above.
        unsafe { _mm256_loadu_ps(ys.as_ptr()) }
    }

    /// `expf8` on the sixteen floats at `p`, in place.
    ///
    /// # Safety
    /// The CPU must have AVX2; `p` valid for reads and writes of sixteen f32.
    #[target_feature(enable = "avx2")]
    pub unsafe fn expf16_at(p: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe {
            _mm256_storeu_ps(p, expf8(_mm256_loadu_ps(p)));
            _mm256_storeu_ps(p.add(8), expf8(_mm256_loadu_ps(p.add(8))));
        }
    }

    /// `erff8` on the sixteen floats at `p`, in place.
    ///
    /// # Safety
    /// The CPU must have AVX2; `p` valid for reads and writes of sixteen f32.
    #[target_feature(enable = "avx2")]
    pub unsafe fn erff16_at(p: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe {
            for h in [0, 8] {
                let y = erff8(p.add(h).cast::<[f32; 8]>().read_unaligned());
                p.add(h).cast::<[f32; 8]>().write_unaligned(y);
            }
        }
    }

    /// # Safety
    /// The CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub unsafe fn erff8(x8: [f32; 8]) -> [f32; 8] {
        let seti = _mm256_set1_epi32;
        let set = _mm256_set1_ps;
        // SAFETY: eight floats.
        let x = unsafe { _mm256_loadu_ps(x8.as_ptr()) };
        let bits = _mm256_castps_si256(x);
        let ix = _mm256_and_si256(bits, seti(0x7fff_ffff));
        let below = |t: i32| _mm256_cmpgt_epi32(seti(t), ix);
        let blend =
            |a: __m256, b: __m256, m: __m256i| _mm256_blendv_ps(a, b, _mm256_castsi256_ps(m));
        // p0 + z * (p1 + z * (... + z * pn)), innermost first, as libm writes it.
        let horner = |z: __m256, c: &[f32]| {
            let mut acc = set(c[c.len() - 1]);
            for &k in c[..c.len() - 1].iter().rev() {
                acc = _mm256_add_ps(set(k), _mm256_mul_ps(z, acc));
            }
            acc
        };
        let one_plus =
            |z: __m256, c: &[f32]| _mm256_add_ps(set(1.0), _mm256_mul_ps(z, horner(z, c)));
        let sign = _mm256_and_si256(bits, seti(i32::MIN));
        // `sign ? -y : y` as a flip of y's sign bit (y >= 0 wherever it is used).
        let signed =
            |y: __m256| _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(y), sign));
        let ax = _mm256_castsi256_ps(ix);
        let (m_a, m_b, m_c) = (below(0x3f58_0000), below(0x3fa0_0000), below(0x40c0_0000));
        // |x| >= 6: 1 - 2^-120.
        let mut y = signed(_mm256_sub_ps(set(1.0), set(f32::from_bits(0x0380_0000))));
        // 1.25 <= |x| < 6: 1 - erfc, erfc = expf(-z z - 0.5625) expf((z - x)(z + x) + r / s) / x.
        let m_cd = _mm256_andnot_si256(m_b, m_c);
        if any(m_cd) {
            // Other lanes compute with |x| = 2 (in range: no NaN, no expf fallback).
            let xa = blend(set(2.0), ax, m_cd);
            let s = _mm256_div_ps(set(1.0), _mm256_mul_ps(xa, xa));
            let near = _mm256_cmpgt_epi32(seti(0x4036_db6d), _mm256_castps_si256(xa));
            let (near_cd, far_cd) = (
                _mm256_and_si256(m_cd, near),
                _mm256_andnot_si256(near, m_cd),
            );
            let (r, big_s) = match (any(near_cd), any(far_cd)) {
                (true, false) => (horner(s, &RA), one_plus(s, &SA)),
                (false, true) => (horner(s, &RB), one_plus(s, &SB)),
                _ => (
                    blend(horner(s, &RB), horner(s, &RA), near),
                    blend(one_plus(s, &SB), one_plus(s, &SA), near),
                ),
            };
            let z = _mm256_castsi256_ps(_mm256_and_si256(
                _mm256_castps_si256(xa),
                seti(0xffff_e000u32 as i32),
            ));
            let neg_z =
                _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(z), seti(i32::MIN)));
            let e1 = _mm256_sub_ps(_mm256_mul_ps(neg_z, z), set(0.5625));
            let e2 = _mm256_add_ps(
                _mm256_mul_ps(_mm256_sub_ps(z, xa), _mm256_add_ps(z, xa)),
                _mm256_div_ps(r, big_s),
            );
            // SAFETY: AVX2 is enabled here.
            let (x1, x2) = unsafe { (expf8(e1), expf8(e2)) };
            let erfc = _mm256_div_ps(_mm256_mul_ps(x1, x2), xa);
            y = blend(y, signed(_mm256_sub_ps(set(1.0), erfc)), m_cd);
        }
        // 0.84375 <= |x| < 1.25: 1 - erfc1, erfc1 = (1 - ERX) - p / q with s = |x| - 1.
        let m_b_only = _mm256_andnot_si256(m_a, m_b);
        if any(m_b_only) {
            let s = _mm256_sub_ps(ax, set(1.0));
            let p = horner(s, &PA);
            let q = one_plus(s, &QA);
            let erfc = _mm256_sub_ps(_mm256_sub_ps(set(1.0), set(ERX)), _mm256_div_ps(p, q));
            y = blend(y, signed(_mm256_sub_ps(set(1.0), erfc)), m_b_only);
        }
        // |x| < 0.84375: x + x * (r / s) with z = x * x.
        if any(m_a) {
            let z = _mm256_mul_ps(x, x);
            let r = horner(z, &PP);
            let s = one_plus(z, &QQ);
            let ya = _mm256_add_ps(x, _mm256_mul_ps(x, _mm256_div_ps(r, s)));
            y = blend(y, ya, m_a);
        }
        let mut out = [0f32; 8];
        // SAFETY: eight floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), y) };
        // libm's special cases: |x| < 2^-28, NaN and infinities.
        let regular = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_andnot_si256(
            below(0x3180_0000),
            below(0x7f80_0000),
        )));
        if regular != 0xFF {
            for l in 0..8 {
                if regular & (1 << l) == 0 {
                    out[l] = libm::erff(x8[l]);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::erff4::THRESHOLDS;
    use super::super::lanes_check::{around, check, check_all, sweep};
    use super::{by_eights, by_fours, erff16, expf16};

    fn avx512() -> bool {
        cfg!(target_arch = "x86_64") && std::arch::is_x86_feature_detected!("avx512f")
    }

    fn avx2() -> bool {
        cfg!(target_arch = "x86_64") && std::arch::is_x86_feature_detected!("avx2")
    }

    /// `expf16` (the AVX-512 path where it exists, else four `expf4`s) against libm: every
    /// 61st float of the main range, both signs, and the lanes outside it mixed in.
    #[test]
    fn expf16_equals_libm_bit_for_bit() {
        let mut xs = sweep(0x3900_0001, 0x42ae_ac50, 61);
        xs.extend([
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-30,
            88.0,
            -103.0,
            -200.0,
            0.5,
            f32::MIN_POSITIVE,
            1.0,
            2.0,
            f32::NAN,
            -3.0,
        ]);
        check("expf16", expf16, libm::expf, &xs, 0.5);
    }

    /// Every 61st float from 2^-28 up, both signs, the thresholds, and the special lanes mixed
    /// into vectors of regular ones (the AVX-512 path and the four-call path where AVX-512
    /// exists; the four-call path elsewhere).
    #[test]
    fn erff16_equals_libm_bit_for_bit() {
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
        xs.extend([
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
            -0.0,
            4.0,
            -1.1,
            f32::INFINITY,
        ]);
        check("erff16", erff16, libm::erff, &xs, 0.0);
        check("erff16 by fours", by_fours, libm::erff, &xs, 0.0);
        check("erff16 by eights", by_eights, libm::erff, &xs, 0.0);
        if avx2() {
            // Each lane of eight in each branch's position, next to special lanes.
            let mut mixed = Vec::new();
            for (k, &v) in xs.iter().step_by(97).enumerate() {
                let mut w = [0.5f32; 8];
                w[k % 8] = v;
                w[(k + 3) % 8] = [f32::NAN, 1e-30, 3.0, -0.9][k % 4];
                mixed.extend(w);
            }
            check(
                "erff8",
                // SAFETY: AVX2 is present (checked above).
                |x| unsafe { super::avx2::erff8(x) },
                libm::erff,
                &mixed,
                0.0,
            );
        }
    }

    /// `expf` on eight AVX2 lanes against libm (where the CPU has AVX2).
    #[test]
    fn expf8_equals_libm_bit_for_bit() {
        if !avx2() {
            return;
        }
        let mut xs = sweep(0x3900_0001, 0x42ae_ac50, 61);
        xs.extend([
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-30,
            88.0,
            -103.0,
        ]);
        let f = |x: [f32; 8]| {
            use std::arch::x86_64::*;
            let mut y = [0f32; 8];
            // SAFETY: AVX2 is present; eight floats each.
            unsafe {
                _mm256_storeu_ps(
                    y.as_mut_ptr(),
                    super::avx2::expf8(_mm256_loadu_ps(x.as_ptr())),
                )
            };
            y
        };
        check("expf8", f, libm::expf, &xs, 0.5);
        let mut y16 = [0f32; 16];
        for c in xs.chunks(16) {
            let mut x = [0.25f32; 16];
            x[..c.len()].copy_from_slice(c);
            y16.copy_from_slice(&x);
            // SAFETY: AVX2 is present; sixteen floats.
            unsafe { super::avx2::expf16_at(y16.as_mut_ptr()) };
            for l in 0..16 {
                let w = libm::expf(x[l]);
                assert!(
                    y16[l].to_bits() == w.to_bits() || (y16[l].is_nan() && w.is_nan()),
                    "{}",
                    x[l]
                );
            }
        }
    }

    /// Every float32 from 2^-28 to infinity, both signs, both paths:
    /// `cargo test --release -p rivet-compiler erff16 -- --ignored`.
    #[test]
    #[ignore]
    fn erff16_equals_libm_on_every_regular_float() {
        check_all("erff16", erff16, libm::erff, 0x3180_0000, 0x7f80_0000);
        if avx2() {
            check_all(
                "erff16 by eights",
                by_eights,
                libm::erff,
                0x3180_0000,
                0x7f80_0000,
            );
        }
        if avx512() {
            check_all(
                "erff16 by fours",
                by_fours,
                libm::erff,
                0x3180_0000,
                0x7f80_0000,
            );
        }
    }
}
