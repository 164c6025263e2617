# ckpt-vs-accum: `make lab` to learn, `make test` to check everything, `make check` while you work.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
# Machines without an NVIDIA GPU pin the CPU torch wheel (constraints/cpu.txt); GPU machines
# keep the CUDA build that pip picks for torch>=2.5. Override with CONSTRAINTS= or your own file.
CONSTRAINTS ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,-c constraints/cpu.txt)
# `test` runs the tests (pytest, xdist, nbval, nbclient, ruff, Playwright, JupyterLab); `lab` is
# JupyterLab alone (Colab does not need it); `frameworks` (Transformers, Accelerate, Lightning) lets
# lesson 10 run every section (CI=true needs it). `dev` is an alias of `test`.
EXTRAS  ?= test,lab,frameworks
NBVAL   := --nbval-lax --nbval-current-env --nbval-cell-timeout=600
# Tests run headless, in JOBS pytest processes (pytest-xdist), each with one intra-op torch
# thread: on a 2-core machine two one-thread processes beat one two-thread process, and a
# shared machine does not stall in torch's spinning thread pool. Notebooks go to the workers
# whole (--dist loadfile: one kernel per notebook, its cells in order). JOBS=0 runs serially.
# `check` runs each notebook as one test (--forked-notebooks, conftest.py), so its tests can be
# shared out one by one (--dist worksteal: an idle worker takes work from a busy one).
JOBS    ?= 2
XDIST   := $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile)
XDIST_CHECK := $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist worksteal)
HEADLESS := MPLBACKEND=Agg OMP_NUM_THREADS=1
# Python may write bytecode for this repository's own modules (helpers/, tests/, scripts/): where
# PYTHONDONTWRITEBYTECODE is set (the CI machine sets it) every test worker, kernel and torchrun
# worker compiled helpers/ again, and pytest rewrote every test module's asserts again in each
# worker (collecting the tests took 13 s of CPU per process instead of 7). The caches are
# __pycache__/ folders, which git ignores. For the same reason the installed packages are not
# byte-compiled at install (INSTALL_BYTECODE=0): the first process to import a module writes its
# .pyc, so only what runs gets compiled (make setup: 6 s instead of 23 s, and 16 CPU-s less for a
# fresh-clone make test). Outside make, where PYTHONDONTWRITEBYTECODE is set, nothing is cached.
unexport PYTHONDONTWRITEBYTECODE
PYTEST  := $(HEADLESS) $(VENV)/bin/pytest -q -p no:cacheprovider
# Lesson 07's worker pools and torchrun workers fork the imported torch in the tiny notebooks, as in
# the unit tests (seconds saved per worker); learners, and the notebooks at the CPU scale, get
# spawned pools and the real torchrun.
FORK    := LESSONS_POOL_START=fork
TINY    := LESSONS_SCALE=tiny $(FORK)
# Jupyter refuses to start as root (containers, Colab-like VMs) unless told it is fine.
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)
# test-matrix: the oldest torch the package declares (pyproject.toml) and the newest on PyPI.
# The floor installs the extras as declared: Transformers (>= 5.23) refuses torch < 2.6, so the tests and
# lesson 10 must skip what needs it and say why (helpers.frameworks.installed.unusable).
TORCH_FLOOR ?= 2.5.1
MATRIX  ?= .matrix
# gpu-kit: the CPython version of the GPU machine the wheels are for (3.11 for a dry run here).
KIT_PY  ?= 3.12

.PHONY: setup lab check test lint unit distributed notebooks notebooks-tiny browser test-loaded colab bench gpu gpu-kit \
	test-matrix test-matrix-floor test-matrix-newest env-check mutate clean

$(VENV)/.installed: pyproject.toml constraints/cpu.txt scripts/install.py
	$(PYTHON) -m venv $(VENV)
	INSTALL_BYTECODE=0 $(PY) scripts/install.py $(PY) $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	touch $@

setup: $(VENV)/.installed  ## create .venv and install the package with its test tools and JupyterLab

lab: setup  ## open JupyterLab on the lessons
	$(VENV)/bin/jupyter lab $(LAB_FLAGS) notebooks/

# The two tiers. Every test is in exactly one of: the unit tier (-m "$(UNIT)"), `distributed`,
# `browser` or `slow` (tests/conftest.py refuses a test marked both browser and slow); `check` runs
# the unit tier, `test` runs all four. `distributed` tests start worker processes (torchrun, gloo
# pools), which `check` leaves to `test` (DESIGN.md). Each tier is one pytest session, so the two
# workers share out the work to the end. The unit tests' worker pools fork (tests/conftest.py).
# `check` runs each notebook in a fork of a clean copy of its pytest worker, in an in-process
# kernel (--forked-notebooks, conftest.py): about 7 CPU-s less per notebook than a fresh Jupyter
# kernel. `test` runs them under nbval, each in its own kernel, and starts the browser test first
# (its lessons run one after another in one JupyterLab, on one worker; tests/conftest.py orders it
# first and --no-loadscope-reorder keeps that order), so that the other worker shares out the rest
# around it.
UNIT    := not browser and not slow and not distributed
check: lint  ## everyday (target 90 s on 2 cores): ruff, unit tests without worker processes, every notebook at tiny
	$(TINY) LESSONS_STRICT=1 $(PYTEST) -p no:nbval $(XDIST_CHECK) --forked-notebooks -m '$(UNIT)' notebooks/ tests

