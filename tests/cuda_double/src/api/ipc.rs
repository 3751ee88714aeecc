//! CUDA IPC entry points: sharing an allocation (its memfd) and an interprocess event.
//!
//! Invariants: only an allocation's base from `cuMemAlloc` can be shared (pool memory is
//! refused as the driver does); an opening maps the owner's memfd at a fresh address of
//! this process under the same `PROT_NONE` discipline; one opening per handle per process
//! (`ALREADY_MAPPED` otherwise); opening in the owning process is `INVALID_CONTEXT`.

use super::*;
use crate::context::{with, State};
use crate::error::*;
use crate::ipc::{EventHandle, MemHandle};
use crate::report::{out, refuse};
use crate::stream::{Event, CU_EVENT_DISABLE_TIMING, CU_EVENT_INTERPROCESS};

/// `CUipcMemHandle` / `CUipcEventHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IpcHandle {
    pub reserved: [u8; 64],
}

fn call(name: &str, f: impl FnOnce(&mut State) -> Result<(), Refusal>) -> CuResult {
    crate::report::entry(name, || with(f))
}

fn me() -> u32 {
    std::process::id()
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(pHandle: *mut IpcHandle, dptr: DevPtr) -> CuResult {
    call("cuIpcGetMemHandle", |s| {
        s.current()?;
        let a = s
            .mem
            .find(dptr)
            .ok_or_else(|| Refusal::new(CUDA_ERROR_INVALID_VALUE, s.mem.why_not(dptr)))?;
        if a.base != dptr {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!("{dptr:#x} is not the base of allocation #{} ({:#x}): share the base and an offset", a.serial, a.base),
            );
        }
        if a.pooled {
            return refuse(CUDA_ERROR_INVALID_VALUE, format!("{dptr:#x} comes from cuMemAllocAsync (a memory pool), which cannot be shared with cuIpcGetMemHandle"));
        }
        if a.ipc.is_some() || a.free_queued {
            return refuse(CUDA_ERROR_INVALID_VALUE, format!("{dptr:#x} is an IPC mapping or being freed; only own live memory can be shared"));
        }
        let m = MemHandle {
            pid: me(),
            fd: a.fd,
            size: a.size as u64,
            device: a.device as u32,
            serial: a.serial,
        };
        out(
            pHandle,
            "pHandle",
            IpcHandle {
                reserved: m.encode(),
            },
        )
    })
}

