//! Launching through the CUDA driver (cudarc, loaded dynamically).
//!
//! UNTESTED ON A GPU: this file was written on a machine without one; only its no-driver
//! path (`DeviceError` naming what is missing) has run. What it does: probe `libcuda` without
//! letting cudarc panic (`cudarc::driver::sys::is_culib_present`); retain the device's
//! primary context (`CudaContext::new(ordinal)`, the context torch and JAX allocate in) and
//! make it current on the calling thread; load the cubin for the device's exact architecture
//! (compiled by NVRTC, PTX from an NVRTC newer than the driver may be refused); launch each
//! kernel with `cuLaunchKernel` on the caller's stream (`LaunchContext::stream`, else the
//! legacy default stream), never synchronizing. Every cudarc call is also wrapped in
//! `catch_unwind`, so a panic inside cudarc (a symbol an old driver lacks) is an error too.

use crate::error::{Error, Result};
use crate::target::CudaArch;
use cudarc::driver::{result, sys, CudaContext, CudaModule};
use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

pub fn device_error(msg: String) -> Error {
    Error::Runtime(rivet_runtime::Error::Device(msg))
}

/// Runs a cudarc call, turning a panic into a `DeviceError`.
fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into());
        device_error(format!("CUDA driver ({what}): {msg}"))
    })
}

/// Whether the CUDA driver library can be loaded (never panics).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver's names and drops the handles.
    guarded("probe", || unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// The number of CUDA devices rivet can launch on: `Err` saying why there are none usable
/// (no driver library, no device, a driver error). Never panics. For probes such as the
/// Python tests' `cuda_usable()`.
pub fn device_count() -> Result<usize> {
    if !driver_present() {
        return Err(device_error(
            "CUDA is not available: the driver library (libcuda.so.1) cannot be loaded".into(),
        ));
    }
    guarded("init", result::init)?
        .map_err(|e| device_error(format!("CUDA is not available: cuInit failed: {e}")))?;
    let n = guarded("device count", result::device::get_count)?
        .map_err(|e| device_error(format!("CUDA is not available: {e}")))?;
    Ok(n.max(0) as usize)
}

/// A device's primary context with this kernel's module loaded in it.
pub struct Loaded {
    ctx: Arc<CudaContext>,
    /// Keeps the functions valid.
    _module: Arc<CudaModule>,
    /// `CUfunction` of each kernel, by position in `CudaKernel::info`.
    funcs: Vec<sys::CUfunction>,
}

// SAFETY: CUfunction handles are plain driver handles, usable from any thread once the
// context is current there (`launch` binds it first).
unsafe impl Send for Loaded {}
// SAFETY: as above; nothing here is mutated after construction.
unsafe impl Sync for Loaded {}

/// Per-device state of one compiled function.
#[derive(Default)]
pub struct Devices {
    loaded: Mutex<HashMap<usize, Arc<Loaded>>>,
}

impl Devices {
    /// The module for device `ordinal`, loading it on first use. `cubin_for(arch)` gives the
    /// cubin for the device's architecture.
    pub fn get(
        &self,
        ordinal: usize,
        names: &[String],
        cubin_for: &dyn Fn(CudaArch) -> Result<Vec<u8>>,
    ) -> Result<Arc<Loaded>> {
        let mut map = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = map.get(&ordinal) {
            return Ok(l.clone());
        }
        if !driver_present() {
            return Err(device_error(
                "CUDA is not available: the driver library (libcuda.so.1) cannot be loaded on this machine; run on a machine with an NVIDIA GPU and driver, or build for 'cpu'".into(),
            ));
        }
        let ctx = guarded("context", || CudaContext::new(ordinal))?.map_err(|e| {
            device_error(format!(
                "CUDA device {ordinal} cannot be used (its primary context could not be retained): {e}"
            ))
        })?;
        let (major, minor) = guarded("compute capability", || ctx.compute_capability())?
            .map_err(|e| device_error(format!("CUDA device {ordinal}: {e}")))?;
        let arch = CudaArch {
            major: major as u32,
            minor: minor as u32,
        };
        let cubin = cubin_for(arch)?;
        let module = guarded("module load", || {
            ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
        })?
        .map_err(|e| {
            device_error(format!(
                "CUDA device {ordinal}: loading the {arch} cubin: {e}"
            ))
        })?;
        let mut funcs = Vec::with_capacity(names.len());
        for n in names {
            let f = guarded("function", || module.load_function(n))?
                .map_err(|e| device_error(format!("CUDA device {ordinal}: kernel {n}: {e}")))?;
            funcs.push(f.cu_function());
        }
        let l = Arc::new(Loaded {
            ctx,
            _module: module,
            funcs,
        });
        map.insert(ordinal, l.clone());
        Ok(l)
    }
}

/// One kernel argument: a device pointer or an int64.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    Int(i64),
}

