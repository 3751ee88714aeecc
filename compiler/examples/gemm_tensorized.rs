//! The tensorized blocked GEMM (`kernels::tensorized`) at 1024: checked against the
//! interpreter-verified path in the tests; here only timed, informally (GFLOP/s, median of
//! repeated calls). `cargo run --release -p rivet-compiler --example gemm_tensorized [n]`;
//! `RIVET_MICROKERNEL=avx2|portable` forces a micro-kernel variant, `RIVET_NUM_THREADS` the
//! thread count.

use rivet_compiler::kernels::tensorized::gemm;
use rivet_compiler::{build, Target};
use rivet_runtime::{DType, Tensor, Value};
use std::time::Instant;

fn main() {
    let n: i64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let t0 = Instant::now();
    let (args, s) = gemm((n, n, n), DType::F32, false, false).expect("schedule");
    let f = build(&s, &args, &Target::cpu(), "gemm")
        .expect("build")
        .get_function("gemm")
        .expect("function");
    let build_ms = t0.elapsed().as_secs_f64() * 1e3;
    let v: Vec<f32> = (0..n * n).map(|x| ((x % 7) as f32) * 0.25 - 0.5).collect();
    let a = Tensor::from_slice(&v, &[n, n]).unwrap();
    let b = Tensor::from_slice(&v, &[n, n]).unwrap();
    let c = Tensor::from_slice(&vec![0f32; (n * n) as usize], &[n, n]).unwrap();
    let call = || {
        f.call(&[
            Value::Tensor(a.clone()),
            Value::Tensor(b.clone()),
            Value::Tensor(c.clone()),
        ])
        .expect("call")
    };
    call();
    let mut times: Vec<f64> = (0..9)
        .map(|_| {
            let t = Instant::now();
            call();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    let variant =
        rivet_compiler::codegen::cpu_lib::microkernel::selected().unwrap_or_else(|e| panic!("{e}"));
    println!(
        "n={n} micro-kernel={} build {build_ms:.1} ms, median {:.2} ms, {:.1} GFLOP/s",
        variant.name(),
        med * 1e3,
        2.0 * (n as f64).powi(3) / med / 1e9
    );
}
