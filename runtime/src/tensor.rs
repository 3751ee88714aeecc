//! `Tensor`: a view (data pointer, byte offset, shape, strides in elements, dtype, device,
//! read-only flag) over an owner that keeps the memory alive.
//!
//! Invariants, established by every constructor and relied on by kernels:
//! - `shape.len() == strides.len()`, every dim `>= 0`, and the element count and the byte
//!   span of the layout fit in `i64` / `isize`;
//! - for a non-empty tensor, every index inside `shape` addresses memory that the owner
//!   keeps alive (for foreign memory this is the producer's promise, checked for sanity only);
//! - clones share the owner: the producer's deleter runs once, when the last view drops;
//! - a view's allocation may outlive the view (`SpareView`, reused by the next import), its
//!   owner never: `into_spare` drops the owner and the fields as the last view's drop would.

use crate::alloc::Allocation;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{ArgName, Error, Result};
use crate::layout::{self, Dims};
use crate::shm::Segment;
use std::any::Any;
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Something that keeps a tensor's memory alive; dropped when the last view goes.
///
/// `as_any_mut` lets the runtime recognise its own owners behind a uniquely held view
/// (`rust_data`: a view whose memory no other handle can reach may lend out a slice, and a
/// view over a whole `Vec` may give that `Vec` back).
pub trait Keepalive: Send + Sync {
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn as_any(&self) -> &dyn Any;
}
impl<T: Send + Sync + 'static> Keepalive for T {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A view of memory with a shape, strides (in elements), a dtype and a device: rivet's own
/// allocations, Rust `Vec`s, or another framework's memory through DLPack, never copied.
/// A cheap handle (one `Arc`, one allocation per view with the owner stored inline): clones
/// share the view, so passing tensors around in `Value`s copies a pointer, not a shape.
///
/// ```
/// use rivet_runtime::{DType, Tensor};
///
/// # fn main() -> rivet_runtime::Result<()> {
/// let t = Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[2, 3])?;
/// assert_eq!((t.shape(), t.strides(), t.dtype()), (&[2, 3][..], &[3, 1][..], DType::F32));
/// // A transposed view of the same memory: strides, no copy.
/// let tt = t.as_strided(&[3, 2], &[1, 3], 0)?;
/// assert_eq!(tt.to_vec::<f32>()?, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
/// assert_eq!(tt.data_ptr(), t.data_ptr());
/// // A view that would reach outside the memory is refused:
/// assert!(t.as_strided(&[3, 3], &[3, 1], 0).is_err());
/// assert!(t.as_strided(&[2], &[i64::MAX], 0).is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Tensor(Arc<View<dyn Keepalive>>);

/// The view's description; the owner sits after it, unsized, in the same allocation.
struct View<K: ?Sized + Keepalive> {
    m: Meta,
    /// `m`'s validated extent, computed once by `check_view`: the call path reads it on every
    /// call (overlap rule, work size), so it is not re-derived from the shape each time.
    ext: layout::Extent,
    /// Exists to be dropped (running a deleter, freeing memory) last; read only to recognise
    /// an owner's type (`unique_owner_mut`, `owner`).
    _owner: K,
}

#[derive(Clone)]
struct Meta {
    data: *mut u8,
    byte_offset: u64,
    shape: Dims,
    strides: Dims,
    dtype: DType,
    device: Device,
    read_only: bool,
}

// SAFETY: the owner is Send + Sync, and the raw pointer is only dereferenced by kernels that
// follow the framework convention: concurrent writers to one tensor must synchronise.
unsafe impl Send for Meta {}
// SAFETY: as above; `&Tensor` gives no safe way to write the memory.
unsafe impl Sync for Meta {}

impl Tensor {
    /// A view kept alive by `owner`. A view of a view keeps the parent's own owner instead,
    /// when that is a tensor: so a view's owner is never a view of a view, chains of views
    /// (`t = t.as_strided(..)` in a loop, a million deep) are two levels, and dropping one
    /// cannot recurse deeper than that. The memory is the same: the parent only kept that
    /// owner alive.
    fn new<K: Keepalive + 'static>(m: Meta, ext: layout::Extent, owner: K) -> Tensor {
        let grandparent = (&owner as &dyn Any)
            .downcast_ref::<Tensor>()
            .and_then(|parent| parent.0._owner.as_any().downcast_ref::<Tensor>())
            .cloned();
        match grandparent {
            Some(root) => Tensor::alloc(None, root, |p| {
                // SAFETY: `alloc` hands a writable, uninitialised `Meta`.
                unsafe { p.write(m) };
                ext
            }),
            None => Tensor::alloc(None, owner, |p| {
                // SAFETY: as above.
                unsafe { p.write(m) };
                ext
            }),
        }
    }

    /// The one allocation of a view, its fields written in their final place: `fill` must
    /// initialise the whole `Meta` it is given and returns the view's extent. The call path
    /// makes a view per tensor argument per call; building the `View` on the stack and moving
    /// it into `Arc::new` copied its ~200 bytes (with `Meta`'s two inline `Dims`) several
    /// times through `memcpy`. With `spare`, that allocation is reused instead of a new one.
    #[inline]
    fn alloc<K: Keepalive + 'static>(
        spare: Option<SpareView<K>>,
        owner: K,
        fill: impl FnOnce(*mut Meta) -> layout::Extent,
    ) -> Tensor {
        let a = match spare {
            Some(s) => s.0,
            None => Arc::<View<K>>::new_uninit(),
        };
        // The allocation is fresh or a `SpareView`'s, so this handle is its only one (a spare
        // is never cloned): writing through its pointer races with nothing (what the unstable
        // `Arc::get_mut_unchecked` does).
        let p = Arc::as_ptr(&a) as *mut View<K>;
        // SAFETY: `p` points to the uninitialised, uniquely held `View<K>`; every field is
        // written once (`fill` initialises `m`, as its contract says) before `assume_init`.
        unsafe {
            (&raw mut (*p)._owner).write(owner);
            let ext = fill(&raw mut (*p).m);
            (&raw mut (*p).ext).write(ext);
            Tensor(a.assume_init())
        }
    }
}