/// Opens and checks the owner's memfd: its header must name the handle's allocation.
fn open_fd(m: &MemHandle) -> Result<i32, Refusal> {
    let bad = |why: String| Refusal::new(CUDA_ERROR_INVALID_VALUE, why);
    let path = std::ffi::CString::new(format!("/proc/{}/fd/{}", m.pid, m.fd)).expect("no NUL");
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(bad(format!(
            "cannot open the owner's memory ({}: {}): the owner exited or freed it",
            path.to_string_lossy(),
            std::io::Error::last_os_error()
        )));
    }
    let mut header = [0u8; 32];
    // SAFETY: reading 32 bytes into our buffer; fstat into a zeroed struct.
    let (n, st) = unsafe {
        let n = libc::pread(fd, header.as_mut_ptr().cast(), 32, 0);
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st);
        (n, st)
    };
    let w = |i: usize| u64::from_le_bytes(header[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let expect = (crate::memory::page() + crate::memory::layout(m.size as usize).0) as i64;
    let why = if n != 32 || w(0) != crate::memory::HEADER_MAGIC {
        Some("the owner's fd is not device memory of the double".to_string())
    } else if (w(1), w(2), w(3)) != (m.serial, m.size, m.device as u64) {
        Some(format!(
            "stale handle: the owner's fd now holds allocation #{} ({} bytes), the handle names #{} ({} bytes)",
            w(1), w(2), m.serial, m.size
        ))
    } else if st.st_size != expect {
        Some(format!(
            "the owner's memory is {} bytes, the handle implies {expect}",
            st.st_size
        ))
    } else {
        None
    };
    if let Some(why) = why {
        // SAFETY: ours, closed once.
        unsafe { libc::close(fd) };
        return Err(bad(why));
    }
    Ok(fd)
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pdptr: *mut DevPtr,
    handle: IpcHandle,
    Flags: c_uint,
) -> CuResult {
    call("cuIpcOpenMemHandle_v2", |s| {
        let c = s.current()?;
        if pdptr.is_null() {
            return refuse(CUDA_ERROR_INVALID_VALUE, "pdptr is NULL");
        }
        if Flags & !1 != 0 {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!("Flags must be 0 or CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, got {Flags:#x}"),
            );
        }
        let m = MemHandle::decode(&handle.reserved)
            .map_err(|e| Refusal::new(CUDA_ERROR_INVALID_VALUE, e))?;
        if m.pid == me() {
            return refuse(CUDA_ERROR_INVALID_CONTEXT, "the handle was made by this process: CUDA cannot open a handle in the process that made it");
        }
        let key = (m.pid, m.fd, m.serial);
        if let Some(b) = s.ipc_open.get(&key) {
            return refuse(CUDA_ERROR_ALREADY_MAPPED, format!("this handle is already open in this process at {b:#x} (close it first, or reuse that mapping)"));
        }
        let dev = s.ctxs[&c].device;
        if m.device as usize >= s.config.devices.len() {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "the handle names device {}, which this process does not have",
                    m.device
                ),
            );
        }
        if m.device as usize != dev && !s.config.peer {
            return refuse(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, format!("the memory is on device {}, the current context's device {dev} has no peer access to it", m.device));
        }
        let fd = open_fd(&m)?;
        let base = match s.mem.map_foreign(fd, m.size as usize, dev, c, key) {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: ours, closed once.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        s.ipc_open.insert(key, base);
        out(pdptr, "pdptr", base)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: DevPtr) -> CuResult {
    call("cuIpcCloseMemHandle", |s| {
        let c = s.current()?;
        let Some(a) = s
            .mem
            .find(dptr)
            .filter(|a| a.base == dptr && a.ipc.is_some())
        else {
            return refuse(CUDA_ERROR_INVALID_VALUE, format!("{dptr:#x} is not a pointer cuIpcOpenMemHandle returned (or it was closed already)"));
        };
        let key = a.ipc.expect("checked");
        // Work queued on the mapping finishes before it goes.
        s.flush_ctx(a.ctx);
        s.mem.release(dptr);
        s.ipc_open.remove(&key);
        s.sticky(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetEventHandle(pHandle: *mut IpcHandle, event: Handle) -> CuResult {
    call("cuIpcGetEventHandle", |s| {
        let e = s.event(h(event))?;
        if e.flags & CU_EVENT_INTERPROCESS == 0 || e.ipc_opened {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                "the event was not created with CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING",
            );
        }
        let eh = EventHandle {
            pid: me(),
            event: h(event),
        };
        out(
            pHandle,
            "pHandle",
            IpcHandle {
                reserved: eh.encode(),
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenEventHandle(phEvent: *mut Handle, handle: IpcHandle) -> CuResult {
    call("cuIpcOpenEventHandle", |s| {
        let c = s.current()?;
        let eh = EventHandle::decode(&handle.reserved)
            .map_err(|e| Refusal::new(CUDA_ERROR_INVALID_VALUE, e))?;
        if eh.pid == me() {
            return refuse(
                CUDA_ERROR_INVALID_CONTEXT,
                "the event handle was made by this process: use the event itself",
            );
        }
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(eh.pid as i32, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!("the event's owner (pid {}) has exited", eh.pid),
            );
        }
        if phEvent.is_null() {
            return refuse(CUDA_ERROR_INVALID_VALUE, "phEvent is NULL");
        }
        let e = s.handle();
        s.events.insert(
            e,
            Event {
                ctx: c,
                flags: CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING,
                destroyed: false,
                // The owner ran its record when it made it: complete.
                last_record: None,
                ipc_opened: true,
            },
        );
        out(phEvent, "phEvent", ptr(e))
    })
}
