//! The IR as text: one statement per line, indented by nesting, expressions in infix form
//! with explicit parentheses. Variables print as `name` (ids are not printed, so the text of
//! a function is stable across runs and fit for golden files); buffers print by name.

use super::expr::{BinOp, CmpOp, Const, Expr, ExprKind, LogicOp, ReduceOp, UnOp};
use super::stmt::{BufKind, DeviceFunc, ForKind, PrimFunc, Scope, Stmt};
use std::fmt::{self, Write};

fn bin(op: BinOp) -> &'static str {
    match op {
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        BinOp::FloorDiv => "//",
        BinOp::FloorMod => "%",
        BinOp::Min => "min",
        BinOp::Max => "max",
        BinOp::Pow => "pow",
    }
}

fn cmp(op: CmpOp) -> &'static str {
    match op {
        CmpOp::Eq => "==",
        CmpOp::Ne => "!=",
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
    }
}

fn un(op: UnOp) -> &'static str {
    match op {
        UnOp::Neg => "-",
        UnOp::Not => "!",
        UnOp::Exp => "exp",
        UnOp::Log => "log",
        UnOp::Sqrt => "sqrt",
        UnOp::Rsqrt => "rsqrt",
        UnOp::Tanh => "tanh",
        UnOp::Sigmoid => "sigmoid",
        UnOp::Abs => "abs",
        UnOp::Floor => "floor",
        UnOp::Ceil => "ceil",
        UnOp::Erf => "erf",
    }
}

fn red(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Prod => "prod",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
    }
}

thread_local! {
    /// Buffer names for `Load`/`Store`; without a function, buffers print as `buf<N>`.
    static NAMES: std::cell::RefCell<Vec<(u32, String)>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Outlined bodies, printed in place of their `Launch`.
    static KERNELS: std::cell::RefCell<Vec<DeviceFunc>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn buf_name(id: u32) -> String {
    NAMES
        .with(|n| {
            n.borrow()
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, s)| s.clone())
        })
        .unwrap_or_else(|| format!("buf{id}"))
}

fn list(f: &mut fmt::Formatter<'_>, items: &[Expr]) -> fmt::Result {
    for (i, e) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        fmt_expr(e, f)?;
    }
    Ok(())
}

pub fn fmt_expr(e: &Expr, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match e.kind() {
        ExprKind::Const(Const::Int(v)) => match e.dtype() {
            rivet_runtime::DType::I64 => write!(f, "{v}"),
            rivet_runtime::DType::Bool => write!(f, "{}", *v != 0),
            dt => write!(f, "{v}:{dt}"),
        },
        ExprKind::Const(Const::Float(v)) => write!(f, "{v:?}:{}", e.dtype()),
        ExprKind::Var(v) => f.write_str(&v.name),
        ExprKind::Unary(UnOp::Neg, a) => write!(f, "(-{a})"),
        ExprKind::Unary(UnOp::Not, a) => write!(f, "(!{a})"),
        ExprKind::Unary(op, a) => write!(f, "{}({a})", un(*op)),
        ExprKind::Binary(op @ (BinOp::Min | BinOp::Max | BinOp::Pow), a, b) => {
            write!(f, "{}({a}, {b})", bin(*op))
        }
        ExprKind::Binary(op, a, b) => write!(f, "({a} {} {b})", bin(*op)),
        ExprKind::Cmp(op, a, b) => write!(f, "({a} {} {b})", cmp(*op)),
        ExprKind::Logic(LogicOp::And, a, b) => write!(f, "({a} && {b})"),
        ExprKind::Logic(LogicOp::Or, a, b) => write!(f, "({a} || {b})"),
        ExprKind::Cast(a) => write!(f, "{}({a})", e.dtype()),
        ExprKind::Select(c, a, b) => write!(f, "select({c}, {a}, {b})"),
        ExprKind::Fma(a, b, c) => write!(f, "fma({a}, {b}, {c})"),
        ExprKind::Invalid(m) => write!(f, "<invalid: {m}>"),
        ExprKind::Ramp {
            base,
            stride,
            lanes,
        } => write!(f, "ramp({base}, {stride}, {lanes})"),
        ExprKind::Broadcast { value, lanes } => write!(f, "broadcast({value}, {lanes})"),
        ExprKind::Read { tensor, indices } => {
            write!(f, "{}[", tensor.name())?;
            list(f, indices)?;
            f.write_str("]")
        }
        ExprKind::Reduce { op, body, axes } => {
            write!(f, "{}({body}, axis=[", red(*op))?;
            for (i, a) in axes.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{} in [{}, {} + {})", a.var.name, a.min, a.min, a.extent)?;
            }
            f.write_str("])")
        }
        ExprKind::Load { buf, indices } => {
            write!(f, "{}[", buf_name(buf.0))?;
            list(f, indices)?;
            f.write_str("]")
        }
    }
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

