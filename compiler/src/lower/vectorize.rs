//! Pass: vectorize. Each `Vectorized` loop of a flattened function becomes vector IR (TVM's
//! model: `Ramp` indices, `Broadcast` scalars, vector `Load`/`Store`), strip-mined by the
//! target's vector width into a vector loop plus a scalar tail, so no backend repeats this
//! analysis. Backends choose how to run each vector node (packed SIMD or lane by lane); the
//! interpreter runs it lane by lane with the scalar semantics.
//!
//! What it does to `for v in [min, min + n) vectorized { body }`, with `W` lanes
//! (`target.vectorize_bytes() / size of the widest stored dtype`):
//!
//! ```text
//! if s_1 == 1 && ... {                  // only when some access's stride is a stride variable
//!   for v.v in [0, max(n, 0) // W) { body with v = ramp(min + v.v * W, 1, W) }
//!   for v in [min + max(n, 0) // W * W, + max(n, 0) % W) { body }      // the scalar tail
//! } else {
//!   for v in [min, min + n) { body }     // the loop as it was, scalar
//! }
//! ```
//!
//! Invariants (why the result means what the scalar loop meant, lane for lane):
//! - the vector and tail loops run exactly the iterations of the original loop, once each,
//!   in order of chunks, so every access the bounds proof covered is still the only one made
//!   (no lane touches memory the scalar loop would not have touched);
//! - the loop is vectorized only when its iterations cannot see each other: the body is
//!   stores (under `Let`s, which are inlined) and every buffer it writes is accessed (read or
//!   written) only at one index, `ramp(base, 1, W)` in the vector loop, so each lane owns its
//!   elements of every written buffer and executing statement by statement for all lanes
//!   equals executing iteration by iteration (parameters written are never aliased by other
//!   arguments: the runtime's overlap rule);
//! - nothing is evaluated that could fault where the scalar loop would not evaluate it: a
//!   `Select` or `&&`/`||` whose lazily evaluated operand divides integers, or loads memory
//!   under a condition the bounds proof may have used (an int comparison: `informs_bounds`),
//!   keeps the loop scalar, unless the load cannot fault (a constant index into a small
//!   local) or the statement makes it eagerly anyway (`eager_loads`). Loads under float
//!   conditions were proven in bounds for every iteration, so every lane may make them;
//! - accesses whose offset is affine in `v` with stride 1 become contiguous ramps, stride 0
//!   (loop-invariant) stays scalar and is broadcast, any other offset becomes a vector index
//!   (a gather, which backends run lane by lane);
//! - a stride that is a variable (a parameter's stride, bound at call time) is versioned: the
//!   vector code runs when it is 1 (compact tensors), the unchanged loop otherwise;
//! - reductions are never vectorized (`schedule` refuses `vectorize` on a reduction axis, and
//!   a store whose offset does not move with `v` keeps the loop scalar), so float results are
//!   bit-identical to the scalar loop's: lanes of partial sums would change the rounding.
//!
//! A loop it cannot vectorize is left as it is, `Vectorized`, and backends run it as a plain
//! loop. Checked mode (unflattened accesses) is not vectorized.

use crate::arith::simplify::{linear, simplify, Linear};
use crate::ir::expr::{BinOp, CmpOp, Expr, ExprKind, LogicOp, Var};
use crate::ir::stmt::{ForKind, PrimFunc, Stmt};
use crate::ir::BufId;
use rivet_runtime::DType;

/// Vectorizes every `Vectorized` loop of `func` it can (module header), by vectors of
/// `bytes` bytes (`Target::vectorize_bytes`); `None` leaves the function as it is.
/// `wide_math`: a loop storing float32 values that compute float32 `erf` gets `WIDE_LANES`
/// lanes instead (the CPU with AVX-512: one `rivet_erff16` call per sixteen lanes,
/// `codegen::cpu_lib::erff16`, the rest as four f32x4 registers).
pub fn vectorize(func: &mut PrimFunc, bytes: Option<u32>, wide_math: bool) {
    let Some(bytes) = bytes else {
        return;
    };
    // Locals of a constant size: a load of one at a constant index inside it cannot fault, so
    // it may be evaluated for every lane even under a `select` arm (a row's scalars: the
    // gradient of a max reduction reads `adjoint / ties` only where an element is the max).
    let sizes = local_sizes(&func.buffers);
    let width = Width {
        bytes,
        wide_math,
        sizes: &sizes,
    };
    func.body = func.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
        Stmt::For {
            var,
            min,
            extent,
            kind: ForKind::Vectorized,
            body,
        } => match vectorize_guarded(&var, &min, &extent, &body, width) {
            Some(v) => v,
            None => Stmt::For {
                var,
                min,
                extent,
                kind: ForKind::Vectorized,
                body,
            },
        },
        other => other,
    });
}

