//! A module's saved form: `Module::save(path)` writes it; `Module::load(path)` (the pipeline,
//! `build.rs`) reads it here and hands each function's checked loop nest to the pipeline's
//! `compile_loaded`, so this file knows the format, never how to compile.
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
//! The IR stored is each function's loop nest *before* the bounds proof, with its target
//! (`"cpu"`, `"cuda -arch=sm_90"`, ...: `Target`'s canonical spelling, parsed again and
//! refused when unknown). CUDA functions are saved the same way: their IR, not their PTX or
//! cubin; at load they are proven and compiled again, and NVRTC's outputs come from the
//! checked disk cache (`codegen/cuda/cache.rs`) when this machine compiled them before. A
//! nest holds no outlined kernels or launches (the host/device split runs at load), so a
//! file carrying them is refused. Loading trusts
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
//! later pass's — is a `CompileError` "cannot load rivet module `<path>`: ...", never an
//! internal error: the file is at fault, not rivet.

use super::{Compiled, Module};
use crate::error::{Error, Result};
use crate::ir::limits::{COMPILE_STACK, MAX_IR_DEPTH, MAX_MODULE_BYTES, MAX_STMT_DEPTH};
use crate::ir::stmt::PrimFunc;
use crate::target::Target;
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
    /// The module as a file's bytes. A host callback given as a function object (not by a
    /// registered name) cannot be saved: another process could not find it again.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        for c in &self.funcs {
            if let Some(cb) = c.nest.callbacks.iter().find(|cb| cb.registered.is_none()) {
                return Err(Error::Compile(format!(
                    "cannot save function '{}': the host callback of stage '{}' was given as a function object; a saved module finds its callbacks by registered name when it is loaded: register the function (rivet.register_func(name, f)) and pass its name",
                    c.nest.name, cb.stage
                )));
            }
        }
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
}

/// How a loaded function's loop nest is compiled: the pipeline's `build::compile_loaded`
/// (passed in, so that the pipeline depends on the artefact and not the other way round).
pub(crate) type Compile = fn(PrimFunc, &Target) -> Result<Compiled>;

