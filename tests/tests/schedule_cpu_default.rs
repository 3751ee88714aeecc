//! The default CPU schedule (`schedule::cpu_default`) against the interpreter oracle.
//!
//! - Matmul-like stages become the packed, tensorized GEMM: the CPU build of an untouched
//!   schedule equals, bit for bit, the interpreter running the same defaulted schedule (both
//!   run the same fused multiply-adds in the same order), and float64 maths within the
//!   fused-sum bound of docs/cpu.md; at sizes 1, 3, 17, 97 and 1023, symbolic and constant
//!   dims, transposed and strided operands, batched (and broadcast) operands, a prologue in a
//!   factor, float64; each micro-kernel variant forced in turn in a child process.
//! - Every other stage (parallel, vectorized, inlined) equals the interpreter running the
//!   schedule as written, bit for bit: the default changes no operation order.

use rivet_compiler::ir::Expr;
use rivet_compiler::schedule::cpu_default::apply_default_cpu;
use rivet_compiler::te::{self, compute, compute_dyn, placeholder, Tensor as TeTensor};
use rivet_compiler::{build, Schedule, Target};
use rivet_runtime::{DType, Tensor, Value};
use rivet_tests::floats::values_f64 as to_f64;

fn data(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// A GEMM-like program.
#[derive(Debug, Clone)]
struct Gemm {
    m: i64,
    n: i64,
    k: i64,
    /// Leading batch extent: 0 none; both operands batched, or only A (B broadcast).
    batch: i64,
    b_batched: bool,
    a_t: bool,
    b_t: bool,
    symbolic: bool,
    /// The A factor is `A * 0.5 + 1` (a prologue the pack computes once).
    prologue: bool,
    strided: bool,
    f64: bool,
}

impl Gemm {
    fn dtype(&self) -> DType {
        if self.f64 {
            DType::F64
        } else {
            DType::F32
        }
    }

    /// Stored shapes of A and B.
    fn shapes(&self) -> (Vec<i64>, Vec<i64>) {
        let (m, n, k) = (self.m, self.n, self.k);
        let mut a = if self.a_t { vec![k, m] } else { vec![m, k] };
        let mut b = if self.b_t { vec![n, k] } else { vec![k, n] };
        if self.batch > 0 {
            a.insert(0, self.batch);
            if self.b_batched {
                b.insert(0, self.batch);
            }
        }
        (a, b)
    }

    /// The tensors `[A, B, C]`.
    fn program(&self) -> Vec<TeTensor> {
        let dim = |v: i64, name: &str| {
            if self.symbolic {
                te::var(name)
            } else {
                Expr::int(v)
            }
        };
        let (m, n, k) = (dim(self.m, "m"), dim(self.n, "n"), dim(self.k, "k"));
        let bt = dim(self.batch, "b");
        let lead = |v: Vec<Expr>, batched: bool| {
            if self.batch > 0 && batched {
                let mut w = vec![bt.clone()];
                w.extend(v);
                w
            } else {
                v
            }
        };
        let a_shape = lead(
            if self.a_t {
                vec![k.clone(), m.clone()]
            } else {
                vec![m.clone(), k.clone()]
            },
            true,
        );
        let b_shape = lead(
            if self.b_t {
                vec![n.clone(), k.clone()]
            } else {
                vec![k.clone(), n.clone()]
            },
            self.b_batched,
        );
        let dt = self.dtype();
        let a = placeholder(&a_shape, dt, "A").unwrap();
        let b = placeholder(&b_shape, dt, "B").unwrap();
        let r = te::reduce_axis(0, k, "r").unwrap();
        let mut c_shape = vec![m, n];
        if self.batch > 0 {
            c_shape.insert(0, bt);
        }
        let c = compute_dyn(
            &c_shape,
            |x| {
                let (pre, i, j) = if self.batch > 0 {
                    (vec![x[0].clone()], x[1].clone(), x[2].clone())
                } else {
                    (vec![], x[0].clone(), x[1].clone())
                };
                let rk = Expr::from(&r);
                let mut ai = pre.clone();
                ai.extend(if self.a_t {
                    [rk.clone(), i]
                } else {
                    [i, rk.clone()]
                });
                let mut bi = if self.b_batched { pre } else { vec![] };
                bi.extend(if self.b_t { [j, rk] } else { [rk, j] });
                let mut fa = a.at(ai);
                if self.prologue {
                    fa = fa * 0.5 + 1.0;
                }
                te::sum(fa * b.at(bi), &r)
            },
            "C",
        )
        .unwrap();
        vec![a, b, c]
    }
}

/// `v` as a tensor of `shape`, or (strided) a view with a step of 2 in its last dim and an
/// offset, over a larger buffer.
fn operand(v: &[f64], shape: &[i64], dt: DType, strided: bool) -> Tensor {
    let make = |v: &[f64], shape: &[i64]| match dt {
        DType::F32 => {
            let w: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            Tensor::from_slice(&w, shape).unwrap()
        }
        _ => Tensor::from_slice(v, shape).unwrap(),
    };
    if !strided {
        return make(v, shape);
    }
    let nd = shape.len();
    let mut strides = vec![0i64; nd];
    let mut s = 1i64;
    for d in (0..nd).rev() {
        strides[d] = if d == nd - 1 { 2 } else { s };
        s = if d == nd - 1 {
            2 * shape[d] + 1
        } else {
            s * shape[d]
        };
    }
    let len = (s + 3) as usize;
    let mut mem = vec![f64::NAN; len];
    for (x, &val) in v.iter().enumerate() {
        let mut rem = x as i64;
        let mut off = 3i64;
        for d in (0..nd).rev() {
            off += (rem % shape[d]) * strides[d];
            rem /= shape[d];
        }
        mem[off as usize] = val;
    }
    make(&mem, &[len as i64])
        .as_strided(shape, &strides, 3)
        .unwrap()
}

/// Runs `g` built for the CPU with the default schedule, and on the interpreter with the same
/// defaulted schedule; returns both outputs, the logical inputs, and the CPU build's IR.
fn run(g: &Gemm) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, String) {
    let (sa, sb) = g.shapes();
    let av = data(sa.iter().product::<i64>() as usize, (g.m * 31 + g.k) as u64);
    let bv = data(sb.iter().product::<i64>() as usize, (g.n * 17 + g.k) as u64);
    let dt = g.dtype();
    let args = g.program();
    let plain = Schedule::new(&args[2..]).unwrap();
    let mut defaulted = plain.clone();
    apply_default_cpu(&mut defaulted).unwrap();
    let call = |s: &Schedule, target: &Target| {
        let m = build(s, &args, target, "g").unwrap_or_else(|e| panic!("{g:?}: {e}"));
        let f = m.get_function("g").unwrap();
        let out = f
            .call(&[
                Value::Tensor(operand(&av, &sa, dt, g.strided)),
                Value::Tensor(operand(&bv, &sb, dt, g.strided)),
            ])
            .unwrap_or_else(|e| panic!("{g:?} on {target}: {e}"));
        (
            to_f64(out.as_tensor().unwrap(), dt),
            m.get_source("ir").unwrap_or_default(),
        )
    };
    let (cpu, ir) = call(&plain, &Target::cpu());
    let (interp, _) = call(&defaulted, &Target::interp());
    (cpu, interp, av, bv, ir)
}

