//! Test support: a lane-wise math function (`expf4`, `erff4`, `erff16`, ...) against the
//! scalar libm function it must equal bit for bit, over sampled or exhaustive sweeps of
//! float32 bit patterns. One place for the comparison and the sweeps of every such test.

/// Checks `f` on `xs` in vectors of `N` (the last one padded with `pad`), lane by lane equal
/// in bits to `want` (NaN for NaN).
pub fn check<const N: usize>(
    name: &str,
    f: impl Fn([f32; N]) -> [f32; N],
    want: fn(f32) -> f32,
    xs: &[f32],
    pad: f32,
) {
    for c in xs.chunks(N) {
        let mut x = [pad; N];
        x[..c.len()].copy_from_slice(c);
        let y = f(x);
        for l in 0..N {
            let w = want(x[l]);
            assert!(
                y[l].to_bits() == w.to_bits() || (y[l].is_nan() && w.is_nan()),
                "{name}({:e} = {:#x}) = {:e}, libm = {:e}",
                x[l],
                x[l].to_bits(),
                y[l],
                w
            );
        }
    }
}

/// The floats with bit patterns in `[from, to)` every `step`, each with both signs.
pub fn sweep(from: u32, to: u32, step: u32) -> Vec<f32> {
    (from..to)
        .step_by(step as usize)
        .flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)])
        .collect()
}

/// Each threshold's bit pattern, one below and one above, with both signs.
pub fn around(thresholds: &[u32]) -> Vec<f32> {
    thresholds
        .iter()
        .flat_map(|t| (0..3u32).map(move |d| t - 1 + d))
        .flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)])
        .collect()
}

/// `check` over every float in `[from, to)`, both signs, in chunks of 2^20 (the exhaustive,
/// `--ignored` tests).
pub fn check_all<const N: usize>(
    name: &str,
    f: impl Fn([f32; N]) -> [f32; N],
    want: fn(f32) -> f32,
    from: u32,
    to: u32,
) {
    let mut b = from;
    while b < to {
        let end = b.saturating_add(1 << 19).min(to);
        check(name, &f, want, &sweep(b, end, 1), 0.5);
        b = end;
    }
}
