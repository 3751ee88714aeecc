//! Builders for hand-written IR in unit tests (interpreter, verifier, Cranelift backend).

use super::expr::{BufId, Expr, Var};
use super::stmt::{BufKind, Buffer, PrimFunc, Scope, Stmt};
use rivet_runtime::DType;

/// A buffer with fresh stride variables `{name}.s{k}`.
pub fn buffer(id: u32, name: &str, dtype: DType, shape: Vec<Expr>, kind: BufKind) -> Buffer {
    let strides = (0..shape.len())
        .map(|k| Var::new(&format!("{name}.s{k}")))
        .collect();
    Buffer {
        id: BufId(id),
        name: name.into(),
        dtype,
        shape,
        strides,
        kind,
        scope: Scope::Global,
        overwritten: false,
    }
}

pub fn input(id: u32, name: &str, dtype: DType, shape: Vec<Expr>) -> Buffer {
    buffer(id, name, dtype, shape, BufKind::Param { output: false })
}

pub fn output(id: u32, name: &str, dtype: DType, shape: Vec<Expr>) -> Buffer {
    buffer(id, name, dtype, shape, BufKind::Param { output: true })
}

/// A function whose parameters are the `Param` buffers of `buffers`, in order (list them
/// before the locals, as `PrimFunc` requires).
pub fn func(name: &str, buffers: Vec<Buffer>, dims: Vec<Var>, body: Stmt) -> PrimFunc {
    let params = buffers
        .iter()
        .filter(|b| matches!(b.kind, BufKind::Param { .. }))
        .map(|b| b.id)
        .collect();
    PrimFunc {
        name: name.into(),
        params,
        buffers,
        dims,
        checks: vec![],
        body,
        kernels: vec![],
        callbacks: vec![],
    }
}

/// `for v in [0, extent)` of `kind` over `body(v)`, with a fresh variable named `name`.
pub fn loop_over(
    name: &str,
    extent: Expr,
    kind: super::stmt::ForKind,
    body: impl FnOnce(&Expr) -> Stmt,
) -> Stmt {
    let v = Var::new(name);
    let e = Expr::var(&v);
    Stmt::For {
        var: v,
        min: Expr::int(0),
        extent,
        kind,
        body: Box::new(body(&e)),
    }
}

/// `buf[indices] = value`.
pub fn store(buf: BufId, indices: Vec<Expr>, value: Expr) -> Stmt {
    Stmt::Store {
        buf,
        indices,
        value,
    }
}

