//! Property tests of `vectorize` (the `lower::vectorize` pass, the interpreter's lane-by-lane
//! vector IR and the Cranelift backend's SIMD code), with the interpreter running the program
//! without vector IR as the oracle.
//!
//! Random programs `C[i, j] = e(i, j)` over a rows x n domain, `e` a tree of arithmetic,
//! math functions, min/max, selects and casts over leaves that are contiguous in `j`
//! (`A[i, j]`), reversed (`A[i, n - 1 - j]`: a gather), invariant (`B[i]`: a broadcast), the
//! index `j` itself and constants; dtypes float32, float64, int8/16/32/64, uint8/16; extents
//! with every tail (1, 3, 4, 5, 17, 1023 and random ones); `vectorize` of `j` directly or of
//! the inner loop of a split (factors dividing `n` or not); layouts compact, transposed,
//! stepped and broadcast (stride 0) for the inputs, compact or stepped for the output.
//!
//! For each case the output's whole base buffer (elements outside the view included, poisoned
//! before the call) must be identical, bit for bit (NaNs equal whatever their payload), for:
//! the interpreter with no vector IR, the Cranelift backend (vector IR, SIMD where it can), and
//! the interpreter running the very vector IR Cranelift compiled (`Options::vector_bytes`).

use proptest::prelude::*;
use proptest::test_runner::Config;
use rivet_compiler::build::build_with;
use rivet_compiler::ir::{BinOp, CmpOp, Expr, UnOp};
use rivet_compiler::lower::Options;
use rivet_compiler::te::{self, compute, placeholder, Tensor as Te};
use rivet_compiler::{Schedule, Target};
use rivet_runtime::{DType, Tensor, Value};

const DTYPES: [DType; 7] = [
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I16,
    DType::U8,
    DType::I64,
    DType::U16,
];

#[derive(Clone, Debug)]
enum E {
    Contig,
    Reversed,
    Row,
    Index,
    Const(i8),
    Un(u8, Box<E>),
    Bin(u8, Box<E>, Box<E>),
    Sel(Box<E>, Box<E>),
    CastVia(u8, Box<E>),
    /// A fused multiply-add node (floats; `a * b + c` for integers).
    Fma(Box<E>, Box<E>, Box<E>),
}

fn tree() -> impl Strategy<Value = E> {
    let leaf = prop_oneof![
        3 => Just(E::Contig),
        1 => Just(E::Reversed),
        1 => Just(E::Row),
        1 => Just(E::Index),
        1 => any::<i8>().prop_map(E::Const),
    ];
    leaf.prop_recursive(3, 12, 2, |inner| {
        prop_oneof![
            1 => (any::<u8>(), inner.clone()).prop_map(|(o, a)| E::Un(o, Box::new(a))),
            3 => (any::<u8>(), inner.clone(), inner.clone())
                .prop_map(|(o, a, b)| E::Bin(o, Box::new(a), Box::new(b))),
            1 => (inner.clone(), inner.clone()).prop_map(|(a, b)| E::Sel(Box::new(a), Box::new(b))),
            1 => (any::<u8>(), inner.clone()).prop_map(|(o, a)| E::CastVia(o, Box::new(a))),
            1 => (inner.clone(), inner.clone(), inner)
                .prop_map(|(a, b, c)| E::Fma(Box::new(a), Box::new(b), Box::new(c))),
        ]
    })
}

/// Which of A and B the tree reads.
fn uses(e: &E) -> (bool, bool) {
    match e {
        E::Contig | E::Reversed => (true, false),
        E::Row => (false, true),
        E::Index | E::Const(_) => (false, false),
        E::Un(_, a) | E::CastVia(_, a) => uses(a),
        E::Bin(_, a, b) | E::Sel(a, b) => {
            let (x, y) = (uses(a), uses(b));
            (x.0 || y.0, x.1 || y.1)
        }
        E::Fma(a, b, c) => {
            let (x, y, z) = (uses(a), uses(b), uses(c));
            (x.0 || y.0 || z.0, x.1 || y.1 || z.1)
        }
    }
}

struct Leaves<'a> {
    a: &'a Te,
    b: &'a Te,
    n: i64,
}

fn lower_e(e: &E, i: &Expr, j: &Expr, dt: DType, l: &Leaves) -> Expr {
    match e {
        E::Contig => l.a.at([i, j]),
        E::Reversed => l.a.at((i, (l.n - 1) - j)),
        E::Row => l.b.at([i]),
        E::Index => te::cast(dt, j),
        E::Const(c) => Expr::constant(f64::from(*c) / if dt.is_float() { 4.0 } else { 1.0 }, dt),
        E::Un(o, a) => {
            let x = lower_e(a, i, j, dt, l);
            let ops: &[UnOp] = if dt.is_float() {
                &[
                    UnOp::Neg,
                    UnOp::Abs,
                    UnOp::Sqrt,
                    UnOp::Exp,
                    UnOp::Floor,
                    UnOp::Tanh,
                ]
            } else {
                &[UnOp::Neg, UnOp::Abs]
            };
            Expr::unary(ops[*o as usize % ops.len()], x).unwrap()
        }
        E::Bin(o, a, b) => {
            let (x, y) = (lower_e(a, i, j, dt, l), lower_e(b, i, j, dt, l));
            let ops: &[BinOp] = if dt.is_float() {
                &[
                    BinOp::Add,
                    BinOp::Sub,
                    BinOp::Mul,
                    BinOp::Div,
                    BinOp::Min,
                    BinOp::Max,
                    BinOp::FloorMod,
                ]
            } else {
                &[
                    BinOp::Add,
                    BinOp::Sub,
                    BinOp::Mul,
                    BinOp::Min,
                    BinOp::Max,
                    BinOp::FloorDiv,
                    BinOp::FloorMod,
                ]
            };
            Expr::binary(ops[*o as usize % ops.len()], x, y).unwrap()
        }
        E::Sel(a, b) => {
            let (x, y) = (lower_e(a, i, j, dt, l), lower_e(b, i, j, dt, l));
            let c = Expr::cmp(CmpOp::Gt, x.clone(), y.clone()).unwrap();
            Expr::select(c, x, y).unwrap()
        }
        E::CastVia(o, a) => {
            let x = lower_e(a, i, j, dt, l);
            let via = DTYPES[*o as usize % DTYPES.len()];
            Expr::cast(dt, Expr::cast(via, x))
        }
        E::Fma(a, b, c) => {
            let (x, y, z) = (
                lower_e(a, i, j, dt, l),
                lower_e(b, i, j, dt, l),
                lower_e(c, i, j, dt, l),
            );
            if dt.is_float() {
                Expr::fma(x, y, z).unwrap()
            } else {
                x * y + z
            }
        }
    }
}

#[derive(Clone, Debug)]
struct Case {
    dt: DType,
    rows: i64,
    n: i64,
    e: E,
    /// 0: vectorize j; k > 0: split j by k, vectorize the inner loop.
    split: i64,
    /// 0 compact, 1 transposed, 2 stepped (stride 2 along j).
    a_layout: u8,
    /// B broadcast with stride 0.
    b_bcast: bool,
    /// C written through a view with stride 2 along j.
    c_stepped: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..DTYPES.len(),
        1i64..4,
        prop_oneof![
            prop::sample::select(vec![1i64, 3, 4, 5, 17, 1023]),
            1i64..40
        ],
        tree(),
        prop::sample::select(vec![0i64, 0, 2, 3, 4, 8, 16]),
        0u8..3,
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(d, rows, n, e, split, a_layout, b_bcast, c_stepped, seed)| Case {
                dt: DTYPES[d],
                rows,
                n,
                e,
                split,
                a_layout,
                b_bcast,
                c_stepped,
                seed,
            },
        )
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A tensor of `dt` holding `vals` (floats as given; ints wrapped from the value as i64).
fn tensor(dt: DType, vals: &[f64], shape: &[i64]) -> Tensor {
    macro_rules! ints {
        ($t:ty) => {
            Tensor::from_slice(
                &vals.iter().map(|&v| v as i64 as $t).collect::<Vec<$t>>(),
                shape,
            )
        };
    }
    match dt {
        DType::F32 => {
            Tensor::from_slice(&vals.iter().map(|&v| v as f32).collect::<Vec<_>>(), shape)
        }
        DType::F64 => Tensor::from_slice(vals, shape),
        DType::I8 => ints!(i8),
        DType::I16 => ints!(i16),
        DType::I32 => ints!(i32),
        DType::I64 => ints!(i64),
        DType::U8 => ints!(u8),
        DType::U16 => ints!(u16),
        DType::U32 => ints!(u32),
        _ => unreachable!(),
    }
    .unwrap()
}

