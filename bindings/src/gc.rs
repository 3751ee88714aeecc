//! Python's garbage collector and the Python objects rivet objects hold inside Rust data.
//!
//! A Python callable given to rivet (a `te.extern` function, a `Stage.debug_tap`, a callable
//! passed where a packed function goes) is wrapped in a `PyCallable`, which a runtime
//! `Function` holds (its `parts`); te tensors, expressions, schedules, compiled functions and
//! modules hold such functions through `Arc`s. A callable that refers back to the rivet object
//! holding it (a closure over the te tensor, a bound method of an object that keeps the
//! module) makes a reference cycle. The collector can break it only if each rivet object in
//! it reports, in `__traverse__`, the Python objects it holds — exactly the references it
//! owns: reporting one that another live holder shares makes the collector undercount that
//! object's outside references, free it, and break the live holder.
//!
//! So a rivet object reports a callable only when it owns it alone: `owned_callables` walks
//! the Rust data the object holds (te tensors, expressions, functions, compiled functions:
//! each an `Arc` allocation), counts how many handles of each allocation the walk itself
//! found (each field holding one counts once; a function's closures declare theirs,
//! `rivet_runtime::Parts::hidden`), and compares with the allocation's handle count. An
//! allocation with more handles than found is held from outside, and so is everything
//! reachable from it; the callables that remain are owned by the object alone. (The same
//! subtraction the collector itself does over Python objects.) The rules this relies on:
//!
//! - every handle counted is a real, distinct `Arc` handle in the walked data, so counts are
//!   never over-estimated; handles the walk cannot see (a closure that does not declare them,
//!   another thread's clone) only make an allocation look shared: a callable is then not
//!   reported and its cycle stays uncollected — a leak, never a premature free;
//! - a thread that clones a handle of data a rivet object owns alone must reach it through
//!   that object, which is then alive and reachable: reports about it cannot free anything;
//! - `__clear__` (called by the collector only on objects found unreachable) empties the
//!   owned callables' slots: no one else can reach them, so none will be called again.
//!
//! Programs with no callback cost nothing to walk: a te tensor knows whether a callback is
//! reachable from it (`TensorNode::host_callbacks`), and the walk skips the ones without;
//! it does not descend through what is held from outside either (`Graph::expand`). te
//! expressions (`te.Expr`) are not tracked: most are short-lived, and tracking every one
//! would make the collector run and walk far more often while a program is written; a cycle
//! through an expression object (a callback holding `E[i]` of its own extern stage `E`)
//! stays uncollected.

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};
use rivet_compiler::artifact::recipe::Recipe;
use rivet_compiler::artifact::Compiled;
use rivet_compiler::ir::callback::Callback;
use rivet_compiler::ir::expr::{Expr, ExprKind};
use rivet_compiler::te::tensor::{Op, TensorNode};
use rivet_compiler::te::Tensor;
use rivet_runtime::Function;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// A Python callable held by a packed function (`convert::wrap_callable`).
pub struct PyCallable {
    /// `None` once the collector cleared its holder (`release`).
    callable: Mutex<Option<Py<PyAny>>>,
}

impl PyCallable {
    pub fn new(f: Py<PyAny>) -> Arc<PyCallable> {
        Arc::new(PyCallable {
            callable: Mutex::new(Some(f)),
        })
    }

