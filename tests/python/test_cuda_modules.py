"""Saved modules holding CUDA functions (``mod.save`` / ``rivet.load_module`` of a module built
with ``target="cuda"``): the IR and the target survive the round trip, the CUDA C and PTX are
the same after loading, calling without a GPU is a ``DeviceError``; NVRTC's outputs come from
the disk cache (``RIVET_CACHE_DIR``) in a later process, a corrupt entry is compiled again,
the cache can be off or unusable without failing anything; hostile files (a crafted ``-arch``,
IR the GPU verifier refuses, pre-outlined kernels) are ``CompileError``s. The run on a device
is marked ``gpu`` (skipped without one). docs/cuda.md, "Saved modules with CUDA functions" and
"The disk cache"."""

import json
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

import rivet
from rivet import te

NVRTC_REQUIRED = os.environ.get("RIVET_REQUIRE_NVRTC") == "1"
HEADER = struct.Struct("<8sIQI")  # magic, format version, payload length, CRC-32


def bound_double(target):
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=128)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    return rivet.build(s, [A, C], target=target, name="dbl")


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


def ptx_or_none(m):
    try:
        return m.get_source("ptx")
    except rivet.CompileError as e:
        assert not NVRTC_REQUIRED, f"NVRTC required but not found: {e}"
        return None


MAKERS = {"double": bound_double, "matmul": tiled_matmul}


@pytest.mark.parametrize("target", ["cuda", "cuda -arch=sm_80", "cuda -arch=sm_90"])
@pytest.mark.parametrize("make", sorted(MAKERS))
def test_a_cuda_module_round_trips(tmp_path, make, target):
    m = MAKERS[make](target)
    path = tmp_path / "m.rivet"
    m.save(str(path))
    loaded = rivet.load_module(str(path))
    assert repr(loaded) == repr(m)
    assert f"target={target}" in repr(loaded)
    for kind in ("ir", "nest", "cuda"):
        assert loaded.get_source(kind) == m.get_source(kind), kind
    ptx = ptx_or_none(m)
    if ptx is not None:
        assert loaded.get_source("ptx") == ptx
        arch = target.partition("-arch=")[2] or "sm_80"
        assert f".target {arch}" in ptx
    # The payload names the target as written; saving the loaded module gives the same file.
    raw = path.read_bytes()
    assert f'"target":"{target}"'.encode() in raw
    path2 = tmp_path / "again.rivet"
    loaded.save(str(path2))
    assert path2.read_bytes() == raw


def test_a_loaded_cuda_function_without_a_gpu_is_a_device_error(tmp_path):
    path = tmp_path / "d.rivet"
    bound_double("cuda").save(str(path))
    f = rivet.load_module(str(path))["dbl"]
    x = np.ones(5, np.float32)
    y = np.full(5, 7.0, np.float32)
    with pytest.raises(rivet.DeviceError, match="built for 'cuda', called with tensors on cpu"):
        f(x, y)
    assert (y == 7.0).all(), "nothing was written"


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 56, 1000, 1023])
def test_a_loaded_cuda_module_runs_on_torch_cuda_tensors(tmp_path, rng, h, n):
    import torch

    path = tmp_path / "mm.rivet"
    tiled_matmul("cuda").save(str(path))
    mm = rivet.to_pytorch_func(rivet.load_module(str(path))["mm"])
    oracle = rivet.to_pytorch_func(tiled_matmul("interp")["mm"]) if n <= 56 else None
    a = h.random_array(rng, (n, n + 3))
    b = h.random_array(rng, (n + 3, n))
    x, y = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    z = torch.empty(n, n, device="cuda")
    h.poison(z)
    mm(x, y, z)
    torch.cuda.synchronize()
    if oracle is not None:
        # The same schedule on the interpreter: same operations, same order (tolerance.md).
        want = torch.empty(n, n)
        oracle(torch.from_numpy(a), torch.from_numpy(b), want)
        h.assert_matches(z.cpu(), want, op="contraction", against="interp", backend="cuda")
    else:
        want = a.astype(np.float64) @ b.astype(np.float64)
        h.assert_matches(z.cpu(), want, op="contraction", against="numpy", k=n + 3, terms=h.abs_mm(a, b))


