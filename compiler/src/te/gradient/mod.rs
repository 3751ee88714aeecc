//! `te::gradient`: reverse-mode automatic differentiation of tensor-expression programs
//! (TVM's `te.gradient`, as vector-Jacobian products). docs/gradient.md is the user's guide.
//!
//! `gradient(output, inputs, head)` returns, for each input, a te tensor of its shape and
//! dtype holding `sum_k head[k] * d output[k] / d input[j]` (`head = None`: a head of ones,
//! i.e. the gradient of `sum(output)`). The gradients are ordinary compute stages over the
//! forward program's tensors (recomputing what they need), so `Schedule::new` and `build`
//! handle them like any other program: one build with `[inputs..., head, grads...]` is the
//! backward function.
//!
//! Invariants:
//! - The program walk is iterative (an explicit stack), in reverse topological order: a stage's
//!   adjoint is complete (the sum of every consumer's contribution) before it is propagated
//!   to the stages it reads. Only stages on a path from `output` to a requested input are
//!   differentiated; nothing is built for the rest.
//! - Per consumer stage and per read, the contribution is one new stage (when the inverted
//!   index map leaves variables to sum over) or one inline term; a tensor's adjoint is the
//!   balanced sum of its contributions, a stage of its shape and dtype.
//! - Only float tensors carry adjoints; asking for the gradient of or with respect to an int
//!   or bool tensor is an `ArgumentError`, never a silent zero. An input the output does not
//!   depend on gets a zeros stage.
//! - A construct with no derivative (an op without a rule, a derivative past the depth
//!   limit) is a `CompileError` naming the stage; never a wrong answer.

mod algebra;
mod body;
mod solve;
#[cfg(test)]
mod tests;

use crate::arith::simplify::simplify;
use crate::error::{Error, Result};
use crate::ir::expr::{CmpOp, Expr, IterVar, ReduceOp, Var};
use crate::te::ops::reduce;
use crate::te::tensor::{compute_from, inputs as reads_of, top_reduce, Op, Tensor};
use algebra::{and_all, cmp, constant, div, is_float, mul, select, substitute, sum_balanced};
use body::{read_adjoints, Term};
use rivet_runtime::DType;
use std::collections::{HashMap, HashSet};

fn arg_err(msg: String) -> Error {
    Error::Runtime(rivet_runtime::Error::Argument(msg))
}

