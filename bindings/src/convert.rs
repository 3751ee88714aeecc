//! Python object <-> `Value`.
//!
//! Tensor import order (first match wins): a `rivet.Tensor`; a type offering
//! `__dlpack_c_exchange_api__` (torch >= 2.11: no Python call, no capsule); a raw capsule;
//! `__dlpack__(max_version=(1, 0))`, then `__dlpack__()` for producers that reject the
//! keyword; `__cuda_array_interface__` (v2 / v3). Inside a function call, CUDA producers
//! are ordered with the call's stream (`cuda::CallStreams`): `__dlpack__` gets
//! `stream=` (after a `__dlpack_device__()` query, skipped for numpy, which is CPU-only). What we learn about a type (its exchange API, whether it is a JAX array, which
//! must be read-only) is cached per type, per thread, so the hot path is a pointer compare.
//!
//! Invariants: the type cache holds at most `TYPE_CACHE_CAP` entries per thread (programs
//! that make classes dynamically must not grow it, nor keep their classes alive, without
//! bound); an exception that is not an `Exception` (KeyboardInterrupt, SystemExit) raised by
//! a producer propagates unchanged; a torch tensor that requires grad is refused, as torch's
//! own `__dlpack__` refuses it (the exchange fast path skips that check, so we make it).

use crate::capsule;
use crate::cuda::{self, CallStreams};
use crate::errors::{from_pyerr, IntoPyResult};
use crate::function::PyFunction;
use crate::tensor::PyTensor;
use dlpack_rs::ffi::{DLManagedTensorVersioned, DLPackExchangeAPI, DLTensor};
use pyo3::exceptions::PyException;
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyString, PyTuple, PyType};
use rivet_compiler::codegen::cuda::driver::Event;
use rivet_runtime::{dlpack, ArgName, Error, Function, Result, Tensor, Value};
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

/// How `requires_grad` is read without the generic attribute lookup: the getset's C getter
/// and its closure; under the limited API (abi3), which hides the descriptor's layout, the
/// descriptor type's `tp_descr_get` and the descriptor (a reference kept for the process).
#[cfg(not(feature = "abi3"))]
type GradGetter = (ffi::getter, usize);
#[cfg(feature = "abi3")]
type GradGetter = (ffi::descrgetfunc, usize);

/// What we know about one Python type.
#[derive(Clone, Copy)]
struct TypeInfo {
    ptr: usize,
    api: Option<&'static DLPackExchangeAPI>,
    read_only: bool,
    has_dlpack: bool,
    /// An exchange-API type with a `requires_grad` attribute (torch.Tensor and subclasses):
    /// checked on every import through the fast path.
    grad: bool,
    /// `requires_grad`'s C getter and its closure, when reading the attribute is exactly
    /// calling it (`grad_getter`): a third of the generic lookup's cost.
    grad_getter: Option<GradGetter>,
    /// Has `__dlpack_device__` and may live on a GPU (not numpy): asked before `__dlpack__`
    /// inside a call, so a CUDA producer gets the call's stream.
    may_be_gpu: bool,
    /// Has `__cuda_array_interface__` (used when there is no `__dlpack__`).
    has_cai: bool,
}

/// `("max_version",)` and `(1, 0)`, built once for the vectorcall below.
static DLPACK_KW: PyOnceLock<(Py<PyTuple>, Py<PyTuple>)> = PyOnceLock::new();

