//! The interpreter's semantics, one test each: memory, arithmetic, casts, laziness, checks.
use super::*;
use crate::ir::expr::{BinOp, CmpOp, LogicOp, UnOp};
use crate::ir::stmt::{Buffer, Stmt};
use crate::ir::{BufKind, Check, ForKind};
use half::{bf16, f16};

// ---- builders ----

use crate::ir::test_util::{buffer, input, output};

fn func(name: &str, params: &[&Buffer], locals: &[&Buffer], dims: &[&Var], body: Stmt) -> PrimFunc {
    let buffers = params.iter().chain(locals).map(|b| (*b).clone()).collect();
    crate::ir::test_util::func(
        name,
        buffers,
        dims.iter().map(|v| (*v).clone()).collect(),
        body,
    )
}
/// The flattened offset `sum(idx_k * stride_k)` of buffer `b`.
fn at(b: &Buffer, idx: &[&Var]) -> Expr {
    idx.iter()
        .zip(&b.strides)
        .map(|(i, s)| Expr::var(i).mul(&Expr::var(s)))
        .reduce(|x, y| x.add(&y))
        .unwrap_or_else(|| Expr::int(0))
}
fn ld(b: &Buffer, idx: &[&Var]) -> Expr {
    Expr::load(b.id, vec![at(b, idx)], b.dtype)
}
fn st(b: &Buffer, idx: &[&Var], value: Expr) -> Stmt {
    Stmt::Store {
        buf: b.id,
        indices: vec![at(b, idx)],
        value,
    }
}
fn for_(v: &Var, extent: Expr, body: Stmt) -> Stmt {
    Stmt::For {
        var: v.clone(),
        min: Expr::int(0),
        extent,
        kind: ForKind::Serial,
        body: Box::new(body),
    }
}
fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    Expr::binary(op, a, b).unwrap()
}
fn call(f: &PrimFunc, ptrs: Vec<*mut u8>, ints: Vec<i64>) -> Result<()> {
    // SAFETY: every test passes pointers into live Vecs laid out as the frame says.
    unsafe {
        run(
            f,
            &CallFrame {
                ptrs: ptrs.into(),
                ints: ints.into(),
            },
        )
    }
}
fn p<T>(v: &mut [T]) -> *mut u8 {
    v.as_mut_ptr().cast()
}
fn none(_: &Var) -> Option<i64> {
    None
}
fn ev(e: &Expr) -> Value {
    eval_expr(e, &none).unwrap()
}

// ---- programs ----

/// `C[i] = A[i] + B[i]` over `n`, each operand with its own stride.
#[test]
fn add_1d_strided() {
    let n = Var::new("n");
    let i = Var::new("i");
    let sh = vec![Expr::var(&n)];
    let (a, b, c) = (
        input(0, "A", DType::F32, sh.clone()),
        input(1, "B", DType::F32, sh.clone()),
        output(2, "C", DType::F32, sh),
    );
    let body = for_(
        &i,
        Expr::var(&n),
        st(&c, &[&i], bin(BinOp::Add, ld(&a, &[&i]), ld(&b, &[&i]))),
    );
    let f = func("add1d", &[&a, &b, &c], &[], &[&n], body);
    // A: stride 2 over 8 floats; B: stride -1 (element 0 is the last float); C compact.
    let mut av: Vec<f32> = (0..8).map(|x| x as f32).collect();
    let mut bv = vec![100.0f32, 200.0, 300.0, 400.0];
    let mut cv = vec![-1.0f32; 4];
    let bptr = p(&mut bv).wrapping_add(3 * 4);
    call(&f, vec![p(&mut av), bptr, p(&mut cv)], vec![4, 2, -1, 1]).unwrap();
    assert_eq!(cv, vec![400.0, 302.0, 204.0, 106.0]);

    // The same through the backend interface.
    let k = InterpBackend::default().compile(&f).unwrap();
    assert_eq!(InterpBackend::default().target().to_string(), "interp");
    assert!(k.source().starts_with("func add1d("), "{}", k.source());
    let mut cv2 = vec![0.0f32; 4];
    // SAFETY: as above.
    unsafe {
        k.launch(
            &CallFrame {
                ptrs: vec![p(&mut av), bptr, p(&mut cv2)].into(),
                ints: vec![4, 2, -1, 1].into(),
            },
            &LaunchContext::host(),
        )
    }
    .unwrap();
    assert_eq!(cv2, cv);
}

