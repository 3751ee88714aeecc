//! The loops of a stage: how `split` and `fuse` derive them from the stage's root axes
//! (`Relation`, applied in order), and their extents.
//!
//! Invariant: the extents of the loops that split and fuse make are defined here once
//! (`split_extents`, `fuse_extent`, `loop_extents`): the loops lowering emits
//! (`lower::nest`) and the extents Python reports for `leaf_iter_vars` come from the same
//! functions (the tests below compare the two).

use crate::arith::interval::smin;
use crate::arith::simplify::simplify;
use crate::ir::expr::{Expr, Var};
use std::collections::HashMap;

/// Largest constant split factor kept as the inner loop's extent over a symbolic axis.
pub const SMALL_SPLIT: i64 = 1024;

/// The extents of the `(outer, inner)` loops of a split of a loop of extent `parent`, by
/// `factor` (the inner extent) or `nparts` (the outer extent); `None` when neither is given.
///
/// The other extent is `ceil(parent / k)`, written `(parent - 1) // k + 1`: no intermediate can
/// overflow (`parent + k - 1` could), and it is 0 for an empty parent. The part of fixed size
/// is clamped to the parent (a split by 2**62 of an axis of 5 runs 5 iterations, not 2**62
/// guarded ones), except a constant of at most `SMALL_SPLIT` over a symbolic parent: vectorize
/// and unroll need its constant extent, and at most `SMALL_SPLIT` guarded iterations are
/// wasted per outer one.
pub fn split_extents(
    parent: &Expr,
    factor: Option<&Expr>,
    nparts: Option<&Expr>,
) -> Option<(Expr, Expr)> {
    let ceil = |k: &Expr| parent.sub(&Expr::int(1)).floordiv(k).add(&Expr::int(1));
    let clamp = |k: &Expr| match (k.as_int(), simplify(parent).as_int()) {
        (Some(c), None) if c <= SMALL_SPLIT => k.clone(),
        _ => smin(k, parent),
    };
    let (outer, inner) = match (factor, nparts) {
        (Some(f), _) => (ceil(f), clamp(f)),
        (None, Some(n)) => (clamp(n), ceil(n)),
        (None, None) => return None,
    };
    Some((simplify(&outer), simplify(&inner)))
}

/// The extent of the loop fusing loops of extents `outer` and `inner`: folded when constant,
/// otherwise kept as the product (the bounds proof recognises `f // D` over `[0, E * D)`).
pub fn fuse_extent(outer: &Expr, inner: &Expr) -> Expr {
    let e = outer.mul(inner);
    let folded = simplify(&e);
    if folded.as_int().is_some() {
        folded
    } else {
        e
    }
}

/// The extent of every loop of a stage: `roots` gives the root axes' extents (the whole axes,
/// or the region a `compute_at` computes), and the `relations` add the loops they make, in
/// order. A relation whose source loops have no extent is skipped.
pub fn loop_extents(relations: &[Relation], mut roots: HashMap<Var, Expr>) -> HashMap<Var, Expr> {
    for rel in relations {
        match rel {
            Relation::Split {
                parent,
                outer,
                inner,
                factor,
                nparts,
            } => {
                let Some(pe) = roots.get(parent) else {
                    continue;
                };
                if let Some((oe, ie)) = split_extents(pe, factor.as_ref(), nparts.as_ref()) {
                    roots.insert(outer.clone(), oe);
                    roots.insert(inner.clone(), ie);
                }
            }
            Relation::Fuse {
                outer,
                inner,
                fused,
            } => {
                if let (Some(o), Some(i)) = (roots.get(outer), roots.get(inner)) {
                    let f = fuse_extent(o, i);
                    roots.insert(fused.clone(), f);
                }
            }
        }
    }
    roots
}

/// How a stage's loops were derived from its root axes (applied in order).
#[derive(Clone, Debug)]
pub enum Relation {
    /// `parent = outer * factor + inner`; `factor` is the inner extent, or with `nparts` the
    /// outer extent is fixed and the inner one is `ceil(parent / nparts)`.
    Split {
        parent: Var,
        outer: Var,
        inner: Var,
        factor: Option<Expr>,
        nparts: Option<Expr>,
    },
    /// `fused = outer * extent(inner) + inner`.
    Fuse { outer: Var, inner: Var, fused: Var },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Schedule;
    use crate::te;
    use crate::te::tensor::Tensor;
    use rivet_runtime::DType;

