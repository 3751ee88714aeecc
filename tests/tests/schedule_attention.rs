//! Attention-shaped programs through the default CPU schedule, against the interpreter.
//!
//! `O = softmax(Q K^T * scale) V` written as its obvious stages (the scores with the
//! reduction inside an expression, `te::sum(..) * scale`; the row max; the exponentials; the
//! row sum; the normalised second contraction), and a GEMM feeding an elementwise epilogue.
//! Both contractions take the packed GEMM path; a padded GEMM result that is only an
//! intermediate is read in place by its readers (no copy of it); with at least
//! `cpu_default::SLICES` heads the exponentials run head by head with the stages that read
//! them, one head's slice alive at a time. Checked at sizes that are no
//! multiple of any tile (1, 3, 17, 97), float32 and float64, with constant and symbolic
//! dims: the CPU build equals the interpreter running the same defaulted schedule bit for bit
//! (same operations in the same order), and the interpreter running the program as written
//! within the fused-sum bound of docs/cpu.md (each GEMM's multiply-adds fused) and the
//! reassociation of the lane-partial row sum (docs/default_schedules.md, rule 3).

use rivet_compiler::artifact::Compiled;
use rivet_compiler::codegen::interp::InterpBackend;
use rivet_compiler::codegen::Backend;
use rivet_compiler::ir::Expr;
use rivet_compiler::schedule::cpu_default::apply_default_cpu;
use rivet_compiler::te::{self, compute, placeholder, Tensor as TeTensor};
use rivet_compiler::{build, Module, Schedule, Target};
use rivet_runtime::{DType, Tensor, Value};
use rivet_tests::floats::{tensor_of as tensor, values_f64 as to_f64};
use std::sync::Arc;

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

/// `[Q, K, V, O]`: attention over `heads x n x d` (dims symbolic when `symbolic`).
fn attention(heads: i64, n: i64, d: i64, dt: DType, symbolic: bool) -> Vec<TeTensor> {
    let dim = |v: i64, name: &str| {
        if symbolic {
            te::var(name)
        } else {
            Expr::int(v)
        }
    };
    let (h, n_, d_) = (dim(heads, "h"), dim(n, "n"), dim(d, "d"));
    let q = placeholder([&h, &n_, &d_], dt, "Q").unwrap();
    let k = placeholder([&h, &n_, &d_], dt, "K").unwrap();
    let v = placeholder([&h, &n_, &d_], dt, "V").unwrap();
    let scale = 1.0 / (d as f64).sqrt();
    let c = te::reduce_axis(0, &d_, "c").unwrap();
    let s = compute(
        [&h, &n_, &n_],
        |[b, i, j]| te::sum(q.at((&b, &i, &c)) * k.at((&b, &j, &c)), &c) * scale,
        "S",
    )
    .unwrap();
    let j1 = te::reduce_axis(0, &n_, "j1").unwrap();
    let m = compute(
        [&h, &n_],
        |[b, i]| te::max_over(s.at((&b, &i, &j1)), &j1),
        "M",
    )
    .unwrap();
    let e = compute(
        [&h, &n_, &n_],
        |[b, i, j]| te::exp(s.at([&b, &i, &j]) - m.at([&b, &i])),
        "E",
    )
    .unwrap();
    let j2 = te::reduce_axis(0, &n_, "j2").unwrap();
    let l = compute([&h, &n_], |[b, i]| te::sum(e.at((&b, &i, &j2)), &j2), "L").unwrap();
    let j3 = te::reduce_axis(0, &n_, "j3").unwrap();
    let o = compute(
        [&h, &n_, &d_],
        |[b, i, x]| {
            te::sum(
                e.at((&b, &i, &j3)) / l.at([&b, &i]) * v.at((&b, &j3, &x)),
                &j3,
            )
        },
        "O",
    )
    .unwrap();
    vec![q, k, v, o]
}

/// `[A, B, bias, Y]`: `Y = gelu(A @ B + bias)` (exact gelu), `m x k` by `k x n`.
fn gemm_gelu(m: i64, n: i64, k: i64, dt: DType) -> Vec<TeTensor> {
    let a = placeholder([m, k], dt, "A").unwrap();
    let b = placeholder([k, n], dt, "B").unwrap();
    let bias = placeholder([n], dt, "bias").unwrap();
    let r = te::reduce_axis(0, k, "r").unwrap();
    let c = compute(
        [m, n],
        |[i, j]| te::sum(a.at((&i, &r)) * b.at((&r, &j)), &r),
        "C",
    )
    .unwrap();
    let y = compute(
        [m, n],
        |[i, j]| {
            let x = c.at([&i, &j]) + bias.at([&j]);
            x.clone() * 0.5 * (te::erf(x * std::f64::consts::FRAC_1_SQRT_2) + 1.0)
        },
        "Y",
    )
    .unwrap();
    vec![a, b, bias, y]
}

