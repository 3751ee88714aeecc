//! GPU schedules with memory caches (`cache_read` / `cache_write`, `lower::sync`) run by the
//! interpreter's GPU semantics (`gpu.rs`), the oracle: the shared-memory tiled GEMM of the
//! kernel library on ragged sizes against a float64 reference, hand-made cache schedules, the
//! race the interpreter reports when the inserted barriers are taken out, and the schedules
//! that are refused with a `CompileError`.

use crate::codegen::CallFrame;
use crate::error::Result;
use crate::ir::expr::Expr;
use crate::ir::stmt::{ForKind, PrimFunc, Stmt, ThreadTag};
use crate::kernels::defs;
use crate::kernels::strategy::{schedule, Strategy};
use crate::lower::{lower, Options, Source};
use crate::schedule::Schedule;
use crate::target::Target;
use crate::te::{self, Tensor};
use rivet_runtime::DType;

/// xorshift64*: reproducible data without a dependency.
pub(crate) struct Rng(pub u64);
impl Rng {
    pub fn f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
        x * 2.0 - 1.0
    }
}

pub(crate) fn lowered(s: &Schedule, args: &[Tensor], name: &str) -> Result<PrimFunc> {
    Ok(lower(
        Source::Schedule {
            sched: s,
            args,
            name,
        },
        &Target::interp(),
        Options::default(),
    )?
    .func)
}

/// Runs `f` (dims `m, k, n`, compact `A[m, k] B[k, n] C[m, n]`) on fresh random data with a
/// poisoned output; returns (A, B, C).
pub(crate) fn run_mm(
    f: &PrimFunc,
    m: i64,
    k: i64,
    n: i64,
    seed: u64,
) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    let mut r = Rng(seed | 1);
    let mut a: Vec<f32> = (0..m * k).map(|_| r.f32()).collect();
    let mut b: Vec<f32> = (0..k * n).map(|_| r.f32()).collect();
    let mut c = vec![f32::NAN; (m * n) as usize];
    let frame = CallFrame {
        ptrs: vec![
            a.as_mut_ptr().cast(),
            b.as_mut_ptr().cast(),
            c.as_mut_ptr().cast(),
        ]
        .into(),
        ints: if f.dims.is_empty() {
            vec![k, 1, n, 1, n, 1].into()
        } else {
            vec![m, k, n, k, 1, n, 1, n, 1].into()
        },
    };
    // SAFETY: compact buffers of the shapes the dims give, strides in `ints`.
    unsafe { super::run(f, &frame) }?;
    Ok((a, b, c))
}

/// Every element of `c` against a float64 `a @ b` (f32 accumulation error bound).
pub(crate) fn check_mm(a: &[f32], b: &[f32], c: &[f32], m: i64, k: i64, n: i64) {
    let (m, k, n) = (m as usize, k as usize, n as usize);
    for i in 0..m {
        for j in 0..n {
            let mut want = 0.0f64;
            let mut mag = 0.0f64;
            for p in 0..k {
                let t = a[i * k + p] as f64 * b[p * n + j] as f64;
                want += t;
                mag += t.abs();
            }
            let got = c[i * n + j] as f64;
            let tol = 1e-5 * (k as f64 + 1.0) * (mag + 1e-3);
            assert!(
                (got - want).abs() <= tol,
                "C[{i}, {j}] = {got}, want {want} ({m}x{k}x{n})"
            );
        }
    }
}

fn library_matmul() -> PrimFunc {
    let d = defs::matmul(DType::F32).unwrap();
    let s = schedule(&d, Strategy::Gpu).unwrap();
    lowered(&s, &d.args, "matmul").unwrap()
}

fn count(s: &Stmt, what: fn(&Stmt) -> bool) -> usize {
    let mut n = 0;
    s.visit(&mut |x| n += what(x) as usize);
    n
}

