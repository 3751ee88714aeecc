//! The typed compilation target: which backend, which machine features, which limits.
//!
//! A `Target` is plain data that lowering, schedules, kernels and caches can read (TVM's
//! `Target`): its kind, the CPU features detected on this machine at run time (never those
//! of the build machine), the CUDA architecture, and the limits a schedule must respect.
//! Users spell targets as strings: `"cpu"`, `"interp"`, `"cuda"`, `"cuda -arch=sm_90"`.
//! `Display` writes the canonical spelling back, which `parse` accepts: it is what modules
//! save and what kernel caches are keyed on.
//!
//! Invariants: `kind` decides which optional parts are set (`arch` only for CUDA); limits are
//! positive. There is no `"llvm"` alias: rivet's CPU backend is Cranelift, and a name that
//! promises LLVM's optimisations would mislead.

use crate::error::{Error, Result};
use std::fmt;

/// Which backend compiles for the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TargetKind {
    /// Native CPU code through Cranelift.
    Cpu,
    /// The IR interpreter: the reference meaning of every program (slow; for tests).
    Interp,
    /// CUDA C through NVRTC, for NVIDIA GPUs.
    Cuda,
}

impl TargetKind {
    /// Every kind, the interpreter (the oracle) first: the one list the test suites run over
    /// (`rivet.targets()` in Python).
    pub const ALL: [TargetKind; 3] = [TargetKind::Interp, TargetKind::Cpu, TargetKind::Cuda];

    /// The name users spell it with (`"interp"`, `"cpu"`, `"cuda"`).
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Cpu => "cpu",
            TargetKind::Interp => "interp",
            TargetKind::Cuda => "cuda",
        }
    }
}

/// x86-64 features of the machine running rivet (all false elsewhere), detected at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CpuFeatures {
    pub sse4_2: bool,
    pub avx: bool,
    pub avx2: bool,
    pub fma: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
}

impl CpuFeatures {
    /// The features of the CPU this process runs on.
    pub fn host() -> CpuFeatures {
        #[cfg(target_arch = "x86_64")]
        {
            CpuFeatures {
                sse4_2: std::is_x86_feature_detected!("sse4.2"),
                avx: std::is_x86_feature_detected!("avx"),
                avx2: std::is_x86_feature_detected!("avx2"),
                fma: std::is_x86_feature_detected!("fma"),
                avx512f: std::is_x86_feature_detected!("avx512f"),
                avx512bw: std::is_x86_feature_detected!("avx512bw"),
                avx512vl: std::is_x86_feature_detected!("avx512vl"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            CpuFeatures::default()
        }
    }

    /// The features as a list, for messages and benchmark records.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.sse4_2, "sse4.2"),
            (self.avx, "avx"),
            (self.avx2, "avx2"),
            (self.fma, "fma"),
            (self.avx512f, "avx512f"),
            (self.avx512bw, "avx512bw"),
            (self.avx512vl, "avx512vl"),
        ]
        .into_iter()
        .filter_map(|(on, n)| on.then_some(n))
        .collect()
    }
}

/// A CUDA compute capability, `sm_<major><minor>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CudaArch {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for CudaArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

impl CudaArch {
    /// The oldest architecture rivet generates code for (Ampere).
    pub const MIN: CudaArch = CudaArch { major: 8, minor: 0 };

    /// Parses `sm_80`, `sm_90`, `sm_90a`'s base `sm_90`, `compute_90`.
    pub fn parse(s: &str) -> Result<CudaArch> {
        let bad = || {
            Error::Compile(format!(
                "target option -arch: expected sm_<major><minor> such as sm_80 or sm_90, got '{s}'"
            ))
        };
        let digits = s
            .strip_prefix("sm_")
            .or_else(|| s.strip_prefix("compute_"))
            .ok_or_else(bad)?;
        let digits = digits.strip_suffix('a').unwrap_or(digits);
        if !(2..=3).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let (maj, min) = digits.split_at(digits.len() - 1);
        let arch = CudaArch {
            major: maj.parse().map_err(|_| bad())?,
            minor: min.parse().map_err(|_| bad())?,
        };
        if arch < CudaArch::MIN {
            return Err(Error::Compile(format!(
                "target option -arch: rivet generates code for {} and newer, got '{s}'",
                CudaArch::MIN
            )));
        }
        Ok(arch)
    }
}