/// C against float64 maths within `(k + 1) * eps * sum |a b|` (docs/cpu.md).
fn check_maths(g: &Gemm, got: &[f64], av: &[f64], bv: &[f64]) {
    let (m, n, k) = (g.m, g.n, g.k);
    let round = |x: f64| if g.f64 { x } else { x as f32 as f64 };
    let eps = if g.f64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    };
    let batches = g.batch.max(1);
    for b in 0..batches {
        for i in 0..m {
            for j in 0..n {
                let (mut x, mut mag) = (0f64, 0f64);
                for p in 0..k {
                    let ai = if g.a_t { p * m + i } else { i * k + p } + b * m * k;
                    let bb = if g.b_batched { b * k * n } else { 0 };
                    let bi = if g.b_t { j * k + p } else { p * n + j } + bb;
                    let mut fa = round(av[ai as usize]);
                    if g.prologue {
                        fa = round(round(fa * 0.5) + 1.0);
                    }
                    let t = fa * round(bv[bi as usize]);
                    x += t;
                    mag += t.abs();
                }
                let got = got[(b * m * n + i * n + j) as usize];
                let tol = (k as f64 + 2.0) * eps * mag + 1e-300;
                assert!(
                    (got - x).abs() <= tol,
                    "{g:?}: C[{b},{i},{j}] = {got}, expected {x} (tolerance {tol})"
                );
            }
        }
    }
}

fn check(g: &Gemm) {
    let (cpu, interp, av, bv, ir) = run(g);
    assert!(
        cpu.iter()
            .zip(&interp)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "{g:?}: cpu != interp of the defaulted schedule"
    );
    check_maths(g, &cpu, &av, &bv);
    let work = g.m * g.n * g.k * g.batch.max(1);
    if g.symbolic || work >= rivet_compiler::schedule::cpu_default::MIN_GEMM_WORK {
        assert!(ir.contains("call gemm_update"), "{g:?}: not packed:\n{ir}");
    }
}

