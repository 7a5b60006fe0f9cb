"""Crash and resume: SIGKILL the whole Snakemake process group during features, hyperopt, training and the report;
`snakemake --unlock` plus `snakemake --rerun-incomplete` then finishes with the results of an uninterrupted run.

One working directory goes through all four kills in turn (each resume runs on until the next stage starts), so
the chain costs about one pipeline run. After every kill nothing under results/ is damaged (each Parquet, JSON and
torch file loads; only hidden temp files of killed writers may remain), and after the final run no temp file is
left. The killed Optuna worker's finished trials are kept, its running trial is rerun with the same parameters,
and killed training jobs resume from their last checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from marketrl.hyperopt import INTERRUPTED, SLOT
from tests.faults.pipeline import (
    KillableRun,
    baseline_run,
    damaged_files,
    differing_tensors,
    fast_tiny_config,
    metrics_bytes,
    model_tensors,
    resume,
    run_snakemake,
    session_workdir,
)

pytestmark = pytest.mark.slow


def _journal_claims(workdir: Path, algo: str) -> int:
    """How many trials of the study were claimed (each claim writes the trial's slot to the journal)."""
    journal = workdir / "results" / "hyperopt" / algo / "journal.log"
    return journal.read_text(errors="replace").count(f'"{SLOT}"') if journal.exists() else 0


def _study_trials(workdir: Path, algo: str) -> list[dict]:
    return json.loads((workdir / "results" / "hyperopt" / f"{algo}.json").read_text())["trials"]


def _kill_when(workdir: Path, condition, what: str, *, first: bool = False) -> list[str]:
    """Start (or resume) the pipeline, SIGKILL it when `condition` holds, return damaged files found then."""
    if not first:
        unlocked = run_snakemake(workdir, "--unlock")
        assert unlocked.returncode == 0, unlocked.stderr[-2000:]
    args = ("--cores", "2") if first else ("--cores", "2", "--rerun-incomplete")
    run = KillableRun(workdir, *args)
    run.wait_for(condition, what)
    run.kill()
    return damaged_files(workdir / "results", allow_temps=True)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The kill chain; returns the workdir and what was observed after each kill."""
    workdir = session_workdir(fast_tiny_config())
    results = workdir / "results"
    seen: dict = {"workdir": workdir, "damaged": {}}

    seen["damaged"]["features"] = _kill_when(
        workdir, lambda: any((results / "features").glob("*.parquet")), "the first feature table", first=True
    )
    seen["features_done"] = len(list((results / "features").glob("*.parquet")))

    # Trial 1 of the DQN study has been claimed (so it is running) when the worker dies.
    seen["damaged"]["hyperopt"] = _kill_when(
        workdir, lambda: _journal_claims(workdir, "dqn") >= 2, "the DQN study's second trial"
    )

    seen["damaged"]["training"] = _kill_when(
        workdir, lambda: any((results / "models").rglob("resume.pt")), "a training checkpoint"
    )
    seen["checkpoints"] = {
        str(path.parent.relative_to(results)): torch.load(path, weights_only=True)["env_steps"]
        for path in (results / "models").rglob("resume.pt")
    }

    seen["damaged"]["report"] = _kill_when(
        workdir, lambda: (results / "logs" / "report.log").exists(), "the report job"
    )
    seen["report_after_kill"] = (results / "eval_report.html").exists()

    final = resume(workdir)
    assert final.returncode == 0, (final.stdout + final.stderr)[-4000:]
    return seen


def test_killed_at_every_stage_nothing_damaged(crashed: dict) -> None:
    assert crashed["damaged"] == {"features": [], "hyperopt": [], "training": [], "report": []}
    assert not crashed["report_after_kill"]  # the killed report job left no partial report
    assert 1 <= crashed["features_done"] < 8  # the first kill really hit the features stage


def test_no_partial_or_temp_file_after_resume(crashed: dict) -> None:
    assert damaged_files(crashed["workdir"] / "results") == []
    assert list((crashed["workdir"] / "results" / "models").rglob("resume.pt")) == []  # removed once done


def test_resumed_results_identical_to_uninterrupted(crashed: dict) -> None:
    reference, resumed = metrics_bytes(baseline_run()), metrics_bytes(crashed["workdir"])
    assert len(resumed) == 6 and resumed == reference
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
    for model_dir, env_steps in crashed["checkpoints"].items():
        log = json.loads((crashed["workdir"] / "results" / model_dir / "train_log.json").read_text())
        assert log["resumed_from_step"] == env_steps
        reference = json.loads((baseline_run() / "results" / model_dir / "train_log.json").read_text())
        assert reference["resumed_from_step"] is None
        assert (
            log["history"] == reference["history"]
        )  # curves and validation scores from before the kill kept
