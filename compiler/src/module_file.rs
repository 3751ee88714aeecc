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

use crate::build::{compile, Module};
use crate::error::{Error, Result};
use crate::ir::stmt::PrimFunc;
use crate::ir::verify::verify;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"RIVETMOD";
pub const FORMAT_VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 8 + 4;

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
                    target: c.target.clone(),
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

    /// Parses and re-compiles a module; `origin` names the source in errors.
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Module> {
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
        let p: Payload = serde_json::from_slice(payload)
            .map_err(|e| bad(origin, format!("malformed payload: {e}")))?;
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
            crate::ir::Var::reserve(max_id);
            verify(&f.ir, false).map_err(|e| {
                bad(
                    origin,
                    format!("invalid IR in function '{}': {e}", f.ir.name),
                )
            })?;
            let c = compile(f.ir, &f.target).map_err(|e| match e {
                Error::Internal(m) => bad(origin, m),
                other => other,
            })?;
            funcs.push(Arc::new(c));
        }
        Ok(Module { funcs })
    }

    pub fn load(path: impl AsRef<Path>) -> Result<Module> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| bad(&path.display().to_string(), e.to_string()))?;
        Module::from_bytes(&bytes, &path.display().to_string())
    }
}
