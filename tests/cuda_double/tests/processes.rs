//! Rules that need a fresh process: calls before cuInit, other configurations, context
//! release to zero, a host read of device memory (must crash loudly), and IPC between two
//! processes. Each test re-runs this binary as a child (`common::child`) with its setting.
#![allow(clippy::undocumented_unsafe_blocks)] // every call is the C ABI with plain values

mod common;
use common::*;
use rivet_cuda_double::api::device::*;
use rivet_cuda_double::api::ipc::*;
use rivet_cuda_double::api::mem::*;
use rivet_cuda_double::api::queue::*;
use rivet_cuda_double::api::Handle;
use rivet_cuda_double::error::*;

fn run_child(name: &str, env: &[(&str, &str)]) -> std::process::Output {
    let o = child(name, env);
    assert!(
        o.status.success(),
        "child {name} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

#[test]
fn calls_before_init_are_not_initialized() {
    if !is_child("calls_before_init_are_not_initialized") {
        run_child("calls_before_init_are_not_initialized", &[]);
        return;
    }
    let _g = lock();
    let mut n = 0;
    expect(
        CUDA_ERROR_NOT_INITIALIZED,
        "cuDeviceGetCount: called before cuInit",
        || unsafe { cuDeviceGetCount(&mut n) },
    );
    let mut p = 0;
    expect(
        CUDA_ERROR_NOT_INITIALIZED,
        "cuMemAlloc_v2: called before cuInit",
        || unsafe { cuMemAlloc_v2(&mut p, 8) },
    );
    assert_eq!(unsafe { cuInit(0) }, 0);
    assert_eq!(unsafe { cuDeviceGetCount(&mut n) }, 0);
    assert_eq!(n, 1);
}

#[test]
fn malformed_configuration_fails_init() {
    if !is_child("malformed_configuration_fails_init") {
        run_child(
            "malformed_configuration_fails_init",
            &[("RIVET_CUDA_DOUBLE", "devices=gpu0")],
        );
        return;
    }
    let _g = lock();
    expect(
        CUDA_ERROR_INVALID_VALUE,
        "cuInit: RIVET_CUDA_DOUBLE='devices=gpu0'",
        || unsafe { cuInit(0) },
    );
    let mut n = 0;
    expect(CUDA_ERROR_NOT_INITIALIZED, "before cuInit", || unsafe {
        cuDeviceGetCount(&mut n)
    });
}

#[test]
fn no_pools_refuses_async_allocation() {
    if !is_child("no_pools_refuses_async_allocation") {
        run_child(
            "no_pools_refuses_async_allocation",
            &[("RIVET_CUDA_DOUBLE", "pools=0")],
        );
        return;
    }
    let _g = init();
    ctx(0);
    let mut v = 1;
    assert_eq!(unsafe { cuDeviceGetAttribute(&mut v, 115, 0) }, 0);
    assert_eq!(v, 0);
    let mut p = 0;
    expect(
        CUDA_ERROR_NOT_SUPPORTED,
        "cuMemAllocAsync: the device has no memory pools",
        || unsafe { cuMemAllocAsync(&mut p, 8, std::ptr::null_mut()) },
    );
}

#[test]
fn two_devices_without_peer_access() {
    if !is_child("two_devices_without_peer_access") {
        run_child(
            "two_devices_without_peer_access",
            &[(
                "RIVET_CUDA_DOUBLE",
                "devices=sm_90,sm_80;peer=0;memory=4096",
            )],
        );
        return;
    }
    let _g = init();
    let mut v = 0;
    unsafe {
        assert_eq!(cuDeviceGetAttribute(&mut v, 75, 1), 0);
        assert_eq!(v, 8);
        assert_eq!(cuDeviceCanAccessPeer(&mut v, 0, 1), 0);
        assert_eq!(v, 0);
    }
    let c1 = ctx(1);
    let mut p1 = 0;
    let mut s1: Handle = std::ptr::null_mut();
    let mut e1: Handle = std::ptr::null_mut();
    unsafe {
        assert_eq!(cuMemAlloc_v2(&mut p1, 4000), 0);
        let mut q = 0;
        expect(CUDA_ERROR_OUT_OF_MEMORY, "in use", || {
            cuMemAlloc_v2(&mut q, 200)
        });
        assert_eq!(cuStreamCreate(&mut s1, 0), 0);
        assert_eq!(cuEventCreate(&mut e1, 0), 0);
    }
    let c0 = ctx(0);
    unsafe {
        expect(
            CUDA_ERROR_INVALID_CONTEXT,
            "was allocated in context",
            || cuMemFree_v2(p1),
        );
        expect(CUDA_ERROR_INVALID_HANDLE, "belongs to context", || {
            cuMemsetD8Async(p1, 0, 1, s1)
        });
        expect(CUDA_ERROR_INVALID_HANDLE, "is not a stream", || {
            cuEventRecord(e1, 0x7777 as Handle)
        });
        // The event of context 1 recorded on context 0's legacy stream.
        expect(CUDA_ERROR_INVALID_HANDLE, "belongs to context", || {
            cuEventRecord(e1, std::ptr::null_mut())
        });
        expect(
            CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
            "cannot access device",
            || cuCtxEnablePeerAccess(c1, 0),
        );
        let _ = c0;
        assert_eq!(cuCtxSetCurrent(c1), 0);
        assert_eq!(cuMemFree_v2(p1), 0);
    }
}

#[test]
fn released_context_is_invalid() {
    if !is_child("released_context_is_invalid") {
        run_child("released_context_is_invalid", &[]);
        return;
    }
    let _g = init();
    let c = ctx(0);
    let mut again: Handle = std::ptr::null_mut();
    let mut s: Handle = std::ptr::null_mut();
    unsafe {
        assert_eq!(cuDevicePrimaryCtxRetain(&mut again, 0), 0);
        assert_eq!(again, c, "one primary context per device");
        assert_eq!(cuDevicePrimaryCtxRelease_v2(0), 0);
        assert_eq!(cuStreamCreate(&mut s, 0), 0);
        assert_eq!(cuDevicePrimaryCtxRelease_v2(0), 0);
        expect(
            CUDA_ERROR_INVALID_CONTEXT,
            "release without a matching retain",
            || cuDevicePrimaryCtxRelease_v2(0),
        );
        let mut p = 0;
        expect(CUDA_ERROR_INVALID_CONTEXT, "was released", || {
            cuMemAlloc_v2(&mut p, 8)
        });
        expect(CUDA_ERROR_INVALID_CONTEXT, "was released", || {
            cuCtxSetCurrent(c)
        });
        expect(CUDA_ERROR_INVALID_HANDLE, "was destroyed", || {
            cuStreamSynchronize(s)
        });
        let fresh = ctx(0);
        assert_ne!(fresh, c, "a new primary context gets a new handle");
    }
}

#[test]
fn host_read_of_device_memory_crashes_loudly() {
    if !is_child("host_read_of_device_memory_crashes_loudly") {
        let o = child("host_read_of_device_memory_crashes_loudly", &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "the host read succeeded: {err}");
        assert!(
            err.contains("rivet-cuda-double: host access to device memory at 0x")
                && err.contains("(allocation #"),
            "{err}"
        );
        return;
    }
    let _g = init();
    ctx(0);
    let mut p = 0;
    assert_eq!(unsafe { cuMemAlloc_v2(&mut p, 64) }, 0);
    // SAFETY: none — this read must fault (the point of the test).
    let v = unsafe { std::ptr::read_volatile(p as *const u8) };
    println!("read {v}: the double let the host read device memory");
}

#[test]
fn ipc_between_processes() {
    if is_child("ipc_between_processes") {
        return ipc_receiver();
    }
    let _g = init();
    ctx(0);
    let mut p = 0;
    let mut h = IpcHandle { reserved: [0; 64] };
    let mut eh = IpcHandle { reserved: [0; 64] };
    let mut ev: Handle = std::ptr::null_mut();
    let mut s: Handle = std::ptr::null_mut();
    unsafe {
        assert_eq!(cuMemAlloc_v2(&mut p, 1000), 0);
        assert_eq!(cuStreamCreate(&mut s, 1), 0);
        assert_eq!(cuMemsetD8Async(p, 42, 1000, s), 0);
        assert_eq!(cuEventCreate(&mut ev, 4 | 2), 0);
        assert_eq!(cuEventRecord(ev, s), 0);
        assert_eq!(cuIpcGetMemHandle(&mut h, p), 0);
        assert_eq!(cuIpcGetEventHandle(&mut eh, ev), 0);
        let mut q = 0;
        expect(CUDA_ERROR_INVALID_CONTEXT, "made by this process", || {
            cuIpcOpenMemHandle_v2(&mut q, h, 1)
        });
    }
    let hex = |b: &[u8; 64]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let o = run_child(
        "ipc_between_processes",
        &[
            ("IPC_MEM", &hex(&h.reserved)),
            ("IPC_EVENT", &hex(&eh.reserved)),
        ],
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("receiver saw 42"));
    unsafe { assert_eq!(cuMemFree_v2(p), 0) };
}

fn ipc_receiver() {
    let _g = init();
    ctx(0);
    let unhex = |s: String| {
        let mut b = [0u8; 64];
        for (i, x) in b.iter_mut().enumerate() {
            *x = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        IpcHandle { reserved: b }
    };
    let h = unhex(std::env::var("IPC_MEM").unwrap());
    let eh = unhex(std::env::var("IPC_EVENT").unwrap());
    let (mut p, mut q) = (0, 0);
    let mut ev: Handle = std::ptr::null_mut();
    let mut got = vec![0u8; 1000];
    unsafe {
        assert_eq!(cuIpcOpenEventHandle(&mut ev, eh), 0);
        assert_eq!(cuStreamWaitEvent(std::ptr::null_mut(), ev, 0), 0);
        assert_eq!(cuEventDestroy_v2(ev), 0);
        assert_eq!(cuIpcOpenMemHandle_v2(&mut p, h, 1), 0);
        expect(
            CUDA_ERROR_ALREADY_MAPPED,
            "already open in this process",
            || cuIpcOpenMemHandle_v2(&mut q, h, 1),
        );
        let mut bad = h;
        bad.reserved[0] ^= 1;
        expect(CUDA_ERROR_INVALID_VALUE, "bad magic", || {
            cuIpcOpenMemHandle_v2(&mut q, bad, 1)
        });
        let mut size = 0;
        assert_eq!(
            cuMemGetAddressRange_v2(std::ptr::null_mut(), &mut size, p),
            0
        );
        assert_eq!(size, 1000);
        assert_eq!(cuMemcpyDtoH_v2(got.as_mut_ptr().cast(), p, 1000), 0);
        assert!(got.iter().all(|&x| x == 42));
        expect(
            CUDA_ERROR_INVALID_VALUE,
            "close it with cuIpcCloseMemHandle",
            || cuMemFree_v2(p),
        );
        assert_eq!(cuIpcCloseMemHandle(p), 0);
        expect(
            CUDA_ERROR_INVALID_VALUE,
            "is not a pointer cuIpcOpenMemHandle returned",
            || cuIpcCloseMemHandle(p),
        );
        // Reopening after closing is allowed.
        assert_eq!(cuIpcOpenMemHandle_v2(&mut q, h, 1), 0);
        assert_eq!(cuIpcCloseMemHandle(q), 0);
    }
    println!("receiver saw 42");
}
