//! Hostile module files: valid-CRC mutations of real saved modules. Each mutation family ends
//! in a `CompileError` naming the file ("cannot load rivet module <origin>: ...") or in a
//! module that computes the right result, and never damages an input (inputs are snapshotted
//! before and compared after every call).
//!
//! Families: a parameter's output flag flipped (a kernel that would write its input), stores
//! retargeted to an input, a reduction loop marked `Parallel`, an outer loop marked
//! `Vectorized`, extents changed (larger, negative, smaller), expressions nested past and
//! within the IR limits, oversized files, and a file of many sequential loop nests (memory
//! linear in the file size).
//!
//! The payload is edited as text (this crate has no JSON library): every edit targets a
//! token the serialiser writes in one known form, and the header's length and CRC-32 are
//! recomputed, so only the verifier and the passes stand between the edit and the kernel.

use rivet_compiler::ir::Expr;
use rivet_compiler::te::{self, compute, placeholder};
use rivet_compiler::{build, Module, Schedule};
use rivet_runtime::{DType, Tensor, Value};

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

/// The payload of a module file, as text.
fn payload(bytes: &[u8]) -> String {
    String::from_utf8(bytes[HEADER..].to_vec()).unwrap()
}

/// A module file around `json`: the original header with length and CRC recomputed.
fn with_payload(orig: &[u8], json: &str) -> Vec<u8> {
    let mut out = orig[..HEADER].to_vec();
    out[12..20].copy_from_slice(&(json.len() as u64).to_le_bytes());
    out[20..24].copy_from_slice(&crc32(json.as_bytes()).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    out
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 7) % 9) as f32 - 4.0)
        .collect()
}

/// `C[i, j] = sum_k A[i, k] * B[k, j]`, static 8x8, the i loop parallel.
fn gemm_module(n: i64) -> Module {
    let a = placeholder([n, n], DType::F32, "A").unwrap();
    let b = placeholder([n, n], DType::F32, "B").unwrap();
    let k = te::reduce_axis(0, n, "k").unwrap();
    let c = compute(
        [n, n],
        |[i, j]| te::sum(a.at((i, &k)) * b.at((&k, j)), &k),
        "C",
    )
    .unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let i = c.axis()[0].var.clone();
    s.stage(&c).unwrap().parallel(&i).unwrap();
    build(&s, &[a, b, c], "cpu", "mm").unwrap()
}

fn naive_mm(a: &[f32], b: &[f32], n: usize) -> Vec<f32> {
    let mut c = vec![0f32; n * n];
    for i in 0..n {
        for j in 0..n {
            c[i * n + j] = (0..n).map(|r| a[i * n + r] * b[r * n + j]).sum();
        }
    }
    c
}

/// Loads `bytes`; when it loads, runs `mm` on fresh inputs and checks the inputs are intact
/// and the result right. Returns the load error's message, if any.
fn load_and_run(bytes: &[u8], origin: &str, n: usize) -> Option<String> {
    load_and_run_checked(bytes, origin, n, true)
}

/// As `load_and_run`; `exact`: the mutation keeps the program's meaning (otherwise the
/// result may differ, but the inputs must still be intact).
fn load_and_run_checked(bytes: &[u8], origin: &str, n: usize, exact: bool) -> Option<String> {
    let m = match Module::from_bytes(bytes, origin) {
        Ok(m) => m,
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("cannot load rivet module {origin}: ")),
                "{msg}"
            );
            assert!(
                !msg.contains("internal compiler error"),
                "a bad file is reported as a rivet bug: {msg}"
            );
            assert!(
                matches!(
                    rivet_runtime::Error::from(e),
                    rivet_runtime::Error::Compile(_)
                ),
                "not a CompileError"
            );
            return Some(msg);
        }
    };
    let (av, bv) = (data(n * n, 1), data(n * n, 2));
    let (ta, tb) = (
        Tensor::from_slice(&av, &[n as i64, n as i64]).unwrap(),
        Tensor::from_slice(&bv, &[n as i64, n as i64]).unwrap(),
    );
    let f = m.get_function("mm").unwrap();
    let out = f.call(&[Value::Tensor(ta.clone()), Value::Tensor(tb.clone())]);
    assert_eq!(ta.to_vec::<f32>().unwrap(), av, "input A damaged");
    assert_eq!(tb.to_vec::<f32>().unwrap(), bv, "input B damaged");
    if let (Ok(v), true) = (out, exact) {
        let got = v.as_tensor().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(
            got,
            naive_mm(&av, &bv, n),
            "a loaded module computed a wrong result"
        );
    }
    None
}

