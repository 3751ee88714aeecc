//! The native functions every runtime registers at start-up (`registry.rs` inserts
//! `functions()` before anything else can look a name up). Production code, not test code:
//! their names (`testing.*`) say what they are for: the tests, the demo and the benchmarks
//! (`testing.nop` measures the bare cost of a call) use them, and they are the model for users
//! who register their own native functions. Renaming one breaks those callers.
//!
//! - `testing.nop(...)`: takes any arguments, does nothing, returns None.
//! - `testing.echo(x)`: returns its one argument (of any kind) unchanged.
//! - `testing.axpy(alpha, x, y)`: `y <- alpha*x + y` in place for float32/float64, any shape
//!   and strides. `x` may have zero strides; `y` must be writable, free of self-overlap and
//!   either identical to `x` or disjoint from it (a partial overlap would make the result
//!   depend on the visiting order).

use crate::dtype::DType;
use crate::error::{ArgName, Error, Result};
use crate::function::{Function, Param, ParamKind, Signature, TensorSpec};
use crate::host_lock::{without_host_lock, RELEASE_GRAIN};
use crate::layout::LoopNest;
use crate::parallel::PARALLEL_GRAIN;
use crate::tensor::Tensor;
use crate::value::Value;

/// The built-in functions, in this order: `testing.echo`, `testing.nop`, `testing.axpy` (tests
/// take them by index).
pub fn functions() -> Vec<Function> {
    vec![echo(), nop(), axpy()]
}

/// Takes any arguments and does nothing: measures the bare cost of a call.
fn nop() -> Function {
    Function::new("testing.nop", |_| Ok(Value::Null))
}

fn echo() -> Function {
    let sig = Signature::new(vec![Param::new("x", ParamKind::Any)]);
    Function::with_signature("testing.echo", sig, |args| Ok(args[0].clone()))
}

fn axpy() -> Function {
    let float_tensor = |output| {
        ParamKind::Tensor(TensorSpec {
            dtypes: vec![DType::F32, DType::F64],
            output,
            ..Default::default()
        })
    };
    let sig = Signature::new(vec![
        Param::new("alpha", ParamKind::Float),
        Param::new("x", float_tensor(false)),
        Param::new("y", float_tensor(true)),
    ]);
    Function::with_signature("testing.axpy", sig, |args| {
        let alpha = args[0].as_f64().expect("checked by the signature");
        let (x, y) = (
            args[1].as_tensor().expect("checked"),
            args[2].as_tensor().expect("checked"),
        );
        run_axpy(alpha, x, y)?;
        Ok(Value::Null)
    })
}

const NAME: &str = "testing.axpy";
const X: ArgName<'static> = ArgName {
    index: 1,
    name: Some("x"),
};
const Y: ArgName<'static> = ArgName {
    index: 2,
    name: Some("y"),
};

fn run_axpy(alpha: f64, x: &Tensor, y: &Tensor) -> Result<()> {
    if x.dtype() != y.dtype() {
        return Err(Error::DType(format!(
            "{NAME}: {X} has dtype {} but {Y} has dtype {}; they must match",
            x.dtype(),
            y.dtype()
        )));
    }
    if x.shape() != y.shape() {
        return Err(Error::Shape(format!(
            "{NAME}: {X} has shape {:?} but {Y} has shape {:?}; they must match",
            x.shape(),
            y.shape()
        )));
    }
    if let (Some((xl, xh)), Some((yl, yh))) = (x.byte_range(), y.byte_range()) {
        let same_view = x.data_ptr() == y.data_ptr() && x.strides() == y.strides();
        if xl < yh && yl < xh && !same_view {
            return Err(Error::Layout(format!(
                "{NAME}: output {Y} partially overlaps input {X} in memory; pass the same tensor for both or disjoint tensors"
            )));
        }
    }
    match y.dtype() {
        DType::F32 => strided_axpy::<f32>(alpha as f32, x, y),
        DType::F64 => strided_axpy::<f64>(alpha, x, y),
        other => {
            return Err(Error::Internal(format!(
                "{NAME}: dtype {other} passed the signature check"
            )))
        }
    }
    Ok(())
}

/// Raw addresses that may cross threads; every task writes a disjoint set of `y` elements.
struct Ptrs<T> {
    x: *const T,
    y: *mut T,
}
// SAFETY: tasks write disjoint elements of y (y is checked free of self-overlap) and only
// read x, which is y itself (same layout, same element) or disjoint from y.
unsafe impl<T> Send for Ptrs<T> {}
impl<T> Clone for Ptrs<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Ptrs<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Ptrs<T> {}

impl<T> Ptrs<T> {
    /// Read through a method so closures capture the whole `Send` struct, not its fields.
    fn get(&self) -> Ptrs<T> {
        *self
    }
}

fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

trait Float: Copy + std::ops::Mul<Output = Self> + std::ops::Add<Output = Self> + Send + Sync {}
impl Float for f32 {}
impl Float for f64 {}

