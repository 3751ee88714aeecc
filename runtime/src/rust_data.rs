//! Rust-owned data as tensors and back: `Vec`s and slices, and `ndarray` arrays (feature
//! `ndarray`), so a Rust program or test can run kernels without Python.
//!
//! - [`Tensor::from_vec`] takes the `Vec`'s buffer as the tensor's memory (no copy); the
//!   buffer is freed as a `Vec<T>` when the last view drops.
//! - [`Tensor::into_vec`] gives that `Vec` back without a copy when the tensor is its only
//!   handle and views the whole `Vec` in row-major order; otherwise it copies ([`Tensor::to_vec`]).
//! - [`Tensor::as_slice`] lends the elements of a compact CPU tensor, no copy.
//! - With the `ndarray` feature: `Tensor::from_ndarray` (no copy, any ndarray layout,
//!   negative strides included: ndarray's strides and offset become the tensor's),
//!   `Tensor::to_ndarray` (a copy) and `Tensor::view_ndarray` (no copy, any strides).
//!
//! Invariants:
//! - A `Vec` given to a tensor is owned by a `VecOwner`, which frees it with its own element
//!   type, length and capacity, exactly once (never through rivet's 64-byte-aligned
//!   allocator, whose layout differs). Its memory is aligned to `T`, which is all kernels
//!   need (DLPack imports promise no more).
//! - Every view made here addresses only elements of its `Vec` (checked in `i128` for
//!   ndarray layouts, whose offset and strides come from outside) and passes the same layout
//!   validation as every tensor.
//! - Borrows (`as_slice`, `view_ndarray`) are lent only when no other handle can reach the
//!   memory: tensors are shared handles and kernels write through any of them, so a `&[T]`
//!   over memory another clone can hand to a kernel would be unsound. The proof is at run
//!   time (`memory_is_exclusive`): this handle is the view's only one, and its owner is
//!   rivet's own memory (an [`Allocation`] or a `VecOwner`), or a view that is in turn held
//!   only by it. The `&mut self` receiver keeps it so while the borrow lives (no clone can be
//!   made). No `&mut [T]` is given out: the same proof would allow it, but writes go through
//!   kernels, and `Tensor::from_vec` over a `Vec` the caller filled first is the Rust way.
//! - Sizes: shapes are checked (sign, rank, product in checked `i64`) before they meet the
//!   `Vec`; a mismatch is an [`Error::Shape`] naming the argument, never a panic.

use crate::alloc::Allocation;
use crate::error::{Error, Result};
use crate::layout;
use crate::tensor::{Element, Tensor};
use std::any::TypeId;
use std::mem::{align_of, size_of, ManuallyDrop};

/// A `Vec<T>`'s buffer, type-erased so that the runtime can recognise it as its owner
/// (`TypeId` of the element) and free it as the very `Vec<T>` it was.
pub(crate) struct VecOwner {
    ptr: *mut u8,
    len: usize,
    cap: usize,
    elem: TypeId,
    /// `drop_vec::<T>` for the `T` the buffer came from.
    free: unsafe fn(*mut u8, usize, usize),
}

// SAFETY: the buffer is owned uniquely by this value and its elements are `Element`s
// (`Send + Sync`); freeing it from any thread is fine.
unsafe impl Send for VecOwner {}
// SAFETY: `VecOwner` exposes no access to the elements itself; tensors that write through the
// pointer synchronise like any framework tensor would.
unsafe impl Sync for VecOwner {}

/// # Safety
/// `(ptr, len, cap)` must be the raw parts of a `Vec<T>` not freed or used since.
unsafe fn drop_vec<T>(ptr: *mut u8, len: usize, cap: usize) {
    // SAFETY: the caller's promise.
    drop(unsafe { Vec::from_raw_parts(ptr as *mut T, len, cap) })
}

impl VecOwner {
    fn new<T: Element>(v: Vec<T>) -> VecOwner {
        // ManuallyDrop, not a moved `Vec`: the pointer is taken once and no `Vec` exists while
        // tensors use it, so nothing can claim unique access to the buffer behind their back.
        let mut v = ManuallyDrop::new(v);
        VecOwner {
            ptr: v.as_mut_ptr() as *mut u8,
            len: v.len(),
            cap: v.capacity(),
            elem: TypeId::of::<T>(),
            free: drop_vec::<T>,
        }
    }

