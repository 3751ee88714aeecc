//! The backends every cross-crate test runs: the one list (CubeCL's model: one suite,
//! parametrised by backend, instead of a list in each test file).
//!
//! A suite is a set of functions taking the backend's `&Target`; [`for_each_backend!`]
//! instantiates each of them once per backend, as `#[test]`s in one module per backend
//! (`interp::name`, `cpu::name`, `cuda::name`):
//!
//! ```ignore
//! fn gemm_matches_naive(target: &Target) { /* build for `target`, call, compare */ }
//! rivet_tests::for_each_backend!(gemm_matches_naive);
//! ```
//!
//! The suite passes host tensors and reads host results on every backend: it calls its
//! functions through [`crate::call`], which gives a CUDA function device mirrors of them
//! (`cuMemcpyHtoD_v2`), synchronises and copies the results and every writable argument
//! back (`cuMemcpyDtoH_v2`; `crate::device`). So every kernel the CPU suite runs also runs
//! on CUDA, with the same data and the same checks.
//!
//! Before the list of tests, the capabilities the suite needs (`host_memory`: its kernels
//! use host memory directly, which a mirror cannot give: host callbacks that see the
//! tensors, views kept across calls; `gpu_schedules`: it builds GPU-scheduled programs); an
//! instantiation on a backend without them, or on `cuda` where rivet finds no usable device,
//! passes after printing `SKIPPED <backend>::<test>: <why>` (run with `--nocapture` to see
//! it), so the cuda entry is always compiled and listed, and says why it did not run. With
//! `RIVET_REQUIRE_CUDA=1` (`make test`'s run on the CUDA driver double) a cuda entry that
//! finds no device fails instead: a broken driver is never a silent skip.
//!
//! Adding a backend is one entry in `BACKENDS` and one line in `for_each_backend!` (a test
//! checks that the two agree). Loops over backends inside a test (comparisons of every
//! backend with the interpreter) use `backends()` / `backend_names()`, which hold the
//! backends of `BACKENDS` that run here on host tensors without a mirror.
//!
//! How results are compared across backends is docs/tolerance.md: the CPU backend equals the
//! interpreter bit for bit; CUDA too but for transcendentals (ulp bounds).

use rivet_compiler::Target;

/// One backend of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    /// The target spelling (`Target::parse` accepts it) and the suite's module name.
    pub name: &'static str,
    /// Runs only where a CUDA device rivet can launch on is present (`cuda_usable`).
    pub needs_gpu: bool,
    /// Its functions take tensors in host memory (CUDA's take device memory: suites reach
    /// them through `crate::call`'s mirrors, but not from host callbacks).
    pub host_memory: bool,
    /// Runs GPU-scheduled programs (loops bound to blockIdx / threadIdx); the CPU backend
    /// refuses them.
    pub gpu_schedules: bool,
    /// Runs what rivet does on the host for host functions: CPU-parallel loops, the call fast
    /// path (`call::plan`, which CUDA functions do not take), the CPU default schedule's
    /// fallback to the program as written for deep chains of stages.
    pub host_code: bool,
}

/// A capability a suite needs of a backend (`for_each_backend!(host_memory: ...)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum Needs {
    /// The suite's kernels use host memory directly (host callbacks, views kept across
    /// calls): a backend of device memory cannot run it, mirrors or not.
    host_memory,
    gpu_schedules,
    /// The suite tests host-only machinery (`Backend::host_code`).
    host_code,
}

/// Every backend, the oracle (the interpreter) first: tests compare the others with it.
pub const BACKENDS: &[Backend] = &[
    Backend {
        name: "interp",
        needs_gpu: false,
        host_memory: true,
        gpu_schedules: true,
        host_code: true,
    },
    Backend {
        name: "cpu",
        needs_gpu: false,
        host_memory: true,
        gpu_schedules: false,
        host_code: true,
    },
    Backend {
        name: "cuda",
        needs_gpu: true,
        host_memory: false,
        gpu_schedules: true,
        host_code: false,
    },
];