/// `vectorize_loop`, first moving a guard `if c1 && c2 && ...` around the whole body out of
/// the loop (split remainders: `if j.outer * 4 + j.inner < n`): a conjunct that does not use
/// `v` becomes an `if` around the loop (it is load-free, so evaluating it once, even for a
/// loop of no iterations, has no effect), and a conjunct `v + r < x` (or `<=`) holds exactly
/// for a prefix of the iterations, so it becomes a shorter extent. The loop then runs exactly
/// the iterations whose guard held, in the same order.
fn vectorize_guarded(
    v: &Var,
    min: &Expr,
    extent: &Expr,
    body: &Stmt,
    width: Width<'_>,
) -> Option<Stmt> {
    let Stmt::If {
        cond,
        then,
        otherwise: None,
    } = body
    else {
        return vectorize_loop(v, min, extent, body, width);
    };
    if has_load(cond) {
        return None;
    }
    let mut conj = Vec::new();
    conjuncts(cond, &mut conj);
    let mut hoisted: Vec<Expr> = Vec::new();
    // Run-time conditions under which the new extent cannot wrap (below); when one fails the
    // original loop runs instead.
    let mut no_wrap: Vec<Expr> = Vec::new();
    let mut ext = extent.clone();
    for c in conj {
        if !c.uses(v) {
            hoisted.push(c);
            continue;
        }
        // `a < b` or `a <= b` with `a - b = v + rest`: v < -rest (+ 1 for `<=`).
        let ExprKind::Cmp(op @ (CmpOp::Lt | CmpOp::Le), a, b) = c.kind() else {
            return None;
        };
        if a.dtype() != DType::I64 {
            return None;
        }
        let l = linear(&a.sub(b))?;
        let (coef, rest) = coefficient_and_rest(&l, v)?;
        if coef != 1 {
            return None;
        }
        // The new extent `-rest (+ 1) - min` is computed in int64 at run time, after the
        // bounds proof: it must never wrap, since a wrap to a large value would run the
        // iterations the guard skipped (out-of-bounds stores). Comparisons cannot overflow, and
        // the atoms are nodes of the guard, which the proof kept inside int64; so bound each
        // term to |k * t| <= 2^58 and min to |min| <= 2^58 by comparisons first: with at most
        // 8 terms and |constant| <= 2^58 every partial sum stays under 2^62.
        if rest.terms.len() > 8 || rest.constant.unsigned_abs() > NO_WRAP as u64 {
            return None;
        }
        for (t, k) in &rest.terms {
            let lim = NO_WRAP / k.unsigned_abs().max(1) as i64;
            no_wrap.push(within(t, lim)?);
        }
        match min.as_int() {
            Some(m) if m.unsigned_abs() <= NO_WRAP as u64 => {}
            Some(_) => return None,
            None => no_wrap.push(within(min, NO_WRAP)?),
        }
        // Iterations v in [min, limit): limit = -rest (+1).
        let limit = Expr::int(0).sub(&rest.to_expr());
        let limit = if *op == CmpOp::Le {
            limit.add(&Expr::int(1))
        } else {
            limit
        };
        ext = ext.min_(&limit.sub(min));
    }
    let ext = simplify(&ext);
    let inner = unless_wrapping(
        no_wrap,
        vectorize_loop(v, min, &ext, then, width)?,
        (v, min, extent, body),
    );
    Some(
        match hoisted
            .into_iter()
            .reduce(|a, b| Expr::new(ExprKind::Logic(LogicOp::And, a, b), DType::Bool))
        {
            Some(c) => Stmt::If {
                cond: c,
                then: Box::new(inner),
                otherwise: None,
            },
            None => inner,
        },
    )
}

/// Bound on each term of a guard's rewritten limit (`vectorize_guarded`).
pub(crate) const NO_WRAP: i64 = 1 << 58;

/// `-lim <= e && e <= lim` (load-free when `e` is).
pub(crate) fn within(e: &Expr, lim: i64) -> Option<Expr> {
    let lo = Expr::cmp(CmpOp::Le, Expr::int(-lim), e.clone()).ok()?;
    let hi = Expr::cmp(CmpOp::Le, e.clone(), Expr::int(lim)).ok()?;
    Some(Expr::new(
        ExprKind::Logic(LogicOp::And, lo, hi),
        DType::Bool,
    ))
}

