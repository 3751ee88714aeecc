//! 32-bit index arithmetic: when a GPU kernel may compute its indices in `int`.
//!
//! 64-bit integer multiplies and adds cost several 32-bit instructions on NVIDIA GPUs and
//! twice the registers, so every kernel is generated with 32-bit index arithmetic where this
//! analysis proves it exact, and with the 64-bit arithmetic of `source` elsewhere.
//!
//! *Index nodes* are the int64 nodes the generator emits as plain signed arithmetic (see
//! `source::expr`): each node of a load/store offset, of a serial loop's `min`, `extent` and end
//! `min + extent`, of an int64 `let` value, of an operand of an int64 comparison that reads no
//! memory, the loop, thread and block variables, and the kernel's captured int64 variables
//! (dims, strides, host `let`s: in the 32-bit variant they are `int` parameters). The 32-bit
//! variant computes every one of them in `int`; it is exact (no C++ overflow, which would be
//! undefined behaviour) when every index node's value lies in `[i32::MIN, i32::MAX]`, the
//! final offsets and every intermediate node alike.
//!
//! `analyse` bounds every index node by an interval `[lo, hi]` whose endpoints are expressions
//! over the kernel's captured variables (loop, thread and `let` variables are ranged; the
//! captured ones are single values). The rules are exact-integer interval arithmetic that make
//! no assumption on signs (strides can be negative: numpy views), unlike `arith::interval`,
//! whose folds assume every variable is a non-negative size — right for the proof over dims
//! before flattening, wrong for flattened offsets over strides. Guards of enclosing `if`s are
//! ignored (an index computed in a condition is computed whatever its outcome, and ignoring a
//! guard only widens an interval). The result, per kernel:
//! - `Always`: every endpoint is a constant inside int32 (thread indices, constant-extent
//!   loops, local and shared buffers, static shapes): only the 32-bit kernel is generated;
//! - `Never`: some endpoint is a constant outside int32, or some index node cannot be bounded
//!   (an index read from memory, a cast): only the 64-bit kernel is generated;
//! - `When(ends)`: both are generated, and each call launches the 32-bit one when `fits`
//!   says every endpoint, evaluated on the host from the call's values in checked int64
//!   arithmetic, lies inside int32 (an endpoint whose own evaluation overflows does not fit).
//!
//! The same intervals say what the 64-bit kernel may compute in `int` (`Narrow`): the nodes
//! and variables whose interval has constant endpoints inside int32 (thread indices, constant
//! loops, local and shared offsets), which fit for every call.
//!
//! Soundness: each node's value lies in its interval (the rules below, for every value of the
//! ranged variables within theirs), so when every endpoint fits, every node's value fits.
//! Conservative, never wrong: a call that could fit may still get the 64-bit kernel (a loop of
//! a split axis reaches `ceil(n / f) * f - 1`, not `n - 1`).

#[cfg(test)]
mod enumerate;
#[cfg(test)]
pub use enumerate::{enumerate_range, Ranges, Skip};

use crate::ir::expr::{BinOp, Expr, ExprKind, UnOp, Var};
use crate::ir::stmt::{DeviceFunc, ForKind, PrimFunc, Stmt};
use rivet_runtime::DType;
use std::collections::{HashMap, HashSet};

/// Which index widths a kernel is generated with, and when the 32-bit one runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Index32 {
    /// 32 bits suffice for every call: only the 32-bit kernel exists.
    Always,
    /// Only the 64-bit kernel exists; the reason, for the source's comment.
    Never(String),
    /// Both exist; the 32-bit one runs when every expression (over the kernel's captured
    /// variables) evaluates inside int32.
    When(Vec<Expr>),
}

impl Index32 {
    /// Whether a call with the captured variables' values `lookup` may run the 32-bit kernel.
    pub fn fits(&self, lookup: &dyn Fn(&Var) -> Option<i64>) -> bool {
        match self {
            Index32::Always => true,
            Index32::Never(_) => false,
            Index32::When(ends) => ends
                .iter()
                .all(|e| eval(e, lookup).is_some_and(|v| i32::try_from(v).is_ok())),
        }
    }
    /// Whether the 64-bit kernel is generated.
    pub fn has64(&self) -> bool {
        !matches!(self, Index32::Always)
    }
    /// Whether the 32-bit kernel is generated.
    pub fn has32(&self) -> bool {
        !matches!(self, Index32::Never(_))
    }
}

