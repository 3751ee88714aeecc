//! Statements: loops, conditionals, bindings, stores and local allocations.

use super::expr::value_ty;
use super::{FnGen, PTR};
use crate::error::{Error, Result};
use crate::ir::{BufId, BufKind, DeviceKind, Stmt, Var};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, InstBuilder, StackSlot, StackSlotData, StackSlotKind, Value};
use rivet_runtime::DType;
use std::collections::HashSet;

impl<'f> FnGen<'_, 'f> {
    pub(super) fn stmt(&mut self, s: &Stmt) -> Result<()> {
        match s {
            Stmt::Seq(v) => v.iter().try_for_each(|s| self.stmt(s)),
            Stmt::Launch { kernel } => {
                let func = self.func;
                let k = func
                    .kernels
                    .get(*kernel)
                    .ok_or_else(|| Error::Internal(format!("launch of unknown kernel {kernel}")))?;
                match (&k.kind, &k.body) {
                    (
                        DeviceKind::CpuParallel,
                        Stmt::For {
                            var,
                            min,
                            extent,
                            body,
                            ..
                        },
                    ) if !self.in_body => {
                        let lo = self.expr(min)?;
                        let lo = self.index_i64(lo, min.dtype());
                        let ext = self.expr(extent)?;
                        let ext = self.index_i64(ext, extent.dtype());
                        if super::parallel::too_small_for_the_pool(&k.body) {
                            // No overflow: the bounds proof obliges a loop's end to fit.
                            let hi = self.b.ins().iadd(lo, ext);
                            return self.counted_loop(var, lo, hi, body);
                        }
                        self.parallel_for(k, var, lo, ext, body)
                    }
                    _ => Err(Error::Internal(format!(
                        "the CPU backend cannot launch `{}` here",
                        k.name
                    ))),
                }
            }
            Stmt::Barrier => Err(Error::Internal(
                "a barrier reached the CPU backend (GPU functions are refused before codegen)"
                    .into(),
            )),
            Stmt::AllReduce { .. } => Err(Error::Internal(
                "a cross-thread reduction reached the CPU backend (GPU functions are refused before codegen)"
                    .into(),
            )),
            Stmt::Store {
                buf,
                indices,
                value,
            } => self.store(*buf, indices, value),
            Stmt::Call {
                intrin, regions, ..
            } => self.call_intrin(*intrin, regions),
            Stmt::Let { var, value, body } => {
                let x = self.expr(value)?;
                if self.b.func.dfg.value_type(x) != value_ty(value.dtype()) {
                    return Err(Error::Internal(format!(
                        "let {}: value of the wrong type",
                        var.name
                    )));
                }
                let old = self.bind_var(var.id, x);
                self.stmt(body)?;
                self.restore_var(var.id, old);
                Ok(())
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let c = self.expr(cond)?;
                let then_b = self.b.create_block();
                let merge = self.b.create_block();
                let else_b = if otherwise.is_some() {
                    self.b.create_block()
                } else {
                    merge
                };
                self.b.ins().brif(c, then_b, &[], else_b, &[]);
                // Blocks are sealed as soon as all their predecessors exist: the SSA builder
                // then resolves variables locally instead of threading every variable through
                // every unsealed block (quadratic in long functions).
                self.b.seal_block(then_b);
                if otherwise.is_some() {
                    self.b.seal_block(else_b);
                }
                self.b.switch_to_block(then_b);
                self.stmt(then)?;
                self.b.ins().jump(merge, &[]);
                if let Some(o) = otherwise {
                    self.b.switch_to_block(else_b);
                    self.stmt(o)?;
                    self.b.ins().jump(merge, &[]);
                }
                self.b.seal_block(merge);
                self.b.switch_to_block(merge);
                Ok(())
            }
            Stmt::For {
                var,
                min,
                extent,
                body,
                kind,
            } => {
                if *kind == crate::ir::ForKind::Parallel && !self.in_body {
                    return Err(Error::Internal(format!(
                        "parallel loop over `{}` not outlined by the host/device split",
                        var.name
                    )));
                }
                if *kind != crate::ir::ForKind::Parallel {
                    if let Some(run) = super::exp_run::matches(var, body) {
                        return self.exp_run(var, min, extent, &run);
                    }
                }
                let lo = self.expr(min)?;
                let lo = self.index_i64(lo, min.dtype());
                let ext = self.expr(extent)?;
                let ext = self.index_i64(ext, extent.dtype());
                // Serial, Vectorized and Unrolled loops all run as plain counted loops, and so
                // do parallel loops left inside an outlined parallel body (the split outlines
                // only the outermost).
                let hi = self.b.ins().iadd(lo, ext);
                self.counted_loop(var, lo, hi, body)
            }
            Stmt::Allocate { bufs, body } => self.allocate_nested(bufs, body),
        }
    }

    pub(super) fn index_i64(&mut self, v: Value, dt: DType) -> Value {
        let ty = self.b.func.dfg.value_type(v);
        if ty == types::I64 {
            v
        } else if matches!(dt, DType::U8 | DType::U16 | DType::U32 | DType::Bool) {
            self.b.ins().uextend(types::I64, v)
        } else {
            self.b.ins().sextend(types::I64, v)
        }
    }

    /// `for var in lo..hi { body }`, behind a preheader that runs only when `lo < hi`: there
    /// the loop-invariant scalars of its vector statements are computed once (`hoist.rs`) and
    /// its loop-carried vectors loaded; the loop itself is rotated (`plain_counted_loop`)
    /// unless it carries vectors and hoists nothing.
    pub(super) fn counted_loop(
        &mut self,
        var: &Var,
        lo: Value,
        hi: Value,
        body: &Stmt,
    ) -> Result<()> {
        let invariant = super::hoist::invariant_broadcasts(var, body);
        let carried = super::hoist::loop_carried(var, body, &super::vector::packed, self.func);
        let pre = self.b.create_block();
        let after = self.b.create_block();
        let go = self.b.ins().icmp(IntCC::SignedLessThan, lo, hi);
        self.b.ins().brif(go, pre, &[], after, &[]);
        self.b.seal_block(pre);
        self.b.switch_to_block(pre);
        let mut keys = Vec::with_capacity(invariant.len());
        for e in &invariant {
            let v = self.expr(e)?;
            let key = std::sync::Arc::as_ptr(&e.0) as usize;
            self.hoisted.insert(key, v);
            keys.push(key);
        }
        let mut regs = Vec::with_capacity(carried.len());
        for (buf, index) in &carried {
            let (addr, ty) = self.vector_address(*buf, index)?;
            let v = self.b.ins().load(ty, super::expr::flags(), addr, 0);
            let reg = self.fresh_var(ty);
            self.b.def_var(reg, v);
            regs.push((addr, reg, ty));
            self.promoted.push((*buf, index.clone(), reg));
        }
        // Rotated so that Cranelift keeps invariant arithmetic out of the loop (the address
        // arithmetic of a row, `i * X.s0`, as much as hoisted scalars: `plain_counted_loop`);
        // a loop whose only gain is loop-carried registers keeps the test at the top, the
        // shape that lets loads fuse into broadcasts (rotation passes the carried values on
        // both edges of the bottom branch, docs/vector.md).
        let shape = if invariant.is_empty() && !carried.is_empty() {
            LoopShape::Top
        } else {
            LoopShape::Rotated
        };
        let r = self.plain_counted_loop(var, lo, hi, body, shape);
        for k in keys {
            self.hoisted.remove(&k);
        }
        let n = self.promoted.len();
        self.promoted.truncate(n - carried.len());
        r?;
        // After the last iteration: the registers back to memory.
        for (addr, reg, ty) in regs {
            let v = self.b.use_var(reg);
            self.b.ins().store(super::expr::flags(), v, addr, 0);
            self.free_vars.entry(ty).or_default().push(reg);
        }
        self.b.ins().jump(after, &[]);
        self.b.seal_block(after);
        self.b.switch_to_block(after);
        Ok(())
    }

    /// The loop itself. `Top`: tested at the top (the exit reads the header's state, so no
    /// branch carries block arguments: what keeps a splat of a load fused into
    /// `vbroadcastss`: Cranelift fuses a load into an instruction only within one block). `Rotated`: entered only when
    /// `lo < hi` (the caller's preheader tested it), `var + 1 < hi` tested at its bottom; for loops
    /// whose invariant arithmetic `hoist.rs` computed before them: Cranelift's egraph
    /// elaboration walks the dominator tree keeping a stack of the loops it is in, pops a loop
    /// at the first block outside it and pushes one back only on entering a header; with the
    /// test at the top, the exit is a dominator-tree sibling of the body, and when the exit's
    /// subtree (everything after the loop) was walked first the body had lost its loop, so the
    /// hoisted pure arithmetic (layer_norm's `rsqrt(var + eps)`: two divisions and a square
    /// root) was placed back inside it, once per four elements. Rotated, the exit's immediate
    /// dominator is the block before the loop and every block the header dominates is in it.
    fn plain_counted_loop(
        &mut self,
        var: &Var,
        lo: Value,
        hi: Value,
        body: &Stmt,
        shape: LoopShape,
    ) -> Result<()> {
        let old = self.bind_var(var.id, lo);
        self.loop_vars.push(var.clone());
        let counter = self.vars[&var.id].0;
        match shape {
            LoopShape::Top => {
                let header = self.b.create_block();
                let body_b = self.b.create_block();
                let exit = self.b.create_block();
                self.b.ins().jump(header, &[]);
                self.b.switch_to_block(header);
                let i = self.b.use_var(counter);
                let go = self.b.ins().icmp(IntCC::SignedLessThan, i, hi);
                self.b.ins().brif(go, body_b, &[], exit, &[]);
                self.b.seal_block(body_b);
                self.b.seal_block(exit);
                self.b.switch_to_block(body_b);
                self.iteration(body)?;
                let i = self.b.use_var(counter);
                let next = self.b.ins().iadd_imm_s(i, 1);
                self.b.def_var(counter, next);
                self.b.ins().jump(header, &[]);
                self.b.seal_block(header);
                self.b.switch_to_block(exit);
            }
            LoopShape::Rotated => {
                let body_b = self.b.create_block();
                let exit = self.b.create_block();
                self.b.ins().jump(body_b, &[]);
                self.b.switch_to_block(body_b);
                self.iteration(body)?;
                let i = self.b.use_var(counter);
                // No overflow: i < hi <= i64::MAX.
                let next = self.b.ins().iadd_imm_s(i, 1);
                self.b.def_var(counter, next);
                let more = self.b.ins().icmp(IntCC::SignedLessThan, next, hi);
                self.b.ins().brif(more, body_b, &[], exit, &[]);
                self.b.seal_block(body_b);
                self.b.seal_block(exit);
                self.b.switch_to_block(exit);
            }
        }
        self.loop_vars.pop();
        self.restore_var(var.id, old);
        Ok(())
    }

    /// One iteration of a counted loop's body: first the broadcast scalars several of its
    /// vector statements share (`hoist::per_iteration_broadcasts`), then the body.
    fn iteration(&mut self, body: &Stmt) -> Result<()> {
        let shared = super::hoist::per_iteration_broadcasts(body);
        let mut keys = Vec::new();
        for (e, at) in &shared {
            if at.iter().any(|k| self.hoisted.contains_key(k)) {
                continue;
            }
            let v = self.expr(e)?;
            for k in at {
                self.hoisted.insert(*k, v);
                keys.push(*k);
            }
        }
        let r = self.stmt(body);
        for k in keys {
            self.hoisted.remove(&k);
        }
        r
    }

    /// Local buffers inside a function body (not the entry function's root `Allocate`s,
    /// which `allocate_root` places): each allocated in order and bound for `body`, then
    /// released in reverse order after it (or on a failure exit).
    fn allocate_nested(&mut self, bufs: &[BufId], body: &Stmt) -> Result<()> {
        let mut held = Vec::with_capacity(bufs.len());
        for &id in bufs {
            let buf = self.local_decl(id)?;
            let h = if !self.cx.checked && in_register(self.func, buf, body) {
                self.local_in_register(buf, true)
            } else {
                let plan = self.local_memory(buf)?;
                let ptr = self.local_ptr(&plan)?;
                let mut olds = Vec::new();
                for (v, s) in buf.strides.iter().zip(&plan.strides) {
                    olds.push((v.id, self.bind_var(v.id, *s)));
                }
                let old_buf = self.bind_buf(id, ptr);
                Held::Memory {
                    id,
                    on_heap: plan.on_stack.is_none(),
                    old_buf,
                    olds,
                }
            };
            held.push(h);
        }
        self.stmt(body)?;
        for h in held.into_iter().rev() {
            self.release(h)?;
        }
        Ok(())
    }

    /// The declaration of local `id`, checked to be one.
    fn local_decl(&self, id: BufId) -> Result<&'f crate::ir::Buffer> {
        let func = self.func;
        let buf =
            func.buffers.iter().find(|b| b.id == id).ok_or_else(|| {
                Error::Internal(format!("Allocate of unknown buffer id {}", id.0))
            })?;
        if buf.kind != BufKind::Local {
            return Err(Error::Internal(format!(
                "Allocate of parameter buffer {}",
                buf.name
            )));
        }
        if !buf.strides.is_empty() && buf.strides.len() != buf.shape.len() {
            return Err(Error::Internal(format!(
                "local {}: {} strides for {} dims",
                buf.name,
                buf.strides.len(),
                buf.shape.len()
            )));
        }
        Ok(buf)
    }

    /// A local buffer's size and strides, and where its memory comes from (see the module
    /// doc):
    /// - a constant shape of at most `STACK_LOCAL_MAX` bytes, while the function's stack
    ///   locals stay within `STACK_FRAME_MAX`: a slot of the function's stack frame, zeroed
    ///   on each entry (a parallel body's locals are thus per thread);
    /// - anything else: `rivet_alloc`, the per-thread arena of `helpers.rs` (reused blocks,
    ///   no system allocation per call once warm), checked against `MAX_ALLOC_BYTES`.
    ///
    /// A symbolic size was checked against `MAX_ALLOC_BYTES` before the launch
    /// (`call::allocate`) and a constant one at build, so the products below cannot wrap.
    fn local_memory(&mut self, buf: &crate::ir::Buffer) -> Result<LocalPlan> {
        let mut extents = Vec::with_capacity(buf.shape.len());
        for s in &buf.shape {
            let v = self.expr(s)?;
            extents.push(self.index_i64(v, s.dtype()));
        }
        // Compact (row-major) strides; a negative extent counts as 0 elements. The element
        // count is exact: an overflowing product (possible only for a function launched
        // without `call::allocate`'s size check, which refuses it first) asks `rivet_alloc` for
        // -1 bytes, a `MemoryError`, never a wrapped small size.
        // Constant extents multiply here, while the count is constant too (a packed
        // panel's inner dims): the code for them would only be folded away by Cranelift.
        let mut strides = vec![self.iconst(types::I64, 1); extents.len()];
        let mut count = self.iconst(types::I64, 1);
        let mut wrapped = self.iconst(types::I8, 0);
        for k in (0..extents.len()).rev() {
            strides[k] = count;
            let known = self.scalar_const(count).zip(self.scalar_const(extents[k]));
            if let Some(p) = known.and_then(|(c, e)| c.checked_mul(e.max(0))) {
                count = self.iconst(types::I64, p);
                continue;
            }
            let zero = self.iconst(types::I64, 0);
            let e = self.b.ins().smax(extents[k], zero);
            let hi = self.b.ins().umulhi(count, e);
            let over = self.b.ins().icmp_imm_u(IntCC::NotEqual, hi, 0);
            wrapped = self.b.ins().bor(wrapped, over);
            count = self.b.ins().imul(count, e);
        }
        let size = buf.dtype.size() as i64;
        let limit = (crate::ir::limits::MAX_ALLOC_BYTES as i64) / size;
        let too_many = self
            .b
            .ins()
            .icmp_imm_u(IntCC::UnsignedGreaterThan, count, limit);
        let bad = self.b.ins().bor(wrapped, too_many);
        let product = self.b.ins().imul_imm_s(count, size);
        let minus_one = self.iconst(types::I64, -1);
        let bytes = self.b.ins().select(bad, minus_one, product);
        let on_stack = stack_bytes(&buf.shape, buf.dtype.size())
            .filter(|&n| self.stack_bytes.saturating_add(n) <= STACK_FRAME_MAX);
        if let Some(n) = on_stack {
            self.stack_bytes += n;
        }
        Ok(LocalPlan {
            overwritten: buf.overwritten,
            strides,
            bytes,
            on_stack,
        })
    }

    /// The memory of a planned local: a zeroed stack slot, or a block of `rivet_alloc`
    /// registered for release on a failure exit (`live_allocs`). Its address.
    fn local_ptr(&mut self, plan: &LocalPlan) -> Result<Value> {
        if let Some(slot) = self.local_slot(plan)? {
            return Ok(self.b.ins().stack_addr(PTR, slot, 0));
        }
        let ptr = self.local_heap(plan)?;
        self.live_allocs.push(Live::Block(ptr, plan.bytes));
        Ok(ptr)
    }

    /// A planned stack local's slot, zeroed unless the local is stored in full before any
    /// read (`lower::overwrite`); `None` for a heap local.
    fn local_slot(&mut self, plan: &LocalPlan) -> Result<Option<StackSlot>> {
        let Some(n) = plan.on_stack else {
            return Ok(None);
        };
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            n.max(1),
            LOCAL_ALIGN_SHIFT,
        ));
        if !plan.overwritten {
            let ptr = self.b.ins().stack_addr(PTR, slot, 0);
            self.zero(ptr, n)?;
        }
        Ok(Some(slot))
    }

    /// A planned heap local's block from `rivet_alloc` (a failure exits, releasing what
    /// `live_allocs` holds).
    fn local_heap(&mut self, plan: &LocalPlan) -> Result<Value> {
        let alloc = if plan.overwritten {
            "rivet_alloc_uninit"
        } else {
            "rivet_alloc"
        };
        let ptr = self.call1(alloc, &[types::I64], PTR, &[plan.bytes])?;
        // A null address: the helper recorded why (too large, or refused).
        let null = self.b.ins().icmp_imm_u(IntCC::Equal, ptr, 0);
        self.fail_if(null, None)?;
        Ok(ptr)
    }

    /// A one-element local kept in a Cranelift variable (`in_register`): it starts at zero
    /// like memory from `Allocate`; stores and loads become definitions and uses, so a
    /// reduction's accumulator lives in a register across its loop. With `bind_strides`, its
    /// strides (compact: 1) stay bound for any expression naming them.
    fn local_in_register(&mut self, buf: &crate::ir::Buffer, bind_strides: bool) -> Held {
        let ty = value_ty(buf.dtype);
        let var = self.fresh_var(ty);
        let zero = if ty == types::F64 {
            self.b.ins().f64const(0.0)
        } else if ty == types::F32 {
            self.b.ins().f32const(0.0)
        } else {
            self.iconst(ty, 0)
        };
        self.b.def_var(var, zero);
        let mut olds = Vec::new();
        if bind_strides {
            let one = self.iconst(types::I64, 1);
            for v in &buf.strides {
                olds.push((v.id, self.bind_var(v.id, one)));
            }
        }
        let old = self.reg_locals.insert(buf.id, var);
        Held::Register {
            id: buf.id,
            var,
            ty,
            old,
            olds,
        }
    }

    /// Ends a local's scope: frees a heap block, restores the bindings it shadowed.
    fn release(&mut self, h: Held) -> Result<()> {
        match h {
            Held::Register {
                id,
                var,
                ty,
                old,
                olds,
            } => {
                match old {
                    Some(o) => self.reg_locals.insert(id, o),
                    None => self.reg_locals.remove(&id),
                };
                self.free_vars.entry(ty).or_default().push(var);
                for (v, old) in olds.into_iter().rev() {
                    self.restore_var(v, old);
                }
            }
            Held::Memory {
                id,
                on_heap,
                old_buf,
                olds,
            } => {
                if on_heap {
                    if let Some(Live::Block(ptr, bytes)) = self.live_allocs.pop() {
                        self.call("rivet_free", &[PTR, types::I64], &[], &[ptr, bytes])?;
                    } else {
                        return Err(Error::Internal(format!(
                            "local buffer id {}: its block is not the last one live",
                            id.0
                        )));
                    }
                }
                self.restore_buf(id, old_buf);
                for (v, old) in olds.into_iter().rev() {
                    self.restore_var(v, old);
                }
            }
        }
        Ok(())
    }

    /// The entry function's root `Allocate` (at top level, under sequences: `frame_stmt`):
    /// its locals are allocated here, but none is bound across `body`. Like the parameters
    /// (`frame_stmt`), each top-level statement binds what it uses when it starts
    /// (`load_frame`): a stack local by its slot's address, a heap local by loading its
    /// address from the *local table* (one `rivet_alloc` block: the heap locals' addresses,
    /// then the strides of the locals whose shape is symbolic). With one binding per local
    /// made here, a program of N materialised stages had O(N) values live across the whole
    /// function — O(N^2) live ranges and register allocation time — and each failure exit
    /// freed every block allocated before it — O(N^2) code; here a failure exit frees the
    /// table's blocks with one `rivet_free_n` call.
    pub(super) fn allocate_root(&mut self, bufs: &[BufId], body: &Stmt) -> Result<()> {
        let func = self.func;
        let decls = bufs
            .iter()
            .map(|&id| self.local_decl(id))
            .collect::<Result<Vec<_>>>()?;
        let in_reg = if self.cx.checked {
            HashSet::new()
        } else {
            registerable(func, &decls, body)
        };
        // The sizes need the dims and strides their shapes use, loaded from the frame.
        let shapes: Vec<crate::ir::Expr> =
            decls.iter().flat_map(|b| b.shape.iter().cloned()).collect();
        let frame = self.load_frame(&Stmt::Seq(vec![]), &shapes)?;
        let mut plans = Vec::with_capacity(decls.len());
        let (mut heap, mut table_strides) = (0usize, 0usize);
        for b in &decls {
            if in_reg.contains(&b.id) {
                plans.push(None);
                continue;
            }
            let p = self.local_memory(b)?;
            heap += p.on_stack.is_none() as usize;
            if b.shape.iter().any(|e| e.as_int().is_none()) {
                table_strides += b.strides.len();
            }
            plans.push(Some(p));
        }
        let table = if heap + table_strides > 0 {
            let bytes = self.iconst(types::I64, (8 * (heap + table_strides)) as i64);
            let plan = LocalPlan {
                overwritten: true,
                strides: vec![],
                bytes,
                on_stack: None,
            };
            let t = self.local_heap(&plan)?;
            self.live_allocs.push(Live::Block(t, bytes));
            self.live_allocs.push(Live::Table { table: t, count: 0 });
            Some(t)
        } else {
            None
        };
        let mut held = Vec::new();
        let (mut next_heap, mut next_stride) = (0usize, heap);
        for (b, plan) in decls.iter().zip(plans) {
            let Some(plan) = plan else {
                // Its strides (1) are constants bound per statement, like the others'.
                held.push(self.local_in_register(b, false));
                for v in &b.strides {
                    self.root_strides.insert(v.id, StrideHome::Const(1));
                }
                continue;
            };
            let home = match self.local_slot(&plan)? {
                Some(slot) => Home::Stack(slot),
                None => {
                    let ptr = self.local_heap(&plan)?;
                    let t = table.ok_or_else(|| Error::Internal("no local table".into()))?;
                    self.b
                        .ins()
                        .store(super::expr::flags(), ptr, t, (8 * next_heap) as i32);
                    if let Some(Live::Table { count, .. }) = self.live_allocs.last_mut() {
                        *count += 1;
                    }
                    next_heap += 1;
                    Home::Heap {
                        table: t,
                        k: next_heap - 1,
                    }
                }
            };
            let symbolic = b.shape.iter().any(|e| e.as_int().is_none());
            for (k, (v, s)) in b.strides.iter().zip(&plan.strides).enumerate() {
                let h = if symbolic {
                    let t = table.ok_or_else(|| Error::Internal("no local table".into()))?;
                    self.b
                        .ins()
                        .store(super::expr::flags(), *s, t, (8 * next_stride) as i32);
                    next_stride += 1;
                    StrideHome::Table {
                        table: t,
                        k: next_stride - 1,
                    }
                } else {
                    let c = b.shape[k + 1..]
                        .iter()
                        .map(|e| e.as_int().unwrap_or(0).max(0))
                        .fold(1i64, |a, n| a.wrapping_mul(n));
                    StrideHome::Const(c)
                };
                self.root_strides.insert(v.id, h);
            }
            self.root_homes.insert(b.id, home);
        }
        self.unload_frame(frame);
        self.frame_stmt(body)?;
        for b in &decls {
            self.root_homes.remove(&b.id);
            for v in &b.strides {
                self.root_strides.remove(&v.id);
            }
        }
        for h in held.into_iter().rev() {
            self.release(h)?;
        }
        if let Some(t) = table {
            let Some(Live::Table { count, .. }) = self.live_allocs.pop() else {
                return Err(Error::Internal(
                    "the local table is not the last one live".into(),
                ));
            };
            let n = self.iconst(types::I64, count as i64);
            self.call("rivet_free_n", &[PTR, types::I64], &[], &[t, n])?;
            let Some(Live::Block(p, bytes)) = self.live_allocs.pop() else {
                return Err(Error::Internal(
                    "the local table is not the last one live".into(),
                ));
            };
            self.call("rivet_free", &[PTR, types::I64], &[], &[p, bytes])?;
        }
        Ok(())
    }

    /// Zeroes `n` bytes at `ptr` (a 64-byte aligned stack slot): unrolled stores for small
    /// buffers (a one-element accumulator is one store), `rivet_zero` for larger ones.
    fn zero(&mut self, ptr: Value, n: u32) -> Result<()> {
        if n <= 128 {
            // Widest stores first: the slot is 64-byte aligned.
            let mut off = 0u32;
            for (ty, w) in [
                (types::I64, 8u32),
                (types::I32, 4),
                (types::I16, 2),
                (types::I8, 1),
            ] {
                let z = self.iconst(ty, 0);
                while n - off >= w {
                    self.b.ins().store(super::expr::flags(), z, ptr, off as i32);
                    off += w;
                }
            }
            return Ok(());
        }
        let bytes = self.iconst(types::I64, i64::from(n));
        self.call("rivet_zero", &[PTR, types::I64], &[], &[ptr, bytes])?;
        Ok(())
    }
}

