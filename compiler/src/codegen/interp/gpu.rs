//! GPU semantics in the interpreter: how a kernel (the subtree of an outermost loop bound to
//! a launch dimension, `ir::verify::gpu`) runs, so that CI checks GPU-scheduled IR on the CPU.
//!
//! - Blocks run one after another, in grid order (x fastest); each gets fresh `shared`
//!   buffers.
//! - Within a block, the threads run *phase by phase*: every statement is run by all threads
//!   of the block (in thread order) before any thread runs the next one. A loop bound to a
//!   thread index does not iterate: its variable is the thread's index. A loop whose bounds
//!   are the same for all threads is iterated together; one whose bounds differ, and the
//!   branches of an `If`, run with the threads that take them. A `Barrier` starts a new phase
//!   and must be reached by all threads of the block.
//! - Each thread has its own bindings (`Let`, loop variables) and its own copy of every
//!   `local`-scope buffer.
//! - Races are errors, never silent: within a phase, an element written by one thread and
//!   read or written by another is a data race; so is an element of global memory written
//!   by one block and read or written by another (blocks are unordered). Reporting them is
//!   what makes this a test oracle for GPU schedules: a missing barrier shows here as an
//!   error, not as a result that happens to be right because the interpreter is serial.
//! - A cross-thread reduction (`Stmt::AllReduce`) is reached by all threads of the block
//!   (else an error, as for a barrier): each evaluates its value, each group (the threads of
//!   equal `threadIdx.y`, `threadIdx.z`) is combined in the order of `allreduce_group` (the
//!   order the CUDA backend's warp shuffles use: bit-exact with it), and every thread of the
//!   group gets the result in its own copy of the `local` destination. It is not a barrier:
//!   the phase does not change.

use super::machine::Machine;
use super::{IdMap, Value};
use crate::error::{Error, Result};
use crate::ir::expr::{BinOp, Expr, ReduceOp, Var};
use crate::ir::stmt::{ForKind, Scope, Stmt};
use std::collections::HashMap;

/// Largest number of threads of a block (CUDA's limit).
const MAX_BLOCK_THREADS: i64 = 1024;

/// Who touched an element last, within the current phase.
#[derive(Clone, Copy)]
struct Access {
    block: u64,
    phase: u64,
    writer: Option<usize>,
    reader: Option<usize>,
    many_readers: bool,
}

/// The state of the block being run.
pub(super) struct Block {
    /// Each thread's (x, y, z) index.
    coords: Vec<[i64; 3]>,
    /// The block's extent in x (threads of one `AllReduce` group are consecutive).
    dim_x: usize,
    /// Each thread's bindings made inside the kernel.
    envs: Vec<IdMap<i64>>,
    /// `local`-scope buffers alive now: buffer position -> one zeroed copy per thread.
    locals: Vec<(usize, Vec<Vec<u8>>)>,
    /// Linear index of the block in the grid, and its phase (barriers passed).
    block: u64,
    phase: u64,
    /// The thread running the current statement.
    cur: usize,
    /// Accesses of this launch, per buffer position and element offset.
    accesses: HashMap<usize, HashMap<i64, Access>>,
}

