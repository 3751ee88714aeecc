//! The test oracle of the analysis: every index node's value over every iteration of a
//! kernel, enumerated exactly (`enumerate_range`). Independent of the intervals of `idx32`
//! (it shares only the walk's choice of narrow nodes), so the property tests
//! (`idx32_tests.rs`) check the analysis against it. Test-only.

use super::{has_load, walk};
use crate::ir::expr::{BinOp, Expr, ExprKind, UnOp, Var};
use crate::ir::stmt::{DeviceFunc, ForKind, PrimFunc, Stmt};
use rivet_runtime::DType;
use std::collections::{HashMap, HashSet};
/// For tests: every index node's value over every iteration of kernel `k`'s loops (blocks,
/// threads, serial loops; both arms of every condition), evaluated exactly from the captured
/// variables' values `env`, as `(lowest, highest)`; `None` when some node is not an index the
/// analysis bounds (a load, a cast), `Err(TooBig)` past `budget` node evaluations.
/// Independent of the intervals of `idx32`: it enumerates.
pub fn enumerate_range(
    func: &PrimFunc,
    k: &DeviceFunc,
    env: &HashMap<u32, i64>,
    budget: u64,
) -> Result<Ranges, Skip> {
    let narrow = walk(func, k, false);
    struct En<'a> {
        func: &'a PrimFunc,
        env: HashMap<u32, i128>,
        lo: i128,
        hi: i128,
        ok: bool,
        budget: u64,
        /// The nodes and variables `Narrow` claims fit int32 for every call, and the range
        /// their values actually reach.
        narrow: (HashSet<usize>, HashSet<u32>),
        nlo: i128,
        nhi: i128,
    }
    impl En<'_> {
        fn note(&mut self, v: i128) -> i128 {
            self.lo = self.lo.min(v);
            self.hi = self.hi.max(v);
            v
        }
        fn scan(&mut self, e: &Expr) {
            match e.kind() {
                ExprKind::Load { indices, .. } => {
                    for i in indices {
                        self.index(i);
                    }
                }
                ExprKind::Cmp(_, a, b)
                    if a.dtype() == DType::I64 && !has_load(a) && !has_load(b) =>
                {
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
                ExprKind::Ramp { .. } | ExprKind::Broadcast { .. } => self.ok = false,
                ExprKind::Const(_) | ExprKind::Var(_) => {}
                _ => {
                    let _ = e.map_children(&mut |c| {
                        self.scan(c);
                        c.clone()
                    });
                }
            }
        }
        fn index(&mut self, e: &Expr) -> i128 {
            if self.budget == 0 {
                return 0;
            }
            self.budget -= 1;
            let v = match e.kind() {
                ExprKind::Const(_) if e.dtype() == DType::I64 => e.as_int().unwrap() as i128,
                ExprKind::Var(v) => match self.env.get(&v.id) {
                    Some(x) => *x,
                    None => {
                        self.ok = false;
                        0
                    }
                },
                ExprKind::Unary(UnOp::Neg, a) => -self.index(a),
                ExprKind::Unary(UnOp::Abs, a) => self.index(a).abs(),
                ExprKind::Binary(op, a, b) => {
                    let (x, y) = (self.index(a), self.index(b));
                    match op {
                        BinOp::Add => x + y,
                        BinOp::Sub => x - y,
                        BinOp::Mul => x.checked_mul(y).unwrap_or(i128::MAX),
                        BinOp::FloorDiv if y == 0 => 0,
                        BinOp::FloorDiv => {
                            x.div_euclid(y) - i128::from(y < 0 && x.rem_euclid(y) != 0)
                        }
                        BinOp::FloorMod if y == 0 => 0,
                        BinOp::FloorMod => {
                            x - y * (x.div_euclid(y) - i128::from(y < 0 && x.rem_euclid(y) != 0))
                        }
                        BinOp::Min => x.min(y),
                        BinOp::Max => x.max(y),
                        _ => {
                            self.ok = false;
                            0
                        }
                    }
                }
                ExprKind::Select(c, a, b) => {
                    self.scan(c);
                    let (x, y) = (self.index(a), self.index(b));
                    // The value is the chosen arm's (a condition of loads: not enumerated).
                    let env = &self.env;
                    let lookup = |v: &Var| env.get(&v.id).and_then(|x| i64::try_from(*x).ok());
                    match crate::codegen::interp::eval_expr(c, &lookup) {
                        Ok(crate::codegen::interp::Value::Int(t)) => {
                            if t != 0 {
                                x
                            } else {
                                y
                            }
                        }
                        _ => {
                            self.ok = false;
                            0
                        }
                    }
                }
                _ => {
                    self.ok = false;
                    0
                }
            };
            if self
                .narrow
                .0
                .contains(&(std::sync::Arc::as_ptr(&e.0) as usize))
                || e.as_var().is_some_and(|x| self.narrow.1.contains(&x.id))
            {
                self.nlo = self.nlo.min(v);
                self.nhi = self.nhi.max(v);
            }
            self.note(v)
        }
        fn stmt(&mut self, s: &Stmt) {
            if !self.ok || self.budget == 0 {
                return;
            }
            match s {
                Stmt::Seq(v) => v.iter().for_each(|s| self.stmt(s)),
                Stmt::For {
                    var,
                    min,
                    extent,
                    kind,
                    body,
                } => {
                    let (lo, n) = match kind {
                        // The kernel never computes a thread loop's extent (the launch's).
                        ForKind::Thread(_) => {
                            let (l, h) = (self.lo, self.hi);
                            let n = self.index(extent);
                            (self.lo, self.hi) = (l, h);
                            (0, n)
                        }
                        _ => {
                            let lo = self.index(min);
                            let n = self.index(extent);
                            self.index(&min.add(extent));
                            (lo, n)
                        }
                    };
                    for i in lo..lo + n {
                        let i = self.note(i);
                        self.env.insert(var.id, i);
                        self.stmt(body);
                    }
                    self.env.remove(&var.id);
                }
                Stmt::Store { indices, value, .. } => {
                    indices.iter().for_each(|i| {
                        self.index(i);
                    });
                    self.scan(value);
                }
                Stmt::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    self.scan(cond);
                    self.stmt(then);
                    if let Some(o) = otherwise {
                        self.stmt(o);
                    }
                }
                Stmt::Let { var, value, body } => {
                    let v = self.index(value);
                    self.env.insert(var.id, v);
                    self.stmt(body);
                }
                Stmt::Allocate { bufs, body } => {
                    for buf in bufs {
                        let b = self.func.buffer(*buf);
                        let mut stride = 1i128;
                        for (d, v) in b.shape.iter().zip(&b.strides).rev() {
                            self.env.insert(v.id, stride);
                            stride *= d.as_int().unwrap() as i128;
                        }
                    }
                    self.stmt(body);
                }
                Stmt::AllReduce { value, .. } => self.scan(value),
                Stmt::Barrier => {}
                Stmt::Launch { .. } | Stmt::Call { .. } => self.ok = false,
            }
        }
    }
    let mut en = En {
        func,
        env: env.iter().map(|(k, v)| (*k, *v as i128)).collect(),
        lo: 0,
        hi: 0,
        narrow: (narrow.narrow_nodes, narrow.narrow_vars),
        nlo: 0,
        nhi: 0,
        ok: true,
        budget,
    };
    for v in &k.vars {
        let x = *env.get(&v.id).ok_or(Skip::NotIndex)? as i128;
        en.note(x);
    }
    en.stmt(&k.body);
    if en.budget == 0 {
        Err(Skip::TooBig)
    } else if !en.ok {
        Err(Skip::NotIndex)
    } else {
        Ok(Ranges {
            all: (en.lo, en.hi),
            narrow: (en.nlo, en.nhi),
        })
    }
}

/// What `enumerate_range` found: the range of every index node's values, and of those the
/// analysis calls narrow (`Narrow`: `int` in the 64-bit kernel too).
#[derive(Debug)]
pub struct Ranges {
    pub all: (i128, i128),
    pub narrow: (i128, i128),
}

/// Why `enumerate_range` gave no range.
#[derive(Debug, PartialEq)]
pub enum Skip {
    /// Some node is not an index the analysis bounds.
    NotIndex,
    /// Over the budget.
    TooBig,
}
