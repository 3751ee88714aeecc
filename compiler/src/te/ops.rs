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
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// assert_eq!((n.dtype(), n.to_string()), (DType::I64, "n".to_string()));
/// // One program for every length: dims are expressions over such variables.
/// let x = te::placeholder([&n, &(&n * 2)], DType::F32, "X")?;
/// assert_eq!(x.shape()[1].to_string(), "(n * 2)");
/// # Ok(())
/// # }
/// ```
pub fn var(name: &str) -> Expr {
    Expr::var(&Var::new(name))
}

/// A reduction axis over `[lo, hi)` (expressions or integers: `reduce_axis(0, &n, "k")`).
///
/// ```
/// use rivet_compiler::{build, te, Schedule};
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let k = te::reduce_axis(1, &n, "k")?; // k in [1, n)
/// assert_eq!((k.min.as_int(), k.extent.to_string(), k.reduce), (Some(1), "(n - 1)".to_string(), true));
/// let e = te::reduce_axis(0, te::cast(DType::F32, &n), "k").unwrap_err();
/// assert!(e.to_string().contains("reduce_axis 'k': bounds must be int64 expressions"), "{e}");
/// // A reversed constant range is refused where it is written (hostile bounds too):
/// let e = te::reduce_axis(5, 2, "r").unwrap_err();
/// assert!(e.to_string().contains("reduce_axis 'r': the range [5, 2) is reversed"), "{e}");
/// assert!(te::reduce_axis(i64::MAX, i64::MIN, "r").is_err()); // hi - lo wraps to 1 in i64
/// assert!(te::reduce_axis(i64::MIN, i64::MAX, "r").is_err()); // 2^64 - 1 values
/// // An empty range is an empty reduction: the sum is 0.
/// let x = te::placeholder([8], DType::F32, "X")?;
/// let r = te::reduce_axis(3, 3, "r")?;
/// let s = te::compute((), |[]| te::sum(x.at([&r]), &r), "S")?;
/// let f = build(&Schedule::new(&[&s])?, &[&x, &s], "cpu", "s")?.get_function("s")?;
/// let (a, out) = (rivet_runtime::Tensor::from_slice(&[1f32; 8], &[8])?, rivet_runtime::Tensor::from_slice(&[f32::NAN], &[])?);
/// f.call(&[a.into(), out.clone().into()])?;
/// assert_eq!(out.to_vec::<f32>()?, [0.0]);
/// # Ok(())
/// # }
/// ```
pub fn reduce_axis(lo: impl Into<Expr>, hi: impl Into<Expr>, name: &str) -> Result<IterVar> {
    let (lo, hi): (Expr, Expr) = (lo.into(), hi.into());
    if lo.dtype() != DType::I64 || hi.dtype() != DType::I64 {
        return Err(Error::Compile(format!(
            "reduce_axis '{name}': bounds must be int64 expressions"
        )));
    }
    // Constant bounds are checked exactly (i128: `hi - lo` of int64s cannot wrap there): a
    // reversed range is a mistake, not an empty reduction (it used to reach the IR verifier
    // as a negative loop extent: an internal error), and an extent past i64 would wrap.
    // Symbolic bounds are checked at call time, where a negative extent runs no iterations.
    if let (Some(l), Some(h)) = (lo.as_int(), hi.as_int()) {
        let n = h as i128 - l as i128;
        if n < 0 {
            return Err(Error::Compile(format!(
                "reduce_axis '{name}': the range [{l}, {h}) is reversed (extent {n}); lo must be <= hi"
            )));
        }
        if n > i64::MAX as i128 {
            return Err(Error::Compile(format!(
                "reduce_axis '{name}': the range [{l}, {h}) has {n} values, more than an int64 extent holds"
            )));
        }
    }
    let extent = crate::arith::simplify::simplify(&hi.sub(&lo));
    Ok(IterVar {
        var: Var::new(name),
        min: lo,
        extent,
        reduce: true,
    })
}

