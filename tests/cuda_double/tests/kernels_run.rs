//! The kernel runner on real cubins: NVRTC compiles hand-written CUDA C in the style rivet
//! generates, the source is recorded under the cubin's hash as rivet records it, and the
//! double loads the cubin and runs it on host buffers.
//!
//! NVRTC comes from `RIVET_NVRTC_PATH` (a folder holding `libnvrtc.so.*`) or the workspace's
//! `.venv` (the torch wheel's `nvidia/cu*/lib`); without it the tests say why and pass, unless
//! `RIVET_REQUIRE_NVRTC=1` makes that a failure. Every test of this binary shares one
//! `RIVET_CUBIN_SOURCES` folder (the environment is the process's); loads are serialized by
//! `ENV` so the test that unsets it sees no other test's load.

use rivet_cuda_double::error::*;
use rivet_cuda_double::kernels::{cubin_len, Module, SOURCES_VAR};
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

// ---- NVRTC --------------------------------------------------------------------------------

struct Nvrtc {
    create: unsafe extern "C" fn(
        *mut *mut c_void,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(*mut c_void, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int,
    log: unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int,
    cubin_size: unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int,
    cubin: unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut *mut c_void) -> c_int,
}

fn nvrtc_candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("RIVET_NVRTC_PATH") {
        dirs.push(PathBuf::from(d));
    }
    let venv_lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/lib");
    for py in std::fs::read_dir(&venv_lib).into_iter().flatten().flatten() {
        let nv = py.path().join("site-packages/nvidia");
        for sub in std::fs::read_dir(&nv).into_iter().flatten().flatten() {
            dirs.push(sub.path().join("lib"));
        }
    }
    let mut out = Vec::new();
    for d in dirs {
        for f in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let n = f.file_name().to_string_lossy().into_owned();
            if n.starts_with("libnvrtc.so") {
                out.push(f.path());
            }
        }
    }
    out
}

/// A symbol's address as the function pointer type `F`.
///
/// # Safety
/// The symbol must be a function of type `F`.
unsafe fn cast<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size; the caller vouches for the type.
    unsafe { std::mem::transmute_copy(&p) }
}

fn nvrtc() -> Option<&'static Nvrtc> {
    static N: OnceLock<Result<Nvrtc, String>> = OnceLock::new();
    let n = N.get_or_init(|| {
        let cands = nvrtc_candidates();
        for p in &cands {
            let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if h.is_null() {
                continue;
            }
            let sym = |name: &str| {
                let c = CString::new(name).unwrap();
                // SAFETY: a live handle, a NUL-terminated name.
                let s = unsafe { libc::dlsym(h, c.as_ptr()) };
                assert!(!s.is_null(), "{} lacks {name}", p.display());
                s
            };
            // SAFETY: NVRTC's documented signatures.
            return Ok(unsafe {
                Nvrtc {
                    create: cast(sym("nvrtcCreateProgram")),
                    compile: cast(sym("nvrtcCompileProgram")),
                    log_size: cast(sym("nvrtcGetProgramLogSize")),
                    log: cast(sym("nvrtcGetProgramLog")),
                    cubin_size: cast(sym("nvrtcGetCUBINSize")),
                    cubin: cast(sym("nvrtcGetCUBIN")),
                    destroy: cast(sym("nvrtcDestroyProgram")),
                }
            });
        }
        Err(format!(
            "no loadable libnvrtc.so in RIVET_NVRTC_PATH or the workspace's .venv (candidates: {cands:?})"
        ))
    });
    match n {
        Ok(n) => Some(n),
        Err(why) => {
            assert!(
                std::env::var("RIVET_REQUIRE_NVRTC").as_deref() != Ok("1"),
                "RIVET_REQUIRE_NVRTC=1: {why}"
            );
            eprintln!("skipped: {why}");
            None
        }
    }
}

