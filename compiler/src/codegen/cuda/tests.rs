//! Tests of the CUDA backend that need no GPU: golden sources of the canonical hand-written
//! GPU kernels (the shapes of `codegen/interp/tests_gpu.rs`), NVRTC compiling every kernel
//! to PTX and cubin for sm_80 and sm_90 with an empty log, a program per dtype using every
//! expression kind, the prelude's helpers compared bit for bit with the interpreter (compiled
//! by the host's C++ compiler), whole kernels run on the host under a CUDA emulation and
//! compared with the interpreter, and the behaviour without NVRTC or a driver.
//!
//! NVRTC: found as the backend finds it, else in the workspace's `.venv` (the torch wheel);
//! when it is nowhere, the NVRTC tests print why and pass, unless `RIVET_REQUIRE_NVRTC=1`,
//! where they fail with the reason (CI sets it). Goldens live in the workspace's `tests/golden/` (`*.cu`);
//! `RIVET_BLESS=1` rewrites them.

use super::nvrtc::{self, Nvrtc};
use super::prelude::PRELUDE;
use super::{CudaBackend, CudaKernel};
use crate::codegen::{Backend, CallFrame, Kernel, LaunchContext};
use crate::ir::expr::{BinOp, CmpOp, Expr, LogicOp, UnOp, Var};
use crate::ir::stmt::{BufKind, Buffer, ForKind, PrimFunc, Scope, Stmt, ThreadTag};
use crate::ir::test_util::{buffer, func, input, output};
use crate::target::{CudaArch, Target};
use rivet_runtime::{DType, Device};
use std::path::PathBuf;
use std::sync::Arc;

const F: DType = DType::F32;

// ---- builders (the shapes of interp/tests_gpu.rs) --------------------------------------------

pub(super) fn int(v: i64) -> Expr {
    Expr::int(v)
}
pub(super) fn v(x: &Var) -> Expr {
    Expr::var(x)
}
pub(super) fn bound(x: &Var, extent: Expr, tag: ThreadTag, body: Stmt) -> Stmt {
    Stmt::For {
        var: x.clone(),
        min: int(0),
        extent,
        kind: ForKind::Thread(tag),
        body: Box::new(body),
    }
}
pub(super) fn looped(x: &Var, extent: Expr, kind: ForKind, body: Stmt) -> Stmt {
    Stmt::For {
        var: x.clone(),
        min: int(0),
        extent,
        kind,
        body: Box::new(body),
    }
}
pub(super) fn ld(b: &Buffer, idx: Vec<Expr>) -> Expr {
    Expr::load(b.id, idx, b.dtype)
}
pub(super) fn st(b: &Buffer, idx: Vec<Expr>, value: Expr) -> Stmt {
    Stmt::Store {
        buf: b.id,
        indices: idx,
        value,
    }
}
pub(super) fn lt(a: Expr, b: Expr) -> Expr {
    Expr::cmp(CmpOp::Lt, a, b).unwrap()
}
pub(super) fn if_(c: Expr, then: Stmt) -> Stmt {
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
fn local(id: u32, name: &str, dtype: DType, shape: &[i64], scope: Scope) -> Buffer {
    let mut b = buffer(
        id,
        name,
        dtype,
        shape.iter().map(|&n| int(n)).collect(),
        BufKind::Local,
    );
    b.scope = scope;
    b
}
pub(super) fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    Expr::binary(op, a, b).unwrap()
}
pub(super) fn ceil_div(n: Expr, k: i64) -> Expr {
    n.add(&int(k - 1)).floordiv(&int(k))
}

/// Flattens, simplifies and splits a hand-written function as `lower::lower` does.
pub(super) fn prepare(mut f: PrimFunc) -> PrimFunc {
    crate::ir::verify::verify(&f, false).unwrap();
    crate::lower::flatten::flatten(&mut f);
    f.body = crate::arith::simplify::simplify_stmt(&f.body);
    crate::lower::outline::outline(&mut f);
    crate::ir::verify::verify(&f, true).unwrap();
    f
}

/// `C[i] = A[i] * 2` over a 1-D grid of 64-thread blocks, `n` not a multiple of 64.
pub(super) fn double() -> PrimFunc {
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
                    bin(BinOp::Mul, ld(&a, vec![i]), Expr::constant(2.0, F)),
                ),
            ),
        ),
    );
    prepare(func("double", vec![a, c], vec![n], body))
}

/// Each block reverses its 64 elements through shared memory, with a barrier.
pub(super) fn reverse() -> PrimFunc {
    let (bx, tx) = (Var::new("bx"), Var::new("tx"));
    let a = input(0, "A", F, vec![int(256)]);
    let c = output(1, "C", F, vec![int(256)]);
    let s = local(2, "S", F, &[64], Scope::Shared);
    let g = v(&bx).mul(&int(64)).add(&v(&tx));
    let steps = vec![
        bound(
            &tx,
            int(64),
            ThreadTag::ThreadX,
            st(&s, vec![v(&tx)], ld(&a, vec![g.clone()])),
        ),
        Stmt::Barrier,
        bound(
            &tx,
            int(64),
            ThreadTag::ThreadX,
            st(&c, vec![g], ld(&s, vec![int(63).sub(&v(&tx))])),
        ),
    ];
    let body = bound(&bx, int(4), ThreadTag::BlockX, alloc(&s, Stmt::Seq(steps)));
    prepare(func("reverse", vec![a, c, s], vec![], body))
}

/// `C = A @ B` for ragged M x K x N with 8 x 8 tiles in shared memory, a local accumulator
/// (`ir::test_util::tiled_matmul`, which the interpreter's GPU tests run too).
pub(super) fn tiled_matmul() -> PrimFunc {
    prepare(crate::ir::test_util::tiled_matmul())
}

