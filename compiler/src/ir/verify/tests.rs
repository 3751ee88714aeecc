//! The verifier's rules, one test each: a valid function, then one break of each rule.
use super::*;
use crate::ir::expr::{BinOp, UnOp};
use crate::ir::limits::{MAX_IR_DEPTH, MAX_STMT_DEPTH};
use crate::ir::stmt::{BufKind, ForKind};
use crate::ir::{Check, Expr, ExprKind, IterVar, ReduceOp, Var};
use rivet_runtime::DType;

/// A small valid function, and handles on its parts:
/// `for i in [0, n): allocate T: T[i*sT] = A[i*sA]; C[i*sC] = T[i*sT]`.
struct Base {
    f: PrimFunc,
    n: Var,
    i: Var,
    a: Buffer,
    c: Buffer,
    t: Buffer,
}

use crate::ir::test_util::buffer;

fn off(b: &Buffer, i: &Var) -> Expr {
    Expr::var(i).mul(&Expr::var(&b.strides[0]))
}

fn base() -> Base {
    let n = Var::new("n");
    let i = Var::new("i");
    let a = buffer(
        0,
        "A",
        DType::F32,
        vec![Expr::var(&n)],
        BufKind::Param { output: false },
    );
    let c = buffer(
        1,
        "C",
        DType::F32,
        vec![Expr::var(&n)],
        BufKind::Param { output: true },
    );
    let t = buffer(2, "T", DType::F32, vec![Expr::var(&n)], BufKind::Local);
    let body = Stmt::For {
        var: i.clone(),
        min: Expr::int(0),
        extent: Expr::var(&n),
        kind: ForKind::Serial,
        body: Box::new(Stmt::Allocate {
            bufs: vec![t.id],
            body: Box::new(Stmt::Seq(vec![
                Stmt::Store {
                    buf: t.id,
                    indices: vec![off(&t, &i)],
                    value: Expr::load(a.id, vec![off(&a, &i)], DType::F32),
                },
                Stmt::Store {
                    buf: c.id,
                    indices: vec![off(&c, &i)],
                    value: Expr::load(t.id, vec![off(&t, &i)], DType::F32),
                },
            ])),
        }),
    };
    let f = PrimFunc {
        name: "copy_via_local".into(),
        params: vec![a.id, c.id],
        buffers: vec![a.clone(), c.clone(), t.clone()],
        dims: vec![n.clone()],
        checks: vec![],
        body,
        kernels: vec![],
        callbacks: vec![],
    };
    Base { f, n, i, a, c, t }
}

/// The base function with `C[i*sC] = value` (inside the loop and allocation) instead.
fn with_store(b: &Base, indices: Vec<Expr>, value: Expr) -> PrimFunc {
    let mut f = b.f.clone();
    f.body = Stmt::For {
        var: b.i.clone(),
        min: Expr::int(0),
        extent: Expr::var(&b.n),
        kind: ForKind::Serial,
        body: Box::new(Stmt::Allocate {
            bufs: vec![b.t.id],
            body: Box::new(Stmt::Store {
                buf: b.c.id,
                indices,
                value,
            }),
        }),
    };
    f
}

fn expect_err(f: &PrimFunc, flattened: bool, rule: &str) {
    match verify(f, flattened) {
        Err(Error::Internal(m)) => {
            assert!(m.contains(rule), "expected rule `{rule}` in: {m}");
            assert!(
                m.contains(&f.name),
                "message does not name the function: {m}"
            );
        }
        other => panic!("expected an internal error for `{rule}`, got {other:?}"),
    }
}

/// A size limit is the program's to change: a `CompileError` naming the limit and the
/// function, never "a bug in rivet".
fn expect_limit(f: &PrimFunc, flattened: bool, rule: &str) {
    match verify(f, flattened) {
        Err(Error::Compile(m)) => {
            assert!(m.contains(rule), "expected `{rule}` in: {m}");
            assert!(
                m.contains(&f.name),
                "message does not name the function: {m}"
            );
        }
        other => panic!("expected a compile error for `{rule}`, got {other:?}"),
    }
}

#[test]
fn base_is_valid() {
    let b = base();
    verify(&b.f, true).unwrap();
    // One index per dim of a 1-d buffer: also valid unflattened.
    verify(&b.f, false).unwrap();
}