impl Nvrtc {
    /// A cubin of `src` for `arch` ("sm_90").
    fn cubin(&self, src: &str, arch: &str) -> Vec<u8> {
        let src_c = CString::new(src).unwrap();
        let name = CString::new("kernel.cu").unwrap();
        let opt = CString::new(format!("--gpu-architecture={arch}")).unwrap();
        let opts = [opt.as_ptr()];
        let mut p = std::ptr::null_mut();
        // SAFETY: NVRTC's API with live, NUL-terminated strings and sized buffers.
        unsafe {
            assert_eq!(
                (self.create)(
                    &mut p,
                    src_c.as_ptr(),
                    name.as_ptr(),
                    0,
                    std::ptr::null(),
                    std::ptr::null()
                ),
                0
            );
            let rc = (self.compile)(p, 1, opts.as_ptr());
            let mut n = 0usize;
            (self.log_size)(p, &mut n);
            let mut log = vec![0u8; n.max(1)];
            (self.log)(p, log.as_mut_ptr().cast());
            assert_eq!(
                rc,
                0,
                "NVRTC refused the test kernel: {}",
                String::from_utf8_lossy(&log)
            );
            (self.cubin_size)(p, &mut n);
            let mut out = vec![0u8; n];
            (self.cubin)(p, out.as_mut_ptr().cast());
            (self.destroy)(&mut p);
            out
        }
    }
}

// ---- the sources folder -------------------------------------------------------------------

static ENV: Mutex<()> = Mutex::new(());

fn sources() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kernels-run-sources")
}

/// Holds `ENV` with `RIVET_CUBIN_SOURCES` pointing at this binary's folder.
fn env() -> MutexGuard<'static, ()> {
    let g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    std::fs::create_dir_all(sources()).unwrap();
    std::env::set_var(SOURCES_VAR, sources());
    g
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Records `src` as the source of `cubin`, as rivet does.
fn record(cubin: &[u8], src: &str) {
    std::fs::create_dir_all(sources()).unwrap();
    std::fs::write(sources().join(format!("{}.cu", sha256_hex(cubin))), src).unwrap();
}

