//! CUDA C source from a lowered, outlined `PrimFunc`: one `extern "C" __global__` function per
//! GPU kernel (`DeviceFunc` of kind `Gpu`), and the host plan that launches them.
//!
//! Layout of a generated file: a header comment, the prelude (`prelude::PRELUDE`), then one
//! kernel per outlined body, in `func.kernels` order. A kernel's parameters are its captures
//! in `DeviceFunc` order: the buffers as typed pointers to element 0, then the int64
//! variables (`long long`). Names are the IR's, sanitised to C identifiers and made unique
//! within the kernel (`A.s0` -> `A_s0`; a second `i` -> `i_1`).
//!
//! Mapping: every construct with the interpreter's meaning (`codegen::interp`). Statements
//! (loops, buffers, barriers, cross-thread reductions) are `stmt`'s, expressions (index
//! arithmetic, wrapping integers, 16-bit floats, math) `expr`'s, vector stores `vector`'s;
//! the C types of dtypes and the C names of IR names are `types`'.

mod expr;
mod stmt;
mod types;
mod vector;

pub use stmt::stmt_uses;
pub use types::{sanitize, storage_type, value_type};

use super::idx32::{analyse, Index32, Narrow};
use super::prelude::PRELUDE;
use crate::error::{Error, Result};
use crate::ir::expr::{BufId, Expr, ExprKind, Var};
use crate::ir::stmt::{BufKind, DeviceKind, ForKind, PrimFunc, Scope, Stmt};
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
    /// The 32-bit variant: index nodes are `int` (`idx32` proved them in range).
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
}

/// Intrinsic calls (`tensorize`) run CPU micro-kernels; CUDA has none yet.
fn call_refused(intrin: crate::ir::Intrin) -> Error {
    Error::Compile(format!(
        "the CUDA backend has no `{}` intrinsic: tensorize onto micro-kernels is CPU-only (build for target \"cpu\", or drop the tensorize)",
        intrin.name()
    ))
}
