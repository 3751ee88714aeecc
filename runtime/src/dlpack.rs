//! DLPack import and export, both ABIs: `DLManagedTensorVersioned` (1.x, with the
//! read-only flag) and the legacy `DLManagedTensor`.
//!
//! Import takes ownership of the managed tensor: whatever happens (success or a validation
//! error), its deleter runs exactly once — when the last `Tensor` view drops, or right away
//! when the import is refused. Export hands out a managed tensor that keeps a clone of the
//! view alive until the consumer calls its deleter.
//!
//! Exports always fold `byte_offset` into `data` (offset 0): several consumers ignore the
//! field, and on the CPU the spec's 256-byte alignment of `data` is not relied on by anyone.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{self, Dims};
use crate::tensor::Tensor;
use dlpack_rs::ffi::{
    DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
    DLPACK_FLAG_BITMASK_READ_ONLY,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The DLPack version rivet produces and the newest major it reads.
pub const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 1 };

/// Largest rank accepted from a producer (a corrupt `ndim` must not make us read far):
/// `layout::MAX_NDIM`, the limit for every view.
pub const MAX_NDIM: i32 = layout::MAX_NDIM as i32;

static LIVE_IMPORTS: AtomicUsize = AtomicUsize::new(0);

/// Number of imported DLPack tensors whose deleter has not run yet (for leak tests).
pub fn live_imports() -> usize {
    LIVE_IMPORTS.load(Ordering::Relaxed)
}

/// Owns an imported managed tensor and calls its deleter once on drop.
enum Managed {
    Versioned(*mut DLManagedTensorVersioned),
    Legacy(*mut DLManagedTensor),
}

// SAFETY: DLPack deleters may be called from any thread (producers that need the GIL take
// it themselves, as numpy does); the pointer is owned uniquely by this value.
unsafe impl Send for Managed {}
// SAFETY: the value is never used through `&self` except by `Drop`.
unsafe impl Sync for Managed {}

impl Managed {
    fn new_versioned(p: *mut DLManagedTensorVersioned) -> Managed {
        LIVE_IMPORTS.fetch_add(1, Ordering::Relaxed);
        Managed::Versioned(p)
    }
    fn new_legacy(p: *mut DLManagedTensor) -> Managed {
        LIVE_IMPORTS.fetch_add(1, Ordering::Relaxed);
        Managed::Legacy(p)
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        LIVE_IMPORTS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: we own the managed tensor (taken at import) and run its deleter once.
        unsafe {
            match *self {
                Managed::Versioned(p) => {
                    if let Some(d) = (*p).deleter {
                        d(p)
                    }
                }
                Managed::Legacy(p) => {
                    if let Some(d) = (*p).deleter {
                        d(p)
                    }
                }
            }
        }
    }
}

/// Reads a `DLTensor` into a view owned by `owner` (shape and strides are copied, so only
/// the data must outlive the call). Every import, of either ABI and through the exchange
/// fast path, comes through here and so through the validation of every view
/// (`Tensor::from_raw_slices`: the arrays are copied once, into the view, and the copies are
/// checked). Used directly for borrowed DLTensors whose data a foreign object keeps alive (the
/// bindings pass a reference to that object as `owner`).
///
/// # Safety
/// `t` must be a valid DLTensor whose data lives as long as `owner`.
#[inline]
pub unsafe fn view_of(
    t: &DLTensor,
    owner: impl crate::tensor::Keepalive + 'static,
    read_only: bool,
) -> Result<Tensor> {
    // SAFETY: forwarded.
    unsafe { view_in(None, t, owner, read_only) }
}

