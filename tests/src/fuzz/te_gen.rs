//! Generator 1: te programs with adversarial index arithmetic, random schedules, built for
//! "interp" (the oracle) and "cpu", run on guarded random inputs.
//!
//! Programs: an output of rank 1-3 (static or symbolic dims, small), 1-2 inputs read with
//! index forms `x*K + c`, `x // K`, `x % K`, `(x*K + c) % E`, clamps, reversals and guarded
//! (`select`) reads, where K and c are adversarial constants (2^31, 2^62, i64::MIN, ...) or the
//! input's own dim; inputs may carry an extra dim bound to a hostile value at call time
//! (0, 2^31, 2^62, i64::MAX: passed as a zero-stride view, so it costs no memory); optional
//! reduction and an optional producer stage (at root, inlined or `compute_at`), whose domain
//! may include the hostile dim (a huge temporary, which must be refused, not allocated).
//! Schedules: split (factors and nparts up to i64::MAX, zero, negative), fuse, reorder,
//! tile, parallel, vectorize, unroll, on every stage.
//!
//! Outcome: both targets build and compute the same bits, or both refuse with the same
//! typed error kind; inputs (and the guard elements around every buffer) stay untouched.

use super::guarded::{Guarded, LayoutS};
use super::rng::Rng;
use super::{ckind, kind, short, Outcome};
use rivet_compiler::ir::{Expr, IterVar, Var};
use rivet_compiler::te::{self, Tensor as Te};
use rivet_compiler::{build, Schedule};
use rivet_runtime::{DType, Value};
use std::fmt::Write;

const HOSTILE_DIMS: [i64; 10] = [
    0,
    1,
    2,
    (1 << 31) - 1,
    1 << 31,
    (1 << 32) + 1,
    3_037_000_500,
    1 << 62,
    i64::MAX,
    (1 << 62) + 3,
];

const SPLIT_FACTORS: [i64; 12] = [
    1,
    2,
    3,
    4,
    7,
    8,
    0,
    -1,
    1 << 31,
    1 << 62,
    i64::MAX,
    i64::MIN,
];

/// A dim of the program: its expression and the value it has in this case's call.
#[derive(Clone)]
struct Dim {
    expr: Expr,
    value: i64,
    /// Bound to a hostile value: only ever passed as a zero-stride (broadcast) dim.
    hostile: bool,
}

fn small_dim(d: usize, r: &mut Rng, log: &mut String) -> Dim {
    let value = if r.chance(0.05) { 0 } else { r.range(1, 6) };
    if r.chance(0.4) {
        let _ = write!(log, "n{d}={value}(sym) ");
        Dim {
            expr: te::var(&format!("n{d}")),
            value,
            hostile: false,
        }
    } else {
        let _ = write!(log, "n{d}={value} ");
        Dim {
            expr: Expr::int(value),
            value,
            hostile: false,
        }
    }
}

fn hostile_dim(r: &mut Rng, log: &mut String) -> Dim {
    let value = r.pick(&HOSTILE_DIMS);
    if r.chance(0.5) {
        let _ = write!(log, "h={value}(sym) ");
        Dim {
            expr: te::var("h"),
            value,
            hostile: true,
        }
    } else {
        let _ = write!(log, "h={value} ");
        Dim {
            expr: Expr::int(value),
            value,
            hostile: true,
        }
    }
}

/// An adversarial constant, or (sometimes) the extent `ext` itself.
fn k_of(r: &mut Rng, ext: &Expr) -> Expr {
    if r.chance(0.15) {
        ext.clone()
    } else {
        Expr::int(r.adversarial())
    }
}

/// An index into a dim of extent `ext`, from loop variable `x`.
fn index_form(x: &Expr, ext: &Expr, r: &mut Rng) -> Expr {
    let (k, c) = (k_of(r, ext), Expr::int(r.adversarial()));
    match r.below(10) {
        0 => x.clone(),
        1 => x.mul(&k).add(&c),
        2 => x.floordiv(&k),
        3 => x.floormod(&k),
        4 => x.mul(&k).add(&c).floormod(ext),
        5 => x
            .mul(&k)
            .add(&c)
            .max_(&Expr::int(0))
            .min_(&ext.sub(&Expr::int(1))),
        6 => ext.sub(&Expr::int(1)).sub(x),
        7 => x.mul(&k).floordiv(&Expr::int(r.adversarial())),
        8 => x.add(&c).floormod(ext),
        _ => Expr::int(r.adversarial()),
    }
}

