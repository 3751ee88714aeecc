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

/// Work below this many iterations (elements for native functions, innermost loop
/// iterations for compiled kernels) runs on the calling thread: waking workers costs more
/// than it saves.
pub const PARALLEL_GRAIN: i64 = 1 << 16;

/// The least work one chunk of a parallel loop gets: handing a chunk to a worker costs about a
/// microsecond, 2^14 iterations take ten or more.
pub const MIN_CHUNK_WORK: i64 = 1 << 14;

/// The most chunks per thread: a few, so a thread slowed by a noisy neighbour (the machines
/// are shared) leaves its last chunks to the others, and few enough that each chunk stays a
/// long contiguous run of rows, streamed by one core through its own cache and prefetcher.
pub const CHUNKS_PER_THREAD: i64 = 4;

thread_local! {
    static SERIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static CALL_WORK: std::cell::Cell<i64> = const { std::cell::Cell::new(i64::MAX) };
}

/// How many contiguous chunks a parallel loop of `extent` iterations is split into, on
/// `threads` threads, when the whole call does `work` iterations: at most
/// `CHUNKS_PER_THREAD` per thread, at least `MIN_CHUNK_WORK` of work each (estimated as an
/// equal share of the call's work), never more than the iterations. 1 means: run it inline.
pub fn chunks(extent: i64, threads: i64, work: i64) -> i64 {
    if extent < 2 || threads < 2 {
        return 1;
    }
    let by_work = (work / MIN_CHUNK_WORK).max(1);
    extent
        .min(threads.saturating_mul(CHUNKS_PER_THREAD))
        .min(by_work)
        .max(1)
}

/// Runs `f` with `work` recorded as the work of the call being run on this thread (read by
/// parallel loops to size their chunks: `call_work`).
pub fn with_call_work<R>(work: i64, f: impl FnOnce() -> R) -> R {
    struct Restore(i64);
    impl Drop for Restore {
        fn drop(&mut self) {
            CALL_WORK.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(CALL_WORK.with(|s| s.replace(work)));
    f()
}

/// The work of the call running on this thread (`with_call_work`); `i64::MAX` when unknown.
pub fn call_work() -> i64 {
    CALL_WORK.with(|s| s.get())
}

/// True on one of rivet's pool threads: a parallel loop started there (inside another
/// parallel region) runs inline, so the pool is never oversubscribed by nesting.
pub fn in_pool() -> bool {
    POOL.current_thread_index().is_some()
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
    fn chunks_follow_the_rule() {
        // Large work: 4 chunks per thread, never more than the iterations.
        assert_eq!(chunks(1000, 2, 1 << 30), 8);
        assert_eq!(chunks(3, 2, 1 << 30), 3);
        // Small work: one chunk per MIN_CHUNK_WORK iterations.
        assert_eq!(chunks(1000, 2, 2 * MIN_CHUNK_WORK), 2);
        assert_eq!(chunks(1000, 16, 5 * MIN_CHUNK_WORK + 1), 5);
        assert_eq!(chunks(1000, 2, MIN_CHUNK_WORK - 1), 1);
        // One thread or one iteration: inline.
        assert_eq!(chunks(1000, 1, i64::MAX), 1);
        assert_eq!(chunks(1, 8, i64::MAX), 1);
        assert_eq!(chunks(0, 8, i64::MAX), 1);
        assert_eq!(
            chunks(i64::MAX, i64::MAX, i64::MAX),
            i64::MAX / MIN_CHUNK_WORK
        );
    }

    #[test]
    fn call_work_is_scoped() {
        assert_eq!(call_work(), i64::MAX);
        assert_eq!(
            with_call_work(5, || (call_work(), with_call_work(7, call_work))),
            (5, 7)
        );
        assert_eq!(call_work(), i64::MAX);
        assert!(!in_pool());
        assert!(pool().install(in_pool));
    }

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
