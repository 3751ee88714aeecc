//! The loop nest of one stage (`Ctx::emit`).
//!
//! - loops in the schedule's leaf order; root axis values rebuilt from the leaves
//!   (`parent = outer * factor + inner`, fused loops split back with `//` and `%`), guarded by
//!   `if` where a split does not divide;
//! - reductions as an init nest (identity) then the update nest `C = C op body`: always
//!   correct whatever the loop order (a reduction loop may sit outside data-parallel loops);
//!   except, on the host, when the reduction loops are the innermost loops: then each
//!   element is accumulated in a one-element local `<stage>.acc` (started at the identity
//!   just outside the reduction loops, `acc = acc op body` inside, stored once after them
//!   under the data-parallel guards), which the CPU backend keeps in a register; same dtype,
//!   same order of operations, so the same bits as the init-then-update form;
//! - the stages attached at each loop emitted inside it (`attach`), and a stage bound to a
//!   GPU's cross-thread reduction wrapped around its serial reduction loops (`gpu`).

use super::gpu::{cross_thread, Cross, Place};
use super::{cerr, combine, identity, split_divides, Ctx};
use crate::arith::interval::{Env, Interval};
use crate::arith::simplify::simplify;
use crate::error::Result;
use crate::ir::expr::{BufId, Expr, ReduceOp, Var};
use crate::ir::stmt::{BufKind, Buffer, ForKind, Scope, Stmt, ThreadTag};
use crate::schedule::loops::{loop_extents, Relation};
use crate::schedule::Stage;
use crate::te::tensor::top_reduce;
use rivet_runtime::DType;
use std::collections::HashMap;

