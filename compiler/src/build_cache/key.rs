//! The canonical key of a build: a byte string that two `build` calls share exactly when they
//! build the same program the same way, whatever the identities of their objects.
//!
//! What it holds: a header (the key format, rivet's version, the target with its CPU
//! features and limits, the options, the function's name, the environment settings the
//! pipeline reads per build), then the program: the arguments, the outputs and every stage
//! (loops, split/fuse relations, placement, scope, annotations, intrinsics), with every
//! tensor definition (name, shape, dtype, `stop_gradient`, axes, body) and expression it
//! reaches.
//!
//! Invariants:
//! - Injective: every item is written with a tag and every list or string with its length,
//!   so the bytes decode back to one structure (a prefix-free code); constants are written
//!   bit for bit (`-0.0`, NaN payloads and `1` vs `1.0` differ).
//! - Canonical over identities: variables and tensors are numbered by first occurrence (a
//!   fresh `te.var("n")` in an equal program gets the same number), expression nodes too
//!   (tensors both by node and by id: a rewritten definition keeps its original's id); a
//!   node met again (a shared sub-expression, a tensor read twice) is written as a reference
//!   to its number, so each distinct node is walked once and the key is linear in the DAG's
//!   size, never in the tree's. Two programs that differ only in sharing get different keys
//!   (a miss, never a wrong hit).
//! - No recursion: expressions are walked with an explicit stack, tensors from a queue, so a
//!   chain of 20,000 stages or an expression at the depth limit is as cheap as its size.
//! - Programs that hold host callbacks (extern stages, debug taps) get no key: the callback
//!   is a function object whose identity is not content.

use crate::ir::expr::{Const, Expr, ExprKind, IterVar, Var};
use crate::lower::Options;
use crate::schedule::loops::Relation;
use crate::schedule::{Attach, Schedule};
use crate::target::Target;
use crate::te::tensor::{Op, Tensor};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// The key format; part of every key.
const KEY_FORMAT: u32 = 1;

/// The canonical bytes of building `sched` with `args` for `target` as `name` with `opts`
/// (`fuse_rows` the `RIVET_FUSE_ROWS` setting the build applies), or `None` when the program
/// cannot be keyed (host callbacks).
pub fn encode(
    sched: &Schedule,
    args: &[Tensor],
    target: &Target,
    name: &str,
    opts: Options,
    fuse_rows: bool,
) -> Option<Vec<u8>> {
    let mut e = Encoder::default();
    e.str(&format!(
        "rivet-build-key {KEY_FORMAT} rivet {}",
        env!("CARGO_PKG_VERSION")
    ));
    e.str(&format!("{target:?}"));
    e.str(&format!("{opts:?}"));
    e.str(name);
    e.u64(fuse_rows as u64);
    e.u64(args.len() as u64);
    for t in args {
        e.tensor(t);
    }
    e.u64(sched.outputs.len() as u64);
    for t in &sched.outputs {
        e.tensor(t);
    }
    // Every stage's tensor numbered first, so `compute_at` can name a later consumer.
    e.u64(sched.stages.len() as u64);
    for st in &sched.stages {
        e.tensor(&st.tensor);
    }
    for st in &sched.stages {
        if !st.taps.is_empty() {
            return None;
        }
        e.u64(st.leaves.len() as u64);
        for l in &st.leaves {
            e.var(&l.var);
            e.u64(l.reduce as u64);
            e.str(&format!("{:?}", l.kind));
        }
        e.u64(st.relations.len() as u64);
        for r in &st.relations {
            match r {
                Relation::Split {
                    parent,
                    outer,
                    inner,
                    factor,
                    nparts,
                } => {
                    e.tag(b'S');
                    e.var(parent);
                    e.var(outer);
                    e.var(inner);
                    for x in [factor, nparts] {
                        match x {
                            Some(x) => {
                                e.tag(b'1');
                                e.expr(x);
                            }
                            None => e.tag(b'0'),
                        }
                    }
                }
                Relation::Fuse {
                    outer,
                    inner,
                    fused,
                } => {
                    e.tag(b'F');
                    e.var(outer);
                    e.var(inner);
                    e.var(fused);
                }
            }
        }
        match &st.attach {
            Attach::Root => e.tag(b'r'),
            Attach::Inline => e.tag(b'i'),
            Attach::At { consumer, var } => {
                e.tag(b'a');
                // A consumer that is no stage's tensor is numbered like any id seen here.
                let n = e.tensor_number_by_id(*consumer);
                e.u64(n);
                e.var(var);
            }
        }
        e.str(&format!("{:?}", st.scope));
        e.u64(st.tensorize.len() as u64);
        for (v, i) in &st.tensorize {
            e.var(v);
            e.str(&format!("{i:?}"));
        }
    }
    // The definitions of every tensor met (and of those their bodies read), in order.
    while let Some(t) = e.pending.pop_front() {
        if !e.definition(&t) {
            return None;
        }
    }
    Some(e.out)
}

