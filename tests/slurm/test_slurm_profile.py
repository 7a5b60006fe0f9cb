"""profiles/slurm and the checks of `make test-slurm`, without a SLURM cluster (the cluster run is the shell script)."""

from __future__ import annotations

import copy
import datetime as dt
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from marketrl.settings.config import ConfigError, validate_config
from marketrl.workflow import pipeline
from marketrl.workflow.resources import FIXED_MB
from tests.conftest import REPO_ROOT
from tests.slurm import slurm_checks

PROFILE = REPO_ROOT / "profiles" / "slurm" / "config.yaml"
TINY = REPO_ROOT / "tests" / "configs" / "tiny.yaml"
# rules whose mem_mb is their window's memory model (rules/common.smk, marketrl.workflow.resources)
MODELLED_MEMORY = {"hyperopt_worker", "train", "train_once", "train_folds"}


def workflow_rules() -> set[str]:
    """Rule names declared in rules/*.smk (the Snakefile itself only holds `all`), those a `use rule ... as NAME`
    derives included: a derived rule is submitted under its own name, so it needs its own resources."""
    names = set()
    for path in (REPO_ROOT / "rules").glob("*.smk"):
        text = path.read_text()
        names |= set(re.findall(r"^rule (\w+):", text, re.MULTILINE))
        names |= set(re.findall(r"^use rule \w+ as (\w+)", text, re.MULTILINE))
    return names


@pytest.fixture(scope="module")
def profile() -> dict:
    return yaml.safe_load(PROFILE.read_text())


def test_profile_uses_the_slurm_executor_and_polls_squeue(profile: dict) -> None:
    assert profile["executor"] == "slurm"
    assert profile["slurm-status-command"] == "squeue"
    # A global gpu limit would make Snakemake hold GPU jobs back; SLURM's GRES accounting does that on a cluster.
    assert "gpu" not in (profile.get("resources") or {})


def test_every_rule_has_memory_and_runtime(profile: dict) -> None:
    rules = workflow_rules()
    assert {"train", "evaluate", "hyperopt_worker", "train_once", "predict_features"} <= rules
    assert set(profile["set-resources"]) == rules  # no rule left to the defaults, no typo'd rule name
    for rule, resources in profile["set-resources"].items():
        if rule in MODELLED_MEMORY:  # the rule's memory model requests it; a value here would override it
            assert "mem_mb" not in resources, rule
        else:
            assert isinstance(resources["mem_mb"], int) and resources["mem_mb"] >= 1000, rule
        assert isinstance(resources["runtime"], int) and resources["runtime"] >= 5, rule
    assert set(profile["set-threads"]) <= rules
    assert {"mem_mb", "runtime"} <= set(profile["default-resources"])


def test_profile_options_exist_in_the_installed_plugin(profile: dict) -> None:
    plugin = pytest.importorskip("snakemake_executor_plugin_slurm")
    fields = set(plugin.ExecutorSettings.__dataclass_fields__)
    options = [key.removeprefix("slurm-").replace("-", "_") for key in profile if key.startswith("slurm-")]
    assert options and [name for name in options if name not in fields] == []