pub(crate) fn conjuncts(e: &Expr, out: &mut Vec<Expr>) {
    match e.kind() {
        ExprKind::Logic(LogicOp::And, a, b) => {
            conjuncts(a, out);
            conjuncts(b, out)
        }
        _ => out.push(e.clone()),
    }
}

pub(crate) fn has_load(e: &Expr) -> bool {
    let mut l = false;
    e.visit_unique(&mut |m| l |= matches!(m.kind(), ExprKind::Load { .. }));
    l
}

/// The stores of a body made only of stores, sequences and `Let`s (inlined), or `None`.
fn stores(s: &Stmt, out: &mut Vec<(BufId, Expr, Expr)>) -> Option<()> {
    match s {
        Stmt::Store {
            buf,
            indices,
            value,
        } if indices.len() == 1 => {
            out.push((*buf, indices[0].clone(), value.clone()));
            Some(())
        }
        Stmt::Seq(v) => v.iter().try_for_each(|s| stores(s, out)),
        // Inlining moves the value's evaluation after the stores before its uses: only
        // load-free values (whose result no store can change) are inlined.
        Stmt::Let { var, value, body } if !has_load(value) => {
            let mut inner = Vec::new();
            stores(body, &mut inner)?;
            let sub = |e: &Expr| e.substitute(&|x: &Var| (x == var).then(|| value.clone()));
            out.extend(inner.into_iter().map(|(b, i, v)| (b, sub(&i), sub(&v))));
            Some(())
        }
        _ => None,
    }
}

/// The element counts of the constant-size locals among `buffers`.
pub(crate) fn local_sizes(buffers: &[crate::ir::Buffer]) -> Vec<(BufId, i64)> {
    buffers
        .iter()
        .filter(|b| matches!(b.kind, crate::ir::BufKind::Local))
        .filter_map(|b| {
            let mut n: i64 = 1;
            for d in &b.shape {
                n = n.checked_mul(simplify(d).as_int()?)?;
            }
            Some((b.id, n))
        })
        .collect()
}

/// Whether loading `buf[indices]` (flattened) can never fault, so evaluating it where the
/// scalar code would skip it is harmless: a constant index inside a local of a constant size
/// (`sizes`, from `local_sizes`). The value read is discarded where the scalar code would not
/// have read it.
pub(crate) fn harmless_load(sizes: &[(BufId, i64)], buf: BufId, indices: &[Expr]) -> bool {
    match (indices, sizes.iter().find(|(b, _)| *b == buf)) {
        ([i], Some(&(_, n))) => i.as_int().is_some_and(|k| (0..n).contains(&k)),
        _ => false,
    }
}

/// The loads `e` always makes (not under a `Select` arm or the right side of `&&` / `||`):
/// the scalar loop makes them in every iteration it evaluates `e`.
pub(crate) fn eager_loads(e: &Expr) -> Vec<(BufId, Vec<Expr>)> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![e];
    while let Some(n) = stack.pop() {
        if !seen.insert(n as *const Expr) {
            continue;
        }
        match n.kind() {
            ExprKind::Select(c, _, _) | ExprKind::Logic(_, c, _) => stack.push(c),
            kind => {
                if let ExprKind::Load { buf, indices } = kind {
                    out.push((*buf, indices.clone()));
                }
                n.for_each_child(&mut |c| stack.push(c));
            }
        }
    }
    out
}

/// Whether the bounds proof may have relied on `c` for what it guards: `Env::assume` learns
/// only from comparisons of int64s, and the per-call checks are made vacuous only under
/// int / bool guards (`lower/bounds.rs`). A condition with no comparison of non-floats told
/// the proof nothing: every load under it was proven in bounds for every iteration.
pub(crate) fn informs_bounds(c: &Expr) -> bool {
    let mut yes = false;
    c.visit_unique(&mut |n| {
        yes |= matches!(n.kind(), ExprKind::Cmp(_, a, _) if !a.dtype().is_float())
    });
    yes
}

