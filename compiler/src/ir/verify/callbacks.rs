//! The host-callback rules of the IR verifier (`ir::verify` runs `check` on every function
//! it verifies: between the passes of `build`, and on every function a saved module holds).
//! What docs/callbacks.md promises — each callback runs exactly once per call, on whole
//! buffers — is a property of the program, so a crafted module file must not be able to break
//! it:
//!
//! - **exactly once**: every entry `k` of `PrimFunc::callbacks` is called (`Stmt::Call` of
//!   `Intrin::Callback(k)`) exactly once on every path through the body. Calls count along a
//!   sequence; the two branches of an `if` must call the same entries the same number of times
//!   (a pass may split the program on a test and copy it into both arms; an `if` without
//!   `else` calls nothing); a loop body calls none (`callback::check_placement` refuses that
//!   first, with its own message). So an entry called twice, or never (an unused entry), is
//!   refused.
//! - **whole buffers**: every region of a callback call is its whole buffer: base 0 and
//!   every dim in order (`verify::intrin::check_call`), and each extent equal to the buffer's extent of
//!   that dim — structurally, or as linear forms after simplification (`arith::simplify`),
//!   because the passes simplify region extents and not buffer shapes. An extent that is
//!   smaller would hand the callback part of a buffer and leave the rest as it was; one that
//!   may be larger would be a per-call bounds check instead of a refusal.
//!
//! Cost: the statement tree is walked once (it is a tree: statements are never shared, and
//! `Verifier::stmt` has bounded its size and depth before this runs); the multisets of calls
//! are merged small into large, and compared only at `if`s that call something. Expressions
//! are only those of callback regions and the shapes of their buffers, which the verifier has
//! already counted against `MAX_FUNC_NODES` as trees; each buffer dim's shape is simplified
//! once, however many regions name it.

use crate::arith::simplify::{linear, simplify, Linear};
use crate::ir::callback::{Callback, CallbackKind};
use crate::ir::expr::{BufId, Expr};
use crate::ir::intrin::{Intrin, Region};
use crate::ir::stmt::{PrimFunc, Stmt};
use std::collections::HashMap;

/// Checks the rules of the module documentation; `Err` is the message (the rule, the
/// callback's index, kind and stage, what was expected and what came). `func` must already
/// have passed the verifier's statement walk (table indices, region kinds and bases, limits).
pub fn check(func: &PrimFunc) -> Result<(), String> {
    if func.callbacks.is_empty() {
        // Any call of a callback names a missing entry, which `check_call` refuses.
        return Ok(());
    }
    let mut w = Walk {
        func,
        shapes: HashMap::new(),
    };
    let mut called = w.calls(&func.body)?;
    called.sort_unstable();
    // `called` is sorted: count each entry's calls in one pass.
    let mut at = 0;
    for (k, cb) in func.callbacks.iter().enumerate() {
        let mut n = 0usize;
        while at < called.len() && called[at] as usize == k {
            n += 1;
            at += 1;
        }
        match n {
            1 => {}
            0 => {
                return Err(format!(
                    "host callback called other than exactly once: {} is never called (an entry of the callback table no call refers to); each entry is called exactly once per call",
                    describe(k as u32, Some(cb))
                ))
            }
            n => {
                return Err(format!(
                    "host callback called other than exactly once: {} is called {n} times on one path through the program; each entry is called exactly once per call",
                    describe(k as u32, Some(cb))
                ))
            }
        }
    }
    if let Some(&k) = called.get(at) {
        return Err(format!(
            "host callback {k} is called, but the function has {} callbacks",
            func.callbacks.len()
        ));
    }
    Ok(())
}

/// `host callback 3 (the extern callback of stage 'E')`.
fn describe(k: u32, cb: Option<&Callback>) -> String {
    match cb {
        Some(cb) => {
            let kind = match cb.kind {
                CallbackKind::Extern => "extern stage",
                CallbackKind::Tap => "debug tap of stage",
            };
            format!("host callback {k} ({kind} '{}')", cb.stage)
        }
        None => format!("host callback {k} (not in the table)"),
    }
}

