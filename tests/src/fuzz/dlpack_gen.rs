//! Generator 3: hand-made DLPack managed tensors, both ABIs (`DLManagedTensorVersioned` and
//! the legacy `DLManagedTensor`), with hostile ndim, shapes, strides, byte offsets, dtypes
//! (codes, bits, lanes), devices, versions, flags, NULL pointers and missing deleters, over a
//! real allocation of ours with guard bytes on both sides.
//!
//! Import must give a typed error, or a tensor that says what the capsule said and whose
//! every element lies inside our allocation (checked with 128-bit arithmetic). A layout
//! whose span overflows i64 / isize must be refused. Accepted tensors go through a compiled
//! kernel (as input and as output) and `testing.axpy`; results are checked against our own
//! reading of the memory, and the guard bytes and the deleter count (exactly once) after.

use super::rng::Rng;
use super::{kind, short, Outcome};
use dlpack_rs::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};
use rivet_compiler::ir::Expr;
use rivet_compiler::{build, te, Module, Schedule};
use rivet_runtime::{dlpack, DType, Function, Tensor, Value};
use std::cell::RefCell;
use std::ffi::c_void;
use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Guard bytes on each side of the data region.
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xCC;
/// Entries allocated for shape and strides, whatever ndim says (rivet reads at most 64).
const DIMS_CAP: usize = 72;

static DELETED: AtomicUsize = AtomicUsize::new(0);

/// What a managed tensor points to; freed by the deleter (the data region is the case's).
#[repr(C)]
struct Ctx<M> {
    managed: M,
    shape: [i64; DIMS_CAP],
    strides: [i64; DIMS_CAP],
}

unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    DELETED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: p came from Box::into_raw of a Ctx<DLManagedTensorVersioned> (the first field).
    drop(unsafe { Box::from_raw(p as *mut Ctx<DLManagedTensorVersioned>) });
}

unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    DELETED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: as above, for the legacy struct.
    drop(unsafe { Box::from_raw(p as *mut Ctx<DLManagedTensor>) });
}

/// The capsule fields drawn for one case.
#[derive(Debug, Clone)]
struct Spec {
    versioned: bool,
    version: (u32, u32),
    flags: u64,
    ndim: i32,
    null_shape: bool,
    null_strides: bool,
    null_data: bool,
    shape: Vec<i64>,
    strides: Vec<i64>,
    byte_offset: u64,
    /// Bytes added to the data pointer (misalignment).
    data_skew: usize,
    dtype: (u8, u8, u16),
    device: (u32, i32),
    deleter: bool,
}

pub fn supported(dt: (u8, u8, u16)) -> Option<DType> {
    let d = match (dt.0, dt.1) {
        (6, 8) => DType::Bool,
        (0, 8) => DType::I8,
        (0, 16) => DType::I16,
        (0, 32) => DType::I32,
        (0, 64) => DType::I64,
        (1, 8) => DType::U8,
        (1, 16) => DType::U16,
        (1, 32) => DType::U32,
        (1, 64) => DType::U64,
        (2, 16) => DType::F16,
        (2, 32) => DType::F32,
        (2, 64) => DType::F64,
        (4, 16) => DType::BF16,
        _ => return None,
    };
    (dt.2 == 1).then_some(d)
}