/// True when evaluating `e` might do what the scalar loop would skip: a lazily evaluated
/// operand (a `Select` arm, the right side of `&&`/`||`) that divides integers, or that loads
/// memory under a condition the bounds proof may have relied on (`informs_bounds`: an int
/// comparison, `i < n` around a padded read; vector code evaluates both sides for every
/// lane), or an index that itself loads memory. Under a float condition (`X[i] == max`, a
/// max reduction's derivative) every load was proven in bounds unconditionally, so computing
/// it for every lane reads nothing out of bounds; the select discards the value. A load of a
/// local of constant size `sizes` at a constant index inside it is harmless (it cannot
/// fault), and so is a load `e` also makes eagerly at the same index (`select(X[i] > 0, 1,
/// select(X[i] == 0, 0.5, 0))`, relu's derivative: the scalar loop read `X[i]` anyway).
fn unsafe_to_evaluate_eagerly(e: &Expr, sizes: &[(BufId, i64)]) -> bool {
    let eager = eager_loads(e);
    let risky = |x: &Expr, guarded_bounds: bool| {
        let mut r = false;
        x.visit_unique(&mut |n| {
            r |= match n.kind() {
                ExprKind::Load { buf, indices } => {
                    guarded_bounds
                        && !harmless_load(sizes, *buf, indices)
                        && !eager.iter().any(|(b, i)| b == buf && i == indices)
                }
                ExprKind::Binary(BinOp::FloorDiv | BinOp::FloorMod, _, d) => {
                    !n.dtype().is_float() && d.as_int().is_none_or(|k| k == 0)
                }
                _ => false,
            }
        });
        r
    };
    let mut bad = false;
    e.visit_unique(&mut |n| {
        bad |= match n.kind() {
            ExprKind::Select(c, a, b) => {
                let g = informs_bounds(c);
                risky(a, g) || risky(b, g)
            }
            ExprKind::Logic(_, a, b) => risky(b, informs_bounds(a)),
            ExprKind::Load { indices, .. } => indices.iter().any(has_load),
            ExprKind::Ramp { .. } | ExprKind::Broadcast { .. } => true,
            _ => false,
        }
    });
    bad
}

/// Every (buffer, index) access in `e`.
fn loads(e: &Expr, out: &mut Vec<(BufId, Expr)>) {
    e.visit_unique(&mut |n| {
        if let ExprKind::Load { buf, indices } = n.kind() {
            if let Some(i) = indices.first() {
                out.push((*buf, i.clone()));
            }
        }
    });
}

/// Lanes of a float32 loop computing `erf` (`vectorize`'s `wide_math`).
pub const WIDE_LANES: u32 = 16;

/// The vector width of the pass (`vectorize`).
#[derive(Clone, Copy)]
struct Width<'a> {
    bytes: u32,
    wide_math: bool,
    /// Element counts of the function's constant-size locals (`unsafe_to_evaluate_eagerly`).
    sizes: &'a [(BufId, i64)],
}

