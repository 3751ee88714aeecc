//! Schedules, TVM-shaped: `Schedule::new(outputs)` makes one `Stage` per compute; a stage's
//! loops start as its data-parallel axes then its reduction axes, and the primitives reshape
//! them: `split`, `fuse`, `reorder`, `tile`, and annotate them: `unroll`, `vectorize`,
//! `parallel`; `compute_inline` and `compute_at` place a stage relative to its consumers.
//!
//! A schedule never changes what a program computes. Every primitive checks its own
//! preconditions and explains a refusal (`CompileError`); placement-dependent rules
//! (vectorised loop innermost with a constant extent, `compute_at` target being the only
//! consumer) are checked when the schedule is lowered.
//!
//! The folder, by concept:
//! - here: the `Schedule` and `Stage` types and the loop primitives;
//! - `loops`: how split and fuse derive loops (`Relation`) and their extents, defined once;
//! - `definitions`: the schedule's view of its program through rewritten stage definitions
//!   (`current`, `post_order`) and the primitives that rewrite them (`cache_read`,
//!   `cache_write`);
//! - `cpu_default`, `gpu_default`: the default schedules `build` applies to a schedule the
//!   user left unscheduled (they use only the primitives, like any user schedule).

pub mod cpu_default;
pub mod definitions;
pub mod gpu_default;
pub mod loops;

use crate::error::{Error, Result};
use crate::ir::expr::{Expr, Var};
use crate::ir::intrin::Intrin;
use crate::ir::stmt::{ForKind, Scope, ThreadTag};
use crate::schedule::loops::{loop_extents, Relation};
use crate::te::tensor::{inputs, post_order, Tensor};
use std::collections::HashMap;

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
    /// Where its buffer lives: `Global` for every stage but the caches (`cache_read` /
    /// `cache_write`), whose compact buffers hold only the region they are attached for.
    pub scope: Scope,
    /// Loops whose nest (the loop and everything inside it) becomes an intrinsic call
    /// (`tensorize`; matched and replaced by `lower::tensorize`).
    pub tensorize: Vec<(Var, Intrin)>,
    /// Debug taps (`debug_tap`): callbacks handed the stage's buffer, read-only, right after
    /// the stage is computed, in the order they were added. Not a scheduling decision: the
    /// default CPU schedule still applies to a schedule whose only changes are taps.
    pub taps: Vec<crate::ir::callback::Callback>,
}

