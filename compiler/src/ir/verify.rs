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
//! - types (`verify_expr_types` for one expression): indices, `For` min/extent, `Let` values
//!   and buffer shapes are int64; `If`/`Select` conditions are bool; a `Store`'s value and a
//!   `Load` node have the buffer's dtype; binary and comparison operands have equal dtypes;
//!   plus the constructor rules of `ir::expr` (float-only ops, bool-only `Not`, ...).
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
//!   (`verify_parallel`); loops of constant extent <= 1 are exempt.
//! - lanes (vector IR, `lower::vectorize`): every operand of an elementwise vector node has
//!   its lanes (scalars are broadcast explicitly); a `Ramp`'s base and stride are scalar int64,
//!   a `Broadcast`'s value a scalar of its dtype, both with 2..=`MAX_LANES` lanes; a vector
//!   access has one (flattened) index; a store's index and value have equal lanes; loop
//!   bounds, `Let` values and conditions are scalars. Loaded nests hold no vector IR.
//! - resources (`ir::limits`): every expression is at most `MAX_IR_DEPTH` deep, statements
//!   nest at most `MAX_STMT_DEPTH` deep, and the function has at most `MAX_FUNC_NODES`
//!   expression and statement nodes counted as a tree. These are checked before any walk
//!   that depends on them, and counting stops at the limit, so verifying costs at most
//!   O(MAX_FUNC_NODES) whatever the input (a DAG sharing subtrees is never walked
//!   exponentially).
//! - `func.checks` conditions are bool and use only dims and parameter stride variables.
//! - a cross-thread reduction (`AllReduce`) combines a non-bool value into a live
//!   one-element buffer of kind `Local`, scope `Local` and the value's dtype (shape all 1s).
//! - host callbacks (`verify_callbacks`): each entry of `func.callbacks` is called exactly
//!   once on every path through the body (never twice, never unused; both branches of an `if`
//!   call the same entries; none in a loop or outlined body, `callback::check_placement`), and
//!   every region of a callback call is its whole buffer (base 0, every dim in order, each
//!   extent the buffer's).
//! - GPU constructs (thread-bound loops, barriers, cross-thread reductions, storage scopes):
//!   the rules of `verify_gpu`, run after these.
//!
//! Functions loaded from a file go through the same rules; the loader reports a violation as
//! the file's fault (`CompileError`), not as an internal error.

use super::expr::{BinOp, BufId, Const, Expr, ExprKind, UnOp};
use super::intrin::{Intrin, Region};
use super::limits::{MAX_FUNC_NODES, MAX_IR_DEPTH, MAX_STMT_DEPTH};
use super::printer::stmt_to_string;
use super::stmt::{BufKind, Buffer, ForKind, PrimFunc, Scope, Stmt};
use super::verify_intrin::check_call;
use crate::error::{Error, Result};
use rivet_runtime::DType;
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
    super::verify_gpu::check(func)
}

/// `verify` of a multi-dimensional function read from a file, plus the rules the builder
/// establishes by construction and a file could break: vectorized loops innermost, and
/// parallel / vectorized loops free of races (`verify_parallel`). The builder places these
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
    super::verify_gpu::check(func)
}

/// Checks the dtype rules of one expression tree (no scoping, no buffers): see the module
/// documentation. Errors are `Error::Internal` naming the offending node and the rule.
pub fn verify_expr_types(e: &Expr) -> Result<()> {
    check_types(e)
        .map_err(|(node, rule)| Error::Internal(format!("{rule}: in `{node}` (of `{e}`)")))
}

