//! The call fast path (`rivet_compiler::call::plan`) accepts exactly the calls the full path
//! accepts, and they compute the same thing: every case below is called through a function
//! with the fast path and through one without (`make_function_full_path`), on fresh copies of
//! the same arguments; both must succeed with bit-identical outputs, or fail with the same
//! error. Hostile arguments included: sizes near 2^62 through stride-0 views, self-overlapping
//! and aliased outputs, read-only outputs, wrong dtypes, ranks, sizes, failed bounds checks.

use rivet_compiler::call::plan::CallPlan;
use rivet_compiler::call::{make_function, make_function_full_path};
use rivet_compiler::te::{self, compute, placeholder};
use rivet_compiler::{build, Module, Schedule, Target, ToTarget};
use rivet_runtime::{DType, Function, Tensor, Value};
use std::sync::Arc;

fn module(outs: &[te::Tensor], args: &[te::Tensor], target: &(impl ToTarget + ?Sized)) -> Module {
    let s = Schedule::new(outs).unwrap();
    build(&s, args, target, "f").unwrap()
}

/// Symbolic elementwise add: C[i] = A[i] + B[i], i < n.
fn add(target: &(impl ToTarget + ?Sized)) -> Module {
    let n = te::var("n");
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let b = placeholder([&n], DType::F32, "B").unwrap();
    let c = compute([&n], |[i]| a.at([&i]) + b.at([i]), "C").unwrap();
    module(&[c.clone()], &[a, b, c], target)
}

/// C[i] = A[2 i], A of its own size m: the bounds proof leaves a per-call check (2n - 1 <= m).
fn strided_gather(target: &(impl ToTarget + ?Sized)) -> Module {
    let (n, m) = (te::var("n"), te::var("m"));
    let a = placeholder([m], DType::F32, "A").unwrap();
    let c = compute([n], |[i]| a.at([i * 2]), "C").unwrap();
    module(&[c.clone()], &[a, c], target)
}

/// A fixed-shape 2-d copy with a 3-element output dim.
fn fixed(target: &(impl ToTarget + ?Sized)) -> Module {
    let a = placeholder([2, 3], DType::F64, "A").unwrap();
    let c = compute([2, 3], |[i, j]| a.at([i, j]) * 2.0, "C").unwrap();
    module(&[c.clone()], &[a, c], target)
}

fn f32s(v: &[f32]) -> Tensor {
    Tensor::from_slice(v, &[v.len() as i64]).unwrap()
}

fn ramp(n: usize) -> Tensor {
    f32s(&(0..n).map(|i| i as f32 * 0.5 - 3.0).collect::<Vec<_>>())
}

/// Every tensor argument's elements, as bit patterns (NaN-safe comparison); huge stride-0
/// inputs (never written) are skipped.
fn contents(args: &[Value]) -> Vec<Vec<u64>> {
    args.iter()
        .filter_map(|v| v.as_tensor())
        .filter(|t| t.numel() <= 1 << 20)
        .map(|t| match t.dtype() {
            DType::F32 => t
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits() as u64)
                .collect(),
            DType::F64 => t
                .to_vec::<f64>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect(),
            d => panic!("no comparison for {d}"),
        })
        .collect()
}

/// Both paths on `make()` arguments (called twice, so each gets fresh memory): same outcome.
fn same(m: &Module, make: &dyn Fn() -> Vec<Value>, what: &str) -> bool {
    let c = m.funcs[0].clone();
    let fast: Function = make_function(c.clone());
    let full: Function = make_function_full_path(c.clone());
    let (a1, a2) = (make(), make());
    let (r1, r2) = (rivet_tests::call(&fast, &a1), rivet_tests::call(&full, &a2));
    match (&r1, &r2) {
        (Ok(_), Ok(_)) => assert_eq!(contents(&a1), contents(&a2), "{what}: outputs differ"),
        (Err(e1), Err(e2)) => assert_eq!(e1.to_string(), e2.to_string(), "{what}"),
        _ => panic!("{what}: fast path {r1:?}, full path {r2:?}"),
    }
    // The plan accepts only calls that succeed.
    let accepted =
        CallPlan::new(&c).is_some_and(|p| p.accept(&c, &on_device(&fast, make())).is_some());
    assert!(
        !accepted || r2.is_ok(),
        "{what}: the plan accepted a failing call"
    );
    accepted
}

/// `args` as `f` takes them: device mirrors for a CUDA function (the plan's verdict is on
/// what the function is called with).
fn on_device(f: &Function, args: Vec<Value>) -> Vec<Value> {
    if rivet_tests::device::takes_device_memory(f) {
        rivet_tests::device::mirror_args(&args).unwrap()
    } else {
        args
    }
}