/// Exact evaluation of an endpoint: `None` on an overflow of int64 (or an unbound variable),
/// which the caller reads as "does not fit". No allocation (it runs per call).
fn eval(e: &Expr, lookup: &dyn Fn(&Var) -> Option<i64>) -> Option<i64> {
    match e.kind() {
        ExprKind::Var(v) => lookup(v),
        ExprKind::Unary(UnOp::Neg, a) => eval(a, lookup)?.checked_neg(),
        ExprKind::Binary(op, a, b) => {
            let (x, y) = (eval(a, lookup)?, eval(b, lookup)?);
            match op {
                BinOp::Add => x.checked_add(y),
                BinOp::Sub => x.checked_sub(y),
                BinOp::Mul => x.checked_mul(y),
                // Endpoints divide only by positive or negative constants (never 0, never -1
                // of MIN: `checked_div_euclid` would refuse it anyway).
                BinOp::FloorDiv if y != 0 => {
                    let q = x.checked_div(y)?;
                    Some(if (x % y != 0) && ((x < 0) != (y < 0)) {
                        q - 1
                    } else {
                        q
                    })
                }
                BinOp::Min => Some(x.min(y)),
                BinOp::Max => Some(x.max(y)),
                _ => None,
            }
        }
        _ => e.as_int(),
    }
}

/// An interval of exact integers, endpoints over the captured variables.
#[derive(Clone, Debug)]
struct Iv {
    lo: Expr,
    hi: Expr,
}

impl Iv {
    fn point(e: Expr) -> Iv {
        Iv {
            lo: e.clone(),
            hi: e,
        }
    }
}

// Endpoint constructors folding constants (exactly: a fold that would overflow int64 is left
// unfolded, and its evaluation then fails, which reads as "does not fit").
fn fold(op: BinOp, a: &Expr, b: &Expr) -> Expr {
    if let (Some(x), Some(y)) = (a.as_int(), b.as_int()) {
        let v = match op {
            BinOp::Add => x.checked_add(y),
            BinOp::Sub => x.checked_sub(y),
            BinOp::Mul => x.checked_mul(y),
            BinOp::Min => Some(x.min(y)),
            BinOp::Max => Some(x.max(y)),
            BinOp::FloorDiv => eval(&a.floordiv(b), &|_| None),
            _ => None,
        };
        if let Some(v) = v {
            return Expr::int(v);
        }
    }
    match op {
        BinOp::Add if a.as_int() == Some(0) => return b.clone(),
        BinOp::Add | BinOp::Sub if b.as_int() == Some(0) => return a.clone(),
        // 0 * x is 0 and 1 * x is x exactly, for every x.
        BinOp::Mul if a.as_int() == Some(0) || b.as_int() == Some(0) => return Expr::int(0),
        BinOp::Mul if a.as_int() == Some(1) => return b.clone(),
        BinOp::Mul if b.as_int() == Some(1) => return a.clone(),
        BinOp::Min | BinOp::Max if a == b => return a.clone(),
        _ => {}
    }
    match op {
        BinOp::Add => a.add(b),
        BinOp::Sub => a.sub(b),
        BinOp::Mul => a.mul(b),
        BinOp::Min => a.min_(b),
        BinOp::Max => a.max_(b),
        BinOp::FloorDiv => a.floordiv(b),
        _ => unreachable!("endpoints use + - * // min max"),
    }
}
fn add(a: &Expr, b: &Expr) -> Expr {
    fold(BinOp::Add, a, b)
}
fn sub(a: &Expr, b: &Expr) -> Expr {
    fold(BinOp::Sub, a, b)
}
fn mul(a: &Expr, b: &Expr) -> Expr {
    fold(BinOp::Mul, a, b)
}
fn min(a: &Expr, b: &Expr) -> Expr {
    fold(BinOp::Min, a, b)
}
fn max(a: &Expr, b: &Expr) -> Expr {
    fold(BinOp::Max, a, b)
}
fn neg(a: &Expr) -> Expr {
    sub(&Expr::int(0), a)
}

