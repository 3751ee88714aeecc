//! Host callbacks in kernels (`te::extern_`, `Stage::debug_tap`; `ir::callback`): results
//! against the same maths written as compute stages, on the interpreter and the CPU backend;
//! the order callbacks run in; errors (the callback's own, a wrong shape, dtype or value
//! returned) and the function working again after them; the places a callback may not stand
//! (a parallel loop, CUDA); saved modules; a view kept by a callback after it returned.

use rivet_compiler::ir::{Expr, ForKind, Stmt, Var};
use rivet_compiler::te::{self, compute, placeholder, CallbackFn, Tensor as TeTensor};
use rivet_compiler::{build, Error as CError, Module, Schedule, Target, ToTarget};
use rivet_runtime::{DType, Error as RtError, Function, Tensor, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 7) % 17) as f32 * 0.25 - 2.0
        })
        .collect()
}

fn arg(v: &Value, k: usize) -> Result<&Tensor, RtError> {
    v.as_tensor()
        .ok_or_else(|| RtError::Argument(format!("argument {k} is not a tensor")))
}

/// Writes `vals` into `out` (a compact, writable float32 tensor of as many elements).
fn fill(out: &Tensor, vals: &[f32]) -> Result<(), RtError> {
    if out.is_read_only() || !out.is_compact() || out.numel() as usize != vals.len() {
        return Err(RtError::Argument(format!("bad output {out:?}")));
    }
    // SAFETY: `out` is a compact, writable float32 tensor of `vals.len()` elements (checked).
    unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), out.data_ptr() as *mut f32, vals.len()) };
    Ok(())
}

/// `out = b * b - a`, written in place (`returns == false`) or returned as a new tensor.
fn square_minus(returns: bool) -> Function {
    Function::new("square_minus", move |args| {
        let [b, a, out] = args else {
            return Err(RtError::Argument(format!(
                "3 arguments, got {}",
                args.len()
            )));
        };
        let (b, a, out) = (arg(b, 0)?, arg(a, 1)?, arg(out, 2)?);
        if !b.is_read_only() || !a.is_read_only() {
            return Err(RtError::Argument("inputs must be read-only".into()));
        }
        let (bv, av) = (b.to_vec::<f32>()?, a.to_vec::<f32>()?);
        let vals: Vec<f32> = bv.iter().zip(&av).map(|(b, a)| b * b - a).collect();
        if returns {
            Ok(Value::Tensor(Tensor::from_slice(&vals, b.shape())?))
        } else {
            fill(out, &vals)?;
            Ok(Value::Null)
        }
    })
}

/// The program `B = 2A + 1; E = f(B, A); C = 3E + B`, with `E` an extern stage of `f` or
/// (`f == None`) the compute `B * B - A`. Returns (A, B, E, C).
fn program(f: Option<CallbackFn>) -> (TeTensor, TeTensor, TeTensor, TeTensor) {
    let (n, m) = (te::var("n"), te::var("m"));
    let a = placeholder([&n, &m], DType::F32, "A").unwrap();
    let b = compute([&n, &m], |[i, j]| a.at([i, j]) * 2.0 + 1.0, "B").unwrap();
    let e = match f {
        Some(f) => te::extern_(
            &[n.clone(), m.clone()],
            &[b.clone(), a.clone()],
            f,
            DType::F32,
            "E",
        )
        .unwrap(),
        None => compute(
            [&n, &m],
            |[i, j]| b.at([&i, &j]) * b.at([&i, &j]) - a.at([i, j]),
            "E",
        )
        .unwrap(),
    };
    let c = compute([n, m], |[i, j]| e.at([&i, &j]) * 3.0 + b.at([i, j]), "C").unwrap();
    (a, b, e, c)
}

fn run(f: &Function, a: &[f32], shape: &[i64]) -> Result<Vec<f32>, RtError> {
    let ta = Tensor::from_slice(a, shape).unwrap();
    let out = f.call(&[Value::Tensor(ta)])?;
    out.as_tensor().unwrap().to_vec::<f32>()
}

fn built<T: ToTarget + ?Sized>(s: &Schedule, args: &[TeTensor], target: &T) -> Function {
    build(s, args, target, "f")
        .unwrap()
        .get_function("f")
        .unwrap()
}

