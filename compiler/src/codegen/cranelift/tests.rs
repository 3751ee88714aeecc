//! Tests of the Cranelift backend on hand-built, flattened functions, against Rust reference
//! formulas (`codegen::cpu_lib::math`, `libm`, `half`, Rust's `as`).

use super::CraneliftBackend;
use crate::codegen::cpu_lib::math;
use crate::codegen::{Backend, CallFrame, Kernel, LaunchContext};
use crate::ir::{BinOp, BufKind, Buffer, CmpOp, Expr, ForKind, LogicOp, PrimFunc, Stmt, UnOp, Var};
use rivet_runtime::DType;

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

// ---- building functions ------------------------------------------------------------------

use crate::ir::test_util::{buffer, func, input, output};

fn offset(b: &Buffer, idx: &[Expr]) -> Expr {
    let mut off: Option<Expr> = None;
    for (i, s) in idx.iter().zip(&b.strides) {
        let t = i.mul(&Expr::var(s));
        off = Some(match off {
            None => t,
            Some(o) => o.add(&t),
        });
    }
    off.unwrap_or_else(|| Expr::int(0))
}

fn load(b: &Buffer, idx: &[Expr]) -> Expr {
    Expr::load(b.id, vec![offset(b, idx)], b.dtype)
}

fn store(b: &Buffer, idx: &[Expr], value: Expr) -> Stmt {
    Stmt::Store {
        buf: b.id,
        indices: vec![offset(b, idx)],
        value,
    }
}

fn for_(v: &Var, extent: Expr, kind: ForKind, body: Stmt) -> Stmt {
    Stmt::For {
        var: v.clone(),
        min: Expr::int(0),
        extent,
        kind,
        body: Box::new(body),
    }
}

fn v(x: &Var) -> Expr {
    Expr::var(x)
}

/// Compiles hand-written IR as `lower::lower` would hand it over: split (parallel loops
/// outlined with their captures).
fn compile(f: &PrimFunc) -> super::CraneliftKernel {
    let mut b = CraneliftBackend::new().unwrap();
    b.set_disassembly(true);
    let mut f = f.clone();
    crate::lower::outline::outline(&mut f);
    let f = &f;
    match b.compile_kernel(f) {
        Ok(k) => k,
        Err(e) => panic!("compile {}: {e}", f.name),
    }
}

/// A module too big for its first JIT region is compiled again in a larger one (the retry
/// recognises cranelift-jit's message for a full region, checked here too), and the kernel
/// it gives computes what the same module compiled at once does, bit for bit.
#[test]
fn a_module_outgrowing_its_jit_region_is_compiled_in_a_larger_one() {
    // The same body 64 times over: 64 outlined loops, far more code than one page.
    let mut plain = parallel_program(ForKind::Parallel);
    plain.body = Stmt::seq(vec![plain.body.clone(); 64]);
    crate::ir::verify::verify(&plain, true).unwrap();
    let mut f = plain.clone();
    crate::lower::outline::outline(&mut f);
    let b = CraneliftBackend::new().unwrap();
    let page = 4096;
    match b.compile_in(&f, page) {
        Err(e) => assert!(e.to_string().contains(super::ARENA_EXHAUSTED), "{e}"),
        Ok(_) => panic!("the module fitted one page: the test needs a bigger one"),
    }
    let nn = 1000usize;
    let av: Vec<f32> = (0..nn).map(|x| x as f32 * 0.25 - 7.0).collect();
    let bv: Vec<f64> = (0..nn).map(|x| x as f64 * 0.5 - 100.0).collect();
    let mut outs = vec![];
    for k in [b.compile_growing(&f, page).unwrap(), compile(&plain)] {
        let (out, cnt) = run_parallel_program(&k, &av, &bv, nn);
        outs.push((out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), cnt));
    }
    assert_eq!(outs[0], outs[1]);
    assert!(outs[0].1.iter().all(|&c| c >= 0), "every element written");
}

// ---- scalar data -------------------------------------------------------------------------

/// A scalar as the reference sees it: ints exactly, float16/bfloat16 widened to f32.
#[derive(Clone, Copy, Debug)]
enum S {
    I(i128),
    F32(f32),
    F64(f64),
}

