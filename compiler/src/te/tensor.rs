//! Tensors of the DSL: placeholders (inputs), computes (a body over index variables) and
//! extern stages (values a host callback computes from whole input tensors: `extern_`).
//!
//! A `Tensor` is a cheap handle; identity is its `id`. A compute's body may read other
//! tensors (multi-stage programs); a reduction (`sum`, `max`, ...) may only be the top-level
//! node of a body, as in TVM, so every stage is either elementwise
//! or one reduction.

use super::dsl::Indices;
use crate::error::{Error, Result};
use crate::ir::expr::{Expr, ExprKind, IterVar, ReduceOp, TensorRef, Var};
use rivet_runtime::DType;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// What a tensor is: an input, a compute stage, or an extern (host callback) stage.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([3], DType::F32, "X")?;
/// let y = te::compute([3], |[i]| x.at([i]) + 1.0, "Y")?;
/// assert!(matches!(x.op(), te::Op::Placeholder));
/// assert!(matches!(y.op(), te::Op::Compute { axis, .. } if axis.len() == 1));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub enum Op {
    /// An input: its values are an argument of the built function.
    Placeholder,
    /// `body` over `axis` (one data-parallel `IterVar` per output dim, `[0, shape[d])`).
    Compute {
        /// The data-parallel axes, one per dim.
        axis: Vec<IterVar>,
        /// The value of one element (a reduction only at its top).
        body: Expr,
    },
    /// Computed by a host callback from whole, materialised `inputs` (TVM's `te.extern`):
    /// no axes, no body; `ir::callback` gives the calling convention.
    Extern {
        /// The tensors handed to the callback, in call order.
        inputs: Vec<Tensor>,
        /// The host function and how it is called.
        callback: crate::ir::callback::Callback,
    },
}

/// What a `Tensor` handle points to.
#[derive(Debug)]
pub struct TensorNode {
    /// Identity (`Tensor::id`).
    pub id: u32,
    /// `Tensor::name`.
    pub name: String,
    /// `Tensor::shape`.
    pub shape: Vec<Expr>,
    /// `Tensor::dtype`.
    pub dtype: DType,
    /// `Tensor::op`.
    pub op: Op,
    /// This stage is an extern stage or reads one, directly or through other stages: a host
    /// callback (possibly a Python callable) is reachable from it. Lets the Python bindings'
    /// garbage-collector support skip programs that hold no callback (`bindings/src/gc.rs`).
    pub host_callbacks: bool,
    /// `te::stop_gradient` made this stage: `te::gradient` treats its values as constants
    /// (no adjoint flows through it into what it reads), as JAX's `lax.stop_gradient`.
    pub stop_gradient: bool,
}

/// The operation (a body, an extern stage's inputs) is dropped through
/// `ir::deferred_drop`: the last handle of a 20,000-stage chain frees it without a stack
/// frame per stage.
impl Drop for TensorNode {
    fn drop(&mut self) {
        if matches!(self.op, Op::Placeholder) {
            return;
        }
        let op = std::mem::replace(&mut self.op, Op::Placeholder);
        crate::ir::deferred_drop::drop_deferred(crate::ir::deferred_drop::Deferred::Other(
            Box::new(op),
        ));
    }
}

/// A tensor of the DSL (a cheap, clonable handle to its `TensorNode`): made by `placeholder`,
/// `compute`, `compute_dyn`, `extern_` or `stop_gradient`, and read in a body with `at`.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder((&n, 4), DType::F32, "X")?;
/// let y = te::compute((&n, 4), |[i, j]| x.at([i, j]) * 2.0, "Y")?;
/// assert_eq!((y.name(), y.ndim(), y.dtype()), ("Y", 2, DType::F32));
/// assert_eq!(y.shape()[1].as_int(), Some(4));
/// assert!(x.is_placeholder() && !y.is_placeholder() && !y.is_extern());
/// assert_eq!((y.axis().len(), y.reduce_axis().len()), (2, 0));
/// assert_eq!(y.body().map(|b| b.to_string()), Some("(X[i, j] * 2.0:float32)".to_string()));
/// // A handle: clones are the same tensor, another stage is not.
/// assert!(y.clone() == y && x.id() != y.id());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Tensor(pub Arc<TensorNode>);

