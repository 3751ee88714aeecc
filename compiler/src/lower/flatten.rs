//! Pass: buffer flattening. Every multi-dimensional `Load`/`Store` becomes one element offset
//! `sum(index_d * stride_d)` over the buffer's stride variables (bound at call time for
//! parameters, so transposed and sliced views work in place; bound to compact strides by
//! `Allocate` for locals, whose strides are written as constants where the shape gives them,
//! `strides`). An intrinsic call's region bases are flattened the same way; its axes step by
//! the stride variables.

use crate::ir::expr::{Expr, ExprKind};
use crate::ir::stmt::{BufKind, Buffer, PrimFunc, Stmt};

/// The strides of `b` as expressions: a local's are known where its trailing extents are
/// constants — `Allocate` makes it compact, row-major, so the last stride is 1 and each other
/// is the product of the extents after it (computed exactly; an overflowing product keeps the
/// variable) — so offsets into a local tile fold to constants (a register tile's twelve rows
/// of a packed panel were twelve multiplications by a stride variable per step); parameters
/// keep their stride variables (any view).
fn strides(b: &Buffer) -> Vec<Expr> {
    let mut out: Vec<Expr> = b.strides.iter().map(Expr::var).collect();
    if b.kind != BufKind::Local || out.len() != b.shape.len() {
        return out;
    }
    let mut count: Option<i64> = Some(1);
    for k in (0..out.len()).rev() {
        match count {
            Some(c) => out[k] = Expr::int(c),
            None => break,
        }
        count = count.and_then(|c| b.shape[k].as_int().and_then(|e| c.checked_mul(e.max(0))));
    }
    out
}

fn offset(func: &PrimFunc, buf: crate::ir::BufId, indices: &[Expr]) -> Expr {
    let b = func.buffer(buf);
    let mut acc: Option<Expr> = None;
    for (i, s) in indices.iter().zip(strides(b)) {
        let term = i.mul(&s);
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