fn base(m: i64, n: i64, k: i64) -> Gemm {
    Gemm {
        m,
        n,
        k,
        batch: 0,
        b_batched: true,
        a_t: false,
        b_t: false,
        symbolic: true,
        prologue: false,
        strided: false,
        f64: false,
    }
}

#[test]
fn default_gemm_at_hostile_sizes() {
    let sizes = [1i64, 3, 17, 97];
    for symbolic in [true, false] {
        for &m in &sizes {
            for &n in &sizes {
                for &k in &[1i64, 17, 97, 300] {
                    check(&Gemm {
                        symbolic,
                        ..base(m, n, k)
                    });
                }
            }
        }
    }
}

#[test]
fn default_gemm_layouts_batches_prologue_f64() {
    for (a_t, b_t, strided) in [
        (true, false, false),
        (false, true, true),
        (true, true, true),
    ] {
        for (m, n, k) in [(17, 97, 3), (97, 17, 97), (3, 1, 17), (24, 64, 300)] {
            for symbolic in [true, false] {
                check(&Gemm {
                    a_t,
                    b_t,
                    strided,
                    symbolic,
                    ..base(m, n, k)
                });
            }
        }
    }
    for b_batched in [true, false] {
        for symbolic in [true, false] {
            check(&Gemm {
                batch: 3,
                b_batched,
                symbolic,
                ..base(17, 40, 33)
            });
        }
    }
    check(&Gemm {
        prologue: true,
        ..base(30, 50, 70)
    });
    for symbolic in [true, false] {
        check(&Gemm {
            f64: true,
            symbolic,
            ..base(29, 17, 300)
        });
    }
}

