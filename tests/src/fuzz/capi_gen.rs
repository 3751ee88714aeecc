//! Generator 4 ("capi"): rivet's C ABI (`runtime/src/capi/`, header
//! `runtime/include/rivet/c_api.h`, docs/c_abi.md) called exactly as C would, with raw
//! `RivetAny` arrays, raw `DLTensor`s and raw handles.
//!
//! What a case draws: a target (a compiled kernel registered under `fuzz_capi.*`: `C = A*2+1`
//! of rank 1 or 2, `C = A + B`, int32 `C = A - B` of fixed shape; the built-in plain functions
//! `testing.echo`, `testing.nop`, `testing.axpy`; or a function of "another library" made with
//! `RivetFunctionCreate(Typed)` from a Rust callback that sums ints, records what it was given,
//! returns a managed tensor of its own (valid or malformed), fails in one of the documented and
//! undocumented ways, or answers an impossible result), reached through
//! `RivetFunctionGetGlobal` or `RivetFunctionSetGlobal` + `RivetFunctionGetGlobal`; a
//! well-typed argument list for it over guarded memory; then, for about half the cases, one or
//! two mutations: the count (negative, 0, off by one, `MAX_ARGS`, past it, `i32` extremes),
//! NULL `args`, NULL `result`, a NULL / freed / made-up function handle, unknown, negative and
//! result-only type codes, an argument of another kind, strings NULL or not UTF-8, `DLTensor`s
//! with hostile `ndim`, shape, strides, byte offset, dtype, device, NULL shape or data, the
//! read-only flag flipped, outputs aliasing or partially overlapping inputs. Around the calls:
//! `RivetFunctionGetGlobal` / `RivetFunctionSetGlobal` / `RivetFunctionCreateTyped` with bad
//! names (NULL, not UTF-8, empty), NULL out pointers, malformed signature JSON, an output rule
//! without a signature; `RivetAnyFree` of values that own nothing; freed and double-freed
//! handles.
//!
//! What a case checks: the process survives (the supervisor catches crashes); every return
//! code is `RIVET_OK` or `RIVET_ERR_USER` (never `RIVET_ERR_INTERNAL`, which is a rivet bug,
//! nor an undocumented code); every failure sets the thread's last error to a non-empty kind
//! that is a rivet error class name (`Error::from_kind_name`) and a non-empty message, leaves
//! `*result` `RIVET_NULL` and writes no memory; a success leaves the last error as it was (the
//! errno contract); arguments rivet must refuse (docs/c_abi.md "Hostile input") are refused;
//! results of successful calls equal a plain Rust reference computed from the arguments'
//! layouts (bit for bit), including where a tensor result points and how it is laid out;
//! guard bytes around every buffer and every byte of the inputs are intact, and of the
//! outputs only their own elements changed; a use of a freed handle is an `ArgumentError`;
//! nothing leaks: every managed-tensor result's deleter runs exactly once when
//! `RivetAnyFree`d, a foreign function's resource is released exactly once (and never when its
//! creation failed), and the number of live handles (`capi::live_handles`) is the same after
//! the case as before.
//!
//! Memory a case hands over is always either inside its own guarded buffers or a layout rivet
//! must refuse (a span past 64 bits, a NULL data pointer with elements): a layout that merely
//! lies about memory it does not own cannot be checked by anyone and is never passed.

use super::rng::Rng;
use super::{short, Outcome};
use dlpack_rs::ffi::{DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use rivet_compiler::ir::Expr;
use rivet_compiler::{build, te, Schedule};
use rivet_runtime::capi::import::{RivetFunctionCreate, RivetFunctionCreateTyped};
use rivet_runtime::capi::{
    live_handles, RivetAny, RivetAnyFree, RivetFunctionCall, RivetFunctionFree,
    RivetFunctionGetGlobal, RivetFunctionHandle, RivetFunctionSetGlobal, RivetGetLastError,
    RivetValue, MAX_ARGS, RIVET_BOOL, RIVET_DLTENSOR, RIVET_DLTENSOR_READONLY, RIVET_ERR_INTERNAL,
    RIVET_ERR_USER, RIVET_FLOAT, RIVET_FUNCTION, RIVET_INT, RIVET_MANAGED_TENSOR, RIVET_NULL,
    RIVET_OK, RIVET_STR,
};
use rivet_runtime::{registry, DType, Error, Function};
use rivet_tests::ffi::try_last_error;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Whether a use of a freed (or made-up) function handle is refused with an `ArgumentError`.
/// True since `runtime/src/capi/mod.rs` keeps a table of live handles (`capi::live_handles`,
/// `capi::handle_function`): before that, such a use was undefined behaviour and these cases
/// could not run.
const FREED_HANDLES_CHECKED: bool = true;

/// Guard bytes on each side of every buffer.
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xCC;
/// Bytes every output buffer starts as.
const POISON: u8 = 0xA5;
/// Entries allocated for shape and strides, whatever ndim says (rivet reads at most 64).
const DIMS_CAP: usize = 72;
/// Views with more elements than this are never passed (they would be a lie or slow).
const MAX_ELEMS: i128 = 4096;

pub const K_SCALE1: &str = "fuzz_capi.scale1";
pub const K_SCALE2: &str = "fuzz_capi.scale2";
pub const K_ADD: &str = "fuzz_capi.add";
pub const K_ISUB: &str = "fuzz_capi.isub";
/// The fixed size of `K_ISUB`'s int32 vectors.
pub const ISUB_N: i64 = 5;

/// Builds and registers the compiled kernels once per process: `fuzz_capi.scale1` /
/// `scale2` (`C = A*2+1`, float32, symbolic rank 1 / 2), `fuzz_capi.add` (`C = A + B`,
/// float32, symbolic n), `fuzz_capi.isub` (`C = A - B`, int32, fixed [5]).
pub fn ensure_kernels() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let e = |e: rivet_compiler::Error| e.to_string();
        let sym =
            |rank: usize| -> Vec<Expr> { (0..rank).map(|d| te::var(&format!("n{d}"))).collect() };
        for rank in 1..=2usize {
            let shape = sym(rank);
            let a = te::placeholder(&shape, DType::F32, "A").map_err(e)?;
            let a2 = a.clone();
            let c = te::compute_dyn(&shape, |i| a2.idx(i) * 2.0 + 1.0, "C").map_err(e)?;
            let s = Schedule::new(&[c.clone()]).map_err(e)?;
            let m = build(&s, &[a, c], "cpu", "k").map_err(e)?;
            let f = m.get_function("k").map_err(|x| x.to_string())?;
            let name = if rank == 1 { K_SCALE1 } else { K_SCALE2 };
            registry::register(name, f, true).map_err(|x| x.to_string())?;
        }
        let two = |shape: Vec<Expr>, dtype: DType, sub: bool, name: &str| -> Result<(), String> {
            let a = te::placeholder(&shape, dtype, "A").map_err(e)?;
            let b = te::placeholder(&shape, dtype, "B").map_err(e)?;
            let (a2, b2) = (a.clone(), b.clone());
            let c = te::compute_dyn(
                &shape,
                |i| {
                    if sub {
                        a2.idx(i) - b2.idx(i)
                    } else {
                        a2.idx(i) + b2.idx(i)
                    }
                },
                "C",
            )
            .map_err(e)?;
            let s = Schedule::new(&[c.clone()]).map_err(e)?;
            let m = build(&s, &[a, b, c], "cpu", "k").map_err(e)?;
            let f = m.get_function("k").map_err(|x| x.to_string())?;
            registry::register(name, f, true).map_err(|x| x.to_string())
        };
        two(sym(1), DType::F32, false, K_ADD)?;
        two(vec![Expr::int(ISUB_N)], DType::I32, true, K_ISUB)?;
        Ok(())
    })
    .clone()
}

// ---- guarded buffers and DLTensor descriptions ---------------------------------------------

/// Host memory with `GUARD` guard bytes on each side; `snap` is every byte before the call.
pub struct Region {
    mem: Vec<u64>,
    data: usize,
    snap: Vec<u8>,
}

impl Region {
    /// `data` bytes, filled with random float32 / int32 values (`kind` 1 / 2) or `POISON` (0).
    pub fn new(data: usize, kind: u8, r: &mut Rng) -> Region {
        let total = (2 * GUARD + data).div_ceil(8);
        let mut reg = Region {
            mem: vec![0u64; total],
            data,
            snap: Vec::new(),
        };
        {
            let all = reg.all_mut();
            all.fill(GUARD_BYTE);
            let d = &mut all[GUARD..GUARD + data];
            match kind {
                0 => d.fill(POISON),
                _ => {
                    for w in d.chunks_mut(4) {
                        let v = if kind == 1 {
                            (r.range(-16, 16) as f32 * 0.5).to_bits()
                        } else {
                            r.range(-1000, 1000) as i32 as u32
                        };
                        let b = v.to_le_bytes();
                        w.copy_from_slice(&b[..w.len()]);
                    }
                }
            }
        }
        reg.snap = reg.all().to_vec();
        reg
    }
    fn all(&self) -> &[u8] {
        // SAFETY: the Vec<u64>'s own bytes.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr() as *const u8, self.mem.len() * 8) }
    }
    fn all_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above.
        unsafe {
            std::slice::from_raw_parts_mut(self.mem.as_mut_ptr() as *mut u8, self.mem.len() * 8)
        }
    }
    /// Where the data region starts (64-byte guard before it).
    pub fn base(&self) -> *mut u8 {
        (self.mem.as_ptr() as *mut u8).wrapping_add(GUARD)
    }
    pub fn lo(&self) -> i128 {
        self.base() as usize as i128
    }
    pub fn hi(&self) -> i128 {
        self.lo() + self.data as i128
    }
    /// The bytes now (rivet may have written them through the pointers it was given).
    pub fn now(&self) -> Vec<u8> {
        self.all().to_vec()
    }
    /// Bytes in all, guards included.
    pub fn total(&self) -> usize {
        self.snap.len()
    }
    /// Offset in `all()` of the first data byte.
    pub fn data_start(&self) -> usize {
        GUARD
    }
    /// The data bytes before the call.
    pub fn snapshot_data(&self) -> Vec<u8> {
        self.snap[GUARD..GUARD + self.data].to_vec()
    }
    /// The data bytes now.
    pub fn data_now(&self) -> Vec<u8> {
        self.all()[GUARD..GUARD + self.data].to_vec()
    }
    /// Offset in `all()` of the data byte at address `addr`.
    fn index_of(&self, addr: i128) -> usize {
        (addr - self.lo()) as usize + GUARD
    }
    /// `None` when no byte outside `allowed` (indices into `all()`) changed.
    pub fn check(&self, allowed: &[bool], what: &str) -> Option<String> {
        let now = self.now();
        let i = (0..now.len())
            .find(|&i| now[i] != self.snap[i] && !allowed.get(i).copied().unwrap_or(false))?;
        let place = if i < GUARD || i >= GUARD + self.data {
            "a guard byte"
        } else {
            "a byte no output owns"
        };
        Some(format!(
            "{what}: {place} at {} (data offset {}) changed from {:#04x} to {:#04x}",
            i,
            i as i64 - GUARD as i64,
            self.snap[i],
            now[i]
        ))
    }
}

/// The rivet dtype of a DLPack (code, bits, lanes): the fuzzers' own reading, shared with
/// the DLPack generator (independent of the runtime's `DType::from_dlpack` it checks).
pub use super::dlpack_gen::supported;

const F32: (u8, u8, u16) = (2, 32, 1);
const F64: (u8, u8, u16) = (2, 64, 1);
const I32: (u8, u8, u16) = (0, 32, 1);

/// A `DLTensor` as a case describes it (arrays of `DIMS_CAP` entries, whatever `ndim` says).
#[derive(Clone, Debug)]
struct TDesc {
    region: usize,
    ndim: i32,
    shape: Vec<i64>,
    strides: Vec<i64>,
    null_shape: bool,
    null_strides: bool,
    null_data: bool,
    byte_offset: u64,
    dtype: (u8, u8, u16),
    device: (u32, i32),
}

/// What a description amounts to (the truth, computed with 128-bit arithmetic).
#[derive(Clone, Debug)]
enum Verdict {
    /// rivet must refuse it (docs/c_abi.md "Hostile input").
    Refuse(String),
    /// No elements: accepted or refused, never read.
    Empty,
    /// Every element inside the region: the byte address of each, row-major.
    Inside(Vec<i128>),
    /// Representable, but about memory the case does not own (or too many elements): never
    /// passed.
    Lie,
}