/// What a schedule for the target must respect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Widest SIMD register the backend emits, in bytes (Cranelift's x64 backend: 16).
    pub vector_bytes: u32,
    /// Threads per block (GPU; 1 on the CPU).
    pub max_threads_per_block: u32,
    /// Static shared memory per block, in bytes (GPU; 0 on the CPU).
    pub max_shared_bytes: u32,
    /// Threads of a warp (GPU; 1 on the CPU).
    pub warp_size: u32,
}

/// A compilation target, usually given by its spelling wherever a target is taken.
///
/// ```
/// use rivet_compiler::{Target, TargetKind};
///
/// let cpu: Target = "cpu".parse().unwrap();
/// assert_eq!(cpu.kind, TargetKind::Cpu);
/// let gpu = Target::parse("cuda -arch=sm_90").unwrap();
/// assert_eq!(gpu.kind, TargetKind::Cuda);
/// assert!(Target::parse("tpu").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub kind: TargetKind,
    /// The host CPU's features (the CPU and interpreter targets run there; a GPU target's
    /// host code too).
    pub cpu: CpuFeatures,
    /// The CUDA architecture, for CUDA targets: given with `-arch=`, else `None` until the
    /// device is known (the backend then uses the device's own).
    pub arch: Option<CudaArch>,
    pub limits: Limits,
}

impl Target {
    /// The CPU of this machine, through Cranelift.
    pub fn cpu() -> Target {
        Target {
            kind: TargetKind::Cpu,
            cpu: CpuFeatures::host(),
            arch: None,
            limits: Limits {
                vector_bytes: 16,
                max_threads_per_block: 1,
                max_shared_bytes: 0,
                warp_size: 1,
            },
        }
    }

    /// The width, in bytes, that `lower::vectorize` strip-mines `vectorize`d loops by, or
    /// `None` where it leaves them scalar: the interpreter runs the program as written (it is
    /// the oracle the vectorized code is compared with).
    pub fn vectorize_bytes(&self) -> Option<u32> {
        match self.kind {
            TargetKind::Cpu | TargetKind::Cuda => Some(self.limits.vector_bytes),
            TargetKind::Interp => None,
        }
    }

    /// The IR interpreter (on this machine's CPU).
    pub fn interp() -> Target {
        Target {
            kind: TargetKind::Interp,
            ..Target::cpu()
        }
    }

    /// An NVIDIA GPU of architecture `arch` (or the device's own, when `None`).
    pub fn cuda(arch: Option<CudaArch>) -> Target {
        Target {
            kind: TargetKind::Cuda,
            cpu: CpuFeatures::host(),
            arch,
            limits: Limits {
                vector_bytes: 16,
                max_threads_per_block: 1024,
                max_shared_bytes: 48 * 1024,
                warp_size: 32,
            },
        }
    }

    /// Parses a target string: a kind (`cpu`, `interp`, `cuda`) and, for `cuda`, an optional
    /// `-arch=sm_XY` (TVM's spelling).
    pub fn parse(s: &str) -> Result<Target> {
        let mut words = s.split_whitespace();
        let kind = words.next().unwrap_or("");
        let opts: Vec<&str> = words.collect();
        let no_opts = |t: Target| {
            if let Some(o) = opts.first() {
                return Err(Error::Compile(format!(
                    "target '{kind}' takes no options, got '{o}'"
                )));
            }
            Ok(t)
        };
        match kind {
            "cpu" => no_opts(Target::cpu()),
            "interp" => no_opts(Target::interp()),
            "cuda" => {
                let mut arch = None;
                for o in &opts {
                    match o.strip_prefix("-arch=") {
                        Some(a) => arch = Some(CudaArch::parse(a)?),
                        None => {
                            return Err(Error::Compile(format!(
                                "target 'cuda': unknown option '{o}'; expected -arch=sm_XY"
                            )))
                        }
                    }
                }
                Ok(Target::cuda(arch))
            }
            "llvm" | "cranelift" => Err(Error::Compile(format!(
                "unknown target '{kind}': rivet's CPU backend is Cranelift, spelled 'cpu' (there is no LLVM backend)"
            ))),
            other => Err(Error::Compile(format!(
                "unknown target '{other}'; expected 'cpu' (Cranelift), 'interp' (the IR interpreter) or 'cuda' (optionally 'cuda -arch=sm_90')"
            ))),
        }
    }

