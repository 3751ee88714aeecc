//! The DSL's functions and Rust operators: `var`, `reduce_axis`, reductions, math functions,
//! `if_then_else`, `cast`, and `+ - * / %` on `Expr`. Operands are expressions or numbers
//! (`impl Into<Operand>`); numbers follow the one mixed-type rule of `te::number`, shared with
//! the Python DSL (`i * 2.0` is `i * 2`, `i * 0.5` is an error). Checked functions return
//! `Result`; the operators cannot, so a type error inside an operator yields an `Invalid`
//! expression that `compute` reports as a `CompileError`.

use super::dsl::Axes;
use super::number::{number_as, operand, operands, Number, Operand};
use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, CmpOp, Expr, ExprKind, IterVar, LogicOp, ReduceOp, UnOp, Var};
use rivet_runtime::DType;

/// A symbolic int64 dim, bound from the arguments' shapes at call time.
pub fn var(name: &str) -> Expr {
    Expr::var(&Var::new(name))
}

/// A reduction axis over `[lo, hi)` (expressions or integers: `reduce_axis(0, &n, "k")`).
pub fn reduce_axis(lo: impl Into<Expr>, hi: impl Into<Expr>, name: &str) -> Result<IterVar> {
    let (lo, hi): (Expr, Expr) = (lo.into(), hi.into());
    if lo.dtype() != DType::I64 || hi.dtype() != DType::I64 {
        return Err(Error::Compile(format!(
            "reduce_axis '{name}': bounds must be int64 expressions"
        )));
    }
    let extent = crate::lower::simplify::simplify(&hi.sub(&lo));
    Ok(IterVar {
        var: Var::new(name),
        min: lo,
        extent,
        reduce: true,
    })
}

pub fn reduce(op: ReduceOp, body: Expr, axes: &[IterVar]) -> Result<Expr> {
    if body.dtype() == DType::Bool {
        return Err(Error::Compile(format!(
            "cannot reduce bool values ({body}); cast them first"
        )));
    }
    if axes.is_empty() {
        return Err(Error::Compile("a reduction needs at least one axis".into()));
    }
    if let Some(a) = axes.iter().find(|a| !a.reduce) {
        return Err(Error::Compile(format!(
            "'{}' is not a reduce_axis",
            a.var.name
        )));
    }
    let dt = body.dtype();
    Ok(Expr::new(
        ExprKind::Reduce {
            op,
            body,
            axes: axes.to_vec(),
        },
        dt,
    ))
}

/// A reduction for a stage body: `body` reduced over `axes` (`&k`, `[&k1, &k2]`, a slice).
/// An error (a bool body, no axis, a data axis) is carried in the expression and reported by
/// `compute`, naming the stage; `reduce` is the checked form.
/// The reduction `op` over `axes` as an expression (the error carried, as `sum` does): for a
/// reduction chosen at run time (`te::reduction(op, x.at((i, &r)), &r)`).
pub fn reduction(op: ReduceOp, body: impl Into<Expr>, axes: impl Axes) -> Expr {
    let body: Expr = body.into();
    let dt = body.dtype();
    reduce(op, body, &axes.into_axes())
        .unwrap_or_else(|e| Expr::new(ExprKind::Invalid(e.to_string()), dt))
}

/// `sum over axes of body` (`te::sum(a.at([i, &k]) * b.at([&k, j]), &k)`).
pub fn sum(body: impl Into<Expr>, axes: impl Axes) -> Expr {
    reduction(ReduceOp::Sum, body, axes)
}
/// The product over `axes`.
pub fn prod(body: impl Into<Expr>, axes: impl Axes) -> Expr {
    reduction(ReduceOp::Prod, body, axes)
}
/// The maximum over `axes`.
pub fn max_over(body: impl Into<Expr>, axes: impl Axes) -> Expr {
    reduction(ReduceOp::Max, body, axes)
}
/// The minimum over `axes`.
pub fn min_over(body: impl Into<Expr>, axes: impl Axes) -> Expr {
    reduction(ReduceOp::Min, body, axes)
}

/// `op` on two operands (expressions or numbers): what the operators `+ - * / %` build, in
/// checked form (`binary(BinOp::Mul, 0.5, x)` for Python's `0.5 * x`).
pub fn binary(op: BinOp, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    let (x, y) = operands(&format!("{op:?}"), a.into(), b.into())?;
    Expr::binary(op, x, y)
}

// The body functions below return `Expr`: an error (a type rule) is carried in the expression
// (`Invalid`) and reported by `compute` naming the stage, so closures need no `?` or `ok`;
// `check` turns it into a `Result` where one is wanted. `binary`, `compare`, `logic` and
// `try_if_then_else` are the checked forms (the Python DSL raises at the call through them).

/// The dtype an `Invalid` result of `op(a, ...)` carries: the first expression operand's.
fn dtype_of(a: &Operand) -> DType {
    match a {
        Operand::Expr(e) => e.dtype(),
        Operand::Number(n) => n.default_dtype(),
    }
}

fn binary_body(op: BinOp, a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    let a: Operand = a.into();
    let dt = dtype_of(&a);
    or_invalid(binary(op, a, b), dt)
}