fn read(dt: DType, b: &[u8]) -> S {
    let a = |n: usize| -> [u8; 8] {
        let mut x = [0u8; 8];
        x[..n].copy_from_slice(&b[..n]);
        x
    };
    match dt {
        DType::Bool => S::I((b[0] != 0) as i128),
        DType::I8 => S::I(b[0] as i8 as i128),
        DType::U8 => S::I(b[0] as i128),
        DType::I16 => S::I(i16::from_le_bytes([b[0], b[1]]) as i128),
        DType::U16 => S::I(u16::from_le_bytes([b[0], b[1]]) as i128),
        DType::I32 => S::I(i32::from_le_bytes(b[..4].try_into().unwrap()) as i128),
        DType::U32 => S::I(u32::from_le_bytes(b[..4].try_into().unwrap()) as i128),
        DType::I64 => S::I(i64::from_le_bytes(a(8)) as i128),
        DType::U64 => S::I(u64::from_le_bytes(a(8)) as i128),
        DType::F16 => S::F32(half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
        DType::BF16 => S::F32(half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
        DType::F32 => S::F32(f32::from_le_bytes(b[..4].try_into().unwrap())),
        DType::F64 => S::F64(f64::from_le_bytes(a(8))),
    }
}

/// The reference `Cast` (see the module doc of the backend), giving the stored bytes.
fn cast_bytes(s: S, from: DType, to: DType) -> Vec<u8> {
    let _ = from;
    match to {
        DType::Bool => vec![match s {
            S::I(v) => (v != 0) as u8,
            S::F32(x) => (x != 0.0) as u8,
            S::F64(x) => (x != 0.0) as u8,
        }],
        DType::F16 => match s {
            S::I(v) => half::f16::from_f32(v as f32),
            S::F32(x) => half::f16::from_f32(x),
            S::F64(x) => half::f16::from_f32(x as f32),
        }
        .to_bits()
        .to_le_bytes()
        .to_vec(),
        DType::BF16 => match s {
            S::I(v) => half::bf16::from_f32(v as f32),
            S::F32(x) => half::bf16::from_f32(x),
            S::F64(x) => half::bf16::from_f64(x),
        }
        .to_bits()
        .to_le_bytes()
        .to_vec(),
        DType::F32 => match s {
            S::I(v) => v as f32,
            S::F32(x) => x,
            S::F64(x) => x as f32,
        }
        .to_le_bytes()
        .to_vec(),
        DType::F64 => match s {
            S::I(v) => v as f64,
            S::F32(x) => x as f64,
            S::F64(x) => x,
        }
        .to_le_bytes()
        .to_vec(),
        _ => {
            macro_rules! to_int {
                ($t:ty) => {
                    match s {
                        S::I(v) => (v as $t).to_le_bytes().to_vec(),
                        S::F32(x) => (x as $t).to_le_bytes().to_vec(),
                        S::F64(x) => (x as $t).to_le_bytes().to_vec(),
                    }
                };
            }
            match to {
                DType::I8 => to_int!(i8),
                DType::U8 => to_int!(u8),
                DType::I16 => to_int!(i16),
                DType::U16 => to_int!(u16),
                DType::I32 => to_int!(i32),
                DType::U32 => to_int!(u32),
                DType::I64 => to_int!(i64),
                DType::U64 => to_int!(u64),
                _ => unreachable!(),
            }
        }
    }
}

/// Equal bits, or both NaN.
fn same(dt: DType, a: &[u8], b: &[u8]) -> bool {
    if a == b {
        return true;
    }
    match (read(dt, a), read(dt, b)) {
        (S::F32(x), S::F32(y)) => x.is_nan() && y.is_nan(),
        (S::F64(x), S::F64(y)) => x.is_nan() && y.is_nan(),
        _ => false,
    }
}

fn encode(dt: DType, xs: &[f64]) -> Vec<u8> {
    xs.iter()
        .flat_map(|x| cast_bytes(S::F64(*x), DType::F64, dt))
        .collect()
}

const SAMPLES: [f64; 24] = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    -2.5,
    3.75,
    -7.0,
    100.3,
    -129.9,
    255.5,
    300.0,
    65504.0,
    65520.0,
    -40000.7,
    1e10,
    -3e9,
    4.3e9,
    1.0e19,
    -9.3e18,
    1e-8,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
];

/// Runs a 1-d kernel over `n` elements: buffers compact, dims = [n], each buffer one stride.
pub(super) fn run_1d(f: &PrimFunc, n: usize, data: &mut [Vec<u8>]) {
    run_kernel_1d(&compile(f), f, n, data)
}

/// `run_1d` with a kernel compiled from `f` already.
pub(super) fn run_kernel_1d(k: &dyn Kernel, f: &PrimFunc, n: usize, data: &mut [Vec<u8>]) {
    let ptrs = data.iter_mut().map(|d| d.as_mut_ptr()).collect();
    let mut ints = vec![n as i64];
    ints.extend(std::iter::repeat_n(1, f.params.len()));
    // SAFETY: every buffer holds n elements of its dtype, compact.
    unsafe {
        k.launch(
            &CallFrame {
                ptrs,
                ints: ints.into(),
            },
            &LaunchContext::host(),
        )
    }
    .unwrap();
}

/// `out[i] = build(loads of ins)[i]` over 1-d buffers of `n` elements.
pub(super) fn elementwise(
    name: &str,
    in_dts: &[DType],
    out_dt: DType,
    build: impl Fn(&[Expr]) -> Expr,
) -> PrimFunc {
    let n = Var::new("n");
    let i = Var::new("i");
    let mut bufs: Vec<Buffer> = in_dts
        .iter()
        .enumerate()
        .map(|(k, dt)| input(k as u32, &format!("in{k}"), *dt, vec![v(&n)]))
        .collect();
    let out = output(in_dts.len() as u32, "out", out_dt, vec![v(&n)]);
    let args: Vec<Expr> = bufs.iter().map(|b| load(b, &[v(&i)])).collect();
    let body = for_(
        &i,
        v(&n),
        ForKind::Serial,
        store(&out, &[v(&i)], build(&args)),
    );
    bufs.push(out);
    func(name, bufs, vec![n], body)
}

// ---- tests -------------------------------------------------------------------------------

#[test]
fn kernels_are_send_and_sync_and_named_cpu() {
    fn check<T: Send + Sync>() {}
    check::<super::CraneliftKernel>();
    check::<CraneliftBackend>();
    assert_eq!(CraneliftBackend::new().unwrap().target().to_string(), "cpu");
}

#[test]
fn elementwise_add_over_strided_2d_buffers() {
    let (n, m) = (Var::new("n"), Var::new("m"));
    let (i, j) = (Var::new("i"), Var::new("j"));
    let shape = vec![v(&n), v(&m)];
    let a = input(0, "A", DType::F32, shape.clone());
    let b = input(1, "B", DType::F32, shape.clone());
    let c = output(2, "C", DType::F32, shape);
    let sum = Expr::binary(
        BinOp::Add,
        load(&a, &[v(&i), v(&j)]),
        load(&b, &[v(&i), v(&j)]),
    )
    .unwrap();
    let body = for_(
        &i,
        v(&n),
        ForKind::Serial,
        for_(&j, v(&m), ForKind::Serial, store(&c, &[v(&i), v(&j)], sum)),
    );
    let f = func("add2d", vec![a, b, c], vec![n, m], body);
    let k = compile(&f);
    let (nn, mm) = (5usize, 7usize);
    // A column-major, B rows padded to 10, C with reversed rows and columns (negative strides:
    // element 0 is the last one in memory).
    let av: Vec<f32> = (0..nn * mm).map(|x| x as f32 * 0.37 - 3.0).collect();
    let bv: Vec<f32> = (0..nn * 10).map(|x| (x as f32).sin()).collect();
    let mut cv = vec![f32::NAN; nn * mm];
    let ptr_c = cv.as_mut_ptr().wrapping_add(nn * mm - 1) as *mut u8;
    let frame = CallFrame {
        ptrs: vec![av.as_ptr() as *mut u8, bv.as_ptr() as *mut u8, ptr_c].into(),
        ints: vec![nn as i64, mm as i64, 1, nn as i64, 10, 1, -(mm as i64), -1].into(),
    };
    // SAFETY: the buffers match the shapes and strides of the frame.
    unsafe { k.launch(&frame, &LaunchContext::host()) }.unwrap();
    for ii in 0..nn {
        for jj in 0..mm {
            let want = av[ii + jj * nn] + bv[ii * 10 + jj];
            let got = cv[nn * mm - 1 - (ii * mm + jj)];
            assert_eq!(got.to_bits(), want.to_bits(), "C[{ii},{jj}]");
        }
    }
    assert!(k.source().contains("function"), "{}", k.source());
    // A wrong frame is an error, not a crash.
    let bad = CallFrame {
        ptrs: vec![].into(),
        ints: vec![].into(),
    };
    // SAFETY: rejected before any code runs.
    assert!(unsafe { k.launch(&bad, &LaunchContext::host()) }.is_err());
}

#[test]
fn every_dtype_loads_stores_and_casts() {
    for from in ALL {
        let src = encode(from, &SAMPLES);
        let n = SAMPLES.len();
        // Identity copy.
        let f = elementwise("copy", &[from], from, |a| a[0].clone());
        let mut data = vec![src.clone(), vec![0xA5; n * from.size()]];
        run_1d(&f, n, &mut data);
        assert_eq!(data[1], src, "copy of {from}");
        for to in ALL {
            let f = elementwise("cast", &[from], to, |a| Expr::cast(to, a[0].clone()));
            let mut data = vec![src.clone(), vec![0xA5; n * to.size()]];
            run_1d(&f, n, &mut data);
            for k in 0..n {
                let s = read(from, &src[k * from.size()..]);
                let want = cast_bytes(s, from, to);
                let got = &data[1][k * to.size()..(k + 1) * to.size()];
                assert!(
                    same(to, got, &want),
                    "cast {from} -> {to} of {s:?}: got {:?}, want {:?}",
                    read(to, got),
                    read(to, &want)
                );
            }
        }
    }
}

fn float_binary_ref(op: BinOp, x: f64, y: f64, f64_: bool) -> f64 {
    if f64_ {
        match op {
            BinOp::Add => x + y,
            BinOp::Sub => x - y,
            BinOp::Mul => x * y,
            BinOp::Div => x / y,
            BinOp::FloorDiv => math::floordiv_f64(x, y),
            BinOp::FloorMod => math::floormod_f64(x, y),
            BinOp::Min => math::fmin(x, y),
            BinOp::Max => math::fmax(x, y),
            BinOp::Pow => libm::pow(x, y),
        }
    } else {
        let (x, y) = (x as f32, y as f32);
        (match op {
            BinOp::Add => x + y,
            BinOp::Sub => x - y,
            BinOp::Mul => x * y,
            BinOp::Div => x / y,
            BinOp::FloorDiv => math::floordiv_f32(x, y),
            BinOp::FloorMod => math::floormod_f32(x, y),
            BinOp::Min => math::fmin(x, y),
            BinOp::Max => math::fmax(x, y),
            BinOp::Pow => libm::powf(x, y),
        }) as f64
    }
}

fn float_unary_ref(op: UnOp, x: f64, f64_: bool) -> f64 {
    if f64_ {
        match op {
            UnOp::Neg => -x,
            UnOp::Exp => libm::exp(x),
            UnOp::Log => libm::log(x),
            UnOp::Sqrt => x.sqrt(),
            UnOp::Rsqrt => 1.0 / x.sqrt(),
            UnOp::Tanh => libm::tanh(x),
            UnOp::Sigmoid => 1.0 / (1.0 + libm::exp(-x)),
            UnOp::Abs => x.abs(),
            UnOp::Floor => x.floor(),
            UnOp::Ceil => x.ceil(),
            UnOp::Erf => libm::erf(x),
            UnOp::Not => unreachable!(),
        }
    } else {
        let x = x as f32;
        (match op {
            UnOp::Neg => -x,
            UnOp::Exp => crate::codegen::cpu_lib::exp32::exp32(x),
            UnOp::Log => libm::logf(x),
            UnOp::Sqrt => x.sqrt(),
            UnOp::Rsqrt => 1.0 / x.sqrt(),
            UnOp::Tanh => libm::tanhf(x),
            UnOp::Sigmoid => 1.0 / (1.0 + crate::codegen::cpu_lib::exp32::exp32(-x)),
            UnOp::Abs => x.abs(),
            UnOp::Floor => x.floor(),
            UnOp::Ceil => x.ceil(),
            UnOp::Erf => libm::erff(x),
            UnOp::Not => unreachable!(),
        }) as f64
    }
}

const BINOPS: [BinOp; 9] = [
    BinOp::Add,
    BinOp::Sub,
    BinOp::Mul,
    BinOp::Div,
    BinOp::FloorDiv,
    BinOp::FloorMod,
    BinOp::Min,
    BinOp::Max,
    BinOp::Pow,
];
const CMPOPS: [CmpOp; 6] = [
    CmpOp::Eq,
    CmpOp::Ne,
    CmpOp::Lt,
    CmpOp::Le,
    CmpOp::Gt,
    CmpOp::Ge,
];
const FUNOPS: [UnOp; 11] = [
    UnOp::Neg,
    UnOp::Exp,
    UnOp::Log,
    UnOp::Sqrt,
    UnOp::Rsqrt,
    UnOp::Tanh,
    UnOp::Sigmoid,
    UnOp::Abs,
    UnOp::Floor,
    UnOp::Ceil,
    UnOp::Erf,
];

fn cmp_ref<T: PartialOrd>(op: CmpOp, x: T, y: T) -> bool {
    match op {
        CmpOp::Eq => x == y,
        CmpOp::Ne => x != y,
        CmpOp::Lt => x < y,
        CmpOp::Le => x <= y,
        CmpOp::Gt => x > y,
        CmpOp::Ge => x >= y,
    }
}

#[test]
fn float_ops_match_the_reference_formulas() {
    let vals = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -2.5,
        3.0,
        7.25,
        -7.25,
        1e-3,
        88.0,
        -100.0,
        1e30,
        f64::INFINITY,
        -f64::INFINITY,
        f64::NAN,
    ];
    let (mut xs, mut ys) = (vec![], vec![]);
    for x in vals {
        for y in vals {
            xs.push(x);
            ys.push(y);
        }
    }
    let n = xs.len();
    for dt in [DType::F32, DType::F64] {
        let f64_ = dt == DType::F64;
        let (a, b) = (encode(dt, &xs), encode(dt, &ys));
        let get = |d: &[u8], k: usize| match read(dt, &d[k * dt.size()..]) {
            S::F32(x) => x as f64,
            S::F64(x) => x,
            S::I(_) => unreachable!(),
        };
        for op in BINOPS {
            let f = elementwise("bin", &[dt, dt], dt, |a| {
                Expr::binary(op, a[0].clone(), a[1].clone()).unwrap()
            });
            let mut data = vec![a.clone(), b.clone(), vec![0; n * dt.size()]];
            run_1d(&f, n, &mut data);
            for k in 0..n {
                let want = encode(dt, &[float_binary_ref(op, xs[k], ys[k], f64_)]);
                let got = &data[2][k * dt.size()..(k + 1) * dt.size()];
                assert!(
                    same(dt, got, &want),
                    "{dt} {op:?}({}, {}) = {:?}, want {:?}",
                    xs[k],
                    ys[k],
                    read(dt, got),
                    read(dt, &want)
                );
                if matches!(op, BinOp::Min | BinOp::Max) && xs[k].is_nan() {
                    assert!(get(&data[2], k).is_nan());
                }
            }
        }
        for op in FUNOPS {
            let f = elementwise("un", &[dt], dt, |a| Expr::unary(op, a[0].clone()).unwrap());
            let mut data = vec![a.clone(), vec![0; n * dt.size()]];
            run_1d(&f, n, &mut data);
            for k in 0..n {
                let want = encode(dt, &[float_unary_ref(op, xs[k], f64_)]);
                let got = &data[1][k * dt.size()..(k + 1) * dt.size()];
                assert!(
                    same(dt, got, &want),
                    "{dt} {op:?}({}) = {:?}, want {:?}",
                    xs[k],
                    read(dt, got),
                    read(dt, &want)
                );
            }
        }
        for op in CMPOPS {
            let f = elementwise("cmp", &[dt, dt], DType::Bool, |a| {
                Expr::cmp(op, a[0].clone(), a[1].clone()).unwrap()
            });
            let mut data = vec![a.clone(), b.clone(), vec![7; n]];
            run_1d(&f, n, &mut data);
            for k in 0..n {
                let want = if f64_ {
                    cmp_ref(op, xs[k], ys[k])
                } else {
                    cmp_ref(op, xs[k] as f32, ys[k] as f32)
                };
                assert_eq!(data[2][k], want as u8, "{dt} {op:?}({}, {})", xs[k], ys[k]);
            }
        }
        // select(a < b, a, b) and logic on comparisons.
        let f = elementwise("sel", &[dt, dt], dt, |a| {
            let lt = Expr::cmp(CmpOp::Lt, a[0].clone(), a[1].clone()).unwrap();
            Expr::select(lt, a[0].clone(), a[1].clone()).unwrap()
        });
        let mut data = vec![a.clone(), b.clone(), vec![0; n * dt.size()]];
        run_1d(&f, n, &mut data);
        for k in 0..n {
            let want = encode(dt, &[if xs[k] < ys[k] { xs[k] } else { ys[k] }]);
            assert!(
                same(dt, &data[2][k * dt.size()..(k + 1) * dt.size()], &want),
                "select {} {}",
                xs[k],
                ys[k]
            );
        }
    }
}

