//! The in-process build cache: `build` of a program this process built before, the same way,
//! returns the module it built then (the same `Arc<Compiled>`: immutable, shared), in
//! microseconds instead of milliseconds.
//!
//! Key: the canonical bytes of the build (`key::encode`): target with CPU features, options,
//! name, rivet's version, the environment settings the pipeline reads per build, and the
//! whole program, numbered canonically so that an equal program made anew (fresh variables,
//! fresh tensors) hits. The map is keyed by the full bytes, compared in full on a hit: a hit
//! is always the same program, never a hash collision. Settings read once per process
//! (the micro-kernel variant, `RIVET_ERF16`, `RIVET_EXP_RUN`) cannot change under it.
//!
//! What is cached: successful builds for the `cpu` and `interp` targets of programs without
//! host callbacks (a callback is a function object, not content; a cached module would also
//! keep a Python callable alive past its program). Not while `RIVET_DUMP` is set (a hit would
//! write no dump). Errors are never cached.
//!
//! Bounds: at most `CAPACITY` entries and `MAX_KEY_BYTES` of keys in all; the least recently
//! used entry goes first; a key larger than `MAX_KEY_BYTES / 4` is never stored.
//! `RIVET_BUILD_CACHE=0` turns the cache off (read on every build).

pub mod key;

use crate::artifact::Module;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Entries the process cache holds at most.
pub const CAPACITY: usize = 256;
/// Bytes of keys the process cache holds at most.
pub const MAX_KEY_BYTES: usize = 64 << 20;

/// Counters of a cache, for tests and `rivet.build_cache_info()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub hits: u64,
    pub misses: u64,
    pub entries: usize,
    pub key_bytes: usize,
    pub evictions: u64,
}

struct Entry {
    module: Module,
    last_use: u64,
}

/// A bounded LRU map from canonical build keys to built modules.
pub struct BuildCache {
    capacity: usize,
    max_key_bytes: usize,
    map: HashMap<Vec<u8>, Entry>,
    clock: u64,
    stats: Stats,
}

impl BuildCache {
    pub fn new(capacity: usize, max_key_bytes: usize) -> BuildCache {
        BuildCache {
            capacity,
            max_key_bytes,
            map: HashMap::new(),
            clock: 0,
            stats: Stats::default(),
        }
    }

    /// The module built under `key`, if cached (counted as a hit or a miss).
    pub fn get(&mut self, key: &[u8]) -> Option<Module> {
        self.clock += 1;
        match self.map.get_mut(key) {
            Some(e) => {
                e.last_use = self.clock;
                self.stats.hits += 1;
                Some(e.module.clone())
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Stores `module` under `key`, evicting the least recently used entries past the bounds.
    pub fn insert(&mut self, key: Vec<u8>, module: Module) {
        if self.capacity == 0 || key.len() > self.max_key_bytes / 4 {
            return;
        }
        self.clock += 1;
        let len = key.len();
        let new = Entry {
            module,
            last_use: self.clock,
        };
        if let Some(old) = self.map.insert(key, new) {
            // Two threads built the same program at once: the later module replaces the
            // earlier (both are correct; callers keep whichever they got).
            drop(old);
        } else {
            self.stats.key_bytes += len;
        }
        while self.map.len() > self.capacity || self.stats.key_bytes > self.max_key_bytes {
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, e)| e.last_use)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.map.remove(&oldest);
            self.stats.key_bytes -= oldest.len();
            self.stats.evictions += 1;
        }
        self.stats.entries = self.map.len();
    }

    pub fn stats(&self) -> Stats {
        Stats {
            entries: self.map.len(),
            ..self.stats
        }
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.stats.entries = 0;
        self.stats.key_bytes = 0;
    }
}

/// The process's cache.
pub fn global() -> &'static Mutex<BuildCache> {
    static CACHE: OnceLock<Mutex<BuildCache>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(BuildCache::new(CAPACITY, MAX_KEY_BYTES)))
}

/// Whether the environment allows the cache (`RIVET_BUILD_CACHE` unset or not `0`, and
/// `RIVET_DUMP` unset).
pub fn enabled() -> bool {
    enabled_by(&|k| std::env::var_os(k))
}

/// `enabled`, reading the environment through `env`.
pub fn enabled_by(env: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    env("RIVET_BUILD_CACHE").is_none_or(|v| v != "0") && env("RIVET_DUMP").is_none()
}

/// The process cache's counters.
pub fn stats() -> Stats {
    lock().stats()
}

/// Empties the process cache (its counters stay).
pub fn clear() {
    lock().clear()
}

pub(crate) fn lock() -> std::sync::MutexGuard<'static, BuildCache> {
    // A panic while holding the lock leaves a consistent map (no operation panics half-way
    // through an update that matters): keep using it.
    global().lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
