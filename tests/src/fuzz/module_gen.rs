//! Generator 2: saved modules, mutated. Real modules (fixed programs and random te programs
//! that build) are saved with `Module::to_bytes`; a case mutates the JSON payload
//! structurally (output flags flipped, loop kinds changed, integers replaced by adversarial
//! constants, buffer ids swapped, nodes deleted, duplicated or swapped, deep nesting, dtypes
//! and buffer kinds changed), or its raw bytes, then re-frames it with a correct length and
//! CRC-32 so the loader's own checks are what is tested. A module that loads runs on guarded
//! inputs, compared with the same mutated IR loaded for the "interp" target; its inputs must
//! not change, whatever the file says.

use super::guarded::{Guarded, LayoutS};
use super::rng::Rng;
use super::{ckind, kind, short, Outcome};
use rivet_compiler::ir::Expr;
use rivet_compiler::te;
use rivet_compiler::{build, Module, Schedule};
use rivet_runtime::{DType, Dim, ParamKind, Value};
use serde_json::Value as J;
use std::collections::HashMap;
use std::sync::OnceLock;

const HEADER: usize = 24;

/// Frames a payload as a module file: magic, version 1, length, CRC-32, payload.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(b"RIVETMOD");
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The fixed programs every soak starts from.
fn fixed_modules() -> Vec<Module> {
    let mut out = Vec::new();
    // Elementwise over symbolic dims, parallel and vectorised.
    let (n, m) = (te::var("n"), te::var("m"));
    let a = te::placeholder([&n, &m], DType::F32, "A").unwrap();
    let b = te::placeholder([&n, &m], DType::F32, "B").unwrap();
    let c = te::compute([&n, &m], |[i, j]| a.at([&i, &j]) * 2.0 + b.at([i, j]), "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let ax: Vec<_> = c.axis().iter().map(|x| x.var.clone()).collect();
    s.stage(&c).unwrap().parallel(&ax[0]).unwrap();
    out.push(build(&s, &[a, b, c], "cpu", "ew").unwrap());
    // A static reduction with a split reduction loop.
    let a = te::placeholder([4, 8], DType::F64, "A").unwrap();
    let k = te::reduce_axis(0, 8, "k").unwrap();
    let c = te::compute([4], |[i]| te::sum(a.at((i, &k)), &k), "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    s.stage(&c)
        .unwrap()
        .split(&k.var, Some(Expr::int(3)), None)
        .unwrap();
    out.push(build(&s, &[a, c], "cpu", "red").unwrap());
    // A stencil with its producer computed at the consumer's loop (a local buffer).
    let n = te::var("n");
    let a = te::placeholder([&n + 1], DType::I32, "A").unwrap();
    let p = te::compute([&n + 1], |[i]| a.at([i]) * 3, "P").unwrap();
    let c = te::compute([&n], |[i]| p.at([&i]) + p.at([i + 1]), "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let ax = c.axis()[0].var.clone();
    let (o, _) = s
        .stage(&c)
        .unwrap()
        .split(&ax, Some(Expr::int(4)), None)
        .unwrap();
    s.compute_at(&p, &c, &o).unwrap();
    out.push(build(&s, &[a, c], "cpu", "stencil").unwrap());
    // The seed GEMM.
    let g = rivet_tests::SeedGemm::new();
    let s = Schedule::new(&[g.c.clone()]).unwrap();
    out.push(build(&s, &g.args(), "cpu", "mm").unwrap());
    out
}

/// Payloads of the base modules: the fixed ones and random te programs that build.
fn bases() -> &'static Vec<J> {
    static BASES: OnceLock<Vec<J>> = OnceLock::new();
    BASES.get_or_init(|| {
        let mut mods = fixed_modules();
        let mut seed = 0x5eed_u64;
        while mods.len() < 10 && seed < 0x5eed + 24 {
            if let Some(m) = super::te_gen::built_module(seed) {
                mods.push(m);
            }
            seed += 1;
        }
        mods.iter()
            .map(|m| {
                let bytes = m.to_bytes().expect("a module serialises");
                serde_json::from_slice(&bytes[HEADER..]).expect("its payload is JSON")
            })
            .collect()
    })
}

/// JSON pointers of every node, with the node's key in its parent (if any).
fn nodes(v: &J, path: &mut String, key: &str, out: &mut Vec<(String, String)>) {
    out.push((path.clone(), key.to_string()));
    let len = path.len();
    match v {
        J::Object(m) => {
            for (k, c) in m {
                path.push('/');
                path.push_str(&k.replace('~', "~0").replace('/', "~1"));
                nodes(c, path, k, out);
                path.truncate(len);
            }
        }
        J::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                path.push('/');
                path.push_str(&i.to_string());
                nodes(c, path, key, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

fn all_nodes(v: &J) -> Vec<(String, String)> {
    let mut out = Vec::new();
    nodes(v, &mut String::new(), "", &mut out);
    out
}

const KINDS: [&str; 4] = ["Serial", "Parallel", "Vectorized", "Unrolled"];
const DTYPES: [&str; 6] = ["float32", "float64", "int32", "int64", "bool", "uint8"];

/// One structural mutation; returns its description.
fn mutate(p: &mut J, r: &mut Rng) -> String {
    let all = all_nodes(p);
    let pick_where = |r: &mut Rng, f: &dyn Fn(&J, &str) -> bool| -> Option<String> {
        let c: Vec<&String> = all
            .iter()
            .filter(|(path, key)| p.pointer(path).is_some_and(|v| f(v, key)))
            .map(|(path, _)| path)
            .collect();
        (!c.is_empty()).then(|| c[r.below(c.len() as u64) as usize].clone())
    };
    match r.below(12) {
        0 => match pick_where(r, &|v, _| v.is_boolean()) {
            Some(at) => {
                let v = p.pointer_mut(&at).unwrap();
                *v = J::Bool(!v.as_bool().unwrap());
                format!("flip {at}")
            }
            None => "none".into(),
        },
        1 | 2 => match pick_where(r, &|v, _| v.is_number()) {
            Some(at) => {
                let x = r.adversarial();
                *p.pointer_mut(&at).unwrap() = if x < 0 || r.chance(0.5) {
                    J::from(x)
                } else {
                    J::from(x as u64)
                };
                format!("{at} = {x}")
            }
            None => "none".into(),
        },
        3 => match pick_where(r, &|v, _| v.as_str().is_some_and(|s| KINDS.contains(&s))) {
            Some(at) => {
                let k = r.pick(&KINDS);
                *p.pointer_mut(&at).unwrap() = J::from(k);
                format!("{at} = {k}")
            }
            None => "none".into(),
        },
        4 => {
            let ids: Vec<J> = all
                .iter()
                .filter(|(_, k)| k == "buf" || k == "id" || k == "params")
                .filter_map(|(path, _)| p.pointer(path).cloned())
                .filter(|v| v.is_number())
                .collect();
            match (
                pick_where(r, &|v, k| k == "buf" && v.is_number()),
                ids.is_empty(),
            ) {
                (Some(at), false) => {
                    let id = r.pick(&ids);
                    *p.pointer_mut(&at).unwrap() = id.clone();
                    format!("{at} = buffer {id}")
                }
                _ => "none".into(),
            }
        }
        5 | 6 => match pick_where(r, &|v, _| v.as_array().is_some_and(|a| !a.is_empty())) {
            Some(at) => {
                let a = p.pointer_mut(&at).unwrap().as_array_mut().unwrap();
                let i = r.below(a.len() as u64) as usize;
                if r.chance(0.5) {
                    a.remove(i);
                    format!("delete {at}/{i}")
                } else {
                    let x = a[i].clone();
                    a.insert(i, x);
                    format!("duplicate {at}/{i}")
                }
            }
            None => "none".into(),
        },
        7 => {
            // Deep nesting: a statement wrapped in many sequences, or an expression in many
            // negations / casts.
            // 5000 is past MAX_IR_DEPTH (refused by the verifier).
            let depth = if r.chance(0.02) {
                5000
            } else {
                r.pick(&[8usize, 100, 127, 600, 1200])
            };
            match pick_where(r, &|v, k| {
                (k == "body" || k == "value" || k == "extent") && v.is_object()
            }) {
                Some(at) => {
                    let v = p.pointer_mut(&at).unwrap();
                    let is_expr = v.get("kind").is_some();
                    let mut x = v.take();
                    // Built by moving `x` into new nodes: `json!` would serialise `x` again at
                    // every level (quadratic: the 5000-deep case took the generator ~50 s).
                    let obj = |pairs: Vec<(&str, J)>| {
                        J::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                    };
                    for _ in 0..depth {
                        x = if is_expr {
                            let dt = x.get("dtype").cloned().unwrap_or(J::from("int64"));
                            let unary = obj(vec![("Unary", J::Array(vec![J::from("Neg"), x]))]);
                            obj(vec![("kind", unary), ("dtype", dt)])
                        } else {
                            obj(vec![("Seq", J::Array(vec![x]))])
                        };
                    }
                    *v = x;
                    format!("nest {at} x{depth}")
                }
                None => "none".into(),
            }
        }
        8 => match pick_where(r, &|v, k| k == "kind" && v.get("Param").is_some()) {
            Some(at) => {
                *p.pointer_mut(&at).unwrap() = J::from("Local");
                format!("{at} = Local")
            }
            None => match pick_where(r, &|v, k| k == "kind" && v == "Local") {
                Some(at) => {
                    *p.pointer_mut(&at).unwrap() = serde_json::json!({"Param": {"output": false}});
                    format!("{at} = Param")
                }
                None => "none".into(),
            },
        },
        9 => match pick_where(r, &|v, k| k == "dtype" && v.is_string()) {
            Some(at) => {
                let d = r.pick(&DTYPES);
                *p.pointer_mut(&at).unwrap() = J::from(d);
                format!("{at} = {d}")
            }
            None => "none".into(),
        },
        10 => {
            // Swap two subtrees under the same key (two extents, two indices, two bodies).
            let key = r.pick(&[
                "extent", "min", "value", "body", "indices", "shape", "var", "cond",
            ]);
            let c: Vec<&String> = all
                .iter()
                .filter(|(_, k)| k == key)
                .map(|(path, _)| path)
                .collect();
            if c.len() < 2 {
                return "none".into();
            }
            let (x, y) = (r.pick(&c).clone(), r.pick(&c).clone());
            if x.starts_with(&y) || y.starts_with(&x) {
                return "none".into();
            }
            let vx = p.pointer(&x).unwrap().clone();
            let vy = std::mem::replace(p.pointer_mut(&y).unwrap(), vx);
            *p.pointer_mut(&x).unwrap() = vy;
            format!("swap {x} <-> {y}")
        }
        _ => {
            // Splice a subtree of another base module in (e.g. a whole body or buffer list).
            let other = r.pick(bases());
            let on = all_nodes(&other);
            let (from, key) = r.pick(&on);
            match pick_where(r, &|_, k| k == key) {
                Some(at) if !key.is_empty() => {
                    *p.pointer_mut(&at).unwrap() = other.pointer(&from).unwrap().clone();
                    format!("splice {from} -> {at}")
                }
                _ => "none".into(),
            }
        }
    }
}

/// Sets every function's target.
fn retarget(p: &mut J, target: &str) {
    if let Some(fs) = p.get_mut("functions").and_then(|f| f.as_array_mut()) {
        for f in fs {
            if let Some(t) = f.get_mut("target") {
                *t = J::from(target);
            }
        }
    }
}

/// The file bytes of one case, and the same IR for the interp target (structural cases).
fn gen_bytes(r: &mut Rng, log: &mut String) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut p = r.pick(bases());
    match r.below(10) {
        0 => {
            // Raw byte mutations of the payload, CRC fixed.
            let mut bytes = serde_json::to_vec(&p).unwrap();
            for _ in 0..r.range(1, 4) {
                let i = r.below(bytes.len() as u64) as usize;
                bytes[i] = if r.chance(0.5) {
                    r.next() as u8
                } else {
                    b"0123456789-\"{}[],"[r.below(17) as usize]
                };
                log.push_str(&format!(" byte[{i}]={:#x}", bytes[i]));
            }
            (frame(&bytes), None)
        }
        1 => {
            // Header damage (CRC not fixed): truncation, version, length.
            let mut f = frame(&serde_json::to_vec(&p).unwrap());
            match r.below(3) {
                0 => f.truncate(r.below(f.len() as u64) as usize),
                1 => f[8] = r.next() as u8,
                _ => f[12..20].copy_from_slice(&(r.adversarial() as u64).to_le_bytes()),
            }
            log.push_str(" header damage");
            (f, None)
        }
        _ => {
            for _ in 0..r.range(1, 3) {
                let m = mutate(&mut p, r);
                log.push(' ');
                log.push_str(&m);
                // Listing the nodes of a deeply nested document costs O(nodes x depth): a
                // deep nest is the last mutation (else the generator itself hangs).
                if m.starts_with("nest ") {
                    break;
                }
            }
            retarget(&mut p, "cpu");
            let cpu = frame(&serde_json::to_vec(&p).unwrap());
            retarget(&mut p, "interp");
            let interp = frame(&serde_json::to_vec(&p).unwrap());
            (cpu, Some(interp))
        }
    }
}

/// Guarded arguments for a function's signature: symbolic dims small and consistent, fixed
/// dims as the file says (zero strides for huge input dims).
fn make_args(f: &rivet_runtime::Function, r: &mut Rng) -> Result<Vec<(Guarded, bool)>, String> {
    let sig = f
        .signature()
        .ok_or("a compiled function without a signature")?;
    let mut vars: HashMap<String, i64> = HashMap::new();
    let mut out = Vec::new();
    for p in &sig.params {
        let ParamKind::Tensor(spec) = &p.kind else {
            return Err(format!("param {} is not a tensor", p.name));
        };
        let dtype = spec.dtypes.first().copied().unwrap_or(DType::F32);
        let dims = spec.shape.clone().unwrap_or_default();
        let shape: Vec<i64> = dims
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => *n,
                Dim::Var(v) => *vars.entry(v.clone()).or_insert_with(|| r.range(1, 5)),
                Dim::Any => r.range(1, 5),
            })
            .collect();
        if shape.iter().any(|&n| n < 0) {
            return Err(String::new()); // refused by the signature check in any case
        }
        let mut lay = LayoutS::random(shape.len(), !spec.output, r);
        for (d, &n) in shape.iter().enumerate() {
            if n > 64 {
                lay.bcast[d] = true;
            }
        }
        let huge = shape
            .iter()
            .try_fold(1i64, |a, &n| a.checked_mul(n))
            .is_none_or(|n| n > 1 << 16);
        if huge && spec.output {
            return Err(String::new()); // an output that cannot be allocated: not a case
        }
        // A shape rivet cannot represent (a loaded signature may say i64::MAX): not a case.
        let Some(g) = Guarded::try_new(&shape, dtype, &lay, spec.output, r) else {
            return Err(String::new());
        };
        out.push((g, spec.output));
    }
    Ok(out)
}

fn load(bytes: &[u8]) -> std::result::Result<Module, rivet_compiler::Error> {
    Module::from_bytes(bytes, "fuzz.rivet")
}

pub fn run_case(seed: u64, verbose: bool) -> Outcome {
    let mut r = Rng::new(seed);
    let mut log = String::new();
    let (cpu_bytes, interp_bytes) = gen_bytes(&mut r, &mut log);
    if verbose {
        eprintln!("module case {seed:#x}:{log}");
    }
    let mc = match load(&cpu_bytes) {
        Ok(m) => m,
        Err(e) => {
            let k = ckind(&e);
            if verbose {
                eprintln!("  load refused ({k}): {}", short(&e.to_string()));
            }
            return if k == "Internal" {
                Outcome::Fail(format!(
                    "load: internal error: {}\n{log}",
                    short(&e.to_string())
                ))
            } else {
                Outcome::Typed(format!("load:{k}"))
            };
        }
    };
    let Some(interp_bytes) = interp_bytes else {
        // A raw mutation that still loads: it must at least run safely.
        return run_loaded(&mc, None, &mut r, &log);
    };
    let mi = match load(&interp_bytes) {
        Ok(m) => m,
        Err(e) => {
            return Outcome::Fail(format!(
                "load: cpu accepts the file but interp refuses it ({}): {}\n{log}",
                ckind(&e),
                short(&e.to_string())
            ))
        }
    };
    run_loaded(&mc, Some(&mi), &mut r, &log)
}

/// Loops of more than 2^20 iterations (a mutated extent): the file asks for that much work,
/// which is legitimate and slow, not a hang; such modules are loaded but not run.
fn huge_work(m: &Module) -> bool {
    let mut huge = false;
    for c in &m.funcs {
        // Every statement, those of the bodies the host/device split outlined included.
        c.func.visit_all(&mut |s| {
            if let rivet_compiler::ir::Stmt::For { extent, .. } = s {
                // Variables at 4, the most the harness binds a dim to (loop variables too:
                // a heuristic, only used to skip work).
                let e = rivet_compiler::arith::exact::eval_exact(extent, &|_| Some(4));
                huge |= e.map_or(true, |e| e > 1 << 20);
            }
        });
    }
    huge
}

fn run_loaded(mc: &Module, mi: Option<&Module>, r: &mut Rng, log: &str) -> Outcome {
    if huge_work(mc) {
        return Outcome::Typed("run:skipped (huge loop extent)".into());
    }
    let mut typed = None;
    for name in mc.function_names() {
        let fc = mc.get_function(&name).expect("listed");
        let args = match make_args(&fc, r) {
            Ok(a) => a,
            Err(m) if m.is_empty() => {
                typed = Some("args:unallocatable".to_string());
                continue;
            }
            Err(m) => return Outcome::Fail(format!("{m}\n{log}")),
        };
        let twin: Vec<(Guarded, bool)> = args.iter().map(|(g, o)| (g.twin(), *o)).collect();
        let vals = |a: &[(Guarded, bool)]| -> Vec<Value> {
            a.iter()
                .map(|(g, _)| Value::Tensor(g.view.clone()))
                .collect()
        };
        let damage = |a: &[(Guarded, bool)], t: &str| -> Option<String> {
            a.iter().enumerate().find_map(|(k, (g, out))| {
                if *out {
                    g.check_canaries(&format!("{t}: output {k}"))
                } else {
                    g.check_unchanged(&format!("{t}: input {k}"))
                }
            })
        };
        let rc = fc.call(&vals(&args));
        if let Some(m) = damage(&args, "cpu") {
            return Outcome::Fail(format!(
                "{m}\n{log}\nIR:\n{}",
                mc.get_source("nest").unwrap_or_default()
            ));
        }
        let ri = match mi {
            Some(mi) => {
                let fi = match mi.get_function(&name) {
                    Ok(f) => f,
                    Err(e) => {
                        return Outcome::Fail(format!("interp module lacks {name}: {e}\n{log}"))
                    }
                };
                let ri = fi.call(&vals(&twin));
                if let Some(m) = damage(&twin, "interp") {
                    return Outcome::Fail(format!("{m}\n{log}"));
                }
                Some(ri)
            }
            None => None,
        };
        match (rc, ri) {
            (Err(e), _) if kind(&e) == "Internal" => {
                return Outcome::Fail(format!(
                    "call: internal error (cpu): {}\n{log}",
                    short(&e.to_string())
                ))
            }
            (_, Some(Err(e))) if kind(&e) == "Internal" => {
                return Outcome::Fail(format!(
                    "call: internal error (interp): {}\n{log}",
                    short(&e.to_string())
                ))
            }
            (Ok(_), Some(Ok(_))) => {
                for (k, ((gc, out), (gi, _))) in args.iter().zip(&twin).enumerate() {
                    if !out {
                        continue;
                    }
                    if let (Some(ec), Some(ei)) = (gc.elements(), gi.elements()) {
                        if let Some(j) = (0..ec.len()).find(|&j| ec[j] != ei[j]) {
                            return Outcome::Fail(format!(
                                "wrong result: output {k} element {j}: interp {:#x}, cpu {:#x}\n{log}\nIR:\n{}",
                                ei[j], ec[j], mc.get_source("nest").unwrap_or_default()
                            ));
                        }
                    }
                }
            }
            (Err(a), Some(Err(b))) => {
                if kind(&a) != kind(&b) {
                    return Outcome::Fail(format!(
                        "call: cpu says {}, interp says {}: {} / {}\n{log}",
                        kind(&a),
                        kind(&b),
                        short(&a.to_string()),
                        short(&b.to_string())
                    ));
                }
                typed = Some(format!("call:{}", kind(&a)));
            }
            (Ok(_), None) => {}
            (Err(a), None) => typed = Some(format!("call:{}", kind(&a))),
            (a, Some(b)) => {
                return Outcome::Fail(format!(
                    "call: targets disagree: cpu {:?} / interp {:?}\n{log}",
                    a.as_ref().map(|_| ()).map_err(|e| short(&e.to_string())),
                    b.as_ref().map(|_| ()).map_err(|e| short(&e.to_string()))
                ))
            }
        }
    }
    // Loaded functions are proven again, and the fuzzer runs in checked mode: an access
    // caught out of bounds is one the proof admitted (a soundness bug, as in `te_gen`).
    if typed.as_deref() == Some("call:Index") {
        return Outcome::Fail(format!(
            "call: out-of-bounds access admitted by the proof of a loaded function\n{log}"
        ));
    }
    match typed {
        Some(t) => Outcome::Typed(t),
        None => Outcome::Pass,
    }
}
