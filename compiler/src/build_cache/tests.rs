//! The build cache: keys that differ for every difference in what is built (a constant, a
//! dim, a dtype, a schedule choice, the target's features, an option, the name, a variable's
//! name), equal for an equal program made anew; a hit is the same artefact and computes what
//! the interpreter computes; the LRU bounds; the off switch; programs with callbacks and
//! hostile shared DAGs.

use super::key::encode;
use super::{enabled_by, BuildCache};
use crate::build::{build_with, Options};
use crate::ir::expr::Expr;
use crate::schedule::Schedule;
use crate::target::Target;
use crate::te::{self, Tensor};
use rivet_runtime::{DType, Tensor as RtTensor, Value};
use std::ffi::OsString;

/// What varies between the programs of a test.
#[derive(Clone, Copy)]
struct Variant {
    dtype: DType,
    scale: f64,
    /// The second dim of A (and first of B): symbolic when `None`.
    k: Option<i64>,
    split: Option<i64>,
    var_name: &'static str,
}

const BASE: Variant = Variant {
    dtype: DType::F32,
    scale: 1.0,
    k: None,
    split: None,
    var_name: "n",
};

/// `C[i, j] = scale * sum_r A[i, r] * B[r, j]` with a symbolic n, made anew on each call.
fn gemm(v: Variant) -> (Schedule, Vec<Tensor>) {
    let n = te::var(v.var_name);
    let k: Expr = match v.k {
        Some(k) => Expr::int(k),
        None => n.clone(),
    };
    let a = te::placeholder([n.clone(), k.clone()], v.dtype, "A").unwrap();
    let b = te::placeholder([k.clone(), n.clone()], v.dtype, "B").unwrap();
    let r = te::reduce_axis(0, k, "r").unwrap();
    let scale = v.scale;
    let c = te::compute(
        [&n, &n],
        |[i, j]| {
            let s = te::sum(a.at((i, &r)) * b.at((&r, j)), &r);
            if scale == 1.0 {
                s
            } else {
                s * scale
            }
        },
        "C",
    )
    .unwrap();
    let mut s = Schedule::new(&[&c]).unwrap();
    if let Some(f) = v.split {
        let i = c.axis()[0].var.clone();
        s.stage(&c)
            .unwrap()
            .split(&i, Some(Expr::int(f)), None)
            .unwrap();
    }
    (s, vec![a, b, c])
}

fn key_of(v: Variant, target: &Target, name: &str, opts: Options) -> Vec<u8> {
    let (s, args) = gemm(v);
    encode(&s, &args, target, name, opts, true).expect("a program without callbacks has a key")
}

#[test]
fn every_difference_in_what_is_built_changes_the_key() {
    let cpu = Target::cpu();
    let opts = Options::default();
    let base = key_of(BASE, &cpu, "mm", opts);
    // An equal program made anew (fresh variables and tensors): the same key.
    assert_eq!(key_of(BASE, &cpu, "mm", opts), base);
    let mut no_avx2 = cpu.clone();
    no_avx2.cpu.avx2 = !no_avx2.cpu.avx2;
    let others: Vec<(&str, Vec<u8>)> = vec![
        (
            "a constant",
            key_of(Variant { scale: 2.0, ..BASE }, &cpu, "mm", opts),
        ),
        (
            "another constant",
            key_of(Variant { scale: 3.0, ..BASE }, &cpu, "mm", opts),
        ),
        (
            "a dim",
            key_of(
                Variant {
                    k: Some(17),
                    ..BASE
                },
                &cpu,
                "mm",
                opts,
            ),
        ),
        (
            "another dim",
            key_of(
                Variant {
                    k: Some(18),
                    ..BASE
                },
                &cpu,
                "mm",
                opts,
            ),
        ),
        (
            "a dtype",
            key_of(
                Variant {
                    dtype: DType::F64,
                    ..BASE
                },
                &cpu,
                "mm",
                opts,
            ),
        ),
        (
            "a schedule",
            key_of(
                Variant {
                    split: Some(4),
                    ..BASE
                },
                &cpu,
                "mm",
                opts,
            ),
        ),
        (
            "another split factor",
            key_of(
                Variant {
                    split: Some(8),
                    ..BASE
                },
                &cpu,
                "mm",
                opts,
            ),
        ),
        (
            "a variable's name",
            key_of(
                Variant {
                    var_name: "m",
                    ..BASE
                },
                &cpu,
                "mm",
                opts,
            ),
        ),
        ("the target", key_of(BASE, &Target::interp(), "mm", opts)),
        ("the CPU's features", key_of(BASE, &no_avx2, "mm", opts)),
        ("the name", key_of(BASE, &cpu, "mm2", opts)),
        (
            "checked",
            key_of(
                BASE,
                &cpu,
                "mm",
                Options {
                    checked: true,
                    ..opts
                },
            ),
        ),
        (
            "fma",
            key_of(BASE, &cpu, "mm", Options { fma: true, ..opts }),
        ),
        (
            "as written",
            key_of(
                BASE,
                &cpu,
                "mm",
                Options {
                    as_written: true,
                    ..opts
                },
            ),
        ),
        (
            "the vector width",
            key_of(
                BASE,
                &cpu,
                "mm",
                Options {
                    vector_bytes: Some(0),
                    ..opts
                },
            ),
        ),
    ];
    let (s, args) = gemm(BASE);
    let no_fusion = encode(&s, &args, &cpu, "mm", opts, false).unwrap();
    let mut all = vec![("base", base), ("RIVET_FUSE_ROWS=0", no_fusion)];
    all.extend(others);
    for (i, (what_a, a)) in all.iter().enumerate() {
        for (what_b, b) in &all[i + 1..] {
            assert_ne!(a, b, "{what_a} and {what_b} share a key");
        }
    }
}

