//! A compiled function's typed signature (what `Function::call` checks first: dtype, rank,
//! fixed dims, consistent symbolic dims, device, writable outputs) and the device rule of a
//! CUDA function.
//!
//! Invariant: the signature is derived from the final IR's parameters alone, so a loaded
//! function has the signature of the one that was saved.

use crate::error::{Error, Result};
use crate::ir::expr::Var;
use crate::ir::stmt::{BufKind, PrimFunc};
use rivet_runtime::{ArgName, DeviceSpec, Dim, Param, ParamKind, Signature, TensorSpec, Value};

fn dim_name(v: &Var, func: &PrimFunc) -> String {
    // Two dims with one name get their id appended so the signature keeps them apart.
    if func.dims.iter().filter(|d| d.name == v.name).count() > 1 {
        format!("{}#{}", v.name, v.id)
    } else {
        v.name.to_string()
    }
}

/// The typed signature of a compiled function, for a CPU target (tensors in host memory).
pub fn signature(func: &PrimFunc) -> Signature {
    signature_on(func, DeviceSpec::Host)
}

/// The typed signature with `device` for every tensor: `Any` for CUDA functions, whose
/// device rule (one CUDA device for all tensors) [`check_devices`] applies.
pub(super) fn signature_on(func: &PrimFunc, device: DeviceSpec) -> Signature {
    let params = func
        .params
        .iter()
        .map(|id| {
            let b = func.buffer(*id);
            let shape = b
                .shape
                .iter()
                .map(|e| match (e.as_int(), e.as_var()) {
                    (Some(n), _) => Dim::Fixed(n),
                    (None, Some(v)) => Dim::Var(dim_name(v, func)),
                    _ => Dim::Any,
                })
                .collect();
            let output = b.kind == (BufKind::Param { output: true });
            Param::new(
                b.name.clone(),
                ParamKind::Tensor(TensorSpec {
                    dtypes: vec![b.dtype],
                    shape: Some(shape),
                    device,
                    output,
                }),
            )
        })
        .collect();
    Signature::new(params)
}

/// The device rule of a CUDA function: every tensor argument on one CUDA device. Mixed
/// devices (cpu with cuda, cuda:0 with cuda:1) name the first argument on each of two
/// devices; all on the CPU says the function was built for CUDA. Runs before the signature
/// check, so a device mistake is reported as such and not as the first argument's shape.
pub(super) fn check_devices(name: &str, sig: &Signature, args: &[Value]) -> Result<()> {
    let device_error = |m: String| Error::Runtime(rivet_runtime::Error::Device(m));
    let arg = |i: usize| ArgName {
        index: i,
        name: sig.params.get(i).map(|p| p.name.as_str()),
    };
    let mut first: Option<(usize, rivet_runtime::Device)> = None;
    for (i, v) in args.iter().enumerate() {
        let Some(t) = v.as_tensor() else { continue };
        match first {
            None => first = Some((i, t.device())),
            Some((j, d)) if d != t.device() => {
                return Err(device_error(format!(
                    "{name}: tensors on different devices: {} is on {d} but {} is on {}; all tensors of a call must be on one CUDA device (rivet does not copy between devices)",
                    arg(j),
                    arg(i),
                    t.device()
                )))
            }
            Some(_) => {}
        }
    }
    match first {
        Some((i, d)) if !matches!(d, rivet_runtime::Device::Cuda(_)) => Err(device_error(format!(
            "{name}: built for 'cuda', called with tensors on {d} ({} and every other tensor); pass CUDA tensors (or build for 'cpu')",
            arg(i)
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_runtime::{DType, Device, Tensor};

    /// A view claiming 4 float32 on `device` at a fake address (never dereferenced).
    fn on(device: Device) -> Value {
        // SAFETY: the view is only inspected (device, shape), never read or written.
        let t = unsafe {
            Tensor::from_raw_parts(
                (),
                0x1000 as *mut u8,
                0,
                [4i64][..].into(),
                [1i64][..].into(),
                DType::F32,
                device,
                false,
            )
        }
        .unwrap();
        Value::Tensor(t)
    }

    fn sig() -> Signature {
        let t = || {
            ParamKind::Tensor(TensorSpec {
                device: DeviceSpec::Any,
                ..Default::default()
            })
        };
        Signature::new(vec![
            Param::new("A", t()),
            Param::new("k", ParamKind::Int),
            Param::new("C", t()),
        ])
    }

    #[test]
    fn cuda_calls_need_one_cuda_device_and_name_the_arguments() {
        let ok = [on(Device::Cuda(1)), Value::Int(3), on(Device::Cuda(1))];
        check_devices("f", &sig(), &ok).unwrap();
        for (args, want) in [
            (
                [on(Device::Cuda(0)), Value::Int(3), on(Device::Cuda(1))],
                "f: tensors on different devices: argument 0 ('A') is on cuda:0 but argument 2 ('C') is on cuda:1",
            ),
            (
                [on(Device::Cpu), Value::Int(3), on(Device::Cuda(0))],
                "argument 0 ('A') is on cpu but argument 2 ('C') is on cuda:0",
            ),
            (
                [on(Device::Cpu), Value::Int(3), on(Device::Cpu)],
                "f: built for 'cuda', called with tensors on cpu (argument 0 ('A') and every other tensor)",
            ),
            (
                [on(Device::CudaHost), Value::Int(3), on(Device::CudaHost)],
                "called with tensors on cuda_host",
            ),
        ] {
            let e = check_devices("f", &sig(), &args).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(e, Error::Runtime(rivet_runtime::Error::Device(_))) && msg.contains(want),
                "{msg}"
            );
        }
        // No tensor at all: nothing to check (the signature check reports what is missing).
        check_devices("f", &sig(), &[Value::Int(1)]).unwrap();
    }
}
