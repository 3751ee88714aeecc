//! Shape/stride arithmetic shared by tensors, DLPack import and native kernels.
//!
//! Strides are in elements and may be zero or negative. Every function here is total: sizes
//! that overflow `i64` are reported as `None` / errors, never wrapped, so that the offsets a
//! kernel computes from a validated layout always stay inside the memory the layout spans.

use smallvec::SmallVec;

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
            expected *= shape[i];
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
/// that fail this rule are treated as overlapping (documented in the README).
pub fn may_self_overlap(shape: &[i64], strides: &[i64]) -> bool {
    if is_compact(shape, strides) {
        return false; // the common case, without the sort below
    }
    let mut dims: SmallVec<[(i64, i64); 6]> = shape
        .iter()
        .zip(strides)
        .filter(|(&n, _)| n > 1)
        .map(|(&n, &s)| (s.unsigned_abs() as i64, n))
        .collect();
    dims.sort_unstable();
    let mut reach = 0i64; // max offset reachable by the smaller dims
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
            let mergeable = !out_shape.is_empty()
                && (0..N).all(|t| *out_strides[t].last().unwrap() == strides[t][i] * n);
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
    fn overlap_rule() {
        assert!(!may_self_overlap(&[4, 5], &[5, 1]));
        assert!(!may_self_overlap(&[5, 4], &[1, 5]));
        assert!(may_self_overlap(&[4, 5], &[0, 1]));
        assert!(may_self_overlap(&[3, 3], &[1, 1]));
        assert!(!may_self_overlap(&[1, 5], &[0, 1]));
        assert!(!may_self_overlap(&[4], &[-1]));
        assert!(!may_self_overlap(&[4, 3], &[8, 2]));
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
