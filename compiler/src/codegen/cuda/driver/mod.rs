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
//!
//! Per-device state: one retained primary context per ordinal ([`context`]), shared by every
//! compiled function and every allocation on that device, made current on the calling thread
//! before each driver call (`bind_to_thread`), so several devices (`cuda:1`) and several
//! Python threads each get the right one.
//!
//! Memory ([`alloc_tensor`]): rivet's device tensors (outputs omitted at a call,
//! `rivet.empty` / `rivet.zeros(device="cuda")`) come from `cuMemAllocAsync` on the call's
//! stream (the device's default memory pool; no device-wide synchronisation), zeroed with
//! `cuMemsetD8Async` on the same stream when asked. Freeing is the delicate part: when the
//! last owner drops (a rivet view, or a consumer's DLPack deleter: torch calls it when its
//! tensor dies, without waiting for the work it queued on its own streams), work that reads
//! the memory may still be queued on streams rivet never saw. So the free is never issued
//! on the dropping thread: the pointer goes to a reaper thread, which waits for all work
//! queued so far on the device's context (`cuCtxSynchronize`: it blocks only the reaper, not
//! the GPU nor the caller), then frees it (`cuMemFreeAsync`). Memory is returned late, never
//! early; a context that cannot be synchronised (a sticky error after a faulting kernel)
//! leaks its pending frees rather than free memory a kernel may still touch.
//!
//! Streams between producers and consumers ([`order`]): "stream B waits for the work queued
//! so far on stream A" is an event recorded on A and waited for on B, never a synchronisation.

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
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
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

/// The primary context of device `ordinal` (retained once per process, shared by every
/// function and allocation on it), made current on the calling thread.
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    static CONTEXTS: Mutex<Vec<Option<Arc<CudaContext>>>> = Mutex::new(Vec::new());
    let found = {
        let map = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
        map.get(ordinal).cloned().flatten()
    };
    let ctx = match found {
        Some(c) => c,
        None => {
            let n = device_count()?;
            if ordinal >= n {
                return Err(device_error(format!(
                    "CUDA device {ordinal} does not exist: this machine has {n} CUDA device{} (cuda:0{})",
                    if n == 1 { "" } else { "s" },
                    if n > 1 { format!("..cuda:{}", n - 1) } else { String::new() }
                )));
            }
            let c = guarded("context", || CudaContext::new(ordinal))?.map_err(|e| {
                device_error(format!(
                    "CUDA device {ordinal} cannot be used (its primary context could not be retained): {e}"
                ))
            })?;
            let mut map = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() <= ordinal {
                map.resize(ordinal + 1, None);
            }
            // Another thread may have won the race: keep the first, drop ours (a release).
            map[ordinal].get_or_insert(c).clone()
        }
    };
    bind(&ctx)?;
    Ok(ctx)
}

fn bind(ctx: &CudaContext) -> Result<()> {
    guarded("bind", || ctx.bind_to_thread())?
        .map_err(|e| device_error(format!("CUDA: cannot make the context current: {e}")))
}

/// The ordinal of the device `ptr` was allocated on (`cuPointerGetAttribute`), for
/// producers that give a bare pointer (`__cuda_array_interface__`). `what` names the
/// producer in errors. Host memory, or a pointer the driver does not know, is refused.
pub fn pointer_device(ptr: u64, what: &str) -> Result<usize> {
    if !driver_present() {
        return Err(device_error(format!(
            "{what}: finding the device of a CUDA pointer needs the CUDA driver, and the driver library (libcuda.so.1) cannot be loaded on this machine"
        )));
    }
    device_count()?;
    let get = |attr: sys::CUpointer_attribute| -> Result<i32> {
        let mut v: i32 = -1;
        // SAFETY: both attributes asked here write one 32-bit int (`int` ordinal,
        // `CUmemorytype` enum); the pointer is only looked up, never dereferenced.
        let r = guarded("pointer attribute", || unsafe {
            sys::cuPointerGetAttribute((&mut v as *mut i32).cast(), attr, ptr)
        })?;
        r.result().map_err(|e| {
            device_error(format!(
                "{what}: the pointer {ptr:#x} is not CUDA memory this process can use ({e})"
            ))
        })?;
        Ok(v)
    };
    let kind = get(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)?;
    if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as i32 {
        return Err(device_error(format!(
            "{what}: the pointer {ptr:#x} is not device memory (CUDA memory type {kind}); __cuda_array_interface__ must describe device memory"
        )));
    }
    let ordinal = get(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)?;
    usize::try_from(ordinal)
        .map_err(|_| device_error(format!("{what}: the driver gave device ordinal {ordinal}")))
}

