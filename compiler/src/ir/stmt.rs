//! Statements and functions of the loop IR: plain data, printable, serialisable.
//!
//! A `PrimFunc` is what every backend compiles and the interpreter runs. Its invariants,
//! checked by `verify`:
//! - parameter buffers come first in `buffers`, in the order of `params`; locals are
//!   introduced by `Allocate` before use;
//! - every `Var` used is bound: a symbolic dim in `dims` (bound from argument shapes at call
//!   time), a stride in a buffer's `strides`, a `For` or `Let` variable in scope;
//! - after `flatten`, every `Load`/`Store` has exactly one index (an element offset computed
//!   with the buffer's stride variables), and no te-only node (`Read`, `Reduce`) remains;
//! - GPU constructs (thread-bound loops, `Barrier`, `AllReduce`, `shared`/`local` scopes)
//!   form kernels as `ir::verify::gpu` describes.
//!
//! The cross-thread reduction (`AllReduce`) is the one collective statement: every thread of
//! the block evaluates `value`, the values of the threads that differ only in their
//! `threadIdx.x` (a *group*: the threads with equal `threadIdx.y`, `threadIdx.z`) are combined
//! with `op`, and each thread of the group receives the result in element 0 of `dst`, its own
//! one-element `local` buffer. The order of the combination is fixed (the interpreter and
//! the CUDA backend use the same one, so they agree bit for bit): within each run of 32
//! consecutive threads of a group (a warp's share) a tree of `shfl_down` steps, then the same
//! tree over the runs' partial results; `codegen::interp::gpu::allreduce_group` is the
//! reference. It is not a barrier: it orders no other memory access.

use super::expr::{BufId, Expr, ReduceOp, Var};
use super::intrin::{Intrin, Region};
use rivet_runtime::DType;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ForKind {
    Serial,
    /// Iterations may run on several threads (they write disjoint elements).
    Parallel,
    /// Iterations may run as SIMD lanes (constant extent, innermost, no reduction carried).
    Vectorized,
    /// The backend may unroll the loop (constant extent).
    Unrolled,
    /// GPU: the loop is a launch dimension (TVM's `bind`): its variable is the block or
    /// thread index `tag`, its min is 0 and its extent the size of that dimension. The
    /// outermost bound loop of a nest starts a kernel (see `ir::verify::gpu`).
    Thread(ThreadTag),
}

/// A GPU launch dimension, as CUDA names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ThreadTag {
    BlockX,
    BlockY,
    BlockZ,
    ThreadX,
    ThreadY,
    ThreadZ,
}

impl ThreadTag {
    pub const ALL: [ThreadTag; 6] = [
        ThreadTag::BlockX,
        ThreadTag::BlockY,
        ThreadTag::BlockZ,
        ThreadTag::ThreadX,
        ThreadTag::ThreadY,
        ThreadTag::ThreadZ,
    ];

    /// CUDA's spelling, which schedules use (`bind(axis, "threadIdx.x")`).
    pub fn name(self) -> &'static str {
        match self {
            ThreadTag::BlockX => "blockIdx.x",
            ThreadTag::BlockY => "blockIdx.y",
            ThreadTag::BlockZ => "blockIdx.z",
            ThreadTag::ThreadX => "threadIdx.x",
            ThreadTag::ThreadY => "threadIdx.y",
            ThreadTag::ThreadZ => "threadIdx.z",
        }
    }

    pub fn parse(s: &str) -> Option<ThreadTag> {
        ThreadTag::ALL.into_iter().find(|t| t.name() == s)
    }

    /// A block index (the grid), as opposed to a thread index within a block.
    pub fn is_block(self) -> bool {
        matches!(
            self,
            ThreadTag::BlockX | ThreadTag::BlockY | ThreadTag::BlockZ
        )
    }

    /// 0, 1, 2 for x, y, z.
    pub fn axis(self) -> usize {
        match self {
            ThreadTag::BlockX | ThreadTag::ThreadX => 0,
            ThreadTag::BlockY | ThreadTag::ThreadY => 1,
            ThreadTag::BlockZ | ThreadTag::ThreadZ => 2,
        }
    }
}

