//! The cache sizes the micro-kernel drivers block for, detected at run time (machines differ
//! between runs of the same build: Zen 3 / Zen 4 / Intel, 32 or 48 KiB of L1d), and the depth
//! of the product slices a driver cuts a call into (`slice_depth`).
//!
//! Detection: Linux's `/sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}` (what
//! the kernel read from CPUID), once per process; anything unreadable or implausible falls back
//! to 32 KiB, the L1d of every x86-64 core of the last decade but the newest. The slice depth
//! only changes the order in which tiles are visited, never an element's sequence of
//! multiply-adds, so results are the same bits whatever the detection says.

use std::sync::OnceLock;

/// The L1 data cache in bytes (see the module header), or 32 KiB when unknown.
pub fn l1d_bytes() -> usize {
    static L1D: OnceLock<usize> = OnceLock::new();
    *L1D.get_or_init(|| detect_l1d().unwrap_or(32 << 10))
}

fn detect_l1d() -> Option<usize> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |f: &str| std::fs::read_to_string(entry.path().join(f)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if level.trim() == "1" && kind.trim() == "Data" {
            return parse_size(size.trim()).filter(|b| (4 << 10..=4 << 20).contains(b));
        }
    }
    None
}

/// `"32K"`, `"1M"` or a plain byte count, as sysfs writes cache sizes.
fn parse_size(s: &str) -> Option<usize> {
    let (digits, unit) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(unit)
}

/// `RIVET_GEMM_KC`: forces the slice depth (a positive count of products; 0 turns slicing
/// off), for comparisons. Read once per process; anything else is ignored.
pub const KC_ENV: &str = "RIVET_GEMM_KC";

fn forced_depth() -> Option<usize> {
    static KC: OnceLock<Option<usize>> = OnceLock::new();
    *KC.get_or_init(|| {
        std::env::var(KC_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
    })
}

/// How many products (rows of the panels) one slice of an `mr x nr` tile update over `elem`
/// byte elements holds, when a driver cuts the tile into several kernel tiles: the A and B
/// rows of a slice (`(mr + nr) * depth` elements) fill at most half of L1d, so every kernel
/// tile after the first finds its panel rows in L1 instead of re-reading them from L2 (at
/// 12 x 32 f32 over 1024 products, four 6 x 16 kernels each streaming all of K re-read
/// 448 KiB per call, 18 bytes a cycle at the FMA units' pace: L2's limit). A multiple of 8,
/// at least 16; `usize::MAX` (one slice) when slicing is off.
pub fn slice_depth(mr: usize, nr: usize, elem: usize) -> usize {
    if let Some(k) = forced_depth() {
        return if k == 0 { usize::MAX } else { k };
    }
    depth_for(l1d_bytes(), mr, nr, elem)
}

fn depth_for(l1d: usize, mr: usize, nr: usize, elem: usize) -> usize {
    let row = (mr + nr).max(1).saturating_mul(elem.max(1));
    ((l1d / 2 / row) & !7).max(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_size("32K"), Some(32 << 10));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("49152"), Some(49152));
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999999999K"), None);
        let l1 = l1d_bytes();
        assert!((4 << 10..=4 << 20).contains(&l1), "{l1}");
    }

    #[test]
    fn the_depth_fills_half_of_l1() {
        // 32 KiB: 12 x 32 f32 rows are 176 bytes, 93 of them fill 16 KiB: 88.
        assert_eq!(depth_for(32 << 10, 12, 32, 4), 88);
        assert_eq!(depth_for(32 << 10, 12, 32, 8), 40);
        assert_eq!(depth_for(48 << 10, 12, 32, 4), 136);
        // Tiny caches and huge tiles still make progress.
        assert_eq!(depth_for(4 << 10, 1000, 1000, 8), 16);
        assert_eq!(depth_for(0, 0, 0, 0), 16);
    }
}