fn extern_stages_compute_what_the_same_maths_as_computes_does(target: &Target) {
    let (ra, _, _, rc) = program(None);
    let reference = built(
        &Schedule::new(&[rc.clone()]).unwrap(),
        &[ra.clone(), rc.clone()],
        target,
    );
    for returns in [false, true] {
        let (a, _, _, c) = program(Some(CallbackFn::Function(square_minus(returns))));
        let f = built(&Schedule::new(&[c.clone()]).unwrap(), &[a, c], target);
        // Small (the lock kept, serial) and large (parallel loops around the callback).
        for shape in [[3i64, 5], [1, 1], [0, 4], [300, 130]] {
            let x = data((shape[0] * shape[1]) as usize, 7);
            let got = run(&f, &x, &shape).unwrap();
            let want = run(&reference, &x, &shape).unwrap();
            assert_eq!(got, want, "{target} returns={returns} {shape:?}");
        }
    }
}

fn an_extern_stage_can_be_an_output_written_through_strides(target: &Target) {
    let (n, m) = (te::var("n"), te::var("m"));
    let a = placeholder(&[n.clone(), m.clone()], DType::F32, "A").unwrap();
    let e = te::extern_(
        &[n, m],
        &[a.clone()],
        CallbackFn::Function(neg()),
        DType::F32,
        "E",
    )
    .unwrap();
    let f = built(
        &Schedule::new(&[e.clone()]).unwrap(),
        &[a.clone(), e.clone()],
        target,
    );
    let x = data(12, 3);
    let ta = Tensor::from_slice(&x, &[3, 4]).unwrap();
    // A transposed view of a (4, 3) buffer as the (3, 4) output.
    let base = Tensor::zeros(&[4, 3], DType::F32).unwrap();
    let out = base.as_strided(&[3, 4], &[1, 3], 0).unwrap();
    f.call(&[Value::Tensor(ta), Value::Tensor(out.clone())])
        .unwrap();
    let want: Vec<f32> = x.iter().map(|v| -v).collect();
    assert_eq!(out.to_vec::<f32>().unwrap(), want, "{target}");
}

/// An extern stage's function: its output is minus its one input.
fn neg() -> Function {
    Function::new("neg", |args| {
        let x = arg(&args[0], 0)?.to_vec::<f32>()?;
        fill(arg(&args[1], 1)?, &x.iter().map(|v| -v).collect::<Vec<_>>())?;
        Ok(Value::Null)
    })
}

/// A function that logs `name` and returns None (a tap, or an extern that leaves zeros).
fn logger(
    log: &Arc<Mutex<Vec<String>>>,
    name: &str,
    seen: Option<Arc<Mutex<Vec<f32>>>>,
) -> Function {
    let (log, name2) = (log.clone(), name.to_string());
    Function::new(name, move |args| {
        log.lock().unwrap().push(name2.clone());
        if let Some(seen) = &seen {
            let t = arg(&args[0], 0)?;
            if !t.is_read_only() {
                return Err(RtError::Argument("a tap's view must be read-only".into()));
            }
            *seen.lock().unwrap() = t.to_vec::<f32>()?;
        }
        Ok(Value::Null)
    })
}

fn callbacks_and_taps_run_once_per_call_in_stage_order_and_taps_change_nothing(target: &Target) {
    let (ra, _, _, rc) = program(None);
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen_b = Arc::new(Mutex::new(Vec::new()));
    let inner = square_minus(false);
    let log2 = log.clone();
    let ext = Function::new("ext", move |args| {
        log2.lock().unwrap().push("E".to_string());
        inner.call(args)
    });
    let (a, b, _, c) = program(Some(CallbackFn::Function(ext)));
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    s.stage(&c)
        .unwrap()
        .debug_tap(CallbackFn::Function(logger(&log, "tapC", None)))
        .unwrap();
    s.stage(&b)
        .unwrap()
        .debug_tap(CallbackFn::Function(logger(
            &log,
            "tapB1",
            Some(seen_b.clone()),
        )))
        .unwrap();
    s.stage(&b)
        .unwrap()
        .debug_tap(CallbackFn::Function(logger(&log, "tapB2", None)))
        .unwrap();
    let f = built(&s, &[a, c], target);
    let reference = built(
        &Schedule::new(&[rc.clone()]).unwrap(),
        &[ra.clone(), rc.clone()],
        target,
    );
    for (k, shape) in [[4i64, 6], [200, 120]].iter().enumerate() {
        let x = data((shape[0] * shape[1]) as usize, 11 + k as u32);
        assert_eq!(
            run(&f, &x, shape).unwrap(),
            run(&reference, &x, shape).unwrap()
        );
        let want_b: Vec<f32> = x.iter().map(|v| v * 2.0 + 1.0).collect();
        assert_eq!(*seen_b.lock().unwrap(), want_b, "{target}: the tap saw B");
    }
    let order = ["tapB1", "tapB2", "E", "tapC"];
    let want: Vec<String> = order.iter().chain(&order).map(|s| s.to_string()).collect();
    assert_eq!(*log.lock().unwrap(), want, "{target}");
}

