//! Pass: barrier insertion in GPU kernels (TVM's `storage_sync`), run on each kernel after the
//! host/device split.
//!
//! Threads of a block share `shared` buffers; a thread may read an element another wrote only
//! after a `Barrier` between the two, and may overwrite an element another read only after
//! one too. This pass walks each kernel's block body in program order and inserts a
//! `Barrier` before the first statement that
//! - reads a shared buffer written since the last barrier (read after write), or
//! - writes a shared buffer read since the last barrier (write after read), including reads
//!   of the previous iteration of an enclosing loop (the statement that overwrites a tile in
//!   the next iteration). Write after write is not a conflict (`Pending::conflicts`).
//!
//! It is conservative at buffer granularity (a thread reading back its own writes gets a
//! barrier it does not need) and places barriers only where the verifier allows them: in the
//! block body, never under an `If` or in a loop whose bounds differ between threads. Such a
//! statement is analysed as a whole: if it holds a conflict within itself, no barrier can fix
//! it there, and the interpreter reports the race (`codegen::interp::gpu`).
//!
//! Invariants: the pass only adds `Barrier` statements; a kernel with no shared buffer is
//! unchanged.

use crate::ir::expr::{Expr, ExprKind, Var};
use crate::ir::stmt::{DeviceKind, ForKind, PrimFunc, Scope, Stmt};
use std::collections::HashSet;

/// Shared buffers accessed since the last barrier.
#[derive(Clone, Default, PartialEq, Debug)]
struct Pending {
    read: HashSet<u32>,
    written: HashSet<u32>,
}

impl Pending {
    fn join(&self, o: &Pending) -> Pending {
        Pending {
            read: self.read.union(&o.read).copied().collect(),
            written: self.written.union(&o.written).copied().collect(),
        }
    }
    /// Read after write, write after read. Not write after write: threads writing one
    /// buffer in turn (the iterations of a cooperative load) write different elements, and
    /// two threads writing the same element in one phase is a race no barrier placement
    /// decides (TVM's storage_sync makes the same choice).
    fn conflicts(&self, acc: &Pending) -> bool {
        !acc.read.is_disjoint(&self.written) || !acc.written.is_disjoint(&self.read)
    }
    fn add(&mut self, acc: &Pending) {
        self.read.extend(&acc.read);
        self.written.extend(&acc.written);
    }
}

/// Inserts the barriers every GPU kernel of `func` needs (module documentation).
pub fn insert_barriers(func: &mut PrimFunc) {
    let shared: HashSet<u32> = func
        .buffers
        .iter()
        .filter(|b| b.scope == Scope::Shared)
        .map(|b| b.id.0)
        .collect();
    if shared.is_empty() {
        return;
    }
    for k in &mut func.kernels {
        if k.kind != DeviceKind::Gpu {
            continue;
        }
        let w = Walker { shared: &shared };
        k.body = w.kernel(&k.body);
    }
}

struct Walker<'a> {
    shared: &'a HashSet<u32>,
}

