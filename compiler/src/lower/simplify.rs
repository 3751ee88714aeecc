//! Simplification of int64 index arithmetic: constant folding, identities (`x + 0`, `x * 1`,
//! `x * 0`, `min(x, x)`), and a linear normal form (sum of `coefficient * var` plus a constant)
//! used to fold `(i * 4 + j) - i * 4` style expressions and to prove inequalities.
//!
//! Only int64 arithmetic is rewritten (exact, Python floor semantics); float expressions are
//! folded only where folding is exact in IEEE arithmetic (never reassociated), and every other
//! node is kept as written, so simplification never changes a program's results.

use crate::codegen::math::{floordiv_i64, floormod_i64};
use crate::ir::expr::{BinOp, Const, Expr, ExprKind};
use crate::ir::stmt::Stmt;
use rivet_runtime::DType;

/// `sum(coef * atom) + constant`: an atom is a variable or any non-linear int64
/// subexpression (`(n + 1) // 2`, `m * n`), matched structurally (variable ids included), so
/// `((n + 1) // 2 + 1) - 1` folds back to `(n + 1) // 2`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Linear {
    /// Atoms with non-zero coefficients, in first-seen order (deterministic output).
    pub terms: Vec<(Expr, i64)>,
    pub constant: i64,
}

impl Linear {
    fn atom(e: &Expr) -> Linear {
        Linear {
            terms: vec![(e.clone(), 1)],
            constant: 0,
        }
    }
    fn scale(mut self, k: i64) -> Option<Linear> {
        for (_, c) in self.terms.iter_mut() {
            *c = c.checked_mul(k)?;
        }
        self.terms.retain(|(_, c)| *c != 0);
        self.constant = self.constant.checked_mul(k)?;
        Some(self)
    }
    fn plus(mut self, other: Linear, sign: i64) -> Option<Linear> {
        for (a, c) in other.terms {
            let add = c.checked_mul(sign)?;
            match self.terms.iter_mut().find(|(x, _)| *x == a) {
                Some((_, k)) => *k = k.checked_add(add)?,
                None => self.terms.push((a, add)),
            }
        }
        self.terms.retain(|(_, c)| *c != 0);
        self.constant = self
            .constant
            .checked_add(other.constant.checked_mul(sign)?)?;
        Some(self)
    }

    /// The expression for this form (terms in first-seen order, constant last).
    pub fn to_expr(&self) -> Expr {
        let mut acc: Option<Expr> = None;
        for (a, c) in &self.terms {
            let term = if *c == 1 {
                a.clone()
            } else {
                Expr::int(*c).mul(a)
            };
            acc = Some(match acc {
                None => term,
                Some(x) => x.add(&term),
            });
        }
        match acc {
            None => Expr::int(self.constant),
            Some(a) if self.constant == 0 => a,
            Some(a) if self.constant < 0 && self.constant != i64::MIN => {
                a.sub(&Expr::int(-self.constant))
            }
            Some(a) => a.add(&Expr::int(self.constant)),
        }
    }
}

/// The linear form of an int64 expression (every int64 expression has one, possibly a single
/// atom); `None` for other dtypes or on overflow.
pub fn linear(e: &Expr) -> Option<Linear> {
    if e.dtype() != DType::I64 {
        return None;
    }
    match e.kind() {
        ExprKind::Const(Const::Int(c)) => Some(Linear {
            terms: vec![],
            constant: *c,
        }),
        ExprKind::Binary(BinOp::Add, a, b) => linear(a)?.plus(linear(b)?, 1),
        ExprKind::Binary(BinOp::Sub, a, b) => linear(a)?.plus(linear(b)?, -1),
        ExprKind::Binary(BinOp::Mul, a, b) => {
            let (la, lb) = (linear(a)?, linear(b)?);
            if la.terms.is_empty() {
                lb.scale(la.constant)
            } else if lb.terms.is_empty() {
                la.scale(lb.constant)
            } else {
                Some(Linear::atom(e))
            }
        }
        ExprKind::Unary(crate::ir::expr::UnOp::Neg, a) => linear(a)?.scale(-1),
        _ => Some(Linear::atom(e)),
    }
}

