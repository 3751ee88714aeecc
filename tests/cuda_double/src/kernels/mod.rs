//! Modules and kernels, run on the CPU.
//!
//! The interface the driver state uses (the rest of this folder implements it):
//! - [`Module::load`]: a cubin image as `cuModuleLoadData` gets it (a pointer; the length is
//!   read from the ELF headers), checked against the device's architecture, mapped back to
//!   the CUDA C rivet compiled it from (`$RIVET_CUBIN_SOURCES/<sha256 of the cubin>.cu`) and
//!   compiled for the host under the CUDA emulation;
//! - [`Module::function`]: a kernel by name (`cuModuleGetFunction`);
//! - [`Function::params`]: each parameter's size and whether it is a pointer, from the
//!   kernel's declared types, so `cuLaunchKernel` copies exactly those bytes at enqueue time;
//! - [`Function::run`]: the whole grid, now, on the calling thread (the executor calls it
//!   when the launch's turn comes, with device memory accessible).
//!
//! Files: `elf` reads a cubin, `source` finds and reads its CUDA C, `host` compiles, caches
//! and loads it, `emulation.h` is the CUDA device environment it is compiled under.
//!
//! Invariants:
//! - a kernel's parameter types are never guessed from rivet's side: the generated wrappers
//!   take them from the kernel's own declaration (C++ templates over its function type), so a
//!   wrong size or order in what rivet passes gives a wrong result or a refusal, as on a GPU;
//!   and they agree with the cubin's own parameter table (`EIATTR_KPARAM_INFO`) or the module
//!   is refused (the source recorded is not the cubin's);
//! - a module's kernels are its own: two modules with a kernel of the same name run each its
//!   own body (each program is its own shared object, `RTLD_LOCAL`);
//! - a launch keeps its state on its own stack (`emulation.h`), so kernels of different
//!   modules may run in turn; runs are not concurrent (the driver state serializes them).

mod elf;
mod host;
mod source;

pub use elf::image_len as cubin_len;
pub use source::SOURCES_VAR;

use crate::error::{
    Refusal, CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NO_BINARY_FOR_GPU,
};
use std::ffi::c_void;
use std::sync::Arc;

/// The CUDA device environment the sources are compiled under.
const EMULATION: &str = include_str!("emulation.h");

/// A kernel's parameters, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// `sizeof` of each declared parameter type.
    pub sizes: Vec<usize>,
    /// Whether each is a pointer (checked against live device memory at launch).
    pub is_ptr: Vec<bool>,
}

/// A loaded module.
#[derive(Debug)]
pub struct Module {
    functions: Vec<Arc<Function>>,
    /// `sm_XY` of the cubin.
    arch: (u32, u32),
    /// Where its source was found.
    source: std::path::PathBuf,
}

/// One kernel of a loaded module.
#[derive(Debug)]
pub struct Function {
    name: String,
    params: ParamInfo,
    /// Each parameter's offset in the parameter bank, from the cubin.
    offsets: Option<Vec<usize>>,
    static_shared: usize,
    max_threads: Option<u32>,
    threaded: bool,
    run: host::RunFn,
    /// Keeps the shared object `run` lies in (it is never unloaded anyway).
    _lib: Arc<host::Library>,
}

fn invalid(why: impl Into<String>) -> Refusal {
    Refusal::new(CUDA_ERROR_INVALID_IMAGE, why)
}