#[test]
fn logic_not_and_select_on_bools() {
    let xs: Vec<u8> = vec![0, 0, 1, 1];
    let ys: Vec<u8> = vec![0, 1, 0, 1];
    type BoolOp = fn(bool, bool) -> bool;
    let cases: [(&str, BoolOp); 4] = [
        ("and", |a, b| a && b),
        ("or", |a, b| a || b),
        ("not", |a, _| !a),
        ("sel", |a, b| if a { b } else { !b }),
    ];
    for (name, r) in cases {
        let f = elementwise(
            name,
            &[DType::Bool, DType::Bool],
            DType::Bool,
            |a| match name {
                "and" => Expr::logic(LogicOp::And, a[0].clone(), a[1].clone()).unwrap(),
                "or" => Expr::logic(LogicOp::Or, a[0].clone(), a[1].clone()).unwrap(),
                "not" => Expr::unary(UnOp::Not, a[0].clone()).unwrap(),
                _ => Expr::select(
                    a[0].clone(),
                    a[1].clone(),
                    Expr::unary(UnOp::Not, a[1].clone()).unwrap(),
                )
                .unwrap(),
            },
        );
        let mut data = vec![xs.clone(), ys.clone(), vec![9; 4]];
        run_1d(&f, 4, &mut data);
        for k in 0..4 {
            assert_eq!(data[2][k], r(xs[k] != 0, ys[k] != 0) as u8, "{name} {k}");
        }
    }
}

/// Reference int binary op at the width of `dt`, on values given as i128.
pub(super) fn int_binary_ref(op: BinOp, dt: DType, x: i128, y: i128) -> Vec<u8> {
    let unsigned = matches!(dt, DType::U8 | DType::U16 | DType::U32 | DType::U64);
    let r: i128 = if unsigned {
        let (x, y) = (x as u128, y as u128);
        (match op {
            BinOp::Add => x.wrapping_add(y),
            BinOp::Sub => x.wrapping_sub(y),
            BinOp::Mul => x.wrapping_mul(y),
            BinOp::FloorDiv => x.checked_div(y).unwrap_or(0),
            BinOp::FloorMod => x.checked_rem(y).unwrap_or(0),
            BinOp::Min => x.min(y),
            BinOp::Max => x.max(y),
            _ => unreachable!(),
        }) as i128
    } else {
        let (x64, y64) = (x as i64, y as i64);
        match op {
            BinOp::Add => x.wrapping_add(y),
            BinOp::Sub => x.wrapping_sub(y),
            BinOp::Mul => x.wrapping_mul(y),
            BinOp::FloorDiv if dt == DType::I64 => math::floordiv_i64(x64, y64) as i128,
            BinOp::FloorMod if dt == DType::I64 => math::floormod_i64(x64, y64) as i128,
            // Narrower: exact in i64, then wrapped to the width below.
            BinOp::FloorDiv => math::floordiv_i64(x64, y64) as i128,
            BinOp::FloorMod => math::floormod_i64(x64, y64) as i128,
            BinOp::Min => x.min(y),
            BinOp::Max => x.max(y),
            _ => unreachable!(),
        }
    };
    cast_bytes(S::I(r), DType::I64, dt)
}

pub(super) fn int_samples(dt: DType) -> Vec<i128> {
    let bits = dt.size() as u32 * 8;
    let unsigned = matches!(dt, DType::U8 | DType::U16 | DType::U32 | DType::U64);
    let (min, max) = if unsigned {
        (0i128, (1i128 << bits) - 1)
    } else {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    };
    let mut v = vec![0, 1, 2, 3, 7, 100, max, max - 1, min, min + 1];
    if !unsigned {
        v.extend([-1, -2, -3, -7, -100]);
    }
    v
}

