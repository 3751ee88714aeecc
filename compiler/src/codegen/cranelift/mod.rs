//! The CPU backend: JIT-compiles a flattened `PrimFunc` to native code with Cranelift.
//!
//! One compiled kernel is one `JITModule` holding an entry function
//! `extern "C" fn(ptrs: *const *mut u8, ints: *const i64) -> i32` (the `CallFrame` ABI of
//! `codegen/mod.rs`) and one outlined function per parallel loop
//! `extern "C" fn(ctx: *const i64, lo: i64, hi: i64) -> i32`, run on rivet's rayon pool by
//! `rivet_parallel_for` (see `parallel.rs`).
//!
//! Error channel: every generated function returns 0, or 1 after a helper recorded a
//! `helpers::Fault` for its thread (a local buffer that cannot be allocated; in checked mode, an
//! out-of-bounds access). The failing function frees the local buffers it holds and returns at
//! once; callers propagate the status; `launch` turns the fault into a `rivet.Error`. A host
//! callback's error (`callback.rs`) travels in a slot of its own, unchanged. Nothing
//! unwinds through generated code and nothing aborts.
//!
//! Checked mode (`CraneliftBackend::checked`): functions are not flattened; every load and
//! store checks each index against its dim's extent before computing the address.
//!
//! Semantics follow the interpreter (`codegen/cpu_lib/math.rs`, `ir/expr.rs`) bit for bit:
//! - ints are computed at their dtype's width with wrapping; uints use unsigned compares,
//!   division and extension; bool is an `i8` holding 0 or 1;
//! - float32/float64 are computed in `f32`/`f64`; float16/bfloat16 are loaded and widened to
//!   `f32`, computed in `f32`, and rounded (to nearest even, as the `half` crate) when stored
//!   or cast to float16/bfloat16 (a cast from float64 rounds once, with `half`'s `from_f64`);
//! - transcendentals, `pow` and float `//`/`%` call the `math::symbols()` helpers; `sqrt`,
//!   `abs`, `floor`, `ceil` are native; `a * b + c` is a multiply and an add (two roundings,
//!   as in the interpreter) and only the IR's explicit `Fma` node (the `fma` build option)
//!   becomes Cranelift's `fma`: `vfmadd` with the host's FMA, else a call of `fmaf`/`fma`,
//!   bound to `math`'s correctly rounded helpers, so it is one rounding on every CPU;
//! - integer `//` and `%` are guarded so that no division traps (divisor 0 gives 0, `MIN // -1`
//!   wraps); float-to-int casts saturate (NaN gives 0), as Rust's `as`;
//! - `Select` whose arms load memory, and `&&`/`||` whose right operand loads memory, branch
//!   and evaluate only what the interpreter evaluates (a guarded load is never performed);
//!   memory-free ones use a branchless `select` / `band` / `bor`;
//! - every function is checked by `ir::verify` (flattened) before code is generated.
//!
//! Local buffers (`Allocate`) start zeroed, as in the interpreter: constant ones up to 2 KiB
//! are stack slots (`stmt::allocate`), the others come from a per-thread arena
//! (`helpers::arena`) that reuses blocks across calls. A local `lower::overwrite` marked
//! (stored in full before any read) is not zeroed (`rivet_alloc_uninit`, no stack memset).
//!
//! Files: `expr.rs` (expressions, casts, loads/stores), `divide.rs` (integer `//` and `%`),
//! `flags.rs` (Cranelift's settings), `stmt.rs` (statements, loops, locals),
//! `parallel.rs` (outlining of parallel loops and the rayon driver), `helpers.rs` (the
//! `extern "C"` runtime helpers generated code calls besides `math::symbols()`), `intrin.rs`
//! (intrinsic calls: a call of the micro-kernel `codegen::cpu_lib::microkernel` selected for this
//! process, through the symbols `rivet_gemm_f32` / `rivet_gemm_f64`, which each kernel's JIT
//! module binds to the chosen variant's entry when it is built).

mod callback;
mod divide;
mod exp_run;
mod expr;
mod flags;
mod helpers;
mod hoist;
mod intrin;
mod parallel;
mod stmt;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_build_cost;
#[cfg(test)]
mod tests_faults;
mod vector;
mod vector_exp;
mod vector_quad;

use crate::build_times::phase;
use crate::codegen::{int_slots, Backend, CallFrame, Kernel, LaunchContext};
use crate::error::{Error, Result};
use crate::ir::{BufId, Expr, PrimFunc};
use crate::target::Target;
use cranelift_codegen::ir::{types, AbiParam, FuncRef, InstBuilder, Type, UserFuncName};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::Configurable;
use cranelift_codegen::Context;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{ArenaMemoryProvider, JITBuilder, JITModule};

