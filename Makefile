# prx_assets -- `make demo` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export PRX_DATA_ROOT ?= $(CURDIR)/data
export PRX_CONFIG_DIR ?= $(CURDIR)/config
PORT ?= 3000

.PHONY: venv demo test test-fast lint bench gpu-wheels gpu-smoke dev validate clean slurm-up slurm-down

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV) (about 7 GB the first time, mostly PyTorch; log in $(VENV)/pip.log) ..."
	@$(PY) -m pip install -q --disable-pip-version-check -U pip > $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]' >> $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	@touch $(STAMP)

venv: $(STAMP)

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	@mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $(DAGSTER_HOME)/dagster.yaml

demo: venv $(DAGSTER_HOME)/dagster.yaml
	$(VENV)/bin/prx-assets demo

lint: venv
	$(VENV)/bin/ruff check prx_assets tests bench

validate: venv $(DAGSTER_HOME)/dagster.yaml
	$(VENV)/bin/dagster definitions validate -m prx_assets.definitions

# Everything, as CI runs it (SLURM, browser, PostgreSQL, S3 tiers included), one file per
# worker at a time (TEST_WORKERS=0 runs it serially in one process).
TEST_WORKERS ?= 2
test: venv lint
	$(VENV)/bin/pytest -q -ra --durations=30 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# Unit + asset tests (no external services): the loop while developing, a minute or two.
test-fast: venv lint
	$(VENV)/bin/pytest -q -ra -m "not slow"

bench: venv
	$(PY) -m bench
	$(PY) -m bench report

# The wheels bench/gpu.py brings to a GPU machine without mosaicml-streaming (cp312 manylinux, ~8 MB with pyroaring for skip lists):
# carry .gpu-wheels and run `python bench/gpu.py --wheels .gpu-wheels --out gpu.json` there.
gpu-wheels: venv
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
	  -d .gpu-wheels $$($(PY) -c "import bench.gpu as g; print(' '.join(g.WHEELS))")

# The GPU bench's code paths on the CPU with tiny shapes (under 3 minutes).
gpu-smoke: venv
	$(PY) bench/gpu.py --smoke

dev: venv $(DAGSTER_HOME)/dagster.yaml
	$(VENV)/bin/dagster dev -m prx_assets.definitions -h 127.0.0.1 -p $(PORT)

# A single-node SLURM cluster (munge, slurmdbd on the local MariaDB, slurmctld, slurmd); needs root.
slurm-up:
	bash slurm/up.sh

slurm-down:
	bash slurm/down.sh

clean:
	rm -rf .dagster_home data .pytest_cache