/// Instantiates the suite functions `fn name(target: &Target)` once per backend of
/// `BACKENDS`, as `#[test] fn name()` in modules `interp`, `cpu` and `cuda` (the module
/// docs above). `for_each_backend!(a, b)` runs on every backend; groups with the
/// capabilities they need run only on backends that have them, the others printing why they
/// skip (one invocation per file: it writes the modules):
///
/// ```ignore
/// rivet_tests::for_each_backend! {
///     a, b;
///     host_memory: c;
///     gpu_schedules: d;
/// }
/// ```
#[macro_export]
macro_rules! for_each_backend {
    // The one list of backends (the same names as `BACKENDS`, in its order).
    (@list $($groups:tt)+) => {
        $crate::for_each_backend!(@backend interp $($groups)+);
        $crate::for_each_backend!(@backend cpu $($groups)+);
        $crate::for_each_backend!(@backend cuda $($groups)+);
    };
    (@backend $b:ident $($needs:tt [$($test:ident),+])+) => {
        mod $b {
            $($(
                #[test]
                pub fn $test() {
                    if let Some(target) = $crate::backends::target_or_skip(
                        stringify!($b),
                        stringify!($test),
                        &$crate::for_each_backend!(@needs $needs),
                    ) {
                        super::$test(&target);
                    }
                }
            )+)+
        }
    };
    (@needs [$($need:ident),*]) => {
        [$($crate::backends::Needs::$need),*]
    };
    ($($($need:ident),+ : $($test:ident),+);+ $(;)?) => {
        $crate::for_each_backend!(@list $([$($need),+] [$($test),+])+);
    };
    ($($test:ident),+ $(,)?) => {
        $crate::for_each_backend!(@list [] [$($test),+]);
    };
    // Tests needing nothing first, then groups with needs.
    ($($test:ident),+ ; $($($need:ident),+ : $($t2:ident),+);+ $(;)?) => {
        $crate::for_each_backend!(@list [] [$($test),+] $([$($need),+] [$($t2),+])+);
    };
}

/// The backend named `name` (a `BACKENDS` entry; panics otherwise).
pub fn backend(name: &str) -> &'static Backend {
    BACKENDS
        .iter()
        .find(|b| b.name == name)
        .unwrap_or_else(|| panic!("{name} is not in rivet_tests::BACKENDS"))
}