/// Replaces the `nth` occurrence of `from` after byte `after`.
fn replace_nth(s: &str, after: usize, from: &str, to: &str, nth: usize) -> Option<String> {
    let pos = s[after..].match_indices(from).nth(nth)?.0 + after;
    Some(format!("{}{}{}", &s[..pos], to, &s[pos + from.len()..]))
}

/// The byte position of the `For` over the loop named `name`.
fn loop_pos(s: &str, name: &str) -> usize {
    let key = format!("\"name\":\"{name}\"}},\"min\"");
    s.find(&key)
        .unwrap_or_else(|| panic!("no loop `{name}` in {s}"))
}

#[test]
fn the_unmodified_module_loads_and_computes() {
    let bytes = gemm_module(8).to_bytes().unwrap();
    assert_eq!(load_and_run(&bytes, "mm.rivet", 8), None);
    // Recomputing the header of an unmodified payload changes nothing.
    let again = with_payload(&bytes, &payload(&bytes));
    assert_eq!(again, bytes);
}

#[test]
fn flipped_output_flags_are_refused_or_harmless() {
    let bytes = gemm_module(8).to_bytes().unwrap();
    let json = payload(&bytes);
    // C made an input: the kernel would write it.
    let j = replace_nth(
        &json,
        0,
        "{\"Param\":{\"output\":true}}",
        "{\"Param\":{\"output\":false}}",
        0,
    )
    .unwrap();
    let msg = load_and_run(&with_payload(&bytes, &j), "flip.rivet", 8).expect("must be refused");
    assert!(
        msg.contains("stores go only to outputs and locals"),
        "{msg}"
    );
    assert!(msg.contains("`C`"), "{msg}");
    // A or B made an output as well: the kernel never writes it; loading is harmless.
    for nth in 0..2 {
        let j = replace_nth(
            &json,
            0,
            "{\"Param\":{\"output\":false}}",
            "{\"Param\":{\"output\":true}}",
            nth,
        )
        .unwrap();
        let _ = load_and_run_checked(&with_payload(&bytes, &j), "flip2.rivet", 8, false);
    }
}

#[test]
fn stores_retargeted_to_an_input_are_refused() {
    let bytes = gemm_module(8).to_bytes().unwrap();
    let json = payload(&bytes);
    // Buffer ids: A = 0, B = 1, C = 2. The element's store goes to C (the reduction
    // accumulates in `C.acc`, buffer 3, whose one-index stores an input's rank refuses).
    let n = json.matches("{\"Store\":{\"buf\":2,").count();
    assert!(n >= 1, "{json}");
    for nth in 0..n {
        for target in [0, 1] {
            let j = replace_nth(
                &json,
                0,
                "{\"Store\":{\"buf\":2,",
                &format!("{{\"Store\":{{\"buf\":{target},"),
                nth,
            )
            .unwrap();
            let msg = load_and_run(&with_payload(&bytes, &j), "store.rivet", 8)
                .expect("a store to an input must be refused");
            assert!(
                msg.contains("stores go only to outputs and locals"),
                "{msg}"
            );
        }
    }
}

