//! Float tensors for tests that run one program in float32 and float64: reference values are
//! drawn and compared as `f64`, and converted at the edge (`tensor_of`, `values_f64`, `bits`).
//! Conversions to float32 round to nearest, so a float32 run sees the float64 draw rounded.

use rivet_runtime::{DType, Tensor};

/// A tensor of `shape` holding `v`, as float32 (rounded) when `dt` is F32, else float64.
pub fn tensor_of(v: &[f64], shape: &[i64], dt: DType) -> Tensor {
    match dt {
        DType::F32 => {
            let w: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            Tensor::from_slice(&w, shape).unwrap()
        }
        _ => Tensor::from_slice(v, shape).unwrap(),
    }
}

/// The elements of a float32 (when `dt` is F32) or float64 tensor, as `f64` (exact).
pub fn values_f64(t: &Tensor, dt: DType) -> Vec<f64> {
    match dt {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&x| x as f64)
            .collect(),
        _ => t.to_vec::<f64>().unwrap(),
    }
}

/// The bits of each element of a float32 (when `dt` is F32) or float64 tensor: for
/// comparisons bit for bit, NaNs included.
pub fn bits(t: &Tensor, dt: DType) -> Vec<u64> {
    match dt {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits() as u64)
            .collect(),
        _ => t
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect(),
    }
}