/// The analysis of one kernel (see the module header), and what is `int` in its 64-bit
/// version.
pub fn analyse(func: &PrimFunc, k: &DeviceFunc) -> (Index32, Narrow) {
    let w = walk(func, k, false);
    let narrow = Narrow {
        nodes: w.narrow_nodes,
        vars: w.narrow_vars,
    };
    let index32 = if let Some(why) = w.never {
        Index32::Never(why)
    } else if w.ends.is_empty() {
        Index32::Always
    } else {
        Index32::When(w.ends)
    };
    (index32, narrow)
}

/// What the 64-bit kernel computes in `int` anyway: the index nodes and the variables whose
/// interval has constant endpoints inside int32 for every call (thread indices, constant
/// loops, local and shared buffer offsets).
#[derive(Debug, Clone, Default)]
pub struct Narrow {
    /// Index nodes (by address: `Expr` nodes are shared, and a node's interval depends only
    /// on the variables it reads, whose intervals are fixed) with such an interval. Only the
    /// kernel's own nodes are looked up, and they stay alive from the analysis to the end of
    /// code generation, so no temporary node of the analysis can have one of their addresses.
    nodes: HashSet<usize>,
    /// Loop, thread and `let` variables whose values, and whose loop's bounds and end, are.
    vars: HashSet<u32>,
}

impl Narrow {
    /// The index node `e`'s value lies in int32 for every call.
    pub fn node(&self, e: &Expr) -> bool {
        self.nodes
            .contains(&(std::sync::Arc::as_ptr(&e.0) as usize))
    }
    /// The variable can be declared `int` in every kernel.
    pub fn var(&self, v: &Var) -> bool {
        self.vars.contains(&v.id)
    }
}

/// Both endpoints constants inside int32.
fn static_narrow(iv: &Iv) -> bool {
    [&iv.lo, &iv.hi]
        .iter()
        .all(|e| eval(e, &|_| None).is_some_and(|v| i32::try_from(v).is_ok()))
}

fn walk(func: &PrimFunc, k: &DeviceFunc, all: bool) -> Walk {
    let mut w = Walk {
        vars: HashMap::new(),
        nonneg: func.dims.iter().map(|v| v.id).collect(),
        ends: Vec::new(),
        seen: HashSet::new(),
        never: None,
        all,
        narrow_nodes: HashSet::new(),
        narrow_vars: HashSet::new(),
    };
    for v in &k.vars {
        w.vars.insert(v.id, Iv::point(Expr::var(v)));
        w.push(&Iv::point(Expr::var(v)));
    }
    w.stmt(func, &k.body);
    w
}

/// For tests: every endpoint of every index node of kernel `k`, constants included (so their
/// lowest and highest values bound every index value, whatever the threshold), or `None` when
/// some node cannot be bounded.
pub fn endpoints(func: &PrimFunc, k: &DeviceFunc) -> Option<Vec<Expr>> {
    let w = walk(func, k, true);
    w.never.is_none().then_some(w.ends)
}

/// `eval` for tests: an endpoint's value, `None` on an int64 overflow.
pub fn eval_endpoint(e: &Expr, lookup: &dyn Fn(&Var) -> Option<i64>) -> Option<i64> {
    eval(e, lookup)
}

struct Walk {
    /// Intervals of the variables in scope (captured ones are points).
    vars: HashMap<u32, Iv>,
    /// Captured variables known non-negative (dims: sizes), for smaller endpoints.
    nonneg: HashSet<u32>,
    /// The endpoints to check per call, each once.
    ends: Vec<Expr>,
    seen: HashSet<String>,
    /// Why the 32-bit variant is impossible, once found.
    never: Option<String>,
    /// Keep every endpoint, constants too, and decide nothing (`endpoints`).
    all: bool,
    /// `Narrow`'s parts.
    narrow_nodes: HashSet<usize>,
    narrow_vars: HashSet<u32>,
}

impl Walk {
    fn never(&mut self, why: String) -> Option<Iv> {
        self.never.get_or_insert(why);
        None
    }