/// What a non-ELF image is: PTX text is refused as unsupported, anything else as garbage.
///
/// # Safety
/// `image` must point at a readable NUL-terminated text or at least 4 readable bytes (what
/// `cuModuleLoadData` requires of its caller).
unsafe fn refuse_non_elf(image: *const u8) -> Refusal {
    // SAFETY: the caller promises 4 readable bytes.
    let head = unsafe { std::slice::from_raw_parts(image, 4) };
    if head == [0x50, 0xed, 0x55, 0xba] {
        return Refusal::new(
            CUDA_ERROR_NOT_SUPPORTED,
            "a fatbinary image: the double runs cubins only (load the cubin NVRTC made)",
        );
    }
    let text_like = |c: u8| c == b'\n' || c == b'\r' || c == b'\t' || (0x20..0x7f).contains(&c);
    if head.iter().all(|&c| text_like(c)) {
        // Text: read up to its NUL (bounded), as the real driver reads a PTX image.
        let mut text = Vec::new();
        for k in 0..(1 << 20) {
            // SAFETY: a text image is NUL-terminated; reading stops at the NUL.
            let c = unsafe { *image.add(k) };
            if c == 0 || !text_like(c) {
                break;
            }
            text.push(c);
        }
        let t = String::from_utf8_lossy(&text);
        if t.contains(".version") || t.contains(".target") || t.contains(".entry") {
            return Refusal::new(
                CUDA_ERROR_NOT_SUPPORTED,
                "a PTX image: the double runs cubins only (it maps a cubin to the CUDA C \
                 recorded for it; ask NVRTC for a cubin, nvrtcGetCUBIN, for the device's sm_XY)",
            );
        }
    }
    invalid("not a cubin (no ELF magic): the double runs cubins only")
}

impl Module {
    /// Loads the cubin at `image` for a device of compute capability `arch` (major, minor).
    ///
    /// # Safety
    /// `image` must point at a readable cubin (an ELF file) as `cuModuleLoadData` requires.
    pub unsafe fn load(image: *const u8, arch: (u32, u32)) -> Result<Module, Refusal> {
        if image.is_null() {
            return Err(Refusal::new(CUDA_ERROR_INVALID_VALUE, "a null image"));
        }
        // SAFETY: the caller's promise: at least the 4 bytes of a magic.
        let magic = unsafe { std::slice::from_raw_parts(image, 4) };
        if magic != elf::ELF_MAGIC {
            // SAFETY: as above.
            return Err(unsafe { refuse_non_elf(image) });
        }
        // SAFETY: an ELF image (its magic says so) as readable as its headers describe.
        let len =
            unsafe { elf::image_len(image) }.map_err(|e| invalid(format!("not a cubin: {e}")))?;
        // SAFETY: `len` bytes are the image (its headers say so).
        let bytes = unsafe { std::slice::from_raw_parts(image, len) };
        let cubin = elf::parse(bytes).map_err(|e| invalid(format!("a malformed cubin: {e}")))?;
        let (x, y) = cubin.arch;
        if x != arch.0 || y > arch.1 {
            return Err(Refusal::new(
                CUDA_ERROR_NO_BINARY_FOR_GPU,
                format!(
                    "a cubin for sm_{x}{y} cannot run on a device of compute capability {}.{} \
                     (a cubin runs on devices of its own major version and a minor at least \
                     its own): compile for sm_{}{}",
                    arch.0, arch.1, arch.0, arch.1
                ),
            ));
        }
        let hash = host::sha256_hex(bytes);
        let (path, text) = source::find(&hash)?;
        let what = path.display().to_string();
        let defined = source::functions(&text);
        let mut found = Vec::new();
        for k in &cubin.kernels {
            if k.name.starts_with("_Z") {
                return Err(invalid(format!(
                    "{what}: the cubin's kernel {} has a C++ (mangled) name; the double maps \
                     kernels to the source by name: declare them extern \"C\"",
                    k.name
                )));
            }
            match defined.get(&k.name) {
                Some(s) if s.global => found.push(s.clone()),
                _ => {
                    return Err(invalid(format!(
                        "{what} does not define the cubin's kernel {} as a __global__ function: \
                         it is not the source of this cubin",
                        k.name
                    )))
                }
            }
        }
        let program = program(&text, &hash, &cubin.kernels, &found);
        let sources = source::sources_dir()?;
        let lib = host::load(&program, &sources, &what)?;
        let mut functions = Vec::new();
        for (i, (k, s)) in cubin.kernels.iter().zip(&found).enumerate() {
            let params_fn = lib.symbol(&format!("rivet_double_params_{i}"))?;
            let run = lib.symbol(&format!("rivet_double_run_{i}"))?;
            // SAFETY: the generated wrappers have exactly these signatures (`program`).
            let (params_fn, run) = unsafe {
                (
                    std::mem::transmute::<*mut c_void, host::ParamsFn>(params_fn),
                    std::mem::transmute::<*mut c_void, host::RunFn>(run),
                )
            };
            let mut sizes = vec![0u64; 256];
            let mut ptrs = vec![0u8; 256];
            // SAFETY: buffers of the capacity passed.
            let n = unsafe { params_fn(sizes.as_mut_ptr(), ptrs.as_mut_ptr(), 256) } as usize;
            if n > 256 {
                return Err(invalid(format!("{}: more than 256 parameters", k.name)));
            }
            let params = ParamInfo {
                sizes: sizes[..n].iter().map(|&s| s as usize).collect(),
                is_ptr: ptrs[..n].iter().map(|&p| p != 0).collect(),
            };
            if let Some(kp) = &k.params {
                let theirs: Vec<usize> = kp.iter().map(|p| p.1 as usize).collect();
                if theirs != params.sizes {
                    return Err(invalid(format!(
                        "{what}: kernel {} declares parameters of sizes {:?}, its cubin's \
                         parameter table (EIATTR_KPARAM_INFO) says {theirs:?}: the source is \
                         not the cubin's",
                        k.name, params.sizes
                    )));
                }
            }
            functions.push(Arc::new(Function {
                name: k.name.clone(),
                params,
                offsets: k
                    .params
                    .as_ref()
                    .map(|kp| kp.iter().map(|p| p.0 as usize).collect()),
                static_shared: k.static_shared as usize,
                max_threads: s.max_threads,
                threaded: s.syncs,
                run,
                _lib: lib.clone(),
            }));
        }
        Ok(Module {
            functions,
            arch: cubin.arch,
            source: path,
        })
    }

