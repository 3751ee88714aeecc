//! Property tests of the compiler: random programs, random valid schedules and random
//! strided layouts, run on every backend.
//!
//! Oracles, for every case:
//! - a plain-Rust evaluation of the random expression tree (the scalar semantics of
//!   `codegen::math`, with the very same libm functions) must equal the interpreter running
//!   the UNSCHEDULED program on compact tensors, bit for bit;
//! - the Cranelift backend ("cpu") must equal the interpreter ("interp") bit for bit, both
//!   unscheduled and scheduled (NaNs compare equal to each other, whatever their payload);
//! - the scheduled program, run on permuted / stepped / reversed / broadcast views with its
//!   output written in place through a strided view, must equal the unscheduled program:
//!   bitwise for elementwise programs and for sums and products (whose bodies are quantised
//!   to small integers / powers of two, so every summation order is exact); as values for
//!   float max/min, where a reordered reduction may pick -0.0 instead of 0.0 on a tie;
//! - elements of the output's buffer outside the view stay untouched, bit for bit.
//!
//! Programs: elementwise trees (depth <= 4) over 1-3 inputs (float32, float64 or int32) of
//! rank 1-3, dims 1-6, possibly symbolic; reductions (sum/max/min/prod over 1-2 axes of a
//! rank-2/3 domain); two-stage programs (an elementwise producer read by an elementwise
//! stencil consumer or by a reduction), with the producer at root, inlined or `compute_at`.
//! Schedules: split (factor or nparts, 1-7, dividing or not), fuse of adjacent loops,
//! reorder (swaps, reversal, reduction loops outermost), tile, unroll of constant-extent
//! loops, vectorize of the innermost data-parallel loop (split first), parallel.

use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::Config;
use rivet_compiler::codegen::math::{self, ffi};
use rivet_compiler::ir::{BinOp, CmpOp, Expr, IterVar, LogicOp, ReduceOp, UnOp, Var};
use rivet_compiler::te::{self, ok, Tensor as Te};
use rivet_compiler::{build, Schedule};
use rivet_runtime::{DType, Tensor, Value};
use std::collections::HashSet;
use std::fmt;

