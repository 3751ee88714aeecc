//! The exported driver entry points, C ABI, with the names and signatures of `cuda.h`
//! (the `_v2` names where the header maps the plain name to them).
//!
//! Every body runs under [`crate::report::entry`]: no panic crosses into C, and every
//! refusal is a code plus one report line. The safety contract of each function is the CUDA
//! driver API's for the same name (pointers the caller passes must be valid as there).
#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod device;
pub mod ipc;
pub mod mem;
pub mod queue;

pub use std::ffi::{c_char, c_int, c_uint, c_void};

/// An opaque driver handle (`CUcontext`, `CUstream`, ...): our numbers, never dereferenced.
pub type Handle = *mut c_void;
pub type DevPtr = u64;

pub(crate) fn h(p: Handle) -> u64 {
    p as u64
}

pub(crate) fn ptr(v: u64) -> Handle {
    v as Handle
}
