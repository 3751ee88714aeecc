//! CPU shared memory: segments that other processes can map (`docs/ipc.md`).
//!
//! A segment is a memfd (`memfd_create`, `MFD_CLOEXEC`) mapped `MAP_SHARED` (memmap2), or, in a
//! receiving process, any shared-memory file it was handed (another rivet's memfd, torch's
//! unlinked `/dev/shm` file). The kernel counts the fds and mappings of the file: its memory lives
//! while any process holds either and is freed when the last goes, also when processes are
//! killed; a memfd never has a name in `/dev/shm`, so nothing can be left behind there.
//!
//! Invariants:
//! - a [`Segment`] owns one fd and one mapping of exactly `len >= 1` bytes of that file, made
//!   after checking that the file is a regular shared-memory (tmpfs) file of at least `len`
//!   bytes; tensors over it hold an `Arc<Segment>`, so the mapping outlives every view;
//! - segments rivet creates are sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) once sized:
//!   no process holding the fd can truncate the file under another's mapping (which would turn
//!   an access into SIGBUS);
//! - the registry maps address ranges to *weak* references; a segment removes its entry in
//!   `Drop` before the memory is unmapped, and lookups upgrade, so a lookup never returns a
//!   segment whose memory is gone, and a new mapping at a recycled address never meets a
//!   stale entry;
//! - a file's identity is its `(st_dev, st_ino)` from `fstat`: a handle carries it, and a
//!   receiver maps nothing whose identity and size differ from the handle's, so an fd number
//!   that was closed and reused for another file is refused, never read.
//!
//! rustix rather than nix for the syscalls: it is already in the dependency tree (tempfile's),
//! its calls take and give `OwnedFd` / `BorrowedFd` (no fd can be leaked or closed twice), and
//! on Linux it makes the syscalls directly, without going through libc's errno.

use crate::error::{Error, Result};
use memmap2::{MmapOptions, MmapRaw};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::fs::{FileType, MemfdFlags, Mode, OFlags, SealFlags};
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

/// `statfs.f_type` of tmpfs / shmem, where memfds and `/dev/shm` files live.
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// The identity of a file: `(st_dev, st_ino)` from `fstat`. Two open files with one identity
/// are the same file (inode numbers of shmem are not reused until a 32-bit counter wraps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
}

/// The identity in a `stat` result. `Stat`'s field types differ between architectures (u64
/// on x86-64, `c_ulong` elsewhere), hence the casts that are no-ops here.
#[allow(clippy::unnecessary_cast)]
fn identity_of(st: &rustix::fs::Stat) -> Identity {
    Identity {
        dev: st.st_dev as u64,
        ino: st.st_ino as u64,
    }
}

/// A mapped shared-memory file; see the module header for the invariants.
pub struct Segment {
    map: MmapRaw,
    fd: OwnedFd,
    id: Identity,
    len: usize,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Segment(fd {}, {} bytes at {:#x}, st_dev {}, st_ino {})",
            self.fd.as_raw_fd(),
            self.len,
            self.base() as usize,
            self.id.dev,
            self.id.ino
        )
    }
}

