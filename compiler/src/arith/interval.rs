//! Interval arithmetic on int64 index expressions, with symbolic endpoints.
//!
//! `interval(e, env)` bounds `e` by `[lo, hi]` (inclusive), where the endpoints are expressions
//! over the variables `env` does not range over (symbolic dims, outer loops kept fixed). Sound:
//! every value `e` takes, for every value of the ranged variables within their intervals and
//! under the recorded guards, lies in the result; `None` means "cannot bound".
//!
//! Endpoints are exact integers (mathematical, never wrapping): the bounds proof is sound for
//! generated code, which computes in wrapping int64, only together with the proof that no
//! int64 node of a program overflows. `Env::record` collects the interval of every node
//! analysed, and the bounds pass turns each endpoint into that obligation (`bounds.rs`).
//!
//! Guards are facts `lo <= g <= hi` about a sub-expression `g`, learned from enclosing `if`s
//! (split remainders); they apply where `g` occurs structurally, so indices must be analysed
//! before simplification rewrites them.

use super::simplify::{prove_nonneg, simplify};
use crate::ir::expr::{BinOp, CmpOp, Const, Expr, ExprKind, LogicOp, Var};
use rivet_runtime::DType;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

#[derive(Clone, Debug)]
pub struct Interval {
    pub lo: Expr,
    pub hi: Expr,
}

