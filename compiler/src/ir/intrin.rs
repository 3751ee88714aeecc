//! Intrinsic calls (`Stmt::Call`): an opaque body — a micro-kernel — given regions of buffers
//! it reads and writes (TVM's `TensorIntrin` / `call_extern` model).
//!
//! A region is a box of a buffer: a base element (`base`: one index per dim before
//! `flatten`, one element offset after) and the axes the intrinsic walks, each a buffer dim
//! with an extent: element `(t_0, t_1, ...)` of the region is the base moved by `t_a` along dim
//! `axes[a].dim`, for `0 <= t_a < axes[a].extent` (after flattening, by `t_a` times that dim's
//! stride variable). Dims are distinct within a region.
//!
//! Every intrinsic has a *declared computation* over its regions, `Call::model`: plain loop IR
//! with exactly the accesses the intrinsic may make. It is what makes an opaque call safe and
//! checkable:
//! - the bounds proof (`lower::bounds`) proves the model's accesses, i.e. every element of
//!   every region, inside its tensor, so the micro-kernel never escapes its tensors;
//! - the parallel-loop verifier checks the model's writes like any store (disjoint iterations);
//! - `tensorize` replaces a loop nest only when it *is* the model, up to the names of the loop
//!   variables (`schedule`'s tensorize), so a wrong match is a `CompileError`.
//!
//! A call's shape against its intrinsic's signature is checked by `verify::intrin::check_call`.
//!
//! The model computes `C = C + A * B` with two roundings; the intrinsic itself (the
//! interpreter's reference and every micro-kernel, `codegen::cpu_lib::microkernel`) fuses each
//! multiply-add (one rounding) in the same order. That is the only difference a tensorized
//! program shows against its untensorized nest (docs/cpu.md gives the tolerance).

use super::expr::{BufId, Expr, Var};
use super::stmt::{Buffer, ForKind, PrimFunc, Stmt};
use serde::{Deserialize, Serialize};

/// The intrinsics rivet knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Intrin {
    /// GEMM tile update over packed panels: regions `[C (written; axes i, j), A (read; axes p,
    /// i), B (read; axes p, j)]`, extents `m, n` (C), `k, m` (A), `k, n` (B), all float32 or
    /// all float64; `C[i, j] = fold_p fma(A[p, i], B[p, j], C[i, j])`, `p` ascending.
    GemmUpdate,
    /// A host callback, `PrimFunc::callbacks[k]` (`ir::callback`): whole-buffer regions,
    /// `[out (written), in_0, ... (read)]` for an extern stage, `[stage (read)]` for a tap;
    /// its declared computation writes every element of `out` and reads every element of the
    /// inputs. Never matched by `tensorize` and never parsed from a schedule.
    Callback(u32),
}

impl Intrin {
    pub fn name(self) -> &'static str {
        match self {
            Intrin::GemmUpdate => "gemm_update",
            Intrin::Callback(_) => "callback",
        }
    }

    pub fn parse(s: &str) -> Option<Intrin> {
        match s {
            "gemm_update" | "gemm" => Some(Intrin::GemmUpdate),
            _ => None,
        }
    }
}

/// One axis of a region: the buffer dim it walks and how far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionAxis {
    pub dim: u32,
    pub extent: Expr,
}

/// A box of a buffer an intrinsic reads or writes (module header).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Region {
    pub buf: BufId,
    pub base: Vec<Expr>,
    pub axes: Vec<RegionAxis>,
    pub write: bool,
}

impl Region {
    /// The indices of element `ts` (one expression per axis) of the region in `b`: one per
    /// dim, or one element offset when `flat`.
    pub fn index(&self, b: &Buffer, ts: &[Expr], flat: bool) -> Vec<Expr> {
        if flat {
            let mut off = self.base[0].clone();
            for (ax, t) in self.axes.iter().zip(ts) {
                off = off.add(&t.mul(&Expr::var(&b.strides[ax.dim as usize])));
            }
            vec![off]
        } else {
            let mut idx = self.base.clone();
            for (ax, t) in self.axes.iter().zip(ts) {
                let d = ax.dim as usize;
                idx[d] = idx[d].add(t);
            }
            idx
        }
    }

