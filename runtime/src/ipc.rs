//! Cross-process tensors on the CPU (`docs/ipc.md`): a [`Handle`] is plain data
//! naming a view of a shared-memory segment (`shm`); [`share`] makes one of a tensor in shared
//! memory, [`open`] / [`open_fd`] give a tensor over the same memory in another process.
//!
//! Invariants:
//! - a handle from outside is never trusted: [`Handle::parse`] range-checks every field and
//!   proves, in checked arithmetic ([`check_span`], on top of `layout::validate`), that the view
//!   it names lies inside the segment's `size` bytes; opening then maps only a file whose
//!   identity and size are the handle's (`shm`), so a view can never reach memory outside the
//!   segment it names, and a stale or foreign handle is an [`Error::Ipc`], never a read of
//!   other memory;
//! - a tensor opened from a handle owns (through `Arc<Segment>`) a mapping and an fd of the
//!   file, so the memory lives while any view in this process does, whatever the sender does;
//! - opening a handle of a file this process already maps reuses that mapping (one mapping per
//!   file and size), so views opened twice alias as they do in the sender.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{self, Dims};
use crate::shm::{self, Identity, Segment};
use crate::tensor::Tensor;
use rustix::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// The `kind` of a handle of CPU shared memory (CUDA IPC handles will have their own).
pub const KIND_CPU: &str = "cpu_shm";

/// A validated handle: every field in range and the view inside the segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handle {
    /// The sending process and its fd of the segment (for the `/proc/<pid>/fd/<fd>` transport).
    pub pid: i32,
    /// `-1` only for a segment of 0 bytes (an empty torch storage), which has no file.
    pub fd: i32,
    /// The segment file's identity, checked by the receiver against what it opens.
    pub id: Identity,
    /// Bytes of the segment (the file's size).
    pub size: u64,
    /// Byte offset of element (0, ..., 0) in the segment.
    pub offset: u64,
    pub shape: Dims,
    /// In elements, as a tensor's.
    pub strides: Dims,
    pub dtype: DType,
    pub read_only: bool,
}

/// A handle's fields as they came from outside (a Python `rivet.ipc.Handle`), untrusted.
/// Integers are wide enough that no value a caller can pass is truncated before it is checked.
#[derive(Debug, Clone)]
pub struct RawHandle<'a> {
    pub kind: &'a str,
    pub device: &'a str,
    pub pid: i128,
    pub fd: i128,
    pub st_dev: i128,
    pub st_ino: i128,
    pub size: i128,
    pub offset: i128,
    pub shape: &'a [i128],
    pub strides: &'a [i128],
    pub dtype: &'a str,
    pub read_only: bool,
}

/// An `Error::Ipc` about a malformed handle (the bindings word their type errors with it).
pub fn invalid_handle(msg: String) -> Error {
    Error::Ipc(format!("invalid handle: {msg}"))
}

/// `v` as a `T` when it lies in `[lo, hi]`, else an error naming the field (CPU and CUDA
/// handles alike).
pub(crate) fn field<T: TryFrom<i128>>(
    name: &str,
    v: i128,
    lo: i128,
    hi: i128,
    what: &str,
) -> Result<T> {
    if v < lo || v > hi {
        return Err(invalid_handle(format!(
            "field '{name}' is {v}; expected {what}"
        )));
    }
    T::try_from(v).map_err(|_| invalid_handle(format!("field '{name}' is {v}; expected {what}")))
}

