//! Generator 5 ("xla"): XLA FFI call frames (`runtime/src/xla_ffi.rs`) made by hand, handed to
//! `rivet_xla_ffi_handler` (and, now and then, `rivet_xla_ffi_handler_cuda`) as XLA would.
//!
//! What a case draws: a registered function (the compiled `fuzz_capi.*` kernels of
//! `capi_gen`: `C = A*2+1` of rank 1 or 2, `C = A + B`, int32 `C = A - B` of fixed [5]; the
//! built-ins `testing.nop` and `testing.echo`), a well-formed frame for it (inputs and results
//! as `XLA_FFI_Buffer`s over guarded memory, the `rivet_function` string attribute, a fake
//! `XLA_FFI_Api` table whose entries are Rust functions that record what they were asked),
//! then, for most cases, one fault (and sometimes a second): the frame's `struct_size`, a NULL
//! or short API table (no way to report an error), a NULL or odd execution context, a stage
//! other than execute, a metadata extension (valid, too small, NULL metadata, a metadata struct
//! of an older XLA that ends at `traits`) or an extension of another type; argument and result
//! counts (0, off by one, negative, huge), NULL type or item arrays, non-buffer type tags, NULL
//! buffers, small buffer structs, unknown and wrong dtype tags, ranks (negative, > 64, huge),
//! NULL dims, dims negative or near 2^31 / 2^62 / `i64::MIN` or whose product overflows, NULL
//! data with elements, a result aliasing an input; attribute lists with bad sizes or NULL
//! arrays, a missing `rivet_function`, a wrong type tag, a name that is not UTF-8, not
//! NUL-terminated (a span of exactly its length) or of a huge length, an unknown function,
//! other attributes around it; for the CUDA handler, API tables without the stream or device
//! ordinal entries, entries that fail, a negative device ordinal.
//!
//! What a case checks: the process survives; a valid frame returns NULL and its results equal
//! a plain Rust reference, bit for bit; an invalid one returns the error the fake
//! `XLA_FFI_Error_Create` made (exactly one), whose message starts with "rivet <Kind>Error: "
//! for a rivet error class other than `InternalError`, with `XLA_FFI_Error_Code_INVALID_ARGUMENT`,
//! and names the problem (the fault's expected words); errors the fake API's own entries
//! returned are destroyed exactly once; input buffers are unchanged, results change only
//! inside their own bytes and only on success, guard bytes around every buffer and after
//! the metadata struct are intact. A frame whose error cannot be reported (no API table, or one
//! without `XLA_FFI_Error_Create`) must abort rather than return NULL (a NULL error reads as
//! success to XLA): that runs in a forked child, which must die of SIGABRT (or return NULL
//! when the frame was valid).
//!
//! Buffers are only ever described within their own memory, or in a way rivet must refuse (a
//! size past 64 bits, a negative dim, NULL data with elements): a description that merely
//! lies about memory the case does not own cannot be checked by anyone and is never passed.

use super::capi_gen::{ensure_kernels, Region, ISUB_N, K_ADD, K_ISUB, K_SCALE1, K_SCALE2};
use super::rng::Rng;
use super::Outcome;
use rivet_runtime::xla_ffi::{
    rivet_xla_ffi_handler, rivet_xla_ffi_handler_cuda, Api, ApiVersion, Attrs, Buffer, ByteSpan,
    CallFrame, DeviceOrdinalGetArgs, ErrorCreateArgs, ErrorDestroyArgs, ErrorGetMessageArgs,
    ExtensionBase, List, Metadata, MetadataExtension, StreamGetArgs, API_MAJOR, API_MINOR,
    FUNCTION_ATTR,
};
use rivet_runtime::Error;
use rivet_tests::ffi::call_frame;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Entries allocated for dims, whatever the rank says (rivet reads at most 64).
const DIMS_CAP: usize = 72;
/// `XLA_FFI_CallFrame_STRUCT_SIZE` (up to and including `attrs`).
const CALL_FRAME_SIZE: usize = std::mem::offset_of!(CallFrame, future);
/// The metadata struct of an XLA before `state_type_id` (it ends after `traits`).
const OLD_METADATA_SIZE: usize = std::mem::offset_of!(Metadata, traits) + 4;
const ERRC_INVALID_ARGUMENT: i32 = 3;
/// XLA_FFI_DataType codes of the kernels' dtypes.
const XF32: i32 = 11;
const XI32: i32 = 4;
const FAKE_CTX: usize = 0x5eed;
const FAKE_ORDINAL: i32 = 2;

// ---- the fake XLA ---------------------------------------------------------------------------

/// An `XLA_FFI_Error` of the fake XLA.
struct FakeError {
    message: CString,
    errc: i32,
}

/// Errors the fake `Error_Create` made, errors the fake getters returned, errors destroyed.
static CREATED: AtomicUsize = AtomicUsize::new(0);
static GETTER_ERRORS: AtomicUsize = AtomicUsize::new(0);
static DESTROYED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// How the fake getters answer: 0 fine, 1 fail, 2 a negative ordinal.
    static GETTER_MODE: RefCell<(u8, u8)> = const { RefCell::new((0, 0)) };
    /// The execution context of the frame being run (what the fake entries must be given).
    static CTX: RefCell<usize> = const { RefCell::new(FAKE_CTX) };
    /// Anomalies the fake entries saw (a wrong struct size, context, NULL message).
    static ANOMALY: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn anomaly(m: String) {
    ANOMALY.with(|a| {
        a.borrow_mut().get_or_insert(m);
    });
}

unsafe extern "C" fn fake_error_create(args: *mut ErrorCreateArgs) -> *mut c_void {
    CREATED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the handler passes valid args; the message is checked for NULL.
    let (message, errc) = unsafe {
        let a = &*args;
        if a.struct_size < std::mem::offset_of!(ErrorCreateArgs, errc) + 4 {
            anomaly(format!("Error_Create args of size {}", a.struct_size));
        }
        if a.message.is_null() {
            anomaly("Error_Create with a NULL message".into());
            (CString::default(), a.errc)
        } else {
            (CStr::from_ptr(a.message).to_owned(), a.errc)
        }
    };
    Box::into_raw(Box::new(FakeError { message, errc })) as *mut c_void
}

