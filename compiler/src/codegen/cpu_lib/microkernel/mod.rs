//! GEMM micro-kernels: the bodies `tensorize` puts in place of a register-tile loop nest
//! (`Stmt::Call` of `Intrin::GemmUpdate`, see `ir::intrin`), written in Rust with `std::arch`
//! and chosen at run time by CPU feature detection.
//!
//! The operation, for one tile of `mr x nr` outputs over a slice of `k` products:
//!
//! ```text
//! for i < mr, j < nr:   c = C[i, j]
//!                       for p < k (in order):  c = fma(A[p, i], B[p, j], c)
//!                       C[i, j] = c
//! ```
//!
//! with `A[p, i]` at `a + p*a_ks + i*a_ms`, `B[p, j]` at `b + p*b_ks + j*b_ns` and `C[i, j]`
//! at `c + i*c_rs + j*c_cs` (element strides, any sign). Every variant performs exactly this
//! sequence of fused multiply-adds for every element (one rounding per product, in order of
//! `p`, starting from the old `C`): the SIMD kernels only run many elements side by side. So
//! every variant, the generic loop and the interpreter's reference give bit-identical results;
//! the tolerance against *unfused* maths (`c + a*b` rounded twice) is documented in
//! docs/cpu.md.
//!
//! Variants (`Variant`), each a fixed register tile over *packed* panels (unit stride along
//! `i` in A and along `j` in B); a call whose tile is a multiple of the variant's is cut into
//! variant tiles, anything else (other shapes, strided panels) runs the generic loop:
//! - `Avx512`: 12x32 (24 zmm accumulators, two B vectors, one broadcast: 27 of 32 zmm);
//! - `Avx2`: 6x16 (12 ymm accumulators, two B vectors, one broadcast: 15 of 16 ymm);
//! - `Portable`: the generic scalar loop (`f32::mul_add`), on every architecture.
//!
//! f64: AVX-512 has a 12x16 kernel (24 zmm accumulators of 8 doubles), AVX2 a 6x8 one (12 ymm
//! accumulators of 4 doubles); the portable variant runs the generic loop.
//!
//! Selection: once per process, the widest variant the CPU has (`is_x86_feature_detected!`),
//! unless `RIVET_MICROKERNEL=avx512|avx2|portable` forces one; forcing a variant the CPU
//! lacks is an error naming the variant and the missing features (reported when a kernel
//! that calls a micro-kernel is built), never an illegal instruction.
//!
//! Safety contract of the `extern "C"` entries: the caller (generated code) passes regions
//! that the bounds proof (`lower::bounds`) has proven inside their tensors for every
//! `(p, i, j)` above; the entries touch no other memory.

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

/// A micro-kernel implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    Avx512,
    Avx2,
    Portable,
}

impl Variant {
    pub const ALL: [Variant; 3] = [Variant::Avx512, Variant::Avx2, Variant::Portable];

