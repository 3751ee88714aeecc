//! The pipeline: schedule -> lowered IR -> backend kernel -> a compiled artefact (`Module`).
//! `build` chooses the schedule to compile (the default schedule, else the schedule as
//! written: `compile_schedule`, the one place that decides), lowers and compiles it; loading
//! a saved module (`Module::load`) runs the same passes from the saved loop nest
//! (`compile_loaded`). Calling what comes out is `call`'s; the artefact is `artifact`'s.
//!
//! Invariants: every function the pipeline returns was verified, proven and compiled here, on
//! a thread of its own with a large stack (`limits::COMPILE_STACK`), so the recursion of the
//! passes over deep (but within-limit) expressions never reaches the end of a caller's small
//! stack. A temporary whose size is known at build time and too large is refused here, the
//! others on each call.

use crate::artifact::recipe::Recipe;
use crate::artifact::{file, Compiled, Module};
use crate::build_cache;
use crate::build_times::phase;
use crate::call::allocate::temp_fits;
use crate::error::{Error, Result};
use crate::ir::expr::Expr;
use crate::ir::limits::COMPILE_STACK;
use crate::ir::stmt::{BufKind, PrimFunc};
use crate::lower;
use crate::schedule::{cpu_default, gpu_default, Schedule};
use crate::target::{Target, TargetKind, ToTarget};
use crate::te::Tensor as TeTensor;
use std::path::Path;
use std::sync::Arc;

pub use crate::lower::Options;

