//! Device memory for the suites: they pass host tensors and read host results on every
//! backend, and [`call`] makes that true of CUDA functions too. A host tensor argument is
//! mirrored into device memory (`cuMemcpyHtoD_v2`), the function runs on the mirror, the
//! device is synchronised (`cuCtxSynchronize`) and every writable argument is copied back
//! (`cuMemcpyDtoH_v2`), as is the result. So the suite checks, on the host, exactly what the
//! kernels did to device memory: what they wrote, and what they left alone.
//!
//! A mirror keeps the argument's layout: the bytes from its first element to its last (gaps
//! of a strided view included) go to one device allocation, and the device view has the same
//! strides and offset within it; arguments whose bytes overlap share one allocation, so
//! aliasing between arguments is the same on the device. Uploading the gaps and copying them
//! back means a kernel that writes where it must not shows up as a changed gap on the host.
//!
//! Everything runs on device 0 (`cuda:0`) on the legacy default stream, the stream rivet
//! launches on when the caller sets none. Through cudarc's `result` API, so the copies are
//! the driver's own entry points (a double that refuses a host read of device memory sees
//! exactly these calls).

use cudarc::driver::{result, sys};
use rivet_compiler::codegen::cuda::driver;
use rivet_runtime::{DType, Device, DeviceSpec, Error, Function, ParamKind, Result, Tensor, Value};

/// The device the suites run on.
pub const ORDINAL: usize = 0;

fn device_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Device(format!("rivet_tests::device: {what}: {e}"))
}

fn compiler_error(e: rivet_compiler::Error) -> Error {
    Error::from(e)
}

/// Whether `f` takes device memory: its signature admits tensors off the host (rivet's
/// compiled CUDA functions declare `DeviceSpec::Any` and check devices themselves).
pub fn takes_device_memory(f: &Function) -> bool {
    f.signature().is_some_and(|s| {
        s.params
            .iter()
            .any(|p| matches!(&p.kind, ParamKind::Tensor(t) if t.device != DeviceSpec::Host))
    })
}

/// Calls `f` with `args`, host tensors everywhere: a function taking device memory gets
/// device mirrors of them and its result comes back to the host (the module header). Errors
/// are `f`'s own, unchanged.
pub fn call(f: &Function, args: &[Value]) -> Result<Value> {
    if !takes_device_memory(f) {
        return f.call(args);
    }
    let mirrors = Mirrors::upload(args)?;
    let out = f.call(&mirrors.args);
    // Whatever `f` answered, its work is finished before anything is read back.
    synchronize()?;
    mirrors.download()?;
    to_host(out?)
}

/// `f` as a function of host tensors (the function [`call`] calls): `f` itself when it takes
/// host memory, else a wrapper with `f`'s name and output rule.
pub fn on_host(f: Function) -> Function {
    if !takes_device_memory(&f) {
        return f;
    }
    let name = f.name().to_string();
    let body = f.clone();
    match f.signature().cloned() {
        Some(sig) if f.has_output_rule() => {
            let rule = f.clone();
            Function::with_output_rule(
                name,
                sig,
                move |args| call(&body, args),
                move |shapes| rule.output_shapes(shapes, None),
            )
        }
        Some(sig) => Function::with_described_signature(name, sig, move |args| call(&body, args)),
        None => Function::new(name, move |args| call(&body, args)),
    }
}

/// Device mirrors of `args`' host tensors, for looking at (a call plan's verdict on them):
/// nothing is copied back.
pub fn mirror_args(args: &[Value]) -> Result<Vec<Value>> {
    Ok(Mirrors::upload(args)?.args)
}

/// Waits for all work queued on device [`ORDINAL`].
pub fn synchronize() -> Result<()> {
    let _bound = driver::enter(ORDINAL).map_err(compiler_error)?;
    result::ctx::synchronize().map_err(|e| device_error("cuCtxSynchronize", e))
}

/// A device copy of the host tensor `t` (same shape, strides and dtype; compact or not).
pub fn upload(t: &Tensor) -> Result<Tensor> {
    let m = Mirrors::upload(&[Value::Tensor(t.clone())])?;
    Ok(m.args[0]
        .as_tensor()
        .expect("one tensor in, one out")
        .clone())
}

/// A compact host copy of the device tensor `t`, after the work queued so far is done.
pub fn download(t: &Tensor) -> Result<Tensor> {
    synchronize()?;
    download_now(t)
}

fn download_now(t: &Tensor) -> Result<Tensor> {
    if t.device().is_host() {
        return Ok(t.clone());
    }
    if !t.is_compact() {
        return Err(Error::Device(format!(
            "rivet_tests::device: downloading a strided device view (shape {:?}, strides {:?}) is not supported",
            t.shape(),
            t.strides()
        )));
    }
    let host = Tensor::zeros(t.shape(), t.dtype())?;
    let bytes = t.numel() as usize * t.dtype().size();
    // rivet restores the caller's context after each call: bind the device's for the copy.
    let _bound = driver::enter(ORDINAL).map_err(compiler_error)?;
    if bytes > 0 {
        // SAFETY: `host` is a fresh compact allocation of exactly `bytes` bytes; `t` is a
        // compact device view of as many, kept alive by the borrow.
        let dst = unsafe { std::slice::from_raw_parts_mut(host.data_ptr(), bytes) };
        // SAFETY: as above; the copy is synchronous.
        unsafe { result::memcpy_dtoh_sync(dst, t.data_ptr() as sys::CUdeviceptr) }
            .map_err(|e| device_error("cuMemcpyDtoH_v2 (a result)", e))?;
    }
    Ok(host)
}

