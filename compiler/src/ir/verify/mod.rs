//! The loop-IR verifier: checks the invariants every pass must preserve and every backend
//! relies on. Passes produce the IR, so a violation is a bug in rivet and is reported as
//! `Error::Internal`, with a message naming the function, the rule, the offending expression
//! (infix, as the printer writes it) and the statement it sits in (its first printed line).
//!
//! Rules (`verify(func, flattened)`):
//! - buffers: `params` are the first entries of `buffers`, in order; buffer ids are unique;
//!   parameters have kind `Param`, the others `Local`; `strides.len() == shape.len()`;
//!   parameter shapes are int64 expressions of constants and `dims`.
//! - scoping: every `Var` in an expression is bound — a dim, a parameter's stride variable
//!   (both in scope everywhere), a local buffer's stride variable (inside its `Allocate`), or a
//!   `For`/`Let` variable (inside its body). No variable is bound twice in nested scopes (no
//!   shadowing); re-binding one in disjoint sibling scopes is fine.
//! - nodes: `Read`/`Reduce` (te only) and `Invalid` never appear; every `Load`/`Store` names an existing
//!   buffer, a local one only inside its `Allocate`; a local is not allocated twice in nested
//!   scopes and only locals are allocated.
//! - types and lanes of every expression (`verify_expr_types` for one expression): the rules
//!   of `types`.
//! - shape of accesses: with `flattened`, every `Load`/`Store` has exactly one index (an
//!   element offset); otherwise one index per buffer dimension.
//! - `Unrolled` loops have a constant integer extent (a vectorized loop may have any extent:
//!   `lower::vectorize` strip-mines it with a scalar tail); a constant extent is `>= 0`, and a
//!   constant `min + extent` fits in int64 (the loop counter cannot wrap).
//! - stores: only to output parameters (`Param { output: true }`) and locals, never to an
//!   input parameter (inputs may be read-only memory: `bytes`, a read-only array, a JAX
//!   array).
//! - loaded functions (`verify_loaded`): `Vectorized` loops are innermost (no loop inside),
//!   and `Parallel` and `Vectorized` loops carry no dependence between iterations
//!   (`verify::parallel`); loops of constant extent <= 1 are exempt.
//! - resources (`ir::limits`): every expression is at most `MAX_IR_DEPTH` deep, statements
//!   nest at most `MAX_STMT_DEPTH` deep, and the function has at most `MAX_FUNC_NODES`
//!   expression and statement nodes counted as a tree. These are checked before any walk
//!   that depends on them, and counting stops at the limit, so verifying costs at most
//!   O(MAX_FUNC_NODES) whatever the input (a DAG sharing subtrees is never walked
//!   exponentially).
//! - `func.checks` conditions are bool and use only dims and parameter stride variables.
//! - a cross-thread reduction (`AllReduce`) combines a non-bool value into a live
//!   one-element buffer of kind `Local`, scope `Local` and the value's dtype (shape all 1s).
//! - host callbacks (`verify::callbacks`): each entry of `func.callbacks` is called exactly
//!   once on every path through the body (never twice, never unused; both branches of an `if`
//!   call the same entries; none in a loop or outlined body, `callback::check_placement`), and
//!   every region of a callback call is its whole buffer (base 0, every dim in order, each
//!   extent the buffer's).
//! - GPU constructs (thread-bound loops, barriers, cross-thread reductions, storage scopes):
//!   the rules of `gpu`, run after these.
//!
//! Functions loaded from a file go through the same rules; the loader reports a violation as
//! the file's fault (`CompileError`), not as an internal error.
//!
//! Where each rule is checked: `types` (dtypes and lanes of expressions), `scope` (the header:
//! buffers, dims, checks; variables in scope, accesses), `stmt` (the statement walk: loops,
//! allocations, stores, calls, resources), and the rules that have their own module: `gpu`,
//! `parallel` (race freedom of loaded loops), `callbacks`, `intrin` (an intrinsic call's
//! signature, which other passes ask too).

pub mod callbacks;
pub mod gpu;
pub mod intrin;
pub mod parallel;
mod scope;
mod stmt;
#[cfg(test)]
mod tests;
mod types;

pub use types::{verify_expr_types, MAX_LANES};

use crate::error::{Error, Result};
use crate::ir::expr::BufId;
use crate::ir::limits::MAX_FUNC_NODES;
use crate::ir::printer::stmt_to_string;
use crate::ir::stmt::{Buffer, PrimFunc, Stmt};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};

