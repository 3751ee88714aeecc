//! `te::gradient` checked numerically: forward and gradient programs run on the IR interpreter
//! (the oracle; some cases also on the CPU backend), gradients compared in float64 with
//! central differences of the forward program, contracted with a random head.
//!
//! - `random_programs_match_central_differences` (proptest): random chains of elementwise
//!   ops, broadcasts, transposes, sum/max/min/prod reductions, matmuls, shifted / padded reads,
//!   1-D convolutions and a scrambled read that needs the masked fallback,
//!   some stages read twice (adjoint accumulation), on random shapes and data
//!   (`PROPTEST_CASES=n` for longer runs);
//! - named programs: matmul (plain, transposed, batched, symbolic shapes), conv2d NCHW with
//!   padding, max reduction ties (the even-split rule, exactly), if_then_else, every unary and
//!   binary rule, index maps that need the masked fallback (diagonal, strided, floordiv,
//!   constant index), an intermediate stage as an input;
//! - hostile input: a head of the wrong shape or dtype, int tensors, an input the output does
//!   not depend on (zeros), a chain of 3000 stages; product reductions with zeros.
//!
//! Outputs are poisoned with NaN before each call, so a gradient element that is never
//! written fails the comparison.

use proptest::prelude::*;
use proptest::test_runner::Config;
use rivet_compiler::ir::{Expr, IterVar};
use rivet_compiler::te::{self, compute, placeholder, Tensor as Te};
use rivet_compiler::{build, Schedule, Target};
use rivet_runtime::{DType, Tensor, Value};
use rivet_tests::uniform;

// ---- running programs ------------------------------------------------------------------------

fn dims(t: &Te, sym: &[(&Expr, i64)]) -> Vec<i64> {
    t.shape()
        .iter()
        .map(|e| {
            e.as_int()
                .or_else(|| sym.iter().find(|(v, _)| *v == e).map(|(_, n)| *n))
                .unwrap_or_else(|| panic!("dim {e} of {} unknown", t.name()))
        })
        .collect()
}

/// Runs the program `inputs -> outputs` on `target`, outputs poisoned with NaN first.
fn run_on(
    target: &Target,
    inputs: &[Te],
    outputs: &[Te],
    data: &[Vec<f64>],
    sym: &[(&Expr, i64)],
) -> Vec<Vec<f64>> {
    let sched = Schedule::new(outputs).unwrap();
    let args: Vec<Te> = inputs.iter().chain(outputs).cloned().collect();
    let m = build(&sched, &args, target, "f").unwrap_or_else(|e| panic!("build: {e}"));
    let f = m.get_function("f").unwrap();
    let mut vals: Vec<Value> = inputs
        .iter()
        .zip(data)
        .map(|(t, d)| Value::Tensor(Tensor::from_slice(d, &dims(t, sym)).unwrap()))
        .collect();
    let outs: Vec<Tensor> = outputs
        .iter()
        .map(|t| {
            let shape = dims(t, sym);
            let n = shape.iter().product::<i64>() as usize;
            Tensor::from_slice(&vec![f64::NAN; n], &shape).unwrap()
        })
        .collect();
    vals.extend(outs.iter().cloned().map(Value::Tensor));
    rivet_tests::call(&f, &vals).unwrap_or_else(|e| panic!("call: {e}"));
    outs.iter().map(|t| t.to_vec::<f64>().unwrap()).collect()
}

fn run(inputs: &[Te], outputs: &[Te], data: &[Vec<f64>]) -> Vec<Vec<f64>> {
    run_on(&Target::interp(), inputs, outputs, data, &[])
}

fn numel(t: &Te) -> usize {
    dims(t, &[]).iter().product::<i64>() as usize
}

/// The gradients of `sum(head * out)` w.r.t. `inputs` by `te::gradient` (interpreter) and by
/// central differences; panics (with `what`) where they differ.
fn check(what: &str, inputs: &[Te], out: &Te, data: &[Vec<f64>], seed: u64) {
    let head = placeholder(out.shape(), DType::F64, "head").unwrap();
    let hv = uniform(numel(out), seed ^ 0x5eed, -1.0, 1.0);
    let grads = te::gradient(out, inputs, Some(&head)).unwrap_or_else(|e| panic!("{what}: {e}"));
    for (g, x) in grads.iter().zip(inputs) {
        assert_eq!(g.dtype(), x.dtype());
        assert_eq!(g.shape(), x.shape());
    }
    let mut gin: Vec<Te> = inputs.to_vec();
    gin.push(head);
    let mut gdata = data.to_vec();
    gdata.push(hv.clone());
    let analytic = run(&gin, &grads, &gdata);
    // Central differences of <head, out(x)>, one forward program built once.
    let sched = Schedule::new(std::slice::from_ref(out)).unwrap();
    let args: Vec<Te> = inputs.iter().chain([out]).cloned().collect();
    let m = build(&sched, &args, &Target::interp(), "fw").unwrap();
    let f = m.get_function("fw").unwrap();
    let dot = |d: &[Vec<f64>]| -> f64 {
        let vals: Vec<Value> = inputs
            .iter()
            .zip(d)
            .map(|(t, v)| Value::Tensor(Tensor::from_slice(v, &dims(t, &[])).unwrap()))
            .collect();
        let y = f
            .call(&vals)
            .unwrap()
            .as_tensor()
            .unwrap()
            .to_vec::<f64>()
            .unwrap();
        y.iter().zip(&hv).map(|(a, b)| a * b).sum()
    };
    let eps = 1e-6;
    for (k, x) in inputs.iter().enumerate() {
        for e in 0..numel(x) {
            let mut d = data.to_vec();
            d[k][e] += eps;
            let up = dot(&d);
            d[k][e] -= 2.0 * eps;
            let down = dot(&d);
            let num = (up - down) / (2.0 * eps);
            let got = analytic[k][e];
            let tol = 1e-5 + 1e-5 * num.abs().max(got.abs());
            assert!(
                (got - num).abs() <= tol,
                "{what}: d/d{}[{e}] = {got}, central difference {num}\ngradient stages: {:?}",
                x.name(),
                grads
            );
        }
    }
}