/// `obj.__dlpack__(max_version=(1, 0))` by vectorcall with keyword names: no kwargs dict is
/// built or unpacked (that halves the cost of numpy's export).
fn dlpack_call_versioned<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let (names, version) = DLPACK_KW.get_or_try_init(py, || {
        PyResult::Ok((
            PyTuple::new(py, ["max_version"])?.unbind(),
            PyTuple::new(py, [1, 0])?.unbind(),
        ))
    })?;
    let method = pyo3::intern!(py, "__dlpack__");
    #[cfg(feature = "abi3")]
    {
        // The limited API has no vectorcall before 3.12: a keyword dict, made once (callees
        // get their own copy of keyword arguments, so sharing it is safe).
        let _ = names;
        static KW: PyOnceLock<Py<pyo3::types::PyDict>> = PyOnceLock::new();
        let kw = KW.get_or_try_init(py, || {
            let kw = pyo3::types::PyDict::new(py);
            kw.set_item("max_version", version.bind(py))?;
            PyResult::Ok(kw.unbind())
        })?;
        obj.call_method(method, (), Some(kw.bind(py)))
    }
    #[cfg(not(feature = "abi3"))]
    {
        let args = [obj.as_ptr(), version.as_ptr()];
        // SAFETY: args holds the receiver then one keyword value, as vectorcall's method form
        // wants (nargsf = 1 positional: the receiver); all objects are alive during the call.
        let r = unsafe {
            ffi::PyObject_VectorcallMethod(method.as_ptr(), args.as_ptr(), 1, names.as_ptr())
        };
        if r.is_null() {
            return Err(PyErr::fetch(py));
        }
        // SAFETY: a new reference.
        Ok(unsafe { Bound::from_owned_ptr(py, r) })
    }
}

/// Entries per thread in the type cache: far more tensor types than any program mixes, few
/// enough that a linear scan (the hot path's pointer compare) stays a few nanoseconds.
pub const TYPE_CACHE_CAP: usize = 64;

/// A bounded per-thread cache of type probes. When full, new types replace old ones in turn
/// (FIFO), so a program creating classes without end re-probes them but never grows the
/// cache, and evicted classes can be collected.
struct TypeCache {
    /// Each entry holds its type alive, so the pointer key cannot be reused by another type.
    entries: Vec<(TypeInfo, Py<PyType>)>,
    /// The slot the next insertion replaces once the cache is full.
    next: usize,
}

impl TypeCache {
    fn get(&self, ptr: usize) -> Option<TypeInfo> {
        self.entries.iter().find(|t| t.0.ptr == ptr).map(|t| t.0)
    }

    /// Inserts a probed type; returns the evicted one, which the caller must drop only
    /// after releasing the cache (dropping a class can run Python code that imports again).
    fn insert(&mut self, info: TypeInfo, ty: Py<PyType>) -> Option<Py<PyType>> {
        if self.entries.len() < TYPE_CACHE_CAP {
            self.entries.push((info, ty));
            return None;
        }
        let old = std::mem::replace(&mut self.entries[self.next], (info, ty));
        self.next = (self.next + 1) % TYPE_CACHE_CAP;
        Some(old.1)
    }
}

thread_local! {
    static TYPES: RefCell<TypeCache> = const {
        RefCell::new(TypeCache { entries: Vec::new(), next: 0 })
    };
}

fn type_info(obj: &Bound<'_, PyAny>) -> TypeInfo {
    type_info_of(&obj.get_type())
}