#[test]
fn the_arguments_order_and_the_schedules_stages_are_in_the_key() {
    let cpu = Target::cpu();
    let (s, args) = gemm(BASE);
    let k = encode(&s, &args, &cpu, "mm", Options::default(), true).unwrap();
    let swapped = [args[1].clone(), args[0].clone(), args[2].clone()];
    let k2 = encode(&s, &swapped, &cpu, "mm", Options::default(), true).unwrap();
    assert_ne!(k, k2);
    // A parallel annotation on the same loops.
    let (mut s3, args3) = gemm(BASE);
    let c = args3[2].clone();
    let i = c.axis()[0].var.clone();
    s3.stage(&c).unwrap().parallel(&i).unwrap();
    let k3 = encode(&s3, &args3, &cpu, "mm", Options::default(), true).unwrap();
    assert_ne!(k, k3);
}

#[test]
fn a_stage_read_deep_in_a_chain_is_in_the_key() {
    // X -> Y1 -> ... -> Y30 -> Z: only Y17's constant differs.
    let chain = |c17: f64| {
        let n = te::var("n");
        let x = te::placeholder([&n], DType::F32, "X").unwrap();
        let mut y = x.clone();
        for k in 1..=30 {
            let prev = y.clone();
            let c = if k == 17 { c17 } else { 1.0 };
            y = te::compute([&n], |[i]| prev.at([i]) + c, &format!("Y{k}")).unwrap();
        }
        let s = Schedule::new(&[&y]).unwrap();
        encode(&s, &[x, y], &Target::cpu(), "f", Options::default(), true).unwrap()
    };
    assert_eq!(chain(1.0), chain(1.0));
    assert_ne!(chain(1.0), chain(2.0));
    // -0.0 and 0.0 are different constants (bit for bit).
    assert_ne!(chain(0.0), chain(-0.0));
}

#[test]
fn a_shared_dag_is_keyed_in_its_size_not_its_tree_size() {
    // e = e + e, 60 times: 2^60 nodes as a tree, 61 distinct ones.
    let n = te::var("n");
    let x = te::placeholder([&n], DType::F32, "X").unwrap();
    let y = te::compute(
        [&n],
        |[i]| {
            let mut e = x.at([i]);
            for _ in 0..60 {
                e = e.clone() + e;
            }
            e
        },
        "Y",
    )
    .unwrap();
    let s = Schedule::new(&[&y]).unwrap();
    let k = encode(&s, &[x, y], &Target::cpu(), "f", Options::default(), true).unwrap();
    assert!(k.len() < 4096, "{} bytes", k.len());
}