#[test]
fn loop_kinds_that_would_race_are_refused() {
    let bytes = gemm_module(8).to_bytes().unwrap();
    let json = payload(&bytes);
    // The reduction loop marked parallel: iterations accumulate into one element.
    let at = loop_pos(&json, "k");
    let j = replace_nth(&json, at, "\"kind\":\"Serial\"", "\"kind\":\"Parallel\"", 0).unwrap();
    let msg = load_and_run(&with_payload(&bytes, &j), "race.rivet", 8).expect("refused");
    assert!(
        msg.contains("parallel loop iterations must write disjoint elements"),
        "{msg}"
    );
    // The accumulator all k iterations update (`C.acc`, allocated outside the k loop).
    assert!(msg.contains("`k`") && msg.contains("`C.acc`"), "{msg}");
    // ... or vectorized.
    let j = replace_nth(
        &json,
        at,
        "\"kind\":\"Serial\"",
        "\"kind\":\"Vectorized\"",
        0,
    )
    .unwrap();
    let msg = load_and_run(&with_payload(&bytes, &j), "vec.rivet", 8).expect("refused");
    assert!(msg.contains("disjoint elements"), "{msg}");
    // An outer loop vectorized: not innermost.
    let at = loop_pos(&json, "i");
    let j = replace_nth(
        &json,
        at,
        "\"kind\":\"Parallel\"",
        "\"kind\":\"Vectorized\"",
        0,
    )
    .unwrap();
    let msg = load_and_run(&with_payload(&bytes, &j), "outer.rivet", 8).expect("refused");
    assert!(msg.contains("vectorized loop must be innermost"), "{msg}");
    // The data-parallel j loop marked parallel too: fine (disjoint), and correct.
    let at = loop_pos(&json, "j");
    let j = replace_nth(&json, at, "\"kind\":\"Serial\"", "\"kind\":\"Parallel\"", 0).unwrap();
    assert_eq!(load_and_run(&with_payload(&bytes, &j), "ok.rivet", 8), None);
}

#[test]
fn changed_extents_are_refused_or_harmless() {
    let bytes = gemm_module(8).to_bytes().unwrap();
    let json = payload(&bytes);
    let ext = "\"extent\":{\"kind\":{\"Const\":{\"Int\":8}},\"dtype\":\"int64\"}";
    let n = json.matches(ext).count();
    assert!(n >= 3, "{json}");
    for nth in 0..n {
        for (new, must_fail) in [
            (9, true),
            (1i64 << 40, true),
            (-5, true),
            (3, false),
            (0, false),
        ] {
            let j = replace_nth(
                &json,
                0,
                ext,
                &format!(
                    "\"extent\":{{\"kind\":{{\"Const\":{{\"Int\":{new}}}}},\"dtype\":\"int64\"}}"
                ),
                nth,
            )
            .unwrap();
            let r = load_and_run_checked(&with_payload(&bytes, &j), "ext.rivet", 8, false);
            if must_fail {
                assert!(r.is_some(), "extent {new} in loop {nth} was accepted");
            }
        }
    }
}

/// `mm` with the stored value of every store wrapped in `levels` float negations.
fn deep_value(json: &str, levels: usize, from: usize) -> String {
    let key = "\"value\":";
    let pos = json[from..].find(key).unwrap() + from + key.len();
    // The value is one JSON object: find its end by bracket matching.
    let b = json.as_bytes();
    let (mut d, mut end) = (0i32, pos);
    for (k, &c) in b[pos..].iter().enumerate() {
        match c {
            b'{' | b'[' => d += 1,
            b'}' | b']' => {
                d -= 1;
                if d == 0 {
                    end = pos + k + 1;
                    break;
                }
            }
            _ => {}
        }
    }
    // Built as prefix^levels + value + suffix^levels: linear (a format! per level is
    // quadratic, and took half a minute at 100,000 levels).
    let open = "{\"kind\":{\"Unary\":[\"Neg\",";
    let close = "]},\"dtype\":\"float32\"}";
    let mut out = String::with_capacity(json.len() + levels * (open.len() + close.len()));
    out.push_str(&json[..pos]);
    out.push_str(&open.repeat(levels));
    out.push_str(&json[pos..end]);
    out.push_str(&close.repeat(levels));
    out.push_str(&json[end..]);
    out
}

