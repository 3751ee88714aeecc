//! Saved activations (`rivet_compiler::residuals`, `backward::saved`) and `te::stop_gradient`.
//!
//! The saved pair of rivet's softmax and layer_norm kernels, on the interpreter and the CPU
//! backend, float64, random data and cotangents, outputs NaN-poisoned: the forward with
//! residuals writes the forward's outputs and the residual stages' values; the saved backward
//! gives the plain backward's gradients (itself checked against central differences in
//! grad_backward.rs). The policy: softmax keeps its exponentials and row sums (not its max, which
//! `stop_gradient` removes from the backward), layer_norm its two row sums (the centred input
//! is recomputed); a function whose backward needs no forward value keeps none. And
//! `stop_gradient`: same values, no gradient through it. CUDA builds of the pair compile with
//! NVRTC (sm_80, sm_90) when `RIVET_REQUIRE_NVRTC=1`, as `make test` sets.

use rivet_compiler::backward::{backward, saved};
use rivet_compiler::te::{self, compute, placeholder};
use rivet_compiler::{build, kernels, Schedule, Target};
use rivet_runtime::{DType, Function, Tensor, Value};
use rivet_tests::uniform;

fn t(d: &[f64], shape: &[i64]) -> Tensor {
    Tensor::from_slice(d, shape).unwrap()
}

fn nan(shape: &[i64]) -> Tensor {
    t(
        &vec![f64::NAN; shape.iter().product::<i64>() as usize],
        shape,
    )
}

fn call(f: &Function, args: &[Tensor]) {
    let vals: Vec<Value> = args.iter().cloned().map(Value::Tensor).collect();
    rivet_tests::call(f, &vals).unwrap();
}

fn names(f: &Function) -> Vec<String> {
    f.signature()
        .unwrap()
        .params
        .iter()
        .map(|p| p.name.clone())
        .collect()
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, e) in got.iter().zip(want) {
        assert!(
            (g - e).abs() <= 1e-12 * (1.0 + e.abs()),
            "{what}: {got:?} vs {want:?}"
        );
    }
}

/// The forward, the saved pair and the plain backward of `f`, on inputs of `in_shapes` and
/// one output of `out_shape`: the pair's outputs equal the forward's, its gradients the
/// plain backward's. Returns the residuals' values.
fn check_pair(f: &Function, in_shapes: &[&[i64]], out_shape: &[i64], seed: u64) -> Vec<Vec<f64>> {
    let s = saved(f).unwrap();
    let ins: Vec<Tensor> = in_shapes
        .iter()
        .enumerate()
        .map(|(k, sh)| {
            let n = sh.iter().product::<i64>() as usize;
            t(&uniform(n, seed + k as u64, -2.0, 2.0), sh)
        })
        .collect();
    let n_out = out_shape.iter().product::<i64>() as usize;
    let head = t(&uniform(n_out, seed + 100, -2.0, 2.0), out_shape);
    // The plain forward and backward.
    let y = nan(out_shape);
    call(f, &[ins.clone(), vec![y.clone()]].concat());
    let plain_grads: Vec<Tensor> = in_shapes.iter().map(|sh| nan(sh)).collect();
    call(
        &backward(f).unwrap(),
        &[ins.clone(), vec![head.clone()], plain_grads.clone()].concat(),
    );
    // The forward with residuals: output shapes from its signature (the forward's output,
    // then the residuals).
    let shapes = s.forward.output_shapes(in_shapes, None).unwrap();
    assert_eq!(shapes.len(), 1 + s.residuals);
    assert_eq!(shapes[0].0, out_shape);
    let res: Vec<Tensor> = shapes[1..].iter().map(|(sh, _)| nan(sh)).collect();
    assert_eq!(res.len(), s.residuals);
    let y2 = nan(out_shape);
    call(
        &s.forward,
        &[ins.clone(), vec![y2.clone()], res.clone()].concat(),
    );
    close(
        &y2.to_vec::<f64>().unwrap(),
        &y.to_vec::<f64>().unwrap(),
        "forward with residuals: output",
    );
    let grads: Vec<Tensor> = in_shapes.iter().map(|sh| nan(sh)).collect();
    call(
        &s.backward,
        &[ins, vec![y2], res.clone(), vec![head], grads.clone()].concat(),
    );
    for (k, (g, p)) in grads.iter().zip(&plain_grads).enumerate() {
        close(
            &g.to_vec::<f64>().unwrap(),
            &p.to_vec::<f64>().unwrap(),
            &format!("{}: gradient {k}", f.name()),
        );
    }
    res.iter().map(|r| r.to_vec::<f64>().unwrap()).collect()
}