/// The largest local buffer placed in a stack frame (bytes): a 16x16 float64 tile.
pub(super) const STACK_LOCAL_MAX: u32 = 2048;

/// The most bytes of local buffers one generated function keeps in its stack frame: well
/// inside the smallest stack generated code runs on (rayon's 2 MiB workers, Python threads'
/// default; the caller's own frames come on top).
pub(super) const STACK_FRAME_MAX: u32 = 16 * 1024;

/// Stack slots of locals are 64-byte aligned, like `rivet_alloc`'s blocks.
const LOCAL_ALIGN_SHIFT: u8 = 6;

/// The byte size of a local of `shape` when it is constant and at most `STACK_LOCAL_MAX`
/// (exact: a shape near 2^62 is simply not a stack local; negative extents count as 0).
fn stack_bytes(shape: &[crate::ir::Expr], elem: usize) -> Option<u32> {
    let mut n: u128 = elem as u128;
    for e in shape {
        n = n.checked_mul(e.as_int()?.max(0) as u128)?;
    }
    u32::try_from(n).ok().filter(|&b| b <= STACK_LOCAL_MAX)
}

/// True when local `buf` can live in a variable: one element (every extent the constant 1),
/// every access in `body` at the constant offset 0, and no outlined parallel body launched
/// in `body` captures it (those receive buffers by address).
fn in_register(func: &crate::ir::PrimFunc, buf: &crate::ir::Buffer, body: &Stmt) -> bool {
    use crate::ir::ExprKind;
    if !buf.shape.iter().all(|e| e.as_int() == Some(1)) {
        return false;
    }
    let mut ok = true;
    let zero = |idx: &[crate::ir::Expr]| idx.iter().all(|i| i.as_int() == Some(0));
    body.visit(&mut |s| match s {
        Stmt::Launch { kernel } => {
            ok &= func
                .kernels
                .get(*kernel)
                .is_some_and(|k| !k.bufs.contains(&buf.id));
        }
        Stmt::Store {
            buf: b, indices, ..
        } if *b == buf.id => ok &= zero(indices),
        Stmt::AllReduce { dst, .. } if *dst == buf.id => ok = false,
        _ => {}
    });
    if ok {
        body.visit_exprs(&mut |e| {
            e.visit_unique(&mut |n| {
                if let ExprKind::Load { buf: b, indices } = n.kind() {
                    if *b == buf.id {
                        ok &= zero(indices);
                    }
                }
            })
        });
    }
    ok
}