/// A maker of fresh arguments for one case.
type Args = Box<dyn Fn() -> Vec<Value>>;

fn t(v: Tensor) -> Value {
    Value::Tensor(v)
}

fn fast_path_accepts_exactly_what_the_full_path_accepts(target: &Target) {
    let m = add(target);
    let w = |s: &str| format!("{target} add: {s}");
    assert!(same(
        &m,
        &|| vec![
            t(ramp(5)),
            t(ramp(5)),
            t(Tensor::zeros(&[5], DType::F32).unwrap())
        ],
        &w("valid")
    ));
    assert!(same(
        &m,
        &|| vec![t(ramp(0)), t(ramp(0)), t(ramp(0))],
        &w("empty")
    ));
    // Strided views in and out.
    assert!(same(
        &m,
        &|| {
            let big = ramp(12);
            vec![
                t(big.as_strided(&[4], &[3], 1).unwrap()),
                t(ramp(4)),
                t(Tensor::zeros(&[8], DType::F32)
                    .unwrap()
                    .as_strided(&[4], &[-2], 7)
                    .unwrap()),
            ]
        },
        &w("strided and reversed views")
    ));
    // The same input twice is fine (both only read).
    assert!(same(
        &m,
        &|| {
            let x = ramp(3);
            vec![t(x.clone()), t(x), t(ramp(3))]
        },
        &w("an input passed twice")
    ));
    let bad: Vec<(&str, Args)> = vec![
        (
            "mismatched n",
            Box::new(|| vec![t(ramp(5)), t(ramp(4)), t(ramp(5))]),
        ),
        (
            "wrong dtype",
            Box::new(|| {
                vec![
                    t(ramp(2)),
                    t(Tensor::zeros(&[2], DType::F64).unwrap()),
                    t(ramp(2)),
                ]
            }),
        ),
        (
            "wrong rank",
            Box::new(|| {
                vec![
                    t(ramp(2)),
                    t(ramp(2)),
                    t(Tensor::zeros(&[2, 1], DType::F32).unwrap()),
                ]
            }),
        ),
        (
            "non-tensor",
            Box::new(|| vec![t(ramp(2)), Value::Int(3), t(ramp(2))]),
        ),
        (
            "too many",
            Box::new(|| vec![t(ramp(2)), t(ramp(2)), t(ramp(2)), t(ramp(2))]),
        ),
        (
            "read-only output",
            Box::new(|| vec![t(ramp(2)), t(ramp(2)), t(ramp(2).to_read_only())]),
        ),
        (
            "output aliases an input",
            Box::new(|| {
                let x = ramp(3);
                vec![t(x.clone()), t(ramp(3)), t(x)]
            }),
        ),
        (
            "output overlaps an input's view",
            Box::new(|| {
                let x = ramp(6);
                vec![
                    t(x.as_strided(&[3], &[1], 0).unwrap()),
                    t(ramp(3)),
                    t(x.as_strided(&[3], &[1], 2).unwrap()),
                ]
            }),
        ),
        (
            "self-overlapping output near 2^62",
            Box::new(|| {
                let n = 1i64 << 62;
                let one = ramp(1);
                vec![
                    t(one.as_strided(&[n], &[0], 0).unwrap()),
                    t(one.as_strided(&[n], &[0], 0).unwrap()),
                    t(ramp(1).as_strided(&[n], &[0], 0).unwrap()),
                ]
            }),
        ),
    ];
    for (what, make) in &bad {
        assert!(!same(&m, make.as_ref(), &w(what)), "{}", w(what));
    }
    // Inputs only: outputs are allocated, which is the full path's job.
    assert!(!same(
        &m,
        &|| vec![t(ramp(3)), t(ramp(3))],
        &w("allocated output")
    ));
}

fn fast_path_runs_bounds_checks_and_huge_dims(target: &Target) {
    let m = strided_gather(target);
    assert!(
        !m.funcs[0].func.checks.is_empty(),
        "the gather keeps a per-call check"
    );
    let w = |s: &str| format!("{target} gather: {s}");
    assert!(same(
        &m,
        &|| vec![t(ramp(9)), t(Tensor::zeros(&[5], DType::F32).unwrap())],
        &w("2n-1 = m")
    ));
    assert!(!same(
        &m,
        &|| vec![t(ramp(8)), t(ramp(5))],
        &w("2n-1 > m: the check fails")
    ));
    // m near 2^62 (a stride-0 view of one element): the check holds; n small.
    assert!(same(
        &m,
        &|| vec![
            t(ramp(1).as_strided(&[(1i64 << 62) + 1], &[0], 0).unwrap()),
            t(ramp(4))
        ],
        &w("m = 2^62 + 1")
    ));
    // m = i64::MAX elements of stride 0 and n = 3: still inside.
    assert!(same(
        &m,
        &|| vec![
            t(ramp(1).as_strided(&[i64::MAX], &[0], 0).unwrap()),
            t(ramp(3))
        ],
        &w("m = i64::MAX")
    ));
}