/// Row sums of a [5, 256] matrix by 128 threads: a tree in shared memory.
pub(super) fn block_tree_reduction() -> PrimFunc {
    let (r, tx) = (Var::new("r"), Var::new("tx"));
    let x = input(0, "X", F, vec![int(5), int(256)]);
    let y = output(1, "Y", F, vec![int(5)]);
    let s = local(2, "S", F, &[128], Scope::Shared);
    let mut steps = vec![
        st(
            &s,
            vec![v(&tx)],
            bin(
                BinOp::Add,
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
                bin(
                    BinOp::Add,
                    ld(&s, vec![v(&tx)]),
                    ld(&s, vec![v(&tx).add(&int(stride))]),
                ),
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
    prepare(func("rowsum", vec![x, y, s], vec![], body))
}

/// Every statement kind in one kernel: a float16 shared buffer behind a barrier, an int32
/// local buffer, an unrolled loop with a non-zero min, a `let`, an if/else, a vectorized loop.
pub(super) fn statements() -> PrimFunc {
    let (bx, tx, j, t, w) = (
        Var::new("bx"),
        Var::new("tx"),
        Var::new("j"),
        Var::new("t"),
        Var::new("w"),
    );
    let a = input(0, "A", F, vec![int(64)]);
    let c = output(1, "C", F, vec![int(64)]);
    let d = output(2, "D", DType::I32, vec![int(64), int(4)]);
    let s = local(3, "S", DType::F16, &[32], Scope::Shared);
    let l = local(4, "L", DType::I32, &[4], Scope::Local);
    let g = v(&bx).mul(&int(32)).add(&v(&tx));
    let fill = looped(
        &j,
        int(4),
        ForKind::Unrolled,
        st(
            &l,
            vec![v(&j).sub(&int(3))],
            bin(
                BinOp::Mul,
                Expr::cast(DType::I32, v(&j)),
                Expr::cast(DType::I32, ld(&a, vec![g.clone()])),
            ),
        ),
    );
    let fill = match fill {
        Stmt::For {
            var,
            extent,
            kind,
            body,
            ..
        } => Stmt::For {
            var,
            min: int(3),
            extent,
            kind,
            body,
        },
        other => other,
    };
    let choose = Stmt::Let {
        var: t.clone(),
        value: v(&tx).mul(&int(2)),
        body: Box::new(Stmt::If {
            cond: lt(v(&t), int(40)),
            then: Box::new(st(
                &c,
                vec![g.clone()],
                bin(
                    BinOp::Add,
                    Expr::cast(F, ld(&s, vec![int(31).sub(&v(&tx))])),
                    Expr::cast(F, ld(&l, vec![int(1)])),
                ),
            )),
            otherwise: Some(Box::new(st(
                &c,
                vec![g.clone()],
                Expr::unary(UnOp::Neg, Expr::cast(F, ld(&s, vec![v(&tx)]))).unwrap(),
            ))),
        }),
    };
    let spill = looped(
        &w,
        int(4),
        ForKind::Vectorized,
        st(&d, vec![g.clone(), v(&w)], ld(&l, vec![v(&w)])),
    );
    let body = bound(
        &bx,
        int(2),
        ThreadTag::BlockX,
        alloc(
            &s,
            Stmt::Seq(vec![
                bound(
                    &tx,
                    int(32),
                    ThreadTag::ThreadX,
                    st(
                        &s,
                        vec![v(&tx)],
                        Expr::cast(DType::F16, ld(&a, vec![g.clone()])),
                    ),
                ),
                Stmt::Barrier,
                bound(
                    &tx,
                    int(32),
                    ThreadTag::ThreadX,
                    alloc(&l, Stmt::Seq(vec![fill, choose, spill])),
                ),
            ]),
        ),
    );
    prepare(func("statements", vec![a, c, d, s, l], vec![], body))
}

/// The library's GPU matmul as the schedule makes it (`schedule::gpu_default::gpu_gemm`: 64x64
/// tiles of 16x16 threads, 4x4 outputs per thread in a local cache, A and B staged through
/// shared memory, barriers from `lower::sync`), lowered for CUDA.
pub(super) fn gemm_shared_tiled() -> PrimFunc {
    use crate::kernels::strategy::{schedule, Strategy};
    let d = crate::kernels::defs::matmul(F).unwrap();
    let s = schedule(&d, Strategy::Gpu).unwrap();
    crate::lower::lower(
        crate::lower::Source::Schedule {
            sched: &s,
            args: &d.args,
            name: "gemm",
        },
        &Target::cuda(Some(SM80)),
        crate::lower::Options::default(),
    )
    .unwrap()
    .func
}

/// The canonical kernels, by golden name.
pub(super) fn canonical() -> Vec<(&'static str, PrimFunc)> {
    vec![
        ("double_1d_ragged", double()),
        ("reverse_shared_barrier", reverse()),
        ("tiled_matmul_shared_local", tiled_matmul()),
        ("block_tree_reduction", block_tree_reduction()),
        ("every_statement_kind", statements()),
        ("gemm_shared_tiled", gemm_shared_tiled()),
    ]
}

// ---- a program per dtype using every expression kind ----------------------------------------

const ALL: [DType; 13] = [
    DType::Bool,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
];

/// Interesting constants of `dt` (special values included).
fn constants(dt: DType) -> Vec<Expr> {
    if dt.is_float() {
        [
            0.5,
            -0.0,
            3.0,
            f64::NAN,
            f64::INFINITY,
            -1e30,
            1e-40,
            65520.0,
        ]
        .iter()
        .map(|&x| Expr::constant(x, dt))
        .collect()
    } else if dt == DType::Bool {
        vec![Expr::bool(true), Expr::bool(false)]
    } else {
        [0i64, 1, -1, 7, i64::MIN, i64::MAX, 255, -129]
            .iter()
            .map(|&x| Expr::const_int(x, dt))
            .collect()
    }
}

/// One kernel over `n` elements of inputs `A`, `B` of `dt`: `R[i, k]` (dtype `dt`) holds the
/// k-th operation of every kind valid for `dt` on `A[i]`, `B[i]` and constants; `K<d>[i, k]`
/// holds the k-th cast to dtype `d` (A, B, and constants).
pub(super) fn every_op(dt: DType) -> (PrimFunc, usize, usize) {
    let (n, bx, tx) = (Var::new("n"), Var::new("bx"), Var::new("tx"));
    let a = input(0, "A", dt, vec![v(&n)]);
    let b = input(1, "B", dt, vec![v(&n)]);
    let i = v(&bx).mul(&int(32)).add(&v(&tx));
    let (x, y) = (ld(&a, vec![i.clone()]), ld(&b, vec![i.clone()]));
    let mut vals: Vec<Expr> = vec![x.clone(), y.clone()];
    let is_bool = dt == DType::Bool;
    if !is_bool {
        for op in [
            BinOp::Add,
            BinOp::Sub,
            BinOp::Mul,
            BinOp::FloorDiv,
            BinOp::FloorMod,
            BinOp::Min,
            BinOp::Max,
        ] {
            vals.push(bin(op, x.clone(), y.clone()));
        }
        vals.push(Expr::unary(UnOp::Neg, x.clone()).unwrap());
        vals.push(Expr::unary(UnOp::Abs, x.clone()).unwrap());
        for c in constants(dt) {
            vals.push(bin(BinOp::Add, x.clone(), c.clone()));
            vals.push(bin(BinOp::FloorDiv, x.clone(), c.clone()));
            vals.push(bin(BinOp::Mul, c.clone(), y.clone()));
            vals.push(c);
        }
    }
    if dt.is_float() {
        vals.push(bin(BinOp::Div, x.clone(), y.clone()));
        vals.push(bin(BinOp::Pow, x.clone(), y.clone()));
        for op in [
            UnOp::Exp,
            UnOp::Log,
            UnOp::Sqrt,
            UnOp::Rsqrt,
            UnOp::Tanh,
            UnOp::Sigmoid,
            UnOp::Floor,
            UnOp::Ceil,
            UnOp::Erf,
        ] {
            vals.push(Expr::unary(op, x.clone()).unwrap());
        }
        // Fused multiply-adds (one rounding: `fmaf` / `fma`, the interpreter's `mul_add`).
        vals.push(Expr::fma(x.clone(), y.clone(), x.clone()).unwrap());
        for c in constants(dt) {
            vals.push(Expr::fma(x.clone(), c, y.clone()).unwrap());
        }
    }
    // Comparisons, logic and selects (bool results are selected back into `dt`).
    let mut bools = Vec::new();
    for op in [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ] {
        bools.push(Expr::cmp(op, x.clone(), y.clone()).unwrap());
    }
    bools.push(Expr::logic(LogicOp::And, bools[0].clone(), bools[2].clone()).unwrap());
    bools.push(Expr::logic(LogicOp::Or, bools[1].clone(), bools[5].clone()).unwrap());
    bools.push(Expr::unary(UnOp::Not, bools[3].clone()).unwrap());
    for c in bools {
        vals.push(Expr::select(c, x.clone(), y.clone()).unwrap());
    }
    // Casts to every dtype, and back.
    let mut casts: Vec<(DType, Vec<Expr>)> = Vec::new();
    for to in ALL {
        let mut es = vec![Expr::cast(to, x.clone()), Expr::cast(to, y.clone())];
        for c in constants(dt) {
            es.push(Expr::cast(to, c));
        }
        vals.push(Expr::cast(dt, Expr::cast(to, x.clone())));
        casts.push((to, es));
    }
    // Negated constants and sigmoid of them (last: `libm_columns` counts the columns above).
    // `-(-1.0)` once printed as `--1.0f`, C's decrement operator (found by compiler_props).
    if !is_bool {
        for c in constants(dt) {
            vals.push(Expr::unary(UnOp::Neg, c.clone()).unwrap());
        }
    }
    if dt.is_float() {
        for c in constants(dt) {
            vals.push(Expr::unary(UnOp::Sigmoid, c).unwrap());
        }
    }
    let nv = vals.len();
    let nc = casts[0].1.len();
    let r = output(2, "R", dt, vec![v(&n), int(nv as i64)]);
    let mut bufs = vec![a, b, r.clone()];
    let mut stores = Vec::new();
    for (k, e) in vals.into_iter().enumerate() {
        stores.push(st(&r, vec![i.clone(), int(k as i64)], e));
    }
    for (j, (to, es)) in casts.into_iter().enumerate() {
        let kb = output(
            3 + j as u32,
            &format!("K{to}"),
            to,
            vec![v(&n), int(nc as i64)],
        );
        for (k, e) in es.into_iter().enumerate() {
            stores.push(st(&kb, vec![i.clone(), int(k as i64)], e));
        }
        bufs.push(kb);
    }
    let body = bound(
        &bx,
        ceil_div(v(&n), 32),
        ThreadTag::BlockX,
        bound(
            &tx,
            int(32),
            ThreadTag::ThreadX,
            if_(lt(i.clone(), v(&n)), Stmt::Seq(stores)),
        ),
    );
    let f = prepare(func(&format!("every_op_{dt}"), bufs, vec![n], body));
    (f, nv, nc)
}

// ---- NVRTC for the tests ------------------------------------------------------------------

/// NVRTC as the backend finds it, else from the workspace's `.venv`; `None` (with the reason
/// printed) when absent, a panic when `RIVET_REQUIRE_NVRTC=1`.
fn test_nvrtc() -> Option<Arc<Nvrtc>> {
    let mut why = match nvrtc::find() {
        Ok(n) => return Some(n),
        Err(e) => e,
    };
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/lib");
    if let Ok(rd) = std::fs::read_dir(&venv) {
        for e in rd.flatten() {
            let p = e
                .path()
                .join("site-packages/nvidia/cu13/lib/libnvrtc.so.13");
            if p.is_file() {
                match nvrtc::load(&p) {
                    Ok(n) => return Some(n),
                    Err(e) => why = format!("{why}; {}: {e}", p.display()),
                }
            }
        }
    }
    if std::env::var("RIVET_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
        panic!("RIVET_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: {why}");
    }
    eprintln!("NVRTC not found, CUDA compile checks skipped: {why}");
    None
}

fn backend(nv: &Nvrtc, arch: Option<CudaArch>) -> CudaBackend {
    let mut b = CudaBackend::new(Target::cuda(arch), false);
    b.nvrtc_path = Some(nv.path.clone());
    b
}

const SM80: CudaArch = CudaArch { major: 8, minor: 0 };
const SM90: CudaArch = CudaArch { major: 9, minor: 0 };

/// Compiles `f` for sm_80 and sm_90 (PTX and cubin), asserting an empty NVRTC log.
fn compiles_cleanly(nv: &Nvrtc, f: &PrimFunc) -> CudaKernel {
    let mut first = None;
    for arch in [SM80, SM90] {
        let k = backend(nv, Some(arch))
            .compile_cuda(f)
            .unwrap_or_else(|e| panic!("{} for {arch}: {e}", f.name));
        assert!(
            k.nvrtc_log().is_empty(),
            "{} for {arch}: NVRTC warned:\n{}",
            f.name,
            k.nvrtc_log()
        );
        let ptx = k.ptx().expect("PTX");
        assert!(
            ptx.contains(&format!(".target sm_{}{}", arch.major, arch.minor)),
            "{ptx}"
        );
        for info in k.kernels() {
            // Both index widths where both exist: NVRTC compiled every entry point.
            assert!(!info.entries().is_empty());
            for e in info.entries() {
                assert!(ptx.contains(&format!(".entry {e}(")), "{ptx}");
            }
        }
        let (a, cubin) = k.cubin().expect("cubin");
        assert_eq!(a, arch);
        assert!(cubin.starts_with(b"\x7fELF"), "a cubin is an ELF file");
        first.get_or_insert(k);
    }
    first.unwrap()
}

// ---- goldens ------------------------------------------------------------------------------

// The golden check shared with the cross-crate tests (rivet-tests cannot be a dependency of
// this crate: it depends on it).
#[path = "../../../../tests/src/golden.rs"]
mod golden_file;

/// The generated source with the prelude replaced by a marker (it has its own tests).
fn golden_text(src: &str) -> String {
    src.replace(PRELUDE, "// <the rivet prelude: codegen/cuda/prelude.rs>\n")
}

/// The workspace's one golden check (`tests/golden/<name>.cu`; `RIVET_BLESS=1` rewrites).
fn golden(name: &str, text: &str) {
    golden_file::check_golden(&format!("{name}.cu"), text);
}

#[test]
fn cuda_golden_sources_of_canonical_kernels() {
    for (name, f) in canonical() {
        let g = super::source::generate(&f, "target sm_80").unwrap();
        golden(name, &golden_text(&g.source));
    }
}

#[test]
fn cuda_canonical_kernels_compile_for_sm80_and_sm90_without_warnings() {
    let Some(nv) = test_nvrtc() else { return };
    for (_, f) in canonical() {
        compiles_cleanly(&nv, &f);
    }
}

#[test]
fn cuda_launch_shapes_of_canonical_kernels() {
    let shapes: Vec<_> = canonical()
        .into_iter()
        .map(|(_, f)| {
            let g = super::source::generate(&f, "").unwrap();
            assert_eq!(g.kernels.len(), 1);
            let k = &g.kernels[0];
            (
                k.block,
                k.grid.iter().map(|e| e.is_some()).collect::<Vec<_>>(),
                k.shared_bytes,
            )
        })
        .collect();
    assert_eq!(
        shapes,
        vec![
            ([64, 1, 1], vec![true, false, false], 0),
            ([64, 1, 1], vec![true, false, false], 256),
            ([8, 8, 1], vec![true, true, false], 512),
            ([128, 1, 1], vec![true, false, false], 512),
            ([32, 1, 1], vec![true, false, false], 64),
            // 64x16 + 16x64 floats of shared tiles.
            ([16, 16, 1], vec![true, true, false], 8192),
        ]
    );
}

#[test]
fn cuda_every_dtype_and_expression_kind_compiles() {
    let nv = test_nvrtc();
    for dt in ALL {
        let (f, _, _) = every_op(dt);
        let src = super::source::generate(&f, "").unwrap().source;
        assert!(src.contains("extern \"C\" __global__"), "{src}");
        if let Some(nv) = &nv {
            compiles_cleanly(nv, &f);
        }
    }
}

/// The deepest expression the DSL builds (`e = e + 1` applied `MAX_EXPR_DEPTH` times, and
/// an index chain as deep) compiles: NVRTC takes the nesting.
#[test]
fn cuda_deep_expressions_compile() {
    // As `build` does: the passes recurse on expression depth, on a large stack.
    std::thread::Builder::new()
        .stack_size(crate::ir::limits::COMPILE_STACK)
        .spawn(deep_expressions)
        .unwrap()
        .join()
        .unwrap();
}

fn deep_expressions() {
    let (n, bx) = (Var::new("n"), Var::new("bx"));
    let a = input(0, "A", F, vec![v(&n)]);
    let c = output(1, "C", F, vec![v(&n)]);
    let mut e = ld(&a, vec![v(&bx)]);
    for k in 0..crate::ir::limits::MAX_EXPR_DEPTH as i64 - 2 {
        e = bin(BinOp::Add, e, Expr::constant((k % 7) as f64, F));
    }
    let body = bound(&bx, v(&n), ThreadTag::BlockX, st(&c, vec![v(&bx)], e));
    let f = prepare(func("deep", vec![a, c], vec![n], body));
    let src = super::source::generate(&f, "").unwrap().source;
    assert!(src.len() > 10_000);
    if let Some(nv) = test_nvrtc() {
        let k = backend(&nv, Some(SM80)).compile_cuda(&f).unwrap();
        assert!(k.nvrtc_log().is_empty(), "{}", k.nvrtc_log());
    }
}

#[test]
fn cuda_source_keeps_names_and_uses_restrict_only_on_read_only_inputs() {
    let f = tiled_matmul();
    let src = super::source::generate(&f, "").unwrap().source;
    for want in [
        "const float* __restrict__ A",
        "const float* __restrict__ B",
        "float* C",
        "long long m",
        "long long A_s0",
        "__shared__ float As[64];",
        "float acc[1] = {};",
        "__syncthreads();",
        "#pragma unroll",
        "(long long)blockIdx.y",
        // Thread indices fit int32 at any call: `int` even in the 64-bit kernel.
        "const int tx = (int)threadIdx.x;",
        // The 32-bit kernel.
        "int m,",
        "const int by = (int)blockIdx.y;",
        "__launch_bounds__(64)",
    ] {
        assert!(src.contains(want), "missing `{want}` in:\n{src}");
    }
    assert!(!src.contains("float* __restrict__ C"), "{src}");
}

#[test]
fn cuda_sanitized_names_are_c_identifiers_and_unique() {
    use super::source::sanitize;
    assert_eq!(sanitize("A.s0"), "A_s0");
    assert_eq!(sanitize("i.outer"), "i_outer");
    assert_eq!(sanitize("0x"), "v_0x");
    assert_eq!(sanitize("_x"), "v_x");
    assert_eq!(sanitize("rivet_min"), "vrivet_min");
    assert_eq!(sanitize("int"), "int_");
    assert_eq!(sanitize("threadIdx"), "threadIdx_");
    assert_eq!(sanitize("δ"), "v_");
    // Two variables with one name get distinct C names.
    let (n, i1, i2, bx) = (Var::new("n"), Var::new("i"), Var::new("i"), Var::new("bx"));
    let c = output(0, "C", F, vec![int(4), int(4)]);
    let body = bound(
        &bx,
        int(1),
        ThreadTag::BlockX,
        looped(
            &i1,
            int(4),
            ForKind::Serial,
            looped(
                &i2,
                int(4),
                ForKind::Serial,
                st(&c, vec![v(&i1), v(&i2)], Expr::cast(F, v(&i1).add(&v(&i2)))),
            ),
        ),
    );
    let _ = n;
    let f = prepare(func("two_i", vec![c], vec![], body));
    let src = super::source::generate(&f, "").unwrap().source;
    assert!(
        src.contains("for (int i = 0; i < 4; ++i)")
            && src.contains("for (int i_1 = 0; i_1 < 4; ++i_1)"),
        "{src}"
    );
}

// ---- host part and errors -----------------------------------------------------------------

#[test]
fn cuda_host_parts_it_cannot_run_yet_are_compile_errors() {
    // A CPU parallel loop on the host.
    let (n, i) = (Var::new("n"), Var::new("i"));
    let c = output(0, "C", F, vec![v(&n)]);
    let par = looped(
        &i,
        v(&n),
        ForKind::Parallel,
        st(&c, vec![v(&i)], Expr::constant(1.0, F)),
    );
    let f = prepare(func("par", vec![c.clone()], vec![n.clone()], par));
    let e = CudaBackend::new(Target::cuda(None), false)
        .compile(&f)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("has no GPU kernel") && e.contains("default GPU schedule"),
        "{e}"
    );
    let compile_err = |f: &PrimFunc| {
        CudaBackend::new(Target::cuda(None), false)
            .compile(f)
            .err()
            .expect("refused")
            .to_string()
    };
    let kernel = |c: &Buffer| {
        let bx = Var::new("bx");
        bound(
            &bx,
            int(4),
            ThreadTag::BlockX,
            st(c, vec![v(&bx)], Expr::constant(2.0, F)),
        )
    };
    // A CPU parallel loop next to a kernel.
    let i2 = Var::new("i");
    let par = looped(
        &i2,
        v(&n),
        ForKind::Parallel,
        st(&c, vec![v(&i2)], Expr::constant(1.0, F)),
    );
    let f = prepare(func(
        "par_and_kernel",
        vec![c.clone()],
        vec![n.clone()],
        Stmt::Seq(vec![par, kernel(&c)]),
    ));
    let e = compile_err(&f);
    assert!(
        e.contains("a CPU parallel loop on the host") && e.contains("not available yet"),
        "{e}"
    );
    // A host loop around a kernel.
    let (o, bx) = (Var::new("o"), Var::new("bx"));
    let k = bound(
        &bx,
        v(&n),
        ThreadTag::BlockX,
        st(&c, vec![v(&bx)], Expr::cast(F, v(&o))),
    );
    let f = prepare(func(
        "host_loop",
        vec![c.clone()],
        vec![n.clone()],
        looped(&o, int(2), ForKind::Serial, k),
    ));
    let e = CudaBackend::new(Target::cuda(None), false)
        .compile(&f)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("host loop over 'o'"), "{e}");
    // A store on the host.
    let f = prepare(func(
        "host_store",
        vec![c.clone()],
        vec![n.clone()],
        Stmt::Seq(vec![
            kernel(&c),
            st(&c, vec![int(0)], Expr::constant(1.0, F)),
        ]),
    ));
    let e = CudaBackend::new(Target::cuda(None), false)
        .compile(&f)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("a store to 'C' on the host"), "{e}");
    // Checked mode.
    let e = CudaBackend::new(Target::cuda(None), true)
        .compile(&double())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("checked mode"), "{e}");
}