/// The ones among root locals `bufs` that `in_register` allows, found in one walk of `body`
/// (a root `Allocate` holds one local per materialised stage: a walk per local would be
/// quadratic).
fn registerable(
    func: &crate::ir::PrimFunc,
    bufs: &[&crate::ir::Buffer],
    body: &Stmt,
) -> HashSet<BufId> {
    use crate::ir::ExprKind;
    let mut ok: HashSet<BufId> = bufs
        .iter()
        .filter(|b| b.shape.iter().all(|e| e.as_int() == Some(1)))
        .map(|b| b.id)
        .collect();
    if ok.is_empty() {
        return ok;
    }
    let zero = |idx: &[crate::ir::Expr]| idx.iter().all(|i| i.as_int() == Some(0));
    body.visit(&mut |s| match s {
        Stmt::Launch { kernel } => match func.kernels.get(*kernel) {
            Some(k) => k.bufs.iter().for_each(|b| {
                ok.remove(b);
            }),
            None => ok.clear(),
        },
        Stmt::Store {
            buf: b, indices, ..
        } if !zero(indices) => {
            ok.remove(b);
        }
        Stmt::AllReduce { dst, .. } => {
            ok.remove(dst);
        }
        _ => {}
    });
    body.visit_exprs(&mut |e| {
        e.visit_unique(&mut |n| {
            if let ExprKind::Load { buf: b, indices } = n.kind() {
                if !zero(indices) {
                    ok.remove(b);
                }
            }
        })
    });
    ok
}