impl Machine<'_> {
    /// Runs the kernel rooted at `root` (a loop bound to a launch dimension).
    ///
    /// # Safety
    /// As `exec`.
    pub(super) unsafe fn run_kernel(&mut self, root: &Stmt) -> Result<()> {
        if self.gpu.is_some() {
            return Err(self.err("a kernel inside a kernel"));
        }
        // The grid: the perfect nest of block loops at the top.
        let mut grid: Vec<(&Var, i64)> = Vec::new();
        let mut body = root;
        while let Stmt::For {
            var,
            extent,
            kind: ForKind::Thread(tag),
            body: inner,
            ..
        } = body
        {
            if !tag.is_block() {
                break;
            }
            let n = self.int(extent)?;
            grid.push((var, n));
            body = inner;
        }
        // The block: the extent of each thread dimension (verified uniform and constant).
        let mut dims = [1i64; 3];
        let mut bad = None;
        body.visit(&mut |s| {
            if let Stmt::For {
                extent,
                kind: ForKind::Thread(tag),
                ..
            } = s
            {
                match extent.as_int() {
                    Some(n) if !tag.is_block() => dims[tag.axis()] = n,
                    _ => bad = Some(format!("{} loop of extent `{extent}`", tag.name())),
                }
            }
        });
        if let Some(b) = bad {
            return Err(self.err(format!("kernel has a {b} inside its block body")));
        }
        let nthreads = dims[0] * dims[1] * dims[2];
        if !(1..=MAX_BLOCK_THREADS).contains(&nthreads) {
            return Err(self.err(format!(
                "a block of {} x {} x {} threads (at most {MAX_BLOCK_THREADS})",
                dims[0], dims[1], dims[2]
            )));
        }
        let mut coords = Vec::with_capacity(nthreads as usize);
        for z in 0..dims[2] {
            for y in 0..dims[1] {
                for x in 0..dims[0] {
                    coords.push([x, y, z]);
                }
            }
        }
        let all: Vec<usize> = (0..coords.len()).collect();
        let blocks: i64 = grid.iter().map(|(_, n)| (*n).max(0)).product();
        let mut state = Box::new(Block {
            dim_x: dims[0] as usize,
            envs: vec![IdMap::default(); coords.len()],
            coords,
            locals: Vec::new(),
            block: 0,
            phase: 0,
            cur: 0,
            accesses: HashMap::new(),
        });
        let mut r = Ok(());
        for b in 0..blocks {
            // Block `b`'s index in each grid dimension, the first fastest.
            let mut rest = b;
            for (v, n) in &grid {
                self.env.insert(v.id, rest % n);
                rest /= n;
            }
            state.block = b as u64;
            state.phase = 0;
            self.gpu = Some(state);
            // SAFETY: forwarded.
            r = unsafe { self.exec_block(body, &all) };
            state = self.gpu.take().expect("set above");
            if r.is_err() {
                break;
            }
        }
        for (v, _) in &grid {
            self.env.remove(&v.id);
        }
        r
    }

    fn block(&mut self) -> &mut Block {
        self.gpu.as_mut().expect("inside a kernel")
    }

    /// Runs `f` as thread `t`: its bindings in scope, its copies of local buffers in place.
    fn as_thread<R>(&mut self, t: usize, f: impl FnOnce(&mut Self) -> Result<R>) -> Result<R> {
        let g = self.gpu.as_mut().expect("inside a kernel");
        g.cur = t;
        for (k, v) in &g.envs[t] {
            self.env.insert(*k, *v);
        }
        for (pos, copies) in &mut g.locals {
            self.bufs[*pos].ptr = copies[t].as_mut_ptr();
        }
        let r = f(self);
        let g = self.gpu.as_ref().expect("inside a kernel");
        for k in g.envs[t].keys() {
            self.env.remove(k);
        }
        r
    }

    /// Evaluates integer `e` for each thread of `active`.
    fn per_thread(&mut self, e: &Expr, active: &[usize]) -> Result<Vec<i64>> {
        active
            .iter()
            .map(|&t| self.as_thread(t, |m| m.int(e)))
            .collect()
    }

    fn bind_all(&mut self, v: &Var, active: &[usize], values: &[i64]) {
        let g = self.block();
        for (&t, &x) in active.iter().zip(values) {
            g.envs[t].insert(v.id, x);
        }
    }

    fn unbind_all(&mut self, v: &Var, active: &[usize]) {
        let g = self.block();
        for &t in active {
            g.envs[t].remove(&v.id);
        }
    }

    /// Runs `s` with the threads `active` of the block, phase by phase (module header).
    ///
    /// # Safety
    /// As `exec`.
    unsafe fn exec_block(&mut self, s: &Stmt, active: &[usize]) -> Result<()> {
        if active.is_empty() {
            return Ok(());
        }
        match s {
            Stmt::For {
                var,
                kind: ForKind::Thread(tag),
                body,
                ..
            } => {
                if tag.is_block() {
                    return Err(self.err(format!(
                        "loop over `{}` bound to {} inside a block",
                        var.name,
                        tag.name()
                    )));
                }
                let axis = tag.axis();
                let values: Vec<i64> = active
                    .iter()
                    .map(|&t| self.block().coords[t][axis])
                    .collect();
                self.bind_all(var, active, &values);
                // SAFETY: forwarded.
                let r = unsafe { self.exec_block(body, active) };
                self.unbind_all(var, active);
                r
            }
            Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } => {
                let lo = self.per_thread(min, active)?;
                let n = self.per_thread(extent, active)?;
                let uniform = lo.iter().all(|&x| x == lo[0]) && n.iter().all(|&x| x == n[0]);
                let mut r = Ok(());
                if uniform {
                    for i in 0..n[0].max(0) {
                        let v = vec![lo[0].wrapping_add(i); active.len()];
                        self.bind_all(var, active, &v);
                        // SAFETY: forwarded.
                        r = unsafe { self.exec_block(body, active) };
                        if r.is_err() {
                            break;
                        }
                    }
                } else {
                    // Threads iterate on their own; a barrier inside is reached by some only.
                    'threads: for (k, &t) in active.iter().enumerate() {
                        for i in 0..n[k].max(0) {
                            self.bind_all(var, &[t], &[lo[k].wrapping_add(i)]);
                            // SAFETY: forwarded.
                            r = unsafe { self.exec_block(body, &[t]) };
                            if r.is_err() {
                                break 'threads;
                            }
                        }
                    }
                }
                self.unbind_all(var, active);
                r
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let mut yes = Vec::new();
                let mut no = Vec::new();
                for &t in active {
                    if self.as_thread(t, |m| m.truth(cond))? {
                        yes.push(t);
                    } else {
                        no.push(t);
                    }
                }
                // SAFETY: forwarded.
                unsafe { self.exec_block(then, &yes)? };
                match otherwise {
                    // SAFETY: forwarded.
                    Some(o) => unsafe { self.exec_block(o, &no) },
                    None => Ok(()),
                }
            }
            Stmt::Let { var, value, body } => {
                let v = self.per_thread(value, active)?;
                self.bind_all(var, active, &v);
                // SAFETY: forwarded.
                let r = unsafe { self.exec_block(body, active) };
                self.unbind_all(var, active);
                r
            }
            Stmt::Store { .. } => {
                for &t in active {
                    // SAFETY: forwarded (a store has no sub-statements: `exec` stays on `t`).
                    self.as_thread(t, |m| unsafe { m.exec(s) })?;
                }
                Ok(())
            }
            Stmt::Allocate { bufs, body } => {
                let begun = self.alloc_all(bufs)?;
                for &pos in &begun {
                    if self.decls[pos].scope == Scope::Local {
                        // One zeroed copy per thread, swapped in by `as_thread`.
                        let bytes = self.bufs[pos].storage.as_ref().map_or(0, Vec::len);
                        let n = self.block().coords.len();
                        self.block().locals.push((pos, vec![vec![0u8; bytes]; n]));
                    } else {
                        // Fresh memory: accesses to an earlier allocation do not race with it.
                        self.block().accesses.remove(&pos);
                    }
                }
                // SAFETY: forwarded; the buffers live until `alloc_end`.
                let r = unsafe { self.exec_block(body, active) };
                for &pos in begun.iter().rev() {
                    if self.decls[pos].scope == Scope::Local {
                        self.block().locals.retain(|(p, _)| *p != pos);
                    }
                    self.alloc_end(pos);
                }
                r
            }
            Stmt::Seq(v) => {
                for s in v {
                    // SAFETY: forwarded.
                    unsafe { self.exec_block(s, active)? };
                }
                Ok(())
            }
            Stmt::Launch { .. } => Err(self.err("a launch inside a kernel")),
            Stmt::AllReduce {
                op,
                tag,
                value,
                dst,
            } => {
                let (n, b, x) = {
                    let g = self.block();
                    (g.coords.len(), g.block, g.dim_x)
                };
                if active.len() != n {
                    return Err(self.err(format!(
                        "cross-thread reduction reached by {} of the {n} threads of block {b}: threads diverged",
                        active.len()
                    )));
                }
                if tag.axis() != 0 || tag.is_block() {
                    return Err(self.err(format!(
                        "cross-thread reduction over {}: only threadIdx.x is supported",
                        tag.name()
                    )));
                }
                let dt = value.dtype();
                let mut values = Vec::with_capacity(n);
                for &t in active {
                    values.push(self.as_thread(t, |m| m.eval(value))?);
                }
                let bop = match op {
                    ReduceOp::Sum => BinOp::Add,
                    ReduceOp::Prod => BinOp::Mul,
                    ReduceOp::Max => BinOp::Max,
                    ReduceOp::Min => BinOp::Min,
                };
                // Threads are in x-fastest order (`run_kernel`): a group is `x` consecutive ones.
                let pos = self.buf_pos(dst.0)?;
                for (g, group) in values.chunks(x.max(1)).enumerate() {
                    let r = allreduce_group(group, |a, b| super::scalar::binary(bop, dt, a, b))
                        .ok_or_else(|| {
                            self.err(format!("cross-thread {op:?} of {dt} values in `{value}`"))
                        })?;
                    for &t in &active[g * x..g * x + group.len()] {
                        self.as_thread(t, |m| m.store_first(pos, r))?;
                    }
                }
                Ok(())
            }
            Stmt::Call { intrin, .. } => Err(self.err(format!(
                "a call of `{}` inside a GPU kernel (calls are CPU micro-kernels)",
                intrin.name()
            ))),
            Stmt::Barrier => {
                let g = self.block();
                let (n, b) = (g.coords.len(), g.block);
                if active.len() != n {
                    return Err(self.err(format!(
                        "barrier reached by {} of the {n} threads of block {b}: threads diverged",
                        active.len()
                    )));
                }
                self.block().phase += 1;
                Ok(())
            }
        }
    }

    /// Writes `v` to element 0 of local buffer `pos` (the current thread's copy).
    fn store_first(&mut self, pos: usize, v: Value) -> Result<()> {
        let b = &self.bufs[pos];
        if !b.live || b.lo > 0 || b.hi < 0 {
            return Err(self.err(format!(
                "cross-thread reduction into `{}`, which has no element 0 here",
                b.name
            )));
        }
        // SAFETY: element 0 is within the live buffer's span (checked above).
        if !unsafe { super::machine::write_elem(b.ptr, b.dtype, v) } {
            return Err(self.err(format!(
                "cross-thread reduction stores {v:?} into `{}` which is {}",
                b.name, b.dtype
            )));
        }
        Ok(())
    }

    /// Records an access of the current thread to element `off` of buffer `pos`, and fails
    /// on a race with another thread of this phase or another block.
    pub(super) fn record_access(&mut self, pos: usize, off: i64, write: bool) -> Result<()> {
        if self.decls.get(pos).is_some_and(|b| b.scope == Scope::Local) {
            return Ok(()); // private to the thread
        }
        let g = self.gpu.as_mut().expect("inside a kernel");
        let (t, block, phase) = (g.cur, g.block, g.phase);
        let fresh = Access {
            block,
            phase,
            writer: None,
            reader: None,
            many_readers: false,
        };
        let a = g
            .accesses
            .entry(pos)
            .or_default()
            .entry(off)
            .or_insert(fresh);
        let race = if a.block != block {
            // Blocks are unordered: any write involved is a race.
            let r = a.writer.is_some() || (write && (a.reader.is_some() || a.many_readers));
            let other = a.block;
            *a = fresh;
            r.then(|| format!("block {other} and block {block}"))
        } else {
            if a.phase != phase {
                *a = fresh; // ordered by a barrier
            }
            let other_writer = a.writer.filter(|&w| w != t);
            let other_reader = a.many_readers || a.reader.is_some_and(|r| r != t);
            if let Some(w) = other_writer {
                Some(format!("threads {w} and {t} of block {block}"))
            } else if write && other_reader {
                Some(format!(
                    "threads {} and {t} of block {block}",
                    a.reader.unwrap_or(t)
                ))
            } else {
                None
            }
        };
        if let Some(who) = race {
            let name = self.bufs[pos].name.clone();
            return Err(Error::Internal(format!(
                "IR interpreter, function `{}`: data race on element {off} of `{name}` between {who} (a {} with no barrier between; a missing barrier or an unsafe binding)",
                self.name,
                if write { "write after another access" } else { "read of another thread's write" }
            )));
        }
        if write {
            a.writer = Some(t);
        } else {
            match a.reader {
                None => a.reader = Some(t),
                Some(r) if r != t => a.many_readers = true,
                _ => {}
            }
        }
        Ok(())
    }
}

