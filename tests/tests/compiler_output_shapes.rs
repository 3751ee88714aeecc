//! `Function::output_shapes` of compiled functions against the call itself: for random input
//! shapes, the rule answers exactly the shapes and dtypes an inputs-only call allocates, and
//! refuses (with the same error kind) exactly the shapes the call refuses. Hostile sizes
//! (near i64::MAX, negative, inconsistent symbolic dims) included.

use proptest::prelude::*;
use rivet_compiler::te::{self, compute, placeholder};
use rivet_compiler::{build, Schedule};
use rivet_runtime::{DType, Function, Tensor, Value};

fn built(outs: &[te::Tensor], args: &[te::Tensor]) -> Function {
    let s = Schedule::new(outs).unwrap();
    build(&s, args, "cpu", "f")
        .unwrap()
        .get_function("f")
        .unwrap()
}

/// A[n, m], B[m] -> C[n, m] = A + B, D[n + 1] = 1 (an expression dim), E[n] = sum_j A (f64).
fn program() -> Function {
    let (n, m) = (te::var("n"), te::var("m"));
    let a = placeholder([&n, &m], DType::F32, "A").unwrap();
    let b = placeholder([&m], DType::F32, "B").unwrap();
    let c = compute([&n, &m], |[i, j]| a.at([&i, &j]) + b.at([j]), "C").unwrap();
    let d = compute([&n + 1], |[_]| te::constant(1.0, DType::F32), "D").unwrap();
    let k = te::reduce_axis(0, &m, "k").unwrap();
    let e = compute(
        [&n],
        |[i]| te::sum(te::cast(DType::F64, a.at((i, &k))), &k),
        "E",
    )
    .unwrap();
    built(&[c.clone(), d.clone(), e.clone()], &[a, b, c, d, e])
}

/// The shapes an inputs-only call returns, or its error kind.
fn by_call(f: &Function, shapes: &[Vec<i64>]) -> Result<Vec<(Vec<i64>, DType)>, &'static str> {
    let args: Vec<Value> = shapes
        .iter()
        .map(|s| Value::Tensor(Tensor::zeros(s, DType::F32).unwrap()))
        .collect();
    match f.call(&args) {
        Ok(Value::List(outs)) => Ok(outs
            .iter()
            .map(|v| {
                let t = v.as_tensor().unwrap();
                (t.shape().to_vec(), t.dtype())
            })
            .collect()),
        Ok(Value::Tensor(t)) => Ok(vec![(t.shape().to_vec(), t.dtype())]),
        Ok(other) => panic!("unexpected result {other:?}"),
        Err(e) => Err(e.kind_name()),
    }
}

fn by_rule(f: &Function, shapes: &[Vec<i64>]) -> Result<Vec<(Vec<i64>, DType)>, &'static str> {
    let refs: Vec<&[i64]> = shapes.iter().map(|s| s.as_slice()).collect();
    f.output_shapes(&refs, None).map_err(|e| e.kind_name())
}

#[test]
fn the_rule_answers_what_the_call_allocates() {
    let f = program();
    let got = by_rule(&f, &[vec![3, 5], vec![5]]).unwrap();
    assert_eq!(
        got,
        vec![
            (vec![3, 5], DType::F32),
            (vec![4], DType::F32),
            (vec![3], DType::F64)
        ]
    );
    assert_eq!(by_call(&f, &[vec![3, 5], vec![5]]).unwrap(), got);
    assert_eq!(by_rule(&f, &[vec![0, 0], vec![0]]).unwrap()[1].0, vec![1]);
}

#[test]
fn hostile_shapes_are_refused_like_the_call_refuses_them() {
    let f = program();
    for (shapes, kind, needle) in [
        (vec![vec![3, 5], vec![4]], "ShapeError", "'B'"),
        (vec![vec![3], vec![3]], "ShapeError", "rank"),
        (vec![vec![3, 5]], "ArgumentError", "takes 2 inputs"),
        (vec![vec![-1, 5], vec![5]], "ShapeError", "negative"),
        (vec![vec![i64::MAX, 0], vec![0]], "ShapeError", "overflows"),
    ] {
        let refs: Vec<&[i64]> = shapes.iter().map(|s| s.as_slice()).collect();
        let e = f.output_shapes(&refs, None).unwrap_err();
        assert_eq!(e.kind_name(), kind, "{shapes:?}: {e}");
        assert!(e.to_string().contains(needle), "{shapes:?}: {e}");
    }
    // Dtypes, when given, are checked against the signature first.
    let e = f
        .output_shapes(&[&[3, 5], &[5]], Some(&[DType::F32, DType::F64]))
        .unwrap_err();
    assert_eq!(e.kind_name(), "DTypeError");
    assert!(
        e.to_string().contains("argument 1 ('B') has dtype float64"),
        "{e}"
    );
    assert!(f
        .output_shapes(&[&[3, 5], &[5]], Some(&[DType::F32, DType::F32]))
        .is_ok());
    // A dim known only from an output: the rule cannot answer.
    let n = te::var("n");
    let c = compute([n], |[_]| te::constant(0.0, DType::F32), "C").unwrap();
    let g = built(&[c.clone()], &[c]);
    let e = g.output_shapes(&[], None).unwrap_err();
    assert!(e.to_string().contains("only known from an output"), "{e}");
    // Functions that are not compiled say they cannot.
    let nop = rivet_runtime::registry::get("testing.nop").unwrap();
    assert!(nop
        .output_shapes(&[], None)
        .unwrap_err()
        .to_string()
        .contains("cannot say"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn rule_and_call_agree_on_random_shapes(
        n in 0i64..6, m in 0i64..6, m2 in 0i64..6, rank_a in 1usize..4,
    ) {
        let f = program();
        let mut a = vec![n, m];
        a.truncate(rank_a);
        while a.len() < rank_a { a.push(1); }
        let shapes = vec![a, vec![m2]];
        prop_assert_eq!(by_rule(&f, &shapes), by_call(&f, &shapes));
    }
}
