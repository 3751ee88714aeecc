//! End-to-end compiler tests, one suite run for every backend (`rivet_tests::backends()`): DSL ->
//! schedule -> build -> call on runtime tensors, against naive Rust references; saved modules,
//! including corrupt and crafted files.

use rivet_compiler::ir::Expr;
use rivet_compiler::kernels::{self, DimSpec};
use rivet_compiler::te::{self, compute, placeholder};
use rivet_compiler::{build, Module, Schedule, Target, ToTarget};
use rivet_runtime::{DType, Error as RtError, Function, Tensor, Value};
use rivet_tests::{backends, SeedGemm};

fn data(n: usize, seed: u32) -> Vec<f32> {
    // Small integers and halves: exact in f32, so sums are exact in any order.
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 7) % 9) as f32 * 0.5 - 2.0
        })
        .collect()
}

fn t(v: &[f32], shape: &[i64]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}

fn call1(f: &Function, args: Vec<Tensor>) -> Vec<f32> {
    let out =
        rivet_tests::call(f, &args.into_iter().map(Value::Tensor).collect::<Vec<_>>()).unwrap();
    out.as_tensor()
        .expect("allocated output")
        .to_vec::<f32>()
        .unwrap()
}

fn naive_mm(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f32;
            for r in 0..k {
                acc += a[i * k + r] * b[r * n + j];
            }
            c[i * n + j] = acc;
        }
    }
    c
}

/// With `split`, a CPU schedule (split, reorder, a parallel outer loop); CUDA, which runs no
/// host loops, gets the default GPU schedule instead.
fn seed_gemm<T: ToTarget + ?Sized>(target: &T, split: bool) -> Function {
    let SeedGemm { a, b, c, k } = SeedGemm::new();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let gpu = target.to_target().is_ok_and(|t| t.kind_name() == "cuda");
    if split && !gpu {
        let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
        let st = s.stage(&c).unwrap();
        let (io, ii) = st.split(&i, Some(Expr::int(8)), None).unwrap();
        st.reorder(&[io.clone(), k.var.clone(), ii, j]).unwrap();
        st.parallel(&io).unwrap();
    }
    build(&s, &[a, b, c], target, "mm")
        .unwrap()
        .get_function("mm")
        .unwrap()
}

fn seed_gemm_symbolic_every_size_every_backend(target: &Target) {
    for split in [false, true] {
        let f = seed_gemm(&target, split);
        // 160: 3 * 160^2 elements pass PARALLEL_GRAIN, so parallel loops use the pool.
        for n in [1usize, 7, 56, 61, 160] {
            let (av, bv) = (data(n * n, 1), data(n * n, 2));
            let got = call1(
                &f,
                vec![t(&av, &[n as i64, n as i64]), t(&bv, &[n as i64, n as i64])],
            );
            assert_eq!(
                got,
                naive_mm(&av, &bv, n, n, n),
                "{target} split={split} n={n}"
            );
        }
    }
}

fn outputs_written_in_place_through_strides(target: &Target) {
    let f = seed_gemm(&target, true);
    let n = 9i64;
    let (av, bv) = (data(81, 3), data(81, 4));
    // C is the transpose of a view with a gap column: C[i, j] lives at base[j, 2 * i].
    let base = Tensor::from_slice(&vec![7.5f32; (n * 2 * n) as usize], &[n, 2 * n]).unwrap();
    let c = base.as_strided(&[n, n], &[2, 2 * n], 0).unwrap();
    // A transposed view as input.
    let at = t(&av, &[n, n]).as_strided(&[n, n], &[1, n], 0).unwrap();
    rivet_tests::call(
        &f,
        &[
            Value::Tensor(at.clone()),
            Value::Tensor(t(&bv, &[n, n])),
            Value::Tensor(c.clone()),
        ],
    )
    .unwrap();
    let a_logical = at.to_vec::<f32>().unwrap();
    assert_eq!(
        c.to_vec::<f32>().unwrap(),
        naive_mm(&a_logical, &bv, 9, 9, 9),
        "{target}"
    );
    let all = base.to_vec::<f32>().unwrap();
    for (idx, v) in all.iter().enumerate() {
        if idx % 2 == 1 {
            assert_eq!(*v, 7.5, "{target}: gap element {idx} was written");
        }
    }
}

