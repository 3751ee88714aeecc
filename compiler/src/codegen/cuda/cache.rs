//! The disk cache of NVRTC outputs (PTX and cubins), so a second build of the same kernel,
//! in this process or another, skips NVRTC (about 190 ms cold / 26 ms warm per call, two
//! calls per build, measured on the lent H100).
//!
//! Where: `RIVET_CACHE_DIR` (a folder; `""` or `off` disables the cache), else
//! `$XDG_CACHE_HOME/rivet`, else `~/.cache/rivet` (`dirs::cache_dir`). Entries live in its
//! `cuda/` subfolder, one file per (source, target, options, NVRTC) combination, named by the
//! SHA-256 of their key: `cuda/<hex>.ptx` / `cuda/<hex>.cubin`.
//!
//! The key is a short canonical text: the cache format, rivet's version, NVRTC's version,
//! the architecture, PTX or cubin, the full NVRTC option list (so `--fmad` and anything added
//! later are in it), the file name NVRTC was given (it appears in the log) and the SHA-256 and
//! length of the CUDA C source. Everything that can change NVRTC's output is in the key.
//!
//! Entry file (version 1), integers little-endian:
//!
//! | bytes | content |
//! | --- | --- |
//! | 8 | magic `RIVETNVC` |
//! | 4 | entry format (u32) = 1 |
//! | 4 | key length (u32) |
//! | 4 | NVRTC log length (u32) |
//! | 8 | payload length (u64) |
//! | 32 | SHA-256 of key, log and payload, in that order |
//! | ... | key text, log (UTF-8), payload (PTX text or cubin ELF) |
//!
//! Invariants:
//! - An entry is trusted only if everything checks: size within `MAX_ENTRY_BYTES` (looked at
//!   before reading), magic, format, lengths adding up to the file's size exactly, the stored
//!   key equal to the key asked for (a different one is a hash collision or a foreign file),
//!   the checksum, and the payload's kind (PTX is UTF-8 holding `.target`; a cubin is ELF).
//!   Anything else is a miss: the source is compiled again and the entry overwritten.
//! - Writes are atomic: the entry is written to a fresh temporary file in the same folder
//!   (`create_new`, a name unique per process and write), flushed, then renamed over the
//!   final name. A reader sees the old entry, the new one or none, never half of one;
//!   concurrent writers of one key write the same bytes, and the last rename wins.
//! - The cache never fails a build. A folder that cannot be created, written or read is
//!   reported once per process and folder on stderr (`rivet: warning: ...`) and the build
//!   goes on without it. Rejected entries (corrupt, foreign) are silently replaced.
//! - The checks catch accidents (a torn or bit-flipped file, another program's file, another
//!   key's entry): the cache is as trustworthy as the folder's permissions, like any
//!   compiler cache. Folders rivet creates are private to the user (mode 0700).
//! - Only regular files are read (a FIFO or a device in an entry's place is rejected, never
//!   waited on). A process killed while writing can leave a `.tmp-*` file; it is never read.
//! - Nothing is evicted: delete the folder to reclaim space.

use super::nvrtc::{Compiled, Kind, Output};
use crate::target::CudaArch;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

const MAGIC: &[u8; 8] = b"RIVETNVC";
/// The entry file format; also part of every key, so a new format never reads an old file.
pub const ENTRY_FORMAT: u32 = 1;
/// Bytes before the key: magic, format, three lengths, the checksum.
pub const HEADER_BYTES: usize = 8 + 4 + 4 + 4 + 8 + 32;
/// Largest entry file read (a cubin of the largest kernels is a few MiB): a bigger file is
/// not read at all, it is a miss.
pub const MAX_ENTRY_BYTES: u64 = 256 << 20;
const MAX_KEY_BYTES: usize = 64 << 10;
const MAX_LOG_BYTES: usize = 16 << 20;

/// What one NVRTC call is identified by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    kind: Kind,
    text: String,
    hash: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Key {
    /// The key of compiling `source` (named `file`) with `options` for `arch` to `kind`, by
    /// NVRTC `nvrtc_version`.
    pub fn new(
        source: &str,
        file: &str,
        arch: CudaArch,
        kind: Kind,
        options: &[String],
        nvrtc_version: (i32, i32),
    ) -> Key {
        let text = format!(
            "rivet-cuda-cache {ENTRY_FORMAT}\nrivet {}\nnvrtc {}.{}\narch {arch}\nkind {}\noptions {}\nfile {}\nsource {} {}\n",
            env!("CARGO_PKG_VERSION"),
            nvrtc_version.0,
            nvrtc_version.1,
            kind_name(kind),
            options.join(" "),
            file.escape_debug(),
            hex(&Sha256::digest(source.as_bytes())),
            source.len()
        );
        let hash = hex(&Sha256::digest(text.as_bytes()));
        Key { kind, text, hash }
    }

    /// The canonical text (what entries store and are compared on).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The entry's file name.
    pub fn file_name(&self) -> String {
        format!("{}.{}", self.hash, kind_name(self.kind))
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Ptx => "ptx",
        Kind::Cubin => "cubin",
    }
}