/// Address space first reserved for one module's code and data (`compile_kernel`); a module
/// that outgrows it is compiled again in a region 16 times larger, up to `JIT_ARENA_MAX`
/// (inside PC-relative reach: past it the build is an error, never an out-of-reach call).
const JIT_ARENA_BYTES: usize = 4 << 20;
const JIT_ARENA_MAX: usize = 1 << 30;
/// cranelift-jit's message when a reserved region is full.
const ARENA_EXHAUSTED: &str = "jit memory region exhausted";
use cranelift_module::{default_libcall_names, FuncId, Linkage, Module};
use std::collections::HashMap;

/// The pointer type of generated code (the backend only targets 64-bit hosts).
const PTR: Type = types::I64;

/// The Cranelift CPU backend ("cpu").
#[derive(Clone)]
pub struct CraneliftBackend {
    target: Target,
    isa: OwnedTargetIsa,
    /// Keep the disassembly of generated code (costs about 20% of compile time).
    disassemble: bool,
    /// Keep a copy of every function's CLIF in the kernel for `Kernel::source` (on by
    /// default). Off, the kernel generates it again from the function when asked
    /// (`Kernel::source_from`): `build` turns it off, the copy cost a build more than a
    /// tenth of a millisecond.
    keep_clif: bool,
    /// Checked mode: unflattened input, every access bounds-checked.
    checked: bool,
    /// The ISA has FMA (read once from its flags, not per kernel).
    has_fma: bool,
}

impl std::fmt::Debug for CraneliftBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CraneliftBackend({})", self.isa.triple())
    }
}

impl CraneliftBackend {
    /// A backend for the host CPU: its ISA features (AVX, FMA, ...) detected by
    /// `cranelift_native`, optimised for speed.
    pub fn new() -> Result<Self> {
        Self::with_isa_settings(&[])
    }

    /// `new`, with ISA settings of `cranelift_native`'s detection overridden (tests use
    /// `("has_fma", "false")` to check the code of CPUs without FMA on one that has it).
    pub(crate) fn with_isa_settings(overrides: &[(&str, &str)]) -> Result<Self> {
        if usize::BITS != 64 {
            return Err(Error::Compile(
                "the Cranelift CPU backend needs a 64-bit host".into(),
            ));
        }
        let flags = flags::shared_flags()?;
        let mut isa_builder = cranelift_native::builder().map_err(|e| {
            Error::Compile(format!("the host CPU is not supported by Cranelift: {e}"))
        })?;
        for (k, v) in overrides {
            isa_builder
                .set(k, v)
                .map_err(|e| Error::Internal(format!("cranelift ISA setting {k}={v}: {e}")))?;
        }
        let isa = isa_builder
            .finish(flags)
            .map_err(|e| Error::Internal(format!("building the Cranelift ISA: {e}")))?;
        let has_fma = isa
            .isa_flags()
            .iter()
            .any(|f| f.name == "has_fma" && f.as_bool() == Some(true));
        Ok(CraneliftBackend {
            target: Target::cpu(),
            isa,
            disassemble: std::env::var_os("RIVET_DUMP").is_some(),
            keep_clif: true,
            checked: false,
            has_fma,
        })
    }

    /// The backend in checked mode: it compiles unflattened functions and checks every index
    /// of every load and store at run time.
    pub fn checked(mut self, on: bool) -> Self {
        self.checked = on;
        self
    }

    /// Whether kernels keep a copy of their CLIF (see the field).
    pub fn keep_clif(mut self, on: bool) -> Self {
        self.keep_clif = on;
        self
    }

    /// Whether kernels keep their disassembly (`CraneliftKernel::disassembly`); on by default
    /// only when `RIVET_DUMP` is set.
    pub fn set_disassembly(&mut self, on: bool) {
        self.disassemble = on;
    }

    /// Like `Backend::compile`, with the concrete kernel type (gives access to the
    /// disassembly).
    pub fn compile_kernel(&self, func: &PrimFunc) -> Result<CraneliftKernel> {
        // Generated code trusts the IR (scoping, types, one index per access): check it.
        phase("verify", || crate::ir::verify::verify(func, !self.checked))?;
        self.compile_growing(func, JIT_ARENA_BYTES)
    }

    /// Refuses a function scheduled for a GPU (before anything else reads it).
    fn refuse_gpu(func: &PrimFunc) -> Result<()> {
        if crate::ir::verify::gpu::uses_gpu(func) {
            return Err(Error::Compile(format!(
                "function '{}' is scheduled for a GPU (loops bound to block or thread indices, shared memory or barriers): target 'cpu' cannot run it; build it for target 'cuda', or 'interp' to run its GPU semantics on the CPU",
                func.name
            )));
        }
        Ok(())
    }