/// An extern stage whose callback fails while `fail` is set, else writes `B * B - A`.
fn failing(fail: Arc<AtomicBool>, err: fn() -> RtError) -> Function {
    let inner = square_minus(false);
    Function::new("sometimes", move |args| {
        if fail.load(Ordering::SeqCst) {
            return Err(err());
        }
        inner.call(args)
    })
}

fn a_callback_error_comes_out_unchanged_and_the_function_works_after_it(target: &Target) {
    let (ra, _, _, rc) = program(None);
    let fail = Arc::new(AtomicBool::new(true));
    let (a, _, _, c) = program(Some(CallbackFn::Function(failing(fail.clone(), || {
        RtError::Registry("boom 42".into())
    }))));
    let f = built(&Schedule::new(&[c.clone()]).unwrap(), &[a, c], target);
    let reference = built(
        &Schedule::new(&[rc.clone()]).unwrap(),
        &[ra.clone(), rc.clone()],
        target,
    );
    for shape in [[2i64, 3], [300, 100]] {
        let x = data((shape[0] * shape[1]) as usize, 5);
        fail.store(true, Ordering::SeqCst);
        match run(&f, &x, &shape) {
            Err(RtError::Registry(m)) => assert_eq!(m, "boom 42"),
            other => panic!("{target}: expected the callback's error, got {other:?}"),
        }
        fail.store(false, Ordering::SeqCst);
        assert_eq!(
            run(&f, &x, &shape).unwrap(),
            run(&reference, &x, &shape).unwrap()
        );
    }
}

fn a_panicking_rust_callback_is_an_error_not_an_abort(target: &Target) {
    let (a, _, _, c) = program(Some(CallbackFn::Function(Function::new("p", |_| {
        panic!("callback panics")
    }))));
    let f = built(&Schedule::new(&[c.clone()]).unwrap(), &[a, c], target);
    let e = run(&f, &[1.0; 4], &[2, 2]).unwrap_err();
    assert!(e.to_string().contains("callback panics"), "{target}: {e}");
    // And the function works again (no state left behind by the caught panic).
    let _ = run(&f, &[1.0; 4], &[2, 2]).unwrap_err();
}

/// Makes the value a test callback returns.
type MakeValue = fn() -> Value;

fn returning(v: MakeValue) -> Function {
    Function::new("returns", move |_| Ok(v()))
}

fn a_wrong_result_is_a_shape_dtype_or_argument_error_naming_the_stage(target: &Target) {
    let cases: [(MakeValue, &str); 4] = [
        (
            || Value::Tensor(Tensor::zeros(&[2, 4], DType::F32).unwrap()),
            "shape",
        ),
        (
            || Value::Tensor(Tensor::zeros(&[3], DType::F32).unwrap()),
            "shape",
        ),
        (
            || Value::Tensor(Tensor::zeros(&[2, 3], DType::F64).unwrap()),
            "dtype",
        ),
        (|| Value::Int(3), "argument"),
    ];
    for (v, kind) in cases {
        let (a, _, _, c) = program(Some(CallbackFn::Function(returning(v))));
        let f = built(&Schedule::new(&[c.clone()]).unwrap(), &[a, c], target);
        let e = run(&f, &data(6, 1), &[2, 3]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("extern stage 'E'"), "{msg}");
        match (kind, &e) {
            ("shape", RtError::Shape(_)) => {
                assert!(msg.contains("expected shape [2, 3]"), "{msg}")
            }
            ("dtype", RtError::DType(_)) => {
                assert!(
                    msg.contains("float64") && msg.contains("expected dtype float32"),
                    "{msg}"
                )
            }
            ("argument", RtError::Argument(_)) => {
                assert!(msg.contains("returned a int"), "{msg}")
            }
            _ => panic!("{target} {kind}: got {e:?}"),
        }
    }
}