/// The gradients of `output` with respect to each of `inputs` (see the module doc).
///
/// ```
/// use rivet_compiler::{build, te, Schedule};
/// use rivet_runtime::{DType, Tensor, Value};
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder([&n], DType::F32, "X")?;
/// let y = te::compute([&n], |[i]| x.at([&i]) * x.at([&i]) * 0.5, "Y")?;
/// let [dx]: [te::Tensor; 1] = te::gradient(&y, &[x.clone()], None)?.try_into().unwrap();
/// assert_eq!((dx.dtype(), dx.ndim()), (DType::F32, 1));
/// let f = build(&Schedule::new(&[&dx])?, &[&x, &dx], "cpu", "dx")?.get_function("dx")?;
/// let Value::Tensor(g) = f.call(&[Tensor::from_slice(&[3.0f32, -2.0], &[2])?.into()])? else { unreachable!() };
/// assert_eq!(g.to_vec::<f32>()?, [3.0, -2.0]); // d(x^2 / 2) = x
/// // Int tensors have no gradient: an error, not a silent zero.
/// let idx = te::placeholder([&n], DType::I64, "I")?;
/// let e = te::gradient(&y, &[idx], None).unwrap_err();
/// assert!(e.to_string().contains("only float tensors have gradients"), "{e}");
/// # Ok(())
/// # }
/// ```
pub fn gradient(output: &Tensor, inputs: &[Tensor], head: Option<&Tensor>) -> Result<Vec<Tensor>> {
    check_args(output, inputs, head)?;
    let order = topo_order(output);
    let requested: HashSet<u32> = inputs.iter().map(Tensor::id).collect();
    // Relevant: a float tensor from which a requested input can be reached.
    let mut relevant: HashSet<u32> = HashSet::new();
    // A `stop_gradient` stage is a constant to the differentiator: nothing flows through it.
    for t in &order {
        if t.dtype().is_float()
            && (requested.contains(&t.id())
                || (!t.stops_gradient() && reads_of(t).iter().any(|x| relevant.contains(&x.id()))))
        {
            relevant.insert(t.id());
        }
    }
    let mut acc: HashMap<u32, Vec<Contribution>> = HashMap::new();
    let mut grads: HashMap<u32, Tensor> = HashMap::new();
    for t in order.iter().rev() {
        if !relevant.contains(&t.id()) {
            continue;
        }
        let adj = if t == output {
            Some(match head {
                Some(h) => Adjoint::Tensor(h.clone()),
                None => Adjoint::Ones,
            })
        } else {
            materialize(t, acc.remove(&t.id()).unwrap_or_default())?.map(Adjoint::Tensor)
        };
        if requested.contains(&t.id()) {
            let g = match &adj {
                // A stage made for this adjoint is the gradient itself; the head or ones are
                // copied into a stage of their own (a build's outputs must be computes).
                Some(Adjoint::Tensor(a)) if a != output && head != Some(a) => a.clone(),
                Some(a) => fill(t, &format!("{}_grad", t.name()), |j| a.read(t.dtype(), j))?,
                None => fill(t, &format!("{}_grad", t.name()), |_| {
                    constant(0.0, t.dtype())
                })?,
            };
            grads.insert(t.id(), g);
        }
        // A host callback's values are opaque: an adjoint reaching one (on a path to a
        // requested input) cannot go further, and dropping it would be a silent zero.
        if let (Some(_), Op::Extern { inputs, .. }) = (&adj, t.op()) {
            if inputs.iter().any(|x| relevant.contains(&x.id())) {
                return Err(Error::Runtime(rivet_runtime::Error::NotDifferentiable(format!(
                    "te.gradient: stage '{}' is computed by a host callback (te.extern), which rivet cannot differentiate; the requested inputs are reached only through it",
                    t.name()
                ))));
            }
        }
        if let (Some(adj), Op::Compute { .. }, false) = (&adj, t.op(), t.stops_gradient()) {
            propagate(t, adj, &relevant, &mut acc).map_err(|e| match e {
                Error::Compile(m) if !m.starts_with("te.gradient") => Error::Compile(format!(
                    "te.gradient: differentiating stage '{}': {m}",
                    t.name()
                )),
                e => e,
            })?;
        }
    }
    // An input listed twice gets a copy the second time: a build's arguments must be
    // distinct tensors.
    let mut given: HashSet<u32> = HashSet::new();
    inputs
        .iter()
        .map(|x| {
            let name = format!("{}_grad", x.name());
            let g = match grads.get(&x.id()) {
                Some(g) => g.clone(),
                None => fill(x, &name, |_| constant(0.0, x.dtype()))?,
            };
            if given.insert(g.id()) {
                Ok(g)
            } else {
                fill(x, &name, |j| g.idx(j))
            }
        })
        .collect()
}

fn check_args(output: &Tensor, inputs: &[Tensor], head: Option<&Tensor>) -> Result<()> {
    if !output.dtype().is_float() {
        return Err(arg_err(format!(
            "te.gradient: output '{}' is {}; only float tensors have gradients",
            output.name(),
            output.dtype()
        )));
    }
    for (k, x) in inputs.iter().enumerate() {
        if !x.dtype().is_float() {
            return Err(arg_err(format!(
                "te.gradient: inputs[{k}] '{}' is {}; only float tensors have gradients (int and bool values, such as indices, are not differentiable)",
                x.name(),
                x.dtype()
            )));
        }
    }
    if let Some(h) = head {
        let same_shape = h.ndim() == output.ndim()
            && h.shape()
                .iter()
                .zip(output.shape())
                .all(|(a, b)| solve::same_dim(a, b));
        if !same_shape || h.dtype() != output.dtype() {
            return Err(arg_err(format!(
                "te.gradient: head must have the output's shape and dtype ({:?} {}), got '{}' of shape {:?} {}",
                output.shape(),
                output.dtype(),
                h.name(),
                h.shape(),
                h.dtype()
            )));
        }
    }
    Ok(())
}