    /// Compiles `func` (verified) in a region of `arena` bytes, and again in one 16 times
    /// larger while the region is too small, up to `JIT_ARENA_MAX`: a small region first,
    /// since many modules stay alive and processes may run under an address-space limit.
    fn compile_growing(&self, func: &PrimFunc, mut arena: usize) -> Result<CraneliftKernel> {
        loop {
            match self.compile_in(func, arena) {
                Err(e) if arena < JIT_ARENA_MAX && e.to_string().contains(ARENA_EXHAUSTED) => {
                    arena *= 16
                }
                r => return r,
            }
        }
    }

    /// `compile_kernel` after the verifier, with `arena_bytes` reserved for the module.
    fn compile_in(&self, func: &PrimFunc, arena_bytes: usize) -> Result<CraneliftKernel> {
        let module = phase("JIT module setup", || -> Result<JITModule> {
            let mut jb = JITBuilder::with_isa(self.isa.clone(), default_libcall_names());
            // A module's functions call each other PC-relative (+-2 GiB): one contiguous
            // reserved region per module keeps them in reach. The default provider took each
            // piece from the system allocator, and with many modules alive (the build cache)
            // two pieces of one module landed more than 2 GiB apart: a panic in
            // cranelift-jit's relocation. Address space only; pages are committed as used.
            let arena = ArenaMemoryProvider::new_with_size(arena_bytes).map_err(|e| {
                Error::Internal(format!("reserving {arena_bytes} bytes for JIT code: {e}"))
            })?;
            jb.memory_provider(Box::new(arena));
            for (name, addr) in crate::codegen::cpu_lib::math::symbols() {
                jb.symbol(name, addr);
            }
            for (name, addr) in helpers::symbols().into_iter().chain(callback::symbols()) {
                jb.symbol(name, addr);
            }
            for (name, addr) in intrin::symbols(func)? {
                jb.symbol(name, addr);
            }
            // Cranelift lowers `fma` to a libcall of `fmaf` / `fma` on an ISA without FMA: bind
            // them here (the JIT would otherwise fail to resolve them).
            jb.symbol(
                "fmaf",
                crate::codegen::cpu_lib::math::ffi::fmaf as *const u8,
            );
            jb.symbol("fma", crate::codegen::cpu_lib::math::ffi::fma as *const u8);
            Ok(JITModule::new(jb))
        })?;
        let callbacks = Box::new(callback::CallbackTable::new(func));
        let mut cx = Compiler {
            module,
            func,
            callback_table: &*callbacks as *const callback::CallbackTable as usize,
            helper_ids: HashMap::new(),
            disassemble: self.disassemble,
            keep_clif: self.keep_clif,
            bodies: Vec::new(),
            n_bodies: 0,
            checked: self.checked,
            has_fma: self.has_fma,
            sites: Vec::new(),
            param_slot: HashMap::new(),
            int_slot: HashMap::new(),
        };
        let (entry_id, entry_text) = phase("generate and compile functions", || cx.gen_entry())?;
        let Compiler {
            mut module,
            bodies,
            sites,
            ..
        } = cx;
        phase("finalize", || {
            module
                .finalize_definitions()
                .map_err(|e| Error::Internal(format!("cranelift finalize: {e}")))
        })?;
        let code = module.get_finalized_function(entry_id);
        // SAFETY: `code` is the finalised entry function, generated with exactly this signature
        // (two pointer parameters, an i32 result, the host's default C calling convention).
        let entry = unsafe { std::mem::transmute::<*const u8, EntryFn>(code) };
        let mut disasm = entry_text.disasm;
        let mut clif: Vec<_> = entry_text.clif.into_iter().collect();
        for b in bodies {
            clif.extend(b.clif);
            disasm.push('\n');
            disasm.push_str(&b.disasm);
        }
        Ok(CraneliftKernel {
            _module: OwnedModule(Some(module)),
            _callbacks: callbacks,
            entry,
            n_ptrs: func.params.len(),
            n_ints: int_slots(func).len(),
            name: func.name.clone(),
            sites,
            clif,
            disasm,
            backend: (!self.keep_clif).then(|| self.clone()),
        })
    }
}

impl Backend for CraneliftBackend {
    fn target(&self) -> &Target {
        &self.target
    }
    fn compile(&self, func: &PrimFunc) -> Result<Box<dyn Kernel>> {
        Self::refuse_gpu(func)?;
        Ok(Box::new(self.compile_kernel(func)?))
    }

    fn compile_verified(&self, func: &PrimFunc) -> Result<Box<dyn Kernel>> {
        Self::refuse_gpu(func)?;
        Ok(Box::new(self.compile_growing(func, JIT_ARENA_BYTES)?))
    }
}

