//! `rivet.Function` and the registry functions. A `Function` call converts the arguments
//! (holding the GIL), runs the native body (which releases the GIL around its real work
//! through `rivet_runtime::host_lock`), and converts the result.
//! Wrappers made by `convert_func` / `to_*_func` carry a framework type: arguments of that
//! type go through its `to_dlpack` function, tensor results come back as that type.

use crate::convert::{self, tensor_as, wrap_callable};
use crate::cuda::{parse_stream, CallStreams};
use crate::errors::IntoPyResult;
use crate::keepalive::CallArgs;
use crate::tensor::PyTensor;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PyString, PyTuple, PyType};
use pyo3::{PyTraverseError, PyVisit};
use rivet_compiler::codegen::cuda::driver::{self, Event};
use rivet_runtime::{registry, ArgName, DeviceSpec, Dim, Function, ParamKind, Value};
use std::sync::Arc;

/// The device of the first CUDA tensor in `v` (a list's items included).
fn cuda_device(v: &Value) -> Option<usize> {
    match v {
        Value::Tensor(t) => match t.device() {
            rivet_runtime::Device::Cuda(o) if o >= 0 => Some(o as usize),
            _ => None,
        },
        Value::List(items) => items.iter().find_map(cuda_device),
        _ => None,
    }
}

/// How a wrapper converts between a framework's tensors and rivet's.
struct Framework {
    ty: Py<PyType>,
    /// obj -> DLPack capsule (or any tensor-like); None: rivet imports the type natively.
    to_dlpack: Option<Py<PyAny>>,
    /// rivet.Tensor -> framework tensor; None: results stay rivet tensors.
    from_dlpack: Option<Py<PyAny>>,
}

#[pyclass(name = "Function", module = "rivet", frozen)]
pub struct PyFunction {
    pub func: Function,
    framework: Option<Framework>,
}

impl PyFunction {
    pub fn new(func: Function) -> PyFunction {
        PyFunction {
            func,
            framework: None,
        }
    }

    /// One argument of a call. Its tensor view may borrow `obj` (`keepalive.rs`).
    ///
    /// # Safety
    /// The result must go into the call's `CallArgs`.
    unsafe fn convert_arg(
        &self,
        obj: &Bound<'_, PyAny>,
        index: usize,
        sync: &mut CallStreams,
        spares: &mut crate::keepalive::Spares,
    ) -> PyResult<Value> {
        let py = obj.py();
        let name = self
            .func
            .signature()
            .and_then(|s| s.params.get(index))
            .map(|p| p.name.as_str());
        let arg = ArgName { index, name };
        if let Some(Framework {
            ty,
            to_dlpack: Some(to_dlpack),
            ..
        }) = &self.framework
        {
            if obj.is_instance(ty.bind(py))? {
                let cap = to_dlpack.bind(py).call1((obj,))?;
                // SAFETY: forwarded (`cap` is alive for the call: the view of a capsule owns
                // its managed tensor, it never borrows).
                return unsafe { convert::call_arg(&cap, self.func.name(), arg, sync, spares) }
                    .py_err(py);
            }
        }
        // SAFETY: forwarded.
        unsafe { convert::call_arg(obj, self.func.name(), arg, sync, spares) }.py_err(py)
    }

    fn convert_result(
        &self,
        py: Python<'_>,
        v: &Value,
        ready: Option<&Arc<Event>>,
    ) -> PyResult<Py<PyAny>> {
        if let (
            Value::Tensor(t),
            Some(Framework {
                ty,
                from_dlpack: Some(from),
                ..
            }),
        ) = (v, &self.framework)
        {
            return tensor_as(py, t, ty.bind(py), from.bind(py), ready);
        }
        convert::from_value_on(py, v, ready)
    }
}

