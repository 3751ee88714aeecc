//! The C ABI (`rivet_runtime::capi`) and the XLA FFI handler (`rivet_runtime::xla_ffi`),
//! called exactly as C would: raw structs, raw pointers, return codes. A compiled rivet GEMM
//! and add run through both; every hostile input (NULLs, bad counts, unknown type codes,
//! malformed DLTensors, wrong attributes, unknown dtypes, a metadata query) is an error code
//! or an XLA error with a clear message, never a crash.

use dlpack_rs::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLTensor};
use rivet_compiler::te::{self, compute, placeholder};
use rivet_compiler::{build, Schedule};
use rivet_runtime::capi::*;
use rivet_runtime::xla_ffi::*;
use rivet_runtime::{registry, DType};
use rivet_tests::ffi::{attrs, call_frame, last_error, list, metadata_query};
use std::ffi::{c_char, c_void, CStr, CString};

/// Registers C[i] = A[i] + B[i] (symbolic n, float32) under `name`.
fn register_add(name: &str) {
    let n = te::var("n");
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let b = placeholder([&n], DType::F32, "B").unwrap();
    let c = compute([&n], |[i]| a.at([&i]) + b.at([i]), "C").unwrap();
    let s = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let m = build(&s, &[a, b, c], "cpu", "add").unwrap();
    registry::register(name, m.get_function("add").unwrap(), true).unwrap();
}

fn global(name: &str) -> RivetFunctionHandle {
    let c = CString::new(name).unwrap();
    let mut h: RivetFunctionHandle = std::ptr::null_mut();
    // SAFETY: valid string and out pointer.
    let rc = unsafe { RivetFunctionGetGlobal(c.as_ptr(), &mut h) };
    assert_eq!(rc, RIVET_OK);
    assert!(!h.is_null());
    h
}