#[test]
fn cuda_shared_memory_over_the_limit_is_a_compile_error() {
    let (bx, tx) = (Var::new("bx"), Var::new("tx"));
    let c = output(0, "C", F, vec![int(32)]);
    let s = local(1, "Big", F, &[16, 1024], Scope::Shared);
    let body = bound(
        &bx,
        int(1),
        ThreadTag::BlockX,
        alloc(
            &s,
            bound(
                &tx,
                int(32),
                ThreadTag::ThreadX,
                Stmt::Seq(vec![
                    st(&s, vec![int(0), v(&tx)], Expr::constant(1.0, F)),
                    st(&c, vec![v(&tx)], ld(&s, vec![int(0), v(&tx)])),
                ]),
            ),
        ),
    );
    let f = prepare(func("big", vec![c, s], vec![], body));
    let e = CudaBackend::new(Target::cuda(None), false)
        .compile(&f)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("uses 65536 bytes of shared memory") && e.contains("49152"),
        "{e}"
    );
}

#[test]
fn cuda_missing_nvrtc_is_a_clear_compile_error() {
    let missing = PathBuf::from("/nonexistent/rivet/libnvrtc.so.13");
    let e =
        nvrtc::find_with(&|k| (k == "RIVET_NVRTC_PATH").then(|| missing.clone().into_os_string()))
            .unwrap_err();
    assert!(
        e.contains("RIVET_NVRTC_PATH=/nonexistent/rivet/libnvrtc.so.13 does not exist"),
        "{e}"
    );
    let mut b = CudaBackend::new(Target::cuda(None), false);
    b.nvrtc_path = Some(missing);
    let e = b.compile(&double()).err().expect("refused").to_string();
    assert!(
        e.contains("target 'cuda'")
            && e.contains("NVRTC not found")
            && e.contains("does not exist"),
        "{e}"
    );
    // A folder without the library.
    let dir = std::env::temp_dir();
    let e = nvrtc::find_with(&|k| (k == "RIVET_NVRTC_PATH").then(|| dir.clone().into_os_string()))
        .unwrap_err();
    assert!(e.contains("is a folder holding none of"), "{e}");
    // A file that is not a library.
    let bogus = std::env::temp_dir().join(format!("rivet-not-nvrtc-{}.so", std::process::id()));
    std::fs::write(&bogus, b"not a library").unwrap();
    let e =
        nvrtc::find_with(&|k| (k == "RIVET_NVRTC_PATH").then(|| bogus.clone().into_os_string()))
            .unwrap_err();
    let _ = std::fs::remove_file(&bogus);
    assert!(
        e.contains("could not be loaded") && e.contains("tried"),
        "{e}"
    );
}