#[test]
fn int_ops_match_the_reference_formulas() {
    let int_dts = [
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
    ];
    for dt in int_dts {
        let vals = int_samples(dt);
        let (mut xs, mut ys) = (vec![], vec![]);
        for x in &vals {
            for y in &vals {
                xs.push(*x);
                ys.push(*y);
            }
        }
        let n = xs.len();
        let enc = |v: &[i128]| -> Vec<u8> {
            v.iter()
                .flat_map(|x| cast_bytes(S::I(*x), DType::I64, dt))
                .collect()
        };
        let (a, b) = (enc(&xs), enc(&ys));
        let sz = dt.size();
        for op in [
            BinOp::Add,
            BinOp::Sub,
            BinOp::Mul,
            BinOp::FloorDiv,
            BinOp::FloorMod,
            BinOp::Min,
            BinOp::Max,
        ] {
            let f = elementwise("ibin", &[dt, dt], dt, |a| {
                Expr::binary(op, a[0].clone(), a[1].clone()).unwrap()
            });
            let mut data = vec![a.clone(), b.clone(), vec![0; n * sz]];
            run_1d(&f, n, &mut data);
            for k in 0..n {
                let want = int_binary_ref(op, dt, xs[k], ys[k]);
                assert_eq!(
                    &data[2][k * sz..(k + 1) * sz],
                    &want[..],
                    "{dt} {op:?}({}, {})",
                    xs[k],
                    ys[k]
                );
            }
        }
        for op in [UnOp::Neg, UnOp::Abs] {
            let f = elementwise("iun", &[dt], dt, |a| Expr::unary(op, a[0].clone()).unwrap());
            let mut data = vec![a.clone(), vec![0; n * sz]];
            run_1d(&f, n, &mut data);
            let unsigned = matches!(dt, DType::U8 | DType::U16 | DType::U32 | DType::U64);
            for k in 0..n {
                let r = match op {
                    UnOp::Neg => -xs[k],
                    _ if unsigned => xs[k],
                    _ => xs[k].abs(),
                };
                let want = cast_bytes(S::I(r), DType::I64, dt);
                assert_eq!(
                    &data[1][k * sz..(k + 1) * sz],
                    &want[..],
                    "{dt} {op:?}({})",
                    xs[k]
                );
            }
        }
        for op in CMPOPS {
            let f = elementwise("icmp", &[dt, dt], DType::Bool, |a| {
                Expr::cmp(op, a[0].clone(), a[1].clone()).unwrap()
            });
            let mut data = vec![a.clone(), b.clone(), vec![7; n]];
            run_1d(&f, n, &mut data);
            for k in 0..n {
                assert_eq!(
                    data[2][k],
                    cmp_ref(op, xs[k], ys[k]) as u8,
                    "{dt} {op:?}({}, {})",
                    xs[k],
                    ys[k]
                );
            }
        }
        // select(x < y, x, y) with a constant mixed in: min(x, y) + 3 (wrapping).
        let f = elementwise("isel", &[dt, dt], dt, |a| {
            let lt = Expr::cmp(CmpOp::Lt, a[0].clone(), a[1].clone()).unwrap();
            let s = Expr::select(lt, a[0].clone(), a[1].clone()).unwrap();
            Expr::binary(BinOp::Add, s, Expr::const_int(3, dt)).unwrap()
        });
        let mut data = vec![a.clone(), b.clone(), vec![0; n * sz]];
        run_1d(&f, n, &mut data);
        for k in 0..n {
            let want = cast_bytes(S::I(xs[k].min(ys[k]) + 3), DType::I64, dt);
            assert_eq!(
                &data[2][k * sz..(k + 1) * sz],
                &want[..],
                "{dt} select({}, {})",
                xs[k],
                ys[k]
            );
        }
    }
}

