# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.dtg-installed
export OMP_WAIT_POLICY ?= PASSIVE
# the tests run in one worker per core (at most 4), each test module on one worker so that
# its fixtures are built once; PYTEST_XDIST="-n 0" runs them in this process
PYTEST_XDIST ?= -n auto --maxprocesses=4 --dist loadscope

.PHONY: install demo test docs fuzz bench clean

install: $(STAMP)

# torch/torchvision are pinned here (not in pyproject) to the wheels that lie on
# this machine's disk; elsewhere pip takes whatever build your platform offers.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1 || $(PY) -m pip install -q torch torchvision
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dtg demo $(DEMO_ARGS)

test: $(STAMP)
	$(VENV)/bin/ruff check dtg_gpu benchmarks tests
	$(VENV)/bin/ruff format --check dtg_gpu benchmarks tests
	$(PY) -m mypy
	$(PY) -m pytest -q $(PYTEST_XDIST) $(PYTEST_ARGS)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -q -d site

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

# 2,000 mutated inputs per target (checkpoints, run.json, sweep.json, predictor files): 12,000 cases
fuzz: $(STAMP)
	DTG_FUZZ_EXAMPLES=2000 DTG_FUZZ_RANDOM=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz.py

bench: $(STAMP)
	$(PY) benchmarks/bench_centrality.py
	$(PY) benchmarks/bench_sweep.py

clean:
	rm -rf $(VENV) demo-out report site .pytest_cache