/// The dtype rules of one node and, recursively, its children. On failure: the offending node
/// and the rule it breaks.
fn check_types(e: &Expr) -> std::result::Result<(), (Expr, String)> {
    let dt = e.dtype();
    let bad = |rule: String| Err((e.clone(), rule));
    if let Some(rule) = lane_rule(e) {
        return bad(rule);
    }
    match e.kind() {
        ExprKind::Ramp { base, stride, .. } => {
            check_types(base)?;
            check_types(stride)?;
            if base.dtype() != DType::I64 || stride.dtype() != DType::I64 || dt != DType::I64 {
                return bad(format!(
                    "ramp base and stride must be int64, are {} and {}",
                    base.dtype(),
                    stride.dtype()
                ));
            }
        }
        ExprKind::Broadcast { value, .. } => {
            check_types(value)?;
            if value.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: broadcast of {} typed {dt}",
                    value.dtype()
                ));
            }
        }
        ExprKind::Const(Const::Int(v)) => {
            if dt.is_float() {
                return bad(format!(
                    "constant kind mismatch: integer constant with float dtype {dt}"
                ));
            }
            if dt == DType::Bool && *v != 0 && *v != 1 {
                return bad(format!(
                    "constant kind mismatch: bool constant {v} is not 0 or 1"
                ));
            }
        }
        ExprKind::Const(Const::Float(_)) => {
            if !dt.is_float() {
                return bad(format!(
                    "constant kind mismatch: float constant with non-float dtype {dt}"
                ));
            }
        }
        ExprKind::Var(_) => {
            if dt != DType::I64 {
                return bad(format!("variables are int64, this one is typed {dt}"));
            }
        }
        ExprKind::Unary(op, a) => {
            check_types(a)?;
            if a.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: {op:?} of {} typed {dt}",
                    a.dtype()
                ));
            }
            let ok = match op {
                UnOp::Not => dt == DType::Bool,
                UnOp::Neg | UnOp::Abs => dt != DType::Bool,
                _ => dt.is_float(),
            };
            if !ok {
                return bad(format!("unary {op:?} is not defined on {dt}"));
            }
        }
        ExprKind::Binary(op, a, b) => {
            check_types(a)?;
            check_types(b)?;
            if a.dtype() != b.dtype() || a.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: {op:?} of {} and {} typed {dt}",
                    a.dtype(),
                    b.dtype()
                ));
            }
            if dt == DType::Bool {
                return bad(format!("binary {op:?} is not defined on bool"));
            }
            if matches!(op, BinOp::Div | BinOp::Pow) && !dt.is_float() {
                return bad(format!("binary {op:?} needs floats, got {dt}"));
            }
        }
        ExprKind::Cmp(op, a, b) => {
            check_types(a)?;
            check_types(b)?;
            if a.dtype() != b.dtype() {
                return bad(format!(
                    "operand dtypes differ: comparison {op:?} of {} and {}",
                    a.dtype(),
                    b.dtype()
                ));
            }
            if dt != DType::Bool {
                return bad(format!("comparison {op:?} must be typed bool, is {dt}"));
            }
        }
        ExprKind::Logic(op, a, b) => {
            check_types(a)?;
            check_types(b)?;
            if a.dtype() != DType::Bool || b.dtype() != DType::Bool || dt != DType::Bool {
                return bad(format!(
                    "condition must be bool: logical {op:?} of {} and {} typed {dt}",
                    a.dtype(),
                    b.dtype()
                ));
            }
        }
        ExprKind::Cast(a) => check_types(a)?,
        ExprKind::Fma(a, b, c) => {
            check_types(a)?;
            check_types(b)?;
            check_types(c)?;
            if a.dtype() != dt || b.dtype() != dt || c.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: fma of {}, {} and {} typed {dt}",
                    a.dtype(),
                    b.dtype(),
                    c.dtype()
                ));
            }
            if !dt.is_float() {
                return bad(format!("fma needs floats, got {dt}"));
            }
        }
        ExprKind::Select(c, a, b) => {
            check_types(c)?;
            check_types(a)?;
            check_types(b)?;
            if c.dtype() != DType::Bool {
                return bad(format!(
                    "condition must be bool: select condition is {}",
                    c.dtype()
                ));
            }
            if a.dtype() != b.dtype() || a.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: select arms {} and {} typed {dt}",
                    a.dtype(),
                    b.dtype()
                ));
            }
        }
        ExprKind::Read { indices, .. } | ExprKind::Load { indices, .. } => {
            for i in indices {
                check_types(i)?;
                if i.dtype() != DType::I64 {
                    return Err((i.clone(), format!("index must be int64, is {}", i.dtype())));
                }
            }
        }
        ExprKind::Invalid(msg) => {
            return bad(format!(
                "invalid expression (a DSL misuse that reached the IR): {msg}"
            ))
        }
        ExprKind::Reduce { body, axes, .. } => {
            check_types(body)?;
            if body.dtype() != dt {
                return bad(format!(
                    "operand dtypes differ: reduction of {} typed {dt}",
                    body.dtype()
                ));
            }
            for a in axes {
                for x in [&a.min, &a.extent] {
                    check_types(x)?;
                    if x.dtype() != DType::I64 {
                        return Err((
                            x.clone(),
                            format!("axis bounds must be int64, is {}", x.dtype()),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Most lanes a vector expression may have (a 16-byte vector of bytes; CUDA's widest
/// access is 16 bytes too).
pub const MAX_LANES: u32 = 16;

/// The lane rule of one node (children are checked by the caller's recursion): a `Ramp`'s
/// base and stride and a `Broadcast`'s value are scalars and it has 2..=`MAX_LANES` lanes;
/// lanes are never mixed: every operand of an elementwise vector node has exactly its lanes
/// (the vectorize pass broadcasts scalars explicitly); a vector `Load` has one index.
// Kept out of line: `check_types` recurses once per level of the expression, so its frame
// must stay small (the depth limit is checked with the stack the test threads have).
#[inline(never)]
fn lane_rule(e: &Expr) -> Option<String> {
    let n = e.lanes();
    let same = |kids: &[&Expr]| -> Option<String> {
        kids.iter().find(|k| k.lanes() != n).map(|k| {
            format!(
                "lane mismatch: a {n}-lane node has an operand of {} lanes (`{k}`)",
                k.lanes()
            )
        })
    };
    match e.kind() {
        ExprKind::Ramp {
            base,
            stride,
            lanes,
        } => {
            if !(2..=MAX_LANES).contains(lanes) {
                return Some(format!(
                    "a ramp has 2..={MAX_LANES} lanes, this one {lanes}"
                ));
            }
            if base.lanes() != 1 || stride.lanes() != 1 {
                return Some("lane mismatch: a ramp's base and stride are scalars".into());
            }
            None
        }
        ExprKind::Broadcast { value, lanes } => {
            if !(2..=MAX_LANES).contains(lanes) {
                return Some(format!(
                    "a broadcast has 2..={MAX_LANES} lanes, this one {lanes}"
                ));
            }
            if value.lanes() != 1 {
                return Some("lane mismatch: a broadcast's value is a scalar".into());
            }
            None
        }
        ExprKind::Unary(_, a) | ExprKind::Cast(a) => same(&[a]),
        ExprKind::Binary(_, a, b) | ExprKind::Cmp(_, a, b) | ExprKind::Logic(_, a, b) => {
            same(&[a, b])
        }
        ExprKind::Select(c, a, b) | ExprKind::Fma(a, b, c) => same(&[c, a, b]),
        ExprKind::Load { indices, .. } => {
            if n > 1 && indices.len() != 1 {
                return Some(format!(
                    "a vector load has one (flattened) index, this one {}",
                    indices.len()
                ));
            }
            None
        }
        ExprKind::Read { indices, .. } => same(&indices.iter().collect::<Vec<_>>()),
        ExprKind::Reduce { .. } | ExprKind::Const(_) | ExprKind::Var(_) | ExprKind::Invalid(_) => {
            None
        }
    }
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

    /// The host-callback rules (`verify_callbacks`), after the statement walk has checked
    /// each call and bounded the program's size and depth.
    fn callbacks(&self) -> Result<()> {
        super::verify_callbacks::check(self.func).map_err(|m| {
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

    /// Buffers, dims, parameter strides and checks; leaves dims and parameter strides bound.
    fn header(&mut self) -> Result<()> {
        let f = self.func;
        if f.buffers.len() < f.params.len() {
            return Err(self.fail(
                "params must be the first buffers, in order",
                format!(
                    "{} params but only {} buffers",
                    f.params.len(),
                    f.buffers.len()
                ),
            ));
        }
        for (i, p) in f.params.iter().enumerate() {
            if f.buffers[i].id != *p {
                return Err(self.fail(
                    "params must be the first buffers, in order",
                    format!(
                        "param {i} is buffer id {}, but buffers[{i}] is `{}` (id {})",
                        p.0, f.buffers[i].name, f.buffers[i].id.0
                    ),
                ));
            }
        }
        for (i, b) in f.buffers.iter().enumerate() {
            if self.bufs.insert(b.id, b).is_some() {
                return Err(self.fail(
                    "duplicate buffer id",
                    format!(
                        "id {} is used by more than one buffer (`{}`)",
                        b.id.0, b.name
                    ),
                ));
            }
            let is_param = i < f.params.len();
            match (is_param, b.kind) {
                (true, BufKind::Param { .. }) | (false, BufKind::Local) => {}
                (true, k) => {
                    return Err(self.fail(
                        "param buffer must have kind Param",
                        format!("`{}` has kind {k:?}", b.name),
                    ))
                }
                (false, k) => {
                    return Err(self.fail(
                        "non-param buffer must have kind Local",
                        format!("`{}` has kind {k:?}", b.name),
                    ))
                }
            }
            if b.strides.len() != b.shape.len() {
                return Err(self.fail(
                    "strides.len() must equal shape.len()",
                    format!(
                        "`{}` has {} dims and {} strides",
                        b.name,
                        b.shape.len(),
                        b.strides.len()
                    ),
                ));
            }
        }
        // Dims, then parameter strides: in scope everywhere, each bound once.
        for d in &f.dims {
            if !self.bound.insert(d.id) {
                return Err(self.fail(
                    "variable bound twice",
                    format!("dim `{}` (id {}) is listed twice", d.name, d.id),
                ));
            }
        }
        // Parameter shapes: constants and dims only.
        for p in &f.params {
            let b = self.bufs[p];
            for s in &b.shape {
                self.expr(s, &format!("shape of param `{}`", b.name))?;
                if s.dtype() != DType::I64 {
                    return Err(self.fail(
                        "shape must be int64",
                        format!("shape `{s}` of `{}` is {}", b.name, s.dtype()),
                    ));
                }
            }
        }
        for p in &f.params {
            let b = self.bufs[p];
            for s in &b.strides {
                if !self.bound.insert(s.id) {
                    return Err(self.fail(
                        "variable bound twice",
                        format!(
                            "stride `{}` (id {}) of param `{}` is already bound",
                            s.name, s.id, b.name
                        ),
                    ));
                }
            }
        }
        // Checks: bool, over dims and parameter strides only, no memory access.
        for c in &f.checks {
            self.expr(
                &c.cond,
                "check (checks use only dims and param stride variables)",
            )?;
            if c.cond.dtype() != DType::Bool {
                return Err(self.fail(
                    "condition must be bool",
                    format!("check `{}` is {}", c.cond, c.cond.dtype()),
                ));
            }
            let mut access = None;
            c.cond.visit(&mut |e| {
                if matches!(e.kind(), ExprKind::Load { .. }) && access.is_none() {
                    access = Some(e.clone());
                }
            });
            if let Some(e) = access {
                return Err(self.fail(
                    "checks use only dims and param stride variables",
                    format!("check `{}` reads memory: `{e}`", c.cond),
                ));
            }
        }
        Ok(())
    }

    /// Binds `v` for a nested scope; an error if it is already bound (shadowing).
    fn bind(&mut self, v: &super::expr::Var, what: &str) -> Result<()> {
        if !self.bound.insert(v.id) {
            return Err(self.fail(
                "variable bound twice (shadowing)",
                format!(
                    "{what} `{}` (id {}) is already bound in an enclosing scope",
                    v.name, v.id
                ),
            ));
        }
        Ok(())
    }

    /// Checks an expression in the current scope: types, bound vars, te-only nodes, buffers.
    fn expr(&self, e: &Expr, what: &str) -> Result<()> {
        // Limits first: the walks below recurse on depth and visit the tree.
        if e.depth() > MAX_IR_DEPTH {
            return Err(self.fail_limit(
                "expression too deep (limit MAX_IR_DEPTH)",
                format!(
                    "{what} is nested {} deep; at most {MAX_IR_DEPTH} is allowed",
                    e.depth()
                ),
            ));
        }
        self.count_nodes(e)?;
        if let Err((node, rule)) = check_types(e) {
            return Err(self.fail(&rule, format!("in `{node}` ({what} `{e}`)")));
        }
        let mut err: Option<Error> = None;
        e.visit(&mut |n| {
            if err.is_some() {
                return;
            }
            match n.kind() {
                ExprKind::Var(v) if !self.bound.contains(&v.id) => {
                    err = Some(self.fail(
                        "unbound variable",
                        format!("`{}` (id {}) in {what} `{e}`", v.name, v.id),
                    ));
                }
                ExprKind::Read { .. } | ExprKind::Reduce { .. } => {
                    err = Some(self.fail(
                        "te-only node (Read/Reduce) in loop IR",
                        format!("`{n}` in {what} `{e}`"),
                    ));
                }
                ExprKind::Ramp { .. } | ExprKind::Broadcast { .. } if self.loaded => {
                    err = Some(self.fail(
                        "vector IR in a loaded loop nest (the vectorize pass makes it after loading; saved nests hold none)",
                        format!("`{n}` in {what} `{e}`"),
                    ));
                }
                ExprKind::Load { buf, indices } => {
                    if let Err(x) = self.access(*buf, indices.len(), n.dtype(), "load") {
                        err = Some(x);
                    }
                }
                _ => {}
            }
        });
        err.map_or(Ok(()), Err)
    }

    /// Takes `e`'s nodes (as a tree) from the function's node allowance, stopping at the limit.
    fn count_nodes(&self, e: &Expr) -> Result<()> {
        let left = self.nodes_left.get();
        let n = e.tree_size_upto(left.saturating_add(1));
        if n > left {
            return Err(self.too_many_nodes());
        }
        self.nodes_left.set(left - n);
        Ok(())
    }

    fn too_many_nodes(&self) -> Error {
        self.fail_limit(
            "function too large (limit MAX_FUNC_NODES)",
            format!("more than {MAX_FUNC_NODES} expression and statement nodes"),
        )
    }

    /// A `Load`/`Store` of `buf` with `nidx` indices and element dtype `dtype`.
    fn access(&self, buf: BufId, nidx: usize, dtype: DType, what: &str) -> Result<()> {
        let Some(b) = self.bufs.get(&buf) else {
            return Err(self.fail(
                "unknown buffer",
                format!(
                    "{what} of buffer id {} which the function does not declare",
                    buf.0
                ),
            ));
        };
        if b.kind == BufKind::Local && !self.live.contains(&buf) {
            return Err(self.fail(
                "local buffer used outside its Allocate",
                format!("{what} of `{}`", b.name),
            ));
        }
        if self.flattened && nidx != 1 {
            return Err(self.fail(
                "flattened access must have exactly 1 index",
                format!("{what} of `{}` has {nidx}", b.name),
            ));
        }
        if !self.flattened && nidx != b.shape.len() {
            return Err(self.fail(
                "index count must equal buffer rank",
                format!(
                    "{what} of `{}` has {nidx} indices, the buffer has {} dims",
                    b.name,
                    b.shape.len()
                ),
            ));
        }
        if dtype != b.dtype {
            return Err(self.fail(
                &format!("{what} dtype must equal buffer dtype"),
                format!("{what} typed {dtype} of `{}` which is {}", b.name, b.dtype),
            ));
        }
        Ok(())
    }

    /// A scalar int64 expression (bound, Let value).
    fn int_expr(&self, e: &Expr, what: &str) -> Result<()> {
        self.index_expr(e, what)?;
        if e.is_vector() {
            return Err(self.fail(
                &format!("{what} must be a scalar"),
                format!("`{e}` has {} lanes", e.lanes()),
            ));
        }
        Ok(())
    }

    /// An int64 expression, scalar or vector (a store's index).
    fn index_expr(&self, e: &Expr, what: &str) -> Result<()> {
        self.expr(e, what)?;
        if e.dtype() != DType::I64 {
            return Err(self.fail(
                &format!("{what} must be int64"),
                format!("`{e}` is {}", e.dtype()),
            ));
        }
        Ok(())
    }

    fn stmt(&mut self, s: &'a Stmt) -> Result<()> {
        if self.stmt_depth >= MAX_STMT_DEPTH {
            return Err(self.fail_limit(
                "statements nested too deep (limit MAX_STMT_DEPTH)",
                format!("more than {MAX_STMT_DEPTH} levels of loops, ifs, lets, allocations and sequences"),
            ));
        }
        match self.nodes_left.get() {
            0 => return Err(self.too_many_nodes()),
            n => self.nodes_left.set(n - 1),
        }
        let saved = self.cur.replace(s);
        self.stmt_depth += 1;
        let r = self.stmt_inner(s);
        self.stmt_depth -= 1;
        self.cur = saved;
        r
    }

    /// Loop kinds: vectorized loops innermost, and parallel / vectorized loops free of races.
    fn loop_kind(
        &mut self,
        var: &super::expr::Var,
        kind: ForKind,
        extent: &Expr,
        body: &Stmt,
    ) -> Result<()> {
        // A loop of at most one iteration has nothing to vectorize or race with.
        if !self.loaded || extent.as_int().is_some_and(|e| e <= 1) {
            return Ok(());
        }
        if kind == ForKind::Vectorized {
            let mut inner = None;
            body.visit(&mut |s| {
                if let Stmt::For { var, .. } = s {
                    inner.get_or_insert_with(|| var.name.clone());
                }
            });
            if let Some(w) = inner {
                return Err(self.fail(
                    "vectorized loop must be innermost",
                    format!(
                        "vectorized loop over `{}` contains the loop over `{w}`",
                        var.name
                    ),
                ));
            }
        }
        if matches!(kind, ForKind::Parallel | ForKind::Vectorized) && !self.flattened {
            if let Err(r) =
                super::verify_parallel::check_loop(self.func, var, body, &mut self.race_budget)
            {
                let what = if kind == ForKind::Parallel {
                    "parallel"
                } else {
                    "vectorized"
                };
                return Err(self.fail(
                    &format!(
                        "{what} loop iterations must write disjoint elements and carry no reduction"
                    ),
                    format!(
                        "{what} loop over `{}`, buffer `{}`: {}",
                        var.name, r.buffer, r.why
                    ),
                ));
            }
        }
        Ok(())
    }

    #[inline(never)]
    fn call(&self, intrin: Intrin, regions: &[Region], scalars: &[Expr]) -> Result<()> {
        let what = format!("call of `{}`", intrin.name());
        for r in regions {
            for e in r.exprs() {
                self.int_expr(e, &format!("region of {what}"))?;
            }
            let Some(b) = self.bufs.get(&r.buf).copied() else {
                return Err(self.fail(
                    "unknown buffer",
                    format!("{what}: region of buffer id {}", r.buf.0),
                ));
            };
            self.access(r.buf, r.base.len(), b.dtype, &what)?;
            if r.write && b.kind == (BufKind::Param { output: false }) {
                return Err(self.fail(
                    "stores go only to outputs and locals",
                    format!("{what} writes input parameter `{}`", b.name),
                ));
            }
        }
        for e in scalars {
            self.expr(e, &format!("scalar of {what}"))?;
        }
        check_call(self.func, intrin, regions, scalars, self.flattened)
            .map_err(|m| self.fail("intrinsic call must match its signature", m))
    }

    /// `Allocate { bufs, body }`: each buffer a declared local, not live already (nor twice
    /// in the list), its shape valid and its strides bound for `body`. Out of line, like
    /// `store`, to keep `stmt_inner`'s frame small.
    #[inline(never)]
    fn allocate(&mut self, bufs: &'a [BufId], body: &'a Stmt) -> Result<()> {
        if bufs.is_empty() {
            return Err(self.fail(
                "an Allocate names at least one buffer",
                "Allocate of no buffers".to_string(),
            ));
        }
        let mut done = 0;
        let mut r = Ok(());
        for buf in bufs {
            r = self.allocate_one(*buf);
            if r.is_err() {
                break;
            }
            done += 1;
        }
        if r.is_ok() {
            r = self.stmt(body);
        }
        for buf in &bufs[..done] {
            self.live.remove(buf);
            if let Some(b) = self.bufs.get(buf).copied() {
                for v in &b.strides {
                    self.bound.remove(&v.id);
                }
            }
        }
        r
    }

    /// One buffer of an `Allocate`: checked, then live with its strides bound (nothing
    /// bound when it fails).
    fn allocate_one(&mut self, buf: BufId) -> Result<()> {
        let Some(b) = self.bufs.get(&buf).copied() else {
            return Err(self.fail(
                "unknown buffer",
                format!(
                    "Allocate of buffer id {} which the function does not declare",
                    buf.0
                ),
            ));
        };
        if b.kind != BufKind::Local {
            return Err(self.fail(
                "only local buffers are allocated",
                format!("Allocate of param `{}`", b.name),
            ));
        }
        if self.live.contains(&buf) {
            return Err(self.fail(
                "local buffer allocated twice in nested scopes",
                format!("`{}`", b.name),
            ));
        }
        for e in &b.shape {
            self.int_expr(e, &format!("shape of local `{}`", b.name))?;
        }
        for (k, v) in b.strides.iter().enumerate() {
            if let Err(e) = self.bind(v, &format!("stride of local `{}`", b.name)) {
                for w in &b.strides[..k] {
                    self.bound.remove(&w.id);
                }
                return Err(e);
            }
        }
        self.live.insert(buf);
        Ok(())
    }

    // Out of line: `stmt_inner` recurses once per nesting level (up to MAX_STMT_DEPTH), so
    // its frame must stay small.
    #[inline(never)]
    fn store(&self, buf: BufId, indices: &[Expr], value: &Expr) -> Result<()> {
        for i in indices {
            self.index_expr(i, "index")?;
            if i.lanes() != value.lanes() {
                return Err(self.fail(
                    "lane mismatch: a store's index and value have equal lanes",
                    format!(
                        "index `{i}` has {} lanes, value `{value}` {}",
                        i.lanes(),
                        value.lanes()
                    ),
                ));
            }
        }
        if value.is_vector() && indices.len() != 1 {
            return Err(self.fail(
                "a vector store has one (flattened) index",
                format!("this one has {}", indices.len()),
            ));
        }
        self.expr(value, "stored value")?;
        self.access(buf, indices.len(), value.dtype(), "store")?;
        let b = self.bufs[&buf];
        if b.kind == (BufKind::Param { output: false }) {
            return Err(self.fail(
                "stores go only to outputs and locals",
                format!("store to input parameter `{}`", b.name),
            ));
        }
        Ok(())
    }

    fn stmt_inner(&mut self, s: &'a Stmt) -> Result<()> {
        match s {
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => {
                self.int_expr(min, "For min")?;
                self.int_expr(extent, "For extent")?;
                if *kind == ForKind::Unrolled && extent.as_int().is_none() {
                    return Err(self.fail(
                        "unrolled loop needs a constant extent",
                        format!("{kind:?} loop over `{}` has extent `{extent}`", var.name),
                    ));
                }
                if let Some(e) = extent.as_int() {
                    if e < 0 {
                        return Err(self.fail(
                            "loop extent must not be negative",
                            format!("loop over `{}` has extent {e}", var.name),
                        ));
                    }
                    if min.as_int().is_some_and(|m| m.checked_add(e).is_none()) {
                        return Err(self.fail(
                            "loop bounds overflow int64",
                            format!("loop over `{}` from {min} for {e} iterations", var.name),
                        ));
                    }
                }
                self.loop_kind(var, *kind, extent, body)?;
                self.bind(var, "loop variable")?;
                let r = self.stmt(body);
                self.bound.remove(&var.id);
                r
            }
            Stmt::Store {
                buf,
                indices,
                value,
            } => self.store(*buf, indices, value),
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                self.expr(cond, "If condition")?;
                if cond.dtype() != DType::Bool || cond.is_vector() {
                    return Err(self.fail(
                        "condition must be bool",
                        format!("If condition `{cond}` is {}", cond.dtype()),
                    ));
                }
                self.stmt(then)?;
                if let Some(o) = otherwise {
                    self.stmt(o)?;
                }
                Ok(())
            }
            Stmt::Let { var, value, body } => {
                self.int_expr(value, "Let value")?;
                self.bind(var, "Let variable")?;
                let r = self.stmt(body);
                self.bound.remove(&var.id);
                r
            }
            Stmt::Allocate { bufs, body } => self.allocate(bufs, body),
            Stmt::Seq(v) => {
                for s in v {
                    self.stmt(s)?;
                }
                Ok(())
            }
            // Where barriers may stand is a rule of `verify_gpu`.
            Stmt::Barrier => Ok(()),
            // Out of line: this function recurses once per nesting level, so its frame stays
            // small (`MAX_STMT_DEPTH`).
            Stmt::Call {
                intrin,
                regions,
                scalars,
            } => self.call(*intrin, regions, scalars),
            // Where it may stand is a rule of `verify_gpu`; its operands are checked here.
            Stmt::AllReduce { value, dst, .. } => {
                self.expr(value, "allreduce value")?;
                let dt = value.dtype();
                if dt == DType::Bool {
                    return Err(self.fail(
                        "a cross-thread reduction combines numbers",
                        format!("allreduce of the bool value `{value}`"),
                    ));
                }
                let Some(b) = self.bufs.get(dst).copied() else {
                    return Err(self.fail(
                        "unknown buffer",
                        format!(
                            "allreduce into buffer id {} which the function does not declare",
                            dst.0
                        ),
                    ));
                };
                let one = b.shape.iter().all(|e| e.as_int() == Some(1));
                if b.kind != BufKind::Local || b.scope != Scope::Local || !one {
                    let shape: Vec<String> = b.shape.iter().map(|e| e.to_string()).collect();
                    return Err(self.fail(
                        "a cross-thread reduction writes a one-element local-scope buffer",
                        format!(
                            "allreduce into `{}` ({:?}, scope {:?}, shape ({}))",
                            b.name,
                            b.kind,
                            b.scope,
                            shape.join(", ")
                        ),
                    ));
                }
                if !self.live.contains(dst) {
                    return Err(self.fail(
                        "local buffer used outside its Allocate",
                        format!("allreduce into `{}`", b.name),
                    ));
                }
                if b.dtype != dt {
                    return Err(self.fail(
                        "allreduce dtype must equal buffer dtype",
                        format!(
                            "allreduce typed {dt} into `{}` which is {}",
                            b.name, b.dtype
                        ),
                    ));
                }
                Ok(())
            }
            Stmt::Launch { kernel } => {
                let Some(k) = self.func.kernels.get(*kernel) else {
                    return Err(self.fail(
                        "a launch names an outlined body",
                        format!(
                            "launch of kernel {kernel}, the function has {}",
                            self.func.kernels.len()
                        ),
                    ));
                };
                let (bufs, vars) = super::uses::free_uses(&k.body, self.func);
                let got_bufs: HashSet<BufId> = k.bufs.iter().copied().collect();
                let got_vars: HashSet<u32> = k.vars.iter().map(|v| v.id).collect();
                if got_bufs != bufs.into_iter().collect() || got_vars != vars.into_iter().collect()
                {
                    return Err(self.fail(
                        "an outlined body captures exactly what it uses from outside",
                        format!("kernel `{}`", k.name),
                    ));
                }
                for v in &k.vars {
                    if !self.bound.contains(&v.id) {
                        return Err(self.fail(
                            "an outlined body captures variables bound at its launch",
                            format!("kernel `{}` captures `{}`, unbound here", k.name, v.name),
                        ));
                    }
                }
                // Its body is checked where it is launched, as if it stood there.
                self.stmt(&k.body)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Check, ExprKind, IterVar, ReduceOp, Var};

    /// A small valid function, and handles on its parts:
    /// `for i in [0, n): allocate T: T[i*sT] = A[i*sA]; C[i*sC] = T[i*sT]`.
    struct Base {
        f: PrimFunc,
        n: Var,
        i: Var,
        a: Buffer,
        c: Buffer,
        t: Buffer,
    }

    use crate::ir::test_util::buffer;

    fn off(b: &Buffer, i: &Var) -> Expr {
        Expr::var(i).mul(&Expr::var(&b.strides[0]))
    }

    fn base() -> Base {
        let n = Var::new("n");
        let i = Var::new("i");
        let a = buffer(
            0,
            "A",
            DType::F32,
            vec![Expr::var(&n)],
            BufKind::Param { output: false },
        );
        let c = buffer(
            1,
            "C",
            DType::F32,
            vec![Expr::var(&n)],
            BufKind::Param { output: true },
        );
        let t = buffer(2, "T", DType::F32, vec![Expr::var(&n)], BufKind::Local);
        let body = Stmt::For {
            var: i.clone(),
            min: Expr::int(0),
            extent: Expr::var(&n),
            kind: ForKind::Serial,
            body: Box::new(Stmt::Allocate {
                bufs: vec![t.id],
                body: Box::new(Stmt::Seq(vec![
                    Stmt::Store {
                        buf: t.id,
                        indices: vec![off(&t, &i)],
                        value: Expr::load(a.id, vec![off(&a, &i)], DType::F32),
                    },
                    Stmt::Store {
                        buf: c.id,
                        indices: vec![off(&c, &i)],
                        value: Expr::load(t.id, vec![off(&t, &i)], DType::F32),
                    },
                ])),
            }),
        };
        let f = PrimFunc {
            name: "copy_via_local".into(),
            params: vec![a.id, c.id],
            buffers: vec![a.clone(), c.clone(), t.clone()],
            dims: vec![n.clone()],
            checks: vec![],
            body,
            kernels: vec![],
            callbacks: vec![],
        };
        Base { f, n, i, a, c, t }
    }

    /// The base function with `C[i*sC] = value` (inside the loop and allocation) instead.
    fn with_store(b: &Base, indices: Vec<Expr>, value: Expr) -> PrimFunc {
        let mut f = b.f.clone();
        f.body = Stmt::For {
            var: b.i.clone(),
            min: Expr::int(0),
            extent: Expr::var(&b.n),
            kind: ForKind::Serial,
            body: Box::new(Stmt::Allocate {
                bufs: vec![b.t.id],
                body: Box::new(Stmt::Store {
                    buf: b.c.id,
                    indices,
                    value,
                }),
            }),
        };
        f
    }

    fn expect_err(f: &PrimFunc, flattened: bool, rule: &str) {
        match verify(f, flattened) {
            Err(Error::Internal(m)) => {
                assert!(m.contains(rule), "expected rule `{rule}` in: {m}");
                assert!(
                    m.contains(&f.name),
                    "message does not name the function: {m}"
                );
            }
            other => panic!("expected an internal error for `{rule}`, got {other:?}"),
        }
    }

    /// A size limit is the program's to change: a `CompileError` naming the limit and the
    /// function, never "a bug in rivet".
    fn expect_limit(f: &PrimFunc, flattened: bool, rule: &str) {
        match verify(f, flattened) {
            Err(Error::Compile(m)) => {
                assert!(m.contains(rule), "expected `{rule}` in: {m}");
                assert!(
                    m.contains(&f.name),
                    "message does not name the function: {m}"
                );
            }
            other => panic!("expected a compile error for `{rule}`, got {other:?}"),
        }
    }

    #[test]
    fn base_is_valid() {
        let b = base();
        verify(&b.f, true).unwrap();
        // One index per dim of a 1-d buffer: also valid unflattened.
        verify(&b.f, false).unwrap();
    }

    #[test]
    fn params_first_in_order() {
        let mut f = base().f;
        f.buffers.swap(0, 1);
        expect_err(&f, true, "params must be the first buffers, in order");
    }

    #[test]
    fn unique_ids() {
        let mut f = base().f;
        f.buffers[2].id = BufId(0);
        expect_err(&f, true, "duplicate buffer id");
    }

    #[test]
    fn buffer_kinds() {
        let mut f = base().f;
        f.buffers[0].kind = BufKind::Local;
        expect_err(&f, true, "param buffer must have kind Param");
        let mut f = base().f;
        f.buffers[2].kind = BufKind::Param { output: false };
        expect_err(&f, true, "non-param buffer must have kind Local");
    }

    #[test]
    fn strides_match_shape() {
        let mut f = base().f;
        f.buffers[1].strides.push(Var::new("extra"));
        expect_err(&f, true, "strides.len() must equal shape.len()");
    }

    #[test]
    fn unbound_variables() {
        let b = base();
        let stray = Var::new("stray");
        let f = with_store(&b, vec![Expr::var(&stray)], Expr::constant(1.0, DType::F32));
        expect_err(&f, true, "unbound variable");
        // A local's stride is bound only inside its Allocate.
        let mut f = b.f.clone();
        f.body = Stmt::Store {
            buf: b.c.id,
            indices: vec![Expr::var(&b.t.strides[0])],
            value: Expr::constant(1.0, DType::F32),
        };
        expect_err(&f, true, "unbound variable");
        // A loop variable is out of scope after its loop.
        let mut f = b.f.clone();
        f.body = Stmt::Seq(vec![
            b.f.body.clone(),
            Stmt::Store {
                buf: b.c.id,
                indices: vec![Expr::var(&b.i)],
                value: Expr::constant(1.0, DType::F32),
            },
        ]);
        expect_err(&f, true, "unbound variable");
        // Parameter shapes use dims only.
        let mut f = b.f.clone();
        f.buffers[0].shape[0] = Expr::var(&b.i);
        expect_err(&f, true, "unbound variable");
    }

    #[test]
    fn no_shadowing_but_siblings_may_rebind() {
        let b = base();
        let mut f = b.f.clone();
        f.body = Stmt::For {
            var: b.i.clone(),
            min: Expr::int(0),
            extent: Expr::int(2),
            kind: ForKind::Serial,
            body: Box::new(b.f.body.clone()),
        };
        expect_err(&f, true, "variable bound twice");
        // A loop over a dim's variable.
        let mut f = b.f.clone();
        f.body = Stmt::For {
            var: b.n.clone(),
            min: Expr::int(0),
            extent: Expr::int(2),
            kind: ForKind::Serial,
            body: Box::new(Stmt::Seq(vec![])),
        };
        expect_err(&f, true, "variable bound twice");
        // A Let of a param stride.
        let mut f = b.f.clone();
        f.body = Stmt::Let {
            var: b.a.strides[0].clone(),
            value: Expr::int(1),
            body: Box::new(Stmt::Seq(vec![])),
        };
        expect_err(&f, true, "variable bound twice");
        // Two sibling loops over the same variable are fine.
        let mut f = b.f.clone();
        f.body = Stmt::Seq(vec![b.f.body.clone(), b.f.body.clone()]);
        verify(&f, true).unwrap();
    }

    #[test]
    fn te_only_nodes() {
        let b = base();
        let t = crate::te::placeholder(&[Expr::int(4)], DType::F32, "P").unwrap();
        let read = t.try_at(&[Expr::var(&b.i)]).unwrap();
        expect_err(
            &with_store(&b, vec![off(&b.c, &b.i)], read),
            true,
            "te-only node",
        );
        let k = Var::new("k");
        let reduce = Expr::new(
            ExprKind::Reduce {
                op: ReduceOp::Sum,
                body: Expr::constant(1.0, DType::F32),
                axes: vec![IterVar {
                    var: k,
                    min: Expr::int(0),
                    extent: Expr::int(3),
                    reduce: true,
                }],
            },
            DType::F32,
        );
        expect_err(
            &with_store(&b, vec![off(&b.c, &b.i)], reduce),
            true,
            "te-only node",
        );
        let invalid = Expr::new(ExprKind::Invalid("misuse".into()), DType::F32);
        expect_err(
            &with_store(&b, vec![off(&b.c, &b.i)], invalid),
            true,
            "invalid expression",
        );
    }

    #[test]
    fn buffers_exist_and_locals_are_live() {
        let b = base();
        let bogus = Expr::load(BufId(99), vec![Expr::int(0)], DType::F32);
        expect_err(
            &with_store(&b, vec![off(&b.c, &b.i)], bogus),
            true,
            "unknown buffer",
        );
        let mut f = b.f.clone();
        f.body = Stmt::Store {
            buf: b.t.id,
            indices: vec![Expr::int(0)],
            value: Expr::constant(1.0, DType::F32),
        };
        expect_err(&f, true, "local buffer used outside its Allocate");
        let mut f = b.f.clone();
        f.body = Stmt::Allocate {
            bufs: vec![b.a.id],
            body: Box::new(Stmt::Seq(vec![])),
        };
        expect_err(&f, true, "only local buffers are allocated");
        let mut f = b.f.clone();
        f.body = Stmt::Allocate {
            bufs: vec![b.t.id],
            body: Box::new(b.f.body.clone()),
        };
        expect_err(&f, true, "allocated twice");
    }

    #[test]
    fn int64_indices_bounds_and_lets() {
        let b = base();
        let f = with_store(
            &b,
            vec![Expr::const_int(0, DType::I32)],
            Expr::constant(1.0, DType::F32),
        );
        expect_err(&f, true, "index must be int64");
        let mut f = b.f.clone();
        f.body = Stmt::For {
            var: Var::new("j"),
            min: Expr::int(0),
            extent: Expr::const_int(3, DType::I32),
            kind: ForKind::Serial,
            body: Box::new(Stmt::Seq(vec![])),
        };
        expect_err(&f, true, "For extent must be int64");
        let mut f = b.f.clone();
        f.body = Stmt::Let {
            var: Var::new("x"),
            value: Expr::const_int(3, DType::U64),
            body: Box::new(Stmt::Seq(vec![])),
        };
        expect_err(&f, true, "Let value must be int64");
    }

    /// An `Fma` is float-only with one dtype (the bounds proof never meets an int64 one: it
    /// reasons about `+` and `*` only); hand-made or loaded bad nodes are refused.
    #[test]
    fn fma_is_float_only() {
        let b = base();
        let i64_fma = Expr::new(
            ExprKind::Fma(Expr::int(2), Expr::int(3), Expr::int(4)),
            DType::I64,
        );
        expect_err(
            &with_store(&b, vec![i64_fma], Expr::constant(1.0, DType::F32)),
            true,
            "fma needs floats",
        );
        let mixed = Expr::new(
            ExprKind::Fma(
                Expr::constant(1.0, DType::F32),
                Expr::constant(1.0, DType::F64),
                Expr::constant(1.0, DType::F32),
            ),
            DType::F32,
        );
        expect_err(
            &with_store(&b, vec![off(&b.c, &b.i)], mixed),
            true,
            "operand dtypes differ: fma",
        );
    }

    #[test]
    fn conditions_are_bool() {
        let b = base();
        let mut f = b.f.clone();
        f.body = Stmt::If {
            cond: Expr::int(1),
            then: Box::new(b.f.body.clone()),
            otherwise: None,
        };
        expect_err(&f, true, "condition must be bool");
        let bad_select = Expr::new(
            ExprKind::Select(
                Expr::int(1),
                Expr::constant(1.0, DType::F32),
                Expr::constant(2.0, DType::F32),
            ),
            DType::F32,
        );
        expect_err(
            &with_store(&b, vec![off(&b.c, &b.i)], bad_select),
            true,
            "condition must be bool",
        );
    }

    #[test]
    fn dtypes_of_stores_loads_and_operands() {
        let b = base();
        expect_err(
            &with_store(&b, vec![off(&b.c, &b.i)], Expr::constant(1.0, DType::F64)),
            true,
            "store dtype must equal buffer dtype",
        );
        let wrong_load = Expr::load(b.a.id, vec![off(&b.a, &b.i)], DType::F64);
        expect_err(
            &with_store(
                &b,
                vec![off(&b.c, &b.i)],
                Expr::cast(DType::F32, wrong_load),
            ),
            true,
            "load dtype must equal buffer dtype",
        );
        let mixed = Expr::new(
            ExprKind::Binary(
                BinOp::Add,
                Expr::constant(1.0, DType::F32),
                Expr::constant(1.0, DType::F64),
            ),
            DType::F32,
        );
        expect_err(
            &with_store(&b, vec![off(&b.c, &b.i)], mixed),
            true,
            "operand dtypes differ",
        );
        let mixed_cmp = Expr::new(
            ExprKind::Cmp(
                crate::ir::CmpOp::Lt,
                Expr::int(1),
                Expr::const_int(1, DType::I32),
            ),
            DType::Bool,
        );
        let sel = Expr::select(
            mixed_cmp.clone(),
            Expr::constant(1.0, DType::F32),
            Expr::constant(2.0, DType::F32),
        )
        .unwrap();
        expect_err(
            &with_store(&b, vec![off(&b.c, &b.i)], sel),
            true,
            "operand dtypes differ",
        );
        assert!(
            matches!(verify_expr_types(&mixed_cmp), Err(Error::Internal(m)) if m.contains("operand dtypes differ"))
        );
        assert!(verify_expr_types(&Expr::var(&b.i).add(&Expr::int(1))).is_ok());
    }

    #[test]
    fn index_counts() {
        let b = base();
        let two = vec![off(&b.c, &b.i), Expr::int(0)];
        expect_err(
            &with_store(&b, two, Expr::constant(1.0, DType::F32)),
            true,
            "flattened access must have exactly 1 index",
        );
        // Unflattened: one index per dimension.
        let mut f = b.f.clone();
        let m = Var::new("m");
        f.dims.push(m.clone());
        f.buffers[1].shape.push(Expr::var(&m));
        f.buffers[1].strides.push(Var::new("C_s1"));
        expect_err(&f, false, "index count must equal buffer rank");
        verify(&f, true).unwrap();
    }

    #[test]
    fn unrolled_loops_need_constant_extents() {
        let b = base();
        let mut f = b.f.clone();
        let Stmt::For { kind: k, .. } = &mut f.body else {
            unreachable!()
        };
        *k = ForKind::Vectorized;
        verify(&f, true).unwrap(); // symbolic extents may be vectorized (strip-mined)
        let mut f = b.f.clone();
        let Stmt::For { kind: k, .. } = &mut f.body else {
            unreachable!()
        };
        *k = ForKind::Unrolled;
        expect_err(&f, true, "unrolled loop needs a constant extent");
        let mut f = b.f.clone();
        let Stmt::For {
            kind: k, extent, ..
        } = &mut f.body
        else {
            unreachable!()
        };
        *k = ForKind::Unrolled;
        *extent = Expr::int(4);
        verify(&f, true).unwrap();
    }

    #[test]
    fn checks() {
        let b = base();
        let mut f = b.f.clone();
        f.checks.push(Check {
            cond: Expr::var(&b.n),
            message: "n".into(),
        });
        expect_err(&f, true, "condition must be bool");
        let mut f = b.f.clone();
        f.checks.push(Check {
            cond: Expr::var(&b.i).lt(&Expr::var(&b.n)),
            message: "i < n".into(),
        });
        expect_err(&f, true, "checks use only dims and param stride variables");
        let mut f = b.f.clone();
        f.checks.push(Check {
            cond: Expr::var(&b.t.strides[0]).lt(&Expr::var(&b.n)),
            message: "local stride".into(),
        });
        expect_err(&f, true, "checks use only dims and param stride variables");
        let mut f = b.f.clone();
        let x = Expr::load(b.a.id, vec![Expr::int(0)], DType::F32);
        f.checks.push(Check {
            cond: Expr::cmp(crate::ir::CmpOp::Lt, x.clone(), x).unwrap(),
            message: "load".into(),
        });
        expect_err(&f, true, "checks use only dims and param stride variables");
        let mut f = b.f.clone();
        f.checks.push(Check {
            cond: Expr::var(&b.a.strides[0]).lt(&Expr::var(&b.n)),
            message: "ok".into(),
        });
        verify(&f, true).unwrap();
    }

    /// `for i in [0, 8) (kind): C[idx] = C[idx] + A[i]`, unflattened, loaded-file rules.
    fn loaded_loop(kind: ForKind, idx: impl Fn(&Var) -> Expr) -> PrimFunc {
        let b = base();
        let i = Var::new("i");
        let mut f = b.f.clone();
        let at = idx(&i);
        f.body = Stmt::For {
            var: i.clone(),
            min: Expr::int(0),
            extent: Expr::int(8),
            kind,
            body: Box::new(Stmt::Store {
                buf: b.c.id,
                indices: vec![at.clone()],
                value: Expr::binary(
                    BinOp::Add,
                    Expr::load(b.c.id, vec![at], DType::F32),
                    Expr::load(b.a.id, vec![Expr::var(&i)], DType::F32),
                )
                .unwrap(),
            }),
        };
        f
    }

    fn expect_loaded_err(f: &PrimFunc, rule: &str) {
        match verify_loaded(f) {
            Err(Error::Internal(m)) => assert!(m.contains(rule), "expected `{rule}` in: {m}"),
            other => panic!("expected `{rule}`, got {other:?}"),
        }
    }

    #[test]
    fn stores_only_to_outputs_and_locals() {
        let b = base();
        let mut f = b.f.clone();
        f.body = Stmt::Store {
            buf: b.a.id,
            indices: vec![Expr::int(0)],
            value: Expr::constant(1.0, DType::F32),
        };
        expect_err(&f, true, "stores go only to outputs and locals");
    }

    #[test]
    fn parallel_loops_must_be_race_free_in_loaded_functions() {
        // Disjoint: C[i], C[2 * i + 1].
        verify_loaded(&loaded_loop(ForKind::Parallel, Expr::var)).unwrap();
        verify_loaded(&loaded_loop(ForKind::Parallel, |i| {
            Expr::int(2).mul(&Expr::var(i)).add(&Expr::int(1))
        }))
        .unwrap();
        // A reduction into C[0], a shared C[i // 2]: refused; serial: fine.
        let red = loaded_loop(ForKind::Parallel, |_| Expr::int(0));
        expect_loaded_err(
            &red,
            "parallel loop iterations must write disjoint elements",
        );
        verify(&red, false).unwrap(); // the builder's own output is not held to the rule
        expect_loaded_err(
            &loaded_loop(ForKind::Parallel, |i| Expr::var(i).floordiv(&Expr::int(2))),
            "disjoint elements",
        );
        verify_loaded(&loaded_loop(ForKind::Serial, |_| Expr::int(0))).unwrap();
        expect_loaded_err(
            &loaded_loop(ForKind::Vectorized, |_| Expr::int(0)),
            "vectorized loop iterations must write disjoint elements",
        );
    }

    #[test]
    fn extents_and_resource_limits() {
        let b = base();
        let mut f = b.f.clone();
        let Stmt::For { extent, .. } = &mut f.body else {
            unreachable!()
        };
        *extent = Expr::int(-1);
        expect_err(&f, true, "loop extent must not be negative");
        let mut f = b.f.clone();
        let Stmt::For { min, extent, .. } = &mut f.body else {
            unreachable!()
        };
        *min = Expr::int(i64::MAX);
        *extent = Expr::int(2);
        expect_err(&f, true, "loop bounds overflow int64");
        // Too deep an expression.
        let mut v = Expr::constant(1.0, DType::F32);
        for _ in 0..MAX_IR_DEPTH {
            v = Expr::new(ExprKind::Unary(UnOp::Neg, v), DType::F32);
        }
        expect_limit(
            &with_store(&b, vec![off(&b.c, &b.i)], v),
            true,
            "limit MAX_IR_DEPTH",
        );
        // Too deeply nested statements.
        let mut f = b.f.clone();
        for _ in 0..MAX_STMT_DEPTH {
            f.body = Stmt::Seq(vec![f.body]);
        }
        expect_limit(&f, true, "limit MAX_STMT_DEPTH");
        // A DAG of 2^60 tree nodes (60 shared levels): refused at the limit, quickly.
        let mut v = Expr::constant(1.0, DType::F32);
        for _ in 0..60 {
            v = Expr::binary(BinOp::Add, v.clone(), v).unwrap();
        }
        expect_limit(
            &with_store(&b, vec![off(&b.c, &b.i)], v),
            true,
            "limit MAX_FUNC_NODES",
        );
    }

    #[test]
    fn messages_name_the_statement() {
        let b = base();
        let f = with_store(&b, vec![off(&b.c, &b.i)], Expr::constant(1.0, DType::F64));
        let Err(Error::Internal(m)) = verify(&f, true) else {
            panic!()
        };
        assert!(
            m.contains("in statement: C[(i * C.s0)] = 1.0:float64"),
            "{m}"
        );
    }
}
