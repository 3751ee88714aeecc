//! How much work a call does: the iteration space of a function, counted from its loops,
//! for the CPU's execution policy (`codegen::cpu_lib::launch::run_with_policy`: keep the host lock,
//! release it, use the thread pool).
//!
//! Counting the loops, not the arguments' elements, is what makes the decision right for
//! compute-bound kernels: a 100x100 GEMM holds 30,000 argument elements but does a million
//! multiply-adds, and should use the pool; an add of 1,000 elements should not.
//!
//! Invariants:
//! - the count is the number of `Store` / `AllReduce` executions (one per innermost
//!   iteration), a sum over the program's statements of the product of the extents of the
//!   loops around them; both arms of an `if` count (an upper bound), an outlined parallel body
//!   counts where it is launched;
//! - a loop whose extent depends on anything but the function's symbolic dims (a
//!   `compute_at` region sized by an outer loop, a guard) counts once: the estimate may be
//!   low there, never unsafe — it only chooses between serial and parallel execution of code
//!   that is correct either way;
//! - evaluation at call time is exact and saturating (`i64::MAX` on overflow), so no hostile
//!   shape can wrap it into a small number; negative extents count as 0.

use crate::arith::exact::eval_exact;
use crate::ir::expr::{Expr, Var};
use crate::ir::stmt::{PrimFunc, Stmt};
use std::collections::HashSet;

/// The iteration count of a function as a sum of products of extents over its dims.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Work {
    /// Each term: a constant factor and the symbolic extents it multiplies.
    terms: Vec<(i64, Vec<Expr>)>,
}

impl Work {
    /// The count of `f` (its outlined kernels counted where they are launched).
    pub fn of(f: &PrimFunc) -> Work {
        let dims: HashSet<u32> = f.dims.iter().map(|v| v.id).collect();
        let mut w = Work::default();
        count(f, &f.body, &dims, 1, &mut Vec::new(), &mut w);
        w
    }

    /// The count when every term is a constant (static shapes).
    pub fn constant(&self) -> Option<i64> {
        let mut total: i64 = 0;
        for (k, es) in &self.terms {
            if !es.is_empty() {
                return None;
            }
            total = total.saturating_add(*k);
        }
        Some(total)
    }

    /// The count for dims bound by `lookup`, saturating at `i64::MAX` (an overflow, or an
    /// extent that cannot be evaluated, counts as a lot of work).
    pub fn eval(&self, lookup: &dyn Fn(&Var) -> Option<i64>) -> i64 {
        let mut total: i64 = 0;
        for (k, es) in &self.terms {
            let mut p = *k;
            for e in es {
                let x = eval_exact(e, lookup).unwrap_or(i64::MAX).max(0);
                p = p.saturating_mul(x);
            }
            total = total.saturating_add(p);
        }
        total
    }
}

fn count(
    f: &PrimFunc,
    s: &Stmt,
    dims: &HashSet<u32>,
    k: i64,
    extents: &mut Vec<Expr>,
    out: &mut Work,
) {
    match s {
        Stmt::Store { .. } | Stmt::AllReduce { .. } => {
            // Merge with an equal term (same extents) to keep evaluation short.
            match out.terms.iter_mut().find(|(_, es)| es == extents) {
                Some((c, _)) => *c = c.saturating_add(k),
                None => out.terms.push((k, extents.clone())),
            }
        }
        Stmt::Barrier => {}
        // An intrinsic does the work of its declared computation (`ir::intrin::model`).
        Stmt::Call {
            intrin, regions, ..
        } => {
            let flat = regions.iter().all(|r| r.base.len() == 1);
            let model = crate::ir::intrin::model(f, *intrin, regions, flat);
            count(f, &model, dims, k, extents, out)
        }
        Stmt::Seq(v) => v.iter().for_each(|s| count(f, s, dims, k, extents, out)),
        Stmt::Let { body, .. } | Stmt::Allocate { body, .. } => {
            count(f, body, dims, k, extents, out)
        }
        Stmt::If {
            then, otherwise, ..
        } => {
            count(f, then, dims, k, extents, out);
            if let Some(o) = otherwise {
                count(f, o, dims, k, extents, out);
            }
        }
        Stmt::Launch { kernel } => {
            if let Some(kf) = f.kernels.get(*kernel) {
                count(f, &kf.body, dims, k, extents, out);
            }
        }
        Stmt::For { extent, body, .. } => {
            if let Some(c) = extent.as_int() {
                count(f, body, dims, k.saturating_mul(c.max(0)), extents, out);
            } else if only_dims(extent, dims) {
                extents.push(extent.clone());
                count(f, body, dims, k, extents, out);
                extents.pop();
            } else {
                count(f, body, dims, k, extents, out);
            }
        }
    }
}

