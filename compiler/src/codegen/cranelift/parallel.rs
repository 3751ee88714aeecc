//! Parallel loops: the body of a `ForKind::Parallel` loop outlined by the host/device split
//! (`lower::outline`, which records its captures) is compiled into its own function
//! `body(ctx: *const i64, lo: i64, hi: i64)` running iterations `[lo, hi)`. `ctx` is an
//! array of 8-byte slots, in a stack slot of the caller, holding every buffer pointer and
//! variable the body uses from outside (sorted by buffer id, then variable id). The caller
//! then calls `rivet_parallel_for(body, ctx, min, extent)`, which splits the range over
//! rivet's rayon pool. Parallel loops nested in a parallel body run serially, and so does a
//! loop of constant extents that does too little work for the pool (`too_small_for_the_pool`:
//! generated inline, not outlined).

use super::{Compiler, FnGen, FuncText, PTR};
use crate::error::{Error, Result};
use crate::ir::{BufId, DeviceFunc, Stmt, Var};
use cranelift_codegen::ir::{
    types, AbiParam, InstBuilder, StackSlotData, StackSlotKind, Type, UserFuncName, Value,
};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module};

/// One value passed to an outlined body.
#[derive(Clone, Copy, Debug)]
enum Capture {
    Buf(BufId),
    Var(u32, Type),
}

impl FnGen<'_, '_> {
    /// Emits a parallel loop: spills the captured values, outlines the body, calls the driver.
    pub(super) fn parallel_for(
        &mut self,
        kernel: &DeviceFunc,
        var: &Var,
        lo: Value,
        ext: Value,
        body: &Stmt,
    ) -> Result<()> {
        // The captures the host/device split recorded: all bound here.
        let mut caps = Vec::new();
        for &b in &kernel.bufs {
            if !self.bufs.contains_key(&b) {
                return Err(Error::Internal(format!(
                    "{}: captured buffer id {} is not available at the launch",
                    kernel.name, b.0
                )));
            }
            caps.push(Capture::Buf(b));
        }
        for v in &kernel.vars {
            let Some((_, ty)) = self.vars.get(&v.id) else {
                return Err(Error::Internal(format!(
                    "{}: captured variable `{}` is not bound at the launch",
                    kernel.name, v.name
                )));
            };
            caps.push(Capture::Var(v.id, *ty));
        }
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (8 * caps.len().max(1)) as u32,
            3,
        ));
        for (k, c) in caps.iter().enumerate() {
            let x = match *c {
                Capture::Buf(b) => self.buf_ptr(b)?,
                Capture::Var(v, _) => {
                    let cv = self.vars[&v].0;
                    self.b.use_var(cv)
                }
            };
            self.b.ins().stack_store(PTR, x, slot, (8 * k) as i32);
        }
        let ctx = self.b.ins().stack_addr(PTR, slot, 0);
        let body_id = self.cx.gen_body(var, body, &caps)?;
        let fref = self.cx.module.declare_func_in_func(body_id, self.b.func);
        let faddr = self.b.ins().func_addr(PTR, fref);
        let status = self.call1(
            "rivet_parallel_for",
            &[PTR, PTR, types::I64, types::I64],
            types::I32,
            &[faddr, ctx, lo, ext],
        )?;
        self.fail_if(status, None)
    }
}

impl Compiler<'_> {
    /// Builds and defines the outlined body of a parallel loop.
    fn gen_body(&mut self, var: &Var, body: &Stmt, caps: &[Capture]) -> Result<FuncId> {
        let mut sig = self.module.make_signature();
        sig.params.push(AbiParam::new(PTR));
        sig.params.push(AbiParam::new(types::I64));
        sig.params.push(AbiParam::new(types::I64));
        sig.returns.push(AbiParam::new(types::I32));
        let name = format!("{}.parallel{}", self.name(), self.n_bodies);
        self.n_bodies += 1;
        let id = self
            .module
            .declare_function(&name, Linkage::Local, &sig)
            .map_err(|e| Error::Internal(format!("cranelift: declare {name}: {e:?}")))?;
        let mut ctx = self.module.make_context();
        ctx.func.signature = sig;
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        let mut fctx = FunctionBuilderContext::new();
        let config = self.module.target_config();
        {
            let b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let mut g = FnGen::new(b, self, true);
            let block = g.b.create_block();
            g.b.append_block_params_for_function_params(block);
            g.b.switch_to_block(block);
            g.b.seal_block(block);
            let (cptr, lo, hi) = {
                let p = g.b.block_params(block);
                (p[0], p[1], p[2])
            };
            for (k, c) in caps.iter().enumerate() {
                let off = (8 * k) as i32;
                match *c {
                    Capture::Buf(b) => {
                        let p = g.b.ins().load(PTR, super::expr::flags(), cptr, off);
                        g.bind_buf(b, p);
                    }
                    Capture::Var(v, ty) => {
                        let x = g.b.ins().load(ty, super::expr::flags(), cptr, off);
                        g.bind_var(v, x);
                    }
                }
            }
            g.counted_loop(var, lo, hi, body)?;
            let ok = g.iconst(types::I32, 0);
            g.b.ins().return_(&[ok]);
            g.b.seal_all_blocks();
            g.b.finalize(config);
        }
        let FuncText { clif, disasm } = self.define(id, &name, &mut ctx)?;
        self.bodies.push(FuncText { clif, disasm });
        Ok(id)
    }
}

