//! The compiled artefact: what the pipeline (`build.rs`) produces and what a saved module
//! holds. A `Compiled` is one function (its IR before and after the proof, its kernel, what
//! each call must size); a `Module` a set of them; `Recipe` what a function was built from,
//! for the functions derived from it (`backward.rs`); `file` the saved form.
//!
//! Invariants: a `Compiled` is immutable once built (calls share it through an `Arc`); its
//! `nest` is what a saved module stores, and loading re-runs the whole pipeline from it, so a
//! loaded function is proven and compiled like a built one. This module holds data and its
//! read-only views; making a callable `Function` is `call`'s, compiling is the pipeline's: the
//! artefact depends on neither (their `impl Module` blocks add `get_function` and `load`).

pub mod file;
pub mod recipe;

use crate::codegen::Kernel;
use crate::error::{Error, Result};
use crate::ir::expr::Expr;
use crate::ir::stmt::PrimFunc;
use crate::lower;
use crate::target::{Target, TargetKind};
use recipe::Recipe;
use std::sync::Arc;

/// One compiled function: its IR before flattening (what modules save), the final IR, and
/// the kernel.
pub struct Compiled {
    /// The loop-nest IR (pass 1 output): saved modules store this and re-run the proof.
    pub nest: PrimFunc,
    pub func: PrimFunc,
    pub target: Target,
    /// Built in checked mode (every access bounds-checked by the kernel).
    pub checked: bool,
    /// Each local buffer (temporary): its name, shape and element size, sized per call.
    pub temps: Vec<(String, Vec<Expr>, usize)>,
    /// The iteration count of the function over its dims (`lower::work`): the CPU policy's
    /// measure of a call's work.
    pub work: lower::work::Work,
    pub kernel: Box<dyn Kernel>,
    /// The te program and options it was built from (`build`; None for a loaded module):
    /// `backward` differentiates it.
    pub recipe: Option<Arc<Recipe>>,
}

/// A set of compiled functions (one per `build` call, or as many as a loaded file holds).
/// Saved to a file and loaded back (here or from Python's `rivet.load_module`), it is compiled
/// again for the loading machine's CPU.
///
/// ```
/// use rivet_compiler::{build, te, Module, Schedule};
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder([&n], DType::F64, "X")?;
/// let y = te::compute([&n], |[i]| x.at([i]) + 1.0, "Y")?;
/// let module = build(&Schedule::new(&[&y])?, &[&x, &y], "cpu", "add_one")?;
/// let path = std::env::temp_dir().join(format!("add_one_{}.rivet", std::process::id()));
/// module.save(&path)?;
/// let loaded = Module::load(&path)?;
/// assert_eq!(loaded.function_names(), ["add_one"]);
/// assert!(loaded.get_function("missing").is_err());
/// # std::fs::remove_file(&path).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Module {
    pub funcs: Vec<Arc<Compiled>>,
}

impl Module {
    pub fn function_names(&self) -> Vec<String> {
        self.funcs.iter().map(|c| c.func.name.clone()).collect()
    }

    /// The compiled function `name`, or a `NotFound` error listing the module's functions.
    pub(crate) fn find(&self, name: &str) -> Result<&Arc<Compiled>> {
        self.funcs
            .iter()
            .find(|c| c.func.name == name)
            .ok_or_else(|| {
                Error::Runtime(rivet_runtime::Error::NotFound(format!(
                    "module has no function '{name}'; it has: {}",
                    self.function_names().join(", ")
                )))
            })
    }

    /// Generated code: "ir" (final loop IR), "nest" (IR before the proof), "cranelift" / "asm"
    /// (the backend's text).
    pub fn get_source(&self, kind: &str) -> Result<String> {
        let parts: Vec<String> = self
            .funcs
            .iter()
            .map(|c| match kind {
                "ir" | "" => Ok(c.func.to_string()),
                "nest" => Ok(c.nest.to_string()),
                "cranelift" | "clif" | "asm" | "cuda" | "cu" | "ptx" => {
                    match (kind, c.target.kind) {
                        ("ptx", TargetKind::Cuda) => c.kernel.source_of("ptx").ok_or_else(|| {
                            Error::Compile(
                                "get_source('ptx'): no PTX: NVRTC was not found when this module was built (install nvidia-cuda-nvrtc, or set RIVET_NVRTC_PATH)".into(),
                            )
                        }),
                        ("cuda" | "cu", TargetKind::Cuda)
                        | ("cranelift" | "clif" | "asm", TargetKind::Cpu | TargetKind::Interp) => {
                            Ok(c.kernel.source_from(&c.func))
                        }
                        _ => Err(Error::Compile(format!(
                            "get_source: a module built for target '{}' has no '{kind}' source",
                            c.target
                        ))),
                    }
                }
                other => Err(Error::Compile(format!(
                    "get_source: unknown kind '{other}'; expected 'ir', 'nest', 'cranelift' (cpu), 'cuda' or 'ptx' (cuda)"
                ))),
            })
            .collect::<Result<_>>()?;
        Ok(parts.join("\n"))
    }
}
