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
//! GPU memory caches (TVM's `cache_read` / `cache_write`) add stages: `cache_read(A, scope,
//! readers)` a copy of `A` in a `shared` or `local` buffer that the readers read instead;
//! `cache_write(C, "local")` moves C's computation to a local stage and leaves C a copy of it.
//! They rewrite stage *definitions*, never the user's tensors: a stage's `tensor` keeps the id
//! (and so the buffer, the argument identity and the axes) of the tensor it was made for, with
//! the current body; `Schedule::current` and `Schedule::post_order` see a program through the
//! schedule's definitions. Where a cache stage may stand (attached inside a GPU kernel) is
//! checked when the schedule is lowered (`lower::nest`).
//!
//! The extents of the loops that split and fuse make are defined here once (`split_extents`,
//! `fuse_extent`, `loop_extents`): the loops lowering emits and the extents Python reports
//! for `leaf_iter_vars` come from the same functions.

use crate::arith::interval::smin;
use crate::arith::simplify::simplify;
use crate::error::{Error, Result};
use crate::ir::expr::{Expr, Var};
use crate::ir::expr::{ExprKind, IterVar};
use crate::ir::intrin::Intrin;
use crate::ir::stmt::{ForKind, Scope, ThreadTag};
use crate::te::tensor::{inputs, post_order, Op, Tensor, TensorNode};
use std::collections::HashMap;

/// Largest constant split factor kept as the inner loop's extent over a symbolic axis.
pub const SMALL_SPLIT: i64 = 1024;

/// The extents of the `(outer, inner)` loops of a split of a loop of extent `parent`, by
/// `factor` (the inner extent) or `nparts` (the outer extent); `None` when neither is given.
///
/// The other extent is `ceil(parent / k)`, written `(parent - 1) // k + 1`: no intermediate can
/// overflow (`parent + k - 1` could), and it is 0 for an empty parent. The part of fixed size
/// is clamped to the parent (a split by 2**62 of an axis of 5 runs 5 iterations, not 2**62
/// guarded ones), except a constant of at most `SMALL_SPLIT` over a symbolic parent: vectorize
/// and unroll need its constant extent, and at most `SMALL_SPLIT` guarded iterations are
/// wasted per outer one.
pub fn split_extents(
    parent: &Expr,
    factor: Option<&Expr>,
    nparts: Option<&Expr>,
) -> Option<(Expr, Expr)> {
    let ceil = |k: &Expr| parent.sub(&Expr::int(1)).floordiv(k).add(&Expr::int(1));
    let clamp = |k: &Expr| match (k.as_int(), simplify(parent).as_int()) {
        (Some(c), None) if c <= SMALL_SPLIT => k.clone(),
        _ => smin(k, parent),
    };
    let (outer, inner) = match (factor, nparts) {
        (Some(f), _) => (ceil(f), clamp(f)),
        (None, Some(n)) => (clamp(n), ceil(n)),
        (None, None) => return None,
    };
    Some((simplify(&outer), simplify(&inner)))
}

/// The extent of the loop fusing loops of extents `outer` and `inner`: folded when constant,
/// otherwise kept as the product (the bounds proof recognises `f // D` over `[0, E * D)`).
pub fn fuse_extent(outer: &Expr, inner: &Expr) -> Expr {
    let e = outer.mul(inner);
    let folded = simplify(&e);
    if folded.as_int().is_some() {
        folded
    } else {
        e
    }
}

