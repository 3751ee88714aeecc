//! Property tests of the compiler: random programs, random valid schedules and random
//! strided layouts, run on every backend (`rivet_tests::backends()`, the interpreter first).
//!
//! Oracles, for every case:
//! - a plain-Rust evaluation of the random expression tree (the scalar semantics of
//!   `codegen::cpu_lib::math`, with the very same libm functions) must equal the interpreter running
//!   the UNSCHEDULED program on compact tensors, bit for bit;
//! - every other backend (today the Cranelift backend, "cpu") must equal the interpreter
//!   ("interp") bit for bit, both unscheduled and scheduled (NaNs compare equal to each other,
//!   whatever their payload; docs/tolerance.md);
//! - the scheduled program, run on permuted / stepped / reversed / broadcast views with its
//!   output written in place through a strided view, must equal the unscheduled program:
//!   bitwise for elementwise programs and for sums and products (whose bodies are quantised
//!   to small integers / powers of two, so every summation order is exact); as values for
//!   float max/min, where a reordered reduction may pick -0.0 instead of 0.0 on a tie;
//! - elements of the output's buffer outside the view stay untouched, bit for bit;
//! - a valid schedule must build and its call must be accepted (a refusal is a failure).
//!
//! Programs: elementwise trees (depth <= 4) over 1-3 inputs (float32, float64 or int32) of
//! rank 1-3, dims 1-6, possibly symbolic, with casts between f32/f64/i32/bool, comparisons,
//! selects, constants (signed zeros, NaN, infinities, i32 extremes) and index values;
//! reductions (sum/max/min/prod over 1-2 axes of a rank-2/3 domain, starting at 0 or 1);
//! two-stage programs (an elementwise producer read by an elementwise stencil consumer or by
//! a reduction), with the producer at root, inlined or `compute_at` any consumer loop.
//! Schedules: split (factor or nparts, 1-7, dividing or not), fuse of adjacent loops,
//! reorder (swaps, reversal, reduction loops outermost), tile, unroll of constant-extent
//! loops, vectorize of the innermost data-parallel loop (split first or not), parallel of
//! any data-parallel loop.
//!
//! Also: every scalar operator and cast on every pair of edge values (exhaustive, both
//! backends and the reference), and one plain test per bug the properties found (`bug_*`).
//!
//! Environment: `PROPTEST_CASES=n` runs n cases per property; `RIVET_PROPS_SKIP_KNOWN=1`
//! skips cases that hit a known bug (see `known_bug`) so that the properties can look for
//! others; `RIVET_PROPS_VERBOSE=1` lists those skips; `RIVET_PROPS_STATS=1` prints one line
//! of coverage statistics per case.

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::Config;
use rivet_compiler::codegen::cpu_lib::math::{self, ffi};
use rivet_compiler::ir::{BinOp, CmpOp, Expr, IterVar, LogicOp, ReduceOp, UnOp, Var};
use rivet_compiler::te::{self, ok, Tensor as Te};
use rivet_compiler::{build, Schedule};
use rivet_runtime::{DType, Tensor, Value};
use rivet_tests::backends;
use std::collections::HashSet;
use std::fmt;

// ---- scalar types and values --------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    F32,
    F64,
    I32,
    Bool,
}

const TYS: [Ty; 4] = [Ty::F32, Ty::F64, Ty::I32, Ty::Bool];

impl Ty {
    fn i(self) -> usize {
        self as usize
    }
    fn dtype(self) -> DType {
        match self {
            Ty::F32 => DType::F32,
            Ty::F64 => DType::F64,
            Ty::I32 => DType::I32,
            Ty::Bool => DType::Bool,
        }
    }
    fn is_float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64)
    }
}

/// A scalar of the reference evaluator.
#[derive(Clone, Copy, Debug)]
enum V {
    B(bool),
    I(i32),
    F(f32),
    D(f64),
}

impl V {
    fn from_bits(b: u64, ty: Ty) -> V {
        match ty {
            Ty::F32 => V::F(f32::from_bits(b as u32)),
            Ty::F64 => V::D(f64::from_bits(b)),
            Ty::I32 => V::I(b as u32 as i32),
            Ty::Bool => V::B(b != 0),
        }
    }
    /// Bits with every NaN canonicalised.
    fn bits(self) -> u64 {
        match self {
            V::F(f) if f.is_nan() => f32::NAN.to_bits() as u64,
            V::F(f) => f.to_bits() as u64,
            V::D(d) if d.is_nan() => f64::NAN.to_bits(),
            V::D(d) => d.to_bits(),
            V::I(i) => i as u32 as u64,
            V::B(b) => b as u64,
        }
    }
    fn truth(self) -> bool {
        match self {
            V::B(b) => b,
            other => panic!("not a bool: {other:?}"),
        }
    }
}

fn canon(b: u64, ty: Ty) -> u64 {
    V::from_bits(b, ty).bits()
}

/// Equal as numbers (0.0 == -0.0), NaN equal to NaN.
fn value_eq(a: u64, b: u64, ty: Ty) -> bool {
    match (V::from_bits(a, ty), V::from_bits(b, ty)) {
        (V::F(x), V::F(y)) => x == y || (x.is_nan() && y.is_nan()),
        (V::D(x), V::D(y)) => x == y || (x.is_nan() && y.is_nan()),
        _ => canon(a, ty) == canon(b, ty),
    }
}

fn fmt_bits(b: u64, ty: Ty) -> String {
    format!("{:?}", V::from_bits(b, ty))
}

/// Casts with the documented semantics: float -> int saturates (NaN -> 0), -> bool is `!= 0`.
fn cast_v(v: V, to: Ty) -> V {
    match (v, to) {
        (V::B(b), Ty::Bool) => V::B(b),
        (V::B(b), Ty::I32) => V::I(b as i32),
        (V::B(b), Ty::F32) => V::F(b as u8 as f32),
        (V::B(b), Ty::F64) => V::D(b as u8 as f64),
        (V::I(i), Ty::Bool) => V::B(i != 0),
        (V::I(i), Ty::I32) => V::I(i),
        (V::I(i), Ty::F32) => V::F(i as f32),
        (V::I(i), Ty::F64) => V::D(i as f64),
        (V::F(f), Ty::Bool) => V::B(f != 0.0),
        (V::F(f), Ty::I32) => V::I(f as i32),
        (V::F(f), Ty::F32) => V::F(f),
        (V::F(f), Ty::F64) => V::D(f as f64),
        (V::D(d), Ty::Bool) => V::B(d != 0.0),
        (V::D(d), Ty::I32) => V::I(d as i32),
        (V::D(d), Ty::F32) => V::F(d as f32),
        (V::D(d), Ty::F64) => V::D(d),
    }
}

fn const_v(ty: Ty, c: f64) -> V {
    match ty {
        Ty::F32 => V::F(c as f32),
        Ty::F64 => V::D(c),
        Ty::I32 => V::I(c as i64 as i32),
        Ty::Bool => V::B(c != 0.0),
    }
}

fn un_v(op: UnOp, a: V) -> V {
    match a {
        V::I(x) => V::I(match op {
            UnOp::Neg => x.wrapping_neg(),
            UnOp::Abs => x.wrapping_abs(),
            _ => panic!("{op:?} on int"),
        }),
        V::B(b) => match op {
            UnOp::Not => V::B(!b),
            _ => panic!("{op:?} on bool"),
        },
        V::F(x) => V::F(match op {
            UnOp::Neg => -x,
            UnOp::Exp => ffi::expf(x),
            UnOp::Log => ffi::logf(x),
            UnOp::Sqrt => x.sqrt(),
            UnOp::Rsqrt => 1.0 / x.sqrt(),
            UnOp::Tanh => ffi::tanhf(x),
            UnOp::Sigmoid => 1.0 / (1.0 + ffi::expf(-x)),
            UnOp::Abs => x.abs(),
            UnOp::Floor => x.floor(),
            UnOp::Ceil => x.ceil(),
            UnOp::Erf => ffi::erff(x),
            UnOp::Not => panic!("not on float"),
        }),
        V::D(x) => V::D(match op {
            UnOp::Neg => -x,
            UnOp::Exp => ffi::exp(x),
            UnOp::Log => ffi::log(x),
            UnOp::Sqrt => x.sqrt(),
            UnOp::Rsqrt => 1.0 / x.sqrt(),
            UnOp::Tanh => ffi::tanh(x),
            UnOp::Sigmoid => 1.0 / (1.0 + ffi::exp(-x)),
            UnOp::Abs => x.abs(),
            UnOp::Floor => x.floor(),
            UnOp::Ceil => x.ceil(),
            UnOp::Erf => ffi::erf(x),
            UnOp::Not => panic!("not on float"),
        }),
    }
}

fn bin_v(op: BinOp, a: V, b: V) -> V {
    match (a, b) {
        (V::I(x), V::I(y)) => V::I(match op {
            BinOp::Add => x.wrapping_add(y),
            BinOp::Sub => x.wrapping_sub(y),
            BinOp::Mul => x.wrapping_mul(y),
            BinOp::FloorDiv => math::floordiv_i64(x as i64, y as i64) as i32,
            BinOp::FloorMod => math::floormod_i64(x as i64, y as i64) as i32,
            BinOp::Min => x.min(y),
            BinOp::Max => x.max(y),
            BinOp::Div | BinOp::Pow => panic!("{op:?} on ints"),
        }),
        (V::F(x), V::F(y)) => V::F(match op {
            BinOp::Add => x + y,
            BinOp::Sub => x - y,
            BinOp::Mul => x * y,
            BinOp::Div => x / y,
            BinOp::FloorDiv => math::floordiv_f32(x, y),
            BinOp::FloorMod => math::floormod_f32(x, y),
            BinOp::Min => math::fmin(x, y),
            BinOp::Max => math::fmax(x, y),
            BinOp::Pow => ffi::powf(x, y),
        }),
        (V::D(x), V::D(y)) => V::D(match op {
            BinOp::Add => x + y,
            BinOp::Sub => x - y,
            BinOp::Mul => x * y,
            BinOp::Div => x / y,
            BinOp::FloorDiv => math::floordiv_f64(x, y),
            BinOp::FloorMod => math::floormod_f64(x, y),
            BinOp::Min => math::fmin(x, y),
            BinOp::Max => math::fmax(x, y),
            BinOp::Pow => ffi::pow(x, y),
        }),
        _ => panic!("{op:?} of {a:?} and {b:?}"),
    }
}

fn cmp_v(op: CmpOp, a: V, b: V) -> bool {
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
    match (a, b) {
        (V::I(x), V::I(y)) => apply(op, x, y),
        (V::F(x), V::F(y)) => apply(op, x, y),
        (V::D(x), V::D(y)) => apply(op, x, y),
        (V::B(x), V::B(y)) => apply(op, x, y),
        _ => panic!("compare {a:?} {b:?}"),
    }
}

// ---- expression trees ---------------------------------------------------------------------

/// A typed expression tree. Slot and dim numbers are raw draws, reduced modulo the counts of
/// the program they end up in by `norm`.
#[derive(Clone)]
enum E {
    /// Element of slot `.0` (an input, or the producer stage) at offset vector `.1`.
    In(u8, u8, Ty),
    /// Index variable `.0`, cast to `.1`.
    Idx(u8, Ty),
    C(Ty, f64),
    Un(UnOp, Box<E>),
    Bin(BinOp, Box<E>, Box<E>),
    Cmp(CmpOp, Box<E>, Box<E>),
    Logic(LogicOp, Box<E>, Box<E>),
    Sel(Box<E>, Box<E>, Box<E>),
    Cast(Ty, Box<E>),
}

fn bx(e: E) -> Box<E> {
    Box::new(e)
}

impl fmt::Debug for E {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            E::In(s, o, _) => write!(f, "in{s}@{o}"),
            E::Idx(d, t) => write!(f, "idx{d}:{t:?}"),
            E::C(t, v) => write!(f, "{v:?}:{t:?}"),
            E::Un(op, a) => write!(f, "{op:?}({a:?})"),
            E::Bin(op, a, b) => write!(f, "{op:?}({a:?}, {b:?})"),
            E::Cmp(op, a, b) => write!(f, "{op:?}({a:?}, {b:?})"),
            E::Logic(op, a, b) => write!(f, "{op:?}({a:?}, {b:?})"),
            E::Sel(c, a, b) => write!(f, "select({c:?}, {a:?}, {b:?})"),
            E::Cast(t, a) => write!(f, "cast<{t:?}>({a:?})"),
        }
    }
}

impl E {
    fn ty(&self) -> Ty {
        match self {
            E::In(_, _, t) | E::Idx(_, t) | E::C(t, _) | E::Cast(t, _) => *t,
            E::Un(_, a) | E::Bin(_, a, _) | E::Sel(_, a, _) => a.ty(),
            E::Cmp(..) | E::Logic(..) => Ty::Bool,
        }
    }

    /// Slot, offset and dim numbers reduced into range.
    fn norm(&self, nslots: u8, noffs: u8, nidx: u8) -> E {
        let n = |e: &E| bx(e.norm(nslots, noffs, nidx));
        match self {
            E::In(s, o, t) => E::In(s % nslots, o % noffs, *t),
            E::Idx(d, t) => E::Idx(d % nidx, *t),
            E::C(t, v) => E::C(*t, *v),
            E::Un(op, a) => E::Un(*op, n(a)),
            E::Bin(op, a, b) => E::Bin(*op, n(a), n(b)),
            E::Cmp(op, a, b) => E::Cmp(*op, n(a), n(b)),
            E::Logic(op, a, b) => E::Logic(*op, n(a), n(b)),
            E::Sel(c, a, b) => E::Sel(n(c), n(a), n(b)),
            E::Cast(t, a) => E::Cast(*t, n(a)),
        }
    }

    fn slots(&self, out: &mut HashSet<u8>) {
        match self {
            E::In(s, _, _) => {
                out.insert(*s);
            }
            E::Idx(..) | E::C(..) => {}
            E::Un(_, a) | E::Cast(_, a) => a.slots(out),
            E::Bin(_, a, b) | E::Cmp(_, a, b) | E::Logic(_, a, b) => {
                a.slots(out);
                b.slots(out)
            }
            E::Sel(c, a, b) => {
                c.slots(out);
                a.slots(out);
                b.slots(out)
            }
        }
    }

    fn reads(&self, slot: u8) -> bool {
        let mut s = HashSet::new();
        self.slots(&mut s);
        s.contains(&slot)
    }

    /// This tree, combined with a read of `slot` so that the slot is surely used.
    fn with_read(self, slot: u8, slot_ty: Ty) -> E {
        if self.reads(slot) {
            return self;
        }
        let r = E::In(slot, 0, slot_ty);
        match self.ty() {
            Ty::Bool => E::Logic(
                LogicOp::Or,
                bx(self),
                bx(E::Cmp(CmpOp::Lt, bx(r), bx(E::C(slot_ty, 0.0)))),
            ),
            t if t == slot_ty => E::Bin(BinOp::Add, bx(self), bx(r)),
            t => E::Bin(BinOp::Add, bx(self), bx(E::Cast(t, bx(r)))),
        }
    }