#[test]
fn index_floordiv_and_floormod_follow_python() {
    // Python semantics on the int64 index path, including zero divisors and MIN // -1.
    let cases = [
        (7i64, 2i64),
        (-7, 2),
        (7, -2),
        (-7, -2),
        (6, 3),
        (-6, 3),
        (0, 5),
        (5, 0),
        (-5, 0),
        (i64::MIN, -1),
        (i64::MIN, 1),
    ];
    let xs: Vec<i64> = cases.iter().map(|c| c.0).collect();
    let ys: Vec<i64> = cases.iter().map(|c| c.1).collect();
    let bytes = |v: &[i64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    for (op, r) in [
        (BinOp::FloorDiv, math::floordiv_i64 as fn(i64, i64) -> i64),
        (BinOp::FloorMod, math::floormod_i64),
    ] {
        let f = elementwise("idx", &[DType::I64, DType::I64], DType::I64, |a| match op {
            BinOp::FloorDiv => a[0].floordiv(&a[1]),
            _ => a[0].floormod(&a[1]),
        });
        let mut data = vec![bytes(&xs), bytes(&ys), vec![0; 8 * xs.len()]];
        run_1d(&f, xs.len(), &mut data);
        for k in 0..xs.len() {
            let got = i64::from_le_bytes(data[2][8 * k..8 * k + 8].try_into().unwrap());
            assert_eq!(got, r(xs[k], ys[k]), "{op:?}({}, {})", xs[k], ys[k]);
        }
    }
}

/// `out[i] = sum_k A[i, k]` through a local accumulator, and `out2[i] = sum_j 2*A[i, j]`
/// through a local row of symbolic length.
#[test]
fn reduction_into_a_local_allocation() {
    let (n, m) = (Var::new("n"), Var::new("m"));
    let (i, k) = (Var::new("i"), Var::new("k"));
    let a = input(0, "A", DType::F32, vec![v(&n), v(&m)]);
    let out = output(1, "out", DType::F32, vec![v(&n)]);
    let out2 = output(2, "out2", DType::F32, vec![v(&n)]);
    let acc = buffer(3, "acc", DType::F32, vec![Expr::int(1)], BufKind::Local);
    let row = buffer(4, "row", DType::F32, vec![v(&m)], BufKind::Local);
    let zero = Expr::constant(0.0, DType::F32);
    let acc0 = || load(&acc, &[Expr::int(0)]);
    let sum1 = Stmt::seq(vec![
        store(&acc, &[Expr::int(0)], zero.clone()),
        for_(
            &k,
            v(&m),
            ForKind::Serial,
            store(
                &acc,
                &[Expr::int(0)],
                Expr::binary(BinOp::Add, acc0(), load(&a, &[v(&i), v(&k)])).unwrap(),
            ),
        ),
        store(&out, &[v(&i)], acc0()),
    ]);
    let (k2, k3) = (Var::new("k2"), Var::new("k3"));
    let two = Expr::constant(2.0, DType::F32);
    let sum2 = Stmt::seq(vec![
        for_(
            &k2,
            v(&m),
            ForKind::Serial,
            store(
                &row,
                &[v(&k2)],
                Expr::binary(BinOp::Mul, two, load(&a, &[v(&i), v(&k2)])).unwrap(),
            ),
        ),
        store(&acc, &[Expr::int(0)], zero),
        for_(
            &k3,
            v(&m),
            ForKind::Serial,
            store(
                &acc,
                &[Expr::int(0)],
                Expr::binary(BinOp::Add, acc0(), load(&row, &[v(&k3)])).unwrap(),
            ),
        ),
        store(&out2, &[v(&i)], acc0()),
    ]);
    let body = for_(
        &i,
        v(&n),
        ForKind::Serial,
        Stmt::Allocate {
            bufs: vec![acc.id],
            body: Box::new(Stmt::seq(vec![
                sum1,
                Stmt::Allocate {
                    bufs: vec![row.id],
                    body: Box::new(sum2),
                },
            ])),
        },
    );
    let f = func("rowsum", vec![a, out, out2, acc, row], vec![n, m], body);
    let k = compile(&f);
    let (nn, mm) = (9usize, 13usize);
    let av: Vec<f32> = (0..nn * mm)
        .map(|x| ((x * 7919) % 101) as f32 * 0.01 - 0.3)
        .collect();
    let mut o = vec![0f32; nn];
    let mut o2 = vec![0f32; nn];
    let frame = CallFrame {
        ptrs: vec![
            av.as_ptr() as *mut u8,
            o.as_mut_ptr() as *mut u8,
            o2.as_mut_ptr() as *mut u8,
        ]
        .into(),
        ints: vec![nn as i64, mm as i64, mm as i64, 1, 1, 1].into(),
    };
    // SAFETY: buffers match the frame.
    unsafe { k.launch(&frame, &LaunchContext::host()) }.unwrap();
    for ii in 0..nn {
        let mut s = 0f32;
        let mut s2 = 0f32;
        for kk in 0..mm {
            s += av[ii * mm + kk];
            s2 += 2.0 * av[ii * mm + kk];
        }
        assert_eq!(o[ii].to_bits(), s.to_bits(), "row {ii}");
        assert_eq!(o2[ii].to_bits(), s2.to_bits(), "row {ii}");
    }
    assert!(
        k.source().contains("rivet_alloc") || k.source().contains("call"),
        "{}",
        k.source()
    );
}

/// Runs a kernel of `parallel_program` over `nn` elements of `av`, `bv` (at least one each):
/// `out` starts as NaN and `cnt` as -1 (at least one element each, so an empty range is seen
/// to write nothing).
fn run_parallel_program(
    k: &super::CraneliftKernel,
    av: &[f32],
    bv: &[f64],
    nn: usize,
) -> (Vec<f32>, Vec<i32>) {
    assert!(av.len() >= nn.max(1) && bv.len() >= nn.max(1));
    let mut out = vec![f32::NAN; nn.max(1)];
    let mut cnt = vec![-1i32; nn.max(1)];
    let frame = CallFrame {
        ptrs: vec![
            av.as_ptr() as *mut u8,
            bv.as_ptr() as *mut u8,
            out.as_mut_ptr() as *mut u8,
            cnt.as_mut_ptr() as *mut u8,
        ]
        .into(),
        ints: vec![nn as i64, 1, 1, 1, 1].into(),
    };
    // SAFETY: every buffer holds at least the `nn` elements the frame names.
    unsafe { k.launch(&frame, &LaunchContext::host()) }.unwrap();
    (out, cnt)
}

/// A parallel loop with a captured `Let`, an inner loop, a local and a nested parallel loop,
/// against the same function with serial loops.
fn parallel_program(kind: ForKind) -> PrimFunc {
    let n = Var::new("n");
    let (i, j, t) = (Var::new("i"), Var::new("j"), Var::new("t"));
    let a = input(0, "a", DType::F32, vec![v(&n)]);
    let b = input(1, "b", DType::F64, vec![v(&n)]);
    let out = output(2, "out", DType::F32, vec![v(&n)]);
    let cnt = output(3, "cnt", DType::I32, vec![v(&n)]);
    let tmp = buffer(4, "tmp", DType::F32, vec![Expr::int(4)], BufKind::Local);
    let scale = Var::new("scale");
    let ai = load(&a, &[v(&i)]);
    let bi = Expr::cast(DType::F32, load(&b, &[v(&i)]));
    let val = Expr::binary(
        BinOp::Add,
        Expr::binary(BinOp::Mul, ai.clone(), bi).unwrap(),
        Expr::unary(UnOp::Sqrt, Expr::unary(UnOp::Abs, ai.clone()).unwrap()).unwrap(),
    )
    .unwrap();
    let val = Expr::binary(BinOp::Add, val, Expr::cast(DType::F32, v(&scale))).unwrap();
    let inner = Stmt::seq(vec![
        for_(
            &j,
            Expr::int(4),
            kind,
            store(
                &tmp,
                &[v(&j)],
                Expr::binary(BinOp::Mul, val.clone(), Expr::cast(DType::F32, v(&j))).unwrap(),
            ),
        ),
        store(
            &out,
            &[v(&i)],
            Expr::binary(
                BinOp::Add,
                load(&tmp, &[Expr::int(3)]),
                Expr::cast(DType::F32, v(&t)),
            )
            .unwrap(),
        ),
        store(
            &cnt,
            &[v(&i)],
            Expr::cast(DType::I32, v(&i).floormod(&Expr::int(1000))),
        ),
    ]);
    let body = Stmt::Let {
        var: scale.clone(),
        value: v(&n).floordiv(&Expr::int(1000)),
        body: Box::new(for_(
            &i,
            v(&n),
            kind,
            Stmt::Let {
                var: t.clone(),
                value: v(&i).mul(&Expr::int(2)),
                body: Box::new(Stmt::Allocate {
                    bufs: vec![tmp.id],
                    body: Box::new(inner),
                }),
            },
        )),
    };
    func("par", vec![a, b, out, cnt, tmp], vec![n], body)
}

#[test]
fn parallel_loop_matches_serial() {
    let nn = 100_000usize;
    let av: Vec<f32> = (0..nn)
        .map(|x| ((x * 31) % 977) as f32 * 0.013 - 5.0)
        .collect();
    let bv: Vec<f64> = (0..nn)
        .map(|x| ((x * 17) % 313) as f64 * 0.7 - 100.0)
        .collect();
    let mut results = vec![];
    for kind in [ForKind::Serial, ForKind::Parallel] {
        let f = parallel_program(kind);
        let k = compile(&f);
        if kind == ForKind::Parallel {
            assert!(k.source().contains("par.parallel0"), "{}", k.source());
        }
        results.push(run_parallel_program(&k, &av, &bv, nn));
    }
    let (s, p) = (&results[0], &results[1]);
    for x in 0..nn {
        assert_eq!(s.0[x].to_bits(), p.0[x].to_bits(), "out[{x}]");
        assert_eq!(s.1[x], p.1[x], "cnt[{x}]");
        assert_eq!(s.1[x], (x % 1000) as i32);
    }
    // Spot-check the serial result against Rust.
    for x in [0usize, 1, 777, nn - 1] {
        let val = av[x] * (bv[x] as f32) + av[x].abs().sqrt() + (nn / 1000) as f32;
        let want = val * 3.0 + (2 * x) as f32;
        assert_eq!(s.0[x].to_bits(), want.to_bits(), "out[{x}]");
    }
}

#[test]
fn parallel_loop_with_empty_and_tiny_ranges() {
    for nn in [0usize, 1, 2, 3] {
        let f = parallel_program(ForKind::Parallel);
        let k = compile(&f);
        let av = vec![1.5f32; nn.max(1)];
        let bv = vec![2.0f64; nn.max(1)];
        let (out, cnt) = run_parallel_program(&k, &av, &bv, nn);
        for (x, &c) in cnt.iter().enumerate().take(nn) {
            assert_eq!(c, x as i32);
        }
        if nn == 0 {
            assert!(out[0].is_nan());
        }
    }
}

#[test]
fn no_fma_is_emitted_for_mul_add() {
    let f = elementwise(
        "muladd",
        &[DType::F32, DType::F32, DType::F32],
        DType::F32,
        |a| {
            Expr::binary(
                BinOp::Add,
                Expr::binary(BinOp::Mul, a[0].clone(), a[1].clone()).unwrap(),
                a[2].clone(),
            )
            .unwrap()
        },
    );
    let k = compile(&f);
    assert!(!k.source().contains("fma"), "{}", k.source());
    assert!(!k.disassembly().contains("vfmadd"), "{}", k.disassembly());
    assert!(k.disassembly().contains("mul"), "{}", k.disassembly());
    // And the result rounds twice, as the interpreter's a * b + c.
    let (x, y, z) = (1.0000001f32, 1.0000001f32, -1.0000002f32);
    let mut data = vec![
        x.to_le_bytes().to_vec(),
        y.to_le_bytes().to_vec(),
        z.to_le_bytes().to_vec(),
        vec![0; 4],
    ];
    run_1d(&f, 1, &mut data);
    let got = f32::from_le_bytes(data[3][..4].try_into().unwrap());
    assert_eq!(got.to_bits(), (std::hint::black_box(x) * y + z).to_bits());
}

/// `fma(a, b, c)` on every float dtype, from the native ISA and from one without FMA
/// (Cranelift's libcall): one rounding, the interpreter's `mul_add`, bit for bit.
#[test]
fn fma_rounds_once_with_and_without_native_fma() {
    use crate::codegen::interp::InterpBackend;
    let hard = [
        (1.0000001f64, 1.0000001, -1.0000002),
        (0.1, 10.0, -1.0),
        (1e308, 10.0, -f64::INFINITY),
        (f64::NAN, 0.0, 1.0),
        (f64::INFINITY, 0.0, 1.0),
        (-0.0, 0.0, 0.0),
        (3.0, 1.0 / 3.0, -1.0),
        (65504.0, 2.0, -65504.0),
    ];
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let f = elementwise("fma", &[dt, dt, dt], dt, |a| {
            Expr::fma(a[0].clone(), a[1].clone(), a[2].clone()).unwrap()
        });
        let cols =
            |k: usize| -> Vec<f64> { hard.iter().map(|t| [t.0, t.1, t.2][k]).collect::<Vec<_>>() };
        let n = hard.len();
        let mut want = vec![cols(0), cols(1), cols(2)]
            .into_iter()
            .map(|c| encode(dt, &c))
            .collect::<Vec<_>>();
        want.push(vec![0; n * dt.size()]);
        let mut ints = vec![n as i64];
        ints.extend([1, 1, 1, 1]);
        let interp = InterpBackend::default().compile(&f).unwrap();
        let ptrs = want.iter_mut().map(|d| d.as_mut_ptr()).collect();
        // SAFETY: four compact buffers of n elements.
        unsafe {
            interp.launch(
                &CallFrame {
                    ptrs,
                    ints: ints.clone().into(),
                },
                &LaunchContext::host(),
            )
        }
        .unwrap();
        // The interpreter is `mul_add` itself.
        if dt == DType::F32 {
            let r = f32::from_le_bytes(want[3][..4].try_into().unwrap());
            let (x, y, z) = (1.0000001f32, 1.0000001f32, -1.0000002f32);
            assert_eq!(r.to_bits(), x.mul_add(y, z).to_bits());
            assert_ne!(r.to_bits(), (std::hint::black_box(x) * y + z).to_bits());
        }
        // Scalar, and vectorized (packed `fma` on f32x4 / f64x2, lane by lane without FMA;
        // float16 lanes one by one), with and without the instruction.
        for (no_fma, vectorized) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut b = if no_fma {
                CraneliftBackend::with_isa_settings(&[("has_fma", "false")]).unwrap()
            } else {
                CraneliftBackend::new().unwrap()
            };
            b.set_disassembly(true);
            let mut g = f.clone();
            if vectorized {
                g.body = g.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
                    Stmt::For {
                        var,
                        min,
                        extent,
                        body,
                        ..
                    } => Stmt::For {
                        var,
                        min,
                        extent,
                        body,
                        kind: ForKind::Vectorized,
                    },
                    other => other,
                });
                // (`elementwise` builds flattened accesses already.)
                crate::lower::vectorize::vectorize(&mut g, Some(16), false);
                assert!(g.to_string().contains("ramp("), "{g}");
            }
            crate::lower::outline::outline(&mut g);
            let k = b.compile_kernel(&g).unwrap();
            if vectorized && matches!(dt, DType::F32 | DType::F64) {
                assert!(k.source().contains("fma v"), "{}", k.source());
                assert!(
                    k.source().contains("f32x4") || k.source().contains("f64x2"),
                    "{}",
                    k.source()
                );
            }
            #[cfg(target_arch = "x86_64")]
            if no_fma {
                assert!(!k.disassembly().contains("vfmadd"), "{}", k.disassembly());
            } else if std::is_x86_feature_detected!("fma") && dt == DType::F32 {
                assert!(k.disassembly().contains("vfmadd"), "{}", k.disassembly());
            }
            let mut data = want.clone();
            data[3] = vec![0xA5; n * dt.size()];
            let ptrs = data.iter_mut().map(|d| d.as_mut_ptr()).collect();
            // SAFETY: as above.
            unsafe {
                k.launch(
                    &CallFrame {
                        ptrs,
                        ints: ints.clone().into(),
                    },
                    &LaunchContext::host(),
                )
            }
            .unwrap();
            for e in 0..n {
                let r = e * dt.size()..(e + 1) * dt.size();
                assert!(
                    same(dt, &data[3][r.clone()], &want[3][r.clone()]),
                    "{dt} no_fma={no_fma} vectorized={vectorized} case {e}: cranelift {:?}, interp {:?}",
                    read(dt, &data[3][r.clone()]),
                    read(dt, &want[3][r])
                );
            }
        }
    }
}

