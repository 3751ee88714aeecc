//! Golden text of the loop IR (and the backend's code) of canonical kernels, in
//! `tests/golden/` (`rivet_tests::golden`, the one golden check: `RIVET_BLESS=1` rewrites the
//! files; review the diff before committing it).

use rivet_compiler::ir::Expr;
use rivet_compiler::te::{self, compute, placeholder};
use rivet_compiler::{build, Module, Schedule};
use rivet_runtime::DType;
use rivet_tests::golden::check_golden as golden;
use rivet_tests::SeedGemm;

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