/// A constant of the data type.
fn data_const(dt: DType, r: &mut Rng) -> Expr {
    if dt.is_float() {
        Expr::constant(r.pick(&[0.5, -1.0, 2.0, 1e30, f64::NAN, -0.0, 3.0e38]), dt)
    } else {
        Expr::const_int(r.adversarial(), dt)
    }
}

/// Combines two values of the data type (type-checked constructors: the unchecked
/// `Expr::add` family is int64 index arithmetic for lowering).
fn combine(a: Expr, b: Expr, r: &mut Rng) -> Expr {
    use rivet_compiler::ir::BinOp;
    let op = match r.below(6) {
        0 => BinOp::Sub,
        1 => BinOp::Mul,
        2 => BinOp::Max,
        3 => BinOp::FloorDiv,
        4 => BinOp::FloorMod,
        _ => BinOp::Add,
    };
    Expr::binary(op, a.clone(), b).unwrap_or(a)
}

struct Input {
    te: Te,
    dims: Vec<Dim>,
}

struct Program {
    dtype: DType,
    out: Te,
    out_dims: Vec<Dim>,
    inputs: Vec<Input>,
    producer: Option<Te>,
}

/// Reads input `inp` at loop variables `vars` (domain index `i`, reduction index, ...).
fn read(inp: &Input, vars: &[Expr], r: &mut Rng, guard_ok: bool) -> Expr {
    let mut idx = Vec::new();
    let mut guards: Vec<Expr> = Vec::new();
    for (d, dim) in inp.dims.iter().enumerate() {
        let x = if d < vars.len() && r.chance(0.7) {
            vars[d].clone()
        } else {
            vars[r.below(vars.len() as u64) as usize].clone()
        };
        let e = if d < vars.len() && r.chance(0.45) {
            x
        } else {
            index_form(&x, &dim.expr, r)
        };
        if guard_ok && r.chance(0.3) {
            guards.push(te::all(te::ge(&e, 0), e.lt(&dim.expr)));
        }
        idx.push(e);
    }
    let v = inp.te.at(&idx);
    match guards.into_iter().reduce(te::all) {
        None => v,
        Some(g) => {
            let z = Expr::constant(0.0, inp.te.dtype());
            te::try_if_then_else(g, v, z).unwrap_or_else(|_| inp.te.at(&idx))
        }
    }
}

/// A body over `vars`: every input read at least once, maybe an index value, constants.
fn body(inputs: &[Input], vars: &[Expr], dt: DType, r: &mut Rng) -> Expr {
    let mut e = read(&inputs[0], vars, r, true);
    for inp in &inputs[1..] {
        let b = read(inp, vars, r, true);
        e = combine(e, b, r);
    }
    if r.chance(0.3) {
        let x = &vars[r.below(vars.len() as u64) as usize];
        let k = Expr::int(r.adversarial());
        let c = Expr::int(r.adversarial());
        e = combine(e, te::cast(dt, x.mul(&k).add(&c)), r);
    }
    if r.chance(0.3) {
        e = combine(e, data_const(dt, r), r);
    }
    e
}