impl Ctx<'_> {
    /// The loop nest of one stage. `region`: per data-parallel dim, (first index, extent) to
    /// compute (None: the whole tensor).
    /// `place`: where the stage is attached (`Place::Host` for root stages).
    pub(super) fn emit(
        &self,
        stage: &Stage,
        region: Option<Vec<(Expr, Expr)>>,
        place: &Place,
    ) -> Result<Stmt> {
        let t = &stage.tensor;
        let name = t.name();
        let buf = self.buf_of[&t.id()];
        let axis = t.axis();
        let (reduce_op, inner_body, raxes) = match top_reduce(t.body().expect("compute")) {
            Some((op, b, a)) => (Some(op), b.clone(), a.to_vec()),
            None => (None, t.body().unwrap().clone(), vec![]),
        };
        // Root domains: (first value, extent) per root var.
        let partial = region.is_some();
        let region = region.unwrap_or_else(|| {
            axis.iter()
                .map(|a| (Expr::int(0), a.extent.clone()))
                .collect()
        });
        let mut ext: HashMap<Var, Expr> = HashMap::new();
        let mut base: HashMap<Var, Expr> = HashMap::new();
        for (a, (lo, e)) in axis.iter().zip(&region) {
            ext.insert(a.var.clone(), e.clone());
            base.insert(a.var.clone(), lo.clone());
        }
        for r in &raxes {
            ext.insert(r.var.clone(), r.extent.clone());
            base.insert(r.var.clone(), r.min.clone());
        }
        // Leaf extents, through the relations in order (the rule Python reports too).
        let ext = loop_extents(&stage.relations, ext);
        let kc = match place {
            Place::Kernel(kc) => Some(kc),
            _ => None,
        };
        let (gpu, cross) = self.gpu_stage(stage, &ext, kc)?;
        // A cache stage's buffer holds only its region: indices relative to its first element.
        let compact = stage.scope != Scope::Global;
        let mut guards: Vec<Expr> = Vec::new();
        // Inside a kernel, a cache stage's loops bound to a thread index are that index: the
        // enclosing thread loop's variable (substituted at the end), or a thread loop of the
        // block's extent; iterations past the loop's own extent are guarded off.
        let mut subst: HashMap<Var, Var> = HashMap::new();
        let mut unbound: Vec<(ThreadTag, i64)> = Vec::new();
        if let Some(kc) = kc {
            for leaf in &stage.leaves {
                let ForKind::Thread(tag) = leaf.kind else {
                    continue;
                };
                let e = simplify(&ext[&leaf.var]);
                let Some(dim) = kc.dim(tag) else {
                    return cerr(format!(
                        "schedule of '{name}': loop '{}' is bound to {}, but the block of '{}' (the kernel it is attached in) has no {} loop; bind its loops to the block's thread dimensions",
                        leaf.var.name, tag.name(), kc.root, tag.name()
                    ));
                };
                match e.as_int() {
                    Some(n) if (1..=dim).contains(&n) => {
                        let v = match kc.thread_var(tag) {
                            Some(u) => {
                                subst.insert(leaf.var.clone(), u.clone());
                                u.clone()
                            }
                            None => leaf.var.clone(),
                        };
                        if n < dim {
                            guards.push(Expr::var(&v).lt(&Expr::int(n)));
                        }
                    }
                    _ => {
                        return cerr(format!(
                            "schedule of '{name}': loop '{}' bound to {} has extent {e}; inside the kernel of '{}' it must be a constant from 1 to the block's {dim} threads in that dimension",
                            leaf.var.name, tag.name(), kc.root
                        ))
                    }
                }
            }
            if stage.scope == Scope::Shared {
                // Dimensions of the block the stage does not bind: only thread 0 of each
                // works, or its threads would all write the same elements (a race).
                for &(tag, dim) in &kc.block {
                    let binds = stage.leaves.iter().any(|l| l.kind == ForKind::Thread(tag));
                    if binds || dim == 1 {
                        continue;
                    }
                    match kc.thread_var(tag) {
                        Some(u) => guards.push(
                            Expr::cmp(crate::ir::CmpOp::Eq, Expr::var(u), Expr::int(0))
                                .expect("int64"),
                        ),
                        None => unbound.push((tag, dim)),
                    }
                }
            }
        }
        // Values of every var in terms of the leaves, walking the relations backwards.
        let mut val: HashMap<Var, Expr> = stage
            .leaves
            .iter()
            .map(|l| (l.var.clone(), Expr::var(&l.var)))
            .collect();
        for rel in stage.relations.iter().rev() {
            match rel {
                Relation::Split {
                    parent,
                    outer,
                    inner,
                    ..
                } => {
                    let v = val[outer].mul(&ext[inner]).add(&val[inner]);
                    let pe = &ext[parent];
                    if !split_divides(pe, &ext[outer], &ext[inner]) {
                        guards.push(v.lt(pe));
                    }
                    val.insert(parent.clone(), v);
                }
                Relation::Fuse {
                    outer,
                    inner,
                    fused,
                } => {
                    let f = val[fused].clone();
                    val.insert(outer.clone(), f.floordiv(&ext[inner]));
                    val.insert(inner.clone(), f.floormod(&ext[inner]));
                }
            }
        }
        let root_value = |v: &Var| base[v].add(&val[v]);
        let idx: Vec<Expr> = axis.iter().map(|a| root_value(&a.var)).collect();
        let sidx: Vec<Expr> = if compact {
            axis.iter().map(|a| val[&a.var].clone()).collect()
        } else {
            idx.clone()
        };
        // A region (compute_at) may reach past the tensor's edges: those elements are skipped.
        let in_tensor = |idx: &[Expr]| -> Vec<Expr> {
            idx.iter()
                .zip(t.shape())
                .flat_map(|(i, e)| {
                    [
                        Expr::cmp(crate::ir::CmpOp::Ge, i.clone(), Expr::int(0)).expect("int64"),
                        i.lt(e),
                    ]
                })
                .collect()
        };
        if partial {
            guards.extend(in_tensor(&idx));
        }
        let body_sub = inner_body.substitute(&|v| {
            if axis.iter().any(|a| &a.var == v) || raxes.iter().any(|r| &r.var == v) {
                Some(root_value(v))
            } else {
                None
            }
        });
        let body_ir = self.to_ir(&body_sub)?;
        // A cross-thread reduction: the accumulator, its first serial reduction loop (`first`),
        // and the guards of the final store (those of data-parallel loops only).
        let cross = match (cross, reduce_op) {
            (Some(tx), Some(op)) => {
                let acc = self.acc_of[&t.id()];
                let reduce_leaves: Vec<&Var> = stage
                    .leaves
                    .iter()
                    .filter(|l| l.reduce)
                    .map(|l| &l.var)
                    .collect();
                let dp_guards: Vec<Expr> = guards
                    .iter()
                    .filter(|g| !reduce_leaves.iter().any(|v| g.uses(v)))
                    .cloned()
                    .collect();
                let first = stage
                    .leaves
                    .iter()
                    .position(|l| l.reduce && !matches!(l.kind, ForKind::Thread(_)))
                    .unwrap_or(stage.leaves.len());
                Some(Cross {
                    tx,
                    op,
                    acc,
                    first,
                    guards: dp_guards,
                })
            }
            _ => None,
        };
        // A host reduction whose reduction loops are the innermost ones accumulates in a
        // one-element local (`<stage>.acc`), stored once per element (`RegAcc`).
        let reg = match (reduce_op, &cross) {
            (Some(op), None) if !gpu && kc.is_none() && !compact => {
                self.register_acc(stage, op, &guards, &sidx)
            }
            _ => None,
        };
        let store = match (reduce_op, &cross) {
            (Some(op), None) if reg.is_some() => {
                let acc = reg.as_ref().expect("checked").acc;
                let a = Expr::load(acc, vec![Expr::int(0)], t.dtype());
                Stmt::Store {
                    buf: acc,
                    indices: vec![Expr::int(0)],
                    value: combine(op, a, body_ir)?,
                }
            }
            (None, _) => Stmt::Store {
                buf,
                indices: sidx.clone(),
                value: body_ir,
            },
            (Some(op), Some(c)) => {
                let a = Expr::load(c.acc, vec![Expr::int(0)], t.dtype());
                Stmt::Store {
                    buf: c.acc,
                    indices: vec![Expr::int(0)],
                    value: combine(op, a, body_ir)?,
                }
            }
            (Some(op), None) => {
                let acc = Expr::load(buf, sidx.clone(), t.dtype());
                Stmt::Store {
                    buf,
                    indices: sidx.clone(),
                    value: combine(op, acc, body_ir)?,
                }
            }
        };
        let mut inner = if guards.is_empty() {
            store
        } else {
            let cond = guards
                .into_iter()
                .reduce(|a, b| Expr::logic(crate::ir::LogicOp::And, a, b).expect("bools"))
                .unwrap();
            Stmt::If {
                cond,
                then: Box::new(store),
                otherwise: None,
            }
        };
        // Loops, innermost first; producers attached at a leaf go at the top of its body.
        let n = stage.leaves.len();
        let last_block = if gpu {
            stage
                .leaves
                .iter()
                .rposition(|l| matches!(l.kind, ForKind::Thread(t) if t.is_block()))
        } else {
            None
        };
        for (pos, leaf) in stage.leaves.iter().enumerate().rev() {
            // Outside the serial reduction loops of a cross-thread reduction: the accumulator,
            // the combination across threads and the store of the element.
            if let Some(c) = cross.as_ref().filter(|c| pos + 1 == c.first) {
                inner = cross_thread(inner, c, t.dtype(), (buf, &idx));
            }
            // Constant extents are folded (unroll needs a constant); symbolic ones keep their
            // form (the bounds proof recognises fused products).
            let e = match simplify(&ext[&leaf.var]) {
                c if c.as_int().is_some() => c,
                _ => ext[&leaf.var].clone(),
            };
            if matches!(leaf.kind, ForKind::Vectorized | ForKind::Unrolled) {
                let what = if leaf.kind == ForKind::Vectorized {
                    "vectorize"
                } else {
                    "unroll"
                };
                if leaf.kind == ForKind::Unrolled && simplify(&e).as_int().is_none() {
                    return cerr(format!(
                        "schedule of '{name}': cannot {what} '{}': its extent ({e}) is not a constant; split it by a constant factor first",
                        leaf.var.name
                    ));
                }
                if leaf.kind == ForKind::Vectorized && pos != n - 1 {
                    return cerr(format!(
                        "schedule of '{name}': the vectorized loop '{}' must be the innermost loop",
                        leaf.var.name
                    ));
                }
            }
            // Ranges of this loop and the ones outside it, for sizing attached regions.
            let mut outer = Env::default();
            for l in &stage.leaves[..=pos] {
                let last = simplify(&ext[&l.var].sub(&Expr::int(1)));
                outer.vars.insert(
                    l.var.clone(),
                    Interval {
                        lo: Expr::int(0),
                        hi: last,
                    },
                );
            }
            let child = self.place_inside(stage, pos, gpu, last_block, &ext, &outer, place);
            let (attached, locals) =
                self.attached_at(stage, &leaf.var, &mut inner, &outer, &child)?;
            if !attached.is_empty() {
                let mut v = attached;
                v.push(inner);
                inner = Stmt::Seq(v);
            }
            inner = Stmt::allocate_all(locals, inner);
            if Some(pos) == last_block {
                // The block body: shared buffers of the cache stages inside, one per block.
                let shared = self.pending_shared.borrow_mut().drain(..).collect();
                inner = Stmt::allocate_all(shared, inner);
            }
            if subst.contains_key(&leaf.var) {
                continue; // the enclosing thread loop's index: no loop of its own
            }
            let (extent, kind) = match (leaf.kind, kc) {
                // A thread loop of a cache stage spans the whole block dimension (every loop
                // of one tag in a kernel has the block's extent); the guard above trims it.
                (ForKind::Thread(tag), Some(kc)) => {
                    (Expr::int(kc.dim(tag).expect("checked above")), leaf.kind)
                }
                _ => (e, leaf.kind),
            };
            inner = Stmt::For {
                var: leaf.var.clone(),
                min: Expr::int(0),
                extent,
                kind,
                body: Box::new(inner),
            };
            if let Some(r) = reg.as_ref().filter(|r| r.first == pos) {
                inner = register_acc_around(inner, r, t.dtype(), (buf, &sidx));
            }
        }
        if gpu && last_block.is_none() && !self.pending_shared.borrow().is_empty() {
            return cerr(format!(
                "schedule of '{name}': a shared-memory cache stage is attached inside it, but it has no loop bound to blockIdx (shared memory is allocated per block): bind its outer loops to blocks"
            ));
        }
        let rename = |s: Stmt| -> Stmt {
            if subst.is_empty() {
                return s;
            }
            s.rewrite(
                &mut |e| e.substitute(&|v| subst.get(v).map(Expr::var)),
                &mut |s| s,
            )
        };
        let wrap_unbound = |mut s: Stmt| -> Stmt {
            for (tag, dim) in &unbound {
                let d = Var::new(&format!("{}.only0", tag.name()));
                s = Stmt::For {
                    var: d.clone(),
                    min: Expr::int(0),
                    extent: Expr::int(*dim),
                    kind: ForKind::Thread(*tag),
                    body: Box::new(Stmt::If {
                        cond: Expr::cmp(crate::ir::CmpOp::Eq, Expr::var(&d), Expr::int(0))
                            .expect("int64"),
                        then: Box::new(s),
                        otherwise: None,
                    }),
                };
            }
            s
        };
        // Reductions start from the identity over the region, in a nest of their own (a
        // cross-thread one starts each accumulator at it instead).
        if let (Some(op), None, None) = (reduce_op, &cross, &reg) {
            let host_parallel =
                !gpu && kc.is_none() && stage.leaves.iter().any(|l| l.kind == ForKind::Parallel);
            let vars: Vec<Var> = axis
                .iter()
                .map(|a| Var::new(&format!("{}.init", a.var.name)))
                .collect();
            let ridx: Vec<Expr> = region
                .iter()
                .zip(&vars)
                .map(|((lo, _), v)| lo.add(&Expr::var(v)))
                .collect();
            let init_idx = if compact {
                vars.iter().map(Expr::var).collect()
            } else {
                ridx.clone()
            };
            let mut init = Stmt::Store {
                buf,
                indices: init_idx,
                value: identity(op, t.dtype()),
            };
            if partial {
                let cond = in_tensor(&ridx)
                    .into_iter()
                    .reduce(|a, b| Expr::logic(crate::ir::LogicOp::And, a, b).expect("bools"));
                if let Some(cond) = cond {
                    init = Stmt::If {
                        cond,
                        then: Box::new(init),
                        otherwise: None,
                    };
                }
            }
            for (k, (v, (_, e))) in vars.iter().zip(&region).enumerate().rev() {
                // A GPU stage's initialisation is a kernel of its own: one block per index of
                // the first dim (one thread each), so no host code writes device memory.
                // On the CPU, a stage with a parallel loop initialises in parallel too (each
                // iteration of the first dim writes its own elements).
                // On the CPU the innermost loop is vectorized (the identity is a constant:
                // `lower::vectorize` turns it into vector stores where the layout allows,
                // and leaves the loop as it is elsewhere): a packed GEMM writing its output
                // in place zeroed it one scalar at a time, 11 % of a 252 x 256 x 256 call.
                let kind = if gpu && k == 0 {
                    ForKind::Thread(ThreadTag::BlockX)
                } else if k == 0 && host_parallel {
                    ForKind::Parallel
                } else if !gpu && kc.is_none() && k + 1 == vars.len() {
                    ForKind::Vectorized
                } else {
                    ForKind::Serial
                };
                init = Stmt::For {
                    var: v.clone(),
                    min: Expr::int(0),
                    extent: e.clone(),
                    kind,
                    body: Box::new(init),
                };
            }
            return Ok(wrap_unbound(rename(Stmt::Seq(vec![init, inner]))));
        }
        Ok(wrap_unbound(rename(inner)))
    }

    /// Whether the reduction `stage` accumulates in a register (`RegAcc`): its reduction
    /// loops must be the innermost loops (a data-parallel loop inside one would need one
    /// accumulator per element), and the element's indices and the guards of its final store
    /// must not depend on them. No other statement reads the element inside those loops (a
    /// stage's body never reads its own output, and stages attached inside write other
    /// buffers), so keeping it in a local until the loops end changes nothing: the local has
    /// the element's dtype, so every step rounds exactly as the store into the tensor did,
    /// and the interpreter computes the same values in the same order.
    fn register_acc(
        &self,
        stage: &Stage,
        op: ReduceOp,
        guards: &[Expr],
        sidx: &[Expr],
    ) -> Option<RegAcc> {
        // A tensorized stage keeps the update form `C = C + A * B`: that is what its
        // intrinsic's declared computation matches (`lower::tensorize`), and the call
        // accumulates in registers itself.
        if !stage.tensorize.is_empty() {
            return None;
        }
        let first = stage.leaves.iter().position(|l| l.reduce)?;
        if !stage.leaves[first..].iter().all(|l| l.reduce) {
            return None;
        }
        let reduce_vars: Vec<&Var> = stage.leaves[first..].iter().map(|l| &l.var).collect();
        let uses_reduce = |e: &Expr| reduce_vars.iter().any(|v| e.uses(v));
        if sidx.iter().any(uses_reduce) {
            return None;
        }
        let store_guards: Vec<Expr> = guards.iter().filter(|g| !uses_reduce(g)).cloned().collect();
        let mut bufs = self.buffers.borrow_mut();
        let id = BufId(bufs.iter().map(|b| b.id.0 + 1).max().unwrap_or(0));
        let name = format!("{}.acc", stage.tensor.name());
        bufs.push(Buffer {
            id,
            strides: vec![Var::new(&format!("{name}.s0"))],
            name,
            dtype: stage.tensor.dtype(),
            shape: vec![Expr::int(1)],
            kind: BufKind::Local,
            scope: Scope::Global,
            overwritten: false,
        });
        Some(RegAcc {
            op,
            acc: id,
            first,
            guards: store_guards,
        })
    }
}

