"""Per-fold, per-seed training jobs: best hyperparameters in, a checkpoint and a training log out.

Every model of `training.models` goes through the same job (`marketrl.training.zoo` dispatches by name): normalization is
fit on the fold's inner training rows and stored in the checkpoint; the validation tail is scored EVALS_PER_RUN
times and reported in the job log with progress, steps/s and ETA. Agents train for training.total_steps env
steps; forecasters for training.epochs, capped at training.max_updates optimizer steps (boosting rounds).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_utils import HardwareBudget, detect_precision, resolve_device
from marketrl.loop.resume import TrainingCheckpoint
from marketrl.runtime.io import write_json_atomic
from marketrl.runtime.provenance import collect, sha256_file
from marketrl.scoring.metrics import to_json_safe
from marketrl.settings.config import derive_seed
from marketrl.splits.datasets import cost_model_from_config, fold_window, load_features_for_days
from marketrl.splits.folds import FoldPlan
from marketrl.training.board import TrainingBoard
from marketrl.training.zoo import EVALS_PER_RUN, Trained, TrainRequest, get_entry

__all__ = ["EVALS_PER_RUN", "HparamsError", "ProgressLog", "load_hparams", "train_job", "train_log_record"]

log = logging.getLogger(__name__)


class HparamsError(ValueError):
    """A hyperparameter file is missing, malformed, or does not belong to the model."""


def load_hparams(path: str | Path, model: str) -> dict[str, Any]:
    """Best parameters from results/hyperopt/{model}.json, checked; names the file on any problem."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise HparamsError(f"{path}: cannot read hyperparameters: {exc}".splitlines()[0]) from exc
    if not isinstance(data, dict) or not isinstance(data.get("best_params"), dict):
        raise HparamsError(f"{path}: expected a JSON object with a 'best_params' mapping")
    if data.get("algo", model) != model:
        raise HparamsError(f"{path}: hyperparameters are for {data.get('algo')!r}, not {model!r}")
    params = data["best_params"]
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise HparamsError(f"{path}: best_params.{key} must be a number or string, got {value!r}")
    return dict(params)


class ProgressLog:
    """Validation scores as the run reports them (one per seed), logged with progress, steps/s and ETA for
    `tail -f`.

    `total_steps` is the run's budget in its own steps (env steps for agents, optimizer steps or boosting rounds
    for forecasters; an upper bound where early stopping may end the run sooner). `records[i]` are seed i's.
    """

    def __init__(self, total_steps: int, n_seeds: int, board: TrainingBoard | None = None) -> None:
        self.total_steps = total_steps
        self.board = board  # the job's TensorBoard run directories, if it writes them
        self.started = time.perf_counter()
        self.records: list[list[dict[str, float]]] = [[] for _ in range(n_seeds)]

    def __call__(self, step: int, scores: list[float]) -> None:
        # a seed run one after another reports alone: its scores go to the first seed without a record yet at
        # this step, and its rate and ETA count from its own start
        first = next(
            (i for i, records in enumerate(self.records) if not records or records[-1]["step"] < step), 0
        )
        if first > 0 and not self.records[first]:
            self.started = self.records[first - 1][-1]["elapsed_s"] + self.started
        elapsed = time.perf_counter() - self.started
        rate = step / elapsed if elapsed > 0 else math.nan
        eta = max(0, self.total_steps - step) / rate if rate and rate > 0 else math.nan
        for offset, score in enumerate(scores):
            self.records[first + offset].append({"step": step, "val_sharpe": score, "elapsed_s": elapsed})
        if self.board is not None:
            self.board.validation(first, step, scores, rate)
        log.info(
            "progress: step %d/%d (%.0f%%), %.0f steps/s, ETA %.0fs, validation Sharpe %s",
            step,
            self.total_steps,
            100.0 * min(step, self.total_steps) / self.total_steps,
            rate,
            eta,
            " ".join(f"{score:.3f}" for score in scores),
        )


def train_log_record(trained: Trained, total_steps: int) -> dict[str, Any]:
    """The model-specific part of train_log.json (`Trained.log_record`: the trainer's log, ``total_steps``,
    ``steps_per_s`` and ``history`` keyed by ``step`` with the validation scores merged in; docs/OUTPUTS.md)."""
    return trained.log_record(total_steps)


def _on_statistics(board: TrainingBoard | None, record: dict[str, Any]) -> None:
    """A statistics record of one seed (keyed by ``seed`` and ``step``, whichever the model): into the job log at
    debug level and onto the board."""
    log.debug("statistics: %s", record)
    if board is not None:
        board.record(record)


