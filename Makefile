# marketrl: two commands. `make run` sets up .venv (pinned) and runs the pipeline on the demo data;
# `make test` sets up the same way and runs lint, the DAG dry-run and every test but the `slow` ones (~7 min on 2
# cores from a fresh clone, .venv set-up included); `make test-slow` runs the `slow` ones: the suites that start
# many pipelines (.ci/run runs both).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
CORES ?= 4
# Memory (MB) Snakemake may hand out to running jobs at once, each rule requesting its `resources: mem_mb`
# (marketrl.workflow.resources): 80% of what the machine has available when the run starts. MEM_MB=... overrides.
MEM_MB ?= $(shell awk '/^MemAvailable:/ {printf "%d", $$2 * 0.8 / 1024}' /proc/meminfo 2>/dev/null)
# gpu=1 repeats profiles/default's limit: --resources replaces the profile's resources
RESOURCES := $(if $(MEM_MB),--resources gpu=1 mem_mb=$(MEM_MB),)
SNAKEMAKE := $(BIN)/snakemake
PYTEST_ARGS ?=  # extra pytest arguments for test and test-slow, e.g. PYTEST_ARGS=--durations=40

.PHONY: run test test-slow setup lint dryrun bench clean-results test-slurm test-postgres export tensorboard dashboard \
	replay test-replay

# The console (marketrl/workflow/console.py) runs Snakemake and prints one line per finished job with the time left,
# then the report's path and verdict; Snakemake's full log stays in .snakemake/log/, each job's in results/logs/.
run: $(STAMP)
	$(BIN)/python -m marketrl.workflow.console $(RESOURCES) --cores $(CORES) results/eval_report.html

