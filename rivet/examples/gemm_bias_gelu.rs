//! A fused GEMM + bias + gelu (the exact, erf form): `Y = gelu(A @ B + bias)` for an (n, k) by
//! (k, m) product, in one function. Built for the CPU, saved, and checked from Python against
//! `torch.nn.functional.gelu(a @ b + bias)` (`rivet/examples/check.py`).
//!
//! Run: `cargo run --release -p rivet --example gemm_bias_gelu -- gemm_bias_gelu.rivet [TARGET]` (TARGET:
//! `cpu`, the default, or e.g. `"cuda -arch=sm_90"`: NVRTC compiles it, no GPU needed to build)

use rivet::prelude::*;

fn main() -> rivet::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "gemm_bias_gelu.rivet".into());
    let target = std::env::args().nth(2).unwrap_or_else(|| "cpu".into());
    let (n, k, m) = (te::var("n"), te::var("k"), te::var("m"));
    let a = te::placeholder([&n, &k], DType::F32, "A")?;
    let b = te::placeholder([&k, &m], DType::F32, "B")?;
    let bias = te::placeholder([&m], DType::F32, "bias")?;
    let r = te::reduce_axis(0, &k, "r")?;
    let mm = te::compute(
        [&n, &m],
        |[i, j]| te::sum(a.at((i, &r)) * b.at((&r, j)), &r),
        "mm",
    )?;
    let y = te::compute(
        [&n, &m],
        |[i, j]| {
            let v = mm.at([&i, &j]) + bias.at([j]);
            0.5 * &v * (1.0 + te::erf(v * std::f64::consts::FRAC_1_SQRT_2))
        },
        "Y",
    )?;
    let f = build(
        &Schedule::new(&[&y])?,
        &[&a, &b, &bias, &y],
        target.as_str(),
        "gemm_bias_gelu",
    )?;
    f.save(&path)?;
    println!("built 'gemm_bias_gelu' for {target} and saved it to {path}");
    Ok(())
}
