//! Reading a cubin: an ELF64 file for `EM_CUDA` (190), as NVRTC writes it.
//!
//! `cuModuleLoadData` gets a bare pointer, so the image's length is worked out from its own
//! headers before anything else reads it: the furthest of the section header table's end, the
//! program header table's end, every non-`NOBITS` section's end and every segment's file end.
//! Invariants: nothing is read past that length (every later read is bounds-checked against
//! the slice [`image_len`] gave), and a malformed image is an `Err` naming what is wrong,
//! never a panic.
//!
//! What the double takes from a cubin:
//! - the architecture, from `e_flags`: ABI version 8 and later (CUDA 12.8+) keep `sm_XY` as
//!   the number XY in bits 8..16 (sm_80 `0x6005004`, sm_86 `0x6005604`, sm_90 `0x6005a04`,
//!   sm_120 `0x6007802`, found by compiling one source for each); older ABIs keep it in bits
//!   0..8;
//! - the kernels: global `STT_FUNC` symbols marked entry points (`st_other` 0x10);
//! - each kernel's static shared memory: the size of `.nv.shared.<name>` (on sm_90 NVRTC
//!   counts the 1 KiB the system reserves per block in it);
//! - each kernel's parameter layout from `.nv.info.<name>`: `EIATTR_KPARAM_INFO` records
//!   (ordinal, offset, size) and `EIATTR_CBANK_PARAM_SIZE` (the total), which the real driver
//!   lays the launch's parameters out by.

use std::collections::BTreeMap;

pub const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const EM_CUDA: u16 = 190;
const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
/// `st_other` of a kernel's symbol: an entry point. A global `__device__` function of a
/// relocatable cubin (`-rdc`) is a global `STT_FUNC` without it.
const STO_CUDA_ENTRY: u8 = 0x10;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;

/// Reads little-endian integers at bounds-checked offsets.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn bytes(&self, at: u64, n: u64) -> Result<&[u8], String> {
        let end = at
            .checked_add(n)
            .filter(|&e| e <= self.0.len() as u64)
            .ok_or_else(|| format!("reads {n} bytes at {at}, past the image's end"))?;
        Ok(&self.0[at as usize..end as usize])
    }
    fn u16(&self, at: u64) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.bytes(at, 2)?.try_into().unwrap()))
    }
    fn u32(&self, at: u64) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.bytes(at, 4)?.try_into().unwrap()))
    }
    fn u64(&self, at: u64) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.bytes(at, 8)?.try_into().unwrap()))
    }
}

/// Images larger than this are refused as garbage rather than read (a cubin rivet makes is
/// kilobytes; this only bounds what a corrupt header can make the double read).
const MAX_IMAGE: u64 = 1 << 30;