/// A host reduction accumulated in a one-element local (TVM's `rfactor`-free register
/// accumulation; `Ctx::register_acc` says when it is legal).
struct RegAcc {
    op: ReduceOp,
    /// The accumulator: a one-element local of the stage's dtype.
    acc: BufId,
    /// Position of the outermost reduction loop among the stage's leaves (all loops from it
    /// inward are reduction loops): the accumulator lives just outside it.
    first: usize,
    /// The guards of the final store (those not involving a reduction loop).
    guards: Vec<Expr>,
}

/// The reduction loops `update` of a register-accumulated reduction, wrapped: allocate the
/// accumulator, start it at the identity, run `update`, store the element `out[idx]` where
/// the data-parallel guards hold.
fn register_acc_around(
    update: Stmt,
    r: &RegAcc,
    dtype: DType,
    (out, idx): (BufId, &[Expr]),
) -> Stmt {
    let zero = || vec![Expr::int(0)];
    let store = Stmt::Store {
        buf: out,
        indices: idx.to_vec(),
        value: Expr::load(r.acc, zero(), dtype),
    };
    let store = match r
        .guards
        .iter()
        .cloned()
        .reduce(|a, b| Expr::logic(crate::ir::LogicOp::And, a, b).expect("bools"))
    {
        Some(cond) => Stmt::If {
            cond,
            then: Box::new(store),
            otherwise: None,
        },
        None => store,
    };
    Stmt::Allocate {
        bufs: vec![r.acc],
        body: Box::new(Stmt::Seq(vec![
            Stmt::Store {
                buf: r.acc,
                indices: zero(),
                value: identity(r.op, dtype),
            },
            update,
            store,
        ])),
    }
}