fn vectorize_loop(
    v: &Var,
    min: &Expr,
    extent: &Expr,
    body: &Stmt,
    width: Width<'_>,
) -> Option<Stmt> {
    let mut sts = Vec::new();
    stores(body, &mut sts)?;
    if sts.is_empty() {
        return None;
    }
    // Lanes: the widest stored element fills the vector.
    let widest = sts.iter().map(|(_, _, x)| x.dtype().size()).max()? as u32;
    let wide_math = |e: &Expr| {
        let mut yes = false;
        e.visit(&mut |n| {
            // Not `exp`: its inline 4-lane code (`cranelift/vector_exp.rs`) measured faster
            // than a 16-lane AVX-512 call per sixteen (softmax, one thread: 12.3 vs 14.6 ms).
            yes |= matches!(n.kind(), ExprKind::Unary(crate::ir::UnOp::Erf, a) if a.dtype() == DType::F32)
        });
        yes
    };
    let lanes = if width.wide_math && widest == 4 && sts.iter().any(|(_, _, x)| wide_math(x)) {
        WIDE_LANES
    } else {
        width.bytes / widest.max(1)
    };
    if !(2..=crate::ir::verify::MAX_LANES).contains(&lanes) {
        return None;
    }
    // Dependence rule: each written buffer is accessed at one index only.
    let mut accesses = Vec::new();
    for (b, i, x) in &sts {
        if unsafe_to_evaluate_eagerly(x, width.sizes) || unsafe_to_evaluate_eagerly(i, width.sizes)
        {
            return None;
        }
        accesses.push((*b, i.clone()));
        loads(x, &mut accesses);
        loads(i, &mut accesses);
    }
    for (wb, wi, _) in &sts {
        if accesses.iter().any(|(b, i)| b == wb && i != wi) {
            return None;
        }
    }
    // Strides that are variables: versioned on being 1.
    let vec_v = Var::new(&format!("{}.v", v.name));
    let base = simplify(&min.add(&Expr::var(&vec_v).mul(&Expr::int(i64::from(lanes)))));
    let cx = Cx {
        v,
        ramp: Expr::ramp(base, Expr::int(1), lanes),
        lanes,
    };
    let mut version: Vec<Var> = Vec::new();
    for (_, i) in &accesses {
        if let Some(ExprKind::Ramp { stride, .. }) = cx.vec(i).as_ref().map(|e| e.kind().clone()) {
            if let Some(s) = stride.as_var() {
                if !version.contains(s) {
                    version.push(s.clone());
                }
            }
        }
    }
    let one = |e: &Expr| e.substitute(&|x: &Var| version.contains(x).then(|| Expr::int(1)));
    let mut vstores = Vec::new();
    for (b, i, x) in &sts {
        let (i, x) = (simplify(&one(i)), one(x));
        let vi = cx.vec(&i)?;
        match vi.kind() {
            ExprKind::Ramp { stride, .. } if stride.as_int() == Some(1) => {}
            _ => return None,
        }
        let vx = cx.vec(&x)?;
        let vx = if vx.is_vector() {
            vx
        } else {
            Expr::broadcast(vx, lanes)
        };
        vstores.push(Stmt::Store {
            buf: *b,
            indices: vec![vi],
            value: vx,
        });
    }
    // The strip-mined loops.
    // The iteration count, bound once (`v.n`) when it is not a constant.
    let count = Var::new(&format!("{}.n", v.name));
    let (n, bind) = match extent.as_int() {
        Some(k) => (Expr::int(k.max(0)), None),
        None => (
            Expr::var(&count),
            Some(simplify(&extent.max_(&Expr::int(0)))),
        ),
    };
    let w = Expr::int(i64::from(lanes));
    let chunks = simplify(&n.floordiv(&w));
    let done = simplify(&chunks.mul(&w));
    let rest = simplify(&n.floormod(&w));
    let mut parts = Vec::new();
    if chunks.as_int() != Some(0) {
        parts.push(Stmt::For {
            var: vec_v,
            min: Expr::int(0),
            extent: chunks,
            kind: ForKind::Serial,
            body: Box::new(Stmt::seq(vstores)),
        });
    }
    if rest.as_int() != Some(0) {
        parts.push(Stmt::For {
            var: v.clone(),
            min: simplify(&min.add(&done)),
            extent: rest,
            kind: ForKind::Serial,
            body: Box::new(body.clone()),
        });
    }
    if parts.is_empty() {
        // A loop of no iterations.
        return None;
    }
    let fast = Stmt::seq(parts);
    let fast = match bind {
        Some(value) => Stmt::Let {
            var: count,
            value,
            body: Box::new(fast),
        },
        None => fast,
    };
    if version.is_empty() {
        return Some(fast);
    }
    let cond = version
        .iter()
        .map(|s| {
            Expr::new(
                ExprKind::Cmp(CmpOp::Eq, Expr::var(s), Expr::int(1)),
                DType::Bool,
            )
        })
        .reduce(|a, b| Expr::new(ExprKind::Logic(LogicOp::And, a, b), DType::Bool))?;
    Some(Stmt::If {
        cond,
        then: Box::new(fast),
        otherwise: Some(Box::new(Stmt::For {
            var: v.clone(),
            min: min.clone(),
            extent: extent.clone(),
            kind: ForKind::Serial,
            body: Box::new(body.clone()),
        })),
    })
}

/// Turns scalar expressions of the loop body into vector ones.
struct Cx<'a> {
    v: &'a Var,
    /// What `v` becomes: `ramp(min + v.v * W, 1, W)`.
    ramp: Expr,
    lanes: u32,
}

