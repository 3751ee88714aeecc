//! Tests of what the backend does to build faster, each against the slower way's results:
//! floor division and remainder by a constant divisor (a shift, a mask or a short sequence
//! instead of the guarded general one), constant allocation sizes multiplied at generation,
//! the kernel that keeps no CLIF copy (`keep_clif(false)`, generated again on request) and
//! `compile_verified` (the caller's verifier run stands for the backend's).

use super::tests::{elementwise, int_binary_ref, int_samples, run_1d};
use super::CraneliftBackend;
use crate::codegen::{Backend, Kernel};
use crate::ir::{BinOp, Expr};
use rivet_runtime::DType;

/// `x // d` and `x % d` for constant divisors `d > 0` (powers of two, others, the largest
/// of the dtype) match the reference formulas at every signed width, on the extremes too.
#[test]
fn floor_division_by_a_constant_matches_the_reference() {
    for dt in [DType::I8, DType::I16, DType::I32, DType::I64] {
        let bits = dt.size() as u32 * 8;
        let max = i64::MAX >> (64 - bits);
        let top_pow2 = 1i64 << (bits - 2);
        let xs = int_samples(dt);
        let n = xs.len();
        let sz = dt.size();
        let a: Vec<u8> = xs
            .iter()
            // The samples' bytes at the dtype's width (adding 0 wraps nothing).
            .flat_map(|&x| int_binary_ref(BinOp::Add, dt, x, 0))
            .collect();
        for d in [1, 2, 3, 4, 7, 12, 32, 64, 100, top_pow2, max] {
            for op in [BinOp::FloorDiv, BinOp::FloorMod] {
                let f = elementwise("cdiv", &[dt], dt, |a| {
                    Expr::binary(op, a[0].clone(), Expr::const_int(d, dt)).unwrap()
                });
                let mut data = vec![a.clone(), vec![0; n * sz]];
                run_1d(&f, n, &mut data);
                for k in 0..n {
                    let want = int_binary_ref(op, dt, xs[k], d as i128);
                    assert_eq!(
                        &data[1][k * sz..(k + 1) * sz],
                        &want[..],
                        "{dt} {op:?}({}, {d})",
                        xs[k]
                    );
                }
            }
        }
    }
}

/// A kernel of a backend that keeps no CLIF says so from `source`, and `source_from` gives
/// exactly the text a kernel that kept it gives; `compile_verified` computes what `compile`
/// does.
#[test]
fn clif_generated_again_on_request_and_verified_compile() {
    let f = elementwise("addc", &[DType::F32], DType::F32, |a| {
        Expr::binary(BinOp::Add, a[0].clone(), Expr::constant(1.5, DType::F32)).unwrap()
    });
    crate::ir::verify::verify(&f, true).unwrap();
    let kept = CraneliftBackend::new().unwrap().compile(&f).unwrap();
    let lean = CraneliftBackend::new().unwrap().keep_clif(false);
    let k = lean.compile_verified(&f).unwrap();
    assert!(kept.source().contains("function"), "{}", kept.source());
    assert!(k.source().contains("not kept"), "{}", k.source());
    assert_eq!(k.source_from(&f), kept.source());
    // The kernel that kept its CLIF answers `source_from` with it, unchanged.
    assert_eq!(kept.source_from(&f), kept.source());
    let (k, kept): (Box<dyn Kernel>, Box<dyn Kernel>) = (k, kept);
    let n = 5usize;
    let x: Vec<u8> = (0..n)
        .flat_map(|i| (i as f32 - 2.0).to_le_bytes())
        .collect();
    let outs: Vec<Vec<u8>> = [&k, &kept]
        .iter()
        .map(|kern| {
            let mut data = vec![x.clone(), vec![0u8; 4 * n]];
            super::tests::run_kernel_1d(kern.as_ref(), &f, n, &mut data);
            data.pop().unwrap()
        })
        .collect();
    assert_eq!(outs[0], outs[1]);
    let want: Vec<u8> = (0..n)
        .flat_map(|i| (i as f32 - 0.5).to_le_bytes())
        .collect();
    assert_eq!(outs[0], want);
}

/// Through `build`: the module's CLIF comes from the function (nothing kept) and names every
/// generated function.
#[test]
fn built_module_generates_its_clif_on_request() {
    use crate::te;
    let n = te::var("n");
    let x = te::placeholder([&n], DType::F32, "X").unwrap();
    let y = te::compute([&n], |[i]| x.at([i]) * 2.0, "Y").unwrap();
    let s = crate::Schedule::new(&[&y]).unwrap();
    let m = crate::build(&s, &[&x, &y], "cpu", "dbl").unwrap();
    let clif = m.get_source("cranelift").unwrap();
    assert!(clif.starts_with("; dbl (entry)\nfunction"), "{clif}");
    assert_eq!(clif, m.get_source("cranelift").unwrap());
}

/// `RIVET_CLIF_SET` takes the speed-only settings and refuses anything else by name.
#[test]
fn clif_set_takes_speed_settings_only() {
    use cranelift_codegen::settings;
    let mut flags = settings::builder();
    super::flags::apply_clif_set(&mut flags, "opt_level=none,regalloc_algorithm=single_pass,")
        .unwrap();
    let f = settings::Flags::new(flags);
    assert_eq!(f.opt_level(), settings::OptLevel::None);
    for bad in [
        "enable_nan_canonicalization=true",
        "opt_level",
        "opt_level=fastest",
    ] {
        let e = super::flags::apply_clif_set(&mut settings::builder(), bad).unwrap_err();
        assert!(
            matches!(e, crate::error::Error::Compile(_))
                && e.to_string().contains("RIVET_CLIF_SET"),
            "{bad}: {e}"
        );
    }
}