type EntryFn = unsafe extern "C" fn(*const *mut u8, *const i64) -> i32;

/// Owns the JIT memory of a kernel and frees it on drop.
struct OwnedModule(Option<JITModule>);

impl Drop for OwnedModule {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            // SAFETY: the module's code is only reachable through the `CraneliftKernel` that
            // owns this wrapper (its `entry` pointer), which is being dropped; no call into it
            // can be running, since `launch` borrows the kernel.
            unsafe { m.free_memory() }
        }
    }
}

// SAFETY: after `finalize_definitions` the module is never used again except to be freed on
// drop: launches only call the finalised, immutable machine code through `entry`. The
// non-thread-safe parts of `JITModule` (its symbol-table `RefCell`, raw pointers to its code
// memory) are therefore never touched concurrently.
unsafe impl Send for OwnedModule {}
// SAFETY: as above, shared references to the module are never used.
unsafe impl Sync for OwnedModule {}

/// A kernel compiled by Cranelift.
pub struct CraneliftKernel {
    entry: EntryFn,
    n_ptrs: usize,
    n_ints: usize,
    name: String,
    /// Checked mode: the buffer name of each access site (`Fault::OutOfBounds::site`).
    sites: Vec<String>,
    /// Every generated function's CLIF (title, function), formatted by `source()`; empty
    /// when the backend did not keep it (`keep_clif`).
    clif: Vec<(String, cranelift_codegen::ir::Function)>,
    disasm: String,
    /// The backend that compiled this kernel, when it kept no CLIF: `source_from` compiles
    /// the function again with it, keeping the CLIF this time (the same settings and
    /// function give the same CLIF).
    backend: Option<CraneliftBackend>,
    // Owns the code `entry` points to (only ever dropped).
    _module: OwnedModule,
    /// The host callbacks the code calls; its address is a constant in the code.
    _callbacks: Box<callback::CallbackTable>,
}

impl std::fmt::Debug for CraneliftKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CraneliftKernel")
            .field("n_ptrs", &self.n_ptrs)
            .field("n_ints", &self.n_ints)
            .finish()
    }
}

impl CraneliftKernel {
    /// The machine code of every function, as disassembled by Cranelift (for debugging and for
    /// checking which instructions were selected); only headers unless the backend was asked
    /// to keep it (`set_disassembly`, or `RIVET_DUMP` set).
    pub fn disassembly(&self) -> &str {
        &self.disasm
    }
}

impl Kernel for CraneliftKernel {
    unsafe fn launch(&self, frame: &CallFrame, ctx: &LaunchContext) -> Result<()> {
        // SAFETY: forwarded contract.
        crate::codegen::cpu_lib::launch::run_with_policy(ctx, || unsafe { self.run(frame) })
    }

    fn alloc_output(
        &self,
        shape: &[i64],
        dtype: rivet_runtime::DType,
        _: &LaunchContext,
    ) -> Result<rivet_runtime::Tensor> {
        crate::codegen::cpu_lib::launch::alloc_output(shape, dtype)
    }

    fn host_callbacks(&self) -> Vec<&crate::ir::callback::Callback> {
        self._callbacks.callbacks().collect()
    }

    /// "asm": the disassembly, when the backend kept it (`RIVET_DUMP`, `set_disassembly`).
    fn source_of(&self, kind: &str) -> Option<String> {
        (kind == "asm" && !self.disasm.is_empty()).then(|| self.disasm.clone())
    }

    fn source_from(&self, func: &PrimFunc) -> String {
        match &self.backend {
            None => self.source(),
            Some(b) => match b
                .clone()
                .keep_clif(true)
                .compile_growing(func, JIT_ARENA_BYTES)
            {
                Ok(k) => k.source(),
                Err(e) => format!("; the CLIF could not be generated again: {e}"),
            },
        }
    }

    fn source(&self) -> String {
        if self.backend.is_some() {
            return "; CLIF not kept by this kernel's backend (`keep_clif`): ask the module \
                    (`get_source`), which generates it again from the function"
                .into();
        }
        let texts: Vec<String> = self
            .clif
            .iter()
            .map(|(title, f)| format!("; {title}\n{}", f.display()))
            .collect();
        texts.join("\n")
    }
}