/// Looks a type up in the per-thread cache, probing it on a miss.
fn type_info_of(ty: &Bound<'_, PyType>) -> TypeInfo {
    let ptr = ty.as_ptr() as usize;
    if let Some(hit) = TYPES.with(|c| c.borrow().get(ptr)) {
        return hit;
    }
    let api = ty
        .getattr(pyo3::intern!(ty.py(), "__dlpack_c_exchange_api__"))
        .ok()
        .and_then(|cap| {
            if !capsule::is_capsule(&cap) {
                return None;
            }
            // SAFETY: a capsule named "dlpack_exchange_api" holds a DLPackExchangeAPI that the
            // producer keeps alive for the whole process (DLPack's contract).
            let p =
                unsafe { ffi::PyCapsule_GetPointer(cap.as_ptr(), c"dlpack_exchange_api".as_ptr()) };
            if p.is_null() {
                // SAFETY: clear the error GetPointer set on a name mismatch.
                unsafe { ffi::PyErr_Clear() };
                return None;
            }
            // SAFETY: see above.
            let api: &'static DLPackExchangeAPI = unsafe { &*(p as *const DLPackExchangeAPI) };
            let usable = api.header.version.major == dlpack::VERSION.major
                && api.managed_tensor_from_py_object_no_sync.is_some();
            usable.then_some(api)
        });
    let module: String = ty.module().map(|m| m.to_string()).unwrap_or_default();
    // JAX arrays are immutable but export legacy capsules without a read-only flag.
    let read_only = module == "jax" || module.starts_with("jax.") || module.starts_with("jaxlib");
    let grad = api.is_some()
        && ty
            .hasattr(pyo3::intern!(ty.py(), "requires_grad"))
            .unwrap_or(false);
    let grad_getter = if grad { grad_getter(ty) } else { None };
    let has_dlpack = ty
        .hasattr(pyo3::intern!(ty.py(), "__dlpack__"))
        .unwrap_or(false);
    let may_be_gpu = module != "numpy"
        && ty
            .hasattr(pyo3::intern!(ty.py(), "__dlpack_device__"))
            .unwrap_or(false);
    let has_cai = ty
        .hasattr(pyo3::intern!(ty.py(), "__cuda_array_interface__"))
        .unwrap_or(false);
    let info = TypeInfo {
        ptr,
        api,
        read_only,
        has_dlpack,
        grad,
        grad_getter,
        may_be_gpu,
        has_cai,
    };
    let evicted = TYPES.with(|c| c.borrow_mut().insert(info, ty.clone().unbind()));
    drop(evicted); // outside the borrow, under the GIL
    info
}

/// The C getter behind `ty`'s `requires_grad` when `obj.requires_grad` is exactly a call of
/// it: the type uses the generic attribute lookup, and the first class of its MRO defining
/// the name holds a getset descriptor (a data descriptor, so no instance `__dict__` can
/// shadow it). torch.Tensor: `TensorBase`'s getter. Anything else (a property, an override of
/// `__getattribute__`, a metaclass trick) keeps the generic `getattr`. The getter and its
/// closure come from the descriptor's `PyGetSetDef`, static data of the extension defining
/// it; the cache entry also holds the type alive.
fn grad_getter(ty: &Bound<'_, PyType>) -> Option<GradGetter> {
    let py = ty.py();
    #[cfg(not(feature = "abi3"))]
    // SAFETY: reading a field of a live type object, under the GIL.
    let getattro = unsafe { (*ty.as_type_ptr()).tp_getattro };
    #[cfg(feature = "abi3")]
    // SAFETY: a live type object (every type, static ones too, since 3.10); a slot the type
    // lacks reads as NULL.
    let getattro: Option<ffi::getattrofunc> = unsafe {
        let p = ffi::PyType_GetSlot(ty.as_type_ptr(), ffi::Py_tp_getattro);
        (!p.is_null()).then(|| std::mem::transmute::<*mut c_void, ffi::getattrofunc>(p))
    };
    // libpython's exported function: one address, whoever reads it.
    let generic = ffi::PyObject_GenericGetAttr as ffi::getattrofunc as usize;
    if !matches!(getattro, Some(f) if f as usize == generic) {
        return None;
    }
    let name = pyo3::intern!(py, "requires_grad");
    let mro = ty.getattr(pyo3::intern!(py, "__mro__")).ok()?;
    for cls in mro.try_iter().ok()? {
        let dict = cls.ok()?.getattr(pyo3::intern!(py, "__dict__")).ok()?;
        let Ok(d) = dict.get_item(name) else {
            continue;
        };
        // The address of CPython's getset descriptor type, compared only.
        if d.get_type().as_ptr() != std::ptr::addr_of_mut!(ffi::PyGetSetDescr_Type).cast() {
            return None;
        }
        #[cfg(not(feature = "abi3"))]
        {
            // SAFETY: `d` is a getset descriptor (checked above), whose layout is
            // `PyGetSetDescrObject`; its `d_getset` points at the defining type's static table.
            let def = unsafe { &*(*(d.as_ptr() as *const ffi::PyGetSetDescrObject)).d_getset };
            return def.get.map(|g| (g, def.closure as usize));
        }
        #[cfg(feature = "abi3")]
        {
            // SAFETY: the getset descriptor type's own slot (a static type, 3.10+).
            let get = unsafe {
                ffi::PyType_GetSlot(
                    std::ptr::addr_of_mut!(ffi::PyGetSetDescr_Type),
                    ffi::Py_tp_descr_get,
                )
            };
            if get.is_null() {
                return None;
            }
            // SAFETY: the slot `Py_tp_descr_get` holds a `descrgetfunc`.
            let get = unsafe { std::mem::transmute::<*mut c_void, ffi::descrgetfunc>(get) };
            // The descriptor is kept alive for the process: its class may drop it.
            return Some((get, d.unbind().into_ptr() as usize));
        }
    }
    None
}

