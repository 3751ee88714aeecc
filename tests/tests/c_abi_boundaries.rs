//! What crosses the C ABI from another library, checked before use: a callee's results
//! (NULL strings, managed tensors returned with a failure code, its own "internal" errors),
//! an output rule's answers (against the function's signature, and for element counts and
//! byte sizes that overflow), and function handles (freed, double-freed, made up). Each test
//! here failed before the check it names existed (a segfault, a leak, a wrong error class or
//! a buffer nobody wrote).

use dlpack_rs::ffi::{DLManagedTensorVersioned, DLTensor};
use rivet_compiler::te::{self, compute, placeholder};
use rivet_compiler::{build, Schedule};
use rivet_runtime::capi::import::*;
use rivet_runtime::capi::*;
use rivet_runtime::{DType, Error, Function};
use rivet_tests::ffi::last_error;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A foreign function `func` (with `resource` and, if given, a typed signature and rule),
/// as this runtime's `Function`; the handle is freed.
fn create(
    func: RivetPackedCFunc,
    resource: usize,
    signature: Option<&str>,
    rule: Option<RivetOutputShapesFunc>,
) -> Function {
    let name = CString::new("lib.f").unwrap();
    let sig = signature.map(|s| CString::new(s).unwrap());
    let mut h: RivetFunctionHandle = std::ptr::null_mut();
    // SAFETY: valid strings and out pointer; the callees below ignore or index `resource`.
    let rc = unsafe {
        RivetFunctionCreateTyped(
            name.as_ptr(),
            Some(func),
            resource as *mut c_void,
            None,
            sig.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            rule,
            &mut h,
        )
    };
    assert_eq!(rc, RIVET_OK, "{:?}", last_error());
    let f = handle_function(h).expect("a live handle");
    // SAFETY: a live handle, freed once.
    assert_eq!(unsafe { RivetFunctionFree(h) }, RIVET_OK);
    f
}

/// Answers by `resource`: 0 a NULL string with success, 1 a managed tensor with a failure
/// code, 2 "InternalError: ..." with a user code, 3 a failure with the internal code,
/// 4 success with an unknown type code, 5 a non-UTF-8 string, 6 a NULL managed tensor.
unsafe extern "C" fn misbehaving(
    resource: *mut c_void,
    _args: *const RivetAny,
    _n: i32,
    result: *mut RivetAny,
) -> i32 {
    static INTERNAL: &[u8] = b"InternalError: the library's own bug\0";
    static NOT_UTF8: &[u8] = b"\xff\xfe\0";
    let (code, r) = match resource as usize {
        0 => (RIVET_OK, RivetAny::ptr(RIVET_STR, std::ptr::null_mut())),
        1 => (
            RIVET_ERR_USER,
            RivetAny::ptr(RIVET_MANAGED_TENSOR, counted_tensor() as *mut c_void),
        ),
        2 => (
            RIVET_ERR_USER,
            RivetAny::ptr(RIVET_STR, INTERNAL.as_ptr() as *mut c_void),
        ),
        3 => (RIVET_ERR_INTERNAL, RivetAny::NULL),
        4 => (RIVET_OK, RivetAny::ptr(77, std::ptr::null_mut())),
        5 => (
            RIVET_OK,
            RivetAny::ptr(RIVET_STR, NOT_UTF8.as_ptr() as *mut c_void),
        ),
        _ => (
            RIVET_OK,
            RivetAny::ptr(RIVET_MANAGED_TENSOR, std::ptr::null_mut()),
        ),
    };
    // SAFETY: the host passes a writable result.
    unsafe { *result = r };
    code
}

static DELETED: AtomicUsize = AtomicUsize::new(0);