/// The reduction `op` of `body` over `axes`, checked: an error (a bool body, no axis, an axis
/// that is not a `reduce_axis`) is returned here. `sum`, `prod`, `max_over`, `min_over` and
/// `reduction` carry it in the expression instead, for `compute` to report.
///
/// ```
/// use rivet_compiler::ir::expr::ReduceOp;
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([8], DType::F32, "X")?;
/// let k = te::reduce_axis(0, 8, "k")?;
/// let m = te::reduce(ReduceOp::Max, x.at([&k]), &[k.clone()])?;
/// assert_eq!(m.dtype(), DType::F32);
/// // A bool body, no axis and a data axis are refused here, at the call.
/// let e = te::reduce(ReduceOp::Sum, te::gt(x.at([&k]), 0.0), &[k.clone()]).unwrap_err();
/// assert!(e.to_string().contains("cannot reduce bool values"), "{e}");
/// assert!(te::reduce(ReduceOp::Sum, x.at([&k]), &[]).is_err());
/// let not_reduce = te::compute([8], |[i]| x.at([i]), "Y")?.axis()[0].clone();
/// let e = te::reduce(ReduceOp::Sum, x.at([&k]), &[not_reduce]).unwrap_err();
/// assert!(e.to_string().contains("'i' is not a reduce_axis"), "{e}");
/// # Ok(())
/// # }
/// ```
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

/// The reduction `op` of `body` over `axes` (`&k`, `[&k1, &k2]`, a slice), for a stage body:
/// for a reduction chosen at run time (`te::reduction(op, x.at((i, &r)), &r)`). An error (a
/// bool body, no axis, a data axis) is carried in the expression and reported by `compute`,
/// naming the stage; `reduce` is the checked form.
///
/// ```
/// use rivet_compiler::ir::expr::ReduceOp;
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let (n, m) = (te::var("n"), te::var("m"));
/// let x = te::placeholder([&n, &m], DType::F32, "X")?;
/// let r = te::reduce_axis(0, &m, "r")?;
/// for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
///     let t = te::compute([&n], |[i]| te::reduction(op, x.at((i, &r)), &r), "T")?;
///     assert_eq!(t.reduce_axis().len(), 1);
/// }
/// // The error of a bool body is reported by `compute`, naming the stage.
/// let e = te::compute([&n], |[i]| te::reduction(ReduceOp::Sum, te::gt(x.at((i, &r)), 0.0), &r), "B");
/// assert!(e.unwrap_err().to_string().contains("compute 'B': cannot reduce bool"));
/// # Ok(())
/// # }
/// ```
pub fn reduction(op: ReduceOp, body: impl Into<Expr>, axes: impl Axes) -> Expr {
    let body: Expr = body.into();
    let dt = body.dtype();
    reduce(op, body, &axes.into_axes())
        .unwrap_or_else(|e| Expr::new(ExprKind::Invalid(e.to_string()), dt))
}

