//! The interpreter's GPU semantics (`gpu.rs`) on hand-written kernels in the shapes GPU
//! schedules produce: a 1-D grid with a ragged edge, a shared-memory exchange that needs its
//! barrier, a shared-memory tiled matmul with per-thread accumulators, and a block tree
//! reduction; and the races and divergence it must report instead of computing a result.

use super::{run_unflattened, CallFrame};
use crate::error::Result;
use crate::ir::expr::{BinOp, CmpOp, Expr, Var};
use crate::ir::stmt::{BufKind, Buffer, ForKind, PrimFunc, Scope, Stmt, ThreadTag};
use crate::ir::test_util::{buffer, func, input, output};
use rivet_runtime::DType;

const F: DType = DType::F32;

fn int(v: i64) -> Expr {
    Expr::int(v)
}
fn v(x: &Var) -> Expr {
    Expr::var(x)
}
fn bound(x: &Var, extent: Expr, tag: ThreadTag, body: Stmt) -> Stmt {
    Stmt::For {
        var: x.clone(),
        min: int(0),
        extent,
        kind: ForKind::Thread(tag),
        body: Box::new(body),
    }
}
fn serial(x: &Var, extent: Expr, body: Stmt) -> Stmt {
    Stmt::For {
        var: x.clone(),
        min: int(0),
        extent,
        kind: ForKind::Serial,
        body: Box::new(body),
    }
}
fn ld(b: &Buffer, idx: Vec<Expr>) -> Expr {
    Expr::load(b.id, idx, b.dtype)
}
fn st(b: &Buffer, idx: Vec<Expr>, value: Expr) -> Stmt {
    Stmt::Store {
        buf: b.id,
        indices: idx,
        value,
    }
}
fn lt(a: Expr, b: Expr) -> Expr {
    Expr::cmp(CmpOp::Lt, a, b).unwrap()
}
fn if_(c: Expr, then: Stmt) -> Stmt {
    Stmt::If {
        cond: c,
        then: Box::new(then),
        otherwise: None,
    }
}
fn alloc(b: &Buffer, body: Stmt) -> Stmt {
    Stmt::Allocate {
        bufs: vec![b.id],
        body: Box::new(body),
    }
}
fn local(id: u32, name: &str, shape: &[i64], scope: Scope) -> Buffer {
    let mut b = buffer(
        id,
        name,
        F,
        shape.iter().map(|&n| int(n)).collect(),
        BufKind::Local,
    );
    b.scope = scope;
    b
}
fn fadd(a: Expr, b: Expr) -> Expr {
    Expr::binary(BinOp::Add, a, b).unwrap()
}
fn fmul(a: Expr, b: Expr) -> Expr {
    Expr::binary(BinOp::Mul, a, b).unwrap()
}
fn ceil_div(n: Expr, k: i64) -> Expr {
    n.add(&int(k - 1)).floordiv(&int(k))
}

/// Runs unflattened `f` on compact f32 arrays (shapes given per parameter; dims first).
fn run(f: &PrimFunc, dims: &[i64], arrays: &mut [(&mut Vec<f32>, Vec<i64>)]) -> Result<()> {
    let mut ints = dims.to_vec();
    let mut ptrs = Vec::new();
    for (a, shape) in arrays.iter_mut() {
        let mut stride = 1;
        let mut strides = vec![0; shape.len()];
        for k in (0..shape.len()).rev() {
            strides[k] = stride;
            stride *= shape[k];
        }
        ints.extend(strides);
        ptrs.push(a.as_mut_ptr().cast());
    }
    // SAFETY: every array is compact and as large as its shape says.
    unsafe {
        run_unflattened(
            f,
            &CallFrame {
                ptrs: ptrs.into(),
                ints: ints.into(),
            },
        )
    }
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 250.0 - 2.0
        })
        .collect()
}

/// `C[i] = A[i] * 2` over a 1-D grid of 64-thread blocks, `n` not a multiple of 64.
#[test]
fn one_dimensional_grid_with_a_ragged_edge() {
    let (n, bx, tx) = (Var::new("n"), Var::new("bx"), Var::new("tx"));
    let a = input(0, "A", F, vec![v(&n)]);
    let c = output(1, "C", F, vec![v(&n)]);
    let i = v(&bx).mul(&int(64)).add(&v(&tx));
    let body = bound(
        &bx,
        ceil_div(v(&n), 64),
        ThreadTag::BlockX,
        bound(
            &tx,
            int(64),
            ThreadTag::ThreadX,
            if_(
                lt(i.clone(), v(&n)),
                st(
                    &c,
                    vec![i.clone()],
                    fmul(ld(&a, vec![i]), Expr::constant(2.0, F)),
                ),
            ),
        ),
    );
    let f = func("double", vec![a, c], vec![n], body);
    for len in [1usize, 7, 64, 1000] {
        let mut av = data(len, 1);
        let mut cv = vec![f32::NAN; len];
        run(
            &f,
            &[len as i64],
            &mut [(&mut av, vec![len as i64]), (&mut cv, vec![len as i64])],
        )
        .unwrap();
        assert!(cv.iter().zip(&av).all(|(c, a)| *c == a * 2.0), "n = {len}");
    }
}

