//! Tests of the disk cache of NVRTC outputs (`cache.rs`), each in a fresh temporary folder:
//! miss then hit (the compiler called once, counted), every way an entry can be wrong
//! (corrupt payload, another key's entry, truncated header or body, huge file, wrong magic
//! or format, a folder in its place) giving a recompilation that overwrites it, a folder
//! that cannot be written (the build goes on), concurrent writers, the cache turned off, and
//! the key covering everything that decides NVRTC's output. With NVRTC (found as the backend
//! finds it; CI sets `RIVET_NVRTC_PATH`) the same through real NVRTC calls and through
//! `CudaBackend::compile_cuda`.

use super::cache::{self, DiskCache, Key, Lookup, Setting};
use super::nvrtc::{self, Compiled, Kind, Output};
use super::CudaBackend;
use crate::target::{CudaArch, Target};
use rivet_runtime::DType;
use std::cell::Cell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const SM80: CudaArch = CudaArch { major: 8, minor: 0 };
const SM90: CudaArch = CudaArch { major: 9, minor: 0 };

/// A fresh folder under the system's temporary folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "rivet-cache-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn key(source: &str, kind: Kind) -> Key {
    Key::new(
        source,
        "k.cu",
        SM90,
        kind,
        &nvrtc::options(SM90, kind, false),
        (13, 2),
    )
}

fn cubin(tag: u8) -> Compiled {
    Compiled {
        output: Output::Cubin([b"\x7fELF".as_slice(), &[tag; 100]].concat()),
        log: String::new(),
    }
}

fn payload(c: &Compiled) -> Vec<u8> {
    match &c.output {
        Output::Cubin(b) => b.clone(),
        Output::Ptx(t) => t.as_bytes().to_vec(),
    }
}

/// `compile_cached` with a compiler that counts its calls and gives `c`.
fn through(cache: Option<&DiskCache>, k: &Key, c: &Compiled, calls: &Cell<usize>) -> Compiled {
    cache::compile_cached(cache, k, || {
        calls.set(calls.get() + 1);
        Ok::<_, ()>(c.clone())
    })
    .unwrap()
}

fn rejected(l: Lookup) -> String {
    match l {
        Lookup::Rejected(why) => why,
        other => panic!("expected a rejected entry, got {other:?}"),
    }
}

fn hit(l: Lookup) -> Compiled {
    match l {
        Lookup::Hit(c) => c,
        other => panic!("expected a hit, got {other:?}"),
    }
}

#[test]
fn cache_miss_then_hit_calls_the_compiler_once() {
    let d = TempDir::new("hit");
    let c = DiskCache::new(d.path());
    let k = key("__global__ void f() {}", Kind::Cubin);
    assert!(matches!(c.get(&k), Lookup::Miss));
    let calls = Cell::new(0);
    let first = through(Some(&c), &k, &cubin(1), &calls);
    assert_eq!(calls.get(), 1);
    assert!(c.entry_path(&k).is_file());
    assert!(c.entry_path(&k).starts_with(d.path().join("cuda")));
    let second = through(Some(&c), &k, &cubin(2), &calls);
    assert_eq!(calls.get(), 1, "the second compile came from the disk");
    assert_eq!(
        payload(&second),
        payload(&first),
        "the stored bytes, not the new ones"
    );
    // Another process (a new DiskCache on the same folder) sees it too.
    let again = hit(DiskCache::new(d.path()).get(&k));
    assert_eq!(payload(&again), payload(&first));
}

#[test]
fn cache_keeps_the_nvrtc_log_and_ptx_text() {
    let d = TempDir::new("log");
    let c = DiskCache::new(d.path());
    let k = key("src", Kind::Ptx);
    let ptx = Compiled {
        output: Output::Ptx(".version 9.2\n.target sm_90\n".into()),
        log: "k.cu(3): warning: something".into(),
    };
    c.put(&k, &ptx).unwrap();
    let got = hit(c.get(&k));
    assert_eq!(got.log, ptx.log);
    assert!(matches!(got.output, Output::Ptx(ref t) if t == ".version 9.2\n.target sm_90\n"));
    // A cubin under a PTX key is refused at write time.
    assert!(c.put(&k, &cubin(0)).is_err());
}