fn gen_program(r: &mut Rng, log: &mut String) -> Program {
    let dtype = r.pick(&[DType::F32, DType::F64, DType::I32, DType::I64]);
    let rank = r.range(1, 3) as usize;
    let out_dims: Vec<Dim> = (0..rank).map(|d| small_dim(d, r, log)).collect();
    // One hostile dim per case at most, shared by whatever uses it.
    let hostile = if r.chance(0.5) {
        Some(hostile_dim(r, log))
    } else {
        None
    };
    let n_in = r.range(1, 2) as usize;
    let inputs: Vec<Input> = (0..n_in)
        .map(|k| {
            let mut dims: Vec<Dim> = out_dims
                .iter()
                .map(|d| {
                    if r.chance(0.15) {
                        Dim {
                            expr: Expr::int(1),
                            value: 1,
                            hostile: false,
                        }
                    } else {
                        d.clone()
                    }
                })
                .collect();
            if let Some(h) = &hostile {
                if r.chance(0.7) {
                    dims.insert(r.below(dims.len() as u64 + 1) as usize, h.clone());
                }
            }
            let shape: Vec<Expr> = dims.iter().map(|d| d.expr.clone()).collect();
            Input {
                te: te::placeholder(&shape, dtype, &format!("A{k}")).expect("a valid placeholder"),
                dims,
            }
        })
        .collect();
    let out_shape: Vec<Expr> = out_dims.iter().map(|d| d.expr.clone()).collect();
    let reduce = r.chance(0.3);
    let two_stage = r.chance(0.3);
    let mut producer = None;
    let out = if two_stage {
        // P over the output's domain, or over it and the hostile dim (a huge temporary).
        let mut pdims: Vec<Dim> = out_dims.clone();
        if let Some(h) = &hostile {
            if r.chance(0.5) {
                pdims.push(h.clone());
            }
        }
        let pshape: Vec<Expr> = pdims.iter().map(|d| d.expr.clone()).collect();
        let mut pr = r.clone();
        let p = te::compute_dyn(&pshape, |i| body(&inputs, i, dtype, &mut pr), "P");
        r.next();
        let p = match p {
            Ok(p) => p,
            Err(_) => return gen_fallback(dtype, out_dims, inputs),
        };
        let pin = Input {
            te: p.clone(),
            dims: pdims,
        };
        let mut cr = r.clone();
        let c = te::compute_dyn(
            &out_shape,
            |i| {
                let a = read(&pin, i, &mut cr, true);
                let b = read(&inputs[0], i, &mut cr, false);
                combine(a, b, &mut cr)
            },
            "C",
        );
        r.next();
        producer = Some(p);
        match c {
            Ok(c) => c,
            Err(_) => return gen_fallback(dtype, out_dims, inputs),
        }
    } else if reduce {
        let ext = if r.chance(0.5) {
            Expr::int(r.range(0, 4))
        } else {
            out_dims[0].expr.clone()
        };
        let k: IterVar = te::reduce_axis(0, ext, "k").expect("int64 bounds");
        let mut cr = r.clone();
        let op = r.below(3);
        let c = te::compute_dyn(
            &out_shape,
            |i| {
                let mut vars = i.to_vec();
                vars.push(Expr::from(&k));
                let rot = cr.below(vars.len() as u64) as usize;
                vars.rotate_right(rot);
                let b = body(&inputs, &vars, dtype, &mut cr);
                match op {
                    0 => te::sum(b, &k),
                    1 => te::max_over(b, &k),
                    _ => te::min_over(b, &k),
                }
            },
            "C",
        );
        r.next();
        match c {
            Ok(c) => c,
            Err(_) => return gen_fallback(dtype, out_dims, inputs),
        }
    } else {
        let mut cr = r.clone();
        let c = te::compute_dyn(&out_shape, |i| body(&inputs, i, dtype, &mut cr), "C");
        r.next();
        match c {
            Ok(c) => c,
            Err(_) => return gen_fallback(dtype, out_dims, inputs),
        }
    };
    let _ = write!(
        log,
        "dtype={dtype} inputs={} reduce={reduce} two_stage={two_stage}",
        inputs.len()
    );
    Program {
        dtype,
        out,
        out_dims,
        inputs,
        producer,
    }
}

/// A plain copy program, when the drawn one is refused by `compute` itself.
fn gen_fallback(dtype: DType, out_dims: Vec<Dim>, inputs: Vec<Input>) -> Program {
    let shape: Vec<Expr> = out_dims.iter().map(|d| d.expr.clone()).collect();
    let a = inputs[0].te.clone();
    let rank = a.ndim();
    let out = te::compute_dyn(
        &shape,
        |i| {
            let idx: Vec<Expr> = (0..rank)
                .map(|d| i.get(d).cloned().unwrap_or(Expr::int(0)))
                .collect();
            a.at(idx)
        },
        "C",
    )
    .expect("a copy");
    Program {
        dtype,
        out,
        out_dims,
        inputs: inputs.into_iter().take(1).collect(),
        producer: None,
    }
}

