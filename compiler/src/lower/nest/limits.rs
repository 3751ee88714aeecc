//! Limits checked before a nest is built: expression sizes once inlined stages are
//! substituted (`check_sizes`), and the depth of `compute_at` chains (`check_attach_depth`).
//! Both run in time linear in the program, so that a program past the limits of `ir::limits`
//! is refused before any pass walks its (possibly exponential) tree form.

use super::cerr;
use crate::error::Result;
use crate::ir::expr::{Expr, ExprKind};
use crate::ir::limits::{MAX_NEST_DEPTH, MAX_STMT_DEPTH};
use crate::schedule::{Attach, Schedule};
use crate::te::tensor::Tensor;
use std::collections::{HashMap, HashSet};

/// Refuses, before any pass walks them, programs whose lowered expressions would exceed the
/// limits of `ir::limits`: inlining substitutes a stage's body at each read, so a chain of
/// stages that each read the previous one twice doubles at every step. Sizes are counted as
/// trees (upper bounds) but computed once per shared node and once per stage, saturating:
/// linear time.
pub(super) fn check_sizes(all: &[Tensor], inlined: &HashSet<u32>) -> Result<()> {
    use crate::ir::limits::{MAX_FUNC_NODES, MAX_IR_DEPTH};
    let mut stage: HashMap<u32, Size> = HashMap::new();
    for t in all {
        let Some(body) = t.body() else { continue };
        if body.depth() > MAX_IR_DEPTH {
            return cerr(format!(
                "stage '{}' has an expression nested {} deep; rivet accepts at most {MAX_IR_DEPTH} (limit MAX_IR_DEPTH)",
                t.name(),
                body.depth()
            ));
        }
        let mut memo: HashMap<usize, Size> = HashMap::new();
        let got = expanded(body, inlined, &stage, &mut memo);
        if got.nodes > MAX_FUNC_NODES as u64 || got.depth > MAX_IR_DEPTH as u64 {
            return cerr(format!(
                "stage '{}' expands to up to {} expression nodes nested up to {} deep once the stages it inlines are substituted; rivet accepts at most {MAX_FUNC_NODES} nodes (MAX_FUNC_NODES) and depth {MAX_IR_DEPTH} (MAX_IR_DEPTH): compute some of those stages into buffers instead of inlining them",
                t.name(),
                got.nodes,
                got.depth
            ));
        }
        stage.insert(t.id(), got);
    }
    // Shapes and axis ranges are rewritten (simplified, substituted) as trees, into every
    // bound of the nest: one over MAX_SHAPE_NODES as a tree is refused here, counted with a
    // bounded walk (a shared DAG of 2^40 tree nodes costs MAX_SHAPE_NODES steps, not 2^40).
    use crate::ir::limits::MAX_SHAPE_NODES;
    let limit = MAX_SHAPE_NODES + 1;
    for t in all {
        let dims = t.shape().iter().map(|d| (d, "its shape"));
        let ranges = t
            .axis()
            .iter()
            .chain(t.reduce_axis())
            .flat_map(|a| [(&a.min, "an axis range"), (&a.extent, "an axis range")]);
        for (e, what) in dims.chain(ranges) {
            if e.depth() > MAX_IR_DEPTH || e.tree_size_upto(limit) >= limit {
                return cerr(format!(
                    "'{}': {what} has an expression of more than {MAX_SHAPE_NODES} nodes or nested over {MAX_IR_DEPTH} deep once shared terms are counted each time they occur; rivet accepts at most {MAX_SHAPE_NODES} (MAX_SHAPE_NODES) and depth {MAX_IR_DEPTH} (MAX_IR_DEPTH) in a shape or axis range",
                    t.name()
                ));
            }
        }
    }
    Ok(())
}

/// Upper bounds on an expression once inlined reads are substituted: tree nodes, variable
/// leaves (what substitution replaces), depth.
#[derive(Clone, Copy, Debug)]
struct Size {
    nodes: u64,
    vars: u64,
    depth: u64,
}

fn expanded(
    e: &Expr,
    inlined: &HashSet<u32>,
    stage: &HashMap<u32, Size>,
    memo: &mut HashMap<usize, Size>,
) -> Size {
    let key = std::sync::Arc::as_ptr(&e.0) as usize;
    if let Some(v) = memo.get(&key) {
        return *v;
    }
    let mut kids: Vec<Size> = Vec::new();
    e.for_each_child(&mut |c| kids.push(expanded(c, inlined, stage, memo)));
    let sum = |f: fn(&Size) -> u64| kids.iter().fold(0u64, |a, k| a.saturating_add(f(k)));
    let max = |f: fn(&Size) -> u64| kids.iter().map(f).max().unwrap_or(0);
    let r = match e.kind() {
        ExprKind::Read { tensor, .. } if inlined.contains(&tensor.id()) => {
            // The stage's body replaces the read, each of its variable leaves replaced by an
            // index expression (at most the largest one).
            let u = stage.get(&tensor.id()).copied().unwrap_or(Size {
                nodes: 1,
                vars: 1,
                depth: 1,
            });
            let (ni, vi, di) = (max(|k| k.nodes), max(|k| k.vars), max(|k| k.depth));
            Size {
                nodes: u
                    .nodes
                    .saturating_add(u.vars.saturating_mul(ni.saturating_sub(1))),
                vars: u.vars.saturating_mul(vi.max(1)),
                depth: u.depth.saturating_add(di),
            }
        }
        ExprKind::Var(_) => Size {
            nodes: 1,
            vars: 1,
            depth: 1,
        },
        _ => Size {
            nodes: sum(|k| k.nodes).saturating_add(1),
            vars: sum(|k| k.vars),
            depth: max(|k| k.depth).saturating_add(1),
        },
    };
    memo.insert(key, r);
    r
}