unsafe extern "C" fn fake_get_message(args: *mut ErrorGetMessageArgs) {
    // SAFETY: the error is one of the fake XLA's, alive until destroyed.
    unsafe { (*args).message = (*((*args).error as *const FakeError)).message.as_ptr() };
}

unsafe extern "C" fn fake_destroy(args: *mut ErrorDestroyArgs) {
    DESTROYED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: one of the fake XLA's errors, destroyed once (counted).
    drop(unsafe { Box::from_raw((*args).error as *mut FakeError) });
}

fn getter_error(what: &str) -> *mut c_void {
    GETTER_ERRORS.fetch_add(1, Ordering::SeqCst);
    Box::into_raw(Box::new(FakeError {
        message: CString::new(format!("{what} is down")).expect("no NUL"),
        errc: 13,
    })) as *mut c_void
}

unsafe extern "C" fn fake_stream_get(args: *mut StreamGetArgs) -> *mut c_void {
    // SAFETY: the handler passes valid args.
    let a = unsafe { &mut *args };
    if a.ctx as usize != CTX.with(|c| *c.borrow()) {
        anomaly(format!("Stream_Get with context {:p}", a.ctx));
    }
    if GETTER_MODE.with(|m| m.borrow().1) == 1 {
        return getter_error("the stream");
    }
    a.stream = 0x7f00_dead_b000usize as *mut c_void;
    std::ptr::null_mut()
}

unsafe extern "C" fn fake_ordinal_get(args: *mut DeviceOrdinalGetArgs) -> *mut c_void {
    // SAFETY: the handler passes valid args.
    let a = unsafe { &mut *args };
    if a.ctx as usize != CTX.with(|c| *c.borrow()) {
        anomaly(format!("DeviceOrdinal_Get with context {:p}", a.ctx));
    }
    match GETTER_MODE.with(|m| m.borrow().0) {
        1 => return getter_error("the ordinal"),
        2 => a.device_ordinal = -3,
        _ => a.device_ordinal = FAKE_ORDINAL,
    }
    std::ptr::null_mut()
}

fn fake_api() -> Api {
    Api {
        error_create: Some(fake_error_create),
        error_get_message: Some(fake_get_message),
        error_destroy: Some(fake_destroy),
        stream_get: Some(fake_stream_get),
        device_ordinal_get: Some(fake_ordinal_get),
        ..Api::empty()
    }
}

// ---- forked runs (errors that cannot be reported) ------------------------------------------

#[cfg(target_os = "linux")]
mod sys {
    use std::ffi::c_char;
    extern "C" {
        pub fn fork() -> i32;
        pub fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
        pub fn _exit(code: i32) -> !;
        pub fn kill(pid: i32, sig: i32) -> i32;
        pub fn open(path: *const c_char, flags: i32, ...) -> i32;
        pub fn dup2(old: i32, new: i32) -> i32;
    }
}

/// How a forked run of the handler ended.
#[derive(Debug, PartialEq)]
enum Forked {
    /// The handler returned NULL (success).
    Null,
    /// It returned an error (impossible without an API table).
    Error,
    Signal(i32),
    Exit(i32),
    Hang,
    Unsupported,
}

/// Runs `frame` through `handler` in a forked child (its stderr to /dev/null).
fn forked(
    handler: unsafe extern "C" fn(*mut CallFrame) -> *mut c_void,
    frame: *mut CallFrame,
) -> Forked {
    #[cfg(target_os = "linux")]
    // SAFETY: the child only calls the handler and exits; the parent only waits.
    unsafe {
        let pid = sys::fork();
        if pid < 0 {
            return Forked::Unsupported;
        }
        if pid == 0 {
            let fd = sys::open(c"/dev/null".as_ptr() as *const c_char, 1);
            if fd >= 0 {
                sys::dup2(fd, 2);
            }
            let e = handler(frame);
            sys::_exit(if e.is_null() { 0 } else { 3 });
        }
        let start = std::time::Instant::now();
        let mut status = 0i32;
        loop {
            let r = sys::waitpid(pid, &mut status, 1);
            if r == pid {
                break;
            }
            if r < 0 {
                return Forked::Unsupported;
            }
            if start.elapsed().as_secs() > 10 {
                sys::kill(pid, 9);
                sys::waitpid(pid, &mut status, 0);
                return Forked::Hang;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let sig = status & 0x7f;
        if sig != 0 {
            return Forked::Signal(sig);
        }
        match (status >> 8) & 0xff {
            0 => Forked::Null,
            3 => Forked::Error,
            c => Forked::Exit(c),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (handler, frame);
        Forked::Unsupported
    }
}

// ---- frames --------------------------------------------------------------------------------

/// The function a case runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    Scale(usize),
    Add,
    ISub,
    Nop,
    Echo,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Scale(1) => K_SCALE1,
            Target::Scale(_) => K_SCALE2,
            Target::Add => K_ADD,
            Target::ISub => K_ISUB,
            Target::Nop => "testing.nop",
            Target::Echo => "testing.echo",
        }
    }
}

/// One buffer as the case describes it.
#[derive(Clone, Debug)]
struct BufD {
    region: usize,
    struct_size: usize,
    dtype: i32,
    null_data: bool,
    rank: i64,
    dims: Vec<i64>,
    null_dims: bool,
}

fn xsize(dtype: i32) -> Option<i128> {
    Some(match dtype {
        1 | 2 | 6 => 1,
        3 | 7 | 10 | 16 => 2,
        4 | 8 | 11 => 4,
        5 | 9 | 12 => 8,
        _ => return None,
    })
}

