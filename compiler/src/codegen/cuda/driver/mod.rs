//! Launching through the CUDA driver (cudarc's raw bindings, loaded dynamically).
//!
//! UNTESTED ON A GPU: written on a machine without one; its no-driver path has run, and the
//! rest runs against the CUDA driver double of the tests. What it does: probe `libcuda`
//! without letting cudarc panic (`cudarc::driver::sys::is_culib_present`); retain each
//! device's primary context once per process (the context torch and JAX allocate in; never
//! released, so no context is ever dropped); load the cubin for the device's exact
//! architecture; launch with `cuLaunchKernel` on the caller's stream, never synchronizing.
//! Every driver call runs under `catch_unwind`, so a panic in cudarc (a symbol an old driver
//! lacks) is a `DeviceError` too.
//!
//! The caller's current context ([`Current`]): every entry point that needs a context saves
//! the calling thread's current context (`cuCtxGetCurrent`), makes the device's primary
//! context current, and restores the saved one on the way out, NULL included, on every path
//! (an RAII guard). So a call on `cuda:1` does not leave device 1 current for the CUDA
//! runtime (torch) on the caller's thread, and no rivet call relies on a context an earlier
//! call happened to leave bound.
//!
//! cudarc's own objects keep errors from their drops on the context (`record_err`) and hand
//! them to the next, unrelated call (`check_err`). rivet creates no cudarc object but the
//! contexts (modules, events and memory are raw handles it owns), never drops a context, and
//! reports whatever a context has stored as a warning right where it is found
//! ([`report_stored`]: after unloading a module, when binding), so it is never blamed on a
//! later call.
//!
//! Completion events ([`Event`]): a call's results (and a new tensor) carry an event recorded
//! on the stream the work was queued on (`CU_EVENT_DISABLE_TIMING`), shared by every output
//! and destroyed when its last holder drops. Every later ordering (a consumer's
//! `__dlpack__(stream=...)`, use as an input on another stream) waits for that event
//! (`cuStreamWaitEvent`); nothing ever records on a stream remembered from an earlier call,
//! which its owner may have destroyed since.
//!
//! Streams between producers and consumers met inside one call ([`order`]): "stream B waits
//! for the work queued so far on stream A" is an event recorded on A and waited for on B,
//! never a synchronisation.
//!
//! Memory: see `memory.rs` (allocation with or without memory pools, and the free thread).

mod memory;

pub use memory::alloc_tensor;
pub(crate) use memory::wait_for_context;

use crate::error::{Error, Result};
use crate::target::CudaArch;
use cudarc::driver::{result, sys, CudaContext};
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

/// One raw driver call: a failure (or a panic) is a `DeviceError` naming `what`.
pub(crate) fn call(what: &str, f: impl FnOnce() -> sys::CUresult) -> Result<()> {
    guarded(what, f)?
        .result()
        .map_err(|e| device_error(format!("CUDA: {what} failed: {e}")))
}

/// A driver call whose failure cannot be returned (a drop): a stderr warning, except after
/// the driver was torn down at process exit (nothing is left to release then).
pub(crate) fn warn_on_failure(what: &str, while_: &str, f: impl FnOnce() -> sys::CUresult) {
    match guarded(what, f).map(|r| r.result()) {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.0 == sys::CUresult::CUDA_ERROR_DEINITIALIZED => {}
        Ok(Err(e)) => eprintln!("rivet: warning: CUDA {what} failed while {while_}: {e}"),
        Err(e) => eprintln!("rivet: warning: CUDA {what} failed while {while_}: {e}"),
    }
}