impl CraneliftKernel {
    /// Calls the entry function on `frame` on this thread and turns a fault into its error.
    ///
    /// # Safety
    /// As `Kernel::launch`.
    unsafe fn run(&self, frame: &CallFrame) -> Result<()> {
        if frame.ptrs.len() != self.n_ptrs || frame.ints.len() != self.n_ints {
            return Err(Error::Internal(format!(
                "call frame has {} pointers and {} ints; the kernel expects {} and {}",
                frame.ptrs.len(),
                frame.ints.len(),
                self.n_ptrs,
                self.n_ints
            )));
        }
        // A fault left by an earlier launch on this thread is not this launch's. The callback
        // error needs no such clearing: a callback records it only on a failure, which makes
        // the launch fail, and every failed launch takes it below (whatever its fault), so
        // none outlives its launch; skipping it saves a thread-local lookup per call.
        helpers::take_fault();
        // SAFETY: the entry function follows the CallFrame ABI; the frame has the expected
        // number of entries (checked above) and the caller guarantees (`launch`'s contract)
        // that the pointers address memory matching the buffers under these ints.
        let status = unsafe { (self.entry)(frame.ptrs.as_ptr(), frame.ints.as_ptr()) };
        if status == 0 {
            return Ok(());
        }
        use rivet_runtime::Error as R;
        let name = &self.name;
        let callback_error = callback::take_callback_error();
        Err(match helpers::take_fault() {
            // The callback's own error, unchanged (a Python exception stays that exception).
            Some(helpers::Fault::Callback) => match callback_error {
                Some(e) => Error::Runtime(e),
                None => Error::Internal(format!("{name}: a callback failed without an error")),
            },
            Some(helpers::Fault::Alloc { bytes }) => Error::Runtime(R::Memory(format!(
                "{name}: a temporary buffer of {bytes} bytes could not be allocated (over rivet.MAX_ALLOC_BYTES = {}, or refused by the system)",
                crate::ir::limits::MAX_ALLOC_BYTES
            ))),
            Some(helpers::Fault::OutOfBounds {
                site,
                dim,
                index,
                extent,
            }) => Error::Runtime(R::Index(format!(
                "{name}: checked mode caught an out-of-bounds access: tensor '{}' dim {dim}: index {index} is outside [0, {extent})",
                usize::try_from(site)
                    .ok()
                    .and_then(|s| self.sites.get(s))
                    .map(String::as_str)
                    .unwrap_or("?")
            ))),
            None => Error::Internal(format!(
                "{name}: generated code failed without recording why (status {status})"
            )),
        })
    }
}

/// One generated function: its CLIF before compilation (formatted only when asked for:
/// printing every function on every build cost more than compiling some of them), its title,
/// and its disassembly when asked for at build.
struct FuncText {
    clif: Option<(String, cranelift_codegen::ir::Function)>,
    disasm: String,
}

/// State shared by all functions of one kernel.
struct Compiler<'f> {
    module: JITModule,
    func: &'f PrimFunc,
    /// Helper functions declared in the module, by symbol.
    helper_ids: HashMap<&'static str, FuncId>,
    /// The address of the kernel's `callback::CallbackTable`.
    callback_table: usize,
    disassemble: bool,
    /// Keep each function's CLIF (`CraneliftBackend::keep_clif`).
    keep_clif: bool,
    /// Texts of the outlined parallel bodies, in order of generation.
    bodies: Vec<FuncText>,
    n_bodies: usize,
    /// Checked mode (see the module header).
    checked: bool,
    /// The ISA has FMA: a packed `Fma` is one `vfmadd` (else lane by lane, `vector.rs`).
    has_fma: bool,
    /// Checked mode: the buffer name of each access site, by site id.
    sites: Vec<String>,
    /// Frame positions of the parameters and of the int slots (filled on first use).
    param_slot: HashMap<BufId, usize>,
    int_slot: HashMap<u32, usize>,
}

fn cl_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Internal(format!("cranelift: {what}: {e:?}"))
}

impl<'f> Compiler<'f> {
    fn name(&self) -> String {
        if self.func.name.is_empty() {
            "kernel".into()
        } else {
            self.func.name.clone()
        }
    }

    /// Declares, builds and defines the entry function.
    fn gen_entry(&mut self) -> Result<(FuncId, FuncText)> {
        let mut sig = self.module.make_signature();
        sig.params.push(AbiParam::new(PTR));
        sig.params.push(AbiParam::new(PTR));
        sig.returns.push(AbiParam::new(types::I32));
        let name = self.name();
        let id = self
            .module
            .declare_function(&name, Linkage::Export, &sig)
            .map_err(|e| cl_err("declare", e))?;
        let mut ctx = self.module.make_context();
        ctx.func.signature = sig;
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        let mut fctx = FunctionBuilderContext::new();
        let config = self.module.target_config();
        let func = self.func;
        {
            let b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let mut g = FnGen::new(b, self, false);
            let block = g.b.create_block();
            g.b.append_block_params_for_function_params(block);
            g.b.switch_to_block(block);
            g.b.seal_block(block);
            let ptrs = g.b.block_params(block)[0];
            let ints = g.b.block_params(block)[1];
            g.frame = Some((ptrs, ints));
            g.frame_stmt(&func.body)?;
            let ok = g.iconst(types::I32, 0);
            g.b.ins().return_(&[ok]);
            g.b.seal_all_blocks();
            g.b.finalize(config);
        }
        let text = self.define(id, &format!("{name} (entry)"), &mut ctx)?;
        Ok((id, text))
    }