/// Runs `f` on a thread with `COMPILE_STACK` bytes of stack (panics propagate).
fn on_compile_stack<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|s| {
        let h = std::thread::Builder::new()
            .name("rivet-compile".into())
            .stack_size(COMPILE_STACK)
            .spawn_scoped(s, f)
            .map_err(|e| {
                Error::Runtime(rivet_runtime::Error::Memory(format!(
                    "cannot start the compiler thread: {e}"
                )))
            })?;
        h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Lowers and compiles a schedule: `args` lists inputs and outputs in call order.
/// `target` is a `Target` or its spelling (`"cpu"`, `"interp"`, `"cuda -arch=sm_90"`).
///
/// ```
/// use rivet_compiler::{build, te, Schedule};
/// use rivet_runtime::{DType, Tensor, Value};
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder([&n], DType::F32, "X")?;
/// let y = te::compute([&n], |[i]| te::maximum(x.at([i]), 0.0), "Y")?;
/// let module = build(&Schedule::new(&[&y])?, &[&x, &y], "cpu", "relu")?;
/// let relu = module.get_function("relu")?;
/// let a = Tensor::from_slice(&[-1.0f32, 2.0, -3.0], &[3])?;
/// // Inputs only: the output is allocated (its shape from the inputs') and returned.
/// let Value::Tensor(b) = relu.call(&[a.into()])? else { unreachable!() };
/// assert_eq!(b.to_vec::<f32>()?, [0.0, 2.0, 0.0]);
/// // An argument that is not a tensor the program can read is an error, not a build:
/// let z = te::placeholder([&n], DType::F32, "Z")?;
/// assert!(build(&Schedule::new(&[&y])?, &[&z, &y], "cpu", "bad").is_err());
/// # Ok(())
/// # }
/// ```
pub fn build<T: ToTarget + ?Sized, A: std::borrow::Borrow<TeTensor>>(
    sched: &Schedule,
    args: &[A],
    target: &T,
    name: &str,
) -> Result<Module> {
    let args: Vec<TeTensor> = args.iter().map(|t| t.borrow().clone()).collect();
    build_with(sched, &args, target, name, Options::from_env())
}

/// `build` with explicit options.
pub fn build_with<T: ToTarget + ?Sized>(
    sched: &Schedule,
    args: &[TeTensor],
    target: &T,
    name: &str,
    opts: Options,
) -> Result<Module> {
    phase("build", || build_timed(sched, args, target, name, opts))
}

fn build_timed<T: ToTarget + ?Sized>(
    sched: &Schedule,
    args: &[TeTensor],
    target: &T,
    name: &str,
    opts: Options,
) -> Result<Module> {
    let target = target.to_target()?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
    {
        return Err(Error::Compile(format!(
            "build: name '{name}' must be non-empty letters, digits, '_' or '.'"
        )));
    }
    if target.kind == TargetKind::Cuda {
        let stages = sched.post_order();
        let with_cb = sched
            .stages
            .iter()
            .filter(|st| !st.taps.is_empty())
            .map(|st| &st.tensor);
        if let Some(t) = stages
            .iter()
            .filter(|t| t.is_extern())
            .chain(with_cb)
            .next()
        {
            return Err(refuse_gpu_callback(t.name()));
        }
    }
    let fuse_rows = std::env::var("RIVET_FUSE_ROWS").map_or(true, |v| v != "0");
    // The same program built the same way before in this process: its module (the key is
    // the program's whole content, see `build_cache`). A hit skips the size check below:
    // the same content passed it when it was built.
    let key = match target.kind {
        TargetKind::Cpu | TargetKind::Interp if build_cache::enabled() => {
            phase("cache key", || {
                build_cache::key::encode(sched, args, &target, name, opts, fuse_rows)
            })
        }
        _ => None,
    };
    if let Some(m) = key.as_ref().and_then(|k| build_cache::lock().get(k)) {
        return Ok(m);
    }
    // Oversized expressions are refused first: the defaults' rewrites walk stage bodies as
    // trees.
    phase("check expression sizes", || {
        crate::lower::nest::check_expr_sizes(sched)
    })?;
    let mut c = phase("compile", || {
        compile_schedule(sched, args, &target, name, opts, fuse_rows)
    })?;
    // What the function was built from, for the functions derived from it (`backward`).
    c.recipe = Some(Recipe::new(args, &target, opts));
    let m = Module {
        funcs: vec![Arc::new(c)],
    };
    if let Some(k) = key {
        build_cache::lock().insert(k, m.clone());
    }
    Ok(m)
}

/// The default schedule, else the schedule as written: the one place that chooses. A schedule
/// that binds nothing gets the default GPU schedule on a GPU target
/// (`schedule::gpu_default`); one left untouched gets the default CPU schedule on the CPU
/// (`schedule::cpu_default`) unless the options ask for the schedule as written; anything
/// else is compiled as written.
fn compile_schedule(
    sched: &Schedule,
    args: &[TeTensor],
    target: &Target,
    name: &str,
    opts: Options,
    fuse_rows: bool,
) -> Result<Compiled> {
    let compile = |sched: &Schedule, opts: Options| {
        on_compile_stack(|| {
            compile_here(lower::Source::Schedule { sched, args, name }, target, opts)
        })
    };
    match target.kind {
        TargetKind::Cuda if !gpu_default::binds_anything(sched) => {
            let mut s = sched.clone();
            gpu_default::apply_default_gpu(&mut s)?;
            compile(&s, opts)
        }
        TargetKind::Cpu if !opts.as_written => {
            let mut s = phase("clone schedule", || sched.clone());
            phase("default CPU schedule", || {
                cpu_default::apply_default_cpu(&mut s)
            })?;
            // A program the default cannot build (a dim no argument binds, an access proven
            // out of bounds, a temporary over the limit...) is built as written: the error, if
            // any, then names the user's stages and indices, never the default's packed or
            // lane stages.
            let fused = lower::Options { fuse_rows, ..opts };
            match compile(&s, fused) {
                Ok(c) => Ok(c),
                // A bug in the default schedule or a pass is reported, never hidden behind the
                // slower as-written build (a vectorizer rule out of step with the code
                // generator's once built every relu backward as plain scalar loops, silently).
                Err(e @ Error::Internal(_)) => Err(e),
                Err(_) => compile(sched, opts),
            }
        }
        _ => compile(sched, opts),
    }
}

/// Verifies, lowers and compiles a loop-nest function read from a file (options from the
/// environment).
pub fn compile_loaded(nest: PrimFunc, target: &Target) -> Result<Compiled> {
    if let (TargetKind::Cuda, Some(cb)) = (target.kind, nest.callbacks.first()) {
        return Err(refuse_gpu_callback(&cb.stage));
    }
    let opts = Options::from_env();
    on_compile_stack(|| compile_here(lower::Source::Loaded(nest), target, opts))
}

/// Loading a saved module is the pipeline run again from each function's loop nest
/// (`artifact::file` reads and checks the file, `compile_loaded` compiles).
impl Module {
    /// Parses and re-compiles a module; `origin` names the source in errors. Runs on a
    /// thread with a `COMPILE_STACK` stack (see `artifact::file`).
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Module> {
        file::from_bytes(bytes, origin, compile_loaded)
    }

    pub fn load(path: impl AsRef<Path>) -> Result<Module> {
        file::load(path.as_ref(), compile_loaded)
    }
}

/// Host callbacks run on the CPU, between kernels: not inside CUDA code (yet).
fn refuse_gpu_callback(stage: &str) -> Error {
    Error::Compile(format!(
        "target 'cuda': stage '{stage}' calls a host callback (an extern stage or a debug_tap); host callbacks in device code are not supported yet: build it for target 'cpu' or 'interp'"
    ))
}

fn compile_here(src: lower::Source<'_>, target: &Target, opts: Options) -> Result<Compiled> {
    phase("on the compile thread", || {
        compile_here_timed(src, target, opts)
    })
}

fn compile_here_timed(src: lower::Source<'_>, target: &Target, opts: Options) -> Result<Compiled> {
    let lower::Lowered { nest, func } = phase("lower", || lower::lower(src, target, opts))?;
    let temps = temporaries(&func)?;
    let backend = phase("backend setup", || {
        crate::codegen::backend(target, opts.checked)
    })?;
    // `lower::lower` verified `func` last, as the backend expects it: not again.
    let kernel = phase("backend compile", || backend.compile_verified(&func))?;
    let work = phase("work", || lower::work::Work::of(&func));
    lower::dump(
        &func.name,
        6,
        &format!("{}.src", target.kind_name()),
        || kernel.source_from(&func),
    );
    if let Some(asm) = kernel.source_of("asm") {
        lower::dump(
            &func.name,
            6,
            &format!("{}.asm", target.kind_name()),
            || asm,
        );
    }
    Ok(Compiled {
        work,
        nest,
        func,
        target: target.clone(),
        checked: opts.checked,
        temps,
        kernel,
        recipe: None,
    })
}

/// The local buffers to size before each call; one whose size is known now and too large is
/// refused at build time.
fn temporaries(f: &PrimFunc) -> Result<Vec<(String, Vec<Expr>, usize)>> {
    let mut out = Vec::new();
    for b in f.buffers.iter().filter(|b| b.kind == BufKind::Local) {
        let consts: Option<Vec<i64>> = b.shape.iter().map(|e| e.as_int()).collect();
        if let Some(c) = consts {
            temp_fits(&f.name, &b.name, &c, b.dtype.size())?;
        } else {
            out.push((b.name.clone(), b.shape.clone(), b.dtype.size()));
        }
    }
    Ok(out)
}