# ---- the disk cache across processes -------------------------------------------------------

CHILD = r"""
import sys, rivet
from rivet import te
mode, path = sys.argv[1], sys.argv[2]
if mode == "build":
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, name="C")
    s = rivet.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=128)
    s[C].bind(bx, "blockIdx.x")
    s[C].bind(tx, "threadIdx.x")
    m = rivet.build(s, [A, C], target="cuda -arch=sm_90", name="dbl")
    m.save(path)
else:
    m = rivet.load_module(path)
    m2 = rivet.load_module(path)
print(len(m.get_source("ptx")))
"""


def run_child(mode, path, cache, **extra_env):
    """Runs CHILD in a fresh process with RIVET_CACHE_DIR=cache (None: unset)."""
    env = dict(os.environ, **extra_env)
    if cache is None:
        env.pop("RIVET_CACHE_DIR", None)
    else:
        env["RIVET_CACHE_DIR"] = str(cache)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return r


def entries(cache):
    d = cache / "cuda"
    if not d.is_dir():
        return {}
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino) for p in sorted(d.iterdir())}


@pytest.fixture
def nvrtc_here():
    if ptx_or_none(bound_double("cuda -arch=sm_90")) is None:
        pytest.skip("NVRTC not found: the disk cache holds NVRTC's outputs")