#[test]
fn cache_key_covers_everything_that_decides_the_output() {
    let src = "__global__ void f() {}";
    let opts = |a, k, fmad| nvrtc::options(a, k, fmad);
    let base = Key::new(
        src,
        "f.cu",
        SM90,
        Kind::Cubin,
        &opts(SM90, Kind::Cubin, false),
        (13, 2),
    );
    let variants = [
        Key::new(
            "__global__ void g() {}",
            "f.cu",
            SM90,
            Kind::Cubin,
            &opts(SM90, Kind::Cubin, false),
            (13, 2),
        ),
        Key::new(
            src,
            "g.cu",
            SM90,
            Kind::Cubin,
            &opts(SM90, Kind::Cubin, false),
            (13, 2),
        ),
        Key::new(
            src,
            "f.cu",
            SM80,
            Kind::Cubin,
            &opts(SM80, Kind::Cubin, false),
            (13, 2),
        ),
        Key::new(
            src,
            "f.cu",
            SM90,
            Kind::Ptx,
            &opts(SM90, Kind::Ptx, false),
            (13, 2),
        ),
        Key::new(
            src,
            "f.cu",
            SM90,
            Kind::Cubin,
            &opts(SM90, Kind::Cubin, true),
            (13, 2),
        ),
        Key::new(
            src,
            "f.cu",
            SM90,
            Kind::Cubin,
            &opts(SM90, Kind::Cubin, false),
            (13, 0),
        ),
        Key::new(
            src,
            "f.cu",
            SM90,
            Kind::Cubin,
            &opts(SM90, Kind::Cubin, false),
            (12, 2),
        ),
    ];
    for v in &variants {
        assert_ne!(v.file_name(), base.file_name(), "{}", v.text());
        assert_ne!(v.text(), base.text());
    }
    assert_eq!(
        base,
        Key::new(
            src,
            "f.cu",
            SM90,
            Kind::Cubin,
            &opts(SM90, Kind::Cubin, false),
            (13, 2)
        ),
        "keys are deterministic"
    );
    let t = base.text();
    assert!(
        t.contains(&format!("rivet {}", env!("CARGO_PKG_VERSION"))),
        "{t}"
    );
    assert!(
        t.contains("nvrtc 13.2") && t.contains("arch sm_90") && t.contains("--fmad=false"),
        "{t}"
    );
    assert!(base.file_name().ends_with(".cubin") && base.file_name().len() == 64 + 6);
}

/// Writes `k`'s entry with `c`, lets `damage` change the file, and checks that the lookup
/// rejects it with a reason containing `why`, that `compile_cached` compiles again and that
/// the entry is good afterwards.
fn damaged(tag: &str, why: &str, damage: impl FnOnce(&Path, &DiskCache)) {
    let d = TempDir::new(tag);
    let c = DiskCache::new(d.path());
    let k = key(tag, Kind::Cubin);
    c.put(&k, &cubin(7)).unwrap();
    damage(&c.entry_path(&k), &c);
    let reason = rejected(c.get(&k));
    assert!(reason.contains(why), "{tag}: {reason}");
    let calls = Cell::new(0);
    let got = through(Some(&c), &k, &cubin(8), &calls);
    assert_eq!(calls.get(), 1, "{tag}: compiled again");
    assert_eq!(payload(&got), payload(&cubin(8)));
    assert_eq!(
        payload(&hit(c.get(&k))),
        payload(&cubin(8)),
        "{tag}: overwritten"
    );
}

#[test]
fn cache_corrupt_payload_is_recompiled_and_overwritten() {
    damaged("corrupt", "checksum mismatch", |p, _| {
        let mut b = std::fs::read(p).unwrap();
        let last = b.len() - 1;
        b[last] ^= 0x40;
        std::fs::write(p, b).unwrap();
    });
}

#[test]
fn cache_entry_of_another_key_is_not_trusted() {
    // A valid entry, checksum and all, but for another key, under this key's name: what a
    // hash collision or a file copied from elsewhere looks like.
    damaged("foreign", "another key", |p, _| {
        let other = key("some other source", Kind::Cubin);
        std::fs::write(p, cache::encode(&other, &cubin(9)).unwrap()).unwrap();
    });
}

