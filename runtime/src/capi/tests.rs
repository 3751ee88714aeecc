//! Both sides of the cross-library protocol in one runtime: a function exported
//! (`export.rs`) and created again as another library's function (`import.rs`), so each test
//! sees what a host sees of a callee, and a library of a host.

use super::export::*;
use super::import::*;
use super::*;
use crate::dtype::DType;
use crate::error::Error;
use crate::function::{Dim, Function, ParamKind, Signature};
use crate::registry;
use crate::tensor::Tensor;
use crate::value::Value;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Both sides of the protocol in one runtime: `export` then `RivetFunctionCreate`.
fn crossed(f: Function) -> Function {
    let (call, resource, deleter) = export(f);
    let mut h: RivetFunctionHandle = std::ptr::null_mut();
    let name = CString::new("crossed").unwrap();
    // SAFETY: valid arguments; the handle is freed below.
    let rc =
        unsafe { RivetFunctionCreate(name.as_ptr(), Some(call), resource, Some(deleter), &mut h) };
    assert_eq!(rc, RIVET_OK);
    let f = crate::capi::handle_function(h).expect("a live handle");
    // SAFETY: freed once.
    unsafe { crate::capi::RivetFunctionFree(h) };
    f
}

#[test]
fn tensors_scalars_results_and_errors_cross_with_their_kinds() {
    let axpy = crossed(crate::builtin_functions::functions().remove(2));
    let x = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
    let y = Tensor::from_slice(&[10f32, 20., 30., 40., 50., 60.], &[2, 3]).unwrap();
    // A transposed view crosses as its layout (strides), written in place.
    let yt = y.as_strided(&[3, 2], &[1, 3], 0).unwrap();
    let xt = x.as_strided(&[3, 2], &[1, 3], 0).unwrap();
    axpy.call(&[Value::Float(2.0), xt.into(), yt.into()])
        .unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [12., 24., 36., 48., 60., 72.]);
    // The callee's signature check, its kind kept, the name of the crossing added.
    let bad = Tensor::from_slice(&[1f32, 2.], &[2]).unwrap();
    let e = axpy
        .call(&[Value::Float(1.0), bad.into(), y.clone().into()])
        .unwrap_err();
    assert!(matches!(e, Error::Shape(_)), "{e:?}");
    assert!(e.to_string().starts_with("crossed: testing.axpy"), "{e}");
    // A read-only tensor stays read-only across.
    let e = axpy
        .call(&[Value::Float(1.0), x.clone().into(), y.to_read_only().into()])
        .unwrap_err();
    assert!(matches!(e, Error::ReadOnly(_)), "{e:?}");
    // A function argument cannot cross: a clear error, nothing called.
    let e = axpy
        .call(&[
            Value::Function(axpy.clone()),
            x.clone().into(),
            y.clone().into(),
        ])
        .unwrap_err();
    assert!(
        matches!(e, Error::Argument(_)) && e.to_string().contains("cannot cross"),
        "{e}"
    );
    // Results: a tensor comes back as a managed tensor of the callee (echo returns it).
    let echo = crossed(crate::builtin_functions::functions().remove(0));
    let out = echo.call(&[x.clone().into()]).unwrap();
    let Value::Tensor(t) = out else {
        panic!("{}", out.kind())
    };
    assert_eq!(t.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    assert_eq!(t.data_ptr(), x.data_ptr(), "no copy");
    assert!(matches!(
        echo.call(&[Value::Str("a\u{e9}".into())]).unwrap(),
        Value::Str(s) if &*s == "a\u{e9}"
    ));
    assert!(matches!(
        echo.call(&[Value::Int(i64::MIN)]).unwrap(),
        Value::Int(i64::MIN)
    ));
}

static RELEASED: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn failing(
    _resource: *mut c_void,
    _args: *const RivetAny,
    _n: i32,
    result: *mut RivetAny,
) -> i32 {
    static MSG: &[u8] = b"DTypeError: wrong dtype over there\0";
    // SAFETY: the host passes a writable result.
    unsafe { *result = RivetAny::ptr(RIVET_STR, MSG.as_ptr() as *mut c_void) };
    RIVET_ERR_USER
}