def test_a_later_process_loads_from_the_disk_cache(tmp_path, nvrtc_here):
    cache, mod = tmp_path / "cache", tmp_path / "d.rivet"
    run_child("build", mod, cache)
    first = entries(cache)
    assert sorted(n.rsplit(".", 1)[1] for n in first) == ["cubin", "ptx"], first.keys()
    # Loading (twice, in a new process) hits: no entry is written again (same inode, mtime).
    run_child("load", mod, cache)
    assert entries(cache) == first
    # A corrupt entry is not trusted: compiled again, rewritten, and the same bytes as before.
    name = next(n for n in first if n.endswith(".cubin"))
    p = cache / "cuda" / name
    blob = bytearray(p.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    p.write_bytes(bytes(blob))
    run_child("load", mod, cache)
    after = entries(cache)
    assert after.keys() == first.keys()
    assert after[name][0] == first[name][0], "rewritten with NVRTC's (deterministic) output"
    # A file that is not an entry at all, and an empty one: the same.
    for junk in (b"", b"junk" * 100):
        p.write_bytes(junk)
        run_child("load", mod, cache)
        assert p.read_bytes() == first[name][0]


def test_concurrent_processes_share_one_cache(tmp_path, nvrtc_here):
    # Four processes build the same kernels into an empty cache at once: each writes through
    # its own temporary file and renames it, so all succeed and one whole entry per key stays.
    cache = tmp_path / "cache"
    env = dict(os.environ, RIVET_CACHE_DIR=str(cache))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, "build", str(tmp_path / f"m{i}.rivet")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert len({o for o, _ in outs}) == 1, "every process got the same PTX"
    names = sorted(p.name for p in (cache / "cuda").iterdir())
    assert len(names) == 2 and not any(n.startswith(".tmp-") for n in names), names
    first = entries(cache)
    run_child("load", tmp_path / "m0.rivet", cache)
    assert entries(cache) == first, "the entries they left are valid: the next load hits"


def test_the_cache_can_be_off_or_unusable_without_failing(tmp_path, nvrtc_here):
    mod = tmp_path / "d.rivet"
    xdg = tmp_path / "xdg"
    # Off ("off" or empty) means off: nothing written, not even under the default folder.
    for off in ("off", ""):
        r = run_child("build", mod, off, XDG_CACHE_HOME=str(xdg))
        assert "warning" not in r.stderr and int(r.stdout.strip()) > 0
        run_child("load", mod, off, XDG_CACHE_HOME=str(xdg))
        assert not xdg.exists()
    # Unset: the default folder, $XDG_CACHE_HOME/rivet.
    run_child("load", mod, None, XDG_CACHE_HOME=str(xdg))
    assert len(entries(xdg / "rivet")) == 2
    # A folder that cannot be created (under a regular file; root is not stopped by
    # permissions): the module still builds and loads, and the user is told once.
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    r = run_child("build", mod, blocker / "cache")
    r2 = run_child("load", mod, blocker / "cache")
    for out in (r, r2):
        assert out.stderr.count("rivet: warning: the CUDA binary cache is not usable") == 1, out.stderr
        assert "RIVET_CACHE_DIR" in out.stderr
        assert int(out.stdout.strip()) > 0, "PTX was still made"


# ---- hostile files -------------------------------------------------------------------------


def craft(m, tmp_path, edit, name="crafted.rivet"):
    """m's file with `edit` applied to its JSON payload, re-framed with a valid checksum."""
    src = tmp_path / "orig.rivet"
    m.save(str(src))
    raw = src.read_bytes()
    magic, version, length, _ = HEADER.unpack(raw[: HEADER.size])
    payload = json.loads(raw[HEADER.size :])
    edit(payload)
    body = json.dumps(payload, separators=(",", ":")).encode()
    out = tmp_path / name
    out.write_bytes(HEADER.pack(magic, version, len(body), zlib.crc32(body)) + body)
    return str(out)


@pytest.mark.parametrize(
    "target, why",
    [
        ("cuda -arch=sm_9999999999", "sm_9999999999"),
        ("cuda -arch=sm_70", "sm_80 and newer"),
        ("cuda -arch=sm_90 -Xptxas=-O0", "unknown option"),
        ("cuda --use_fast_math", "unknown option"),
        ("cuda -arch=../../etc/passwd", "expected sm_<major><minor>"),
        ("CUDA", "unknown target"),
    ],
)
def test_a_crafted_cuda_target_is_a_compile_error(tmp_path, target, why):
    def edit(p):
        p["functions"][0]["target"] = target

    path = craft(bound_double("cuda -arch=sm_90"), tmp_path, edit)
    with pytest.raises(rivet.CompileError) as e:
        rivet.load_module(path)
    msg = str(e.value)
    assert "cannot load rivet module" in msg and "crafted.rivet" in msg and "'dbl'" in msg, msg
    assert why in msg, msg


def inner_loop(p):
    return p["functions"][0]["ir"]["body"]["For"]["body"]["For"]


@pytest.mark.parametrize(
    "edit, why",
    [
        # 4096 threads per block: over CUDA's 1024.
        (lambda p: inner_loop(p)["extent"]["kind"]["Const"].update(Int=4096), "1024"),
        # A thread loop starting at 3.
        (lambda p: inner_loop(p)["min"]["kind"]["Const"].update(Int=3), "start at 0"),
        # The block loop retagged threadIdx.x: the tag twice, a thread extent that is not constant.
        (lambda p: p["functions"][0]["ir"]["body"]["For"].update(kind={"Thread": "ThreadX"}), "threadIdx.x"),
        # An unknown thread tag.
        (lambda p: inner_loop(p).update(kind={"Thread": "ThreadW"}), "malformed payload"),
        # Pre-outlined kernels (a launch in a saved nest): they would skip the bounds proof.
        (lambda p: p["functions"][0]["ir"].update(body={"Launch": {"kernel": 0}}), "outlined kernels or launches"),
    ],
    ids=["threads-over-1024", "thread-loop-from-3", "tag-twice", "unknown-tag", "launch-in-nest"],
)
def test_a_cuda_function_whose_ir_fails_verification_is_refused(tmp_path, edit, why):
    path = craft(bound_double("cuda -arch=sm_90"), tmp_path, edit)
    with pytest.raises(rivet.CompileError) as e:
        rivet.load_module(path)
    msg = str(e.value)
    assert "cannot load rivet module" in msg and why in msg, msg
