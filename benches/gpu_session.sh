#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool), at most ~570 s, nothing built there: every
# phase has its own time budget, writes its log under $OUT as it goes (so the logs come back
# even when the call times out) and cannot stop the phases after it. Build the cp312 wheel
# first here with `make gpu-wheel` and carry target/gpu-wheel (docs/cuda.md, "On a lent GPU").
#
#   benches/gpu_session.sh            on the lent machine: OUT is set by the device tool
#   benches/gpu_session.sh --dry-run  here, on the CUDA driver double (`make cuda-double`):
#                                     the same phases; those that need a real GPU and the
#                                     frameworks' CUDA runtimes say they were skipped
#
# Phases (budget in seconds): install 30, smoke 30 (devices, NVRTC, one allocation, one launch,
# one DLPack round trip with torch), tests 300 (each test file holding `gpu` or `cuda` tests in
# its own process, a per-test timeout, so one illegal address cannot fail the rest), jax 40
# (the XLA CUDA tests with JAX on the GPU; the test configuration forces JAX onto the CPU
# otherwise), cupy 30, bench 60 (benches/gpu_bench.py), ulps 40 (CUDA's math functions against
# the interpreter's libm, benches/cuda_ulps.py). A summary table is printed last.
#
# Environment: OUT (default /tmp/rivet-gpu-out), PYTHON (python3), WHEEL_DIR (target/gpu-wheel;
# absent: use the rivet already importable), SESSION_FILES (a space-separated subset of test
# files), PER_TEST_TIMEOUT (60).
set -uo pipefail
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT="${OUT:-/tmp/rivet-gpu-out}"
mkdir -p "$OUT/tests"
PY="${PYTHON:-python3}"
WHEEL_DIR="${WHEEL_DIR:-target/gpu-wheel}"
PER_TEST_TIMEOUT="${PER_TEST_TIMEOUT:-60}"
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

elapsed() { echo $(( $(date +%s) - START )); }
# phase NAME BUDGET RESULT: one line of the summary, also printed now.
record() {
  printf '%-8s %4ss used of %4ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$SUMMARY"
}
# run_phase NAME BUDGET CMD...: runs CMD under `timeout BUDGET`, its output to $OUT/NAME.log.
run_phase() {
  local name=$1 budget=$2 t0 rc
  shift 2
  t0=$(date +%s)
  echo "== $name (budget ${budget}s, $(elapsed)s into the session)"
  timeout --kill-after=5 "$budget" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  tail -n 15 "$OUT/$name.log"
  local used=$(( $(date +%s) - t0 ))
  case $rc in
    0) record "$name" "$used" "$budget" "ok" ;;
    124|137) record "$name" "$used" "$budget" "TIMED OUT (log: $name.log)" ;;
    *) record "$name" "$used" "$budget" "FAILED rc=$rc (log: $name.log)" ;;
  esac
  return $rc
}
skip() { record "$1" 0 "$2" "SKIPPED: $3"; }

