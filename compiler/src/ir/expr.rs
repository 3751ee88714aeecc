//! Typed expressions, shared by the tensor-expression DSL (`te`) and the loop IR.
//!
//! An `Expr` is a cheap handle (`Arc`) on an immutable node that carries its dtype. Two kinds
//! exist only on one side of lowering: `Read` (a tensor element, multi-dim) and `Reduce` live
//! in te programs; `Load` (a buffer element) lives in the loop IR. The verifier checks that
//! lowered functions contain no `Read`/`Reduce`, and that flattened ones index with one offset.
//! This module knows no te type: a `Read` holds an opaque `TensorRef` (id, name, and the
//! DSL's tensor for `te` to take back).
//!
//! Type rules (checked by the constructors, reported as `CompileError`):
//! - index arithmetic is int64; `Var`s are int64;
//! - binary arithmetic needs both operands of one dtype (a Python number takes the other
//!   operand's dtype before it gets here); float32 maths stays float32;
//! - `Div` is true division and needs floats; `FloorDiv`/`FloorMod` follow Python's
//!   semantics (round toward -inf, result takes the divisor's sign) for ints and floats;
//! - comparisons and logical ops give `bool`; `Select` needs a bool condition and equal arms;
//! - math functions (`exp`, `log`, ...) need floats; `abs` also takes ints;
//! - `Fma(a, b, c)` is `a * b + c` rounded once (IEEE fusedMultiplyAdd), floats only, all
//!   three operands of the node's dtype. It is never written by the DSL: the `fma` build
//!   option (`lower::fma`) contracts `a * b + c`; every backend and the interpreter compute it
//!   with one rounding (float16/bfloat16 in f32, like their other arithmetic), so results
//!   stay bit-exact against the oracle.

use crate::error::{Error, Result};
use rivet_runtime::DType;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// An int64 variable: a loop index, a symbolic dim (`te.var("n")`) or a runtime stride.
/// Identity is the `id`; the name is for printing only.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Var {
    pub id: u32,
    pub name: Arc<str>,
}

static NEXT_VAR: AtomicU32 = AtomicU32::new(1);

impl Var {
    /// A fresh variable, distinct from every other one in the process.
    pub fn new(name: &str) -> Var {
        Var {
            id: NEXT_VAR.fetch_add(1, Ordering::Relaxed),
            name: name.into(),
        }
    }