    /// Records a node's interval: constants are decided now, the rest per call.
    fn push(&mut self, iv: &Iv) {
        for e in [&iv.lo, &iv.hi] {
            let mut vars = false;
            e.visit(&mut |n| vars |= n.as_var().is_some());
            if self.all {
                if self.seen.insert(e.to_string()) {
                    self.ends.push(e.clone());
                }
            } else if !vars {
                match eval(e, &|_| None) {
                    Some(v) if i32::try_from(v).is_ok() => {}
                    _ => {
                        self.never.get_or_insert(format!(
                            "an index can reach {}, outside int32",
                            crate::arith::simplify::simplify(e)
                        ));
                    }
                }
            } else if self.seen.insert(e.to_string()) {
                self.ends.push(e.clone());
            }
        }
    }

    /// True when the endpoint `e` is never negative (constants, dims, and what keeps that).
    fn nonneg(&self, e: &Expr) -> bool {
        match e.kind() {
            ExprKind::Var(v) => self.nonneg.contains(&v.id),
            ExprKind::Binary(BinOp::Add | BinOp::Mul | BinOp::Min, a, b) => {
                self.nonneg(a) && self.nonneg(b)
            }
            ExprKind::Binary(BinOp::Max, a, b) => self.nonneg(a) || self.nonneg(b),
            ExprKind::Binary(BinOp::FloorDiv, a, b) => {
                self.nonneg(a) && b.as_int().is_some_and(|d| d > 0)
            }
            _ => e.as_int().is_some_and(|v| v >= 0),
        }
    }

    /// Walks the whole body even once `never` is set (`Narrow` covers every node); a
    /// variable whose interval is unknown stays out of `vars`, so what reads it is unknown.
    fn stmt(&mut self, func: &PrimFunc, s: &Stmt) {
        match s {
            Stmt::Seq(v) => v.iter().for_each(|s| self.stmt(func, s)),
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => {
                let (iv, bounds_narrow) = match kind {
                    // `const int v = (int)blockIdx.x` / `threadIdx.x`: in [0, extent - 1]
                    // (the verifier: min 0; the host launches at most 2^31 - 1 blocks).
                    ForKind::Thread(_) => (
                        Some(Iv {
                            lo: Expr::int(0),
                            hi: sub(extent, &Expr::int(1)),
                        }),
                        true,
                    ),
                    _ => match (
                        self.index(min),
                        self.index(extent),
                        self.index(&min.add(extent)),
                    ) {
                        (Some(lo), Some(n), Some(end)) => (
                            Some(Iv {
                                lo: lo.lo.clone(),
                                hi: sub(&end.hi, &Expr::int(1)),
                            }),
                            // An `int` loop variable needs its bounds and end in int too.
                            [&lo, &n, &end].iter().all(|i| static_narrow(i)),
                        ),
                        _ => (None, false),
                    },
                };
                match iv {
                    Some(iv) => {
                        self.push(&iv);
                        if bounds_narrow && static_narrow(&iv) {
                            self.narrow_vars.insert(var.id);
                        }
                        self.vars.insert(var.id, iv);
                    }
                    None => {
                        self.vars.remove(&var.id);
                    }
                }
                self.stmt(func, body);
            }
            Stmt::Store { indices, value, .. } => {
                for i in indices {
                    self.index(i);
                }
                self.scan(value);
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                self.scan(cond);
                self.stmt(func, then);
                if let Some(o) = otherwise {
                    self.stmt(func, o);
                }
            }
            Stmt::Let { var, value, body } => {
                if value.dtype() != DType::I64 {
                    self.never(format!("the {} let '{}'", value.dtype(), var.name));
                    return;
                }
                match self.index(value) {
                    Some(iv) => {
                        if static_narrow(&iv) {
                            self.narrow_vars.insert(var.id);
                        }
                        self.vars.insert(var.id, iv);
                    }
                    None => {
                        self.vars.remove(&var.id);
                    }
                }
                self.stmt(func, body);
            }
            Stmt::Allocate { bufs, body } => {
                for buf in bufs {
                    // Local and shared buffers: constant shapes, compact constant strides.
                    let b = func.buffer(*buf);
                    let mut stride: i64 = 1;
                    for (d, v) in b.shape.iter().zip(&b.strides).rev() {
                        let iv = Iv::point(Expr::int(stride));
                        self.push(&iv);
                        if static_narrow(&iv) {
                            self.narrow_vars.insert(v.id);
                        }
                        self.vars.insert(v.id, iv);
                        stride = stride.saturating_mul(d.as_int().unwrap_or(i64::MAX).max(0));
                    }
                }
                self.stmt(func, body);
            }
            Stmt::Barrier => {}
            Stmt::AllReduce { value, .. } => self.scan(value),
            Stmt::Launch { .. } => {
                self.never("a launch inside a kernel".into());
            }
            Stmt::Call { .. } => {
                self.never("an intrinsic call".into());
            }
        }
    }