unsafe extern "C" fn count_release(_resource: *mut c_void) {
    RELEASED.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn a_foreign_failure_keeps_its_kind_and_the_resource_is_released_once() {
    let mut h: RivetFunctionHandle = std::ptr::null_mut();
    let name = CString::new("foreign.fail").unwrap();
    // SAFETY: valid arguments.
    let rc = unsafe {
        RivetFunctionCreate(
            name.as_ptr(),
            Some(failing),
            std::ptr::null_mut(),
            Some(count_release),
            &mut h,
        )
    };
    assert_eq!(rc, RIVET_OK);
    let f = crate::capi::handle_function(h).expect("a live handle");
    let e = f.call(&[]).unwrap_err();
    assert!(matches!(e, Error::DType(_)), "{e:?}");
    assert_eq!(e.to_string(), "foreign.fail: wrong dtype over there");
    // SAFETY: freed once.
    unsafe { crate::capi::RivetFunctionFree(h) };
    assert_eq!(RELEASED.load(Ordering::SeqCst), 0, "a clone is still alive");
    drop(f);
    assert_eq!(RELEASED.load(Ordering::SeqCst), 1);
    // NULL function pointer and NULL out: user errors, nothing created.
    let mut h2: RivetFunctionHandle = std::ptr::null_mut();
    // SAFETY: the NULLs are what is being checked.
    unsafe {
        assert_eq!(
            RivetFunctionCreate(name.as_ptr(), None, std::ptr::null_mut(), None, &mut h2),
            RIVET_ERR_USER
        );
        assert_eq!(
            RivetFunctionCreate(
                name.as_ptr(),
                Some(failing),
                std::ptr::null_mut(),
                None,
                std::ptr::null_mut()
            ),
            RIVET_ERR_USER
        );
    }
    assert!(h2.is_null());
}

/// `f` crossed the typed way: `export`, `export_types`, `RivetFunctionCreateTyped`.
fn crossed_typed(f: Function) -> Function {
    let (json, rule) = export_types(&f).unwrap();
    let (call, resource, deleter) = export(f);
    let mut h: RivetFunctionHandle = std::ptr::null_mut();
    let name = CString::new("crossed").unwrap();
    let json_ptr = json.as_ref().map_or(std::ptr::null(), |j| j.as_ptr());
    // SAFETY: valid arguments; the handle is freed below.
    let rc = unsafe {
        RivetFunctionCreateTyped(
            name.as_ptr(),
            Some(call),
            resource,
            Some(deleter),
            json_ptr,
            rule,
            &mut h,
        )
    };
    assert_eq!(rc, RIVET_OK);
    let f = crate::capi::handle_function(h).expect("a live handle");
    // SAFETY: freed once.
    unsafe { crate::capi::RivetFunctionFree(h) };
    f
}

/// `y = 2 x` over (n, 3) float32 tensors, typed, with an output rule.
fn doubler() -> Function {
    use crate::function::{DeviceSpec, Param, TensorSpec};
    let spec = |output| {
        ParamKind::Tensor(TensorSpec {
            dtypes: vec![DType::F32],
            shape: Some(vec![Dim::Var("n".into()), Dim::Fixed(3)]),
            device: DeviceSpec::Host,
            output,
        })
    };
    let sig = Signature::new(vec![
        Param::new("x", spec(false)),
        Param::new("y", spec(true)),
    ]);
    Function::with_output_rule(
        "doubler",
        sig,
        |args| {
            // y is zeros in the test: y <- 2 x + y is 2 x.
            let axpy = crate::builtin_functions::functions().remove(2);
            let mut with_alpha = vec![Value::Float(2.0)];
            with_alpha.extend_from_slice(args);
            axpy.call(&with_alpha)
        },
        |shapes| match shapes {
            [s] if s.len() == 2 && s[1] == 3 => Ok(vec![(s.to_vec(), DType::F32)]),
            _ => Err(Error::Shape(format!("doubler: input shapes {shapes:?}"))),
        },
    )
}

#[test]
fn a_typed_function_crosses_with_its_signature_and_output_rule() {
    let f = crossed_typed(doubler());
    assert_eq!(f.signature(), doubler().signature());
    assert_eq!(
        f.output_shapes(&[&[5, 3]], None).unwrap(),
        vec![(vec![5, 3], DType::F32)]
    );
    // The rule's failure keeps its kind; the crossing's name comes first.
    let e = f.output_shapes(&[&[5, 4]], None).unwrap_err();
    assert!(matches!(e, Error::Shape(_)), "{e:?}");
    assert!(
        e.to_string().starts_with("crossed: doubler: input shapes"),
        "{e}"
    );
    // Dims near the limits cross unchanged (the rule sees what was asked).
    let e = f.output_shapes(&[&[i64::MAX, i64::MIN]], None).unwrap_err();
    assert!(e.to_string().contains(&i64::MIN.to_string()), "{e}");
    // Calls still run (and are checked) in the callee.
    let x = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
    let y = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    f.call(&[x.clone().into(), y.clone().into()]).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [2., 4., 6., 8., 10., 12.]);
    let e = f.call(&[x.into(), Tensor::zeros(&[2, 4], DType::F32).unwrap().into()]);
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    // An untyped function crosses untyped.
    let echo = crossed_typed(crate::builtin_functions::functions().remove(0));
    assert!(echo.signature().is_some(), "testing.echo is typed");
    let untyped = crossed_typed(Function::new("plain", |_| Ok(Value::Null)));
    assert!(untyped.signature().is_none() && !untyped.has_output_rule());
}