impl Interval {
    pub fn point(e: &Expr) -> Interval {
        Interval {
            lo: e.clone(),
            hi: e.clone(),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Env {
    pub vars: HashMap<Var, Interval>,
    /// Loop variables with their (min, extent), for the fused-loop rule below.
    pub loops: HashMap<Var, (Expr, Expr)>,
    /// `(g, lower bound, upper bound)` facts.
    pub guards: Vec<(Expr, Option<Expr>, Option<Expr>)>,
    /// When set, every node `interval` bounds is recorded here with its interval (shared by
    /// the clones of an environment): the no-overflow obligations of the bounds proof.
    pub record: Option<Record>,
}

/// Nodes with their intervals, as `Env::record` collects them.
pub type Record = Rc<RefCell<Vec<(Expr, Interval)>>>;

impl Env {
    /// Records what `cond` (true on the branch being entered) says about sub-expressions.
    pub fn assume(&mut self, cond: &Expr) {
        match cond.kind() {
            ExprKind::Logic(LogicOp::And, a, b) => {
                self.assume(a);
                self.assume(b);
            }
            ExprKind::Cmp(op, a, b) if a.dtype() == DType::I64 => match op {
                CmpOp::Lt => self
                    .guards
                    .push((a.clone(), None, Some(b.sub(&Expr::int(1))))),
                CmpOp::Le => self.guards.push((a.clone(), None, Some(b.clone()))),
                CmpOp::Gt => self
                    .guards
                    .push((a.clone(), Some(b.add(&Expr::int(1))), None)),
                CmpOp::Ge => self.guards.push((a.clone(), Some(b.clone()), None)),
                _ => {}
            },
            _ => {}
        }
    }
}

/// `a <= b` for all values of the (non-negative) symbolic dims: `Some(true)` proven,
/// `Some(false)` refuted (constants), `None` unknown.
pub fn prove_le(a: &Expr, b: &Expr) -> Option<bool> {
    match (a.kind(), b.kind()) {
        (_, ExprKind::Binary(BinOp::Min, x, y)) => and3(prove_le(a, x), prove_le(a, y)),
        (ExprKind::Binary(BinOp::Max, x, y), _) => and3(prove_le(x, b), prove_le(y, b)),
        (ExprKind::Binary(BinOp::Min, x, y), _) => or3(prove_le(x, b), prove_le(y, b)),
        (_, ExprKind::Binary(BinOp::Max, x, y)) => or3(prove_le(a, x), prove_le(a, y)),
        _ => prove_nonneg(&b.sub(a)),
    }
}

fn and3(x: Option<bool>, y: Option<bool>) -> Option<bool> {
    match (x, y) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

fn or3(x: Option<bool>, y: Option<bool>) -> Option<bool> {
    match (x, y) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

/// `min(a, b)`, folded when one side is provably smaller.
pub fn smin(a: &Expr, b: &Expr) -> Expr {
    match prove_le(a, b) {
        Some(true) => a.clone(),
        Some(false) if prove_le(b, a) == Some(true) => b.clone(),
        _ => simplify(&a.min_(b)),
    }
}

/// `max(a, b)`, folded when one side is provably larger.
pub fn smax(a: &Expr, b: &Expr) -> Expr {
    match prove_le(a, b) {
        Some(true) => b.clone(),
        Some(false) if prove_le(b, a) == Some(true) => a.clone(),
        _ => simplify(&a.max_(b)),
    }
}

fn nonneg(e: &Expr) -> bool {
    prove_nonneg(e) == Some(true)
}

/// Largest interval endpoint kept: nested `min`/`max` of products can double at each level
/// (hostile split factors made a build take 25 s); past this an index is "cannot bound", a
/// `CompileError`, never a slow build.
const MAX_ENDPOINT_NODES: usize = 1000;

pub fn interval(e: &Expr, env: &Env) -> Option<Interval> {
    let raw = raw_interval(e, env)?;
    if raw.lo.tree_size_upto(MAX_ENDPOINT_NODES) >= MAX_ENDPOINT_NODES
        || raw.hi.tree_size_upto(MAX_ENDPOINT_NODES) >= MAX_ENDPOINT_NODES
    {
        return None;
    }
    // The obligation is on the node's value before guards about the node itself: a guard
    // compares the value the program computed, which is the exact one only if it did not wrap.
    if let Some(r) = &env.record {
        if can_overflow(e) {
            let exact = Interval {
                lo: simplify(&raw.lo),
                hi: simplify(&raw.hi),
            };
            r.borrow_mut().push((e.clone(), exact));
        }
    }
    // Apply guards that speak about exactly this expression. Not to constants (exact
    // already), and not while bounding a guard's own bound: a guard `1 < n - 1` would
    // otherwise bound `n - 1`, whose `1` meets the same guard again, forever. Skipping a guard
    // only widens an interval, which stays sound.
    let mut iv = raw;
    if matches!(e.kind(), ExprKind::Const(_)) || IN_GUARD.with(|g| g.get()) {
        return Some(Interval {
            lo: simplify(&iv.lo),
            hi: simplify(&iv.hi),
        });
    }
    IN_GUARD.with(|g| g.set(true));
    let _reset = ResetGuard;
    for (g, lo, hi) in &env.guards {
        if g == e {
            // A guard's bound may itself use loop variables: bound it first.
            if let Some(lo) = lo.as_ref().and_then(|b| raw_interval(b, env)) {
                iv.lo = smax(&iv.lo, &lo.lo);
            }
            if let Some(hi) = hi.as_ref().and_then(|b| raw_interval(b, env)) {
                iv.hi = smin(&iv.hi, &hi.hi);
            }
        }
    }
    Some(Interval {
        lo: simplify(&iv.lo),
        hi: simplify(&iv.hi),
    })
}

thread_local! {
    /// True while the bounds of a guard are being computed (see `interval`).
    static IN_GUARD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Clears `IN_GUARD` when dropped (also on an early return).
struct ResetGuard;

impl Drop for ResetGuard {
    fn drop(&mut self) {
        IN_GUARD.with(|g| g.set(false));
    }
}

/// Nodes whose int64 result can overflow (`min`, `max`, `%`, variables and constants cannot).
fn can_overflow(e: &Expr) -> bool {
    use crate::ir::expr::UnOp;
    matches!(
        e.kind(),
        ExprKind::Binary(BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::FloorDiv, _, _)
            | ExprKind::Unary(UnOp::Neg | UnOp::Abs, _)
    )
}

fn raw_interval(e: &Expr, env: &Env) -> Option<Interval> {
    if e.dtype() != DType::I64 {
        return None;
    }
    match e.kind() {
        ExprKind::Const(Const::Int(_)) => Some(Interval::point(e)),
        ExprKind::Var(v) => Some(
            env.vars
                .get(v)
                .cloned()
                .unwrap_or_else(|| Interval::point(e)),
        ),
        ExprKind::Unary(crate::ir::expr::UnOp::Neg, a) => {
            let a = interval(a, env)?;
            Some(Interval {
                lo: Expr::int(0).sub(&a.hi),
                hi: Expr::int(0).sub(&a.lo),
            })
        }
        ExprKind::Binary(op, a, b) => {
            // Fused loops: `f // D` and `f % D` for a loop `f` over [0, E * D).
            if let (Some(f), BinOp::FloorDiv | BinOp::FloorMod) = (a.as_var(), op) {
                if let Some((min, ext)) = env.loops.get(f) {
                    if let ExprKind::Binary(BinOp::Mul, outer, inner) = ext.kind() {
                        if min.as_int() == Some(0) && inner == b {
                            let top = if *op == BinOp::FloorDiv { outer } else { inner };
                            return Some(Interval {
                                lo: Expr::int(0),
                                hi: top.sub(&Expr::int(1)),
                            });
                        }
                    }
                }
            }
            let (x, y) = (interval(a, env)?, interval(b, env)?);
            match op {
                BinOp::Add => Some(Interval {
                    lo: x.lo.add(&y.lo),
                    hi: x.hi.add(&y.hi),
                }),
                BinOp::Sub => Some(Interval {
                    lo: x.lo.sub(&y.hi),
                    hi: x.hi.sub(&y.lo),
                }),
                BinOp::Mul => {
                    let k = b
                        .as_int()
                        .map(|k| (k, &x))
                        .or_else(|| a.as_int().map(|k| (k, &y)));
                    if let Some((k, other)) = k {
                        let (l, h) = (other.lo.mul(&Expr::int(k)), other.hi.mul(&Expr::int(k)));
                        return Some(if k >= 0 {
                            Interval { lo: l, hi: h }
                        } else {
                            Interval { lo: h, hi: l }
                        });
                    }
                    if nonneg(&x.lo) && nonneg(&y.lo) {
                        return Some(Interval {
                            lo: x.lo.mul(&y.lo),
                            hi: x.hi.mul(&y.hi),
                        });
                    }
                    // One factor a single (symbolic) value of unknown sign: the product of a
                    // range by a point is monotonic, in one direction or the other.
                    let (range, point) = if y.lo == y.hi {
                        (&x, &y.lo)
                    } else if x.lo == x.hi {
                        (&y, &x.lo)
                    } else {
                        return None;
                    };
                    let (p, q) = (range.lo.mul(point), range.hi.mul(point));
                    Some(Interval {
                        lo: smin(&p, &q),
                        hi: smax(&p, &q),
                    })
                }
                BinOp::FloorDiv => match b.as_int() {
                    Some(k) if k > 0 => Some(Interval {
                        lo: x.lo.floordiv(b),
                        hi: x.hi.floordiv(b),
                    }),
                    // A non-negative value over a size d: monotonic for d >= 1, and d = 0
                    // gives 0, which `x.lo // 0 = x.hi // 0 = 0` also says.
                    _ if nonneg(&x.lo) && b.as_var().is_some() && y.lo == *b && y.hi == *b => {
                        Some(Interval {
                            lo: x.lo.floordiv(b),
                            hi: x.hi.floordiv(b),
                        })
                    }
                    // A single divisor value of any sign: `x // y` is monotonic in x (one way
                    // or the other; constant 0 for y = 0).
                    // (Bounds use the divisor's value `y.lo`, not `b`, which may mention
                    // ranged variables.)
                    _ if y.lo == y.hi => {
                        let (p, q) = (x.lo.floordiv(&y.lo), x.hi.floordiv(&y.lo));
                        Some(Interval {
                            lo: smin(&p, &q),
                            hi: smax(&p, &q),
                        })
                    }
                    // x >= 0 over a non-negative range of divisors: at most x.hi // max(y.lo, 1)
                    // (`// 0` gives 0), at least 0.
                    _ if nonneg(&x.lo) && nonneg(&y.lo) => Some(Interval {
                        lo: Expr::int(0),
                        hi: x.hi.floordiv(&smax(&y.lo, &Expr::int(1))),
                    }),
                    _ => None,
                },
                BinOp::FloorMod => match b.as_int() {
                    Some(k) if k > 0 => {
                        if nonneg(&x.lo) && prove_le(&x.hi, &Expr::int(k - 1)) == Some(true) {
                            Some(x)
                        } else {
                            Some(Interval {
                                lo: Expr::int(0),
                                hi: Expr::int(k - 1),
                            })
                        }
                    }
                    // `% d` for a size d: in [0, d - 1], or 0 when d is 0.
                    _ if b.as_var().is_some() && y.lo == *b && y.hi == *b => Some(Interval {
                        lo: Expr::int(0),
                        hi: smax(&b.sub(&Expr::int(1)), &Expr::int(0)),
                    }),
                    // A single divisor value of any sign: the result takes its sign (0 for 0).
                    _ if y.lo == y.hi => Some(Interval {
                        lo: smin(&Expr::int(0), &y.lo.add(&Expr::int(1))),
                        hi: smax(&Expr::int(0), &y.lo.sub(&Expr::int(1))),
                    }),
                    // A non-negative divisor range: in [0, max(y.hi - 1, 0)].
                    _ if nonneg(&y.lo) => Some(Interval {
                        lo: Expr::int(0),
                        hi: smax(&y.hi.sub(&Expr::int(1)), &Expr::int(0)),
                    }),
                    _ => None,
                },
                BinOp::Min => Some(Interval {
                    lo: smin(&x.lo, &y.lo),
                    hi: smin(&x.hi, &y.hi),
                }),
                BinOp::Max => Some(Interval {
                    lo: smax(&x.lo, &y.lo),
                    hi: smax(&x.hi, &y.hi),
                }),
                BinOp::Div | BinOp::Pow => None,
            }
        }
        ExprKind::Select(_, a, b) => {
            let (x, y) = (interval(a, env)?, interval(b, env)?);
            Some(Interval {
                lo: smin(&x.lo, &y.lo),
                hi: smax(&x.hi, &y.hi),
            })
        }
        // Every lane of a ramp lies between its first and its last lane (affine in the lane
        // number), so the hull of those two bounds all of them; the last lane's expression is
        // analysed (and recorded) like any other node, so its no-overflow obligation is proved.
        ExprKind::Ramp {
            base,
            stride,
            lanes,
        } => {
            let last = base.add(&stride.mul(&Expr::int(i64::from(*lanes) - 1)));
            let (x, y) = (interval(base, env)?, interval(&last, env)?);
            Some(Interval {
                lo: smin(&x.lo, &y.lo),
                hi: smax(&x.hi, &y.hi),
            })
        }
        ExprKind::Broadcast { value, .. } => interval(value, env),
        _ => None,
    }
}
