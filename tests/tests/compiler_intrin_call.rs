//! The intrinsic-call statement (`Stmt::Call` of `gemm_update`) on crafted IR, as a saved
//! module would hand it over (`build::compile_loaded`, the loader's path): run on the
//! interpreter (the reference: fused multiply-adds in order) and on the CPU backend (the
//! micro-kernel of the selected variant) they agree bit for bit, also through strided and
//! transposed views; a region past its tensor is refused by the bounds proof, a malformed
//! call by the verifier; every micro-kernel variant the CPU has is forced in turn
//! (`RIVET_MICROKERNEL`, one child process each).

use rivet_compiler::build::compile_loaded;
use rivet_compiler::call::make_function;
use rivet_compiler::ir::{
    BufId, BufKind, Buffer, Expr, Intrin, PrimFunc, Region, RegionAxis, Scope, Stmt, Var,
};
use rivet_compiler::Target;
use rivet_runtime::{DType, Tensor, Value};
use std::sync::Arc;

fn buf(id: u32, name: &str, shape: &[i64], output: bool) -> Buffer {
    Buffer {
        id: BufId(id),
        name: name.into(),
        dtype: DType::F32,
        shape: shape.iter().map(|&d| Expr::int(d)).collect(),
        strides: (0..shape.len())
            .map(|k| Var::new(&format!("{name}.s{k}")))
            .collect(),
        kind: BufKind::Param { output },
        scope: Scope::Global,
        overwritten: false,
    }
}

fn region(id: u32, base: &[i64], axes: &[(u32, i64)], write: bool) -> Region {
    Region {
        buf: BufId(id),
        base: base.iter().map(|&d| Expr::int(d)).collect(),
        axes: axes
            .iter()
            .map(|&(dim, e)| RegionAxis {
                dim,
                extent: Expr::int(e),
            })
            .collect(),
        write,
    }
}

/// `C[c0.., ..] (shape cs) += A (k x m) * B (k x n)` as one call; C's region at `c_base`.
fn gemm_func(m: i64, n: i64, k: i64, cs: [i64; 2], c_base: [i64; 2]) -> PrimFunc {
    let bufs = vec![
        buf(0, "A", &[k, m], false),
        buf(1, "B", &[k, n], false),
        buf(2, "C", &cs, true),
    ];
    let call = Stmt::Call {
        intrin: Intrin::GemmUpdate,
        regions: vec![
            region(2, &c_base, &[(0, m), (1, n)], true),
            region(0, &[0, 0], &[(0, k), (1, m)], false),
            region(1, &[0, 0], &[(0, k), (1, n)], false),
        ],
        scalars: vec![],
    };
    PrimFunc {
        name: "tile".into(),
        params: vec![BufId(0), BufId(1), BufId(2)],
        buffers: bufs,
        dims: vec![],
        checks: vec![],
        body: call,
        kernels: vec![],
        callbacks: vec![],
    }
}

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

/// Runs `f` on `target` with A (k x m), B (k x n) and C given as (memory, shape, strides,
/// offset) views; returns C's memory.
fn run(
    f: &PrimFunc,
    target: &Target,
    a: &Tensor,
    b: &Tensor,
    c: (&[f32], &[i64], &[i64], i64),
) -> Vec<f32> {
    let compiled = compile_loaded(f.clone(), target).unwrap_or_else(|e| panic!("{target}: {e}"));
    let func = make_function(Arc::new(compiled));
    let mem = Tensor::from_slice(c.0, &[c.0.len() as i64]).unwrap();
    let view = mem.as_strided(c.1, c.2, c.3).unwrap();
    func.call(&[
        Value::Tensor(a.clone()),
        Value::Tensor(b.clone()),
        Value::Tensor(view),
    ])
    .unwrap_or_else(|e| panic!("{target}: {e}"));
    mem.to_vec::<f32>().unwrap()
}

fn reference(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    (m, n, k): (usize, usize, usize),
    at: &dyn Fn(usize, usize) -> usize,
) {
    for i in 0..m {
        for j in 0..n {
            let mut acc = c[at(i, j)];
            for p in 0..k {
                acc = a[p * m + i].mul_add(b[p * n + j], acc);
            }
            c[at(i, j)] = acc;
        }
    }
}

