//! Pass 1: schedule -> loop nests (bound inference, schedule application, inlining).
//!
//! Output: a `PrimFunc` whose `Load`/`Store`s are still multi-dimensional (one index per dim;
//! `flatten` comes later), with:
//! - one parameter buffer per argument (its stride variables bound at call time), one local
//!   buffer per materialised intermediate (allocated at the top, full size, compact);
//! - for each stage, loops in the schedule's leaf order; root axis values rebuilt from the
//!   leaves (`parent = outer * factor + inner`, fused loops split back with `//` and `%`),
//!   guarded by `if` where a split does not divide;
//! - reductions as an init nest (identity) then the update nest `C = C op body`: always
//!   correct whatever the loop order (a reduction loop may sit outside data-parallel loops);
//!   except, on the host, when the reduction loops are the innermost loops: then each
//!   element is accumulated in a one-element local `<stage>.acc` (started at the identity
//!   just outside the reduction loops, `acc = acc op body` inside, stored once after them
//!   under the data-parallel guards), which the CPU backend keeps in a register; same dtype,
//!   same order of operations, so the same bits as the init-then-update form;
//! - stages `compute_at` a consumer's loop computed inside that loop over the region one of its
//!   iterations reads (interval analysis), its stores guarded by the producer's extent;
//! - a stage whose reduction loop is bound to `threadIdx.x` (a cross-thread reduction) has no
//!   init nest: inside its bound loops and its serial data-parallel loops, each thread
//!   allocates a one-element `local` accumulator (`<stage>.acc`), starts it at the identity,
//!   accumulates its share over the serial reduction loops (every split guard on the update),
//!   then `AllReduce` combines the group's partials into it and the thread of
//!   `threadIdx.x == 0` stores the element (under the data-parallel guards only: every thread
//!   reaches the `AllReduce`, which is collective).
//! - an extern stage as one `Call` of `Intrin::Callback` on whole buffers, and each debug tap as
//!   one right after its stage's nest, all at the top level (`ir::callback`);
//! - GPU memory caches (`Stage::scope` shared / local, from `cache_read` / `cache_write`): only
//!   inside a kernel (attached at or below the innermost block loop of a GPU stage), in a
//!   compact buffer of the region's constant shape, stores and the consumer's loads indexed
//!   relative to the region's first element. A shared cache's region is the union over the
//!   block's threads, its buffer allocated in the block body; a local one is allocated around
//!   the loop it is attached to. A cache's loops bound to `threadIdx.*` are the block's thread
//!   indices (the enclosing thread loop's variable, or a thread loop of the block's extent),
//!   guarded where shorter than the block; block dimensions a shared cache does not bind are
//!   left to thread 0. Barriers come later (`lower::sync`).

use crate::arith::interval::{interval, smax, smin, Env, Interval};
use crate::arith::simplify::simplify;
use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, BufId, Expr, ExprKind, ReduceOp, Var};
use crate::ir::limits::{MAX_NEST_DEPTH, MAX_STMT_DEPTH};
use crate::ir::stmt::{BufKind, Buffer, ForKind, PrimFunc, Scope, Stmt, ThreadTag};
use crate::schedule::loops::{loop_extents, Relation, SMALL_SPLIT};
use crate::schedule::{Attach, Schedule, Stage};
use crate::te::tensor::{inputs, top_reduce, Tensor};
use rivet_runtime::DType;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

struct Ctx<'a> {
    sched: &'a Schedule,
    /// Cache stages' buffers get their (constant) shape when their region is known.
    buffers: RefCell<Vec<Buffer>>,
    buf_of: HashMap<u32, BufId>,
    inlined: HashSet<u32>,
    /// The accumulator of each stage with a cross-thread reduction, by tensor id.
    acc_of: HashMap<u32, BufId>,
    /// Shared buffers of cache stages emitted inside the GPU stage being emitted, allocated
    /// by it in its block body (the body of its innermost block loop).
    pending_shared: RefCell<Vec<BufId>>,
}

/// Largest shared cache buffer (CUDA's static shared memory per block; the CUDA backend
/// checks the sum against the target).
const MAX_SHARED_BYTES: i64 = 48 * 1024;
/// Largest local cache buffer per thread (registers or the stack; the interpreter keeps one
/// copy per thread of the block).
const MAX_LOCAL_BYTES: i64 = 16 * 1024;

