//! CUDA cross-process handles (`docs/ipc.md` "CUDA"): the handle format
//! and its validation. Opening needs the CUDA driver, which lives in the compiler crate
//! (`codegen::cuda::driver`); this module is the part that runs, and is tested, without a GPU.
//!
//! Invariants:
//! - a [`CudaHandle`] from outside is never trusted: [`CudaHandle::parse`] range-checks every
//!   field (device index, the 64-byte `cuIpcMemHandle` / `cuIpcEventHandle` lengths exactly,
//!   the allocation's size and the view's byte offset) and proves with
//!   [`crate::ipc::check_span`] (checked arithmetic over `layout::validate`) that the view lies
//!   inside the `alloc_size` bytes of the allocation the memory handle names, so a receiver
//!   never forms a pointer outside the allocation it opened;
//! - the memory handle names the allocation's *base* (`cuMemGetAddressRange`), never the
//!   tensor's pointer: CUDA IPC hands out whole allocations, and torch's caching allocator
//!   sub-allocates, so the view is (base handle, byte offset), as torch's own CUDA IPC does.
use crate::dtype::DType;
use crate::error::Result;
use crate::ipc::{check_span_in, field, invalid_handle, view_fields};
use crate::layout::Dims;

/// The `kind` of a handle of CUDA device memory shared with `cuIpcGetMemHandle`.
pub const KIND_CUDA: &str = "cuda_ipc";

/// Bytes of a `CUipcMemHandle` and of a `CUipcEventHandle` (`CU_IPC_HANDLE_SIZE`).
pub const IPC_HANDLE_SIZE: usize = 64;

/// A validated CUDA IPC handle: every field in range and the view inside the allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaHandle {
    /// The sending process (opening a handle in the process that made it is refused by CUDA;
    /// the receiver uses this to hand back its own memory instead).
    pub pid: i32,
    /// The sender's CUDA device ordinal of the allocation.
    pub device: i32,
    /// `cuIpcGetMemHandle` of the allocation's base.
    pub mem_handle: [u8; IPC_HANDLE_SIZE],
    /// Bytes of the allocation (`cuMemGetAddressRange`'s size).
    pub alloc_size: u64,
    /// Byte offset of element (0, ..., 0) from the allocation's base.
    pub offset: u64,
    pub shape: Dims,
    /// In elements, as a tensor's.
    pub strides: Dims,
    pub dtype: DType,
    /// `cuIpcGetEventHandle` of an interprocess event recorded after the sender's writes;
    /// `None` when the sender synchronized itself (the receiver then waits on nothing).
    pub event_handle: Option<[u8; IPC_HANDLE_SIZE]>,
}

/// A CUDA handle's fields as they came from outside, untrusted; integers wide enough that no
/// value a caller can pass is truncated before it is checked.
#[derive(Debug, Clone)]
pub struct CudaRawHandle<'a> {
    pub kind: &'a str,
    pub pid: i128,
    pub device: i128,
    pub mem_handle: &'a [u8],
    pub alloc_size: i128,
    pub offset: i128,
    pub shape: &'a [i128],
    pub strides: &'a [i128],
    pub dtype: &'a str,
    pub event_handle: Option<&'a [u8]>,
}

fn ipc_bytes(name: &str, b: &[u8]) -> Result<[u8; IPC_HANDLE_SIZE]> {
    b.try_into().map_err(|_| {
        invalid_handle(format!(
            "field '{name}' has {} bytes; a CUDA IPC handle has exactly {IPC_HANDLE_SIZE}",
            b.len()
        ))
    })
}

impl CudaHandle {
    /// Checks every field of an untrusted CUDA handle (see the module header). Needs no GPU.
    pub fn parse(raw: &CudaRawHandle<'_>) -> Result<CudaHandle> {
        if raw.kind != KIND_CUDA {
            return Err(invalid_handle(format!(
                "field 'kind' is '{}'; a CUDA handle's kind is '{KIND_CUDA}'",
                raw.kind
            )));
        }
        let pid = field::<i32>(
            "pid",
            raw.pid,
            1,
            i32::MAX as i128,
            "a process id (1 to 2^31 - 1)",
        )?;
        // CUdevice is a C int; whether the ordinal exists here is checked when opening.
        let device = field::<i32>(
            "device",
            raw.device,
            0,
            i32::MAX as i128,
            "a CUDA device index (0 to 2^31 - 1)",
        )?;
        let mem_handle = ipc_bytes("mem_handle", raw.mem_handle)?;
        let event_handle = raw
            .event_handle
            .map(|e| ipc_bytes("event_handle", e))
            .transpose()?;
        // cuIpcGetMemHandle never hands out a 0-byte allocation.
        let alloc_size = field::<u64>(
            "alloc_size",
            raw.alloc_size,
            1,
            isize::MAX as i128,
            "an allocation size in bytes (1 to 2^63 - 1)",
        )?;
        let offset = field::<u64>(
            "offset",
            raw.offset,
            0,
            isize::MAX as i128,
            "a byte offset (0 to 2^63 - 1)",
        )?;
        let (shape, strides, dtype) = view_fields(raw.shape, raw.strides, raw.dtype)?;
        check_span_in(
            "the CUDA allocation",
            "alloc_size",
            alloc_size,
            offset,
            &shape,
            &strides,
            dtype,
        )?;
        Ok(CudaHandle {
            pid,
            device,
            mem_handle,
            alloc_size,
            offset,
            shape,
            strides,
            dtype,
            event_handle,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<'a>(mem: &'a [u8], shape: &'a [i128], strides: &'a [i128]) -> CudaRawHandle<'a> {
        CudaRawHandle {
            kind: KIND_CUDA,
            pid: 1234,
            device: 0,
            mem_handle: mem,
            alloc_size: 4096,
            offset: 512,
            shape,
            strides,
            dtype: "float32",
            event_handle: None,
        }
    }

    #[test]
    fn well_formed_handle_parses() {
        let mem = [7u8; 64];
        let h = CudaHandle::parse(&raw(&mem, &[2, 3], &[3, 1])).unwrap();
        assert_eq!((h.alloc_size, h.offset, h.device), (4096, 512, 0));
        assert_eq!(h.mem_handle, mem);
    }

    #[test]
    fn hostile_handles_are_ipc_errors_naming_the_field() {
        let mem = [0u8; 64];
        let short = [0u8; 63];
        let check = |r: CudaRawHandle<'_>, want: &str| {
            let e = CudaHandle::parse(&r).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        };
        check(raw(&short, &[1], &[1]), "'mem_handle' has 63 bytes");
        let ev = [0u8; 65];
        check(
            CudaRawHandle {
                event_handle: Some(&ev),
                ..raw(&mem, &[1], &[1])
            },
            "'event_handle' has 65 bytes",
        );
        check(
            CudaRawHandle {
                device: -1,
                ..raw(&mem, &[1], &[1])
            },
            "field 'device' is -1",
        );
        check(
            CudaRawHandle {
                alloc_size: 1 << 70,
                ..raw(&mem, &[1], &[1])
            },
            "field 'alloc_size'",
        );
        // 1000 floats from byte 512 end at 4512 > 4096.
        check(raw(&mem, &[1000], &[1]), "reaches bytes [512, 4512)");
        check(raw(&mem, &[2], &[i64::MAX as i128]), "not a valid layout");
        check(raw(&mem, &[1], &[1 << 64]), "does not fit in int64");
        check(
            CudaRawHandle {
                kind: "cpu_shm",
                ..raw(&mem, &[1], &[1])
            },
            "field 'kind'",
        );
    }
}