#[test]
fn callbacks_never_stand_inside_a_loop() {
    let (a, _, e, c) = program(Some(CallbackFn::Function(square_minus(false))));
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    let i = c.axis()[0].var.clone();
    s.stage(&c).unwrap().parallel(&i).unwrap();
    // compute_at of the extern stage into C's parallel loop: refused.
    let err = s.compute_at(&e, &c, &i).unwrap_err();
    assert!(matches!(err, CError::Compile(_)), "{err:?}");
    assert!(err.to_string().contains("never inside a loop"), "{err}");
    // A tapped stage cannot be inlined or moved into a loop either.
    let (a2, b2, _, c2) = program(Some(CallbackFn::Function(square_minus(false))));
    let mut s2 = Schedule::new(&[c2.clone()]).unwrap();
    s2.stage(&b2)
        .unwrap()
        .debug_tap(CallbackFn::Function(returning(|| Value::Null)))
        .unwrap();
    assert!(matches!(s2.compute_inline(&b2), Err(CError::Compile(_))));
    // A function whose callback was moved into a parallel loop (a crafted IR): the verifier
    // refuses it with a CompileError when it is compiled.
    let m = build(&s, &[a.clone(), c.clone()], "cpu", "f").unwrap();
    let mut nest = m.funcs[0].nest.clone();
    nest.body = nest.body.rewrite(&mut |e| e.clone(), &mut |s| match s {
        Stmt::Call { .. } => Stmt::For {
            var: Var::new("p"),
            min: rivet_compiler::ir::Expr::int(0),
            extent: rivet_compiler::ir::Expr::int(2),
            kind: ForKind::Parallel,
            body: Box::new(s),
        },
        other => other,
    });
    for target in rivet_tests::backends() {
        match rivet_compiler::build::compile_loaded(nest.clone(), &target) {
            Err(CError::Compile(m)) => {
                assert!(
                    m.contains("stage 'E'") && m.contains("Parallel loop 'p'"),
                    "{m}"
                )
            }
            Err(other) => panic!("{target}: {other:?}"),
            Ok(_) => panic!("{target}: a callback inside a parallel loop was compiled"),
        }
    }
    // The default CPU schedule (parallel outer loops) keeps callbacks at the top level.
    let f = built(&Schedule::new(&[c2.clone()]).unwrap(), &[a2, c2], "cpu");
    let x = data(400 * 90, 2);
    assert_eq!(run(&f, &x, &[400, 90]).unwrap().len(), 400 * 90);
}