/// The cases every variant runs: tiles that the kernels cover exactly and ones they do not,
/// k = 1, 3, 17, 97, C compact, offset, and transposed.
fn check_all_cases() {
    for (m, n) in [(12, 32), (24, 64), (6, 16), (5, 7), (1, 1)] {
        for k in [1i64, 3, 17, 97] {
            let av = data((k * m) as usize, 1 + k as u64);
            let bv = data((k * n) as usize, 2 + m as u64);
            let a = Tensor::from_slice(&av, &[k, m]).unwrap();
            let b = Tensor::from_slice(&bv, &[k, n]).unwrap();
            let (mu, nu, ku) = (m as usize, n as usize, k as usize);
            // C compact at the region base (1, 2) of an (m+3) x (n+5) tensor.
            let cs = [m + 3, n + 5];
            let f = gemm_func(m, n, k, cs, [1, 2]);
            let mem = data((cs[0] * cs[1]) as usize, 7);
            let mut want = mem.clone();
            let row = cs[1] as usize;
            reference(&av, &bv, &mut want, (mu, nu, ku), &|i, j| {
                (i + 1) * row + j + 2
            });
            for target in rivet_tests::backends() {
                let got = run(&f, &target, &a, &b, (&mem, &cs, &[cs[1], 1], 0));
                assert_eq!(got, want, "{target} m={m} n={n} k={k} compact");
            }
            // C a transposed view (column-major), starting at element 3 of its memory.
            let f = gemm_func(m, n, k, [m, n], [0, 0]);
            let mem = data((3 + m * n) as usize, 9);
            let mut want = mem.clone();
            reference(&av, &bv, &mut want, (mu, nu, ku), &|i, j| 3 + j * mu + i);
            for target in rivet_tests::backends() {
                let got = run(&f, &target, &a, &b, (&mem, &[m, n], &[1, m], 3));
                assert_eq!(got, want, "{target} m={m} n={n} k={k} transposed");
            }
        }
    }
}

#[test]
fn gemm_call_interp_and_cpu_agree_bit_for_bit() {
    check_all_cases();
}

/// Child process body: runs the cases under the variant the parent forced, or checks that a
/// forced variant is refused with a CompileError.
#[test]
fn forced_variant_child() {
    let Ok(v) = std::env::var("RIVET_MICROKERNEL") else {
        return; // only meaningful in a child
    };
    if std::env::var("RIVET_TEST_EXPECT_REFUSAL").is_ok() {
        let f = gemm_func(12, 32, 3, [12, 32], [0, 0]);
        let Err(e) = compile_loaded(f, &Target::cpu()) else {
            panic!("RIVET_MICROKERNEL={v} was accepted");
        };
        let msg = e.to_string();
        assert!(msg.contains("RIVET_MICROKERNEL"), "{msg}");
        println!("REFUSED: {msg}");
        return;
    }
    check_all_cases();
    println!("VARIANT-OK {v}");
}

fn child(variant: &str, refusal: bool) -> (bool, String) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "forced_variant_child",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("RIVET_MICROKERNEL", variant);
    if refusal {
        cmd.env("RIVET_TEST_EXPECT_REFUSAL", "1");
    }
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn every_supported_variant_forced_in_turn() {
    use rivet_compiler::codegen::cpu_lib::microkernel::Variant;
    for v in Variant::ALL {
        if v.supported() {
            let (ok, text) = child(v.name(), false);
            assert!(
                ok && text.contains(&format!("VARIANT-OK {}", v.name())),
                "{text}"
            );
        } else {
            let (ok, text) = child(v.name(), true);
            assert!(ok && text.contains("REFUSED"), "{text}");
        }
    }
    let (ok, text) = child("sse9", true);
    assert!(ok && text.contains("not a micro-kernel variant"), "{text}");
}

#[test]
fn a_region_past_its_tensor_is_refused_by_the_bounds_proof() {
    // C is 12 x 32; the region starts at row 1: its last row is 12.
    let f = gemm_func(12, 32, 4, [12, 32], [1, 0]);
    for target in rivet_tests::backends() {
        let e = compile_loaded(f.clone(), &target)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("tensor 'C' dim 0") && e.contains("out of bounds"),
            "{target}: {e}"
        );
    }
    // A's panel shorter than k: A is 3 x 12 but the call walks 4 rows of it.
    let mut f = gemm_func(12, 32, 4, [12, 32], [0, 0]);
    f.buffers[0].shape[0] = Expr::int(3);
    let e = compile_loaded(f, &Target::cpu())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("tensor 'A' dim 0"), "{e}");
}

