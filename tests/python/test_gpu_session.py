"""benches/gpu_session.sh runs end to end on the CUDA driver double (``--dry-run``), so the script a
lent GPU gets one call for is itself tested: every phase reports in the summary, the phases that
need a real GPU say they were skipped, the smoke step and the ulps phase run a kernel through the
driver, and one failing test file fails the session without stopping the phases after it.
"""

import json
import os
import subprocess

import pytest

import cuda_driver as cu

pytestmark = pytest.mark.cuda
cu.require_cuda()

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benches", "gpu_session.sh")


def run_session(tmp_path, files):
    out = tmp_path / "out"
    env = cu.child_env(OUT=str(out), PYTHON=os.environ.get("PYTHON_FOR_SESSION", __import__("sys").executable), WHEEL_DIR=str(tmp_path / "no-wheel"), SESSION_FILES=" ".join(files), PER_TEST_TIMEOUT="60")
    p = subprocess.run(["bash", SCRIPT, "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    summary = (out / "summary.txt").read_text()
    return p, out, summary


def test_the_session_script_dry_runs_on_the_double_and_survives_a_failing_file(tmp_path):
    if not cu.is_double():
        pytest.skip("a real driver is loaded: the dry run is for the double")
    failing = tmp_path / "test_session_fails.py"
    failing.write_text("import pytest\n\n\n@pytest.mark.cuda\ndef test_fails():\n    assert 1 == 2\n")
    passing = tmp_path / "test_session_passes.py"
    passing.write_text("import pytest\n\n\n@pytest.mark.cuda\ndef test_passes():\n    assert 1 == 1\n")
    p, out, summary = run_session(tmp_path, [str(failing), str(passing)])
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    lines = {line.split()[0]: line for line in summary.splitlines() if line.strip()}
    # Every phase is in the summary, in the order it ran, the failing file did not stop the rest.
    assert list(lines) == ["install", "smoke", "test_session_fails", "test_session_passes", "jax", "cupy", "bench", "ulps"], summary
    assert "SKIPPED" in lines["install"]
    assert lines["smoke"].endswith("ok"), summary
    assert "rc=1" in lines["test_session_fails"] and "1 failed" in lines["test_session_fails"], summary
    assert "1 passed" in lines["test_session_passes"], summary
    for phase in ("jax", "cupy", "bench"):
        assert "SKIPPED" in lines[phase], summary
    assert lines["ulps"].endswith("ok"), summary
    smoke = json.loads((out / "smoke.json").read_text())
    assert "equals numpy bit for bit" in smoke["launch"]
    assert smoke["dlpack"].startswith("SKIPPED")
    ulps = json.loads((out / "cuda_ulps.json").read_text())
    assert ulps["device"].startswith("driver double")
    assert {r["fn"] for r in ulps["rows"]} >= {"exp", "log", "tanh", "erf", "pow"}
    # The logs are under OUT, one per test file.
    assert (out / "tests" / "test_session_fails.log").read_text().count("assert 1 == 2") >= 1
