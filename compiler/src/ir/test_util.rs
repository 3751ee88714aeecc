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