static NEXT_TENSOR: AtomicU32 = AtomicU32::new(1);

impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        self.0.id == other.0.id
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({}, {}, {:?})",
            self.0.name, self.0.dtype, self.0.shape
        )
    }
}

impl Tensor {
    /// The handle a `Read` of this tensor holds.
    pub fn as_ref(&self) -> TensorRef {
        TensorRef::new(self.0.id, &self.0.name, self.0.clone())
    }

    /// The tensor a `Read` reads (te builds every `Read`, always from a `Tensor`).
    pub fn of(r: &TensorRef) -> Tensor {
        Tensor(
            r.downcast::<TensorNode>()
                .expect("te reads hold te tensors"),
        )
    }
}

fn check_shape(shape: &[Expr], what: &str) -> Result<()> {
    for (d, e) in shape.iter().enumerate() {
        if e.dtype() != DType::I64 {
            return Err(Error::Compile(format!(
                "{what}: dim {d} ({e}) must be an int64 expression, got {}",
                e.dtype()
            )));
        }
        if let Some(v) = e.as_int() {
            if v < 0 {
                return Err(Error::Compile(format!("{what}: dim {d} is negative ({v})")));
            }
        }
    }
    Ok(())
}

/// The reduction of a body, if the body is one (reductions are only allowed at the top).
pub fn top_reduce(body: &Expr) -> Option<(ReduceOp, &Expr, &[IterVar])> {
    match body.kind() {
        ExprKind::Reduce { op, body, axes } => Some((*op, body, axes)),
        _ => None,
    }
}

impl Tensor {
    /// The tensor's identity (unique in the process; clones share it).
    pub fn id(&self) -> u32 {
        self.0.id
    }
    /// The name given at creation (stage names in errors and printed IR).
    pub fn name(&self) -> &str {
        &self.0.name
    }
    /// One int64 expression per dim (constants or expressions over `te::var`s).
    pub fn shape(&self) -> &[Expr] {
        &self.0.shape
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    /// The number of dims (0 for a scalar).
    pub fn ndim(&self) -> usize {
        self.0.shape.len()
    }
    /// What computes it: see `Op`.
    pub fn op(&self) -> &Op {
        &self.0.op
    }
    /// Whether it is an input (`placeholder`).
    pub fn is_placeholder(&self) -> bool {
        matches!(self.0.op, Op::Placeholder)
    }

    /// The data-parallel axes of a compute (empty for a placeholder).
    pub fn axis(&self) -> &[IterVar] {
        match &self.0.op {
            Op::Compute { axis, .. } => axis,
            Op::Placeholder | Op::Extern { .. } => &[],
        }
    }

    /// The reduction axes of a compute (empty when it has no reduction).
    pub fn reduce_axis(&self) -> &[IterVar] {
        match &self.0.op {
            Op::Compute { body, .. } => top_reduce(body).map(|(_, _, a)| a).unwrap_or(&[]),
            Op::Placeholder | Op::Extern { .. } => &[],
        }
    }

    /// The body of a compute (a reduction at its top, if any); `None` otherwise.
    pub fn body(&self) -> Option<&Expr> {
        match &self.0.op {
            Op::Compute { body, .. } => Some(body),
            Op::Placeholder | Op::Extern { .. } => None,
        }
    }

    /// The callback of an extern stage.
    pub fn extern_callback(&self) -> Option<&crate::ir::callback::Callback> {
        match &self.0.op {
            Op::Extern { callback, .. } => Some(callback),
            _ => None,
        }
    }

    /// Whether this stage was made by `stop_gradient`.
    pub fn stops_gradient(&self) -> bool {
        self.0.stop_gradient
    }
    /// Whether it is an extern stage (`extern_`).
    pub fn is_extern(&self) -> bool {
        matches!(self.0.op, Op::Extern { .. })
    }

    /// The element at `indices` (int64 expressions, axes or integers, one per dim:
    /// `te::Indices`), or why it cannot be read there.
    ///
    /// ```
    /// use rivet_compiler::{build, te, Schedule};
    /// use rivet_runtime::DType;
    ///
    /// # fn main() -> rivet_compiler::Result<()> {
    /// let x = te::placeholder([4, 4], DType::F32, "X")?;
    /// let i = te::var("i");
    /// assert_eq!(x.try_at((&i, 0))?.dtype(), DType::F32);
    /// let e = x.try_at([&i]).unwrap_err();
    /// assert!(e.to_string().contains("tensor 'X' has 2 dims but was indexed with 1 indices"), "{e}");
    /// let e = x.try_at([x.at([0, 0]), x.at([1, 1])]).unwrap_err();
    /// assert!(e.to_string().contains("index 0 of 'X' must be an int64 expression"), "{e}");
    /// let e = x.try_at([te::cast(DType::I64, x.at([0, 0])), i.clone()]).unwrap_err();
    /// assert!(e.to_string().contains("data-dependent indices are not supported"), "{e}");
    /// // Any int64 expression is an index, i64::MAX too: bounds are proved when building
    /// // (or, for symbolic dims, checked when called).
    /// let y = te::compute([4], |[i]| x.at([&i, &i]) + x.at([i64::MAX, 0]), "Y")?;
    /// let e = build(&Schedule::new(&[&y])?, &[&x, &y], "cpu", "y").err().expect("refused");
    /// assert!(e.to_string().contains("index 9223372036854775807 must lie in [0, 4)"), "{e}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_at(&self, indices: impl Indices) -> Result<Expr> {
        let indices = indices.into_exprs();
        if indices.len() != self.ndim() {
            return Err(Error::Compile(format!(
                "tensor '{}' has {} dims but was indexed with {} indices",
                self.name(),
                self.ndim(),
                indices.len()
            )));
        }
        for (d, i) in indices.iter().enumerate() {
            if i.dtype() != DType::I64 {
                return Err(Error::Compile(format!(
                    "index {d} of '{}' must be an int64 expression, got {} ({i}); cast it with te.cast('int64', ...)",
                    self.name(),
                    i.dtype()
                )));
            }
            let mut data_dependent = false;
            i.visit_unique(&mut |e| data_dependent |= matches!(e.kind(), ExprKind::Read { .. }));
            if data_dependent {
                return Err(Error::Compile(format!(
                    "index {d} of '{}' ({i}) reads a tensor: data-dependent indices are not supported yet",
                    self.name()
                )));
            }
        }
        Ok(Expr::new(
            ExprKind::Read {
                tensor: self.as_ref(),
                indices,
            },
            self.dtype(),
        ))
    }

