//! Stages `compute_at` a consumer's loop: computed inside that loop over the region one of
//! its iterations reads (interval analysis), their stores guarded by the producer's extent.
//!
//! GPU memory caches (`Stage::scope` shared / local, from `cache_read` / `cache_write`): only
//! inside a kernel (attached at or below the innermost block loop of a GPU stage), in a
//! compact buffer of the region's constant shape, stores and the consumer's loads indexed
//! relative to the region's first element. A shared cache's region is the union over the
//! block's threads, its buffer allocated in the block body; a local one is allocated around
//! the loop it is attached to. A cache's loops bound to `threadIdx.*` are the block's thread
//! indices (the enclosing thread loop's variable, or a thread loop of the block's extent),
//! guarded where shorter than the block; block dimensions a shared cache does not bind are
//! left to thread 0. Barriers come later (`lower::sync`).

use super::gpu::{Kc, Place};
use super::{cerr, Ctx};
use crate::arith::interval::{interval, smax, smin, Env, Interval};
use crate::arith::simplify::simplify;
use crate::error::Result;
use crate::ir::expr::{BufId, Expr, ExprKind, Var};
use crate::ir::stmt::{Scope, Stmt};
use crate::schedule::loops::SMALL_SPLIT;
use crate::schedule::{Attach, Stage};

/// Largest shared cache buffer (CUDA's static shared memory per block; the CUDA backend
/// checks the sum against the target).
const MAX_SHARED_BYTES: i64 = 48 * 1024;
/// Largest local cache buffer per thread (registers or the stack; the interpreter keeps one
/// copy per thread of the block).
const MAX_LOCAL_BYTES: i64 = 16 * 1024;

