//! The GPU rules of the verifier: where thread-bound loops, barriers and the `shared` and
//! `local` storage scopes may stand. `verify` runs it on every function; a function with no
//! GPU construct passes trivially.
//!
//! The model is CUDA's. A *kernel* is the subtree of an outermost loop bound to a launch
//! dimension (`ForKind::Thread`); everything inside it runs on every thread of every block:
//! - block loops (`blockIdx.*`) form a perfect nest at the top of the kernel (the grid), each
//!   tag once; no block loop appears deeper. The statements under the innermost block loop
//!   are the *block body*, run by all threads of a block;
//! - thread loops (`threadIdx.*`) stand anywhere in the block body; a loop bound to a tag does
//!   not iterate, its variable is the thread's index. All loops bound to one thread tag in a
//!   kernel have the same constant extent (the block's size in that dimension, 1 to 1024, and
//!   1 to 64 for `threadIdx.z`, CUDA's `maxBlockDimZ`) and none is nested in another of the
//!   same tag; a block has at most 1024 threads;
//! - every bound loop starts at 0; a block loop's extent is computed before the launch, so it
//!   may not use variables bound inside the kernel;
//! - no `Parallel` loop inside a kernel, and no kernel inside a `Parallel` or `Vectorized`
//!   loop;
//! - a `Barrier` stands inside a kernel, and every thread of the block reaches it: it is not
//!   under an `If` of the kernel, nor in a loop whose bounds differ between threads (they use
//!   a thread index, a `Let` or loop variable derived from one, or a load);
//! - a cross-thread reduction (`AllReduce`) is a collective: it stands inside a kernel, inside
//!   the loop bound to its tag, which is `threadIdx.x` (its groups are runs of consecutive
//!   threads, which is what warps are made of), and, like a barrier, every thread of the block
//!   reaches it. When the block also has `threadIdx.y` / `threadIdx.z` threads (several
//!   groups), the `threadIdx.x` extent is a power of two, so that no warp holds part of a group
//!   and part of another unless it holds both whole (the CUDA lowering's shuffles rely on
//!   it);
//! - scopes: parameters are `Global`; `Shared` and `Local` buffers are locals of constant,
//!   non-negative shape (compact, strides known at compile time). `Shared` buffers are
//!   allocated in a block body outside every thread loop (one copy per block); a `Global`
//!   temporary is never allocated inside a kernel (kernels cannot allocate device memory).
//!
//! Violations are `Error::Internal` like every verifier rule (the loader turns them into the
//! file's fault).

use crate::error::{Error, Result};
use crate::ir::expr::{BufId, Expr, ExprKind, Var};
use crate::ir::stmt::{BufKind, DeviceFunc, ForKind, PrimFunc, Scope, Stmt, ThreadTag};
use std::collections::{HashMap, HashSet};

/// Whether `func` uses any GPU construct (a bound loop, a barrier, a shared buffer).
pub fn uses_gpu(func: &PrimFunc) -> bool {
    let mut gpu = func.buffers.iter().any(|b| b.scope == Scope::Shared);
    func.visit_all(&mut |s| {
        gpu |= matches!(
            s,
            Stmt::Barrier
                | Stmt::AllReduce { .. }
                | Stmt::For {
                    kind: ForKind::Thread(_),
                    ..
                }
        )
    });
    gpu
}

/// Checks the rules of the module documentation.
pub fn check(func: &PrimFunc) -> Result<()> {
    let fail = |rule: &str, detail: String| {
        Err(Error::Internal(format!(
            "IR verifier, function `{}`: {rule}: {detail}",
            func.name
        )))
    };
    for (i, b) in func.buffers.iter().enumerate() {
        let is_param = i < func.params.len() || matches!(b.kind, BufKind::Param { .. });
        if is_param && b.scope != Scope::Global {
            return fail(
                "parameters live in global memory",
                format!("parameter `{}` has scope {:?}", b.name, b.scope),
            );
        }
        if b.scope != Scope::Global && !b.shape.iter().all(|e| e.as_int().is_some_and(|n| n >= 0)) {
            let shape: Vec<String> = b.shape.iter().map(|e| e.to_string()).collect();
            return fail(
                "shared and local buffers have a constant shape",
                format!(
                    "`{}` ({:?}) has shape ({})",
                    b.name,
                    b.scope,
                    shape.join(", ")
                ),
            );
        }
    }
    let scopes: HashMap<u32, (Scope, &str)> = func
        .buffers
        .iter()
        .map(|b| (b.id.0, (b.scope, b.name.as_str())))
        .collect();
    let mut w = Walker {
        kernels: &func.kernels,
        scopes,
        kernel: None,
        in_parallel: None,
        fail: String::new(),
    };
    w.stmt(&func.body, &Ctx::default());
    if w.fail.is_empty() {
        Ok(())
    } else {
        Err(Error::Internal(format!(
            "IR verifier, function `{}`: {}",
            func.name, w.fail
        )))
    }
}

