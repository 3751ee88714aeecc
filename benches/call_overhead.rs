//! Rust-side cost of a packed call: `testing.axpy` on three 4-element tensors through
//! `Function::call` (signature check + body), without any Python in the way.
//! Run: `cargo run --release -p rivet-benches --bin call_overhead`.

use rivet_runtime::{registry, Tensor, Value};
use std::time::Instant;

fn main() {
    let f = registry::get("testing.axpy").expect("built-in");
    let x = Tensor::from_slice(&[1f32; 4], &[4]).unwrap();
    let y = Tensor::from_slice(&[2f32; 4], &[4]).unwrap();
    let args = [Value::Float(0.5), Value::Tensor(x), Value::Tensor(y)];
    let mut samples = Vec::new();
    for _ in 0..21 {
        let n = 200_000;
        let t0 = Instant::now();
        for _ in 0..n {
            f.call(std::hint::black_box(&args)).unwrap();
        }
        samples.push(t0.elapsed().as_secs_f64() / n as f64 * 1e9);
    }
    samples.sort_by(f64::total_cmp);
    println!(
        "testing.axpy via Function::call, 4 elements: median {:.1} ns (min {:.1}, max {:.1})",
        samples[10], samples[0], samples[20]
    );
}
