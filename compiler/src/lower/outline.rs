//! The host/device split (outlining; not the `split` schedule primitive): each outermost
//! `Parallel` loop and each GPU kernel (the outermost loop bound to a launch dimension) is
//! outlined into `func.kernels` and replaced by a `Launch`, together with what it captures
//! from the host (`ir::uses::free_uses`): the buffers it touches and the variables it reads.
//! Backends compile each outlined body on its own — the CPU runs a parallel body on its
//! thread pool, CUDA compiles a kernel — and the host code passes the captures. This is the last pass; saved modules hold the IR before it.
//!
//! Invariants after it: no `Parallel` loop and no bound loop is left in `func.body` outside a
//! `Launch`d body (parallel loops nested in a parallel body stay, and run serially there);
//! every `Launch` names an existing kernel; a kernel's captures are exactly its free uses.

use crate::ir::expr::Var;
use crate::ir::stmt::{DeviceFunc, DeviceKind, ForKind, PrimFunc, Stmt};
use crate::ir::uses::free_uses;
use std::collections::HashMap;

/// Outlines the parallel loops and kernels of `f` (see the module documentation).
pub fn outline(f: &mut PrimFunc) {
    // Every variable by id, for the captures' names.
    let mut names: HashMap<u32, Var> = HashMap::new();
    for v in f
        .dims
        .iter()
        .chain(f.buffers.iter().flat_map(|b| &b.strides))
    {
        names.insert(v.id, v.clone());
    }
    f.body.visit(&mut |s| {
        if let Stmt::For { var, .. } | Stmt::Let { var, .. } = s {
            names.insert(var.id, var.clone());
        }
    });
    let mut kernels = std::mem::take(&mut f.kernels);
    let body = outline_stmt(&f.body, f, &names, &mut kernels);
    f.body = body;
    f.kernels = kernels;
}