const BACKENDS: [&str; 2] = ["interp", "cpu"];

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
            Ty::Bool => E::Logic(LogicOp::Or, bx(self), bx(E::Cmp(CmpOp::Lt, bx(r), bx(E::C(slot_ty, 0.0))))),
            t if t == slot_ty => E::Bin(BinOp::Add, bx(self), bx(r)),
            t => E::Bin(BinOp::Add, bx(self), bx(E::Cast(t, bx(r)))),
        }
    }

    /// The te expression; `rd(slot, offset)` reads a slot, `idx` are the index variables.
    fn te(&self, rd: &dyn Fn(u8, u8) -> Expr, idx: &[Expr]) -> Expr {
        let t = |e: &E| e.te(rd, idx);
        match self {
            E::In(s, o, _) => rd(*s, *o),
            E::Idx(d, ty) => te::cast(ty.dtype(), idx[*d as usize].clone()),
            E::C(ty, v) => te::constant(*v, ty.dtype()),
            E::Un(op, a) => {
                let a = t(a);
                match op {
                    UnOp::Neg => -a,
                    UnOp::Not => ok(te::not(a)),
                    UnOp::Exp => ok(te::exp(a)),
                    UnOp::Log => ok(te::log(a)),
                    UnOp::Sqrt => ok(te::sqrt(a)),
                    UnOp::Rsqrt => ok(te::rsqrt(a)),
                    UnOp::Tanh => ok(te::tanh(a)),
                    UnOp::Sigmoid => ok(te::sigmoid(a)),
                    UnOp::Abs => ok(te::abs(a)),
                    UnOp::Floor => ok(te::floor(a)),
                    UnOp::Ceil => ok(te::ceil(a)),
                    UnOp::Erf => ok(te::erf(a)),
                }
            }
            E::Bin(op, a, b) => {
                let (a, b) = (t(a), t(b));
                match op {
                    BinOp::Add => a + b,
                    BinOp::Sub => a - b,
                    BinOp::Mul => a * b,
                    BinOp::Div => a / b,
                    BinOp::FloorDiv => ok(te::floordiv(a, b)),
                    BinOp::FloorMod => a % b,
                    BinOp::Min => ok(te::minimum(a, b)),
                    BinOp::Max => ok(te::maximum(a, b)),
                    BinOp::Pow => ok(te::pow(a, b)),
                }
            }
            E::Cmp(op, a, b) => ok(te::compare(*op, t(a), t(b))),
            E::Logic(LogicOp::And, a, b) => ok(te::all(t(a), t(b))),
            E::Logic(LogicOp::Or, a, b) => ok(te::any(t(a), t(b))),
            E::Sel(c, a, b) => ok(te::if_then_else(t(c), t(a), t(b))),
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

const FLOAT_BIN: [BinOp; 9] =
    [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div, BinOp::FloorDiv, BinOp::FloorMod, BinOp::Min, BinOp::Max, BinOp::Pow];
const INT_BIN: [BinOp; 7] = [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::FloorDiv, BinOp::FloorMod, BinOp::Min, BinOp::Max];
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
const CMPS: [CmpOp; 6] = [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge];
const FLOAT_CONSTS: [f64; 16] = [
    0.5,
    1.0,
    -1.0,
    2.0,
    -3.0,
    0.1,
    7.25,
    0.0,
    -0.0,
    1e30,
    -1e-3,
    3.0e38,
    1e-300,
    f64::NAN,
    f64::INFINITY,
    -4.5,
];
const INT_CONSTS: [f64; 13] =
    [0.0, 1.0, -1.0, 2.0, -2.0, 3.0, 7.0, -7.0, 100.0, 65536.0, 2147483647.0, -2147483648.0, -46341.0];

/// `op(abs(x) + 0.5)` for log/sqrt/rsqrt (finite-ish), `op(x)` for the others.
fn guarded_un(op: UnOp, x: E) -> E {
    let ty = x.ty();
    if matches!(op, UnOp::Log | UnOp::Sqrt | UnOp::Rsqrt) {
        E::Un(op, bx(E::Bin(BinOp::Add, bx(E::Un(UnOp::Abs, bx(x))), bx(E::C(ty, 0.5)))))
    } else {
        E::Un(op, bx(x))
    }
}

fn leaf(t: Ty, main: Ty) -> BoxedStrategy<E> {
    let idx = (0u8..3).prop_map(move |d| E::Idx(d, t));
    match t {
        Ty::Bool => any::<bool>().prop_map(|b| E::C(Ty::Bool, b as u8 as f64)).boxed(),
        _ => {
            let c = if t.is_float() { select(FLOAT_CONSTS.to_vec()) } else { select(INT_CONSTS.to_vec()) }.prop_map(move |v| E::C(t, v));
            if t == main {
                prop_oneof![6 => (0u8..6, 0u8..4).prop_map(move |(s, o)| E::In(s, o, t)), 1 => idx, 2 => c].boxed()
            } else {
                prop_oneof![idx, c].boxed()
            }
        }
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
        level = TYS.iter().map(|&t| prop_oneof![1 => prev[t.i()].clone(), 3 => node(t, main, &prev)].boxed()).collect();
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
                [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 1e30, -3e38, 1e-40, 1e-310, 0.1][r.below(10) as usize]
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
        Ty::F32 => Tensor::from_slice(&bits.iter().map(|&b| f32::from_bits(b as u32)).collect::<Vec<_>>(), shape),
        Ty::F64 => Tensor::from_slice(&bits.iter().map(|&b| f64::from_bits(b)).collect::<Vec<_>>(), shape),
        Ty::I32 => Tensor::from_slice(&bits.iter().map(|&b| b as u32 as i32).collect::<Vec<_>>(), shape),
        Ty::Bool => Tensor::from_slice(&bits.iter().map(|&b| b != 0).collect::<Vec<_>>(), shape),
    }
    .unwrap()
}

/// The logical elements (row-major), as raw bits.
fn tensor_bits(t: &Tensor, ty: Ty) -> Vec<u64> {
    match ty {
        Ty::F32 => t.to_vec::<f32>().unwrap().into_iter().map(|x| x.to_bits() as u64).collect(),
        Ty::F64 => t.to_vec::<f64>().unwrap().into_iter().map(|x| x.to_bits()).collect(),
        Ty::I32 => t.to_vec::<i32>().unwrap().into_iter().map(|x| x as u32 as u64).collect(),
        Ty::Bool => t.to_vec::<bool>().unwrap().into_iter().map(|x| x as u64).collect(),
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
    idx.iter().zip(shape).fold(0usize, |acc, (&i, &n)| acc * n as usize + i as usize)
}

// ---- strided views ------------------------------------------------------------------------

/// A layout: base dim `i` holds view dim `perm[i]` (perm = argsort of `keys`), stepped by
/// `steps`, maybe reversed; broadcast dims (inputs only) have stride 0.
#[derive(Clone, Debug)]
struct ViewS {
    keys: [u8; 3],
    steps: [i64; 3],
    flips: [bool; 3],
    bcast: [bool; 3],
}

fn view_s() -> impl Strategy<Value = ViewS> {
    (any::<[u8; 3]>(), [1i64..4, 1i64..4, 1i64..4], any::<[bool; 3]>(), [prop::bool::weighted(0.15); 3])
        .prop_map(|(keys, steps, flips, bcast)| ViewS { keys, steps, flips, bcast })
}

struct View {
    base: Tensor,
    view: Tensor,
    /// Base element of each view element (row-major over the view).
    covered: Vec<usize>,
}

fn make_view(shape: &[i64], spec: &ViewS, allow_bcast: bool, ty: Ty, fill: &mut dyn FnMut() -> u64) -> View {
    let n = shape.len();
    let mut perm: Vec<usize> = (0..n).collect();
    perm.sort_by_key(|&d| spec.keys[d]);
    let bcast = |d: usize| allow_bcast && spec.bcast[d];
    let base_shape: Vec<i64> = (0..n).map(|i| if bcast(perm[i]) { 1 } else { shape[perm[i]] * spec.steps[i] }).collect();
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
    View { base, view, covered }
}

// ---- schedules ----------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum SOp {
    Split(Index, i64),
    SplitParts(Index, i64),
    Fuse(Index),
    Swap(Index, Index),
    ReduceFirst,
    Reverse,
    Tile(Index, i64, i64),
}

#[derive(Clone, Debug)]
enum AOp {
    Unroll(Index),
    /// Vectorize the innermost loop, split by the factor first (always when its extent is
    /// not a constant).
    Vectorize(Option<i64>),
    Parallel(Index),
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
    At(Index),
}

#[derive(Clone, Debug)]
struct SchedS {
    out: StageS,
    prod: StageS,
    attach: AttachS,
}

fn stage_s() -> impl Strategy<Value = StageS> {
    let f = 1i64..8;
    let sop = prop_oneof![
        4 => (any::<Index>(), f.clone()).prop_map(|(i, f)| SOp::Split(i, f)),
        1 => (any::<Index>(), f.clone()).prop_map(|(i, f)| SOp::SplitParts(i, f)),
        2 => any::<Index>().prop_map(SOp::Fuse),
        3 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| SOp::Swap(a, b)),
        1 => Just(SOp::ReduceFirst),
        1 => Just(SOp::Reverse),
        1 => (any::<Index>(), f.clone(), f.clone()).prop_map(|(i, a, b)| SOp::Tile(i, a, b)),
    ];
    let aop = prop_oneof![
        any::<Index>().prop_map(AOp::Unroll),
        prop::option::of(f).prop_map(AOp::Vectorize),
        any::<Index>().prop_map(AOp::Parallel),
    ];
    (prop::collection::vec(sop, 0..6), prop::collection::vec(aop, 0..3)).prop_map(|(ops, anns)| StageS { ops, anns })
}

fn sched_s() -> impl Strategy<Value = SchedS> {
    let attach = prop_oneof![
        1 => Just(AttachS::Root),
        1 => Just(AttachS::Inline),
        2 => any::<Index>().prop_map(AttachS::At),
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
    let mut pos: Vec<usize> = order.iter().map(|v| leaves.iter().position(|l| &l.var == v).unwrap()).collect();
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
    let mut leaves: Vec<LeafM> =
        roots.iter().zip(root_ext).map(|(iv, &ext)| LeafM { var: iv.var.clone(), reduce: iv.reduce, ext }).collect();
    let st = s.stage(t).unwrap();
    let split = |st: &mut rivet_compiler::schedule::Stage, leaves: &mut Vec<LeafM>, p: usize, f: i64, parts: bool| {
        let l = leaves[p].clone();
        let (o, i) = if parts {
            st.split(&l.var, None, Some(Expr::int(f))).unwrap()
        } else {
            st.split(&l.var, Some(Expr::int(f)), None).unwrap()
        };
        let (oe, ie) = if parts { (Some(f), l.ext.map(|e| (e + f - 1) / f)) } else { (l.ext.map(|e| (e + f - 1) / f), Some(f)) };
        leaves.splice(p..=p, [LeafM { var: o, reduce: l.reduce, ext: oe }, LeafM { var: i, reduce: l.reduce, ext: ie }]);
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
                leaves.splice(p..=p + 1, [LeafM { var: v, reduce: a.reduce, ext }]);
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
                let (xo, yo, xi, yi) = st.tile(&x.var, &y.var, Expr::int(*fx), Expr::int(*fy)).unwrap();
                let ceil = |e: Option<i64>, f: i64| e.map(|e| (e + f - 1) / f);
                leaves.splice(
                    p..=p + 1,
                    [
                        LeafM { var: xo.clone(), reduce: x.reduce, ext: ceil(x.ext, *fx) },
                        LeafM { var: xi.clone(), reduce: x.reduce, ext: Some(*fx) },
                        LeafM { var: yo.clone(), reduce: y.reduce, ext: ceil(y.ext, *fy) },
                        LeafM { var: yi.clone(), reduce: y.reduce, ext: Some(*fy) },
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
                    st.unroll(&leaves[cands[ix.index(cands.len())]].var).unwrap();
                }
            }
            AOp::Vectorize(f) => {
                if leaves[n - 1].reduce {
                    continue;
                }
                match (leaves[n - 1].ext, f) {
                    (Some(_), None) => {}
                    (_, f) => split(st, &mut leaves, n - 1, f.unwrap_or(4), false),
                }
                st.vectorize(&leaves[leaves.len() - 1].var).unwrap();
            }
            AOp::Parallel(ix) => {
                let cands: Vec<usize> = (0..n).filter(|&p| !leaves[p].reduce).collect();
                if !cands.is_empty() {
                    st.parallel(&leaves[cands[ix.index(cands.len())]].var).unwrap();
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
    prop::collection::vec((1i64..7, prop::bool::weighted(0.4)).prop_map(|(n, sym)| DimS { n, sym }), rank)
}

/// How an input is read: broadcast dims (size 1, read at 0) and reversed dims.
#[derive(Clone, Debug)]
struct ReadS {
    bcast: [bool; 3],
    flip: [bool; 3],
}

fn read_s() -> impl Strategy<Value = ReadS> {
    ([prop::bool::weighted(0.15); 3], [prop::bool::weighted(0.2); 3]).prop_map(|(bcast, flip)| ReadS { bcast, flip })
}

struct Input {
    te: Te,
    shape: Vec<i64>,
    used: bool,
}

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
    /// Logical bits of every input (by slot) -> canonical bits of the expected output.
    reference: Box<dyn Fn(&[Vec<u64>]) -> Vec<u64>>,
}

fn dim_exprs(dims: &[DimS]) -> Vec<Expr> {
    dims.iter()
        .enumerate()
        .map(|(d, x)| if x.sym { te::var(&format!("n{d}")) } else { Expr::int(x.n) })
        .collect()
}

/// The index at which an input of extents `ext` is read for domain index `i`.
fn input_index(i: &[Expr], ext: &[Expr], rs: &ReadS) -> Vec<Expr> {
    (0..i.len())
        .map(|d| {
            if rs.bcast[d] {
                Expr::int(0)
            } else if rs.flip[d] {
                ext[d].sub(&Expr::int(1)).sub(&i[d])
            } else {
                i[d].clone()
            }
        })
        .collect()
}

fn input_index_v(i: &[i64], ext: &[i64], rs: &ReadS) -> Vec<i64> {
    (0..i.len()).map(|d| if rs.bcast[d] { 0 } else if rs.flip[d] { ext[d] - 1 - i[d] } else { i[d] }).collect()
}

/// Elementwise programs: `C = tree(inputs)`, or with a producer `P = ptree(inputs)` over
/// the domain grown by `halo`, and `C = tree(P at offsets, inputs)`.
#[derive(Clone, Debug)]
struct EwCase {
    main: Ty,
    dims: Vec<DimS>,
    n_in: u8,
    reads: Vec<ReadS>,
    tree: E,
    producer: Option<(E, [i64; 3], Vec<[i64; 3]>)>,
}

fn ew_case(main: Ty, two_stage: bool) -> impl Strategy<Value = EwCase> {
    let prod = if two_stage {
        (tree(main, 3, main), [0i64..3, 0i64..3, 0i64..3], prop::collection::vec(any::<[u8; 3]>(), 1..4))
            .prop_map(|(t, halo, offs)| {
                let offs = offs.iter().map(|o| [0, 1, 2].map(|d| o[d] as i64 % (halo[d] + 1))).collect();
                Some((t, halo, offs))
            })
            .boxed()
    } else {
        Just(None).boxed()
    };
    (dims(1..=3), 1u8..4, prop::collection::vec(read_s(), 3), rooted_tree(main, if two_stage { 3 } else { 4 }), prod)
        .prop_map(move |(dims, n_in, reads, tree, producer)| EwCase { main, dims, n_in, reads, tree, producer })
}

fn build_ew(c: &EwCase) -> Prog {
    let main = c.main;
    let rank = c.dims.len();
    let out_shape: Vec<i64> = c.dims.iter().map(|d| d.n).collect();
    let out_ext = dim_exprs(&c.dims);
    let halo: Vec<i64> = (0..rank).map(|d| c.producer.as_ref().map_or(0, |p| p.1[d])).collect();
    // Inputs span the producer's domain (the output's, grown by the halo).
    let dom_shape: Vec<i64> = (0..rank).map(|d| out_shape[d] + halo[d]).collect();
    let dom_ext: Vec<Expr> =
        (0..rank).map(|d| if halo[d] == 0 { out_ext[d].clone() } else { out_ext[d].add(&Expr::int(halo[d])) }).collect();
    let reads: Vec<ReadS> = c.reads.clone();
    let n_in = c.n_in;
    let (tree, ptree) = match &c.producer {
        None => (c.tree.norm(n_in, 1, rank as u8), None),
        Some((pt, _, offs)) => {
            let ptree = pt.norm(n_in, 1, rank as u8).with_read(0, main);
            let tree = c.tree.norm(n_in + 1, offs.len() as u8, rank as u8).with_read(0, main);
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
    let in_shapes: Vec<Vec<i64>> =
        (0..n_in as usize).map(|k| (0..rank).map(|d| if reads[k].bcast[d] { 1 } else { dom_shape[d] }).collect()).collect();
    let inputs: Vec<Input> = (0..n_in as usize)
        .map(|k| {
            let ext: Vec<Expr> = (0..rank).map(|d| if reads[k].bcast[d] { Expr::int(1) } else { dom_ext[d].clone() }).collect();
            Input { te: te::placeholder(&ext, main.dtype(), &format!("A{k}")).unwrap(), shape: in_shapes[k].clone(), used: used.contains(&(k as u8)) }
        })
        .collect();
    let in_te: Vec<Te> = inputs.iter().map(|i| i.te.clone()).collect();
    let read_input = {
        let in_te = in_te.clone();
        let reads = reads.clone();
        move |k: usize, i: &[Expr]| in_te[k].idx(&input_index(i, in_te[k].shape(), &reads[k]))
    };
    let (out, producer) = match &ptree {
        None => {
            let c_te = te::compute(&out_ext, |i| tree.te(&|s, _| read_input(s as usize, i), i), "C").unwrap();
            (c_te, None)
        }
        Some(pt) => {
            let p = te::compute(&dom_ext, |j| pt.te(&|s, _| read_input(s as usize, j), j), "P").unwrap();
            let p2 = p.clone();
            let offs2 = offs.clone();
            let c_te = te::compute(
                &out_ext,
                |i| {
                    tree.te(
                        &|s, o| {
                            if s == 0 {
                                let at: Vec<Expr> = (0..rank).map(|d| i[d].add(&Expr::int(offs2[o as usize][d]))).collect();
                                p2.idx(&at)
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
        (0..shape.len()).map(|d| if sym(d) { None } else { Some(shape[d]) }).collect()
    };
    let out_root = fixed(&out_shape, &|d| c.dims[d].sym);
    let prod_root = fixed(&dom_shape, &|d| c.dims[d].sym);
    let out_ty = tree.ty();
    let reference = {
        let (out_shape, dom_shape, in_shapes) = (out_shape.clone(), dom_shape.clone(), in_shapes.clone());
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
                                    let j: Vec<i64> = (0..rank).map(|d| i[d] + offs[o as usize][d]).collect();
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
    Prog { main, inputs, out, out_shape, out_ty, producer, out_root, prod_root, value_eq: false, reference }
}

/// Reductions: `C[kept] = op over reduced dims of q(tree(inputs))`, or of `q(tree(P,
/// inputs))` with an elementwise producer `P = ptree(inputs)` over the whole domain. `q`
/// quantises float sums to integers in [-8, 8] and float products to {2, 1, -1, -0.5}, so
/// every accumulation order gives the same bits.
#[derive(Clone, Debug)]
struct RedCase {
    main: Ty,
    dims: Vec<DimS>,
    red: (Index, Index, bool),
    op: ReduceOp,
    n_in: u8,
    flips: Vec<[bool; 3]>,
    tree: E,
    producer: Option<E>,
}

fn red_case(main: Ty, two_stage: bool) -> impl Strategy<Value = RedCase> {
    let prod = if two_stage { tree(main, 3, main).prop_map(Some).boxed() } else { Just(None).boxed() };
    (
        dims(2..=3),
        (any::<Index>(), any::<Index>(), any::<bool>()),
        select(vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod]),
        1u8..3,
        prop::collection::vec([prop::bool::weighted(0.25); 3], 2),
        tree(main, 3, main),
        prod,
    )
        .prop_map(move |(dims, red, op, n_in, flips, tree, producer)| RedCase { main, dims, red, op, n_in, flips, tree, producer })
}

fn quantise(op: ReduceOp, e: E) -> E {
    let ty = e.ty();
    if !ty.is_float() {
        return e;
    }
    let c = |v: f64| bx(E::C(ty, v));
    match op {
        ReduceOp::Sum => E::Bin(BinOp::Max, bx(E::Bin(BinOp::Min, bx(E::Un(UnOp::Floor, bx(e))), c(8.0))), c(-8.0)),
        ReduceOp::Prod => {
            let cmp = |op: CmpOp, v: f64| bx(E::Cmp(op, bx(e.clone()), c(v)));
            E::Sel(cmp(CmpOp::Gt, 1.0), c(2.0), bx(E::Sel(cmp(CmpOp::Lt, -1.0), c(-0.5), bx(E::Sel(cmp(CmpOp::Gt, 0.0), c(1.0), c(-1.0))))))
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
    let reads: Vec<ReadS> = c.flips.iter().map(|f| ReadS { bcast: [false; 3], flip: *f }).collect();
    // Input 0 is always read, so that every symbolic dim is bound by an argument.
    let (tree, ptree) = match &c.producer {
        None => (quantise(c.op, c.tree.norm(n_in, 1, rank as u8).with_read(0, main)), None),
        Some(pt) => {
            let ptree = pt.norm(n_in, 1, rank as u8).with_read(0, main);
            (quantise(c.op, c.tree.norm(n_in + 1, 1, rank as u8).with_read(0, main)), Some(ptree))
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
        move |k: usize, i: &[Expr]| in_te[k].idx(&input_index(i, in_te[k].shape(), &reads[k]))
    };
    let raxes: Vec<IterVar> = red.iter().map(|&d| te::reduce_axis(Expr::int(0), ext[d].clone(), &format!("r{d}")).unwrap()).collect();
    let producer = ptree.as_ref().map(|pt| te::compute(&ext, |j| pt.te(&|s, _| read_input(s as usize, j), j), "P").unwrap());
    let full = |i: &[Expr]| -> Vec<Expr> {
        (0..rank)
            .map(|d| match red.iter().position(|&r| r == d) {
                Some(k) => te::ax(&raxes[k]),
                None => i[kept.iter().position(|&x| x == d).unwrap()].clone(),
            })
            .collect()
    };
    let out = te::compute(
        &out_ext,
        |i| {
            let j = full(i);
            let body = tree.te(
                &|s, _| match &producer {
                    Some(p) if s == 0 => p.idx(&j),
                    Some(_) => read_input(s as usize - 1, &j),
                    None => read_input(s as usize, &j),
                },
                &j,
            );
            ok(te::reduce(c.op, body, &raxes))
        },
        "C",
    )
    .unwrap();
    let fixed = |d: usize| if c.dims[d].sym { None } else { Some(shape[d]) };
    let out_root: Vec<Option<i64>> = kept.iter().chain(&red).map(|&d| fixed(d)).collect();
    let prod_root: Vec<Option<i64>> = (0..rank).map(fixed).collect();
    let op = c.op;
    let reference = {
        let out_shape = out_shape.clone();
        Box::new(move |data: &[Vec<u64>]| -> Vec<u64> {
            let rd_in = |k: usize, j: &[i64]| V::from_bits(data[k][flatten(&input_index_v(j, &shape, &reads[k]), &shape)], main);
            let red_shape: Vec<i64> = red.iter().map(|&d| shape[d]).collect();
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
                                Some(k) => ri[k],
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
    Prog { main, inputs, out, out_shape, out_ty: main, producer, out_root, prod_root, value_eq, reference }
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
                s.compute_at(prod, &p.out, &out_leaves[ix.index(out_leaves.len())].var).unwrap();
            }
        }
    }
    s
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

/// First differing element of two canonical bit vectors.
fn first_diff(a: &[u64], b: &[u64], ty: Ty, value: bool) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("lengths {} and {}", a.len(), b.len()));
    }
    a.iter().zip(b).enumerate().find(|(_, (x, y))| if value { !value_eq(**x, **y, ty) } else { x != y }).map(|(i, (x, y))| {
        let n = a.iter().zip(b).filter(|(x, y)| if value { !value_eq(**x, **y, ty) } else { x != y }).count();
        format!("element {i}: {} vs {} ({n} of {} elements differ)", fmt_bits(*x, ty), fmt_bits(*y, ty), a.len())
    })
}

fn run_case(p: &Prog, sc: &SchedS, views: &[ViewS], seed: u64) -> Result<(), TestCaseError> {
    let mut rng = Rng(seed);
    let main = p.main;
    // Inputs: random strided views over bigger buffers; `logical` is what the program sees.
    let mut logical: Vec<Vec<u64>> = Vec::new();
    let mut strided: Vec<Tensor> = Vec::new();
    let mut compact: Vec<Tensor> = Vec::new();
    for (k, inp) in p.inputs.iter().enumerate() {
        let v = make_view(&inp.shape, &views[k], true, main, &mut || random_value(main, &mut rng).bits_raw());
        let bits = tensor_bits(&v.view, main);
        compact.push(tensor_from_bits(&bits, &inp.shape, main));
        strided.push(v.view);
        logical.push(bits);
    }
    let want: Vec<u64> = (p.reference)(&logical);
    let args: Vec<Te> = p.inputs.iter().filter(|i| i.used).map(|i| i.te.clone()).chain([p.out.clone()]).collect();
    let used_vals = |ts: &[Tensor]| -> Vec<Value> {
        p.inputs.iter().zip(ts).filter(|(i, _)| i.used).map(|(_, t)| Value::Tensor(t.clone())).collect()
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
    for target in BACKENDS {
        let m = build(&s0, &args, target, "f").map_err(|e| fail(format!("{target}: unscheduled build failed: {e}")))?;
        let f = m.get_function("f").unwrap();
        let out_bits: Vec<u64> = (0..numel(&p.out_shape)).map(|_| poison(&mut rng)).collect();
        let out = tensor_from_bits(&out_bits, &p.out_shape, out_ty);
        let mut vals = used_vals(&compact);
        vals.push(Value::Tensor(out.clone()));
        f.call(&vals).map_err(|e| fail(format!("{target}: unscheduled call failed: {e}")))?;
        plain.push(canon_all(tensor_bits(&out, out_ty)));
    }
    if let Some(d) = first_diff(&want, &plain[0], out_ty, false) {
        return Err(fail(format!("Rust reference vs unscheduled interp: {d}")));
    }
    if let Some(d) = first_diff(&plain[0], &plain[1], out_ty, false) {
        return Err(fail(format!("unscheduled: interp vs cpu: {d}")));
    }

    // Scheduled, strided inputs and output.
    let s1 = schedule(p, sc);
    let mut got: Vec<Vec<u64>> = Vec::new();
    let mut ir = String::new();
    for target in BACKENDS {
        let m = build(&s1, &args, target, "f").map_err(|e| fail(format!("{target}: scheduled build failed: {e}")))?;
        if ir.is_empty() {
            ir = m.get_source("ir").unwrap();
        }
        let f = m.get_function("f").unwrap();
        let mut prng = Rng(seed ^ 0xABCD);
        let ov = make_view(&p.out_shape, &views[3], false, out_ty, &mut || poison(&mut prng));
        let before = tensor_bits(&ov.base, out_ty);
        let mut vals = used_vals(&strided);
        vals.push(Value::Tensor(ov.view.clone()));
        f.call(&vals).map_err(|e| fail(format!("{target}: scheduled call failed: {e}\n{ir}")))?;
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
    if let Some(d) = first_diff(&got[0], &got[1], out_ty, false) {
        return Err(fail(format!("scheduled: interp vs cpu: {d}\n{ir}")));
    }
    if let Some(d) = first_diff(&plain[0], &got[0], out_ty, p.value_eq) {
        return Err(fail(format!("unscheduled vs scheduled (interp): {d}\n{ir}")));
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

fn config(cases: u32) -> Config {
    Config { cases, failure_persistence: None, ..Config::default() }
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
