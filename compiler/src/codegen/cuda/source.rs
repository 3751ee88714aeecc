//! CUDA C source from a lowered, split `PrimFunc`: one `extern "C" __global__` function per
//! GPU kernel (`DeviceFunc` of kind `Gpu`), and the host plan that launches them.
//!
//! Layout of a generated file: a header comment, the prelude (`prelude::PRELUDE`), then one
//! kernel per outlined body, in `func.kernels` order. A kernel's parameters are its captures
//! in `DeviceFunc` order: the buffers as typed pointers to element 0, then the int64
//! variables (`long long`). Names are the IR's, sanitised to C identifiers and made unique
//! within the kernel (`A.s0` -> `A_s0`; a second `i` -> `i_1`).
//!
//! Mapping (every construct with the interpreter's meaning, `codegen::interp`):
//! - a block loop binds `blockIdx.*`, a thread loop `threadIdx.*` (the verifier guarantees
//!   min 0 and, for threads, one constant extent per tag: the launch's block size; the grid is
//!   the block loops' extents, evaluated on the host);
//! - serial, vectorized and unrolled loops are `for` loops (`#pragma unroll` for unrolled;
//!   vectorized loops are plain loops for now);
//! - `shared` buffers are `__shared__ T name[N]` (not zeroed: the interpreter zeroes them, so a
//!   program reading shared memory before writing it is wrong on both, differently); `local`
//!   buffers are `T name[N] = {}` (zeroed, as the interpreter's); global temporaries are
//!   allocated (zeroed) by the host part around the launches that use them and passed as
//!   plain pointers;
//! - `Barrier` is `__syncthreads()`;
//! - `AllReduce` (cross-thread reduction over threadIdx.x) is a call of the prelude's
//!   `rivet_allreduce_x`: `__shfl_down_sync` trees within warps, then a `__shared__` scratch
//!   (one element per warp share of a group) and `__syncthreads` across warps, in the
//!   interpreter's order (`codegen::interp::gpu::allreduce_group`);
//! - index arithmetic (the int64 nodes of load/store indices, loop bounds, `let` values and
//!   the operands of int64 comparisons that read no memory) is plain signed arithmetic (and
//!   floor division of a provably non-negative index by a positive constant is C's `/`). In
//!   the 64-bit kernel it is `long long`: the bounds proof (`lower::bounds`) obliges each of
//!   those nodes to stay inside int64, so it never wraps. In the 32-bit kernel (`<name>_i32`)
//!   it is `int`, including the kernel's int parameters: `idx32.rs` bounds every index node
//!   and the kernel exists only where the bounds can fit int32; the host launches it only
//!   for calls whose values put every bound inside int32 (`KernelInfo::entry`). All other
//!   integer arithmetic wraps at its dtype's width without C++ undefined behaviour (computed
//!   unsigned, converted back), in both kernels.
//! - float16 / bfloat16 are stored as 16-bit patterns and computed in float32, rounded only
//!   by stores, casts and constants; bool is stored as one byte and loaded as `!= 0`.
//! - `Select` is `c ? a : b` and `&&`/`||` short-circuit: only the chosen arm is evaluated.
//! - math: CUDA's `expf`, `logf`, `tanhf`, `erff`, `powf` (and the double versions) stand for
//!   musl's; their ulp differences are unmeasured (no GPU yet). `sqrt` and `/` are IEEE
//!   (NVRTC's defaults `-prec-sqrt=true -prec-div=true`), `rsqrt` is `1 / sqrtf(x)`.

use super::idx32::{analyse, Index32, Narrow};
use super::prelude::PRELUDE;
use crate::codegen::interp::{eval_expr, Value};
use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, BufId, CmpOp, Expr, ExprKind, LogicOp, ReduceOp, UnOp, Var};
use crate::ir::stmt::{BufKind, DeviceKind, ForKind, PrimFunc, Scope, Stmt, ThreadTag};
use rivet_runtime::DType;
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// What the host needs to launch one kernel.
#[derive(Debug, Clone)]
pub struct KernelInfo {
    /// Index in `func.kernels`.
    pub index: usize,
    /// The C name of the `__global__` function.
    pub name: String,
    /// Grid extents (x, y, z): the block loops' extents over the captured variables, `None`
    /// for a dimension no loop binds (size 1).
    pub grid: [Option<Expr>; 3],
    /// Block size (x, y, z): the thread loops' constant extents (1 where none).
    pub block: [u32; 3],
    /// Static shared memory per block, in bytes.
    pub shared_bytes: u64,
    /// Which index widths the kernel has (`idx32`): the 64-bit entry point is `name`, the
    /// 32-bit one `name32`.
    pub index32: Index32,
    /// The C name of the 32-bit `__global__` function (`<name>_i32`).
    pub name32: String,
}

impl KernelInfo {
    /// The entry points the source defines: the 64-bit one, then the 32-bit one.
    pub fn entries(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.index32.has64() {
            v.push(self.name.clone());
        }
        if self.index32.has32() {
            v.push(self.name32.clone());
        }
        v
    }

    /// The entry point for a call whose captured variables have the values `lookup`, and
    /// whether it is the 32-bit one (its int parameters are `int`).
    pub fn entry(&self, lookup: &dyn Fn(&Var) -> Option<i64>) -> (&str, bool) {
        if self.index32.fits(lookup) {
            (&self.name32, true)
        } else {
            (&self.name, false)
        }
    }
}

/// The generated source and what launching needs.
#[derive(Debug, Clone)]
pub struct Generated {
    pub source: String,
    pub kernels: Vec<KernelInfo>,
}

fn unsupported(func: &PrimFunc, what: String) -> Error {
    Error::Compile(format!(
        "target 'cuda': function '{}': {what} is not available yet in the CUDA backend",
        func.name
    ))
}

