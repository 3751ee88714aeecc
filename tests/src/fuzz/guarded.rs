//! Guarded tensors: a view in the middle of a larger rivet allocation, with guard elements
//! (canaries) on both sides and in the holes of a strided layout. Inputs are snapshotted and
//! must come back byte for byte; outputs are poisoned and only their own elements may change.

use super::rng::Rng;
use rivet_runtime::{DType, Tensor};

/// Guard elements on each side of a view.
pub const PAD: i64 = 16;
/// Byte every output starts as (kernels must overwrite each element they own).
pub const POISON: u8 = 0xA5;
/// Views with more elements than this are never enumerated (only broadcast inputs get there).
pub const MAX_ENUM: i64 = 1 << 16;

/// How a view lies in its base: per dim a step (>= 1), a reversal, or a zero stride.
#[derive(Clone, Debug, Default)]
pub struct LayoutS {
    /// Storage order, outermost first (a permutation of the dims).
    pub perm: Vec<usize>,
    pub steps: Vec<i64>,
    pub flips: Vec<bool>,
    pub bcast: Vec<bool>,
}

impl LayoutS {
    #[allow(dead_code)] // used by the regression tests
    pub fn compact(rank: usize) -> LayoutS {
        LayoutS {
            perm: (0..rank).collect(),
            steps: vec![1; rank],
            flips: vec![false; rank],
            bcast: vec![false; rank],
        }
    }

    /// A random layout; `may_bcast` allows zero strides (inputs only).
    pub fn random(rank: usize, may_bcast: bool, r: &mut Rng) -> LayoutS {
        let mut perm: Vec<usize> = (0..rank).collect();
        if r.chance(0.4) {
            for i in (1..rank).rev() {
                perm.swap(i, r.below(i as u64 + 1) as usize);
            }
        }
        LayoutS {
            perm,
            steps: (0..rank)
                .map(|_| if r.chance(0.3) { r.range(2, 3) } else { 1 })
                .collect(),
            flips: (0..rank).map(|_| r.chance(0.2)).collect(),
            bcast: (0..rank).map(|_| may_bcast && r.chance(0.15)).collect(),
        }
    }
}

pub struct Guarded {
    pub dtype: DType,
    pub base: Tensor,
    pub view: Tensor,
    /// Base element of each view element (row-major), when the view is small enough.
    pub covered: Option<Vec<usize>>,
    pub snapshot: Vec<u8>,
}

/// Raw bits of one random element: mostly small values, some specials and extremes.
pub fn random_bits(dtype: DType, r: &mut Rng) -> u64 {
    let k = r.below(100);
    let float = |r: &mut Rng| -> f64 {
        if k < 70 {
            (r.range(-16, 16) as f64) * 0.5
        } else if k < 90 {
            r.unit() * 20.0 - 10.0
        } else {
            r.pick(&[
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                -0.0,
                1e30,
                3e38,
                1e-310,
            ])
        }
    };
    let int = |r: &mut Rng| -> i64 {
        if k < 70 {
            r.range(-10, 10)
        } else if k < 85 {
            r.next() as i64
        } else {
            r.adversarial()
        }
    };
    match dtype {
        DType::F32 => (float(r) as f32).to_bits() as u64,
        DType::F64 => float(r).to_bits(),
        DType::Bool => r.below(2),
        _ => int(r) as u64,
    }
}

/// Bits with every NaN made one NaN (payloads are not part of the contract).
pub fn canon(bits: u64, dtype: DType) -> u64 {
    match dtype {
        DType::F32 if f32::from_bits(bits as u32).is_nan() => f32::NAN.to_bits() as u64,
        DType::F64 if f64::from_bits(bits).is_nan() => f64::NAN.to_bits(),
        _ => bits,
    }
}

fn bytes_of(t: &Tensor, elems: usize) -> &[u8] {
    // SAFETY: `t` is a compact rivet allocation of `elems` elements, alive while `t` is.
    unsafe { std::slice::from_raw_parts(t.data_ptr(), elems * t.dtype().size()) }
}

impl Guarded {
    /// A view of `shape` laid out by `lay`; filled with random data, or with `POISON` bytes.
    pub fn new(shape: &[i64], dtype: DType, lay: &LayoutS, poison: bool, r: &mut Rng) -> Guarded {
        Guarded::try_new(shape, dtype, lay, poison, r).expect("a guarded view inside its base")
    }