/// Builds `args` (the last one the output) three ways and calls each on `inputs`: the CPU with
/// the default schedule, the interpreter on the defaulted schedule, the interpreter as
/// written. Returns the three outputs and the CPU build's IR. The CPU build's lowered function
/// is also run on the interpreter (which poisons locals marked stored-before-read) and must
/// give the CPU's bits.
fn three_ways(args: &[TeTensor], inputs: &[Tensor]) -> ([Vec<f64>; 3], String) {
    let out = args.last().unwrap();
    let dt = out.dtype();
    let mut ir = String::new();
    let outs = [0, 1, 2].map(|which| {
        let mut s = Schedule::new(std::slice::from_ref(out)).unwrap();
        if which == 1 {
            apply_default_cpu(&mut s).unwrap();
        }
        let target = if which == 0 {
            Target::cpu()
        } else {
            Target::interp()
        };
        let mdl = build(&s, args, &target, "k").unwrap();
        let ins: Vec<Value> = inputs.iter().cloned().map(Value::Tensor).collect();
        if which == 0 {
            ir = mdl.get_source("ir").unwrap();
            // The CPU build's own lowered function (row fusion, row locals, the CPU's
            // `lower::overwrite` marks) on the interpreter, which poisons every marked local:
            // a wrong mark in the fused loops shows as a wrong result here (the CPU's arena
            // may hand back a block still holding the right values from the last call).
            let c = &mdl.funcs[0];
            let fused = Module {
                funcs: vec![Arc::new(Compiled {
                    nest: c.nest.clone(),
                    func: c.func.clone(),
                    target: Target::interp(),
                    checked: false,
                    temps: c.temps.clone(),
                    work: c.work.clone(),
                    kernel: InterpBackend::default().compile(&c.func).unwrap(),
                    recipe: None,
                })],
            };
            let a = fused.get_function("k").unwrap().call(&ins).unwrap();
            let b = mdl.get_function("k").unwrap().call(&ins).unwrap();
            let (a, b) = (
                to_f64(a.as_tensor().unwrap(), dt),
                to_f64(b.as_tensor().unwrap(), dt),
            );
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "the CPU's fused nest on the interpreter != the CPU build"
            );
            return b;
        }
        let got = mdl.get_function("k").unwrap().call(&ins).unwrap();
        to_f64(got.as_tensor().unwrap(), dt)
    });
    (outs, ir)
}

fn dt_name(dt: DType) -> &'static str {
    if dt == DType::F64 {
        "float64"
    } else {
        "float32"
    }
}

fn eps(dt: DType) -> f64 {
    if dt == DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    }
}

/// The obvious attention program: both contractions packed, the scores read in place, and the
/// CPU build equal to the interpreter (defaulted) bit for bit and to the program as written
/// within the bound below, at ragged sizes, f32 and f64, constant and symbolic dims.
#[test]
fn attention_takes_the_packed_path_and_equals_the_interpreter() {
    for dt in [DType::F32, DType::F64] {
        for (heads, n, d, symbolic) in [
            (1i64, 1i64, 1i64, false),
            (2, 3, 5, false),
            (2, 17, 8, false),
            (1, 97, 33, false),
            (16, 17, 8, false),
            (17, 3, 97, false),
            (3, 17, 64, true),
            (1, 97, 3, true),
        ] {
            let args = attention(heads, n, d, dt, symbolic);
            let len = (heads * n * d) as usize;
            let scale_in = |v: Vec<f64>| v.into_iter().map(|x| 2.0 * x).collect::<Vec<_>>();
            let inputs: Vec<Tensor> = (0..3)
                .map(|s| tensor(&scale_in(data(len, 11 + s + n as u64)), &[heads, n, d], dt))
                .collect();
            let ([cpu, interp, plain], ir) = three_ways(&args, &inputs);
            let what = format!("{dt:?} heads={heads} n={n} d={d} symbolic={symbolic}");
            assert_eq!(cpu.len(), len, "{what}");
            // Work below the packing threshold stays a plain loop nest; from 32^3
            // multiply-adds per contraction (and always with symbolic dims) both are packed.
            if symbolic || heads * n * n * d >= 32 * 32 * 32 {
                assert_eq!(
                    ir.matches("call gemm_update").count(),
                    2,
                    "{what}: both contractions packed\n{ir}"
                );
                // The scores are never copied out of their padded GEMM result.
                assert!(
                    !ir.contains("local S_sum0:"),
                    "{what}: the scores are read in place\n{ir}"
                );
                // No pack and no padded result is zeroed by its `Allocate`: each is stored in
                // full (a pack, or the GEMM's initialisation in the loop over heads) before any
                // read (`lower::overwrite`; the interpreter poisons such locals, so a wrong
                // mark would show in the comparison below).
                for line in ir.lines().filter(|l| l.trim_start().starts_with("local ")) {
                    if line.contains("_packed") || line.contains(".padded") {
                        assert!(
                            line.ends_with("(stored before read)"),
                            "{what}: {line} is zeroed per call\n{ir}"
                        );
                    }
                }
            }
            // At least `SLICES` heads: the exponentials run per head with their readers, so
            // one head's slice of them is alive at a time (rule 5, row fusion, row locals).
            if !symbolic && heads >= 16 {
                assert!(
                    ir.contains(&format!("local E: {}[1, {n}, {n}]", dt_name(dt))),
                    "{what}: one head of E at a time\n{ir}"
                );
            }
            assert!(
                cpu.iter()
                    .zip(&interp)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{what}: cpu (default schedule) != interp (defaulted schedule)"
            );
            // As written: the scores (|s| <= 4 d * scale) differ by the fused rounding of d
            // products, exp turns an absolute error of the exponent into a relative one of
            // the weights; the row sum of n weights is reassociated; the output is a convex
            // combination of V (|v| <= 2) summed over n terms. Each a few `(k + 2) eps`.
            let tol = 8.0
                * ((d as f64 + 2.0) * 4.0 * (d as f64).sqrt() + (n as f64 + 2.0) * 3.0)
                * eps(dt);
            for (x, y) in cpu.iter().zip(&plain) {
                assert!(
                    (x - y).abs() <= tol,
                    "{what}: {x} vs {y} as written (tolerance {tol})"
                );
            }
        }
    }
}