/// Refuses a torch tensor with `requires_grad=True`, as torch's `__dlpack__` does: rivet
/// functions are not differentiable, and writing such a tensor would corrupt autograd.
/// Only the exchange fast path needs this; torch's own export checks the generic path.
fn check_no_grad(obj: &Bound<'_, PyAny>, getter: Option<GradGetter>) -> Result<()> {
    let py = obj.py();
    let grad = match getter {
        Some((get, closure)) => {
            // SAFETY: `obj`'s type is the one `grad_getter` read the getter from (the type
            // cache is keyed by it); a getter returns a new reference or NULL with an error.
            #[cfg(not(feature = "abi3"))]
            let r = unsafe { get(obj.as_ptr(), closure as *mut c_void) };
            // SAFETY: as above; `closure` is the descriptor, kept alive by `grad_getter`.
            #[cfg(feature = "abi3")]
            let r = unsafe {
                get(
                    closure as *mut ffi::PyObject,
                    obj.as_ptr(),
                    obj.get_type().as_ptr(),
                )
            };
            if r.is_null() {
                return Err(producer_error(obj, PyErr::take(py)));
            }
            // SAFETY: a new reference.
            unsafe { Bound::from_owned_ptr(py, r) }
        }
        None => obj
            .getattr(pyo3::intern!(py, "requires_grad"))
            .map_err(|e| producer_error(obj, Some(e)))?,
    };
    let on = if grad.is(PyBool::new(py, false)) {
        false
    } else {
        grad.is_truthy().map_err(|e| producer_error(obj, Some(e)))?
    };
    if on {
        return Err(Error::DLPack(format!(
            "{} requires grad (requires_grad=True); rivet functions are not differentiable and torch does not export such tensors through DLPack: pass tensor.detach() instead",
            type_name(obj)
        )));
    }
    Ok(())
}

/// Imports any tensor-like object (rivet tensor, exchange-API type, capsule, `__dlpack__`,
/// `__cuda_array_interface__`). Returns `Ok(None)` when the object is not tensor-like at all.
/// `sync`: the streams of the call (or `from_dlpack`) the tensor is for; `None` for values
/// outside one (a callback's return value), whose CUDA producers are not asked for a stream.
pub fn try_tensor_in(
    obj: &Bound<'_, PyAny>,
    sync: Option<&mut CallStreams>,
) -> Result<Option<Tensor>> {
    // SAFETY: `borrow` is None: views reference their producers.
    unsafe { import(obj, sync, None) }
}