#[test]
fn programs_with_host_callbacks_have_no_key_and_are_not_cached() {
    let n = te::var("n");
    let x = te::placeholder([&n], DType::F32, "X").unwrap();
    let y = te::compute([&n], |[i]| x.at([i]) * 2.0, "Y").unwrap();
    let mut s = Schedule::new(&[&y]).unwrap();
    let f = rivet_runtime::Function::new("tap", |_args: &[Value]| Ok(Value::Null));
    s.stage(&y)
        .unwrap()
        .debug_tap(te::CallbackFn::Function(f))
        .unwrap();
    let args = [x.clone(), y.clone()];
    assert!(encode(&s, &args, &Target::cpu(), "f", Options::default(), true).is_none());
    let a = build_with(&s, &args, "cpu", "tapped", Options::default()).unwrap();
    let b = build_with(&s, &args, "cpu", "tapped", Options::default()).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&a.funcs[0], &b.funcs[0]));
    // An extern stage: no key either.
    let g = rivet_runtime::Function::new("ext", |_args: &[Value]| Ok(Value::Null));
    let e = te::extern_(
        [&n],
        &[x.clone()],
        te::CallbackFn::Function(g),
        DType::F32,
        "E",
    )
    .unwrap();
    let s2 = Schedule::new(&[&e]).unwrap();
    assert!(encode(&s2, &[x, e], &Target::cpu(), "f", Options::default(), true).is_none());
}

/// Deterministic pseudo-random values in [-1, 1).
fn data(len: usize, seed: u64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

fn run(m: &crate::Module, dtype: DType, n: usize) -> Vec<f64> {
    let f = m.get_function(&m.function_names()[0]).unwrap();
    let (a, b) = (data(n * n, 1), data(n * n, 2));
    let t = |v: &[f64]| match dtype {
        DType::F32 => RtTensor::from_slice(
            &v.iter().map(|x| *x as f32).collect::<Vec<_>>(),
            &[n as i64, n as i64],
        )
        .unwrap(),
        _ => RtTensor::from_slice(v, &[n as i64, n as i64]).unwrap(),
    };
    let Value::Tensor(c) = f.call(&[t(&a).into(), t(&b).into()]).unwrap() else {
        panic!("no tensor returned")
    };
    match dtype {
        DType::F32 => c
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        _ => c.to_vec::<f64>().unwrap(),
    }
}

#[test]
fn a_hit_is_the_same_artefact_and_computes_what_the_interpreter_computes() {
    for dtype in [DType::F32, DType::F64] {
        let v = Variant { dtype, ..BASE };
        // A name of this test's own, so no other test's builds share its entries.
        let name = format!("cache_hit_{}", dtype.name());
        let (s, args) = gemm(v);
        let first = build_with(&s, &args, "cpu", &name, Options::default()).unwrap();
        let again = build_with(&s, &args, "cpu", &name, Options::default()).unwrap();
        let (s2, args2) = gemm(v);
        let equal = build_with(&s2, &args2, "cpu", &name, Options::default()).unwrap();
        if enabled_by(&|k| std::env::var_os(k)) {
            assert!(std::sync::Arc::ptr_eq(&first.funcs[0], &again.funcs[0]));
            assert!(std::sync::Arc::ptr_eq(&first.funcs[0], &equal.funcs[0]));
        }
        let oracle = build_with(&s, &args, "interp", &name, Options::default()).unwrap();
        for n in [1, 3, 17, 97] {
            let (x, y, z) = (
                run(&first, dtype, n),
                run(&equal, dtype, n),
                run(&oracle, dtype, n),
            );
            assert_eq!(
                x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            // The packed GEMM reassociates the sum (docs/cpu.md): within n ulps of the sum
            // of magnitudes, here |a|, |b| < 1.
            let eps = if dtype == DType::F32 {
                f32::EPSILON as f64
            } else {
                f64::EPSILON
            };
            for (p, q) in x.iter().zip(&z) {
                assert!((p - q).abs() <= 2.0 * n as f64 * eps, "n={n}: {p} vs {q}");
            }
        }
    }
}

#[test]
fn a_different_program_is_never_a_hit() {
    let opts = Options::default();
    let (s1, a1) = gemm(Variant { scale: 2.0, ..BASE });
    let (s2, a2) = gemm(Variant { scale: 3.0, ..BASE });
    let m1 = build_with(&s1, &a1, "cpu", "cache_scaled", opts).unwrap();
    let m2 = build_with(&s2, &a2, "cpu", "cache_scaled", opts).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&m1.funcs[0], &m2.funcs[0]));
    let (x, y) = (run(&m1, DType::F32, 5), run(&m2, DType::F32, 5));
    for (p, q) in x.iter().zip(&y) {
        assert_eq!((p * 3.0) as f32, (q * 2.0) as f32);
    }
}