impl Handle {
    /// Checks every field of an untrusted handle (see the module header).
    pub fn parse(raw: &RawHandle<'_>) -> Result<Handle> {
        if raw.kind != KIND_CPU {
            return Err(invalid_handle(format!(
                "field 'kind' is '{}'; this rivet opens '{KIND_CPU}' handles (CPU shared memory)",
                raw.kind
            )));
        }
        if raw.device != "cpu" {
            return Err(invalid_handle(format!(
                "field 'device' is '{}' but a '{KIND_CPU}' handle is of CPU memory ('cpu')",
                raw.device
            )));
        }
        let pid = field(
            "pid",
            raw.pid,
            1,
            i32::MAX as i128,
            "a process id (1 to 2^31 - 1)",
        )?;
        let size: u64 = field(
            "size",
            raw.size,
            0,
            isize::MAX as i128,
            "a segment size in bytes (0 to 2^63 - 1)",
        )?;
        let fd_lo = if size == 0 { -1 } else { 0 };
        let fd = field(
            "fd",
            raw.fd,
            fd_lo,
            i32::MAX as i128,
            "a file descriptor number (0 to 2^31 - 1)",
        )?;
        let id = Identity {
            dev: field("st_dev", raw.st_dev, 0, u64::MAX as i128, "a device number")?,
            ino: field("st_ino", raw.st_ino, 0, u64::MAX as i128, "an inode number")?,
        };
        let offset: u64 = field(
            "offset",
            raw.offset,
            0,
            isize::MAX as i128,
            "a byte offset (0 to 2^63 - 1)",
        )?;
        let (shape, strides, dtype) = view_fields(raw.shape, raw.strides, raw.dtype)?;
        let h = Handle {
            pid,
            fd,
            id,
            size,
            offset,
            shape,
            strides,
            dtype,
            read_only: raw.read_only,
        };
        check_span(h.size, h.offset, &h.shape, &h.strides, h.dtype)?;
        Ok(h)
    }
}

/// A handle's view fields, checked: at most `MAX_NDIM` dims in `shape` and `strides`, each
/// fitting int64, and a dtype rivet knows (the layout itself is `check_span`'s). One
/// definition for every kind of handle (CPU here, CUDA in `ipc_cuda`).
pub(crate) fn view_fields(
    shape: &[i128],
    strides: &[i128],
    dtype: &str,
) -> Result<(Dims, Dims, DType)> {
    if shape.len() > layout::MAX_NDIM || strides.len() > layout::MAX_NDIM {
        return Err(invalid_handle(format!(
            "fields 'shape' / 'strides' have {} / {} dims; rivet's limit is {}",
            shape.len(),
            strides.len(),
            layout::MAX_NDIM
        )));
    }
    let dims = |name: &str, v: &[i128]| -> Result<Dims> {
        v.iter()
            .enumerate()
            .map(|(i, &d)| {
                i64::try_from(d).map_err(|_| {
                    invalid_handle(format!(
                        "field '{name}'[{i}] is {d}; it does not fit in int64"
                    ))
                })
            })
            .collect()
    };
    let dtype: DType = dtype
        .parse()
        .map_err(|e: Error| invalid_handle(format!("field 'dtype': {e}")))?;
    Ok((dims("shape", shape)?, dims("strides", strides)?, dtype))
}

/// `check_span_in` for a CPU handle: the container is the segment, its size field `size`.
pub fn check_span(
    size: u64,
    offset: u64,
    shape: &[i64],
    strides: &[i64],
    dtype: DType,
) -> Result<layout::Extent> {
    check_span_in("the segment", "size", size, offset, shape, strides, dtype)
}

/// Proves that the view (`offset`, `shape`, `strides`, `dtype`) lies inside a container of
/// `size` bytes (`what`, whose handle field is `field`, named in the error): a valid layout (`layout::validate`), and for a non-empty view every byte it
/// touches in `[0, size)`; an empty view's `offset` is at most `size`. Checked `i128`
/// arithmetic throughout (`offset`, `size` < 2^63 and the layout's extent < 2^63 in magnitude).
pub fn check_span_in(
    what: &str,
    field: &str,
    size: u64,
    offset: u64,
    shape: &[i64],
    strides: &[i64],
    dtype: DType,
) -> Result<layout::Extent> {
    let ext = layout::validate(shape, strides, dtype.size()).map_err(|e| {
        invalid_handle(format!(
            "fields 'shape' {shape:?} / 'strides' {strides:?} / 'dtype' {dtype} are not a valid layout: {e}"
        ))
    })?;
    let (lo, hi) = if ext.numel == 0 {
        (offset as i128, offset as i128)
    } else {
        (
            offset as i128 + ext.lo as i128,
            offset as i128 + ext.hi as i128,
        )
    };
    if lo < 0 || hi > size as i128 {
        return Err(invalid_handle(format!(
            "the view ('offset' {offset}, 'shape' {shape:?}, 'strides' {strides:?}, 'dtype' {dtype}) reaches bytes [{lo}, {hi}) but {what} has {size} bytes ('{field}')"
        )));
    }
    Ok(ext)
}