#[test]
fn cuda_nvrtc_errors_quote_the_log_and_the_line() {
    let Some(nv) = test_nvrtc() else { return };
    let src = "extern \"C\" __global__ void k(float* x) {\n  x[0] = undefined_name;\n}\n";
    let e = super::compile_with(&nv, src, "bad.cu", SM80, nvrtc::Kind::Ptx, false)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("NVRTC")
            && e.contains("undefined_name")
            && e.contains("line 2: x[0] = undefined_name;"),
        "{e}"
    );
    // NVRTC rejects -O3: rivet passes no optimisation flag.
    let opts = nvrtc::options(SM90, nvrtc::Kind::Cubin, false);
    assert!(opts.iter().all(|o| !o.starts_with("-O")), "{opts:?}");
    let r = nv.compile(src, "o3.cu", &["-O3".to_string()], nvrtc::Kind::Ptx);
    assert!(r.is_err(), "NVRTC accepted -O3");
}

#[test]
fn cuda_launch_without_a_driver_or_device_is_a_device_error() {
    // Without NVRTC in the backend the kernel still exists (source only).
    let nv = test_nvrtc();
    let k: Box<dyn Kernel> = match &nv {
        Some(nv) => Box::new(backend(nv, None).compile_cuda(&double()).unwrap()),
        None => Box::new(
            CudaBackend::new(Target::cuda(None), false)
                .compile_cuda(&double())
                .unwrap(),
        ),
    };
    assert!(k.source().contains("extern \"C\" __global__"));
    let mut a = vec![1.0f32; 4];
    let mut c = vec![0.0f32; 4];
    let frame = CallFrame {
        ptrs: vec![a.as_mut_ptr().cast(), c.as_mut_ptr().cast()].into(),
        ints: vec![4, 1, 1].into(),
    };
    // CPU tensors: refused before touching the driver.
    // SAFETY: the kernel refuses before reading the frame's memory.
    let e = unsafe { k.launch(&frame, &LaunchContext::host()) }
        .unwrap_err()
        .to_string();
    assert!(e.contains("called with tensors on cpu"), "{e}");
    let ctx = LaunchContext {
        device: Device::Cuda(0),
        stream: None,
        work: 4,
    };
    let e = k
        .alloc_output(&[4], F, &LaunchContext::host())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("called with tensors on cpu"), "{e}");
    if super::driver::driver_present() {
        eprintln!("a CUDA driver is present: the no-driver launch check does not apply here");
        return;
    }
    // An output on the device needs the driver: the error names what is missing.
    let e = k.alloc_output(&[4], F, &ctx).err().unwrap().to_string();
    assert!(
        e.contains("libcuda.so.1") && e.contains("cannot be loaded"),
        "{e}"
    );
    let e = super::driver::device_count().unwrap_err().to_string();
    assert!(e.contains("libcuda"), "{e}");
    // SAFETY: with no driver the launch fails before any memory is touched.
    let e = unsafe { k.launch(&frame, &ctx) }.unwrap_err();
    assert!(
        matches!(e, crate::Error::Runtime(rivet_runtime::Error::Device(_))),
        "{e:?}"
    );
    assert!(e.to_string().contains("libcuda"), "{e}");
}

#[test]
fn cuda_backend_is_what_target_cuda_gives() {
    let b = crate::codegen::backend(&Target::cuda(Some(SM90)), false).unwrap();
    assert_eq!(b.target().to_string(), "cuda -arch=sm_90");
}

// ---- the generated kernels run on the host, under a CUDA emulation ---------------------------
//
// The generated source is compiled by the host's C++ compiler (`c++`) with `__global__`,
// `__shared__`, `__syncthreads` and the index registers emulated (one OS thread per CUDA
// thread of a block, a pthread barrier for `__syncthreads`, blocks one after another), and
// its results are compared with the interpreter's on the same inputs. This checks the
// generated code's meaning (wrapping, casts, float16 rounding, NaN rules, indexing, barriers)
// without a GPU; it does not check CUDA's math library (the host's libm stands in for it, so
// transcendental results are compared within 4 ulps) nor anything about the device itself.

const HARNESS_HEAD: &str = r#"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <thread>
#include <vector>
#define __global__
#define __shared__ static
#define __launch_bounds__(n)
#define __restrict__ __restrict
struct rivet_dim3 { unsigned x, y, z; };
static thread_local rivet_dim3 threadIdx, blockIdx;
static pthread_barrier_t rivet_bar;
#define __syncthreads() pthread_barrier_wait(&rivet_bar)
/* Warps: the block's threads in linear order (x fastest), 32 per warp, the last one partial.
   A shuffle is an exchange through one slot per thread between two barriers of the warp; it
   checks that the mask names exactly the warp's threads, and a lane the mask leaves out
   (absent: undefined on a GPU) reads as 0xA5 bytes. */
#define RIVET_WARP_EMULATION 1
static pthread_barrier_t rivet_warp_bar[32];
static unsigned rivet_warp_size[32];
static unsigned long long rivet_warp_slot[1024];
static thread_local unsigned rivet_tid;
template <typename T> static T rivet_warp_exchange(unsigned mask, T v, int src) {
  const unsigned w = rivet_tid / 32, n = rivet_warp_size[w];
  const unsigned full = n >= 32 ? 0xffffffffu : ((1u << n) - 1u);
  if (mask != full) {
    fprintf(stderr, "shuffle mask %#x, the warp's threads are %#x\n", mask, full);
    exit(3);
  }
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  rivet_warp_slot[rivet_tid] = bits;
  pthread_barrier_wait(&rivet_warp_bar[w]);
  T r;
  if (src >= 0 && src < 32 && ((mask >> src) & 1u)) memcpy(&r, &rivet_warp_slot[w * 32 + src], sizeof(T));
  else memset(&r, 0xA5, sizeof(T));
  pthread_barrier_wait(&rivet_warp_bar[w]);
  return r;
}
template <typename T> static T __shfl_down_sync(unsigned mask, T v, int d) {
  const int lane = (int)(rivet_tid & 31);
  return rivet_warp_exchange(mask, v, lane + d < 32 ? lane + d : lane);
}
template <typename T> static T __shfl_sync(unsigned mask, T v, int l) {
  return rivet_warp_exchange(mask, v, l);
}
template <typename F>
static void rivet_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, F body) {
  const unsigned n = bx * by * bz;
  pthread_barrier_init(&rivet_bar, 0, n);
  for (unsigned w = 0; w * 32 < n; ++w) {
    rivet_warp_size[w] = n - w * 32 < 32 ? n - w * 32 : 32;
    pthread_barrier_init(&rivet_warp_bar[w], 0, rivet_warp_size[w]);
  }
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        std::vector<std::thread> ts;
        for (unsigned tz = 0; tz < bz; ++tz)
          for (unsigned ty = 0; ty < by; ++ty)
            for (unsigned tx = 0; tx < bx; ++tx)
              ts.emplace_back([=] {
                blockIdx = rivet_dim3{x, y, z};
                threadIdx = rivet_dim3{tx, ty, tz};
                rivet_tid = tx + bx * (ty + by * tz);
                body();
              });
        for (auto& t : ts) t.join();
      }
  for (unsigned w = 0; w * 32 < n; ++w) pthread_barrier_destroy(&rivet_warp_bar[w]);
  pthread_barrier_destroy(&rivet_bar);
}
static unsigned char* rivet_read(FILE* f, size_t n) {
  unsigned char* p = (unsigned char*)malloc(n ? n : 1);
  if (n && fread(p, 1, n, f) != n) { fprintf(stderr, "short input\n"); exit(2); }
  return p;
}
"#;

/// One function run on both sides: its parameters' initial bytes and the frame's ints.
#[derive(Clone)]
pub(super) struct HostCase {
    func: PrimFunc,
    bufs: Vec<Vec<u8>>,
    ints: Vec<i64>,
    /// Per parameter, per element: compare within `ulps` instead of exactly.
    loose: Vec<Vec<bool>>,
    /// Every float element of every parameter within `ulps` (libm results inside).
    all_loose: bool,
    ulps: u64,
    /// Run the 64-bit kernels even where the host plan would pick the 32-bit ones.
    force64: bool,
}

fn lcg(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 11
}