/// Where a buffer's memory lives (TVM's storage scopes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Scope {
    /// Device (or host) memory: parameters, and temporaries allocated outside kernels.
    #[default]
    Global,
    /// GPU shared memory: one copy per block, allocated inside a kernel outside its thread
    /// loops; compact, of constant shape.
    Shared,
    /// Private to one thread (registers or stack): compact, of constant shape.
    Local,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Stmt {
    For {
        var: Var,
        min: Expr,
        extent: Expr,
        kind: ForKind,
        body: Box<Stmt>,
    },
    /// `buf[indices] = value`.
    Store {
        buf: BufId,
        indices: Vec<Expr>,
        value: Expr,
    },
    If {
        cond: Expr,
        then: Box<Stmt>,
        otherwise: Option<Box<Stmt>>,
    },
    /// An int64 binding visible in `body`.
    Let {
        var: Var,
        value: Expr,
        body: Box<Stmt>,
    },
    /// Local buffers (declared in `PrimFunc::buffers`) alive during `body`, allocated in
    /// order on entry (zeroed unless marked `overwritten`) and freed on exit. One statement
    /// allocates many so that a program's root temporaries (one per materialised stage) sit
    /// in one flat list instead of one nesting level each (`Stmt::allocate_all`): statement
    /// depth, and the recursion of every pass and backend on it, does not grow with the
    /// number of stages. Never empty (`ir::verify`). Files written when it held one buffer
    /// (`"buf": id`) still load.
    Allocate {
        #[serde(alias = "buf", deserialize_with = "one_or_many")]
        bufs: Vec<BufId>,
        body: Box<Stmt>,
    },
    Seq(Vec<Stmt>),
    /// GPU: every thread of the block waits here until all have arrived, and their writes
    /// to shared and global memory before it are visible to all after it (`__syncthreads`).
    /// Reached by all threads of a block or by none (`ir::verify::gpu`).
    Barrier,
    /// GPU: `dst[0] = op-reduction of value over the threads of the group along tag` (module
    /// header). `tag` is `threadIdx.x` (`ir::verify::gpu`); `dst` is a `local` buffer of one
    /// element of `value`'s dtype. Reached by all threads of a block or by none, like a
    /// barrier, and only inside the loop bound to `tag`.
    AllReduce {
        op: ReduceOp,
        tag: ThreadTag,
        value: Expr,
        dst: BufId,
    },
    /// Runs `func.kernels[kernel]` here: a body outlined by the host/device split
    /// (`lower::outline`), with the buffers and variables it captures (only in outlined
    /// functions, never in saved ones).
    Launch {
        kernel: usize,
    },
    /// An intrinsic (a micro-kernel) applied to buffer regions it reads and writes, and
    /// scalar arguments (`ir::intrin`: the regions' meaning, the intrinsics' signatures and
    /// declared computations, which the bounds proof and the verifiers check).
    Call {
        intrin: Intrin,
        regions: Vec<Region>,
        scalars: Vec<Expr>,
    },
}

/// What runs a body outlined by the host/device split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceKind {
    /// A `Parallel` loop, run on the CPU's thread pool.
    CpuParallel,
    /// A GPU kernel (its root is a loop bound to a launch dimension).
    Gpu,
}

/// A body outlined by the host/device split, and what it needs from the host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceFunc {
    /// `<func>.parallel<k>` or `<func>_kernel<k>`.
    pub name: String,
    pub kind: DeviceKind,
    /// The outlined statement: the parallel loop or the kernel's root loop, unchanged.
    pub body: Stmt,
    /// Buffers it uses (parameters and locals allocated outside it), by id.
    pub bufs: Vec<BufId>,
    /// Variables it reads from outside (dims, strides, enclosing loop and `Let` variables),
    /// by id: all int64.
    pub vars: Vec<Var>,
}