/// The shared-memory segment of this process that holds `t`'s memory, and the byte offset of
/// its element (0, ..., 0) there; `None` when `t` is not in a live rivet segment. Any view of a
/// segment is found, however it came (a rivet view, a numpy / torch array imported back
/// through DLPack), since the lookup is by address.
pub fn segment_of(t: &Tensor) -> Option<(Arc<Segment>, u64)> {
    if t.device() != Device::Cpu {
        return None;
    }
    let first = t.data_ptr() as usize;
    let (lo, hi) = t.byte_range().unwrap_or((first, first));
    let seg = shm::find_range(lo, hi)?;
    let base = seg.base() as usize;
    // Non-empty: `first` lies in [lo, hi) inside the segment. Empty: the lookup asked for a
    // segment holding `first` (one past the end included).
    Some((seg, (first - base) as u64))
}

/// Whether `t` lies in a live shared-memory segment of this process (`ipc::share` accepts it).
pub fn is_shared(t: &Tensor) -> bool {
    segment_of(t).is_some()
}

fn handle_of(seg: &Segment, offset: u64, t: &Tensor) -> Handle {
    Handle {
        pid: std::process::id() as i32,
        fd: seg.fd().as_raw_fd(),
        id: seg.identity(),
        size: seg.len() as u64,
        offset,
        shape: t.shape().into(),
        strides: t.strides().into(),
        dtype: t.dtype(),
        read_only: t.is_read_only(),
    }
}

fn check_cpu(t: &Tensor, what: &str) -> Result<()> {
    if t.device() != Device::Cpu {
        return Err(Error::Device(format!(
            "{what}: the tensor is on {}; this path shares CPU memory only (CUDA memory is shared from a torch CUDA tensor through rivet.ipc.share, docs/ipc.md \"CUDA\")",
            t.device()
        )));
    }
    Ok(())
}

/// A handle of `t`, which must be in shared memory; with `copy`, a tensor that is not is
/// first copied once into a new segment. Returns the handle and the tensor it names (`t`
/// itself, or the copy), which the caller keeps alive until receivers have opened it.
pub fn share(t: &Tensor, copy: bool) -> Result<(Handle, Tensor)> {
    check_cpu(t, "the tensor")?;
    if let Some((seg, offset)) = segment_of(t) {
        return Ok((handle_of(&seg, offset, t), t.clone()));
    }
    if !copy {
        return Err(Error::Ipc(format!(
            "the {} tensor of shape {:?} is not in shared memory; allocate it with rivet.empty(..., shared=True) or rivet.zeros(..., shared=True), call share_memory_() on a torch tensor, or pass copy=True to copy it once into a new shared segment",
            t.dtype(),
            t.shape()
        )));
    }
    let c = t.copy_compact_shared()?;
    let (seg, offset) = segment_of(&c)
        .ok_or_else(|| Error::Internal("a new shared tensor has no segment".into()))?;
    let c = if t.is_read_only() {
        c.to_read_only()
    } else {
        c
    };
    Ok((handle_of(&seg, offset, &c), c))
}

/// A handle of `t`, a view of memory this process maps from the shared-memory file of `fd`
/// (a torch storage shared with `share_memory_()`, whose fd torch keeps). The mapping that
/// holds `t`'s first element is looked up in `/proc/self/maps` and must be of that very file,
/// which gives the element's offset in the file: the handle is right by construction, not by
/// trust in the caller's arithmetic.
pub fn share_fd(t: &Tensor, fd: BorrowedFd<'_>) -> Result<Handle> {
    check_cpu(t, "the tensor")?;
    let (id, size) = shm::fd_identity(fd)?;
    let offset = if t.numel() == 0 {
        0
    } else {
        let first = t.data_ptr() as usize;
        let m = shm::mapping_at(first)?.filter(|m| m.id == id).ok_or_else(|| {
            Error::Ipc(format!(
                "the tensor's memory at {first:#x} is not a mapping of fd {} (st_dev {}, st_ino {})",
                fd.as_raw_fd(),
                id.dev,
                id.ino
            ))
        })?;
        m.file_offset + (first - m.start) as u64
    };
    let h = Handle {
        pid: std::process::id() as i32,
        fd: if size == 0 { -1 } else { fd.as_raw_fd() },
        id,
        size,
        offset,
        shape: t.shape().into(),
        strides: t.strides().into(),
        dtype: t.dtype(),
        read_only: t.is_read_only(),
    };
    check_span(h.size, h.offset, &h.shape, &h.strides, h.dtype)?;
    Ok(h)
}

