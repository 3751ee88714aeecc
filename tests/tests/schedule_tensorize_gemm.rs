//! `tensorize` end to end: the blocked, packed GEMM of `kernels::tensorized` (its register
//! tile replaced by a `gemm_update` micro-kernel call) against the interpreter (bit for bit:
//! both run the same fused multiply-adds in the same order) and against a float64 reference
//! (within the fused-sum bound of docs/cpu.md), at sizes 1, 3, 17, 97 and 1023, with
//! transposed and strided operands; and the refusals: a nest that is not the intrinsic's
//! computation is a CompileError, never a wrong answer.

use rivet_compiler::ir::{Expr, Intrin};
use rivet_compiler::kernels::tensorized::gemm;
use rivet_compiler::te::{self, compute, placeholder};
use rivet_compiler::{build, Schedule, Target};
use rivet_runtime::{DType, Function, Tensor, Value};

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

fn func(m: i64, n: i64, k: i64, a_t: bool, b_t: bool, target: &Target) -> Function {
    let (args, s) = gemm((m, n, k), DType::F32, a_t, b_t).unwrap();
    build(&s, &args, target, "gemm")
        .unwrap_or_else(|e| panic!("{target}: {e}"))
        .get_function("gemm")
        .unwrap()
}

/// A (m x k logically) and B (k x n logically) as tensors in the layout the function takes:
/// `a_t`: A given as (k, m); `strided`: every operand a view with a step of 2 in its last dim
/// and a row pad, over a larger buffer.
fn operand(v: &[f32], rows: i64, cols: i64, strided: bool) -> Tensor {
    if !strided {
        return Tensor::from_slice(v, &[rows, cols]).unwrap();
    }
    let (rs, cs) = (2 * cols + 3, 2);
    let mut mem = vec![f32::NAN; (rows * rs + 5) as usize];
    for r in 0..rows {
        for c in 0..cols {
            mem[(5 + r * rs + c * cs) as usize] = v[(r * cols + c) as usize];
        }
    }
    Tensor::from_slice(&mem, &[mem.len() as i64])
        .unwrap()
        .as_strided(&[rows, cols], &[rs, cs], 5)
        .unwrap()
}

#[derive(Debug, Clone)]
struct Case {
    m: i64,
    n: i64,
    k: i64,
    a_t: bool,
    b_t: bool,
    strided: bool,
}

/// Runs a case on `target`; returns C (m x n, row-major) and the logical A, B.
fn run(c: &Case, target: &Target) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (m, n, k) = (c.m, c.n, c.k);
    let av = data((m * k) as usize, (m * 31 + k) as u64); // stored layout
    let bv = data((k * n) as usize, (n * 17 + k) as u64);
    let a = if c.a_t {
        operand(&av, k, m, c.strided)
    } else {
        operand(&av, m, k, c.strided)
    };
    let b = if c.b_t {
        operand(&bv, n, k, c.strided)
    } else {
        operand(&bv, k, n, c.strided)
    };
    let f = func(m, n, k, c.a_t, c.b_t, target);
    // C written in place through a transposed view when strided (poisoned first).
    let out = if c.strided {
        let mem = Tensor::from_slice(&vec![f32::NAN; (m * n) as usize], &[m * n]).unwrap();
        (mem.clone(), mem.as_strided(&[m, n], &[1, m], 0).unwrap())
    } else {
        let t = Tensor::from_slice(&vec![f32::NAN; (m * n) as usize], &[m, n]).unwrap();
        (t.clone(), t)
    };
    f.call(&[Value::Tensor(a), Value::Tensor(b), Value::Tensor(out.1)])
        .unwrap_or_else(|e| panic!("{target}: {e}"));
    let raw = out.0.to_vec::<f32>().unwrap();
    let got: Vec<f32> = if c.strided {
        (0..m * n)
            .map(|x| raw[((x % n) * m + x / n) as usize])
            .collect()
    } else {
        raw
    };
    // Logical A (m x k) and B (k x n), row-major.
    let la: Vec<f32> = (0..m * k)
        .map(|x| {
            let (i, p) = (x / k, x % k);
            if c.a_t {
                av[(p * m + i) as usize]
            } else {
                av[x as usize]
            }
        })
        .collect();
    let lb: Vec<f32> = (0..k * n)
        .map(|x| {
            let (p, j) = (x / n, x % n);
            if c.b_t {
                bv[(j * k + p) as usize]
            } else {
                bv[x as usize]
            }
        })
        .collect();
    (got, la, lb)
}