def test_dry_run_through_the_profile_requests_gpus_threads_and_memory(tmp_path: Path) -> None:
    pytest.importorskip("snakemake_executor_plugin_slurm")
    config = yaml.safe_load(TINY.read_text())
    config["training"]["gpu_jobs"] = "always"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    snakemake = [sys.executable, "-m", "snakemake", "-s", str(REPO_ROOT / "Snakefile")]
    # A dry run caps threads at --cores (default 1 there); on the cluster nothing caps them.
    args = ["--workflow-profile", str(PROFILE), "-n", "--cores", "64", "results/eval_report.html"]
    result = subprocess.run(
        [*snakemake, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    train = result.stdout.split("rule train:")[1].split("\n\n")[0]
    assert "gpu=1" in train and "runtime=480" in train
    # the memory model's request (before the manifest exists: the config's longest window at demo bars per day)
    requested = int(re.search(r"mem_mb=(\d+)", train).group(1))
    assert 500 <= requested < 32000
    assert re.search(r"threads: 4\b", train)
    # a features batch rule (rules/features.smk, one per month) declares its own resources
    features = re.split(r"rule features_\w+:", result.stdout)[1].split("\n\n")[0]
    assert "gpu=" not in features and f"mem_mb={FIXED_MB['features']}," in features


@pytest.mark.parametrize(
    ("gpu_jobs", "device", "expected"),
    [("always", "cpu", 1), ("never", "cuda", 0), ("auto", "cpu", 0), ("auto", "cuda:1", 1)],
)
def test_gpu_jobs_decides_the_gpu_request(gpu_jobs: str, device: str, expected: int) -> None:
    config = {"training": {"gpu_jobs": gpu_jobs, "device": device}}
    assert pipeline.gpu_units(config) == expected


def test_gpu_jobs_is_validated() -> None:
    config = yaml.safe_load(TINY.read_text())
    assert validate_config(config)["training"]["gpu_jobs"] == "auto"
    config["training"]["gpu_jobs"] = "sometimes"
    with pytest.raises(ConfigError, match="gpu_jobs"):
        validate_config(config)


# ------------------------------------------------------------------------------------------------ the checks


def test_fit_profile_keeps_the_executor_settings_and_fits_the_node(profile: dict) -> None:
    fitted = slurm_checks.fit_profile(copy.deepcopy(profile))
    assert fitted["slurm-status-command"] == "squeue" and fitted["executor"] == "slurm"
    assert set(fitted["set-resources"]) == set(profile["set-resources"])
    assert max(r.get("mem_mb", 0) for r in fitted["set-resources"].values()) <= slurm_checks.TEST_MEM_MB
    assert all("mem_mb" not in fitted["set-resources"][rule] for rule in MODELLED_MEMORY)
    assert set(fitted["set-threads"].values()) == {1}
    broken = {key: value for key, value in profile.items() if key != "executor"}
    with pytest.raises(slurm_checks.CheckError, match="executor"):
        slurm_checks.fit_profile(broken)


def scontrol_line(job_id: int, comment: str, start: str, end: str, tres: str = "") -> str:
    extra = f" TresPerJob={tres}" if tres else ""
    return (
        f"JobId={job_id} JobName=uuid JobState=COMPLETED StartTime=2026-01-01T10:{start} "
        f"EndTime=2026-01-01T10:{end} Partition=main Comment={comment}{extra} StdOut=/x/{job_id}.log"
    )


def test_parse_scontrol_jobs_reads_rule_wildcards_and_gpus() -> None:
    text = "\n".join(
        [
            scontrol_line(7, "rule_hyperopt_worker_wildcards_dqn_1", "00:05", "00:20", "gres:gpu:1"),
            scontrol_line(8, "rule_demo_data", "00:00", "00:04"),
            "JobId=9 JobName=hostname JobState=COMPLETED StartTime=2026-01-01T10:00:00 EndTime=2026-01-01T10:00:01",
        ]
    )
    jobs = slurm_checks.parse_scontrol_jobs(text)
    assert [(j.job_id, j.rule, j.wildcards, j.gpus) for j in jobs] == [
        (7, "hyperopt_worker", "dqn_1", 1),
        (8, "demo_data", "", 0),
    ]
    assert jobs[0].end - jobs[0].start == dt.timedelta(seconds=15)


def test_overlapping_pairs_finds_shared_gpu_time_but_not_touching_ends() -> None:
    jobs = slurm_checks.parse_scontrol_jobs(
        "\n".join(
            [
                scontrol_line(1, "rule_train_wildcards_dqn_0_0", "00:00", "00:10", "gres:gpu:1"),
                scontrol_line(2, "rule_train_wildcards_dqn_1_0", "00:10", "00:20", "gres:gpu:1"),
                scontrol_line(3, "rule_evaluate_wildcards_dqn_1_0", "00:19", "00:25", "gres:gpu:1"),
            ]
        )
    )
    assert [(a.job_id, b.job_id) for a, b in slurm_checks.overlapping_pairs(jobs)] == [(2, 3)]


def test_squeue_snapshots_show_waiting_gpu_jobs() -> None:
    text = "t=1\n5|rule_train|RUNNING|None\n6|rule_train|PENDING|Resources\n9|rule_folds|RUNNING|None\nt=2\n6|x|RUNNING|None\n"
    snapshots = slurm_checks.parse_squeue_snapshots(text)
    assert snapshots == [{5: "RUNNING", 6: "PENDING", 9: "RUNNING"}, {6: "RUNNING"}]
    assert slurm_checks.most_gpu_jobs_queued(snapshots, {5, 6}) == (2, True)
    assert slurm_checks.most_gpu_jobs_queued(snapshots, {5, 9}) == (2, False)
    with pytest.raises(slurm_checks.CheckError):
        slurm_checks.parse_squeue_snapshots("t=1\nnot a row\n")


def test_json_differences_ignore_timings_only() -> None:
    a = {
        "wall_s": 4.1,
        "steps_per_second": 800.0,
        "metrics": {"sharpe": 1.5, "n": [1, 2]},
        "validation": [{"elapsed_s": 1}],
    }
    b = {
        "wall_s": 9.9,
        "steps_per_second": 300.0,
        "metrics": {"sharpe": 1.5, "n": [1, 2]},
        "validation": [{"elapsed_s": 2}],
    }
    assert slurm_checks.json_differences(a, b) == []
    a["provenance"], b["provenance"] = (
        {"git_commit": "abc", "python": "3.11"},
        {"git_commit": "def", "python": "3.12"},
    )
    assert slurm_checks.json_differences(a, b) == ["/provenance/python: '3.11' != '3.12'"]
    del a["provenance"], b["provenance"]
    b["metrics"]["sharpe"] = 1.5000001
    b["metrics"]["n"] = [1, 2, 3]
    assert slurm_checks.json_differences(a, b) == [
        "/metrics/n: 2 vs 3 items",
        "/metrics/sharpe: 1.5 != 1.5000001",
    ]


def test_expected_outputs_cover_workers_models_and_evaluations() -> None:
    config = validate_config(slurm_checks.run_config(yaml.safe_load(TINY.read_text())))
    outputs = slurm_checks.expected_outputs(config)
    assert config["training"]["device"] == "cpu" and pipeline.gpu_units(config) == 1
    assert "results/hyperopt/ppo/worker_1.json" in outputs and "results/eval_report.html" in outputs
    assert set(pipeline.model_files(config)) <= set(outputs)
    assert len(outputs) == len(set(outputs))