#[test]
fn the_cache_counts_hits_and_evicts_the_least_recently_used() {
    let (s, args) = gemm(BASE);
    let m = build_with(&s, &args, "interp", "lru", Options::default()).unwrap();
    let mut c = BuildCache::new(3, 1 << 20);
    let key = |i: u8| vec![i; 10];
    for i in 0..3 {
        c.insert(key(i), m.clone());
    }
    assert!(c.get(&key(0)).is_some()); // 0 is now the most recently used
    c.insert(key(3), m.clone()); // evicts 1
    c.insert(key(4), m.clone()); // evicts 2
    let st = c.stats();
    assert_eq!((st.entries, st.evictions, st.key_bytes), (3, 2, 30));
    assert!(c.get(&key(1)).is_none() && c.get(&key(2)).is_none());
    for i in [0, 3, 4] {
        let hit = c.get(&key(i)).expect("kept");
        assert!(std::sync::Arc::ptr_eq(&hit.funcs[0], &m.funcs[0]));
    }
    let st = c.stats();
    assert_eq!((st.hits, st.misses), (4, 2));
    // The key-bytes bound: 60-byte keys in a 250-byte cache keep four.
    let mut c = BuildCache::new(100, 250);
    for i in 0..5 {
        c.insert(vec![i; 60], m.clone());
    }
    assert_eq!(c.stats().entries, 4); // 4 * 60 = 240 <= 250
    c.insert(vec![9; 63], m.clone()); // over a quarter of the bound: not stored
    assert_eq!(c.stats().entries, 4);
    c.insert(vec![7; 62], m.clone()); // 302 bytes: the oldest goes
    let st = c.stats();
    assert_eq!((st.entries, st.key_bytes), (4, 242));
    assert!(c.get(&[0; 60]).is_none() && c.get(&[7; 62]).is_some());
    // A zero capacity stores nothing.
    let mut c = BuildCache::new(0, 1 << 20);
    c.insert(key(0), m);
    assert_eq!(c.stats().entries, 0);
    c.clear();
}

#[test]
fn the_environment_turns_the_cache_off() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        }
    };
    assert!(enabled_by(&env(&[])));
    assert!(enabled_by(&env(&[("RIVET_BUILD_CACHE", "1")])));
    assert!(!enabled_by(&env(&[("RIVET_BUILD_CACHE", "0")])));
    assert!(!enabled_by(&env(&[("RIVET_DUMP", "/some/dir")])));
}

#[test]
fn threads_building_one_program_at_once_all_get_a_working_function() {
    // Each thread makes its own equal program: they may all miss and build, or hit; every
    // function computes the same bits, and the cache keeps one entry for them.
    let name = "cache_threads";
    let results: Vec<Vec<u64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                sc.spawn(|| {
                    let (s, args) = gemm(BASE);
                    let m = build_with(&s, &args, "cpu", name, Options::default()).unwrap();
                    run(&m, DType::F32, 17)
                        .iter()
                        .map(|v| v.to_bits())
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.windows(2).all(|w| w[0] == w[1]));
    if enabled_by(&|k| std::env::var_os(k)) {
        let (s, args) = gemm(BASE);
        let fuse = std::env::var("RIVET_FUSE_ROWS").map_or(true, |v| v != "0");
        let key = encode(&s, &args, &Target::cpu(), name, Options::default(), fuse).unwrap();
        assert!(super::lock().get(&key).is_some());
    }
}

#[test]
fn a_rewritten_definition_sharing_its_originals_id_is_in_the_key() {
    // The stage's definition replaced by another node with the same id (what `cache_write`
    // and the default schedules' rewrites make): its body is in the key, not only the
    // original's that the arguments hold.
    let rewritten = |scale: f64| {
        let n = te::var("n");
        let a = te::placeholder([&n], DType::F32, "A").unwrap();
        let c = te::compute([&n], |[i]| a.at([i]) * 2.0, "C").unwrap();
        let other = te::compute([&n], |[i]| a.at([i]) * scale, "C").unwrap();
        let node = crate::te::tensor::TensorNode {
            id: c.id(),
            name: "C".into(),
            shape: c.shape().to_vec(),
            dtype: DType::F32,
            op: crate::te::Op::Compute {
                axis: other.axis().to_vec(),
                body: other.body().unwrap().clone(),
            },
            host_callbacks: false,
            stop_gradient: false,
        };
        let mut s = Schedule::new(&[&c]).unwrap();
        let i = s
            .stages
            .iter()
            .position(|st| st.tensor.id() == c.id())
            .unwrap();
        s.set_definition(i, Tensor(std::sync::Arc::new(node)));
        encode(&s, &[a, c], &Target::cpu(), "f", Options::default(), true).unwrap()
    };
    assert_eq!(rewritten(3.0), rewritten(3.0));
    assert_ne!(rewritten(3.0), rewritten(4.0));
}