/// The handle of an empty view of no memory (an empty torch storage has no file): opening it
/// gives an empty tensor of the same shape and dtype.
pub fn share_empty(t: &Tensor) -> Result<Handle> {
    check_cpu(t, "the tensor")?;
    if t.numel() != 0 {
        return Err(Error::Ipc(format!(
            "the {} tensor of shape {:?} has elements but its storage has no file descriptor",
            t.dtype(),
            t.shape()
        )));
    }
    Ok(Handle {
        pid: std::process::id() as i32,
        fd: -1,
        id: Identity { dev: 0, ino: 0 },
        size: 0,
        offset: 0,
        shape: t.shape().into(),
        strides: t.strides().into(),
        dtype: t.dtype(),
        read_only: t.is_read_only(),
    })
}

/// A tensor over the memory `h` names, through `/proc/<pid>/fd/<fd>` of the sender, or a
/// mapping this process already has of the same file.
pub fn open(h: &Handle) -> Result<Tensor> {
    if h.size == 0 {
        return empty_view(h);
    }
    let size = h.size as usize; // <= isize::MAX (parse)
    let seg = match shm::find_identity(h.id, size) {
        Some(seg) => seg,
        None => shm::open_proc(h.pid, h.fd, h.id, size)?,
    };
    view(seg, h)
}

/// As [`open`], with the segment's fd handed over (the multiprocessing transport passes it
/// with `SCM_RIGHTS`); the fd is owned, kept by the new mapping or closed.
pub fn open_fd(fd: OwnedFd, h: &Handle) -> Result<Tensor> {
    if h.size == 0 {
        return empty_view(h);
    }
    let size = h.size as usize;
    let seg = match shm::find_identity(h.id, size) {
        Some(seg) => seg,
        None => Segment::from_fd(fd, h.id, size, "the received fd")?,
    };
    view(seg, h)
}

/// An empty view of a segment of 0 bytes (an empty torch storage: there is no file).
fn empty_view(h: &Handle) -> Result<Tensor> {
    check_span(0, h.offset, &h.shape, &h.strides, h.dtype)?;
    let t = Tensor::zeros(&h.shape, h.dtype)?;
    Ok(if h.read_only { t.to_read_only() } else { t })
}

