//! rivet's thread pool for native and generated CPU code. `RIVET_NUM_THREADS` (>= 1) threads
//! when set, else one per core (`available_parallelism`): the calling thread and
//! `num_threads() - 1` pool workers. A private pool keeps rivet's workers apart from the global
//! rayon pool a host application may configure differently.
//!
//! Parallel loops run through `for_each_chunk`: the caller takes chunks too and waits only for
//! the chunks the workers have taken. A blocking `broadcast` from outside the pool put the
//! caller to sleep until every worker had run: on the shared VMs this project measures on, a
//! `Y = 2 X` of 256 x 256 took 3.6 us on one thread and 13.5 us on two (512 x 512: 19.5 and
//! 22.3 us, slower than one), while torch's two threads halve it.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, LazyLock};

/// The threads a parallel loop runs on: the caller and the pool's workers.
static THREADS: LazyLock<usize> = LazyLock::new(|| {
    std::env::var("RIVET_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n >= 1)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
});

/// `num_threads() - 1` workers (at least one: rayon has no empty pool; with one thread in all
/// no parallel loop uses it).
static POOL: LazyLock<rayon::ThreadPool> = LazyLock::new(|| {
    rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("rivet-{i}"))
        .num_threads(num_threads().saturating_sub(1).max(1))
        .build()
        .unwrap_or_else(|_| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .expect("1-thread pool")
        })
});

pub fn pool() -> &'static rayon::ThreadPool {
    &POOL
}

/// The threads a parallel loop runs on (`RIVET_NUM_THREADS`, or one per core).
pub fn num_threads() -> usize {
    *THREADS
}

/// What `for_each_chunk` shares with the workers. `f` is the caller's closure with its
/// lifetime erased: it is called only for a chunk claimed from `next` below `chunks`, and the
/// caller leaves `for_each_chunk` (returning or unwinding) only once no more chunks can be
/// claimed and `done` counts every claimed one (`Finish`), so no call of `f` outlives the
/// borrow; a worker that wakes late claims nothing and touches only this `Arc`'d state.
struct Shared {
    next: AtomicI64,
    done: AtomicI64,
    chunks: i64,
    /// A chunk run by a worker panicked (the caller then panics too, as `rayon::join` does).
    panicked: AtomicBool,
    f: *const (dyn Fn(i64) + Sync + 'static),
}

// SAFETY: `f` is `Sync` (called from several threads at once) and only called while the
// caller of `for_each_chunk` waits (the comment on `Shared`); the rest is atomics.
unsafe impl Send for Shared {}
// SAFETY: as for `Send`: shared use is calls of a `Sync` closure and atomic operations.
unsafe impl Sync for Shared {}

impl Shared {
    /// Claims and runs chunks until none is left.
    fn work(&self) {
        struct Count<'a>(&'a AtomicI64);
        impl Drop for Count<'_> {
            // Counted even if `f` unwinds, so the caller never waits forever.
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Release);
            }
        }
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.chunks {
                return;
            }
            let _count = Count(&self.done);
            // SAFETY: `c < chunks` was claimed by this thread alone, so the caller is still
            // waiting for it and the closure is alive (`Shared`).
            unsafe { (*self.f)(c) };
        }
    }
}

/// The caller's exit from `for_each_chunk`, on return or unwind (its own chunk panicked): no
/// chunk can be claimed any more, then wait until every claimed one has run. On the normal
/// path every chunk was claimed; each one a worker still runs is at most a chunk's time away.
struct Finish<'a>(&'a Shared);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        let s = self.0;
        let claimed = s.next.fetch_max(s.chunks, Ordering::Relaxed).min(s.chunks);
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < claimed {
            if spins < 1 << 12 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Runs `f(c)` once for every `c` in `[0, chunks)` on the calling thread and the pool's
/// workers, each taking the next chunk from a shared counter (a dynamic schedule), and returns
/// once all have run. The workers are woken without waiting for them: when they are slow to
/// wake, the caller runs every chunk itself, never slower than one thread. Inline (in order)
/// with fewer than two threads, one chunk, or inside another parallel region (`in_pool`). A
/// panic in `f` reaches the caller (after the chunks already started have finished; chunks not
/// yet claimed may be skipped).
pub fn for_each_chunk(chunks: i64, f: &(dyn Fn(i64) + Sync)) {
    if chunks <= 1 || num_threads() < 2 || in_pool() {
        (0..chunks.max(0)).for_each(f);
        return;
    }
    // SAFETY: only the lifetime is erased; `Shared` says why no call outlives `f`.
    let f: &'static (dyn Fn(i64) + Sync + 'static) = unsafe { std::mem::transmute(f) };
    let shared = Arc::new(Shared {
        next: AtomicI64::new(0),
        done: AtomicI64::new(0),
        chunks,
        panicked: AtomicBool::new(false),
        f,
    });
    let theirs = Arc::clone(&shared);
    POOL.spawn_broadcast(move |_| {
        // Caught here: a panic escaping a spawned job aborts the process (rayon's default).
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| theirs.work())).is_err() {
            theirs.panicked.store(true, Ordering::Release);
        }
    });
    {
        struct Restore(bool);
        impl Drop for Restore {
            fn drop(&mut self) {
                IN_REGION.with(|s| s.set(self.0));
            }
        }
        let _restore = Restore(IN_REGION.with(|s| s.replace(true)));
        let _finish = Finish(&shared);
        shared.work();
    }
    if shared.panicked.load(Ordering::Acquire) {
        panic!("a chunk of a parallel loop panicked on one of rivet's pool threads");
    }
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

