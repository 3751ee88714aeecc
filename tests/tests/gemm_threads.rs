//! The default CPU schedule's packed GEMM at ragged depths and on any number of threads.
//!
//! Each element of the packed GEMM is one sequence of fused multiply-adds in ascending order
//! of the products, from zero (docs/cpu.md), whatever the micro-kernel, the L1 slicing of a
//! cut tile (`microkernel::cache::slice_depth`) or the thread that runs its column panel. So
//! the CPU build equals, bit for bit, a plain `mul_add` fold written here, and the
//! interpreter running the same defaulted schedule:
//! - at depths 1, 17, 257, 1023 and 2049 (several L1 slices, the last one ragged), with
//!   M and N off the tile (13, 45), constant (where packed) and symbolic sizes, float32 and
//!   float64;
//! - on 1, 2 and 3 threads (`RIVET_NUM_THREADS`, read once per process: one child process
//!   each), and with the slice depth forced (`RIVET_GEMM_KC`: off, 16, 40);
//! - blocked for the caches (`packed_gemm::Blocks`): K blocks (a constant K of 640 or 1000:
//!   blocks of 160 or 250 products, C stored and reloaded between them) and M blocks whose
//!   last one is ragged (its guard kept around the call), and with blocking turned off
//!   (`RIVET_GEMM_BLOCKS=0`): the same bits in every case.

use rivet_compiler::ir::Expr;
use rivet_compiler::schedule::cpu_default::apply_default_cpu;
use rivet_compiler::te::{self, compute, placeholder, Tensor as TeTensor};
use rivet_compiler::{build, Schedule, Target};
use rivet_runtime::{DType, Value};
use rivet_tests::floats::{bits, tensor_of as tensor};

/// `C = A (m x k) * B (k x n)` with constant or symbolic sizes.
fn program(m: i64, n: i64, k: i64, dt: DType, symbolic: bool) -> Vec<TeTensor> {
    let dim = |v: i64, name: &str| {
        if symbolic {
            te::var(name)
        } else {
            Expr::int(v)
        }
    };
    let (m, n, k) = (dim(m, "m"), dim(n, "n"), dim(k, "k"));
    let a = placeholder([&m, &k], dt, "A").unwrap();
    let b = placeholder([&k, &n], dt, "B").unwrap();
    let r = te::reduce_axis(0, &k, "r").unwrap();
    let c = compute(
        [&m, &n],
        |[i, j]| te::sum(a.at((i, &r)) * b.at((&r, j)), &r),
        "C",
    )
    .unwrap();
    vec![a, b, c]
}

/// Inputs in [-1, 1), different per seed.
fn data(n: usize, seed: u64) -> Vec<f64> {
    rivet_tests::uniform(n, seed, -1.0, 1.0)
}

/// The definition as the packed GEMM computes it: per element, `fma` over ascending products
/// from zero, in the dtype.
fn fused(av: &[f64], bv: &[f64], (m, n, k): (usize, usize, usize), dt: DType) -> Vec<u64> {
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            if dt == DType::F32 {
                let mut c = 0f32;
                for p in 0..k {
                    c = (av[i * k + p] as f32).mul_add(bv[p * n + j] as f32, c);
                }
                out.push(c.to_bits() as u64);
            } else {
                let mut c = 0f64;
                for p in 0..k {
                    c = av[i * k + p].mul_add(bv[p * n + j], c);
                }
                out.push(c.to_bits());
            }
        }
    }
    out
}

/// The CPU build of the untouched program and, when `interp`, the interpreter running the
/// defaulted schedule, against the fused fold: bit for bit.
fn check(m: i64, n: i64, k: i64, dt: DType, symbolic: bool, interp: bool) {
    let args = program(m, n, k, dt, symbolic);
    let av = data((m * k) as usize, (m * 7 + k) as u64);
    let bv = data((k * n) as usize, (n * 5 + k) as u64);
    let want = fused(&av, &bv, (m as usize, n as usize, k as usize), dt);
    let plain = Schedule::new(&args[2..]).unwrap();
    let mut defaulted = plain.clone();
    apply_default_cpu(&mut defaulted).unwrap();
    let mut runs = vec![(plain, Target::cpu())];
    if interp {
        runs.push((defaulted, Target::interp()));
    }
    for (s, target) in runs {
        let module = build(&s, &args, &target, "g").unwrap();
        if target == Target::cpu() {
            let ir = module.get_source("ir").unwrap_or_default();
            assert!(ir.contains("call gemm_update"), "not packed:\n{ir}");
        }
        let out = module
            .get_function("g")
            .unwrap()
            .call(&[
                Value::Tensor(tensor(&av, &[m, k], dt)),
                Value::Tensor(tensor(&bv, &[k, n], dt)),
            ])
            .unwrap();
        let got = bits(out.as_tensor().unwrap(), dt);
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(
            bad.is_none() && got.len() == want.len(),
            "{m}x{n}x{k} {dt:?} symbolic={symbolic} on {target}: element {bad:?} differs from the fused fold"
        );
    }
}

#[test]
fn default_gemm_at_ragged_depths_equals_the_fused_fold_and_the_interpreter() {
    for dt in [DType::F32, DType::F64] {
        for k in [1i64, 17, 257, 1023, 2049] {
            // Constant sizes below `MIN_GEMM_WORK` run the plain nest (unfused): symbolic only.
            let packed_when_constant =
                13 * 45 * k >= rivet_compiler::schedule::cpu_default::MIN_GEMM_WORK;
            for symbolic in [false, true] {
                if symbolic || packed_when_constant {
                    check(13, 45, k, dt, symbolic, k <= 1023);
                }
            }
        }
    }
}

