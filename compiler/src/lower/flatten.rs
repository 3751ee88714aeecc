//! Pass: buffer flattening. Every multi-dimensional `Load`/`Store` becomes one element offset
//! `sum(index_d * stride_d)` over the buffer's stride variables (bound at call time for
//! parameters, so transposed and sliced views work in place; bound to compact strides by
//! `Allocate` for locals). An intrinsic call's region bases are flattened the same way.

use crate::ir::expr::{Expr, ExprKind};
use crate::ir::stmt::{PrimFunc, Stmt};

fn offset(func: &PrimFunc, buf: crate::ir::BufId, indices: &[Expr]) -> Expr {
    let b = func.buffer(buf);
    let mut acc: Option<Expr> = None;
    for (i, s) in indices.iter().zip(&b.strides) {
        let term = i.mul(&Expr::var(s));
        acc = Some(match acc {
            None => term,
            Some(a) => a.add(&term),
        });
    }
    acc.unwrap_or_else(|| Expr::int(0))
}

pub fn flatten(func: &mut PrimFunc) {
    let f = func.clone();
    let mut fe = |e: &Expr| {
        e.rewrite(&mut |n| match n.kind() {
            ExprKind::Load { buf, indices } => {
                Some(Expr::load(*buf, vec![offset(&f, *buf, indices)], n.dtype()))
            }
            _ => None,
        })
    };
    func.body = func.body.rewrite(&mut fe, &mut |s| match s {
        Stmt::Store {
            buf,
            indices,
            value,
        } => Stmt::Store {
            buf,
            indices: vec![offset(&f, buf, &indices)],
            value,
        },
        // A region's base element is flattened like an access; its axes keep their dims,
        // whose stride variables step the region (`ir::intrin`).
        Stmt::Call {
            intrin,
            regions,
            scalars,
        } => Stmt::Call {
            intrin,
            regions: regions
                .into_iter()
                .map(|mut r| {
                    r.base = vec![offset(&f, r.buf, &r.base)];
                    r
                })
                .collect(),
            scalars,
        },
        other => other,
    });
}