fn f32_dl(data: &mut [f32], shape: &mut [i64]) -> DLTensor {
    DLTensor {
        data: data.as_mut_ptr() as *mut c_void,
        device: DLDevice {
            device_type: DLDeviceType::kDLCPU,
            device_id: 0,
        },
        ndim: shape.len() as i32,
        dtype: DLDataType {
            code: DLDataTypeCode::kDLFloat as u8,
            bits: 32,
            lanes: 1,
        },
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

fn call(h: RivetFunctionHandle, args: &[RivetAny]) -> (i32, RivetAny) {
    let mut out = RivetAny::int(12345);
    // SAFETY: args live for the call; out is writable.
    let rc = unsafe { RivetFunctionCall(h, args.as_ptr(), args.len() as i32, &mut out) };
    (rc, out)
}

#[test]
fn compiled_add_runs_in_place_through_the_c_abi() {
    register_add("capi_test.add");
    let h = global("capi_test.add");
    let (mut a, mut b) = (vec![1.0f32, 2.0, 3.0], vec![10.0f32, 20.0, 30.0]);
    let mut c = vec![f32::NAN; 3];
    let (mut sa, mut sb, mut sc) = ([3i64], [3i64], [3i64]);
    let (mut da, mut db, mut dc) = (
        f32_dl(&mut a, &mut sa),
        f32_dl(&mut b, &mut sb),
        f32_dl(&mut c, &mut sc),
    );
    let args = [
        RivetAny::ptr(RIVET_DLTENSOR_READONLY, &mut da as *mut _ as *mut c_void),
        RivetAny::ptr(RIVET_DLTENSOR_READONLY, &mut db as *mut _ as *mut c_void),
        RivetAny::ptr(RIVET_DLTENSOR, &mut dc as *mut _ as *mut c_void),
    ];
    let (rc, out) = call(h, &args);
    assert_eq!(rc, RIVET_OK, "{:?}", last_error());
    assert_eq!(out.type_code, RIVET_NULL);
    assert_eq!(c, vec![11.0, 22.0, 33.0]);

    // Inputs only: the output is allocated and comes back as an owned managed tensor.
    let (rc, mut out) = call(h, &args[..2]);
    assert_eq!(rc, RIVET_OK, "{:?}", last_error());
    assert_eq!(out.type_code, RIVET_MANAGED_TENSOR);
    // SAFETY: a managed tensor result of 3 float32.
    unsafe {
        let m = out.value.v_ptr as *mut dlpack_rs::ffi::DLManagedTensorVersioned;
        let t = &(*m).dl_tensor;
        assert_eq!(*t.shape, 3);
        let got = std::slice::from_raw_parts(t.data as *const f32, 3);
        assert_eq!(got, &[11.0, 22.0, 33.0]);
        assert_eq!(RivetAnyFree(&mut out), RIVET_OK);
    }
    assert_eq!(out.type_code, RIVET_NULL);

    // A read-only tensor as the output is refused, naming the argument.
    let ro = [
        args[0],
        args[1],
        RivetAny::ptr(RIVET_DLTENSOR_READONLY, &mut dc as *mut _ as *mut c_void),
    ];
    let (rc, out) = call(h, &ro);
    assert_eq!(rc, RIVET_ERR_USER);
    assert_eq!(out.type_code, RIVET_NULL);
    let (kind, msg) = last_error();
    assert_eq!(kind, "ReadOnlyError", "{msg}");
    assert!(msg.contains("'C'"), "{msg}");

    // A shape mismatch is a ShapeError.
    let mut short = [2i64];
    let mut dshort = f32_dl(&mut c, &mut short);
    let bad = [
        args[0],
        args[1],
        RivetAny::ptr(RIVET_DLTENSOR, &mut dshort as *mut _ as *mut c_void),
    ];
    assert_eq!(call(h, &bad).0, RIVET_ERR_USER);
    assert_eq!(last_error().0, "ShapeError");
    // SAFETY: a live handle, freed once.
    assert_eq!(unsafe { RivetFunctionFree(h) }, RIVET_OK);
}

#[test]
fn scalars_strings_and_functions_cross_both_ways() {
    let echo = global("testing.echo");
    let (rc, out) = call(echo, &[RivetAny::int(i64::MIN)]);
    assert_eq!((rc, out.type_code), (RIVET_OK, RIVET_INT));
    // SAFETY: an int result.
    assert_eq!(unsafe { out.value.v_int64 }, i64::MIN);
    let (rc, out) = call(echo, &[RivetAny::float(-0.5)]);
    assert_eq!((rc, out.type_code), (RIVET_OK, RIVET_FLOAT));
    // SAFETY: a float result.
    assert_eq!(unsafe { out.value.v_float64 }, -0.5);
    let s = CString::new("héllo").unwrap();
    let (rc, out) = call(echo, &[RivetAny::ptr(RIVET_STR, s.as_ptr() as *mut c_void)]);
    assert_eq!((rc, out.type_code), (RIVET_OK, RIVET_STR));
    // SAFETY: a string result, valid until the next call on this thread.
    let got = unsafe { CStr::from_ptr(out.value.v_ptr as *const c_char) };
    assert_eq!(got.to_str(), Ok("héllo"));
    // A function argument comes back as a new handle that can be called and freed.
    let nop = global("testing.nop");
    let (rc, mut out) = call(echo, &[RivetAny::ptr(RIVET_FUNCTION, nop)]);
    assert_eq!((rc, out.type_code), (RIVET_OK, RIVET_FUNCTION));
    // SAFETY: a function result.
    let again = unsafe { out.value.v_ptr };
    assert_eq!(call(again, &[]).0, RIVET_OK);
    // SAFETY: an owned result, freed once; handles freed once.
    unsafe {
        assert_eq!(RivetAnyFree(&mut out), RIVET_OK);
        assert_eq!(RivetFunctionFree(nop), RIVET_OK);
        assert_eq!(RivetFunctionFree(echo), RIVET_OK);
    }
}

#[test]
fn hostile_calls_are_error_codes_with_messages() {
    let nop = global("testing.nop");
    let mut out = RivetAny::NULL;
    // SAFETY: each call passes deliberately bad but non-dangling pointers.
    unsafe {
        assert_eq!(
            RivetFunctionCall(std::ptr::null_mut(), std::ptr::null(), 0, &mut out),
            RIVET_ERR_USER
        );
        assert!(last_error().1.contains("'func'"), "{:?}", last_error());
        assert_eq!(
            RivetFunctionCall(nop, std::ptr::null(), 3, &mut out),
            RIVET_ERR_USER
        );
        assert!(last_error().1.contains("'args'"), "{:?}", last_error());
        for n in [-1, i32::MIN, MAX_ARGS + 1, i32::MAX] {
            assert_eq!(
                RivetFunctionCall(nop, [RivetAny::NULL].as_ptr(), n, &mut out),
                RIVET_ERR_USER
            );
            assert!(last_error().1.contains("num_args"), "{:?}", last_error());
        }
        assert_eq!(
            RivetFunctionCall(nop, std::ptr::null(), 0, std::ptr::null_mut()),
            RIVET_ERR_USER
        );
        assert!(last_error().1.contains("'result'"));
        let mut h: RivetFunctionHandle = std::ptr::null_mut();
        assert_eq!(
            RivetFunctionGetGlobal(std::ptr::null(), &mut h),
            RIVET_ERR_USER
        );
        let missing = CString::new("capi_test.no_such_function").unwrap();
        assert_eq!(
            RivetFunctionGetGlobal(missing.as_ptr(), &mut h),
            RIVET_ERR_USER
        );
        assert_eq!(last_error().0, "FunctionNotFoundError");
        assert!(h.is_null());
        let bad_utf8 = [0xffu8, 0xfe, 0];
        assert_eq!(
            RivetFunctionGetGlobal(bad_utf8.as_ptr() as *const c_char, &mut h),
            RIVET_ERR_USER
        );
        assert!(last_error().1.contains("UTF-8"));
        assert_eq!(
            RivetFunctionGetGlobal(missing.as_ptr(), std::ptr::null_mut()),
            RIVET_ERR_USER
        );
    }
    for (code, want) in [
        (99, "unknown type code 99"),
        (-1, "unknown type code -1"),
        (i32::MIN, "unknown type code"),
        (RIVET_MANAGED_TENSOR, "for results"),
    ] {
        let (rc, out) = call(nop, &[RivetAny::ptr(code, std::ptr::null_mut())]);
        assert_eq!((rc, out.type_code), (RIVET_ERR_USER, RIVET_NULL));
        let (kind, msg) = last_error();
        assert_eq!(kind, "ArgumentError");
        assert!(msg.contains(want) && msg.contains("argument 0"), "{msg}");
    }
    for code in [
        RIVET_DLTENSOR,
        RIVET_DLTENSOR_READONLY,
        RIVET_STR,
        RIVET_FUNCTION,
    ] {
        assert_eq!(
            call(nop, &[RivetAny::ptr(code, std::ptr::null_mut())]).0,
            RIVET_ERR_USER
        );
        assert!(last_error().1.contains("NULL"), "{:?}", last_error());
    }
    // Malformed DLTensors: the import's validation applies (rank, NULL shape, negative dims,
    // sizes whose byte span overflows).
    let mut data = vec![0f32; 4];
    for (ndim, shape) in [
        (-1, vec![4i64]),
        (65, vec![1; 65]),
        (1, vec![-4]),
        (2, vec![i64::MAX, 2]),
        (2, vec![1 << 62, 1 << 62]),
    ] {
        let mut shape = shape;
        let mut dl = f32_dl(&mut data, &mut shape);
        dl.ndim = ndim;
        let (rc, _) = call(
            nop,
            &[RivetAny::ptr(
                RIVET_DLTENSOR,
                &mut dl as *mut _ as *mut c_void,
            )],
        );
        assert_eq!(rc, RIVET_ERR_USER, "ndim {ndim} shape {shape:?}");
        assert!(last_error().1.contains("argument 0"), "{:?}", last_error());
    }
    let mut shape = [4i64];
    let mut dl = f32_dl(&mut data, &mut shape);
    dl.shape = std::ptr::null_mut();
    assert_eq!(
        call(
            nop,
            &[RivetAny::ptr(
                RIVET_DLTENSOR,
                &mut dl as *mut _ as *mut c_void
            )]
        )
        .0,
        RIVET_ERR_USER
    );
    assert!(last_error().1.contains("NULL shape"));
    // SAFETY: NULL is a no-op for both.
    unsafe {
        assert_eq!(RivetFunctionFree(std::ptr::null_mut()), RIVET_OK);
        assert_eq!(RivetAnyFree(std::ptr::null_mut()), RIVET_OK);
        assert_eq!(RivetFunctionFree(nop), RIVET_OK);
    }
    assert_eq!(RivetAbiVersion() >> 16, ABI_MAJOR);
}

#[test]
fn a_panicking_function_is_an_internal_error_code() {
    registry::register(
        "capi_test.panics",
        rivet_runtime::Function::new("capi_test.panics", |_| panic!("boom")),
        true,
    )
    .unwrap();
    let h = global("capi_test.panics");
    let (rc, out) = call(h, &[]);
    assert_eq!((rc, out.type_code), (RIVET_ERR_INTERNAL, RIVET_NULL));
    let (kind, msg) = last_error();
    assert_eq!(kind, "InternalError");
    assert!(msg.contains("boom"), "{msg}");
    // SAFETY: freed once.
    unsafe { RivetFunctionFree(h) };
}

#[test]
fn a_foreign_error_is_kept_whole_for_its_host_language_to_take_once() {
    use rivet_runtime::{Error, ForeignError};
    use std::sync::Arc;
    registry::register(
        "capi_test.foreign",
        rivet_runtime::Function::new("capi_test.foreign", |_| {
            Err(Error::Foreign(ForeignError {
                message: "Boom: from the callback".into(),
                payload: Arc::new(42u32),
            }))
        }),
        true,
    )
    .unwrap();
    let h = global("capi_test.foreign");
    let (rc, _) = call(h, &[]);
    assert_eq!(rc, RIVET_ERR_USER);
    assert_eq!(
        last_error(),
        ("Error".into(), "Boom: from the callback".into())
    );
    match take_last_foreign_error() {
        Some(Error::Foreign(f)) => assert_eq!(f.payload.downcast_ref::<u32>(), Some(&42)),
        other => panic!("expected the foreign error, got {other:?}"),
    }
    assert!(take_last_foreign_error().is_none(), "taken once");
    // A later ordinary failure leaves nothing foreign behind.
    let (rc, _) = call(h, &[]);
    assert_eq!(rc, RIVET_ERR_USER);
    let add = {
        register_add("capi_test.add_for_foreign");
        global("capi_test.add_for_foreign")
    };
    let (rc, _) = call(add, &[]);
    assert_eq!(rc, RIVET_ERR_USER);
    assert!(take_last_foreign_error().is_none());
    // SAFETY: freed once each.
    unsafe {
        RivetFunctionFree(h);
        RivetFunctionFree(add);
    }
}

// ---- XLA FFI -------------------------------------------------------------------------------

/// A stand-in for XLA's `XLA_FFI_Error_Create`: records the message and code.
unsafe extern "C" fn fake_error_create(args: *mut ErrorCreateArgs) -> *mut c_void {
    // SAFETY: the handler passes valid args with a NUL-terminated message.
    let (msg, errc) = unsafe {
        (
            CStr::from_ptr((*args).message)
                .to_string_lossy()
                .into_owned(),
            (*args).errc,
        )
    };
    Box::into_raw(Box::new((msg, errc))) as *mut c_void
}

fn fake_api() -> Api {
    Api {
        error_create: Some(fake_error_create),
        ..Api::empty()
    }
}

fn buffer(dtype: i32, data: *mut c_void, dims: &mut [i64]) -> Buffer {
    Buffer {
        struct_size: std::mem::size_of::<Buffer>(),
        extension_start: std::ptr::null_mut(),
        dtype,
        data,
        rank: dims.len() as i64,
        dims: dims.as_mut_ptr(),
    }
}

/// Calls the handler with buffers and one attribute (`name` = `value`, a string unless
/// `attr_type` says otherwise); returns the error message, or None for success.
fn run_handler(
    args: &mut [Buffer],
    rets: &mut [Buffer],
    name: &str,
    value: impl AsRef<[u8]>,
    attr_type: i32,
) -> Option<(String, i32)> {
    run_handler_on(
        rivet_xla_ffi_handler,
        &fake_api(),
        args,
        rets,
        name,
        value,
        attr_type,
    )
}

type Handler = unsafe extern "C" fn(*mut CallFrame) -> *mut c_void;

/// `run_handler` with a chosen handler (CPU or CUDA platform) and API table.
fn run_handler_on(
    handler: Handler,
    api: &Api,
    args: &mut [Buffer],
    rets: &mut [Buffer],
    name: &str,
    value: impl AsRef<[u8]>,
    attr_type: i32,
) -> Option<(String, i32)> {
    let value = value.as_ref();
    let mut arg_types = vec![1i32; args.len()];
    let mut arg_items: Vec<*mut c_void> = args
        .iter_mut()
        .map(|b| b as *mut _ as *mut c_void)
        .collect();
    let mut ret_types = vec![1i32; rets.len()];
    let mut ret_items: Vec<*mut c_void> = rets
        .iter_mut()
        .map(|b| b as *mut _ as *mut c_void)
        .collect();
    let mut name_span = ByteSpan {
        ptr: name.as_ptr() as *const c_char,
        len: name.len(),
    };
    let mut value_span = ByteSpan {
        ptr: value.as_ptr() as *const c_char,
        len: value.len(),
    };
    let mut attr_types = [attr_type];
    let mut attr_names = [&mut name_span as *mut ByteSpan];
    let mut attr_values = [&mut value_span as *mut ByteSpan as *mut c_void];
    let mut frame = CallFrame {
        args: list(&mut arg_types, &mut arg_items),
        rets: list(&mut ret_types, &mut ret_items),
        attrs: attrs(&mut attr_types, &mut attr_names, &mut attr_values),
        ..call_frame(api, FAKE_CTX as *mut c_void, 3)
    };
    // SAFETY: a well-formed frame whose pointers outlive the call.
    let err = unsafe { handler(&mut frame) };
    if err.is_null() {
        None
    } else {
        // SAFETY: made by fake_error_create.
        Some(*unsafe { Box::from_raw(err as *mut (String, i32)) })
    }
}

#[test]
fn the_xla_handler_runs_a_compiled_function_on_xla_buffers() {
    register_add("xla_test.add");
    let (mut a, mut b, mut c) = (
        vec![1.0f32, 2.0, 3.0, 4.0],
        vec![0.5f32; 4],
        vec![f32::NAN; 4],
    );
    let (mut da, mut db, mut dc) = ([4i64], [4i64], [4i64]);
    let mut args = [
        buffer(11, a.as_mut_ptr() as *mut c_void, &mut da),
        buffer(11, b.as_mut_ptr() as *mut c_void, &mut db),
    ];
    let mut rets = [buffer(11, c.as_mut_ptr() as *mut c_void, &mut dc)];
    assert_eq!(
        run_handler(&mut args, &mut rets, FUNCTION_ATTR, "xla_test.add", 4),
        None
    );
    assert_eq!(c, vec![1.5, 2.5, 3.5, 4.5]);

    // Hostile and wrong calls: each an XLA error naming the problem.
    let cases: Vec<(&str, &str, i32, &str)> = vec![
        (
            "other_attr",
            "xla_test.add",
            4,
            "no string attribute 'rivet_function'",
        ),
        (FUNCTION_ATTR, "xla_test.add", 3, "must be a string"),
        (FUNCTION_ATTR, "xla_test.nope", 4, "xla_test.nope"),
    ];
    for (name, value, ty, want) in cases {
        let (msg, errc) = run_handler(&mut args, &mut rets, name, value, ty).expect("an error");
        assert!(msg.contains(want), "{msg}");
        assert_eq!(errc, 3, "{msg}");
    }
    // A name that is not UTF-8 (read in place from XLA's bytes, never copied).
    let (msg, errc) =
        run_handler(&mut args, &mut rets, FUNCTION_ATTR, b"xla_test.\xffadd", 4).expect("an error");
    assert!(msg.contains("is not UTF-8"), "{msg}");
    assert_eq!(errc, 3, "{msg}");
    // A result XLA sized wrongly: the function's shape check, not an out-of-bounds write.
    let mut short = [3i64];
    let mut bad_rets = [buffer(11, c.as_mut_ptr() as *mut c_void, &mut short)];
    let (msg, _) = run_handler(&mut args, &mut bad_rets, FUNCTION_ATTR, "xla_test.add", 4).unwrap();
    assert!(
        msg.starts_with("rivet ShapeError") && msg.contains("'C'"),
        "{msg}"
    );
    // A dtype rivet lacks (complex64 = 15) and a wrong dtype (float64 = 12).
    let mut c2 = [4i64];
    let mut odd = [buffer(15, c.as_mut_ptr() as *mut c_void, &mut c2)];
    let (msg, _) = run_handler(&mut args, &mut odd, FUNCTION_ATTR, "xla_test.add", 4).unwrap();
    assert!(
        msg.contains("DTypeError") && msg.contains("element type 15"),
        "{msg}"
    );
    let mut c3 = [2i64];
    let mut wide = [buffer(12, c.as_mut_ptr() as *mut c_void, &mut c3)];
    let (msg, _) = run_handler(&mut args, &mut wide, FUNCTION_ATTR, "xla_test.add", 4).unwrap();
    assert!(msg.contains("DTypeError"), "{msg}");
    // Ranks out of range, NULL dims, sizes whose span overflows.
    for (rank, null_dims, dims) in [
        (-1i64, false, vec![4i64]),
        (65, false, vec![1; 65]),
        (1, true, vec![4]),
        (2, false, vec![i64::MAX, 4]),
        (1, false, vec![-1]),
    ] {
        let mut dims = dims;
        let mut bad = [buffer(11, c.as_mut_ptr() as *mut c_void, &mut dims)];
        bad[0].rank = rank;
        if null_dims {
            bad[0].dims = std::ptr::null_mut();
        }
        let (msg, _) = run_handler(&mut args, &mut bad, FUNCTION_ATTR, "xla_test.add", 4).unwrap();
        assert!(msg.contains("XLA result 0"), "rank {rank}: {msg}");
    }
    // Inputs are read-only views: a function that writes its first argument is refused.
    let sig = rivet_runtime::Signature::new(vec![rivet_runtime::Param::new(
        "y",
        rivet_runtime::ParamKind::Tensor(rivet_runtime::TensorSpec {
            output: true,
            ..Default::default()
        }),
    )]);
    let writer = rivet_runtime::Function::with_signature("xla_test.writer", sig, |_| {
        Ok(rivet_runtime::Value::Null)
    });
    registry::register("xla_test.writer", writer, true).unwrap();
    let mut only = [buffer(11, a.as_mut_ptr() as *mut c_void, &mut da)];
    let (msg, _) = run_handler(&mut only, &mut [], FUNCTION_ATTR, "xla_test.writer", 4).unwrap();
    assert!(
        msg.starts_with("rivet ReadOnlyError") && msg.contains("'y'"),
        "{msg}"
    );
    assert_eq!(a, vec![1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn the_xla_handler_answers_the_metadata_query() {
    let api = fake_api();
    let mut md = Metadata {
        struct_size: std::mem::size_of::<Metadata>(),
        api_version: ApiVersion {
            struct_size: 0,
            extension_start: std::ptr::null_mut(),
            major_version: -1,
            minor_version: -1,
        },
        traits: 77,
        state_type_id: 9,
    };
    let mut ext = MetadataExtension {
        extension_base: ExtensionBase {
            struct_size: std::mem::size_of::<MetadataExtension>(),
            type_: 1,
            next: std::ptr::null_mut(),
        },
        metadata: &mut md,
    };
    let mut frame = metadata_query(&api, &mut ext.extension_base);
    // SAFETY: a well-formed metadata query.
    assert!(unsafe { rivet_xla_ffi_handler(&mut frame) }.is_null());
    assert_eq!(
        (md.api_version.major_version, md.api_version.minor_version),
        (API_MAJOR, API_MINOR)
    );
    assert_eq!(
        (md.traits, md.state_type_id, md.api_version.struct_size),
        (0, 0, 24)
    );
    // A frame too small to be one, and a malformed attribute list: argument errors (XLA's
    // mistake, not rivet's), no reads.
    frame.extension_start = std::ptr::null_mut();
    frame.stage = 3;
    frame.attrs.size = 5; // with NULL arrays
                          // SAFETY: the handler must check the NULL arrays before reading them.
    let err = unsafe { rivet_xla_ffi_handler(&mut frame) };
    // SAFETY: made by fake_error_create.
    let (msg, errc) = *unsafe { Box::from_raw(err as *mut (String, i32)) };
    assert!(
        msg.starts_with("rivet ArgumentError: malformed XLA FFI attributes") && errc == 3,
        "{msg}"
    );
    frame.struct_size = 8;
    // SAFETY: as above.
    let err = unsafe { rivet_xla_ffi_handler(&mut frame) };
    // SAFETY: as above.
    let (msg, _) = *unsafe { Box::from_raw(err as *mut (String, i32)) };
    assert!(msg.contains("struct_size 8"), "{msg}");
    // A NULL frame cannot be reported through XLA: the handler returns without reading it.
    // SAFETY: NULL is checked first.
    assert!(unsafe { rivet_xla_ffi_handler(std::ptr::null_mut()) }.is_null());
}

// ---- The CUDA platform's handler (`rivet_xla_ffi_handler_cuda`) with a stand-in XLA ----

/// The execution context the stand-in XLA expects back in its entries.
const FAKE_CTX: usize = 0x5eed;
/// The stream and device ordinal the stand-in XLA hands out.
const FAKE_STREAM: usize = 0x7f00_dead_b000;
const FAKE_ORDINAL: i32 = 3;

/// An error made by the stand-in XLA: its message, and a count of destroyed errors.
static XLA_ERRORS_DESTROYED: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn fake_stream_get(args: *mut StreamGetArgs) -> *mut c_void {
    // SAFETY: the handler passes valid args.
    let args = unsafe { &mut *args };
    assert_eq!(
        args.ctx as usize, FAKE_CTX,
        "the handler passes XLA's context on"
    );
    assert!(args.struct_size >= std::mem::size_of::<StreamGetArgs>());
    args.stream = FAKE_STREAM as *mut c_void;
    std::ptr::null_mut()
}

unsafe extern "C" fn failing_stream_get(_: *mut StreamGetArgs) -> *mut c_void {
    Box::into_raw(Box::new(CString::new("stream went away").unwrap())) as *mut c_void
}

unsafe extern "C" fn fake_ordinal_get(args: *mut DeviceOrdinalGetArgs) -> *mut c_void {
    // SAFETY: the handler passes valid args.
    let args = unsafe { &mut *args };
    assert_eq!(args.ctx as usize, FAKE_CTX);
    args.device_ordinal = FAKE_ORDINAL;
    std::ptr::null_mut()
}

unsafe extern "C" fn negative_ordinal_get(args: *mut DeviceOrdinalGetArgs) -> *mut c_void {
    // SAFETY: as above.
    unsafe { (*args).device_ordinal = -7 };
    std::ptr::null_mut()
}

unsafe extern "C" fn fake_get_message(args: *mut ErrorGetMessageArgs) {
    // SAFETY: the error is one of `failing_stream_get`'s.
    unsafe { (*args).message = (*((*args).error as *const CString)).as_ptr() };
}

unsafe extern "C" fn fake_destroy(args: *mut ErrorDestroyArgs) {
    // SAFETY: as above; freed once.
    drop(unsafe { Box::from_raw((*args).error as *mut CString) });
    XLA_ERRORS_DESTROYED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

fn fake_cuda_api() -> Api {
    Api {
        error_create: Some(fake_error_create),
        error_get_message: Some(fake_get_message),
        error_destroy: Some(fake_destroy),
        stream_get: Some(fake_stream_get),
        device_ordinal_get: Some(fake_ordinal_get),
        ..Api::empty()
    }
}

/// What the probe function saw in its last call: each tensor's device and read-only flag, and
/// the call stream.
type Seen = (Vec<(rivet_runtime::Device, bool)>, Option<u64>);
static SEEN: std::sync::Mutex<Option<Seen>> = std::sync::Mutex::new(None);

/// Registers a function of one input and one output on any device that records what it was
/// called with (it never touches the memory: the buffers of these tests are not on a GPU).
fn register_probe(name: &str) {
    let spec = |output| {
        rivet_runtime::ParamKind::Tensor(rivet_runtime::TensorSpec {
            output,
            device: rivet_runtime::DeviceSpec::Any,
            ..Default::default()
        })
    };
    let sig = rivet_runtime::Signature::new(vec![
        rivet_runtime::Param::new("x", spec(false)),
        rivet_runtime::Param::new("y", spec(true)),
    ]);
    let probe = rivet_runtime::Function::with_signature(name, sig, |args| {
        let tensors = args
            .iter()
            .map(|a| {
                let t = a.as_tensor().expect("tensors");
                (t.device(), t.is_read_only())
            })
            .collect();
        *SEEN.lock().unwrap() = Some((tensors, rivet_runtime::stream::call_stream()));
        Ok(rivet_runtime::Value::Null)
    });
    registry::register(name, probe, true).unwrap();
}

#[test]
fn the_cuda_handler_runs_on_xlas_device_and_stream() {
    register_probe("xla_cuda_test.probe");
    // Device pointers are only carried, never dereferenced, by the handler and the probe.
    let (x, y) = (0x7000_0000_0000usize, 0x7000_0001_0000usize);
    let (mut dx, mut dy) = ([2i64, 3], [2i64, 3]);
    let mut args = [buffer(11, x as *mut c_void, &mut dx)];
    let mut rets = [buffer(11, y as *mut c_void, &mut dy)];
    let api = fake_cuda_api();
    let run = |api: &Api, args: &mut [Buffer], rets: &mut [Buffer], f: &str| {
        run_handler_on(
            rivet_xla_ffi_handler_cuda,
            api,
            args,
            rets,
            FUNCTION_ATTR,
            f,
            4,
        )
    };
    assert_eq!(run(&api, &mut args, &mut rets, "xla_cuda_test.probe"), None);
    let seen = SEEN.lock().unwrap().take().expect("the probe ran");
    let cuda = rivet_runtime::Device::Cuda(FAKE_ORDINAL);
    assert_eq!(
        seen,
        (vec![(cuda, true), (cuda, false)], Some(FAKE_STREAM as u64))
    );
    assert_eq!(
        rivet_runtime::stream::call_stream(),
        None,
        "the call stream is XLA's for the call only"
    );
    // The CPU handler hands the probe host views and no stream.
    let mut hx = [1.0f32; 6];
    let mut hy = [0.0f32; 6];
    let mut hargs = [buffer(11, hx.as_mut_ptr() as *mut c_void, &mut dx)];
    let mut hrets = [buffer(11, hy.as_mut_ptr() as *mut c_void, &mut dy)];
    assert_eq!(
        run_handler(
            &mut hargs,
            &mut hrets,
            FUNCTION_ATTR,
            "xla_cuda_test.probe",
            4
        ),
        None
    );
    let seen = SEEN.lock().unwrap().take().expect("the probe ran");
    let cpu = rivet_runtime::Device::Cpu;
    assert_eq!(seen, (vec![(cpu, true), (cpu, false)], None));

    // A CPU-built function on XLA's CUDA platform: its device check names the argument, and
    // nothing is read (the pointers are not host memory).
    register_add("xla_cuda_test.add_cpu");
    let (mut da, mut db) = ([4i64], [4i64]);
    let mut dc = [4i64];
    let mut add_args = [
        buffer(11, x as *mut c_void, &mut da),
        buffer(11, y as *mut c_void, &mut db),
    ];
    let mut add_rets = [buffer(11, (y + 64) as *mut c_void, &mut dc)];
    let (msg, errc) = run(&api, &mut add_args, &mut add_rets, "xla_cuda_test.add_cpu").unwrap();
    assert!(
        msg.starts_with("rivet DeviceError")
            && msg.contains("'A'")
            && msg.contains("expected a CPU tensor, got one on cuda:3"),
        "{msg}"
    );
    assert_eq!(errc, 3);

    // A CUDA-built function on XLA's CPU platform: "built for 'cuda'", before any launch.
    let n = te::var("n");
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let b = placeholder([&n], DType::F32, "B").unwrap();
    let c = compute([&n], |[i]| a.at([&i]) + b.at([i]), "C").unwrap();
    let s = Schedule::new(std::slice::from_ref(&c)).unwrap();
    let m = build(&s, &[a, b, c], "cuda", "add").unwrap();
    registry::register(
        "xla_cuda_test.add_cuda",
        m.get_function("add").unwrap(),
        true,
    )
    .unwrap();
    let (mut ha, mut hb, mut hc) = ([1.0f32; 4], [2.0f32; 4], [f32::NAN; 4]);
    let mut host_args = [
        buffer(11, ha.as_mut_ptr() as *mut c_void, &mut da),
        buffer(11, hb.as_mut_ptr() as *mut c_void, &mut db),
    ];
    let mut host_rets = [buffer(11, hc.as_mut_ptr() as *mut c_void, &mut dc)];
    let (msg, _) = run_handler(
        &mut host_args,
        &mut host_rets,
        FUNCTION_ATTR,
        "xla_cuda_test.add_cuda",
        4,
    )
    .unwrap();
    assert!(
        msg.starts_with("rivet DeviceError") && msg.contains("built for 'cuda'"),
        "{msg}"
    );
    assert!(hc.iter().all(|v| v.is_nan()), "nothing was written");
}

#[test]
fn the_cuda_handler_reports_what_xla_cannot_give() {
    register_probe("xla_cuda_test.probe2");
    let (mut dx, mut dy) = ([5i64], [5i64]);
    let mut args = [buffer(11, 0x9000_0000usize as *mut c_void, &mut dx)];
    let mut rets = [buffer(11, 0x9100_0000usize as *mut c_void, &mut dy)];
    let mut run = |api: &Api| {
        run_handler_on(
            rivet_xla_ffi_handler_cuda,
            api,
            &mut args,
            &mut rets,
            FUNCTION_ATTR,
            "xla_cuda_test.probe2",
            4,
        )
        .expect("an error")
    };
    // XLA's stream query fails: its message comes through and its error is destroyed once.
    let before = XLA_ERRORS_DESTROYED.load(std::sync::atomic::Ordering::SeqCst);
    let (msg, _) = run(&Api {
        stream_get: Some(failing_stream_get),
        ..fake_cuda_api()
    });
    assert!(
        msg.contains("rivet DeviceError: XLA_FFI_Stream_Get failed: stream went away"),
        "{msg}"
    );
    assert_eq!(
        XLA_ERRORS_DESTROYED.load(std::sync::atomic::Ordering::SeqCst),
        before + 1
    );
    // An older XLA whose table ends before DeviceOrdinal_Get: the entry past its size is never
    // read (here it is set, and must still be ignored).
    let (msg, _) = run(&Api {
        struct_size: std::mem::offset_of!(Api, device_ordinal_get),
        ..fake_cuda_api()
    });
    assert!(
        msg.contains("has no XLA_FFI_DeviceOrdinal_Get") && msg.contains("newer jaxlib"),
        "{msg}"
    );
    // A table too short for Stream_Get, and one holding NULL there.
    let (msg, _) = run(&Api {
        struct_size: std::mem::offset_of!(Api, stream_get),
        ..fake_cuda_api()
    });
    assert!(msg.contains("has no XLA_FFI_DeviceOrdinal_Get"), "{msg}");
    let (msg, _) = run(&Api {
        stream_get: None,
        ..fake_cuda_api()
    });
    assert!(msg.contains("has no XLA_FFI_Stream_Get"), "{msg}");
    // A negative ordinal is XLA's bug: a device error naming it (InternalError is rivet's).
    let (msg, errc) = run(&Api {
        device_ordinal_get: Some(negative_ordinal_get),
        ..fake_cuda_api()
    });
    assert!(
        msg.starts_with("rivet DeviceError") && msg.contains("device ordinal -7") && errc == 3,
        "{msg}"
    );
}

/// The Python package ships a copy of the C header (its torch bridge compiles against it, and
/// an installed wheel has no `runtime/` folder): the copy is the header, byte for byte. After
/// a change to the header, copy it to `bindings/python/rivet/include/rivet/c_api.h`.
#[test]
fn the_python_package_ships_the_c_header_unchanged() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let read = |p: &str| std::fs::read(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    assert!(
        read("runtime/include/rivet/c_api.h") == read("bindings/python/rivet/include/rivet/c_api.h"),
        "bindings/python/rivet/include/rivet/c_api.h differs from runtime/include/rivet/c_api.h: copy the header there"
    );
}