/// Many column panels (300 / 32: ten, the last ragged) and row panels, so every thread runs
/// some: the same bits as the fused fold on any thread count and slice depth. Run as is by
/// the parent and again in each child below.
#[test]
fn threads_child() {
    for dt in [DType::F32, DType::F64] {
        for symbolic in [false, true] {
            check(100, 300, 257, dt, symbolic, false);
        }
    }
    check(64, 256, 300, DType::F32, false, false);
    blocked_child();
}

/// Sizes the cache blocking cuts: f32 K = 1600 (eight K blocks of 200, M blocks of 10 row
/// panels: 26 panels give 10, 10 and 6; chunks of 2 column panels: 9 panels give four and
/// a ragged one), f64 K = 1000 (four blocks of 250, M blocks of 4: 9 panels give 4, 4, 1);
/// symbolic sizes are not blocked. The printed IR shows the blocks (unless
/// `RIVET_GEMM_BLOCKS=0`).
fn blocked_child() {
    let forced = std::env::var("RIVET_GEMM_BLOCKS").ok();
    for (m, n, k, dt) in [(301, 288, 1600, DType::F32), (97, 40, 1000, DType::F64)] {
        for symbolic in [false, true] {
            check(m, n, k, dt, symbolic, false);
        }
        let args = program(m, n, k, dt, false);
        let ir = build(
            &Schedule::new(&args[2..]).unwrap(),
            &args,
            &Target::cpu(),
            "g",
        )
        .unwrap()
        .get_source("ir")
        .unwrap_or_default();
        // Eight or four K blocks, three M blocks; five chunks of columns in the first.
        let kb = if k == 1600 { 8 } else { 4 };
        let blocked = ir.contains(&format!("for p.outer in [0, {kb})"))
            && ir.contains("for i.outer.outer in [0, 3)")
            && (k != 1600 || ir.contains("parallel for j.outer.outer in [0, 5)"));
        match forced.as_deref() {
            None => assert!(blocked, "{m}x{n}x{k}: no K and M blocks, or chunks:\n{ir}"),
            Some("0") => assert!(!blocked, "{m}x{n}x{k}: blocked though turned off:\n{ir}"),
            Some(_) => {}
        }
    }
}

#[test]
fn default_gemm_bits_do_not_depend_on_threads_or_slices() {
    for threads in ["1", "2", "3"] {
        rivet_tests::run_in_child("threads_child", &[("RIVET_NUM_THREADS", threads)]);
    }
    for kc in ["0", "16", "40"] {
        rivet_tests::run_in_child("threads_child", &[("RIVET_GEMM_KC", kc)]);
    }
    rivet_tests::run_in_child("threads_child", &[("RIVET_GEMM_BLOCKS", "0")]);
    let small = [("RIVET_GEMM_BLOCKS", "16x3x2")];
    rivet_tests::run_in_child("forced_blocks_child", &small);
    rivet_tests::run_in_child("threads_child", &small);
}

/// Blocks forced at small sizes (`RIVET_GEMM_BLOCKS=16x3x2` in the parent's child: four K
/// blocks of 16 where K = 64 is constant, M blocks of 3 row panels (9 give 3, 3, 3; 26 give
/// a ragged last one), chunks of 2 column panels (10 give 5; 3 a ragged last one)), constant
/// and symbolic: the CPU build equals the fused fold and the interpreter running the same
/// defaulted schedule, bit for bit. Run as is, the default blocks (none at these sizes).
#[test]
fn forced_blocks_child() {
    for dt in [DType::F32, DType::F64] {
        for symbolic in [false, true] {
            check(100, 300, 64, dt, symbolic, true);
            check(301, 70, 64, dt, symbolic, true);
        }
    }
}

/// Hostile `RIVET_GEMM_BLOCKS` values (a user's typo or a fuzzer's environment): sizes near
/// 2^31, 2^62 and `i64::MIN`, zeros, negatives, too few or too many fields, garbage. Each
/// either is ignored (the default blocks) or is clamped (K blocks only where they divide a
/// constant K, M blocks and chunks within `1..=` the panel counts): never a failed build, a
/// panic or other bits than the fused fold.
#[test]
fn hostile_blocks_are_ignored_or_clamped() {
    for v in [
        "2147483648x2147483648x2147483648",
        "4611686018427387904x4611686018427387904x4611686018427387904",
        "-9223372036854775808x-9223372036854775808x-9223372036854775808",
        "9223372036854775807x9223372036854775807x9223372036854775807",
        "0x0x0",
        "-1x-1x-1",
        "64x1x1",
        "1x1x1",
        "16x3",
        "16x3x2x9",
        "x",
        "",
        "blocks",
        "18446744073709551616x3x2",
    ] {
        rivet_tests::run_in_child("hostile_blocks_child", &[("RIVET_GEMM_BLOCKS", v)]);
    }
}

/// One constant and one symbolic product under the parent's `RIVET_GEMM_BLOCKS`, against the
/// fused fold (K = 64: `1x1x1` makes 64 K blocks of one product).
#[test]
fn hostile_blocks_child() {
    for symbolic in [false, true] {
        check(37, 70, 64, DType::F32, symbolic, false);
    }
    check(29, 45, 64, DType::F64, false, false);
    // The value reaches the build: `1x1x1` gives 64 K blocks of one product.
    if std::env::var("RIVET_GEMM_BLOCKS").as_deref() == Ok("1x1x1") {
        let args = program(37, 70, 64, DType::F32, false);
        let s = Schedule::new(&args[2..]).unwrap();
        let ir = build(&s, &args, &Target::cpu(), "g").unwrap();
        let ir = ir.get_source("ir").unwrap_or_default();
        assert!(
            ir.contains("for p.outer in [0, 64)"),
            "1x1x1 not applied:\n{ir}"
        );
    }
}
