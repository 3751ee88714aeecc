//! Pass: short vector loops unrolled (CPU). After `vectorize`, a serial loop of a constant trip
//! count of at most `MAX` whose body is only vector stores — the strip of a 16-lane partial
//! sum (four f32x4 iterations), a 32-wide row of a register tile (eight) — becomes its body
//! repeated with the loop variable a constant, then simplified: no counter, no branch,
//! constant offsets, and each copy's accesses visible as they are to the code generator's
//! promotion of loop-carried vectors to registers (`codegen/cranelift/hoist.rs`).
//!
//! A loop the schedule marked `unroll` (`ForKind::Unrolled`) of a constant trip count of at
//! most `MAX_MARKED` is unrolled whatever its body (a register tile's rows: each row's
//! accumulator then has a constant address the promotion can keep in a register); longer or
//! symbolic ones stay loops.
//!
//! Invariant: the copies run the iterations in order, each once, with the same statements, so
//! the result is the loop's; only loops the backends would run serially are touched.

use crate::ir::expr::Expr;
use crate::ir::stmt::{ForKind, PrimFunc, Stmt};

/// The longest loop of vector stores unrolled without being asked.
pub const MAX: i64 = 8;
/// The longest loop marked `unroll` that is unrolled.
pub const MAX_MARKED: i64 = 64;

/// Unrolls every short loop of vector stores in `f` (module doc).
pub fn unroll(f: &mut PrimFunc) {
    f.body = f.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
        Stmt::For {
            var,
            min,
            extent,
            body,
            kind,
        } if (kind == ForKind::Unrolled
            && matches!((min.as_int(), extent.as_int()), (Some(_), Some(n)) if (0..=MAX_MARKED).contains(&n)))
            || (kind != ForKind::Parallel
                && !matches!(kind, ForKind::Thread(_))
                && only_vector_stores(&body)
                && matches!((min.as_int(), extent.as_int()), (Some(_), Some(n)) if (0..=MAX).contains(&n))) =>
        {
            let (lo, n) = (min.as_int().unwrap_or(0), extent.as_int().unwrap_or(0));
            let copies = (lo..lo + n)
                .map(|k| {
                    let c = Expr::int(k);
                    body.rewrite(
                        &mut |e| e.substitute(&|x| (*x == var).then(|| c.clone())),
                        &mut |s| s,
                    )
                })
                .collect();
            Stmt::Seq(copies)
        }
        other => other,
    });
}

/// True when `s` is vector stores (under `let`s and sequences) and nothing else.
pub fn only_vector_stores(s: &Stmt) -> bool {
    match s {
        Stmt::Store { value, .. } => value.is_vector(),
        Stmt::Seq(v) => v.iter().all(only_vector_stores),
        Stmt::Let { body, .. } => only_vector_stores(body),
        _ => false,
    }
}