/// `C = A @ B` (float32) for ragged M x K x N (dims `m`, `k`, `n`) with 8 x 8 tiles staged in
/// shared memory, a per-thread accumulator in local memory, two barriers per k-tile and an
/// unrolled inner loop: the GPU kernel the interpreter's GPU tests run and the CUDA backend's
/// tests generate (as written, not lowered).
pub fn tiled_matmul() -> PrimFunc {
    use super::expr::{BinOp, CmpOp, LogicOp};
    use super::stmt::{ForKind, ThreadTag};
    const T: i64 = 8;
    const F: DType = DType::F32;
    let int = Expr::int;
    let v = Expr::var;
    let for_ = |x: &Var, extent: Expr, kind: ForKind, body: Stmt| Stmt::For {
        var: x.clone(),
        min: int(0),
        extent,
        kind,
        body: Box::new(body),
    };
    let bound = |x: &Var, extent: Expr, tag: ThreadTag, body: Stmt| {
        for_(x, extent, ForKind::Thread(tag), body)
    };
    let ld = |b: &Buffer, idx: Vec<Expr>| Expr::load(b.id, idx, b.dtype);
    let st = |b: &Buffer, idx: Vec<Expr>, value: Expr| store(b.id, idx, value);
    let lt = |a: Expr, b: Expr| Expr::cmp(CmpOp::Lt, a, b).unwrap();
    let and = |a: Expr, b: Expr| Expr::logic(LogicOp::And, a, b).unwrap();
    let bin = |op: BinOp, a: Expr, b: Expr| Expr::binary(op, a, b).unwrap();
    let alloc = |b: &Buffer, body: Stmt| Stmt::Allocate {
        bufs: vec![b.id],
        body: Box::new(body),
    };
    let local = |id: u32, name: &str, shape: &[i64], scope: Scope| Buffer {
        scope,
        ..buffer(
            id,
            name,
            F,
            shape.iter().map(|&n| int(n)).collect(),
            BufKind::Local,
        )
    };
    let ceil_div = |n: Expr| n.add(&int(T - 1)).floordiv(&int(T));

    let (m, k, n) = (Var::new("m"), Var::new("k"), Var::new("n"));
    let (by, bx, ty, tx, kt, kk) = (
        Var::new("by"),
        Var::new("bx"),
        Var::new("ty"),
        Var::new("tx"),
        Var::new("kt"),
        Var::new("kk"),
    );
    let a = input(0, "A", F, vec![v(&m), v(&k)]);
    let b = input(1, "B", F, vec![v(&k), v(&n)]);
    let c = output(2, "C", F, vec![v(&m), v(&n)]);
    let sa = local(3, "As", &[T, T], Scope::Shared);
    let sb = local(4, "Bs", &[T, T], Scope::Shared);
    let acc = local(5, "acc", &[1], Scope::Local);
    let row = v(&by).mul(&int(T)).add(&v(&ty));
    let col = v(&bx).mul(&int(T)).add(&v(&tx));
    let ka = v(&kt).mul(&int(T)).add(&v(&tx));
    let kb = v(&kt).mul(&int(T)).add(&v(&ty));
    let zero = Expr::constant(0.0, F);
    let load_a = Expr::select(
        and(lt(row.clone(), v(&m)), lt(ka.clone(), v(&k))),
        ld(&a, vec![row.clone(), ka]),
        zero.clone(),
    )
    .unwrap();
    let load_b = Expr::select(
        and(lt(kb.clone(), v(&k)), lt(col.clone(), v(&n))),
        ld(&b, vec![kb, col.clone()]),
        zero.clone(),
    )
    .unwrap();
    let step = Stmt::Seq(vec![
        st(&sa, vec![v(&ty), v(&tx)], load_a),
        st(&sb, vec![v(&ty), v(&tx)], load_b),
        Stmt::Barrier,
        for_(
            &kk,
            int(T),
            ForKind::Unrolled,
            st(
                &acc,
                vec![int(0)],
                bin(
                    BinOp::Add,
                    ld(&acc, vec![int(0)]),
                    bin(
                        BinOp::Mul,
                        ld(&sa, vec![v(&ty), v(&kk)]),
                        ld(&sb, vec![v(&kk), v(&tx)]),
                    ),
                ),
            ),
        ),
        Stmt::Barrier,
    ]);
    let thread = alloc(
        &acc,
        Stmt::Seq(vec![
            st(&acc, vec![int(0)], zero),
            for_(&kt, ceil_div(v(&k)), ForKind::Serial, step),
            Stmt::If {
                cond: and(lt(row.clone(), v(&m)), lt(col.clone(), v(&n))),
                then: Box::new(st(&c, vec![row, col], ld(&acc, vec![int(0)]))),
                otherwise: None,
            },
        ]),
    );
    let body = bound(
        &by,
        ceil_div(v(&m)),
        ThreadTag::BlockY,
        bound(
            &bx,
            ceil_div(v(&n)),
            ThreadTag::BlockX,
            alloc(
                &sa,
                alloc(
                    &sb,
                    bound(
                        &ty,
                        int(T),
                        ThreadTag::ThreadY,
                        bound(&tx, int(T), ThreadTag::ThreadX, thread),
                    ),
                ),
            ),
        ),
    );
    func("mm", vec![a, b, c, sa, sb, acc], vec![m, k, n], body)
}
