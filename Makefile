# marketrl: two commands. `make run` sets up .venv (pinned) and runs the pipeline on the demo data;
# `make test` sets up the same way and runs lint, the DAG dry-run and every test but the `slow` ones (~6 min on 2
# cores); `make test-slow` runs the `slow` ones: the suites that start many pipelines (.ci/run runs both).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
CORES ?= 4
SNAKEMAKE := $(BIN)/snakemake
PYTEST_ARGS ?=  # extra pytest arguments for test and test-slow, e.g. PYTEST_ARGS=--durations=40

.PHONY: run test test-slow setup lint dryrun bench clean-results test-slurm test-postgres export tensorboard dashboard

run: $(STAMP)
	$(SNAKEMAKE) --cores $(CORES) results/eval_report.html

# Every model, fold and seed of the config exported (results/export/; trains what is missing; not part of `run`).
export: $(STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[export]'
	$(SNAKEMAKE) --cores $(CORES) export_all

# Re-install only when the pins or the package metadata change; a second call is quick. `make run` installs what
# the pipeline needs; the test and lint targets add the `dev` extra (test tools, onnx/onnxruntime, arch, ...).
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[dev]'
	touch $(DEV_STAMP)

setup: $(DEV_STAMP)

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(SNAKEMAKE) --lint
	$(BIN)/snakefmt --check Snakefile rules/

dryrun: $(DEV_STAMP)
	$(SNAKEMAKE) -n results/eval_report.html --quiet rules

test: $(DEV_STAMP) lint dryrun
	$(BIN)/python -m pytest --ignore=tests/postgres -m "not slow" $(PYTEST_ARGS)

# The suites that must start many pipelines or Snakemake processes (crash/kill, determinism reruns, the load run,
# the model zoo, calibration end to end, the full-size DAG, fault runs, the docs' dry-runs): marker `slow`.
test-slow: $(DEV_STAMP)
	$(BIN)/python -m pytest --ignore=tests/postgres -m slow $(PYTEST_ARGS)

bench: $(DEV_STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[dev,bench]'
	$(BIN)/python bench/features.py
	$(BIN)/python bench/env.py
	$(BIN)/python bench/agents.py

# --- SLURM (issue 9) ---------------------------------------------------------------------------------------
# Root + apt-get: a throwaway single-node SLURM cluster runs the tiny pipeline through profiles/slurm (~5 min);
# elsewhere the script prints SKIPPED with the reason and exits 0. See docs/SLURM.md.
test-slurm: $(DEV_STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[slurm,postgres]'
	PYTHON=$(abspath $(BIN)/python) tests/slurm/run_slurm_test.sh
# --- end SLURM -------------------------------------------------------------------------------------------

# --- PostgreSQL (issue 16) ----------------------------------------------------------------------------------
# Distributed hyperopt on a real PostgreSQL: a throwaway cluster (initdb + pg_ctl on a free loopback port) per
# session; skipped with the reason where PostgreSQL is not installed. See docs/HYPEROPT.md.
test-postgres: $(DEV_STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[postgres]'
	$(BIN)/python -m pytest tests/postgres
# --- end PostgreSQL -------------------------------------------------------------------------------------------

# --- Monitoring (issue 25) -------------------------------------------------------------------------------------
# Watch a run live on loopback: TensorBoard over every training job's event files (results/tensorboard/), and
# optuna-dashboard on the hyperopt study storage (the journal of ALGO, default the first model with one; with
# PostgreSQL every study; that also needs the postgres extra). PORT, CONFIG and ALGO are optional; docs/OUTPUTS.md
# describes the TensorBoard tags.
PORT ?=
CONFIG ?= config.yaml
ALGO ?=
tensorboard: $(STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[monitor]'
	$(BIN)/tensorboard --logdir results/tensorboard --host 127.0.0.1 --port $(or $(PORT),6006)

dashboard: $(STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[monitor]'
	$(BIN)/python -m marketrl.training.dashboard --config $(CONFIG) --results results --port $(or $(PORT),8080) $(if $(ALGO),--algo $(ALGO))
# --- end Monitoring -------------------------------------------------------------------------------------------

clean-results:
	rm -rf results .snakemake
