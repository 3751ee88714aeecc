//! CUDA in the Python layer: stream arguments as Python spells them, the stream bookkeeping
//! of one call, and `__cuda_array_interface__` imports. The driver work itself is in
//! `rivet_compiler::codegen::cuda::driver` (no panic, a `DeviceError` without a driver).
//!
//! The stream of a call (docs/cuda.md, "CUDA: streams and memory"): an explicit `stream=` wins; otherwise the first
//! CUDA argument that can say which stream its producer works on picks it (torch's
//! `current_work_stream` through the exchange API, a rivet tensor's stream, a v3
//! `__cuda_array_interface__` stream), so a call on torch tensors runs on torch's current
//! stream and needs no synchronisation; otherwise the legacy default stream. Producers
//! imported through `__dlpack__` get the call's stream as `stream=` (they order their own
//! work before it); producers working on another stream are ordered by an event (the call's
//! stream waits for theirs, and after the call theirs waits for the call's, so their later
//! work sees what rivet wrote). rivet's own tensors name no stream: they carry the completion
//! event of the work that made them, which the call's stream waits for ([`CallStreams::begin`]).
//! A call on CUDA tensors records a completion event on its stream at its end (also when no
//! argument named a stream and it ran on the legacy default stream), which its results carry.
//! Nothing synchronises the device.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt};
use rivet_compiler::codegen::cuda::driver::{self, Event};
use rivet_runtime::{cuda_array_interface, stream, Error, Result, Tensor};
use smallvec::SmallVec;
use std::sync::Arc;

/// A stream argument: None, an int handle (>= 0; 1 and 2 are the legacy and per-thread
/// default streams), or an object with `.cuda_stream` (torch.cuda.Stream) or `.ptr`
/// (cupy.cuda.Stream). `what` names the argument in errors.
pub fn parse_stream(obj: Option<&Bound<'_, PyAny>>, what: &str) -> Result<Option<u64>> {
    let Some(obj) = obj else { return Ok(None) };
    if obj.is_none() {
        return Ok(None);
    }
    let handle = if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
        obj.clone()
    } else {
        let attr = |name: &str| {
            obj.getattr(name)
                .ok()
                .filter(|v| v.is_instance_of::<PyInt>())
        };
        match attr("cuda_stream").or_else(|| attr("ptr")) {
            Some(v) => v,
            None => {
                return Err(Error::Argument(format!(
                    "{what} must be None, an int stream handle, or a stream object with an int .cuda_stream (torch.cuda.Stream) or .ptr (cupy.cuda.Stream); got {}",
                    obj.get_type()
                        .fully_qualified_name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                )))
            }
        }
    };
    match handle.extract::<i64>() {
        Ok(h) if h >= 0 => Ok(Some(h as u64)),
        Ok(h) => Err(Error::Argument(format!(
            "{what} is {h}: a stream handle is a CUstream (>= 0; 1: the legacy default stream, 2: the per-thread default stream)"
        ))),
        Err(_) => Err(Error::Argument(format!(
            "{what} is {handle}, which does not fit in 64 bits"
        ))),
    }
}

/// The stream bookkeeping of one call (see the module header).
#[derive(Default)]
pub struct CallStreams {
    /// The call's stream, once known.
    pub stream: Option<u64>,
    /// The device of the first CUDA tensor seen: tensors on others are left unordered (the
    /// call refuses mixed devices with a `DeviceError` naming them, after the conversion).
    device: Option<usize>,
    /// Producers' streams other than the call's, to order after it: (ordinal, stream).
    after: SmallVec<[(usize, u64); 2]>,
    /// Completion events of rivet tensors among the arguments: the call waits for them.
    waits: SmallVec<[Arc<Event>; 2]>,
}

impl CallStreams {
    pub fn new(explicit: Option<u64>) -> CallStreams {
        CallStreams {
            stream: explicit,
            device: None,
            after: SmallVec::new(),
            waits: SmallVec::new(),
        }
    }

    /// The producer of a tensor on `cuda:ordinal` works on `producer`: the call must see
    /// that work. `back`: the producer's later work must see the call's writes too.
    pub fn join(&mut self, ordinal: usize, producer: u64, back: bool) -> Result<()> {
        if *self.device.get_or_insert(ordinal) != ordinal {
            return Ok(());
        }
        match self.stream {
            None => self.stream = Some(producer),
            Some(s) if stream::same_stream(s, producer) => {}
            Some(s) => {
                // SAFETY: `producer` comes from the producer (its current stream), `s` from
                // the caller; both are live streams of the device by their promise.
                unsafe { driver::order(ordinal, producer, s) }.map_err(Error::from)?;
                if back && !self.after.contains(&(ordinal, producer)) {
                    self.after.push((ordinal, producer));
                }
            }
        }
        Ok(())
    }

    /// A rivet tensor on `cuda:ordinal` whose pending work `ready` covers: the call waits for
    /// it (`begin`).
    pub fn wait_for(&mut self, ordinal: usize, ready: Arc<Event>) {
        if *self.device.get_or_insert(ordinal) != ordinal {
            return;
        }
        if !self.waits.iter().any(|w| Arc::ptr_eq(w, &ready)) {
            self.waits.push(ready);
        }
    }

    /// A CUDA tensor argument on `cuda:ordinal` with nothing to wait for.
    pub fn note_device(&mut self, ordinal: usize) {
        self.device.get_or_insert(ordinal);
    }

    /// The device of the call's first CUDA tensor argument seen here, if any.
    pub fn device(&self) -> Option<usize> {
        self.device
    }

