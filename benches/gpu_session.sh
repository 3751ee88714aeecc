#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool): install the carried cp312 wheel, run the
# `gpu`-marked tests, then the GPU benchmark; logs and JSON under $OUT. Build the wheel first on
# the development machine with `make gpu-wheel` and carry `target/gpu-wheel` (docs/cuda.md,
# "On a lent GPU"). The GPU machine has Python 3.12, torch, JAX and CuPy, and no Rust.
set -uo pipefail
OUT="${OUT:-/tmp/rivet-gpu-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
"$PY" -m pip install -q --no-index --no-deps --target /tmp/site target/gpu-wheel/*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
echo "== gpu tests"
# -p no:cacheprovider: the checkout may be read-only there; the gpu marker selects device tests.
"$PY" -m pytest -p no:cacheprovider -m gpu tests/python -q -rs 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
tests_rc=${PIPESTATUS[0]}
echo "== gpu bench"
"$PY" benches/gpu_bench.py --json "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/gpu_bench.log" | tail -12
bench_rc=${PIPESTATUS[0]}
echo "tests rc=$tests_rc bench rc=$bench_rc"
exit $(( tests_rc != 0 || bench_rc != 0 ))