impl Cx<'_> {
    fn widen(&self, e: Expr) -> Expr {
        if e.is_vector() {
            e
        } else {
            Expr::broadcast(e, self.lanes)
        }
    }

    /// `e` with `v` as its lanes: a scalar (returned as is) when `e` does not use `v`, else an
    /// expression of `lanes` lanes; `None` for nodes it does not vectorize.
    fn vec(&self, e: &Expr) -> Option<Expr> {
        if !e.uses(self.v) {
            return Some(e.clone());
        }
        let dt = e.dtype();
        let k = match e.kind() {
            ExprKind::Var(_) => return Some(self.ramp.clone()),
            ExprKind::Binary(op, a, b) => {
                let (x, y) = (self.vec(a)?, self.vec(b)?);
                if let Some(r) = affine(*op, &x, &y) {
                    return Some(r);
                }
                ExprKind::Binary(*op, self.widen(x), self.widen(y))
            }
            ExprKind::Unary(op, a) => ExprKind::Unary(*op, self.vec(a)?),
            ExprKind::Cast(a) => ExprKind::Cast(self.vec(a)?),
            ExprKind::Cmp(op, a, b) => {
                ExprKind::Cmp(*op, self.widen(self.vec(a)?), self.widen(self.vec(b)?))
            }
            ExprKind::Logic(op, a, b) => {
                ExprKind::Logic(*op, self.widen(self.vec(a)?), self.widen(self.vec(b)?))
            }
            ExprKind::Select(c, a, b) => ExprKind::Select(
                self.widen(self.vec(c)?),
                self.widen(self.vec(a)?),
                self.widen(self.vec(b)?),
            ),
            ExprKind::Load { buf, indices } if indices.len() == 1 => ExprKind::Load {
                buf: *buf,
                indices: vec![self.vec(&indices[0])?],
            },
            ExprKind::Fma(a, b, c) => ExprKind::Fma(
                self.widen(self.vec(a)?),
                self.widen(self.vec(b)?),
                self.widen(self.vec(c)?),
            ),
            _ => return None,
        };
        Some(Expr::new(k, dt))
    }
}

/// Ramp arithmetic: `ramp + scalar`, `ramp + ramp`, `ramp - scalar`, `scalar - ramp`,
/// `ramp * constant` stay ramps (base and stride simplified); `None` for other forms.
fn affine(op: BinOp, x: &Expr, y: &Expr) -> Option<Expr> {
    let parts = |e: &Expr| match e.kind() {
        ExprKind::Ramp {
            base,
            stride,
            lanes,
        } => Some((base.clone(), stride.clone(), *lanes)),
        _ => None,
    };
    let scalar = |e: &Expr| !e.is_vector() && e.dtype() == DType::I64;
    let ramp = |b: Expr, s: Expr, l| Some(Expr::ramp(simplify(&b), simplify(&s), l));
    match (op, parts(x), parts(y)) {
        (BinOp::Add, Some((b1, s1, l)), Some((b2, s2, _))) => ramp(b1.add(&b2), s1.add(&s2), l),
        (BinOp::Sub, Some((b1, s1, l)), Some((b2, s2, _))) => ramp(b1.sub(&b2), s1.sub(&s2), l),
        (BinOp::Add, Some((b, s, l)), None) if scalar(y) => ramp(b.add(y), s, l),
        (BinOp::Add, None, Some((b, s, l))) if scalar(x) => ramp(x.add(&b), s, l),
        (BinOp::Sub, Some((b, s, l)), None) if scalar(y) => ramp(b.sub(y), s, l),
        (BinOp::Sub, None, Some((b, s, l))) if scalar(x) => {
            ramp(x.sub(&b), Expr::int(0).sub(&s), l)
        }
        // Multiplying by a loop-invariant scalar (a constant or a stride variable).
        (BinOp::Mul, Some((b, s, l)), None) if scalar(y) => ramp(b.mul(y), s.mul(y), l),
        (BinOp::Mul, None, Some((b, s, l))) if scalar(x) => ramp(x.mul(&b), x.mul(&s), l),
        _ => None,
    }
}

/// `fast` when every `no_wrap` condition holds at run time, else the original vectorized loop
/// `for v in [min, min + extent): body` (`fast` alone when there is no condition): the
/// rewrites that bound a loop by its guards keep the loop as written for operands where
/// those bounds could wrap.
pub(crate) fn unless_wrapping(
    no_wrap: Vec<Expr>,
    fast: Stmt,
    (v, min, extent, body): (&Var, &Expr, &Expr, &Stmt),
) -> Stmt {
    match no_wrap
        .into_iter()
        .reduce(|a, b| Expr::new(ExprKind::Logic(LogicOp::And, a, b), DType::Bool))
    {
        None => fast,
        Some(c) => Stmt::If {
            cond: c,
            then: Box::new(fast),
            otherwise: Some(Box::new(Stmt::For {
                var: v.clone(),
                min: min.clone(),
                extent: extent.clone(),
                kind: ForKind::Vectorized,
                body: Box::new(body.clone()),
            })),
        },
    }
}