impl TDesc {
    fn rank(&self) -> usize {
        self.ndim.clamp(0, 64) as usize
    }
    fn dims(&self) -> &[i64] {
        &self.shape[..self.rank()]
    }
    /// The strides rivet must use: given, or compact row-major for NULL (exact, i128).
    fn eff_strides(&self) -> Vec<i128> {
        let n = self.rank();
        if self.null_strides || n == 0 {
            let mut s = vec![0i128; n];
            let mut run = 1i128;
            for d in (0..n).rev() {
                s[d] = run;
                run = run.saturating_mul((self.shape[d] as i128).max(1));
            }
            s
        } else {
            self.strides[..n].iter().map(|&x| x as i128).collect()
        }
    }
    fn verdict(&self, regions: &[Region]) -> Verdict {
        if !(0..=64).contains(&self.ndim) {
            return Verdict::Refuse(format!("ndim {}", self.ndim));
        }
        if self.ndim > 0 && self.null_shape {
            return Verdict::Refuse("NULL shape".into());
        }
        let Some(dt) = supported(self.dtype) else {
            return Verdict::Refuse(format!("dtype {:?}", self.dtype));
        };
        match self.device {
            (1, _) | (3, _) => {}
            (2, id) if id >= 0 => {}
            d => return Verdict::Refuse(format!("device {d:?}")),
        }
        let dims = self.dims();
        if let Some(d) = dims.iter().find(|&&d| d < 0) {
            return Verdict::Refuse(format!("negative dim {d}"));
        }
        if dims.contains(&0) {
            return Verdict::Empty;
        }
        let numel: i128 = dims.iter().map(|&d| d as i128).product();
        let size = dt.size() as i128;
        let strides = self.eff_strides();
        let (mut lo, mut hi) = (0i128, 0i128);
        for (&n, &s) in dims.iter().zip(&strides) {
            let reach = (n as i128 - 1) * s;
            if reach < 0 {
                lo += reach
            } else {
                hi += reach
            }
        }
        if numel > i64::MAX as i128
            || lo < i64::MIN as i128
            || hi > i64::MAX as i128
            || (hi - lo + 1) * size > isize::MAX as i128
        {
            return Verdict::Refuse(format!("span overflows (numel {numel}, lo {lo}, hi {hi})"));
        }
        if self.null_data {
            return Verdict::Refuse("NULL data".into());
        }
        let reg = &regions[self.region];
        let first = reg.lo() + self.byte_offset as i128;
        if first + lo * size < reg.lo() || first + (hi + 1) * size > reg.hi() || numel > MAX_ELEMS {
            return Verdict::Lie;
        }
        Some(
            (0..numel)
                .map(|f| {
                    let mut rem = f;
                    let mut at = first;
                    for d in (0..dims.len()).rev() {
                        at += (rem % dims[d] as i128) * strides[d] * size;
                        rem /= dims[d] as i128;
                    }
                    at
                })
                .collect(),
        )
        .map(Verdict::Inside)
        .unwrap_or(Verdict::Lie)
    }
    fn dl(&self, regions: &[Region]) -> DLTensor {
        DLTensor {
            data: if self.null_data {
                std::ptr::null_mut()
            } else {
                regions[self.region].base() as *mut c_void
            },
            device: DLDevice {
                device_type: self.device.0,
                device_id: self.device.1,
            },
            ndim: self.ndim,
            dtype: DLDataType {
                code: self.dtype.0,
                bits: self.dtype.1,
                lanes: self.dtype.2,
            },
            shape: if self.null_shape {
                std::ptr::null_mut()
            } else {
                self.shape.as_ptr() as *mut i64
            },
            strides: if self.null_strides {
                std::ptr::null_mut()
            } else {
                self.strides.as_ptr() as *mut i64
            },
            byte_offset: self.byte_offset,
        }
    }
}

/// A random valid layout of `shape` in a fresh region (`fill` as `Region::new`): permuted,
/// stepped, reversed and (inputs only) broadcast dims, some slack before and after.
fn valid_tensor(
    shape: &[i64],
    dtype: (u8, u8, u16),
    may_bcast: bool,
    fill: u8,
    regions: &mut Vec<Region>,
    r: &mut Rng,
) -> TDesc {
    let rank = shape.len();
    let size = supported(dtype).map_or(4, |d| d.size()) as i64;
    let mut perm: Vec<usize> = (0..rank).collect();
    if r.chance(0.4) {
        for i in (1..rank).rev() {
            perm.swap(i, r.below(i as u64 + 1) as usize);
        }
    }
    let empty = shape.contains(&0);
    let mut strides = vec![0i64; DIMS_CAP];
    let mut run = 1i64;
    let mut flip_off = 0i64;
    for &d in perm.iter().rev() {
        if may_bcast && r.chance(0.15) {
            continue;
        }
        let s = run * if r.chance(0.3) { 2 } else { 1 };
        if r.chance(0.2) {
            strides[d] = -s;
            if !empty {
                flip_off += (shape[d] - 1) * s;
            }
        } else {
            strides[d] = s;
        }
        run = s * shape[d].max(1);
    }
    let before = r.range(0, 3);
    let after = r.range(0, 3);
    let span = if empty { 0 } else { run };
    let data = ((before + span + after) * size) as usize;
    regions.push(Region::new(data, fill, r));
    let mut sh = vec![1i64; DIMS_CAP];
    sh[..rank].copy_from_slice(shape);
    // NULL strides (compact row-major) where the layout is compact anyway.
    let null_strides = r.chance(0.3) && strides[..rank] == compact(shape)[..];
    TDesc {
        region: regions.len() - 1,
        ndim: rank as i32,
        shape: sh,
        strides,
        null_shape: false,
        null_strides,
        null_data: false,
        byte_offset: ((before + flip_off) * size) as u64,
        dtype,
        device: (1, 0),
    }
}

fn compact(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![0i64; shape.len()];
    let mut run = 1i64;
    for d in (0..shape.len()).rev() {
        s[d] = run;
        run = run.wrapping_mul(shape[d].max(1));
    }
    s
}

/// One hostile change to a tensor description; a change that would make it a lie about
/// memory is turned into one rivet must refuse (NULL data) or undone.
fn mutate_tensor(t: &mut TDesc, regions: &[Region], r: &mut Rng, log: &mut String) {
    let orig = t.clone();
    let rank = t.rank();
    match r.below(10) {
        0 => {
            t.ndim = r.pick(&[-1, 65, i32::MAX, i32::MIN, 64, t.ndim + 1, t.ndim - 1]);
            let _ = write!(log, "ndim={} ", t.ndim);
        }
        1 if rank > 0 => {
            let k = r.below(rank as u64) as usize;
            t.shape[k] = if r.chance(0.5) {
                r.adversarial()
            } else {
                r.pick(&[-1, 0, 1 << 31, 1 << 62, i64::MAX])
            };
            let _ = write!(log, "shape[{k}]={} ", t.shape[k]);
        }
        2 if rank > 0 => {
            let k = r.below(rank as u64) as usize;
            t.null_strides = false;
            t.strides[k] = r.pick(&[
                0,
                -1,
                1 << 62,
                -(1 << 62),
                i64::MAX,
                i64::MIN,
                1 << 31,
                (1 << 61) + 1,
                t.strides[k] + 1,
            ]);
            let _ = write!(log, "strides[{k}]={} ", t.strides[k]);
        }
        3 => {
            t.byte_offset = r.pick(&[
                u64::MAX,
                1 << 63,
                1 << 62,
                t.byte_offset + 1,
                t.byte_offset + 2,
                t.byte_offset + 3,
                regions[t.region].data as u64 + 8,
                0,
            ]);
            let _ = write!(log, "byte_offset={} ", t.byte_offset);
        }
        4 => {
            t.dtype = if r.chance(0.5) {
                r.pick(&[
                    F32,
                    F64,
                    I32,
                    (1, 8, 1),
                    (6, 8, 1),
                    (2, 16, 1),
                    (4, 16, 1),
                    (0, 64, 1),
                ])
            } else {
                (
                    r.next() as u8 % 20,
                    r.pick(&[0u8, 1, 7, 8, 16, 32, 64, 128, 255]),
                    r.pick(&[0u16, 1, 2, 4, u16::MAX]),
                )
            };
            let _ = write!(log, "dtype={:?} ", t.dtype);
        }
        5 => {
            t.device = r.pick(&[
                (2, 0),
                (3, 0),
                (2, -1),
                (999, 0),
                (13, 0),
                (1, 5),
                (1, i32::MIN),
                (0, 0),
                (u32::MAX, 0),
            ]);
            let _ = write!(log, "device={:?} ", t.device);
        }
        6 => {
            t.null_shape = true;
            let _ = write!(log, "null_shape ");
        }
        7 => {
            t.null_data = true;
            let _ = write!(log, "null_data ");
        }
        8 => {
            t.null_strides = !t.null_strides;
            let _ = write!(log, "null_strides={} ", t.null_strides);
        }
        _ => {
            // Several dims hostile at once: products and spans that overflow.
            for k in 0..rank {
                t.shape[k] = r.pick(&[3_037_000_500, 1 << 31, 1 << 32, 46341, 2]);
            }
            let _ = write!(log, "shape={:?} ", t.dims());
        }
    }
    let v = t.verdict(regions);
    if let Verdict::Refuse(why) = &v {
        let _ = write!(log, "(must refuse: {why}) ");
    }
    if let Verdict::Lie = v {
        if r.chance(0.5) {
            t.null_data = true;
            let _ = write!(log, "(lie: null_data) ");
        } else {
            *t = orig;
            let _ = write!(log, "(lie: undone) ");
        }
    }
}

// ---- foreign callbacks ---------------------------------------------------------------------

/// What a foreign function's callback does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum FKind {
    /// Sums its INT arguments (any other kind: "ArgumentError: ...").
    Sum,
    /// Records what it was given (`PROBE`), returns NULL.
    Probe,
    /// Returns a managed tensor of its own: 0 valid float32 [4], 1 ndim 65, 2 dtype (9, 9, 9),
    /// 3 NULL data with elements, 4 DLPack major version 7, 5 NULL shape.
    Tensor(u8),
    /// Fails: 0 "ShapeError: boom", 1 "NoSuchKind: x", 2 no ": ", 3 no message (NULL result),
    /// 4 not UTF-8, 5 code -2, 6 code 7, 7 "InternalError: x", 8 code -1 with a managed tensor.
    Fail(u8),
    /// Code 0 with a result no result may have: 0 type code 99, 1 a function, 2 a NULL string,
    /// 3 a string not UTF-8, 4 type code 5 (a DLTensor), 5 a NULL managed tensor.
    Weird(u8),
    /// Returns its first argument as it got it (NULL without arguments).
    EchoFirst,
}

struct Res {
    kind: FKind,
}

static RES_RELEASED: AtomicUsize = AtomicUsize::new(0);
/// Managed tensors a foreign callback made, and how many of them were deleted.
static OWN_MADE: AtomicUsize = AtomicUsize::new(0);
static OWN_DELETED: AtomicUsize = AtomicUsize::new(0);
/// Deleters of managed-tensor results the case intercepted and saw run.
static RESULT_DELETED: AtomicUsize = AtomicUsize::new(0);

/// What the probe callback saw of one argument.
#[derive(Clone, Debug, PartialEq)]
enum Seen {
    Null,
    Int(i64),
    Float(u64),
    Bool(i64),
    Str(Vec<u8>),
    Tensor {
        code: i32,
        first: usize,
        shape: Vec<i64>,
        strides: Vec<i64>,
        dtype: (u8, u8, u16),
        device: (u32, i32),
    },
    Other(i32),
}

thread_local! {
    static PROBE: RefCell<Option<Vec<Seen>>> = const { RefCell::new(None) };
    static CB_TEXT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Original deleters of intercepted results, by managed tensor address.
    static ORIG_DELETERS: RefCell<HashMap<usize, unsafe extern "C" fn(*mut DLManagedTensorVersioned)>> =
        RefCell::new(HashMap::new());
}

unsafe extern "C" fn release_res(resource: *mut c_void) {
    RES_RELEASED.fetch_add(1, Ordering::SeqCst);
    if !resource.is_null() {
        // SAFETY: `make_foreign`'s box, released once (the contract under test).
        drop(unsafe { Box::from_raw(resource as *mut Res) });
    }
}

/// A callback's managed tensor and its arrays and data.
#[repr(C)]
struct Own {
    managed: DLManagedTensorVersioned,
    shape: [i64; DIMS_CAP],
    strides: [i64; DIMS_CAP],
    data: [f32; 4],
}

const OWN_VALUES: [f32; 4] = [1.5, -2.0, 0.25, 8.0];

unsafe extern "C" fn delete_own(p: *mut DLManagedTensorVersioned) {
    OWN_DELETED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: `own_tensor`'s box (the managed tensor is its first field).
    drop(unsafe { Box::from_raw(p as *mut Own) });
}