/// `sum over axes of body` (`te::sum(a.at([i, &k]) * b.at([&k, j]), &k)`).
///
/// ```
/// use rivet_compiler::{build, te, Schedule};
/// use rivet_runtime::{DType, Tensor, Value};
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let (n, m) = (te::var("n"), te::var("m"));
/// let x = te::placeholder([&n, &m], DType::F32, "X")?;
/// let (r, c) = (te::reduce_axis(0, &n, "r")?, te::reduce_axis(0, &m, "c")?);
/// let total = te::compute((), |[]| te::sum(x.at((&r, &c)), [&r, &c]), "Total")?;
/// let f = build(&Schedule::new(&[&total])?, &[&x, &total], "cpu", "total")?.get_function("total")?;
/// let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// let Value::Tensor(s) = f.call(&[a.into()])? else { unreachable!() };
/// assert_eq!(s.to_vec::<f32>()?, [21.0]);
/// # Ok(())
/// # }
/// ```
pub fn sum(body: impl Into<Expr>, axes: impl Axes) -> Expr {
    reduction(ReduceOp::Sum, body, axes)
}
/// The product over `axes`.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([4, 3], DType::F64, "X")?;
/// let k = te::reduce_axis(0, 3, "k")?;
/// let p = te::compute([4], |[i]| te::prod(x.at((i, &k)), &k), "P")?;
/// assert_eq!((p.dtype(), &*p.reduce_axis()[0].var.name), (DType::F64, "k"));
/// # Ok(())
/// # }
/// ```
pub fn prod(body: impl Into<Expr>, axes: impl Axes) -> Expr {
    reduction(ReduceOp::Prod, body, axes)
}
/// The maximum over `axes`.
///
/// ```
/// use rivet_compiler::{build, te, Schedule};
/// use rivet_runtime::{DType, Tensor, Value};
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder([&n], DType::F32, "X")?;
/// let k = te::reduce_axis(0, &n, "k")?;
/// let hi = te::compute((), |[]| te::max_over(x.at([&k]), &k), "Hi")?;
/// let f = build(&Schedule::new(&[&hi])?, &[&x, &hi], "cpu", "hi")?.get_function("hi")?;
/// // All negative: the maximum starts from -inf, not from 0.
/// let a = Tensor::from_slice(&[-3.0f32, -0.5, -7.0], &[3])?;
/// let Value::Tensor(m) = f.call(&[a.into()])? else { unreachable!() };
/// assert_eq!(m.to_vec::<f32>()?, [-0.5]);
/// # Ok(())
/// # }
/// ```
pub fn max_over(body: impl Into<Expr>, axes: impl Axes) -> Expr {
    reduction(ReduceOp::Max, body, axes)
}
/// The minimum over `axes`.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([5], DType::I32, "X")?;
/// let k = te::reduce_axis(1, 4, "k")?; // elements 1, 2, 3
/// let lo = te::compute((), |[]| te::min_over(x.at([&k]), &k), "Lo")?;
/// assert_eq!((lo.dtype(), lo.reduce_axis()[0].extent.as_int()), (DType::I32, Some(3)));
/// # Ok(())
/// # }
/// ```
pub fn min_over(body: impl Into<Expr>, axes: impl Axes) -> Expr {
    reduction(ReduceOp::Min, body, axes)
}

/// `op` on two operands (expressions or numbers): what the operators `+ - * / %` build, in
/// checked form (`binary(BinOp::Mul, 0.5, x)` for Python's `0.5 * x`).
///
/// ```
/// use rivet_compiler::ir::expr::BinOp;
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([4], DType::F32, "X")?;
/// let i = te::var("i");
/// assert_eq!(te::binary(BinOp::Mul, 0.5, x.at([&i]))?.dtype(), DType::F32);
/// // The mixed-type rule: 0.5 is no int64, and int64 has no true division.
/// let e = te::binary(BinOp::Mul, 0.5, &i).unwrap_err();
/// assert!(e.to_string().contains("0.5") && e.to_string().contains("int64"), "{e}");
/// let e = te::binary(BinOp::Div, &i, 2).unwrap_err();
/// assert!(e.to_string().contains("Div needs float operands"), "{e}");
/// # Ok(())
/// # }
/// ```
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
///
/// Python's `te.max(a, b)`; `minimum` is its mirror. A number takes the other operand's dtype
/// (`te::number`).
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([4], DType::F32, "X")?;
/// let relu = te::compute([4], |[i]| te::maximum(x.at([i]), 0), "Relu")?; // 0 is 0.0 here
/// assert_eq!(relu.dtype(), DType::F32);
/// let i = te::var("i");
/// assert_eq!(te::check(te::minimum(&i, i64::MAX))?.to_string(), "min(i, 9223372036854775807)");
/// // A float that an int64 expression cannot hold is refused, naming the stage.
/// let e = te::compute([4], |[i]| x.at([te::maximum(&i, 0.5)]), "Bad").unwrap_err();
/// assert!(e.to_string().contains("compute 'Bad'") && e.to_string().contains("0.5"), "{e}");
/// # Ok(())
/// # }
/// ```
pub fn maximum(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    binary_body(BinOp::Max, a, b)
}
/// Elementwise minimum of two operands (see `maximum`).
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([4], DType::F16, "X")?;
/// let capped = te::check(te::minimum(x.at([0]), 6.0))?;
/// assert_eq!(capped.dtype(), DType::F16);
/// # Ok(())
/// # }
/// ```
pub fn minimum(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    binary_body(BinOp::Min, a, b)
}

