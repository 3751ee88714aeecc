# rivet: one entry point for a fresh machine (Rust + Python 3.11 + pip).
#   make demo    venv + build + the demos (runtime; rivet ops in torch.compile and jax.jit with
#                backward passes; a GEMM built in Rust, used from Python; the
#                same for the GPU, which without a GPU runs the GPU-scheduled IR on the interpreter)
#   make test    venv + mxnet venv + build + cargo tests + pytest (main and MXNet suites), then
#                the CUDA suites on the CUDA driver double (make cuda-double; docs/testing.md)
#   make cuda-double  the CUDA driver double (tests/cuda_double) as target/cuda-double/libcuda.so.1
#   make bench   venv + build + benches/call_overhead.py, benches/cpu_bench.py (TVM installed),
#                benches/grad_bench.py and benches/user_kernels.py
#   make docs    the docs book (docs/, mdBook) in target/book; mdBook is installed into
#                target/tools on first use (make test builds the book too)
#   make fuzz    venv + build + a FUZZ_SECONDS soak (default one hour) of the Rust fuzzer and the
#                Hypothesis suite with its large profile (docs/testing.md, "Fuzzing")
# Venvs are created once; stamp files inside them record the installed package list, so a
# second run does not reinstall (edit the lists below and the venv is updated on the next run).

PYTHON ?= python3
VENV   := .venv
MXVENV := .venv-mxnet

VPY       := $(VENV)/bin/python
MXPY      := $(MXVENV)/bin/python
WHEEL_DIR := target/wheels-out

VENV_DEPS   := torch==2.15.0 "jax[cpu]" numpy pytest maturin matplotlib hypothesis mypy
VENV_OPT    := apache-tvm-ffi
MXVENV_DEPS := mxnet==1.9.1 "numpy<1.24" pytest

VENV_STAMP   := $(VENV)/.deps-stamp
MXVENV_STAMP := $(MXVENV)/.deps-stamp

# Fuzzing: `make fuzz FUZZ_SECONDS=3600` soaks; `make test` runs FUZZ_SHORT seconds of it,
# from a fixed seed (1) so CI is deterministic: the soak explores, `make test` re-checks.
# The Rust fuzzer gets 90% of the soak, Hypothesis (large profile) what it takes.
FUZZ_SECONDS ?= 3600
FUZZ_SHORT   ?= 40
FUZZ_SEED    ?=
FUZZ_ARGS     = $(if $(FUZZ_SEED),--seed $(FUZZ_SEED))