/// The library's GPU matmul (64x64 tiles through shared memory, 4x4 per thread in
/// registers) gives `A @ B` on ragged sizes, including sizes below and just past one tile.
#[test]
fn shared_tiled_gemm_is_right_on_ragged_sizes() {
    let f = library_matmul();
    for (m, k, n) in [
        (1, 1, 1),
        (7, 7, 7),
        (56, 56, 56),
        (65, 17, 63),
        (7, 100, 1),
        (1, 33, 130),
        (128, 16, 64),
    ] {
        let (a, b, c) = run_mm(&f, m, k, n, (m * 1000 + k * 10 + n) as u64).unwrap();
        check_mm(&a, &b, &c, m, k, n);
    }
}

/// Larger ragged sizes of the brief: 1000 and 1023 (few, the interpreter is slow).
#[test]
fn shared_tiled_gemm_is_right_at_1000_and_1023() {
    let f = library_matmul();
    for (m, k, n) in [(1000, 20, 70), (70, 1023, 66), (1023, 3, 129)] {
        let (a, b, c) = run_mm(&f, m, k, n, 7).unwrap();
        check_mm(&a, &b, &c, m, k, n);
    }
}

/// The lowered GEMM kernel: shared tiles in the block body, a local accumulator, two barriers
/// in the reduction loop (after the loads; before the next iteration's loads), unrolled loops.
#[test]
fn shared_tiled_gemm_has_barriers_and_unrolled_loops() {
    let f = library_matmul();
    let gemm = f
        .kernels
        .iter()
        .find(|k| count(&k.body, |s| matches!(s, Stmt::Barrier)) > 0)
        .expect("a kernel with barriers");
    assert_eq!(count(&gemm.body, |s| matches!(s, Stmt::Barrier)), 2, "{f}");
    assert!(
        count(&gemm.body, |s| matches!(
            s,
            Stmt::For {
                kind: ForKind::Unrolled,
                ..
            }
        )) >= 3,
        "{f}"
    );
    let scopes: Vec<_> = f
        .buffers
        .iter()
        .map(|b| (b.name.clone(), b.scope, b.shape.clone()))
        .collect();
    let text = format!("{scopes:?}");
    assert!(text.contains("\"A.shared\", Shared, [64, 16]"), "{text}");
    assert!(text.contains("\"B.shared\", Shared, [16, 64]"), "{text}");
    assert!(text.contains("\"C.local\", Local, [4, 4]"), "{text}");
}

/// Without the barriers the pass inserted, the interpreter reports the race (so the test
/// above passing means the barriers are needed and sufficient, not that the serial
/// interpreter got lucky).
#[test]
fn without_its_barriers_the_gemm_is_a_race() {
    let mut f = library_matmul();
    for k in &mut f.kernels {
        k.body = k.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
            Stmt::Barrier => Stmt::Seq(vec![]),
            other => other,
        });
    }
    let Err(e) = run_mm(&f, 20, 40, 20, 3) else {
        panic!("no race reported")
    };
    let e = e.to_string();
    assert!(e.contains("data race") && e.contains(".shared"), "{e}");
    // Only the barrier before the next iteration's loads missing: a write-after-read race.
    let mut g = library_matmul();
    for k in &mut g.kernels {
        let mut seen = 0;
        k.body = k.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
            Stmt::Barrier => {
                seen += 1;
                // Bottom-up rewrite: the barrier before the loads comes first in the loop.
                if seen == 1 {
                    Stmt::Seq(vec![])
                } else {
                    Stmt::Barrier
                }
            }
            other => other,
        });
    }
    let Err(e) = run_mm(&g, 20, 40, 20, 3) else {
        panic!("no race reported")
    };
    let e = e.to_string();
    assert!(
        e.contains("data race") && e.contains("write after another access"),
        "{e}"
    );
}