    /// Ensures later `Var::new` ids are above `id` (after loading saved IR).
    pub fn reserve(id: u32) {
        NEXT_VAR.fetch_max(id + 1, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    /// True division (floats only).
    Div,
    /// Python `//`.
    FloorDiv,
    /// Python `%`.
    FloorMod,
    Min,
    Max,
    /// `pow(a, b)` (floats only).
    Pow,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnOp {
    Neg,
    /// Logical not (bool only).
    Not,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Abs,
    Floor,
    Ceil,
    /// Error function; accuracy documented in docs/dsl.md (max abs error 1.5e-7 in f64 maths).
    Erf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LogicOp {
    And,
    Or,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
}

/// Identifies a buffer of a `PrimFunc` (a parameter or a local allocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufId(pub u32);

/// A constant. Integers (and bools) are kept as i64, floats as f64; the node's dtype says
/// how to interpret them (an f32 constant is rounded to f32 when used).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Const {
    Int(i64),
    /// Written as a JSON number, or "inf" / "-inf" / "nan" (`ir::float_serde`).
    Float(#[serde(with = "super::float_serde")] f64),
}

/// The tensor a te `Read` reads, as the expression layer sees it: an opaque handle on the
/// DSL's tensor with the id and name that printing and identity need. The IR does not know
/// te types (`te` gets its tensor back with `downcast`); lowering turns every `Read` into a
/// `Load` of a buffer or inlines it, so none reaches a backend or a file.
#[derive(Clone)]
pub struct TensorRef {
    id: u32,
    name: Arc<str>,
    node: Arc<dyn std::any::Any + Send + Sync>,
}

impl TensorRef {
    pub fn new<T: std::any::Any + Send + Sync>(id: u32, name: &str, node: Arc<T>) -> TensorRef {
        TensorRef {
            id,
            name: name.into(),
            node,
        }
    }
    pub fn id(&self) -> u32 {
        self.id
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The DSL's tensor node, when it is a `T`.
    pub fn downcast<T: std::any::Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.node.clone().downcast::<T>().ok()
    }
    /// The handle on the DSL's tensor node itself (one of its `Arc`'s handles, for code that
    /// counts them: `bindings/src/gc.rs`).
    pub fn node(&self) -> &Arc<dyn std::any::Any + Send + Sync> {
        &self.node
    }
}

impl PartialEq for TensorRef {
    fn eq(&self, other: &TensorRef) -> bool {
        self.id == other.id
    }
}

impl fmt::Debug for TensorRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TensorRef({}#{})", self.name, self.id)
    }
}

// te expressions are never serialised: only lowered IR (which has no `Read`) is saved.
impl Serialize for TensorRef {
    fn serialize<S: serde::Serializer>(&self, _: S) -> std::result::Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom(
            "tensor-expression reads cannot be serialised; lower the program first",
        ))
    }
}
impl<'de> Deserialize<'de> for TensorRef {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> std::result::Result<TensorRef, D::Error> {
        Err(serde::de::Error::custom(
            "tensor-expression reads cannot be deserialised",
        ))
    }
}

/// A loop axis of a compute (data-parallel) or a reduction axis, over `[min, min + extent)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IterVar {
    pub var: Var,
    pub min: Expr,
    pub extent: Expr,
    pub reduce: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ExprKind {
    Const(Const),
    Var(Var),
    Unary(UnOp, Expr),
    Binary(BinOp, Expr, Expr),
    Cmp(CmpOp, Expr, Expr),
    Logic(LogicOp, Expr, Expr),
    /// Conversion to the node's dtype.
    Cast(Expr),
    /// `a * b + c` with a single rounding (floats only; see the module doc).
    Fma(Expr, Expr, Expr),
    /// `cond ? a : b`: only the chosen arm is evaluated (backends branch when an arm loads),
    /// so the bounds proof checks each arm's loads under its condition (padding patterns).
    Select(Expr, Expr, Expr),
    /// te only: element `indices` of a tensor (a placeholder or another compute).
    Read {
        tensor: TensorRef,
        indices: Vec<Expr>,
    },
    /// te only: a reduction of `body` over `axes`.
    Reduce {
        op: ReduceOp,
        body: Expr,
        axes: Vec<IterVar>,
    },
    /// loop IR only: element of a buffer, multi-dim before `flatten`, one offset after.
    Load {
        buf: BufId,
        indices: Vec<Expr>,
    },
    /// A DSL misuse found while building an expression with Rust operators (which cannot
    /// return errors); `build` reports it as a `CompileError`.
    Invalid(String),
    /// Vector IR (made by `lower::vectorize`): the int64 vector `base + stride * l` for lanes
    /// `l = 0 .. lanes`; `base` and `stride` are scalar int64.
    Ramp {
        base: Expr,
        stride: Expr,
        lanes: u32,
    },
    /// Vector IR: the scalar `value` repeated in `lanes` lanes (of `value`'s dtype).
    Broadcast {
        value: Expr,
        lanes: u32,
    },
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "ExprNodeData")]
pub struct ExprNode {
    pub kind: ExprKind,
    pub dtype: DType,
    /// Longest path to a leaf, this node counted (a leaf has depth 1): computed when the node
    /// is made (and when it is read from a file), so depth limits cost nothing to check.
    #[serde(skip_serializing)]
    pub depth: u32,
    /// Number of lanes (1 for a scalar), derived from the kind like `depth` (never stored in a
    /// file): a `Ramp`/`Broadcast` says it, a `Load` has its index's lanes, other nodes their
    /// widest operand's. Whether the operands agree is the verifier's question (`ir::verify`).
    #[serde(skip_serializing)]
    pub lanes: u32,
}

/// Operands are dropped through `deferred_drop`: an expression over a long chain of te
/// stages (each `Read` holds a tensor whose body is another expression) is freed without a
/// stack frame per level.
impl Drop for ExprNode {
    fn drop(&mut self) {
        if matches!(
            self.kind,
            ExprKind::Const(_) | ExprKind::Var(_) | ExprKind::Invalid(_)
        ) {
            return;
        }
        let kind = std::mem::replace(&mut self.kind, ExprKind::Const(Const::Int(0)));
        super::deferred_drop::drop_deferred(super::deferred_drop::Deferred::Expr(kind));
    }
}

