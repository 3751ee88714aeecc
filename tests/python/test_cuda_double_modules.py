"""Saved CUDA modules run on a device through a driver only (the CUDA driver double in CI, a GPU
when lent): save, load, run; a later process loads from NVRTC's disk cache (RIVET_CACHE_DIR,
a fresh folder per test) and runs; a corrupt entry is compiled again, never trusted (the run
stays right); several processes building and running the same kernel into one empty cache
all get right results. Every result against numpy; data moves through the driver
(tests/python/cuda_driver.py). The module skips where rivet sees no driver.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import cuda_driver as cu
import rivet
from cuda_driver import no_driver_misuse  # noqa: F401 (autouse: the double's misuse reports fail a test)
from rivet import te

pytestmark = pytest.mark.cuda
N_DEVICES = cu.require_cuda()
SIZES = [1, 3, 17, 97]


def tiled_matmul(target):
    m, k, n = te.var("m"), te.var("k"), te.var("n")
    A = te.placeholder((m, k), "float32", name="A")
    B = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = rivet.create_schedule(C)
    i, j = C.op.axis
    io, ii = s[C].split(i, factor=16)
    jo, ji = s[C].split(j, factor=16)
    s[C].reorder(io, jo, ii, ji, r)
    s[C].bind(io, "blockIdx.y")
    s[C].bind(jo, "blockIdx.x")
    s[C].bind(ii, "threadIdx.y")
    s[C].bind(ji, "threadIdx.x")
    return rivet.build(s, [A, B, C], target=target, name="mm")


def small_ints(rng, shape):
    """Integers in [-8, 8) as float32: every dot product below is exact in any order."""
    return rng.integers(-8, 8, size=shape).astype(np.float32)


def run_mm(f, a, b, device=0):
    """f(A, B, C) on device copies (C poisoned first), and the allocated form; both results."""
    x = cu.CAI(cu.DeviceBuffer.from_array(a, device=device), a.shape, "float32", version=2)
    y = cu.CAI(cu.DeviceBuffer.from_array(b, device=device), b.shape, "float32", version=2)
    out = cu.DeviceBuffer(4 * a.shape[0] * b.shape[1], device=device).fill(0xFF)
    f(x, y, cu.CAI(out, (a.shape[0], b.shape[1]), "float32", version=2))
    given = out.read((a.shape[0], b.shape[1]), np.float32)
    allocated = cu.download(f(x, y))
    return given, allocated


@pytest.mark.parametrize("target", ["cuda", "cuda -arch=sm_80", "cuda -arch=sm_90"])
def test_a_saved_module_loads_and_runs(tmp_path, rng, target):
    path = tmp_path / "mm.rivet"
    tiled_matmul(target).save(str(path))
    mm = rivet.load_module(str(path))["mm"]
    for n in SIZES:
        a, b = small_ints(rng, (n, n + 3)), small_ints(rng, (n + 3, 2 * n + 1))
        want = a @ b
        for dev in range(min(N_DEVICES, 2)):
            given, allocated = run_mm(mm, a, b, device=dev)
            np.testing.assert_array_equal(given, want, err_msg=f"n={n} cuda:{dev}")
            np.testing.assert_array_equal(allocated, want, err_msg=f"n={n} cuda:{dev}")


# ---- the disk cache across processes ---------------------------------------------------------

CHILD = r"""
import sys
import numpy as np
import cuda_driver as cu
import rivet
from rivet import te
mode, path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "build":
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=64)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    m = rivet.build(s, [A, C], target="cuda", name="dbl")
    m.save(path)
else:
    m = rivet.load_module(path)
f = m["dbl"]
cu.init()
rng = np.random.default_rng(seed)
for n in (1, 3, 17, 97, 1023):
    a = (rng.integers(-64, 64, size=n) / 8.0).astype(np.float32)
    x = cu.CAI(cu.DeviceBuffer.from_array(a), a.shape, "float32", version=2)
    got = cu.download(f(x))
    if not np.array_equal(got, a * np.float32(2.0) + np.float32(1.0)):
        print("WRONG", n, got[:8], a[:8])
        sys.exit(3)