/// What a buffer description amounts to.
#[derive(Debug, PartialEq)]
enum BVerdict {
    /// rivet must refuse it; the words its error must contain.
    Refuse(&'static str),
    /// Elements inside its region (count), or none.
    Fine(i128),
    /// About memory the case does not own: never passed.
    Lie,
}

impl BufD {
    fn shape(&self) -> &[i64] {
        &self.dims[..self.rank.clamp(0, 64) as usize]
    }
    fn verdict(&self, regions: &[Region]) -> BVerdict {
        if self.struct_size < std::mem::size_of::<Buffer>() {
            return BVerdict::Refuse("buffer struct too small");
        }
        let Some(size) = xsize(self.dtype) else {
            return BVerdict::Refuse("element type");
        };
        if !(0..=64).contains(&self.rank) || (self.rank > 0 && self.null_dims) {
            return BVerdict::Refuse("rank");
        }
        let shape = self.shape();
        if shape.iter().any(|&d| d < 0) {
            return BVerdict::Refuse("");
        }
        if shape.contains(&0) {
            return BVerdict::Fine(0);
        }
        let numel: i128 = shape.iter().map(|&d| d as i128).product();
        if numel > i64::MAX as i128 || numel * size > isize::MAX as i128 {
            return BVerdict::Refuse("");
        }
        if self.null_data {
            return BVerdict::Refuse("NULL data");
        }
        if numel * size > regions[self.region].hi() - regions[self.region].lo() || numel > 4096 {
            return BVerdict::Lie;
        }
        BVerdict::Fine(numel)
    }
}

/// An attribute as the case describes it.
#[derive(Clone, Debug)]
struct AttrD {
    ty: i32,
    /// The name's bytes (a span of `name_len` bytes over them; `None`: a NULL span pointer).
    name: Option<Vec<u8>>,
    name_len: Option<usize>,
    /// A string value's bytes, or (for other types) an i64 scalar.
    value: Option<Vec<u8>>,
    value_len: Option<usize>,
}

fn string_attr(name: &[u8], value: &[u8]) -> AttrD {
    AttrD {
        ty: 4,
        name: Some(name.to_vec()),
        name_len: None,
        value: Some(value.to_vec()),
        value_len: None,
    }
}

/// A frame as the case describes it.
struct FrameD {
    cuda: bool,
    struct_size: usize,
    api: u8, // 0 full, 1 NULL, 2 too short for Error_Create, 3 no Error_Create, 4 without DeviceOrdinal_Get, 5 without Stream_Get
    ctx: usize,
    stage: i32,
    /// 0 none, 1 metadata, 2 metadata ext too small, 3 NULL metadata, 4 metadata too small,
    /// 5 metadata of an older XLA (ends at traits), 6 an extension of another type.
    ext: u8,
    args: Vec<BufD>,
    rets: Vec<BufD>,
    /// (size override, NULL types, NULL items, type tag override at index, NULL item at index)
    args_list: ListD,
    rets_list: ListD,
    attrs: Vec<AttrD>,
    attrs_size: Option<i64>,
    attrs_null: u8, // 0 none, 1 types, 2 names, 3 values
}

#[derive(Clone, Debug, Default)]
struct ListD {
    size: Option<i64>,
    null_types: bool,
    null_items: bool,
    tag: Option<(usize, i32)>,
    null_item: Option<usize>,
}

/// What the case expects of the handler.
#[derive(Debug)]
enum Expect {
    /// NULL, and (for a compiled kernel run at stage execute) the reference results.
    Success,
    /// An error whose message contains each of these.
    Error(Vec<String>),
    /// Either (several faults, or one whose effect depends on the function).
    Either,
}

struct Case {
    r: Rng,
    log: String,
    regions: Vec<Region>,
}

impl Case {
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

    /// A compact buffer of `shape` in a fresh region (inputs random, results poisoned).
    fn buffer(&mut self, shape: &[i64], dtype: i32, result: bool) -> BufD {
        let size = xsize(dtype).unwrap_or(4) as i64;
        let numel: i64 = shape.iter().product();
        let slack = self.r.range(0, 2);
        let fill = if result {
            0
        } else if dtype == XI32 {
            2
        } else {
            1
        };
        self.regions.push(Region::new(
            ((numel + slack) * size) as usize,
            fill,
            &mut self.r,
        ));
        let mut dims = vec![1i64; DIMS_CAP];
        dims[..shape.len()].copy_from_slice(shape);
        BufD {
            region: self.regions.len() - 1,
            struct_size: std::mem::size_of::<Buffer>(),
            dtype,
            null_data: false,
            rank: shape.len() as i64,
            dims,
            null_dims: false,
        }
    }