/// A one-element float32 managed tensor whose deleter counts in `DELETED`.
fn counted_tensor() -> *mut DLManagedTensorVersioned {
    unsafe extern "C" fn deleter(m: *mut DLManagedTensorVersioned) {
        DELETED.fetch_add(1, Ordering::SeqCst);
        // SAFETY: made by `Box::into_raw` below, with its data and shape boxed the same way.
        unsafe {
            let m = Box::from_raw(m);
            drop(Box::from_raw(m.dl_tensor.data as *mut f32));
            drop(Box::from_raw(m.dl_tensor.shape as *mut [i64; 1]));
        }
    }
    let data = Box::into_raw(Box::new(1.5f32));
    let shape = Box::into_raw(Box::new([1i64]));
    Box::into_raw(Box::new(DLManagedTensorVersioned {
        version: dlpack_rs::ffi::DLPackVersion { major: 1, minor: 0 },
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(deleter),
        flags: 0,
        dl_tensor: DLTensor {
            data: data as *mut c_void,
            device: rivet_runtime::Device::Cpu.to_dlpack(),
            ndim: 1,
            dtype: DType::F32.to_dlpack(),
            shape: shape as *mut i64,
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        },
    }))
}

#[test]
fn a_null_string_result_is_a_library_error_not_a_segfault() {
    let e = create(misbehaving, 0, None, None).call(&[]).unwrap_err();
    assert!(matches!(e, Error::Library(_)), "{e:?}");
    assert!(e.to_string().contains("pointer is NULL"), "{e}");
    let e = create(misbehaving, 6, None, None).call(&[]).unwrap_err();
    assert!(
        matches!(e, Error::Library(_)) && e.to_string().contains("NULL"),
        "{e:?}"
    );
}

#[test]
fn a_tensor_returned_with_a_failure_code_is_released() {
    let before = DELETED.load(Ordering::SeqCst);
    let e = create(misbehaving, 1, None, None).call(&[]).unwrap_err();
    assert!(!matches!(e, Error::Internal(_)), "{e:?}");
    assert_eq!(
        DELETED.load(Ordering::SeqCst),
        before + 1,
        "the deleter ran once"
    );
}

#[test]
fn a_callees_internal_error_is_a_library_error_not_rivets() {
    for which in [2, 3] {
        let e = create(misbehaving, which, None, None)
            .call(&[])
            .unwrap_err();
        assert!(matches!(e, Error::Library(_)), "{which}: {e:?}");
        assert!(e.to_string().starts_with("lib.f: "), "{e}");
        assert_eq!(e.kind_name(), "LibraryError");
    }
}

#[test]
fn out_of_contract_results_are_library_errors() {
    let e = create(misbehaving, 4, None, None).call(&[]).unwrap_err();
    assert!(
        matches!(e, Error::Library(_)) && e.to_string().contains("77"),
        "{e:?}"
    );
    let e = create(misbehaving, 5, None, None).call(&[]).unwrap_err();
    assert!(
        matches!(e, Error::Library(_)) && e.to_string().contains("UTF-8"),
        "{e:?}"
    );
}

/// An output rule answering `ANSWERS[resource]`.
unsafe extern "C" fn answering(
    resource: *mut c_void,
    _shapes: *const *const i64,
    _ndims: *const i32,
    _n: i32,
    result: *mut RivetAny,
) -> i32 {
    static ANSWERS: [&[u8]; 6] = [
        b"[[[4], \"float64\"]]\0",                          // dtype not allowed
        b"[[[65536, 65536, 65536, 65536], \"float32\"]]\0", // 2^64 elements
        b"[[[4294967296, 4294967296], \"float32\"]]\0",     // 2^64 elements
        b"[[[1099511627776, 1048576], \"float32\"]]\0",     // 2^62 bytes
        b"[[[4], \"float32\"], [[4], \"float32\"]]\0",      // two outputs, one declared
        b"[[[5], \"float32\"]]\0",                          // n is 4
    ];
    let text = ANSWERS[resource as usize % ANSWERS.len()];
    // SAFETY: the host passes a writable result.
    unsafe { *result = RivetAny::ptr(RIVET_STR, text.as_ptr() as *mut c_void) };
    RIVET_OK
}

const ONE_IN_ONE_OUT: &str = r#"{"params": [
  {"name": "x", "kind": {"tensor": {"dtypes": ["float32"], "shape": [{"var": "n"}], "device": "host", "output": false}}},
  {"name": "y", "kind": {"tensor": {"dtypes": ["float32"], "shape": "any_rank", "device": "host", "output": true}}}
]}"#;

