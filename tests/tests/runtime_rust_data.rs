//! Rust data through the runtime without Python: tensors made from `Vec`s and `ndarray`
//! arrays (no copies) run `testing.axpy`, and the results come back without copies; random
//! ndarray layouts (steps, flips, transposes, offsets) keep their elements.

use ndarray::{s, Array, ArrayD, Axis, IxDyn, SliceInfoElem};
use proptest::prelude::*;
use rivet_runtime::{registry, DType, Error, Tensor, Value};

fn axpy(alpha: f64, x: &Tensor, y: &Tensor) -> Result<Value, Error> {
    registry::get("testing.axpy").unwrap().call(&[
        Value::Float(alpha),
        Value::Tensor(x.clone()),
        Value::Tensor(y.clone()),
    ])
}

#[test]
fn axpy_on_vecs_writes_the_vec_in_place() {
    let x: Vec<f64> = (0..12).map(f64::from).collect();
    let y = vec![1.0f64; 12];
    let yptr = y.as_ptr();
    let (x, y) = (
        Tensor::from_vec(x, &[3, 4]).unwrap(),
        Tensor::from_vec(y, &[3, 4]).unwrap(),
    );
    axpy(2.0, &x, &y).unwrap();
    // The call's clones are gone: `y` is the only handle, so its Vec comes back as it was
    // lent, holding the kernel's result.
    let out = y.into_vec::<f64>().unwrap();
    assert_eq!(out.as_ptr(), yptr);
    assert_eq!(
        out,
        (0..12).map(|i| 2.0 * i as f64 + 1.0).collect::<Vec<_>>()
    );
}

#[test]
fn axpy_errors_on_vec_tensors_name_the_argument() {
    let x = Tensor::from_vec(vec![1f32; 4], &[4]).unwrap();
    let y = Tensor::from_vec(vec![1f64; 4], &[4]).unwrap();
    let e = axpy(1.0, &x, &y).unwrap_err();
    assert!(matches!(e, Error::DType(_)), "{e}");
    let y = Tensor::from_vec(vec![1i32; 4], &[2, 2]).unwrap();
    assert!(axpy(1.0, &x, &y).is_err());
}

#[test]
fn axpy_on_ndarray_layouts() {
    // x reversed (negative strides), y transposed: both taken without copies.
    let x = Array::from_shape_vec((4, 3), (0..12).map(|i| i as f32).collect()).unwrap();
    let x = x.slice_move(s![..;-1, ..]);
    let xptr = x.as_ptr();
    let y = Array::from_elem((3, 4), 10f32).reversed_axes();
    let yptr = y.as_ptr();
    let expect = &x * 0.5 + &y;
    let (xt, mut yt) = (
        Tensor::from_ndarray(x).unwrap(),
        Tensor::from_ndarray(y).unwrap(),
    );
    assert_eq!(xt.data_ptr() as *const f32, xptr);
    assert_eq!(yt.data_ptr() as *const f32, yptr);
    assert_eq!(
        (xt.strides(), yt.strides()),
        (&[-3i64, 1][..], &[1i64, 4][..])
    );
    axpy(0.5, &xt, &yt).unwrap();
    assert_eq!(yt.view_ndarray::<f32>().unwrap(), expect.view().into_dyn());
    assert_eq!(yt.to_ndarray::<f32>().unwrap(), expect.into_dyn());
}

#[test]
fn ndarray_edge_cases() {
    // Empty arrays, in any dims, sliced or not.
    let e = ArrayD::<f64>::zeros(IxDyn(&[3, 0, 2]));
    let mut t = Tensor::from_ndarray(e).unwrap();
    assert_eq!((t.shape(), t.numel()), (&[3i64, 0, 2][..], 0));
    assert_eq!(t.view_ndarray::<f64>().unwrap().shape(), &[3, 0, 2]);
    let sliced = Array::from_elem((4, 4), 1u8).slice_move(s![2..2, ..;-1]);
    assert_eq!(Tensor::from_ndarray(sliced).unwrap().numel(), 0);
    // A 0-d array.
    let mut z = Tensor::from_ndarray(ndarray::arr0(5i64)).unwrap();
    assert_eq!((z.ndim(), z.as_slice::<i64>().unwrap()), (0, &[5i64][..]));
    // Broadcast views (zero strides): a copy through to_ndarray, and a view when alone.
    let t = Tensor::from_vec(vec![1i32, 2, 3], &[3]).unwrap();
    let mut b = t.as_strided(&[2, 3], &[0, 1], 0).unwrap();
    assert_eq!(
        b.to_ndarray::<i32>().unwrap(),
        ndarray::array![[1, 2, 3], [1, 2, 3]].into_dyn()
    );
    assert!(matches!(b.view_ndarray::<i32>(), Err(Error::Layout(_))));
    drop(t);
    let v = b.view_ndarray::<i32>().unwrap();
    assert_eq!(v.strides(), &[0, 1]);
    assert_eq!(v, ndarray::array![[1, 2, 3], [1, 2, 3]].into_dyn());
    // Dtype and device checks.
    let mut f = Tensor::zeros(&[2], DType::F32).unwrap();
    assert!(matches!(f.view_ndarray::<f64>(), Err(Error::DType(_))));
    assert!(matches!(f.to_ndarray::<i32>(), Err(Error::DType(_))));
}

/// A random owned ndarray layout: shape, then per axis a step (either sign) and a start,
/// then an optional transpose.
fn layout() -> impl Strategy<Value = (Vec<usize>, Vec<(isize, usize)>, bool)> {
    prop::collection::vec(0usize..5, 0..4).prop_flat_map(|shape| {
        let n = shape.len();
        (
            Just(shape),
            prop::collection::vec((prop_oneof![-3isize..=-1, 1isize..=3], 0usize..3), n),
            any::<bool>(),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn ndarray_layouts_survive_without_copies((shape, slices, transpose) in layout()) {
        let n: usize = shape.iter().product();
        let a = ArrayD::from_shape_vec(IxDyn(&shape), (0..n as i32).collect()).unwrap();
        let info: Vec<SliceInfoElem> = slices
            .iter()
            .zip(&shape)
            .map(|(&(step, start), &d)| SliceInfoElem::Slice {
                start: start.min(d) as isize,
                end: None,
                step,
            })
            .collect();
        let mut a = a.slice_move(info.as_slice());
        if transpose {
            a = a.reversed_axes();
        }
        if a.ndim() > 1 {
            a.invert_axis(Axis(1));
        }
        let (expect, ptr, empty) = (a.clone(), a.as_ptr(), a.is_empty());
        let mut t = Tensor::from_ndarray(a).unwrap();
        let strides: Vec<i64> = expect.strides().iter().map(|&s| s as i64).collect();
        let dims: Vec<i64> = expect.shape().iter().map(|&d| d as i64).collect();
        prop_assert_eq!(t.shape(), dims.as_slice());
        if !empty {
            prop_assert_eq!(t.data_ptr() as *const i32, ptr);
            prop_assert_eq!(t.strides(), strides.as_slice());
        }
        prop_assert_eq!(t.to_vec::<i32>().unwrap(), expect.iter().copied().collect::<Vec<_>>());
        prop_assert_eq!(&t.to_ndarray::<i32>().unwrap(), &expect);
        let v = t.view_ndarray::<i32>().unwrap();
        prop_assert_eq!(&v, &expect.view());
        if !empty {
            prop_assert_eq!(v.as_ptr(), ptr);
        }
    }
}