/// What a file stores of a node: the depth is recomputed, never trusted.
#[derive(Deserialize)]
struct ExprNodeData {
    kind: ExprKind,
    dtype: DType,
}

impl From<ExprNodeData> for ExprNode {
    fn from(d: ExprNodeData) -> ExprNode {
        ExprNode {
            depth: depth_of(&d.kind),
            lanes: lanes_of(&d.kind),
            kind: d.kind,
            dtype: d.dtype,
        }
    }
}

/// 1 + the deepest child (te `Read`s count their indices, not the tensor read).
fn depth_of(kind: &ExprKind) -> u32 {
    let d = |e: &Expr| e.0.depth;
    let m = match kind {
        ExprKind::Const(_) | ExprKind::Var(_) | ExprKind::Invalid(_) => 0,
        ExprKind::Unary(_, a) | ExprKind::Cast(a) => d(a),
        ExprKind::Binary(_, a, b) | ExprKind::Cmp(_, a, b) | ExprKind::Logic(_, a, b) => {
            d(a).max(d(b))
        }
        ExprKind::Select(c, a, b) | ExprKind::Fma(c, a, b) => d(c).max(d(a)).max(d(b)),
        ExprKind::Read { indices, .. } | ExprKind::Load { indices, .. } => {
            indices.iter().map(d).max().unwrap_or(0)
        }
        ExprKind::Reduce { body, axes, .. } => axes
            .iter()
            .map(|a| d(&a.min).max(d(&a.extent)))
            .fold(d(body), u32::max),
        ExprKind::Ramp { base, stride, .. } => d(base).max(d(stride)),
        ExprKind::Broadcast { value, .. } => d(value),
    };
    m.saturating_add(1)
}

/// The lanes of a node of this kind (see `ExprNode::lanes`).
fn lanes_of(kind: &ExprKind) -> u32 {
    let l = |e: &Expr| e.0.lanes;
    match kind {
        ExprKind::Ramp { lanes, .. } | ExprKind::Broadcast { lanes, .. } => *lanes,
        ExprKind::Const(_)
        | ExprKind::Var(_)
        | ExprKind::Invalid(_)
        | ExprKind::Read { .. }
        | ExprKind::Reduce { .. } => 1,
        ExprKind::Unary(_, a) | ExprKind::Cast(a) => l(a),
        ExprKind::Binary(_, a, b) | ExprKind::Cmp(_, a, b) | ExprKind::Logic(_, a, b) => {
            l(a).max(l(b))
        }
        ExprKind::Select(c, a, b) | ExprKind::Fma(a, b, c) => l(c).max(l(a)).max(l(b)),
        ExprKind::Load { indices, .. } => indices.iter().map(l).max().unwrap_or(1),
    }
}

/// A shared, immutable expression.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Expr(pub Arc<ExprNode>);

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

fn type_error(msg: String) -> Error {
    Error::Compile(msg)
}

impl Expr {
    pub fn new(kind: ExprKind, dtype: DType) -> Expr {
        Expr(Arc::new(ExprNode {
            depth: depth_of(&kind),
            lanes: lanes_of(&kind),
            kind,
            dtype,
        }))
    }
    /// Longest path from this node to a leaf (1 for a leaf).
    pub fn depth(&self) -> u32 {
        self.0.depth
    }
    /// `self`, or a `CompileError` when it is deeper than the DSL allows.
    pub fn within_depth(self) -> Result<Expr> {
        let max = super::limits::MAX_EXPR_DEPTH;
        if self.depth() > max {
            return Err(type_error(format!(
                "expression nested {} deep; rivet accepts at most {max} levels (limit MAX_EXPR_DEPTH): build long sums as reductions or split the computation into stages",
                self.depth()
            )));
        }
        Ok(self)
    }
    pub fn kind(&self) -> &ExprKind {
        &self.0.kind
    }
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    /// Lanes of the value: 1 for a scalar (see `ExprNode::lanes`).
    pub fn lanes(&self) -> u32 {
        self.0.lanes
    }
    pub fn is_vector(&self) -> bool {
        self.0.lanes > 1
    }
    pub fn same(&self, other: &Expr) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    // ---- leaves -------------------------------------------------------------------------

