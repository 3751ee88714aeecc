//! Streams, events, modules and kernel launches.
//!
//! Invariants: a launch is checked completely when it is queued (context, handle, limits,
//! parameters, pointers) and its parameter bytes are copied then, so the caller may reuse
//! its slots; an interprocess event's record runs its stream up to the record at once (a
//! receiving process cannot drive this process's lazy queue, so it must find the record
//! done); destroyed streams and events stay known so their handles are `INVALID_HANDLE`.

use super::device::{MAX_BLOCK, MAX_GRID, MAX_SHARED_PER_BLOCK, MAX_THREADS_PER_BLOCK};
use super::*;
use crate::context::{with, FuncRec, ModuleRec, State};
use crate::error::*;
use crate::report::{out, refuse};
use crate::stream::{
    Event, Stream, Work, CU_EVENT_BLOCKING_SYNC, CU_EVENT_DISABLE_TIMING, CU_EVENT_INTERPROCESS,
};

fn call(name: &str, f: impl FnOnce(&mut State) -> Result<(), Refusal>) -> CuResult {
    crate::report::entry(name, || with(f))
}

const CU_STREAM_NON_BLOCKING: u32 = 1;

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(phStream: *mut Handle, Flags: c_uint) -> CuResult {
    call("cuStreamCreate", |s| {
        let c = s.current()?;
        if Flags & !CU_STREAM_NON_BLOCKING != 0 {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!("unknown stream flags {Flags:#x}"),
            );
        }
        if phStream.is_null() {
            return refuse(CUDA_ERROR_INVALID_VALUE, "phStream is NULL");
        }
        let st = s.handle();
        s.streams.insert(
            st,
            Stream::new(c, Flags & CU_STREAM_NON_BLOCKING != 0, false),
        );
        out(phStream, "phStream", ptr(st))
    })
}

