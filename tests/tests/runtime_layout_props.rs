//! Property tests of the layout arithmetic every kernel relies on: the overlap rule is
//! sound (never says "no overlap" when two indices share an element), loop nests visit
//! exactly the offsets of the original shape, and spans bound every offset.

use proptest::prelude::*;
use rivet_runtime::layout::{self, LoopNest};
use std::collections::HashSet;

/// Offsets of every index of (shape, strides), in row-major index order.
fn offsets(shape: &[i64], strides: &[i64]) -> Vec<i64> {
    let n: i64 = shape.iter().product();
    (0..n)
        .map(|mut flat| {
            let mut off = 0;
            for d in (0..shape.len()).rev() {
                off += (flat % shape[d]) * strides[d];
                flat /= shape[d];
            }
            off
        })
        .collect()
}

fn layout_strategy() -> impl Strategy<Value = (Vec<i64>, Vec<i64>)> {
    prop::collection::vec((0i64..5, -7i64..8), 0..5).prop_map(|dims| dims.into_iter().unzip())
}

proptest! {
    #[test]
    fn overlap_rule_is_sound((shape, strides) in layout_strategy()) {
        let offs = offsets(&shape, &strides);
        let distinct = offs.iter().collect::<HashSet<_>>().len() == offs.len();
        if !layout::may_self_overlap(&shape, &strides) {
            prop_assert!(distinct, "rule said disjoint but {shape:?}/{strides:?} repeats an offset");
        }
    }

    #[test]
    fn compact_layouts_never_overlap(shape in prop::collection::vec(0i64..6, 0..5)) {
        let strides = layout::compact_strides(&shape);
        prop_assert!(layout::is_compact(&shape, &strides));
        prop_assert!(!layout::may_self_overlap(&shape, &strides));
    }

    #[test]
    fn span_bounds_every_offset((shape, strides) in layout_strategy()) {
        let offs = offsets(&shape, &strides);
        match layout::span(&shape, &strides) {
            None => prop_assert!(offs.is_empty()),
            Some((lo, hi)) => {
                prop_assert_eq!(*offs.iter().min().unwrap(), lo);
                prop_assert_eq!(*offs.iter().max().unwrap(), hi);
            }
        }
    }

    #[test]
    fn loop_nest_visits_the_same_pairs(
        (shape, a) in layout_strategy(),
        seed in prop::collection::vec(-5i64..6, 5),
    ) {
        let b: Vec<i64> = (0..shape.len()).map(|i| seed[i]).collect();
        let mut want: Vec<(i64, i64)> = offsets(&shape, &a).into_iter().zip(offsets(&shape, &b)).collect();
        let nest = LoopNest::new(&shape, [&a, &b]);
        let mut got = Vec::new();
        if !shape.contains(&0) {
            let (n, [sa, sb]) = nest.inner();
            for row in 0..nest.rows() {
                let [oa, ob] = nest.row_offsets(row);
                for k in 0..n {
                    got.push((oa + k * sa, ob + k * sb));
                }
            }
        }
        want.sort_unstable();
        got.sort_unstable();
        prop_assert_eq!(got, want);
    }
}