    pub fn int(v: i64) -> Expr {
        Expr::new(ExprKind::Const(Const::Int(v)), DType::I64)
    }
    /// A constant of any dtype (floats rounded, ints truncated, bools 0/1).
    /// `v` as a constant of `dtype`, with the float-to-int cast's rule for int dtypes:
    /// truncated toward zero and saturated to the dtype's range (NaN is 0), so an int constant
    /// always holds a value of its dtype (`constant(300.0, I8)` is 127, never an int8 300 that
    /// the backends would each wrap their own way).
    pub fn constant(v: f64, dtype: DType) -> Expr {
        let c = if dtype.is_float() {
            Const::Float(v)
        } else if dtype == DType::Bool {
            Const::Int((v != 0.0) as i64)
        } else {
            let (lo, hi) = int_range(dtype);
            Const::Int((v as i64 as i128).clamp(lo, hi) as i64)
        };
        Expr::new(ExprKind::Const(c), dtype)
    }
    pub fn const_int(v: i64, dtype: DType) -> Expr {
        if dtype.is_float() {
            Expr::new(ExprKind::Const(Const::Float(v as f64)), dtype)
        } else {
            Expr::new(ExprKind::Const(Const::Int(v)), dtype)
        }
    }
    pub fn bool(v: bool) -> Expr {
        Expr::new(ExprKind::Const(Const::Int(v as i64)), DType::Bool)
    }
    pub fn var(v: &Var) -> Expr {
        Expr::new(ExprKind::Var(v.clone()), DType::I64)
    }

    /// The value when this is an integer constant.
    pub fn as_int(&self) -> Option<i64> {
        match self.kind() {
            ExprKind::Const(Const::Int(v)) if !self.dtype().is_float() => Some(*v),
            _ => None,
        }
    }
    pub fn as_var(&self) -> Option<&Var> {
        match self.kind() {
            ExprKind::Var(v) => Some(v),
            _ => None,
        }
    }

    // ---- checked constructors (the DSL's type rules) --------------------------------------

    pub fn binary(op: BinOp, a: Expr, b: Expr) -> Result<Expr> {
        if a.dtype() != b.dtype() {
            return Err(type_error(format!(
                "operands of {op:?} have different dtypes: {} ({a}) and {} ({b}); use te.cast to convert one",
                a.dtype(),
                b.dtype()
            )));
        }
        let dt = a.dtype();
        if dt == DType::Bool {
            return Err(type_error(format!(
                "{op:?} is not defined on bool ({a}, {b}); cast to an int or float dtype first"
            )));
        }
        if matches!(op, BinOp::Div | BinOp::Pow) && !dt.is_float() {
            return Err(type_error(format!(
                "{op:?} needs float operands, got {dt} ({a}, {b}); for ints use // (floordiv) or cast to a float dtype"
            )));
        }
        Expr::new(ExprKind::Binary(op, a, b), dt).within_depth()
    }

    pub fn cmp(op: CmpOp, a: Expr, b: Expr) -> Result<Expr> {
        if a.dtype() != b.dtype() {
            return Err(type_error(format!(
                "comparison {op:?} of different dtypes: {} ({a}) and {} ({b})",
                a.dtype(),
                b.dtype()
            )));
        }
        Expr::new(ExprKind::Cmp(op, a, b), DType::Bool).within_depth()
    }

    pub fn logic(op: LogicOp, a: Expr, b: Expr) -> Result<Expr> {
        if a.dtype() != DType::Bool || b.dtype() != DType::Bool {
            return Err(type_error(format!(
                "logical {op:?} needs bool operands, got {} ({a}) and {} ({b})",
                a.dtype(),
                b.dtype()
            )));
        }
        Expr::new(ExprKind::Logic(op, a, b), DType::Bool).within_depth()
    }

    pub fn unary(op: UnOp, a: Expr) -> Result<Expr> {
        let dt = a.dtype();
        let ok = match op {
            UnOp::Not => dt == DType::Bool,
            UnOp::Neg => dt != DType::Bool,
            UnOp::Abs => dt != DType::Bool,
            _ => dt.is_float(),
        };
        if !ok {
            return Err(type_error(format!("{op:?} is not defined on {dt} ({a})")));
        }
        Expr::new(ExprKind::Unary(op, a), dt).within_depth()
    }