    /// The kernel `name`, if the module has it.
    pub fn function(&self, name: &str) -> Option<Arc<Function>> {
        self.functions.iter().find(|f| f.name == name).cloned()
    }

    /// The cubin's `sm_XY` as (X, Y).
    pub fn arch(&self) -> (u32, u32) {
        self.arch
    }

    /// The CUDA C file the module was mapped to.
    pub fn source_path(&self) -> &std::path::Path {
        &self.source
    }

    /// Its kernels' names, in the cubin's symbol order.
    pub fn function_names(&self) -> Vec<&str> {
        self.functions.iter().map(|f| f.name.as_str()).collect()
    }
}

/// The C++ program for a cubin: the emulation, its source (dynamic shared memory rewritten)
/// and, per kernel `i`, `rivet_double_run_<i>` / `rivet_double_params_<i>`, generated from the
/// kernel's name only (the types come from its declaration).
fn program(
    text: &str,
    hash: &str,
    kernels: &[elf::KernelSym],
    found: &[source::KernelSource],
) -> String {
    let (text, dynamic_globals) = source::rewrite_dynamic_shared(text);
    let mut p = String::from(EMULATION);
    p.push_str(&format!("#line 1 \"{hash}.cu\"\n"));
    p.push_str(&text);
    p.push_str("\n#line 1 \"rivet-cuda-double wrappers\"\n");
    p.push_str("namespace rivet_emu {\nstatic void point_dynamic_shared_hook() {\n");
    for g in &dynamic_globals {
        p.push_str(&format!("  ::{g}\n"));
    }
    p.push_str("}\n}  // namespace rivet_emu\n");
    for (i, (k, s)) in kernels.iter().zip(found).enumerate() {
        // Threaded when the kernel may synchronise its threads (barriers, warp operations),
        // else a block's threads one after another (see emulation.h).
        p.push_str(&format!(
            "extern \"C\" int rivet_double_run_{i}(const rivet_launch_args* a) {{\n  \
             return rivet_emu::run_kernel(&{n}, {t}, a);\n}}\n\
             extern \"C\" int rivet_double_params_{i}(unsigned long long* s, unsigned char* p, int cap) {{\n  \
             return rivet_emu::param_info(&{n}, s, p, cap);\n}}\n",
            n = k.name,
            t = s.syncs,
        ));
    }
    p
}