/// Where a buffer comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BufKind {
    /// A function parameter; `output` when the function writes it.
    Param { output: bool },
    /// A local temporary, compact, freed at the end of its `Allocate`.
    Local,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub id: BufId,
    pub name: String,
    pub dtype: DType,
    /// Extents in elements, in terms of constants and the function's `dims`.
    pub shape: Vec<Expr>,
    /// Stride variables (elements), bound at call time for parameters; locals are compact and
    /// their strides are bound by `Allocate` from `shape`.
    pub strides: Vec<Var>,
    pub kind: BufKind,
    /// Where its memory lives (`Global` in files written before scopes existed).
    #[serde(default)]
    pub scope: Scope,
    /// A local every element of which is stored before any read (`lower::overwrite`): its
    /// `Allocate` need not zero it. Set only by that pass, never read from a file (a loaded
    /// module is marked again by the pass).
    #[serde(skip)]
    pub overwritten: bool,
}

/// A condition checked once per call, after the dims are bound and before any code runs
/// (bounds the compiler could not prove for every value of the symbolic dims).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub cond: Expr,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrimFunc {
    pub name: String,
    /// Parameter buffers, in call order.
    pub params: Vec<BufId>,
    /// All buffers: parameters first (same order as `params`), then locals.
    pub buffers: Vec<Buffer>,
    /// Symbolic dims (`te.var`), bound from the arguments' shapes.
    pub dims: Vec<Var>,
    pub checks: Vec<Check>,
    pub body: Stmt,
    /// Bodies outlined by the host/device split, run by `Launch` statements of `body`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<DeviceFunc>,
    /// Host callbacks, called by `Call`s of `Intrin::Callback(k)` (`ir::callback`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callbacks: Vec<super::callback::Callback>,
}

impl PrimFunc {
    /// Visits the statements of the body and of every outlined kernel, pre-order.
    pub fn visit_all(&self, f: &mut dyn FnMut(&Stmt)) {
        self.body.visit(f);
        for k in &self.kernels {
            k.body.visit(f);
        }
    }

    pub fn buffer(&self, id: BufId) -> &Buffer {
        self.buffers
            .iter()
            .find(|b| b.id == id)
            .expect("buffer ids are verified")
    }
}

/// An `Allocate`'s buffers as a file gives them: a list, or one id (files written before an
/// `Allocate` held several).
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<BufId>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(BufId),
        Many(Vec<BufId>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(b) => vec![b],
        OneOrMany::Many(v) => v,
    })
}

impl Stmt {
    /// `body` with the local `buf` alive in it.
    pub fn allocate(buf: BufId, body: Stmt) -> Stmt {
        Stmt::Allocate {
            bufs: vec![buf],
            body: Box::new(body),
        }
    }

    /// `body` with the locals `bufs` alive in it: one flat `Allocate` however many they are,
    /// or `body` itself when there are none.
    pub fn allocate_all(bufs: Vec<BufId>, body: Stmt) -> Stmt {
        if bufs.is_empty() {
            return body;
        }
        Stmt::Allocate {
            bufs,
            body: Box::new(body),
        }
    }

    /// Deepest nesting of statements (a statement with no sub-statement is 1; each loop,
    /// condition, `let`, allocation and sequence adds 1, as `ir::verify` counts it), found
    /// without recursion.
    pub fn depth(&self) -> u32 {
        let mut deepest = 0;
        let mut stack = vec![(self, 1u32)];
        while let Some((s, d)) = stack.pop() {
            deepest = deepest.max(d);
            match s {
                Stmt::For { body, .. } | Stmt::Let { body, .. } | Stmt::Allocate { body, .. } => {
                    stack.push((body, d + 1))
                }
                Stmt::If {
                    then, otherwise, ..
                } => {
                    stack.push((then, d + 1));
                    if let Some(o) = otherwise {
                        stack.push((o, d + 1));
                    }
                }
                Stmt::Seq(v) => stack.extend(v.iter().map(|x| (x, d + 1))),
                Stmt::Store { .. }
                | Stmt::Barrier
                | Stmt::AllReduce { .. }
                | Stmt::Launch { .. }
                | Stmt::Call { .. } => {}
            }
        }
        deepest
    }