/// Rows `rows` of C against float64 maths: |err| <= (k + 1) * eps * sum |a b| (docs/cpu.md).
fn check_reference(c: &Case, got: &[f32], a: &[f32], b: &[f32], rows: &[i64]) {
    let (n, k) = (c.n, c.k);
    for &i in rows {
        for j in 0..n {
            let (mut x, mut mag) = (0f64, 0f64);
            for p in 0..k {
                let t = a[(i * k + p) as usize] as f64 * b[(p * n + j) as usize] as f64;
                x += t;
                mag += t.abs();
            }
            let g = got[(i * n + j) as usize] as f64;
            let tol = (k as f64 + 1.0) * f32::EPSILON as f64 * mag + 1e-30;
            assert!(
                (g - x).abs() <= tol,
                "m={} n={} k={} C[{i},{j}] = {g}, expected {x} (tolerance {tol})",
                c.m,
                c.n,
                c.k
            );
        }
    }
}

#[test]
fn tensorized_gemm_matches_the_interpreter_and_float64_maths() {
    let sizes = [1i64, 3, 17, 97];
    let mut cases = Vec::new();
    for &m in &sizes {
        for &n in &sizes {
            for &k in &[1i64, 3, 17, 97] {
                cases.push(Case {
                    m,
                    n,
                    k,
                    a_t: false,
                    b_t: false,
                    strided: false,
                });
            }
        }
    }
    for (a_t, b_t, strided) in [
        (true, false, false),
        (false, true, true),
        (true, true, true),
    ] {
        for (m, n, k) in [(17, 97, 3), (97, 17, 97), (3, 1, 17), (24, 64, 12)] {
            cases.push(Case {
                m,
                n,
                k,
                a_t,
                b_t,
                strided,
            });
        }
    }
    for c in &cases {
        let (want, _, _) = run(c, &Target::interp());
        let (got, a, b) = run(c, &Target::cpu());
        assert!(
            got.iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "cpu != interp at m={} n={} k={} a_t={} b_t={} strided={}",
            c.m,
            c.n,
            c.k,
            c.a_t,
            c.b_t,
            c.strided
        );
        check_reference(c, &got, &a, &b, &(0..c.m).collect::<Vec<_>>());
    }
}

#[test]
fn tensorized_gemm_1023_matches_float64_maths() {
    for (a_t, b_t, strided) in [(false, false, false), (true, true, true)] {
        let c = Case {
            m: 1023,
            n: 1023,
            k: 1023,
            a_t,
            b_t,
            strided,
        };
        let (got, a, b) = run(&c, &Target::cpu());
        check_reference(&c, &got, &a, &b, &[0, 1, 11, 12, 500, 1011, 1012, 1022]);
    }
}

/// `C[i, j] = sum_k body(A, B)` over (m x k) and (k x n), split into 12 x 32 tiles with the
/// loop order `io, jo, ii, ji, k`, tensorized at `at` (0: ii, 1: ji, 2: k).
fn tiled(
    body: &dyn Fn(Expr, Expr) -> Expr,
    dtype: DType,
    (m, n): (i64, i64),
    at: usize,
) -> rivet_compiler::Result<rivet_compiler::Module> {
    let int = Expr::int;
    let a = placeholder([m, 16], dtype, "A").unwrap();
    let b = placeholder([16, n], dtype, "B").unwrap();
    let k = te::reduce_axis(0, 16, "k").unwrap();
    let c = compute(
        [m, n],
        |[i, j]| te::sum(body(a.at((i, &k)), b.at((&k, j))), &k),
        "C",
    )
    .unwrap();
    let mut s = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
    let st = s.stage(&c).unwrap();
    let (io, ii) = st.split(&i, Some(int(12)), None).unwrap();
    let (jo, ji) = st.split(&j, Some(int(32)), None).unwrap();
    st.reorder(&[io, jo, ii.clone(), ji.clone(), k.var.clone()])
        .unwrap();
    let axis = [ii, ji, k.var.clone()][at].clone();
    st.tensorize(&axis, Intrin::GemmUpdate)?;
    build(&s, &[a, b, c], &Target::cpu(), "t")
}