/// Where a stage's loop stands, for the stages attached to it.
#[derive(Clone)]
enum Place {
    /// Host code (no GPU stage around).
    Host,
    /// Between the block loops of a GPU stage (above its block body): nothing may be attached.
    Grid { loop_name: String },
    /// Inside a kernel's block body.
    Kernel(Kc),
}

/// What a stage attached inside a kernel needs to know about it.
#[derive(Clone)]
struct Kc {
    /// Name of the GPU stage whose kernel this is.
    root: String,
    /// Extent of each thread dimension of the block.
    block: Vec<(ThreadTag, i64)>,
    /// Thread loops enclosing the point of attachment, per tag.
    enclosing: Vec<(ThreadTag, Var)>,
    /// Ranges of the loops enclosing the point of attachment.
    ranges: Env,
}

impl Kc {
    fn dim(&self, tag: ThreadTag) -> Option<i64> {
        self.block.iter().find(|(t, _)| *t == tag).map(|(_, n)| *n)
    }
    fn thread_var(&self, tag: ThreadTag) -> Option<&Var> {
        self.enclosing
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, v)| v)
    }
}

fn cerr<T>(msg: String) -> Result<T> {
    Err(Error::Compile(msg))
}

/// The identity of a reduction in `dtype`.
pub fn identity(op: ReduceOp, dtype: DType) -> Expr {
    let v = match op {
        ReduceOp::Sum => 0.0,
        ReduceOp::Prod => 1.0,
        ReduceOp::Max | ReduceOp::Min => {
            let neg = op == ReduceOp::Max;
            if dtype.is_float() {
                return Expr::constant(
                    if neg {
                        f64::NEG_INFINITY
                    } else {
                        f64::INFINITY
                    },
                    dtype,
                );
            }
            let bits = dtype.size() as u32 * 8;
            let signed = matches!(dtype, DType::I8 | DType::I16 | DType::I32 | DType::I64);
            let (lo, hi): (i64, i64) = match (signed, bits) {
                (true, 64) => (i64::MIN, i64::MAX),
                (true, b) => (-(1i64 << (b - 1)), (1i64 << (b - 1)) - 1),
                (false, 64) => (0, -1), // u64::MAX as i64 bits
                (false, b) => (0, (1i64 << b) - 1),
            };
            return Expr::const_int(if neg { lo } else { hi }, dtype);
        }
    };
    Expr::constant(v, dtype)
}

fn combine(op: ReduceOp, acc: Expr, v: Expr) -> Result<Expr> {
    let bop = match op {
        ReduceOp::Sum => BinOp::Add,
        ReduceOp::Prod => BinOp::Mul,
        ReduceOp::Max => BinOp::Max,
        ReduceOp::Min => BinOp::Min,
    };
    Expr::binary(bop, acc, v)
}

