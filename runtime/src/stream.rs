//! The CUDA stream a call runs on, chosen by the host language's wrapper and read by the
//! backend that launches.
//!
//! The packed-function ABI passes only `Value`s, so the stream travels beside them: the
//! bindings run `Function::call` inside [`with_call_stream`], and the compiler's call path
//! reads [`call_stream`] into its launch context. Invariant: `with_call_stream` restores the
//! previous value on every exit (return or panic), so a nested call (a Python callback that
//! calls another rivet function) sees its own stream and the outer call gets its own back.
//!
//! Handles are the driver's `CUstream` values as integers, with the array API's reserved
//! values (DLPack `__dlpack__(stream=...)`, `__cuda_array_interface__` v3): [`LEGACY`] (1)
//! is the legacy default stream, [`PER_THREAD`] (2) the per-thread default stream; both are
//! also the driver's own `CU_STREAM_LEGACY` / `CU_STREAM_PER_THREAD` handles, so they can be
//! passed to the driver unchanged. 0 (the NULL stream, which is the legacy default stream in
//! the driver API) is accepted as the legacy default stream too.

use std::cell::Cell;

/// The legacy default stream (`CU_STREAM_LEGACY`; the array API's `stream=1`).
pub const LEGACY: u64 = 1;
/// The per-thread default stream (`CU_STREAM_PER_THREAD`; the array API's `stream=2`).
pub const PER_THREAD: u64 = 2;

thread_local! {
    static STREAM: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The stream of the call running on this thread (`None`: none chosen; a backend then uses
/// the legacy default stream).
pub fn call_stream() -> Option<u64> {
    STREAM.with(|s| s.get())
}

/// Runs `f` with `stream` as this thread's call stream, restoring the previous one after.
pub fn with_call_stream<R>(stream: Option<u64>, f: impl FnOnce() -> R) -> R {
    struct Restore<'a>(&'a Cell<Option<u64>>, Option<u64>);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            self.0.set(self.1);
        }
    }
    // `f` runs inside `with`: set and restore through one thread-local lookup (every Python
    // call comes through here).
    STREAM.with(|s| {
        let _restore = Restore(s, s.replace(stream));
        f()
    })
}

/// Whether two stream handles name the same stream (0 and [`LEGACY`] are both the legacy
/// default stream).
pub fn same_stream(a: u64, b: u64) -> bool {
    let norm = |s: u64| if s == 0 { LEGACY } else { s };
    norm(a) == norm(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_calls_restore_the_outer_stream() {
        assert_eq!(call_stream(), None);
        with_call_stream(Some(7), || {
            assert_eq!(call_stream(), Some(7));
            with_call_stream(None, || assert_eq!(call_stream(), None));
            assert_eq!(call_stream(), Some(7));
            let r = std::panic::catch_unwind(|| with_call_stream(Some(9), || panic!("boom")));
            assert!(r.is_err());
            assert_eq!(call_stream(), Some(7));
        });
        assert_eq!(call_stream(), None);
        assert!(same_stream(0, LEGACY) && !same_stream(LEGACY, PER_THREAD));
    }
}
