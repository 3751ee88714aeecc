//! The verifier's walk over statements: statement depth and node counts, loop kinds and
//! extents (and, for loaded functions, vectorized loops innermost and race-free parallel
//! loops), allocations, stores, intrinsic calls, cross-thread reductions, and outlined
//! kernel bodies (checked where they are launched).

use super::intrin::check_call;
use super::Verifier;
use crate::error::Result;
use crate::ir::expr::{BufId, Expr, Var};
use crate::ir::intrin::{Intrin, Region};
use crate::ir::limits::MAX_STMT_DEPTH;
use crate::ir::stmt::{BufKind, ForKind, Scope, Stmt};
use rivet_runtime::DType;
use std::collections::HashSet;

impl<'a> Verifier<'a> {
    pub(super) fn stmt(&mut self, s: &'a Stmt) -> Result<()> {
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
    fn loop_kind(&mut self, var: &Var, kind: ForKind, extent: &Expr, body: &Stmt) -> Result<()> {
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
                super::parallel::check_loop(self.func, var, extent, body, &mut self.race_budget)
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
            // Where barriers may stand is a rule of `verify::gpu`.
            Stmt::Barrier => Ok(()),
            // Out of line: this function recurses once per nesting level, so its frame stays
            // small (`MAX_STMT_DEPTH`).
            Stmt::Call {
                intrin,
                regions,
                scalars,
            } => self.call(*intrin, regions, scalars),
            // Where it may stand is a rule of `verify::gpu`; its operands are checked here.
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
                let (bufs, vars) = crate::ir::uses::free_uses(&k.body, self.func);
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