    /// Compiles a finished function into the module; returns its texts.
    fn define(&mut self, id: FuncId, title: &str, ctx: &mut Context) -> Result<FuncText> {
        let clif = self
            .keep_clif
            .then(|| (title.to_string(), ctx.func.clone()));
        ctx.set_disasm(self.disassemble);
        crate::build_times::phase_named(
            || format!("cranelift compile {title}"),
            || {
                self.module.define_function(id, ctx).map_err(|e| match e {
                    cranelift_module::ModuleError::Compilation(
                        cranelift_codegen::CodegenError::Verifier(errs),
                    ) => Error::Internal(format!(
                        "cranelift verifier rejected generated code for {title}:\n{}",
                        cranelift_codegen::print_errors::pretty_verifier_error(
                            &ctx.func, None, errs
                        )
                    )),
                    other => cl_err(&format!("compiling {title}"), other),
                })
            },
        )?;
        let disasm = ctx
            .compiled_code()
            .and_then(|c| c.vcode.clone())
            .unwrap_or_default();
        let disasm = format!("; {title}\n{disasm}");
        self.module.clear_context(ctx);
        Ok(FuncText { clif, disasm })
    }

    /// The module-level id of helper `name`, declared on first use.
    fn helper_id(&mut self, name: &'static str, params: &[Type], rets: &[Type]) -> Result<FuncId> {
        if let Some(id) = self.helper_ids.get(name) {
            return Ok(*id);
        }
        let mut sig = self.module.make_signature();
        sig.params.extend(params.iter().map(|t| AbiParam::new(*t)));
        sig.returns.extend(rets.iter().map(|t| AbiParam::new(*t)));
        let id = self
            .module
            .declare_function(name, Linkage::Import, &sig)
            .map_err(|e| cl_err("declare helper", e))?;
        self.helper_ids.insert(name, id);
        Ok(id)
    }
}

/// Bindings made by `FnGen::load_frame`, with the ones they shadowed.
#[derive(Default)]
struct FrameBindings {
    bufs: Vec<(BufId, Option<Variable>)>,
    vars: Vec<(u32, Option<(Variable, Type)>)>,
}

/// The generator of one Cranelift function: the builder plus the scope of IR variables and
/// buffers.
struct FnGen<'a, 'f> {
    b: FunctionBuilder<'a>,
    cx: &'a mut Compiler<'f>,
    func: &'f PrimFunc,
    /// IR variables in scope (by `Var::id`): the Cranelift variable and its type.
    vars: HashMap<u32, (Variable, Type)>,
    /// Buffers in scope: the variable holding the address of element 0.
    bufs: HashMap<BufId, Variable>,
    /// Helpers imported into this function.
    frefs: HashMap<&'static str, FuncRef>,
    /// True in an outlined parallel body (nested parallel loops run serially there).
    in_body: bool,
    /// Entry function: the frame's pointer and int arrays. Each top-level statement loads
    /// the parameters and ints it uses from them (`frame_stmt`), so no value is live across
    /// the whole function: with one binding per parameter made at entry, a module of N
    /// sequential nests had O(N^2) live ranges, and register allocation time and memory with
    /// them.
    frame: Option<(cranelift_codegen::ir::Value, cranelift_codegen::ir::Value)>,
    /// Variables whose scope ended, by type, for reuse (`fresh_var`).
    free_vars: HashMap<Type, Vec<Variable>>,
    /// Local buffers allocated and not yet freed at the current point: (address, bytes). A
    /// failure exit frees them.
    live_allocs: Vec<stmt::Live>,
    /// The entry function's root locals in scope (`stmt::allocate_root`): where each one's
    /// memory is, and each one's strides, for `load_frame` to bind per statement.
    root_homes: HashMap<BufId, stmt::Home>,
    root_strides: HashMap<u32, stmt::StrideHome>,
    /// Bytes of local buffers placed in this function's stack frame (`stmt::allocate`).
    stack_bytes: u32,
    /// One-element locals held in a Cranelift variable instead of memory (`stmt::allocate`:
    /// reduction accumulators), by buffer id.
    reg_locals: HashMap<BufId, Variable>,
    /// Values computed for the vector statement being generated, by node address and lane
    /// (`vector.rs`); emptied before and after each one.
    vmemo: HashMap<(usize, u32), cranelift_codegen::ir::Value>,
    /// The loads the vector statement being generated makes in every lane whatever its
    /// selects choose (`lower::vectorize::eager_loads`): such a load under a select arm reads
    /// nothing the scalar loop would not have read (`vector.rs`, `may_fault`).
    eager: Vec<(BufId, Vec<Expr>)>,
    /// Loop-invariant broadcast values computed before the loop running now (`hoist.rs`), by
    /// the address of their expression node.
    hoisted: HashMap<usize, cranelift_codegen::ir::Value>,
    /// Loop-carried vectors held in registers while their loop runs (`hoist::loop_carried`):
    /// buffer, index (a contiguous ramp), the variable.
    promoted: Vec<(BufId, crate::ir::Expr, Variable)>,
    /// The variables of the counted loops being generated, innermost last (`load_flags`).
    loop_vars: Vec<crate::ir::Var>,
    /// The input parameters (`load_flags`).
    readonly: std::collections::HashSet<BufId>,
}

