//! Host callbacks in generated code (`Intrin::Callback`, `ir::callback`): a call of the
//! `rivet_callback` helper with the kernel's callback table, the callback's index and a stack
//! array describing its regions; the helper runs `codegen::cpu_lib::callback::run`.
//!
//! Invariants:
//! - the table is owned by the `CraneliftKernel` (boxed: its address, embedded in the code as
//!   a constant, stays fixed), so it outlives every run of the code;
//! - callbacks stand only at the top level of the entry function (`ir::verify`), so the
//!   helper runs on the calling thread, once per reached call, never on the pool;
//! - nothing unwinds through generated code: the helper catches a panic of the callback;
//!   an error goes to this thread's `CALLBACK_ERROR` slot (not `Copy`, so not in `Fault`;
//!   it may hold a Python exception), with `Fault::Callback` recorded, and the code returns 1;
//!   `CraneliftKernel::run` takes the error back out, unchanged.

use super::helpers::{set_fault, Fault};
use super::{FnGen, PTR};
use crate::codegen::cpu_lib::callback::RegionArg;
use crate::error::{Error, Result};
use crate::ir::callback::Callback;
use crate::ir::intrin::Region;
use crate::ir::{Expr, PrimFunc, Stmt};
use cranelift_codegen::ir::{types, InstBuilder, StackSlotData, StackSlotKind};
use rivet_runtime::DType;
use std::cell::RefCell;

/// A kernel's callbacks with the layout of their regions (rank and dtype of each).
pub(super) struct CallbackTable {
    entries: Vec<(Callback, Vec<(usize, DType)>)>,
}

impl CallbackTable {
    /// The table of `func`: every callback, with the regions of the call that uses it.
    pub(super) fn new(func: &PrimFunc) -> CallbackTable {
        let mut layouts: Vec<Vec<(usize, DType)>> = vec![Vec::new(); func.callbacks.len()];
        func.visit_all(&mut |s| {
            if let Stmt::Call {
                intrin: crate::ir::Intrin::Callback(k),
                regions,
                ..
            } = s
            {
                if let Some(l) = layouts.get_mut(*k as usize) {
                    *l = regions
                        .iter()
                        .map(|r| (r.axes.len(), func.buffer(r.buf).dtype))
                        .collect();
                }
            }
        });
        CallbackTable {
            entries: func.callbacks.iter().cloned().zip(layouts).collect(),
        }
    }

    /// The callbacks, in table order.
    pub(super) fn callbacks(&self) -> impl Iterator<Item = &Callback> {
        self.entries.iter().map(|(c, _)| c)
    }
}

thread_local! {
    static CALLBACK_ERROR: RefCell<Option<rivet_runtime::Error>> = const { RefCell::new(None) };
}

/// Takes this thread's callback error (`Fault::Callback`'s payload).
pub(super) fn take_callback_error() -> Option<rivet_runtime::Error> {
    CALLBACK_ERROR.with(|c| c.borrow_mut().take())
}

/// Runs callback `k` of `table` on the regions `desc` describes: per region, its address,
/// then per dim its extent and its stride in elements. Returns 0, or 1 with the error in
/// `CALLBACK_ERROR` and `Fault::Callback` recorded.
///
/// # Safety
/// `table` must be the kernel's live table and `desc` the array generated code built for
/// call `k` (regions valid for their layouts: the bounds proof covered them).
unsafe extern "C" fn rivet_callback(table: *const CallbackTable, k: i64, desc: *const i64) -> i32 {
    let run = || -> rivet_runtime::Result<()> {
        // SAFETY: the caller's contract: the kernel owns the table and is running.
        let table = unsafe { &*table };
        let (cb, layout) = usize::try_from(k)
            .ok()
            .and_then(|k| table.entries.get(k))
            .ok_or_else(|| {
                rivet_runtime::Error::Internal(format!("callback {k} not in the table"))
            })?;
        let mut at = 0usize;
        let mut next = || {
            // SAFETY: generated code wrote one i64 per value this loop reads (the layout
            // of call `k`, which the table was built from).
            let v = unsafe { desc.add(at).read() };
            at += 1;
            v
        };
        let mut regions = Vec::with_capacity(layout.len());
        for &(nd, dtype) in layout {
            let ptr = next() as usize as *mut u8;
            let mut shape = Vec::with_capacity(nd);
            let mut strides = Vec::with_capacity(nd);
            for _ in 0..nd {
                shape.push(next().max(0));
                strides.push(next());
            }
            regions.push(RegionArg {
                ptr,
                shape,
                strides,
                dtype,
            });
        }
        // SAFETY: the regions are the call's, proven inside their buffers.
        unsafe { crate::codegen::cpu_lib::callback::run(cb, &regions) }
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Err(rivet_runtime::Error::Internal(format!(
            "a host callback panicked: {what}"
        )))
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            CALLBACK_ERROR.with(|c| *c.borrow_mut() = Some(e));
            set_fault(Fault::Callback);
            1
        }
    }
}

/// The helper's symbol.
pub(super) fn symbols() -> Vec<(&'static str, *const u8)> {
    vec![("rivet_callback", rivet_callback as *const u8)]
}

impl FnGen<'_, '_> {
    /// `Call` of `Intrin::Callback(k)`: the region descriptor on the stack, the helper call,
    /// and a return with status 1 (locals freed) when it fails.
    pub(super) fn call_callback(&mut self, k: u32, regions: &[Region]) -> Result<()> {
        let mut vals = Vec::new();
        for r in regions {
            // The region is the whole buffer from element 0 (`check_call`).
            vals.push(self.buf_ptr(r.buf)?);
            let strides = self.func.buffer(r.buf).strides.clone();
            for a in &r.axes {
                let s = strides.get(a.dim as usize).ok_or_else(|| {
                    Error::Internal(format!("region walks dim {} past the rank", a.dim))
                })?;
                let e = self.expr(&a.extent)?;
                vals.push(self.index_i64(e, a.extent.dtype()));
                let sv = self.expr(&Expr::var(s))?;
                vals.push(self.index_i64(sv, DType::I64));
            }
        }
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (8 * vals.len().max(1)) as u32,
            3,
        ));
        for (i, v) in vals.iter().enumerate() {
            self.b.ins().stack_store(PTR, *v, slot, (8 * i) as i32);
        }
        let desc = self.b.ins().stack_addr(PTR, slot, 0);
        let table = self.iconst(PTR, self.cx.callback_table as i64);
        let kk = self.iconst(types::I64, k as i64);
        let status = self.call1(
            "rivet_callback",
            &[PTR, types::I64, PTR],
            types::I32,
            &[table, kk, desc],
        )?;
        self.fail_if(status, None)
    }
}
