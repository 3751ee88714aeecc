//! NVRTC, loaded by full path: finding the library, compiling CUDA C to PTX and cubin.
//!
//! Why not cudarc's NVRTC module: cudarc takes library *names* only and tries the unversioned
//! `libnvrtc.so` first, so a system NVRTC in the loader cache wins over the one next to torch,
//! and a library preloaded by path does not satisfy that first lookup (its soname is
//! `libnvrtc.so.13`); and cudarc panics when no name loads. A compiler needs nine NVRTC
//! functions, so rivet loads the library it chose with `libloading` and calls them itself;
//! cudarc is used for the driver (`driver.rs`). Nothing here can panic on a missing library:
//! absence is an `Err` saying where rivet looked.
//!
//! Where NVRTC is looked for, first found wins:
//! 1. `RIVET_NVRTC_PATH`: a library file, or a folder holding `libnvrtc.so.13` / `.so.12` /
//!    `.so`. When set, nothing else is tried (an explicit choice that fails is an error).
//! 2. The NVIDIA pip wheels next to a Python install: `site-packages/nvidia/cu13/lib`,
//!    `nvidia/cuda_nvrtc/lib`, `nvidia/cu12/lib`, in the site-packages folders of
//!    `$VIRTUAL_ENV`, `$CONDA_PREFIX`, the prefix of the running executable, and the one
//!    holding the shared object rivet itself is loaded from (the Python extension).
//! 3. `$CUDA_PATH/lib64`, `$CUDA_PATH/targets/x86_64-linux/lib`.
//! 4. The loader's search by name: `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so`.
//!
//! Loaded libraries stay loaded for the life of the process (one per path).

use crate::target::CudaArch;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

type Program = *mut c_void;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type GetFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// A loaded NVRTC.
pub struct Nvrtc {
    /// Keeps the functions below valid.
    _lib: libloading::Library,
    /// What was loaded (a path, or a name the loader resolved).
    pub path: PathBuf,
    /// `nvrtcVersion()`.
    pub version: (i32, i32),
    create: CreateFn,
    compile: CompileFn,
    destroy: DestroyFn,
    log_size: SizeFn,
    log: GetFn,
    ptx_size: SizeFn,
    ptx: GetFn,
    cubin_size: SizeFn,
    cubin: GetFn,
    error_string: ErrorStringFn,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NVRTC {}.{} ({})",
            self.version.0,
            self.version.1,
            self.path.display()
        )
    }
}

/// What one compilation produced.
#[derive(Debug, Clone)]
pub enum Output {
    Ptx(String),
    Cubin(Vec<u8>),
}

/// A finished compilation: its output and NVRTC's log (empty when there were no warnings).
#[derive(Debug, Clone)]
pub struct Compiled {
    pub output: Output,
    pub log: String,
}

const LIB_NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Where to look, in order (see the module documentation). `env` reads environment
/// variables (tests pass their own). `Err` when `RIVET_NVRTC_PATH` names nothing usable.
pub fn candidates(env: &dyn Fn(&str) -> Option<OsString>) -> Result<Vec<PathBuf>, String> {
    if let Some(p) = env("RIVET_NVRTC_PATH").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(vec![p]);
        }
        if p.is_dir() {
            let found: Vec<PathBuf> = LIB_NAMES
                .iter()
                .map(|n| p.join(n))
                .filter(|f| f.is_file())
                .collect();
            if found.is_empty() {
                return Err(format!(
                    "RIVET_NVRTC_PATH={} is a folder holding none of {}",
                    p.display(),
                    LIB_NAMES.join(", ")
                ));
            }
            return Ok(found);
        }
        return Err(format!(
            "RIVET_NVRTC_PATH={} does not exist (set it to libnvrtc.so.13 or its folder, or unset it to search)",
            p.display()
        ));
    }
    let mut out = Vec::new();
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = env(var).filter(|p| !p.is_empty()) {
            prefixes.push(PathBuf::from(p));
        }
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(prefix) = exe.parent().and_then(Path::parent) {
            prefixes.push(prefix.to_path_buf());
        }
    }
    let mut site_dirs: Vec<PathBuf> = Vec::new();
    for prefix in &prefixes {
        for lib in ["lib", "lib64"] {
            if let Ok(rd) = std::fs::read_dir(prefix.join(lib)) {
                let mut names: Vec<PathBuf> = rd
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
                    .map(|e| e.path().join("site-packages"))
                    .collect();
                names.sort();
                site_dirs.extend(names);
            }
        }
    }
    if let Some(own) = own_site_packages() {
        site_dirs.push(own);
    }
    for site in site_dirs {
        for sub in [
            "nvidia/cu13/lib",
            "nvidia/cuda_nvrtc/lib",
            "nvidia/cu12/lib",
        ] {
            for n in LIB_NAMES {
                let f = site.join(sub).join(n);
                if f.is_file() && !out.contains(&f) {
                    out.push(f);
                }
            }
        }
    }
    if let Some(cuda) = env("CUDA_PATH").filter(|p| !p.is_empty()) {
        let cuda = PathBuf::from(cuda);
        for sub in ["lib64", "targets/x86_64-linux/lib", "lib"] {
            for n in LIB_NAMES {
                let f = cuda.join(sub).join(n);
                if f.is_file() && !out.contains(&f) {
                    out.push(f);
                }
            }
        }
    }
    out.extend(LIB_NAMES.iter().map(PathBuf::from));
    Ok(out)
}

