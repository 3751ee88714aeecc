//! Simplification of int64 index arithmetic: constant folding, identities (`x + 0`, `x * 1`,
//! `x * 0`, `min(x, x)`), and a linear normal form (sum of `coefficient * var` plus a constant)
//! used to fold `(i * 4 + j) - i * 4` style expressions and to prove inequalities.
//!
//! Only int64 arithmetic is rewritten (exact, Python floor semantics); float expressions are
//! folded only where folding is exact in IEEE arithmetic (never reassociated), and every other
//! node is kept as written, so simplification never changes a program's results. Conditions
//! are decided where that is exact: int64 comparisons of constants (or of one expression with
//! itself), `!`, `&&` / `||` with a constant operand (only dropping evaluation, never adding
//! it), and a `select` of a constant condition becomes its arm (`te.gradient`'s guards on
//! dims of extent 1 come out as `select(0 == 0, ..)`).

use super::div::{floordiv_i64, floormod_i64};
use crate::ir::expr::{BinOp, CmpOp, Const, Expr, ExprKind, LogicOp, UnOp};
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

/// A scalar bool constant's value.
fn bool_of(e: &Expr) -> Option<bool> {
    (e.dtype() == DType::Bool && !e.is_vector())
        .then(|| e.as_int())
        .flatten()
        .map(|v| v != 0)
}

/// Decides a condition node whose operands are decided (module header); None otherwise.
fn decide(e: &Expr) -> Option<Expr> {
    match e.kind() {
        ExprKind::Cmp(op, a, b) if a.dtype() == DType::I64 && !a.is_vector() && !b.is_vector() => {
            let ord = match (int_of(a), int_of(b)) {
                (Some(x), Some(y)) => x.cmp(&y),
                _ if a == b => std::cmp::Ordering::Equal,
                _ => return None,
            };
            use std::cmp::Ordering::*;
            Some(Expr::bool(match op {
                CmpOp::Eq => ord == Equal,
                CmpOp::Ne => ord != Equal,
                CmpOp::Lt => ord == Less,
                CmpOp::Le => ord != Greater,
                CmpOp::Gt => ord == Greater,
                CmpOp::Ge => ord != Less,
            }))
        }
        ExprKind::Unary(UnOp::Not, a) => bool_of(a).map(|v| Expr::bool(!v)),
        ExprKind::Logic(op, a, b) if !e.is_vector() => match (op, bool_of(a), bool_of(b)) {
            (LogicOp::And, Some(false), _) => Some(Expr::bool(false)),
            (LogicOp::Or, Some(true), _) => Some(Expr::bool(true)),
            (LogicOp::And, Some(true), _) | (LogicOp::Or, Some(false), _) => Some(b.clone()),
            (LogicOp::And, _, Some(true)) | (LogicOp::Or, _, Some(false)) => Some(a.clone()),
            _ => None,
        },
        ExprKind::Select(c, a, b) => bool_of(c).map(|v| if v { a.clone() } else { b.clone() }),
        _ => None,
    }
}

/// Simplifies one node whose children are already simplified.
fn simplify_node(e: &Expr) -> Option<Expr> {
    if let Some(d) = decide(e) {
        return Some(d);
    }
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
                let canon = merge_div_mod(l).to_expr();
                if node_count(&canon) < node_count(e) {
                    return Some(canon);
                }
            }
        }
    }
    None
}

/// Most terms of a linear form searched for `merge_div_mod` pairs (the search is quadratic).
const MERGE_TERMS: usize = 16;

