//! CUDA C of statements, with the interpreter's meaning (`codegen::interp`):
//! - a block loop binds `blockIdx.*`, a thread loop `threadIdx.*` (the verifier guarantees
//!   min 0 and, for threads, one constant extent per tag: the launch's block size; the grid is
//!   the block loops' extents, evaluated on the host);
//! - serial, vectorized and unrolled loops are `for` loops (`#pragma unroll` for unrolled;
//!   vectorized loops are plain loops for now);
//! - `shared` buffers are `__shared__ T name[N]` (not zeroed: the interpreter zeroes them, so a
//!   program reading shared memory before writing it is wrong on both, differently); `local`
//!   buffers are `T name[N] = {}` (zeroed, as the interpreter's); global temporaries are
//!   allocated (zeroed) by the host part around the launches that use them and passed as
//!   plain pointers;
//! - `Barrier` is `__syncthreads()`;
//! - `AllReduce` (cross-thread reduction over threadIdx.x) is a call of the prelude's
//!   `rivet_allreduce_x`: `__shfl_down_sync` trees within warps, then a `__shared__` scratch
//!   (one element per warp share of a group) and `__syncthreads` across warps, in the
//!   interpreter's order (`codegen::interp::gpu::allreduce_group`);

use super::expr::{binary, stored, strip_parens};
use super::types::{storage_type, value_type};
use super::{call_refused, unsupported, KernelGen};
use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, BufId, Expr, ReduceOp, Var};
use crate::ir::stmt::{ForKind, Scope, Stmt, ThreadTag};
use rivet_runtime::DType;