/// True when a linear form is `>= 0` given that every atom is (see `structurally_nonneg`).
fn linear_nonneg(l: &Linear) -> bool {
    l.constant >= 0 && l.terms.iter().all(|(a, c)| *c >= 0 && atom_nonneg(a))
}

fn atom_nonneg(a: &Expr) -> bool {
    match a.kind() {
        ExprKind::Var(_) => true,
        _ => structurally_nonneg(a),
    }
}

fn int_of(e: &Expr) -> Option<i64> {
    if e.dtype() == DType::I64 {
        e.as_int()
    } else {
        None
    }
}

/// Simplifies one node whose children are already simplified.
fn simplify_node(e: &Expr) -> Option<Expr> {
    // Vector index arithmetic is left as the vectorize pass wrote it (its ramps are already
    // in canonical form; the linear form below would mix scalars into vectors).
    if e.dtype() != DType::I64 || e.is_vector() {
        return None;
    }
    if let ExprKind::Binary(op, a, b) = e.kind() {
        let (ca, cb) = (int_of(a), int_of(b));
        if let (Some(x), Some(y)) = (ca, cb) {
            // Folded only when exact: an overflowing constant stays as written, so that the
            // bounds proof sees it (and refuses it) instead of a wrapped value.
            let v = match op {
                BinOp::Add => x.checked_add(y)?,
                BinOp::Sub => x.checked_sub(y)?,
                BinOp::Mul => x.checked_mul(y)?,
                BinOp::FloorDiv if x == i64::MIN && y == -1 => return None,
                BinOp::FloorDiv => floordiv_i64(x, y),
                BinOp::FloorMod => floormod_i64(x, y),
                BinOp::Min => x.min(y),
                BinOp::Max => x.max(y),
                BinOp::Div | BinOp::Pow => return None,
            };
            return Some(Expr::int(v));
        }
        match (op, ca, cb) {
            (BinOp::Add, Some(0), _) => return Some(b.clone()),
            (BinOp::Add | BinOp::Sub, _, Some(0)) => return Some(a.clone()),
            (BinOp::Mul, Some(0), _) | (BinOp::Mul, _, Some(0)) => return Some(Expr::int(0)),
            (BinOp::Mul, Some(1), _) => return Some(b.clone()),
            (BinOp::Mul, _, Some(1)) | (BinOp::FloorDiv, _, Some(1)) => return Some(a.clone()),
            (BinOp::FloorMod, _, Some(1)) => return Some(Expr::int(0)),
            (BinOp::Min | BinOp::Max, _, _) if a == b => return Some(a.clone()),
            _ => {}
        }
        // Exact for any integer A: (k*A + c) // k == A + c // k and (k*A + c) % k == c % k.
        if let (BinOp::FloorDiv | BinOp::FloorMod, Some(k)) = (op, cb) {
            if k > 0 {
                if let Some(l) = linear(a) {
                    if !l.terms.is_empty() && l.terms.iter().all(|(_, c)| c % k == 0) {
                        return Some(if *op == BinOp::FloorDiv {
                            let q = Linear {
                                terms: l.terms.iter().map(|(t, c)| (t.clone(), c / k)).collect(),
                                constant: floordiv_i64(l.constant, k),
                            };
                            q.to_expr()
                        } else {
                            Expr::int(floormod_i64(l.constant, k))
                        });
                    }
                }
            }
        }
        if matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul) {
            if let Some(l) = linear(e) {
                let canon = l.to_expr();
                if node_count(&canon) < node_count(e) {
                    return Some(canon);
                }
            }
        }
    }
    None
}

fn node_count(e: &Expr) -> usize {
    let mut n = 0;
    e.visit(&mut |_| n += 1);
    n
}

/// Simplifies an expression bottom-up.
pub fn simplify(e: &Expr) -> Expr {
    e.rewrite(&mut |n| simplify_node(n))
}