/// The file of the loaded object holding `addr` (`dladdr`).
fn object_path(addr: *const c_void) -> Option<PathBuf> {
    #[cfg(unix)]
    {
        // SAFETY: an all-zero Dl_info is a valid value (null pointers).
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the address and fills `info`; `dli_fname` is a C string
        // owned by the loader, valid while the object stays loaded (we copy it at once).
        let ok = unsafe { libc::dladdr(addr, &mut info) };
        if ok == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated (dladdr's contract).
        let name = unsafe { CStr::from_ptr(info.dli_fname) };
        let path = PathBuf::from(name.to_string_lossy().into_owned());
        path.is_absolute().then_some(path)
    }
    #[cfg(not(unix))]
    {
        let _ = addr;
        None
    }
}

/// The `site-packages` folder holding the shared object this code is loaded from (the
/// Python extension), if any.
fn own_site_packages() -> Option<PathBuf> {
    let path = object_path(own_site_packages as *const c_void)?;
    path.ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "site-packages"))
        .map(Path::to_path_buf)
}

fn cache() -> &'static Mutex<HashMap<PathBuf, Arc<Nvrtc>>> {
    static C: OnceLock<Mutex<HashMap<PathBuf, Arc<Nvrtc>>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

/// NVRTC as found from the process environment.
pub fn find() -> Result<Arc<Nvrtc>, String> {
    find_with(&|k| std::env::var_os(k))
}

/// NVRTC as found with `env` (see `candidates`); the error says everything that was tried.
pub fn find_with(env: &dyn Fn(&str) -> Option<OsString>) -> Result<Arc<Nvrtc>, String> {
    let cands = candidates(env).map_err(|e| format!("NVRTC not found: {e}"))?;
    let mut tried = Vec::new();
    for c in &cands {
        match load(c) {
            Ok(n) => return Ok(n),
            Err(e) => tried.push(format!("{}: {e}", c.display())),
        }
    }
    Err(format!(
        "NVRTC (libnvrtc, the CUDA runtime compiler) could not be loaded; tried: {}. Install the `nvidia-cuda-nvrtc` wheel (torch's CUDA wheels bring it) or set RIVET_NVRTC_PATH to libnvrtc.so.13",
        tried.join("; ")
    ))
}

/// Loads NVRTC from `path` (a file path, or a bare name for the loader's search).
pub fn load(path: &Path) -> Result<Arc<Nvrtc>, String> {
    let mut c = cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = c.get(path) {
        return Ok(n.clone());
    }
    // SAFETY: loading runs the library's initialisers; NVRTC's are benign.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
    macro_rules! sym {
        ($t:ty, $name:literal) => {{
            // SAFETY: the symbol has this C signature in every NVRTC since 11.1.
            let s: libloading::Symbol<$t> = unsafe { lib.get($name) }
                .map_err(|e| format!("symbol {}: {e}", String::from_utf8_lossy($name)))?;
            *s
        }};
    }
    let version_fn = sym!(VersionFn, b"nvrtcVersion");
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    let r = unsafe { version_fn(&mut major, &mut minor) };
    if r != 0 {
        return Err(format!("nvrtcVersion failed with code {r}"));
    }
    // The file the loader resolved (a bare name gives the path of what it found).
    let real = object_path(version_fn as *const c_void).unwrap_or_else(|| path.to_path_buf());
    let n = Arc::new(Nvrtc {
        path: real,
        version: (major, minor),
        create: sym!(CreateFn, b"nvrtcCreateProgram"),
        compile: sym!(CompileFn, b"nvrtcCompileProgram"),
        destroy: sym!(DestroyFn, b"nvrtcDestroyProgram"),
        log_size: sym!(SizeFn, b"nvrtcGetProgramLogSize"),
        log: sym!(GetFn, b"nvrtcGetProgramLog"),
        ptx_size: sym!(SizeFn, b"nvrtcGetPTXSize"),
        ptx: sym!(GetFn, b"nvrtcGetPTX"),
        cubin_size: sym!(SizeFn, b"nvrtcGetCUBINSize"),
        cubin: sym!(GetFn, b"nvrtcGetCUBIN"),
        error_string: sym!(ErrorStringFn, b"nvrtcGetErrorString"),
        _lib: lib,
    });
    c.insert(path.to_path_buf(), n.clone());
    Ok(n)
}