impl<'a, 'f> FnGen<'a, 'f> {
    fn new(b: FunctionBuilder<'a>, cx: &'a mut Compiler<'f>, in_body: bool) -> Self {
        let func = cx.func;
        FnGen {
            b,
            cx,
            func,
            vars: HashMap::new(),
            bufs: HashMap::new(),
            frefs: HashMap::new(),
            in_body,
            frame: None,
            live_allocs: Vec::new(),
            root_homes: HashMap::new(),
            root_strides: HashMap::new(),
            free_vars: HashMap::new(),
            stack_bytes: 0,
            reg_locals: HashMap::new(),
            vmemo: HashMap::new(),
            eager: Vec::new(),
            hoisted: HashMap::new(),
            promoted: Vec::new(),
            loop_vars: Vec::new(),
            readonly: expr::readonly_inputs(func),
        }
    }

    /// A statement of the entry function at top level (under sequences and allocations):
    /// loads what it uses from the frame, generates it, and drops those bindings again.
    fn frame_stmt(&mut self, s: &crate::ir::Stmt) -> Result<()> {
        use crate::ir::Stmt;
        match s {
            Stmt::Seq(v) => v.iter().try_for_each(|x| self.frame_stmt(x)),
            Stmt::Allocate { bufs, body } => self.allocate_root(bufs, body),
            other => {
                let olds = self.load_frame(other, &[])?;
                let r = self.stmt(other);
                self.unload_frame(olds);
                r
            }
        }
    }

    /// Binds the parameters and frame ints that `s` (and the expressions `extra`) use,
    /// loaded from the frame; returns what to restore.
    fn load_frame(
        &mut self,
        s: &crate::ir::Stmt,
        extra: &[crate::ir::Expr],
    ) -> Result<FrameBindings> {
        let (ptrs, ints) = self
            .frame
            .ok_or_else(|| Error::Internal("frame_stmt outside the entry function".into()))?;
        let mut bufs = std::collections::BTreeSet::new();
        let mut vars = std::collections::BTreeSet::new();
        crate::ir::uses::uses(s, self.func, &mut bufs, &mut vars);
        for e in extra {
            e.visit(&mut |n| {
                if let Some(v) = n.as_var() {
                    vars.insert(v.id);
                }
            });
        }
        // Slot positions by id, computed once per kernel: work per statement is linear in
        // what the statement references, not in the number of parameters.
        if self.cx.param_slot.is_empty() && self.cx.int_slot.is_empty() {
            let func = self.func;
            self.cx.param_slot = func
                .params
                .iter()
                .enumerate()
                .map(|(k, id)| (*id, k))
                .collect();
            self.cx.int_slot = int_slots(func)
                .iter()
                .enumerate()
                .map(|(k, v)| (v.id, k))
                .collect();
        }
        let mut out = FrameBindings::default();
        for id in bufs {
            let p = if let Some(&k) = self.cx.param_slot.get(&id) {
                self.b.ins().load(PTR, expr::flags(), ptrs, (8 * k) as i32)
            } else if let Some(home) = self.root_homes.get(&id).copied() {
                match home {
                    stmt::Home::Stack(slot) => self.b.ins().stack_addr(PTR, slot, 0),
                    stmt::Home::Heap { table, k } => {
                        self.b.ins().load(PTR, expr::flags(), table, (8 * k) as i32)
                    }
                }
            } else {
                continue;
            };
            out.bufs.push((id, self.bind_buf(id, p)));
        }
        for id in vars {
            let x = if let Some(&k) = self.cx.int_slot.get(&id) {
                self.b
                    .ins()
                    .load(types::I64, expr::flags(), ints, (8 * k) as i32)
            } else if let Some(home) = self.root_strides.get(&id).copied() {
                match home {
                    stmt::StrideHome::Const(c) => self.iconst(types::I64, c),
                    stmt::StrideHome::Table { table, k } => {
                        self.b
                            .ins()
                            .load(types::I64, expr::flags(), table, (8 * k) as i32)
                    }
                }
            } else {
                continue;
            };
            out.vars.push((id, self.bind_var(id, x)));
        }
        Ok(out)
    }

