//! Cross-thread reductions (`Stmt::AllReduce`) in the interpreter, through the schedules that
//! make them: `split(k, factor=T)` then `bind(k.inner, "threadIdx.x")`. Each result is
//! compared with a plain-Rust evaluation of the documented order (per-thread partials over the
//! serial loop, then `allreduce_group`'s tree), bit for bit, on random data; integer sums
//! wrap; max / min / prod; ragged splits; several groups per block (threadIdx.y); and the
//! schedules and IR the rules refuse.

use super::gpu::{allreduce_group, first_offset};
use super::{run, Value};
use crate::codegen::{int_slots, CallFrame};
use crate::error::Result;
use crate::ir::expr::{Expr, ReduceOp};
use crate::ir::stmt::{ForKind, PrimFunc, Stmt, ThreadTag};
use crate::lower::{lower, Options, Source};
use crate::schedule::Schedule;
use crate::target::Target;
use crate::te;
use rivet_runtime::DType;

/// `R[i] = op over k of A[i, k]` for `A: [n, k]` (symbolic), its reduction split by `threads`
/// and bound to threadIdx.x, rows on blockIdx.x (or, with `rows_per_block`, split and the
/// inner part on threadIdx.y).
fn row_reduce(
    op: ReduceOp,
    dt: DType,
    threads: i64,
    rows_per_block: Option<i64>,
) -> Result<PrimFunc> {
    let (n, k) = (te::var("n"), te::var("k"));
    let a = te::placeholder([&n, &k], dt, "A")?;
    let r = te::reduce_axis(0, &k, "r")?;
    let out = te::compute(
        [&n],
        |[i]| {
            let v = a.at((i, &r));
            te::reduction(op, v, &r)
        },
        "R",
    )?;
    let mut s = Schedule::new(std::slice::from_ref(&out))?;
    let st = s.stage(&out)?;
    let i = out.axis()[0].var.clone();
    let (ko, ki) = st.split(&r.var, Some(Expr::int(threads)), None)?;
    match rows_per_block {
        None => {
            st.reorder(&[i.clone(), ki.clone(), ko])?;
            st.bind(&i, ThreadTag::BlockX)?;
        }
        Some(y) => {
            let (io, ii) = st.split(&i, Some(Expr::int(y)), None)?;
            st.reorder(&[io.clone(), ii.clone(), ki.clone(), ko])?;
            st.bind(&io, ThreadTag::BlockX)?;
            st.bind(&ii, ThreadTag::ThreadY)?;
        }
    }
    st.bind(&ki, ThreadTag::ThreadX)?;
    let args = [a, out];
    let src = Source::Schedule {
        sched: &s,
        args: &args,
        name: "rowred",
    };
    Ok(lower(src, &Target::interp(), Options::default())?.func)
}

/// Runs `f` on a compact `[rows, cols]` input (raw little-endian elements of `dt`); returns
/// the output's raw elements (poisoned before the call).
fn call(f: &PrimFunc, dt: DType, rows: i64, cols: i64, input: &[u8]) -> Result<Vec<u8>> {
    let mut a = input.to_vec();
    let mut out = vec![0xA5u8; rows as usize * dt.size()];
    let ints: Vec<i64> = int_slots(f)
        .iter()
        .map(|v| match &*v.name {
            "n" => rows,
            "k" => cols,
            "A.s0" => cols,
            _ => 1,
        })
        .collect();
    let frame = CallFrame {
        ptrs: vec![a.as_mut_ptr(), out.as_mut_ptr()].into(),
        ints: ints.into(),
    };
    // SAFETY: compact buffers of the shapes the frame's dims and strides describe.
    unsafe { run(f, &frame) }?;
    Ok(out)
}

fn lcg(s: &mut u64) -> u64 {
    *s = s
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *s >> 11
}

fn value_of(dt: DType, b: &[u8]) -> Value {
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(b);
    let bits = u64::from_le_bytes(w);
    match dt {
        DType::F32 => Value::F32(f32::from_bits(bits as u32)),
        DType::F64 => Value::F64(f64::from_bits(bits)),
        DType::F16 => Value::F32(half::f16::from_bits(bits as u16).to_f32()),
        DType::I32 => Value::Int(bits as u32 as i32 as i64),
        DType::I8 => Value::Int(bits as u8 as i8 as i64),
        DType::U16 => Value::Int(bits as u16 as i64),
        other => panic!("{other}"),
    }
}