#[test]
fn params_first_in_order() {
    let mut f = base().f;
    f.buffers.swap(0, 1);
    expect_err(&f, true, "params must be the first buffers, in order");
}

#[test]
fn unique_ids() {
    let mut f = base().f;
    f.buffers[2].id = BufId(0);
    expect_err(&f, true, "duplicate buffer id");
}

#[test]
fn buffer_kinds() {
    let mut f = base().f;
    f.buffers[0].kind = BufKind::Local;
    expect_err(&f, true, "param buffer must have kind Param");
    let mut f = base().f;
    f.buffers[2].kind = BufKind::Param { output: false };
    expect_err(&f, true, "non-param buffer must have kind Local");
}

#[test]
fn strides_match_shape() {
    let mut f = base().f;
    f.buffers[1].strides.push(Var::new("extra"));
    expect_err(&f, true, "strides.len() must equal shape.len()");
}

#[test]
fn unbound_variables() {
    let b = base();
    let stray = Var::new("stray");
    let f = with_store(&b, vec![Expr::var(&stray)], Expr::constant(1.0, DType::F32));
    expect_err(&f, true, "unbound variable");
    // A local's stride is bound only inside its Allocate.
    let mut f = b.f.clone();
    f.body = Stmt::Store {
        buf: b.c.id,
        indices: vec![Expr::var(&b.t.strides[0])],
        value: Expr::constant(1.0, DType::F32),
    };
    expect_err(&f, true, "unbound variable");
    // A loop variable is out of scope after its loop.
    let mut f = b.f.clone();
    f.body = Stmt::Seq(vec![
        b.f.body.clone(),
        Stmt::Store {
            buf: b.c.id,
            indices: vec![Expr::var(&b.i)],
            value: Expr::constant(1.0, DType::F32),
        },
    ]);
    expect_err(&f, true, "unbound variable");
    // Parameter shapes use dims only.
    let mut f = b.f.clone();
    f.buffers[0].shape[0] = Expr::var(&b.i);
    expect_err(&f, true, "unbound variable");
}

#[test]
fn no_shadowing_but_siblings_may_rebind() {
    let b = base();
    let mut f = b.f.clone();
    f.body = Stmt::For {
        var: b.i.clone(),
        min: Expr::int(0),
        extent: Expr::int(2),
        kind: ForKind::Serial,
        body: Box::new(b.f.body.clone()),
    };
    expect_err(&f, true, "variable bound twice");
    // A loop over a dim's variable.
    let mut f = b.f.clone();
    f.body = Stmt::For {
        var: b.n.clone(),
        min: Expr::int(0),
        extent: Expr::int(2),
        kind: ForKind::Serial,
        body: Box::new(Stmt::Seq(vec![])),
    };
    expect_err(&f, true, "variable bound twice");
    // A Let of a param stride.
    let mut f = b.f.clone();
    f.body = Stmt::Let {
        var: b.a.strides[0].clone(),
        value: Expr::int(1),
        body: Box::new(Stmt::Seq(vec![])),
    };
    expect_err(&f, true, "variable bound twice");
    // Two sibling loops over the same variable are fine.
    let mut f = b.f.clone();
    f.body = Stmt::Seq(vec![b.f.body.clone(), b.f.body.clone()]);
    verify(&f, true).unwrap();
}

#[test]
fn te_only_nodes() {
    let b = base();
    let t = crate::te::placeholder(&[Expr::int(4)], DType::F32, "P").unwrap();
    let read = t.try_at(&[Expr::var(&b.i)]).unwrap();
    expect_err(
        &with_store(&b, vec![off(&b.c, &b.i)], read),
        true,
        "te-only node",
    );
    let k = Var::new("k");
    let reduce = Expr::new(
        ExprKind::Reduce {
            op: ReduceOp::Sum,
            body: Expr::constant(1.0, DType::F32),
            axes: vec![IterVar {
                var: k,
                min: Expr::int(0),
                extent: Expr::int(3),
                reduce: true,
            }],
        },
        DType::F32,
    );
    expect_err(
        &with_store(&b, vec![off(&b.c, &b.i)], reduce),
        true,
        "te-only node",
    );
    let invalid = Expr::new(ExprKind::Invalid("misuse".into()), DType::F32);
    expect_err(
        &with_store(&b, vec![off(&b.c, &b.i)], invalid),
        true,
        "invalid expression",
    );
}