fn mm_program(
    m: impl Into<Expr>,
    k: impl Into<Expr>,
    n: impl Into<Expr>,
) -> (Tensor, Tensor, Tensor) {
    let (m, k, n): (Expr, Expr, Expr) = (m.into(), k.into(), n.into());
    let a = te::placeholder([&m, &k], DType::F32, "A").unwrap();
    let b = te::placeholder([&k, &n], DType::F32, "B").unwrap();
    let r = te::reduce_axis(0, &k, "r").unwrap();
    let c = te::compute(
        [&m, &n],
        |[i, j]| te::sum(a.at((i, &r)) * b.at((&r, j)), &r),
        "C",
    )
    .unwrap();
    (a, b, c)
}

fn dims() -> (Expr, Expr, Expr) {
    (te::var("m"), te::var("k"), te::var("n"))
}

/// TVM's simplest shared-memory schedule, written by hand: one output per thread, 8x8
/// blocks, A and B tiles of 8 along k copied by the block's threads (one element each),
/// `cache_read` attached at the k-tile loop of the output stage itself.
pub(crate) fn one_output_per_thread_schedule() -> (Schedule, Vec<Tensor>) {
    let (m, k, n) = dims();
    let (a, b, c) = mm_program(m, k, n);
    let mut s = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let cl = s.cache_write(&c, "local").unwrap();
    let aa = s
        .cache_read(&a, "shared", std::slice::from_ref(&cl))
        .unwrap();
    let bb = s
        .cache_read(&b, "shared", std::slice::from_ref(&cl))
        .unwrap();
    let st = s.stage(&c).unwrap();
    let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
    let (by, bx, ty, tx) = st.tile(&i, &j, Expr::int(8), Expr::int(8)).unwrap();
    st.bind(&by, ThreadTag::BlockY).unwrap();
    st.bind(&bx, ThreadTag::BlockX).unwrap();
    st.bind(&ty, ThreadTag::ThreadY).unwrap();
    st.bind(&tx, ThreadTag::ThreadX).unwrap();
    s.compute_at(&cl, &c, &tx).unwrap();
    let r = cl.reduce_axis()[0].var.clone();
    let ls = s.stage(&cl).unwrap();
    let (ko, ki) = ls.split(&r, Some(Expr::int(8)), None).unwrap();
    let data: Vec<_> = cl.axis().iter().map(|a| a.var.clone()).collect();
    ls.reorder(&[ko.clone(), ki.clone(), data[0].clone(), data[1].clone()])
        .unwrap();
    ls.unroll(&ki).unwrap();
    for x in [&aa, &bb] {
        s.compute_at(x, &cl, &ko).unwrap();
        let xs = s.stage(x).unwrap();
        let v: Vec<_> = x.axis().iter().map(|a| a.var.clone()).collect();
        xs.bind(&v[0], ThreadTag::ThreadY).unwrap();
        xs.bind(&v[1], ThreadTag::ThreadX).unwrap();
    }
    (s, vec![a, b, c])
}

#[test]
fn hand_written_cache_read_schedule_one_output_per_thread() {
    let (s, args) = one_output_per_thread_schedule();
    let f = lowered(&s, &args, "mm").unwrap();
    for (mm, kk, nn) in [(1, 1, 1), (9, 17, 5), (16, 8, 24), (23, 30, 41)] {
        let (x, y, z) = run_mm(&f, mm, kk, nn, 11).unwrap();
        check_mm(&x, &y, &z, mm, kk, nn);
    }
}

