//! `extern "C"` helpers generated code calls, besides the maths of `codegen::math::symbols()`:
//! local allocations, the fault slot through which generated code reports errors, float16/bfloat16 conversions (the `half` crate's, so that rounding
//! matches the interpreter), and the parallel-loop driver.

use crate::ir::limits::MAX_ALLOC_BYTES;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::Cell;

/// Alignment of local buffers.
const LOCAL_ALIGN: usize = 64;

/// A failure inside generated code. The helper that finds it records it for the thread running
/// the code and the code returns a non-zero status: unwinding out of generated code is not
/// possible, and aborting the process is not allowed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Fault {
    /// A local buffer of `bytes` bytes: over `MAX_ALLOC_BYTES`, or refused by the system.
    Alloc { bytes: i64 },
    /// Checked mode: index `index` of dim `dim` of access site `site` outside `[0, extent)`.
    OutOfBounds {
        site: i64,
        dim: i64,
        index: i64,
        extent: i64,
    },
}

thread_local! {
    static FAULT: Cell<Option<Fault>> = const { Cell::new(None) };
}

/// Records `f` for this thread unless a fault is already recorded (the first one is reported).
pub(super) fn set_fault(f: Fault) {
    FAULT.with(|c| {
        if c.get().is_none() {
            c.set(Some(f))
        }
    })
}

/// Takes this thread's recorded fault.
pub(super) fn take_fault() -> Option<Fault> {
    FAULT.with(|c| c.take())
}

fn local_layout(bytes: i64) -> Option<Layout> {
    let size = usize::try_from(bytes).ok()?;
    if size > MAX_ALLOC_BYTES {
        return None;
    }
    Layout::from_size_align(size.max(1), LOCAL_ALIGN).ok()
}

/// Zeroed, 64-byte aligned memory of `bytes` bytes (at least 1), or null with a `Fault::Alloc`
/// recorded when the size is negative, over `MAX_ALLOC_BYTES`, or refused by the system.
extern "C" fn rivet_alloc(bytes: i64) -> *mut u8 {
    let Some(layout) = local_layout(bytes) else {
        set_fault(Fault::Alloc { bytes });
        return std::ptr::null_mut();
    };
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { alloc_zeroed(layout) };
    if p.is_null() {
        set_fault(Fault::Alloc { bytes });
    }
    p
}

/// Frees memory from `rivet_alloc(bytes)`.
///
/// # Safety
/// `ptr` must come from a successful `rivet_alloc` with the same `bytes`, and not be freed
/// twice.
unsafe extern "C" fn rivet_free(ptr: *mut u8, bytes: i64) {
    // A successful allocation had a valid layout, so this always matches.
    if let Some(layout) = local_layout(bytes) {
        // SAFETY: the caller's contract; the layout is the one used to allocate.
        unsafe { dealloc(ptr, layout) }
    }
}

/// Checked mode: records an out-of-bounds access (the generated code then returns).
extern "C" fn rivet_oob(site: i64, dim: i64, index: i64, extent: i64) {
    set_fault(Fault::OutOfBounds {
        site,
        dim,
        index,
        extent,
    })
}

extern "C" fn rivet_f16_to_f32(bits: u32) -> f32 {
    half::f16::from_bits(bits as u16).to_f32()
}

extern "C" fn rivet_f32_to_f16(x: f32) -> u32 {
    half::f16::from_f32(x).to_bits() as u32
}

extern "C" fn rivet_f64_to_f16(x: f64) -> u32 {
    half::f16::from_f32(x as f32).to_bits() as u32
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
        ("rivet_oob", rivet_oob as *const u8),
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