#[test]
fn an_output_rules_answer_is_checked_against_the_signature_and_for_overflow() {
    // `y` of any rank, so the overflowing shapes reach the size check.
    let any_rank = ONE_IN_ONE_OUT.replace("\"any_rank\"", "null");
    let with_n = ONE_IN_ONE_OUT.replace("\"any_rank\"", "[{\"var\": \"n\"}]");
    let cases: [(usize, &str, fn(&Error) -> bool, &str); 6] = [
        (0, &any_rank, |e| matches!(e, Error::Library(_)), "float64"),
        (1, &any_rank, |e| matches!(e, Error::Memory(_)), "65536"),
        (
            2,
            &any_rank,
            |e| matches!(e, Error::Memory(_)),
            "4294967296",
        ),
        (3, &any_rank, |e| matches!(e, Error::Memory(_)), "bytes"),
        (
            4,
            &any_rank,
            |e| matches!(e, Error::Library(_)),
            "2 outputs",
        ),
        (5, &with_n, |e| matches!(e, Error::Library(_)), "size 5"),
    ];
    for (which, sig, ok, want) in cases {
        let f = create(misbehaving, which, Some(sig), Some(answering));
        let e = f.output_shapes(&[&[4]], None).unwrap_err();
        assert!(ok(&e), "{which}: {e:?}");
        assert!(e.to_string().contains(want), "{which}: {e}");
    }
}

#[test]
fn a_compiled_functions_overflowing_output_shape_is_a_memory_error() {
    // Rank 4 over one symbolic dim: 65536 gives 2^64 elements (XLA aborted on it).
    let n = te::var("n");
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let c = compute([&n, &n, &n, &n], |[i, _j, _k, _l]| a.at([i]), "C").unwrap();
    let s = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let f = build(&s, &[a, c], "cpu", "rank4")
        .unwrap()
        .get_function("rank4")
        .unwrap();
    assert_eq!(f.output_shapes(&[&[3]], None).unwrap()[0].0, vec![3; 4]);
    let e = f.output_shapes(&[&[65536]], None).unwrap_err();
    assert!(matches!(e, Error::Memory(_)), "{e:?}");
}

#[test]
fn freed_double_freed_and_made_up_handles_are_argument_errors() {
    let f = Function::new("h", |_| Ok(rivet_runtime::Value::Int(7)));
    rivet_runtime::registry::register("boundaries.h", f, true).unwrap();
    let name = CString::new("boundaries.h").unwrap();
    let mut h: RivetFunctionHandle = std::ptr::null_mut();
    // SAFETY: valid arguments.
    assert_eq!(
        unsafe { RivetFunctionGetGlobal(name.as_ptr(), &mut h) },
        RIVET_OK
    );
    let mut out = RivetAny::NULL;
    // SAFETY: a live handle, no arguments.
    assert_eq!(
        unsafe { RivetFunctionCall(h, std::ptr::null(), 0, &mut out) },
        RIVET_OK
    );
    // SAFETY: a live handle, freed once.
    assert_eq!(unsafe { RivetFunctionFree(h) }, RIVET_OK);
    for made_up in [
        h,
        1usize as RivetFunctionHandle,
        usize::MAX as RivetFunctionHandle,
    ] {
        // SAFETY: handles are checked, never dereferenced.
        let rc = unsafe { RivetFunctionCall(made_up, std::ptr::null(), 0, &mut out) };
        assert_eq!(rc, RIVET_ERR_USER);
        let (kind, msg) = last_error();
        assert_eq!(kind, "ArgumentError", "{msg}");
        assert!(msg.contains("freed or was never one"), "{msg}");
        // SAFETY: as above.
        assert_eq!(unsafe { RivetFunctionFree(made_up) }, RIVET_ERR_USER);
        let mut v = RivetAny::ptr(RIVET_FUNCTION, made_up);
        // SAFETY: as above.
        assert_eq!(unsafe { RivetAnyFree(&mut v) }, RIVET_ERR_USER);
    }
}