#[test]
fn deep_expressions_within_the_limits_load_and_past_them_are_refused() {
    let bytes = gemm_module(8).to_bytes().unwrap();
    let json = payload(&bytes);
    // The update store (the second one): an even number of negations keeps the result.
    let second = json.match_indices("{\"Store\":").nth(1).unwrap().0;
    let j = deep_value(&json, 2000, second);
    assert_eq!(
        load_and_run(&with_payload(&bytes, &j), "deep.rivet", 8),
        None
    );
    let j = deep_value(&json, 5000, second);
    let msg = load_and_run(&with_payload(&bytes, &j), "deeper.rivet", 8).expect("refused");
    assert!(msg.contains("MAX_IR_DEPTH"), "{msg}");
    // Far past every limit: refused by the nesting scan, before parsing.
    let j = deep_value(&json, 100_000, second);
    let msg = load_and_run(&with_payload(&bytes, &j), "deepest.rivet", 8).expect("refused");
    assert!(msg.contains("nested"), "{msg}");
    // Deeply nested statements.
    let wrapped = wrap_body(&json, 3000);
    let msg = load_and_run(&with_payload(&bytes, &wrapped), "stmts.rivet", 8).expect("refused");
    assert!(msg.contains("MAX_STMT_DEPTH"), "{msg}");
    let wrapped = wrap_body(&json, 100);
    assert_eq!(
        load_and_run(&with_payload(&bytes, &wrapped), "stmts-ok.rivet", 8),
        None
    );
}

/// The function body wrapped in `levels` one-element sequences.
fn wrap_body(json: &str, levels: usize) -> String {
    let key = "\"body\":";
    // The PrimFunc's own body is the `"body":` whose value ends right before `}]}` (the end
    // of the ir object, the function list and the payload).
    let tail = "}}]}";
    assert!(json.ends_with(tail), "{json}");
    let body_pos = json
        .match_indices(key)
        .map(|(p, _)| p + key.len())
        .find(|&p| {
            // The value starting at p must end exactly where the tail starts.
            let b = json.as_bytes();
            let mut d = 0i32;
            for (k, &c) in b[p..].iter().enumerate() {
                match c {
                    b'{' | b'[' => d += 1,
                    b'}' | b']' => {
                        d -= 1;
                        if d == 0 {
                            return p + k + 1 == json.len() - tail.len();
                        }
                    }
                    _ => {}
                }
            }
            false
        })
        .expect("the function body");
    let end = json.len() - tail.len();
    let mut body = json[body_pos..end].to_string();
    for _ in 0..levels {
        body = format!("{{\"Seq\":[{body}]}}");
    }
    format!("{}{}{}", &json[..body_pos], body, &json[end..])
}