/// The length of the ELF image at `image`, from its headers.
///
/// # Safety
/// `image` must point at readable memory holding at least a 64-byte ELF header, and as many
/// bytes as that header's tables describe (what `cuModuleLoadData` requires of its caller).
pub unsafe fn image_len(image: *const u8) -> Result<usize, String> {
    // SAFETY: the caller promises an ELF header's worth of bytes; the magic is checked first
    // by the caller (`Module::load`), and only header fields are read before the tables.
    let head = unsafe { std::slice::from_raw_parts(image, 64) };
    let r = Reader(head);
    if &head[..4] != ELF_MAGIC {
        return Err("no ELF magic".into());
    }
    if head[4] != 2 || head[5] != 1 {
        return Err("not a little-endian ELF64 file".into());
    }
    if r.u16(18)? != EM_CUDA {
        return Err(format!(
            "an ELF file for machine {}, not a CUDA cubin (EM_CUDA, 190)",
            r.u16(18)?
        ));
    }
    let (phoff, shoff) = (r.u64(32)?, r.u64(40)?);
    let (phentsize, phnum) = (r.u16(54)? as u64, r.u16(56)? as u64);
    let (shentsize, shnum) = (r.u16(58)? as u64, r.u16(60)? as u64);
    if (shnum > 0 && shentsize < 64) || (phnum > 0 && phentsize < 56) {
        return Err("ELF header table entries too small".into());
    }
    let mut len = 64u64;
    let table_end = |off: u64, n: u64, size: u64| -> Result<u64, String> {
        off.checked_add(n * size)
            .filter(|&e| e <= MAX_IMAGE)
            .ok_or_else(|| "an ELF header table lies past any plausible image".to_string())
    };
    len = len.max(table_end(shoff, shnum, shentsize)?);
    len = len.max(table_end(phoff, phnum, phentsize)?);
    // SAFETY: the tables lie within the image (the caller's promise, the header says where).
    let tables = unsafe { std::slice::from_raw_parts(image, len as usize) };
    let r = Reader(tables);
    for i in 0..shnum {
        let sh = shoff + i * shentsize;
        if r.u32(sh + 4)? == SHT_NOBITS {
            continue;
        }
        len = len.max(table_end(r.u64(sh + 24)?, 1, r.u64(sh + 32)?)?);
    }
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        len = len.max(table_end(r.u64(ph + 8)?, 1, r.u64(ph + 32)?)?);
    }
    Ok(len as usize)
}

/// One kernel of a cubin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSym {
    pub name: String,
    /// `.nv.shared.<name>`'s size (0 when absent).
    pub static_shared: u64,
    /// `EIATTR_KPARAM_INFO`, by ordinal: each parameter's (offset, size) in the parameter
    /// bank; `None` when the cubin has no `.nv.info.<name>` to read it from.
    pub params: Option<Vec<(u32, u32)>>,
    /// `EIATTR_CBANK_PARAM_SIZE`: the parameters' total bytes.
    pub param_bytes: Option<u32>,
}

/// What the double reads from a cubin.
#[derive(Debug, Clone)]
pub struct Cubin {
    /// `sm_XY` as (X, Y).
    pub arch: (u32, u32),
    pub kernels: Vec<KernelSym>,
}

