//! Golden text of the loop IR (and the backend's code) of canonical kernels.
//! `RIVET_BLESS=1 cargo test -p rivet-tests --test golden` rewrites the files in
//! `tests/golden/`; review the diff before committing it.

use rivet_compiler::ir::Expr;
use rivet_compiler::te::{self, compute, placeholder};
use rivet_compiler::{build, Module, Schedule};
use rivet_runtime::DType;
use rivet_tests::SeedGemm;
use std::path::PathBuf;

fn golden(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(name);
    if std::env::var("RIVET_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "{} is missing: run with RIVET_BLESS=1 to create it",
            path.display()
        )
    });
    assert!(want == text, "{name} differs from the golden file (RIVET_BLESS=1 to update):\n--- golden\n{want}\n--- now\n{text}");
}

fn gemm(split: bool) -> Module {
    let SeedGemm { a, b, c, k } = SeedGemm::new();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    if split {
        let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
        let st = s.stage(&c).unwrap();
        let (io, ii) = st.split(&i, Some(Expr::int(4)), None).unwrap();
        let (jo, ji) = st.split(&j, Some(Expr::int(4)), None).unwrap();
        st.reorder(&[io.clone(), jo, k.var.clone(), ii, ji.clone()])
            .unwrap();
        st.parallel(&io).unwrap();
        st.vectorize(&ji).unwrap();
    }
    build(&s, &[a, b, c], "cpu", "mm").unwrap()
}

fn softmax_inlined() -> Module {
    let (m, n) = (te::var("m"), te::var("n"));
    let x = placeholder([&m, &n], DType::F32, "X").unwrap();
    let r1 = te::reduce_axis(0, &n, "r1").unwrap();
    let r2 = te::reduce_axis(0, &n, "r2").unwrap();
    let mx = compute([&m], |[i]| te::max_over(x.at((i, &r1)), &r1), "mx").unwrap();
    let e = compute([&m, &n], |[i, j]| te::exp(x.at([&i, &j]) - mx.at([i])), "e").unwrap();
    let sm = compute([&m], |[i]| te::sum(e.at((i, &r2)), &r2), "sm").unwrap();
    let y = compute([&m, &n], |[i, j]| e.at([&i, &j]) / sm.at([i]), "Y").unwrap();
    let mut s = Schedule::new(&[y.clone()]).unwrap();
    s.compute_inline(&e).unwrap();
    build(&s, &[x, y], "cpu", "softmax").unwrap()
}

#[test]
fn loop_ir_of_canonical_kernels() {
    golden("gemm.ir", &gemm(false).get_source("ir").unwrap());
    golden("gemm_tiled.ir", &gemm(true).get_source("ir").unwrap());
    golden("softmax.ir", &softmax_inlined().get_source("ir").unwrap());
}

#[test]
fn cranelift_ir_of_canonical_kernels() {
    golden("gemm.clif", &gemm(false).get_source("cranelift").unwrap());
    golden(
        "gemm_tiled.clif",
        &gemm(true).get_source("cranelift").unwrap(),
    );
}
