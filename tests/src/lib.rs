//! Shared helpers for rivet's cross-crate integration tests (`tests/tests/*.rs`).

use rivet_compiler::ir::{Expr, IterVar};
use rivet_compiler::te::{self, ax, compute, ok, placeholder, Tensor};
use rivet_runtime::DType;

pub mod backends;
pub use backends::{backend_names, backends, cuda_usable, gpu_schedule_backends, BACKENDS};

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
        let a = placeholder(&[n.clone(), n.clone()], DType::F32, "A").unwrap();
        let b = placeholder(&[n.clone(), n.clone()], DType::F32, "B").unwrap();
        let k = te::reduce_axis(Expr::int(0), n.clone(), "k").unwrap();
        let c = compute(
            &[n.clone(), n],
            |i| {
                ok(te::sum(
                    a.idx(&[i[0].clone(), ax(&k)]) * b.idx(&[ax(&k), i[1].clone()]),
                    &[k.clone()],
                ))
            },
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

/// Runs the test `name` of the current test binary in a child process with `key=value` set
/// (for choices a process makes once, like `RIVET_EXP_RUN`) and fails unless it passed.
pub fn run_in_child(name: &str, key: &str, value: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads=1", "--include-ignored"])
        .env(key, value)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{key}={value} {name}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the test `name` of the current test binary once per micro-kernel variant this CPU has,
/// each forced with `RIVET_MICROKERNEL` in a child process (the choice is made once per
/// process), with `PROPTEST_CASES=8`; asserts each child passed exactly that test. Returns
/// without doing anything inside such a child (the property itself runs there).
pub fn run_per_microkernel_variant(name: &str) {
    use rivet_compiler::codegen::microkernel::Variant;
    if std::env::var("RIVET_MICROKERNEL").is_ok() {
        return;
    }
    for v in Variant::ALL.into_iter().filter(|v| v.supported()) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads=1"])
            .env("RIVET_MICROKERNEL", v.name())
            .env("PROPTEST_CASES", "8")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{}: {text}{}",
            v.name(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
