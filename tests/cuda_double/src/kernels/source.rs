//! Finding a cubin's CUDA C source, and what the double needs to know about it.
//!
//! rivet writes the source of every cubin it hands to the driver to
//! `$RIVET_CUBIN_SOURCES/<lowercase hex SHA-256 of the cubin>.cu`; the double maps an image
//! back to its source through that name and nothing else, so a cubin rivet did not record is
//! refused rather than guessed at.
//!
//! The source is read as text, not parsed as C++: comments, string and character literals and
//! preprocessor lines are blanked (same length, so offsets stay valid) and top-level brace
//! blocks are matched. That is enough for what the double asks of it:
//! - whether each kernel is a `__global__` function defined in the source;
//! - whether a kernel may synchronise its threads (`__syncthreads`, a warp shuffle, any
//!   `__*_sync` intrinsic), directly or through a function or macro that does: such kernels
//!   need one OS thread per CUDA thread; the others run a block's threads one after another
//!   on one thread. The answer errs towards "may" (a wrong "may" is only slower; a wrong
//!   "may not" is caught by the emulation, which fails the launch when a kernel run serially
//!   reaches a barrier);
//! - `extern __shared__` declarations (dynamic shared memory), rewritten into pointers at the
//!   launch's buffer, since a host compiler has no such storage class.

use crate::error::{Refusal, CUDA_ERROR_INVALID_IMAGE};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

pub const SOURCES_VAR: &str = "RIVET_CUBIN_SOURCES";

/// The folder of recorded sources.
pub fn sources_dir() -> Result<PathBuf, Refusal> {
    match std::env::var_os(SOURCES_VAR).filter(|d| !d.is_empty()) {
        Some(d) => Ok(PathBuf::from(d)),
        None => Err(Refusal::new(
            CUDA_ERROR_INVALID_IMAGE,
            format!(
                "{SOURCES_VAR} is not set: the double runs a cubin from the CUDA C source rivet \
                 recorded for it; set {SOURCES_VAR} to a folder in the process that compiles \
                 the kernels (rivet writes <sha256 of the cubin>.cu there)"
            ),
        )),
    }
}

/// The source recorded for the cubin whose SHA-256 is `hash`.
pub fn find(hash: &str) -> Result<(PathBuf, String), Refusal> {
    let dir = sources_dir()?;
    let path = dir.join(format!("{hash}.cu"));
    match std::fs::read_to_string(&path) {
        Ok(s) => Ok((path, s)),
        Err(e) => Err(Refusal::new(
            CUDA_ERROR_INVALID_IMAGE,
            format!(
                "no CUDA C source for the cubin with SHA-256 {hash} in {SOURCES_VAR}={} ({}: {e}): \
                 the cubin was not compiled by rivet with {SOURCES_VAR} set to this folder \
                 (set it before the kernels are compiled, in the same environment)",
                dir.display(),
                path.display()
            ),
        )),
    }
}

/// The source with comments, literals and preprocessor lines blanked, and the directives.
struct Blanked {
    code: Vec<u8>,
    /// `#define` directives: (name, body), continuations joined.
    defines: Vec<(String, String)>,
}

