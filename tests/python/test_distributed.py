"""Beyond one process: the runnable examples train a model with a rivet custom op
under DistributedDataParallel (2 gloo processes, CPU) and run a rivet FFI op per shard under
jax.shard_map (2 host devices). Each example checks itself against the single-process /
unsharded computation and exits non-zero otherwise; they run in fresh interpreters because
DDP spawns processes and XLA's device count is fixed when JAX starts."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "bindings", "examples")


def _run(script, expect):
    env = dict(os.environ, OMP_NUM_THREADS="1", RIVET_NUM_THREADS="1")
    env.pop("XLA_FLAGS", None)
    p = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, script)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert p.returncode == 0, f"{script} failed:\n{p.stdout}\n{p.stderr}"
    assert expect in p.stdout, p.stdout


def test_ddp_training_with_a_rivet_op_matches_one_process():
    pytest.importorskip("torch.distributed")
    _run("ddp_train.py", "ddp ok")


def test_shard_map_runs_a_rivet_op_per_shard():
    pytest.importorskip("jax")
    _run("jax_shard_map.py", "shard_map ok")
