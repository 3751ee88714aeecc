//! The built-in kernel library, written with the Rust DSL and exposed to Python as
//! `rivet.kernels.*`. Each constructor builds (and caches) a compiled `Function` for a dtype
//! and shape pattern; dims are symbolic, so one build serves every size.
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

use crate::build::{build, make_function};
use crate::error::{Error, Result};
use crate::ir::expr::{Expr, IterVar};
use crate::schedule::Schedule;
use crate::target::Target;
use crate::te::{self, ax, compute, ok, placeholder, Tensor};
use rivet_runtime::{DType, Function};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

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

static CACHE: LazyLock<Mutex<HashMap<String, Function>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Builds once per key.
fn cached(key: String, make: impl FnOnce() -> Result<Function>) -> Result<Function> {
    if let Some(f) = CACHE.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(f.clone());
    }
    let f = make()?;
    CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, f.clone());
    Ok(f)
}

fn compile(sched: &Schedule, args: &[Tensor], target: &Target, name: &str) -> Result<Function> {
    let m = build(sched, args, target, name)?;
    Ok(make_function(m.funcs[0].clone()))
}

fn float(dtype: DType, kernel: &str) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::Compile(format!(
            "kernels.{kernel}: dtype must be a float type, got {dtype}"
        )));
    }
    Ok(())
}

fn sym(names: &[&str]) -> Vec<Expr> {
    names.iter().map(|n| te::var(n)).collect()
}

/// Default schedule for a stage: outermost data loop parallel.
fn parallel_outer(s: &mut Schedule, t: &Tensor) -> Result<()> {
    if let Some(a) = t.axis().first() {
        s.stage(t)?.parallel(&a.var)?;
    }
    Ok(())
}

pub fn matmul(dtype: DType, target: &Target) -> Result<Function> {
    cached(format!("matmul/{dtype}/{target}"), || {
        let [m, k, n]: [Expr; 3] = sym(&["m", "k", "n"]).try_into().expect("3");
        let a = placeholder(&[m.clone(), k.clone()], dtype, "A")?;
        let b = placeholder(&[k.clone(), n.clone()], dtype, "B")?;
        let r = te::reduce_axis(Expr::int(0), k.clone(), "r")?;
        let (a2, b2, r2) = (a.clone(), b.clone(), r.clone());
        let c = compute(
            &[m, n],
            |i| {
                ok(te::sum(
                    a2.idx(&[i[0].clone(), ax(&r2)]) * b2.idx(&[ax(&r2), i[1].clone()]),
                    &[r2.clone()],
                ))
            },
            "C",
        )?;
        let mut s = Schedule::new(&[c.clone()])?;
        let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
        // i, r, j: the inner loop streams along rows of B and C.
        s.stage(&c)?.reorder(&[i.clone(), r.var.clone(), j])?;
        s.stage(&c)?.parallel(&i)?;
        compile(&s, &[a, b, c], target, "matmul")
    })
}

pub fn batch_matmul(dtype: DType, target: &Target) -> Result<Function> {
    cached(format!("batch_matmul/{dtype}/{target}"), || {
        let [bt, m, k, n]: [Expr; 4] = sym(&["b", "m", "k", "n"]).try_into().expect("4");
        let a = placeholder(&[bt.clone(), m.clone(), k.clone()], dtype, "A")?;
        let b = placeholder(&[bt.clone(), k.clone(), n.clone()], dtype, "B")?;
        let r = te::reduce_axis(Expr::int(0), k, "r")?;
        let (a2, b2, r2) = (a.clone(), b.clone(), r.clone());
        let c = compute(
            &[bt, m, n],
            |i| {
                ok(te::sum(
                    a2.idx(&[i[0].clone(), i[1].clone(), ax(&r2)])
                        * b2.idx(&[i[0].clone(), ax(&r2), i[2].clone()]),
                    &[r2.clone()],
                ))
            },
            "C",
        )?;
        let mut s = Schedule::new(&[c.clone()])?;
        let v: Vec<_> = c.axis().iter().map(|a| a.var.clone()).collect();
        s.stage(&c)?
            .reorder(&[v[0].clone(), v[1].clone(), r.var.clone(), v[2].clone()])?;
        s.stage(&c)?.parallel(&v[0])?;
        compile(&s, &[a, b, c], target, "batch_matmul")
    })
}

