//! The generic tile update: any tile, any strides, on every architecture. It is the
//! definition every SIMD kernel reproduces (module header of `microkernel`): per element, the
//! fused multiply-adds in order of `p` from the old value of `C`.

/// `C[i, j] = fold_p fma(A[p, i], B[p, j], C[i, j])` over the strided regions.
///
/// # Safety
/// Every `C[i, j]` (i < mr, j < nr), `A[p, i]` and `B[p, j]` (p < k) addressed by the
/// pointers and element strides must be valid (C writable), and C must not overlap A or B.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_generic<T: Fma>(
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
    for i in 0..mr {
        for j in 0..nr {
            // SAFETY: (i, j) is inside the tile the caller vouches for.
            let cp = unsafe { c.offset((i * c_rs + j * c_cs) as isize) };
            // SAFETY: as above.
            let mut acc = unsafe { cp.read() };
            for p in 0..k {
                // SAFETY: (p, i) and (p, j) are inside the panels the caller vouches for.
                let (x, y) = unsafe {
                    (
                        a.offset((p * a_ks + i * a_ms) as isize).read(),
                        b.offset((p * b_ks + j * b_ns) as isize).read(),
                    )
                };
                acc = x.fma(y, acc);
            }
            // SAFETY: as above.
            unsafe { cp.write(acc) };
        }
    }
}

/// A float with a correctly rounded fused multiply-add (`mul_add`: one rounding).
pub(super) trait Fma: Copy {
    fn fma(self, b: Self, c: Self) -> Self;
}
impl Fma for f32 {
    #[inline(always)]
    fn fma(self, b: f32, c: f32) -> f32 {
        self.mul_add(b, c)
    }
}
impl Fma for f64 {
    #[inline(always)]
    fn fma(self, b: f64, c: f64) -> f64 {
        self.mul_add(b, c)
    }
}

/// The portable variant's f32 entry (see `GemmF32Entry`).
///
/// # Safety
/// As `gemm_generic`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn gemm_f32_entry(
    mr: i64,
    nr: i64,
    k: i64,
    c: *mut f32,
    c_rs: i64,
    c_cs: i64,
    a: *const f32,
    a_ks: i64,
    a_ms: i64,
    b: *const f32,
    b_ks: i64,
    b_ns: i64,
) {
    // SAFETY: forwarded contract.
    unsafe { gemm_generic(mr, nr, k, c, c_rs, c_cs, a, a_ks, a_ms, b, b_ks, b_ns) }
}

/// The f64 entry of every variant (see `GemmF64Entry`).
///
/// # Safety
/// As `gemm_generic`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn gemm_f64_entry(
    mr: i64,
    nr: i64,
    k: i64,
    c: *mut f64,
    c_rs: i64,
    c_cs: i64,
    a: *const f64,
    a_ks: i64,
    a_ms: i64,
    b: *const f64,
    b_ks: i64,
    b_ns: i64,
) {
    // SAFETY: forwarded contract.
    unsafe { gemm_generic(mr, nr, k, c, c_rs, c_cs, a, a_ks, a_ms, b, b_ks, b_ns) }
}