/// The elements' bits, NaNs made canonical.
fn bits(t: &Tensor) -> Vec<u64> {
    let nan = |b: u64, f: bool| if f { u64::MAX } else { b };
    macro_rules! ints {
        ($t:ty) => {
            t.to_vec::<$t>()
                .unwrap()
                .iter()
                .map(|&x| x as u64)
                .collect()
        };
    }
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| nan(x.to_bits() as u64, x.is_nan()))
            .collect(),
        DType::F64 => t
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .map(|x| nan(x.to_bits(), x.is_nan()))
            .collect(),
        DType::I8 => ints!(i8),
        DType::I16 => ints!(i16),
        DType::I32 => ints!(i32),
        DType::I64 => ints!(i64),
        DType::U8 => ints!(u8),
        DType::U16 => ints!(u16),
        DType::U32 => ints!(u32),
        d => panic!("dtype {d}"),
    }
}

fn values(dt: DType, count: usize, rng: &mut Rng) -> Vec<f64> {
    (0..count)
        .map(|_| {
            let r = rng.next();
            if dt.is_float() {
                // Quarters in [-64, 64), now and then a special value.
                match r % 29 {
                    0 => -0.0,
                    1 => f64::INFINITY,
                    2 => f64::NAN,
                    _ => ((r >> 8) % 512) as f64 / 4.0 - 64.0,
                }
            } else {
                (r >> 3) as i64 as f64
            }
        })
        .collect()
}

/// Builds the case's program with `target` and `opts` and returns the output's base buffer
/// bits after one call on the case's layouts.
fn run(c: &Case, target: &str, opts: Options) -> Result<Vec<u64>, String> {
    let (rows, n, dt) = (c.rows, c.n, c.dt);
    let a = placeholder([rows, n], dt, "A").unwrap();
    let b = placeholder([rows], dt, "B").unwrap();
    let out = compute(
        [rows, n],
        |[i, j]| {
            let l = Leaves { a: &a, b: &b, n };
            lower_e(&c.e, &i, &j, dt, &l)
        },
        "C",
    )
    .map_err(|e| e.to_string())?;
    let mut s = Schedule::new(&[out.clone()]).unwrap();
    let j = out.axis()[1].var.clone();
    let st = s.stage(&out).unwrap();
    if c.split > 0 {
        let (_, ji) = st.split(&j, Some(Expr::int(c.split)), None).unwrap();
        st.vectorize(&ji).unwrap();
    } else {
        st.vectorize(&j).unwrap();
    }
    let (use_a, use_b) = uses(&c.e);
    let mut params = Vec::new();
    if use_a {
        params.push(a);
    }
    if use_b {
        params.push(b);
    }
    params.push(out);
    let m = build_with(&s, &params, target, "f", opts).map_err(|e| e.to_string())?;
    let f = m.get_function("f").unwrap();

    let mut rng = Rng(c.seed | 1);
    let av = values(dt, (rows * n * 2) as usize, &mut rng);
    let a_t = match c.a_layout {
        0 => tensor(dt, &av[..(rows * n) as usize], &[rows, n]),
        1 => tensor(dt, &av[..(rows * n) as usize], &[n, rows])
            .as_strided(&[rows, n], &[1, rows], 0)
            .unwrap(),
        _ => tensor(dt, &av, &[rows, 2 * n])
            .as_strided(&[rows, n], &[2 * n, 2], 1)
            .unwrap(),
    };
    let bv = values(dt, rows as usize, &mut rng);
    let b_t = if c.b_bcast {
        tensor(dt, &bv[..1], &[1])
            .as_strided(&[rows], &[0], 0)
            .unwrap()
    } else {
        tensor(dt, &bv, &[rows])
    };
    let poison = values(dt, (rows * n * 2) as usize, &mut rng);
    let (base, c_t) = if c.c_stepped {
        let base = tensor(dt, &poison, &[rows, 2 * n]);
        let v = base.as_strided(&[rows, n], &[2 * n, 2], 0).unwrap();
        (base, v)
    } else {
        let base = tensor(dt, &poison[..(rows * n) as usize], &[rows, n]);
        (base.clone(), base)
    };
    let mut args = Vec::new();
    if use_a {
        args.push(Value::Tensor(a_t));
    }
    if use_b {
        args.push(Value::Tensor(b_t));
    }
    args.push(Value::Tensor(c_t));
    f.call(&args)
        .map_err(|e| format!("{target}: call failed: {e}"))?;
    Ok(bits(&base))
}

