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
    crate::lower::split::split(&mut f);
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
            buf: t.id,
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
/// are a memory error on both backends even when launched directly (no `build::call` size
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
                buf: t.id,
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