impl Walker<'_> {
    /// The kernel with barriers in its block body (below its block loops).
    fn kernel(&self, s: &Stmt) -> Stmt {
        match s {
            Stmt::For {
                var,
                min,
                extent,
                kind: kind @ ForKind::Thread(tag),
                body,
            } if tag.is_block() => Stmt::For {
                var: var.clone(),
                min: min.clone(),
                extent: extent.clone(),
                kind: *kind,
                body: Box::new(self.kernel(body)),
            },
            _ => {
                let mut varying = HashSet::new();
                self.walk(s, Pending::default(), &mut varying).0
            }
        }
    }

    /// The shared buffers `s` reads and writes (its whole subtree).
    fn accesses(&self, s: &Stmt) -> Pending {
        let mut p = Pending::default();
        let shared = self.shared;
        let loads = |e: &Expr, p: &mut Pending| {
            e.visit(&mut |n| {
                if let ExprKind::Load { buf, .. } = n.kind() {
                    if shared.contains(&buf.0) {
                        p.read.insert(buf.0);
                    }
                }
            })
        };
        s.visit(&mut |st| {
            if let Stmt::Store { buf, .. } = st {
                if shared.contains(&buf.0) {
                    p.written.insert(buf.0);
                }
            }
        });
        s.visit_exprs(&mut |e| loads(e, &mut p));
        p
    }

    /// Whether `e` may differ between the threads of a block: it uses a thread index or a
    /// variable derived from one (`varying`), or reads memory.
    fn varies(e: &Expr, varying: &HashSet<u32>) -> bool {
        let mut v = false;
        e.visit(&mut |n| match n.kind() {
            ExprKind::Load { .. } => v = true,
            _ => {
                if let Some(x) = n.as_var() {
                    v |= varying.contains(&x.id);
                }
            }
        });
        v
    }

    /// Rebuilds `s` with barriers, given the accesses pending before it; returns it with the
    /// accesses pending after it. A barrier goes as far out as it can: before the outermost
    /// statement whose accesses conflict with the pending ones (once before a tile loop, not
    /// in every iteration of the loops inside).
    fn walk(&self, s: &Stmt, pending: Pending, varying: &mut HashSet<u32>) -> (Stmt, Pending) {
        match s {
            Stmt::Seq(v) => {
                let mut out = Vec::with_capacity(v.len());
                let mut p = pending;
                for x in v {
                    let (y, q) = self.walk(x, p, varying);
                    out.push(y);
                    p = q;
                }
                (Stmt::Seq(out), p)
            }
            Stmt::Barrier => (Stmt::Barrier, Pending::default()),
            _ => {
                if pending.conflicts(&self.accesses(s)) {
                    let (y, q) = self.inside(s, Pending::default(), varying);
                    (Stmt::Seq(vec![Stmt::Barrier, y]), q)
                } else {
                    self.inside(s, pending, varying)
                }
            }
        }
    }

    /// `walk` of a statement that is not a `Seq` or a `Barrier`, once the barrier before it
    /// (if any) is placed: barriers for conflicts inside it.
    fn inside(&self, s: &Stmt, pending: Pending, varying: &mut HashSet<u32>) -> (Stmt, Pending) {
        match s {
            Stmt::For {
                var,
                min,
                extent,
                kind: kind @ ForKind::Thread(_),
                body,
            } => {
                // A thread loop does not iterate: its variable is the thread's index.
                varying.insert(var.id);
                let (b, p) = self.walk(body, pending, varying);
                (for_(var, min, extent, *kind, b), p)
            }
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } if !Self::varies(min, varying) && !Self::varies(extent, varying) => {
                // Iterated together by all threads: the accesses of one iteration are pending
                // at the start of the next. Iterate the analysis to a fixed point (the sets
                // only grow, bounded by the shared buffers).
                let mut entry = pending.clone();
                let (mut b, mut exit) = self.walk(body, entry.clone(), varying);
                for _ in 0..=self.shared.len() * 2 + 1 {
                    let next = pending.join(&exit);
                    if next == entry {
                        break;
                    }
                    entry = next;
                    (b, exit) = self.walk(body, entry.clone(), varying);
                }
                // The loop may run no iteration: what was pending before may still be.
                (for_(var, min, extent, *kind, b), exit.join(&pending))
            }
            Stmt::Let { var, value, body } => {
                if Self::varies(value, varying) {
                    varying.insert(var.id);
                }
                let (b, p) = self.walk(body, pending, varying);
                (
                    Stmt::Let {
                        var: var.clone(),
                        value: value.clone(),
                        body: Box::new(b),
                    },
                    p,
                )
            }
            Stmt::Allocate { bufs, body } => {
                let (b, p) = self.walk(body, pending, varying);
                (
                    Stmt::Allocate {
                        bufs: bufs.clone(),
                        body: Box::new(b),
                    },
                    p,
                )
            }
            // Stores, conditionals, loops of thread-varying bounds: a barrier cannot stand
            // inside; the one before (`walk`) is all there can be.
            other => {
                if let Stmt::For { var, .. } = other {
                    varying.insert(var.id);
                }
                let mut p = pending;
                p.add(&self.accesses(other));
                (other.clone(), p)
            }
        }
    }
}