print("ok", len(m.get_source("ptx")))
"""


def run_child(mode, path, cache, seed=0):
    r = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(path), str(seed)],
        env=cu.child_env(RIVET_CACHE_DIR=str(cache)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and r.stdout.startswith("ok"), (r.returncode, r.stdout, r.stderr)
    assert cu.DOUBLE_MARK not in r.stderr, r.stderr
    return r


def entries(cache):
    d = cache / "cuda"
    if not d.is_dir():
        return {}
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino) for p in sorted(d.iterdir())}


def entry_for(found, arch, kind):
    """The entry name whose key names `arch` and `kind` ("ptx" / "cubin")."""
    names = [n for n, (blob, _, _) in found.items() if n.endswith("." + kind) and f"\narch {arch}\n".encode() in blob]
    assert len(names) == 1, (arch, kind, sorted(found))
    return names[0]


def test_a_later_process_loads_from_the_disk_cache_and_runs(tmp_path):
    cache, mod = tmp_path / "cache", tmp_path / "d.rivet"
    run_child("build", mod, cache, seed=1)
    first = entries(cache)
    dev_arch = cu.arch(0)
    # No arch named and a driver present: one cubin, for the device's arch (the one that runs
    # it), and PTX for it only because the child asks for the PTX source; both through the cache.
    want = {("ptx", dev_arch), ("cubin", dev_arch)}
    assert len(first) == len(want), sorted(first)
    for kind, arch in want:
        entry_for(first, arch, kind)
    # A later process loads and runs (twice): every NVRTC output is a hit, nothing rewritten.
    run_child("load", mod, cache, seed=2)
    run_child("load", mod, cache, seed=3)
    assert entries(cache) == first


@pytest.mark.parametrize("damage", ["bit-flip", "truncated", "junk", "empty"])
def test_a_corrupt_cache_entry_is_compiled_again_not_trusted(tmp_path, damage):
    cache, mod = tmp_path / "cache", tmp_path / "d.rivet"
    run_child("build", mod, cache, seed=4)
    first = entries(cache)
    # The cubin the device runs: a corrupt one loaded would give wrong results (or a fault).
    name = entry_for(first, cu.arch(0), "cubin")
    p = cache / "cuda" / name
    blob = bytearray(first[name][0])
    if damage == "bit-flip":
        blob[len(blob) - 40] ^= 0x10  # inside the payload (the ELF), past the key text
    elif damage == "truncated":
        blob = blob[: len(blob) // 2]
    elif damage == "junk":
        blob = bytearray(b"junk" * 100)
    else:
        blob = bytearray()
    p.write_bytes(bytes(blob))
    run_child("load", mod, cache, seed=5)  # right results
    after = entries(cache)
    assert after.keys() == first.keys()
    assert after[name][0] == first[name][0], "rewritten with NVRTC's (deterministic) output"
    for other in first:
        if other != name:
            assert after[other] == first[other], f"{other} was rewritten"


def test_concurrent_processes_build_and_run_into_one_cache(tmp_path):
    cache = tmp_path / "cache"
    env = cu.child_env(RIVET_CACHE_DIR=str(cache))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, "build", str(tmp_path / f"m{i}.rivet"), str(10 + i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]
    assert all(o.startswith("ok") for o, _ in outs), outs
    assert len({o for o, _ in outs}) == 1, "every process got the same PTX"
    assert not any(cu.DOUBLE_MARK in e for _, e in outs), [e for _, e in outs]
    names = sorted(p.name for p in (cache / "cuda").iterdir())
    assert not any(n.startswith(".tmp-") for n in names), names
    first = entries(cache)
    run_child("load", tmp_path / "m0.rivet", cache, seed=20)
    assert entries(cache) == first, "the entries they left are valid: the next load hits"


def test_the_second_device_gets_its_own_cubin_from_the_cache(tmp_path, rng):
    if N_DEVICES < 2:
        pytest.skip("one CUDA device (the double: RIVET_CUDA_DOUBLE='devices=sm_90,sm_80')")
    arch0, arch1 = cu.arch(0), cu.arch(1)
    if arch0 == arch1:
        pytest.skip(f"both devices are {arch0}")
    # Built for one device's arch in a child (so this process's kernel caches are cold), then
    # loaded and run on both devices here: the other device's cubin is compiled at its first
    # launch and lands in the cache.
    cache, path = tmp_path / "cache", tmp_path / "mm.rivet"
    code = (
        "import sys; sys.path.insert(0, %r); from test_cuda_double_modules import tiled_matmul; "
        "tiled_matmul('cuda -arch=%s').save(%r)" % (os.path.dirname(os.path.abspath(__file__)), arch0, str(path))
    )
    r = subprocess.run([sys.executable, "-c", code], env=cu.child_env(RIVET_CACHE_DIR=str(cache)), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    before = entries(cache)
    entry_for(before, arch0, "cubin")
    assert not [n for n, (b, _, _) in before.items() if f"\narch {arch1}\n".encode() in b]
    # Loaded here with the cache of the build; the test process reads RIVET_CACHE_DIR at
    # each lookup, so setting it for the load and the launches is enough.
    old = os.environ.get("RIVET_CACHE_DIR")
    os.environ["RIVET_CACHE_DIR"] = str(cache)
    try:
        mm = rivet.load_module(str(path))["mm"]
        a, b = small_ints(rng, (17, 33)), small_ints(rng, (33, 9))
        for dev in (0, 1):
            given, allocated = run_mm(mm, a, b, device=dev)
            np.testing.assert_array_equal(given, a @ b, err_msg=f"cuda:{dev}")
            np.testing.assert_array_equal(allocated, a @ b, err_msg=f"cuda:{dev}")
    finally:
        if old is None:
            os.environ.pop("RIVET_CACHE_DIR", None)
        else:
            os.environ["RIVET_CACHE_DIR"] = old
    entry_for(entries(cache), arch1, "cubin")