/// The tensors `output` depends on (itself included), producers before consumers, by an
/// iterative depth-first walk (a chain of thousands of stages needs no deep stack).
fn topo_order(output: &Tensor) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut seen: HashSet<u32> = HashSet::new();
    let mut stack: Vec<(Tensor, bool)> = vec![(output.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !seen.insert(t.id()) {
            continue;
        }
        stack.push((t.clone(), true));
        for x in reads_of(&t).into_iter().rev() {
            if !seen.contains(&x.id()) {
                stack.push((x, false));
            }
        }
    }
    order
}

/// The adjoint of a stage, as the stages reading it see it.
enum Adjoint {
    /// `head = None` at the output: every element 1.
    Ones,
    Tensor(Tensor),
}

impl Adjoint {
    fn read(&self, dtype: DType, idx: &[Expr]) -> Expr {
        match self {
            Adjoint::Ones => constant(1.0, dtype),
            Adjoint::Tensor(t) => t.idx(idx),
        }
    }
}

/// One consumer's share of a tensor's adjoint.
enum Contribution {
    /// A stage of the tensor's shape.
    Stage(Tensor),
    /// An expression over the tensor's indices, written with the variables given (one per
    /// dim; `materialize` renames them to the adjoint stage's axes).
    Inline(Vec<Var>, Expr),
}

/// A stage of `like`'s shape and dtype with body `f(indices)`.
fn fill(like: &Tensor, name: &str, f: impl FnOnce(&[Expr]) -> Expr) -> Result<Tensor> {
    let axes = fresh_axes(like);
    let idx: Vec<Expr> = axes.iter().map(|a| Expr::var(&a.var)).collect();
    let body = f(&idx);
    compute_from(like.shape(), axes, body, name)
}

/// Copies of reduction axes with variables of their own (a reduction axis belongs to one
/// stage), each old variable mapped to its copy in `map`.
fn fresh_raxes(raxes: &[IterVar], map: &mut HashMap<Var, Expr>) -> Vec<IterVar> {
    raxes
        .iter()
        .map(|r| {
            let v = Var::new(&r.var.name);
            map.insert(r.var.clone(), Expr::var(&v));
            IterVar {
                var: v,
                min: r.min.clone(),
                extent: r.extent.clone(),
                reduce: true,
            }
        })
        .collect()
}

fn fresh_axes(like: &Tensor) -> Vec<IterVar> {
    like.shape()
        .iter()
        .enumerate()
        .map(|(d, ext)| IterVar {
            var: Var::new(&format!("j{d}")),
            min: Expr::int(0),
            extent: ext.clone(),
            reduce: false,
        })
        .collect()
}

/// The adjoint of `x` from its consumers' contributions (`None`: zero).
fn materialize(x: &Tensor, parts: Vec<Contribution>) -> Result<Option<Tensor>> {
    if parts.is_empty() {
        return Ok(None);
    }
    if parts.len() == 1 {
        if let Contribution::Stage(t) = &parts[0] {
            return Ok(Some(t.clone()));
        }
    }
    let axes = fresh_axes(x);
    let idx: Vec<Expr> = axes.iter().map(|a| Expr::var(&a.var)).collect();
    let terms = parts
        .into_iter()
        .map(|p| match p {
            Contribution::Stage(t) => t.idx(&idx),
            Contribution::Inline(vars, e) => {
                let map: HashMap<Var, Expr> = vars.into_iter().zip(idx.iter().cloned()).collect();
                substitute(&e, &|v| map.get(v).cloned())
            }
        })
        .collect();
    let body = sum_balanced(terms)?;
    Ok(Some(compute_from(
        x.shape(),
        axes,
        body,
        &format!("{}_grad", x.name()),
    )?))
}