/// A shared cache attached at the innermost block loop (the whole k extent of a constant
/// program in shared memory, loaded once per block by thread loops of its own), a thread
/// dimension it does not bind (only threadIdx.y == 0 loads), and a loop of the cache smaller
/// than the block (guarded).
pub(crate) fn partial_binding_schedule() -> (Schedule, Vec<Tensor>) {
    let (a, b, c) = mm_program(12, 10, 12);
    let mut s = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let aa = s
        .cache_read(&a, "shared", std::slice::from_ref(&c))
        .unwrap();
    let st = s.stage(&c).unwrap();
    let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
    let (by, bx, ty, tx) = st.tile(&i, &j, Expr::int(4), Expr::int(4)).unwrap();
    st.bind(&by, ThreadTag::BlockY).unwrap();
    st.bind(&bx, ThreadTag::BlockX).unwrap();
    st.bind(&ty, ThreadTag::ThreadY).unwrap();
    st.bind(&tx, ThreadTag::ThreadX).unwrap();
    s.compute_at(&aa, &c, &bx).unwrap();
    // Region 4 x 10: rows serial, k split 3 x 4 -> threadIdx.x of extent 4 (the block's 4).
    let xs = s.stage(&aa).unwrap();
    let v: Vec<_> = aa.axis().iter().map(|a| a.var.clone()).collect();
    let (_, kx) = xs.split(&v[1], Some(Expr::int(3)), None).unwrap();
    xs.bind(&kx, ThreadTag::ThreadX).unwrap();
    (s, vec![a, b, c])
}

#[test]
fn shared_cache_at_the_block_loop_with_partial_binding() {
    let (s, args) = partial_binding_schedule();
    let f = lowered(&s, &args, "mm").unwrap();
    let (x, y, z) = run_mm(&f, 12, 10, 12, 5).unwrap();
    check_mm(&x, &y, &z, 12, 10, 12);
}

/// `cache_read` into a per-thread local copy (no binding), at a reduction-tile loop.
pub(crate) fn local_cache_read_schedule() -> (Schedule, Vec<Tensor>) {
    let (m, k, n) = dims();
    let (a, b, c) = mm_program(m, k, n);
    let mut s = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let bl = s.cache_read(&b, "local", std::slice::from_ref(&c)).unwrap();
    let st = s.stage(&c).unwrap();
    let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
    let r = c.reduce_axis()[0].var.clone();
    let (bx, tx) = st.split(&j, Some(Expr::int(8)), None).unwrap();
    let (ko, ki) = st.split(&r, Some(Expr::int(4)), None).unwrap();
    st.reorder(&[bx.clone(), tx.clone(), i.clone(), ko.clone(), ki])
        .unwrap();
    st.bind(&bx, ThreadTag::BlockX).unwrap();
    st.bind(&tx, ThreadTag::ThreadX).unwrap();
    s.compute_at(&bl, &c, &ko).unwrap();
    (s, vec![a, b, c])
}

#[test]
fn local_cache_read_per_thread() {
    let (s, args) = local_cache_read_schedule();
    let f = lowered(&s, &args, "mm").unwrap();
    let text = f.to_string();
    assert!(!text.contains("barrier"), "{text}");
    for (mm, kk, nn) in [(3, 9, 17), (5, 4, 8)] {
        let (x, y, z) = run_mm(&f, mm, kk, nn, 9).unwrap();
        check_mm(&x, &y, &z, mm, kk, nn);
    }
}

fn refused(s: &Schedule, args: &[Tensor]) -> String {
    match lowered(s, args, "f") {
        Ok(f) => panic!("expected a CompileError, lowered:\n{f}"),
        Err(e) => {
            assert!(matches!(e, crate::error::Error::Compile(_)), "{e:?}");
            e.to_string()
        }
    }
}

