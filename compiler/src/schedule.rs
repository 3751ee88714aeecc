//! Schedules, TVM-shaped: `Schedule::new(outputs)` makes one `Stage` per compute; a stage's
//! loops start as its data-parallel axes then its reduction axes, and the primitives reshape
//! them: `split`, `fuse`, `reorder`, `tile`, and annotate them: `unroll`, `vectorize`,
//! `parallel`; `compute_inline` and `compute_at` place a stage relative to its consumers.
//!
//! A schedule never changes what a program computes. Every primitive checks its own
//! preconditions and explains a refusal (`CompileError`); placement-dependent rules
//! (vectorised loop innermost with a constant extent, `compute_at` target being the only
//! consumer) are checked when the schedule is lowered.

use crate::error::{Error, Result};
use crate::ir::expr::{Expr, Var};
use crate::ir::stmt::ForKind;
use crate::te::tensor::{post_order, Tensor};

/// How a stage's loops were derived from its root axes (applied in order).
#[derive(Clone, Debug)]
pub enum Relation {
    /// `parent = outer * factor + inner`; `factor` is the inner extent, or with `nparts` the
    /// outer extent is fixed and the inner one is `ceil(parent / nparts)`.
    Split {
        parent: Var,
        outer: Var,
        inner: Var,
        factor: Option<Expr>,
        nparts: Option<Expr>,
    },
    /// `fused = outer * extent(inner) + inner`.
    Fuse { outer: Var, inner: Var, fused: Var },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Attach {
    /// Materialised in its own loop nest at the top of the function.
    Root,
    /// Substituted into its consumers (no buffer, no loops).
    Inline,
    /// Computed inside the loop `var` of the stage of `consumer`, only over the region that
    /// one iteration of that loop needs.
    At { consumer: u32, var: Var },
}

#[derive(Clone, Debug)]
pub struct Leaf {
    pub var: Var,
    pub reduce: bool,
    pub kind: ForKind,
}

#[derive(Clone, Debug)]
pub struct Stage {
    pub tensor: Tensor,
    /// Loops, outermost first.
    pub leaves: Vec<Leaf>,
    pub relations: Vec<Relation>,
    pub attach: Attach,
}

#[derive(Clone, Debug)]
pub struct Schedule {
    pub outputs: Vec<Tensor>,
    pub stages: Vec<Stage>,
}

fn err<T>(stage: &Stage, msg: String) -> Result<T> {
    Err(Error::Compile(format!(
        "schedule of '{}': {msg}",
        stage.tensor.name()
    )))
}

impl Stage {
    fn new(t: &Tensor) -> Stage {
        let leaves = t
            .axis()
            .iter()
            .chain(t.reduce_axis())
            .map(|iv| Leaf {
                var: iv.var.clone(),
                reduce: iv.reduce,
                kind: ForKind::Serial,
            })
            .collect();
        Stage {
            tensor: t.clone(),
            leaves,
            relations: Vec::new(),
            attach: Attach::Root,
        }
    }

    fn leaf_pos(&self, v: &Var, what: &str) -> Result<usize> {
        if let Some(p) = self.leaves.iter().position(|l| &l.var == v) {
            return Ok(p);
        }
        let derived = self.relations.iter().any(|r| match r {
            Relation::Split { parent, .. } => parent == v,
            Relation::Fuse { outer, inner, .. } => outer == v || inner == v,
        });
        if derived {
            err(self, format!("cannot {what} '{}': it was already split or fused; use the loops that replaced it", v.name))
        } else {
            err(self, format!(
                "cannot {what} '{}': it is not a loop of this stage (each stage has its own axes: use C.op.axis / C.op.reduce_axis of this tensor)",
                v.name
            ))
        }
    }

    /// Splits loop `parent` into `(outer, inner)` with `inner` of extent `factor`, or with
    /// `outer` of extent `nparts`. Extents that do not divide add a guard.
    pub fn split(
        &mut self,
        parent: &Var,
        factor: Option<Expr>,
        nparts: Option<Expr>,
    ) -> Result<(Var, Var)> {
        let pos = self.leaf_pos(parent, "split")?;
        let by = match (&factor, &nparts) {
            (Some(f), None) | (None, Some(f)) => f,
            _ => {
                return err(
                    self,
                    format!(
                        "split of '{}' takes exactly one of factor= and nparts=",
                        parent.name
                    ),
                )
            }
        };
        if by.dtype() != rivet_runtime::DType::I64 {
            return err(
                self,
                format!("split factor must be an int, got {}", by.dtype()),
            );
        }
        if let Some(v) = by.as_int() {
            if v < 1 {
                return err(
                    self,
                    format!("split factor of '{}' must be >= 1, got {v}", parent.name),
                );
            }
        }
        let leaf = self.leaves[pos].clone();
        let outer = Var::new(&format!("{}.outer", parent.name));
        let inner = Var::new(&format!("{}.inner", parent.name));
        self.relations.push(Relation::Split {
            parent: parent.clone(),
            outer: outer.clone(),
            inner: inner.clone(),
            factor,
            nparts,
        });
        let mk = |v: &Var| Leaf {
            var: v.clone(),
            reduce: leaf.reduce,
            kind: ForKind::Serial,
        };
        self.leaves.splice(pos..=pos, [mk(&outer), mk(&inner)]);
        Ok((outer, inner))
    }