fn ph(shape: &[i64], name: &str) -> Te {
    placeholder(shape, DType::F64, name).unwrap()
}

fn rk(n: i64, name: &str) -> IterVar {
    te::reduce_axis(0, n, name).unwrap()
}

fn data_for(inputs: &[Te], seed: u64) -> Vec<Vec<f64>> {
    inputs
        .iter()
        .enumerate()
        .map(|(k, t)| uniform(numel(t), seed + k as u64 * 7919, -1.0, 1.0))
        .collect()
}

// ---- named programs --------------------------------------------------------------------------

fn matmul(a: &Te, b: &Te, ta: bool, tb: bool) -> Te {
    let (m, k) = if ta {
        (&a.shape()[1], &a.shape()[0])
    } else {
        (&a.shape()[0], &a.shape()[1])
    };
    let n = if tb { &b.shape()[0] } else { &b.shape()[1] };
    let r = te::reduce_axis(0, k, "k").unwrap();
    compute(
        [m, n],
        |[i, j]| {
            let x = if ta { a.at((&r, i)) } else { a.at((i, &r)) };
            let y = if tb { b.at((j, &r)) } else { b.at((&r, j)) };
            te::sum(x * y, &r)
        },
        "C",
    )
    .unwrap()
}

#[test]
fn matmul_plain_and_transposed() {
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = ph(if ta { &[4, 3] } else { &[3, 4] }, "A");
        let b = ph(if tb { &[5, 4] } else { &[4, 5] }, "B");
        let out = matmul(&a, &b, ta, tb);
        let ins = [a, b];
        check(
            &format!("matmul ta={ta} tb={tb}"),
            &ins,
            &out,
            &data_for(&ins, 1),
            1,
        );
    }
}

#[test]
fn batched_matmul_with_broadcast_operand() {
    let a = ph(&[2, 3, 4], "A");
    let b = ph(&[4, 2], "B"); // shared across the batch
    let k = rk(4, "k");
    let out = compute(
        [2, 3, 2],
        |[p, i, j]| te::sum(a.at((p, i, &k)) * b.at((&k, j)), &k),
        "BMM",
    )
    .unwrap();
    let ins = [a, b];
    check("batched matmul", &ins, &out, &data_for(&ins, 2), 2);
}

#[test]
fn matmul_with_symbolic_shapes() {
    let n = te::var("n");
    let m = te::var("m");
    let a = placeholder([&n, &m], DType::F64, "A").unwrap();
    let b = placeholder([&m, &n], DType::F64, "B").unwrap();
    let out = matmul(&a, &b, false, false);
    let head = placeholder(out.shape(), DType::F64, "head").unwrap();
    let g = te::gradient(&out, &[a.clone(), b.clone()], Some(&head)).unwrap();
    let sym = [(&n, 3i64), (&m, 2i64)];
    let av = uniform(6, 1, -1.0, 1.0);
    let bv = uniform(6, 2, -1.0, 1.0);
    let hv = uniform(9, 3, -1.0, 1.0);
    let got = run_on(
        &Target::interp(),
        &[a, b, head],
        &g,
        &[av.clone(), bv.clone(), hv.clone()],
        &sym,
    );
    // dA = H B^T, dB = A^T H.
    for i in 0..3 {
        for k in 0..2 {
            let want: f64 = (0..3).map(|j| hv[i * 3 + j] * bv[k * 3 + j]).sum();
            assert!((got[0][i * 2 + k] - want).abs() < 1e-12);
        }
    }
    for k in 0..2 {
        for j in 0..3 {
            let want: f64 = (0..3).map(|i| av[i * 2 + k] * hv[i * 3 + j]).sum();
            assert!((got[1][k * 3 + j] - want).abs() < 1e-12);
        }
    }
}

