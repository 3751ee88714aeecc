//! `rivet_compiler::backward`: the backward function derived from a built function's te
//! program, in the convention `rivet.torch.custom_op` / `rivet.jax.ffi_func` use (forward
//! inputs, one cotangent per output, one gradient per float input).
//!
//! Checked numerically: the backward's gradients against central differences of the forward
//! (run on the interpreter, float64), contracted with random cotangents, for a program with
//! two float outputs (one read by the other: the VJPs add up), an int input and an int output
//! (cotangent taken and ignored), on the interpreter and the CPU backend, outputs poisoned
//! with NaN first. Also: the identity (a gradient that is the cotangent itself), caching,
//! and the refusals (a loaded module, a host callback on the path, no float input), each a
//! `NotDifferentiable` error naming the function; CUDA builds compile with NVRTC.

use rivet_compiler::backward::backward;
use rivet_compiler::te::{self, compute, placeholder, Tensor as Te};
use rivet_compiler::{build, Schedule, Target, ToTarget};
use rivet_runtime::{DType, Error, Function, Tensor, Value};
use rivet_tests::uniform;

const N: i64 = 3;
const M: i64 = 4;

/// Inputs X[n, m], W[m] (float64), I[n] (int64); outputs P = X * W, S[i] = sum_j P[i, j] *
/// X[i, j] + I[i] (reads P), K = 2 * I (int64).
fn program() -> (Vec<Te>, Vec<Te>) {
    let x = placeholder([N, M], DType::F64, "X").unwrap();
    let w = placeholder([M], DType::F64, "W").unwrap();
    let i = placeholder([N], DType::I64, "I").unwrap();
    let p = compute([N, M], |[r, c]| x.at([&r, &c]) * w.at([c]), "P").unwrap();
    let k = te::reduce_axis(0, M, "k").unwrap();
    let s = compute(
        [N],
        |[r]| {
            let cast = te::cast(DType::F64, i.at([&r]));
            te::sum(p.at((&r, &k)) * x.at((&r, &k)) + cast, &k)
        },
        "S",
    )
    .unwrap();
    let kk = compute([N], |[r]| i.at([r]) * 2, "K").unwrap();
    (vec![x, w, i], vec![p, s, kk])
}

fn f64_tensor(d: &[f64], shape: &[i64]) -> Tensor {
    Tensor::from_slice(d, shape).unwrap()
}

fn forward(f: &Function, x: &[f64], w: &[f64], idx: &[i64]) -> (Vec<f64>, Vec<f64>) {
    let p = f64_tensor(&vec![f64::NAN; (N * M) as usize], &[N, M]);
    let s = f64_tensor(&vec![f64::NAN; N as usize], &[N]);
    let k = Tensor::from_slice(&vec![-1i64; N as usize], &[N]).unwrap();
    rivet_tests::call(
        f,
        &[
            Value::Tensor(f64_tensor(x, &[N, M])),
            Value::Tensor(f64_tensor(w, &[M])),
            Value::Tensor(Tensor::from_slice(idx, &[N]).unwrap()),
            Value::Tensor(p.clone()),
            Value::Tensor(s.clone()),
            Value::Tensor(k),
        ],
    )
    .unwrap();
    (p.to_vec().unwrap(), s.to_vec().unwrap())
}

fn built(target: &(impl ToTarget + ?Sized)) -> Function {
    let (ins, outs) = program();
    let args: Vec<Te> = ins.iter().chain(&outs).cloned().collect();
    let m = build(&Schedule::new(&outs).unwrap(), &args, target, "fw").unwrap();
    m.get_function("fw").unwrap()
}

fn backward_matches_central_differences_with_two_outputs_and_int_arguments(target: &Target) {
    let oracle = built("interp");
    let x = uniform((N * M) as usize, 1, -1.0, 1.0);
    let w = uniform(M as usize, 2, -1.0, 1.0);
    let idx: Vec<i64> = (0..N).map(|v| v * 7 - 5).collect();
    let hp = uniform((N * M) as usize, 3, -1.0, 1.0);
    let hs = uniform(N as usize, 4, -1.0, 1.0);
    let loss = |x: &[f64], w: &[f64]| {
        let (p, s) = forward(&oracle, x, w, &idx);
        p.iter().zip(&hp).map(|(a, b)| a * b).sum::<f64>()
            + s.iter().zip(&hs).map(|(a, b)| a * b).sum::<f64>()
    };
    let eps = 1e-6;
    let numeric = |v: &[f64], which: usize| -> Vec<f64> {
        (0..v.len())
            .map(|j| {
                let (mut up, mut dn) = (v.to_vec(), v.to_vec());
                up[j] += eps;
                dn[j] -= eps;
                let (lu, ld) = if which == 0 {
                    (loss(&up, &w), loss(&dn, &w))
                } else {
                    (loss(&x, &up), loss(&x, &dn))
                };
                (lu - ld) / (2.0 * eps)
            })
            .collect()
    };
    let (want_x, want_w) = (numeric(&x, 0), numeric(&w, 1));
    let f = built(target);
    let b = backward(&f).unwrap();
    let names: Vec<&str> = b
        .signature()
        .unwrap()
        .params
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(
        &names[..6],
        ["X", "W", "I", "grad_P", "grad_S", "grad_K"],
        "{target}"
    );
    assert_eq!(names.len(), 8, "{target}: {names:?}");
    let gx = f64_tensor(&vec![f64::NAN; (N * M) as usize], &[N, M]);
    let gw = f64_tensor(&vec![f64::NAN; M as usize], &[M]);
    rivet_tests::call(
        &b,
        &[
            Value::Tensor(f64_tensor(&x, &[N, M])),
            Value::Tensor(f64_tensor(&w, &[M])),
            Value::Tensor(Tensor::from_slice(&idx, &[N]).unwrap()),
            Value::Tensor(f64_tensor(&hp, &[N, M])),
            Value::Tensor(f64_tensor(&hs, &[N])),
            // The int output's cotangent: taken, ignored.
            Value::Tensor(Tensor::from_slice(&[i64::MIN, i64::MAX, 0], &[N]).unwrap()),
            Value::Tensor(gx.clone()),
            Value::Tensor(gw.clone()),
        ],
    )
    .unwrap();
    for (got, want, what) in [
        (gx.to_vec::<f64>().unwrap(), &want_x, "X"),
        (gw.to_vec::<f64>().unwrap(), &want_w, "W"),
    ] {
        for (g, e) in got.iter().zip(want.iter()) {
            assert!(
                (g - e).abs() <= 1e-6 * (1.0 + e.abs()),
                "{target} d{what}: {got:?} vs {want:?}"
            );
        }
    }
}

