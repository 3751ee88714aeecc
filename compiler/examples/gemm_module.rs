//! The user's workflow, Rust half: define a kernel with the Rust DSL, build it for the CPU and
//! save the module. `compiler/examples/use_gemm.py` loads it from Python, wraps it with
//! `rivet.to_pytorch_func` and checks it against `torch.mm`.
//!
//! Run: `cargo run --release -p rivet-compiler --example gemm_module -- gemm.rivet`

use rivet_compiler::te;
use rivet_compiler::{build, Schedule};
use rivet_runtime::DType;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "gemm.rivet".into());

    // C[i, j] = sum_k A[i, k] * B[k, j], for any n (a symbolic dim bound at call time).
    let n = te::var("n");
    let a = te::placeholder([&n, &n], DType::F32, "A")?;
    let b = te::placeholder([&n, &n], DType::F32, "B")?;
    let k = te::reduce_axis(0, &n, "k")?;
    let c = te::compute(
        [&n, &n],
        |[i, j]| te::sum(a.at((i, &k)) * b.at((&k, j)), &k),
        "C",
    )?;

    // A simple schedule: rows in parallel, the reduction outside the contiguous j loop.
    let mut s = Schedule::new(&[&c])?;
    let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
    let st = s.stage(&c)?;
    st.reorder(&[i.clone(), k.var.clone(), j])?;
    st.parallel(&i)?;

    let module = build(&s, &[a, b, c], "cpu", "mm")?;
    module.save(&path)?;
    println!("built 'mm' for the CPU and saved it to {path}");
    println!("{}", module.get_source("ir")?);
    Ok(())
}