/// Where the cache is, as the environment says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// `RIVET_CACHE_DIR` is `""` or `off`.
    Off,
    /// The cache's root folder (entries go in its `cuda/`).
    Dir(PathBuf),
    /// Not set, and no user cache folder is known (no `$HOME`): no cache.
    NoHome,
}

/// Reads `RIVET_CACHE_DIR` through `env`; unset means the user's cache folder + `rivet`.
pub fn setting(env: &dyn Fn(&str) -> Option<OsString>) -> Setting {
    match env("RIVET_CACHE_DIR") {
        Some(v) if v.is_empty() || v == "off" || v == "OFF" => Setting::Off,
        Some(v) => Setting::Dir(PathBuf::from(v)),
        None => match dirs::cache_dir() {
            Some(d) => Setting::Dir(d.join("rivet")),
            None => Setting::NoHome,
        },
    }
}

/// The outcome of a lookup.
#[derive(Debug)]
pub enum Lookup {
    Hit(Compiled),
    /// No entry.
    Miss,
    /// An entry that cannot be trusted, and why (it will be overwritten).
    Rejected(String),
}

/// A cache folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskCache {
    root: PathBuf,
}

impl DiskCache {
    /// The cache rooted at `root` (entries in `root/cuda`); nothing is touched until used.
    pub fn new(root: impl Into<PathBuf>) -> DiskCache {
        DiskCache { root: root.into() }
    }

    /// The cache the environment asks for, or `None` when it is off.
    pub fn from_env() -> Option<DiskCache> {
        match setting(&|k| std::env::var_os(k)) {
            Setting::Dir(d) => Some(DiskCache::new(d)),
            Setting::Off | Setting::NoHome => None,
        }
    }

    /// The folder holding the entries.
    pub fn dir(&self) -> PathBuf {
        self.root.join("cuda")
    }

    /// The file of `key`'s entry.
    pub fn entry_path(&self, key: &Key) -> PathBuf {
        self.dir().join(key.file_name())
    }

    /// The entry of `key`, if there is one and every check passes.
    pub fn get(&self, key: &Key) -> Lookup {
        let path = self.entry_path(key);
        // Only regular files are opened: a FIFO or device under the entry's name would block
        // or never end. O_NONBLOCK covers one swapped in after this check (no effect on a
        // regular file).
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Lookup::Rejected(format!("{} is not a file", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Rejected(format!("cannot stat {}: {e}", path.display())),
        }
        let mut open = std::fs::OpenOptions::new();
        open.read(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            open.custom_flags(libc::O_NONBLOCK);
        }
        let mut file = match open.open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Rejected(format!("cannot open {}: {e}", path.display())),
        };
        let size = match file.metadata() {
            Ok(m) if m.is_file() => m.len(),
            Ok(_) => return Lookup::Rejected(format!("{} is not a file", path.display())),
            Err(e) => return Lookup::Rejected(format!("cannot stat {}: {e}", path.display())),
        };
        if size > MAX_ENTRY_BYTES {
            return Lookup::Rejected(format!(
                "{size} bytes, over the entry limit of {MAX_ENTRY_BYTES}"
            ));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        // At most one byte past the limit: the file may grow after the size check.
        if let Err(e) = Read::by_ref(&mut file)
            .take(MAX_ENTRY_BYTES + 1)
            .read_to_end(&mut bytes)
        {
            return Lookup::Rejected(format!("cannot read {}: {e}", path.display()));
        }
        match decode(&bytes, key) {
            Ok(c) => Lookup::Hit(c),
            Err(why) => Lookup::Rejected(why),
        }
    }

    /// Stores `c` as `key`'s entry (atomically). `Err` says why it could not be written.
    pub fn put(&self, key: &Key, c: &Compiled) -> Result<(), String> {
        let bytes = encode(key, c)?;
        let dir = self.dir();
        create_private_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let tmp = dir.join(format!(
            ".tmp-{}-{}-{}",
            key.file_name(),
            std::process::id(),
            WRITES.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(&bytes)?;
            // On disk before the rename publishes it: a crash leaves the old entry or this
            // one, never a torn file under the entry's name.
            f.sync_data()?;
            drop(f);
            std::fs::rename(&tmp, self.entry_path(key))
        })();
        written.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot write into {}: {e}", dir.display())
        })
    }
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

fn checksum(key: &[u8], log: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(key);
    h.update(log);
    h.update(payload);
    h.finalize().into()
}