    pub fn cast(dtype: DType, a: Expr) -> Expr {
        if a.dtype() == dtype {
            return a;
        }
        Expr::new(ExprKind::Cast(a), dtype)
    }

    pub fn select(c: Expr, a: Expr, b: Expr) -> Result<Expr> {
        if c.dtype() != DType::Bool {
            return Err(type_error(format!(
                "if_then_else condition must be bool, got {} ({c})",
                c.dtype()
            )));
        }
        if a.dtype() != b.dtype() {
            return Err(type_error(format!(
                "if_then_else arms have different dtypes: {} ({a}) and {} ({b})",
                a.dtype(),
                b.dtype()
            )));
        }
        let dt = a.dtype();
        Expr::new(ExprKind::Select(c, a, b), dt).within_depth()
    }

    /// `a * b + c` rounded once: floats of one dtype only.
    pub fn fma(a: Expr, b: Expr, c: Expr) -> Result<Expr> {
        let dt = a.dtype();
        if b.dtype() != dt || c.dtype() != dt {
            return Err(type_error(format!(
                "operands of a fused multiply-add have different dtypes: {} ({a}), {} ({b}) and {} ({c})",
                dt,
                b.dtype(),
                c.dtype()
            )));
        }
        if !dt.is_float() {
            return Err(type_error(format!(
                "a fused multiply-add needs float operands, got {dt} ({a}, {b}, {c})"
            )));
        }
        Expr::new(ExprKind::Fma(a, b, c), dt).within_depth()
    }

    pub fn load(buf: BufId, indices: Vec<Expr>, dtype: DType) -> Expr {
        Expr::new(ExprKind::Load { buf, indices }, dtype)
    }

    /// The int64 vector `base + stride * l`, `l < lanes` (vector IR).
    pub fn ramp(base: Expr, stride: Expr, lanes: u32) -> Expr {
        Expr::new(
            ExprKind::Ramp {
                base,
                stride,
                lanes,
            },
            DType::I64,
        )
    }

    /// `value` in each of `lanes` lanes (vector IR).
    pub fn broadcast(value: Expr, lanes: u32) -> Expr {
        let dt = value.dtype();
        Expr::new(ExprKind::Broadcast { value, lanes }, dt)
    }

    // ---- unchecked index arithmetic (int64, used by lowering) -----------------------------

    pub fn add(&self, b: &Expr) -> Expr {
        Expr::new(
            ExprKind::Binary(BinOp::Add, self.clone(), b.clone()),
            DType::I64,
        )
    }
    pub fn sub(&self, b: &Expr) -> Expr {
        Expr::new(
            ExprKind::Binary(BinOp::Sub, self.clone(), b.clone()),
            DType::I64,
        )
    }
    pub fn mul(&self, b: &Expr) -> Expr {
        Expr::new(
            ExprKind::Binary(BinOp::Mul, self.clone(), b.clone()),
            DType::I64,
        )
    }
    pub fn floordiv(&self, b: &Expr) -> Expr {
        Expr::new(
            ExprKind::Binary(BinOp::FloorDiv, self.clone(), b.clone()),
            DType::I64,
        )
    }
    pub fn floormod(&self, b: &Expr) -> Expr {
        Expr::new(
            ExprKind::Binary(BinOp::FloorMod, self.clone(), b.clone()),
            DType::I64,
        )
    }
    pub fn min_(&self, b: &Expr) -> Expr {
        Expr::new(
            ExprKind::Binary(BinOp::Min, self.clone(), b.clone()),
            self.dtype(),
        )
    }
    pub fn max_(&self, b: &Expr) -> Expr {
        Expr::new(
            ExprKind::Binary(BinOp::Max, self.clone(), b.clone()),
            self.dtype(),
        )
    }
    pub fn lt(&self, b: &Expr) -> Expr {
        Expr::new(
            ExprKind::Cmp(CmpOp::Lt, self.clone(), b.clone()),
            DType::Bool,
        )
    }

    /// Rebuilds the expression bottom-up; `f` sees each rebuilt node and may replace it.
    pub fn rewrite(&self, f: &mut dyn FnMut(&Expr) -> Option<Expr>) -> Expr {
        let rebuilt = self.map_children(&mut |c| c.rewrite(f));
        f(&rebuilt).unwrap_or(rebuilt)
    }