    /// `var -> extent` of every loop `build_nest` emits, read from its printed form.
    fn nest_extents(sched: &Schedule, args: &[Tensor]) -> HashMap<String, String> {
        let f = crate::lower::nest::build_nest(sched, args, "f").unwrap();
        let mut out = HashMap::new();
        for line in f.to_string().lines() {
            let Some(rest) = line.trim_start().split_once("for ").map(|(_, r)| r) else {
                continue;
            };
            let Some((var, dom)) = rest.split_once(" in [0, ") else {
                continue;
            };
            let ext = dom.strip_suffix("):").expect("a loop header");
            let prev = out.insert(var.to_string(), ext.to_string());
            assert!(prev.is_none_or(|p| p == ext), "loop {var} twice:\n{f}");
        }
        out
    }

    /// xorshift64*: reproducible draws without a dependency.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
        }
    }

    /// Random splits (by factor or nparts, constant or symbolic, dividing or not, larger than
    /// the axis) and fuses of a matmul stage: the extents the schedule reports are the extents
    /// of the loops lowering emits.
    #[test]
    fn reported_extents_are_the_lowered_loop_extents() {
        let n = te::var("n");
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let symbolic = seed % 3 == 0;
            let dim = |c: i64| if symbolic { n.clone() } else { Expr::int(c) };
            let (m, k, p) = (dim(20), dim(13), dim(18));
            let a = te::placeholder([&m, &k], DType::F32, "A").unwrap();
            let b = te::placeholder([&k, &p], DType::F32, "B").unwrap();
            let r = te::reduce_axis(0, k, "k").unwrap();
            let c = te::compute(
                [m, p],
                |[i, j]| te::sum(a.at((i, &r)) * b.at((&r, j)), &r),
                "C",
            )
            .unwrap();
            let mut sched = Schedule::new(std::slice::from_ref(&c)).unwrap();
            let st = sched.stage(&c).unwrap();
            let factors = [1, 2, 3, 4, 5, 7, 16, 40, 2000];
            for _ in 0..1 + rng.below(4) {
                let leaves = st.leaves.len();
                if rng.below(3) == 0 && leaves > 1 {
                    let at = rng.below(leaves - 1);
                    let (o, i) = (st.leaves[at].var.clone(), st.leaves[at + 1].var.clone());
                    if st.leaves[at].reduce == st.leaves[at + 1].reduce {
                        st.fuse(&o, &i).unwrap();
                    }
                } else {
                    let v = st.leaves[rng.below(leaves)].var.clone();
                    // A symbolic factor only where an argument binds `n` (else a
                    // CompileError: the dim cannot be bound).
                    let by = if symbolic && rng.below(5) == 0 {
                        n.clone()
                    } else {
                        Expr::int(factors[rng.below(factors.len())])
                    };
                    if rng.below(2) == 0 {
                        st.split(&v, Some(by), None).unwrap();
                    } else {
                        st.split(&v, None, Some(by)).unwrap();
                    }
                }
            }
            let reported = st.extents();
            let leaves: Vec<Var> = st.leaves.iter().map(|l| l.var.clone()).collect();
            let lowered = nest_extents(&sched, &[a.clone(), b.clone(), c.clone()]);
            for v in &leaves {
                assert_eq!(
                    Some(&reported[v].to_string()),
                    lowered.get(&v.name.to_string()),
                    "seed {seed}: loop {}",
                    v.name
                );
            }
        }
    }

    #[test]
    fn split_and_fuse_extents() {
        let e = |v: i64| Expr::int(v);
        let s = |p: i64, f: Option<i64>, n: Option<i64>| {
            let (o, i) = split_extents(&e(p), f.map(e).as_ref(), n.map(e).as_ref()).unwrap();
            (o.as_int().unwrap(), i.as_int().unwrap())
        };
        assert_eq!(s(20, Some(7), None), (3, 7));
        assert_eq!(s(20, None, Some(4)), (4, 5));
        assert_eq!(s(5, Some(8), None), (1, 5)); // clamped to the axis
        assert_eq!(s(0, Some(4), None), (0, 0));
        assert!(split_extents(&e(4), None, None).is_none());
        // A small constant over a symbolic axis keeps its value (vectorize / unroll need it).
        let n = crate::te::var("n");
        let (_, i) = split_extents(&n, Some(&e(4)), None).unwrap();
        assert_eq!(i.as_int(), Some(4));
        assert_eq!(fuse_extent(&e(20), &e(18)).as_int(), Some(360));
        assert_eq!(fuse_extent(&n, &e(3)).to_string(), "(n * 3)");
    }
}