/// Checks that the host part of `func` is what the CUDA backend runs today: a sequence of
/// launches of GPU kernels, possibly under `let`s and allocations of global temporaries.
/// Returns the kernels launched, in order.
pub fn check_host(func: &PrimFunc) -> Result<Vec<usize>> {
    fn walk(func: &PrimFunc, s: &Stmt, out: &mut Vec<usize>) -> Result<()> {
        match s {
            Stmt::Seq(v) => v.iter().try_for_each(|s| walk(func, s, out)),
            Stmt::Let { body, .. } => walk(func, body, out),
            Stmt::Launch { kernel } => {
                let k = func.kernels.get(*kernel).ok_or_else(|| {
                    Error::Internal(format!("launch of unknown kernel {kernel}"))
                })?;
                if k.kind != DeviceKind::Gpu {
                    return Err(unsupported(
                        func,
                        format!(
                            "a CPU parallel loop on the host (`{}`: a loop marked parallel and not bound to blockIdx/threadIdx)",
                            k.name
                        ),
                    ));
                }
                out.push(*kernel);
                Ok(())
            }
            // A global temporary between kernels: allocated on the device by the host part.
            Stmt::Allocate { bufs, body } => {
                if let Some(b) = bufs
                    .iter()
                    .map(|b| func.buffer(*b))
                    .find(|b| b.scope != Scope::Global)
                {
                    return Err(Error::Internal(format!(
                        "{:?} buffer '{}' allocated on the host",
                        b.scope, b.name
                    )));
                }
                walk(func, body, out)
            }
            Stmt::For { var, .. } => Err(unsupported(
                func,
                format!(
                    "the host loop over '{}' around kernel launches (bind every loop of a stage to blockIdx/threadIdx or keep it inside a kernel)",
                    var.name
                ),
            )),
            Stmt::If { .. } => Err(unsupported(
                func,
                "a condition on the host around kernel launches".into(),
            )),
            Stmt::Store { buf, .. } => Err(unsupported(
                func,
                format!(
                    "a store to '{}' on the host, outside any kernel (bind the stage's loops to blockIdx/threadIdx)",
                    func.buffer(*buf).name
                ),
            )),
            Stmt::Barrier => Err(Error::Internal("barrier outside a kernel".into())),
            Stmt::Call { intrin, .. } => Err(call_refused(*intrin)),
            Stmt::AllReduce { .. } => Err(Error::Internal(
                "cross-thread reduction outside a kernel".into(),
            )),
        }
    }
    // A tensorized function names the reason first: its calls, not a missing binding.
    let mut call = None;
    func.visit_all(&mut |s| {
        if let Stmt::Call { intrin, .. } = s {
            call.get_or_insert(*intrin);
        }
    });
    if let Some(intrin) = call {
        return Err(call_refused(intrin));
    }
    if !func.kernels.iter().any(|k| k.kind == DeviceKind::Gpu) {
        return Err(Error::Compile(format!(
            "target 'cuda': function '{}' has no GPU kernel: bind its loops to blockIdx/threadIdx (e.g. split an axis and bind the parts to 'blockIdx.x' and 'threadIdx.x'), or leave the schedule without any binding to get the default GPU schedule (it does not touch stages you split, annotated or attached)",
            func.name
        )));
    }
    let mut out = Vec::new();
    walk(func, &func.body, &mut out)?;
    Ok(out)
}

/// Generates the CUDA source of `func` (lowered, flattened and split).
pub fn generate(func: &PrimFunc, arch_note: &str) -> Result<Generated> {
    check_host(func)?;
    let mut src = String::new();
    let _ = writeln!(
        src,
        "// rivet: CUDA C for function `{}` ({arch_note}); generated, do not edit.",
        func.name
    );
    src.push_str(PRELUDE);
    let mut kernels = Vec::new();
    for (index, k) in func.kernels.iter().enumerate() {
        if k.kind != DeviceKind::Gpu {
            continue;
        }
        let (index32, narrow) = analyse(func, k);
        let mut info = None;
        for idx32 in [false, true] {
            if (idx32 && !index32.has32()) || (!idx32 && !index32.has64()) {
                continue;
            }
            let mut g = KernelGen::new(func, idx32);
            if !idx32 {
                g.narrow = narrow.clone();
            }
            let i = g.kernel(index, &index32, &mut src)?;
            info.get_or_insert(i);
        }
        let mut info = info.ok_or_else(|| Error::Internal("a kernel without an entry".into()))?;
        info.index32 = index32;
        kernels.push(info);
    }
    Ok(Generated {
        source: src,
        kernels,
    })
}

/// C type of a `dt` element in memory.
pub fn storage_type(dt: DType) -> &'static str {
    match dt {
        DType::Bool => "unsigned char",
        DType::I8 => "signed char",
        DType::I16 => "short",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U8 => "unsigned char",
        DType::U16 => "unsigned short",
        DType::U32 => "unsigned int",
        DType::U64 => "unsigned long long",
        DType::F16 => "rivet_f16",
        DType::BF16 => "rivet_bf16",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// C type of a `dt` value in registers (what an expression of dtype `dt` evaluates to).
pub fn value_type(dt: DType) -> &'static str {
    match dt {
        DType::Bool => "bool",
        DType::F16 | DType::BF16 => "float",
        other => storage_type(other),
    }
}

/// The unsigned type integer arithmetic of `dt` is done in (wrapping, no UB).
fn unsigned_type(dt: DType) -> &'static str {
    match dt {
        DType::I64 | DType::U64 => "unsigned long long",
        _ => "unsigned int",
    }
}

fn is_int(dt: DType) -> bool {
    !dt.is_float() && dt != DType::Bool
}

const RESERVED: &[&str] = &[
    "alignas",
    "alignof",
    "and",
    "asm",
    "auto",
    "bool",
    "break",
    "case",
    "catch",
    "char",
    "class",
    "const",
    "constexpr",
    "continue",
    "decltype",
    "default",
    "delete",
    "do",
    "double",
    "else",
    "enum",
    "explicit",
    "export",
    "extern",
    "false",
    "float",
    "for",
    "friend",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "mutable",
    "namespace",
    "new",
    "noexcept",
    "not",
    "nullptr",
    "operator",
    "or",
    "private",
    "protected",
    "public",
    "register",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "struct",
    "switch",
    "template",
    "this",
    "throw",
    "true",
    "try",
    "typedef",
    "typeid",
    "typename",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "while",
    "xor",
    "threadIdx",
    "blockIdx",
    "blockDim",
    "gridDim",
    "warpSize",
    "main",
    "NULL",
    "exp",
    "expf",
    "log",
    "logf",
    "sqrt",
    "sqrtf",
    "tanh",
    "tanhf",
    "erf",
    "erff",
    "pow",
    "powf",
    "floor",
    "floorf",
    "ceil",
    "ceilf",
    "fabs",
    "fabsf",
    "min",
    "max",
];

/// A C identifier for `name` (not yet made unique).
pub fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert_str(0, "v_");
    }
    // Leading underscores are the implementation's; `rivet_` is the prelude's.
    if s.starts_with('_') || s.starts_with("rivet_") || s.starts_with("RIVET_") {
        s.insert(0, 'v');
    }
    if RESERVED.contains(&s.as_str()) {
        s.push('_');
    }
    s
}