/// The call running on this thread, as its parallel loops see it: one thread-local for both,
/// so the inline launch of a small compiled call (`serially_with_call_work`) sets and
/// restores them with one thread-local lookup (in the Python extension every lookup is a
/// `__tls_get_addr` call).
struct CallState {
    /// Inside `serially`: parallel loops run inline.
    serial: std::cell::Cell<bool>,
    /// `with_call_work`'s work; `i64::MAX` when unknown.
    work: std::cell::Cell<i64>,
}

thread_local! {
    static CALL: CallState = const {
        CallState {
            serial: std::cell::Cell::new(false),
            work: std::cell::Cell::new(i64::MAX),
        }
    };
    /// True while this thread runs chunks of a parallel loop it started (`for_each_chunk`).
    static IN_REGION: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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
            CALL.with(|s| s.work.set(self.0));
        }
    }
    let _restore = Restore(CALL.with(|s| s.work.replace(work)));
    f()
}

/// The work of the call running on this thread (`with_call_work`); `i64::MAX` when unknown.
pub fn call_work() -> i64 {
    CALL.with(|s| s.work.get())
}

/// True on one of rivet's pool threads, or on a thread running chunks of a parallel loop it
/// started: a parallel loop started there (inside another parallel region) runs inline, so
/// the pool is never oversubscribed by nesting.
pub fn in_pool() -> bool {
    IN_REGION.with(|s| s.get()) || POOL.current_thread_index().is_some()
}

/// Runs `f` with rivet's parallel loops started on this thread executed inline: for calls
/// whose total work is below `PARALLEL_GRAIN`, where waking the pool costs more than it
/// saves (a 4x4 matmul took 20 us through the pool, 0.6 us inline).
pub fn serially<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            CALL.with(|s| s.serial.set(self.0));
        }
    }
    let _restore = Restore(CALL.with(|s| s.serial.replace(true)));
    f()
}

/// `with_call_work(work, || serially(f))` with one thread-local lookup: the launch of every
/// compiled call too small to leave the calling thread.
pub fn serially_with_call_work<R>(work: i64, f: impl FnOnce() -> R) -> R {
    struct Restore<'a>(&'a CallState, bool, i64);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            self.0.serial.set(self.1);
            self.0.work.set(self.2);
        }
    }
    CALL.with(|s| {
        let _restore = Restore(s, s.serial.replace(true), s.work.replace(work));
        f()
    })
}

/// True inside `serially` on this thread.
pub fn serial_requested() -> bool {
    CALL.with(|s| s.serial.get())
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

    // Every chunk runs exactly once, whoever runs it; nested calls run inline on the thread
    // that makes them; calls from several threads at once do not mix their chunks; hostile
    // counts (0, negative) run nothing.
    #[test]
    fn for_each_chunk_runs_each_chunk_once() {
        use std::sync::atomic::AtomicU32;
        for chunks in [0i64, -5, i64::MIN, 1, 2, 7, 64, 1000] {
            let hits: Vec<AtomicU32> = (0..chunks.clamp(0, 1000))
                .map(|_| AtomicU32::new(0))
                .collect();
            for_each_chunk(chunks, &|c| {
                hits[c as usize].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "{chunks}"
            );
        }
        // Nested: the inner loop of each chunk runs inline on the chunk's thread.
        let inner = AtomicU32::new(0);
        for_each_chunk(8, &|_| {
            let me = std::thread::current().id();
            for_each_chunk(4, &|_| {
                assert_eq!(std::thread::current().id(), me);
                inner.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(inner.load(Ordering::Relaxed), 32);
        assert!(!in_pool());
        // A panicking chunk, on whichever thread runs it, reaches the caller; the chunks
        // running then have finished (the closure's borrow ends with the call), and the pool
        // still works afterwards.
        for bad in [0i64, 5, 63] {
            let ran = AtomicU32::new(0);
            let caught = std::panic::catch_unwind(|| {
                for_each_chunk(64, &|c| {
                    if c == bad {
                        panic!("chunk {c}");
                    }
                    ran.fetch_add(1, Ordering::Relaxed);
                })
            });
            assert!(caught.is_err(), "chunk {bad}");
            assert!(ran.load(Ordering::Relaxed) <= 63);
            assert!(!in_pool());
        }
        let after = AtomicU32::new(0);
        for_each_chunk(64, &|_| {
            after.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(after.load(Ordering::Relaxed), 64);
        // Several callers at once, each with its own chunks.
        std::thread::scope(|s| {
            for t in 0..4u32 {
                s.spawn(move || {
                    for _ in 0..50 {
                        let sum = AtomicI64::new(0);
                        for_each_chunk(16, &|c| {
                            sum.fetch_add(c + i64::from(t), Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 120 + 16 * i64::from(t));
                    }
                });
            }
        });
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

    #[test]
    fn serially_with_call_work_sets_and_restores_both() {
        let before = call_work();
        let inner = serially_with_call_work(7, || {
            (
                serial_requested(),
                call_work(),
                with_call_work(9, call_work),
                call_work(),
            )
        });
        assert_eq!(inner, (true, 7, 9, 7));
        assert!(!serial_requested());
        assert_eq!(call_work(), before);
        let caught = std::panic::catch_unwind(|| serially_with_call_work(3, || panic!("boom")));
        assert!(caught.is_err() && !serial_requested());
        assert_eq!(call_work(), before);
    }
}