fn own_tensor(mode: u8) -> *mut DLManagedTensorVersioned {
    OWN_MADE.fetch_add(1, Ordering::SeqCst);
    let b = Box::into_raw(Box::new(Own {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion {
                major: if mode == 4 { 7 } else { 1 },
                minor: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_own),
            flags: 0,
            dl_tensor: DLTensor {
                data: std::ptr::null_mut(),
                device: DLDevice {
                    device_type: 1,
                    device_id: 0,
                },
                ndim: if mode == 1 { 65 } else { 1 },
                dtype: if mode == 2 {
                    DLDataType {
                        code: 9,
                        bits: 9,
                        lanes: 9,
                    }
                } else {
                    DLDataType {
                        code: 2,
                        bits: 32,
                        lanes: 1,
                    }
                },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape: [4; DIMS_CAP],
        strides: [1; DIMS_CAP],
        data: OWN_VALUES,
    }));
    // SAFETY: a live box; the pointers go to its own fields.
    unsafe {
        let o = &mut *b;
        if mode != 3 {
            o.managed.dl_tensor.data = o.data.as_mut_ptr() as *mut c_void;
        }
        if mode != 5 {
            o.managed.dl_tensor.shape = o.shape.as_mut_ptr();
        }
        o.managed.dl_tensor.strides = o.strides.as_mut_ptr();
    }
    b as *mut DLManagedTensorVersioned
}

/// Writes a failure text (bytes, NUL added) as a RIVET_STR result valid until the next call.
unsafe fn cb_text(result: *mut RivetAny, text: &[u8]) {
    let p = CB_TEXT.with(|t| {
        let mut t = t.borrow_mut();
        t.clear();
        t.extend_from_slice(text);
        t.push(0);
        t.as_ptr() as *mut c_void
    });
    // SAFETY: the host passes a writable result.
    unsafe { *result = RivetAny::ptr(RIVET_STR, p) };
}

unsafe extern "C" fn cb_call(
    resource: *mut c_void,
    args: *const RivetAny,
    num_args: i32,
    result: *mut RivetAny,
) -> i32 {
    // SAFETY: the host's contract (C ABI): resource is ours, args hold num_args values, result
    // is writable.
    unsafe {
        let res = &*(resource as *const Res);
        let args: &[RivetAny] = if num_args <= 0 || args.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(args, num_args as usize)
        };
        match res.kind {
            FKind::Sum => {
                let mut s = 0i64;
                for (i, a) in args.iter().enumerate() {
                    if a.type_code != RIVET_INT {
                        cb_text(
                            result,
                            format!("ArgumentError: argument {i} has type code {}", a.type_code)
                                .as_bytes(),
                        );
                        return RIVET_ERR_USER;
                    }
                    s = s.wrapping_add(a.value.v_int64);
                }
                *result = RivetAny::int(s);
                RIVET_OK
            }
            FKind::Probe => {
                let seen = args
                    .iter()
                    .map(|a| match a.type_code {
                        RIVET_NULL => Seen::Null,
                        RIVET_INT => Seen::Int(a.value.v_int64),
                        RIVET_FLOAT => Seen::Float(a.value.v_float64.to_bits()),
                        RIVET_BOOL => Seen::Bool(a.value.v_int64),
                        RIVET_STR => Seen::Str(
                            CStr::from_ptr(a.value.v_ptr as *const c_char)
                                .to_bytes()
                                .to_vec(),
                        ),
                        c @ (RIVET_DLTENSOR | RIVET_DLTENSOR_READONLY) => {
                            let t = &*(a.value.v_ptr as *const DLTensor);
                            let n = t.ndim.clamp(0, 64) as usize;
                            let read = |p: *const i64| {
                                if p.is_null() || n == 0 {
                                    Vec::new()
                                } else {
                                    std::slice::from_raw_parts(p, n).to_vec()
                                }
                            };
                            Seen::Tensor {
                                code: c,
                                first: (t.data as usize).wrapping_add(t.byte_offset as usize),
                                shape: read(t.shape),
                                strides: read(t.strides),
                                dtype: (t.dtype.code, t.dtype.bits, t.dtype.lanes),
                                device: (t.device.device_type, t.device.device_id),
                            }
                        }
                        c => Seen::Other(c),
                    })
                    .collect();
                PROBE.with(|p| *p.borrow_mut() = Some(seen));
                *result = RivetAny::NULL;
                RIVET_OK
            }
            FKind::Tensor(mode) => {
                *result = RivetAny::ptr(RIVET_MANAGED_TENSOR, own_tensor(mode) as *mut c_void);
                RIVET_OK
            }
            FKind::Fail(mode) => match mode {
                0 => {
                    cb_text(result, b"ShapeError: boom");
                    RIVET_ERR_USER
                }
                1 => {
                    cb_text(result, b"NoSuchKind: x");
                    RIVET_ERR_USER
                }
                2 => {
                    cb_text(result, b"no kind here");
                    RIVET_ERR_USER
                }
                3 => RIVET_ERR_USER,
                4 => {
                    cb_text(result, b"DTypeError: \xff\xfe bytes");
                    RIVET_ERR_USER
                }
                5 => {
                    cb_text(result, b"ShapeError: but internal");
                    RIVET_ERR_INTERNAL
                }
                6 => 7,
                7 => {
                    cb_text(result, b"InternalError: x");
                    RIVET_ERR_USER
                }
                _ => {
                    *result = RivetAny::ptr(RIVET_MANAGED_TENSOR, own_tensor(0) as *mut c_void);
                    RIVET_ERR_USER
                }
            },
            FKind::Weird(mode) => {
                *result = match mode {
                    0 => RivetAny::ptr(99, std::ptr::null_mut()),
                    1 => RivetAny::ptr(RIVET_FUNCTION, 0x1234 as *mut c_void),
                    2 => RivetAny::ptr(RIVET_STR, std::ptr::null_mut()),
                    3 => {
                        cb_text(result, b"\xc3\x28 not utf-8");
                        *result
                    }
                    4 => RivetAny::ptr(RIVET_DLTENSOR, 0x10 as *mut c_void),
                    _ => RivetAny::ptr(RIVET_MANAGED_TENSOR, std::ptr::null_mut()),
                };
                RIVET_OK
            }
            FKind::EchoFirst => {
                *result = args.first().copied().unwrap_or(RivetAny::NULL);
                RIVET_OK
            }
        }
    }
}

// The output rule's answer mode (`cb_rule`), set by the case before it asks.
thread_local! {
    static RULE_MODE: RefCell<u8> = const { RefCell::new(0) };
}

unsafe extern "C" fn cb_rule(
    _resource: *mut c_void,
    shapes: *const *const i64,
    ndims: *const i32,
    num_inputs: i32,
    result: *mut RivetAny,
) -> i32 {
    let mode = RULE_MODE.with(|m| *m.borrow());
    // SAFETY: the host's contract: `num_inputs` shapes of `ndims[i]` dims.
    unsafe {
        let first: Vec<i64> = if num_inputs > 0 && *ndims >= 0 {
            std::slice::from_raw_parts(*shapes, *ndims as usize).to_vec()
        } else {
            Vec::new()
        };
        let text = match mode {
            0 => format!("[[{first:?}, \"float32\"]]"),
            1 => "not json".into(),
            2 => "[[[-1], \"float32\"]]".into(),
            3 => "[]".into(),
            4 => format!("[[{first:?}, \"int64\"]]"),
            5 => {
                cb_text(result, b"ShapeError: no rule for that");
                return RIVET_ERR_USER;
            }
            _ => format!("[[[{}], \"float32\"]]", i64::MAX),
        };
        cb_text(result, text.as_bytes());
    }
    RIVET_OK
}

/// A signature for a foreign function: `(x: float32 tensor [n], y: output float32 [n])`.
const GOOD_SIG: &str = r#"{"params": [{"name": "x", "kind": {"tensor": {"dtypes": ["float32"], "shape": [{"var": "n"}], "device": "host", "output": false}}}, {"name": "y", "kind": {"tensor": {"dtypes": ["float32"], "shape": [{"var": "n"}], "device": "host", "output": true}}}]}"#;

fn bad_sig(r: &mut Rng) -> Vec<u8> {
    match r.below(9) {
        0 => b"not json".to_vec(),
        1 => br#"{"params": [], "extra": 1}"#.to_vec(),
        2 => br#"{"params": [{"name": "x", "kind": "tensor"}]}"#.to_vec(),
        3 => br#"{"params": [{"name": "x", "kind": {"tensor": {"dtypes": [], "shape": [{"fixed": -1}], "device": "host", "output": false}}}]}"#.to_vec(),
        4 => format!(
            r#"{{"params": [{{"name": "x", "kind": {{"tensor": {{"dtypes": [], "shape": [{}], "device": "host", "output": false}}}}}}]}}"#,
            vec![r#""any""#; 65].join(", ")
        )
        .into_bytes(),
        5 => b"{\"params\": [{\"name\": \"\xff\", \"kind\": \"int\"}]}".to_vec(),
        6 => format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
        7 => Vec::new(),
        _ => br#"{"params": [{"name": "x", "kind": {"tensor": {"dtypes": ["float128"], "shape": null, "device": "host", "output": false}}}]}"#.to_vec(),
    }
}

fn cstring(bytes: &[u8]) -> Vec<u8> {
    let mut v: Vec<u8> = bytes.iter().copied().filter(|&b| b != 0).collect();
    v.push(0);
    v
}

// ---- the case ------------------------------------------------------------------------------

/// The function a case calls, and what the reference says it does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    Scale(usize),
    Add,
    ISub,
    Echo,
    Nop,
    Axpy,
    Foreign(FKind),
}

/// One argument as the case describes it.
#[derive(Clone, Debug)]
enum ArgD {
    Null,
    Int(i64),
    Float(f64),
    Bool(i64),
    /// The bytes (NUL appended when passed); `None`: a NULL pointer.
    Str(Option<Vec<u8>>),
    /// Index into the case's tensors; read-only type code.
    Tensor(usize, bool),
    /// A handle: 0 the case's live `testing.nop` handle, 1 NULL, 2 freed, 3 made up.
    Func(u8),
    /// A type code with a raw payload (unknown codes, the result-only managed tensor).
    Code(i32, u64),
}

impl ArgD {
    /// Whether rivet must refuse the value (whatever the function).
    fn refused(&self, verdicts: &[Verdict]) -> bool {
        match self {
            ArgD::Str(None) => true,
            ArgD::Str(Some(b)) => std::str::from_utf8(b).is_err(),
            ArgD::Tensor(i, _) => matches!(verdicts[*i], Verdict::Refuse(_)),
            ArgD::Func(k) => *k != 0,
            ArgD::Code(..) => true,
            _ => false,
        }
    }
}

struct Case {
    r: Rng,
    log: String,
    regions: Vec<Region>,
    tensors: Vec<TDesc>,
    /// Handles the case must free at the end (live ones).
    handles: Vec<RivetFunctionHandle>,
    /// A handle that was freed (for the freed-handle cases).
    freed: Option<RivetFunctionHandle>,
    /// Registry names to remove at the end.
    names: Vec<String>,
    /// Foreign functions created (resources to be released exactly once each).
    created: usize,
    sentinel: (String, String),
    /// Replays describe every call and error on stderr.
    verbose: bool,
}

impl Case {
    /// Sets the thread's last error to a known one (a lookup of a name nobody registers), so
    /// the next call's effect on it can be told.
    fn set_sentinel(&mut self) -> Result<(), String> {
        let name = b"fuzz_sentinel.none\0";
        let mut h: RivetFunctionHandle = std::ptr::null_mut();
        // SAFETY: valid string and out pointer.
        let rc = unsafe { RivetFunctionGetGlobal(name.as_ptr() as *const c_char, &mut h) };
        if rc != RIVET_ERR_USER || !h.is_null() {
            return Err(format!("the sentinel lookup gave {rc} / {h:p}"));
        }
        self.sentinel = try_last_error()?;
        if self.sentinel.0 != "FunctionNotFoundError" {
            return Err(format!(
                "the sentinel lookup's kind is {:?}",
                self.sentinel.0
            ));
        }
        Ok(())
    }

    /// The checks of one return code: `Ok(None)` success (last error untouched), `Ok(Some(kind))`
    /// a typed user error, `Err` a failure of the contract.
    fn classify(&self, rc: i32, what: &str) -> Result<Option<String>, String> {
        let le = try_last_error()?;
        match rc {
            RIVET_OK => {
                if le != self.sentinel {
                    return Err(format!(
                        "{what}: succeeded but changed the last error to {le:?}"
                    ));
                }
                Ok(None)
            }
            RIVET_ERR_USER => {
                if le == self.sentinel {
                    return Err(format!("{what}: failed without setting the last error"));
                }
                let (kind, msg) = le;
                if kind.is_empty() || msg.is_empty() {
                    return Err(format!("{what}: failed with kind {kind:?} message {msg:?}"));
                }
                if Error::from_kind_name(&kind, String::new()).is_none() {
                    return Err(format!(
                        "{what}: failed with kind {kind:?}, not a rivet error class ({})",
                        short(&msg)
                    ));
                }
                if self.verbose {
                    eprintln!("  {what}: {kind}: {}", short(&msg));
                }
                if kind == "InternalError" {
                    return Err(format!(
                        "{what}: internal error with a user code: {}",
                        short(&msg)
                    ));
                }
                Ok(Some(kind))
            }
            RIVET_ERR_INTERNAL => Err(format!(
                "{what}: RIVET_ERR_INTERNAL: {:?}",
                (le.0, short(&le.1))
            )),
            c => Err(format!("{what}: undocumented return code {c}")),
        }
    }