fn conv2d(x: &Te, w: &Te, pad: i64) -> Te {
    // NCHW, stride 1: Y[n, f, y, x] = sum_{c, ry, rx} Xpad[n, c, y + ry - pad, x + rx - pad] W[f, c, ry, rx]
    let xs = dims(x, &[]);
    let ws = dims(w, &[]);
    let (h, wd) = (xs[2], xs[3]);
    let (oh, ow) = (h + 2 * pad - ws[2] + 1, wd + 2 * pad - ws[3] + 1);
    let rc = rk(ws[1], "rc");
    let ry = rk(ws[2], "ry");
    let rx = rk(ws[3], "rx");
    compute(
        [xs[0], ws[0], oh, ow],
        |[n, f, oy, ox]| {
            let yy = oy + &ry - pad;
            let xx = ox + &rx - pad;
            let inside = te::all(
                te::all(te::ge(&yy, 0), te::lt(&yy, h)),
                te::all(te::ge(&xx, 0), te::lt(&xx, wd)),
            );
            let v = if pad > 0 {
                te::if_then_else(inside, x.at((n, &rc, yy, xx)), 0.0)
            } else {
                x.at((n, &rc, yy, xx))
            };
            te::sum(v * w.at((f, &rc, &ry, &rx)), [&rc, &ry, &rx])
        },
        "conv",
    )
    .unwrap()
}

#[test]
fn conv2d_nchw_with_and_without_padding() {
    for pad in [0, 1] {
        let x = ph(&[2, 2, 5, 4], "X");
        let w = ph(&[3, 2, 3, 2], "W");
        let out = conv2d(&x, &w, pad);
        let ins = [x, w];
        check(
            &format!("conv2d pad={pad}"),
            &ins,
            &out,
            &data_for(&ins, 3),
            3,
        );
    }
}

#[test]
fn conv2d_gradient_builds_for_the_cpu_and_matches_the_interpreter() {
    let x = ph(&[1, 2, 6, 5], "X");
    let w = ph(&[2, 2, 3, 3], "W");
    let out = conv2d(&x, &w, 1);
    let head = placeholder(out.shape(), DType::F64, "head").unwrap();
    let g = te::gradient(&out, &[x.clone(), w.clone()], Some(&head)).unwrap();
    let ins = [x, w, head];
    let d = data_for(&ins, 9);
    let a = run_on(&Target::interp(), &ins, &g, &d, &[]);
    let b = run_on(&Target::cpu(), &ins, &g, &d, &[]);
    for (u, v) in a.iter().zip(&b) {
        for (p, q) in u.iter().zip(v) {
            assert!((p - q).abs() <= 1e-12 * (1.0 + p.abs()), "{p} vs {q}");
        }
    }
}

#[test]
fn max_and_min_reductions_split_ties_evenly() {
    let x = ph(&[2, 4], "X");
    let k = rk(4, "k");
    for max in [true, false] {
        let out = compute(
            [2],
            |[i]| {
                let e = x.at((i, &k));
                if max {
                    te::max_over(e, &k)
                } else {
                    te::min_over(e, &k)
                }
            },
            "R",
        )
        .unwrap();
        // Row 0: a three-way tie at the extremum; row 1: a unique one.
        let e = if max { 5.0 } else { -5.0 };
        let xv = vec![e, 1.0, e, e, 0.5, e, 0.25, 0.0];
        let g = te::gradient(&out, &[x.clone()], None).unwrap();
        let got = run(&[x.clone()], &g, &[xv]);
        let third = 1.0 / 3.0;
        assert_eq!(got[0], vec![third, 0.0, third, third, 0.0, 1.0, 0.0, 0.0]);
        // Away from ties, central differences agree.
        let ins = [x.clone()];
        check("max/min reduction", &ins, &out, &data_for(&ins, 4), 4);
    }
}

#[test]
fn elementwise_maximum_splits_ties_evenly() {
    let x = ph(&[3], "X");
    let y = ph(&[3], "Y");
    let out = compute([3], |[i]| te::maximum(x.at([&i]), y.at([i])), "M").unwrap();
    let g = te::gradient(&out, &[x.clone(), y.clone()], None).unwrap();
    let got = run(&[x, y], &g, &[vec![1.0, 2.0, 3.0], vec![1.0, 3.0, 2.0]]);
    assert_eq!(got, vec![vec![0.5, 0.0, 1.0], vec![0.5, 1.0, 0.0]]);
}

#[test]
fn every_unary_and_binary_rule() {
    let x = ph(&[5], "X");
    let y = ph(&[5], "Y");
    type F = fn(Expr, Expr) -> Expr;
    let cases: Vec<(&str, F)> = vec![
        ("add", |a, b| a + b),
        ("sub", |a, b| a - b),
        ("mul", |a, b| a * b),
        ("div", |a, b| a / (&b * &b + 0.5)),
        ("neg", |a, _| -a),
        ("exp", |a, _| te::exp(a)),
        ("log", |a, _| te::log(&a * &a + 0.5)),
        ("sqrt", |a, _| te::sqrt(&a * &a + 0.5)),
        ("rsqrt", |a, _| te::rsqrt(&a * &a + 0.5)),
        ("tanh", |a, _| te::tanh(a)),
        ("sigmoid", |a, _| te::sigmoid(a)),
        ("erf", |a, _| te::erf(a)),
        ("abs", |a, b| te::abs(a) * b),
        ("floor", |a, b| te::floor(&a * 3.0) * b + a),
        ("ceil", |a, b| te::ceil(&a * 3.0) * b + a),
        ("pow", |a, b| te::pow(&a * &a + 0.5, b)),
        ("pow_const", |a, _| te::pow(a, 3.0)),
        ("maximum", |a, b| te::maximum(a, b)),
        ("minimum", |a, b| te::minimum(a, b)),
        ("floormod", |a, b| te::floormod(a * 3.0, &b * &b + 0.5)),
        ("floordiv", |a, b| te::floordiv(&a * 3.0, 1.0) * b + a),
        ("select", |a, b| {
            te::if_then_else(te::gt(&a, 0.1), te::exp(a), &b * &b)
        }),
        ("compare", |a, b| {
            te::cast(DType::F64, te::lt(&a, &b)) * a + b
        }),
        ("cast_f32", |a, b| {
            te::cast(DType::F64, te::cast(DType::F32, a)) * 0.0 + b
        }),
        ("fma_like", |a, b| &a * b + a),
    ];
    for (name, f) in cases {
        let out = compute([5], |[i]| f(x.at([&i]), y.at([i])), name).unwrap();
        let ins = [x.clone(), y.clone()];
        check(name, &ins, &out, &data_for(&ins, 5), 5);
    }
}