/// `s` with its outermost parallel loops and kernels outlined into `out`.
fn outline_stmt(
    s: &Stmt,
    f: &PrimFunc,
    names: &HashMap<u32, Var>,
    out: &mut Vec<DeviceFunc>,
) -> Stmt {
    let rec = |s: &Stmt, out: &mut Vec<DeviceFunc>| Box::new(outline_stmt(s, f, names, out));
    match s {
        Stmt::For {
            kind: kind @ (ForKind::Parallel | ForKind::Thread(_)),
            ..
        } => {
            let (bufs, vars) = free_uses(s, f);
            let k = out.len();
            let (kind, name) = if *kind == ForKind::Parallel {
                (DeviceKind::CpuParallel, format!("{}.parallel{k}", f.name))
            } else {
                (DeviceKind::Gpu, format!("{}_kernel{k}", f.name))
            };
            out.push(DeviceFunc {
                name,
                kind,
                body: s.clone(),
                bufs: bufs.into_iter().collect(),
                vars: vars
                    .into_iter()
                    .map(|id| names.get(&id).cloned().unwrap_or_else(|| Var::new("?")))
                    .collect(),
            });
            Stmt::Launch { kernel: k }
        }
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } => Stmt::For {
            var: var.clone(),
            min: min.clone(),
            extent: extent.clone(),
            kind: *kind,
            body: rec(body, out),
        },
        Stmt::If {
            cond,
            then,
            otherwise,
        } => Stmt::If {
            cond: cond.clone(),
            then: rec(then, out),
            otherwise: otherwise.as_ref().map(|o| rec(o, out)),
        },
        Stmt::Let { var, value, body } => Stmt::Let {
            var: var.clone(),
            value: value.clone(),
            body: rec(body, out),
        },
        Stmt::Allocate { bufs, body } => Stmt::Allocate {
            bufs: bufs.clone(),
            body: rec(body, out),
        },
        Stmt::Seq(v) => Stmt::Seq(v.iter().map(|s| outline_stmt(s, f, names, out)).collect()),
        Stmt::Store { .. }
        | Stmt::Barrier
        | Stmt::AllReduce { .. }
        | Stmt::Launch { .. }
        | Stmt::Call { .. } => s.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::expr::Expr;
    use crate::ir::stmt::ThreadTag;
    use crate::ir::test_util::{func, input, output};
    use crate::ir::verify::verify;
    use rivet_runtime::DType;

    fn looped(v: &Var, extent: Expr, kind: ForKind, body: Stmt) -> Stmt {
        Stmt::For {
            var: v.clone(),
            min: Expr::int(0),
            extent,
            kind,
            body: Box::new(body),
        }
    }

    /// `for o in [0, 2): parallel for i in [0, n): parallel for j in [0, 4): C[i, j] = A[i, o]`
    /// and, after it, a kernel over the same buffers.
    fn program() -> PrimFunc {
        let (n, o, i, j, bx) = (
            Var::new("n"),
            Var::new("o"),
            Var::new("i"),
            Var::new("j"),
            Var::new("bx"),
        );
        let a = input(0, "A", DType::F32, vec![Expr::var(&n), Expr::int(2)]);
        let c = output(1, "C", DType::F32, vec![Expr::var(&n), Expr::int(4)]);
        let store = Stmt::Store {
            buf: c.id,
            indices: vec![Expr::var(&i), Expr::var(&j)],
            value: Expr::load(a.id, vec![Expr::var(&i), Expr::var(&o)], DType::F32),
        };
        let par = looped(
            &i,
            Expr::var(&n),
            ForKind::Parallel,
            looped(&j, Expr::int(4), ForKind::Parallel, store),
        );
        let kernel = looped(
            &bx,
            Expr::var(&n),
            ForKind::Thread(ThreadTag::BlockX),
            Stmt::Store {
                buf: c.id,
                indices: vec![Expr::var(&bx), Expr::int(0)],
                value: Expr::constant(1.0, DType::F32),
            },
        );
        let body = Stmt::Seq(vec![looped(&o, Expr::int(2), ForKind::Serial, par), kernel]);
        func("f", vec![a, c], vec![n], body)
    }

    #[test]
    fn outermost_parallel_loops_and_kernels_are_outlined_with_their_captures() {
        let mut f = program();
        outline(&mut f);
        verify(&f, false).unwrap();
        assert_eq!(f.kernels.len(), 2, "{f}");
        let (p, k) = (&f.kernels[0], &f.kernels[1]);
        assert_eq!(
            (p.kind, p.name.as_str()),
            (DeviceKind::CpuParallel, "f.parallel0")
        );
        assert_eq!((k.kind, k.name.as_str()), (DeviceKind::Gpu, "f_kernel1"));
        // The parallel body reads A and writes C, uses n, the outer loop's o and the strides;
        // i and j are its own. The nested parallel loop stays inside it.
        let names = |d: &DeviceFunc| {
            d.vars
                .iter()
                .map(|v| v.name.to_string())
                .collect::<Vec<_>>()
        };
        // (By id: the loop variables were made before the buffers' strides.)
        assert_eq!(names(p), ["n", "o", "A.s0", "A.s1", "C.s0", "C.s1"]);
        assert_eq!(p.bufs.len(), 2);
        let mut nested = 0;
        p.body.visit(&mut |s| {
            nested += matches!(
                s,
                Stmt::For {
                    kind: ForKind::Parallel,
                    ..
                }
            ) as usize
        });
        assert_eq!(nested, 2);
        assert_eq!(names(k), ["n", "C.s0", "C.s1"]);
        let text = f.to_string();
        assert!(
            text.contains("launch f.parallel0(A, C; n, o, A.s0, A.s1, C.s0, C.s1):"),
            "{text}"
        );
    }

    #[test]
    fn the_verifier_checks_the_captures() {
        let mut f = program();
        outline(&mut f);
        let mut short = f.clone();
        short.kernels[0].vars.pop();
        let e = verify(&short, false).unwrap_err().to_string();
        assert!(e.contains("captures exactly what it uses"), "{e}");
        let mut missing = f.clone();
        missing.body = Stmt::Launch { kernel: 7 };
        let e = verify(&missing, false).unwrap_err().to_string();
        assert!(e.contains("a launch names an outlined body"), "{e}");
    }
}