/// The extent of every loop of a stage: `roots` gives the root axes' extents (the whole axes,
/// or the region a `compute_at` computes), and the `relations` add the loops they make, in
/// order. A relation whose source loops have no extent is skipped.
pub fn loop_extents(relations: &[Relation], mut roots: HashMap<Var, Expr>) -> HashMap<Var, Expr> {
    for rel in relations {
        match rel {
            Relation::Split {
                parent,
                outer,
                inner,
                factor,
                nparts,
            } => {
                let Some(pe) = roots.get(parent) else {
                    continue;
                };
                if let Some((oe, ie)) = split_extents(pe, factor.as_ref(), nparts.as_ref()) {
                    roots.insert(outer.clone(), oe);
                    roots.insert(inner.clone(), ie);
                }
            }
            Relation::Fuse {
                outer,
                inner,
                fused,
            } => {
                if let (Some(o), Some(i)) = (roots.get(outer), roots.get(inner)) {
                    let f = fuse_extent(o, i);
                    roots.insert(fused.clone(), f);
                }
            }
        }
    }
    roots
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::te;
    use rivet_runtime::DType;

    /// `var -> extent` of every loop `build_nest` emits, read from its printed form.
    fn nest_extents(sched: &Schedule, args: &[Tensor]) -> HashMap<String, String> {
        let f = crate::lower::nest::build_nest(sched, args, "f").unwrap();
        let mut out = HashMap::new();
        for line in f.to_string().lines() {
            let Some(rest) = line.trim_start().split_once("for ").map(|(_, r)| r) else {
                continue;
            };
            let Some((var, dom)) = rest.split_once(" in [0, ") else {
                continue;
            };
            let ext = dom.strip_suffix("):").expect("a loop header");
            let prev = out.insert(var.to_string(), ext.to_string());
            assert!(prev.is_none_or(|p| p == ext), "loop {var} twice:\n{f}");
        }
        out
    }

    /// xorshift64*: reproducible draws without a dependency.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
        }
    }

    /// Random splits (by factor or nparts, constant or symbolic, dividing or not, larger than
    /// the axis) and fuses of a matmul stage: the extents the schedule reports are the extents
    /// of the loops lowering emits.
    #[test]
    fn reported_extents_are_the_lowered_loop_extents() {
        let n = te::var("n");
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let symbolic = seed % 3 == 0;
            let dim = |c: i64| if symbolic { n.clone() } else { Expr::int(c) };
            let (m, k, p) = (dim(20), dim(13), dim(18));
            let a = te::placeholder([&m, &k], DType::F32, "A").unwrap();
            let b = te::placeholder([&k, &p], DType::F32, "B").unwrap();
            let r = te::reduce_axis(0, k, "k").unwrap();
            let c = te::compute(
                [m, p],
                |[i, j]| te::sum(a.at((i, &r)) * b.at((&r, j)), &r),
                "C",
            )
            .unwrap();
            let mut sched = Schedule::new(std::slice::from_ref(&c)).unwrap();
            let st = sched.stage(&c).unwrap();
            let factors = [1, 2, 3, 4, 5, 7, 16, 40, 2000];
            for _ in 0..1 + rng.below(4) {
                let leaves = st.leaves.len();
                if rng.below(3) == 0 && leaves > 1 {
                    let at = rng.below(leaves - 1);
                    let (o, i) = (st.leaves[at].var.clone(), st.leaves[at + 1].var.clone());
                    if st.leaves[at].reduce == st.leaves[at + 1].reduce {
                        st.fuse(&o, &i).unwrap();
                    }
                } else {
                    let v = st.leaves[rng.below(leaves)].var.clone();
                    // A symbolic factor only where an argument binds `n` (else a
                    // CompileError: the dim cannot be bound).
                    let by = if symbolic && rng.below(5) == 0 {
                        n.clone()
                    } else {
                        Expr::int(factors[rng.below(factors.len())])
                    };
                    if rng.below(2) == 0 {
                        st.split(&v, Some(by), None).unwrap();
                    } else {
                        st.split(&v, None, Some(by)).unwrap();
                    }
                }
            }
            let reported = st.extents();
            let leaves: Vec<Var> = st.leaves.iter().map(|l| l.var.clone()).collect();
            let lowered = nest_extents(&sched, &[a.clone(), b.clone(), c.clone()]);
            for v in &leaves {
                assert_eq!(
                    Some(&reported[v].to_string()),
                    lowered.get(&v.name.to_string()),
                    "seed {seed}: loop {}",
                    v.name
                );
            }
        }
    }

    #[test]
    fn split_and_fuse_extents() {
        let e = |v: i64| Expr::int(v);
        let s = |p: i64, f: Option<i64>, n: Option<i64>| {
            let (o, i) = split_extents(&e(p), f.map(e).as_ref(), n.map(e).as_ref()).unwrap();
            (o.as_int().unwrap(), i.as_int().unwrap())
        };
        assert_eq!(s(20, Some(7), None), (3, 7));
        assert_eq!(s(20, None, Some(4)), (4, 5));
        assert_eq!(s(5, Some(8), None), (1, 5)); // clamped to the axis
        assert_eq!(s(0, Some(4), None), (0, 0));
        assert!(split_extents(&e(4), None, None).is_none());
        // A small constant over a symbolic axis keeps its value (vectorize / unroll need it).
        let n = crate::te::var("n");
        let (_, i) = split_extents(&n, Some(&e(4)), None).unwrap();
        assert_eq!(i.as_int(), Some(4));
        assert_eq!(fuse_extent(&e(20), &e(18)).as_int(), Some(360));
        assert_eq!(fuse_extent(&n, &e(3)).to_string(), "(n * 3)");
    }
}
