//! Every variant the CPU supports against the definition (a plain fused loop: bit for bit)
//! and against unfused maths (within the documented tolerance), at k = 1, 3, 17, 97, 257 and
//! 1023 (a tile cut into kernel tiles is also cut into L1 slices along k: ragged ones), with
//! packed and strided operands, tiles that are multiples of the kernels' and ones that are
//! not; property tests draw the rest.

use super::*;
use proptest::prelude::*;

/// xorshift64*: reproducible data without a dependency.
struct Rng(u64);
impl Rng {
    fn f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// One case: tile, k, and the operands' layouts (packed panels or strided views).
#[derive(Debug, Clone)]
struct Case {
    mr: usize,
    nr: usize,
    k: usize,
    packed: bool,
    c_transposed: bool,
    seed: u64,
}

fn run(variant: Variant, cs: &Case) -> (Vec<f32>, Vec<f32>, Vec<f64>) {
    let Case {
        mr, nr, k, packed, ..
    } = *cs;
    let mut rng = Rng(cs.seed | 1);
    // Panels: packed (unit inner stride, rows of mr / nr), or strided (A as i-major with a
    // pad, B with inner stride 2).
    let (a_ks, a_ms, alen) = if packed {
        (mr as isize, 1, k * mr)
    } else {
        (1, k as isize + 3, mr * (k + 3))
    };
    let (b_ks, b_ns, blen) = if packed {
        (nr as isize, 1, k * nr)
    } else {
        (2 * nr as isize + 1, 2, k * (2 * nr + 1))
    };
    let a = rng.vec(alen.max(1));
    let b = rng.vec(blen.max(1));
    // C inside a larger buffer (the elements around it must stay untouched).
    let (c_rs, c_cs) = if cs.c_transposed {
        (1, mr as isize + 2)
    } else {
        (nr as isize + 5, 1)
    };
    // Room for the whole tile at its strides, plus a margin after it (a fixed formula here once
    // missed the last element for tall, one-column tiles: mr = 24, nr = 1).
    let clen = 7 + mr * c_rs as usize + nr * c_cs as usize + 16;
    let c0 = 7;
    let c_init = rng.vec(clen);
    let mut c = c_init.clone();
    gemm_f32_checked(
        variant,
        (mr, nr, k),
        &mut c,
        (c0, c_rs, c_cs),
        &a,
        (0, a_ks, a_ms),
        &b,
        (0, b_ks, b_ns),
    )
    .unwrap();
    // The definition: fused, in order of p, from the old C.
    let mut want = c_init.clone();
    let mut exact = vec![0f64; clen];
    for (e, w) in exact.iter_mut().zip(&c_init) {
        *e = *w as f64;
    }
    for i in 0..mr {
        for j in 0..nr {
            let ci = (c0 as isize + i as isize * c_rs + j as isize * c_cs) as usize;
            let mut acc = want[ci];
            let mut x = exact[ci];
            for p in 0..k {
                let av = a[(p as isize * a_ks + i as isize * a_ms) as usize];
                let bv = b[(p as isize * b_ks + j as isize * b_ns) as usize];
                acc = av.mul_add(bv, acc);
                x += av as f64 * bv as f64;
            }
            want[ci] = acc;
            exact[ci] = x;
        }
    }
    (c, want, exact)
}

fn check(variant: Variant, cs: &Case) {
    let (got, want, exact) = run(variant, cs);
    for (n, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{variant:?} {cs:?}: element {n}: {g} vs the fused definition's {w}"
        );
    }
    // Against exact maths: |err| <= k * 2^-23 * (|C| + sum |a b|) bounds the fused sum
    // (docs/cpu.md); with |a|, |b|, |C| <= 1 that is at most k(k+1) ulp(1).
    let tol = (cs.k as f64 + 1.0) * (cs.k as f64 + 1.0) * f32::EPSILON as f64;
    for (g, x) in got.iter().zip(&exact) {
        assert!(
            (*g as f64 - x).abs() <= tol,
            "{variant:?} {cs:?}: {g} vs {x}"
        );
    }
}

fn supported() -> Vec<Variant> {
    Variant::ALL.into_iter().filter(|v| v.supported()).collect()
}

