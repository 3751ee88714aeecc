//! Stages bound to a GPU: where a loop stands relative to a kernel (`Place`), the rules of
//! bound stages (`Ctx::gpu_stage`), and cross-thread reductions.
//!
//! A stage whose reduction loop is bound to `threadIdx.x` (a cross-thread reduction) has no
//! init nest: inside its bound loops and its serial data-parallel loops, each thread
//! allocates a one-element `local` accumulator (`<stage>.acc`), starts it at the identity,
//! accumulates its share over the serial reduction loops (every split guard on the update),
//! then `AllReduce` combines the group's partials into it and the thread of
//! `threadIdx.x == 0` stores the element (under the data-parallel guards only: every thread
//! reaches the `AllReduce`, which is collective).

use super::{cerr, identity, Ctx};
use crate::arith::interval::Env;
use crate::arith::simplify::simplify;
use crate::error::Result;
use crate::ir::expr::{BufId, Expr, ReduceOp, Var};
use crate::ir::stmt::{ForKind, Scope, Stmt, ThreadTag};
use crate::schedule::{Attach, Stage};
use rivet_runtime::DType;
use std::collections::HashMap;

/// Where a stage's loop stands, for the stages attached to it.
#[derive(Clone)]
pub(super) enum Place {
    /// Host code (no GPU stage around).
    Host,
    /// Between the block loops of a GPU stage (above its block body): nothing may be attached.
    Grid { loop_name: String },
    /// Inside a kernel's block body.
    Kernel(Kc),
}

/// What a stage attached inside a kernel needs to know about it.
#[derive(Clone)]
pub(super) struct Kc {
    /// Name of the GPU stage whose kernel this is.
    pub(super) root: String,
    /// Extent of each thread dimension of the block.
    pub(super) block: Vec<(ThreadTag, i64)>,
    /// Thread loops enclosing the point of attachment, per tag.
    pub(super) enclosing: Vec<(ThreadTag, Var)>,
    /// Ranges of the loops enclosing the point of attachment.
    pub(super) ranges: Env,
}

impl Kc {
    pub(super) fn dim(&self, tag: ThreadTag) -> Option<i64> {
        self.block.iter().find(|(t, _)| *t == tag).map(|(_, n)| *n)
    }
    pub(super) fn thread_var(&self, tag: ThreadTag) -> Option<&Var> {
        self.enclosing
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, v)| v)
    }
}