#[test]
fn if_else_and_let() {
    // out[i] = if i % 3 == 0 { a[i] } else if a[i] > 0 { -a[i] } else { t * 2 } with t = i + 1.
    let n = Var::new("n");
    let (i, t) = (Var::new("i"), Var::new("t"));
    let a = input(0, "a", DType::F64, vec![v(&n)]);
    let out = output(1, "out", DType::F64, vec![v(&n)]);
    let ai = load(&a, &[v(&i)]);
    let body = Stmt::If {
        cond: Expr::cmp(CmpOp::Eq, v(&i).floormod(&Expr::int(3)), Expr::int(0)).unwrap(),
        then: Box::new(store(&out, &[v(&i)], ai.clone())),
        otherwise: Some(Box::new(Stmt::Let {
            var: t.clone(),
            value: v(&i).add(&Expr::int(1)),
            body: Box::new(Stmt::If {
                cond: Expr::cmp(CmpOp::Gt, ai.clone(), Expr::constant(0.0, DType::F64)).unwrap(),
                then: Box::new(store(
                    &out,
                    &[v(&i)],
                    Expr::unary(UnOp::Neg, ai.clone()).unwrap(),
                )),
                otherwise: Some(Box::new(store(
                    &out,
                    &[v(&i)],
                    Expr::cast(DType::F64, v(&t).mul(&Expr::int(2))),
                ))),
            }),
        })),
    };
    let f = func(
        "ifelse",
        vec![a, out],
        vec![n.clone()],
        for_(&i, v(&n), ForKind::Serial, body),
    );
    let xs: Vec<f64> = (0..20)
        .map(|x| if x % 2 == 0 { x as f64 } else { -(x as f64) })
        .collect();
    let mut data = vec![
        xs.iter().flat_map(|x| x.to_le_bytes()).collect(),
        vec![0; 8 * 20],
    ];
    run_1d(&f, 20, &mut data);
    for x in 0..20 {
        let got = f64::from_le_bytes(data[1][8 * x..8 * x + 8].try_into().unwrap());
        let want = if x % 3 == 0 {
            xs[x]
        } else if xs[x] > 0.0 {
            -xs[x]
        } else {
            ((x + 1) * 2) as f64
        };
        assert_eq!(got, want, "{x}");
    }
}

#[test]
fn half_precision_arithmetic_is_computed_in_f32_and_rounded_on_store() {
    for dt in [DType::F16, DType::BF16] {
        let f = elementwise("h", &[dt, dt], dt, |a| {
            let p = Expr::binary(BinOp::Mul, a[0].clone(), a[1].clone()).unwrap();
            Expr::binary(BinOp::Add, p, Expr::unary(UnOp::Exp, a[1].clone()).unwrap()).unwrap()
        });
        let xs = [0.1, 1.5, -3.25, 100.0, 7.0, f64::NAN, -0.0, 60000.0];
        let ys = [0.3, -2.0, 0.01, 4.0, 0.5, 1.0, 2.0, 3.0];
        let (a, b) = (encode(dt, &xs), encode(dt, &ys));
        let mut data = vec![a.clone(), b.clone(), vec![0; 2 * xs.len()]];
        run_1d(&f, xs.len(), &mut data);
        for k in 0..xs.len() {
            let (S::F32(x), S::F32(y)) = (read(dt, &a[2 * k..]), read(dt, &b[2 * k..])) else {
                unreachable!()
            };
            let r = x * y + crate::codegen::cpu_lib::exp32::exp32(y);
            let want = cast_bytes(S::F32(r), DType::F32, dt);
            assert!(
                same(dt, &data[2][2 * k..2 * k + 2], &want),
                "{dt} {x}*{y}+exp({y})"
            );
        }
    }
}

#[test]
fn guarded_loads_in_select_and_logic_are_lazy() {
    // y[i] = select(i < 2, x[i], -1) and z[i] = (i < 2 && x[i] > 0) for i < 4 with x of 2
    // elements placed at the very end of a mapped page run: an eager load would read past it.
    let i = Var::new("i");
    let x = input(0, "x", DType::F32, vec![Expr::int(2)]);
    let y = output(1, "y", DType::F32, vec![Expr::int(4)]);
    let z = output(2, "z", DType::Bool, vec![Expr::int(4)]);
    let in_bounds = v(&i).lt(&Expr::int(2));
    let xi = Expr::load(x.id, vec![v(&i)], DType::F32);
    let sel = Expr::select(
        in_bounds.clone(),
        xi.clone(),
        Expr::constant(-1.0, DType::F32),
    )
    .unwrap();
    let pos = Expr::cmp(CmpOp::Gt, xi.clone(), Expr::constant(0.0, DType::F32)).unwrap();
    let and = Expr::logic(LogicOp::And, in_bounds.clone(), pos.clone()).unwrap();
    let not_in = Expr::unary(UnOp::Not, in_bounds).unwrap();
    let or = Expr::logic(LogicOp::Or, not_in, pos).unwrap();
    let body = Stmt::seq(vec![
        Stmt::Store {
            buf: y.id,
            indices: vec![v(&i)],
            value: sel,
        },
        Stmt::Store {
            buf: z.id,
            indices: vec![v(&i)],
            value: Expr::logic(LogicOp::And, and, Expr::unary(UnOp::Not, or).unwrap()).unwrap(),
        },
    ]);
    let f = func(
        "pad",
        vec![x, y, z],
        vec![],
        for_(&i, Expr::int(4), ForKind::Serial, body),
    );
    let k = compile(&f);
    // x sits at the end of its allocation; with a null x the lazy code only ever touches
    // x[0] and x[1].
    let xv = [5.0f32, -6.0];
    let mut yv = [0f32; 4];
    let mut zv = [9u8; 4];
    let frame = CallFrame {
        ptrs: vec![
            xv.as_ptr() as *mut u8,
            yv.as_mut_ptr() as *mut u8,
            zv.as_mut_ptr(),
        ]
        .into(),
        ints: vec![1, 1, 1].into(),
    };
    // SAFETY: the loads of x are guarded by i < 2.
    unsafe { k.launch(&frame, &LaunchContext::host()) }.unwrap();
    assert_eq!(yv, [5.0, -6.0, -1.0, -1.0]);
    // z = (i<2 && x>0) && !(!(i<2) || x>0) = false everywhere.
    assert_eq!(zv, [0, 0, 0, 0]);
}

#[test]
fn constants_follow_the_interpreter() {
    // Ints wrap to their dtype; float constants round once, directly from f64.
    let cases: Vec<(Expr, Vec<u8>)> = vec![
        (
            Expr::const_int(i64::MAX - 1, DType::I64),
            (i64::MAX - 1).to_le_bytes().to_vec(),
        ),
        (Expr::const_int(-3, DType::U8), vec![253u8]),
        (
            Expr::const_int(70000, DType::I16),
            (70000i64 as i16).to_le_bytes().to_vec(),
        ),
        (
            Expr::constant(0.1, DType::F16),
            half::f16::from_f32(0.1f64 as f32)
                .to_bits()
                .to_le_bytes()
                .to_vec(),
        ),
        (
            Expr::constant(0.1, DType::BF16),
            half::bf16::from_f64(0.1).to_bits().to_le_bytes().to_vec(),
        ),
        (
            Expr::constant(1e-45, DType::F32),
            (1e-45f64 as f32).to_le_bytes().to_vec(),
        ),
        (
            Expr::constant(0.1, DType::F64),
            0.1f64.to_le_bytes().to_vec(),
        ),
        (Expr::const_int(9, DType::F32), 9f32.to_le_bytes().to_vec()),
        (Expr::bool(true), vec![1u8]),
    ];
    for (c, w) in cases {
        let dt = c.dtype();
        let f = elementwise("const", &[], dt, |_| c.clone());
        let mut data = vec![vec![0u8; dt.size() * 2]];
        run_1d(&f, 2, &mut data);
        assert_eq!(&data[0][..dt.size()], &w[..], "{c} as {dt}");
        assert_eq!(&data[0][dt.size()..], &w[..], "{c} as {dt}");
    }
}