    /// The te expression; `rd(slot, offset)` reads a slot, `idx` are the index variables.
    fn te(&self, rd: &dyn Fn(u8, u8) -> Expr, idx: &[Expr]) -> Expr {
        let t = |e: &E| e.te(rd, idx);
        match self {
            E::In(s, o, _) => rd(*s, *o),
            E::Idx(d, ty) => te::cast(ty.dtype(), &idx[*d as usize]),
            E::C(ty, v) => te::constant(*v, ty.dtype()),
            E::Un(op, a) => {
                let a = t(a);
                match op {
                    UnOp::Neg => -a,
                    UnOp::Not => te::not(a),
                    UnOp::Exp => te::exp(a),
                    UnOp::Log => te::log(a),
                    UnOp::Sqrt => te::sqrt(a),
                    UnOp::Rsqrt => te::rsqrt(a),
                    UnOp::Tanh => te::tanh(a),
                    UnOp::Sigmoid => te::sigmoid(a),
                    UnOp::Abs => te::abs(a),
                    UnOp::Floor => te::floor(a),
                    UnOp::Ceil => te::ceil(a),
                    UnOp::Erf => te::erf(a),
                }
            }
            E::Bin(op, a, b) => {
                let (a, b) = (t(a), t(b));
                match op {
                    BinOp::Add => a + b,
                    BinOp::Sub => a - b,
                    BinOp::Mul => a * b,
                    BinOp::Div => a / b,
                    BinOp::FloorDiv => te::floordiv(a, b),
                    BinOp::FloorMod => a % b,
                    BinOp::Min => te::minimum(a, b),
                    BinOp::Max => te::maximum(a, b),
                    BinOp::Pow => te::pow(a, b),
                }
            }
            E::Cmp(op, a, b) => ok(te::compare(*op, t(a), t(b))),
            E::Logic(LogicOp::And, a, b) => te::all(t(a), t(b)),
            E::Logic(LogicOp::Or, a, b) => te::any(t(a), t(b)),
            E::Sel(c, a, b) => te::if_then_else(t(c), t(a), t(b)),
            E::Cast(ty, a) => te::cast(ty.dtype(), t(a)),
        }
    }

    /// The reference value.
    fn eval(&self, rd: &dyn Fn(u8, u8) -> V, idx: &[i64]) -> V {
        let ev = |e: &E| e.eval(rd, idx);
        match self {
            E::In(s, o, _) => rd(*s, *o),
            E::Idx(d, ty) => match ty {
                Ty::F32 => V::F(idx[*d as usize] as f32),
                Ty::F64 => V::D(idx[*d as usize] as f64),
                Ty::I32 => V::I(idx[*d as usize] as i32),
                Ty::Bool => V::B(idx[*d as usize] != 0),
            },
            E::C(ty, v) => const_v(*ty, *v),
            E::Un(op, a) => un_v(*op, ev(a)),
            E::Bin(op, a, b) => bin_v(*op, ev(a), ev(b)),
            E::Cmp(op, a, b) => V::B(cmp_v(*op, ev(a), ev(b))),
            E::Logic(LogicOp::And, a, b) => V::B(ev(a).truth() && ev(b).truth()),
            E::Logic(LogicOp::Or, a, b) => V::B(ev(a).truth() || ev(b).truth()),
            E::Sel(c, a, b) => {
                if ev(c).truth() {
                    ev(a)
                } else {
                    ev(b)
                }
            }
            E::Cast(ty, a) => cast_v(ev(a), *ty),
        }
    }
}

// ---- tree strategies ----------------------------------------------------------------------

const FLOAT_BIN: [BinOp; 9] = [
    BinOp::Add,
    BinOp::Sub,
    BinOp::Mul,
    BinOp::Div,
    BinOp::FloorDiv,
    BinOp::FloorMod,
    BinOp::Min,
    BinOp::Max,
    BinOp::Pow,
];
const INT_BIN: [BinOp; 7] = [
    BinOp::Add,
    BinOp::Sub,
    BinOp::Mul,
    BinOp::FloorDiv,
    BinOp::FloorMod,
    BinOp::Min,
    BinOp::Max,
];
const FLOAT_UN: [UnOp; 11] = [
    UnOp::Neg,
    UnOp::Abs,
    UnOp::Exp,
    UnOp::Log,
    UnOp::Sqrt,
    UnOp::Rsqrt,
    UnOp::Tanh,
    UnOp::Sigmoid,
    UnOp::Erf,
    UnOp::Floor,
    UnOp::Ceil,
];
const CMPS: [CmpOp; 6] = [
    CmpOp::Eq,
    CmpOp::Ne,
    CmpOp::Lt,
    CmpOp::Le,
    CmpOp::Gt,
    CmpOp::Ge,
];
const FLOAT_CONSTS: [f64; 10] = [0.5, 1.0, -1.0, 2.0, -3.0, 0.1, 7.25, 0.0, -4.5, 1e-3];
/// Rare constants: signed zero, overflow, underflow, NaN, infinity.
const FLOAT_SPECIALS: [f64; 6] = [-0.0, 1e30, 3.0e38, 1e-300, f64::NAN, f64::INFINITY];
const INT_CONSTS: [f64; 13] = [
    0.0,
    1.0,
    -1.0,
    2.0,
    -2.0,
    3.0,
    7.0,
    -7.0,
    100.0,
    65536.0,
    2147483647.0,
    -2147483648.0,
    -46341.0,
];

/// `op(abs(x) + 0.5)` for log/sqrt/rsqrt (finite-ish), `op(x)` for the others.
fn guarded_un(op: UnOp, x: E) -> E {
    let ty = x.ty();
    if matches!(op, UnOp::Log | UnOp::Sqrt | UnOp::Rsqrt) {
        E::Un(
            op,
            bx(E::Bin(
                BinOp::Add,
                bx(E::Un(UnOp::Abs, bx(x))),
                bx(E::C(ty, 0.5)),
            )),
        )
    } else {
        E::Un(op, bx(x))
    }
}

fn constant(t: Ty) -> BoxedStrategy<E> {
    match t {
        Ty::Bool => any::<bool>()
            .prop_map(|b| E::C(Ty::Bool, b as u8 as f64))
            .boxed(),
        Ty::I32 => select(INT_CONSTS.to_vec())
            .prop_map(move |v| E::C(t, v))
            .boxed(),
        _ => prop_oneof![6 => select(FLOAT_CONSTS.to_vec()), 1 => select(FLOAT_SPECIALS.to_vec())]
            .prop_map(move |v| E::C(t, v))
            .boxed(),
    }
}

/// Leaves: mostly input elements (cast or compared when the leaf has another type).
fn leaf(t: Ty, main: Ty) -> BoxedStrategy<E> {
    let idx = (0u8..3).prop_map(move |d| E::Idx(d, t));
    let input = (0u8..6, 0u8..4).prop_map(move |(s, o)| E::In(s, o, main));
    match t {
        Ty::Bool => prop_oneof![
            1 => constant(t),
            3 => (select(CMPS.to_vec()), input, constant(main)).prop_map(|(op, a, c)| E::Cmp(op, bx(a), bx(c))),
        ]
        .boxed(),
        _ if t == main => prop_oneof![8 => input, 1 => idx, 2 => constant(t)].boxed(),
        _ => prop_oneof![3 => input.prop_map(move |x| E::Cast(t, bx(x))), 1 => idx, 1 => constant(t)].boxed(),
    }
}

fn node(t: Ty, main: Ty, p: &[BoxedStrategy<E>]) -> BoxedStrategy<E> {
    let s = |u: Ty| p[u.i()].clone();
    let sel = (s(Ty::Bool), s(t), s(t)).prop_map(|(c, a, b)| E::Sel(bx(c), bx(a), bx(b)));
    // Casts into t, mostly from the inputs' type.
    let others: Vec<Ty> = TYS.iter().copied().filter(|&u| u != t).collect();
    let w = |u: Ty| if u == main { 3 } else { 1 };
    let cast = prop_oneof![
        w(others[0]) => s(others[0]),
        w(others[1]) => s(others[1]),
        w(others[2]) => s(others[2]),
    ]
    .prop_map(move |x| E::Cast(t, bx(x)));
    match t {
        Ty::F32 | Ty::F64 => prop_oneof![
            5 => (select(FLOAT_BIN.to_vec()), s(t), s(t)).prop_map(|(op, a, b)| E::Bin(op, bx(a), bx(b))),
            4 => (select(FLOAT_UN.to_vec()), s(t)).prop_map(|(op, a)| guarded_un(op, a)),
            1 => sel,
            1 => cast,
        ]
        .boxed(),
        Ty::I32 => prop_oneof![
            5 => (select(INT_BIN.to_vec()), s(t), s(t)).prop_map(|(op, a, b)| E::Bin(op, bx(a), bx(b))),
            1 => (select(vec![UnOp::Neg, UnOp::Abs]), s(t)).prop_map(|(op, a)| E::Un(op, bx(a))),
            1 => sel,
            1 => cast,
        ]
        .boxed(),
        Ty::Bool => {
            let cmp = prop_oneof![
                w(Ty::F32) => (s(Ty::F32), s(Ty::F32)),
                w(Ty::F64) => (s(Ty::F64), s(Ty::F64)),
                w(Ty::I32) => (s(Ty::I32), s(Ty::I32)),
            ];
            prop_oneof![
                4 => (select(CMPS.to_vec()), cmp).prop_map(|(op, (a, b))| E::Cmp(op, bx(a), bx(b))),
                1 => (select(vec![LogicOp::And, LogicOp::Or]), s(t), s(t)).prop_map(|(op, a, b)| E::Logic(op, bx(a), bx(b))),
                1 => s(t).prop_map(|a| E::Un(UnOp::Not, bx(a))),
                1 => sel,
                1 => cast,
            ]
            .boxed()
        }
    }
}

/// Trees of depth <= `depth` whose value has type `root`, over slots of type `main`.
fn tree(main: Ty, depth: u32, root: Ty) -> BoxedStrategy<E> {
    let mut level: Vec<BoxedStrategy<E>> = TYS.iter().map(|&t| leaf(t, main)).collect();
    for _ in 0..depth {
        let prev = level.clone();
        level = TYS
            .iter()
            .map(|&t| prop_oneof![1 => prev[t.i()].clone(), 3 => node(t, main, &prev)].boxed())
            .collect();
    }
    level[root.i()].clone()
}

/// A tree of type `main`, or now and then of another type (casts and bool outputs).
fn rooted_tree(main: Ty, depth: u32) -> BoxedStrategy<E> {
    let others: Vec<Ty> = TYS.iter().copied().filter(|&u| u != main).collect();
    prop_oneof![
        8 => tree(main, depth, main),
        1 => tree(main, depth, others[0]),
        1 => tree(main, depth, others[1]),
        1 => tree(main, depth, others[2]),
    ]
    .boxed()
}

// ---- data ---------------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One random element: mostly small halves (exact everywhere), some arbitrary values, some
/// specials (NaN, infinities, signed zeros, huge, subnormal); ints with zeros and extremes.
fn random_value(ty: Ty, r: &mut Rng) -> V {
    let k = r.below(100);
    match ty {
        Ty::F32 | Ty::F64 => {
            let x = if k < 60 {
                (r.below(33) as f64 - 16.0) * 0.5
            } else if k < 88 {
                r.unit() * 20.0 - 10.0
            } else {
                [
                    f64::NAN,
                    f64::INFINITY,
                    f64::NEG_INFINITY,
                    0.0,
                    -0.0,
                    1e30,
                    -3e38,
                    1e-40,
                    1e-310,
                    0.1,
                ][r.below(10) as usize]
            };
            const_v(ty, x)
        }
        Ty::I32 => V::I(if k < 65 {
            r.below(21) as i32 - 10
        } else if k < 90 {
            r.next() as i32
        } else {
            [0, i32::MIN, i32::MAX, -1, 1, 46341][r.below(6) as usize]
        }),
        Ty::Bool => V::B(r.below(2) == 1),
    }
}

fn tensor_from_bits(bits: &[u64], shape: &[i64], ty: Ty) -> Tensor {
    match ty {
        Ty::F32 => Tensor::from_slice(
            &bits
                .iter()
                .map(|&b| f32::from_bits(b as u32))
                .collect::<Vec<_>>(),
            shape,
        ),
        Ty::F64 => Tensor::from_slice(
            &bits.iter().map(|&b| f64::from_bits(b)).collect::<Vec<_>>(),
            shape,
        ),
        Ty::I32 => Tensor::from_slice(
            &bits.iter().map(|&b| b as u32 as i32).collect::<Vec<_>>(),
            shape,
        ),
        Ty::Bool => Tensor::from_slice(&bits.iter().map(|&b| b != 0).collect::<Vec<_>>(), shape),
    }
    .unwrap()
}

/// The logical elements (row-major), as raw bits.
fn tensor_bits(t: &Tensor, ty: Ty) -> Vec<u64> {
    match ty {
        Ty::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(|x| x.to_bits() as u64)
            .collect(),
        Ty::F64 => t
            .to_vec::<f64>()
            .unwrap()
            .into_iter()
            .map(|x| x.to_bits())
            .collect(),
        Ty::I32 => t
            .to_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(|x| x as u32 as u64)
            .collect(),
        Ty::Bool => t
            .to_vec::<bool>()
            .unwrap()
            .into_iter()
            .map(|x| x as u64)
            .collect(),
    }
}

fn numel(shape: &[i64]) -> usize {
    shape.iter().product::<i64>() as usize
}

/// Row-major multi-index of flat position `flat`.
fn unflatten(mut flat: usize, shape: &[i64]) -> Vec<i64> {
    let mut idx = vec![0i64; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = (flat % shape[d] as usize) as i64;
        flat /= shape[d] as usize;
    }
    idx
}

fn flatten(idx: &[i64], shape: &[i64]) -> usize {
    idx.iter()
        .zip(shape)
        .fold(0usize, |acc, (&i, &n)| acc * n as usize + i as usize)
}

// ---- strided views ------------------------------------------------------------------------

/// A layout: base dim `i` holds view dim `perm[i]` (perm = argsort of `keys`), stepped by
/// `steps`, maybe reversed; broadcast dims (inputs only) have stride 0.
#[derive(Clone)]
struct ViewS {
    keys: [u8; 3],
    steps: [i64; 3],
    flips: [bool; 3],
    bcast: [bool; 3],
}

impl fmt::Debug for ViewS {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ViewS {{ keys: {:?}, steps: {:?}, flips: {:?}, bcast: {:?} }}",
            self.keys, self.steps, self.flips, self.bcast
        )
    }
}

fn view_s() -> impl Strategy<Value = ViewS> {
    (
        any::<[u8; 3]>(),
        [1i64..4, 1i64..4, 1i64..4],
        any::<[bool; 3]>(),
        [prop::bool::weighted(0.15); 3],
    )
        .prop_map(|(keys, steps, flips, bcast)| ViewS {
            keys,
            steps,
            flips,
            bcast,
        })
}

struct View {
    base: Tensor,
    view: Tensor,
    /// Base element of each view element (row-major over the view).
    covered: Vec<usize>,
}

