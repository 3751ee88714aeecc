//! `extern "C"` helpers generated code calls, besides the maths of `codegen::cpu_lib::math::symbols()`:
//! local allocations, the fault slot through which generated code reports errors, float16/bfloat16 conversions (the `half` crate's, so that rounding
//! matches the interpreter), and the parallel-loop driver.

use std::cell::Cell;

/// Alignment of local buffers.
const LOCAL_ALIGN: usize = 64;

/// A failure inside generated code. The helper that finds it records it for the thread running
/// the code and the code returns a non-zero status: unwinding out of generated code is not
/// possible, and aborting the process is not allowed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Fault {
    /// A local buffer of `bytes` bytes: over `MAX_ALLOC_BYTES`, or refused by the system.
    Alloc { bytes: i64 },
    /// Checked mode: index `index` of dim `dim` of access site `site` outside `[0, extent)`.
    OutOfBounds {
        site: i64,
        dim: i64,
        index: i64,
        extent: i64,
    },
    /// A host callback failed; its error is in `callback::CALLBACK_ERROR`.
    Callback,
}

thread_local! {
    static FAULT: Cell<Option<Fault>> = const { Cell::new(None) };
}

/// Records `f` for this thread unless a fault is already recorded (the first one is reported).
pub(super) fn set_fault(f: Fault) {
    FAULT.with(|c| {
        if c.get().is_none() {
            c.set(Some(f))
        }
    })
}

/// Takes this thread's recorded fault.
pub(super) fn take_fault() -> Option<Fault> {
    FAULT.with(|c| c.take())
}

/// The per-thread arena of local buffers too large (or too dynamic) for a stack frame.
///
/// Blocks freed by generated code are kept per thread for the next call instead of going back
/// to the system: a kernel called in a loop allocates nothing once warm. Each block is
/// `LOCAL_ALIGN` aligned and starts with a header (`LOCAL_ALIGN` bytes, the capacity in the
/// first 8) so `rivet_free` needs no lookup. Invariants: a block handed out is zeroed over the
/// requested size (the IR's `Allocate` meaning); at most `ARENA_KEEP_BLOCKS` blocks and
/// `ARENA_KEEP_BYTES` bytes stay cached per thread, and they are freed when the thread ends;
/// sizes are checked (`MAX_ALLOC_BYTES`, exact arithmetic) before any layout is made, so a
/// size near 2^62 is a `Fault::Alloc`, never an overflow.
pub(super) mod arena {
    use super::{Fault, LOCAL_ALIGN};
    use crate::ir::limits::MAX_ALLOC_BYTES;
    use std::alloc::{alloc_zeroed, dealloc, Layout};
    use std::cell::RefCell;

    /// Cached blocks per thread, at most.
    pub const ARENA_KEEP_BLOCKS: usize = 8;
    /// Cached bytes per thread, at most.
    pub const ARENA_KEEP_BYTES: usize = 64 << 20;

    struct Cache {
        /// (block start, capacity past the header), unordered.
        blocks: Vec<(*mut u8, usize)>,
        bytes: usize,
    }

    impl Drop for Cache {
        fn drop(&mut self) {
            for (p, cap) in self.blocks.drain(..) {
                // SAFETY: cached blocks were allocated by `take` with this layout.
                unsafe { dealloc(p, layout(cap).expect("a cached block's layout")) }
            }
        }
    }

    thread_local! {
        static CACHE: RefCell<Cache> = const { RefCell::new(Cache { blocks: Vec::new(), bytes: 0 }) };
    }

    /// The layout of a block of `cap` usable bytes (header included).
    fn layout(cap: usize) -> Option<Layout> {
        Layout::from_size_align(cap.checked_add(LOCAL_ALIGN)?, LOCAL_ALIGN).ok()
    }

    /// The usable size for a request of `bytes`, or `None` when it is negative or over
    /// `MAX_ALLOC_BYTES`; rounded up to the alignment (so blocks are reused across sizes).
    fn capacity(bytes: i64) -> Option<usize> {
        let size = usize::try_from(bytes).ok()?;
        if size > MAX_ALLOC_BYTES {
            return None;
        }
        Some(size.max(1).div_ceil(LOCAL_ALIGN) * LOCAL_ALIGN)
    }