def train_job(
    *,
    model: str,
    fold: int,
    seed_indices: list[int],
    manifest_path: str,
    folds_path: str,
    hparams_path: str,
    config: Mapping[str, Any],
    model_paths: list[str],
    log_paths: list[str],
    resume_path: str,
    tensorboard_dirs: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Train one model (`model`: any name of training.models) on one fold with every seed of `seed_indices`, as
    one `train_seeds` batch; write each seed's model.pt and train_log.json atomically.

    `resume_path` is the batch's resumable checkpoint: an undeclared side file (marketrl.settings.paths.RESUME),
    removed once every model.pt is written. A deterministic model (ridge) is given one seed index.
    `tensorboard_dirs` (one per seed, marketrl.settings.paths.TENSORBOARD; None: none written) are the run
    directories of its TensorBoard event files, another undeclared side output (marketrl.training.board).
    """
    if not (len(seed_indices) == len(model_paths) == len(log_paths)) or not seed_indices:
        raise ValueError(
            f"{model} fold {fold}: expected one model and log path per seed index {seed_indices}"
        )
    entry = get_entry(model, config["training"]["extra_models"])
    if entry.deterministic and len(seed_indices) != 1:
        raise ValueError(f"{model}: a deterministic model trains one run, got seed indices {seed_indices}")
    hparams = load_hparams(hparams_path, model)
    training = config["training"]
    device = resolve_device(training["device"])
    precision = detect_precision(device, training["precision"])
    log.info("%s (%s), precision %s: %s", model, entry.kind, precision.mode, precision.reason)
    seeds = [derive_seed(config["seed"], "train", model, fold, index) for index in seed_indices]
    plan = FoldPlan.load(folds_path)
    # only the tables and rows of the fold's training window (validation tail included): the job's memory follows
    # the window (folds.max_train_days), not the whole history
    table = load_features_for_days(manifest_path, plan.fold(fold).train_days, only_days=True)
    window = fold_window(table, plan, fold, config, device)
    del table
    # the run's length in the model's own steps (agents: env steps; forecasters: a cap on optimizer steps)
    budget_steps = entry.train_budget(config)
    # Only a state saved by this very run (same settings, seeds and inputs) is resumed.
    checkpoint = TrainingCheckpoint(
        Path(resume_path),
        training["checkpoint_every"],
        {
            "algo": model,  # on-disk key kept for compatibility
            "seeds": seeds,
            "hparams": hparams,
            **entry.run_settings(config),
            "check_every": training["check_every"],
            "env": dict(config["env"]),
            "n_envs": training["n_envs"],
            "device": str(device),
            "precision": precision.mode,
            "inputs": [sha256_file(manifest_path), sha256_file(folds_path)],
        },
    )
    board = TrainingBoard(tensorboard_dirs, seeds) if tensorboard_dirs is not None else None
    with board if board is not None else contextlib.nullcontext():
        progress = ProgressLog(budget_steps, len(seeds), board)
        started = time.perf_counter()
        runs = entry.train(
            TrainRequest(
                train_data=window.splits["train"],
                validation_data=window.splits["validation"],
                config=config,
                hparams=hparams,
                precision=precision,
                device=device,
                seeds=tuple(seeds),
                budget=budget_steps,
                on_score=progress,
                on_log=functools.partial(_on_statistics, board),
                checkpoint=checkpoint,
                memory=HardwareBudget.detect(device),
                gate_min_t=training["gate_min_t"],
            )
        )
        wall_s = time.perf_counter() - started
        if len(runs) != len(seeds):
            raise RuntimeError(f"{model}: {len(runs)} trained runs for {len(seeds)} seeds")
        provenance = collect(dict(config), device=str(device))
        # the cost model the model was trained with: evaluation refuses a config that charges differently
        costs = cost_model_from_config(config["costs"]).to_config()
        train_logs = []
        for position, (index, seed, trained) in enumerate(zip(seed_indices, seeds, runs, strict=True)):
            trained.save(
                model_paths[position],
                window,
                {"fold": fold, "seed_index": index, "seed": seed, "costs": costs},
            )
            train_log = {
                "algo": model,  # on-disk key kept for compatibility
                "kind": entry.kind,
                "fold": fold,
                "seed_index": index,
                "seed": seed,
                "deterministic": entry.deterministic,
                "batch": {"seed_indices": list(seed_indices), "position": position, "wall_s": wall_s},
                "hparams": hparams,
                "precision": precision.to_dict(),
                "device": str(device),
                "wall_s": wall_s,
                "resumed_from_step": checkpoint.resumed_from,
                "checkpoints_saved": checkpoint.total_saves,
                "validation": progress.records[position],
                **train_log_record(trained, budget_steps),
                "provenance": provenance,
            }
            write_json_atomic(log_paths[position], to_json_safe(train_log))
            train_logs.append(train_log)
        if board is not None:
            board.finish(train_logs)
    checkpoint.remove()  # the final models are written: a later forced rerun starts from scratch
    return train_logs