    /// This node with each child replaced by `g(child)` (shared when nothing changed).
    pub fn map_children(&self, g: &mut dyn FnMut(&Expr) -> Expr) -> Expr {
        let dt = self.dtype();
        let kind = match self.kind() {
            ExprKind::Const(_) | ExprKind::Var(_) | ExprKind::Invalid(_) => return self.clone(),
            ExprKind::Unary(op, a) => ExprKind::Unary(*op, g(a)),
            ExprKind::Binary(op, a, b) => ExprKind::Binary(*op, g(a), g(b)),
            ExprKind::Cmp(op, a, b) => ExprKind::Cmp(*op, g(a), g(b)),
            ExprKind::Logic(op, a, b) => ExprKind::Logic(*op, g(a), g(b)),
            ExprKind::Cast(a) => ExprKind::Cast(g(a)),
            ExprKind::Select(c, a, b) => ExprKind::Select(g(c), g(a), g(b)),
            ExprKind::Fma(a, b, c) => ExprKind::Fma(g(a), g(b), g(c)),
            ExprKind::Read { tensor, indices } => ExprKind::Read {
                tensor: tensor.clone(),
                indices: indices.iter().map(&mut *g).collect(),
            },
            ExprKind::Reduce { op, body, axes } => ExprKind::Reduce {
                op: *op,
                body: g(body),
                axes: axes
                    .iter()
                    .map(|a| IterVar {
                        var: a.var.clone(),
                        min: g(&a.min),
                        extent: g(&a.extent),
                        reduce: a.reduce,
                    })
                    .collect(),
            },
            ExprKind::Load { buf, indices } => ExprKind::Load {
                buf: *buf,
                indices: indices.iter().map(&mut *g).collect(),
            },
            ExprKind::Ramp {
                base,
                stride,
                lanes,
            } => ExprKind::Ramp {
                base: g(base),
                stride: g(stride),
                lanes: *lanes,
            },
            ExprKind::Broadcast { value, lanes } => ExprKind::Broadcast {
                value: g(value),
                lanes: *lanes,
            },
        };
        let new = Expr::new(kind, dt);
        if new == *self {
            self.clone()
        } else {
            new
        }
    }

    /// Calls `f` on each direct child (a te `Read`'s indices, not the tensor read).
    pub fn for_each_child<'a>(&'a self, f: &mut dyn FnMut(&'a Expr)) {
        match self.kind() {
            ExprKind::Const(_) | ExprKind::Var(_) | ExprKind::Invalid(_) => {}
            ExprKind::Unary(_, a) | ExprKind::Cast(a) => f(a),
            ExprKind::Binary(_, a, b) | ExprKind::Cmp(_, a, b) | ExprKind::Logic(_, a, b) => {
                f(a);
                f(b)
            }
            ExprKind::Select(c, a, b) | ExprKind::Fma(c, a, b) => {
                f(c);
                f(a);
                f(b)
            }
            ExprKind::Read { indices, .. } | ExprKind::Load { indices, .. } => {
                indices.iter().for_each(f)
            }
            ExprKind::Reduce { body, axes, .. } => {
                f(body);
                for a in axes {
                    f(&a.min);
                    f(&a.extent);
                }
            }
            ExprKind::Ramp { base, stride, .. } => {
                f(base);
                f(stride)
            }
            ExprKind::Broadcast { value, .. } => f(value),
        }
    }

    /// Visits every distinct node once (shared nodes are skipped after their first visit),
    /// pre-order, without recursion: linear in the size of the DAG, where `visit` is linear in
    /// the size of the tree (exponential for `e = e + e` chains). For questions about which
    /// nodes occur, not how often.
    pub fn visit_unique(&self, f: &mut dyn FnMut(&Expr)) {
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![self.clone()];
        while let Some(e) = stack.pop() {
            if !seen.insert(Arc::as_ptr(&e.0) as usize) {
                continue;
            }
            f(&e);
            let mut kids = Vec::new();
            e.for_each_child(&mut |c| kids.push(c.clone()));
            stack.extend(kids.into_iter().rev());
        }
    }

    /// Number of nodes counted as a tree, stopping at `limit` (so bounded for any DAG).
    pub fn tree_size_upto(&self, limit: usize) -> usize {
        let mut n = 0;
        let mut stack: Vec<&Expr> = vec![self];
        while let Some(e) = stack.pop() {
            n += 1;
            if n >= limit {
                return limit;
            }
            e.for_each_child(&mut |c| stack.push(c));
        }
        n
    }