#[test]
fn buffers_exist_and_locals_are_live() {
    let b = base();
    let bogus = Expr::load(BufId(99), vec![Expr::int(0)], DType::F32);
    expect_err(
        &with_store(&b, vec![off(&b.c, &b.i)], bogus),
        true,
        "unknown buffer",
    );
    let mut f = b.f.clone();
    f.body = Stmt::Store {
        buf: b.t.id,
        indices: vec![Expr::int(0)],
        value: Expr::constant(1.0, DType::F32),
    };
    expect_err(&f, true, "local buffer used outside its Allocate");
    let mut f = b.f.clone();
    f.body = Stmt::Allocate {
        bufs: vec![b.a.id],
        body: Box::new(Stmt::Seq(vec![])),
    };
    expect_err(&f, true, "only local buffers are allocated");
    let mut f = b.f.clone();
    f.body = Stmt::Allocate {
        bufs: vec![b.t.id],
        body: Box::new(b.f.body.clone()),
    };
    expect_err(&f, true, "allocated twice");
}

#[test]
fn int64_indices_bounds_and_lets() {
    let b = base();
    let f = with_store(
        &b,
        vec![Expr::const_int(0, DType::I32)],
        Expr::constant(1.0, DType::F32),
    );
    expect_err(&f, true, "index must be int64");
    let mut f = b.f.clone();
    f.body = Stmt::For {
        var: Var::new("j"),
        min: Expr::int(0),
        extent: Expr::const_int(3, DType::I32),
        kind: ForKind::Serial,
        body: Box::new(Stmt::Seq(vec![])),
    };
    expect_err(&f, true, "For extent must be int64");
    let mut f = b.f.clone();
    f.body = Stmt::Let {
        var: Var::new("x"),
        value: Expr::const_int(3, DType::U64),
        body: Box::new(Stmt::Seq(vec![])),
    };
    expect_err(&f, true, "Let value must be int64");
}

/// An `Fma` is float-only with one dtype (the bounds proof never meets an int64 one: it
/// reasons about `+` and `*` only); hand-made or loaded bad nodes are refused.
#[test]
fn fma_is_float_only() {
    let b = base();
    let i64_fma = Expr::new(
        ExprKind::Fma(Expr::int(2), Expr::int(3), Expr::int(4)),
        DType::I64,
    );
    expect_err(
        &with_store(&b, vec![i64_fma], Expr::constant(1.0, DType::F32)),
        true,
        "fma needs floats",
    );
    let mixed = Expr::new(
        ExprKind::Fma(
            Expr::constant(1.0, DType::F32),
            Expr::constant(1.0, DType::F64),
            Expr::constant(1.0, DType::F32),
        ),
        DType::F32,
    );
    expect_err(
        &with_store(&b, vec![off(&b.c, &b.i)], mixed),
        true,
        "operand dtypes differ: fma",
    );
}

#[test]
fn conditions_are_bool() {
    let b = base();
    let mut f = b.f.clone();
    f.body = Stmt::If {
        cond: Expr::int(1),
        then: Box::new(b.f.body.clone()),
        otherwise: None,
    };
    expect_err(&f, true, "condition must be bool");
    let bad_select = Expr::new(
        ExprKind::Select(
            Expr::int(1),
            Expr::constant(1.0, DType::F32),
            Expr::constant(2.0, DType::F32),
        ),
        DType::F32,
    );
    expect_err(
        &with_store(&b, vec![off(&b.c, &b.i)], bad_select),
        true,
        "condition must be bool",
    );
}