    /// The element at `indices`, for DSL closures: `a.at([i, j])`, `a.at((i, &k))` (axes,
    /// expressions and integers; a tuple when their kinds differ). A wrong index (count,
    /// dtype) is carried in the expression and reported by `compute` as a `CompileError`
    /// naming the stage, the tensor and the index: never a panic.
    ///
    /// ```
    /// use rivet_compiler::te;
    /// use rivet_runtime::DType;
    ///
    /// # fn main() -> rivet_compiler::Result<()> {
    /// let (n, m) = (te::var("n"), te::var("m"));
    /// let a = te::placeholder([&n, &m], DType::F32, "A")?;
    /// let k = te::reduce_axis(0, &m, "k")?;
    /// // Arrays of one kind, tuples of mixed kinds (expressions, axes, integers).
    /// let s = te::compute([&n], |[i]| te::sum(a.at((&i, &k)) + a.at((i, 0)), &k), "S")?;
    /// assert_eq!(s.ndim(), 1);
    /// // A wrong number of indices is reported by `compute`, naming the stage and the tensor.
    /// let e = te::compute([&n], |[i]| a.at([i]), "Bad").unwrap_err().to_string();
    /// assert!(e.contains("compute 'Bad'") && e.contains("tensor 'A' has 2 dims"), "{e}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn at(&self, indices: impl Indices) -> Expr {
        self.try_at(indices)
            .unwrap_or_else(|e| Expr::new(ExprKind::Invalid(e.to_string()), self.dtype()))
    }

    /// `at` with the indices as a slice (`A.idx(&[i, k])`, `S.idx(&[])` for a scalar).
    ///
    /// ```
    /// use rivet_compiler::te;
    /// use rivet_runtime::DType;
    ///
    /// # fn main() -> rivet_compiler::Result<()> {
    /// let x = te::placeholder([4], DType::F32, "X")?;
    /// let s = te::placeholder((), DType::F32, "S")?;
    /// let idx = [te::var("i")];
    /// assert_eq!(x.idx(&idx).to_string(), x.at([te::var("i")]).to_string());
    /// assert_eq!(s.idx(&[]).dtype(), DType::F32);
    /// # Ok(())
    /// # }
    /// ```
    pub fn idx(&self, indices: &[Expr]) -> Expr {
        self.at(indices)
    }
}