    fn global(&mut self, name: &str) -> Result<RivetFunctionHandle, String> {
        let c = cstring(name.as_bytes());
        let mut h: RivetFunctionHandle = std::ptr::null_mut();
        // SAFETY: valid string and out pointer.
        let rc = unsafe { RivetFunctionGetGlobal(c.as_ptr() as *const c_char, &mut h) };
        if rc != RIVET_OK || h.is_null() {
            return Err(format!(
                "RivetFunctionGetGlobal({name}) gave {rc}: {:?}",
                try_last_error()
            ));
        }
        self.handles.push(h);
        Ok(h)
    }

    /// A freed handle (made, then freed here), for the freed-handle cases.
    fn freed_handle(&mut self) -> Result<RivetFunctionHandle, String> {
        if let Some(h) = self.freed {
            return Ok(h);
        }
        let c = b"testing.nop\0";
        let mut h: RivetFunctionHandle = std::ptr::null_mut();
        // SAFETY: valid arguments; the handle is freed once right away.
        unsafe {
            if RivetFunctionGetGlobal(c.as_ptr() as *const c_char, &mut h) != RIVET_OK {
                return Err("RivetFunctionGetGlobal(testing.nop) failed".into());
            }
            if RivetFunctionFree(h) != RIVET_OK {
                return Err(format!(
                    "RivetFunctionFree of a live handle: {:?}",
                    try_last_error()
                ));
            }
        }
        self.freed = Some(h);
        Ok(h)
    }

    /// Creates a foreign function through `RivetFunctionCreateTyped` (signature and rule as
    /// drawn); on success its handle is the case's.
    fn make_foreign(&mut self, kind: FKind, typed: bool) -> Result<RivetFunctionHandle, String> {
        let res = Box::into_raw(Box::new(Res { kind })) as *mut c_void;
        let name = format!("fuzz_capi.foreign.{kind:?}");
        let cname = cstring(name.as_bytes());
        let sig = cstring(GOOD_SIG.as_bytes());
        let mut h: RivetFunctionHandle = std::ptr::null_mut();
        self.set_sentinel()?;
        // SAFETY: valid arguments; the callbacks honour the contract.
        let rc = unsafe {
            if typed {
                RivetFunctionCreateTyped(
                    cname.as_ptr() as *const c_char,
                    Some(cb_call),
                    res,
                    Some(release_res),
                    sig.as_ptr() as *const c_char,
                    self.r.chance(0.5).then_some(cb_rule as _),
                    &mut h,
                )
            } else {
                RivetFunctionCreate(
                    cname.as_ptr() as *const c_char,
                    Some(cb_call),
                    res,
                    Some(release_res),
                    &mut h,
                )
            }
        };
        if let Some(k) = self.classify(rc, "RivetFunctionCreate")? {
            return Err(format!(
                "RivetFunctionCreate of a valid function failed: {k}"
            ));
        }
        if h.is_null() {
            return Err("RivetFunctionCreate succeeded with a NULL handle".into());
        }
        self.created += 1;
        self.handles.push(h);
        Ok(h)
    }

    /// `RivetFunctionCreate(Typed)` with one bad argument: a typed error, nothing created, the
    /// resource not released.
    fn bad_create(&mut self) -> Result<Option<String>, String> {
        let res = Box::into_raw(Box::new(Res { kind: FKind::Probe })) as *mut c_void;
        let before = RES_RELEASED.load(Ordering::SeqCst);
        let good_name = cstring(b"fuzz_capi.bad_create");
        let which = self.r.below(6);
        let name: Option<Vec<u8>> = match which {
            0 => None,
            1 => Some(cstring(b"fuzz\xff\xfe.name")),
            _ => Some(good_name.clone()),
        };
        let sig: Option<Vec<u8>> = match which {
            3 => Some(cstring(&bad_sig(&mut self.r))),
            5 => None,
            _ => None,
        };
        let _ = write!(self.log, "bad_create({which}) ");
        let mut h: RivetFunctionHandle = 0x77 as RivetFunctionHandle;
        let name_p = name
            .as_ref()
            .map_or(std::ptr::null(), |n| n.as_ptr() as *const c_char);
        let sig_p = sig
            .as_ref()
            .map_or(std::ptr::null(), |s| s.as_ptr() as *const c_char);
        self.set_sentinel()?;
        // SAFETY: the pointers are NULL or valid; the bad one is what is checked.
        let rc = unsafe {
            RivetFunctionCreateTyped(
                name_p,
                if which == 2 { None } else { Some(cb_call) },
                res,
                Some(release_res),
                sig_p,
                if which == 5 { Some(cb_rule as _) } else { None },
                if which == 4 {
                    std::ptr::null_mut()
                } else {
                    &mut h
                },
            )
        };
        let out = self.classify(rc, "RivetFunctionCreateTyped (bad)")?;
        if out.is_none() {
            return Err(format!(
                "RivetFunctionCreateTyped accepted bad argument {which}"
            ));
        }
        if h != 0x77 as RivetFunctionHandle {
            return Err(format!(
                "a failed RivetFunctionCreateTyped wrote *out = {h:p}"
            ));
        }
        if RES_RELEASED.load(Ordering::SeqCst) != before {
            return Err("a failed RivetFunctionCreateTyped released the resource".into());
        }
        // SAFETY: ours again (nothing was created); released here without counting.
        drop(unsafe { Box::from_raw(res as *mut Res) });
        Ok(out)
    }

    fn draw_scalar(&mut self) -> ArgD {
        let r = &mut self.r;
        match r.below(6) {
            0 => ArgD::Null,
            1 => ArgD::Int(r.adversarial()),
            2 => ArgD::Float(r.pick(&[0.5, -0.0, f64::NAN, f64::INFINITY, 1e300, -3.25])),
            3 => ArgD::Bool(r.pick(&[0, 1, 7, -1, i64::MIN])),
            4 => ArgD::Str(Some(
                r.pick(&["", "x", "h\u{e9}llo", "fuzz_capi.scale1", "\u{1F600}"])
                    .as_bytes()
                    .to_vec(),
            )),
            _ => ArgD::Func(0),
        }
    }

    fn tensor(&mut self, shape: &[i64], dtype: (u8, u8, u16), output: bool, ro: bool) -> ArgD {
        let fill = if output {
            0
        } else if dtype == I32 {
            2
        } else {
            1
        };
        let t = valid_tensor(shape, dtype, !output, fill, &mut self.regions, &mut self.r);
        self.tensors.push(t);
        ArgD::Tensor(self.tensors.len() - 1, ro)
    }

    fn dims(&mut self, rank: usize) -> Vec<i64> {
        (0..rank)
            .map(|_| {
                if self.r.chance(0.05) {
                    0
                } else {
                    self.r.range(1, 5)
                }
            })
            .collect()
    }

    /// A well-typed argument list for `t`.
    fn valid_args(&mut self, t: Target) -> Vec<ArgD> {
        let ro = |r: &mut Rng| r.chance(0.5);
        match t {
            Target::Scale(rank) => {
                let shape = self.dims(rank);
                let a_ro = ro(&mut self.r);
                let mut v = vec![self.tensor(&shape, F32, false, a_ro)];
                if self.r.chance(0.7) {
                    v.push(self.tensor(&shape, F32, true, false));
                }
                v
            }
            Target::Add | Target::ISub => {
                let (shape, dt) = if t == Target::Add {
                    (self.dims(1), F32)
                } else {
                    (vec![ISUB_N], I32)
                };
                let (ra, rb) = (ro(&mut self.r), ro(&mut self.r));
                let mut v = vec![
                    self.tensor(&shape, dt, false, ra),
                    self.tensor(&shape, dt, false, rb),
                ];
                if self.r.chance(0.7) {
                    v.push(self.tensor(&shape, dt, true, false));
                }
                v
            }
            Target::Axpy => {
                let rank = self.r.below(3) as usize;
                let shape = self.dims(rank);
                let dt = if self.r.chance(0.7) { F32 } else { F64 };
                let alpha = match self.r.below(4) {
                    0 => ArgD::Int(self.r.range(-3, 3)),
                    1 => ArgD::Bool(1),
                    _ => ArgD::Float(self.r.pick(&[0.5, 2.0, -1.0, 3.0, 0.0])),
                };
                let xro = ro(&mut self.r);
                let x = self.tensor(&shape, dt, false, xro);
                // y is read and written: random values, no broadcast.
                let ty = valid_tensor(&shape, dt, false, 1, &mut self.regions, &mut self.r);
                self.tensors.push(ty);
                vec![alpha, x, ArgD::Tensor(self.tensors.len() - 1, false)]
            }
            Target::Echo => {
                if self.r.chance(0.35) {
                    let rank = self.r.below(3) as usize;
                    let shape = self.dims(rank);
                    let dt = self.r.pick(&[F32, I32, F64, (1, 8, 1), (6, 8, 1)]);
                    let ro = ro(&mut self.r);
                    vec![self.tensor(&shape, dt, false, ro)]
                } else {
                    vec![self.draw_scalar()]
                }
            }
            Target::Nop => {
                let n = self.r.below(4);
                (0..n).map(|_| self.draw_scalar()).collect()
            }
            Target::Foreign(FKind::Sum) => {
                let n = self.r.below(4);
                (0..n).map(|_| ArgD::Int(self.r.adversarial())).collect()
            }
            Target::Foreign(FKind::Probe) | Target::Foreign(FKind::EchoFirst) => {
                let n = self.r.below(4);
                (0..n)
                    .map(|_| {
                        if self.r.chance(0.4) {
                            let rank = self.r.below(3) as usize;
                            let shape = self.dims(rank);
                            let ro = self.r.chance(0.5);
                            self.tensor(&shape, F32, false, ro)
                        } else {
                            match self.draw_scalar() {
                                ArgD::Func(_) => ArgD::Int(5),
                                a => a,
                            }
                        }
                    })
                    .collect()
            }
            Target::Foreign(_) => {
                let n = self.r.below(3);
                (0..n).map(|_| ArgD::Int(self.r.range(-3, 3))).collect()
            }
        }
    }
}

/// How a call is made (after mutations).
struct CallShape {
    func: u8, // 0 the target's handle, 1 NULL, 2 freed, 3 made up
    count: Option<i32>,
    null_args: bool,
    null_result: bool,
}

fn canon32(x: f32) -> u32 {
    if x.is_nan() {
        f32::NAN.to_bits()
    } else {
        x.to_bits()
    }
}

unsafe extern "C" fn counting_deleter(p: *mut DLManagedTensorVersioned) {
    RESULT_DELETED.fetch_add(1, Ordering::SeqCst);
    let orig = ORIG_DELETERS.with(|m| m.borrow_mut().remove(&(p as usize)));
    if let Some(d) = orig {
        // SAFETY: the deleter the producer set, run once.
        unsafe { d(p) }
    }
}

/// Frees a result with `RivetAnyFree`, checking a managed tensor's deleter runs exactly once
/// and a function handle is released.
fn free_result(res: &mut RivetAny, what: &str) -> Result<(), String> {
    let mut intercepted = false;
    if res.type_code == RIVET_MANAGED_TENSOR {
        // SAFETY: a managed tensor result of rivet's, not yet released.
        unsafe {
            let m = res.value.v_ptr as *mut DLManagedTensorVersioned;
            if m.is_null() {
                return Err(format!("{what}: a NULL managed tensor result"));
            }
            match (*m).deleter {
                Some(d) => {
                    ORIG_DELETERS.with(|o| o.borrow_mut().insert(m as usize, d));
                    (*m).deleter = Some(counting_deleter);
                    intercepted = true;
                }
                None => return Err(format!("{what}: a managed tensor result without a deleter")),
            }
        }
    }
    let live = live_handles();
    let is_fn = res.type_code == RIVET_FUNCTION;
    let before = RESULT_DELETED.load(Ordering::SeqCst);
    // SAFETY: a result of RivetFunctionCall, released once.
    let rc = unsafe { RivetAnyFree(res) };
    if rc != RIVET_OK {
        return Err(format!(
            "{what}: RivetAnyFree gave {rc}: {:?}",
            try_last_error()
        ));
    }
    if res.type_code != RIVET_NULL {
        return Err(format!(
            "{what}: RivetAnyFree left type code {}",
            res.type_code
        ));
    }
    if intercepted && RESULT_DELETED.load(Ordering::SeqCst) != before + 1 {
        return Err(format!(
            "{what}: the result's deleter ran {} times",
            RESULT_DELETED.load(Ordering::SeqCst) - before
        ));
    }
    if is_fn && live_handles() + 1 != live {
        return Err(format!(
            "{what}: RivetAnyFree of a function left {} live handles (was {live})",
            live_handles()
        ));
    }
    Ok(())
}

