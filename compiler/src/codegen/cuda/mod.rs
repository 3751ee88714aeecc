//! The CUDA backend: CUDA C generated from the loop IR (`source/`, helpers in
//! `prelude.rs`), compiled at run time by NVRTC (`nvrtc.rs`, loaded by full path) to PTX and
//! to a cubin, launched through the driver (`driver.rs`, cudarc; untested on a GPU so far).
//!
//! `compile` always generates the source. Where NVRTC can be loaded it also compiles the
//! source once, for the architecture that will run it ([`build_plan`]): `Target::arch` when
//! the target names one, else, with a CUDA driver and a device present, the device's own
//! (the device of the caller's current context, else device 0); the launch uses that cubin
//! and compiles again only for a device of another architecture (through the disk cache).
//! PTX (`compute_XY`) is compiled only when asked for (`source_of("ptx")`, `RIVET_DUMP`), and
//! then once. Without a driver (build machines, the tests) a build compiles PTX and a cubin
//! for `Target::arch`, or sm_80 when the target names none, so every build is checked by
//! NVRTC. A compile error is a
//! `CompileError` quoting NVRTC's log and the offending source lines. NVRTC missing is not an
//! error at build time (the source is still useful: `get_source("cuda")`) unless
//! `RIVET_NVRTC_PATH` names something unusable (an explicit choice) or
//! `RIVET_REQUIRE_NVRTC=1` (CI); launching then says what is missing. No panic escapes:
//! libraries are probed before use and every cudarc call runs under `catch_unwind`.
//!
//! Every NVRTC call goes through the disk cache (`cache.rs`, `RIVET_CACHE_DIR`): an entry
//! checked against its full key and checksum is used instead of compiling; anything else is
//! compiled again and overwritten; a cache that cannot be used never fails a build.
//!
//! Not yet: checked mode, host code beyond a sequence of launches and global temporaries (CPU parallel
//! loops, host loops, host conditions), vectorized loads.
//!
//! Index widths (`idx32`): each kernel has a 32-bit entry point where the analysis can show
//! its indices fit int32, a 64-bit one where they may not, and where both exist the host plan
//! picks one per call from the call's dims and strides (`KernelInfo::entry`).

pub mod cache;
#[cfg(test)]
mod cache_tests;
pub mod driver;
pub mod idx32;
#[cfg(test)]
mod idx32_tests;
pub mod ipc;
pub mod nvrtc;
pub mod prelude;
pub mod source;
#[cfg(test)]
mod tests;

use crate::codegen::{int_slots, Backend, CallFrame, Kernel, LaunchContext};
use crate::error::{Error, Result};
use crate::ir::stmt::{PrimFunc, Stmt};
use crate::target::{CudaArch, Target};
use nvrtc::Kind;
use rivet_runtime::{DType, Device, Tensor};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub use source::KernelInfo;

/// The architecture compiled for at build time when the target names none: Ampere, the
/// oldest rivet supports (a cubin for sm_80 does not run on sm_90: the launch recompiles for
/// the device's own architecture).
pub const DEFAULT_ARCH: CudaArch = CudaArch::MIN;

/// The CUDA backend (target "cuda").
#[derive(Debug, Clone)]
pub struct CudaBackend {
    target: Target,
    checked: bool,
    /// Let NVRTC contract `a * b + c` into FMAs (faster, not bit-exact with the interpreter).
    pub fmad: bool,
    /// Use this NVRTC (file or folder) instead of the search (`nvrtc::candidates`).
    pub nvrtc_path: Option<PathBuf>,
    /// Absence of NVRTC is a `CompileError` (default: `RIVET_REQUIRE_NVRTC=1`).
    pub require_nvrtc: bool,
    /// The disk cache of NVRTC outputs (default: `RIVET_CACHE_DIR` / the user's cache
    /// folder; `None`: off). Kept by the kernel for the compilations of a launch.
    pub cache: Option<cache::DiskCache>,
    /// The architecture of the device the build will run on, `None` without a driver or a
    /// device (default: `driver::build_device_arch`; tests stub it).
    pub probe_device: fn() -> Option<CudaArch>,
}