impl KernelGen<'_> {
    /// The declaration of local `buf` (shared or per-thread, constant shape) at the top of
    /// the block of the `Allocate` whose body is `body`, and its stride constants that `body`
    /// uses.
    fn declare_local(&mut self, buf: BufId, body: &Stmt) -> Result<()> {
        let b = self.func.buffer(buf).clone();
        let shape: Option<Vec<i64>> = b.shape.iter().map(|e| e.as_int()).collect();
        let shape = match (b.scope, shape) {
            (Scope::Global, _) => {
                return Err(unsupported(
                    self.func,
                    format!("the global-memory temporary '{}' inside a kernel", b.name),
                ))
            }
            (_, Some(s)) if s.iter().all(|&n| n >= 0) => s,
            _ => {
                return Err(Error::Internal(format!(
                    "CUDA codegen, function `{}`: {:?} buffer '{}' without a constant shape",
                    self.func.name, b.scope, b.name
                )))
            }
        };
        let numel = shape
            .iter()
            .try_fold(1i64, |a, &n| a.checked_mul(n))
            .filter(|&n| n <= i32::MAX as i64)
            .ok_or_else(|| {
                Error::Compile(format!(
                    "target 'cuda': the {:?} buffer '{}' of shape {shape:?} is too large",
                    b.scope, b.name
                ))
            })?;
        let c = self.unique(&b.name);
        self.bufs.insert(b.id, c.clone());
        let ty = storage_type(b.dtype);
        let dims: Vec<String> = shape.iter().map(|n| n.to_string()).collect();
        // C++ has no zero-length arrays: an empty buffer gets one unused element.
        let n = numel.max(1);
        if b.scope == Scope::Shared {
            self.shared_bytes += n as u64 * b.dtype.size() as u64;
            self.line(&format!(
                "__shared__ {ty} {c}[{n}]; // stage {}: shared [{}]",
                b.name,
                dims.join(", ")
            ));
        } else {
            self.line(&format!(
                "{ty} {c}[{n}] = {{}}; // stage {}: local [{}]",
                b.name,
                dims.join(", ")
            ));
        }
        // Compact row-major strides, as `Allocate` binds them.
        let mut stride = 1i64;
        let mut strides = vec![0i64; shape.len()];
        for k in (0..shape.len()).rev() {
            strides[k] = stride;
            stride = stride.saturating_mul(shape[k]);
        }
        for (v, s) in b.strides.iter().zip(&strides) {
            if stmt_uses(body, v) {
                let sc = self.bind_var(v);
                self.nonneg.insert(v.id);
                let t = self.var_ty(v);
                self.line(&format!("const {t} {sc} = {s};"));
            }
        }
        Ok(())
    }

    pub(super) fn stmt(&mut self, s: &Stmt) -> Result<()> {
        match s {
            Stmt::Seq(v) => v.iter().try_for_each(|s| self.stmt(s)),
            Stmt::Call { intrin, .. } => Err(call_refused(*intrin)),
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => match kind {
                ForKind::Thread(tag) => {
                    let used = stmt_uses(body, var);
                    self.line(&format!("{{ // {} bound to {}", var.name, tag.name()));
                    self.indent += 1;
                    if used {
                        let c = self.bind_var(var);
                        self.nonneg.insert(var.id);
                        let t = self.var_ty(var);
                        self.line(&format!("const {t} {c} = ({t}){};", thread_reg(*tag)));
                    }
                    self.stmt(body)?;
                    self.indent -= 1;
                    self.line("}");
                    Ok(())
                }
                ForKind::Parallel => Err(Error::Internal(format!(
                    "CUDA codegen, function `{}`: a parallel loop inside a kernel",
                    self.func.name
                ))),
                ForKind::Serial | ForKind::Unrolled | ForKind::Vectorized => {
                    let lo = self.index_expr(min)?;
                    let n = self.index_expr(extent)?;
                    let c = self.bind_var(var);
                    if self.nonneg_expr(min) {
                        self.nonneg.insert(var.id);
                    }
                    if *kind == ForKind::Unrolled {
                        self.line("#pragma unroll");
                    }
                    let note = if *kind == ForKind::Vectorized {
                        " // vectorized in the IR: a plain loop for now"
                    } else {
                        ""
                    };
                    let t = self.var_ty(var);
                    if min.as_int() == Some(0) {
                        self.line(&format!("for ({t} {c} = 0; {c} < {n}; ++{c}) {{{note}"));
                    } else {
                        self.line(&format!(
                            "for ({t} {c} = {lo}; {c} < {lo} + {n}; ++{c}) {{{note}"
                        ));
                    }
                    self.indent += 1;
                    self.stmt(body)?;
                    self.indent -= 1;
                    self.line("}");
                    Ok(())
                }
            },
            Stmt::Store {
                buf,
                indices,
                value,
            } if value.is_vector() => self.vector_store(*buf, indices, value),
            Stmt::Store {
                buf,
                indices,
                value,
            } => {
                let b = self.func.buffer(*buf);
                let dt = b.dtype;
                let name = self.buf(*buf)?;
                let idx = self.offset(indices)?;
                let v = self.expr(value, false)?;
                self.line(&format!("{name}[{idx}] = {};", stored(dt, v)));
                Ok(())
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let c = self.expr(cond, false)?;
                self.line(&format!("if ({}) {{", strip_parens(&c)));
                self.indent += 1;
                self.stmt(then)?;
                self.indent -= 1;
                if let Some(o) = otherwise {
                    self.line("} else {");
                    self.indent += 1;
                    self.stmt(o)?;
                    self.indent -= 1;
                }
                self.line("}");
                Ok(())
            }
            Stmt::Let { var, value, body } => {
                if !stmt_uses(body, var) {
                    return self.stmt(body);
                }
                let v = self.index_expr(value)?;
                self.line("{");
                self.indent += 1;
                let c = self.bind_var(var);
                if self.nonneg_expr(value) {
                    self.nonneg.insert(var.id);
                }
                let t = self.var_ty(var);
                self.line(&format!("const {t} {c} = {};", strip_parens(&v)));
                self.stmt(body)?;
                self.indent -= 1;
                self.line("}");
                Ok(())
            }
            Stmt::Allocate { bufs, body } => {
                self.line("{");
                self.indent += 1;
                for buf in bufs {
                    self.declare_local(*buf, body)?;
                }
                self.stmt(body)?;
                self.indent -= 1;
                self.line("}");
                Ok(())
            }
            Stmt::Barrier => {
                self.line("__syncthreads();");
                Ok(())
            }
            Stmt::AllReduce {
                op,
                tag,
                value,
                dst,
            } => self.allreduce(*op, *tag, value, *dst),
            Stmt::Launch { .. } => Err(Error::Internal(format!(
                "CUDA codegen, function `{}`: a launch inside a kernel",
                self.func.name
            ))),
        }
    }

    /// A cross-thread reduction: `rivet_allreduce_x` of the prelude (warp shuffles, then shared
    /// memory across warps), with the combination as a lambda of the operator's usual text
    /// and a `__shared__` scratch of one element per warp share of each group when a group
    /// spans several warps. The verifier guarantees the tag is threadIdx.x, that every thread
    /// of the block gets here, and a power-of-two x extent when there are several groups.
    fn allreduce(&mut self, op: ReduceOp, tag: ThreadTag, value: &Expr, dst: BufId) -> Result<()> {
        if tag != ThreadTag::ThreadX {
            return Err(Error::Internal(format!(
                "CUDA codegen, function `{}`: cross-thread reduction over {}",
                self.func.name,
                tag.name()
            )));
        }
        let dt = value.dtype();
        let ty = value_type(dt);
        let [nx, ny, nz] = self.block;
        let runs = nx.div_ceil(32) as u64;
        let groups = ny as u64 * nz as u64;
        let bop = match op {
            ReduceOp::Sum => BinOp::Add,
            ReduceOp::Prod => BinOp::Mul,
            ReduceOp::Max => BinOp::Max,
            ReduceOp::Min => BinOp::Min,
        };
        let combine = binary(bop, dt, "rivet_a", "rivet_b", false);
        let v = self.expr(value, false)?;
        let name = self.buf(dst)?;
        let what = format!("{op:?}").to_lowercase();
        self.line(&format!(
            "{{ // allreduce {what} over threadIdx.x: {nx} threads in each of {groups} groups"
        ));
        self.indent += 1;
        let scratch = if runs > 1 {
            let s = self.unique(&format!("{name}_red"));
            // Shared values are held as the register type (float16 as float).
            let bytes = match dt {
                DType::F16 | DType::BF16 => 4,
                other => other.size() as u64,
            };
            self.shared_bytes += runs * groups * bytes;
            self.line(&format!("__shared__ {ty} {s}[{}];", runs * groups));
            s
        } else {
            format!("({ty}*)0")
        };
        let r = format!(
            "rivet_allreduce_x<{ty}>({v}, []({ty} rivet_a, {ty} rivet_b) -> {ty} {{ return {}; }}, {scratch}, {nx}, {ny}, {})",
            strip_parens(&combine),
            nx as u64 * groups
        );
        self.line(&format!("{name}[0] = {};", stored(dt, r)));
        self.indent -= 1;
        self.line("}");
        Ok(())
    }
}

/// The CUDA register a bound loop's variable is.
fn thread_reg(tag: ThreadTag) -> &'static str {
    tag.name()
}

/// True when `v` is read anywhere in `s`.
pub fn stmt_uses(s: &Stmt, v: &Var) -> bool {
    let mut found = false;
    s.visit_exprs(&mut |e| {
        if !found {
            found = e.uses(v);
        }
    });
    found
}
