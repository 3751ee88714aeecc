//! The native half of `rivet.ipc` (the Python half, `rivet/ipc.py`, holds the `Handle`
//! dataclass, torch's fd and the multiprocessing glue). Logic lives in `rivet_runtime::ipc`;
//! this file reads a Python handle's fields into a `RawHandle` with an `IPCError` for any
//! field of the wrong type, and returns handles as plain tuples in `Handle`'s field order.
//! The GIL is released while files are opened and mapped.

use crate::convert;
use crate::errors::IntoPyResult;
use crate::tensor::PyTensor;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyInt, PyList, PyString, PyTuple};
use rivet_runtime::ipc::{self, invalid_handle as invalid, Handle, RawHandle, KIND_CPU};
use rivet_runtime::ipc_cuda::{CudaHandle, CudaRawHandle};
use rivet_runtime::{layout, DType, Device, Error, Tensor};
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};

/// `Handle`'s fields, in its order: kind, device, pid, fd, st_dev, st_ino, size, offset, shape,
/// strides, dtype, read_only.
type Fields = (
    &'static str,
    &'static str,
    i32,
    i32,
    u64,
    u64,
    u64,
    u64,
    Vec<i64>,
    Vec<i64>,
    &'static str,
    bool,
);

fn fields(h: &Handle) -> Fields {
    (
        KIND_CPU,
        "cpu",
        h.pid,
        h.fd,
        h.id.dev,
        h.id.ino,
        h.size,
        h.offset,
        h.shape.to_vec(),
        h.strides.to_vec(),
        h.dtype.name(),
        h.read_only,
    )
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

fn attr<'py>(h: &Bound<'py, PyAny>, name: &str) -> Result<Bound<'py, PyAny>, Error> {
    h.getattr(name)
        .map_err(|_| invalid(format!("it has no field '{name}'")))
}

fn int_of(name: &str, v: &Bound<'_, PyAny>) -> Result<i128, Error> {
    if !v.is_instance_of::<PyInt>() || v.is_instance_of::<PyBool>() {
        return Err(invalid(format!(
            "field '{name}' must be an int, got {}",
            type_name(v)
        )));
    }
    v.extract::<i128>().map_err(|_| {
        invalid(format!(
            "field '{name}' is {v}, beyond any value rivet accepts"
        ))
    })
}

fn int_field(h: &Bound<'_, PyAny>, name: &str) -> Result<i128, Error> {
    int_of(name, &attr(h, name)?)
}

fn str_field(h: &Bound<'_, PyAny>, name: &str) -> Result<String, Error> {
    let v = attr(h, name)?;
    v.cast::<PyString>()
        .map_err(|_| {
            invalid(format!(
                "field '{name}' must be a str, got {}",
                type_name(&v)
            ))
        })?
        .to_str()
        .map(str::to_owned)
        .map_err(|_| invalid(format!("field '{name}' is not valid text")))
}

fn dims_field(h: &Bound<'_, PyAny>, name: &str) -> Result<Vec<i128>, Error> {
    let v = attr(h, name)?;
    let too_many = |n: usize| {
        invalid(format!(
            "field '{name}' has {n} dims; rivet's limit is {}",
            layout::MAX_NDIM
        ))
    };
    // The length is checked before anything is collected: a hostile tuple may be huge.
    let items: Vec<Bound<'_, PyAny>> = if let Ok(t) = v.cast::<PyTuple>() {
        if t.len() > layout::MAX_NDIM {
            return Err(too_many(t.len()));
        }
        t.iter().collect()
    } else if let Ok(l) = v.cast::<PyList>() {
        if l.len() > layout::MAX_NDIM {
            return Err(too_many(l.len()));
        }
        l.iter().collect()
    } else {
        return Err(invalid(format!(
            "field '{name}' must be a tuple of ints, got {}",
            type_name(&v)
        )));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, d)| int_of(&format!("{name}[{i}]"), d))
        .collect()
}

/// Reads and validates the fields of a Python handle (any object with `Handle`'s attributes).
fn parse(h: &Bound<'_, PyAny>) -> Result<Handle, Error> {
    let (kind, device, dtype) = (
        str_field(h, "kind")?,
        str_field(h, "device")?,
        str_field(h, "dtype")?,
    );
    let (shape, strides) = (dims_field(h, "shape")?, dims_field(h, "strides")?);
    let ro = attr(h, "read_only")?;
    let read_only = ro.cast::<PyBool>().map(|b| b.is_true()).map_err(|_| {
        invalid(format!(
            "field 'read_only' must be a bool, got {}",
            type_name(&ro)
        ))
    })?;
    Handle::parse(&RawHandle {
        kind: &kind,
        device: &device,
        pid: int_field(h, "pid")?,
        fd: int_field(h, "fd")?,
        st_dev: int_field(h, "st_dev")?,
        st_ino: int_field(h, "st_ino")?,
        size: int_field(h, "size")?,
        offset: int_field(h, "offset")?,
        shape: &shape,
        strides: &strides,
        dtype: &dtype,
        read_only,
    })
}

