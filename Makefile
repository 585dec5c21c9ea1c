# Two commands do everything on a fresh machine with Python 3.11+: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Python 3.12 with ArviZ 1.x and a newer JAX: a second venv from the pyenv interpreter.
PYTHON312 ?= $(HOME)/.pyenv/versions/3.12.1/bin/python
VENV312 := .venv312
PY312 := $(VENV312)/bin/python
STAMP312 := $(VENV312)/.installed
PYTEST_ARGS ?=
# The suite runs on every core (pytest-xdist; at most 4 workers, each holds its own JAX and data),
# each test module on one worker (tests/conftest.py). `make test PARALLEL=` runs it in one process.
PARALLEL ?= -n auto --maxprocesses=4 --dist loadgroup

.PHONY: install demo test test-stats test-integration test-all test-py312 test-py312-subset tutorials bench lint clean clean-kernels docs wheel-check

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[test,tutorials,dev,fast,distributed]"
	touch $(STAMP)

# The virtual environment with every extra the tests, tutorials and benchmarks use (`make test` and
# `make demo` make it first where it is missing).
install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/bam-ppl demo

# The numba kernels are compiled once, two families at a time, before the workers start: each
# worker would otherwise compile the same kernels at the same time (bam_ppl/precompile.py).
test: $(STAMP)
	$(PY) -m bam_ppl.precompile --jobs 2
	$(PY) -m pytest -q $(PARALLEL)

$(PY312):
	$(PYTHON312) -m venv $(VENV312)
	$(PY312) -m pip install --quiet --upgrade pip

$(STAMP312): pyproject.toml | $(PY312)
	$(PY312) -m pip install --quiet -e ".[test,tutorials,dev,fast,distributed]"
	touch $(STAMP312)

# The tests that exercise ArviZ, NumPyro and JAX directly: what .ci/run checks on Python 3.12
# (`make test-py312` alone runs the whole suite there).
PY312_SUBSET := -m "not slow" tests/test_arviz_user.py tests/test_numpyro.py tests/test_plots.py tests/test_named_dims.py \
	tests/test_smc.py tests/test_nbmf.py tests/test_selection.py tests/test_pmf.py tests/test_data.py \
	"tests/test_tutorials.py::test_tutorial_runs[arviz_checks]"

# `make test-py312 PYTEST_ARGS="tests/test_numpyro.py"` runs a subset.
test-py312: $(STAMP312)
	$(PY312) -c "import arviz, jax, sys; print('python', sys.version.split()[0], 'arviz', arviz.__version__, 'jax', jax.__version__); assert int(arviz.__version__.split('.')[0]) >= 1, 'test-py312 is meant to run ArviZ 1.x'"
	$(PY312) -m pytest -q $(PARALLEL) $(PYTEST_ARGS)

test-py312-subset:
	$(MAKE) test-py312 PYTEST_ARGS='$(PY312_SUBSET)'

# The statistical checks at realistic size (estimators against exact enumeration, the bounds and
# the spread of independent calls at T >= 1000, the papers' reference reproductions): slow tests
# marked `stats`, run by .ci/run after make test.
test-stats: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) -m stats

# The tests that run beside other systems: Dask clusters and process pools (executor=), JAX on
# forced host devices, NumPyro's own MCMC driver on a raw program (marked `integration`; .ci/run
# runs them after make test).
test-integration: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) -m "integration and not slow"

test-all: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) -m "slow or not slow"

# Every tutorial end to end with small settings (outside `make test`; .ci/run runs them after it).
tutorials: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) -m tutorial tests/test_tutorials.py

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	@echo "installed the benchmark extra; run the scripts in benchmarks/ (see benchmarks/README.md)"

# The documentation site, built offline into docs/_build/html: API reference, the tutorials
# executed with small settings (BAM_PPL_SMALL=1; one that fails is listed as not executed).
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install --quiet -e ".[docs]"
	touch $(DOCS_STAMP)

# `make docs SPHINXOPTS="-W --keep-going"` turns warnings into errors.
SPHINXOPTS ?=

docs: $(DOCS_STAMP)
	$(PY) -m sphinx -b html -q $(SPHINXOPTS) docs docs/_build/html
	@echo "documentation: docs/_build/html/index.html"

# The package as a user gets it (.ci/wheel-check): the wheel built from a clean copy of the work
# tree, installed into a fresh venv in a temporary folder, then `bam-ppl demo`, every bundled data
# set loader and `bam-ppl evidence` on a CSV, run from a folder with no ../shared and no
# $$BAM_PPL_DATA; any pip or setuptools warning fails it.
wheel-check:
	PYTHON=$(PYTHON) bash .ci/wheel-check

lint: $(STAMP)
	$(VENV)/bin/ruff check bam_ppl tests benchmarks tutorials

clean: clean-kernels
	rm -rf $(VENV) $(VENV312) build *.egg-info .pytest_cache

# numba's cache beside the package (cache=True). It keys each kernel on its own file only: after an edit
# to a helper module, the kernels of other files that inline it run the old code until this removes them.
clean-kernels:
	find bam_ppl -name '*.nbi' -delete -o -name '*.nbc' -delete