fn leaves(s: &Schedule, t: &Te) -> Vec<Var> {
    s.stages[s.stage_index(t).expect("a stage")]
        .leaves
        .iter()
        .map(|l| l.var.clone())
        .collect()
}

/// Random schedule primitives on stage `t`; refusals are fine, internal errors are not.
fn schedule_stage(s: &mut Schedule, t: &Te, r: &mut Rng, log: &mut String) -> Result<(), String> {
    let n_ops = r.below(5);
    for _ in 0..n_ops {
        let lv = leaves(s, t);
        if lv.is_empty() {
            return Ok(());
        }
        let pick = |r: &mut Rng| lv[r.below(lv.len() as u64) as usize].clone();
        let st = s.stage(t).expect("a stage");
        let res = match r.below(8) {
            0 | 1 => {
                let v = pick(r);
                let f = Expr::int(r.pick(&SPLIT_FACTORS));
                let parts = r.chance(0.3);
                let _ = write!(
                    log,
                    " split({},{}{f})",
                    v.name,
                    if parts { "nparts=" } else { "" }
                );
                if parts {
                    st.split(&v, None, Some(f)).map(|_| ())
                } else {
                    st.split(&v, Some(f), None).map(|_| ())
                }
            }
            2 if lv.len() >= 2 => {
                let p = r.below(lv.len() as u64 - 1) as usize;
                let _ = write!(log, " fuse({},{})", lv[p].name, lv[p + 1].name);
                st.fuse(&lv[p], &lv[p + 1]).map(|_| ())
            }
            3 => {
                let mut order = lv.clone();
                for i in (1..order.len()).rev() {
                    order.swap(i, r.below(i as u64 + 1) as usize);
                }
                let _ = write!(log, " reorder");
                st.reorder(&order)
            }
            4 if lv.len() >= 2 => {
                let p = r.below(lv.len() as u64 - 1) as usize;
                let (fx, fy) = (r.pick(&SPLIT_FACTORS), r.pick(&SPLIT_FACTORS));
                let _ = write!(log, " tile({fx},{fy})");
                st.tile(&lv[p], &lv[p + 1], Expr::int(fx), Expr::int(fy))
                    .map(|_| ())
            }
            5 => {
                let v = pick(r);
                let _ = write!(log, " parallel({})", v.name);
                st.parallel(&v)
            }
            6 => {
                let v = pick(r);
                let _ = write!(log, " vectorize({})", v.name);
                st.vectorize(&v)
            }
            _ => {
                let v = pick(r);
                let _ = write!(log, " unroll({})", v.name);
                st.unroll(&v)
            }
        };
        if let Err(e) = res {
            if ckind(&e) == "Internal" {
                return Err(format!("schedule primitive: {e}"));
            }
            let _ = write!(log, "[refused]");
        }
    }
    Ok(())
}

fn make_schedule(p: &Program, r: &mut Rng, log: &mut String) -> Result<Schedule, String> {
    let mut s = Schedule::new(&[p.out.clone()]).map_err(|e| format!("Schedule::new: {e}"))?;
    let _ = write!(log, "\nschedule:");
    schedule_stage(&mut s, &p.out, r, log)?;
    if let Some(pt) = &p.producer {
        let _ = write!(log, " | P:");
        schedule_stage(&mut s, pt, r, log)?;
        let res = match r.below(3) {
            0 => Ok(()),
            1 => {
                let _ = write!(log, " inline(P)");
                s.compute_inline(pt)
            }
            _ => {
                let lv = leaves(&s, &p.out);
                let v = lv[r.below(lv.len() as u64) as usize].clone();
                let _ = write!(log, " compute_at(P,{})", v.name);
                s.compute_at(pt, &p.out, &v)
            }
        };
        if let Err(e) = res {
            if ckind(&e) == "Internal" {
                return Err(format!("placement: {e}"));
            }
        }
    }
    Ok(s)
}

/// The guarded arguments of one call: inputs, then the output.
struct Args {
    inputs: Vec<Guarded>,
    out: Guarded,
}

