//! The shared Cranelift settings of the CPU backend: optimised for speed, Cranelift's own
//! verifier in tests and debug builds only, absolute relocations for the JIT, and the
//! speed-only settings `RIVET_CLIF_SET` may change (`benches/cranelift_settings.py`
//! measures them: the defaults build slower and run faster).

use crate::error::{Error, Result};
use cranelift_codegen::settings::{self, Configurable};

/// The backend's shared flags, with `RIVET_CLIF_SET` applied.
pub(super) fn shared_flags() -> Result<settings::Flags> {
    let mut flags = settings::builder();
    let set = |fb: &mut settings::Builder, k: &str, v: &str| {
        fb.set(k, v)
            .map_err(|e| Error::Internal(format!("cranelift flag {k}={v}: {e}")))
    };
    set(&mut flags, "opt_level", "speed")?;
    // Cranelift's own IR verifier checks the CLIF we emit before every compile: it is
    // what catches a code-generator bug as an error instead of bad machine code, and it
    // costs about 15% of a GEMM build. The tests run it (`make test` sets
    // RIVET_VERIFY_CLIF=1, debug builds always do); a release build in use skips it: the
    // CLIF it would check comes from IR our own verifier passed.
    let verify = cfg!(debug_assertions)
        || std::env::var("RIVET_VERIFY_CLIF").is_ok_and(|v| v != "0" && !v.is_empty());
    set(
        &mut flags,
        "enable_verifier",
        if verify { "true" } else { "false" },
    )?;
    // The JIT places code and helpers anywhere in the address space: no colocated calls,
    // absolute relocations.
    set(&mut flags, "use_colocated_libcalls", "false")?;
    set(&mut flags, "is_pic", "false")?;
    // `RIVET_CLIF_SET="k=v,..."`: Cranelift settings that change how fast code is
    // compiled and how fast it runs, never what it computes, for measuring them
    // (`benches/cranelift_settings.py`). Read per backend, so per build: a module from
    // the build cache keeps the settings it was built with.
    apply_clif_set(
        &mut flags,
        &std::env::var("RIVET_CLIF_SET").unwrap_or_default(),
    )?;
    Ok(settings::Flags::new(flags))
}

/// The Cranelift settings `RIVET_CLIF_SET` may change: speed only (results are the same bits;
/// `benches/cranelift_settings.py` checks it), unlike, say, NaN canonicalization.
const TUNABLE_FLAGS: [&str; 4] = [
    "opt_level",
    "regalloc_algorithm",
    "enable_alias_analysis",
    "unwind_info",
];
/// Applies `spec` (`RIVET_CLIF_SET`: `name=value` pairs, comma-separated, names from
/// `TUNABLE_FLAGS`) to `flags`; anything else is a `CompileError` naming it.
pub(super) fn apply_clif_set(flags: &mut settings::Builder, spec: &str) -> Result<()> {
    for kv in spec.split(',').filter(|s| !s.is_empty()) {
        match kv.split_once('=') {
            Some((k, v)) if TUNABLE_FLAGS.contains(&k) => flags
                .set(k, v)
                .map_err(|e| Error::Compile(format!("RIVET_CLIF_SET: {kv}: {e}")))?,
            _ => {
                return Err(Error::Compile(format!(
                    "RIVET_CLIF_SET: '{kv}' is not name=value with a name of {}",
                    TUNABLE_FLAGS.join(", ")
                )))
            }
        }
    }
    Ok(())
}