impl Loaded {
    /// Enqueues kernel `k` on `stream` (0: the legacy default stream).
    ///
    /// # Safety
    /// `args` must match the kernel's parameters, pointers addressing device memory of this
    /// context valid for every access the kernel makes with these ints.
    pub unsafe fn launch(
        &self,
        k: usize,
        grid: [u32; 3],
        block: [u32; 3],
        stream: u64,
        args: &[Arg],
    ) -> Result<()> {
        guarded("bind", || self.ctx.bind_to_thread())?
            .map_err(|e| device_error(format!("CUDA: cannot make the context current: {e}")))?;
        // Each parameter's value lives in `slots`; the driver reads them through `params`.
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p,
                Arg::Int(i) => i as u64,
            })
            .collect();
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| (s as *mut u64).cast::<c_void>())
            .collect();
        let f = self.funcs[k];
        let r = guarded("launch", || {
            // SAFETY: forwarded contract; `params` points at `slots`, alive during the call
            // (the driver copies the values at enqueue time).
            unsafe {
                sys::cuLaunchKernel(
                    f,
                    grid[0],
                    grid[1],
                    grid[2],
                    block[0],
                    block[1],
                    block[2],
                    0,
                    stream as sys::CUstream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
        })?;
        r.result()
            .map_err(|e| device_error(format!("CUDA: kernel launch failed: {e}")))
    }

    /// A zeroed device allocation of `bytes` (at least 1), stream-ordered on `stream`
    /// (`cuMemAllocAsync` + `cuMemsetD8Async`): a global temporary between kernels.
    pub fn alloc_zeroed(&self, bytes: usize, stream: u64) -> Result<u64> {
        guarded("bind", || self.ctx.bind_to_thread())?
            .map_err(|e| device_error(format!("CUDA: cannot make the context current: {e}")))?;
        let s = stream as sys::CUstream;
        let n = bytes.max(1);
        // SAFETY: a fresh allocation of `n` bytes, set on the same stream before any use.
        let p = guarded("alloc", || unsafe { result::malloc_async(s, n) })?.map_err(|e| {
            device_error(format!(
                "CUDA: cannot allocate a temporary of {bytes} bytes on the device: {e}"
            ))
        })?;
        // SAFETY: `p` holds `n` bytes.
        guarded("memset", || unsafe { result::memset_d8_async(p, 0, n, s) })?
            .map_err(|e| device_error(format!("CUDA: cannot zero a temporary: {e}")))?;
        Ok(p)
    }

    /// Frees a temporary from `alloc_zeroed` after the work queued on `stream` so far.
    pub fn free(&self, ptr: u64, stream: u64) -> Result<()> {
        // SAFETY: `ptr` came from `alloc_zeroed` and is freed once.
        guarded("free", || unsafe {
            result::free_async(ptr, stream as sys::CUstream)
        })?
        .map_err(|e| device_error(format!("CUDA: cannot free a temporary: {e}")))
    }
}