/// A created stream of any live context (destroy, synchronize and query need no current
/// context in the real driver, and neither do they here).
fn own_stream(s: &mut State, hs: Handle) -> Result<u64, Refusal> {
    let v = h(hs);
    if v <= crate::stream::CU_STREAM_PER_THREAD {
        let c = s.current()?;
        return s.stream(c, v);
    }
    let st = s.streams.get(&v).ok_or_else(|| {
        Refusal::new(CUDA_ERROR_INVALID_HANDLE, format!("{v:#x} is not a stream"))
    })?;
    if st.destroyed {
        return refuse(
            CUDA_ERROR_INVALID_HANDLE,
            format!("stream {v:#x} was destroyed"),
        );
    }
    s.live_ctx(st.ctx)?;
    Ok(v)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(hStream: Handle) -> CuResult {
    call("cuStreamDestroy_v2", |s| {
        if h(hStream) <= crate::stream::CU_STREAM_PER_THREAD {
            return refuse(
                CUDA_ERROR_INVALID_HANDLE,
                "the default streams cannot be destroyed",
            );
        }
        let st = own_stream(s, hStream)?;
        // Its queued work still runs when something forces it, as with the real driver.
        s.streams.get_mut(&st).expect("checked").destroyed = true;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(hStream: Handle) -> CuResult {
    call("cuStreamSynchronize", |s| {
        let st = own_stream(s, hStream)?;
        s.flush_stream(st);
        let c = s.streams[&st].ctx;
        s.sticky(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(hStream: Handle) -> CuResult {
    call("cuStreamQuery", |s| {
        let st = own_stream(s, hStream)?;
        s.query(s.streams[&st].tail)?;
        let c = s.streams[&st].ctx;
        s.sticky(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(
    hStream: Handle,
    hEvent: Handle,
    Flags: c_uint,
) -> CuResult {
    call("cuStreamWaitEvent", |s| {
        let c = s.current()?;
        let st = s.stream(c, h(hStream))?;
        if Flags != 0 {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!("Flags must be 0 (CU_EVENT_WAIT_DEFAULT), got {Flags}"),
            );
        }
        // The wait captures the event's last record now, as CUDA does; a record made later
        // is not waited for, and an event never recorded is complete.
        let target = s.event(h(hEvent))?.last_record;
        s.enqueue(st, Work::Marker, target);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(phEvent: *mut Handle, Flags: c_uint) -> CuResult {
    call("cuEventCreate", |s| {
        let c = s.current()?;
        let known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
        if Flags & !known != 0 {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!("unknown event flags {Flags:#x}"),
            );
        }
        if Flags & CU_EVENT_INTERPROCESS != 0 && Flags & CU_EVENT_DISABLE_TIMING == 0 {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                "CU_EVENT_INTERPROCESS requires CU_EVENT_DISABLE_TIMING",
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
                flags: Flags,
                destroyed: false,
                last_record: None,
                ipc_opened: false,
            },
        );
        out(phEvent, "phEvent", ptr(e))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(hEvent: Handle, hStream: Handle) -> CuResult {
    call("cuEventRecord", |s| {
        let c = s.current()?;
        let ev = s.event(h(hEvent))?;
        let (ectx, flags, opened) = (ev.ctx, ev.flags, ev.ipc_opened);
        if opened {
            return refuse(
                CUDA_ERROR_INVALID_HANDLE,
                "an event opened from an IPC handle can only be waited on here (the double does not support recording it)",
            );
        }
        let st = s.stream(c, h(hStream))?;
        if s.streams[&st].ctx != ectx {
            return refuse(
                CUDA_ERROR_INVALID_HANDLE,
                format!(
                    "event {:#x} belongs to context {ectx:#x}, the stream to {:#x}",
                    h(hEvent),
                    s.streams[&st].ctx
                ),
            );
        }
        let seq = s.enqueue(st, Work::Marker, None);
        s.events.get_mut(&h(hEvent)).expect("checked").last_record = Some(seq);
        if flags & CU_EVENT_INTERPROCESS != 0 {
            // Another process may wait on it and cannot drive our queue: run up to it now.
            s.run(&[seq]);
        }
        Ok(())
    })
}

/// `cuCtxRecordEvent`: the event completes when all the work queued so far in context
/// `hCtx` has (rivet's free thread waits on one, blocking, instead of `cuCtxSynchronize`).
#[no_mangle]
pub unsafe extern "C" fn cuCtxRecordEvent(hCtx: Handle, hEvent: Handle) -> CuResult {
    call("cuCtxRecordEvent", |s| {
        s.live_ctx(h(hCtx))?;
        let ev = s.event(h(hEvent))?;
        if ev.ipc_opened || ev.ctx != h(hCtx) {
            return refuse(
                CUDA_ERROR_INVALID_HANDLE,
                format!(
                    "event {:#x} cannot be recorded on context {:#x} (it belongs to {:#x}{})",
                    h(hEvent),
                    h(hCtx),
                    ev.ctx,
                    if ev.ipc_opened {
                        ", opened from an IPC handle"
                    } else {
                        ""
                    }
                ),
            );
        }
        let seq = s.enqueue_ctx_marker(h(hCtx));
        s.events.get_mut(&h(hEvent)).expect("checked").last_record = Some(seq);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(hEvent: Handle) -> CuResult {
    call("cuEventQuery", |s| {
        let ev = s.event(h(hEvent))?;
        let (t, c) = (ev.last_record, ev.ctx);
        s.query(t)?;
        s.sticky(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(hEvent: Handle) -> CuResult {
    call("cuEventSynchronize", |s| {
        let ev = s.event(h(hEvent))?;
        let (t, c) = (ev.last_record, ev.ctx);
        if let Some(t) = t {
            s.run(&[t]);
        }
        s.sticky(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(hEvent: Handle) -> CuResult {
    call("cuEventDestroy_v2", |s| {
        s.event(h(hEvent))?;
        // Waits already queued keep the record they captured (they hold its sequence number).
        s.events.get_mut(&h(hEvent)).expect("checked").destroyed = true;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut Handle, image: *const c_void) -> CuResult {
    call("cuModuleLoadData", |s| {
        let c = s.current()?;
        if module.is_null() || image.is_null() {
            return refuse(CUDA_ERROR_INVALID_VALUE, "module or image is NULL");
        }
        let spec = s.config.devices[s.ctxs[&c].device];
        // SAFETY: the caller passes a cubin image, as cuModuleLoadData requires.
        let m = unsafe { crate::kernels::Module::load(image.cast(), (spec.major, spec.minor)) }?;
        let hm = s.handle();
        s.modules.insert(hm, ModuleRec { ctx: c, module: m });
        out(module, "module", ptr(hm))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(hmod: Handle) -> CuResult {
    call("cuModuleUnload", |s| {
        let m = s.modules.get(&h(hmod)).ok_or_else(|| {
            Refusal::new(
                CUDA_ERROR_INVALID_HANDLE,
                format!("{:#x} is not a loaded module", h(hmod)),
            )
        })?;
        let c = m.ctx;
        // A released or failed context answers for its module too (the sticky error).
        s.live_ctx(c)?;
        // Launches of its kernels finish before the code goes.
        s.flush_ctx(c);
        s.modules.remove(&h(hmod));
        s.functions.retain(|_, f| f.module != h(hmod));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    hfunc: *mut Handle,
    hmod: Handle,
    name: *const c_char,
) -> CuResult {
    call("cuModuleGetFunction", |s| {
        let m = s.modules.get(&h(hmod)).ok_or_else(|| {
            Refusal::new(
                CUDA_ERROR_INVALID_HANDLE,
                format!("{:#x} is not a loaded module", h(hmod)),
            )
        })?;
        if name.is_null() || hfunc.is_null() {
            return refuse(CUDA_ERROR_INVALID_VALUE, "name or hfunc is NULL");
        }
        // SAFETY: a NUL-terminated kernel name (API contract).
        let n = unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let f = m.module.function(&n).ok_or_else(|| {
            Refusal::new(
                CUDA_ERROR_NOT_FOUND,
                format!("the module has no kernel '{n}'"),
            )
        })?;
        let ctx = m.ctx;
        let hf = s.handle();
        s.functions.insert(
            hf,
            FuncRec {
                module: h(hmod),
                ctx,
                func: f,
            },
        );
        out(hfunc, "hfunc", ptr(hf))
    })
}

/// Checks a launch's shape against the device limits.
pub fn check_shape(grid: [u32; 3], block: [u32; 3], shared: usize) -> Result<(), Refusal> {
    for i in 0..3 {
        if grid[i] == 0 || grid[i] > MAX_GRID[i] {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "grid dimension {i} is {} (allowed 1..={})",
                    grid[i], MAX_GRID[i]
                ),
            );
        }
        if block[i] == 0 || block[i] > MAX_BLOCK[i] {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "block dimension {i} is {} (allowed 1..={})",
                    block[i], MAX_BLOCK[i]
                ),
            );
        }
    }
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    if threads > MAX_THREADS_PER_BLOCK as u64 {
        return refuse(
            CUDA_ERROR_INVALID_VALUE,
            format!("{threads} threads per block (at most {MAX_THREADS_PER_BLOCK})"),
        );
    }
    if shared > MAX_SHARED_PER_BLOCK as usize {
        return refuse(
            CUDA_ERROR_INVALID_VALUE,
            format!("{shared} bytes of shared memory per block, static and dynamic (at most {MAX_SHARED_PER_BLOCK})"),
        );
    }
    Ok(())
}

/// A pointer parameter: null, or inside a live allocation reachable from context `c`.
fn check_pointer(s: &State, c: u64, i: usize, p: u64) -> Result<(), Refusal> {
    if p == 0 {
        return Ok(());
    }
    let a = s.mem.find(p).ok_or_else(|| {
        Refusal::new(
            CUDA_ERROR_INVALID_VALUE,
            format!("parameter {i}: {}", s.mem.why_not(p)),
        )
    })?;
    if a.free_queued {
        return refuse(
            CUDA_ERROR_INVALID_VALUE,
            format!("parameter {i}: {p:#x} has a cuMemFreeAsync queued: use after free"),
        );
    }
    let ctx = &s.ctxs[&c];
    if a.device != ctx.device && !ctx.peers.contains(&a.ctx) {
        return refuse(
            CUDA_ERROR_INVALID_VALUE,
            format!("parameter {i}: {p:#x} is memory of device {} and the launching context (device {}) has no peer access to it", a.device, ctx.device),
        );
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gridDimX: c_uint,
    gridDimY: c_uint,
    gridDimZ: c_uint,
    blockDimX: c_uint,
    blockDimY: c_uint,
    blockDimZ: c_uint,
    sharedMemBytes: c_uint,
    hStream: Handle,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    call("cuLaunchKernel", |s| {
        let c = s.current()?;
        let fr = s.functions.get(&h(f)).ok_or_else(|| {
            Refusal::new(
                CUDA_ERROR_INVALID_HANDLE,
                format!("{:#x} is not a function of a loaded module", h(f)),
            )
        })?;
        if fr.ctx != c {
            return refuse(
                CUDA_ERROR_INVALID_HANDLE,
                format!(
                    "function {:#x} was loaded in context {:#x}, not the current {c:#x}",
                    h(f),
                    fr.ctx
                ),
            );
        }
        let func = fr.func.clone();
        let (grid, block) = (
            [gridDimX, gridDimY, gridDimZ],
            [blockDimX, blockDimY, blockDimZ],
        );
        check_shape(
            grid,
            block,
            func.static_shared_bytes() + sharedMemBytes as usize,
        )?;
        // The kernel's own limits (`__launch_bounds__`: LAUNCH_OUT_OF_RESOURCES, as CUDA).
        func.check_launch(grid, block)?;
        if !extra.is_null() {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                "'extra' must be NULL (the double takes kernelParams only)",
            );
        }
        let st = s.stream(c, h(hStream))?;
        let info = func.params().clone();
        if kernelParams.is_null() && !info.sizes.is_empty() {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "kernel '{}' has {} parameters but kernelParams is NULL",
                    func.name(),
                    info.sizes.len()
                ),
            );
        }
        let mut params = Vec::with_capacity(info.sizes.len());
        for (i, (&size, &is_ptr)) in info.sizes.iter().zip(&info.is_ptr).enumerate() {
            // SAFETY: kernelParams holds one pointer per parameter, each to `size` readable
            // bytes (the API contract); copied now, as the driver does at enqueue time.
            let bytes = unsafe {
                let slot = *kernelParams.add(i);
                if slot.is_null() {
                    return refuse(
                        CUDA_ERROR_INVALID_VALUE,
                        format!("kernelParams[{i}] is NULL"),
                    );
                }
                std::slice::from_raw_parts(slot.cast::<u8>(), size).to_vec()
            };
            if is_ptr {
                let mut p = [0u8; 8];
                p[..size.min(8)].copy_from_slice(&bytes[..size.min(8)]);
                check_pointer(s, c, i, u64::from_le_bytes(p))?;
            }
            params.push(bytes);
        }
        s.enqueue(
            st,
            Work::Launch {
                func,
                grid,
                block,
                shared: sharedMemBytes,
                params,
            },
            None,
        );
        Ok(())
    })
}