fn stmt(out: &mut String, s: &Stmt, depth: usize) {
    match s {
        Stmt::For {
            var,
            min,
            extent,
            kind,
            body,
        } => {
            indent(out, depth);
            let k = match kind {
                ForKind::Serial => "for",
                ForKind::Parallel => "parallel for",
                ForKind::Vectorized => "vectorized for",
                ForKind::Unrolled => "unrolled for",
                ForKind::Thread(_) => "for",
            };
            if let ForKind::Thread(tag) = kind {
                let _ = writeln!(
                    out,
                    "{k} {} in [{min}, {extent}) bind {}:",
                    var.name,
                    tag.name()
                );
            } else if min.as_int() == Some(0) {
                let _ = writeln!(out, "{k} {} in [0, {extent}):", var.name);
            } else {
                let _ = writeln!(out, "{k} {} in [{min}, {min} + {extent}):", var.name);
            }
            stmt(out, body, depth + 1);
        }
        Stmt::Store {
            buf,
            indices,
            value,
        } => {
            indent(out, depth);
            let idx: Vec<String> = indices.iter().map(|i| i.to_string()).collect();
            let _ = writeln!(out, "{}[{}] = {value}", buf_name(buf.0), idx.join(", "));
        }
        Stmt::If {
            cond,
            then,
            otherwise,
        } => {
            indent(out, depth);
            let _ = writeln!(out, "if {cond}:");
            stmt(out, then, depth + 1);
            if let Some(o) = otherwise {
                indent(out, depth);
                out.push_str("else:\n");
                stmt(out, o, depth + 1);
            }
        }
        Stmt::Let { var, value, body } => {
            indent(out, depth);
            let _ = writeln!(out, "let {} = {value}", var.name);
            stmt(out, body, depth);
        }
        Stmt::Allocate { bufs, body } => {
            indent(out, depth);
            let names: Vec<String> = bufs.iter().map(|b| buf_name(b.0)).collect();
            let _ = writeln!(out, "allocate {}", names.join(", "));
            stmt(out, body, depth + 1);
        }
        Stmt::Seq(v) => v.iter().for_each(|s| stmt(out, s, depth)),
        Stmt::Barrier => {
            indent(out, depth);
            out.push_str("barrier\n");
        }
        Stmt::AllReduce {
            op,
            tag,
            value,
            dst,
        } => {
            indent(out, depth);
            let _ = writeln!(
                out,
                "{}[0] = allreduce {} over {} of {value}",
                buf_name(dst.0),
                red(*op),
                tag.name()
            );
        }
        Stmt::Call {
            intrin,
            regions,
            scalars,
        } => {
            indent(out, depth);
            let rs: Vec<String> = regions
                .iter()
                .map(|r| {
                    let base: Vec<String> = r.base.iter().map(|e| e.to_string()).collect();
                    let axes: Vec<String> = r
                        .axes
                        .iter()
                        .map(|a| format!("dim{}:{}", a.dim, a.extent))
                        .collect();
                    format!(
                        "{}{}[{}; {}]",
                        if r.write { "out " } else { "" },
                        buf_name(r.buf.0),
                        base.join(", "),
                        axes.join(", ")
                    )
                })
                .chain(scalars.iter().map(|e| e.to_string()))
                .collect();
            let name = match intrin {
                // Which entry of the function's callback table.
                crate::ir::Intrin::Callback(k) => format!("callback#{k}"),
                other => other.name().to_string(),
            };
            let _ = writeln!(out, "call {name}({})", rs.join(", "));
        }
        Stmt::Launch { kernel } => {
            indent(out, depth);
            let k = KERNELS.with(|k| k.borrow().get(*kernel).cloned());
            match k {
                Some(k) => {
                    let bufs: Vec<String> = k.bufs.iter().map(|b| buf_name(b.0)).collect();
                    let vars: Vec<&str> = k.vars.iter().map(|v| &*v.name).collect();
                    let _ = writeln!(
                        out,
                        "launch {}({}; {}):",
                        k.name,
                        bufs.join(", "),
                        vars.join(", ")
                    );
                    stmt(out, &k.body, depth + 1);
                }
                None => {
                    let _ = writeln!(out, "launch kernel {kernel}");
                }
            }
        }
    }
}