/// Reads a float32 managed tensor result's elements, row-major.
unsafe fn managed_f32(m: *const DLManagedTensorVersioned) -> (Vec<i64>, (u8, u8, u16), Vec<u32>) {
    // SAFETY: rivet's result, valid until released.
    unsafe {
        let t = &(*m).dl_tensor;
        let n = t.ndim.clamp(0, 64) as usize;
        let shape: Vec<i64> = if n == 0 {
            vec![]
        } else {
            std::slice::from_raw_parts(t.shape, n).to_vec()
        };
        let strides: Vec<i64> = if t.strides.is_null() {
            compact(&shape)
        } else if n == 0 {
            vec![]
        } else {
            std::slice::from_raw_parts(t.strides, n).to_vec()
        };
        let dt = (t.dtype.code, t.dtype.bits, t.dtype.lanes);
        let numel: i64 = shape.iter().product();
        let mut vals = Vec::new();
        if dt == F32 || dt == I32 {
            let base = (t.data as *const u8).add(t.byte_offset as usize);
            for f in 0..numel {
                let mut rem = f;
                let mut off = 0i64;
                for d in (0..n).rev() {
                    off += (rem % shape[d]) * strides[d];
                    rem /= shape[d];
                }
                vals.push(std::ptr::read_unaligned(
                    base.offset((off * 4) as isize) as *const u32
                ));
            }
        }
        (shape, dt, vals)
    }
}

/// Effective list after a count change: the first `n` values, padded with NULLs past the end.
fn effective(args: &[ArgD], count: Option<i32>) -> Option<Vec<ArgD>> {
    match count {
        None => Some(args.to_vec()),
        Some(n) if (0..=MAX_ARGS).contains(&n) => {
            let n = n as usize;
            let mut v: Vec<ArgD> = args.iter().take(n).cloned().collect();
            v.resize(n, ArgD::Null);
            Some(v)
        }
        Some(_) => None,
    }
}

pub fn run_case(seed: u64, verbose: bool) -> Outcome {
    if let Err(e) = ensure_kernels() {
        return Outcome::fail(format!("building the kernels: {e}"));
    }
    let live0 = live_handles();
    let released0 = RES_RELEASED.load(Ordering::SeqCst);
    let (made0, deleted0) = (
        OWN_MADE.load(Ordering::SeqCst),
        OWN_DELETED.load(Ordering::SeqCst),
    );
    let mut c = Case {
        r: Rng::new(seed),
        log: String::new(),
        regions: Vec::new(),
        tensors: Vec::new(),
        handles: Vec::new(),
        freed: None,
        names: Vec::new(),
        created: 0,
        sentinel: (String::new(), String::new()),
        verbose,
    };
    let out = run_checked(&mut c).unwrap_or_else(Outcome::Fail);
    // Clean-up: the case's handles and names, then the leak checks.
    let mut out = out;
    for h in std::mem::take(&mut c.handles) {
        // SAFETY: live handles of the case, freed once.
        let rc = unsafe { RivetFunctionFree(h) };
        if rc != RIVET_OK && !matches!(out, Outcome::Fail(_)) {
            out = Outcome::fail(format!(
                "RivetFunctionFree of a live handle gave {rc}: {:?}",
                try_last_error()
            ));
        }
    }
    for n in std::mem::take(&mut c.names) {
        registry::remove(&n);
    }
    if !matches!(out, Outcome::Fail(_)) {
        let live = live_handles();
        let released = RES_RELEASED.load(Ordering::SeqCst) - released0;
        let (made, deleted) = (
            OWN_MADE.load(Ordering::SeqCst) - made0,
            OWN_DELETED.load(Ordering::SeqCst) - deleted0,
        );
        if live != live0 {
            out = Outcome::fail(format!(
                "{} function handles leaked ({live0} live before, {live} after)",
                live as i64 - live0 as i64
            ));
        } else if released != c.created {
            out = Outcome::fail(format!(
                "{} foreign functions were created, {released} resources released",
                c.created
            ));
        } else if made != deleted {
            out = Outcome::fail(format!(
                "a callback made {made} managed tensors, {deleted} were deleted"
            ));
        }
    }
    if verbose {
        eprintln!("capi case {seed:#x}: {}", c.log);
    }
    match out {
        Outcome::Fail(m) => Outcome::Fail(format!("{m}\n  case: {}", c.log)),
        o => o,
    }
}

fn run_checked(c: &mut Case) -> Result<Outcome, String> {
    if rivet_runtime::capi::RivetAbiVersion() >> 16 != rivet_runtime::capi::ABI_MAJOR {
        return Err("RivetAbiVersion's major differs from ABI_MAJOR".into());
    }
    let mut typed: Vec<String> = Vec::new();
    // Side operations: hostile lookups, registrations, creations, frees.
    let sides = c.r.below(3);
    for _ in 0..sides {
        if let Some(k) = side_op(c)? {
            typed.push(k);
        }
    }
    // The target and how it is reached.
    let target = match c.r.below(12) {
        0 => Target::Scale(1),
        1 => Target::Scale(2),
        2 => Target::Add,
        3 => Target::ISub,
        4 => Target::Echo,
        5 => Target::Nop,
        6 => Target::Axpy,
        _ => Target::Foreign(match c.r.below(6) {
            0 => FKind::Sum,
            1 => FKind::Probe,
            2 => FKind::Tensor(c.r.below(6) as u8),
            3 => FKind::Fail(c.r.below(9) as u8),
            4 => FKind::Weird(c.r.below(6) as u8),
            _ => FKind::EchoFirst,
        }),
    };
    let _ = write!(c.log, "target {target:?} ");
    let h = match target {
        Target::Scale(1) => c.global(K_SCALE1)?,
        Target::Scale(_) => c.global(K_SCALE2)?,
        Target::Add => c.global(K_ADD)?,
        Target::ISub => c.global(K_ISUB)?,
        Target::Echo => c.global("testing.echo")?,
        Target::Nop => c.global("testing.nop")?,
        Target::Axpy => c.global("testing.axpy")?,
        Target::Foreign(k) => {
            let typed_create = c.r.chance(0.3);
            let h = c.make_foreign(k, typed_create)?;
            if c.r.chance(0.4) {
                // Registered and looked up again: the call goes through the registry's copy.
                let name = format!("fuzz_capi.reg.{:x}", c.r.next());
                let cname = cstring(name.as_bytes());
                c.set_sentinel()?;
                // SAFETY: valid string and a live handle.
                let rc = unsafe { RivetFunctionSetGlobal(cname.as_ptr() as *const c_char, h, 0) };
                if let Some(k) = c.classify(rc, "RivetFunctionSetGlobal")? {
                    return Err(format!(
                        "RivetFunctionSetGlobal of a fresh name failed: {k}"
                    ));
                }
                c.names.push(name.clone());
                let h2 = c.global(&name)?;
                if typed_create && c.r.chance(0.5) {
                    if let Some(k) = output_rule_check(c, &name)? {
                        typed.push(k);
                    }
                }
                h2
            } else {
                h
            }
        }
    };
    let mut args = c.valid_args(target);
    let mut cs = CallShape {
        func: 0,
        count: None,
        null_args: false,
        null_result: false,
    };
    if c.r.chance(0.5) {
        let n = c.r.range(1, 2);
        for _ in 0..n {
            mutate_call(c, &mut args, &mut cs);
        }
    }
    let outcome = do_call(c, target, h, &args, &cs)?;
    if let Some(k) = outcome {
        typed.push(format!("call:{k}"));
    }
    if c.r.chance(0.15) {
        if let Some(k) = side_op(c)? {
            typed.push(k);
        }
    }
    Ok(match typed.pop() {
        None => Outcome::Pass,
        Some(k) => Outcome::Typed(k),
    })
}

/// Output rule of a typed foreign function through the registry: its answer, checked.
fn output_rule_check(c: &mut Case, name: &str) -> Result<Option<String>, String> {
    let f: Function = registry::get(name).map_err(|e| format!("registry::get({name}): {e}"))?;
    if !f.has_output_rule() {
        return match f.output_shapes(&[&[3]], None) {
            Err(e) if e.kind_name() == "ArgumentError" => Ok(Some("rule:ArgumentError".into())),
            other => Err(format!(
                "output_shapes of a function without a rule gave {other:?}"
            )),
        };
    }
    let mode = c.r.below(7) as u8;
    RULE_MODE.with(|m| *m.borrow_mut() = mode);
    let n = c.r.pick(&[0i64, 3, 1 << 40, i64::MAX]);
    let _ = write!(c.log, "rule(mode {mode}, n {n}) ");
    let res = f.output_shapes(&[&[n]], None);
    match (mode, res) {
        (0, Ok(v)) if v == vec![(vec![n], DType::F32)] => Ok(None),
        (_, Ok(v)) => Err(format!(
            "output rule mode {mode}: accepted the answer {v:?}"
        )),
        (_, Err(e)) => {
            let k = e.kind_name();
            if k == "InternalError" {
                return Err(format!("output rule mode {mode}: internal error: {e}"));
            }
            if mode == 0 && !(k == "MemoryError" && n > 1 << 30) {
                return Err(format!("output rule mode 0 (a valid answer) failed: {e}"));
            }
            Ok(Some(format!("rule:{k}")))
        }
    }
}

