"""The Snakemake workflow: the whole DAG dry-runs, single-fold reruns stay single, bad config fails first."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from marketrl.calendars.cme_hours import demo_file_days
from marketrl.settings import paths
from marketrl.settings.config import load_config, validate_config
from marketrl.workflow import pipeline
from tests.conftest import REPO_ROOT
from tests.support.dag_parse import dag_parse

TINY = REPO_ROOT / "tests" / "configs" / "tiny.yaml"


def snakemake(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """Run the workflow's Snakemake from the venv in `cwd`, capturing output."""
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO_ROOT / "Snakefile"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry-run, as {stage: count} (pipeline.rule_stage: a ``*_once`` rule, the one-run
    variant of a model x fold rule, counts as its base rule, and a batch's features rule as ``features``)."""
    table = output.split("Job stats:")[1].split("total")[0]
    counts: dict[str, int] = {}
    for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.MULTILINE):
        rule = pipeline.rule_stage(m.group(1))
        counts[rule] = counts.get(rule, 0) + int(m.group(2))
    return counts


def workdir_with_config(tmp_path: Path, config: dict | Path) -> Path:
    """A fresh working directory whose config.yaml is `config` (the Snakefile reads ./config.yaml)."""
    text = config.read_text() if isinstance(config, Path) else yaml.safe_dump(config)
    (tmp_path / "config.yaml").write_text(text)
    return tmp_path