/// A constant of `dtype` (floats rounded to it; for an int dtype the value is truncated
/// toward zero and saturated to the dtype's range, as a cast is; bool is `value != 0`):
/// `Expr::constant`.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let c = te::constant(0.25, DType::F16);
/// assert_eq!(c.dtype(), DType::F16);
/// // No checking here: an int dtype truncates (`number_like` refuses instead).
/// assert_eq!(te::constant(2.9, DType::I64).as_int(), Some(2));
/// assert_eq!(te::constant(300.0, DType::I8).as_int(), Some(127));
/// assert_eq!(te::constant(-1.0, DType::U32).as_int(), Some(0));
/// assert_eq!(te::constant(f64::NAN, DType::I32).as_int(), Some(0));
/// assert!(te::check(te::number_like(2.9, &te::var("n"))).is_err());
/// # Ok(())
/// # }
/// ```
pub fn constant(value: f64, dtype: DType) -> Expr {
    Expr::constant(value, dtype)
}

/// `e` converted to `dtype` (Python's `te.cast`); any dtype to any dtype.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([4], DType::F32, "X")?;
/// let i = te::var("i");
/// assert_eq!(te::cast(DType::F32, &i).dtype(), DType::F32);
/// // An index must be int64: a float one is refused until cast.
/// assert!(x.try_at([te::cast(DType::F32, &i)]).is_err());
/// assert!(x.try_at([te::cast(DType::I64, te::cast(DType::F32, &i))]).is_ok());
/// // A cast to the expression's own dtype is the expression itself.
/// assert_eq!(te::cast(DType::I64, &i).to_string(), "i");
/// # Ok(())
/// # }
/// ```
pub fn cast(dtype: DType, e: impl Into<Expr>) -> Expr {
    Expr::cast(dtype, e.into())
}

/// `a` where `cond` holds, else `b`; a number for `cond` is a constant of its own dtype.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder([&n], DType::F32, "X")?;
/// // Shift right by one, with a 0 coming in: the guard keeps the read in bounds.
/// let y = te::compute([&n], |[i]| te::if_then_else(te::gt(&i, 0), x.at([&i - 1]), 0.0), "Y")?;
/// assert_eq!(y.dtype(), DType::F32);
/// // The arms must agree: an int64 arm and the float 0.5 are refused, naming the stage.
/// let e = te::compute([&n], |[i]| te::if_then_else(te::gt(&i, 0), &i, 0.5), "Bad").unwrap_err();
/// assert!(e.to_string().contains("compute 'Bad'"), "{e}");
/// # Ok(())
/// # }
/// ```
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
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let i = te::var("i");
/// assert_eq!(te::try_if_then_else(te::lt(&i, 0), -1, 1)?.dtype(), DType::I64);
/// let e = te::try_if_then_else(&i, 1.0, 2.0).unwrap_err();
/// assert!(e.to_string().contains("condition must be bool"), "{e}");
/// # Ok(())
/// # }
/// ```
pub fn try_if_then_else(
    cond: impl Into<Operand>,
    a: impl Into<Operand>,
    b: impl Into<Operand>,
) -> Result<Expr> {
    let (x, y) = operands("if_then_else", a.into(), b.into())?;
    Expr::select(operand(cond.into()), x, y)
}

