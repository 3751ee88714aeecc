//! Kernel launches that run: a synthetic cubin (an ELF with two kernel symbols) whose CUDA C
//! is put under `RIVET_CUBIN_SOURCES` by its hash, run in a child process with two devices.
//! Skipped, with the reason printed, while the kernel runner is not there (`Module::load`
//! answers `CUDA_ERROR_NOT_SUPPORTED`).
#![allow(clippy::undocumented_unsafe_blocks)] // every call is the C ABI with plain values

mod common;
use common::*;
use rivet_cuda_double::api::device::*;
use rivet_cuda_double::api::mem::*;
use rivet_cuda_double::api::queue::*;
use rivet_cuda_double::api::Handle;
use rivet_cuda_double::error::*;
use sha2::Digest;
use std::ffi::c_void;

const SOURCE: &str = r#"extern "C" __global__ void fill(unsigned char *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 7;
}
extern "C" __global__ void boom(int n) {
    if (n > 0) __trap();
}
"#;

/// A minimal sm_90 cubin: ELF64 for EM_CUDA with a symbol table naming `fill` and `boom`.
fn cubin() -> Vec<u8> {
    let shstr = b"\0.shstrtab\0.strtab\0.symtab\0".to_vec();
    let str_ = b"\0fill\0boom\0".to_vec();
    let mut sym = vec![0u8; 24];
    for name in [1u32, 6] {
        let mut e = vec![0u8; 24];
        e[..4].copy_from_slice(&name.to_le_bytes());
        e[4] = 0x12; // STB_GLOBAL, STT_FUNC
        e[5] = 0x10; // st_other: a CUDA entry point (a kernel, not a __device__ function)
        sym.extend(e);
    }
    let mut img = vec![0u8; 64];
    let mut offs = Vec::new();
    for d in [&shstr, &str_, &sym] {
        offs.push(img.len() as u64);
        img.extend_from_slice(d);
    }
    while !img.len().is_multiple_of(8) {
        img.push(0);
    }
    let shoff = img.len() as u64;
    img.extend(vec![0u8; 64]); // the null section
    let secs = [
        (1u32, 3u32, 0, shstr.len(), 0u32, 0u64),
        (11, 3, 1, str_.len(), 0, 0),
        (19, 2, 2, sym.len(), 2, 24),
    ];
    for (name, kind, i, size, link, entsize) in secs {
        let mut sh = vec![0u8; 64];
        sh[..4].copy_from_slice(&name.to_le_bytes());
        sh[4..8].copy_from_slice(&kind.to_le_bytes());
        sh[24..32].copy_from_slice(&offs[i].to_le_bytes());
        sh[32..40].copy_from_slice(&(size as u64).to_le_bytes());
        sh[40..44].copy_from_slice(&link.to_le_bytes());
        sh[56..64].copy_from_slice(&entsize.to_le_bytes());
        img.extend(sh);
    }
    img[..4].copy_from_slice(b"\x7fELF");
    img[4] = 2; // ELF64
    img[5] = 1; // little-endian
    img[6] = 1;
    img[8] = 8; // ABI version 8: sm in e_flags bits 8..16
    img[16..18].copy_from_slice(&2u16.to_le_bytes());
    img[18..20].copy_from_slice(&190u16.to_le_bytes()); // EM_CUDA
    img[20..24].copy_from_slice(&1u32.to_le_bytes());
    img[40..48].copy_from_slice(&shoff.to_le_bytes());
    img[48..52].copy_from_slice(&0x0600_5a04u32.to_le_bytes()); // sm_90
    img[52..54].copy_from_slice(&64u16.to_le_bytes());
    img[58..60].copy_from_slice(&64u16.to_le_bytes());
    img[60..62].copy_from_slice(&4u16.to_le_bytes());
    img[62..64].copy_from_slice(&1u16.to_le_bytes());
    img
}

fn launch(f: Handle, grid: u32, block: u32, s: Handle, params: &mut [*mut c_void]) -> u32 {
    let p = if params.is_empty() {
        std::ptr::null_mut()
    } else {
        params.as_mut_ptr()
    };
    unsafe { cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, p, std::ptr::null_mut()) }
}