impl CudaBackend {
    pub fn new(target: Target, checked: bool) -> CudaBackend {
        CudaBackend {
            target,
            checked,
            fmad: false,
            nvrtc_path: None,
            require_nvrtc: std::env::var("RIVET_REQUIRE_NVRTC").is_ok_and(|v| v == "1"),
            cache: cache::DiskCache::from_env(),
            probe_device: driver::build_device_arch,
        }
    }

    /// The architecture NVRTC compiles for at build time, and whether PTX is compiled then
    /// too ([`build_plan`], asking the driver for the device's architecture).
    pub fn plan(&self) -> (CudaArch, bool) {
        build_plan(self.target.arch, self.probe_device)
    }

    /// NVRTC as this backend finds it (`Ok(None)`: not found, and not required).
    pub fn nvrtc(&self) -> Result<Option<Arc<nvrtc::Nvrtc>>> {
        let found = match &self.nvrtc_path {
            Some(p) => {
                let p: OsString = p.clone().into_os_string();
                nvrtc::find_with(&|k| {
                    if k == "RIVET_NVRTC_PATH" {
                        Some(p.clone())
                    } else {
                        std::env::var_os(k)
                    }
                })
            }
            None => nvrtc::find(),
        };
        let explicit = self.nvrtc_path.is_some()
            || std::env::var_os("RIVET_NVRTC_PATH").is_some_and(|p| !p.is_empty());
        match found {
            Ok(n) => Ok(Some(n)),
            Err(e) if explicit || self.require_nvrtc => Err(Error::Compile(format!(
                "target 'cuda': {e}{}",
                if self.require_nvrtc {
                    " (RIVET_REQUIRE_NVRTC=1)"
                } else {
                    ""
                }
            ))),
            Err(_) => Ok(None),
        }
    }

    /// Compiles to the concrete kernel type (for tests and tools that want the PTX).
    pub fn compile_cuda(&self, func: &PrimFunc) -> Result<CudaKernel> {
        if self.checked {
            return Err(Error::Compile(format!(
                "target 'cuda': function '{}': checked mode (RIVET_CHECKED=1) is not supported by the CUDA backend yet; build for 'interp' or 'cpu' to check accesses",
                func.name
            )));
        }
        crate::ir::verify::verify(func, true)?;
        let (arch, eager_ptx) = self.plan();
        let note = match self.target.arch {
            Some(a) => format!("target {a}"),
            None => format!("no arch given: built for {arch}, rebuilt at launch for the device"),
        };
        let gen = source::generate(func, &note)?;
        let limit = self.target.limits.max_shared_bytes as u64;
        if let Some(k) = gen.kernels.iter().find(|k| k.shared_bytes > limit) {
            return Err(Error::Compile(format!(
                "target 'cuda': function '{}': kernel {} uses {} bytes of shared memory per block, over the limit of {limit} bytes (static shared memory); use smaller tiles",
                func.name, k.name, k.shared_bytes
            )));
        }
        crate::lower::dump(&func.name, 6, "cu", || gen.source.clone());
        let nv = self.nvrtc()?;
        let file = format!("{}.cu", source::sanitize(&func.name));
        let (mut cubin, mut log) = (None, String::new());
        let ptx = OnceLock::new();
        if let Some(n) = &nv {
            let cache = self.cache.as_ref();
            if eager_ptx {
                let p =
                    compile_cached_with(cache, n, &gen.source, &file, arch, Kind::Ptx, self.fmad)?;
                push_log(&mut log, &p.log);
                if let nvrtc::Output::Ptx(text) = p.output {
                    let _ = ptx.set(Some(text));
                }
            }
            let c =
                compile_cached_with(cache, n, &gen.source, &file, arch, Kind::Cubin, self.fmad)?;
            push_log(&mut log, &c.log);
            if let nvrtc::Output::Cubin(bytes) = c.output {
                cubin = Some((arch, bytes));
            }
        }
        let kernel = CudaKernel {
            func: func.clone(),
            source: gen.source,
            arch,
            ptx,
            cubin,
            log,
            nvrtc: nv,
            fmad: self.fmad,
            cache: self.cache.clone(),
            slots: int_slots(func),
            entry_pos: entry_positions(&gen.kernels),
            info: gen.kernels,
            devices: driver::Devices::default(),
        };
        // Only when RIVET_DUMP is set (the closure runs then): the PTX is compiled for it.
        crate::lower::dump(&func.name, 6, "ptx", || {
            kernel.ptx().map(str::to_string).unwrap_or_default()
        });
        Ok(kernel)
    }
}