/// Why the CUDA backend cannot run kernels here (`None`: it can): rivet's own probe
/// (`codegen::cuda::driver::device_count`: the driver library loads and reports a device).
pub fn cuda_unusable_reason() -> Option<String> {
    match rivet_compiler::codegen::cuda::driver::device_count() {
        Ok(0) => Some("the CUDA driver reports no device".into()),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Whether rivet can run kernels on a CUDA device here.
pub fn cuda_usable() -> bool {
    cuda_unusable_reason().is_none()
}

/// Whether a cuda entry that finds no device must fail rather than skip
/// (`RIVET_REQUIRE_CUDA=1`, set by `make test` for its run on the CUDA driver double).
pub fn cuda_required() -> bool {
    std::env::var("RIVET_REQUIRE_CUDA").is_ok_and(|v| v == "1")
}

/// Why `b` cannot run a suite needing `needs` here (`None`: it can). A missing capability
/// comes first: it is a property of the suite, whatever the machine.
pub fn skip_reason(b: &Backend, needs: &[Needs]) -> Option<String> {
    let lacking = needs.iter().find_map(|n| {
        let has = match n {
            Needs::host_memory => b.host_memory,
            Needs::gpu_schedules => b.gpu_schedules,
            Needs::host_code => b.host_code,
        };
        (!has).then(|| match n {
            Needs::host_memory => format!(
                "the suite's kernels use host memory directly (host callbacks, views kept across calls), which {} cannot give them",
                b.name
            ),
            Needs::gpu_schedules => format!("the suite needs gpu_schedules, which {} lacks", b.name),
            Needs::host_code => format!(
                "the suite tests host-only machinery (CPU-parallel loops, the host call fast path, the CPU default schedule's fallbacks), which {} does not run",
                b.name
            ),
        })
    });
    if lacking.is_some() {
        return lacking;
    }
    if b.needs_gpu {
        if let Some(why) = cuda_unusable_reason() {
            return Some(why);
        }
    }
    None
}

/// Why `b` cannot run a suite needing `needs` (as [`skip_reason`]); panics instead when the
/// reason is a missing CUDA device and [`cuda_required`].
fn skip_reason_or_fail(b: &Backend, needs: &[Needs]) -> Option<String> {
    let why = skip_reason(b, needs)?;
    let capability = needs.iter().any(|n| match n {
        Needs::host_memory => !b.host_memory,
        Needs::gpu_schedules => !b.gpu_schedules,
        Needs::host_code => !b.host_code,
    });
    if b.needs_gpu && !capability && cuda_required() {
        panic!(
            "RIVET_REQUIRE_CUDA=1 but the {} backend cannot run: {why}",
            b.name
        );
    }
    Some(why)
}

/// The target of backend `name` for the test `test`, or `None` after printing why the
/// backend skips it (the body of each test `for_each_backend!` writes).
pub fn target_or_skip(name: &str, test: &str, needs: &[Needs]) -> Option<Target> {
    let b = backend(name);
    if let Some(why) = skip_reason_or_fail(b, needs) {
        eprintln!("SKIPPED {name}::{test}: {why}");
        return None;
    }
    Some(Target::parse(name).expect("BACKENDS holds target spellings"))
}

fn runnable_on_host(b: &Backend) -> bool {
    skip_reason(b, &[Needs::host_memory]).is_none()
}

/// The backends this machine runs on host tensors, as targets, the oracle first.
pub fn backends() -> Vec<Target> {
    backend_names()
        .into_iter()
        .map(|n| Target::parse(n).expect("BACKENDS holds target spellings"))
        .collect()
}

/// Names of `backends()` (for messages and APIs taking a spelling).
pub fn backend_names() -> Vec<&'static str> {
    BACKENDS
        .iter()
        .filter(|b| runnable_on_host(b))
        .map(|b| b.name)
        .collect()
}

/// The `backends()` that run GPU schedules: the explicit subset for those tests.
pub fn gpu_schedule_backends() -> Vec<Target> {
    BACKENDS
        .iter()
        .filter(|b| runnable_on_host(b) && b.gpu_schedules)
        .map(|b| Target::parse(b.name).expect("BACKENDS holds target spellings"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    static RAN: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn record(target: &Target) {
        RAN.lock().unwrap().push(target.kind_name().to_string());
    }

    crate::for_each_backend!(record);

    #[test]
    fn the_oracle_comes_first_and_every_name_parses() {
        assert_eq!(BACKENDS[0].name, "interp");
        for b in BACKENDS {
            let t = Target::parse(b.name).unwrap();
            assert_eq!(t.kind_name(), b.name);
        }
        assert_eq!(backends().len(), backend_names().len());
        assert_eq!(backend_names()[..2], ["interp", "cpu"]);
    }

    #[test]
    fn the_macro_instantiates_every_backend_of_backends() {
        interp::record();
        cpu::record();
        cuda::record();
        let ran = RAN.lock().unwrap().clone();
        let mut want: Vec<&str> = BACKENDS
            .iter()
            .filter(|b| skip_reason(b, &[]).is_none())
            .map(|b| b.name)
            .collect();
        // The test harness may also have run the instantiations themselves.
        for r in &ran {
            assert!(want.contains(&r.as_str()), "{r} ran but is not runnable");
        }
        want.dedup();
        for w in want {
            assert!(ran.iter().any(|r| r == w), "{w} never ran: {ran:?}");
        }
    }

    #[test]
    fn a_missing_capability_is_a_reason_to_skip() {
        let cpu = backend("cpu");
        assert!(skip_reason(cpu, &[Needs::host_memory]).is_none());
        assert!(skip_reason(cpu, &[Needs::gpu_schedules])
            .unwrap()
            .contains("gpu_schedules"));
        let cuda = backend("cuda");
        assert!(skip_reason(cuda, &[Needs::host_memory]).is_some());
    }
}

#[cfg(test)]
mod list_tests {
    /// The suite's list is the compiler's (`TargetKind::ALL`, which `rivet.targets()` gives
    /// Python), in the same order: a new target kind cannot go untested.
    #[test]
    fn the_backends_are_the_compilers_target_kinds() {
        let ours: Vec<&str> = super::BACKENDS.iter().map(|b| b.name).collect();
        let kinds: Vec<&str> = rivet_compiler::TargetKind::ALL
            .iter()
            .map(|k| k.name())
            .collect();
        assert_eq!(ours, kinds);
    }
}
