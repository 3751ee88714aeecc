//! The built-in kernel library, written with the Rust DSL and exposed to Python as
//! `rivet.kernels.*`. Each constructor builds (and caches) a compiled `Function` for a dtype,
//! a shape pattern and a target; dims are symbolic, so one build serves every size. What a
//! kernel computes is defined once (`defs.rs`); how it is scheduled is chosen per target
//! (`strategy.rs`: CPU and GPU schedules of the same definition).
//!
//! Argument conventions: inputs first, then the output (which may be omitted to have it
//! allocated and returned).
//!
//! | kernel | arguments |
//! | --- | --- |
//! | `matmul(dtype)` | `A[m, k], B[k, n], C[m, n]` |
//! | `batch_matmul(dtype)` | `A[b, m, k], B[b, k, n], C[b, m, n]` |
//! | `add/mul(dtype, a_shape, b_shape)` | numpy broadcasting; a shape entry is a size (1 broadcasts) or a dim name |
//! | `relu/gelu(dtype, ndim)` | `X[...], Y[...]` (gelu: exact, `0.5 x (1 + erf(x / sqrt 2))`) |
//! | `softmax(dtype, ndim, axis)` | `X, Y` over one axis (max-subtracted) |
//! | `layer_norm(dtype, ndim, eps)` | `X[..., n], gamma[n], beta[n], Y` over the last axis |
//! | `reduce_sum/reduce_max(dtype, ndim, axis)` | `X, Y` with `axis` removed |
//! | `transpose(dtype, perm)` | `X, Y` with `Y[i_perm] = X[i]` |

pub mod defs;
pub mod strategy;
pub mod tensorized;

use crate::build::build;
use crate::call::make_function;
use crate::error::Result;
use crate::target::Target;
use rivet_runtime::{DType, Function};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
pub use strategy::Strategy;

/// The kernels of the library, by the names `rivet.kernels` gives them.
pub const NAMES: &[&str] = &[
    "matmul",
    "batch_matmul",
    "add",
    "mul",
    "relu",
    "gelu",
    "softmax",
    "layer_norm",
    "sum",
    "max",
    "transpose",
];

/// Where a kernel is built for, and which family of its schedules: the target's own by
/// default (`From<&Target>`), or another one the target can run (a GPU schedule on `interp`
/// checks it on the CPU).
#[derive(Clone, Debug)]
pub struct On {
    pub target: Target,
    pub strategy: Strategy,
}

impl From<&Target> for On {
    fn from(t: &Target) -> On {
        On {
            target: t.clone(),
            strategy: Strategy::for_target(t),
        }
    }
}

impl On {
    fn key(&self) -> String {
        format!("{}/{}", self.target, self.strategy.name())
    }
}

static CACHE: LazyLock<Mutex<HashMap<String, Function>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Defines, schedules and builds a kernel once per key.
fn cached(key: String, on: On, define: impl FnOnce() -> Result<defs::Def>) -> Result<Function> {
    let key = format!("{key}/{}", on.key());
    if let Some(f) = CACHE.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(f.clone());
    }
    let def = define()?;
    let s = strategy::schedule(&def, on.strategy)?;
    let m = build(&s, &def.args, &on.target, def.name)?;
    let f = make_function(m.funcs[0].clone());
    CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, f.clone());
    Ok(f)
}

pub fn matmul(dtype: DType, on: impl Into<On>) -> Result<Function> {
    cached(format!("matmul/{dtype}"), on.into(), || defs::matmul(dtype))
}

pub fn batch_matmul(dtype: DType, on: impl Into<On>) -> Result<Function> {
    cached(format!("batch_matmul/{dtype}"), on.into(), || {
        defs::batch_matmul(dtype)
    })
}

/// A shape entry: a fixed size or a symbolic dim name.
#[derive(Clone, Debug, PartialEq)]
pub enum DimSpec {
    Size(i64),
    Name(String),
}

fn spec_key(s: &[DimSpec]) -> String {
    s.iter()
        .map(|d| match d {
            DimSpec::Size(n) => n.to_string(),
            DimSpec::Name(v) => v.clone(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

pub fn add(
    dtype: DType,
    a_shape: &[DimSpec],
    b_shape: &[DimSpec],
    on: impl Into<On>,
) -> Result<Function> {
    let key = format!("add/{dtype}/{}/{}", spec_key(a_shape), spec_key(b_shape));
    cached(key, on.into(), || {
        defs::binary("add", dtype, a_shape, b_shape)
    })
}

pub fn mul(
    dtype: DType,
    a_shape: &[DimSpec],
    b_shape: &[DimSpec],
    on: impl Into<On>,
) -> Result<Function> {
    let key = format!("mul/{dtype}/{}/{}", spec_key(a_shape), spec_key(b_shape));
    cached(key, on.into(), || {
        defs::binary("mul", dtype, a_shape, b_shape)
    })
}

pub fn relu(dtype: DType, ndim: usize, on: impl Into<On>) -> Result<Function> {
    defs::float(dtype, "relu")?;
    cached(format!("relu/{dtype}/{ndim}"), on.into(), || {
        defs::relu(dtype, ndim)
    })
}

pub fn gelu(dtype: DType, ndim: usize, on: impl Into<On>) -> Result<Function> {
    defs::float(dtype, "gelu")?;
    cached(format!("gelu/{dtype}/{ndim}"), on.into(), || {
        defs::gelu(dtype, ndim)
    })
}

pub fn softmax(dtype: DType, ndim: usize, axis: i64, on: impl Into<On>) -> Result<Function> {
    defs::float(dtype, "softmax")?;
    let axis = defs::norm_axis(axis, ndim, "softmax")?;
    cached(format!("softmax/{dtype}/{ndim}/{axis}"), on.into(), || {
        defs::softmax(dtype, ndim, axis)
    })
}

pub fn layer_norm(dtype: DType, ndim: usize, eps: f64, on: impl Into<On>) -> Result<Function> {
    cached(
        format!("layer_norm/{dtype}/{ndim}/{eps}"),
        on.into(),
        || defs::layer_norm(dtype, ndim, eps),
    )
}

fn reduce_kernel(
    name: &'static str,
    dtype: DType,
    ndim: usize,
    axis: i64,
    on: On,
    max: bool,
) -> Result<Function> {
    let axis = defs::norm_axis(axis, ndim, name)?;
    cached(format!("{name}/{dtype}/{ndim}/{axis}"), on, || {
        defs::reduce(name, dtype, ndim, axis, max)
    })
}

pub fn reduce_sum(dtype: DType, ndim: usize, axis: i64, on: impl Into<On>) -> Result<Function> {
    reduce_kernel("sum", dtype, ndim, axis, on.into(), false)
}
pub fn reduce_max(dtype: DType, ndim: usize, axis: i64, on: impl Into<On>) -> Result<Function> {
    reduce_kernel("max", dtype, ndim, axis, on.into(), true)
}

pub fn transpose(dtype: DType, perm: &[usize], on: impl Into<On>) -> Result<Function> {
    cached(format!("transpose/{dtype}/{perm:?}"), on.into(), || {
        defs::transpose(dtype, perm)
    })
}