fn make_view(
    shape: &[i64],
    spec: &ViewS,
    allow_bcast: bool,
    ty: Ty,
    fill: &mut dyn FnMut() -> u64,
) -> View {
    let n = shape.len();
    let mut perm: Vec<usize> = (0..n).collect();
    perm.sort_by_key(|&d| spec.keys[d]);
    let bcast = |d: usize| allow_bcast && spec.bcast[d];
    let base_shape: Vec<i64> = (0..n)
        .map(|i| {
            if bcast(perm[i]) {
                1
            } else {
                shape[perm[i]] * spec.steps[i]
            }
        })
        .collect();
    let total = numel(&base_shape);
    let bits: Vec<u64> = (0..total).map(|_| fill()).collect();
    let base = tensor_from_bits(&bits, &base_shape, ty);
    let base_strides = base.strides().to_vec();
    let mut strides = vec![0i64; n];
    let mut offset = 0i64;
    for (i, &d) in perm.iter().enumerate() {
        if bcast(d) {
            continue;
        }
        let mut s = base_strides[i] * spec.steps[i];
        if spec.flips[i] {
            offset += (shape[d] - 1) * s;
            s = -s;
        }
        strides[d] = s;
    }
    let view = base.as_strided(shape, &strides, offset).unwrap();
    let covered = (0..numel(shape))
        .map(|f| {
            let idx = unflatten(f, shape);
            (offset + idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<i64>()) as usize
        })
        .collect();
    View {
        base,
        view,
        covered,
    }
}

// ---- schedules ----------------------------------------------------------------------------

/// A choice among `n` things (raw draw reduced modulo `n`; shrinks to the first).
#[derive(Clone, Copy, Debug)]
struct Ix(u8);

impl Ix {
    fn index(self, n: usize) -> usize {
        self.0 as usize % n
    }
}

fn ix() -> impl Strategy<Value = Ix> {
    any::<u8>().prop_map(Ix)
}

#[derive(Clone, Debug)]
enum SOp {
    Split(Ix, i64),
    SplitParts(Ix, i64),
    Fuse(Ix),
    Swap(Ix, Ix),
    ReduceFirst,
    Reverse,
    Tile(Ix, i64, i64),
}

#[derive(Clone, Debug)]
enum AOp {
    Unroll(Ix),
    /// Vectorize the innermost loop (of any extent), split by the factor first if given.
    Vectorize(Option<i64>),
    Parallel(Ix),
}

#[derive(Clone, Debug, Default)]
struct StageS {
    ops: Vec<SOp>,
    anns: Vec<AOp>,
}

#[derive(Clone, Debug)]
enum AttachS {
    Root,
    Inline,
    At(Ix),
}

#[derive(Clone)]
struct SchedS {
    out: StageS,
    prod: StageS,
    attach: AttachS,
}

impl fmt::Debug for SchedS {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SchedS {{\n  out: {:?},\n  prod: {:?},\n  attach: {:?} }}",
            self.out, self.prod, self.attach
        )
    }
}

fn stage_s() -> impl Strategy<Value = StageS> {
    let f = 1i64..8;
    let sop = prop_oneof![
        4 => (ix(), f.clone()).prop_map(|(i, f)| SOp::Split(i, f)),
        1 => (ix(), f.clone()).prop_map(|(i, f)| SOp::SplitParts(i, f)),
        2 => ix().prop_map(SOp::Fuse),
        3 => (ix(), ix()).prop_map(|(a, b)| SOp::Swap(a, b)),
        1 => Just(SOp::ReduceFirst),
        1 => Just(SOp::Reverse),
        1 => (ix(), f.clone(), f.clone()).prop_map(|(i, a, b)| SOp::Tile(i, a, b)),
    ];
    let aop = prop_oneof![
        ix().prop_map(AOp::Unroll),
        prop::option::of(f).prop_map(AOp::Vectorize),
        ix().prop_map(AOp::Parallel),
    ];
    (
        prop::collection::vec(sop, 0..6),
        prop::collection::vec(aop, 0..3),
    )
        .prop_map(|(ops, anns)| StageS { ops, anns })
}

fn sched_s() -> impl Strategy<Value = SchedS> {
    let attach = prop_oneof![
        1 => Just(AttachS::Root),
        1 => Just(AttachS::Inline),
        2 => ix().prop_map(AttachS::At),
    ];
    (stage_s(), stage_s(), attach).prop_map(|(out, prod, attach)| SchedS { out, prod, attach })
}

/// A loop of a stage as the test models it: constant extent when known.
#[derive(Clone, Debug)]
struct LeafM {
    var: Var,
    reduce: bool,
    ext: Option<i64>,
}

/// `Stage::reorder`'s semantics: the listed loops, in this order, in the positions they hold.
fn model_reorder(leaves: &mut [LeafM], order: &[Var]) {
    let mut pos: Vec<usize> = order
        .iter()
        .map(|v| leaves.iter().position(|l| &l.var == v).unwrap())
        .collect();
    let moved: Vec<LeafM> = pos.iter().map(|&p| leaves[p].clone()).collect();
    pos.sort_unstable();
    for (p, l) in pos.into_iter().zip(moved) {
        leaves[p] = l;
    }
}

/// Applies the structural ops then the annotations; only valid calls are made, and each must
/// be accepted. Returns the stage's final loops.
fn apply_stage(s: &mut Schedule, t: &Te, root_ext: &[Option<i64>], sp: &StageS) -> Vec<LeafM> {
    let roots: Vec<&IterVar> = t.axis().iter().chain(t.reduce_axis()).collect();
    let mut leaves: Vec<LeafM> = roots
        .iter()
        .zip(root_ext)
        .map(|(iv, &ext)| LeafM {
            var: iv.var.clone(),
            reduce: iv.reduce,
            ext,
        })
        .collect();
    let st = s.stage(t).unwrap();
    let split = |st: &mut rivet_compiler::schedule::Stage,
                 leaves: &mut Vec<LeafM>,
                 p: usize,
                 f: i64,
                 parts: bool| {
        let l = leaves[p].clone();
        let (o, i) = if parts {
            st.split(&l.var, None, Some(Expr::int(f))).unwrap()
        } else {
            st.split(&l.var, Some(Expr::int(f)), None).unwrap()
        };
        let (oe, ie) = if parts {
            (Some(f), l.ext.map(|e| (e + f - 1) / f))
        } else {
            (l.ext.map(|e| (e + f - 1) / f), Some(f))
        };
        leaves.splice(
            p..=p,
            [
                LeafM {
                    var: o,
                    reduce: l.reduce,
                    ext: oe,
                },
                LeafM {
                    var: i,
                    reduce: l.reduce,
                    ext: ie,
                },
            ],
        );
    };
    for op in &sp.ops {
        let n = leaves.len();
        if n == 0 {
            break;
        }
        match op {
            SOp::Split(ix, f) => split(st, &mut leaves, ix.index(n), *f, false),
            SOp::SplitParts(ix, f) => split(st, &mut leaves, ix.index(n), *f, true),
            SOp::Fuse(ix) => {
                if n < 2 {
                    continue;
                }
                let p = ix.index(n - 1);
                let (a, b) = (leaves[p].clone(), leaves[p + 1].clone());
                if a.reduce != b.reduce {
                    continue;
                }
                let v = st.fuse(&a.var, &b.var).unwrap();
                let ext = a.ext.zip(b.ext).map(|(x, y)| x * y);
                leaves.splice(
                    p..=p + 1,
                    [LeafM {
                        var: v,
                        reduce: a.reduce,
                        ext,
                    }],
                );
            }
            SOp::Swap(a, b) => {
                let mut order: Vec<Var> = leaves.iter().map(|l| l.var.clone()).collect();
                order.swap(a.index(n), b.index(n));
                st.reorder(&order).unwrap();
                model_reorder(&mut leaves, &order);
            }
            SOp::ReduceFirst | SOp::Reverse => {
                let mut order: Vec<Var> = Vec::new();
                if matches!(op, SOp::Reverse) {
                    order.extend(leaves.iter().rev().map(|l| l.var.clone()));
                } else {
                    order.extend(leaves.iter().filter(|l| l.reduce).map(|l| l.var.clone()));
                    order.extend(leaves.iter().filter(|l| !l.reduce).map(|l| l.var.clone()));
                }
                st.reorder(&order).unwrap();
                model_reorder(&mut leaves, &order);
            }
            SOp::Tile(ix, fx, fy) => {
                if n < 2 {
                    continue;
                }
                let p = ix.index(n - 1);
                let (x, y) = (leaves[p].clone(), leaves[p + 1].clone());
                let (xo, yo, xi, yi) = st
                    .tile(&x.var, &y.var, Expr::int(*fx), Expr::int(*fy))
                    .unwrap();
                let ceil = |e: Option<i64>, f: i64| e.map(|e| (e + f - 1) / f);
                leaves.splice(
                    p..=p + 1,
                    [
                        LeafM {
                            var: xo.clone(),
                            reduce: x.reduce,
                            ext: ceil(x.ext, *fx),
                        },
                        LeafM {
                            var: xi.clone(),
                            reduce: x.reduce,
                            ext: Some(*fx),
                        },
                        LeafM {
                            var: yo.clone(),
                            reduce: y.reduce,
                            ext: ceil(y.ext, *fy),
                        },
                        LeafM {
                            var: yi.clone(),
                            reduce: y.reduce,
                            ext: Some(*fy),
                        },
                    ],
                );
                model_reorder(&mut leaves, &[xo, yo, xi, yi]);
            }
        }
    }
    for ann in &sp.anns {
        let n = leaves.len();
        if n == 0 {
            break;
        }
        match ann {
            AOp::Unroll(ix) => {
                let cands: Vec<usize> = (0..n).filter(|&p| leaves[p].ext.is_some()).collect();
                if !cands.is_empty() {
                    st.unroll(&leaves[cands[ix.index(cands.len())]].var)
                        .unwrap();
                }
            }
            AOp::Vectorize(f) => {
                if leaves[n - 1].reduce {
                    continue;
                }
                if let Some(f) = f {
                    split(st, &mut leaves, n - 1, *f, false);
                }
                st.vectorize(&leaves[leaves.len() - 1].var).unwrap();
            }
            AOp::Parallel(ix) => {
                let cands: Vec<usize> = (0..n).filter(|&p| !leaves[p].reduce).collect();
                if !cands.is_empty() {
                    st.parallel(&leaves[cands[ix.index(cands.len())]].var)
                        .unwrap();
                }
            }
        }
    }
    leaves
}

// ---- programs -----------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct DimS {
    n: i64,
    sym: bool,
}

fn dims(rank: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<DimS>> {
    prop::collection::vec(
        (1i64..7, prop::bool::weighted(0.4)).prop_map(|(n, sym)| DimS { n, sym }),
        rank,
    )
}

/// How an input is read: broadcast dims (size 1, read at 0) and reversed dims.
#[derive(Clone, Debug)]
struct ReadS {
    bcast: [bool; 3],
    flip: [bool; 3],
}

fn read_s() -> impl Strategy<Value = ReadS> {
    (
        [prop::bool::weighted(0.15); 3],
        [prop::bool::weighted(0.2); 3],
    )
        .prop_map(|(bcast, flip)| ReadS { bcast, flip })
}

struct Input {
    te: Te,
    shape: Vec<i64>,
    used: bool,
}

/// Logical bits of every input (by slot) -> canonical bits of the expected output.
type Reference = Box<dyn Fn(&[Vec<u64>]) -> Vec<u64>>;

/// A program ready to run, with its reference.
struct Prog {
    main: Ty,
    inputs: Vec<Input>,
    out: Te,
    out_shape: Vec<i64>,
    out_ty: Ty,
    producer: Option<Te>,
    out_root: Vec<Option<i64>>,
    prod_root: Vec<Option<i64>>,
    /// Scheduled vs unscheduled compared as values (float max/min: ties of 0.0 and -0.0).
    value_eq: bool,
    reference: Reference,
}

fn dim_exprs(dims: &[DimS]) -> Vec<Expr> {
    dims.iter()
        .enumerate()
        .map(|(d, x)| {
            if x.sym {
                te::var(&format!("n{d}"))
            } else {
                Expr::int(x.n)
            }
        })
        .collect()
}

/// The index at which an input of extents `ext` is read for domain index `i`.
fn input_index(i: &[Expr], ext: &[Expr], rs: &ReadS) -> Vec<Expr> {
    (0..i.len())
        .map(|d| {
            if rs.bcast[d] {
                Expr::int(0)
            } else if rs.flip[d] {
                &ext[d] - 1 - &i[d]
            } else {
                i[d].clone()
            }
        })
        .collect()
}

fn input_index_v(i: &[i64], ext: &[i64], rs: &ReadS) -> Vec<i64> {
    (0..i.len())
        .map(|d| {
            if rs.bcast[d] {
                0
            } else if rs.flip[d] {
                ext[d] - 1 - i[d]
            } else {
                i[d]
            }
        })
        .collect()
}

/// Elementwise programs: `C = tree(inputs)`, or with a producer `P = ptree(inputs)` over
/// the domain grown by `halo`, and `C = tree(P at offsets, inputs)`.
#[derive(Clone)]
struct EwCase {
    main: Ty,
    dims: Vec<DimS>,
    n_in: u8,
    reads: Vec<ReadS>,
    tree: E,
    producer: Option<(E, [i64; 3], Vec<[i64; 3]>)>,
}

impl fmt::Debug for EwCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EwCase {{\n  main: {:?}, dims: {:?}, n_in: {}, reads: {:?},\n  tree: {:?},\n  producer: {:?} }}",
            self.main, self.dims, self.n_in, self.reads, self.tree, self.producer
        )
    }
}

fn ew_case(main: Ty, two_stage: bool) -> impl Strategy<Value = EwCase> {
    let prod = if two_stage {
        (
            tree(main, 3, main),
            [0i64..3, 0i64..3, 0i64..3],
            prop::collection::vec(any::<[u8; 3]>(), 1..4),
        )
            .prop_map(|(t, halo, offs)| {
                let offs = offs
                    .iter()
                    .map(|o| [0, 1, 2].map(|d| o[d] as i64 % (halo[d] + 1)))
                    .collect();
                Some((t, halo, offs))
            })
            .boxed()
    } else {
        Just(None).boxed()
    };
    (
        dims(1..=3),
        1u8..4,
        prop::collection::vec(read_s(), 3),
        rooted_tree(main, if two_stage { 3 } else { 4 }),
        prod,
    )
        .prop_map(move |(dims, n_in, reads, tree, producer)| EwCase {
            main,
            dims,
            n_in,
            reads,
            tree,
            producer,
        })
}