/// What is known at a point of the walk.
#[derive(Clone, Default)]
struct Ctx {
    /// Inside a kernel's block body (below its block loops).
    in_block_body: bool,
    /// Thread tags bound by enclosing loops.
    threads: Vec<ThreadTag>,
    /// Inside an `If` of the kernel, or a loop of thread-varying bounds.
    divergent: Option<String>,
    /// Variables whose value may differ between the threads of a block.
    varying: HashSet<u32>,
}

/// The state of the kernel being walked.
struct Kernel {
    /// Block tags of its grid.
    blocks: Vec<ThreadTag>,
    /// Extent of each thread tag seen.
    thread_extents: HashMap<ThreadTag, i64>,
    /// Variables bound inside the kernel.
    inner: HashSet<u32>,
    /// Whether it holds a cross-thread reduction.
    allreduce: bool,
}

struct Walker<'a> {
    /// Outlined bodies: a `Launch` is checked as if its body stood there.
    kernels: &'a [DeviceFunc],
    scopes: HashMap<u32, (Scope, &'a str)>,
    kernel: Option<Kernel>,
    /// The enclosing `Parallel` or `Vectorized` loop, if any.
    in_parallel: Option<String>,
    /// The first violation (the walk stops adding once set).
    fail: String,
}

fn vars_of(e: &Expr, out: &mut Vec<u32>, loads: &mut bool) {
    e.visit(&mut |n| match n.kind() {
        ExprKind::Var(v) => out.push(v.id),
        ExprKind::Load { .. } => *loads = true,
        _ => {}
    });
}

/// CUDA's limit on a block's z dimension (`maxBlockDimZ`, 64 on every architecture); x and y
/// allow 1024.
pub const MAX_BLOCK_DIM_Z: i64 = 64;

/// Records the first violation.
fn set(fail: &mut String, rule: &str, detail: String) {
    if fail.is_empty() {
        *fail = format!("{rule}: {detail}");
    }
}

