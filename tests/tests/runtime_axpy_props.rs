//! `testing.axpy` on random shapes, strides (transposed, stepped, reversed, broadcast x)
//! and sizes around the parallel threshold, against an element-by-element reference.
//! Elements of the output buffer outside the view must stay untouched.

use proptest::prelude::*;
use rivet_runtime::{registry, Error, Tensor, Value};

/// A random view over a fresh buffer: a permutation of dims, steps and flips.
#[derive(Debug, Clone)]
struct ViewSpec {
    shape: Vec<i64>,
    perm: Vec<usize>,
    steps: Vec<i64>,
    flips: Vec<bool>,
}

fn view_spec() -> impl Strategy<Value = ViewSpec> {
    prop::collection::vec(0i64..6, 0..4)
        .prop_flat_map(|shape| {
            let n = shape.len();
            (
                Just(shape),
                Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
                prop::collection::vec(1i64..3, n),
                prop::collection::vec(any::<bool>(), n),
            )
        })
        .prop_map(|(shape, perm, steps, flips)| ViewSpec {
            shape,
            perm,
            steps,
            flips,
        })
}

/// Builds the view: a compact base whose dims are `shape[perm[i]] * steps`, viewed back to
/// `shape` with the dims permuted, stepped and possibly reversed.
fn make_view(spec: &ViewSpec, fill: impl Fn(usize) -> f64) -> (Tensor, Tensor) {
    let n = spec.shape.len();
    let base_shape: Vec<i64> = (0..n)
        .map(|i| spec.shape[spec.perm[i]].max(1) * spec.steps[i])
        .collect();
    let total: i64 = base_shape.iter().product();
    let values: Vec<f64> = (0..total as usize).map(fill).collect();
    let base = Tensor::from_slice(&values, &base_shape).unwrap();
    let base_strides = base.strides().to_vec();
    // dim d of the view is base dim i where perm[i] == d
    let mut strides = vec![0i64; n];
    let mut offset = 0i64;
    for (i, &d) in spec.perm.iter().enumerate() {
        let mut s = base_strides[i] * spec.steps[i];
        if spec.flips[i] && spec.shape[d] > 0 {
            offset += (spec.shape[d] - 1) * s;
            s = -s;
        }
        strides[d] = s;
    }
    let view = base.as_strided(&spec.shape, &strides, offset).unwrap();
    (base, view)
}

/// Indices into the compact `base` of every element of `view`.
fn view_base_indices(base: &Tensor, view: &Tensor) -> Vec<i64> {
    let start = (view.data_ptr() as i64 - base.data_ptr() as i64) / 8;
    let shape = view.shape();
    let n: i64 = shape.iter().product();
    (0..n)
        .map(|mut flat| {
            let mut off = start;
            for d in (0..shape.len()).rev() {
                off += (flat % shape[d]) * view.strides()[d];
                flat /= shape[d];
            }
            off
        })
        .collect()
}

fn call(alpha: f64, x: &Tensor, y: &Tensor) -> Result<Value, Error> {
    registry::get("testing.axpy").unwrap().call(&[
        Value::Float(alpha),
        Value::Tensor(x.clone()),
        Value::Tensor(y.clone()),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn strided_axpy_matches_reference(xs in view_spec(), yperm in any::<prop::sample::Index>(), alpha in -3.0f64..3.0) {
        // y gets the same logical shape with its own random layout.
        let n = xs.shape.len();
        let mut ys = xs.clone();
        if n > 1 {
            ys.perm.rotate_left(yperm.index(n));
        }
        ys.flips.iter_mut().for_each(|f| *f = !*f);
        let (_xb, x) = make_view(&xs, |i| (i as f64 * 0.37).sin());
        let (yb, y) = make_view(&ys, |i| (i as f64 * 0.11).cos() + 2.0);
        let before_base = yb.to_vec::<f64>().unwrap();
        let xv = x.to_vec::<f64>().unwrap();
        let yv = y.to_vec::<f64>().unwrap();
        call(alpha, &x, &y).unwrap();
        let got = y.to_vec::<f64>().unwrap();
        for i in 0..got.len() {
            prop_assert_eq!(got[i], alpha * xv[i] + yv[i]);
        }
        // Elements of y's buffer outside the view are untouched, bit for bit.
        let inside: std::collections::HashSet<i64> = view_base_indices(&yb, &y).into_iter().collect();
        let after_base = yb.to_vec::<f64>().unwrap();
        for (i, (a, b)) in after_base.iter().zip(&before_base).enumerate() {
            if !inside.contains(&(i as i64)) {
                prop_assert_eq!(a.to_bits(), b.to_bits(), "base element {} outside the view changed", i);
            }
        }
    }

    #[test]
    fn broadcast_x_and_large_sizes(rows in 1i64..70, cols in prop::sample::select(vec![1i64, 3, 1000, 17000, 70000])) {
        let x = Tensor::from_slice(&(0..cols).map(|i| i as f32).collect::<Vec<_>>(), &[1, cols]).unwrap();
        let xb = x.as_strided(&[rows, cols], &[0, 1], 0).unwrap();
        let y = Tensor::from_slice(&vec![1f32; (rows * cols) as usize], &[rows, cols]).unwrap();
        call(2.0, &xb, &y).unwrap();
        let got = y.to_vec::<f32>().unwrap();
        for r in 0..rows {
            for c in 0..cols {
                prop_assert_eq!(got[(r * cols + c) as usize], 2.0 * c as f32 + 1.0);
            }
        }
    }
}

#[test]
fn same_tensor_in_and_out() {
    let y = Tensor::from_slice(&[1f64, 2., 3.], &[3]).unwrap();
    call(1.5, &y, &y).unwrap();
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![2.5, 5.0, 7.5]);
}

#[test]
fn bad_inputs_have_the_documented_errors() {
    let x = Tensor::zeros(&[4], rivet_runtime::DType::F32).unwrap();
    let y = Tensor::zeros(&[4], rivet_runtime::DType::F32).unwrap();
    let f = registry::get("testing.axpy").unwrap();
    let e = f
        .call(&[Value::Float(1.0), Value::Tensor(x.clone())])
        .unwrap_err();
    assert!(matches!(e, Error::Argument(_)), "{e}");
    let e = f
        .call(&[
            Value::from("a"),
            Value::Tensor(x.clone()),
            Value::Tensor(y.clone()),
        ])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("argument 0 ('alpha') expected float, got str"),
        "{e}"
    );
    let i = Tensor::zeros(&[4], rivet_runtime::DType::I32).unwrap();
    assert!(matches!(call(1.0, &i, &y), Err(Error::DType(_))));
    let b = y.as_strided(&[2, 4], &[0, 1], 0).unwrap();
    let x2 = Tensor::zeros(&[2, 4], rivet_runtime::DType::F32).unwrap();
    assert!(matches!(call(1.0, &x2, &b), Err(Error::Layout(_))));
    assert!(matches!(
        call(1.0, &x, &y.to_read_only()),
        Err(Error::ReadOnly(_))
    ));
}
