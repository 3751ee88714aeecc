//! The default GPU schedule (`schedule::gpu_default::apply_default_gpu`, what `build(..,
//! "cuda")` applies to a schedule that binds nothing): which stages it inlines, how it binds
//! the rest, and that the result computes what the unscheduled program computes, run by the
//! interpreter with GPU semantics (every block and thread, races reported).

use rivet_compiler::ir::{ForKind, ThreadTag};
use rivet_compiler::schedule::gpu_default::{
    apply_default_gpu, default_gpu_schedule, is_contraction,
};
use rivet_compiler::schedule::Attach;
use rivet_compiler::te::{self, compute, placeholder, Tensor as Te};
use rivet_compiler::{build, Schedule};
use rivet_runtime::{DType, Tensor, Value};

fn data(n: usize, seed: u32) -> Vec<f32> {
    // Small integers and halves: exact in f32, so sums are exact in any order.
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 7) % 9) as f32 * 0.5 - 2.0
        })
        .collect()
}

/// Runs `s` built for the interpreter on `inputs`, into a poisoned output of `out_shape`.
fn run(s: &Schedule, args: &[Te], inputs: &[(Vec<f32>, Vec<i64>)], out_shape: &[i64]) -> Vec<f32> {
    let f = build(s, args, "interp", "f")
        .unwrap()
        .get_function("f")
        .unwrap();
    let n: i64 = out_shape.iter().product();
    let out = Tensor::from_slice(&vec![f32::NAN; n as usize], out_shape).unwrap();
    let mut vals: Vec<Value> = inputs
        .iter()
        .map(|(v, sh)| Value::Tensor(Tensor::from_slice(v, sh).unwrap()))
        .collect();
    vals.push(Value::Tensor(out.clone()));
    f.call(&vals).unwrap();
    out.to_vec::<f32>().unwrap()
}

fn bound_tags(s: &Schedule, t: &Te) -> Vec<ThreadTag> {
    let st = &s.stages[s.stage_index(t).unwrap()];
    st.leaves
        .iter()
        .filter_map(|l| match l.kind {
            ForKind::Thread(tag) => Some(tag),
            _ => None,
        })
        .collect()
}

/// y = relu(x * 2 + 1) as three stages, and a row sum of it.
fn chain() -> (Te, Te, Te, Te, Te) {
    let (m, n) = (te::var("m"), te::var("n"));
    let x = placeholder([&m, &n], DType::F32, "X").unwrap();
    let a = compute([&m, &n], |[i, j]| x.at([i, j]) * 2.0, "A").unwrap();
    let b = compute([&m, &n], |[i, j]| a.at([i, j]) + 1.0, "B").unwrap();
    let k = te::reduce_axis(0, &n, "k").unwrap();
    let r = compute([&m], |[i]| te::sum(b.at((i, &k)), &k), "R").unwrap();
    let y = compute(
        [&m, &n],
        |[i, j]| te::maximum(b.at([&i, &j]), 0.0) + r.at([i]),
        "Y",
    )
    .unwrap();
    (x, a, b, r, y)
}

#[test]
fn injective_intermediates_are_inlined_and_the_rest_bound() {
    let (x, a, b, r, y) = chain();
    let s = default_gpu_schedule(&[y.clone()]).unwrap();
    for t in [&a, &b] {
        assert_eq!(
            s.stages[s.stage_index(t).unwrap()].attach,
            Attach::Inline,
            "{}",
            t.name()
        );
    }
    for t in [&r, &y] {
        assert_eq!(
            bound_tags(&s, t),
            vec![ThreadTag::BlockX, ThreadTag::ThreadX],
            "{}",
            t.name()
        );
    }
    // The same values as the unscheduled program, at ragged sizes around the block size.
    let plain = Schedule::new(&[y.clone()]).unwrap();
    for (m, n) in [(1i64, 1i64), (7, 3), (3, 300), (1000 / 7, 9), (2, 1023)] {
        let xv = data((m * n) as usize, m as u32);
        let inputs = [(xv, vec![m, n])];
        let want = run(&plain, &[x.clone(), y.clone()], &inputs, &[m, n]);
        let got = run(&s, &[x.clone(), y.clone()], &inputs, &[m, n]);
        assert_eq!(got, want, "m={m} n={n}");
    }
}

