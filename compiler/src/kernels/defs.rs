//! Kernel definitions: what each library kernel computes, as te stages, apart from how it is
//! scheduled (TVM's compute / strategy split). `strategy.rs` schedules a definition for a
//! target; `mod.rs` caches the built functions. A definition is target-independent: one
//! definition, a CPU and a GPU schedule.

use super::DimSpec;
use crate::error::{Error, Result};
use crate::ir::expr::{Expr, IterVar};
use crate::te::{self, compute, compute_dyn, placeholder, Tensor};
use rivet_runtime::DType;
use std::collections::HashMap;

/// The shape of the computation, which is what schedules are chosen by.
#[derive(Clone, Debug)]
pub enum Pattern {
    /// Every stage injective or a reduction over its own axis: one loop nest per stage.
    Generic,
    /// A contraction (matmul-like) in the output stage.
    Contraction,
}

/// One kernel: its tensors in call order (inputs, then the output) and its pattern.
#[derive(Clone, Debug)]
pub struct Def {
    pub name: &'static str,
    pub args: Vec<Tensor>,
    pub pattern: Pattern,
}

impl Def {
    /// The output (the last argument).
    pub fn out(&self) -> &Tensor {
        self.args.last().expect("a definition has an output")
    }
}

fn generic(name: &'static str, args: Vec<Tensor>) -> Result<Def> {
    Ok(Def {
        name,
        args,
        pattern: Pattern::Generic,
    })
}

pub(super) fn float(dtype: DType, kernel: &str) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::Compile(format!(
            "kernels.{kernel}: dtype must be a float type, got {dtype}"
        )));
    }
    Ok(())
}

pub fn matmul(dtype: DType) -> Result<Def> {
    let [m, k, n] = ["m", "k", "n"].map(te::var);
    let a = placeholder([&m, &k], dtype, "A")?;
    let b = placeholder([&k, &n], dtype, "B")?;
    let r = te::reduce_axis(0, &k, "r")?;
    let c = compute(
        [&m, &n],
        |[i, j]| te::sum(a.at((i, &r)) * b.at((&r, j)), &r),
        "C",
    )?;
    Ok(Def {
        name: "matmul",
        args: vec![a, b, c],
        pattern: Pattern::Contraction,
    })
}

pub fn batch_matmul(dtype: DType) -> Result<Def> {
    let [bt, m, k, n] = ["b", "m", "k", "n"].map(te::var);
    let a = placeholder([&bt, &m, &k], dtype, "A")?;
    let b = placeholder([&bt, &k, &n], dtype, "B")?;
    let r = te::reduce_axis(0, &k, "r")?;
    let c = compute(
        [&bt, &m, &n],
        |[p, i, j]| te::sum(a.at((&p, i, &r)) * b.at((p, &r, j)), &r),
        "C",
    )?;
    Ok(Def {
        name: "batch_matmul",
        args: vec![a, b, c],
        pattern: Pattern::Contraction,
    })
}

fn dim_expr(d: &DimSpec, vars: &mut HashMap<String, Expr>) -> Expr {
    match d {
        DimSpec::Size(n) => Expr::int(*n),
        DimSpec::Name(s) => vars.entry(s.clone()).or_insert_with(|| te::var(s)).clone(),
    }
}