fn fast_path_fixed_shapes(target: &Target) {
    let m = fixed(target);
    let a = || Tensor::from_slice(&[1.0f64, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
    let w = |s: &str| format!("{target} fixed: {s}");
    assert!(same(
        &m,
        &|| vec![t(a()), t(Tensor::zeros(&[2, 3], DType::F64).unwrap())],
        &w("valid")
    ));
    assert!(same(
        &m,
        &|| vec![
            t(a().as_strided(&[2, 3], &[1, 2], 0).unwrap()),
            t(Tensor::zeros(&[3, 2], DType::F64)
                .unwrap()
                .as_strided(&[2, 3], &[1, 2], 0)
                .unwrap())
        ],
        &w("transposed views")
    ));
    assert!(!same(
        &m,
        &|| vec![t(a()), t(Tensor::zeros(&[2, 4], DType::F64).unwrap())],
        &w("size 4 for 3")
    ));
    assert!(!same(
        &m,
        &|| vec![t(a()), t(Tensor::zeros(&[3, 2], DType::F64).unwrap())],
        &w("transposed shape")
    ));
}

#[test]
fn plan_declines_what_it_does_not_cover() {
    // Dims given by an expression (n - 2) are the full path's.
    let n = te::var("n");
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let c = compute([&n - 2], |[i]| a.at([i + 2]), "C").unwrap();
    let m = module(&[c.clone()], &[a, c], "cpu");
    let comp: &Arc<_> = &m.funcs[0];
    assert!(CallPlan::new(comp).is_none());
    assert!(!same(&m, &|| vec![t(ramp(5)), t(ramp(3))], "n - 2 dims"));
}

/// One function called again and again with changing shapes: the plan remembers the dims of
/// its last accepted call (checks and work are functions of the dims), and a call with other
/// dims must be checked afresh. Every call's outcome is the full path's.
fn fast_path_memo_never_carries_a_check_over_to_other_dims(target: &Target) {
    let m = strided_gather(target);
    let c = m.funcs[0].clone();
    let fast: Function = make_function(c.clone());
    let full: Function = make_function_full_path(c.clone());
    let plan = CallPlan::new(&c).expect("planned");
    // (len of A, len of C): the check is 2 n - 1 <= m. A of more than 8 elements is a
    // stride-0 view of one, so m may be near 2^62 or i64::MAX.
    let calls: [(i64, i64); 11] = [
        (9, 5),
        (9, 5),
        (8, 5), // fails: 9 > 8
        (9, 5),
        (3, 2),
        (2, 2), // fails: 3 > 2
        (2, 2), // fails again, right after a failure
        (i64::MAX, 5),
        ((1 << 62) + 1, 3),
        (8, 5), // fails after huge dims were accepted
        (9, 5),
    ];
    for (k, &(ma, nc)) in calls.iter().enumerate() {
        let a = move || {
            if ma <= 8 {
                ramp(ma as usize)
            } else {
                ramp(1).as_strided(&[ma], &[0], 0).unwrap()
            }
        };
        let make = || vec![t(a()), t(Tensor::zeros(&[nc], DType::F32).unwrap())];
        let (a1, a2) = (make(), make());
        let (r1, r2) = (rivet_tests::call(&fast, &a1), rivet_tests::call(&full, &a2));
        let what = format!("{target} call {k}: m = {ma}, n = {nc}");
        match (&r1, &r2) {
            (Ok(_), Ok(_)) => assert_eq!(contents(&a1), contents(&a2), "{what}"),
            (Err(e1), Err(e2)) => assert_eq!(e1.to_string(), e2.to_string(), "{what}"),
            _ => panic!("{what}: fast path {r1:?}, full path {r2:?}"),
        }
        let accepted = plan.accept(&c, &on_device(&fast, make())).is_some();
        assert_eq!(accepted, 2 * nc - 1 <= ma, "{what}: the plan's verdict");
        assert_eq!(r2.is_ok(), accepted, "{what}: the full path's verdict");
    }
}

// CUDA functions take no fast path (`CallPlan::new` declines them): host code only.
rivet_tests::for_each_backend! {
    host_code:
        fast_path_accepts_exactly_what_the_full_path_accepts,
        fast_path_runs_bounds_checks_and_huge_dims,
        fast_path_fixed_shapes,
        fast_path_memo_never_carries_a_check_over_to_other_dims;
}