fn softmax_keeps_its_exponentials_and_sums_and_matches_the_plain_backward(target: &Target) {
    let f = kernels::softmax(DType::F64, 2, -1, target).unwrap();
    let s = saved(&f).unwrap();
    assert_eq!(s.residuals, 2, "{target}");
    assert_eq!(names(&s.forward), ["X", "Y", "sum", "exp"], "{target}");
    assert_eq!(
        names(&s.backward),
        ["X", "Y", "saved_sum", "saved_exp", "grad_Y", "X_grad"],
        "{target}"
    );
    let (rows, cols) = (5, 7);
    let res = check_pair(&f, &[&[rows, cols]], &[rows, cols], 11);
    // The residuals are the stages' values: row sums of exp(x - max).
    let x = uniform((rows * cols) as usize, 11, -2.0, 2.0);
    for r in 0..rows as usize {
        let row = &x[r * cols as usize..(r + 1) * cols as usize];
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
        close(&[res[0][r]], &[e.iter().sum()], "saved sum");
        close(
            &res[1][r * cols as usize..(r + 1) * cols as usize],
            &e,
            "saved exp",
        );
    }
}

fn layer_norm_keeps_its_row_sums_and_recomputes_the_centred_input(target: &Target) {
    let f = kernels::layer_norm(DType::F64, 2, 1e-5, target).unwrap();
    let s = saved(&f).unwrap();
    assert_eq!(s.residuals, 2, "{target}");
    assert_eq!(
        names(&s.backward)[..6],
        ["X", "gamma", "beta", "Y", "saved_sqsum", "saved_total"],
        "{target}"
    );
    check_pair(&f, &[&[6, 9], &[9], &[9]], &[6, 9], 21);
}

#[test]
fn a_backward_that_reads_no_forward_value_keeps_none() {
    let f = kernels::matmul(DType::F64, &Target::parse("interp").unwrap()).unwrap();
    let s = saved(&f).unwrap();
    assert_eq!(s.residuals, 0);
    assert!(saved(&f).unwrap().backward.same(&s.backward), "built once");
}

#[test]
fn stop_gradient_keeps_values_and_stops_the_gradient() {
    // y = x * stop_gradient(x): values x^2, gradient x (not 2x).
    let n = 4;
    let x = placeholder([n], DType::F64, "X").unwrap();
    let sx = te::stop_gradient(&x).unwrap();
    assert!(sx.stops_gradient() && !x.stops_gradient());
    let y = compute([n], |[i]| x.at([&i]) * sx.at([i]), "Y").unwrap();
    let g = te::gradient(&y, std::slice::from_ref(&x), None).unwrap();
    let m = build(
        &Schedule::new(&[y.clone(), g[0].clone()]).unwrap(),
        &[x.clone(), y, g[0].clone()],
        "cpu",
        "sg",
    )
    .unwrap();
    let xs = [0.5, -1.5, 2.0, 3.25];
    let (yv, gv) = (nan(&[4]), nan(&[4]));
    call(
        &m.get_function("sg").unwrap(),
        &[t(&xs, &[4]), yv.clone(), gv.clone()],
    );
    close(&yv.to_vec::<f64>().unwrap(), &xs.map(|v| v * v), "values");
    close(
        &gv.to_vec::<f64>().unwrap(),
        &xs,
        "gradient through one factor only",
    );
    // A gradient asked of the stop_gradient stage itself is its adjoint: d(x * s)/ds = x.
    let z = compute([n], |[i]| x.at([&i]) * sx.at([i]), "Z").unwrap();
    let gs = te::gradient(&z, std::slice::from_ref(&sx), None).unwrap();
    let m = build(
        &Schedule::new(std::slice::from_ref(&gs[0])).unwrap(),
        &[x.clone(), gs[0].clone()],
        "cpu",
        "sg2",
    )
    .unwrap();
    let gv = nan(&[4]);
    call(&m.get_function("sg2").unwrap(), &[t(&xs, &[4]), gv.clone()]);
    close(
        &gv.to_vec::<f64>().unwrap(),
        &xs,
        "gradient of the stop_gradient stage",
    );
}

#[test]
fn cuda_kernels_get_a_saved_pair_compiled_by_nvrtc() {
    if std::env::var("RIVET_REQUIRE_NVRTC").as_deref() != Ok("1") {
        // Without NVRTC the CUDA build itself is refused; `make test` requires it.
        return;
    }
    for arch in ["cuda -arch=sm_80", "cuda -arch=sm_90"] {
        let target = Target::parse(arch).unwrap();
        let f = kernels::softmax(DType::F32, 2, -1, &target).unwrap();
        let s = saved(&f).unwrap();
        assert_eq!(s.residuals, 2, "{arch}");
        assert_eq!(
            names(&s.backward),
            ["X", "Y", "saved_sum", "saved_exp", "grad_Y", "X_grad"],
            "{arch}"
        );
        let f = kernels::layer_norm(DType::F32, 2, 1e-5, &target).unwrap();
        assert_eq!(saved(&f).unwrap().residuals, 2, "{arch}");
    }
}

rivet_tests::for_each_backend! {
    softmax_keeps_its_exponentials_and_sums_and_matches_the_plain_backward,
    layer_norm_keeps_its_row_sums_and_recomputes_the_centred_input,
}