/// Sends the adjoint `adj` of compute `c` to the relevant tensors `c` reads.
fn propagate(
    c: &Tensor,
    adj: &Adjoint,
    relevant: &HashSet<u32>,
    acc: &mut HashMap<u32, Vec<Contribution>>,
) -> Result<()> {
    let Op::Compute { axis, body } = c.op() else {
        return Ok(());
    };
    let i: Vec<Expr> = axis.iter().map(|a| Expr::var(&a.var)).collect();
    let dt = c.dtype();
    let (inner, raxes, root) = match top_reduce(body) {
        None => (
            body.clone(),
            Vec::new(),
            Term {
                guard: None,
                expr: adj.read(dt, &i),
            },
        ),
        Some((ReduceOp::Sum, inner, raxes)) => (
            inner.clone(),
            raxes.to_vec(),
            Term {
                guard: None,
                expr: adj.read(dt, &i),
            },
        ),
        Some((ReduceOp::Max | ReduceOp::Min, inner, raxes)) => {
            // The elements equal to the extremum share the adjoint evenly (torch.amax's rule).
            let ties = tie_count(c, axis, inner, raxes)?;
            let hit = cmp(CmpOp::Eq, inner, &c.idx(&i))?;
            (
                inner.clone(),
                raxes.to_vec(),
                Term {
                    guard: Some(hit),
                    expr: div(&adj.read(dt, &i), &ties.idx(&i))?,
                },
            )
        }
        Some((ReduceOp::Prod, inner, raxes)) => {
            // d prod / d f(i, r) = the product of the other elements, computed as such (not
            // as prod / f, which divides by zero where an element is 0).
            let others = product_of_others(c, axis, inner, raxes)?;
            let mut at: Vec<Expr> = i.clone();
            at.extend(
                raxes
                    .iter()
                    .map(|r| simplify(&Expr::var(&r.var).sub(&r.min))),
            );
            (
                inner.clone(),
                raxes.to_vec(),
                Term {
                    guard: None,
                    expr: mul(&adj.read(dt, &i), &others.idx(&at))?,
                },
            )
        }
    };
    let wanted = |t: &Tensor| relevant.contains(&t.id());
    let raxes_empty = raxes.is_empty();
    let domain: Vec<IterVar> = axis.iter().cloned().chain(raxes).collect();
    // An elementwise stage's element is its body's value (a reduction's is not).
    let root_value = raxes_empty.then(|| c.idx(&i));
    for r in read_adjoints(&inner, root, root_value, &wanted, c.name())? {
        let x = r.tensor.clone();
        let a = r.value()?;
        let target = fresh_axes(&x);
        let jv: Vec<Var> = target.iter().map(|t| t.var.clone()).collect();
        let s = solve::solve(x.shape(), &r.indices, &a, &domain, &jv)?;
        let name = format!("{}_grad_{}", x.name(), c.name());
        let nonempty = nonempty(&s.raxes)?;
        let part = if s.raxes.is_empty() {
            Contribution::Inline(jv, s.body)
        } else if let Some((guard, (variant, outside))) = match nonempty {
            Some(guard) => factor_out(&s.body, &s.raxes)?.map(|f| (guard, f)),
            None => None,
        } {
            // `sum_r (f(r) * c)` as `(sum_r f(r)) * c`: the factors that do not depend on the
            // summed variables are applied once per element, not once per term. When `f(r)`
            // reads a stage whose element is a sum of terms, one partial sum per term
            // (`distribute`). Each partial sum over axes of its own; the factors stay over
            // `target`'s.
            let pieces = match distribute(&variant, &s.raxes)? {
                Some(p) => p,
                None => vec![(variant, None)],
            };
            let many = pieces.len() > 1;
            let idx: Vec<Expr> = jv.iter().map(Expr::var).collect();
            let mut sums = Vec::with_capacity(pieces.len());
            for (k, (piece, factors)) in pieces.into_iter().enumerate() {
                let own = fresh_axes(&x);
                let mut map: HashMap<Var, Expr> = jv
                    .iter()
                    .cloned()
                    .zip(own.iter().map(|a| Expr::var(&a.var)))
                    .collect();
                // Reduction axes of its own too: each partial is a stage of its own.
                let raxes = fresh_raxes(&s.raxes, &mut map);
                let piece = substitute(&piece, &|v| map.get(v).cloned());
                let body = reduce(ReduceOp::Sum, piece, &raxes)?;
                let label = if many {
                    format!("{name}_sum{k}")
                } else {
                    format!("{name}_sum")
                };
                let partial = compute_from(x.shape(), own, body, &label)?;
                let read = partial.idx(&idx);
                sums.push(match factors {
                    Some(f) => f(read)?,
                    None => read,
                });
            }
            let mut body = outside(sum_balanced(sums)?)?;
            if let Some(g) = guard {
                // An empty sum is 0 whatever the factors are; `0 * inf` would be NaN.
                body = select(&g, &body, &constant(0.0, x.dtype()))?;
            }
            Contribution::Stage(compute_from(x.shape(), target, body, &name)?)
        } else {
            let body = reduce(ReduceOp::Sum, s.body, &s.raxes)?;
            Contribution::Stage(compute_from(x.shape(), target, body, &name)?)
        };
        acc.entry(x.id()).or_default().push(part);
    }
    Ok(())
}