#[test]
fn float_casts_carry_the_adjoint() {
    // f32 intermediate: d/dx of cast_f64(cast_f32(x) * 2) = 2 (exactly, as an f32 cast).
    let x = ph(&[3], "X");
    let out = compute(
        [3],
        |[i]| te::cast(DType::F64, te::cast(DType::F32, x.at([i])) * 2.0),
        "Y",
    )
    .unwrap();
    let g = te::gradient(&out, &[x.clone()], None).unwrap();
    assert_eq!(run(&[x], &g, &[vec![0.1, 0.2, 0.3]]), vec![vec![2.0; 3]]);
}

#[test]
fn index_maps_that_need_the_masked_fallback() {
    let x = ph(&[4, 4], "X");
    let v = ph(&[6], "V");
    let progs: Vec<(&str, Vec<Te>, Te)> = vec![
        (
            "diagonal",
            vec![x.clone()],
            compute([4], |[i]| x.at([&i, &i]) * 2.0, "D").unwrap(),
        ),
        (
            "strided",
            vec![v.clone()],
            compute([3], |[i]| te::exp(v.at([i * 2])), "S").unwrap(),
        ),
        (
            "floordiv",
            vec![v.clone()],
            compute(
                [12],
                |[i]| {
                    let e = v.at([te::floordiv(i, 2)]);
                    &e * &e
                },
                "U",
            )
            .unwrap(),
        ),
        (
            "constant index and reversal",
            vec![v.clone()],
            compute([6], |[i]| v.at([0]) * v.at([5 - i]), "K").unwrap(),
        ),
        (
            "transpose",
            vec![x.clone()],
            compute(
                [4, 4],
                |[i, j]| te::tanh(x.at([&j, &i])) * x.at([i, j]),
                "T",
            )
            .unwrap(),
        ),
    ];
    for (name, ins, out) in progs {
        check(name, &ins, &out, &data_for(&ins, 6), 6);
    }
}

/// softmax over the last axis in four stages (max, exp, sum, divide): a stage read twice.
#[test]
fn softmax_and_layer_norm() {
    let x = ph(&[3, 5], "X");
    let k = rk(5, "k");
    let mx = compute([3], |[i]| te::max_over(x.at((i, &k)), &k), "mx").unwrap();
    let e = compute([3, 5], |[i, j]| te::exp(x.at([&i, &j]) - mx.at([i])), "e").unwrap();
    let k2 = rk(5, "k2");
    let s = compute([3], |[i]| te::sum(e.at((i, &k2)), &k2), "s").unwrap();
    let sm = compute([3, 5], |[i, j]| e.at([&i, &j]) / s.at([i]), "sm").unwrap();
    let ins = [x.clone()];
    check("softmax", &ins, &sm, &data_for(&ins, 7), 7);

    // layer norm: (x - mean) * rsqrt(var + 1e-5) * g + b
    let g = ph(&[5], "G");
    let b = ph(&[5], "Bb");
    let k4 = rk(5, "k4");
    let mean = compute([3], |[i]| te::sum(x.at((i, &k4)) / 5.0, &k4), "mean").unwrap();
    let k5 = rk(5, "k5");
    let var = compute(
        [3],
        |[i]| {
            let d = x.at((&i, &k5)) - mean.at([i]);
            te::sum(&d * &d / 5.0, &k5)
        },
        "var",
    )
    .unwrap();
    let y = compute(
        [3, 5],
        |[i, j]| {
            (x.at([&i, &j]) - mean.at([&i])) * te::rsqrt(var.at([i]) + 1e-5) * g.at([&j])
                + b.at([j])
        },
        "ln",
    )
    .unwrap();
    let ins = [x, g, b];
    check("layer norm", &ins, &y, &data_for(&ins, 8), 8);
}

/// Every stage `t` depends on, itself included.
fn graph(t: &Te) -> Vec<Te> {
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![t.clone()];
    let mut out = Vec::new();
    while let Some(x) = stack.pop() {
        if seen.insert(x.id()) {
            stack.extend(rivet_compiler::te::tensor::inputs(&x));
            out.push(x);
        }
    }
    out
}

