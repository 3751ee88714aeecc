//! A schedule's program seen through its stage definitions, and the primitives that rewrite
//! those definitions: the GPU memory caches (TVM's `cache_read` / `cache_write`) and the
//! default schedules' rewrites (`redefine`, `restart_stage`, `set_definition`).
//!
//! `cache_read(A, scope, readers)` adds a copy of `A` in a `shared` or `local` buffer that the
//! readers read instead; `cache_write(C, "local")` moves C's computation to a local stage and
//! leaves C a copy of it. Where a cache stage may stand (attached inside a GPU kernel) is
//! checked when the schedule is lowered (`lower::nest`).
//!
//! Invariant: rewrites change stage *definitions*, never the user's tensors: a stage's
//! `tensor` keeps the id (and so the buffer, the argument identity and the axes) of the tensor
//! it was made for, with the current body; `Schedule::current` and `Schedule::post_order` see
//! a program through the schedule's definitions.

use super::{err, Attach, Schedule, Stage};
use crate::error::{Error, Result};
use crate::ir::expr::{Expr, ExprKind, IterVar, Var};
use crate::ir::stmt::{ForKind, Scope};
use crate::te::tensor::{inputs, Op, Tensor, TensorNode};

/// The scope a cache stage is asked for: "shared" or "local" (TVM's names).
pub fn parse_scope(what: &str, scope: &str, allowed: &[Scope]) -> Result<Scope> {
    let parsed = match scope {
        "shared" => Some(Scope::Shared),
        "local" => Some(Scope::Local),
        _ => None,
    };
    let names: Vec<&str> = allowed
        .iter()
        .map(|s| match s {
            Scope::Shared => "'shared'",
            Scope::Local => "'local'",
            Scope::Global => "'global'",
        })
        .collect();
    match parsed {
        Some(s) if allowed.contains(&s) => Ok(s),
        _ => Err(Error::Compile(format!(
            "{what}: scope must be {}, got '{scope}'",
            names.join(" or ")
        ))),
    }
}

/// `t` with the same id, name, shape and axes, and the definition `body`.
pub(crate) fn redefine(t: &Tensor, body: Expr) -> Tensor {
    let axis = t.axis().to_vec();
    Tensor(std::sync::Arc::new(TensorNode {
        id: t.id(),
        name: t.name().to_string(),
        shape: t.shape().to_vec(),
        dtype: t.dtype(),
        host_callbacks: crate::te::tensor::reads_host_callbacks(&body),
        op: Op::Compute { axis, body },
        stop_gradient: t.stops_gradient(),
    }))
}

/// `body` with every read of tensor `from` (by id) reading `to` at the same indices.
fn redirect(body: &Expr, from: u32, to: &Tensor) -> Expr {
    body.rewrite(&mut |n| match n.kind() {
        ExprKind::Read { tensor, indices } if tensor.id() == from => Some(to.idx(indices)),
        _ => None,
    })
}

/// Fresh data-parallel axes over `shape`, named `ax0`, `ax1`, ...
fn fresh_axes(shape: &[Expr]) -> Vec<IterVar> {
    shape
        .iter()
        .enumerate()
        .map(|(d, e)| IterVar {
            var: Var::new(&format!("ax{d}")),
            min: Expr::int(0),
            extent: e.clone(),
            reduce: false,
        })
        .collect()
}

impl Schedule {
    /// The definition of `t` this schedule computes: its stage's tensor (rewritten by cache
    /// stages), or `t` itself (placeholders, tensors with no stage).
    pub fn current(&self, t: &Tensor) -> Tensor {
        self.stages
            .iter()
            .find(|s| s.tensor.id() == t.id())
            .map(|s| s.tensor.clone())
            .unwrap_or_else(|| t.clone())
    }

    /// Every tensor the outputs depend on through the current definitions (cache stages
    /// included), producers before consumers.
    pub fn post_order(&self) -> Vec<Tensor> {
        let current: std::collections::HashMap<u32, &Tensor> = self
            .stages
            .iter()
            .map(|s| (s.tensor.id(), &s.tensor))
            .collect();
        let cur = |t: &Tensor| {
            current
                .get(&t.id())
                .map_or_else(|| t.clone(), |&c| c.clone())
        };
        let roots: Vec<Tensor> = self.outputs.iter().map(cur).collect();
        crate::te::tensor::post_order_by(&roots, &mut |t| inputs(t).iter().map(cur).collect())
    }

    /// Makes stage `i` a fresh, unscheduled stage of `t` (a rewrite of its definition: the
    /// default schedules' packed GEMM and lane reductions, `cache_write`), keeping its debug
    /// taps: `t` still computes the same values into the same buffer, which the taps observe.
    pub(crate) fn restart_stage(&mut self, i: usize, t: &Tensor) {
        let taps = std::mem::take(&mut self.stages[i].taps);
        self.stages[i] = Stage::new(t);
        self.stages[i].taps = taps;
    }

    /// Replaces the definition of stage `i` (and of the output it is, if any).
    pub(crate) fn set_definition(&mut self, i: usize, t: Tensor) {
        for o in &mut self.outputs {
            if o.id() == t.id() {
                *o = t.clone();
            }
        }
        self.stages[i].tensor = t;
    }