/// `None` when an input's element count passes i64 (no tensor can have that shape).
fn make_args(p: &Program, r: &mut Rng) -> Option<Args> {
    let inputs = p
        .inputs
        .iter()
        .map(|inp| {
            let shape: Vec<i64> = inp.dims.iter().map(|d| d.value).collect();
            let mut lay = LayoutS::random(shape.len(), true, r);
            for (d, dim) in inp.dims.iter().enumerate() {
                // Hostile dims cost no memory: a zero stride.
                lay.bcast[d] = dim.hostile && dim.value > 1 || lay.bcast[d];
            }
            Guarded::try_new(&shape, p.dtype, &lay, false, r)
        })
        .collect::<Option<_>>()?;
    let shape: Vec<i64> = p.out_dims.iter().map(|d| d.value).collect();
    let lay = LayoutS::random(shape.len(), false, r);
    let out = Guarded::new(&shape, p.out.dtype(), &lay, true, r);
    Some(Args { inputs, out })
}

impl Args {
    fn twin(&self) -> Args {
        Args {
            inputs: self.inputs.iter().map(Guarded::twin).collect(),
            out: self.out.twin(),
        }
    }
    fn values(&self) -> Vec<Value> {
        self.inputs
            .iter()
            .chain([&self.out])
            .map(|g| Value::Tensor(g.view.clone()))
            .collect()
    }
    /// Memory-safety checks after a call, whatever its result.
    fn damage(&self, target: &str) -> Option<String> {
        for (k, g) in self.inputs.iter().enumerate() {
            if let Some(m) = g.check_unchanged(&format!("{target}: input A{k}")) {
                return Some(m);
            }
        }
        self.out.check_canaries(&format!("{target}: output"))
    }
}