impl Ctx<'_> {
    /// te expression -> IR expression: reads of inlined stages are substituted, other reads
    /// become loads of the tensor's buffer.
    fn to_ir(&self, e: &Expr) -> Result<Expr> {
        let mut failure = None;
        let out = e.rewrite(&mut |n| match n.kind() {
            ExprKind::Read { tensor, indices } => {
                let tensor = &self.sched.current(&Tensor::of(tensor));
                if self.inlined.contains(&tensor.id()) {
                    let body = tensor.body().expect("inlined stages are computes");
                    let axis = tensor.axis();
                    let sub = body.substitute(&|v| axis.iter().position(|a| &a.var == v).map(|d| indices[d].clone()));
                    match self.to_ir(&sub) {
                        Ok(x) => Some(x),
                        Err(err) => {
                            failure = Some(err);
                            None
                        }
                    }
                } else {
                    match self.buf_of.get(&tensor.id()) {
                        Some(b) => Some(Expr::load(*b, indices.clone(), tensor.dtype())),
                        None => {
                            failure.get_or_insert(Error::Compile(format!(
                                "tensor '{}' is read but is neither an argument nor computed by the schedule; pass it in args",
                                tensor.name()
                            )));
                            None
                        }
                    }
                }
            }
            ExprKind::Reduce { .. } => {
                failure.get_or_insert(Error::Compile(format!("a reduction can only be the whole body of a compute: {n}")));
                None
            }
            ExprKind::Invalid(m) => {
                failure.get_or_insert(Error::Compile(m.clone()));
                None
            }
            _ => None,
        });
        match failure {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    fn stage_of(&self, id: u32) -> &Stage {
        self.sched
            .stages
            .iter()
            .find(|s| s.tensor.id() == id)
            .expect("stage exists")
    }

    /// The loop nest of one stage. `region`: per data-parallel dim, (first index, extent) to
    /// compute (None: the whole tensor).
    /// `place`: where the stage is attached (`Place::Host` for root stages).
    fn emit(
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
                let kind = if gpu && k == 0 {
                    ForKind::Thread(ThreadTag::BlockX)
                } else if k == 0 && host_parallel {
                    ForKind::Parallel
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

    /// Where the stages attached at loop `pos` of `stage` stand.
    #[allow(clippy::too_many_arguments)]
    fn place_inside(
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
    /// when the block has `threadIdx.y` / `z` threads (`ir::verify_gpu`).
    fn gpu_stage(
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
            match e.as_int() {
                Some(n) if (1..=1024).contains(&n) => {
                    threads = threads.saturating_mul(n);
                    dims[t.axis()] = n;
                }
                Some(n) => {
                    return fail(format!(
                        "loop '{}' bound to {} has {n} iterations; a thread dimension has 1 to 1024 (split it by a constant factor first)",
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

    /// Nests of the stages attached at loop `var` of `consumer`, over the regions that
    /// `consumer_body` (the loops inside `var`) reads.
    ///
    /// Cache stages (shared / local scope) get a compact buffer of the region's constant
    /// shape, and the consumer's loads of it are rebased to the region's first element; a
    /// shared stage's region is the union over the block's threads (the thread indices
    /// enclosing `var` range over the block), since all threads share one copy. Returns the
    /// statements and the local buffers to allocate around the loop body.
    fn attached_at(
        &self,
        consumer: &Stage,
        var: &Var,
        consumer_body: &mut Stmt,
        outer: &Env,
        place: &Place,
    ) -> Result<(Vec<Stmt>, Vec<BufId>)> {
        let mut out = Vec::new();
        let mut locals = Vec::new();
        for st in &self.sched.stages {
            let Attach::At {
                consumer: cid,
                var: v,
            } = &st.attach
            else {
                continue;
            };
            if *cid != consumer.tensor.id() || v != var {
                continue;
            }
            let pbuf = self.buf_of[&st.tensor.id()];
            let compact = st.scope != Scope::Global;
            let in_kernel = match place {
                Place::Grid { loop_name } => {
                    return cerr(format!(
                        "schedule of '{}': it is computed at block loop '{loop_name}' of '{}', above its innermost block loop; attach it at the innermost block loop or inside the block",
                        st.tensor.name(),
                        consumer.tensor.name()
                    ));
                }
                Place::Kernel(kc) => Some(kc),
                Place::Host => None,
            };
            if compact && in_kernel.is_none() {
                return cerr(format!(
                    "schedule of '{}': a {} cache stage must be compute_at inside a loop of a stage bound to a GPU, at or below its block loops; it is computed at loop '{}' of '{}', which is not inside a kernel",
                    st.tensor.name(),
                    if st.scope == Scope::Shared { "shared" } else { "local" },
                    var.name,
                    consumer.tensor.name()
                ));
            }
            if in_kernel.is_some() && !compact {
                return cerr(format!(
                    "schedule of '{}': it is computed at loop '{}' of '{}', which runs on a GPU: inside a kernel a stage needs a buffer in shared or local memory (s.cache_read / s.cache_write); compute '{}' at root or inline it",
                    st.tensor.name(),
                    var.name,
                    consumer.tensor.name(),
                    st.tensor.name()
                ));
            }
            let consumer_body_ro: &Stmt = consumer_body;
            // Ranges of the loops inside `var` (they vary within one iteration of it).
            let mut env = Env::default();
            let mut relaxed: Vec<Var> = Vec::new();
            if let (Some(kc), Scope::Shared) = (in_kernel, st.scope) {
                for (tag, u) in &kc.enclosing {
                    let dim = kc
                        .dim(*tag)
                        .expect("enclosing thread loops are the block's");
                    env.vars.insert(
                        u.clone(),
                        Interval {
                            lo: Expr::int(0),
                            hi: Expr::int(dim - 1),
                        },
                    );
                    relaxed.push(u.clone());
                }
            }
            consumer_body_ro.visit(&mut |s| {
                if let Stmt::For {
                    var, min, extent, ..
                } = s
                {
                    // Pre-order: loops enclosing this one are already in `env`, so bounds that
                    // mention them are resolved to the outer loops' ranges.
                    let last = simplify(&min.add(extent).sub(&Expr::int(1)));
                    let lo = interval(min, &env)
                        .map(|i| i.lo)
                        .unwrap_or_else(|| min.clone());
                    let hi = interval(&last, &env).map(|i| i.hi).unwrap_or(last);
                    env.vars.insert(var.clone(), Interval { lo, hi });
                    env.loops.insert(var.clone(), (min.clone(), extent.clone()));
                }
            });
            let ndim = st.tensor.ndim();
            let mut acc: Vec<Option<Interval>> = vec![None; ndim];
            let mut unknown = false;
            let mut found = false;
            // Each distinct load once (a union of intervals is the same for repeats), so a
            // shared DAG costs its size, not its size as a tree.
            consumer_body_ro.visit_exprs(&mut |e| {
                e.visit_unique(&mut |n| {
                    if let ExprKind::Load { buf, indices } = n.kind() {
                        if *buf == pbuf {
                            found = true;
                            for (d, i) in indices.iter().enumerate() {
                                match interval(i, &env) {
                                    Some(iv) => {
                                        acc[d] = Some(match acc[d].take() {
                                            None => iv,
                                            Some(p) => Interval {
                                                lo: smin(&p.lo, &iv.lo),
                                                hi: smax(&p.hi, &iv.hi),
                                            },
                                        })
                                    }
                                    None => unknown = true,
                                }
                            }
                        }
                    }
                })
            });
            if !found || unknown {
                return cerr(format!(
                    "schedule of '{}': compute_at '{}' inside loop '{}' of '{}': {}",
                    st.tensor.name(),
                    st.tensor.name(),
                    var.name,
                    consumer.tensor.name(),
                    if found {
                        "cannot bound the region it reads"
                    } else {
                        "that loop does not read it; attach it to a loop of a stage that reads it"
                    }
                ));
            }
            if compact {
                let region =
                    self.cache_region(st, consumer, var, acc, outer, in_kernel, &relaxed)?;
                let lo: Vec<Expr> = region.iter().map(|(lo, _)| lo.clone()).collect();
                // The consumer reads the region's copy: indices relative to its first element.
                *consumer_body = consumer_body.rewrite(
                    &mut |e| {
                        e.rewrite(&mut |n| match n.kind() {
                            ExprKind::Load { buf, indices } if *buf == pbuf => Some(Expr::load(
                                pbuf,
                                indices
                                    .iter()
                                    .zip(&lo)
                                    .map(|(i, l)| simplify(&i.sub(l)))
                                    .collect(),
                                n.dtype(),
                            )),
                            _ => None,
                        })
                    },
                    &mut |s| s,
                );
                out.push(self.emit(st, Some(region), place)?);
                if st.scope == Scope::Local {
                    locals.push(pbuf);
                } else {
                    self.pending_shared.borrow_mut().push(pbuf);
                }
                continue;
            }
            let region = acc
                .into_iter()
                .zip(st.tensor.shape())
                .map(|(iv, shape)| {
                    // `emit` guards the stores with the tensor's bounds, in the form the bounds
                    // proof matches. A region of a large constant extent is also clamped to
                    // the tensor: a loose interval (`i % 2**31` over a tensor of 4) must not
                    // become 2**31 guarded iterations. (Others keep their simpler form, which
                    // the proof bounds without `max`/`min` of outer loops.)
                    let iv = iv.expect("found");
                    let extent = simplify(&iv.hi.sub(&iv.lo).add(&Expr::int(1)));
                    let huge = match extent.as_int() {
                        Some(e) => e > SMALL_SPLIT,
                        // A symbolic region is clamped only when it may exceed the tensor by
                        // more than SMALL_SPLIT (`j * 2**31` over `j < n`), not when it is the
                        // tensor's own extent plus a halo (`n + 2`), which the proof bounds.
                        None => interval(&simplify(&extent.sub(shape)), outer)
                            .and_then(|i| simplify(&i.hi).as_int())
                            .is_none_or(|over| over > SMALL_SPLIT),
                    };
                    let iv = if !huge {
                        iv
                    } else {
                        Interval {
                            lo: smax(&iv.lo, &Expr::int(0)),
                            hi: smin(&iv.hi, &simplify(&shape.sub(&Expr::int(1)))),
                        }
                    };
                    let extent = simplify(&iv.hi.sub(&iv.lo).add(&Expr::int(1)));
                    // When the extent varies with the outer loops but has a constant bound,
                    // compute that many elements every time: a few more than needed (the
                    // guards keep them inside the tensor), in loops the proof can bound.
                    let cap = interval(&extent, outer)
                        .map(|i| simplify(&i.hi))
                        .and_then(|h| h.as_int());
                    match cap {
                        Some(c) if extent.as_int().is_none() => {
                            (iv.lo.clone(), Expr::int(c.max(0)))
                        }
                        // An empty region (hi < lo) computes nothing: extent 0, never negative.
                        _ => match extent.as_int() {
                            Some(c) if c < 0 => (iv.lo.clone(), Expr::int(0)),
                            _ => (iv.lo.clone(), extent),
                        },
                    }
                })
                .collect();
            out.push(self.emit(st, Some(region), place)?);
        }
        Ok((out, locals))
    }

    /// The region of cache stage `st` attached at `var` of `consumer`: per dim (first index,
    /// constant extent); sets its buffer's shape. `acc`: the interval each dim is read over.
    #[allow(clippy::too_many_arguments)]
    fn cache_region(
        &self,
        st: &Stage,
        consumer: &Stage,
        var: &Var,
        acc: Vec<Option<Interval>>,
        outer: &Env,
        kc: Option<&Kc>,
        relaxed: &[Var],
    ) -> Result<Vec<(Expr, Expr)>> {
        let name = st.tensor.name();
        let mut env = outer.clone();
        if let Some(kc) = kc {
            for (v, iv) in &kc.ranges.vars {
                env.vars.entry(v.clone()).or_insert_with(|| iv.clone());
            }
        }
        let mut region = Vec::new();
        let mut elems: i64 = 1;
        for (d, iv) in acc.into_iter().enumerate() {
            let iv = iv.expect("found");
            let mut uses_relaxed = None;
            iv.lo.visit_unique(&mut |n| {
                if let Some(v) = n.as_var() {
                    if relaxed.contains(v) {
                        uses_relaxed.get_or_insert(v.clone());
                    }
                }
            });
            if let Some(v) = uses_relaxed {
                return cerr(format!(
                    "schedule of '{name}': the region of dim {d} that the block reads at loop '{}' of '{}' starts at {}, which depends on thread index '{}': a shared cache needs one region for the whole block",
                    var.name, consumer.tensor.name(), iv.lo, v.name
                ));
            }
            let extent = simplify(&iv.hi.sub(&iv.lo).add(&Expr::int(1)));
            let c = match extent.as_int() {
                Some(c) => Some(c),
                None => interval(&extent, &env)
                    .map(|i| simplify(&i.hi))
                    .and_then(|h| h.as_int()),
            };
            let Some(c) = c else {
                return cerr(format!(
                    "schedule of '{name}': at loop '{}' of '{}' it would hold {extent} elements in dim {d}, not a constant: a {} cache has a constant shape (attach it at a loop whose iteration reads a constant-size region, e.g. split the loops inside by constant factors)",
                    var.name,
                    consumer.tensor.name(),
                    if st.scope == Scope::Shared { "shared" } else { "local" }
                ));
            };
            let c = c.max(0);
            elems = elems.saturating_mul(c);
            region.push((iv.lo.clone(), Expr::int(c)));
        }
        let bytes = elems.saturating_mul(st.tensor.dtype().size() as i64);
        let (limit, what) = if st.scope == Scope::Shared {
            (MAX_SHARED_BYTES, "shared memory per block")
        } else {
            (MAX_LOCAL_BYTES, "local memory per thread")
        };
        if bytes > limit {
            return cerr(format!(
                "schedule of '{name}': at loop '{}' of '{}' its region is {} elements ({bytes} bytes); a cache may use at most {limit} bytes of {what}: attach it at a deeper loop or tile smaller",
                var.name,
                consumer.tensor.name(),
                elems
            ));
        }
        let pbuf = self.buf_of[&st.tensor.id()];
        let mut bufs = self.buffers.borrow_mut();
        let b = bufs
            .iter_mut()
            .find(|b| b.id == pbuf)
            .expect("every stage has a buffer");
        b.shape = region.iter().map(|(_, e)| e.clone()).collect();
        b.scope = st.scope;
        Ok(region)
    }
}

/// How a stage's cross-thread reduction is lowered.
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

struct Cross {
    /// The variable of the reduction loop bound to `threadIdx.x`.
    tx: Var,
    op: ReduceOp,
    /// The per-thread accumulator (a one-element `local`).
    acc: BufId,
    /// Position of the first serial reduction loop among the stage's leaves (the number of
    /// leaves when there is none): the accumulator lives just outside it.
    first: usize,
    /// The guards of the data-parallel loops' splits (those of the final store).
    guards: Vec<Expr>,
}

/// The statements around the serial reduction loops `update` of a cross-thread reduction:
/// allocate the accumulator, start it at the identity, run `update`, combine across the
/// threads of `threadIdx.x`, and store the element `out[idx]` from the thread `tx == 0`
/// where the data-parallel guards hold.
fn cross_thread(update: Stmt, c: &Cross, dtype: DType, (out, idx): (BufId, &[Expr])) -> Stmt {
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

/// Builds the loop-nest function of `sched` with parameters `args` (inputs and outputs).
/// Refuses, before any pass walks them, programs whose lowered expressions would exceed the
/// limits of `ir::limits`: inlining substitutes a stage's body at each read, so a chain of
/// stages that each read the previous one twice doubles at every step. Sizes are counted as
/// trees (upper bounds) but computed once per shared node and once per stage, saturating:
/// linear time.
fn check_sizes(all: &[Tensor], inlined: &HashSet<u32>) -> Result<()> {
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
fn check_attach_depth(sched: &Schedule, name: &str) -> Result<()> {
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
fn inlined_ids(sched: &Schedule) -> HashSet<u32> {
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

pub fn build_nest(sched: &Schedule, args: &[Tensor], name: &str) -> Result<PrimFunc> {
    for (i, a) in args.iter().enumerate() {
        if args[..i].contains(a) {
            return cerr(format!(
                "build: tensor '{}' is passed twice in args",
                a.name()
            ));
        }
    }
    for o in &sched.outputs {
        if !args.contains(o) {
            return cerr(format!(
                "build: output '{}' of the schedule must be in args",
                o.name()
            ));
        }
    }
    let all = sched.post_order();
    for t in &all {
        if t.is_placeholder() && !args.contains(t) {
            return cerr(format!(
                "build: placeholder '{}' is read but not passed in args",
                t.name()
            ));
        }
    }
    // An input no output reads is allowed: it is a parameter the kernel ignores (a backward
    // function takes every input of its forward, as `rivet.torch` / `rivet.jax` call it, and
    // a gradient often needs only some). A computed tensor that is not part of the schedule
    // has no stage to compute it, so passing one stays an error.
    for a in args {
        if !all.contains(a) && !a.is_placeholder() {
            return cerr(format!(
                "build: argument '{}' is computed, but no stage of the schedule computes it (add it to create_schedule's outputs)",
                a.name()
            ));
        }
    }
    let inlined = inlined_ids(sched);
    check_sizes(&all, &inlined)?;
    check_attach_depth(sched, name)?;
    for a in args {
        if inlined.contains(&a.id()) {
            return cerr(format!(
                "build: '{}' is an argument, so it cannot be compute_inline'd",
                a.name()
            ));
        }
    }
    // Symbolic dims: bound from bare-variable dims of the arguments' shapes.
    let mut dims: Vec<Var> = Vec::new();
    for a in args {
        for d in a.shape() {
            if let Some(v) = d.as_var() {
                if !dims.contains(v) {
                    dims.push(v.clone());
                }
            }
        }
    }
    let mut axis_vars: HashSet<Var> = HashSet::new();
    for t in &all {
        axis_vars.extend(t.axis().iter().map(|a| a.var.clone()));
        axis_vars.extend(t.reduce_axis().iter().map(|a| a.var.clone()));
    }
    // Which variables occur: each distinct node once (linear on shared DAGs; a plain `visit`
    // of `e = e + e - e` nested 40 deep never finished).
    let check_free = |e: &Expr, what: &str| -> Result<()> {
        let mut bad = None;
        e.visit_unique(&mut |n| {
            if let Some(v) = n.as_var() {
                if !dims.contains(v) && !axis_vars.contains(v) {
                    bad.get_or_insert(v.clone());
                }
            }
        });
        match bad {
            Some(v) => cerr(format!(
                "build: dim '{}' used in {what} cannot be bound: it is not a dimension of any argument (give some argument a dim that is exactly '{}')",
                v.name, v.name
            )),
            None => Ok(()),
        }
    };
    for t in &all {
        for d in t.shape() {
            check_free(d, &format!("the shape of '{}'", t.name()))?;
        }
        if let Some(b) = t.body() {
            check_free(b, &format!("the body of '{}'", t.name()))?;
        }
        for a in t.axis().iter().chain(t.reduce_axis()) {
            let what = format!("the range of axis '{}' of '{}'", a.var.name, t.name());
            check_free(&a.min, &what)?;
            check_free(&a.extent, &what)?;
        }
    }
    for st in &sched.stages {
        for rel in &st.relations {
            if let Relation::Split { factor, nparts, .. } = rel {
                for e in factor.iter().chain(nparts) {
                    check_free(e, &format!("a split of '{}'", st.tensor.name()))?;
                }
            }
        }
    }
    // Buffers: parameters in argument order, then locals for materialised intermediates.
    let mut buffers = Vec::new();
    let mut buf_of = HashMap::new();
    let mut next = 0u32;
    let mut add = |t: &Tensor, kind: BufKind, buffers: &mut Vec<Buffer>| {
        let id = BufId(next);
        next += 1;
        let strides = (0..t.ndim())
            .map(|d| Var::new(&format!("{}.s{d}", t.name())))
            .collect();
        buffers.push(Buffer {
            id,
            name: t.name().to_string(),
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            strides,
            kind,
            scope: Scope::Global,
            overwritten: false,
        });
        buf_of.insert(t.id(), id);
        id
    };
    let params: Vec<BufId> = args
        .iter()
        .map(|a| {
            add(
                a,
                BufKind::Param {
                    output: !a.is_placeholder(),
                },
                &mut buffers,
            )
        })
        .collect();
    let mut locals = Vec::new();
    for st in &sched.stages {
        if st.attach != Attach::Inline && !args.contains(&st.tensor) {
            let id = add(&st.tensor, BufKind::Local, &mut buffers);
            // Cache stages' buffers are allocated where they are attached (`emit`).
            if st.scope == Scope::Global {
                locals.push(id);
            }
        }
    }
    // One accumulator per stage with a cross-thread reduction (a `local` of one element).
    let mut acc_of = HashMap::new();
    for st in &sched.stages {
        let cross = st
            .leaves
            .iter()
            .any(|l| l.reduce && matches!(l.kind, ForKind::Thread(_)));
        if cross && st.attach != Attach::Inline {
            let id = BufId(next);
            next += 1;
            let name = format!("{}.acc", st.tensor.name());
            buffers.push(Buffer {
                id,
                strides: vec![Var::new(&format!("{name}.s0"))],
                name,
                dtype: st.tensor.dtype(),
                shape: vec![Expr::int(1)],
                kind: BufKind::Local,
                scope: Scope::Local,
                overwritten: false,
            });
            acc_of.insert(st.tensor.id(), id);
        }
    }
    let ctx = Ctx {
        sched,
        buffers: RefCell::new(buffers),
        buf_of,
        inlined,
        acc_of,
        pending_shared: RefCell::new(Vec::new()),
    };
    // compute_at targets must be the only consumer.
    for st in &sched.stages {
        if let Attach::At { consumer, .. } = &st.attach {
            let readers: Vec<&Stage> = sched
                .stages
                .iter()
                .filter(|c| {
                    c.attach != Attach::Inline && reads_through_inlined(&ctx, &c.tensor, &st.tensor)
                })
                .collect();
            if readers.len() != 1 || readers[0].tensor.id() != *consumer {
                return cerr(format!(
                    "schedule of '{}': compute_at needs the target '{}' to be its only consumer",
                    st.tensor.name(),
                    ctx.stage_of(*consumer).tensor.name()
                ));
            }
        }
    }
    // Host callbacks (`ir::callback`): an extern stage is one call, a tap one call right
    // after its stage's nest; both at the top level, in stage order (producers first), which
    // is the order they run in.
    let mut callbacks = Vec::new();
    let mut body = Vec::new();
    for st in &sched.stages {
        if st.attach == Attach::Root {
            if let Some(cb) = st.tensor.extern_callback() {
                let mut bufs = vec![(ctx.buf_of[&st.tensor.id()], true)];
                for i in inputs(&st.tensor) {
                    if ctx.inlined.contains(&i.id()) {
                        return cerr(format!(
                            "schedule of '{}': it is read by extern stage '{}', whose callback receives whole tensors, so it cannot be compute_inline'd",
                            i.name(),
                            st.tensor.name()
                        ));
                    }
                    bufs.push((ctx.buf_of[&i.id()], false));
                }
                body.push(callback_call(&ctx, &mut callbacks, cb.clone(), &bufs));
            } else {
                body.push(ctx.emit(st, None, &Place::Host)?);
            }
            for tap in &st.taps {
                let b = ctx.buf_of[&st.tensor.id()];
                body.push(callback_call(
                    &ctx,
                    &mut callbacks,
                    tap.clone(),
                    &[(b, false)],
                ));
            }
        } else if st.tensor.is_extern() || !st.taps.is_empty() {
            return cerr(format!(
                "schedule of '{}': a stage with a host callback (an extern stage or a debug_tap) must be computed at root: callbacks run once per call at the top level, never inside a loop",
                st.tensor.name()
            ));
        }
    }
    // One flat allocation of every root temporary (one per materialised stage): nesting one
    // `Allocate` per stage made statement depth grow with the number of stages.
    let stmt = Stmt::allocate_all(locals, Stmt::seq(body));
    let depth = stmt.depth();
    if depth > MAX_NEST_DEPTH {
        return cerr(format!(
            "build '{name}': the program's statements nest {depth} deep (loops inside loops: each compute_at nests a stage inside its consumer's loop); rivet accepts at most {MAX_NEST_DEPTH} (limit MAX_STMT_DEPTH = {MAX_STMT_DEPTH}, less {} levels kept for its passes): compute some stages at root instead",
            MAX_STMT_DEPTH - MAX_NEST_DEPTH
        ));
    }
    Ok(PrimFunc {
        name: name.to_string(),
        params,
        buffers: ctx.buffers.into_inner(),
        dims,
        checks: vec![],
        body: stmt,
        kernels: vec![],
        callbacks,
    })
}

/// A call of callback `cb` (added to `table`) on the whole buffers `bufs` (id, written).
fn callback_call(
    ctx: &Ctx,
    table: &mut Vec<crate::ir::callback::Callback>,
    cb: crate::ir::callback::Callback,
    bufs: &[(BufId, bool)],
) -> Stmt {
    let k = table.len() as u32;
    table.push(cb);
    let buffers = ctx.buffers.borrow();
    let regions = bufs
        .iter()
        .map(|&(id, write)| {
            let b = buffers.iter().find(|b| b.id == id).expect("declared");
            crate::ir::intrin::Region {
                buf: id,
                base: vec![Expr::int(0); b.shape.len()],
                axes: b
                    .shape
                    .iter()
                    .enumerate()
                    .map(|(d, e)| crate::ir::intrin::RegionAxis {
                        dim: d as u32,
                        extent: e.clone(),
                    })
                    .collect(),
                write,
            }
        })
        .collect();
    Stmt::Call {
        intrin: crate::ir::intrin::Intrin::Callback(k),
        regions,
        scalars: vec![],
    }
}

/// True when `consumer` reads `producer` directly or through inlined stages.
fn reads_through_inlined(ctx: &Ctx, consumer: &Tensor, producer: &Tensor) -> bool {
    inputs(&ctx.sched.current(consumer)).iter().any(|i| {
        i == producer || (ctx.inlined.contains(&i.id()) && reads_through_inlined(ctx, i, producer))
    })
}

/// Whether the loops of a split, of extents `outer` and `inner`, cover `parent` exactly (no
/// guard needed): equal constants, or a symbolic `parent` whose linear form has every
/// coefficient and its constant divisible by a constant `inner` when `outer` is
/// `ceil(parent / inner)` (a padded extent such as `(ceil(M / 12)) * 12`, the packed GEMM's).
/// Then `outer * inner == parent` for every value of the dims, negative ones included (both
/// loops are empty where `parent <= 0`).
fn split_divides(parent: &Expr, outer: &Expr, inner: &Expr) -> bool {
    let (o, i, p) = (simplify(outer), simplify(inner), simplify(parent));
    if let (Some(o), Some(i), Some(p)) = (o.as_int(), i.as_int(), p.as_int()) {
        return o.checked_mul(i) == Some(p);
    }
    let Some(c) = i.as_int().filter(|c| *c > 0) else {
        return false;
    };
    let ceil = simplify(
        &p.sub(&Expr::int(1))
            .floordiv(&Expr::int(c))
            .add(&Expr::int(1)),
    );
    if ceil != o {
        return false;
    }
    match crate::arith::simplify::linear(&p) {
        Some(l) => l.constant % c == 0 && l.terms.iter().all(|(_, k)| k % c == 0),
        None => false,
    }
}