#[test]
fn bad_calls_have_runtime_errors() {
    let f = seed_gemm("interp", false);
    let z = |s: &[i64], d: DType| Value::Tensor(Tensor::zeros(s, d).unwrap());
    let e = f
        .call(&[z(&[3, 3], DType::F32), z(&[4, 4], DType::F32)])
        .unwrap_err();
    assert!(
        matches!(e, RtError::Shape(_)) && e.to_string().contains("dim 'n' is 3"),
        "{e}"
    );
    let e = f
        .call(&[z(&[3, 3], DType::F64), z(&[3, 3], DType::F32)])
        .unwrap_err();
    assert!(matches!(e, RtError::DType(_)), "{e}");
    let e = f.call(&[z(&[3, 3], DType::F32)]).unwrap_err();
    assert!(matches!(e, RtError::Argument(_)), "{e}");
    let a = Tensor::zeros(&[3, 3], DType::F32).unwrap();
    let e = f
        .call(&[
            Value::Tensor(a.clone()),
            z(&[3, 3], DType::F32),
            Value::Tensor(a),
        ])
        .unwrap_err();
    assert!(matches!(e, RtError::Layout(_)), "{e}");
}

#[test]
fn symbolic_out_of_bounds_is_checked_per_call() {
    // C[i] = A[i + 1], A of size m, C of size n: in bounds iff n + 1 <= m, known per call.
    let (m, n) = (te::var("m"), te::var("n"));
    let a = placeholder([m], DType::F32, "A").unwrap();
    let c = compute([&n], |[i]| a.at([i + 1]), "C").unwrap();
    let s = Schedule::new(&[c.clone()]).unwrap();
    let module = build(&s, &[a.clone(), c.clone()], "interp", "shift").unwrap();
    assert!(module.get_source("ir").unwrap().contains("check"));
    let f = module.get_function("shift").unwrap();
    let z = |k: i64| Value::Tensor(Tensor::zeros(&[k], DType::F32).unwrap());
    let e = f.call(&[z(4), z(4)]).unwrap_err();
    assert!(
        matches!(e, RtError::Shape(_))
            && e.to_string().contains("tensor 'A'")
            && e.to_string().contains("n=4"),
        "{e}"
    );
    let a5 = Tensor::from_slice(&[1f32, 2., 3., 4., 5.], &[5]).unwrap();
    let c4 = Tensor::zeros(&[4], DType::F32).unwrap();
    f.call(&[Value::Tensor(a5), Value::Tensor(c4.clone())])
        .unwrap();
    assert_eq!(c4.to_vec::<f32>().unwrap(), vec![2., 3., 4., 5.]);
    // Same sizes on both sides: out of bounds for every non-empty n, refuted at build time.
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let c = compute([&n], |[i]| a.at([i + 1]), "C").unwrap();
    let s = Schedule::new(&[c.clone()]).unwrap();
    assert!(build(&s, &[a, c], "interp", "shift2").is_err());
    // Static version: a build error naming tensor, index and extent.
    let a = placeholder([10], DType::F32, "A").unwrap();
    let c = compute([10], |[i]| a.at([i + 1]), "C").unwrap();
    let s = Schedule::new(&[c.clone()]).unwrap();
    let e = build(&s, &[a, c], "interp", "f").err().unwrap().to_string();
    assert!(
        e.contains("tensor 'A' dim 0") && e.contains("[0, 10)") && e.contains("out of bounds"),
        "{e}"
    );
}

fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