# Every model, fold and seed of the config exported (results/export/; trains what is missing; not part of `run`).
export: $(STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[export]'
	$(SNAKEMAKE) $(RESOURCES) --cores $(CORES) export_all

# Re-install only when the pins or the package metadata change; a second call is quick. `make run` installs what
# the pipeline needs; the test and lint targets add the `dev` extra (test tools, onnx/onnxruntime, arch, ...).
# EDITABLE_QUIET drops setuptools' one informational notice on editable installs ("Editable installation ...: be
# careful with folders named like your package"), 11 lines on every set-up; any other warning or error still shows.
EDITABLE_QUIET := PYTHONWARNINGS="ignore:Editable installation"
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(EDITABLE_QUIET) $(BIN)/python -m pip install --quiet -c requirements.lock -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(EDITABLE_QUIET) $(BIN)/python -m pip install --quiet -c requirements.lock -e '.[dev]'
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

# --- Benchmarks (bench/README.md) -----------------------------------------------------------------------------
# `make bench`: every speed benchmark of bench/speed/ at its full size, one after another (hours on 2 cores; the
# figures are in docs/PERFORMANCE.md). Not the statistical studies of bench/studies/ (CPU-hours; run by hand) nor
# the GPU check of bench/gpu/ (needs a device). The two that measure a finished run take BENCH_RUN (default this
# checkout once `make run` has finished; eval_vs_train copies it, .venv included) and say SKIPPED without one;
# hyperopt_scale says SKIPPED where PostgreSQL cannot start. Outputs of those three go to BENCH_OUT.
# `make bench-quick`: every bench script's --quick mode (seconds each; `make test` runs them too, but for
# hyperopt_scale's, which `make test-postgres` runs).
BENCH_RUN ?= $(CURDIR)
BENCH_OUT ?= /tmp/marketrl-bench
bench: $(DEV_STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[dev,bench,postgres]'
	$(BIN)/python bench/speed/features.py
	$(BIN)/python bench/speed/env.py
	$(BIN)/python bench/speed/agents.py
	$(BIN)/python bench/speed/time_to_quality.py
	$(BIN)/python bench/speed/models.py
	$(BIN)/python bench/speed/seeds.py
	$(BIN)/python bench/speed/evaluate.py
	$(BIN)/python bench/speed/job_imports.py
	$(BIN)/python bench/speed/dag.py
	$(BIN)/python bench/speed/hyperopt_setup.py
	$(BIN)/python bench/speed/hyperopt_cost.py
	$(BIN)/python bench/speed/hyperopt_scale.py --if-available
	@if [ -f "$(BENCH_RUN)/results/eval_report.html" ]; then \
	  set -x; rm -rf "$(BENCH_OUT)/evaluate_job" "$(BENCH_OUT)/eval_vs_train" && \
	  $(BIN)/python bench/speed/evaluate_job.py "$(BENCH_RUN)" dqn 0 "$(BENCH_OUT)/evaluate_job" --compare && \
	  $(BIN)/python bench/speed/eval_vs_train.py "$(BENCH_RUN)" "$(BENCH_OUT)/eval_vs_train" \
	    --json "$(BENCH_OUT)/eval_vs_train.json"; \
	else \
	  echo "bench: evaluate_job.py, eval_vs_train.py SKIPPED: no finished run in $(BENCH_RUN) (make run, or BENCH_RUN=DIR)"; \
	fi

.PHONY: bench-quick
bench-quick: $(DEV_STAMP)
	$(BIN)/python -m pytest tests/test_bench_quick.py tests/test_gpu_check.py tests/postgres/test_bench_hyperopt_scale.py $(PYTEST_ARGS)
# --- end Benchmarks -------------------------------------------------------------------------------------------

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
# optuna-dashboard on the hyperopt study storage (the journal of MODEL, default the first model with one; with
# PostgreSQL every study; that also needs the postgres extra). PORT, CONFIG and MODEL are optional; docs/OUTPUTS.md
# describes the TensorBoard tags.
PORT ?=
CONFIG ?= config.yaml
MODEL ?=
tensorboard: $(STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[monitor]'
	$(BIN)/tensorboard --logdir results/tensorboard --host 127.0.0.1 --port $(or $(PORT),6006)

dashboard: $(STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[monitor]'
	$(BIN)/python -m marketrl.training.dashboard --config $(CONFIG) --results results --port $(or $(PORT),8080) $(if $(MODEL),--model $(MODEL))
# --- end Monitoring -------------------------------------------------------------------------------------------

# --- Replay (issue 38) ------------------------------------------------------------------------------------------
# A second opinion on marketrl's PnL: one model x fold x seed's test positions (default dqn, fold 0, seed 0 of the
# demo run) as market orders through NautilusTrader's backtest engine, beside marketrl's own accounting, per day and
# in total (results/replay/.../replay.{html,json}; docs/REPLAY.md). REPLAY_FILL=quotes fills at bid/ask.
# nautilus_trader's declared bounds (pandas<3, fsspec<2026) conflict with requirements.lock, so it is installed
# --no-deps with its other dependencies pinned here (those the lock pins at the lock's version: click is in the lock,
# but only the dev tools pull it in); only these two targets install it.
REPLAY_MODEL ?= dqn
REPLAY_FOLD ?= 0
REPLAY_SEED ?= 0
REPLAY_FILL ?= close
# paths.EVAL_BARS (tests/test_replay.py checks it): looked for before the extra is installed
REPLAY_POSITIONS := results/eval/$(REPLAY_MODEL)/fold_$(REPLAY_FOLD)/seed_$(REPLAY_SEED)/bars.parquet
REPLAY_OUT ?= results/replay/$(REPLAY_MODEL)/fold_$(REPLAY_FOLD)/seed_$(REPLAY_SEED)
REPLAY_STAMP := $(VENV)/.installed-replay
REPLAY_DEPS := nautilus_trader==1.221.0 msgspec==0.23.0 portion==2.6.3 pytz==2026.6 uvloop==0.22.1 click==8.5.1
$(REPLAY_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps $(REPLAY_DEPS)
	touch $(REPLAY_STAMP)

replay: $(STAMP)
	@test -f "$(REPLAY_POSITIONS)" || { echo "replay: $(REPLAY_POSITIONS) is missing: run make run first (or set REPLAY_MODEL, REPLAY_FOLD, REPLAY_SEED)" >&2; exit 2; }
	@$(MAKE) --no-print-directory $(REPLAY_STAMP)
	$(BIN)/python -m marketrl.evaluation.replay --model $(REPLAY_MODEL) --fold $(REPLAY_FOLD) --seed $(REPLAY_SEED) \
	  --prices 'results/features/*.parquet' --config $(CONFIG) --fill $(REPLAY_FILL) --out "$(REPLAY_OUT)"

# The replay tests with the extra installed (.ci/run's last step; `make test` skips them without it).
test-replay: $(DEV_STAMP) $(REPLAY_STAMP)
	$(BIN)/python -m pytest tests/test_replay.py $(PYTEST_ARGS)
# --- end Replay -------------------------------------------------------------------------------------------------

clean-results:
	rm -rf results .snakemake