/// layer_norm written with a centred stage (as `rivet.kernels` and benches/grad_bench.py write
/// it): the row total's adjoint is the sum over the row of the centred stage's adjoint, whose
/// element is a sum of two terms (one per consumer). `te::gradient` sums each term over the
/// row on its own (`distribute`), so the partial sums read the inputs and never the centred
/// stage's adjoint; the gradients still match central differences.
#[test]
fn a_sum_over_an_adjoint_of_several_terms_is_split_by_term() {
    let (r, c) = (3i64, 6i64);
    let x = ph(&[r, c], "X");
    let g = ph(&[c], "G");
    let b = ph(&[c], "Bb");
    let k1 = rk(c, "k1");
    let total = compute([r], |[i]| te::sum(x.at((i, &k1)), &k1), "total").unwrap();
    let cen = compute(
        [r, c],
        |[i, j]| x.at([&i, &j]) - total.at([i]) / c as f64,
        "centered",
    )
    .unwrap();
    let k2 = rk(c, "k2");
    let sq = compute(
        [r],
        |[i]| te::sum(cen.at((&i, &k2)) * cen.at((&i, &k2)), &k2),
        "sqsum",
    )
    .unwrap();
    let y = compute(
        [r, c],
        |[i, j]| {
            cen.at([&i, &j]) * te::rsqrt(sq.at([&i]) / c as f64 + 1e-5) * g.at([&j]) + b.at([j])
        },
        "Y",
    )
    .unwrap();
    let grads = te::gradient(&y, &[x.clone()], None).unwrap();
    let stages = graph(&grads[0]);
    let names: Vec<String> = stages.iter().map(|t| t.name().to_string()).collect();
    let parts: Vec<&Te> = stages
        .iter()
        .filter(|t| t.name().starts_with("total_grad_centered_sum"))
        .collect();
    assert_eq!(parts.len(), 2, "one partial sum per term: {names:?}");
    for p in parts {
        let reads: Vec<String> = graph(p).iter().map(|t| t.name().to_string()).collect();
        assert!(
            !reads.iter().any(|n| n == "centered_grad"),
            "{} reads the adjoint it was split from: {reads:?}",
            p.name()
        );
    }
    let ins = [x, g, b];
    check("layer norm, centred stage", &ins, &y, &data_for(&ins, 9), 9);
}

#[test]
fn an_intermediate_stage_can_be_an_input() {
    let x = ph(&[4], "X");
    let h = compute([4], |[i]| te::tanh(x.at([i])), "h").unwrap();
    let out = compute([4], |[i]| h.at([&i]) * h.at([&i]) + x.at([i]), "y").unwrap();
    let g = te::gradient(&out, &[h.clone(), x.clone()], None).unwrap();
    let xv = vec![0.1, -0.4, 0.7, 0.2];
    let got = run(&[x], &g, &[xv.clone()]);
    for (e, &xe) in xv.iter().enumerate() {
        let t = f64::tanh(xe);
        assert!((got[0][e] - 2.0 * t).abs() < 1e-14);
        assert!((got[1][e] - (2.0 * t * (1.0 - t * t) + 1.0)).abs() < 1e-14);
    }
}

#[test]
fn head_none_is_the_gradient_of_the_sum() {
    let a = ph(&[2, 3], "A");
    let b = ph(&[3, 2], "B");
    let out = matmul(&a, &b, false, false);
    let g = te::gradient(&out, &[a.clone()], None).unwrap();
    let bv = uniform(6, 11, -1.0, 1.0);
    let got = run(&[a, b], &g, &[uniform(6, 10, -1.0, 1.0), bv.clone()]);
    for i in 0..2 {
        for k in 0..3 {
            let want = bv[k * 2] + bv[k * 2 + 1];
            assert!((got[0][i * 3 + k] - want).abs() < 1e-14);
        }
    }
}

// ---- hostile input ---------------------------------------------------------------------------

