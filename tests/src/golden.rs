//! The one golden-file check of the workspace: generated code of canonical kernels compared
//! byte for byte with `tests/golden/<name>`, rewritten instead with `RIVET_BLESS=1`.
//!
//! Used by `tests/tests/codegen_golden.rs` (loop IR, Cranelift IR) and by the compiler's CUDA
//! unit tests (`compiler/src/codegen/cuda/tests.rs`, CUDA C), which include this file with
//! `#[path]` (the compiler cannot depend on this crate): it uses only `std`, and finds the
//! folder from the including crate's manifest directory, a sibling of `tests/`.

use std::path::PathBuf;

/// The golden folder: `tests/golden/` of the workspace.
pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/golden")
        .components()
        .collect()
}

/// Whether this run rewrites the golden files (`RIVET_BLESS=1`) instead of checking them.
pub fn blessing() -> bool {
    std::env::var("RIVET_BLESS").is_ok_and(|v| v == "1")
}

/// Checks `text` against the golden file `name` (with its extension: `gemm.ir`,
/// `allreduce_rows.cu`), or writes it there under `RIVET_BLESS=1`; review the diff before
/// committing it.
pub fn check_golden(name: &str, text: &str) {
    let path = golden_dir().join(name);
    if blessing() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "{} is missing: run with RIVET_BLESS=1 to create it",
            path.display()
        )
    });
    assert!(
        want == text,
        "{name} differs from {} (RIVET_BLESS=1 to update):\n--- golden\n{want}\n--- now\n{text}",
        path.display()
    );
}
