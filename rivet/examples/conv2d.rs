//! A 2-D convolution, NCHW input and OIHW weights, stride 1, no padding:
//! `Y[b, o, h, w] = sum_{c, kh, kw} X[b, c, h + kh, w + kw] * W[o, c, kh, kw]`, every size
//! symbolic. Built for the CPU, saved, and checked from Python against
//! `torch.nn.functional.conv2d` (`rivet/examples/check.py`).
//!
//! Run: `cargo run --release -p rivet --example conv2d -- conv2d.rivet [TARGET]` (TARGET:
//! `cpu`, the default, or e.g. `"cuda -arch=sm_90"`: NVRTC compiles it, no GPU needed to build)

use rivet::prelude::*;

fn main() -> rivet::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "conv2d.rivet".into());
    let target = std::env::args().nth(2).unwrap_or_else(|| "cpu".into());
    let [n, c, h, w, o, kh, kw] = ["n", "c", "h", "w", "o", "kh", "kw"].map(te::var);
    let x = te::placeholder([&n, &c, &h, &w], DType::F32, "X")?;
    let wt = te::placeholder([&o, &c, &kh, &kw], DType::F32, "W")?;
    let rc = te::reduce_axis(0, &c, "rc")?;
    let rh = te::reduce_axis(0, &kh, "rh")?;
    let rw = te::reduce_axis(0, &kw, "rw")?;
    let (oh, ow) = (&h - &kh + 1, &w - &kw + 1);
    let y = te::compute(
        [&n, &o, &oh, &ow],
        |[b, f, i, j]| {
            te::sum(
                x.at((b, &rc, i + &rh, j + &rw)) * wt.at((f, &rc, &rh, &rw)),
                [&rc, &rh, &rw],
            )
        },
        "Y",
    )?;
    build(
        &Schedule::new(&[&y])?,
        &[&x, &wt, &y],
        target.as_str(),
        "conv2d",
    )?
    .save(&path)?;
    println!("built 'conv2d' for {target} and saved it to {path}");
    Ok(())
}