    fn valid_frame(&mut self, t: Target) -> FrameD {
        let (args, rets) = match t {
            Target::Scale(rank) => {
                let s = self.dims(rank);
                (
                    vec![self.buffer(&s, XF32, false)],
                    vec![self.buffer(&s, XF32, true)],
                )
            }
            Target::Add | Target::ISub => {
                let (s, dt) = if t == Target::Add {
                    (self.dims(1), XF32)
                } else {
                    (vec![ISUB_N], XI32)
                };
                (
                    vec![self.buffer(&s, dt, false), self.buffer(&s, dt, false)],
                    vec![self.buffer(&s, dt, true)],
                )
            }
            Target::Nop => {
                let (na, nr) = (self.r.below(3), self.r.below(2));
                let a = (0..na)
                    .map(|_| {
                        let s = self.dims(1);
                        self.buffer(&s, XF32, false)
                    })
                    .collect();
                let r = (0..nr)
                    .map(|_| {
                        let s = self.dims(2);
                        self.buffer(&s, XI32, true)
                    })
                    .collect();
                (a, r)
            }
            Target::Echo => {
                let s = self.dims(1);
                (vec![self.buffer(&s, XF32, false)], vec![])
            }
        };
        let mut attrs = vec![string_attr(FUNCTION_ATTR.as_bytes(), t.name().as_bytes())];
        if self.r.chance(0.3) {
            // Other attributes around it (a scalar, a string), which the handler skips.
            let other = AttrD {
                ty: 2,
                name: Some(b"some_int".to_vec()),
                name_len: None,
                value: Some(7i64.to_le_bytes().to_vec()),
                value_len: None,
            };
            attrs.insert(0, other);
            attrs.push(string_attr(b"rivet_functio", b"nope"));
        }
        FrameD {
            cuda: false,
            struct_size: std::mem::size_of::<CallFrame>(),
            api: 0,
            ctx: FAKE_CTX,
            stage: 3,
            ext: 0,
            args,
            rets,
            args_list: ListD::default(),
            rets_list: ListD::default(),
            attrs,
            attrs_size: None,
            attrs_null: 0,
        }
    }
}

/// The attribute index of `rivet_function`.
fn fn_attr(f: &FrameD) -> usize {
    f.attrs
        .iter()
        .position(|a| a.name.as_deref() == Some(FUNCTION_ATTR.as_bytes()))
        .unwrap_or(0)
}

/// One fault (what it makes the handler do is `expectation`'s to say). A buffer description
/// that would lie about memory gets NULL data instead (which rivet must refuse).
fn fault(c: &mut Case, f: &mut FrameD, t: Target) {
    let k = c.r.below(24);
    let _ = write!(c.log, "fault {k}: ");
    match k {
        0 => {
            f.struct_size =
                c.r.pick(&[0, 8, CALL_FRAME_SIZE - 1, CALL_FRAME_SIZE, usize::MAX]);
            let _ = write!(c.log, "struct_size {} ", f.struct_size);
        }
        1 => {
            f.api = c.r.range(1, 3) as u8;
            let _ = write!(c.log, "api {} ", f.api);
        }
        2 => {
            f.ctx = c.r.pick(&[0usize, 1, usize::MAX]);
            let _ = write!(c.log, "ctx {:#x} ", f.ctx);
        }
        3 => {
            f.stage = c.r.pick(&[0, 1, 2, 4, -1, i32::MAX, i32::MIN]);
            let _ = write!(c.log, "stage {} ", f.stage);
        }
        4 => {
            f.ext = c.r.range(1, 6) as u8;
            let _ = write!(c.log, "ext {} ", f.ext);
        }
        5 | 6 => {
            let rets = k == 6;
            let (list, n) = if rets {
                (&mut f.rets_list, f.rets.len() as i64)
            } else {
                (&mut f.args_list, f.args.len() as i64)
            };
            let size = c.r.pick(&[
                -1,
                i64::MIN,
                (1 << 16) + 1,
                i64::MAX,
                0,
                n + 1,
                (n - 1).max(0),
                n + 3,
            ]);
            list.size = Some(size);
            let _ = write!(c.log, "{} size {size} ", if rets { "rets" } else { "args" });
        }
        7 => {
            let rets = c.r.chance(0.5);
            let (list, n) = if rets {
                (&mut f.rets_list, f.rets.len())
            } else {
                (&mut f.args_list, f.args.len())
            };
            if n == 0 {
                return;
            }
            if c.r.chance(0.5) {
                list.null_types = true;
            } else {
                list.null_items = true;
            }
            let _ = write!(c.log, "{} NULL array ", if rets { "rets" } else { "args" });
        }
        8 => {
            let rets = c.r.chance(0.5);
            let (list, n) = if rets {
                (&mut f.rets_list, f.rets.len())
            } else {
                (&mut f.args_list, f.args.len())
            };
            if n == 0 {
                return;
            }
            let i = c.r.below(n as u64) as usize;
            let tag = c.r.pick(&[0, 2, -1, 99, i32::MIN]);
            list.tag = Some((i, tag));
            let _ = write!(c.log, "{} {i} tag {tag} ", if rets { "ret" } else { "arg" });
        }
        9 => {
            let rets = c.r.chance(0.5);
            let (list, n) = if rets {
                (&mut f.rets_list, f.rets.len())
            } else {
                (&mut f.args_list, f.args.len())
            };
            if n == 0 {
                return;
            }
            let i = c.r.below(n as u64) as usize;
            list.null_item = Some(i);
            let _ = write!(c.log, "{} {i} NULL ", if rets { "ret" } else { "arg" });
        }
        10..=16 => {
            // A buffer field.
            let rets = c.r.chance(0.5);
            let n = if rets { f.rets.len() } else { f.args.len() };
            if n == 0 {
                return;
            }
            let i = c.r.below(n as u64) as usize;
            let what = if rets {
                format!("XLA result {i}")
            } else {
                format!("XLA argument {i}")
            };
            let b = if rets { &mut f.rets[i] } else { &mut f.args[i] };
            match k {
                10 => b.struct_size = c.r.pick(&[0, 8, std::mem::size_of::<Buffer>() - 1]),
                11 => {
                    b.dtype =
                        c.r.pick(&[0, 13, 14, 15, 17, 20, 30, -1, i32::MAX, 12, 5, 1, 10, 16])
                }
                12 => {
                    b.rank =
                        c.r.pick(&[-1, 65, i64::MAX, i64::MIN, 64, 1 << 32, b.rank + 1])
                }
                13 => b.null_dims = true,
                14 => {
                    let rank = b.rank.clamp(0, 64) as usize;
                    if rank == 0 {
                        b.rank = 1;
                    }
                    let rank = rank.max(1);
                    for d in 0..rank {
                        if d == 0 || c.r.chance(0.5) {
                            b.dims[d] = c.r.pick(&[
                                -1,
                                i64::MIN,
                                i64::MIN + 1,
                                (1 << 31) - 1,
                                1 << 31,
                                1 << 62,
                                (1 << 62) - 1,
                                i64::MAX,
                                3_037_000_500,
                                46341,
                            ]);
                        }
                    }
                }
                15 => b.null_data = true,
                _ => {
                    // The result aliases an input (the same bytes, or shifted by an element).
                    if rets && !f.args.is_empty() {
                        let a = f.args[c.r.below(f.args.len() as u64) as usize].clone();
                        let b = &mut f.rets[i];
                        if a.dtype == b.dtype && a.shape() == b.shape() {
                            b.region = a.region;
                            let _ = write!(c.log, "{what} aliases region {} ", a.region);
                            return;
                        }
                    }
                    return;
                }
            }
            let b = if rets { &mut f.rets[i] } else { &mut f.args[i] };
            let _ = write!(
                c.log,
                "{what}: {:?} ",
                (
                    b.struct_size,
                    b.dtype,
                    b.rank,
                    b.null_dims,
                    b.shape(),
                    b.null_data
                )
            );
            if b.verdict(&c.regions) == BVerdict::Lie {
                b.null_data = true;
                let _ = write!(c.log, "(lie: null data) ");
            }
        }
        17 => {
            f.attrs_size = Some(c.r.pick(&[-1, i64::MIN, (1 << 16) + 1, i64::MAX]));
            let _ = write!(c.log, "attrs size {:?} ", f.attrs_size);
        }
        18 => {
            f.attrs_null = c.r.range(1, 3) as u8;
            let _ = write!(c.log, "attrs NULL array {} ", f.attrs_null);
        }
        19 => {
            let i = fn_attr(f);
            match c.r.below(5) {
                0 => {
                    f.attrs[i].name = Some(b"rivet_funct1on".to_vec());
                }
                1 => f.attrs[i].name = None,
                2 => {
                    f.attrs[i].name_len =
                        Some(c.r.pick(&[usize::MAX, 1 << 63, (isize::MAX as usize) + 1]))
                }
                3 => f.attrs[i].value = None,
                _ => {
                    f.attrs[i].value_len = Some(c.r.pick(&[usize::MAX, (isize::MAX as usize) + 1]))
                }
            }
            let _ = write!(c.log, "attr {:?} ", f.attrs[i]);
        }
        20 => {
            let i = fn_attr(f);
            f.attrs[i].ty = c.r.pick(&[0, 1, 2, 3, 5, -1, 99]);
            let _ = write!(c.log, "attr type {} ", f.attrs[i].ty);
        }
        21 => {
            let i = fn_attr(f);
            let v =
                c.r.pick(&[&b"fuzz_capi.\xffscale1"[..], b"\xc3\x28", b"\xf0\x9f\x98"]);
            f.attrs[i].value = Some(v.to_vec());
            let _ = write!(c.log, "attr value {v:?} ");
        }
        22 => {
            let i = fn_attr(f);
            let v = c.r.pick(&[
                &b"fuzz_capi.nope"[..],
                b"",
                b"testing.echo\0x",
                b"fuzz_capi.scale1 ",
            ]);
            f.attrs[i].value = Some(v.to_vec());
            let _ = write!(c.log, "attr value {v:?} ");
        }
        _ => {
            // The name as a span of exactly its length inside a longer buffer (not
            // NUL-terminated), and a second, later rivet_function that must be ignored.
            let i = fn_attr(f);
            let mut name = FUNCTION_ATTR.as_bytes().to_vec();
            name.extend_from_slice(b"_and_more");
            f.attrs[i].name = Some(name);
            f.attrs[i].name_len = Some(FUNCTION_ATTR.len());
            let mut value = t.name().as_bytes().to_vec();
            value.extend_from_slice(b"XYZ");
            f.attrs[i].value_len = Some(t.name().len());
            f.attrs[i].value = Some(value);
            f.attrs
                .push(string_attr(FUNCTION_ATTR.as_bytes(), b"fuzz_capi.nope"));
            let _ = write!(c.log, "exact spans ");
        }
    }
}

/// What the handler must do with frame `f`, following its documented order of checks: the
/// frame's size, the metadata extension, the stage, the `rivet_function` attribute and the
/// lookup, (CUDA) XLA's device ordinal and stream, the argument then the result buffers, and
/// last the function itself.
fn expectation(
    f: &FrameD,
    t: Target,
    getter: (u8, u8),
    valid: &[BufD],
    regions: &[Region],
) -> Expect {
    let e = |w: &[&str]| Expect::Error(w.iter().map(|s| s.to_string()).collect());
    if f.struct_size < CALL_FRAME_SIZE {
        return e(&["malformed XLA FFI call frame", "struct_size"]);
    }
    match f.ext {
        1 | 5 => return Expect::Success,
        2 => return e(&["metadata extension too small"]),
        3 => return e(&["NULL metadata"]),
        4 => return e(&["metadata struct too small"]),
        _ => {}
    }
    if f.stage != 3 {
        return Expect::Success;
    }
    if f.attrs_size.is_some() || (!f.attrs.is_empty() && f.attrs_null != 0) {
        return e(&["malformed XLA FFI attributes"]);
    }
    let span = |bytes: &Option<Vec<u8>>, len: Option<usize>| -> Option<Vec<u8>> {
        let b = bytes.as_ref()?;
        let len = len.unwrap_or(b.len());
        if len > isize::MAX as usize {
            return None;
        }
        Some(b[..len].to_vec())
    };
    let missing = || e(&["no string attribute 'rivet_function'"]);
    let Some(a) = f
        .attrs
        .iter()
        .find(|a| span(&a.name, a.name_len).as_deref() == Some(FUNCTION_ATTR.as_bytes()))
    else {
        return missing();
    };
    if a.ty != 4 {
        return e(&["must be a string"]);
    }
    let Some(value) = span(&a.value, a.value_len) else {
        return missing();
    };
    let Ok(name) = std::str::from_utf8(&value) else {
        return e(&["not UTF-8"]);
    };
    if name != t.name() {
        return e(&["no function named"]);
    }
    if f.cuda {
        match (getter, f.api) {
            (_, 1) => return e(&["NULL API table"]),
            (_, 2) | (_, 4) => return e(&["has no XLA_FFI_DeviceOrdinal_Get"]),
            (_, 5) => return e(&["has no XLA_FFI_Stream_Get"]),
            ((1, _), _) => return e(&["XLA_FFI_DeviceOrdinal_Get failed: the ordinal is down"]),
            ((2, _), _) => return e(&["device ordinal -3"]),
            ((_, 1), _) => return e(&["XLA_FFI_Stream_Get failed: the stream is down"]),
            _ => {}
        }
    }
    let all: Vec<&BufD> = f.args.iter().chain(&f.rets).collect();
    let spare = all.last().copied();
    let mut changed = false;
    for (rets, ld, bufs) in [
        (false, &f.args_list, &f.args),
        (true, &f.rets_list, &f.rets),
    ] {
        let what = if rets { "result" } else { "argument" };
        let size = ld.size.unwrap_or(bufs.len() as i64);
        if !(0..=1 << 16).contains(&size) || (size > 0 && (ld.null_types || ld.null_items)) {
            return e(&["malformed XLA FFI", &format!("{what} list")]);
        }
        changed |= size != bufs.len() as i64;
        for i in 0..size as usize {
            if let Some((j, tag)) = ld.tag {
                if j == i && tag != 1 {
                    return Expect::Error(vec![format!(
                        "XLA {what} {i}: expected a buffer, got type {tag}"
                    )]);
                }
            }
            if ld.null_item == Some(i) {
                return Expect::Error(vec![format!("XLA {what} {i}: NULL buffer")]);
            }
            let Some(b) = bufs.get(i).or(spare) else {
                // Padding with no buffer at all: NULL items.
                return Expect::Error(vec![format!("XLA {what} {i}: NULL buffer")]);
            };
            if let BVerdict::Refuse(w) = b.verdict(regions) {
                return Expect::Error(vec![format!("XLA {what} {i}"), w.to_string()]);
            }
        }
    }
    for (k, b) in all.iter().enumerate() {
        let v = &valid[k];
        if b.region != v.region
            || b.dtype != v.dtype
            || b.shape() != v.shape()
            || b.null_data != v.null_data
        {
            changed = true;
        }
    }
    if changed {
        // The function's own checks (arity, dtypes, shapes, overlap) decide.
        return Expect::Either;
    }
    match t {
        Target::Echo => e(&["returned a"]),
        Target::Nop => Expect::Success,
        _ if f.cuda => e(&["DeviceError", "expected a CPU tensor"]),
        _ => Expect::Success,
    }
}

/// The memory a frame's pointers go to, alive for the call.
struct Built {
    api: Box<Api>,
    bufs: Vec<Buffer>,
    arg_types: Vec<i32>,
    arg_items: Vec<*mut c_void>,
    ret_types: Vec<i32>,
    ret_items: Vec<*mut c_void>,
    spans: Vec<ByteSpan>,
    attr_types: Vec<i32>,
    attr_names: Vec<*mut ByteSpan>,
    attr_values: Vec<*mut c_void>,
    metadata: Box<MetaGuarded>,
    ext: Box<MetadataExtension>,
    other_ext: Box<ExtensionBase>,
    frame: Box<CallFrame>,
}

/// A metadata struct with guard words after it.
#[repr(C)]
struct MetaGuarded {
    md: Metadata,
    guard: [u64; 4],
}

const MD_GUARD: u64 = 0xC0C0_C0C0_C0C0_C0C0;

fn build_frame(f: &FrameD, c: &Case) -> Built {
    let mut api = Box::new(fake_api());
    match f.api {
        2 => api.struct_size = std::mem::offset_of!(Api, error_create),
        3 => api.error_create = None,
        4 => api.struct_size = std::mem::offset_of!(Api, device_ordinal_get),
        5 => api.stream_get = None,
        _ => {}
    }
    let n_args = f.args.len();
    let bufs: Vec<Buffer> = f
        .args
        .iter()
        .chain(&f.rets)
        .map(|b| Buffer {
            struct_size: b.struct_size,
            extension_start: std::ptr::null_mut(),
            dtype: b.dtype,
            data: if b.null_data {
                std::ptr::null_mut()
            } else {
                c.regions[b.region].base() as *mut c_void
            },
            rank: b.rank,
            dims: if b.null_dims {
                std::ptr::null_mut()
            } else {
                b.dims.as_ptr() as *mut i64
            },
        })
        .collect();
    let mut built = Built {
        api,
        bufs,
        arg_types: Vec::new(),
        arg_items: Vec::new(),
        ret_types: Vec::new(),
        ret_items: Vec::new(),
        spans: Vec::new(),
        attr_types: Vec::new(),
        attr_names: Vec::new(),
        attr_values: Vec::new(),
        metadata: Box::new(MetaGuarded {
            md: Metadata {
                struct_size: match f.ext {
                    4 => OLD_METADATA_SIZE - 4,
                    5 => OLD_METADATA_SIZE,
                    _ => std::mem::size_of::<Metadata>(),
                },
                api_version: ApiVersion {
                    struct_size: 0,
                    extension_start: std::ptr::null_mut(),
                    major_version: -1,
                    minor_version: -1,
                },
                traits: 77,
                state_type_id: 9,
            },
            guard: [MD_GUARD; 4],
        }),
        ext: Box::new(MetadataExtension {
            extension_base: ExtensionBase {
                struct_size: if f.ext == 2 {
                    8
                } else {
                    std::mem::size_of::<MetadataExtension>()
                },
                type_: 1,
                next: std::ptr::null_mut(),
            },
            metadata: std::ptr::null_mut(),
        }),
        other_ext: Box::new(ExtensionBase {
            struct_size: std::mem::size_of::<ExtensionBase>(),
            type_: 7,
            next: std::ptr::null_mut(),
        }),
        frame: Box::new(CallFrame {
            struct_size: f.struct_size,
            ..call_frame(std::ptr::null(), f.ctx as *mut c_void, f.stage)
        }),
    };
    if f.ext != 3 {
        built.ext.metadata = &mut built.metadata.md;
    }
    // Lists, padded (past their real entries) up to a size within MAX_COUNT with copies of
    // the last buffer, so a bigger size never reads past the arrays.
    let spare = built.bufs.len().saturating_sub(1);
    let base = built.bufs.as_mut_ptr();
    for (rets, ld, range) in [
        (false, &f.args_list, 0..n_args),
        (true, &f.rets_list, n_args..n_args + f.rets.len()),
    ] {
        let mut types: Vec<i32> = vec![1; range.len()];
        // SAFETY: indices inside `bufs`, whose heap buffer does not move from here on.
        let mut items: Vec<*mut c_void> = range
            .clone()
            .map(|i| unsafe { base.add(i) } as *mut c_void)
            .collect();
        let size = ld.size.unwrap_or(range.len() as i64);
        if (0..=1 << 16).contains(&size) && size as usize > types.len() {
            let extra = size as usize - types.len();
            types.extend(std::iter::repeat_n(1, extra));
            let p = if built.bufs.is_empty() {
                std::ptr::null_mut()
            } else {
                // SAFETY: as above.
                unsafe { base.add(spare) as *mut c_void }
            };
            items.extend(std::iter::repeat_n(p, extra));
        }
        if let Some((i, tag)) = ld.tag {
            types[i] = tag;
        }
        if let Some(i) = ld.null_item {
            items[i] = std::ptr::null_mut();
        }
        let list = List {
            struct_size: std::mem::size_of::<List>(),
            extension_start: std::ptr::null_mut(),
            size,
            types: if ld.null_types {
                std::ptr::null_mut()
            } else {
                types.as_mut_ptr()
            },
            items: if ld.null_items {
                std::ptr::null_mut()
            } else {
                items.as_mut_ptr()
            },
        };
        if rets {
            built.frame.rets = list;
            built.ret_types = types;
            built.ret_items = items;
        } else {
            built.frame.args = list;
            built.arg_types = types;
            built.arg_items = items;
        }
    }
    // Attributes: name and value spans (strings), or a pointer to an i64 (scalars).
    built.spans = Vec::with_capacity(2 * f.attrs.len());
    for a in &f.attrs {
        let name_span = ByteSpan {
            ptr: a
                .name
                .as_ref()
                .map_or(std::ptr::null(), |n| n.as_ptr() as *const c_char),
            len: a.name_len.unwrap_or(a.name.as_ref().map_or(0, |n| n.len())),
        };
        let value_span = ByteSpan {
            ptr: a
                .value
                .as_ref()
                .map_or(std::ptr::null(), |v| v.as_ptr() as *const c_char),
            len: a
                .value_len
                .unwrap_or(a.value.as_ref().map_or(0, |v| v.len())),
        };
        built.spans.push(name_span);
        built.spans.push(value_span);
    }
    let sp = built.spans.as_mut_ptr();
    for (i, a) in f.attrs.iter().enumerate() {
        built.attr_types.push(a.ty);
        // SAFETY: indices inside `spans` (capacity reserved, never moved).
        built.attr_names.push(if a.name.is_none() {
            std::ptr::null_mut()
        } else {
            unsafe { sp.add(2 * i) }
        });
        built.attr_values.push(if a.value.is_none() {
            std::ptr::null_mut()
        } else if a.ty == 4 {
            // SAFETY: as above.
            unsafe { sp.add(2 * i + 1) as *mut c_void }
        } else {
            a.value
                .as_ref()
                .map_or(std::ptr::null_mut(), |v| v.as_ptr() as *mut c_void)
        });
    }
    let attrs_len = f.attrs.len() as i64;
    let asize = f.attrs_size.unwrap_or(attrs_len);
    built.frame.attrs = Attrs {
        struct_size: std::mem::size_of::<Attrs>(),
        extension_start: std::ptr::null_mut(),
        size: asize,
        types: if f.attrs_null == 1 {
            std::ptr::null_mut()
        } else {
            built.attr_types.as_mut_ptr()
        },
        names: if f.attrs_null == 2 {
            std::ptr::null_mut()
        } else {
            built.attr_names.as_mut_ptr()
        },
        attrs: if f.attrs_null == 3 {
            std::ptr::null_mut()
        } else {
            built.attr_values.as_mut_ptr()
        },
    };
    built.frame.api = if f.api == 1 {
        std::ptr::null()
    } else {
        &*built.api
    };
    built.frame.extension_start = match f.ext {
        0 => std::ptr::null_mut(),
        6 => &mut *built.other_ext,
        _ => &mut built.ext.extension_base,
    };
    built
}

/// The reference results of a compiled kernel on the frame's inputs (compact buffers).
fn reference(t: Target, f: &FrameD, regions: &[Region]) -> Option<Vec<u8>> {
    let read = |b: &BufD| -> Vec<u32> {
        let n: i64 = b.shape().iter().product();
        let reg = &regions[b.region];
        let snap = reg_snapshot(reg);
        (0..n as usize)
            .map(|j| u32::from_le_bytes(snap[j * 4..j * 4 + 4].try_into().expect("4 bytes")))
            .collect()
    };
    let out: Vec<u32> = match t {
        Target::Scale(_) => read(&f.args[0])
            .iter()
            .map(|&a| (f32::from_bits(a) * 2.0 + 1.0).to_bits())
            .collect(),
        Target::Add => {
            let (a, b) = (read(&f.args[0]), read(&f.args[1]));
            a.iter()
                .zip(&b)
                .map(|(&x, &y)| (f32::from_bits(x) + f32::from_bits(y)).to_bits())
                .collect()
        }
        Target::ISub => {
            let (a, b) = (read(&f.args[0]), read(&f.args[1]));
            a.iter()
                .zip(&b)
                .map(|(&x, &y)| (x as i32).wrapping_sub(y as i32) as u32)
                .collect()
        }
        _ => return None,
    };
    Some(out.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// A region's data bytes before the call.
fn reg_snapshot(reg: &Region) -> Vec<u8> {
    reg.snapshot_data()
}

pub fn run_case(seed: u64, verbose: bool) -> Outcome {
    if let Err(e) = ensure_kernels() {
        return Outcome::fail(format!("building the kernels: {e}"));
    }
    let mut c = Case {
        r: Rng::new(seed),
        log: String::new(),
        regions: Vec::new(),
    };
    let out = match run_checked(&mut c) {
        Ok(o) => o,
        Err(m) => Outcome::Fail(m),
    };
    if verbose {
        eprintln!("xla case {seed:#x}: {}", c.log);
    }
    match out {
        Outcome::Fail(m) => Outcome::Fail(format!("{m}\n  case: {}", c.log)),
        o => o,
    }
}

fn run_checked(c: &mut Case) -> Result<Outcome, String> {
    let target = match c.r.below(8) {
        0 | 1 => Target::Scale(1),
        2 => Target::Scale(2),
        3 | 4 => Target::Add,
        5 => Target::ISub,
        6 => Target::Nop,
        _ => Target::Echo,
    };
    let _ = write!(c.log, "target {target:?} ");
    let mut f = c.valid_frame(target);
    let valid_bufs: Vec<BufD> = f.args.iter().chain(&f.rets).cloned().collect();
    f.cuda = c.r.chance(0.1);
    let mut getter = (0u8, 0u8);
    if f.cuda {
        // Host memory on XLA's "CUDA device": the CPU kernels refuse it, nop and echo never
        // touch it; what the handler asks XLA for is the point.
        getter = match c.r.below(6) {
            0 => (1, 0),
            1 => (0, 1),
            2 => (2, 0),
            _ => (0, 0),
        };
        if c.r.chance(0.2) {
            f.api = c.r.pick(&[4u8, 5]);
        }
        let _ = write!(c.log, "cuda getters {getter:?} api {} ", f.api);
    }
    let faults = if c.r.chance(0.8) {
        1
    } else if c.r.chance(0.5) {
        2
    } else {
        0
    };
    for _ in 0..faults {
        fault(c, &mut f, target);
    }
    let expect = expectation(&f, target, getter, &valid_bufs, &c.regions);
    let _ = write!(c.log, "expect {expect:?}");
    // Whether the kernel runs and writes its results (for the reference and the canaries).
    let runs = matches!(expect, Expect::Success)
        && !f.cuda
        && f.stage == 3
        && !matches!(f.ext, 1 | 5)
        && matches!(target, Target::Scale(_) | Target::Add | Target::ISub);
    let unreportable = matches!(f.api, 1..=3);
    let handler = if f.cuda {
        rivet_xla_ffi_handler_cuda
    } else {
        rivet_xla_ffi_handler
    };
    GETTER_MODE.with(|m| *m.borrow_mut() = getter);
    CTX.with(|x| *x.borrow_mut() = f.ctx);
    ANOMALY.with(|a| *a.borrow_mut() = None);
    let mut built = build_frame(&f, c);
    let (created0, getter0, destroyed0) = (
        CREATED.load(Ordering::SeqCst),
        GETTER_ERRORS.load(Ordering::SeqCst),
        DESTROYED.load(Ordering::SeqCst),
    );
    let frame: *mut CallFrame = &mut *built.frame;
    if unreportable && !matches!(expect, Expect::Success) {
        // An error here cannot be reported: the handler must abort, never return NULL.
        let how = forked(handler, frame);
        let _ = write!(c.log, " forked: {how:?}");
        return match how {
            Forked::Signal(6) => Ok(Outcome::Typed("unreportable:abort".into())),
            Forked::Null if matches!(expect, Expect::Either) => {
                Ok(Outcome::Typed("unreportable:null".into()))
            }
            Forked::Unsupported => Ok(Outcome::Typed("unreportable:skipped".into())),
            // A child forked from a process whose other threads held a lock at the fork (the
            // multi-threaded test harness of tests/fuzz_regressions.rs) may wait forever: not
            // a finding. The fuzz worker runs one case at a time, so it does not get here.
            Forked::Hang => Ok(Outcome::Typed("unreportable:timeout".into())),
            other => Err(format!(
                "an unreportable frame ended the handler with {other:?}"
            )),
        };
    }
    // SAFETY: every pointer in the frame points into `built` or the case's regions (or is
    // NULL, or a description rivet must refuse), alive for the call.
    let err = unsafe { handler(frame) };
    let created = CREATED.load(Ordering::SeqCst) - created0;
    let getters = GETTER_ERRORS.load(Ordering::SeqCst) - getter0;
    let destroyed = DESTROYED.load(Ordering::SeqCst) - destroyed0;
    if let Some(a) = ANOMALY.with(|a| a.borrow_mut().take()) {
        return Err(format!("the fake XLA saw: {a}"));
    }
    if getters != destroyed {
        return Err(format!(
            "XLA's entries returned {getters} errors, rivet destroyed {destroyed}"
        ));
    }
    let outcome = if err.is_null() {
        if created != 0 {
            return Err(format!("success, yet {created} errors were created"));
        }
        if let Expect::Error(w) = &expect {
            return Err(format!(
                "the handler succeeded on a frame it must refuse (expected {w:?})"
            ));
        }
        None
    } else {
        // SAFETY: made by fake_error_create (checked by the count below).
        let e = unsafe { Box::from_raw(err as *mut FakeError) };
        if created != 1 {
            return Err(format!(
                "the handler returned an error after {created} Error_Create calls"
            ));
        }
        let msg = e.message.to_string_lossy().into_owned();
        let kind = msg
            .strip_prefix("rivet ")
            .and_then(|m| m.split_once(": "))
            .map(|(k, _)| k.to_string())
            .unwrap_or_default();
        if !kind.ends_with("Error") || Error::from_kind_name(&kind, String::new()).is_none() {
            return Err(format!(
                "the error message does not start with 'rivet <Kind>Error: ': {msg}"
            ));
        }
        if kind == "InternalError" {
            return Err(format!("an internal error: {msg}"));
        }
        if e.errc != ERRC_INVALID_ARGUMENT {
            return Err(format!("error code {} for {msg}", e.errc));
        }
        match &expect {
            Expect::Success => return Err(format!("the handler failed on a valid frame: {msg}")),
            Expect::Error(w) => {
                if let Some(missing) = w.iter().find(|w| !msg.contains(w.as_str())) {
                    return Err(format!(
                        "the error does not name the problem ('{missing}'): {msg}"
                    ));
                }
            }
            Expect::Either => {}
        }
        Some(kind)
    };
    // Metadata: answered in place, nothing written past a struct's size.
    if matches!(f.ext, 1 | 5) && f.struct_size >= CALL_FRAME_SIZE && outcome.is_none() {
        let md = &built.metadata.md;
        if (md.api_version.major_version, md.api_version.minor_version) != (API_MAJOR, API_MINOR)
            || md.traits != 0
        {
            return Err(format!(
                "the metadata query answered version {}.{} traits {}",
                md.api_version.major_version, md.api_version.minor_version, md.traits
            ));
        }
        if f.ext == 5 && md.state_type_id != 9 {
            return Err(format!("the metadata query wrote state_type_id past an older XLA's struct (of {OLD_METADATA_SIZE} bytes)"));
        }
    }
    if built.metadata.guard != [MD_GUARD; 4] {
        return Err("bytes after the metadata struct were written".into());
    }
    // Memory: inputs intact; results written (and right) only when the kernel ran.
    let written: Vec<usize> = if runs && outcome.is_none() {
        f.rets.iter().map(|b| b.region).collect()
    } else {
        Vec::new()
    };
    for (i, reg) in c.regions.iter().enumerate() {
        let mut allowed = vec![false; reg.total()];
        if written.contains(&i) {
            let b = f.rets.iter().find(|b| b.region == i).expect("a result");
            let n: i64 = b.shape().iter().product();
            let bytes = n as usize * xsize(b.dtype).unwrap_or(4) as usize;
            for a in &mut allowed[reg.data_start()..reg.data_start() + bytes] {
                *a = true;
            }
        }
        if let Some(m) = reg.check(&allowed, &format!("buffer {i}")) {
            return Err(m);
        }
    }
    if runs && outcome.is_none() {
        let want = reference(target, &f, &c.regions).expect("a kernel");
        let got = c.regions[f.rets[0].region].data_now();
        let got = &got[..want.len()];
        let canon = |b: &[u8]| -> Vec<u32> {
            b.chunks(4)
                .map(|w| {
                    let v = u32::from_le_bytes(w.try_into().expect("4 bytes"));
                    if target != Target::ISub && f32::from_bits(v).is_nan() {
                        f32::NAN.to_bits()
                    } else {
                        v
                    }
                })
                .collect()
        };
        if canon(got) != canon(&want) {
            return Err(format!(
                "the result is {:x?}, expected {:x?}",
                canon(got),
                canon(&want)
            ));
        }
    }
    drop(built);
    Ok(match outcome {
        None => Outcome::Pass,
        Some(k) => Outcome::Typed(k),
    })
}
