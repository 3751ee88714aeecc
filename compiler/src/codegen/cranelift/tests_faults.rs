//! Tests of the error channel of generated code: checked mode catching out-of-bounds accesses
//! (serial and inside parallel loops, with a local live) and local buffers that cannot be
//! allocated. Functions are built by hand so that accesses the bounds proof would refuse can
//! reach the backend; both backends must report the same typed error.

use super::CraneliftBackend;
use crate::codegen::interp::InterpBackend;
use crate::codegen::{Backend, CallFrame, LaunchContext};
use crate::error::Error;
use crate::ir::test_util::{buffer, func, input, output};
use crate::ir::{BufKind, Expr, ForKind, PrimFunc, Stmt, Var};
use rivet_runtime::DType;

fn backends(checked: bool) -> Vec<Box<dyn Backend>> {
    vec![
        Box::new(CraneliftBackend::new().unwrap().checked(checked)),
        Box::new(InterpBackend::new(checked)),
    ]
}

/// `B[i] = A[i + shift]` over `i in [0, n)`, unflattened, the loop of kind `kind`.
fn shifted(shift: i64, kind: ForKind) -> PrimFunc {
    let n = Var::new("n");
    let i = Var::new("i");
    let a = input(0, "A", DType::F32, vec![Expr::var(&n)]);
    let b = output(1, "B", DType::F32, vec![Expr::var(&n)]);
    let read = Expr::load(a.id, vec![Expr::var(&i).add(&Expr::int(shift))], DType::F32);
    let body = Stmt::For {
        var: i.clone(),
        min: Expr::int(0),
        extent: Expr::var(&n),
        kind,
        body: Box::new(Stmt::Store {
            buf: b.id,
            indices: vec![Expr::var(&i)],
            value: read,
        }),
    };
    split(func("shifted", vec![a, b], vec![n], body))
}

/// As `lower::lower` hands functions to backends: parallel loops outlined.
fn split(mut f: PrimFunc) -> PrimFunc {
    crate::lower::outline::outline(&mut f);
    f
}

fn run(k: &dyn crate::codegen::Kernel, a: &mut [f32], b: &mut [f32]) -> crate::Result<()> {
    let n = a.len() as i64;
    let frame = CallFrame {
        ptrs: vec![a.as_mut_ptr() as *mut u8, b.as_mut_ptr() as *mut u8].into(),
        ints: vec![n, 1, 1].into(),
    };
    // SAFETY: the frame describes `a` and `b` (n elements, stride 1); in checked mode every
    // access is checked against n before it is made.
    unsafe { k.launch(&frame, &LaunchContext::host()) }
}

#[test]
fn checked_mode_reports_the_tensor_dim_index_and_extent() {
    for kind in [ForKind::Serial, ForKind::Parallel] {
        for be in backends(true) {
            let k = be.compile(&shifted(1, kind)).unwrap();
            // 2^17 elements: the parallel loop really runs on the pool.
            let mut a = vec![1.0f32; 1 << 17];
            let mut b = vec![0.0f32; 1 << 17];
            let err = run(k.as_ref(), &mut a, &mut b).unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(err, Error::Runtime(rivet_runtime::Error::Index(_))),
                "{}: {msg}",
                be.target()
            );
            assert!(
                msg.contains("'A'") && msg.contains("dim 0") && msg.contains("131072"),
                "{msg}"
            );
            // In bounds: the same kernel gives the right answer.
            let k = be.compile(&shifted(0, kind)).unwrap();
            let a: Vec<f32> = (0..64).map(|x| x as f32).collect();
            let mut b = vec![f32::NAN; 64];
            run(k.as_ref(), &mut a.clone(), &mut b).unwrap();
            assert_eq!(a, b);
        }
    }
}

