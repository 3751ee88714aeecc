//! Unit tests of the gradient's pieces: the shape of what it builds (which index maps are
//! inverted, which fall back to masked sums, which guards are left out), and its errors.
//! Numerical correctness is checked end to end in tests/tests/grad_numeric.rs.

use super::*;
use crate::te::{compute, placeholder, reduce_axis, sum};

fn ph(shape: &[i64], name: &str) -> Tensor {
    placeholder(shape, DType::F64, name).unwrap()
}

fn body_text(t: &Tensor) -> String {
    t.body().unwrap().to_string()
}

#[test]
fn matmul_operand_gradients_are_plain_contractions_without_guards() {
    let a = ph(&[3, 4], "A");
    let b = ph(&[4, 5], "B");
    let k = reduce_axis(0, 4, "k").unwrap();
    let c = compute([3, 5], |[i, j]| sum(a.at((i, &k)) * b.at((&k, j)), &k), "C").unwrap();
    let g = gradient(&c, &[a.clone(), b.clone()], None).unwrap();
    for t in &g {
        // One reduction over C's other axis, no select: i and k were solved exactly.
        assert_eq!(t.reduce_axis().len(), 1, "{}", body_text(t));
        assert!(!body_text(t).contains("select"), "{}", body_text(t));
    }
    assert_eq!(g[0].shape(), a.shape());
    assert_eq!(g[1].shape(), b.shape());
}

#[test]
fn a_shifted_read_solves_the_data_parallel_variable_with_a_range_guard() {
    // Y[y] = sum_r X[y + r] W[r]: dX solves y = j - r and sums over r (3 terms), guarded.
    let x = ph(&[8], "X");
    let w = ph(&[3], "W");
    let r = reduce_axis(0, 3, "r").unwrap();
    let y = compute([6], |[i]| sum(x.at([i + &r]) * w.at([&r]), &r), "Y").unwrap();
    let g = gradient(&y, &[x], None).unwrap();
    let raxes = g[0].reduce_axis();
    assert_eq!(raxes.len(), 1);
    assert_eq!(raxes[0].extent.as_int(), Some(3), "sums over r, not over y");
    assert!(body_text(&g[0]).contains(">="), "{}", body_text(&g[0]));
}

#[test]
fn an_unsolvable_index_becomes_an_equality_guard() {
    let x = ph(&[4], "X");
    let y = compute([2], |[i]| x.at([i * 2]), "Y").unwrap();
    let g = gradient(&y, &[x], None).unwrap();
    assert!(body_text(&g[0]).contains("=="), "{}", body_text(&g[0]));
    assert_eq!(g[0].reduce_axis()[0].extent.as_int(), Some(2));
}

#[test]
fn a_stage_read_twice_gets_the_sum_of_both_contributions() {
    let x = ph(&[4], "X");
    let h = compute([4], |[i]| crate::te::exp(x.at([i])), "h").unwrap();
    let y = compute([4], |[i]| h.at([i]) * 2.0, "y").unwrap();
    let z = compute([4], |[i]| h.at([&i]) + y.at([i]), "z").unwrap();
    let g = gradient(&z, &[h], None).unwrap();
    // Two inline terms (1 from z, 2 from y) in one stage.
    let text = body_text(&g[0]);
    assert!(text.contains('+'), "{text}");
    assert!(g[0].reduce_axis().is_empty());
}

#[test]
fn errors_name_the_argument_and_what_came() {
    let x = ph(&[2], "X");
    let y = compute([2], |[i]| x.at([i]) * 3.0, "Y").unwrap();
    let h = placeholder([2], DType::F32, "Hd").unwrap();
    let e = gradient(&y, &[x.clone()], Some(&h))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("head") && e.contains("'Hd'") && e.contains("float32"),
        "{e}"
    );
    assert!(matches!(
        gradient(&y, &[x.clone()], Some(&h)),
        Err(Error::Runtime(rivet_runtime::Error::Argument(_)))
    ));
    let i = placeholder([2], DType::I64, "Idx").unwrap();
    let e = gradient(&y, &[x, i], None).unwrap_err().to_string();
    assert!(e.contains("inputs[1]") && e.contains("int64"), "{e}");
}

#[test]
fn gradients_of_the_output_itself_and_of_the_head_are_copies() {
    let x = ph(&[2], "X");
    let y = compute([2], |[i]| x.at([i]) * 3.0, "Y").unwrap();
    let h = ph(&[2], "H");
    let g = gradient(&y, &[y.clone()], Some(&h)).unwrap();
    assert!(!g[0].is_placeholder());
    assert_eq!(body_text(&g[0]), format!("H[{}]", g[0].axis()[0].var.name));
    let g = gradient(&y, &[y.clone()], None).unwrap();
    assert!(!g[0].is_placeholder());
}

#[test]
fn derivative_constants_fold_ones_and_zeros() {
    let x = Expr::var(&Var::new("x"));
    let one = constant(1.0, DType::F64);
    let xf = Expr::cast(DType::F64, x);
    assert!(algebra::mul(&one, &xf).unwrap().same(&xf));
    assert!(algebra::add(&constant(0.0, DType::F64), &xf)
        .unwrap()
        .same(&xf));
    let n = algebra::neg(&algebra::neg(&xf).unwrap()).unwrap();
    assert!(n.same(&xf));
}

