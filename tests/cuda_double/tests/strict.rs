//! The double's rules, in one process with the default configuration (one sm_90 device):
//! each rule broken on purpose (code + log line), and the positive paths.
#![allow(clippy::undocumented_unsafe_blocks)] // every call is the C ABI with plain values

mod common;
use common::*;
use rivet_cuda_double::api::device::*;
use rivet_cuda_double::api::ipc::*;
use rivet_cuda_double::api::mem::*;
use rivet_cuda_double::api::queue::*;
use rivet_cuda_double::api::Handle;
use rivet_cuda_double::error::*;

fn null() -> Handle {
    std::ptr::null_mut()
}

fn alloc(n: usize) -> u64 {
    let mut p = 0;
    assert_eq!(unsafe { cuMemAlloc_v2(&mut p, n) }, 0);
    p
}

fn read(p: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    assert_eq!(unsafe { cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), p, n) }, 0);
    v
}

fn stream(flags: u32) -> Handle {
    let mut s = null();
    assert_eq!(unsafe { cuStreamCreate(&mut s, flags) }, 0);
    s
}

fn event(flags: u32) -> Handle {
    let mut e = null();
    assert_eq!(unsafe { cuEventCreate(&mut e, flags) }, 0);
    e
}

#[test]
fn init_flags_must_be_zero() {
    let _g = init();
    expect(
        CUDA_ERROR_INVALID_VALUE,
        "cuInit: Flags must be 0",
        || unsafe { cuInit(1) },
    );
}

#[test]
fn device_attributes_are_real_limits_and_unknown_ones_are_reported() {
    let _g = init();
    let get = |a: u32| {
        let mut v = 0;
        assert_eq!(
            unsafe { cuDeviceGetAttribute(&mut v, a, 0) },
            0,
            "attribute {a}"
        );
        v
    };
    assert_eq!(
        (get(1), get(2), get(4), get(5), get(6)),
        (1024, 1024, 64, i32::MAX, 65535)
    );
    assert_eq!((get(8), get(10), get(16), get(41)), (49152, 32, 132, 1));
    assert_eq!((get(75), get(76), get(115)), (9, 0, 1));
    let mut v = 0;
    expect(
        CUDA_ERROR_NOT_SUPPORTED,
        "device attribute 9999 is not known",
        || unsafe { cuDeviceGetAttribute(&mut v, 9999, 0) },
    );
    expect(
        CUDA_ERROR_INVALID_DEVICE,
        "device 1 does not exist",
        || unsafe { cuDeviceGetAttribute(&mut v, 1, 1) },
    );
    let mut d = 0;
    expect(
        CUDA_ERROR_INVALID_DEVICE,
        "device -1 does not exist",
        || unsafe { cuDeviceGet(&mut d, -1) },
    );
    let mut ver = 0;
    assert_eq!(unsafe { cuDriverGetVersion(&mut ver) }, 0);
    assert_eq!(ver, 13020);
}

