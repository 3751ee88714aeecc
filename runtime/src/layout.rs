//! Shape/stride arithmetic shared by tensors, DLPack import and native kernels.
//!
//! Strides are in elements and may be zero or negative. Every function here is total: sizes
//! that overflow `i64` are reported as `None` / errors, never wrapped, so that the offsets a
//! kernel computes from a validated layout always stay inside the memory the layout spans.
//!
//! [`validate`] is the one gate every tensor view passes (rivet allocations, DLPack imports of
//! both ABIs, the torch exchange fast path, views made by rivet). Its invariants, on which
//! kernels and the compiler's per-call checks rely:
//! - `ndim <= MAX_NDIM`, every dim `>= 0`, and the product of the dims (zero dims counted as
//!   one, as numpy does) fits in `i64`;
//! - every `stride * itemsize` fits in `i64`;
//! - for a non-empty tensor, the lowest and highest byte offsets of any element relative to
//!   the first one (sums of `(dim - 1) * stride * itemsize` over the negative / positive
//!   strides) are exact, and the whole byte span `hi - lo` fits in `isize`. Since every
//!   partial sum of `index * stride * itemsize` terms lies in `[lo, hi]`, any order of
//!   evaluation of an element's byte offset stays in `isize` as well;
//! - [`check_address`]: the data pointer plus `byte_offset` plus that span neither wraps the
//!   address space nor reaches address 0.
//!
//! All of it is computed in checked `i128`, so no hostile value can wrap a check into a pass.
//! The layouts of real tensors (non-negative dims and strides up to 2^31) first take a
//! one-pass `i64` path whose bounds rule overflow out; it accepts only what the checked path
//! accepts, with the same `Extent`, and hands everything else (negative strides, huge sizes)
//! to the checked path, which words every refusal.

use smallvec::SmallVec;

/// Largest rank accepted anywhere (DLPack imports, views, allocations): far above any real
/// tensor, low enough that a corrupt `ndim` cannot make us read far or loop long.
pub const MAX_NDIM: usize = 64;

/// Why a layout was refused; the message names the dim, stride and values at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("ndim {0} is over rivet's limit of {MAX_NDIM} dims")]
    TooManyDims(usize),
    #[error("shape has {shape} dims but strides has {strides}")]
    RankMismatch { shape: usize, strides: usize },
    #[error("dim {dim} has negative size {size}")]
    NegativeDim { dim: usize, size: i64 },
    #[error("shape {shape:?} has more elements than fit in int64")]
    TooManyElements { shape: Vec<i64> },
    #[error("dim {dim}: stride {stride} times the item size {itemsize} overflows int64")]
    StrideBytes {
        dim: usize,
        stride: i64,
        itemsize: usize,
    },
    #[error(
        "shape {shape:?} with strides {strides:?} spans {bytes} bytes of memory (from byte {lo} to byte {hi} around the first element), more than isize::MAX"
    )]
    SpanTooLarge {
        shape: Vec<i64>,
        strides: Vec<i64>,
        lo: i128,
        hi: i128,
        bytes: i128,
    },
    #[error("byte_offset {0} is over isize::MAX")]
    ByteOffset(u64),
    #[error(
        "data pointer {data:#x} + byte_offset {byte_offset} with elements from byte {lo} to byte {hi} around it wraps the address space or reaches address 0"
    )]
    AddressWraps {
        data: usize,
        byte_offset: u64,
        lo: i64,
        hi: i64,
    },
}

/// What [`validate`] proved about a layout: element count and the byte extent around the
/// first element (index 0, ..., 0). For an empty tensor `lo == hi == 0`: it touches nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub numel: i64,
    /// Lowest byte offset of any element, `<= 0`.
    pub lo: i64,
    /// One past the highest byte of any element, `>= 0` (`hi - lo` fits in `isize`).
    pub hi: i64,
}

impl Extent {
    /// Bytes between the lowest and one past the highest byte touched.
    pub fn bytes(&self) -> i64 {
        self.hi - self.lo // cannot overflow: validated to fit in isize
    }
}

/// Largest dim and stride [`validate_common`] takes: with both at most 2^31, one dim's reach
/// `(n - 1) * s` is below 2^62, so it cannot overflow `i64` whatever the rank.
const COMMON_LIMIT: i64 = 1 << 31;

/// Largest item size [`validate_common`] takes: `stride * itemsize` then stays below 2^47.
const COMMON_ITEMSIZE: usize = 1 << 16;