/// `n` random elements of `dt` as bytes: ints random bits (small ones often), floats mostly
/// ordinary values in [-10, 10] with specials mixed in.
fn random_bytes(dt: DType, n: usize, seed: &mut u64, role: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dt.size());
    for k in 0..n {
        let r = lcg(seed);
        let special = [
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            -f64::INFINITY,
            1e10,
            -3e9,
            0.5,
            2.5,
            65519.0,
            1e-6,
        ];
        let x = if k % 5 == 4 {
            special[(r % special.len() as u64) as usize]
        } else {
            (r % 2001) as f64 / 100.0 - 10.0
        };
        match dt {
            DType::F32 => out.extend((x as f32).to_le_bytes()),
            DType::F64 => out.extend((x + (r % 7) as f64 * 1e-9).to_le_bytes()),
            DType::F16 => out.extend(half::f16::from_f32(x as f32).to_bits().to_le_bytes()),
            DType::BF16 => out.extend(half::bf16::from_f64(x).to_bits().to_le_bytes()),
            DType::Bool => out.push((r % 2) as u8),
            _ => {
                // Every 7th element an edge: MIN, MAX, -1, 0, 1 of the dtype's width; the
                // first parameter cycles through them 5 times faster than the second, so
                // every pair meets (MIN // -1 included) within 175 elements.
                let w = dt.size() as u32 * 8;
                let min = if w == 64 {
                    i64::MIN
                } else {
                    -(1i64 << (w - 1))
                };
                let edges = [min, !min, -1, 0, 1];
                let bits = if k % 7 == 6 {
                    edges[(k / 7 / 5usize.pow(role as u32)) % 5]
                } else if k % 3 == 0 {
                    r as i64 % 20 - 10
                } else {
                    (r << 11 | r >> 40) as i64
                };
                out.extend(&bits.to_le_bytes()[..dt.size()]);
            }
        }
    }
    out
}