#[pymethods]
impl PyFunction {
    /// Reports its framework's type and conversion functions, and the Python callables its
    /// function alone holds (a wrapped callable, a compiled function's callbacks: `gc.rs`).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(fw) = &self.framework {
            visit.call(&fw.ty)?;
            visit.call(&fw.to_dlpack)?;
            visit.call(&fw.from_dlpack)?;
        }
        crate::gc::traverse([crate::gc::Root::Function(&self.func)], &visit)
    }
    /// The framework's objects are immutable fields (the collector breaks a cycle through
    /// them at a mutable object in it, e.g. the closure of a `to_dlpack` lambda).
    fn __clear__(&self) {
        crate::gc::clear([crate::gc::Root::Function(&self.func)])
    }
    /// `f(*args, stream=None)`: `stream` (an int CUstream handle, a torch.cuda.Stream, a
    /// cupy.cuda.Stream, anything with `.cuda_stream` / `.ptr`) is the CUDA stream the call
    /// runs on; without it the call picks one (`cuda::CallStreams`). CPU functions ignore it.
    #[pyo3(signature = (*args, stream=None))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        // The error's wording is only formatted when there is a stream to parse.
        let explicit = match &stream {
            Some(s) => parse_stream(Some(s), &format!("{}: argument 'stream'", self.func.name()))
                .py_err(py)?,
            None => None,
        };
        let mut sync = CallStreams::new(explicit);
        // The argument views borrow their producers, which `args` keeps alive for the call;
        // `call_args` must drop before this function returns, on every path (`keepalive.rs`).
        let mut call_args = CallArgs::with_capacity(py, args.len());
        for (i, a) in args.iter().enumerate() {
            // SAFETY: the value goes into `call_args`, which drops while `args` lives.
            let v = unsafe { self.convert_arg(&a, i, &mut sync, &mut call_args.spares) }?;
            call_args.values.push(v);
        }
        let values = &call_args.values;
        // The call's stream waits for the work pending on rivet tensor arguments.
        sync.begin().py_err(py)?;
        let func = &self.func;
        // Native bodies release the GIL themselves around real work (`host_lock::without_host_lock`),
        // as numpy does: for tiny calls the release would cost as much as the work.
        let result = rivet_runtime::stream::with_call_stream(sync.stream, || func.call(values));
        // A call on CUDA tensors (whether or not an argument named a stream: capsules, v2
        // `__cuda_array_interface__` and IPC-opened tensors name none, and the call then ran
        // on the legacy default stream) ends with a completion event on its stream, which its
        // results and its rivet tensor arguments carry, whether it succeeded or not (a failed
        // call may have queued some work).
        let device = sync
            .device()
            .or_else(|| values.iter().find_map(cuda_device))
            .or_else(|| result.as_ref().ok().and_then(cuda_device))
            // Without a driver no work can have been queued (fake pointers in tests).
            .filter(|_| driver::driver_present());
        let done = device.map(|o| {
            driver::record(o, sync.stream.unwrap_or(rivet_runtime::stream::LEGACY))
                .map_err(rivet_runtime::Error::from)
        });
        let done = match done {
            Some(Ok(ev)) => Some(ev),
            Some(Err(e)) => {
                // Reported after the call's own error.
                result.py_err(py)?;
                return Err(e).py_err(py);
            }
            None => None,
        };
        // Producers on other streams wait for the call's work. A failure here is reported
        // after the call's.
        let ordered = sync.finish(done.as_ref());
        let result = result.py_err(py)?;
        ordered.py_err(py)?;
        if let Some(ev) = &done {
            for a in args.iter() {
                if let Ok(t) = a.cast::<PyTensor>() {
                    t.get().set_ready(ev);
                }
            }
        }
        // Drop the argument views (and so run producers' deleters) before converting back; a
        // view the result holds takes a reference to its producer here.
        drop(call_args);
        self.convert_result(py, &result, done.as_ref())
    }

    #[getter]
    fn name(&self) -> &str {
        self.func.name()
    }

    /// The typed signature as text, e.g. "(alpha: float, x: Tensor[float32|float64], ...)";
    /// None for untyped functions.
    #[getter]
    fn signature(&self) -> Option<String> {
        self.func.signature().map(|s| s.to_string())
    }

    /// The backward (vector-Jacobian product) function of a function built from a te program
    /// (`rivet.build`, `rivet.kernels`): takes the forward's inputs, one cotangent per output,
    /// and writes one gradient per float input (`rivet_compiler::backward`). Built with
    /// `te.gradient` on first use, then cached. `rivet.NotDifferentiableError` when rivet
    /// cannot differentiate the function (loaded from a file, a host callback on the path).
    fn backward(&self, py: Python<'_>) -> PyResult<PyFunction> {
        use crate::errors::CompileResult;
        Ok(PyFunction::new(
            rivet_compiler::backward::backward(&self.func).cpy(py)?,
        ))
    }

    /// The saved-activations pair `(forward, backward, residuals)` of a function built from a
    /// te program (`rivet_compiler::residuals`, docs/gradient.md "Saved activations"): the
    /// forward takes this function's arguments then writes `residuals` extra outputs (forward
    /// values the backward needs); the backward takes the forward's inputs, its outputs, the
    /// residuals and one cotangent per output, and writes one gradient per float input. Built
    /// on first use, then cached; the errors of `backward()`.
    fn training_pair(&self, py: Python<'_>) -> PyResult<(PyFunction, PyFunction, usize)> {
        use crate::errors::CompileResult;
        let s = rivet_compiler::backward::saved(&self.func).cpy(py)?;
        Ok((
            PyFunction::new(s.forward),
            PyFunction::new(s.backward),
            s.residuals,
        ))
    }

    /// The outputs an inputs-only call allocates for inputs of `shapes` (a sequence of int
    /// sequences, one per tensor input; `dtypes`, dtype names, are checked against the
    /// signature when given): a list of `(shape, dtype)` tuples, computed without running the
    /// function (compiled functions only; `rivet.jax.ffi_func` asks it).
    #[pyo3(signature = (shapes, dtypes=None))]
    fn output_shapes(
        &self,
        py: Python<'_>,
        shapes: Vec<Vec<i64>>,
        dtypes: Option<Vec<String>>,
    ) -> PyResult<Vec<(Vec<i64>, &'static str)>> {
        let refs: Vec<&[i64]> = shapes.iter().map(|s| s.as_slice()).collect();
        let dtypes: Option<Vec<rivet_runtime::DType>> = dtypes
            .map(|ds| {
                ds.iter()
                    .map(|d| d.parse::<rivet_runtime::DType>())
                    .collect()
            })
            .transpose()
            .py_err(py)?;
        let outs = self
            .func
            .output_shapes(&refs, dtypes.as_deref())
            .py_err(py)?;
        Ok(outs.into_iter().map(|(s, d)| (s, d.name())).collect())
    }

    /// The typed signature as plain data, for framework glue (`rivet.torch`): one dict per
    /// parameter, in call order, with `name`, `kind` ("tensor", "int", "float", "bool",
    /// "str", "function", "any"), and for tensors `dtypes` (list of names; empty: any),
    /// `shape` (None: any rank; else per dim an int, a symbolic dim's name, or None for a dim
    /// given by an expression or unconstrained), `device` ("host": CPU-readable memory;
    /// "any": the function checks devices itself, as CUDA builds do; else a device such as
    /// "cuda:0") and `output` (the function writes it). None for untyped functions.
    #[getter]
    fn _params<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let Some(sig) = self.func.signature() else {
            return Ok(None);
        };
        let out = PyList::empty(py);
        for p in &sig.params {
            let d = PyDict::new(py);
            d.set_item("name", &p.name)?;
            let kind = match &p.kind {
                ParamKind::Any => "any",
                ParamKind::Bool => "bool",
                ParamKind::Int => "int",
                ParamKind::Float => "float",
                ParamKind::Str => "str",
                ParamKind::Function => "function",
                ParamKind::Tensor(t) => {
                    let dtypes: Vec<&str> = t.dtypes.iter().map(|d| d.name()).collect();
                    d.set_item("dtypes", dtypes)?;
                    let shape = match &t.shape {
                        None => py.None(),
                        Some(dims) => {
                            let dims: Vec<Py<PyAny>> = dims
                                .iter()
                                .map(|dim| match dim {
                                    Dim::Fixed(n) => PyInt::new(py, *n).into_any().unbind(),
                                    Dim::Var(v) => PyString::new(py, v).into_any().unbind(),
                                    Dim::Any => py.None(),
                                })
                                .collect();
                            PyList::new(py, dims)?.into_any().unbind()
                        }
                    };
                    d.set_item("shape", shape)?;
                    let device = match t.device {
                        DeviceSpec::Host => "host".to_string(),
                        DeviceSpec::Any => "any".to_string(),
                        DeviceSpec::Exactly(dev) => dev.to_string(),
                    };
                    d.set_item("device", device)?;
                    d.set_item("output", t.output)?;
                    "tensor"
                }
            };
            d.set_item("kind", kind)?;
            out.append(d)?;
        }
        Ok(Some(out))
    }

    /// A wrapper of this function for a framework's tensor type (see `rivet.convert_func`).
    #[pyo3(signature = (tensor_type, to_dlpack=None, from_dlpack=None))]
    fn _with_framework(
        &self,
        tensor_type: Bound<'_, PyType>,
        to_dlpack: Option<Py<PyAny>>,
        from_dlpack: Option<Py<PyAny>>,
    ) -> PyFunction {
        PyFunction {
            func: self.func.clone(),
            framework: Some(Framework {
                ty: tensor_type.unbind(),
                to_dlpack,
                from_dlpack,
            }),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "rivet.Function({}{})",
            self.func.name(),
            self.func
                .signature()
                .map(|s| s.to_string())
                .unwrap_or_else(|| "(...)".into())
        )
    }
}

