//! CUDA C of expressions, with the interpreter's meaning (`codegen::interp`):
//! - index arithmetic (the int64 nodes of load/store indices, loop bounds, `let` values and
//!   the operands of int64 comparisons that read no memory) is plain signed arithmetic (and
//!   floor division of a provably non-negative index by a positive constant is C's `/`). In
//!   the 64-bit kernel it is `long long`: the bounds proof (`lower::bounds`) obliges each of
//!   those nodes to stay inside int64, so it never wraps. In the 32-bit kernel (`<name>_i32`)
//!   it is `int`, including the kernel's int parameters: `idx32` bounds every index node
//!   and the kernel exists only where the bounds can fit int32; the host launches it only
//!   for calls whose values put every bound inside int32 (`KernelInfo::entry`). All other
//!   integer arithmetic wraps at its dtype's width without C++ undefined behaviour (computed
//!   unsigned, converted back), in both kernels.
//! - float16 / bfloat16 are stored as 16-bit patterns and computed in float32, rounded only
//!   by stores, casts and constants; bool is stored as one byte and loaded as `!= 0`.
//! - `Select` is `c ? a : b` and `&&`/`||` short-circuit: only the chosen arm is evaluated.
//! - math: CUDA's `expf`, `logf`, `tanhf`, `erff`, `powf` (and the double versions) stand for
//!   musl's; their ulp differences are unmeasured (no GPU yet). `sqrt` and `/` are IEEE
//!   (NVRTC's defaults `-prec-sqrt=true -prec-div=true`), `rsqrt` is `1 / sqrtf(x)`.

use super::types::{is_int, storage_type, unsigned_type, value_type};
use super::KernelGen;
use crate::codegen::interp::{eval_expr, Value};
use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, CmpOp, Expr, ExprKind, LogicOp, UnOp};
use rivet_runtime::DType;