/// `view_of` in `spare`'s allocation when given one (`Tensor::into_spare`): the call path
/// reuses its argument views' allocations from call to call.
///
/// # Safety
/// As `view_of`.
#[inline]
pub unsafe fn view_in<K: crate::tensor::Keepalive + 'static>(
    spare: Option<crate::tensor::SpareView<K>>,
    t: &DLTensor,
    owner: K,
    read_only: bool,
) -> Result<Tensor> {
    if t.ndim < 0 || t.ndim > MAX_NDIM {
        return Err(Error::DLPack(format!(
            "DLPack tensor has ndim {}; expected 0..={MAX_NDIM}",
            t.ndim
        )));
    }
    let ndim = t.ndim as usize;
    if ndim > 0 && t.shape.is_null() {
        return Err(Error::DLPack(format!(
            "DLPack tensor has ndim {ndim} but a NULL shape"
        )));
    }
    let dtype = DType::from_dlpack(t.dtype)?;
    let device = Device::from_dlpack(t.device)?;
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: the producer promises `shape` (and `strides` if non-NULL) hold ndim entries.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let compact: Dims;
    let strides: &[i64] = if t.strides.is_null() || ndim == 0 {
        // NULL strides mean compact row-major (DLPack < 1.2).
        compact = layout::compact_strides(shape);
        &compact
    } else {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(t.strides, ndim) }
    };
    // SAFETY: forwarded from the caller's promise; the arrays are read before we return.
    unsafe {
        Tensor::from_raw_slices(
            spare,
            owner,
            t.data as *mut u8,
            t.byte_offset,
            shape,
            strides,
            dtype,
            device,
            read_only,
        )
    }
}

/// Imports a versioned managed tensor, taking ownership of it.
///
/// # Safety
/// `p` must be a valid, not yet consumed `DLManagedTensorVersioned` (or NULL).
pub unsafe fn import_versioned(p: *mut DLManagedTensorVersioned) -> Result<Tensor> {
    if p.is_null() {
        return Err(Error::DLPack(
            "DLPack capsule holds a NULL DLManagedTensorVersioned".into(),
        ));
    }
    let owner = Managed::new_versioned(p); // the deleter now runs on every path
                                           // SAFETY: p is valid per the caller.
    let m = unsafe { &*p };
    if m.version.major != VERSION.major {
        return Err(Error::DLPack(format!(
            "DLPack tensor has version {}.{}; rivet reads major version {}",
            m.version.major, m.version.minor, VERSION.major
        )));
    }
    let read_only = m.flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0;
    // SAFETY: the DLTensor lives inside the managed tensor, alive until `owner` drops.
    unsafe { view_of(&m.dl_tensor, owner, read_only) }
}

/// Imports a legacy managed tensor, taking ownership of it. Legacy tensors carry no
/// read-only flag; `read_only` says what the caller knows about the producer.
///
/// # Safety
/// `p` must be a valid, not yet consumed `DLManagedTensor` (or NULL).
pub unsafe fn import_legacy(p: *mut DLManagedTensor, read_only: bool) -> Result<Tensor> {
    if p.is_null() {
        return Err(Error::DLPack(
            "DLPack capsule holds a NULL DLManagedTensor".into(),
        ));
    }
    let owner = Managed::new_legacy(p);
    // SAFETY: p is valid per the caller; the DLTensor lives until `owner` drops.
    unsafe { view_of(&(*p).dl_tensor, owner, read_only) }
}

/// The context behind an exported tensor: the managed struct first (the deleter casts back),
/// then the arrays it points to and the view that keeps the memory alive.
#[repr(C)]
struct Export<M> {
    managed: M,
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    _keep: Tensor,
}

fn dltensor_of(t: &Tensor, shape: &mut [i64], strides: &mut [i64]) -> DLTensor {
    DLTensor {
        data: t.data_ptr() as *mut _,
        device: t.device().to_dlpack(),
        ndim: t.ndim() as i32,
        dtype: t.dtype().to_dlpack(),
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 0,
    }
}

unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    if !p.is_null() {
        // SAFETY: p came from `export_versioned`, where it was leaked from this Box type.
        drop(unsafe { Box::from_raw(p as *mut Export<DLManagedTensorVersioned>) });
    }
}

unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    if !p.is_null() {
        // SAFETY: p came from `export_legacy`, where it was leaked from this Box type.
        drop(unsafe { Box::from_raw(p as *mut Export<DLManagedTensor>) });
    }
}