#[test]
fn dtypes_of_stores_loads_and_operands() {
    let b = base();
    expect_err(
        &with_store(&b, vec![off(&b.c, &b.i)], Expr::constant(1.0, DType::F64)),
        true,
        "store dtype must equal buffer dtype",
    );
    let wrong_load = Expr::load(b.a.id, vec![off(&b.a, &b.i)], DType::F64);
    expect_err(
        &with_store(
            &b,
            vec![off(&b.c, &b.i)],
            Expr::cast(DType::F32, wrong_load),
        ),
        true,
        "load dtype must equal buffer dtype",
    );
    let mixed = Expr::new(
        ExprKind::Binary(
            BinOp::Add,
            Expr::constant(1.0, DType::F32),
            Expr::constant(1.0, DType::F64),
        ),
        DType::F32,
    );
    expect_err(
        &with_store(&b, vec![off(&b.c, &b.i)], mixed),
        true,
        "operand dtypes differ",
    );
    let mixed_cmp = Expr::new(
        ExprKind::Cmp(
            crate::ir::CmpOp::Lt,
            Expr::int(1),
            Expr::const_int(1, DType::I32),
        ),
        DType::Bool,
    );
    let sel = Expr::select(
        mixed_cmp.clone(),
        Expr::constant(1.0, DType::F32),
        Expr::constant(2.0, DType::F32),
    )
    .unwrap();
    expect_err(
        &with_store(&b, vec![off(&b.c, &b.i)], sel),
        true,
        "operand dtypes differ",
    );
    assert!(
        matches!(verify_expr_types(&mixed_cmp), Err(Error::Internal(m)) if m.contains("operand dtypes differ"))
    );
    assert!(verify_expr_types(&Expr::var(&b.i).add(&Expr::int(1))).is_ok());
}

#[test]
fn index_counts() {
    let b = base();
    let two = vec![off(&b.c, &b.i), Expr::int(0)];
    expect_err(
        &with_store(&b, two, Expr::constant(1.0, DType::F32)),
        true,
        "flattened access must have exactly 1 index",
    );
    // Unflattened: one index per dimension.
    let mut f = b.f.clone();
    let m = Var::new("m");
    f.dims.push(m.clone());
    f.buffers[1].shape.push(Expr::var(&m));
    f.buffers[1].strides.push(Var::new("C_s1"));
    expect_err(&f, false, "index count must equal buffer rank");
    verify(&f, true).unwrap();
}

#[test]
fn unrolled_loops_need_constant_extents() {
    let b = base();
    let mut f = b.f.clone();
    let Stmt::For { kind: k, .. } = &mut f.body else {
        unreachable!()
    };
    *k = ForKind::Vectorized;
    verify(&f, true).unwrap(); // symbolic extents may be vectorized (strip-mined)
    let mut f = b.f.clone();
    let Stmt::For { kind: k, .. } = &mut f.body else {
        unreachable!()
    };
    *k = ForKind::Unrolled;
    expect_err(&f, true, "unrolled loop needs a constant extent");
    let mut f = b.f.clone();
    let Stmt::For {
        kind: k, extent, ..
    } = &mut f.body
    else {
        unreachable!()
    };
    *k = ForKind::Unrolled;
    *extent = Expr::int(4);
    verify(&f, true).unwrap();
}

#[test]
fn checks() {
    let b = base();
    let mut f = b.f.clone();
    f.checks.push(Check {
        cond: Expr::var(&b.n),
        message: "n".into(),
    });
    expect_err(&f, true, "condition must be bool");
    let mut f = b.f.clone();
    f.checks.push(Check {
        cond: Expr::var(&b.i).lt(&Expr::var(&b.n)),
        message: "i < n".into(),
    });
    expect_err(&f, true, "checks use only dims and param stride variables");
    let mut f = b.f.clone();
    f.checks.push(Check {
        cond: Expr::var(&b.t.strides[0]).lt(&Expr::var(&b.n)),
        message: "local stride".into(),
    });
    expect_err(&f, true, "checks use only dims and param stride variables");
    let mut f = b.f.clone();
    let x = Expr::load(b.a.id, vec![Expr::int(0)], DType::F32);
    f.checks.push(Check {
        cond: Expr::cmp(crate::ir::CmpOp::Lt, x.clone(), x).unwrap(),
        message: "load".into(),
    });
    expect_err(&f, true, "checks use only dims and param stride variables");
    let mut f = b.f.clone();
    f.checks.push(Check {
        cond: Expr::var(&b.a.strides[0]).lt(&Expr::var(&b.n)),
        message: "ok".into(),
    });
    verify(&f, true).unwrap();
}