/// The allocation of a dropped view whose owner was a `K`, kept to hold the next one
/// (`Tensor::into_spare`, `Tensor::from_raw_slices`). Holds no value: dropping it only frees
/// the memory. Never cloned, so its handle is always the allocation's only one.
pub struct SpareView<K: Keepalive + 'static>(Arc<MaybeUninit<View<K>>>);

/// Rust element types with a rivet dtype.
///
/// # Safety
/// `Self` must be a plain value type of exactly `DTYPE`'s element size, and every bit pattern
/// of that size must be a valid `Self`, except for `DType::Bool`, which only `bool` may name
/// (readers normalise any non-zero byte to `true`). rivet reads and writes tensor memory as
/// `Self` on that promise; the entry points still refuse a size mismatch (`Error::DType`).
pub unsafe trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
}
macro_rules! element {
    // SAFETY: each type is the dtype's element exactly (size, and every bit pattern valid;
    // bool is read through a byte, normalised).
    ($($t:ty => $d:ident),*) => { $(unsafe impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(bool => Bool, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16,
         u32 => U32, u64 => U64, half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64);

/// Where a layout comes from: decides which error a refusal is.
#[derive(Clone, Copy, PartialEq)]
enum Origin {
    /// Foreign memory (DLPack imports, the exchange fast path): a malformed tensor.
    Foreign,
    /// A view or allocation rivet makes from user-given sizes: a bad shape.
    Rivet,
}

fn layout_error(e: layout::LayoutError, origin: Origin) -> Error {
    use layout::LayoutError as L;
    match (e, origin) {
        // Bad sizes are shape errors wherever they come from.
        (e @ (L::NegativeDim { .. } | L::TooManyElements { .. }), _) => Error::Shape(e.to_string()),
        (e, Origin::Foreign) => Error::DLPack(format!("refused DLPack tensor: {e}")),
        (e, Origin::Rivet) => Error::Shape(e.to_string()),
    }
}

/// The one validation every view passes (see `layout`'s header for what it proves): the
/// layout's arithmetic and, for non-empty tensors, a non-NULL, unwrapped address range.
fn check_view(m: &Meta, origin: Origin) -> Result<layout::Extent> {
    let ext = layout::validate(&m.shape, &m.strides, m.dtype.size())
        .map_err(|e| layout_error(e, origin))?;
    if m.data.is_null() && ext.numel > 0 {
        return Err(Error::DLPack(format!(
            "non-empty tensor of shape {:?} has a NULL data pointer",
            m.shape
        )));
    }
    layout::check_address(m.data as usize, m.byte_offset, &ext)
        .map_err(|e| layout_error(e, origin))?;
    Ok(ext)
}

/// Writes `Dims` holding `values` at `p`, uninitialised: element by element, since a
/// rank is a few entries and `Dims::from_slice` copies them with a `memcpy` call, then the
/// whole inline array again into place.
///
/// # Safety
/// `p` must be valid for writes and hold no value that needs dropping.
#[inline]
unsafe fn fill_dims(p: *mut Dims, values: &[i64]) {
    // SAFETY: per the contract; `Dims::new()` is a valid value, then extended in place.
    let d = unsafe {
        p.write(Dims::new());
        &mut *p
    };
    if values.len() > d.inline_size() {
        d.reserve_exact(values.len());
    }
    for &v in values {
        d.push(v);
    }
}

/// The checks of a shape rivet allocates before any size arithmetic: rank and sign.
fn check_new_shape(shape: &[i64]) -> Result<&[i64]> {
    if shape.len() > layout::MAX_NDIM {
        return Err(layout_error(
            layout::LayoutError::TooManyDims(shape.len()),
            Origin::Rivet,
        ));
    }
    if let Some(dim) = shape.iter().position(|&n| n < 0) {
        return Err(layout_error(
            layout::LayoutError::NegativeDim {
                dim,
                size: shape[dim],
            },
            Origin::Rivet,
        ));
    }
    Ok(shape)
}

impl Tensor {
    /// A new compact, zero-filled CPU tensor in rivet's aligned memory. Sizes are checked
    /// and the allocation is fallible: too large or refused is `Error::Memory`, never an abort.
    pub fn zeros(shape: &[i64], dtype: DType) -> Result<Tensor> {
        // Before any other arithmetic: an overflowing or huge size is a memory error.
        let alloc = Allocation::for_tensor(check_new_shape(shape)?, dtype)?;
        Tensor::compact(shape, dtype, alloc.as_ptr(), alloc)
    }

    /// A new compact, zero-filled CPU tensor in a shared-memory segment of its own (a sealed
    /// memfd, `shm`): other processes can map it through an `ipc` handle. The same size checks
    /// and errors as [`Tensor::zeros`]; the kernel zero-fills pages lazily.
    pub fn zeros_shared(shape: &[i64], dtype: DType) -> Result<Tensor> {
        let bytes = crate::alloc::tensor_bytes(check_new_shape(shape)?, dtype)?;
        let seg = Segment::create(bytes).map_err(|e| match e {
            Error::Memory(m) => {
                Error::Memory(format!("{m} (a shared {dtype} tensor of shape {shape:?})"))
            }
            other => other,
        })?;
        Tensor::compact(shape, dtype, seg.base(), seg)
    }

    /// A compact CPU view of `shape` at `data`, which `owner` keeps alive (a fresh allocation
    /// of at least the shape's bytes).
    fn compact<K: Keepalive + 'static>(
        shape: &[i64],
        dtype: DType,
        data: *mut u8,
        owner: K,
    ) -> Result<Tensor> {
        let m = Meta {
            data,
            byte_offset: 0,
            shape: shape.into(),
            strides: layout::compact_strides(shape),
            dtype,
            device: Device::Cpu,
            read_only: false,
        };
        let ext = check_view(&m, Origin::Rivet)?;
        Ok(Tensor::new(m, ext, owner))
    }

    /// A writable CPU view at `data + byte_offset` with any validated layout, over memory that
    /// `owner` keeps alive (`rust_data`: a `Vec` or an ndarray buffer). The layout passes
    /// the same validation as every view; that it stays inside the owner's memory is the
    /// caller's to check.
    pub(crate) fn owned_view<K: Keepalive + 'static>(
        owner: K,
        data: *mut u8,
        byte_offset: u64,
        shape: &[i64],
        strides: &[i64],
        dtype: DType,
    ) -> Result<Tensor> {
        let m = Meta {
            data,
            byte_offset,
            shape: shape.into(),
            strides: strides.into(),
            dtype,
            device: Device::Cpu,
            read_only: false,
        };
        let ext = check_view(&m, Origin::Rivet)?;
        Ok(Tensor::new(m, ext, owner))
    }

    /// The owner of this view's memory, if this handle is the only one to the view (no other
    /// clone, no weak reference); the `&mut` borrow keeps it so while it lives.
    pub(crate) fn unique_owner_mut(&mut self) -> Option<&mut dyn Any> {
        Arc::get_mut(&mut self.0).map(|v| v._owner.as_any_mut())
    }

    /// Whether this handle is the only one to the view (no clone of it exists anywhere, so
    /// dropping it drops the owner); the `&mut` borrow keeps it so while it lives. The Python
    /// bindings ask it at the end of a call whose argument views only borrowed their
    /// producers: a view still held elsewhere must then take a reference of its own.
    pub fn is_unique(&mut self) -> bool {
        Arc::get_mut(&mut self.0).is_some()
    }

    /// This view's allocation, for the next view with an owner of type `K`
    /// (`from_raw_slices`), when this handle is the only one to the view and its owner is a
    /// `K`; else the view back, untouched. The view's fields and owner drop here (the
    /// producer's deleter, if any, runs now), the memory is kept. A call makes and frees a
    /// view per tensor argument: keeping the allocations saves a `malloc` and a `free` each.
    pub fn into_spare<K: Keepalive + 'static>(
        mut self,
    ) -> std::result::Result<SpareView<K>, Tensor> {
        if !Arc::get_mut(&mut self.0).is_some_and(|v| v._owner.as_any().is::<K>()) {
            return Err(self);
        }
        // `as_any` is the blanket impl's, so the owner's type is the type the view was made
        // with: the allocation is an `ArcInner<View<K>>`, unsized to `View<dyn Keepalive>`.
        let p = Arc::into_raw(self.0) as *const View<K>;
        // SAFETY: `p` is the unique handle's value (checked above: no other strong or weak
        // handle, and none can appear without this one), a `View<K>`; it is dropped once,
        // here, and the allocation is taken back as the same `ArcInner` with the value
        // uninitialised (`MaybeUninit<View<K>>` has `View<K>`'s size and alignment, as
        // `Arc::from_raw` requires).
        unsafe {
            std::ptr::drop_in_place(p as *mut View<K>);
            Ok(SpareView(Arc::from_raw(p as *const MaybeUninit<View<K>>)))
        }
    }

    /// The owner that keeps this view's memory alive, to be recognised by its type (the
    /// Python bindings find their own owners behind argument views this way).
    pub fn owner(&self) -> &dyn Any {
        self.0._owner.as_any()
    }

    /// A compact CPU tensor holding a copy of `values`.
    pub fn from_slice<T: Element>(values: &[T], shape: &[i64]) -> Result<Tensor> {
        // The checks `from_vec` makes (rank, negative sizes before the product: two negative
        // dims multiply to a count that may match `values`, overflow).
        let n = crate::rust_data::checked_numel("Tensor::from_slice", shape)?;
        if n as u64 != values.len() as u64 {
            return Err(Error::Shape(format!(
                "shape {shape:?} holds {n} elements but {} values were given",
                values.len()
            )));
        }
        let t = Tensor::zeros(shape, T::DTYPE)?;
        // SAFETY: `t` is a fresh compact allocation of exactly `n` elements of T.
        unsafe {
            std::ptr::copy_nonoverlapping(values.as_ptr(), t.0.m.data as *mut T, values.len())
        };
        Ok(t)
    }

    /// A view of foreign memory.
    ///
    /// # Safety
    /// For a non-empty layout, every element addressed by (`data + byte_offset`, `shape`,
    /// `strides`) must stay valid, for reads (and writes unless `read_only`), as long as
    /// `owner` lives.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn from_raw_parts(
        owner: impl Keepalive + 'static,
        data: *mut u8,
        byte_offset: u64,
        shape: Dims,
        strides: Dims,
        dtype: DType,
        device: Device,
        read_only: bool,
    ) -> Result<Tensor> {
        let m = Meta {
            data,
            byte_offset,
            shape,
            strides,
            dtype,
            device,
            read_only,
        };
        let ext = check_view(&m, Origin::Foreign)?;
        Ok(Tensor::new(m, ext, owner))
    }

    /// [`Tensor::from_raw_parts`] on borrowed shape and strides (a producer's arrays): they
    /// are copied once, straight into the view's allocation, and the copies are validated
    /// there (never the producer's arrays, which could change in between). The import path
    /// of every call's tensor arguments. On a refusal `owner` is dropped before returning.
    /// With `spare` (an earlier view's allocation, `into_spare`) no memory is allocated.
    ///
    /// # Safety
    /// As [`Tensor::from_raw_parts`].
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub unsafe fn from_raw_slices<K: Keepalive + 'static>(
        spare: Option<SpareView<K>>,
        owner: K,
        data: *mut u8,
        byte_offset: u64,
        shape: &[i64],
        strides: &[i64],
        dtype: DType,
        device: Device,
        read_only: bool,
    ) -> Result<Tensor> {
        if (&owner as &dyn Any).is::<Tensor>() {
            // A tensor as owner: `new` keeps its root owner instead (rare, off the call path).
            // SAFETY: forwarded.
            return unsafe {
                Tensor::from_raw_parts(
                    owner,
                    data,
                    byte_offset,
                    shape.into(),
                    strides.into(),
                    dtype,
                    device,
                    read_only,
                )
            };
        }
        let mut checked = Ok(());
        let t = Tensor::alloc(spare, owner, |m| {
            // SAFETY: `alloc` hands a writable, uninitialised `Meta`; every field is written
            // once before it is read.
            unsafe {
                (&raw mut (*m).data).write(data);
                (&raw mut (*m).byte_offset).write(byte_offset);
                fill_dims(&raw mut (*m).shape, shape);
                fill_dims(&raw mut (*m).strides, strides);
                (&raw mut (*m).dtype).write(dtype);
                (&raw mut (*m).device).write(device);
                (&raw mut (*m).read_only).write(read_only);
                match check_view(&*m, Origin::Foreign) {
                    Ok(ext) => ext,
                    Err(e) => {
                        checked = Err(e);
                        // Only so that the refused view is whole when it drops (with `owner`).
                        layout::Extent {
                            numel: 0,
                            lo: 0,
                            hi: 0,
                        }
                    }
                }
            }
        });
        checked.map(|()| t)
    }

    #[inline]
    pub fn shape(&self) -> &[i64] {
        &self.0.m.shape
    }
    #[inline]
    pub fn strides(&self) -> &[i64] {
        &self.0.m.strides
    }
    #[inline]
    pub fn ndim(&self) -> usize {
        self.0.m.shape.len()
    }
    #[inline]
    pub fn dtype(&self) -> DType {
        self.0.m.dtype
    }
    #[inline]
    pub fn device(&self) -> Device {
        self.0.m.device
    }
    #[inline]
    pub fn is_read_only(&self) -> bool {
        self.0.m.read_only
    }
    #[inline]
    pub fn numel(&self) -> i64 {
        // Validated to fit in i64 by every constructor.
        self.0.ext.numel
    }
    pub fn is_compact(&self) -> bool {
        layout::is_compact(&self.0.m.shape, &self.0.m.strides)
    }
    /// The base pointer as the producer gave it (before `byte_offset`).
    #[inline]
    pub fn raw_data(&self) -> *mut u8 {
        self.0.m.data
    }
    #[inline]
    pub fn byte_offset(&self) -> u64 {
        self.0.m.byte_offset
    }
    /// Address of the element at index (0, 0, ...).
    #[inline]
    pub fn data_ptr(&self) -> *mut u8 {
        self.0.m.data.wrapping_add(self.0.m.byte_offset as usize)
    }
    /// Half-open byte range `[lo, hi)` the tensor touches; `None` when it is empty.
    #[inline]
    pub fn byte_range(&self) -> Option<(usize, usize)> {
        let ext = self.extent();
        if ext.numel == 0 {
            return None;
        }
        // No wrap: `check_address` proved the range lies inside the address space.
        let base = self.data_ptr() as usize;
        Some((
            base.wrapping_add_signed(ext.lo as isize),
            base.wrapping_add(ext.hi as usize),
        ))
    }

    /// The validated element count and byte extent around the first element.
    #[inline]
    pub fn extent(&self) -> layout::Extent {
        self.0.ext
    }

    /// Strides in bytes (numpy's unit), exact: validated to fit in i64.
    pub fn byte_strides(&self) -> Dims {
        let size = self.0.m.dtype.size() as i64;
        self.0.m.strides.iter().map(|s| s * size).collect()
    }

    /// A new view: this one's fields, changed by `edit` (which must keep the layout: the
    /// extent is reused); it keeps this view (and so the memory's owner) alive.
    fn with(&self, edit: impl FnOnce(&mut Meta)) -> Tensor {
        let mut m = self.0.m.clone();
        edit(&mut m);
        debug_assert!(m.shape == self.0.m.shape && m.strides == self.0.m.strides);
        Tensor::new(m, self.0.ext, self.clone())
    }

    /// The same memory, marked read-only (writers through this view are refused).
    pub fn to_read_only(&self) -> Tensor {
        self.with(|v| v.read_only = true)
    }

    /// A view with another layout over this view's memory. The new layout must address only
    /// elements inside this view's span, so a view can never reach memory its parent could not.
    /// All offsets are computed in checked `i128`; the view then passes the same validation
    /// as any import.
    pub fn as_strided(&self, shape: &[i64], strides: &[i64], elem_offset: i64) -> Result<Tensor> {
        let size = self.0.m.dtype.size() as i128;
        let ext = layout::validate(shape, strides, self.0.m.dtype.size())
            .map_err(|e| layout_error(e, Origin::Rivet))?;
        let off = elem_offset as i128 * size; // |off| < 2^66: no overflow in i128
        if ext.numel > 0 {
            let parent = self.extent();
            if parent.numel == 0 {
                return Err(Error::Shape(
                    "cannot take a non-empty view of an empty tensor".into(),
                ));
            }
            let (lo, hi) = (off + ext.lo as i128, off + ext.hi as i128);
            if lo < parent.lo as i128 || hi > parent.hi as i128 {
                return Err(Error::Shape(format!(
                    "view shape {shape:?} strides {strides:?} offset {elem_offset} reaches bytes [{lo}, {hi}) outside the parent's [{}, {})",
                    parent.lo, parent.hi
                )));
            }
        }
        let byte_offset = self.0.m.byte_offset as i128 + off;
        let mut m = self.0.m.clone();
        m.shape = shape.into();
        m.strides = strides.into();
        if byte_offset < 0 || byte_offset > isize::MAX as i128 {
            // Out-of-range offsets are folded into the data pointer (DLPack's offset is
            // unsigned); for a non-empty view this stays inside the parent, as checked above.
            let first = (m.data as i128)
                .checked_add(byte_offset)
                .filter(|&a| (0..=usize::MAX as i128).contains(&a));
            let Some(first) = first else {
                return Err(Error::Shape(format!(
                    "view offset {elem_offset} moves the data pointer out of the address space"
                )));
            };
            m.data = m
                .data
                .wrapping_add((first as usize).wrapping_sub(m.data as usize));
            m.byte_offset = 0;
        } else {
            m.byte_offset = byte_offset as u64;
        }
        let ext = check_view(&m, Origin::Rivet)?;
        Ok(Tensor::new(m, ext, self.clone()))
    }

    /// Checks that the tensor may be written as `arg`: writable and free of self-overlap.
    pub fn check_writable(&self, arg: ArgName<'_>, func: &str) -> Result<()> {
        if self.0.m.read_only {
            return Err(Error::ReadOnly(format!(
                "{func}: {arg} is written by the function but the tensor is read-only (a jax.Array, a non-writeable numpy array or a read-only DLPack export); pass a writable tensor"
            )));
        }
        if layout::may_self_overlap(&self.0.m.shape, &self.0.m.strides) {
            return Err(Error::Layout(format!(
                "{func}: {arg} is written by the function but its elements overlap in memory (shape {:?}, strides {:?}, e.g. an expanded/broadcast view); pass a tensor whose elements are distinct",
                self.shape(),
                self.strides()
            )));
        }
        Ok(())
    }

    fn check_host(&self, what: &str) -> Result<()> {
        if !self.0.m.device.is_host() {
            return Err(Error::Device(format!(
                "{what} needs a CPU tensor, got one on {}",
                self.0.m.device
            )));
        }
        Ok(())
    }

    /// The elements in row-major order (a gather over any strides).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_host("Tensor::to_vec")?;
        if T::DTYPE != self.0.m.dtype {
            return Err(Error::DType(format!(
                "Tensor::to_vec::<{}> on a {} tensor",
                T::DTYPE,
                self.0.m.dtype
            )));
        }
        // A broadcast view may have far more elements than memory: size the copy checked and
        // reserve fallibly, so an impossible copy is an error, not an abort.
        let bytes = crate::alloc::tensor_bytes(self.shape(), self.dtype())?;
        let mut out = Vec::new();
        out.try_reserve_exact(self.numel() as usize).map_err(|_| {
            Error::Memory(format!(
                "out of memory: the system refused {bytes} bytes for a copy of a {} tensor of shape {:?}",
                self.dtype(),
                self.shape()
            ))
        })?;
        let mut idx = vec![0i64; self.ndim()];
        if self.numel() == 0 {
            return Ok(out);
        }
        if std::mem::size_of::<T>() != self.dtype().size() {
            return Err(Error::DType(format!(
                "Tensor::to_vec: the element type has size {} but {} elements have size {}",
                std::mem::size_of::<T>(),
                self.dtype(),
                self.dtype().size()
            )));
        }
        let base = self.data_ptr() as *const T;
        loop {
            let off: i64 = idx.iter().zip(&self.0.m.strides).map(|(i, s)| i * s).sum();
            // SAFETY: idx is inside shape, so the offset is inside the validated layout. The
            // read is unaligned: foreign memory (a DLPack byte_offset) need not be aligned
            // for T. A bool is read as its byte, so a byte other than 0 and 1 written by a
            // foreign producer is `true`, not an invalid bool.
            out.push(unsafe {
                let p = base.offset(off as isize);
                if T::DTYPE == DType::Bool {
                    let b = (p as *const u8).read() != 0;
                    std::mem::transmute_copy::<bool, T>(&b)
                } else {
                    p.read_unaligned()
                }
            });
            let mut d = self.ndim();
            loop {
                if d == 0 {
                    return Ok(out);
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < self.0.m.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }

    /// A compact copy in fresh rivet memory (what DLPack's `copy=True` asks for).
    pub fn copy_compact(&self) -> Result<Tensor> {
        self.check_host("Tensor::copy_compact")?;
        self.copy_into(Tensor::zeros(&self.0.m.shape, self.0.m.dtype)?)
    }

    /// A compact copy in a new shared-memory segment (`ipc` shares a tensor that is not in
    /// shared memory by copying it once, when asked to).
    pub fn copy_compact_shared(&self) -> Result<Tensor> {
        self.check_host("Tensor::copy_compact_shared")?;
        self.copy_into(Tensor::zeros_shared(&self.0.m.shape, self.0.m.dtype)?)
    }

    /// Copies every element into `out`, a fresh compact tensor of the same shape and dtype.
    fn copy_into(&self, out: Tensor) -> Result<Tensor> {
        let size = self.0.m.dtype.size();
        let nest = layout::LoopNest::new(&self.0.m.shape, [&out.0.m.strides, &self.0.m.strides]);
        let (n, [so, si]) = nest.inner();
        for row in 0..if self.numel() == 0 { 0 } else { nest.rows() } {
            let [oo, oi] = nest.row_offsets(row);
            if so == 1 && si == 1 {
                // A contiguous run on both sides: one copy (the common case, compact inputs).
                // SAFETY: the run [oi, oi + n) / [oo, oo + n) is inside both validated layouts.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.data_ptr().offset((oi * size as i64) as isize),
                        out.data_ptr().offset((oo * size as i64) as isize),
                        n as usize * size,
                    )
                }
                continue;
            }
            for k in 0..n {
                // SAFETY: offsets come from indices inside the shared shape of two validated layouts.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.data_ptr()
                            .offset(((oi + k * si) * size as i64) as isize),
                        out.data_ptr()
                            .offset(((oo + k * so) * size as i64) as isize),
                        size,
                    )
                }
            }
        }
        Ok(out)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({}, shape={:?}, strides={:?}, {}{})",
            self.0.m.dtype,
            self.0.m.shape.as_slice(),
            self.0.m.strides.as_slice(),
            self.0.m.device,
            if self.0.m.read_only {
                ", read-only"
            } else {
                ""
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `from_raw_slices` (the call path's in-place import) and `from_raw_parts` agree on every
    /// layout, hostile ones included: the same view or the same error, and the owner dropped
    /// exactly once, right away on a refusal. `from_raw_slices` runs in the previous case's
    /// spare allocation (`into_spare`, which drops the owner) whenever there is one.
    #[test]
    fn from_raw_slices_matches_from_raw_parts() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Counted(Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let base = 0x1000_0000usize as *mut u8;
        let big = 1i64 << 31;
        let cases: Vec<(*mut u8, u64, Vec<i64>, Vec<i64>)> = vec![
            (base, 0, vec![4], vec![1]),
            (base, 8, vec![2, 3], vec![3, 1]),
            (base, 0, vec![], vec![]),
            (base, 0, vec![3, 0], vec![-5, 1]),
            (std::ptr::null_mut(), 0, vec![0], vec![1]),
            (std::ptr::null_mut(), 0, vec![2], vec![1]),
            (
                base,
                0,
                vec![2, 2, 2, 2, 2, 2, 2, 2],
                vec![128, 64, 32, 16, 8, 4, 2, 1],
            ),
            (base, 0, vec![big, 2], vec![1, big]),
            (base, 0, vec![big + 1], vec![1]),
            (base, 0, vec![2], vec![1 << 62]),
            (base, 0, vec![2], vec![i64::MIN]),
            (base, 0, vec![i64::MIN], vec![1]),
            (base, 0, vec![-1], vec![1]),
            (base, 0, vec![3], vec![-1]),
            (base, 0, vec![1 << 62, 4], vec![0, 1]),
            (base, u64::MAX, vec![1], vec![1]),
            (usize::MAX as *mut u8, 0, vec![2], vec![1]),
        ];
        let mut spare: Option<SpareView<Counted>> = None;
        let mut reused = 0;
        for (data, off, shape, strides) in cases {
            let (n1, n2) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            // SAFETY: nothing reads the memory; the layouts are only validated and compared.
            let a = unsafe {
                Tensor::from_raw_parts(
                    Counted(n1.clone()),
                    data,
                    off,
                    Dims::from_slice(&shape),
                    Dims::from_slice(&strides),
                    DType::F32,
                    Device::Cpu,
                    true,
                )
            };
            // SAFETY: as above.
            reused += usize::from(spare.is_some());
            let b = unsafe {
                Tensor::from_raw_slices(
                    spare.take(),
                    Counted(n2.clone()),
                    data,
                    off,
                    &shape,
                    &strides,
                    DType::F32,
                    Device::Cpu,
                    true,
                )
            };
            match (&a, &b) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(
                        (
                            a.shape(),
                            a.strides(),
                            a.extent(),
                            a.raw_data(),
                            a.byte_offset()
                        ),
                        (
                            b.shape(),
                            b.strides(),
                            b.extent(),
                            b.raw_data(),
                            b.byte_offset()
                        )
                    );
                    assert!(b.is_read_only() && b.dtype() == DType::F32);
                    assert_eq!(n2.load(Ordering::Relaxed), 0, "{shape:?}");
                }
                (Err(ea), Err(eb)) => {
                    assert_eq!(ea.to_string(), eb.to_string());
                    assert_eq!(
                        n2.load(Ordering::Relaxed),
                        1,
                        "refused {shape:?}: owner dropped"
                    );
                }
                _ => panic!(
                    "{shape:?} {strides:?}: {:?} against {:?}",
                    a.is_ok(),
                    b.is_ok()
                ),
            }
            drop(a);
            if let Ok(b) = b {
                let held = b.clone();
                // Another handle: refused, the view given back whole.
                let b = b.into_spare::<Counted>().err().expect("another handle");
                drop(held);
                // Another owner type: refused likewise.
                let b = b.into_spare::<()>().err().expect("another owner type");
                assert_eq!(n2.load(Ordering::Relaxed), 0);
                spare = Some(
                    b.into_spare::<Counted>()
                        .ok()
                        .expect("unique, owned by Counted"),
                );
            }
            assert_eq!(
                (n1.load(Ordering::Relaxed), n2.load(Ordering::Relaxed)),
                (1, 1)
            );
        }
        assert!(reused >= 5, "{reused}");
        // A tensor as owner keeps its root owner (the `new` rule) on this path too.
        let t = Tensor::from_slice(&[1f32, 2., 3., 4.], &[4]).unwrap();
        let v = t.as_strided(&[2], &[2], 0).unwrap();
        // SAFETY: `v` keeps `t`'s memory alive.
        let w = unsafe {
            Tensor::from_raw_slices(
                None,
                v.clone(),
                v.raw_data(),
                v.byte_offset(),
                &[2],
                &[1],
                DType::F32,
                Device::Cpu,
                false,
            )
        }
        .unwrap();
        assert!(w.owner().downcast_ref::<Tensor>().is_some());
        assert_eq!(w.to_vec::<f32>().unwrap(), [1.0, 2.0]);
    }

    #[test]
    fn from_slice_refuses_negative_dims_whose_product_matches() {
        for shape in [&[-1i64, -3][..], &[i64::MIN, -1], &[-1]] {
            let e = Tensor::from_slice(&[1f32, 2., 3.], shape).unwrap_err();
            assert!(
                matches!(&e, Error::Shape(m) if m.contains("negative size")),
                "{shape:?}: {e}"
            );
        }
    }

    #[test]
    fn a_million_nested_views_drop_without_deep_recursion() {
        // Each view made from the last (as_strided, read-only views, narrowing offsets): the
        // owners stay two levels deep, so the drop below does not overflow the stack (it did
        // at about 10,000 levels when each view kept its parent).
        let base =
            Tensor::from_slice(&(0..64).map(|v| v as f32).collect::<Vec<_>>(), &[64]).unwrap();
        let mut t = base.clone();
        for k in 0..1_000_000 {
            t = match k % 3 {
                0 => t.as_strided(&[8, 8], &[8, 1], 0).unwrap(),
                1 => t.to_read_only(),
                _ => t.as_strided(&[64], &[1], 0).unwrap(),
            };
        }
        assert_eq!(t.to_vec::<f32>().unwrap()[63], 63.0);
        assert!(t.is_read_only());
        let depth = |t: &Tensor| {
            let mut d = 0;
            let mut cur = t.0._owner.as_any().downcast_ref::<Tensor>();
            while let Some(p) = cur {
                d += 1;
                cur = p.0._owner.as_any().downcast_ref::<Tensor>();
            }
            d
        };
        assert!(depth(&t) <= 1, "depth {}", depth(&t));
        // A narrowed view still cannot reach past its parent: the extent check is the parent's
        // (the view's), not the root's.
        let narrow = base.as_strided(&[4], &[1], 10).unwrap();
        assert!(narrow.as_strided(&[5], &[1], 0).is_err());
        drop(base);
        drop(t);
        assert_eq!(narrow.to_vec::<f32>().unwrap(), [10.0, 11.0, 12.0, 13.0]);
    }

    #[test]
    fn to_vec_reads_foreign_bytes_unaligned_and_bools_normalised() {
        // Foreign memory: bytes 1..13 of a Vec as three f32 (unaligned), and bytes holding
        // 0, 2, 1 as bools (a producer may write any byte there).
        let mut bytes = vec![0u8; 16];
        for (k, v) in [1.5f32, -2.0, 3.25].iter().enumerate() {
            bytes[1 + 4 * k..5 + 4 * k].copy_from_slice(&v.to_ne_bytes());
        }
        let owner = bytes;
        let ptr = owner.as_ptr() as *mut u8;
        // SAFETY: `owner` holds the 16 bytes for as long as the view lives.
        let f = unsafe {
            Tensor::from_raw_parts(
                owner,
                ptr,
                1,
                smallvec::smallvec![3],
                smallvec::smallvec![1],
                DType::F32,
                Device::Cpu,
                true,
            )
        }
        .unwrap();
        assert_eq!(f.to_vec::<f32>().unwrap(), [1.5, -2.0, 3.25]);
        let flags = vec![0u8, 2, 1];
        let ptr = flags.as_ptr() as *mut u8;
        // SAFETY: `flags` holds the 3 bytes for as long as the view lives.
        let b = unsafe {
            Tensor::from_raw_parts(
                flags,
                ptr,
                0,
                smallvec::smallvec![3],
                smallvec::smallvec![1],
                DType::Bool,
                Device::Cpu,
                true,
            )
        }
        .unwrap();
        assert_eq!(b.to_vec::<bool>().unwrap(), [false, true, true]);
    }

    #[test]
    fn zeros_are_aligned_and_compact() {
        let t = Tensor::zeros(&[3, 5], DType::F32).unwrap();
        assert_eq!(t.data_ptr() as usize % crate::alloc::ALIGN, 0);
        assert!(t.is_compact());
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0; 15]);
        let e = Tensor::zeros(&[0, 5], DType::F64).unwrap();
        assert_eq!(e.numel(), 0);
        assert!(e.byte_range().is_none());
    }

    #[test]
    fn views_stay_inside_parent() {
        let t = Tensor::from_slice(&[0f32, 1., 2., 3., 4., 5.], &[2, 3]).unwrap();
        let tt = t.as_strided(&[3, 2], &[1, 3], 0).unwrap();
        assert_eq!(tt.to_vec::<f32>().unwrap(), vec![0., 3., 1., 4., 2., 5.]);
        let rev = t.as_strided(&[3], &[-1], 5).unwrap();
        assert_eq!(rev.to_vec::<f32>().unwrap(), vec![5., 4., 3.]);
        assert!(t.as_strided(&[4], &[2], 0).is_err());
        assert_eq!(
            tt.copy_compact().unwrap().to_vec::<f32>().unwrap(),
            vec![0., 3., 1., 4., 2., 5.]
        );
    }

    #[test]
    fn writability_checks() {
        let t = Tensor::from_slice(&[1f32; 5], &[5]).unwrap();
        let arg = ArgName {
            index: 2,
            name: Some("y"),
        };
        assert!(t.check_writable(arg, "f").is_ok());
        let e = t.to_read_only().check_writable(arg, "f").unwrap_err();
        assert!(matches!(e, Error::ReadOnly(_)) && e.to_string().contains("argument 2 ('y')"));
        let b = t.as_strided(&[4, 5], &[0, 1], 0).unwrap();
        assert!(matches!(b.check_writable(arg, "f"), Err(Error::Layout(_))));
    }
}