fn check(c: &Case) -> Result<(), TestCaseError> {
    let plain = Options {
        vector_bytes: Some(0),
        ..Options::default()
    };
    let want = match run(c, "interp", plain) {
        Ok(w) => w,
        Err(e) => return Err(TestCaseError::fail(e)),
    };
    let cpu = run(c, "cpu", Options::default()).map_err(TestCaseError::fail)?;
    let vec_interp = run(
        c,
        "interp",
        Options {
            vector_bytes: Some(16),
            ..Options::default()
        },
    )
    .map_err(TestCaseError::fail)?;
    for (what, got) in [("cpu", &cpu), ("interp running vector IR", &vec_interp)] {
        if let Some(k) = (0..want.len()).find(|&k| want[k] != got[k]) {
            return Err(TestCaseError::fail(format!(
                "{what} differs from the scalar interpreter at base element {k}: {:#x} vs {:#x}",
                got[k], want[k]
            )));
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

proptest! {
    #![proptest_config(Config { cases: cases(), failure_persistence: None, ..Config::default() })]

    #[test]
    fn vector_code_matches_the_scalar_interpreter(c in case()) {
        check(&c)?;
    }
}

/// `C[i] = body([X0[i], X1[i], ...])` over `n` elements of `dt` with `i` vectorized: the
/// tensors `[X0, .., C]` (call order) and the schedule.
fn vectorized_1d(
    n: i64,
    dt: DType,
    inputs: usize,
    body: impl Fn(Vec<Expr>) -> Expr,
) -> (Vec<Te>, Schedule) {
    let mut args: Vec<Te> = (0..inputs)
        .map(|k| placeholder([n], dt, &format!("X{k}")).unwrap())
        .collect();
    let c = compute(
        [n],
        |[i]| body(args.iter().map(|x| x.at([&i])).collect()),
        "C",
    )
    .unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let j = c.axis()[0].var.clone();
    s.stage(&c).unwrap().vectorize(&j).unwrap();
    args.push(c);
    (args, s)
}

/// The Cranelift code of an elementwise f32 add holds packed SIMD: 16-byte loads, an `fadd`
/// of `f32x4` and a 16-byte store.
#[test]
fn elementwise_add_is_packed_simd() {
    let (args, s) = vectorized_1d(1000, DType::F32, 2, |x| &x[0] + &x[1]);
    let m = build_with(&s, &args, "cpu", "add", Options::default()).unwrap();
    let clif = m.get_source("cranelift").unwrap();
    for want in ["load.f32x4", "fadd", "store notrap"] {
        assert!(clif.contains(want), "no `{want}` in:\n{clif}");
    }
    assert!(clif.contains("f32x4"), "{clif}");
    let ir = m.get_source("ir").unwrap();
    assert!(ir.contains("ramp("), "{ir}");
}

/// `op` (float32) of a vectorized 1-d stage over `x`, run on `target`.
fn vector_unary(op: UnOp, x: &[f32], target: &str) -> Vec<f32> {
    let n = x.len() as i64;
    let (args, s) = vectorized_1d(n, DType::F32, 1, |x| Expr::unary(op, x[0].clone()).unwrap());
    let f = build_with(&s, &args, target, "e", Options::default())
        .unwrap()
        .get_function("e")
        .unwrap();
    let out = f
        .call(&[rivet_runtime::Value::Tensor(
            rivet_runtime::Tensor::from_slice(x, &[n]).unwrap(),
        )])
        .unwrap();
    out.as_tensor().unwrap().to_vec::<f32>().unwrap()
}

fn assert_same_bits(x: &[f32], got: &[f32], want: impl Fn(usize) -> f32, what: &str) {
    for k in 0..x.len() {
        let w = want(k);
        assert!(
            got[k].to_bits() == w.to_bits() || (got[k].is_nan() && w.is_nan()),
            "f({:e} = {:#x}) = {:e} on cpu, {:e} by {what}",
            x[k],
            x[k].to_bits(),
            got[k],
            w
        );
    }
}

/// float32 `exp` under `vectorize` is rivet's `exp32` (`codegen::cpu_lib::exp32`) in every path: one
/// `rivet_exp_run` call over the run where the CPU has AVX-512 (`cranelift/exp_run.rs`), else
/// packed inline (`vector_exp.rs`: `exp32::fast` as f32x4 instructions, `rivet_expf4` only in
/// a cold block for lanes outside the fast range). Computes the interpreter's bits: tails,
/// slow lanes mixed into vectors, the fast range's edges, and every 130,048th float32 bit
/// pattern of it (127 * 1024), both signs (every one: the `--ignored` test below).
/// `exp_inline_path_in_a_child` runs this again with `RIVET_EXP_RUN=inline`.
#[test]
fn float32_exp_is_exact_in_every_path() {
    let (args, s) = vectorized_1d(1003, DType::F32, 1, |x| te::exp(&x[0]));
    let m = build_with(&s, &args, "cpu", "e", Options::default()).unwrap();
    let clif = m.get_source("cranelift").unwrap();
    if rivet_compiler::codegen::cpu_lib::exp32::run_wide() {
        // One call with (y, x, n, s) and no packed exp code.
        assert!(clif.contains("(i64, i64, i64, f32) system_v"), "{clif}");
        assert!(!clif.contains("vall_true"), "{clif}");
    } else {
        assert!(!clif.contains("fdiv"), "no division in exp32: {clif}");
        assert!(clif.contains("vall_true"), "{clif}");
        // `rivet_expf4(ptr) -> i32` is the only helper of that signature here (the cold block's).
        assert!(clif.contains("(i64) -> i32 system_v"), "{clif}");
    }
    let mut x: Vec<f32> = (0..1003)
        .map(|k| match k % 50 {
            0 => f32::NAN,
            1 => 100.0,
            2 => -120.0,
            3 => 1e-9,
            4 => f32::INFINITY,
            5 => -0.0,
            6 => -95.0,
            7 => 88.5,
            _ => (k as f32 - 500.0) / 7.0,
        })
        .collect();
    let (cpu, interp) = (
        vector_unary(UnOp::Exp, &x, "cpu"),
        vector_unary(UnOp::Exp, &x, "interp"),
    );
    assert_same_bits(&x, &cpu, |k| interp[k], "the interpreter");
    // The fast range's edges, either side, then a sweep of it.
    use rivet_compiler::codegen::cpu_lib::exp32::{exp32, FAST_HI, FAST_LO};
    x.clear();
    for t in [
        FAST_LO.to_bits(),
        FAST_HI.to_bits(),
        0x3400_0000,
        0x8000_0001,
    ] {
        for d in 0..3u32 {
            x.push(f32::from_bits(t.wrapping_sub(1).wrapping_add(d)));
        }
    }
    let mut b = 0x0000_0001u32;
    while b < FAST_HI.to_bits() {
        let v = f32::from_bits(b);
        x.push(v);
        if -v > FAST_LO {
            x.push(-v);
        }
        b += 127 * 1024;
    }
    let (cpu, interp) = (
        vector_unary(UnOp::Exp, &x, "cpu"),
        vector_unary(UnOp::Exp, &x, "interp"),
    );
    assert_same_bits(&x, &cpu, |k| interp[k], "the interpreter");
    assert_same_bits(&x, &cpu, |k| exp32(x[k]), "exp32");
}

/// The test above and the default softmax's with the inline f32x4 `exp`
/// (`RIVET_EXP_RUN=inline`, read once per process: in a child), so a machine with AVX-512
/// covers both paths.
#[test]
fn exp_inline_path_in_a_child() {
    rivet_tests::run_in_child(
        "float32_exp_is_exact_in_every_path",
        &[("RIVET_EXP_RUN", "inline")],
    );
}

/// `Y[j] = exp(X[j] - s)` and `exp(X[j])` runs through the idiom: in place, at a row offset
/// (2-d, the row's base is not 0), with `s` a loaded scalar, for run lengths around the 16
/// lanes of a chunk (masked tails) and 4 of a vector; bits against the interpreter.
#[test]
fn exp_runs_in_place_and_at_row_offsets_match_the_interpreter() {
    for n in [1i64, 3, 4, 15, 16, 17, 33, 97, 1023] {
        let rows = 3i64;
        let x = placeholder([rows, n], DType::F32, "X").unwrap();
        let sh = placeholder([rows], DType::F32, "S").unwrap();
        let y = compute(
            [rows, n],
            |[i, j]| te::exp(x.at([&i, &j]) - sh.at([i])),
            "Y",
        )
        .unwrap();
        let z = compute([rows, n], |[i, j]| te::exp(x.at([i, j])), "Z").unwrap();
        let mut rng = Rng(n as u64 | 1);
        let xs: Vec<f32> = (0..rows * n)
            .map(|k| match k % 29 {
                0 => f32::NAN,
                1 => 99.0,
                _ => (rng.next() % 60_000) as f32 / 1000.0 - 30.0,
            })
            .collect();
        let ss: Vec<f32> = vec![0.5, -3.0, 7.25];
        for (out, name) in [(&y, "y"), (&z, "z")] {
            let mut s = Schedule::new(&[out.clone()]).unwrap();
            let ax = out.axis()[1].var.clone();
            s.stage(out).unwrap().vectorize(&ax).unwrap();
            let args = if name == "y" {
                vec![x.clone(), sh.clone(), out.clone()]
            } else {
                vec![x.clone(), out.clone()]
            };
            let run = |target: &str| {
                let f = build_with(&s, &args, target, name, Options::default())
                    .unwrap()
                    .get_function(name)
                    .unwrap();
                let xt = rivet_runtime::Tensor::from_slice(&xs, &[rows, n]).unwrap();
                let mut call = vec![rivet_runtime::Value::Tensor(xt)];
                if name == "y" {
                    call.push(rivet_runtime::Value::Tensor(
                        rivet_runtime::Tensor::from_slice(&ss, &[rows]).unwrap(),
                    ));
                }
                let out = f.call(&call).unwrap();
                out.as_tensor().unwrap().to_vec::<f32>().unwrap()
            };
            let (cpu, interp) = (run("cpu"), run("interp"));
            assert_same_bits(&xs, &cpu, |k| interp[k], &format!("{name}, n {n}"));
        }
    }
}

/// Every float32 of `exp32`'s fast range, both signs (about two billion values, in 2^24
/// chunks; minutes in release):
/// `cargo test --release -p rivet-tests --test schedule_vectorize_props -- --ignored`.
/// The scalar `exp` of every backend and the interpreter is `exp32` (`codegen::cpu_lib::math`).
#[test]
#[ignore]
fn float32_exp_is_exact_on_every_fast_range_float() {
    use rivet_compiler::codegen::cpu_lib::exp32::{exp32, FAST_HI, FAST_LO};
    let mut x = Vec::with_capacity(1 << 24);
    let flush = |x: &mut Vec<f32>| {
        let cpu = vector_unary(UnOp::Exp, x, "cpu");
        assert_same_bits(x, &cpu, |k| exp32(x[k]), "exp32");
        x.clear();
    };
    let mut b = 0u32;
    while b < FAST_HI.to_bits() {
        let v = f32::from_bits(b);
        x.push(v);
        if -v > FAST_LO {
            x.push(-v);
        }
        if x.len() >= 1 << 24 {
            flush(&mut x);
        }
        b += 1;
    }
    flush(&mut x);
}

/// float32 `erf` under `vectorize` gets 16 lanes on a CPU with AVX-512 and one `rivet_erff16`
/// call per sixteen (else four lanes, one `rivet_erff4` call each) (`codegen::cpu_lib::erff16`: libm's `erff` bit for bit, AVX-512 where the CPU has it), and
/// computes the interpreter's bits: each of libm's branches and their thresholds, lanes of
/// different branches in one vector, the lanes libm treats apart (tiny, NaN, infinities), a
/// tail, and a sweep of every 127th float32 from 2^-28 up.
#[test]
fn float32_erf_is_sixteen_lanes_per_call_and_exact() {
    let (args, s) = vectorized_1d(64, DType::F32, 1, |x| te::erf(&x[0]));
    let m = build_with(&s, &args, "cpu", "e", Options::default()).unwrap();
    let ir = m.get_source("ir").unwrap();
    // Sixteen lanes where the CPU has AVX-512 (and RIVET_ERF16 is not `portable`), else four.
    let lanes = if rivet_compiler::target::erf16_wide() {
        16
    } else {
        4
    };
    assert!(ir.contains(&format!(", 1, {lanes})]")), "{ir}");
    let clif = m.get_source("cranelift").unwrap();
    assert!(clif.contains("(i64) -> i32 system_v"), "{clif}");
    let mut x = vec![
        0.0f32,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-30,
        0.3,
        -1.0,
        2.0,
        -3.5,
        7.0,
        1e30,
    ];
    for t in [
        0x3180_0000u32,
        0x3f58_0000,
        0x3fa0_0000,
        0x4036_db6d,
        0x40c0_0000,
    ] {
        for d in 0..3u32 {
            x.push(f32::from_bits(t - 1 + d));
            x.push(-f32::from_bits(t - 1 + d));
        }
    }
    let mut b = 0x3180_0000u32;
    while b < 0x7f80_0000 {
        x.push(f32::from_bits(b));
        x.push(-f32::from_bits(b));
        b += 127;
    }
    x.push(0.25); // a tail after the 16-lane chunks
    if x.len() % 16 == 0 {
        x.push(-0.5);
    }
    let (cpu, interp) = (
        vector_unary(UnOp::Erf, &x, "cpu"),
        vector_unary(UnOp::Erf, &x, "interp"),
    );
    assert_same_bits(&x, &cpu, |k| interp[k], "the interpreter");
}

/// Float max / min under `vectorize` are packed (`cmpps` + bit selects) and keep the scalar
/// rules bit for bit: NaN from either side, the second operand on ties (so `max(-0, +0)` is
/// `+0` and `max(+0, -0)` is `-0`), for float32 and float64.
#[test]
fn packed_float_min_max_keep_the_scalar_rules() {
    let vals = [
        0.0f64,
        -0.0,
        1.5,
        -2.25,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-310,
    ];
    let n = (vals.len() * vals.len()) as i64;
    let (xs, ys): (Vec<f64>, Vec<f64>) = vals
        .iter()
        .flat_map(|&x| vals.iter().map(move |&y| (x, y)))
        .unzip();
    for dt in [DType::F32, DType::F64] {
        for op in [BinOp::Max, BinOp::Min] {
            let (args, s) = vectorized_1d(n, dt, 2, |x| match op {
                BinOp::Max => te::maximum(&x[0], &x[1]),
                _ => te::minimum(&x[0], &x[1]),
            });
            let tensor = |v: &[f64]| match dt {
                DType::F32 => {
                    let w: Vec<f32> = v.iter().map(|&x| x as f32).collect();
                    rivet_runtime::Tensor::from_slice(&w, &[n]).unwrap()
                }
                _ => rivet_runtime::Tensor::from_slice(v, &[n]).unwrap(),
            };
            let run = |target: &str| {
                let m = build_with(&s, &args, target, "m", Options::default()).unwrap();
                let out = m
                    .get_function("m")
                    .unwrap()
                    .call(&[
                        rivet_runtime::Value::Tensor(tensor(&xs)),
                        rivet_runtime::Value::Tensor(tensor(&ys)),
                    ])
                    .unwrap();
                let t = out.as_tensor().unwrap().clone();
                let bits: Vec<u64> = match dt {
                    DType::F32 => t
                        .to_vec::<f32>()
                        .unwrap()
                        .iter()
                        .map(|x| x.to_bits() as u64)
                        .collect(),
                    _ => t
                        .to_vec::<f64>()
                        .unwrap()
                        .iter()
                        .map(|x| x.to_bits())
                        .collect(),
                };
                (bits, m.get_source("cranelift").unwrap_or_default())
            };
            let ((cpu, clif), (interp, _)) = (run("cpu"), run("interp"));
            assert!(
                clif.contains("bitselect"),
                "{dt} {op:?} not packed:\n{clif}"
            );
            assert_eq!(cpu, interp, "{dt} {op:?}: cpu != interp");
        }
    }
}

/// Extents that leave every tail length, with the output compared element by element.
#[test]
fn tails_of_every_length() {
    for n in [1i64, 2, 3, 4, 5, 7, 8, 9, 17, 1023] {
        for dt in DTYPES {
            let c = Case {
                dt,
                rows: 2,
                n,
                e: E::Bin(0, Box::new(E::Contig), Box::new(E::Row)),
                split: 0,
                a_layout: 0,
                b_bcast: false,
                c_stepped: false,
                seed: 7,
            };
            check(&c).unwrap();
        }
    }
}

/// The machine code of a vectorized f32 add holds packed adds (`addps`, or `vaddps` with AVX).
/// The machine code the Cranelift backend makes of `s` as written (no default schedule).
fn cpu_disassembly(s: &Schedule, args: &[Te], name: &str) -> String {
    use rivet_compiler::codegen::cranelift::CraneliftBackend;
    use rivet_compiler::lower::{lower, Source};
    let func = lower(
        Source::Schedule {
            sched: s,
            args,
            name,
        },
        &rivet_compiler::Target::cpu(),
        Options::default(),
    )
    .unwrap()
    .func;
    let mut be = CraneliftBackend::new().unwrap();
    be.set_disassembly(true);
    be.compile_kernel(&func).unwrap().disassembly().to_string()
}

#[test]
fn elementwise_add_disassembles_to_packed_adds() {
    let (args, s) = vectorized_1d(1000, DType::F32, 2, |x| &x[0] + &x[1]);
    let asm = cpu_disassembly(&s, &args, "add");
    assert!(asm.contains("addps"), "{asm}");
    assert!(asm.contains("movups") || asm.contains("vmovups"), "{asm}");
}

/// A split remainder guard (`i.o * 8 + i.i < n`) moved out of a vectorized loop becomes a
/// shorter extent computed at run time; that arithmetic is guarded by bounds on its terms
/// (`lower::vectorize`, NO_WRAP = 2^58) so it can never wrap and run the skipped iterations,
/// and the original loop runs when they fail. The result stays the interpreter's.
#[test]
fn split_guard_extent_cannot_wrap() {
    let n = rivet_compiler::te::var("n");
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let c = compute([&n], |[i]| a.at([i]) + 1.0, "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let i = c.axis()[0].var.clone();
    let st = s.stage(&c).unwrap();
    let (_, ii) = st.split(&i, Some(Expr::int(8)), None).unwrap();
    st.vectorize(&ii).unwrap();
    let m = rivet_compiler::build(&s, &[a, c], "cpu", "f").unwrap();
    let ir = m.funcs[0].func.to_string();
    assert!(ir.contains("ramp("), "vectorized: {ir}");
    assert!(
        ir.contains(&(1i64 << 58).to_string()),
        "no-wrap bounds: {ir}"
    );
    assert!(
        ir.contains("else"),
        "the original loop as the fallback: {ir}"
    );
    let f = m.get_function("f").unwrap();
    for len in [0usize, 1, 7, 8, 13, 33] {
        let x: Vec<f32> = (0..len).map(|k| k as f32 * 0.25).collect();
        let out = f
            .call(&[Value::Tensor(
                Tensor::from_slice(&x, &[len as i64]).unwrap(),
            )])
            .unwrap();
        let got = out.as_tensor().unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
        assert_eq!(got, want, "n = {len}");
    }
}

/// A row's scalar under `broadcast` (a load of another tensor, a division, `rsqrt`) is computed
/// once before the vector loop (`codegen/cranelift/hoist.rs`) and only when that loop runs:
/// symbolic shapes with empty rows, rows shorter than a vector, tails, and no rows at all give
/// the interpreter's bits.
#[test]
fn loop_invariant_row_scalars_match_the_interpreter() {
    let (r, c) = (rivet_compiler::te::var("r"), rivet_compiler::te::var("c"));
    let x = placeholder([&r, &c], DType::F32, "X").unwrap();
    let s = placeholder([&r], DType::F32, "S").unwrap();
    let y = compute(
        [&r, &c],
        |[i, j]| {
            let row = s.at([&i]);
            let mean = &row / 3.0;
            let inv = te::rsqrt(row + 1.0);
            (x.at([i, j]) - mean) * inv
        },
        "Y",
    )
    .unwrap();
    let mut sch = Schedule::new(&[y.clone()]).unwrap();
    let j = y.axis()[1].var.clone();
    sch.stage(&y).unwrap().vectorize(&j).unwrap();
    let args = [x, s, y];
    let cpu = build_with(&sch, &args, "cpu", "f", Options::default())
        .unwrap()
        .get_function("f")
        .unwrap();
    let interp = build_with(&sch, &args, "interp", "f", Options::default())
        .unwrap()
        .get_function("f")
        .unwrap();
    for (rows, cols) in [
        (0i64, 5i64),
        (3, 0),
        (2, 1),
        (2, 3),
        (3, 4),
        (2, 9),
        (5, 1030),
    ] {
        let xs: Vec<f32> = (0..rows * cols)
            .map(|k| (k % 97) as f32 * 0.37 - 9.0)
            .collect();
        let ss: Vec<f32> = (0..rows).map(|k| k as f32 * 1.5 + 0.25).collect();
        let run = |f: &rivet_runtime::Function| {
            let out = f
                .call(&[
                    Value::Tensor(Tensor::from_slice(&xs, &[rows, cols]).unwrap()),
                    Value::Tensor(Tensor::from_slice(&ss, &[rows]).unwrap()),
                ])
                .unwrap();
            out.as_tensor().unwrap().to_vec::<f32>().unwrap()
        };
        let (a, b) = (run(&cpu), run(&interp));
        assert_eq!(a.len() as i64, rows * cols);
        for k in 0..a.len() {
            assert_eq!(a[k].to_bits(), b[k].to_bits(), "{rows}x{cols} element {k}");
        }
    }
}

/// A 16-lane float32 loop (one that computes `erf`, on an AVX-512 CPU) is computed as four
/// f32x4 registers per value (`cranelift/vector_quad.rs`): loads, broadcasts, `+ - * /`,
/// min / max, negation, `abs`, `sqrt`, `exp` (one 16-lane call) and `erf` give the
/// interpreter's bits, with tails, and on a strided view (the scalar loop).
#[test]
fn sixteen_lane_float32_loops_match_the_interpreter() {
    let n = te_var("n");
    let x = placeholder([&n], DType::F32, "X").unwrap();
    let s = placeholder((), DType::F32, "S").unwrap();
    let y = compute(
        [&n],
        |[i]| {
            let v = x.at([i]);
            let erf = te::erf(&v * 0.7);
            let ex = te::exp(&v * 0.5);
            let mm = te::minimum(te::maximum(&v, 0.1), s.at(()));
            let root = te::sqrt(te::abs(&v) + 1.0);
            erf * ex + mm / root - (-v)
        },
        "Y",
    )
    .unwrap();
    let mut sch = Schedule::new(&[y.clone()]).unwrap();
    let j = y.axis()[0].var.clone();
    sch.stage(&y).unwrap().vectorize(&j).unwrap();
    let args = [x, s, y];
    let module = build_with(&sch, &args, "cpu", "f", Options::default()).unwrap();
    if rivet_compiler::target::erf16_wide() {
        let ir = module.get_source("ir").unwrap();
        assert!(ir.contains(", 1, 16)]"), "{ir}");
        // Quads: the 16-lane loads are four f32x4 loads (lane by lane there would be none).
        let clif = module.get_source("cranelift").unwrap();
        assert!(clif.contains("load.f32x4"), "{clif}");
    }
    let cpu = module.get_function("f").unwrap();
    let interp = build_with(&sch, &args, "interp", "f", Options::default())
        .unwrap()
        .get_function("f")
        .unwrap();
    for (len, strided) in [
        (0usize, false),
        (5, false),
        (16, false),
        (47, false),
        (1000, false),
        (37, true),
    ] {
        let vals: Vec<f32> = (0..2 * len + 1)
            .map(|k| match k % 29 {
                0 => f32::NAN,
                1 => 40.0,
                2 => -0.0,
                _ => (k as f32 - 300.0) * 0.043,
            })
            .collect();
        let xt = if strided {
            Tensor::from_slice(&vals, &[vals.len() as i64])
                .unwrap()
                .as_strided(&[len as i64], &[2], 1)
                .unwrap()
        } else {
            Tensor::from_slice(&vals[..len], &[len as i64]).unwrap()
        };
        let st = Tensor::from_slice(&[0.75f32], &[]).unwrap();
        let run = |f: &rivet_runtime::Function| {
            let out = f
                .call(&[Value::Tensor(xt.clone()), Value::Tensor(st.clone())])
                .unwrap();
            out.as_tensor().unwrap().to_vec::<f32>().unwrap()
        };
        let (a, b) = (run(&cpu), run(&interp));
        assert_eq!(a.len(), len);
        for k in 0..len {
            assert!(
                a[k].to_bits() == b[k].to_bits() || (a[k].is_nan() && b[k].is_nan()),
                "len {len} strided {strided} element {k}: cpu {} interp {}",
                a[k],
                b[k]
            );
        }
    }
}

fn te_var(name: &str) -> Expr {
    rivet_compiler::te::var(name)
}

/// A row of a register tile accumulated over `k` (`C[i, jo*32 + ji] += A[i, k] * B[k, ...]`,
/// `ji` vectorized: eight f32x4 stores unrolled, `lower/unroll.rs`) is kept in registers across
/// the `k` loop (`codegen/cranelift/hoist.rs`, `loop_carried`), as is a tile of several rows
/// (rows `C.s0` apart: `other_rows`), and 16-lane partial sums whose
/// layout test sits inside their `ko` loop are unswitched first (`lower/unswitch.rs`): both
/// give the interpreter's bits, at sizes with and without ragged tiles, and for strided
/// operands (the scalar version).
#[test]
fn loop_carried_vectors_match_the_interpreter() {
    for (m, n, kk, rows) in [
        (1i64, 32i64, 1i64, 1i64),
        (3, 64, 17, 1),
        (5, 96, 40, 1),
        (2, 45, 7, 1),
        (4, 16, 9, 4),
        (6, 24, 33, 3),
        (5, 17, 5, 2),
    ] {
        let a = placeholder([m, kk], DType::F32, "A").unwrap();
        let b = placeholder([kk, n], DType::F32, "B").unwrap();
        let k = te::reduce_axis(0, kk, "k").unwrap();
        let c = compute(
            [m, n],
            |[i, j]| te::sum(a.at((i, &k)) * b.at((&k, j)), &k),
            "C",
        )
        .unwrap();
        let mut s = Schedule::new(&[c.clone()]).unwrap();
        let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
        let st = s.stage(&c).unwrap();
        if rows > 1 {
            // A rows x 8 tile: rows unrolled, two f32x4 per row, `C.s0` apart row to row.
            let (io, ii) = st.split(&i, Some(Expr::int(rows)), None).unwrap();
            let (jo, ji) = st.split(&j, Some(Expr::int(8)), None).unwrap();
            st.reorder(&[io, jo, k.var.clone(), ii.clone(), ji.clone()])
                .unwrap();
            st.unroll(&ii).unwrap();
            st.vectorize(&ji).unwrap();
        } else {
            let (jo, ji) = st.split(&j, Some(Expr::int(32)), None).unwrap();
            st.reorder(&[i, jo, k.var.clone(), ji.clone()]).unwrap();
            st.vectorize(&ji).unwrap();
        }
        let args = [a, b, c];
        let run = |target: &str, strided: bool| {
            let f = build_with(&s, &args, target, "g", Options::default())
                .unwrap()
                .get_function("g")
                .unwrap();
            let av: Vec<f32> = (0..m * kk)
                .map(|x| ((x * 7) % 13) as f32 * 0.25 - 1.0)
                .collect();
            let bv: Vec<f32> = (0..kk * n)
                .map(|x| ((x * 5) % 11) as f32 * 0.5 - 2.0)
                .collect();
            let at = Tensor::from_slice(&av, &[m, kk]).unwrap();
            let bt = if strided {
                let wide: Vec<f32> = bv.iter().flat_map(|&x| [x, f32::NAN]).collect();
                Tensor::from_slice(&wide, &[2 * kk * n])
                    .unwrap()
                    .as_strided(&[kk, n], &[2 * n, 2], 0)
                    .unwrap()
            } else {
                Tensor::from_slice(&bv, &[kk, n]).unwrap()
            };
            let out = f.call(&[Value::Tensor(at), Value::Tensor(bt)]).unwrap();
            out.as_tensor().unwrap().to_vec::<f32>().unwrap()
        };
        for strided in [false, true] {
            let (x, y) = (run("cpu", strided), run("interp", strided));
            assert!(
                x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{m}x{n}x{kk} strided {strided}: cpu {x:?} != interp {y:?}"
            );
        }
    }
}

/// A loop-invariant scalar under a broadcast (`hoist.rs`) stays out of its loop in the
/// machine code, not only in the CLIF: `Y[i, j] = X[i, j] * rsqrt(S[i] / n + eps)` computes
/// the division and the square root once per row. (Cranelift's egraph places pure
/// instructions itself and used to put them back into a loop whose exit it had walked first:
/// the loops are rotated for that, `stmt.rs::plain_counted_loop`.) The result is the
/// interpreter's, bit for bit.
#[test]
fn invariant_row_scalars_stay_out_of_the_vector_loop() {
    let (rows, n) = (3i64, 37i64);
    let x = placeholder([rows, n], DType::F32, "X").unwrap();
    let sv = placeholder([rows], DType::F32, "S").unwrap();
    let y = compute(
        [rows, n],
        |[i, j]| {
            let mean = sv.at([&i]) / n as f64;
            let r = te::rsqrt(mean + 1e-5);
            x.at([i, j]) * r
        },
        "Y",
    )
    .unwrap();
    let mut s = Schedule::new(&[y.clone()]).unwrap();
    let j = y.axis()[1].var.clone();
    let st = s.stage(&y).unwrap();
    let (_, ji) = st.split(&j, Some(Expr::int(4)), None).unwrap();
    st.vectorize(&ji).unwrap();
    let args = [x.clone(), sv.clone(), y.clone()];
    let asm = cpu_disassembly(&s, &args, "rows");
    // The blocks holding a packed multiply (the vector loop's body) hold no scalar division
    // or square root.
    let mut packed_blocks = 0;
    for block in asm.split("\nblock").skip(1) {
        if block.contains("mulps") {
            packed_blocks += 1;
            assert!(
                !block.contains("sqrtss") && !block.contains("divss"),
                "loop-invariant arithmetic inside the vector loop:\nblock{block}\n\nall:\n{asm}"
            );
        }
    }
    assert!(packed_blocks > 0, "no packed multiply:\n{asm}");
    // And the values are the interpreter's.
    let xs: Vec<f32> = (0..rows * n).map(|k| (k as f32 * 0.37).sin()).collect();
    let ss: Vec<f32> = (0..rows).map(|k| 1.0 + k as f32 * 3.5).collect();
    let run = |target: &str| {
        let m = rivet_compiler::build(&s, &args, target, "rows").unwrap();
        let out = Tensor::zeros(&[rows, n], DType::F32).unwrap();
        m.get_function("rows")
            .unwrap()
            .call(&[
                Value::Tensor(Tensor::from_slice(&xs, &[rows, n]).unwrap()),
                Value::Tensor(Tensor::from_slice(&ss, &[rows]).unwrap()),
                Value::Tensor(out.clone()),
            ])
            .unwrap();
        out.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(run("cpu"), run("interp"));
}

/// The disassembly of `outs` under the default CPU schedule with row fusion, as `build` makes
/// it.
fn default_cpu_disassembly(outs: &[Te], args: &[Te], name: &str) -> String {
    use rivet_compiler::codegen::cranelift::CraneliftBackend;
    use rivet_compiler::lower::{lower, Source};
    let mut s = Schedule::new(outs).unwrap();
    rivet_compiler::schedule::cpu_default::apply_default_cpu(&mut s).unwrap();
    let opts = Options {
        fuse_rows: true,
        ..Options::default()
    };
    let func = lower(
        Source::Schedule {
            sched: &s,
            args,
            name,
        },
        &rivet_compiler::Target::cpu(),
        opts,
    )
    .unwrap()
    .func;
    let mut be = CraneliftBackend::new().unwrap();
    be.set_disassembly(true);
    be.compile_kernel(&func).unwrap().disassembly().to_string()
}

/// The machine-code blocks of `asm` that contain `op` (a loop body, for a packed op).
fn blocks_with<'a>(asm: &'a str, op: &str) -> Vec<&'a str> {
    asm.split("\nblock")
        .skip(1)
        .filter(|b| b.contains(op))
        .collect()
}

/// No stack slot is read or written in a machine-code block with a packed multiply (a loop's
/// step; a spill shows as `(%rsp)` or an `<offset:..>` slot), and there is such a block.
fn assert_no_stack_in_packed_steps(asm: &str, what: &str) {
    let steps = blocks_with(asm, "mulps");
    assert!(!steps.is_empty(), "no packed multiply:\n{asm}");
    for b in steps {
        assert!(
            !b.contains("rsp") && !b.contains("<offset"),
            "stack traffic in {what}:\nblock{b}\n\nall:\n{asm}"
        );
    }
}

/// `sin(q * s)` for `q < len`: smooth, signed test data.
fn sin_data(len: i64, s: f32) -> Vec<f32> {
    (0..len).map(|q| ((q as f32) * s).sin()).collect()
}

/// `build` of `outs` on `target` under the default CPU schedule (given explicitly, so the
/// interpreter runs the same order of operations), called on `inputs` (float32, by the
/// arguments' shapes), with the outputs' bits.
fn run_bits(outs: &[Te], args: &[Te], inputs: &[Vec<f32>], target: &str) -> Vec<Vec<u32>> {
    let mut s = Schedule::new(outs).unwrap();
    rivet_compiler::schedule::cpu_default::apply_default_cpu(&mut s).unwrap();
    let f = rivet_compiler::build(&s, &args.iter().collect::<Vec<_>>(), target, "f")
        .unwrap()
        .get_function("f")
        .unwrap();
    let dims = |t: &Te| -> Vec<i64> { t.shape().iter().map(|d| d.as_int().unwrap()).collect() };
    let mut vals: Vec<Value> = Vec::new();
    for (t, v) in args.iter().zip(inputs) {
        vals.push(Value::Tensor(Tensor::from_slice(v, &dims(t)).unwrap()));
    }
    let outs_t: Vec<Tensor> = outs
        .iter()
        .map(|o| {
            let d = dims(o);
            Tensor::from_slice(&vec![f32::NAN; d.iter().product::<i64>() as usize], &d).unwrap()
        })
        .collect();
    vals.extend(outs_t.iter().cloned().map(Value::Tensor));
    f.call(&vals).unwrap();
    outs_t
        .iter()
        .map(|t| {
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

// A row reduction of a three-input product under the default schedule (16-lane partial sums,
// four f32x4 accumulators): its loads of inputs are movable (`FnGen::load_flags`), so
// Cranelift places each next to its arithmetic and the four accumulators and their operands
// fit the sixteen xmm registers. Before, the twelve loads of a step came first and one
// accumulator lived on the stack: a store and a reload per step.
#[test]
fn row_reduction_steps_keep_every_accumulator_in_registers() {
    let (rows, n) = (8i64, 256i64);
    let x = placeholder([rows, n], DType::F32, "X").unwrap();
    let g = placeholder([n], DType::F32, "G").unwrap();
    let dy = placeholder([rows, n], DType::F32, "dY").unwrap();
    let t = placeholder([rows], DType::F32, "T").unwrap();
    let k = te::reduce_axis(0, n, "k").unwrap();
    let s1 = compute(
        [rows],
        |[i]| {
            te::sum(
                dy.at((&i, &k)) * g.at([&k]) * (x.at((&i, &k)) - t.at([&i]) / n as f64),
                &k,
            )
        },
        "S",
    )
    .unwrap();
    let args = [x.clone(), g.clone(), t.clone(), dy.clone(), s1.clone()];
    let asm = default_cpu_disassembly(&[s1.clone()], &args, "s1");
    assert_no_stack_in_packed_steps(&asm, "the reduction's step");
    let data = sin_data;
    let inputs = [
        data(rows * n, 0.37),
        data(n, 0.11),
        data(rows, 0.7),
        data(rows * n, 0.23),
    ];
    assert_eq!(
        run_bits(&[s1.clone()], &args, &inputs, "cpu"),
        run_bits(&[s1], &args, &inputs, "interp")
    );
}

// An elementwise loop under the default schedule: the row's offsets (`i * X.s0`) are
// computed once per row, not once per four elements (the loop is rotated behind a `lo < hi`
// test so that Cranelift's egraph knows it is in it, `stmt.rs::counted_loop`).
#[test]
fn elementwise_rows_compute_their_offsets_once_per_row() {
    let (rows, n) = (5i64, 64i64);
    let x = placeholder([rows, n], DType::F32, "X").unwrap();
    let y = compute([rows, n], |[i, j]| x.at([i, j]) * 2.0, "Y").unwrap();
    let args = [x.clone(), y.clone()];
    let asm = default_cpu_disassembly(&[y.clone()], &args, "scale");
    let steps = blocks_with(&asm, "mulps");
    assert!(!steps.is_empty(), "no packed multiply:\n{asm}");
    for b in steps {
        assert!(
            !b.contains("imul"),
            "a multiplication in the vector step:\nblock{b}\n\nall:\n{asm}"
        );
    }
    let xs: Vec<f32> = (0..rows * n).map(|q| (q as f32 * 0.31).cos()).collect();
    assert_eq!(
        run_bits(&[y.clone()], &args, std::slice::from_ref(&xs), "cpu"),
        run_bits(&[y], &args, &[xs], "interp")
    );
}

// layer_norm's backward shape under the default schedule: a row update reading five arrays
// (`Y = dy g a[i] + (x - b[i]) a[i]`) fused with the chunk update of a column sum over the
// same rows (`T[j] = sum_i dy x`, `lower::fuse_chunks`), one step writing `Y` and two partial
// rows. Each array's row pointer is computed before the loop (`expr.rs::offset_address`): with
// a base and a row offset per array, three base pointers lived on the stack and were reloaded
// on every step.
#[test]
fn a_fused_row_and_chunk_step_keeps_its_pointers_in_registers() {
    let (rows, n) = (128i64, 256i64);
    let x = placeholder([rows, n], DType::F32, "X").unwrap();
    let dy = placeholder([rows, n], DType::F32, "dY").unwrap();
    let g = placeholder([n], DType::F32, "G").unwrap();
    let a = placeholder([rows], DType::F32, "Ra").unwrap();
    let b = placeholder([rows], DType::F32, "Rb").unwrap();
    let y = compute(
        [rows, n],
        |[i, j]| {
            dy.at([&i, &j]) * g.at([&j]) * a.at([&i]) + (x.at([&i, &j]) - b.at([&i])) * a.at([&i])
        },
        "Y",
    )
    .unwrap();
    let r = te::reduce_axis(0, rows, "r").unwrap();
    let t = compute(
        [n],
        |[j]| te::sum(dy.at((&r, &j)) * x.at((&r, &j)), &r),
        "T",
    )
    .unwrap();
    let args = [
        x.clone(),
        dy.clone(),
        g.clone(),
        a.clone(),
        b.clone(),
        y.clone(),
        t.clone(),
    ];
    let asm = default_cpu_disassembly(&[y.clone(), t.clone()], &args, "step");
    assert_no_stack_in_packed_steps(&asm, "the fused step");
    let data = sin_data;
    let inputs = [
        data(rows * n, 0.37),
        data(rows * n, 0.23),
        data(n, 0.11),
        data(rows, 0.7),
        data(rows, 0.3),
    ];
    assert_eq!(
        run_bits(&[y.clone(), t.clone()], &args, &inputs, "cpu"),
        run_bits(&[y, t], &args, &inputs, "interp")
    );
}

// A movable load (`FnGen::load_flags`: an input, indexed by the loop's variable) behind a
// guard stays behind it: `A[i * 2^40]` is in bounds only where `i < 1`, and read anywhere else
// it is 4 TiB past a one-element tensor (a fault, not a wrong value). Run on the default
// schedule (the select keeps it scalar: its arm may fault) and with the rows parallel.
#[test]
fn a_guarded_movable_load_is_never_made_outside_its_guard() {
    let n = 64i64;
    for rows in [1i64, 4] {
        let a = placeholder([1i64], DType::F32, "A").unwrap();
        let o = compute(
            [rows, n],
            |[_r, i]| {
                te::if_then_else(
                    te::lt(&i, 1),
                    a.at([&i * (1i64 << 40)]),
                    te::constant(0.0, DType::F32),
                )
            },
            "O",
        )
        .unwrap();
        let args = [a.clone(), o.clone()];
        let bits = run_bits(&[o.clone()], &args, &[vec![3.5f32]], "cpu");
        let want: Vec<u32> = (0..rows * n)
            .map(|k| if k % n == 0 { 3.5f32 } else { 0.0 }.to_bits())
            .collect();
        assert_eq!(bits, vec![want], "rows={rows}");
    }
}

/// A `select` whose condition no iteration changes (`k >= 1`, `k` a dim) and whose arm loads
/// memory is taken out of the vectorized loop as a branch around two copies of it
/// (`lower/unswitch.rs`, `selects`): the loop is packed SIMD (without it the arm's load keeps
/// it scalar), the guarded load of `Z[0]` is still made only where `Z` has an element (`k =
/// 0` runs on an empty `Z`), and the bits are the interpreter's for every `k`, `n`.
#[test]
fn an_invariant_select_over_loads_is_unswitched_and_vectorized() {
    let (n, k) = (te_var("n"), te_var("k"));
    let x = placeholder([&n], DType::F32, "X").unwrap();
    let z = placeholder([&k], DType::F32, "Z").unwrap();
    let y = compute(
        [&n],
        |[i]| te::if_then_else(te::ge(&k, 1), x.at([&i]) * z.at([0]), x.at([&i]) + 1.0),
        "Y",
    )
    .unwrap();
    let mut s = Schedule::new(&[y.clone()]).unwrap();
    let i = y.axis()[0].var.clone();
    s.stage(&y).unwrap().vectorize(&i).unwrap();
    let args = [x.clone(), z.clone(), y.clone()];
    let asm = cpu_disassembly(&s, &args, "sel");
    assert!(
        !blocks_with(&asm, "mulps").is_empty() && !blocks_with(&asm, "addps").is_empty(),
        "both copies of the loop are packed:\n{asm}"
    );
    for (len, zl) in [(0i64, 0i64), (37, 0), (37, 3), (64, 1), (5, 2)] {
        let xs = sin_data(len, 0.3);
        let zs: Vec<f32> = (0..zl).map(|q| 1.5 + q as f32).collect();
        let run = |target: &str| {
            let m = rivet_compiler::build(&s, &args, target, "sel").unwrap();
            let out = Tensor::from_slice(&vec![f32::NAN; len as usize], &[len]).unwrap();
            m.get_function("sel")
                .unwrap()
                .call(&[
                    Value::Tensor(Tensor::from_slice(&xs, &[len]).unwrap()),
                    Value::Tensor(Tensor::from_slice(&zs, &[zl]).unwrap()),
                    Value::Tensor(out.clone()),
                ])
                .unwrap();
            out.to_vec::<f32>().unwrap()
        };
        let (cpu, interp) = (run("cpu"), run("interp"));
        let want: Vec<f32> = xs
            .iter()
            .map(|&v| if zl >= 1 { v * zs[0] } else { v + 1.0 })
            .collect();
        for (what, got) in [("cpu", &cpu), ("interp", &interp)] {
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "n {len} k {zl}: {what} {got:?} != {want:?}"
            );
        }
    }
}

/// The per-call bounds check of a read under a guard over the dims alone holds vacuously when
/// the guard is false (`lower/bounds.rs`): `if_then_else(k >= 1, Z[0], ..)` runs with an empty
/// `Z`. The same read outside the guard still gets its own check: `k = 0` is a `ShapeError`
/// naming `Z`, never a read past an empty tensor.
fn a_dims_guard_makes_its_reads_check_vacuous_and_only_those(target: &Target) {
    let (n, k) = (te_var("n"), te_var("k"));
    let x = placeholder([&n], DType::F32, "X").unwrap();
    let z = placeholder([&k], DType::F32, "Z").unwrap();
    let guarded = compute(
        [&n],
        |[i]| te::if_then_else(te::ge(&k, 1), x.at([&i]) * z.at([0]), x.at([&i])),
        "Y",
    )
    .unwrap();
    let both = compute(
        [&n],
        |[i]| te::if_then_else(te::ge(&k, 1), x.at([&i]) * z.at([0]), x.at([&i])) + z.at([0]),
        "Y",
    )
    .unwrap();
    for (y, ok_when_empty) in [(&guarded, true), (&both, false)] {
        let s = Schedule::new(std::slice::from_ref(y)).unwrap();
        let m = rivet_compiler::build(&s, &[x.clone(), z.clone(), y.clone()], target, "g").unwrap();
        let out = Tensor::from_slice(&[f32::NAN; 3], &[3]).unwrap();
        let r = rivet_tests::call(
            &m.get_function("g").unwrap(),
            &[
                Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap()),
                Value::Tensor(Tensor::from_slice::<f32>(&[], &[0]).unwrap()),
                Value::Tensor(out.clone()),
            ],
        );
        if ok_when_empty {
            r.unwrap();
            assert_eq!(
                out.to_vec::<f32>().unwrap(),
                vec![1.0, 2.0, 3.0],
                "{target}"
            );
        } else {
            let e = r.expect_err("an unguarded read of an empty Z").to_string();
            assert!(
                e.contains("tensor 'Z'") && e.contains("k=0"),
                "{target}: {e}"
            );
            assert!(out.to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
        }
    }
}

/// relu's derivative, `G[i] * select(X[i] > 0, 1, select(X[i] == 0, 0.5, 0))`: the inner
/// select's condition loads `X[i]`, which the outer condition loads in every iteration anyway,
/// so the loop is vectorized (`lower/vectorize.rs`, `eager_loads`; the code generator's
/// `may_fault` applies the same rule). It used to stay scalar, and the default schedule's
/// build of it failed inside the code generator and fell back, silently, to plain loops.
/// Bits equal the interpreter's on zeros of both signs, NaN, infinities and ragged lengths.
#[test]
fn a_select_arm_loading_what_the_condition_loaded_is_vectorized() {
    let n = te_var("n");
    let x = placeholder([&n], DType::F32, "X").unwrap();
    let g = placeholder([&n], DType::F32, "G").unwrap();
    let y = compute(
        [&n],
        |[i]| {
            let inner = te::if_then_else(te::eq(x.at([&i]), 0.0), 0.5, 0.0);
            g.at([&i]) * te::if_then_else(te::gt(x.at([&i]), 0.0), 1.0, inner)
        },
        "Y",
    )
    .unwrap();
    let args = [x.clone(), g.clone(), y.clone()];
    let mut v = Schedule::new(std::slice::from_ref(&y)).unwrap();
    let i = y.axis()[0].var.clone();
    v.stage(&y).unwrap().vectorize(&i).unwrap();
    let asm = cpu_disassembly(&v, &args, "relu_grad");
    assert!(
        !blocks_with(&asm, "mulps").is_empty() && !blocks_with(&asm, "cmpeqps").is_empty(),
        "packed compare and multiply:\n{asm}"
    );
    let special = [
        0.0f32,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-45,
        -3.0,
        2.5,
    ];
    for len in [0i64, 1, 3, 8, 37, 100] {
        let xs: Vec<f32> = (0..len as usize)
            .map(|k| special[k % special.len()])
            .collect();
        let gs = sin_data(len, 0.7);
        let s = Schedule::new(std::slice::from_ref(&y)).unwrap();
        let run = |s: &Schedule, target: &str| {
            let m = rivet_compiler::build(s, &args, target, "relu_grad").unwrap();
            let out = Tensor::from_slice(&vec![f32::NAN; len as usize], &[len]).unwrap();
            m.get_function("relu_grad")
                .unwrap()
                .call(&[
                    Value::Tensor(Tensor::from_slice(&xs, &[len]).unwrap()),
                    Value::Tensor(Tensor::from_slice(&gs, &[len]).unwrap()),
                    Value::Tensor(out.clone()),
                ])
                .unwrap();
            out.to_vec::<f32>().unwrap()
        };
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let want = bits(&run(&s, "interp"));
        // The default CPU schedule (what rivet.kernels.relu's backward gets; an internal
        // error in it is no longer hidden by the as-written fallback) and the vector one.
        assert_eq!(bits(&run(&s, "cpu")), want, "len {len}");
        assert_eq!(bits(&run(&v, "cpu")), want, "len {len}");
    }
}

/// A load in a select arm under a float condition (`X[i] == M[0] ? G[0] / T[0] : 0`, a max
/// reduction's derivative) is vectorized: the bounds proof learned nothing from a float
/// condition, so the load was proven in bounds for every iteration, and computing it for
/// every lane reads nothing out of bounds. The hostile side: an arm read `W[i + 5]` under a
/// float condition that no element meets still needs `W` to hold `n + 5` elements: a
/// `ShapeError` before any code runs, with the vector build as with the scalar one.
#[test]
fn a_load_under_a_float_condition_is_vectorized_and_still_proven() {
    let (n, k) = (te_var("n"), te_var("k"));
    let x = placeholder([&n], DType::F32, "X").unwrap();
    let m = placeholder([1], DType::F32, "M").unwrap();
    let g = placeholder([1], DType::F32, "G").unwrap();
    let w = placeholder([&k], DType::F32, "W").unwrap();
    let y = compute(
        [&n],
        |[i]| {
            let hit = te::if_then_else(te::eq(x.at([&i]), m.at([0])), g.at([0]) / 3.0, 0.0);
            hit + te::if_then_else(te::gt(x.at([&i]), 1e30), w.at([&i + 5]), 0.0)
        },
        "Y",
    )
    .unwrap();
    let args = [x.clone(), m.clone(), g.clone(), w.clone(), y.clone()];
    let mut v = Schedule::new(std::slice::from_ref(&y)).unwrap();
    let i = y.axis()[0].var.clone();
    v.stage(&y).unwrap().vectorize(&i).unwrap();
    let asm = cpu_disassembly(&v, &args, "maxgrad");
    assert!(
        !blocks_with(&asm, "cmpeqps").is_empty(),
        "the select is computed packed:\n{asm}"
    );
    let special = [2.0f32, f32::NAN, 2.0, -0.0, 0.0, f32::INFINITY, 1.0];
    for (len, wlen) in [(0i64, 5i64), (1, 6), (7, 12), (37, 42), (64, 100)] {
        let xs: Vec<f32> = (0..len as usize)
            .map(|q| special[q % special.len()])
            .collect();
        let ws = sin_data(wlen, 0.9);
        let run = |target: &str, wl: i64| {
            let md = rivet_compiler::build(&v, &args, target, "maxgrad").unwrap();
            let out = Tensor::from_slice(&vec![f32::NAN; len as usize], &[len]).unwrap();
            let r = md.get_function("maxgrad").unwrap().call(&[
                Value::Tensor(Tensor::from_slice(&xs, &[len]).unwrap()),
                Value::Tensor(Tensor::from_slice(&[2.0f32], &[1]).unwrap()),
                Value::Tensor(Tensor::from_slice(&[1.5f32], &[1]).unwrap()),
                Value::Tensor(Tensor::from_slice(&ws[..wl as usize], &[wl]).unwrap()),
                Value::Tensor(out.clone()),
            ]);
            (r, out.to_vec::<f32>().unwrap())
        };
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let (r, want) = run("interp", wlen);
        r.unwrap();
        let (r, got) = run("cpu", wlen);
        r.unwrap();
        assert_eq!(bits(&got), bits(&want), "len {len}");
        // One element short for W[i + 5]: refused before any code runs, on both backends.
        if len > 0 {
            for target in rivet_tests::backend_names() {
                let (r, out) = run(target, len + 4);
                let e = r.expect_err("W too short").to_string();
                assert!(e.contains("tensor 'W'"), "{target}: {e}");
                assert!(out.iter().all(|f| f.is_nan()), "nothing written");
            }
        }
    }
}

rivet_tests::for_each_backend!(a_dims_guard_makes_its_reads_check_vacuous_and_only_those);