    /// The kind's name as users spell it ("cpu", "interp", "cuda").
    pub fn kind_name(&self) -> &'static str {
        self.kind.name()
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind_name())?;
        if let Some(a) = self.arch {
            write!(f, " -arch={a}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Target {
    type Err = Error;
    fn from_str(s: &str) -> Result<Target> {
        Target::parse(s)
    }
}

/// What `build` and the kernel library accept as a target: a `Target` or its spelling.
pub trait ToTarget {
    fn to_target(&self) -> Result<Target>;
}

impl ToTarget for Target {
    fn to_target(&self) -> Result<Target> {
        Ok(self.clone())
    }
}

impl ToTarget for str {
    fn to_target(&self) -> Result<Target> {
        Target::parse(self)
    }
}

impl<T: ToTarget + ?Sized> ToTarget for &T {
    fn to_target(&self) -> Result<Target> {
        (**self).to_target()
    }
}

impl ToTarget for String {
    fn to_target(&self) -> Result<Target> {
        Target::parse(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for s in [
            "cpu",
            "interp",
            "cuda",
            "cuda -arch=sm_80",
            "cuda -arch=sm_90",
        ] {
            let t = Target::parse(s).unwrap();
            assert_eq!(t.to_string(), s);
            assert_eq!(Target::parse(&t.to_string()).unwrap(), t);
        }
        assert_eq!(
            Target::parse("cuda -arch=sm_90a").unwrap().arch,
            Some(CudaArch { major: 9, minor: 0 })
        );
        assert_eq!(
            Target::parse("cuda -arch=sm_100").unwrap().arch,
            Some(CudaArch {
                major: 10,
                minor: 0
            })
        );
    }

    #[test]
    fn bad_spellings_say_what_is_accepted() {
        for (s, want) in [
            ("llvm", "there is no LLVM backend"),
            ("cranelift", "spelled 'cpu'"),
            ("", "unknown target ''"),
            ("gpu", "expected 'cpu'"),
            ("cpu -arch=sm_80", "takes no options"),
            ("cuda -arch=sm_70", "sm_80 and newer"),
            ("cuda -arch=90", "expected sm_<major><minor>"),
            ("cuda -arch=sm_9x", "expected sm_<major><minor>"),
            (
                "cuda -arch=sm_99999999999999999999",
                "expected sm_<major><minor>",
            ),
            ("cuda -O3", "unknown option '-O3'"),
        ] {
            let e = Target::parse(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s:?}: {e}");
        }
    }

    #[test]
    fn host_features_are_detected_at_run_time() {
        let f = CpuFeatures::host();
        // x86-64 guarantees SSE2 only; every feature reported must really be usable, which
        // `is_x86_feature_detected` ensures. The list matches the flags.
        assert_eq!(
            f.names().len(),
            [f.sse4_2, f.avx, f.avx2, f.fma, f.avx512f, f.avx512bw, f.avx512vl]
                .iter()
                .filter(|b| **b)
                .count()
        );
    }
}

/// Which code computes a sixteen-lane float32 `erf`/`exp` on this CPU (decided once per
/// process): one AVX-512 computation, two AVX2 halves, or four portable `erff4` calls
/// (`RIVET_ERF16=portable` forces the last, so tests cover both paths on one machine). A
/// question about the CPU, asked by lowering (`erf16_wide`) and answered by the run-time
/// library (`codegen::cpu_lib::erff16`), so it lives here, not in either.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Erf16Path {
    Avx512,
    Avx2,
    Fours,
}

pub fn erf16_path() -> Erf16Path {
    static P: std::sync::OnceLock<Erf16Path> = std::sync::OnceLock::new();
    *P.get_or_init(|| {
        let portable = std::env::var("RIVET_ERF16").is_ok_and(|v| v == "portable");
        let cpu = CpuFeatures::host();
        match () {
            _ if !portable && cpu.avx512f => Erf16Path::Avx512,
            _ if !portable && cpu.avx2 => Erf16Path::Avx2,
            _ => Erf16Path::Fours,
        }
    })
}

/// Whether the CPU's vectorize pass gives float32 `erf` loops sixteen lanes: only where the
/// sixteen run as one AVX-512 computation or two AVX2 ones (with `erff4` four at a time, the
/// 4-lane packed loop is faster: the rest of its body stays packed). Decided where the code is
/// compiled, which is where it runs (modules are compiled when loaded).
pub fn erf16_wide() -> bool {
    erf16_path() != Erf16Path::Fours
}
