//! Contraction of `a * b + c` into the IR's fused multiply-add (`ExprKind::Fma`), the `fma`
//! build option (`Options::fma`, Python `rivet.build(..., fma=True)`).
//!
//! Invariants:
//! - only float expressions are contracted (int64 index arithmetic never becomes an `Fma`:
//!   the bounds proof reasons about `+` and `*`, and the verifier refuses an integer `Fma`);
//! - `a * b + c` and `c + a * b` (the same value: IEEE addition commutes) become
//!   `fma(a, b, c)`; when both operands of the `+` are products, the left one is fused, so the
//!   rule is a pure function of the expression and every backend sees the same nodes;
//! - nothing else changes: a `-`, a product whose result is stored before the add, or an
//!   add of a cast product stays two roundings.
//!
//! The pass runs on the loop nest, before the bounds proof, so a saved module holds the `Fma`
//! nodes themselves and a loaded one computes exactly what it computed when built; the
//! interpreter runs the same nodes (`mul_add`), so backends stay bit-exact against the
//! oracle. Results differ from unfused maths by rounding, as BLAS results differ from a
//! naive loop: opt in where that is acceptable.

use crate::ir::expr::{BinOp, Expr, ExprKind};
use crate::ir::stmt::{PrimFunc, Stmt};

/// `e` with every float `a * b + c` contracted (bottom-up).
pub fn contract(e: &Expr) -> Expr {
    e.rewrite(&mut |n| contract_node(n))
}

fn contract_node(e: &Expr) -> Option<Expr> {
    if !e.dtype().is_float() {
        return None;
    }
    let ExprKind::Binary(BinOp::Add, x, y) = e.kind() else {
        return None;
    };
    let product = |p: &Expr| match p.kind() {
        ExprKind::Binary(BinOp::Mul, a, b) if p.dtype() == e.dtype() => {
            Some((a.clone(), b.clone()))
        }
        _ => None,
    };
    let (a, b, c) = match (product(x), product(y)) {
        (Some((a, b)), _) => (a, b, y.clone()),
        (None, Some((a, b))) => (a, b, x.clone()),
        (None, None) => return None,
    };
    // Same dtypes and a float: the constructor cannot refuse; keep the add if it ever did.
    Expr::fma(a, b, c).ok()
}

/// Contracts every expression of `s`.
pub fn contract_stmt(s: &Stmt) -> Stmt {
    s.rewrite(&mut |e| contract(e), &mut |s| s)
}

/// Contracts the whole function (its outlined kernels too, should it have any).
pub fn contract_func(f: &mut PrimFunc) {
    f.body = contract_stmt(&f.body);
    for k in &mut f.kernels {
        k.body = contract_stmt(&k.body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::expr::Var;
    use rivet_runtime::DType;

    fn f(name: &str) -> Expr {
        Expr::cast(DType::F32, Expr::var(&Var::new(name)))
    }

    #[test]
    fn contracts_float_products_only() {
        let (a, b, c) = (f("a"), f("b"), f("c"));
        let ab = Expr::binary(BinOp::Mul, a.clone(), b.clone()).unwrap();
        let e = Expr::binary(BinOp::Add, ab.clone(), c.clone()).unwrap();
        assert_eq!(
            contract(&e).to_string(),
            "fma(float32(a), float32(b), float32(c))"
        );
        let e = Expr::binary(BinOp::Add, c.clone(), ab.clone()).unwrap();
        assert_eq!(
            contract(&e).to_string(),
            "fma(float32(a), float32(b), float32(c))"
        );
        // Nested: (a*b + c) * a + b -> fma(fma(a, b, c), a, b).
        let inner = Expr::binary(BinOp::Add, ab.clone(), c.clone()).unwrap();
        let outer = Expr::binary(
            BinOp::Add,
            Expr::binary(BinOp::Mul, inner, a.clone()).unwrap(),
            b.clone(),
        )
        .unwrap();
        assert_eq!(
            contract(&outer).to_string(),
            "fma(fma(float32(a), float32(b), float32(c)), float32(a), float32(b))"
        );
        // A subtraction stays as it is; int64 index arithmetic too.
        let sub = Expr::binary(BinOp::Sub, ab, c).unwrap();
        assert_eq!(contract(&sub), sub);
        let (i, j) = (Expr::var(&Var::new("i")), Expr::var(&Var::new("j")));
        let idx = i.mul(&j).add(&Expr::int(3));
        assert_eq!(contract(&idx), idx);
    }

    #[test]
    fn integer_and_mixed_fma_are_refused() {
        let i = Expr::var(&Var::new("i"));
        assert!(Expr::fma(i.clone(), i.clone(), i.clone()).is_err());
        let x = f("x");
        assert!(Expr::fma(x.clone(), x, Expr::constant(1.0, DType::F64)).is_err());
    }
}