fn build_ew(c: &EwCase) -> Prog {
    let main = c.main;
    let rank = c.dims.len();
    let out_shape: Vec<i64> = c.dims.iter().map(|d| d.n).collect();
    let out_ext = dim_exprs(&c.dims);
    let halo: Vec<i64> = (0..rank)
        .map(|d| c.producer.as_ref().map_or(0, |p| p.1[d]))
        .collect();
    // Inputs span the producer's domain (the output's, grown by the halo).
    let dom_shape: Vec<i64> = (0..rank).map(|d| out_shape[d] + halo[d]).collect();
    let dom_ext: Vec<Expr> = (0..rank)
        .map(|d| {
            if halo[d] == 0 {
                out_ext[d].clone()
            } else {
                &out_ext[d] + halo[d]
            }
        })
        .collect();
    let reads: Vec<ReadS> = c.reads.clone();
    let n_in = c.n_in;
    let (tree, ptree) = match &c.producer {
        None => (c.tree.norm(n_in, 1, rank as u8), None),
        Some((pt, _, offs)) => {
            let ptree = pt.norm(n_in, 1, rank as u8).with_read(0, main);
            let tree = c
                .tree
                .norm(n_in + 1, offs.len() as u8, rank as u8)
                .with_read(0, main);
            (tree, Some(ptree))
        }
    };
    let offs: Vec<[i64; 3]> = c.producer.as_ref().map_or(vec![[0; 3]], |p| p.2.clone());
    let mut used = HashSet::new();
    match &ptree {
        None => tree.slots(&mut used),
        Some(pt) => {
            pt.slots(&mut used);
            let mut cu = HashSet::new();
            tree.slots(&mut cu);
            used.extend(cu.into_iter().filter(|&s| s > 0).map(|s| s - 1));
        }
    }
    let in_shapes: Vec<Vec<i64>> = (0..n_in as usize)
        .map(|k| {
            (0..rank)
                .map(|d| if reads[k].bcast[d] { 1 } else { dom_shape[d] })
                .collect()
        })
        .collect();
    let inputs: Vec<Input> = (0..n_in as usize)
        .map(|k| {
            let ext: Vec<Expr> = (0..rank)
                .map(|d| {
                    if reads[k].bcast[d] {
                        Expr::int(1)
                    } else {
                        dom_ext[d].clone()
                    }
                })
                .collect();
            Input {
                te: te::placeholder(&ext, main.dtype(), &format!("A{k}")).unwrap(),
                shape: in_shapes[k].clone(),
                used: used.contains(&(k as u8)),
            }
        })
        .collect();
    let in_te: Vec<Te> = inputs.iter().map(|i| i.te.clone()).collect();
    let read_input = {
        let in_te = in_te.clone();
        let reads = reads.clone();
        move |k: usize, i: &[Expr]| in_te[k].at(input_index(i, in_te[k].shape(), &reads[k]))
    };
    let (out, producer) = match &ptree {
        None => {
            let c_te = te::compute_dyn(
                &out_ext,
                |i| tree.te(&|s, _| read_input(s as usize, i), i),
                "C",
            )
            .unwrap();
            (c_te, None)
        }
        Some(pt) => {
            let p = te::compute_dyn(
                &dom_ext,
                |j| pt.te(&|s, _| read_input(s as usize, j), j),
                "P",
            )
            .unwrap();
            let c_te = te::compute_dyn(
                &out_ext,
                |i| {
                    tree.te(
                        &|s, o| {
                            if s == 0 {
                                let at: Vec<Expr> =
                                    (0..rank).map(|d| &i[d] + offs[o as usize][d]).collect();
                                p.at(at)
                            } else {
                                read_input(s as usize - 1, i)
                            }
                        },
                        i,
                    )
                },
                "C",
            )
            .unwrap();
            (c_te, Some(p))
        }
    };
    let fixed = |shape: &[i64], sym: &dyn Fn(usize) -> bool| -> Vec<Option<i64>> {
        (0..shape.len())
            .map(|d| if sym(d) { None } else { Some(shape[d]) })
            .collect()
    };
    let out_root = fixed(&out_shape, &|d| c.dims[d].sym);
    let prod_root = fixed(&dom_shape, &|d| c.dims[d].sym);
    let out_ty = tree.ty();
    let reference = {
        let (out_shape, dom_shape, in_shapes) =
            (out_shape.clone(), dom_shape.clone(), in_shapes.clone());
        Box::new(move |data: &[Vec<u64>]| -> Vec<u64> {
            let rd_in = |k: usize, i: &[i64]| {
                let at = input_index_v(i, &dom_shape, &reads[k]);
                V::from_bits(data[k][flatten(&at, &in_shapes[k])], main)
            };
            (0..numel(&out_shape))
                .map(|f| {
                    let i = unflatten(f, &out_shape);
                    let v = match &ptree {
                        None => tree.eval(&|s, _| rd_in(s as usize, &i), &i),
                        Some(pt) => tree.eval(
                            &|s, o| {
                                if s == 0 {
                                    let j: Vec<i64> =
                                        (0..rank).map(|d| i[d] + offs[o as usize][d]).collect();
                                    pt.eval(&|s2, _| rd_in(s2 as usize, &j), &j)
                                } else {
                                    rd_in(s as usize - 1, &i)
                                }
                            },
                            &i,
                        ),
                    };
                    v.bits()
                })
                .collect()
        })
    };
    Prog {
        main,
        inputs,
        out,
        out_shape,
        out_ty,
        producer,
        out_root,
        prod_root,
        value_eq: false,
        reference,
    }
}

/// Reductions: `C[kept] = op over reduced dims of q(tree(inputs))`, or of `q(tree(P,
/// inputs))` with an elementwise producer `P = ptree(inputs)` over the whole domain. `q`
/// quantises float sums to integers in [-8, 8] and float products to {2, 1, -1, -0.5}, so
/// every accumulation order gives the same bits.
#[derive(Clone)]
struct RedCase {
    main: Ty,
    dims: Vec<DimS>,
    red: (Ix, Ix, bool),
    /// Reduction axes start at 1 instead of 0 (possibly empty ranges).
    lo: [bool; 2],
    op: ReduceOp,
    n_in: u8,
    flips: Vec<[bool; 3]>,
    tree: E,
    producer: Option<E>,
}

impl fmt::Debug for RedCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RedCase {{\n  main: {:?}, dims: {:?}, red: {:?}, lo: {:?}, op: {:?}, n_in: {}, flips: {:?},\n  tree: {:?},\n  producer: {:?} }}",
            self.main, self.dims, self.red, self.lo, self.op, self.n_in, self.flips, self.tree, self.producer
        )
    }
}

fn red_case(main: Ty, two_stage: bool) -> impl Strategy<Value = RedCase> {
    let prod = if two_stage {
        tree(main, 3, main).prop_map(Some).boxed()
    } else {
        Just(None).boxed()
    };
    (
        dims(2..=3),
        (ix(), ix(), any::<bool>()),
        [prop::bool::weighted(0.25); 2],
        select(vec![
            ReduceOp::Sum,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Prod,
        ]),
        1u8..3,
        prop::collection::vec([prop::bool::weighted(0.25); 3], 2),
        tree(main, 3, main),
        prod,
    )
        .prop_map(
            move |(dims, red, lo, op, n_in, flips, tree, producer)| RedCase {
                main,
                dims,
                red,
                lo,
                op,
                n_in,
                flips,
                tree,
                producer,
            },
        )
}

fn quantise(op: ReduceOp, e: E) -> E {
    let ty = e.ty();
    if !ty.is_float() {
        return e;
    }
    let c = |v: f64| bx(E::C(ty, v));
    match op {
        ReduceOp::Sum => E::Bin(
            BinOp::Max,
            bx(E::Bin(BinOp::Min, bx(E::Un(UnOp::Floor, bx(e))), c(8.0))),
            c(-8.0),
        ),
        ReduceOp::Prod => {
            let cmp = |op: CmpOp, v: f64| bx(E::Cmp(op, bx(e.clone()), c(v)));
            E::Sel(
                cmp(CmpOp::Gt, 1.0),
                c(2.0),
                bx(E::Sel(
                    cmp(CmpOp::Lt, -1.0),
                    c(-0.5),
                    bx(E::Sel(cmp(CmpOp::Gt, 0.0), c(1.0), c(-1.0))),
                )),
            )
        }
        ReduceOp::Max | ReduceOp::Min => e,
    }
}

fn build_red(c: &RedCase) -> Prog {
    let main = c.main;
    let rank = c.dims.len();
    let shape: Vec<i64> = c.dims.iter().map(|d| d.n).collect();
    let ext = dim_exprs(&c.dims);
    let d1 = c.red.0.index(rank);
    let mut red = vec![d1];
    if c.red.2 {
        let rest: Vec<usize> = (0..rank).filter(|&d| d != d1).collect();
        red.push(rest[c.red.1.index(rest.len())]);
    }
    let kept: Vec<usize> = (0..rank).filter(|d| !red.contains(d)).collect();
    let out_shape: Vec<i64> = kept.iter().map(|&d| shape[d]).collect();
    let out_ext: Vec<Expr> = kept.iter().map(|&d| ext[d].clone()).collect();
    let n_in = c.n_in;
    let reads: Vec<ReadS> = c
        .flips
        .iter()
        .map(|f| ReadS {
            bcast: [false; 3],
            flip: *f,
        })
        .collect();
    // Input 0 is always read, so that every symbolic dim is bound by an argument.
    let (tree, ptree) = match &c.producer {
        None => (
            quantise(c.op, c.tree.norm(n_in, 1, rank as u8).with_read(0, main)),
            None,
        ),
        Some(pt) => {
            let ptree = pt.norm(n_in, 1, rank as u8).with_read(0, main);
            (
                quantise(
                    c.op,
                    c.tree.norm(n_in + 1, 1, rank as u8).with_read(0, main),
                ),
                Some(ptree),
            )
        }
    };
    let mut used = HashSet::new();
    match &ptree {
        None => tree.slots(&mut used),
        Some(pt) => {
            pt.slots(&mut used);
            let mut cu = HashSet::new();
            tree.slots(&mut cu);
            used.extend(cu.into_iter().filter(|&s| s > 0).map(|s| s - 1));
        }
    }
    let inputs: Vec<Input> = (0..n_in as usize)
        .map(|k| Input {
            te: te::placeholder(&ext, main.dtype(), &format!("A{k}")).unwrap(),
            shape: shape.clone(),
            used: used.contains(&(k as u8)),
        })
        .collect();
    let in_te: Vec<Te> = inputs.iter().map(|i| i.te.clone()).collect();
    let read_input = {
        let in_te = in_te.clone();
        let reads = reads.clone();
        move |k: usize, i: &[Expr]| in_te[k].at(input_index(i, in_te[k].shape(), &reads[k]))
    };
    let lo: Vec<i64> = (0..red.len()).map(|k| c.lo[k] as i64).collect();
    let raxes: Vec<IterVar> = red
        .iter()
        .zip(&lo)
        .map(|(&d, &l)| te::reduce_axis(l, &ext[d], &format!("r{d}")).unwrap())
        .collect();
    let producer = ptree.as_ref().map(|pt| {
        te::compute_dyn(&ext, |j| pt.te(&|s, _| read_input(s as usize, j), j), "P").unwrap()
    });
    let full = |i: &[Expr]| -> Vec<Expr> {
        (0..rank)
            .map(|d| match red.iter().position(|&r| r == d) {
                Some(k) => Expr::from(&raxes[k]),
                None => i[kept.iter().position(|&x| x == d).unwrap()].clone(),
            })
            .collect()
    };
    let out = te::compute_dyn(
        &out_ext,
        |i| {
            let j = full(i);
            let body = tree.te(
                &|s, _| match &producer {
                    Some(p) if s == 0 => p.at(&j),
                    Some(_) => read_input(s as usize - 1, &j),
                    None => read_input(s as usize, &j),
                },
                &j,
            );
            te::reduction(c.op, body, &raxes)
        },
        "C",
    )
    .unwrap();
    let fixed = |d: usize| if c.dims[d].sym { None } else { Some(shape[d]) };
    let out_root: Vec<Option<i64>> = kept
        .iter()
        .map(|&d| fixed(d))
        .chain(red.iter().zip(&lo).map(|(&d, &l)| fixed(d).map(|n| n - l)))
        .collect();
    let prod_root: Vec<Option<i64>> = (0..rank).map(fixed).collect();
    let op = c.op;
    let reference = {
        let out_shape = out_shape.clone();
        Box::new(move |data: &[Vec<u64>]| -> Vec<u64> {
            let rd_in = |k: usize, j: &[i64]| {
                V::from_bits(
                    data[k][flatten(&input_index_v(j, &shape, &reads[k]), &shape)],
                    main,
                )
            };
            let red_shape: Vec<i64> = red.iter().zip(&lo).map(|(&d, &l)| shape[d] - l).collect();
            (0..numel(&out_shape))
                .map(|f| {
                    let i = unflatten(f, &out_shape);
                    let mut acc = match (op, main) {
                        (ReduceOp::Sum, t) => const_v(t, 0.0),
                        (ReduceOp::Prod, t) => const_v(t, 1.0),
                        (ReduceOp::Max, Ty::I32) => V::I(i32::MIN),
                        (ReduceOp::Min, Ty::I32) => V::I(i32::MAX),
                        (ReduceOp::Max, t) => const_v(t, f64::NEG_INFINITY),
                        (ReduceOp::Min, t) => const_v(t, f64::INFINITY),
                    };
                    for r in 0..numel(&red_shape) {
                        let ri = unflatten(r, &red_shape);
                        let j: Vec<i64> = (0..rank)
                            .map(|d| match red.iter().position(|&x| x == d) {
                                Some(k) => ri[k] + lo[k],
                                None => i[kept.iter().position(|&x| x == d).unwrap()],
                            })
                            .collect();
                        let v = tree.eval(
                            &|s, _| match &ptree {
                                Some(pt) if s == 0 => pt.eval(&|s2, _| rd_in(s2 as usize, &j), &j),
                                Some(_) => rd_in(s as usize - 1, &j),
                                None => rd_in(s as usize, &j),
                            },
                            &j,
                        );
                        let bop = match op {
                            ReduceOp::Sum => BinOp::Add,
                            ReduceOp::Prod => BinOp::Mul,
                            ReduceOp::Max => BinOp::Max,
                            ReduceOp::Min => BinOp::Min,
                        };
                        acc = bin_v(bop, acc, v);
                    }
                    acc.bits()
                })
                .collect()
        })
    };
    let value_eq = main.is_float() && matches!(op, ReduceOp::Max | ReduceOp::Min);
    Prog {
        main,
        inputs,
        out,
        out_shape,
        out_ty: main,
        producer,
        out_root,
        prod_root,
        value_eq,
        reference,
    }
}

// ---- running ------------------------------------------------------------------------------

fn schedule(p: &Prog, sc: &SchedS) -> Schedule {
    let mut s = Schedule::new(&[p.out.clone()]).unwrap();
    let out_leaves = apply_stage(&mut s, &p.out, &p.out_root, &sc.out);
    if let Some(prod) = &p.producer {
        match &sc.attach {
            AttachS::Root => {
                apply_stage(&mut s, prod, &p.prod_root, &sc.prod);
            }
            AttachS::Inline => s.compute_inline(prod).unwrap(),
            AttachS::At(ix) => {
                // Under compute_at the producer's loops cover a region whose extents are
                // expressions: only split-inner loops have constant extents.
                apply_stage(&mut s, prod, &vec![None; p.prod_root.len()], &sc.prod);
                s.compute_at(prod, &p.out, &out_leaves[ix.index(out_leaves.len())].var)
                    .unwrap();
            }
        }
    }
    s
}