#[test]
fn current_context_is_per_thread() {
    let _g = init();
    let c = ctx(0);
    let mut got = null();
    assert_eq!(unsafe { cuCtxGetCurrent(&mut got) }, 0);
    assert_eq!(got, c);
    std::thread::spawn(|| {
        let mut got = std::ptr::null_mut();
        assert_eq!(unsafe { cuCtxGetCurrent(&mut got) }, 0);
        assert!(got.is_null(), "a new thread has no current context");
        let mut p = 0;
        expect(
            CUDA_ERROR_INVALID_CONTEXT,
            "cuMemAlloc_v2: no context is current",
            || unsafe { cuMemAlloc_v2(&mut p, 16) },
        );
        expect(
            CUDA_ERROR_INVALID_CONTEXT,
            "cuCtxSynchronize: no context",
            || unsafe { cuCtxSynchronize() },
        );
        let mut s = std::ptr::null_mut();
        expect(
            CUDA_ERROR_INVALID_CONTEXT,
            "cuStreamCreate: no context",
            || unsafe { cuStreamCreate(&mut s, 0) },
        );
        expect(
            CUDA_ERROR_INVALID_CONTEXT,
            "cuLaunchKernel: no context",
            || unsafe {
                cuLaunchKernel(
                    0x1234 as Handle,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            },
        );
        let img = [0u8; 64];
        expect(
            CUDA_ERROR_INVALID_CONTEXT,
            "cuModuleLoadData: no context",
            || unsafe { cuModuleLoadData(&mut s, img.as_ptr().cast()) },
        );
    })
    .join()
    .unwrap();
    // Push / pop keep a stack per thread.
    unsafe {
        assert_eq!(cuCtxPushCurrent_v2(c), 0);
        let mut popped = null();
        assert_eq!(cuCtxPopCurrent_v2(&mut popped), 0);
        assert_eq!(popped, c);
        assert_eq!(cuCtxPopCurrent_v2(&mut popped), 0); // the one ctx() set
        expect(CUDA_ERROR_INVALID_CONTEXT, "context stack is empty", || {
            cuCtxPopCurrent_v2(&mut popped)
        });
    }
}

#[test]
fn memory_round_trip_starts_as_poison() {
    let _g = init();
    ctx(0);
    let p = alloc(1000);
    assert_eq!(p % 256, 0);
    assert!(
        read(p, 1000).iter().all(|&b| b == 0xFF),
        "fresh memory is poison"
    );
    assert_eq!(unsafe { cuMemsetD8_v2(p, 7, 1000) }, 0);
    assert!(read(p, 1000).iter().all(|&b| b == 7));
    let src: Vec<u8> = (0..=255).collect();
    assert_eq!(
        unsafe { cuMemcpyHtoD_v2(p + 10, src.as_ptr().cast(), 256) },
        0
    );
    let q = alloc(256);
    assert_eq!(unsafe { cuMemcpyDtoD_v2(q, p + 10, 256) }, 0);
    assert_eq!(read(q, 256), src);
    let (mut base, mut size) = (0, 0);
    assert_eq!(
        unsafe { cuMemGetAddressRange_v2(&mut base, &mut size, p + 500) },
        0
    );
    assert_eq!((base, size), (p, 1000));
    let (mut free, mut total) = (0, 0);
    assert_eq!(unsafe { cuMemGetInfo_v2(&mut free, &mut total) }, 0);
    assert_eq!(total, 1 << 30);
    assert!(free < total);
    unsafe {
        assert_eq!(cuMemFree_v2(p), 0);
        assert_eq!(cuMemFree_v2(q), 0);
    }
}

#[test]
fn memory_misuse_is_refused() {
    let _g = init();
    ctx(0);
    let p = alloc(100);
    let mut buf = [0u8; 200];
    expect(
        CUDA_ERROR_INVALID_VALUE,
        "run past the end of allocation",
        || unsafe { cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), p, 200) },
    );
    expect(CUDA_ERROR_INVALID_VALUE, "is not its base", || unsafe {
        cuMemFree_v2(p + 8)
    });
    assert_eq!(unsafe { cuMemFree_v2(p) }, 0);
    expect(CUDA_ERROR_INVALID_VALUE, "double free", || unsafe {
        cuMemFree_v2(p)
    });
    expect(CUDA_ERROR_INVALID_VALUE, "use after free", || unsafe {
        cuMemsetD8_v2(p, 0, 1)
    });
    expect(
        CUDA_ERROR_INVALID_VALUE,
        "is not device memory",
        || unsafe { cuMemsetD8_v2(buf.as_ptr() as u64, 0, 1) },
    );
    let mut q = 0;
    expect(
        CUDA_ERROR_OUT_OF_MEMORY,
        "requested on device 0",
        || unsafe { cuMemAlloc_v2(&mut q, 2 << 30) },
    );
    expect(CUDA_ERROR_INVALID_VALUE, "bytesize is 0", || unsafe {
        cuMemAlloc_v2(&mut q, 0)
    });
    // Pool memory: cuMemFree refuses it, the pool handle is set, IPC refuses it.
    assert_eq!(unsafe { cuMemAllocAsync(&mut q, 64, null()) }, 0);
    expect(
        CUDA_ERROR_INVALID_VALUE,
        "free it with cuMemFreeAsync",
        || unsafe { cuMemFree_v2(q) },
    );
    let mut pool = null();
    assert_eq!(
        unsafe { cuPointerGetAttribute((&mut pool as *mut Handle).cast(), 17, q) },
        0
    );
    assert!(!pool.is_null());
    let mut h = IpcHandle { reserved: [0; 64] };
    expect(
        CUDA_ERROR_INVALID_VALUE,
        "cannot be shared with cuIpcGetMemHandle",
        || unsafe { cuIpcGetMemHandle(&mut h, q) },
    );
    assert_eq!(unsafe { cuMemFreeAsync(q, null()) }, 0);
    expect(CUDA_ERROR_INVALID_VALUE, "double free", || unsafe {
        cuMemFreeAsync(q, null())
    });
    expect(CUDA_ERROR_INVALID_VALUE, "use after free", || unsafe {
        cuMemsetD8Async(q, 0, 1, null())
    });
    assert_eq!(unsafe { cuCtxSynchronize() }, 0);
}