/// An input tensor of `shape` (`te::Indices`: `[&n, &m]`, `(&n, 4)`, `&dims[..]`).
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder((&n, 4), DType::U8, "X")?;
/// assert_eq!((x.ndim(), x.dtype(), x.shape()[1].as_int()), (2, DType::U8, Some(4)));
/// assert_eq!(te::placeholder((), DType::F32, "S")?.ndim(), 0);
/// // Dims are int64 and not negative.
/// let e = te::placeholder([-1], DType::F32, "P").unwrap_err();
/// assert!(e.to_string().contains("placeholder 'P': dim 0 is negative (-1)"), "{e}");
/// assert!(te::placeholder([te::cast(DType::F32, &n)], DType::F32, "P").is_err());
/// # Ok(())
/// # }
/// ```
pub fn placeholder(shape: impl Indices, dtype: DType, name: &str) -> Result<Tensor> {
    let shape = shape.into_exprs();
    check_shape(&shape, &format!("placeholder '{name}'"))?;
    Ok(Tensor(Arc::new(TensorNode {
        id: NEXT_TENSOR.fetch_add(1, Ordering::Relaxed),
        name: name.to_string(),
        shape,
        dtype,
        op: Op::Placeholder,
        host_callbacks: false,
        stop_gradient: false,
    })))
}

/// A computed tensor of `shape` (`te::Indices`): `fcompute` receives one int64 index
/// expression per dim, as an array, and returns the element's value:
/// `compute([&n, &m], |[i, j]| a.at([i, j]) * 2.0, "B")`. The closure's array length must be
/// the shape's rank (else a `CompileError` naming the stage); `compute_dyn` takes a rank known
/// only at run time. An error inside the body (a wrong index, a mixed-type operation) is
/// reported here, naming the stage.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder([&n], DType::F32, "X")?;
/// let y = te::compute([&n, &n], |[i, j]| x.at([i]) * x.at([j]), "Outer")?;
/// assert_eq!(y.ndim(), 2);
/// // The closure takes as many indices as the shape has dims.
/// let e = te::compute([&n, &n], |[i]| x.at([i]), "Y").unwrap_err();
/// assert!(e.to_string().contains("the shape has 2 dims but the closure takes 1 indices"), "{e}");
/// // A mixed-type error in the body is reported here, naming the stage.
/// let e = te::compute([&n], |[i]| x.at([&i * 0.5]), "Half").unwrap_err().to_string();
/// assert!(e.contains("compute 'Half'") && e.contains("0.5"), "{e}");
/// # Ok(())
/// # }
/// ```
pub fn compute<const N: usize>(
    shape: impl Indices,
    fcompute: impl FnOnce([Expr; N]) -> Expr,
    name: &str,
) -> Result<Tensor> {
    let shape = shape.into_exprs();
    if shape.len() != N {
        return Err(Error::Compile(format!(
            "compute '{name}': the shape has {} dims but the closure takes {N} indices",
            shape.len()
        )));
    }
    let axis = data_axes(&shape);
    let idx: [Expr; N] = std::array::from_fn(|d| Expr::var(&axis[d].var));
    let body = fcompute(idx);
    compute_from(&shape, axis, body, name)
}

