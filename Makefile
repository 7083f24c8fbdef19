# The two set-up commands of the README are `make demo` and `make test`; both create .venv on demand.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
RUN_STAMP := $(VENV)/.installed
# torch is pinned to the CPU wheel for development and tests; users get the open `torch>=2.1` extra.
TORCH_PIN := torch==2.13.0

.PHONY: demo test test-slow bench lint clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e .
	touch $@

$(STAMP): pyproject.toml $(RUN_STAMP)
	$(PY) -m pip install -q -e '.[dev]' '$(TORCH_PIN)'
	touch $@

# Azurite (Microsoft's Azure Blob Storage emulator, an npm package) for the az:// tests; the stamp names
# the version, so changing the pin reinstalls it
AZURITE_PIN := azurite@3.35.0
NODE_STAMP := $(VENV)/.installed-$(AZURITE_PIN)
$(NODE_STAMP): | $(VENV)/bin/python
	@command -v npm >/dev/null || { echo "make test needs npm (Node.js) for Azurite, the Azure Blob emulator of the az:// tests" >&2; exit 1; }
	npm install --prefix $(VENV)/node --no-audit --no-fund --save-exact --loglevel=error $(AZURITE_PIN)
	touch $@

$(VENV)/.installed-bench: pyproject.toml $(STAMP)
	$(PY) -m pip install -q -e '.[dev,bench]' '$(TORCH_PIN)'
	-$(PY) -m pip install -q grain  # optional peer for bench/orders.py; skipped there when missing
	# bench/remote.py serves object reads from nginx (apt, as root); a line says why not where it cannot
	-$(PY) -m bench._remote_nginx --install
	touch $@

demo: $(RUN_STAMP)
	$(VENV)/bin/seqstore demo --out demo-out

# pytest exits 5 when it collects nothing: that must fail, and it does (make stops on any non-zero).
test: $(STAMP) $(NODE_STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP) $(NODE_STAMP)
	$(PY) -m pytest -q -m slow

# `make bench BENCH_FLAGS=--quick` for the quick sizes; peers that cannot be installed here (LogIX:
# set LOGIX_SRC=/path/to/logix_ai-0.1.1) are skipped with one line each, listed at the end.
BENCH_FLAGS ?=
bench: $(VENV)/.installed-bench
	$(PY) bench/run_all.py $(BENCH_FLAGS)

# tests/test_layers.py: no import circle, no module over 700 lines, no import up the layers of src/seqstore
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/mypy --strict src/seqstore
	$(PY) -m pytest -q tests/test_layers.py

clean:
	rm -rf $(VENV) demo-out .pytest_cache .mypy_cache .ruff_cache
