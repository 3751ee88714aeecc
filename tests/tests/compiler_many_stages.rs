//! Programs of many stages: a chain `X_{k+1} = X_k * 1.0001 + 1` of thousands of materialised
//! stages builds, runs on every backend and round-trips through a saved module, against a
//! sequential Rust reference on fresh random data; nesting that does grow with the program
//! (`compute_at` chains) is a `CompileError` naming `MAX_STMT_DEPTH`, never an internal
//! error; and a 20,000-stage chain is scheduled, differentiated, printed, built, run and
//! dropped on a thread with a 2 MiB stack (no walk recurses once per stage).

use rivet_compiler::build::{build_with, Options};
use rivet_compiler::te::{self, compute, placeholder};
use rivet_compiler::{Error, Module, Schedule, Target};
use rivet_runtime::{DType, Tensor, Value};
use rivet_tests::backends;

/// Elements per stage.
const LEN: usize = 8;

/// `(X, [X_1, ..., X_n])` with `X_{k+1} = X_k * 1.0001 + 1`.
fn chain(n: usize) -> (te::Tensor, Vec<te::Tensor>) {
    let x = placeholder([LEN as i64], DType::F32, "X").unwrap();
    let mut stages = Vec::with_capacity(n);
    let mut t = x.clone();
    for k in 0..n {
        t = compute(
            [LEN as i64],
            |[i]| t.at([i]) * 1.0001 + 1.0,
            &format!("X{}", k + 1),
        )
        .unwrap();
        stages.push(t.clone());
    }
    (x, stages)
}

/// The chain computed in Rust, in float32 as the kernels compute it (one multiply, one add).
fn reference(x: &[f32], n: usize) -> Vec<f32> {
    let c = 1.0001f64 as f32;
    x.iter()
        .map(|&v| (0..n).fold(v, |v, _| v * c + 1.0))
        .collect()
}

/// Fresh inputs in [-1, 1) and the seed that made them (for a failure's message).
fn fresh_input() -> (Vec<f32>, u64) {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut s = seed | 1;
    let v = (0..LEN)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    (v, seed)
}

fn run(m: &Module, n: usize, what: &str) {
    let (xv, seed) = fresh_input();
    let f = m.get_function("chain").unwrap();
    let x = Tensor::from_slice(&xv, &[LEN as i64]).unwrap();
    let out = rivet_tests::call(&f, &[Value::Tensor(x)]).unwrap();
    let got = out.as_tensor().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got, reference(&xv, n), "{what}, input seed {seed}");
}

fn as_written(yes: bool) -> Options {
    Options {
        as_written: yes,
        ..Options::default()
    }
}

fn five_thousand_materialised_stages_build_and_run_on_every_backend(target: &Target) {
    let n = 5000;
    let (x, stages) = chain(n);
    let out = stages.last().unwrap().clone();
    let s = Schedule::new(&[out.clone()]).unwrap();
    assert_eq!(s.stages.len(), n);
    // The default schedule (which inlines what it can and falls back to the program as
    // written when the inlined expression would be too deep) and the program as written.
    for written in [false, true] {
        let what = format!("{target} as_written={written}");
        let m = build_with(
            &s,
            &[x.clone(), out.clone()],
            &target,
            "chain",
            as_written(written),
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        // The stages' temporaries share one allocation: statement nesting does not grow
        // with the number of stages.
        let depth = m.funcs[0].nest.body.depth();
        assert!(depth < 16, "{what}: nest {depth} deep");
        run(&m, n, &what);
    }
}

fn a_saved_module_of_5000_stages_loads_and_runs(target: &Target) {
    let n = 5000;
    let (x, stages) = chain(n);
    let out = stages.last().unwrap().clone();
    let s = Schedule::new(&[out.clone()]).unwrap();
    let m = build_with(
        &s,
        &[x.clone(), out.clone()],
        &target,
        "chain",
        as_written(true),
    )
    .unwrap();
    let bytes = m.to_bytes().unwrap();
    let loaded = Module::from_bytes(&bytes, "chain.rivet").unwrap();
    run(&loaded, n, &format!("{target}, loaded"));
}

/// `X_k` computed inside the loop of `X_{k+1}`, for every stage but the last: each stage
/// nests inside the next.
fn compute_at_chain(n: usize) -> (te::Tensor, te::Tensor, Schedule) {
    let (x, stages) = chain(n);
    let out = stages.last().unwrap().clone();
    let mut s = Schedule::new(&[out.clone()]).unwrap();
    for w in stages.windows(2) {
        let axis = w[1].axis()[0].var.clone();
        s.compute_at(&w[0], &w[1], &axis).unwrap();
    }
    (x, out, s)
}

#[test]
fn compute_at_chains_nest_and_past_the_limit_are_a_compile_error() {
    // Within the limit: nested, and right. (Kept short: bound inference of a compute_at
    // chain composes the regions of every level, and its time grows steeply with the chain.)
    let (x, out, s) = compute_at_chain(40);
    for target in backends() {
        let m = build_with(
            &s,
            &[x.clone(), out.clone()],
            &target,
            "chain",
            as_written(true),
        )
        .unwrap();
        assert!(m.funcs[0].nest.body.depth() > 40);
        run(&m, 40, &format!("{target} compute_at chain"));
    }
    // Past it: a user error, at once, that names the limit and the depth.
    let (x, out, s) = compute_at_chain(2500);
    for target in backends() {
        let e = build_with(
            &s,
            &[x.clone(), out.clone()],
            &target,
            "chain",
            as_written(true),
        )
        .err()
        .expect("refused");
        let Error::Compile(msg) = &e else {
            panic!("{target}: not a CompileError: {e:?}")
        };
        assert!(msg.contains("MAX_STMT_DEPTH"), "{msg}");
        assert!(msg.contains("compute_at"), "{msg}");
        assert!(msg.contains("at least 2500 deep"), "{msg}");
    }
}

#[test]
fn a_20000_stage_chain_needs_no_deep_stack() {
    // Everything a user can do with the chain, on a thread with a 2 MiB stack: schedule it,
    // order it, print it, differentiate it, build and run it, drop it.
    let n = 20_000;
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let (x, stages) = chain(n);
            let out = stages.last().unwrap().clone();
            drop(stages);
            let s = Schedule::new(&[out.clone()]).unwrap();
            assert_eq!(s.stages.len(), n);
            let order = s.post_order();
            assert_eq!(order.len(), n + 1);
            assert_eq!(order[0].name(), "X");
            assert_eq!(order[n].name(), format!("X{n}"));
            assert_eq!(te::tensor::post_order(&[out.clone()]).len(), n + 1);
            let text = format!("{out:?} = {}", out.body().unwrap());
            assert!(text.contains(&format!("X{}", n - 1)), "{text}");
            let g = te::gradient(&out, &[x.clone()], None).unwrap();
            assert_eq!(g.len(), 1);
            assert_eq!(g[0].shape(), x.shape());
            drop(g);
            let m = build_with(
                &s,
                &[x.clone(), out.clone()],
                "interp",
                "chain",
                as_written(true),
            )
            .unwrap();
            run(&m, n, "interp, 20000 stages");
            drop((m, s, order, out, x));
        })
        .unwrap()
        .join()
        .expect("the thread finished (no stack overflow, no panic)");
}

// On CUDA the default GPU schedule inlines the chain past MAX_IR_DEPTH, as_written or not
// (it has no fallback to the program as written): a compile error today, so host code only.
rivet_tests::for_each_backend! {
    host_code:
        five_thousand_materialised_stages_build_and_run_on_every_backend,
        a_saved_module_of_5000_stages_loads_and_runs;
}
