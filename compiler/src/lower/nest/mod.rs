//! Pass 1: schedule -> loop nests (bound inference, schedule application, inlining).
//!
//! Output: a `PrimFunc` whose `Load`/`Store`s are still multi-dimensional (one index per dim;
//! `flatten` comes later), with:
//! - one parameter buffer per argument (its stride variables bound at call time), one local
//!   buffer per materialised intermediate (allocated at the top, full size, compact);
//! - for each stage, its loop nest (`stage`: loops in the schedule's leaf order, reductions);
//! - stages `compute_at` a consumer's loop computed inside that loop (`attach`), GPU memory
//!   caches among them;
//! - a stage bound to a GPU checked against the rules of kernels, a cross-thread reduction
//!   combined across the block (`gpu`);
//! - an extern stage as one `Call` of `Intrin::Callback` on whole buffers, and each debug tap as
//!   one right after its stage's nest, all at the top level (`ir::callback`).
//!
//! Programs past the limits of `ir::limits` are refused before the nest is built (`limits`).
//! This module holds the pass's context (`Ctx`), its entry point (`build_nest`) and the
//! helpers every part uses.

mod attach;
mod gpu;
mod limits;
mod stage;

pub use limits::check_expr_sizes;

use crate::arith::simplify::simplify;
use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, BufId, Expr, ExprKind, ReduceOp, Var};
use crate::ir::limits::{MAX_NEST_DEPTH, MAX_STMT_DEPTH};
use crate::ir::stmt::{BufKind, Buffer, ForKind, PrimFunc, Scope, Stmt};
use crate::schedule::loops::Relation;
use crate::schedule::{Attach, Schedule, Stage};
use crate::te::tensor::{inputs, Tensor};
use gpu::Place;
use limits::{check_attach_depth, check_attach_points, check_sizes, inlined_ids};
use rivet_runtime::DType;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

/// The state of one `build_nest`, shared by its parts (each adds its methods in its own file).
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
}

/// Builds the loop-nest function of `sched` with parameters `args` (inputs and outputs).
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
    check_attach_points(sched)?;
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