#[test]
fn default_gemm_1023() {
    for (a_t, b_t, strided) in [(false, false, false), (true, true, true)] {
        let g = Gemm {
            a_t,
            b_t,
            strided,
            ..base(1023, 1023, 1023)
        };
        let (cpu, _, av, bv, _) = run(&Gemm {
            symbolic: false,
            ..g.clone()
        });
        // Rows around the tile edges only (the full float64 reference is 1e9 products).
        let rows = [0i64, 11, 12, 1011, 1022];
        let pick = |v: &[f64]| -> Vec<f64> {
            rows.iter()
                .flat_map(|&i| v[(i * 1023) as usize..((i + 1) * 1023) as usize].to_vec())
                .collect()
        };
        let sub = Gemm {
            m: rows.len() as i64,
            ..g.clone()
        };
        // The reference of the picked rows: A's rows picked in the logical layout.
        let a_rows: Vec<f64> = if a_t {
            (0..1023)
                .flat_map(|p| rows.iter().map(move |&i| (p, i)))
                .map(|(p, i)| av[(p * 1023 + i) as usize])
                .collect()
        } else {
            pick(&av)
        };
        check_maths(&sub, &pick(&cpu), &a_rows, &bv);
    }
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn gemm() -> impl Strategy<Value = Gemm> {
        let dim = prop_oneof![Just(1i64), Just(12), Just(13), Just(32), Just(33), 1i64..50];
        let depth = prop_oneof![Just(1i64), Just(255), Just(256), Just(257), 1i64..40];
        (
            (dim.clone(), dim, depth),
            (0i64..3, any::<bool>(), any::<bool>(), any::<bool>()),
            (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        )
            .prop_map(
                |((m, n, k), (batch, b_batched, a_t, b_t), (symbolic, prologue, strided, f64))| {
                    Gemm {
                        m,
                        n,
                        k,
                        batch,
                        b_batched,
                        a_t,
                        b_t,
                        symbolic,
                        prologue,
                        strided,
                        f64,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(24)
        ))]
        #[test]
        fn default_gemm_equals_the_interpreter(g in gemm()) {
            check(&g);
        }
    }
}

/// The property above once per micro-kernel variant this CPU has, each forced with
/// `RIVET_MICROKERNEL` in a child process (the choice is made once per process).
#[test]
fn every_variant_runs_the_default_gemm() {
    rivet_tests::run_per_microkernel_variant("props::default_gemm_equals_the_interpreter");
}

/// The test below again with the inline f32x4 `exp` (`RIVET_EXP_RUN=inline`: softmax's
/// exponentials not as `rivet_exp_run` calls), in a child process (the choice is made once per
/// process).
#[test]
fn default_softmax_with_the_inline_exp() {
    rivet_tests::run_in_child(
        "default_injective_and_reductions_equal_the_interpreter",
        &[("RIVET_EXP_RUN", "inline")],
    );
}

/// Non-GEMM stages: the library's softmax, layer_norm, sums and elementwise kernels through the
/// default CPU schedule equal the interpreter running the same defaulted schedule bit for bit,
/// and the program as written within reassociation rounding (lane-partial sums: `k * eps`
/// relative to the sum of magnitudes; max and exact ops bit for bit), including sizes past a
/// parallel chunk, odd vector tails, reductions shorter than the lanes and symbolic ones.
#[test]
fn default_injective_and_reductions_equal_the_interpreter() {
    use rivet_compiler::kernels::defs;
    let cases: Vec<(defs::Def, Vec<Vec<i64>>)> = vec![
        (defs::softmax(DType::F32, 2, 1).unwrap(), vec![vec![3, 17]]),
        (
            defs::softmax(DType::F32, 2, 1).unwrap(),
            vec![vec![5, 1000]],
        ),
        (defs::softmax(DType::F64, 2, 1).unwrap(), vec![vec![2, 33]]),
        (
            defs::reduce("sum", DType::F32, 2, 1, false).unwrap(),
            vec![vec![4, 16 * 5 + 3]],
        ),
        (
            defs::reduce("sum", DType::F32, 1, 0, false).unwrap(),
            vec![vec![16 * 7]],
        ),
        (
            defs::reduce("max", DType::F32, 2, 1, true).unwrap(),
            vec![vec![3, 31]],
        ),
        (
            defs::reduce("max", DType::F32, 2, 1, true).unwrap(),
            vec![vec![3, 0]],
        ),
        (
            defs::layer_norm(DType::F32, 2, 1e-5).unwrap(),
            vec![vec![9, 1025], vec![1025], vec![1025]],
        ),
        (defs::softmax(DType::F32, 2, 0).unwrap(), vec![vec![5, 9]]),
        (
            defs::layer_norm(DType::F32, 2, 1e-5).unwrap(),
            vec![vec![7, 33], vec![33], vec![33]],
        ),
        (
            defs::reduce("sum", DType::F32, 2, 0, false).unwrap(),
            vec![vec![19, 23]],
        ),
        (
            defs::reduce("max", DType::F64, 3, 2, true).unwrap(),
            vec![vec![2, 3, 41]],
        ),
        (
            defs::gelu(DType::F32, 1).unwrap(),
            vec![vec![16384 * 2 + 7]],
        ),
        (defs::gelu(DType::F32, 3).unwrap(), vec![vec![1, 2, 37]]),
        (defs::relu(DType::F64, 2).unwrap(), vec![vec![1, 1]]),
    ];
    for (def, shapes) in cases {
        // The CPU (default applied by build), the interpreter on the defaulted schedule, the
        // interpreter on the schedule as written.
        let outs = [0, 1, 2].map(|which| {
            let mut s = Schedule::new(std::slice::from_ref(def.out())).unwrap();
            if which == 1 {
                apply_default_cpu(&mut s).unwrap();
            }
            let target = if which == 0 {
                Target::cpu()
            } else {
                Target::interp()
            };
            let f = build(&s, &def.args, &target, "k")
                .unwrap()
                .get_function("k")
                .unwrap();
            let ins: Vec<Value> = shapes
                .iter()
                .enumerate()
                .map(|(x, sh)| {
                    let v = data(sh.iter().product::<i64>() as usize, x as u64 + 7);
                    Value::Tensor(operand(&v, sh, def.args[x].dtype(), false))
                })
                .collect();
            let out = f.call(&ins).unwrap();
            to_f64(out.as_tensor().unwrap(), def.out().dtype())
        });
        assert!(
            outs[0]
                .iter()
                .zip(&outs[1])
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{} {shapes:?}: cpu (default schedule) != interp (defaulted schedule)",
            def.name
        );
        let k = shapes[0].last().copied().unwrap_or(1).max(1) as f64;
        let eps = if def.out().dtype() == DType::F64 {
            f64::EPSILON
        } else {
            f32::EPSILON as f64
        };
        for (x, y) in outs[0].iter().zip(&outs[2]) {
            // Relative to the output's magnitude plus the inputs' scale (data in [-1, 1)):
            // reassociation of k terms, then the ops after the sums.
            let tol = 4.0 * (k + 2.0) * eps * (y.abs() + k);
            assert!(
                x.to_bits() == y.to_bits() || (x - y).abs() <= tol,
                "{} {shapes:?}: {x} vs {y} as written (tolerance {tol})",
                def.name
            );
        }
    }
}

/// Rule 6: stages that transpose a read run in `TILE` x `TILE` tiles. Each transposed output
/// equals the input permuted, element for element, on the CPU build (contiguous and strided
/// inputs, sizes with tails, 0 and 1 rows) and equals the interpreter; the rule selects the
/// transposes and no other stage.
#[test]
fn transposes_run_in_tiles_and_equal_the_input_permuted() {
    use rivet_compiler::kernels::defs;
    use rivet_compiler::schedule::cpu_default::{transposed_axis, TILE};
    let t = TILE;
    let cases: Vec<(Vec<usize>, Vec<i64>, bool)> = vec![
        (vec![1, 0], vec![0, 5], true),
        (vec![1, 0], vec![1, 1], true),
        (vec![1, 0], vec![t, t], true),
        (vec![1, 0], vec![t + 1, 2 * t + 1], true),
        (vec![1, 0], vec![67, 33], true),
        (vec![1, 0], vec![3, 200], true),
        (vec![0, 2, 1], vec![3, 19, 10], true),
        (vec![2, 1, 0], vec![11, 2, 9], true),
        (vec![2, 0, 1], vec![10, 3, 12], true),
        (vec![1, 2, 0], vec![13, 4, 17], true),
        // The last index kept: rows are copied along, nothing to tile.
        (vec![1, 0, 2], vec![5, 6, 7], false),
    ];
    for (perm, shape, tiled) in cases {
        for dt in [DType::F32, DType::F64] {
            let def = defs::transpose(dt, &perm).unwrap();
            assert_eq!(transposed_axis(def.out()).is_some(), tiled, "{perm:?}");
            let n: i64 = shape.iter().product();
            let v = data(n as usize, shape.len() as u64);
            let oshape: Vec<i64> = perm.iter().map(|&p| shape[p]).collect();
            // Element of the output at `idx` (row-major over `oshape`) = input at idx permuted back.
            let mut want = vec![0f64; n as usize];
            for (o, w) in want.iter_mut().enumerate() {
                let (mut rem, mut src) = (o as i64, vec![0i64; shape.len()]);
                for d in (0..oshape.len()).rev() {
                    src[perm[d]] = rem % oshape[d];
                    rem /= oshape[d];
                }
                let flat = src.iter().zip(&shape).fold(0i64, |a, (&i, &s)| a * s + i);
                *w = v[flat as usize];
            }
            if dt == DType::F32 {
                want.iter_mut().for_each(|x| *x = *x as f32 as f64);
            }
            for strided in [false, true] {
                for target in rivet_tests::backends() {
                    let s = Schedule::new(std::slice::from_ref(def.out())).unwrap();
                    let f = build(&s, &def.args, &target, "k")
                        .unwrap()
                        .get_function("k")
                        .unwrap();
                    let out = f
                        .call(&[Value::Tensor(operand(&v, &shape, dt, strided))])
                        .unwrap();
                    let got = to_f64(out.as_tensor().unwrap(), dt);
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(x, y)| x.to_bits() == y.to_bits())
                            && got.len() == want.len(),
                        "{perm:?} {shape:?} {dt:?} strided={strided} {target:?}"
                    );
                }
            }
        }
    }
    // Not a transpose: a row-wise stage, a broadcast down rows, a 1-d stage.
    for def in [
        defs::relu(DType::F32, 2).unwrap(),
        defs::softmax(DType::F32, 2, 1).unwrap(),
        defs::gelu(DType::F32, 1).unwrap(),
    ] {
        assert!(transposed_axis(def.out()).is_none(), "{}", def.name);
    }
}