#[test]
fn pointer_attributes() {
    let _g = init();
    let c = ctx(0);
    let p = alloc(300);
    let get = |attr: u32| {
        let mut v = 0u64;
        assert_eq!(
            unsafe { cuPointerGetAttribute((&mut v as *mut u64).cast(), attr, p + 4) },
            0
        );
        v
    };
    assert_eq!(get(2) as u32, 2);
    assert_eq!(get(9) as u32, 0);
    assert_eq!(get(1), c as u64);
    assert_eq!(get(11), p);
    assert_eq!(get(12), 300);
    assert_eq!(get(8) as u32, 0);
    assert_eq!(get(17), 0, "cuMemAlloc memory is not pool memory");
    let x = 5u64;
    let mut v = 0u64;
    expect(
        CUDA_ERROR_INVALID_VALUE,
        "is not device memory",
        || unsafe {
            cuPointerGetAttribute((&mut v as *mut u64).cast(), 2, &x as *const u64 as u64)
        },
    );
    expect(CUDA_ERROR_NOT_SUPPORTED, "pointer attribute 5", || unsafe {
        cuPointerGetAttribute((&mut v as *mut u64).cast(), 5, p)
    });
    let mut h = IpcHandle { reserved: [0; 64] };
    expect(CUDA_ERROR_INVALID_VALUE, "is not the base", || unsafe {
        cuIpcGetMemHandle(&mut h, p + 4)
    });
    assert_eq!(unsafe { cuMemFree_v2(p) }, 0);
}

#[test]
fn event_wait_orders_streams_and_missing_wait_reads_poison() {
    let _g = init();
    ctx(0);
    let (a, b) = (stream(1), stream(1)); // non-blocking: no legacy ordering between them
    let (src, out) = (alloc(64), alloc(64));
    let ev = event(2);
    unsafe {
        assert_eq!(cuMemsetD8Async(src, 1, 64, a), 0);
        assert_eq!(cuEventRecord(ev, a), 0);
        assert_eq!(cuStreamWaitEvent(b, ev, 0), 0);
        assert_eq!(cuMemcpyDtoDAsync_v2(out, src, 64, b), 0);
        assert_eq!(cuStreamSynchronize(b), 0);
    }
    assert!(
        read(out, 64).iter().all(|&x| x == 1),
        "with the wait the consumer sees the producer's write"
    );
    let (src2, out2) = (alloc(64), alloc(64));
    unsafe {
        assert_eq!(cuMemsetD8Async(src2, 1, 64, a), 0);
        assert_eq!(cuMemcpyDtoDAsync_v2(out2, src2, 64, b), 0);
        assert_eq!(cuStreamSynchronize(b), 0);
    }
    let mut got = vec![0u8; 64];
    unsafe {
        // Read without forcing stream a: a DtoH on non-blocking b.
        assert_eq!(
            cuMemcpyDtoHAsync_v2(got.as_mut_ptr().cast(), out2, 64, b),
            0
        );
        assert_eq!(cuStreamSynchronize(b), 0);
    }
    assert!(
        got.iter().all(|&x| x == 0xFF),
        "without the wait the consumer read poison"
    );
    // A wait captures the record made before it, not a later one.
    let (src3, out3) = (alloc(8), alloc(8));
    unsafe {
        assert_eq!(cuStreamWaitEvent(b, ev, 0), 0); // last record already ran
        assert_eq!(cuMemsetD8Async(src3, 3, 8, a), 0);
        assert_eq!(cuEventRecord(ev, a), 0);
        assert_eq!(cuMemcpyDtoDAsync_v2(out3, src3, 8, b), 0);
        assert_eq!(cuMemcpyDtoHAsync_v2(got.as_mut_ptr().cast(), out3, 8, b), 0);
        assert_eq!(cuStreamSynchronize(b), 0);
    }
    assert!(
        got[..8].iter().all(|&x| x == 0xFF),
        "a later record is not waited for"
    );
    unsafe {
        assert_eq!(cuCtxSynchronize(), 0);
        for p in [src, out, src2, out2, src3, out3] {
            assert_eq!(cuMemFree_v2(p), 0);
        }
        assert_eq!(cuEventDestroy_v2(ev), 0);
        expect(CUDA_ERROR_INVALID_HANDLE, "was destroyed", || {
            cuEventRecord(ev, a)
        });
        assert_eq!(cuStreamDestroy_v2(a), 0);
        assert_eq!(cuStreamDestroy_v2(b), 0);
    }
}

