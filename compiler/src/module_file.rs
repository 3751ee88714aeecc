//! Saved modules: `Module::save(path)` / `Module::load(path)`.
//!
//! File format (version 1), all integers little-endian:
//!
//! | bytes | content |
//! | --- | --- |
//! | 8 | magic `RIVETMOD` |
//! | 4 | format version (u32) = 1 |
//! | 8 | payload length in bytes (u64) |
//! | 4 | CRC-32 (IEEE) of the payload (u32) |
//! | n | payload: JSON `{"rivet": version, "functions": [{"target": .., "ir": PrimFunc}]}` |
//!
//! The IR stored is each function's loop nest *before* the bounds proof. Loading trusts
//! nothing in the file: it checks the header, length and checksum, parses, runs the verifier
//! (a failure is a `CompileError` naming the file, not an internal error), then the rest of
//! the lowering pipeline — the bounds proof included — and JIT-compiles again. So a truncated,
//! bit-flipped, foreign or hand-crafted file gives an error, never a crash or a kernel that
//! could touch memory outside its tensors.
//!
//! Resources: a file over `limits::MAX_MODULE_BYTES` is refused before it is read (its size
//! is checked first). JSON nesting is measured by a linear scan before parsing and refused
//! past `MAX_JSON_DEPTH` (derived from the IR limits, so every function `build` accepts is
//! loadable); files nested deeper than serde_json's own recursion limit (128) are parsed by
//! an iterative tokenizer into a `serde_json::Value`, then decoded. Parsing, verifying and
//! compiling run on one thread with a `limits::COMPILE_STACK` stack, so recursion on depth
//! stays far from its end. Every error about the file's content — the verifier's, and any
//! later pass's — is a `CompileError` "cannot load rivet module <path>: ...", never an
//! internal error: the file is at fault, not rivet.

use crate::build::{compile_loaded, Module};
use crate::error::{Error, Result};
use crate::ir::limits::{COMPILE_STACK, MAX_IR_DEPTH, MAX_MODULE_BYTES, MAX_STMT_DEPTH};
use crate::ir::stmt::PrimFunc;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"RIVETMOD";
pub const FORMAT_VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 8 + 4;

/// Deepest JSON nesting a module may have. An expression level costs at most 4 levels of
/// JSON (node object, variant object, variant payload, index array), a statement level 2,
/// and the payload's frame a handful: so every function within the IR limits fits.
pub const MAX_JSON_DEPTH: usize = 4 * MAX_IR_DEPTH as usize + 2 * MAX_STMT_DEPTH as usize + 64;

/// serde_json refuses nesting past 128 levels; shallower payloads take its direct path.
const SERDE_DEPTH: usize = 120;

/// Largest variable id a file may use (fresh ids are allocated above it, so it must leave
/// room).
const MAX_VAR_ID: u32 = u32::MAX / 2;

#[derive(Serialize, Deserialize)]
struct SavedFunction {
    target: String,
    ir: PrimFunc,
}

#[derive(Serialize, Deserialize)]
struct Payload {
    rivet: String,
    functions: Vec<SavedFunction>,
}

fn bad(origin: &str, why: String) -> Error {
    Error::Compile(format!("cannot load rivet module {origin}: {why}"))
}