def test_full_dag_dry_run_default_config(tmp_path: Path) -> None:
    # In a fresh directory: the checkout's own results/ (from `make run`) would leave nothing to plan.
    workdir = workdir_with_config(tmp_path, REPO_ROOT / "config.yaml")
    result = snakemake("-n", "results/eval_report.html", "--quiet", "rules", cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    counts = job_counts(result.stdout + result.stderr)
    config = load_config(REPO_ROOT / "config.yaml")  # training.models: the registry's default
    # one train and one evaluate job per model x fold, whatever the seeds (they run as one batch)
    n_models = len(config["training"]["models"]) * config["folds"]["n"]
    assert counts["demo_data"] == 1
    # one feature job per calendar month (features.batch: month) of the UTC-day files: every session's weekday
    # file plus a Sunday file per weekend crossed
    demo = config["data"]["demo"]
    days = demo_file_days(dt.date.fromisoformat(demo["start"]), demo["days"])
    assert config["features"]["batch"] == "month" and len(days) > demo["days"]
    assert counts["features"] == len({(d.year, d.month) for d in days}) > 1
    assert counts["train"] == n_models
    assert counts["evaluate"] == n_models  # one evaluation job scores every seed of a model x fold
    assert counts["baselines"] == config["folds"]["n"]
    assert counts["hyperopt_worker"] == len(config["training"]["models"]) * config["hyperopt"]["workers"]
    assert counts["report"] == 1


def test_single_fold_rerun_only_schedules_that_fold(tmp_path: Path) -> None:
    workdir = workdir_with_config(tmp_path, TINY)
    target = "results/models/ppo/fold_1/seed_0/model.pt"
    result = snakemake("-n", "--cores", "1", "-f", target, "--quiet", "rules", cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    counts = job_counts(result.stdout + result.stderr)
    assert counts["train"] == 1
    assert "evaluate" not in counts and "report" not in counts and "baselines" not in counts
    assert counts.get("hyperopt_best") == 1  # only ppo's study feeds this model
    listed = result.stdout + result.stderr
    assert "fold_0" not in listed


@pytest.mark.parametrize("record_min_t", [1.0, None])
def test_one_seeds_evaluation_target_runs_its_model_and_folds_evaluation(
    tmp_path: Path, record_min_t: float | None
) -> None:
    config = load_config(TINY)
    config["training"]["seeds"] = 3
    config["training"]["record_min_t"] = record_min_t
    workdir = workdir_with_config(tmp_path, config)
    target = "results/eval/ppo/fold_1/seed_2/metrics.json"
    result = snakemake("-n", "--cores", "1", target, "--quiet", "rules", cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    counts = job_counts(result.stdout + result.stderr)
    # ppo fold 1, all three seeds: their models are its inputs; with the walk-forward record, fold 0's evaluation
    # (its test days, all before fold 1's) decides whether fold 1 trades, so it runs first
    n_folds = 2 if record_min_t is not None else 1
    assert counts["evaluate"] == n_folds
    assert counts["train"] == n_folds  # ... and one train job a fold writes all three seeds
    assert "report" not in counts and "baselines" not in counts


def test_a_features_batch_job_writes_its_months_tables_from_its_files(tmp_path: Path) -> None:
    # features.batch: month. The tiny demo's files are all of March 2024: asking for two of its tables plans the
    # one job of the month, which reads every file (each file's context, the pipeline.CONTEXT_FILES before it,
    # is among them: tests/test_features_batch.py) and writes every table.
    config = validate_config(yaml.safe_load(TINY.read_text()))
    files = pipeline.raw_data_files(config)
    stems = list(files)
    monday, first = stems[3], stems[0]
    assert monday.startswith("glbx-mdp3-20240311") and pipeline.CONTEXT_FILES == 3
    targets = [paths.FEATURES.format(stem=stem) for stem in (monday, first)]
    result = snakemake("-n", *targets, cwd=workdir_with_config(tmp_path, TINY))
    assert result.returncode == 0, result.stderr[-2000:]
    listed = result.stdout + result.stderr
    jobs = re.findall(r"rule (features_\w+):\n\s+input: (.*)\n\s+output: (.*)\n", listed)
    assert [(rule, set(inputs.split(", ")), outputs.split(", ")) for rule, inputs, outputs in jobs] == [
        ("features_2024_03", set(files.values()), [paths.FEATURES.format(stem=stem) for stem in stems])
    ]


# Config errors: rules/common.smk's parse-time checks, run in process (tests/support/dag_parse.py). The one real
# Snakemake run of a config error is test_config_error_is_one_line_on_stderr_and_exit_1 below.


def test_unknown_config_key_fails_before_any_job() -> None:
    config = yaml.safe_load(TINY.read_text())
    config["folds"]["n_folds"] = 3
    parsed = dag_parse(config)
    assert parsed.status == 1
    assert len(parsed.error_lines) == 1 and "'folds.n_folds': unknown key" in parsed.error_lines[0]
    assert "RAW_FILES" not in parsed.namespace  # stopped before the input files (and so before any job)


def test_old_algos_key_fails_in_one_line_naming_training_models() -> None:
    config = yaml.safe_load(TINY.read_text())
    config["training"]["algos"] = config["training"].pop("models")
    parsed = dag_parse(config)
    assert parsed.status == 1
    assert (
        len(parsed.error_lines) == 1
        and "'training.algos': renamed to 'training.models'" in parsed.error_lines[0]
    )


def test_impossible_value_fails_naming_key() -> None:
    config = yaml.safe_load(TINY.read_text())
    config["folds"]["test_days"] = 0
    parsed = dag_parse(config)
    assert parsed.status == 1
    assert len(parsed.error_lines) == 1 and "config key 'folds.test_days'" in parsed.error_lines[0]


def test_files_glob_matching_nothing_fails_naming_key(tmp_path: Path) -> None:
    config = yaml.safe_load(TINY.read_text())
    config["data"] = {"source": "files", "files": str(tmp_path / "nothing" / "*.dbn.zst")}
    parsed = dag_parse(config)
    assert parsed.status == 1
    (line,) = parsed.error_lines
    assert "config key 'data.files'" in line and "matched no files" in line


def test_empty_files_glob_fails_before_any_job() -> None:
    config = yaml.safe_load(TINY.read_text())
    config["data"] = {"source": "files", "files": ""}
    parsed = dag_parse(config)
    assert parsed.status == 1
    (line,) = parsed.error_lines
    assert line.startswith("marketrl config error: config key 'data.files': empty glob")


def test_definitions_are_merged_at_dag_parse(dbn_samples: Path) -> None:
    """rules/common.smk reads data.definitions before any job: a real ESU4/NQU4 definition file that disagrees with
    an explicit costs.instruments entry stops the parse with one line naming both."""
    definitions = dbn_samples / "nautilus_trader/historical_bars_catalog/databento/futures_definition.dbn.zst"
    config = yaml.safe_load(TINY.read_text())
    config["data"]["definitions"] = str(definitions)
    config["costs"] = {"instruments": {"NQ": {"tick_size": 0.25, "tick_value": 12.5}}}  # NQ is $5.00 a tick
    parsed = dag_parse(config)
    assert parsed.status == 1
    assert parsed.error_lines == [
        "marketrl config error: config key 'costs.instruments.NQ': tick 0.25 / 12.5 disagrees with NQU4 in "
        f"{definitions} (0.25 / 5); fix or remove one of them"
    ]
    # Without the conflicting entry the definitions' specs reach the config the rules read.
    del config["costs"]
    merged = dag_parse(config)
    assert merged.status is None, merged.stderr
    assert {"ES", "NQ"} <= set(merged.config["costs"]["instruments"])


def test_futures_without_a_contract_spec_fail_at_dag_parse() -> None:
    """No costs section: the parse stops with one line naming costs.instruments, not a job pricing CL as ES."""
    config = yaml.safe_load(TINY.read_text())
    del config["costs"]
    parsed = dag_parse(config)
    assert parsed.status == 1
    assert len(parsed.error_lines) == 1 and parsed.error_lines[0].startswith(
        "marketrl config error: config key 'costs.instruments': no contract spec for costs.model futures; "
    ), parsed.stderr


def test_a_valid_config_passes_the_parse_time_checks() -> None:
    """The positive control of dag_parse: the tiny config goes on to the rules, with its input files resolved."""
    parsed = dag_parse(yaml.safe_load(TINY.read_text()))
    assert parsed.status is None and parsed.stderr == ""
    assert list(parsed.namespace["RAW_FILES"]) == list(
        pipeline.raw_data_files(validate_config(yaml.safe_load(TINY.read_text())))
    )
    assert parsed.config["training"]["device"] == "cpu"  # defaults filled in: what the rules read


def test_config_error_is_one_line_on_stderr_and_exit_1(tmp_path: Path) -> None:
    """The one real Snakemake run of a config error (the form every in-process check above relies on): a real run,
    not a dry-run, exits 1 with exactly one line on stderr besides Snakemake's own framing, no traceback, nothing
    on stdout and no results/."""
    config = yaml.safe_load(TINY.read_text())
    config["training"]["totl_steps"] = 5
    result = snakemake("--cores", "1", cwd=workdir_with_config(tmp_path, config))
    assert result.returncode == 1
    framing = "Using workflow specific profile"  # Snakemake's own line, printed before the Snakefile runs
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(framing)]
    assert lines == [
        "marketrl config error: config key 'training.totl_steps': unknown key; expected one of: "
        "batch_folds, check_every, checkpoint_every, device, epochs, extra_models, gate_min_t, gpu_jobs, horizon, "
        "max_train_rows, max_updates, models, n_envs, patience, pooled_min_t, precision, record_min_t, seeds, total_steps"
    ]
    assert "Traceback" not in result.stderr and result.stdout.strip() == ""
    assert not (tmp_path / "results").exists() and not (tmp_path / ".snakemake" / "metadata").exists()


@pytest.mark.parametrize("rule_file", sorted((REPO_ROOT / "rules").glob("*.smk")))
def test_every_rule_declares_log_benchmark_threads(rule_file: Path) -> None:
    text = rule_file.read_text()
    for block in re.split(r"^rule ", text, flags=re.MULTILINE)[1:]:
        name = block.split(":", 1)[0]
        for directive in ("log:", "benchmark:", "threads:", "conda:"):
            assert directive in block, f"{rule_file.name}: rule {name} lacks {directive}"
        assert "lambda" not in block, f"{rule_file.name}: rule {name} uses a lambda"


def test_gpu_rules_request_gpu_resource() -> None:
    for name in ("train.smk", "hyperopt.smk", "evaluate.smk"):
        assert "gpu=GPU_UNITS" in (REPO_ROOT / "rules" / name).read_text()
    profile = yaml.safe_load((REPO_ROOT / "profiles" / "default" / "config.yaml").read_text())
    assert profile["resources"]["gpu"] == 1


def _rule_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry-run by rule name, as printed."""
    table = output.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.MULTILINE)}


def test_batch_folds_plans_one_train_job_per_model(tmp_path: Path) -> None:
    """training.batch_folds: one train_folds job per stochastic model writes every fold x seed (a deterministic
    model keeps its train_once per fold); one fold's file as a target plans its model's job; off: a train job per
    model x fold, as always."""
    config = yaml.safe_load(TINY.read_text())
    config["training"].update(models=["dqn", "ppo", "linear"], seeds=2, batch_folds=True)
    (tmp_path / "on").mkdir()
    workdir = workdir_with_config(tmp_path / "on", config)
    result = snakemake("-n", "results/eval_report.html", cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    counts = _rule_counts(result.stdout + result.stderr)
    assert counts.get("train_folds") == 2 and counts.get("train_once") == 2 and "train" not in counts
    block = re.search(r"^rule train_folds:\n((?:    .*\n)+)", result.stdout, re.MULTILINE)
    assert block and re.search(r"mem_mb=\d+", block.group(1)) and "fold_1/seed_1/model.pt" in block.group(1)
    one = snakemake("-n", "results/models/ppo/fold_1/seed_0/model.pt", cwd=workdir)
    assert one.returncode == 0, one.stderr[-2000:]
    assert _rule_counts(one.stdout + one.stderr).get("train_folds") == 1
    config["training"]["batch_folds"] = False
    (tmp_path / "off").mkdir()
    off = snakemake("-n", "results/eval_report.html", cwd=workdir_with_config(tmp_path / "off", config))
    assert off.returncode == 0, off.stderr[-2000:]
    counts = _rule_counts(off.stdout + off.stderr)
    assert counts.get("train") == 4 and "train_folds" not in counts