fn view(seg: Arc<Segment>, h: &Handle) -> Result<Tensor> {
    // Again, for a `Handle` built by hand rather than parsed: cheap, and the one proof that
    // the view stays inside the mapping.
    check_span(seg.len() as u64, h.offset, &h.shape, &h.strides, h.dtype)?;
    let base = seg.base();
    // SAFETY: `check_span` proved every byte of the view inside the `seg.len()` mapped bytes
    // at `base`, which `seg` (the owner) keeps mapped as long as the tensor lives.
    unsafe {
        Tensor::from_raw_parts(
            seg,
            base,
            h.offset,
            h.shape.clone(),
            h.strides.clone(),
            h.dtype,
            Device::Cpu,
            h.read_only,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<'a>(shape: &'a [i128], strides: &'a [i128]) -> RawHandle<'a> {
        RawHandle {
            kind: KIND_CPU,
            device: "cpu",
            pid: 1234,
            fd: 7,
            st_dev: 1,
            st_ino: 99,
            size: 4096,
            offset: 0,
            shape,
            strides,
            dtype: "float32",
            read_only: false,
        }
    }

    fn err(r: &RawHandle<'_>) -> String {
        let e = Handle::parse(r).unwrap_err();
        assert!(matches!(e, Error::Ipc(_)), "{e:?}");
        e.to_string()
    }

    #[test]
    fn span_arithmetic() {
        let f32_ = DType::F32;
        assert!(check_span(4096, 0, &[1024], &[1], f32_).is_ok());
        assert!(check_span(4096, 4, &[1023], &[1], f32_).is_ok());
        assert!(check_span(4096, 4, &[1024], &[1], f32_).is_err());
        // Negative strides reach below element 0.
        assert!(check_span(4096, 4092, &[1024], &[-1], f32_).is_ok());
        assert!(check_span(4096, 4088, &[1024], &[-1], f32_).is_err());
        // Zero strides (broadcast) touch one element.
        assert!(check_span(4, 0, &[1 << 40], &[0], f32_).is_ok());
        // Empty views touch nothing but their offset stays inside.
        assert!(check_span(0, 0, &[0, 5], &[5, 1], f32_).is_ok());
        assert!(check_span(16, 16, &[0], &[1], f32_).is_ok());
        assert!(check_span(16, 17, &[0], &[1], f32_).is_err());
        // Hostile values: offsets near 2^62 / 2^63, strides whose reach overflows.
        let big = (1u64 << 62) + 4;
        assert!(check_span(4096, big, &[1], &[1], f32_).is_err());
        assert!(check_span(4096, isize::MAX as u64, &[1], &[1], f32_).is_err());
        assert!(check_span(u64::MAX >> 1, 0, &[2], &[i64::MAX], f32_).is_err());
        assert!(check_span(4096, 0, &[2], &[i64::MIN], f32_).is_err());
        assert!(check_span(4096, 0, &[-1], &[1], f32_).is_err());
        assert!(check_span(4096, 0, &[2, 2], &[1], f32_).is_err());
        assert!(check_span(4096, 2048, &[3, i64::MAX], &[1, 0], f32_).is_err());
    }

    #[test]
    fn parse_refuses_every_bad_field() {
        let (shape, strides) = ([4i128, 8], [8i128, 1]);
        let ok = raw(&shape, &strides);
        let h = Handle::parse(&ok).unwrap();
        assert_eq!((h.pid, h.fd, h.size, h.offset), (1234, 7, 4096, 0));
        assert_eq!(h.shape.as_slice(), &[4, 8]);

        let m = err(&RawHandle {
            kind: "cuda_ipc",
            ..ok.clone()
        });
        assert!(m.contains("'kind'"), "{m}");
        let m = err(&RawHandle {
            device: "cuda:0",
            ..ok.clone()
        });
        assert!(m.contains("'device'"), "{m}");
        for (name, r) in [
            (
                "pid",
                RawHandle {
                    pid: 0,
                    ..ok.clone()
                },
            ),
            (
                "pid",
                RawHandle {
                    pid: -5,
                    ..ok.clone()
                },
            ),
            (
                "pid",
                RawHandle {
                    pid: 1 << 40,
                    ..ok.clone()
                },
            ),
            (
                "fd",
                RawHandle {
                    fd: -1,
                    ..ok.clone()
                },
            ),
            (
                "fd",
                RawHandle {
                    fd: i64::MIN as i128,
                    ..ok.clone()
                },
            ),
            (
                "fd",
                RawHandle {
                    fd: 1 << 62,
                    ..ok.clone()
                },
            ),
            (
                "st_dev",
                RawHandle {
                    st_dev: -1,
                    ..ok.clone()
                },
            ),
            (
                "st_ino",
                RawHandle {
                    st_ino: 1 << 64,
                    ..ok.clone()
                },
            ),
            (
                "size",
                RawHandle {
                    size: -1,
                    ..ok.clone()
                },
            ),
            (
                "size",
                RawHandle {
                    size: 1 << 63,
                    ..ok.clone()
                },
            ),
            (
                "offset",
                RawHandle {
                    offset: i64::MIN as i128,
                    ..ok.clone()
                },
            ),
            (
                "offset",
                RawHandle {
                    offset: 1 << 63,
                    ..ok.clone()
                },
            ),
        ] {
            let m = err(&r);
            assert!(m.contains(&format!("'{name}'")), "{name}: {m}");
        }
        let m = err(&RawHandle {
            offset: 1 << 62,
            ..ok.clone()
        });
        assert!(
            m.contains("reaches bytes") && m.contains("4096 bytes"),
            "{m}"
        );
        let m = err(&RawHandle {
            dtype: "float33",
            ..ok.clone()
        });
        assert!(m.contains("'dtype'") && m.contains("float33"), "{m}");
        let big = [1i128 << 64];
        let m = err(&RawHandle {
            shape: &big,
            strides: &[1],
            ..ok.clone()
        });
        assert!(m.contains("'shape'[0]"), "{m}");
        let m = err(&RawHandle {
            strides: &[8, i64::MIN as i128],
            ..ok.clone()
        });
        assert!(
            m.contains("not a valid layout") || m.contains("reaches"),
            "{m}"
        );
        let m = err(&RawHandle {
            shape: &[2048],
            strides: &[1],
            ..ok.clone()
        });
        assert!(m.contains("reaches bytes [0, 8192)"), "{m}");
        let many = [1i128; 65];
        let m = err(&RawHandle {
            shape: &many,
            strides: &many,
            ..ok.clone()
        });
        assert!(m.contains("65 dims"), "{m}");
        // A segment of 0 bytes has no file: fd -1, and only empty views.
        let e = RawHandle {
            size: 0,
            fd: -1,
            shape: &[0],
            strides: &[1],
            ..ok.clone()
        };
        assert!(Handle::parse(&e).is_ok());
        assert!(Handle::parse(&RawHandle {
            shape: &[1],
            ..e.clone()
        })
        .is_err());
    }

    #[test]
    fn share_and_open_in_process() {
        let t = Tensor::zeros_shared(&[3, 5], DType::F32).unwrap();
        assert!(is_shared(&t));
        assert!(!is_shared(&Tensor::zeros(&[3, 5], DType::F32).unwrap()));
        let tt = t.as_strided(&[5, 2], &[1, 5], 5).unwrap(); // a transposed slice
        let (h, keep) = share(&tt, false).unwrap();
        assert_eq!(keep.data_ptr(), tt.data_ptr());
        assert_eq!(h.offset, 20);
        let o = open(&h).unwrap();
        assert_eq!(o.data_ptr(), tt.data_ptr()); // the local mapping, reused
                                                 // Through /proc/self/fd when the mapping is not found locally: a second mapping.
        let o2 = Segment::from_fd(
            rustix::fs::open(
                format!("/proc/self/fd/{}", h.fd).as_str(),
                rustix::fs::OFlags::RDWR,
                rustix::fs::Mode::empty(),
            )
            .unwrap(),
            h.id,
            h.size as usize,
            "test",
        )
        .unwrap();
        let v = view(o2, &h).unwrap();
        assert_ne!(v.data_ptr(), tt.data_ptr());
        // SAFETY: element (1, 1) of tt is flat element 5 + 1 + 5 = 11 of t, inside its 15.
        unsafe { *(t.data_ptr().add(4 * 11) as *mut f32) = 7.5 };
        assert_eq!(v.to_vec::<f32>().unwrap()[3], 7.5);
        // Not shared: refused without copy, copied once with it.
        let p = Tensor::from_slice(&[1f32, 2., 3.], &[3]).unwrap();
        let e = share(&p, false).unwrap_err();
        assert!(
            matches!(e, Error::Ipc(_)) && e.to_string().contains("shared=True"),
            "{e}"
        );
        let (h, c) = share(&p, true).unwrap();
        assert!(is_shared(&c));
        assert_eq!(open(&h).unwrap().to_vec::<f32>().unwrap(), vec![1., 2., 3.]);
    }

    #[test]
    fn stale_handles_are_errors() {
        let t = Tensor::zeros_shared(&[1024], DType::F64).unwrap();
        let (h, _) = share(&t, false).unwrap();
        drop(t);
        let e = open(&h).unwrap_err();
        assert!(matches!(e, Error::Ipc(_)), "{e:?}");
        let m = e.to_string();
        assert!(
            m.contains("closed the memory") || m.contains("another file now"),
            "{m}"
        );
    }
}
