"""Watching runs: every training job's TensorBoard event files (read back with tensorboard's own reader), and
optuna-dashboard served on a study's journal on loopback (`make tensorboard`, `make dashboard`)."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marketrl.settings import paths
from marketrl.settings.config import load_config
from marketrl.training.dashboard import DashboardError, pick_model
from marketrl.training.study_storage import open_storage
from marketrl.training.train import train_job
from tests.conftest import REPO_ROOT
from tests.test_workflow import TINY
from tests.test_zoo import HPARAMS, inputs  # noqa: F401  (`inputs`: the tiny job inputs fixture)

# the zoo tests' tiny hyperparameters, and PPO's: short rollouts so that a tiny budget reads statistics a few times
TINY_HPARAMS = {**HPARAMS, "ppo": {"n_steps": 8, "batch_size": 64, "n_epochs": 1, "hidden_dim_base": 8}}
SERVER_DEADLINE_S = 120  # it listens within seconds; a loaded 2-core machine may take longer


def train(inputs: dict, model: str, seed_indices: list[int], name: str) -> tuple[list[dict], list[Path]]:  # noqa: F811
    """The train job of ``model`` on fold 0 writing its TensorBoard runs; (train logs, run directories)."""
    out = inputs["root"] / name
    out.mkdir(exist_ok=True)
    hparams = out / "hparams.json"
    hparams.write_text(json.dumps({"algo": model, "best_params": TINY_HPARAMS[model]}), encoding="utf-8")
    run_dirs = [out / "tensorboard" / f"seed_{index}" for index in seed_indices]
    logs = train_job(
        model=model,
        fold=0,
        seed_indices=seed_indices,
        manifest_path=inputs["manifest_path"],
        folds_path=inputs["folds_path"],
        hparams_path=str(hparams),
        config=inputs["config"],
        model_paths=[str(out / f"model_{index}.pt") for index in seed_indices],
        log_paths=[str(out / f"train_log_{index}.json") for index in seed_indices],
        resume_path=str(out / "resume.pt"),
        tensorboard_dirs=[str(path) for path in run_dirs],
    )
    return logs, run_dirs


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a run directory as tensorboard reads it: tag -> [(step, value), ...]."""
    board = EventAccumulator(str(run_dir))
    board.Reload()
    return {tag: [(e.step, e.value) for e in board.Scalars(tag)] for tag in board.Tags()["scalars"]}


# the statistics each model's loop records, besides what every training job writes
STATISTICS = {
    "dqn": {"train/loss", "train/q_mean", "train/epsilon"},
    "mlp": {"train/loss", "train/grad_norm", "train/validation_loss"},
}
COUNTERS = {"counters/host_syncs", "counters/nan_checks"}


@pytest.mark.parametrize("model", ["dqn", "mlp"])
def test_a_train_job_writes_one_tensorboard_run_per_seed(inputs: dict, model: str) -> None:  # noqa: F811
    logs, run_dirs = train(inputs, model, [0, 1], f"board_{model}")
    for train_log, run_dir in zip(logs, run_dirs, strict=True):
        series = scalars(run_dir)
        expected = {
            "validation/sharpe",
            "progress/steps_per_s",
            "perf/steps_per_s",
            *STATISTICS[model],
            *COUNTERS,
        }
        assert expected <= set(series), sorted(series)
        # the seed's own validation scores, at the steps the train log records them (float32 in the events)
        validation = [(record["step"], record["val_sharpe"]) for record in train_log["validation"]]
        assert [step for step, _ in series["validation/sharpe"]] == [step for step, _ in validation]
        assert [value for _, value in series["validation/sharpe"]] == pytest.approx(
            [value for _, value in validation], rel=1e-6, abs=1e-6
        )
        losses = [(r["step"], r["loss"]) for r in train_log["history"] if r.get("loss") is not None]
        assert [step for step, _ in series["train/loss"]] == [step for step, _ in losses]
        assert [value for _, value in series["train/loss"]] == pytest.approx([v for _, v in losses], rel=1e-5)
        host_syncs = train_log.get("host_syncs", train_log.get("statistics_reads"))
        assert series["counters/host_syncs"] == [(train_log["total_steps"], host_syncs)]
        assert series["counters/nan_checks"][0][1] >= 1
    # one run per seed: the seeds' curves differ
    assert scalars(run_dirs[0])["train/loss"] != scalars(run_dirs[1])["train/loss"]