#[test]
fn an_input_listed_twice_gets_two_distinct_stages() {
    let x = ph(&[2], "X");
    let y = compute([2], |[i]| x.at([i]) * 3.0, "Y").unwrap();
    let g = gradient(&y, &[x.clone(), x], None).unwrap();
    assert_ne!(g[0], g[1]);
}

#[test]
fn a_derivative_past_the_depth_limit_is_an_error_naming_the_stage() {
    let x = ph(&[2], "X");
    let y = compute(
        [2],
        |[i]| {
            let mut e = x.at([i]);
            for _ in 0..900 {
                e = crate::te::tanh(e);
            }
            e
        },
        "Deep",
    )
    .unwrap();
    let e = gradient(&y, &[x], None).unwrap_err().to_string();
    assert!(e.contains("'Deep'") && e.contains("MAX_EXPR_DEPTH"), "{e}");
}

/// `Y[i, j] = -(X[i, j] * W[i]) / D[i]`: the adjoint of the row factor `W` sums over `j`,
/// and the factors that do not depend on `j` (the sign, `1 / D[i]`) are taken out of the sum:
/// one partial-sum stage (`<x>_grad_<c>_sum`) of the varying part, and the contribution an
/// elementwise stage applying the rest to it.
#[test]
fn factors_free_of_the_summed_variables_are_taken_out_of_the_sum() {
    let x = ph(&[3, 5], "X");
    let w = ph(&[3], "W");
    // Y[i, j] = X[i, j] * W[i]: dW[i] = sum_j head[i, j] * X[i, j]; with a factor 1/D[i]
    // free of j in the body, it is applied after the sum.
    let d = ph(&[3], "D");
    let y = compute(
        [3, 5],
        |[i, j]| -(x.at([&i, &j]) * w.at([&i])) / d.at([i]),
        "Y",
    )
    .unwrap();
    let g = gradient(&y, &[w.clone()], None).unwrap();
    let text = body_text(&g[0]);
    assert!(g[0].reduce_axis().is_empty(), "{text}");
    assert!(text.contains("W_grad_Y_sum"), "{text}");
    assert!(
        text.contains("D["),
        "the free factor is applied after the sum: {text}"
    );
    let partial = reads_of(&g[0])
        .into_iter()
        .find(|t| t.name() == "W_grad_Y_sum")
        .expect("the partial sum");
    let ptext = body_text(&partial);
    assert!(
        !ptext.contains("D["),
        "the sum is of the varying part only: {ptext}"
    );
    // A symbolic extent may be empty, where `(sum of nothing) * c` would be NaN for an
    // infinite `c`: the factored sum is taken under a guard that the extent is >= 1 (0
    // otherwise, the empty sum's value). `tests/tests/grad_numeric.rs` runs it at n = 0 with D = 0.
    let n = crate::te::var("n");
    let xs = placeholder((3, &n), DType::F64, "Xs").unwrap();
    let ys = compute(
        (3, n),
        |[i, j]| xs.at([&i, &j]) * w.at([&i]) / d.at([i]),
        "Ys",
    )
    .unwrap();
    let g = gradient(&ys, std::slice::from_ref(&w), None).unwrap();
    let text = body_text(&g[0]);
    assert!(g[0].reduce_axis().is_empty(), "{text}");
    assert!(
        text.starts_with("select((n >= 1), ")
            && text.contains("D[")
            && text.ends_with(", 0.0:float64)"),
        "{text}"
    );
    // A constant empty extent needs no guard: nothing is factored, the sum stays a sum.
    let xe = placeholder([3, 0], DType::F64, "Xe").unwrap();
    let ye = compute(
        [3, 0],
        |[i, j]| xe.at([&i, &j]) * w.at([&i]) / d.at([i]),
        "Ye",
    )
    .unwrap();
    let g = gradient(&ye, &[w], None).unwrap();
    assert!(
        !body_text(&g[0]).contains("select((n"),
        "{}",
        body_text(&g[0])
    );
}

/// A keepdims row statistic `S[i, 0]` (shape `[n, 1]`, as `rivet.kernels` writes softmax and
/// layer_norm): its adjoint needs no `0 == j1` guard (the dim has one index), and the adjoint
/// of `X` through `S` has no sum over `S`'s axis of extent 1 (the term itself). Symbolic `n`
/// and `m` as in the kernel library. Numbers: tests/tests/grad_numeric.rs.
#[test]
fn keepdims_row_statistics_need_no_guard_and_no_sum_of_one_term() {
    let (n, m) = (crate::te::var("n"), crate::te::var("m"));
    let x = placeholder((&n, &m), DType::F64, "X").unwrap();
    let r = reduce_axis(0, &m, "r").unwrap();
    let s = compute((&n, 1), |[i, _k]| sum(x.at((i, &r)), &r), "S").unwrap();
    let y = compute((&n, &m), |[i, j]| x.at([&i, &j]) * s.at((i, 0)), "Y").unwrap();
    let g = gradient(&y, std::slice::from_ref(&x), None).unwrap();
    let mut stages = reads_of(&g[0]);
    stages.push(g[0].clone());
    let mut seen_s = false;
    for t in &stages {
        let text = body_text(t);
        assert!(
            !text.contains("=="),
            "no equality guard: {}: {text}",
            t.name()
        );
        for ra in t.reduce_axis() {
            assert_ne!(
                ra.extent.as_int(),
                Some(1),
                "no sum of one term: {}: {text}",
                t.name()
            );
        }
        seen_s |= t.name().starts_with("S_grad");
    }
    assert!(seen_s, "S's adjoint is a stage: {stages:?}");
}