#[test]
fn kernels_run_lazily_and_launches_are_checked() {
    if !is_child("kernels_run_lazily_and_launches_are_checked") {
        let dir =
            std::env::temp_dir().join(format!("rivet-cuda-double-cubins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hash: String = sha2::Sha256::digest(cubin())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        std::fs::write(dir.join(format!("{hash}.cu")), SOURCE).unwrap();
        let o = child(
            "kernels_run_lazily_and_launches_are_checked",
            &[
                ("RIVET_CUBIN_SOURCES", dir.to_str().unwrap()),
                ("RIVET_CUDA_DOUBLE", "devices=sm_90,sm_90"),
            ],
        );
        let _ = std::fs::remove_dir_all(&dir);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        if out.contains("SKIPPED") {
            println!("{}", out.lines().find(|l| l.contains("SKIPPED")).unwrap());
        }
        return;
    }
    let _g = init();
    let c0 = ctx(0);
    let image = cubin();
    let mut m: Handle = std::ptr::null_mut();
    let code = unsafe { cuModuleLoadData(&mut m, image.as_ptr().cast()) };
    if code == CUDA_ERROR_NOT_SUPPORTED {
        println!("SKIPPED: Module::load answers CUDA_ERROR_NOT_SUPPORTED (the kernel runner is not in this build)");
        return;
    }
    assert_eq!(code, 0, "the synthetic cubin loads");
    let (mut fill, mut boom): (Handle, Handle) = (std::ptr::null_mut(), std::ptr::null_mut());
    unsafe {
        assert_eq!(cuModuleGetFunction(&mut fill, m, c"fill".as_ptr()), 0);
        assert_eq!(cuModuleGetFunction(&mut boom, m, c"boom".as_ptr()), 0);
        let mut none: Handle = std::ptr::null_mut();
        expect(CUDA_ERROR_NOT_FOUND, "no kernel 'nope'", || {
            cuModuleGetFunction(&mut none, m, c"nope".as_ptr())
        });
    }
    let mut s: Handle = std::ptr::null_mut();
    let (mut out, mut n) = (0u64, 1000i32);
    unsafe {
        assert_eq!(cuStreamCreate(&mut s, 1), 0);
        assert_eq!(cuMemAlloc_v2(&mut out, 1000), 0);
    }
    let mut params = [
        (&mut out as *mut u64).cast::<c_void>(),
        (&mut n as *mut i32).cast(),
    ];
    assert_eq!(launch(fill, 4, 256, s, &mut params), 0);
    // The slots may be reused at once: the launch copied them.
    unsafe { std::ptr::write_volatile(params[1].cast::<i32>(), 0) };
    let mut got = vec![0u8; 1000];
    unsafe {
        // A read on another (non-blocking) stream does not wait: the kernel has not run.
        let mut other: Handle = std::ptr::null_mut();
        assert_eq!(cuStreamCreate(&mut other, 1), 0);
        assert_eq!(
            cuMemcpyDtoHAsync_v2(got.as_mut_ptr().cast(), out, 1000, other),
            0
        );
        assert_eq!(cuStreamSynchronize(other), 0);
        assert!(
            got.iter().all(|&b| b == 0xFF),
            "the launch ran before anything forced it"
        );
        assert_eq!(cuStreamSynchronize(s), 0);
        assert_eq!(cuMemcpyDtoH_v2(got.as_mut_ptr().cast(), out, 1000), 0);
    }
    assert!(got.iter().all(|&b| b == 7), "the kernel wrote every byte");
    // Launch checks.
    n = 1000;
    let mut params = [
        (&mut out as *mut u64).cast::<c_void>(),
        (&mut n as *mut i32).cast(),
    ];
    expect(
        CUDA_ERROR_INVALID_VALUE,
        "2048 threads per block",
        || unsafe {
            cuLaunchKernel(
                fill,
                1,
                1,
                1,
                1024,
                2,
                1,
                0,
                s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
    );
    expect(CUDA_ERROR_INVALID_VALUE, "kernelParams is NULL", || {
        launch(fill, 1, 1, s, &mut [])
    });
    let mut dummy: *mut c_void = std::ptr::null_mut();
    expect(
        CUDA_ERROR_INVALID_VALUE,
        "'extra' must be NULL",
        || unsafe {
            cuLaunchKernel(
                fill,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                &mut dummy,
            )
        },
    );
    let mut host = got.as_ptr() as u64;
    let mut bad = [
        (&mut host as *mut u64).cast::<c_void>(),
        (&mut n as *mut i32).cast(),
    ];
    expect(CUDA_ERROR_INVALID_VALUE, "parameter 0", || {
        launch(fill, 1, 1, s, &mut bad)
    });
    unsafe { assert_eq!(cuMemFree_v2(out), 0) };
    expect(CUDA_ERROR_INVALID_VALUE, "use after free", || {
        launch(fill, 1, 1, s, &mut params)
    });
    // A function of context 0 launched from context 1.
    let c1 = ctx(1);
    expect(CUDA_ERROR_INVALID_HANDLE, "not the current", || {
        launch(fill, 1, 1, std::ptr::null_mut(), &mut params)
    });
    unsafe { assert_eq!(cuCtxSetCurrent(c0), 0) };
    let _ = c1;
    // A kernel that traps: the context's sticky error, from the next synchronize on.
    let mut one = 1i32;
    let mut p = [(&mut one as *mut i32).cast::<c_void>()];
    assert_eq!(launch(boom, 1, 1, s, &mut p), 0);
    expect(CUDA_ERROR_LAUNCH_FAILED, "failed when it ran", || unsafe {
        cuCtxSynchronize()
    });
    let mut q = 0;
    expect(CUDA_ERROR_LAUNCH_FAILED, "sticky error", || unsafe {
        cuMemAlloc_v2(&mut q, 8)
    });
    expect(CUDA_ERROR_LAUNCH_FAILED, "sticky error", || unsafe {
        cuModuleUnload(m)
    });
}

#[test]
fn unloaded_module_functions_are_invalid() {
    if !is_child("unloaded_module_functions_are_invalid") {
        let dir =
            std::env::temp_dir().join(format!("rivet-cuda-double-cubins-u{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hash: String = sha2::Sha256::digest(cubin())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        std::fs::write(dir.join(format!("{hash}.cu")), SOURCE).unwrap();
        let o = child(
            "unloaded_module_functions_are_invalid",
            &[("RIVET_CUBIN_SOURCES", dir.to_str().unwrap())],
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            o.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        return;
    }
    let _g = init();
    ctx(0);
    let image = cubin();
    let mut m: Handle = std::ptr::null_mut();
    let code = unsafe { cuModuleLoadData(&mut m, image.as_ptr().cast()) };
    if code == CUDA_ERROR_NOT_SUPPORTED {
        println!("SKIPPED: Module::load answers CUDA_ERROR_NOT_SUPPORTED (the kernel runner is not in this build)");
        return;
    }
    assert_eq!(code, 0);
    let mut boom: Handle = std::ptr::null_mut();
    let mut zero = 0i32;
    let mut p = [(&mut zero as *mut i32).cast::<c_void>()];
    unsafe {
        assert_eq!(cuModuleGetFunction(&mut boom, m, c"boom".as_ptr()), 0);
        assert_eq!(launch(boom, 1, 1, std::ptr::null_mut(), &mut p), 0);
        assert_eq!(cuModuleUnload(m), 0);
        expect(CUDA_ERROR_INVALID_HANDLE, "is not a function", || {
            launch(boom, 1, 1, std::ptr::null_mut(), &mut p)
        });
        expect(CUDA_ERROR_INVALID_HANDLE, "is not a loaded module", || {
            cuModuleUnload(m)
        });
        let mut v = 0;
        assert_eq!(cuDeviceGetAttribute(&mut v, 1, 0), 0);
    }
}
