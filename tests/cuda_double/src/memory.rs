//! Device memory: each allocation its own `memfd`, mapped into one reserved address range
//! that the host never touches by accident.
//!
//! Invariants:
//! - device addresses come from a bump pointer inside a `PROT_NONE` reservation and are never
//!   reused, so a pointer into a freed allocation is always recognised as use after free;
//! - an allocation's bytes are right-aligned in their pages (the pointer 256-aligned, its end
//!   at most 255 bytes before the page end), and at least one unmapped page follows, so an
//!   access past the end faults;
//! - mappings are `PROT_NONE` except while the executor runs queued work ([`Memory::open`]);
//!   a host access outside a run faults, and the SIGSEGV handler names it and aborts;
//! - a memfd's first page is a header (magic, serial, size, device) that IPC checks; the data
//!   follows at file offset one page, so `fstat` tells the size of what is mapped;
//! - fresh memory holds 0xFF, so reading memory nobody wrote gives visible garbage.

use crate::error::{Refusal, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Allocation granularity: pointers are 256-byte aligned as cudaMalloc's are.
pub const ALIGN: usize = 256;
const RESERVE: usize = 1 << 38;
pub const HEADER_MAGIC: u64 = 0x5256_4344_4d45_4d31; // "RVCDMEM1"

/// The reservation, for the SIGSEGV handler (which may not lock).
static REGION: AtomicU64 = AtomicU64::new(0);
/// True while the executor runs queued work (memory accessible).
pub static EXECUTING: AtomicBool = AtomicBool::new(false);
/// A ring of recent allocations (base, size, serial) for the fault message.
const RING: usize = 4096;
static RING_BASE: [AtomicU64; RING] = [const { AtomicU64::new(0) }; RING];
static RING_SIZE: [AtomicU64; RING] = [const { AtomicU64::new(0) }; RING];
static RING_SERIAL: [AtomicU64; RING] = [const { AtomicU64::new(0) }; RING];
static RING_NEXT: AtomicUsize = AtomicUsize::new(0);

pub fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

pub fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// One live device allocation (own, or another process's opened through IPC).
#[derive(Debug)]
pub struct Alloc {
    pub base: u64,
    pub size: usize,
    map_start: usize,
    map_len: usize,
    pub fd: i32,
    pub serial: u64,
    pub device: usize,
    /// The context it was allocated in (or opened in, for IPC).
    pub ctx: u64,
    /// From `cuMemAllocAsync` (the device's default pool).
    pub pooled: bool,
    /// An IPC opening: (owner pid, owner fd, serial).
    pub ipc: Option<(u32, i32, u64)>,
    /// `cuMemFreeAsync` was queued: any later use is use after free.
    pub free_queued: bool,
}

/// The layout of a memfd holding `size` bytes: (data pages in bytes, offset of the pointer).
pub fn layout(size: usize) -> (usize, usize) {
    let data = round_up(round_up(size.max(1), ALIGN), page());
    (data, data - round_up(size.max(1), ALIGN))
}

#[derive(Debug, Default)]
pub struct Memory {
    pub live: BTreeMap<u64, Alloc>,
    /// Freed ranges (base -> (size, serial)), to name use after free.
    pub freed: BTreeMap<u64, (usize, u64)>,
    /// Bytes charged per device.
    pub used: Vec<usize>,
    next: usize,
    end: usize,
    next_serial: u64,
}

fn os_err(what: &str) -> Refusal {
    Refusal::new(
        CUDA_ERROR_OUT_OF_MEMORY,
        format!("{what} failed: {}", std::io::Error::last_os_error()),
    )
}

impl Memory {
    /// Reserves the address range (once per process).
    pub fn new(devices: usize) -> Result<Memory, Refusal> {
        // SAFETY: a fresh anonymous PROT_NONE mapping; nothing else is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RESERVE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err("reserving device address space (mmap)"));
        }
        REGION.store(p as u64, Ordering::SeqCst);
        Ok(Memory {
            used: vec![0; devices],
            next: p as usize + page(),
            end: p as usize + RESERVE,
            next_serial: 1,
            ..Default::default()
        })
    }

    /// Maps `len` bytes of `fd` (from file offset one page) at a fresh address, PROT_NONE,
    /// leaving a guard page after it.
    fn map_fd(&mut self, fd: i32, data: usize) -> Result<usize, Refusal> {
        if self.next + data + page() > self.end {
            return Err(Refusal::new(
                CUDA_ERROR_OUT_OF_MEMORY,
                "the double's device address space is used up (addresses are never reused)",
            ));
        }
        let at = self.next;
        // SAFETY: `at..at+data` lies inside our PROT_NONE reservation, which nothing else
        // uses; MAP_FIXED replaces that part of it only.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                data,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                page() as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err("mapping device memory (mmap)"));
        }
        self.next += data + page();
        Ok(at)
    }

    /// A fresh allocation of `size` bytes on `device` for context `ctx`, charged against
    /// `limit`, filled with 0xFF.
    pub fn alloc(
        &mut self,
        size: usize,
        device: usize,
        ctx: u64,
        pooled: bool,
        limit: usize,
    ) -> Result<u64, Refusal> {
        let charge = round_up(size, ALIGN);
        if self.used[device] + charge > limit {
            return Err(Refusal::new(
                CUDA_ERROR_OUT_OF_MEMORY,
                format!(
                    "{size} bytes requested on device {device}, {} of {limit} in use",
                    self.used[device]
                ),
            ));
        }
        let (data, offset) = layout(size);
        // SAFETY: the name is a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"rivet-cuda-double".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_err("memfd_create"));
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        let header = [HEADER_MAGIC, serial, size as u64, device as u64];
        let hb: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
        // SAFETY: `fd` is ours; the buffer is `hb.len()` readable bytes.
        let ok = unsafe {
            libc::ftruncate(fd, (page() + data) as libc::off_t) == 0
                && libc::pwrite(fd, hb.as_ptr().cast(), hb.len(), 0) == hb.len() as isize
        };
        if !ok {
            let e = os_err("sizing device memory (ftruncate)");
            // SAFETY: ours, closed once.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let at = match self.map_fd(fd, data) {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: ours, closed once.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        // Poison: made writable just for the fill.
        // SAFETY: `at..at+data` is the mapping just made.
        unsafe {
            libc::mprotect(at as *mut libc::c_void, data, libc::PROT_WRITE);
            std::ptr::write_bytes(at as *mut u8, 0xFF, data);
            libc::mprotect(at as *mut libc::c_void, data, libc::PROT_NONE);
        }
        let base = (at + offset) as u64;
        self.used[device] += charge;
        self.insert(Alloc {
            base,
            size,
            map_start: at,
            map_len: data,
            fd,
            serial,
            device,
            ctx,
            pooled,
            ipc: None,
            free_queued: false,
        });
        Ok(base)
    }

    /// Maps another process's memfd `fd` (opened here) holding `size` bytes.
    pub fn map_foreign(
        &mut self,
        fd: i32,
        size: usize,
        device: usize,
        ctx: u64,
        key: (u32, i32, u64),
    ) -> Result<u64, Refusal> {
        let (data, offset) = layout(size);
        let at = self.map_fd(fd, data)?;
        let base = (at + offset) as u64;
        self.insert(Alloc {
            base,
            size,
            map_start: at,
            map_len: data,
            fd,
            serial: key.2,
            device,
            ctx,
            pooled: false,
            ipc: Some(key),
            free_queued: false,
        });
        Ok(base)
    }

    fn insert(&mut self, a: Alloc) {
        let i = RING_NEXT.fetch_add(1, Ordering::SeqCst) % RING;
        RING_BASE[i].store(a.base, Ordering::SeqCst);
        RING_SIZE[i].store(a.size as u64, Ordering::SeqCst);
        RING_SERIAL[i].store(a.serial, Ordering::SeqCst);
        self.live.insert(a.base, a);
    }

    /// Unmaps and forgets the allocation at `base` (the caller checked it is live).
    pub fn release(&mut self, base: u64) {
        let Some(a) = self.live.remove(&base) else {
            return;
        };
        // SAFETY: the mapping is ours; putting the reservation back keeps the addresses
        // unusable (never reused) and faulting.
        unsafe {
            libc::mmap(
                a.map_start as *mut libc::c_void,
                a.map_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            );
            libc::close(a.fd);
        }
        if a.ipc.is_none() {
            self.used[a.device] -= round_up(a.size, ALIGN);
        }
        self.freed.insert(a.base, (a.size, a.serial));
    }

    /// The live allocation holding `ptr` (its one-past-the-end address included).
    pub fn find(&self, ptr: u64) -> Option<&Alloc> {
        self.live
            .range(..=ptr)
            .next_back()
            .map(|(_, a)| a)
            .filter(|a| ptr <= a.base + a.size as u64)
    }

    pub fn find_mut(&mut self, ptr: u64) -> Option<&mut Alloc> {
        self.live
            .range_mut(..=ptr)
            .next_back()
            .map(|(_, a)| a)
            .filter(|a| ptr <= a.base + a.size as u64)
    }

    /// Why `ptr` is not live device memory: freed, or never device memory.
    pub fn why_not(&self, ptr: u64) -> String {
        match self.freed.range(..=ptr).next_back() {
            Some((b, (s, serial))) if ptr <= b + *s as u64 => format!(
                "{ptr:#x} is in allocation #{serial} ({b:#x}, {s} bytes), which was freed: use after free"
            ),
            _ => format!("{ptr:#x} is not device memory"),
        }
    }

    /// Checks `[ptr, ptr+n)` lies in one live allocation that is not queued for freeing.
    pub fn check_range(&self, ptr: u64, n: usize, what: &str) -> Result<&Alloc, Refusal> {
        let a = self.find(ptr).ok_or_else(|| {
            Refusal::new(
                CUDA_ERROR_INVALID_VALUE,
                format!("{what}: {}", self.why_not(ptr)),
            )
        })?;
        if a.free_queued {
            return Err(Refusal::new(
                CUDA_ERROR_INVALID_VALUE,
                format!("{what}: {ptr:#x} is in allocation #{} whose cuMemFreeAsync is already queued: use after free", a.serial),
            ));
        }
        if ptr + n as u64 > a.base + a.size as u64 {
            return Err(Refusal::new(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "{what}: {n} bytes at {ptr:#x} run past the end of allocation #{} ({:#x}, {} bytes)",
                    a.serial, a.base, a.size
                ),
            ));
        }
        Ok(a)
    }

    /// Makes every live allocation accessible (`true`) or not (`false`).
    pub fn open(&self, on: bool) {
        let prot = if on {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_NONE
        };
        EXECUTING.store(on, Ordering::SeqCst);
        for a in self.live.values() {
            // SAFETY: our own mapping; only its protection changes.
            unsafe { libc::mprotect(a.map_start as *mut libc::c_void, a.map_len, prot) };
        }
    }
}