/// Each block reverses its 64 elements through shared memory: correct with the barrier, a
/// reported race without it.
fn reverse(with_barrier: bool) -> PrimFunc {
    let (bx, tx) = (Var::new("bx"), Var::new("tx"));
    let a = input(0, "A", F, vec![int(256)]);
    let c = output(1, "C", F, vec![int(256)]);
    let s = local(2, "S", &[64], Scope::Shared);
    let g = v(&bx).mul(&int(64)).add(&v(&tx));
    let mut steps = vec![bound(
        &tx,
        int(64),
        ThreadTag::ThreadX,
        st(&s, vec![v(&tx)], ld(&a, vec![g.clone()])),
    )];
    if with_barrier {
        steps.push(Stmt::Barrier);
    }
    steps.push(bound(
        &tx,
        int(64),
        ThreadTag::ThreadX,
        st(&c, vec![g], ld(&s, vec![int(63).sub(&v(&tx))])),
    ));
    let body = bound(&bx, int(4), ThreadTag::BlockX, alloc(&s, Stmt::Seq(steps)));
    func("reverse", vec![a, c, s], vec![], body)
}

#[test]
fn shared_memory_exchange_needs_its_barrier() {
    let mut av = data(256, 2);
    let mut cv = vec![f32::NAN; 256];
    run(
        &reverse(true),
        &[],
        &mut [(&mut av, vec![256]), (&mut cv, vec![256])],
    )
    .unwrap();
    for b in 0..4 {
        for t in 0..64 {
            assert_eq!(cv[b * 64 + t], av[b * 64 + 63 - t]);
        }
    }
    let e = run(
        &reverse(false),
        &[],
        &mut [(&mut av, vec![256]), (&mut cv, vec![256])],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("data race") && e.contains("`S`"), "{e}");
}

/// `C = A @ B` for ragged M x K x N with 8 x 8 tiles staged in shared memory, a per-thread
/// accumulator in local memory, and two barriers per k-tile (`ir::test_util::tiled_matmul`,
/// which the CUDA backend's tests generate too).
#[test]
fn tiled_matmul_through_shared_memory() {
    let f = crate::ir::test_util::tiled_matmul();
    crate::ir::verify::verify(&f, false).unwrap();
    for (mm, kk, nn) in [(1usize, 1usize, 1usize), (37, 45, 29), (8, 16, 8)] {
        let mut av = data(mm * kk, 3);
        let mut bv = data(kk * nn, 4);
        let mut cv = vec![f32::NAN; mm * nn];
        run(
            &f,
            &[mm as i64, kk as i64, nn as i64],
            &mut [
                (&mut av, vec![mm as i64, kk as i64]),
                (&mut bv, vec![kk as i64, nn as i64]),
                (&mut cv, vec![mm as i64, nn as i64]),
            ],
        )
        .unwrap();
        for i in 0..mm {
            for j in 0..nn {
                // The same order of f32 additions as the kernel: tiles of 8, zero padding.
                let mut want = 0f32;
                for p in 0..kk.div_ceil(8) * 8 {
                    let x = if p < kk {
                        av[i * kk + p] * bv[p * nn + j]
                    } else {
                        0.0
                    };
                    want += x;
                }
                assert_eq!(cv[i * nn + j], want, "C[{i}, {j}] of {mm}x{kk}x{nn}");
            }
        }
    }
}