/// Known bugs (each has a minimal repro among the plain tests at the end of this file):
/// a failure matching one of them skips the case when `RIVET_PROPS_SKIP_KNOWN=1`, so that
/// the properties can look for other bugs meanwhile. By default every failure fails.
fn known_bug(err: &str, call: bool) -> Option<&'static str> {
    if std::env::var("RIVET_PROPS_SKIP_KNOWN").map_or(true, |v| v != "1") {
        return None;
    }
    const KNOWN: [(&str, &str); 6] = [
        (
            "needs a constant extent",
            "unrolled/vectorized fused loop: verifier ICE",
        ),
        (
            "out-of-bounds access for these shapes",
            "false run-time bounds check",
        ),
        (
            "rivet cannot bound that index expression",
            "bounds proof cannot bound index",
        ),
        (
            "cannot bound the region it reads",
            "compute_at region unbounded",
        ),
        (
            "and rivet cannot prove it",
            "bounds proof cannot prove index",
        ),
        ("(out of bounds)", "bounds proof refutes an in-bounds index"),
    ];
    // The run-time check is a call error; the others are build errors.
    KNOWN
        .iter()
        .find(|(pat, _)| err.contains(pat) && call == pat.starts_with("out-of-bounds access"))
        .map(|(_, what)| *what)
}

fn skip_known(err: &str, call: bool) -> bool {
    match known_bug(err, call) {
        Some(what) => {
            if std::env::var_os("RIVET_PROPS_VERBOSE").is_some() {
                eprintln!(
                    "skipped (known bug: {what}): {}",
                    err.lines().next().unwrap_or("")
                );
            }
            true
        }
        None => false,
    }
}

/// The program has a symbolic dim (in the output's or the producer's root domain).
fn symbolic(p: &Prog) -> bool {
    p.out_root.iter().chain(&p.prod_root).any(|d| d.is_none())
}

/// A build refusal that says the proof could not bound an access (as opposed to refuting it).
fn conservative_refusal(err: &str) -> bool {
    [
        "rivet cannot bound that index expression",
        "and rivet cannot prove it",
        "cannot bound the region it reads",
        // A symbolic compute_at region clamped to its tensor (`max`/`min` of outer loops):
        // the no-overflow proof may not bound the clamped form (a case the soak found).
        "rivet cannot prove that the int64 arithmetic",
    ]
    .iter()
    .any(|pat| err.contains(pat))
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

/// First differing element of two canonical bit vectors.
fn first_diff(a: &[u64], b: &[u64], ty: Ty, value: bool) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("lengths {} and {}", a.len(), b.len()));
    }
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| {
            if value {
                !value_eq(**x, **y, ty)
            } else {
                x != y
            }
        })
        .map(|(i, (x, y))| {
            let n = a
                .iter()
                .zip(b)
                .filter(|(x, y)| {
                    if value {
                        !value_eq(**x, **y, ty)
                    } else {
                        x != y
                    }
                })
                .count();
            format!(
                "element {i}: {} vs {} ({n} of {} elements differ)",
                fmt_bits(*x, ty),
                fmt_bits(*y, ty),
                a.len()
            )
        })
}

fn run_case(p: &Prog, sc: &SchedS, views: &[ViewS], seed: u64) -> Result<(), TestCaseError> {
    run_case_with(p, sc, views, seed, false)
}

/// `run_case`; with `fma` both builds contract `a * b + c` (`Options::fma`): the Rust
/// reference computes unfused maths, so it is not compared, but every backend must still
/// equal the interpreter bit for bit, scheduled or not.
fn run_case_with(
    p: &Prog,
    sc: &SchedS,
    views: &[ViewS],
    seed: u64,
    fma: bool,
) -> Result<(), TestCaseError> {
    let build = |s: &Schedule, args: &[Te], target: &rivet_compiler::Target, name: &str| {
        let mut o = rivet_compiler::build::Options::from_env();
        o.fma = fma;
        // The schedules here, untouched ones included, are compared bit for bit with the
        // interpreter and the Rust reference as written; the default CPU schedule (which
        // inlines and reassociates) has its own properties in tests/tests/schedule_cpu_default.rs.
        o.as_written = true;
        rivet_compiler::build::build_with(s, args, target, name, o)
    };
    let mut rng = Rng(seed);
    let main = p.main;
    // Inputs: random strided views over bigger buffers; `logical` is what the program sees.
    let mut logical: Vec<Vec<u64>> = Vec::new();
    let mut strided: Vec<Tensor> = Vec::new();
    let mut compact: Vec<Tensor> = Vec::new();
    for (k, inp) in p.inputs.iter().enumerate() {
        let v = make_view(&inp.shape, &views[k], true, main, &mut || {
            random_value(main, &mut rng).bits_raw()
        });
        let bits = tensor_bits(&v.view, main);
        compact.push(tensor_from_bits(&bits, &inp.shape, main));
        strided.push(v.view);
        logical.push(bits);
    }
    let want: Vec<u64> = (p.reference)(&logical);
    let args: Vec<Te> = p
        .inputs
        .iter()
        .filter(|i| i.used)
        .map(|i| i.te.clone())
        .chain([p.out.clone()])
        .collect();
    let used_vals = |ts: &[Tensor]| -> Vec<Value> {
        p.inputs
            .iter()
            .zip(ts)
            .filter(|(i, _)| i.used)
            .map(|(_, t)| Value::Tensor(t.clone()))
            .collect()
    };
    let out_ty = p.out_ty;
    let poison = |rng: &mut Rng| -> u64 {
        match out_ty {
            Ty::F32 => (1000.0f32 + r_small(rng)).to_bits() as u64,
            Ty::F64 => (1000.0f64 + r_small(rng) as f64).to_bits(),
            Ty::I32 => 0x5A5A_0000 | rng.below(0x10000),
            Ty::Bool => rng.below(2),
        }
    };
    let canon_all = |v: Vec<u64>| -> Vec<u64> { v.into_iter().map(|b| canon(b, out_ty)).collect() };

    // Unscheduled, compact: the reference and both backends agree bit for bit.
    let s0 = Schedule::new(&[p.out.clone()]).unwrap();
    let mut plain: Vec<Vec<u64>> = Vec::new();
    for target in backends() {
        let m = build(&s0, &args, &target, "f")
            .map_err(|e| fail(format!("{target}: unscheduled build failed: {e}")))?;
        let f = m.get_function("f").unwrap();
        let out_bits: Vec<u64> = (0..numel(&p.out_shape)).map(|_| poison(&mut rng)).collect();
        let out = tensor_from_bits(&out_bits, &p.out_shape, out_ty);
        let mut vals = used_vals(&compact);
        vals.push(Value::Tensor(out.clone()));
        f.call(&vals)
            .map_err(|e| fail(format!("{target}: unscheduled call failed: {e}")))?;
        plain.push(canon_all(tensor_bits(&out, out_ty)));
    }
    if let Some(d) = first_diff(&want, &plain[0], out_ty, false).filter(|_| !fma) {
        return Err(fail(format!("Rust reference vs unscheduled interp: {d}")));
    }
    for (target, other) in backends().iter().zip(&plain).skip(1) {
        if let Some(d) = first_diff(&plain[0], other, out_ty, false) {
            return Err(fail(format!("unscheduled: interp vs {target}: {d}")));
        }
    }

    // Scheduled, strided inputs and output.
    let s1 = schedule(p, sc);
    let mut got: Vec<Vec<u64>> = Vec::new();
    let mut ir = String::new();
    for target in backends() {
        let m = match build(&s1, &args, &target, "f") {
            Ok(m) => m,
            Err(e) if skip_known(&e.to_string(), false) => return Ok(()),
            // Documented limitation (docs/safety.md): with symbolic dims the
            // proof may refuse a valid schedule it cannot bound (compute_at into fused/split
            // loops, division by a symbolic extent of unknown sign). A refusal is safe — never
            // wrong code — and only accepted for symbolic programs; static shapes must build.
            Err(e) if symbolic(p) && conservative_refusal(&e.to_string()) => {
                if std::env::var_os("RIVET_PROPS_VERBOSE").is_some() {
                    eprintln!(
                        "refused (symbolic, conservative): {}",
                        e.to_string().lines().next().unwrap_or("")
                    );
                }
                return Ok(());
            }
            Err(e) => return Err(fail(format!("{target}: scheduled build failed: {e}"))),
        };
        if ir.is_empty() {
            ir = m.get_source("ir").unwrap();
        }
        let f = m.get_function("f").unwrap();
        let mut prng = Rng(seed ^ 0xABCD);
        let ov = make_view(&p.out_shape, &views[3], false, out_ty, &mut || {
            poison(&mut prng)
        });
        let before = tensor_bits(&ov.base, out_ty);
        let mut vals = used_vals(&strided);
        vals.push(Value::Tensor(ov.view.clone()));
        match f.call(&vals) {
            Ok(_) => {}
            Err(e) if skip_known(&e.to_string(), true) => return Ok(()),
            Err(e) => return Err(fail(format!("{target}: scheduled call failed: {e}\n{ir}"))),
        }
        let after = tensor_bits(&ov.base, out_ty);
        let inside: HashSet<usize> = ov.covered.iter().copied().collect();
        for (i, (a, b)) in after.iter().zip(&before).enumerate() {
            if !inside.contains(&i) && a != b {
                return Err(fail(format!(
                    "{target}: element {i} of the output buffer outside the view was written: {} -> {}\n{ir}",
                    fmt_bits(*b, out_ty),
                    fmt_bits(*a, out_ty)
                )));
            }
        }
        got.push(canon_all(tensor_bits(&ov.view, out_ty)));
    }
    for (target, other) in backends().iter().zip(&got).skip(1) {
        if let Some(d) = first_diff(&got[0], other, out_ty, false) {
            return Err(fail(format!("scheduled: interp vs {target}: {d}\n{ir}")));
        }
    }
    // With `fma`, inlining a producer is another computation, not another order: its product
    // then meets the consumer's addition inside one expression and is contracted into one
    // rounding, where the unscheduled program rounds the stored product first
    // (docs/tolerance.md: only the reference rule holds against another contraction). The
    // backends still agree bit for bit under that schedule (checked above).
    let inlined_with_fma = fma && matches!(sc.attach, AttachS::Inline);
    if let Some(d) =
        first_diff(&plain[0], &got[0], out_ty, p.value_eq).filter(|_| !inlined_with_fma)
    {
        return Err(fail(format!(
            "unscheduled vs scheduled (interp): {d}\n{ir}"
        )));
    }
    if std::env::var_os("RIVET_PROPS_STATS").is_some() {
        let nan = got[0]
            .iter()
            .filter(|&&b| {
                matches!(V::from_bits(b, out_ty), V::F(x) if x.is_nan())
                    || matches!(V::from_bits(b, out_ty), V::D(x) if x.is_nan())
            })
            .count();
        let distinct: HashSet<u64> = got[0].iter().copied().collect();
        let kinds: Vec<&str> = [
            "parallel",
            "vectorized",
            "unrolled",
            "allocate",
            "if ",
            "check",
            "//",
        ]
        .into_iter()
        .filter(|k| ir.contains(k))
        .collect();
        eprintln!(
            "STATS ty={out_ty:?} n={} nan={nan} distinct={} kinds={kinds:?}",
            got[0].len(),
            distinct.len()
        );
        if distinct.len() == 1 && got[0].len() > 1 {
            eprintln!(
                "CONST {:?} {}",
                p.out.body().unwrap(),
                fmt_bits(got[0][0], out_ty)
            );
        }
    }
    Ok(())
}

fn r_small(rng: &mut Rng) -> f32 {
    rng.below(4096) as f32 * 0.25
}

impl V {
    /// Raw bits (NaN payloads kept), for filling buffers.
    fn bits_raw(self) -> u64 {
        match self {
            V::F(f) => f.to_bits() as u64,
            V::D(d) => d.to_bits(),
            V::I(i) => i as u32 as u64,
            V::B(b) => b as u64,
        }
    }
}

/// `cases` per property, or `PROPTEST_CASES` when set (for long runs).
fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    }
}

fn views() -> impl Strategy<Value = Vec<ViewS>> {
    prop::collection::vec(view_s(), 4)
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn elementwise_f32(c in ew_case(Ty::F32, false), sc in sched_s(), v in views(), seed in any::<u64>()) {
        run_case(&build_ew(&c), &sc, &v, seed)?;
    }
}

proptest! {
    #![proptest_config(config(150))]

    #[test]
    fn elementwise_f64(c in ew_case(Ty::F64, false), sc in sched_s(), v in views(), seed in any::<u64>()) {
        run_case(&build_ew(&c), &sc, &v, seed)?;
    }

    #[test]
    fn elementwise_i32(c in ew_case(Ty::I32, false), sc in sched_s(), v in views(), seed in any::<u64>()) {
        run_case(&build_ew(&c), &sc, &v, seed)?;
    }
}

// ---- GPU schedules, run by the interpreter with GPU semantics ---------------------------------

/// A GPU schedule: the first data axis split by `f0` (outer to blockIdx.x, inner to
/// threadIdx.x), the second (when `two_d`) by `f1` (blockIdx.y / threadIdx.y); other loops
/// serial inside; intermediate stages inlined where they can be, else bound the same way.
/// With `cross`, a stage with a reduction is a cross-thread reduction: its first reduction
/// axis split by that many threads (a power of two when the block has several rows of
/// threads, halved until the block fits in 1024), the inner part on threadIdx.x and the data
/// axes' inner parts on threadIdx.y / z.
#[derive(Clone, Debug)]
struct GpuS {
    f0: i64,
    f1: i64,
    two_d: bool,
    inline_producers: bool,
    /// The default GPU schedule (`apply_default_gpu`) instead of the above.
    default: bool,
    cross: Option<i64>,
}

fn gpu_s() -> impl Strategy<Value = GpuS> {
    (
        prop::sample::select(vec![1i64, 2, 3, 8, 32, 64]),
        prop::sample::select(vec![1i64, 2, 4, 16]),
        any::<bool>(),
        any::<bool>(),
        prop::sample::select(vec![false, false, true]),
        prop::sample::select(vec![
            None,
            Some(1i64),
            Some(2),
            Some(3),
            Some(8),
            Some(32),
            Some(33),
            Some(64),
        ]),
    )
        .prop_map(|(f0, f1, two_d, inline_producers, default, cross)| GpuS {
            f0,
            f1,
            two_d,
            inline_producers,
            default,
            cross,
        })
}