    /// A new reference to the callable (`None` once released).
    pub fn get(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.slot().as_ref().map(|f| f.clone_ref(py))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Py<PyAny>>> {
        self.callable.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reports the callable to the collector. A slot locked by another thread (it holds the
    /// GIL then, which the collector's thread holds now: not possible) is skipped, which only
    /// makes the callable look referenced from outside.
    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(slot) = self.callable.try_lock() {
            if let Some(f) = slot.as_ref() {
                visit.call(f)?;
            }
        }
        Ok(())
    }

    /// Drops the callable (after the slot's lock is released: dropping may run Python code).
    fn release(&self) {
        let f = self.slot().take();
        drop(f);
    }
}

impl Drop for PyCallable {
    /// The last function holding the callable may drop inside another library's destructor
    /// that released the GIL (`keepalive`'s header): released through `keepalive::release`.
    fn drop(&mut self) {
        let slot = self.callable.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = slot.take() {
            crate::keepalive::release(f);
        }
    }
}

/// What a rivet object holds, as the walk starts from it (one handle each).
pub enum Root<'a> {
    Tensor(&'a Tensor),
    Function(&'a Function),
    Compiled(&'a Arc<Compiled>),
    /// A callback's function (a schedule's debug tap).
    Callback(&'a Callback),
}

/// An allocation found by the walk.
enum Node<'a> {
    Tensor(&'a TensorNode),
    Expr(&'a Expr),
    Function(&'a Function),
    Compiled(&'a Compiled),
    /// The te program a compiled function was built from (`rivet_compiler::backward`).
    Recipe(&'a Recipe),
    Callable(&'a PyCallable),
}

struct Info<'a> {
    node: Node<'a>,
    /// Handles of the allocation that exist.
    handles: usize,
    /// Handles the walk found (from the roots and from walked allocations).
    found: usize,
    children: Vec<usize>,
}

/// The walk's graph of allocations, keyed by address.
struct Graph<'a> {
    info: HashMap<usize, Info<'a>>,
    todo: Vec<usize>,
}

impl<'a> Graph<'a> {
    /// `count` handles of allocation `key` (with `handles` in all) found in `parent` (or in
    /// the root when `None`).
    fn edge(
        &mut self,
        parent: Option<usize>,
        key: usize,
        handles: usize,
        count: usize,
        node: impl FnOnce() -> Node<'a>,
    ) {
        let e = self.info.entry(key).or_insert_with(|| {
            self.todo.push(key);
            Info {
                node: node(),
                handles,
                found: 0,
                children: Vec::new(),
            }
        });
        e.found += count;
        if let Some(p) = parent {
            if let Some(pi) = self.info.get_mut(&p) {
                pi.children.push(key);
            }
        }
    }

    fn tensor(&mut self, parent: Option<usize>, t: &'a Tensor) {
        if t.0.host_callbacks {
            let key = Arc::as_ptr(&t.0) as *const () as usize;
            self.edge(parent, key, Arc::strong_count(&t.0), 1, || {
                Node::Tensor(&t.0)
            });
        }
    }

    fn expr(&mut self, parent: Option<usize>, e: &'a Expr) {
        let key = Arc::as_ptr(&e.0) as usize;
        self.edge(parent, key, Arc::strong_count(&e.0), 1, || Node::Expr(e));
    }

    fn function(&mut self, parent: Option<usize>, f: &'a Function) {
        // Only functions with visible parts can lead to a Python object.
        if f.parts().is_some() {
            self.edge(parent, f.key(), f.handles(), 1, || Node::Function(f));
        }
    }

    fn callback(&mut self, parent: Option<usize>, c: &'a Callback) {
        if let Some(f) = &c.func {
            self.function(parent, f);
        }
    }

    /// Adds the allocations `key`'s node holds. A node with more handles than found so far
    /// is not expanded: it is (or looks, before all its holders in the walk are found) held
    /// from outside, so nothing is owned through it; skipping it only lowers counts below
    /// it, which keeps the result conservative, and keeps the walk from a newly made stage
    /// from descending through a long program whose stages other holders still hold.
    fn expand(&mut self, key: usize) {
        let Some(info) = self.info.get(&key) else {
            return;
        };
        if info.handles > info.found {
            return;
        }
        let p = Some(key);
        match info.node {
            Node::Tensor(t) => match &t.op {
                Op::Compute { body, .. } => self.expr(p, body),
                Op::Extern { inputs, callback } => {
                    for i in inputs {
                        self.tensor(p, i);
                    }
                    self.callback(p, callback);
                }
                Op::Placeholder => {}
            },
            Node::Expr(e) => {
                if let ExprKind::Read { tensor, .. } = e.kind() {
                    let node = tensor.node();
                    if let Some(t) = node.downcast_ref::<TensorNode>() {
                        if t.host_callbacks {
                            let k = Arc::as_ptr(node) as *const () as usize;
                            self.edge(p, k, Arc::strong_count(node), 1, || Node::Tensor(t));
                        }
                    }
                }
                e.for_each_child(&mut |c| self.expr(p, c));
            }
            Node::Function(f) => {
                if let Some(parts) = f.parts() {
                    let obj = &parts.object;
                    let k = Arc::as_ptr(obj) as *const () as usize;
                    let (handles, count) = (Arc::strong_count(obj), 1 + parts.hidden);
                    if let Some(c) = obj.downcast_ref::<PyCallable>() {
                        self.edge(p, k, handles, count, || Node::Callable(c));
                    } else if let Some(c) = obj.downcast_ref::<Compiled>() {
                        self.edge(p, k, handles, count, || Node::Compiled(c));
                    }
                }
            }
            Node::Compiled(c) => {
                for cb in c
                    .nest
                    .callbacks
                    .iter()
                    .chain(&c.func.callbacks)
                    .chain(c.kernel.host_callbacks())
                {
                    self.callback(p, cb);
                }
                if let Some(src) = &c.recipe {
                    let k = Arc::as_ptr(src) as *const () as usize;
                    self.edge(p, k, Arc::strong_count(src), 1, || Node::Recipe(src));
                }
            }
            Node::Recipe(src) => {
                for t in src.args() {
                    self.tensor(p, t);
                }
                for f in src.built_functions() {
                    self.function(p, f);
                }
            }
            Node::Callable(_) => {}
        }
    }
}

/// The Python callables reachable from `roots` that no one else holds (module doc).
pub fn owned_callables<'a>(roots: impl IntoIterator<Item = Root<'a>>) -> Vec<&'a PyCallable> {
    let mut g = Graph {
        info: HashMap::new(),
        todo: Vec::new(),
    };
    for r in roots {
        match r {
            Root::Tensor(t) => g.tensor(None, t),
            Root::Function(f) => g.function(None, f),
            Root::Callback(c) => g.callback(None, c),
            Root::Compiled(c) => {
                let k = Arc::as_ptr(c) as *const () as usize;
                g.edge(None, k, Arc::strong_count(c), 1, || Node::Compiled(c));
            }
        }
    }
    while let Some(k) = g.todo.pop() {
        g.expand(k);
    }
    // Held from outside: more handles than found (or, defensively, fewer); then everything
    // reachable from those.
    let mut shared: Vec<usize> = g
        .info
        .iter()
        .filter(|(_, i)| i.handles != i.found)
        .map(|(k, _)| *k)
        .collect();
    let mut reached: HashSet<usize> = shared.iter().copied().collect();
    while let Some(k) = shared.pop() {
        for c in &g.info[&k].children {
            if reached.insert(*c) {
                shared.push(*c);
            }
        }
    }
    g.info
        .iter()
        .filter(|(k, _)| !reached.contains(k))
        .filter_map(|(_, i)| match i.node {
            Node::Callable(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// What a schedule holds: its stages' tensors and debug taps, its outputs.
pub fn schedule_roots(s: &rivet_compiler::Schedule) -> Vec<Root<'_>> {
    let mut roots: Vec<Root<'_>> = s.outputs.iter().map(Root::Tensor).collect();
    for st in &s.stages {
        roots.push(Root::Tensor(&st.tensor));
        roots.extend(st.taps.iter().map(Root::Callback));
    }
    roots
}

/// What a module holds: its compiled functions.
pub fn module_roots(m: &rivet_compiler::Module) -> Vec<Root<'_>> {
    m.funcs.iter().map(Root::Compiled).collect()
}

/// `__traverse__` of a rivet object holding `roots`: reports the callables it owns alone.
pub fn traverse<'a>(
    roots: impl IntoIterator<Item = Root<'a>>,
    visit: &PyVisit<'_>,
) -> Result<(), PyTraverseError> {
    for c in owned_callables(roots) {
        c.visit(visit)?;
    }
    Ok(())
}

/// `__clear__` of a rivet object holding `roots`: drops the callables it owns alone (the
/// collector found it unreachable, so none of them can be called again).
pub fn clear<'a>(roots: impl IntoIterator<Item = Root<'a>>) {
    for c in owned_callables(roots) {
        c.release();
    }
}