impl Segment {
    /// First byte of the mapping (page aligned, so aligned for every dtype).
    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
    /// Bytes mapped (the file's size when it was mapped).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never true: a segment maps at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn identity(&self) -> Identity {
        self.id
    }
    /// The fd this process holds on the file (its number goes into handles).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A new zero-filled segment of `len` bytes (at least 1): a sealed memfd, mapped. The
    /// kernel gives fresh shmem pages zeroed, lazily, so this costs no time per byte.
    pub fn create(len: usize) -> Result<Arc<Segment>> {
        let len = len.max(1);
        // shmem is not counted against the overcommit limit (memfds are VM_NORESERVE), so the
        // kernel would say yes to any size and fail at first touch; refuse here what cannot
        // fit at all, as the kernel's heuristic does for rivet's private memory.
        let si = rustix::system::sysinfo();
        let total = (si.totalram as u128 + si.totalswap as u128) * si.mem_unit.max(1) as u128;
        if len as u128 > total {
            return Err(Error::Memory(format!(
                "cannot allocate a shared memory segment of {len} bytes: more than this machine's memory and swap ({total} bytes)"
            )));
        }
        let fail = |what: &str, e: Errno| os_error(&format!("{what} for {len} bytes"), e);
        let fd = rustix::fs::memfd_create(
            "rivet-tensor",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| fail("cannot create a shared memory segment (memfd_create)", e))?;
        rustix::fs::ftruncate(&fd, len as u64)
            .map_err(|e| fail("cannot size a shared memory segment (ftruncate)", e))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| fail("cannot seal a shared memory segment", e))?;
        let st =
            rustix::fs::fstat(&fd).map_err(|e| fail("cannot stat a shared memory segment", e))?;
        let id = identity_of(&st);
        Segment::map(fd, id, len)
    }

    /// Maps `len` bytes of a file this process has just been given an fd of (the fd of the
    /// multiprocessing transport, or one opened through `/proc`), after checking that it is a
    /// shared-memory file with identity `expect` and size `len`. `what` names the fd in errors.
    pub fn from_fd(fd: OwnedFd, expect: Identity, len: usize, what: &str) -> Result<Arc<Segment>> {
        let st = rustix::fs::fstat(&fd).map_err(|e| os_error(&format!("cannot stat {what}"), e))?;
        check_file(what, &st, expect, len)?;
        let fs =
            rustix::fs::fstatfs(&fd).map_err(|e| os_error(&format!("cannot statfs {what}"), e))?;
        if fs.f_type as u64 != TMPFS_MAGIC {
            return Err(Error::Ipc(format!(
                "{what} is not shared memory (filesystem type {:#x}, not tmpfs / memfd); rivet maps only shared-memory segments",
                fs.f_type as u64
            )));
        }
        Segment::map(fd, expect, len)
    }

    fn map(fd: OwnedFd, id: Identity, len: usize) -> Result<Arc<Segment>> {
        debug_assert!(len >= 1);
        // What makes later accesses through the raw map sound: the file is a shmem file of at
        // least `len` bytes; rivet's own segments are sealed against shrinking, foreign ones
        // (torch's) are trusted not to shrink (docs/ipc.md, limits).
        let map = MmapOptions::new()
            .len(len)
            .map_raw(fd.as_raw_fd())
            .map_err(|e| {
                let e = Errno::from_io_error(&e).unwrap_or(Errno::NOMEM);
                os_error(
                    &format!("cannot map a shared memory segment of {len} bytes (mmap)"),
                    e,
                )
            })?;
        let seg = Arc::new(Segment { map, fd, id, len });
        registry().insert(&seg);
        Ok(seg)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // Before the fields drop (munmap, then close): no lookup can find this segment once
        // its memory may be reused.
        registry().remove(self);
    }
}

/// Checks what `fstat` / `stat` said about a file against a handle: a regular file with the
/// handle's identity and size.
fn check_file(what: &str, st: &rustix::fs::Stat, expect: Identity, len: usize) -> Result<()> {
    let got = identity_of(st);
    if got != expect {
        return Err(Error::Ipc(format!(
            "{what} is another file now (st_dev {}, st_ino {}; the handle names st_dev {}, st_ino {}): the sender dropped the tensor and the fd number was reused",
            got.dev, got.ino, expect.dev, expect.ino
        )));
    }
    if FileType::from_raw_mode(st.st_mode as _) != FileType::RegularFile {
        return Err(Error::Ipc(format!(
            "{what} is not a shared memory file (its file type is {:?})",
            FileType::from_raw_mode(st.st_mode as _)
        )));
    }
    if st.st_size as i128 != len as i128 {
        return Err(Error::Ipc(format!(
            "{what} has {} bytes but the handle's 'size' is {len}",
            st.st_size
        )));
    }
    Ok(())
}

/// The OS error `e` as a rivet error: out of memory or address space is an `Error::Memory`,
/// out of file descriptors says which limit, anything else is an `Error::Ipc`.
fn os_error(what: &str, e: Errno) -> Error {
    match e {
        Errno::NOMEM | Errno::NOSPC | Errno::FBIG => Error::Memory(format!(
            "{what}: the system refused ({e}); out of memory"
        )),
        Errno::MFILE | Errno::NFILE => Error::Ipc(format!(
            "{what}: too many open files ({e}); every live shared segment holds one file descriptor: raise the limit (ulimit -n, RLIMIT_NOFILE) or keep fewer shared tensors"
        )),
        e => Error::Ipc(format!("{what}: {e}")),
    }
}