/// One hostile API use outside a call: lookups, registrations, creations, frees.
fn side_op(c: &mut Case) -> Result<Option<String>, String> {
    let op = c.r.below(9);
    c.set_sentinel()?;
    match op {
        0 => {
            // GetGlobal: bad names and NULL out.
            let name: Option<Vec<u8>> = match c.r.below(6) {
                0 => None,
                1 => Some(cstring(b"testing.\xffecho")),
                2 => Some(cstring(b"")),
                3 => Some(cstring(&vec![b'a'; 10_000])),
                4 => Some(cstring(b"fuzz_capi.missing")),
                _ => Some(cstring(b"testing.echo")),
            };
            let null_out = c.r.chance(0.3);
            let _ = write!(
                c.log,
                "get({:?}, null_out {null_out}) ",
                name.as_ref()
                    .map(|n| String::from_utf8_lossy(&n[..n.len().min(20)]).into_owned())
            );
            let mut h: RivetFunctionHandle = std::ptr::null_mut();
            // SAFETY: NULL or valid pointers.
            let rc = unsafe {
                RivetFunctionGetGlobal(
                    name.as_ref()
                        .map_or(std::ptr::null(), |n| n.as_ptr() as *const c_char),
                    if null_out {
                        std::ptr::null_mut()
                    } else {
                        &mut h
                    },
                )
            };
            let k = c.classify(rc, "RivetFunctionGetGlobal")?;
            let valid = !null_out && name.as_deref() == Some(&b"testing.echo\0"[..]);
            match (valid, &k) {
                (true, None) => {
                    c.handles.push(h);
                    Ok(None)
                }
                (false, Some(_)) => {
                    if !h.is_null() {
                        return Err(format!("a failed lookup wrote a handle {h:p}"));
                    }
                    Ok(k.map(|k| format!("get:{k}")))
                }
                _ => Err(format!("RivetFunctionGetGlobal: valid={valid} but rc {rc}")),
            }
        }
        1 => {
            // SetGlobal: bad names, NULL / freed handles, a taken name without override.
            let which = c.r.below(6);
            if which == 4 && !FREED_HANDLES_CHECKED {
                return Ok(None);
            }
            let nop = c.global("testing.nop")?;
            let h = match which {
                3 => std::ptr::null_mut(),
                4 => c.freed_handle()?,
                _ => nop,
            };
            let name: Option<Vec<u8>> = match which {
                0 => None,
                1 => Some(cstring(b"fuzz\xff.x")),
                2 => Some(cstring(b"")),
                5 => Some(cstring(b"testing.echo")),
                _ => Some(cstring(b"fuzz_capi.setglobal")),
            };
            let _ = write!(c.log, "setglobal({which}) ");
            c.set_sentinel()?;
            // SAFETY: NULL or valid pointers; handles live, NULL or freed (checked by rivet).
            let rc = unsafe {
                RivetFunctionSetGlobal(
                    name.as_ref()
                        .map_or(std::ptr::null(), |n| n.as_ptr() as *const c_char),
                    h,
                    0,
                )
            };
            let k = c.classify(rc, "RivetFunctionSetGlobal (bad)")?;
            let Some(k) = k else {
                registry::remove("fuzz_capi.setglobal");
                return Err(format!(
                    "RivetFunctionSetGlobal accepted bad argument {which}"
                ));
            };
            if which == 4 && k != "ArgumentError" {
                return Err(format!(
                    "SetGlobal of a freed handle: {k}, expected ArgumentError"
                ));
            }
            Ok(Some(format!("setglobal:{k}")))
        }
        2 => c.bad_create().map(|k| k.map(|k| format!("create:{k}"))),
        3 => {
            // RivetAnyFree of values that own nothing, and NULL.
            let mut v = match c.r.below(6) {
                0 => RivetAny::int(c.r.adversarial()),
                1 => RivetAny::float(f64::NAN),
                2 => RivetAny::ptr(
                    c.r.pick(&[99, -1, i32::MIN, RIVET_STR, RIVET_DLTENSOR]),
                    0x10 as *mut c_void,
                ),
                3 => RivetAny::ptr(RIVET_MANAGED_TENSOR, std::ptr::null_mut()),
                4 => RivetAny::NULL,
                _ => {
                    // SAFETY: NULL is a no-op.
                    let rc = unsafe { RivetAnyFree(std::ptr::null_mut()) };
                    c.classify(rc, "RivetAnyFree(NULL)")?;
                    return if rc == RIVET_OK {
                        Ok(None)
                    } else {
                        Err("RivetAnyFree(NULL) failed".into())
                    };
                }
            };
            let _ = write!(c.log, "anyfree(code {}) ", v.type_code);
            // SAFETY: the value owns nothing rivet would release.
            let rc = unsafe { RivetAnyFree(&mut v) };
            if let Some(k) = c.classify(rc, "RivetAnyFree")? {
                return Err(format!(
                    "RivetAnyFree of a value that owns nothing failed: {k}"
                ));
            }
            if v.type_code != RIVET_NULL {
                return Err("RivetAnyFree did not reset the value".into());
            }
            Ok(None)
        }
        4 => {
            // A NULL handle: freed as a no-op; a NULL function RivetAny is an error or a no-op.
            // SAFETY: NULL is a no-op.
            let rc = unsafe { RivetFunctionFree(std::ptr::null_mut()) };
            if c.classify(rc, "RivetFunctionFree(NULL)")?.is_some() {
                return Err("RivetFunctionFree(NULL) failed".into());
            }
            let mut v = RivetAny::ptr(RIVET_FUNCTION, std::ptr::null_mut());
            if !FREED_HANDLES_CHECKED {
                return Ok(None);
            }
            c.set_sentinel()?;
            // SAFETY: a NULL handle, checked by rivet.
            let rc = unsafe { RivetAnyFree(&mut v) };
            Ok(c.classify(rc, "RivetAnyFree(function NULL)")?
                .map(|k| format!("anyfree:{k}")))
        }
        5 if FREED_HANDLES_CHECKED => {
            // Freed, double-freed and made-up handles: every use an ArgumentError.
            let h = if c.r.chance(0.7) {
                c.freed_handle()?
            } else {
                c.r.pick(&[0x10usize, 0x5256_0000_0011, usize::MAX, 0xdead_beef])
                    as RivetFunctionHandle
            };
            let use_ = c.r.below(4);
            let _ = write!(c.log, "freed_use({use_}, {h:p}) ");
            c.set_sentinel()?;
            let mut res = RivetAny::int(3);
            // SAFETY: the handle is checked by rivet; other pointers are valid.
            let rc = unsafe {
                match use_ {
                    0 => RivetFunctionFree(h),
                    1 => RivetFunctionCall(h, std::ptr::null(), 0, &mut res),
                    2 => {
                        let mut v = RivetAny::ptr(RIVET_FUNCTION, h);
                        RivetAnyFree(&mut v)
                    }
                    _ => {
                        let a = [RivetAny::ptr(RIVET_FUNCTION, h)];
                        let e = b"testing.echo\0";
                        let mut eh: RivetFunctionHandle = std::ptr::null_mut();
                        if RivetFunctionGetGlobal(e.as_ptr() as *const c_char, &mut eh) != RIVET_OK
                        {
                            return Err("lookup of testing.echo failed".into());
                        }
                        c.handles.push(eh);
                        c.set_sentinel()?;
                        RivetFunctionCall(eh, a.as_ptr(), 1, &mut res)
                    }
                }
            };
            match c.classify(rc, "use of a freed handle")? {
                Some(k) if k == "ArgumentError" => {
                    if use_ == 1 || use_ == 3 {
                        if res.type_code != RIVET_NULL {
                            return Err("a failed call left a non-NULL result".into());
                        }
                    }
                    Ok(Some("freed:ArgumentError".into()))
                }
                other => Err(format!("use {use_} of a freed/made-up handle {h:p} gave {other:?}, expected ArgumentError")),
            }
        }
        6 => {
            // RivetGetLastError with NULL kind.
            // SAFETY: NULL kind is allowed.
            let m = unsafe { RivetGetLastError(std::ptr::null_mut()) };
            if m.is_null() {
                return Err("RivetGetLastError(NULL) returned NULL".into());
            }
            Ok(None)
        }
        7 => {
            // A handle freed through RivetAnyFree as a function value (as results are).
            let h = c.global("testing.echo")?;
            c.handles.retain(|&x| x != h);
            let mut v = RivetAny::ptr(RIVET_FUNCTION, h);
            free_result(&mut v, "RivetAnyFree of a handle")?;
            Ok(None)
        }
        _ => {
            // A valid registration with override, replaced, then looked up and called.
            let f = c.make_foreign(FKind::Sum, false)?;
            let name = format!("fuzz_capi.set.{:x}", c.r.next());
            let cname = cstring(name.as_bytes());
            for ov in [0, 1] {
                c.set_sentinel()?;
                // SAFETY: valid name and a live handle.
                let rc = unsafe { RivetFunctionSetGlobal(cname.as_ptr() as *const c_char, f, ov) };
                if let Some(k) = c.classify(rc, "RivetFunctionSetGlobal")? {
                    return Err(format!(
                        "RivetFunctionSetGlobal({name}, override {ov}) failed: {k}"
                    ));
                }
                c.names.push(name.clone());
            }
            c.set_sentinel()?;
            // SAFETY: as above; without override, a taken name is refused.
            let rc = unsafe { RivetFunctionSetGlobal(cname.as_ptr() as *const c_char, f, 0) };
            match c.classify(rc, "RivetFunctionSetGlobal (taken)")? {
                Some(k) if k == "RegistryError" => {}
                other => {
                    return Err(format!(
                        "SetGlobal of a taken name without override: {other:?}"
                    ))
                }
            }
            let h = c.global(&name)?;
            let a = [RivetAny::int(2), RivetAny::int(40)];
            let mut res = RivetAny::NULL;
            c.set_sentinel()?;
            // SAFETY: a live handle, valid args and result.
            let rc = unsafe { RivetFunctionCall(h, a.as_ptr(), 2, &mut res) };
            if c.classify(rc, "call of a registered foreign function")?.is_some()
                || res.type_code != RIVET_INT
                // SAFETY: an int result.
                || unsafe { res.value.v_int64 } != 42
            {
                return Err(format!(
                    "the registered foreign sum gave rc {rc}, code {}",
                    res.type_code
                ));
            }
            Ok(None)
        }
    }
}

/// One mutation of the call: the count, NULL pointers, the handle, an argument.
fn mutate_call(c: &mut Case, args: &mut Vec<ArgD>, cs: &mut CallShape) {
    let len = args.len() as i32;
    match c.r.below(10) {
        0 => {
            cs.count = Some(c.r.pick(&[
                -1,
                i32::MIN,
                MAX_ARGS + 1,
                i32::MAX,
                0,
                len + 1,
                (len - 1).max(0),
                MAX_ARGS,
                len + 3,
            ]));
            let _ = write!(c.log, "count={:?} ", cs.count);
        }
        1 => {
            cs.null_args = true;
            let _ = write!(c.log, "null_args ");
        }
        2 => {
            cs.null_result = true;
            let _ = write!(c.log, "null_result ");
        }
        3 => {
            cs.func = if FREED_HANDLES_CHECKED {
                c.r.range(1, 3) as u8
            } else {
                1
            };
            let _ = write!(c.log, "func={} ", cs.func);
        }
        4 if !args.is_empty() => {
            let k = c.r.below(args.len() as u64) as usize;
            args[k] = ArgD::Code(
                c.r.pick(&[-1, 9, 99, i32::MIN, i32::MAX, RIVET_MANAGED_TENSOR, 1000]),
                c.r.pick(&[0u64, 0x10, u64::MAX]),
            );
            let _ = write!(c.log, "arg{k}={:?} ", args[k]);
        }
        5 | 6 => {
            let ts: Vec<usize> = args
                .iter()
                .filter_map(|a| match a {
                    ArgD::Tensor(i, _) => Some(*i),
                    _ => None,
                })
                .collect();
            if ts.is_empty() {
                return;
            }
            let i = ts[c.r.below(ts.len() as u64) as usize];
            let _ = write!(c.log, "t{i}: ");
            let mut t = c.tensors[i].clone();
            mutate_tensor(&mut t, &c.regions, &mut c.r, &mut c.log);
            c.tensors[i] = t;
        }
        7 if !args.is_empty() => {
            let k = c.r.below(args.len() as u64) as usize;
            args[k] = match c.r.below(5) {
                0 => ArgD::Str(None),
                1 => ArgD::Str(Some(b"bad \xff\xfe utf-8".to_vec())),
                2 => {
                    if FREED_HANDLES_CHECKED {
                        ArgD::Func(c.r.range(1, 3) as u8)
                    } else {
                        ArgD::Func(1)
                    }
                }
                3 => match &args[k] {
                    ArgD::Tensor(i, ro) => ArgD::Tensor(*i, !ro),
                    _ => c.draw_scalar(),
                },
                _ => c.draw_scalar(),
            };
            let _ = write!(c.log, "arg{k}={:?} ", args[k]);
        }
        8 => {
            // Aliasing: the last tensor argument takes another's region, the same view or one
            // shifted by an element (partial overlap), when that fits the region.
            let ts: Vec<(usize, usize)> = args
                .iter()
                .enumerate()
                .filter_map(|(k, a)| match a {
                    ArgD::Tensor(i, _) => Some((k, *i)),
                    _ => None,
                })
                .collect();
            if ts.len() < 2 {
                return;
            }
            let (k_out, _) = ts[ts.len() - 1];
            let (_, i_in) = ts[c.r.below(ts.len() as u64 - 1) as usize];
            let mut t = c.tensors[i_in].clone();
            let shift = c.r.chance(0.5);
            if shift {
                let size = supported(t.dtype).map_or(4, |d| d.size()) as u64;
                t.byte_offset += size;
            }
            if matches!(t.verdict(&c.regions), Verdict::Lie) {
                return;
            }
            c.tensors.push(t);
            args[k_out] = ArgD::Tensor(c.tensors.len() - 1, false);
            let _ = write!(c.log, "arg{k_out} aliases t{i_in} (shift {shift}) ");
        }
        _ => {
            // Extra or missing arguments.
            if c.r.chance(0.5) {
                let a = c.draw_scalar();
                args.push(a);
            } else {
                args.pop();
            }
            let _ = write!(c.log, "nargs={} ", args.len());
        }
    }
}