fn push_log(log: &mut String, l: &str) {
    if !l.is_empty() && !log.contains(l) {
        log.push_str(l);
        log.push('\n');
    }
}

/// What a build compiles: the cubin's architecture, and whether PTX is compiled at build time
/// (else only when asked for). `device` gives the architecture of the device a build will
/// run on, `None` without a driver or a device. With a device, one cubin for the arch that
/// runs it (the target's when it names one); without, today's build-machine behaviour: PTX
/// and a cubin for the target's arch or `DEFAULT_ARCH`, so NVRTC checks every build.
pub fn build_plan(
    target: Option<CudaArch>,
    device: impl FnOnce() -> Option<CudaArch>,
) -> (CudaArch, bool) {
    match device() {
        Some(d) => (target.unwrap_or(d), false),
        None => (target.unwrap_or(DEFAULT_ARCH), true),
    }
}

/// Compiles `source` with `nv` through the disk cache the environment names
/// (`RIVET_CACHE_DIR`); a failure is a `CompileError` quoting the log and the lines.
pub fn compile_with(
    nv: &nvrtc::Nvrtc,
    source: &str,
    file: &str,
    arch: CudaArch,
    kind: Kind,
    fmad: bool,
) -> Result<nvrtc::Compiled> {
    let cache = cache::DiskCache::from_env();
    compile_cached_with(cache.as_ref(), nv, source, file, arch, kind, fmad)
}

/// `compile_with` through `cache` (`None`: NVRTC every time). The key holds everything that
/// decides NVRTC's output: the source, file name, architecture, kind, options and NVRTC's
/// version (`cache::Key`).
pub fn compile_cached_with(
    cache: Option<&cache::DiskCache>,
    nv: &nvrtc::Nvrtc,
    source: &str,
    file: &str,
    arch: CudaArch,
    kind: Kind,
    fmad: bool,
) -> Result<nvrtc::Compiled> {
    let opts = nvrtc::options(arch, kind, fmad);
    let key = cache::Key::new(source, file, arch, kind, &opts, nv.version);
    cache::compile_cached(cache, &key, || {
        nvrtc_compile(nv, source, file, arch, kind, &opts)
    })
}

/// One NVRTC call; a failure is a `CompileError` quoting the log and the offending lines.
fn nvrtc_compile(
    nv: &nvrtc::Nvrtc,
    source: &str,
    file: &str,
    arch: CudaArch,
    kind: Kind,
    opts: &[String],
) -> Result<nvrtc::Compiled> {
    nv.compile(source, file, opts, kind).map_err(|(msg, log)| {
        let dump = std::env::var("RIVET_DUMP")
            .map(|d| format!(" (source written under RIVET_DUMP={d})"))
            .unwrap_or_default();
        Error::Compile(format!(
            "target 'cuda': NVRTC {}.{} failed to compile {file} for {arch} ({msg}){dump}:\n{log}{}",
            nv.version.0,
            nv.version.1,
            nvrtc::quote_lines(&log, file, source)
        ))
    })
}

impl Backend for CudaBackend {
    fn target(&self) -> &Target {
        &self.target
    }

    fn compile(&self, func: &PrimFunc) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(self.compile_cuda(func)?))
    }
}

/// A compiled CUDA function: its source, PTX and cubin where NVRTC ran, and the host plan.
pub struct CudaKernel {
    func: PrimFunc,
    source: String,
    info: Vec<KernelInfo>,
    /// The build-time architecture (of `cubin`, and of the PTX when asked for).
    arch: CudaArch,
    /// PTX, compiled at build time or on first request (`None` inside: no NVRTC).
    ptx: OnceLock<Option<String>>,
    cubin: Option<(CudaArch, Vec<u8>)>,
    /// NVRTC's warnings (empty when it had nothing to say).
    log: String,
    nvrtc: Option<Arc<nvrtc::Nvrtc>>,
    fmad: bool,
    cache: Option<cache::DiskCache>,
    slots: Vec<crate::ir::Var>,
    /// Per kernel (as `info`), the loaded-function positions of its 64-bit and 32-bit entry
    /// points (`KernelInfo::entries`, all kernels' in order): chosen per call, no allocation.
    entry_pos: Vec<[Option<usize>; 2]>,
    devices: driver::Devices,
}