    /// An expression in value context: finds the index roots inside it (load offsets, the
    /// operands of int64 comparisons that read no memory), as `KernelGen::expr` does.
    fn scan(&mut self, e: &Expr) {
        match e.kind() {
            ExprKind::Load { indices, .. } => {
                for i in indices {
                    self.index(i);
                }
            }
            ExprKind::Cmp(_, a, b) if a.dtype() == DType::I64 && !has_load(a) && !has_load(b) => {
                self.index(a);
                self.index(b);
            }
            ExprKind::Cast(a) | ExprKind::Unary(_, a) => self.scan(a),
            ExprKind::Binary(_, a, b) | ExprKind::Cmp(_, a, b) | ExprKind::Logic(_, a, b) => {
                self.scan(a);
                self.scan(b);
            }
            ExprKind::Select(c, a, b) => {
                self.scan(c);
                self.scan(a);
                self.scan(b);
            }
            // Vector IR: lanes of int64 index arithmetic the analysis does not bound; only
            // the 64-bit kernel.
            ExprKind::Ramp { .. } | ExprKind::Broadcast { .. } => {
                self.never(format!("the vector expression `{e}`"));
            }
            ExprKind::Const(_) | ExprKind::Var(_) => {}
            // Any other node (an `Fma`, kinds added later): its operands may hold index roots.
            _ => {
                let _ = e.map_children(&mut |c| {
                    self.scan(c);
                    c.clone()
                });
            }
        }
    }

    /// The interval of the index node `e` (and of each node below it, all recorded), or
    /// `None` when it cannot be bounded (`never` set).
    fn index(&mut self, e: &Expr) -> Option<Iv> {
        if e.dtype() != DType::I64 {
            self.scan(e);
            return self.never(format!("the {} index `{e}`", e.dtype()));
        }
        let iv = match e.kind() {
            ExprKind::Const(_) => Iv::point(Expr::int(e.as_int()?)),
            ExprKind::Var(v) => match self.vars.get(&v.id) {
                Some(iv) => iv.clone(),
                None => return self.never(format!("the unbound variable '{}'", v.name)),
            },
            ExprKind::Unary(UnOp::Neg, a) => {
                let a = self.index(a)?;
                Iv {
                    lo: neg(&a.hi),
                    hi: neg(&a.lo),
                }
            }
            // |x| <= max(-lo, hi); abs(MIN) overflows, and then `-lo` is out of range too.
            ExprKind::Unary(UnOp::Abs, a) => {
                let a = self.index(a)?;
                Iv {
                    lo: Expr::int(0),
                    hi: max(&neg(&a.lo), &a.hi),
                }
            }
            ExprKind::Binary(op, a, b) => {
                let x = self.index(a)?;
                let y = self.index(b)?;
                self.binary(*op, &x, &y, b)?
            }
            ExprKind::Select(c, a, b) => {
                self.scan(c);
                let x = self.index(a)?;
                let y = self.index(b)?;
                Iv {
                    lo: min(&x.lo, &y.lo),
                    hi: max(&x.hi, &y.hi),
                }
            }
            ExprKind::Load { indices, .. } => {
                for i in indices {
                    self.index(i);
                }
                return self.never(format!("the index `{e}` read from memory"));
            }
            _ => {
                self.scan(e);
                return self.never(format!("the index `{e}`"));
            }
        };
        self.push(&iv);
        if static_narrow(&iv) {
            self.narrow_nodes
                .insert(std::sync::Arc::as_ptr(&e.0) as usize);
        }
        Some(iv)
    }

