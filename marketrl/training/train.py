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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from gpu_utils import HardwareBudget, PrecisionPlan, detect_precision, resolve_device
from marketrl.env import stack_market_data
from marketrl.loop.resume import TrainingCheckpoint
from marketrl.runtime.io import write_json_atomic
from marketrl.runtime.provenance import collect, sha256_file
from marketrl.scoring.metrics import to_json_safe
from marketrl.settings.config import derive_seed
from marketrl.splits.datasets import WindowData, cost_model_from_config, fold_window, load_features_for_days
from marketrl.splits.folds import FoldPlan
from marketrl.training.board import TrainingBoard
from marketrl.training.zoo import EVALS_PER_RUN, FoldBlocks, Trained, TrainRequest, ZooEntry, get_entry

__all__ = [
    "EVALS_PER_RUN",
    "HparamsError",
    "ProgressLog",
    "fold_batches",
    "load_hparams",
    "train_folds_job",
    "train_job",
    "train_log_record",
]

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

    def __call__(self, step: int, scores: list[float | None]) -> None:
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
            if score is not None:  # None: that seed is not validated at this step (its fold's own schedule)
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
            " ".join("-" if score is None else f"{score:.3f}" for score in scores),
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
    one `train_seeds` batch; write each seed's model.pt and train_log.json atomically (`train_folds_job` with
    one fold).

    `resume_path` is the batch's resumable checkpoint: an undeclared side file (marketrl.settings.paths.RESUME),
    removed once every model.pt is written. A deterministic model (ridge) is given one seed index.
    `tensorboard_dirs` (one per seed, marketrl.settings.paths.TENSORBOARD; None: none written) are the run
    directories of its TensorBoard event files, another undeclared side output (marketrl.training.board).
    """
    return train_folds_job(
        model=model,
        folds=[fold],
        seed_indices=seed_indices,
        manifest_path=manifest_path,
        folds_path=folds_path,
        hparams_paths=[hparams_path],
        config=config,
        model_paths=model_paths,
        log_paths=log_paths,
        resume_paths=[resume_path],
        tensorboard_dirs=tensorboard_dirs,
    )


def fold_batches(
    folds: Sequence[int], hparams: Sequence[Mapping[str, Any]], per_batch: Callable[[list[int]], int]
) -> list[list[int]]:
    """The folds of a fold-batched job in the batches they train in, in fold order: folds with the same
    hyperparameters (all of them, unless hyperopt.per_fold tuned each fold) in runs of at most
    ``per_batch(group)`` folds (what the device's memory holds; 1 for a model that trains one fold at a time)."""
    groups: dict[str, list[int]] = {}
    for fold, params in zip(folds, hparams, strict=True):
        groups.setdefault(json.dumps(dict(params), sort_keys=True), []).append(fold)
    batches = []
    for group in groups.values():
        size = max(1, per_batch(group))
        batches.extend(group[start : start + size] for start in range(0, len(group), size))
    return sorted(batches)


def train_folds_job(
    *,
    model: str,
    folds: list[int],
    seed_indices: list[int],
    manifest_path: str,
    folds_path: str,
    hparams_paths: list[str],
    config: Mapping[str, Any],
    model_paths: list[str],
    log_paths: list[str],
    resume_paths: list[str],
    tensorboard_dirs: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Train one model on several folds with every seed of `seed_indices` (training.batch_folds): an agent or a
    torch forecaster puts as many folds × seeds on the batch axis as the device's memory holds
    (`ZooEntry.folds_per_batch`; each fold its own data window, normalization, schedule, validation, early
    stopping, gate and outputs), any other model (lightgbm) trains the folds one batch of seeds after another. Every (fold, seed) gets the seed, the model.pt and the train_log.json its own
    one-fold job would write.

    `model_paths`, `log_paths` and `tensorboard_dirs` are fold-major (fold, then seed index); `hparams_paths` and
    `resume_paths` one per fold (a batch resumes from its first fold's file).
    """
    n_units = len(folds) * len(seed_indices)
    if not folds or not seed_indices or not (len(model_paths) == len(log_paths) == n_units):
        raise ValueError(
            f"{model} folds {folds}: expected one model and log path per fold x seed index {seed_indices}"
        )
    if len(hparams_paths) != len(folds) or len(resume_paths) != len(folds):
        raise ValueError(
            f"{model} folds {folds}: expected one hyperparameter file and one resume file per fold"
        )
    entry = get_entry(model, config["training"]["extra_models"])
    if entry.deterministic and len(seed_indices) != 1:
        raise ValueError(f"{model}: a deterministic model trains one run, got seed indices {seed_indices}")
    hparams = {fold: load_hparams(path, model) for fold, path in zip(folds, hparams_paths, strict=True)}
    training = config["training"]
    device = resolve_device(training["device"])
    precision = detect_precision(device, training["precision"])
    log.info("%s (%s), precision %s: %s", model, entry.kind, precision.mode, precision.reason)
    plan = FoldPlan.load(folds_path)
    position_of = {fold: index for index, fold in enumerate(folds)}
    memory = HardwareBudget.detect(device)
    train_logs: dict[int, list[dict[str, Any]]] = {}
    # only the tables and rows of the folds' training windows (validation tails included): the job's memory follows
    # the windows (folds.max_train_days), not the whole history
    days = sorted({day for fold in folds for day in plan.fold(fold).train_days})
    table = load_features_for_days(manifest_path, days, only_days=True)
    windows = {fold: fold_window(table, plan, fold, config, device) for fold in folds}
    del table

    def per_batch(group: list[int]) -> int:
        # sized by the group's largest training window (an expanding walk-forward grows fold by fold)
        largest = max(group, key=lambda fold: windows[fold].splits["train"].n_rows)
        return entry.folds_per_batch(
            memory, windows[largest], config, hparams[group[0]], precision, len(seed_indices), len(group)
        )

    batches = fold_batches(folds, [hparams[fold] for fold in folds], per_batch)
    if len(folds) > 1:
        log.info("%s: folds %s train in batches %s", model, folds, batches)
    for batch in batches:
        units = [
            position_of[fold] * len(seed_indices) + index
            for fold in batch
            for index in range(len(seed_indices))
        ]
        logs = _train_batch(
            entry=entry,
            batch=batch,
            seed_indices=seed_indices,
            windows=[windows[fold] for fold in batch],
            hparams=hparams[batch[0]],
            config=config,
            device=device,
            precision=precision,
            memory=memory,
            model_paths=[model_paths[unit] for unit in units],
            log_paths=[log_paths[unit] for unit in units],
            resume_path=resume_paths[position_of[batch[0]]],
            tensorboard_dirs=None if tensorboard_dirs is None else [tensorboard_dirs[unit] for unit in units],
            inputs=[sha256_file(manifest_path), sha256_file(folds_path)],
        )
        width = len(seed_indices)
        for position, fold in enumerate(batch):
            train_logs[fold] = logs[position * width : (position + 1) * width]
    return [record for fold in folds for record in train_logs[fold]]


def _train_batch(
    *,
    entry: ZooEntry,
    batch: list[int],
    seed_indices: list[int],
    windows: list[WindowData],
    hparams: dict[str, Any],
    config: Mapping[str, Any],
    device: torch.device,
    precision: PrecisionPlan,
    memory: HardwareBudget,
    model_paths: list[str],
    log_paths: list[str],
    resume_path: str,
    tensorboard_dirs: list[str] | None,
    inputs: list[str],
) -> list[dict[str, Any]]:
    """One batched training of the folds of ``batch`` × ``seed_indices`` (fold-major), its outputs written."""
    model, training = entry.name, config["training"]
    units = [(fold, index) for fold in batch for index in seed_indices]
    seeds = [derive_seed(config["seed"], "train", model, fold, index) for fold, index in units]
    if len(batch) == 1:
        train_data, blocks = windows[0].splits["train"], None
    else:  # folds on the batch axis: one stacked training table, each seed on its own fold's rows
        train_data, ranges = stack_market_data([window.splits["train"] for window in windows])
        blocks = FoldBlocks(
            train_rows=tuple(ranges[batch.index(fold)] for fold, _ in units),
            validation=tuple(windows[batch.index(fold)].splits["validation"] for fold, _ in units),
        )
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
            "inputs": inputs,
        },
    )
    board = TrainingBoard(tensorboard_dirs, seeds) if tensorboard_dirs is not None else None
    with board if board is not None else contextlib.nullcontext():
        progress = ProgressLog(budget_steps, len(seeds), board)
        started = time.perf_counter()
        runs = entry.train(
            TrainRequest(
                train_data=train_data,
                validation_data=windows[0].splits["validation"] if blocks is None else None,
                config=config,
                hparams=hparams,
                precision=precision,
                device=device,
                seeds=tuple(seeds),
                budget=budget_steps,
                on_score=progress,
                on_log=functools.partial(_on_statistics, board),
                checkpoint=checkpoint,
                memory=memory,
                gate_min_t=training["gate_min_t"],
                blocks=blocks,
            )
        )
        wall_s = time.perf_counter() - started
        if len(runs) != len(seeds):
            raise RuntimeError(f"{model}: {len(runs)} trained runs for {len(seeds)} seeds")
        provenance = collect(dict(config), device=str(device))
        # the cost model the model was trained with: evaluation refuses a config that charges differently
        costs = cost_model_from_config(config["costs"]).to_config()
        train_logs = []
        for position, ((fold, index), seed, trained) in enumerate(zip(units, seeds, runs, strict=True)):
            trained.save(
                model_paths[position],
                windows[batch.index(fold)],
                {"fold": fold, "seed_index": index, "seed": seed, "costs": costs},
            )
            train_log = {
                "algo": model,  # on-disk key kept for compatibility
                "kind": entry.kind,
                "fold": fold,
                "seed_index": index,
                "seed": seed,
                "deterministic": entry.deterministic,
                "batch": {
                    "seed_indices": list(seed_indices),
                    "position": position % len(seed_indices),
                    "wall_s": wall_s,
                    **({} if len(batch) == 1 else {"folds": list(batch)}),
                },
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