/// The text of a statement, with `f`'s buffer names.
pub fn stmt_to_string(f: Option<&PrimFunc>, s: &Stmt) -> String {
    with_names(f, || {
        let mut out = String::new();
        stmt(&mut out, s, 0);
        out
    })
}

fn with_names<R>(f: Option<&PrimFunc>, body: impl FnOnce() -> R) -> R {
    let names: Vec<(u32, String)> = f
        .map(|f| f.buffers.iter().map(|b| (b.id.0, b.name.clone())).collect())
        .unwrap_or_default();
    let kernels = f.map(|f| f.kernels.clone()).unwrap_or_default();
    let saved = NAMES.with(|n| std::mem::replace(&mut *n.borrow_mut(), names));
    let saved_k = KERNELS.with(|k| std::mem::replace(&mut *k.borrow_mut(), kernels));
    let r = body();
    NAMES.with(|n| *n.borrow_mut() = saved);
    KERNELS.with(|k| *k.borrow_mut() = saved_k);
    r
}

impl fmt::Display for PrimFunc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = with_names(Some(self), || {
            let mut out = String::new();
            let params: Vec<String> = self
                .params
                .iter()
                .map(|id| {
                    let b = self.buffer(*id);
                    let shape: Vec<String> = b.shape.iter().map(|e| e.to_string()).collect();
                    let out_mark = if b.kind == (BufKind::Param { output: true }) {
                        " (out)"
                    } else {
                        ""
                    };
                    format!("{}: {}[{}]{out_mark}", b.name, b.dtype, shape.join(", "))
                })
                .collect();
            let _ = writeln!(out, "func {}({}):", self.name, params.join(", "));
            if !self.dims.is_empty() {
                let dims: Vec<&str> = self.dims.iter().map(|v| &*v.name).collect();
                let _ = writeln!(out, "  dims: {}", dims.join(", "));
            }
            for b in &self.buffers {
                if b.kind == BufKind::Local {
                    let shape: Vec<String> = b.shape.iter().map(|e| e.to_string()).collect();
                    let scope = match b.scope {
                        Scope::Global => "",
                        Scope::Shared => " shared",
                        Scope::Local => " local",
                    };
                    // `lower::overwrite`'s mark: allocated without zeroing.
                    let filled = if b.overwritten {
                        " (stored before read)"
                    } else {
                        ""
                    };
                    let _ = writeln!(
                        out,
                        "  local {}: {}[{}]{scope}{filled}",
                        b.name,
                        b.dtype,
                        shape.join(", ")
                    );
                }
            }
            for c in &self.checks {
                let _ = writeln!(out, "  check {}  # {}", c.cond, c.message);
            }
            stmt(&mut out, &self.body, 1);
            out
        });
        f.write_str(&text)
    }
}