/// Per-kernel code generator.
struct KernelGen<'a> {
    func: &'a PrimFunc,
    /// C names of variables (by id) and buffers (by id).
    vars: HashMap<u32, String>,
    bufs: HashMap<BufId, String>,
    taken: HashSet<String>,
    /// Variables known to be non-negative (launch indices, loops from a non-negative min,
    /// dims, local strides, lets of non-negative values): floor division of a non-negative
    /// index by a positive constant is C's `/`.
    nonneg: HashSet<u32>,
    out: String,
    indent: usize,
    shared_bytes: u64,
    /// The kernel's block size (x, y, z): cross-thread reductions size their scratch by it.
    block: [u32; 3],
    /// The 32-bit variant: index nodes are `int` (`idx32.rs` proved them in range).
    idx32: bool,
    /// In the 64-bit variant: the index nodes and variables that are `int` anyway (their
    /// values lie in int32 for every call: `idx32::Narrow`).
    narrow: Narrow,
    /// Variables declared `int` in the 64-bit variant.
    int_vars: HashSet<u32>,
}

impl<'a> KernelGen<'a> {
    fn new(func: &'a PrimFunc, idx32: bool) -> KernelGen<'a> {
        KernelGen {
            func,
            vars: HashMap::new(),
            bufs: HashMap::new(),
            taken: HashSet::new(),
            nonneg: HashSet::new(),
            out: String::new(),
            indent: 1,
            shared_bytes: 0,
            block: [1, 1, 1],
            idx32,
            narrow: Narrow::default(),
            int_vars: HashSet::new(),
        }
    }

    fn unique(&mut self, name: &str) -> String {
        let base = sanitize(name);
        let mut s = base.clone();
        let mut k = 1;
        while self.taken.contains(&s) {
            s = format!("{base}_{k}");
            k += 1;
        }
        self.taken.insert(s.clone());
        s
    }

    fn bind_var(&mut self, v: &Var) -> String {
        let s = self.unique(&v.name);
        self.vars.insert(v.id, s.clone());
        s
    }

    fn var(&self, v: &Var) -> Result<String> {
        self.vars.get(&v.id).cloned().ok_or_else(|| {
            Error::Internal(format!(
                "CUDA codegen, function `{}`: unbound variable `{}` (id {})",
                self.func.name, v.name, v.id
            ))
        })
    }

    fn buf(&self, id: BufId) -> Result<String> {
        self.bufs.get(&id).cloned().ok_or_else(|| {
            Error::Internal(format!(
                "CUDA codegen, function `{}`: buffer id {} is not available in this kernel",
                self.func.name, id.0
            ))
        })
    }

    fn line(&mut self, text: &str) {
        for _ in 0..self.indent {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    /// The C type of index arithmetic in this variant.
    fn ity(&self) -> &'static str {
        if self.idx32 {
            "int"
        } else {
            "long long"
        }
    }

    /// The C type of variable `v` (declared now): `int` in the 32-bit variant, and in the
    /// 64-bit one where its values fit int32 for every call (`Narrow`).
    fn var_ty(&mut self, v: &Var) -> &'static str {
        if !self.idx32 && self.narrow.var(v) {
            self.int_vars.insert(v.id);
            "int"
        } else {
            self.ity()
        }
    }

    /// In the 64-bit variant: the index node `e` is emitted as `int` (its value, and each of
    /// its index operands', fits int32 for every call). Constants that fit count as `int`.
    fn narrow_node(&self, e: &Expr) -> bool {
        if self.idx32 || e.dtype() != DType::I64 {
            return false;
        }
        match e.kind() {
            ExprKind::Const(_) => e.as_int().is_some_and(|v| i32::try_from(v).is_ok()),
            ExprKind::Var(v) => self.int_vars.contains(&v.id),
            ExprKind::Unary(_, a) => self.narrow.node(e) && self.narrow_node(a),
            ExprKind::Binary(_, a, b) | ExprKind::Select(_, a, b) => {
                self.narrow.node(e) && self.narrow_node(a) && self.narrow_node(b)
            }
            _ => false,
        }
    }

    /// One kernel, in this generator's index width: its signature, body and launch
    /// information (`index32` says which widths exist, for the comment above it).
    fn kernel(&mut self, index: usize, index32: &Index32, src: &mut String) -> Result<KernelInfo> {
        let func = self.func;
        let k = &func.kernels[index];
        let name = self.unique(&k.name);
        let name32 = self.unique(&format!("{name}_i32"));
        // Which captured buffers the kernel writes.
        let mut written = HashSet::new();
        k.body.visit(&mut |s| {
            if let Stmt::Store { buf, .. } = s {
                written.insert(*buf);
            }
        });
        let mut params = Vec::new();
        let mut reads = Vec::new();
        let mut writes = Vec::new();
        for id in &k.bufs {
            let b = func.buffer(*id);
            if b.scope != Scope::Global {
                return Err(Error::Internal(format!(
                    "kernel `{}` captures the {:?} buffer '{}'",
                    k.name, b.scope, b.name
                )));
            }
            let c = self.unique(&b.name);
            self.bufs.insert(*id, c.clone());
            let ty = storage_type(b.dtype);
            // `const T* __restrict__` only on parameters the function never writes: the
            // runtime's overlap rule keeps outputs apart from every other argument, so nothing
            // the kernel writes can alias them (two inputs may be one tensor: both are only
            // read). Written buffers get plain pointers (conservative).
            if written.contains(id) {
                writes.push(b.name.clone());
                params.push(format!("{ty}* {c}"));
            } else {
                reads.push(b.name.clone());
                let input = matches!(b.kind, BufKind::Param { output: false });
                if input {
                    params.push(format!("const {ty}* __restrict__ {c}"));
                } else {
                    params.push(format!("const {ty}* {c}"));
                }
            }
        }
        for v in &k.vars {
            let c = self.bind_var(v);
            if func.dims.contains(v) {
                // A dim is a tensor's extent: never negative.
                self.nonneg.insert(v.id);
            }
            params.push(format!("{} {c}", self.ity()));
        }
        // Launch dimensions.
        let mut grid: [Option<Expr>; 3] = [None, None, None];
        let mut root = &k.body;
        while let Stmt::For {
            kind: ForKind::Thread(tag),
            extent,
            body,
            ..
        } = root
        {
            if !tag.is_block() {
                break;
            }
            grid[tag.axis()] = Some(extent.clone());
            root = body;
        }
        let mut block = [1u32; 3];
        let mut bad = None;
        k.body.visit(&mut |s| {
            if let Stmt::For {
                kind: ForKind::Thread(tag),
                extent,
                ..
            } = s
            {
                if !tag.is_block() {
                    match extent.as_int().and_then(|n| u32::try_from(n).ok()) {
                        Some(n) => block[tag.axis()] = n,
                        None => bad = Some((*tag, extent.clone())),
                    }
                }
            }
        });
        if let Some((tag, e)) = bad {
            return Err(Error::Internal(format!(
                "CUDA codegen, function `{}`: thread loop bound to {} has extent `{e}`, not a constant",
                func.name,
                tag.name()
            )));
        }
        let threads: u64 = block.iter().map(|&n| n as u64).product();
        self.block = block;
        let _ = writeln!(src);
        let _ = writeln!(
            src,
            "// kernel {index} of `{}` (`{}`): reads {}; writes {}; block {}x{}x{}",
            func.name,
            k.name,
            if reads.is_empty() {
                "nothing".to_string()
            } else {
                reads.join(", ")
            },
            if writes.is_empty() {
                "nothing".to_string()
            } else {
                writes.join(", ")
            },
            block[0],
            block[1],
            block[2]
        );
        let width = match (index32, self.idx32) {
            (Index32::Always, _) => {
                "32-bit index arithmetic (every index fits int32 for every call)".to_string()
            }
            (Index32::Never(why), _) => format!("64-bit index arithmetic ({why})"),
            (Index32::When(ends), true) => format!(
                "32-bit index arithmetic: launched when the host finds the {} bounds of its indices inside int32",
                ends.len()
            ),
            (Index32::When(_), false) => {
                "64-bit index arithmetic: launched when some index may leave int32".to_string()
            }
        };
        let _ = writeln!(src, "// {width}");
        self.stmt(&k.body)?;
        let entry = if self.idx32 { &name32 } else { &name };
        let _ = writeln!(
            src,
            "extern \"C\" __global__ void __launch_bounds__({threads}) {entry}(\n    {}) {{",
            params.join(",\n    ")
        );
        src.push_str(&self.out);
        src.push_str("}\n");
        Ok(KernelInfo {
            index,
            name,
            grid,
            block,
            shared_bytes: self.shared_bytes,
            index32: Index32::Always,
            name32,
        })
    }

    /// The declaration of local `buf` (shared or per-thread, constant shape) at the top of
    /// the block of the `Allocate` whose body is `body`, and its stride constants that `body`
    /// uses.
    fn declare_local(&mut self, buf: BufId, body: &Stmt) -> Result<()> {
        let b = self.func.buffer(buf).clone();
        let shape: Option<Vec<i64>> = b.shape.iter().map(|e| e.as_int()).collect();
        let shape = match (b.scope, shape) {
            (Scope::Global, _) => {
                return Err(unsupported(
                    self.func,
                    format!("the global-memory temporary '{}' inside a kernel", b.name),
                ))
            }
            (_, Some(s)) if s.iter().all(|&n| n >= 0) => s,
            _ => {
                return Err(Error::Internal(format!(
                    "CUDA codegen, function `{}`: {:?} buffer '{}' without a constant shape",
                    self.func.name, b.scope, b.name
                )))
            }
        };
        let numel = shape
            .iter()
            .try_fold(1i64, |a, &n| a.checked_mul(n))
            .filter(|&n| n <= i32::MAX as i64)
            .ok_or_else(|| {
                Error::Compile(format!(
                    "target 'cuda': the {:?} buffer '{}' of shape {shape:?} is too large",
                    b.scope, b.name
                ))
            })?;
        let c = self.unique(&b.name);
        self.bufs.insert(b.id, c.clone());
        let ty = storage_type(b.dtype);
        let dims: Vec<String> = shape.iter().map(|n| n.to_string()).collect();
        // C++ has no zero-length arrays: an empty buffer gets one unused element.
        let n = numel.max(1);
        if b.scope == Scope::Shared {
            self.shared_bytes += n as u64 * b.dtype.size() as u64;
            self.line(&format!(
                "__shared__ {ty} {c}[{n}]; // stage {}: shared [{}]",
                b.name,
                dims.join(", ")
            ));
        } else {
            self.line(&format!(
                "{ty} {c}[{n}] = {{}}; // stage {}: local [{}]",
                b.name,
                dims.join(", ")
            ));
        }
        // Compact row-major strides, as `Allocate` binds them.
        let mut stride = 1i64;
        let mut strides = vec![0i64; shape.len()];
        for k in (0..shape.len()).rev() {
            strides[k] = stride;
            stride = stride.saturating_mul(shape[k]);
        }
        for (v, s) in b.strides.iter().zip(&strides) {
            if stmt_uses(body, v) {
                let sc = self.bind_var(v);
                self.nonneg.insert(v.id);
                let t = self.var_ty(v);
                self.line(&format!("const {t} {sc} = {s};"));
            }
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Result<()> {
        match s {
            Stmt::Seq(v) => v.iter().try_for_each(|s| self.stmt(s)),
            Stmt::Call { intrin, .. } => Err(call_refused(*intrin)),
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => match kind {
                ForKind::Thread(tag) => {
                    let used = stmt_uses(body, var);
                    self.line(&format!("{{ // {} bound to {}", var.name, tag.name()));
                    self.indent += 1;
                    if used {
                        let c = self.bind_var(var);
                        self.nonneg.insert(var.id);
                        let t = self.var_ty(var);
                        self.line(&format!("const {t} {c} = ({t}){};", thread_reg(*tag)));
                    }
                    self.stmt(body)?;
                    self.indent -= 1;
                    self.line("}");
                    Ok(())
                }
                ForKind::Parallel => Err(Error::Internal(format!(
                    "CUDA codegen, function `{}`: a parallel loop inside a kernel",
                    self.func.name
                ))),
                ForKind::Serial | ForKind::Unrolled | ForKind::Vectorized => {
                    let lo = self.index_expr(min)?;
                    let n = self.index_expr(extent)?;
                    let c = self.bind_var(var);
                    if self.nonneg_expr(min) {
                        self.nonneg.insert(var.id);
                    }
                    if *kind == ForKind::Unrolled {
                        self.line("#pragma unroll");
                    }
                    let note = if *kind == ForKind::Vectorized {
                        " // vectorized in the IR: a plain loop for now"
                    } else {
                        ""
                    };
                    let t = self.var_ty(var);
                    if min.as_int() == Some(0) {
                        self.line(&format!("for ({t} {c} = 0; {c} < {n}; ++{c}) {{{note}"));
                    } else {
                        self.line(&format!(
                            "for ({t} {c} = {lo}; {c} < {lo} + {n}; ++{c}) {{{note}"
                        ));
                    }
                    self.indent += 1;
                    self.stmt(body)?;
                    self.indent -= 1;
                    self.line("}");
                    Ok(())
                }
            },
            Stmt::Store {
                buf,
                indices,
                value,
            } if value.is_vector() => self.vector_store(*buf, indices, value),
            Stmt::Store {
                buf,
                indices,
                value,
            } => {
                let b = self.func.buffer(*buf);
                let dt = b.dtype;
                let name = self.buf(*buf)?;
                let idx = self.offset(indices)?;
                let v = self.expr(value, false)?;
                self.line(&format!("{name}[{idx}] = {};", stored(dt, v)));
                Ok(())
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let c = self.expr(cond, false)?;
                self.line(&format!("if ({}) {{", strip_parens(&c)));
                self.indent += 1;
                self.stmt(then)?;
                self.indent -= 1;
                if let Some(o) = otherwise {
                    self.line("} else {");
                    self.indent += 1;
                    self.stmt(o)?;
                    self.indent -= 1;
                }
                self.line("}");
                Ok(())
            }
            Stmt::Let { var, value, body } => {
                if !stmt_uses(body, var) {
                    return self.stmt(body);
                }
                let v = self.index_expr(value)?;
                self.line("{");
                self.indent += 1;
                let c = self.bind_var(var);
                if self.nonneg_expr(value) {
                    self.nonneg.insert(var.id);
                }
                let t = self.var_ty(var);
                self.line(&format!("const {t} {c} = {};", strip_parens(&v)));
                self.stmt(body)?;
                self.indent -= 1;
                self.line("}");
                Ok(())
            }
            Stmt::Allocate { bufs, body } => {
                self.line("{");
                self.indent += 1;
                for buf in bufs {
                    self.declare_local(*buf, body)?;
                }
                self.stmt(body)?;
                self.indent -= 1;
                self.line("}");
                Ok(())
            }
            Stmt::Barrier => {
                self.line("__syncthreads();");
                Ok(())
            }
            Stmt::AllReduce {
                op,
                tag,
                value,
                dst,
            } => self.allreduce(*op, *tag, value, *dst),
            Stmt::Launch { .. } => Err(Error::Internal(format!(
                "CUDA codegen, function `{}`: a launch inside a kernel",
                self.func.name
            ))),
        }
    }

    /// A cross-thread reduction: `rivet_allreduce_x` of the prelude (warp shuffles, then shared
    /// memory across warps), with the combination as a lambda of the operator's usual text
    /// and a `__shared__` scratch of one element per warp share of each group when a group
    /// spans several warps. The verifier guarantees the tag is threadIdx.x, that every thread
    /// of the block gets here, and a power-of-two x extent when there are several groups.
    fn allreduce(&mut self, op: ReduceOp, tag: ThreadTag, value: &Expr, dst: BufId) -> Result<()> {
        if tag != ThreadTag::ThreadX {
            return Err(Error::Internal(format!(
                "CUDA codegen, function `{}`: cross-thread reduction over {}",
                self.func.name,
                tag.name()
            )));
        }
        let dt = value.dtype();
        let ty = value_type(dt);
        let [nx, ny, nz] = self.block;
        let runs = nx.div_ceil(32) as u64;
        let groups = ny as u64 * nz as u64;
        let bop = match op {
            ReduceOp::Sum => BinOp::Add,
            ReduceOp::Prod => BinOp::Mul,
            ReduceOp::Max => BinOp::Max,
            ReduceOp::Min => BinOp::Min,
        };
        let combine = binary(bop, dt, "rivet_a", "rivet_b", false);
        let v = self.expr(value, false)?;
        let name = self.buf(dst)?;
        let what = format!("{op:?}").to_lowercase();
        self.line(&format!(
            "{{ // allreduce {what} over threadIdx.x: {nx} threads in each of {groups} groups"
        ));
        self.indent += 1;
        let scratch = if runs > 1 {
            let s = self.unique(&format!("{name}_red"));
            // Shared values are held as the register type (float16 as float).
            let bytes = match dt {
                DType::F16 | DType::BF16 => 4,
                other => other.size() as u64,
            };
            self.shared_bytes += runs * groups * bytes;
            self.line(&format!("__shared__ {ty} {s}[{}];", runs * groups));
            s
        } else {
            format!("({ty}*)0")
        };
        let r = format!(
            "rivet_allreduce_x<{ty}>({v}, []({ty} rivet_a, {ty} rivet_b) -> {ty} {{ return {}; }}, {scratch}, {nx}, {ny}, {})",
            strip_parens(&combine),
            nx as u64 * groups
        );
        self.line(&format!("{name}[0] = {};", stored(dt, r)));
        self.indent -= 1;
        self.line("}");
        Ok(())
    }

    /// A vector store (vector IR, `lower::vectorize`). When the store and some loads under it
    /// are contiguous (`ramp(b, 1, n)`) of a 16-byte CUDA vector type (`float4`, `double2`,
    /// `int4`, ...), a run-time test of the addresses picks 16-byte accesses when every one of
    /// them is 16-byte aligned (a global pointer plus an offset is not known aligned at build
    /// time: foreign tensors and views may start anywhere), else the lanes one by one. Each
    /// lane is the scalar code of the lane's scalar expression (`lane_scalar`), so both paths
    /// compute the scalar results; all lanes are computed before any is stored.
    fn vector_store(&mut self, buf: BufId, indices: &[Expr], value: &Expr) -> Result<()> {
        let [index] = indices else {
            return self.offset(indices).map(|_| ());
        };
        let dt = self.func.buffer(buf).dtype;
        let name = self.buf(buf)?;
        let n = value.lanes();
        self.line("{");
        self.indent += 1;
        let vty = cuda_vector_type(dt, n);
        if let (Some(vty), Some(base)) = (vty, contiguous_base(index)) {
            // The contiguous loads under the value that have a vector type too.
            let mut loads: Vec<Expr> = Vec::new();
            value.visit_unique(&mut |e| {
                if let ExprKind::Load { indices, .. } = e.kind() {
                    if e.is_vector()
                        && indices.len() == 1
                        && contiguous_base(&indices[0]).is_some()
                        && cuda_vector_type(e.dtype(), e.lanes()).is_some()
                        && !loads.iter().any(|l| l == e)
                    {
                        loads.push(e.clone());
                    }
                }
            });
            let sb = self.unique("vs");
            let bexpr = self.index_expr(base)?;
            self.line(&format!("const long long {sb} = {};", strip_parens(&bexpr)));
            let mut conds = vec![format!("rivet_aligned16({name} + {sb})")];
            let mut packed = Vec::new();
            for l in &loads {
                let ExprKind::Load {
                    buf: lb,
                    indices: li,
                } = l.kind()
                else {
                    unreachable!()
                };
                let lname = self.buf(*lb)?;
                let lbase = contiguous_base(&li[0]).expect("checked above");
                let v = self.unique("vb");
                let e = self.index_expr(lbase)?;
                self.line(&format!("const long long {v} = {};", strip_parens(&e)));
                conds.push(format!("rivet_aligned16({lname} + {v})"));
                packed.push((l.clone(), lname, v));
            }
            self.line(&format!("if ({}) {{", conds.join(" && ")));
            self.indent += 1;
            // Each packed load once, as a 16-byte load; its lanes are named variables.
            let mut names: Vec<(Expr, Vec<Var>)> = Vec::new();
            for (l, lname, v) in &packed {
                let lt = cuda_vector_type(l.dtype(), l.lanes()).expect("checked above");
                let t = self.unique("vl");
                self.line(&format!(
                    "const {lt} {t} = *reinterpret_cast<const {lt}*>({lname} + {v});"
                ));
                let lanes = (0..l.lanes())
                    .map(|k| {
                        let var = Var::new("lane");
                        self.vars
                            .insert(var.id, format!("{t}.{}", LANE_FIELDS[k as usize]));
                        var
                    })
                    .collect();
                names.push((l.clone(), lanes));
            }
            let r = self.unique("vr");
            self.line(&format!("{vty} {r};"));
            for k in 0..n {
                let e = lane_scalar(value, k, &names);
                let x = self.expr(&e, false)?;
                self.line(&format!(
                    "{r}.{} = {};",
                    LANE_FIELDS[k as usize],
                    strip_parens(&x)
                ));
            }
            self.line(&format!("*reinterpret_cast<{vty}*>({name} + {sb}) = {r};"));
            self.indent -= 1;
            self.line("} else {");
            self.indent += 1;
            self.store_lanes(&name, dt, index, value)?;
            self.indent -= 1;
            self.line("}");
        } else {
            self.store_lanes(&name, dt, index, value)?;
        }
        self.indent -= 1;
        self.line("}");
        Ok(())
    }

    /// A vector store lane by lane: every lane's value, then the stores.
    fn store_lanes(&mut self, name: &str, dt: DType, index: &Expr, value: &Expr) -> Result<()> {
        let mut vals = Vec::new();
        for k in 0..value.lanes() {
            let e = lane_scalar(value, k, &[]);
            let x = self.expr(&e, false)?;
            let t = self.unique("vv");
            self.line(&format!(
                "const {} {t} = {};",
                value_type(dt),
                strip_parens(&x)
            ));
            vals.push(t);
        }
        for (k, t) in vals.into_iter().enumerate() {
            let i = lane_scalar(index, k as u32, &[]);
            let i = self.index_expr(&i)?;
            self.line(&format!(
                "{name}[{}] = {};",
                strip_parens(&i),
                stored(dt, t)
            ));
        }
        Ok(())
    }

    /// The element offset of a flattened access.
    fn offset(&mut self, indices: &[Expr]) -> Result<String> {
        match indices {
            [i] => Ok(strip_parens(&self.index_expr(i)?).to_string()),
            _ => Err(Error::Compile(format!(
                "target 'cuda': function '{}': checked mode (unflattened accesses) is not supported by the CUDA backend yet",
                self.func.name
            ))),
        }
    }

    /// Whether the int64 index expression `e` is never negative (a sound, simple check: no
    /// overflow, as the bounds proof guarantees for index arithmetic).
    fn nonneg_expr(&self, e: &Expr) -> bool {
        if e.dtype() != DType::I64 {
            return false;
        }
        match e.kind() {
            ExprKind::Const(_) => e.as_int().is_some_and(|v| v >= 0),
            ExprKind::Var(v) => self.nonneg.contains(&v.id),
            ExprKind::Binary(BinOp::Add | BinOp::Mul | BinOp::Min | BinOp::Max, a, b) => {
                self.nonneg_expr(a) && self.nonneg_expr(b)
            }
            ExprKind::Binary(BinOp::FloorDiv | BinOp::FloorMod, a, b) => {
                self.nonneg_expr(a) && b.as_int().is_some_and(|d| d > 0)
            }
            ExprKind::Select(_, a, b) => self.nonneg_expr(a) && self.nonneg_expr(b),
            _ => false,
        }
    }

    /// An int64 index expression (see the module documentation: plain signed arithmetic).
    fn index_expr(&mut self, e: &Expr) -> Result<String> {
        self.expr(e, true)
    }

    /// The C expression of `e` (fully parenthesised). `index`: the node belongs to an
    /// index computation the bounds proof covers.
    fn expr(&mut self, e: &Expr, index: bool) -> Result<String> {
        let dt = e.dtype();
        let index = index && dt == DType::I64;
        // The 32-bit variant computes index nodes as int32 (`idx32.rs` proved every one in
        // range, so the int32 rules below never wrap or overflow).
        // In the 64-bit variant, nodes whose values fit int32 for every call are int too, and
        // a 64-bit node converts its int operands first (an int product could overflow).
        let narrow = index && self.narrow_node(e);
        let edt = if index && (self.idx32 || narrow) {
            DType::I32
        } else {
            dt
        };
        Ok(match e.kind() {
            ExprKind::Const(_) if edt != dt => int_lit(e.as_int().unwrap_or(0), edt),
            ExprKind::Const(_) => constant(e)?,
            ExprKind::Var(v) => self.var(v)?,
            ExprKind::Load { buf, indices } => {
                let name = self.buf(*buf)?;
                let idx = self.offset(indices)?;
                match dt {
                    DType::F16 => format!("rivet_f16_to_f32({name}[{idx}])"),
                    DType::BF16 => format!("rivet_bf16_to_f32({name}[{idx}])"),
                    DType::Bool => format!("({name}[{idx}] != 0)"),
                    _ => format!("{name}[{idx}]"),
                }
            }
            ExprKind::Unary(op, a) => {
                let x = self.expr(a, index)?;
                unary(*op, edt, &x)
            }
            ExprKind::Binary(op, a, b) => {
                let mut x = self.expr(a, index)?;
                let mut y = self.expr(b, index)?;
                if index && !self.idx32 && !narrow {
                    for (t, c) in [(&mut x, a), (&mut y, b)] {
                        if self.narrow_node(c) {
                            *t = if c.as_int().is_some() {
                                constant(c)?
                            } else {
                                format!("((long long){t})")
                            };
                        }
                    }
                }
                // Index floor division of a non-negative value by a positive constant: C's
                // truncating `/` and `%` agree with floor semantics there.
                if index
                    && matches!(op, BinOp::FloorDiv | BinOp::FloorMod)
                    && b.as_int().is_some_and(|d| d > 0)
                    && self.nonneg_expr(a)
                {
                    let o = if *op == BinOp::FloorDiv { "/" } else { "%" };
                    return Ok(format!("({x} {o} {y})"));
                }
                binary(*op, edt, &x, &y, index)
            }
            ExprKind::Cmp(op, a, b) => {
                // Int64 comparisons of index arithmetic (no loads): the proof keeps their
                // operands inside int64, as it does indices.
                let idx = !has_load(a) && !has_load(b);
                let x = self.expr(a, idx)?;
                let y = self.expr(b, idx)?;
                let o = match op {
                    CmpOp::Eq => "==",
                    CmpOp::Ne => "!=",
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                    CmpOp::Gt => ">",
                    CmpOp::Ge => ">=",
                };
                format!("({x} {o} {y})")
            }
            ExprKind::Logic(op, a, b) => {
                let x = self.expr(a, false)?;
                let y = self.expr(b, false)?;
                let o = match op {
                    LogicOp::And => "&&",
                    LogicOp::Or => "||",
                };
                format!("({x} {o} {y})")
            }
            ExprKind::Cast(a) => {
                let x = self.expr(a, false)?;
                cast(a.dtype(), dt, &x)
            }
            ExprKind::Fma(a, b, c) => {
                let x = self.expr(a, false)?;
                let y = self.expr(b, false)?;
                let z = self.expr(c, false)?;
                // One rounding, as the interpreter's `mul_add` (float16/bfloat16 are floats
                // here too); `--fmad=false` keeps every other `a * b + c` unfused.
                match dt {
                    DType::F64 => format!("RIVET_FMA({x}, {y}, {z})"),
                    _ if dt.is_float() => format!("RIVET_FMAF({x}, {y}, {z})"),
                    _ => {
                        return Err(Error::Internal(format!(
                            "CUDA codegen, function `{}`: fma on {dt}",
                            self.func.name
                        )))
                    }
                }
            }
            ExprKind::Select(c, a, b) => {
                let c = self.expr(c, false)?;
                let x = self.expr(a, index)?;
                let y = self.expr(b, index)?;
                format!("({c} ? {x} : {y})")
            }
            ExprKind::Read { .. } | ExprKind::Reduce { .. } | ExprKind::Invalid(_) => {
                return Err(Error::Internal(format!(
                    "CUDA codegen, function `{}`: te-only node in loop IR: `{e}`",
                    self.func.name
                )))
            }
            // The CUDA target does not vectorize yet (`Target::vectorize_bytes`).
            ExprKind::Ramp { .. } | ExprKind::Broadcast { .. } => {
                return Err(Error::Internal(format!(
                    "CUDA codegen, function `{}`: vector IR is not supported by the CUDA backend yet: `{e}`",
                    self.func.name
                )))
            }
        })
    }
}

/// Member names of the lanes of CUDA's vector types.
const LANE_FIELDS: [&str; 4] = ["x", "y", "z", "w"];

/// CUDA's 16-byte vector type of `lanes` lanes of `dt` (elements of at least 4 bytes held as
/// themselves: not float16 / bfloat16, not bool).
fn cuda_vector_type(dt: DType, lanes: u32) -> Option<&'static str> {
    Some(match (dt, lanes) {
        (DType::F32, 4) => "float4",
        (DType::I32, 4) => "int4",
        (DType::U32, 4) => "uint4",
        (DType::F64, 2) => "double2",
        (DType::I64, 2) => "longlong2",
        (DType::U64, 2) => "ulonglong2",
        _ => return None,
    })
}

/// The base of a contiguous ramp (`ramp(b, 1, n)`).
fn contiguous_base(index: &Expr) -> Option<&Expr> {
    match index.kind() {
        ExprKind::Ramp { base, stride, .. } if stride.as_int() == Some(1) => Some(base),
        _ => None,
    }
}

/// Lane `l` of the vector expression `e` as a scalar expression (`ramp(b, s, n)` is
/// `b + s * l`, a broadcast its value), with the loads of `packed` replaced by the variables
/// naming their lanes.
fn lane_scalar(e: &Expr, l: u32, packed: &[(Expr, Vec<Var>)]) -> Expr {
    if !e.is_vector() {
        return e.clone();
    }
    if let Some((_, vars)) = packed.iter().find(|(p, _)| p == e) {
        return Expr::new(ExprKind::Var(vars[l as usize].clone()), e.dtype());
    }
    match e.kind() {
        ExprKind::Ramp { base, stride, .. } => match stride.as_int() {
            _ if l == 0 => base.clone(),
            // A constant step folded (the proof bounded every lane: no overflow).
            Some(k) => base.add(&Expr::int(k.wrapping_mul(i64::from(l)))),
            None => base.add(&stride.mul(&Expr::int(i64::from(l)))),
        },
        ExprKind::Broadcast { value, .. } => value.clone(),
        _ => e.map_children(&mut |c| lane_scalar(c, l, packed)),
    }
}

/// The C text storing value text `v` of dtype `dt` into an element.
fn stored(dt: DType, v: String) -> String {
    match dt {
        DType::F16 => format!("rivet_f32_to_f16({v})"),
        DType::BF16 => format!("rivet_f32_to_bf16({v})"),
        DType::Bool => format!("(unsigned char)({v})"),
        _ => v,
    }
}

/// The CUDA register a bound loop's variable is.
fn thread_reg(tag: ThreadTag) -> &'static str {
    tag.name()
}

/// True when evaluating `e` reads memory.
fn has_load(e: &Expr) -> bool {
    let mut found = false;
    e.visit_unique(&mut |n| found |= matches!(n.kind(), ExprKind::Load { .. }));
    found
}

/// True when `v` is read anywhere in `s`.
pub fn stmt_uses(s: &Stmt, v: &Var) -> bool {
    let mut found = false;
    s.visit_exprs(&mut |e| {
        if !found {
            found = e.uses(v);
        }
    });
    found
}

/// `(x)` -> `x` when the outer parentheses enclose the whole text.
fn strip_parens(s: &str) -> &str {
    let b = s.as_bytes();
    if b.len() < 2 || b[0] != b'(' || b[b.len() - 1] != b')' {
        return s;
    }
    let mut depth = 0i32;
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 && i != b.len() - 1 {
                    return s;
                }
            }
            _ => {}
        }
    }
    &s[1..s.len() - 1]
}