/// Checks a layout against the module's invariants (see the header).
pub fn validate(shape: &[i64], strides: &[i64], itemsize: usize) -> Result<Extent, LayoutError> {
    match validate_common(shape, strides, itemsize) {
        Some(ext) => Ok(ext),
        None => validate_checked(shape, strides, itemsize),
    }
}

/// The layouts of real tensors (dims and strides in `0..=2^31`, a plain item size), proved
/// valid in one pass of `i64` arithmetic; `None` for anything else, which
/// [`validate_checked`] then decides and words. It answers only when that path would accept
/// the layout, and with the same `Extent`: all strides are `>= 0`, so `lo` is 0 and `hi` is
/// one item past the sum of the dims' reaches, which no step here can overflow (each reach is
/// below 2^62; the sums and products that could leave `i64` are checked and give up).
#[inline]
fn validate_common(shape: &[i64], strides: &[i64], itemsize: usize) -> Option<Extent> {
    if shape.len() > MAX_NDIM || shape.len() != strides.len() || itemsize > COMMON_ITEMSIZE {
        return None;
    }
    // The product of the dims with zero dims counted as one (the header's bound), whether a
    // dim is zero, and the highest element offset.
    let (mut product, mut empty, mut reach) = (1i64, false, 0i64);
    for (&n, &s) in shape.iter().zip(strides) {
        // One unsigned compare each refuses negatives and values over the limit.
        if n as u64 > COMMON_LIMIT as u64 || s as u64 > COMMON_LIMIT as u64 {
            return None;
        }
        product = product.checked_mul(n.max(1))?;
        empty |= n == 0;
        // Cannot overflow: both factors are at most 2^31 (the sum is checked).
        reach = reach.checked_add((n - 1).max(0) * s)?;
    }
    if empty {
        return Some(Extent {
            numel: 0,
            lo: 0,
            hi: 0,
        });
    }
    let size = itemsize as i64;
    // One past the last byte of the highest element; the span `hi - 0` must fit in isize.
    let hi = reach.checked_mul(size)?.checked_add(size)?;
    (hi as i128 <= isize::MAX as i128).then_some(Extent {
        numel: product,
        lo: 0,
        hi,
    })
}

/// [`validate`] for every layout, in checked `i128`: the path that words each refusal.
fn validate_checked(
    shape: &[i64],
    strides: &[i64],
    itemsize: usize,
) -> Result<Extent, LayoutError> {
    if shape.len() > MAX_NDIM {
        return Err(LayoutError::TooManyDims(shape.len()));
    }
    if shape.len() != strides.len() {
        return Err(LayoutError::RankMismatch {
            shape: shape.len(),
            strides: strides.len(),
        });
    }
    if let Some(dim) = shape.iter().position(|&n| n < 0) {
        return Err(LayoutError::NegativeDim {
            dim,
            size: shape[dim],
        });
    }
    let too_many = || LayoutError::TooManyElements {
        shape: shape.to_vec(),
    };
    // Zero dims count as one here, so that no product of dims a kernel or a check may form
    // (e.g. `n * m` for an empty `(n, m, 0)` tensor) can overflow.
    shape
        .iter()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d.max(1)))
        .ok_or_else(too_many)?;
    let numel = numel(shape).ok_or_else(too_many)?;
    let size = itemsize as i128;
    for (dim, &stride) in strides.iter().enumerate() {
        if i64::try_from(stride as i128 * size).is_err() {
            return Err(LayoutError::StrideBytes {
                dim,
                stride,
                itemsize,
            });
        }
    }
    if numel == 0 {
        return Ok(Extent {
            numel,
            lo: 0,
            hi: 0,
        });
    }
    // One dim's reach can exceed i128 ((2^63 - 1) * 2^63 * 8), and so can a sum of 64 of
    // them: every step is checked, and any overflow refuses the layout.
    let (mut lo, mut hi) = (0i128, 0i128);
    let mut overflow = false;
    for (&n, &s) in shape.iter().zip(strides) {
        let reach = (n as i128 - 1)
            .checked_mul(s as i128)
            .and_then(|r| r.checked_mul(size));
        match reach {
            Some(r) if r < 0 => {
                lo = lo.checked_add(r).unwrap_or_else(|| {
                    overflow = true;
                    i128::MIN
                })
            }
            Some(r) => {
                hi = hi.checked_add(r).unwrap_or_else(|| {
                    overflow = true;
                    i128::MAX
                })
            }
            None => overflow = true,
        }
    }
    let end = hi.checked_add(size); // one past the last byte of the highest element
    let bytes = end.and_then(|e| e.checked_sub(lo));
    match (overflow, end, bytes) {
        (false, Some(end), Some(b)) if b <= isize::MAX as i128 => Ok(Extent {
            numel,
            lo: lo as i64, // |lo| <= b: fits
            hi: end as i64,
        }),
        _ => Err(LayoutError::SpanTooLarge {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            lo,
            hi: end.unwrap_or(i128::MAX),
            bytes: bytes.unwrap_or(i128::MAX),
        }),
    }
}