#[derive(Default)]
struct Encoder {
    out: Vec<u8>,
    vars: HashMap<u32, u64>,
    /// Tensor nodes by address (each definition written once), kept alive by `pending` and
    /// `keep_tensors` while numbered.
    tensor_nodes: HashMap<usize, u64>,
    keep_tensors: Vec<Tensor>,
    /// Tensor identities (`Tensor::id`) by first occurrence: a rewritten definition
    /// (`cache_write`, `set_definition`) shares its original's id, and the pipeline matches
    /// stages by id, so both the node and its id are in the key.
    tensor_ids: HashMap<u32, u64>,
    /// Expression nodes by address, alive while `keep` holds them.
    exprs: HashMap<usize, u64>,
    keep: Vec<Expr>,
    pending: VecDeque<Tensor>,
}

impl Encoder {
    fn tag(&mut self, t: u8) {
        self.out.push(t);
    }

    fn u64(&mut self, v: u64) {
        // LEB128: short for the small numbers most items are.
        let mut v = v;
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.out.push(b);
                return;
            }
            self.out.push(b | 0x80);
        }
    }

    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.out.extend_from_slice(s.as_bytes());
    }

    /// A variable: its number, and its name the first time (names reach messages).
    fn var(&mut self, v: &Var) {
        let next = self.vars.len() as u64;
        match self.vars.get(&v.id) {
            Some(&n) => {
                self.tag(b'v');
                self.u64(n);
            }
            None => {
                self.vars.insert(v.id, next);
                self.tag(b'V');
                self.str(&v.name);
            }
        }
    }

    fn tensor_number_by_id(&mut self, id: u32) -> u64 {
        let next = self.tensor_ids.len() as u64;
        *self.tensor_ids.entry(id).or_insert(next)
    }

    /// A tensor reference: its node's number, and the first time its identity's number (its
    /// definition is written later, from the queue).
    fn tensor(&mut self, t: &Tensor) {
        let addr = Arc::as_ptr(&t.0) as usize;
        if let Some(&n) = self.tensor_nodes.get(&addr) {
            self.tag(b'T');
            self.u64(n);
            return;
        }
        let next = self.tensor_nodes.len() as u64;
        self.tensor_nodes.insert(addr, next);
        self.keep_tensors.push(t.clone());
        self.pending.push_back(t.clone());
        self.tag(b'N');
        let id = self.tensor_number_by_id(t.id());
        self.u64(id);
    }

    /// A tensor's definition; false for an extern stage (a host callback).
    fn definition(&mut self, t: &Tensor) -> bool {
        self.tag(b'D');
        let n = self.tensor_nodes[&(Arc::as_ptr(&t.0) as usize)];
        self.u64(n);
        self.str(t.name());
        self.str(t.dtype().name());
        self.u64(t.0.stop_gradient as u64);
        self.u64(t.0.shape.len() as u64);
        for s in &t.0.shape {
            self.expr(s);
        }
        match &t.0.op {
            Op::Placeholder => self.tag(b'p'),
            Op::Compute { axis, body } => {
                self.tag(b'c');
                self.u64(axis.len() as u64);
                for a in axis {
                    self.iter_var(a);
                }
                self.expr(body);
            }
            Op::Extern { .. } => return false,
        }
        true
    }

    fn iter_var(&mut self, a: &IterVar) {
        self.var(&a.var);
        self.u64(a.reduce as u64);
        self.expr(&a.min);
        self.expr(&a.extent);
    }

    /// An expression, pre-order, each distinct node once (an explicit stack, no recursion).
    fn expr(&mut self, root: &Expr) {
        let mut stack: Vec<&Expr> = vec![root];
        // The nodes pushed live in `root`'s DAG, which outlives this call; `keep` holds each
        // numbered node so that its address is never reused while the map has it.
        let mut kids: Vec<&Expr> = Vec::new();
        while let Some(e) = stack.pop() {
            let addr = Arc::as_ptr(&e.0) as usize;
            if let Some(&n) = self.exprs.get(&addr) {
                self.tag(b'e');
                self.u64(n);
                continue;
            }
            let next = self.exprs.len() as u64;
            self.exprs.insert(addr, next);
            self.keep.push(e.clone());
            self.tag(b'E');
            self.str(e.dtype().name());
            kids.clear();
            match e.kind() {
                ExprKind::Const(Const::Int(v)) => {
                    self.tag(b'i');
                    self.out.extend_from_slice(&v.to_le_bytes());
                }
                ExprKind::Const(Const::Float(v)) => {
                    self.tag(b'f');
                    self.out.extend_from_slice(&v.to_bits().to_le_bytes());
                }
                ExprKind::Var(v) => {
                    self.tag(b'x');
                    self.var(v);
                }
                ExprKind::Unary(op, a) => {
                    self.tag(b'u');
                    self.str(&format!("{op:?}"));
                    kids.push(a);
                }
                ExprKind::Cast(a) => {
                    self.tag(b'k');
                    kids.push(a);
                }
                ExprKind::Binary(op, a, b) => {
                    self.tag(b'b');
                    self.str(&format!("{op:?}"));
                    kids.extend([a, b]);
                }
                ExprKind::Cmp(op, a, b) => {
                    self.tag(b'm');
                    self.str(&format!("{op:?}"));
                    kids.extend([a, b]);
                }
                ExprKind::Logic(op, a, b) => {
                    self.tag(b'l');
                    self.str(&format!("{op:?}"));
                    kids.extend([a, b]);
                }
                ExprKind::Fma(a, b, c) => {
                    self.tag(b'F');
                    kids.extend([a, b, c]);
                }
                ExprKind::Select(c, a, b) => {
                    self.tag(b's');
                    kids.extend([c, a, b]);
                }
                ExprKind::Read { tensor, indices } => {
                    self.tag(b'R');
                    self.tensor(&Tensor::of(tensor));
                    self.u64(indices.len() as u64);
                    kids.extend(indices);
                }
                ExprKind::Reduce { op, body, axes } => {
                    self.tag(b'r');
                    self.str(&format!("{op:?}"));
                    self.u64(axes.len() as u64);
                    for a in axes {
                        self.var(&a.var);
                        self.u64(a.reduce as u64);
                        kids.extend([&a.min, &a.extent]);
                    }
                    kids.push(body);
                }
                ExprKind::Load { buf, indices } => {
                    self.tag(b'L');
                    self.u64(buf.0 as u64);
                    self.u64(indices.len() as u64);
                    kids.extend(indices);
                }
                ExprKind::Invalid(m) => {
                    self.tag(b'!');
                    self.str(m);
                }
                ExprKind::Ramp {
                    base,
                    stride,
                    lanes,
                } => {
                    self.tag(b'p');
                    self.u64(*lanes as u64);
                    kids.extend([base, stride]);
                }
                ExprKind::Broadcast { value, lanes } => {
                    self.tag(b'B');
                    self.u64(*lanes as u64);
                    kids.push(value);
                }
            }
            // Children in order: pushed reversed, popped first to last.
            stack.extend(kids.drain(..).rev());
        }
    }
}
