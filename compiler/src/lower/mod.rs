//! Lowering: schedule -> verified, flattened `PrimFunc`. One pass per file; `lower` below is
//! the whole pipeline, top to bottom, with the verifier between passes and `RIVET_DUMP=dir`
//! writing the IR after each pass.

pub mod bounds;
pub mod flatten;
pub mod interval;
pub mod nest;
pub mod simplify;

use crate::error::Result;
use crate::ir::stmt::PrimFunc;
use crate::ir::verify::verify;
use crate::schedule::Schedule;
use crate::te::Tensor;

/// Writes `text` to `$RIVET_DUMP/<func>.<step>.<what>` when RIVET_DUMP is set.
pub fn dump(func: &str, step: usize, what: &str, text: &str) {
    if let Ok(dir) = std::env::var("RIVET_DUMP") {
        let dir = std::path::Path::new(&dir);
        let _ = std::fs::create_dir_all(dir);
        let _ = std::fs::write(dir.join(format!("{func}.{step:02}.{what}")), text);
    }
}

fn after(f: &PrimFunc, step: usize, pass: &str, flattened: bool) -> Result<()> {
    dump(&f.name, step, &format!("{pass}.ir"), &f.to_string());
    verify(f, flattened)
}

/// The lowering pipeline.
pub fn lower(sched: &Schedule, args: &[Tensor], name: &str) -> Result<PrimFunc> {
    finish(nest::build_nest(sched, args, name)?)
}

/// The passes after the loop nest is built (also re-run on functions loaded from a file, so
/// a saved module is verified and proven in bounds again).
pub fn finish(f: PrimFunc) -> Result<PrimFunc> {
    finish_with(f, false)
}

/// `finish`; in checked mode the function is left unflattened (one index per dim), so the
/// backends can check every index against its extent.
pub fn finish_with(mut f: PrimFunc, checked: bool) -> Result<PrimFunc> {
    after(&f, 1, "nest", false)?;
    f.checks.clear(); // recomputed by the proof, never trusted
    bounds::prove(&mut f)?;
    after(&f, 2, "bounds", false)?;
    f.body = simplify::simplify_stmt(&f.body);
    after(&f, 3, "simplify", false)?;
    if checked {
        return Ok(f);
    }
    flatten::flatten(&mut f);
    f.body = simplify::simplify_stmt(&f.body);
    after(&f, 4, "flatten", true)?;
    Ok(f)
}