/// True when `e` uses no variable but the function's symbolic dims.
fn only_dims(e: &Expr, dims: &HashSet<u32>) -> bool {
    let mut ok = true;
    e.visit_unique(&mut |n| {
        if let Some(v) = n.as_var() {
            ok &= dims.contains(&v.id);
        }
    });
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::cpu_lib::launch::{policy, Policy};
    use crate::kernels::defs;
    use crate::kernels::strategy::{schedule, Strategy};
    use crate::lower::{lower, Options, Source};
    use crate::target::Target;
    use rivet_runtime::DType;

    fn lowered(d: &defs::Def) -> PrimFunc {
        let s = schedule(d, Strategy::Cpu).unwrap();
        lower(
            Source::Schedule {
                sched: &s,
                args: &d.args,
                name: d.name,
            },
            &Target::cpu(),
            Options::default(),
        )
        .unwrap()
        .func
    }

    fn eval(f: &PrimFunc, dims: &[(&str, i64)]) -> i64 {
        Work::of(f).eval(&|v| dims.iter().find(|(n, _)| *n == &*v.name).map(|x| x.1))
    }

    /// The decision counts the iteration space: a 100x100 GEMM (30,000 argument elements, a
    /// million multiply-adds) uses the pool, an add of 1,000 elements stays inline.
    #[test]
    fn the_policy_counts_iterations_not_arguments() {
        let mm = lowered(&defs::matmul(DType::F32).unwrap());
        let w = eval(&mm, &[("m", 100), ("k", 100), ("n", 100)]);
        // The multiply-adds of the packed GEMM's padded tiles (108 x 128 outputs), plus the
        // initialisation of the padded C, the packing of both operands and the copy into C
        // (counted per store: a vector loop and both arms of its layout test count).
        let macs = 108 * 128 * 100;
        assert!((macs..macs + macs / 10).contains(&w), "{w}");
        const { assert!(3 * 100 * 100 < rivet_runtime::parallel::PARALLEL_GRAIN) };
        assert_eq!(policy(w), Policy::Pool);
        let add = lowered(
            &defs::binary(
                "add",
                DType::F32,
                &[crate::kernels::DimSpec::Name("n".into())],
                &[crate::kernels::DimSpec::Name("n".into())],
            )
            .unwrap(),
        );
        // 1000 stores, counted per store of the vectorized loop: 250 vector stores, the
        // scalar loop of the other layouts (both arms of the stride test count), a tail.
        let w = eval(&add, &[("n", 1000)]);
        assert!((250..=1300).contains(&w), "{w}");
        assert_eq!(policy(w), Policy::Inline);
        assert_eq!(policy(eval(&add, &[("n", 10_000)])), Policy::InlineUnlocked);
        assert_eq!(policy(eval(&add, &[("n", 1 << 20)])), Policy::Pool);
    }

    /// Hostile sizes saturate instead of wrapping into little work; negative extents are 0.
    #[test]
    fn counts_saturate() {
        let mm = lowered(&defs::matmul(DType::F32).unwrap());
        let big = 1i64 << 40;
        assert_eq!(eval(&mm, &[("m", big), ("k", big), ("n", big)]), i64::MAX);
        // No row: only B is packed (one 32-wide panel of 5 products). The panel loop is
        // versioned on its ragged end (`lower::partition`: the vector loop, its scalar copy
        // for a strided B, the loop as written), which the estimate counts as 72 per product,
        // both arms of each `if`: above the 32 * 5 stores made, not below.
        assert_eq!(eval(&mm, &[("m", 0), ("k", 5), ("n", 5)]), 72 * 5);
        // A static function is a constant.
        let f = crate::ir::test_util::func("empty", vec![], vec![], Stmt::Seq(vec![]));
        assert_eq!(Work::of(&f).constant(), Some(0));
    }
}