/// `compute` for a rank known only at run time: `fcompute` receives the indices as a slice.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let rank = 3; // known at run time
/// let dims: Vec<_> = (0..rank).map(|d| te::var(&format!("d{d}"))).collect();
/// let x = te::placeholder(&dims, DType::F32, "X")?;
/// let y = te::compute_dyn(&dims, |idx| x.at(idx) * 2.0, "Y")?;
/// assert_eq!((y.ndim(), y.axis().len()), (3, 3));
/// // Stage axes are named i, j, k, ...
/// assert_eq!(&*y.axis()[2].var.name, "k");
/// # Ok(())
/// # }
/// ```
pub fn compute_dyn(
    shape: impl Indices,
    fcompute: impl FnOnce(&[Expr]) -> Expr,
    name: &str,
) -> Result<Tensor> {
    let shape = shape.into_exprs();
    let axis = data_axes(&shape);
    let idx: Vec<Expr> = axis.iter().map(|a| Expr::var(&a.var)).collect();
    let body = fcompute(&idx);
    compute_from(&shape, axis, body, name)
}

/// One data-parallel axis per dim of `shape`, named i, j, k, ...
fn data_axes(shape: &[Expr]) -> Vec<IterVar> {
    let names = ["i", "j", "k", "l", "m", "n", "o", "p"];
    shape
        .iter()
        .enumerate()
        .map(|(d, ext)| IterVar {
            var: Var::new(names.get(d).copied().unwrap_or("ax")),
            min: Expr::int(0),
            extent: ext.clone(),
            reduce: false,
        })
        .collect()
}

/// `compute` with explicit axes and body (used by the Python DSL, which builds them itself).
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let x = te::placeholder([4], DType::F32, "X")?;
/// let like = te::compute([4], |[i]| x.at([i]), "Like")?;
/// let axis = like.axis().to_vec();
/// let body = te::exp(x.at([te::ax(&axis[0])]));
/// let y = te::compute_from(like.shape(), axis, body, "Y")?;
/// assert_eq!(y.body().map(|b| b.to_string()), Some("exp(X[i])".to_string()));
/// # Ok(())
/// # }
/// ```
pub fn compute_from(shape: &[Expr], axis: Vec<IterVar>, body: Expr, name: &str) -> Result<Tensor> {
    check_shape(shape, &format!("compute '{name}'"))?;
    let mut problem = None;
    body.visit_unique(&mut |e| {
        if let ExprKind::Invalid(m) = e.kind() {
            problem.get_or_insert_with(|| m.clone());
        }
    });
    if let Some(m) = problem {
        return Err(Error::Compile(format!("compute '{name}': {m}")));
    }
    // Reductions only at the top (under casts).
    let top = top_reduce(&body).map(|(_, inner, _)| inner.clone());
    let mut nested = false;
    let check_from = top.as_ref().unwrap_or(&body);
    check_from.visit_unique(&mut |e| nested |= matches!(e.kind(), ExprKind::Reduce { .. }));
    if nested {
        // A reduction inside a larger expression: its own stage (`split_reduce`).
        if top.is_none() {
            if let Some(t) = super::split_reduce::split(shape, &axis, &body, name)? {
                return Ok(t);
            }
        }
        return Err(Error::Compile(format!(
            "compute '{name}': a reduction (sum/max/min/prod) must be the whole body of a stage; compute it in its own stage and cast or combine it in the next"
        )));
    }
    if let Some((_, _, axes)) = top_reduce(&body) {
        if axes.is_empty() {
            return Err(Error::Compile(format!(
                "compute '{name}': a reduction needs at least one reduce_axis"
            )));
        }
        for a in axes {
            if !a.reduce {
                return Err(Error::Compile(format!(
                    "compute '{name}': reduction over '{}', which is not a reduce_axis",
                    a.var.name
                )));
            }
        }
    }
    Ok(Tensor(Arc::new(TensorNode {
        id: NEXT_TENSOR.fetch_add(1, Ordering::Relaxed),
        name: name.to_string(),
        shape: shape.to_vec(),
        dtype: body.dtype(),
        host_callbacks: reads_host_callbacks(&body),
        op: Op::Compute { axis, body },
        stop_gradient: false,
    })))
}

