"""Per-fold, per-seed training jobs: best hyperparameters in, a checkpoint and a training log out.

The network is built from the study's `hidden_dim_base` (older hyperparameter files without it fall back to
[128, 64]); normalization is fit on the fold's inner training rows and stored in the checkpoint; the validation tail
is scored at a fixed cadence and reported in the job log with progress, steps/s and ETA.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from gpu_utils import detect_precision, resolve_device
from marketrl.agents import dqn, ppo
from marketrl.agents.checkpoint import save_checkpoint
from marketrl.agents.common import TrainResult
from marketrl.agents.resume import TrainingCheckpoint
from marketrl.config import derive_seed
from marketrl.datasets import cost_model_from_config, env_config_from_config, fold_window, load_features
from marketrl.env import EnvConfig, MarketData
from marketrl.evaluation import validation_sharpe
from marketrl.folds import FoldPlan
from marketrl.io import write_json_atomic
from marketrl.metrics import to_json_safe
from marketrl.provenance import collect, sha256_file

log = logging.getLogger(__name__)

TRAINERS = {"dqn": dqn, "ppo": ppo}
EVALS_PER_RUN = 10  # validation scores (and progress lines) per training run


class HparamsError(ValueError):
    """A hyperparameter file is missing, malformed, or does not belong to the algorithm."""


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


def run_training(
    algo: str,
    *,
    train_data: MarketData,
    env_config: EnvConfig,
    hparams: Mapping[str, Any],
    precision: Any,
    device: torch.device,
    seed: int,
    total_steps: int,
    on_eval: Callable[[int, Callable], float | None] | None = None,
    check_every: int = 100,
    checkpoint: TrainingCheckpoint | None = None,
) -> TrainResult:
    """Train `algo` with the given hyperparameters; the one call hyperopt and the train job share.

    With `checkpoint` the run resumes from, and periodically saves, its full training state.
    """
    eval_every = max(1, total_steps // EVALS_PER_RUN) if on_eval is not None else 0
    if algo == "dqn":
        config = dqn.DQNConfig(
            total_steps=total_steps, env=env_config, eval_every=eval_every, check_every=check_every
        )
    else:
        config = ppo.PPOConfig(total_steps=total_steps, env=env_config, eval_every=eval_every)
    return TRAINERS[algo].train(
        train_data, config, dict(hparams), precision, device, seed, on_eval=on_eval, checkpoint=checkpoint
    )


class ProgressLog:
    """Validation scores at a fixed cadence, logged with progress, steps/s and ETA for `tail -f`."""

    def __init__(self, validation: MarketData, env_config: EnvConfig, total_steps: int) -> None:
        # the same objective hyperopt optimizes
        self._score = lambda policy: validation_sharpe(policy, validation, env_config)
        self.total_steps = total_steps
        self.started = time.perf_counter()
        self.records: list[dict[str, float]] = []

    def __call__(self, step: int, policy: Callable) -> float:
        score = self._score(policy)
        elapsed = time.perf_counter() - self.started
        rate = step / elapsed if elapsed > 0 else math.nan
        eta = (self.total_steps - step) / rate if rate and rate > 0 else math.nan
        self.records.append({"step": step, "val_sharpe": score, "elapsed_s": elapsed})
        log.info(
            "progress: step %d/%d (%.0f%%), %.0f steps/s, ETA %.0fs, validation Sharpe %.3f",
            step,
            self.total_steps,
            100.0 * step / self.total_steps,
            rate,
            eta,
            score,
        )
        return score


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
    """Train one algorithm on one fold with one seed; write model.pt and train_log.json atomically.

    `resume_path` is the resumable checkpoint: an undeclared side file (marketrl.paths.RESUME), removed once
    model.pt is written.
    """
    hparams = load_hparams(hparams_path, algo)
    device = resolve_device(config["training"]["device"])
    precision = detect_precision(device, config["training"]["precision"])
    log.info("precision %s: %s", precision.mode, precision.reason)
    seed = derive_seed(config["seed"], "train", algo, fold, seed_index)
    plan = FoldPlan.load(folds_path)
    window = fold_window(load_features(manifest_path), plan, fold, config, device)
    total_steps = config["training"]["total_steps"]
    env_config = env_config_from_config(config)
    progress = ProgressLog(window.splits["validation"], env_config, total_steps)
    # Only a state saved by this very run (same settings and inputs) is resumed.
    checkpoint = TrainingCheckpoint(
        Path(resume_path),
        config["training"]["checkpoint_every"],
        {
            "algo": algo,
            "seed": seed,
            "hparams": hparams,
            "total_steps": total_steps,
            "check_every": config["training"]["check_every"],
            "env": dict(config["env"]),
            "n_envs": config["training"]["n_envs"],
            "device": str(device),
            "precision": precision.mode,
            "inputs": [sha256_file(manifest_path), sha256_file(folds_path)],
        },
    )
    started = time.perf_counter()
    result = run_training(
        algo,
        train_data=window.splits["train"],
        env_config=env_config,
        hparams=hparams,
        precision=precision,
        device=device,
        seed=seed,
        total_steps=total_steps,
        on_eval=progress,
        check_every=config["training"]["check_every"],
        checkpoint=checkpoint,
    )
    wall_s = time.perf_counter() - started
    save_checkpoint(
        model_path,
        result,
        algo=algo,
        normalizer_state=window.normalizer.state_dict(),
        feature_names=window.feature_names,
        precision=precision.to_dict(),
        hparams=hparams,
        # the cost model the agent was trained with: evaluation refuses a config that charges differently
        extra={
            "fold": fold,
            "seed_index": seed_index,
            "seed": seed,
            "costs": cost_model_from_config(config["costs"]).to_config(),
        },
    )
    train_log = {
        "algo": algo,
        "fold": fold,
        "seed_index": seed_index,
        "seed": seed,
        "hparams": hparams,
        "precision": precision.to_dict(),
        "device": str(device),
        "total_steps": total_steps,
        "wall_s": wall_s,
        "resumed_from_step": checkpoint.resumed_from,
        "checkpoints_saved": checkpoint.saves,
        "validation": progress.records,
        **result.log,
        # docs/OUTPUTS.md: history records are keyed by "step" (env steps), validation scores included.
        "history": [{**record, "step": record["env_steps"]} for record in result.log["history"]]
        # from the trainer's evaluation records, which a resumed run restores from its checkpoint
        + [{"step": int(step), "val_sharpe": score} for step, score in result.log["evals"]],
        "steps_per_s": result.log["steps_per_second"],
        "provenance": collect(dict(config), device=str(device)),
    }
    write_json_atomic(log_path, to_json_safe(train_log))
    checkpoint.remove()  # the final model is written: a later forced rerun starts from scratch
    return train_log