/// Makes the call described, checks it, frees its result. `Ok(Some(kind))` for a typed error.
fn do_call(
    c: &mut Case,
    target: Target,
    h: RivetFunctionHandle,
    args: &[ArgD],
    cs: &CallShape,
) -> Result<Option<String>, String> {
    let verdicts: Vec<Verdict> = c.tensors.iter().map(|t| t.verdict(&c.regions)).collect();
    if let Some((i, _)) = verdicts
        .iter()
        .enumerate()
        .find(|(_, v)| matches!(v, Verdict::Lie))
    {
        return Err(format!(
            "generator bug: tensor {i} is a lie: {:?}",
            c.tensors[i]
        ));
    }
    // The raw arguments (their pointers stay put: every buffer is built before any pointer).
    let dls: Vec<DLTensor> = c.tensors.iter().map(|t| t.dl(&c.regions)).collect();
    let strs: Vec<Option<Vec<u8>>> = args
        .iter()
        .map(|a| match a {
            ArgD::Str(Some(b)) => Some(cstring(b)),
            _ => None,
        })
        .collect();
    let nop = if args.iter().any(|a| matches!(a, ArgD::Func(0))) {
        c.global("testing.nop")?
    } else {
        std::ptr::null_mut()
    };
    let freed = if args.iter().any(|a| matches!(a, ArgD::Func(2))) || cs.func == 2 {
        c.freed_handle()?
    } else {
        std::ptr::null_mut()
    };
    let made_up = 0x5256_0000_0018usize as RivetFunctionHandle;
    let mut raw: Vec<RivetAny> = args
        .iter()
        .enumerate()
        .map(|(k, a)| match a {
            ArgD::Null => RivetAny::NULL,
            ArgD::Int(v) => RivetAny::int(*v),
            ArgD::Float(v) => RivetAny::float(*v),
            ArgD::Bool(v) => RivetAny {
                type_code: RIVET_BOOL,
                pad: 0,
                value: RivetValue { v_int64: *v },
            },
            ArgD::Str(None) => RivetAny::ptr(RIVET_STR, std::ptr::null_mut()),
            ArgD::Str(Some(_)) => RivetAny::ptr(
                RIVET_STR,
                strs[k].as_ref().expect("built above").as_ptr() as *mut c_void,
            ),
            ArgD::Tensor(i, ro) => RivetAny::ptr(
                if *ro {
                    RIVET_DLTENSOR_READONLY
                } else {
                    RIVET_DLTENSOR
                },
                &dls[*i] as *const DLTensor as *mut c_void,
            ),
            ArgD::Func(0) => RivetAny::ptr(RIVET_FUNCTION, nop),
            ArgD::Func(1) => RivetAny::ptr(RIVET_FUNCTION, std::ptr::null_mut()),
            ArgD::Func(2) => RivetAny::ptr(RIVET_FUNCTION, freed),
            ArgD::Func(_) => RivetAny::ptr(RIVET_FUNCTION, made_up),
            ArgD::Code(code, payload) => RivetAny {
                type_code: *code,
                pad: 0,
                value: RivetValue {
                    v_int64: *payload as i64,
                },
            },
        })
        .collect();
    let count = cs.count.unwrap_or(raw.len() as i32);
    if (raw.len() as i32) < count && count <= MAX_ARGS {
        raw.resize(count as usize, RivetAny::NULL);
    }
    let eff = if cs.null_args && count > 0 {
        None
    } else {
        effective(args, cs.count)
    };
    let func = match cs.func {
        0 => h,
        1 => std::ptr::null_mut(),
        2 => freed,
        _ => made_up,
    };
    let args_p = if cs.null_args {
        std::ptr::null()
    } else {
        raw.as_ptr()
    };
    if c.verbose {
        eprintln!(
            "  call: {}\n  args {args:?}\n  tensors {:?}\n  verdicts {verdicts:?}",
            c.log,
            c.tensors
                .iter()
                .map(|t| (
                    t.ndim,
                    t.dims().to_vec(),
                    &t.strides[..t.rank()],
                    t.null_strides,
                    t.byte_offset,
                    t.dtype,
                    t.device,
                    t.null_data
                ))
                .collect::<Vec<_>>()
        );
    }
    let mut result = RivetAny::int(0x5eed);
    PROBE.with(|p| *p.borrow_mut() = None);
    let own_deleted0 = OWN_DELETED.load(Ordering::SeqCst);
    let own_made0 = OWN_MADE.load(Ordering::SeqCst);
    let live0 = live_handles();
    c.set_sentinel()?;
    // SAFETY: every pointer is NULL, or valid for its type code for the call (tensors inside
    // the case's buffers or refusable), or a handle rivet checks.
    let rc = unsafe {
        RivetFunctionCall(
            func,
            args_p,
            count,
            if cs.null_result {
                std::ptr::null_mut()
            } else {
                &mut result
            },
        )
    };
    let kind = c.classify(rc, "RivetFunctionCall")?;
    // Whatever rivet must refuse, whatever the function.
    let must_fail = cs.func != 0
        || cs.null_result
        // A function value never crosses to another library.
        || (matches!(target, Target::Foreign(_))
            && eff.as_ref().is_some_and(|e| e.iter().any(|a| matches!(a, ArgD::Func(_)))))
        || eff.is_none()
        || eff
            .as_ref()
            .is_some_and(|e| e.iter().any(|a| a.refused(&verdicts)));
    let mut allowed: Vec<Vec<bool>> = c
        .regions
        .iter()
        .map(|r| vec![false; r.snap.len()])
        .collect();
    match &kind {
        Some(k) => {
            if !cs.null_result && result.type_code != RIVET_NULL {
                return Err(format!(
                    "a failed call ({k}) left result type code {}",
                    result.type_code
                ));
            }
            if cs.func != 0 && k != "ArgumentError" {
                return Err(format!(
                    "a call through a NULL/freed/made-up handle gave {k}"
                ));
            }
            if !must_fail {
                expect_failure_kind(target, k)?;
            }
            if live_handles() != live0 {
                return Err("a failed call changed the number of live handles".into());
            }
        }
        None => {
            if must_fail {
                return Err(format!(
                    "the call succeeded though rivet must refuse it (func {}, count {count}, null_args {}, null_result {}, verdicts {:?})",
                    cs.func, cs.null_args, cs.null_result, verdicts
                ));
            }
            let eff = eff.expect("not must_fail");
            verify(c, target, &eff, &verdicts, &mut result, &mut allowed, nop)?;
            if live_handles() != live0 {
                return Err(format!(
                    "after the call and its result's release {} handles are live, {live0} before",
                    live_handles()
                ));
            }
        }
    }
    // Callback-made managed tensors: each deleted once (possibly later, on free).
    let made = OWN_MADE.load(Ordering::SeqCst) - own_made0;
    let deleted = OWN_DELETED.load(Ordering::SeqCst) - own_deleted0;
    if made != deleted {
        return Err(format!("the callback made {made} managed tensors, {deleted} deleted after the call and its result's release"));
    }
    // Memory: inputs intact, guards intact, outputs written only in their own elements.
    for (i, reg) in c.regions.iter().enumerate() {
        if let Some(m) = reg.check(&allowed[i], &format!("buffer {i}")) {
            return Err(m);
        }
    }
    Ok(kind)
}

/// A failure's kind, where the case knows what it must be.
fn expect_failure_kind(target: Target, k: &str) -> Result<(), String> {
    let Target::Foreign(f) = target else {
        return Ok(());
    };
    let want: Option<&[&str]> = match f {
        FKind::Fail(0) => Some(&["ShapeError"]),
        FKind::Fail(5) | FKind::Fail(6) | FKind::Fail(7) => Some(&["LibraryError"]),
        FKind::Weird(1) => Some(&["ArgumentError", "LibraryError"]),
        FKind::Weird(_) => Some(&["LibraryError", "ArgumentError", "DLPackError"]),
        _ => None,
    };
    match want {
        Some(w) if !w.contains(&k) => Err(format!("{f:?} failed with {k}, expected one of {w:?}")),
        _ => Ok(()),
    }
}

/// The elements of tensor argument `a` (Inside) or none (Empty), with its description.
fn tensor_of<'a>(
    c: &'a Case,
    verdicts: &[Verdict],
    a: &ArgD,
) -> Option<(&'a TDesc, Vec<i128>, bool)> {
    match a {
        ArgD::Tensor(i, ro) => match &verdicts[*i] {
            Verdict::Inside(e) => Some((&c.tensors[*i], e.clone(), *ro)),
            Verdict::Empty => Some((&c.tensors[*i], Vec::new(), *ro)),
            _ => None,
        },
        _ => None,
    }
}

/// Bits of element `addr` (an address inside a region) in the snapshot or now.
fn elem(c: &Case, t: &TDesc, addr: i128, size: usize, now: Option<&[u8]>) -> u64 {
    let reg = &c.regions[t.region];
    let i = reg.index_of(addr);
    let src = now.unwrap_or(&reg.snap);
    let mut b = [0u8; 8];
    b[..size].copy_from_slice(&src[i..i + size]);
    u64::from_le_bytes(b)
}

/// Marks an output's element bytes as allowed to change, refusing self-overlapping outputs.
fn allow(
    c: &Case,
    t: &TDesc,
    elems: &[i128],
    size: usize,
    allowed: &mut [Vec<bool>],
) -> Result<(), String> {
    let reg = &c.regions[t.region];
    let mut seen = std::collections::HashSet::new();
    for &a in elems {
        if !seen.insert(a) {
            return Err(format!(
                "accepted an output whose elements overlap (shape {:?}, strides {:?})",
                t.dims(),
                &t.strides[..t.rank()]
            ));
        }
        let i = reg.index_of(a);
        for b in &mut allowed[t.region][i..i + size] {
            *b = true;
        }
    }
    // Partially overlapping element byte ranges (misaligned strides).
    let mut sorted: Vec<i128> = elems.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[1] - w[0] < size as i128) {
        return Err(format!(
            "accepted an output whose elements overlap (shape {:?}, strides {:?})",
            t.dims(),
            &t.strides[..t.rank()]
        ));
    }
    Ok(())
}

fn same_view(a: &TDesc, b: &TDesc) -> bool {
    a.region == b.region
        && a.byte_offset == b.byte_offset
        && a.dims() == b.dims()
        && a.eff_strides() == b.eff_strides()
        && a.dtype == b.dtype
}

/// Byte sets of two views intersect.
fn overlaps(a: &TDesc, ea: &[i128], b: &TDesc, eb: &[i128], size: usize) -> bool {
    if a.region != b.region {
        return false;
    }
    let set: std::collections::HashSet<i128> = ea
        .iter()
        .flat_map(|&x| (0..size as i128).map(move |k| x + k))
        .collect();
    eb.iter()
        .any(|&x| (0..size as i128).any(|k| set.contains(&(x + k))))
}

