//! `rivet.Schedule` and `rivet.Stage` (`s[C]`): the schedule primitives (split, fuse,
//! reorder, tile, annotations, compute_inline, compute_at; GPU memory caches `cache_read` /
//! `cache_write` on the schedule) and the loops they report (`leaf_iter_vars`, with their
//! extents).

use super::itervar::{axis_var, new_itervar, PyIterVar};
use super::operand::index_arg;
use super::tensor::{tensor_arg, tensors_arg, PyTeTensor, PyTensorOp};
use super::{arg_err, compile_err};
use crate::errors::CompileResult;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{PyTraverseError, PyVisit};
use rivet_compiler::ir::expr::{Expr, IterVar, Var};
use rivet_compiler::ir::stmt::{ForKind, Scope, ThreadTag};
use rivet_compiler::schedule::{Attach, Schedule, Stage};
use rivet_compiler::te::Tensor;

/// `rivet.Schedule` (`rivet.create_schedule(C)`); `s[C]` is the stage of `C`.
#[pyclass(name = "Schedule", module = "rivet")]
pub struct PySchedule {
    pub sched: Schedule,
}

#[pyfunction]
pub fn create_schedule(py: Python<'_>, outputs: &Bound<'_, PyAny>) -> PyResult<PySchedule> {
    let outs = tensors_arg(outputs, "create_schedule: argument 0 ('outputs')")?;
    Ok(PySchedule {
        sched: Schedule::new(&outs).cpy(py)?,
    })
}

/// The default GPU schedule of `outputs`: what `build(..., target="cuda")` applies to a
/// schedule that binds no loop (`schedule::gpu_default::apply_default_gpu`), as a schedule to
/// inspect, extend or build for `interp` (which runs GPU schedules on the CPU).
#[pyfunction]
pub fn default_gpu_schedule(py: Python<'_>, outputs: &Bound<'_, PyAny>) -> PyResult<PySchedule> {
    let outs = tensors_arg(outputs, "default_gpu_schedule: argument 0 ('outputs')")?;
    Ok(PySchedule {
        sched: rivet_compiler::schedule::gpu_default::default_gpu_schedule(&outs).cpy(py)?,
    })
}

#[pymethods]
impl PySchedule {
    /// Reports the Python callbacks (debug taps, extern stages) it alone holds (`gc.rs`).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        crate::gc::traverse(crate::gc::schedule_roots(&self.sched), &visit)
    }
    fn __clear__(&mut self) {
        crate::gc::clear(crate::gc::schedule_roots(&self.sched))
    }
    fn __getitem__(slf: &Bound<'_, Self>, t: &Bound<'_, PyAny>) -> PyResult<PyStage> {
        let py = slf.py();
        let t = tensor_arg(t, "s[...]")?;
        slf.borrow().sched.stage_index(&t).cpy(py)?;
        Ok(PyStage {
            sched: slf.clone().unbind(),
            t,
        })
    }
    #[getter]
    fn outputs(&self) -> Vec<PyTeTensor> {
        self.sched
            .outputs
            .iter()
            .map(|t| PyTeTensor { t: t.clone() })
            .collect()
    }
    /// Every stage, producers first.
    #[getter]
    fn stages(slf: &Bound<'_, Self>) -> Vec<PyStage> {
        slf.borrow()
            .sched
            .stages
            .iter()
            .map(|s| PyStage {
                sched: slf.clone().unbind(),
                t: s.tensor.clone(),
            })
            .collect()
    }
    /// TVM's `cache_read`: a new stage copying `tensor` into a `"shared"` or `"local"` buffer,
    /// read by `readers` (a tensor or a list of them) instead of `tensor`. Returns the cache
    /// tensor (schedule it with `s[cache]`: compute_at inside a GPU stage, bind its loops).
    fn cache_read(
        &mut self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        scope: &Bound<'_, PyAny>,
        readers: &Bound<'_, PyAny>,
    ) -> PyResult<PyTeTensor> {
        let t = tensor_arg(tensor, "cache_read: argument 0 ('tensor')")?;
        let scope = scope_arg(py, scope, "cache_read")?;
        let readers = tensors_arg(readers, "cache_read: argument 2 ('readers')")?;
        Ok(PyTeTensor {
            t: self.sched.cache_read(&t, &scope, &readers).cpy(py)?,
        })
    }

    /// TVM's `cache_write`: `tensor`'s computation moves to a new `"local"` stage (per-thread
    /// accumulators), and `tensor` becomes a copy of it. Returns the cache tensor.
    fn cache_write(
        &mut self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        scope: &Bound<'_, PyAny>,
    ) -> PyResult<PyTeTensor> {
        let t = tensor_arg(tensor, "cache_write: argument 0 ('tensor')")?;
        let scope = scope_arg(py, scope, "cache_write")?;
        Ok(PyTeTensor {
            t: self.sched.cache_write(&t, &scope).cpy(py)?,
        })
    }

    fn __repr__(&self) -> String {
        let names: Vec<&str> = self.sched.stages.iter().map(|s| s.tensor.name()).collect();
        format!("rivet.Schedule(stages=[{}])", names.join(", "))
    }
}