#[test]
fn cuda_builds_refuse_host_callbacks() {
    let (a, b, _, c) = program(Some(CallbackFn::Function(square_minus(false))));
    let err = build(
        &Schedule::new(&[c.clone()]).unwrap(),
        &[a.clone(), c.clone()],
        "cuda",
        "f",
    )
    .err()
    .expect("refused");
    assert!(matches!(err, CError::Compile(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("host callbacks in device code are not supported"),
        "{err}"
    );
    // A tap alone too.
    let (a2, b2, _, c2) = program(None);
    let mut s = Schedule::new(&[c2.clone()]).unwrap();
    s.stage(&b2)
        .unwrap()
        .debug_tap(CallbackFn::Function(returning(|| Value::Null)))
        .unwrap();
    let err = build(&s, &[a2, c2], "cuda", "f").err().expect("refused");
    assert!(err.to_string().contains("stage 'B'"), "{err}");
    let _ = b;
}

#[test]
fn saved_modules_find_registered_callbacks_by_name_and_refuse_bare_functions() {
    let name = "tests.callbacks.square_minus";
    rivet_runtime::registry::register(name, square_minus(false), true).unwrap();
    let (ra, _, _, rc) = program(None);
    let (a, _, _, c) = program(Some(CallbackFn::Registered(name.into())));
    let m = build(&Schedule::new(&[c.clone()]).unwrap(), &[a, c], "cpu", "f").unwrap();
    let bytes = m.to_bytes().unwrap();
    let loaded = Module::from_bytes(&bytes, "<test>").unwrap();
    let f = loaded.get_function("f").unwrap();
    let reference = built(&Schedule::new(&[rc.clone()]).unwrap(), &[ra, rc], "cpu");
    let x = data(35, 9);
    assert_eq!(
        run(&f, &x, &[5, 7]).unwrap(),
        run(&reference, &x, &[5, 7]).unwrap()
    );
    // Not registered in the loading process: a clear error naming it.
    assert!(rivet_runtime::registry::remove(name));
    let err = Module::from_bytes(&bytes, "<test>").err().expect("refused");
    assert!(
        err.to_string().contains(name) && err.to_string().contains("not registered"),
        "{err}"
    );
    // An unknown name when building.
    let err = te::extern_(
        &[te::var("n")],
        &[],
        CallbackFn::Registered("tests.callbacks.none".into()),
        DType::F32,
        "X",
    )
    .unwrap_err();
    assert!(err.to_string().contains("tests.callbacks.none"), "{err}");
    // A bare function cannot be saved.
    let (a, _, _, c) = program(Some(CallbackFn::Function(square_minus(false))));
    let m = build(&Schedule::new(&[c.clone()]).unwrap(), &[a, c], "cpu", "f").unwrap();
    let err = m.to_bytes().unwrap_err();
    assert!(
        err.to_string().contains("stage 'E'") && err.to_string().contains("register"),
        "{err}"
    );
}

fn a_view_kept_by_a_callback_stays_valid_after_the_call(target: &Target) {
    let kept: Arc<Mutex<Vec<(Tensor, Tensor)>>> = Arc::new(Mutex::new(Vec::new()));
    let (k2, inner) = (kept.clone(), square_minus(false));
    let keeper = Function::new("keeper", move |args| {
        inner.call(args)?;
        let (input, out) = (arg(&args[0], 0)?.clone(), arg(&args[2], 2)?.clone());
        k2.lock().unwrap().push((input, out));
        Ok(Value::Null)
    });
    let (a, _, _, c) = program(Some(CallbackFn::Function(keeper)));
    let f = built(&Schedule::new(&[c.clone()]).unwrap(), &[a, c], target);
    let x1 = data(2000, 1);
    let x2 = data(2000, 2);
    run(&f, &x1, &[40, 50]).unwrap();
    run(&f, &x2, &[40, 50]).unwrap();
    // Both calls' views: still their own values (B = 2x + 1, E = B * B - x), although the
    // kernel's temporaries were freed or reused in between.
    let kept = kept.lock().unwrap();
    for ((input, out), x) in kept.iter().zip([&x1, &x2]) {
        let b: Vec<f32> = x.iter().map(|v| v * 2.0 + 1.0).collect();
        let e: Vec<f32> = b.iter().zip(x.iter()).map(|(b, a)| b * b - a).collect();
        assert_eq!(input.to_vec::<f32>().unwrap(), b, "{target}");
        assert_eq!(out.to_vec::<f32>().unwrap(), e, "{target}");
    }
}

fn checked_mode_runs_callbacks_on_every_backend_empty_tensors_included(target: &Target) {
    let (ra, _, _, rc) = program(None);
    let opts = rivet_compiler::build::Options {
        checked: true,
        ..rivet_compiler::build::Options::from_env()
    };
    let (a, b, _, c) = program(Some(CallbackFn::Function(square_minus(false))));
    let mut s = Schedule::new(&[c.clone()]).unwrap();
    s.stage(&b)
        .unwrap()
        .debug_tap(CallbackFn::Function(returning(|| Value::Null)))
        .unwrap();
    let f = rivet_compiler::build::build_with(&s, &[a, c], target, "f", opts)
        .unwrap()
        .get_function("f")
        .unwrap();
    let reference = built(
        &Schedule::new(&[rc.clone()]).unwrap(),
        &[ra.clone(), rc.clone()],
        target,
    );
    for shape in [[0i64, 3], [3, 0], [5, 4]] {
        let x = data((shape[0] * shape[1]) as usize, 4);
        assert_eq!(
            run(&f, &x, &shape).unwrap(),
            run(&reference, &x, &shape).unwrap(),
            "{target} {shape:?}"
        );
    }
}

fn several_extern_stages_run_in_producer_order_each_once(target: &Target) {
    let log = Arc::new(Mutex::new(Vec::new()));
    // E1 = A + 1 (extern), B = 2 * E1 (compute), E2 = B - E1 (extern, the output).
    let logged = |name: &'static str, f: fn(&[Vec<f32>]) -> Vec<f32>| {
        let log = log.clone();
        Function::new(name, move |args| {
            log.lock().unwrap().push(name.to_string());
            let ins = args[..args.len() - 1]
                .iter()
                .enumerate()
                .map(|(k, v)| arg(v, k)?.to_vec::<f32>())
                .collect::<Result<Vec<_>, _>>()?;
            fill(arg(&args[args.len() - 1], args.len() - 1)?, &f(&ins))?;
            Ok(Value::Null)
        })
    };
    let n = te::var("n");
    let a = placeholder([&n], DType::F32, "A").unwrap();
    let e1 = te::extern_(
        &[n.clone()],
        &[a.clone()],
        CallbackFn::Function(logged("E1", |x| x[0].iter().map(|v| v + 1.0).collect())),
        DType::F32,
        "E1",
    )
    .unwrap();
    let b = compute([&n], |[i]| e1.at([i]) * 2.0, "B").unwrap();
    let e2 = te::extern_(
        &[n],
        &[b.clone(), e1.clone()],
        CallbackFn::Function(logged("E2", |x| {
            x[0].iter().zip(&x[1]).map(|(b, e)| b - e).collect()
        })),
        DType::F32,
        "E2",
    )
    .unwrap();
    log.lock().unwrap().clear();
    let mut s = Schedule::new(&[e2.clone()]).unwrap();
    s.stage(&b)
        .unwrap()
        .debug_tap(CallbackFn::Function(logger(&log, "tapB", None)))
        .unwrap();
    let f = built(&s, &[a.clone(), e2.clone()], target);
    for _ in 0..2 {
        let x = data(33, 8);
        let ta = Tensor::from_slice(&x, &[33]).unwrap();
        let got = f.call(&[Value::Tensor(ta)]).unwrap();
        let want: Vec<f32> = x.iter().map(|v| (v + 1.0) * 2.0 - (v + 1.0)).collect();
        assert_eq!(
            got.as_tensor().unwrap().to_vec::<f32>().unwrap(),
            want,
            "{target}"
        );
    }
    let want: Vec<String> = ["E1", "tapB", "E2", "E1", "tapB", "E2"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(*log.lock().unwrap(), want, "{target}");
}

#[test]
fn crafted_module_files_with_bad_callbacks_are_clear_errors() {
    let name = "tests.callbacks.crafted";
    rivet_runtime::registry::register(name, square_minus(false), true).unwrap();
    let (a, _, _, c) = program(Some(CallbackFn::Registered(name.into())));
    let m = build(&Schedule::new(&[c.clone()]).unwrap(), &[a, c], "cpu", "f").unwrap();
    let bytes = m.to_bytes().unwrap();
    const HEADER: usize = 24;
    let json = String::from_utf8(bytes[HEADER..].to_vec()).unwrap();
    let reframe = |j: &str| {
        let mut out = bytes[..HEADER].to_vec();
        out[12..20].copy_from_slice(&(j.len() as u64).to_le_bytes());
        out[20..24].copy_from_slice(&crc32fast::hash(j.as_bytes()).to_le_bytes());
        out.extend_from_slice(j.as_bytes());
        out
    };
    assert!(Module::from_bytes(&reframe(&json), "<ok>").is_ok());
    let edits: [(&str, &str); 4] = [
        ("{\"Callback\":0}", "{\"Callback\":7}"),
        ("\"kind\":\"Extern\"", "\"kind\":\"Tap\""),
        ("\"write\":true", "\"write\":false"),
        (name, "tests.callbacks.nobody"),
    ];
    for (from, to) in edits {
        assert!(json.contains(from), "{from} not in {json}");
        let err = Module::from_bytes(&reframe(&json.replacen(from, to, 1)), "<crafted>")
            .err()
            .unwrap_or_else(|| panic!("{from} -> {to} loaded"));
        let msg = err.to_string();
        assert!(
            msg.contains("<crafted>") && msg.contains("callback"),
            "{from} -> {to}: {msg}"
        );
    }
    rivet_runtime::registry::remove(name);
}

#[test]
fn taps_survive_the_default_cpu_schedules_rewrites() {
    // C = A @ B becomes the packed, tensorized GEMM and S = rowsum(C) a lane reduction under
    // the default CPU schedule: both rewrite their stage's definition; the taps still run and
    // see the final values. Small multiples of 1/4: every sum is exact in float32.
    let n = te::var("n");
    let a = placeholder([&n, &n], DType::F32, "A").unwrap();
    let b = placeholder([&n, &n], DType::F32, "B").unwrap();
    let k = te::reduce_axis(0, &n, "k").unwrap();
    let c = compute(
        [&n, &n],
        |[i, j]| te::sum(a.at((i, &k)) * b.at((&k, j)), &k),
        "C",
    )
    .unwrap();
    let r = te::reduce_axis(0, &n, "r").unwrap();
    let s_ = compute([&n], |[i]| te::sum(c.at((i, &r)), &r), "S").unwrap();
    let d = compute([n], |[i]| s_.at([i]) * 2.0, "D").unwrap();
    let (seen_c, seen_s) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(Vec::new())),
    );
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut s = Schedule::new(&[d.clone()]).unwrap();
    s.stage(&c)
        .unwrap()
        .debug_tap(CallbackFn::Function(logger(
            &log,
            "C",
            Some(seen_c.clone()),
        )))
        .unwrap();
    s.stage(&s_)
        .unwrap()
        .debug_tap(CallbackFn::Function(logger(
            &log,
            "S",
            Some(seen_s.clone()),
        )))
        .unwrap();
    let f = built(&s, &[a, b, d], "cpu");
    let nn = 64usize;
    let (x, y) = (data(nn * nn, 1), data(nn * nn, 2));
    let args =
        [&x, &y].map(|v| Value::Tensor(Tensor::from_slice(v, &[nn as i64, nn as i64]).unwrap()));
    let out = f
        .call(&args)
        .unwrap()
        .as_tensor()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let mut cm = vec![0f64; nn * nn];
    for i in 0..nn {
        for j in 0..nn {
            cm[i * nn + j] = (0..nn)
                .map(|p| x[i * nn + p] as f64 * y[p * nn + j] as f64)
                .sum();
        }
    }
    let sm: Vec<f64> = (0..nn)
        .map(|i| cm[i * nn..(i + 1) * nn].iter().sum())
        .collect();
    let as32 = |v: &[f64]| v.iter().map(|&z| z as f32).collect::<Vec<f32>>();
    assert_eq!(*log.lock().unwrap(), ["C", "S"]);
    assert_eq!(*seen_c.lock().unwrap(), as32(&cm));
    assert_eq!(*seen_s.lock().unwrap(), as32(&sm));
    assert_eq!(out, as32(&sm.iter().map(|v| v * 2.0).collect::<Vec<_>>()));
}