    /// Memory of `bytes` bytes, from this thread's cache or the system, or a fault; zeroed
    /// when `zero` (a reused block holds what its last user left: only for a local that
    /// `lower::overwrite` proved is stored in full before any read).
    pub fn take(bytes: i64, zero: bool) -> Result<*mut u8, Fault> {
        let cap = capacity(bytes).ok_or(Fault::Alloc { bytes })?;
        // The smallest cached block that fits.
        let hit = CACHE
            .try_with(|c| {
                let mut c = c.borrow_mut();
                let k = (0..c.blocks.len())
                    .filter(|&k| c.blocks[k].1 >= cap)
                    .min_by_key(|&k| c.blocks[k].1)?;
                let (p, have) = c.blocks.swap_remove(k);
                c.bytes -= have;
                Some(p)
            })
            .ok()
            .flatten();
        let base = match hit {
            Some(p) => {
                if zero {
                    // SAFETY: a cached block has at least `cap` usable bytes after its header.
                    unsafe { std::ptr::write_bytes(p.add(LOCAL_ALIGN), 0, cap) };
                }
                p
            }
            None => {
                let l = layout(cap).ok_or(Fault::Alloc { bytes })?;
                // SAFETY: the layout has a non-zero size.
                let p = unsafe { alloc_zeroed(l) };
                if p.is_null() {
                    return Err(Fault::Alloc { bytes });
                }
                // SAFETY: the header is within the block and aligned for a usize.
                unsafe { (p as *mut usize).write(cap) };
                p
            }
        };
        // SAFETY: the block holds the header then `cap` bytes.
        Ok(unsafe { base.add(LOCAL_ALIGN) })
    }

    /// Gives back a block from `take`: cached for this thread when the limits allow, else
    /// freed.
    ///
    /// # Safety
    /// `ptr` must come from `take` (on any thread) and not be given back twice.
    pub unsafe fn give(ptr: *mut u8) {
        // SAFETY: the caller's contract: the header precedes `ptr` in the same block.
        let base = unsafe { ptr.sub(LOCAL_ALIGN) };
        // SAFETY: `take` wrote the capacity there.
        let cap = unsafe { (base as *const usize).read() };
        let kept = CACHE
            .try_with(|c| {
                let mut c = c.borrow_mut();
                if c.blocks.len() < ARENA_KEEP_BLOCKS && c.bytes + cap <= ARENA_KEEP_BYTES {
                    c.blocks.push((base, cap));
                    c.bytes += cap;
                    true
                } else {
                    false
                }
            })
            .unwrap_or(false);
        if !kept {
            // SAFETY: allocated by `take` with this layout.
            unsafe { dealloc(base, layout(cap).expect("a block's layout")) }
        }
    }

    /// Blocks and bytes cached on this thread (for tests).
    #[cfg(test)]
    pub fn cached() -> (usize, usize) {
        CACHE.with(|c| {
            let c = c.borrow();
            (c.blocks.len(), c.bytes)
        })
    }
}

/// Zeroed, 64-byte aligned memory of `bytes` bytes (at least 1) from this thread's arena, or
/// null with a `Fault::Alloc` recorded when the size is negative, over `MAX_ALLOC_BYTES`, or
/// refused by the system.
extern "C" fn rivet_alloc(bytes: i64) -> *mut u8 {
    match arena::take(bytes, true) {
        Ok(p) => p,
        Err(f) => {
            set_fault(f);
            std::ptr::null_mut()
        }
    }
}

/// `rivet_alloc` without the zeroing, for a local `lower::overwrite` proved is stored in full
/// before any read (a reused block still holds its last user's data, which is never read).
extern "C" fn rivet_alloc_uninit(bytes: i64) -> *mut u8 {
    match arena::take(bytes, false) {
        Ok(p) => p,
        Err(f) => {
            set_fault(f);
            std::ptr::null_mut()
        }
    }
}

/// Gives memory from `rivet_alloc` back to the arena.
///
/// # Safety
/// `ptr` must come from a successful `rivet_alloc` and not be freed twice.
unsafe extern "C" fn rivet_free(ptr: *mut u8, _bytes: i64) {
    // SAFETY: the caller's contract.
    unsafe { arena::give(ptr) }
}