    /// The spelling `RIVET_MICROKERNEL` takes.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Avx512 => "avx512",
            Variant::Avx2 => "avx2",
            Variant::Portable => "portable",
        }
    }

    pub fn parse(s: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == s)
    }

    /// The CPU features the variant needs.
    pub fn features(self) -> &'static str {
        match self {
            Variant::Avx512 => "avx512f",
            Variant::Avx2 => "avx2 and fma",
            Variant::Portable => "none",
        }
    }

    /// Whether this CPU can run the variant.
    pub fn supported(self) -> bool {
        match self {
            Variant::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Variant::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Variant::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The register tile (rows, columns) of the variant's f32 kernel (`None`: generic loop).
    pub fn tile_f32(self) -> Option<(usize, usize)> {
        match self {
            Variant::Avx512 => Some((12, 32)),
            Variant::Avx2 => Some((6, 16)),
            Variant::Portable => None,
        }
    }

    /// The `extern "C"` entry generated code calls for an f32 tile update.
    pub fn entry_f32(self) -> GemmF32Entry {
        match self {
            #[cfg(target_arch = "x86_64")]
            Variant::Avx512 => x86::gemm_f32_avx512,
            #[cfg(target_arch = "x86_64")]
            Variant::Avx2 => x86::gemm_f32_avx2,
            _ => portable::gemm_f32_entry,
        }
    }

    /// The `extern "C"` entry for an f64 tile update: AVX-512's 12x16 kernel, AVX2's 6x8, the
    /// generic loop for the portable variant (the same fused sequence either way).
    pub fn entry_f64(self) -> GemmF64Entry {
        match self {
            #[cfg(target_arch = "x86_64")]
            Variant::Avx512 => x86::gemm_f64_avx512,
            #[cfg(target_arch = "x86_64")]
            Variant::Avx2 => x86::gemm_f64_avx2,
            _ => portable::gemm_f64_entry,
        }
    }
}

/// `(mr, nr, k, c, c_rs, c_cs, a, a_ks, a_ms, b, b_ks, b_ns)`, see the module header.
pub type GemmF32Entry = unsafe extern "C" fn(
    i64,
    i64,
    i64,
    *mut f32,
    i64,
    i64,
    *const f32,
    i64,
    i64,
    *const f32,
    i64,
    i64,
);
/// The f64 twin of `GemmF32Entry`.
pub type GemmF64Entry = unsafe extern "C" fn(
    i64,
    i64,
    i64,
    *mut f64,
    i64,
    i64,
    *const f64,
    i64,
    i64,
    *const f64,
    i64,
    i64,
);

/// The environment variable that forces a variant.
pub const ENV: &str = "RIVET_MICROKERNEL";

/// The best variant this CPU runs.
pub fn detect() -> Variant {
    [Variant::Avx512, Variant::Avx2]
        .into_iter()
        .find(|v| v.supported())
        .unwrap_or(Variant::Portable)
}

/// The variant `RIVET_MICROKERNEL` asks for (`None`/empty: detection), or why it cannot be had.
pub fn choose(forced: Option<&str>) -> Result<Variant, String> {
    match forced.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(detect()),
        Some(s) => {
            let v = Variant::parse(&s.to_ascii_lowercase()).ok_or_else(|| {
                format!("{ENV}={s:?} is not a micro-kernel variant: expected one of avx512, avx2, portable")
            })?;
            if v.supported() {
                Ok(v)
            } else {
                Err(format!(
                    "{ENV}={} forces the {} micro-kernels, but this CPU lacks {} (it supports: {})",
                    v.name(),
                    v.name(),
                    v.features(),
                    Variant::ALL
                        .iter()
                        .filter(|v| v.supported())
                        .map(|v| v.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
        }
    }
}

/// The variant of this process: chosen on first use, from `RIVET_MICROKERNEL` and the CPU.
pub fn selected() -> Result<Variant, String> {
    static SEL: OnceLock<Result<Variant, String>> = OnceLock::new();
    SEL.get_or_init(|| choose(std::env::var(ENV).ok().as_deref()))
        .clone()
}

/// Runs the f32 tile update with `variant` on slices, checking every element it touches
/// first (for tests and the interpreter's cross-checks; generated code calls the entries).
/// `a`, `b`, `c` are the memory the strides address from offsets `a0`, `b0`, `c0`.
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32_checked(
    variant: Variant,
    (mr, nr, k): (usize, usize, usize),
    c: &mut [f32],
    (c0, c_rs, c_cs): (usize, isize, isize),
    a: &[f32],
    (a0, a_ks, a_ms): (usize, isize, isize),
    b: &[f32],
    (b0, b_ks, b_ns): (usize, isize, isize),
) -> Result<(), String> {
    if !variant.supported() {
        return Err(format!(
            "this CPU cannot run the {} micro-kernels",
            variant.name()
        ));
    }
    let inside = |what: &str, len: usize, o: usize, s1: isize, n1: usize, s2: isize, n2: usize| {
        if n1 == 0 || n2 == 0 {
            return Ok(());
        }
        let lo_hi = |s: isize, n: usize| {
            let e = s as i128 * (n as i128 - 1);
            (e.min(0), e.max(0))
        };
        let (l1, h1) = lo_hi(s1, n1);
        let (l2, h2) = lo_hi(s2, n2);
        let (lo, hi) = (o as i128 + l1 + l2, o as i128 + h1 + h2);
        if lo < 0 || hi >= len as i128 {
            Err(format!("{what}: region [{lo}, {hi}] outside [0, {len})"))
        } else {
            Ok(())
        }
    };
    if mr == 0 || nr == 0 {
        return Ok(());
    }
    inside("C", c.len(), c0, c_rs, mr, c_cs, nr)?;
    if k > 0 {
        inside("A", a.len(), a0, a_ks, k, a_ms, mr)?;
        inside("B", b.len(), b0, b_ks, k, b_ns, nr)?;
    }
    let entry = variant.entry_f32();
    // SAFETY: every element the update touches was checked inside its slice above; the
    // variant is supported by this CPU.
    unsafe {
        entry(
            mr as i64,
            nr as i64,
            k as i64,
            c.as_mut_ptr().add(c0),
            c_rs as i64,
            c_cs as i64,
            a.as_ptr().add(a0.min(a.len())),
            a_ks as i64,
            a_ms as i64,
            b.as_ptr().add(b0.min(b.len())),
            b_ks as i64,
            b_ns as i64,
        )
    };
    Ok(())
}

#[cfg(test)]
mod tests;
