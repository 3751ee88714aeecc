//! Softmax over the last axis of an (n, m) float32 matrix, max-subtracted, with the max a
//! constant to `te::gradient` (shift invariance), as `rivet.kernels.softmax`. Built for the
//! CPU, saved, and checked from Python against `torch.softmax` (`rivet/examples/check.py`).
//!
//! Run: `cargo run --release -p rivet --example softmax -- softmax.rivet [TARGET]` (TARGET:
//! `cpu`, the default, or e.g. `"cuda -arch=sm_90"`: NVRTC compiles it, no GPU needed to build)

use rivet::prelude::*;

fn main() -> rivet::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "softmax.rivet".into());
    let target = std::env::args().nth(2).unwrap_or_else(|| "cpu".into());
    let (n, m) = (te::var("n"), te::var("m"));
    let x = te::placeholder([&n, &m], DType::F32, "X")?;
    let (r1, r2) = (te::reduce_axis(0, &m, "r1")?, te::reduce_axis(0, &m, "r2")?);
    let max = te::compute([&n], |[i]| te::max_over(x.at((i, &r1)), &r1), "max")?;
    let max = te::stop_gradient(&max)?;
    let e = te::compute(
        [&n, &m],
        |[i, j]| te::exp(x.at([&i, &j]) - max.at([i])),
        "exp",
    )?;
    let sum = te::compute([&n], |[i]| te::sum(e.at((i, &r2)), &r2), "sum")?;
    let y = te::compute([&n, &m], |[i, j]| e.at([&i, &j]) / sum.at([i]), "Y")?;
    build(
        &Schedule::new(&[&y])?,
        &[&x, &y],
        target.as_str(),
        "softmax",
    )?
    .save(&path)?;
    println!("built 'softmax' for {target} and saved it to {path}");
    Ok(())
}