impl Walker<'_> {
    /// Whether `e` may differ between the threads of a block.
    fn varies(&self, e: &Expr, cx: &Ctx) -> bool {
        let (mut vs, mut loads) = (Vec::new(), false);
        vars_of(e, &mut vs, &mut loads);
        loads || vs.iter().any(|v| cx.varying.contains(v))
    }

    fn bind_inner(&mut self, v: &Var) {
        if let Some(k) = self.kernel.as_mut() {
            k.inner.insert(v.id);
        }
    }

    /// Where local `buf` may be allocated: shared memory in a kernel's block body outside
    /// its thread loops, global memory outside kernels.
    fn allocation(&mut self, buf: BufId, cx: &Ctx) {
        let (scope, name) = self
            .scopes
            .get(&buf.0)
            .copied()
            .unwrap_or((Scope::Global, "?"));
        match scope {
            Scope::Shared => {
                if self.kernel.is_none() || !cx.in_block_body {
                    set(
                        &mut self.fail,
                        "shared buffers are allocated in a kernel's block body",
                        format!("shared `{name}` is allocated outside a kernel"),
                    );
                } else if let Some(t) = cx.threads.first() {
                    set(
                        &mut self.fail,
                        "shared buffers are allocated outside thread loops (one copy per block)",
                        format!(
                            "shared `{name}` is allocated inside a loop bound to {}",
                            t.name()
                        ),
                    );
                }
            }
            Scope::Global if self.kernel.is_some() => set(
                &mut self.fail,
                "a kernel cannot allocate global memory",
                format!(
                    "global temporary `{name}` is allocated inside a kernel; allocate it outside"
                ),
            ),
            _ => {}
        }
    }

    fn stmt(&mut self, s: &Stmt, cx: &Ctx) {
        if !self.fail.is_empty() {
            return;
        }
        match s {
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => self.for_(var, min, extent, *kind, body, cx),
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let mut inner = cx.clone();
                if self.kernel.is_some() && inner.divergent.is_none() {
                    inner.divergent = Some(format!("if {cond}"));
                }
                self.stmt(then, &inner);
                if let Some(o) = otherwise {
                    self.stmt(o, &inner);
                }
            }
            Stmt::Let { var, value, body } => {
                let mut inner = cx.clone();
                if self.kernel.is_some() && self.varies(value, cx) {
                    inner.varying.insert(var.id);
                }
                self.bind_inner(var);
                self.stmt(body, &inner)
            }
            Stmt::Allocate { bufs, body } => {
                for buf in bufs {
                    self.allocation(*buf, cx);
                }
                self.stmt(body, cx)
            }
            Stmt::Seq(v) => v.iter().for_each(|s| self.stmt(s, cx)),
            Stmt::Store { .. } => {}
            Stmt::Launch { kernel } => {
                if let Some(k) = self.kernels.get(*kernel) {
                    self.stmt(&k.body, cx)
                }
            }
            Stmt::AllReduce { tag, dst, .. } => {
                let name = self.scopes.get(&dst.0).map_or("?", |(_, n)| *n);
                match self.kernel.as_mut() {
                    None => set(
                        &mut self.fail,
                        "a cross-thread reduction stands inside a kernel",
                        format!("allreduce into `{name}` outside any loop bound to a block or thread index"),
                    ),
                    Some(_) if *tag != ThreadTag::ThreadX => set(
                        &mut self.fail,
                        "a cross-thread reduction runs over threadIdx.x",
                        format!("allreduce into `{name}` over {}", tag.name()),
                    ),
                    Some(_) if !cx.threads.contains(tag) => set(
                        &mut self.fail,
                        "a cross-thread reduction stands inside the loop bound to its thread index",
                        format!("allreduce into `{name}` over {} outside such a loop", tag.name()),
                    ),
                    Some(k) => {
                        k.allreduce = true;
                        if let Some(d) = &cx.divergent {
                            set(
                                &mut self.fail,
                                "every thread of a block reaches a cross-thread reduction",
                                format!("allreduce into `{name}` under `{d}`, which threads may take differently"),
                            );
                        }
                    }
                }
            }
            Stmt::Call { intrin, .. } => {
                if self.kernel.is_some() {
                    set(
                        &mut self.fail,
                        "intrinsic calls (CPU micro-kernels) stand outside kernels",
                        format!("call of `{}` inside a GPU kernel", intrin.name()),
                    );
                }
            }
            Stmt::Barrier => {
                if self.kernel.is_none() {
                    set(
                        &mut self.fail,
                        "a barrier stands inside a kernel",
                        "barrier outside any loop bound to a block or thread index".into(),
                    );
                } else if let Some(d) = &cx.divergent {
                    set(
                        &mut self.fail,
                        "every thread of a block reaches a barrier",
                        format!("barrier under `{d}`, which threads may take differently"),
                    );
                }
            }
        }
    }

    fn for_(&mut self, var: &Var, min: &Expr, extent: &Expr, kind: ForKind, body: &Stmt, cx: &Ctx) {
        let mut inner = cx.clone();
        match kind {
            ForKind::Thread(tag) => {
                if min.as_int() != Some(0) {
                    return set(
                        &mut self.fail,
                        "bound loops start at 0",
                        format!(
                            "loop over `{}` bound to {} starts at {min}",
                            var.name,
                            tag.name()
                        ),
                    );
                }
                if let Some(p) = &self.in_parallel {
                    return set(
                        &mut self.fail,
                        "kernels are not nested in parallel or vectorized loops",
                        format!(
                            "loop over `{}` bound to {} is inside {p}",
                            var.name,
                            tag.name()
                        ),
                    );
                }
                let root = self.kernel.is_none();
                if root {
                    self.kernel = Some(Kernel {
                        blocks: Vec::new(),
                        thread_extents: HashMap::new(),
                        inner: HashSet::new(),
                        allreduce: false,
                    });
                }
                let k = self.kernel.as_mut().expect("set above");
                if tag.is_block() {
                    // Only directly in the block-loop nest at the top of the kernel.
                    if !root && cx.in_block_body {
                        set(
                            &mut self.fail,
                            "block loops form a perfect nest at the top of a kernel",
                            format!(
                                "loop over `{}` bound to {} is inside the block body",
                                var.name,
                                tag.name()
                            ),
                        );
                    } else if k.blocks.contains(&tag) {
                        set(
                            &mut self.fail,
                            "a launch dimension is bound once",
                            format!(
                                "loop over `{}`: {} is already bound by an enclosing loop",
                                var.name,
                                tag.name()
                            ),
                        );
                    } else {
                        let (mut vs, mut loads) = (Vec::new(), false);
                        vars_of(extent, &mut vs, &mut loads);
                        if loads || vs.iter().any(|v| k.inner.contains(v)) {
                            set(&mut self.fail,
                                "a grid dimension is known before the launch",
                                format!("loop over `{}` bound to {} has extent `{extent}`, which uses values of the kernel", var.name, tag.name()),
                            );
                        }
                        k.blocks.push(tag);
                        k.inner.insert(var.id);
                        // The block body starts where the block-loop nest ends.
                        let nested_block = matches!(
                            body,
                            Stmt::For { kind: ForKind::Thread(t), .. } if t.is_block()
                        );
                        inner.in_block_body = !nested_block;
                    }
                } else {
                    inner.in_block_body = true;
                    match extent.as_int() {
                        Some(n) if (1..=1024).contains(&n) => {
                            if tag == ThreadTag::ThreadZ && n > MAX_BLOCK_DIM_Z {
                                set(
                                    &mut self.fail,
                                    "a threadIdx.z loop has an extent of at most 64",
                                    format!(
                                        "loop over `{}` bound to threadIdx.z has extent {n}, over CUDA's limit of {MAX_BLOCK_DIM_Z} threads in a block's z dimension (blockDim.z); bind a smaller axis to threadIdx.z, or split it",
                                        var.name
                                    ),
                                );
                            } else if cx.threads.contains(&tag) {
                                set(
                                    &mut self.fail,
                                    "a launch dimension is bound once",
                                    format!(
                                        "loop over `{}`: {} is already bound by an enclosing loop",
                                        var.name,
                                        tag.name()
                                    ),
                                );
                            } else if let Some(&m) = k.thread_extents.get(&tag) {
                                if m != n {
                                    set(&mut self.fail,
                                        "all loops bound to one thread index have the block's extent",
                                        format!("loop over `{}` bound to {} has extent {n}, another has {m}", var.name, tag.name()),
                                    );
                                }
                            } else {
                                k.thread_extents.insert(tag, n);
                            }
                        }
                        _ => set(
                            &mut self.fail,
                            "a thread loop has a constant extent from 1 to 1024",
                            format!(
                                "loop over `{}` bound to {} has extent `{extent}`",
                                var.name,
                                tag.name()
                            ),
                        ),
                    }
                    k.inner.insert(var.id);
                    inner.threads.push(tag);
                    inner.varying.insert(var.id);
                }
                self.stmt(body, &inner);
                if root {
                    let k = self.kernel.take().expect("set above");
                    let threads: i64 = k.thread_extents.values().product();
                    if threads > 1024 {
                        set(
                            &mut self.fail,
                            "a block has at most 1024 threads",
                            format!(
                                "the kernel at loop `{}` has blocks of {threads} threads",
                                var.name
                            ),
                        );
                    }
                    let ext = |t| k.thread_extents.get(&t).copied().unwrap_or(1);
                    let x = ext(ThreadTag::ThreadX);
                    let groups = ext(ThreadTag::ThreadY) * ext(ThreadTag::ThreadZ);
                    if k.allreduce && groups > 1 && x.count_ones() != 1 {
                        set(
                            &mut self.fail,
                            "a cross-thread reduction in a block with threadIdx.y or threadIdx.z threads has a power-of-two threadIdx.x extent",
                            format!(
                                "the kernel at loop `{}` reduces over {x} threads in each of {groups} groups",
                                var.name
                            ),
                        );
                    }
                }
            }
            ForKind::Parallel | ForKind::Vectorized | ForKind::Serial | ForKind::Unrolled => {
                if kind == ForKind::Parallel && self.kernel.is_some() {
                    return set(
                        &mut self.fail,
                        "no parallel loop inside a kernel",
                        format!("parallel loop over `{}` inside a kernel", var.name),
                    );
                }
                if self.kernel.is_some() {
                    if self.varies(min, cx) || self.varies(extent, cx) {
                        inner.varying.insert(var.id);
                        if inner.divergent.is_none() {
                            inner.divergent = Some(format!(
                                "the loop over `{}` (its bounds differ between threads)",
                                var.name
                            ));
                        }
                    }
                    self.bind_inner(var);
                }
                let saved = self.in_parallel.clone();
                if matches!(kind, ForKind::Parallel | ForKind::Vectorized) && saved.is_none() {
                    let k = if kind == ForKind::Parallel {
                        "parallel"
                    } else {
                        "vectorized"
                    };
                    self.in_parallel = Some(format!("the {k} loop over `{}`", var.name));
                }
                self.stmt(body, &inner);
                self.in_parallel = saved;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::expr::{Expr, Var};
    use crate::ir::stmt::Buffer;
    use crate::ir::test_util::{buffer, func, output};
    use rivet_runtime::DType;

    fn bound(x: &Var, min: i64, extent: Expr, tag: ThreadTag, body: Stmt) -> Stmt {
        Stmt::For {
            var: x.clone(),
            min: Expr::int(min),
            extent,
            kind: ForKind::Thread(tag),
            body: Box::new(body),
        }
    }
    fn looped(x: &Var, extent: Expr, kind: ForKind, body: Stmt) -> Stmt {
        Stmt::For {
            var: x.clone(),
            min: Expr::int(0),
            extent,
            kind,
            body: Box::new(body),
        }
    }
    fn store(b: &Buffer, i: Expr) -> Stmt {
        Stmt::Store {
            buf: b.id,
            indices: vec![i],
            value: Expr::constant(1.0, DType::F32),
        }
    }
    fn alloc(b: &Buffer, body: Stmt) -> Stmt {
        Stmt::Allocate {
            bufs: vec![b.id],
            body: Box::new(body),
        }
    }
    fn scoped(id: u32, scope: Scope, shape: Expr) -> Buffer {
        let mut b = buffer(id, "S", DType::F32, vec![shape], BufKind::Local);
        b.scope = scope;
        b
    }

    struct K {
        c: Buffer,
        bx: Var,
        tx: Var,
        n: Var,
    }
    fn k() -> K {
        let n = Var::new("n");
        K {
            c: output(0, "C", DType::F32, vec![Expr::var(&n)]),
            bx: Var::new("bx"),
            tx: Var::new("tx"),
            n,
        }
    }
    /// `for bx bind blockIdx.x: for tx bind threadIdx.x: <inner>`, with extra buffers.
    fn kernel(k: &K, extra: Vec<Buffer>, tx_extent: i64, inner: Stmt) -> PrimFunc {
        let body = bound(
            &k.bx,
            0,
            Expr::var(&k.n),
            ThreadTag::BlockX,
            bound(&k.tx, 0, Expr::int(tx_extent), ThreadTag::ThreadX, inner),
        );
        let mut bufs = vec![k.c.clone()];
        bufs.extend(extra);
        func("f", bufs, vec![k.n.clone()], body)
    }
    fn expect(f: &PrimFunc, rule: &str) {
        let e = crate::ir::verify::verify(f, false).unwrap_err().to_string();
        assert!(e.contains(rule), "expected '{rule}', got: {e}");
    }

    #[test]
    fn a_plain_kernel_is_valid_and_cpu_functions_are_untouched() {
        let k = k();
        let f = kernel(&k, vec![], 64, store(&k.c, Expr::var(&k.bx)));
        crate::ir::verify::verify(&f, false).unwrap();
        assert!(uses_gpu(&f));
        let cpu = func(
            "g",
            vec![k.c.clone()],
            vec![k.n.clone()],
            store(&k.c, Expr::int(0)),
        );
        assert!(!uses_gpu(&cpu));
    }

    #[test]
    fn bound_loops() {
        let k = k();
        let s = store(&k.c, Expr::int(0));
        // Starts at 0.
        let mut f = kernel(&k, vec![], 64, s.clone());
        f.body = bound(&k.bx, 1, Expr::int(4), ThreadTag::BlockX, s.clone());
        expect(&f, "bound loops start at 0");
        // Thread extents constant, 1..=1024, one extent per tag, 1024 threads per block.
        expect(
            &kernel(&k, vec![], 2048, s.clone()),
            "constant extent from 1 to 1024",
        );
        expect(
            &kernel(&k, vec![], 0, s.clone()),
            "constant extent from 1 to 1024",
        );
        let t2 = Var::new("t2");
        let twice = Stmt::Seq(vec![
            s.clone(),
            bound(&t2, 0, Expr::int(32), ThreadTag::ThreadX, s.clone()),
        ]);
        let mut f = kernel(&k, vec![], 64, s.clone());
        f.body = bound(
            &k.bx,
            0,
            Expr::int(2),
            ThreadTag::BlockX,
            Stmt::Seq(vec![
                bound(&k.tx, 0, Expr::int(64), ThreadTag::ThreadX, s.clone()),
                bound(&t2, 0, Expr::int(32), ThreadTag::ThreadX, s.clone()),
            ]),
        );
        expect(&f, "have the block's extent");
        expect(&kernel(&k, vec![], 64, twice), "bound once");
        // blockDim.z is at most 64: the error names the axis, the extent and the limit.
        let tz = Var::new("tz");
        let e = crate::ir::verify::verify(
            &kernel(
                &k,
                vec![],
                1,
                bound(&tz, 0, Expr::int(65), ThreadTag::ThreadZ, s.clone()),
            ),
            false,
        )
        .unwrap_err()
        .to_string();
        for part in [
            "threadIdx.z",
            "`tz`",
            "extent 65",
            "limit of 64",
            "blockDim.z",
        ] {
            assert!(e.contains(part), "missing '{part}' in: {e}");
        }
        crate::ir::verify::verify(
            &kernel(
                &k,
                vec![],
                1,
                bound(&tz, 0, Expr::int(64), ThreadTag::ThreadZ, s.clone()),
            ),
            false,
        )
        .unwrap();
        // x and y still take 1024.
        let ty = Var::new("ty");
        crate::ir::verify::verify(
            &kernel(
                &k,
                vec![],
                1,
                bound(&ty, 0, Expr::int(1024), ThreadTag::ThreadY, s.clone()),
            ),
            false,
        )
        .unwrap();
        expect(
            &kernel(
                &k,
                vec![],
                64,
                bound(&ty, 0, Expr::int(32), ThreadTag::ThreadY, s.clone()),
            ),
            "at most 1024 threads",
        );
        // Block loops: a perfect nest at the top, each tag once, extents known at launch.
        let by = Var::new("by");
        expect(
            &kernel(
                &k,
                vec![],
                64,
                bound(&by, 0, Expr::int(2), ThreadTag::BlockY, s.clone()),
            ),
            "perfect nest",
        );
        let mut f = kernel(&k, vec![], 64, s.clone());
        f.body = bound(
            &k.bx,
            0,
            Expr::int(2),
            ThreadTag::BlockX,
            bound(&by, 0, Expr::int(2), ThreadTag::BlockX, s.clone()),
        );
        expect(&f, "bound once");
        let mut f = kernel(&k, vec![], 64, s.clone());
        f.body = bound(
            &k.bx,
            0,
            Expr::int(2),
            ThreadTag::BlockX,
            bound(&by, 0, Expr::var(&k.bx), ThreadTag::BlockY, s.clone()),
        );
        expect(&f, "known before the launch");
    }

    #[test]
    fn parallel_loops_and_kernels_do_not_mix() {
        let k = k();
        let (p, q) = (Var::new("p"), Var::new("q"));
        let s = store(&k.c, Expr::int(0));
        expect(
            &kernel(
                &k,
                vec![],
                64,
                looped(&p, Expr::int(4), ForKind::Parallel, s.clone()),
            ),
            "no parallel loop inside a kernel",
        );
        let mut f = kernel(&k, vec![], 64, s.clone());
        f.body = looped(&q, Expr::int(4), ForKind::Parallel, f.body.clone());
        expect(&f, "not nested in parallel or vectorized loops");
        // A vectorized loop inside a thread is fine (vector loads).
        crate::ir::verify::verify(
            &kernel(
                &k,
                vec![],
                64,
                looped(&p, Expr::int(4), ForKind::Vectorized, s),
            ),
            false,
        )
        .unwrap();
    }

    #[test]
    fn barriers_are_reached_by_every_thread() {
        let k = k();
        let s = store(&k.c, Expr::int(0));
        let mut f = kernel(&k, vec![], 64, s.clone());
        f.body = Stmt::Seq(vec![f.body.clone(), Stmt::Barrier]);
        expect(&f, "inside a kernel");
        let under_if = Stmt::If {
            cond: Expr::var(&k.tx).lt(&Expr::int(32)),
            then: Box::new(Stmt::Barrier),
            otherwise: None,
        };
        expect(
            &kernel(&k, vec![], 64, under_if),
            "every thread of a block reaches a barrier",
        );
        let j = Var::new("j");
        let varying = looped(&j, Expr::var(&k.tx), ForKind::Serial, Stmt::Barrier);
        expect(
            &kernel(&k, vec![], 64, varying),
            "its bounds differ between threads",
        );
        let l = Var::new("l");
        let via_let = Stmt::Let {
            var: l.clone(),
            value: Expr::var(&k.tx).add(&Expr::int(1)),
            body: Box::new(looped(&j, Expr::var(&l), ForKind::Serial, Stmt::Barrier)),
        };
        expect(
            &kernel(&k, vec![], 64, via_let),
            "its bounds differ between threads",
        );
        // A uniform loop (bounds from dims and block indices) may hold one.
        let uniform = looped(
            &j,
            Expr::var(&k.bx).add(&Expr::var(&k.n)),
            ForKind::Serial,
            Stmt::Barrier,
        );
        crate::ir::verify::verify(&kernel(&k, vec![], 64, uniform), false).unwrap();
    }

    #[test]
    fn storage_scopes() {
        let k = k();
        let s = store(&k.c, Expr::int(0));
        // Parameters are global.
        let mut f = kernel(&k, vec![], 64, s.clone());
        f.buffers[0].scope = Scope::Shared;
        expect(&f, "parameters live in global memory");
        // Shared and local buffers have constant shapes.
        let sym = scoped(7, Scope::Local, Expr::var(&k.n));
        expect(
            &kernel(&k, vec![sym.clone()], 64, alloc(&sym, s.clone())),
            "constant shape",
        );
        // Shared: in the block body, outside thread loops.
        let sh = scoped(7, Scope::Shared, Expr::int(64));
        expect(
            &kernel(&k, vec![sh.clone()], 64, alloc(&sh, s.clone())),
            "outside thread loops",
        );
        let mut f = kernel(&k, vec![sh.clone()], 64, s.clone());
        f.body = alloc(&sh, f.body.clone());
        expect(&f, "allocated outside a kernel");
        let mut f = kernel(&k, vec![sh.clone()], 64, s.clone());
        f.body = bound(
            &k.bx,
            0,
            Expr::var(&k.n),
            ThreadTag::BlockX,
            alloc(
                &sh,
                bound(&k.tx, 0, Expr::int(64), ThreadTag::ThreadX, s.clone()),
            ),
        );
        crate::ir::verify::verify(&f, false).unwrap();
        // Global temporaries are not allocated in kernels.
        let g = scoped(7, Scope::Global, Expr::int(64));
        expect(
            &kernel(&k, vec![g.clone()], 64, alloc(&g, s.clone())),
            "cannot allocate global memory",
        );
        // Local scope is fine anywhere (one copy per thread; on the CPU, a temporary).
        let l = scoped(7, Scope::Local, Expr::int(4));
        crate::ir::verify::verify(&kernel(&k, vec![l.clone()], 64, alloc(&l, s)), false).unwrap();
    }

    #[test]
    fn the_printer_shows_bindings_scopes_and_barriers() {
        let k = k();
        let sh = scoped(7, Scope::Shared, Expr::int(64));
        let mut f = kernel(&k, vec![sh.clone()], 64, store(&k.c, Expr::var(&k.bx)));
        f.body = bound(
            &k.bx,
            0,
            Expr::var(&k.n),
            ThreadTag::BlockX,
            alloc(
                &sh,
                Stmt::Seq(vec![
                    Stmt::Barrier,
                    bound(
                        &k.tx,
                        0,
                        Expr::int(64),
                        ThreadTag::ThreadX,
                        store(&k.c, Expr::var(&k.bx)),
                    ),
                ]),
            ),
        );
        let text = f.to_string();
        for want in [
            "local S: float32[64] shared",
            "for bx in [0, n) bind blockIdx.x:",
            "barrier",
            "for tx in [0, 64) bind threadIdx.x:",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
    }

    #[test]
    fn cross_thread_reductions_are_collectives_over_thread_x() {
        let k = k();
        let acc = scoped(7, Scope::Local, Expr::int(1));
        let red = |tag| Stmt::AllReduce {
            op: crate::ir::ReduceOp::Sum,
            tag,
            value: Expr::load(acc.id, vec![Expr::int(0)], DType::F32),
            dst: acc.id,
        };
        let ok = kernel(
            &k,
            vec![acc.clone()],
            48,
            alloc(&acc, red(ThreadTag::ThreadX)),
        );
        crate::ir::verify::verify(&ok, false).unwrap();
        assert!(uses_gpu(&ok));
        expect(
            &kernel(
                &k,
                vec![acc.clone()],
                48,
                alloc(&acc, red(ThreadTag::ThreadY)),
            ),
            "runs over threadIdx.x",
        );
        let under_if = Stmt::If {
            cond: Expr::var(&k.tx).lt(&Expr::int(32)),
            then: Box::new(red(ThreadTag::ThreadX)),
            otherwise: None,
        };
        expect(
            &kernel(&k, vec![acc.clone()], 48, alloc(&acc, under_if)),
            "every thread of a block reaches a cross-thread reduction",
        );
        let mut outside = ok.clone();
        outside.body = alloc(&acc, red(ThreadTag::ThreadX));
        expect(&outside, "stands inside a kernel");
        // Several rows of threads (threadIdx.y): the x extent is a power of two.
        let ty = Var::new("ty");
        let rows = |x: i64| {
            kernel(
                &k,
                vec![acc.clone()],
                x,
                bound(
                    &ty,
                    0,
                    Expr::int(4),
                    ThreadTag::ThreadY,
                    alloc(&acc, red(ThreadTag::ThreadX)),
                ),
            )
        };
        crate::ir::verify::verify(&rows(64), false).unwrap();
        expect(&rows(48), "power-of-two threadIdx.x extent");
        // The destination: a live one-element local of the value's dtype.
        let big = scoped(8, Scope::Local, Expr::int(2));
        let mut f = kernel(&k, vec![acc.clone(), big.clone()], 48, Stmt::Seq(vec![]));
        f.body = bound(
            &k.bx,
            0,
            Expr::var(&k.n),
            ThreadTag::BlockX,
            bound(
                &k.tx,
                0,
                Expr::int(48),
                ThreadTag::ThreadX,
                alloc(
                    &big,
                    Stmt::AllReduce {
                        op: crate::ir::ReduceOp::Max,
                        tag: ThreadTag::ThreadX,
                        value: Expr::constant(1.0, DType::F32),
                        dst: big.id,
                    },
                ),
            ),
        );
        expect(&f, "one-element local-scope buffer");
        let text = ok.to_string();
        assert!(
            text.contains("S[0] = allreduce sum over threadIdx.x of S[0]"),
            "{text}"
        );
    }
}
