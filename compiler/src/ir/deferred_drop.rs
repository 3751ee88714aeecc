//! Destruction of deep shared structures without deep recursion.
//!
//! A te program is a chain of `Arc`s: a tensor's body is an expression, whose `Read`s hold the
//! tensors it reads, whose bodies are expressions... Dropping the last handle of a 20,000-stage
//! chain ran 20,000 nested destructors, several frames each, and overflowed a 2 MiB thread
//! stack. The destructors of the recursive nodes (`ExprNode`, te's `TensorNode`) hand what
//! they own to `drop_deferred` instead of dropping it in place: the outermost call drops it,
//! and any node freed meanwhile queues its own contents on this thread's list instead of
//! recursing; the outermost call then drains the list. Stack depth stays a few frames however
//! long the chain; the work and the order of frees are unchanged up to reordering.
//!
//! Invariants: only the outermost `drop_deferred` of a thread drains, so the list is empty
//! whenever no drop is running on the thread; if the thread's locals are already gone (a
//! value dropped while the thread exits), the value is dropped in place, recursively, as
//! before.

use super::expr::ExprKind;
use std::any::Any;
use std::cell::{Cell, RefCell};

/// What a recursive node gives up when it is dropped.
pub enum Deferred {
    /// An expression node's operands.
    Expr(ExprKind),
    /// Anything else (a te tensor's operation: its body, an extern stage's inputs).
    Other(Box<dyn Any>),
}

thread_local! {
    /// A `drop_deferred` is running on this thread (further ones queue).
    static DRAINING: Cell<bool> = const { Cell::new(false) };
    static PENDING: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
}

/// Drops `item`, and everything its drop frees, without recursing per level (module doc).
pub fn drop_deferred(item: Deferred) {
    match DRAINING.try_with(|d| d.replace(true)) {
        Ok(false) => {
            drop(item);
            loop {
                // The borrow ends before the drop, which may queue more.
                let next = PENDING.try_with(|p| p.borrow_mut().pop()).ok().flatten();
                match next {
                    Some(x) => drop(x),
                    None => break,
                }
            }
            let _ = DRAINING.try_with(|d| d.set(false));
        }
        Ok(true) => {
            // When the list is gone (the thread exits), the closure, and `item` with it, is
            // dropped in place.
            let _ = PENDING.try_with(move |p| p.borrow_mut().push(item));
        }
        // This thread's locals are being destroyed: drop in place.
        Err(_) => drop(item),
    }
}