/// `for i in [0, 8) (kind): C[idx] = C[idx] + A[i]`, unflattened, loaded-file rules.
fn loaded_loop(kind: ForKind, idx: impl Fn(&Var) -> Expr) -> PrimFunc {
    let b = base();
    let i = Var::new("i");
    let mut f = b.f.clone();
    let at = idx(&i);
    f.body = Stmt::For {
        var: i.clone(),
        min: Expr::int(0),
        extent: Expr::int(8),
        kind,
        body: Box::new(Stmt::Store {
            buf: b.c.id,
            indices: vec![at.clone()],
            value: Expr::binary(
                BinOp::Add,
                Expr::load(b.c.id, vec![at], DType::F32),
                Expr::load(b.a.id, vec![Expr::var(&i)], DType::F32),
            )
            .unwrap(),
        }),
    };
    f
}

fn expect_loaded_err(f: &PrimFunc, rule: &str) {
    match verify_loaded(f) {
        Err(Error::Internal(m)) => assert!(m.contains(rule), "expected `{rule}` in: {m}"),
        other => panic!("expected `{rule}`, got {other:?}"),
    }
}

#[test]
fn stores_only_to_outputs_and_locals() {
    let b = base();
    let mut f = b.f.clone();
    f.body = Stmt::Store {
        buf: b.a.id,
        indices: vec![Expr::int(0)],
        value: Expr::constant(1.0, DType::F32),
    };
    expect_err(&f, true, "stores go only to outputs and locals");
}

#[test]
fn parallel_loops_must_be_race_free_in_loaded_functions() {
    // Disjoint: C[i], C[2 * i + 1].
    verify_loaded(&loaded_loop(ForKind::Parallel, Expr::var)).unwrap();
    verify_loaded(&loaded_loop(ForKind::Parallel, |i| {
        Expr::int(2).mul(&Expr::var(i)).add(&Expr::int(1))
    }))
    .unwrap();
    // A reduction into C[0], a shared C[i // 2]: refused; serial: fine.
    let red = loaded_loop(ForKind::Parallel, |_| Expr::int(0));
    expect_loaded_err(
        &red,
        "parallel loop iterations must write disjoint elements",
    );
    verify(&red, false).unwrap(); // the builder's own output is not held to the rule
    expect_loaded_err(
        &loaded_loop(ForKind::Parallel, |i| Expr::var(i).floordiv(&Expr::int(2))),
        "disjoint elements",
    );
    verify_loaded(&loaded_loop(ForKind::Serial, |_| Expr::int(0))).unwrap();
    expect_loaded_err(
        &loaded_loop(ForKind::Vectorized, |_| Expr::int(0)),
        "vectorized loop iterations must write disjoint elements",
    );
}

/// `parallel for f in [0, 8): for j in [0, width): C[f // e, (f % e) * 32 + j] = 1` on a 2-D
/// output: the digits of a fused loop whose inner loop was tiled by 32 (a default-scheduled
/// GEMM's heads x column panels).
fn fused_tiled(e: Expr, width: i64, extent: Expr) -> PrimFunc {
    fused_scaled(e, 32, width, extent)
}

/// `fused_tiled` with the column digit scaled by `scale` instead of 32.
fn fused_scaled(e: Expr, scale: i64, width: i64, extent: Expr) -> PrimFunc {
    let b = base();
    let n = b.n.clone();
    let c2 = buffer(
        1,
        "C",
        DType::F32,
        vec![Expr::var(&n), Expr::var(&n)],
        BufKind::Param { output: true },
    );
    let (f, j) = (Var::new("f"), Var::new("j"));
    let fv = Expr::var(&f);
    let col = fv.floormod(&e).mul(&Expr::int(scale)).add(&Expr::var(&j));
    let mut func = b.f.clone();
    func.buffers[1] = c2.clone();
    func.body = Stmt::For {
        var: f.clone(),
        min: Expr::int(0),
        extent,
        kind: ForKind::Parallel,
        body: Box::new(Stmt::For {
            var: j.clone(),
            min: Expr::int(0),
            extent: Expr::int(width),
            kind: ForKind::Serial,
            body: Box::new(Stmt::Store {
                buf: c2.id,
                indices: vec![fv.floordiv(&e), col],
                value: Expr::constant(1.0, DType::F32),
            }),
        }),
    };
    func
}