    /// Rebuilds the region's expressions with `fe`.
    pub fn map(&self, fe: &mut dyn FnMut(&Expr) -> Expr) -> Region {
        Region {
            buf: self.buf,
            base: self.base.iter().map(&mut *fe).collect(),
            axes: self
                .axes
                .iter()
                .map(|a| RegionAxis {
                    dim: a.dim,
                    extent: fe(&a.extent),
                })
                .collect(),
            write: self.write,
        }
    }

    /// Every expression of the region (bases and extents).
    pub fn exprs(&self) -> impl Iterator<Item = &Expr> {
        self.base.iter().chain(self.axes.iter().map(|a| &a.extent))
    }
}

/// The extents `(m, n, k)` of a well-formed `GemmUpdate` call.
pub fn gemm_extents(regions: &[Region]) -> (Expr, Expr, Expr) {
    (
        regions[0].axes[0].extent.clone(),
        regions[0].axes[1].extent.clone(),
        regions[1].axes[0].extent.clone(),
    )
}

/// `for t in region: body(indices of t)`, over fresh variables.
fn region_loops(
    func: &PrimFunc,
    r: &Region,
    flat: bool,
    body: impl FnOnce(Vec<Expr>) -> Stmt,
) -> Stmt {
    let vars: Vec<Var> = (0..r.axes.len())
        .map(|d| Var::new(&format!("cb_{d}")))
        .collect();
    let ts: Vec<Expr> = vars.iter().map(Expr::var).collect();
    let mut s = body(r.index(func.buffer(r.buf), &ts, flat));
    for (v, a) in vars.into_iter().zip(&r.axes).rev() {
        s = Stmt::For {
            var: v,
            min: Expr::int(0),
            extent: a.extent.clone(),
            kind: ForKind::Serial,
            body: Box::new(s),
        };
    }
    s
}

/// The declared computation of a call (module header), as loop IR over fresh variables.
/// `func` declares the buffers; the call must pass `check_call`.
pub fn model(func: &PrimFunc, intrin: Intrin, regions: &[Region], flat: bool) -> Stmt {
    match intrin {
        // Every element of every read region is loaded (in a condition with nothing to do),
        // then every element of the written region is stored: exactly the accesses of the
        // callback's copies in and out (`codegen::cpu_lib::callback`).
        Intrin::Callback(_) => {
            let mut body = Vec::new();
            for r in regions {
                let dt = func.buffer(r.buf).dtype;
                let stmt = if r.write {
                    region_loops(func, r, flat, |idx| Stmt::Store {
                        buf: r.buf,
                        indices: idx,
                        value: Expr::constant(0.0, dt),
                    })
                } else {
                    region_loops(func, r, flat, |idx| {
                        let x = Expr::load(r.buf, idx, dt);
                        Stmt::If {
                            cond: Expr::cmp(super::expr::CmpOp::Eq, x.clone(), x)
                                .expect("an element compares with itself"),
                            then: Box::new(Stmt::Seq(vec![])),
                            otherwise: None,
                        }
                    })
                };
                body.push(stmt);
            }
            Stmt::Seq(body)
        }
        Intrin::GemmUpdate => {
            let (m, n, k) = gemm_extents(regions);
            let (i, j, p) = (Var::new("mk_i"), Var::new("mk_j"), Var::new("mk_p"));
            let (ie, je, pe) = (Expr::var(&i), Expr::var(&j), Expr::var(&p));
            let at = |r: &Region, ts: &[Expr]| {
                let b = func.buffer(r.buf);
                (r.buf, r.index(b, ts, flat), b.dtype)
            };
            let (cb, ci, dt) = at(&regions[0], &[ie.clone(), je.clone()]);
            let (ab, ai, _) = at(&regions[1], &[pe.clone(), ie]);
            let (bb, bi, _) = at(&regions[2], &[pe, je]);
            let c = Expr::load(cb, ci.clone(), dt);
            let prod = Expr::load(ab, ai, dt).mul(&Expr::load(bb, bi, dt));
            let body = Stmt::Store {
                buf: cb,
                indices: ci,
                value: c.add(&prod),
            };
            let lp = |v: Var, e: Expr, body: Stmt| Stmt::For {
                var: v,
                min: Expr::int(0),
                extent: e,
                kind: ForKind::Serial,
                body: Box::new(body),
            };
            lp(i, m, lp(j, n, lp(p, k, body)))
        }
    }
}
