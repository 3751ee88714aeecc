//! The registry (override protection, lookups, names) and DLPack ownership across crates:
//! a foreign owner is dropped exactly once, when the last view goes, whatever the path.

use rivet_runtime::{dlpack, registry, DType, Device, Error, Function, Tensor, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// `dlpack::live_imports()` is process-wide: tests that import or count take this lock so
/// the counts they compare are not disturbed by another test thread.
static IMPORTS: Mutex<()> = Mutex::new(());

#[test]
fn registry_protects_names_and_lists_builtins() {
    let names = registry::list();
    for n in ["testing.axpy", "testing.echo", "testing.nop"] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    let f = Function::new("t.one", |_| Ok(Value::Int(1)));
    registry::register("itest.one", f.clone(), false).unwrap();
    let e = registry::register("itest.one", f.clone(), false).unwrap_err();
    assert!(matches!(e, Error::Registry(_)) && e.to_string().contains("override"));
    let two = Function::new("t.two", |_| Ok(Value::Int(2)));
    registry::register("itest.one", two, true).unwrap();
    assert!(matches!(
        registry::get("itest.one").unwrap().call(&[]).unwrap(),
        Value::Int(2)
    ));
    let e = registry::get("itest.missing").unwrap_err();
    assert!(matches!(e, Error::NotFound(_)));
    assert!(
        e.to_string().contains("'itest.missing'") && e.to_string().contains("itest.one"),
        "{e}"
    );
    assert!(registry::remove("itest.one"));
    assert!(registry::try_get("itest.one").is_none());
}

struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn foreign_owner_dropped_once_after_last_view() {
    let _serial = IMPORTS.lock().unwrap_or_else(|e| e.into_inner());
    let drops = Arc::new(AtomicUsize::new(0));
    let mut buf = vec![1f32, 2., 3., 4.];
    // SAFETY: `buf` outlives every view (they are all dropped before it).
    let t = unsafe {
        Tensor::from_raw_parts(
            Counted(drops.clone()),
            buf.as_mut_ptr() as *mut u8,
            0,
            [4i64][..].into(),
            [1i64][..].into(),
            DType::F32,
            Device::Cpu,
            false,
        )
    }
    .unwrap();
    let view = t.as_strided(&[2], &[2], 0).unwrap();
    let echoed = registry::get("testing.echo")
        .unwrap()
        .call(&[Value::Tensor(view.clone())])
        .unwrap();
    // Export and re-import: the export keeps the view alive until its deleter runs.
    // SAFETY: a fresh export, consumed once.
    let back = unsafe { dlpack::import_versioned(dlpack::export_versioned(&view)) }.unwrap();
    drop(t);
    drop(view);
    drop(echoed);
    assert_eq!(drops.load(Ordering::SeqCst), 0, "views still alive");
    assert_eq!(back.to_vec::<f32>().unwrap(), vec![1., 3.]);
    drop(back);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn corrupt_dltensor_is_refused_and_released() {
    let _serial = IMPORTS.lock().unwrap_or_else(|e| e.into_inner());
    let t = Tensor::zeros(&[3], DType::F32).unwrap();
    let live = dlpack::live_imports();
    let p = dlpack::export_versioned(&t);
    // SAFETY: p is our own valid export; we corrupt its rank before importing.
    unsafe { (*p).dl_tensor.ndim = 1000 };
    // SAFETY: consumed once.
    let e = unsafe { dlpack::import_versioned(p) }.unwrap_err();
    assert!(
        matches!(e, Error::DLPack(_)) && e.to_string().contains("ndim 1000"),
        "{e}"
    );
    assert_eq!(dlpack::live_imports(), live);
    let p = dlpack::export_versioned(&t);
    // SAFETY: as above; a negative dim.
    unsafe { *(*p).dl_tensor.shape = -2 };
    assert!(matches!(
        // SAFETY: consumed once.
        unsafe { dlpack::import_versioned(p) },
        Err(Error::Shape(_))
    ));
    let p = dlpack::export_versioned(&t);
    // SAFETY: as above; an unsupported dtype (complex64).
    unsafe {
        (*p).dl_tensor.dtype.code = 5;
        (*p).dl_tensor.dtype.bits = 64;
    }
    assert!(matches!(
        // SAFETY: consumed once.
        unsafe { dlpack::import_versioned(p) },
        Err(Error::DType(_))
    ));
    assert_eq!(dlpack::live_imports(), live);
}

#[test]
fn tensors_on_another_device_are_refused_by_cpu_functions() {
    let _serial = IMPORTS.lock().unwrap_or_else(|e| e.into_inner());
    let t = Tensor::zeros(&[3], DType::F32).unwrap();
    let p = dlpack::export_versioned(&t);
    // SAFETY: p is our own valid export; we relabel it as CUDA memory (never dereferenced).
    unsafe { (*p).dl_tensor.device = Device::Cuda(0).to_dlpack() };
    // SAFETY: consumed once.
    let cuda = unsafe { dlpack::import_versioned(p) }.unwrap();
    assert_eq!(cuda.device(), Device::Cuda(0));
    let e = registry::get("testing.axpy")
        .unwrap()
        .call(&[
            Value::Float(1.0),
            Value::Tensor(cuda.clone()),
            Value::Tensor(t),
        ])
        .unwrap_err();
    assert!(matches!(e, Error::Device(_)), "{e}");
    assert!(
        e.to_string()
            .contains("argument 1 ('x') expected a CPU tensor, got one on cuda:0"),
        "{e}"
    );
    assert!(matches!(cuda.to_vec::<f32>(), Err(Error::Device(_))));
}
