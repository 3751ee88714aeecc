//! Gradient programs (`te::gradient`) built with the default CPU schedule, against the
//! interpreter oracle: the backward functions of `benches/grad_bench.py` (matmul, softmax,
//! layer_norm over the last axis) at random shapes, odd sizes included (1, 3, 17, 97, 1023),
//! float32 and float64, constant and symbolic dims.
//!
//! For each program: the CPU build of the untouched schedule equals, bit for bit, the
//! interpreter running the same defaulted schedule; and it is within reassociation rounding of
//! the interpreter running the program as written (lane partials, row chunks of a reduction
//! down columns, the GEMM's fused multiply-adds). Outputs are poisoned with NaN first, so an
//! element never written fails. Named tests pin what the default schedule builds for them:
//! the reductions down columns of layer_norm's weight and bias in row chunks (`.chunks`, with
//! and without a tail), the softmax gradient's last loop as vector code with a packed select
//! (ties of the row maximum and NaN rows included), scalars shared by a reduction down columns.

use proptest::prelude::*;
use proptest::test_runner::Config;
use rivet_compiler::ir::Expr;
use rivet_compiler::schedule::cpu_default::apply_default_cpu;
use rivet_compiler::te::{self, compute, placeholder, Tensor as Te};
use rivet_compiler::{build, Schedule, Target};
use rivet_runtime::{DType, Tensor, Value};
use rivet_tests::floats::{tensor_of as tensor, values_f64 as to_f64};

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

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Matmul,
    Softmax,
    LayerNorm,
}

/// A backward program: the forward's inputs, the head, the gradients; and the extents of the
/// symbolic dims, if any.
struct Program {
    inputs: Vec<Te>,
    head: Te,
    grads: Vec<Te>,
    sym: Vec<(Expr, i64)>,
}

fn dim(n: i64, name: &str, symbolic: bool, sym: &mut Vec<(Expr, i64)>) -> Expr {
    if symbolic {
        let v = te::var(name);
        sym.push((v.clone(), n));
        v
    } else {
        Expr::int(n)
    }
}

/// The forward program of `op` (written as `benches/grad_bench.py` writes it) and its
/// gradient: `rows x cols` (matmul: `A[rows, k] @ B[k, cols]`).
fn program(op: Op, rows: i64, cols: i64, k: i64, dt: DType, symbolic: bool) -> Program {
    let mut sym = Vec::new();
    let r = dim(rows, "rows", symbolic, &mut sym);
    let c = dim(cols, "cols", symbolic, &mut sym);
    let (inputs, out) = match op {
        Op::Matmul => {
            let a = placeholder((&r, k), dt, "A").unwrap();
            let b = placeholder((k, &c), dt, "B").unwrap();
            let red = te::reduce_axis(0, k, "k").unwrap();
            let out = compute(
                [r, c],
                |[i, j]| te::sum(a.at((i, &red)) * b.at((&red, j)), &red),
                "C",
            )
            .unwrap();
            (vec![a, b], out)
        }
        Op::Softmax => {
            let x = placeholder([&r, &c], dt, "X").unwrap();
            let r1 = te::reduce_axis(0, &c, "r1").unwrap();
            let mx = compute([&r], |[i]| te::max_over(x.at((i, &r1)), &r1), "max").unwrap();
            let e = compute(
                [&r, &c],
                |[i, j]| te::exp(x.at([&i, &j]) - mx.at([i])),
                "exp",
            )
            .unwrap();
            let r2 = te::reduce_axis(0, &c, "r2").unwrap();
            let s = compute([&r], |[i]| te::sum(e.at((i, &r2)), &r2), "sum").unwrap();
            let out = compute([r, c], |[i, j]| e.at([&i, &j]) * (1.0 / s.at([i])), "Y").unwrap();
            (vec![x], out)
        }
        Op::LayerNorm => {
            let x = placeholder([&r, &c], dt, "X").unwrap();
            let g = placeholder([&c], dt, "gamma").unwrap();
            let b = placeholder([&c], dt, "beta").unwrap();
            let nf = te::cast(dt, &c);
            let r1 = te::reduce_axis(0, &c, "r1").unwrap();
            let total = compute([&r], |[i]| te::sum(x.at((i, &r1)), &r1), "total").unwrap();
            let cen = compute(
                [&r, &c],
                |[i, j]| x.at([&i, &j]) - total.at([i]) / &nf,
                "centered",
            )
            .unwrap();
            let r2 = te::reduce_axis(0, &c, "r2").unwrap();
            let sq = compute(
                [&r],
                |[i]| {
                    let v = cen.at((i, &r2));
                    te::sum(&v * &v, &r2)
                },
                "sqsum",
            )
            .unwrap();
            let out = compute(
                [r, c],
                |[i, j]| {
                    let var = sq.at([&i]) / &nf;
                    let inv = te::rsqrt(var + 1e-5);
                    cen.at([&i, &j]) * inv * g.at([&j]) + b.at([j])
                },
                "Y",
            )
            .unwrap();
            (vec![x, g, b], out)
        }
    };
    let head = placeholder(out.shape(), dt, "head").unwrap();
    let grads = te::gradient(&out, &inputs, Some(&head)).unwrap();
    Program {
        inputs,
        head,
        grads,
        sym,
    }
}