/// `outs` built as function `k` of `args` for `target`, with the default CPU schedule applied
/// explicitly when `default` (the interpreter then runs the CPU build's order of operations;
/// `build` applies it by itself for the CPU).
fn build_k(
    outs: &[TeTensor],
    args: &[TeTensor],
    target: Target,
    default: bool,
) -> rivet_compiler::Module {
    let mut sch = Schedule::new(outs).unwrap();
    if default {
        apply_default_cpu(&mut sch).unwrap();
    }
    build(&sch, args, &target, "k").unwrap()
}

/// Function `k` of `mdl` called on two float32 `rows x cols` inputs of seeded data, its
/// outputs (a list) flattened in order.
fn two_inputs(mdl: &rivet_compiler::Module, rows: i64, cols: i64) -> Vec<f64> {
    let va = data((rows * cols) as usize, (rows + cols) as u64);
    let vb = data((rows * cols) as usize, (rows * 7 + cols) as u64);
    let out = mdl
        .get_function("k")
        .unwrap()
        .call(&[
            Value::Tensor(operand(&va, &[rows, cols], DType::F32, false)),
            Value::Tensor(operand(&vb, &[rows, cols], DType::F32, false)),
        ])
        .unwrap();
    let Value::List(v) = out else {
        panic!("several outputs")
    };
    v.iter()
        .flat_map(|o| to_f64(o.as_tensor().unwrap(), DType::F32))
        .collect()
}