impl KernelGen<'_> {
    /// The element offset of a flattened access.
    pub(super) fn offset(&mut self, indices: &[Expr]) -> Result<String> {
        match indices {
            [i] => Ok(strip_parens(&self.index_expr(i)?).to_string()),
            _ => Err(Error::Compile(format!(
                "target 'cuda': function '{}': checked mode (unflattened accesses) is not supported by the CUDA backend yet",
                self.func.name
            ))),
        }
    }

    /// Whether the int64 index expression `e` is never negative (a sound, simple check: no
    /// overflow, as the bounds proof guarantees for index arithmetic).
    pub(super) fn nonneg_expr(&self, e: &Expr) -> bool {
        if e.dtype() != DType::I64 {
            return false;
        }
        match e.kind() {
            ExprKind::Const(_) => e.as_int().is_some_and(|v| v >= 0),
            ExprKind::Var(v) => self.nonneg.contains(&v.id),
            ExprKind::Binary(BinOp::Add | BinOp::Mul | BinOp::Min | BinOp::Max, a, b) => {
                self.nonneg_expr(a) && self.nonneg_expr(b)
            }
            ExprKind::Binary(BinOp::FloorDiv | BinOp::FloorMod, a, b) => {
                self.nonneg_expr(a) && b.as_int().is_some_and(|d| d > 0)
            }
            ExprKind::Select(_, a, b) => self.nonneg_expr(a) && self.nonneg_expr(b),
            _ => false,
        }
    }

    /// An int64 index expression (see the module documentation: plain signed arithmetic).
    pub(super) fn index_expr(&mut self, e: &Expr) -> Result<String> {
        self.expr(e, true)
    }

    /// The C expression of `e` (fully parenthesised). `index`: the node belongs to an
    /// index computation the bounds proof covers.
    pub(super) fn expr(&mut self, e: &Expr, index: bool) -> Result<String> {
        let dt = e.dtype();
        let index = index && dt == DType::I64;
        // The 32-bit variant computes index nodes as int32 (`idx32` proved every one in
        // range, so the int32 rules below never wrap or overflow).
        // In the 64-bit variant, nodes whose values fit int32 for every call are int too, and
        // a 64-bit node converts its int operands first (an int product could overflow).
        let narrow = index && self.narrow_node(e);
        let edt = if index && (self.idx32 || narrow) {
            DType::I32
        } else {
            dt
        };
        Ok(match e.kind() {
            ExprKind::Const(_) if edt != dt => int_lit(e.as_int().unwrap_or(0), edt),
            ExprKind::Const(_) => constant(e)?,
            ExprKind::Var(v) => self.var(v)?,
            ExprKind::Load { buf, indices } => {
                let name = self.buf(*buf)?;
                let idx = self.offset(indices)?;
                match dt {
                    DType::F16 => format!("rivet_f16_to_f32({name}[{idx}])"),
                    DType::BF16 => format!("rivet_bf16_to_f32({name}[{idx}])"),
                    DType::Bool => format!("({name}[{idx}] != 0)"),
                    _ => format!("{name}[{idx}]"),
                }
            }
            ExprKind::Unary(op, a) => {
                let x = self.expr(a, index)?;
                unary(*op, edt, &x)
            }
            ExprKind::Binary(op, a, b) => {
                let mut x = self.expr(a, index)?;
                let mut y = self.expr(b, index)?;
                if index && !self.idx32 && !narrow {
                    for (t, c) in [(&mut x, a), (&mut y, b)] {
                        if self.narrow_node(c) {
                            *t = if c.as_int().is_some() {
                                constant(c)?
                            } else {
                                format!("((long long){t})")
                            };
                        }
                    }
                }
                // Index floor division of a non-negative value by a positive constant: C's
                // truncating `/` and `%` agree with floor semantics there.
                if index
                    && matches!(op, BinOp::FloorDiv | BinOp::FloorMod)
                    && b.as_int().is_some_and(|d| d > 0)
                    && self.nonneg_expr(a)
                {
                    let o = if *op == BinOp::FloorDiv { "/" } else { "%" };
                    return Ok(format!("({x} {o} {y})"));
                }
                binary(*op, edt, &x, &y, index)
            }
            ExprKind::Cmp(op, a, b) => {
                // Int64 comparisons of index arithmetic (no loads): the proof keeps their
                // operands inside int64, as it does indices.
                let idx = !has_load(a) && !has_load(b);
                let x = self.expr(a, idx)?;
                let y = self.expr(b, idx)?;
                let o = match op {
                    CmpOp::Eq => "==",
                    CmpOp::Ne => "!=",
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                    CmpOp::Gt => ">",
                    CmpOp::Ge => ">=",
                };
                format!("({x} {o} {y})")
            }
            ExprKind::Logic(op, a, b) => {
                let x = self.expr(a, false)?;
                let y = self.expr(b, false)?;
                let o = match op {
                    LogicOp::And => "&&",
                    LogicOp::Or => "||",
                };
                format!("({x} {o} {y})")
            }
            ExprKind::Cast(a) => {
                let x = self.expr(a, false)?;
                cast(a.dtype(), dt, &x)
            }
            ExprKind::Fma(a, b, c) => {
                let x = self.expr(a, false)?;
                let y = self.expr(b, false)?;
                let z = self.expr(c, false)?;
                // One rounding, as the interpreter's `mul_add` (float16/bfloat16 are floats
                // here too); `--fmad=false` keeps every other `a * b + c` unfused.
                match dt {
                    DType::F64 => format!("RIVET_FMA({x}, {y}, {z})"),
                    _ if dt.is_float() => format!("RIVET_FMAF({x}, {y}, {z})"),
                    _ => {
                        return Err(Error::Internal(format!(
                            "CUDA codegen, function `{}`: fma on {dt}",
                            self.func.name
                        )))
                    }
                }
            }
            ExprKind::Select(c, a, b) => {
                let c = self.expr(c, false)?;
                let x = self.expr(a, index)?;
                let y = self.expr(b, index)?;
                format!("({c} ? {x} : {y})")
            }
            ExprKind::Read { .. } | ExprKind::Reduce { .. } | ExprKind::Invalid(_) => {
                return Err(Error::Internal(format!(
                    "CUDA codegen, function `{}`: te-only node in loop IR: `{e}`",
                    self.func.name
                )))
            }
            // The CUDA target does not vectorize yet (`Target::vectorize_bytes`).
            ExprKind::Ramp { .. } | ExprKind::Broadcast { .. } => {
                return Err(Error::Internal(format!(
                    "CUDA codegen, function `{}`: vector IR is not supported by the CUDA backend yet: `{e}`",
                    self.func.name
                )))
            }
        })
    }
}

/// The C text storing value text `v` of dtype `dt` into an element.
pub(super) fn stored(dt: DType, v: String) -> String {
    match dt {
        DType::F16 => format!("rivet_f32_to_f16({v})"),
        DType::BF16 => format!("rivet_f32_to_bf16({v})"),
        DType::Bool => format!("(unsigned char)({v})"),
        _ => v,
    }
}