/// `C[i, j] = A[i, j] * B[i, j]` with A transposed in memory and C row-major.
#[test]
fn mul_2d_strided() {
    let (m, n) = (Var::new("m"), Var::new("n"));
    let (i, j) = (Var::new("i"), Var::new("j"));
    let sh = vec![Expr::var(&m), Expr::var(&n)];
    let (a, b, c) = (
        input(0, "A", DType::I32, sh.clone()),
        input(1, "B", DType::I32, sh.clone()),
        output(2, "C", DType::I32, sh),
    );
    let body = for_(
        &i,
        Expr::var(&m),
        for_(
            &j,
            Expr::var(&n),
            st(
                &c,
                &[&i, &j],
                bin(BinOp::Mul, ld(&a, &[&i, &j]), ld(&b, &[&i, &j])),
            ),
        ),
    );
    let f = func("mul2d", &[&a, &b, &c], &[], &[&m, &n], body);
    let (mm, nn) = (2usize, 3usize);
    // A[i, j] = 10 i + j stored column-major; B[i, j] = j + 1 row-major.
    let mut av = vec![0i32; mm * nn];
    let mut bv = vec![0i32; mm * nn];
    for ii in 0..mm {
        for jj in 0..nn {
            av[ii + jj * mm] = (10 * ii + jj) as i32;
            bv[ii * nn + jj] = jj as i32 + 1;
        }
    }
    let mut cv = vec![0i32; mm * nn];
    let ints = vec![
        mm as i64, nn as i64, 1, mm as i64, nn as i64, 1, nn as i64, 1,
    ];
    call(&f, vec![p(&mut av), p(&mut bv), p(&mut cv)], ints).unwrap();
    assert_eq!(cv, vec![0, 2, 6, 10, 22, 36]);
}

