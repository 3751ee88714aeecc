//! What keeps a tensor view's Python producer alive: `PyKeepalive`, a reference to it (a
//! torch tensor read through the DLPack exchange API, a `__cuda_array_interface__` producer);
//! `PyBorrow` and `CallArgs`, the argument views of one `Function` call, which borrow their
//! producers and take a reference only when they outlive the call; and `release`, how the
//! Python objects rivet's Rust values hold are let go.
//!
//! Invariant (release): the reference is released with the GIL really held. pyo3 decides
//! whether it holds the GIL from its own per-thread count, and that count can be stale: torch
//! releases the GIL while it destroys a tensor (`THPVariable_clear`), and if the storage it
//! frees is rivet's export of a view over another torch tensor, the view drops inside torch's
//! destructor, under pyo3's count from the outer `tp_dealloc`, without the GIL. A plain
//! `Py` decref there aborts the interpreter (rivet -> torch -> rivet -> torch -> rivet, then
//! `del`). So the release asks CPython (`PyGILState_Ensure`), which takes the GIL back when
//! this thread released it and is a no-op when it holds it.
//!
//! Invariant (borrow): a `PyBorrow` view's producer is alive while its call runs (the call's
//! argument tuple holds it), and when the call's `CallArgs` drop, every one of its views that
//! is still held anywhere else (returned, stored by a callback, derived into another view,
//! exported, handed to a thread) first takes a strong reference, released when the view's
//! last handle drops. A view held by no one else drops with the call, and the producer is
//! never referenced at all: this saves the reference and its GIL-checked release per tensor
//! argument. "Held elsewhere" is exact: it is the view's `Arc` having another handle, and no
//! handle can appear once ours is the only one.
//!
//! Invariant (spares): a view that only its call held, over a `PyBorrow`, leaves its
//! allocation to the thread's next call (`Spares`, `Tensor::into_spare`): its fields and
//! owner drop as they would, only the memory is kept, at most `MAX_SPARES` per thread.

use pyo3::ffi;
use pyo3::prelude::*;
use rivet_runtime::tensor::SpareView;
use rivet_runtime::{Tensor, Value};
use smallvec::SmallVec;
use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct PyKeepalive(ManuallyDrop<Py<PyAny>>);

impl PyKeepalive {
    pub fn new(obj: Py<PyAny>) -> PyKeepalive {
        PyKeepalive(ManuallyDrop::new(obj))
    }
}

impl Drop for PyKeepalive {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is never used again.
        release(unsafe { ManuallyDrop::take(&mut self.0) });
    }
}

/// Releases `obj` with the GIL really held (the module header says why `Py`'s own drop is
/// not enough); also used for the Python callables packed functions hold (`gc::PyCallable`).
pub fn release(obj: Py<PyAny>) {
    // SAFETY: a strong reference we own, given up here.
    unsafe { release_ptr(obj.into_ptr()) }
}

/// `release` of a raw strong reference.
///
/// # Safety
/// `p` must be a strong reference the caller owns; it is consumed.
unsafe fn release_ptr(p: *mut ffi::PyObject) {
    // SAFETY: per the contract. During interpreter finalization nothing may run Python code:
    // the reference is leaked then (the process is ending).
    unsafe {
        if ffi::Py_IsInitialized() == 0 {
            return;
        }
        let state = ffi::PyGILState_Ensure();
        ffi::Py_DECREF(p);
        ffi::PyGILState_Release(state);
    }
}

/// The owner of an argument view made for one call: the producer's address, referenced only
/// once the view outlives the call (`held`, set by `CallArgs`' drop; the module header).
pub struct PyBorrow {
    /// The producer, as an address: alive during the call, and after it only if `held`.
    obj: usize,
    /// A strong reference to `obj` was taken, to be released with the view.
    held: AtomicBool,
}

impl PyBorrow {
    /// The owner of a view of `obj`'s memory for the duration of one call.
    ///
    /// # Safety
    /// The view must go into that call's `CallArgs` (and nowhere else before), which `obj`
    /// outlives: `CallArgs`' drop takes a reference for views that are still held elsewhere.
    pub unsafe fn new(obj: &Bound<'_, PyAny>) -> PyBorrow {
        PyBorrow {
            obj: obj.as_ptr() as usize,
            held: AtomicBool::new(false),
        }
    }
}