fn blank(src: &str) -> Blanked {
    let b = src.as_bytes();
    let mut code = b.to_vec();
    let mut defines = Vec::new();
    let mut i = 0;
    let mut line_start = true;
    let wipe = |code: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut code[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < b.len() {
        let c = b[i];
        if line_start && c == b'#' {
            // A directive: to the end of the line, through backslash continuations.
            let start = i;
            while i < b.len() && !(b[i] == b'\n' && b[i - 1] != b'\\') {
                i += 1;
            }
            let text = src[start..i].replace("\\\n", " ");
            let rest = text[1..].trim_start();
            if let Some(d) = rest.strip_prefix("define") {
                let d = d.trim_start();
                let name: String = d
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                defines.push((name.clone(), d[name.len()..].to_string()));
            }
            wipe(&mut code, start, i);
            continue;
        }
        if c == b'\n' {
            line_start = true;
            i += 1;
            continue;
        }
        if !c.is_ascii_whitespace() {
            line_start = false;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            let start = i;
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            wipe(&mut code, start, i);
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let start = i;
            i += 2;
            while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                i += 1;
            }
            i = (i + 2).min(b.len());
            wipe(&mut code, start, i);
        } else if c == b'"' || c == b'\'' {
            let start = i;
            i += 1;
            while i < b.len() && b[i] != c && b[i] != b'\n' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(b.len());
            // Keep the quotes so `extern "C"` still reads as a linkage specification.
            wipe(&mut code, start + 1, i.saturating_sub(1).max(start + 1));
        } else {
            i += 1;
        }
    }
    Blanked { code, defines }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// C++ keywords a `(` may follow.
const KEYWORDS: &[&str] = &[
    "return",
    "if",
    "while",
    "for",
    "switch",
    "sizeof",
    "alignof",
    "alignas",
    "decltype",
    "static_assert",
    "noexcept",
    "defined",
    "catch",
    "throw",
    "static_cast",
    "reinterpret_cast",
    "const_cast",
    "__launch_bounds__",
    "__align__",
];

/// The identifiers of `text`, each with whether a `(` follows it (a call or a declaration).
fn idents(text: &[u8]) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        if is_ident(text[i]) && (i == 0 || !is_ident(text[i - 1])) {
            let start = i;
            while i < text.len() && is_ident(text[i]) {
                i += 1;
            }
            if text[start].is_ascii_digit() {
                continue;
            }
            let mut j = i;
            while j < text.len() && text[j].is_ascii_whitespace() {
                j += 1;
            }
            let word = String::from_utf8_lossy(&text[start..i]).into_owned();
            // `return (T)x` is no call, nor `alignas(16)`: keywords are no functions.
            let call = text.get(j) == Some(&b'(') && !KEYWORDS.contains(&word.as_str());
            out.push((String::from_utf8_lossy(&text[start..i]).into_owned(), call));
        } else {
            i += 1;
        }
    }
    out
}

/// A top-level definition with a body: a function, or a struct / class / union.
struct Chunk {
    head: std::ops::Range<usize>,
    body: std::ops::Range<usize>,
}

/// The top-level `head { body }` blocks of `code`, looking inside namespaces and
/// `extern "C" { ... }`.
fn chunks(code: &[u8]) -> Vec<Chunk> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut head_start = 0;
    while i < code.len() {
        match code[i] {
            b';' | b'}' => {
                i += 1;
                head_start = i;
            }
            b'{' => {
                let head = &code[head_start..i];
                let h = String::from_utf8_lossy(head);
                let words: Vec<&str> = h.split_whitespace().collect();
                let squeezed: String = words.concat();
                if words.first() == Some(&"namespace") || squeezed == "extern\"\"" {
                    // Enter: its contents are top level too.
                    i += 1;
                    head_start = i;
                    continue;
                }
                let open = i;
                let mut depth = 0usize;
                while i < code.len() {
                    match code[i] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                out.push(Chunk {
                    head: head_start..open,
                    body: open + 1..i.min(code.len()),
                });
                i += 1;
                head_start = i;
            }
            _ => i += 1,
        }
    }
    out
}

/// The function a head declares: the identifier before its last top-level `(`
/// (`void __launch_bounds__(256) name(...)` names `name`).
fn declared_name(head: &[u8]) -> Option<String> {
    // A type (`struct alignas(16) float4`): the keyword comes before any parenthesis.
    let text = String::from_utf8_lossy(head);
    let before = text.split('(').next().unwrap_or("");
    if before
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|w| matches!(w, "struct" | "class" | "union" | "enum"))
    {
        return None;
    }
    let mut depth = 0i32;
    let mut last = None;
    for (k, &c) in head.iter().enumerate() {
        match c {
            b'(' => {
                if depth == 0 {
                    last = Some(k);
                }
                depth += 1;
            }
            b')' => depth -= 1,
            _ => {}
        }
    }
    let mut end = last?;
    while end > 0 && head[end - 1].is_ascii_whitespace() {
        end -= 1;
    }
    let mut start = end;
    while start > 0 && is_ident(head[start - 1]) {
        start -= 1;
    }
    (start < end).then(|| String::from_utf8_lossy(&head[start..end]).into_owned())
}