    /// As `new`, or `None` for a layout rivet cannot represent (an element count past i64).
    pub fn try_new(
        shape: &[i64],
        dtype: DType,
        lay: &LayoutS,
        poison: bool,
        r: &mut Rng,
    ) -> Option<Guarded> {
        shape.iter().try_fold(1i64, |a, &n| a.checked_mul(n))?;
        let rank = shape.len();
        let mut strides = vec![0i64; rank];
        let mut run = 1i64;
        let mut offset = PAD;
        let empty = shape.contains(&0);
        for &d in lay.perm.iter().rev() {
            if lay.bcast[d] {
                continue;
            }
            let s = run * lay.steps[d];
            strides[d] = if lay.flips[d] { -s } else { s };
            if lay.flips[d] && !empty {
                offset += (shape[d] - 1) * s;
            }
            run = s * shape[d].max(1);
        }
        let span = if empty { 0 } else { run };
        let len = span + 2 * PAD;
        let size = dtype.size();
        let base = Tensor::zeros(&[len], dtype).expect("a small base allocation");
        {
            // SAFETY: fresh compact allocation of `len` elements.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(base.data_ptr(), len as usize * size) };
            if poison {
                bytes.fill(POISON);
            } else {
                for e in 0..len as usize {
                    let b = random_bits(dtype, r).to_le_bytes();
                    bytes[e * size..(e + 1) * size].copy_from_slice(&b[..size]);
                }
            }
        }
        let view = base.as_strided(shape, &strides, offset).ok()?;
        let numel = shape.iter().try_fold(1i64, |a, &n| a.checked_mul(n));
        let covered = numel.filter(|&n| n <= MAX_ENUM).map(|n| {
            (0..n)
                .map(|f| {
                    let mut rem = f;
                    let mut at = offset;
                    for d in (0..rank).rev() {
                        at += (rem % shape[d]) * strides[d];
                        rem /= shape[d];
                    }
                    at as usize
                })
                .collect()
        });
        let snapshot = bytes_of(&base, len as usize).to_vec();
        Some(Guarded {
            dtype,
            base,
            view,
            covered,
            snapshot,
        })
    }

    fn base_len(&self) -> usize {
        self.snapshot.len() / self.dtype.size()
    }

    /// The base's bytes now.
    pub fn bytes(&self) -> Vec<u8> {
        bytes_of(&self.base, self.base_len()).to_vec()
    }

    /// `None` when the whole base is as it was (an input after a call).
    pub fn check_unchanged(&self, what: &str) -> Option<String> {
        let now = self.bytes();
        let size = self.dtype.size();
        (0..self.base_len())
            .find(|&e| now[e * size..(e + 1) * size] != self.snapshot[e * size..(e + 1) * size])
            .map(|e| {
                format!("{what}: base element {e} changed (input written or out-of-bounds write)")
            })
    }

    /// `None` when nothing outside the view's own elements changed (an output's canaries).
    pub fn check_canaries(&self, what: &str) -> Option<String> {
        let covered = self.covered.as_ref()?;
        let mut mine = vec![false; self.base_len()];
        for &c in covered {
            mine[c] = true;
        }
        let now = self.bytes();
        let size = self.dtype.size();
        (0..self.base_len())
            .find(|&e| {
                !mine[e] && now[e * size..(e + 1) * size] != self.snapshot[e * size..(e + 1) * size]
            })
            .map(|e| format!("{what}: guard element {e} outside the view was written"))
    }

    /// The view's elements (row-major), as canonical bits.
    pub fn elements(&self) -> Option<Vec<u64>> {
        let now = self.bytes();
        let size = self.dtype.size();
        Some(
            self.covered
                .as_ref()?
                .iter()
                .map(|&e| {
                    let mut b = [0u8; 8];
                    b[..size].copy_from_slice(&now[e * size..(e + 1) * size]);
                    canon(u64::from_le_bytes(b), self.dtype)
                })
                .collect(),
        )
    }

    /// A second guarded tensor with the same layout and the same bytes (for another target).
    pub fn twin(&self) -> Guarded {
        let len = self.base_len() as i64;
        let base = Tensor::zeros(&[len], self.dtype).expect("a small base allocation");
        // SAFETY: fresh compact allocation of `len` elements.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.snapshot.as_ptr(),
                base.data_ptr(),
                self.snapshot.len(),
            )
        };
        let off = (self.view.data_ptr() as isize - self.base.data_ptr() as isize)
            / self.dtype.size() as isize;
        let view = base
            .as_strided(self.view.shape(), self.view.strides(), off as i64)
            .expect("same layout as the original");
        Guarded {
            dtype: self.dtype,
            base,
            view,
            covered: self.covered.clone(),
            snapshot: self.snapshot.clone(),
        }
    }
}