/// A ragged GEMM (40 x 40: not whole 12 x 32 tiles) read by an extern stage: the default CPU
/// schedule packs it into a padded buffer, and C must still be handed to the callback as C
/// itself (its own buffer, not inlined into the extern's reads).
#[test]
fn an_extern_stage_reads_a_ragged_packed_gemm_whole() {
    let nn = 40i64;
    let ne = Expr::int(nn);
    let a = placeholder([&ne, &ne], DType::F32, "A").unwrap();
    let b = placeholder([&ne, &ne], DType::F32, "B").unwrap();
    let k = te::reduce_axis(0, &ne, "k").unwrap();
    let c = compute(
        [&ne, &ne],
        |[i, j]| te::sum(a.at((i, &k)) * b.at((&k, j)), &k),
        "C",
    )
    .unwrap();
    let e = te::extern_(
        &[ne.clone(), ne.clone()],
        &[c.clone()],
        CallbackFn::Function(neg()),
        DType::F32,
        "E",
    )
    .unwrap();
    let s = Schedule::new(&[e.clone()]).unwrap();
    let m = build(&s, &[a, b, e], "cpu", "f").unwrap();
    let ir = m.get_source("ir").unwrap();
    assert!(ir.contains("call gemm_update"), "packed\n{ir}");
    assert!(ir.contains("local C.padded"), "padded\n{ir}");
    assert!(
        ir.contains("local C:"),
        "C kept whole for the callback\n{ir}"
    );
    let f = m.get_function("f").unwrap();
    let n = nn as usize;
    let (x, y) = (data(n * n, 4), data(n * n, 5));
    let args = [&x, &y].map(|v| Value::Tensor(Tensor::from_slice(v, &[nn, nn]).unwrap()));
    let out = f
        .call(&args)
        .unwrap()
        .as_tensor()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for i in 0..n {
        for j in 0..n {
            let want: f64 = -(0..n)
                .map(|p| x[i * n + p] as f64 * y[p * n + j] as f64)
                .sum::<f64>();
            let mag: f64 = (0..n)
                .map(|p| (x[i * n + p] as f64 * y[p * n + j] as f64).abs())
                .sum();
            let got = out[i * n + j] as f64;
            assert!(
                (got - want).abs() <= (n as f64 + 2.0) * f32::EPSILON as f64 * mag + 1e-30,
                "E[{i}, {j}] = {got}, want {want}"
            );
        }
    }
}

