//! `extern "C"` helpers generated code calls, besides the maths of `codegen::math::symbols()`:
//! local allocations, float16/bfloat16 conversions (the `half` crate's, so that rounding
//! matches the interpreter), and the parallel-loop driver.

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};

/// Alignment of local buffers.
const LOCAL_ALIGN: usize = 64;

fn local_layout(bytes: i64) -> Layout {
    let size = usize::try_from(bytes).unwrap_or(0).max(1);
    match Layout::from_size_align(size, LOCAL_ALIGN) {
        Ok(l) => l,
        Err(_) => {
            eprintln!("rivet: a local buffer of {bytes} bytes is too large to allocate");
            std::process::abort()
        }
    }
}

/// Zeroed, 64-byte aligned memory of `bytes` bytes (at least 1); aborts when out of memory
/// (unwinding out of generated code is not allowed).
extern "C" fn rivet_alloc(bytes: i64) -> *mut u8 {
    let layout = local_layout(bytes);
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { alloc_zeroed(layout) };
    if p.is_null() {
        handle_alloc_error(layout)
    }
    p
}

/// Frees memory from `rivet_alloc(bytes)`.
///
/// # Safety
/// `ptr` must come from `rivet_alloc` with the same `bytes`, and not be freed twice.
unsafe extern "C" fn rivet_free(ptr: *mut u8, bytes: i64) {
    // SAFETY: the caller's contract; `local_layout` maps `bytes` to the layout used to allocate.
    unsafe { dealloc(ptr, local_layout(bytes)) }
}

extern "C" fn rivet_f16_to_f32(bits: u32) -> f32 {
    half::f16::from_bits(bits as u16).to_f32()
}

extern "C" fn rivet_f32_to_f16(x: f32) -> u32 {
    half::f16::from_f32(x).to_bits() as u32
}

extern "C" fn rivet_f64_to_f16(x: f64) -> u32 {
    half::f16::from_f64(x).to_bits() as u32
}

extern "C" fn rivet_f32_to_bf16(x: f32) -> u32 {
    half::bf16::from_f32(x).to_bits() as u32
}

extern "C" fn rivet_f64_to_bf16(x: f64) -> u32 {
    half::bf16::from_f64(x).to_bits() as u32
}

/// Every helper of this backend: (symbol, address).
pub(super) fn symbols() -> Vec<(&'static str, *const u8)> {
    vec![
        ("rivet_alloc", rivet_alloc as *const u8),
        ("rivet_free", rivet_free as *const u8),
        ("rivet_f16_to_f32", rivet_f16_to_f32 as *const u8),
        ("rivet_f32_to_f16", rivet_f32_to_f16 as *const u8),
        ("rivet_f64_to_f16", rivet_f64_to_f16 as *const u8),
        ("rivet_f32_to_bf16", rivet_f32_to_bf16 as *const u8),
        ("rivet_f64_to_bf16", rivet_f64_to_bf16 as *const u8),
        (
            "rivet_parallel_for",
            super::parallel::rivet_parallel_for as *const u8,
        ),
    ]
}