/// Gives the blocks at `table[n - 1]`, ..., `table[0]` back to the arena: the heap locals of
/// a root `Allocate` (`stmt::allocate_root`), in one call however many they are.
///
/// # Safety
/// `table` must hold `n` addresses from successful `rivet_alloc`s, none freed yet.
unsafe extern "C" fn rivet_free_n(table: *const *mut u8, n: i64) {
    for k in (0..n.max(0) as usize).rev() {
        // SAFETY: the caller's contract.
        unsafe { arena::give(table.add(k).read()) }
    }
}

/// Zeroes `bytes` bytes at `ptr` (a local buffer in a stack frame).
///
/// # Safety
/// `ptr` must be valid for `bytes` bytes of writes.
unsafe extern "C" fn rivet_zero(ptr: *mut u8, bytes: i64) {
    // SAFETY: the caller's contract; generated code passes a stack slot and its size.
    unsafe { std::ptr::write_bytes(ptr, 0, bytes.max(0) as usize) }
}

/// Four float32 `exp`s in place (`codegen::cpu_lib::exp32`, lane by lane: the scalar `rivet_expf`), for
/// the cold block of packed f32x4 code (a lane outside `exp32`'s fast range).
///
/// # Safety
/// `p` must be valid for reads and writes of four f32 (generated code passes a 16-byte stack
/// slot).
unsafe extern "C" fn rivet_expf4(p: *mut f32) -> i32 {
    // SAFETY: the caller's contract.
    let x = unsafe { p.cast::<[f32; 4]>().read_unaligned() };
    let y = x.map(crate::codegen::cpu_lib::exp32::exp32);
    // SAFETY: as above.
    unsafe { p.cast::<[f32; 4]>().write_unaligned(y) };
    0
}

/// `y[i] = exp(x[i] - s)` (rivet's float32 `exp`) for `i < n`: the call a vector loop of
/// that form becomes on a CPU with AVX-512 (`cranelift/exp_run.rs`).
///
/// # Safety
/// `x` valid for reads and `y` for writes of `n` floats, the same run or disjoint (generated
/// code passes the addresses of a loop the bounds proof covered).
unsafe extern "C" fn rivet_exp_run(y: *mut f32, x: *const f32, n: i64, s: f32) {
    // SAFETY: the caller's contract.
    unsafe { crate::codegen::cpu_lib::exp32::exp_sub_run(y, x, n.max(0) as usize, s) }
}

/// Sixteen float32 `erf`s in place (`codegen::cpu_lib::erff16`: bit for bit the scalar `rivet_erff`;
/// AVX-512 when the CPU has it), for 16-lane vector code.
///
/// # Safety
/// `p` must be valid for reads and writes of sixteen f32 (generated code passes a 64-byte
/// stack slot).
unsafe extern "C" fn rivet_erff16(p: *mut f32) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { crate::codegen::cpu_lib::erff16::erff16_in_place(p) };
    0
}

/// Four float32 `erf`s in place (`codegen::cpu_lib::erff4`: bit for bit the scalar `rivet_erff`), for
/// packed f32x4 vector code.
///
/// # Safety
/// As `rivet_expf4`.
unsafe extern "C" fn rivet_erff4(p: *mut f32) -> i32 {
    // SAFETY: the caller's contract.
    let x = unsafe { p.cast::<[f32; 4]>().read_unaligned() };
    let y = crate::codegen::cpu_lib::erff4::erff4(x);
    // SAFETY: as above.
    unsafe { p.cast::<[f32; 4]>().write_unaligned(y) };
    0
}

/// Checked mode: records an out-of-bounds access (the generated code then returns).
extern "C" fn rivet_oob(site: i64, dim: i64, index: i64, extent: i64) {
    set_fault(Fault::OutOfBounds {
        site,
        dim,
        index,
        extent,
    })
}

extern "C" fn rivet_f16_to_f32(bits: u32) -> f32 {
    half::f16::from_bits(bits as u16).to_f32()
}

extern "C" fn rivet_f32_to_f16(x: f32) -> u32 {
    half::f16::from_f32(x).to_bits() as u32
}