/// Elementwise maximum / minimum of two operands.
pub fn maximum(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    binary_body(BinOp::Max, a, b)
}
pub fn minimum(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    binary_body(BinOp::Min, a, b)
}

pub fn constant(value: f64, dtype: DType) -> Expr {
    Expr::constant(value, dtype)
}

pub fn cast(dtype: DType, e: impl Into<Expr>) -> Expr {
    Expr::cast(dtype, e.into())
}

/// `a` where `cond` holds, else `b`; a number for `cond` is a constant of its own dtype.
pub fn if_then_else(
    cond: impl Into<Operand>,
    a: impl Into<Operand>,
    b: impl Into<Operand>,
) -> Expr {
    let a: Operand = a.into();
    let dt = dtype_of(&a);
    or_invalid(try_if_then_else(cond, a, b), dt)
}

/// `if_then_else`, checked.
pub fn try_if_then_else(
    cond: impl Into<Operand>,
    a: impl Into<Operand>,
    b: impl Into<Operand>,
) -> Result<Expr> {
    let (x, y) = operands("if_then_else", a.into(), b.into())?;
    Expr::select(operand(cond.into()), x, y)
}

/// Logical and / or of two bool operands.
pub fn logic(op: LogicOp, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    let (x, y) = operands(&format!("{op:?}"), a.into(), b.into())?;
    Expr::logic(op, x, y)
}
pub fn all(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    or_invalid(logic(LogicOp::And, a, b), DType::Bool)
}
pub fn any(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    or_invalid(logic(LogicOp::Or, a, b), DType::Bool)
}
pub fn not(a: impl Into<Expr>) -> Expr {
    or_invalid(Expr::unary(UnOp::Not, a.into()), DType::Bool)
}

macro_rules! unary_fns {
    ($($name:ident => $op:ident),*) => {
        $(
            #[doc = concat!("`", stringify!($name), "(a)`, elementwise.")]
            pub fn $name(a: impl Into<Expr>) -> Expr {
                let a: Expr = a.into();
                let dt = a.dtype();
                or_invalid(Expr::unary(UnOp::$op, a), dt)
            }
        )*
    };
}
unary_fns!(exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt, tanh => Tanh, sigmoid => Sigmoid,
           abs => Abs, floor => Floor, ceil => Ceil, erf => Erf);

pub fn pow(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    binary_body(BinOp::Pow, a, b)
}
pub fn floordiv(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    binary_body(BinOp::FloorDiv, a, b)
}
pub fn floormod(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    binary_body(BinOp::FloorMod, a, b)
}
pub fn compare(op: CmpOp, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    let (x, y) = operands(&format!("{op:?}"), a.into(), b.into())?;
    Expr::cmp(op, x, y)
}

// Comparisons as expressions, for stage bodies (Rust's `<` cannot return an `Expr`): the
// checked `compare` with its error carried in the expression, as `maximum` does.
macro_rules! compare_fns {
    ($($(#[$doc:meta])* $name:ident => $op:ident),*) => {
        $(
            $(#[$doc])*
            pub fn $name(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
                or_invalid(compare(CmpOp::$op, a, b), DType::Bool)
            }
        )*
    };
}
compare_fns!(
    /// `a < b`, a bool expression (`te::if_then_else(te::lt(&i, 0), 0.0, x.at([i]))`).
    lt => Lt,
    /// `a <= b`.
    le => Le,
    /// `a > b`.
    gt => Gt,
    /// `a >= b`.
    ge => Ge,
    /// `a == b`.
    eq => Eq,
    /// `a != b`.
    ne => Ne
);

/// The first error carried in `e` (an operator or body function that failed), as a
/// `CompileError`; else `e`. Lets `?` report a body's error where it is written.
pub fn check(e: Expr) -> Result<Expr> {
    let mut problem = None;
    e.visit_unique(&mut |x| {
        if let ExprKind::Invalid(m) = x.kind() {
            problem.get_or_insert_with(|| m.clone());
        }
    });
    match problem {
        Some(m) => Err(Error::Compile(m)),
        None => Ok(e),
    }
}

/// A number as a constant of `like`'s dtype, by the mixed-type rule of `te::number` (an
/// `Invalid` expression, reported by `compute`, where that dtype cannot hold it).
pub fn number_like(v: f64, like: &Expr) -> Expr {
    or_invalid(
        number_as(Number::Float(v), like.dtype(), "number_like", like),
        like.dtype(),
    )
}

fn or_invalid(r: Result<Expr>, dt: DType) -> Expr {
    r.unwrap_or_else(|e| Expr::new(ExprKind::Invalid(e.to_string()), dt))
}

// The operators, on every pairing a kernel writes: owned or borrowed expressions and axes on
// the left, anything `Into<Operand>` on the right (expressions, axes, numbers), and numbers on
// the left. Numbers follow the mixed-type rule (`i * 0.5` is an error, not `i * 0`); an error
// is carried in the expression (`Invalid`) and reported by `compute`.
macro_rules! binop_impl {
    ($trait:ident, $method:ident, $op:ident) => {
        impl<T: Into<Operand>> std::ops::$trait<T> for Expr {
            type Output = Expr;
            fn $method(self, rhs: T) -> Expr {
                let dt = self.dtype();
                or_invalid(binary(BinOp::$op, self, rhs), dt)
            }
        }
        impl<T: Into<Operand>> std::ops::$trait<T> for &Expr {
            type Output = Expr;
            fn $method(self, rhs: T) -> Expr {
                std::ops::$trait::$method(self.clone(), rhs)
            }
        }
        impl<T: Into<Operand>> std::ops::$trait<T> for &IterVar {
            type Output = Expr;
            fn $method(self, rhs: T) -> Expr {
                std::ops::$trait::$method(Expr::from(self), rhs)
            }
        }
        binop_impl!(@numbers $trait, $method, $op, f64 f32 i64 i32);
    };
    (@numbers $trait:ident, $method:ident, $op:ident, $($n:ty)*) => {
        $(
            impl std::ops::$trait<Expr> for $n {
                type Output = Expr;
                fn $method(self, rhs: Expr) -> Expr {
                    let dt = rhs.dtype();
                    or_invalid(binary(BinOp::$op, self, rhs), dt)
                }
            }
            impl std::ops::$trait<&Expr> for $n {
                type Output = Expr;
                fn $method(self, rhs: &Expr) -> Expr {
                    std::ops::$trait::$method(self, rhs.clone())
                }
            }
            impl std::ops::$trait<&IterVar> for $n {
                type Output = Expr;
                fn $method(self, rhs: &IterVar) -> Expr {
                    std::ops::$trait::$method(self, Expr::from(rhs))
                }
            }
        )*
    };
}
binop_impl!(Add, add, Add);
binop_impl!(Sub, sub, Sub);
binop_impl!(Mul, mul, Mul);
binop_impl!(Div, div, Div);
binop_impl!(Rem, rem, FloorMod);

impl std::ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        let dt = self.dtype();
        or_invalid(Expr::unary(UnOp::Neg, self), dt)
    }
}
impl std::ops::Neg for &Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        -self.clone()
    }
}