/// Row sums of a [rows, 256] matrix by 128 threads: a tree in shared memory, one barrier per
/// level, the `if tx < stride` branches holding no barrier.
#[test]
fn block_tree_reduction() {
    let (r, tx) = (Var::new("r"), Var::new("tx"));
    let x = input(0, "X", F, vec![int(5), int(256)]);
    let y = output(1, "Y", F, vec![int(5)]);
    let s = local(2, "S", &[128], Scope::Shared);
    let mut steps = vec![
        st(
            &s,
            vec![v(&tx)],
            fadd(
                ld(&x, vec![v(&r), v(&tx)]),
                ld(&x, vec![v(&r), v(&tx).add(&int(128))]),
            ),
        ),
        Stmt::Barrier,
    ];
    for stride in [64, 32, 16, 8, 4, 2, 1] {
        steps.push(if_(
            lt(v(&tx), int(stride)),
            st(
                &s,
                vec![v(&tx)],
                fadd(ld(&s, vec![v(&tx)]), ld(&s, vec![v(&tx).add(&int(stride))])),
            ),
        ));
        steps.push(Stmt::Barrier);
    }
    steps.push(if_(
        lt(v(&tx), int(1)),
        st(&y, vec![v(&r)], ld(&s, vec![int(0)])),
    ));
    let body = bound(
        &r,
        int(5),
        ThreadTag::BlockX,
        alloc(
            &s,
            bound(&tx, int(128), ThreadTag::ThreadX, Stmt::Seq(steps)),
        ),
    );
    let f = func("rowsum", vec![x, y, s], vec![], body);
    let mut xv = data(5 * 256, 5);
    let mut yv = vec![f32::NAN; 5];
    run(&f, &[], &mut [(&mut xv, vec![5, 256]), (&mut yv, vec![5])]).unwrap();
    for row in 0..5 {
        let mut t: Vec<f32> = (0..128)
            .map(|i| xv[row * 256 + i] + xv[row * 256 + i + 128])
            .collect();
        let mut stride = 64;
        while stride >= 1 {
            for i in 0..stride {
                t[i] += t[i + stride];
            }
            stride /= 2;
        }
        assert_eq!(yv[row], t[0], "row {row}");
    }
}

#[test]
fn blocks_writing_one_element_race() {
    let (bx, tx) = (Var::new("bx"), Var::new("tx"));
    let a = input(0, "A", F, vec![int(2)]);
    let c = output(1, "C", F, vec![int(1)]);
    let body = bound(
        &bx,
        int(2),
        ThreadTag::BlockX,
        bound(
            &tx,
            int(1),
            ThreadTag::ThreadX,
            st(&c, vec![int(0)], ld(&a, vec![v(&bx)])),
        ),
    );
    let f = func("race", vec![a, c], vec![], body);
    let (mut av, mut cv) = (vec![1.0, 2.0], vec![0.0]);
    let e = run(&f, &[], &mut [(&mut av, vec![2]), (&mut cv, vec![1])])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data race") && e.contains("block 0 and block 1"),
        "{e}"
    );
}

/// A store in the block body outside any thread loop is run by every thread of the block.
#[test]
fn block_body_statements_run_on_every_thread() {
    let (bx, tx) = (Var::new("bx"), Var::new("tx"));
    let c = output(0, "C", F, vec![int(4)]);
    let body = bound(
        &bx,
        int(1),
        ThreadTag::BlockX,
        Stmt::Seq(vec![
            bound(
                &tx,
                int(4),
                ThreadTag::ThreadX,
                st(&c, vec![v(&tx)], Expr::constant(1.0, F)),
            ),
            st(&c, vec![int(0)], Expr::constant(2.0, F)),
        ]),
    );
    let f = func("redundant", vec![c], vec![], body);
    let mut cv = vec![0.0; 4];
    let e = run(&f, &[], &mut [(&mut cv, vec![4])])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data race") && e.contains("threads 0 and 1"),
        "{e}"
    );
}

/// Each thread's local buffer is its own: 32 threads accumulate into `acc[0]` at once.
#[test]
fn local_buffers_are_private_to_each_thread() {
    let (tx, j) = (Var::new("tx"), Var::new("j"));
    let a = input(0, "A", F, vec![int(32), int(10)]);
    let c = output(1, "C", F, vec![int(32)]);
    let acc = local(2, "acc", &[1], Scope::Local);
    let body = bound(
        &tx,
        int(32),
        ThreadTag::ThreadX,
        alloc(
            &acc,
            Stmt::Seq(vec![
                serial(
                    &j,
                    int(10),
                    st(
                        &acc,
                        vec![int(0)],
                        fadd(ld(&acc, vec![int(0)]), ld(&a, vec![v(&tx), v(&j)])),
                    ),
                ),
                st(&c, vec![v(&tx)], ld(&acc, vec![int(0)])),
            ]),
        ),
    );
    let f = func("rows", vec![a, c, acc], vec![], body);
    let mut av = data(320, 6);
    let mut cv = vec![f32::NAN; 32];
    run(&f, &[], &mut [(&mut av, vec![32, 10]), (&mut cv, vec![32])]).unwrap();
    for t in 0..32 {
        let want = av[t * 10..t * 10 + 10].iter().fold(0f32, |s, x| s + x);
        assert_eq!(cv[t], want);
    }
}

/// The CPU backend refuses GPU-scheduled functions with a CompileError that says where they
/// can run; the interpreter runs them.
#[test]
fn the_cpu_backend_refuses_gpu_functions() {
    use crate::codegen::Backend;
    let f = reverse(true);
    let e = crate::codegen::cranelift::CraneliftBackend::new()
        .unwrap()
        .compile(&f)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("target 'cpu' cannot run it") && e.contains("'cuda'"),
        "{e}"
    );
    assert!(super::InterpBackend::new(true).compile(&f).is_ok());
}
