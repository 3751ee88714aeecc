//! Scalar semantics shared by every backend, so that the interpreter (the oracle) and
//! generated code agree bit for bit.
//!
//! - Transcendentals come from the `libm` crate (a port of musl's libm), except float32 `exp`,
//!   which is rivet's own (`codegen::cpu_lib::exp32`: no division, so it vectorizes; <= 1 ulp): the
//!   interpreter calls these functions, and the Cranelift backend calls the very same ones
//!   through the `extern "C"` wrappers below. `sqrt`, `abs`, `floor`, `ceil` are exact
//!   (IEEE), so backends may use native instructions for them. float16/bfloat16 are computed in float32.
//! - `erf`: musl's, max error below 1 ulp in float64 and float32.
//! - `sigmoid(x) = 1 / (1 + exp(-x))`, `rsqrt(x) = 1 / sqrt(x)`, evaluated in the dtype.
//! - Float `min`/`max` propagate NaN (as `numpy.minimum` / `torch.minimum`).
//! - Integer `//` and `%` follow Python (floor) semantics; a zero divisor gives 0 for both
//!   (no trap), and `MIN // -1` wraps. Integer arithmetic wraps at the dtype's width.
//! - Float-to-int casts saturate (NaN gives 0), as Rust's `as`.

/// Python's `//` and `%` are arithmetic every layer shares (the simplifier folds them, exact
/// evaluation decides with them), so they live in `arith::div`; the backends call them here.
pub use crate::arith::div::{
    floordiv_f32, floordiv_f64, floordiv_i64, floormod_f32, floormod_f64, floormod_i64,
};

pub fn fmin<T: num_like::Float>(a: T, b: T) -> T {
    if a.is_nan() || b.is_nan() {
        T::nan()
    } else if a < b {
        a
    } else {
        b
    }
}

pub fn fmax<T: num_like::Float>(a: T, b: T) -> T {
    if a.is_nan() || b.is_nan() {
        T::nan()
    } else if a > b {
        a
    } else {
        b
    }
}

pub mod num_like {
    pub trait Float: Copy + PartialOrd {
        fn is_nan(self) -> bool;
        fn nan() -> Self;
    }
    impl Float for f32 {
        fn is_nan(self) -> bool {
            f32::is_nan(self)
        }
        fn nan() -> Self {
            f32::NAN
        }
    }
    impl Float for f64 {
        fn is_nan(self) -> bool {
            f64::is_nan(self)
        }
        fn nan() -> Self {
            f64::NAN
        }
    }
}

/// `extern "C"` entry points for generated code: (symbol, address). The interpreter calls the
/// same `libm` functions directly.
macro_rules! externs {
    ($($name:ident: fn($($a:ident: $t:ty),*) -> $r:ty = $body:expr;)*) => {
        pub mod ffi {
            $(pub extern "C" fn $name($($a: $t),*) -> $r { $body })*
        }
        /// Every helper symbol generated code may call.
        pub fn symbols() -> Vec<(&'static str, *const u8)> {
            vec![$((concat!("rivet_", stringify!($name)), ffi::$name as *const u8)),*]
        }
    };
}

externs! {
    // float32 `exp` is rivet's own (`codegen::cpu_lib::exp32`), not libm's.
    expf: fn(x: f32) -> f32 = crate::codegen::cpu_lib::exp32::exp32(x);
    exp: fn(x: f64) -> f64 = libm::exp(x);
    logf: fn(x: f32) -> f32 = libm::logf(x);
    log: fn(x: f64) -> f64 = libm::log(x);
    tanhf: fn(x: f32) -> f32 = libm::tanhf(x);
    tanh: fn(x: f64) -> f64 = libm::tanh(x);
    erff: fn(x: f32) -> f32 = libm::erff(x);
    erf: fn(x: f64) -> f64 = libm::erf(x);
    powf: fn(x: f32, y: f32) -> f32 = libm::powf(x, y);
    pow: fn(x: f64, y: f64) -> f64 = libm::pow(x, y);
    floordivf: fn(x: f32, y: f32) -> f32 = super::floordiv_f32(x, y);
    floordiv: fn(x: f64, y: f64) -> f64 = super::floordiv_f64(x, y);
    floormodf: fn(x: f32, y: f32) -> f32 = super::floormod_f32(x, y);
    floormod: fn(x: f64, y: f64) -> f64 = super::floormod_f64(x, y);
    // `a * b + c` rounded once (Rust's `mul_add`: the FMA instruction, or the C library's
    // correctly rounded `fmaf`/`fma`): what Cranelift's `fma` calls on a CPU without FMA.
    fmaf: fn(x: f32, y: f32, z: f32) -> f32 = x.mul_add(y, z);
    fma: fn(x: f64, y: f64, z: f64) -> f64 = x.mul_add(y, z);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_min_max_propagate_nan() {
        assert!(fmin(f32::NAN, 1.0).is_nan() && fmax(1.0, f64::NAN).is_nan());
        assert_eq!((fmin(1.0f32, 2.0), fmax(1.0f64, 2.0)), (1.0, 2.0));
    }
}