/// Compiles `src` for sm_90, records it and loads it on a 9.0 device.
fn load(src: &str) -> Option<Module> {
    let nv = nvrtc()?;
    let cubin = nv.cubin(src, "sm_90");
    record(&cubin, src);
    let _g = env();
    // SAFETY: a whole cubin.
    Some(unsafe { Module::load(cubin.as_ptr(), (9, 0)) }.unwrap_or_else(|r| panic!("{r:?}")))
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn from_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn ptr(p: *mut u8) -> Vec<u8> {
    (p as u64).to_le_bytes().to_vec()
}

// ---- kernels ------------------------------------------------------------------------------

const AXPY: &str = r#"
extern "C" __global__ void __launch_bounds__(256) axpy(float* __restrict__ y, const float* __restrict__ x, float a, long long n) {
  long long i = (long long)blockIdx.x * 256 + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"#;

#[test]
fn elementwise_kernel_runs_serially_and_right() {
    let Some(m) = load(AXPY) else { return };
    let f = m.function("axpy").unwrap();
    assert!(m.function("nope").is_none());
    assert_eq!(f.name(), "axpy");
    assert_eq!(f.params().sizes, [8, 8, 4, 8]);
    assert_eq!(f.params().is_ptr, [true, true, false, false]);
    assert_eq!(f.param_offsets(), Some(&[0usize, 8, 16, 24][..]));
    assert_eq!(f.static_shared_bytes(), 0);
    assert_eq!(f.max_threads_per_block(), Some(256));
    assert!(
        !f.runs_threaded(),
        "no barrier: a block's threads run serially"
    );
    let n = 1000usize;
    let mut y = f32s(&(0..n).map(|i| i as f32).collect::<Vec<_>>());
    let mut x = f32s(&vec![2.0; n]);
    let params = [
        ptr(y.as_mut_ptr()),
        ptr(x.as_mut_ptr()),
        3.0f32.to_le_bytes().to_vec(),
        (n as i64).to_le_bytes().to_vec(),
    ];
    // SAFETY: host buffers of n elements.
    unsafe { f.run([4, 1, 1], [256, 1, 1], 0, &params) }.unwrap();
    let y = from_f32s(&y);
    assert!(
        y.iter().enumerate().all(|(i, &v)| v == i as f32 + 6.0),
        "{y:?}"
    );
    // More threads than __launch_bounds__: refused, as a GPU refuses it.
    let e = f.check_launch([1, 1, 1], [512, 1, 1]).unwrap_err();
    assert_eq!(e.code, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    // A parameter of the wrong size is refused before the kernel runs.
    let mut bad = params.clone();
    bad[3] = 5i32.to_le_bytes().to_vec();
    // SAFETY: refused before running.
    let e = unsafe { f.run([4, 1, 1], [256, 1, 1], 0, &bad) }.unwrap_err();
    assert!(e.contains("parameter 3 has 4 bytes, its type 8"), "{e}");
}

const BLOCK_SUM: &str = r#"
extern "C" __global__ void __launch_bounds__(128) block_sum(const float* __restrict__ x, float* __restrict__ out) {
  __shared__ float s[128];
  s[threadIdx.x] = x[blockIdx.x * 128 + threadIdx.x];
  __syncthreads();
  for (int w = 64; w > 0; w /= 2) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}
"#;

#[test]
fn shared_memory_and_barriers_reduce_a_block() {
    let Some(m) = load(BLOCK_SUM) else { return };
    let f = m.function("block_sum").unwrap();
    assert!(f.runs_threaded());
    assert!(
        f.static_shared_bytes() >= 512,
        "{}",
        f.static_shared_bytes()
    );
    let mut x = f32s(&(0..384).map(|i| (i % 7) as f32).collect::<Vec<_>>());
    let mut out = f32s(&[0.0; 3]);
    // SAFETY: host buffers.
    unsafe {
        f.run(
            [3, 1, 1],
            [128, 1, 1],
            0,
            &[ptr(x.as_mut_ptr()), ptr(out.as_mut_ptr())],
        )
    }
    .unwrap();
    let want: Vec<f32> = (0..3)
        .map(|b| (0..128).map(|i| ((b * 128 + i) % 7) as f32).sum())
        .collect();
    assert_eq!(from_f32s(&out), want);
}

const WARP_SUM: &str = r#"
extern "C" __global__ void __launch_bounds__(64) warp_sum(const float* __restrict__ x, float* __restrict__ out, unsigned int mask) {
  float v = x[threadIdx.x];
  for (int d = 16; d > 0; d /= 2) v += __shfl_down_sync(mask, v, d);
  if ((threadIdx.x & 31) == 0) out[threadIdx.x / 32] = v;
}
"#;

#[test]
fn warp_shuffles_reduce_each_warp_and_check_their_mask() {
    let Some(m) = load(WARP_SUM) else { return };
    let f = m.function("warp_sum").unwrap();
    assert!(f.runs_threaded());
    let mut x = f32s(&(0..64).map(|i| i as f32).collect::<Vec<_>>());
    let mut out = f32s(&[0.0; 2]);
    let p = |mask: u32, x: &mut Vec<u8>, out: &mut Vec<u8>| {
        vec![
            ptr(x.as_mut_ptr()),
            ptr(out.as_mut_ptr()),
            mask.to_le_bytes().to_vec(),
        ]
    };
    // SAFETY: host buffers.
    unsafe { f.run([1, 1, 1], [64, 1, 1], 0, &p(u32::MAX, &mut x, &mut out)) }.unwrap();
    assert_eq!(from_f32s(&out), [496.0, 1520.0]);
    // A mask that leaves out threads of the warp: the launch fails with the reason.
    // SAFETY: host buffers.
    let e = unsafe { f.run([1, 1, 1], [64, 1, 1], 0, &p(0xffff, &mut x, &mut out)) }.unwrap_err();
    assert!(e.contains("mask 0xffff") && e.contains("0xffffffff"), "{e}");
    // A partial warp (40 threads: 32 + 8) needs a mask of exactly its 8 threads.
    // SAFETY: host buffers.
    let e = unsafe { f.run([1, 1, 1], [40, 1, 1], 0, &p(u32::MAX, &mut x, &mut out)) }.unwrap_err();
    assert!(e.contains("the warp's threads are 0xff"), "{e}");
}

const REVERSE: &str = r#"
extern "C" __global__ void __launch_bounds__(256) reverse(float* __restrict__ x) {
  extern __shared__ float buf[];
  const unsigned n = blockDim.x;
  buf[threadIdx.x] = x[blockIdx.x * n + threadIdx.x];
  __syncthreads();
  x[blockIdx.x * n + threadIdx.x] = buf[n - 1 - threadIdx.x];
}
"#;

#[test]
fn dynamic_shared_memory_is_the_launchs() {
    let Some(m) = load(REVERSE) else { return };
    let f = m.function("reverse").unwrap();
    let mut x = f32s(&(0..200).map(|i| i as f32).collect::<Vec<_>>());
    // SAFETY: a host buffer of 2 blocks of 100.
    unsafe { f.run([2, 1, 1], [100, 1, 1], 400, &[ptr(x.as_mut_ptr())]) }.unwrap();
    let want: Vec<f32> = (0..200)
        .map(|i| ((i / 100) * 100 + 99 - i % 100) as f32)
        .collect();
    assert_eq!(from_f32s(&x), want);
}

const MIXED: &str = r#"
extern "C" __global__ void __launch_bounds__(32) mixed(long long* __restrict__ out, int a, int b, long long c) {
  if (threadIdx.x == 0) out[0] = (long long)a * 1000000 + (long long)b * 1000 + c;
}
"#;

#[test]
fn int32_and_int64_parameters_take_their_declared_sizes_and_order() {
    let Some(m) = load(MIXED) else { return };
    let f = m.function("mixed").unwrap();
    assert_eq!(f.params().sizes, [8, 4, 4, 8]);
    assert_eq!(f.params().is_ptr, [true, false, false, false]);
    let mut out = 0i64.to_le_bytes().to_vec();
    let run = |a: Vec<u8>, b: Vec<u8>, c: Vec<u8>, out: &mut Vec<u8>| {
        let p = [ptr(out.as_mut_ptr()), a, b, c];
        // SAFETY: a host buffer of one int64.
        unsafe { f.run([1, 1, 1], [32, 1, 1], 0, &p) }?;
        Ok::<i64, String>(i64::from_le_bytes(out[..8].try_into().unwrap()))
    };
    let (a, b, c) = (
        7i32.to_le_bytes().to_vec(),
        5i32.to_le_bytes().to_vec(),
        3i64.to_le_bytes().to_vec(),
    );
    assert_eq!(
        run(a.clone(), b.clone(), c.clone(), &mut out),
        Ok(7_005_003)
    );
    // The two ints swapped: a different result, as on a GPU.
    assert_eq!(
        run(b.clone(), a.clone(), c.clone(), &mut out),
        Ok(5_007_003)
    );
    // An int64 where an int is declared (and the reverse): refused.
    let e = run(c.clone(), b.clone(), a.clone(), &mut out).unwrap_err();
    assert!(e.contains("parameter 1 has 8 bytes, its type 4"), "{e}");
}

const TRAPS: &str = r#"
extern "C" __global__ void __launch_bounds__(64) traps(float* __restrict__ x, int bad) {
  x[threadIdx.x] = 1.0f;
  if ((int)threadIdx.x == bad) __trap();
}
extern "C" __global__ void __launch_bounds__(64) traps_at_barrier(float* __restrict__ x, int bad) {
  if ((int)threadIdx.x == bad) __trap();
  __syncthreads();
  x[threadIdx.x] = 2.0f;
}
extern "C" __global__ void __launch_bounds__(64) returns_early(float* __restrict__ x, int n) {
  if ((int)threadIdx.x >= n) return;
  __syncthreads();
  x[threadIdx.x] = 3.0f;
}
"#;

#[test]
fn a_trap_or_a_divergent_barrier_fails_the_launch() {
    let Some(m) = load(TRAPS) else { return };
    let mut x = f32s(&[0.0; 64]);
    for (name, threaded) in [("traps", false), ("traps_at_barrier", true)] {
        let f = m.function(name).unwrap();
        assert_eq!(f.runs_threaded(), threaded, "{name}");
        let p = [ptr(x.as_mut_ptr()), 5i32.to_le_bytes().to_vec()];
        // SAFETY: a host buffer of 64.
        let e = unsafe { f.run([2, 1, 1], [64, 1, 1], 0, &p) }.unwrap_err();
        assert!(
            e.contains("__trap() in thread (5,0,0) of block (0,0,0)"),
            "{name}: {e}"
        );
        let p = [ptr(x.as_mut_ptr()), (-1i32).to_le_bytes().to_vec()];
        // SAFETY: as above.
        unsafe { f.run([2, 1, 1], [64, 1, 1], 0, &p) }.unwrap();
    }
    let f = m.function("returns_early").unwrap();
    let p = [ptr(x.as_mut_ptr()), 40i32.to_le_bytes().to_vec()];
    // SAFETY: as above.
    let e = unsafe { f.run([1, 1, 1], [64, 1, 1], 0, &p) }.unwrap_err();
    assert!(
        e.contains("40 of its 64 threads wait at __syncthreads"),
        "{e}"
    );
    assert!(e.contains("24 have returned"), "{e}");
    let p = [ptr(x.as_mut_ptr()), 64i32.to_le_bytes().to_vec()];
    // SAFETY: as above.
    unsafe { f.run([1, 1, 1], [64, 1, 1], 0, &p) }.unwrap();
    assert!(from_f32s(&x).iter().all(|&v| v == 3.0));
}

#[test]
fn two_modules_with_one_kernel_name_run_their_own_bodies() {
    let src = |k: f32| {
        format!(
            "extern \"C\" __global__ void __launch_bounds__(32) same(float* __restrict__ x) {{ x[threadIdx.x] = {k:.1}f; }}\n"
        )
    };
    let (Some(one), Some(two)) = (load(&src(1.0)), load(&src(2.0))) else {
        return;
    };
    let mut x = f32s(&[0.0; 32]);
    for (m, want) in [(&one, 1.0), (&two, 2.0), (&one, 1.0)] {
        let f = m.function("same").unwrap();
        // SAFETY: a host buffer of 32.
        unsafe { f.run([1, 1, 1], [32, 1, 1], 0, &[ptr(x.as_mut_ptr())]) }.unwrap();
        assert!(from_f32s(&x).iter().all(|&v| v == want));
    }
}

#[test]
fn the_image_length_comes_from_the_elf_headers() {
    let Some(nv) = nvrtc() else { return };
    for arch in ["sm_80", "sm_90"] {
        for src in [AXPY, BLOCK_SUM, TRAPS] {
            let cubin = nv.cubin(src, arch);
            // Trailing bytes after the image change nothing: the length is the headers'.
            let mut padded = cubin.clone();
            padded.extend([0xee; 4096]);
            // SAFETY: a whole cubin.
            assert_eq!(unsafe { cubin_len(padded.as_ptr()) }, Ok(cubin.len()));
        }
    }
    let cubin = nv.cubin(AXPY, "sm_90");
    record(&cubin, AXPY);
    let mut padded = cubin.clone();
    padded.extend([0xee; 4096]);
    let _g = env();
    // SAFETY: a whole cubin.
    let m = unsafe { Module::load(padded.as_ptr(), (9, 0)) }.unwrap();
    assert_eq!(m.function_names(), ["axpy"]);
}

// ---- refusals -----------------------------------------------------------------------------

fn refusal(image: &[u8], arch: (u32, u32)) -> Refusal {
    // SAFETY: the test images are whole (or at least 64 bytes of garbage).
    unsafe { Module::load(image.as_ptr(), arch) }.unwrap_err()
}

#[test]
fn refusals_name_what_to_do() {
    let Some(nv) = nvrtc() else { return };
    let src =
        "extern \"C\" __global__ void __launch_bounds__(32) only(float* x) { x[0] = 4.0f; }\n";
    let cubin = nv.cubin(src, "sm_90");
    let hash = sha256_hex(&cubin);
    let _ = std::fs::remove_file(sources().join(format!("{hash}.cu")));
    {
        let _g = env();
        // The source was never recorded.
        let r = refusal(&cubin, (9, 0));
        assert_eq!(r.code, CUDA_ERROR_INVALID_IMAGE, "{r:?}");
        assert!(
            r.why.contains(&hash) && r.why.contains(&sources().display().to_string()),
            "{r:?}"
        );
        // RIVET_CUBIN_SOURCES unset.
        std::env::remove_var(SOURCES_VAR);
        let r = refusal(&cubin, (9, 0));
        assert_eq!(r.code, CUDA_ERROR_INVALID_IMAGE, "{r:?}");
        assert!(r.why.contains("RIVET_CUBIN_SOURCES is not set"), "{r:?}");
    }
    let _g = env();
    // PTX text.
    let ptx = b"//\n// Generated by NVIDIA NVVM Compiler\n.version 8.0\n.target sm_90\n.address_size 64\n\0";
    let r = refusal(ptx, (9, 0));
    assert_eq!(r.code, CUDA_ERROR_NOT_SUPPORTED, "{r:?}");
    assert!(r.why.contains("cubins only"), "{r:?}");
    // Garbage, and an ELF that is not a cubin.
    let r = refusal(&[0x13u8; 128], (9, 0));
    assert_eq!(r.code, CUDA_ERROR_INVALID_IMAGE, "{r:?}");
    let mut elf = cubin.clone();
    elf[18] = 62; // EM_X86_64
    let r = refusal(&elf, (9, 0));
    assert_eq!(r.code, CUDA_ERROR_INVALID_IMAGE, "{r:?}");
    assert!(r.why.contains("machine 62"), "{r:?}");
    // An sm_80 cubin runs on 8.6 but not on 9.0; an sm_90 one not on 8.6.
    let old = nv.cubin(src, "sm_80");
    record(&old, src);
    let r = refusal(&old, (9, 0));
    assert_eq!(r.code, CUDA_ERROR_NO_BINARY_FOR_GPU, "{r:?}");
    assert!(r.why.contains("sm_80") && r.why.contains("9.0"), "{r:?}");
    // SAFETY: a whole cubin.
    let m = unsafe { Module::load(old.as_ptr(), (8, 6)) }.unwrap();
    assert_eq!(m.arch(), (8, 0));
    let r = refusal(&cubin, (8, 6));
    assert_eq!(r.code, CUDA_ERROR_NO_BINARY_FOR_GPU, "{r:?}");
    // A source that does not define the cubin's kernel.
    record(
        &cubin,
        "extern \"C\" __global__ void other(float* x) { x[0] = 4.0f; }\n",
    );
    let r = refusal(&cubin, (9, 0));
    assert_eq!(r.code, CUDA_ERROR_INVALID_IMAGE, "{r:?}");
    assert!(r.why.contains("kernel only"), "{r:?}");
    // A source whose kernel takes other parameters than the cubin's.
    record(
        &cubin,
        "extern \"C\" __global__ void only(float* x, int n) { x[0] = 4.0f; }\n",
    );
    let r = refusal(&cubin, (9, 0));
    assert_eq!(r.code, CUDA_ERROR_INVALID_IMAGE, "{r:?}");
    assert!(r.why.contains("EIATTR_KPARAM_INFO"), "{r:?}");
    // A source the host compiler refuses: its first lines in the reason.
    record(
        &cubin,
        "extern \"C\" __global__ void only(float* x) { x[0] = undeclared; }\n",
    );
    let r = refusal(&cubin, (9, 0));
    assert_eq!(r.code, CUDA_ERROR_INVALID_IMAGE, "{r:?}");
    assert!(r.why.contains("undeclared"), "{r:?}");
    let _ = std::fs::remove_file(sources().join(format!("{hash}.cu")));
}

// ---- rivet's own prelude ------------------------------------------------------------------

/// rivet's CUDA prelude (the text of `PRELUDE` in the compiler's CUDA backend), read from
/// the workspace: generated sources start with it.
fn rivet_prelude() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../compiler/src/codegen/cuda/prelude.rs");
    let text = std::fs::read_to_string(&p).unwrap();
    let start = text.find("pub const PRELUDE: &str = r#\"").unwrap() + 29;
    let end = start + text[start..].find("\"#;").unwrap();
    text[start..end].to_string()
}

#[test]
fn rivets_prelude_and_its_cross_thread_reduction_run() {
    let src = rivet_prelude()
        + r#"
extern "C" __global__ void __launch_bounds__(64) allred(
    float* __restrict__ x,
    float* __restrict__ out) {
  { // allreduce sum over threadIdx.x: 64 threads in each of 1 groups
    __shared__ float out_red[2];
    out[blockIdx.x * 64 + threadIdx.x] = rivet_allreduce_x<float>(x[blockIdx.x * 64 + threadIdx.x], [](float rivet_a, float rivet_b) -> float { return rivet_a + rivet_b; }, out_red, 64, 1, 64);
  }
}
extern "C" __global__ void __launch_bounds__(64) grouped(
    long long* __restrict__ x,
    long long* __restrict__ out) {
  const int t = threadIdx.x + 32 * threadIdx.y;
  out[t] = rivet_allreduce_x<long long>(x[t], [](long long rivet_a, long long rivet_b) -> long long { return rivet_max(rivet_a, rivet_b); }, (long long*)0, 32, 2, 64);
}
extern "C" __global__ void __launch_bounds__(64) relu(float* __restrict__ x, long long n) {
  const long long i = (long long)blockIdx.x * 64 + threadIdx.x;
  if (i < n) x[i] = rivet_fmaxf(x[i], 0.0f);
}
extern "C" __global__ void __launch_bounds__(64) count(int* __restrict__ c, float* __restrict__ s) {
  atomicAdd(c, 1);
  atomicAdd(s, 0.5f);
}
"#;
    let Some(m) = load(&src) else { return };
    let (allred, grouped, relu, count) = (
        m.function("allred").unwrap(),
        m.function("grouped").unwrap(),
        m.function("relu").unwrap(),
        m.function("count").unwrap(),
    );
    assert!(allred.runs_threaded() && grouped.runs_threaded());
    assert!(!relu.runs_threaded() && !count.runs_threaded());
    // 2 blocks of 64 threads, each summing its block.
    let mut x = f32s(&(0..128).map(|i| i as f32).collect::<Vec<_>>());
    let mut out = f32s(&[0.0; 128]);
    // SAFETY: host buffers of 128.
    unsafe {
        allred.run(
            [2, 1, 1],
            [64, 1, 1],
            0,
            &[ptr(x.as_mut_ptr()), ptr(out.as_mut_ptr())],
        )
    }
    .unwrap();
    let out = from_f32s(&out);
    assert!(out[..64].iter().all(|&v| v == 2016.0), "{out:?}");
    assert!(out[64..].iter().all(|&v| v == 6112.0), "{out:?}");
    // Two groups of 32 (threadIdx.y), each its maximum.
    let mut x: Vec<u8> = (0..64i64)
        .flat_map(|i| ((i * 37) % 64 - 20).to_le_bytes())
        .collect();
    let mut out = vec![0u8; 64 * 8];
    // SAFETY: host buffers of 64.
    unsafe {
        grouped.run(
            [1, 1, 1],
            [32, 2, 1],
            0,
            &[ptr(x.as_mut_ptr()), ptr(out.as_mut_ptr())],
        )
    }
    .unwrap();
    let x: Vec<i64> = x
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let out: Vec<i64> = out
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for g in 0..2 {
        let want = *x[g * 32..g * 32 + 32].iter().max().unwrap();
        assert!(
            out[g * 32..g * 32 + 32].iter().all(|&v| v == want),
            "{out:?}"
        );
    }
    let mut x = f32s(&[-1.0, 2.0, -0.0, f32::NAN, 5.0]);
    // SAFETY: a host buffer of 5.
    unsafe {
        relu.run(
            [1, 1, 1],
            [64, 1, 1],
            0,
            &[ptr(x.as_mut_ptr()), 5i64.to_le_bytes().to_vec()],
        )
    }
    .unwrap();
    let x = from_f32s(&x);
    assert_eq!(&x[..3], [0.0, 2.0, 0.0]);
    assert!(x[3].is_nan() && x[4] == 5.0);
    let (mut c, mut s) = (0i32.to_le_bytes().to_vec(), f32s(&[0.0]));
    // SAFETY: host buffers of one element.
    unsafe {
        count.run(
            [3, 1, 1],
            [64, 1, 1],
            0,
            &[ptr(c.as_mut_ptr()), ptr(s.as_mut_ptr())],
        )
    }
    .unwrap();
    assert_eq!(i32::from_le_bytes(c[..4].try_into().unwrap()), 192);
    assert_eq!(from_f32s(&s), [96.0]);
}

const INDICES: &str = r#"
extern "C" __global__ void __launch_bounds__(32) indices(int* __restrict__ out) {
  const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  out[b * 32 + t] = (int)(threadIdx.x | threadIdx.y << 4 | threadIdx.z << 8 | blockIdx.x << 12 | blockIdx.y << 16 | blockIdx.z << 20);
}
extern "C" __global__ void __launch_bounds__(1) nothing() {}
"#;

#[test]
fn three_dimensional_indices_and_a_kernel_without_parameters() {
    let Some(m) = load(INDICES) else { return };
    let f = m.function("indices").unwrap();
    let mut out = vec![0u8; 4 * 32 * 6];
    // SAFETY: a host buffer of 6 blocks of 32.
    unsafe { f.run([3, 2, 1], [4, 2, 4], 0, &[ptr(out.as_mut_ptr())]) }.unwrap();
    let out: Vec<i32> = out
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for (k, &v) in out.iter().enumerate() {
        let (b, t) = (k / 32, k % 32);
        let (tx, ty, tz) = (t % 4, t / 4 % 2, t / 8);
        let (bx, by) = (b % 3, b / 3);
        assert_eq!(
            v as usize,
            tx | ty << 4 | tz << 8 | bx << 12 | by << 16,
            "element {k}"
        );
    }
    let f = m.function("nothing").unwrap();
    assert_eq!(f.params().sizes, Vec::<usize>::new());
    // SAFETY: no parameters.
    unsafe { f.run([2, 1, 1], [1, 1, 1], 0, &[]) }.unwrap();
}