#[test]
fn legacy_stream_orders_blocking_streams_only() {
    let _g = init();
    ctx(0);
    let (blocking, nonblocking) = (stream(0), stream(1));
    let (p, q) = (alloc(16), alloc(16));
    unsafe {
        assert_eq!(cuMemsetD8Async(p, 5, 16, blocking), 0);
        assert_eq!(cuMemsetD8Async(q, 5, 16, nonblocking), 0);
    }
    // A synchronous copy is a legacy-stream op: it waits for the blocking stream only.
    assert!(read(p, 16).iter().all(|&x| x == 5));
    assert!(
        read(q, 16).iter().all(|&x| x == 0xFF),
        "a non-blocking stream is not waited for"
    );
    // A blocking stream's op waits for earlier legacy-stream ops.
    let (r, out1, out2) = (alloc(16), alloc(16), alloc(16));
    unsafe {
        assert_eq!(cuMemsetD8Async(r, 9, 16, null()), 0);
        assert_eq!(cuMemcpyDtoDAsync_v2(out1, r, 16, blocking), 0);
        assert_eq!(cuMemcpyDtoDAsync_v2(out2, r, 16, nonblocking), 0);
        assert_eq!(cuStreamSynchronize(nonblocking), 0);
        assert_eq!(cuStreamSynchronize(blocking), 0);
    }
    let mut got = [0u8; 16];
    unsafe {
        assert_eq!(
            cuMemcpyDtoHAsync_v2(got.as_mut_ptr().cast(), out2, 16, nonblocking),
            0
        );
        assert_eq!(cuStreamSynchronize(nonblocking), 0);
    }
    assert!(
        got.iter().all(|&x| x == 0xFF),
        "the non-blocking copy ran before the legacy memset"
    );
    assert!(read(out1, 16).iter().all(|&x| x == 9));
    // The per-thread default stream is a blocking stream.
    let s = alloc(4);
    unsafe { assert_eq!(cuMemsetD8Async(s, 4, 4, 0x2 as Handle), 0) };
    assert!(read(s, 4).iter().all(|&x| x == 4));
    unsafe {
        assert_eq!(cuCtxSynchronize(), 0);
        for x in [p, q, r, out1, out2, s] {
            assert_eq!(cuMemFree_v2(x), 0);
        }
    }
}