/// Logical and / or of two bool operands.
///
/// ```
/// use rivet_compiler::ir::expr::LogicOp;
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let i = te::var("i");
/// let inside = te::logic(LogicOp::And, te::ge(&i, 0), te::lt(&i, 10))?;
/// assert_eq!(inside.dtype(), DType::Bool);
/// // Only bools: 1 is `true` here, 2 is no bool, and an int64 expression is refused.
/// assert!(te::logic(LogicOp::Or, te::lt(&i, 0), 1).is_ok());
/// assert!(te::logic(LogicOp::Or, te::lt(&i, 0), 2).is_err());
/// let e = te::logic(LogicOp::And, &i, true).unwrap_err();
/// assert!(e.to_string().contains("needs bool operands"), "{e}");
/// # Ok(())
/// # }
/// ```
pub fn logic(op: LogicOp, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<Expr> {
    let (x, y) = operands(&format!("{op:?}"), a.into(), b.into())?;
    Expr::logic(op, x, y)
}
/// Logical and of two bool operands (`logic(LogicOp::And, ..)` with the error carried).
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let (i, j) = (te::var("i"), te::var("j"));
/// let diag = te::all(te::eq(&i, &j), te::not(te::lt(&i, 0)));
/// assert_eq!(te::check(diag)?.dtype(), DType::Bool);
/// let either = te::any(te::lt(&i, 0), te::ge(&i, i64::MAX));
/// assert_eq!(either.dtype(), DType::Bool);
/// // An int64 operand is carried as an error, reported by `check` (or `compute`).
/// assert!(te::check(te::any(&i, true)).is_err());
/// assert!(te::check(te::not(&i)).is_err());
/// # Ok(())
/// # }
/// ```
pub fn all(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    or_invalid(logic(LogicOp::And, a, b), DType::Bool)
}
/// Logical or of two bool operands (`logic(LogicOp::Or, ..)` with the error carried).
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let i = te::var("i");
/// assert!(te::check(te::any(te::lt(&i, 0), false)).is_ok());
/// # Ok(())
/// # }
/// ```
pub fn any(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    or_invalid(logic(LogicOp::Or, a, b), DType::Bool)
}
/// Logical not of a bool expression.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let i = te::var("i");
/// assert_eq!(te::check(te::not(te::lt(&i, 0)))?.dtype(), DType::Bool);
/// let e = te::check(te::not(te::cast(DType::F32, &i))).unwrap_err();
/// assert!(e.to_string().contains("Not is not defined on float32"), "{e}");
/// // Numbers too, as `all` and `any` take them:
/// assert_eq!(te::not(true).dtype(), DType::Bool);
/// # Ok(())
/// # }
/// ```
pub fn not(a: impl Into<Operand>) -> Expr {
    or_invalid(Expr::unary(UnOp::Not, operand(a.into())), DType::Bool)
}

macro_rules! unary_fns {
    ($($(#[$doc:meta])* $name:ident => $op:ident),*) => {
        $(
            #[doc = concat!("`", stringify!($name), "(a)`, elementwise.")]
            $(#[$doc])*
            pub fn $name(a: impl Into<Expr>) -> Expr {
                let a: Expr = a.into();
                let dt = a.dtype();
                or_invalid(Expr::unary(UnOp::$op, a), dt)
            }
        )*
    };
}
unary_fns!(
    /// Float operands only, except `abs` (any non-bool dtype); the result has the operand's
    /// dtype. The family: `exp`, `log`, `sqrt`, `rsqrt`, `tanh`, `sigmoid`, `abs`, `floor`,
    /// `ceil`, `erf`.
    ///
    /// ```
    /// use rivet_compiler::{build, te, Schedule};
    /// use rivet_runtime::{DType, Tensor, Value};
    ///
    /// # fn main() -> rivet_compiler::Result<()> {
    /// let x = te::placeholder([2], DType::F32, "X")?;
    /// let y = te::compute([2], |[i]| {
    ///     te::floor(x.at([&i])) + te::ceil(x.at([&i])) + te::sqrt(te::abs(x.at([i])))
    /// }, "Y")?;
    /// let f = build(&Schedule::new(&[&y])?, &[&x, &y], "cpu", "y")?.get_function("y")?;
    /// let a = Tensor::from_slice(&[-4.0f32, 2.25], &[2])?;
    /// let Value::Tensor(b) = f.call(&[a.into()])? else { unreachable!() };
    /// assert_eq!(b.to_vec::<f32>()?, [-6.0, 6.5]);
    /// // An int64 operand is refused (cast it first); `abs` takes it.
    /// let e = te::check(te::exp(te::var("i"))).unwrap_err();
    /// assert!(e.to_string().contains("Exp is not defined on int64"), "{e}");
    /// assert_eq!(te::check(te::abs(te::var("i")))?.dtype(), DType::I64);
    /// # Ok(())
    /// # }
    /// ```
    exp => Exp,
    /// See [`exp`] for the family and an example.
    log => Log,
    /// See [`exp`].
    sqrt => Sqrt,
    /// `1 / sqrt(a)`. See [`exp`].
    rsqrt => Rsqrt,
    /// See [`exp`].
    tanh => Tanh,
    /// `1 / (1 + exp(-a))`. See [`exp`].
    sigmoid => Sigmoid,
    /// Also on int dtypes. See [`exp`].
    abs => Abs,
    /// See [`exp`].
    floor => Floor,
    /// See [`exp`].
    ceil => Ceil,
    /// The error function. See [`exp`].
    erf => Erf
);

/// `a` to the power `b` (floats only).
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([3], DType::F32, "X")?;
/// assert_eq!(te::check(te::pow(x.at([0]), 2))?.dtype(), DType::F32);
/// // Float operands only: an int64 power is refused.
/// let e = te::check(te::pow(te::var("i"), 2)).unwrap_err();
/// assert!(e.to_string().contains("Pow needs float operands"), "{e}");
/// # Ok(())
/// # }
/// ```
pub fn pow(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    binary_body(BinOp::Pow, a, b)
}
/// Python's `a // b`: the quotient rounded toward negative infinity (`floormod` is the
/// matching `a % b`, also the `%` operator).
///
/// ```
/// use rivet_compiler::{build, te, Schedule};
/// use rivet_runtime::{DType, Tensor, Value};
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([4], DType::I64, "X")?;
/// let q = te::compute([4], |[i]| te::floordiv(x.at([&i]), 2) * 10 + te::floormod(x.at([i]), 2), "Q")?;
/// let f = build(&Schedule::new(&[&q])?, &[&x, &q], "cpu", "q")?.get_function("q")?;
/// let a = Tensor::from_slice(&[7i64, -7, 0, i64::MIN + 1], &[4])?;
/// let Value::Tensor(r) = f.call(&[a.into()])? else { unreachable!() };
/// // Python's // and %: rounded toward -inf, the remainder takes the divisor's sign.
/// assert_eq!(r.to_vec::<i64>()?[..3], [31, -39, 0]);
/// # Ok(())
/// # }
/// ```
pub fn floordiv(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    binary_body(BinOp::FloorDiv, a, b)
}
/// Python's `a % b` (the sign of `b`): what the `%` operator builds.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let i = te::var("i");
/// assert_eq!(te::check(te::floormod(&i, 4.0))?.to_string(), "(i % 4)");
/// assert_eq!(te::check(&i % 4)?.to_string(), "(i % 4)");
/// # Ok(())
/// # }
/// ```
pub fn floormod(a: impl Into<Operand>, b: impl Into<Operand>) -> Expr {
    binary_body(BinOp::FloorMod, a, b)
}
/// A comparison of two operands, checked (`lt`, `le`, ... carry the error instead).
///
/// ```
/// use rivet_compiler::ir::expr::CmpOp;
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let i = te::var("i");
/// assert_eq!(te::compare(CmpOp::Ge, &i, i64::MAX)?.dtype(), DType::Bool);
/// let e = te::compare(CmpOp::Lt, &i, 0.5).unwrap_err();
/// assert!(e.to_string().contains("Lt") && e.to_string().contains("0.5"), "{e}");
/// # Ok(())
/// # }
/// ```
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
    ///
    /// ```
    /// use rivet_compiler::te;
    /// use rivet_runtime::DType;
    ///
    /// # fn main() -> rivet_compiler::Result<()> {
    /// let n = te::var("n");
    /// let x = te::placeholder([&n], DType::F32, "X")?;
    /// // ReLU written with a comparison; the six are lt, le, gt, ge, eq, ne.
    /// let y = te::compute([&n], |[i]| te::if_then_else(te::lt(x.at([&i]), 0), 0.0, x.at([i])), "Y")?;
    /// assert_eq!(y.dtype(), DType::F32);
    /// let i = te::var("i");
    /// for c in [te::le(&i, 0), te::gt(&i, 0), te::ge(&i, i64::MIN), te::eq(&i, 1), te::ne(&i, 1)] {
    ///     assert_eq!(te::check(c)?.dtype(), DType::Bool);
    /// }
    /// // A float no int64 holds is refused, as for the operators.
    /// assert!(te::check(te::lt(&i, 0.5)).is_err());
    /// # Ok(())
    /// # }
    /// ```
    lt => Lt,
    /// `a <= b`, a bool expression; see [`lt`].
    le => Le,
    /// `a > b`, a bool expression; see [`lt`].
    gt => Gt,
    /// `a >= b`, a bool expression; see [`lt`].
    ge => Ge,
    /// `a == b`, a bool expression; see [`lt`].
    eq => Eq,
    /// `a != b`, a bool expression; see [`lt`].
    ne => Ne
);

/// The first error carried in `e` (an operator or body function that failed), as a
/// `CompileError`; else `e`. Lets `?` report a body's error where it is written.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let (x, i) = (te::placeholder([4], DType::F32, "X")?, te::var("i"));
/// assert_eq!(te::check(x.at([&i]) * 2)?.dtype(), DType::F32);
/// let e = te::check(i * 0.5 + 1).unwrap_err();
/// assert!(e.to_string().contains("the float 0.5 cannot be used as a int64 constant"), "{e}");
/// # Ok(())
/// # }
/// ```
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
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([4], DType::F16, "X")?;
/// assert_eq!(te::number_like(0.5, &x.at([0])).dtype(), DType::F16);
/// assert_eq!(te::number_like(3.0, &te::var("n")).as_int(), Some(3));
/// assert!(te::check(te::number_like(0.5, &te::var("n"))).is_err());
/// # Ok(())
/// # }
/// ```
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
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([4], DType::F32, "X")?;
/// let y = te::compute([4], |[i]| te::ok(x.try_at([i])), "Y")?;
/// assert_eq!(y.dtype(), DType::F32);
/// let e = te::compute([4], |[i]| te::ok(x.try_at([&i, &i])), "Bad").unwrap_err();
/// assert!(e.to_string().contains("has 1 dims but was indexed with 2"), "{e}");
/// # Ok(())
/// # }
/// ```
pub fn ok(r: impl super::dsl::Body) -> Expr {
    r.into_body()
}

/// An index variable as an expression (for `A.idx(&[i.clone(), ax(&k)])`).
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let k = te::reduce_axis(0, 4, "k")?;
/// assert_eq!(te::ax(&k).to_string(), "k");
/// # Ok(())
/// # }
/// ```
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