#[test]
fn the_backward_is_built_once() {
    let f = built("interp");
    let (a, b) = (backward(&f).unwrap(), backward(&f).unwrap());
    assert!(a.same(&b));
}

fn identity_gets_the_cotangent_copied(target: &Target) {
    let n = te::var("n");
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let c = compute([&n], |[i]| a.at([i]), "C").unwrap();
    let m = build(
        &Schedule::new(&[c.clone()]).unwrap(),
        &[a.clone(), c.clone()],
        target,
        "id",
    )
    .unwrap();
    let b = backward(&m.get_function("id").unwrap()).unwrap();
    let head = Tensor::from_slice(&[1.5f32, -2.0, 3.25, 0.0, 9.0], &[5]).unwrap();
    let g = Tensor::from_slice(&[f32::NAN; 5], &[5]).unwrap();
    let x = Tensor::from_slice(&[0f32; 5], &[5]).unwrap();
    rivet_tests::call(
        &b,
        &[
            Value::Tensor(x),
            Value::Tensor(head.clone()),
            Value::Tensor(g.clone()),
        ],
    )
    .unwrap();
    assert_eq!(
        g.to_vec::<f32>().unwrap(),
        head.to_vec::<f32>().unwrap(),
        "{target}"
    );
}

fn not_diff(r: rivet_compiler::Result<Function>) -> String {
    match r {
        Err(rivet_compiler::Error::Runtime(Error::NotDifferentiable(m))) => m,
        Err(e) => panic!("expected NotDifferentiable, got {e:?}"),
        Ok(_) => panic!("expected NotDifferentiable, got a backward"),
    }
}

#[test]
fn what_rivet_cannot_differentiate_is_refused_naming_the_function() {
    // A loaded module keeps the loop IR, not the te program.
    let dir = std::env::temp_dir().join(format!("rivet-backward-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fw.rivet");
    let (ins, outs) = program();
    let args: Vec<Te> = ins.iter().chain(&outs).cloned().collect();
    build(&Schedule::new(&outs).unwrap(), &args, "cpu", "fw")
        .unwrap()
        .save(&path)
        .unwrap();
    let loaded = rivet_compiler::Module::load(&path)
        .unwrap()
        .get_function("fw")
        .unwrap();
    let m = not_diff(backward(&loaded));
    assert!(
        m.contains("'fw'") && m.contains("loaded from a saved module"),
        "{m}"
    );
    std::fs::remove_dir_all(&dir).ok();

    // A function that is not compiled at all.
    let plain = Function::new("plain", |_| Ok(Value::Null));
    let m = not_diff(backward(&plain));
    assert!(m.contains("'plain'") && m.contains("no te program"), "{m}");

    // A host callback on the path from an input to an output.
    let n = te::var("n");
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let e = te::extern_(
        &[n.clone()],
        &[a.clone()],
        te::CallbackFn::Function(Function::new("cb", |_| Ok(Value::Null))),
        DType::F32,
        "E",
    )
    .unwrap();
    let d = compute([&n], |[i]| e.at([i]) * 2.0, "D").unwrap();
    let f = build(
        &Schedule::new(&[d.clone()]).unwrap(),
        &[a.clone(), d],
        "cpu",
        "ext",
    )
    .unwrap()
    .get_function("ext")
    .unwrap();
    let m = not_diff(backward(&f));
    assert!(
        m.contains("'ext'") && m.contains("'E'") && m.contains("host callback"),
        "{m}"
    );

    // Nothing to differentiate: int inputs only.
    let i = placeholder([&n], DType::I32, "I").unwrap();
    let o = compute([&n], |[j]| te::cast(DType::F32, i.at([j])), "O").unwrap();
    let f = build(
        &Schedule::new(&[o.clone()]).unwrap(),
        &[i, o],
        "cpu",
        "ints",
    )
    .unwrap()
    .get_function("ints")
    .unwrap();
    let m = not_diff(backward(&f));
    assert!(
        m.contains("'ints'") && m.contains("no float tensor inputs"),
        "{m}"
    );
}

#[test]
fn a_cuda_function_gets_a_cuda_backward_compiled_by_nvrtc() {
    if std::env::var("RIVET_REQUIRE_NVRTC").as_deref() != Ok("1") {
        // Without NVRTC the CUDA build itself is refused; `make test` requires it.
        return;
    }
    let f = built("cuda -arch=sm_80");
    let b = backward(&f).unwrap();
    let sig = b.signature().unwrap().to_string();
    assert!(sig.contains("X_grad") || sig.contains("grad_S"), "{sig}");
}

rivet_tests::for_each_backend! {
    backward_matches_central_differences_with_two_outputs_and_int_arguments,
    identity_gets_the_cotangent_copied,
}