#[test]
fn tensorize_of_a_plain_tiled_gemm_works_without_packing() {
    // Unpacked operands: the generic path of the micro-kernel entry, same results as interp.
    let m = tiled(&|x, y| x * y, DType::F32, (24, 64), 0).unwrap();
    let f = m.get_function("t").unwrap();
    let av = data(24 * 16, 1);
    let bv = data(16 * 64, 2);
    let out = f
        .call(&[
            Value::Tensor(Tensor::from_slice(&av, &[24, 16]).unwrap()),
            Value::Tensor(Tensor::from_slice(&bv, &[16, 64]).unwrap()),
        ])
        .unwrap();
    let got = out.as_tensor().unwrap().to_vec::<f32>().unwrap();
    for i in 0..24 {
        for j in 0..64 {
            let mut acc = 0f32;
            for p in 0..16 {
                acc = av[i * 16 + p].mul_add(bv[p * 64 + j], acc);
            }
            assert_eq!(got[i * 64 + j].to_bits(), acc.to_bits(), "C[{i},{j}]");
        }
    }
    assert!(m
        .get_source("ir")
        .map(|s| s.contains("call gemm_update"))
        .unwrap_or(true));
}

#[test]
fn tensorize_refuses_what_is_not_the_intrinsic() {
    let msg = |r: rivet_compiler::Result<rivet_compiler::Module>| match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    // Another expression.
    let e = msg(tiled(&|x, y| x + y, DType::F32, (24, 64), 0));
    assert!(
        e.contains("tensorize of 'C'") && e.contains("not a product"),
        "{e}"
    );
    let e = msg(tiled(&|x, y| x * &y * y, DType::F32, (24, 64), 0));
    assert!(e.contains("tensorize of 'C'"), "{e}");
    // Another dtype.
    let e = msg(tiled(&|x, y| x * y, DType::I32, (24, 64), 0));
    assert!(
        e.contains("int32") && e.contains("float32 or float64"),
        "{e}"
    );
    // Another nest: two loops, one loop.
    let e = msg(tiled(&|x, y| x * y, DType::F32, (24, 64), 1));
    assert!(e.contains("nest of 3 loops") && e.contains("has 2"), "{e}");
    // A split that does not divide leaves a guard in the tile.
    let e = msg(tiled(&|x, y| x * y, DType::F32, (20, 64), 0));
    assert!(e.contains("a condition"), "{e}");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// Random shapes (hostile sizes: 1, around the tile, around KC), layouts and operand
    /// views: cpu == interp bit for bit, and float64 maths within the bound. Under
    /// `RIVET_MICROKERNEL` (the child runs of `every_variant_runs_the_properties`) this covers
    /// each variant.
    fn case() -> impl Strategy<Value = Case> {
        let dim = prop_oneof![
            Just(1i64),
            Just(11),
            Just(12),
            Just(13),
            Just(31),
            Just(32),
            Just(33),
            1i64..50
        ];
        let depth = prop_oneof![Just(1i64), Just(255), Just(256), Just(257), 1i64..40];
        (
            dim.clone(),
            dim,
            depth,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(m, n, k, a_t, b_t, strided)| Case {
                m,
                n,
                k,
                a_t,
                b_t,
                strided,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(24)
        ))]
        #[test]
        fn tensorized_gemm_equals_the_interpreter(c in case()) {
            let (want, _, _) = run(&c, &Target::interp());
            let (got, a, b) = run(&c, &Target::cpu());
            prop_assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()));
            check_reference(&c, &got, &a, &b, &(0..c.m).collect::<Vec<_>>());
        }
    }
}

/// Runs the property above once per micro-kernel variant this CPU has, each forced with
/// `RIVET_MICROKERNEL` in a child process (the choice is made once per process).
#[test]
fn every_variant_runs_the_properties() {
    rivet_tests::run_per_microkernel_variant("props::tensorized_gemm_equals_the_interpreter");
}