// ---- against the interpreter -------------------------------------------------------------

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// Random-ish expressions of a dtype over the inputs `ins` (one buffer per dtype), loop
/// variable `i` and let variable `t`.
struct Gen<'a> {
    rng: Rng,
    ins: &'a [Buffer],
    i: Var,
    t: Var,
    n: Var,
}

impl Gen<'_> {
    fn input(&self, dt: DType) -> Buffer {
        self.ins.iter().find(|b| b.dtype == dt).unwrap().clone()
    }

    /// An in-bounds index: i, (i * 7 + t) % n, or n - 1 - i.
    fn index(&mut self) -> Expr {
        let (i, n) = (v(&self.i), v(&self.n));
        match self.rng.below(3) {
            0 => i,
            1 => i.mul(&Expr::int(7)).add(&v(&self.t)).floormod(&n),
            _ => n.sub(&Expr::int(1)).sub(&i),
        }
    }

    fn leaf(&mut self, dt: DType) -> Expr {
        match self.rng.below(6) {
            0 => {
                let x = self.rng.pick(&[
                    0.0,
                    1.0,
                    -1.0,
                    2.5,
                    -0.0,
                    3.0,
                    1e-3,
                    100.0,
                    -7.0,
                    f64::NAN,
                    255.0,
                ]);
                Expr::constant(x, dt)
            }
            1 => Expr::cast(dt, v(&self.i).sub(&v(&self.t))),
            _ => {
                let b = self.input(dt);
                let idx = self.index();
                Expr::load(b.id, vec![idx.mul(&Expr::var(&b.strides[0]))], dt)
            }
        }
    }

    fn expr(&mut self, dt: DType, depth: u32) -> Expr {
        if depth == 0 || self.rng.below(5) == 0 {
            return self.leaf(dt);
        }
        let d = depth - 1;
        let choice = self.rng.below(10);
        if choice < 2 {
            let from = self.rng.pick(&ALL);
            return Expr::cast(dt, self.expr(from, d));
        }
        if choice == 2 {
            let c = self.expr(DType::Bool, d);
            return Expr::select(c, self.expr(dt, d), self.expr(dt, d)).unwrap();
        }
        if dt == DType::Bool {
            return match self.rng.below(4) {
                0 => Expr::unary(UnOp::Not, self.expr(dt, d)).unwrap(),
                1 => {
                    let op = self.rng.pick(&[LogicOp::And, LogicOp::Or]);
                    Expr::logic(op, self.expr(dt, d), self.expr(dt, d)).unwrap()
                }
                _ => {
                    let from = self.rng.pick(&ALL);
                    let op = self.rng.pick(&CMPOPS);
                    Expr::cmp(op, self.expr(from, d), self.expr(from, d)).unwrap()
                }
            };
        }
        if choice < 5 {
            let ops: &[UnOp] = if dt.is_float() {
                &FUNOPS
            } else {
                &[UnOp::Neg, UnOp::Abs]
            };
            let op = self.rng.pick(ops);
            return Expr::unary(op, self.expr(dt, d)).unwrap();
        }
        let ops: &[BinOp] = if dt.is_float() {
            &BINOPS
        } else {
            &[
                BinOp::Add,
                BinOp::Sub,
                BinOp::Mul,
                BinOp::FloorDiv,
                BinOp::FloorMod,
                BinOp::Min,
                BinOp::Max,
            ]
        };
        if dt.is_float() && self.rng.below(5) == 0 {
            let (a, b, c) = (self.expr(dt, d), self.expr(dt, d), self.expr(dt, d));
            return Expr::fma(a, b, c).unwrap();
        }
        let op = self.rng.pick(ops);
        Expr::binary(op, self.expr(dt, d), self.expr(dt, d)).unwrap()
    }
}