impl Module {
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let payload = Payload {
            rivet: env!("CARGO_PKG_VERSION").to_string(),
            functions: self
                .funcs
                .iter()
                .map(|c| SavedFunction {
                    target: c.target.to_string(),
                    ir: c.nest.clone(),
                })
                .collect(),
        };
        let json = serde_json::to_vec(&payload)
            .map_err(|e| Error::Internal(format!("serialising a module: {e}")))?;
        let mut out = Vec::with_capacity(HEADER + json.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&json).to_le_bytes());
        out.extend_from_slice(&json);
        Ok(out)
    }

    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_bytes()?;
        // Write then rename, so a reader never sees a half-written file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &bytes)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| Error::Compile(format!("cannot save module to {}: {e}", path.display())))
    }

    /// Parses and re-compiles a module; `origin` names the source in errors. Runs on a
    /// thread with a `COMPILE_STACK` stack (see the module documentation).
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Module> {
        std::thread::scope(|sc| {
            std::thread::Builder::new()
                .name("rivet-load".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(sc, || Module::from_bytes_here(bytes, origin))
                .map_err(|e| bad(origin, format!("cannot start the loading thread: {e}")))?
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    fn from_bytes_here(bytes: &[u8], origin: &str) -> Result<Module> {
        if bytes.len() > MAX_MODULE_BYTES + HEADER {
            return Err(too_large(origin, bytes.len() as u64));
        }
        if bytes.len() < HEADER {
            return Err(bad(
                origin,
                format!(
                    "the file is truncated ({} bytes, a module has at least {HEADER})",
                    bytes.len()
                ),
            ));
        }
        if &bytes[..8] != MAGIC {
            return Err(bad(origin, "not a rivet module (wrong magic bytes)".into()));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != FORMAT_VERSION {
            return Err(bad(
                origin,
                format!("format version {version}; this rivet reads version {FORMAT_VERSION}"),
            ));
        }
        let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes"));
        let payload = &bytes[HEADER..];
        if payload.len() as u64 != len {
            return Err(bad(origin, format!("the file is truncated or has trailing data (payload {} bytes, header says {len})", payload.len())));
        }
        if crc32fast::hash(payload) != crc {
            return Err(bad(origin, "checksum mismatch: the file is corrupt".into()));
        }
        let p =
            parse_payload(payload).map_err(|e| bad(origin, format!("malformed payload: {e}")))?;
        let mut funcs = Vec::new();
        for f in p.functions {
            let mut max_id = 0;
            let mut note = |v: &crate::ir::Var| max_id = max_id.max(v.id);
            f.ir.dims.iter().for_each(&mut note);
            f.ir.buffers
                .iter()
                .flat_map(|b| &b.strides)
                .for_each(&mut note);
            f.ir.body.visit(&mut |s| match s {
                crate::ir::Stmt::For { var, .. } | crate::ir::Stmt::Let { var, .. } => note(var),
                _ => {}
            });
            if max_id > MAX_VAR_ID {
                return Err(bad(
                    origin,
                    format!(
                        "invalid IR in function '{}': variable id {max_id} is above {MAX_VAR_ID}",
                        f.ir.name
                    ),
                ));
            }
            crate::ir::Var::reserve(max_id);
            let name = f.ir.name.clone();
            // Verifier and pass errors are about the file's content: its fault, not rivet's.
            let blame = |e: Error| match e {
                Error::Internal(m) => bad(origin, format!("invalid IR in function '{name}': {m}")),
                Error::Compile(m) => bad(origin, format!("function '{name}': {m}")),
                other => other,
            };
            let target = crate::target::Target::parse(&f.target)
                .map_err(|e| bad(origin, format!("function '{name}': {e}")))?;
            let c = compile_loaded(f.ir, &target).map_err(blame)?;
            funcs.push(Arc::new(c));
        }
        Ok(Module { funcs })
    }

    pub fn load(path: impl AsRef<Path>) -> Result<Module> {
        use std::io::Read;
        let path = path.as_ref();
        let origin = path.display().to_string();
        let mut file = std::fs::File::open(path).map_err(|e| bad(&origin, e.to_string()))?;
        let size = file
            .metadata()
            .map_err(|e| bad(&origin, e.to_string()))?
            .len();
        let limit = (MAX_MODULE_BYTES + HEADER) as u64;
        if size > limit {
            return Err(too_large(&origin, size));
        }
        // Read at most one byte past the limit: the file may grow after the size check.
        let mut bytes = Vec::with_capacity(size as usize);
        file.by_ref()
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| bad(&origin, e.to_string()))?;
        Module::from_bytes(&bytes, &origin)
    }
}

fn too_large(origin: &str, size: u64) -> Error {
    bad(
        origin,
        format!("the file is {size} bytes; rivet loads modules of at most {MAX_MODULE_BYTES} bytes of payload (limit MAX_MODULE_BYTES)"),
    )
}

/// The deepest nesting of `[`/`{` outside strings: one linear pass, no allocation.
fn json_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let (mut in_str, mut esc) = (false, false);
    for &c in bytes {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// The payload, within `MAX_JSON_DEPTH`.
fn parse_payload(json: &[u8]) -> std::result::Result<Payload, String> {
    let depth = json_depth(json);
    if depth > MAX_JSON_DEPTH {
        return Err(format!(
            "JSON nested {depth} deep; a module is at most {MAX_JSON_DEPTH} (from the IR limits MAX_IR_DEPTH and MAX_STMT_DEPTH)"
        ));
    }
    if depth <= SERDE_DEPTH {
        return serde_json::from_slice(json).map_err(|e| e.to_string());
    }
    let value = deep_json::parse(json)?;
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// An iterative JSON parser for payloads nested past serde_json's recursion limit: the
/// structure is tracked on an explicit stack, each scalar (string, number, literal) is
/// decoded by serde_json itself, so both paths read scalars identically.
mod deep_json {
    use serde_json::{Map, Value};

    enum Open {
        Array(Vec<Value>),
        Object(Map<String, Value>, Option<String>),
    }

    fn skip_ws(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    }

    /// The end (exclusive) of the string token starting at `i` (a quote).
    fn string_end(b: &[u8], mut i: usize) -> Result<usize, String> {
        i += 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'"' => return Ok(i + 1),
                _ => i += 1,
            }
        }
        Err("unterminated string".into())
    }

    fn scalar_end(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && !matches!(b[i], b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    }

    pub fn parse(b: &[u8]) -> Result<Value, String> {
        let mut stack: Vec<Open> = Vec::new();
        let mut i = skip_ws(b, 0);
        let err = |what: &str, at: usize| format!("{what} at byte {at}");
        loop {
            // Expect a value (or the end of an empty container).
            i = skip_ws(b, i);
            if i >= b.len() {
                return Err(err("unexpected end of input", i));
            }
            let mut value = match b[i] {
                b'[' => {
                    i = skip_ws(b, i + 1);
                    if b.get(i) == Some(&b']') {
                        i += 1;
                        Value::Array(vec![])
                    } else {
                        stack.push(Open::Array(Vec::new()));
                        continue;
                    }
                }
                b'{' => {
                    i = skip_ws(b, i + 1);
                    if b.get(i) == Some(&b'}') {
                        i += 1;
                        Value::Object(Map::new())
                    } else {
                        let end = if b.get(i) == Some(&b'"') {
                            string_end(b, i)?
                        } else {
                            return Err(err("expected a key", i));
                        };
                        let key: String = serde_json::from_slice(&b[i..end])
                            .map_err(|e| err(&e.to_string(), i))?;
                        i = skip_ws(b, end);
                        if b.get(i) != Some(&b':') {
                            return Err(err("expected ':'", i));
                        }
                        i += 1;
                        stack.push(Open::Object(Map::new(), Some(key)));
                        continue;
                    }
                }
                b'"' => {
                    let end = string_end(b, i)?;
                    let v =
                        serde_json::from_slice(&b[i..end]).map_err(|e| err(&e.to_string(), i))?;
                    i = end;
                    v
                }
                _ => {
                    let end = scalar_end(b, i);
                    let v =
                        serde_json::from_slice(&b[i..end]).map_err(|e| err(&e.to_string(), i))?;
                    i = end;
                    v
                }
            };
            // Attach the value; close containers as long as they end here.
            loop {
                let Some(top) = stack.last_mut() else {
                    i = skip_ws(b, i);
                    if i != b.len() {
                        return Err(err("trailing characters", i));
                    }
                    return Ok(value);
                };
                match top {
                    Open::Array(items) => items.push(value),
                    Open::Object(map, key) => {
                        map.insert(key.take().expect("a key is pending"), value);
                    }
                }
                i = skip_ws(b, i);
                match (b.get(i), &mut *top) {
                    (Some(b','), Open::Array(_)) => {
                        i += 1;
                        break;
                    }
                    (Some(b','), Open::Object(_, key)) => {
                        i = skip_ws(b, i + 1);
                        if b.get(i) != Some(&b'"') {
                            return Err(err("expected a key", i));
                        }
                        let end = string_end(b, i)?;
                        *key = Some(
                            serde_json::from_slice(&b[i..end])
                                .map_err(|e| err(&e.to_string(), i))?,
                        );
                        i = skip_ws(b, end);
                        if b.get(i) != Some(&b':') {
                            return Err(err("expected ':'", i));
                        }
                        i += 1;
                        break;
                    }
                    (Some(b']'), Open::Array(_)) | (Some(b'}'), Open::Object(..)) => {
                        i += 1;
                        value = match stack.pop().expect("non-empty") {
                            Open::Array(items) => Value::Array(items),
                            Open::Object(map, _) => Value::Object(map),
                        };
                    }
                    _ => return Err(err("expected ',' or a closing bracket", i)),
                }
            }
        }
    }
}