/// `l` with every pair `c*K * (x // K) + c * (x % K)` (constant `K > 0`) replaced by `c * x`:
/// exact for any integer `x` under floor division (`x == K * (x // K) + x % K`). A fused loop
/// `f` over `(n, y)` has `n = f // 56`, `y = f % 56`; a buffer indexed `n * 56 + y` over the
/// fused dims then reads back as `f` (row fusion recognises its own row by that).
fn merge_div_mod(mut l: Linear) -> Linear {
    if l.terms.len() > MERGE_TERMS {
        return l;
    }
    // Each merge removes a `%` atom for smaller ones (x's): bounded, capped all the same.
    'again: for _ in 0..MERGE_TERMS {
        for i in 0..l.terms.len() {
            let ExprKind::Binary(BinOp::FloorMod, x, k) = l.terms[i].0.kind() else {
                continue;
            };
            let Some(kv) = int_of(k).filter(|&v| v > 0) else {
                continue;
            };
            let c = l.terms[i].1;
            let Some(ck) = c.checked_mul(kv) else {
                continue;
            };
            let pair = l.terms.iter().position(|(t, cj)| {
                *cj == ck
                    && matches!(t.kind(), ExprKind::Binary(BinOp::FloorDiv, y, k2)
                        if y == x && int_of(k2) == Some(kv))
            });
            let Some(j) = pair else {
                continue;
            };
            let Some(whole) = linear(x).and_then(|lx| lx.scale(c)) else {
                continue;
            };
            // Each atom occurs once in a linear form: removing the pair removes `x`'s terms.
            let mut rest = l.clone();
            rest.terms.remove(i.max(j));
            rest.terms.remove(i.min(j));
            let Some(merged) = rest.plus(whole, 1) else {
                continue;
            };
            l = merged;
            continue 'again;
        }
        return l;
    }
    l
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

    #[test]
    fn a_fused_index_split_back_by_div_and_mod_merges() {
        let f = Expr::var(&Var::new("f"));
        let k = Expr::int(56);
        // (f // 56) * 56 + f % 56 == f
        let e = f.floordiv(&k).mul(&k).add(&f.floormod(&k));
        assert_eq!(simplify(&e), f);
        // Three dims fused in two steps: ((g // 7) // 5) * 35 + ((g // 7) % 5) * 7 + g % 7 == g,
        // with a constant and another term alongside.
        let g = Expr::var(&Var::new("g"));
        let (five, seven) = (Expr::int(5), Expr::int(7));
        let q = g.floordiv(&seven);
        let e = q
            .floordiv(&five)
            .mul(&Expr::int(35))
            .add(&q.floormod(&five).mul(&seven))
            .add(&g.floormod(&seven))
            .add(&Expr::int(3))
            .add(&f);
        assert_eq!(simplify(&e), simplify(&g.add(&Expr::int(3)).add(&f)));
        // Not a pair: the coefficients do not match (f // 56 * 55 + f % 56), or the divisors
        // differ; left as they are.
        let e = f.floordiv(&k).mul(&Expr::int(55)).add(&f.floormod(&k));
        assert_ne!(simplify(&e), f);
        let e = f.floordiv(&k).mul(&k).add(&f.floormod(&Expr::int(8)));
        assert_ne!(simplify(&e), f);
    }

    #[test]
    fn decides_conditions_only_where_exact() {
        use crate::ir::expr::CmpOp;
        let n = Expr::var(&Var::new("n"));
        let x = Expr::var(&Var::new("x"));
        let cmp = |op, a: &Expr, b: &Expr| Expr::cmp(op, a.clone(), b.clone()).unwrap();
        let t = Expr::bool(true);
        let f = Expr::bool(false);
        // Constants, an expression against itself, i64 extremes (no arithmetic, no overflow).
        assert_eq!(simplify(&cmp(CmpOp::Eq, &Expr::int(0), &Expr::int(0))), t);
        assert_eq!(
            simplify(&cmp(CmpOp::Lt, &Expr::int(i64::MIN), &Expr::int(i64::MAX))),
            t
        );
        assert_eq!(
            simplify(&cmp(CmpOp::Ge, &Expr::int(i64::MIN), &Expr::int(i64::MAX))),
            f
        );
        assert_eq!(simplify(&cmp(CmpOp::Le, &n, &n)), t);
        assert_eq!(simplify(&cmp(CmpOp::Ne, &n, &n)), f);
        // Undecided: left as written.
        let open = cmp(CmpOp::Lt, &n, &Expr::int(1));
        assert_eq!(simplify(&open), open);
        // Floats are never decided (NaN != NaN).
        let xf = Expr::cast(DType::F32, x.clone());
        let fl = Expr::cmp(CmpOp::Eq, xf.clone(), xf).unwrap();
        assert_eq!(simplify(&fl), fl);
        // && / || with a constant side; a select of a constant condition is its arm.
        let and = Expr::logic(LogicOp::And, cmp(CmpOp::Eq, &x, &x), open.clone()).unwrap();
        assert_eq!(simplify(&and), open);
        let or = Expr::logic(LogicOp::Or, open.clone(), cmp(CmpOp::Gt, &n, &n)).unwrap();
        assert_eq!(simplify(&or), open);
        let sel = Expr::select(cmp(CmpOp::Eq, &Expr::int(0), &Expr::int(0)), n.clone(), x).unwrap();
        assert_eq!(simplify(&sel), n);
    }
}