/// The positions of each kernel's entry points in the list of all entry points.
fn entry_positions(info: &[KernelInfo]) -> Vec<[Option<usize>; 2]> {
    let mut next = 0;
    info.iter()
        .map(|k| {
            let mut pos = [None, None];
            for (w, has) in [k.index32.has64(), k.index32.has32()]
                .into_iter()
                .enumerate()
            {
                if has {
                    pos[w] = Some(next);
                    next += 1;
                }
            }
            pos
        })
        .collect()
}

impl CudaKernel {
    /// The generated CUDA C.
    pub fn cuda_source(&self) -> &str {
        &self.source
    }
    /// PTX for the build-time architecture, where NVRTC was found: compiled on first request
    /// unless the build compiled it (`build_plan`).
    pub fn ptx(&self) -> Option<&str> {
        self.ptx.get_or_init(|| self.compile_ptx()).as_deref()
    }

    fn compile_ptx(&self) -> Option<String> {
        let nv = self.nvrtc.as_ref()?;
        let file = format!("{}.cu", source::sanitize(&self.func.name));
        match compile_cached_with(
            self.cache.as_ref(),
            nv,
            &self.source,
            &file,
            self.arch,
            Kind::Ptx,
            self.fmad,
        ) {
            Ok(c) => match c.output {
                nvrtc::Output::Ptx(text) => Some(text),
                nvrtc::Output::Cubin(_) => None,
            },
            Err(e) => {
                // The cubin of the same source compiled: this is not expected.
                eprintln!("rivet: warning: {}: compiling PTX: {e}", self.func.name);
                None
            }
        }
    }
    /// Whether the PTX has been compiled (at build time or since).
    pub fn ptx_compiled(&self) -> bool {
        self.ptx.get().is_some()
    }
    /// The cubin and its architecture, where NVRTC was found.
    pub fn cubin(&self) -> Option<(CudaArch, &[u8])> {
        self.cubin.as_ref().map(|(a, b)| (*a, b.as_slice()))
    }
    /// NVRTC's log of the build-time compilations (warnings; empty when clean).
    pub fn nvrtc_log(&self) -> &str {
        &self.log
    }
    /// The kernels and their launch shapes.
    pub fn kernels(&self) -> &[KernelInfo] {
        &self.info
    }

    /// A cubin for `arch`: the build-time one when it matches, else compiled now (through the
    /// disk cache: a device seen before costs no NVRTC call).
    fn cubin_for(&self, arch: CudaArch) -> Result<Vec<u8>> {
        let cubin = self.cubin_for_arch(arch)?;
        record_cubin_source(&cubin, &self.source);
        Ok(cubin)
    }

    fn cubin_for_arch(&self, arch: CudaArch) -> Result<Vec<u8>> {
        if let Some((a, b)) = &self.cubin {
            if *a == arch {
                return Ok(b.clone());
            }
        }
        let nv = match &self.nvrtc {
            Some(n) => n.clone(),
            None => nvrtc::find().map_err(|e| {
                driver::device_error(format!(
                    "{}: cannot compile for the device ({arch}): {e}",
                    self.func.name
                ))
            })?,
        };
        let file = format!("{}.cu", source::sanitize(&self.func.name));
        match compile_cached_with(
            self.cache.as_ref(),
            &nv,
            &self.source,
            &file,
            arch,
            Kind::Cubin,
            self.fmad,
        )?
        .output
        {
            nvrtc::Output::Cubin(b) => Ok(b),
            nvrtc::Output::Ptx(_) => Err(Error::Internal("NVRTC gave PTX for a cubin".into())),
        }
    }
}