/// Row fusion (`lower::fuse_rows`): the default schedule's parallel loops over the rows of a
/// row-wise program become one loop when each touches only its own row of what they write
/// (a row sum then `A - S[i]`), and stay apart when a later loop reads another row (`S[n-1-i]`);
/// both equal the interpreter on the defaulted schedule bit for bit, at sizes with and without
/// a lane tail, and with no rows.
#[test]
fn row_fusion_only_where_each_row_is_its_own() {
    for reversed in [false, true] {
        let (n, m) = (te::var("n"), te::var("m"));
        let a = placeholder([&n, &m], DType::F32, "A").unwrap();
        let r = te::reduce_axis(0, &m, "r").unwrap();
        let s = compute([&n], |[i]| te::sum(a.at((i, &r)), &r), "S").unwrap();
        let c = compute(
            [&n, &m],
            |[i, j]| {
                let row = if reversed { &n - 1 - &i } else { i.clone() };
                a.at([i, j]) - s.at([row])
            },
            "C",
        )
        .unwrap();
        let args = vec![a, c.clone()];
        let build_on = |target: Target, default: bool| {
            build_k(std::slice::from_ref(&c), &args, target, default)
        };
        let cpu = build_on(Target::cpu(), false);
        let ir = cpu.get_source("ir").unwrap();
        let launches = ir.matches("launch ").count();
        if reversed {
            assert!(launches >= 2, "C reads other rows of S: not fused\n{ir}");
            assert!(ir.contains("local S: float32[n]"), "S outlives a row\n{ir}");
        } else {
            assert_eq!(launches, 1, "one loop over the rows\n{ir}");
            // `lower::row_locals`: S is one row, allocated per iteration.
            assert!(ir.contains("local S: float32[1]"), "S is one row\n{ir}");
        }
        let interp = build_on(Target::interp(), true);
        for (rows, cols) in [(0i64, 5i64), (1, 1), (3, 17), (5, 64), (4, 1000)] {
            let v = data((rows * cols) as usize, (rows + cols) as u64);
            let run = |mdl: &rivet_compiler::Module| {
                let f = mdl.get_function("k").unwrap();
                let out = f
                    .call(&[Value::Tensor(operand(&v, &[rows, cols], DType::F32, false))])
                    .unwrap();
                to_f64(out.as_tensor().unwrap(), DType::F32)
            };
            let (x, y) = (run(&cpu), run(&interp));
            assert_eq!(x.len() as i64, rows * cols);
            assert!(
                x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "reversed={reversed} {rows}x{cols}: cpu {x:?} != interp {y:?}"
            );
        }
    }
}

/// Row fusion brings a later loop up past statements it commutes with (`fuse_rows::WINDOW`):
/// two column sums of one input (layer_norm's weight and bias gradients) have their chunk
/// loops fused, the second past the first's init and combination, so a chunk of rows is read
/// once while in cache, and inside that loop the two updates share their loops over the
/// chunk's rows and the columns (`fuse_siblings`). When the second sum reads the first's result (`T[j] = sum_i of
/// A[i, j] - S[j]`), its chunk update must stay after the combination that writes `S` (its
/// zeroing may still join: it touches nothing else). Both equal the interpreter bit for bit,
/// at sizes with and without tails, and with no rows.
#[test]
fn row_fusion_brings_up_only_loops_that_commute() {
    for dependent in [false, true] {
        let (n, m) = (te::var("n"), te::var("m"));
        let a = placeholder([&n, &m], DType::F32, "A").unwrap();
        let b = placeholder([&n, &m], DType::F32, "B").unwrap();
        let r = te::reduce_axis(0, &n, "r").unwrap();
        let s = compute(
            [&m],
            |[j]| te::sum(a.at((&r, &j)) * b.at((&r, &j)), &r),
            "S",
        )
        .unwrap();
        let r2 = te::reduce_axis(0, &n, "r2").unwrap();
        let t = compute(
            [&m],
            |[j]| {
                let x = a.at((&r2, &j));
                te::sum(if dependent { x - s.at([&j]) } else { x }, &r2)
            },
            "T",
        )
        .unwrap();
        let args = vec![a, b, s.clone(), t.clone()];
        let outs = [s.clone(), t.clone()];
        let build_on = |target: Target, default: bool| build_k(&outs, &args, target, default);
        let cpu = build_on(Target::cpu(), false);
        let ir = cpu.get_source("ir").unwrap();
        let together = ir
            .split("launch ")
            .any(|l| l.contains("= (S.chunks[") && l.contains("= (T.chunks["));
        assert!(
            ir.contains("S.chunks") && ir.contains("T.chunks"),
            "column chunks\n{ir}"
        );
        assert_eq!(together, !dependent, "dependent={dependent}\n{ir}");
        // And inside the fused loop, the two chunk updates share their loops over the rows
        // of the chunk and the columns (`fuse_siblings`): an update of S.chunks directly
        // followed by one of T.chunks, in one loop body.
        let lines: Vec<&str> = ir.lines().collect();
        let adjacent = lines.windows(2).any(|w| {
            w[0].contains("= (S.chunks[")
                && w[1].contains("= (T.chunks[")
                && w[0].find('S') == w[1].find('T')
        });
        assert_eq!(adjacent, !dependent, "dependent={dependent}\n{ir}");
        let interp = build_on(Target::interp(), true);
        for (rows, cols) in [(0i64, 5i64), (1, 1), (3, 17), (70, 9), (130, 64)] {
            let (x, y) = (
                two_inputs(&cpu, rows, cols),
                two_inputs(&interp, rows, cols),
            );
            assert_eq!(x.len() as i64, 2 * cols);
            assert!(
                x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "dependent={dependent} {rows}x{cols}: cpu {x:?} != interp {y:?}"
            );
        }
    }
}