#[test]
fn oversized_files_are_refused_before_reading() {
    let dir = std::env::temp_dir().join(format!("rivet-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("huge.rivet");
    let bytes = gemm_module(8).to_bytes().unwrap();
    std::fs::write(&p, &bytes).unwrap();
    // A sparse file of 1 TiB: reading it would take minutes and all memory.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let t0 = std::time::Instant::now();
    let msg = Module::load(&p).err().expect("refused").to_string();
    assert!(msg.contains("MAX_MODULE_BYTES"), "{msg}");
    assert!(msg.contains("huge.rivet"), "{msg}");
    assert!(t0.elapsed().as_secs() < 5);
    // In memory too, and a header that claims a huge payload.
    let mut h = bytes.clone();
    h[12..20].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(Module::from_bytes(&h, "h").is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A function of `n` sequential stages `T_k = T_{k-1} + 1`, each its own loop nest over its
/// own output parameter (no locals, so the nests sit side by side in one sequence).
pub fn chain_module(n: usize, len: i64) -> Module {
    let a = placeholder([len], DType::F32, "A").unwrap();
    let mut args = vec![a.clone()];
    let mut t = a;
    for k in 0..n {
        t = compute([len], |[i]| t.at([i]) + 1.0, &format!("T{k}")).unwrap();
        args.push(t.clone());
    }
    let s = Schedule::new(&[t]).unwrap();
    build(&s, &args, "cpu", "chain").unwrap()
}

fn peak_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Measures loading a module of many sequential loop nests (run alone, with
/// `--ignored --nocapture`: the peak RSS is the process's). `RIVET_CHAIN=n` sets the length.
#[test]
#[ignore]
fn measure_loading_sequential_nests() {
    let n: usize = std::env::var("RIVET_CHAIN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let m = chain_module(n, 16);
    let bytes = m.to_bytes().unwrap();
    drop(m);
    let before = peak_rss_kib();
    let t0 = std::time::Instant::now();
    let back = Module::from_bytes(&bytes, "chain").unwrap();
    println!(
        "stages {n}: file {} bytes, load {:.2}s, peak RSS {} MiB before, {} MiB after",
        bytes.len(),
        t0.elapsed().as_secs_f64(),
        before / 1024,
        peak_rss_kib() / 1024
    );
    drop(back);
}

/// Times each step of loading a chain of `RIVET_CHAIN` nests (run alone, `--ignored
/// --nocapture`), to find which step grows faster than the file.
#[test]
#[ignore]
fn profile_loading_sequential_nests() {
    use rivet_compiler::arith::simplify;
    use rivet_compiler::ir::verify::verify;
    use rivet_compiler::lower::{bounds, flatten};
    let n: usize = std::env::var("RIVET_CHAIN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let m = chain_module(n, 16);
    let mut f = m.funcs[0].nest.clone();
    let t = std::time::Instant::now();
    let lap = |what: &str, t: &mut std::time::Instant| {
        println!(
            "{what}: {:.3}s, peak RSS {} MiB",
            t.elapsed().as_secs_f64(),
            peak_rss_kib() / 1024
        );
        *t = std::time::Instant::now();
    };
    let mut t = t;
    verify(&f, false).unwrap();
    lap("verify", &mut t);
    bounds::prove(&mut f).unwrap();
    lap("bounds", &mut t);
    f.body = simplify::simplify_stmt(&f.body);
    lap("simplify", &mut t);
    flatten::flatten(&mut f);
    lap("flatten", &mut t);
    verify(&f, true).unwrap();
    lap("verify flat", &mut t);
    let k = rivet_compiler::codegen::backend(&rivet_compiler::Target::cpu(), false)
        .unwrap()
        .compile(&f)
        .unwrap();
    lap("cranelift", &mut t);
    drop(k);
}

/// `R[i] = sum_k A[i, k]` over a static [5, 300] `A`, a cross-thread reduction: the
/// reduction split by 64, the inner loop on threadIdx.x, rows on blockIdx.x; for `interp`.
fn rowsum_module() -> Module {
    let a = placeholder([5, 300], DType::F32, "A").unwrap();
    let k = te::reduce_axis(0, 300, "k").unwrap();
    let r = compute([5], |[i]| te::sum(a.at((i, &k)), &k), "R").unwrap();
    let mut s = Schedule::new(&[r.clone()]).unwrap();
    let st = s.stage(&r).unwrap();
    let i = r.axis()[0].var.clone();
    let (ko, ki) = st.split(&k.var, Some(Expr::int(64)), None).unwrap();
    st.reorder(&[i.clone(), ki.clone(), ko]).unwrap();
    st.bind(&i, rivet_compiler::ir::ThreadTag::BlockX).unwrap();
    st.bind(&ki, rivet_compiler::ir::ThreadTag::ThreadX)
        .unwrap();
    build(&s, &[a, r], "interp", "rowsum").unwrap()
}

/// Loads `bytes` and runs `rowsum`: `Ok(result)` or the load error's message (a CompileError
/// naming the file).
fn load_rowsum(bytes: &[u8]) -> std::result::Result<Vec<f32>, String> {
    let m = match Module::from_bytes(bytes, "rows.rivet") {
        Ok(m) => m,
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("cannot load rivet module rows.rivet: "),
                "{msg}"
            );
            assert!(!msg.contains("internal compiler error"), "{msg}");
            assert!(matches!(
                rivet_runtime::Error::from(e),
                rivet_runtime::Error::Compile(_)
            ));
            return Err(msg);
        }
    };
    let av = data(5 * 300, 3);
    let ta = Tensor::from_slice(&av, &[5, 300]).unwrap();
    let out = m.get_function("rowsum").unwrap().call(&[Value::Tensor(ta)]);
    Ok(out.unwrap().as_tensor().unwrap().to_vec::<f32>().unwrap())
}

#[test]
fn cross_thread_reductions_round_trip_and_hostile_edits_are_refused() {
    let bytes = rowsum_module().to_bytes().unwrap();
    let json = payload(&bytes);
    let av = data(5 * 300, 3);
    // Small integers: exact in any order.
    let want: Vec<f32> = av.chunks(300).map(|r| r.iter().sum()).collect();
    assert_eq!(load_rowsum(&bytes), Ok(want));
    let at = json
        .find("\"AllReduce\"")
        .expect("the saved nest holds the allreduce");
    let edits: [(&str, &str, &str); 4] = [
        (
            "\"tag\":\"ThreadX\"",
            "\"tag\":\"ThreadY\"",
            "runs over threadIdx.x",
        ),
        (
            "\"tag\":\"ThreadX\"",
            "\"tag\":\"BlockX\"",
            "runs over threadIdx.x",
        ),
        ("\"AllReduce\"", "\"AllReduc\"", "unknown variant"),
        ("\"op\":\"Sum\"", "\"op\":\"Mean\"", "unknown variant"),
    ];
    for (from, to, why) in edits {
        let edited = replace_nth(&json, at, from, to, 0).unwrap();
        let e = load_rowsum(&with_payload(&bytes, &edited))
            .expect_err(&format!("{from} -> {to} loaded"));
        assert!(e.contains(why), "{from} -> {to}: {e}");
    }
    // The destination retargeted to the output parameter (id 1), or to a missing buffer.
    let dst = json[at..].find("\"dst\":").unwrap() + at + "\"dst\":".len();
    let end = dst + json[dst..].find(|c: char| !c.is_ascii_digit()).unwrap();
    for (id, why) in [
        ("1", "one-element local-scope buffer"),
        ("77", "unknown buffer"),
    ] {
        let edited = format!("{}{id}{}", &json[..dst], &json[end..]);
        let e = load_rowsum(&with_payload(&bytes, &edited)).unwrap_err();
        assert!(e.contains(why), "dst {id}: {e}");
    }
    // The reduction's thread loop made serial: the allreduce is outside its tag's loop.
    let edited = json.replacen("{\"Thread\":\"ThreadX\"}", "\"Serial\"", 1);
    assert_ne!(edited, json);
    let e = load_rowsum(&with_payload(&bytes, &edited)).unwrap_err();
    assert!(
        e.contains("inside the loop bound to its thread index"),
        "{e}"
    );
    // The allreduce under a condition only some threads take.
    let close = json[at..].find("\"dst\":").unwrap() + at;
    let close = close + json[close..].find('}').unwrap() + 1;
    let stmt_start = json[..at].rfind('{').unwrap();
    let stmt = &json[stmt_start..=close];
    let cond = "{\"If\":{\"cond\":{\"dtype\":\"bool\",\"kind\":{\"Const\":{\"Int\":1}}},\"then\":";
    let edited = format!(
        "{}{cond}{stmt},\"otherwise\":null}}}}{}",
        &json[..stmt_start],
        &json[close + 1..]
    );
    let e = load_rowsum(&with_payload(&bytes, &edited)).unwrap_err();
    assert!(
        e.contains("every thread of a block reaches a cross-thread reduction"),
        "{e}"
    );
}

/// `chain(A) = ((A + 1) * 2) - 3` through two local stages, built for the CPU as written (so
/// the locals stay materialised); its file's payload.
fn locals_module() -> (Vec<u8>, String) {
    let a = placeholder([8], DType::F32, "A").unwrap();
    let t1 = compute([8], |[i]| a.at([i]) + 1.0, "T1").unwrap();
    let t2 = compute([8], |[i]| t1.at([i]) * 2.0, "T2").unwrap();
    let t3 = compute([8], |[i]| t2.at([i]) - 3.0, "T3").unwrap();
    let s = Schedule::new(&[t3.clone()]).unwrap();
    let opts = rivet_compiler::build::Options {
        as_written: true,
        ..Default::default()
    };
    let m = rivet_compiler::build::build_with(&s, &[a, t3], "cpu", "chain", opts).unwrap();
    let bytes = m.to_bytes().unwrap();
    let json = payload(&bytes);
    (bytes, json)
}

/// Loads `bytes` and runs `chain` on fresh data: `Ok` with the result checked, or the load
/// error's message (a `CompileError` naming the file).
fn load_locals(bytes: &[u8], origin: &str) -> std::result::Result<(), String> {
    let m = Module::from_bytes(bytes, origin).map_err(|e| {
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("cannot load rivet module {origin}: ")),
            "{msg}"
        );
        assert!(!msg.contains("internal compiler error"), "{msg}");
        assert!(matches!(
            rivet_runtime::Error::from(e),
            rivet_runtime::Error::Compile(_)
        ));
        msg
    })?;
    let av = data(8, 7);
    let a = Tensor::from_slice(&av, &[8]).unwrap();
    let out = m
        .get_function("chain")
        .unwrap()
        .call(&[Value::Tensor(a)])
        .unwrap();
    let got = out.as_tensor().unwrap().to_vec::<f32>().unwrap();
    let want: Vec<f32> = av.iter().map(|v| (v + 1.0) * 2.0 - 3.0).collect();
    assert_eq!(got, want);
    Ok(())
}

#[test]
fn allocations_load_in_both_spellings_and_bad_lists_are_refused() {
    let (bytes, json) = locals_module();
    let key = "{\"Allocate\":{\"bufs\":[";
    let at = json.find(key).expect("one allocation of the locals") + key.len();
    let end = at + json[at..].find(']').unwrap();
    let ids: Vec<&str> = json[at..end].split(',').collect();
    assert_eq!(ids.len(), 2, "{}", &json[at..end]);
    assert_eq!(load_locals(&bytes, "chain.rivet"), Ok(()));
    // Files written when an allocation held one buffer: `"buf": id`, nested.
    let old = format!(
        "{}{{\"Allocate\":{{\"buf\":{},\"body\":{{\"Allocate\":{{\"buf\":{},\"body\":{}}}}}}}}}{}",
        &json[..at - key.len()],
        ids[0],
        ids[1],
        // The body of the list allocation, up to its closing braces.
        &json[end + "],\"body\":".len()..json.len() - "}}}]}".len()],
        "}]}",
    );
    assert!(!old.contains("\"bufs\""), "{old}");
    assert_eq!(
        load_locals(&with_payload(&bytes, &old), "old.rivet"),
        Ok(())
    );
    // An empty list, a buffer twice, a parameter, an unknown id.
    for (list, why) in [
        (String::new(), "at least one buffer"),
        (format!("{},{}", ids[0], ids[0]), "allocated twice"),
        ("0".to_string(), "only local buffers are allocated"),
        ("99".to_string(), "does not declare"),
    ] {
        let j = format!("{}{list}{}", &json[..at], &json[end..]);
        let msg = load_locals(&with_payload(&bytes, &j), "bad.rivet").expect_err(why);
        assert!(msg.contains(why), "{msg}");
    }
}