fn bytes_of(dt: DType, v: Value) -> Vec<u8> {
    match (dt, v) {
        (DType::F32, Value::F32(x)) => x.to_le_bytes().to_vec(),
        (DType::F64, Value::F64(x)) => x.to_le_bytes().to_vec(),
        (DType::F16, Value::F32(x)) => half::f16::from_f32(x).to_bits().to_le_bytes().to_vec(),
        (_, Value::Int(x)) => x.to_le_bytes()[..dt.size()].to_vec(),
        other => panic!("{other:?}"),
    }
}

/// The documented result for one row: thread `t` accumulates `row[ko * T + t]` for
/// `ko = 0, 1, ...` from the identity (in the dtype: float16 rounded at every update, as the
/// accumulator is stored), then `allreduce_group` over the threads.
fn reference(op: ReduceOp, dt: DType, row: &[Value], threads: usize) -> Value {
    let comb = |a: Value, b: Value| -> Value {
        match (a, b) {
            (Value::F32(x), Value::F32(y)) => Value::F32(match op {
                ReduceOp::Sum => x + y,
                ReduceOp::Prod => x * y,
                ReduceOp::Max => crate::codegen::cpu_lib::math::fmax(x, y),
                ReduceOp::Min => crate::codegen::cpu_lib::math::fmin(x, y),
            }),
            (Value::F64(x), Value::F64(y)) => Value::F64(match op {
                ReduceOp::Sum => x + y,
                ReduceOp::Prod => x * y,
                ReduceOp::Max => crate::codegen::cpu_lib::math::fmax(x, y),
                ReduceOp::Min => crate::codegen::cpu_lib::math::fmin(x, y),
            }),
            (Value::Int(x), Value::Int(y)) => {
                let w = match op {
                    ReduceOp::Sum => x.wrapping_add(y),
                    ReduceOp::Prod => x.wrapping_mul(y),
                    ReduceOp::Max => x.max(y),
                    ReduceOp::Min => x.min(y),
                };
                let bits = dt.size() as u32 * 8;
                Value::Int(match dt {
                    DType::U16 => w & 0xffff,
                    _ => (w << (64 - bits)) >> (64 - bits),
                })
            }
            other => panic!("{other:?}"),
        }
    };
    let ident = value_of(
        dt,
        &bytes_of(
            dt,
            match (dt, op) {
                (DType::F32 | DType::F16, ReduceOp::Sum) => Value::F32(0.0),
                (DType::F32 | DType::F16, ReduceOp::Prod) => Value::F32(1.0),
                (DType::F32 | DType::F16, ReduceOp::Max) => Value::F32(f32::NEG_INFINITY),
                (DType::F32 | DType::F16, ReduceOp::Min) => Value::F32(f32::INFINITY),
                (DType::F64, ReduceOp::Sum) => Value::F64(0.0),
                (DType::F64, _) => panic!("not used"),
                (_, ReduceOp::Sum) => Value::Int(0),
                (_, ReduceOp::Prod) => Value::Int(1),
                (DType::I32, ReduceOp::Max) => Value::Int(i32::MIN as i64),
                (DType::I32, ReduceOp::Min) => Value::Int(i32::MAX as i64),
                (DType::U16, ReduceOp::Max) => Value::Int(0),
                (DType::U16, ReduceOp::Min) => Value::Int(0xffff),
                (DType::I8, ReduceOp::Max) => Value::Int(-128),
                (DType::I8, ReduceOp::Min) => Value::Int(127),
                other => panic!("{other:?}"),
            },
        ),
    );
    // Stored in the accumulator's dtype after each update (float16 rounds).
    let store = |v: Value| value_of(dt, &bytes_of(dt, v));
    let partials: Vec<Value> = (0..threads)
        .map(|t| {
            let mut acc = ident;
            for x in row.iter().skip(t).step_by(threads) {
                acc = store(comb(acc, *x));
            }
            acc
        })
        .collect();
    store(allreduce_group(&partials, |a, b| Some(comb(a, b))).unwrap())
}

/// Random elements of `dt`: floats in [-8, 8) with 1/16 steps and a few exact zeros of both
/// signs; ints of all magnitudes (sums wrap).
fn random(dt: DType, n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::new();
    for k in 0..n {
        let r = lcg(&mut s);
        let x = (r % 256) as f64 / 16.0 - 8.0 + (r % 7) as f64 * 1e-3;
        let x = if k % 29 == 5 { -0.0 } else { x };
        out.extend(match dt {
            DType::F32 => (x as f32).to_le_bytes().to_vec(),
            DType::F64 => x.to_le_bytes().to_vec(),
            DType::F16 => half::f16::from_f64(x).to_bits().to_le_bytes().to_vec(),
            _ => (r as i64).wrapping_mul(0x9E37_79B9).to_le_bytes()[..dt.size()].to_vec(),
        });
    }
    out
}