#[test]
fn a_local_that_cannot_be_allocated_is_a_memory_error() {
    // for i (parallel) { allocate T[2^40 f32]; T[0] = A[i]; B[i] = T[0] }
    let n = Var::new("n");
    let i = Var::new("i");
    let a = input(0, "A", DType::F32, vec![Expr::var(&n)]);
    let b = output(1, "B", DType::F32, vec![Expr::var(&n)]);
    let t = buffer(2, "T", DType::F32, vec![Expr::int(1 << 40)], BufKind::Local);
    let inner = Stmt::Seq(vec![
        Stmt::Store {
            buf: t.id,
            indices: vec![Expr::int(0)],
            value: Expr::load(a.id, vec![Expr::var(&i)], DType::F32),
        },
        Stmt::Store {
            buf: b.id,
            indices: vec![Expr::var(&i)],
            value: Expr::load(t.id, vec![Expr::int(0)], DType::F32),
        },
    ]);
    let body = Stmt::For {
        var: i.clone(),
        min: Expr::int(0),
        extent: Expr::var(&n),
        kind: ForKind::Parallel,
        body: Box::new(Stmt::Allocate {
            bufs: vec![t.id],
            body: Box::new(inner),
        }),
    };
    let f = split(func("big_local", vec![a, b, t], vec![n], body));
    for be in backends(true) {
        let k = be.compile(&f).unwrap();
        let mut a = vec![1.0f32; 1 << 17];
        let mut b = vec![0.0f32; 1 << 17];
        let err = run(k.as_ref(), &mut a, &mut b).unwrap_err();
        assert!(
            matches!(err, Error::Runtime(rivet_runtime::Error::Memory(_))),
            "{}: {err}",
            be.target()
        );
    }
}

/// Local sizes whose element or byte count leaves int64 (2^62 floats, 2^31 x 2^31 x 2^31)
/// are a memory error on both backends even when launched directly (no `call::allocate` size
/// check in front), never a wrapped small allocation.
#[test]
fn locals_near_2_pow_62_are_memory_errors_not_overflows() {
    for shape in [
        vec![Expr::int(1 << 62)],
        vec![Expr::int(1 << 31), Expr::int(1 << 31), Expr::int(1 << 31)],
        vec![Expr::int(i64::MAX), Expr::int(3)],
    ] {
        let n = Var::new("n");
        let i = Var::new("i");
        let a = input(0, "A", DType::F32, vec![Expr::var(&n)]);
        let b = output(1, "B", DType::F32, vec![Expr::var(&n)]);
        let t = buffer(2, "T", DType::F32, shape.clone(), BufKind::Local);
        let zeros = vec![Expr::int(0); shape.len()];
        let body = Stmt::For {
            var: i.clone(),
            min: Expr::int(0),
            extent: Expr::var(&n),
            kind: ForKind::Serial,
            body: Box::new(Stmt::Allocate {
                bufs: vec![t.id],
                body: Box::new(Stmt::Seq(vec![
                    Stmt::Store {
                        buf: t.id,
                        indices: zeros.clone(),
                        value: Expr::load(a.id, vec![Expr::var(&i)], DType::F32),
                    },
                    Stmt::Store {
                        buf: b.id,
                        indices: vec![Expr::var(&i)],
                        value: Expr::load(t.id, zeros.clone(), DType::F32),
                    },
                ])),
            }),
        };
        let f = split(func("huge_local", vec![a, b, t], vec![n], body));
        for be in backends(true) {
            let k = be.compile(&f).unwrap();
            let mut a = vec![1.0f32; 4];
            let mut b = vec![0.0f32; 4];
            let err = run(k.as_ref(), &mut a, &mut b).unwrap_err();
            assert!(
                matches!(err, Error::Runtime(rivet_runtime::Error::Memory(_))),
                "{}: {err}",
                be.target()
            );
        }
    }
}