/// `add` / `mul` with numpy broadcasting.
pub fn binary(
    op: &'static str,
    dtype: DType,
    a_shape: &[DimSpec],
    b_shape: &[DimSpec],
) -> Result<Def> {
    {
        {
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
            let c = compute_dyn(
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
            generic(op, vec![a, b, c])
        }
    }
}

fn shape_vars(ndim: usize) -> Vec<Expr> {
    (0..ndim).map(|d| te::var(&format!("d{d}"))).collect()
}

fn elementwise(name: &'static str, dtype: DType, ndim: usize, f: fn(Expr) -> Expr) -> Result<Def> {
    float(dtype, name)?;
    let shape = shape_vars(ndim);
    let x = placeholder(&shape, dtype, "X")?;
    let y = compute_dyn(&shape, |i| f(x.at(i)), "Y")?;
    generic(name, vec![x, y])
}

pub fn relu(dtype: DType, ndim: usize) -> Result<Def> {
    elementwise("relu", dtype, ndim, |x| te::maximum(&x, 0.0))
}

pub fn gelu(dtype: DType, ndim: usize) -> Result<Def> {
    // The exact (erf) form, torch's default.
    elementwise("gelu", dtype, ndim, |x| {
        0.5 * &x * (1.0 + te::erf(x * std::f64::consts::FRAC_1_SQRT_2))
    })
}

pub(super) fn norm_axis(axis: i64, ndim: usize, kernel: &str) -> Result<usize> {
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
    v[axis] = r.into();
    v
}

/// Softmax over `axis` (already normalised to `0..ndim`).
pub fn softmax(dtype: DType, ndim: usize, axis: usize) -> Result<Def> {
    float(dtype, "softmax")?;
    let shape = shape_vars(ndim);
    let x = placeholder(&shape, dtype, "X")?;
    let row = row_shape(&shape, axis);
    let r1 = te::reduce_axis(0, &shape[axis], "r1")?;
    let r2 = te::reduce_axis(0, &shape[axis], "r2")?;
    let mx = compute_dyn(
        &row,
        |i| te::max_over(x.at(with_axis(i, axis, &r1)), &r1),
        "max",
    )?;
    // Shift invariance: the max's derivative is zero in exact maths, so the backward
    // skips it (a tie count and a sum per row otherwise), as jax.nn.softmax does.
    let mx = te::stop_gradient(&mx)?;
    let e = compute_dyn(&shape, |i| te::exp(x.at(i) - mx.at(at_row(i, axis))), "exp")?;
    let sm = compute_dyn(&row, |i| te::sum(e.at(with_axis(i, axis, &r2)), &r2), "sum")?;
    // A reciprocal per row and a product per element, as torch's CPU softmax: a packed
    // division per four elements cost 15% of the kernel.
    let y = compute_dyn(&shape, |i| e.at(i) * (1.0 / sm.at(at_row(i, axis))), "Y")?;
    generic("softmax", vec![x, y])
}

/// `shape` with dim `axis` of extent 1: a per-row value of a reduction over `axis`.
fn row_shape(shape: &[Expr], axis: usize) -> Vec<Expr> {
    let mut v = shape.to_vec();
    v[axis] = Expr::int(1);
    v
}

/// The index of `i`'s row value (dim `axis` at 0).
fn at_row(i: &[Expr], axis: usize) -> Vec<Expr> {
    let mut v = i.to_vec();
    v[axis] = Expr::int(0);
    v
}

pub fn layer_norm(dtype: DType, ndim: usize, eps: f64) -> Result<Def> {
    float(dtype, "layer_norm")?;
    if ndim == 0 {
        return Err(Error::Compile(
            "kernels.layer_norm: needs at least one dim".into(),
        ));
    }
    let shape = shape_vars(ndim);
    let last = ndim - 1;
    let n = &shape[last];
    let x = placeholder(&shape, dtype, "X")?;
    let gamma = placeholder([n], dtype, "gamma")?;
    let beta = placeholder([n], dtype, "beta")?;
    let row = row_shape(&shape, last);
    let r1 = te::reduce_axis(0, n, "r1")?;
    let r2 = te::reduce_axis(0, n, "r2")?;
    let nf = te::cast(dtype, n);
    let total = compute_dyn(
        &row,
        |i| te::sum(x.at(with_axis(i, last, &r1)), &r1),
        "total",
    )?;
    let centered = compute_dyn(
        &shape,
        |i| x.at(i) - total.at(at_row(i, last)) / &nf,
        "centered",
    )?;
    let sq = compute_dyn(
        &row,
        |i| {
            let v = centered.at(with_axis(i, last, &r2));
            te::sum(&v * &v, &r2)
        },
        "sqsum",
    )?;
    let y = compute_dyn(
        &shape,
        |i| {
            let var = sq.at(at_row(i, last)) / &nf;
            let inv = te::rsqrt(&var + eps);
            centered.at(i) * inv * gamma.at([&i[last]]) + beta.at([&i[last]])
        },
        "Y",
    )?;
    generic("layer_norm", vec![x, gamma, beta, y])
}

/// A sum (or max) over `axis` (already normalised), removed from the output's shape.
pub fn reduce(
    name: &'static str,
    dtype: DType,
    ndim: usize,
    axis: usize,
    max: bool,
) -> Result<Def> {
    {
        let shape = shape_vars(ndim);
        let x = placeholder(&shape, dtype, "X")?;
        let out_shape: Vec<Expr> = shape
            .iter()
            .enumerate()
            .filter(|(d, _)| *d != axis)
            .map(|(_, e)| e.clone())
            .collect();
        let r = te::reduce_axis(0, &shape[axis], "r")?;
        let y = compute_dyn(
            &out_shape,
            |i| {
                let mut full = i.to_vec();
                full.insert(axis, Expr::from(&r));
                let v = x.at(full);
                if max {
                    te::max_over(v, &r)
                } else {
                    te::sum(v, &r)
                }
            },
            "Y",
        )?;
        generic(name, vec![x, y])
    }
}

pub fn transpose(dtype: DType, perm: &[usize]) -> Result<Def> {
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
    {
        let shape = shape_vars(nd);
        let x = placeholder(&shape, dtype, "X")?;
        let out_shape: Vec<Expr> = perm.iter().map(|&p| shape[p].clone()).collect();
        // Y[i] = X[j] with j[perm[d]] = i[d].
        let y = compute_dyn(
            &out_shape,
            |i| {
                let mut j = vec![Expr::int(0); nd];
                for (d, &p) in perm.iter().enumerate() {
                    j[p] = i[d].clone();
                }
                x.at(j)
            },
            "Y",
        )?;
        generic("transpose", vec![x, y])
    }
}
