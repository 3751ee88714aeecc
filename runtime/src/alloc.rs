//! rivet's own CPU memory: 64-byte aligned (one cache line, a full AVX-512 vector),
//! zero-initialised, freed when the last tensor viewing it drops.

use crate::error::{Error, Result};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

pub const ALIGN: usize = 64;

pub struct Allocation {
    ptr: NonNull<u8>,
    layout: Option<Layout>, // None: zero bytes, nothing allocated
}

// SAFETY: the allocation is plain memory owned uniquely by this value; freeing it from any
// thread is fine.
unsafe impl Send for Allocation {}
// SAFETY: `Allocation` exposes no interior mutation itself; tensors that write through the
// pointer synchronise like any framework tensor would.
unsafe impl Sync for Allocation {}

impl Allocation {
    pub fn zeroed(bytes: usize) -> Result<Allocation> {
        if bytes == 0 {
            // A dangling but aligned pointer: valid for zero-size accesses only.
            let ptr = NonNull::new(ALIGN as *mut u8).expect("non-zero");
            return Ok(Allocation { ptr, layout: None });
        }
        let layout = Layout::from_size_align(bytes, ALIGN)
            .map_err(|_| Error::Shape(format!("allocation of {bytes} bytes is too large")))?;
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw)
            .ok_or_else(|| Error::Shape(format!("out of memory allocating {bytes} bytes")))?;
        Ok(Allocation {
            ptr,
            layout: Some(layout),
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `zeroed` with this very layout, freed once.
            unsafe { dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}