/// `B = A + L` through `L` root locals `T_j = T_{j-1} + 1`, one top-level loop each, the
/// locals of every kind the CPU backend places differently (`stmt::allocate_root`), by
/// `j % 4`: constant `[64]` (stack slots until the frame's budget is spent, heap blocks
/// after), symbolic `[n]` (heap), symbolic `[n, 2]` (heap, strides in the local table),
/// `[1]` (a register once flattened). Local `huge`, when given, has `n * 2^59` elements.
fn root_locals(l: usize, huge: Option<usize>) -> PrimFunc {
    let n = Var::new("n");
    let nv = Expr::var(&n);
    let a = input(0, "A", DType::F32, vec![nv.clone()]);
    let b = output(1, "B", DType::F32, vec![nv.clone()]);
    let mut bufs = vec![a.clone(), b.clone()];
    let ix = |j: usize, i: &Expr| -> Vec<Expr> {
        match j % 4 {
            0 | 1 => vec![i.clone()],
            2 => vec![i.clone(), Expr::int(1)],
            _ => vec![Expr::int(0)],
        }
    };
    let mut stages = Vec::new();
    for j in 0..l {
        let shape = match (j % 4, huge == Some(j)) {
            (_, true) => vec![nv.mul(&Expr::int(1 << 59))],
            (0, _) => vec![Expr::int(64)],
            (1, _) => vec![nv.clone()],
            (2, _) => vec![nv.clone(), Expr::int(2)],
            _ => vec![Expr::int(1)],
        };
        let t = buffer(
            2 + j as u32,
            &format!("T{j}"),
            DType::F32,
            shape,
            BufKind::Local,
        );
        let prev = j.checked_sub(1).map(|p| (bufs[2 + p].id, p));
        let i = Var::new("i");
        let iv = Expr::var(&i);
        let read = match prev {
            Some((id, p)) => Expr::load(id, ix(p, &iv), DType::F32),
            None => Expr::load(a.id, vec![iv.clone()], DType::F32),
        };
        let one = Expr::constant(1.0, DType::F32);
        stages.push(Stmt::For {
            var: i,
            min: Expr::int(0),
            extent: nv.clone(),
            kind: ForKind::Serial,
            body: Box::new(Stmt::Store {
                buf: t.id,
                indices: ix(j, &iv),
                value: Expr::binary(crate::ir::BinOp::Add, read, one).unwrap(),
            }),
        });
        bufs.push(t);
    }
    let i = Var::new("i");
    let iv = Expr::var(&i);
    stages.push(Stmt::For {
        var: i,
        min: Expr::int(0),
        extent: nv.clone(),
        kind: ForKind::Serial,
        body: Box::new(Stmt::Store {
            buf: b.id,
            indices: vec![iv.clone()],
            value: Expr::load(bufs[1 + l].id, ix(l - 1, &iv), DType::F32),
        }),
    });
    let locals = bufs[2..].iter().map(|t| t.id).collect();
    let body = Stmt::allocate_all(locals, Stmt::Seq(stages));
    let mut f = func("root_locals", bufs, vec![n], body);
    crate::lower::flatten::flatten(&mut f);
    crate::ir::verify::verify(&f, true).unwrap();
    split(f)
}

#[test]
fn many_root_locals_of_every_kind_match_the_interpreter_and_a_failed_one_frees_the_rest() {
    let l = 301;
    let good = root_locals(l, None);
    let cpu = CraneliftBackend::new().unwrap().compile(&good).unwrap();
    let oracle = InterpBackend::new(false).compile(&good).unwrap();
    let a: Vec<f32> = (0..8).map(|k| k as f32 * 0.25 - 1.0).collect();
    let (mut want, mut got) = (vec![f32::NAN; 8], vec![f32::NAN; 8]);
    run(oracle.as_ref(), &mut a.clone(), &mut want).unwrap();
    run(cpu.as_ref(), &mut a.clone(), &mut got).unwrap();
    assert_eq!(got, want);
    assert!(want.iter().all(|v| v.is_finite()), "{want:?}");
    // A late local that cannot be allocated: a memory error from both, after the earlier
    // heap locals were allocated (and given back: the good kernel still runs).
    let bad = root_locals(l, Some(l - 4));
    for be in backends(false) {
        let k = be.compile(&bad).unwrap();
        let mut out = vec![0.0f32; 8];
        let err = run(k.as_ref(), &mut a.clone(), &mut out).unwrap_err();
        assert!(
            matches!(err, Error::Runtime(rivet_runtime::Error::Memory(_))),
            "{}: {err}",
            be.target()
        );
    }
    let mut again = vec![f32::NAN; 8];
    run(cpu.as_ref(), &mut a.clone(), &mut again).unwrap();
    assert_eq!(again, want);
}