#[test]
fn contractions_are_tiled_and_their_producers_kept() {
    let (m, n, kk) = (te::var("m"), te::var("n"), te::var("k"));
    let a0 = placeholder([&m, &kk], DType::F32, "A0").unwrap();
    let b = placeholder([&kk, &n], DType::F32, "B").unwrap();
    // A producer of the contraction (kept as its own kernel), the contraction, an epilogue.
    let a = compute([&m, &kk], |[i, j]| a0.at([i, j]) - 0.5, "A").unwrap();
    let k = te::reduce_axis(0, &kk, "r").unwrap();
    let c = compute(
        [&m, &n],
        |[i, j]| te::sum(a.at((i, &k)) * b.at((&k, j)), &k),
        "C",
    )
    .unwrap();
    let d = compute([&m, &n], |[i, j]| c.at([i, j]) * 3.0, "D").unwrap();
    assert!(is_contraction(&c));
    assert!(!is_contraction(&a) && !is_contraction(&d));
    let s = default_gpu_schedule(&[d.clone()]).unwrap();
    assert!(
        !bound_tags(&s, &a).is_empty(),
        "the producer of a contraction is its own kernel"
    );
    assert!(
        bound_tags(&s, &c).contains(&ThreadTag::ThreadY),
        "tiled 2-D: {:?}",
        bound_tags(&s, &c)
    );
    let plain = Schedule::new(&[d.clone()]).unwrap();
    let args = [a0.clone(), b.clone(), d.clone()];
    for (mm, nn, k) in [(1i64, 1i64, 1i64), (7, 5, 3), (17, 33, 20), (40, 3, 70)] {
        let inputs = [
            (data((mm * k) as usize, 1), vec![mm, k]),
            (data((k * nn) as usize, 2), vec![k, nn]),
        ];
        let want = run(&plain, &args, &inputs, &[mm, nn]);
        let got = run(&s, &args, &inputs, &[mm, nn]);
        assert_eq!(got, want, "m={mm} n={nn} k={k}");
    }
}

#[test]
fn a_sum_of_one_read_is_not_a_contraction() {
    let (_, _, _, r, y) = chain();
    assert!(!is_contraction(&r) && !is_contraction(&y));
}

#[test]
fn stages_the_user_scheduled_are_left_alone_and_named() {
    let (x, a, _, _, y) = chain();
    let mut s = Schedule::new(&[y.clone()]).unwrap();
    let ax0 = a.axis()[0].var.clone();
    s.stage(&a).unwrap().parallel(&ax0).unwrap();
    // A stage scheduled for the CPU and bound nowhere would run on the host: refused, named.
    let e = apply_default_gpu(&mut s).unwrap_err().to_string();
    let st = &s.stages[s.stage_index(&a).unwrap()];
    assert_eq!(st.attach, Attach::Root);
    assert_eq!(st.leaves[0].kind, ForKind::Parallel);
    assert!(
        e.contains("stage 'A'") && e.contains("parallel") && e.contains("bind"),
        "{e}"
    );
    let mut s = Schedule::new(&[y.clone()]).unwrap();
    s.stage(&a).unwrap().parallel(&ax0).unwrap();
    let e = build(&s, &[x, y], "cuda", "f")
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("stage 'A'") && e.contains("parallel"), "{e}");
}

#[test]
fn build_for_cuda_applies_the_default_to_a_schedule_that_binds_nothing() {
    let (x, _, _, _, y) = chain();
    let s = Schedule::new(&[y.clone()]).unwrap();
    let m = build(&s, &[x, y], "cuda", "f").unwrap();
    let src = m.get_source("cuda").unwrap();
    // Kernels for the row sum and the output only: the injective stages are inlined into
    // both, no kernel writes A or B.
    assert!(
        src.contains("writes R;") && src.contains("writes Y;"),
        "{src}"
    );
    assert!(
        !src.contains("writes A") && !src.contains("writes B"),
        "{src}"
    );
}

/// A reduction over a symbolic axis and an axis of constant extent 0 (`1 - 1`) sums nothing:
/// the default schedule leaves it serial instead of fusing the axes into a thread loop of 0
/// iterations (found by `compiler_props::gpu_schedules_of_reductions`).
#[test]
fn a_reduction_with_an_empty_constant_axis_stays_serial() {
    let n = te::var("n");
    let a = placeholder((&n, 1), DType::F32, "A").unwrap();
    let r0 = te::reduce_axis(0, &n, "r0").unwrap();
    let r1 = te::reduce_axis(1, 1, "r1").unwrap();
    let c = compute([1], |[_]| te::sum(a.at([&r0, &r1]), [&r0, &r1]), "C").unwrap();
    let s = default_gpu_schedule(&[c.clone()]).unwrap();
    for rows in [1usize, 5] {
        let got = run(
            &s,
            &[a.clone(), c.clone()],
            &[(data(rows, 3), vec![rows as i64, 1])],
            &[1],
        );
        assert_eq!(got, vec![0.0], "rows = {rows}");
    }
}