fn random_bytes(rng: &mut Rng, dt: DType, n: usize) -> Vec<u8> {
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        f64::NAN,
        f64::INFINITY,
        -f64::INFINITY,
        65504.0,
        1e-7,
        3e9,
        -2.0e19,
        127.0,
        -128.0,
    ];
    let mut out = Vec::with_capacity(n * dt.size());
    for _ in 0..n {
        let r = rng.next();
        if dt.is_float() && r.is_multiple_of(4) {
            out.extend(cast_bytes(
                S::F64(specials[(r >> 8) as usize % specials.len()]),
                DType::F64,
                dt,
            ));
        } else if dt.is_float() {
            let x = ((r >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 20.0;
            out.extend(cast_bytes(S::F64(x), DType::F64, dt));
        } else if r.is_multiple_of(3) {
            out.extend(cast_bytes(
                S::I(((r >> 8) % 11) as i128 - 5),
                DType::I64,
                dt,
            ));
        } else {
            out.extend(cast_bytes(S::I((r >> 1) as i64 as i128), DType::I64, dt));
        }
    }
    out
}

#[test]
fn matches_the_interpreter_on_random_programs() {
    use crate::codegen::interp::InterpBackend;
    let nn = 37usize;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for case in 0..400 {
        let n = Var::new("n");
        let (i, t) = (Var::new("i"), Var::new("t"));
        let ins: Vec<Buffer> = ALL
            .iter()
            .enumerate()
            .map(|(k, dt)| input(k as u32, &format!("in_{dt}"), *dt, vec![v(&n)]))
            .collect();
        let out_dts: Vec<DType> = (0..3).map(|_| rng.pick(&ALL)).collect();
        let outs: Vec<Buffer> = out_dts
            .iter()
            .enumerate()
            .map(|(k, dt)| output((ALL.len() + k) as u32, &format!("out{k}"), *dt, vec![v(&n)]))
            .collect();
        let mut g = Gen {
            rng: Rng(rng.next() | 1),
            ins: &ins,
            i: i.clone(),
            t: t.clone(),
            n: n.clone(),
        };
        let stores: Vec<Stmt> = outs
            .iter()
            .map(|o| store(o, &[v(&i)], g.expr(o.dtype, 3)))
            .collect();
        let kind = if case % 3 == 0 {
            ForKind::Parallel
        } else {
            ForKind::Serial
        };
        let body = for_(
            &i,
            v(&n),
            kind,
            Stmt::Let {
                var: t.clone(),
                value: v(&i).floordiv(&Expr::int(3)),
                body: Box::new(Stmt::seq(stores)),
            },
        );
        let mut bufs = ins.clone();
        bufs.extend(outs.iter().cloned());
        let f = func(&format!("random{case}"), bufs, vec![n.clone()], body);
        let inputs: Vec<Vec<u8>> = ALL
            .iter()
            .map(|dt| random_bytes(&mut rng, *dt, nn))
            .collect();
        let mut results = vec![];
        let kernels: Vec<Box<dyn Kernel>> = vec![
            InterpBackend::default()
                .compile(&f)
                .unwrap_or_else(|e| panic!("interp rejects {f:?}: {e}")),
            Box::new(compile(&f)),
        ];
        for k in kernels {
            let mut data = inputs.clone();
            data.extend(out_dts.iter().map(|dt| vec![0xA5u8; nn * dt.size()]));
            let ptrs = data.iter_mut().map(|d| d.as_mut_ptr()).collect();
            let mut ints = vec![nn as i64];
            ints.extend(std::iter::repeat_n(1, f.params.len()));
            // SAFETY: every buffer holds nn compact elements.
            unsafe {
                k.launch(
                    &CallFrame {
                        ptrs,
                        ints: ints.into(),
                    },
                    &LaunchContext::host(),
                )
            }
            .unwrap();
            results.push(data.split_off(ALL.len()));
        }
        for (o, dt) in out_dts.iter().enumerate() {
            for e in 0..nn {
                let (a, b) = (
                    &results[0][o][e * dt.size()..(e + 1) * dt.size()],
                    &results[1][o][e * dt.size()..(e + 1) * dt.size()],
                );
                assert!(
                    same(*dt, a, b),
                    "case {case}, out{o}[{e}] ({dt}): interp {:?}, cranelift {:?}\n{}",
                    read(*dt, a),
                    read(*dt, b),
                    f
                );
            }
        }
    }
}

#[test]
fn parallel_loop_uses_a_local_allocated_outside_and_a_nonzero_min() {
    // tmp = alloc[n]; parallel for i in 3..n: tmp[i] = a[i] * 2; for i in 3..n: out[i] = tmp[i] + 1
    let n = Var::new("n");
    let (i, j) = (Var::new("i"), Var::new("j"));
    let a = input(0, "a", DType::I64, vec![v(&n)]);
    let out = output(1, "out", DType::I64, vec![v(&n)]);
    let tmp = buffer(2, "tmp", DType::I64, vec![v(&n)], BufKind::Local);
    let loop_from_3 = |x: &Var, kind, body| Stmt::For {
        var: x.clone(),
        min: Expr::int(3),
        extent: v(&n).sub(&Expr::int(3)),
        kind,
        body: Box::new(body),
    };
    let body = Stmt::Allocate {
        bufs: vec![tmp.id],
        body: Box::new(Stmt::seq(vec![
            loop_from_3(
                &i,
                ForKind::Parallel,
                store(&tmp, &[v(&i)], load(&a, &[v(&i)]).mul(&Expr::int(2))),
            ),
            loop_from_3(
                &j,
                ForKind::Serial,
                store(&out, &[v(&j)], load(&tmp, &[v(&j)]).add(&Expr::int(1))),
            ),
        ])),
    };
    let f = func("local_par", vec![a, out, tmp], vec![n], body);
    let nn = 10_000usize;
    let av: Vec<i64> = (0..nn as i64).map(|x| x * x - 77).collect();
    let mut data = vec![
        av.iter().flat_map(|x| x.to_le_bytes()).collect(),
        vec![0u8; 8 * nn],
    ];
    run_1d(&f, nn, &mut data);
    for x in 0..nn {
        let got = i64::from_le_bytes(data[1][8 * x..8 * x + 8].try_into().unwrap());
        assert_eq!(got, if x < 3 { 0 } else { av[x] * 2 + 1 }, "out[{x}]");
    }
}

/// Locals of constant size up to `STACK_LOCAL_MAX` live in the stack frame (no helper call),
/// larger ones in the per-thread arena; both start zeroed (the IR's meaning, which the body
/// relies on: `T[j] = T[j] + a[i]`), per iteration of a parallel loop, as in the interpreter.
#[test]
fn locals_on_the_stack_or_the_arena_start_zeroed() {
    use crate::codegen::interp::InterpBackend;
    for (k, on_stack) in [
        (1i64, true),
        (3, true),
        (512, true),
        (513, false),
        (5000, false),
    ] {
        let n = Var::new("n");
        let (i, j) = (Var::new("i"), Var::new("j"));
        let a = input(0, "a", DType::F32, vec![v(&n)]);
        let out = output(1, "out", DType::F32, vec![v(&n)]);
        let t = buffer(2, "T", DType::F32, vec![Expr::int(k)], BufKind::Local);
        let tj = Expr::load(t.id, vec![v(&j)], DType::F32);
        let body = for_(
            &i,
            v(&n),
            ForKind::Parallel,
            Stmt::Allocate {
                bufs: vec![t.id],
                body: Box::new(Stmt::Seq(vec![
                    for_(
                        &j,
                        Expr::int(k),
                        ForKind::Serial,
                        Stmt::Store {
                            buf: t.id,
                            indices: vec![v(&j)],
                            value: Expr::binary(BinOp::Add, tj.clone(), load(&a, &[v(&i)]))
                                .unwrap(),
                        },
                    ),
                    store(
                        &out,
                        &[v(&i)],
                        Expr::load(t.id, vec![Expr::int(k - 1)], DType::F32),
                    ),
                ])),
            },
        );
        let f = func("locals", vec![a, out, t], vec![n], body);
        let kern = compile(&f);
        // (Helpers print as numbered functions: look for the 64-byte aligned slot instead.)
        let slot = format!("explicit_slot {}, align = 64", 4 * k);
        assert_eq!(
            kern.source().contains(&slot),
            on_stack,
            "k={k}:\n{}",
            kern.source()
        );
        let nn = 300usize;
        let av: Vec<f32> = (0..nn).map(|x| x as f32 * 0.5 - 7.0).collect();
        let mut results = Vec::new();
        let interp = InterpBackend::default().compile(&f).unwrap();
        for kk in [&kern as &dyn Kernel, interp.as_ref()] {
            // Twice: the second call reuses the arena's (dirty) blocks and the stack.
            for _ in 0..2 {
                let mut data = vec![av.clone(), vec![f32::NAN; nn]];
                let ptrs = data.iter_mut().map(|d| d.as_mut_ptr() as *mut u8).collect();
                // SAFETY: two compact buffers of nn f32.
                unsafe {
                    kk.launch(
                        &CallFrame {
                            ptrs,
                            ints: vec![nn as i64, 1, 1].into(),
                        },
                        &LaunchContext::host(),
                    )
                }
                .unwrap();
                assert_eq!(data[1], av, "k={k}");
                results.push(data.pop().unwrap());
            }
        }
    }
}

// `split_constant` finds the constant terms of an index anywhere in its tree of additions (a
// vector of a row at `(i * s0) + ((ko * 16) + 4)` gets the displacement 4), and declines when
// there is none, when they cancel, or when their sum overflows.
#[test]
fn split_constant_gathers_nested_constant_terms() {
    use super::expr::split_constant;
    let (i, s0, ko) = (Var::new("i"), Var::new("s0"), Var::new("ko"));
    let row = Expr::var(&i).mul(&Expr::var(&s0));
    let step = Expr::var(&ko).mul(&Expr::int(16));
    let (rest, k) = split_constant(&row.add(&step.add(&Expr::int(4)))).unwrap();
    assert_eq!((rest.to_string(), k), (row.add(&step).to_string(), 4));
    let (rest, k) = split_constant(&Expr::var(&i).sub(&Expr::int(3)).add(&Expr::int(7))).unwrap();
    assert_eq!((rest.to_string(), k), (Expr::var(&i).to_string(), 4));
    assert!(split_constant(&row.add(&step)).is_none(), "no constant");
    let cancel = Expr::var(&i).add(&Expr::int(5)).sub(&Expr::int(5));
    assert!(split_constant(&cancel).is_none(), "constants that cancel");
    let over = Expr::var(&i).add(&Expr::int(i64::MAX)).add(&Expr::int(1));
    assert!(
        split_constant(&over).is_none(),
        "a constant sum past i64::MAX"
    );
    let min = Expr::var(&i).sub(&Expr::int(i64::MIN));
    assert!(split_constant(&min).is_none(), "0 - i64::MIN overflows");
}

// `too_small_for_the_pool`: a parallel loop runs inline only when every extent in it is a
// constant and its stores are counted exactly below twice the pool's chunk minimum; symbolic
// extents, allocations, overflowing products and big nests go to the pool.
#[test]
fn only_small_constant_parallel_loops_run_inline() {
    use super::parallel::too_small_for_the_pool;
    use crate::ir::BufId;
    let store = |v: &Var| Stmt::Store {
        buf: BufId(0),
        indices: vec![Expr::var(v)],
        value: Expr::constant(1.0, DType::F32),
    };
    let looped = |v: &Var, extent: Expr, body: Stmt| Stmt::For {
        var: v.clone(),
        min: Expr::int(0),
        extent,
        body: Box::new(body),
        kind: ForKind::Serial,
    };
    let (i, j) = (Var::new("i"), Var::new("j"));
    let nest = |a: i64, b: i64| looped(&i, Expr::int(a), looped(&j, Expr::int(b), store(&j)));
    assert!(too_small_for_the_pool(&nest(32, 16)), "512 stores");
    assert!(too_small_for_the_pool(&nest(0, 16)), "an empty loop");
    assert!(
        !too_small_for_the_pool(&nest(1024, 1024)),
        "a million stores"
    );
    assert!(
        !too_small_for_the_pool(&nest(1 << 40, 1 << 40)),
        "an overflowing product"
    );
    assert!(!too_small_for_the_pool(&nest(i64::MAX, 1)));
    assert!(
        too_small_for_the_pool(&nest(i64::MIN, 1 << 40)),
        "a negative extent runs nothing"
    );
    assert!(!too_small_for_the_pool(&nest(1 << 62, 1 << 62)));
    let n = Var::new("n");
    assert!(
        !too_small_for_the_pool(&looped(&i, Expr::var(&n), store(&i))),
        "a symbolic extent"
    );
    let alloc = Stmt::Allocate {
        bufs: vec![BufId(1)],
        body: Box::new(store(&i)),
    };
    assert!(
        !too_small_for_the_pool(&looped(&i, Expr::int(4), alloc)),
        "an allocation"
    );
    let inner_parallel = Stmt::For {
        var: j.clone(),
        min: Expr::int(0),
        extent: Expr::int(4),
        body: Box::new(store(&j)),
        kind: ForKind::Parallel,
    };
    assert!(
        !too_small_for_the_pool(&looped(&i, Expr::int(4), inner_parallel)),
        "a nested parallel loop"
    );
    // Both arms of an `if` count.
    let two = Stmt::If {
        cond: Expr::var(&i).lt(&Expr::int(3)),
        then: Box::new(nest(100, 100)),
        otherwise: Some(Box::new(nest(100, 100))),
    };
    assert!(too_small_for_the_pool(&nest(100, 100)));
    assert!(
        !too_small_for_the_pool(&looped(&j, Expr::int(2), two)),
        "40,000 stores"
    );
}
