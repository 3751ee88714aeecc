//! `build`: schedule -> lowered IR -> backend kernel -> packed `Function`s in a `Module`.
//!
//! A compiled function is called with all its arguments (outputs written in place, through
//! their own strides) or with only its inputs (outputs allocated, compact, and returned).
//! Before any code runs, a call: checks every argument against the typed signature (dtype,
//! rank, fixed dims, consistent symbolic dims, device, writable and non-overlapping outputs);
//! binds the symbolic dims; checks dims given by expressions (`n - 2`); evaluates the
//! function's bounds checks; sizes its temporaries against `MAX_ALLOC_BYTES`; refuses outputs
//! sharing memory with another argument. Shapes, checks and sizes are evaluated exactly
//! (`arith::exact`): an int64 overflow fails the check, it never wraps into a pass.
//!
//! Lowering and code generation run on a thread of their own with a large stack
//! (`limits::COMPILE_STACK`), so the recursion of the passes over deep (but within-limit)
//! expressions never reaches the end of a caller's small stack.

use crate::arith::exact::{eval_exact, EvalError};
use crate::call_plan::CallPlan;
use crate::codegen::{CallFrame, Kernel, LaunchContext};
use crate::error::{Error, Result};
use crate::ir::expr::{Expr, Var};
use crate::ir::limits::{COMPILE_STACK, MAX_ALLOC_BYTES};
use crate::ir::stmt::{BufKind, PrimFunc};
use crate::lower;
use crate::schedule::Schedule;
use crate::target::{Target, TargetKind, ToTarget};
use crate::te::Tensor as TeTensor;
use rivet_runtime::{
    ArgName, DeviceSpec, Dim, Function, Param, ParamKind, Signature, Tensor, TensorSpec, Value,
};
use std::collections::HashMap;
use std::sync::Arc;

/// One compiled function: its IR before flattening (what modules save), the final IR, and
/// the kernel.
pub struct Compiled {
    /// The loop-nest IR (pass 1 output): saved modules store this and re-run the proof.
    pub nest: PrimFunc,
    pub func: PrimFunc,
    pub target: Target,
    /// Built in checked mode (every access bounds-checked by the kernel).
    pub checked: bool,
    /// Each local buffer (temporary): its name, shape and element size, sized per call.
    pub temps: Vec<(String, Vec<Expr>, usize)>,
    /// The iteration count of the function over its dims (`lower::work`): the CPU policy's
    /// measure of a call's work.
    pub work: lower::work::Work,
    pub kernel: Box<dyn Kernel>,
    /// The te program and options it was built from (`build`; None for a loaded module):
    /// `backward` differentiates it.
    pub source: Option<Arc<crate::backward::Source>>,
}

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

/// A set of compiled functions (one per `build` call, or as many as a loaded file holds).
/// Saved to a file and loaded back (here or from Python's `rivet.load_module`), it is compiled
/// again for the loading machine's CPU.
///
/// ```
/// use rivet_compiler::{build, te, Module, Schedule};
/// use rivet_runtime::DType;
///
/// # fn main() -> rivet_compiler::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder([&n], DType::F64, "X")?;
/// let y = te::compute([&n], |[i]| x.at([i]) + 1.0, "Y")?;
/// let module = build(&Schedule::new(&[&y])?, &[&x, &y], "cpu", "add_one")?;
/// let path = std::env::temp_dir().join(format!("add_one_{}.rivet", std::process::id()));
/// module.save(&path)?;
/// let loaded = Module::load(&path)?;
/// assert_eq!(loaded.function_names(), ["add_one"]);
/// assert!(loaded.get_function("missing").is_err());
/// # std::fs::remove_file(&path).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Module {
    pub funcs: Vec<Arc<Compiled>>,
}

/// The value of a shape or check expression at call time: constants and bare dims directly
/// (the common case, on every call), anything else with the interpreter's semantics, so there
/// is one definition of what an expression means.
/// `lookup` gives a dim's value (`env_lookup` over a map; the call fast path reads its slots).
pub(crate) fn eval_dims(
    e: &Expr,
    lookup: &dyn Fn(&Var) -> Option<i64>,
) -> Result<Result<i64, String>> {
    if let Some(v) = e.as_int() {
        return Ok(Ok(v));
    }
    if let Some(x) = e.as_var().and_then(lookup) {
        return Ok(Ok(x));
    }
    match eval_exact(e, lookup) {
        Ok(v) => Ok(Ok(v)),
        Err(EvalError::Overflow(what)) => Ok(Err(what)),
        Err(EvalError::Unsupported(what)) => Err(Error::Internal(format!(
            "cannot evaluate `{e}` at call time: {what}"
        ))),
    }
}