#[test]
fn every_variant_matches_the_definition_at_fixed_sizes() {
    let tiles = [
        (12, 32),
        (24, 64),
        (6, 16),
        (12, 16),
        (1, 1),
        (5, 7),
        (13, 33),
    ];
    for v in supported() {
        for &(mr, nr) in &tiles {
            // 257 and 1023: several L1 slices of a cut tile, the last one ragged.
            for k in [0, 1, 3, 17, 97, 257, 1023] {
                for packed in [true, false] {
                    for c_transposed in [false, true] {
                        let cs = Case {
                            mr,
                            nr,
                            k,
                            packed,
                            c_transposed,
                            seed: (mr * 1000 + nr * 10 + k) as u64,
                        };
                        check(v, &cs);
                    }
                }
            }
        }
    }
}

#[test]
fn selection_refuses_unknown_and_unsupported_variants() {
    let e = choose(Some("sse9")).unwrap_err();
    assert!(
        e.contains("RIVET_MICROKERNEL") && e.contains("avx512, avx2, portable"),
        "{e}"
    );
    assert_eq!(choose(Some("portable")), Ok(Variant::Portable));
    assert_eq!(choose(None), Ok(detect()));
    assert_eq!(choose(Some("")), Ok(detect()));
    for v in Variant::ALL {
        match choose(Some(v.name())) {
            Ok(got) => assert!(v.supported() && got == v),
            Err(e) => assert!(!v.supported() && e.contains(v.features()), "{e}"),
        }
    }
}

#[test]
fn the_checked_entry_refuses_regions_outside_the_slices() {
    let mut c = vec![0f32; 12 * 32];
    let a = vec![1f32; 12 * 4];
    let b = vec![1f32; 32 * 3]; // one row short
    let e = gemm_f32_checked(
        Variant::Portable,
        (12, 32, 4),
        &mut c,
        (0, 32, 1),
        &a,
        (0, 12, 1),
        &b,
        (0, 32, 1),
    )
    .unwrap_err();
    assert!(e.starts_with("B:"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn every_variant_matches_the_definition(
        mr in prop_oneof![Just(12usize), Just(24), Just(6), 1usize..30],
        nr in prop_oneof![Just(32usize), Just(16), Just(64), 1usize..70],
        k in prop_oneof![Just(1usize), Just(97), 0usize..40],
        packed in any::<bool>(),
        c_transposed in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let cs = Case { mr, nr, k, packed, c_transposed, seed };
        for v in supported() {
            check(v, &cs);
        }
    }
}

#[test]
fn f64_entries_match_the_definition() {
    for v in supported() {
        for &(mr, nr) in &[(12usize, 16usize), (24, 32), (12, 32), (6, 8), (5, 7)] {
            // 257 and 1023: several L1 slices of a cut tile, the last one ragged.
            for k in [1usize, 3, 17, 97, 257, 1023] {
                let mut rng = Rng((mr * 131 + nr * 7 + k) as u64);
                let a: Vec<f64> = rng.vec(k * mr).iter().map(|&x| x as f64 / 3.0).collect();
                let b: Vec<f64> = rng.vec(k * nr).iter().map(|&x| x as f64 / 7.0).collect();
                // C as a transposed tile inside a larger buffer, and compact.
                for (c_rs, c_cs) in [(nr as i64 + 3, 1i64), (1, mr as i64 + 1)] {
                    let len = 4 + (mr + 1) * (nr + 3) + 8;
                    let init: Vec<f64> = rng.vec(len).iter().map(|&x| x as f64).collect();
                    let mut c = init.clone();
                    // SAFETY: the tile and panels lie inside the vectors (sizes above).
                    unsafe {
                        v.entry_f64()(
                            mr as i64,
                            nr as i64,
                            k as i64,
                            c.as_mut_ptr().add(4),
                            c_rs,
                            c_cs,
                            a.as_ptr(),
                            mr as i64,
                            1,
                            b.as_ptr(),
                            nr as i64,
                            1,
                        )
                    };
                    let mut want = init.clone();
                    for i in 0..mr {
                        for j in 0..nr {
                            let ci = 4 + i * c_rs as usize + j * c_cs as usize;
                            for p in 0..k {
                                want[ci] = a[p * mr + i].mul_add(b[p * nr + j], want[ci]);
                            }
                        }
                    }
                    assert!(
                        c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{v:?} f64 {mr}x{nr} k={k} strides ({c_rs}, {c_cs})"
                    );
                }
            }
        }
    }
}