# Directory of libpython, for the cargo test binaries that embed Python (cargo drops
# build-script link paths outside target/ from the loader path). Expanded when a recipe runs.
PY_LIBDIR = $$($(VPY) -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
# NVRTC from the torch wheel's NVIDIA libraries in the main venv: the CUDA backend's tests
# compile every generated kernel with it (no GPU needed). A cargo test binary is not inside the
# venv, so it is told where NVRTC is; RIVET_REQUIRE_NVRTC=1 makes its absence an error, never a
# silent skip (docs/cuda.md).
NVRTC_DIR = $$($(VPY) -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')

.DEFAULT_GOAL := build
.PHONY: venv mxvenv build demo test bench fuzz docs gpu-wheel cuda-double test-cuda-double clean FORCE
FORCE:

# A stamp whose content differs from the current package list is out of date.
ifneq ($(file < $(VENV_STAMP)),$(VENV_DEPS) $(VENV_OPT))
$(VENV_STAMP): FORCE
endif
ifneq ($(file < $(MXVENV_STAMP)),$(MXVENV_DEPS))
$(MXVENV_STAMP): FORCE
endif

venv: $(VENV_STAMP)
mxvenv: $(MXVENV_STAMP)

$(VENV_STAMP):
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --upgrade pip
	$(VPY) -m pip install $(VENV_DEPS)
	$(VPY) -m pip install $(VENV_OPT) || echo "warning: could not install $(VENV_OPT) (only the benchmarks use it)"
	printf '%s\n' '$(VENV_DEPS) $(VENV_OPT)' > $@

# numpy<1.24 (needed by mxnet 1.9.1) has no wheels for Python >= 3.12.
$(MXVENV_STAMP):
	@test -x $(MXPY) || $(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] > (3, 11))' \
	  || { echo "error: the MXNet venv needs Python <= 3.11; run e.g. 'make test PYTHON=python3.11'" >&2; exit 1; }
	test -x $(MXPY) || $(PYTHON) -m venv $(MXVENV)
	$(MXPY) -m pip install --upgrade pip
	$(MXPY) -m pip install $(MXVENV_DEPS)
	printf '%s\n' '$(MXVENV_DEPS)' > $@

# One wheel, built against the main venv's interpreter (cp311), installed into both venvs.
# Always rebuilt: cargo is incremental, so this is cheap when nothing changed.
build: venv
	rm -rf $(WHEEL_DIR)
	$(VENV)/bin/maturin build --release -m bindings/Cargo.toml -o $(WHEEL_DIR) -i $(VPY)
	$(VPY) -m pip install --force-reinstall --no-deps $(WHEEL_DIR)/*.whl

demo: venv build
	$(VPY) bindings/examples/demo.py
	$(VPY) bindings/examples/frameworks.py
	cargo run --release -p rivet-compiler --example gemm_module -- target/gemm.rivet
	$(VPY) compiler/examples/use_gemm.py target/gemm.rivet
	RIVET_NVRTC_PATH="$$($(VPY) -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)" \
	  cargo run --release -p rivet-compiler --example gemm_cuda -- target/gemm_cuda.rivet
	$(VPY) compiler/examples/use_gemm_cuda.py target/gemm_cuda.rivet

# mdBook, pinned, built from crates.io without its server and file watcher (2 minutes once).
MDBOOK_VERSION := 0.5.4
MDBOOK        := target/tools/bin/mdbook
$(MDBOOK):
	cargo install --locked --quiet mdbook --version $(MDBOOK_VERSION) --no-default-features --root target/tools

# The book must build without a warning (an unclosed HTML tag is one); its links and code
# blocks are checked by tests/python/test_docs_*.py and the `rivet` crate's doctests.
docs: $(MDBOOK)
	$(MDBOOK) build > target/book.log 2>&1 || { cat target/book.log; exit 1; }
	@if grep -q WARN target/book.log; then cat target/book.log; exit 1; fi

# The CUDA driver double (tests/cuda_double, docs/testing.md): a libcuda.so.1 that runs
# rivet's kernels on the CPU, in a folder of its own that only the runs asking for it put on
# the loader path. Never under the name libcuda.so* inside the cargo target folder: cargo puts
# its folders on the loader path of every test binary it runs, and the other tests must keep
# seeing no driver. Copied through a temporary name, so a process still mapping the old file
# is not changed under it.
CARGO_OUT        := $(or $(CARGO_TARGET_DIR),target)
CUDA_DOUBLE_DIR  := target/cuda-double
CUDA_DOUBLE_LOG  := $(CUDA_DOUBLE_DIR)/report.log
cuda-double:
	cargo build --release -p rivet-cuda-double
	mkdir -p $(CUDA_DOUBLE_DIR)
	cp $(CARGO_OUT)/release/librivet_cuda_double.so $(CUDA_DOUBLE_DIR)/.libcuda.so.1.tmp
	mv -f $(CUDA_DOUBLE_DIR)/.libcuda.so.1.tmp $(CUDA_DOUBLE_DIR)/libcuda.so.1
	ln -sfn libcuda.so.1 $(CUDA_DOUBLE_DIR)/libcuda.so

# The environment of a run on the double: its driver first on the loader path, two devices
# (sm_90 and sm_80: the per-device paths run on both), the CUDA C of every cubin rivet loads
# where the double finds it, and a report log of every misuse it saw. RIVET_REQUIRE_CUDA=1:
# a double rivet cannot use fails the cuda tests instead of skipping them.
CUDA_DOUBLE_ENV = LD_LIBRARY_PATH="$(abspath $(CUDA_DOUBLE_DIR)):$(PY_LIBDIR)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" \
  RIVET_CUDA_DOUBLE="devices=sm_90,sm_80" RIVET_CUBIN_SOURCES="$(abspath $(CUDA_DOUBLE_DIR))/sources" \
  RIVET_CUDA_DOUBLE_LOG="$(abspath $(CUDA_DOUBLE_LOG))" RIVET_REQUIRE_CUDA=1 \
  RIVET_REQUIRE_NVRTC=1 RIVET_NVRTC_PATH="$(NVRTC_DIR)" PYO3_PYTHON=$(abspath $(VPY))

# `make test-cuda-double` (part of `make test`): rivet's CUDA paths on the double: the cargo suites' cuda:: entries (every kernel the CPU
# suite runs, on device memory) and the tests marked `cuda`. A test that provokes misuse on
# purpose points RIVET_CUDA_DOUBLE_LOG at a file of its own; a line in the shared log is
# misuse no test expected, and fails the run even when every test passed. The cargo run takes
# the workspace's feature set (--workspace, integration tests only), so it reuses the test
# binaries of `make test`'s main run instead of rebuilding them under other features.
define run-cuda-double
rm -f $(CUDA_DOUBLE_LOG)
$(CUDA_DOUBLE_ENV) cargo test --workspace --release --test '*' -- cuda::
$(CUDA_DOUBLE_ENV) $(VPY) -m pytest -q -m cuda tests/python
@if [ -s $(CUDA_DOUBLE_LOG) ]; then \
  echo "error: the CUDA driver double reported misuse no test expected ($(CUDA_DOUBLE_LOG)):" >&2; \
  cat $(CUDA_DOUBLE_LOG) >&2; exit 1; fi
endef

test-cuda-double: venv build cuda-double
	$(run-cuda-double)

test: venv mxvenv build docs cuda-double
	$(MXPY) -m pip install --force-reinstall --no-deps $(WHEEL_DIR)/*.whl
	PYO3_PYTHON=$(abspath $(VPY)) LD_LIBRARY_PATH="$(PY_LIBDIR)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" \
	  RIVET_REQUIRE_NVRTC=1 RIVET_VERIFY_CLIF=1 RIVET_NVRTC_PATH="$(NVRTC_DIR)" cargo test --workspace --release
	RIVET_REQUIRE_NVRTC=1 RIVET_VERIFY_CLIF=1 $(VPY) -m pytest -q tests/python
	RIVET_VERIFY_CLIF=1 cargo run --release -q -p rivet-tests --bin fuzz -- --seconds $(FUZZ_SHORT) $(if $(FUZZ_SEED),--seed $(FUZZ_SEED),--seed 1)
	MXNET_ENGINE_TYPE=NaiveEngine $(MXPY) -m pytest -q tests/mxnet
	$(run-cuda-double)

fuzz: venv build
	cargo run --release -q -p rivet-tests --bin fuzz -- \
	  --seconds $$(( $(FUZZ_SECONDS) * 9 / 10 )) $(FUZZ_ARGS)
	RIVET_HYPOTHESIS_PROFILE=large RIVET_CHECKED=1 $(VPY) -m pytest -q tests/python/test_fuzz_hypothesis.py \
	  tests/python/test_fuzz_torch_ops.py

# TVM (apache-tvm, about 100 MB) only for the benchmarks: it is the peer they compare with.
bench: venv build
	$(VPY) -c 'import tvm' 2>/dev/null || $(VPY) -m pip install apache-tvm \
	  || echo "warning: could not install apache-tvm: the TVM cases are skipped"
	$(VPY) benches/call_overhead.py
	$(VPY) benches/cpu_bench.py
	$(VPY) benches/grad_bench.py
	$(VPY) benches/user_kernels.py

# A cp312 wheel for a lent GPU machine (Python 3.12 there, no Rust), in target/gpu-wheel: carry
# that folder and run benches/gpu_session.sh there (docs/cuda.md, "On a lent GPU").
GPU_PYTHON ?= $(firstword $(wildcard /root/.pyenv/versions/3.12*/bin/python3) python3.12)
gpu-wheel:
	test -x target/py312/bin/maturin || { $(GPU_PYTHON) -m venv target/py312 && target/py312/bin/pip install -q maturin; }
	rm -rf target/gpu-wheel
	target/py312/bin/maturin build --release -m bindings/Cargo.toml -i target/py312/bin/python -o target/gpu-wheel

clean:
	rm -rf $(WHEEL_DIR)
