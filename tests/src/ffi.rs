//! Hand-built C ABI and XLA FFI values, shared by the tests that call rivet as C or XLA would
//! (`tests/c_abi*.rs`, `tests/fuzz_regressions.rs`) and the fuzzer's generators
//! (`fuzz::capi_gen`, `fuzz::xla_gen`).

use rivet_runtime::capi::RivetGetLastError;
use rivet_runtime::xla_ffi::{Api, Attrs, ByteSpan, CallFrame, ExtensionBase, List};
use std::ffi::{c_char, c_void, CStr};

/// The thread's last C ABI error (kind, message); an error string when a pointer is NULL.
pub fn try_last_error() -> Result<(String, String), String> {
    let mut kind: *const c_char = std::ptr::null();
    // SAFETY: a valid out pointer; both strings are NUL-terminated thread-local storage.
    unsafe {
        let msg = RivetGetLastError(&mut kind);
        if msg.is_null() || kind.is_null() {
            return Err("RivetGetLastError returned NULL".into());
        }
        Ok((
            CStr::from_ptr(kind).to_string_lossy().into_owned(),
            CStr::from_ptr(msg).to_string_lossy().into_owned(),
        ))
    }
}

/// The thread's last C ABI error (kind, message); panics when a pointer is NULL.
pub fn last_error() -> (String, String) {
    try_last_error().unwrap()
}

/// An XLA FFI list over `types` and `items` (as many of each).
pub fn list(types: &mut [i32], items: &mut [*mut c_void]) -> List {
    List {
        struct_size: std::mem::size_of::<List>(),
        extension_start: std::ptr::null_mut(),
        size: types.len() as i64,
        types: types.as_mut_ptr(),
        items: items.as_mut_ptr(),
    }
}

/// An XLA FFI list of no entries (NULL arrays).
pub fn empty_list() -> List {
    List {
        struct_size: std::mem::size_of::<List>(),
        extension_start: std::ptr::null_mut(),
        size: 0,
        types: std::ptr::null_mut(),
        items: std::ptr::null_mut(),
    }
}

/// XLA FFI attributes over `types`, `names` and `values` (as many of each).
pub fn attrs(types: &mut [i32], names: &mut [*mut ByteSpan], values: &mut [*mut c_void]) -> Attrs {
    Attrs {
        struct_size: std::mem::size_of::<Attrs>(),
        extension_start: std::ptr::null_mut(),
        size: types.len() as i64,
        types: types.as_mut_ptr(),
        names: names.as_mut_ptr(),
        attrs: values.as_mut_ptr(),
    }
}

/// XLA FFI attributes of no entries (NULL arrays).
pub fn no_attrs() -> Attrs {
    Attrs {
        struct_size: std::mem::size_of::<Attrs>(),
        extension_start: std::ptr::null_mut(),
        size: 0,
        types: std::ptr::null_mut(),
        names: std::ptr::null_mut(),
        attrs: std::ptr::null_mut(),
    }
}

/// An XLA FFI call frame of the current size for `api`, `ctx` and `stage` (3: execute) with
/// no extension, arguments, results or attributes: the caller sets those it needs.
pub fn call_frame(api: *const Api, ctx: *mut c_void, stage: i32) -> CallFrame {
    CallFrame {
        struct_size: std::mem::size_of::<CallFrame>(),
        extension_start: std::ptr::null_mut(),
        api,
        ctx,
        stage,
        args: empty_list(),
        rets: empty_list(),
        attrs: no_attrs(),
        future: std::ptr::null_mut(),
    }
}

/// A metadata query (stage 0) through the extension chain starting at `ext`.
pub fn metadata_query(api: *const Api, ext: *mut ExtensionBase) -> CallFrame {
    CallFrame {
        extension_start: ext,
        ..call_frame(api, std::ptr::null_mut(), 0)
    }
}