/// How the stages of a program are computed: a loop nest per stage, transformed by the
/// stage's primitives (`split`, `tile`, `reorder`, `fuse`, `parallel`, `vectorize`, `unroll`,
/// `bind`, ...) and by moving stages (`compute_inline`, `compute_at`, `cache_read`). A
/// schedule never changes what is computed: every primitive keeps the program's values.
///
/// ```
/// use rivet_compiler::{build, te, Schedule};
/// use rivet_runtime::{DType, Tensor};
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let (n, m) = (te::var("n"), te::var("m"));
/// let a = te::placeholder([&n, &m], DType::F32, "A")?;
/// let b = te::compute([&n, &m], |[i, j]| a.at([i, j]) * 2.0, "B")?;
/// let mut s = Schedule::new(&[&b])?;
/// let [i, j] = [b.axis()[0].var.clone(), b.axis()[1].var.clone()];
/// let st = s.stage(&b)?;
/// let (_io, _jo, ii, ji) = st.tile(&i, &j, 4, 8)?;
/// st.vectorize(&ji)?;
/// st.unroll(&ii)?;
/// let f = build(&s, &[&a, &b], "cpu", "double")?.get_function("double")?;
/// // Extents that do not divide the tiles are guarded.
/// let x = Tensor::from_slice(&(0..30).map(|v| v as f32).collect::<Vec<_>>(), &[5, 6])?;
/// let y = Tensor::zeros(&[5, 6], DType::F32)?;
/// f.call(&[x.into(), y.clone().into()])?;
/// assert_eq!(y.to_vec::<f32>()?[29], 58.0);
/// # Ok(())
/// # }
/// ```
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
    /// The extent of every loop variable of this stage (root axes, split and fused loops) when
    /// it computes its whole tensor (at root).
    pub fn extents(&self) -> HashMap<Var, Expr> {
        let t = &self.tensor;
        let roots = t
            .axis()
            .iter()
            .chain(t.reduce_axis())
            .map(|a| (a.var.clone(), a.extent.clone()))
            .collect();
        loop_extents(&self.relations, roots)
    }

    pub(crate) fn new(t: &Tensor) -> Stage {
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
            scope: Scope::Global,
            tensorize: Vec::new(),
            taps: Vec::new(),
        }
    }

    /// Whether the user left this stage as created: at root, no split/fuse/reorder, every loop
    /// serial, no intrinsic. The default schedules apply only to such stages.
    pub fn unscheduled(&self) -> bool {
        let created = self
            .tensor
            .axis()
            .iter()
            .chain(self.tensor.reduce_axis())
            .map(|a| &a.var);
        self.attach == Attach::Root
            && self.relations.is_empty()
            && self.tensorize.is_empty()
            && self.scope == Scope::Global
            && self.leaves.iter().map(|l| &l.var).eq(created)
            && self.leaves.iter().all(|l| l.kind == ForKind::Serial)
    }

    /// A debug tap (like `jax.debug.callback`): `func(view)` runs on the host with a
    /// read-only copy of this stage's values once they are computed, on every call, without
    /// changing any result. The stage must stay materialised at root: inlining it or computing
    /// it inside another stage's loop is then a `CompileError` (a tap runs exactly once per
    /// call, at the top level of the program).
    pub fn debug_tap(&mut self, func: crate::te::CallbackFn) -> Result<()> {
        if self.attach != Attach::Root {
            return err(self, "cannot debug_tap a stage that is compute_inline'd or compute_at another stage: a tap needs the whole stage materialised at the top level".into());
        }
        if self.scope != Scope::Global {
            return err(
                self,
                "cannot debug_tap a cache stage (it holds only a region inside a GPU kernel)"
                    .into(),
            );
        }
        let (func, registered) = match func {
            crate::te::CallbackFn::Function(f) => (f, None),
            crate::te::CallbackFn::Registered(n) => {
                let f = rivet_runtime::registry::get(&n).map_err(|e| {
                    Error::Compile(format!("debug_tap of '{}': {e}", self.tensor.name()))
                })?;
                (f, Some(n))
            }
        };
        self.taps.push(crate::ir::callback::Callback {
            kind: crate::ir::callback::CallbackKind::Tap,
            stage: self.tensor.name().to_string(),
            registered,
            func: Some(func),
        });
        Ok(())
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

    /// `split(parent, Some(factor), None)`: the inner loop of extent `factor`, an int
    /// expression or an integer (`split_by(&i, 8)`).
    pub fn split_by(&mut self, parent: &Var, factor: impl Into<Expr>) -> Result<(Var, Var)> {
        self.split(parent, Some(factor.into()), None)
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
    /// The factors are int expressions or integers (`tile(&i, &j, 4, 8)`).
    pub fn tile(
        &mut self,
        x: &Var,
        y: &Var,
        xf: impl Into<Expr>,
        yf: impl Into<Expr>,
    ) -> Result<(Var, Var, Var, Var)> {
        let (xo, xi) = self.split(x, Some(xf.into()), None)?;
        let (yo, yi) = self.split(y, Some(yf.into()), None)?;
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

    /// TVM's `tensorize`: the nest under loop `v` (the loop and the loops inside it) is
    /// replaced by a call of `intrin` when lowering finds that it computes exactly the
    /// intrinsic's declared computation (`ir::intrin`, `lower::tensorize`); a nest that does
    /// not (another expression, dtype, a guard, an extra loop or statement) is a
    /// `CompileError` naming the difference, never a silent fallback. The intrinsic fuses
    /// each multiply-add (docs/cpu.md).
    pub fn tensorize(&mut self, v: &Var, intrin: Intrin) -> Result<()> {
        let p = self.leaf_pos(v, "tensorize")?;
        if !matches!(
            self.leaves[p].kind,
            ForKind::Serial | ForKind::Unrolled | ForKind::Vectorized
        ) {
            return err(self, format!(
                "cannot tensorize '{}': it is {:?} (an intrinsic call runs on the thread that reaches it; annotate an outer loop instead)",
                v.name, self.leaves[p].kind
            ));
        }
        if self.tensorize.iter().any(|(w, _)| w == v) {
            return err(self, format!("'{}' is tensorized twice", v.name));
        }
        self.tensorize.push((v.clone(), intrin));
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

    /// Binds loop `v` to a GPU launch dimension (TVM's `bind`): its iterations become the
    /// blocks or threads of a kernel. A reduction loop bound to `threadIdx.x` makes a
    /// cross-thread reduction (TVM's allreduce): each thread accumulates a partial result over
    /// the stage's serial reduction loops, then the block's threads combine them
    /// (`Stmt::AllReduce`) and one thread writes the element. Refused here: a launch
    /// dimension bound twice in one stage, a reduction loop bound to a block index (blocks
    /// cannot combine their partial results) or to `threadIdx.y` / `z`. Where bound loops may
    /// stand in the nest (outermost, blocks before threads), their extents (constant threads,
    /// at most 1024 per block) and what a GPU stage may hold are checked when the stage is
    /// lowered.
    pub fn bind(&mut self, v: &Var, tag: ThreadTag) -> Result<()> {
        let p = self.leaf_pos(v, "bind")?;
        if let Some(other) = self
            .leaves
            .iter()
            .find(|l| l.var != *v && l.kind == ForKind::Thread(tag))
        {
            return err(self, format!(
                "cannot bind '{}' to {}: loop '{}' is already bound to it (each launch dimension is bound once per stage)",
                v.name,
                tag.name(),
                other.var.name
            ));
        }
        if self.leaves[p].reduce && tag.is_block() {
            return err(self, format!(
                "cannot bind the reduction loop '{}' to {}: its iterations accumulate into the same element and blocks cannot combine their partial results (no synchronisation between the blocks of a launch); a cross-thread reduction runs within a block: split it and bind the inner loop to threadIdx.x, and bind the data-parallel loops to blocks",
                v.name,
                tag.name()
            ));
        }
        if self.leaves[p].reduce && tag != ThreadTag::ThreadX {
            return err(self, format!(
                "cannot bind the reduction loop '{}' to {}: a cross-thread reduction runs over threadIdx.x (a warp is made of consecutive threadIdx.x); bind it to threadIdx.x",
                v.name,
                tag.name()
            ));
        }
        self.leaves[p].kind = ForKind::Thread(tag);
        Ok(())
    }
}

impl Schedule {
    /// One stage per compute reachable from `outputs` (tensors or references to them:
    /// `Schedule::new(&[&c])`).
    pub fn new<T: std::borrow::Borrow<Tensor>>(outputs: &[T]) -> Result<Schedule> {
        let outputs: Vec<Tensor> = outputs.iter().map(|t| t.borrow().clone()).collect();
        let outputs = &outputs[..];
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
        if st.tensor.is_extern() {
            return err(st, "cannot compute_inline an extern stage: a host callback computes it as a whole buffer".into());
        }
        if !st.taps.is_empty() {
            return err(
                st,
                "cannot compute_inline a stage with a debug_tap: the tap needs its buffer".into(),
            );
        }
        if self
            .stages
            .iter()
            .any(|c| c.tensor.is_extern() && inputs(&c.tensor).contains(t))
        {
            return err(st, "cannot compute_inline a stage an extern stage reads: its callback receives the whole materialised tensor".into());
        }
        if !st.tensor.reduce_axis().is_empty() {
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
        if self.stages[i].tensor.is_extern() || !self.stages[i].taps.is_empty() {
            return err(
                &self.stages[i],
                "cannot compute_at a stage with a host callback (an extern stage or a debug_tap): callbacks run once per call at the top level, never inside a loop".into(),
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