/// `try_tensor_in`; with `borrow` (the call's spare view allocations), a view read through the
/// exchange API borrows `obj` (`keepalive::PyBorrow`) instead of referencing it, in a spare
/// allocation when there is one.
///
/// # Safety
/// With `borrow`, the result must go into a call's `keepalive::CallArgs` (the contract of
/// `PyBorrow::new`).
unsafe fn import(
    obj: &Bound<'_, PyAny>,
    mut sync: Option<&mut CallStreams>,
    borrow: Option<&mut crate::keepalive::Spares>,
) -> Result<Option<Tensor>> {
    // Exact: `rivet.Tensor` cannot be subclassed, and a failed `cast` walks the MRO of
    // every foreign tensor (a torch.Tensor's is three classes long).
    if let Ok(t) = obj.cast_exact::<PyTensor>() {
        let t = t.get();
        if let (Some(s), rivet_runtime::Device::Cuda(o)) = (sync.as_deref_mut(), t.tensor.device())
        {
            match t.ready() {
                Some(ev) => s.wait_for(o as usize, ev),
                None => {
                    // Nothing pending: the tensor still decides the call's device.
                    s.note_device(o as usize);
                }
            }
        }
        return Ok(Some(t.tensor.clone()));
    }
    if capsule::is_capsule(obj) {
        return capsule::consume(obj, false).map(Some);
    }
    let info = type_info(obj);
    if let Some(api) = info.api {
        if info.grad {
            check_no_grad(obj, info.grad_getter)?;
        }
        if let Some(from_py) = api.dltensor_from_py_object_no_sync {
            // Borrowed DLTensor: no allocation on the producer's side. Its data stays valid
            // while the Python object lives, so the view's owner is a reference to it, or
            // for a call's argument a borrow of it (`keepalive.rs`).
            let mut dl = std::mem::MaybeUninit::<DLTensor>::zeroed();
            // SAFETY: obj has the type the API was read from; the GIL is held.
            let rc = unsafe { from_py(obj.as_ptr() as *mut c_void, dl.as_mut_ptr()) };
            if rc != 0 {
                return Err(producer_error(obj, PyErr::take(obj.py())));
            }
            // SAFETY: the call succeeded, so `dl` is filled.
            let dl = unsafe { dl.assume_init_ref() };
            // `dl`'s data lives as long as `obj`, which the view's owner keeps alive; shape and
            // strides are copied before we return.
            let t = if let Some(spares) = borrow {
                // SAFETY: this function's contract: the view goes into a call's `CallArgs`,
                // which references `obj` if the view outlives the call.
                let owner = unsafe { crate::keepalive::PyBorrow::new(obj) };
                // SAFETY: `obj` lives for the call, and after it while the view does (above).
                unsafe { dlpack::view_in(spares.take_one(), dl, owner, info.read_only) }
            } else {
                let owner = crate::keepalive::PyKeepalive::new(obj.clone().unbind());
                // SAFETY: `owner` holds a reference to `obj`.
                unsafe { dlpack::view_of(dl, owner, info.read_only) }
            }?;
            join_work_stream(obj, api, &t, sync)?;
            return Ok(Some(t));
        }
        let f = api
            .managed_tensor_from_py_object_no_sync
            .expect("checked in type_info");
        let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
        // SAFETY: obj has the type the API was read from; the GIL is held.
        let rc = unsafe { f(obj.as_ptr() as *mut c_void, &mut out) };
        if rc != 0 || out.is_null() {
            return Err(producer_error(obj, PyErr::take(obj.py())));
        }
        // SAFETY: `out` is a fresh owning managed tensor.
        let t = unsafe { dlpack::import_versioned(out) }?;
        join_work_stream(obj, api, &t, sync)?;
        return Ok(Some(if info.read_only { t.to_read_only() } else { t }));
    }
    if !info.has_dlpack {
        if info.has_cai {
            return cuda::import_cai(obj, sync).map(Some);
        }
        return Ok(None);
    }
    let py = obj.py();
    let method = pyo3::intern!(py, "__dlpack__");
    // Inside a call, a producer on a CUDA device is asked for its data on the call's stream.
    let stream = match sync {
        Some(s) if info.may_be_gpu => {
            let dev: (i64, i64) = obj
                .call_method0(pyo3::intern!(py, "__dlpack_device__"))
                .and_then(|d| d.extract())
                .map_err(|e| producer_error(obj, Some(e)))?;
            (dev.0 == dlpack_rs::ffi::DLDeviceType::kDLCUDA as i64 && dev.1 >= 0)
                .then(|| s.for_producer(dev.1 as usize))
        }
        _ => None,
    };
    let cap = match stream {
        Some(st) => {
            let kw = pyo3::types::PyDict::new(py);
            let with_version = kw
                .set_item("stream", st)
                .and_then(|()| kw.set_item("max_version", (1, 0)))
                .and_then(|()| obj.call_method(method, (), Some(&kw)));
            match with_version {
                Ok(c) => c,
                Err(e) if e.is_instance_of::<PyTypeError>(py) => {
                    let kw = pyo3::types::PyDict::new(py);
                    kw.set_item("stream", st)
                        .and_then(|()| obj.call_method(method, (), Some(&kw)))
                        .map_err(|e| producer_error(obj, Some(e)))?
                }
                Err(e) => return Err(producer_error(obj, Some(e))),
            }
        }
        None => match dlpack_call_versioned(obj) {
            Ok(c) => c,
            // Producers predating DLPack 1.0 do not take `max_version`.
            Err(e) if e.is_instance_of::<PyTypeError>(py) => obj
                .call_method0(method)
                .map_err(|e| producer_error(obj, Some(e)))?,
            Err(e) => return Err(producer_error(obj, Some(e))),
        },
    };
    if !capsule::is_capsule(&cap) {
        return Err(Error::DLPack(format!(
            "{}.__dlpack__() returned a {}, not a DLPack capsule",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default(),
            cap.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )));
    }
    capsule::consume(&cap, info.read_only).map(Some)
}