fn strided_axpy<T: Float>(alpha: T, x: &Tensor, y: &Tensor) {
    if y.numel() == 0 {
        return;
    }
    // Order the loops by y's layout so the writes stream through memory.
    let nest = LoopNest::new(y.shape(), [y.strides(), x.strides()]);
    let (n, [ys, xs]) = nest.inner();
    let p = Ptrs {
        x: x.data_ptr() as *const T,
        y: y.data_ptr() as *mut T,
    };
    // Callers pass row < rows and lo..hi within 0..n.
    let run = |row: i64, lo: i64, hi: i64| {
        // SAFETY: with row < rows and lo..hi within 0..n, every offset is an index inside the
        // validated shape of both tensors; y's elements are distinct (no self-overlap).
        unsafe {
            let [yo, xo] = nest.row_offsets(row);
            let Ptrs { x: xp, y: yp } = p.get();
            let (yp, xp) = (yp.offset(yo as isize), xp.offset(xo as isize));
            if ys == 1 && xs == 1 {
                for k in lo..hi {
                    *yp.offset(k as isize) =
                        alpha * *xp.offset(k as isize) + *yp.offset(k as isize);
                }
            } else {
                for k in lo..hi {
                    let (yk, xk) = (yp.offset((k * ys) as isize), xp.offset((k * xs) as isize));
                    *yk = alpha * *xk + *yk;
                }
            }
        }
    };
    let rows = nest.rows();
    let total = rows * n;
    if total < RELEASE_GRAIN {
        (0..rows).for_each(|r| run(r, 0, n));
        return;
    }
    without_host_lock(|| {
        if total < PARALLEL_GRAIN || crate::parallel::num_threads() == 1 {
            (0..rows).for_each(|r| run(r, 0, n));
        } else {
            parallel_rows(&run, rows, n);
        }
    })
}

/// Runs `run(row, lo, hi)` over all rows on rivet's threads (`parallel::for_each_chunk`), in
/// tasks of about BLOCK elements: a slice of one long row, or several short rows.
fn parallel_rows(run: &(dyn Fn(i64, i64, i64) + Sync), rows: i64, n: i64) {
    const BLOCK: i64 = 1 << 14;
    use crate::parallel::for_each_chunk;
    if n >= BLOCK {
        let per_row = ceil_div(n, BLOCK);
        for_each_chunk(rows * per_row, &|t| {
            let (row, b) = (t / per_row, t % per_row);
            run(row, b * BLOCK, ((b + 1) * BLOCK).min(n));
        });
    } else {
        let rows_per_task = ceil_div(BLOCK, n);
        for_each_chunk(ceil_div(rows, rows_per_task), &|t| {
            for row in t * rows_per_task..((t + 1) * rows_per_task).min(rows) {
                run(row, 0, n);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axpy_call(alpha: f64, x: &Tensor, y: &Tensor) -> Result<Value> {
        axpy().call(&[
            Value::Float(alpha),
            Value::Tensor(x.clone()),
            Value::Tensor(y.clone()),
        ])
    }

    #[test]
    fn contiguous_and_transposed() {
        let x = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
        let y = Tensor::from_slice(&[10f32, 20., 30., 40., 50., 60.], &[2, 3]).unwrap();
        axpy_call(2.0, &x, &y).unwrap();
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            vec![12., 24., 36., 48., 60., 72.]
        );
        // y viewed transposed: element (i, j) of yt is y[j, i].
        let yt = y.as_strided(&[3, 2], &[1, 3], 0).unwrap();
        let xt = Tensor::from_slice(&[1f32; 6], &[3, 2]).unwrap();
        axpy_call(-1.0, &xt, &yt).unwrap();
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            vec![11., 23., 35., 47., 59., 71.]
        );
    }

    #[test]
    fn errors_name_arguments() {
        let x = Tensor::zeros(&[4], DType::F32).unwrap();
        let y = Tensor::zeros(&[4], DType::F64).unwrap();
        let e = axpy_call(1.0, &x, &y).unwrap_err();
        assert!(matches!(e, Error::DType(_)));
        assert!(e
            .to_string()
            .contains("argument 1 ('x') has dtype float32 but argument 2 ('y') has dtype float64"));
        let y5 = Tensor::zeros(&[5], DType::F32).unwrap();
        assert!(matches!(axpy_call(1.0, &x, &y5), Err(Error::Shape(_))));
        let overlap = x.as_strided(&[2], &[1], 1).unwrap();
        let x2 = x.as_strided(&[2], &[1], 0).unwrap();
        assert!(matches!(
            axpy_call(1.0, &x2, &overlap),
            Err(Error::Layout(_))
        ));
        assert!(matches!(
            axpy_call(1.0, &x, &x.to_read_only()),
            Err(Error::ReadOnly(_))
        ));
    }
}
