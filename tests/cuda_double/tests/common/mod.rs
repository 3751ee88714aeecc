//! Shared test helpers: one global lock (the double's state is process-wide), a log file per
//! test process, and child processes for what needs a fresh process (a configuration, a
//! crash, a second IPC party).
#![allow(dead_code)]

use rivet_cuda_double::api::device::*;
use rivet_cuda_double::api::Handle;
use std::sync::{Mutex, MutexGuard, Once};

static LOCK: Mutex<()> = Mutex::new(());
static INIT: Once = Once::new();

/// The log file of this process.
pub fn log_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("rivet-cuda-double-test-{}.log", std::process::id()))
}

/// Serialises the test and sets the log file (before any call can report).
pub fn lock() -> MutexGuard<'static, ()> {
    INIT.call_once(|| {
        let _ = std::fs::remove_file(log_path());
        // SAFETY (of set_var in a threaded test binary): every test takes this Once before
        // touching the environment or the double.
        std::env::set_var("RIVET_CUDA_DOUBLE_LOG", log_path());
    });
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// `lock` plus `cuInit(0)`.
pub fn init() -> MutexGuard<'static, ()> {
    let g = lock();
    // SAFETY: the double's entry points take plain values here.
    assert_eq!(unsafe { cuInit(0) }, 0);
    g
}

fn log_len() -> usize {
    std::fs::read_to_string(log_path())
        .map(|s| s.len())
        .unwrap_or(0)
}

/// Runs `f`, which must return `want` and log a line containing `needle`.
pub fn expect(want: u32, needle: &str, f: impl FnOnce() -> u32) {
    let before = log_len();
    let got = f();
    let text = std::fs::read_to_string(log_path()).unwrap_or_default();
    let new = &text[before.min(text.len())..];
    assert_eq!(got, want, "code (log: {new})");
    assert!(
        new.lines()
            .any(|l| l.starts_with("rivet-cuda-double: ") && l.contains(needle)),
        "no log line containing {needle:?}; new log: {new:?}"
    );
}

/// Retains device `dev`'s primary context and makes it current on this thread.
pub fn ctx(dev: i32) -> Handle {
    let mut c: Handle = std::ptr::null_mut();
    // SAFETY: out-parameter.
    unsafe {
        assert_eq!(cuDevicePrimaryCtxRetain(&mut c, dev), 0);
        assert_eq!(cuCtxSetCurrent(c), 0);
    }
    c
}

/// In a child: whether this process is the child for `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var("RIVET_CUDA_DOUBLE_CHILD").as_deref() == Ok(name)
}

/// Re-runs this test binary's test `name` alone, as the child, with `env`.
pub fn child(name: &str, env: &[(&str, &str)]) -> std::process::Output {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("RIVET_CUDA_DOUBLE_CHILD", name)
        .env_remove("RIVET_CUDA_DOUBLE_LOG");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}
