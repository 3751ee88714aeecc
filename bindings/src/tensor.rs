//! `rivet.Tensor`: a Python handle on a runtime `Tensor` view.
//!
//! A CUDA tensor remembers what rivet last queued on it as an event (`driver::Event`, shared
//! by every output of the call or allocation that queued it), never a stream handle:
//! `__dlpack__(stream=...)` and use as an input on another stream make that stream wait for
//! the event (`cuStreamWaitEvent`, never a synchronisation, never a record on a stream an
//! earlier call used, which its owner may have destroyed since), as the array API asks of
//! producers.
//!
//! The type also carries `__dlpack_c_exchange_api__` (DLPack's C exchange table, in
//! `exchange.rs`), so C consumers import rivet tensors with no Python call.

use crate::capsule;
use crate::convert;
use crate::errors::IntoPyResult;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use rivet_compiler::codegen::cuda::driver::Event;
use rivet_runtime::{stream as streams, DType, Device, Error, Tensor};
use std::sync::{Arc, Mutex};

#[pyclass(name = "Tensor", module = "rivet", frozen)]
pub struct PyTensor {
    pub tensor: Tensor,
    /// The completion event of rivet's last work on a CUDA tensor; `None`: nothing to wait for.
    ready: Mutex<Option<Arc<Event>>>,
}

impl PyTensor {
    pub fn new(tensor: Tensor) -> PyTensor {
        PyTensor::with_event(tensor, None)
    }

    /// A handle on a tensor whose pending work `ready` covers (CUDA tensors only).
    pub fn with_event(tensor: Tensor, ready: Option<Arc<Event>>) -> PyTensor {
        let ready = match tensor.device() {
            Device::Cuda(_) => ready,
            _ => None,
        };
        PyTensor {
            tensor,
            ready: Mutex::new(ready),
        }
    }