    /// The `Vec` back, if it holds `T`s (else `self` is dropped, freeing it).
    fn into_vec<T: Element>(self) -> Option<Vec<T>> {
        if self.elem != TypeId::of::<T>() {
            return None;
        }
        let me = ManuallyDrop::new(self);
        // SAFETY: the raw parts of a `Vec<T>` (same `TypeId`), not freed: `me` is not dropped.
        Some(unsafe { Vec::from_raw_parts(me.ptr as *mut T, me.len, me.cap) })
    }
}

impl Drop for VecOwner {
    fn drop(&mut self) {
        // SAFETY: `free` is `drop_vec::<T>` for the `T` these raw parts came from; drop runs once.
        unsafe { (self.free)(self.ptr, self.len, self.cap) }
    }
}

/// `T`'s size against its dtype's: `Element` is a safe trait, so a wrong impl outside rivet
/// must be an error here rather than out-of-bounds reads.
fn check_element<T: Element>(func: &str) -> Result<()> {
    if size_of::<T>() != T::DTYPE.size() || align_of::<T>() > size_of::<T>() {
        return Err(Error::DType(format!(
            "{func}: the Element impl of {} claims dtype {} ({} bytes) but the type has size {} and alignment {}",
            std::any::type_name::<T>(),
            T::DTYPE,
            T::DTYPE.size(),
            size_of::<T>(),
            align_of::<T>()
        )));
    }
    Ok(())
}

/// The element count of a user-given shape, checked before any size arithmetic: rank, sign,
/// and the product (zero dims counted as one, as numpy and `layout::validate` do) in `i64`.
pub(crate) fn checked_numel(func: &str, shape: &[i64]) -> Result<i64> {
    if shape.len() > layout::MAX_NDIM {
        return Err(Error::Shape(format!(
            "{func}: argument 'shape' has {} dims, over rivet's limit of {}",
            shape.len(),
            layout::MAX_NDIM
        )));
    }
    if let Some(dim) = shape.iter().position(|&n| n < 0) {
        return Err(Error::Shape(format!(
            "{func}: argument 'shape' {shape:?} has negative size {} at dim {dim}; sizes must be >= 0",
            shape[dim]
        )));
    }
    let nonzero = shape
        .iter()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d.max(1)));
    match nonzero {
        None => Err(Error::Shape(format!(
            "{func}: argument 'shape' {shape:?} has more elements than fit in int64 (the product of its sizes overflows)"
        ))),
        Some(_) if shape.contains(&0) => Ok(0),
        Some(n) => Ok(n),
    }
}

/// True when no handle but `t` can reach `t`'s memory (see the header): walks the chain of
/// views (a view's owner is the tensor it was made from), each held only by the one before,
/// down to rivet-owned memory. A loop, not recursion: chains of views can be long.
fn memory_is_exclusive(t: &mut Tensor) -> bool {
    let mut t = t;
    loop {
        let Some(owner) = t.unique_owner_mut() else {
            return false;
        };
        if owner.is::<Tensor>() {
            t = owner.downcast_mut::<Tensor>().expect("checked by `is`");
            continue;
        }
        // Shared-memory segments, foreign (DLPack) owners and anything else: other processes
        // or producers may write the memory.
        return owner.is::<Allocation>() || owner.is::<VecOwner>();
    }
}

impl Tensor {
    /// A compact CPU tensor of `shape` over `v`'s buffer, without a copy: the tensor owns the
    /// `Vec` and frees it when its last view drops.
    ///
    /// `shape`'s element count must equal `v.len()`; a negative size, an overflowing product
    /// or a mismatch is an [`Error::Shape`].
    ///
    /// ```
    /// use rivet_runtime::Tensor;
    /// let v = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    /// let ptr = v.as_ptr();
    /// let t = Tensor::from_vec(v, &[2, 3]).unwrap();
    /// assert_eq!(t.data_ptr() as *const f32, ptr); // the same memory, not a copy
    /// assert_eq!(t.shape(), &[2, 3]);
    /// assert!(Tensor::from_vec(vec![0i32; 5], &[2, 3]).is_err());
    /// ```
    pub fn from_vec<T: Element>(v: Vec<T>, shape: &[i64]) -> Result<Tensor> {
        const F: &str = "Tensor::from_vec";
        check_element::<T>(F)?;
        let n = checked_numel(F, shape)?;
        // `v.len() <= isize::MAX`, so the comparison in u64 is exact.
        if n as u64 != v.len() as u64 {
            return Err(Error::Shape(format!(
                "{F}: argument 'shape' {shape:?} holds {n} elements but argument 'v' has {} values; they must match",
                v.len()
            )));
        }
        let owner = VecOwner::new(v);
        let data = owner.ptr;
        Tensor::owned_view(
            owner,
            data,
            0,
            shape,
            &layout::compact_strides(shape),
            T::DTYPE,
        )
    }