fn to_host(v: Value) -> Result<Value> {
    Ok(match v {
        Value::Tensor(t) => Value::Tensor(download_now(&t)?),
        Value::List(vs) => Value::List(
            vs.iter()
                .cloned()
                .map(to_host)
                .collect::<Result<Vec<_>>>()?
                .into(),
        ),
        other => other,
    })
}

/// One device allocation mirroring the host bytes `[lo, hi)` of one or more arguments.
struct Span {
    lo: usize,
    hi: usize,
    /// Some argument of the span is writable: its bytes are copied back.
    writable: bool,
    /// The device allocation (a compact u8 tensor; its owner frees it).
    dev: Tensor,
}

/// Device mirrors of a call's arguments.
struct Mirrors {
    args: Vec<Value>,
    spans: Vec<Span>,
}

impl Mirrors {
    fn upload(args: &[Value]) -> Result<Mirrors> {
        // The host byte ranges, merged where they overlap.
        let mut ranges: Vec<(usize, usize, bool)> = args
            .iter()
            .filter_map(Value::as_tensor)
            .filter(|t| t.device().is_host())
            .filter_map(|t| t.byte_range().map(|(lo, hi)| (lo, hi, !t.is_read_only())))
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(usize, usize, bool)> = Vec::new();
        for (lo, hi, w) in ranges {
            match merged.last_mut() {
                Some(last) if lo < last.1 => {
                    last.1 = last.1.max(hi);
                    last.2 |= w;
                }
                _ => merged.push((lo, hi, w)),
            }
        }
        // The device's context current for the copies below, the caller's back after.
        let _bound = driver::enter(ORDINAL).map_err(compiler_error)?;
        let mut spans = Vec::with_capacity(merged.len());
        for (lo, hi, writable) in merged {
            let dev = alloc(hi - lo)?;
            // SAFETY: `[lo, hi)` lies inside the memory of a live host tensor argument (from
            // its first to its last element, one allocation), borrowed for this call.
            let src = unsafe { std::slice::from_raw_parts(lo as *const u8, hi - lo) };
            // SAFETY: `dev` holds at least `hi - lo` bytes; the copy is synchronous (and
            // ordered after the allocation, on the legacy default stream).
            unsafe { result::memcpy_htod_sync(dev.data_ptr() as sys::CUdeviceptr, src) }
                .map_err(|e| device_error("cuMemcpyHtoD_v2", e))?;
            spans.push(Span {
                lo,
                hi,
                writable,
                dev,
            });
        }
        let args = args
            .iter()
            .map(|v| match v {
                Value::Tensor(t) if t.device().is_host() => mirror(t, &spans).map(Value::Tensor),
                other => Ok(other.clone()),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Mirrors { args, spans })
    }

    /// Copies every span holding a writable argument back to the host (the device is
    /// synchronised).
    fn download(&self) -> Result<()> {
        let _bound = driver::enter(ORDINAL).map_err(compiler_error)?;
        for s in self.spans.iter().filter(|s| s.writable) {
            // SAFETY: `[lo, hi)` is inside a writable host argument's memory (`upload`), still
            // borrowed by the caller; no kernel runs on it (the device is synchronised).
            let dst = unsafe { std::slice::from_raw_parts_mut(s.lo as *mut u8, s.hi - s.lo) };
            // SAFETY: the device allocation holds `hi - lo` bytes; the copy is synchronous.
            unsafe { result::memcpy_dtoh_sync(dst, s.dev.data_ptr() as sys::CUdeviceptr) }
                .map_err(|e| device_error("cuMemcpyDtoH_v2 (an argument)", e))?;
        }
        Ok(())
    }
}

/// A device allocation of `bytes` (at least one) on [`ORDINAL`], freed when dropped.
fn alloc(bytes: usize) -> Result<Tensor> {
    driver::alloc_tensor(ORDINAL, &[bytes.max(1) as i64], DType::U8, 0, false)
        .map_err(compiler_error)
}

/// The device view of host tensor `t` in its span (an empty tensor gets an allocation of its
/// own: it addresses nothing).
fn mirror(t: &Tensor, spans: &[Span]) -> Result<Tensor> {
    let (base, offset, owner) = match t.byte_range() {
        Some((lo, hi)) => {
            let s = spans
                .iter()
                .find(|s| s.lo <= lo && hi <= s.hi)
                .expect("every non-empty host tensor has a span");
            // The first element's offset in the span (`lo` is the lowest byte, which a
            // negative stride puts before the first element).
            (
                s.dev.data_ptr(),
                (t.data_ptr() as usize - s.lo) as u64,
                s.dev.clone(),
            )
        }
        None => {
            let dev = alloc(1)?;
            (dev.data_ptr(), 0, dev)
        }
    };
    // SAFETY: the view addresses only bytes of `owner`'s device allocation (the span holds
    // every byte the host tensor addresses, at the same offsets from its lowest byte), which
    // the view keeps alive.
    unsafe {
        Tensor::from_raw_parts(
            owner,
            base,
            offset,
            t.shape().into(),
            t.strides().into(),
            t.dtype(),
            Device::Cuda(ORDINAL as i32),
            t.is_read_only(),
        )
    }
}
