//! Running a host callback (`ir::callback`), shared by the CPU backends: the interpreter
//! calls `run` directly, Cranelift code through the `rivet_callback` helper.
//!
//! Invariants:
//! - what the callback receives owns its memory: every input is a compact, read-only copy
//!   (`Tensor::copy_compact`) and `out` a fresh zeroed rivet tensor; only after the call is a
//!   result copied into the stage's buffer. A view the callback keeps after returning (a
//!   numpy array over `out`, say) therefore never points into a temporary the kernel frees or
//!   an argument the caller reuses: it keeps its own allocation alive (no use-after-free),
//!   and later writes through it change nothing the kernel reads;
//! - a result is checked before anything is written: a tensor of another shape is an
//!   `Error::Shape`, of another dtype an `Error::DType`, off the CPU an `Error::Device`, any
//!   other value but None an `Error::Argument`, each naming the stage and the callback;
//! - a panic of the callback is caught and becomes an `Error::Foreign` naming it;
//! - an error the function returns (a Python exception in `Error::Foreign`) is passed on
//!   unchanged, so Python sees the very exception with its traceback.

use crate::ir::callback::{Callback, CallbackKind};
use rivet_runtime::{DType, Device, Error, Result, Tensor, Value};

/// One region as the backend found it: the address of its element 0, and per dim the extent
/// and the stride in elements.
#[derive(Debug, Clone)]
pub struct RegionArg {
    pub ptr: *mut u8,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    pub dtype: DType,
}

impl RegionArg {
    /// A borrowed view of the region (never handed to a callback: only copied from or into).
    ///
    /// # Safety
    /// The region must address valid memory of its dtype for as long as the view lives.
    unsafe fn view(&self, read_only: bool) -> Result<Tensor> {
        // SAFETY: the caller's contract; the view does not outlive this module's functions.
        unsafe {
            Tensor::from_raw_parts(
                (),
                self.ptr,
                0,
                self.shape.as_slice().into(),
                self.strides.as_slice().into(),
                self.dtype,
                Device::Cpu,
                read_only,
            )
        }
    }
}

/// Calls `cb` on `regions` (`[out, in_0, ...]` for an extern stage, `[stage]` for a tap).
///
/// # Safety
/// Each region must address valid memory of its dtype, shape and strides, and the first
/// region of an extern callback must be writable and not read by the other regions' views
/// during the call (it is a distinct buffer: `ir::verify::intrin::check_call`).
pub unsafe fn run(cb: &Callback, regions: &[RegionArg]) -> Result<()> {
    let func = cb.function().map_err(Error::Internal)?;
    match cb.kind {
        CallbackKind::Tap => {
            let [r] = regions else {
                return Err(Error::Internal(format!(
                    "tap of '{}' with {} regions",
                    cb.stage,
                    regions.len()
                )));
            };
            // SAFETY: the caller's contract.
            let copy = unsafe { r.view(true)? }.copy_compact()?.to_read_only();
            call(cb, func, &[Value::Tensor(copy)])?;
            Ok(())
        }
        CallbackKind::Extern => {
            let Some((out_r, ins)) = regions.split_first() else {
                return Err(Error::Internal(format!(
                    "extern '{}' without an output region",
                    cb.stage
                )));
            };
            let mut args = Vec::with_capacity(regions.len());
            for r in ins {
                // SAFETY: the caller's contract.
                let copy = unsafe { r.view(true)? }.copy_compact()?.to_read_only();
                args.push(Value::Tensor(copy));
            }
            let out = Tensor::zeros(&out_r.shape, out_r.dtype)?;
            args.push(Value::Tensor(out.clone()));
            let got = call(cb, func, &args)?;
            let src = match got {
                Value::Null => out,
                Value::Tensor(t) => {
                    check_result(cb, func.name(), &t, out_r)?;
                    t
                }
                other => {
                    return Err(Error::Argument(format!(
                        "extern stage '{}': callback '{}' returned a {}; expected None (after writing its last argument) or a tensor of shape {:?} and dtype {}",
                        cb.stage,
                        func.name(),
                        other.kind(),
                        out_r.shape,
                        out_r.dtype
                    )))
                }
            };
            // SAFETY: the caller's contract: the output region is valid and writable.
            let dst = unsafe { out_r.view(false)? };
            copy_elements(&src, &dst);
            Ok(())
        }
    }
}

/// `func(args)`, a panic caught and reported as an error (it must not unwind through
/// generated code, nor abort a caller that could go on).
fn call(cb: &Callback, func: &rivet_runtime::Function, args: &[Value]) -> Result<Value> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| func.call(args))).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        // The callback's fault, not rivet's: a foreign error (`rivet.Error` in Python).
        let message = format!(
            "the host callback '{}' of stage '{}' panicked: {what}",
            func.name(),
            cb.stage
        );
        Err(Error::Foreign(rivet_runtime::ForeignError {
            payload: std::sync::Arc::new(message.clone()),
            message,
        }))
    })
}

/// A returned tensor must have the declared shape and dtype and live on the CPU.
fn check_result(cb: &Callback, fname: &str, t: &Tensor, want: &RegionArg) -> Result<()> {
    let what = format!("extern stage '{}': callback '{fname}' returned", cb.stage);
    if t.shape() != want.shape.as_slice() {
        return Err(Error::Shape(format!(
            "{what} a tensor of shape {:?}, expected shape {:?}",
            t.shape(),
            want.shape
        )));
    }
    if t.dtype() != want.dtype {
        return Err(Error::DType(format!(
            "{what} a tensor of dtype {}, expected dtype {}",
            t.dtype(),
            want.dtype
        )));
    }
    if !t.device().is_host() {
        return Err(Error::Device(format!(
            "{what} a tensor on {}, expected a CPU tensor",
            t.device()
        )));
    }
    Ok(())
}

/// `dst[i] = src[i]` for every index of their common shape (checked equal), element by
/// element through both layouts.
fn copy_elements(src: &Tensor, dst: &Tensor) {
    debug_assert_eq!(src.shape(), dst.shape());
    if src.numel() == 0 {
        return;
    }
    let size = dst.dtype().size() as isize;
    let nd = dst.ndim();
    let mut idx = vec![0i64; nd];
    let (s, d) = (src.data_ptr(), dst.data_ptr());
    loop {
        let so: i64 = idx.iter().zip(src.strides()).map(|(i, s)| i * s).sum();
        let dof: i64 = idx.iter().zip(dst.strides()).map(|(i, s)| i * s).sum();
        // SAFETY: `idx` is inside the common shape, so both offsets address elements of the
        // validated layouts; `copy` tolerates a source that overlaps the destination.
        unsafe {
            std::ptr::copy(
                s.offset(so as isize * size),
                d.offset(dof as isize * size),
                size as usize,
            )
        };
        let mut k = nd;
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < dst.shape()[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}
