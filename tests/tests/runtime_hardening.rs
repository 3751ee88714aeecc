//! Hardening of the runtime against hostile sizes: layout validation cannot wrap,
//! allocations are fallible and size-limited, and every view — imported or made by rivet —
//! either is refused with a typed error or addresses only memory its layout promises.
//!
//! The property tests draw shapes and strides from adversarial constants (near 2^31, 2^62,
//! i64::MIN) mixed with small values, and compare `layout::validate` with an independent
//! model written in saturating arithmetic.

use proptest::prelude::*;
use rivet_runtime::alloc::{free_zeroed, try_alloc_zeroed};
use rivet_runtime::layout::{self, LayoutError};
use rivet_runtime::{dlpack, DType, Error, Tensor, MAX_ALLOC_BYTES};
use std::sync::Mutex;

/// `dlpack::live_imports()` is process-wide: tests that count take this lock.
static IMPORTS: Mutex<()> = Mutex::new(());

const HOSTILE: [i64; 16] = [
    i64::MIN,
    i64::MIN + 1,
    -(1 << 62),
    -(1 << 31),
    -2,
    -1,
    (1 << 31) - 1,
    1 << 31,
    1 << 32,
    (1 << 61) + 1,
    1 << 62,
    (1 << 62) + 1,
    i64::MAX - 1,
    i64::MAX,
    3,
    1 << 40,
];

fn value() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => -4i64..6,
        2 => prop::sample::select(HOSTILE.to_vec()),
        1 => any::<i64>(),
    ]
}

fn dim() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => 0i64..5,
        1 => prop::sample::select(HOSTILE.to_vec()),
    ]
}

fn hostile_layout() -> impl Strategy<Value = (Vec<i64>, Vec<i64>, usize)> {
    (
        prop::collection::vec((dim(), value()), 0..6),
        prop::sample::select(vec![1usize, 2, 4, 8]),
    )
        .prop_map(|(dims, size)| {
            let (shape, strides) = dims.into_iter().unzip();
            (shape, strides, size)
        })
}

/// The rules of `layout::validate`, restated in saturating i128 (saturation is only ever
/// reached far beyond the limits, so it cannot turn a refusal into an acceptance).
fn model_accepts(shape: &[i64], strides: &[i64], size: usize) -> bool {
    let size = size as i128;
    if shape.len() > layout::MAX_NDIM || shape.iter().any(|&d| d < 0) {
        return false;
    }
    let prod = shape
        .iter()
        .fold(1i128, |a, &d| a.saturating_mul(d.max(1) as i128));
    if prod > i64::MAX as i128 {
        return false;
    }
    if strides
        .iter()
        .any(|&s| (s as i128 * size) > i64::MAX as i128 || (s as i128 * size) < i64::MIN as i128)
    {
        return false;
    }
    if shape.contains(&0) {
        return true;
    }
    let (mut neg, mut pos) = (0i128, 0i128);
    for (&n, &s) in shape.iter().zip(strides) {
        let r = (n as i128 - 1)
            .saturating_mul(s as i128)
            .saturating_mul(size);
        if r < 0 {
            neg = neg.saturating_add(r);
        } else {
            pos = pos.saturating_add(r);
        }
    }
    pos.saturating_add(size).saturating_sub(neg) <= isize::MAX as i128
}

/// Byte offset of an index, in i128 (never overflows for i64 inputs and <= 6 dims).
fn offset(idx: &[i64], strides: &[i64], size: usize) -> i128 {
    idx.iter()
        .zip(strides)
        .map(|(&i, &s)| i as i128 * s as i128 * size as i128)
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// validate agrees with the model, and what it accepts is sound: the extreme indices
    /// land exactly on `lo` / `hi - size`, and an element offset summed in i64 in either
    /// order never overflows.
    #[test]
    fn validate_matches_model_and_bounds_offsets((shape, strides, size) in hostile_layout()) {
        let got = layout::validate(&shape, &strides, size);
        prop_assert_eq!(got.is_ok(), model_accepts(&shape, &strides, size),
            "{:?} / {:?} / {} -> {:?}", shape, strides, size, got);
        let Ok(ext) = got else { return Ok(()) };
        prop_assert!(ext.lo <= 0 && ext.hi >= 0);
        if ext.numel == 0 {
            return Ok(());
        }
        let low: Vec<i64> = shape.iter().zip(&strides).map(|(&n, &s)| if s < 0 { n - 1 } else { 0 }).collect();
        let high: Vec<i64> = shape.iter().zip(&strides).map(|(&n, &s)| if s > 0 { n - 1 } else { 0 }).collect();
        prop_assert_eq!(offset(&low, &strides, size), ext.lo as i128);
        prop_assert_eq!(offset(&high, &strides, size) + size as i128, ext.hi as i128);
        for idx in [&low, &high] {
            let terms: Vec<i64> = idx.iter().zip(&strides).map(|(&i, &s)| i * s * size as i64).collect();
            let fwd = terms.iter().try_fold(0i64, |a, &t| a.checked_add(t));
            let back = terms.iter().rev().try_fold(0i64, |a, &t| a.checked_add(t));
            prop_assert!(fwd.is_some() && back.is_some());
        }
    }

    /// A view of a real buffer with a hostile layout is refused or reads only inside the
    /// buffer (checked by reading every element through `to_vec`).
    #[test]
    fn views_are_refused_or_inside((shape, strides, _s) in hostile_layout(), off in value()) {
        let base = Tensor::from_slice(&(0..64).map(|v| v as f32).collect::<Vec<_>>(), &[64]).unwrap();
        match base.as_strided(&shape, &strides, off) {
            Err(e) => prop_assert!(matches!(e, Error::Shape(_)), "{e}"),
            Ok(v) => {
                if let Some((lo, hi)) = v.byte_range() {
                    let (blo, bhi) = base.byte_range().unwrap();
                    prop_assert!(blo <= lo && hi <= bhi);
                    if v.numel() <= 1 << 16 {
                        prop_assert!(v.to_vec::<f32>().unwrap().iter().all(|x| (0.0..64.0).contains(x)));
                    }
                }
            }
        }
    }

    /// An imported DLPack tensor with hostile shape, strides or byte_offset is refused with
    /// a typed error (or accepted only when valid), and its deleter runs either way.
    #[test]
    fn hostile_imports_are_refused_and_released(
        (shape, strides, _s) in hostile_layout(),
        byte_offset in prop_oneof![Just(0u64), Just(1u64 << 63), Just(u64::MAX), any::<u64>()],
    ) {
        let _serial = IMPORTS.lock().unwrap_or_else(|e| e.into_inner());
        let live = dlpack::live_imports();
        let t = Tensor::zeros(&[4], DType::F32).unwrap();
        let p = dlpack::export_versioned(&t);
        let (mut shape, mut strides) = (shape, strides);
        // SAFETY: p is our own valid export; we point its arrays at ours (alive during the
        // import, which copies them) and corrupt its layout; it is consumed once below.
        unsafe {
            (*p).dl_tensor.ndim = shape.len() as i32;
            (*p).dl_tensor.shape = shape.as_mut_ptr();
            (*p).dl_tensor.strides = strides.as_mut_ptr();
            (*p).dl_tensor.byte_offset = byte_offset;
        }
        // SAFETY: consumed once.
        match unsafe { dlpack::import_versioned(p) } {
            Ok(v) => {
                // Only layouts that validate and whose address range does not wrap get here.
                let ext = layout::validate(v.shape(), v.strides(), 4).unwrap();
                prop_assert!(layout::check_address(v.raw_data() as usize, byte_offset, &ext).is_ok());
            }
            Err(e) => prop_assert!(matches!(e, Error::DLPack(_) | Error::Shape(_)), "{e}"),
        }
        prop_assert_eq!(dlpack::live_imports(), live);
    }
}