/// Checks the invariants listed in the module documentation; `flattened` says whether the
/// function has been through `flatten` (one index per access) or not (one per dimension).
pub fn verify(func: &PrimFunc, flattened: bool) -> Result<()> {
    let mut v = Verifier::new(func, flattened);
    v.header()?;
    // Before the statements: a callback in a parallel loop is refused for what it is, not
    // for the race its whole-buffer write would be.
    super::callback::check_placement(func).map_err(Error::Compile)?;
    v.stmt(&func.body)?;
    v.callbacks()?;
    gpu::check(func)
}

/// `verify` of a multi-dimensional function read from a file, plus the rules the builder
/// establishes by construction and a file could break: vectorized loops innermost, and
/// parallel / vectorized loops free of races (`verify::parallel`). The builder places these
/// annotations only where `schedule` allows them (never on a reduction axis) and may produce
/// forms the sufficient race rule cannot prove (split guards, reversed fusions), so its own
/// output is not held to this rule; a loaded function the rule cannot prove is refused.
pub fn verify_loaded(func: &PrimFunc) -> Result<()> {
    let mut v = Verifier::new(func, false);
    v.loaded = true;
    v.header()?;
    // Before the statements: a callback in a parallel loop is refused for what it is, not
    // for the race its whole-buffer write would be.
    super::callback::check_placement(func).map_err(Error::Compile)?;
    v.stmt(&func.body)?;
    v.callbacks()?;
    gpu::check(func)
}

struct Verifier<'a> {
    func: &'a PrimFunc,
    flattened: bool,
    /// Buffers by id.
    bufs: HashMap<BufId, &'a Buffer>,
    /// Ids of the variables in scope at the current point of the walk.
    bound: HashSet<u32>,
    /// Local buffers whose `Allocate` encloses the current point.
    live: HashSet<BufId>,
    /// The statement whose expressions are being checked (for messages).
    cur: Option<&'a Stmt>,
    /// Nodes still allowed (`MAX_FUNC_NODES`, counted as a tree); counting stops at 0.
    nodes_left: Cell<usize>,
    /// Expression nodes the race rule may still walk (each parallel loop walks its body).
    race_budget: usize,
    /// Statement nesting at the current point.
    stmt_depth: u32,
    /// Read from a file: the loop-kind rules of `verify_loaded` apply.
    loaded: bool,
}

impl<'a> Verifier<'a> {
    fn new(func: &'a PrimFunc, flattened: bool) -> Verifier<'a> {
        Verifier {
            func,
            flattened,
            bufs: HashMap::new(),
            bound: HashSet::new(),
            live: HashSet::new(),
            cur: None,
            nodes_left: Cell::new(MAX_FUNC_NODES),
            race_budget: 4 * MAX_FUNC_NODES,
            stmt_depth: 0,
            loaded: false,
        }
    }

    /// The host-callback rules (`verify::callbacks`), after the statement walk has checked
    /// each call and bounded the program's size and depth.
    fn callbacks(&self) -> Result<()> {
        callbacks::check(self.func).map_err(|m| {
            Error::Internal(format!("IR verifier, function `{}`: {m}", self.func.name))
        })
    }

    /// An `Internal` error naming the function, the rule, and the current statement.
    fn fail(&self, rule: &str, detail: impl std::fmt::Display) -> Error {
        let mut msg = format!(
            "IR verifier, function `{}`: {rule}: {detail}",
            self.func.name
        );
        if let Some(s) = self.cur {
            let text = stmt_to_string(Some(self.func), s);
            let first = text.lines().next().unwrap_or("").trim();
            msg.push_str(&format!("\n  in statement: {first}"));
        }
        Error::Internal(msg)
    }

    /// A resource-limit error: like `fail`, without printing the statement (which may be the
    /// oversized thing itself).
    /// A program over one of rivet's size limits: the program's size is the user's to change,
    /// so this is a `CompileError` even after rivet's own passes (never "a bug in rivet").
    fn fail_limit(&self, rule: &str, detail: impl std::fmt::Display) -> Error {
        Error::Compile(format!(
            "function `{}`: {rule}: {detail}; split the computation into smaller stages or compute shared terms into buffers",
            self.func.name
        ))
    }
    fn too_many_nodes(&self) -> Error {
        self.fail_limit(
            "function too large (limit MAX_FUNC_NODES)",
            format!("more than {MAX_FUNC_NODES} expression and statement nodes"),
        )
    }
}