/// Makes stream `to` wait for the work queued so far on stream `from`, both on device
/// `ordinal` (an event recorded on `from`, waited for on `to`; nothing synchronises).
/// Nothing to do when they are the same stream.
///
/// # Safety
/// Both handles must be live streams of the device's primary context (or the reserved
/// handles 0, 1, 2).
pub unsafe fn order(ordinal: usize, from: u64, to: u64) -> Result<()> {
    if rivet_runtime::stream::same_stream(from, to) {
        return Ok(());
    }
    let _ctx = context(ordinal)?;
    let ev = guarded("event", || {
        result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
    })?
    .map_err(|e| device_error(format!("CUDA: cannot create an event: {e}")))?;
    // SAFETY: a fresh event; the streams are the caller's promise. Destroying an event
    // whose wait is still pending is allowed (its resources go when the work completes).
    let r = guarded("stream order", || unsafe {
        result::event::record(ev, from as sys::CUstream).and_then(|()| {
            result::stream::wait_event(
                to as sys::CUstream,
                ev,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        })
    });
    // SAFETY: created above, destroyed once.
    let _ = guarded("event destroy", || unsafe { result::event::destroy(ev) });
    r?.map_err(|e| {
        device_error(format!(
            "CUDA: cannot make stream {to:#x} wait for stream {from:#x} on cuda:{ordinal}: {e}"
        ))
    })
}

/// Device memory from `cuMemAllocAsync`; dropping it hands the pointer to the reaper (see
/// the module header), which frees it once the device has finished the work queued so far.
struct DeviceMemory {
    ordinal: usize,
    ptr: u64,
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        reaper::free_later(self.ordinal, self.ptr);
    }
}

/// The reaper: frees device memory after the work queued before the free request is done.
mod reaper {
    use super::*;
    use std::sync::mpsc::{channel, Sender};

    static QUEUE: Mutex<Option<Sender<(usize, u64)>>> = Mutex::new(None);

    pub fn free_later(ordinal: usize, ptr: u64) {
        let mut q = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
        if q.is_none() {
            let (tx, rx) = channel::<(usize, u64)>();
            let spawned = std::thread::Builder::new()
                .name("rivet-cuda-free".into())
                .spawn(move || {
                    while let Ok(first) = rx.recv() {
                        // Batch whatever else is waiting: one synchronisation per device.
                        let mut batch = vec![first];
                        batch.extend(rx.try_iter());
                        free_now(batch);
                    }
                });
            if spawned.is_ok() {
                *q = Some(tx);
            }
        }
        match q.as_ref().map(|tx| tx.send((ordinal, ptr))) {
            Some(Ok(())) => {}
            // No thread could be started: free here, with the same wait (slower, as safe).
            _ => {
                drop(q);
                free_now(vec![(ordinal, ptr)]);
            }
        }
    }

    fn free_now(mut batch: Vec<(usize, u64)>) {
        batch.sort_unstable();
        let mut i = 0;
        while i < batch.len() {
            let ordinal = batch[i].0;
            let end = i + batch[i..].iter().take_while(|b| b.0 == ordinal).count();
            // The context exists: it allocated these pointers. A failed synchronisation
            // (sticky error) leaks the batch rather than free memory still in use.
            if let Ok(ctx) = context(ordinal) {
                if let Ok(Ok(())) = guarded("synchronize", || ctx.synchronize()) {
                    for &(_, p) in &batch[i..end] {
                        // SAFETY: from `cuMemAllocAsync`, freed once, after every use
                        // queued before the request (the synchronisation above).
                        let _ = guarded("free", || unsafe {
                            result::free_async(p, std::ptr::null_mut())
                        });
                    }
                }
            }
            i = end;
        }
    }
}