/// Whether an identifier is a CUDA intrinsic that synchronises threads.
fn is_sync_intrinsic(id: &str) -> bool {
    id.starts_with("__syncthreads")
        || id.starts_with("__syncwarp")
        || id.starts_with("__shfl")
        || (id.starts_with("__") && id.ends_with("_sync"))
        || id == "__barrier_sync"
}

/// What the double knows of a kernel from the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSource {
    /// Declared `__global__` (else the name is some other function of the source).
    pub global: bool,
    /// May synchronise its threads (see the module header).
    pub syncs: bool,
    /// `__launch_bounds__(N)`'s N, when it is a number: a launch of more threads per block
    /// fails on a GPU.
    pub max_threads: Option<u32>,
}

/// The first argument of `__launch_bounds__(...)` in a function's head, if a number.
fn launch_bounds(head: &[u8]) -> Option<u32> {
    let h = String::from_utf8_lossy(head);
    let at = h.find("__launch_bounds__")? + "__launch_bounds__".len();
    let args = h[at..].trim_start().strip_prefix('(')?;
    let first = args.split([',', ')']).next()?.trim();
    first.trim_end_matches(['u', 'U']).parse().ok()
}

/// The functions defined in `src`, by name (the last definition of a name wins: overloads
/// are not kernels rivet writes).
pub fn functions(src: &str) -> BTreeMap<String, KernelSource> {
    let bl = blank(src);
    let code = &bl.code;
    let chunks = chunks(code);
    // The names that may synchronise, to a fixed point through functions and macros.
    let mut syncing: BTreeSet<String> = BTreeSet::new();
    let mentions = |text: &[u8], syncing: &BTreeSet<String>| {
        idents(text)
            .iter()
            .any(|(id, _)| is_sync_intrinsic(id) || syncing.contains(id))
    };
    loop {
        let before = syncing.len();
        for ch in &chunks {
            let body = &code[ch.body.clone()];
            if !mentions(body, &syncing) {
                continue;
            }
            match declared_name(&code[ch.head.clone()]) {
                Some(n) => {
                    syncing.insert(n);
                }
                // A struct or class: any of its member functions may be the one.
                None => syncing.extend(idents(body).into_iter().filter(|x| x.1).map(|x| x.0)),
            }
        }
        for (name, body) in &bl.defines {
            if mentions(body.as_bytes(), &syncing) {
                syncing.insert(name.clone());
                // A macro may define functions: every called-looking name in it.
                syncing.extend(
                    idents(body.as_bytes())
                        .into_iter()
                        .filter(|x| x.1)
                        .map(|x| x.0),
                );
            }
        }
        if syncing.len() == before {
            break;
        }
    }
    let mut out = BTreeMap::new();
    for ch in &chunks {
        let head = &code[ch.head.clone()];
        let Some(name) = declared_name(head) else {
            continue;
        };
        let global = idents(head).iter().any(|(id, _)| id == "__global__");
        out.insert(
            name,
            KernelSource {
                global,
                syncs: mentions(&code[ch.body.clone()], &syncing),
                max_threads: launch_bounds(head),
            },
        );
    }
    out
}