# ---- install ----------------------------------------------------------------------------------
if ls "$WHEEL_DIR"/*.whl > /dev/null 2>&1; then
  run_phase install 30 "$PY" -m pip install -q --no-index --no-deps --target /tmp/rivet-site "$WHEEL_DIR"/*.whl
  export PYTHONPATH="/tmp/rivet-site${PYTHONPATH:+:$PYTHONPATH}"
else
  skip install 30 "no wheel in $WHEEL_DIR: using the rivet already importable"
fi
"$PY" -c 'import rivet, sys; print("rivet from", rivet.__file__)' 2>&1 | tee "$OUT/rivet.txt"

# ---- the device -------------------------------------------------------------------------------
if [ $DRY = 1 ]; then
  echo "dry run on the CUDA driver double: RIVET_CUDA_DOUBLE=${RIVET_CUDA_DOUBLE:-<default: one sm_90>}" | tee "$OUT/device.txt"
  GPU=0
elif command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 | tee "$OUT/device.txt"
  GPU=1
else
  echo "no nvidia-smi and not --dry-run: nothing to run on" | tee "$OUT/device.txt"
  exit 2
fi

# ---- smoke ------------------------------------------------------------------------------------
run_phase smoke 30 "$PY" benches/gpu_smoke.py --json "$OUT/smoke.json"
smoke_rc=$?

# ---- tests, one process per file --------------------------------------------------------------
# pytest-timeout gives a per-test limit where it is installed; faulthandler_timeout at least
# dumps the stacks of a hung test. The file's own budget stops the rest.
if "$PY" -c 'import pytest_timeout' 2> /dev/null; then
  TIMEOUT_ARGS=(--timeout "$PER_TEST_TIMEOUT")
else
  TIMEOUT_ARGS=(-o "faulthandler_timeout=$PER_TEST_TIMEOUT")
fi
MARKS="gpu or cuda"
[ $GPU = 0 ] && MARKS="cuda"
FILES="${SESSION_FILES:-$(grep -l -E 'pytest\.mark\.(gpu|cuda)|mark\.(gpu|cuda)' tests/python/test_*.py | tr '\n' ' ')}"
t0=$(date +%s)
failed_files=0
for f in $FILES; do
  left=$(( 300 - ($(date +%s) - t0) ))
  if [ $left -le 5 ]; then
    record "$(basename "$f" .py)" 0 0 "SKIPPED: the tests' 300 s budget is spent"
    continue
  fi
  name=$(basename "$f" .py)
  ft0=$(date +%s)
  timeout --kill-after=5 "$left" "$PY" -m pytest -p no:cacheprovider -q -rs -m "$MARKS" "${TIMEOUT_ARGS[@]}" "$f" \
    > "$OUT/tests/$name.log" 2>&1
  rc=$?
  last=$(grep -E '(passed|failed|skipped|error|deselected|no tests ran)' "$OUT/tests/$name.log" | tail -n 1)
  # 5: every test deselected by the marks (a file with no test for this machine).
  case $rc in
    0|5) record "$name" $(( $(date +%s) - ft0 )) "$left" "${last:-ok}" ;;
    124|137) record "$name" $(( $(date +%s) - ft0 )) "$left" "TIMED OUT: ${last}"; failed_files=$((failed_files + 1)) ;;
    *) record "$name" $(( $(date +%s) - ft0 )) "$left" "rc=$rc: ${last}"; failed_files=$((failed_files + 1)) ;;
  esac
done

# ---- JAX on the GPU ---------------------------------------------------------------------------
if [ $GPU = 1 ] && "$PY" -c 'import jax, sys; sys.exit(0 if any(d.platform == "gpu" for d in jax.devices()) else 1)' > "$OUT/jax_probe.log" 2>&1; then
  # conftest only sets JAX_PLATFORMS when it is unset.
  JAX_PLATFORMS=cuda run_phase jax 40 "$PY" -m pytest -p no:cacheprovider -q -rs "${TIMEOUT_ARGS[@]}" tests/python/test_jax_ffi.py
else
  skip jax 40 "no JAX CUDA backend here (needs a real GPU and jax's CUDA plugin)"
fi

# ---- CuPy -------------------------------------------------------------------------------------
if [ $GPU = 1 ] && "$PY" -c 'import cupy; cupy.cuda.runtime.getDeviceCount()' > "$OUT/cupy_probe.log" 2>&1; then
  run_phase cupy 30 "$PY" -m pytest -p no:cacheprovider -q -rs -k cupy "${TIMEOUT_ARGS[@]}" tests/python
else
  skip cupy 30 "no CuPy with a device here"
fi

# ---- the benchmark ----------------------------------------------------------------------------
if [ $GPU = 1 ]; then
  run_phase bench 60 "$PY" benches/gpu_bench.py --json "$OUT/gpu_bench.json"
else
  skip bench 60 "timings need a real GPU"
fi

# ---- CUDA math against the interpreter's libm -------------------------------------------------
# On the double the kernels use the host's libm: the script runs end to end, the numbers say
# nothing about CUDA (it labels them so).
run_phase ulps 40 "$PY" benches/cuda_ulps.py --json "$OUT/cuda_ulps.json"

echo
echo "== summary ($(elapsed)s; logs under $OUT)"
cat "$SUMMARY"
[ $smoke_rc = 0 ] && [ $failed_files = 0 ]