impl Function {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn params(&self) -> &ParamInfo {
        &self.params
    }

    /// Bytes of static `__shared__` memory per block.
    pub fn static_shared_bytes(&self) -> usize {
        self.static_shared
    }

    /// Each parameter's offset in the parameter bank, as the cubin lays them out (for
    /// `cuLaunchKernel`'s `extra` buffer); `None` when the cubin has no parameter table.
    pub fn param_offsets(&self) -> Option<&[usize]> {
        self.offsets.as_deref()
    }

    /// `__launch_bounds__`'s most threads per block, when the source gives a number.
    pub fn max_threads_per_block(&self) -> Option<u32> {
        self.max_threads
    }

    /// Whether a block's threads run one OS thread each (the kernel may synchronise them)
    /// rather than one after another.
    pub fn runs_threaded(&self) -> bool {
        self.threaded
    }

    /// Whether a launch of this shape can run, as the real driver checks at `cuLaunchKernel`.
    pub fn check_launch(&self, grid: [u32; 3], block: [u32; 3]) -> Result<(), Refusal> {
        let threads = block.iter().map(|&b| b as u64).product::<u64>();
        if grid.contains(&0) || threads == 0 {
            return Err(Refusal::new(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "{}: an empty launch (grid {grid:?}, block {block:?})",
                    self.name
                ),
            ));
        }
        if threads > 1024 || block[2] > 64 || grid[1] > 65535 || grid[2] > 65535 {
            return Err(Refusal::new(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "{}: grid {grid:?} / block {block:?} exceed the device's limits (1024 \
                     threads per block, block z <= 64, grid y and z <= 65535)",
                    self.name
                ),
            ));
        }
        if let Some(m) = self.max_threads {
            if threads > m as u64 {
                return Err(Refusal::new(
                    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                    format!(
                        "{}: a block of {threads} threads, more than its __launch_bounds__({m})",
                        self.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Runs the whole grid now with the parameter values copied at enqueue time
    /// (`params[i]` holds `params().sizes[i]` bytes). A kernel that cannot run (a trap, a
    /// failed host compilation) is an `Err` with the reason.
    ///
    /// # Safety
    /// Every pointer parameter must address device memory made accessible for the run.
    pub unsafe fn run(
        &self,
        grid: [u32; 3],
        block: [u32; 3],
        dynamic_shared: u32,
        params: &[Vec<u8>],
    ) -> Result<(), String> {
        self.check_launch(grid, block).map_err(|r| r.why)?;
        if params.len() != self.params.sizes.len() {
            return Err(format!(
                "{}: {} parameter values for its {} parameters",
                self.name,
                params.len(),
                self.params.sizes.len()
            ));
        }
        for (i, (v, &s)) in params.iter().zip(&self.params.sizes).enumerate() {
            if v.len() != s {
                return Err(format!(
                    "{}: parameter {i} has {} bytes, its type {s}",
                    self.name,
                    v.len()
                ));
            }
        }
        // The wrapper reads each value with memcpy, so the bytes need no alignment.
        let mut ptrs: Vec<*mut c_void> = params.iter().map(|v| v.as_ptr() as *mut c_void).collect();
        let mut why = vec![0u8; 1024];
        let args = host::LaunchArgs {
            grid,
            block,
            dynamic_shared: dynamic_shared as u64,
            params: ptrs.as_mut_ptr(),
            why: why.as_mut_ptr().cast(),
            why_cap: why.len() as u64,
        };
        // SAFETY: `run` is the wrapper of this kernel, `args` lives across the call and points
        // at the parameter values; the caller makes pointer parameters addressable.
        let rc = unsafe { (self.run)(&args) };
        if rc == 0 {
            return Ok(());
        }
        let end = why.iter().position(|&c| c == 0).unwrap_or(why.len());
        Err(format!(
            "{}: {}",
            self.name,
            String::from_utf8_lossy(&why[..end])
        ))
    }
}