/// Chunk fusion (`lower::fuse_chunks`): a row loop and a later column sum over the same rows
/// (`C[i, j] = (A B - H[i]) H[i]` with `H = rsqrt(S^2 + 1)` of a row sum `S`, and `T[j] = sum_i
/// A B`, as layer_norm's backward writes `dx` and sums the weight gradient) become one parallel
/// loop over the chunks of rows: row `c*64 + q`'s stages, then the chunk's update from the same
/// row, the two loops over the columns fused. The 1-d stage `H` (an output, a value per row
/// of C) joins the row loop too (`fuse_rows`): with 130 rows (constant) it is one vectorized
/// loop, with symbolic rows one parallel loop over the rows (`cpu_default::per_row`; before,
/// it was cut into chunks of 16,384 and kept C's rows out). The rows past the last
/// whole chunk run in a loop of their own. When the column sum reads the row loop's output
/// (`T[j] = sum_i C[i, j]`) it is not moved past the loops that write `C`. All equal the
/// interpreter on the defaulted schedule bit for bit, at sizes with no rows, fewer than a
/// chunk, whole chunks and leftover rows.
#[test]
fn row_loops_join_the_chunks_of_a_column_sum_over_their_rows() {
    for (dependent, symbolic) in [(false, true), (false, false), (true, true)] {
        let (n, m) = if symbolic {
            (te::var("n"), te::var("m"))
        } else {
            (Expr::int(130), Expr::int(33))
        };
        let a = placeholder([&n, &m], DType::F32, "A").unwrap();
        let b = placeholder([&n, &m], DType::F32, "B").unwrap();
        let r = te::reduce_axis(0, &m, "r").unwrap();
        let s = compute([&n], |[i]| te::sum(a.at((&i, &r)), &r), "S").unwrap();
        let h = compute([&n], |[i]| te::rsqrt(s.at([&i]) * s.at([&i]) + 1.0), "H").unwrap();
        let c = compute(
            [&n, &m],
            |[i, j]| (a.at([&i, &j]) * b.at([&i, &j]) - h.at([&i])) * h.at([&i]),
            "C",
        )
        .unwrap();
        let r2 = te::reduce_axis(0, &n, "r2").unwrap();
        let t = compute(
            [&m],
            |[j]| {
                let x = if dependent {
                    c.at((&r2, &j))
                } else {
                    a.at((&r2, &j)) * b.at((&r2, &j))
                };
                te::sum(x, &r2)
            },
            "T",
        )
        .unwrap();
        let args = vec![a, b, c.clone(), t.clone(), h.clone()];
        let outs = [c.clone(), t.clone(), h.clone()];
        let build_on = |target: Target, default: bool| build_k(&outs, &args, target, default);
        let cpu = build_on(Target::cpu(), false);
        let ir = cpu.get_source("ir").unwrap();
        let what = format!("dependent={dependent} symbolic={symbolic}\n{ir}");
        assert!(ir.contains("T.chunks"), "column chunks: {what}");
        // The row's store of C and the chunk update of T in one loop body, next to each other.
        // The launch updating the chunks of T.
        let chunks = ir
            .split("launch ")
            .find(|l| l.contains("= (T.chunks["))
            .unwrap_or_else(|| panic!("no chunk update: {what}"));
        // The row sum S's partials accumulate in it, unless T reads C (then T's chunks stay
        // after the loops writing C, and S is not next to them).
        assert_eq!(chunks.contains("= (S.lanes["), !dependent, "{what}");
        // C's row and the chunk update in one loop body, next to each
        // other, and H written in the same loop.
        let lines: Vec<&str> = chunks.lines().collect();
        let together = lines.windows(2).any(|w| {
            w[0].trim_start().starts_with("C[")
                && w[1].trim_start().starts_with("T.chunks[")
                && w[0].find('C') == w[1].find('T')
        });
        let joined = lines.iter().any(|l| l.trim_start().starts_with("H["));
        assert_eq!(together, !dependent, "{what}");
        assert_eq!(joined, !dependent, "{what}");
        let interp = build_on(Target::interp(), true);
        let sizes: &[(i64, i64)] = if symbolic {
            &[(0, 5), (1, 1), (63, 17), (64, 9), (130, 33), (200, 64)]
        } else {
            &[(130, 33)]
        };
        for &(rows, cols) in sizes {
            let (x, y) = (
                two_inputs(&cpu, rows, cols),
                two_inputs(&interp, rows, cols),
            );
            assert_eq!(x.len() as i64, rows * cols + cols + rows);
            assert!(
                x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "dependent={dependent} {rows}x{cols}: cpu {x:?} != interp {y:?}"
            );
        }
    }
}