/// A storage scope argument: a str (checked by the schedule).
fn scope_arg(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    obj.extract::<String>().map_err(|_| {
        arg_err(
            py,
            format!(
                "{what}: argument 1 ('scope') must be a str ('shared' or 'local'), got {}",
                obj.repr()
                    .map(|r| r.to_string())
                    .unwrap_or_else(|_| "?".into())
            ),
        )
    })
}

/// The IterVar of loop `v` of a stage, with the extent lowering gives that loop
/// (`Stage::extents`).
fn leaf_itervar(py: Python<'_>, st: &Stage, v: &Var) -> PyResult<Py<PyIterVar>> {
    let ext = st.extents();
    let reduce = st
        .leaves
        .iter()
        .find(|l| &l.var == v)
        .map(|l| l.reduce)
        .unwrap_or(false);
    let extent = ext.get(v).cloned().unwrap_or_else(|| Expr::int(0));
    new_itervar(
        py,
        IterVar {
            var: v.clone(),
            min: Expr::int(0),
            extent,
            reduce,
        },
    )
}

fn factor_arg(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<Expr>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => Ok(Some(index_arg(o, what)?)),
    }
}

/// `(x.outer, y.outer, x.inner, y.inner)` of `Stage.tile`.
type TileAxes = (Py<PyIterVar>, Py<PyIterVar>, Py<PyIterVar>, Py<PyIterVar>);

/// `s[C]`: the loops of one stage; the primitives reshape and annotate them.
#[pyclass(name = "Stage", module = "rivet", frozen)]
pub struct PyStage {
    sched: Py<PySchedule>,
    t: Tensor,
}

impl PyStage {
    /// Runs `f` on this stage (inside the schedule, mutably).
    fn with<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Stage) -> rivet_compiler::Result<R>,
    ) -> PyResult<R> {
        let mut s = self.sched.bind(py).borrow_mut();
        let st = s.sched.stage(&self.t).cpy(py)?;
        f(st).cpy(py)
    }

    fn itervar(&self, py: Python<'_>, v: &Var) -> PyResult<Py<PyIterVar>> {
        let s = self.sched.bind(py).borrow();
        let i = s.sched.stage_index(&self.t).cpy(py)?;
        leaf_itervar(py, &s.sched.stages[i], v)
    }
}