/// Whether a parallel loop (`launch`, its `For`) does so little work that the pool would cost
/// more than it saves, whatever the rest of the call does: every loop in it has a constant
/// extent, the stores it executes number fewer than `2 * MIN_CHUNK_WORK` (the chunk rule of
/// `rivet_parallel_for` would give it one chunk on its own), and it holds nothing but serial
/// (or vectorized, unrolled) loops, sequences, `let`s, `if`s and stores (no allocation, call,
/// nested parallel loop or cross-thread statement, which an outlined body handles
/// differently). The caller then runs it inline. Without this, the
/// rule sized each loop's chunks by the whole call's work: a layer_norm backward's two
/// combinations of 16 x 1024 partials woke both threads of the pool for a few microseconds of
/// work each (two threads, 0.366 -> 0.343 ms with them inline).
pub(super) fn too_small_for_the_pool(s: &Stmt) -> bool {
    /// Stores executed by `s`, or `None` past the limit or for anything not counted exactly.
    fn stores(s: &Stmt, limit: i64) -> Option<i64> {
        match s {
            Stmt::Store { .. } => Some(1),
            Stmt::Seq(v) => v.iter().try_fold(0i64, |acc, x| {
                let n = acc.checked_add(stores(x, limit)?)?;
                (n < limit).then_some(n)
            }),
            Stmt::Let { body, .. } => stores(body, limit),
            // Both arms (an upper bound).
            Stmt::If {
                then, otherwise, ..
            } => {
                let a = stores(then, limit)?;
                let b = otherwise.as_ref().map_or(Some(0), |o| stores(o, limit))?;
                a.checked_add(b).filter(|n| *n < limit)
            }
            // A parallel loop nested in it runs serially in an outlined body; the host code
            // generator refuses one (it expects every host-level parallel loop outlined).
            Stmt::For {
                kind: crate::ir::ForKind::Parallel | crate::ir::ForKind::Thread(_),
                ..
            } => None,
            Stmt::For { extent, body, .. } => {
                let e = crate::arith::simplify::simplify(extent).as_int()?.max(0);
                if e == 0 {
                    return Some(0);
                }
                e.checked_mul(stores(body, limit)?).filter(|n| *n < limit)
            }
            _ => None,
        }
    }
    stores(s, 2 * rivet_runtime::parallel::MIN_CHUNK_WORK).is_some()
}

/// The signature of an outlined parallel body.
pub(super) type BodyFn = unsafe extern "C" fn(*const i64, i64, i64) -> i32;

/// Runs `body(ctx, lo, hi)` over `[min, min + extent)` split into contiguous chunks on rivet's
/// pool (`rivet_runtime::parallel::chunks`: at most 4 per thread, each at least
/// `MIN_CHUNK_WORK` of the call's work), with the host lock released; inline when the rule
/// gives one chunk, the pool has one thread, or this already is a pool thread. Returns 0, or 1 when a chunk failed: the first fault recorded by a failing chunk
/// (on whichever thread ran it) is moved to this thread's fault slot, and chunks not yet
/// started are skipped.
///
/// # Safety
/// `body` must be an outlined body generated for `ctx`, safe to run concurrently on disjoint
/// ranges (the compiler's contract for parallel loops), and `ctx` must stay valid until this
/// returns.
pub(super) unsafe extern "C" fn rivet_parallel_for(
    body: BodyFn,
    ctx: *const i64,
    min: i64,
    extent: i64,
) -> i32 {
    use super::helpers::{set_fault, take_fault};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    if extent <= 0 {
        return 0;
    }
    use rivet_runtime::parallel as par;
    let threads = par::num_threads().max(1) as i64;
    // Inline: when the call's work is small (`serially`), when this is already one of the
    // pool's threads (a parallel region inside another: no nested oversubscription), or when
    // the rule gives one chunk.
    let chunks = if par::serial_requested() || par::in_pool() {
        1
    } else {
        par::chunks(extent, threads, par::call_work())
    };
    if chunks < 2 {
        // SAFETY: the caller's contract. `min + extent` is in range: the bounds proof
        // obliges every loop's end to fit in int64.
        return unsafe { body(ctx, min, min + extent) };
    }
    let ctx_addr = ctx as usize;
    let failed = AtomicBool::new(false);
    let fault = Mutex::new(None);
    // The caller and the pool's workers take chunks from a shared counter until none is left
    // (a dynamic schedule, `par::for_each_chunk`); the caller waits only for chunks a worker
    // took. A blocking `broadcast` put the caller to sleep until every worker had run: ~10 us
    // a loop on this project's VMs. Before that, a parallel iterator woke one worker and left
    // the others to steal: after the pool had slept, the second of two threads often never
    // joined (softmax's backward at 1024 x 1024 ran at its one-thread speed, call after call).
    rivet_runtime::host_lock::without_host_lock(|| {
        par::for_each_chunk(chunks, &|c| {
            if failed.load(Ordering::Relaxed) {
                return;
            }
            let lo = min + ((extent as i128 * c as i128) / chunks as i128) as i64;
            let hi = min + ((extent as i128 * (c + 1) as i128) / chunks as i128) as i64;
            // SAFETY: the caller's contract: iterations write disjoint elements and `ctx`
            // outlives this call (it is only read).
            if unsafe { body(ctx_addr as *const i64, lo, hi) } != 0 {
                failed.store(true, Ordering::Relaxed);
                let f = take_fault();
                let mut slot = fault.lock().unwrap_or_else(|e| e.into_inner());
                if slot.is_none() {
                    *slot = f;
                }
            }
        });
    });
    if !failed.load(Ordering::Relaxed) {
        return 0;
    }
    if let Some(f) = fault.into_inner().unwrap_or_else(|e| e.into_inner()) {
        set_fault(f);
    }
    1
}
