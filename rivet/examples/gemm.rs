//! The seed GEMM, `C[i, j] = sum_k A[i, k] * B[k, j]` for any n, built for the CPU with the
//! default schedule and saved; `rivet/examples/check.py` loads it from Python and checks it
//! against torch (`tests/python/test_rust_examples.py` runs both). docs/rust.md's Rust tutorial
//! is the block between the `tutorial` markers, checked by that test to match.
//!
//! Run: `cargo run --release -p rivet --example gemm -- gemm.rivet`

use rivet::prelude::*;

fn main() -> rivet::Result<()> {
    let path = std::env::args().nth(1);
    let path = path.as_deref().unwrap_or("gemm.rivet");
    gemm(path)?;
    println!("built 'mm' for the CPU and saved it to {path}");
    Ok(())
}

// Kept as written, one statement per line, as docs/rust.md shows it next to its Python twin
// (rustfmt's call-width heuristic would spread `compute` over five lines).
#[rustfmt::skip]
fn gemm(path: &str) -> rivet::Result<()> {
    // tutorial: begin
    let n = te::var("n");
    let a = te::placeholder([&n, &n], DType::F32, "A")?;
    let b = te::placeholder([&n, &n], DType::F32, "B")?;
    let k = te::reduce_axis(0, &n, "k")?;
    let c = te::compute([&n, &n], |[i, j]| te::sum(a.at((i, &k)) * b.at((&k, j)), &k), "C")?;
    let module = build(&Schedule::new(&[&c])?, &[&a, &b, &c], "cpu", "mm")?;
    module.save(path)?;
    // tutorial: end
    Ok(())
}