fn shape_of(t: &Te, sym: &[(Expr, i64)]) -> Vec<i64> {
    t.shape()
        .iter()
        .map(|e| {
            e.as_int()
                .or_else(|| sym.iter().find(|(v, _)| v == e).map(|(_, n)| *n))
                .unwrap()
        })
        .collect()
}

/// The program's gradients for `ins` (the forward's inputs, then the head) on `target` with
/// schedule `s`, outputs poisoned with NaN; and the build's IR.
fn call(
    p: &Program,
    s: &Schedule,
    target: &Target,
    ins: &[Vec<f64>],
    dt: DType,
) -> (Vec<Vec<f64>>, String) {
    let mut args: Vec<Te> = p.inputs.clone();
    args.push(p.head.clone());
    args.extend(p.grads.iter().cloned());
    let m = build(s, &args, target, "bwd").unwrap_or_else(|e| panic!("build on {target}: {e}"));
    let f = m.get_function("bwd").unwrap();
    let mut vals: Vec<Value> = args[..ins.len()]
        .iter()
        .zip(ins)
        .map(|(t, v)| Value::Tensor(tensor(v, &shape_of(t, &p.sym), dt)))
        .collect();
    let outs: Vec<Tensor> = p
        .grads
        .iter()
        .map(|g| {
            let sh = shape_of(g, &p.sym);
            tensor(
                &vec![f64::NAN; sh.iter().product::<i64>() as usize],
                &sh,
                dt,
            )
        })
        .collect();
    vals.extend(outs.iter().cloned().map(Value::Tensor));
    f.call(&vals)
        .unwrap_or_else(|e| panic!("call on {target}: {e}"));
    (
        outs.iter().map(|t| to_f64(t, dt)).collect(),
        m.get_source("ir").unwrap_or_default(),
    )
}

/// Checks `op` at `rows x cols` (matmul's inner extent `k`): CPU (default schedule) ==
/// interpreter (defaulted schedule) bit for bit, and within reassociation rounding of the
/// interpreter as written. Returns the CPU build's IR.
fn check(op: Op, rows: i64, cols: i64, k: i64, dt: DType, symbolic: bool, seed: u64) -> String {
    let p = program(op, rows, cols, k, dt, symbolic);
    let what = format!("{op:?} {rows}x{cols} (k {k}) {dt} symbolic={symbolic}");
    let mut ins: Vec<Vec<f64>> = Vec::new();
    for (x, t) in p.inputs.iter().chain([&p.head]).enumerate() {
        let n = shape_of(t, &p.sym).iter().product::<i64>() as usize;
        ins.push(data(n, seed + 7919 * x as u64));
    }
    let plain = Schedule::new(&p.grads).unwrap();
    let mut defaulted = plain.clone();
    apply_default_cpu(&mut defaulted).unwrap();
    let (cpu, ir) = call(&p, &plain, &Target::cpu(), &ins, dt);
    let (oracle, _) = call(&p, &defaulted, &Target::interp(), &ins, dt);
    let (written, _) = call(&p, &plain, &Target::interp(), &ins, dt);
    let eps = if dt == DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    };
    let terms = rows.max(cols).max(k) as f64;
    for (g, ((c, o), w)) in p.grads.iter().zip(cpu.iter().zip(&oracle).zip(&written)) {
        assert!(
            c.iter().zip(o).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: {}: cpu (default schedule) != interp (defaulted schedule)\n{ir}",
            g.name()
        );
        // Reassociated sums of `terms` terms: relative to the gradient's scale.
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        for (e, (x, y)) in c.iter().zip(w).enumerate() {
            let tol = 16.0 * (terms + 2.0) * eps * (y.abs() + scale);
            assert!(
                x.is_finite() && (x - y).abs() <= tol,
                "{what}: {}[{e}] = {x}, as written {y} (tolerance {tol})",
                g.name()
            );
        }
    }
    ir
}

/// Sizes the rewrites care about: 1, vector tails, a lane count, row chunks with and without
/// a tail (64 rows each, the rewrite from 128 rows), 1023.
const SIZES: [i64; 10] = [1, 3, 4, 17, 33, 97, 128, 129, 200, 1023];

#[test]
fn odd_sizes_of_every_program() {
    for (x, &(rows, cols)) in [
        (1i64, 1i64),
        (3, 17),
        (17, 3),
        (97, 33),
        (1023, 5),
        (5, 1023),
    ]
    .iter()
    .enumerate()
    {
        for dt in [DType::F32, DType::F64] {
            for op in [Op::Softmax, Op::LayerNorm] {
                check(op, rows, cols, 1, dt, false, x as u64);
            }
        }
    }
    for (m, n, k) in [
        (1, 1, 1),
        (3, 17, 97),
        (97, 3, 17),
        (17, 97, 33),
        (1023, 3, 5),
        (33, 40, 1023),
    ] {
        check(Op::Matmul, m, n, k, DType::F32, false, (m + n + k) as u64);
    }
    check(Op::Matmul, 97, 33, 17, DType::F64, true, 5);
}