#[test]
fn a_malformed_call_is_refused_by_the_verifier() {
    let base = gemm_func(12, 32, 4, [12, 32], [0, 0]);
    let with = |f: &dyn Fn(&mut Vec<Region>)| {
        let mut g = base.clone();
        if let Stmt::Call { regions, .. } = &mut g.body {
            f(regions);
        }
        compile_loaded(g, &Target::cpu())
            .err()
            .expect("refused")
            .to_string()
    };
    // Extents that disagree between C and A.
    let e = with(&|r| r[1].axes[1].extent = Expr::int(11));
    assert!(e.contains("extent m differs"), "{e}");
    // C read-only, A written.
    let e = with(&|r| {
        r[0].write = false;
        r[1].write = true
    });
    assert!(
        e.contains("writes input parameter") || e.contains("C is written"),
        "{e}"
    );
    // One region too few.
    let e = with(&|r| {
        r.pop();
    });
    assert!(e.contains("takes 3 regions"), "{e}");
    // A dim past the rank, a repeated dim.
    let e = with(&|r| r[2].axes[1].dim = 2);
    assert!(
        e.contains("dims must be distinct and below the rank"),
        "{e}"
    );
    let e = with(&|r| r[2].axes[1].dim = 0);
    assert!(e.contains("dims must be distinct"), "{e}");
    // C aliasing A.
    let e = with(&|r| r[0].buf = BufId(0));
    assert!(
        e.contains("C must be another buffer") || e.contains("input parameter"),
        "{e}"
    );
}

#[test]
fn a_call_survives_the_module_file_and_cuda_refuses_it() {
    let f = gemm_func(12, 32, 5, [12, 32], [0, 0]);
    let m = rivet_compiler::Module {
        funcs: vec![Arc::new(compile_loaded(f.clone(), &Target::cpu()).unwrap())],
    };
    let bytes = m.to_bytes().unwrap();
    let back = rivet_compiler::Module::from_bytes(&bytes, "test").unwrap();
    assert_eq!(back.funcs[0].nest, m.funcs[0].nest);
    let text = back.get_source("ir").unwrap_or_default();
    let _ = text;
    if let Ok(t) = Target::parse("cuda -arch=sm_90") {
        let e = compile_loaded(f, &t).err().expect("refused").to_string();
        // (Checked mode is refused by the CUDA backend before it looks at the body.)
        assert!(e.contains("CPU-only") || e.contains("checked mode"), "{e}");
    }
}

/// A module file whose call was edited to reach past C (CRC recomputed, so only the proof
/// stands between it and memory outside the tensor): refused at load, naming the tensor.
#[test]
fn a_saved_call_edited_past_its_tensor_is_refused_at_load() {
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
    let f = gemm_func(12, 32, 5, [12, 32], [0, 0]);
    let m = rivet_compiler::Module {
        funcs: vec![Arc::new(compile_loaded(f, &Target::cpu()).unwrap())],
    };
    let bytes = m.to_bytes().unwrap();
    let json = String::from_utf8(bytes[HEADER..].to_vec()).unwrap();
    let at = json.find("\"regions\"").expect("a call in the file");
    let first = at + json[at..].find("\"Int\":0").expect("C's base");
    let edited = format!("{}\"Int\":1{}", &json[..first], &json[first + 7..]);
    let mut out = bytes[..HEADER].to_vec();
    out[12..20].copy_from_slice(&(edited.len() as u64).to_le_bytes());
    out[20..24].copy_from_slice(&crc32(edited.as_bytes()).to_le_bytes());
    out.extend_from_slice(edited.as_bytes());
    let e = match rivet_compiler::Module::from_bytes(&out, "edited") {
        Ok(_) => panic!("an out-of-bounds call was loaded"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("tensor 'C' dim 0") && e.contains("out of bounds"),
        "{e}"
    );
    // The unedited file loads and runs.
    assert!(rivet_compiler::Module::from_bytes(&bytes, "orig").is_ok());
}
