# ckpt-vs-accum: `make lab` to learn, `make test` to check everything.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
# Machines without an NVIDIA GPU pin the CPU torch wheel (constraints/cpu.txt); GPU machines
# keep the CUDA build that pip picks for torch>=2.4. Override with CONSTRAINTS= or your own file.
CONSTRAINTS ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,-c constraints/cpu.txt)
NBVAL   := --nbval-lax --nbval-current-env --nbval-cell-timeout=600
HEADLESS := MPLBACKEND=Agg
# Jupyter refuses to start as root (containers, Colab-like VMs) unless told it is fine.
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup lab test lint unit notebooks bench gpu clean

$(VENV)/.installed: pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(CONSTRAINTS) -e '.[dev]'
	touch $@

setup: $(VENV)/.installed  ## create .venv and install the package with its dev tools

lab: setup  ## open JupyterLab on the lessons
	$(VENV)/bin/jupyter lab $(LAB_FLAGS) notebooks/

test: setup  ## ruff, unit tests, then every notebook under nbval
	$(VENV)/bin/ruff check .
	$(HEADLESS) $(VENV)/bin/pytest -q tests
	$(HEADLESS) LESSONS_STRICT=1 $(VENV)/bin/pytest -q -p no:cacheprovider $(NBVAL) notebooks/

bench: setup  ## execute every notebook, print and save seconds + peak memory (bench.json)
	$(HEADLESS) $(PY) scripts/bench.py

gpu:  ## on a CUDA machine: cuda-marked tests + every notebook at full scale
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) bench.json .pytest_cache .ruff_cache