/// Schedules of caches that cannot run: each a `CompileError` saying why, at the primitive
/// or when lowered.
#[test]
fn cache_misuse_is_a_compile_error() {
    let (m, k, n) = dims();
    let (a, b, c) = mm_program(&m, &k, &n);
    let args = [a.clone(), b.clone(), c.clone()];
    let mut s = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let e = s
        .cache_read(&a, "texture", std::slice::from_ref(&c))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("scope must be 'shared' or 'local', got 'texture'"),
        "{e}"
    );
    let e = s.cache_write(&c, "shared").unwrap_err().to_string();
    assert!(e.contains("scope must be 'local', got 'shared'"), "{e}");
    let e = s.cache_write(&a, "local").unwrap_err().to_string();
    assert!(e.contains("placeholder"), "{e}");
    let e = s.cache_read(&a, "shared", &[]).unwrap_err().to_string();
    assert!(e.contains("at least one"), "{e}");
    let e = s
        .cache_read(&a, "shared", std::slice::from_ref(&a))
        .unwrap_err()
        .to_string();
    assert!(e.contains("reader 'A' is not a stage"), "{e}");
    // A reader that does not read the tensor.
    let d = te::compute([&m], |[i]| a.at((i, 0)), "D").unwrap();
    let mut s2 = Schedule::new(&[c.clone(), d.clone()]).unwrap();
    let e = s2
        .cache_read(&b, "shared", std::slice::from_ref(&d))
        .unwrap_err()
        .to_string();
    assert!(e.contains("reader 'D' does not read 'B'"), "{e}");
    // cache_write after scheduling.
    let mut s3 = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let i = c.axis()[0].var.clone();
    s3.stage(&c)
        .unwrap()
        .split(&i, Some(Expr::int(4)), None)
        .unwrap();
    let e = s3.cache_write(&c, "local").unwrap_err().to_string();
    assert!(e.contains("before the stage is scheduled"), "{e}");
    // A cache left at root, or attached to a loop that is not in a kernel.
    let mut s4 = Schedule::new(std::slice::from_ref(&c)).unwrap();
    s4.cache_read(&a, "shared", std::slice::from_ref(&c))
        .unwrap();
    let e = refused(&s4, &args);
    assert!(
        e.contains("must be compute_at inside a loop of a stage bound to a GPU"),
        "{e}"
    );
    let mut s5 = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let aa = s5
        .cache_read(&a, "shared", std::slice::from_ref(&c))
        .unwrap();
    s5.compute_at(&aa, &c, &i).unwrap();
    let e = refused(&s5, &args);
    assert!(e.contains("which is not inside a kernel"), "{e}");
    // A shared cache whose region depends on the thread (bound the wrong way round) cannot
    // exist: here it is attached at a block loop above the innermost one.
    let mut s6 = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let aa = s6
        .cache_read(&a, "shared", std::slice::from_ref(&c))
        .unwrap();
    let j = c.axis()[1].var.clone();
    let st = s6.stage(&c).unwrap();
    let (by, bx, ty, tx) = st.tile(&i, &j, Expr::int(8), Expr::int(8)).unwrap();
    st.bind(&by, ThreadTag::BlockY).unwrap();
    st.bind(&bx, ThreadTag::BlockX).unwrap();
    st.bind(&ty, ThreadTag::ThreadY).unwrap();
    st.bind(&tx, ThreadTag::ThreadX).unwrap();
    s6.compute_at(&aa, &c, &by).unwrap();
    let e = refused(&s6, &args);
    assert!(e.contains("above its innermost block loop"), "{e}");
    // The whole k extent (symbolic) in shared memory: not a constant shape.
    let mut s7 = s6.clone();
    s7.compute_at(&aa, &c, &bx).unwrap();
    let e = refused(&s7, &args);
    assert!(e.contains("not a constant"), "{e}");
    // Loops of a shared cache bound to a block index, or to a thread dimension the block does
    // not have, or wider than the block.
    for (tag, split, want) in [
        (ThreadTag::BlockZ, None, "blocks are already bound"),
        (ThreadTag::ThreadZ, None, "has no threadIdx.z loop"),
        (
            ThreadTag::ThreadX,
            Some(10),
            "must be a constant from 1 to the block's 4 threads",
        ),
    ] {
        let (a, b, c) = mm_program(12, 10, 12);
        let mut s = Schedule::new(std::slice::from_ref(&c)).unwrap();
        let aa = s
            .cache_read(&a, "shared", std::slice::from_ref(&c))
            .unwrap();
        let st = s.stage(&c).unwrap();
        let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
        let (by, bx, ty, tx) = st.tile(&i, &j, Expr::int(4), Expr::int(4)).unwrap();
        st.bind(&by, ThreadTag::BlockY).unwrap();
        st.bind(&bx, ThreadTag::BlockX).unwrap();
        st.bind(&ty, ThreadTag::ThreadY).unwrap();
        st.bind(&tx, ThreadTag::ThreadX).unwrap();
        s.compute_at(&aa, &c, &bx).unwrap();
        let v: Vec<_> = aa.axis().iter().map(|a| a.var.clone()).collect();
        let xs = s.stage(&aa).unwrap();
        let target = match split {
            Some(f) => xs.split(&v[1], None, Some(Expr::int(f))).unwrap().1,
            None => v[1].clone(),
        };
        let target = if split.is_some() {
            xs.leaves[1].var.clone()
        } else {
            target
        };
        xs.bind(&target, tag).unwrap();
        let e = refused(&s, &[a, b, c]);
        assert!(e.contains(want), "{e}");
    }
    // A global (non-cache) stage computed inside a kernel stays refused.
    let p = te::compute([&m, &k], |[i, j]| a.at([&i, &j]) * a.at([i, j]), "P").unwrap();
    let r2 = te::reduce_axis(0, &k, "r2").unwrap();
    let q = te::compute(
        [&m, &n],
        |[i, j]| te::sum(p.at((i, &r2)) * b.at((&r2, j)), &r2),
        "Q",
    )
    .unwrap();
    let mut s10 = Schedule::new(std::slice::from_ref(&q)).unwrap();
    let (qi, qj) = (q.axis()[0].var.clone(), q.axis()[1].var.clone());
    let st = s10.stage(&q).unwrap();
    let (bx, tx) = st.split(&qi, Some(Expr::int(8)), None).unwrap();
    st.bind(&bx, ThreadTag::BlockX).unwrap();
    st.bind(&tx, ThreadTag::ThreadX).unwrap();
    s10.compute_at(&p, &q, &qj).unwrap();
    let e = refused(&s10, &[a.clone(), b.clone(), q.clone()]);
    assert!(
        e.contains("needs a buffer in shared or local memory"),
        "{e}"
    );
}