fn for_(var: &Var, min: &Expr, extent: &Expr, kind: ForKind, body: Stmt) -> Stmt {
    Stmt::For {
        var: var.clone(),
        min: min.clone(),
        extent: extent.clone(),
        kind,
        body: Box::new(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::stmt::{BufKind, DeviceFunc, ThreadTag};
    use crate::ir::test_util::{buffer, func};
    use rivet_runtime::DType;

    fn shared(id: u32, name: &str) -> crate::ir::stmt::Buffer {
        let mut b = buffer(id, name, DType::F32, vec![Expr::int(64)], BufKind::Local);
        b.scope = Scope::Shared;
        b
    }
    fn st(buf: u32, value: Expr) -> Stmt {
        Stmt::Store {
            buf: crate::ir::BufId(buf),
            indices: vec![Expr::int(0)],
            value,
        }
    }
    fn ld(buf: u32) -> Expr {
        Expr::load(crate::ir::BufId(buf), vec![Expr::int(0)], DType::F32)
    }
    fn lp(v: &Var, kind: ForKind, body: Stmt) -> Stmt {
        for_(v, &Expr::int(0), &Expr::int(4), kind, body)
    }
    fn count(s: &Stmt) -> usize {
        let mut n = 0;
        s.visit(&mut |x| n += matches!(x, Stmt::Barrier) as usize);
        n
    }

    /// Load a tile, use it, in a serial loop: a barrier after the load (read after write) and
    /// one before the next iteration's load (write after read); none around a local buffer.
    #[test]
    fn barriers_between_tile_loads_and_uses_and_across_iterations() {
        let (bx, tx, ko) = (Var::new("bx"), Var::new("tx"), Var::new("ko"));
        let body = Stmt::Seq(vec![
            st(0, Expr::constant(1.0, DType::F32)),
            st(1, ld(0)), // local (not shared): no barrier needed around it
        ]);
        let use_ = st(1, ld(0));
        let kernel = lp(
            &bx,
            ForKind::Thread(ThreadTag::BlockX),
            lp(
                &tx,
                ForKind::Thread(ThreadTag::ThreadX),
                lp(&ko, ForKind::Serial, Stmt::Seq(vec![body, use_])),
            ),
        );
        let mut f = func(
            "f",
            vec![
                shared(0, "S"),
                buffer(1, "L", DType::F32, vec![Expr::int(1)], BufKind::Local),
            ],
            vec![],
            Stmt::Launch { kernel: 0 },
        );
        f.params.clear();
        f.kernels.push(DeviceFunc {
            name: "f_kernel0".into(),
            kind: DeviceKind::Gpu,
            body: kernel,
            bufs: vec![],
            vars: vec![],
        });
        insert_barriers(&mut f);
        let k = &f.kernels[0].body;
        // Before the first read of S after its write, and before the write of the next
        // iteration (read in the previous one).
        assert_eq!(count(k), 2, "{k:?}");
        // Idempotent: running it again adds nothing.
        let mut g = f.clone();
        insert_barriers(&mut g);
        assert_eq!(count(&g.kernels[0].body), 2);
    }

    /// A store under an `If` that conflicts gets its barrier before the `If`, not inside.
    #[test]
    fn no_barrier_inside_a_conditional() {
        let (bx, tx) = (Var::new("bx"), Var::new("tx"));
        let cond = Expr::var(&tx).lt(&Expr::int(2));
        let kernel = lp(
            &bx,
            ForKind::Thread(ThreadTag::BlockX),
            lp(
                &tx,
                ForKind::Thread(ThreadTag::ThreadX),
                Stmt::Seq(vec![
                    st(0, Expr::constant(1.0, DType::F32)),
                    Stmt::If {
                        cond,
                        then: Box::new(st(0, ld(0))),
                        otherwise: None,
                    },
                ]),
            ),
        );
        let mut f = func(
            "f",
            vec![shared(0, "S")],
            vec![],
            Stmt::Launch { kernel: 0 },
        );
        f.params.clear();
        f.kernels.push(DeviceFunc {
            name: "f_kernel0".into(),
            kind: DeviceKind::Gpu,
            body: kernel,
            bufs: vec![],
            vars: vec![],
        });
        insert_barriers(&mut f);
        let Stmt::For { body, .. } = &f.kernels[0].body else {
            panic!()
        };
        let Stmt::For { body, .. } = &**body else {
            panic!()
        };
        let Stmt::Seq(v) = &**body else {
            panic!("{body:?}")
        };
        assert!(
            matches!(&v[1], Stmt::Seq(w) if matches!(w[0], Stmt::Barrier) && matches!(w[1], Stmt::If { .. }))
        );
    }
}
