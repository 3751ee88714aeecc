//! rivet's thread pool for native and generated CPU code. Its size is `RIVET_NUM_THREADS`
//! when set (>= 1), else rayon's default (one thread per core). A private pool keeps rivet's
//! workers apart from the global rayon pool a host application may configure differently.

use std::sync::LazyLock;

static POOL: LazyLock<rayon::ThreadPool> = LazyLock::new(|| {
    let n = std::env::var("RIVET_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n >= 1);
    let mut b = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("rivet-{i}"));
    if let Some(n) = n {
        b = b.num_threads(n);
    }
    b.build().unwrap_or_else(|_| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("1-thread pool")
    })
});

pub fn pool() -> &'static rayon::ThreadPool {
    &POOL
}

pub fn num_threads() -> usize {
    POOL.current_num_threads()
}

/// Elementwise work below this many elements runs on the calling thread: waking workers
/// costs more than it saves.
pub const PARALLEL_GRAIN: i64 = 1 << 16;

thread_local! {
    static SERIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with rivet's parallel loops started on this thread executed inline: for calls
/// whose total work is below `PARALLEL_GRAIN`, where waking the pool costs more than it
/// saves (a 4x4 matmul took 20 us through the pool, 0.6 us inline).
pub fn serially<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SERIAL.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SERIAL.with(|s| s.replace(true)));
    f()
}

/// True inside `serially` on this thread.
pub fn serial_requested() -> bool {
    SERIAL.with(|s| s.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serially_sets_and_restores_the_flag() {
        assert!(!serial_requested());
        let inner = serially(|| (serial_requested(), serially(serial_requested)));
        assert_eq!(inner, (true, true));
        assert!(!serial_requested());
        let caught = std::panic::catch_unwind(|| serially(|| panic!("boom")));
        assert!(caught.is_err() && !serial_requested());
    }
}