#[test]
fn a_fused_loops_tiled_digits_are_disjoint_and_an_overlap_is_not() {
    let eight = || Expr::int(8);
    // Each f writes row f // 4, columns [32 (f % 4), 32 (f % 4) + 32): disjoint.
    verify_loaded(&fused_tiled(Expr::int(4), 32, eight())).unwrap();
    // 33 columns per f: f and f + 1 share a column.
    expect_loaded_err(&fused_tiled(Expr::int(4), 33, eight()), "disjoint elements");
    // A symbolic divisor may be 0 (`x // 0 == x % 0 == 0`: every f the same element): taken
    // only when it is a factor of the loop's extent (0 then means no iteration), as a fused
    // loop's extent `rows * m` has it.
    let m = Var::new("m");
    let with_m = |mut f: PrimFunc| {
        f.dims.push(m.clone());
        f
    };
    let mv = Expr::var(&m);
    expect_loaded_err(
        &with_m(fused_tiled(mv.clone(), 32, eight())),
        "disjoint elements",
    );
    verify_loaded(&with_m(fused_tiled(mv.clone(), 32, Expr::int(2).mul(&mv)))).unwrap();
    expect_loaded_err(
        &with_m(fused_tiled(mv.clone(), 33, Expr::int(2).mul(&mv))),
        "disjoint elements",
    );
    expect_loaded_err(&fused_tiled(Expr::int(0), 32, eight()), "disjoint elements");
    // Hostile scales: refused or accepted, never a panic or a wrapped window (the key's
    // arithmetic stays in checked linear forms).
    for scale in [1i64 << 31, 1 << 62, i64::MAX] {
        if let Err(e) = verify_loaded(&fused_scaled(Expr::int(4), scale, 32, eight())) {
            assert!(e.to_string().contains("disjoint elements"), "{scale}: {e}");
        }
    }
    // A width past the scale overlaps whatever the scale.
    expect_loaded_err(
        &fused_scaled(Expr::int(4), 1 << 40, (1 << 40) + 1, eight()),
        "disjoint elements",
    );
}

#[test]
fn extents_and_resource_limits() {
    let b = base();
    let mut f = b.f.clone();
    let Stmt::For { extent, .. } = &mut f.body else {
        unreachable!()
    };
    *extent = Expr::int(-1);
    expect_err(&f, true, "loop extent must not be negative");
    let mut f = b.f.clone();
    let Stmt::For { min, extent, .. } = &mut f.body else {
        unreachable!()
    };
    *min = Expr::int(i64::MAX);
    *extent = Expr::int(2);
    expect_err(&f, true, "loop bounds overflow int64");
    // Too deep an expression.
    let mut v = Expr::constant(1.0, DType::F32);
    for _ in 0..MAX_IR_DEPTH {
        v = Expr::new(ExprKind::Unary(UnOp::Neg, v), DType::F32);
    }
    expect_limit(
        &with_store(&b, vec![off(&b.c, &b.i)], v),
        true,
        "limit MAX_IR_DEPTH",
    );
    // Too deeply nested statements.
    let mut f = b.f.clone();
    for _ in 0..MAX_STMT_DEPTH {
        f.body = Stmt::Seq(vec![f.body]);
    }
    expect_limit(&f, true, "limit MAX_STMT_DEPTH");
    // A DAG of 2^60 tree nodes (60 shared levels): refused at the limit, quickly.
    let mut v = Expr::constant(1.0, DType::F32);
    for _ in 0..60 {
        v = Expr::binary(BinOp::Add, v.clone(), v).unwrap();
    }
    expect_limit(
        &with_store(&b, vec![off(&b.c, &b.i)], v),
        true,
        "limit MAX_FUNC_NODES",
    );
}

#[test]
fn messages_name_the_statement() {
    let b = base();
    let f = with_store(&b, vec![off(&b.c, &b.i)], Expr::constant(1.0, DType::F64));
    let Err(Error::Internal(m)) = verify(&f, true) else {
        panic!()
    };
    assert!(
        m.contains("in statement: C[(i * C.s0)] = 1.0:float64"),
        "{m}"
    );
}