/// Simplifies every expression of a statement, and drops loops of constant extent 0 and
/// `if` statements with constant conditions.
pub fn simplify_stmt(s: &Stmt) -> Stmt {
    s.rewrite(&mut |e| simplify(e), &mut |s| match s {
        Stmt::If {
            cond,
            then,
            otherwise,
        } => match cond.as_int() {
            Some(c) if cond.dtype() == DType::Bool => {
                if c != 0 {
                    *then
                } else {
                    otherwise.map(|o| *o).unwrap_or(Stmt::Seq(vec![]))
                }
            }
            _ => Stmt::If {
                cond,
                then,
                otherwise,
            },
        },
        // A loop of no iteration (a negative extent counts none: an unrolled copy whose guard
        // excludes every iteration, when the vectorizer turned the guard into the extent).
        Stmt::For { extent, .. } if extent.as_int().is_some_and(|n| n <= 0) => Stmt::Seq(vec![]),
        Stmt::Seq(v) => {
            let mut flat = Vec::new();
            for s in v {
                match s {
                    Stmt::Seq(inner) => flat.extend(inner),
                    other => flat.push(other),
                }
            }
            Stmt::seq(flat)
        }
        other => other,
    })
}

/// Proves `e >= 0` for every value of the variables, each of which is known `>= 0` (symbolic
/// dims are sizes). `Some(true)`: proven; `Some(false)`: false for some values (a constant
/// that is negative); `None`: unknown.
pub fn prove_nonneg(e: &Expr) -> Option<bool> {
    let s = simplify(e);
    if let Some(c) = int_of(&s) {
        return Some(c >= 0);
    }
    let ok = match linear(&s) {
        Some(l) => linear_nonneg(&l),
        None => structurally_nonneg(&s),
    };
    ok.then_some(true)
}

/// Sign rules for the non-linear forms index arithmetic produces (`(n + 5) // 6`, products of
/// sizes, `min` / `max`), with every variable `>= 0`.
fn structurally_nonneg(e: &Expr) -> bool {
    match e.kind() {
        ExprKind::Const(Const::Int(c)) => *c >= 0,
        ExprKind::Var(_) => true,
        ExprKind::Binary(op, a, b) => match op {
            BinOp::Mul | BinOp::FloorDiv | BinOp::Min => {
                structurally_nonneg(a) && structurally_nonneg(b)
            }
            // Python's `%` takes the divisor's sign (and `% 0` is 0).
            BinOp::FloorMod => structurally_nonneg(b),
            BinOp::Max => structurally_nonneg(a) || structurally_nonneg(b),
            BinOp::Add | BinOp::Sub => match linear(e) {
                Some(l) if !(l.terms.len() == 1 && l.terms[0].1 == 1 && l.constant == 0) => {
                    linear_nonneg(&l)
                }
                _ => false,
            },
            BinOp::Div | BinOp::Pow => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::expr::Var;

    #[test]
    fn folds_and_canonicalises() {
        let i = Var::new("i");
        let e = Expr::var(&i)
            .mul(&Expr::int(4))
            .add(&Expr::int(3))
            .sub(&Expr::var(&i).mul(&Expr::int(4)));
        assert_eq!(simplify(&e).as_int(), Some(3));
        let f = Expr::int(7).floordiv(&Expr::int(-2));
        assert_eq!(simplify(&f).as_int(), Some(-4));
        let n = Var::new("n");
        assert_eq!(
            prove_nonneg(
                &Expr::var(&n)
                    .sub(&Expr::int(1))
                    .sub(&Expr::var(&n).sub(&Expr::int(2)))
            ),
            Some(true)
        );
        assert_eq!(prove_nonneg(&Expr::int(-1)), Some(false));
        assert_eq!(prove_nonneg(&Expr::var(&n).sub(&Expr::int(1))), None);
        // Non-linear atoms cancel: ((n + 1) // 2 + 1) - 1 == (n + 1) // 2, and it is >= 0.
        let half = Expr::var(&n).add(&Expr::int(1)).floordiv(&Expr::int(2));
        let e = half.add(&Expr::int(1)).sub(&Expr::int(1));
        assert_eq!(simplify(&e), half);
        assert_eq!(prove_nonneg(&half), Some(true));
        assert_eq!(
            prove_nonneg(&Expr::var(&n).mul(&Expr::var(&i)).sub(&Expr::int(1))),
            None
        );
    }
}