/// Parses and re-compiles a module; `origin` names the source in errors. Runs on a
/// thread with a `COMPILE_STACK` stack (see the module documentation).
pub(crate) fn from_bytes(bytes: &[u8], origin: &str, compile: Compile) -> Result<Module> {
    std::thread::scope(|sc| {
        std::thread::Builder::new()
            .name("rivet-load".into())
            .stack_size(COMPILE_STACK)
            .spawn_scoped(sc, || from_bytes_here(bytes, origin, compile))
            .map_err(|e| bad(origin, format!("cannot start the loading thread: {e}")))?
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

fn from_bytes_here(bytes: &[u8], origin: &str, compile: Compile) -> Result<Module> {
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
        return Err(bad(
            origin,
            format!(
                "the file is truncated or has trailing data (payload {} bytes, header says {len})",
                payload.len()
            ),
        ));
    }
    if crc32fast::hash(payload) != crc {
        return Err(bad(origin, "checksum mismatch: the file is corrupt".into()));
    }
    let p = parse_payload(payload).map_err(|e| bad(origin, format!("malformed payload: {e}")))?;
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
        // A loop nest is saved before the host/device split: outlined bodies in the file
        // would reach the backend without passing the bounds proof (which reads the body),
        // so a file that carries them is refused, whatever they hold.
        let mut launches = 0usize;
        f.ir.body.visit(&mut |s| {
            if matches!(s, crate::ir::Stmt::Launch { .. }) {
                launches += 1;
            }
        });
        if !f.ir.kernels.is_empty() || launches > 0 {
            return Err(bad(
                origin,
                format!(
                    "invalid IR in function '{}': a saved loop nest has no outlined kernels or launches (the file has {} kernels and {launches} launches; they are made again at load)",
                    f.ir.name,
                    f.ir.kernels.len()
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
        let target =
            Target::parse(&f.target).map_err(|e| bad(origin, format!("function '{name}': {e}")))?;
        // Host callbacks are found by their registered names in this process.
        let mut ir = f.ir;
        for cb in &mut ir.callbacks {
            cb.resolve()
                .map_err(|m| bad(origin, format!("function '{name}': {m}")))?;
        }
        let c = compile(ir, &target).map_err(blame)?;
        funcs.push(Arc::new(c));
    }
    Ok(Module { funcs })
}

/// Reads the file at `path` (its size checked first) and loads it as `from_bytes` does.
pub(crate) fn load(path: &Path, compile: Compile) -> Result<Module> {
    use std::io::Read;
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
    from_bytes(&bytes, &origin, compile)
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

#[cfg(test)]
mod tests {
    //! Saved modules holding CUDA functions: the round trip (same IR, CUDA C and PTX after
    //! load; calling without a GPU is a `DeviceError`), and hostile files (a crafted
    //! architecture, IR the verifier or the bounds proof refuses, pre-outlined kernels).
    use super::*;
    use crate::ir::stmt::ThreadTag;
    use crate::ir::Expr;
    use crate::te::{compute, placeholder};
    use rivet_runtime::DType;

    /// `C[i] = A[i] * 2` split by 128 and bound to blocks and threads, built for `target`.
    fn bound_double(target: &str) -> Module {
        let n = crate::te::var("n");
        let a = placeholder([&n], DType::F32, "A").unwrap();
        let c = compute([&n], |[i]| a.at([i]) * 2.0, "C").unwrap();
        let mut s = crate::Schedule::new(&[c.clone()]).unwrap();
        let i = c.axis()[0].var.clone();
        let st = s.stage(&c).unwrap();
        let (bx, tx) = st.split(&i, Some(Expr::int(128)), None).unwrap();
        st.bind(&bx, ThreadTag::BlockX).unwrap();
        st.bind(&tx, ThreadTag::ThreadX).unwrap();
        crate::build::build(&s, &[a, c], target, "dbl").unwrap()
    }

    /// The kernel library's matmul with its GPU schedule (the 16 x 16 thread tiles).
    fn library_matmul(target: &str) -> Module {
        let def = crate::kernels::defs::matmul(DType::F32).unwrap();
        let s = crate::kernels::strategy::schedule(&def, crate::kernels::Strategy::Gpu).unwrap();
        crate::build::build(&s, &def.args, target, def.name).unwrap()
    }

    fn nvrtc_present() -> bool {
        crate::codegen::cuda::nvrtc::find().is_ok()
    }

    fn assert_same_module(a: &Module, b: &Module) {
        assert_eq!(a.function_names(), b.function_names());
        for (x, y) in a.funcs.iter().zip(&b.funcs) {
            assert_eq!(x.target, y.target);
        }
        for kind in ["ir", "nest", "cuda"] {
            assert_eq!(
                a.get_source(kind).unwrap(),
                b.get_source(kind).unwrap(),
                "{kind}"
            );
        }
        if nvrtc_present() {
            assert_eq!(a.get_source("ptx").unwrap(), b.get_source("ptx").unwrap());
        }
    }

    #[test]
    fn cuda_modules_save_and_load_with_their_target() {
        let dir = std::env::temp_dir().join(format!("rivet-modfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (m, target) in [
            (bound_double("cuda -arch=sm_90"), "cuda -arch=sm_90"),
            (bound_double("cuda"), "cuda"),
            (library_matmul("cuda -arch=sm_80"), "cuda -arch=sm_80"),
        ] {
            let path = dir.join("m.rivet");
            m.save(&path).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let text = String::from_utf8_lossy(&bytes[HEADER..]).into_owned();
            assert!(text.contains(&format!(r#""target":"{target}""#)), "{text}");
            let loaded = Module::load(&path).unwrap();
            assert_same_module(&m, &loaded);
            if nvrtc_present() {
                let ptx = loaded.get_source("ptx").unwrap();
                let arch = target.strip_prefix("cuda -arch=").unwrap_or("sm_80");
                assert!(ptx.contains(&format!(".target {arch}")), "{ptx}");
            }
            // Saved again, the file is the same bytes: nothing was lost or added.
            assert_eq!(loaded.to_bytes().unwrap(), bytes);
            // No GPU here (and CPU tensors anyway): a DeviceError, never a crash.
            let name = &loaded.function_names()[0];
            let f = loaded.get_function(name).unwrap();
            let sig_len = f.signature().map(|s| s.params.len()).unwrap_or(2);
            let args: Vec<rivet_runtime::Value> = (0..sig_len)
                .map(|_| {
                    rivet_runtime::Value::Tensor(
                        rivet_runtime::Tensor::zeros(
                            &[4, 4][..if sig_len == 3 { 2 } else { 1 }],
                            DType::F32,
                        )
                        .unwrap(),
                    )
                })
                .collect();
            let e = f.call(&args).unwrap_err();
            assert!(matches!(e, rivet_runtime::Error::Device(_)), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The module's file with `edit` applied to its JSON payload, re-framed with a valid
    /// checksum (what a hand-crafted file looks like).
    fn crafted(m: &Module, edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        let bytes = m.to_bytes().unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&bytes[HEADER..]).unwrap();
        edit(&mut v);
        let json = serde_json::to_vec(&v).unwrap();
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&json).to_le_bytes());
        out.extend_from_slice(&json);
        out
    }

    fn refused(bytes: &[u8], what: &[&str]) {
        let e = Module::from_bytes(bytes, "crafted.rivet")
            .err()
            .unwrap_or_else(|| panic!("accepted a file that should be refused for {what:?}"));
        let msg = e.to_string();
        assert!(matches!(e, Error::Compile(_)), "{msg}");
        assert!(
            msg.contains("cannot load rivet module crafted.rivet"),
            "{msg}"
        );
        for w in what {
            assert!(msg.contains(w), "expected {w:?} in: {msg}");
        }
    }

    /// The first JSON object holding `key` (depth first), mutably.
    fn find<'a>(v: &'a mut serde_json::Value, key: &str) -> Option<&'a mut serde_json::Value> {
        if v.get(key).is_some() {
            return Some(v);
        }
        match v {
            serde_json::Value::Object(m) => m.values_mut().find_map(|x| find(x, key)),
            serde_json::Value::Array(a) => a.iter_mut().find_map(|x| find(x, key)),
            _ => None,
        }
    }

    #[test]
    fn crafted_cuda_targets_are_compile_errors() {
        let m = bound_double("cuda -arch=sm_90");
        for (target, why) in [
            ("cuda -arch=sm_9999999999", "sm_9999999999"),
            ("cuda -arch=sm_70", "sm_80 and newer"),
            ("cuda -arch=compute_", "compute_"),
            ("cuda -arch=sm_90; rm -rf /", "got 'sm_90;'"),
            ("cuda -O3", "unknown option '-O3'"),
            ("cuda\u{0}", "unknown target"),
            ("gpu", "unknown target 'gpu'"),
            ("", "unknown target"),
        ] {
            let f = crafted(&m, |v| v["functions"][0]["target"] = target.into());
            refused(&f, &["function 'dbl'", why]);
        }
        // A target that is not a string at all.
        let f = crafted(&m, |v| v["functions"][0]["target"] = 90.into());
        refused(&f, &["malformed payload"]);
    }

    #[test]
    fn cuda_functions_whose_ir_fails_verification_are_refused() {
        let m = bound_double("cuda -arch=sm_90");
        // 4096 threads per block: over CUDA's 1024 (the GPU verifier).
        let f = crafted(&m, |v| {
            let inner = find(&mut v["functions"][0]["ir"]["body"]["For"]["body"], "For").unwrap();
            inner["For"]["extent"]["kind"]["Const"]["Int"] = 4096.into();
        });
        refused(&f, &["invalid IR in function 'dbl'", "1024"]);
        // A thread loop that does not start at 0.
        let f = crafted(&m, |v| {
            let inner = find(&mut v["functions"][0]["ir"]["body"]["For"]["body"], "For").unwrap();
            inner["For"]["min"]["kind"]["Const"]["Int"] = 1.into();
        });
        refused(&f, &["function 'dbl'", "start at 0"]);
        // The block loop (extent n / 128) retagged as threadIdx.x: threadIdx.x twice, and a
        // thread loop without a constant extent.
        let f = crafted(&m, |v| {
            v["functions"][0]["ir"]["body"]["For"]["kind"] =
                serde_json::json!({"Thread": "ThreadX"});
        });
        refused(&f, &["function 'dbl'", "threadIdx.x", "constant extent"]);
        // A store one element past the guard: the bounds proof, run again at load, cannot
        // prove it for a symbolic n, so the loaded function carries a per-call check that
        // stops every call before the launch (a ShapeError where the original, with the
        // same arguments, reaches the device and says there is none).
        let f = crafted(&m, |v| {
            let store = find(&mut v["functions"][0]["ir"]["body"], "Store").unwrap();
            store["Store"]["indices"][0]["kind"]["Binary"][1]["kind"]["Const"]["Int"] = 1.into();
        });
        let loaded = Module::from_bytes(&f, "crafted.rivet").unwrap();
        assert!(m.funcs[0].func.checks.is_empty());
        assert!(!loaded.funcs[0].func.checks.is_empty());
        let args = || {
            vec![
                rivet_runtime::Value::Tensor(
                    rivet_runtime::Tensor::zeros(&[7], DType::F32).unwrap(),
                ),
                rivet_runtime::Value::Tensor(
                    rivet_runtime::Tensor::zeros(&[7], DType::F32).unwrap(),
                ),
            ]
        };
        let e = loaded
            .get_function("dbl")
            .unwrap()
            .call(&args())
            .unwrap_err();
        // CPU tensors: the one-device rule of CUDA functions answers first (before the
        // per-call checks); either way nothing is launched.
        assert!(
            matches!(e, rivet_runtime::Error::Device(_))
                || (matches!(e, rivet_runtime::Error::Shape(_))
                    && e.to_string().contains("out-of-bounds")),
            "{e}"
        );
        let e = m.get_function("dbl").unwrap().call(&args()).unwrap_err();
        assert!(matches!(e, rivet_runtime::Error::Device(_)), "{e}");
        // A variable whose id is a string: the parser.
        let f = crafted(&m, |v| {
            v["functions"][0]["ir"]["dims"][0]["id"] = "one".into()
        });
        refused(&f, &["malformed payload"]);
    }

    #[test]
    fn saved_nests_with_outlined_kernels_are_refused() {
        // The split function (kernels outlined, a launch in the body) saved in place of the
        // nest: its kernels never went through the proof, so they are not accepted.
        let m = bound_double("cuda -arch=sm_90");
        let split = serde_json::to_value(&m.funcs[0].func).unwrap();
        let f = crafted(&m, |v| v["functions"][0]["ir"] = split);
        refused(&f, &["outlined kernels or launches"]);
        let f = crafted(&m, |v| {
            v["functions"][0]["ir"]["kernels"] = serde_json::json!([]);
            v["functions"][0]["ir"]["body"] = serde_json::json!({"Launch": {"kernel": 0}});
        });
        refused(&f, &["outlined kernels or launches"]);
    }
}