/// Exports a view as a versioned managed tensor (read-only flag set when the view is).
/// The consumer owns the result and must call its deleter once.
pub fn export_versioned(t: &Tensor) -> *mut DLManagedTensorVersioned {
    let mut e = Box::new(Export {
        managed: DLManagedTensorVersioned {
            version: VERSION,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: if t.is_read_only() {
                DLPACK_FLAG_BITMASK_READ_ONLY
            } else {
                0
            },
            dl_tensor: dltensor_of(t, &mut [], &mut []),
        },
        shape: t.shape().into(),
        strides: t.strides().into(),
        _keep: t.clone(),
    });
    // Point into the boxed arrays only now that they have their final address.
    e.managed.dl_tensor = dltensor_of(t, &mut e.shape, &mut e.strides);
    let p = Box::into_raw(e);
    // SAFETY: p is a fresh valid box; manager_ctx points at the context for consumers.
    unsafe { (*p).managed.manager_ctx = p as *mut _ };
    p as *mut DLManagedTensorVersioned
}

/// Exports a view as a legacy managed tensor. Refused for read-only views: the legacy ABI
/// cannot say "read-only", and a consumer could then write (numpy refuses likewise).
pub fn export_legacy(t: &Tensor) -> Result<*mut DLManagedTensor> {
    if t.is_read_only() {
        return Err(Error::DLPack(
            "cannot export a read-only tensor as a legacy DLPack capsule (it cannot carry the read-only flag); ask for max_version=(1, 0) or higher".into(),
        ));
    }
    Ok(export_legacy_unchecked(t))
}

/// Legacy export without the read-only check: only for consumers known never to write
/// (JAX arrays are immutable, and JAX asks for legacy capsules only).
pub fn export_legacy_for_immutable_consumer(t: &Tensor) -> *mut DLManagedTensor {
    export_legacy_unchecked(t)
}

fn export_legacy_unchecked(t: &Tensor) -> *mut DLManagedTensor {
    let mut e = Box::new(Export {
        managed: DLManagedTensor {
            dl_tensor: dltensor_of(t, &mut [], &mut []),
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        },
        shape: t.shape().into(),
        strides: t.strides().into(),
        _keep: t.clone(),
    });
    e.managed.dl_tensor = dltensor_of(t, &mut e.shape, &mut e.strides);
    let p = Box::into_raw(e);
    // SAFETY: as in export_versioned.
    unsafe { (*p).managed.manager_ctx = p as *mut _ };
    p as *mut DLManagedTensor
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `live_imports` counts the whole process: the tests that compare it before and after
    /// run one at a time (they raced when the test harness ran them side by side).
    static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn round_trip_keeps_memory_and_flags() {
        let _serial = COUNTING.lock().unwrap_or_else(|p| p.into_inner());
        let t = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
        let tt = t.as_strided(&[3, 2], &[1, 3], 0).unwrap().to_read_only();
        let before = live_imports();
        // SAFETY: fresh export, consumed once.
        let back = unsafe { import_versioned(export_versioned(&tt)) }.unwrap();
        assert_eq!(live_imports(), before + 1);
        assert!(back.is_read_only());
        assert_eq!(back.data_ptr(), tt.data_ptr());
        assert_eq!(back.strides(), &[1, 3]);
        assert_eq!(back.to_vec::<f32>().unwrap(), tt.to_vec::<f32>().unwrap());
        drop(back);
        assert_eq!(live_imports(), before);
        assert!(export_legacy(&tt).is_err());
        // SAFETY: fresh export, consumed once.
        let l = unsafe { import_legacy(export_legacy(&t).unwrap(), false) }.unwrap();
        assert_eq!(l.to_vec::<f32>().unwrap(), vec![1., 2., 3., 4., 5., 6.]);
    }

    #[test]
    fn bad_version_runs_deleter_and_errors() {
        let _serial = COUNTING.lock().unwrap_or_else(|p| p.into_inner());
        let t = Tensor::zeros(&[2], DType::F64).unwrap();
        let p = export_versioned(&t);
        // SAFETY: p is a valid export we own.
        unsafe { (*p).version.major = 2 };
        let before = live_imports();
        // SAFETY: p is valid and consumed once.
        let e = unsafe { import_versioned(p) }.unwrap_err();
        assert!(e.to_string().contains("version 2.1"), "{e}");
        assert_eq!(live_imports(), before);
    }
}
