//! What a statement uses from its surroundings: the buffers it touches and the variables it
//! reads. The host/device split (`lower::outline`) records this for each body it outlines, the
//! verifier checks the record, and the CPU backend loads from a call frame only what each
//! statement uses.
//!
//! Invariants: `uses` is a superset of what code generated for the statement can read — it
//! includes the shape and stride variables of every buffer accessed (checked-mode code and
//! span checks read them), the shapes of locals allocated inside, and, for a `Launch`, the
//! captures recorded for its body. Sets are ordered by id, so captures have a stable order.

use super::expr::{BufId, Expr, ExprKind};
use super::stmt::{PrimFunc, Stmt};
use std::collections::BTreeSet;

/// Adds to `bufs` and `vars` (by id) every buffer and variable `s` references, including
/// those bound or allocated inside it (see `free_uses` for the captured ones).
pub fn uses(s: &Stmt, func: &PrimFunc, bufs: &mut BTreeSet<BufId>, vars: &mut BTreeSet<u32>) {
    let on_expr = |e: &Expr, bufs: &mut BTreeSet<BufId>, vars: &mut BTreeSet<u32>| {
        e.visit(&mut |n| match n.kind() {
            ExprKind::Var(v) => {
                vars.insert(v.id);
            }
            ExprKind::Load { buf, .. } => {
                bufs.insert(*buf);
            }
            _ => {}
        })
    };
    s.visit(&mut |st| match st {
        Stmt::For { min, extent, .. } => {
            on_expr(min, bufs, vars);
            on_expr(extent, bufs, vars);
        }
        Stmt::Store {
            buf,
            indices,
            value,
        } => {
            bufs.insert(*buf);
            indices.iter().for_each(|i| on_expr(i, bufs, vars));
            on_expr(value, bufs, vars);
        }
        Stmt::If { cond, .. } => on_expr(cond, bufs, vars),
        Stmt::Let { value, .. } => on_expr(value, bufs, vars),
        Stmt::AllReduce { value, dst, .. } => {
            bufs.insert(*dst);
            on_expr(value, bufs, vars);
        }
        Stmt::Allocate {
            bufs: allocated, ..
        } => {
            bufs.extend(allocated.iter().copied());
        }
        Stmt::Launch { kernel } => {
            if let Some(k) = func.kernels.get(*kernel) {
                bufs.extend(k.bufs.iter().copied());
                vars.extend(k.vars.iter().map(|v| v.id));
            }
        }
        Stmt::Call {
            regions, scalars, ..
        } => {
            for r in regions {
                bufs.insert(r.buf);
                r.exprs().for_each(|e| on_expr(e, bufs, vars));
            }
            scalars.iter().for_each(|e| on_expr(e, bufs, vars));
        }
        Stmt::Seq(_) | Stmt::Barrier => {}
    });
    // Shapes and strides of every buffer touched (the shapes of locals are what `Allocate`
    // evaluates).
    for b in func.buffers.iter().filter(|b| bufs.contains(&b.id)) {
        b.shape
            .iter()
            .for_each(|e| on_expr(e, &mut BTreeSet::new(), vars));
        vars.extend(b.strides.iter().map(|v| v.id));
    }
}

/// The buffers and variables `s` uses from outside itself: `uses` minus the variables it
/// binds (loop and `Let` variables, the strides of locals it allocates) and the locals it
/// allocates. What an outlined body must be given.
pub fn free_uses(s: &Stmt, func: &PrimFunc) -> (BTreeSet<BufId>, BTreeSet<u32>) {
    let (mut bufs, mut vars) = (BTreeSet::new(), BTreeSet::new());
    uses(s, func, &mut bufs, &mut vars);
    s.visit(&mut |st| match st {
        Stmt::For { var, .. } | Stmt::Let { var, .. } => {
            vars.remove(&var.id);
        }
        Stmt::Allocate {
            bufs: allocated, ..
        } => {
            for buf in allocated {
                bufs.remove(buf);
                if let Some(b) = func.buffers.iter().find(|b| b.id == *buf) {
                    for v in &b.strides {
                        vars.remove(&v.id);
                    }
                }
            }
        }
        _ => {}
    });
    (bufs, vars)
}
