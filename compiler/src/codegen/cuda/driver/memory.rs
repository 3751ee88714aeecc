//! Device memory: allocation and the free thread.
//!
//! Allocation. With memory pools (`Device::pools`, cudarc's `has_async_alloc`): a tensor or
//! temporary comes from `cuMemAllocAsync` on the call's stream and is zeroed, when asked, by
//! `cuMemsetD8Async` on the same stream; every use is queued after it on that stream or
//! ordered after it by the result's completion event. Without pools: `cuMemAlloc`, whose
//! memory any stream may use once it returns, and the zeroing is still `cuMemsetD8Async` on
//! the call's stream, so the work ordered after it sees zeros. The default pool's release
//! threshold is raised once per device (`u64::MAX`, [`keep_pool_memory`]): with CUDA's
//! default of 0, every synchronisation would hand the pool's memory back to the OS.
//!
//! Freeing. When the last owner of a tensor's memory drops, what work may still touch it?
//! - rivet's own launches: queued on the stream of each call that used it, possibly still
//!   running when the call returned and its argument views dropped;
//! - consumers of an export: a DLPack deleter runs when the consumer's tensor dies (torch
//!   calls it when its storage is freed), with no promise that the work the consumer queued
//!   on ITS streams is done. Those streams may be ones rivet never saw (a consumer's side
//!   streams, usually non-blocking, which the legacy stream does not wait for), and a stream
//!   rivet was told about at export time may have been destroyed since.
//!
//! So no event recorded on a stream rivet knows covers that work: only "all the work queued
//! so far in the context" does. The free thread takes that, per device and batch, as an event
//! recorded on the whole context (`cuCtxRecordEvent`, CUDA 12.5 drivers) created with
//! `CU_EVENT_BLOCKING_SYNC` and waited for with `cuEventSynchronize`: the thread sleeps in the
//! driver, no core spins, and neither the GPU nor any other thread is stopped. On an older
//! driver without `cuCtxRecordEvent` the only sound choice left is `cuCtxSynchronize` (which
//! waits under the context's scheduling policy, a spin by default; changing the primary
//! context's flags would change torch's behaviour too, so rivet leaves them). Then the memory
//! is freed: `cuMemFreeAsync` (pool memory; nothing is left to order after) or `cuMemFree`.
//! Memory is returned late, never early; a context that cannot be waited for (a sticky error
//! after a faulting kernel) leaks its pending frees rather than free memory still in use.
//!
//! Temporaries of one call (`Loaded::alloc_zeroed`) are touched only by that call's kernels,
//! on its stream: with pools `cuMemFreeAsync` on that stream orders the free; without, the
//! free thread waits for a blocking-sync event recorded on that stream, then `cuMemFree`s.
//!
//! Process exit: the free thread is joined before the driver is torn down. When it starts it
//! registers an `atexit` handler (which runs before the driver's own teardown, registered
//! earlier by `cuInit`) that stops accepting work, lets the thread free what is queued, and
//! joins it; frees requested after that point are done on the dropping thread, with the same
//! wait.

use super::{call, device_error, guarded, warn_on_failure, Device};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;

/// Raises the default pool's release threshold of `dev` to `u64::MAX` (once, when the device
/// is first used): memory freed to the pool stays there for later allocations instead of
/// being returned to the OS at every synchronisation.
pub(super) fn keep_pool_memory(dev: &'static Device) {
    let Ok(_bound) = dev.enter() else { return };
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut dev_handle: sys::CUdevice = 0;
    // SAFETY: out-parameters; the device's context is current.
    let r = call("cuCtxGetDevice", || unsafe {
        sys::cuCtxGetDevice(&mut dev_handle)
    })
    .and_then(|()| {
        // SAFETY: out-parameter.
        call("cuDeviceGetDefaultMemPool", || unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, dev_handle)
        })
    })
    .and_then(|()| {
        let mut threshold: u64 = u64::MAX;
        // SAFETY: the release threshold is a `cuuint64_t` read through the pointer.
        call("cuMemPoolSetAttribute", || unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        })
    });
    if let Err(e) = r {
        eprintln!(
            "rivet: warning: cannot raise the release threshold of cuda:{}'s memory pool (freed memory will go back to the OS at each synchronisation): {e}",
            dev.ordinal
        );
    }
}

/// `n` bytes on `dev`, usable by work queued on `stream` after this call; zeroed on `stream`
/// with `zero`. The device's context must be current.
fn alloc_raw(
    dev: &'static Device,
    n: usize,
    stream: u64,
    zero: bool,
) -> std::result::Result<u64, String> {
    let s = stream as sys::CUstream;
    let mut ptr: sys::CUdeviceptr = 0;
    let r = if dev.pools {
        // SAFETY: out-parameter; `s` is the caller's live stream.
        guarded("alloc", || unsafe { sys::cuMemAllocAsync(&mut ptr, n, s) })
    } else {
        // SAFETY: out-parameter.
        guarded("alloc", || unsafe { sys::cuMemAlloc_v2(&mut ptr, n) })
    };
    match r.map(|r| r.result()) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.to_string()),
        Err(e) => return Err(e.to_string()),
    }
    if zero {
        // SAFETY: `ptr` holds `n` bytes; ordered on `s` after the allocation.
        if let Err(e) = call("cuMemsetD8Async", || unsafe {
            sys::cuMemsetD8Async(ptr, 0, n, s)
        }) {
            // Nothing was queued on the memory but (maybe) the memset: free it in stream order.
            free_after(dev, ptr, After::Stream(stream));
            return Err(format!("cannot zero it: {e}"));
        }
    }
    Ok(ptr)
}