#[pymethods]
impl PyStage {
    /// Reports its schedule (a tap closing over the stage and its schedule is a cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.sched)?;
        crate::gc::traverse([crate::gc::Root::Tensor(&self.t)], &visit)
    }
    fn __clear__(&self) {
        crate::gc::clear([crate::gc::Root::Tensor(&self.t)])
    }
    /// The stage's current definition (after `cache_write`, the copy out of the cache).
    #[getter]
    fn op(&self, py: Python<'_>) -> PyTensorOp {
        let s = self.sched.bind(py).borrow();
        PyTensorOp {
            t: s.sched.current(&self.t),
        }
    }

    /// Where the stage's buffer lives: "global", or "shared" / "local" for caches.
    #[getter]
    fn scope(&self, py: Python<'_>) -> PyResult<&'static str> {
        let s = self.sched.bind(py).borrow();
        let i = s.sched.stage_index(&self.t).cpy(py)?;
        Ok(match s.sched.stages[i].scope {
            Scope::Global => "global",
            Scope::Shared => "shared",
            Scope::Local => "local",
        })
    }

    /// The current loops, outermost first.
    #[getter]
    fn leaf_iter_vars(&self, py: Python<'_>) -> PyResult<Vec<Py<PyIterVar>>> {
        let s = self.sched.bind(py).borrow();
        let i = s.sched.stage_index(&self.t).cpy(py)?;
        let st = &s.sched.stages[i];
        st.leaves
            .iter()
            .map(|l| leaf_itervar(py, st, &l.var))
            .collect()
    }

    /// The loop kinds, outermost first ("serial", "parallel", "vectorized", "unrolled").
    #[getter]
    fn leaf_kinds(&self, py: Python<'_>) -> PyResult<Vec<&'static str>> {
        let s = self.sched.bind(py).borrow();
        let i = s.sched.stage_index(&self.t).cpy(py)?;
        Ok(s.sched.stages[i]
            .leaves
            .iter()
            .map(|l| match l.kind {
                ForKind::Serial => "serial",
                ForKind::Parallel => "parallel",
                ForKind::Vectorized => "vectorized",
                ForKind::Unrolled => "unrolled",
                ForKind::Thread(t) => t.name(),
            })
            .collect())
    }

    /// "root", "inline" or "at".
    #[getter]
    fn attach(&self, py: Python<'_>) -> PyResult<&'static str> {
        let s = self.sched.bind(py).borrow();
        let i = s.sched.stage_index(&self.t).cpy(py)?;
        Ok(match s.sched.stages[i].attach {
            Attach::Root => "root",
            Attach::Inline => "inline",
            Attach::At { .. } => "at",
        })
    }

    /// Splits `parent` into `(outer, inner)`: `inner` has extent `factor`, or `outer` has
    /// extent `nparts`. Extents that do not divide are guarded.
    #[pyo3(signature = (parent, factor=None, nparts=None))]
    fn split(
        &self,
        py: Python<'_>,
        parent: &Bound<'_, PyAny>,
        factor: Option<&Bound<'_, PyAny>>,
        nparts: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Py<PyIterVar>, Py<PyIterVar>)> {
        let v = axis_var(parent, "split: argument 0 ('parent')")?;
        let factor = factor_arg(factor, "split: factor")?;
        let nparts = factor_arg(nparts, "split: nparts")?;
        let (o, i) = self.with(py, |st| st.split(&v, factor, nparts))?;
        Ok((self.itervar(py, &o)?, self.itervar(py, &i)?))
    }

    /// Fuses adjacent loops, outer first: `fuse(a, b, c)` is `fuse(fuse(a, b), c)`.
    #[pyo3(signature = (*axes))]
    fn fuse(&self, py: Python<'_>, axes: &Bound<'_, PyTuple>) -> PyResult<Py<PyIterVar>> {
        let vars: Vec<Var> = axes
            .iter()
            .enumerate()
            .map(|(i, a)| axis_var(&a, &format!("fuse: argument {i}")))
            .collect::<PyResult<_>>()?;
        let Some(first) = vars.first().cloned() else {
            return Err(compile_err(
                py,
                format!(
                    "schedule of '{}': fuse needs at least one loop",
                    self.t.name()
                ),
            ));
        };
        let fused = self.with(py, |st| {
            let mut acc = first;
            for v in &vars[1..] {
                acc = st.fuse(&acc, v)?;
            }
            Ok(acc)
        })?;
        self.itervar(py, &fused)
    }

    /// Puts the given loops in this order (in the positions they occupy now).
    #[pyo3(signature = (*axes))]
    fn reorder(&self, py: Python<'_>, axes: &Bound<'_, PyTuple>) -> PyResult<()> {
        let vars: Vec<Var> = axes
            .iter()
            .enumerate()
            .map(|(i, a)| axis_var(&a, &format!("reorder: argument {i}")))
            .collect::<PyResult<_>>()?;
        self.with(py, |st| st.reorder(&vars))
    }

    /// Tiles two loops: `(x.outer, y.outer, x.inner, y.inner)` in that loop order.
    fn tile(
        &self,
        py: Python<'_>,
        x_parent: &Bound<'_, PyAny>,
        y_parent: &Bound<'_, PyAny>,
        x_factor: &Bound<'_, PyAny>,
        y_factor: &Bound<'_, PyAny>,
    ) -> PyResult<TileAxes> {
        let x = axis_var(x_parent, "tile: argument 0 ('x_parent')")?;
        let y = axis_var(y_parent, "tile: argument 1 ('y_parent')")?;
        let xf = index_arg(x_factor, "tile: x_factor")?;
        let yf = index_arg(y_factor, "tile: y_factor")?;
        let (xo, yo, xi, yi) = self.with(py, |st| st.tile(&x, &y, xf, yf))?;
        Ok((
            self.itervar(py, &xo)?,
            self.itervar(py, &yo)?,
            self.itervar(py, &xi)?,
            self.itervar(py, &yi)?,
        ))
    }

    fn unroll(&self, py: Python<'_>, axis: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = axis_var(axis, "unroll: argument 0")?;
        self.with(py, |st| st.unroll(&v))
    }

    fn vectorize(&self, py: Python<'_>, axis: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = axis_var(axis, "vectorize: argument 0")?;
        self.with(py, |st| st.vectorize(&v))
    }

    fn parallel(&self, py: Python<'_>, axis: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = axis_var(axis, "parallel: argument 0")?;
        self.with(py, |st| st.parallel(&v))
    }

    /// Binds a loop to a GPU launch dimension: `thread` is "blockIdx.x" ... "threadIdx.z",
    /// or `te.thread_axis(...)` of one.
    fn bind(
        &self,
        py: Python<'_>,
        axis: &Bound<'_, PyAny>,
        thread: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let v = axis_var(axis, "bind: argument 0")?;
        let tag_obj = match thread.getattr("tag") {
            Ok(t) => t,
            Err(_) => thread.clone(),
        };
        let names: Vec<&str> = ThreadTag::ALL.iter().map(|t| t.name()).collect();
        let tag = tag_obj
            .extract::<String>()
            .ok()
            .and_then(|s| ThreadTag::parse(&s));
        let Some(tag) = tag else {
            return Err(compile_err(
                py,
                format!(
                    "bind: argument 1 ('thread') must be one of {} (or te.thread_axis of one), got {}",
                    names.join(", "),
                    thread
                        .repr()
                        .map(|r| r.to_string())
                        .unwrap_or_else(|_| "?".into())
                ),
            ));
        };
        self.with(py, |st| st.bind(&v, tag))
    }

    /// TVM's `tensorize`: the loop nest under `axis` becomes a call of `intrin` (a CPU
    /// micro-kernel; today "gemm_update", the MRxNR multiply-accumulate over packed panels)
    /// when it computes exactly the intrinsic's declared computation; otherwise the build
    /// raises `CompileError` naming the difference.
    fn tensorize(&self, py: Python<'_>, axis: &Bound<'_, PyAny>, intrin: &str) -> PyResult<()> {
        let v = axis_var(axis, "tensorize: argument 0")?;
        let Some(i) = rivet_compiler::ir::Intrin::parse(intrin) else {
            return Err(compile_err(
                py,
                format!("tensorize: argument 1 ('intrin') must be \"gemm_update\", got {intrin:?}"),
            ));
        };
        self.with(py, |st| st.tensorize(&v, i))
    }

    /// A debug tap (like `jax.debug.callback`): on every call, once this stage is computed,
    /// `func` (a callable, a `rivet.Function` or a registered name) receives a read-only copy
    /// of its values as a `rivet.Tensor`; its return value is ignored and no result changes.
    /// The stage stays materialised at the top level (it cannot be inlined or computed at
    /// another stage's loop while tapped). A schedule method, not a te op: a tap is a fact of
    /// how the program runs, not of what it computes, so the te graph (and gradients built
    /// from it) is untouched, and a tap cannot be dropped by not using a returned tensor.
    fn debug_tap(&self, py: Python<'_>, func: &Bound<'_, PyAny>) -> PyResult<()> {
        let f = super::functions::callback_arg(py, func, "debug_tap")?;
        self.with(py, |st| st.debug_tap(f))
    }

    /// Substitutes this stage into its consumers (no buffer, no loops of its own).
    fn compute_inline(&self, py: Python<'_>) -> PyResult<()> {
        let mut s = self.sched.bind(py).borrow_mut();
        s.sched.compute_inline(&self.t).cpy(py)
    }

    /// Computes this stage inside loop `axis` of `parent` (a stage or a tensor), over the
    /// region one iteration of that loop reads.
    fn compute_at(
        &self,
        py: Python<'_>,
        parent: &Bound<'_, PyAny>,
        axis: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let consumer = match parent.cast::<PyStage>() {
            Ok(st) => {
                let st = st.get();
                if !st.sched.is(&self.sched) {
                    return Err(compile_err(
                        py,
                        format!(
                            "schedule of '{}': compute_at target belongs to another schedule",
                            self.t.name()
                        ),
                    ));
                }
                st.t.clone()
            }
            Err(_) => tensor_arg(parent, "compute_at: argument 0 ('parent')")?,
        };
        let v = axis_var(axis, "compute_at: argument 1 ('axis')")?;
        let mut s = self.sched.bind(py).borrow_mut();
        s.sched.compute_at(&self.t, &consumer, &v).cpy(py)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let s = self.sched.bind(py).borrow();
        let loops = match s.sched.stage_index(&self.t) {
            Ok(i) => s.sched.stages[i]
                .leaves
                .iter()
                .map(|l| l.var.name.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            Err(_) => String::new(),
        };
        format!("rivet.Stage({}, loops=[{loops}])", self.t.name())
    }
}
