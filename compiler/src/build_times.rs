//! `RIVET_BUILD_TIMES=1`: where a build's time goes, one stderr line per phase
//! (`rivet: build time: <phase> <wall ms> ms wall <cpu ms> ms cpu`), nested phases indented
//! under the one that holds them. The CPU time is the running thread's
//! (`CLOCK_THREAD_CPUTIME_ID`): on a loaded machine it stays what the phase costs while the
//! wall time also counts the other processes that ran meanwhile. A diagnostic for measuring
//! the pipeline (`benches/build_phases.py`), not an interface.
//!
//! Invariants: the variable is read once per process (a `OnceLock`), so an untimed build pays
//! one atomic load per phase and nothing else; phases print when they end, from whichever
//! thread ran them (the compile thread, `build::on_compile_stack`), so concurrent builds
//! interleave their lines.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Instant;

/// Whether `RIVET_BUILD_TIMES` is set to something other than `""` or `0`.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("RIVET_BUILD_TIMES").is_ok_and(|v| !v.is_empty() && v != "0"))
}

thread_local! {
    /// Nesting depth of the timed phases running on this thread (indentation only).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Runs `f`, printing how long it took as phase `what` when timing is on.
pub fn phase<T>(what: &str, f: impl FnOnce() -> T) -> T {
    phase_named(|| what.to_string(), f)
}

/// `phase` with the name made only when timing is on.
pub fn phase_named<T>(what: impl FnOnce() -> String, f: impl FnOnce() -> T) -> T {
    if !enabled() {
        return f();
    }
    let what = what();
    let depth = DEPTH.with(|d| {
        let n = d.get();
        d.set(n + 1);
        n
    });
    let (t, c) = (Instant::now(), thread_cpu_ms());
    let out = f();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let cpu = thread_cpu_ms() - c;
    DEPTH.with(|d| d.set(depth));
    eprintln!(
        "rivet: build time: {:indent$}{what} {ms:.3} ms wall {cpu:.3} ms cpu",
        "",
        indent = 2 * depth
    );
    out
}

/// The CPU time this thread has run, in ms (0 where the clock is not available).
fn thread_cpu_ms() -> f64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write; the clock id is a constant libc knows.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 * 1e-6;
        }
    }
    #[allow(unreachable_code)]
    0.0
}