fn kernel_library_matches_references(target: &Target) {
    let (m, k, n) = (5usize, 7usize, 3usize);
    let (av, bv) = (data(m * k, 5), data(k * n, 6));
    let mm = kernels::matmul(DType::F32, target).unwrap();
    assert_eq!(
        call1(&mm, vec![t(&av, &[5, 7]), t(&bv, &[7, 3])]),
        naive_mm(&av, &bv, m, k, n)
    );
    let bmm = kernels::batch_matmul(DType::F32, target).unwrap();
    let (a2, b2) = (data(2 * m * k, 7), data(2 * k * n, 8));
    let mut want = naive_mm(&a2[..m * k], &b2[..k * n], m, k, n);
    want.extend(naive_mm(&a2[m * k..], &b2[k * n..], m, k, n));
    assert_eq!(
        call1(&bmm, vec![t(&a2, &[2, 5, 7]), t(&b2, &[2, 7, 3])]),
        want
    );
    // add with broadcasting: (n, 1) + (1, m)
    let nm = |s: &str| DimSpec::Name(s.into());
    let add = kernels::add(
        DType::F32,
        &[nm("n"), DimSpec::Size(1)],
        &[DimSpec::Size(1), nm("m")],
        target,
    )
    .unwrap();
    let (x, y) = (data(4, 9), data(3, 10));
    let got = call1(&add, vec![t(&x, &[4, 1]), t(&y, &[1, 3])]);
    let want: Vec<f32> = (0..12).map(|q| x[q / 3] + y[q % 3]).collect();
    assert_eq!(got, want);
    let relu = kernels::relu(DType::F32, 2, target).unwrap();
    let xv = data(12, 11);
    assert_eq!(
        call1(&relu, vec![t(&xv, &[3, 4])]),
        xv.iter().map(|v| v.max(0.0)).collect::<Vec<_>>()
    );
    let gelu = kernels::gelu(DType::F32, 1, target).unwrap();
    let want: Vec<f32> = xv
        .iter()
        .map(|&v| 0.5 * v * (1.0 + libm_erf(v / std::f32::consts::SQRT_2)))
        .collect();
    close(&call1(&gelu, vec![t(&xv, &[12])]), &want, 1e-6, "gelu");
    let sm = kernels::softmax(DType::F32, 2, -1, target).unwrap();
    let got = call1(&sm, vec![t(&xv, &[3, 4])]);
    for r in 0..3 {
        let row = &xv[r * 4..r * 4 + 4];
        let mx = row.iter().cloned().fold(f32::MIN, f32::max);
        let s: f32 = row.iter().map(|v| (v - mx).exp()).sum();
        let want: Vec<f32> = row.iter().map(|v| (v - mx).exp() / s).collect();
        close(&got[r * 4..r * 4 + 4], &want, 1e-6, "softmax");
    }
    let ln = kernels::layer_norm(DType::F32, 2, 1e-5, target).unwrap();
    let (g, b) = (data(4, 12), data(4, 13));
    let got = call1(&ln, vec![t(&xv, &[3, 4]), t(&g, &[4]), t(&b, &[4])]);
    for r in 0..3 {
        let row = &xv[r * 4..r * 4 + 4];
        let mean = row.iter().sum::<f32>() / 4.0;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 4.0;
        let want: Vec<f32> = (0..4)
            .map(|c| (row[c] - mean) / (var + 1e-5).sqrt() * g[c] + b[c])
            .collect();
        close(&got[r * 4..r * 4 + 4], &want, 1e-5, "layer_norm");
    }
    let rs = kernels::reduce_sum(DType::F32, 2, 0, target).unwrap();
    let want: Vec<f32> = (0..4)
        .map(|c| (0..3).map(|r| xv[r * 4 + c]).sum())
        .collect();
    assert_eq!(call1(&rs, vec![t(&xv, &[3, 4])]), want);
    let rm = kernels::reduce_max(DType::F32, 2, 1, target).unwrap();
    let want: Vec<f32> = (0..3)
        .map(|r| {
            xv[r * 4..r * 4 + 4]
                .iter()
                .cloned()
                .fold(f32::MIN, f32::max)
        })
        .collect();
    assert_eq!(call1(&rm, vec![t(&xv, &[3, 4])]), want);
    let tr = kernels::transpose(DType::F32, &[1, 0], target).unwrap();
    let want: Vec<f32> = (0..12).map(|q| xv[(q % 3) * 4 + q / 3]).collect();
    assert_eq!(call1(&tr, vec![t(&xv, &[3, 4])]), want);
}