/// `src` with every `extern __shared__ [__align__(n)] T name[];` made a pointer to the
/// launch's dynamic shared memory: inside a function a local `T* name`, at file scope a
/// `static T* name` that [`rewrite_dynamic_shared`]'s second result lists, for the wrapper
/// to point at the buffer before each block.
pub fn rewrite_dynamic_shared(src: &str) -> (String, Vec<String>) {
    let bl = blank(src);
    let code = &bl.code;
    let pat = b"extern";
    let mut out = String::new();
    let mut globals = Vec::new();
    let mut copied = 0;
    let mut depth = 0i32;
    let mut i = 0;
    while i < code.len() {
        match code[i] {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            _ => {}
        }
        let at_word = code[i..].starts_with(pat)
            && (i == 0 || !is_ident(code[i - 1]))
            && !code.get(i + pat.len()).is_some_and(|&c| is_ident(c));
        if at_word {
            let Some(semi) = code[i..].iter().position(|&c| c == b';') else {
                break;
            };
            let decl = String::from_utf8_lossy(&code[i..i + semi]).into_owned();
            let words: Vec<&str> = decl.split_whitespace().collect();
            if words.get(1) == Some(&"__shared__") && decl.trim_end().ends_with(']') {
                // Drop `__align__(n)`; the type is what lies between it and the name.
                let mut rest = decl["extern".len()..].trim().to_string();
                rest = rest["__shared__".len()..].trim().to_string();
                if let Some(p) = rest.find("__align__") {
                    if let Some(close) = rest[p..].find(')') {
                        rest.replace_range(p..p + close + 1, "");
                    }
                }
                let open = rest.rfind('[').unwrap_or(rest.len());
                let before = rest[..open].trim_end();
                let name_start = before
                    .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .map_or(0, |k| k + 1);
                let (ty, name) = (before[..name_start].trim(), &before[name_start..]);
                out.push_str(&src[copied..i]);
                if depth == 0 {
                    out.push_str(&format!("static {ty}* {name}"));
                    globals.push(format!("{name} = ({ty}*)rivet_dynamic_shared();"));
                } else {
                    out.push_str(&format!(
                        "{ty}* const {name} = ({ty}*)rivet_dynamic_shared()"
                    ));
                }
                copied = i + semi;
                i += semi;
                continue;
            }
        }
        i += 1;
    }
    out.push_str(&src[copied..]);
    (out, globals)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = r#"
#define SHFL(T) static T my_shfl(T v) { return __shfl_sync(0xffffffffu, v, 0); }
SHFL(float)
/* a comment { with a brace */
static inline float helper(float x) { __syncthreads(); return x; }
static inline float pure(float x) { return x + 1.0f; }
extern "C" __global__ void __launch_bounds__(128) uses_helper(float* a) { a[0] = helper(a[0]); }
extern "C" __global__ void plain(float* a, long long n) { a[0] = pure(a[0]); const char* s = "}"; }
extern "C" __global__ void via_macro(float* a) { a[0] = my_shfl(a[0]); }
namespace ns { extern "C" { __global__ void inner(float* a) { a[0] = 1; } } }
struct alignas(16) vec4 { float x, y, z, w; };
static inline float returns(float x) { return (float)x; }
void not_a_kernel(float* a) { }
"#;

    #[test]
    fn kernels_and_whether_they_synchronise() {
        let f = functions(SRC);
        let k = |n: &str| f.get(n).cloned();
        let both = |global, syncs| {
            Some(KernelSource {
                global,
                syncs,
                max_threads: None,
            })
        };
        assert_eq!(
            k("uses_helper"),
            Some(KernelSource {
                global: true,
                syncs: true,
                max_threads: Some(128)
            })
        );
        assert_eq!(k("plain"), both(true, false));
        assert_eq!(k("via_macro"), both(true, true));
        assert_eq!(k("inner"), both(true, false));
        assert_eq!(k("not_a_kernel"), both(false, false));
        assert_eq!(k("helper"), both(false, true));
        // `return (float)x` is no call of a function named `return`; a struct no function.
        assert_eq!(k("returns"), both(false, false));
        assert_eq!(k("alignas"), None);
    }

    #[test]
    fn dynamic_shared_becomes_pointers() {
        let src = "extern __shared__ float g[];\n__global__ void k() { extern __shared__ __align__(16) unsigned char s[]; s[0] = 1; }";
        let (out, globals) = rewrite_dynamic_shared(src);
        assert!(out.contains("static float* g;"), "{out}");
        assert!(
            out.contains("unsigned char* const s = (unsigned char*)rivet_dynamic_shared();"),
            "{out}"
        );
        assert_eq!(globals, ["g = (float*)rivet_dynamic_shared();"]);
    }
}
