//! The Rust DSL's conversions: what lets a kernel read like its maths. Indices,
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
///
/// ```
/// use rivet_compiler::te::{self, Indices};
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let k = te::reduce_axis(0, &n, "k")?;
/// assert_eq!([&n, &n].into_exprs().len(), 2); // an array of one kind
/// assert_eq!((&n, 4, &k).into_exprs()[2].to_string(), "k"); // a tuple of mixed kinds
/// assert_eq!(vec![1i64, i64::MAX].into_exprs()[1].as_int(), Some(i64::MAX));
/// assert!(().into_exprs().is_empty()); // rank 0
/// let x = te::placeholder((&n, 3), DType::F32, "X")?;
/// assert_eq!(x.at((&k, 2)).dtype(), DType::F32);
/// # Ok(())
/// # }
/// ```
pub trait Indices {
    /// The index expressions, in order.
    ///
    /// ```
    /// use rivet_compiler::te::Indices;
    ///
    /// assert_eq!([3, 4].into_exprs()[1].as_int(), Some(4));
    /// ```
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
///
/// ```
/// use rivet_compiler::te::{self, Axes};
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([4, 5], DType::F32, "X")?;
/// let (r, c) = (te::reduce_axis(0, 4, "r")?, te::reduce_axis(0, 5, "c")?);
/// assert_eq!([&r, &c].into_axes().len(), 2);
/// let both = vec![r.clone(), c.clone()];
/// let s = te::compute((), |[]| te::sum(x.at((&r, &c)), &both), "S")?;
/// assert_eq!(s.reduce_axis().len(), 2);
/// let m = te::compute([4], |[i]| te::max_over(x.at((i, &c)), &c), "M")?;
/// assert_eq!(&*m.reduce_axis()[0].var.name, "c");
/// # Ok(())
/// # }
/// ```
pub trait Axes {
    /// The axes, in order.
    ///
    /// ```
    /// use rivet_compiler::te::{self, Axes};
    ///
    /// # fn main() -> rivet_compiler::Result<()> {
    /// let k = te::reduce_axis(0, 4, "k")?;
    /// assert_eq!(k.into_axes()[0].extent.as_int(), Some(4));
    /// # Ok(())
    /// # }
    /// ```
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
///
/// ```
/// use rivet_compiler::te::{self, Body};
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([4], DType::F32, "X")?;
/// assert_eq!(x.try_at([1]).into_body().dtype(), DType::F32);
/// // A failed `Result` becomes an expression carrying the error, which `check` gives back.
/// let e = te::check(x.try_at([1, 2]).into_body()).unwrap_err();
/// assert!(e.to_string().contains("has 1 dims but was indexed with 2"), "{e}");
/// # Ok(())
/// # }
/// ```
pub trait Body {
    /// The expression (an error carried in it).
    ///
    /// ```
    /// use rivet_compiler::te::{self, Body};
    ///
    /// assert_eq!(te::var("n").into_body().to_string(), "n");
    /// ```
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