fn dims_text(f: &PrimFunc, env: &HashMap<Var, i64>) -> String {
    f.dims
        .iter()
        .map(|v| format!("{}={}", v.name, env.get(v).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(", ")
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
    // A schedule that binds nothing gets the default GPU schedule on a GPU target; one left
    // untouched gets the default CPU schedule on the CPU (`schedule::cpu_default`). Oversized
    // expressions are refused first: the defaults' rewrites walk stage bodies as trees.
    crate::lower::nest::check_expr_sizes(sched)?;
    let defaulted;
    let sched = if target.kind == TargetKind::Cuda
        && !crate::schedule::gpu_default::binds_anything(sched)
    {
        let mut s = sched.clone();
        crate::schedule::gpu_default::apply_default_gpu(&mut s)?;
        defaulted = s;
        &defaulted
    } else if target.kind == TargetKind::Cpu && !opts.as_written {
        let mut s = sched.clone();
        crate::schedule::cpu_default::apply_default_cpu(&mut s)?;
        // A program the default cannot build (a dim no argument binds, an access proven out
        // of bounds, a temporary over the limit...) is built as written: the error, if any,
        // then names the user's stages and indices, never the default's packed or lane stages.
        let built = on_compile_stack(|| {
            compile_here(
                lower::Source::Schedule {
                    sched: &s,
                    args,
                    name,
                },
                &target,
                lower::Options {
                    fuse_rows: std::env::var("RIVET_FUSE_ROWS").map_or(true, |v| v != "0"),
                    ..opts
                },
            )
        });
        match built {
            Ok(mut c) => {
                c.source = Some(crate::backward::Source::new(args, &target, opts));
                return Ok(Module {
                    funcs: vec![Arc::new(c)],
                });
            }
            // A bug in the default schedule or a pass is reported, never hidden behind the
            // slower as-written build (a vectorizer rule out of step with the code
            // generator's once built every relu backward as plain scalar loops, silently).
            Err(e @ Error::Internal(_)) => return Err(e),
            Err(_) => {}
        }
        sched
    } else {
        sched
    };
    let mut c = on_compile_stack(|| {
        compile_here(lower::Source::Schedule { sched, args, name }, &target, opts)
    })?;
    c.source = Some(crate::backward::Source::new(args, &target, opts));
    Ok(Module {
        funcs: vec![Arc::new(c)],
    })
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

/// Host callbacks run on the CPU, between kernels: not inside CUDA code (yet).
fn refuse_gpu_callback(stage: &str) -> Error {
    Error::Compile(format!(
        "target 'cuda': stage '{stage}' calls a host callback (an extern stage or a debug_tap); host callbacks in device code are not supported yet: build it for target 'cpu' or 'interp'"
    ))
}

fn compile_here(src: lower::Source<'_>, target: &Target, opts: Options) -> Result<Compiled> {
    let lower::Lowered { nest, func } = lower::lower(src, target, opts)?;
    let temps = temporaries(&func)?;
    let kernel = crate::codegen::backend(target, opts.checked)?.compile(&func)?;
    lower::dump(
        &func.name,
        6,
        &format!("{}.src", target.kind_name()),
        || kernel.source(),
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
        work: lower::work::Work::of(&func),
        nest,
        func,
        target: target.clone(),
        checked: opts.checked,
        temps,
        kernel,
        source: None,
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

/// A temporary of `shape` (negative extents count as 0, as the backends allocate them) of
/// `size`-byte elements is at most `MAX_ALLOC_BYTES`.
pub(crate) fn temp_fits(func: &str, buf: &str, shape: &[i64], size: usize) -> Result<()> {
    let mut bytes: u128 = size as u128;
    for &d in shape {
        bytes = bytes.saturating_mul(d.max(0) as u128);
    }
    if bytes > MAX_ALLOC_BYTES as u128 {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        return Err(Error::Runtime(rivet_runtime::Error::Memory(format!(
            "{func}: temporary '{buf}' of shape ({}) needs {bytes} bytes, over rivet.MAX_ALLOC_BYTES = {MAX_ALLOC_BYTES}",
            dims.join(", ")
        ))));
    }
    Ok(())
}

impl Module {
    pub fn function_names(&self) -> Vec<String> {
        self.funcs.iter().map(|c| c.func.name.clone()).collect()
    }

    /// `mod[name]` / `mod.get_function(name)`.
    pub fn get_function(&self, name: &str) -> Result<Function> {
        let c = self
            .funcs
            .iter()
            .find(|c| c.func.name == name)
            .ok_or_else(|| {
                Error::Runtime(rivet_runtime::Error::NotFound(format!(
                    "module has no function '{name}'; it has: {}",
                    self.function_names().join(", ")
                )))
            })?;
        Ok(make_function(c.clone()))
    }

    /// Generated code: "ir" (final loop IR), "nest" (IR before the proof), "cranelift" / "asm"
    /// (the backend's text).
    pub fn get_source(&self, kind: &str) -> Result<String> {
        let parts: Vec<String> = self
            .funcs
            .iter()
            .map(|c| match kind {
                "ir" | "" => Ok(c.func.to_string()),
                "nest" => Ok(c.nest.to_string()),
                "cranelift" | "clif" | "asm" | "cuda" | "cu" | "ptx" => {
                    match (kind, c.target.kind) {
                        ("ptx", TargetKind::Cuda) => c.kernel.source_of("ptx").ok_or_else(|| {
                            Error::Compile(
                                "get_source('ptx'): no PTX: NVRTC was not found when this module was built (install nvidia-cuda-nvrtc, or set RIVET_NVRTC_PATH)".into(),
                            )
                        }),
                        ("cuda" | "cu", TargetKind::Cuda)
                        | ("cranelift" | "clif" | "asm", TargetKind::Cpu | TargetKind::Interp) => {
                            Ok(c.kernel.source())
                        }
                        _ => Err(Error::Compile(format!(
                            "get_source: a module built for target '{}' has no '{kind}' source",
                            c.target
                        ))),
                    }
                }
                other => Err(Error::Compile(format!(
                    "get_source: unknown kind '{other}'; expected 'ir', 'nest', 'cranelift' (cpu), 'cuda' or 'ptx' (cuda)"
                ))),
            })
            .collect::<Result<_>>()?;
        Ok(parts.join("\n"))
    }
}

fn dim_name(v: &Var, func: &PrimFunc) -> String {
    // Two dims with one name get their id appended so the signature keeps them apart.
    if func.dims.iter().filter(|d| d.name == v.name).count() > 1 {
        format!("{}#{}", v.name, v.id)
    } else {
        v.name.to_string()
    }
}

/// The typed signature of a compiled function, for a CPU target (tensors in host memory).
pub fn signature(func: &PrimFunc) -> Signature {
    signature_on(func, DeviceSpec::Host)
}

/// The typed signature with `device` for every tensor: `Any` for CUDA functions, whose
/// device rule (one CUDA device for all tensors) [`check_devices`] applies.
fn signature_on(func: &PrimFunc, device: DeviceSpec) -> Signature {
    let params = func
        .params
        .iter()
        .map(|id| {
            let b = func.buffer(*id);
            let shape = b
                .shape
                .iter()
                .map(|e| match (e.as_int(), e.as_var()) {
                    (Some(n), _) => Dim::Fixed(n),
                    (None, Some(v)) => Dim::Var(dim_name(v, func)),
                    _ => Dim::Any,
                })
                .collect();
            let output = b.kind == (BufKind::Param { output: true });
            Param::new(
                b.name.clone(),
                ParamKind::Tensor(TensorSpec {
                    dtypes: vec![b.dtype],
                    shape: Some(shape),
                    device,
                    output,
                }),
            )
        })
        .collect();
    Signature::new(params)
}

fn shape_error(msg: String) -> Error {
    Error::Runtime(rivet_runtime::Error::Shape(msg))
}

/// The packed function of a compiled function.
pub fn make_function(c: Arc<Compiled>) -> Function {
    make_function_with(c, true)
}

/// `make_function` without the fast path (`call_plan`): every call takes the full path. For
/// the tests that check the fast path accepts exactly what the full path accepts.
#[doc(hidden)]
pub fn make_function_full_path(c: Arc<Compiled>) -> Function {
    make_function_with(c, false)
}

fn make_function_with(c: Arc<Compiled>, fast: bool) -> Function {
    let device = match c.target.kind {
        TargetKind::Cuda => DeviceSpec::Any,
        _ => DeviceSpec::Host,
    };
    let sig = signature_on(&c.func, device);
    let inputs_sig = Signature::new(
        sig.params
            .iter()
            .filter(|p| matches!(&p.kind, ParamKind::Tensor(t) if !t.output))
            .cloned()
            .collect(),
    );
    let name = c.func.name.clone();
    let body_sig = sig.clone();
    let plan = if fast { CallPlan::new(&c) } else { None };
    let rule_c = c.clone();
    let rule = move |shapes: &[&[i64]]| {
        crate::output_shapes::output_shapes(&rule_c.func, shapes)
            .map_err(rivet_runtime::Error::from)
    };
    let parts: Arc<dyn std::any::Any + Send + Sync> = c.clone();
    Function::with_output_rule(
        name.clone(),
        sig,
        move |args| {
            // Well-formed calls take the precomputed fast path; everything else (including every
            // error) the full one, which words the errors (`call_plan`'s header).
            if let Some(fast) = plan.as_ref().and_then(|p| p.accept(&c, args)) {
                let ctx = LaunchContext {
                    device: fast.device,
                    stream: rivet_runtime::stream::call_stream(),
                    work: fast.work,
                };
                if !fast.nothing_to_do {
                    // SAFETY: the plan made every check of the full path (module header of
                    // `call_plan`) on these arguments.
                    unsafe { c.kernel.launch(&fast.frame, &ctx) }
                        .map_err(rivet_runtime::Error::from)?;
                }
                return Ok(Value::Null);
            }
            call(&c, &name, &body_sig, &inputs_sig, args).map_err(rivet_runtime::Error::from)
        },
        rule,
    )
    // The body holds `c`, the output rule `rule_c`: two handles besides the parts' own.
    .with_parts(parts, 2)
}

/// The device rule of a CUDA function: every tensor argument on one CUDA device. Mixed
/// devices (cpu with cuda, cuda:0 with cuda:1) name the first argument on each of two
/// devices; all on the CPU says the function was built for CUDA. Runs before the signature
/// check, so a device mistake is reported as such and not as the first argument's shape.
fn check_devices(name: &str, sig: &Signature, args: &[Value]) -> Result<()> {
    let device_error = |m: String| Error::Runtime(rivet_runtime::Error::Device(m));
    let arg = |i: usize| ArgName {
        index: i,
        name: sig.params.get(i).map(|p| p.name.as_str()),
    };
    let mut first: Option<(usize, rivet_runtime::Device)> = None;
    for (i, v) in args.iter().enumerate() {
        let Some(t) = v.as_tensor() else { continue };
        match first {
            None => first = Some((i, t.device())),
            Some((j, d)) if d != t.device() => {
                return Err(device_error(format!(
                    "{name}: tensors on different devices: {} is on {d} but {} is on {}; all tensors of a call must be on one CUDA device (rivet does not copy between devices)",
                    arg(j),
                    arg(i),
                    t.device()
                )))
            }
            Some(_) => {}
        }
    }
    match first {
        Some((i, d)) if !matches!(d, rivet_runtime::Device::Cuda(_)) => Err(device_error(format!(
            "{name}: built for 'cuda', called with tensors on {d} ({} and every other tensor); pass CUDA tensors (or build for 'cpu')",
            arg(i)
        ))),
        _ => Ok(()),
    }
}

fn call(
    c: &Compiled,
    name: &str,
    sig: &Signature,
    inputs_sig: &Signature,
    args: &[Value],
) -> Result<Value> {
    let f = &c.func;
    let n_out = f.params.len() - inputs_sig.params.len();
    let allocate =
        args.len() == inputs_sig.params.len() && n_out > 0 && args.len() != f.params.len();
    if c.target.kind == TargetKind::Cuda {
        check_devices(name, if allocate { inputs_sig } else { sig }, args)?;
    }
    if allocate {
        inputs_sig.check(name, args)?;
    } else {
        sig.check(name, args)?;
    }
    // Bind the dims from arguments whose dim is exactly the variable.
    let mut env: HashMap<Var, i64> = HashMap::new();
    let mut inputs = args.iter();
    let mut slots: Vec<Option<Tensor>> = Vec::with_capacity(f.params.len());
    for id in &f.params {
        let b = f.buffer(*id);
        let is_out = b.kind == (BufKind::Param { output: true });
        slots.push(if allocate && is_out {
            None
        } else {
            Some(
                inputs
                    .next()
                    .and_then(|v| v.as_tensor())
                    .expect("checked")
                    .clone(),
            )
        });
    }
    for (slot, id) in slots.iter().zip(&f.params) {
        if let Some(t) = slot {
            for (d, e) in f.buffer(*id).shape.iter().enumerate() {
                if let Some(v) = e.as_var() {
                    env.entry(v.clone()).or_insert(t.shape()[d]);
                }
            }
        }
    }
    for v in &f.dims {
        if !env.contains_key(v) {
            return Err(Error::Runtime(rivet_runtime::Error::Argument(format!(
                "{name}: dim '{}' is only known from an output; pass the outputs too",
                v.name
            ))));
        }
    }
    // The launch context: the arguments' device (one device, checked above for CUDA; the
    // signature admits only host memory for the CPU backends), the stream the caller chose
    // (`rivet_runtime::stream`), and the call's size, for the backend's policy.
    let ctx = LaunchContext {
        device: slots
            .iter()
            .flatten()
            .next()
            .map_or(rivet_runtime::Device::Cpu, |t| t.device()),
        stream: rivet_runtime::stream::call_stream(),
        work: 0,
    };
    // Dims given by expressions, and the allocation of missing outputs.
    for (i, (slot, id)) in slots.iter_mut().zip(&f.params).enumerate() {
        let b = f.buffer(*id);
        let mut want: Vec<i64> = Vec::with_capacity(b.shape.len());
        for (d, e) in b.shape.iter().enumerate() {
            match eval_dims(e, &|v| env.get(v).copied())? {
                Ok(w) => want.push(w),
                Err(what) => {
                    return Err(shape_error(format!(
                        "{name}: the size of {} in dim {d} (= {e}) overflows int64 for these shapes ({}) at `{what}`",
                        ArgName {
                            index: i,
                            name: Some(&b.name)
                        },
                        dims_text(f, &env)
                    )))
                }
            }
        }
        match slot {
            Some(t) => {
                for (d, (&w, &g)) in want.iter().zip(t.shape()).enumerate() {
                    if w != g {
                        return Err(shape_error(format!(
                            "{name}: {} has size {g} in dim {d} but the program needs {w} (= {})",
                            ArgName {
                                index: i,
                                name: Some(&b.name)
                            },
                            b.shape[d]
                        )));
                    }
                }
            }
            None => {
                if let Some(d) = want.iter().position(|&w| w < 0) {
                    return Err(shape_error(format!(
                        "{name}: output '{}' would have negative size {} in dim {d}",
                        b.name, want[d]
                    )));
                }
                *slot = Some(
                    c.kernel
                        .alloc_output(&want, b.dtype, &ctx)
                        .map_err(|e| match e {
                            Error::Runtime(r) => {
                                Error::Runtime(r.context(&format!("{name}: output '{}': ", b.name)))
                            }
                            other => other,
                        })?,
                );
            }
        }
    }
    let tensors: Vec<Tensor> = slots.into_iter().map(|s| s.expect("filled")).collect();
    for k in &f.checks {
        // An overflow while deciding a check fails it: it never wraps into a pass.
        let verdict = match eval_dims(&k.cond, &|v| env.get(v).copied())? {
            Ok(0) => Some(String::new()),
            Ok(_) => None,
            Err(what) => Some(format!(" (deciding it overflows int64 at `{what}`)")),
        };
        if let Some(why) = verdict {
            return Err(shape_error(format!(
                "{name}: out-of-bounds access for these shapes ({}): {}{why}",
                dims_text(f, &env),
                k.message
            )));
        }
    }
    for (buf, shape, size) in &c.temps {
        let mut vals = Vec::with_capacity(shape.len());
        for e in shape {
            match eval_dims(e, &|v| env.get(v).copied())? {
                Ok(v) => vals.push(v),
                Err(_) => vals.push(i64::MAX),
            }
        }
        temp_fits(name, buf, &vals, *size)?;
    }
    // Outputs may not share memory with any other argument.
    for (i, id) in f.params.iter().enumerate() {
        if f.buffer(*id).kind != (BufKind::Param { output: true }) {
            continue;
        }
        let Some((lo, hi)) = tensors[i].byte_range() else {
            continue;
        };
        for (j, other) in tensors.iter().enumerate() {
            if i == j {
                continue;
            }
            if let Some((l2, h2)) = other.byte_range() {
                if lo < h2 && l2 < hi {
                    return Err(Error::Runtime(rivet_runtime::Error::Layout(format!(
                        "{name}: output {} shares memory with {}; outputs must not overlap other arguments",
                        ArgName { index: i, name: Some(&f.buffer(*id).name) },
                        ArgName { index: j, name: Some(&f.buffer(f.params[j]).name) },
                    ))));
                }
            }
        }
    }
    // The ABI's int slots (`codegen::int_slots`): the dims, then every parameter's strides.
    let mut ints: crate::codegen::FrameInts = f.dims.iter().map(|v| env[v]).collect();
    for t in &tensors {
        ints.extend_from_slice(t.strides());
    }
    let frame = CallFrame {
        ptrs: tensors.iter().map(|t| t.data_ptr()).collect(),
        ints,
    };
    // The work: the loops' iteration count (a GEMM's multiply-adds), or the elements the
    // arguments hold when that is more (a loop nest the count underestimates).
    let elements: i64 = tensors
        .iter()
        .fold(0i64, |a, t| a.saturating_add(t.numel()));
    let ctx = LaunchContext {
        work: c.work.eval(&|v| env.get(v).copied()).max(elements),
        ..ctx
    };
    // Every output empty: nothing to compute, so nothing is launched. The loops would still
    // run over the other dims (an output of shape [2^61, 0] is 2^61 empty outer iterations:
    // a hang, found by the C ABI fuzzer, `tests/src/fuzz/capi_gen.rs`).
    // A function with host callbacks is launched all the same: each runs exactly once per
    // call (docs/callbacks.md), whatever the outputs' sizes.
    let outputs_empty = n_out > 0
        && f.callbacks.is_empty()
        && tensors
            .iter()
            .zip(&f.params)
            .filter(|(_, id)| f.buffer(**id).kind == (BufKind::Param { output: true }))
            .all(|(t, _)| t.numel() == 0);
    if !outputs_empty {
        // SAFETY: the frame describes the argument tensors, checked above against the
        // signature, the dims and the bounds checks; the backend applies its own execution
        // policy.
        unsafe { c.kernel.launch(&frame, &ctx) }?;
    }
    if allocate {
        let outs: Vec<Tensor> = tensors
            .into_iter()
            .zip(&f.params)
            .filter(|(_, id)| f.buffer(**id).kind == (BufKind::Param { output: true }))
            .map(|(t, _)| t)
            .collect();
        if outs.len() == 1 {
            return Ok(Value::Tensor(outs.into_iter().next().unwrap()));
        }
        return Ok(Value::List(outs.into_iter().map(Value::Tensor).collect()));
    }
    Ok(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_runtime::{DType, Device};

    /// A view claiming 4 float32 on `device` at a fake address (never dereferenced).
    fn on(device: Device) -> Value {
        // SAFETY: the view is only inspected (device, shape), never read or written.
        let t = unsafe {
            Tensor::from_raw_parts(
                (),
                0x1000 as *mut u8,
                0,
                [4i64][..].into(),
                [1i64][..].into(),
                DType::F32,
                device,
                false,
            )
        }
        .unwrap();
        Value::Tensor(t)
    }

    fn sig() -> Signature {
        let t = || {
            ParamKind::Tensor(TensorSpec {
                device: DeviceSpec::Any,
                ..Default::default()
            })
        };
        Signature::new(vec![
            Param::new("A", t()),
            Param::new("k", ParamKind::Int),
            Param::new("C", t()),
        ])
    }

    #[test]
    fn cuda_calls_need_one_cuda_device_and_name_the_arguments() {
        let ok = [on(Device::Cuda(1)), Value::Int(3), on(Device::Cuda(1))];
        check_devices("f", &sig(), &ok).unwrap();
        for (args, want) in [
            (
                [on(Device::Cuda(0)), Value::Int(3), on(Device::Cuda(1))],
                "f: tensors on different devices: argument 0 ('A') is on cuda:0 but argument 2 ('C') is on cuda:1",
            ),
            (
                [on(Device::Cpu), Value::Int(3), on(Device::Cuda(0))],
                "argument 0 ('A') is on cpu but argument 2 ('C') is on cuda:0",
            ),
            (
                [on(Device::Cpu), Value::Int(3), on(Device::Cpu)],
                "f: built for 'cuda', called with tensors on cpu (argument 0 ('A') and every other tensor)",
            ),
            (
                [on(Device::CudaHost), Value::Int(3), on(Device::CudaHost)],
                "called with tensors on cuda_host",
            ),
        ] {
            let e = check_devices("f", &sig(), &args).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(e, Error::Runtime(rivet_runtime::Error::Device(_))) && msg.contains(want),
                "{msg}"
            );
        }
        // No tensor at all: nothing to check (the signature check reports what is missing).
        check_devices("f", &sig(), &[Value::Int(1)]).unwrap();
    }
}