impl Ctx<'_> {
    /// Where the stages attached at loop `pos` of `stage` stand.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn place_inside(
        &self,
        stage: &Stage,
        pos: usize,
        gpu: bool,
        last_block: Option<usize>,
        ext: &HashMap<Var, Expr>,
        outer: &Env,
        place: &Place,
    ) -> Place {
        let threads_to = |kc: &mut Kc| {
            for l in &stage.leaves[..=pos] {
                if let ForKind::Thread(tag) = l.kind {
                    if !tag.is_block() && kc.thread_var(tag).is_none() {
                        kc.enclosing.push((tag, l.var.clone()));
                    }
                }
            }
            for (v, iv) in &outer.vars {
                kc.ranges.vars.insert(v.clone(), iv.clone());
            }
        };
        match place {
            Place::Kernel(kc) => {
                let mut kc = kc.clone();
                threads_to(&mut kc);
                Place::Kernel(kc)
            }
            Place::Grid { .. } => place.clone(),
            Place::Host if gpu => {
                if last_block.is_some_and(|b| pos < b) {
                    return Place::Grid {
                        loop_name: stage.leaves[pos].var.name.to_string(),
                    };
                }
                let block = stage
                    .leaves
                    .iter()
                    .filter_map(|l| match l.kind {
                        ForKind::Thread(t) if !t.is_block() => {
                            simplify(&ext[&l.var]).as_int().map(|n| (t, n))
                        }
                        _ => None,
                    })
                    .collect();
                let mut kc = Kc {
                    root: stage.tensor.name().to_string(),
                    block,
                    enclosing: Vec::new(),
                    ranges: Env::default(),
                };
                threads_to(&mut kc);
                Place::Kernel(kc)
            }
            Place::Host => Place::Host,
        }
    }

    /// Whether `stage` is the root of a kernel (bound to a GPU at root), after checking the
    /// rules of bound stages: bound loops outermost (blocks, then threads), thread extents
    /// constant with at most 1024 threads per block, no parallel loop, computed at root. A
    /// cache stage inside a kernel (`kc`) is not a root: it may not be parallel, bind blocks,
    /// or (local) bind threads; `emit` checks its thread loops against the block. A cache
    /// outside every kernel is refused (shared and local memory exist only in kernels).
    /// Also the variable of its reduction loop bound to `threadIdx.x`, if it has one (a
    /// cross-thread reduction), which needs its serial data-parallel loops outside its serial
    /// reduction loops (one accumulator per thread), and a power-of-two `threadIdx.x` extent
    /// when the block has `threadIdx.y` / `z` threads (`ir::verify::gpu`).
    pub(super) fn gpu_stage(
        &self,
        stage: &Stage,
        ext: &HashMap<Var, Expr>,
        kc: Option<&Kc>,
    ) -> Result<(bool, Option<Var>)> {
        let name = stage.tensor.name();
        let scope_name = if stage.scope == Scope::Shared {
            "shared"
        } else {
            "local"
        };
        if kc.is_some() {
            // A cache stage inside a kernel (`attached_at` refused every other stage): its
            // thread loops are checked against the block by `emit`.
            if let Some(l) = stage.leaves.iter().find(|l| {
                l.kind == ForKind::Parallel
                    || matches!(l.kind, ForKind::Thread(t) if t.is_block() || stage.scope == Scope::Local)
            }) {
                let why = match l.kind {
                    ForKind::Parallel => "parallel loops do not exist inside a kernel".to_string(),
                    ForKind::Thread(t) if t.is_block() => format!("it is inside a kernel, whose blocks are already bound ({} cannot be bound again)", t.name()),
                    _ => "a local buffer is private to each thread, so its loops are the thread's own (bind the loops of shared caches)".to_string(),
                };
                return cerr(format!(
                    "schedule of '{name}': loop '{}' cannot be {}: {why}",
                    l.var.name,
                    if l.kind == ForKind::Parallel { "parallel".to_string() } else { format!("bound to {}", match l.kind { ForKind::Thread(t) => t.name(), _ => "" }) }
                ));
            }
            return Ok((false, None));
        }
        if stage.scope != Scope::Global {
            return cerr(format!(
                "schedule of '{name}': a {scope_name} cache stage must be compute_at inside a loop of a stage bound to a GPU, at or below its block loops ({scope_name} memory exists only inside a kernel); {}",
                match &stage.attach {
                    Attach::Root => "it is computed at root".to_string(),
                    Attach::At { consumer, var } => format!("it is computed at loop '{}' of '{}', which is not inside a kernel", var.name, self.stage_of(*consumer).tensor.name()),
                    Attach::Inline => "it is inlined".to_string(),
                }
            ));
        }
        let bound: Vec<(usize, ThreadTag)> = stage
            .leaves
            .iter()
            .enumerate()
            .filter_map(|(p, l)| match l.kind {
                ForKind::Thread(t) => Some((p, t)),
                _ => None,
            })
            .collect();
        if bound.is_empty() {
            return Ok((false, None));
        }
        let fail = |msg: String| cerr(format!("schedule of '{name}': {msg}"));
        for (k, (p, t)) in bound.iter().enumerate() {
            if *p != k {
                return fail(format!(
                    "loop '{}' is bound to {} but loop '{}' outside it is not: bound loops must be the outermost (reorder them first), blocks before threads",
                    stage.leaves[*p].var.name,
                    t.name(),
                    stage.leaves[k].var.name
                ));
            }
            if k > 0 && t.is_block() && !bound[k - 1].1.is_block() {
                return fail(format!(
                    "loop '{}' is bound to {} inside a loop bound to {}: block loops come before thread loops",
                    stage.leaves[*p].var.name,
                    t.name(),
                    bound[k - 1].1.name()
                ));
            }
        }
        let mut threads: i64 = 1;
        let mut dims = [1i64; 3];
        for (p, t) in &bound {
            let v = &stage.leaves[*p].var;
            let e = simplify(&ext[v]);
            if t.is_block() {
                continue;
            }
            // CUDA's block dimensions: 1024 threads in x and y, 64 in z (blockDim.z).
            let most: i64 = if t.axis() == 2 { 64 } else { 1024 };
            match e.as_int() {
                Some(n) if (1..=most).contains(&n) => {
                    threads = threads.saturating_mul(n);
                    dims[t.axis()] = n;
                }
                Some(n) => {
                    return fail(format!(
                        "loop '{}' bound to {} has {n} iterations; that thread dimension has 1 to {most} (split it by a constant factor first)",
                        v.name,
                        t.name()
                    ))
                }
                None => {
                    return fail(format!(
                        "loop '{}' bound to {} has extent {e}, which is not a constant; split it by a constant factor and bind the inner loop",
                        v.name,
                        t.name()
                    ))
                }
            }
        }
        if threads > 1024 {
            return fail(format!(
                "its thread loops make blocks of {threads} threads; a block has at most 1024"
            ));
        }
        if let Some(l) = stage.leaves.iter().find(|l| l.kind == ForKind::Parallel) {
            return fail(format!(
                "loop '{}' is parallel in a stage bound to a GPU (its threads are the parallelism); bind it or leave it serial",
                l.var.name
            ));
        }
        if stage.attach != Attach::Root {
            return fail(
                "a stage bound to a GPU is computed at root, or is a shared cache stage (cache_read) attached inside a kernel; compute_at of it into a loop outside any kernel is not supported".into(),
            );
        }
        let cross = stage
            .leaves
            .iter()
            .find(|l| l.reduce && matches!(l.kind, ForKind::Thread(_)));
        let Some(cross) = cross else {
            return Ok((true, None));
        };
        if dims[1] * dims[2] > 1 && dims[0].count_ones() != 1 {
            return fail(format!(
                "the reduction loop '{}' bound to threadIdx.x has {} threads, and the block has {} threadIdx.y/z threads: a cross-thread reduction in a block with several rows of threads needs a power-of-two threadIdx.x extent (split by 32, 64, 128, ...)",
                cross.var.name,
                dims[0],
                dims[1] * dims[2]
            ));
        }
        let serial = |l: &&crate::schedule::Leaf| !matches!(l.kind, ForKind::Thread(_));
        if let Some(r) = stage.leaves.iter().filter(serial).position(|l| l.reduce) {
            if let Some(d) = stage
                .leaves
                .iter()
                .filter(serial)
                .skip(r)
                .find(|l| !l.reduce)
            {
                return fail(format!(
                    "the data-parallel loop '{}' is inside a serial reduction loop of a stage whose reduction loop '{}' is bound to threadIdx.x: each thread keeps one partial result, so reorder its serial data-parallel loops outside its serial reduction loops",
                    d.var.name, cross.var.name
                ));
            }
        }
        Ok((true, Some(cross.var.clone())))
    }
}

