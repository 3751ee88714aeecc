//! Initialisation, devices, contexts, error strings, and the entry points that say no
//! (`cuGetProcAddress`: the CUDA runtime, e.g. torch's, must find no usable driver).
//!
//! Invariants: device attributes are a fixed table of real sm_90-class limits (the launch
//! checks use the same numbers); an attribute not in the table is `NOT_SUPPORTED` and
//! reported, so we learn what callers ask.

use super::*;
use crate::context::{self, with};
use crate::error::*;
use crate::report::{entry, out, refuse};

pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
pub const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
pub const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];
pub const MAX_SHARED_PER_BLOCK: u32 = 49152;

/// The value of device attribute `attr` (`CUdevice_attribute`), if the double knows it.
fn attribute(attr: u32, dev: usize, spec: crate::config::DeviceSpec, pools: bool) -> Option<i32> {
    Some(match attr {
        1 => MAX_THREADS_PER_BLOCK as i32,
        2..=4 => MAX_BLOCK[attr as usize - 2] as i32,
        5..=7 => MAX_GRID[attr as usize - 5] as i32,
        // Static + dynamic shared memory per block; no opt-in (cuFuncSetAttribute is not
        // exported), so the opt-in maximum (97) is the same 48 KiB.
        8 | 97 => MAX_SHARED_PER_BLOCK as i32,
        9 => 65536,           // TOTAL_CONSTANT_MEMORY
        10 => 32,             // WARP_SIZE
        11 => i32::MAX,       // MAX_PITCH
        12 | 82 => 65536,     // registers per block / per multiprocessor
        13 => 1_980_000,      // CLOCK_RATE (kHz)
        14 | 30 => 512,       // texture / surface alignment
        15 | 31 => 1,         // GPU_OVERLAP, CONCURRENT_KERNELS
        16 => 132,            // MULTIPROCESSOR_COUNT
        17 | 18 => 0,         // KERNEL_EXEC_TIMEOUT, INTEGRATED
        19 => 1,              // CAN_MAP_HOST_MEMORY
        20 => 0,              // COMPUTE_MODE default
        32 | 35 => 0,         // ECC_ENABLED, TCC_DRIVER
        33 => dev as i32 + 1, // PCI_BUS_ID
        34 | 50 => 0,         // PCI device / domain
        36 => 2_619_000,      // MEMORY_CLOCK_RATE
        37 => 5120,           // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,       // L2_CACHE_SIZE
        39 => 2048,           // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 2,              // ASYNC_ENGINE_COUNT
        41 => 1,              // UNIFIED_ADDRESSING
        75 => spec.major as i32,
        76 => spec.minor as i32,
        78..=80 => 1,  // stream priorities, L1 caches
        81 => 233_472, // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        83 => 0,       // MANAGED_MEMORY: cuMemAllocManaged is not exported
        84 | 85 | 86 | 88 => 0,
        89 => 0, // CONCURRENT_MANAGED_ACCESS
        90 => 1, // COMPUTE_PREEMPTION_SUPPORTED
        // Host registration (cuMemHostRegister) is not exported: say so.
        91 | 99 | 113 => 0,
        92..=94 => 0, // stream memory operations
        95 => 1,      // COOPERATIVE_LAUNCH
        96 => 0,
        102 => 0, // VIRTUAL_ADDRESS_MANAGEMENT: cuMemCreate & co. are not exported
        103..=105 => 0,
        106 => 32, // MAX_BLOCKS_PER_MULTIPROCESSOR
        115 => pools as i32,
        116..=118 => 0, // GPUDirect RDMA
        119 => 0,       // MEMPOOL_SUPPORTED_HANDLE_TYPES: pool memory is not shareable
        _ => return None,
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuInit(Flags: c_uint) -> CuResult {
    entry("cuInit", || {
        if Flags != 0 {
            return refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!("Flags must be 0, got {Flags}"),
            );
        }
        context::init()
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(driverVersion: *mut c_int) -> CuResult {
    // Allowed before cuInit, as in the real driver.
    entry("cuDriverGetVersion", || {
        out(driverVersion, "driverVersion", 13020)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    entry("cuDeviceGetCount", || {
        with(|s| out(count, "count", s.config.devices.len() as c_int))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CuResult {
    entry("cuDeviceGet", || {
        with(|s| out(device, "device", s.device(ordinal)? as c_int))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_uint,
    dev: c_int,
) -> CuResult {
    entry("cuDeviceGetAttribute", || {
        with(|s| {
            let d = s.device(dev)?;
            match attribute(attrib, d, s.config.devices[d], s.config.pools) {
                Some(v) => out(pi, "pi", v),
                None => refuse(
                    CUDA_ERROR_NOT_SUPPORTED,
                    format!("device attribute {attrib} is not known to the double (add it to api/device.rs)"),
                ),
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> CuResult {
    entry("cuDeviceGetName", || {
        with(|s| {
            let d = s.device(dev)?;
            let spec = s.config.devices[d];
            let text = format!("rivet-cuda-double sm_{}{}\0", spec.major, spec.minor);
            if name.is_null() || len <= 0 {
                return refuse(CUDA_ERROR_INVALID_VALUE, "name is NULL or len <= 0");
            }
            let n = text.len().min(len as usize);
            // SAFETY: the caller's buffer holds `len` bytes; we write at most that, and
            // NUL-terminate within it.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), name, n);
                *name.add(n - 1) = 0;
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CuResult {
    entry("cuDeviceTotalMem_v2", || {
        with(|s| {
            s.device(dev)?;
            out(bytes, "bytes", s.config.memory)
        })
    })
}

fn uuid(uuid: *mut [u8; 16], dev: c_int) -> Result<(), Refusal> {
    with(|s| {
        let d = s.device(dev)?;
        let mut u = *b"rivetcudadouble\0";
        u[15] = d as u8;
        out(uuid, "uuid", u)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid_out: *mut [u8; 16], dev: c_int) -> CuResult {
    entry("cuDeviceGetUuid", || uuid(uuid_out, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid_out: *mut [u8; 16], dev: c_int) -> CuResult {
    entry("cuDeviceGetUuid_v2", || uuid(uuid_out, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: c_int) -> CuResult {
    entry("cuDevicePrimaryCtxRetain", || {
        with(|s| {
            let d = s.device(dev)?;
            if pctx.is_null() {
                return refuse(CUDA_ERROR_INVALID_VALUE, "pctx is NULL");
            }
            let c = s.retain(d);
            out(pctx, "pctx", ptr(c))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CuResult {
    entry("cuDevicePrimaryCtxRelease_v2", || {
        with(|s| {
            let d = s.device(dev)?;
            s.release(d)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut Handle) -> CuResult {
    entry("cuCtxGetCurrent", || {
        with(|_| out(pctx, "pctx", ptr(context::current_handle().unwrap_or(0))))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CuResult {
    entry("cuCtxSetCurrent", || {
        with(|s| {
            if !ctx.is_null() {
                s.live_ctx(h(ctx))?;
            }
            context::set_current(h(ctx));
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CuResult {
    entry("cuCtxPushCurrent_v2", || {
        with(|s| {
            if ctx.is_null() {
                return refuse(CUDA_ERROR_INVALID_VALUE, "ctx is NULL");
            }
            s.live_ctx(h(ctx))?;
            context::push_current(h(ctx));
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut Handle) -> CuResult {
    entry("cuCtxPopCurrent_v2", || {
        with(|_| match context::pop_current() {
            None => refuse(
                CUDA_ERROR_INVALID_CONTEXT,
                "this thread's context stack is empty",
            ),
            Some(c) if pctx.is_null() => {
                let _ = c;
                Ok(())
            }
            Some(c) => out(pctx, "pctx", ptr(c)),
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut c_int) -> CuResult {
    entry("cuCtxGetDevice", || {
        with(|s| {
            let c = s.current()?;
            out(device, "device", s.ctxs[&c].device as c_int)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CuResult {
    entry("cuCtxSynchronize", || {
        with(|s| {
            let c = s.current()?;
            s.flush_ctx(c);
            s.sticky(c)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    canAccessPeer: *mut c_int,
    dev: c_int,
    peerDev: c_int,
) -> CuResult {
    entry("cuDeviceCanAccessPeer", || {
        with(|s| {
            let (a, b) = (s.device(dev)?, s.device(peerDev)?);
            out(
                canAccessPeer,
                "canAccessPeer",
                (a != b && s.config.peer) as c_int,
            )
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peerContext: Handle, Flags: c_uint) -> CuResult {
    entry("cuCtxEnablePeerAccess", || {
        with(|s| {
            let c = s.current()?;
            if Flags != 0 {
                return refuse(
                    CUDA_ERROR_INVALID_VALUE,
                    format!("Flags must be 0, got {Flags}"),
                );
            }
            let p = h(peerContext);
            let pd = s.live_ctx(p)?.device;
            let cd = s.ctxs[&c].device;
            if pd == cd || !s.config.peer {
                return refuse(
                    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
                    format!("device {cd} cannot access device {pd} as a peer"),
                );
            }
            if !s.ctxs.get_mut(&c).expect("current").peers.insert(p) {
                return refuse(
                    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
                    format!("peer access from context {c:#x} to {p:#x} is already enabled"),
                );
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: c_uint, pStr: *mut *const c_char) -> CuResult {
    entry("cuGetErrorName", || match error_name(error) {
        Some((n, _)) => out(pStr, "pStr", n.as_ptr()),
        None => {
            let _ = out(pStr, "pStr", std::ptr::null());
            refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!("{error} is not a CUresult the double knows"),
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: c_uint, pStr: *mut *const c_char) -> CuResult {
    entry("cuGetErrorString", || match error_name(error) {
        Some((_, d)) => out(pStr, "pStr", d.as_ptr()),
        None => {
            let _ = out(pStr, "pStr", std::ptr::null());
            refuse(
                CUDA_ERROR_INVALID_VALUE,
                format!("{error} is not a CUresult the double knows"),
            )
        }
    })
}

/// `cuGetProcAddress`: NOT_FOUND, so the CUDA runtime (torch's, if loaded) reports no usable
/// driver instead of calling entry points the double does not have.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _cudaVersion: c_int,
    _flags: u64,
) -> CuResult {
    proc_address("cuGetProcAddress", symbol, pfn)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _cudaVersion: c_int,
    _flags: u64,
    symbolStatus: *mut c_int,
) -> CuResult {
    if !symbolStatus.is_null() {
        // SAFETY: a non-null out-parameter (CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1).
        unsafe { symbolStatus.write_unaligned(1) };
    }
    proc_address("cuGetProcAddress_v2", symbol, pfn)
}

fn proc_address(call: &str, symbol: *const c_char, pfn: *mut *mut c_void) -> CuResult {
    entry(call, || {
        if !pfn.is_null() {
            out(pfn, "pfn", std::ptr::null_mut())?;
        }
        let name = if symbol.is_null() {
            "(NULL)".to_string()
        } else {
            // SAFETY: the caller passes a NUL-terminated symbol name.
            unsafe { std::ffi::CStr::from_ptr(symbol) }
                .to_string_lossy()
                .into_owned()
        };
        refuse(
            CUDA_ERROR_NOT_FOUND,
            format!("'{name}': the double exports its entry points by name only (a CUDA runtime using it reports no device)"),
        )
    })
}