/// A GEMM whose result is an intermediate (read by an elementwise epilogue) and whose rows or
/// columns are no multiple of the register tile: the epilogue reads the padded result in
/// place, and the result equals the interpreter bit for bit (and the program as written within
/// the fused-sum bound).
#[test]
fn a_padded_intermediate_gemm_is_read_in_place() {
    for dt in [DType::F32, DType::F64] {
        for (m, n, k) in [
            (1i64, 1i64, 97i64),
            (3, 17, 97),
            (17, 97, 33),
            (97, 3, 64),
            (97, 97, 97),
        ] {
            let args = gemm_gelu(m, n, k, dt);
            let inputs = [
                tensor(&data((m * k) as usize, 3), &[m, k], dt),
                tensor(&data((k * n) as usize, 5), &[k, n], dt),
                tensor(&data(n as usize, 7), &[n], dt),
            ];
            let ([cpu, interp, plain], ir) = three_ways(&args, &inputs);
            let what = format!("{dt:?} {m}x{n}x{k}");
            assert_eq!(cpu.len() as i64, m * n, "{what}");
            if m * n * k >= 32 * 32 * 32 {
                assert!(ir.contains("call gemm_update"), "{what}: packed\n{ir}");
                assert!(ir.contains("local C.padded"), "{what}: padded\n{ir}");
                assert!(!ir.contains("local C:"), "{what}: no copy of C\n{ir}");
            }
            assert!(
                cpu.iter()
                    .zip(&interp)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{what}: cpu (default schedule) != interp (defaulted schedule)"
            );
            // |A B| <= k with inputs in [-1, 1); gelu's slope is below 1.13.
            let tol = 2.0 * (k as f64 + 1.0) * k as f64 * eps(dt) + 8.0 * eps(dt) * (k as f64);
            for (x, y) in cpu.iter().zip(&plain) {
                assert!(
                    (x - y).abs() <= tol,
                    "{what}: {x} vs {y} as written (tolerance {tol})"
                );
            }
        }
    }
}

/// A default-scheduled attention module survives its file: the loader's race check (stricter
/// than the build's: the file is untrusted) proves the GEMM's parallel loop over heads x
/// column panels disjoint through the fused loop's digits (`(f % 4) * 32 + j`), and the
/// loaded module computes the same bits. Ragged sizes: 97 rows pad the tiles.
#[test]
fn a_default_scheduled_attention_module_loads_back_and_computes_the_same_bits() {
    for (heads, n, d, symbolic) in [(16i64, 97i64, 64i64, false), (3, 17, 64, true)] {
        let dt = DType::F32;
        let args = attention(heads, n, d, dt, symbolic);
        let s = Schedule::new(std::slice::from_ref(args.last().unwrap())).unwrap();
        let built = build(&s, &args, &Target::cpu(), "k").unwrap();
        let bytes = built.to_bytes().unwrap();
        let what = format!("heads={heads} n={n} d={d} symbolic={symbolic}");
        let loaded = Module::from_bytes(&bytes, "attention")
            .unwrap_or_else(|e| panic!("{what}: the saved module is refused: {e}"));
        let len = (heads * n * d) as usize;
        let ins: Vec<Value> = (0..3)
            .map(|s| Value::Tensor(tensor(&data(len, 5 + s), &[heads, n, d], dt)))
            .collect();
        let run = |m: &Module| {
            let out = m.get_function("k").unwrap().call(&ins).unwrap();
            to_f64(out.as_tensor().unwrap(), dt)
        };
        let (a, b) = (run(&built), run(&loaded));
        assert_eq!(a.len(), len, "{what}");
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: the loaded module computes other bits"
        );
    }
}