    /// The completion event of rivet's last work on this tensor.
    pub fn ready(&self) -> Option<Arc<Event>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The array API's producer side for a CUDA tensor: the consumer's `stream` (None: the
    /// legacy default stream; -1: no ordering asked; 0 taken as the legacy default stream)
    /// waits for the completion event of rivet's last work on the tensor (no sync).
    pub(crate) fn order_for_consumer(
        &self,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> Result<(), Error> {
        let Device::Cuda(o) = self.tensor.device() else {
            return Ok(());
        };
        let consumer = match stream {
            None => Some(streams::LEGACY),
            Some(s) if s.is_none() => Some(streams::LEGACY),
            Some(s) => match s.extract::<i64>() {
                Ok(-1) => None,
                Ok(v) if v >= 0 && !s.is_instance_of::<pyo3::types::PyBool>() => Some(v as u64),
                _ => {
                    return Err(Error::DLPack(format!(
                        "__dlpack__: argument 'stream' must be None, -1 or a CUDA stream handle (an int >= 0) for a tensor on {}, got {s}",
                        self.tensor.device()
                    )))
                }
            },
        };
        if let (Some(c), Some(ev)) = (consumer, self.ready()) {
            debug_assert_eq!(ev.ordinal(), o as usize);
            ev.wait_on(c).map_err(Error::from)?;
        }
        Ok(())
    }

    /// Records that a call queued work on this (CUDA) tensor, which `ready` covers.
    pub fn set_ready(&self, ready: &Arc<Event>) {
        if matches!(self.tensor.device(), Device::Cuda(_)) {
            *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = Some(ready.clone());
        }
    }
}

#[pymethods]
impl PyTensor {
    /// DLPack's C exchange API (a `dlpack_exchange_api` capsule on the type, see
    /// `exchange.rs`): C consumers (tvm-ffi, C extensions) import rivet tensors without a
    /// Python call or a capsule per tensor.
    #[classattr]
    fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Py<PyAny>> {
        crate::exchange::capsule(py)
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.shape())
    }
    /// Strides in elements (DLPack's unit), not bytes.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.strides())
    }
    #[getter]
    fn ndim(&self) -> usize {
        self.tensor.ndim()
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        self.tensor.dtype().name()
    }
    #[getter]
    fn device(&self) -> String {
        self.tensor.device().to_string()
    }
    /// Address of element (0, 0, ...), byte offset included.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.tensor.data_ptr() as usize
    }
    #[getter]
    fn read_only(&self) -> bool {
        self.tensor.is_read_only()
    }
    #[getter]
    fn size(&self) -> i64 {
        self.tensor.numel()
    }
    /// Whether the memory is in a shared-memory segment of this process (`rivet.ipc.share`
    /// takes it without a copy): `rivet.empty/zeros(..., shared=True)`, a tensor opened from
    /// a handle, any view of those.
    #[getter]
    fn is_shared(&self) -> bool {
        rivet_runtime::ipc::is_shared(&self.tensor)
    }

    /// `pickle` stores the elements by value (a handle means nothing on disk); passing a
    /// tensor through multiprocessing shares it instead (the reducer in rivet/ipc.py).
    fn __reduce__(&self, py: Python<'_>) -> PyResult<crate::ipc::Reduced> {
        crate::ipc::reduce_by_value(py, &self.tensor)
    }

    /// A numpy view of the same memory (no copy); read-only tensors give read-only arrays.
    /// Goes through `__array_interface__`, which every numpy version honours, read-only flag
    /// included (numpy < 1.25's `from_dlpack` makes every array read-only).
    fn numpy(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        array_typestr(&slf.get().tensor).py_err(py)?;
        Ok(py
            .import("numpy")?
            .call_method1("asarray", (slf,))?
            .unbind())
    }

    /// numpy's array interface (version 3): the array numpy builds keeps this tensor alive.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = &self.tensor;
        let typestr = array_typestr(t).py_err(py)?;
        // Exact: every view is validated so that each stride in bytes fits in i64.
        let strides = t.byte_strides();
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", PyTuple::new(py, t.shape())?)?;
        d.set_item("typestr", typestr)?;
        d.set_item("strides", PyTuple::new(py, strides.as_slice())?)?;
        d.set_item("data", (t.data_ptr() as usize, t.is_read_only()))?;
        Ok(d)
    }

    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let t = &self.tensor;
        if let Some(s) = &stream {
            // On the CPU there is no stream to synchronise with; only None / -1 make sense.
            if t.device().is_host() && !s.is_none() && s.extract::<i64>().ok() != Some(-1) {
                return Err(Error::DLPack(format!(
                    "__dlpack__: argument 'stream' must be None for a tensor on {}, got {s}",
                    t.device()
                )))
                .py_err(py);
            }
        }
        if let Some((ty, id)) = dl_device {
            let d = t.device().to_dlpack();
            if (ty as u32, id) != (d.device_type, d.device_id) {
                return Err(Error::DLPack(format!(
                    "__dlpack__: argument 'dl_device' is ({ty}, {id}) but the tensor is on {} ({}, {}); rivet does not copy across devices",
                    t.device(), d.device_type, d.device_id
                )))
                .py_err(py);
            }
        }
        if !t.device().is_host() {
            // Checked before anything is ordered, as every refusal above.
            if copy == Some(true) {
                return Err(Error::Device(format!(
                    "__dlpack__: copy=True is not supported for a tensor on {} (rivet does not copy device memory); export it without copy",
                    t.device()
                )))
                .py_err(py);
            }
            self.order_for_consumer(stream.as_ref()).py_err(py)?;
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        if copy == Some(true) {
            let c = t.copy_compact().py_err(py)?;
            return capsule::export(py, &c, versioned);
        }
        capsule::export(py, t, versioned)
    }

    /// A legacy capsule even when read-only, for `to_jax_func` only: JAX asks for legacy
    /// capsules and never writes through them. `stream` as in `__dlpack__`.
    #[pyo3(signature = (stream=None))]
    fn _dlpack_for_immutable_consumer(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        if !self.tensor.device().is_host() {
            self.order_for_consumer(stream.as_ref()).py_err(py)?;
        }
        capsule::export_for_immutable_consumer(py, &self.tensor)
    }

    fn __dlpack_device__(&self) -> (u32, i32) {
        let d = self.tensor.device().to_dlpack();
        (d.device_type, d.device_id)
    }

    fn __repr__(&self) -> String {
        format!(
            "rivet.Tensor(shape={:?}, strides={:?}, dtype={}, device={}{})",
            self.tensor.shape(),
            self.tensor.strides(),
            self.tensor.dtype(),
            self.tensor.device(),
            if self.tensor.is_read_only() {
                ", read_only=True"
            } else {
                ""
            }
        )
    }
}

/// numpy's type string for the tensor's dtype; errors for what numpy cannot hold.
fn array_typestr(t: &Tensor) -> Result<&'static str, Error> {
    if !t.device().is_host() {
        return Err(Error::Device(format!(
            "a numpy view needs a CPU tensor, this one is on {}",
            t.device()
        )));
    }
    t.dtype().typestr().ok_or_else(|| {
        // bfloat16, the one dtype without a type string.
        Error::DType(
            "numpy has no bfloat16 dtype; view the tensor with torch.from_dlpack instead".into(),
        )
    })
}