extern "C" fn rivet_f64_to_f16(x: f64) -> u32 {
    half::f16::from_f32(x as f32).to_bits() as u32
}

extern "C" fn rivet_f32_to_bf16(x: f32) -> u32 {
    half::bf16::from_f32(x).to_bits() as u32
}

extern "C" fn rivet_f64_to_bf16(x: f64) -> u32 {
    half::bf16::from_f64(x).to_bits() as u32
}

/// Every helper of this backend: (symbol, address).
pub(super) fn symbols() -> Vec<(&'static str, *const u8)> {
    vec![
        ("rivet_alloc", rivet_alloc as *const u8),
        ("rivet_alloc_uninit", rivet_alloc_uninit as *const u8),
        ("rivet_free", rivet_free as *const u8),
        ("rivet_free_n", rivet_free_n as *const u8),
        ("rivet_zero", rivet_zero as *const u8),
        ("rivet_expf4", rivet_expf4 as *const u8),
        ("rivet_exp_run", rivet_exp_run as *const u8),
        ("rivet_erff4", rivet_erff4 as *const u8),
        ("rivet_erff16", rivet_erff16 as *const u8),
        ("rivet_oob", rivet_oob as *const u8),
        ("rivet_f16_to_f32", rivet_f16_to_f32 as *const u8),
        ("rivet_f32_to_f16", rivet_f32_to_f16 as *const u8),
        ("rivet_f64_to_f16", rivet_f64_to_f16 as *const u8),
        ("rivet_f32_to_bf16", rivet_f32_to_bf16 as *const u8),
        ("rivet_f64_to_bf16", rivet_f64_to_bf16 as *const u8),
        (
            "rivet_parallel_for",
            super::parallel::rivet_parallel_for as *const u8,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::arena::{cached, give, take, ARENA_KEEP_BLOCKS};
    use super::Fault;
    use crate::ir::limits::MAX_ALLOC_BYTES;

    #[test]
    fn the_arena_reuses_blocks_zeroed_and_refuses_hostile_sizes() {
        // On a thread of its own: the cache is per thread.
        std::thread::spawn(|| {
            let p = take(100, true).unwrap();
            assert_eq!(p as usize % 64, 0);
            // SAFETY: 100 bytes were handed out.
            unsafe {
                assert!(std::slice::from_raw_parts(p, 100).iter().all(|&b| b == 0));
                std::ptr::write_bytes(p, 0xA5, 100);
                give(p);
            }
            assert_eq!(cached(), (1, 128));
            // A smaller request reuses the block, zeroed again.
            let q = take(64, true).unwrap();
            assert_eq!(q, p);
            // SAFETY: the block holds at least 64 bytes.
            unsafe {
                assert!(std::slice::from_raw_parts(q, 64).iter().all(|&b| b == 0));
                std::ptr::write_bytes(q, 0x5A, 64);
                give(q);
            }
            // Without zeroing (`rivet_alloc_uninit`), the block comes back as it was left.
            let u = take(64, false).unwrap();
            assert_eq!(u, p);
            // SAFETY: as above.
            unsafe {
                assert!(std::slice::from_raw_parts(u, 64).iter().all(|&b| b == 0x5A));
                give(u);
            }
            // At most ARENA_KEEP_BLOCKS stay cached.
            let ps: Vec<*mut u8> = (0..ARENA_KEEP_BLOCKS + 3)
                .map(|_| take(8, true).unwrap())
                .collect();
            for p in ps {
                // SAFETY: each from `take`, given back once.
                unsafe { give(p) };
            }
            assert_eq!(cached().0, ARENA_KEEP_BLOCKS);
            for bytes in [
                -1,
                MAX_ALLOC_BYTES as i64 + 1,
                1 << 62,
                (1 << 62) + 63,
                i64::MAX,
                i64::MIN,
            ] {
                for zero in [true, false] {
                    assert_eq!(take(bytes, zero), Err(Fault::Alloc { bytes }), "{bytes}");
                }
            }
            // Size 0 gets a block too (allocations are at least one byte).
            let z = take(0, false).unwrap();
            // SAFETY: from `take`.
            unsafe { give(z) };
        })
        .join()
        .unwrap();
    }
}