/// `out[i] = sum_j A[i, j]` accumulated in a zeroed local, then a transposed copy through a
/// 2-d local whose stride variables `Allocate` binds.
#[test]
fn reduction_and_locals() {
    let (m, n) = (Var::new("m"), Var::new("n"));
    let (i, j) = (Var::new("i"), Var::new("j"));
    let a = input(0, "A", DType::F64, vec![Expr::var(&m), Expr::var(&n)]);
    let out = output(1, "out", DType::F64, vec![Expr::var(&m)]);
    let tr = output(2, "tr", DType::F64, vec![Expr::var(&n), Expr::var(&m)]);
    let acc = buffer(3, "acc", DType::F64, vec![Expr::int(1)], BufKind::Local);
    let tmp = buffer(
        4,
        "tmp",
        DType::F64,
        vec![Expr::var(&m), Expr::var(&n)],
        BufKind::Local,
    );
    let acc0 = Expr::load(acc.id, vec![Expr::int(0)], DType::F64);
    let sum = for_(
        &i,
        Expr::var(&m),
        Stmt::Allocate {
            bufs: vec![acc.id],
            body: Box::new(Stmt::Seq(vec![
                for_(
                    &j,
                    Expr::var(&n),
                    Stmt::Store {
                        buf: acc.id,
                        indices: vec![Expr::int(0)],
                        value: bin(BinOp::Add, acc0.clone(), ld(&a, &[&i, &j])),
                    },
                ),
                st(&out, &[&i], acc0.clone()),
            ])),
        },
    );
    let copy = Stmt::Allocate {
        bufs: vec![tmp.id],
        body: Box::new(Stmt::Seq(vec![
            for_(
                &i,
                Expr::var(&m),
                for_(&j, Expr::var(&n), st(&tmp, &[&i, &j], ld(&a, &[&i, &j]))),
            ),
            for_(
                &j,
                Expr::var(&n),
                for_(&i, Expr::var(&m), st(&tr, &[&j, &i], ld(&tmp, &[&i, &j]))),
            ),
        ])),
    };
    let f = func(
        "rowsum",
        &[&a, &out, &tr],
        &[&acc, &tmp],
        &[&m, &n],
        Stmt::Seq(vec![sum, copy]),
    );
    let mut av: Vec<f64> = (0..6).map(|x| x as f64).collect();
    let mut ov = vec![f64::NAN; 2];
    let mut tv = vec![f64::NAN; 6];
    call(
        &f,
        vec![p(&mut av), p(&mut ov), p(&mut tv)],
        vec![2, 3, 3, 1, 1, 2, 1],
    )
    .unwrap();
    assert_eq!(ov, vec![3.0, 12.0]);
    assert_eq!(tv, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
}

/// Python floor semantics on negative int32 operands, zero divisors, and MIN // -1.
#[test]
fn floordiv_floormod_ints() {
    let i = Var::new("i");
    let (a, b) = (
        input(0, "a", DType::I32, vec![Expr::int(6)]),
        input(1, "b", DType::I32, vec![Expr::int(6)]),
    );
    let (q, r) = (
        output(2, "q", DType::I32, vec![Expr::int(6)]),
        output(3, "r", DType::I32, vec![Expr::int(6)]),
    );
    let body = for_(
        &i,
        Expr::int(6),
        Stmt::Seq(vec![
            st(
                &q,
                &[&i],
                bin(BinOp::FloorDiv, ld(&a, &[&i]), ld(&b, &[&i])),
            ),
            st(
                &r,
                &[&i],
                bin(BinOp::FloorMod, ld(&a, &[&i]), ld(&b, &[&i])),
            ),
        ]),
    );
    let f = func("divmod", &[&a, &b, &q, &r], &[], &[], body);
    let mut av = vec![7, -7, 7, -7, 5, i32::MIN];
    let mut bv = vec![2, 2, -2, -2, 0, -1];
    let (mut qv, mut rv) = (vec![9; 6], vec![9; 6]);
    call(
        &f,
        vec![p(&mut av), p(&mut bv), p(&mut qv), p(&mut rv)],
        vec![1, 1, 1, 1],
    )
    .unwrap();
    assert_eq!(qv, vec![3, -4, -4, 3, 0, i32::MIN]);
    assert_eq!(rv, vec![1, 1, -1, -1, 0, 0]);
    // Floats: floor division and a remainder with the divisor's sign.
    let fdiv = bin(
        BinOp::FloorDiv,
        Expr::constant(-7.0, DType::F32),
        Expr::constant(2.0, DType::F32),
    );
    let fmod = bin(
        BinOp::FloorMod,
        Expr::constant(-7.0, DType::F64),
        Expr::constant(2.0, DType::F64),
    );
    assert_eq!((ev(&fdiv), ev(&fmod)), (Value::F32(-4.0), Value::F64(1.0)));
}

/// float32 is computed in f32: (a + b) - a with a = 1e8, b = 1 is 0 in f32, 1 in f64.
#[test]
fn float32_is_not_widened() {
    let i = Var::new("i");
    for (dt, expect) in [(DType::F32, 0.0), (DType::F64, 1.0)] {
        let x = input(0, "x", dt, vec![Expr::int(2)]);
        let y = output(1, "y", dt, vec![Expr::int(1)]);
        let (a, b) = (
            Expr::load(x.id, vec![Expr::int(0)], dt),
            Expr::load(x.id, vec![Expr::int(1)], dt),
        );
        let body = for_(
            &i,
            Expr::int(1),
            st(&y, &[&i], bin(BinOp::Sub, bin(BinOp::Add, a.clone(), b), a)),
        );
        let f = func("cancel", &[&x, &y], &[], &[], body);
        if dt == DType::F32 {
            let mut xv = vec![1e8f32, 1.0];
            let mut yv = vec![9.0f32];
            call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
            assert_eq!(yv[0] as f64, expect);
        } else {
            let mut xv = vec![1e8f64, 1.0];
            let mut yv = vec![9.0f64];
            call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
            assert_eq!(yv[0], expect);
        }
    }
    let s = bin(
        BinOp::Add,
        Expr::constant(0.1, DType::F32),
        Expr::constant(0.2, DType::F32),
    );
    assert_eq!(ev(&s), Value::F32(0.1f32 + 0.2f32));
    let s = bin(
        BinOp::Add,
        Expr::constant(0.1, DType::F64),
        Expr::constant(0.2, DType::F64),
    );
    assert_eq!(ev(&s), Value::F64(0.1 + 0.2));
}

/// Integer arithmetic wraps at the dtype's width.
#[test]
fn integer_wraparound() {
    let i = Var::new("i");
    let x = input(0, "x", DType::I8, vec![Expr::int(3)]);
    let y = output(1, "y", DType::I8, vec![Expr::int(3)]);
    let body = for_(
        &i,
        Expr::int(3),
        st(
            &y,
            &[&i],
            bin(BinOp::Add, ld(&x, &[&i]), Expr::const_int(1, DType::I8)),
        ),
    );
    let f = func("inc8", &[&x, &y], &[], &[], body);
    let mut xv = vec![127i8, -1, -128];
    let mut yv = vec![0i8; 3];
    call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
    assert_eq!(yv, vec![-128, 0, -127]);

    let c = |v: i64, dt| Expr::const_int(v, dt);
    assert_eq!(
        ev(&bin(BinOp::Sub, c(0, DType::U8), c(1, DType::U8))),
        Value::Int(255)
    );
    assert_eq!(
        ev(&bin(BinOp::FloorDiv, c(-128, DType::I8), c(-1, DType::I8))),
        Value::Int(-128)
    );
    assert_eq!(
        ev(&Expr::unary(UnOp::Abs, c(-128, DType::I8)).unwrap()),
        Value::Int(-128)
    );
    assert_eq!(
        ev(&Expr::unary(UnOp::Neg, c(1, DType::U32)).unwrap()),
        Value::Int(u32::MAX as i64)
    );
    assert_eq!(
        ev(&bin(
            BinOp::Mul,
            c(1 << 20, DType::I32),
            c(1 << 12, DType::I32)
        )),
        Value::Int(0)
    );
    // uint64 is unsigned in comparisons, division, min/max and conversions.
    let big = c(-1, DType::U64); // u64::MAX
    assert_eq!(
        ev(&Expr::cmp(CmpOp::Gt, big.clone(), c(1, DType::U64)).unwrap()),
        Value::Int(1)
    );
    assert_eq!(
        ev(&bin(BinOp::FloorDiv, big.clone(), c(2, DType::U64))),
        Value::Int((u64::MAX / 2) as i64)
    );
    assert_eq!(
        ev(&bin(BinOp::Max, big.clone(), c(1, DType::U64))),
        Value::Int(-1)
    );
    assert_eq!(
        ev(&Expr::cast(DType::F64, big.clone())),
        Value::F64(u64::MAX as f64)
    );
    assert_eq!(ev(&Expr::cast(DType::U8, big)), Value::Int(255));
}

/// Casts: float -> int saturates, anything -> bool is `!= 0`, bool -> number is 0/1.
#[test]
fn casts() {
    let f = |v: f64, dt| Expr::constant(v, dt);
    assert_eq!(
        ev(&Expr::cast(DType::I8, f(300.0, DType::F32))),
        Value::Int(127)
    );
    assert_eq!(
        ev(&Expr::cast(DType::U8, f(-5.0, DType::F64))),
        Value::Int(0)
    );
    assert_eq!(
        ev(&Expr::cast(DType::I32, f(f64::NAN, DType::F64))),
        Value::Int(0)
    );
    assert_eq!(
        ev(&Expr::cast(DType::I64, f(-2.7, DType::F32))),
        Value::Int(-2)
    );
    assert_eq!(
        ev(&Expr::cast(DType::Bool, f(0.5, DType::F32))),
        Value::Int(1)
    );
    assert_eq!(
        ev(&Expr::cast(DType::Bool, Expr::const_int(256, DType::I32))),
        Value::Int(1)
    );
    assert_eq!(
        ev(&Expr::cast(DType::F32, Expr::bool(true))),
        Value::F32(1.0)
    );
    assert_eq!(
        ev(&Expr::cast(DType::I16, Expr::const_int(70000, DType::I32))),
        Value::Int(70000i32 as i16 as i64)
    );
    assert_eq!(
        ev(&Expr::cast(DType::F32, f(0.1, DType::F64))),
        Value::F32(0.1f32)
    );
}

/// float16/bfloat16: loaded as f32, computed in f32, rounded on store and cast.
#[test]
fn half_precision() {
    let i = Var::new("i");
    let x = input(0, "x", DType::F16, vec![Expr::int(3)]);
    let y = output(1, "y", DType::F16, vec![Expr::int(3)]);
    let k = Expr::constant(1000.0, DType::F16);
    // (x * 1000) / 1000: 60000 * 1000 overflows float16 but not the f32 intermediate.
    let body = for_(
        &i,
        Expr::int(3),
        st(
            &y,
            &[&i],
            bin(BinOp::Div, bin(BinOp::Mul, ld(&x, &[&i]), k.clone()), k),
        ),
    );
    let f = func("scale16", &[&x, &y], &[], &[], body);
    let mut xv: Vec<u16> = [60000.0f32, 1.0 / 3.0, -2.5]
        .iter()
        .map(|v| f16::from_f32(*v).to_bits())
        .collect();
    let mut yv = vec![0u16; 3];
    call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
    let back: Vec<f32> = yv.iter().map(|b| f16::from_bits(*b).to_f32()).collect();
    let want: Vec<f32> = xv
        .iter()
        .map(|b| f16::from_f32(f16::from_bits(*b).to_f32() * 1000.0 / 1000.0).to_f32())
        .collect();
    assert_eq!(back, want);
    assert_eq!(back[0], 60000.0);

    // Casts round to the dtype; constants are rounded to theirs.
    let third = Expr::cast(DType::F16, Expr::constant(1.0 / 3.0, DType::F32));
    assert_eq!(ev(&third), Value::F32(f16::from_f32(1.0f32 / 3.0).to_f32()));
    assert_eq!(
        ev(&Expr::constant(0.1, DType::BF16)),
        Value::F32(bf16::from_f64(0.1).to_f32())
    );
    assert_eq!(
        ev(&Expr::cast(DType::F16, Expr::constant(1e6, DType::F64))),
        Value::F32(f32::INFINITY)
    );

    // bfloat16 round trip through memory.
    let xb = input(0, "xb", DType::BF16, vec![Expr::int(2)]);
    let yb = output(1, "yb", DType::BF16, vec![Expr::int(2)]);
    let f = func(
        "copy_bf16",
        &[&xb, &yb],
        &[],
        &[],
        for_(&i, Expr::int(2), st(&yb, &[&i], ld(&xb, &[&i]))),
    );
    let mut xv: Vec<u16> = [3.140625f32, -0.0078125]
        .iter()
        .map(|v| bf16::from_f32(*v).to_bits())
        .collect();
    let mut yv = vec![0u16; 2];
    call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
    assert_eq!(xv, yv);
}

/// Transcendentals are libm's in the dtype; min/max propagate NaN; comparisons are IEEE.
#[test]
fn float_functions() {
    let x32 = Expr::constant(0.7, DType::F32);
    let x64 = Expr::constant(0.7, DType::F64);
    let u = |op, e: &Expr| ev(&Expr::unary(op, e.clone()).unwrap());
    assert_eq!(
        u(UnOp::Exp, &x32),
        Value::F32(crate::codegen::cpu_lib::exp32::exp32(0.7f32))
    );
    assert_eq!(u(UnOp::Exp, &x64), Value::F64(libm::exp(0.7)));
    assert_eq!(
        u(UnOp::Sigmoid, &x32),
        Value::F32(1.0 / (1.0 + crate::codegen::cpu_lib::exp32::exp32(-0.7f32)))
    );
    assert_eq!(u(UnOp::Rsqrt, &x64), Value::F64(1.0 / 0.7f64.sqrt()));
    assert_eq!(u(UnOp::Erf, &x32), Value::F32(libm::erff(0.7f32)));
    assert_eq!(u(UnOp::Tanh, &x64), Value::F64(libm::tanh(0.7)));
    assert_eq!(u(UnOp::Log, &x32), Value::F32(libm::logf(0.7f32)));
    assert_eq!(
        u(UnOp::Floor, &Expr::constant(-0.5, DType::F32)),
        Value::F32(-1.0)
    );
    assert_eq!(
        u(UnOp::Ceil, &Expr::constant(-0.5, DType::F64)),
        Value::F64(-0.0)
    );
    assert_eq!(
        ev(&bin(
            BinOp::Pow,
            x32.clone(),
            Expr::constant(2.5, DType::F32)
        )),
        Value::F32(libm::powf(0.7, 2.5))
    );
    let nan = Expr::constant(f64::NAN, DType::F32);
    let Value::F32(m) = ev(&bin(BinOp::Min, nan.clone(), x32.clone())) else {
        panic!()
    };
    assert!(m.is_nan());
    let Value::F32(m) = ev(&bin(BinOp::Max, x32.clone(), nan.clone())) else {
        panic!()
    };
    assert!(m.is_nan());
    assert_eq!(
        ev(&Expr::cmp(CmpOp::Ne, nan.clone(), nan.clone()).unwrap()),
        Value::Int(1)
    );
    assert_eq!(
        ev(&Expr::cmp(CmpOp::Ge, nan.clone(), x32).unwrap()),
        Value::Int(0)
    );
}

/// `Select` evaluates only the chosen arm and `&&` short-circuits: guarded loads past the
/// end of a buffer are never performed.
#[test]
fn select_and_logic_evaluate_lazily() {
    let i = Var::new("i");
    let x = input(0, "x", DType::F32, vec![Expr::int(2)]);
    let y = output(1, "y", DType::F32, vec![Expr::int(4)]);
    let in_bounds = Expr::var(&i).lt(&Expr::int(2));
    let guarded = Expr::select(
        in_bounds.clone(),
        ld(&x, &[&i]),
        Expr::constant(-1.0, DType::F32),
    )
    .unwrap();
    let positive = Expr::cmp(CmpOp::Gt, ld(&x, &[&i]), Expr::constant(0.0, DType::F32)).unwrap();
    let both = Expr::logic(LogicOp::And, in_bounds, positive).unwrap();
    let body = for_(
        &i,
        Expr::int(4),
        Stmt::If {
            cond: both,
            then: Box::new(st(&y, &[&i], guarded.clone())),
            otherwise: Some(Box::new(st(&y, &[&i], guarded))),
        },
    );
    let f = func("pad", &[&x, &y], &[], &[], body);
    let mut xv = vec![5.0f32, -6.0];
    let mut yv = vec![0.0f32; 4];
    call(&f, vec![p(&mut xv), p(&mut yv)], vec![1, 1]).unwrap();
    assert_eq!(yv, vec![5.0, -6.0, -1.0, -1.0]);
}

/// Out-of-bounds accesses are reported, not performed.
#[test]
fn out_of_bounds_is_an_error() {
    let n = Var::new("n");
    let i = Var::new("i");
    let x = output(0, "x", DType::I64, vec![Expr::var(&n)]);
    let body = for_(
        &i,
        Expr::var(&n).add(&Expr::int(1)),
        st(&x, &[&i], Expr::var(&i)),
    );
    let f = func("overrun", &[&x], &[], &[&n], body);
    let mut xv = vec![0i64; 4];
    let err = call(&f, vec![p(&mut xv)], vec![3, 1]).unwrap_err();
    assert!(
        matches!(&err, Error::Internal(m) if m.contains("out-of-bounds store of `x` at element offset 3")),
        "{err}"
    );
    assert_eq!(xv, vec![0, 1, 2, 0]);
    // Frame arity and failing checks are caught too.
    assert!(matches!(
        call(&f, vec![p(&mut xv)], vec![3]),
        Err(Error::Internal(_))
    ));
    let mut g = f.clone();
    g.checks.push(Check {
        cond: Expr::var(&n).lt(&Expr::int(3)),
        message: "n < 3".into(),
    });
    let err = call(&g, vec![p(&mut xv)], vec![3, 1]).unwrap_err();
    assert!(err.to_string().contains("n < 3"), "{err}");
    // A buffer of extent 0 admits no access at all (the loop still runs once here).
    let err = call(&f, vec![std::ptr::null_mut()], vec![0, 1]).unwrap_err();
    assert!(err.to_string().contains("valid offsets none"), "{err}");
}

/// Unverified IR is refused before anything runs.
#[test]
fn compile_verifies() {
    let x = output(0, "x", DType::F32, vec![Expr::int(2)]);
    let f = func(
        "bad",
        &[&x],
        &[],
        &[],
        Stmt::Store {
            buf: x.id,
            indices: vec![Expr::int(0)],
            value: Expr::constant(1.0, DType::F64),
        },
    );
    assert!(matches!(
        InterpBackend::default().compile(&f),
        Err(Error::Internal(_))
    ));
}

/// Multi-index (pre-flatten) IR runs with per-dimension bounds checks.
#[test]
fn unflattened() {
    let (i, j) = (Var::new("i"), Var::new("j"));
    let a = input(0, "A", DType::U16, vec![Expr::int(2), Expr::int(2)]);
    let b = output(1, "B", DType::U16, vec![Expr::int(2), Expr::int(2)]);
    let load = Expr::load(a.id, vec![Expr::var(&j), Expr::var(&i)], DType::U16);
    let store = Stmt::Store {
        buf: b.id,
        indices: vec![Expr::var(&i), Expr::var(&j)],
        value: load,
    };
    let f = func(
        "transpose",
        &[&a, &b],
        &[],
        &[],
        for_(&i, Expr::int(2), for_(&j, Expr::int(2), store)),
    );
    let mut av = vec![1u16, 2, 3, 4];
    let mut bv = vec![0u16; 4];
    // SAFETY: compact 2x2 buffers.
    unsafe {
        run_unflattened(
            &f,
            &CallFrame {
                ptrs: vec![p(&mut av), p(&mut bv)].into(),
                ints: vec![2, 1, 2, 1].into(),
            },
        )
    }
    .unwrap();
    assert_eq!(bv, vec![1, 3, 2, 4]);
}

/// `Let` binds an int64 visible in its body; loops start at `min`.
#[test]
fn let_and_loop_min() {
    let (i, t) = (Var::new("i"), Var::new("t"));
    let y = output(0, "y", DType::I64, vec![Expr::int(5)]);
    let body = Stmt::For {
        var: i.clone(),
        min: Expr::int(2),
        extent: Expr::int(3),
        kind: ForKind::Unrolled,
        body: Box::new(Stmt::Let {
            var: t.clone(),
            value: Expr::var(&i).mul(&Expr::int(10)),
            body: Box::new(Stmt::Store {
                buf: y.id,
                indices: vec![Expr::var(&i)],
                value: Expr::var(&t).floordiv(&Expr::int(-3)),
            }),
        }),
    };
    let f = func("lets", &[&y], &[], &[], body);
    let mut yv = vec![0i64; 5];
    call(&f, vec![p(&mut yv)], vec![1]).unwrap();
    assert_eq!(yv, vec![0, 0, -7, -10, -14]);
}