/// What to compile to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// PTX for `compute_XY` (the driver JIT-compiles it; refused by older drivers).
    Ptx,
    /// A cubin for exactly `sm_XY`.
    Cubin,
}

/// NVRTC's options for `arch`: no optimisation flag (NVRTC optimises by default and rejects
/// `-O3`); `--fmad=false` unless `fmad`, so `a * b + c` rounds twice as in the interpreter.
pub fn options(arch: CudaArch, kind: Kind, fmad: bool) -> Vec<String> {
    let a = match kind {
        Kind::Ptx => format!("compute_{}{}", arch.major, arch.minor),
        Kind::Cubin => format!("sm_{}{}", arch.major, arch.minor),
    };
    vec![
        format!("--gpu-architecture={a}"),
        "-std=c++17".into(),
        format!("--fmad={fmad}"),
    ]
}

impl Nvrtc {
    fn error_name(&self, code: c_int) -> String {
        // SAFETY: nvrtcGetErrorString returns a static string for any code.
        let p = unsafe { (self.error_string)(code) };
        if p.is_null() {
            return format!("NVRTC error {code}");
        }
        // SAFETY: static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Compiles `source` (named `name` in messages). `Err((message, log))` on failure.
    pub fn compile(
        &self,
        source: &str,
        name: &str,
        options: &[String],
        kind: Kind,
    ) -> Result<Compiled, (String, String)> {
        let fail = |m: String| (m, String::new());
        let src = CString::new(source).map_err(|_| fail("source holds a NUL byte".into()))?;
        let cname = CString::new(name).map_err(|_| fail("name holds a NUL byte".into()))?;
        let opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| fail("an option holds a NUL byte".into()))?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid C strings; no headers.
        let r = unsafe {
            (self.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(fail(format!("nvrtcCreateProgram: {}", self.error_name(r))));
        }
        struct Guard<'a>(&'a Nvrtc, Program);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                // SAFETY: a program created above, destroyed once.
                unsafe { (self.0.destroy)(&mut self.1) };
            }
        }
        let g = Guard(self, prog);
        // SAFETY: a live program and `opt_ptrs.len()` valid C strings.
        let r = unsafe { (self.compile)(g.1, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        let log = self.read(g.1, self.log_size, self.log).unwrap_or_default();
        let log = String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .trim()
            .to_string();
        if r != 0 {
            return Err((self.error_name(r), log));
        }
        let output = match kind {
            Kind::Ptx => {
                let b = self
                    .read(g.1, self.ptx_size, self.ptx)
                    .map_err(|e| (e, log.clone()))?;
                Output::Ptx(
                    String::from_utf8_lossy(&b)
                        .trim_end_matches('\0')
                        .to_string(),
                )
            }
            Kind::Cubin => Output::Cubin(
                self.read(g.1, self.cubin_size, self.cubin)
                    .map_err(|e| (e, log.clone()))?,
            ),
        };
        Ok(Compiled { output, log })
    }

    fn read(&self, prog: Program, size: SizeFn, get: GetFn) -> Result<Vec<u8>, String> {
        let mut n = 0usize;
        // SAFETY: a live program and a valid out-pointer.
        let r = unsafe { size(prog, &mut n) };
        if r != 0 {
            return Err(self.error_name(r));
        }
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: `buf` holds the `n` bytes NVRTC reported.
        let r = unsafe { get(prog, buf.as_mut_ptr().cast()) };
        if r != 0 {
            return Err(self.error_name(r));
        }
        buf.truncate(n);
        Ok(buf)
    }
}

/// The source lines an NVRTC log points at (`name(LINE): error ...`), quoted for messages.
pub fn quote_lines(log: &str, name: &str, source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = String::new();
    let mut seen = Vec::new();
    let pat = format!("{name}(");
    for l in log.lines() {
        let Some(rest) = l.find(&pat).map(|i| &l[i + pat.len()..]) else {
            continue;
        };
        let Some(n) = rest.split(')').next().and_then(|d| d.parse::<usize>().ok()) else {
            continue;
        };
        if seen.contains(&n) || seen.len() >= 5 {
            continue;
        }
        seen.push(n);
        if let Some(text) = lines.get(n.wrapping_sub(1)) {
            out.push_str(&format!("\n  line {n}: {}", text.trim()));
        }
    }
    out
}