fn tensor_arg(obj: &Bound<'_, PyAny>, what: &str) -> Result<Tensor, Error> {
    convert::try_tensor_in(obj, None)
        .map_err(|e| e.context(&format!("{what}: argument 0 ('tensor'): ")))?
        .ok_or_else(|| {
            Error::Argument(format!(
                "{what}: argument 0 ('tensor') has type {}; expected a rivet.Tensor, a torch tensor or an array with __dlpack__",
                type_name(obj)
            ))
        })
}

/// "rivet.ipc.share: argument 0 ('tensor', a numpy.ndarray): ", the prefix of share's errors.
fn share_ctx(tensor: &Bound<'_, PyAny>) -> String {
    let ty = tensor.get_type();
    let module = ty.module().map(|m| m.to_string()).unwrap_or_default();
    let name = ty.name().map(|n| n.to_string()).unwrap_or_default();
    let full = if module.is_empty() || module == "builtins" {
        name
    } else {
        format!("{module}.{name}")
    };
    format!("rivet.ipc.share: argument 0 ('tensor', a {full}): ")
}

/// `share(tensor, copy)`: the handle's fields and the tensor the handle names (the argument,
/// or its copy in a new segment), which the caller keeps alive until receivers opened it.
#[pyfunction]
pub fn _ipc_share(
    py: Python<'_>,
    tensor: &Bound<'_, PyAny>,
    copy: bool,
) -> PyResult<(Fields, Py<PyTensor>)> {
    let t = tensor_arg(tensor, "rivet.ipc.share").py_err(py)?;
    let (h, keep) = py
        .detach(|| ipc::share(&t, copy))
        .map_err(|e| e.context(&share_ctx(tensor)))
        .py_err(py)?;
    Ok((fields(&h), Py::new(py, PyTensor::new(keep))?))
}

/// The handle of a view of the shared-memory file of `fd` (a torch storage's, which torch
/// keeps open): see `rivet_runtime::ipc::share_fd`; `fd` -1 (an empty storage): `share_empty`.
#[pyfunction]
pub fn _ipc_share_fd(py: Python<'_>, tensor: &Bound<'_, PyAny>, fd: i32) -> PyResult<Fields> {
    let t = tensor_arg(tensor, "rivet.ipc.share").py_err(py)?;
    if fd < 0 {
        // torch gives -1 for an empty storage, which has no file.
        let h = ipc::share_empty(&t)
            .map_err(|e| e.context(&share_ctx(tensor)))
            .py_err(py)?;
        return Ok(fields(&h));
    }
    // SAFETY: the caller passes the fd torch's storage keeps open (rivet/ipc.py holds the
    // storage during the call); a closed one makes fstat fail with EBADF, an error.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let h = py
        .detach(|| ipc::share_fd(&t, fd))
        .map_err(|e| e.context(&share_ctx(tensor)))
        .py_err(py)?;
    Ok(fields(&h))
}

fn check_device(device: Option<&str>) -> Result<(), Error> {
    let Some(d) = device else { return Ok(()) };
    let dev: Device = d
        .parse()
        .map_err(|e: Error| e.context("rivet.ipc.open: argument 'device': "))?;
    if dev != Device::Cpu {
        return Err(Error::Device(format!(
            "rivet.ipc.open: argument 'device' is '{d}' but the handle is of CPU memory; open it on 'cpu' (or leave device=None)"
        )));
    }
    Ok(())
}

/// `open(handle, device)` through `/proc/<pid>/fd/<fd>` (or this process's own mapping).
#[pyfunction]
#[pyo3(signature = (handle, device=None))]
pub fn _ipc_open(
    py: Python<'_>,
    handle: &Bound<'_, PyAny>,
    device: Option<&str>,
) -> PyResult<Py<PyTensor>> {
    check_device(device).py_err(py)?;
    let h = parse(handle).py_err(py)?;
    let t = py.detach(|| ipc::open(&h)).py_err(py)?;
    Py::new(py, PyTensor::new(t))
}