/// Largest power of two below `n` (0 for `n <= 1`): the first `shfl_down` offset of a tree
/// over `n` values.
pub(crate) fn first_offset(n: usize) -> usize {
    if n <= 1 {
        0
    } else {
        1 << (usize::BITS - 1 - (n - 1).leading_zeros())
    }
}

/// The `shfl_down` tree over at most 32 values: for each offset from `first_offset(len)` down
/// to 1, every element `j` with `j + off < len` becomes `combine(v[j], v[j + off])`, all at
/// once (each reads the others' values from before the step). The result is element 0.
fn shuffle_tree(
    mut v: Vec<Value>,
    combine: &impl Fn(Value, Value) -> Option<Value>,
) -> Option<Value> {
    let mut off = first_offset(v.len());
    while off > 0 {
        // Ascending: v[j + off] is read before this step writes it.
        for j in 0..v.len() - off {
            v[j] = combine(v[j], v[j + off])?;
        }
        off /= 2;
    }
    v.first().copied()
}

/// The order in which a cross-thread reduction combines the values of one group of threads
/// (in `threadIdx.x` order): the reference for the CUDA backend's `rivet_allreduce_x`
/// (prelude), which does exactly this with warp shuffles. Each run of 32 consecutive values
/// (a warp's share of the group) is reduced by `shuffle_tree`; when there are several runs,
/// their results are reduced by the same tree (in CUDA: through shared memory, by the first
/// warp). `None` for an empty group or when `combine` fails.
pub(crate) fn allreduce_group(
    values: &[Value],
    combine: impl Fn(Value, Value) -> Option<Value>,
) -> Option<Value> {
    let partials: Vec<Value> = values
        .chunks(32)
        .map(|run| shuffle_tree(run.to_vec(), &combine))
        .collect::<Option<_>>()?;
    if partials.len() == 1 {
        Some(partials[0])
    } else {
        shuffle_tree(partials, &combine)
    }
}