/// A CUDA tensor imported through the exchange API (which does no synchronisation): the
/// call joins the producer's current work stream (`current_work_stream`), per the DLPack
/// guidance for kernel libraries: with no explicit stream, the call runs on it.
fn join_work_stream(
    obj: &Bound<'_, PyAny>,
    api: &DLPackExchangeAPI,
    t: &Tensor,
    sync: Option<&mut CallStreams>,
) -> Result<()> {
    let (Some(sync), rivet_runtime::Device::Cuda(o), Some(cws)) =
        (sync, t.device(), api.current_work_stream)
    else {
        return Ok(());
    };
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: the producer's function, called with the GIL held as the API requires.
    let rc = unsafe { cws(dlpack_rs::ffi::DLDeviceType::kDLCUDA, o, &mut out) };
    if rc != 0 {
        return Err(producer_error(obj, PyErr::take(obj.py())));
    }
    sync.join(o as usize, out as u64, true)
}

/// A producer that failed to export: a DLPack error quoting the first line of its message
/// (torch appends a C++ stack dump to the rest). An exception that is not an `Exception`
/// (KeyboardInterrupt, SystemExit, GeneratorExit) is not a failure to export but a request
/// to stop: it travels back unchanged.
fn producer_error(obj: &Bound<'_, PyAny>, err: Option<PyErr>) -> Error {
    let py = obj.py();
    if let Some(e) = &err {
        if !e.is_instance_of::<PyException>(py) {
            return from_pyerr(py, err.expect("checked"));
        }
    }
    let why = err
        .map(|e| {
            let ty = e
                .get_type(py)
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default();
            format!("{ty}: {}", e.value(py))
        })
        .unwrap_or_else(|| "it reported failure without a message".into());
    let first = why.lines().next().unwrap_or_default();
    Error::DLPack(format!(
        "the producer ({}) could not export it through DLPack: {first}",
        type_name(obj)
    ))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Converts one call argument. `func` and `arg` word the error.
pub fn to_value(obj: &Bound<'_, PyAny>, func: &str, arg: ArgName<'_>) -> Result<Value> {
    to_value_in(obj, func, arg, None)
}

/// `to_value` for an argument of a call whose streams `sync` tracks.
pub fn to_value_in(
    obj: &Bound<'_, PyAny>,
    func: &str,
    arg: ArgName<'_>,
    sync: Option<&mut CallStreams>,
) -> Result<Value> {
    // SAFETY: `borrow` is false.
    unsafe { convert_value(obj, func, arg, sync, None) }
}

/// `to_value_in` for an argument of a `Function` call, whose tensor view may borrow `obj`
/// (`keepalive.rs`).
///
/// # Safety
/// The result must go into the call's `keepalive::CallArgs` (`PyBorrow::new`'s contract).
pub unsafe fn call_arg(
    obj: &Bound<'_, PyAny>,
    func: &str,
    arg: ArgName<'_>,
    sync: &mut CallStreams,
    spares: &mut crate::keepalive::Spares,
) -> Result<Value> {
    // SAFETY: forwarded.
    unsafe { convert_value(obj, func, arg, Some(sync), Some(spares)) }
}

/// # Safety
/// With `borrow`, the contract of `call_arg`.
unsafe fn convert_value(
    obj: &Bound<'_, PyAny>,
    func: &str,
    arg: ArgName<'_>,
    sync: Option<&mut CallStreams>,
    borrow: Option<&mut crate::keepalive::Spares>,
) -> Result<Value> {
    // Exact checks first: the cheapest tests for the commonest scalars.
    if obj.is_exact_instance_of::<PyFloat>() {
        return Ok(Value::Float(
            obj.cast::<PyFloat>().expect("checked").value(),
        ));
    }
    if obj.is_exact_instance_of::<PyBool>() {
        return Ok(Value::Bool(obj.is_truthy().unwrap_or(false)));
    }
    if obj.is_instance_of::<PyInt>() {
        return obj.extract::<i64>().map(Value::Int).map_err(|_| {
            Error::Argument(format!(
                "{func}: {arg} is an int that does not fit in 64 bits"
            ))
        });
    }
    // SAFETY: forwarded from this function's contract.
    let t = unsafe { import(obj, sync, borrow) };
    if let Some(t) = t.map_err(|e| e.context(&format!("{func}: {arg}: ")))? {
        return Ok(Value::Tensor(t));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(Value::Float(obj.extract::<f64>().unwrap_or(f64::NAN)));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Str(s.to_string_lossy().as_ref().into()));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Value::Bytes(b.as_bytes().into()));
    }
    if let Ok(f) = obj.cast::<PyFunction>() {
        return Ok(Value::Function(f.get().func.clone()));
    }
    if obj.is_callable() {
        return Ok(Value::Function(wrap_callable(obj.clone().unbind(), None)));
    }
    Err(Error::Argument(format!(
        "{func}: {arg} has type {}; expected a tensor (rivet.Tensor, an object with __dlpack__ or a DLPack capsule), int, float, bool, str, bytes, None or a callable",
        type_name(obj)
    )))
}

