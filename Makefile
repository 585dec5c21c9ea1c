# Two commands do everything on a fresh machine with Python 3.11+: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all tutorials bench lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[test,tutorials,dev,fast]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/bam-ppl demo

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m "slow or not slow"

tutorials: $(STAMP)
	$(PY) -m pytest -q tests/test_tutorials.py

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	@echo "installed the benchmark extra; run the scripts in benchmarks/ (see benchmarks/README.md)"

lint: $(STAMP)
	$(VENV)/bin/ruff check bam_ppl tests benchmarks tutorials

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