fn check(op: ReduceOp, dt: DType, threads: i64, rows_per_block: Option<i64>, rows: i64, cols: i64) {
    let f = row_reduce(op, dt, threads, rows_per_block)
        .unwrap_or_else(|e| panic!("{op:?} {dt} T={threads}: {e}"));
    let input = random(dt, (rows * cols) as usize, (rows * 1000 + cols) as u64);
    let got = call(&f, dt, rows, cols, &input).unwrap_or_else(|e| panic!("{e}\n{f}"));
    let sz = dt.size();
    for i in 0..rows as usize {
        let row: Vec<Value> = input[i * cols as usize * sz..(i + 1) * cols as usize * sz]
            .chunks(sz)
            .map(|b| value_of(dt, b))
            .collect();
        let want = bytes_of(
            dt,
            reference(op, dt, &row, threads.min(cols.max(1)) as usize),
        );
        let mine = &got[i * sz..(i + 1) * sz];
        assert!(
            mine == want.as_slice(),
            "{op:?} {dt}, {threads} threads, rows {rows} x {cols}: row {i} is {:?}, want {:?}",
            value_of(dt, mine),
            value_of(dt, &want)
        );
    }
}

#[test]
fn shuffle_tree_offsets() {
    assert_eq!(
        [0, 1, 2, 3, 4, 5, 32, 33].map(first_offset),
        [0, 0, 1, 2, 2, 4, 16, 32]
    );
    // Every value is combined exactly once, whatever the count: a count of ones, and the
    // smallest index (max of negated indices) of the group.
    for n in [1usize, 2, 3, 5, 31, 32, 33, 64, 65, 255, 1000, 1024] {
        let add = |a: Value, b: Value| match (a, b) {
            (Value::Int(x), Value::Int(y)) => Some(Value::Int(x + y)),
            _ => None,
        };
        let ones = vec![Value::Int(1); n];
        assert_eq!(
            allreduce_group(&ones, add),
            Some(Value::Int(n as i64)),
            "{n}"
        );
        let idx: Vec<Value> = (0..n).map(|k| Value::Int(k as i64)).collect();
        let sum = (n * (n - 1) / 2) as i64;
        assert_eq!(allreduce_group(&idx, add), Some(Value::Int(sum)), "{n}");
    }
    assert_eq!(allreduce_group(&[], |a, _| Some(a)), None);
}

#[test]
fn sums_over_rows_of_every_length_match_the_documented_order() {
    // Lengths 1, 7, 31, 32, 33, 256, 1000 with thread counts that divide them, do not, and
    // exceed them; non-power-of-two thread counts (one group per block) included.
    for cols in [1, 7, 31, 32, 33, 256, 1000] {
        for threads in [1, 7, 32, 33, 256] {
            check(ReduceOp::Sum, DType::F32, threads, None, 3, cols);
        }
    }
    check(ReduceOp::Sum, DType::F32, 1024, None, 2, 3000);
    check(ReduceOp::Sum, DType::F64, 96, None, 2, 1000);
    check(ReduceOp::Sum, DType::F16, 64, None, 3, 200);
}

#[test]
fn max_min_prod_and_integer_sums_that_wrap() {
    for cols in [1, 33, 1000] {
        check(ReduceOp::Max, DType::F32, 256, None, 3, cols);
        check(ReduceOp::Min, DType::F32, 33, None, 3, cols);
        check(ReduceOp::Max, DType::I32, 64, None, 3, cols);
        check(ReduceOp::Min, DType::U16, 128, None, 3, cols);
    }
    check(ReduceOp::Prod, DType::F32, 32, None, 2, 40);
    check(ReduceOp::Sum, DType::I32, 256, None, 3, 1000);
    check(ReduceOp::Sum, DType::I8, 7, None, 3, 100);
    check(ReduceOp::Prod, DType::I8, 64, None, 3, 100);
}