    /// Visits every node, pre-order.
    pub fn visit(&self, f: &mut dyn FnMut(&Expr)) {
        f(self);
        match self.kind() {
            ExprKind::Const(_) | ExprKind::Var(_) | ExprKind::Invalid(_) => {}
            ExprKind::Unary(_, a) | ExprKind::Cast(a) => a.visit(f),
            ExprKind::Binary(_, a, b) | ExprKind::Cmp(_, a, b) | ExprKind::Logic(_, a, b) => {
                a.visit(f);
                b.visit(f)
            }
            ExprKind::Select(c, a, b) | ExprKind::Fma(c, a, b) => {
                c.visit(f);
                a.visit(f);
                b.visit(f)
            }
            ExprKind::Read { indices, .. } | ExprKind::Load { indices, .. } => {
                indices.iter().for_each(|i| i.visit(f))
            }
            ExprKind::Reduce { body, axes, .. } => {
                body.visit(f);
                for a in axes {
                    a.min.visit(f);
                    a.extent.visit(f);
                }
            }
            ExprKind::Ramp { base, stride, .. } => {
                base.visit(f);
                stride.visit(f)
            }
            ExprKind::Broadcast { value, .. } => value.visit(f),
        }
    }

    /// Replaces variables by expressions.
    pub fn substitute(&self, map: &dyn Fn(&Var) -> Option<Expr>) -> Expr {
        self.rewrite(&mut |e| e.as_var().and_then(map))
    }

    /// True when `v` occurs in the expression.
    pub fn uses(&self, v: &Var) -> bool {
        let mut found = false;
        // A tree walk is cheapest for the small expressions of ordinary programs; a shared
        // DAG (`e = e + e` chains) would make it exponential, so large ones go node by node.
        if self.tree_size_upto(SMALL_TREE) < SMALL_TREE {
            self.visit(&mut |e| found |= e.as_var() == Some(v));
        } else {
            self.visit_unique(&mut |e| found |= e.as_var() == Some(v));
        }
        found
    }
}

/// Tree size up to which `uses` walks as a tree (no hash set of visited nodes).
const SMALL_TREE: usize = 256;

/// Largest expression printed in full (error messages quote expressions: a hostile DAG of
/// 2**60 tree nodes must not print forever).
const MAX_PRINTED_NODES: usize = 4096;

thread_local! {
    static PRINTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only the outermost expression being printed is measured.
        if PRINTING.with(|p| p.replace(true)) {
            return crate::ir::printer::fmt_expr(self, f);
        }
        let r = if self.tree_size_upto(MAX_PRINTED_NODES) >= MAX_PRINTED_NODES {
            write!(
                f,
                "<{} expression of more than {MAX_PRINTED_NODES} nodes, depth {}>",
                self.dtype(),
                self.depth()
            )
        } else {
            crate::ir::printer::fmt_expr(self, f)
        };
        PRINTING.with(|p| p.set(false));
        r
    }
}

/// The values an int dtype holds (bool: 0 and 1), as i128 so every bound is exact.
pub fn int_range(dt: DType) -> (i128, i128) {
    match dt {
        DType::Bool => (0, 1),
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::I64 => (i64::MIN.into(), i64::MAX.into()),
        DType::U8 => (0, u8::MAX.into()),
        DType::U16 => (0, u16::MAX.into()),
        DType::U32 => (0, u32::MAX.into()),
        // uint64 constants are held as i64.
        _ => (0, i64::MAX.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `e = e + e` sixty-two times is a DAG of 63 nodes and a tree of 2^63: `uses` must answer
    /// by the DAG (it ran the tree before, and the hostile programs the tests build are such
    /// DAGs).
    #[test]
    fn uses_is_linear_on_shared_dags() {
        let (x, y) = (Var::new("x"), Var::new("y"));
        let mut e = Expr::var(&x);
        for _ in 0..62 {
            e = e.add(&e);
        }
        assert!(e.uses(&x));
        assert!(!e.uses(&y));
        let small = Expr::var(&x).add(&Expr::int(1));
        assert!(small.uses(&x) && !small.uses(&y));
    }
}
