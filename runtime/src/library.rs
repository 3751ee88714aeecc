//! Loading another library's functions into this runtime (`rivet.load_library`): the library
//! is opened, its `rivet_library_init(const RivetHostApi*, char* err, size_t err_len)` is
//! called with this runtime's host table, and the names it registered are returned.
//!
//! Invariants:
//! - The host table (`RivetHostApi`) a library receives is a `static` of this runtime and
//!   every entry in it is a plain function of this runtime: a library may keep the pointer
//!   and call any entry at any later time, from any thread, for the life of the process (a C
//!   programmer would assume so, and nothing else would be safe to assume).
//! - A loaded library is never unloaded: its functions' code, resources and deleters live
//!   there, and handles to them may be held anywhere.
//! - Names are recorded per call of `load`: registrations made on the loading thread while
//!   its `rivet_library_init` runs are returned; a registration made later (or from another
//!   thread) through a kept table registers all the same and is returned by no call.
//! - The library's error text is read within the buffer rivet gave it, whether or not the
//!   library NUL-terminated it; a failure it calls internal is a `LibraryError`.

use crate::capi::import::{callee_error, RivetFunctionCreate, RivetFunctionCreateTyped};
use crate::capi::{
    RivetFunctionFree, RivetFunctionHandle, RivetFunctionSetGlobal, RivetGetLastError,
    RivetHostApi, RIVET_OK,
};
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::sync::Mutex;

/// The size of the buffer a library writes a failure's text into.
const ERR_LEN: usize = 8192;

/// `rivet_library_init`'s type.
type InitFn = unsafe extern "C" fn(*const RivetHostApi, *mut c_char, usize) -> i32;

/// The two host tables (`override_` 0 and 1): statics, so a library may keep either.
static HOST_API: [RivetHostApi; 2] = [host_api(0), host_api(1)];

const fn host_api(override_: i32) -> RivetHostApi {
    RivetHostApi {
        abi_version: crate::capi::ABI_MAJOR << 16 | crate::capi::ABI_MINOR,
        override_,
        function_create: RivetFunctionCreate,
        set_global: recording_set_global,
        function_free: RivetFunctionFree,
        get_last_error: RivetGetLastError,
        function_create_typed: RivetFunctionCreateTyped,
    }
}

/// This runtime's host table (`override_`: registrations may replace a function of the same
/// name), valid for the life of the process.
pub fn host_api_table(override_: bool) -> &'static RivetHostApi {
    &HOST_API[override_ as usize]
}

thread_local! {
    /// The names registered on this thread during the `load` running on it, if one is.
    static RECORDING: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// Every library ever loaded: kept, never unloaded (see the invariants).
static LOADED: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

/// The table's `set_global`: `RivetFunctionSetGlobal`, and the name recorded for the `load`
/// running on this thread, if any.
unsafe extern "C" fn recording_set_global(
    name: *const c_char,
    func: RivetFunctionHandle,
    override_: i32,
) -> i32 {
    // SAFETY: the caller's promises, passed on; `name` is read only after they are checked.
    let rc = unsafe { RivetFunctionSetGlobal(name, func, override_) };
    if rc == RIVET_OK {
        // SAFETY: RivetFunctionSetGlobal succeeded, so `name` is a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        RECORDING.with(|r| {
            if let Some(names) = r.borrow_mut().as_mut() {
                names.push(name);
            }
        });
    }
    rc
}

/// Loads the library at `path`, lets it register its functions (`override_`: replacing
/// functions of the same names), and returns the names it registered. A library without
/// `rivet_library_init` is an `ArgumentError`; a failure it reports comes back as the error
/// of its kind, `rivet.load_library(path)` prepended (functions registered before the failure
/// stay registered).
///
/// # Safety
/// Loading a library runs its initialisers, and its `rivet_library_init` runs with this
/// process's rights: the caller trusts the library's code (as `dlopen` does).
pub unsafe fn load(path: &str, override_: bool) -> Result<Vec<String>> {
    let what = format!("rivet.load_library({path:?})");
    if !std::path::Path::new(path).exists() {
        return Err(Error::Argument(format!("{what}: no file at {path:?}")));
    }
    // An absolute path: a bare name would make dlopen search the system's library paths.
    let full = std::path::absolute(path)
        .map_err(|e| Error::Argument(format!("{what}: cannot resolve the path: {e}")))?;
    // SAFETY: the caller's trust in the library's initialisers.
    let lib = unsafe { libloading::Library::new(&full) }
        .map_err(|e| Error::Argument(format!("{what}: cannot load it: {e}")))?;
    // SAFETY: the symbol is declared with this type by the C ABI (c_api.h).
    let init: InitFn = match unsafe { lib.get::<InitFn>(b"rivet_library_init\0") } {
        Ok(sym) => *sym,
        Err(_) => {
            return Err(Error::Argument(format!(
                "{what}: no 'rivet_library_init' entry point (build it with rivet::python_library!)"
            )))
        }
    };
    // Kept before the call: whatever the library registers lives in its code.
    LOADED.lock().unwrap_or_else(|e| e.into_inner()).push(lib);
    let mut err = vec![0u8; ERR_LEN];
    let previous = RECORDING.with(|r| r.borrow_mut().replace(Vec::new()));
    // SAFETY: the table is static; `err` is writable for ERR_LEN bytes.
    let rc = unsafe {
        init(
            host_api_table(override_),
            err.as_mut_ptr() as *mut c_char,
            ERR_LEN,
        )
    };
    let names = RECORDING.with(|r| std::mem::replace(&mut *r.borrow_mut(), previous));
    if rc == RIVET_OK {
        return Ok(names.unwrap_or_default());
    }
    let end = err.iter().position(|&b| b == 0).unwrap_or(ERR_LEN);
    let text = String::from_utf8_lossy(&err[..end]).into_owned();
    let text = (!text.is_empty()).then_some(text);
    Err(callee_error(&what, rc, text))
}
