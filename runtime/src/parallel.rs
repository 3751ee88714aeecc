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