/// `RIVET_CUBIN_SOURCES=dir`: the CUDA C source of every cubin handed to the driver, written
/// to `dir/<SHA-256 of the cubin, hex>.cu` (atomically: a temporary file renamed). It maps a
/// loaded module back to the source it came from: the CUDA driver double of the tests runs
/// kernels from it, and on a GPU it names the source of a cubin a tool reports. Best effort:
/// a folder that cannot be written is reported on stderr and the launch goes on.
fn record_cubin_source(cubin: &[u8], source: &str) {
    use sha2::{Digest, Sha256};
    let Some(dir) = std::env::var_os("RIVET_CUBIN_SOURCES").filter(|d| !d.is_empty()) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let hash: String = Sha256::digest(cubin)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = dir.join(format!("{hash}.cu"));
    if path.is_file() {
        return;
    }
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".tmp-{hash}-{}-{seq}", std::process::id()));
    let r = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&tmp, source))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        eprintln!(
            "rivet: warning: RIVET_CUBIN_SOURCES: cannot write {}: {e}",
            path.display()
        );
    }
}

impl Kernel for CudaKernel {
    fn host_callbacks(&self) -> Vec<&crate::ir::callback::Callback> {
        self.func.callbacks.iter().collect()
    }

    /// Generated code by kind: "cuda" (or "cu"), "ptx" (`None` without NVRTC).
    fn source_of(&self, kind: &str) -> Option<String> {
        match kind {
            "cuda" | "cu" => Some(self.source.clone()),
            "ptx" => self.ptx().map(str::to_string),
            _ => None,
        }
    }

    unsafe fn launch(&self, frame: &CallFrame, ctx: &LaunchContext) -> Result<()> {
        let f = &self.func;
        let ordinal = match ctx.device {
            Device::Cuda(o) if o >= 0 => o as usize,
            other => {
                return Err(driver::device_error(format!(
                    "{}: built for 'cuda', called with tensors on {other}; pass CUDA tensors (or build for 'cpu')",
                    f.name
                )))
            }
        };
        if frame.ptrs.len() != f.params.len() || frame.ints.len() != self.slots.len() {
            return Err(Error::Internal(format!(
                "{}: call frame has {} pointers and {} ints, the function takes {} and {}",
                f.name,
                frame.ptrs.len(),
                frame.ints.len(),
                f.params.len(),
                self.slots.len()
            )));
        }
        // Every entry point of every kernel, in order (`KernelInfo::entries`).
        let names: Vec<String> = self.info.iter().flat_map(|k| k.entries()).collect();
        let loaded = self
            .devices
            .get(ordinal, &names, &|arch| self.cubin_for(arch))?;
        let mut env: HashMap<u32, i64> = HashMap::new();
        for (v, x) in self.slots.iter().zip(&frame.ints) {
            env.insert(v.id, *x);
        }
        let stream = ctx.stream.unwrap_or(0);
        let mut temps = HashMap::new();
        // SAFETY: forwarded contract (the frame describes device memory of `ctx.device`).
        unsafe { self.run_host(&f.body, &mut env, &mut temps, frame, &loaded, stream) }
    }

    /// A zeroed output on the call's device, allocated stream-ordered on the launch stream
    /// (`driver::alloc_tensor`: no device-wide synchronisation; freed by the reaper once the
    /// device is done with the work queued before its last owner dropped).
    fn alloc_output(&self, shape: &[i64], dtype: DType, ctx: &LaunchContext) -> Result<Tensor> {
        let ordinal = match ctx.device {
            Device::Cuda(o) if o >= 0 => o as usize,
            other => {
                return Err(driver::device_error(format!(
                    "{}: built for 'cuda', called with tensors on {other}; pass CUDA tensors (or build for 'cpu')",
                    self.func.name
                )))
            }
        };
        driver::alloc_tensor(ordinal, shape, dtype, ctx.stream.unwrap_or(0), true)
    }

    fn source(&self) -> String {
        self.source.clone()
    }
}