/// `t`'s values as a stage that `te::gradient` treats as constant (JAX's `lax.stop_gradient`):
/// an elementwise copy, which the default schedule inlines, so it costs nothing at run time.
/// Used where a value's derivative is zero in exact maths but not to the differentiator:
/// the max a softmax subtracts (shift invariance) would otherwise cost a tie count and a sum
/// per row in the backward.
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder([&n], DType::F32, "X")?;
/// let c = te::stop_gradient(&x)?;
/// assert!(c.stops_gradient() && !x.stops_gradient());
/// assert_eq!((c.name(), c.dtype()), ("X_nograd", DType::F32));
/// // d/dx (x * stop_gradient(x)) is stop_gradient(x): the constant factor only.
/// let y = te::compute([&n], |[i]| x.at([&i]) * c.at([i]), "Y")?;
/// let g = te::gradient(&y, &[x.clone()], None)?;
/// assert_eq!(g[0].shape().len(), 1);
/// # Ok(())
/// # }
/// ```
pub fn stop_gradient(t: &Tensor) -> Result<Tensor> {
    let copy = compute_dyn(t.shape(), |i| t.idx(i), &format!("{}_nograd", t.name()))?;
    let Op::Compute { axis, body } = copy.op() else {
        return Err(Error::Internal("stop_gradient: a copy is a compute".into()));
    };
    Ok(Tensor(Arc::new(TensorNode {
        id: NEXT_TENSOR.fetch_add(1, Ordering::Relaxed),
        name: copy.name().to_string(),
        shape: copy.shape().to_vec(),
        dtype: copy.dtype(),
        host_callbacks: copy.0.host_callbacks,
        op: Op::Compute {
            axis: axis.clone(),
            body: body.clone(),
        },
        stop_gradient: true,
    })))
}

/// How an extern stage's callback is given: a function (not savable in a module) or a name
/// in the global registry (resolved now, and by name again when a saved module is loaded).
///
/// ```
/// use rivet_compiler::te;
/// use rivet_runtime::{DType, Function, Value};
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder([&n], DType::F32, "X")?;
/// let f = Function::new("noop", |_args: &[Value]| Ok(Value::Null));
/// assert!(te::extern_([&n], &[x.clone()], te::CallbackFn::Function(f), DType::F32, "E").is_ok());
/// // A registered name is resolved now: an unknown one is an error naming the stage.
/// let missing = te::CallbackFn::Registered("no.such.callback".into());
/// let e = te::extern_([&n], &[x], missing, DType::F32, "E").unwrap_err();
/// assert!(e.to_string().contains("extern 'E': callback"), "{e}");
/// # Ok(())
/// # }
/// ```
pub enum CallbackFn {
    /// A packed function, called as is.
    Function(rivet_runtime::Function),
    /// The name of a function in `rivet_runtime::registry`.
    Registered(String),
}

/// A stage whose values the packed function `func` computes on the host (TVM's `te.extern`):
/// at run time `inputs` are materialised and `func(in_0, ..., in_k, out)` is called with
/// read-only copies of them and a fresh tensor `out` of `shape` and `dtype`; it fills `out`
/// and returns None, or returns a tensor of that shape and dtype (copied into `out`).
/// `shape` must be int64 expressions over the arguments' dims.
///
/// ```
/// use rivet_compiler::{build, te, Schedule};
/// use rivet_runtime::{DType, Function, Tensor, Value};
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder([&n], DType::F32, "X")?;
/// // The host reverses X (returning a new tensor; filling `out` in place is the other way).
/// let rev = Function::new("rev", |args: &[Value]| {
///     let x = args[0].as_tensor().expect("a tensor");
///     let v: Vec<f32> = x.to_vec::<f32>()?.into_iter().rev().collect();
///     Ok(Value::Tensor(Tensor::from_slice(&v, x.shape())?))
/// });
/// let r = te::extern_([&n], &[x.clone()], te::CallbackFn::Function(rev), DType::F32, "R")?;
/// let y = te::compute([&n], |[i]| r.at([i]) + 1.0, "Y")?;
/// let f = build(&Schedule::new(&[&y])?, &[&x, &y], "cpu", "f")?.get_function("f")?;
/// let Value::Tensor(out) = f.call(&[Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3])?.into()])? else { unreachable!() };
/// assert_eq!(out.to_vec::<f32>()?, [4.0, 3.0, 2.0]);
/// // An input given twice is refused.
/// let twice = te::CallbackFn::Registered("r".into());
/// let e = te::extern_([&n], &[x.clone(), x], twice, DType::F32, "E").unwrap_err();
/// assert!(e.to_string().contains("input 'X' is given twice"), "{e}");
/// # Ok(())
/// # }
/// ```
pub fn extern_(
    shape: impl Indices,
    inputs: &[Tensor],
    func: CallbackFn,
    dtype: DType,
    name: &str,
) -> Result<Tensor> {
    let shape = &shape.into_exprs()[..];
    check_shape(shape, &format!("extern '{name}'"))?;
    for (k, t) in inputs.iter().enumerate() {
        if inputs[..k].contains(t) {
            return Err(Error::Compile(format!(
                "extern '{name}': input '{}' is given twice",
                t.name()
            )));
        }
    }
    let (func, registered) = match func {
        CallbackFn::Function(f) => (f, None),
        CallbackFn::Registered(n) => {
            let f = rivet_runtime::registry::get(&n)
                .map_err(|e| Error::Compile(format!("extern '{name}': callback: {e}")))?;
            (f, Some(n))
        }
    };
    Ok(Tensor(Arc::new(TensorNode {
        id: NEXT_TENSOR.fetch_add(1, Ordering::Relaxed),
        name: name.to_string(),
        shape: shape.to_vec(),
        dtype,
        op: Op::Extern {
            inputs: inputs.to_vec(),
            callback: crate::ir::callback::Callback {
                kind: crate::ir::callback::CallbackKind::Extern,
                stage: name.to_string(),
                registered,
                func: Some(func),
            },
        },
        host_callbacks: true,
        stop_gradient: false,
    })))
}

