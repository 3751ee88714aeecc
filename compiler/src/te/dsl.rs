//! The Rust DSL's conversions: what lets a kernel read like its maths (issue 11). Indices,
//! dims and reduction axes accept expressions (owned or borrowed), axes (`IterVar`, owned or
//! borrowed) and integers alike, in arrays (`a.at([i, j])`), tuples when the kinds differ
//! (`a.at((i, &k))`) or slices (`a.at(&idx[..])`), so no `.clone()`, `ax(&k)` or wrapper is
//! needed to write an index.
//!
//! Invariants: every conversion is total and exact (an integer becomes an int64 constant, an
//! axis the expression of its variable); the checks (dtype, number of indices) stay where
//! they were, in `Tensor::try_at`, `compute`, `reduce`: a conversion never decides validity,
//! so a wrong index is still an error naming the tensor and the index, reported by `compute`.

use crate::error::Result;
use crate::ir::expr::{Expr, IterVar};

impl From<&Expr> for Expr {
    fn from(e: &Expr) -> Expr {
        e.clone()
    }
}
impl From<&IterVar> for Expr {
    fn from(a: &IterVar) -> Expr {
        Expr::var(&a.var)
    }
}
impl From<IterVar> for Expr {
    fn from(a: IterVar) -> Expr {
        Expr::var(&a.var)
    }
}
impl From<i64> for Expr {
    fn from(v: i64) -> Expr {
        Expr::int(v)
    }
}
impl From<i32> for Expr {
    fn from(v: i32) -> Expr {
        Expr::int(v.into())
    }
}
impl From<u32> for Expr {
    fn from(v: u32) -> Expr {
        Expr::int(v.into())
    }
}

/// The indices of one element (`Tensor::at`) or the dims of a shape (`placeholder`,
/// `compute`): one int64 expression each.
pub trait Indices {
    fn into_exprs(self) -> Vec<Expr>;
}

impl<T: Into<Expr>, const N: usize> Indices for [T; N] {
    fn into_exprs(self) -> Vec<Expr> {
        self.into_iter().map(Into::into).collect()
    }
}
impl<T: Clone + Into<Expr>, const N: usize> Indices for &[T; N] {
    fn into_exprs(self) -> Vec<Expr> {
        self.iter().cloned().map(Into::into).collect()
    }
}
impl<T: Clone + Into<Expr>> Indices for &[T] {
    fn into_exprs(self) -> Vec<Expr> {
        self.iter().cloned().map(Into::into).collect()
    }
}
impl<T: Into<Expr>> Indices for Vec<T> {
    fn into_exprs(self) -> Vec<Expr> {
        self.into_iter().map(Into::into).collect()
    }
}
impl<T: Clone + Into<Expr>> Indices for &Vec<T> {
    fn into_exprs(self) -> Vec<Expr> {
        self.iter().cloned().map(Into::into).collect()
    }
}

/// No indices: a rank-0 shape or element (`te::compute((), |[]| ..)`, `s.at(())`).
impl Indices for () {
    fn into_exprs(self) -> Vec<Expr> {
        Vec::new()
    }
}

macro_rules! tuple_indices {
    ($($t:ident $v:ident),+) => {
        impl<$($t: Into<Expr>),+> Indices for ($($t,)+) {
            fn into_exprs(self) -> Vec<Expr> {
                let ($($v,)+) = self;
                vec![$($v.into()),+]
            }
        }
    };
}
tuple_indices!(A a);
tuple_indices!(A a, B b);
tuple_indices!(A a, B b, C c);
tuple_indices!(A a, B b, C c, D d);
tuple_indices!(A a, B b, C c, D d, E e);
tuple_indices!(A a, B b, C c, D d, E e, F f);
tuple_indices!(A a, B b, C c, D d, E e, F f, G g);
tuple_indices!(A a, B b, C c, D d, E e, F f, G g, H h);

/// The axes of a reduction (`te::sum(expr, &k)`, `te::sum(expr, [&k1, &k2])`).
pub trait Axes {
    fn into_axes(self) -> Vec<IterVar>;
}

impl Axes for &IterVar {
    fn into_axes(self) -> Vec<IterVar> {
        vec![self.clone()]
    }
}
impl Axes for IterVar {
    fn into_axes(self) -> Vec<IterVar> {
        vec![self]
    }
}
impl<const N: usize> Axes for [&IterVar; N] {
    fn into_axes(self) -> Vec<IterVar> {
        self.into_iter().cloned().collect()
    }
}
impl<const N: usize> Axes for [IterVar; N] {
    fn into_axes(self) -> Vec<IterVar> {
        self.into()
    }
}
impl<const N: usize> Axes for &[IterVar; N] {
    fn into_axes(self) -> Vec<IterVar> {
        self.to_vec()
    }
}
impl Axes for &[IterVar] {
    fn into_axes(self) -> Vec<IterVar> {
        self.to_vec()
    }
}
impl Axes for &Vec<IterVar> {
    fn into_axes(self) -> Vec<IterVar> {
        self.clone()
    }
}

/// A stage body, as `te::ok` takes it: an expression (whose errors, if any, are carried
/// inside it as `Invalid` and reported by `compute`) or a `Result` of one.
pub trait Body {
    fn into_body(self) -> Expr;
}
impl Body for Expr {
    fn into_body(self) -> Expr {
        self
    }
}
impl Body for Result<Expr> {
    fn into_body(self) -> Expr {
        self.unwrap_or_else(|e| {
            Expr::new(
                crate::ir::expr::ExprKind::Invalid(e.to_string()),
                rivet_runtime::DType::F32,
            )
        })
    }
}