fn bind_stage(s: &mut Schedule, t: &Te, g: &GpuS) {
    use rivet_compiler::ir::ThreadTag;
    let axes = t.axis();
    if axes.is_empty() {
        return;
    }
    let reduce = t.reduce_axis();
    let cross = g
        .cross
        .filter(|_| !reduce.is_empty() && reduce[0].extent.as_int() != Some(0));
    let two_d = g.two_d && axes.len() >= 2;
    let (ty, tz) = if cross.is_some() {
        (ThreadTag::ThreadY, ThreadTag::ThreadZ)
    } else {
        (ThreadTag::ThreadX, ThreadTag::ThreadY)
    };
    let st = s.stage(t).unwrap();
    let (o0, i0) = st.split(&axes[0].var, Some(Expr::int(g.f0)), None).unwrap();
    let mut blocks = vec![(o0, ThreadTag::BlockX)];
    let mut threads = vec![(i0, ty)];
    if two_d {
        let (o1, i1) = st.split(&axes[1].var, Some(Expr::int(g.f1)), None).unwrap();
        blocks.push((o1, ThreadTag::BlockY));
        threads.push((i1, tz));
    }
    if let Some(mut x) = cross {
        let groups = g.f0 * if two_d { g.f1 } else { 1 };
        if groups > 1 && x.count_ones() != 1 {
            x = (x as u64).next_power_of_two() as i64;
        }
        // A constant axis shorter than the split clamps the thread count to its extent: keep
        // that a power of two too.
        if let (true, Some(k)) = (groups > 1, reduce[0].extent.as_int()) {
            x = x.min(1 << (63 - k.leading_zeros()));
        }
        while x > 1 && groups * x > 1024 {
            x /= 2;
        }
        let (_, ri) = st.split(&reduce[0].var, Some(Expr::int(x)), None).unwrap();
        threads.push((ri, ThreadTag::ThreadX));
    }
    let bound: Vec<Var> = blocks
        .iter()
        .chain(&threads)
        .map(|(v, _)| v.clone())
        .collect();
    let mut order = bound.clone();
    order.extend(
        st.leaves
            .iter()
            .map(|l| l.var.clone())
            .filter(|v| !bound.contains(v)),
    );
    st.reorder(&order).unwrap();
    for (v, tag) in blocks.iter().chain(&threads) {
        st.bind(v, *tag).unwrap();
    }
}

fn gpu_schedule(p: &Prog, g: &GpuS) -> Schedule {
    if g.default {
        return rivet_compiler::schedule::gpu_default::default_gpu_schedule(&[p.out.clone()])
            .unwrap();
    }
    let mut s = Schedule::new(&[p.out.clone()]).unwrap();
    let others: Vec<Te> = s
        .stages
        .iter()
        .map(|st| st.tensor.clone())
        .filter(|t| t.id() != p.out.id())
        .collect();
    for t in &others {
        if !(g.inline_producers && s.compute_inline(t).is_ok()) {
            bind_stage(&mut s, t, g);
        }
    }
    bind_stage(&mut s, &p.out, g);
    s
}

/// A GPU-scheduled program on the interpreter (blocks, threads, races reported) matches the
/// Rust reference on strided inputs and a strided output, touching nothing outside it.
/// A GPU-scheduled case on every backend that runs GPU schedules (today the interpreter, with
/// CUDA's semantics; the CPU backend refuses them).
fn run_gpu_case(p: &Prog, g: &GpuS, views: &[ViewS], seed: u64) -> Result<(), TestCaseError> {
    for target in rivet_tests::gpu_schedule_backends() {
        run_gpu_case_on(&target, p, g, views, seed)?;
    }
    // One case in four is also compiled by NVRTC for sm_80 and sm_90 (every kernel
    // of the test suite compiles; NVRTC costs ~50 ms per case, so not every case).
    if seed.is_multiple_of(4) {
        nvrtc_compiles(p, g)?;
    }
    Ok(())
}

/// The GPU schedule of `p` built for CUDA: NVRTC compiles it to PTX and a cubin for sm_80 and
/// sm_90 (where NVRTC is found; `RIVET_REQUIRE_NVRTC=1`, as `make test` sets, makes its
/// absence a build error). Refusals allowed: the proof's conservative ones on symbolic
/// programs, and a 0-d stage left on the host (the CUDA backend runs only kernels there).
fn nvrtc_compiles(p: &Prog, g: &GpuS) -> Result<(), TestCaseError> {
    let args: Vec<Te> = p
        .inputs
        .iter()
        .filter(|i| i.used)
        .map(|i| i.te.clone())
        .chain([p.out.clone()])
        .collect();
    let s = gpu_schedule(p, g);
    for arch in ["cuda -arch=sm_80", "cuda -arch=sm_90"] {
        let m = match build(&s, &args, arch, "f") {
            Ok(m) => m,
            Err(e) if symbolic(p) && conservative_refusal(&e.to_string()) => return Ok(()),
            Err(e)
                if e.to_string().contains("on the host")
                    || e.to_string().contains("has no GPU kernel") =>
            {
                return Ok(())
            }
            Err(e) => return Err(fail(format!("{arch}: build failed ({g:?}): {e}"))),
        };
        if let Ok(ptx) = m.get_source("ptx") {
            if !ptx.contains(".entry") {
                return Err(fail(format!("{arch}: PTX without an entry:\n{ptx}")));
            }
        }
    }
    Ok(())
}

fn run_gpu_case_on(
    target: &rivet_compiler::Target,
    p: &Prog,
    g: &GpuS,
    views: &[ViewS],
    seed: u64,
) -> Result<(), TestCaseError> {
    let mut rng = Rng(seed);
    let main = p.main;
    let mut logical: Vec<Vec<u64>> = Vec::new();
    let mut strided: Vec<Tensor> = Vec::new();
    for (k, inp) in p.inputs.iter().enumerate() {
        let v = make_view(&inp.shape, &views[k], true, main, &mut || {
            random_value(main, &mut rng).bits_raw()
        });
        logical.push(tensor_bits(&v.view, main));
        strided.push(v.view);
    }
    let want: Vec<u64> = (p.reference)(&logical);
    let args: Vec<Te> = p
        .inputs
        .iter()
        .filter(|i| i.used)
        .map(|i| i.te.clone())
        .chain([p.out.clone()])
        .collect();
    let out_ty = p.out_ty;
    let s = gpu_schedule(p, g);
    let m = match build(&s, &args, target, "f") {
        Ok(m) => m,
        Err(e) if symbolic(p) && conservative_refusal(&e.to_string()) => return Ok(()),
        Err(e) => {
            return Err(fail(format!(
                "{target}: GPU-scheduled build failed ({g:?}): {e}"
            )))
        }
    };
    let ir = m.get_source("ir").unwrap();
    // (Loops of one iteration are simplified away, bound or not.)
    if (g.f0 > 1 || g.default)
        && p.out_shape.first().is_some_and(|&n| n > 1)
        && !ir.contains("bind threadIdx.x")
    {
        return Err(fail(format!("no thread binding in the lowered IR:\n{ir}")));
    }
    let mut prng = Rng(seed ^ 0x6B0);
    let ov = make_view(
        &p.out_shape,
        &views[3],
        false,
        out_ty,
        &mut || match out_ty {
            Ty::F32 => (1000.0f32 + r_small(&mut prng)).to_bits() as u64,
            Ty::F64 => (1000.0f64 + r_small(&mut prng) as f64).to_bits(),
            Ty::I32 => 0x5A5A_0000 | prng.below(0x10000),
            Ty::Bool => prng.below(2),
        },
    );
    let before = tensor_bits(&ov.base, out_ty);
    let mut vals: Vec<Value> = p
        .inputs
        .iter()
        .zip(&strided)
        .filter(|(i, _)| i.used)
        .map(|(_, t)| Value::Tensor(t.clone()))
        .collect();
    vals.push(Value::Tensor(ov.view.clone()));
    m.get_function("f").unwrap().call(&vals).map_err(|e| {
        fail(format!(
            "{target}: GPU-scheduled call failed ({g:?}): {e}\n{ir}"
        ))
    })?;
    let after = tensor_bits(&ov.base, out_ty);
    let inside: HashSet<usize> = ov.covered.iter().copied().collect();
    if let Some(i) = (0..after.len()).find(|i| !inside.contains(i) && after[*i] != before[*i]) {
        return Err(fail(format!(
            "element {i} outside the output view was written\n{ir}"
        )));
    }
    let got: Vec<u64> = tensor_bits(&ov.view, out_ty)
        .into_iter()
        .map(|b| canon(b, out_ty))
        .collect();
    let want: Vec<u64> = want.into_iter().map(|b| canon(b, out_ty)).collect();
    if let Some(d) = first_diff(&want, &got, out_ty, p.value_eq) {
        return Err(fail(format!(
            "reference vs GPU-scheduled {target} ({g:?}): {d}\n{ir}"
        )));
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(100))]

    #[test]
    fn gpu_schedules_of_elementwise_programs(c in any_main().prop_flat_map(|t| ew_case(t, true)), g in gpu_s(), v in views(), seed in any::<u64>()) {
        run_gpu_case(&build_ew(&c), &g, &v, seed)?;
    }

    #[test]
    fn gpu_schedules_of_reductions(c in any_main().prop_flat_map(|t| red_case(t, true)), g in gpu_s(), v in views(), seed in any::<u64>()) {
        run_gpu_case(&build_red(&c), &g, &v, seed)?;
    }
}

fn any_main() -> impl Strategy<Value = Ty> {
    prop_oneof![2 => Just(Ty::F32), 1 => Just(Ty::F64), 1 => Just(Ty::I32)]
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn reductions(c in any_main().prop_flat_map(|t| red_case(t, false)), sc in sched_s(), v in views(), seed in any::<u64>()) {
        run_case(&build_red(&c), &sc, &v, seed)?;
    }

    #[test]
    fn two_stage_stencils(c in any_main().prop_flat_map(|t| ew_case(t, true)), sc in sched_s(), v in views(), seed in any::<u64>()) {
        run_case(&build_ew(&c), &sc, &v, seed)?;
    }

    #[test]
    fn two_stage_reductions(c in any_main().prop_flat_map(|t| red_case(t, true)), sc in sched_s(), v in views(), seed in any::<u64>()) {
        run_case(&build_red(&c), &sc, &v, seed)?;
    }
}

proptest! {
    #![proptest_config(config(100))]

    /// Fused multiply-adds (`build(.., fma=True)`): reductions of products become
    /// `fma(a, b, acc)`; the Cranelift code (native `vfmadd` or the libcall) and the
    /// interpreter's `mul_add` agree bit for bit under every schedule.
    #[test]
    fn fma_contracted_reductions(c in prop_oneof![Just(Ty::F32), Just(Ty::F64)].prop_flat_map(|t| red_case(t, false)), sc in sched_s(), v in views(), seed in any::<u64>()) {
        run_case_with(&build_red(&c), &sc, &v, seed, true)?;
    }

    #[test]
    fn fma_contracted_elementwise(c in prop_oneof![Just(Ty::F32), Just(Ty::F64)].prop_flat_map(|t| ew_case(t, true)), sc in sched_s(), v in views(), seed in any::<u64>()) {
        run_case_with(&build_ew(&c), &sc, &v, seed, true)?;
    }
}

// ---- scalar edge cases, exhaustively -------------------------------------------------------

fn edge_values(ty: Ty) -> Vec<V> {
    match ty {
        Ty::I32 => [
            0,
            1,
            -1,
            2,
            -2,
            3,
            -3,
            7,
            -7,
            100,
            46341,
            -46341,
            65536,
            i32::MAX,
            i32::MIN,
            i32::MIN + 1,
        ]
        .into_iter()
        .map(V::I)
        .collect(),
        _ => [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            -2.5,
            3.0,
            -7.0,
            0.1,
            1e30,
            -1e30,
            3.0e38,
            1e-40,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            2147483648.0,
            -2147483904.0,
            4294967296.0,
        ]
        .into_iter()
        .map(|x| const_v(ty, x))
        .collect(),
    }
}

/// `tree` over two inputs holding every pair of edge values: both backends and the Rust
/// reference agree bit for bit.
fn check_all_pairs(ty: Ty, tree: &E) {
    let vals = edge_values(ty);
    let n = vals.len();
    let shape = [(n * n) as i64];
    let data: Vec<Vec<u64>> = vec![
        (0..n * n).map(|i| vals[i / n].bits_raw()).collect(),
        (0..n * n).map(|i| vals[i % n].bits_raw()).collect(),
    ];
    let a: Vec<Te> = (0..2)
        .map(|k| te::placeholder(shape, ty.dtype(), &format!("A{k}")).unwrap())
        .collect();
    let used: Vec<bool> = (0..2).map(|k| tree.reads(k)).collect();
    let c = te::compute(
        shape,
        |i: [Expr; 1]| tree.te(&|s, _| a[s as usize].at(&i), &i),
        "C",
    )
    .unwrap();
    let out_ty = tree.ty();
    let want: Vec<u64> = (0..n * n)
        .map(|i| {
            tree.eval(&|s, _| V::from_bits(data[s as usize][i], ty), &[i as i64])
                .bits()
        })
        .collect();
    let args: Vec<Te> = (0..2)
        .filter(|&k| used[k])
        .map(|k| a[k].clone())
        .chain([c.clone()])
        .collect();
    let s = Schedule::new(&[c.clone()]).unwrap();
    for target in backends() {
        let f = build(&s, &args, &target, "f")
            .unwrap()
            .get_function("f")
            .unwrap();
        let out = Tensor::zeros(&shape, out_ty.dtype()).unwrap();
        let mut vals: Vec<Value> = (0..2)
            .filter(|&k| used[k])
            .map(|k| Value::Tensor(tensor_from_bits(&data[k], &shape, ty)))
            .collect();
        vals.push(Value::Tensor(out.clone()));
        f.call(&vals).unwrap();
        let got: Vec<u64> = tensor_bits(&out, out_ty)
            .into_iter()
            .map(|b| canon(b, out_ty))
            .collect();
        for i in 0..n * n {
            assert_eq!(
                got[i],
                want[i],
                "{target}: {tree:?} at a = {:?}, b = {:?}: got {}, want {}",
                vals_at(&data, i, ty).0,
                vals_at(&data, i, ty).1,
                fmt_bits(got[i], out_ty),
                fmt_bits(want[i], out_ty)
            );
        }
    }
}

fn vals_at(data: &[Vec<u64>], i: usize, ty: Ty) -> (V, V) {
    (V::from_bits(data[0][i], ty), V::from_bits(data[1][i], ty))
}

#[test]
fn scalar_edge_cases_agree_on_every_backend() {
    let (a, b) = (|t| bx(E::In(0, 0, t)), |t| bx(E::In(1, 0, t)));
    for ty in [Ty::F32, Ty::F64, Ty::I32] {
        let bins: Vec<BinOp> = if ty.is_float() {
            FLOAT_BIN.to_vec()
        } else {
            INT_BIN.to_vec()
        };
        for op in bins {
            check_all_pairs(ty, &E::Bin(op, a(ty), b(ty)));
        }
        for op in CMPS {
            check_all_pairs(ty, &E::Cmp(op, a(ty), b(ty)));
        }
        let uns: Vec<UnOp> = if ty.is_float() {
            FLOAT_UN.to_vec()
        } else {
            vec![UnOp::Neg, UnOp::Abs]
        };
        for op in uns {
            check_all_pairs(ty, &E::Un(op, a(ty)));
        }
        for to in TYS {
            if to != ty {
                check_all_pairs(ty, &E::Cast(to, a(ty)));
                check_all_pairs(ty, &E::Cast(ty, bx(E::Cast(to, a(ty)))));
            }
        }
        check_all_pairs(
            ty,
            &E::Sel(bx(E::Cmp(CmpOp::Lt, a(ty), b(ty))), a(ty), b(ty)),
        );
    }
}