    /// Fuses two adjacent loops (`outer` directly outside `inner`) into one.
    pub fn fuse(&mut self, outer: &Var, inner: &Var) -> Result<Var> {
        let (po, pi) = (self.leaf_pos(outer, "fuse")?, self.leaf_pos(inner, "fuse")?);
        if pi != po + 1 {
            return err(self, format!(
                "can only fuse adjacent loops, outer first: '{}' is loop {po} and '{}' is loop {pi}",
                outer.name, inner.name
            ));
        }
        if self.leaves[po].reduce != self.leaves[pi].reduce {
            return err(
                self,
                format!(
                    "cannot fuse a reduction loop with a data-parallel loop ('{}', '{}')",
                    outer.name, inner.name
                ),
            );
        }
        let fused = Var::new(&format!("{}.{}.fused", outer.name, inner.name));
        let reduce = self.leaves[po].reduce;
        self.relations.push(Relation::Fuse {
            outer: outer.clone(),
            inner: inner.clone(),
            fused: fused.clone(),
        });
        self.leaves.splice(
            po..=pi,
            [Leaf {
                var: fused.clone(),
                reduce,
                kind: ForKind::Serial,
            }],
        );
        Ok(fused)
    }

    /// Puts the given loops in this order, in the positions they occupy now.
    pub fn reorder(&mut self, order: &[Var]) -> Result<()> {
        let mut positions = Vec::new();
        for v in order {
            let p = self.leaf_pos(v, "reorder")?;
            if positions.contains(&p) {
                return err(self, format!("reorder lists '{}' twice", v.name));
            }
            positions.push(p);
        }
        let moved: Vec<Leaf> = positions.iter().map(|&p| self.leaves[p].clone()).collect();
        let mut slots = positions.clone();
        slots.sort_unstable();
        for (slot, leaf) in slots.into_iter().zip(moved) {
            self.leaves[slot] = leaf;
        }
        Ok(())
    }

    /// Tiles two loops: returns `(x.outer, y.outer, x.inner, y.inner)` in that loop order.
    pub fn tile(&mut self, x: &Var, y: &Var, xf: Expr, yf: Expr) -> Result<(Var, Var, Var, Var)> {
        let (xo, xi) = self.split(x, Some(xf), None)?;
        let (yo, yi) = self.split(y, Some(yf), None)?;
        self.reorder(&[xo.clone(), yo.clone(), xi.clone(), yi.clone()])?;
        Ok((xo, yo, xi, yi))
    }

    fn annotate(&mut self, v: &Var, kind: ForKind, what: &str) -> Result<()> {
        let p = self.leaf_pos(v, what)?;
        if self.leaves[p].reduce && matches!(kind, ForKind::Vectorized | ForKind::Parallel) {
            return err(self, format!(
                "cannot {what} the reduction loop '{}': its iterations accumulate into the same element",
                v.name
            ));
        }
        self.leaves[p].kind = kind;
        Ok(())
    }

    pub fn unroll(&mut self, v: &Var) -> Result<()> {
        self.annotate(v, ForKind::Unrolled, "unroll")
    }
    pub fn vectorize(&mut self, v: &Var) -> Result<()> {
        self.annotate(v, ForKind::Vectorized, "vectorize")
    }
    pub fn parallel(&mut self, v: &Var) -> Result<()> {
        self.annotate(v, ForKind::Parallel, "parallel")
    }
}

impl Schedule {
    /// One stage per compute reachable from `outputs`.
    pub fn new(outputs: &[Tensor]) -> Result<Schedule> {
        if outputs.is_empty() {
            return Err(Error::Compile(
                "create_schedule needs at least one output tensor".into(),
            ));
        }
        if let Some(p) = outputs.iter().find(|t| t.is_placeholder()) {
            return Err(Error::Compile(format!(
                "create_schedule: '{}' is a placeholder, not a compute",
                p.name()
            )));
        }
        let stages = post_order(outputs)
            .iter()
            .filter(|t| !t.is_placeholder())
            .map(Stage::new)
            .collect();
        Ok(Schedule {
            outputs: outputs.to_vec(),
            stages,
        })
    }

    pub fn stage_index(&self, t: &Tensor) -> Result<usize> {
        self.stages.iter().position(|s| &s.tensor == t).ok_or_else(|| {
            Error::Compile(format!(
                "'{}' has no stage in this schedule (it is a placeholder or not used by the outputs)",
                t.name()
            ))
        })
    }

    /// `s[C]`.
    pub fn stage(&mut self, t: &Tensor) -> Result<&mut Stage> {
        let i = self.stage_index(t)?;
        Ok(&mut self.stages[i])
    }

    /// Substitutes the stage into its consumers.
    pub fn compute_inline(&mut self, t: &Tensor) -> Result<()> {
        let i = self.stage_index(t)?;
        let st = &self.stages[i];
        if !t.reduce_axis().is_empty() {
            return err(
                st,
                "cannot compute_inline a reduction; use compute_at or keep it at root".into(),
            );
        }
        if self.outputs.contains(t) {
            return err(st, "cannot compute_inline an output of the schedule".into());
        }
        if st.leaves.iter().any(|l| l.kind != ForKind::Serial) || !st.relations.is_empty() {
            return err(st, "cannot compute_inline a stage whose loops were scheduled (it has no loops once inlined)".into());
        }
        self.stages[i].attach = Attach::Inline;
        Ok(())
    }

    /// Computes `t` inside loop `var` of `consumer`'s stage.
    pub fn compute_at(&mut self, t: &Tensor, consumer: &Tensor, var: &Var) -> Result<()> {
        let i = self.stage_index(t)?;
        let c = self.stage_index(consumer)?;
        if i == c {
            return err(
                &self.stages[i],
                "cannot compute_at a stage inside itself".into(),
            );
        }
        self.stages[c].leaf_pos(var, "compute_at inside")?;
        if self.outputs.contains(t) {
            return err(
                &self.stages[i],
                "cannot compute_at an output of the schedule".into(),
            );
        }
        self.stages[i].attach = Attach::At {
            consumer: consumer.id(),
            var: var.clone(),
        };
        Ok(())
    }
}