    /// TVM's `cache_read`: a new stage `"<t>.<scope>"` copying `t` into a buffer of `scope`
    /// ("shared" or "local"), read by `readers` instead of `t`. Typically `compute_at` inside
    /// a loop of a reader bound to a GPU, so only the region one iteration needs is copied,
    /// its loops bound to the block's threads (a cooperative load). Returns the new tensor.
    pub fn cache_read(&mut self, t: &Tensor, scope: &str, readers: &[Tensor]) -> Result<Tensor> {
        let scope = parse_scope("cache_read", scope, &[Scope::Shared, Scope::Local])?;
        let t = self.current(t);
        if let Some(i) = self.stages.iter().position(|s| s.tensor == t) {
            if self.stages[i].attach == Attach::Inline {
                return err(
                    &self.stages[i],
                    "cannot cache_read a stage that is compute_inline'd (it has no buffer to copy)"
                        .into(),
                );
            }
        }
        if readers.is_empty() {
            return Err(Error::Compile(format!(
                "cache_read of '{}': readers must list at least one stage that reads it",
                t.name()
            )));
        }
        let mut positions = Vec::new();
        for r in readers {
            let Ok(p) = self.stage_index(r) else {
                return Err(Error::Compile(format!(
                    "cache_read of '{}': reader '{}' is not a stage of this schedule (a placeholder or not used by the outputs)",
                    t.name(),
                    r.name()
                )));
            };
            let cur = &self.stages[p].tensor;
            if cur.is_extern() {
                return Err(Error::Compile(format!(
                    "cache_read of '{}': reader '{}' is an extern stage (its callback reads whole tensors on the host)",
                    t.name(),
                    r.name()
                )));
            }
            if !inputs(cur).contains(&t) {
                return Err(Error::Compile(format!(
                    "cache_read of '{}': reader '{}' does not read '{}'",
                    t.name(),
                    r.name(),
                    t.name()
                )));
            }
            if positions.contains(&p) {
                return Err(Error::Compile(format!(
                    "cache_read of '{}': reader '{}' is listed twice",
                    t.name(),
                    r.name()
                )));
            }
            positions.push(p);
        }
        let axes = fresh_axes(t.shape());
        let idx: Vec<Expr> = axes.iter().map(|a| Expr::var(&a.var)).collect();
        let name = format!(
            "{}.{}",
            t.name(),
            if scope == Scope::Shared {
                "shared"
            } else {
                "local"
            }
        );
        let cache = crate::te::tensor::compute_from(t.shape(), axes, t.try_at(&idx)?, &name)?;
        for &p in &positions {
            let cur = self.stages[p].tensor.clone();
            let body = redirect(cur.body().expect("a stage is a compute"), t.id(), &cache);
            self.set_definition(p, redefine(&cur, body));
        }
        let mut stage = Stage::new(&cache);
        stage.scope = scope;
        let at = *positions.iter().min().expect("one reader at least");
        self.stages.insert(at, stage);
        Ok(cache)
    }

    /// TVM's `cache_write`: `t`'s computation moves to a new stage `"<t>.local"` computing into
    /// a per-thread `local` buffer (e.g. a block of accumulators in registers), and `t` becomes
    /// a copy of it. `t`'s stage keeps its data-parallel axes (schedule it as before) and loses
    /// its reduction axes, which the new stage has (the same variables). Only "local" is
    /// supported, and only on a stage not scheduled yet. Returns the new tensor.
    pub fn cache_write(&mut self, t: &Tensor, scope: &str) -> Result<Tensor> {
        let scope = parse_scope("cache_write", scope, &[Scope::Local])?;
        if t.is_placeholder() {
            return Err(Error::Compile(format!(
                "cache_write of '{}': it is a placeholder (an input); only a computed tensor's writes can be cached",
                t.name()
            )));
        }
        let i = self.stage_index(t)?;
        let st = &self.stages[i];
        if st.tensor.is_extern() {
            return err(
                st,
                "cannot cache_write an extern stage (a host callback computes it)".into(),
            );
        }
        if st.attach != Attach::Root
            || !st.relations.is_empty()
            || st.leaves.iter().any(|l| l.kind != ForKind::Serial)
            || st.scope != Scope::Global
        {
            return err(st, "cache_write must come before the stage is scheduled (split, bind, compute_at, inline, or another cache_write of it)".into());
        }
        let cur = st.tensor.clone();
        let axes = fresh_axes(cur.shape());
        let own: Vec<Var> = cur.axis().iter().map(|a| a.var.clone()).collect();
        let body = cur.body().expect("a stage is a compute").substitute(&|v| {
            own.iter()
                .position(|a| a == v)
                .map(|d| Expr::var(&axes[d].var))
        });
        let name = format!("{}.local", cur.name());
        let cache = crate::te::tensor::compute_from(cur.shape(), axes, body, &name)?;
        let idx: Vec<Expr> = own.iter().map(Expr::var).collect();
        let copy = redefine(&cur, cache.try_at(&idx)?);
        self.restart_stage(i, &copy);
        self.set_definition(i, copy);
        let mut stage = Stage::new(&cache);
        stage.scope = scope;
        self.stages.insert(i, stage);
        Ok(cache)
    }
}
