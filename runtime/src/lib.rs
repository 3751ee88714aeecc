//! rivet-runtime: tensors over foreign or own memory, DLPack both ways, packed functions
//! and their registry. It knows nothing of the compiler; it only runs functions.
//!
//! Data flow of a call: a host language hands `Value`s (tensors imported from DLPack, without
//! copies) to `Function::call`, which checks them against the function's signature and runs
//! its body. Tensors keep their producer's memory alive; the producer's deleter runs once,
//! when the last view drops.

pub mod alloc;
pub mod builtin_functions;
pub mod capi;
pub mod cuda_array_interface;
pub mod device;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub mod function;
pub mod host_lock;
pub mod ipc;
pub mod ipc_cuda;
pub mod layout;
pub mod library;
pub mod parallel;
pub mod registry;
pub mod rust_data;
pub mod shm;
pub mod stream;
pub mod tensor;
pub mod value;
pub mod xla_ffi;

pub use alloc::MAX_ALLOC_BYTES;
pub use device::Device;
pub use dtype::DType;
pub use error::{ArgName, Error, ForeignError, Result};
pub use function::{DeviceSpec, Dim, Function, Param, ParamKind, Parts, Signature, TensorSpec};
pub use tensor::{Element, Tensor};
pub use value::Value;