#[test]
fn a_malformed_signature_is_an_argument_error_and_creates_nothing() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let many_dims = format!(
        r#"{{"params": [{{"name": "x", "kind": {{"tensor": {{"dtypes": [], "shape": [{}], "device": "host", "output": false}}}}}}]}}"#,
        vec![r#""any""#; 65].join(", ")
    );
    let cases: Vec<(String, &str)> = vec![
        ("not json".into(), "not a signature's JSON"),
        (r#"{"params": [], "extra": 1}"#.into(), "unknown field"),
        (r#"{"params": [{"name": "x", "kind": "tensor"}]}"#.into(), "not a signature's JSON"),
        (
            r#"{"params": [{"name": "x", "kind": {"tensor": {"dtypes": ["float128"], "shape": null, "device": "host", "output": false}}}]}"#.into(),
            "float128",
        ),
        (
            r#"{"params": [{"name": "x", "kind": {"tensor": {"dtypes": [], "shape": [{"fixed": -9223372036854775808}], "device": "host", "output": false}}}]}"#.into(),
            "dims are >= 0",
        ),
        (
            r#"{"params": [{"name": "x", "kind": {"tensor": {"dtypes": [], "shape": null, "device": {"exactly": "cuda:-1"}, "output": false}}}]}"#.into(),
            "unknown device",
        ),
        (many_dims, "65 dims"),
        (deep, "not a signature's JSON"),
        // Past the size cap: refused before parsing (16 MiB of spaces, then valid JSON).
        (
            format!("{}{{\"params\": []}}", " ".repeat(MAX_SIGNATURE_JSON)),
            "bytes of JSON; at most",
        ),
    ];
    for (json, want) in cases {
        let mut h: RivetFunctionHandle = std::ptr::null_mut();
        let name = CString::new("bad").unwrap();
        let json = CString::new(json).unwrap();
        // SAFETY: valid pointers; the malformed JSON is what is checked.
        let rc = unsafe {
            RivetFunctionCreateTyped(
                name.as_ptr(),
                Some(failing),
                std::ptr::null_mut(),
                None,
                json.as_ptr(),
                None,
                &mut h,
            )
        };
        assert_eq!(rc, RIVET_ERR_USER, "{want}");
        assert!(h.is_null());
        let mut kind: *const c_char = std::ptr::null();
        // SAFETY: reads this thread's last error.
        let msg = unsafe { CStr::from_ptr(crate::capi::RivetGetLastError(&mut kind)) }
            .to_string_lossy()
            .into_owned();
        assert!(msg.contains(want) && msg.contains("'bad'"), "{want}: {msg}");
    }
}

unsafe extern "C" fn garbage_rule(
    resource: *mut c_void,
    _shapes: *const *const i64,
    _ndims: *const i32,
    _n: i32,
    result: *mut RivetAny,
) -> i32 {
    // The resource picks the answer.
    static ANSWERS: [&[u8]; 3] = [b"[[[2, 3]]]\0", b"[[[-1], \"float32\"]]\0", b"{}\0"];
    let text = ANSWERS[resource as usize % 3];
    // SAFETY: the host passes a writable result.
    unsafe { *result = RivetAny::ptr(RIVET_STR, text.as_ptr() as *mut c_void) };
    RIVET_OK
}

#[test]
fn a_foreign_output_rule_answer_is_checked() {
    let json = CString::new(
        r#"{"params": [{"name": "y", "kind": {"tensor": {"dtypes": [], "shape": null, "device": "host", "output": true}}}]}"#,
    )
    .unwrap();
    for (which, want) in [
        (0usize, "not a JSON list"),
        (1, "negative size -1"),
        (2, "not a JSON list"),
    ] {
        let mut h: RivetFunctionHandle = std::ptr::null_mut();
        let name = CString::new("rule").unwrap();
        // SAFETY: valid arguments; `resource` is only an index for `garbage_rule`.
        let rc = unsafe {
            RivetFunctionCreateTyped(
                name.as_ptr(),
                Some(failing),
                which as *mut c_void,
                None,
                json.as_ptr(),
                Some(garbage_rule),
                &mut h,
            )
        };
        assert_eq!(rc, RIVET_OK);
        let f = crate::capi::handle_function(h).expect("a live handle");
        // SAFETY: freed once.
        unsafe { crate::capi::RivetFunctionFree(h) };
        let e = f.output_shapes(&[], None).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
        // A broken answer is the library's bug, never rivet's internal error.
        assert!(matches!(e, Error::Library(_)), "{e:?}");
    }
}

static TYPED_CREATES: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn counting_create_typed(
    name: *const c_char,
    func: Option<RivetPackedCFunc>,
    resource: *mut c_void,
    deleter: Option<RivetDeleter>,
    signature_json: *const c_char,
    output_shapes: Option<RivetOutputShapesFunc>,
    out: *mut RivetFunctionHandle,
) -> i32 {
    TYPED_CREATES.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the arguments `register_in_host` passes, handed on.
    unsafe {
        RivetFunctionCreateTyped(
            name,
            func,
            resource,
            deleter,
            signature_json,
            output_shapes,
            out,
        )
    }
}

#[test]
fn a_library_registers_typed_only_in_a_host_that_has_the_typed_entry() {
    let host = |minor: i32| RivetHostApi {
        abi_version: crate::capi::ABI_MAJOR << 16 | minor,
        override_: 1,
        function_create: RivetFunctionCreate,
        set_global: RivetFunctionSetGlobal,
        function_free: crate::capi::RivetFunctionFree,
        get_last_error: crate::capi::RivetGetLastError,
        function_create_typed: counting_create_typed,
    };
    // A 1.0 host's table ends before `function_create_typed`: never read there, so the
    // function arrives untyped (and still runs, checked by the callee).
    let old = host(0);
    // SAFETY: a live table of this runtime's entry points.
    unsafe { register_in_host(&old, vec![("foreign_test.old_host".into(), doubler())]) }.unwrap();
    assert_eq!(TYPED_CREATES.load(Ordering::SeqCst), 0);
    let f = registry::get("foreign_test.old_host").unwrap();
    assert!(f.signature().is_none() && !f.has_output_rule());
    let x = Tensor::from_slice(&[1f32, 2., 3.], &[1, 3]).unwrap();
    let y = Tensor::zeros(&[1, 3], DType::F32).unwrap();
    f.call(&[x.into(), y.clone().into()]).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [2., 4., 6.]);
    // A 1.1 host: typed, through the typed entry.
    let new = host(TYPED_SINCE_MINOR);
    // SAFETY: as above.
    unsafe { register_in_host(&new, vec![("foreign_test.new_host".into(), doubler())]) }.unwrap();
    assert_eq!(TYPED_CREATES.load(Ordering::SeqCst), 1);
    let f = registry::get("foreign_test.new_host").unwrap();
    assert_eq!(f.signature(), doubler().signature());
    // Another major version is refused before anything is created.
    let other = RivetHostApi {
        abi_version: (crate::capi::ABI_MAJOR + 1) << 16,
        ..host(0)
    };
    // SAFETY: as above.
    let e = unsafe { register_in_host(&other, vec![("foreign_test.other".into(), doubler())]) }
        .unwrap_err();
    assert!(
        e.to_string().contains("rebuild it against the same rivet"),
        "{e}"
    );
    assert!(registry::get("foreign_test.other").is_err());
}
