//! The interpreter's scalar semantics, those documented in `codegen::cpu_lib::math` and
//! `ir::expr`:
//!
//! - integers are held in an `i64`, normalised to their dtype after every operation: signed
//!   types sign-extended, `uint8/16/32` zero-extended, `uint64` as its bit pattern (so its
//!   comparisons, `//`, `%`, `min`, `max` and conversions to float are done unsigned); `bool`
//!   is 0 or 1. Arithmetic wraps at the dtype's width; `//` and `%` are Python's (floor)
//!   with a zero divisor giving 0 (`math::floordiv_i64`, `math::floormod_i64`).
//! - `float32` is computed in `f32` (never widened), `float64` in `f64`; `float16`/`bfloat16`
//!   are loaded as `f32`, computed in `f32`, and rounded to their dtype only by a `Store`, a
//!   `Cast` to them, and a constant of their dtype (a float constant is the value rounded
//!   to the node's dtype, directly from the stored `f64`).
//! - transcendentals (`exp`, `log`, `tanh`, `erf`, `pow`) are `libm`'s in the dtype, except
//!   float32 `exp`: rivet's `codegen::cpu_lib::exp32`; `sqrt`, `abs`, `floor`, `ceil` are native
//!   (exact); `rsqrt = 1 / sqrt`, `sigmoid = 1 / (1 + exp(-x))`; float `min`/`max` propagate NaN (`math::fmin`/`fmax`);
//!   float `//`/`%` are `math::floordiv_f32`/`floormod_f32` (and the f64 versions).
//! - casts: int -> int wraps; float -> int saturates (Rust `as`, NaN -> 0); int -> float is
//!   `as` (unsigned for `uint64`; to float16/bfloat16 via `f32`); float -> float rounds to
//!   nearest, float64 -> float16 through float32 (rounded twice: the `half` crate's
//!   `from_f64` rounds directly without F16C and through float32 with it, so it would make
//!   the oracle depend on the CPU; every backend, CUDA included, converts through float32);
//!   float64 -> bfloat16 is `half`'s `from_f64` (no hardware path); anything -> bool is
//!   `x != 0`; bool -> number 0/1.
//! - `fma(a, b, c)` is `mul_add`: `a * b + c` rounded once, in the value type (`f32` for
//!   float16/bfloat16 too);
//! - comparisons of floats are IEEE (NaN compares unequal to everything); `Select` evaluates
//!   its condition and only the chosen arm; `&&`/`||` short-circuit.

use super::Value;
use crate::codegen::cpu_lib::math;
use crate::ir::expr::{BinOp, CmpOp, Const, UnOp};
use half::{bf16, f16};
use rivet_runtime::DType;

/// Normalises an integer result to dtype `dt` (see the module documentation).
pub(super) fn wrap(v: i64, dt: DType) -> i64 {
    match dt {
        DType::Bool => (v != 0) as i64,
        DType::I8 => v as i8 as i64,
        DType::I16 => v as i16 as i64,
        DType::I32 => v as i32 as i64,
        DType::U8 => v as u8 as i64,
        DType::U16 => v as u16 as i64,
        DType::U32 => v as u32 as i64,
        DType::I64 | DType::U64 => v,
        // Not an integer dtype: callers never get here (floats are not `Value::Int`).
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => v,
    }
}

/// A constant of dtype `dt`: an integer constant is converted as by a cast from int64, a
/// float one as by a cast from float64 (so a float16 constant is rounded to float16).
pub(super) fn constant(c: Const, dt: DType) -> Value {
    match c {
        Const::Int(v) => cast(DType::I64, dt, Value::Int(v)),
        Const::Float(v) => cast(DType::F64, dt, Value::F64(v)),
    }
}

/// A float (f64-exact) converted to integer dtype `to`, saturating (Rust `as`).
fn float_to_int(x: f64, to: DType) -> i64 {
    match to {
        DType::Bool => (x != 0.0) as i64,
        DType::I8 => x as i8 as i64,
        DType::I16 => x as i16 as i64,
        DType::I32 => x as i32 as i64,
        DType::I64 => x as i64,
        DType::U8 => x as u8 as i64,
        DType::U16 => x as u16 as i64,
        DType::U32 => x as u32 as i64,
        DType::U64 => x as u64 as i64,
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => unreachable!("float_to_int to {to}"),
    }
}

