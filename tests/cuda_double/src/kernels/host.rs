//! Compiling a kernel source for the host, caching the result, and loading it.
//!
//! Invariants:
//! - the shared object of a program lives at
//!   `$RIVET_CUBIN_SOURCES/.double-build/<sha256 of everything that decides it>.so` (the C++
//!   text compiled, the compiler's command line and its `--version`), so a cached one is
//!   reused only when it would be compiled the same again;
//! - it is written atomically (compiled to a temporary name in the same folder, then renamed):
//!   several processes may compile the same program at once, and a reader never sees half a
//!   file;
//! - each shared object is `dlopen`ed once per process and never closed (functions of it may
//!   be held by the driver state for as long as the process runs).

use crate::error::{Refusal, CUDA_ERROR_INVALID_IMAGE};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

/// The host compiler and its flags: C++17 for the emulation's templates, no FMA contraction
/// (a GPU rounds what rivet's code rounds: the prelude asks for FMAs explicitly), `-w` since
/// generated code is not written for a host compiler's warnings, and `-Bsymbolic` so a
/// module's references to its kernels bind to its own definitions even if the process
/// already exports a function of the same name.
const CXX: &str = "c++";
const FLAGS: &[&str] = &[
    "-std=c++17",
    "-O1",
    "-shared",
    "-fPIC",
    "-pthread",
    "-ffp-contract=off",
    "-w",
    "-Wl,-Bsymbolic",
];

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// `c++ --version`'s output: part of the cache key (another compiler, another object).
fn compiler_identity() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| match Command::new(CXX).arg("--version").output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => format!("no {CXX}: {e}"),
    })
}

/// The `#[repr(C)]` twin of `rivet_launch_args` in `emulation.h`.
#[repr(C)]
pub struct LaunchArgs {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared: u64,
    pub params: *mut *mut c_void,
    pub why: *mut c_char,
    pub why_cap: u64,
}

pub type RunFn = unsafe extern "C" fn(*const LaunchArgs) -> c_int;
pub type ParamsFn = unsafe extern "C" fn(*mut u64, *mut u8, c_int) -> c_int;

/// A loaded shared object (never unloaded).
#[derive(Debug)]
pub struct Library {
    handle: usize,
    pub path: PathBuf,
}

impl Library {
    /// The address of `name` in it.
    pub fn symbol(&self, name: &str) -> Result<*mut c_void, Refusal> {
        let c = CString::new(name).expect("symbol names have no NUL");
        // SAFETY: a handle dlopen returned and never closed; a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.handle as *mut c_void, c.as_ptr()) };
        if p.is_null() {
            return Err(Refusal::new(
                CUDA_ERROR_INVALID_IMAGE,
                format!("{} has no symbol {name}", self.path.display()),
            ));
        }
        Ok(p)
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { std::ffi::CStr::from_ptr(e) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The folder compiled objects are cached in.
pub fn build_dir(sources: &Path) -> PathBuf {
    sources.join(".double-build")
}

/// Compiles `program` (C++ text) unless its object is cached, and loads it once per process.
/// `what` names the program in errors (the cubin's source file).
pub fn load(program: &str, sources: &Path, what: &str) -> Result<Arc<Library>, Refusal> {
    static LOADED: OnceLock<Mutex<HashMap<String, Arc<Library>>>> = OnceLock::new();
    let mut key = Sha256::new();
    key.update(program.as_bytes());
    key.update([0]);
    key.update(CXX.as_bytes());
    for f in FLAGS {
        key.update([0]);
        key.update(f.as_bytes());
    }
    key.update([0]);
    key.update(compiler_identity().as_bytes());
    let key = hex(&key.finalize());
    let loaded = LOADED.get_or_init(Default::default);
    if let Some(l) = loaded.lock().unwrap().get(&key) {
        return Ok(l.clone());
    }
    let dir = build_dir(sources);
    let so = dir.join(format!("{key}.so"));
    if !so.is_file() {
        compile(program, &dir, &so, &key, what)?;
    }
    let c = CString::new(so.as_os_str().as_encoded_bytes()).map_err(|_| {
        Refusal::new(
            CUDA_ERROR_INVALID_IMAGE,
            format!("a NUL in the path {}", so.display()),
        )
    })?;
    // Holding the lock across dlopen makes "once per process" exact (dlopen would return the
    // same handle anyway; this keeps the map consistent).
    let mut map = loaded.lock().unwrap();
    if let Some(l) = map.get(&key) {
        return Ok(l.clone());
    }
    // SAFETY: a NUL-terminated path; the object's constructors are the C++ runtime's only.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(Refusal::new(
            CUDA_ERROR_INVALID_IMAGE,
            format!(
                "cannot load {} (compiled from {what}): {}",
                so.display(),
                dlerror()
            ),
        ));
    }
    let lib = Arc::new(Library {
        handle: handle as usize,
        path: so,
    });
    map.insert(key, lib.clone());
    Ok(lib)
}

fn compile(program: &str, dir: &Path, so: &Path, key: &str, what: &str) -> Result<(), Refusal> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stem = dir.join(format!(".tmp-{key}-{}-{seq}", std::process::id()));
    let cpp = stem.with_extension("cpp");
    let tmp_so = stem.with_extension("so");
    let io = |e: std::io::Error, p: &Path| {
        Refusal::new(
            CUDA_ERROR_INVALID_IMAGE,
            format!("cannot write {}: {e}", p.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(|e| io(e, dir))?;
    std::fs::write(&cpp, program).map_err(|e| io(e, &cpp))?;
    let out = Command::new(CXX)
        .args(FLAGS)
        .arg("-o")
        .arg(&tmp_so)
        .arg(&cpp)
        .output();
    let cleanup = || {
        let _ = std::fs::remove_file(&cpp);
        let _ = std::fs::remove_file(&tmp_so);
    };
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            cleanup();
            return Err(Refusal::new(
                CUDA_ERROR_INVALID_IMAGE,
                format!("cannot run the host C++ compiler `{CXX}` to compile {what}: {e}"),
            ));
        }
    };
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let first: Vec<&str> = stderr.lines().take(20).collect();
        // Keep the failed program: the error's line numbers refer to it.
        let kept = dir.join(format!("failed-{key}.cpp"));
        let _ = std::fs::rename(&cpp, &kept);
        cleanup();
        return Err(Refusal::new(
            CUDA_ERROR_INVALID_IMAGE,
            format!(
                "the host C++ compiler refused {what} under the CUDA emulation ({}, {}):\n{}",
                out.status,
                kept.display(),
                first.join("\n")
            ),
        ));
    }
    let r = std::fs::rename(&tmp_so, so).map_err(|e| io(e, so));
    cleanup();
    r
}
