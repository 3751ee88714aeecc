//! Shared helpers for rivet's cross-crate integration tests (`tests/tests/*.rs`).