#[test]
fn cache_truncated_entries_are_recompiled() {
    damaged("short-header", "truncated", |p, _| {
        let b = std::fs::read(p).unwrap();
        std::fs::write(p, &b[..cache::HEADER_BYTES - 1]).unwrap();
    });
    damaged("empty", "truncated", |p, _| std::fs::write(p, b"").unwrap());
    damaged("short-body", "truncated", |p, _| {
        let b = std::fs::read(p).unwrap();
        std::fs::write(p, &b[..b.len() - 10]).unwrap();
    });
    damaged("padded", "padded", |p, _| {
        let mut b = std::fs::read(p).unwrap();
        b.extend_from_slice(b"trailing");
        std::fs::write(p, b).unwrap();
    });
    // Lengths in the header that overflow when added: refused, no arithmetic wraps.
    damaged("lengths", "truncated", |p, _| {
        let mut b = std::fs::read(p).unwrap();
        b[20..28].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(p, b).unwrap();
    });
}

#[test]
fn cache_foreign_files_are_recompiled() {
    damaged("magic", "wrong magic", |p, _| {
        std::fs::write(p, vec![b'x'; 200]).unwrap();
    });
    damaged("format", "entry format 2", |p, _| {
        let mut b = std::fs::read(p).unwrap();
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        std::fs::write(p, b).unwrap();
    });
}

#[test]
fn cache_huge_entry_is_not_read() {
    damaged("huge", "over the entry limit", |p, _| {
        // Sparse: no disk space is used, and the size check comes before any read.
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.set_len(cache::MAX_ENTRY_BYTES + 1).unwrap();
    });
}

#[test]
fn cache_payload_of_the_wrong_kind_is_refused() {
    let d = TempDir::new("kind");
    let c = DiskCache::new(d.path());
    let k = key("x", Kind::Cubin);
    let not_elf = Compiled {
        output: Output::Cubin(b"not an ELF file".to_vec()),
        log: String::new(),
    };
    c.put(&k, &not_elf).unwrap();
    assert!(rejected(c.get(&k)).contains("not an ELF"));
    let kp = key("x", Kind::Ptx);
    let no_target = Compiled {
        output: Output::Ptx("garbage".into()),
        log: String::new(),
    };
    c.put(&kp, &no_target).unwrap();
    assert!(rejected(c.get(&kp)).contains(".target"));
}

#[test]
fn cache_folder_in_place_of_an_entry_does_not_fail_the_build() {
    let d = TempDir::new("dir-entry");
    let c = DiskCache::new(d.path());
    let k = key("y", Kind::Cubin);
    std::fs::create_dir_all(c.entry_path(&k)).unwrap();
    assert!(rejected(c.get(&k)).contains("not a file"));
    let calls = Cell::new(0);
    for _ in 0..2 {
        let got = through(Some(&c), &k, &cubin(3), &calls);
        assert_eq!(payload(&got), payload(&cubin(3)));
    }
    assert_eq!(
        calls.get(),
        2,
        "nothing could be stored: compiled each time"
    );
    let leftovers: Vec<_> = std::fs::read_dir(c.dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "failed writes leave no temporary files"
    );
}

#[cfg(unix)]
#[test]
fn cache_fifo_in_place_of_an_entry_is_not_waited_on() {
    let d = TempDir::new("fifo");
    let c = DiskCache::new(d.path());
    let k = key("fifo", Kind::Cubin);
    std::fs::create_dir_all(c.dir()).unwrap();
    let p = std::ffi::CString::new(c.entry_path(&k).to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(p.as_ptr(), 0o600) }, 0);
    assert!(rejected(c.get(&k)).contains("not a file"));
    // compile_cached goes on (the rename replaces the FIFO with a real entry).
    let calls = Cell::new(0);
    through(Some(&c), &k, &cubin(2), &calls);
    assert_eq!(payload(&hit(c.get(&k))), payload(&cubin(2)));
}

