//! Device memory entry points: allocation, freeing, memset, copies, queries, pools.
//!
//! Invariants: every device range an operation names lies inside one live allocation at
//! enqueue time (`Memory::check_range`), so the executor never touches memory it does not
//! own; synchronous calls queue on the legacy stream and run up to their own operation (the
//! legacy stream's implicit synchronization); host source bytes of a copy are taken at
//! enqueue time (pageable memory: the driver stages them before returning).

use super::*;
use crate::context::{pool_handle, with, State};
use crate::error::*;
use crate::report::{out, refuse};
use crate::stream::Work;

fn call(name: &str, f: impl FnOnce(&mut State) -> Result<(), Refusal>) -> CuResult {
    crate::report::entry(name, || with(f))
}

fn alloc(s: &mut State, dptr: *mut DevPtr, size: usize, pooled: bool) -> Result<u64, Refusal> {
    let c = s.current()?;
    if dptr.is_null() {
        return refuse(CUDA_ERROR_INVALID_VALUE, "dptr is NULL");
    }
    if size == 0 {
        return refuse(CUDA_ERROR_INVALID_VALUE, "bytesize is 0");
    }
    let dev = s.ctxs[&c].device;
    let limit = s.config.memory;
    let p = s.mem.alloc(size, dev, c, pooled, limit)?;
    out(dptr, "dptr", p)?;
    Ok(c)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut DevPtr, bytesize: usize) -> CuResult {
    call("cuMemAlloc_v2", |s| {
        alloc(s, dptr, bytesize, false).map(drop)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut DevPtr,
    bytesize: usize,
    hStream: Handle,
) -> CuResult {
    call("cuMemAllocAsync", |s| {
        let c = s.current()?;
        if !s.config.pools {
            return refuse(
                CUDA_ERROR_NOT_SUPPORTED,
                "the device has no memory pools (RIVET_CUDA_DOUBLE pools=0): check CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED first",
            );
        }
        let st = s.stream(c, h(hStream))?;
        alloc(s, dptr, bytesize, true)?;
        s.enqueue(st, Work::Marker, None);
        Ok(())
    })
}

/// The live allocation whose base is `p`, to be freed from context `c`.
fn freeable(s: &State, c: u64, p: u64, how: &str) -> Result<(), Refusal> {
    let Some(a) = s.mem.find(p) else {
        let why = s.mem.why_not(p);
        let why = if s.mem.freed.contains_key(&p) {
            format!("{p:#x} was already freed: double free")
        } else {
            why
        };
        return refuse(CUDA_ERROR_INVALID_VALUE, why);
    };
    if a.base != p {
        return refuse(
            CUDA_ERROR_INVALID_VALUE,
            format!(
                "{p:#x} is inside allocation #{} but is not its base {:#x}",
                a.serial, a.base
            ),
        );
    }
    if a.free_queued {
        return refuse(
            CUDA_ERROR_INVALID_VALUE,
            format!("{p:#x} already has a cuMemFreeAsync queued: double free"),
        );
    }
    if a.ipc.is_some() {
        return refuse(
            CUDA_ERROR_INVALID_VALUE,
            format!("{p:#x} is an IPC mapping: close it with cuIpcCloseMemHandle"),
        );
    }
    if a.pooled && how == "sync" {
        return refuse(
            CUDA_ERROR_INVALID_VALUE,
            format!(
                "{p:#x} comes from cuMemAllocAsync (a memory pool): free it with cuMemFreeAsync"
            ),
        );
    }
    if a.ctx != c {
        return refuse(
            CUDA_ERROR_INVALID_CONTEXT,
            format!(
                "{p:#x} was allocated in context {:#x}, not the current {c:#x}",
                a.ctx
            ),
        );
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: DevPtr) -> CuResult {
    call("cuMemFree_v2", |s| {
        let c = s.current()?;
        freeable(s, c, dptr, "sync")?;
        // cuMemFree synchronizes: work queued on the memory finishes first.
        s.flush_ctx(c);
        s.mem.release(dptr);
        s.sticky(c)
    })
}

/// Stream-ordered free. Like the real driver it also accepts `cuMemAlloc` memory (freed in
/// stream order here; the driver synchronizes instead): strictness would buy nothing.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: DevPtr, hStream: Handle) -> CuResult {
    call("cuMemFreeAsync", |s| {
        let c = s.current()?;
        let st = s.stream(c, h(hStream))?;
        freeable(s, c, dptr, "async")?;
        s.mem.find_mut(dptr).expect("checked").free_queued = true;
        s.enqueue(st, Work::Free { base: dptr }, None);
        Ok(())
    })
}

/// Queues `work` on `hStream` of the current context; `sync`: runs up to it.
fn queue(
    s: &mut State,
    hStream: Option<Handle>,
    work: impl FnOnce(&State) -> Result<Work, Refusal>,
) -> Result<(), Refusal> {
    let c = s.current()?;
    let st = s.stream(c, hStream.map_or(0, h))?;
    let w = work(s)?;
    let seq = s.enqueue(st, w, None);
    if hStream.is_none() {
        s.run(&[seq]);
        s.sticky(c)?;
    }
    Ok(())
}

fn memset(
    s: &mut State,
    stream: Option<Handle>,
    dst: DevPtr,
    uc: u8,
    n: usize,
) -> Result<(), Refusal> {
    queue(s, stream, |s| {
        s.mem.check_range(dst, n, "dstDevice")?;
        Ok(Work::Memset { dst, value: uc, n })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dstDevice: DevPtr, uc: u8, N: usize) -> CuResult {
    call("cuMemsetD8_v2", |s| memset(s, None, dstDevice, uc, N))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dstDevice: DevPtr,
    uc: u8,
    N: usize,
    hStream: Handle,
) -> CuResult {
    call("cuMemsetD8Async", |s| {
        memset(s, Some(hStream), dstDevice, uc, N)
    })
}

fn htod(
    s: &mut State,
    stream: Option<Handle>,
    dst: DevPtr,
    src: *const c_void,
    n: usize,
) -> Result<(), Refusal> {
    queue(s, stream, |s| {
        s.mem.check_range(dst, n, "dstDevice")?;
        if src.is_null() && n > 0 {
            return refuse(CUDA_ERROR_INVALID_VALUE, "srcHost is NULL");
        }
        let data = if n == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller's host buffer holds `n` readable bytes (the API contract).
            unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) }.to_vec()
        };
        Ok(Work::HtoD { dst, data })
    })
}

fn dtoh(
    s: &mut State,
    stream: Option<Handle>,
    dst: *mut c_void,
    src: DevPtr,
    n: usize,
) -> Result<(), Refusal> {
    queue(s, stream, |s| {
        s.mem.check_range(src, n, "srcDevice")?;
        if dst.is_null() && n > 0 {
            return refuse(CUDA_ERROR_INVALID_VALUE, "dstHost is NULL");
        }
        Ok(Work::DtoH {
            dst: dst as usize,
            src,
            n,
        })
    })
}

fn dtod(
    s: &mut State,
    stream: Option<Handle>,
    dst: DevPtr,
    src: DevPtr,
    n: usize,
) -> Result<(), Refusal> {
    queue(s, stream, |s| {
        s.mem.check_range(dst, n, "dstDevice")?;
        s.mem.check_range(src, n, "srcDevice")?;
        Ok(Work::DtoD { dst, src, n })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dstDevice: DevPtr,
    srcHost: *const c_void,
    ByteCount: usize,
) -> CuResult {
    call("cuMemcpyHtoD_v2", |s| {
        htod(s, None, dstDevice, srcHost, ByteCount)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dstHost: *mut c_void,
    srcDevice: DevPtr,
    ByteCount: usize,
) -> CuResult {
    call("cuMemcpyDtoH_v2", |s| {
        dtoh(s, None, dstHost, srcDevice, ByteCount)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(
    dstDevice: DevPtr,
    srcDevice: DevPtr,
    ByteCount: usize,
) -> CuResult {
    call("cuMemcpyDtoD_v2", |s| {
        dtod(s, None, dstDevice, srcDevice, ByteCount)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dstDevice: DevPtr,
    srcHost: *const c_void,
    ByteCount: usize,
    hStream: Handle,
) -> CuResult {
    call("cuMemcpyHtoDAsync_v2", |s| {
        htod(s, Some(hStream), dstDevice, srcHost, ByteCount)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dstHost: *mut c_void,
    srcDevice: DevPtr,
    ByteCount: usize,
    hStream: Handle,
) -> CuResult {
    call("cuMemcpyDtoHAsync_v2", |s| {
        dtoh(s, Some(hStream), dstHost, srcDevice, ByteCount)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dstDevice: DevPtr,
    srcDevice: DevPtr,
    ByteCount: usize,
    hStream: Handle,
) -> CuResult {
    call("cuMemcpyDtoDAsync_v2", |s| {
        dtod(s, Some(hStream), dstDevice, srcDevice, ByteCount)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    call("cuMemGetInfo_v2", |s| {
        let c = s.current()?;
        let d = s.ctxs[&c].device;
        out(free, "free", s.config.memory - s.mem.used[d])?;
        out(total, "total", s.config.memory)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut DevPtr,
    psize: *mut usize,
    dptr: DevPtr,
) -> CuResult {
    call("cuMemGetAddressRange_v2", |s| {
        let a = s
            .mem
            .find(dptr)
            .ok_or_else(|| Refusal::new(CUDA_ERROR_NOT_FOUND, s.mem.why_not(dptr)))?;
        // Both out-parameters are optional in the real API.
        if !pbase.is_null() {
            out(pbase, "pbase", a.base)?;
        }
        if !psize.is_null() {
            out(psize, "psize", a.size)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_uint,
    dptr: DevPtr,
) -> CuResult {
    call("cuPointerGetAttribute", |s| {
        let a = s
            .mem
            .find(dptr)
            .ok_or_else(|| Refusal::new(CUDA_ERROR_INVALID_VALUE, s.mem.why_not(dptr)))?;
        match attribute {
            1 => out(data.cast::<Handle>(), "data", ptr(a.ctx)),
            2 => out(data.cast::<u32>(), "data", 2), // CU_MEMORYTYPE_DEVICE
            8 => out(data.cast::<u32>(), "data", 0), // IS_MANAGED
            9 => out(data.cast::<c_int>(), "data", a.device as c_int),
            11 => out(data.cast::<DevPtr>(), "data", a.base),
            12 => out(data.cast::<usize>(), "data", a.size),
            17 => {
                let pool = if a.pooled { ptr(pool_handle(a.device)) } else { std::ptr::null_mut() };
                out(data.cast::<Handle>(), "data", pool)
            }
            _ => refuse(
                CUDA_ERROR_NOT_SUPPORTED,
                format!("pointer attribute {attribute} is not known to the double (add it to api/mem.rs)"),
            ),
        }
    })
}

fn pool(s: &State, pool_out: *mut Handle, dev: c_int) -> Result<(), Refusal> {
    let d = s.device(dev)?;
    if !s.config.pools {
        return refuse(
            CUDA_ERROR_NOT_SUPPORTED,
            "the device has no memory pools (pools=0)",
        );
    }
    out(pool_out, "pool", ptr(pool_handle(d)))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool_out: *mut Handle, dev: c_int) -> CuResult {
    call("cuDeviceGetDefaultMemPool", |s| pool(s, pool_out, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool_out: *mut Handle, dev: c_int) -> CuResult {
    call("cuDeviceGetMemPool", |s| pool(s, pool_out, dev))
}

fn pool_device(s: &State, p: Handle) -> Result<usize, Refusal> {
    (0..s.config.devices.len())
        .find(|&d| pool_handle(d) == h(p) && s.config.pools)
        .ok_or_else(|| {
            Refusal::new(
                CUDA_ERROR_INVALID_VALUE,
                format!("{:#x} is not a memory pool", h(p)),
            )
        })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: Handle,
    attr: c_uint,
    value: *mut c_void,
) -> CuResult {
    call("cuMemPoolSetAttribute", |s| {
        let d = pool_device(s, pool)?;
        if value.is_null() {
            return refuse(CUDA_ERROR_INVALID_VALUE, "value is NULL");
        }
        let v = match attr {
            // SAFETY: an int attribute, the caller's value points at one.
            1..=3 => (unsafe { value.cast::<c_int>().read_unaligned() }) as u64,
            // SAFETY: a cuuint64_t attribute.
            4 | 6 | 8 => unsafe { value.cast::<u64>().read_unaligned() },
            _ => {
                return refuse(
                    CUDA_ERROR_NOT_SUPPORTED,
                    format!("memory pool attribute {attr} is not known to the double"),
                )
            }
        };
        if matches!(attr, 6 | 8) && v != 0 {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                "a high-water mark can only be reset to 0",
            );
        }
        s.pool_attrs[d].insert(attr, v);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: Handle,
    attr: c_uint,
    value: *mut c_void,
) -> CuResult {
    call("cuMemPoolGetAttribute", |s| {
        let d = pool_device(s, pool)?;
        let used: u64 = s
            .mem
            .live
            .values()
            .filter(|a| a.pooled && a.device == d)
            .map(|a| crate::memory::round_up(a.size, crate::memory::ALIGN) as u64)
            .sum();
        match attr {
            1..=3 => out(
                value.cast::<c_int>(),
                "value",
                *s.pool_attrs[d].get(&attr).unwrap_or(&1) as c_int,
            ),
            4 => out(
                value.cast::<u64>(),
                "value",
                *s.pool_attrs[d].get(&4).unwrap_or(&0),
            ),
            5..=8 => out(value.cast::<u64>(), "value", used),
            _ => refuse(
                CUDA_ERROR_NOT_SUPPORTED,
                format!("memory pool attribute {attr} is not known to the double"),
            ),
        }
    })
}
