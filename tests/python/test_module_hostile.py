"""Hostile module files from Python: valid-CRC mutations of a real saved module (the JSON
payload parsed, mutated, re-serialised, with the header's length and CRC-32 recomputed).

Each mutation ends in a rivet.CompileError naming the file, or in a module whose calls leave
every input intact: read-only numpy arrays, `bytes` (through a read-only numpy view) and
jax.Array inputs are snapshotted before and compared after.
"""

import json
import struct
import zlib

import numpy as np
import pytest

import rivet
from rivet import te

HEADER = 24


def gemm_module(path):
    A = te.placeholder((8, 8), "float32", name="A")
    B = te.placeholder((8, 8), "float32", name="B")
    k = te.reduce_axis((0, 8), name="k")
    C = te.compute((8, 8), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = rivet.create_schedule(C)
    s[C].parallel(C.op.axis[0])
    mod = rivet.build(s, [A, B, C], target="cpu", name="mm")
    mod.save(str(path))
    return path.read_bytes()


def split(data):
    return data[:HEADER], json.loads(data[HEADER:])


def join(header, payload):
    body = json.dumps(payload, separators=(",", ":")).encode()
    head = bytearray(header)
    head[12:20] = struct.pack("<Q", len(body))
    head[20:24] = struct.pack("<I", zlib.crc32(body) & 0xFFFFFFFF)
    return bytes(head) + body


def walk(node, fn):
    """Calls fn on every dict in the payload (pre-order)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            fn(n)
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)


def loops(ir):
    out = []
    walk(ir["body"], lambda d: out.append(d["For"]) if "For" in d else None)
    return out


def inputs():
    rng = np.random.default_rng(7)
    a = rng.integers(-4, 5, (8, 8)).astype(np.float32)
    b = rng.integers(-4, 5, (8, 8)).astype(np.float32)
    return a, b


def check_or_refused(tmp_path, data, name, exact=True):
    """Loads the mutated file; when it loads, calls it on read-only numpy, bytes-backed and
    (if installed) jax inputs, checks that none changed, and the result when `exact`."""
    p = tmp_path / name
    p.write_bytes(data)
    try:
        mod = rivet.load_module(str(p))
    except rivet.CompileError as e:
        msg = str(e)
        assert msg.startswith(f"cannot load rivet module {p}"), msg
        assert "internal compiler error" not in msg, msg
        return msg
    f = mod["mm"]
    a, b = inputs()
    want = a @ b
    ro_a, ro_b = a.copy(), b.copy()
    ro_a.flags.writeable = False
    ro_b.flags.writeable = False
    raw = a.tobytes()
    as_bytes = np.frombuffer(raw, dtype=np.float32).reshape(8, 8)  # read-only, over `bytes`
    cases = [(ro_a, ro_b), (as_bytes, ro_b)]
    try:
        import jax.numpy as jnp

        cases.append((jnp.asarray(a), jnp.asarray(b)))
    except ImportError:
        pass
    for x, y in cases:
        before = (np.array(x).tobytes(), np.array(y).tobytes())
        try:
            out = f(x, y)
        except rivet.Error:
            out = None
        assert (np.array(x).tobytes(), np.array(y).tobytes()) == before, "an input was written"
        if out is not None and exact:
            np.testing.assert_array_equal(np.asarray(out), want)
    assert raw == a.tobytes()
    return None


def test_unmodified(tmp_path):
    data = gemm_module(tmp_path / "mm.rivet")
    head, payload = split(data)
    assert check_or_refused(tmp_path, join(head, payload), "same.rivet") is None


def test_output_flag_flipped_is_refused(tmp_path):
    head, payload = split(gemm_module(tmp_path / "mm.rivet"))
    ir = payload["functions"][0]["ir"]
    c = [b for b in ir["buffers"] if b["kind"] == {"Param": {"output": True}}][0]
    c["kind"] = {"Param": {"output": False}}
    msg = check_or_refused(tmp_path, join(head, payload), "flip.rivet")
    assert msg and "stores go only to outputs and locals" in msg and "`C`" in msg


@pytest.mark.parametrize("which", [0, 1])
def test_input_flag_flipped_is_harmless(tmp_path, which):
    head, payload = split(gemm_module(tmp_path / "mm.rivet"))
    ir = payload["functions"][0]["ir"]
    ir["buffers"][which]["kind"] = {"Param": {"output": True}}
    check_or_refused(tmp_path, join(head, payload), "flip_in.rivet", exact=False)


def test_store_to_input_is_refused(tmp_path):
    head, payload = split(gemm_module(tmp_path / "mm.rivet"))
    stores = []
    walk(payload["functions"][0]["ir"]["body"], lambda d: stores.append(d["Store"]) if "Store" in d else None)
    # The stores into C (two indices, as A has); the accumulator `C.acc[0]` keeps its own.
    stores = [s for s in stores if len(s["indices"]) == 2]
    assert stores
    for s in stores:
        s["buf"] = 0
    msg = check_or_refused(tmp_path, join(head, payload), "store.rivet")
    assert msg and "stores go only to outputs and locals" in msg


def test_reduction_loop_parallel_is_refused(tmp_path):
    head, payload = split(gemm_module(tmp_path / "mm.rivet"))
    for lp in loops(payload["functions"][0]["ir"]):
        if lp["var"]["name"] == "k":
            lp["kind"] = "Parallel"
    msg = check_or_refused(tmp_path, join(head, payload), "race.rivet")
    assert msg and "disjoint elements" in msg and "`k`" in msg


def test_outer_loop_vectorized_is_refused(tmp_path):
    head, payload = split(gemm_module(tmp_path / "mm.rivet"))
    for lp in loops(payload["functions"][0]["ir"]):
        if lp["var"]["name"] == "i":
            lp["kind"] = "Vectorized"
    msg = check_or_refused(tmp_path, join(head, payload), "vec.rivet")
    assert msg and "innermost" in msg


@pytest.mark.parametrize("extent", [9, 2**40, -3, 2**63 - 1, 3, 0])
def test_changed_extents(tmp_path, extent):
    head, payload = split(gemm_module(tmp_path / "mm.rivet"))
    for lp in loops(payload["functions"][0]["ir"]):
        lp["extent"] = {"kind": {"Const": {"Int": extent}}, "dtype": "int64"}
    msg = check_or_refused(tmp_path, join(head, payload), "ext.rivet", exact=False)
    if extent > 8 or extent < 0:
        assert msg is not None


def wrap_value(payload, levels):
    stores = []
    walk(payload["functions"][0]["ir"]["body"], lambda d: stores.append(d["Store"]) if "Store" in d else None)
    s = stores[-1]
    v = s["value"]
    for _ in range(levels):
        v = {"kind": {"Unary": ["Neg", v]}, "dtype": "float32"}
    s["value"] = v


def test_deep_expressions(tmp_path):
    head, payload = split(gemm_module(tmp_path / "mm.rivet"))
    wrap_value(payload, 2000)  # even: the result is unchanged
    # json.dumps recurses: give it room.
    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    try:
        data = join(head, payload)
        assert check_or_refused(tmp_path, data, "deep.rivet") is None
        wrap_value(payload, 4000)
        msg = check_or_refused(tmp_path, join(head, payload), "deeper.rivet")
    finally:
        sys.setrecursionlimit(old)
    assert msg and "MAX_IR_DEPTH" in msg


def test_huge_file_is_refused_before_reading(tmp_path):
    data = gemm_module(tmp_path / "mm.rivet")
    p = tmp_path / "huge.rivet"
    with open(p, "wb") as fh:
        fh.write(data)
        fh.truncate(1 << 40)  # sparse
    with pytest.raises(rivet.CompileError, match="MAX_MODULE_BYTES"):
        rivet.load_module(str(p))


# Host callbacks (docs/callbacks.md): each entry of a function's callback table is called
# exactly once per call, on whole buffers. A crafted file that calls one twice, carries an
# entry nothing calls, or hands a callback part of a buffer is refused at load by the IR
# verifier, before anything runs.

CALLBACK = "tests.module_hostile.negate"


def callback_module(path, seen):
    def negate(a, out):
        seen.append(1)
        np.from_dlpack(out)[...] = -np.from_dlpack(a)

    rivet.register_func(CALLBACK, negate, override=True)
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    E = te.extern((n,), [A], CALLBACK, name="E")
    C = te.compute((n,), lambda i: E[i] + A[i], name="C")
    rivet.build(te.create_schedule(C), [A, C], target="cpu", name="cb").save(str(path))
    return path.read_bytes()


def callback_call(ir):
    calls = []
    walk(ir["body"], lambda d: calls.append(d["Call"]) if "Call" in d else None)
    calls = [c for c in calls if "Callback" in c["intrin"]]
    assert len(calls) == 1, calls
    return calls[0]


def load_callback_module(tmp_path, data, name, seen):
    """The refusal's message, or (when the file loads) a failure saying how often one call
    ran the callback."""
    p = tmp_path / name
    p.write_bytes(data)
    try:
        mod = rivet.load_module(str(p))
    except rivet.CompileError as e:
        msg = str(e)
        assert msg.startswith(f"cannot load rivet module {p}"), msg
        assert "internal compiler error" not in msg, msg
        return msg
    seen.clear()
    try:
        mod["cb"](np.arange(8, dtype=np.float32))
        ran = f"ran the callback {len(seen)} times in one call"
    except Exception as e:  # noqa: BLE001 - a rivet error, or the callback's own
        ran = f"failed only at call time ({type(e).__name__}: {e})"
    pytest.fail(f"{name} loaded and {ran}")


def test_callback_module_unmodified_loads_and_calls_once(tmp_path):
    seen = []
    head, payload = split(callback_module(tmp_path / "cb.rivet", seen))
    p = tmp_path / "same.rivet"
    p.write_bytes(join(head, payload))
    f = rivet.load_module(str(p))["cb"]
    seen.clear()
    a = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(np.from_dlpack(f(a)), np.zeros(8, np.float32))
    assert len(seen) == 1


def test_a_callback_called_twice_is_refused(tmp_path):
    seen = []
    head, payload = split(callback_module(tmp_path / "cb.rivet", seen))
    ir = payload["functions"][0]["ir"]
    call = callback_call(ir)
    seqs = []
    walk(ir["body"], lambda d: seqs.append(d["Seq"]) if "Seq" in d else None)
    seq = next(v for v in seqs if any(x.get("Call") is call for x in v))
    # A second call right after the first (inside the allocation of `E`).
    at = next(i for i, x in enumerate(seq) if x.get("Call") is call)
    seq.insert(at + 1, {"Call": json.loads(json.dumps(call))})
    msg = load_callback_module(tmp_path, join(head, payload), "twice.rivet", seen)
    assert "callback 0" in msg and "stage 'E'" in msg, msg
    assert "called 2 times" in msg and "exactly once" in msg, msg


def test_an_unused_callback_entry_is_refused(tmp_path):
    seen = []
    head, payload = split(callback_module(tmp_path / "cb.rivet", seen))
    ir = payload["functions"][0]["ir"]
    ir["callbacks"].append(dict(ir["callbacks"][0], stage="E2"))
    msg = load_callback_module(tmp_path, join(head, payload), "unused.rivet", seen)
    assert "callback 1" in msg and "stage 'E2'" in msg, msg
    assert "never called" in msg and "exactly once" in msg, msg


@pytest.mark.parametrize("op,which", [("Sub", 0), ("Add", 0), ("Sub", 1)])
def test_a_callback_region_that_is_not_the_whole_buffer_is_refused(tmp_path, op, which):
    # `which`: the written region (E) or the read one (A); its extent `n` becomes `n -/+ 1`.
    seen = []
    head, payload = split(callback_module(tmp_path / "cb.rivet", seen))
    ir = payload["functions"][0]["ir"]
    axis = callback_call(ir)["regions"][which]["axes"][0]
    one = {"kind": {"Const": {"Int": 1}}, "dtype": "int64"}
    axis["extent"] = {"kind": {"Binary": [op, axis["extent"], one]}, "dtype": "int64"}
    msg = load_callback_module(tmp_path, join(head, payload), "region.rivet", seen)
    buf = "`E`" if which == 0 else "`A`"
    assert "callback 0" in msg and "stage 'E'" in msg and buf in msg, msg
    assert "whole buffer" in msg and "expected" in msg, msg