/// `gpu_gemm` on a product of a tensor with itself (`A @ A`): the tensor read twice stays in
/// global memory (a shared tile of both regions has no constant shape), the result is right.
#[test]
fn gpu_gemm_recipe_on_a_square_of_one_tensor() {
    let n = te::var("n");
    let a = te::placeholder([&n, &n], DType::F32, "A").unwrap();
    let r = te::reduce_axis(0, &n, "r").unwrap();
    let c = te::compute(
        [&n, &n],
        |[i, j]| te::sum(a.at((i, &r)) * a.at((&r, j)), &r),
        "C",
    )
    .unwrap();
    let mut s = Schedule::new(std::slice::from_ref(&c)).unwrap();
    crate::schedule::gpu_default::gpu_gemm(&mut s, &c).unwrap();
    let f = lowered(&s, &[a, c], "sq").unwrap();
    assert!(!f
        .buffers
        .iter()
        .any(|b| b.scope == crate::ir::stmt::Scope::Shared));
    let m = 70i64;
    let mut r = Rng(5);
    let mut x: Vec<f32> = (0..m * m).map(|_| r.f32()).collect();
    let mut y = vec![f32::NAN; (m * m) as usize];
    let frame = CallFrame {
        ptrs: vec![x.as_mut_ptr().cast(), y.as_mut_ptr().cast()].into(),
        ints: vec![m, m, 1, m, 1].into(),
    };
    // SAFETY: compact m x m buffers, strides in `ints`.
    unsafe { super::run(&f, &frame) }.unwrap();
    check_mm(&x, &x, &y, m, m, m);
}
