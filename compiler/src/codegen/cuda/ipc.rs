//! CUDA IPC (docs/ipc.md "CUDA"): sharing a device allocation with
//! another process and opening one shared with this process. The handle format and its
//! validation are `rivet_runtime::ipc_cuda`; this is the driver half. It compiles on machines
//! without CUDA and has NOT yet run on a GPU (docs/ipc.md says what a GPU session must check).
//!
//! Invariants:
//! - handles name an allocation's base (`cuMemGetAddressRange`) and a byte offset into it:
//!   CUDA IPC shares whole allocations, and torch's caching allocator sub-allocates;
//! - memory from a stream-ordered pool (`cuMemAllocAsync`: rivet's own CUDA tensors, torch's
//!   `cudaMallocAsync` backend) is refused: `cuIpcGetMemHandle` does not accept it;
//! - one `cuIpcOpenMemHandle` per (handle, device) per process: CUDA refuses to open one handle
//!   twice, so opened mappings are cached by the 64 handle bytes and shared by every view; the
//!   mapping is closed (after the device finished queued work) when its last view drops;
//! - the receiver orders its work after the sender's writes with the sender's interprocess
//!   event waited on the receiver's stream (`cuStreamWaitEvent`), never a device-wide sync.
use super::driver::{device, device_error, enter, guarded, wait_for_context};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use rivet_runtime::ipc_cuda::{CudaHandle, IPC_HANDLE_SIZE};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

/// What `share` of a device pointer gives: the base's handle, the allocation and the offset.
#[derive(Debug, Clone)]
pub struct Shared {
    pub mem_handle: [u8; IPC_HANDLE_SIZE],
    pub alloc_size: u64,
    pub offset: u64,
    pub event_handle: Option<[u8; IPC_HANDLE_SIZE]>,
}

fn call(what: &str, f: impl FnOnce() -> sys::CUresult) -> Result<()> {
    guarded(what, f)?
        .result()
        .map_err(|e| device_error(format!("CUDA IPC ({what}): {e}")))
}

fn to_bytes(r: &[std::ffi::c_char; IPC_HANDLE_SIZE]) -> [u8; IPC_HANDLE_SIZE] {
    r.map(|c| c as u8)
}

fn from_bytes(b: &[u8; IPC_HANDLE_SIZE]) -> [std::ffi::c_char; IPC_HANDLE_SIZE] {
    b.map(|c| c as std::ffi::c_char)
}

/// Events whose handles went out: the sender keeps each alive until receivers may have opened
/// it. A bounded ring (the oldest destroyed first) instead of tying events to handles' lives,
/// which plain-data handles cannot express; 4096 outstanding shares is far above any use seen.
struct EventRing(VecDeque<usize>);
static SENT_EVENTS: Mutex<EventRing> = Mutex::new(EventRing(VecDeque::new()));
const EVENT_RING: usize = 4096;

/// Shares the allocation holding `ptr` on device `ordinal`; with `stream` (a `CUstream` as an
/// integer, 0 the legacy default stream), records an interprocess event on it after the work
/// queued so far and returns its handle.
pub fn share(ordinal: usize, ptr: u64, stream: Option<u64>) -> Result<Shared> {
    let _bound = enter(ordinal)?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: writes one pointer-sized attribute into `pool`.
    let pooled = guarded("pointer attribute", || unsafe {
        sys::cuPointerGetAttribute(
            (&mut pool as *mut sys::CUmemoryPool).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            ptr,
        )
    })?;
    if pooled == sys::CUresult::CUDA_SUCCESS && !pool.is_null() {
        return Err(Error::Runtime(rivet_runtime::Error::Ipc(format!(
            "the CUDA memory at {ptr:#x} on cuda:{ordinal} comes from a stream-ordered pool (cuMemAllocAsync: rivet's own CUDA tensors, or torch's cudaMallocAsync allocator backend), which cuIpcGetMemHandle cannot share; share a torch CUDA tensor from torch's default caching allocator"
        ))));
    }
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: out-parameters only.
    call("cuMemGetAddressRange", || unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
    })?;
    // SAFETY: a plain C struct of 64 bytes; all zeros is a valid value.
    let mut mh: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: `base` is an allocation's base (cuMemGetAddressRange); out-parameter.
    call("cuIpcGetMemHandle", || unsafe {
        sys::cuIpcGetMemHandle(&mut mh, base)
    })?;
    let event_handle = match stream {
        None => None,
        Some(s) => {
            let mut ev: sys::CUevent = std::ptr::null_mut();
            let flags = sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
                | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            // SAFETY: creates an event in the current (primary) context; out-parameter.
            call("cuEventCreate", || unsafe {
                sys::cuEventCreate(&mut ev, flags)
            })?;
            // SAFETY: a plain C struct of 64 bytes; all zeros is a valid value.
            let mut eh: sys::CUipcEventHandle = unsafe { std::mem::zeroed() };
            // SAFETY: `ev` is live; `s` is the caller's stream in this context.
            let r = call("cuEventRecord", || unsafe {
                sys::cuEventRecord(ev, s as sys::CUstream)
            })
            .and_then(|()| {
                // SAFETY: `ev` is live and interprocess; out-parameter.
                call("cuIpcGetEventHandle", || unsafe {
                    sys::cuIpcGetEventHandle(&mut eh, ev)
                })
            });
            if let Err(e) = r {
                // SAFETY: ours, destroyed once.
                let _ = guarded("cuEventDestroy", || unsafe { sys::cuEventDestroy_v2(ev) });
                return Err(e);
            }
            let mut ring = SENT_EVENTS.lock().unwrap_or_else(|p| p.into_inner());
            ring.0.push_back(ev as usize);
            if ring.0.len() > EVENT_RING {
                if let Some(old) = ring.0.pop_front() {
                    // SAFETY: ours, destroyed once; CUDA releases it after pending work.
                    let _ = guarded("cuEventDestroy", || unsafe {
                        sys::cuEventDestroy_v2(old as sys::CUevent)
                    });
                }
            }
            Some(to_bytes(&eh.reserved))
        }
    };
    Ok(Shared {
        mem_handle: to_bytes(&mh.reserved),
        alloc_size: size as u64,
        offset: ptr - base,
        event_handle,
    })
}