fn gen_spec(r: &mut Rng, region: usize) -> Spec {
    let dtype = if r.chance(0.8) {
        r.pick(&[
            (2u8, 32u8, 1u16),
            (2, 64, 1),
            (0, 32, 1),
            (1, 8, 1),
            (6, 8, 1),
            (2, 16, 1),
            (4, 16, 1),
        ])
    } else {
        (
            r.next() as u8 % 20,
            r.pick(&[0u8, 1, 7, 8, 16, 32, 64, 128, 255]),
            r.pick(&[0u16, 1, 2, 4, u16::MAX]),
        )
    };
    let size = supported(dtype).map_or(4, |d| d.size()) as i64;
    let ndim: i32 = if r.chance(0.9) {
        r.range(0, 4) as i32
    } else {
        r.pick(&[-1, 5, 8, 64, 65, 1000, i32::MAX, i32::MIN])
    };
    let nd = ndim.clamp(0, 64) as usize;
    let hostile = r.chance(0.35);
    let shape: Vec<i64> = (0..nd)
        .map(|_| {
            if hostile && r.chance(0.3) {
                r.pick(&[-1, 1 << 31, 1 << 62, i64::MAX, i64::MIN, 3_037_000_500])
            } else if r.chance(0.05) {
                0
            } else {
                r.range(1, 5)
            }
        })
        .collect();
    // Strides: a permuted, stepped, possibly reversed or broadcast layout that fits the
    // region, or hostile values.
    let mut strides = vec![0i64; nd];
    let mut run = 1i64;
    let mut offset_elems = 0i64;
    let mut order: Vec<usize> = (0..nd).collect();
    for i in (1..nd).rev() {
        order.swap(i, r.below(i as u64 + 1) as usize);
    }
    for &d in order.iter().rev() {
        let n = shape[d].clamp(0, 1 << 20);
        if r.chance(0.1) {
            continue; // zero stride
        }
        let s = run.saturating_mul(r.range(1, 2));
        strides[d] = s;
        if r.chance(0.2) {
            strides[d] = -s;
            offset_elems = offset_elems.saturating_add((n - 1).max(0).saturating_mul(s));
        }
        run = s.saturating_mul(n.max(1));
    }
    if hostile {
        for s in strides.iter_mut() {
            if r.chance(0.4) {
                *s = r.pick(&[
                    1 << 62,
                    -(1 << 62),
                    i64::MAX,
                    i64::MIN,
                    1 << 31,
                    -(1 << 31),
                    (1 << 61) + 1,
                ]);
            }
        }
    }
    let max_off = (region as i64 / size - run).max(0);
    let byte_offset = if hostile && r.chance(0.3) {
        r.pick(&[
            u64::MAX,
            1 << 63,
            (1 << 63) - 1,
            1 << 62,
            3,
            region as u64 + 8,
        ])
    } else {
        ((offset_elems + r.range(0, max_off.min(8))) * size) as u64
    };
    Spec {
        versioned: r.chance(0.6),
        version: if r.chance(0.9) {
            (1, r.range(0, 3) as u32)
        } else {
            (r.pick(&[0, 2, u32::MAX]), 0)
        },
        flags: if r.chance(0.8) { r.below(2) } else { r.next() },
        ndim,
        null_shape: r.chance(0.03),
        null_strides: r.chance(0.2),
        null_data: r.chance(0.03),
        shape,
        strides,
        byte_offset,
        data_skew: if r.chance(0.1) {
            r.range(1, 3) as usize
        } else {
            0
        },
        dtype,
        device: if r.chance(0.85) {
            (1, 0)
        } else {
            r.pick(&[(2, 0), (3, 0), (2, -1), (999, 0), (13, 0), (1, i32::MIN)])
        },
        deleter: r.chance(0.95),
    }
}

/// 128-bit facts about the layout a spec describes (the truth, not rivet's view of it).
struct Truth {
    numel: i128,
    lo: i128,
    hi: i128,
    /// The layout's element count or byte span does not fit i64 / isize.
    overflow: bool,
}