/// Opens the file behind fd `fd` of process `pid` through `/proc/<pid>/fd/<fd>` (same user
/// only) and maps it, after checking it is the file of identity `expect` and size `len`.
///
/// The target is `stat`ed before it is opened, so an fd number that now names something else
/// (a pipe, a device) is refused without opening it (opening a device can block or have
/// effects); the opened file is checked again by `fstat` (it may change in between).
pub fn open_proc(pid: i32, fd: i32, expect: Identity, len: usize) -> Result<Arc<Segment>> {
    let path = format!("/proc/{pid}/fd/{fd}");
    let what = format!("fd {fd} of process {pid}");
    let errno = |e: Errno| -> Error {
        match e {
            Errno::NOENT | Errno::SRCH => {
                if rustix::fs::stat(format!("/proc/{pid}").as_str()).is_err() {
                    Error::Ipc(format!(
                        "the sending process {pid} is gone: a handle from rivet.ipc.share is valid while the sender keeps the tensor alive (send the tensor itself through a multiprocessing queue or pipe to hand the memory over)"
                    ))
                } else {
                    Error::Ipc(format!(
                        "the sending process {pid} closed the memory ({what} is closed): it dropped the tensor before this handle was opened; a handle is valid while the sender keeps the tensor alive"
                    ))
                }
            }
            Errno::ACCESS | Errno::PERM => Error::Ipc(format!(
                "not permitted to open {what} ({e}): rivet.ipc handles work between processes of the same user that may read each other's /proc/<pid>/fd"
            )),
            e => os_error(&format!("cannot open {what} ({path})"), e),
        }
    };
    let st = rustix::fs::stat(path.as_str()).map_err(errno)?;
    check_file(&what, &st, expect, len)?;
    let file = rustix::fs::open(
        path.as_str(),
        OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(errno)?;
    Segment::from_fd(file, expect, len, &what)
}

/// `(st_dev, st_ino, st_size)` of an fd (the identity a handle of torch's memory carries).
pub fn fd_identity(fd: BorrowedFd<'_>) -> Result<(Identity, u64)> {
    let st = rustix::fs::fstat(fd).map_err(|e| os_error("cannot stat the fd", e))?;
    if FileType::from_raw_mode(st.st_mode as _) != FileType::RegularFile || st.st_size < 0 {
        return Err(Error::Ipc(format!(
            "fd {} is not a shared memory file",
            fd.as_raw_fd()
        )));
    }
    Ok((identity_of(&st), st.st_size as u64))
}

/// A line of `/proc/self/maps`: the mapping that holds an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub start: usize,
    pub end: usize,
    /// Offset in the file of the byte at `start`.
    pub file_offset: u64,
    pub id: Identity,
}

/// The mapping of this process that holds `addr`, from `/proc/self/maps` (None: unmapped).
/// Used to prove that foreign memory (a torch storage) is the file its fd names, at the offset
/// a handle will claim, before the handle is made.
pub fn mapping_at(addr: usize) -> Result<Option<Mapping>> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| Error::Ipc(format!("cannot read /proc/self/maps: {e}")))?;
    Ok(maps
        .lines()
        .filter_map(parse_maps_line)
        .find(|m| m.start <= addr && addr < m.end))
}

/// `start-end perms offset major:minor inode [path]`, all numbers hex but the inode.
fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut f = line.split_ascii_whitespace();
    let (start, end) = f.next()?.split_once('-')?;
    let _perms = f.next()?;
    let offset = f.next()?;
    let (major, minor) = f.next()?.split_once(':')?;
    let ino = f.next()?.parse::<u64>().ok()?;
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    Some(Mapping {
        start: hex(start)? as usize,
        end: hex(end)? as usize,
        file_offset: hex(offset)?,
        id: Identity {
            dev: rustix::fs::makedev(hex(major)? as u32, hex(minor)? as u32),
            ino,
        },
    })
}

// ---- the registry of live segments --------------------------------------------------------------

/// Live segments of this process by base address (weak: the registry keeps nothing alive).
struct Registry {
    by_addr: BTreeMap<usize, (usize, Weak<Segment>)>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
        by_addr: BTreeMap::new(),
    });
    // A panic while holding the lock leaves the map consistent (each operation is one
    // insert or remove), so a poisoned lock is still usable.
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    fn insert(&mut self, seg: &Arc<Segment>) {
        self.by_addr
            .insert(seg.base() as usize, (seg.len, Arc::downgrade(seg)));
    }

    fn remove(&mut self, seg: &Segment) {
        let base = seg.base() as usize;
        if let Some((_, w)) = self.by_addr.get(&base) {
            if std::ptr::eq(w.as_ptr(), seg) {
                self.by_addr.remove(&base);
            }
        }
    }
}