    fn unload_frame(&mut self, b: FrameBindings) {
        for (id, old) in b.vars.into_iter().rev() {
            self.restore_var(id, old);
        }
        for (id, old) in b.bufs.into_iter().rev() {
            self.restore_buf(id, old);
        }
    }

    /// When `bad` (an `i8` truth value) holds: calls `report` (a helper recording the fault,
    /// if any), frees the live local buffers and returns status 1. Continues in a new block.
    fn fail_if(
        &mut self,
        bad: cranelift_codegen::ir::Value,
        report: Option<(&'static str, Vec<cranelift_codegen::ir::Value>)>,
    ) -> Result<()> {
        let fail = self.b.create_block();
        let cont = self.b.create_block();
        self.b.set_cold_block(fail);
        self.b.ins().brif(bad, fail, &[], cont, &[]);
        self.b.seal_block(fail);
        self.b.seal_block(cont);
        self.b.switch_to_block(fail);
        if let Some((name, args)) = report {
            let params = vec![types::I64; args.len()];
            self.call(name, &params, &[], &args)?;
        }
        for live in self.live_allocs.clone().into_iter().rev() {
            match live {
                stmt::Live::Block(ptr, bytes) => {
                    self.call("rivet_free", &[PTR, types::I64], &[], &[ptr, bytes])?;
                }
                stmt::Live::Table { count: 0, .. } => {}
                stmt::Live::Table { table, count } => {
                    let n = self.iconst(types::I64, count as i64);
                    self.call("rivet_free_n", &[PTR, types::I64], &[], &[table, n])?;
                }
            }
        }
        let one = self.iconst(types::I32, 1);
        self.b.ins().return_(&[one]);
        self.b.switch_to_block(cont);
        Ok(())
    }

    /// Binds IR variable `id` to `val` (in a fresh Cranelift variable); returns the previous
    /// binding, to restore when the scope ends.
    /// A Cranelift variable of type `ty`, reused from a scope that ended when possible: the
    /// SSA builder keeps a table per variable as long as the blocks it was defined in, so a
    /// fresh variable per binding costs O(bindings x blocks) memory in long functions.
    fn fresh_var(&mut self, ty: Type) -> Variable {
        match self.free_vars.get_mut(&ty).and_then(|v| v.pop()) {
            Some(v) => v,
            None => self.b.declare_var(ty),
        }
    }

    fn bind_var(&mut self, id: u32, val: cranelift_codegen::ir::Value) -> Option<(Variable, Type)> {
        let ty = self.b.func.dfg.value_type(val);
        let v = self.fresh_var(ty);
        self.b.def_var(v, val);
        self.vars.insert(id, (v, ty))
    }

    fn restore_var(&mut self, id: u32, old: Option<(Variable, Type)>) {
        let ended = match old {
            Some(o) => self.vars.insert(id, o),
            None => self.vars.remove(&id),
        };
        if let Some((v, ty)) = ended {
            self.free_vars.entry(ty).or_default().push(v);
        }
    }

    fn bind_buf(&mut self, id: BufId, ptr: cranelift_codegen::ir::Value) -> Option<Variable> {
        let v = self.fresh_var(PTR);
        self.b.def_var(v, ptr);
        self.bufs.insert(id, v)
    }

    fn restore_buf(&mut self, id: BufId, old: Option<Variable>) {
        let ended = match old {
            Some(o) => self.bufs.insert(id, o),
            None => self.bufs.remove(&id),
        };
        if let Some(v) = ended {
            self.free_vars.entry(PTR).or_default().push(v);
        }
    }

    /// Calls helper `name` (declared with the given signature) and returns its results.
    fn call(
        &mut self,
        name: &'static str,
        params: &[Type],
        rets: &[Type],
        args: &[cranelift_codegen::ir::Value],
    ) -> Result<Vec<cranelift_codegen::ir::Value>> {
        let fref = match self.frefs.get(name) {
            Some(f) => *f,
            None => {
                let id = self.cx.helper_id(name, params, rets)?;
                let f = self.cx.module.declare_func_in_func(id, self.b.func);
                self.frefs.insert(name, f);
                f
            }
        };
        let inst = self.b.ins().call(fref, args);
        Ok(self.b.inst_results(inst).to_vec())
    }

    fn call1(
        &mut self,
        name: &'static str,
        params: &[Type],
        ret: Type,
        args: &[cranelift_codegen::ir::Value],
    ) -> Result<cranelift_codegen::ir::Value> {
        Ok(self.call(name, params, &[ret], args)?[0])
    }
}