/// What the Python bindings' garbage-collector support counts on (`bindings/src/gc.rs`):
/// every handle a compiled function holds of its callbacks is visible (the loop nest's, the
/// lowered function's and the kernel's copies), and a packed function declares the handles
/// of its compiled code its closures hold, so the counts add up exactly.
fn compiled_functions_show_every_handle_they_hold(target: &Target) {
    let cb = square_minus(false);
    let (a, _, e, c) = program(Some(CallbackFn::Function(cb.clone())));
    let s = Schedule::new(&[c.clone()]).unwrap();
    let m = build(&s, &[a, c], target, "f").unwrap();
    drop(s);
    let compiled = m.funcs[0].clone();
    let seen = compiled.nest.callbacks.len()
        + compiled.func.callbacks.len()
        + compiled.kernel.host_callbacks().len();
    assert_eq!(seen, 3, "{target}");
    // Ours, the extern stage's, and the three inside the compiled function.
    assert_eq!(cb.handles(), 2 + seen, "{target}");
    // The extern stage stays alive after the user drops it: the compiled function keeps
    // its te program (`Compiled::recipe`, for `backward`), which reads it; gc.rs walks
    // that too.
    drop(e);
    assert_eq!(cb.handles(), 2 + seen, "{target}");
    assert!(compiled.recipe.is_some(), "{target}");
    let before = Arc::strong_count(&compiled);
    let f = rivet_compiler::call::make_function(compiled.clone());
    let parts = f.parts().expect("a compiled function shows its code");
    assert_eq!(
        Arc::strong_count(&compiled),
        before + 1 + parts.hidden,
        "{target}"
    );
    let shown = parts
        .object
        .downcast_ref::<rivet_compiler::artifact::Compiled>()
        .expect("the parts are the compiled function");
    assert!(std::ptr::eq(shown, &*compiled));
    drop(f);
    assert_eq!(Arc::strong_count(&compiled), before, "{target}");
}

// Host callbacks run on the backends that run kernels on host memory (CUDA refuses them:
// `cuda_builds_refuse_host_callbacks`).
rivet_tests::for_each_backend! {
    host_memory:
        extern_stages_compute_what_the_same_maths_as_computes_does,
        an_extern_stage_can_be_an_output_written_through_strides,
        callbacks_and_taps_run_once_per_call_in_stage_order_and_taps_change_nothing,
        a_callback_error_comes_out_unchanged_and_the_function_works_after_it,
        a_panicking_rust_callback_is_an_error_not_an_abort,
        a_wrong_result_is_a_shape_dtype_or_argument_error_naming_the_stage,
        a_view_kept_by_a_callback_stays_valid_after_the_call,
        checked_mode_runs_callbacks_on_every_backend_empty_tensors_included,
        several_extern_stages_run_in_producer_order_each_once,
        compiled_functions_show_every_handle_they_hold;
}