#[test]
fn cache_unwritable_folder_never_fails_a_build() {
    // A root under a regular file cannot be created, even by root (permission bits would
    // not stop root, which CI may be).
    let d = TempDir::new("unwritable");
    let file = d.path().join("a-file");
    std::fs::write(&file, b"not a folder").unwrap();
    let c = DiskCache::new(file.join("rivet"));
    let k = key("z", Kind::Cubin);
    assert!(matches!(c.get(&k), Lookup::Miss | Lookup::Rejected(_)));
    let err = c.put(&k, &cubin(4)).unwrap_err();
    assert!(err.contains("cannot create"), "{err}");
    let calls = Cell::new(0);
    for _ in 0..3 {
        assert_eq!(
            payload(&through(Some(&c), &k, &cubin(4), &calls)),
            payload(&cubin(4))
        );
    }
    assert_eq!(calls.get(), 3);
    // A compile error is returned as it is, and nothing is stored for it.
    let d2 = TempDir::new("error");
    let c2 = DiskCache::new(d2.path());
    let r: Result<Compiled, &str> = cache::compile_cached(Some(&c2), &k, || Err("nvrtc failed"));
    assert_eq!(r.unwrap_err(), "nvrtc failed");
    assert!(matches!(c2.get(&k), Lookup::Miss));
}

#[test]
fn cache_concurrent_writers_and_readers_see_whole_entries() {
    let d = TempDir::new("concurrent");
    let root = d.path().to_path_buf();
    let calls = Arc::new(AtomicUsize::new(0));
    let k = key("concurrent", Kind::Cubin);
    let want = payload(&cubin(5));
    std::thread::scope(|s| {
        for t in 0..8 {
            let (root, k, calls, want) = (root.clone(), k.clone(), calls.clone(), want.clone());
            s.spawn(move || {
                // Each thread its own DiskCache, as separate processes would have.
                let c = DiskCache::new(&root);
                for i in 0..25 {
                    if (t + i) % 3 == 0 {
                        // A writer racing the others (rename over a live entry).
                        c.put(&k, &cubin(5)).unwrap();
                    }
                    let got = cache::compile_cached(Some(&c), &k, || {
                        calls.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, ()>(cubin(5))
                    })
                    .unwrap();
                    assert_eq!(payload(&got), want);
                    match c.get(&k) {
                        Lookup::Hit(h) => assert_eq!(payload(&h), want),
                        other => panic!("a reader saw {other:?}"),
                    }
                }
            });
        }
    });
    // Compiled at most once per thread (a thread may miss before any write lands).
    assert!(calls.load(Ordering::Relaxed) <= 8);
    let c = DiskCache::new(&root);
    assert_eq!(payload(&hit(c.get(&k))), want);
    let names: Vec<String> = std::fs::read_dir(c.dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        vec![k.file_name()],
        "one entry, no temporary files left"
    );
}

#[test]
fn cache_setting_from_the_environment() {
    let env = |v: Option<&'static str>| {
        move |k: &str| {
            (k == "RIVET_CACHE_DIR")
                .then_some(v)
                .flatten()
                .map(OsString::from)
        }
    };
    assert_eq!(cache::setting(&env(Some(""))), Setting::Off);
    assert_eq!(cache::setting(&env(Some("off"))), Setting::Off);
    assert_eq!(
        cache::setting(&env(Some("/some/where"))),
        Setting::Dir(PathBuf::from("/some/where"))
    );
    match (cache::setting(&env(None)), dirs::cache_dir()) {
        (Setting::Dir(d), Some(user)) => assert_eq!(d, user.join("rivet")),
        (Setting::NoHome, None) => {}
        other => panic!("unset RIVET_CACHE_DIR: {other:?}"),
    }
    // Off: the compiler runs every time and nothing is written anywhere.
    let k = key("off", Kind::Cubin);
    let calls = Cell::new(0);
    through(None, &k, &cubin(6), &calls);
    through(None, &k, &cubin(6), &calls);
    assert_eq!(calls.get(), 2);
}

// ---- with NVRTC -----------------------------------------------------------------------------

/// NVRTC as the backend finds it; `None` (printed) when absent, unless required.
fn real_nvrtc() -> Option<Arc<nvrtc::Nvrtc>> {
    match nvrtc::find() {
        Ok(n) => Some(n),
        Err(e) if std::env::var("RIVET_REQUIRE_NVRTC").is_ok_and(|v| v == "1") => {
            panic!("RIVET_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: {e}")
        }
        Err(e) => {
            eprintln!("NVRTC not found, its cache tests skipped: {e}");
            None
        }
    }
}

const SRC: &str = "extern \"C\" __global__ void twice(float* a) { a[threadIdx.x] *= 2.0f; }\n";