/// Chunk fusion at hostile constant row counts: 2^31 + 1 rows build into 2^25 chunks and a
/// loop over the one row left over; 2^62 + 5 and i64::MAX rows are a typed error (the
/// temporaries would exceed `MAX_ALLOC_BYTES`), never a panic or a wrapped range.
#[test]
fn chunk_fusion_at_hostile_row_counts() {
    for rows in [(1i64 << 31) + 1, (1i64 << 62) + 5, i64::MAX] {
        let (n, m) = (Expr::int(rows), Expr::int(3));
        let a = placeholder([&n, &m], DType::F32, "A").unwrap();
        let r = te::reduce_axis(0, &m, "r").unwrap();
        let s = compute([&n], |[i]| te::sum(a.at((&i, &r)), &r), "S").unwrap();
        let c = compute([&n, &m], |[i, j]| a.at([&i, &j]) - s.at([&i]), "C").unwrap();
        let r2 = te::reduce_axis(0, &n, "r2").unwrap();
        let t = compute([&m], |[j]| te::sum(a.at((&r2, &j)), &r2), "T").unwrap();
        let outs = [c.clone(), t.clone()];
        let built = build(
            &Schedule::new(&outs).unwrap(),
            &[a, c, t],
            &Target::cpu(),
            "k",
        );
        if rows < 1 << 32 {
            let ir = built.unwrap().get_source("ir").unwrap();
            assert!(ir.contains("parallel for c.init in [0, 33554432)"), "{ir}");
            assert!(
                ir.contains("parallel for i in [2147483648, 2147483648 + 1)"),
                "{ir}"
            );
        } else {
            let e = built
                .err()
                .unwrap_or_else(|| panic!("{rows} rows built"))
                .to_string();
            assert!(e.contains("MAX_ALLOC_BYTES"), "{rows}: {e}");
        }
    }
}

/// A batched GEMM with a constant batch of at least 32 runs batch by batch
/// (`packed_gemm::Rows`): the product's parallel loop over the batch, each batch element's
/// panels packed inside it (B broadcast: only A's; with 17 rows a broadcast B's GEMM takes
/// the batch into its rows instead, 40 x 17 rows in whole panels). Checked as above, and the
/// path taken.
#[test]
fn default_batched_gemm_row_by_row() {
    let by_rows = |g: &Gemm| {
        let mut s = Schedule::new(&g.program()[2..]).unwrap();
        apply_default_cpu(&mut s).unwrap();
        rivet_tests::packs_by_rows(&s)
    };
    for (b_batched, m) in [(true, 17), (true, 24), (false, 24), (false, 17)] {
        for f64 in [false, true] {
            for a_t in [false, true] {
                let g = Gemm {
                    batch: 40,
                    b_batched,
                    symbolic: false,
                    f64,
                    a_t,
                    ..base(m, 40, 33)
                };
                check(&g);
                assert_eq!(by_rows(&g), b_batched || m == 24, "{g:?}");
            }
        }
    }
    // A symbolic batch: parallel over the batch and the column panels, as before.
    let g = Gemm {
        batch: 40,
        ..base(17, 40, 33)
    };
    check(&g);
    assert!(!by_rows(&g));
}