/// Whether a sum over `raxes` has terms: `Some(None)` when every extent is a constant >= 1,
/// `Some(Some(cond))` when some are symbolic (`cond`: each of those >= 1, evaluated per call),
/// `None` when one is a constant < 1 (the sum is always empty).
///
/// Why: taking factors out of a sum (`factor_out`) is exact only for a sum with terms. An
/// empty `sum_r (f(r) * c)` is 0; `(sum_r f(r)) * c` is `0 * c`, NaN where `c` is not finite
/// (`1 / m` with `m = 0`). Symbolic extents get the factored sum under a `select` on `cond`,
/// which is free of every loop variable: the lowering takes it out of the loops (`unswitch`),
/// so the loops stay as fast as with constant extents.
fn nonempty(raxes: &[IterVar]) -> Result<Option<Option<Expr>>> {
    let mut conds = Vec::new();
    for r in raxes {
        let extent = simplify(&r.extent);
        match extent.as_int() {
            Some(n) if n >= 1 => {}
            Some(_) => return Ok(None),
            None => conds.push(cmp(CmpOp::Ge, &extent, &Expr::int(1))?),
        }
    }
    Ok(Some(and_all(conds)?))
}

/// A summand `e` of a contribution summed over `raxes`, split into the part that depends on
/// them and the factors that do not: `e = sign * (variant * n_1 * ... ) / d_1 / ...` through
/// products, quotients by a factor free of `raxes` and negations (never through a `select`:
/// a guard stays around what it guards). Returns the variant part and a function applying the
/// rest to its sum, or `None` when nothing can be taken out (no free factor or no variant
/// factor). Only for sums with terms (the caller checks `nonempty`). The sum is then
/// reassociated: it differs from the unfactored one by rounding, as any reordered float sum
/// does.
fn factor_out(e: &Expr, raxes: &[IterVar]) -> Result<Option<(Expr, Factors)>> {
    use crate::ir::expr::{BinOp, ExprKind, UnOp};
    let free = |x: &Expr| !raxes.iter().any(|r| x.uses(&r.var));
    // (variant factors, free numerator factors, free denominators, negated)
    fn walk(
        e: &Expr,
        free: &dyn Fn(&Expr) -> bool,
        out: &mut (Vec<Expr>, Vec<Expr>, Vec<Expr>, bool),
    ) {
        match e.kind() {
            ExprKind::Unary(UnOp::Neg, a) => {
                out.3 = !out.3;
                walk(a, free, out)
            }
            ExprKind::Binary(BinOp::Mul, a, b) => {
                walk(a, free, out);
                walk(b, free, out)
            }
            ExprKind::Binary(BinOp::Div, a, b) if free(b) => {
                walk(a, free, out);
                out.2.push(b.clone())
            }
            _ if free(e) => out.1.push(e.clone()),
            _ => out.0.push(e.clone()),
        }
    }
    let mut parts = (Vec::new(), Vec::new(), Vec::new(), false);
    walk(e, &free, &mut parts);
    let (variant, num, den, negated) = parts;
    if variant.is_empty() || (num.is_empty() && den.is_empty()) {
        return Ok(None);
    }
    let mut v = variant[0].clone();
    for f in &variant[1..] {
        v = mul(&v, f)?;
    }
    let outside = move |s: Expr| -> Result<Expr> {
        let mut r = if negated { algebra::neg(&s)? } else { s };
        for f in &num {
            r = mul(&r, f)?;
        }
        for d in &den {
            r = div(&r, d)?;
        }
        Ok(r)
    };
    Ok(Some((v, Box::new(outside))))
}