/// Wraps a Python callable as a packed function. Its exceptions travel back unchanged. The
/// callable is the function's parts (a `gc::PyCallable`), so the rivet objects that come to
/// hold the function can report it to Python's garbage collector (`gc.rs`).
pub fn wrap_callable(f: Py<PyAny>, name: Option<String>) -> Function {
    let name = name.unwrap_or_else(|| {
        Python::attach(|py| {
            f.bind(py)
                .getattr("__qualname__")
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "<python callable>".into())
        })
    });
    let fname = name.clone();
    let cell = crate::gc::PyCallable::new(f);
    let parts: std::sync::Arc<dyn std::any::Any + Send + Sync> = cell.clone();
    Function::new(name, move |args| {
        Python::attach(|py| {
            // Released only when the collector cleared every holder of this function, after
            // which nothing can call it: reaching this is a rivet bug.
            let f = cell.get(py).ok_or_else(|| {
                rivet_runtime::Error::Internal(format!(
                    "the Python callable '{fname}' was released by the garbage collector while still reachable"
                ))
            })?;
            let items = args
                .iter()
                .map(|a| from_value(py, a))
                .collect::<PyResult<Vec<_>>>()
                .map_err(|e| from_pyerr(py, e))?;
            let tuple = PyTuple::new(py, items).map_err(|e| from_pyerr(py, e))?;
            let r = f.bind(py).call1(tuple).map_err(|e| from_pyerr(py, e))?;
            to_value(
                &r,
                &fname,
                ArgName {
                    index: 0,
                    name: Some("return value"),
                },
            )
        })
    })
    // The body holds one handle of the cell besides the parts' own.
    .with_parts(parts, 1)
}