/// Checks that the bytes `[data + byte_offset + lo, data + byte_offset + hi)` of a validated
/// layout are an unwrapped range of addresses above 0, and that `byte_offset` fits in `isize`
/// (so `data + byte_offset` is a valid pointer offset). A NULL `data` is the caller's concern
/// (allowed for empty tensors only).
pub fn check_address(data: usize, byte_offset: u64, ext: &Extent) -> Result<(), LayoutError> {
    if byte_offset > isize::MAX as u64 {
        return Err(LayoutError::ByteOffset(byte_offset));
    }
    if ext.numel == 0 {
        return Ok(());
    }
    let first = data as i128 + byte_offset as i128;
    let (lo, hi) = (first + ext.lo as i128, first + ext.hi as i128);
    if lo < 1 || hi > usize::MAX as i128 {
        return Err(LayoutError::AddressWraps {
            data,
            byte_offset,
            lo: ext.lo,
            hi: ext.hi,
        });
    }
    Ok(())
}

/// Shape or strides of a tensor; inline up to six dims (no allocation in the call path).
pub type Dims = SmallVec<[i64; 6]>;

/// Row-major strides for `shape`.
pub fn compact_strides(shape: &[i64]) -> Dims {
    let mut strides: Dims = SmallVec::from_elem(0, shape.len());
    let mut acc = 1i64;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc = acc.saturating_mul(shape[i].max(1));
    }
    strides
}

/// Number of elements, `None` on overflow.
pub fn numel(shape: &[i64]) -> Option<i64> {
    shape.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d))
}

/// True when the layout is row-major compact (strides of size-1 dims are ignored, as
/// DLPack and torch allow any value there). Zero-size tensors are compact.
pub fn is_compact(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1i64;
    for i in (0..shape.len()).rev() {
        if shape[i] != 1 {
            if strides[i] != expected {
                return false;
            }
            // Saturating: past i64 no stride can match anyway.
            expected = expected.saturating_mul(shape[i]);
        }
    }
    true
}

/// Inclusive element-offset range `[lo, hi]` touched by the layout, relative to the first
/// element; `None` for zero-size tensors (they touch nothing) or on overflow.
pub fn span(shape: &[i64], strides: &[i64]) -> Option<(i64, i64)> {
    if shape.contains(&0) {
        return None;
    }
    let (mut lo, mut hi) = (0i64, 0i64);
    for (&n, &s) in shape.iter().zip(strides) {
        let reach = (n - 1).checked_mul(s)?;
        if reach < 0 {
            lo = lo.checked_add(reach)?;
        } else {
            hi = hi.checked_add(reach)?;
        }
    }
    Some((lo, hi))
}

/// True when two different indices may address the same element. Conservative: with the
/// dims sorted by |stride|, each stride must exceed the span of all smaller dims; layouts
/// that fail this rule are treated as overlapping (documented in docs/safety.md).
pub fn may_self_overlap(shape: &[i64], strides: &[i64]) -> bool {
    if is_compact(shape, strides) {
        return false; // the common case, without the sort below
    }
    // i128: |i64::MIN| does not fit in i64, and (n - 1) * |s| may not either.
    let mut dims: SmallVec<[(i128, i128); 6]> = shape
        .iter()
        .zip(strides)
        .filter(|(&n, _)| n > 1)
        .map(|(&n, &s)| (s.unsigned_abs() as i128, n as i128))
        .collect();
    dims.sort_unstable();
    let mut reach = 0i128; // max offset reachable by the smaller dims
    for (s, n) in dims {
        if s <= reach {
            return true;
        }
        match (n - 1).checked_mul(s).and_then(|r| r.checked_add(reach)) {
            Some(r) => reach = r,
            None => return true,
        }
    }
    false
}