@pytest.mark.parametrize(
    ("model", "tag"), [("dqn", "train/loss"), ("ppo", "train/policy_loss"), ("mlp", "train/loss")]
)
def test_the_statistics_reach_the_board_while_the_run_goes_on(
    inputs: dict,  # noqa: F811
    model: str,
    tag: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Agents and forecasters alike: every statistics record goes onto the board when it is read, not at the end."""
    from marketrl.training import board as board_module

    live_at_finish: list[list[set[str]]] = []
    finish = board_module.TrainingBoard.finish

    def watched(self: board_module.TrainingBoard, train_logs: list) -> None:
        live_at_finish.append([set(tags) for tags in self.live_tags])
        finish(self, train_logs)

    monkeypatch.setattr(board_module.TrainingBoard, "finish", watched)
    logs, run_dirs = train(inputs, model, [0, 1], f"live_{model}")
    assert len(live_at_finish) == 1
    for tags, train_log, run_dir in zip(live_at_finish[0], logs, run_dirs, strict=True):
        assert tag in tags, sorted(tags)
        written = [step for step, _ in scalars(run_dir)[tag]]
        history = [r["step"] for r in train_log["history"] if r.get(tag.removeprefix("train/")) is not None]
        assert written == history  # each record once: live, and not again at the end


def test_a_rerun_replaces_the_events_instead_of_appending(inputs: dict) -> None:  # noqa: F811
    # lightgbm hands its statistics on without a seed: they reach the board from the history at the end
    train(inputs, "lightgbm", [0], "board_rerun")
    logs, (run_dir,) = train(inputs, "lightgbm", [0], "board_rerun")
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    series = scalars(run_dir)
    assert [step for step, _ in series["validation/sharpe"]] == [r["step"] for r in logs[0]["validation"]]
    assert "progress/steps_per_s" in series  # its trainer measures no rate of its own: the job's wall rate
    history_steps = [record["step"] for record in logs[0]["history"] if "val_sharpe" not in record]
    assert [step for step, _ in series["train/train_l2"]] == history_steps


def test_every_training_job_of_the_pipeline_has_its_tensorboard_run(shared_run: Path) -> None:
    train_logs = sorted((shared_run / "results" / "models").rglob("train_log.json"))
    assert train_logs
    for path in train_logs:
        log = json.loads(path.read_text(encoding="utf-8"))
        run_dir = shared_run / paths.TENSORBOARD.format(
            model=log["algo"], fold=log["fold"], seed=log["seed_index"]
        )
        assert {"validation/sharpe", "perf/steps_per_s"} <= set(scalars(run_dir)), run_dir


def test_the_report_job_logs_its_build_time(shared_run: Path) -> None:
    log = (shared_run / paths.log("report")).read_text(encoding="utf-8")
    assert re.search(r"report built in \d+\.\d s", log), log[-2000:]


# ------------------------------------------------------------------------------------------ optuna-dashboard


def served_url(server: subprocess.Popen, deadline: float) -> str | None:
    """The URL the dashboard prints once its port listens (an event: no polling), or None by the deadline or
    when the process ends first."""
    seen = b""
    while (remaining := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([server.stdout], [], [], remaining)
        chunk = os.read(server.stdout.fileno(), 4096) if ready else b""
        if not chunk:  # the deadline passed, or the process closed its output
            return None
        seen += chunk
        match = re.search(rb"optuna-dashboard on (http://\S+)", seen)
        if match:
            return match.group(1).decode()
    return None


def test_the_dashboard_serves_a_journal_study_on_loopback_and_stops(tmp_path: Path) -> None:
    config = load_config(TINY)
    results = tmp_path / "results"
    study = optuna.create_study(study_name="dqn-watch", storage=open_storage(config, "dqn", results))
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=2)
    env = {key: value for key, value in os.environ.items() if key != "MARKETRL_OPTUNA_STORAGE"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    module = [sys.executable, "-m", "marketrl.training.dashboard"]
    server = subprocess.Popen(
        [*module, "--config", str(TINY), "--results", str(results), "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = served_url(server, time.monotonic() + SERVER_DEADLINE_S)
        assert url is not None and url.startswith("http://127.0.0.1:"), server.poll()
        with urllib.request.urlopen(f"{url}api/studies", timeout=60) as response:
            studies = response.read()
        assert b"dqn-watch" in studies
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=60)
    assert server.returncode is not None  # the server stopped and exited
    assert b"Traceback" not in output


def test_the_dashboard_picks_a_journal_and_names_a_missing_one(tmp_path: Path) -> None:
    config = load_config(TINY)
    results = tmp_path / "results"
    with pytest.raises(DashboardError, match=r"hyperopt/\*/journal.log: no hyperopt study journal yet"):
        pick_model(config, results)
    open_storage(config, "ppo", results)  # creates the study directory only
    optuna.create_study(study_name="ppo", storage=open_storage(config, "ppo", results))
    assert pick_model(config, results) == "ppo"
    with pytest.raises(DashboardError, match=r"hyperopt/dqn/journal.log: no hyperopt study journal"):
        pick_model(config, results, "dqn")