/// A pointer into the reservation?
fn in_region(addr: u64) -> bool {
    let r = REGION.load(Ordering::SeqCst);
    r != 0 && addr >= r && addr < r + RESERVE as u64
}

static mut PREVIOUS: Option<libc::sigaction> = None;

fn write_hex(buf: &mut [u8], at: &mut usize, v: u64) {
    for s in b"0x" {
        buf[*at] = *s;
        *at += 1;
    }
    let mut started = false;
    for i in (0..16).rev() {
        let d = ((v >> (i * 4)) & 0xF) as u8;
        if d != 0 || started || i == 0 {
            started = true;
            buf[*at] = if d < 10 { b'0' + d } else { b'a' + d - 10 };
            *at += 1;
        }
    }
}

fn put(buf: &mut [u8], at: &mut usize, s: &[u8]) {
    buf[*at..*at + s.len()].copy_from_slice(s);
    *at += s.len();
}

extern "C" fn on_segv(sig: i32, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as u64;
    if in_region(addr) {
        // Only async-signal-safe work from here: a stack buffer, atomics, write(2), abort.
        let mut buf = [0u8; 512];
        let mut n = 0;
        put(&mut buf, &mut n, b"rivet-cuda-double: ");
        if EXECUTING.load(Ordering::SeqCst) {
            put(
                &mut buf,
                &mut n,
                b"device access outside any allocation at ",
            );
        } else {
            put(&mut buf, &mut n, b"host access to device memory at ");
        }
        write_hex(&mut buf, &mut n, addr);
        let mut best = (0u64, 0u64, u64::MAX);
        for i in 0..RING {
            let b = RING_BASE[i].load(Ordering::SeqCst);
            if b != 0 && b <= addr && addr - b < best.2 {
                best = (RING_SERIAL[i].load(Ordering::SeqCst), b, addr - b);
                let _ = RING_SIZE[i].load(Ordering::SeqCst);
            }
        }
        if best.0 != 0 {
            put(&mut buf, &mut n, b" (allocation #");
            let mut digits = [0u8; 20];
            let (mut v, mut k) = (best.0, 0);
            while v > 0 || k == 0 {
                digits[k] = b'0' + (v % 10) as u8;
                v /= 10;
                k += 1;
            }
            for i in (0..k).rev() {
                put(&mut buf, &mut n, &digits[i..=i]);
            }
            put(&mut buf, &mut n, b" at ");
            write_hex(&mut buf, &mut n, best.1);
            put(
                &mut buf,
                &mut n,
                b"); device pointers must not be dereferenced on the host\n",
            );
        } else {
            put(&mut buf, &mut n, b" (no allocation there)\n");
        }
        // SAFETY: write(2) and abort(3) are async-signal-safe; `buf[..n]` is initialised.
        unsafe {
            libc::write(2, buf.as_ptr().cast(), n);
            let log = crate::report::LOG_FD.load(Ordering::SeqCst);
            if log >= 0 {
                libc::write(log, buf.as_ptr().cast(), n);
            }
            libc::abort();
        }
    }
    // Not ours: hand the fault to whoever handled SIGSEGV before us.
    // SAFETY: PREVIOUS is written once, before this handler is installed.
    let prev = unsafe { *std::ptr::addr_of!(PREVIOUS) };
    match prev {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with SA_SIGINFO and this signature.
                let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, uctx);
            } else {
                // SAFETY: a plain handler installed without SA_SIGINFO.
                let f: extern "C" fn(i32) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // Default action: restore it and return, so the faulting access repeats and kills.
            // SAFETY: resetting a signal's disposition to SIG_DFL.
            unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
        }
    }
}

/// Installs the SIGSEGV handler (once per process, at `cuInit`).
pub fn install_fault_handler() {
    // SAFETY: sigaction with a zeroed struct and our handler; PREVIOUS is written before the
    // new handler can run.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction =
            on_segv as extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut new.sa_mask);
        libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old);
        *std::ptr::addr_of_mut!(PREVIOUS) = Some(old);
        libc::sigaction(libc::SIGSEGV, &new, std::ptr::null_mut());
    }
}