/// A loop nest over several tensors with the same shape, simplified for iteration:
/// size-1 dims dropped, dims ordered by the first tensor's |stride| (outermost largest),
/// and adjacent dims merged where every tensor allows it. Iterating it visits exactly the
/// same (offset, offset, ...) tuples as the original shape, in a cache-friendlier order.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopNest<const N: usize> {
    pub shape: Dims,
    pub strides: [Dims; N],
}

impl<const N: usize> LoopNest<N> {
    pub fn new(shape: &[i64], strides: [&[i64]; N]) -> Self {
        // The common case: every tensor compact, one flat loop.
        if strides.iter().all(|s| is_compact(shape, s)) {
            let n: i64 = shape.iter().product();
            let one = |v: i64| -> Dims {
                if n == 1 {
                    Dims::new()
                } else {
                    smallvec::smallvec![v]
                }
            };
            return LoopNest {
                shape: one(n),
                strides: std::array::from_fn(|_| one(1)),
            };
        }
        let mut order: SmallVec<[usize; 6]> = (0..shape.len()).filter(|&i| shape[i] != 1).collect();
        // Stable sort keeps the logical order among equal strides (e.g. broadcast dims).
        order.sort_by_key(|&i| std::cmp::Reverse(strides[0][i].unsigned_abs()));
        let mut out_shape: Dims = SmallVec::new();
        let mut out_strides: [Dims; N] = std::array::from_fn(|_| SmallVec::new());
        for &i in &order {
            let n = shape[i];
            // Checked: `stride * n` is one past the dim's reach and may leave i64 even for a
            // valid layout; such dims are simply not merged.
            let mergeable = !out_shape.is_empty()
                && (0..N)
                    .all(|t| strides[t][i].checked_mul(n) == Some(*out_strides[t].last().unwrap()));
            if mergeable {
                *out_shape.last_mut().unwrap() *= n;
                for t in 0..N {
                    *out_strides[t].last_mut().unwrap() = strides[t][i];
                }
            } else {
                out_shape.push(n);
                for t in 0..N {
                    out_strides[t].push(strides[t][i]);
                }
            }
        }
        LoopNest {
            shape: out_shape,
            strides: out_strides,
        }
    }

    /// Product of all but the innermost dim: the number of inner rows.
    pub fn rows(&self) -> i64 {
        self.shape.iter().rev().skip(1).product()
    }

    /// Length and strides of the innermost dim (1 and zeros for a scalar nest).
    pub fn inner(&self) -> (i64, [i64; N]) {
        match self.shape.last() {
            Some(&n) => (n, std::array::from_fn(|t| *self.strides[t].last().unwrap())),
            None => (1, [0; N]),
        }
    }