/// How a stage's cross-thread reduction is lowered.
pub(super) struct Cross {
    /// The variable of the reduction loop bound to `threadIdx.x`.
    pub(super) tx: Var,
    pub(super) op: ReduceOp,
    /// The per-thread accumulator (a one-element `local`).
    pub(super) acc: BufId,
    /// Position of the first serial reduction loop among the stage's leaves (the number of
    /// leaves when there is none): the accumulator lives just outside it.
    pub(super) first: usize,
    /// The guards of the data-parallel loops' splits (those of the final store).
    pub(super) guards: Vec<Expr>,
}

/// The statements around the serial reduction loops `update` of a cross-thread reduction:
/// allocate the accumulator, start it at the identity, run `update`, combine across the
/// threads of `threadIdx.x`, and store the element `out[idx]` from the thread `tx == 0`
/// where the data-parallel guards hold.
pub(super) fn cross_thread(
    update: Stmt,
    c: &Cross,
    dtype: DType,
    (out, idx): (BufId, &[Expr]),
) -> Stmt {
    let (op, acc) = (c.op, c.acc);
    let zero = || vec![Expr::int(0)];
    let first = Expr::cmp(crate::ir::CmpOp::Eq, Expr::var(&c.tx), Expr::int(0)).expect("int64");
    let cond = c.guards.iter().cloned().fold(first, |a, b| {
        Expr::logic(crate::ir::LogicOp::And, a, b).expect("bools")
    });
    Stmt::Allocate {
        bufs: vec![acc],
        body: Box::new(Stmt::Seq(vec![
            Stmt::Store {
                buf: acc,
                indices: zero(),
                value: identity(op, dtype),
            },
            update,
            Stmt::AllReduce {
                op,
                tag: ThreadTag::ThreadX,
                value: Expr::load(acc, zero(), dtype),
                dst: acc,
            },
            Stmt::If {
                cond,
                then: Box::new(Stmt::Store {
                    buf: out,
                    indices: idx.to_vec(),
                    value: Expr::load(acc, zero(), dtype),
                }),
                otherwise: None,
            },
        ])),
    }
}