    /// Before the call: fixes its stream (the legacy default stream when nothing chose one
    /// and a CUDA tensor was seen) and makes it wait for the rivet tensors' events.
    pub fn begin(&mut self) -> Result<()> {
        if self.device.is_none() {
            return Ok(());
        }
        let s = *self.stream.get_or_insert(stream::LEGACY);
        for ev in &self.waits {
            ev.wait_on(s).map_err(Error::from)?;
        }
        Ok(())
    }

    /// What a tensor imported outside a call (`from_dlpack`) on `cuda:ordinal` must wait for:
    /// the rivet tensor's own event, or an event recorded now on the stream its producer
    /// named (live now: it was just handed over).
    pub fn ready_now(&self, ordinal: usize) -> Result<Option<Arc<Event>>> {
        if let Some(ev) = self.waits.first() {
            return Ok(Some(ev.clone()));
        }
        match self.stream {
            // Without a driver no work can be pending (fake pointers in tests).
            Some(_) if !driver::driver_present() => Ok(None),
            Some(s) => driver::record(ordinal, s).map(Some).map_err(Error::from),
            None => Ok(None),
        }
    }

    /// The stream to give a producer's `__dlpack__(stream=...)` for a tensor on
    /// `cuda:ordinal`: the call's (fixing it to the legacy default stream when nothing chose
    /// one yet); a tensor on another device than the call's gets the legacy default stream.
    pub fn for_producer(&mut self, ordinal: usize) -> u64 {
        if *self.device.get_or_insert(ordinal) != ordinal {
            return stream::LEGACY;
        }
        *self.stream.get_or_insert(stream::LEGACY)
    }

    /// After the call: producers working on other streams wait for the call's work (its
    /// completion event `done` where there is one).
    pub fn finish(&self, done: Option<&Arc<Event>>) -> Result<()> {
        let Some(s) = self.stream else { return Ok(()) };
        for &(ordinal, p) in &self.after {
            match done {
                // `p` is live: its producer handed it over for this call.
                Some(ev) if ev.ordinal() == ordinal => ev.wait_on(p).map_err(Error::from)?,
                // SAFETY: as in `join`.
                _ => unsafe { driver::order(ordinal, s, p) }.map_err(Error::from)?,
            }
        }
        Ok(())
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Imports an object through its `__cuda_array_interface__` (no copy; the view keeps the
/// object alive). The device comes from the driver; without one this is a `DeviceError`.
pub fn import_cai(obj: &Bound<'_, PyAny>, sync: Option<&mut CallStreams>) -> Result<Tensor> {
    let py = obj.py();
    let what = format!("{} (__cuda_array_interface__)", type_name(obj));
    let bad = |m: String| Error::DLPack(format!("{what}: {m}"));
    let d = obj
        .getattr(pyo3::intern!(py, "__cuda_array_interface__"))
        .map_err(|e| bad(format!("reading the interface raised {e}")))?;
    let d = d
        .cast::<PyDict>()
        .map_err(|_| bad(format!("the interface is a {}, not a dict", type_name(&d))))?;
    let get = |k: &str| d.get_item(k).ok().flatten().filter(|v| !v.is_none());
    let need = |k: &str| get(k).ok_or_else(|| bad(format!("the interface has no '{k}'")));
    let field = |k: &str, e: PyErr| bad(format!("'{k}' is malformed: {e}"));
    let version: i64 = need("version")?
        .extract()
        .map_err(|e| field("version", e))?;
    let shape: Vec<i64> = need("shape")?.extract().map_err(|e| field("shape", e))?;
    let typestr: String = need("typestr")?
        .extract()
        .map_err(|e| field("typestr", e))?;
    let (data, read_only): (u64, bool) = need("data")?.extract().map_err(|e| field("data", e))?;
    let strides: Option<Vec<i64>> = get("strides")
        .map(|s| s.extract())
        .transpose()
        .map_err(|e| field("strides", e))?;
    let stream: Option<i64> = get("stream")
        .map(|s| s.extract())
        .transpose()
        .map_err(|e| field("stream", e))?;
    let desc = cuda_array_interface::describe(
        &cuda_array_interface::Interface {
            version,
            shape,
            typestr,
            data,
            read_only,
            strides,
            masked: get("mask").is_some(),
            stream,
        },
        &what,
    )?;
    let empty = desc.shape.contains(&0);
    let ordinal = if empty && desc.data == 0 {
        0 // no memory to ask about: an empty array is as good on any device
    } else {
        driver::pointer_device(desc.data, &what).map_err(Error::from)?
    };
    if let (Some(p), false) = (desc.stream, empty) {
        match sync {
            Some(s) => s.join(ordinal, p, true)?,
            // No call (an import outside `from_dlpack` and calls, e.g. a callback's return
            // value): later calls without a stream run on the legacy default stream, so that
            // one waits.
            // SAFETY: the producer's stream is its promise; LEGACY is always valid.
            None => unsafe { driver::order(ordinal, p, stream::LEGACY) }.map_err(Error::from)?,
        }
    }
    let owner = crate::keepalive::PyKeepalive::new(obj.clone().unbind());
    // SAFETY: the producer promises `data` addresses the described array on the device for
    // as long as the object lives; the view holds a reference to it. The layout is checked.
    unsafe {
        Tensor::from_raw_parts(
            owner,
            desc.data as *mut u8,
            0,
            desc.shape,
            desc.strides,
            desc.dtype,
            rivet_runtime::Device::Cuda(ordinal as i32),
            desc.read_only,
        )
    }
    .map_err(|e| e.context(&format!("{what}: ")))
}
