# ckpt-vs-accum: `make lab` to learn, `make test` to check everything.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
# Machines without an NVIDIA GPU pin the CPU torch wheel (constraints/cpu.txt); GPU machines
# keep the CUDA build that pip picks for torch>=2.5. Override with CONSTRAINTS= or your own file.
CONSTRAINTS ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,-c constraints/cpu.txt)
# JupyterLab is the `lab` extra (Colab does not need it); tests/test_lab.py checks it serves the lessons.
# `frameworks` (Transformers, Accelerate, Lightning) lets lesson 10 run every section; CI=true needs it.
EXTRAS  ?= dev,lab,frameworks
NBVAL   := --nbval-lax --nbval-current-env --nbval-cell-timeout=600
HEADLESS := MPLBACKEND=Agg
# Jupyter refuses to start as root (containers, Colab-like VMs) unless told it is fine.
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)
# test-matrix: the oldest torch the package declares (pyproject.toml) and the newest on PyPI.
TORCH_FLOOR ?= 2.5.1
MATRIX  ?= .matrix
# gpu-kit: the CPython version of the GPU machine the wheels are for (3.11 for a dry run here).
KIT_PY  ?= 3.12

.PHONY: setup lab test lint unit notebooks bench gpu gpu-kit test-matrix test-matrix-floor \
	test-matrix-newest env-check mutate clean

$(VENV)/.installed: pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	touch $@

setup: $(VENV)/.installed  ## create .venv and install the package with its dev tools and JupyterLab

lab: setup  ## open JupyterLab on the lessons
	$(VENV)/bin/jupyter lab $(LAB_FLAGS) notebooks/

test: setup  ## ruff, unit tests (with the Colab simulation), then every notebook under nbval
	$(VENV)/bin/ruff check .
	$(HEADLESS) $(VENV)/bin/pytest -q tests
	$(HEADLESS) LESSONS_STRICT=1 $(VENV)/bin/pytest -q -p no:cacheprovider $(NBVAL) notebooks/

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
	$(3) $(MATRIX)/$(1)/bin/python -m pip install -q '$(2)' -e '.[dev,lab]'
	$(MATRIX)/$(1)/bin/python -c "import torch; print('== $(1): torch', torch.__version__)"
	$(HEADLESS) $(MATRIX)/$(1)/bin/python -m pytest -q -p no:cacheprovider -m 'not slow and not browser' tests
	$(HEADLESS) LESSONS_STRICT=1 $(MATRIX)/$(1)/bin/python -m pytest -q -p no:cacheprovider $(NBVAL) notebooks/
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