test: lint  ## everything, as CI runs it: unit + distributed tests, notebooks at CPU scale, browser, Colab, widgets
	LESSONS_STRICT=1 $(PYTEST) $(XDIST) --no-loadscope-reorder $(NBVAL) tests notebooks/

lint: setup  ## ruff over the code and the notebooks
	$(VENV)/bin/ruff check .

unit: setup  ## the unit tests that need no browser, no fresh environment and no worker processes
	$(PYTEST) $(XDIST) -m '$(UNIT)' tests

distributed: setup  ## the tests that start worker processes (torchrun, gloo pools): in test, not in check
	$(PYTEST) $(XDIST) -m 'distributed and not browser and not slow' tests

notebooks: setup  ## every notebook under nbval at the CPU scale, where the claims are checked
	$(HEADLESS) LESSONS_STRICT=1 $(VENV)/bin/pytest -q -p no:cacheprovider $(XDIST) $(NBVAL) notebooks/

notebooks-tiny: setup  ## every notebook under nbval at the tiny scale (lesson 07's workers forked)
	$(HEADLESS) $(TINY) LESSONS_STRICT=1 $(VENV)/bin/pytest -q -p no:cacheprovider $(XDIST) $(NBVAL) notebooks/

browser: setup  ## every lesson in JupyterLab + headless Chromium, at tiny: rendering, controls, sliders
	$(PYTEST) -m browser tests

test-loaded: setup  ## the browser test, then lesson 07 under nbval, each with a CPU-bound neighbour on a core
	@$(VENV)/bin/python -c "while True: pass" & hog=$$!; trap "kill $$hog" EXIT; \
	  start=$$(date +%s); $(PYTEST) -m browser tests || exit 1; mid=$$(date +%s); \
	  $(HEADLESS) LESSONS_STRICT=1 $(VENV)/bin/pytest -q -p no:cacheprovider $(NBVAL) \
	    notebooks/07_data_parallel.ipynb || exit 1; end=$$(date +%s); \
	  echo "with a neighbour: browser test $$((mid - start)) s, lesson 07 under nbval $$((end - mid)) s"

colab: setup  ## the Colab simulation: a fresh Colab-like venv installs the helpers, lesson 01 runs
	$(PYTEST) tests/test_colab.py

env-check: setup  ## one pass/fail line per requirement (python -m helpers.env_check)
	$(PY) -m helpers.env_check

bench: setup  ## execute every notebook, print and save seconds + peak memory (bench.json)
	$(HEADLESS) $(PY) scripts/bench.py

# One torch version in its own venv under $(MATRIX)/: install, unit tests (not the slow Colab
# simulation, which brings its own torch), every notebook. $(1) name, $(2) torch requirement,
# $(3) environment for pip (the newest lifts this machine's pip cap with PIP_CONFIG_FILE=/dev/null).
# These are PyPI's CUDA wheels: about 3 GB to download per venv.
define matrix_run
	rm -rf $(MATRIX)/$(1)
	$(PYTHON) -m venv $(MATRIX)/$(1)
	$(3) $(MATRIX)/$(1)/bin/python -m pip install -q --upgrade pip
	$(3) $(MATRIX)/$(1)/bin/python -m pip install -q '$(2)' -e '.[test,lab,frameworks]'
	$(MATRIX)/$(1)/bin/python -c "import torch; print('== $(1): torch', torch.__version__)"
	cd $(MATRIX) && $(1)/bin/python -m helpers.env_check
	$(HEADLESS) $(MATRIX)/$(1)/bin/python -m pytest -q -p no:cacheprovider $(XDIST) -m 'not slow and not browser' tests
	$(HEADLESS) LESSONS_STRICT=1 $(MATRIX)/$(1)/bin/python -m pytest -q -p no:cacheprovider $(XDIST) $(NBVAL) notebooks/
endef

test-matrix: test-matrix-floor test-matrix-newest  ## unit tests + notebooks on the oldest and newest torch (GBs)

test-matrix-floor:  ## ... on torch $(TORCH_FLOOR), in $(MATRIX)/floor
	$(call matrix_run,floor,torch==$(TORCH_FLOOR),)

test-matrix-newest:  ## ... on the newest torch on PyPI, in $(MATRIX)/newest
	$(call matrix_run,newest,torch,PIP_CONFIG_FILE=/dev/null)

gpu-kit:  ## wheels (CPython $(KIT_PY), manylinux x86-64) a GPU machine without network needs, into .whl/
	bash scripts/gpu_kit.sh $(KIT_PY)

# Not part of `make test`. MUTATE_MODULES="memory tokens" limits it; survivors judged harmless: docs/mutants.md.
mutate: setup  ## mutation testing of the measuring helpers (mutmut 2): score + surviving mutants
	$(PY) -m pip install -q 'mutmut==2.5.1' 'coverage>=7.4'
	PY=$(PY) bash scripts/mutate.sh

gpu:  ## on a CUDA machine: cuda tests, every notebook at the largest scale, 24/16 GB stand-ins
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) $(MATRIX) bench.json .pytest_cache .ruff_cache
	find . -name __pycache__ -not -path "./.*" -prune -exec rm -rf {} +