impl Ctx<'_> {
    /// Nests of the stages attached at loop `var` of `consumer`, over the regions that
    /// `consumer_body` (the loops inside `var`) reads.
    ///
    /// Cache stages (shared / local scope) get a compact buffer of the region's constant
    /// shape, and the consumer's loads of it are rebased to the region's first element; a
    /// shared stage's region is the union over the block's threads (the thread indices
    /// enclosing `var` range over the block), since all threads share one copy. Returns the
    /// statements and the local buffers to allocate around the loop body.
    pub(super) fn attached_at(
        &self,
        consumer: &Stage,
        var: &Var,
        consumer_body: &mut Stmt,
        outer: &Env,
        place: &Place,
    ) -> Result<(Vec<Stmt>, Vec<BufId>)> {
        let mut out = Vec::new();
        let mut locals = Vec::new();
        for st in &self.sched.stages {
            let Attach::At {
                consumer: cid,
                var: v,
            } = &st.attach
            else {
                continue;
            };
            if *cid != consumer.tensor.id() || v != var {
                continue;
            }
            let pbuf = self.buf_of[&st.tensor.id()];
            let compact = st.scope != Scope::Global;
            let in_kernel = match place {
                Place::Grid { loop_name } => {
                    return cerr(format!(
                        "schedule of '{}': it is computed at block loop '{loop_name}' of '{}', above its innermost block loop; attach it at the innermost block loop or inside the block",
                        st.tensor.name(),
                        consumer.tensor.name()
                    ));
                }
                Place::Kernel(kc) => Some(kc),
                Place::Host => None,
            };
            if compact && in_kernel.is_none() {
                return cerr(format!(
                    "schedule of '{}': a {} cache stage must be compute_at inside a loop of a stage bound to a GPU, at or below its block loops; it is computed at loop '{}' of '{}', which is not inside a kernel",
                    st.tensor.name(),
                    if st.scope == Scope::Shared { "shared" } else { "local" },
                    var.name,
                    consumer.tensor.name()
                ));
            }
            if in_kernel.is_some() && !compact {
                return cerr(format!(
                    "schedule of '{}': it is computed at loop '{}' of '{}', which runs on a GPU: inside a kernel a stage needs a buffer in shared or local memory (s.cache_read / s.cache_write); compute '{}' at root or inline it",
                    st.tensor.name(),
                    var.name,
                    consumer.tensor.name(),
                    st.tensor.name()
                ));
            }
            let consumer_body_ro: &Stmt = consumer_body;
            // Ranges of the loops inside `var` (they vary within one iteration of it).
            let mut env = Env::default();
            let mut relaxed: Vec<Var> = Vec::new();
            if let (Some(kc), Scope::Shared) = (in_kernel, st.scope) {
                for (tag, u) in &kc.enclosing {
                    let dim = kc
                        .dim(*tag)
                        .expect("enclosing thread loops are the block's");
                    env.vars.insert(
                        u.clone(),
                        Interval {
                            lo: Expr::int(0),
                            hi: Expr::int(dim - 1),
                        },
                    );
                    relaxed.push(u.clone());
                }
            }
            consumer_body_ro.visit(&mut |s| {
                if let Stmt::For {
                    var, min, extent, ..
                } = s
                {
                    // Pre-order: loops enclosing this one are already in `env`, so bounds that
                    // mention them are resolved to the outer loops' ranges.
                    let last = simplify(&min.add(extent).sub(&Expr::int(1)));
                    let lo = interval(min, &env)
                        .map(|i| i.lo)
                        .unwrap_or_else(|| min.clone());
                    let hi = interval(&last, &env).map(|i| i.hi).unwrap_or(last);
                    env.vars.insert(var.clone(), Interval { lo, hi });
                    env.loops.insert(var.clone(), (min.clone(), extent.clone()));
                }
            });
            let ndim = st.tensor.ndim();
            let mut acc: Vec<Option<Interval>> = vec![None; ndim];
            let mut unknown = false;
            let mut found = false;
            // Each distinct load once (a union of intervals is the same for repeats), so a
            // shared DAG costs its size, not its size as a tree.
            consumer_body_ro.visit_exprs(&mut |e| {
                e.visit_unique(&mut |n| {
                    if let ExprKind::Load { buf, indices } = n.kind() {
                        if *buf == pbuf {
                            found = true;
                            for (d, i) in indices.iter().enumerate() {
                                match interval(i, &env) {
                                    Some(iv) => {
                                        acc[d] = Some(match acc[d].take() {
                                            None => iv,
                                            Some(p) => Interval {
                                                lo: smin(&p.lo, &iv.lo),
                                                hi: smax(&p.hi, &iv.hi),
                                            },
                                        })
                                    }
                                    None => unknown = true,
                                }
                            }
                        }
                    }
                })
            });
            if !found || unknown {
                return cerr(format!(
                    "schedule of '{}': compute_at '{}' inside loop '{}' of '{}': {}",
                    st.tensor.name(),
                    st.tensor.name(),
                    var.name,
                    consumer.tensor.name(),
                    if found {
                        "cannot bound the region it reads"
                    } else {
                        "that loop does not read it; attach it to a loop of a stage that reads it"
                    }
                ));
            }
            if compact {
                let region =
                    self.cache_region(st, consumer, var, acc, outer, in_kernel, &relaxed)?;
                let lo: Vec<Expr> = region.iter().map(|(lo, _)| lo.clone()).collect();
                // The consumer reads the region's copy: indices relative to its first element.
                *consumer_body = consumer_body.rewrite(
                    &mut |e| {
                        e.rewrite(&mut |n| match n.kind() {
                            ExprKind::Load { buf, indices } if *buf == pbuf => Some(Expr::load(
                                pbuf,
                                indices
                                    .iter()
                                    .zip(&lo)
                                    .map(|(i, l)| simplify(&i.sub(l)))
                                    .collect(),
                                n.dtype(),
                            )),
                            _ => None,
                        })
                    },
                    &mut |s| s,
                );
                out.push(self.emit(st, Some(region), place)?);
                if st.scope == Scope::Local {
                    locals.push(pbuf);
                } else {
                    self.pending_shared.borrow_mut().push(pbuf);
                }
                continue;
            }
            let region = acc
                .into_iter()
                .zip(st.tensor.shape())
                .map(|(iv, shape)| {
                    // `emit` guards the stores with the tensor's bounds, in the form the bounds
                    // proof matches. A region of a large constant extent is also clamped to
                    // the tensor: a loose interval (`i % 2**31` over a tensor of 4) must not
                    // become 2**31 guarded iterations. (Others keep their simpler form, which
                    // the proof bounds without `max`/`min` of outer loops.)
                    let iv = iv.expect("found");
                    let extent = simplify(&iv.hi.sub(&iv.lo).add(&Expr::int(1)));
                    let huge = match extent.as_int() {
                        Some(e) => e > SMALL_SPLIT,
                        // A symbolic region is clamped only when it may exceed the tensor by
                        // more than SMALL_SPLIT (`j * 2**31` over `j < n`), not when it is the
                        // tensor's own extent plus a halo (`n + 2`), which the proof bounds.
                        None => interval(&simplify(&extent.sub(shape)), outer)
                            .and_then(|i| simplify(&i.hi).as_int())
                            .is_none_or(|over| over > SMALL_SPLIT),
                    };
                    let iv = if !huge {
                        iv
                    } else {
                        Interval {
                            lo: smax(&iv.lo, &Expr::int(0)),
                            hi: smin(&iv.hi, &simplify(&shape.sub(&Expr::int(1)))),
                        }
                    };
                    let extent = simplify(&iv.hi.sub(&iv.lo).add(&Expr::int(1)));
                    // When the extent varies with the outer loops but has a constant bound,
                    // compute that many elements every time: a few more than needed (the
                    // guards keep them inside the tensor), in loops the proof can bound.
                    let cap = interval(&extent, outer)
                        .map(|i| simplify(&i.hi))
                        .and_then(|h| h.as_int());
                    match cap {
                        Some(c) if extent.as_int().is_none() => {
                            (iv.lo.clone(), Expr::int(c.max(0)))
                        }
                        // An empty region (hi < lo) computes nothing: extent 0, never negative.
                        _ => match extent.as_int() {
                            Some(c) if c < 0 => (iv.lo.clone(), Expr::int(0)),
                            _ => (iv.lo.clone(), extent),
                        },
                    }
                })
                .collect();
            out.push(self.emit(st, Some(region), place)?);
        }
        Ok((out, locals))
    }

    /// The region of cache stage `st` attached at `var` of `consumer`: per dim (first index,
    /// constant extent); sets its buffer's shape. `acc`: the interval each dim is read over.
    #[allow(clippy::too_many_arguments)]
    fn cache_region(
        &self,
        st: &Stage,
        consumer: &Stage,
        var: &Var,
        acc: Vec<Option<Interval>>,
        outer: &Env,
        kc: Option<&Kc>,
        relaxed: &[Var],
    ) -> Result<Vec<(Expr, Expr)>> {
        let name = st.tensor.name();
        let mut env = outer.clone();
        if let Some(kc) = kc {
            for (v, iv) in &kc.ranges.vars {
                env.vars.entry(v.clone()).or_insert_with(|| iv.clone());
            }
        }
        let mut region = Vec::new();
        let mut elems: i64 = 1;
        for (d, iv) in acc.into_iter().enumerate() {
            let iv = iv.expect("found");
            let mut uses_relaxed = None;
            iv.lo.visit_unique(&mut |n| {
                if let Some(v) = n.as_var() {
                    if relaxed.contains(v) {
                        uses_relaxed.get_or_insert(v.clone());
                    }
                }
            });
            if let Some(v) = uses_relaxed {
                return cerr(format!(
                    "schedule of '{name}': the region of dim {d} that the block reads at loop '{}' of '{}' starts at {}, which depends on thread index '{}': a shared cache needs one region for the whole block",
                    var.name, consumer.tensor.name(), iv.lo, v.name
                ));
            }
            let extent = simplify(&iv.hi.sub(&iv.lo).add(&Expr::int(1)));
            let c = match extent.as_int() {
                Some(c) => Some(c),
                None => interval(&extent, &env)
                    .map(|i| simplify(&i.hi))
                    .and_then(|h| h.as_int()),
            };
            let Some(c) = c else {
                return cerr(format!(
                    "schedule of '{name}': at loop '{}' of '{}' it would hold {extent} elements in dim {d}, not a constant: a {} cache has a constant shape (attach it at a loop whose iteration reads a constant-size region, e.g. split the loops inside by constant factors)",
                    var.name,
                    consumer.tensor.name(),
                    if st.scope == Scope::Shared { "shared" } else { "local" }
                ));
            };
            let c = c.max(0);
            elems = elems.saturating_mul(c);
            region.push((iv.lo.clone(), Expr::int(c)));
        }
        let bytes = elems.saturating_mul(st.tensor.dtype().size() as i64);
        let (limit, what) = if st.scope == Scope::Shared {
            (MAX_SHARED_BYTES, "shared memory per block")
        } else {
            (MAX_LOCAL_BYTES, "local memory per thread")
        };
        if bytes > limit {
            return cerr(format!(
                "schedule of '{name}': at loop '{}' of '{}' its region is {} elements ({bytes} bytes); a cache may use at most {limit} bytes of {what}: attach it at a deeper loop or tile smaller",
                var.name,
                consumer.tensor.name(),
                elems
            ));
        }
        let pbuf = self.buf_of[&st.tensor.id()];
        let mut bufs = self.buffers.borrow_mut();
        let b = bufs
            .iter_mut()
            .find(|b| b.id == pbuf)
            .expect("every stage has a buffer");
        b.shape = region.iter().map(|(_, e)| e.clone()).collect();
        b.scope = st.scope;
        Ok(region)
    }
}