fn err_of(r: rivet_compiler::Result<Vec<Te>>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn wrong_heads_are_refused_naming_head() {
    let x = ph(&[2, 3], "X");
    let out = compute([2, 3], |[i, j]| x.at([i, j]) * 2.0, "Y").unwrap();
    let bad_shape = ph(&[3, 2], "H");
    let m = err_of(te::gradient(&out, &[x.clone()], Some(&bad_shape)));
    assert!(
        m.contains("head") && m.contains("'H'") && m.contains("float64"),
        "{m}"
    );
    let bad_dtype = placeholder(out.shape(), DType::F32, "H32").unwrap();
    let m = err_of(te::gradient(&out, &[x.clone()], Some(&bad_dtype)));
    assert!(
        m.contains("head") && m.contains("float32") && m.contains("float64"),
        "{m}"
    );
    let bad_rank = ph(&[6], "H1");
    assert!(err_of(te::gradient(&out, &[x], Some(&bad_rank))).contains("head"));
}

#[test]
fn int_tensors_are_refused_and_int_reads_contribute_nothing() {
    let x = ph(&[3], "X");
    let ix = placeholder([3], DType::I32, "I").unwrap();
    let out = compute(
        [3],
        |[i]| x.at([&i]) * te::cast(DType::F64, ix.at([i])),
        "Y",
    )
    .unwrap();
    let m = err_of(te::gradient(&out, &[ix.clone()], None));
    assert!(
        m.contains("inputs[0]") && m.contains("'I'") && m.contains("int32"),
        "{m}"
    );
    let iout = compute([3], |[i]| ix.at([i]) + 1, "Z").unwrap();
    let m = err_of(te::gradient(&iout, &[x.clone()], None));
    assert!(m.contains("output") && m.contains("int32"), "{m}");
    // The int factor is a constant for the float input.
    let g = te::gradient(&out, &[x.clone()], None).unwrap();
    let sched = Schedule::new(&g).unwrap();
    let m = build(&sched, &[x, ix, g[0].clone()], &Target::interp(), "f").unwrap();
    let f = m.get_function("f").unwrap();
    let xs = Tensor::from_slice(&[1.0f64, 2.0, 3.0], &[3]).unwrap();
    let is = Tensor::from_slice(&[4i32, -5, 6], &[3]).unwrap();
    let out = f.call(&[Value::Tensor(xs), Value::Tensor(is)]).unwrap();
    assert_eq!(
        out.as_tensor().unwrap().to_vec::<f64>().unwrap(),
        vec![4.0, -5.0, 6.0]
    );
}

#[test]
fn an_input_the_output_does_not_depend_on_gets_zeros() {
    let x = ph(&[3], "X");
    let other = ph(&[2, 2], "Other");
    let out = compute([3], |[i]| x.at([i]) * 2.0, "Y").unwrap();
    let g = te::gradient(&out, &[other.clone(), x.clone()], None).unwrap();
    assert_eq!(g[0].shape(), other.shape());
    let got = run(&[x, other], &g, &[vec![1.0; 3], vec![7.0; 4]]);
    assert_eq!(got, vec![vec![0.0; 4], vec![2.0; 3]]);
}

#[test]
fn product_reductions_are_exact_with_zeros() {
    // Over two reduction axes, one starting at 1 (so the excluded element is found by its
    // offset from the axis's start).
    let x = ph(&[2, 3, 3], "X");
    let r1 = te::reduce_axis(1, 3, "r1").unwrap();
    let r2 = rk(3, "r2");
    let out = compute([2], |[i]| te::prod(x.at((i, &r1, &r2)), [&r1, &r2]), "P").unwrap();
    let ins = [x.clone()];
    check("prod", &ins, &out, &data_for(&ins, 13), 13);
    // Row 0: one zero (only it gets a gradient: the product of the others); row 1: two zeros
    // (every gradient is 0). Elements with r1 = 0 are not in the product.
    let mut xv: Vec<f64> = (0..18).map(|e| 1.0 + e as f64 / 8.0).collect();
    xv[4] = 0.0; // row 0, r1 = 1, r2 = 1
    xv[9 + 5] = 0.0;
    xv[9 + 7] = 0.0;
    let g = te::gradient(&out, &[x.clone()], None).unwrap();
    let got = run(&[x], &g, &[xv.clone()]);
    for row in 0..2 {
        for e in 0..9 {
            let want = if e / 3 == 0 {
                0.0
            } else {
                (3..9)
                    .filter(|&o| o != e)
                    .map(|o| xv[row * 9 + o])
                    .product::<f64>()
            };
            let got = got[0][row * 9 + e];
            assert!(
                (got - want).abs() <= 1e-12 * want.abs().max(1.0),
                "row {row} elem {e}: {got} vs {want}"
            );
        }
    }
    assert_ne!(got[0][4], 0.0);
}

#[test]
fn a_chain_of_3000_stages_needs_no_deep_stack() {
    // Runs on a thread with a small stack: the walk must be iterative.
    let h = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(|| {
            let x = ph(&[2], "X");
            let mut t = x.clone();
            for s in 0..3000 {
                t = compute([2], |[i]| t.at([i]) * 1.0001, &format!("s{s}")).unwrap();
            }
            let g = te::gradient(&t, &[x], None).unwrap();
            assert_eq!(g.len(), 1);
            drop((t, g));
        })
        .unwrap();
    h.join().unwrap();
}

#[test]
fn a_chain_of_200_stages_is_numerically_right() {
    let x = ph(&[2], "X");
    let mut t = x.clone();
    for s in 0..200 {
        t = compute(
            [2],
            |[i]| te::tanh(t.at([&i])) * 0.5 + t.at([i]) * 0.75,
            &format!("s{s}"),
        )
        .unwrap();
    }
    let ins = [x];
    check("chain", &ins, &t, &data_for(&ins, 12), 12);
}

// ---- random programs -------------------------------------------------------------------------

/// `cases` per property, or `PROPTEST_CASES` when set (for long runs).
fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        ..Config::default()
    }
}

/// One step of a random program over a rank-2 stage `[a, b]` (or rank 1 `[a]`).
#[derive(Clone, Debug)]
enum Step {
    Unary(u8),
    /// Elementwise with a fresh input broadcast along the first axis (`T[i, j] op Y[j]`).
    BroadcastIn(u8),
    /// Elementwise with an earlier stage of the same shape (a stage read twice).
    WithEarlier(usize, u8),
    /// Transpose (rank 2).
    Transpose,
    /// Sum / max / min / prod over the last axis, then broadcast back:
    /// `T[i, j] - red(T[i, :])`.
    Reduce(u8),
    /// Matmul with a fresh weight `[b, c]`.
    Matmul(i64),
    /// Shifted read `T[i, j + 1]` (drops a column) or padded `T[i, j - 1]` (same shape).
    Shift(bool),
    /// A 1-D convolution along the last axis with a fresh kernel of width 1-3:
    /// `sum_r T[i, j + r] K[r]`.
    Window(i64),
    /// A read no index solver inverts: `T[i, (2 j + 1) % b]` (the masked fallback).
    Scrambled,
}