/// Registers `f` (a rivet.Function or any Python callable) under `name`.
#[pyfunction]
#[pyo3(signature = (name, f, override_=false))]
pub fn _register(
    py: Python<'_>,
    name: &str,
    f: &Bound<'_, PyAny>,
    override_: bool,
) -> PyResult<()> {
    let func = match f.cast::<PyFunction>() {
        Ok(pf) => pf.get().func.clone(),
        Err(_) if f.is_callable() => wrap_callable(f.clone().unbind(), Some(name.to_string())),
        Err(_) => {
            return Err(rivet_runtime::Error::Argument(format!(
                "register_func: argument 1 ('f') must be callable, got {}",
                f.get_type().fully_qualified_name()?
            )))
            .py_err(py)
        }
    };
    registry::register(name, func, override_).py_err(py)
}

#[pyfunction]
#[pyo3(signature = (name, allow_missing=false))]
pub fn get_global_func(
    py: Python<'_>,
    name: &str,
    allow_missing: bool,
) -> PyResult<Option<PyFunction>> {
    if allow_missing {
        return Ok(registry::try_get(name).map(PyFunction::new));
    }
    registry::get(name)
        .map(|f| Some(PyFunction::new(f)))
        .py_err(py)
}

#[pyfunction]
pub fn list_global_funcs() -> Vec<String> {
    registry::list()
}

/// Removes a registered function; returns whether it was there.
#[pyfunction]
pub fn remove_global_func(name: &str) -> bool {
    registry::remove(name)
}