/// Whether the CUDA driver library can be loaded (never panics).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver's names and drops the handles.
    guarded("probe", || unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Whether the loaded driver exports `name` (an older driver lacks newer entry points; cudarc
/// would panic on calling one).
pub(crate) fn has_symbol(name: &str) -> bool {
    driver_present()
        && guarded("probe", || {
            // SAFETY: looks a symbol up without calling it.
            unsafe { sys::culib().get::<*const c_void>(name.as_bytes()).is_ok() }
        })
        .unwrap_or(false)
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

/// The architecture of the device a build with no `-arch` will most likely run on: the
/// device of the caller's current context, else device 0. `None` without a driver or a
/// device (the build then compiles for `DEFAULT_ARCH`, as the tests expect). Binds nothing.
pub fn build_device_arch() -> Option<CudaArch> {
    if device_count().ok()? == 0 {
        return None;
    }
    let mut dev: sys::CUdevice = 0;
    let has_current = current_context().is_ok_and(|c| !c.is_null());
    let asked = has_current && {
        // SAFETY: out-parameter; a context is current.
        call("cuCtxGetDevice", || unsafe {
            sys::cuCtxGetDevice(&mut dev)
        })
        .is_ok()
    };
    if !asked {
        dev = guarded("device", || result::device::get(0)).ok()?.ok()?;
    }
    let attr = |a| -> Option<u32> {
        let mut v = 0;
        // SAFETY: out-parameter; device attributes need no context.
        call("cuDeviceGetAttribute", || unsafe {
            sys::cuDeviceGetAttribute(&mut v, a, dev)
        })
        .ok()?;
        u32::try_from(v).ok()
    };
    Some(CudaArch {
        major: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        minor: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    })
}

/// One device as rivet uses it: its primary context, retained once and never released.
pub struct Device {
    pub ordinal: usize,
    ctx: Arc<CudaContext>,
    /// Whether the device has memory pools (`cuMemAllocAsync`; cudarc's `has_async_alloc`).
    pub pools: bool,
}

impl Device {
    pub fn cu_ctx(&self) -> sys::CUcontext {
        self.ctx.cu_ctx()
    }

    /// Makes this device's context current on the calling thread until the guard drops.
    pub fn enter(&'static self) -> Result<Current> {
        Current::bind(self)
    }
}

/// The device `ordinal`, its primary context retained on first use (binds nothing: the
/// calling thread's current context is as before).
pub fn device(ordinal: usize) -> Result<&'static Device> {
    static DEVICES: Mutex<Vec<Option<&'static Device>>> = Mutex::new(Vec::new());
    let mut map = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(Some(d)) = map.get(ordinal) {
        return Ok(d);
    }
    // Created under the lock: two threads never both retain, so no context is dropped.
    let n = device_count()?;
    if ordinal >= n {
        return Err(device_error(format!(
            "CUDA device {ordinal} does not exist: this machine has {n} CUDA device{} (cuda:0{})",
            if n == 1 { "" } else { "s" },
            if n > 1 {
                format!("..cuda:{}", n - 1)
            } else {
                String::new()
            }
        )));
    }
    // `CudaContext::new` makes the context current: put the caller's back.
    let saved = current_context()?;
    let made = guarded("context", || CudaContext::new(ordinal));
    set_current(
        saved,
        "restoring the caller's context after retaining a primary context",
    );
    let ctx = made?.map_err(|e| {
        device_error(format!(
            "CUDA device {ordinal} cannot be used (its primary context could not be retained): {e}"
        ))
    })?;
    let d: &'static Device = Box::leak(Box::new(Device {
        ordinal,
        pools: ctx.has_async_alloc(),
        ctx,
    }));
    if d.pools {
        memory::keep_pool_memory(d);
    }
    if map.len() <= ordinal {
        map.resize(ordinal + 1, None);
    }
    map[ordinal] = Some(d);
    Ok(d)
}

/// The device `ordinal`, its context current on the calling thread until the guard drops.
pub fn enter(ordinal: usize) -> Result<Current> {
    device(ordinal)?.enter()
}

fn current_context() -> Result<sys::CUcontext> {
    let mut c: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-parameter.
    call("cuCtxGetCurrent", || unsafe {
        sys::cuCtxGetCurrent(&mut c)
    })?;
    Ok(c)
}

fn set_current(c: sys::CUcontext, while_: &str) {
    // SAFETY: `c` was current on this thread (or NULL, which unbinds).
    warn_on_failure("cuCtxSetCurrent", while_, || unsafe {
        sys::cuCtxSetCurrent(c)
    });
}

