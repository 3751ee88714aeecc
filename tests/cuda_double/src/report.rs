//! How the double answers: every exported body runs under [`entry`], which turns a panic
//! into `CUDA_ERROR_UNKNOWN` and a [`Refusal`] into its code plus one report line.
//!
//! Invariants: a report is exactly one line, starting `rivet-cuda-double: ` and naming the
//! call, written to stderr and appended to `$RIVET_CUDA_DOUBLE_LOG` when set (tests read
//! that file to see what was refused); a quiet refusal (an empty `why`, e.g. the
//! `CUDA_ERROR_NOT_READY` of a query) is a status, not a misuse, and writes nothing.

use crate::error::{CuResult, Refusal, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The prefix of every line the double writes.
pub const PREFIX: &str = "rivet-cuda-double: ";

/// Writes one report line (stderr and the log file).
pub fn report(call: &str, why: &str) {
    let line = format!("{PREFIX}{call}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os("RIVET_CUDA_DOUBLE_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write per line so lines of concurrent processes do not interleave.
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// Runs an entry point's body: `Ok` is `CUDA_SUCCESS`; a refusal is reported and its code
/// returned; a panic is `CUDA_ERROR_UNKNOWN` (never unwinds into C).
pub fn entry(call: &str, body: impl FnOnce() -> Result<(), Refusal>) -> CuResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(r)) => {
            if !r.why.is_empty() {
                report(call, &r.why);
            }
            r.code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            report(call, &format!("internal panic in the double: {what}"));
            CUDA_ERROR_UNKNOWN
        }
    }
}

/// A refusal with a message.
pub fn refuse<T>(code: CuResult, why: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal::new(code, why))
}

/// Writes `v` through an out-parameter, refusing a null one (the real driver does too).
/// Not `unsafe`: its pointers come straight from the C caller of an exported entry point,
/// whose contract (the driver API's) makes them valid; marking it would only add noise.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn out<T>(p: *mut T, what: &str, v: T) -> Result<(), Refusal> {
    if p.is_null() {
        return refuse(CUDA_ERROR_INVALID_VALUE, format!("{what} is NULL"));
    }
    // SAFETY: non-null; the C caller promises an out-parameter valid for a write of T (it
    // may be unaligned when C hands a packed buffer, hence write_unaligned).
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// The log file opened once at `cuInit` for the SIGSEGV handler, which cannot open files
/// (-1: none).
pub static LOG_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Opens `$RIVET_CUDA_DOUBLE_LOG` for the fault handler.
pub fn open_log_fd() {
    use std::os::unix::ffi::OsStrExt;
    if let Some(path) = std::env::var_os("RIVET_CUDA_DOUBLE_LOG") {
        if let Ok(c) = std::ffi::CString::new(path.as_bytes()) {
            // SAFETY: a NUL-terminated path; the fd is kept for the process's life.
            let fd = unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC,
                    0o644,
                )
            };
            LOG_FD.store(fd, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