    pub fn seq(mut stmts: Vec<Stmt>) -> Stmt {
        if stmts.len() == 1 {
            stmts.pop().unwrap()
        } else {
            Stmt::Seq(stmts)
        }
    }

    /// Rebuilds the statement bottom-up: `fe` rewrites every expression, `fs` may replace each
    /// rebuilt statement.
    pub fn rewrite(
        &self,
        fe: &mut dyn FnMut(&Expr) -> Expr,
        fs: &mut dyn FnMut(Stmt) -> Stmt,
    ) -> Stmt {
        let s = match self {
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => Stmt::For {
                var: var.clone(),
                min: fe(min),
                extent: fe(extent),
                kind: *kind,
                body: Box::new(body.rewrite(fe, fs)),
            },
            Stmt::Store {
                buf,
                indices,
                value,
            } => Stmt::Store {
                buf: *buf,
                indices: indices.iter().map(&mut *fe).collect(),
                value: fe(value),
            },
            Stmt::If {
                cond,
                then,
                otherwise,
            } => Stmt::If {
                cond: fe(cond),
                then: Box::new(then.rewrite(fe, fs)),
                otherwise: otherwise.as_ref().map(|o| Box::new(o.rewrite(fe, fs))),
            },
            Stmt::Let { var, value, body } => Stmt::Let {
                var: var.clone(),
                value: fe(value),
                body: Box::new(body.rewrite(fe, fs)),
            },
            Stmt::Allocate { bufs, body } => Stmt::Allocate {
                bufs: bufs.clone(),
                body: Box::new(body.rewrite(fe, fs)),
            },
            Stmt::Seq(v) => Stmt::Seq(v.iter().map(|s| s.rewrite(fe, fs)).collect()),
            Stmt::Barrier => Stmt::Barrier,
            Stmt::AllReduce {
                op,
                tag,
                value,
                dst,
            } => Stmt::AllReduce {
                op: *op,
                tag: *tag,
                value: fe(value),
                dst: *dst,
            },
            Stmt::Launch { kernel } => Stmt::Launch { kernel: *kernel },
            Stmt::Call {
                intrin,
                regions,
                scalars,
            } => Stmt::Call {
                intrin: *intrin,
                regions: regions.iter().map(|r| r.map(&mut *fe)).collect(),
                scalars: scalars.iter().map(&mut *fe).collect(),
            },
        };
        fs(s)
    }

    /// Visits statements pre-order.
    pub fn visit(&self, f: &mut dyn FnMut(&Stmt)) {
        f(self);
        match self {
            Stmt::For { body, .. } | Stmt::Let { body, .. } | Stmt::Allocate { body, .. } => {
                body.visit(f)
            }
            Stmt::If {
                then, otherwise, ..
            } => {
                then.visit(f);
                if let Some(o) = otherwise {
                    o.visit(f)
                }
            }
            Stmt::Seq(v) => v.iter().for_each(|s| s.visit(f)),
            Stmt::Store { .. }
            | Stmt::Barrier
            | Stmt::AllReduce { .. }
            | Stmt::Launch { .. }
            | Stmt::Call { .. } => {}
        }
    }

    /// Visits every expression of every statement (not recursing into the expressions).
    pub fn visit_exprs(&self, f: &mut dyn FnMut(&Expr)) {
        self.visit(&mut |s| match s {
            Stmt::For { min, extent, .. } => {
                f(min);
                f(extent)
            }
            Stmt::Store { indices, value, .. } => {
                indices.iter().for_each(&mut *f);
                f(value)
            }
            Stmt::If { cond, .. } => f(cond),
            Stmt::Let { value, .. } | Stmt::AllReduce { value, .. } => f(value),
            Stmt::Call {
                regions, scalars, ..
            } => {
                regions.iter().flat_map(|r| r.exprs()).for_each(&mut *f);
                scalars.iter().for_each(&mut *f)
            }
            Stmt::Allocate { .. } | Stmt::Seq(_) | Stmt::Barrier | Stmt::Launch { .. } => {}
        });
    }
}