/// A local's size and strides (values of the code being generated) and where its memory
/// comes from (`local_memory`).
pub(super) struct LocalPlan {
    overwritten: bool,
    strides: Vec<Value>,
    /// Bytes, or -1 for a size over `MAX_ALLOC_BYTES` (which `rivet_alloc` refuses).
    bytes: Value,
    /// Bytes of its stack slot, when it has one.
    on_stack: Option<u32>,
}

/// A local allocated by `allocate_nested`, with what its scope shadowed.
enum Held {
    Register {
        id: BufId,
        var: cranelift_frontend::Variable,
        ty: cranelift_codegen::ir::Type,
        old: Option<cranelift_frontend::Variable>,
        olds: Vec<(
            u32,
            Option<(cranelift_frontend::Variable, cranelift_codegen::ir::Type)>,
        )>,
    },
    Memory {
        id: BufId,
        on_heap: bool,
        old_buf: Option<cranelift_frontend::Variable>,
        olds: Vec<(
            u32,
            Option<(cranelift_frontend::Variable, cranelift_codegen::ir::Type)>,
        )>,
    },
}

/// Where a root local's memory is (`allocate_root`): a stack slot, or its address in entry
/// `k` of the local table at `table`.
#[derive(Clone, Copy)]
pub(super) enum Home {
    Stack(StackSlot),
    Heap { table: Value, k: usize },
}

/// Where a root local's stride is: a constant (constant shapes), or entry `k` of the local
/// table at `table`.
#[derive(Clone, Copy)]
pub(super) enum StrideHome {
    Const(i64),
    Table { table: Value, k: usize },
}

/// A block a failure exit must give back (`FnGen::fail_if`).
#[derive(Clone, Copy)]
pub(super) enum Live {
    /// A block of `rivet_alloc`: address and bytes.
    Block(Value, Value),
    /// The first `count` entries of the local table at `table` (`allocate_root`).
    Table { table: Value, count: usize },
}

/// How `plain_counted_loop` shapes a loop (its doc).
#[derive(Clone, Copy)]
enum LoopShape {
    Top,
    /// Only under a preheader that has tested `lo < hi` (`counted_loop`).
    Rotated,
}