/// Refuses, before any loop is built, a schedule whose `compute_at` chains alone nest past
/// `MAX_NEST_DEPTH`: each stage computed at a loop of another sits in a sequence inside that
/// loop, one level deeper than its consumer at least, so a chain of `k` such stages nests at
/// least `k + 1` deep. (Building such a nest first costs time that grows steeply with the
/// chain: bound inference composes the regions of every level.) The exact depth is checked
/// again on the built nest.
pub(super) fn check_attach_depth(sched: &Schedule, name: &str) -> Result<()> {
    let index: HashMap<u32, usize> = sched
        .stages
        .iter()
        .enumerate()
        .map(|(k, s)| (s.tensor.id(), k))
        .collect();
    // Levels by stage, memoised; a walk up the chain stops at a stage already known, at the
    // root, or (a cycle, which nest building reports itself) after as many steps as stages.
    let mut level: Vec<Option<u32>> = vec![None; sched.stages.len()];
    for start in 0..sched.stages.len() {
        let mut path = Vec::new();
        let mut cur = start;
        let base = loop {
            if let Some(l) = level[cur] {
                break l;
            }
            if path.len() > sched.stages.len() {
                return Ok(());
            }
            path.push(cur);
            match &sched.stages[cur].attach {
                Attach::At { consumer, .. } => match index.get(consumer) {
                    Some(&c) => cur = c,
                    None => break 0,
                },
                Attach::Root | Attach::Inline => break 0,
            }
        };
        // `path` runs from `start` up to the last stage before `base`'s; the last one is a
        // root (level 0) unless the walk stopped at a known level.
        let mut l = base;
        let root_end = level[cur].is_none();
        for (k, &s) in path.iter().rev().enumerate() {
            if !(k == 0 && root_end) {
                l += 1;
            }
            level[s] = Some(l);
        }
    }
    let deepest = level.iter().flatten().max().copied().unwrap_or(0) + 1;
    if deepest > MAX_NEST_DEPTH {
        return cerr(format!(
            "build '{name}': the program's statements nest at least {deepest} deep (a chain of {} stages each computed at a loop of the next: each compute_at nests a stage inside its consumer's loop); rivet accepts at most {MAX_NEST_DEPTH} (limit MAX_STMT_DEPTH = {MAX_STMT_DEPTH}, less {} levels kept for its passes): compute some stages at root instead",
            deepest - 1,
            MAX_STMT_DEPTH - MAX_NEST_DEPTH
        ));
    }
    Ok(())
}

/// Ids of the stages `sched` inlines.
pub(super) fn inlined_ids(sched: &Schedule) -> HashSet<u32> {
    sched
        .stages
        .iter()
        .filter(|s| s.attach == Attach::Inline)
        .map(|s| s.tensor.id())
        .collect()
}

/// `check_sizes` of `sched` as written, for `build` to run before a default schedule: the
/// defaults rewrite stage bodies with tree walks (`Expr::substitute`), so a body that is a
/// shared DAG of 2^60 tree nodes must be refused before they see it, not after (it ran out
/// of memory in `lane_reduce::rewrite`).
pub fn check_expr_sizes(sched: &Schedule) -> Result<()> {
    check_sizes(&sched.post_order(), &inlined_ids(sched))
}

/// Every `compute_at` names a loop its consumer still has: a split or fuse of that loop after
/// the `compute_at` leaves the stage attached nowhere, and lowering (which emits attached stages
/// at their loop) would silently never compute it (its buffer read as zeros). TVM refuses the
/// same schedule ("cannot find attach point").
pub(super) fn check_attach_points(sched: &Schedule) -> Result<()> {
    for st in &sched.stages {
        let Attach::At { consumer, var } = &st.attach else {
            continue;
        };
        let Some(c) = sched.stages.iter().find(|c| c.tensor.id() == *consumer) else {
            continue; // a consumer outside the schedule: nest building names it
        };
        if !c.leaves.iter().any(|l| &l.var == var) {
            let loops: Vec<&str> = c.leaves.iter().map(|l| &*l.var.name).collect();
            return cerr(format!(
                "schedule of '{}': it is computed at loop '{}' of '{}', which '{}' no longer has (it was split or fused after the compute_at); compute_at one of its loops now: {}",
                st.tensor.name(),
                var.name,
                c.tensor.name(),
                c.tensor.name(),
                loops.join(", ")
            ));
        }
    }
    Ok(())
}