/// Rounds an f32 to a float dtype computed in f32 (float16/bfloat16), or keeps it (float32).
fn round_f32(x: f32, to: DType) -> f32 {
    match to {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// `Cast` from `from` to `to` (see the module documentation).
pub(super) fn cast(from: DType, to: DType, x: Value) -> Value {
    match x {
        Value::Int(v) => match to {
            DType::F64 => Value::F64(if from == DType::U64 {
                v as u64 as f64
            } else {
                v as f64
            }),
            DType::F32 | DType::F16 | DType::BF16 => {
                let f = if from == DType::U64 {
                    v as u64 as f32
                } else {
                    v as f32
                };
                Value::F32(round_f32(f, to))
            }
            _ => Value::Int(wrap(v, to)),
        },
        Value::F32(f) => match to {
            DType::F64 => Value::F64(f as f64),
            DType::F32 | DType::F16 | DType::BF16 => Value::F32(round_f32(f, to)),
            _ => Value::Int(float_to_int(f as f64, to)),
        },
        Value::F64(f) => match to {
            DType::F64 => Value::F64(f),
            DType::F32 => Value::F32(f as f32),
            DType::F16 => Value::F32(f16::from_f32(f as f32).to_f32()),
            DType::BF16 => Value::F32(bf16::from_f64(f).to_f32()),
            _ => Value::Int(float_to_int(f, to)),
        },
    }
}

pub(super) fn unary(op: UnOp, dt: DType, x: Value) -> Option<Value> {
    Some(match x {
        Value::Int(a) => {
            let unsigned = matches!(dt, DType::U8 | DType::U16 | DType::U32 | DType::U64);
            Value::Int(match op {
                UnOp::Neg => wrap(a.wrapping_neg(), dt),
                UnOp::Abs if unsigned => a,
                UnOp::Abs => wrap(a.wrapping_abs(), dt),
                UnOp::Not => (a == 0) as i64,
                _ => return None,
            })
        }
        Value::F32(a) => Value::F32(match op {
            UnOp::Neg => -a,
            UnOp::Exp => crate::codegen::cpu_lib::exp32::exp32(a),
            UnOp::Log => libm::logf(a),
            UnOp::Sqrt => a.sqrt(),
            UnOp::Rsqrt => 1.0 / a.sqrt(),
            UnOp::Tanh => libm::tanhf(a),
            UnOp::Sigmoid => 1.0 / (1.0 + crate::codegen::cpu_lib::exp32::exp32(-a)),
            UnOp::Abs => a.abs(),
            UnOp::Floor => a.floor(),
            UnOp::Ceil => a.ceil(),
            UnOp::Erf => libm::erff(a),
            UnOp::Not => return None,
        }),
        Value::F64(a) => Value::F64(match op {
            UnOp::Neg => -a,
            UnOp::Exp => libm::exp(a),
            UnOp::Log => libm::log(a),
            UnOp::Sqrt => a.sqrt(),
            UnOp::Rsqrt => 1.0 / a.sqrt(),
            UnOp::Tanh => libm::tanh(a),
            UnOp::Sigmoid => 1.0 / (1.0 + libm::exp(-a)),
            UnOp::Abs => a.abs(),
            UnOp::Floor => a.floor(),
            UnOp::Ceil => a.ceil(),
            UnOp::Erf => libm::erf(a),
            UnOp::Not => return None,
        }),
    })
}

pub(super) fn binary(op: BinOp, dt: DType, x: Value, y: Value) -> Option<Value> {
    Some(match (x, y) {
        (Value::Int(a), Value::Int(b)) => {
            let u64_ = dt == DType::U64;
            let (ua, ub) = (a as u64, b as u64);
            let r = match op {
                BinOp::Add => a.wrapping_add(b),
                BinOp::Sub => a.wrapping_sub(b),
                BinOp::Mul => a.wrapping_mul(b),
                // uint64 needs unsigned division; narrower unsigned values are non-negative,
                // where floor and truncating division agree.
                BinOp::FloorDiv if u64_ => ua.checked_div(ub).unwrap_or(0) as i64,
                BinOp::FloorMod if u64_ => ua.checked_rem(ub).unwrap_or(0) as i64,
                BinOp::FloorDiv => math::floordiv_i64(a, b),
                BinOp::FloorMod => math::floormod_i64(a, b),
                BinOp::Min if u64_ => ua.min(ub) as i64,
                BinOp::Max if u64_ => ua.max(ub) as i64,
                BinOp::Min => a.min(b),
                BinOp::Max => a.max(b),
                BinOp::Div | BinOp::Pow => return None,
            };
            Value::Int(wrap(r, dt))
        }
        (Value::F32(a), Value::F32(b)) => Value::F32(match op {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
            BinOp::Div => a / b,
            BinOp::FloorDiv => math::floordiv_f32(a, b),
            BinOp::FloorMod => math::floormod_f32(a, b),
            BinOp::Min => math::fmin(a, b),
            BinOp::Max => math::fmax(a, b),
            BinOp::Pow => libm::powf(a, b),
        }),
        (Value::F64(a), Value::F64(b)) => Value::F64(match op {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
            BinOp::Div => a / b,
            BinOp::FloorDiv => math::floordiv_f64(a, b),
            BinOp::FloorMod => math::floormod_f64(a, b),
            BinOp::Min => math::fmin(a, b),
            BinOp::Max => math::fmax(a, b),
            BinOp::Pow => libm::pow(a, b),
        }),
        _ => return None,
    })
}

/// A comparison of two values of dtype `dt` (IEEE for floats, unsigned for uint64).
pub(super) fn compare(op: CmpOp, dt: DType, x: Value, y: Value) -> Option<bool> {
    fn apply<T: PartialOrd>(op: CmpOp, a: T, b: T) -> bool {
        match op {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
        }
    }
    Some(match (x, y) {
        (Value::Int(a), Value::Int(b)) if dt == DType::U64 => apply(op, a as u64, b as u64),
        (Value::Int(a), Value::Int(b)) => apply(op, a, b),
        (Value::F32(a), Value::F32(b)) => apply(op, a, b),
        (Value::F64(a), Value::F64(b)) => apply(op, a, b),
        _ => return None,
    })
}