fn elem_bits(b: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    v[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(v)
}

/// Whether two elements of `dt` agree: same bits, both NaN, or (loose) within 4 ulps.
fn same(dt: DType, a: &[u8], b: &[u8], loose: bool, ulps: u64) -> bool {
    if a == b {
        return true;
    }
    let (x, y) = (elem_bits(a), elem_bits(b));
    type Pred = fn(u64) -> bool;
    type Ord = fn(u64) -> i64;
    let (nan, ord): (Pred, Ord) = match dt {
        DType::F32 => (
            |x| f32::from_bits(x as u32).is_nan(),
            |x| {
                let i = x as u32 as i32 as i64;
                if i < 0 {
                    i32::MIN as i64 - i
                } else {
                    i
                }
            },
        ),
        DType::F64 => (
            |x| f64::from_bits(x).is_nan(),
            |x| {
                let i = x as i64;
                if i < 0 {
                    i64::MIN.wrapping_sub(i)
                } else {
                    i
                }
            },
        ),
        DType::F16 => (
            |x| half::f16::from_bits(x as u16).is_nan(),
            |x| {
                let i = x as u16 as i16 as i64;
                if i < 0 {
                    i16::MIN as i64 - i
                } else {
                    i
                }
            },
        ),
        DType::BF16 => (
            |x| half::bf16::from_bits(x as u16).is_nan(),
            |x| {
                let i = x as u16 as i16 as i64;
                if i < 0 {
                    i16::MIN as i64 - i
                } else {
                    i
                }
            },
        ),
        _ => return false,
    };
    (nan(x) && nan(y)) || (loose && (ord(x).wrapping_sub(ord(y))).unsigned_abs() <= ulps)
}

/// Compiles every case's kernels into one host program, runs each case there and in the
/// interpreter, and compares every parameter buffer. `false` when there is no `c++`.
pub(super) fn run_on_host(cases: &[HostCase]) -> bool {
    if std::process::Command::new("c++")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("no host C++ compiler (c++): host emulation of the generated kernels skipped");
        return false;
    }
    let dir = std::env::temp_dir().join(format!(
        "rivet-cuda-host-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = String::from(HARNESS_HEAD);
    src.push_str(PRELUDE);
    let mut mains = String::new();
    for (ci, c) in cases.iter().enumerate() {
        let f = &c.func;
        let g = super::source::generate(f, "host emulation").unwrap();
        // Each case's kernels in a namespace of their own (two cases may share names).
        let body = g.source.split(PRELUDE).nth(1).unwrap();
        src.push_str(&format!(
            "namespace case{ci} {{\n{}\n}}\n",
            body.replace("extern \"C\" ", "")
        ));
        let mut m = format!("static void case_{ci}(FILE* in, FILE* out) {{\n");
        for (p, b) in c.bufs.iter().enumerate() {
            m.push_str(&format!(
                "  unsigned char* b{p} = rivet_read(in, {});\n",
                b.len()
            ));
        }
        let slots = crate::codegen::int_slots(f);
        let mut env: std::collections::HashMap<u32, i64> = slots
            .iter()
            .map(|v| v.id)
            .zip(c.ints.iter().copied())
            .collect();
        host_calls(f, &g.kernels, &f.body, &mut env, &mut m, ci, c.force64);
        for (p, b) in c.bufs.iter().enumerate() {
            m.push_str(&format!("  fwrite(b{p}, 1, {}, out);\n", b.len()));
        }
        m.push_str("}\n");
        mains.push_str(&m);
    }
    src.push_str(&mains);
    src.push_str("int main(int argc, char** argv) {\n  int c = atoi(argv[1]);\n  FILE* in = fopen(argv[2], \"rb\");\n  FILE* out = fopen(argv[3], \"wb\");\n  switch (c) {\n");
    for ci in 0..cases.len() {
        src.push_str(&format!("    case {ci}: case_{ci}(in, out); break;\n"));
    }
    src.push_str("  }\n  fclose(out);\n  return 0;\n}\n");
    let cpp = dir.join("harness.cpp");
    let exe = dir.join("harness");
    std::fs::write(&cpp, &src).unwrap();
    let o = std::process::Command::new("c++")
        .args([
            "-std=c++17",
            "-O1",
            "-pthread",
            "-ffp-contract=off",
            "-fno-fast-math",
            "-w",
            "-o",
        ])
        .arg(&exe)
        .arg(&cpp)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the host C++ compiler refused the generated source ({}):\n{}",
        cpp.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    for (ci, c) in cases.iter().enumerate() {
        let f = &c.func;
        // The interpreter's result.
        let mut mine: Vec<Vec<u8>> = c.bufs.clone();
        let frame = CallFrame {
            ptrs: mine.iter_mut().map(|b| b.as_mut_ptr()).collect(),
            ints: c.ints.clone().into(),
        };
        // SAFETY: compact buffers sized for their shapes, strides in `ints`.
        unsafe { crate::codegen::interp::run(f, &frame) }.unwrap();
        // The emulated kernel's.
        let input = dir.join(format!("in{ci}.bin"));
        let output = dir.join(format!("out{ci}.bin"));
        std::fs::write(&input, c.bufs.concat()).unwrap();
        let o = std::process::Command::new(&exe)
            .arg(ci.to_string())
            .arg(&input)
            .arg(&output)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{}: the emulated kernel failed ({}): {}",
            f.name,
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        let got = std::fs::read(&output).unwrap();
        let mut at = 0;
        for (p, want) in mine.iter().enumerate() {
            let b = f.buffer(f.params[p]);
            let sz = b.dtype.size();
            let theirs = &got[at..at + want.len()];
            at += want.len();
            let mut bad = Vec::new();
            for (e, (x, y)) in want.chunks(sz).zip(theirs.chunks(sz)).enumerate() {
                let loose = c.all_loose || c.loose[p].get(e).copied().unwrap_or(false);
                if !same(b.dtype, x, y, loose, c.ulps) {
                    bad.push(format!(
                        "element {e}: interpreter {:#x}, generated code {:#x}",
                        elem_bits(x),
                        elem_bits(y)
                    ));
                }
            }
            assert!(
                bad.is_empty(),
                "{}: buffer {} ({}) differs in {} elements, first: {:?}",
                f.name,
                b.name,
                b.dtype,
                bad.len(),
                &bad[..bad.len().min(8)]
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    true
}

fn eval_int(e: &Expr, env: &std::collections::HashMap<u32, i64>) -> i64 {
    match crate::codegen::interp::eval_expr(e, &|v| env.get(&v.id).copied()).unwrap() {
        crate::codegen::interp::Value::Int(n) => n,
        other => panic!("{other:?}"),
    }
}

/// The harness's C++ for the host part `s`: temporaries (`t<id>`, zeroed), launches.
fn host_calls(
    f: &PrimFunc,
    infos: &[super::KernelInfo],
    s: &Stmt,
    env: &mut std::collections::HashMap<u32, i64>,
    m: &mut String,
    ci: usize,
    force64: bool,
) {
    match s {
        Stmt::Seq(v) => v
            .iter()
            .for_each(|s| host_calls(f, infos, s, env, m, ci, force64)),
        Stmt::Let { var, value, body } => {
            let x = eval_int(value, env);
            env.insert(var.id, x);
            host_calls(f, infos, body, env, m, ci, force64);
        }
        Stmt::Allocate { bufs, body } => {
            for buf in bufs {
                let b = f.buffer(*buf);
                let shape: Vec<i64> = b.shape.iter().map(|e| eval_int(e, env)).collect();
                let mut count = 1i64;
                for (k, v) in b.strides.iter().enumerate().rev() {
                    env.insert(v.id, count);
                    count *= shape[k].max(0);
                }
                m.push_str(&format!(
                    "  unsigned char* t{} = (unsigned char*)calloc({}, 1);\n",
                    buf.0,
                    (count as usize * b.dtype.size()).max(1)
                ));
            }
            host_calls(f, infos, body, env, m, ci, force64);
            for buf in bufs.iter().rev() {
                m.push_str(&format!("  free(t{});\n", buf.0));
            }
        }
        Stmt::Launch { kernel } => {
            let info = infos.iter().find(|i| i.index == *kernel).unwrap();
            // The entry point the CUDA host plan would launch (`KernelInfo::entry`), or the
            // 64-bit one where the case forces it.
            let (entry, _) = if force64 && info.index32.has64() {
                (info.name.as_str(), false)
            } else {
                info.entry(&|v| env.get(&v.id).copied())
            };
            let k = &f.kernels[*kernel];
            let grid: Vec<i64> = info
                .grid
                .iter()
                .map(|e| e.as_ref().map_or(1, |e| eval_int(e, env).max(0)))
                .collect();
            let mut args = Vec::new();
            for id in &k.bufs {
                let ty = super::source::storage_type(f.buffer(*id).dtype);
                match f.params.iter().position(|q| q == id) {
                    Some(p) => args.push(format!("({ty}*)b{p}")),
                    None => args.push(format!("({ty}*)t{}", id.0)),
                }
            }
            for v in &k.vars {
                args.push(format!("(long long){}LL", env[&v.id]));
            }
            m.push_str(&format!(
                "  rivet_launch({}, {}, {}, {}, {}, {}, [&] {{ case{ci}::{}({}); }});\n",
                grid[0],
                grid[1],
                grid[2],
                info.block[0],
                info.block[1],
                info.block[2],
                entry,
                args.join(", ")
            ));
        }
        other => panic!("host statement {other:?}"),
    }
}

/// A case for `f` whose params are compact: `shapes` per parameter, dims given.
pub(super) fn host_case(f: PrimFunc, dims: &[i64], shapes: &[Vec<i64>], seed: u64) -> HostCase {
    let mut s = seed;
    let mut ints = dims.to_vec();
    let mut bufs = Vec::new();
    let mut loose = Vec::new();
    for (p, shape) in shapes.iter().enumerate() {
        let b = f.buffer(f.params[p]);
        let mut stride = 1;
        let mut strides = vec![0; shape.len()];
        for k in (0..shape.len()).rev() {
            strides[k] = stride;
            stride *= shape[k];
        }
        ints.extend(strides);
        let n: i64 = shape.iter().product();
        let mut bytes = random_bytes(b.dtype, n as usize, &mut s, p.min(1));
        if matches!(b.kind, BufKind::Param { output: true }) {
            bytes.iter_mut().for_each(|x| *x = 0xA5); // poison
        }
        bufs.push(bytes);
        loose.push(Vec::new());
    }
    HostCase {
        func: f,
        bufs,
        ints,
        loose,
        all_loose: false,
        ulps: 4,
        force64: false,
    }
}

#[test]
fn cuda_generated_kernels_agree_with_the_interpreter_under_host_emulation() {
    let mut cases = vec![
        host_case(double(), &[1000], &[vec![1000], vec![1000]], 1),
        host_case(reverse(), &[], &[vec![256], vec![256]], 2),
        host_case(
            tiled_matmul(),
            &[37, 45, 29],
            &[vec![37, 45], vec![45, 29], vec![37, 29]],
            3,
        ),
        host_case(block_tree_reduction(), &[], &[vec![5, 256], vec![5]], 4),
        host_case(statements(), &[], &[vec![64], vec![64], vec![64, 4]], 5),
        // Ragged in every dim against the 64x64 tiles and 16-deep k tiles: 2x2 blocks.
        host_case(
            gemm_shared_tiled(),
            &[70, 33, 65],
            &[vec![70, 33], vec![33, 65], vec![70, 65]],
            7,
        ),
    ];
    // A strided input: A's elements 3 apart (the frame's stride, not a copy).
    let mut strided = host_case(double(), &[300], &[vec![900], vec![300]], 6);
    strided.ints = vec![300, 3, 1];
    cases.push(strided);
    // Matmul inputs with NaNs and infinities give NaN-heavy results; keep them finite.
    for c in cases
        .iter_mut()
        .filter(|c| c.func.name == "mm" || c.func.name == "gemm")
    {
        for b in c.bufs.iter_mut().take(2) {
            for ch in b.chunks_mut(4) {
                let x = f32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]);
                let y = if x.is_finite() {
                    x.clamp(-10.0, 10.0)
                } else {
                    1.0
                };
                ch.copy_from_slice(&y.to_le_bytes());
            }
        }
    }
    const N: i64 = 175;
    for (k, dt) in ALL.iter().enumerate() {
        let (f, nv, nc) = every_op(*dt);
        let mut shapes = vec![vec![N], vec![N], vec![N, nv as i64]];
        shapes.extend(ALL.iter().map(|_| vec![N, nc as i64]));
        let mut c = host_case(f, &[N], &shapes, 100 + k as u64);
        // Transcendental columns (libm vs musl) are compared within 4 ulps; so are the
        // results of casting them... they are not cast: only R's columns.
        if dt.is_float() {
            let lib = libm_columns(nv);
            c.loose[2] = (0..N as usize * nv)
                .map(|e| lib.contains(&(e % nv)))
                .collect();
        }
        cases.push(c);
    }
    // Index widths: these small sizes run the 32-bit kernels (checked here); the same cases
    // again with the 64-bit kernels forced, so both widths agree with the interpreter.
    for c in &cases {
        let g = super::source::generate(&c.func, "").unwrap();
        let slots = crate::codegen::int_slots(&c.func);
        let env: std::collections::HashMap<u32, i64> = slots
            .iter()
            .map(|v| v.id)
            .zip(c.ints.iter().copied())
            .collect();
        for k in &g.kernels {
            assert!(
                k.entry(&|v| env.get(&v.id).copied()).1,
                "{}: {} would run with 64-bit indices ({:?})",
                c.func.name,
                k.name,
                k.index32
            );
        }
    }
    let wide: Vec<HostCase> = cases
        .iter()
        .map(|c| HostCase {
            force64: true,
            ..c.clone()
        })
        .collect();
    cases.extend(wide);
    run_on_host(&cases);
}

/// The columns of `every_op`'s `R` computed by libm functions (pow, exp, log, tanh, sigmoid,
/// erf), for a float dtype: after the 2 loads, 7 binary ops, neg, abs, 4 per constant (8
/// constants), div, then pow and the unary list.
fn libm_columns(nv: usize) -> Vec<usize> {
    let pow = 2 + 7 + 2 + 4 * 8 + 1;
    // Unary list: Exp, Log, Sqrt, Rsqrt, Tanh, Sigmoid, Floor, Ceil, Erf.
    let u = pow + 1;
    let mut cols = vec![pow, u, u + 1, u + 4, u + 5, u + 8];
    // The sigmoids of the constants, last.
    cols.extend(nv - constants(F).len()..nv);
    cols
}

// ---- schedules with memory caches (cache_read / cache_write) -------------------------------

/// The hand-written cache schedules of the interpreter's tests, lowered for CUDA.
pub(super) fn cache_schedules() -> Vec<(PrimFunc, bool)> {
    use crate::codegen::interp::tests_cache as tc;
    [
        (tc::one_output_per_thread_schedule(), true),
        (tc::partial_binding_schedule(), false),
        (tc::local_cache_read_schedule(), true),
    ]
    .into_iter()
    .map(|((s, args), symbolic)| {
        let f = crate::lower::lower(
            crate::lower::Source::Schedule {
                sched: &s,
                args: &args,
                name: "mm",
            },
            &Target::cuda(Some(SM80)),
            crate::lower::Options::default(),
        )
        .unwrap()
        .func;
        (f, symbolic)
    })
    .collect()
}

#[test]
fn cuda_cache_schedules_compile_and_agree_with_the_interpreter_under_host_emulation() {
    let nv = test_nvrtc();
    let mut cases = Vec::new();
    for (k, (f, symbolic)) in cache_schedules().into_iter().enumerate() {
        if let Some(nv) = &nv {
            compiles_cleanly(nv, &f);
        }
        let (m, kk, n) = if symbolic { (23, 30, 41) } else { (12, 10, 12) };
        let dims: Vec<i64> = if symbolic { vec![m, kk, n] } else { vec![] };
        let mut c = host_case(
            f,
            &dims,
            &[vec![m, kk], vec![kk, n], vec![m, n]],
            40 + k as u64,
        );
        // Finite inputs (NaN-heavy products say little about the schedule).
        for b in c.bufs.iter_mut().take(2) {
            for ch in b.chunks_mut(4) {
                let x = f32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]);
                let y = if x.is_finite() {
                    x.clamp(-10.0, 10.0)
                } else {
                    1.0
                };
                ch.copy_from_slice(&y.to_le_bytes());
            }
        }
        cases.push(c);
    }
    run_on_host(&cases);
}

// ---- the kernel library (rivet.kernels) with its GPU schedules --------------------------

/// Every library kernel, GPU-scheduled and lowered for CUDA (several dtypes and shapes).
pub(super) fn library() -> Vec<PrimFunc> {
    use crate::kernels::strategy::{schedule, Strategy};
    use crate::kernels::{defs, DimSpec};
    let name = |s: &str| DimSpec::Name(s.into());
    let defs = vec![
        defs::matmul(F).unwrap(),
        defs::batch_matmul(F).unwrap(),
        defs::binary(
            "add",
            F,
            &[name("n"), DimSpec::Size(1)],
            &[DimSpec::Size(1), name("m")],
        )
        .unwrap(),
        defs::binary("mul", DType::F16, &[name("n")], &[name("n")]).unwrap(),
        defs::relu(F, 2).unwrap(),
        defs::relu(DType::BF16, 1).unwrap(),
        defs::gelu(F, 2).unwrap(),
        defs::softmax(F, 2, 1).unwrap(),
        defs::layer_norm(F, 2, 1e-5).unwrap(),
        defs::reduce("sum", F, 2, 1, false).unwrap(),
        defs::reduce("max", DType::F64, 3, 0, true).unwrap(),
        defs::transpose(F, &[1, 0]).unwrap(),
    ];
    defs.into_iter()
        .map(|d| {
            let s = schedule(&d, Strategy::Gpu).unwrap();
            crate::lower::lower(
                crate::lower::Source::Schedule {
                    sched: &s,
                    args: &d.args,
                    name: d.name,
                },
                &Target::cuda(Some(SM80)),
                crate::lower::Options::default(),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", d.name))
            .func
        })
        .collect()
}

#[test]
fn cuda_kernel_library_compiles_for_sm80_and_sm90_without_warnings() {
    let fs = library();
    let nv = test_nvrtc();
    for f in &fs {
        let g = super::source::generate(f, "").unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert!(!g.kernels.is_empty(), "{}", f.name);
        if std::env::var("RIVET_CUDA_PEEK").is_ok_and(|p| p == f.name) {
            eprintln!("{}", golden_text(&g.source));
        }
        if let Some(nv) = &nv {
            compiles_cleanly(nv, f);
        }
    }
}

#[test]
fn cuda_kernel_library_agrees_with_the_interpreter_under_host_emulation() {
    let mut cases = Vec::new();
    for (k, f) in library().into_iter().enumerate() {
        // Every dim 7 (ragged against the 16x16 tiles and 256-thread blocks).
        let dims = vec![7i64; f.dims.len()];
        let env: std::collections::HashMap<u32, i64> = f
            .dims
            .iter()
            .map(|v| v.id)
            .zip(dims.iter().copied())
            .collect();
        let shapes: Vec<Vec<i64>> = f
            .params
            .iter()
            .map(|id| {
                f.buffer(*id)
                    .shape
                    .iter()
                    .map(|e| eval_int(e, &env))
                    .collect()
            })
            .collect();
        let libm = f.name == "gelu" || f.name == "softmax";
        let mut c = host_case(f, &dims, &shapes, 1000 + k as u64);
        // Finite inputs: the library's reference semantics with NaN inputs is tested elsewhere.
        let dts: Vec<DType> = c
            .func
            .params
            .iter()
            .map(|id| c.func.buffer(*id).dtype)
            .collect();
        for (b, dt) in c.bufs.iter_mut().zip(dts) {
            let mut s = 77u64;
            let n = b.len() / dt.size();
            if dt.is_float() {
                let mut fresh = Vec::new();
                for _ in 0..n {
                    let x = (lcg(&mut s) % 2001) as f64 / 200.0 - 5.0;
                    match dt {
                        DType::F32 => fresh.extend((x as f32).to_le_bytes()),
                        DType::F64 => fresh.extend(x.to_le_bytes()),
                        DType::F16 => {
                            fresh.extend(half::f16::from_f32(x as f32).to_bits().to_le_bytes())
                        }
                        _ => fresh.extend(half::bf16::from_f64(x).to_bits().to_le_bytes()),
                    }
                }
                *b = fresh;
            }
        }
        if libm {
            c.all_loose = true;
            c.ulps = 16;
        }
        cases.push(c);
    }
    run_on_host(&cases);
}

// ---- the prelude's conversions, exhaustively -------------------------------------------

/// Every float16 and bfloat16 bit pattern widened, and float32 / float64 values around every
/// rounding boundary narrowed, by the prelude (host C++) and by the `half` crate the
/// interpreter uses: the same bits (NaN payloads included).
#[test]
fn cuda_prelude_half_conversions_match_the_interpreter_bit_for_bit() {
    if std::process::Command::new("c++")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("no host C++ compiler (c++): prelude conversion check skipped");
        return;
    }
    // float32 inputs: every float16/bfloat16 value, the midpoints between neighbours and
    // one ulp either side, plus a sweep of bit patterns.
    let mut f32s: Vec<u32> = Vec::new();
    for h in 0..=u16::MAX {
        let lo = half::f16::from_bits(h).to_f32();
        let b = half::bf16::from_bits(h).to_f32();
        for x in [lo, b] {
            let bits = x.to_bits();
            f32s.extend([bits, bits.wrapping_add(1), bits.wrapping_sub(1)]);
            f32s.extend([
                bits.wrapping_add(0x1000),
                bits.wrapping_add(0x0fff),
                bits.wrapping_add(0x8000),
                bits.wrapping_add(0x7fff),
            ]);
        }
    }
    let mut s = 9u64;
    for _ in 0..200_000 {
        f32s.push(lcg(&mut s) as u32);
    }
    let mut f64s: Vec<u64> = f32s
        .iter()
        .map(|&b| (f32::from_bits(b) as f64).to_bits())
        .collect();
    for _ in 0..200_000 {
        let r = lcg(&mut s);
        f64s.push(r << 11 | (r >> 30));
    }
    // Just off the float16 / bfloat16 midpoints, by less than float32 can tell.
    for h in 0..0x7c00u16 {
        for (a, b) in [
            (
                half::f16::from_bits(h).to_f64(),
                half::f16::from_bits(h + 1).to_f64(),
            ),
            (
                half::bf16::from_bits(h).to_f64(),
                half::bf16::from_bits(h + 1).to_f64(),
            ),
        ] {
            let m = (a + b) / 2.0;
            for x in [m, m * (1.0 + 1e-12), m * (1.0 - 1e-12)] {
                f64s.extend([x.to_bits(), (-x).to_bits()]);
            }
        }
    }
    let dir = std::env::temp_dir().join(format!("rivet-cuda-prelude-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = format!(
        "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <math.h>\n{PRELUDE}\n{}",
        r#"
int main(int argc, char** argv) {
  FILE* f = fopen(argv[1], "rb"); FILE* o = fopen(argv[2], "wb");
  unsigned n32, n64; fread(&n32, 4, 1, f); fread(&n64, 4, 1, f);
  for (unsigned h = 0; h < 65536; ++h) {
    unsigned a = rivet_f32_bits(rivet_f16_to_f32((unsigned short)h));
    unsigned b = rivet_f32_bits(rivet_bf16_to_f32((unsigned short)h));
    fwrite(&a, 4, 1, o); fwrite(&b, 4, 1, o);
  }
  for (unsigned i = 0; i < n32; ++i) {
    unsigned x; fread(&x, 4, 1, f);
    unsigned short a = rivet_f32_to_f16(rivet_f32_from_bits(x));
    unsigned short b = rivet_f32_to_bf16(rivet_f32_from_bits(x));
    fwrite(&a, 2, 1, o); fwrite(&b, 2, 1, o);
  }
  for (unsigned i = 0; i < n64; ++i) {
    unsigned long long x; fread(&x, 8, 1, f);
    unsigned short a = rivet_f64_to_f16(rivet_f64_from_bits(x));
    unsigned short b = rivet_f64_to_bf16(rivet_f64_from_bits(x));
    fwrite(&a, 2, 1, o); fwrite(&b, 2, 1, o);
  }
  fclose(o);
  return 0;
}
"#
    );
    let cpp = dir.join("conv.cpp");
    let exe = dir.join("conv");
    std::fs::write(&cpp, src).unwrap();
    let o = std::process::Command::new("c++")
        .args(["-std=c++17", "-O1", "-ffp-contract=off", "-w", "-o"])
        .arg(&exe)
        .arg(&cpp)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut input = Vec::new();
    input.extend((f32s.len() as u32).to_le_bytes());
    input.extend((f64s.len() as u32).to_le_bytes());
    f32s.iter().for_each(|x| input.extend(x.to_le_bytes()));
    f64s.iter().for_each(|x| input.extend(x.to_le_bytes()));
    std::fs::write(dir.join("in"), &input).unwrap();
    let st = std::process::Command::new(&exe)
        .arg(dir.join("in"))
        .arg(dir.join("out"))
        .status()
        .unwrap();
    assert!(st.success());
    let out = std::fs::read(dir.join("out")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let u32_at = |i: usize| u32::from_le_bytes(out[i..i + 4].try_into().unwrap());
    let u16_at = |i: usize| u16::from_le_bytes(out[i..i + 2].try_into().unwrap());
    let mut at = 0;
    for h in 0..=u16::MAX {
        assert_eq!(
            u32_at(at),
            half::f16::from_bits(h).to_f32().to_bits(),
            "f16 {h:#x}"
        );
        assert_eq!(
            u32_at(at + 4),
            half::bf16::from_bits(h).to_f32().to_bits(),
            "bf16 {h:#x}"
        );
        at += 8;
    }
    for &x in &f32s {
        let v = f32::from_bits(x);
        assert_eq!(
            u16_at(at),
            half::f16::from_f32(v).to_bits(),
            "f32 {x:#x} -> f16"
        );
        assert_eq!(
            u16_at(at + 2),
            half::bf16::from_f32(v).to_bits(),
            "f32 {x:#x} -> bf16"
        );
        at += 4;
    }
    for &x in &f64s {
        let v = f64::from_bits(x);
        assert_eq!(
            u16_at(at),
            half::f16::from_f32(v as f32).to_bits(),
            "f64 {x:#x} -> f16"
        );
        assert_eq!(
            u16_at(at + 2),
            half::bf16::from_f64(v).to_bits(),
            "f64 {x:#x} -> bf16"
        );
        at += 4;
    }
    assert_eq!(at, out.len());
}

// ---- through the public API ---------------------------------------------------------------

/// `build(..., "cuda")` of a te program with a GPU schedule: the module holds the CUDA C;
/// calling it with CPU tensors, or allocating its outputs, is a `DeviceError`, never a panic.
#[test]
fn cuda_build_and_call_through_the_public_api() {
    use crate::te::{compute, placeholder};
    let n = crate::te::var("n");
    let a = placeholder([&n], F, "A").unwrap();
    let c = compute([&n], |[i]| a.at([i]) * 2.0, "C").unwrap();
    let mut s = crate::Schedule::new(&[c.clone()]).unwrap();
    let i = c.axis()[0].var.clone();
    let st = s.stage(&c).unwrap();
    let (bx, tx) = st.split(&i, Some(int(128)), None).unwrap();
    st.bind(&bx, ThreadTag::BlockX).unwrap();
    st.bind(&tx, ThreadTag::ThreadX).unwrap();
    let built = crate::build::build(&s, &[a.clone(), c.clone()], "cuda -arch=sm_90", "twice");
    let required = std::env::var("RIVET_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    if required && nvrtc::find().is_err() {
        // The backend's own search finds no NVRTC (a test binary is not in a venv; CI sets
        // RIVET_NVRTC_PATH): the build says so, loudly.
        let e = built.err().expect("refused").to_string();
        assert!(
            e.contains("RIVET_REQUIRE_NVRTC=1") && e.contains("NVRTC"),
            "{e}"
        );
        return;
    }
    let m = built.unwrap();
    let src = m.funcs[0].kernel.source();
    assert!(
        src.contains("extern \"C\" __global__ void __launch_bounds__(128) twice_kernel0("),
        "{src}"
    );
    assert!(src.contains("(target sm_90)"), "{src}");
    let f = m.get_function("twice").unwrap();
    let x = rivet_runtime::Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let y = rivet_runtime::Tensor::zeros(&[3], F).unwrap();
    let e = f
        .call(&[
            rivet_runtime::Value::Tensor(x.clone()),
            rivet_runtime::Value::Tensor(y),
        ])
        .unwrap_err();
    assert!(
        matches!(e, rivet_runtime::Error::Device(_)) && e.to_string().contains("CUDA tensors"),
        "{e}"
    );
    // Outputs omitted: the inputs are on the CPU, so nothing is allocated anywhere.
    let e = f.call(&[rivet_runtime::Value::Tensor(x)]).unwrap_err();
    assert!(
        matches!(e, rivet_runtime::Error::Device(_))
            && e.to_string()
                .contains("built for 'cuda', called with tensors on cpu"),
        "{e}"
    );
    // Without bound loops the default GPU schedule applies: a 1-D grid over all elements.
    let s2 = crate::Schedule::new(&[c.clone()]).unwrap();
    let m = crate::build::build(&s2, &[a, c], "cuda", "plain").unwrap();
    let src = m.get_source("cuda").unwrap();
    assert!(
        src.contains("__global__") && src.contains("blockIdx.x") && src.contains("threadIdx.x"),
        "{src}"
    );
}

// ---- cross-thread reductions (Stmt::AllReduce) ---------------------------------------------

/// `R[i] = op over k of A[i, k]` (`A: [n, k]`), the reduction split by `threads` and bound to
/// threadIdx.x, rows on blockIdx.x (with `rows_per_block`: split, the inner part on
/// threadIdx.y), lowered for CUDA.
fn allreduce_rows(
    op: crate::ir::ReduceOp,
    dt: DType,
    threads: i64,
    rows_per_block: Option<i64>,
) -> PrimFunc {
    use crate::te;
    let (n, k) = (te::var("n"), te::var("k"));
    let a = te::placeholder([&n, &k], dt, "A").unwrap();
    let r = te::reduce_axis(0, &k, "r").unwrap();
    let out = te::compute(
        [&n],
        |[i]| {
            let v = a.at((i, &r));
            te::reduction(op, v, &r)
        },
        "R",
    )
    .unwrap();
    let mut s = crate::schedule::Schedule::new(std::slice::from_ref(&out)).unwrap();
    let st = s.stage(&out).unwrap();
    let i = out.axis()[0].var.clone();
    let (ko, ki) = st.split(&r.var, Some(int(threads)), None).unwrap();
    match rows_per_block {
        None => {
            st.reorder(&[i.clone(), ki.clone(), ko]).unwrap();
            st.bind(&i, ThreadTag::BlockX).unwrap();
        }
        Some(y) => {
            let (io, ii) = st.split(&i, Some(int(y)), None).unwrap();
            st.reorder(&[io.clone(), ii.clone(), ki.clone(), ko])
                .unwrap();
            st.bind(&io, ThreadTag::BlockX).unwrap();
            st.bind(&ii, ThreadTag::ThreadY).unwrap();
        }
    }
    st.bind(&ki, ThreadTag::ThreadX).unwrap();
    let args = [a, out];
    let mut f = crate::lower::lower(
        crate::lower::Source::Schedule {
            sched: &s,
            args: &args,
            name: "rows",
        },
        &Target::cuda(Some(SM80)),
        crate::lower::Options::default(),
    )
    .unwrap()
    .func;
    f.name = format!(
        "rows_{}_{dt}_{threads}x{}",
        format!("{op:?}").to_lowercase(),
        rows_per_block.unwrap_or(1)
    );
    f
}

/// The cross-thread reductions of the tests: every dtype a reduction takes (sums), max / min /
/// prod, thread counts below, at and above a warp, not powers of two, 1024, and several
/// groups per block.
pub(super) fn allreduce_kernels() -> Vec<(PrimFunc, i64, i64)> {
    use crate::ir::ReduceOp::{Max, Min, Prod, Sum};
    let mut out = Vec::new();
    for (k, dt) in ALL.iter().skip(1).enumerate() {
        let threads = [256, 33, 64, 7, 96, 32][k % 6];
        out.push((allreduce_rows(Sum, *dt, threads, None), 3, 1000));
    }
    for (op, dt, threads, y, rows, cols) in [
        (Max, DType::F32, 256, None, 3, 1000),
        (Min, DType::F16, 1000, None, 2, 1000),
        (Max, DType::I8, 31, None, 3, 100),
        (Min, DType::U64, 1024, None, 2, 1500),
        (Prod, DType::F64, 32, None, 3, 40),
        (Prod, DType::I32, 33, None, 3, 70),
        (Sum, DType::F32, 8, Some(4), 10, 77),
        (Sum, DType::F32, 64, Some(4), 10, 200),
        (Max, DType::BF16, 2, Some(16), 33, 9),
        (Sum, DType::F32, 1, None, 4, 5),
    ] {
        out.push((allreduce_rows(op, dt, threads, y), rows, cols));
    }
    out
}

#[test]
fn cuda_allreduce_golden_and_launch_shape() {
    let f = allreduce_rows(crate::ir::ReduceOp::Sum, F, 256, None);
    let g = super::source::generate(&f, "target sm_80").unwrap();
    golden("allreduce_rows", &golden_text(&g.source));
    assert_eq!(g.kernels.len(), 1, "no init kernel");
    let k = &g.kernels[0];
    // 256 threads: 8 warps, one float of scratch each.
    assert_eq!((k.block, k.shared_bytes), ([256, 1, 1], 32));
    assert!(
        g.source.contains("rivet_allreduce_x<float>("),
        "{}",
        g.source
    );
    // One warp's worth of threads needs no shared memory; 4 groups of 64 need 2 floats each.
    let g = super::source::generate(&allreduce_rows(crate::ir::ReduceOp::Max, F, 32, None), "")
        .unwrap();
    assert_eq!(g.kernels[0].shared_bytes, 0);
    assert!(g.source.contains("(float*)0"), "{}", g.source);
    let g = super::source::generate(
        &allreduce_rows(crate::ir::ReduceOp::Sum, F, 64, Some(4)),
        "",
    )
    .unwrap();
    assert_eq!(
        (g.kernels[0].block, g.kernels[0].shared_bytes),
        ([64, 4, 1], 32)
    );
}

#[test]
fn cuda_allreduce_kernels_compile_for_sm80_and_sm90_without_warnings() {
    let Some(nv) = test_nvrtc() else { return };
    for (f, _, _) in allreduce_kernels() {
        let k = compiles_cleanly(&nv, &f);
        // The shuffles are real warp instructions.
        assert!(k.ptx().unwrap().contains("shfl.sync"), "{}", f.name);
    }
}

#[test]
fn cuda_allreduce_agrees_with_the_interpreter_under_host_emulation() {
    let cases: Vec<HostCase> = allreduce_kernels()
        .into_iter()
        .enumerate()
        .map(|(s, (f, rows, cols))| {
            host_case(
                f,
                &[rows, cols],
                &[vec![rows, cols], vec![rows]],
                500 + s as u64,
            )
        })
        .collect();
    run_on_host(&cases);
}

// ---- vectorized stores (lower::vectorize on the CUDA target) ------------------------------

/// `C[i, j] = A[i, j] * B[i] + A[i, j]` over `m x n` (`i` on blocks, `j` split by `4` (or 2)
/// with the outer part on threads and the inner part vectorized), lowered for CUDA.
fn vectorized_elementwise(dt: DType, m: i64, n: i64, factor: i64) -> PrimFunc {
    use crate::te::{compute, placeholder};
    let a = placeholder([m, n], dt, "A").unwrap();
    let b = placeholder([m], dt, "B").unwrap();
    let c = compute(
        [m, n],
        |[i, j]| {
            let x = a.at([&i, &j]);
            &x * b.at([i]) + x
        },
        "C",
    )
    .unwrap();
    let mut s = crate::Schedule::new(&[c.clone()]).unwrap();
    let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
    let st = s.stage(&c).unwrap();
    let (jo, ji) = st.split(&j, Some(int(factor)), None).unwrap();
    st.bind(&i, ThreadTag::BlockX).unwrap();
    st.bind(&jo, ThreadTag::ThreadX).unwrap();
    st.vectorize(&ji).unwrap();
    crate::lower::lower(
        crate::lower::Source::Schedule {
            sched: &s,
            args: &[a, b, c],
            name: "vadd",
        },
        &Target::cuda(Some(SM80)),
        crate::lower::Options::default(),
    )
    .unwrap()
    .func
}

#[test]
fn cuda_vectorized_stores_are_16_byte_accesses_and_agree_under_host_emulation() {
    let nv = test_nvrtc();
    let mut cases = Vec::new();
    for (k, (dt, factor, vty)) in [
        (F, 4, "float4"),
        (DType::F64, 2, "double2"),
        (DType::I32, 4, "int4"),
        (DType::I16, 8, ""),
    ]
    .into_iter()
    .enumerate()
    {
        // Exact multiples, and a ragged edge (the split guard: the vector loop is shortened).
        for (m, n) in [(3, 64), (2, 62), (1, 1)] {
            let f = vectorized_elementwise(dt, m, n, factor);
            let src = super::source::generate(&f, "").unwrap().source;
            // (One element per row: no vector code, the loop is all tail.)
            let vector = n >= factor;
            assert_eq!(src.contains(" vv = "), vector, "{src}");
            assert_eq!(
                src.contains("rivet_aligned16(C + vs)"),
                vector && !vty.is_empty(),
                "{src}"
            );
            if vector && !vty.is_empty() {
                assert!(
                    src.contains(&format!("reinterpret_cast<const {vty}*>")),
                    "{src}"
                );
            }
            if let Some(nv) = &nv {
                let kernel = compiles_cleanly(nv, &f);
                let ptx = kernel.ptx().unwrap();
                if vector && !vty.is_empty() {
                    // 16-byte loads (`.nc`: read-only inputs) and stores.
                    let ld = ptx.contains("ld.global.nc.v") || ptx.contains("ld.global.v");
                    assert!(ld && ptx.contains("st.global.v"), "{ptx}");
                }
            }
            cases.push(host_case(
                f,
                &[],
                &[vec![m, n], vec![m], vec![m, n]],
                90 + k as u64,
            ));
        }
    }
    run_on_host(&cases);
}