#[test]
fn cache_real_nvrtc_is_called_once_per_key() {
    let Some(nv) = real_nvrtc() else { return };
    let d = TempDir::new("nvrtc");
    let c = DiskCache::new(d.path());
    let calls = Cell::new(0);
    for kind in [Kind::Ptx, Kind::Cubin] {
        let opts = nvrtc::options(SM90, kind, false);
        let k = Key::new(SRC, "twice.cu", SM90, kind, &opts, nv.version);
        let mut outs = Vec::new();
        for _ in 0..3 {
            let got = cache::compile_cached(Some(&c), &k, || {
                calls.set(calls.get() + 1);
                nv.compile(SRC, "twice.cu", &opts, kind)
            })
            .unwrap();
            outs.push(payload(&got));
        }
        assert!(outs.windows(2).all(|w| w[0] == w[1]));
    }
    assert_eq!(
        calls.get(),
        2,
        "one NVRTC call per kind, the rest from disk"
    );
}

#[test]
fn cache_serves_compile_cuda_and_survives_a_corrupt_entry() {
    let Some(nv) = real_nvrtc() else { return };
    let d = TempDir::new("backend");
    let f = crate::ir::test_util::func(
        "cached",
        vec![crate::ir::test_util::output(
            0,
            "C",
            DType::F32,
            vec![crate::ir::Expr::int(64)],
        )],
        vec![],
        thread_store(),
    );
    let f = {
        let mut f = f;
        crate::lower::flatten::flatten(&mut f);
        crate::lower::outline::outline(&mut f);
        f
    };
    let backend = |cache: Option<DiskCache>| {
        let mut b = CudaBackend::new(Target::cuda(Some(SM90)), false);
        b.nvrtc_path = Some(nv.path.clone());
        b.cache = cache;
        b
    };
    let cold = backend(Some(DiskCache::new(d.path())))
        .compile_cuda(&f)
        .unwrap();
    let entries = |dir: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("cuda"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        v.sort();
        v
    };
    let files = entries(d.path());
    assert_eq!(files.len(), 2, "a PTX and a cubin entry: {files:?}");
    let warm = backend(Some(DiskCache::new(d.path())))
        .compile_cuda(&f)
        .unwrap();
    assert_eq!(warm.ptx(), cold.ptx());
    assert_eq!(warm.cubin(), cold.cubin());
    // Corrupt both entries: the build compiles again, gives the same output and repairs them.
    for p in &files {
        let mut b = std::fs::read(p).unwrap();
        let i = b.len() / 2 + cache::HEADER_BYTES / 2;
        b[i] ^= 1;
        std::fs::write(p, b).unwrap();
    }
    let repaired = backend(Some(DiskCache::new(d.path())))
        .compile_cuda(&f)
        .unwrap();
    assert_eq!(repaired.ptx(), cold.ptx());
    assert_eq!(repaired.cubin(), cold.cubin());
    let c = DiskCache::new(d.path());
    for p in &files {
        let b = std::fs::read(p).unwrap();
        let kind = if p.extension().is_some_and(|e| e == "ptx") {
            Kind::Ptx
        } else {
            Kind::Cubin
        };
        let opts = nvrtc::options(SM90, kind, false);
        let k = Key::new(
            cold.cuda_source(),
            "cached.cu",
            SM90,
            kind,
            &opts,
            nv.version,
        );
        assert_eq!(&c.entry_path(&k), p);
        cache::decode(&b, &k).expect("rewritten entry is valid");
    }
    // With the cache off nothing is written.
    let d2 = TempDir::new("backend-off");
    let off = backend(None).compile_cuda(&f).unwrap();
    assert_eq!(off.cubin(), cold.cubin());
    assert!(!d2.path().join("cuda").exists());
}

/// `C[tx] = 1` in one block of 64 threads.
pub(super) fn thread_store() -> crate::ir::stmt::Stmt {
    use crate::ir::stmt::{ForKind, Stmt, ThreadTag};
    let tx = crate::ir::Var::new("tx");
    Stmt::For {
        var: tx.clone(),
        min: crate::ir::Expr::int(0),
        extent: crate::ir::Expr::int(64),
        kind: ForKind::Thread(ThreadTag::ThreadX),
        body: Box::new(Stmt::Store {
            buf: crate::ir::BufId(0),
            indices: vec![crate::ir::Expr::var(&tx)],
            value: crate::ir::Expr::constant(1.0, DType::F32),
        }),
    }
}