    /// The elements in row-major order as a `Vec`. Without a copy when this is the tensor's
    /// only handle and it views a whole `Vec` given to [`Tensor::from_vec`] (or a standard-layout
    /// array given to `Tensor::from_ndarray`) in row-major order; otherwise a copy, as
    /// [`Tensor::to_vec`]. A dtype other than `T`'s is an [`Error::DType`].
    ///
    /// ```
    /// use rivet_runtime::Tensor;
    /// let v = vec![1i64, 2, 3, 4];
    /// let ptr = v.as_ptr();
    /// let t = Tensor::from_vec(v, &[2, 2]).unwrap();
    /// let back = t.into_vec::<i64>().unwrap();
    /// assert_eq!((back.as_ptr(), back), (ptr, vec![1, 2, 3, 4])); // no copy either way
    /// ```
    pub fn into_vec<T: Element>(mut self) -> Result<Vec<T>> {
        check_element::<T>("Tensor::into_vec")?;
        if T::DTYPE != self.dtype() {
            return Err(Error::DType(format!(
                "Tensor::into_vec::<{}> on a {} tensor; expected dtype {}",
                T::DTYPE,
                self.dtype(),
                self.dtype()
            )));
        }
        let (data, compact, numel) = (self.data_ptr(), self.is_compact(), self.numel());
        if compact {
            if let Some(owner) = self
                .unique_owner_mut()
                .and_then(|o| o.downcast_mut::<VecOwner>())
            {
                if owner.elem == TypeId::of::<T>() && owner.ptr == data && owner.len as i64 == numel
                {
                    // Leave an empty `Vec` behind: the view is dropped right after, and an
                    // empty `Vec` frees nothing.
                    let whole = std::mem::replace(owner, VecOwner::new(Vec::<u8>::new()));
                    drop(self);
                    return whole.into_vec::<T>().ok_or_else(|| {
                        Error::Internal("into_vec: element TypeId changed under us".into())
                    });
                }
            }
        }
        self.to_vec()
    }

    /// The elements of a compact CPU tensor, borrowed, no copy.
    ///
    /// Takes `&mut self` and needs this handle to be the only way to the memory (no clone of
    /// the tensor, or of the tensor it is a view of, alive; memory rivet allocated or a
    /// `Vec`/ndarray given to it): another handle could be passed to a kernel that writes
    /// while the slice is borrowed. Otherwise, or for a non-compact tensor, an
    /// [`Error::Layout`] that points to [`Tensor::to_vec`] (a copy, always allowed).
    ///
    /// ```
    /// use rivet_runtime::Tensor;
    /// let mut t = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3]).unwrap();
    /// assert_eq!(t.as_slice::<f64>().unwrap(), &[1.0, 2.0, 3.0]);
    /// let other = t.clone(); // a second handle: no borrow while it lives
    /// assert!(t.as_slice::<f64>().is_err());
    /// drop(other);
    /// assert!(t.as_slice::<f32>().is_err()); // wrong dtype
    /// ```
    pub fn as_slice<T: Element>(&mut self) -> Result<&[T]> {
        const F: &str = "Tensor::as_slice";
        let (ptr, n) = self.exclusive_host_elements::<T>(F)?;
        if !self.is_compact() {
            return Err(Error::Layout(format!(
                "{F}: the tensor is not compact (shape {:?}, strides {:?}); use Tensor::to_vec for a row-major copy",
                self.shape(),
                self.strides()
            )));
        }
        if n == 0 {
            return Ok(&[]);
        }
        // SAFETY: a compact non-empty view: `n` elements of `T` (dtype and size checked) from
        // `ptr`, aligned (checked), inside memory its owner keeps alive as long as `self`;
        // no other handle reaches that memory, and `&mut self` keeps it so for the borrow.
        Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
    }

