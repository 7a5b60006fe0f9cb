"""Load: many small jobs on one results tree and two workers per Optuna study, with `--cores 2`.

The full-size DAG of the issue (20 folds x 2 models x 3 seeds, 2 hyperopt workers) is dry-run; the real run is
scaled down to 2 folds x 2 models x 1 seed (24 jobs) to fit the test budget on two cores. Both must finish
without lock errors on the shared study storage or the results tree, with every output complete.
"""

from __future__ import annotations

import json
import re

import optuna
import pytest
import yaml

from marketrl.settings.config import validate_config
from marketrl.training.hyperopt import SLOT, load_study
from marketrl.workflow import pipeline
from tests.faults.pipeline import (
    damaged_files,
    fast_tiny_config,
    load_run,
    new_workdir,
    run_snakemake,
)
from tests.test_workflow import job_counts

pytestmark = pytest.mark.slow

LOCK_TROUBLE = re.compile(
    r"LockException|database is locked|cannot be locked|Lock(ed)?Error|BlockingIOError", re.I
)


def test_full_size_dag_dry_run(tmp_path) -> None:
    config = fast_tiny_config(
        data={"demo": {"days": 26}},
        folds={
            "n": 20,
            "train_days": 3,
            "validation_days": 1,
            "test_days": 1,
            "tuning_days": 3,
            "tuning_validation_days": 2,
        },
        hyperopt={"workers": 2, "n_trials": 4},
        training={"seeds": 3},
    )
    result = run_snakemake(
        new_workdir(config, tmp_path), "-n", "--cores", "2", "--quiet", "rules", timeout=300
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    counts = job_counts(result.stdout + result.stderr)
    assert counts["train"] == counts["evaluate"] == 20 * 2  # one job per model x fold for all 3 seeds
    assert counts["hyperopt_worker"] == 2 * 2 and counts["baselines"] == 20
    assert not LOCK_TROUBLE.search(result.stdout + result.stderr)


def test_many_small_jobs_complete_without_lock_errors() -> None:
    workdir, result = load_run()
    output = result.stdout + result.stderr
    counts = job_counts(output)
    assert counts["train"] == counts["evaluate"] == 2 * 2 * 1
    assert counts["hyperopt_worker"] == 4 and counts["baselines"] == 2
    logs = [p.read_text(errors="replace") for p in (workdir / "results" / "logs").rglob("*.log")]
    # one log per job: 20 = one features batch (features.batch: month; its 6 UTC-day files hold 5 sessions, the
    # Sunday file opens Monday's) + manifest, folds, 2 x (2 hyperopt workers + best), 4 train, 4 evaluate,
    # 2 baselines, report
    assert counts["features"] == 1
    assert len(logs) == sum(n for rule, n in counts.items() if rule != "all") == 20
    troubled = [text for text in [output, *logs] if LOCK_TROUBLE.search(text)]
    assert troubled == []
    assert not any("Traceback" in text or "marketrl error" in text for text in logs)


def test_every_output_complete_after_load() -> None:
    workdir, _ = load_run()
    config = validate_config(yaml.safe_load((workdir / "config.yaml").read_text()))
    expected = pipeline.model_files(config) + pipeline.train_log_files(config) + pipeline.eval_files(config)
    assert len(pipeline.model_files(config)) == 4
    assert [path for path in expected if not (workdir / path).is_file()] == []
    assert damaged_files(workdir / "results") == []
    assert list((workdir / "results" / "models").rglob("resume*.pt")) == []


@pytest.mark.parametrize("model", ["dqn", "ppo"])
def test_two_workers_shared_the_study_exactly(model: str) -> None:
    workdir, _ = load_run()
    config = validate_config(yaml.safe_load((workdir / "config.yaml").read_text()))
    name = json.loads((workdir / f"results/hyperopt/{model}/worker_0.json").read_text())["study"]
    study = load_study(config, model, 0, workdir / "results", name)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 4  # no trial lost or run twice
    assert all(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for t in trials)
    assert sorted(t.user_attrs[SLOT] for t in trials) == [0, 1, 2, 3]
    ran = [
        json.loads((workdir / f"results/hyperopt/{model}/worker_{w}.json").read_text())["trials_run"]
        for w in (0, 1)
    ]
    assert sorted(ran[0] + ran[1]) == [0, 1, 2, 3]