/// A compact tensor of `shape` and `dtype` in new memory on device `ordinal`, ready for work
/// queued on `stream` (0: the legacy default stream) after this call (or ordered after it)
/// and, with `zero`, zeroed on it. Its memory is freed once its last view drops and the
/// device has finished the work queued until then (see the module header).
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
    let bound = super::enter(ordinal)?;
    // At least one byte, so an empty tensor still has a real device address to hand out.
    let n = bytes.max(1);
    let ptr = alloc_raw(bound.dev, n, stream, zero).map_err(|e| {
        runtime(rivet_runtime::Error::Memory(format!(
            "cannot allocate {bytes} bytes on cuda:{ordinal} for a {dtype} tensor of shape {shape:?}: {e}"
        )))
    })?;
    let mem = DeviceMemory {
        dev: bound.dev,
        ptr,
    };
    drop(bound);
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

/// A tensor's device memory; dropping it hands the pointer to the free thread.
struct DeviceMemory {
    dev: &'static Device,
    ptr: u64,
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        free_after(self.dev, self.ptr, After::Context);
    }
}

/// A zeroed temporary of `bytes` (at least 1) for one call's kernels on `stream`.
pub(super) fn alloc_temporary(dev: &'static Device, bytes: usize, stream: u64) -> Result<u64> {
    let _bound = dev.enter()?;
    alloc_raw(dev, bytes.max(1), stream, true).map_err(|e| {
        device_error(format!(
            "CUDA: cannot allocate a temporary of {bytes} bytes on cuda:{}: {e}",
            dev.ordinal
        ))
    })
}

/// Frees a temporary after the work queued on `stream` so far (the only work that uses it).
pub(super) fn free_temporary(dev: &'static Device, ptr: u64, stream: u64) -> Result<()> {
    let _bound = dev.enter()?;
    if dev.pools {
        // SAFETY: from `alloc_temporary` on this device, freed once, in stream order.
        return call("cuMemFreeAsync", || unsafe {
            sys::cuMemFreeAsync(ptr, stream as sys::CUstream)
        })
        .map_err(|e| device_error(format!("CUDA: cannot free a temporary: {e}")));
    }
    free_after(dev, ptr, After::Stream(stream));
    Ok(())
}

/// What a free waits for.
enum After {
    /// All the work queued in the device's context so far (see the module header).
    Context,
    /// The work queued on this stream so far (recorded now, while the stream is known live).
    Stream(u64),
}

/// What the free thread is handed.
struct Pending {
    dev: &'static Device,
    ptr: u64,
    /// A blocking-sync event to wait for; `None`: all the context's work (taken by the thread).
    event: Option<usize>,
}

// SAFETY: the event is a plain driver handle, used with its context bound.
unsafe impl Send for Pending {}

/// Set once the exit handler ran: the driver is about to be torn down; frees and destroys
/// after this point are done inline or skipped.
static EXITED: AtomicBool = AtomicBool::new(false);

pub(super) fn driver_gone() -> bool {
    EXITED.load(Ordering::Acquire) && DRAINED.load(Ordering::Acquire)
}
static DRAINED: AtomicBool = AtomicBool::new(false);