/// A shape entry: a fixed size or a symbolic dim name.
#[derive(Clone, Debug, PartialEq)]
pub enum DimSpec {
    Size(i64),
    Name(String),
}

fn dim_expr(d: &DimSpec, vars: &mut HashMap<String, Expr>) -> Expr {
    match d {
        DimSpec::Size(n) => Expr::int(*n),
        DimSpec::Name(s) => vars.entry(s.clone()).or_insert_with(|| te::var(s)).clone(),
    }
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

fn binary_broadcast(
    op: &str,
    dtype: DType,
    a_shape: &[DimSpec],
    b_shape: &[DimSpec],
    target: &Target,
) -> Result<Function> {
    cached(
        format!(
            "{op}/{dtype}/{}/{}/{target}",
            spec_key(a_shape),
            spec_key(b_shape)
        ),
        || {
            let nd = a_shape.len().max(b_shape.len());
            let pad = |s: &[DimSpec]| -> Vec<DimSpec> {
                let mut v = vec![DimSpec::Size(1); nd - s.len()];
                v.extend_from_slice(s);
                v
            };
            let (pa, pb) = (pad(a_shape), pad(b_shape));
            let mut vars = HashMap::new();
            let mut out = Vec::new();
            for d in 0..nd {
                out.push(match (&pa[d], &pb[d]) {
                (DimSpec::Size(1), o) | (o, DimSpec::Size(1)) => dim_expr(o, &mut vars),
                (x, y) if x == y => dim_expr(x, &mut vars),
                (x, y) => {
                    return Err(Error::Compile(format!(
                        "kernels.{op}: dims {x:?} and {y:?} (dim {d} after aligning the shapes right) do not broadcast"
                    )))
                }
            });
            }
            let ashape: Vec<Expr> = a_shape.iter().map(|d| dim_expr(d, &mut vars)).collect();
            let bshape: Vec<Expr> = b_shape.iter().map(|d| dim_expr(d, &mut vars)).collect();
            let a = placeholder(&ashape, dtype, "A")?;
            let b = placeholder(&bshape, dtype, "B")?;
            let index = |t: &Tensor, spec: &[DimSpec], i: &[Expr]| {
                let off = nd - spec.len();
                let ix: Vec<Expr> = spec
                    .iter()
                    .enumerate()
                    .map(|(d, s)| {
                        if *s == DimSpec::Size(1) {
                            Expr::int(0)
                        } else {
                            i[off + d].clone()
                        }
                    })
                    .collect();
                t.idx(&ix)
            };
            let (a2, b2) = (a.clone(), b.clone());
            let is_add = op == "add";
            let c = compute(
                &out,
                |i| {
                    let (x, y) = (index(&a2, a_shape, i), index(&b2, b_shape, i));
                    if is_add {
                        x + y
                    } else {
                        x * y
                    }
                },
                "C",
            )?;
            let mut s = Schedule::new(&[c.clone()])?;
            parallel_outer(&mut s, &c)?;
            compile(&s, &[a, b, c], target, op)
        },
    )
}

pub fn add(
    dtype: DType,
    a_shape: &[DimSpec],
    b_shape: &[DimSpec],
    target: &Target,
) -> Result<Function> {
    binary_broadcast("add", dtype, a_shape, b_shape, target)
}
pub fn mul(
    dtype: DType,
    a_shape: &[DimSpec],
    b_shape: &[DimSpec],
    target: &Target,
) -> Result<Function> {
    binary_broadcast("mul", dtype, a_shape, b_shape, target)
}

fn shape_vars(ndim: usize) -> Vec<Expr> {
    (0..ndim).map(|d| te::var(&format!("d{d}"))).collect()
}

fn elementwise(
    name: &str,
    dtype: DType,
    ndim: usize,
    target: &Target,
    f: fn(Expr) -> Result<Expr>,
) -> Result<Function> {
    float(dtype, name)?;
    cached(format!("{name}/{dtype}/{ndim}/{target}"), || {
        let shape = shape_vars(ndim);
        let x = placeholder(&shape, dtype, "X")?;
        let x2 = x.clone();
        let y = compute(&shape, |i| ok(f(x2.idx(i))), "Y")?;
        let mut s = Schedule::new(&[y.clone()])?;
        parallel_outer(&mut s, &y)?;
        compile(&s, &[x, y], target, name)
    })
}

pub fn relu(dtype: DType, ndim: usize, target: &Target) -> Result<Function> {
    elementwise("relu", dtype, ndim, target, |x| {
        te::maximum(x.clone(), te::number_like(0.0, &x))
    })
}

pub fn gelu(dtype: DType, ndim: usize, target: &Target) -> Result<Function> {
    elementwise("gelu", dtype, ndim, target, |x| {
        let half = te::number_like(0.5, &x);
        let one = te::number_like(1.0, &x);
        let inv_sqrt2 = te::number_like(std::f64::consts::FRAC_1_SQRT_2, &x);
        Ok(half * x.clone() * (one + te::erf(x * inv_sqrt2)?))
    })
}

fn norm_axis(axis: i64, ndim: usize, kernel: &str) -> Result<usize> {
    let a = if axis < 0 { axis + ndim as i64 } else { axis };
    if ndim == 0 || a < 0 || a >= ndim as i64 {
        return Err(Error::Compile(format!(
            "kernels.{kernel}: axis {axis} is out of range for {ndim} dims"
        )));
    }
    Ok(a as usize)
}

/// `X` indexed with `r` in place of dim `axis` of `i`.
fn with_axis(i: &[Expr], axis: usize, r: &IterVar) -> Vec<Expr> {
    let mut v = i.to_vec();
    v[axis] = ax(r);
    v
}

pub fn softmax(dtype: DType, ndim: usize, axis: i64, target: &Target) -> Result<Function> {
    float(dtype, "softmax")?;
    let axis = norm_axis(axis, ndim, "softmax")?;
    cached(format!("softmax/{dtype}/{ndim}/{axis}/{target}"), || {
        let shape = shape_vars(ndim);
        let x = placeholder(&shape, dtype, "X")?;
        let red_shape: Vec<Expr> = shape
            .iter()
            .enumerate()
            .map(|(d, e)| if d == axis { Expr::int(1) } else { e.clone() })
            .collect();
        let r1 = te::reduce_axis(Expr::int(0), shape[axis].clone(), "r1")?;
        let r2 = te::reduce_axis(Expr::int(0), shape[axis].clone(), "r2")?;
        let x1 = x.clone();
        let mx = compute(
            &red_shape,
            |i| {
                ok(te::max_over(
                    x1.idx(&with_axis(i, axis, &r1)),
                    &[r1.clone()],
                ))
            },
            "max",
        )?;
        let (x2, mx2) = (x.clone(), mx.clone());
        let e = compute(
            &shape,
            |i| {
                let mut mi = i.to_vec();
                mi[axis] = Expr::int(0);
                ok(te::exp(x2.idx(i) - mx2.idx(&mi)))
            },
            "exp",
        )?;
        let e2 = e.clone();
        let sm = compute(
            &red_shape,
            |i| ok(te::sum(e2.idx(&with_axis(i, axis, &r2)), &[r2.clone()])),
            "sum",
        )?;
        let (e3, sm3) = (e.clone(), sm.clone());
        let y = compute(
            &shape,
            |i| {
                let mut si = i.to_vec();
                si[axis] = Expr::int(0);
                e3.idx(i) / sm3.idx(&si)
            },
            "Y",
        )?;
        let mut s = Schedule::new(&[y.clone()])?;
        parallel_outer(&mut s, &y)?;
        compile(&s, &[x, y], target, "softmax")
    })
}

pub fn layer_norm(dtype: DType, ndim: usize, eps: f64, target: &Target) -> Result<Function> {
    float(dtype, "layer_norm")?;
    if ndim == 0 {
        return Err(Error::Compile(
            "kernels.layer_norm: needs at least one dim".into(),
        ));
    }
    cached(format!("layer_norm/{dtype}/{ndim}/{eps}/{target}"), || {
        let shape = shape_vars(ndim);
        let last = ndim - 1;
        let n = shape[last].clone();
        let x = placeholder(&shape, dtype, "X")?;
        let gamma = placeholder(&[n.clone()], dtype, "gamma")?;
        let beta = placeholder(&[n.clone()], dtype, "beta")?;
        let red_shape: Vec<Expr> = shape
            .iter()
            .enumerate()
            .map(|(d, e)| if d == last { Expr::int(1) } else { e.clone() })
            .collect();
        let r1 = te::reduce_axis(Expr::int(0), n.clone(), "r1")?;
        let r2 = te::reduce_axis(Expr::int(0), n.clone(), "r2")?;
        let nf = te::cast(dtype, n.clone());
        let x1 = x.clone();
        let total = compute(
            &red_shape,
            |i| ok(te::sum(x1.idx(&with_axis(i, last, &r1)), &[r1.clone()])),
            "total",
        )?;
        let (x2, t2, nf2) = (x.clone(), total.clone(), nf.clone());
        let centered = compute(
            &shape,
            |i| {
                let mut ri = i.to_vec();
                ri[last] = Expr::int(0);
                x2.idx(i) - t2.idx(&ri) / nf2.clone()
            },
            "centered",
        )?;
        let c2 = centered.clone();
        let sq = compute(
            &red_shape,
            |i| {
                let v = c2.idx(&with_axis(i, last, &r2));
                ok(te::sum(v.clone() * v, &[r2.clone()]))
            },
            "sqsum",
        )?;
        let (c3, sq3, g3, b3) = (centered.clone(), sq.clone(), gamma.clone(), beta.clone());
        let y = compute(
            &shape,
            |i| {
                let mut ri = i.to_vec();
                ri[last] = Expr::int(0);
                let var = sq3.idx(&ri) / nf.clone();
                let inv = ok(te::rsqrt(var.clone() + te::number_like(eps, &var)));
                c3.idx(i) * inv * g3.idx(&[i[last].clone()]) + b3.idx(&[i[last].clone()])
            },
            "Y",
        )?;
        let mut s = Schedule::new(&[y.clone()])?;
        parallel_outer(&mut s, &y)?;
        compile(&s, &[x, gamma, beta, y], target, "layer_norm")
    })
}

fn reduce_kernel(
    name: &str,
    dtype: DType,
    ndim: usize,
    axis: i64,
    target: &Target,
    max: bool,
) -> Result<Function> {
    let axis = norm_axis(axis, ndim, name)?;
    cached(format!("{name}/{dtype}/{ndim}/{axis}/{target}"), || {
        let shape = shape_vars(ndim);
        let x = placeholder(&shape, dtype, "X")?;
        let out_shape: Vec<Expr> = shape
            .iter()
            .enumerate()
            .filter(|(d, _)| *d != axis)
            .map(|(_, e)| e.clone())
            .collect();
        let r = te::reduce_axis(Expr::int(0), shape[axis].clone(), "r")?;
        let x1 = x.clone();
        let y = compute(
            &out_shape,
            |i| {
                let mut full = i.to_vec();
                full.insert(axis, ax(&r));
                let v = x1.idx(&full);
                ok(if max {
                    te::max_over(v, &[r.clone()])
                } else {
                    te::sum(v, &[r.clone()])
                })
            },
            "Y",
        )?;
        let mut s = Schedule::new(&[y.clone()])?;
        parallel_outer(&mut s, &y)?;
        compile(&s, &[x, y], target, name)
    })
}

pub fn reduce_sum(dtype: DType, ndim: usize, axis: i64, target: &Target) -> Result<Function> {
    reduce_kernel("sum", dtype, ndim, axis, target, false)
}
pub fn reduce_max(dtype: DType, ndim: usize, axis: i64, target: &Target) -> Result<Function> {
    reduce_kernel("max", dtype, ndim, axis, target, true)
}

pub fn transpose(dtype: DType, perm: &[usize], target: &Target) -> Result<Function> {
    let nd = perm.len();
    let mut seen = vec![false; nd];
    for &p in perm {
        if p >= nd || seen[p] {
            return Err(Error::Compile(format!(
                "kernels.transpose: {perm:?} is not a permutation of 0..{nd}"
            )));
        }
        seen[p] = true;
    }
    cached(format!("transpose/{dtype}/{perm:?}/{target}"), || {
        let shape = shape_vars(nd);
        let x = placeholder(&shape, dtype, "X")?;
        let out_shape: Vec<Expr> = perm.iter().map(|&p| shape[p].clone()).collect();
        let x1 = x.clone();
        // Y[i] = X[j] with j[perm[d]] = i[d].
        let y = compute(
            &out_shape,
            |i| {
                let mut j = vec![Expr::int(0); nd];
                for (d, &p) in perm.iter().enumerate() {
                    j[p] = i[d].clone();
                }
                x1.idx(&j)
            },
            "Y",
        )?;
        let mut s = Schedule::new(&[y.clone()])?;
        parallel_outer(&mut s, &y)?;
        compile(&s, &[x, y], target, "transpose")
    })
}