impl Drop for PyBorrow {
    fn drop(&mut self) {
        if *self.held.get_mut() {
            // SAFETY: `held`: the reference `CallArgs` took, released once, here.
            unsafe { release_ptr(self.obj as *mut ffi::PyObject) }
        }
    }
}

/// Spare view allocations kept per thread: a call's tensor arguments, a few more for calls
/// nested in callbacks.
const MAX_SPARES: usize = 8;

thread_local! {
    /// The allocations of this thread's last call's argument views (`Spares`).
    static SPARES: Cell<Vec<SpareView<PyBorrow>>> = const { Cell::new(Vec::new()) };
}

/// A call's spare view allocations: taken from the thread's on the first borrowed view
/// (`take_one`), refilled with the call's own views as `CallArgs` drops and given back then.
/// A nested call (a callback calling rivet) finds the thread's empty and allocates; the spares
/// the last call to end gives back replace the thread's, the others are freed.
#[derive(Default)]
pub struct Spares(Option<Vec<SpareView<PyBorrow>>>);

impl Spares {
    /// An allocation for the call's next borrowed view, if the thread has one to spare.
    #[inline]
    pub fn take_one(&mut self) -> Option<SpareView<PyBorrow>> {
        self.0
            // After the thread's destructors ran, nothing is spared.
            .get_or_insert_with(|| SPARES.try_with(Cell::take).unwrap_or_default())
            .pop()
    }
}

/// The converted arguments of one call. Its drop ends the borrow of every `PyBorrow` view in
/// it; it must drop while the call's Python arguments are still alive, with the GIL held.
pub struct CallArgs<'py> {
    pub values: SmallVec<[Value; 8]>,
    /// Where the call's borrowed views are built, and their allocations go when it ends.
    pub spares: Spares,
    /// The GIL is held for as long as this lives.
    _py: Python<'py>,
}

impl<'py> CallArgs<'py> {
    #[inline]
    pub fn with_capacity(py: Python<'py>, n: usize) -> CallArgs<'py> {
        let mut args = CallArgs {
            values: SmallVec::new(),
            spares: Spares(None),
            _py: py,
        };
        // Reserved in place: `SmallVec::with_capacity` built the inline array (`8` values)
        // aside and copied it here with a `memcpy` call on every call.
        if n > args.values.inline_size() {
            args.values.reserve_exact(n);
        }
        args
    }
}

impl Drop for CallArgs<'_> {
    fn drop(&mut self) {
        // In place: the values then drop with `values` (no `Drain` moving each out).
        for v in self.values.iter_mut() {
            let Value::Tensor(t) = v else { continue };
            if !t.is_unique() {
                end_borrow(t);
                continue;
            }
            // The last handle: the view and its owner drop with it, nothing referenced; a
            // borrowed view's allocation is kept for the next call (the module header).
            let Some(spares) = &mut self.spares.0 else {
                continue; // no view of this call was borrowed
            };
            if spares.len() < MAX_SPARES && t.owner().is::<PyBorrow>() {
                if let Value::Tensor(t) = std::mem::take(v) {
                    // Unique and over a `PyBorrow` (checked above): a spare, never an error.
                    if let Ok(s) = t.into_spare::<PyBorrow>() {
                        spares.push(s);
                    }
                }
            }
        }
        if let Some(spares) = self.spares.0.take() {
            // Replaces (frees) what a nested call gave back meanwhile.
            let _ = SPARES.try_with(|s| s.set(spares));
        }
    }
}

/// Readies one argument view of a call that is ending for its drop, taking a reference to its
/// producer first when the view is borrowed and held elsewhere too (the module header).
fn end_borrow(t: &mut Tensor) {
    if let Some(b) = t.owner().downcast_ref::<PyBorrow>() {
        // Once per view: a view put twice into one call's arguments is one `Arc`.
        if !b.held.swap(true, Ordering::AcqRel) {
            // SAFETY: the producer is alive (the call's arguments hold it) and the GIL is held
            // (`CallArgs` carries the token); the reference is `PyBorrow`'s to release.
            unsafe { ffi::Py_INCREF(b.obj as *mut ffi::PyObject) }
        }
    }
}