/// True when evaluating `e` reads memory.
fn has_load(e: &Expr) -> bool {
    let mut found = false;
    e.visit_unique(&mut |n| found |= matches!(n.kind(), ExprKind::Load { .. }));
    found
}

/// `(x)` -> `x` when the outer parentheses enclose the whole text.
pub(super) fn strip_parens(s: &str) -> &str {
    let b = s.as_bytes();
    if b.len() < 2 || b[0] != b'(' || b[b.len() - 1] != b')' {
        return s;
    }
    let mut depth = 0i32;
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 && i != b.len() - 1 {
                    return s;
                }
            }
            _ => {}
        }
    }
    &s[1..s.len() - 1]
}

/// A float32 literal for `x` (exact: Rust's shortest round-trip form).
fn f32_lit(x: f32) -> String {
    if x.is_finite() {
        let s = format!("{x:?}");
        let s = if s.contains(['.', 'e', 'E']) {
            s
        } else {
            format!("{s}.0")
        };
        format!("{s}f")
    } else {
        format!("rivet_f32_from_bits(0x{:08x}u)", x.to_bits())
    }
}

fn f64_lit(x: f64) -> String {
    if x.is_finite() {
        let s = format!("{x:?}");
        if s.contains(['.', 'e', 'E']) {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        format!("rivet_f64_from_bits(0x{:016x}ull)", x.to_bits())
    }
}

fn int_lit(v: i64, dt: DType) -> String {
    match dt {
        DType::Bool => (if v != 0 { "true" } else { "false" }).into(),
        DType::I64 if v == i64::MIN => "(-9223372036854775807LL - 1)".into(),
        DType::I64 if v < 0 => format!("({v}LL)"),
        DType::I64 => format!("{v}LL"),
        DType::U64 => format!("{}ull", v as u64),
        DType::I32 if v == i32::MIN as i64 => "(-2147483647 - 1)".into(),
        DType::I32 if v < 0 => format!("({v})"),
        DType::I32 => format!("{v}"),
        DType::U32 => format!("{}u", v as u32),
        other => format!("(({}){v})", storage_type(other)),
    }
}

/// A constant with exactly the interpreter's value (`eval_expr` decides it).
fn constant(e: &Expr) -> Result<String> {
    let dt = e.dtype();
    let v = eval_expr(e, &|_| None)?;
    Ok(match v {
        Value::Int(i) => int_lit(i, dt),
        Value::F32(x) => f32_lit(x),
        Value::F64(x) => f64_lit(x),
    })
}

fn unary(op: UnOp, dt: DType, x: &str) -> String {
    let f32_ = dt != DType::F64;
    let pick = |f: &str, d: &str| if f32_ { f.to_string() } else { d.to_string() };
    if is_int(dt) || dt == DType::Bool {
        let t = value_type(dt);
        let u = unsigned_type(dt);
        return match op {
            UnOp::Not => format!("(!{x})"),
            UnOp::Neg => format!("(({t})(0u - ({u}){x}))"),
            UnOp::Abs if matches!(dt, DType::U8 | DType::U16 | DType::U32 | DType::U64) => {
                x.to_string()
            }
            // Wrapping: abs(MIN) is MIN.
            UnOp::Abs => format!("rivet_iabs<{t}, {u}>({x})"),
            // The verifier and the constructors allow no other op on ints.
            _ => format!("/* unsupported {op:?} */ ({x})"),
        };
    }
    let one = pick("1.0f", "1.0");
    match op {
        // A space before a negative operand: `--1.0f` would be C's decrement operator.
        UnOp::Neg if x.starts_with('-') => format!("(- {x})"),
        UnOp::Neg => format!("(-{x})"),
        UnOp::Not => format!("(!{x})"),
        UnOp::Exp => format!("{}({x})", pick("expf", "exp")),
        UnOp::Log => format!("{}({x})", pick("logf", "log")),
        UnOp::Sqrt => format!("{}({x})", pick("sqrtf", "sqrt")),
        UnOp::Rsqrt => format!("({one} / {}({x}))", pick("sqrtf", "sqrt")),
        UnOp::Tanh => format!("{}({x})", pick("tanhf", "tanh")),
        UnOp::Sigmoid if x.starts_with('-') => {
            format!("({one} / ({one} + {}(- {x})))", pick("expf", "exp"))
        }
        UnOp::Sigmoid => format!("({one} / ({one} + {}(-{x})))", pick("expf", "exp")),
        UnOp::Abs => format!("{}({x})", pick("fabsf", "fabs")),
        UnOp::Floor => format!("{}({x})", pick("floorf", "floor")),
        UnOp::Ceil => format!("{}({x})", pick("ceilf", "ceil")),
        UnOp::Erf => format!("{}({x})", pick("erff", "erf")),
    }
}

pub(super) fn binary(op: BinOp, dt: DType, x: &str, y: &str, index: bool) -> String {
    if dt.is_float() {
        let f32_ = dt != DType::F64;
        let pick = |f: &str, d: &str| if f32_ { f.to_string() } else { d.to_string() };
        return match op {
            BinOp::Add => format!("({x} + {y})"),
            BinOp::Sub => format!("({x} - {y})"),
            BinOp::Mul => format!("({x} * {y})"),
            BinOp::Div => format!("({x} / {y})"),
            BinOp::FloorDiv => format!("{}({x}, {y})", pick("rivet_floordivf", "rivet_floordiv")),
            BinOp::FloorMod => format!("{}({x}, {y})", pick("rivet_floormodf", "rivet_floormod")),
            BinOp::Min => format!("{}({x}, {y})", pick("rivet_fminf", "rivet_fmin")),
            BinOp::Max => format!("{}({x}, {y})", pick("rivet_fmaxf", "rivet_fmax")),
            BinOp::Pow => format!("{}({x}, {y})", pick("powf", "pow")),
        };
    }
    let t = value_type(dt);
    let u = unsigned_type(dt);
    let wrap = |o: &str| {
        if index {
            format!("({x} {o} {y})")
        } else {
            format!("(({t})(({u}){x} {o} ({u}){y}))")
        }
    };
    match op {
        BinOp::Add => wrap("+"),
        BinOp::Sub => wrap("-"),
        BinOp::Mul => wrap("*"),
        BinOp::FloorDiv | BinOp::FloorMod => {
            let what = if op == BinOp::FloorDiv {
                "floordiv"
            } else {
                "floormod"
            };
            match dt {
                DType::U64 => format!("rivet_{what}_u64({x}, {y})"),
                DType::I64 => format!("rivet_{what}_i64({x}, {y})"),
                // Narrower ints: exact in int64, then wrapped to the dtype (MIN // -1).
                _ => format!("(({t})rivet_{what}_i64((long long){x}, (long long){y}))"),
            }
        }
        BinOp::Min => format!("rivet_min<{t}>({x}, {y})"),
        BinOp::Max => format!("rivet_max<{t}>({x}, {y})"),
        // Float-only ops (refused on ints by the constructors).
        BinOp::Div | BinOp::Pow => format!("/* unsupported {op:?} */ ({x})"),
    }
}

/// `Cast` from `from` to `to` with the interpreter's meaning.
fn cast(from: DType, to: DType, x: &str) -> String {
    if from == to {
        return x.to_string();
    }
    if to == DType::Bool {
        return format!("({x} != 0)");
    }
    let from_float = from.is_float();
    match to {
        DType::F64 => format!("((double){x})"),
        DType::F32 => format!("((float){x})"),
        DType::F16 | DType::BF16 => {
            let r = if to == DType::F16 { "f16" } else { "bf16" };
            if from == DType::F64 {
                format!("rivet_{r}_to_f32(rivet_f64_to_{r}({x}))")
            } else {
                // From float32 (float16/bfloat16 values are floats too) or an int via float32.
                format!("rivet_round_{r}((float){x})")
            }
        }
        _ if from_float => {
            let f = match to {
                DType::I8 => "rivet_f2i8",
                DType::I16 => "rivet_f2i16",
                DType::I32 => "rivet_f2i32",
                DType::I64 => "rivet_f2i64",
                DType::U8 => "rivet_f2u8",
                DType::U16 => "rivet_f2u16",
                DType::U32 => "rivet_f2u32",
                _ => "rivet_f2u64",
            };
            format!("{f}((double){x})")
        }
        // int -> int (and bool -> int): wraps (C++ conversions to unsigned wrap; to signed
        // they are modular in CUDA and since C++20).
        _ => format!("(({}){x})", value_type(to)),
    }
}
