# The two set-up commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Reinstall only when a dependency file changes: the stamp's name carries their hash.
DEPS_HASH := $(shell cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
STAMP := $(VENV)/.installed-$(DEPS_HASH)

.PHONY: install test test-fast lint typecheck demo bench clean

install: $(STAMP)

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@rm -f $(VENV)/.installed-*
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, from the local CPU wheel; everything after it is held to that version by constraints.txt
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m pip check
	@touch $@

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

demo: install
	$(VENV)/bin/quartet demo

bench: install
	$(PY) benchmarks/batch_serialization.py
	$(PY) benchmarks/dispatch_overhead.py
	$(PY) benchmarks/train_throughput.py
	$(PY) benchmarks/rollout_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