#[test]
fn the_issue_layout_is_refused_on_import() {
    let _serial = IMPORTS.lock().unwrap_or_else(|e| e.into_inner());
    let live = dlpack::live_imports();
    // One-byte elements: the strides alone fit in bytes, only the span overflows.
    let t = Tensor::zeros(&[2, 2], DType::U8).unwrap();
    let p = dlpack::export_versioned(&t);
    // SAFETY: our own export; strides array has 2 entries.
    unsafe {
        *(*p).dl_tensor.strides = -(1 << 62);
        *(*p).dl_tensor.strides.add(1) = 1 << 62;
    }
    // SAFETY: consumed once.
    let e = unsafe { dlpack::import_versioned(p) }.unwrap_err();
    assert!(matches!(e, Error::DLPack(_)), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("4611686018427387904") && m.contains("isize::MAX"),
        "{m}"
    );
    assert_eq!(dlpack::live_imports(), live);
    // A NULL data pointer with elements.
    let p = dlpack::export_versioned(&t);
    // SAFETY: our own export.
    unsafe { (*p).dl_tensor.data = std::ptr::null_mut() };
    // SAFETY: consumed once.
    let e = unsafe { dlpack::import_versioned(p) }.unwrap_err();
    assert!(e.to_string().contains("NULL data pointer"), "{e}");
    assert_eq!(dlpack::live_imports(), live);
}

#[test]
fn huge_allocations_are_memory_errors() {
    for shape in [
        vec![1i64 << 62],
        vec![1 << 40, 1 << 40],
        vec![i64::MAX, i64::MAX, i64::MAX],
        vec![1 << 40, 1 << 40, 0],
    ] {
        let e = Tensor::zeros(&shape, DType::F32).unwrap_err();
        assert!(matches!(e, Error::Memory(_)), "{shape:?}: {e}");
        assert!(e.to_string().contains("float32"), "{e}");
    }
    // Negative dims stay shape errors.
    assert!(matches!(
        Tensor::zeros(&[-1], DType::F32),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        try_alloc_zeroed(MAX_ALLOC_BYTES + 1, 64),
        Err(Error::Memory(_))
    ));
    assert!(matches!(
        try_alloc_zeroed(usize::MAX, 64),
        Err(Error::Memory(_))
    ));
    let p = try_alloc_zeroed(4096, 256).unwrap();
    // SAFETY: same size and alignment, freed once.
    unsafe { free_zeroed(p, 4096, 256) };
    assert_eq!(MAX_ALLOC_BYTES, 1 << 48);
}

#[test]
fn copies_of_huge_broadcast_views_are_memory_errors() {
    let one = Tensor::from_slice(&[1f32], &[1]).unwrap();
    let wide = one.as_strided(&[1 << 62], &[0], 0).unwrap();
    assert_eq!(wide.numel(), 1 << 62);
    assert!(matches!(wide.copy_compact(), Err(Error::Memory(_))));
    assert!(matches!(wide.to_vec::<f32>(), Err(Error::Memory(_))));
}

#[test]
fn layout_errors_name_the_values() {
    let e = layout::validate(&[3], &[1 << 62], 8).unwrap_err();
    assert_eq!(
        e,
        LayoutError::StrideBytes {
            dim: 0,
            stride: 1 << 62,
            itemsize: 8
        }
    );
    assert!(e.to_string().contains("dim 0") && e.to_string().contains("4611686018427387904"));
    let e = layout::validate(&[2, -3], &[1, 1], 4).unwrap_err();
    assert_eq!(e.to_string(), "dim 1 has negative size -3");
}