fn unary(op: u8, e: Expr) -> Expr {
    match op % 9 {
        0 => te::tanh(e),
        1 => te::sigmoid(e),
        2 => te::exp(e * 0.5),
        3 => te::log(&e * &e + 1.0),
        4 => te::erf(e),
        5 => te::sqrt(&e * &e + 0.25),
        6 => te::rsqrt(&e * &e + 1.0),
        7 => -&e * &e * 0.5 + e,
        _ => te::pow(&e * &e + 0.5, 0.75),
    }
}

fn binary(op: u8, a: Expr, b: Expr) -> Expr {
    match op % 5 {
        0 => a + b,
        1 => a - b,
        2 => a * b,
        3 => a / (&b * &b + 1.0),
        _ => te::if_then_else(te::gt(&b, 0.0), &a * b, te::tanh(a)),
    }
}

struct Built {
    inputs: Vec<Te>,
    out: Te,
}

fn build_program(rows: i64, cols: i64, steps: &[Step]) -> Built {
    let x = ph(&[rows, cols], "X");
    let mut inputs = vec![x.clone()];
    let mut stages: Vec<Te> = vec![x];
    for (s, step) in steps.iter().enumerate() {
        let t = stages.last().unwrap().clone();
        let sh = dims(&t, &[]);
        let (a, b) = (sh[0], sh[1]);
        let shape = [a, b];
        let name = format!("s{s}");
        let next = match step {
            Step::Unary(op) => compute(shape, |[i, j]| unary(*op, t.at([i, j])), &name).unwrap(),
            Step::BroadcastIn(op) => {
                let y = ph(&[b], &format!("Y{s}"));
                inputs.push(y.clone());
                compute(
                    shape,
                    |[i, j]| binary(*op, t.at([&i, &j]), y.at([j])),
                    &name,
                )
                .unwrap()
            }
            Step::WithEarlier(k, op) => {
                let same: Vec<&Te> = stages.iter().filter(|e| dims(e, &[]) == sh).collect();
                let e = same[k % same.len()];
                compute(
                    shape,
                    |[i, j]| binary(*op, t.at([&i, &j]), e.at([i, j])),
                    &name,
                )
                .unwrap()
            }
            Step::Transpose => compute([b, a], |[i, j]| t.at([j, i]), &name).unwrap(),
            Step::Reduce(op) => {
                let k = rk(b, &format!("r{s}"));
                let red = compute(
                    [a],
                    |[i]| {
                        let e = t.at((i, &k));
                        match op % 4 {
                            0 => te::sum(e, &k),
                            1 => te::max_over(e, &k),
                            2 => te::min_over(e, &k),
                            _ => te::prod(e, &k),
                        }
                    },
                    &format!("red{s}"),
                )
                .unwrap();
                compute(shape, |[i, j]| t.at([&i, &j]) * 0.5 - red.at([i]), &name).unwrap()
            }
            Step::Matmul(n) => {
                let w = ph(&[b, *n], &format!("W{s}"));
                inputs.push(w.clone());
                let k = rk(b, &format!("k{s}"));
                compute(
                    [a, *n],
                    |[i, j]| te::sum(t.at((i, &k)) * w.at((&k, j)), &k),
                    &name,
                )
                .unwrap()
            }
            Step::Shift(drop) if *drop && b > 1 => {
                compute([a, b - 1], |[i, j]| t.at([i, j + 1]) * 1.5, &name).unwrap()
            }
            Step::Window(w) if *w <= b => {
                let kern = ph(&[*w], &format!("K{s}"));
                inputs.push(kern.clone());
                let r = rk(*w, &format!("w{s}"));
                compute(
                    [a, b - w + 1],
                    |[i, j]| te::sum(t.at((i, j + &r)) * kern.at([&r]), &r),
                    &name,
                )
                .unwrap()
            }
            Step::Window(_) | Step::Scrambled => compute(
                shape,
                |[i, j]| {
                    let jj = te::floormod(&j * 2 + 1, b);
                    t.at([&i, &jj]) * t.at([i, j])
                },
                &name,
            )
            .unwrap(),
            Step::Shift(_) => compute(
                shape,
                |[i, j]| {
                    let jm = &j - 1;
                    te::if_then_else(te::ge(&jm, 0), t.at([&i, &jm]), 0.0) + t.at([i, j])
                },
                &name,
            )
            .unwrap(),
        };
        stages.push(next);
    }
    Built {
        inputs,
        out: stages.pop().unwrap(),
    }
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => any::<u8>().prop_map(Step::Unary),
        2 => any::<u8>().prop_map(Step::BroadcastIn),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(k, o)| Step::WithEarlier(k, o)),
        1 => Just(Step::Transpose),
        2 => any::<u8>().prop_map(Step::Reduce),
        2 => (1i64..4).prop_map(Step::Matmul),
        2 => any::<bool>().prop_map(Step::Shift),
        1 => (1i64..4).prop_map(Step::Window),
        1 => Just(Step::Scrambled),
    ]
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn random_programs_match_central_differences(
        rows in 1i64..4,
        cols in 1i64..5,
        steps in proptest::collection::vec(step(), 1..6),
        seed in any::<u64>(),
    ) {
        let p = build_program(rows, cols, &steps);
        let data = data_for(&p.inputs, seed);
        check(&format!("{steps:?}"), &p.inputs, &p.out, &data, seed);
    }
}

