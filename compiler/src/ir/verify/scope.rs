//! The verifier's rules on what is declared and where it is in scope: the function's header
//! (buffers, dims, parameter strides, `checks`), variables bound once and used only inside
//! their scope, buffers accessed only where they exist (a local inside its `Allocate`) with
//! their rank and dtype, and each expression counted against the resource limits before it
//! is walked.

use super::types::check_types;
use super::Verifier;
use crate::error::{Error, Result};
use crate::ir::expr::{BufId, Expr, ExprKind, Var};
use crate::ir::limits::MAX_IR_DEPTH;
use crate::ir::stmt::BufKind;
use rivet_runtime::DType;

impl<'a> Verifier<'a> {
    /// Buffers, dims, parameter strides and checks; leaves dims and parameter strides bound.
    pub(super) fn header(&mut self) -> Result<()> {
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
    pub(super) fn bind(&mut self, v: &Var, what: &str) -> Result<()> {
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
    pub(super) fn expr(&self, e: &Expr, what: &str) -> Result<()> {
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
    pub(super) fn count_nodes(&self, e: &Expr) -> Result<()> {
        let left = self.nodes_left.get();
        let n = e.tree_size_upto(left.saturating_add(1));
        if n > left {
            return Err(self.too_many_nodes());
        }
        self.nodes_left.set(left - n);
        Ok(())
    }

    /// A `Load`/`Store` of `buf` with `nidx` indices and element dtype `dtype`.
    pub(super) fn access(&self, buf: BufId, nidx: usize, dtype: DType, what: &str) -> Result<()> {
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
    pub(super) fn int_expr(&self, e: &Expr, what: &str) -> Result<()> {
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
    pub(super) fn index_expr(&self, e: &Expr, what: &str) -> Result<()> {
        self.expr(e, what)?;
        if e.dtype() != DType::I64 {
            return Err(self.fail(
                &format!("{what} must be int64"),
                format!("`{e}` is {}", e.dtype()),
            ));
        }
        Ok(())
    }
}