/// The entry file of `c` under `key`.
pub fn encode(key: &Key, c: &Compiled) -> Result<Vec<u8>, String> {
    let payload: &[u8] = match (&c.output, key.kind) {
        (Output::Ptx(t), Kind::Ptx) => t.as_bytes(),
        (Output::Cubin(b), Kind::Cubin) => b,
        _ => return Err("the output's kind is not the key's".into()),
    };
    let (k, log) = (key.text.as_bytes(), c.log.as_bytes());
    if k.len() > MAX_KEY_BYTES || log.len() > MAX_LOG_BYTES {
        return Err("key or log too large for an entry".into());
    }
    let total = HEADER_BYTES + k.len() + log.len() + payload.len();
    if total as u64 > MAX_ENTRY_BYTES {
        return Err(format!(
            "an entry of {total} bytes is over the limit of {MAX_ENTRY_BYTES}"
        ));
    }
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&ENTRY_FORMAT.to_le_bytes());
    out.extend_from_slice(&(k.len() as u32).to_le_bytes());
    out.extend_from_slice(&(log.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(k, log, payload));
    out.extend_from_slice(k);
    out.extend_from_slice(log);
    out.extend_from_slice(payload);
    Ok(out)
}

/// Checks an entry file against `key` and returns what it holds; `Err` says what is wrong.
pub fn decode(bytes: &[u8], key: &Key) -> Result<Compiled, String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!(
            "truncated: {} bytes, an entry has at least {HEADER_BYTES}",
            bytes.len()
        ));
    }
    if &bytes[..8] != MAGIC {
        return Err("not a rivet cache entry (wrong magic bytes)".into());
    }
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let format = u32_at(8);
    if format != ENTRY_FORMAT {
        return Err(format!(
            "entry format {format}, this rivet reads {ENTRY_FORMAT}"
        ));
    }
    let (klen, llen) = (u32_at(12) as u64, u32_at(16) as u64);
    let plen = u64::from_le_bytes(bytes[20..28].try_into().expect("8 bytes"));
    let sum: [u8; 32] = bytes[28..60].try_into().expect("32 bytes");
    // u64 sums of a u32, a u32 and a u64 bounded by the comparison: checked, never wrapping.
    let expected = (HEADER_BYTES as u64)
        .checked_add(klen)
        .and_then(|n| n.checked_add(llen))
        .and_then(|n| n.checked_add(plen));
    if expected != Some(bytes.len() as u64) {
        return Err(format!(
            "truncated or padded: {} bytes, the header describes {}",
            bytes.len(),
            expected.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string())
        ));
    }
    let (klen, llen) = (klen as usize, llen as usize);
    let body = &bytes[HEADER_BYTES..];
    let (k, rest) = body.split_at(klen);
    let (log, payload) = rest.split_at(llen);
    if k != key.text.as_bytes() {
        return Err("the entry is for another key (hash collision or foreign file)".into());
    }
    if checksum(k, log, payload) != sum {
        return Err("checksum mismatch: the entry is corrupt".into());
    }
    let log = std::str::from_utf8(log)
        .map_err(|_| "the log is not UTF-8".to_string())?
        .to_string();
    let output = match key.kind {
        Kind::Ptx => {
            let t =
                std::str::from_utf8(payload).map_err(|_| "PTX that is not UTF-8".to_string())?;
            if !t.contains(".target") {
                return Err("PTX without a .target line".into());
            }
            Output::Ptx(t.to_string())
        }
        Kind::Cubin => {
            if !payload.starts_with(b"\x7fELF") {
                return Err("a cubin that is not an ELF file".into());
            }
            Output::Cubin(payload.to_vec())
        }
    };
    Ok(Compiled { output, log })
}

/// Reports, once per process and folder, that the cache cannot be used.
fn warn_once(dir: &Path, why: &str) {
    static WARNED: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let mut w = WARNED
        .get_or_init(|| Mutex::new(HashSet::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if w.insert(dir.to_path_buf()) {
        eprintln!(
            "rivet: warning: the CUDA binary cache is not usable ({why}); compiling without it. Set RIVET_CACHE_DIR to a writable folder, or to 'off' to silence this."
        );
    }
}

/// `compile()` through `cache`: a valid entry is returned without calling it; otherwise it
/// runs, and its success is stored (a failure to store is reported once, never an error).
/// Failed compilations are not cached.
pub fn compile_cached<E>(
    cache: Option<&DiskCache>,
    key: &Key,
    compile: impl FnOnce() -> Result<Compiled, E>,
) -> Result<Compiled, E> {
    let Some(cache) = cache else {
        return compile();
    };
    match cache.get(key) {
        Lookup::Hit(c) => return Ok(c),
        Lookup::Miss => {}
        // Overwritten below; a file that cannot even be opened is a folder problem.
        Lookup::Rejected(why) if why.starts_with("cannot ") => warn_once(&cache.dir(), &why),
        Lookup::Rejected(_) => {}
    }
    let c = compile()?;
    if let Err(why) = cache.put(key, &c) {
        warn_once(&cache.dir(), &why);
    }
    Ok(c)
}
