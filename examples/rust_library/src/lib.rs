//! A user's crate: kernels defined in Rust, handed to Python in one step. Built as a shared
//! library (`cargo build --release -p rivet-example-library`), loaded from Python with
//! `rivet.load_library("target/release/librivet_example_library.so")`, which registers
//! `example.gemm`, its backward `example.gemm_backward` (from `te::gradient`) and
//! `example.relu6`, typed: `tests/python/test_rust_examples.py` checks them against torch and
//! wraps the GEMM as a torch custom op with its backward, under `torch.compile`.

use rivet::prelude::*;

/// `C = A @ B` for any n, m, k.
fn gemm() -> rivet::Result<Function> {
    let [n, m, k] = ["n", "m", "k"].map(te::var);
    let a = te::placeholder([&n, &k], DType::F32, "A")?;
    let b = te::placeholder([&k, &m], DType::F32, "B")?;
    let r = te::reduce_axis(0, &k, "r")?;
    let c = te::compute(
        [&n, &m],
        |[i, j]| te::sum(a.at((i, &r)) * b.at((&r, j)), &r),
        "C",
    )?;
    build(&Schedule::new(&[&c])?, &[&a, &b, &c], "cpu", "gemm")?.get_function("gemm")
}

/// `Y = min(max(X, 0), 6)` (relu6) over any shape of rank 2.
fn relu6() -> rivet::Result<Function> {
    let [n, m] = ["n", "m"].map(te::var);
    let x = te::placeholder([&n, &m], DType::F32, "X")?;
    let y = te::compute(
        [&n, &m],
        |[i, j]| te::minimum(te::maximum(x.at([i, j]), 0.0), 6.0),
        "Y",
    )?;
    build(&Schedule::new(&[&y])?, &[&x, &y], "cpu", "relu6")?.get_function("relu6")
}

fn functions() -> rivet::Result<Vec<(String, Function)>> {
    let gemm = gemm()?;
    // (A, B, dC, dA, dB): the vector-Jacobian product, derived from the te program.
    let gemm_backward = rivet::backward(&gemm)?;
    Ok(vec![
        ("example.gemm".to_string(), gemm),
        ("example.gemm_backward".to_string(), gemm_backward),
        ("example.relu6".to_string(), relu6()?),
    ])
}

rivet::python_library!(functions);
