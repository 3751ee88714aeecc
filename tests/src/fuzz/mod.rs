//! The fuzzing harness behind `cargo run -p rivet-tests --bin fuzz` (docs/testing.md, "Fuzzing").
//!
//! Stable Rust only: no libFuzzer. Each generator is structure-aware: it draws a whole
//! program, module mutation, DLPack capsule, C ABI call or XLA FFI call frame from a seeded
//! RNG (one `u64` per case, so any case replays exactly with `--replay SEED`), runs it, and
//! classifies the outcome. The
//! supervisor in `bin/fuzz.rs` runs the cases in a child process, so a crash or a hang is
//! recorded with its seed and the soak goes on.
//!
//! The modules are shared with `tests/tests/fuzz_regressions.rs` through `#[path]` includes
//! (the tests crate's library is not ours to extend), hence the `allow(dead_code)`s there.

pub mod capi_gen;
pub mod dlpack_gen;
pub mod guarded;
pub mod module_gen;
pub mod rng;
pub mod te_gen;
pub mod xla_gen;

use std::fmt;

/// What one case ended in.
#[derive(Debug)]
pub enum Outcome {
    /// Ran and every check passed (results compared, inputs intact, canaries intact).
    Pass,
    /// Refused with a typed (user) error, the same on every target; the kind is counted.
    Typed(String),
    /// A wrong result, an internal error, damaged memory, targets disagreeing: a bug.
    Fail(String),
}

impl Outcome {
    pub fn fail(msg: impl Into<String>) -> Outcome {
        Outcome::Fail(msg.into())
    }
}

/// A generator: draws one case from `seed` and runs it.
pub struct Generator {
    pub name: &'static str,
    pub run: fn(u64, bool) -> Outcome,
}

/// Every generator, in round-robin order. The `bool` asks for a description of the case on
/// stderr (replays).
pub fn generators() -> Vec<Generator> {
    vec![
        Generator {
            name: "te",
            run: te_gen::run_case,
        },
        Generator {
            name: "module",
            run: module_gen::run_case,
        },
        Generator {
            name: "dlpack",
            run: dlpack_gen::run_case,
        },
        Generator {
            name: "capi",
            run: capi_gen::run_case,
        },
        Generator {
            name: "xla",
            run: xla_gen::run_case,
        },
    ]
}

/// The variant name of a runtime error (the typed contract; messages are free text).
pub fn kind(e: &rivet_runtime::Error) -> &'static str {
    use rivet_runtime::Error as E;
    match e {
        E::Shape(_) => "Shape",
        E::DType(_) => "DType",
        E::Device(_) => "Device",
        E::Argument(_) => "Argument",
        E::ReadOnly(_) => "ReadOnly",
        E::Layout(_) => "Layout",
        E::DLPack(_) => "DLPack",
        E::NotFound(_) => "NotFound",
        E::Registry(_) => "Registry",
        E::Compile(_) => "Compile",
        E::Memory(_) => "Memory",
        E::Index(_) => "Index",
        E::NotDifferentiable(_) => "NotDifferentiable",
        E::Ipc(_) => "Ipc",
        E::Library(_) => "Library",
        E::Foreign(_) => "Foreign",
        E::Internal(_) => "Internal",
    }
}

/// The kind of a compiler error, mapped onto the runtime's variants.
pub fn ckind(e: &rivet_compiler::Error) -> &'static str {
    match e {
        rivet_compiler::Error::Compile(_) => "Compile",
        rivet_compiler::Error::Internal(_) => "Internal",
        rivet_compiler::Error::Runtime(r) => kind(r),
    }
}

/// Adversarial integers: around 2^31, 2^32, 2^62, the i64 extremes, and small values.
pub const ADVERSARIAL: [i64; 22] = [
    0,
    1,
    -1,
    2,
    3,
    7,
    -7,
    (1 << 31) - 1,
    1 << 31,
    -(1 << 31),
    (1 << 32) + 1,
    1 << 61,
    (1 << 62) - 1,
    1 << 62,
    -(1 << 62),
    i64::MAX,
    i64::MAX - 1,
    i64::MIN,
    i64::MIN + 1,
    0x2492_4924_9249_2493, // (2^64 + 5) / 7: times 7 wraps to 5
    46341,                 // its square passes 2^31
    3_037_000_500,         // its square passes 2^63
];

/// A short, printable error message (first line, at most 300 characters).
pub fn short(msg: &str) -> String {
    let line = msg.lines().next().unwrap_or("");
    line.chars().take(300).collect()
}

/// Per-generator tallies, printed as one summary line each.
#[derive(Default, Clone, Debug)]
pub struct Tally {
    pub cases: u64,
    pub passed: u64,
    pub typed: u64,
    pub failed: u64,
    pub crashed: u64,
    pub hung: u64,
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} cases: {} ran and matched, {} typed errors, {} wrong/internal, {} crashes, {} hangs",
            self.cases, self.passed, self.typed, self.failed, self.crashed, self.hung
        )
    }
}