struct Section {
    name: String,
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

fn cstr(b: &[u8], at: u64) -> Result<String, String> {
    let s = b
        .get(at as usize..)
        .ok_or("a name past its string table's end")?;
    let end = s
        .iter()
        .position(|&c| c == 0)
        .ok_or("an unterminated name")?;
    Ok(String::from_utf8_lossy(&s[..end]).into_owned())
}

/// Parses a whole cubin (`image` is exactly [`image_len`] bytes).
pub fn parse(image: &[u8]) -> Result<Cubin, String> {
    let r = Reader(image);
    let abi = image[8];
    let flags = r.u32(48)?;
    let sm = if abi >= 8 {
        (flags >> 8) & 0xff
    } else {
        flags & 0xff
    };
    if sm < 10 {
        return Err(format!("no sm architecture in e_flags {flags:#x}"));
    }
    let arch = (sm / 10, sm % 10);
    let (shoff, shentsize, shnum) = (r.u64(40)?, r.u16(58)? as u64, r.u16(60)? as u64);
    let shstrndx = r.u16(62)? as u64;
    let mut raw = Vec::new();
    for i in 0..shnum {
        let sh = shoff + i * shentsize;
        raw.push((
            r.u32(sh)?,
            r.u32(sh + 4)?,
            r.u64(sh + 24)?,
            r.u64(sh + 32)?,
            r.u32(sh + 40)?,
            r.u64(sh + 56)?,
        ));
    }
    let data = |kind: u32, off: u64, size: u64| -> Result<&[u8], String> {
        if kind == SHT_NOBITS {
            Ok(&[])
        } else {
            r.bytes(off, size)
        }
    };
    let names = raw.get(shstrndx as usize).ok_or("no section name table")?;
    let names = data(names.1, names.2, names.3)?;
    let mut sections = Vec::new();
    for &(name, kind, offset, size, link, entsize) in &raw {
        sections.push(Section {
            name: cstr(names, name as u64)?,
            kind,
            offset,
            size,
            link,
            entsize,
        });
    }
    let by_name: BTreeMap<&str, &Section> = sections.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut kernels = Vec::new();
    for symtab in sections.iter().filter(|s| s.kind == SHT_SYMTAB) {
        let strtab = sections
            .get(symtab.link as usize)
            .ok_or("a symbol table without its string table")?;
        let strs = data(strtab.kind, strtab.offset, strtab.size)?;
        let syms = data(symtab.kind, symtab.offset, symtab.size)?;
        let ent = symtab.entsize.max(24) as usize;
        for sym in syms.chunks_exact(ent) {
            let info = sym[4];
            if info & 0xf != STT_FUNC || info >> 4 != STB_GLOBAL || sym[5] & STO_CUDA_ENTRY == 0 {
                continue;
            }
            let name = cstr(
                strs,
                u32::from_le_bytes(sym[..4].try_into().unwrap()) as u64,
            )?;
            let static_shared = by_name
                .get(format!(".nv.shared.{name}").as_str())
                .map_or(0, |s| s.size);
            let (mut params, mut param_bytes) = (None, None);
            if let Some(s) = by_name.get(format!(".nv.info.{name}").as_str()) {
                let (p, b) = kparams(data(s.kind, s.offset, s.size)?)?;
                params = Some(p);
                param_bytes = b;
            }
            kernels.push(KernelSym {
                name,
                static_shared,
                params,
                param_bytes,
            });
        }
    }
    Ok(Cubin { arch, kernels })
}

/// Each parameter's (offset, size) by ordinal, and the parameters' total bytes.
type KParams = (Vec<(u32, u32)>, Option<u32>);

/// The `EIATTR_KPARAM_INFO` records of a `.nv.info.<kernel>` section, by ordinal, and its
/// `EIATTR_CBANK_PARAM_SIZE`. Records: a format byte, an attribute byte, then two bytes (1:
/// unused, 2: a byte and a pad, 3: a 16-bit value, 4: a 16-bit length and that many bytes
/// after it), as sm_80 and sm_90 cubins show.
fn kparams(info: &[u8]) -> Result<KParams, String> {
    let mut at = 0usize;
    let mut params: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
    let mut total = None;
    let bad = || "a truncated .nv.info record".to_string();
    while at + 2 <= info.len() {
        let (fmt, attr) = (info[at], info[at + 1]);
        at += 2;
        match fmt {
            // No value / a byte: still padded to the 4 bytes every record takes.
            1 | 2 => at += 2,
            3 => {
                let v = info.get(at..at + 2).ok_or_else(bad)?;
                if attr == EIATTR_CBANK_PARAM_SIZE {
                    total = Some(u16::from_le_bytes(v.try_into().unwrap()) as u32);
                }
                at += 2;
            }
            4 => {
                let n =
                    u16::from_le_bytes(info.get(at..at + 2).ok_or_else(bad)?.try_into().unwrap())
                        as usize;
                let v = info.get(at + 2..at + 2 + n).ok_or_else(bad)?;
                if attr == EIATTR_KPARAM_INFO && n >= 12 {
                    let ordinal = u16::from_le_bytes(v[4..6].try_into().unwrap()) as u32;
                    let offset = u16::from_le_bytes(v[6..8].try_into().unwrap()) as u32;
                    let word = u32::from_le_bytes(v[8..12].try_into().unwrap());
                    params.insert(ordinal, (offset, (word >> 18) & 0x3fff));
                }
                at += 2 + n;
            }
            _ => return Err(format!("an .nv.info record of unknown format {fmt}")),
        }
    }
    let n = params.len() as u32;
    if params.keys().copied().ne(0..n) {
        return Err("EIATTR_KPARAM_INFO ordinals with gaps".into());
    }
    Ok((params.into_values().collect(), total))
}
