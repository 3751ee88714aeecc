//! Devices. rivet runs on the CPU everywhere; CUDA devices are named here so that tensors
//! living there can be imported, described and refused with a clear error until a backend
//! that runs on them is loaded.

use crate::error::{Error, Result};
use dlpack_rs::ffi::{DLDevice, DLDeviceType};
use std::fmt;
use std::str::FromStr;

/// Serialised by name ("cpu", "cuda:0"), as Python spells it (`FromStr` / `Display`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Device {
    Cpu,
    Cuda(i32),
    /// Page-locked host memory allocated by CUDA: readable by CPU code.
    CudaHost,
}

impl Device {
    pub fn to_dlpack(self) -> DLDevice {
        match self {
            Device::Cpu => DLDevice {
                device_type: DLDeviceType::kDLCPU,
                device_id: 0,
            },
            Device::Cuda(id) => DLDevice {
                device_type: DLDeviceType::kDLCUDA,
                device_id: id,
            },
            Device::CudaHost => DLDevice {
                device_type: DLDeviceType::kDLCUDAHost,
                device_id: 0,
            },
        }
    }

    /// Inlined into every tensor argument's import; the refusals are out of line.
    #[inline]
    pub fn from_dlpack(d: DLDevice) -> Result<Device> {
        match d.device_type {
            DLDeviceType::kDLCPU => Ok(Device::Cpu),
            DLDeviceType::kDLCUDA if d.device_id >= 0 => Ok(Device::Cuda(d.device_id)),
            DLDeviceType::kDLCUDAHost => Ok(Device::CudaHost),
            _ => Err(unsupported_dlpack(d)),
        }
    }

    /// True when CPU code may read and write the memory directly.
    pub fn is_host(self) -> bool {
        matches!(self, Device::Cpu | Device::CudaHost)
    }
}

/// `Device::from_dlpack`'s refusals: a negative CUDA ordinal, an unsupported device type.
#[cold]
#[inline(never)]
fn unsupported_dlpack(d: DLDevice) -> Error {
    match d.device_type {
        DLDeviceType::kDLCUDA => Error::DLPack(format!(
            "DLPack tensor on CUDA device {}: a device ordinal is >= 0",
            d.device_id
        )),
        other => Error::Device(format!(
            "unsupported DLPack device type {other} (device id {}); rivet supports cpu (1), cuda (2) and cuda_host (3)",
            d.device_id
        )),
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(id) => write!(f, "cuda:{id}"),
            Device::CudaHost => f.write_str("cuda_host"),
        }
    }
}

impl From<Device> for String {
    fn from(d: Device) -> String {
        d.to_string()
    }
}

impl TryFrom<String> for Device {
    type Error = Error;
    fn try_from(s: String) -> Result<Device> {
        s.parse()
    }
}

impl FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Device> {
        match s {
            "cpu" => return Ok(Device::Cpu),
            "cuda" => return Ok(Device::Cuda(0)),
            "cuda_host" => return Ok(Device::CudaHost),
            _ => {}
        }
        s.strip_prefix("cuda:")
            .and_then(|n| n.parse::<i32>().ok())
            .filter(|n| *n >= 0)
            .map(Device::Cuda)
            .ok_or_else(|| {
                Error::Device(format!(
                    "unknown device '{s}'; expected 'cpu', 'cuda' or 'cuda:N'"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_dlpack_round_trip() {
        for d in [
            Device::Cpu,
            Device::Cuda(0),
            Device::Cuda(3),
            Device::CudaHost,
        ] {
            assert_eq!(Device::from_dlpack(d.to_dlpack()).unwrap(), d);
            assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
        }
        assert!("cuda:-1".parse::<Device>().is_err());
        let neg = DLDevice {
            device_type: DLDeviceType::kDLCUDA,
            device_id: -1,
        };
        assert!(matches!(Device::from_dlpack(neg), Err(Error::DLPack(_))));
        assert!("tpu".parse::<Device>().is_err());
    }
}
