//! rivet's own CPU memory: 64-byte aligned (one cache line, a full AVX-512 vector),
//! zero-initialised, freed when the last tensor viewing it drops.
//!
//! Invariants: every size is computed with checked arithmetic, sizes over
//! [`MAX_ALLOC_BYTES`] are refused before the system is asked, and a refusal by the system is
//! an [`Error::Memory`] — nothing here calls `handle_alloc_error` or grows a `Vec`, so an
//! allocation failure never aborts the process.

use crate::dtype::DType;
use crate::error::{Error, Result};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

pub const ALIGN: usize = 64;

/// The largest single allocation rivet makes (256 TiB, the x86-64 and AArch64 48-bit user
/// address space). Anything larger can only be an overflowed or hostile size, so it is an
/// [`Error::Memory`] without asking the system (whose overcommit might otherwise say yes).
pub const MAX_ALLOC_BYTES: usize = 1 << 48;

/// Byte size of a compact tensor of `shape` and `dtype`, checked: an overflowing size or one
/// over [`MAX_ALLOC_BYTES`] is an [`Error::Memory`] naming the shape, dtype and byte count.
/// Negative dims are the caller's concern (they are a shape error, not a memory one).
pub fn tensor_bytes(shape: &[i64], dtype: DType) -> Result<usize> {
    // u128 holds any product of two i64 values; longer products are checked.
    let bytes = shape.iter().try_fold(dtype.size() as u128, |acc, &d| {
        acc.checked_mul(d.max(0) as u128)
    });
    // Zero dims make an empty tensor, but the other dims must still be sane (numpy's rule).
    let nonzero_elems = shape
        .iter()
        .try_fold(1u128, |acc, &d| acc.checked_mul(d.max(1) as u128));
    match (bytes, nonzero_elems) {
        (Some(b), Some(n)) if b <= MAX_ALLOC_BYTES as u128 && n <= i64::MAX as u128 => {
            Ok(b as usize)
        }
        (Some(b), _) => Err(Error::Memory(format!(
            "cannot allocate a {dtype} tensor of shape {shape:?}: {b} bytes is over rivet's limit of {MAX_ALLOC_BYTES} bytes (MAX_ALLOC_BYTES, 2^48)"
        ))),
        (None, _) => Err(Error::Memory(format!(
            "cannot allocate a {dtype} tensor of shape {shape:?}: its size in bytes overflows (over 2^128), far over rivet's limit of {MAX_ALLOC_BYTES} bytes (MAX_ALLOC_BYTES, 2^48)"
        ))),
    }
}

/// Allocates `bytes` zeroed bytes aligned to `align` (a power of two), fallibly: a size over
/// [`MAX_ALLOC_BYTES`], an invalid alignment or a refusal by the system is an
/// [`Error::Memory`], never an abort. For compiler temporaries and any other rivet-owned
/// buffer; free it with [`free_zeroed`] with the same `bytes` and `align`.
///
/// `bytes == 0` gives a dangling pointer aligned to `align`, valid for zero-size accesses only
/// (and accepted back by `free_zeroed`, which then does nothing).
pub fn try_alloc_zeroed(bytes: usize, align: usize) -> Result<NonNull<u8>> {
    if bytes > MAX_ALLOC_BYTES {
        return Err(Error::Memory(format!(
            "cannot allocate {bytes} bytes: over rivet's limit of {MAX_ALLOC_BYTES} bytes (MAX_ALLOC_BYTES, 2^48)"
        )));
    }
    let layout = Layout::from_size_align(bytes, align).map_err(|_| {
        Error::Memory(format!(
            "cannot allocate {bytes} bytes aligned to {align}: the alignment is not a power of two or the size is too large"
        ))
    })?;
    if bytes == 0 {
        // Aligned, non-null, never dereferenced: `align` is a non-zero power of two.
        return Ok(NonNull::new(align as *mut u8).expect("align is non-zero"));
    }
    // SAFETY: layout has non-zero size.
    let raw = unsafe { alloc_zeroed(layout) };
    NonNull::new(raw).ok_or_else(|| {
        Error::Memory(format!(
            "out of memory: the system refused an allocation of {bytes} bytes"
        ))
    })
}