/// The checks of a successful call against the reference; the result is released here.
fn verify(
    c: &mut Case,
    target: Target,
    eff: &[ArgD],
    verdicts: &[Verdict],
    result: &mut RivetAny,
    allowed: &mut [Vec<bool>],
    nop: RivetFunctionHandle,
) -> Result<(), String> {
    let what = format!("{target:?}");
    let accepted = |m: &str| Err(format!("{what}: accepted {m}: {eff:?}"));
    match target {
        Target::Scale(_) | Target::Add | Target::ISub => {
            let (n_in, rank, dt) = match target {
                Target::Scale(r) => (1usize, r, F32),
                Target::Add => (2, 1, F32),
                _ => (2, 1, I32),
            };
            if eff.len() != n_in && eff.len() != n_in + 1 {
                return accepted(&format!("{} arguments", eff.len()));
            }
            let mut ins = Vec::new();
            for a in &eff[..n_in] {
                let Some(t) = tensor_of(c, verdicts, a) else {
                    return accepted("a non-tensor input");
                };
                if t.0.dtype != dt || t.0.rank() != rank || !matches!(t.0.device, (1, _) | (3, _)) {
                    return accepted(&format!(
                        "an input of dtype {:?} rank {} device {:?}",
                        t.0.dtype,
                        t.0.rank(),
                        t.0.device
                    ));
                }
                ins.push(t);
            }
            let shape = ins[0].0.dims().to_vec();
            if ins.iter().any(|t| t.0.dims() != shape.as_slice()) {
                return accepted("inputs of different shapes");
            }
            if target == Target::ISub && shape != [ISUB_N] {
                return accepted(&format!("an input of shape {shape:?} for a fixed [5]"));
            }
            let reference: Vec<u32> = (0..ins[0].1.len())
                .map(|j| {
                    let v: Vec<u64> = ins.iter().map(|t| elem(c, t.0, t.1[j], 4, None)).collect();
                    match target {
                        Target::Scale(_) => canon32(f32::from_bits(v[0] as u32) * 2.0 + 1.0),
                        Target::Add => {
                            canon32(f32::from_bits(v[0] as u32) + f32::from_bits(v[1] as u32))
                        }
                        _ => (v[0] as u32 as i32).wrapping_sub(v[1] as u32 as i32) as u32,
                    }
                })
                .collect();
            if eff.len() == n_in {
                if result.type_code != RIVET_MANAGED_TENSOR {
                    return Err(format!(
                        "{what}: an inputs-only call returned type code {}",
                        result.type_code
                    ));
                }
                // SAFETY: a managed tensor result.
                let (s, d, vals) =
                    unsafe { managed_f32(result.value.v_ptr as *const DLManagedTensorVersioned) };
                if s != shape || d != dt {
                    return Err(format!("{what}: the allocated output has shape {s:?} dtype {d:?}, expected {shape:?} {dt:?}"));
                }
                let vals: Vec<u32> = vals
                    .into_iter()
                    .map(|b| {
                        if dt == F32 {
                            canon32(f32::from_bits(b))
                        } else {
                            b
                        }
                    })
                    .collect();
                if vals != reference {
                    return Err(format!(
                        "{what}: the allocated output is {vals:x?}, expected {reference:x?}"
                    ));
                }
                return free_result(result, &what);
            }
            if result.type_code != RIVET_NULL {
                return Err(format!(
                    "{what}: an in-place call returned type code {}",
                    result.type_code
                ));
            }
            let Some(out) = tensor_of(c, verdicts, &eff[n_in]) else {
                return accepted("a non-tensor output");
            };
            if out.2 {
                return accepted("a read-only output");
            }
            if out.0.dtype != dt
                || out.0.dims() != shape.as_slice()
                || !matches!(out.0.device, (1, _) | (3, _))
            {
                return accepted(&format!(
                    "an output of dtype {:?} shape {:?} device {:?}",
                    out.0.dtype,
                    out.0.dims(),
                    out.0.device
                ));
            }
            for t in &ins {
                if overlaps(t.0, &t.1, out.0, &out.1, 4) && !same_view(t.0, out.0) {
                    return accepted("an output partially overlapping an input");
                }
            }
            allow(c, out.0, &out.1, 4, allowed)?;
            let now = c.regions[out.0.region].now();
            let got: Vec<u32> = out
                .1
                .iter()
                .map(|&a| {
                    let b = elem(c, out.0, a, 4, Some(&now)) as u32;
                    if dt == F32 {
                        canon32(f32::from_bits(b))
                    } else {
                        b
                    }
                })
                .collect();
            if got != reference {
                return Err(format!(
                    "{what}: the output is {got:x?}, expected {reference:x?}"
                ));
            }
            Ok(())
        }
        Target::Axpy => {
            if eff.len() != 3 {
                return accepted(&format!("{} arguments", eff.len()));
            }
            let alpha = match eff[0] {
                ArgD::Float(v) => v,
                ArgD::Int(v) => v as f64,
                ArgD::Bool(v) => (v != 0) as i64 as f64,
                _ => return accepted("a non-numeric alpha"),
            };
            let (Some(x), Some(y)) = (
                tensor_of(c, verdicts, &eff[1]),
                tensor_of(c, verdicts, &eff[2]),
            ) else {
                return accepted("non-tensor x or y");
            };
            if y.2 {
                return accepted("a read-only y");
            }
            let dt = y.0.dtype;
            if x.0.dtype != dt || (dt != F32 && dt != F64) || x.0.dims() != y.0.dims() {
                return accepted("x and y of different dtypes or shapes");
            }
            if !matches!(x.0.device, (1, _) | (3, _)) || !matches!(y.0.device, (1, _) | (3, _)) {
                return accepted("a device tensor");
            }
            let size = if dt == F32 { 4 } else { 8 };
            if overlaps(x.0, &x.1, y.0, &y.1, size) && !same_view(x.0, y.0) {
                return accepted("y partially overlapping x");
            }
            if result.type_code != RIVET_NULL {
                return Err(format!("{what}: returned type code {}", result.type_code));
            }
            allow(c, y.0, &y.1, size, allowed)?;
            let now = c.regions[y.0.region].now();
            for j in 0..y.1.len() {
                let (xb, yb) = (
                    elem(c, x.0, x.1[j], size, None),
                    elem(c, y.0, y.1[j], size, None),
                );
                let got = elem(c, y.0, y.1[j], size, Some(&now));
                let (want, got) = if dt == F32 {
                    let w = (alpha as f32) * f32::from_bits(xb as u32) + f32::from_bits(yb as u32);
                    (
                        canon32(w) as u64,
                        canon32(f32::from_bits(got as u32)) as u64,
                    )
                } else {
                    let w = alpha * f64::from_bits(xb) + f64::from_bits(yb);
                    let cn = |v: f64| {
                        if v.is_nan() {
                            f64::NAN.to_bits()
                        } else {
                            v.to_bits()
                        }
                    };
                    (cn(w), cn(f64::from_bits(got)))
                };
                if want != got {
                    return Err(format!(
                        "{what}: y element {j} is {got:#x}, expected {want:#x}"
                    ));
                }
            }
            Ok(())
        }
        Target::Nop => {
            if result.type_code != RIVET_NULL {
                return Err(format!(
                    "testing.nop returned type code {}",
                    result.type_code
                ));
            }
            Ok(())
        }
        Target::Echo | Target::Foreign(FKind::EchoFirst) => {
            let foreign = target != Target::Echo;
            if !foreign && eff.len() != 1 {
                return accepted(&format!("{} arguments", eff.len()));
            }
            let Some(a) = eff.first() else {
                return if result.type_code == RIVET_NULL {
                    Ok(())
                } else {
                    Err(format!(
                        "EchoFirst of nothing returned {}",
                        result.type_code
                    ))
                };
            };
            check_echo(c, verdicts, a, result, foreign, nop, &what)
        }
        Target::Foreign(FKind::Sum) => {
            let mut s = 0i64;
            for a in eff {
                match a {
                    ArgD::Int(v) => s = s.wrapping_add(*v),
                    _ => return accepted("a non-int argument"),
                }
            }
            // SAFETY: an int result.
            if result.type_code != RIVET_INT || unsafe { result.value.v_int64 } != s {
                return Err(format!(
                    "{what}: returned code {} instead of INT {s}",
                    result.type_code
                ));
            }
            Ok(())
        }
        Target::Foreign(FKind::Probe) => {
            if result.type_code != RIVET_NULL {
                return Err(format!("{what}: returned type code {}", result.type_code));
            }
            let seen = PROBE
                .with(|p| p.borrow_mut().take())
                .ok_or("the probe was not called")?;
            if seen.len() != eff.len() {
                return Err(format!(
                    "the probe saw {} arguments, {} were passed",
                    seen.len(),
                    eff.len()
                ));
            }
            for (j, (s, a)) in seen.iter().zip(eff).enumerate() {
                let want = match a {
                    ArgD::Null => Seen::Null,
                    ArgD::Int(v) => Seen::Int(*v),
                    ArgD::Float(v) => Seen::Float(v.to_bits()),
                    ArgD::Bool(v) => Seen::Bool((*v != 0) as i64),
                    ArgD::Str(Some(b)) => Seen::Str(b.clone()),
                    ArgD::Tensor(..) => {
                        let Some((t, _, ro)) = tensor_of(c, verdicts, a) else {
                            return accepted("a refused tensor");
                        };
                        let dev = match t.device {
                            (1, _) => (1, 0),
                            (3, _) => (3, 0),
                            d => d,
                        };
                        let st: Vec<i64> = t.eff_strides().iter().map(|&x| x as i64).collect();
                        let empty = t.dims().contains(&0);
                        let Seen::Tensor { strides, .. } = s else {
                            return Err(format!("probe argument {j}: {s:?}, expected a tensor"));
                        };
                        Seen::Tensor {
                            code: if ro {
                                RIVET_DLTENSOR_READONLY
                            } else {
                                RIVET_DLTENSOR
                            },
                            first: (c.regions[t.region].base() as usize)
                                .wrapping_add(t.byte_offset as usize),
                            shape: t.dims().to_vec(),
                            // Strides of an empty tensor or of size-1 dims are free.
                            strides: if empty {
                                strides.clone()
                            } else {
                                st.iter()
                                    .zip(t.dims())
                                    .zip(strides)
                                    .map(|((&w, &n), &g)| if n == 1 { g } else { w })
                                    .collect()
                            },
                            dtype: t.dtype,
                            device: dev,
                        }
                    }
                    _ => return accepted(&format!("argument {a:?}")),
                };
                let s = match (s, &want) {
                    // An empty tensor's data pointer is free.
                    (
                        Seen::Tensor {
                            code,
                            shape,
                            strides,
                            dtype,
                            device,
                            ..
                        },
                        Seen::Tensor {
                            first, shape: ws, ..
                        },
                    ) if ws.contains(&0) => Seen::Tensor {
                        code: *code,
                        first: *first,
                        shape: shape.clone(),
                        strides: strides.clone(),
                        dtype: *dtype,
                        device: *device,
                    },
                    _ => s.clone(),
                };
                if s != want {
                    return Err(format!(
                        "probe argument {j}: the callee saw {s:?}, expected {want:?}"
                    ));
                }
            }
            Ok(())
        }
        Target::Foreign(FKind::Tensor(mode)) => {
            if mode != 0 {
                return Err(format!(
                    "{what}: a malformed managed tensor result was accepted"
                ));
            }
            if result.type_code != RIVET_MANAGED_TENSOR {
                return Err(format!("{what}: returned type code {}", result.type_code));
            }
            // SAFETY: a managed tensor result.
            let (s, d, vals) =
                unsafe { managed_f32(result.value.v_ptr as *const DLManagedTensorVersioned) };
            let want: Vec<u32> = OWN_VALUES.iter().map(|v| v.to_bits()).collect();
            if s != [4] || d != F32 || vals != want {
                return Err(format!("{what}: the result is {s:?} {d:?} {vals:x?}"));
            }
            let before = OWN_DELETED.load(Ordering::SeqCst);
            free_result(result, &what)?;
            if OWN_DELETED.load(Ordering::SeqCst) != before + 1 {
                return Err(format!(
                    "{what}: releasing the result did not run the callee's deleter once"
                ));
            }
            Ok(())
        }
        Target::Foreign(FKind::Fail(_)) | Target::Foreign(FKind::Weird(_)) => Err(format!(
            "{what}: a failing or contract-breaking callee's call succeeded (type code {})",
            result.type_code
        )),
    }
}

/// An echo's result against its argument (`foreign`: the callee returned it as it got it).
fn check_echo(
    c: &mut Case,
    verdicts: &[Verdict],
    a: &ArgD,
    result: &mut RivetAny,
    foreign: bool,
    nop: RivetFunctionHandle,
    what: &str,
) -> Result<(), String> {
    // SAFETY: each arm reads the member the type code names.
    unsafe {
        let ok = match a {
            ArgD::Null => result.type_code == RIVET_NULL,
            ArgD::Int(v) => result.type_code == RIVET_INT && result.value.v_int64 == *v,
            ArgD::Float(v) => {
                result.type_code == RIVET_FLOAT && result.value.v_float64.to_bits() == v.to_bits()
            }
            ArgD::Bool(v) => {
                result.type_code == RIVET_BOOL && result.value.v_int64 == (*v != 0) as i64
            }
            ArgD::Str(Some(b)) => {
                result.type_code == RIVET_STR
                    && !result.value.v_ptr.is_null()
                    && CStr::from_ptr(result.value.v_ptr as *const c_char).to_bytes()
                        == b.as_slice()
            }
            ArgD::Tensor(..) => {
                if foreign {
                    return Err(format!(
                        "{what}: a DLTensor (type code 5/6) returned as a result was accepted"
                    ));
                }
                let Some((t, _, ro)) = tensor_of(c, verdicts, a) else {
                    return Err(format!("{what}: accepted a refused tensor"));
                };
                if result.type_code != RIVET_MANAGED_TENSOR {
                    return Err(format!(
                        "{what}: a tensor came back as type code {}",
                        result.type_code
                    ));
                }
                let m = result.value.v_ptr as *const DLManagedTensorVersioned;
                let dl = &(*m).dl_tensor;
                let n = dl.ndim.clamp(0, 64) as usize;
                let shape: Vec<i64> = if n == 0 {
                    vec![]
                } else {
                    std::slice::from_raw_parts(dl.shape, n).to_vec()
                };
                let first = (dl.data as usize).wrapping_add(dl.byte_offset as usize);
                let want_first =
                    (c.regions[t.region].base() as usize).wrapping_add(t.byte_offset as usize);
                let ro_flag = (*m).flags & 1 == 1;
                let dt = (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes);
                if shape != t.dims()
                    || dt != t.dtype
                    || ro_flag != ro
                    || (first != want_first && !t.dims().contains(&0))
                {
                    return Err(format!(
                        "{what}: the echoed tensor is shape {shape:?} dtype {dt:?} read-only {ro_flag} at {first:#x}, expected {:?} {:?} {ro} at {want_first:#x}",
                        t.dims(), t.dtype
                    ));
                }
                if !t.dims().contains(&0) && n > 0 && !dl.strides.is_null() {
                    let got = std::slice::from_raw_parts(dl.strides, n);
                    let want = t.eff_strides();
                    if got
                        .iter()
                        .zip(&want)
                        .zip(t.dims())
                        .any(|((&g, &w), &d)| d != 1 && g as i128 != w)
                    {
                        return Err(format!(
                            "{what}: the echoed tensor's strides are {got:?}, expected {want:?}"
                        ));
                    }
                }
                return free_result(result, what);
            }
            ArgD::Func(0) => {
                if foreign {
                    return Err(format!("{what}: a function crossed to another library"));
                }
                if result.type_code != RIVET_FUNCTION
                    || result.value.v_ptr.is_null()
                    || result.value.v_ptr == nop
                {
                    return Err(format!(
                        "{what}: a function came back as type code {} {:p}",
                        result.type_code, result.value.v_ptr
                    ));
                }
                let same = match (
                    rivet_runtime::capi::handle_function(result.value.v_ptr),
                    rivet_runtime::capi::handle_function(nop),
                ) {
                    (Some(f), Some(g)) => f.same(&g),
                    _ => false,
                };
                if !same {
                    return Err(format!(
                        "{what}: the returned handle is not the function passed"
                    ));
                }
                return free_result(result, what);
            }
            _ => return Err(format!("{what}: accepted argument {a:?}")),
        };
        if !ok {
            return Err(format!(
                "{what}: echo of {a:?} returned type code {}",
                result.type_code
            ));
        }
        Ok(())
    }
}