/// A float32 literal for `x` (exact: Rust's shortest round-trip form).
fn f32_lit(x: f32) -> String {
    if x.is_finite() {
        let s = format!("{x:?}");
        let s = if s.contains(['.', 'e', 'E']) {
            s
        } else {
            format!("{s}.0")
        };
        format!("{s}f")
    } else {
        format!("rivet_f32_from_bits(0x{:08x}u)", x.to_bits())
    }
}

fn f64_lit(x: f64) -> String {
    if x.is_finite() {
        let s = format!("{x:?}");
        if s.contains(['.', 'e', 'E']) {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        format!("rivet_f64_from_bits(0x{:016x}ull)", x.to_bits())
    }
}

fn int_lit(v: i64, dt: DType) -> String {
    match dt {
        DType::Bool => (if v != 0 { "true" } else { "false" }).into(),
        DType::I64 if v == i64::MIN => "(-9223372036854775807LL - 1)".into(),
        DType::I64 if v < 0 => format!("({v}LL)"),
        DType::I64 => format!("{v}LL"),
        DType::U64 => format!("{}ull", v as u64),
        DType::I32 if v == i32::MIN as i64 => "(-2147483647 - 1)".into(),
        DType::I32 if v < 0 => format!("({v})"),
        DType::I32 => format!("{v}"),
        DType::U32 => format!("{}u", v as u32),
        other => format!("(({}){v})", storage_type(other)),
    }
}

/// A constant with exactly the interpreter's value (`eval_expr` decides it).
fn constant(e: &Expr) -> Result<String> {
    let dt = e.dtype();
    let v = eval_expr(e, &|_| None)?;
    Ok(match v {
        Value::Int(i) => int_lit(i, dt),
        Value::F32(x) => f32_lit(x),
        Value::F64(x) => f64_lit(x),
    })
}

fn unary(op: UnOp, dt: DType, x: &str) -> String {
    let f32_ = dt != DType::F64;
    let pick = |f: &str, d: &str| if f32_ { f.to_string() } else { d.to_string() };
    if is_int(dt) || dt == DType::Bool {
        let t = value_type(dt);
        let u = unsigned_type(dt);
        return match op {
            UnOp::Not => format!("(!{x})"),
            UnOp::Neg => format!("(({t})(0u - ({u}){x}))"),
            UnOp::Abs if matches!(dt, DType::U8 | DType::U16 | DType::U32 | DType::U64) => {
                x.to_string()
            }
            // Wrapping: abs(MIN) is MIN.
            UnOp::Abs => format!("rivet_iabs<{t}, {u}>({x})"),
            // The verifier and the constructors allow no other op on ints.
            _ => format!("/* unsupported {op:?} */ ({x})"),
        };
    }
    let one = pick("1.0f", "1.0");
    match op {
        // A space before a negative operand: `--1.0f` would be C's decrement operator.
        UnOp::Neg if x.starts_with('-') => format!("(- {x})"),
        UnOp::Neg => format!("(-{x})"),
        UnOp::Not => format!("(!{x})"),
        UnOp::Exp => format!("{}({x})", pick("expf", "exp")),
        UnOp::Log => format!("{}({x})", pick("logf", "log")),
        UnOp::Sqrt => format!("{}({x})", pick("sqrtf", "sqrt")),
        UnOp::Rsqrt => format!("({one} / {}({x}))", pick("sqrtf", "sqrt")),
        UnOp::Tanh => format!("{}({x})", pick("tanhf", "tanh")),
        UnOp::Sigmoid if x.starts_with('-') => {
            format!("({one} / ({one} + {}(- {x})))", pick("expf", "exp"))
        }
        UnOp::Sigmoid => format!("({one} / ({one} + {}(-{x})))", pick("expf", "exp")),
        UnOp::Abs => format!("{}({x})", pick("fabsf", "fabs")),
        UnOp::Floor => format!("{}({x})", pick("floorf", "floor")),
        UnOp::Ceil => format!("{}({x})", pick("ceilf", "ceil")),
        UnOp::Erf => format!("{}({x})", pick("erff", "erf")),
    }
}

fn binary(op: BinOp, dt: DType, x: &str, y: &str, index: bool) -> String {
    if dt.is_float() {
        let f32_ = dt != DType::F64;
        let pick = |f: &str, d: &str| if f32_ { f.to_string() } else { d.to_string() };
        return match op {
            BinOp::Add => format!("({x} + {y})"),
            BinOp::Sub => format!("({x} - {y})"),
            BinOp::Mul => format!("({x} * {y})"),
            BinOp::Div => format!("({x} / {y})"),
            BinOp::FloorDiv => format!("{}({x}, {y})", pick("rivet_floordivf", "rivet_floordiv")),
            BinOp::FloorMod => format!("{}({x}, {y})", pick("rivet_floormodf", "rivet_floormod")),
            BinOp::Min => format!("{}({x}, {y})", pick("rivet_fminf", "rivet_fmin")),
            BinOp::Max => format!("{}({x}, {y})", pick("rivet_fmaxf", "rivet_fmax")),
            BinOp::Pow => format!("{}({x}, {y})", pick("powf", "pow")),
        };
    }
    let t = value_type(dt);
    let u = unsigned_type(dt);
    let wrap = |o: &str| {
        if index {
            format!("({x} {o} {y})")
        } else {
            format!("(({t})(({u}){x} {o} ({u}){y}))")
        }
    };
    match op {
        BinOp::Add => wrap("+"),
        BinOp::Sub => wrap("-"),
        BinOp::Mul => wrap("*"),
        BinOp::FloorDiv | BinOp::FloorMod => {
            let what = if op == BinOp::FloorDiv {
                "floordiv"
            } else {
                "floormod"
            };
            match dt {
                DType::U64 => format!("rivet_{what}_u64({x}, {y})"),
                DType::I64 => format!("rivet_{what}_i64({x}, {y})"),
                // Narrower ints: exact in int64, then wrapped to the dtype (MIN // -1).
                _ => format!("(({t})rivet_{what}_i64((long long){x}, (long long){y}))"),
            }
        }
        BinOp::Min => format!("rivet_min<{t}>({x}, {y})"),
        BinOp::Max => format!("rivet_max<{t}>({x}, {y})"),
        // Float-only ops (refused on ints by the constructors).
        BinOp::Div | BinOp::Pow => format!("/* unsupported {op:?} */ ({x})"),
    }
}

/// `Cast` from `from` to `to` with the interpreter's meaning.
fn cast(from: DType, to: DType, x: &str) -> String {
    if from == to {
        return x.to_string();
    }
    if to == DType::Bool {
        return format!("({x} != 0)");
    }
    let from_float = from.is_float();
    match to {
        DType::F64 => format!("((double){x})"),
        DType::F32 => format!("((float){x})"),
        DType::F16 | DType::BF16 => {
            let r = if to == DType::F16 { "f16" } else { "bf16" };
            if from == DType::F64 {
                format!("rivet_{r}_to_f32(rivet_f64_to_{r}({x}))")
            } else {
                // From float32 (float16/bfloat16 values are floats too) or an int via float32.
                format!("rivet_round_{r}((float){x})")
            }
        }
        _ if from_float => {
            let f = match to {
                DType::I8 => "rivet_f2i8",
                DType::I16 => "rivet_f2i16",
                DType::I32 => "rivet_f2i32",
                DType::I64 => "rivet_f2i64",
                DType::U8 => "rivet_f2u8",
                DType::U16 => "rivet_f2u16",
                DType::U32 => "rivet_f2u32",
                _ => "rivet_f2u64",
            };
            format!("{f}((double){x})")
        }
        // int -> int (and bool -> int): wraps (C++ conversions to unsigned wrap; to signed
        // they are modular in CUDA and since C++20).
        _ => format!("(({}){x})", value_type(to)),
    }
}

/// Intrinsic calls (`tensorize`) run CPU micro-kernels; CUDA has none yet.
fn call_refused(intrin: crate::ir::Intrin) -> Error {
    Error::Compile(format!(
        "the CUDA backend has no `{}` intrinsic: tensorize onto micro-kernels is CPU-only (build for target \"cpu\", or drop the tensorize)",
        intrin.name()
    ))
}
