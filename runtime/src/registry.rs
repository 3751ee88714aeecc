//! The process-wide function registry. Names are dotted (`testing.axpy`); built-in native
//! functions are registered the first time the registry is touched, so every consumer
//! (Rust or Python) sees the same set. Replacing a name needs `override_ = true`.

use crate::error::{Error, Result};
use crate::function::Function;
use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};

static REGISTRY: LazyLock<RwLock<HashMap<String, Function>>> = LazyLock::new(|| {
    let mut m = HashMap::new();
    for f in crate::builtin_functions::functions() {
        m.insert(f.name().to_string(), f);
    }
    RwLock::new(m)
});

fn read() -> std::sync::RwLockReadGuard<'static, HashMap<String, Function>> {
    // A panic while holding the lock cannot leave the map half-updated (single insert/remove).
    REGISTRY.read().unwrap_or_else(|e| e.into_inner())
}

pub fn register(name: &str, f: Function, override_: bool) -> Result<()> {
    if name.is_empty() {
        return Err(Error::Registry(
            "cannot register a function under an empty name".into(),
        ));
    }
    let mut m = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    if !override_ && m.contains_key(name) {
        return Err(Error::Registry(format!(
            "a function named '{name}' is already registered; pass override=True to replace it"
        )));
    }
    m.insert(name.to_string(), f);
    Ok(())
}

pub fn get(name: &str) -> Result<Function> {
    try_get(name).ok_or_else(|| {
        let m = read();
        let mut near: Vec<&str> = m
            .keys()
            .filter(|k| k.split('.').next() == name.split('.').next())
            .map(|k| k.as_str())
            .collect();
        near.sort_unstable();
        let hint = if near.is_empty() {
            String::new()
        } else {
            format!("; registered in that namespace: {}", near.join(", "))
        };
        Error::NotFound(format!("no function named '{name}' is registered{hint}"))
    })
}

pub fn try_get(name: &str) -> Option<Function> {
    read().get(name).cloned()
}

/// Registered names, sorted.
pub fn list() -> Vec<String> {
    let mut names: Vec<String> = read().keys().cloned().collect();
    names.sort_unstable();
    names
}

/// Removes a name; true when it was registered.
pub fn remove(name: &str) -> bool {
    REGISTRY
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .remove(name)
        .is_some()
}