/// Converts a result back to Python.
pub fn from_value(py: Python<'_>, v: &Value) -> PyResult<Py<PyAny>> {
    from_value_on(py, v, None)
}

/// Converts a call's result back to Python; CUDA tensors carry `ready`, the call's completion
/// event (their exports make consumers wait for it).
pub fn from_value_on(py: Python<'_>, v: &Value, ready: Option<&Arc<Event>>) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Null => py.None(),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
        Value::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
        Value::Float(x) => PyFloat::new(py, *x).into_any().unbind(),
        Value::Str(s) => PyString::new(py, s).into_any().unbind(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any().unbind(),
        Value::DType(d) => PyString::new(py, d.name()).into_any().unbind(),
        Value::Device(d) => PyString::new(py, &d.to_string()).into_any().unbind(),
        Value::Tensor(t) => {
            Py::new(py, PyTensor::with_event(t.clone(), ready.cloned()))?.into_any()
        }
        Value::Function(f) => Py::new(py, PyFunction::new(f.clone()))?.into_any(),
        Value::List(items) => {
            let objs = items
                .iter()
                .map(|v| from_value_on(py, v, ready))
                .collect::<PyResult<Vec<_>>>()?;
            PyTuple::new(py, objs)?.into_any().unbind()
        }
    })
}

/// A tensor result as the type of `framework` (e.g. torch.Tensor): through the type's
/// exchange API when it has one, else `from_dlpack(rivet_tensor)`.
///
/// CUDA results: the exchange API does no synchronisation, so the framework's current stream
/// is made to wait for the call's completion event `ready`; `from_dlpack` consumers pass
/// their stream to `__dlpack__`, which does the same.
pub fn tensor_as(
    py: Python<'_>,
    t: &Tensor,
    ty: &Bound<'_, PyType>,
    from_dlpack: &Bound<'_, PyAny>,
    ready: Option<&Arc<Event>>,
) -> PyResult<Py<PyAny>> {
    if let Some(api) = type_info_of(ty).api {
        if let Some(to_py) = api.managed_tensor_to_py_object_no_sync {
            if let (rivet_runtime::Device::Cuda(o), Some(ev), Some(cws)) =
                (t.device(), ready, api.current_work_stream)
            {
                let mut out: *mut c_void = std::ptr::null_mut();
                // SAFETY: the framework's function, called with the GIL held.
                let rc = unsafe { cws(dlpack_rs::ffi::DLDeviceType::kDLCUDA, o, &mut out) };
                if rc != 0 {
                    return Err(PyErr::take(py).unwrap_or_else(|| {
                        PyTypeError::new_err("DLPack exchange: current_work_stream failed")
                    }));
                }
                debug_assert_eq!(ev.ordinal(), o as usize);
                // `out` is the framework's current stream (live).
                ev.wait_on(out as u64)
                    .map_err(rivet_runtime::Error::from)
                    .py_err(py)?;
            }
            let m = dlpack::export_versioned(t);
            let mut out: *mut c_void = std::ptr::null_mut();
            // SAFETY: `m` is a fresh export whose ownership the call takes (also on failure,
            // per the DLPack exchange API); the GIL is held.
            let rc = unsafe { to_py(m, &mut out) };
            if rc != 0 || out.is_null() {
                return Err(PyErr::take(py)
                    .unwrap_or_else(|| PyTypeError::new_err("DLPack exchange export failed")));
            }
            // SAFETY: out is a new reference.
            return Ok(unsafe { Bound::from_owned_ptr(py, out as *mut ffi::PyObject) }.unbind());
        }
    }
    let rt = Py::new(py, PyTensor::with_event(t.clone(), ready.cloned()))?;
    from_dlpack.call1((rt,)).map(|o| o.unbind())
}