    /// Element offsets of the first element of row `row` (row-major over the outer dims).
    pub fn row_offsets(&self, mut row: i64) -> [i64; N] {
        let mut off = [0i64; N];
        let outer = self.shape.len().saturating_sub(1);
        for d in (0..outer).rev() {
            let n = self.shape[d];
            let idx = row % n;
            row /= n;
            for (t, o) in off.iter_mut().enumerate() {
                *o += idx * self.strides[t][d];
            }
        }
        off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_and_span() {
        assert_eq!(compact_strides(&[2, 3, 4]).as_slice(), &[12, 4, 1]);
        assert!(is_compact(&[2, 3], &[3, 1]));
        assert!(is_compact(&[2, 1, 3], &[3, 99, 1]));
        assert!(!is_compact(&[2, 3], &[1, 2]));
        assert_eq!(span(&[2, 3], &[3, 1]), Some((0, 5)));
        assert_eq!(span(&[4], &[-2]), Some((-6, 0)));
        assert_eq!(span(&[0, 3], &[3, 1]), None);
    }

    #[test]
    fn validation_refuses_what_would_wrap() {
        let ok = validate(&[2, 3], &[3, 1], 4).unwrap();
        assert_eq!((ok.numel, ok.lo, ok.hi), (6, 0, 24));
        let neg = validate(&[4], &[-2], 8).unwrap();
        assert_eq!((neg.lo, neg.hi), (-48, 8));
        // The case: the span overflowed i64 and wrapped into a pass.
        let e = validate(&[2, 2], &[-(1 << 62), 1 << 62], 1).unwrap_err();
        assert!(matches!(e, LayoutError::SpanTooLarge { .. }), "{e}");
        assert!(validate(&[2], &[i64::MIN], 1).is_err());
        assert!(matches!(
            validate(&[1], &[1 << 62], 4),
            Err(LayoutError::StrideBytes { dim: 0, .. })
        ));
        assert!(matches!(
            validate(&[1 << 40, 1 << 40, 0], &[0, 0, 0], 4),
            Err(LayoutError::TooManyElements { .. })
        ));
        assert!(validate(&[0, 5], &[1 << 40, 7], 8).is_ok());
        assert!(matches!(
            validate(&[-1], &[1], 4),
            Err(LayoutError::NegativeDim { dim: 0, size: -1 })
        ));
        assert!(validate(&[1; 65], &[1; 65], 4).is_err());
        let ext = validate(&[4], &[-1], 4).unwrap();
        assert!(check_address(8, 0, &ext).is_err()); // would reach below address 0
        assert!(check_address(4096, 0, &ext).is_ok());
        let ext = validate(&[2], &[1 << 40], 8).unwrap();
        assert!(check_address(usize::MAX - 4096, 0, &ext).is_err());
        assert!(check_address(4096, 1 << 63, &validate(&[0], &[1], 4).unwrap()).is_err());
    }

    /// The one-pass path answers only where the checked path accepts, and with its extent;
    /// around its limits (2^31 dims and strides, zero dims, ranks to 64) both agree.
    #[test]
    fn common_path_agrees_with_checked_path() {
        let edges = [
            0i64,
            1,
            2,
            3,
            7,
            (1 << 31) - 1,
            1 << 31,
            (1 << 31) + 1,
            1 << 32,
            -1,
            i64::MAX,
            i64::MIN,
        ];
        let mut layouts: Vec<(Vec<i64>, Vec<i64>)> = Vec::new();
        for &a in &edges {
            for &b in &edges {
                layouts.push((vec![a], vec![b]));
                for &c in &edges {
                    layouts.push((vec![a, 3], vec![b, c]));
                    layouts.push((vec![a, b], vec![c, 1]));
                }
            }
        }
        // Products and sums that leave i64 only through many dims.
        layouts.push((vec![1 << 31; 3], vec![1; 3]));
        layouts.push((vec![1 << 31; 2], vec![1 << 31, 1]));
        layouts.push((vec![2; 64], vec![1 << 31; 64]));
        layouts.push((vec![2; 64], vec![1; 64]));
        layouts.push((vec![0, 1 << 31, 1 << 31, 1 << 31], vec![0; 4]));
        layouts.push((vec![2; 3], vec![1; 2]));
        layouts.push((vec![1; 65], vec![1; 65]));
        for (shape, strides) in &layouts {
            for itemsize in [1, 2, 4, 8, 16, 1 << 16, (1 << 16) + 1, 1 << 40] {
                let checked = validate_checked(shape, strides, itemsize);
                if let Some(ext) = validate_common(shape, strides, itemsize) {
                    assert_eq!(
                        checked,
                        Ok(ext),
                        "{shape:?} {strides:?} itemsize {itemsize}"
                    );
                }
                assert_eq!(validate(shape, strides, itemsize), checked);
            }
        }
        // The path answers the tensors calls see.
        assert!(validate_common(&[4], &[1], 4).is_some());
        assert!(validate_common(&[56, 56], &[1, 56], 8).is_some());
        assert!(validate_common(&[3, 0, 2], &[0, 5, 1], 4).is_some());
        assert!(validate_common(&[4], &[-1], 4).is_none());
    }

    #[test]
    fn overlap_rule() {
        assert!(!may_self_overlap(&[4, 5], &[5, 1]));
        assert!(!may_self_overlap(&[5, 4], &[1, 5]));
        assert!(may_self_overlap(&[4, 5], &[0, 1]));
        assert!(may_self_overlap(&[3, 3], &[1, 1]));
        assert!(!may_self_overlap(&[1, 5], &[0, 1]));
        assert!(!may_self_overlap(&[4], &[-1]));
        assert!(!may_self_overlap(&[4, 3], &[8, 2]));
        assert!(may_self_overlap(&[2, 2], &[i64::MIN, 0]));
    }

    #[test]
    fn loop_nest_merges_and_orders() {
        let n = LoopNest::new(&[2, 3, 4], [&[12, 4, 1], &[12, 4, 1]]);
        assert_eq!(n.shape.as_slice(), &[24]);
        let t = LoopNest::new(&[3, 4], [&[1, 3], &[4, 1]]);
        assert_eq!(t.shape.as_slice(), &[4, 3]);
        assert_eq!(t.strides[0].as_slice(), &[3, 1]);
        assert_eq!(t.row_offsets(2), [6, 2]);
    }
}
