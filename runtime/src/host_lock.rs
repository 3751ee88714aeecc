//! The host language's interpreter lock (Python's GIL), seen from native code.
//!
//! The runtime knows nothing of Python; the bindings install a hook that can release the lock
//! on the calling thread and take it back. Native functions wrap their real work in
//! [`without_host_lock`]: the lock is released for loops worth it (numpy's policy: tiny calls
//! keep it, since releasing and retaking costs about as much as the work) and always around
//! parallel regions, so that worker threads never wait on a lock the caller holds.
//!
//! Invariant: `without_host_lock` restores exactly the lock state it found (also on panic,
//! which pyo3's `detach` guarantees).

use std::sync::OnceLock;

/// Runs the closure with the host lock released if the calling thread holds it (else runs it
/// as is). The bindings implement it with pyo3's `detach`, which keeps pyo3's own per-thread
/// bookkeeping right, so Python callbacks inside re-acquire the lock correctly.
pub type RunUnlocked = fn(&mut dyn FnMut());

static HOOK: OnceLock<RunUnlocked> = OnceLock::new();

/// Installs the host's hook (once per process; later calls are ignored).
pub fn set_host_lock_hook(hook: RunUnlocked) {
    let _ = HOOK.set(hook);
}

/// Work below this many elements keeps the host lock: releasing and retaking it costs
/// about 35 ns, as much as a small loop.
pub const RELEASE_GRAIN: i64 = 1 << 12;

/// Runs `f` with the host lock released (if this thread holds it), then takes it back.
pub fn without_host_lock<R>(f: impl FnOnce() -> R) -> R {
    let Some(hook) = HOOK.get() else { return f() };
    let mut f = Some(f);
    let mut out = None;
    hook(&mut || out = Some((f.take().expect("called once"))()));
    out.expect("the host hook must run the closure")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static HOOK_RUNS: AtomicUsize = AtomicUsize::new(0);

    fn counting_hook(f: &mut dyn FnMut()) {
        HOOK_RUNS.fetch_add(1, Ordering::SeqCst);
        f()
    }

    #[test]
    fn runs_the_work_once_through_the_hook_and_returns_its_value() {
        set_host_lock_hook(counting_hook);
        let before = HOOK_RUNS.load(Ordering::SeqCst);
        let mut calls = 0;
        let v = without_host_lock(|| {
            calls += 1;
            41 + 1
        });
        assert_eq!((v, calls), (42, 1));
        assert_eq!(HOOK_RUNS.load(Ordering::SeqCst), before + 1);
    }
}