// ---- minimal repros of the bugs the properties found -----------------------------------------
//
// Each builds a valid schedule and expects it to compute what the unscheduled program
// computes, on both backends. Status when written: all but bug 8 fail at d8eccbc; bugs 10,
// 11 and 12 at c1ef949; bugs 11 and 12 at 1c2a783. Bug 8 appeared only with an intermediate,
// uncommitted state of the prover (kept as a regression test). All are valid schedules:
// every refusal is a bug. All pass since the compute_at regions take a constant extent bound
// (the commit after 1c2a783); they stay as regression tests.

/// Deterministic non-zero f32 data for a tensor of `shape`.
fn small_data(shape: &[i64], k: usize) -> Tensor {
    let v: Vec<f32> = (0..numel(shape))
        .map(|i| ((i * 7 + k * 3) % 11) as f32 - 5.0)
        .collect();
    Tensor::from_slice(&v, shape).unwrap()
}

/// Builds `sched` and the unscheduled program; runs both on the same data (`shapes`: one per
/// argument, the output last) and expects the same result on every backend.
fn assert_schedule_computes_the_same(out: &Te, args: &[Te], sched: &Schedule, shapes: &[&[i64]]) {
    let run = |s: &Schedule, target: &rivet_compiler::Target| -> Vec<f32> {
        let m = build(s, args, target, "f")
            .unwrap_or_else(|e| panic!("{target}: build refused a valid schedule: {e}"));
        let f = m.get_function("f").unwrap();
        let vals: Vec<Value> = shapes
            .iter()
            .enumerate()
            .map(|(k, sh)| Value::Tensor(small_data(sh, k)))
            .collect();
        f.call(&vals).unwrap_or_else(|e| {
            panic!(
                "{target}: the call was refused: {e}\n{}",
                m.get_source("ir").unwrap()
            )
        });
        vals.last()
            .unwrap()
            .as_tensor()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    let all = backends();
    // The oracle (the interpreter, first) on the unscheduled program.
    let want = run(&Schedule::new(&[out.clone()]).unwrap(), &all[0]);
    for target in &all {
        assert_eq!(run(sched, target), want, "{target}");
    }
}

/// `A` and `C = A + 1` of shape `shape`.
fn add_one<T: Into<Expr>, const N: usize>(shape: [T; N]) -> (Te, Te) {
    let shape = shape.map(Into::into);
    let a = te::placeholder(&shape, DType::F32, "A").unwrap();
    let c = te::compute(&shape, |i: [Expr; N]| a.at(i) + 1.0, "C").unwrap();
    (a, c)
}

fn axes(t: &Te) -> Vec<Var> {
    t.axis().iter().map(|a| a.var.clone()).collect()
}

/// Bug 1: unrolling (or vectorizing) a fused loop of constant extent is accepted by the
/// schedule and by lowering's own check (`simplify(extent)` is a constant), but the loop is
/// emitted with the unsimplified extent `(1 * 2)`, which the IR verifier rejects:
/// "internal compiler error ... Unrolled loop over `i.j.fused` has extent `(1 * 2)`".
#[test]
fn bug_unrolled_or_vectorized_fused_loop_is_an_internal_error() {
    for vectorize in [false, true] {
        let (a, c) = add_one([1, 2]);
        let mut s = Schedule::new(&[c.clone()]).unwrap();
        let ax = axes(&c);
        let st = s.stage(&c).unwrap();
        let f = st.fuse(&ax[0], &ax[1]).unwrap();
        if vectorize {
            st.vectorize(&f).unwrap();
        } else {
            st.unroll(&f).unwrap();
        }
        assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[1, 2], &[1, 2]]);
    }
}

/// Bug 2: fuse two symbolic loops, then split the fused loop: the bounds proof bounds
/// `fused // n` by the fused loop's range (`m * n - 1`) instead of `m - 1` and emits a
/// run-time check that fails for every n >= 2: the call is refused with "out-of-bounds access
/// for these shapes (m=2, n=3)" although every access is in bounds.
#[test]
fn bug_split_of_fused_symbolic_loops_fails_a_false_runtime_check() {
    let (a, c) = add_one([te::var("m"), te::var("n")]);
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let ax = axes(&c);
    let st = s.stage(&c).unwrap();
    let f = st.fuse(&ax[0], &ax[1]).unwrap();
    st.split(&f, Some(Expr::int(2)), None).unwrap();
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[2, 3], &[2, 3]]);
}

/// Bug 3: `split(nparts=2)` of a symbolic dim is refused at build time: "index
/// ((i.outer * ((n + 1) // 2)) + i.inner) must lie in [0, n), and rivet cannot bound that
/// index expression" (interval arithmetic cannot multiply by the non-variable extent
/// `(n + 1) // 2`, not known non-negative).
#[test]
fn bug_nparts_split_of_a_symbolic_dim_is_refused() {
    let (a, c) = add_one([te::var("n")]);
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let ax = axes(&c);
    s.stage(&c)
        .unwrap()
        .split(&ax[0], None, Some(Expr::int(2)))
        .unwrap();
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[5], &[5]]);
}

/// Bug 4: `compute_at` inside a loop fused from a split of a symbolic dim is refused:
/// "compute_at 'P' inside loop 'i.inner.i.outer.fused' of 'C': cannot bound the region it
/// reads" (`fused % ((n + 1) // 2)`: `%` by a non-variable symbolic extent is unbounded).
#[test]
fn bug_compute_at_inside_a_fused_symbolic_loop_is_refused() {
    let n = te::var("n");
    let a = te::placeholder([&n], DType::F32, "A").unwrap();
    let p = te::compute([&n], |[i]| a.at([i]) * 2.0, "P").unwrap();
    let c = te::compute([&n], |[i]| p.at([i]) + 1.0, "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let st = s.stage(&c).unwrap();
    let (o, i) = st.split(&axes(&c)[0], Some(Expr::int(2)), None).unwrap();
    st.reorder(&[i.clone(), o.clone()]).unwrap();
    let f = st.fuse(&i, &o).unwrap();
    s.compute_at(&p, &c, &f).unwrap();
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[5], &[5]]);
}

/// Bug 5 (static shapes): a producer `P[i, j] = A[1 - i, j] * 2` computed at the fused loop of
/// its consumer, with its own row loop split by 1, is refused: "tensor 'A' dim 0: index
/// (1 - ((i.j.fused // 3) + (i.outer + i.inner))) must lie in [0, 2), and rivet cannot prove
/// it (its lowest value is (1 - min((1 + min(1, ((((i.j.fused // 3) - (i.j.fused // 3)) + 1)
/// - 1))), 1)))": the simplifier cannot cancel `x // 3 - x // 3`.
#[test]
fn bug_compute_at_with_reversed_read_and_split_producer_is_refused() {
    let sh = [2, 3];
    let a = te::placeholder(sh, DType::F32, "A").unwrap();
    let p = te::compute(sh, |[i, j]| a.at((1 - i, j)) * 2.0, "P").unwrap();
    let c = te::compute(sh, |[i, j]| p.at([i, j]) + 1.0, "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let ax = axes(&c);
    let f = s.stage(&c).unwrap().fuse(&ax[0], &ax[1]).unwrap();
    s.compute_at(&p, &c, &f).unwrap();
    s.stage(&p)
        .unwrap()
        .split(&axes(&p)[0], Some(Expr::int(1)), None)
        .unwrap();
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[2, 3], &[2, 3]]);
}

/// Bug 6 (static shapes): fuse (j, k), fuse (i, jk), split the result by 2, on shape
/// [1, 1, 2]: the build fails with "tensor 'C' dim 0: index (((f.outer * 2) + f.inner) // 2)
/// must lie in [0, 1), but its highest value is 1 (out of bounds)". The divisor is the
/// unsimplified product `(1 * 2)`, so the interval of `x // (1 * 2)` is `x`'s own range, and
/// that loose bound is then reported as a proof of an out-of-bounds access.
#[test]
fn bug_split_of_a_doubly_fused_loop_is_refuted_as_out_of_bounds() {
    let (a, c) = add_one([1, 1, 2]);
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let ax = axes(&c);
    let st = s.stage(&c).unwrap();
    let jk = st.fuse(&ax[1], &ax[2]).unwrap();
    let f = st.fuse(&ax[0], &jk).unwrap();
    st.split(&f, Some(Expr::int(2)), None).unwrap();
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[1, 1, 2], &[1, 1, 2]]);
}

/// Bug 3b, same cause as bug 3 (`%` by the non-variable extent `(n * 1)` of a fused loop), with
/// a misleading message: on shape [1, 1, n], reorder to (i, k, j), fuse (k, j), fuse (i, kj),
/// split by 4: "tensor 'C' dim 1: index 0 must lie in [0, 1), and rivet cannot bound that
/// index expression" (the index printed is the simplified one; the one analysed is
/// `(0 + (((f.outer * 4 + f.inner) % (n * 1)) % 1))`).
#[test]
fn bug_split_of_loops_fused_over_a_symbolic_dim_is_refused() {
    let (a, c) = add_one([Expr::int(1), Expr::int(1), te::var("n")]);
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let ax = axes(&c);
    let st = s.stage(&c).unwrap();
    st.reorder(&[ax[0].clone(), ax[2].clone(), ax[1].clone()])
        .unwrap();
    let kj = st.fuse(&ax[2], &ax[1]).unwrap();
    let f = st.fuse(&ax[0], &kj).unwrap();
    st.split(&f, Some(Expr::int(4)), None).unwrap();
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[1, 1, 5], &[1, 1, 5]]);
}

/// `C[] = sum(A[r0, r1])` over `reduce_axes` (each `(dim, start)`, in this order) of
/// `A: [m, n]`, with the two reduction loops fused and the fused loop split by 2.
fn fused_split_reduction(order: [(usize, i64); 2]) -> (Te, Te, Schedule) {
    let dims = [te::var("m"), te::var("n")];
    let a = te::placeholder(&dims, DType::F32, "A").unwrap();
    let r: Vec<IterVar> = order
        .iter()
        .map(|&(d, lo)| te::reduce_axis(lo, &dims[d], &format!("r{d}")).unwrap())
        .collect();
    let by_dim = |d: usize| &r[order.iter().position(|o| o.0 == d).unwrap()];
    let c = te::compute((), |[]| te::sum(a.at([by_dim(0), by_dim(1)]), &r), "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let st = s.stage(&c).unwrap();
    let f = st.fuse(&r[0].var, &r[1].var).unwrap();
    st.split(&f, Some(Expr::int(2)), None).unwrap();
    (a, c, s)
}

/// Bug 7: a reduction over `r0 in [0, m)`, `r1 in [1, n)` with the two loops fused (r0
/// outer) and split: "tensor 'A' dim 0: index (((f.outer * 2) + f.inner) // (n - 1)) must lie
/// in [0, m), and rivet cannot bound that index expression" (`//` by the extent `n - 1`,
/// which is not provably non-negative).
#[test]
fn bug_fused_reduction_over_a_shifted_symbolic_range_is_refused() {
    let (a, c, s) = fused_split_reduction([(0, 0), (1, 1)]);
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[2, 3], &[]]);
}

/// Bug 8 (regression test): the same with the loops fused the other way (r1 in [1, n)
/// outer): it built, with a run-time check on `1 + (f // m) < n` whose bound ignored the
/// split guard `f < (n - 1) * m`, so the call was refused for m = 1, n = 2: "out-of-bounds
/// access for these shapes (m=1, n=2): tensor 'A' dim 1: index (1 + (((f.outer * 2) +
/// f.inner) // m)) must lie in [0, n) (its highest value is (1 + (((2 * ((((n - 1) * m) + 1)
/// // 2)) - 1) // m)))" (the guard's own bound `(n - 1) * m - 1` was unboundable, so the
/// guard was dropped).
#[test]
fn bug_fused_reduction_over_a_shifted_symbolic_range_fails_a_false_runtime_check() {
    let (a, c, s) = fused_split_reduction([(1, 1), (0, 0)]);
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[1, 2], &[]]);
}

/// Bug 9 (static shapes): a stencil `C[i, j] = P[i, j] + P[i, j + 1]` over `P[i, j] = A[i,
/// 1 - j] * 2` (shapes [1, 1], [1, 2]), with P computed at C's `j` loop and P's two loops
/// fused: "tensor 'A' dim 1: index (1 - (min(j, (j + 1)) + (i.j.fused % ((max(j, (j + 1)) -
/// min(j, (j + 1))) + 1)))) must lie in [0, 2), and rivet cannot prove it": the region's
/// `max(j, j + 1) - min(j, j + 1)` is not simplified to 1.
#[test]
fn bug_compute_at_of_a_fused_stencil_producer_is_refused() {
    let (sp, sc) = ([1, 2], [1, 1]);
    let a = te::placeholder(sp, DType::F32, "A").unwrap();
    let p = te::compute(sp, |[i, j]| a.at((i, 1 - j)) * 2.0, "P").unwrap();
    let c = te::compute(sc, |[i, j]| p.at([&i, &j]) + p.at((i, j + 1)), "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    s.compute_at(&p, &c, &axes(&c)[1]).unwrap();
    let pax = axes(&p);
    s.stage(&p).unwrap().fuse(&pax[0], &pax[1]).unwrap();
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[1, 2], &[1, 1]]);
}

/// Bug 10 (static shapes): `P[i, j, k] = A[1 - i, j, k] * 2` over [2, 1, 2] with P's loops
/// fused into one, consumed by `C[j, k] = sum_r P[r, j, k]` whose loops (j, k) are fused and
/// split by 2, P computed at the outer loop: "tensor 'A' dim 0: index (1 - ((i.j.fused.k.fused
/// // 2) // (((((f.outer * 2) + 1) // 2) - ((f.outer * 2) // 2)) + 1))) must lie in [0, 2),
/// and rivet cannot prove it" (the region extent `((2o + 1) // 2 - (2o) // 2) + 1` is 1).
#[test]
fn bug_compute_at_of_a_fused_producer_under_a_split_fused_consumer_is_refused() {
    let sp = [2, 1, 2];
    let a = te::placeholder(sp, DType::F32, "A").unwrap();
    let p = te::compute(sp, |[i, j, k]| a.at((1 - i, j, k)) * 2.0, "P").unwrap();
    let r = te::reduce_axis(0, 2, "r").unwrap();
    let c = te::compute([1, 2], |[i, j]| te::sum(p.at((&r, i, j)), &r), "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let cax = axes(&c);
    let st = s.stage(&c).unwrap();
    let f = st.fuse(&cax[0], &cax[1]).unwrap();
    let (outer, _) = st.split(&f, Some(Expr::int(2)), None).unwrap();
    s.compute_at(&p, &c, &outer).unwrap();
    let pax = axes(&p);
    let st = s.stage(&p).unwrap();
    let ij = st.fuse(&pax[0], &pax[1]).unwrap();
    st.fuse(&ij, &pax[2]).unwrap();
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[2, 1, 2], &[1, 2]]);
}