    /// The checks every borrow makes: dtype, device, `T` itself, exclusive memory and an
    /// aligned first element. Gives that element's pointer and the element count.
    fn exclusive_host_elements<T: Element>(&mut self, func: &str) -> Result<(*const T, usize)> {
        check_element::<T>(func)?;
        if T::DTYPE != self.dtype() {
            return Err(Error::DType(format!(
                "{func}::<{}> on a {} tensor; expected dtype {}",
                T::DTYPE,
                self.dtype(),
                self.dtype()
            )));
        }
        if !self.device().is_host() {
            return Err(Error::Device(format!(
                "{func} needs a CPU tensor, got one on {}",
                self.device()
            )));
        }
        let ptr = self.data_ptr() as *const T;
        let n = self.numel() as usize; // validated: 0 <= numel <= i64::MAX
        if !memory_is_exclusive(self) {
            return Err(Error::Layout(format!(
                "{func}: the tensor's memory can be reached through another handle (a clone of this tensor or of the tensor it views, or shared or foreign memory), which a kernel could write while it is borrowed; drop the other handles, or use a copy (Tensor::to_vec)"
            )));
        }
        if n > 0 && !(ptr as usize).is_multiple_of(align_of::<T>()) {
            // Rivet-owned memory is aligned to its element type; anything else is a bug.
            return Err(Error::Internal(format!(
                "{func}: rivet-owned memory at {ptr:p} is not aligned to {}",
                align_of::<T>()
            )));
        }
        Ok((ptr, n))
    }
}

#[cfg(feature = "ndarray")]
mod with_ndarray {
    use super::*;
    use ndarray::{Array, ArrayD, ArrayViewD, Axis, Dimension, IxDyn, ShapeBuilder};

    impl Tensor {
        /// A CPU tensor over `a`'s buffer, without a copy, in any layout the array has:
        /// its shape, strides (negative ones included) and offset become the tensor's. A
        /// sliced array keeps its whole buffer alive.
        ///
        /// ```
        /// use ndarray::{array, s};
        /// use rivet_runtime::Tensor;
        /// let a = array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
        /// let ptr = a.as_ptr();
        /// let t = Tensor::from_ndarray(a).unwrap();
        /// assert_eq!((t.shape(), t.data_ptr() as *const f32), (&[2i64, 3][..], ptr));
        /// let r = Tensor::from_ndarray(array![1i32, 2, 3, 4].slice_move(s![..;-2])).unwrap();
        /// assert_eq!(r.strides(), &[-2]);
        /// assert_eq!(r.to_vec::<i32>().unwrap(), vec![4, 2]);
        /// ```
        pub fn from_ndarray<T: Element, D: Dimension>(a: Array<T, D>) -> Result<Tensor> {
            const F: &str = "Tensor::from_ndarray";
            check_element::<T>(F)?;
            let internal = |what: &str| Error::Internal(format!("{F}: ndarray gave {what}"));
            let shape = a
                .shape()
                .iter()
                .map(|&n| i64::try_from(n).map_err(|_| internal("a size over i64")))
                .collect::<Result<Vec<i64>>>()?;
            let strides = a
                .strides()
                .iter()
                .map(|&s| i64::try_from(s).map_err(|_| internal("a stride over i64")))
                .collect::<Result<Vec<i64>>>()?;
            let size = T::DTYPE.size();
            let ext = layout::validate(&shape, &strides, size)
                .map_err(|e| Error::Shape(format!("{F}: {e}")))?;
            let (v, offset) = a.into_raw_vec_and_offset();
            // An empty array touches nothing: start it at the buffer (ndarray's offset then
            // may point anywhere).
            let offset = if ext.numel == 0 {
                0
            } else {
                offset.unwrap_or(0)
            };
            // ndarray promises that every element lies in its buffer; memory safety depends on
            // it, so check it (in i128: no overflow) rather than trust it.
            let first = offset as i128 * size as i128;
            let end = v.len() as i128 * size as i128;
            if ext.numel > 0 && (first + (ext.lo as i128) < 0 || first + ext.hi as i128 > end) {
                return Err(internal(&format!(
                    "a layout (shape {shape:?}, strides {strides:?}, offset {offset}) outside its buffer of {} elements",
                    v.len()
                )));
            }
            let owner = VecOwner::new(v);
            let data = owner.ptr;
            Tensor::owned_view(owner, data, first as u64, &shape, &strides, T::DTYPE)
        }