#[test]
fn queries_report_not_ready_once_and_destroyed_streams_still_run() {
    let _g = init();
    ctx(0);
    let s = stream(1);
    let p = alloc(8);
    let ev = event(0);
    unsafe {
        assert_eq!(cuMemsetD8Async(p, 2, 8, s), 0);
        assert_eq!(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
        assert_eq!(cuStreamQuery(s), 0);
        assert_eq!(cuMemsetD8Async(p, 3, 8, s), 0);
        assert_eq!(cuEventRecord(ev, s), 0);
        assert_eq!(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
        assert_eq!(cuEventQuery(ev), 0);
        assert_eq!(cuMemsetD8Async(p, 6, 8, s), 0);
        assert_eq!(cuStreamDestroy_v2(s), 0);
        expect(CUDA_ERROR_INVALID_HANDLE, "was destroyed", || {
            cuMemsetD8Async(p, 0, 8, s)
        });
        expect(CUDA_ERROR_INVALID_HANDLE, "was destroyed", || {
            cuStreamSynchronize(s)
        });
        assert_eq!(cuCtxSynchronize(), 0);
    }
    assert!(
        read(p, 8).iter().all(|&x| x == 6),
        "a destroyed stream's work still ran"
    );
    unsafe { assert_eq!(cuMemFree_v2(p), 0) };
}

#[test]
fn event_flags_and_handles() {
    let _g = init();
    ctx(0);
    let mut e = null();
    expect(
        CUDA_ERROR_INVALID_VALUE,
        "requires CU_EVENT_DISABLE_TIMING",
        || unsafe { cuEventCreate(&mut e, 4) },
    );
    expect(CUDA_ERROR_INVALID_VALUE, "unknown event flags", || unsafe {
        cuEventCreate(&mut e, 0x40)
    });
    let plain = event(0);
    let mut h = IpcHandle { reserved: [0; 64] };
    expect(
        CUDA_ERROR_INVALID_VALUE,
        "CU_EVENT_INTERPROCESS",
        || unsafe { cuIpcGetEventHandle(&mut h, plain) },
    );
    let ipc = event(4 | 2);
    assert_eq!(unsafe { cuIpcGetEventHandle(&mut h, ipc) }, 0);
    expect(
        CUDA_ERROR_INVALID_CONTEXT,
        "made by this process",
        || unsafe { cuIpcOpenEventHandle(&mut e, h) },
    );
    expect(CUDA_ERROR_INVALID_HANDLE, "is not an event", || unsafe {
        cuEventQuery(0x5555 as Handle)
    });
    expect(CUDA_ERROR_INVALID_HANDLE, "is not a stream", || unsafe {
        cuEventRecord(plain, 0x5555 as Handle)
    });
    expect(CUDA_ERROR_INVALID_VALUE, "Flags must be 0", || unsafe {
        cuStreamWaitEvent(null(), plain, 3)
    });
    // An interprocess record runs its stream at once (a receiver cannot drive our queue).
    let p = alloc(4);
    let s = stream(1);
    unsafe {
        assert_eq!(cuMemsetD8Async(p, 8, 4, s), 0);
        assert_eq!(cuEventRecord(ipc, s), 0);
        assert_eq!(cuEventQuery(ipc), 0, "already complete");
        assert_eq!(cuEventDestroy_v2(plain), 0);
        assert_eq!(cuEventDestroy_v2(ipc), 0);
        expect(CUDA_ERROR_INVALID_HANDLE, "was destroyed", || {
            cuEventDestroy_v2(ipc)
        });
        assert_eq!(cuMemFree_v2(p), 0);
    }
}

#[test]
fn launch_validation() {
    let _g = init();
    ctx(0);
    expect(CUDA_ERROR_INVALID_HANDLE, "is not a function", || unsafe {
        cuLaunchKernel(
            0x1234 as Handle,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    });
    let ok = check_shape([1, 1, 1], [1024, 1, 1], 49152);
    assert!(ok.is_ok());
    for (grid, block, shared, why) in [
        ([1, 1, 1], [1025, 1, 1], 0, "block dimension 0"),
        ([1, 1, 1], [32, 32, 2], 0, "2048 threads per block"),
        ([1, 1, 1], [1, 1, 65], 0, "block dimension 2"),
        ([1, 65536, 1], [1, 1, 1], 0, "grid dimension 1"),
        ([0, 1, 1], [1, 1, 1], 0, "grid dimension 0"),
        ([1, 1, 1], [1, 1, 1], 49153, "shared memory"),
    ] {
        let r = check_shape(grid, block, shared).unwrap_err();
        assert_eq!(r.code, CUDA_ERROR_INVALID_VALUE);
        assert!(r.why.contains(why), "{why}: {}", r.why);
    }
    let mut m = null();
    let junk = [0u8; 64];
    let before = std::fs::read_to_string(log_path())
        .unwrap_or_default()
        .len();
    let code = unsafe { cuModuleLoadData(&mut m, junk.as_ptr().cast()) };
    assert_ne!(code, 0, "junk is not a module");
    let log = std::fs::read_to_string(log_path()).unwrap();
    assert!(
        log[before..].contains("rivet-cuda-double: cuModuleLoadData: "),
        "{log}"
    );
    let mut f = null();
    expect(
        CUDA_ERROR_INVALID_HANDLE,
        "is not a loaded module",
        || unsafe { cuModuleGetFunction(&mut f, 0x4444 as Handle, c"k".as_ptr()) },
    );
    expect(
        CUDA_ERROR_INVALID_HANDLE,
        "is not a loaded module",
        || unsafe { cuModuleUnload(0x4444 as Handle) },
    );
}

#[test]
fn error_names_and_proc_address() {
    let _g = init();
    let mut s: *const std::ffi::c_char = std::ptr::null();
    unsafe {
        assert_eq!(cuGetErrorName(201, &mut s), 0);
        assert_eq!(
            std::ffi::CStr::from_ptr(s).to_str().unwrap(),
            "CUDA_ERROR_INVALID_CONTEXT"
        );
        assert_eq!(cuGetErrorString(2, &mut s), 0);
        assert_eq!(
            std::ffi::CStr::from_ptr(s).to_str().unwrap(),
            "out of memory"
        );
    }
    let mut f: *mut std::ffi::c_void = std::ptr::NonNull::dangling().as_ptr();
    expect(CUDA_ERROR_NOT_FOUND, "'cuMemAlloc'", || unsafe {
        cuGetProcAddress_v2(
            c"cuMemAlloc".as_ptr(),
            &mut f,
            12000,
            0,
            std::ptr::null_mut(),
        )
    });
    assert!(f.is_null());
}

#[test]
fn pools() {
    let _g = init();
    ctx(0);
    let mut pool = null();
    assert_eq!(unsafe { cuDeviceGetDefaultMemPool(&mut pool, 0) }, 0);
    let mut t = u64::MAX;
    unsafe {
        assert_eq!(
            cuMemPoolSetAttribute(pool, 4, (&mut t as *mut u64).cast()),
            0
        );
        let mut v = 0u64;
        assert_eq!(
            cuMemPoolGetAttribute(pool, 4, (&mut v as *mut u64).cast()),
            0
        );
        assert_eq!(v, u64::MAX);
        expect(CUDA_ERROR_INVALID_VALUE, "is not a memory pool", || {
            cuMemPoolGetAttribute(0x99 as Handle, 4, (&mut v as *mut u64).cast())
        });
    }
}

#[test]
fn a_context_event_covers_the_work_of_every_stream() {
    let _g = init();
    let c = ctx(0);
    let (a, b, w) = (stream(1), stream(1), stream(1)); // non-blocking, unrelated
    let (p, q, out) = (alloc(16), alloc(16), alloc(32));
    let ev = event(1); // CU_EVENT_BLOCKING_SYNC, as rivet's free thread makes it
    unsafe {
        assert_eq!(cuMemsetD8Async(p, 5, 16, a), 0);
        assert_eq!(cuMemsetD8Async(q, 6, 16, b), 0);
        assert_eq!(cuCtxRecordEvent(c, ev), 0);
        // Queued after the record: not covered by it.
        assert_eq!(cuMemsetD8Async(p, 7, 16, a), 0);
        assert_eq!(cuStreamWaitEvent(w, ev, 0), 0);
        assert_eq!(cuMemcpyDtoDAsync_v2(out, p, 16, w), 0);
        assert_eq!(cuMemcpyDtoDAsync_v2(out + 16, q, 16, w), 0);
        assert_eq!(cuStreamSynchronize(w), 0);
    }
    let got = read(out, 32);
    assert!(
        got[..16].iter().all(|&x| x == 5) && got[16..].iter().all(|&x| x == 6),
        "the context event covers both streams' earlier work and not the later write: {got:?}"
    );
    unsafe {
        assert_eq!(cuEventSynchronize(ev), 0);
        expect(CUDA_ERROR_INVALID_CONTEXT, "is not a context", || {
            cuCtxRecordEvent(0xdead as Handle, ev)
        });
        assert_eq!(cuCtxSynchronize(), 0);
        for x in [p, q, out] {
            assert_eq!(cuMemFree_v2(x), 0);
        }
        assert_eq!(cuEventDestroy_v2(ev), 0);
        for s in [a, b, w] {
            assert_eq!(cuStreamDestroy_v2(s), 0);
        }
    }
}
