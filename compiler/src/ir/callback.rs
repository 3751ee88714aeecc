//! Host callbacks: the table of packed functions a `PrimFunc` calls (`Intrin::Callback(k)` is
//! a call of `PrimFunc::callbacks[k]`).
//!
//! Two kinds, both whole-buffer calls at the top level of the host program (never inside a
//! loop, so each runs exactly once per call, on the calling thread, in program order;
//! `ir::verify` refuses any other place, and `ir::verify::callbacks` any table entry called
//! other than exactly once on every path, or on a region other than its whole buffer):
//! - `Extern` (TVM's `te.extern`): regions `[out (written), in_0, ..., in_k (read)]`; the
//!   function is called as `f(in_0, ..., in_k, out)` and either fills `out` and returns None,
//!   or returns a tensor of the declared shape and dtype, which is copied into `out`;
//! - `Tap` (a debug tap, like `jax.debug.callback`): one read region, `f(view)`; its return
//!   value is ignored and nothing is written.
//!
//! What a callback receives owns its memory (`codegen::cpu_lib::callback`): the inputs are compact
//! read-only copies and `out` is a fresh rivet tensor copied into the stage's buffer after the
//! call, so a view the callback keeps after returning stays valid (it never aliases a
//! temporary or an argument).
//!
//! Saved modules keep the table without the functions: a callback given by registered name is
//! resolved by that name when the module is loaded; one given as a bare function cannot be
//! saved (`Callback::registered` is `None`; `Module::to_bytes` says so).

use rivet_runtime::Function;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a callback does to its regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallbackKind {
    /// Computes a stage: regions `[out, in_0, ..., in_k]`.
    Extern,
    /// Observes a stage: one read region.
    Tap,
}

/// One entry of `PrimFunc::callbacks`.
#[derive(Clone, Serialize, Deserialize)]
pub struct Callback {
    pub kind: CallbackKind,
    /// The stage it computes (`Extern`) or observes (`Tap`), for messages.
    pub stage: String,
    /// The registry name it was given by, if any: how a loaded module finds it again.
    pub registered: Option<String>,
    /// The function; `None` only in a module read from a file before resolution
    /// (`Callback::resolve`).
    #[serde(skip)]
    pub func: Option<Function>,
}

impl Callback {
    /// The function, or an error naming the stage (an unresolved entry of a loaded module).
    pub fn function(&self) -> Result<&Function, String> {
        self.func.as_ref().ok_or_else(|| {
            format!(
                "callback of stage '{}' has no function (a loaded module must resolve it by name)",
                self.stage
            )
        })
    }

    /// Looks the function up by its registered name (module loading); a missing name is an
    /// error naming the stage and the name.
    pub fn resolve(&mut self) -> Result<(), String> {
        if self.func.is_some() {
            return Ok(());
        }
        let Some(name) = &self.registered else {
            return Err(format!(
                "callback of stage '{}' has no registered name to resolve",
                self.stage
            ));
        };
        match rivet_runtime::registry::try_get(name) {
            Some(f) => {
                self.func = Some(f);
                Ok(())
            }
            None => Err(format!(
                "callback '{name}' of stage '{}' is not registered in this process (register it with rivet.register_func / rivet_runtime::registry::register before loading the module)",
                self.stage
            )),
        }
    }
}

/// Equal when they describe the same callback: same kind, stage and name, and the same
/// function object (or both unresolved).
impl PartialEq for Callback {
    fn eq(&self, other: &Callback) -> bool {
        self.kind == other.kind
            && self.stage == other.stage
            && self.registered == other.registered
            && match (&self.func, &other.func) {
                (Some(a), Some(b)) => a.same(b),
                (None, None) => true,
                _ => false,
            }
    }
}

impl fmt::Debug for Callback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}({}", self.kind, self.stage)?;
        if let Some(n) = &self.registered {
            write!(f, ", \"{n}\"")?;
        }
        write!(f, ")")
    }
}

/// Where callback calls may stand: never inside a loop (parallel or not) or an outlined
/// kernel, so each runs at most once per call, on the calling thread (`build_nest` puts them
/// directly in the top-level sequence, where they run exactly once). `Err` names the stage and the place.
pub fn check_placement(func: &super::PrimFunc) -> Result<(), String> {
    use super::{Intrin, Stmt};
    fn go(func: &super::PrimFunc, s: &Stmt, inside: Option<&str>) -> Result<(), String> {
        match s {
            Stmt::Call {
                intrin: Intrin::Callback(k),
                ..
            } => match inside {
                None => Ok(()),
                Some(place) => {
                    let stage = func
                        .callbacks
                        .get(*k as usize)
                        .map(|c| c.stage.as_str())
                        .unwrap_or("?");
                    Err(format!(
                        "the host callback of stage '{stage}' stands inside {place}: callbacks run once per call at the top level of the program, never inside a loop (a parallel loop would call Python from pool threads); keep the stage at root"
                    ))
                }
            },
            Stmt::Seq(v) => v.iter().try_for_each(|x| go(func, x, inside)),
            Stmt::Allocate { body, .. } => go(func, body, inside),
            Stmt::For {
                var, kind, body, ..
            } => {
                let place = format!("the {kind:?} loop '{}'", var.name);
                go(func, body, Some(inside.unwrap_or(&place)))
            }
            // Run at most once each: passes may split the program on a layout test
            // (`unswitch`) or bind a value around it.
            Stmt::If {
                then, otherwise, ..
            } => {
                go(func, then, inside)?;
                match otherwise {
                    Some(o) => go(func, o, inside),
                    None => Ok(()),
                }
            }
            Stmt::Let { body, .. } => go(func, body, inside),
            _ => Ok(()),
        }
    }
    go(func, &func.body, None)?;
    for k in &func.kernels {
        go(
            func,
            &k.body,
            Some(&format!("the outlined body '{}'", k.name)),
        )?;
    }
    Ok(())
}