/// Bug 11 (static shapes), a variant of bug 10 with another divisor: `P[i, j] = A[0 - i, j] *
/// 2` over [1, 4] with P's loops fused, `C = P + 1` with its loops fused, split by 1, the outer
/// split by 2, P computed at the outermost loop: "tensor 'A' dim 0: index (0 - (((o * 2) // 4)
/// + (i.j.fused // 4))) must lie in [0, 1), and rivet cannot prove it (its lowest value is (0
/// - min(((((o * 2) + 1) // 4) + (-1 * ((o * 2) // 4))), 0)))", where `(2o + 1) // 4 - (2o)
/// // 4` is always 0.
#[test]
fn bug_compute_at_of_a_fused_producer_under_a_twice_split_fused_consumer_is_refused() {
    let sh = [1, 4];
    let a = te::placeholder(sh, DType::F32, "A").unwrap();
    let p = te::compute(sh, |[i, j]| a.at((0 - i, j)) * 2.0, "P").unwrap();
    let c = te::compute(sh, |[i, j]| p.at([i, j]) + 1.0, "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let cax = axes(&c);
    let st = s.stage(&c).unwrap();
    let f = st.fuse(&cax[0], &cax[1]).unwrap();
    let (o, _) = st.split(&f, Some(Expr::int(1)), None).unwrap();
    let (oo, _) = st.split(&o, Some(Expr::int(2)), None).unwrap();
    s.compute_at(&p, &c, &oo).unwrap();
    let pax = axes(&p);
    s.stage(&p).unwrap().fuse(&pax[0], &pax[1]).unwrap();
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[1, 4], &[1, 4]]);
}

/// Bug 12 (static shapes), same region extent as bug 11, no reversed read: `C = P + 1` over
/// [1, 3], C's `i` split into 5 parts, the parts fused back, fused with `j`, and split by 2;
/// `P = A * 2` computed at the outer loop, its loops reordered (j, i), fused and split by 1:
/// "tensor 'P' dim 0: index (((o * 2) // 3) + ((j.i.fused.outer + j.i.fused.inner) % (((((o *
/// 2) + 1) // 3) - ((o * 2) // 3)) + 1))) must lie in [0, 1), and rivet cannot bound that
/// index expression".
#[test]
fn bug_split_of_a_reordered_fused_producer_computed_at_a_split_fused_loop_is_refused() {
    let sh = [1, 3];
    let a = te::placeholder(sh, DType::F32, "A").unwrap();
    let p = te::compute(sh, |[i, j]| a.at([i, j]) * 2.0, "P").unwrap();
    let c = te::compute(sh, |[i, j]| p.at([i, j]) + 1.0, "C").unwrap();
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let cax = axes(&c);
    let st = s.stage(&c).unwrap();
    let (io, ii) = st.split(&cax[0], None, Some(Expr::int(5))).unwrap();
    let i = st.fuse(&io, &ii).unwrap();
    let f = st.fuse(&i, &cax[1]).unwrap();
    let (o, _) = st.split(&f, Some(Expr::int(2)), None).unwrap();
    s.compute_at(&p, &c, &o).unwrap();
    let pax = axes(&p);
    let st = s.stage(&p).unwrap();
    st.reorder(&[pax[1].clone(), pax[0].clone()]).unwrap();
    let ji = st.fuse(&pax[1], &pax[0]).unwrap();
    st.split(&ji, Some(Expr::int(1)), None).unwrap();
    assert_schedule_computes_the_same(&c, &[a, c.clone()], &s, &[&[1, 3], &[1, 3]]);
}

// ---- GPU memory caches: random cache_read / cache_write schedules of a matmul ---------------

/// A random shared-memory / register tiling of `C = A @ B` (TVM's GEMM schedule family).
#[derive(Clone, Debug)]
struct CacheS {
    tile_m: i64,
    tile_n: i64,
    /// Outputs per thread along each side.
    per: i64,
    k_tile: i64,
    /// Accumulate in a local cache (`cache_write`) computed at the thread loop.
    write_local: bool,
    /// A through shared memory.
    a_shared: bool,
    /// B: 0 not cached, 1 shared, 2 local (per thread).
    b_cache: u8,
    /// Shared loads spread over the block's threads (else thread 0 loads).
    bind_loads: bool,
    shape: (i64, i64, i64),
}

fn cache_s() -> impl Strategy<Value = CacheS> {
    (
        (select(vec![2i64, 4, 8, 16]), select(vec![2i64, 4, 8, 16])),
        select(vec![1i64, 2]),
        select(vec![1i64, 3, 4, 8]),
        (any::<bool>(), any::<bool>(), 0u8..3, any::<bool>()),
        (1i64..40, 1i64..30, 1i64..40),
    )
        .prop_map(
            |(
                (tile_m, tile_n),
                per,
                k_tile,
                (write_local, a_shared, b_cache, bind_loads),
                shape,
            )| CacheS {
                tile_m,
                tile_n,
                per,
                k_tile,
                write_local,
                a_shared,
                b_cache,
                bind_loads,
                shape,
            },
        )
}

fn cached_matmul_schedule(g: &CacheS) -> (Schedule, Vec<Te>) {
    use rivet_compiler::ir::ThreadTag;
    let [m, k, n] = ["m", "k", "n"].map(te::var);
    let a = te::placeholder([&m, &k], DType::F32, "A").unwrap();
    let b = te::placeholder([&k, &n], DType::F32, "B").unwrap();
    let r = te::reduce_axis(0, &k, "r").unwrap();
    let c = te::compute(
        [&m, &n],
        |[i, j]| te::sum(a.at((i, &r)) * b.at((&r, j)), &r),
        "C",
    )
    .unwrap();
    let mut s = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let cl = g.write_local.then(|| s.cache_write(&c, "local").unwrap());
    let comp = cl.clone().unwrap_or_else(|| c.clone());
    let aa = g.a_shared.then(|| {
        s.cache_read(&a, "shared", std::slice::from_ref(&comp))
            .unwrap()
    });
    let bb = match g.b_cache {
        1 => Some((
            s.cache_read(&b, "shared", std::slice::from_ref(&comp))
                .unwrap(),
            true,
        )),
        2 => Some((
            s.cache_read(&b, "local", std::slice::from_ref(&comp))
                .unwrap(),
            false,
        )),
        _ => None,
    };
    let (i, j) = (c.axis()[0].var.clone(), c.axis()[1].var.clone());
    let st = s.stage(&c).unwrap();
    let (by, yi) = st.split(&i, Some(Expr::int(g.tile_m)), None).unwrap();
    let (bx, xi) = st.split(&j, Some(Expr::int(g.tile_n)), None).unwrap();
    let (ty, yr) = st.split(&yi, Some(Expr::int(g.per)), None).unwrap();
    let (tx, xr) = st.split(&xi, Some(Expr::int(g.per)), None).unwrap();
    let mut order = vec![by.clone(), bx.clone(), ty.clone(), tx.clone()];
    let at = if g.write_local {
        order.extend([yr, xr]);
        st.reorder(&order).unwrap();
        None
    } else {
        let (ko, ki) = st.split(&r.var, Some(Expr::int(g.k_tile)), None).unwrap();
        order.extend([ko.clone(), ki, yr, xr]);
        st.reorder(&order).unwrap();
        Some(ko)
    };
    st.bind(&by, ThreadTag::BlockY).unwrap();
    st.bind(&bx, ThreadTag::BlockX).unwrap();
    st.bind(&ty, ThreadTag::ThreadY).unwrap();
    st.bind(&tx, ThreadTag::ThreadX).unwrap();
    let ko = match (&cl, at) {
        (Some(cl), _) => {
            s.compute_at(cl, &c, &tx).unwrap();
            let ls = s.stage(cl).unwrap();
            let (ko, ki) = ls.split(&r.var, Some(Expr::int(g.k_tile)), None).unwrap();
            let d: Vec<Var> = cl.axis().iter().map(|a| a.var.clone()).collect();
            ls.reorder(&[ko.clone(), ki.clone(), d[0].clone(), d[1].clone()])
                .unwrap();
            ls.unroll(&ki).unwrap();
            ko
        }
        (None, Some(ko)) => ko,
        _ => unreachable!(),
    };
    let (threads_y, threads_x) = (g.tile_m / g.per, g.tile_n / g.per);
    let caches: Vec<(Te, bool)> = aa.into_iter().map(|x| (x, true)).chain(bb).collect();
    for (x, shared) in &caches {
        s.compute_at(x, &comp, &ko).unwrap();
        if *shared && g.bind_loads {
            let xs = s.stage(x).unwrap();
            let v: Vec<Var> = x.axis().iter().map(|a| a.var.clone()).collect();
            let f = xs.fuse(&v[0], &v[1]).unwrap();
            let (_, t) = xs
                .split(&f, Some(Expr::int(threads_x * threads_y)), None)
                .unwrap();
            let (y, xx) = xs.split(&t, Some(Expr::int(threads_x)), None).unwrap();
            xs.bind(&y, ThreadTag::ThreadY).unwrap();
            xs.bind(&xx, ThreadTag::ThreadX).unwrap();
        }
    }
    (s, vec![a, b, c])
}

fn run_cache_case(g: &CacheS, seed: u64) -> Result<(), TestCaseError> {
    let (s, args) = cached_matmul_schedule(g);
    let (m, k, n) = g.shape;
    let mut rng = Rng(seed | 1);
    let mut draw = |len: i64| -> Vec<f32> { (0..len).map(|_| r_small(&mut rng)).collect() };
    let (av, bv) = (draw(m * k), draw(k * n));
    let mut want = vec![0.0f64; (m * n) as usize];
    let mut mag = vec![0.0f64; (m * n) as usize];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let t = av[(i * k + p) as usize] as f64 * bv[(p * n + j) as usize] as f64;
                want[(i * n + j) as usize] += t;
                mag[(i * n + j) as usize] += t.abs();
            }
        }
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits() as u64).collect::<Vec<u64>>();
    let targets = rivet_tests::gpu_schedule_backends();
    prop_assert!(!targets.is_empty(), "no backend runs GPU schedules");
    for target in targets {
        let module = build(&s, &args, &target, "f").map_err(|e| {
            fail(format!(
                "{target}: cached GEMM schedule refused ({g:?}): {e}"
            ))
        })?;
        let ir = module.get_source("ir").unwrap();
        let shared = g.a_shared || g.b_cache == 1;
        if shared != ir.contains("barrier") {
            return Err(fail(format!("barriers iff shared caches ({g:?}):\n{ir}")));
        }
        let a = tensor_from_bits(&bits(&av), &[m, k], Ty::F32);
        let b = tensor_from_bits(&bits(&bv), &[k, n], Ty::F32);
        let c = tensor_from_bits(&bits(&vec![f32::NAN; (m * n) as usize]), &[m, n], Ty::F32);
        let vals = [a, b, c.clone()].map(Value::Tensor);
        module.get_function("f").unwrap().call(&vals).map_err(|e| {
            fail(format!(
                "{target}: cached GEMM call failed ({g:?}): {e}\n{ir}"
            ))
        })?;
        let got = c.to_vec::<f32>().unwrap();
        for (e, (&gv, (&w, &mg))) in got.iter().zip(want.iter().zip(&mag)).enumerate() {
            let tol = 1e-6 * (k as f64 + 2.0) * (mg + 1e-6);
            let ok = (gv as f64 - w).abs() <= tol; // false for NaN too
            if !ok {
                return Err(fail(format!(
                    "{target}: C element {e} = {gv}, want {w} ({g:?})\n{ir}"
                )));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(40))]

    #[test]
    fn gpu_schedules_with_memory_caches(g in cache_s(), seed in any::<u64>()) {
        run_cache_case(&g, seed)?;
    }
}

/// Found by `elementwise_f64` in CI (seed unknown, shrunk): the last axis split into 4 parts
/// (inner extent 2, guarded), the inner loop vectorized and the outer one unrolled: the
/// unrolled copy `ko = 3` excludes every iteration (`6 + ki < 5`), and the vectorizer's
/// guard-to-extent rewrite made its extent the constant -1, an internal verifier error.
#[test]
fn split_by_parts_vectorized_inside_an_unrolled_outer_loop() {
    let c = EwCase {
        main: Ty::F64,
        dims: vec![
            DimS { n: 1, sym: false },
            DimS { n: 1, sym: true },
            DimS { n: 5, sym: false },
        ],
        n_in: 1,
        reads: vec![
            ReadS {
                bcast: [false; 3],
                flip: [false; 3]
            };
            3
        ],
        tree: E::In(0, 0, Ty::F64),
        producer: None,
    };
    let sc = SchedS {
        out: StageS {
            ops: vec![SOp::SplitParts(Ix(140), 4)],
            anns: vec![AOp::Vectorize(None), AOp::Unroll(Ix(121))],
        },
        prod: StageS::default(),
        attach: AttachS::Root,
    };
    let v = vec![
        ViewS {
            keys: [0; 3],
            steps: [1; 3],
            flips: [false; 3],
            bcast: [false; 3]
        };
        4
    ];
    run_case(&build_ew(&c), &sc, &v, 0).unwrap();
}

/// The default GPU schedule of a contraction whose operand is read at both tiled axes
/// (`C[n, m] = sum_r (P[n, r, m] + A[n, r, m]) * P[n, r, m]` over symbolic `n`, `m`) cached
/// that operand in shared memory: a 64 x 4 x 64 tile, 65536 bytes, refused at build time by
/// the 48 KiB limit ("schedule of 'A0.shared': ... a cache may use at most 49152 bytes").
/// Such an operand has no reuse within a block; it is read from global memory.
#[test]
fn bug_gpu_default_contraction_caches_an_operand_read_at_both_tiled_axes() {
    let c = RedCase {
        main: Ty::I32,
        dims: vec![
            DimS { n: 1, sym: true },
            DimS { n: 4, sym: false },
            DimS { n: 1, sym: true },
        ],
        red: (Ix(31), Ix(0), false),
        lo: [false, false],
        op: ReduceOp::Sum,
        n_in: 1,
        flips: vec![[false; 3]; 2],
        tree: E::Bin(
            BinOp::Mul,
            Box::new(E::Bin(
                BinOp::Add,
                Box::new(E::In(0, 0, Ty::I32)),
                Box::new(E::In(1, 0, Ty::I32)),
            )),
            Box::new(E::In(0, 0, Ty::I32)),
        ),
        producer: Some(E::In(0, 0, Ty::I32)),
    };
    let g = GpuS {
        f0: 1,
        f1: 1,
        two_d: false,
        inline_producers: false,
        default: true,
        cross: None,
    };
    let plain = ViewS {
        keys: [0; 3],
        steps: [1; 3],
        flips: [false; 3],
        bcast: [false; 3],
    };
    run_gpu_case(&build_red(&c), &g, &vec![plain; 4], 0).unwrap();
}