/// The live segment whose mapping holds the bytes `[lo, hi)` (`lo <= hi`; `lo == hi` asks
/// for the segment holding address `lo`, its one-past-the-end included, for empty views).
pub fn find_range(lo: usize, hi: usize) -> Option<Arc<Segment>> {
    let reg = registry();
    let (&base, (len, w)) = reg.by_addr.range(..=lo).next_back()?;
    let end = base + len; // a mapping never wraps
    let inside = if lo == hi { lo <= end } else { hi <= end };
    if inside {
        w.upgrade()
    } else {
        None
    }
}

/// A live segment of this process mapping the file `id` with `len` bytes, if any: opening a
/// handle of memory this process already maps reuses that mapping.
pub fn find_identity(id: Identity, len: usize) -> Option<Arc<Segment>> {
    let reg = registry();
    reg.by_addr
        .values()
        .filter_map(|(l, w)| if *l == len { w.upgrade() } else { None })
        .find(|s| s.id == id)
}

/// How many segments this process maps now (for tests and leak checks).
pub fn live_segments() -> usize {
    registry()
        .by_addr
        .values()
        .filter(|(_, w)| w.strong_count() > 0)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_find_and_release() {
        let s = Segment::create(10_000).unwrap();
        assert_eq!(s.len(), 10_000);
        assert_eq!(s.base() as usize % 4096, 0);
        let base = s.base() as usize;
        // SAFETY: the mapping is 10_000 bytes, fresh, zero-filled.
        let bytes = unsafe { std::slice::from_raw_parts(s.base(), 10_000) };
        assert!(bytes.iter().all(|&b| b == 0));
        assert!(Arc::ptr_eq(&find_range(base + 8, base + 100).unwrap(), &s));
        assert!(Arc::ptr_eq(
            &find_range(base + 10_000, base + 10_000).unwrap(),
            &s
        ));
        assert!(find_range(base + 9_999, base + 10_001).is_none());
        assert!(Arc::ptr_eq(
            &find_identity(s.identity(), 10_000).unwrap(),
            &s
        ));
        assert!(find_identity(s.identity(), 9_999).is_none());
        // `live_segments` counts the whole process, where other tests create and drop
        // segments on other threads at the same time: not compared here (test_ipc.py checks
        // it in a process of its own).
        let id = s.identity();
        drop(s);
        assert!(find_range(base + 8, base + 100).is_none());
        assert!(find_identity(id, 10_000).is_none());
    }

    #[test]
    fn sealed_against_truncation() {
        let s = Segment::create(4096).unwrap();
        assert!(rustix::fs::ftruncate(s.fd(), 0).is_err());
        assert!(rustix::fs::ftruncate(s.fd(), 8192).is_err());
    }

    #[test]
    fn open_through_proc_checks_identity_and_size() {
        let s = Segment::create(4096).unwrap();
        let pid = std::process::id() as i32;
        let fd = s.fd().as_raw_fd();
        let o = open_proc(pid, fd, s.identity(), 4096).unwrap();
        assert_ne!(o.base(), s.base()); // a second mapping of the same memory
                                        // SAFETY: both map 4096 bytes of the same file.
        unsafe {
            *s.base().add(100) = 42;
            assert_eq!(*o.base().add(100), 42);
        }
        let other = Identity {
            dev: s.identity().dev,
            ino: s.identity().ino + 1,
        };
        let e = open_proc(pid, fd, other, 4096).unwrap_err();
        assert!(e.to_string().contains("is another file now"), "{e}");
        let e = open_proc(pid, fd, s.identity(), 4095).unwrap_err();
        assert!(e.to_string().contains("'size' is 4095"), "{e}");
        let e = open_proc(pid, 1 << 30, s.identity(), 4096).unwrap_err();
        assert!(e.to_string().contains("closed the memory"), "{e}");
        let e = open_proc(i32::MAX, fd, s.identity(), 4096).unwrap_err();
        assert!(e.to_string().contains("is gone"), "{e}");
    }

    #[test]
    fn maps_lines_parse() {
        let m = parse_maps_line(
            "7f07d4892000-7f07d4894000 rw-s 00001000 00:01 13      /memfd:y (deleted)",
        )
        .unwrap();
        assert_eq!(
            (m.start, m.end, m.file_offset),
            (0x7f07d4892000, 0x7f07d4894000, 0x1000)
        );
        assert_eq!(m.id, Identity { dev: 1, ino: 13 });
        assert!(parse_maps_line("garbage").is_none());
        let s = Segment::create(8192).unwrap();
        let m = mapping_at(s.base() as usize + 5000).unwrap().unwrap();
        assert_eq!(m.id, s.identity());
        assert_eq!(m.file_offset, 0);
    }
}