        /// The elements as an owned array of the tensor's shape (standard layout): a copy,
        /// from any strides. A dtype other than `T`'s is an [`Error::DType`]; CPU only.
        ///
        /// ```
        /// use rivet_runtime::Tensor;
        /// let t = Tensor::from_slice(&[1u8, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
        /// let a = t.to_ndarray::<u8>().unwrap();
        /// assert_eq!(a, ndarray::array![[1u8, 2, 3], [4, 5, 6]].into_dyn());
        /// ```
        pub fn to_ndarray<T: Element>(&self) -> Result<ArrayD<T>> {
            check_element::<T>("Tensor::to_ndarray")?;
            let v = self.to_vec::<T>()?;
            ArrayD::from_shape_vec(IxDyn(&usize_dims(self.shape())), v)
                .map_err(|e| Error::Internal(format!("Tensor::to_ndarray: {e}")))
        }

        /// The elements as an array view with the tensor's shape and strides (in elements,
        /// negative and zero ones included), no copy. Needs this handle to be the only way to
        /// the memory, like [`Tensor::as_slice`] (else an [`Error::Layout`]; use
        /// [`Tensor::to_ndarray`] for a copy); a dtype other than `T`'s is an [`Error::DType`].
        ///
        /// ```
        /// use rivet_runtime::Tensor;
        /// let t = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]).unwrap();
        /// let mut tt = t.as_strided(&[3, 2], &[1, 3], 0).unwrap(); // a transposed view
        /// drop(t); // now `tt` is the only way to the memory
        /// let a = tt.view_ndarray::<f32>().unwrap();
        /// assert_eq!(a, ndarray::array![[0.0f32, 3.0], [1.0, 4.0], [2.0, 5.0]].into_dyn());
        /// ```
        pub fn view_ndarray<T: Element>(&mut self) -> Result<ArrayViewD<'_, T>> {
            let (ptr, n) = self.exclusive_host_elements::<T>("Tensor::view_ndarray")?;
            let shape = usize_dims(self.shape());
            if n == 0 {
                return ArrayViewD::from_shape(IxDyn(&shape), &[])
                    .map_err(|e| Error::Internal(format!("Tensor::view_ndarray: {e}")));
            }
            // ndarray's raw views take non-negative strides from the lowest element: start
            // there and flip the axes whose strides are negative back afterwards.
            let mut low = 0i64;
            let mut abs = Vec::with_capacity(shape.len());
            for (&d, &s) in self.shape().iter().zip(self.strides()) {
                if s < 0 {
                    low += (d - 1) * s; // inside the validated extent: no overflow
                }
                abs.push(s.unsigned_abs() as usize);
            }
            // SAFETY: `low` is the element offset of the lowest element, inside the layout.
            let base = unsafe { ptr.offset(low as isize) };
            // SAFETY: every element of this layout lies in memory the owner keeps alive while
            // `self` lives (validated layout, inside its owner's memory), aligned (checked);
            // no other handle reaches it and the `&mut self` borrow keeps it so for `'_`;
            // spans and counts fit in isize (the layout's invariants).
            let mut view =
                unsafe { ArrayViewD::from_shape_ptr(IxDyn(&shape).strides(IxDyn(&abs)), base) };
            for (k, &s) in self.strides().iter().enumerate() {
                if s < 0 {
                    view.invert_axis(Axis(k));
                }
            }
            Ok(view)
        }
    }

    /// Validated dims (`>= 0`, product in i64) as ndarray's `usize`s.
    fn usize_dims(shape: &[i64]) -> Vec<usize> {
        shape.iter().map(|&d| d as usize).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::dtype::DType;
    use half::{bf16, f16};

    /// `from_vec` keeps the buffer and `into_vec` gives it back, both without a copy.
    fn round_trip<T: Element + PartialEq + std::fmt::Debug>(v: Vec<T>, shape: &[i64]) {
        let (ptr, copy) = (v.as_ptr(), v.clone());
        let t = Tensor::from_vec(v, shape).unwrap();
        assert_eq!((t.dtype(), t.shape()), (T::DTYPE, shape));
        assert!(t.is_compact());
        if !copy.is_empty() {
            assert_eq!(t.data_ptr() as *const T, ptr, "from_vec copied");
        }
        assert_eq!(t.to_vec::<T>().unwrap(), copy);
        let back = t.into_vec::<T>().unwrap();
        assert_eq!(back, copy);
        if !copy.is_empty() {
            assert_eq!(back.as_ptr(), ptr, "into_vec copied");
        }
    }

    #[test]
    fn round_trips_without_copies() {
        round_trip(vec![1.5f32, -2.0, 3.25, 0.0, 7.0, 8.0], &[2, 3]);
        round_trip(vec![1.5f64, -2.0, 3.25], &[3]);
        round_trip(vec![i32::MIN, 0, i32::MAX, 7], &[2, 1, 2]);
        round_trip(vec![i64::MIN, i64::MAX], &[2]);
        round_trip(vec![f16::from_f32(1.5), f16::from_f32(-0.25)], &[1, 2]);
        round_trip(vec![bf16::from_f32(3.0)], &[]);
        round_trip(vec![true, false, true], &[3]);
        round_trip(vec![1u8, 2, 3, 4], &[4, 1]);
        round_trip(Vec::<f32>::new(), &[0]);
        round_trip(Vec::<f64>::new(), &[3, 0, 5]);
        // Spare capacity is kept and freed with the Vec.
        let mut v = Vec::with_capacity(100);
        v.extend([1i64, 2, 3]);
        let back = Tensor::from_vec(v, &[3])
            .unwrap()
            .into_vec::<i64>()
            .unwrap();
        assert_eq!((back.capacity(), back), (100, vec![1, 2, 3]));
    }

    #[test]
    fn into_vec_copies_when_it_must() {
        let v = vec![0f32, 1., 2., 3., 4., 5.];
        let ptr = v.as_ptr();
        let t = Tensor::from_vec(v, &[2, 3]).unwrap();
        // Another handle: the buffer stays with it, the caller gets a copy.
        let other = t.clone();
        let copy = t.into_vec::<f32>().unwrap();
        assert_ne!(copy.as_ptr(), ptr);
        assert_eq!(other.to_vec::<f32>().unwrap(), copy);
        // A transposed view: row-major order of the view, a copy.
        let tt = other.as_strided(&[3, 2], &[1, 3], 0).unwrap();
        drop(other);
        assert_eq!(tt.into_vec::<f32>().unwrap(), vec![0., 3., 1., 4., 2., 5.]);
        // Part of a Vec: a copy of that part.
        let t = Tensor::from_vec(vec![1i32, 2, 3, 4], &[4]).unwrap();
        let tail = t.as_strided(&[2], &[1], 2).unwrap();
        drop(t);
        assert_eq!(tail.into_vec::<i32>().unwrap(), vec![3, 4]);
        // rivet's own aligned memory cannot become a Vec (another layout): a copy.
        let z = Tensor::zeros(&[2], DType::F64).unwrap();
        assert_eq!(z.into_vec::<f64>().unwrap(), vec![0.0, 0.0]);
        let e = Tensor::from_vec(vec![1f32], &[1])
            .unwrap()
            .into_vec::<f64>()
            .unwrap_err();
        assert!(matches!(e, Error::DType(_)), "{e}");
        assert!(e.to_string().contains("float64") && e.to_string().contains("float32"));
    }

    #[test]
    fn hostile_shapes_are_errors() {
        let cases: &[(&[i64], usize)] = &[
            (&[1 << 31], 4),
            (&[(1 << 31) - 1, 2], 4),
            (&[1 << 31, 1 << 31], 4),
            (&[1 << 62, 4], 4),
            (&[i64::MAX, 2], 4),
            (&[i64::MAX], 4),
            (&[i64::MIN], 4),
            (&[i64::MIN, -1], 4),
            (&[-1, 3], 3),
            (&[-1, -3], 3),
            (&[0, -1], 0),
            (&[0, i64::MAX, i64::MAX], 0),
            (&[2, 3], 5),
            (&[2, 3], 7),
            (&[], 0),
            (&[], 2),
            (&[1; 65], 1),
        ];
        for &(shape, len) in cases {
            let e = Tensor::from_vec(vec![0f32; len], shape).unwrap_err();
            assert!(matches!(e, Error::Shape(_)), "{shape:?}: {e}");
            let m = e.to_string();
            assert!(
                m.contains("Tensor::from_vec") && m.contains("'shape'"),
                "{m}"
            );
        }
        let m = Tensor::from_vec(vec![0u8; 5], &[2, 3])
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("holds 6 elements") && m.contains("'v' has 5"),
            "{m}"
        );
        let m = Tensor::from_vec(vec![0u8; 3], &[-1, 3])
            .unwrap_err()
            .to_string();
        assert!(m.contains("negative size -1 at dim 0"), "{m}");
        let m = Tensor::from_vec(vec![0u8; 4], &[1 << 62, 4])
            .unwrap_err()
            .to_string();
        assert!(m.contains("overflows"), "{m}");
    }

    /// A type whose `Element` impl lies about its size: refused, not read out of bounds.
    #[derive(Clone, Copy)]
    struct Wide(#[allow(dead_code)] [u8; 3]);
    // SAFETY: deliberately false (size 3 for float32): the test checks it is refused.
    unsafe impl Element for Wide {
        const DTYPE: DType = DType::F32;
    }

    #[test]
    fn a_lying_element_impl_is_refused() {
        let e = Tensor::from_vec(vec![Wide([0; 3]); 2], &[2]).unwrap_err();
        assert!(
            matches!(e, Error::DType(_)) && e.to_string().contains("size 3"),
            "{e}"
        );
        let mut t = Tensor::zeros(&[2], DType::F32).unwrap();
        assert!(matches!(t.as_slice::<Wide>(), Err(Error::DType(_))));
    }

    #[test]
    fn slices_only_of_exclusive_compact_memory() {
        let v = vec![1f32, 2., 3., 4., 5., 6.];
        let ptr = v.as_ptr();
        let mut t = Tensor::from_vec(v, &[2, 3]).unwrap();
        let s = t.as_slice::<f32>().unwrap();
        assert_eq!((s.as_ptr(), s), (ptr, &[1f32, 2., 3., 4., 5., 6.][..]));
        // A second handle could reach a kernel that writes: refused, pointing to to_vec.
        let other = t.clone();
        let e = t.as_slice::<f32>().unwrap_err();
        assert!(
            matches!(e, Error::Layout(_)) && e.to_string().contains("to_vec"),
            "{e}"
        );
        // A view held alongside its parent: refused; alone (parent dropped): lent.
        let mut row = other.as_strided(&[3], &[1], 3).unwrap();
        assert!(row.as_slice::<f32>().is_err());
        drop((t, other));
        assert_eq!(row.as_slice::<f32>().unwrap(), &[4f32, 5., 6.]);
        // Views of views, alone, down to rivet memory; read-only views too.
        let z = Tensor::zeros(&[4, 4], DType::I32).unwrap();
        let mut ro = z.as_strided(&[2, 4], &[4, 1], 8).unwrap().to_read_only();
        drop(z);
        assert_eq!(ro.as_slice::<i32>().unwrap(), &[0; 8]);
        // Non-compact: refused, pointing to to_vec.
        let t = Tensor::from_vec(vec![0i64, 1, 2, 3], &[2, 2]).unwrap();
        let mut tt = t.as_strided(&[2, 2], &[1, 2], 0).unwrap();
        drop(t);
        let e = tt.as_slice::<i64>().unwrap_err();
        assert!(
            matches!(e, Error::Layout(_)) && e.to_string().contains("not compact"),
            "{e}"
        );
        // Shared memory (other processes may map it) and foreign memory: refused.
        let mut shared = Tensor::zeros_shared(&[3], DType::F32).unwrap();
        assert!(matches!(shared.as_slice::<f32>(), Err(Error::Layout(_))));
        let buf = Box::new([1u16, 2, 3]);
        let p = buf.as_ptr() as *mut u8;
        // SAFETY: the box (the owner) keeps its three elements alive.
        let mut foreign = unsafe {
            Tensor::from_raw_parts(
                buf,
                p,
                0,
                (&[3][..]).into(),
                (&[1][..]).into(),
                DType::U16,
                Device::Cpu,
                false,
            )
        }
        .unwrap();
        assert!(matches!(foreign.as_slice::<u16>(), Err(Error::Layout(_))));
        assert_eq!(foreign.to_vec::<u16>().unwrap(), vec![1, 2, 3]);
        // Empty and wrong dtype.
        let mut e = Tensor::from_vec(Vec::<f64>::new(), &[0, 4]).unwrap();
        assert_eq!(e.as_slice::<f64>().unwrap(), &[] as &[f64]);
        assert!(matches!(e.as_slice::<i64>(), Err(Error::DType(_))));
    }

    #[test]
    fn view_chains_are_walked() {
        let mut t = Tensor::from_vec(vec![7u8; 4], &[4]).unwrap();
        for _ in 0..1000 {
            t = t.to_read_only();
        }
        assert_eq!(t.as_slice::<u8>().unwrap(), &[7; 4]);
    }
}
