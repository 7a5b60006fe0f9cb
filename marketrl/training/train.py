"""Per-fold, per-seed training jobs: best hyperparameters in, a checkpoint and a training log out.

Every model of `training.models` goes through the same job (`marketrl.training.zoo` dispatches by name): normalization is
fit on the fold's inner training rows and stored in the checkpoint; the validation tail is scored EVALS_PER_RUN
times and reported in the job log with progress, steps/s and ETA. Agents train for training.total_steps env
steps; forecasters for training.epochs, capped at training.max_updates optimizer steps (boosting rounds).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_utils import HardwareBudget, detect_precision, resolve_device
from marketrl.evaluation.metrics import to_json_safe
from marketrl.loop.resume import TrainingCheckpoint
from marketrl.runtime.io import write_json_atomic
from marketrl.runtime.provenance import collect, sha256_file
from marketrl.splits.datasets import cost_model_from_config, fold_window, load_features
from marketrl.splits.folds import FoldPlan
from marketrl.training.zoo import EVALS_PER_RUN, Trained, TrainRequest, get_entry
from marketrl.workflow.config import derive_seed

__all__ = ["EVALS_PER_RUN", "HparamsError", "ProgressLog", "load_hparams", "train_job", "train_log_record"]

log = logging.getLogger(__name__)


class HparamsError(ValueError):
    """A hyperparameter file is missing, malformed, or does not belong to the model."""


def load_hparams(path: str | Path, algo: str) -> dict[str, Any]:
    """Best parameters from results/hyperopt/{algo}.json, checked; names the file on any problem."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise HparamsError(f"{path}: cannot read hyperparameters: {exc}".splitlines()[0]) from exc
    if not isinstance(data, dict) or not isinstance(data.get("best_params"), dict):
        raise HparamsError(f"{path}: expected a JSON object with a 'best_params' mapping")
    if data.get("algo", algo) != algo:
        raise HparamsError(f"{path}: hyperparameters are for {data.get('algo')!r}, not {algo!r}")
    params = data["best_params"]
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise HparamsError(f"{path}: best_params.{key} must be a number or string, got {value!r}")
    return dict(params)


class ProgressLog:
    """Validation scores as the run reports them, logged with progress, steps/s and ETA for `tail -f`.

    `total_steps` is the run's budget in its own steps (env steps for agents, optimizer steps or boosting rounds
    for forecasters; an upper bound where early stopping may end the run sooner).
    """

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self.started = time.perf_counter()
        self.records: list[dict[str, float]] = []

    def __call__(self, step: int, score: float) -> None:
        elapsed = time.perf_counter() - self.started
        rate = step / elapsed if elapsed > 0 else math.nan
        eta = max(0, self.total_steps - step) / rate if rate and rate > 0 else math.nan
        self.records.append({"step": step, "val_sharpe": score, "elapsed_s": elapsed})
        log.info(
            "progress: step %d/%d (%.0f%%), %.0f steps/s, ETA %.0fs, validation Sharpe %.3f",
            step,
            self.total_steps,
            100.0 * min(step, self.total_steps) / self.total_steps,
            rate,
            eta,
            score,
        )


def train_log_record(trained: Trained, total_steps: int) -> dict[str, Any]:
    """The model-specific part of train_log.json: the trainer's log, ``total_steps`` (steps actually run for a
    forecaster), ``steps_per_s`` and ``history`` keyed by ``step`` with the validation scores merged in
    (docs/OUTPUTS.md)."""
    result = trained.log
    evals = [{"step": int(step), "val_sharpe": score} for step, score in result.get("evals", [])]
    if trained.kind == "agent":
        # env steps: the agents' statistics records count them as env_steps
        history = [{**record, "step": record["env_steps"]} for record in result["history"]]
        return {
            **result,
            "total_steps": total_steps,
            "history": history + evals,
            "steps_per_s": result["steps_per_second"],
        }
    return {
        **result,
        "total_steps": int(result.get("steps", 0)),
        "max_steps": total_steps,
        "history": [dict(record) for record in result.get("history", [])] + evals,
        "steps_per_s": result.get("steps_per_second"),
    }


def train_job(
    *,
    algo: str,
    fold: int,
    seed_index: int,
    manifest_path: str,
    folds_path: str,
    hparams_path: str,
    config: Mapping[str, Any],
    model_path: str,
    log_path: str,
    resume_path: str,
) -> dict[str, Any]:
    """Train one model (`algo`: any name of training.models) on one fold with one seed; write model.pt and
    train_log.json atomically.

    `resume_path` is the resumable checkpoint: an undeclared side file (marketrl.workflow.paths.RESUME), removed once
    model.pt is written.
    """
    entry = get_entry(algo, config["training"]["extra_models"])
    hparams = load_hparams(hparams_path, algo)
    training = config["training"]
    device = resolve_device(training["device"])
    precision = detect_precision(device, training["precision"])
    log.info("%s (%s), precision %s: %s", algo, entry.kind, precision.mode, precision.reason)
    seed = derive_seed(config["seed"], "train", algo, fold, seed_index)
    plan = FoldPlan.load(folds_path)
    window = fold_window(load_features(manifest_path), plan, fold, config, device)
    # agents: env steps; forecasters: the cap on optimizer steps / boosting rounds
    budget_steps = training["total_steps"] if entry.kind == "agent" else training["max_updates"]
    progress = ProgressLog(budget_steps)
    run_keys = ("total_steps",) if entry.kind == "agent" else ("horizon", "epochs", "max_updates", "patience")
    # Only a state saved by this very run (same settings and inputs) is resumed.
    checkpoint = TrainingCheckpoint(
        Path(resume_path),
        training["checkpoint_every"],
        {
            "algo": algo,
            "seed": seed,
            "hparams": hparams,
            **{key: training[key] for key in run_keys},
            "check_every": training["check_every"],
            "env": dict(config["env"]),
            "n_envs": training["n_envs"],
            "device": str(device),
            "precision": precision.mode,
            "inputs": [sha256_file(manifest_path), sha256_file(folds_path)],
        },
    )
    started = time.perf_counter()
    trained = entry.train(
        TrainRequest(
            train_data=window.splits["train"],
            validation_data=window.splits["validation"],
            config=config,
            hparams=hparams,
            precision=precision,
            device=device,
            seed=seed,
            steps=training["total_steps"],
            updates=training["max_updates"],
            on_score=progress,
            on_log=lambda record: log.debug("statistics: %s", record),
            checkpoint=checkpoint,
            budget=HardwareBudget.detect(device) if entry.kind == "forecaster" else None,
        )
    )
    wall_s = time.perf_counter() - started
    # the cost model the model was trained with: evaluation refuses a config that charges differently
    trained.save(
        model_path,
        window,
        {
            "fold": fold,
            "seed_index": seed_index,
            "seed": seed,
            "costs": cost_model_from_config(config["costs"]).to_config(),
        },
    )
    train_log = {
        "algo": algo,
        "kind": entry.kind,
        "fold": fold,
        "seed_index": seed_index,
        "seed": seed,
        "hparams": hparams,
        "precision": precision.to_dict(),
        "device": str(device),
        "wall_s": wall_s,
        "resumed_from_step": checkpoint.resumed_from,
        "checkpoints_saved": checkpoint.saves,
        "validation": progress.records,
        **train_log_record(trained, budget_steps),
        "provenance": collect(dict(config), device=str(device)),
    }
    write_json_atomic(log_path, to_json_safe(train_log))
    checkpoint.remove()  # the final model is written: a later forced rerun starts from scratch
    return train_log