fn libm_erf(x: f32) -> f32 {
    // Abramowitz-Stegun 7.1.26 is too coarse; integrate numerically in f64 instead.
    let n = 2000;
    let h = x as f64 / n as f64;
    let f = |t: f64| (-t * t).exp();
    let mut s = f(0.0) + f(x as f64);
    for i in 1..n {
        s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    (s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()) as f32
}

fn gemm_module() -> Module {
    let g = SeedGemm::new();
    let c = g.c.clone();
    let s = Schedule::new(&[c]).unwrap();
    build(&s, &g.args(), "cpu", "mm").unwrap()
}

#[test]
fn saved_modules_round_trip_and_refuse_bad_files() {
    let m = gemm_module();
    let bytes = m.to_bytes().unwrap();
    let back = Module::from_bytes(&bytes, "memory").unwrap();
    assert_eq!(back.get_source("ir").unwrap(), m.get_source("ir").unwrap());
    let f = back.get_function("mm").unwrap();
    let (av, bv) = (data(16, 1), data(16, 2));
    assert_eq!(
        call1(&f, vec![t(&av, &[4, 4]), t(&bv, &[4, 4])]),
        naive_mm(&av, &bv, 4, 4, 4)
    );
    // Files on disk.
    let dir = std::env::temp_dir().join(format!("rivet-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("mm.rivet");
    m.save(&p).unwrap();
    assert!(Module::load(&p).is_ok());
    let err = |b: &[u8]| {
        Module::from_bytes(b, "x")
            .err()
            .expect("must fail")
            .to_string()
    };
    assert!(err(&bytes[..bytes.len() / 2]).contains("truncated"));
    assert!(err(&bytes[..10]).contains("truncated"));
    assert!(err(b"PK\x03\x04 this is a zip file, not a module").contains("magic"));
    for pos in [30, bytes.len() / 2, bytes.len() - 3] {
        let mut flipped = bytes.clone();
        flipped[pos] ^= 0x10;
        assert!(err(&flipped).contains("checksum"), "flip at {pos}");
    }
    // A crafted file: valid checksum, but the IR's loop runs one past the end of C.
    let json = String::from_utf8(bytes[24..].to_vec()).unwrap();
    let mut v: serde_json_value::Value = serde_json_value::from_str(&json);
    let crafted = v.widen_first_loop();
    let mut evil = bytes[..24].to_vec();
    evil[12..20].copy_from_slice(&(crafted.len() as u64).to_le_bytes());
    evil[20..24].copy_from_slice(&crc(crafted.as_bytes()).to_le_bytes());
    evil.extend_from_slice(crafted.as_bytes());
    let e = err(&evil);
    assert!(
        e.contains("must lie in") || e.contains("out of bounds"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Minimal JSON surgery without a JSON dependency in this crate: widen the first loop
/// extent `"extent":X` to `X + 1` by wrapping it in an Add node.
mod serde_json_value {
    pub struct Value(String);
    pub fn from_str(s: &str) -> Value {
        Value(s.to_string())
    }
    impl Value {
        pub fn widen_first_loop(&mut self) -> String {
            let s = &self.0;
            let start = s.find("\"For\"").expect("a loop");
            let ext = start + s[start..].find("\"extent\":").expect("extent") + "\"extent\":".len();
            // The extent is a JSON object; find its end by brace matching.
            let bytes = s.as_bytes();
            let (mut depth, mut end) = (0i32, ext);
            for (i, &c) in bytes[ext..].iter().enumerate() {
                match c {
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            end = ext + i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let old = &s[ext..end];
            let one = r#"{"kind":{"Const":{"Int":1}},"dtype":"int64"}"#;
            let widened = format!(r#"{{"kind":{{"Binary":["Add",{old},{one}]}},"dtype":"int64"}}"#);
            format!("{}{}{}", &s[..ext], widened, &s[end..])
        }
    }
}

fn crc(b: &[u8]) -> u32 {
    // CRC-32 (IEEE), bitwise: the same checksum the module format uses.
    let mut c = 0xFFFF_FFFFu32;
    for &x in b {
        c ^= x as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A reduction used inside a larger expression (`A[i, j] / sum_k A[i, k]`), as users write
/// it: its own stage over the rows (computed once per row), on every backend, against a
/// float64 reference (backends may sum in another order: relative 1e-5).
fn a_reduction_inside_an_expression_every_backend(target: &Target) {
    let (m, n) = (te::var("m"), te::var("n"));
    let a = placeholder([&m, &n], DType::F32, "A").unwrap();
    let k = te::reduce_axis(0, &n, "k").unwrap();
    let c = compute(
        [&m, &n],
        |[i, j]| a.at([&i, &j]) / te::sum(a.at([&i, &te::ax(&k)]), &[k.clone()]),
        "N",
    )
    .unwrap();
    let s = Schedule::new(&[c.clone()]).unwrap();
    let md = build(&s, &[a, c], &target, "rownorm").unwrap();
    assert!(md.get_source("ir").unwrap().contains("N_sum0"));
    let f = md.get_function("rownorm").unwrap();
    for (rows, cols) in [(1usize, 1usize), (3, 17), (5, 97)] {
        let av: Vec<f32> = data(rows * cols, 7).iter().map(|x| x.abs() + 0.5).collect();
        let got = call1(&f, vec![t(&av, &[rows as i64, cols as i64])]);
        for r in 0..rows {
            let sum: f64 = av[r * cols..(r + 1) * cols].iter().map(|&x| x as f64).sum();
            for q in 0..cols {
                let want = av[r * cols + q] as f64 / sum;
                let g = got[r * cols + q] as f64;
                assert!(
                    (g - want).abs() <= 1e-5 * want.abs(),
                    "{target} {rows}x{cols} [{r}, {q}]: {g} vs {want}"
                );
            }
        }
    }
}

/// A split of the loop a stage is computed at, after the `compute_at`, leaves the stage
/// attached nowhere: refused at build, naming the loops it could go to (never a silent
/// program that does not compute it).
#[test]
fn a_split_after_compute_at_is_refused_naming_the_loops() {
    let n = te::var("n");
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let p = compute([&n], |[i]| a.at([i]) * 3.0, "P").unwrap();
    let c = compute([&n], |[i]| p.at([i]) + 1.0, "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let i = c.axis()[0].var.clone();
    s.compute_at(&p, &c, &i).unwrap();
    s.stage(&c)
        .unwrap()
        .split(&i, Some(Expr::int(4)), None)
        .unwrap();
    for target in ["interp", "cpu"] {
        let e = match build(&s, &[a.clone(), c.clone()], target, "f") {
            Ok(_) => panic!("{target}: a stage attached to a split loop was built"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains(
                "schedule of 'P': it is computed at loop 'i' of 'C', which 'C' no longer has"
            ) && e.contains("i.outer, i.inner"),
            "{target}: {e}"
        );
    }
}

fn compute_at_and_padding_every_backend(target: &Target) {
    // P computed inside loop i of C, over the rows C's iteration needs (a 3-row stencil).
    let n = te::var("n");
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let p = compute([&n], |[i]| a.at([i]) * 3.0 + 1.0, "P").unwrap();
    let c = compute(
        [&n],
        |[i]| {
            let last = &n - 1;
            let left = te::if_then_else(te::gt(&i, 0), p.at([&i - 1]), 0.0);
            let right = te::if_then_else(te::lt(&i, last), p.at([&i + 1]), 0.0);
            left + p.at([i]) + right
        },
        "C",
    )
    .unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let i = c.axis()[0].var.clone();
    s.compute_at(&p, &c, &i).unwrap();
    let m = build(&s, &[a, c], &target, "stencil").unwrap();
    // The bounds proof sees through compute_at on the host loop. On CUDA the default GPU
    // schedule computes P at root and inlines it into C's kernel; under its split
    // (i = 256 i.outer + i.inner, guarded) the proof keeps two per-call checks on A's index.
    assert!(
        target.kind_name() == "cuda" || !m.get_source("ir").unwrap().contains("check"),
        "{}",
        m.get_source("ir").unwrap()
    );
    let f = m.get_function("stencil").unwrap();
    for len in [1usize, 2, 9] {
        let av = data(len, 21);
        let pv: Vec<f32> = av.iter().map(|x| x * 3.0 + 1.0).collect();
        let want: Vec<f32> = (0..len)
            .map(|q| {
                (if q > 0 { pv[q - 1] } else { 0.0 })
                    + pv[q]
                    + (if q + 1 < len { pv[q + 1] } else { 0.0 })
            })
            .collect();
        assert_eq!(
            call1(&f, vec![t(&av, &[len as i64])]),
            want,
            "{target} len={len}"
        );
    }
}

/// `Options::fma`: the GEMM's `C + A * B` becomes `fma(A, B, C)` in the IR; every backend
/// computes it with one rounding (`mul_add` per step, in k order), the interpreter included,
/// and a saved module keeps the contraction.
#[test]
fn fma_option_contracts_the_gemm_and_survives_save_and_load() {
    let SeedGemm { a, b, c, k } = SeedGemm::new();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
    let st = s.stage(&c).unwrap();
    let (io, ii) = st.split(&i, Some(Expr::int(8)), None).unwrap();
    st.reorder(&[io.clone(), k.var.clone(), ii, j]).unwrap();
    st.parallel(&io).unwrap();
    let n = 37usize;
    // Values with many significant bits, so one and two roundings differ.
    let v = |seed: u32| -> Vec<f32> {
        (0..n * n)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) as f32) / 4.0e9 - 0.5)
            .collect()
    };
    let (av, bv) = (v(1), v(2));
    let mut want = vec![0f32; n * n];
    for r in 0..n {
        for col in 0..n {
            let mut acc = 0f32;
            for q in 0..n {
                acc = av[r * n + q].mul_add(bv[q * n + col], acc);
            }
            want[r * n + col] = acc;
        }
    }
    assert_ne!(
        want,
        naive_mm(&av, &bv, n, n, n),
        "the data should tell fused from unfused"
    );
    let dir = std::env::temp_dir().join(format!("rivet-fma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for target in backends() {
        let opts = rivet_compiler::build::Options {
            fma: true,
            ..Default::default()
        };
        let m = rivet_compiler::build::build_with(
            &s,
            &[a.clone(), b.clone(), c.clone()],
            &target,
            "mm",
            opts,
        )
        .unwrap();
        assert!(m.get_source("ir").unwrap().contains("fma("), "{target}");
        let args = || vec![t(&av, &[n as i64, n as i64]), t(&bv, &[n as i64, n as i64])];
        assert_eq!(
            call1(&m.get_function("mm").unwrap(), args()),
            want,
            "{target}"
        );
        let path = dir.join(format!("mm-{target}.rivet"));
        m.save(&path).unwrap();
        let loaded = Module::load(&path).unwrap();
        assert!(
            loaded.get_source("ir").unwrap().contains("fma("),
            "{target}"
        );
        assert_eq!(
            call1(&loaded.get_function("mm").unwrap(), args()),
            want,
            "{target} loaded"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Parallelism by work: a 48x48 GEMM (6,912 argument elements, 110,592 multiply-adds, both
/// sides of `PARALLEL_GRAIN`) runs its parallel loop on the pool; called from inside the pool (a parallel region in
/// another) it runs inline instead of oversubscribing. Results equal the naive loop (exact
/// data) and the interpreter's in every case.
fn parallel_gemm_by_work_and_nested_in_the_pool(target: &Target) {
    let n = 48usize;
    assert!(3 * n * n < rivet_runtime::parallel::PARALLEL_GRAIN as usize);
    assert!(n * n * n >= rivet_runtime::parallel::PARALLEL_GRAIN as usize);
    let (av, bv) = (data(n * n, 5), data(n * n, 6));
    let want = naive_mm(&av, &bv, n, n, n);
    let args = || vec![t(&av, &[n as i64, n as i64]), t(&bv, &[n as i64, n as i64])];
    let f = seed_gemm(&target, true);
    assert_eq!(call1(&f, args()), want, "{target}");
    let pool = rivet_runtime::parallel::pool();
    assert_eq!(
        pool.install(|| call1(&f, args())),
        want,
        "{target} in the pool"
    );
    let got = std::sync::Mutex::new(Vec::new());
    pool.scope(|s| {
        for _ in 0..4 {
            s.spawn(|_| {
                let r = call1(&f, args());
                got.lock().unwrap().push(r);
            });
        }
    });
    for r in got.into_inner().unwrap() {
        assert_eq!(r, want, "{target} concurrent, in the pool");
    }
}

/// Reductions accumulated in a one-element local (`<stage>.acc`, held in a register by the
/// CPU backend) round exactly like the init-then-update form they replace: float16 and
/// bfloat16 sums round to their dtype after every step, on every backend, bit for bit. With
/// the reduction loop outside a data loop the init-then-update form stays, with the same bits.
#[test]
fn register_accumulated_reductions_round_like_the_tensor() {
    use half::{bf16, f16};
    let (m, kk) = (5usize, 300usize);
    for dt in [DType::F16, DType::BF16, DType::F32] {
        let a = placeholder([m as i64, kk as i64], dt, "A").unwrap();
        let k = te::reduce_axis(0, kk as i64, "k").unwrap();
        let c = compute(
            [m as i64, 3],
            |[i, _]| te::sum(a.at((&i, &k)) * a.at((i, &k)), &k),
            "C",
        )
        .unwrap();
        let xs: Vec<f32> = (0..m * kk)
            .map(|x| ((x as u32).wrapping_mul(2654435761) >> 8) as f32 / 16777216.0 * 3.0)
            .collect();
        // The reference: the element rounded to its dtype after every step.
        let round = |x: f32| -> f32 {
            match dt {
                DType::F16 => f16::from_f32(x).to_f32(),
                DType::BF16 => bf16::from_f32(x).to_f32(),
                _ => x,
            }
        };
        let xs: Vec<f32> = xs.into_iter().map(round).collect();
        let mut want = vec![0f32; m * 3];
        for r in 0..m {
            let mut acc = 0f32;
            for q in 0..kk {
                let x = xs[r * kk + q];
                acc = round(acc + x * x);
            }
            for j in 0..3 {
                want[r * 3 + j] = acc;
            }
        }
        let input = match dt {
            DType::F16 => Tensor::from_slice(
                &xs.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(),
                &[m as i64, kk as i64],
            ),
            DType::BF16 => Tensor::from_slice(
                &xs.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>(),
                &[m as i64, kk as i64],
            ),
            _ => Tensor::from_slice(&xs, &[m as i64, kk as i64]),
        }
        .unwrap();
        let read = |t: &Tensor| -> Vec<f32> {
            match dt {
                DType::F16 => t
                    .to_vec::<f16>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_f32())
                    .collect(),
                DType::BF16 => t
                    .to_vec::<bf16>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_f32())
                    .collect(),
                _ => t.to_vec::<f32>().unwrap(),
            }
        };
        for reduction_outside in [false, true] {
            let mut s = Schedule::new(&[c.clone()]).unwrap();
            if reduction_outside {
                let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
                s.stage(&c)
                    .unwrap()
                    .reorder(&[i, k.var.clone(), j])
                    .unwrap();
            }
            for target in backends() {
                // As written: the default CPU schedule would sum in lane partials (another
                // order); this test is about the register accumulation of the plain nest.
                let opts = rivet_compiler::build::Options {
                    as_written: true,
                    ..rivet_compiler::build::Options::from_env()
                };
                let m_ = rivet_compiler::build::build_with(
                    &s,
                    &[a.clone(), c.clone()],
                    &target,
                    "sq",
                    opts,
                )
                .unwrap();
                let ir = m_.get_source("ir").unwrap();
                assert_eq!(ir.contains("C.acc"), !reduction_outside, "{ir}");
                let out = m_
                    .get_function("sq")
                    .unwrap()
                    .call(&[Value::Tensor(input.clone())])
                    .unwrap();
                let got = read(out.as_tensor().unwrap());
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(
                    same,
                    "{dt} {target} outside={reduction_outside}: {got:?} vs {want:?}"
                );
            }
        }
    }
}

rivet_tests::for_each_backend! {
    seed_gemm_symbolic_every_size_every_backend,
    outputs_written_in_place_through_strides,
    kernel_library_matches_references,
    compute_at_and_padding_every_backend,
    a_reduction_inside_an_expression_every_backend;
    host_code: parallel_gemm_by_work_and_nested_in_the_pool;
}