/// An opened mapping of another process's allocation; closed when the last view drops.
struct Mapping {
    ordinal: usize,
    ptr: u64,
    /// The mapped allocation's bytes as this driver sees them: a handle's `alloc_size` is
    /// checked against it, so a view cannot reach past the real allocation.
    size: u64,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Ok(bound) = enter(self.ordinal) {
            // Work queued on the mapping (on any stream) must finish before it is unmapped;
            // a failed wait (sticky error) leaks the mapping rather than unmap memory in use.
            if wait_for_context(bound.dev).is_ok() {
                // SAFETY: opened once by cuIpcOpenMemHandle, closed once here.
                let _ = guarded("cuIpcCloseMemHandle", || unsafe {
                    sys::cuIpcCloseMemHandle(self.ptr)
                });
            }
        }
    }
}

type Key = ([u8; IPC_HANDLE_SIZE], usize);
static OPENED: Mutex<Option<HashMap<Key, Weak<Mapping>>>> = Mutex::new(None);

/// Opens a validated handle on device `target` (the handle's device, or a peer of it), waiting
/// on its event on `stream` (this process's current stream as an integer, 0 the legacy one).
pub fn open(h: &CudaHandle, target: usize, stream: u64) -> Result<rivet_runtime::Tensor> {
    if h.pid as u32 == std::process::id() {
        return Err(Error::Runtime(rivet_runtime::Error::Ipc(
            "the CUDA handle was made by this process, and CUDA cannot open a handle in the process that made it; use the tensor itself".into(),
        )));
    }
    let bound = enter(target)?;
    let src = h.device as usize;
    if target != src {
        device(src)?;
        let mut can = 0;
        // SAFETY: out-parameter; both ordinals exist (contexts retained above).
        call("cuDeviceCanAccessPeer", || unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, target as i32, src as i32)
        })?;
        if can == 0 {
            return Err(device_error(format!(
                "rivet.ipc.open: argument 'device' is cuda:{target} but the handle's memory is on cuda:{src} and cuda:{target} cannot access it (no peer access between them)"
            )));
        }
    }
    let mapping = {
        let mut cache = OPENED.lock().unwrap_or_else(|p| p.into_inner());
        let cache = cache.get_or_insert_with(HashMap::new);
        cache.retain(|_, w| w.strong_count() > 0);
        let key = (h.mem_handle, target);
        match cache.get(&key).and_then(Weak::upgrade) {
            Some(m) => m,
            None => {
                let mh = sys::CUipcMemHandle {
                    reserved: from_bytes(&h.mem_handle),
                };
                let mut ptr: sys::CUdeviceptr = 0;
                let flags =
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
                // SAFETY: out-parameter; the handle bytes were validated (64 of them).
                call("cuIpcOpenMemHandle", || unsafe {
                    sys::cuIpcOpenMemHandle_v2(&mut ptr, mh, flags)
                })
                .map_err(|e| {
                    Error::Runtime(rivet_runtime::Error::Ipc(format!(
                        "cannot open the CUDA handle (the sender may have freed the memory or exited): {e}"
                    )))
                })?;
                let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
                // SAFETY: out-parameters; `ptr` was just mapped.
                let r = call("cuMemGetAddressRange", || unsafe {
                    sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
                });
                let m = Arc::new(Mapping {
                    ordinal: target,
                    ptr,
                    size: size as u64,
                });
                // On failure `m` drops here and closes the mapping.
                r?;
                cache.insert(key, Arc::downgrade(&m));
                m
            }
        }
    };
    if h.alloc_size > mapping.size {
        return Err(Error::Runtime(rivet_runtime::Error::Ipc(format!(
            "invalid handle: field 'alloc_size' is {} but the CUDA allocation it names has {} bytes",
            h.alloc_size, mapping.size
        ))));
    }
    if let Some(eb) = &h.event_handle {
        let eh = sys::CUipcEventHandle {
            reserved: from_bytes(eb),
        };
        let mut ev: sys::CUevent = std::ptr::null_mut();
        // SAFETY: out-parameter; validated 64 bytes.
        call("cuIpcOpenEventHandle", || unsafe {
            sys::cuIpcOpenEventHandle(&mut ev, eh)
        })?;
        // SAFETY: `ev` is live until destroyed below; destroying after the wait is queued
        // is allowed (CUDA releases it once the wait no longer needs it).
        let r = call("cuStreamWaitEvent", || unsafe {
            sys::cuStreamWaitEvent(stream as sys::CUstream, ev, 0)
        });
        // SAFETY: opened above, destroyed once; the queued wait keeps what it needs.
        let _ = guarded("cuEventDestroy", || unsafe { sys::cuEventDestroy_v2(ev) });
        r?;
    }
    drop(bound);
    let ptr = mapping.ptr;
    // SAFETY: `mapping` maps the whole allocation (alloc_size bytes, validated to hold the view
    // by CudaHandle::parse) and lives as long as the views (it is their owner).
    unsafe {
        rivet_runtime::Tensor::from_raw_parts(
            mapping,
            ptr as *mut u8,
            h.offset,
            h.shape.clone(),
            h.strides.clone(),
            h.dtype,
            rivet_runtime::Device::Cuda(target as i32),
            false,
        )
    }
    .map_err(Error::Runtime)
}