/// Frees memory from [`try_alloc_zeroed`].
///
/// # Safety
/// `ptr` must come from `try_alloc_zeroed(bytes, align)` with these very `bytes` and `align`,
/// and must not be used or freed again afterwards.
pub unsafe fn free_zeroed(ptr: NonNull<u8>, bytes: usize, align: usize) {
    if bytes == 0 {
        return; // nothing was allocated
    }
    // SAFETY: the same size and alignment were accepted by `Layout` in `try_alloc_zeroed`.
    let layout = unsafe { Layout::from_size_align_unchecked(bytes, align) };
    // SAFETY: allocated with this layout (caller's promise), freed once.
    unsafe { dealloc(ptr.as_ptr(), layout) }
}

/// An owned, zeroed, [`ALIGN`]-aligned block; the owner behind rivet-allocated tensors.
pub struct Allocation {
    ptr: NonNull<u8>,
    bytes: usize,
}

// SAFETY: the allocation is plain memory owned uniquely by this value; freeing it from any
// thread is fine.
unsafe impl Send for Allocation {}
// SAFETY: `Allocation` exposes no interior mutation itself; tensors that write through the
// pointer synchronise like any framework tensor would.
unsafe impl Sync for Allocation {}

impl Allocation {
    /// `bytes` zeroed bytes, fallibly (see [`try_alloc_zeroed`]).
    pub fn zeroed(bytes: usize) -> Result<Allocation> {
        let ptr = try_alloc_zeroed(bytes, ALIGN)?;
        Ok(Allocation { ptr, bytes })
    }

    /// Memory for a compact tensor of `shape` and `dtype`; errors name all three.
    pub fn for_tensor(shape: &[i64], dtype: DType) -> Result<Allocation> {
        let bytes = tensor_bytes(shape, dtype)?;
        Allocation::zeroed(bytes).map_err(|e| match e {
            Error::Memory(m) => {
                Error::Memory(format!("{m} for a {dtype} tensor of shape {shape:?}"))
            }
            other => other,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: allocated by `try_alloc_zeroed(self.bytes, ALIGN)`, freed once.
        unsafe { free_zeroed(self.ptr, self.bytes, ALIGN) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked() {
        assert_eq!(tensor_bytes(&[3, 5], DType::F32).unwrap(), 60);
        assert_eq!(tensor_bytes(&[], DType::F64).unwrap(), 8);
        assert_eq!(tensor_bytes(&[0, 7], DType::F64).unwrap(), 0);
        let e = tensor_bytes(&[1 << 62], DType::F32).unwrap_err();
        assert!(matches!(e, Error::Memory(_)), "{e}");
        let m = e.to_string();
        assert!(
            m.contains("float32") && m.contains("[4611686018427387904]"),
            "{m}"
        );
        assert!(m.contains("18446744073709551616 bytes"), "{m}");
        assert!(tensor_bytes(&[i64::MAX, i64::MAX, i64::MAX], DType::U8).is_err());
        assert!(tensor_bytes(&[1 << 40, 1 << 40, 0], DType::U8).is_err());
        assert!(matches!(
            try_alloc_zeroed(MAX_ALLOC_BYTES + 1, 64),
            Err(Error::Memory(_))
        ));
        assert!(matches!(try_alloc_zeroed(8, 3), Err(Error::Memory(_))));
    }

    #[test]
    fn alloc_and_free_round_trip() {
        let p = try_alloc_zeroed(1000, 128).unwrap();
        assert_eq!(p.as_ptr() as usize % 128, 0);
        // SAFETY: fresh zeroed allocation of 1000 bytes.
        assert!(unsafe { std::slice::from_raw_parts(p.as_ptr(), 1000) }
            .iter()
            .all(|&b| b == 0));
        // SAFETY: same size and alignment, freed once.
        unsafe { free_zeroed(p, 1000, 128) };
        let z = try_alloc_zeroed(0, 64).unwrap();
        // SAFETY: a zero-size "allocation" is accepted back.
        unsafe { free_zeroed(z, 0, 64) };
    }
}