/// A sum over a symbolic extent with factors free of it (`dW[i] = sum_j H[i, j] X[i, j] / D[i]`)
/// is factored under a guard `n >= 1` (te/gradient `nonempty`): with `n = 0` and `D = 0` the
/// gradient is the empty sum's 0, never `0 * inf = NaN`; with `n >= 1` it is the sum. On the
/// interpreter and the CPU backend (where the guard is unswitched out of the vector loop).
fn a_factored_sum_over_an_empty_symbolic_extent_is_zero_not_nan(target: &Target) {
    let n = te::var("n");
    let x = placeholder((3, &n), DType::F64, "X").unwrap();
    let w = ph(&[3], "W");
    let d = ph(&[3], "D");
    let y = compute(
        (3, &n),
        |[i, j]| x.at([&i, &j]) * w.at([&i]) / d.at([i]),
        "Y",
    )
    .unwrap();
    let head = placeholder(y.shape(), DType::F64, "head").unwrap();
    let g = te::gradient(&y, std::slice::from_ref(&w), Some(&head)).unwrap();
    let ins = [x, w, d, head];
    for cols in [0i64, 1, 7, 33] {
        let xv = uniform(3 * cols as usize, 11, -1.0, 1.0);
        let hv = uniform(3 * cols as usize, 12, -1.0, 1.0);
        // D[0] = 0: an infinite factor wherever the sum has terms.
        let dv = vec![0.0, 0.5, -2.0];
        let wv = uniform(3, 13, -1.0, 1.0);
        let got = run_on(
            &target,
            &ins,
            &g,
            &[xv.clone(), wv, dv.clone(), hv.clone()],
            &[(&n, cols)],
        );
        for i in 0..3 {
            let sum: f64 = (0..cols as usize)
                .map(|j| hv[i * cols as usize + j] * xv[i * cols as usize + j])
                .sum();
            let want = if cols == 0 { 0.0 } else { sum / dv[i] };
            let ok = if want.is_finite() {
                (got[0][i] - want).abs() <= 1e-12 * (1.0 + want.abs())
            } else {
                got[0][i] == want
            };
            assert!(ok, "{target:?} n={cols} i={i}: {} != {want}", got[0][i]);
        }
    }
}

/// softmax and layer_norm written with keepdims row statistics (`S[i, 0]` of shape `[n, 1]`,
/// as `rivet.kernels` writes them), against central differences: the forms te.gradient now
/// builds without guards or sums of one term.
#[test]
fn keepdims_softmax_and_layer_norm() {
    let x = ph(&[3, 5], "X");
    let k = rk(5, "k");
    let mx = compute([3, 1], |[i, _z]| te::max_over(x.at((i, &k)), &k), "mx").unwrap();
    let e = compute(
        [3, 5],
        |[i, j]| te::exp(x.at([&i, &j]) - mx.at((i, 0))),
        "e",
    )
    .unwrap();
    let k2 = rk(5, "k2");
    let s = compute([3, 1], |[i, _z]| te::sum(e.at((i, &k2)), &k2), "s").unwrap();
    let sm = compute([3, 5], |[i, j]| e.at([&i, &j]) / s.at((i, 0)), "sm").unwrap();
    let ins = [x.clone()];
    check("keepdims softmax", &ins, &sm, &data_for(&ins, 17), 17);

    let g = ph(&[5], "G");
    let b = ph(&[5], "Bb");
    let k4 = rk(5, "k4");
    let total = compute([3, 1], |[i, _z]| te::sum(x.at((i, &k4)), &k4), "total").unwrap();
    let cen = compute(
        [3, 5],
        |[i, j]| x.at([&i, &j]) - total.at((i, 0)) / 5.0,
        "cen",
    )
    .unwrap();
    let k5 = rk(5, "k5");
    let sq = compute(
        [3, 1],
        |[i, _z]| {
            let d = cen.at((i, &k5));
            te::sum(&d * &d, &k5)
        },
        "sq",
    )
    .unwrap();
    let y = compute(
        [3, 5],
        |[i, j]| cen.at([&i, &j]) * te::rsqrt(sq.at((&i, 0)) / 5.0 + 1e-5) * g.at([&j]) + b.at([j]),
        "ln",
    )
    .unwrap();
    let ins = [x, g, b];
    check("keepdims layer norm", &ins, &y, &data_for(&ins, 18), 18);
}

rivet_tests::for_each_backend!(a_factored_sum_over_an_empty_symbolic_extent_is_zero_not_nan);