/// The factors a summand's sum is multiplied by (`factor_out`'s second result).
type Factors = Box<dyn Fn(Expr) -> Result<Expr>>;

/// A summand of a split sum and what is applied to its sum (`distribute`).
type Piece = (Expr, Option<Factors>);

/// Most terms a stage's element may have for `distribute` to split a sum over it.
const MAX_TERMS: usize = 4;

/// `sum_r P[.., r, ..]` where `P`'s element is a sum of terms `t_1 + t_2 - t_3 ..` (an
/// elementwise stage; a tensor's adjoint is the sum of its consumers' contributions) as
/// `sum_r t_1 + sum_r t_2 - sum_r t_3 ..`, each term's factors free of `r` taken out of its sum
/// (`factor_out`). Returns each term's summand with the function applying its factors and
/// sign, or `None` when `variant` is not such a read or a term is not cheap to recompute.
///
/// Why: layer_norm's backward summed the adjoint of its centred input over each row, which
/// needed that adjoint written out in full first (a row buffer, then a pass to sum it, then
/// one to read it back). Split, the sums read only the inputs (`sum_j h_j g_j` and `sum_j
/// (x_j - mean)`), run in the same pass as the row's other sums, and the adjoint is used once,
/// where the default schedule inlines it. Exact in real arithmetic; in floats the sum is
/// reassociated, as `factor_out` already does. Only terms whose part under the sum is reads,
/// additions, subtractions, multiplications and negations are split (recomputing them per
/// term costs loads, never a transcendental), and at most `MAX_TERMS` of them.
fn distribute(variant: &Expr, raxes: &[IterVar]) -> Result<Option<Vec<Piece>>> {
    use crate::ir::expr::{BinOp, ExprKind, UnOp};
    let ExprKind::Read { tensor, indices } = variant.kind() else {
        return Ok(None);
    };
    let p = crate::te::tensor::Tensor::of(tensor);
    let Op::Compute { axis, body } = p.op() else {
        return Ok(None);
    };
    if top_reduce(body).is_some() || axis.len() != indices.len() {
        return Ok(None);
    }
    let map: HashMap<Var, Expr> = axis
        .iter()
        .map(|a| a.var.clone())
        .zip(indices.iter().cloned())
        .collect();
    let element = substitute(body, &|v| map.get(v).cloned());
    // The terms of the top-level sum, each with its sign.
    fn terms(e: &Expr, negated: bool, out: &mut Vec<(Expr, bool)>) {
        match e.kind() {
            ExprKind::Binary(BinOp::Add, a, b) => {
                terms(a, negated, out);
                terms(b, negated, out)
            }
            ExprKind::Binary(BinOp::Sub, a, b) => {
                terms(a, negated, out);
                terms(b, !negated, out)
            }
            _ => out.push((e.clone(), negated)),
        }
    }
    let mut split = Vec::new();
    terms(&element, false, &mut split);
    if split.len() < 2 || split.len() > MAX_TERMS || !is_float(&element) {
        return Ok(None);
    }
    let free = |x: &Expr| !raxes.iter().any(|r| x.uses(&r.var));
    // Under the sum, only what is cheap to compute again (loads and ring arithmetic); parts
    // free of the summed variables are left alone, whatever they are (`factor_out` takes the
    // factors among them out of the sum). A read of a stage that may be inlined (elementwise)
    // counts as its element, at most `depth` stages deep; other reads are loads of something
    // always materialised (an input, a reduction, a callback's result).
    fn cheap(e: &Expr, free: &dyn Fn(&Expr) -> bool, depth: u32) -> bool {
        if free(e) {
            return true;
        }
        match e.kind() {
            ExprKind::Read { tensor, indices } => {
                match crate::te::tensor::Tensor::of(tensor).op() {
                    Op::Compute { axis, body } if top_reduce(body).is_none() => {
                        if depth == 0 || axis.len() != indices.len() {
                            return false;
                        }
                        let map: HashMap<Var, Expr> = axis
                            .iter()
                            .map(|a| a.var.clone())
                            .zip(indices.iter().cloned())
                            .collect();
                        cheap(&substitute(body, &|v| map.get(v).cloned()), free, depth - 1)
                    }
                    _ => true,
                }
            }
            ExprKind::Var(_) | ExprKind::Const(_) => true,
            ExprKind::Binary(BinOp::Add | BinOp::Sub | BinOp::Mul, a, b) => {
                cheap(a, free, depth) && cheap(b, free, depth)
            }
            ExprKind::Unary(UnOp::Neg, a) => cheap(a, free, depth),
            _ => false,
        }
    }
    let mut out: Vec<Piece> = Vec::with_capacity(split.len());
    for (t, negated) in split {
        let (summand, factors) = match factor_out(&t, raxes)? {
            Some((v, f)) => (v, Some(f)),
            None => (t, None),
        };
        if !cheap(&summand, &free, 4) {
            return Ok(None);
        }
        let signed: Option<Factors> = match (factors, negated) {
            (f, false) => f,
            (None, true) => Some(Box::new(|s: Expr| algebra::neg(&s))),
            (Some(f), true) => Some(Box::new(move |s: Expr| algebra::neg(&f(s)?))),
        };
        out.push((summand, signed));
    }
    Ok(Some(out))
}