impl CudaKernel {
    /// Allocates the global temporary `buf` of an `Allocate` on the device: compact, zeroed,
    /// stream-ordered (as the interpreter's `Allocate`, which `call::allocate` has already sized
    /// against MAX_ALLOC_BYTES); binds its strides in `env`.
    fn host_alloc(
        &self,
        buf: crate::ir::BufId,
        env: &mut HashMap<u32, i64>,
        loaded: &driver::Loaded,
        stream: u64,
    ) -> Result<u64> {
        let f = &self.func;
        let b = f.buffer(buf);
        let mut shape = Vec::with_capacity(b.shape.len());
        for e in &b.shape {
            match crate::codegen::interp::eval_expr(e, &|v| env.get(&v.id).copied())? {
                crate::codegen::interp::Value::Int(x) => shape.push(x),
                other => return Err(Error::Internal(format!("`{e}` evaluated to {other:?}"))),
            }
        }
        let mut strides = vec![0i64; shape.len()];
        let mut count: i64 = 1;
        for k in (0..shape.len()).rev() {
            strides[k] = count;
            count = count.saturating_mul(shape[k].max(0));
        }
        let bytes = usize::try_from(count)
            .ok()
            .and_then(|n| n.checked_mul(b.dtype.size()))
            .filter(|&n| n <= crate::ir::limits::MAX_ALLOC_BYTES)
            .ok_or_else(|| {
                Error::Runtime(rivet_runtime::Error::Memory(format!(
                    "{}: temporary '{}' of shape {shape:?} is too large",
                    f.name, b.name
                )))
            })?;
        for (v, s) in b.strides.iter().zip(&strides) {
            env.insert(v.id, *s);
        }
        loaded.alloc_zeroed(bytes, stream)
    }