/// Builds and runs one case; the outcome compares the two targets.
pub fn run_case(seed: u64, verbose: bool) -> Outcome {
    let mut r = Rng::new(seed);
    let mut log = String::new();
    let p = gen_program(&mut r, &mut log);
    let s = match make_schedule(&p, &mut r, &mut log) {
        Ok(s) => s,
        Err(m) => return Outcome::Fail(format!("{m}\n{log}")),
    };
    if verbose {
        eprintln!("te case {seed:#x}: {log}");
        for t in [&p.out].into_iter().chain(&p.producer) {
            eprintln!("  {} = {:?}", t.name(), t.body());
        }
    }
    let mut args_te: Vec<Te> = p.inputs.iter().map(|i| i.te.clone()).collect();
    args_te.push(p.out.clone());
    // The interpreter runs the program as written and the CPU applies its default schedule
    // to an untouched one (inlining, packing): the interpreter gets the same defaulted
    // schedule, so both run one program (the default itself is checked against plain nests
    // in tests/tests/schedule_cpu_default.rs).
    let mut defaulted = s.clone();
    let built: Vec<_> =
        match rivet_compiler::schedule::cpu_default::apply_default_cpu(&mut defaulted) {
            Ok(()) => rivet_tests::backend_names()
                .iter()
                .map(|t| build(&defaulted, &args_te, t, "f"))
                .collect(),
            Err(e) => vec![Err(e.clone()), Err(e)],
        };
    let (mi, mc) = match (&built[0], &built[1]) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(a), Err(b)) => {
            let (ka, kb) = (ckind(a), ckind(b));
            if ka == "Internal" || kb == "Internal" {
                return Outcome::Fail(format!(
                    "build: internal error: {}\n{log}",
                    short(&if ka == "Internal" { a } else { b }.to_string())
                ));
            }
            if ka != kb {
                return Outcome::Fail(format!(
                    "build: interp says {ka}, cpu says {kb}: {a} / {b}\n{log}"
                ));
            }
            if verbose {
                eprintln!("  build refused ({ka}): {}", short(&a.to_string()));
            }
            return Outcome::Typed(format!("build:{ka}"));
        }
        (a, b) => {
            let one = |x: &Result<_, rivet_compiler::Error>| match x {
                Ok(_) => "built".to_string(),
                Err(e) => format!("{}: {}", ckind(e), short(&e.to_string())),
            };
            return Outcome::Fail(format!(
                "build: targets disagree: interp {} / cpu {}\n{log}",
                one(a),
                one(b)
            ));
        }
    };
    // A hostile dim over a reduction axis or a producer's domain asks for that much work
    // (2**31 .. 2**62 iterations over a broadcast input), which is legitimate and slow, not a
    // hang: such programs are built (the proof and its checks are exercised) but not run.
    // (The hostile value is in the log, "h=<value>", whichever stage carries it.)
    let huge = log
        .split("h=")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|v| v.parse::<i64>().ok())
        .is_some_and(|v| v > 1 << 20);
    if huge && (p.producer.is_some() || log.contains("reduce=true")) {
        return Outcome::Typed("run:skipped (hostile work size)".into());
    }
    if verbose {
        eprintln!("IR:\n{}", mi.get_source("ir").unwrap_or_default());
    }
    let fi = mi.get_function("f").expect("the built function");
    let fc = mc.get_function("f").expect("the built function");
    let Some(ai) = make_args(&p, &mut r) else {
        return Outcome::Typed("args:unrepresentable".into());
    };
    let ac = ai.twin();
    let ri = fi.call(&ai.values());
    if let Some(m) = ai.damage("interp") {
        return Outcome::Fail(format!("{m}\n{log}"));
    }
    let rc = fc.call(&ac.values());
    if let Some(m) = ac.damage("cpu") {
        return Outcome::Fail(format!(
            "{m}\n{log}\nIR:\n{}",
            mc.get_source("ir").unwrap_or_default()
        ));
    }
    match (ri, rc) {
        (Ok(_), Ok(_)) => {
            let (ei, ec) = (ai.out.elements(), ac.out.elements());
            if let (Some(ei), Some(ec)) = (ei, ec) {
                if let Some(k) = (0..ei.len()).find(|&k| ei[k] != ec[k]) {
                    return Outcome::Fail(format!(
                        "wrong result: element {k} of {}: interp {:#x}, cpu {:#x}\n{log}\nIR:\n{}",
                        ei.len(),
                        ei[k],
                        ec[k],
                        mc.get_source("ir").unwrap_or_default()
                    ));
                }
            }
            Outcome::Pass
        }
        (Err(a), Err(b)) => {
            let (ka, kb) = (kind(&a), kind(&b));
            if ka == "Internal" || kb == "Internal" {
                return Outcome::Fail(format!("call: internal error: interp {a} / cpu {b}\n{log}"));
            }
            // In checked mode every access is checked against its buffer: an Index error
            // there is an access the bounds proof admitted, i.e. a soundness bug (unchecked,
            // the same access would have touched memory outside the tensors).
            if ka == "Index" || kb == "Index" {
                return Outcome::Fail(format!(
                    "call: out-of-bounds access admitted by the proof: interp {a} / cpu {b}\n{log}\nIR:\n{}",
                    mc.get_source("ir").unwrap_or_default()
                ));
            }
            if ka != kb {
                return Outcome::Fail(format!(
                    "call: interp says {ka}, cpu says {kb}: {} / {}\n{log}",
                    short(&a.to_string()),
                    short(&b.to_string())
                ));
            }
            if verbose {
                eprintln!("  call refused ({ka}): {}", short(&a.to_string()));
            }
            Outcome::Typed(format!("call:{ka}"))
        }
        (a, b) => {
            let one = |x: &Result<Value, rivet_runtime::Error>| match x {
                Ok(_) => "ran".to_string(),
                Err(e) => format!("{}: {}", kind(e), short(&e.to_string())),
            };
            Outcome::Fail(format!(
                "call: targets disagree: interp {} / cpu {}\n{log}",
                one(&a),
                one(&b)
            ))
        }
    }
}

/// A module for the cpu target from case `seed`'s program and schedule, when it builds
/// (the module generator's random bases).
pub fn built_module(seed: u64) -> Option<rivet_compiler::Module> {
    let mut r = Rng::new(seed);
    let mut log = String::new();
    let p = gen_program(&mut r, &mut log);
    let s = make_schedule(&p, &mut r, &mut log).ok()?;
    let mut args: Vec<Te> = p.inputs.iter().map(|i| i.te.clone()).collect();
    args.push(p.out.clone());
    build(&s, &args, "cpu", "f").ok()
}