#[test]
fn several_rows_per_block_on_thread_y() {
    // 4 rows per block (threadIdx.y) of 8 threads each: 10 rows leave a ragged last block.
    for (x, y) in [(8, 4), (32, 2), (64, 4), (1, 16)] {
        check(ReduceOp::Sum, DType::F32, x, Some(y), 10, 77);
        check(ReduceOp::Max, DType::F32, x, Some(y), 10, 77);
    }
}

#[test]
fn the_lowered_form_has_one_allreduce_and_no_init_kernel() {
    let f = row_reduce(ReduceOp::Sum, DType::F32, 256, None).unwrap();
    assert_eq!(f.kernels.len(), 1, "{f}");
    let mut n = 0;
    f.visit_all(&mut |s| {
        if let Stmt::AllReduce { op, tag, .. } = s {
            assert_eq!((*op, *tag), (ReduceOp::Sum, ThreadTag::ThreadX));
            n += 1;
        }
    });
    assert_eq!(n, 1);
    let text = f.to_string();
    for want in [
        "local R.acc: float32[1]",
        "R.acc[0] = allreduce sum over threadIdx.x of R.acc[0]",
        "if (r.inner == 0):",
    ] {
        assert!(text.contains(want), "{want:?} in\n{text}");
    }
}

fn refused(err: crate::error::Error, want: &str) {
    let e = err.to_string();
    assert!(e.contains(want), "expected {want:?} in: {e}");
}

#[test]
fn bad_bindings_of_reduction_loops_are_compile_errors() {
    let (n, k) = (te::var("n"), te::var("k"));
    let a = te::placeholder([&n, &k], DType::F32, "A").unwrap();
    let r = te::reduce_axis(0, &k, "r").unwrap();
    let out = te::compute([&n], |[i]| te::sum(a.at((i, &r)), &r), "R").unwrap();
    let mut s = Schedule::new(std::slice::from_ref(&out)).unwrap();
    let st = s.stage(&out).unwrap();
    let (ko, ki) = st.split(&r.var, Some(Expr::int(64)), None).unwrap();
    refused(
        st.bind(&ko, ThreadTag::BlockX).unwrap_err(),
        "cannot bind the reduction loop 'r.outer' to blockIdx.x",
    );
    refused(
        st.bind(&ki, ThreadTag::ThreadY).unwrap_err(),
        "a cross-thread reduction runs over threadIdx.x",
    );
    // Rows of a non-power-of-two number of threads next to threadIdx.y: refused at lowering.
    let f = row_reduce(ReduceOp::Sum, DType::F32, 48, Some(2));
    refused(f.unwrap_err(), "needs a power-of-two threadIdx.x extent");
    // A serial data-parallel loop inside a serial reduction loop: one partial per thread.
    let (m, k2) = (te::var("m"), te::var("k"));
    let b = te::placeholder((&m, &k2, 3), DType::F32, "B").unwrap();
    let r2 = te::reduce_axis(0, &k2, "r").unwrap();
    let out2 = te::compute((&m, 3), |[i, j]| te::sum(b.at((i, &r2, j)), &r2), "S").unwrap();
    let mut s2 = Schedule::new(std::slice::from_ref(&out2)).unwrap();
    let st2 = s2.stage(&out2).unwrap();
    let (i, j) = (out2.axis()[0].var.clone(), out2.axis()[1].var.clone());
    let (ko, ki) = st2.split(&r2.var, Some(Expr::int(32)), None).unwrap();
    st2.reorder(&[i.clone(), ki.clone(), ko.clone(), j.clone()])
        .unwrap();
    st2.bind(&i, ThreadTag::BlockX).unwrap();
    st2.bind(&ki, ThreadTag::ThreadX).unwrap();
    let args = [b.clone(), out2.clone()];
    let lowered = |s: &Schedule| {
        lower(
            Source::Schedule {
                sched: s,
                args: &args,
                name: "f",
            },
            &Target::interp(),
            Options::default(),
        )
        .map(|l| l.func)
    };
    refused(
        lowered(&s2).expect_err("refused"),
        "the data-parallel loop 'j' is inside a serial reduction loop",
    );
    // With j outside the serial reduction loop it is fine: one allreduce per j.
    s2.stage(&out2).unwrap().reorder(&[i, ki, j, ko]).unwrap();
    let f = lowered(&s2).unwrap();
    let mut bx = 0;
    f.visit_all(&mut |s| {
        if matches!(
            s,
            Stmt::For {
                kind: ForKind::Thread(ThreadTag::BlockX),
                ..
            }
        ) {
            bx += 1;
        }
    });
    assert_eq!(bx, 1, "{f}");
}