    /// Runs the host part (a sequence of launches under `let`s and global temporaries,
    /// `source::check_host`). `temps`: the device pointers of the live temporaries.
    ///
    /// # Safety
    /// As `Kernel::launch`.
    unsafe fn run_host(
        &self,
        s: &Stmt,
        env: &mut HashMap<u32, i64>,
        temps: &mut HashMap<crate::ir::BufId, u64>,
        frame: &CallFrame,
        loaded: &driver::Loaded,
        stream: u64,
    ) -> Result<()> {
        let f = &self.func;
        let eval = |e: &crate::ir::Expr, env: &HashMap<u32, i64>| -> Result<i64> {
            match crate::codegen::interp::eval_expr(e, &|v| env.get(&v.id).copied())? {
                crate::codegen::interp::Value::Int(x) => Ok(x),
                other => Err(Error::Internal(format!("`{e}` evaluated to {other:?}"))),
            }
        };
        match s {
            Stmt::Seq(v) => {
                for s in v {
                    // SAFETY: forwarded.
                    unsafe { self.run_host(s, env, temps, frame, loaded, stream)? };
                }
                Ok(())
            }
            Stmt::Let { var, value, body } => {
                let x = eval(value, env)?;
                env.insert(var.id, x);
                // SAFETY: forwarded.
                let r = unsafe { self.run_host(body, env, temps, frame, loaded, stream) };
                env.remove(&var.id);
                r
            }
            Stmt::Allocate { bufs, body } => {
                let mut live = Vec::with_capacity(bufs.len());
                let mut r = Ok(());
                for buf in bufs {
                    match self.host_alloc(*buf, env, loaded, stream) {
                        Ok(ptr) => {
                            temps.insert(*buf, ptr);
                            live.push((*buf, ptr));
                        }
                        Err(e) => {
                            r = Err(e);
                            break;
                        }
                    }
                }
                if r.is_ok() {
                    // SAFETY: forwarded; the temporaries live until the frees below (stream
                    // order).
                    r = unsafe { self.run_host(body, env, temps, frame, loaded, stream) };
                }
                for (buf, ptr) in live.into_iter().rev() {
                    temps.remove(&buf);
                    for v in &f.buffer(buf).strides {
                        env.remove(&v.id);
                    }
                    let freed = loaded.free(ptr, stream);
                    r = r.and(freed);
                }
                r
            }
            Stmt::Launch { kernel } => {
                let (pos, info) = self
                    .info
                    .iter()
                    .enumerate()
                    .find(|(_, k)| k.index == *kernel)
                    .ok_or_else(|| Error::Internal(format!("launch of unknown kernel {kernel}")))?;
                let k = &f.kernels[*kernel];
                // The index width: the 32-bit entry when this call's values keep every index
                // inside int32 (exact checked evaluation of the kernel's bounds, no allocation).
                let (entry, narrow) = info.entry(&|v| env.get(&v.id).copied());
                let func_pos = self.entry_pos[pos][narrow as usize]
                    .ok_or_else(|| Error::Internal(format!("no entry point {entry}")))?;
                let mut grid = [1u32; 3];
                for (d, e) in info.grid.iter().enumerate() {
                    let Some(e) = e else { continue };
                    let n = eval(e, env)?;
                    if n <= 0 {
                        return Ok(()); // an empty grid: nothing to run
                    }
                    let limit: i64 = if d == 0 { i32::MAX as i64 } else { 65535 };
                    if n > limit {
                        return Err(driver::device_error(format!(
                            "{}: kernel {} needs {n} blocks in grid dimension {}, over CUDA's limit {limit}; split the bound axis further",
                            f.name,
                            info.name,
                            ["x", "y", "z"][d]
                        )));
                    }
                    grid[d] = n as u32;
                }
                let mut args = Vec::with_capacity(k.bufs.len() + k.vars.len());
                for id in &k.bufs {
                    let ptr = match f.params.iter().position(|q| q == id) {
                        Some(p) => frame.ptrs[p] as u64,
                        None => *temps.get(id).ok_or_else(|| {
                            Error::Internal(format!(
                                "kernel {} captures a buffer that is not allocated here",
                                info.name
                            ))
                        })?,
                    };
                    args.push(driver::Arg::Ptr(ptr));
                }
                for v in &k.vars {
                    let x = env.get(&v.id).copied().ok_or_else(|| {
                        Error::Internal(format!("kernel {}: unbound capture {}", info.name, v.name))
                    })?;
                    args.push(if narrow {
                        // Inside int32: `entry` checked every captured variable.
                        driver::Arg::Int32(i32::try_from(x).map_err(|_| {
                            Error::Internal(format!(
                                "{}: {} = {x} for a 32-bit kernel",
                                info.name, v.name
                            ))
                        })?)
                    } else {
                        driver::Arg::Int(x)
                    });
                }
                // SAFETY: the arguments follow the kernel's parameter list (captures in
                // order, `int` in the 32-bit entry); the frame's memory is the caller's
                // contract.
                unsafe { loaded.launch(func_pos, grid, info.block, stream, &args) }
            }
            other => Err(Error::Internal(format!(
                "{}: host statement the CUDA backend does not run: {other:?}",
                f.name
            ))),
        }
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    const SM80: CudaArch = CudaArch { major: 8, minor: 0 };
    const SM90: CudaArch = CudaArch { major: 9, minor: 0 };

    #[test]
    fn a_build_compiles_for_the_device_that_runs_it_and_ptx_only_when_asked() {
        // A device present: one cubin, for the target's arch or else the device's; no PTX.
        assert_eq!(build_plan(None, || Some(SM90)), (SM90, false));
        assert_eq!(build_plan(Some(SM80), || Some(SM90)), (SM80, false));
        // No driver or device (build machines, tests): PTX and a cubin, sm_80 by default.
        assert_eq!(build_plan(None, || None), (DEFAULT_ARCH, true));
        assert_eq!(build_plan(Some(SM90), || None), (SM90, true));
        assert_eq!(DEFAULT_ARCH, SM80);
    }

    #[test]
    fn with_a_device_the_build_compiles_one_cubin_and_ptx_lazily() {
        let Ok(nv) = nvrtc::find() else { return }; // NVRTC is needed to compile
        let f = crate::ir::test_util::func(
            "lazy",
            vec![crate::ir::test_util::output(
                0,
                "C",
                DType::F32,
                vec![crate::ir::Expr::int(64)],
            )],
            vec![],
            cache_tests::thread_store(),
        );
        let mut f = f;
        crate::lower::flatten::flatten(&mut f);
        crate::lower::outline::outline(&mut f);
        let mut b = CudaBackend::new(Target::cuda(None), false);
        b.nvrtc_path = Some(nv.path.clone());
        b.cache = None;
        b.probe_device = || Some(SM90);
        let k = b.compile_cuda(&f).unwrap();
        assert_eq!(k.cubin().map(|c| c.0), Some(SM90), "the device's arch");
        assert!(!k.ptx_compiled(), "no PTX until asked for");
        let ptx = k.source_of("ptx").expect("PTX on request");
        assert!(ptx.contains(".target sm_90"), "{ptx}");
        assert!(k.ptx_compiled());
        // Without a device: today's build, PTX and cubin for sm_80.
        b.probe_device = || None;
        let k = b.compile_cuda(&f).unwrap();
        assert!(k.ptx_compiled());
        assert_eq!(k.cubin().map(|c| c.0), Some(SM80));
    }
}