/// For DSL closures (which return `Expr`): a failed construction becomes an `Invalid`
/// expression that `compute` reports as a `CompileError`.
/// (Not needed by the expression API: te functions and operators carry their errors in
/// the expression. Kept for `Result`-returning helpers.)
pub fn ok(r: impl super::dsl::Body) -> Expr {
    r.into_body()
}

/// An index variable as an expression (for `A.idx(&[i.clone(), ax(&k)])`).
pub fn ax(iv: &IterVar) -> Expr {
    Expr::var(&iv.var)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(e: &Expr) -> Option<&str> {
        match e.kind() {
            ExprKind::Invalid(m) => Some(m),
            _ => None,
        }
    }

    #[test]
    fn operators_refuse_a_float_that_an_int_expression_cannot_hold() {
        let i = var("i");
        // Was `i * 0`: the number was truncated to the expression's dtype.
        let e = i.clone() * 0.5;
        let m = invalid(&e).expect("i * 0.5 refused");
        assert!(
            m.contains("Mul") && m.contains("0.5") && m.contains("int64"),
            "{m}"
        );
        for e in [i.clone() + 0.5, i.clone() - 1.5, i.clone() % 0.25] {
            assert!(invalid(&e).is_some(), "{e}");
        }
        // Integral floats and ints are the int.
        assert_eq!((i.clone() * 2.0).to_string(), "(i * 2)");
        assert_eq!((i.clone() + 1).to_string(), "(i + 1)");
        assert!(binary(BinOp::Mul, 0.5, i.clone()).is_err());
        assert!(check(maximum(i.clone(), 0.5)).is_err());
        assert!(compare(CmpOp::Lt, i.clone(), 0.5).is_err());
        assert_eq!(
            check(floordiv(i.clone(), 2.0)).unwrap().to_string(),
            "(i // 2)"
        );
    }

    #[test]
    fn numbers_adapt_to_float_expressions() {
        let x = crate::te::placeholder(&[Expr::int(4)], DType::F32, "X")
            .unwrap()
            .idx(&[Expr::int(0)]);
        for e in [
            x.clone() * 2,
            x.clone() * 0.5,
            x.clone() / 3,
            x.clone() % 1.5,
        ] {
            assert!(invalid(&e).is_none(), "{e}");
            assert_eq!(e.dtype(), DType::F32);
        }
        assert_eq!(check(maximum(x.clone(), 0)).unwrap().dtype(), DType::F32);
        assert_eq!(check(pow(2.0, x.clone())).unwrap().dtype(), DType::F32);
        let positive = compare(CmpOp::Gt, x.clone(), 0.0).unwrap();
        assert_eq!(
            check(if_then_else(positive, x.clone(), 0)).unwrap().dtype(),
            DType::F32
        );
        assert_eq!(number_like(0.5, &x).dtype(), DType::F32);
        // number_like follows the same rule: no silent truncation on an int expression.
        assert!(invalid(&number_like(0.5, &var("n"))).is_some());
        assert_eq!(number_like(3.0, &var("n")).as_int(), Some(3));
    }
}
