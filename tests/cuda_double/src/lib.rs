//! A strict CUDA driver double: a shared library that exports the CUDA driver API entry
//! points rivet calls (through cudarc and directly), found in place of `libcuda.so.1`
//! through the loader path (`LD_LIBRARY_PATH=target/cuda-double`) only by the tests that ask
//! for it. It is stricter than the real driver wherever strictness finds bugs sooner.
//!
//! Layout:
//! - `config`: the devices it pretends to have (`RIVET_CUDA_DOUBLE`);
//! - `kernels`: modules and kernels — a cubin is mapped back to the CUDA C rivet compiled it
//!   from (`RIVET_CUBIN_SOURCES/<sha256 of the cubin>.cu`), compiled for the host under the
//!   CUDA emulation and run one CPU thread per CUDA thread;
//! - the driver state (contexts, memory, streams, events, IPC) and the exported entry points.
//!
//! Invariants: no exported function panics across the C boundary (each body runs under
//! `catch_unwind`, a panic is `CUDA_ERROR_UNKNOWN` and a line on stderr); every misuse is
//! both an error code and a line on stderr starting `rivet-cuda-double:`.

pub mod api;
pub mod config;
pub mod context;
pub mod error;
pub mod ipc;
pub mod kernels;
pub mod memory;
pub mod report;
pub mod stream;