struct Walk<'a> {
    func: &'a PrimFunc,
    /// Per buffer dim: the simplified shape and its linear form (`None`: no such buffer or dim).
    shapes: HashMap<(BufId, usize), Option<(Expr, Option<Linear>)>>,
}

impl Walk<'_> {
    /// The callback entries `s` calls on every path through it (a multiset, in no order).
    /// Recurses once per statement level (bounded by `MAX_STMT_DEPTH`); region checks are out
    /// of line to keep the frame small.
    fn calls(&mut self, s: &Stmt) -> Result<Vec<u32>, String> {
        match s {
            Stmt::Call {
                intrin: Intrin::Callback(k),
                regions,
                ..
            } => {
                self.whole_regions(*k, regions)?;
                Ok(vec![*k])
            }
            Stmt::Seq(v) => {
                let mut acc = Vec::new();
                for x in v {
                    let mut c = self.calls(x)?;
                    // Small into large: each call is moved O(log n) times in all.
                    if c.len() > acc.len() {
                        std::mem::swap(&mut acc, &mut c);
                    }
                    acc.append(&mut c);
                }
                Ok(acc)
            }
            Stmt::Allocate { body, .. } | Stmt::Let { body, .. } => self.calls(body),
            Stmt::For {
                var, kind, body, ..
            } => {
                let c = self.calls(body)?;
                match c.first() {
                    None => Ok(c),
                    Some(&k) => Err(format!(
                        "host callback called other than exactly once: {} stands inside the {kind:?} loop '{}'; callbacks run once per call at the top level of the program",
                        describe(k, self.func.callbacks.get(k as usize)),
                        var.name
                    )),
                }
            }
            Stmt::If {
                then, otherwise, ..
            } => {
                let mut t = self.calls(then)?;
                let mut o = match otherwise {
                    Some(o) => self.calls(o)?,
                    None => Vec::new(),
                };
                if t.is_empty() && o.is_empty() {
                    return Ok(t);
                }
                // Already sorted runs (a set that rose through `if`s before) sort in linear
                // time; a set is compared here once and then dropped, or kept whole.
                t.sort_unstable();
                o.sort_unstable();
                if t != o {
                    return Err(self.branches_differ(&t, &o, otherwise.is_some()));
                }
                Ok(t)
            }
            Stmt::Store { .. }
            | Stmt::Barrier
            | Stmt::AllReduce { .. }
            | Stmt::Launch { .. }
            | Stmt::Call { .. } => Ok(Vec::new()),
        }
    }

    /// The message for an `if` whose branches (sorted call lists) differ: the first entry
    /// whose counts differ, and both counts.
    #[inline(never)]
    fn branches_differ(&self, t: &[u32], o: &[u32], has_else: bool) -> String {
        let count = |v: &[u32], k: u32| v.iter().filter(|&&x| x == k).count();
        let k = t
            .iter()
            .chain(o)
            .copied()
            .find(|&k| count(t, k) != count(o, k))
            .expect("the lists differ");
        let other = if has_else {
            format!("{} in the other", times(count(o, k)))
        } else {
            "0 times on the path that skips it (an `if` without `else`)".to_string()
        };
        format!(
            "host callback called other than exactly once: {} is called {} in one branch of an `if` and {other}; each entry is called exactly once on every path through the program",
            describe(k, self.func.callbacks.get(k as usize)),
            times(count(t, k)),
        )
    }

    /// Every region of a call of callback `k` is its whole buffer (module documentation).
    #[inline(never)]
    fn whole_regions(&mut self, k: u32, regions: &[Region]) -> Result<(), String> {
        let func = self.func;
        let what = || describe(k, func.callbacks.get(k as usize));
        for r in regions {
            let Some(b) = func.buffers.iter().find(|b| b.id == r.buf) else {
                return Err(format!(
                    "{}: a region of buffer id {} which the function does not declare",
                    what(),
                    r.buf.0
                ));
            };
            if r.axes.len() != b.shape.len() {
                return Err(format!(
                    "{}: its region of `{}` must be the whole buffer: it walks {} dims, the buffer has {}",
                    what(),
                    b.name,
                    r.axes.len(),
                    b.shape.len()
                ));
            }
            for (d, a) in r.axes.iter().enumerate() {
                if a.dim as usize != d {
                    return Err(format!(
                        "{}: its region of `{}` must be the whole buffer: axis {d} walks dim {}, expected dim {d} (every dim in order)",
                        what(),
                        b.name,
                        a.dim
                    ));
                }
                if !self.is_shape(r.buf, d, &a.extent) {
                    return Err(format!(
                        "{}: its region of `{}` must be the whole buffer: dim {d} has extent `{}`, expected the buffer's extent `{}`",
                        what(),
                        b.name,
                        short(&a.extent),
                        short(&b.shape[d])
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether `extent` equals the shape of dim `d` of `buf`: the same expression, or the same
    /// after simplification (structurally, or as linear forms with the same terms).
    fn is_shape(&mut self, buf: BufId, d: usize, extent: &Expr) -> bool {
        let func = self.func;
        let Some((shape, lin)) = self
            .shapes
            .entry((buf, d))
            .or_insert_with(|| {
                let b = func.buffers.iter().find(|b| b.id == buf)?;
                let s = simplify(b.shape.get(d)?);
                let l = linear(&s);
                Some((s, l))
            })
            .as_ref()
        else {
            return false;
        };
        let e = simplify(extent);
        if e.same(shape) || e == *shape {
            return true;
        }
        match (linear(&e), lin) {
            (Some(a), Some(b)) => same_linear(&a, b),
            _ => false,
        }
    }
}

/// Most terms compared in any order (more: in order only, keeping the comparison linear).
const MAX_UNORDERED_TERMS: usize = 64;

/// Equal linear forms: the same constant and the same coefficient for each atom.
fn same_linear(a: &Linear, b: &Linear) -> bool {
    if a.constant != b.constant || a.terms.len() != b.terms.len() {
        return false;
    }
    if a.terms.len() > MAX_UNORDERED_TERMS {
        return a.terms == b.terms;
    }
    a.terms
        .iter()
        .all(|(x, c)| b.terms.iter().any(|(y, k)| k == c && x == y))
}

fn times(n: usize) -> String {
    match n {
        1 => "once".into(),
        n => format!("{n} times"),
    }
}

/// An expression for a message: written out when small.
fn short(e: &Expr) -> String {
    const MAX: usize = 200;
    if e.tree_size_upto(MAX) < MAX {
        e.to_string()
    } else {
        format!("<an expression of {MAX} nodes or more>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::ir::test_util::{input, output};
    use crate::ir::verify::{verify, verify_loaded};
    use crate::ir::{Buffer, Callback, CallbackKind, Expr, RegionAxis, Var};
    use rivet_runtime::DType;

    /// `f(A: n) -> E: n` calling entry 0, an extern stage `E = cb(A)`, once.
    struct Base {
        f: PrimFunc,
        n: Var,
        a: Buffer,
        e: Buffer,
    }

    fn entry(kind: CallbackKind, stage: &str) -> Callback {
        Callback {
            kind,
            stage: stage.into(),
            registered: Some(format!("tests.{stage}")),
            func: None,
        }
    }

    fn whole(b: &Buffer, write: bool) -> Region {
        Region {
            buf: b.id,
            base: vec![Expr::int(0); b.shape.len()],
            axes: b
                .shape
                .iter()
                .enumerate()
                .map(|(d, e)| RegionAxis {
                    dim: d as u32,
                    extent: e.clone(),
                })
                .collect(),
            write,
        }
    }

    fn extern_call(b: &Base, k: u32) -> Stmt {
        Stmt::Call {
            intrin: Intrin::Callback(k),
            regions: vec![whole(&b.e, true), whole(&b.a, false)],
            scalars: vec![],
        }
    }

    fn tap_call(b: &Base, k: u32) -> Stmt {
        Stmt::Call {
            intrin: Intrin::Callback(k),
            regions: vec![whole(&b.e, false)],
            scalars: vec![],
        }
    }

    fn base() -> Base {
        let n = Var::new("n");
        let a = input(0, "A", DType::F32, vec![Expr::var(&n)]);
        let e = output(1, "E", DType::F32, vec![Expr::var(&n)]);
        let mut f = crate::ir::test_util::func(
            "cb",
            vec![a.clone(), e.clone()],
            vec![n.clone()],
            Stmt::Seq(vec![]),
        );
        f.callbacks = vec![entry(CallbackKind::Extern, "E")];
        let mut b = Base { f, n, a, e };
        b.f.body = extern_call(&b, 0);
        b
    }

    /// Both verifiers refuse `f` with a message containing every one of `parts`.
    fn refused(f: &PrimFunc, parts: &[&str]) {
        for (how, r) in [
            ("verify", verify(f, false)),
            ("verify_loaded", verify_loaded(f)),
        ] {
            let m = match r {
                Err(Error::Internal(m)) => m,
                other => panic!("{how}: expected a refusal, got {other:?}"),
            };
            assert!(m.contains("IR verifier, function `cb`"), "{how}: {m}");
            for p in parts {
                assert!(m.contains(p), "{how}: `{p}` not in: {m}");
            }
        }
    }

    fn accepted(f: &PrimFunc) {
        verify(f, false).unwrap();
        verify_loaded(f).unwrap();
    }

    #[test]
    fn one_call_per_entry_is_valid() {
        let mut b = base();
        accepted(&b.f);
        // An extern stage and a tap of it, in sequence, under a `let` and nested sequences.
        b.f.callbacks.push(entry(CallbackKind::Tap, "E"));
        let t = Var::new("t");
        b.f.body = Stmt::Let {
            var: t,
            value: Expr::int(1),
            body: Box::new(Stmt::Seq(vec![
                Stmt::Seq(vec![extern_call(&b, 0)]),
                Stmt::Seq(vec![Stmt::Seq(vec![]), tap_call(&b, 1)]),
            ])),
        };
        accepted(&b.f);
    }

    #[test]
    fn an_entry_called_twice_is_refused() {
        let mut b = base();
        b.f.body = Stmt::Seq(vec![extern_call(&b, 0), extern_call(&b, 0)]);
        refused(
            &b.f,
            &[
                "host callback 0 (extern stage 'E') is called 2 times",
                "exactly once",
            ],
        );
        // Twice through nested sequences, and three times.
        b.f.body = Stmt::Seq(vec![
            Stmt::Seq(vec![extern_call(&b, 0)]),
            Stmt::Seq(vec![extern_call(&b, 0), extern_call(&b, 0)]),
        ]);
        refused(&b.f, &["host callback 0", "called 3 times"]);
    }

    #[test]
    fn an_unused_entry_is_refused() {
        let mut b = base();
        b.f.callbacks.push(entry(CallbackKind::Tap, "T"));
        refused(
            &b.f,
            &[
                "host callback 1 (debug tap of stage 'T') is never called",
                "exactly once",
            ],
        );
        // The first entry unused, the second called: the first is named.
        b.f.body = tap_call(&b, 1);
        b.f.callbacks[1].stage = "E".into();
        refused(
            &b.f,
            &["host callback 0 (extern stage 'E') is never called"],
        );
    }

    #[test]
    fn branches_of_an_if_must_call_the_same_entries() {
        let mut b = base();
        let cond = Expr::var(&b.n).lt(&Expr::int(4));
        let branch = |then: Stmt, otherwise: Option<Stmt>| Stmt::If {
            cond: cond.clone(),
            then: Box::new(then),
            otherwise: otherwise.map(Box::new),
        };
        // Copied into both arms (what a pass splitting the program on a test makes): once on
        // every path.
        b.f.body = branch(extern_call(&b, 0), Some(extern_call(&b, 0)));
        accepted(&b.f);
        // In one arm only: zero times on the other path.
        b.f.body = branch(extern_call(&b, 0), None);
        refused(
            &b.f,
            &[
                "host callback 0 (extern stage 'E') is called once in one branch",
                "0 times on the path that skips it",
            ],
        );
        b.f.body = branch(Stmt::Seq(vec![]), Some(extern_call(&b, 0)));
        refused(&b.f, &["host callback 0", "0 times", "in the other"]);
        // Twice in one arm, once in the other.
        b.f.body = branch(
            Stmt::Seq(vec![extern_call(&b, 0), extern_call(&b, 0)]),
            Some(extern_call(&b, 0)),
        );
        refused(&b.f, &["host callback 0", "2 times", "once in the other"]);
        // Once in each arm, and once more after the `if`: twice on every path.
        b.f.body = Stmt::Seq(vec![
            branch(extern_call(&b, 0), Some(extern_call(&b, 0))),
            extern_call(&b, 0),
        ]);
        refused(&b.f, &["host callback 0", "called 2 times"]);
        // Different entries in the two arms: each is missing on one path.
        b.f.callbacks.push(entry(CallbackKind::Tap, "E"));
        b.f.body = branch(extern_call(&b, 0), Some(tap_call(&b, 1)));
        refused(&b.f, &["host callback 0", "in the other"]);
    }

    #[test]
    fn regions_are_whole_buffers() {
        let b = base();
        let with_extent = |which: usize, ext: Expr| {
            let mut f = b.f.clone();
            let Stmt::Call { regions, .. } = &mut f.body else {
                unreachable!()
            };
            regions[which].axes[0].extent = ext;
            f
        };
        let n = Expr::var(&b.n);
        // Equal after simplification: accepted.
        accepted(&with_extent(0, n.add(&Expr::int(1)).sub(&Expr::int(1))));
        accepted(&with_extent(1, Expr::int(0).add(&n)));
        // Smaller, larger or another expression: refused, naming the region and both extents.
        refused(
            &with_extent(0, n.sub(&Expr::int(1))),
            &[
                "host callback 0 (extern stage 'E')",
                "region of `E` must be the whole buffer",
                "dim 0 has extent `(n - 1)`",
                "expected the buffer's extent `n`",
            ],
        );
        refused(
            &with_extent(1, n.add(&Expr::int(1))),
            &["region of `A` must be the whole buffer", "expected"],
        );
        refused(
            &with_extent(1, Expr::int(8)),
            &["region of `A` must be the whole buffer", "extent `8`"],
        );
        // A symbolic shape with several terms, matched in any order.
        let m = Var::new("m");
        let mut f = b.f.clone();
        f.dims.push(m.clone());
        let shape = Expr::var(&b.n).add(&Expr::var(&m).mul(&Expr::int(2)));
        for buf in f.buffers.iter_mut() {
            buf.shape = vec![shape.clone()];
        }
        let Stmt::Call { regions, .. } = &mut f.body else {
            unreachable!()
        };
        for r in regions.iter_mut() {
            r.axes[0].extent = Expr::int(2).mul(&Expr::var(&m)).add(&Expr::var(&b.n));
        }
        accepted(&f);
    }

    #[test]
    fn functions_without_callbacks_are_untouched() {
        let mut b = base();
        b.f.callbacks.clear();
        b.f.body = Stmt::Seq(vec![]);
        accepted(&b.f);
    }
}