fn truth(shape: &[i64], strides: &[i64], size: i128) -> Truth {
    let numel: i128 = shape.iter().map(|&n| n as i128).product();
    let (mut lo, mut hi) = (0i128, 0i128);
    for (&n, &s) in shape.iter().zip(strides) {
        let reach = (n as i128 - 1) * s as i128;
        if reach < 0 {
            lo += reach
        } else {
            hi += reach
        }
    }
    let empty = shape.contains(&0);
    let overflow = !empty
        && (numel > i64::MAX as i128
            || lo < i64::MIN as i128
            || hi > i64::MAX as i128
            || (hi - lo + 1) * size > isize::MAX as i128);
    Truth {
        numel,
        lo,
        hi,
        overflow,
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

thread_local! {
    /// `C = A * 2 + 1` over rank 1 and rank 2 symbolic shapes, float32, built once.
    static KERNELS: RefCell<Option<Vec<Function>>> = const { RefCell::new(None) };
}

fn kernel(rank: usize) -> Option<Function> {
    if !(1..=2).contains(&rank) {
        return None;
    }
    KERNELS.with(|k| {
        let mut k = k.borrow_mut();
        let fs = k.get_or_insert_with(|| {
            (1..=2)
                .map(|rank| {
                    let shape: Vec<Expr> = (0..rank).map(|d| te::var(&format!("n{d}"))).collect();
                    let a = te::placeholder(&shape, DType::F32, "A").unwrap();
                    let a2 = a.clone();
                    let c = te::compute_dyn(&shape, |i| a2.idx(i) * 2.0 + 1.0, "C").unwrap();
                    let s = Schedule::new(&[c.clone()]).unwrap();
                    let m: Module = build(&s, &[a, c], "cpu", "k").unwrap();
                    m.get_function("k").unwrap()
                })
                .collect()
        });
        Some(fs[rank - 1].clone())
    })
}

fn axpy() -> Function {
    rivet_runtime::builtin_functions::functions()
        .into_iter()
        .find(|f| f.name() == "testing.axpy")
        .expect("testing.axpy exists")
}

/// Element byte addresses of a tensor's view, row-major (`None` past a few thousand).
fn addresses(t: &Tensor) -> Option<Vec<i128>> {
    let n: i128 = t.shape().iter().map(|&x| x as i128).product();
    if n > 4096 {
        return None;
    }
    let size = t.dtype().size() as i128;
    let base = t.data_ptr() as usize as i128;
    Some(
        (0..n)
            .map(|f| {
                let mut rem = f;
                let mut off = 0i128;
                for d in (0..t.ndim()).rev() {
                    let sh = t.shape()[d] as i128;
                    off += (rem % sh) * t.strides()[d] as i128;
                    rem /= sh;
                }
                base + off * size
            })
            .collect(),
    )
}

fn read_f32(addrs: &[i128]) -> Vec<u32> {
    addrs
        .iter()
        // SAFETY: every address was checked to lie inside the case's allocation.
        .map(|&a| unsafe { std::ptr::read_unaligned(a as usize as *const f32) }.to_bits())
        .collect()
}

pub fn run_case(seed: u64, verbose: bool) -> Outcome {
    let mut r = Rng::new(seed);
    let region = 8 * r.range(0, 256) as usize;
    let spec = gen_spec(&mut r, region);
    if verbose {
        eprintln!("dlpack case {seed:#x}: region {region} bytes, {spec:?}");
    }
    // The backing memory: guard, data region (random bytes, floats mostly finite), guard.
    let mut mem = vec![GUARD_BYTE; GUARD + region + GUARD];
    for w in 0..region / 4 {
        let v = (r.range(-8, 8) as f32 * 0.5).to_bits().to_le_bytes();
        mem[GUARD + 4 * w..GUARD + 4 * w + 4].copy_from_slice(&v);
    }
    let region_lo = mem.as_ptr() as usize as i128 + GUARD as i128;
    let region_hi = region_lo + region as i128;
    let data: *mut c_void = if spec.null_data {
        std::ptr::null_mut()
    } else {
        // SAFETY: within `mem` (skew < GUARD).
        unsafe { mem.as_mut_ptr().add(GUARD + spec.data_skew) as *mut c_void }
    };
    let before = DELETED.load(Ordering::SeqCst);
    let outcome = import_and_use(&spec, data, region_lo, region_hi, &mut r, verbose);
    let deleted = DELETED.load(Ordering::SeqCst) - before;
    let want = usize::from(spec.deleter);
    let mut outcome = outcome;
    if !matches!(outcome, Outcome::Fail(_)) && deleted != want {
        outcome = Outcome::Fail(format!("the deleter ran {deleted} times (expected {want})"));
    }
    if !matches!(outcome, Outcome::Fail(_)) {
        if let Some(i) = (0..GUARD)
            .chain(GUARD + region..2 * GUARD + region)
            .find(|&i| mem[i] != GUARD_BYTE)
        {
            outcome = Outcome::Fail(format!("guard byte {i} of the allocation was written"));
        }
    }
    if let Outcome::Fail(m) = outcome {
        return Outcome::Fail(format!("{m}\nspec: {spec:?}"));
    }
    outcome
}

/// Points a hand-made tensor at its own shape and stride arrays (or NULL, as the spec says).
fn point_arrays(t: &mut DLTensor, shape: &mut [i64], strides: &mut [i64], spec: &Spec) {
    t.shape = if spec.null_shape {
        std::ptr::null_mut()
    } else {
        shape.as_mut_ptr()
    };
    t.strides = if spec.null_strides {
        std::ptr::null_mut()
    } else {
        strides.as_mut_ptr()
    };
}

fn import_and_use(
    spec: &Spec,
    data: *mut c_void,
    region_lo: i128,
    region_hi: i128,
    r: &mut Rng,
    verbose: bool,
) -> Outcome {
    let mut shape = [0i64; DIMS_CAP];
    let mut strides = [0i64; DIMS_CAP];
    shape[..spec.shape.len()].copy_from_slice(&spec.shape);
    strides[..spec.strides.len()].copy_from_slice(&spec.strides);
    let dl = |shape: *mut i64, strides: *mut i64| DLTensor {
        data,
        device: DLDevice {
            device_type: spec.device.0,
            device_id: spec.device.1,
        },
        ndim: spec.ndim,
        dtype: DLDataType {
            code: spec.dtype.0,
            bits: spec.dtype.1,
            lanes: spec.dtype.2,
        },
        shape,
        strides,
        byte_offset: spec.byte_offset,
    };
    // The Ctx is boxed first so the DLTensor can point at its own arrays.
    let imported = if spec.versioned {
        let ctx = Box::into_raw(Box::new(Ctx {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion {
                    major: spec.version.0,
                    minor: spec.version.1,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: spec
                    .deleter
                    .then_some(delete_versioned as unsafe extern "C" fn(_)),
                flags: spec.flags,
                dl_tensor: dl(std::ptr::null_mut(), std::ptr::null_mut()),
            },
            shape,
            strides,
        }));
        // SAFETY: ctx is a live box; the pointers go to its own arrays.
        unsafe {
            let c = &mut *ctx;
            point_arrays(&mut c.managed.dl_tensor, &mut c.shape, &mut c.strides, spec);
            // Without a deleter nobody frees the box: the producer leaks it by design.
            dlpack::import_versioned(ctx as *mut DLManagedTensorVersioned)
        }
    } else {
        let ctx = Box::into_raw(Box::new(Ctx {
            managed: DLManagedTensor {
                dl_tensor: dl(std::ptr::null_mut(), std::ptr::null_mut()),
                manager_ctx: std::ptr::null_mut(),
                deleter: spec
                    .deleter
                    .then_some(delete_legacy as unsafe extern "C" fn(_)),
            },
            shape,
            strides,
        }));
        // SAFETY: as above.
        unsafe {
            let c = &mut *ctx;
            point_arrays(&mut c.managed.dl_tensor, &mut c.shape, &mut c.strides, spec);
            dlpack::import_legacy(ctx as *mut DLManagedTensor, spec.flags & 1 == 1)
        }
    };
    let t = match imported {
        Err(e) if kind(&e) == "Internal" => {
            return Outcome::Fail(format!("import: internal error: {e}"))
        }
        Err(e) => {
            if verbose {
                eprintln!("  import refused ({}): {}", kind(&e), short(&e.to_string()));
            }
            return Outcome::Typed(format!("import:{}", kind(&e)));
        }
        Ok(t) => t,
    };
    let nd = spec.ndim as usize;
    let want_strides = if spec.null_strides || nd == 0 {
        compact(&spec.shape)
    } else {
        spec.strides.clone()
    };
    let dtype = supported(spec.dtype).expect("an accepted dtype is a supported one");
    let size = dtype.size() as i128;
    let tr = truth(&spec.shape, &want_strides, size);
    if tr.overflow {
        return Outcome::fail(format!(
            "import accepted a layout whose span overflows (shape {:?}, strides {:?})",
            spec.shape, want_strides
        ));
    }
    if t.shape() != spec.shape.as_slice()
        || t.strides() != want_strides.as_slice()
        || t.dtype() != dtype
    {
        return Outcome::fail(format!(
            "import changed the layout: shape {:?} strides {:?} dtype {} (capsule: {:?} {:?} {dtype})",
            t.shape(),
            t.strides(),
            t.dtype(),
            spec.shape,
            want_strides
        ));
    }
    if tr.numel == 0 {
        return Outcome::Pass;
    }
    // Where the capsule says the elements are (the truth, from our own fields).
    let start = data as usize as i128 + spec.byte_offset as i128 + tr.lo * size;
    let end = data as usize as i128 + spec.byte_offset as i128 + (tr.hi + 1) * size;
    if start < region_lo || end > region_hi {
        // The capsule lies about memory it does not own, without overflowing: rivet cannot
        // know (it is the producer's promise); never touch it.
        return Outcome::Typed("accepted:producer-lie".into());
    }
    // rivet's own idea of where the elements are must agree.
    if let Some((lo, hi)) = t.byte_range() {
        if (lo as i128) < region_lo || (hi as i128) > region_hi {
            return Outcome::fail(format!(
                "byte_range {lo:#x}..{hi:#x} leaves the allocation {region_lo:#x}..{region_hi:#x}"
            ));
        }
    }
    let Some(addrs) = addresses(&t) else {
        return Outcome::Pass;
    };
    if let Some(a) = addrs
        .iter()
        .find(|&&a| a < region_lo || a + size > region_hi)
    {
        return Outcome::fail(format!("element at {a:#x} lies outside the allocation"));
    }
    if !t.device().is_host() {
        // A CPU kernel must refuse a device tensor.
        if let Some(k) = kernel(nd) {
            match k.call(&[Value::Tensor(t.clone())]) {
                Err(e) if kind(&e) == "Device" => {}
                Err(e) if kind(&e) != "Internal" => {}
                other => {
                    return Outcome::fail(format!(
                        "a CPU kernel on a {} tensor gave {:?}",
                        t.device(),
                        other.map(|_| ()).map_err(|e| e.to_string())
                    ))
                }
            }
        }
        return Outcome::Typed("device".into());
    }
    if dtype != DType::F32 {
        return Outcome::Pass;
    }
    let vals = read_f32(&addrs);
    // As an input of a compiled kernel: C = A * 2 + 1.
    if let Some(k) = kernel(nd) {
        match k.call(&[Value::Tensor(t.clone())]) {
            Ok(Value::Tensor(c)) => {
                let got = c.to_vec::<f32>().unwrap_or_default();
                for (j, (&g, &v)) in got.iter().zip(&vals).enumerate() {
                    let want = f32::from_bits(v) * 2.0 + 1.0;
                    if g.to_bits() != want.to_bits() && !(g.is_nan() && want.is_nan()) {
                        return Outcome::fail(format!(
                            "kernel on the imported tensor: element {j} is {g}, expected {want}"
                        ));
                    }
                }
                if read_f32(&addrs) != vals {
                    return Outcome::fail("the kernel wrote its input");
                }
            }
            Ok(other) => return Outcome::fail(format!("kernel returned {}", other.kind())),
            Err(e) if kind(&e) == "Internal" => {
                return Outcome::fail(format!("kernel: internal error: {e}"))
            }
            Err(_) => {}
        }
        // As the kernel's output, from a fresh input.
        let src: Vec<f32> = (0..vals.len()).map(|_| r.range(-4, 4) as f32).collect();
        let a = Tensor::from_slice(&src, t.shape()).expect("a small tensor");
        match k.call(&[Value::Tensor(a), Value::Tensor(t.clone())]) {
            Ok(_) => {
                let got = read_f32(&addrs);
                for (j, (&g, &s)) in got.iter().zip(&src).enumerate() {
                    if f32::from_bits(g) != s * 2.0 + 1.0 {
                        return Outcome::fail(format!(
                            "kernel into the imported tensor: element {j} is {}, expected {}",
                            f32::from_bits(g),
                            s * 2.0 + 1.0
                        ));
                    }
                }
            }
            Err(e) if kind(&e) == "Internal" => {
                return Outcome::fail(format!("kernel (output): internal error: {e}"))
            }
            Err(_) => {}
        }
    }
    // testing.axpy: y <- 2 x + y with the imported tensor as x, then as y.
    let f = axpy();
    let before = read_f32(&addrs);
    let y = Tensor::from_slice(&vec![1.0f32; addrs.len()], t.shape()).expect("a small tensor");
    match f.call(&[
        Value::Float(2.0),
        Value::Tensor(t.clone()),
        Value::Tensor(y.clone()),
    ]) {
        Ok(_) => {
            let got = y.to_vec::<f32>().unwrap_or_default();
            for (j, (&g, &b)) in got.iter().zip(&before).enumerate() {
                let want = 2.0 * f32::from_bits(b) + 1.0;
                if g != want && !(g.is_nan() && want.is_nan()) {
                    return Outcome::fail(format!(
                        "axpy from the imported tensor: element {j} is {g}, expected {want}"
                    ));
                }
            }
        }
        Err(e) if kind(&e) == "Internal" => {
            return Outcome::fail(format!("axpy: internal error: {e}"))
        }
        Err(_) => {}
    }
    let x = Tensor::from_slice(&vec![0.5f32; addrs.len()], t.shape()).expect("a small tensor");
    let before = read_f32(&addrs);
    match f.call(&[
        Value::Float(2.0),
        Value::Tensor(x),
        Value::Tensor(t.clone()),
    ]) {
        Ok(_) => {
            let got = read_f32(&addrs);
            for (j, (&g, &b)) in got.iter().zip(&before).enumerate() {
                let want = 1.0 + f32::from_bits(b);
                if f32::from_bits(g) != want && !(want.is_nan() && f32::from_bits(g).is_nan()) {
                    return Outcome::fail(format!(
                        "axpy into the imported tensor: element {j} is {}, expected {want}",
                        f32::from_bits(g)
                    ));
                }
            }
        }
        Err(e) if kind(&e) == "Internal" => {
            return Outcome::fail(format!("axpy (output): internal error: {e}"))
        }
        Err(_) => {}
    }
    let mut w = String::new();
    let _ = write!(w, "");
    Outcome::Pass
}