/// `rivet.from_dlpack(obj)`: a view of any DLPack producer's memory (no copy).
#[pyfunction]
pub fn from_dlpack(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Py<PyTensor>> {
    let ctx = "from_dlpack: argument 0 ('obj'): ";
    // As a call would: a CUDA producer is asked for its data on rivet's stream (the legacy
    // default one) or tells its own (torch's current stream), which the view remembers, so
    // later calls on it are ordered after the producer's work.
    let mut sync = crate::cuda::CallStreams::new(None);
    match convert::try_tensor_in(obj, Some(&mut sync))
        .map_err(|e| e.context(ctx))
        .py_err(py)?
    {
        Some(t) => {
            let ready = match t.device() {
                Device::Cuda(o) => sync
                    .ready_now(o as usize)
                    .map_err(|e| e.context(ctx))
                    .py_err(py)?,
                _ => None,
            };
            Py::new(py, PyTensor::with_event(t, ready))
        }
        None => Err(rivet_runtime::Error::Argument(format!(
            "from_dlpack: argument 0 ('obj') has type {}; expected a rivet.Tensor, an object with __dlpack__ or a DLPack capsule",
            obj.get_type().fully_qualified_name().map(|n| n.to_string()).unwrap_or_default()
        )))
        .py_err(py),
    }
}

/// `rivet.zeros(shape, dtype="float32", device="cpu", stream=None, shared=False)`: a new
/// zero-filled tensor in rivet's own memory. A size over `rivet.MAX_ALLOC_BYTES`, an
/// overflowing one or a refused allocation raises `rivet.MemoryError`. On a CUDA device the
/// memory comes from the device's pool (`cuMemAlloc` on a device without memory pools),
/// allocated and zeroed stream-ordered on `stream`
/// (default: the legacy default stream); without a driver it is a `DeviceError` saying what is
/// missing. `shared=True` (CPU only): in a shared-memory segment of its own, which
/// `rivet.ipc.share` hands to other processes without a copy.
#[pyfunction]
#[pyo3(signature = (shape, dtype="float32", device="cpu", stream=None, shared=false))]
pub fn zeros(
    py: Python<'_>,
    shape: Vec<i64>,
    dtype: &str,
    device: &str,
    stream: Option<Bound<'_, PyAny>>,
    shared: bool,
) -> PyResult<Py<PyTensor>> {
    new_tensor(
        py,
        "rivet.zeros",
        shape,
        dtype,
        device,
        stream,
        true,
        shared,
    )
}

/// `rivet.empty(shape, dtype="float32", device="cpu", stream=None, shared=False)`: as
/// `zeros`, without the fill on a CUDA device (rivet's CPU memory is always zeroed).
#[pyfunction]
#[pyo3(signature = (shape, dtype="float32", device="cpu", stream=None, shared=false))]
pub fn empty(
    py: Python<'_>,
    shape: Vec<i64>,
    dtype: &str,
    device: &str,
    stream: Option<Bound<'_, PyAny>>,
    shared: bool,
) -> PyResult<Py<PyTensor>> {
    new_tensor(
        py,
        "rivet.empty",
        shape,
        dtype,
        device,
        stream,
        false,
        shared,
    )
}

#[allow(clippy::too_many_arguments)]
fn new_tensor(
    py: Python<'_>,
    what: &str,
    shape: Vec<i64>,
    dtype: &str,
    device: &str,
    stream: Option<Bound<'_, PyAny>>,
    zero: bool,
    shared: bool,
) -> PyResult<Py<PyTensor>> {
    let dtype: DType = dtype.parse().py_err(py)?;
    let device: Device = device
        .parse()
        .map_err(|e: Error| e.context(&format!("{what}: argument 'device': ")))
        .py_err(py)?;
    let stream = crate::cuda::parse_stream(stream.as_ref(), &format!("{what}: argument 'stream'"))
        .py_err(py)?;
    match device {
        Device::Cpu => {
            if stream.is_some() {
                return Err(Error::Argument(format!(
                    "{what}: argument 'stream' must be None for device 'cpu'"
                )))
                .py_err(py);
            }
            let t = if shared {
                py.detach(|| Tensor::zeros_shared(&shape, dtype))
                    .map_err(|e| e.context(&format!("{what}: ")))
            } else {
                Tensor::zeros(&shape, dtype)
            }
            .py_err(py)?;
            Py::new(py, PyTensor::new(t))
        }
        Device::Cuda(_) if shared => Err(Error::Device(format!(
            "{what}: shared=True allocates CPU shared memory; device is '{device}' (rivet's CUDA memory is cuMemAllocAsync pool memory, which CUDA IPC cannot share: share a torch CUDA tensor with rivet.ipc.share instead)"
        )))
        .py_err(py),
        Device::Cuda(o) => {
            let s = stream.unwrap_or(streams::LEGACY);
            let t = py
                .detach(|| {
                    rivet_compiler::codegen::cuda::driver::alloc_tensor(
                        o as usize, &shape, dtype, s, zero,
                    )
                })
                .map_err(|e| Error::from(e).context(&format!("{what}: ")))
                .py_err(py)?;
            // Consumers wait for the allocation (and zeroing) queued on `s`.
            let ready = rivet_compiler::codegen::cuda::driver::record(o as usize, s)
                .map_err(|e| Error::from(e).context(&format!("{what}: ")))
                .py_err(py)?;
            Py::new(py, PyTensor::with_event(t, Some(ready)))
        }
        other => Err(Error::Device(format!(
            "{what}: cannot allocate on {other}; expected 'cpu', 'cuda' or 'cuda:N'"
        )))
        .py_err(py),
    }
}