/// For a max/min reduction `c`, the stage counting, per output element, the elements equal
/// to the extremum (>= 1 wherever the extremum is a number).
fn tie_count(c: &Tensor, axis: &[IterVar], inner: &Expr, raxes: &[IterVar]) -> Result<Tensor> {
    let out_axes = fresh_axes(c);
    let mut map: HashMap<Var, Expr> = HashMap::new();
    for (a, b) in axis.iter().zip(&out_axes) {
        map.insert(a.var.clone(), Expr::var(&b.var));
    }
    let new_raxes = fresh_raxes(raxes, &mut map);
    let f = substitute(inner, &|v| map.get(v).cloned());
    let idx: Vec<Expr> = out_axes.iter().map(|a| Expr::var(&a.var)).collect();
    let dt = c.dtype();
    let one = select(
        &cmp(CmpOp::Eq, &f, &c.idx(&idx))?,
        &constant(1.0, dt),
        &constant(0.0, dt),
    )?;
    let body = reduce(ReduceOp::Sum, one, &new_raxes)?;
    compute_from(c.shape(), out_axes, body, &format!("{}_ties", c.name()))
}

/// For a product reduction `c[i] = prod_r f(i, r)`, the stage `others[i, q] = prod over
/// r != q of f(i, r)` (`q` counted from each reduction axis's start): the exact derivative of
/// the product with respect to one element, zeros included. It costs the reduction's extent
/// squared per output element.
fn product_of_others(
    c: &Tensor,
    axis: &[IterVar],
    inner: &Expr,
    raxes: &[IterVar],
) -> Result<Tensor> {
    let mut map: HashMap<Var, Expr> = HashMap::new();
    let mut out_axes = fresh_axes(c);
    for (a, b) in axis.iter().zip(&out_axes) {
        map.insert(a.var.clone(), Expr::var(&b.var));
    }
    let mut shape: Vec<Expr> = c.shape().to_vec();
    let mut same = Vec::new();
    let mut new_raxes = Vec::new();
    for r in raxes {
        let q = Var::new(&format!("{}_q", r.var.name));
        let v = Var::new(&r.var.name);
        map.insert(r.var.clone(), Expr::var(&v));
        // r' == q + min: the excluded element.
        same.push(cmp(
            CmpOp::Eq,
            &Expr::var(&v),
            &simplify(&Expr::var(&q).add(&r.min)),
        )?);
        shape.push(r.extent.clone());
        out_axes.push(IterVar {
            var: q,
            min: Expr::int(0),
            extent: r.extent.clone(),
            reduce: false,
        });
        new_raxes.push(IterVar {
            var: v,
            min: r.min.clone(),
            extent: r.extent.clone(),
            reduce: true,
        });
    }
    let f = substitute(inner, &|v| map.get(v).cloned());
    let excluded = and_all(same)?
        .ok_or_else(|| Error::Internal("te.gradient: a product reduction without axes".into()))?;
    let body = select(&excluded, &constant(1.0, c.dtype()), &f)?;
    let body = reduce(ReduceOp::Prod, body, &new_raxes)?;
    compute_from(&shape, out_axes, body, &format!("{}_others", c.name()))
}