    fn binary(&mut self, op: BinOp, x: &Iv, y: &Iv, b: &Expr) -> Option<Iv> {
        let k = b.as_int();
        Some(match op {
            BinOp::Add => Iv {
                lo: add(&x.lo, &y.lo),
                hi: add(&x.hi, &y.hi),
            },
            BinOp::Sub => Iv {
                lo: sub(&x.lo, &y.hi),
                hi: sub(&x.hi, &y.lo),
            },
            BinOp::Mul => self.product(x, y),
            BinOp::FloorDiv => match k {
                // Monotonic in x: increasing for k > 0, decreasing for k < 0; `// 0` is 0.
                Some(0) => Iv::point(Expr::int(0)),
                Some(k) if k > 0 => Iv {
                    lo: fold(BinOp::FloorDiv, &x.lo, b),
                    hi: fold(BinOp::FloorDiv, &x.hi, b),
                },
                Some(_) => Iv {
                    lo: fold(BinOp::FloorDiv, &x.hi, b),
                    hi: fold(BinOp::FloorDiv, &x.lo, b),
                },
                // Any divisor d: |x // d| <= |x| for d != 0 (and 0 for d = 0), so the result
                // lies in [min(lo, -hi), max(hi, -lo)] (MIN // -1 = -MIN: outside, as it is).
                None => Iv {
                    lo: min(&x.lo, &neg(&x.hi)),
                    hi: max(&x.hi, &neg(&x.lo)),
                },
            },
            // Python's `%` takes the divisor's sign: in [d + 1, 0] for d < 0, [0, d - 1] for
            // d > 0, 0 for d = 0.
            BinOp::FloorMod => match k {
                Some(k) => Iv {
                    lo: Expr::int((k + 1).min(0)),
                    hi: Expr::int((k - 1).max(0)),
                },
                None => Iv {
                    lo: min(&Expr::int(0), &add(&y.lo, &Expr::int(1))),
                    hi: max(&Expr::int(0), &sub(&y.hi, &Expr::int(1))),
                },
            },
            BinOp::Min => Iv {
                lo: min(&x.lo, &y.lo),
                hi: min(&x.hi, &y.hi),
            },
            BinOp::Max => Iv {
                lo: max(&x.lo, &y.lo),
                hi: max(&x.hi, &y.hi),
            },
            BinOp::Div | BinOp::Pow => return self.never(format!("the index operator {op:?}")),
        })
    }

    /// `[a.lo, a.hi] * [b.lo, b.hi]`: the extremes are among the four corner products; fewer
    /// when signs are known (a constant factor, two non-negative ranges, a single value).
    fn product(&self, a: &Iv, b: &Iv) -> Iv {
        for (r, p) in [(a, b), (b, a)] {
            if let Some(k) = p.lo.as_int().filter(|_| p.lo == p.hi) {
                let (l, h) = (mul(&r.lo, &p.lo), mul(&r.hi, &p.lo));
                return if k >= 0 {
                    Iv { lo: l, hi: h }
                } else {
                    Iv { lo: h, hi: l }
                };
            }
        }
        if self.nonneg(&a.lo) && self.nonneg(&b.lo) {
            return Iv {
                lo: mul(&a.lo, &b.lo),
                hi: mul(&a.hi, &b.hi),
            };
        }
        for (r, p) in [(a, b), (b, a)] {
            if p.lo == p.hi {
                let (l, h) = (mul(&r.lo, &p.lo), mul(&r.hi, &p.lo));
                return Iv {
                    lo: min(&l, &h),
                    hi: max(&l, &h),
                };
            }
        }
        let c = [
            mul(&a.lo, &b.lo),
            mul(&a.lo, &b.hi),
            mul(&a.hi, &b.lo),
            mul(&a.hi, &b.hi),
        ];
        Iv {
            lo: min(&min(&c[0], &c[1]), &min(&c[2], &c[3])),
            hi: max(&max(&c[0], &c[1]), &max(&c[2], &c[3])),
        }
    }
}

/// True when evaluating `e` reads memory.
fn has_load(e: &Expr) -> bool {
    let mut found = false;
    e.visit_unique(&mut |n| found |= matches!(n.kind(), ExprKind::Load { .. }));
    found
}