/// layer_norm's weight and bias gradients are reductions down columns: from 128 rows they are
/// computed in chunks of rows (`gamma_grad_Y.chunks`), with a tail stage where the rows are not
/// a multiple of the chunk (and always for symbolic rows); below that, the reduction loop runs
/// between a chunk of columns and its vectorized inside.
#[test]
fn layer_norm_weight_gradients_in_row_chunks() {
    for (rows, tail) in [(128i64, false), (129, true), (1023, true), (1024, false)] {
        let ir = check(Op::LayerNorm, rows, 40, 1, DType::F32, false, rows as u64);
        assert!(
            ir.contains("gamma_grad_Y.chunks"),
            "{rows} rows: not in chunks\n{ir}"
        );
        assert!(
            ir.contains("beta_grad_Y.chunks"),
            "{rows} rows: not in chunks\n{ir}"
        );
        assert_eq!(
            ir.contains("gamma_grad_Y.tail"),
            tail,
            "{rows} rows: tail\n{ir}"
        );
    }
    let ir = check(Op::LayerNorm, 200, 7, 1, DType::F64, true, 3);
    assert!(
        ir.contains("gamma_grad_Y.tail"),
        "symbolic rows: a tail\n{ir}"
    );
    let ir = check(Op::LayerNorm, 100, 70, 1, DType::F32, false, 4);
    assert!(!ir.contains(".chunks"), "100 rows: not chunked\n{ir}");
    let chunk = ir
        .find("parallel for j0.outer")
        .expect("column chunks in parallel");
    assert!(
        ir[chunk..].contains("for i in [0, 100)"),
        "the reduction loop inside the column chunk\n{ir}"
    );
}

/// The softmax gradient's last stage, `... + select(X == max, adjoint / ties, 0)`, reads two
/// row scalars under the select: as one-element row locals (constant index, constant size)
/// they cannot fault, so the loop is vector code and the select a packed compare and bit
/// select. Rows with ties of the maximum, an infinite and a NaN row give the same bits as the
/// interpreter.
#[test]
fn softmax_gradient_select_is_vectorized_with_ties_and_nans() {
    let (rows, cols) = (4i64, 37i64);
    let p = program(Op::Softmax, rows, cols, 1, DType::F32, false);
    let mut x = data((rows * cols) as usize, 11);
    for j in [0usize, 5, 36] {
        x[j] = 2.0; // three ties of the maximum in row 0
    }
    x[cols as usize + 3] = f64::INFINITY;
    x[2 * cols as usize + 4] = f64::NAN;
    let head = data((rows * cols) as usize, 12);
    let plain = Schedule::new(&p.grads).unwrap();
    let mut defaulted = plain.clone();
    apply_default_cpu(&mut defaulted).unwrap();
    let ins = [x, head];
    let (cpu, ir) = call(&p, &plain, &Target::cpu(), &ins, DType::F32);
    let (oracle, _) = call(&p, &defaulted, &Target::interp(), &ins, DType::F32);
    let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    assert!(
        cpu[0].iter().zip(&oracle[0]).all(|(a, b)| same(*a, *b)),
        "cpu {:?}\ninterp {:?}",
        cpu[0],
        oracle[0]
    );
    let last = ir
        .lines()
        .find(|l| l.contains("X_grad[ramp("))
        .unwrap_or_else(|| panic!("the last loop is not vector code\n{ir}"));
    assert!(last.contains("select(("), "{last}");
    // The same program on the interpreter as written: the gradient of a softmax row sums to
    // zero (ties split the max's adjoint, which is itself zero up to rounding).
    let (written, _) = call(&p, &plain, &Target::interp(), &ins, DType::F32);
    let row0: f64 = written[0][..cols as usize].iter().sum();
    assert!(row0.abs() < 1e-5, "row 0 of the gradient sums to {row0}");
}

fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// Random shapes from `SIZES` (and a random one), float32 and float64, constant or
    /// symbolic dims: softmax and layer_norm gradients.
    #[test]
    fn rowwise_gradients_equal_the_interpreter(
        op in prop_oneof![Just(Op::Softmax), Just(Op::LayerNorm)],
        rows in prop_oneof![proptest::sample::select(SIZES.to_vec()), 1i64..300],
        cols in prop_oneof![proptest::sample::select(SIZES[..7].to_vec()), 1i64..70],
        f64_ in any::<bool>(),
        symbolic in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dt = if f64_ { DType::F64 } else { DType::F32 };
        check(op, rows, cols, 1, dt, symbolic, seed);
    }

    /// Random matmul gradients (both operands), sizes from `SIZES` up to 129.
    #[test]
    fn matmul_gradients_equal_the_interpreter(
        m in proptest::sample::select(SIZES[..8].to_vec()),
        n in proptest::sample::select(SIZES[..8].to_vec()),
        k in proptest::sample::select(SIZES[..8].to_vec()),
        f64_ in any::<bool>(),
        symbolic in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dt = if f64_ { DType::F64 } else { DType::F32 };
        check(Op::Matmul, m, n, k, dt, symbolic, seed);
    }
}