/// Whether `body` reads a tensor from which a host callback is reachable
/// (`TensorNode::host_callbacks`).
pub fn reads_host_callbacks(body: &Expr) -> bool {
    let mut found = false;
    body.visit_unique(&mut |e| {
        if let ExprKind::Read { tensor, .. } = e.kind() {
            found |= tensor
                .node()
                .downcast_ref::<TensorNode>()
                .is_some_and(|t| t.host_callbacks);
        }
    });
    found
}

/// The tensors `t` reads directly (each once, in first-read order; an extern stage's inputs
/// in call order).
pub fn inputs(t: &Tensor) -> Vec<Tensor> {
    if let Op::Extern { inputs, .. } = &t.0.op {
        return inputs.clone();
    }
    let mut out: Vec<Tensor> = Vec::new();
    if let Some(body) = t.body() {
        body.visit_unique(&mut |e| {
            if let ExprKind::Read { tensor, .. } = e.kind() {
                if !out.iter().any(|t| t.id() == tensor.id()) {
                    out.push(Tensor::of(tensor));
                }
            }
        });
    }
    out
}

/// Every tensor `outputs` depend on, producers before consumers.
pub fn post_order(outputs: &[Tensor]) -> Vec<Tensor> {
    post_order_by(outputs, &mut |t| inputs(t))
}

/// Every tensor reachable from `roots` through `inputs_of`, each once, producers before
/// consumers (a depth-first post-order: a tensor's inputs in their order, then the tensor).
/// Iterative and linear in the size of the graph: a chain of 20,000 stages needs no deep
/// stack and no quadratic membership tests.
pub fn post_order_by(
    roots: &[Tensor],
    inputs_of: &mut dyn FnMut(&Tensor) -> Vec<Tensor>,
) -> Vec<Tensor> {
    let mut out = Vec::new();
    let mut done = std::collections::HashSet::new();
    // (tensor, its inputs, how many of them are handled), for the tensors being visited.
    let mut stack: Vec<(Tensor, Vec<Tensor>, usize)> = Vec::new();
    let mut started = std::collections::HashSet::new();
    for r in roots {
        if done.contains(&r.id()) || !started.insert(r.id()) {
            continue;
        }
        stack.push((r.clone(), inputs_of(r), 0));
        while let Some((_, ins, k)) = stack.last_mut() {
            if let Some(next) = ins.get(*k).cloned() {
                *k += 1;
                if !done.contains(&next.id()) && started.insert(next.id()) {
                    let ins = inputs_of(&next);
                    stack.push((next, ins, 0));
                }
            } else {
                let (t, _, _) = stack.pop().expect("non-empty");
                done.insert(t.id());
                out.push(t);
            }
        }
    }
    out
}
