"""Crash and resume: SIGKILL the whole Snakemake process group during features, hyperopt, training and the report;
`snakemake --unlock` plus `snakemake --rerun-incomplete` then finishes with the results of an uninterrupted run.

One working directory goes through all four kills in turn (each resume runs on until the next stage is reached), so
the chain costs about one pipeline run. Each kill lands while a job is provably inside the step meant: the job is
held at a test-only hold point (marketrl.runtime.testing_hooks) and the kill waits for its marker file. After every kill nothing under results/ is damaged (each Parquet, JSON and
torch file loads; only hidden temp files of killed writers may remain), and after the final run no temp file is
left. The killed Optuna worker's finished trials are kept, its running trial is rerun with the same parameters,
and killed training jobs resume from their last checkpoint.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from marketrl.settings.config import validate_config
from marketrl.training.hyperopt import INTERRUPTED, SLOT
from marketrl.workflow import pipeline
from tests.faults.pipeline import (
    KillableRun,
    baseline_run,
    damaged_files,
    differing_tensors,
    fast_counts,
    fast_tiny_config,
    hold_env,
    metrics_bytes,
    model_tensors,
    resume,
    run_snakemake,
    session_workdir,
    start_clean_runs,
)

pytestmark = pytest.mark.slow


def _study_trials(workdir: Path, model: str) -> list[dict]:
    return json.loads((workdir / "results" / "hyperopt" / f"{model}.json").read_text())["trials"]


def _feature_tables(results: Path) -> list[Path]:
    """The finished feature tables (a writer's hidden temp file is not one)."""
    return [p for p in (results / "features").glob("*.parquet") if not p.name.startswith(".")]


def _kill_held(workdir: Path, hold: str, what: str, *, also=None, first: bool = False) -> list[str]:
    """Start (or resume) the pipeline with the first job that reaches hold point `hold` held there; SIGKILL the run
    once that job is held (and `also` holds), and return the damaged files found then."""
    if not first:
        unlocked = run_snakemake(workdir, "--unlock")
        assert unlocked.returncode == 0, unlocked.stderr[-2000:]
    marker = workdir / ("held-" + re.sub(r"\W+", "-", what))
    args = ("--cores", "2") if first else ("--cores", "2", "--rerun-incomplete")
    run = KillableRun(workdir, *args, env=hold_env(hold, marker))
    run.wait_for(lambda: marker.exists() and (also is None or also()), what)
    run.kill()
    return damaged_files(workdir / "results", allow_temps=True)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The kill chain; returns the workdir and what was observed after each kill."""
    start_clean_runs()  # the uninterrupted runs compared against below run alongside the kill chain
    workdir = session_workdir(fast_tiny_config())
    results = workdir / "results"
    seen: dict = {"workdir": workdir, "damaged": {}}

    # The features job (one per month, features.batch: the tiny data are one month) is held with its second table
    # written but not yet renamed into place; its first table has been finished.
    second = list(pipeline.raw_data_files(validate_config(fast_tiny_config())))[1]
    seen["damaged"]["features"] = _kill_held(
        workdir,
        f"atomic_write_before_rename:*/features/{second}.parquet",
        "a feature table being written",
        also=lambda: bool(_feature_tables(results)),
        first=True,
    )
    seen["features_done"] = len(_feature_tables(results))

    # Trial 0 of the DQN study is complete; trial 1 is running (it has reported a validation score).
    seen["damaged"]["hyperopt"] = _kill_held(
        workdir, "hyperopt_trial_reported:dqn:1", "the DQN study's second trial"
    )

    # A training job is held right after writing its first resume checkpoint.
    seen["damaged"]["training"] = _kill_held(workdir, "training_checkpoint_saved:*", "a training checkpoint")
    seen["checkpoints"] = {
        str(path.parent.relative_to(results)): torch.load(path, weights_only=True)["step"]
        for path in (results / "models").rglob("resume*.pt")
    }

    # The report job is held with the whole HTML in its temp file, before the rename.
    seen["damaged"]["report"] = _kill_held(
        workdir, "atomic_write_before_rename:*eval_report.html", "the report being written"
    )
    seen["report_after_kill"] = (results / "eval_report.html").exists()

    final = resume(workdir)
    assert final.returncode == 0, (final.stdout + final.stderr)[-4000:]
    return seen


def test_killed_at_every_stage_nothing_damaged(crashed: dict) -> None:
    assert crashed["damaged"] == {"features": [], "hyperopt": [], "training": [], "report": []}
    assert not crashed["report_after_kill"]  # the killed report job left no partial report
    # The first kill hit the features stage: at least one table done, the held one not.
    assert 1 <= crashed["features_done"] < fast_tiny_config()["data"]["demo"]["days"]


def test_no_partial_or_temp_file_after_resume(crashed: dict) -> None:
    assert damaged_files(crashed["workdir"] / "results") == []
    assert list((crashed["workdir"] / "results" / "models").rglob("resume*.pt")) == []  # removed once done


def test_resumed_results_identical_to_uninterrupted(crashed: dict) -> None:
    reference, resumed = metrics_bytes(baseline_run()), metrics_bytes(crashed["workdir"])
    assert len(resumed) == fast_counts()["metrics"] and resumed == reference
    assert differing_tensors(model_tensors(baseline_run()), model_tensors(crashed["workdir"])) == []


def test_killed_study_kept_its_trials(crashed: dict) -> None:
    trials = _study_trials(crashed["workdir"], "dqn")
    reference = _study_trials(baseline_run(), "dqn")
    interrupted = [t for t in trials if t["user_attrs"].get(INTERRUPTED)]
    # The summary lists the counted trials; the interrupted one is in the journal only, so it is read there.
    journal = (crashed["workdir"] / "results/hyperopt/dqn/journal.log").read_text()
    assert interrupted == [] and f'"{INTERRUPTED}"' in journal
    assert trials[0]["number"] == 0 and trials[0]["value"] == reference[0]["value"]  # done before the kill
    # Trial 1 died; its slot ran again later (as trial 2, or later still if the next kill hit it too).
    assert len(trials) == 2 and trials[1]["number"] >= 2 and trials[1]["user_attrs"][SLOT] == 1
    assert [(t["params"], t["value"]) for t in trials] == [(t["params"], t["value"]) for t in reference]


def test_killed_training_resumed_from_its_checkpoint(crashed: dict) -> None:
    assert crashed["checkpoints"], "no checkpoint existed when training was killed"
    # a resume file belongs to a model x fold's batch of seeds: every seed's log says it resumed from it
    for batch_dir, env_steps in crashed["checkpoints"].items():
        seed_logs = sorted((crashed["workdir"] / "results" / batch_dir).glob("seed_*/train_log.json"))
        assert seed_logs, f"no seed logs under {batch_dir}"
        for path in seed_logs:
            log = json.loads(path.read_text())
            assert log["resumed_from_step"] == env_steps
            relative = path.relative_to(crashed["workdir"])
            reference = json.loads((baseline_run() / relative).read_text())
            assert reference["resumed_from_step"] is None
            assert (
                log["history"] == reference["history"]
            )  # curves and validation scores from before the kill kept