struct FreeThread {
    tx: Option<Sender<Pending>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

static THREAD: Mutex<FreeThread> = Mutex::new(FreeThread {
    tx: None,
    handle: None,
});

fn blocking_event(dev: &Device) -> Result<sys::CUevent> {
    let mut ev: sys::CUevent = std::ptr::null_mut();
    let flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
        | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    // SAFETY: out-parameter; the device's context is current (callers bind it).
    call("cuEventCreate", || unsafe {
        sys::cuEventCreate(&mut ev, flags)
    })
    .map_err(|e| {
        device_error(format!(
            "cannot create an event on cuda:{}: {e}",
            dev.ordinal
        ))
    })?;
    Ok(ev)
}

fn free_after(dev: &'static Device, ptr: u64, after: After) {
    let event = match after {
        After::Context => None,
        After::Stream(s) => {
            let made = dev.enter().and_then(|_bound| {
                let ev = blocking_event(dev)?;
                // SAFETY: a live event; `s` is the stream of the call still running here.
                match call("cuEventRecord", || unsafe {
                    sys::cuEventRecord(ev, s as sys::CUstream)
                }) {
                    Ok(()) => Ok(ev),
                    Err(e) => {
                        // SAFETY: ours, destroyed once.
                        unsafe { sys::cuEventDestroy_v2(ev) };
                        Err(e)
                    }
                }
            });
            match made {
                Ok(ev) => Some(ev as usize),
                // Fall back to the whole context (waits longer, as safe).
                Err(_) => None,
            }
        }
    };
    let p = Pending { dev, ptr, event };
    let mut t = THREAD.lock().unwrap_or_else(|p| p.into_inner());
    if EXITED.load(Ordering::Acquire) {
        drop(t);
        free_now(vec![p]);
        return;
    }
    if t.tx.is_none() {
        let (tx, rx) = channel::<Pending>();
        let spawned = std::thread::Builder::new()
            .name("rivet-cuda-free".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    // Batch whatever else is waiting: one wait per device.
                    let mut batch = vec![first];
                    batch.extend(rx.try_iter());
                    free_now(batch);
                }
            });
        if let Ok(h) = spawned {
            t.tx = Some(tx);
            t.handle = Some(h);
            static REGISTERED: std::sync::Once = std::sync::Once::new();
            REGISTERED.call_once(|| {
                // SAFETY: registers a plain `extern "C" fn()`.
                if unsafe { libc::atexit(at_exit) } != 0 {
                    eprintln!(
                        "rivet: warning: cannot register the CUDA free thread's exit handler"
                    );
                }
            });
        }
    }
    let sent = match t.tx.as_ref() {
        Some(tx) => tx.send(p).map_err(|e| e.0),
        None => Err(p),
    };
    if let Err(p) = sent {
        // No thread could be started: free here, with the same wait (slower, as safe).
        drop(t);
        free_now(vec![p]);
    }
}

/// At process exit: stop accepting, free what is queued, join the thread.
extern "C" fn at_exit() {
    let (tx, handle) = {
        let mut t = THREAD.lock().unwrap_or_else(|p| p.into_inner());
        EXITED.store(true, Ordering::Release);
        (t.tx.take(), t.handle.take())
    };
    drop(tx); // the thread's `recv` ends once the queue is empty
    if let Some(h) = handle {
        let _ = h.join();
    }
    DRAINED.store(true, Ordering::Release);
}

/// Waits for all the work queued so far in `dev`'s context (its context is current): an
/// event recorded on the context, blocking-sync, where the driver has `cuCtxRecordEvent`;
/// else `cuCtxSynchronize` (see the module header).
pub(crate) fn wait_for_context(dev: &Device) -> Result<()> {
    static HAS_CTX_RECORD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *HAS_CTX_RECORD.get_or_init(|| super::has_symbol("cuCtxRecordEvent")) {
        let ev = blocking_event(dev)?;
        // SAFETY: a live event of this context; the context is the device's primary one.
        let r = call("cuCtxRecordEvent", || unsafe {
            sys::cuCtxRecordEvent(dev.cu_ctx(), ev)
        })
        .and_then(|()| {
            // SAFETY: a recorded event; blocks this thread (blocking-sync), no spin.
            call("cuEventSynchronize", || unsafe {
                sys::cuEventSynchronize(ev)
            })
        });
        // SAFETY: ours, destroyed once.
        warn_on_failure("cuEventDestroy", "freeing device memory", || unsafe {
            sys::cuEventDestroy_v2(ev)
        });
        return r;
    }
    // SAFETY: the device's context is current.
    call("cuCtxSynchronize", || unsafe { sys::cuCtxSynchronize() })
}

fn free_now(mut batch: Vec<Pending>) {
    batch.sort_unstable_by_key(|p| p.dev.ordinal);
    let mut i = 0;
    while i < batch.len() {
        let dev = batch[i].dev;
        let end = i + batch[i..]
            .iter()
            .take_while(|b| b.dev.ordinal == dev.ordinal)
            .count();
        let Ok(_bound) = dev.enter() else {
            i = end;
            continue;
        };
        let mut context_done: Option<bool> = None;
        for p in &batch[i..end] {
            let ready = match p.event {
                Some(ev) => {
                    let ev = ev as sys::CUevent;
                    // SAFETY: a recorded blocking-sync event of this context; destroyed once.
                    let r = call("cuEventSynchronize", || unsafe {
                        sys::cuEventSynchronize(ev)
                    });
                    // SAFETY: ours, destroyed once.
                    warn_on_failure("cuEventDestroy", "freeing device memory", || unsafe {
                        sys::cuEventDestroy_v2(ev)
                    });
                    r.is_ok()
                }
                None => *context_done.get_or_insert_with(|| wait_for_context(dev).is_ok()),
            };
            // A failed wait (sticky error) leaks the memory rather than free it while in use.
            if !ready {
                continue;
            }
            if dev.pools {
                // SAFETY: from `cuMemAllocAsync` on this device, freed once, after every use.
                warn_on_failure("cuMemFreeAsync", "freeing device memory", || unsafe {
                    sys::cuMemFreeAsync(p.ptr, std::ptr::null_mut())
                });
            } else {
                // SAFETY: from `cuMemAlloc`, freed once, after every use.
                warn_on_failure("cuMemFree", "freeing device memory", || unsafe {
                    sys::cuMemFree_v2(p.ptr)
                });
            }
        }
        i = end;
    }
}