/// `open` with the segment's fd received from the multiprocessing transport. Takes ownership
/// of `fd` (closed here, or kept by the new mapping), whatever happens.
#[pyfunction]
pub fn _ipc_open_fd(py: Python<'_>, fd: i32, handle: &Bound<'_, PyAny>) -> PyResult<Py<PyTensor>> {
    if fd < 0 {
        return Err(Error::Ipc(format!(
            "the received fd is {fd}; expected an open file descriptor"
        )))
        .py_err(py);
    }
    // SAFETY: the caller hands over an fd it owns and will not use again (DupFd.detach()
    // returns a fresh one for exactly this).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let h = parse(handle).py_err(py)?;
    let t = py.detach(|| ipc::open_fd(owned, &h)).py_err(py)?;
    Py::new(py, PyTensor::new(t))
}

/// How many shared-memory segments this process maps (tests, leak checks).
#[pyfunction]
pub fn _ipc_live_segments() -> usize {
    rivet_runtime::shm::live_segments()
}

/// `__reduce__`'s answer: the rebuilding function and (bytes, shape, dtype, read_only).
pub type Reduced = (Py<PyAny>, (Py<PyBytes>, Vec<i64>, &'static str, bool));

/// What `pickle` stores of a `rivet.Tensor` (`Tensor.__reduce__`): its elements by value, as
/// bytes in row-major order. A handle is meaningless on disk; the multiprocessing reducer
/// (rivet/ipc.py) shares instead.
pub fn reduce_by_value(py: Python<'_>, t: &Tensor) -> PyResult<Reduced> {
    if !t.device().is_host() {
        return Err(Error::Device(format!(
            "cannot pickle a tensor on {}: rivet copies only CPU tensors by value; copy it to the CPU first",
            t.device()
        )))
        .py_err(py);
    }
    let c = if t.is_compact() {
        t.clone()
    } else {
        t.copy_compact().py_err(py)?
    };
    let n = c.numel() as usize * c.dtype().size();
    let bytes = if n == 0 {
        PyBytes::new(py, &[])
    } else {
        // SAFETY: `c` is a compact CPU tensor of `n` bytes starting at its data pointer.
        PyBytes::new(py, unsafe { std::slice::from_raw_parts(c.data_ptr(), n) })
    };
    let rebuild = py
        .import("rivet._native")?
        .getattr("_tensor_from_bytes")?
        .unbind();
    Ok((
        rebuild,
        (
            bytes.unbind(),
            t.shape().to_vec(),
            t.dtype().name(),
            t.is_read_only(),
        ),
    ))
}

/// The inverse of `reduce_by_value`: a new compact CPU tensor holding `data`.
#[pyfunction]
pub fn _tensor_from_bytes(
    py: Python<'_>,
    data: &[u8],
    shape: Vec<i64>,
    dtype: &str,
    read_only: bool,
) -> PyResult<Py<PyTensor>> {
    let dtype: DType = dtype.parse().py_err(py)?;
    let t = Tensor::zeros(&shape, dtype).py_err(py)?;
    let n = t.numel() as usize * dtype.size();
    if data.len() != n {
        return Err(Error::Argument(format!(
            "unpickling a rivet.Tensor: {} bytes of data for a {dtype} tensor of shape {shape:?}, which holds {n}",
            data.len()
        )))
        .py_err(py);
    }
    if n > 0 {
        // SAFETY: `t` is a fresh compact tensor of exactly `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), t.data_ptr(), n) };
    }
    Py::new(
        py,
        PyTensor::new(if read_only { t.to_read_only() } else { t }),
    )
}

// ---- CUDA handles (docs/ipc.md "CUDA") ------------------------------------------------------

/// A 64-byte CUDA IPC handle field: `bytes` / `bytearray`, or the same as a hex `str` (the
/// form that survives JSON). Any length comes back; `CudaHandle::parse` checks it is 64.
fn ipc_bytes_of(name: &str, v: &Bound<'_, PyAny>) -> Result<Vec<u8>, Error> {
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = v.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    if let Ok(s) = v.cast::<PyString>() {
        let s = s
            .to_str()
            .map_err(|_| invalid(format!("field '{name}' is not valid text")))?;
        let hex = s.as_bytes();
        // Checked before decoding (a hostile string may be huge): a handle is 2 x 64 digits.
        if hex.len() != 2 * rivet_runtime::ipc_cuda::IPC_HANDLE_SIZE {
            return Err(invalid(format!(
                "field '{name}' is a str of {} characters; a CUDA IPC handle as hex has exactly {}",
                hex.len(),
                2 * rivet_runtime::ipc_cuda::IPC_HANDLE_SIZE
            )));
        }
        return hex
            .chunks(2)
            .map(|p| {
                std::str::from_utf8(p)
                    .ok()
                    .and_then(|p| u8::from_str_radix(p, 16).ok())
                    .ok_or_else(|| invalid(format!("field '{name}' is not hex text")))
            })
            .collect();
    }
    Err(invalid(format!(
        "field '{name}' must be bytes (or hex str) of a CUDA IPC handle, got {}",
        type_name(v)
    )))
}

/// Reads and validates a Python `CudaHandle`'s fields (no GPU needed).
fn parse_cuda(h: &Bound<'_, PyAny>) -> Result<CudaHandle, Error> {
    let (kind, dtype) = (str_field(h, "kind")?, str_field(h, "dtype")?);
    let (shape, strides) = (dims_field(h, "shape")?, dims_field(h, "strides")?);
    let mem = ipc_bytes_of("mem_handle", &attr(h, "mem_handle")?)?;
    let ev = attr(h, "event_handle")?;
    let ev = if ev.is_none() {
        None
    } else {
        Some(ipc_bytes_of("event_handle", &ev)?)
    };
    CudaHandle::parse(&CudaRawHandle {
        kind: &kind,
        pid: int_field(h, "pid")?,
        device: int_field(h, "device")?,
        mem_handle: &mem,
        alloc_size: int_field(h, "alloc_size")?,
        offset: int_field(h, "offset")?,
        shape: &shape,
        strides: &strides,
        dtype: &dtype,
        event_handle: ev.as_deref(),
    })
}

/// `open(cuda_handle, device)`: validates the handle and the `device` argument (the target
/// ordinal: None is the handle's), then needs a CUDA driver and both devices present, each a
/// `DeviceError` saying which is missing; then maps it (`rivet_compiler::codegen::cuda::ipc`:
/// a per-process cache, the sender's event waited on `stream`). Not yet run on a GPU.
#[pyfunction]
#[pyo3(signature = (handle, device=None, stream=0))]
pub fn _ipc_open_cuda(
    py: Python<'_>,
    handle: &Bound<'_, PyAny>,
    device: Option<&str>,
    stream: u64,
) -> PyResult<Py<PyTensor>> {
    let h = parse_cuda(handle).py_err(py)?;
    let target = match device {
        None => h.device,
        Some(d) => match d
            .parse::<Device>()
            .map_err(|e: Error| e.context("rivet.ipc.open: argument 'device': "))
            .py_err(py)?
        {
            Device::Cuda(n) => n,
            _ => {
                return Err(Error::Device(format!(
                    "rivet.ipc.open: argument 'device' is '{d}' but the handle is of CUDA memory (device {}); open it on a CUDA device such as 'cuda:{}' (or leave device=None)",
                    h.device, h.device
                )))
                .py_err(py)
            }
        },
    };
    let n = rivet_compiler::codegen::cuda::driver::device_count()
        .map_err(Error::from)
        .map_err(|e| e.context("rivet.ipc.open: cannot open a CUDA handle: "))
        .py_err(py)?;
    for (what, d) in [
        ("the handle's 'device'", h.device),
        ("argument 'device'", target),
    ] {
        if d as usize >= n {
            return Err(Error::Device(format!(
                "rivet.ipc.open: {what} is CUDA device {d} but this process sees {n} CUDA device(s)"
            )))
            .py_err(py);
        }
    }
    let t = py
        .detach(|| rivet_compiler::codegen::cuda::ipc::open(&h, target as usize, stream))
        .map_err(Error::from)
        .map_err(|e| e.context("rivet.ipc.open: "))
        .py_err(py)?;
    // The open ordered `stream` after the sender's work: later consumers wait for it.
    let ready = rivet_compiler::codegen::cuda::driver::record(target as usize, stream)
        .map_err(Error::from)
        .map_err(|e| e.context("rivet.ipc.open: "))
        .py_err(py)?;
    Py::new(py, PyTensor::with_event(t, Some(ready)))
}

/// (mem_handle, alloc_size, offset, event_handle or None): `_ipc_share_cuda`'s result.
type CudaShared<'py> = (Bound<'py, PyBytes>, u64, u64, Option<Bound<'py, PyBytes>>);

/// `share` of CUDA memory at `ptr` on device `ordinal` (a torch CUDA tensor's `data_ptr()`):
/// (mem_handle, alloc_size, offset, event_handle or None); with `stream`, an interprocess event
/// is recorded on it after the work queued so far.
#[pyfunction]
#[pyo3(signature = (ptr, ordinal, stream=None))]
pub fn _ipc_share_cuda<'py>(
    py: Python<'py>,
    ptr: u64,
    ordinal: usize,
    stream: Option<u64>,
) -> PyResult<CudaShared<'py>> {
    let s = py
        .detach(|| rivet_compiler::codegen::cuda::ipc::share(ordinal, ptr, stream))
        .map_err(Error::from)
        .map_err(|e| e.context("rivet.ipc.share: "))
        .py_err(py)?;
    Ok((
        PyBytes::new(py, &s.mem_handle),
        s.alloc_size,
        s.offset,
        s.event_handle.map(|e| PyBytes::new(py, &e)),
    ))
}
