//! Shared helpers for rivet's cross-crate integration tests (`tests/tests/*.rs`).

use rivet_compiler::ir::IterVar;
use rivet_compiler::te::{self, compute, placeholder, Tensor};
use rivet_runtime::DType;

pub mod backends;
pub mod device;
pub mod ffi;
pub mod floats;
pub mod golden;
pub use backends::{
    backend_names, backends, cuda_usable, gpu_schedule_backends, Backend, Needs, BACKENDS,
};
pub use device::{call, on_host};

/// The seed program: `C[i, j] = sum_k A[i, k] * B[k, j]` over a symbolic `n`.
pub struct SeedGemm {
    pub a: Tensor,
    pub b: Tensor,
    pub c: Tensor,
    pub k: IterVar,
}

impl SeedGemm {
    pub fn new() -> SeedGemm {
        let n = te::var("n");
        let a = placeholder([&n, &n], DType::F32, "A").unwrap();
        let b = placeholder([&n, &n], DType::F32, "B").unwrap();
        let k = te::reduce_axis(0, &n, "k").unwrap();
        let c = compute(
            [&n, &n],
            |[i, j]| te::sum(a.at((i, &k)) * b.at((&k, j)), &k),
            "C",
        )
        .unwrap();
        SeedGemm { a, b, c, k }
    }

    /// The arguments in call order.
    pub fn args(&self) -> Vec<Tensor> {
        vec![self.a.clone(), self.b.clone(), self.c.clone()]
    }
}

impl Default for SeedGemm {
    fn default() -> Self {
        SeedGemm::new()
    }
}

/// Runs the test `name` of the current test binary in a child process with `env` set (for
/// choices a process makes once: `RIVET_EXP_RUN`, `RIVET_MICROKERNEL`) and fails unless the
/// child passed exactly that test. Inside such a child (the first variable already set) it
/// returns at once: the test itself runs there.
pub fn run_in_child(name: &str, env: &[(&str, &str)]) {
    if env.first().is_some_and(|(k, _)| std::env::var(k).is_ok()) {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads=1"])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{env:?} {name}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the test `name` once per micro-kernel variant this CPU has, each forced with
/// `RIVET_MICROKERNEL` in a child process (`run_in_child`), with `PROPTEST_CASES=8`.
pub fn run_per_microkernel_variant(name: &str) {
    use rivet_compiler::codegen::cpu_lib::microkernel::Variant;
    for v in Variant::ALL.into_iter().filter(|v| v.supported()) {
        run_in_child(
            name,
            &[("RIVET_MICROKERNEL", v.name()), ("PROPTEST_CASES", "8")],
        );
    }
}

/// `n` deterministic pseudo-random floats in `[lo, hi)` (xorshift64, 53-bit mantissas) from
/// `seed`: test data that is fresh per seed and the same on every machine.
pub fn uniform(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            lo + (hi - lo) * ((x >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

/// docs/testing.md's Rust blocks use this crate's macros, so they are doctests here rather than
/// in the `rivet` crate (`docs_book` there holds the other pages).
#[cfg(doctest)]
mod docs_book {
    #[doc = include_str!("../../docs/testing.md")]
    struct Testing;
}

/// Whether a pack of the defaulted schedule `s` is indexed by the product's rows (the default
/// CPU schedule's row-by-row GEMM: an axis `<pack>.rows`, the batch axes flattened).
pub fn packs_by_rows(s: &rivet_compiler::Schedule) -> bool {
    s.stages.iter().any(|st| {
        st.tensor.name().ends_with("_packed")
            && st
                .tensor
                .axis()
                .iter()
                .any(|a| a.var.name.ends_with(".rows"))
    })
}