/// A compact tensor of `shape` and `dtype` in new memory on device `ordinal`, allocated
/// stream-ordered on `stream` (0: the legacy default stream) and, with `zero`, zeroed on it.
/// The tensor is valid for work queued on `stream` after this call (or ordered after it);
/// its memory is freed once its last view drops and the device has finished the work queued
/// until then (see the module header).
pub fn alloc_tensor(
    ordinal: usize,
    shape: &[i64],
    dtype: rivet_runtime::DType,
    stream: u64,
    zero: bool,
) -> Result<rivet_runtime::Tensor> {
    let runtime = |e: rivet_runtime::Error| Error::Runtime(e);
    if let Some(d) = shape.iter().position(|&n| n < 0) {
        return Err(runtime(rivet_runtime::Error::Shape(format!(
            "cannot allocate a tensor of shape {shape:?}: dim {d} is negative"
        ))));
    }
    if shape.len() > rivet_runtime::layout::MAX_NDIM {
        return Err(runtime(rivet_runtime::Error::Shape(format!(
            "cannot allocate a tensor of {} dims: rivet supports at most {}",
            shape.len(),
            rivet_runtime::layout::MAX_NDIM
        ))));
    }
    let bytes = rivet_runtime::alloc::tensor_bytes(shape, dtype).map_err(runtime)?;
    let ctx = context(ordinal)?;
    let s = stream as sys::CUstream;
    // At least one byte, so an empty tensor still has a real device address to hand out.
    let n = bytes.max(1);
    // SAFETY: a fresh allocation of `n` bytes on `s`; every use is ordered after it (the
    // caller's work on `s`, or consumers through `order`).
    let ptr = guarded("alloc", || unsafe { result::malloc_async(s, n) })?.map_err(|e| {
        runtime(rivet_runtime::Error::Memory(format!(
            "cannot allocate {bytes} bytes on cuda:{ordinal} for a {dtype} tensor of shape {shape:?}: {e}"
        )))
    })?;
    let mem = DeviceMemory { ordinal, ptr };
    if zero {
        // SAFETY: `ptr` holds `n` bytes; the memset is ordered on the allocating stream.
        guarded("memset", || unsafe {
            result::memset_d8_async(ptr, 0, n, s)
        })?
        .map_err(|e| {
            device_error(format!(
                "CUDA: cannot zero a new tensor on cuda:{ordinal}: {e}"
            ))
        })?;
    }
    drop(ctx);
    let strides = rivet_runtime::layout::compact_strides(shape);
    // SAFETY: `mem` owns `n >= bytes` bytes of device memory at `ptr`, alive as long as the
    // tensor's views (it is their owner); the layout is compact.
    unsafe {
        rivet_runtime::Tensor::from_raw_parts(
            mem,
            ptr as *mut u8,
            0,
            shape.into(),
            strides,
            dtype,
            rivet_runtime::Device::Cuda(ordinal as i32),
            false,
        )
    }
    .map_err(runtime)
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
        let ctx = context(ordinal)?;
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

/// One kernel argument: a device pointer, an int64 (`long long`) or an int32 (`int`, the
/// parameters of a 32-bit index kernel).
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    Int(i64),
    Int32(i32),
}

// `Arg::Int32` relies on it (every host CUDA supports is little-endian).
const _: () = assert!(cfg!(target_endian = "little"));

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
                // The driver reads 4 bytes at the slot's address: the low half on the
                // little-endian hosts CUDA runs on (x86-64, aarch64, ppc64le).
                Arg::Int32(i) => i as u32 as u64,
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

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_runtime::{DType, Error as R};

    fn runtime_err(e: Error) -> R {
        match e {
            Error::Runtime(r) => r,
            other => panic!("expected a runtime error, got {other}"),
        }
    }

    #[test]
    fn allocation_checks_sizes_before_asking_the_driver() {
        let e = runtime_err(alloc_tensor(0, &[2, -1], DType::F32, 0, true).unwrap_err());
        assert!(
            matches!(&e, R::Shape(m) if m.contains("dim 1 is negative")),
            "{e}"
        );
        let e = runtime_err(alloc_tensor(0, &[1 << 40, 1 << 40], DType::F32, 0, true).unwrap_err());
        assert!(
            matches!(&e, R::Memory(m) if m.contains("over rivet's limit")),
            "{e}"
        );
    }

    #[test]
    fn the_same_stream_needs_no_ordering_and_no_driver() {
        // 0 and 1 are both the legacy default stream.
        // SAFETY: no stream is touched when the two are the same.
        unsafe {
            order(0, 0, rivet_runtime::stream::LEGACY).unwrap();
            order(3, 77, 77).unwrap();
        }
    }

    #[test]
    fn without_a_driver_every_entry_point_says_what_is_missing() {
        if driver_present() {
            return; // this machine has a driver: the no-driver path cannot be shown here
        }
        let missing = |e: Error| {
            let r = runtime_err(e);
            assert!(
                matches!(&r, R::Device(m) if m.contains("libcuda.so.1") && m.contains("cannot be loaded")),
                "{r}"
            );
        };
        missing(alloc_tensor(0, &[2, 3], DType::F32, 0, true).unwrap_err());
        missing(alloc_tensor(1, &[0], DType::F64, 5, false).unwrap_err());
        missing(context(0).map(|_| ()).unwrap_err());
        missing(device_count().unwrap_err());
        missing(pointer_device(0x1000, "x").unwrap_err());
        // SAFETY: refused before any stream is touched.
        missing(unsafe { order(0, 1, 2) }.unwrap_err());
    }
}