/// `l` as `coef * v + rest` with `rest` free of `v` (`coef` 0 when `v` does not occur);
/// `None` when a term uses `v` other than as `v` itself (`v * w`, `v // 2`).
pub(crate) fn coefficient_and_rest(l: &Linear, v: &Var) -> Option<(i64, Linear)> {
    let mut rest = Linear::default();
    let mut coef = 0;
    for (t, k) in &l.terms {
        if t.as_var() == Some(v) {
            coef = *k;
        } else if t.uses(v) {
            return None;
        } else {
            rest.terms.push((t.clone(), *k));
        }
    }
    rest.constant = l.constant;
    Some((coef, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::test_util::{func, input, output};
    use crate::ir::verify::{verify, verify_loaded};
    use crate::ir::BinOp;

    /// `for i in [0, extent): C[index(i)] = A[index(i)] + 1` over float32 buffers of `len`
    /// elements (one dim, indices used as flat offsets: unflattened and flattened agree).
    fn copy_plus_one(
        len: i64,
        extent: i64,
        index: impl Fn(&Var) -> Expr,
        value: impl Fn(Expr) -> Expr,
    ) -> PrimFunc {
        let i = Var::new("i");
        let a = input(0, "A", DType::F32, vec![Expr::int(len)]);
        let c = output(1, "C", DType::F32, vec![Expr::int(len)]);
        let body = Stmt::For {
            var: i.clone(),
            min: Expr::int(0),
            extent: Expr::int(extent),
            kind: ForKind::Serial,
            body: Box::new(Stmt::Store {
                buf: c.id,
                indices: vec![index(&i)],
                value: value(Expr::load(a.id, vec![index(&i)], DType::F32)),
            }),
        };
        func("f", vec![a, c], vec![], body)
    }

    fn msg<T: std::fmt::Debug>(r: crate::error::Result<T>) -> String {
        match r {
            Err(e) => e.to_string(),
            Ok(v) => panic!("expected an error, got {v:?}"),
        }
    }

    fn ramp4(i: &Var) -> Expr {
        Expr::ramp(Expr::var(i).mul(&Expr::int(4)), Expr::int(1), 4)
    }

    #[test]
    fn well_formed_vector_ir_verifies() {
        let one = |x: Expr| {
            let b = Expr::broadcast(Expr::constant(1.0, DType::F32), 4);
            Expr::binary(BinOp::Add, x, b).unwrap()
        };
        let f = copy_plus_one(8, 2, ramp4, one);
        verify(&f, true).unwrap();
        let mut g = f.clone();
        super::super::bounds::prove(&mut g).unwrap();
        assert!(g.checks.is_empty());
        assert!(f.to_string().contains("ramp(("), "{f}");
    }

    #[test]
    fn lane_mismatches_are_refused() {
        // A 4-lane load plus a 2-lane broadcast.
        let f = copy_plus_one(8, 2, ramp4, |x| {
            let b = Expr::broadcast(Expr::constant(1.0, DType::F32), 2);
            Expr::new(ExprKind::Binary(BinOp::Add, x, b), DType::F32)
        });
        assert!(msg(verify(&f, true)).contains("lane mismatch"));
        // A 4-lane load plus a scalar (never implicit: broadcasts are explicit).
        let f = copy_plus_one(8, 2, ramp4, |x| {
            let b = Expr::constant(1.0, DType::F32);
            Expr::new(ExprKind::Binary(BinOp::Add, x, b), DType::F32)
        });
        assert!(msg(verify(&f, true)).contains("lane mismatch"));
        // A 4-lane index storing a scalar.
        let f = copy_plus_one(8, 2, ramp4, |_| Expr::constant(1.0, DType::F32));
        assert!(msg(verify(&f, true)).contains("lane mismatch"));
        // A ramp of a ramp, and lane counts out of range.
        let f = copy_plus_one(8, 2, |i| Expr::ramp(ramp4(i), Expr::int(1), 4), |x| x);
        assert!(msg(verify(&f, true)).contains("lane mismatch"));
        for lanes in [0, 1, 17] {
            let f = copy_plus_one(
                64,
                2,
                |i| Expr::ramp(Expr::var(i), Expr::int(1), lanes),
                |x| x,
            );
            assert!(msg(verify(&f, true)).contains("2..=16"), "{lanes}");
        }
        // A float ramp.
        let f = copy_plus_one(
            8,
            2,
            |i| {
                Expr::new(
                    ExprKind::Ramp {
                        base: Expr::var(i),
                        stride: Expr::constant(1.0, DType::F32),
                        lanes: 4,
                    },
                    DType::I64,
                )
            },
            |x| x,
        );
        assert!(msg(verify(&f, true)).contains("int64"));
    }

    #[test]
    fn vector_ir_in_a_loaded_nest_is_refused() {
        let f = copy_plus_one(8, 2, ramp4, |x| x);
        assert!(msg(verify_loaded(&f)).contains("vector IR in a loaded loop nest"));
        // Old files: no lanes anywhere, and they still load (lanes are derived).
        let g = copy_plus_one(8, 8, Expr::var, |x| x);
        let text = serde_json::to_string(&g).unwrap();
        assert!(!text.contains("lanes"), "{text}");
        let back: PrimFunc = serde_json::from_str(&text).unwrap();
        verify_loaded(&back).unwrap();
        // A saved vector node keeps its lanes (a Ramp says them).
        let text = serde_json::to_string(&f).unwrap();
        let back: PrimFunc = serde_json::from_str(&text).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn every_lane_must_be_proved_in_bounds() {
        // i in [0, 8): lanes i .. i + 3 pass the end of an 8-element buffer from i = 5.
        let mut f = copy_plus_one(8, 8, |i| Expr::ramp(Expr::var(i), Expr::int(1), 4), |x| x);
        verify(&f, false).unwrap();
        let m = msg(super::super::bounds::prove(&mut f));
        assert!(m.contains("C") || m.contains("A"), "{m}");
        // A negative stride reaching below 0.
        let mut f = copy_plus_one(8, 2, |i| Expr::ramp(Expr::var(i), Expr::int(-1), 4), |x| x);
        msg(super::super::bounds::prove(&mut f));
        // The last lane exactly at the end is fine.
        let mut f = copy_plus_one(8, 5, |i| Expr::ramp(Expr::var(i), Expr::int(1), 4), |x| x);
        super::super::bounds::prove(&mut f).unwrap();
    }

    fn vectorized(
        extent: i64,
        index: impl Fn(&Var) -> Expr,
        value: impl Fn(Expr) -> Expr,
    ) -> String {
        let mut f = copy_plus_one(64, extent, index, value);
        let Stmt::For { kind, .. } = &mut f.body else {
            unreachable!()
        };
        *kind = ForKind::Vectorized;
        vectorize(&mut f, Some(16), false);
        verify(&f, true).unwrap();
        f.to_string()
    }

    #[test]
    fn strip_mining_and_what_stays_scalar() {
        // 10 f32 iterations: 2 vectors of 4, a tail of 2.
        let t = vectorized(10, Expr::var, |x| x);
        assert!(t.contains("for i.v in [0, 2)"), "{t}");
        assert!(
            t.contains("C[ramp((i.v * 4), 1, 4)] = A[ramp((i.v * 4), 1, 4)]"),
            "{t}"
        );
        assert!(t.contains("for i in [8, 8 + 2)"), "{t}");
        // A multiple of the width: no tail; fewer iterations than lanes: only the tail.
        assert!(!vectorized(8, Expr::var, |x| x).contains("for i in"));
        assert!(!vectorized(3, Expr::var, |x| x).contains("ramp"));
        // Every lane writing one element (a reduction-like store): scalar.
        let t = vectorized(10, |_| Expr::int(0), |x| x);
        assert!(t.contains("vectorized for") && !t.contains("ramp"), "{t}");
        // A stride-2 store: scalar; a reversed load is a gather (a ramp of stride -1).
        let t = vectorized(10, |i| Expr::var(i).mul(&Expr::int(2)), |x| x);
        assert!(!t.contains("ramp"), "{t}");
        // A select whose arm loads under an int condition: scalar (only the chosen arm may
        // run: the bounds proof may have relied on the condition, as for padding).
        let t = vectorized(10, Expr::var, |x| {
            let c = Expr::cmp(crate::ir::CmpOp::Gt, Expr::int(1), Expr::int(0));
            Expr::select(c.unwrap(), x, Expr::constant(0.0, DType::F32)).unwrap()
        });
        assert!(!t.contains("ramp"), "{t}");
        // Under a float condition the proof relied on nothing: vectorized.
        let t = vectorized(10, Expr::var, |x| {
            let one = Expr::constant(1.0, DType::F32);
            let c = Expr::cmp(crate::ir::CmpOp::Gt, one, Expr::constant(0.0, DType::F32));
            Expr::select(c.unwrap(), x, Expr::constant(0.0, DType::F32)).unwrap()
        });
        assert!(t.contains("ramp"), "{t}");
        // ... unless the statement makes that load eagerly anyway (here: in the condition):
        // evaluating it for every lane reads nothing the scalar loop would not.
        let t = vectorized(10, Expr::var, |x| {
            let c = Expr::cmp(
                crate::ir::CmpOp::Gt,
                x.clone(),
                Expr::constant(0.0, DType::F32),
            );
            Expr::select(c.unwrap(), x, Expr::constant(0.0, DType::F32)).unwrap()
        });
        assert!(t.contains("ramp"), "{t}");
    }
}