/// A device's context made current on this thread; dropping it makes the thread's previous
/// context (or none) current again.
#[must_use]
pub struct Current {
    pub dev: &'static Device,
    prev: sys::CUcontext,
    switched: bool,
    /// Bound to this thread (the driver's current context is per thread).
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Current {
    fn bind(dev: &'static Device) -> Result<Current> {
        let prev = current_context()?;
        let switched = prev != dev.cu_ctx();
        if switched {
            // SAFETY: a retained primary context.
            call("cuCtxSetCurrent", || unsafe {
                sys::cuCtxSetCurrent(dev.cu_ctx())
            })?;
        }
        report_stored(dev, "an earlier cudarc drop");
        Ok(Current {
            dev,
            prev,
            switched,
            _not_send: std::marker::PhantomData,
        })
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        if self.switched {
            set_current(self.prev, "restoring the caller's current context");
        }
    }
}

/// Reports (stderr) and clears an error cudarc stored on the device's context from a drop
/// (`record_err`), so that it is not returned to an unrelated later call.
pub(crate) fn report_stored(dev: &Device, while_: &str) {
    if let Ok(Err(e)) = guarded("check_err", || dev.ctx.check_err()) {
        eprintln!(
            "rivet: warning: CUDA error {e} on cuda:{} while {while_}",
            dev.ordinal
        );
    }
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
    // The query needs a context (any of the process's: addresses are unified).
    let _bound = enter(0)?;
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
/// Nothing to do when they are the same stream. Only for streams handed over for the
/// current call: a stream remembered from an earlier one may be dead (use an [`Event`]).
///
/// # Safety
/// Both handles must be live streams of the device's primary context (or the reserved
/// handles 0, 1, 2).
pub unsafe fn order(ordinal: usize, from: u64, to: u64) -> Result<()> {
    if rivet_runtime::stream::same_stream(from, to) {
        return Ok(());
    }
    let ev = record(ordinal, from)?;
    ev.wait_on(to).map_err(|e| {
        device_error(format!(
            "CUDA: cannot make stream {to:#x} wait for stream {from:#x} on cuda:{ordinal}: {e}"
        ))
    })
}

/// An event recorded after some work (`CU_EVENT_DISABLE_TIMING`): what a later consumer
/// waits for. Shared (`Arc`) by everything that work produced; destroyed with its last
/// holder (destroying an event with waits still queued is allowed).
pub struct Event {
    dev: &'static Device,
    ev: sys::CUevent,
}

// SAFETY: an event handle is usable from any thread with its context current (every use
// binds it first).
unsafe impl Send for Event {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Event {}

/// Records a new event on `stream` of device `ordinal`, after the work queued on it so far.
///
/// `stream` must be a live stream of the device's primary context, or 0, 1, 2 (the caller's
/// promise, as for any stream handle given to rivet).
pub fn record(ordinal: usize, stream: u64) -> Result<Arc<Event>> {
    let bound = enter(ordinal)?;
    let mut ev: sys::CUevent = std::ptr::null_mut();
    // SAFETY: out-parameter, in the device's context.
    call("cuEventCreate", || unsafe {
        sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    })?;
    let ev = Arc::new(Event { dev: bound.dev, ev });
    // SAFETY: a live event; the stream is the caller's promise.
    call("cuEventRecord", || unsafe {
        sys::cuEventRecord(ev.ev, stream as sys::CUstream)
    })?;
    Ok(ev)
}

impl Event {
    /// The device the event belongs to.
    pub fn ordinal(&self) -> usize {
        self.dev.ordinal
    }

    /// Makes `stream` (live, of the event's device, or 0, 1, 2) wait for the recorded work.
    pub fn wait_on(&self, stream: u64) -> Result<()> {
        let _bound = self.dev.enter()?;
        // SAFETY: a live event of this context; the stream is the caller's promise.
        call("cuStreamWaitEvent", || unsafe {
            sys::cuStreamWaitEvent(stream as sys::CUstream, self.ev, 0)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if memory::driver_gone() {
            return; // process exit: the driver is being torn down
        }
        if let Ok(_bound) = self.dev.enter() {
            // SAFETY: ours, destroyed once.
            warn_on_failure(
                "cuEventDestroy",
                "destroying a completion event",
                || unsafe { sys::cuEventDestroy_v2(self.ev) },
            );
        }
    }
}

/// A loaded module (raw handle: unloaded by rivet, in the right context, its errors reported
/// there).
struct Module {
    dev: &'static Device,
    m: sys::CUmodule,
}

impl Drop for Module {
    fn drop(&mut self) {
        if memory::driver_gone() {
            return;
        }
        if let Ok(_bound) = self.dev.enter() {
            // SAFETY: loaded once, unloaded once; its functions die with it (`Loaded`).
            warn_on_failure("cuModuleUnload", "unloading a kernel module", || unsafe {
                sys::cuModuleUnload(self.m)
            });
            report_stored(self.dev, "unloading a kernel module");
        }
    }
}

/// A device's primary context with this kernel's module loaded in it.
pub struct Loaded {
    dev: &'static Device,
    /// `CUfunction` of each kernel, by position in `CudaKernel::info`.
    funcs: Vec<sys::CUfunction>,
    /// Keeps the functions valid (declared after `funcs`: dropped last).
    _module: Module,
}

// SAFETY: CUfunction and CUmodule handles are plain driver handles, usable from any thread
// once the context is current there (every use binds it first).
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
    /// cubin for the device's architecture (exactly the bytes handed to `cuModuleLoadData`).
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
        let bound = enter(ordinal)?;
        let dev = bound.dev;
        let attr = |a| -> Result<u32> {
            let mut v = 0;
            // SAFETY: out-parameter.
            call("cuDeviceGetAttribute", || unsafe {
                sys::cuDeviceGetAttribute(&mut v, a, dev.ctx.cu_device())
            })?;
            Ok(v.max(0) as u32)
        };
        let arch = CudaArch {
            major: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            minor: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        };
        let cubin = cubin_for(arch)?;
        let mut m: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: a complete cubin image (an ELF file) in memory; out-parameter.
        call("cuModuleLoadData", || unsafe {
            sys::cuModuleLoadData(&mut m, cubin.as_ptr().cast())
        })
        .map_err(|e| {
            device_error(format!(
                "CUDA device {ordinal}: loading the {arch} cubin: {e}"
            ))
        })?;
        let module = Module { dev, m };
        let mut funcs = Vec::with_capacity(names.len());
        for n in names {
            let c = std::ffi::CString::new(n.as_str())
                .map_err(|_| Error::Internal(format!("kernel name {n:?} holds a NUL")))?;
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: a live module; out-parameter.
            call("cuModuleGetFunction", || unsafe {
                sys::cuModuleGetFunction(&mut f, module.m, c.as_ptr())
            })
            .map_err(|e| device_error(format!("CUDA device {ordinal}: kernel {n}: {e}")))?;
            funcs.push(f);
        }
        drop(bound);
        let l = Arc::new(Loaded {
            dev,
            funcs,
            _module: module,
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
        let _bound = self.dev.enter()?;
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

    /// A zeroed device allocation of `bytes` (at least 1), ready for work queued on `stream`
    /// after this call: a global temporary between kernels (`memory.rs`).
    pub fn alloc_zeroed(&self, bytes: usize, stream: u64) -> Result<u64> {
        memory::alloc_temporary(self.dev, bytes, stream)
    }

    /// Frees a temporary from `alloc_zeroed` after the work queued on `stream` so far.
    pub fn free(&self, ptr: u64, stream: u64) -> Result<()> {
        memory::free_temporary(self.dev, ptr, stream)
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
        missing(device(0).map(|_| ()).unwrap_err());
        missing(enter(1).map(|_| ()).unwrap_err());
        missing(record(0, 1).map(|_| ()).unwrap_err());
        missing(device_count().unwrap_err());
        missing(pointer_device(0x1000, "x").unwrap_err());
        // SAFETY: refused before any stream is touched.
        missing(unsafe { order(0, 1, 2) }.unwrap_err());
    }
}