#[test]
fn float64_tensorized_gemm_equals_the_interpreter() {
    // f64 runs each variant's f64 kernel (or the generic loop): same fused sequence, same bits.
    for (m, n, k) in [(1i64, 1i64, 1i64), (17, 40, 3), (13, 33, 97)] {
        let av: Vec<f64> = data((m * k) as usize, 5)
            .iter()
            .map(|&x| x as f64 / 3.0)
            .collect();
        let bv: Vec<f64> = data((k * n) as usize, 6)
            .iter()
            .map(|&x| x as f64 / 7.0)
            .collect();
        let mut outs = Vec::new();
        for target in rivet_tests::backends() {
            let (args, s) = gemm((m, n, k), DType::F64, false, false).unwrap();
            let f = build(&s, &args, &target, "g")
                .unwrap()
                .get_function("g")
                .unwrap();
            let out = f
                .call(&[
                    Value::Tensor(Tensor::from_slice(&av, &[m, k]).unwrap()),
                    Value::Tensor(Tensor::from_slice(&bv, &[k, n]).unwrap()),
                ])
                .unwrap();
            outs.push(out.as_tensor().unwrap().to_vec::<f64>().unwrap());
        }
        assert!(outs[0]
            .iter()
            .zip(&outs[1])
            .all(|(x, y)| x.to_bits() == y.to_bits()));
        for i in 0..m as usize {
            for j in 0..n as usize {
                let x: f64 = (0..k as usize)
                    .map(|p| av[i * k as usize + p] * bv[p * n as usize + j])
                    .sum();
                assert!(
                    (outs[1][i * n as usize + j] - x).abs() <= 1e-12,
                    "f64 C[{i},{j}]"
                );
            }
        }
    }
}

/// A saved tensorized GEMM loads again: the verifier's race check of its parallel loop sees
/// the call's declared writes (disjoint column panels), the proof covers its regions, and the
/// loaded function computes the same bits.
#[test]
fn a_saved_tensorized_gemm_loads_and_computes_the_same() {
    let (m, n, k) = (40i64, 70i64, 19i64);
    let (args, s) = gemm((m, n, k), DType::F32, false, false).unwrap();
    let module = build(&s, &args, &Target::cpu(), "g").unwrap();
    let back = rivet_compiler::Module::from_bytes(&module.to_bytes().unwrap(), "saved").unwrap();
    assert!(back
        .get_source("nest")
        .unwrap()
        .contains("call gemm_update"));
    let av = data((m * k) as usize, 8);
    let bv = data((k * n) as usize, 9);
    let call = |f: Function| {
        f.call(&[
            Value::Tensor(Tensor::from_slice(&av, &[m, k]).unwrap()),
            Value::Tensor(Tensor::from_slice(&bv, &[k, n]).unwrap()),
        ])
        .unwrap()
        .as_tensor()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
    };
    let x = call(module.get_function("g").unwrap());
    let y = call(back.get_function("g").unwrap());
    assert!(x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// A saved tensorized GEMM whose product-slice loop was edited to run in parallel (CRC
/// fixed): its iterations would all write the same C tiles through the call, and the race
/// check (which sees the call's declared writes) refuses the file.
#[test]
fn a_saved_call_in_a_racing_parallel_loop_is_refused() {
    const HEADER: usize = 24;
    fn crc32(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
    let (args, s) = gemm((24, 64, 600), DType::F32, false, false).unwrap();
    let bytes = build(&s, &args, &Target::cpu(), "g")
        .unwrap()
        .to_bytes()
        .unwrap();
    let json = String::from_utf8(bytes[HEADER..].to_vec()).unwrap();
    let at = json.find("\"name\":\"p.outer\"").expect("the slice loop");
    let kind = at + json[at..].find("\"kind\":\"Serial\"").expect("its kind");
    let edited = format!(
        "{}\"kind\":\"Parallel\"{}",
        &json[..kind],
        &json[kind + "\"kind\":\"Serial\"".len()..]
    );
    let mut out = bytes[..HEADER].to_vec();
    out[12..20].copy_from_slice(&(edited.len() as u64).to_le_bytes());
    out[20..24].copy_from_slice(&crc32(edited.as_bytes()).to_le_bytes());
    out.extend_from_slice(edited.as_bytes());
    let e = match rivet_compiler::Module::from_bytes(&out, "edited") {
        Ok(_) => panic!("a racing parallel loop around a call was loaded"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("parallel") && e.contains("disjoint"), "{e}");
}
