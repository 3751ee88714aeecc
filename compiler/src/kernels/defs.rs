//! Kernel definitions: what each library kernel computes, as te stages, apart from how it is
//! scheduled (TVM's compute / strategy split). `strategy.rs` schedules a definition for a
//! target; `mod.rs` caches the built functions. A definition is target-independent: one
//! definition, a CPU and a GPU schedule.

use super::DimSpec;
use crate::error::{Error, Result};
use crate::ir::expr::{Expr, IterVar};
use crate::te::{self, ax, compute, ok, placeholder, Tensor};
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

fn sym(names: &[&str]) -> Vec<Expr> {
    names.iter().map(|n| te::var(n)).collect()
}

pub fn matmul(dtype: DType) -> Result<Def> {
    {
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
        Ok(Def {
            name: "matmul",
            args: vec![a, b, c],
            pattern: Pattern::Contraction,
        })
    }
}

pub fn batch_matmul(dtype: DType) -> Result<Def> {
    {
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
        Ok(Def {
            name: "batch_matmul",
            args: vec![a, b, c],
            pattern: Pattern::Contraction,
        })
    }
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
            generic(op, vec![a, b, c])
        }
    }
}

fn shape_vars(ndim: usize) -> Vec<Expr> {
    (0..ndim).map(|d| te::var(&format!("d{d}"))).collect()
}

fn elementwise(
    name: &'static str,
    dtype: DType,
    ndim: usize,
    f: fn(Expr) -> Result<Expr>,
) -> Result<Def> {
    float(dtype, name)?;
    {
        let shape = shape_vars(ndim);
        let x = placeholder(&shape, dtype, "X")?;
        let x2 = x.clone();
        let y = compute(&shape, |i| ok(f(x2.idx(i))), "Y")?;
        generic(name, vec![x, y])
    }
}

pub fn relu(dtype: DType, ndim: usize) -> Result<Def> {
    elementwise("relu", dtype, ndim, |x| {
        te::maximum(x.clone(), te::number_like(0.0, &x))
    })
}

pub fn gelu(dtype: DType, ndim: usize) -> Result<Def> {
    elementwise("gelu", dtype, ndim, |x| {
        let half = te::number_like(0.5, &x);
        let one = te::number_like(1.0, &x);
        let inv_sqrt2 = te::number_like(std::f64::consts::FRAC_1_SQRT_2, &x);
        Ok(half * x.clone() * (one + te::erf(x * inv_sqrt2)?))
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
    v[axis] = ax(r);
    v
}

/// Softmax over `axis` (already normalised to `0..ndim`).
pub fn softmax(dtype: DType, ndim: usize, axis: usize) -> Result<Def> {
    float(dtype, "softmax")?;
    {
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
                // A reciprocal per row and a product per element, as torch's CPU softmax:
                // a packed division per four elements cost 15% of the kernel.
                let one = te::number_like(1.0, &e3.idx(i));
                e3.idx(i) * (one / sm3.idx(&si))
            },
            "Y",
        )?;
        generic("softmax", vec![x, y])
    }
}

pub fn layer_norm(dtype: DType, ndim: usize, eps: f64) -> Result<Def> {
    float(dtype, "layer_norm")?;
    if ndim == 0 {
        return Err(Error::Compile(
            "kernels.layer_norm: needs at least one dim".into(),
        ));
    }
    {
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
        generic("layer_norm", vec![x, gamma, beta, y])
    }
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
        generic("transpose", vec![x, y])
    }
}
