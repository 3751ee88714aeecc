"""Programs of many stages through the Python te layer (docs/limits.md).

A chain ``X_{k+1} = X_k * 1.0001 + 1`` of 5000 materialised stages: ``rivet.create_schedule``
and ``rivet.build`` for every backend, the result against a numpy float32 reference on fresh
random data (output poisoned first), and the module saved and loaded again. A ``compute_at``
chain past the nesting limit is a ``rivet.CompileError`` naming ``MAX_STMT_DEPTH``. A
20,000-stage chain is scheduled, printed, differentiated and dropped on a thread with a
2 MiB stack (``threading.stack_size``), where a recursive walk or drop would overflow it.
"""

import threading

import numpy as np
import pytest

import rivet
from rivet import te

N = 8


def chain(n):
    X = te.placeholder((N,), "float32", name="X")
    stages = []
    t = X
    for k in range(n):
        t = te.compute((N,), lambda i, p=t: p[i] * 1.0001 + 1, name=f"X{k + 1}")
        stages.append(t)
    return X, stages


def reference(x, n):
    c, one = np.float32(1.0001), np.float32(1)
    y = x.astype(np.float32)
    for _ in range(n):
        y = y * c + one
    return y


def test_five_thousand_stages_build_run_save_and_load(target, rng, poison, tmp_path):
    n = 5000
    X, stages = chain(n)
    s = rivet.create_schedule(stages[-1])
    mod = rivet.build(s, [X, stages[-1]], target=target, name="chain")
    x = rng.standard_normal(N).astype(np.float32)
    want = reference(x, n)
    out = np.empty(N, np.float32)
    poison(out)
    mod["chain"](x, out)
    np.testing.assert_array_equal(out, want)
    path = str(tmp_path / "chain.rivet")
    mod.save(path)
    loaded = rivet.load_module(path)["chain"]
    poison(out)
    loaded(x, out)
    np.testing.assert_array_equal(out, want)


def test_a_compute_at_chain_past_the_nesting_limit_is_a_compile_error(target):
    X, stages = chain(2500)
    s = rivet.create_schedule(stages[-1])
    for a, b in zip(stages, stages[1:]):
        s[a].compute_at(s[b], b.op.axis[0])
    with pytest.raises(rivet.CompileError, match=r"MAX_STMT_DEPTH") as e:
        rivet.build(s, [X, stages[-1]], target=target, name="chain", default_schedule=False)
    assert "at least 2500 deep" in str(e.value)
    assert "compute_at" in str(e.value)


def test_a_20000_stage_chain_needs_no_deep_stack(rng):
    n = 20_000
    failures = []

    def work():
        try:
            X, stages = chain(n)
            out = stages[-1]
            del stages
            s = rivet.create_schedule(out)
            assert f"X{n}" in repr(out)
            (g,) = te.gradient(out, [X])
            assert g.shape == X.shape
            del g, s
            mod = rivet.build(
                rivet.create_schedule(out), [X, out], target="interp", name="chain"
            )
            x = rng.standard_normal(N).astype(np.float32)
            got = np.from_dlpack(mod["chain"](x))
            np.testing.assert_array_equal(got, reference(x, n))
            del mod, out, X
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    old = threading.stack_size(2 << 20)
    try:
        t = threading.Thread(target=work)
        t.start()
        t.join()
    finally:
        threading.stack_size(old)
    assert not failures, failures
