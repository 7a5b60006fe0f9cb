"""Memory requests (`resources: mem_mb`) of the rules, so Snakemake (``--resources mem_mb=``, `make run`) and
SLURM (``--mem``) never start more jobs than the machine holds.

The training and tuning jobs' memory grows with their window; their request is a linear model of the window's
cells (rows x features) and, for LightGBM, of its flattened matrix's (its sampled rows, at most
training.max_train_rows, x features x its lookback `window`), one per kind of model, fitted to the ``max_rss`` of measured jobs
(`results/benchmarks/train/`, docs/PERFORMANCE.md "Bounded memory") and given `HEADROOM`. Every other rule
holds a fixed amount of data (one file, a fold's test days, the report's summaries) and requests a constant, at
least twice its largest measured ``max_rss``. Read only JSON (the manifest and the fold plan): this module runs
at every DAG parse and imports nothing heavy.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marketrl.settings.registry import DETERMINISTIC, REGISTRY

__all__ = [
    "FIXED_MB",
    "HEADROOM",
    "MEMORY_MODELS",
    "MemoryModel",
    "flattened_window",
    "matrix_cells",
    "memory_model",
    "model_kind",
    "model_mem_mb",
    "train_mem_mb",
    "tuning_mem_mb",
    "window_cells",
    "window_rows",
    "within_limit",
]

#: requests are the model's estimate times this, rounded up to 100 MB: the fit's residuals were below 10%, and
#: Snakemake samples max_rss (a short peak can be missed)
HEADROOM = 1.3
#: features assumed before the manifest exists (the catalog's count at the time of the fit, docs/FEATURES.md)
DEFAULT_FEATURES = 51
#: bars per trading day assumed before the manifest exists (the demo: two instruments, ~2,800 bars a day)
DEFAULT_ROWS_PER_DAY = 2_800
#: the kinds whose trainers flatten the lookback window into one rows x (window x features) matrix, and the
#: largest window of their search space (a hyperopt worker's trials may draw it; a train job reads its own)
FLATTENING_MAX_WINDOW = {"boosted": 8}
#: MB per million cells of LightGBM's flattened matrix (float32 rows x window x features, its binned Dataset and
#: the gather that builds it): one job at window 8, docs/PERFORMANCE.md "Bounded memory"
MATRIX_MB_PER_MCELL = 10.0


@dataclass(frozen=True)
class MemoryModel:
    """Peak RSS of a job in MB that trains `seeds` seeds on a window of `cells` cells (rows x features: the table
    it reads) and, for LightGBM, holds a flattened matrix of `matrix_cells` (its sampled rows x features x its
    window): `base_mb` (interpreter, libraries) + `mb_per_seed` x seeds + million cells x (`mb_per_mcell` +
    `mb_per_seed_mcell` x seeds) + million matrix cells x `mb_per_matrix_mcell`."""

    base_mb: float
    mb_per_mcell: float
    mb_per_seed: float = 0.0
    mb_per_seed_mcell: float = 0.0
    mb_per_matrix_mcell: float = 0.0

    def estimate_mb(self, cells: int, seeds: int = 5, matrix_cells: int = 0) -> float:
        """The modelled peak RSS in MB of `seeds` seeds on a window of `cells` cells (and a matrix)."""
        mcells = max(cells, 0) / 1e6
        seeds = max(seeds, 1)
        return (
            self.base_mb
            + self.mb_per_seed * seeds
            + mcells * (self.mb_per_mcell + self.mb_per_seed_mcell * seeds)
            + max(matrix_cells, 0) / 1e6 * self.mb_per_matrix_mcell
        )

    def request_mb(self, cells: int, seeds: int = 5, matrix_cells: int = 0) -> int:
        """`estimate_mb` with `HEADROOM`, rounded up to 100 MB: what the rule requests."""
        return int(math.ceil(self.estimate_mb(cells, seeds, matrix_cells) * HEADROOM / 100.0) * 100)


#: Fitted to measured max_rss (docs/PERFORMANCE.md, "Bounded memory": the 500-day demo's 220 train jobs, 20
#: folds of 100-250 trading days, training.seeds 5, 51 features, and one LightGBM job at window 8). Every kind's
#: memory follows the window's table (about 25 MB per million cells: the table, its normalized copy, the device
#: tensors); LightGBM's also its flattened matrix. "agent": dqn and ppo; "forecaster": the seven torch forecasters;
#: "linear": ridge (its normal equations are summed chunk by chunk: no matrix); "boosted": lightgbm. A model
#: registered by training.extra_models gets the largest. Seeds: DQN at fold 0 of a 150-day demo took 510 MB with 1
#: seed, 589 with 5 (a replay memory a seed).
MEMORY_MODELS: dict[str, MemoryModel] = {
    "agent": MemoryModel(base_mb=480.0, mb_per_mcell=24.0, mb_per_seed=20.0),
    "boosted": MemoryModel(base_mb=480.0, mb_per_mcell=25.0, mb_per_matrix_mcell=MATRIX_MB_PER_MCELL),
    "linear": MemoryModel(base_mb=330.0, mb_per_mcell=32.5),
    "forecaster": MemoryModel(base_mb=430.0, mb_per_mcell=27.0, mb_per_seed=20.0),
}

#: Rules holding a fixed amount of data: MB requested (measured max_rss in docs/PERFORMANCE.md, at least doubled).
FIXED_MB: dict[str, int] = {
    "demo_data": 1000,
    "download_databento": 2000,
    "user_features_audit": 1000,
    "features": 1000,
    "predict_features": 1000,
    "feature_manifest": 1000,
    "folds": 1000,
    "hyperopt_best": 1000,
    "evaluate": 2000,
    "evaluate_once": 2000,
    "baselines": 2000,
    "report": 3500,
    "calibration_worlds": 2000,
    "calibration": 1000,
    "predict": 2000,
    "export": 2000,
    "export_once": 2000,
}


def model_kind(model: str) -> str | None:
    """The key of `MEMORY_MODELS` of a model name of training.models, by where its spec lives (without importing
    it); None for a model registered by training.extra_models."""
    location = REGISTRY.get(model)
    if location is None:
        return None
    if model in DETERMINISTIC:
        return "linear"
    if location.startswith("marketrl.agents."):
        return "agent"
    if "lightgbm" in location:
        return "boosted"
    return "forecaster"


def memory_model(model: str) -> MemoryModel:
    """The memory model of a model name of training.models; an unknown one (training.extra_models) gets the
    largest."""
    kind = model_kind(model)
    if kind is None:
        return max(MEMORY_MODELS.values(), key=lambda m: m.estimate_mb(10**8))  # at 5 seeds
    return MEMORY_MODELS[kind]


def flattened_window(model: str, hparams_path: str | Path | None) -> int:
    """How many times a flattening model (LightGBM) copies each cell of its matrix: its best `window` (the
    hyperopt JSON's best_params), or with no file yet its search space's largest; 1 for the others."""
    kind = model_kind(model)
    if kind not in FLATTENING_MAX_WINDOW:
        return 1
    data = _read_json(hparams_path) if hparams_path is not None else None
    try:
        window = int(data["best_params"]["window"])
    except (TypeError, KeyError, ValueError):
        return FLATTENING_MAX_WINDOW[kind]
    return max(window, 1)


def _read_json(path: str | Path) -> Any:
    """The JSON of `path`, or None while it does not exist (or is not JSON). Snakemake evaluates the requests of
    every ready job at each scheduling round, so a file is parsed once per version (path, mtime, size)."""
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return _parsed(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def window_rows(
    manifest_path: str | Path, folds_path: str | Path, window: str, fold: int | None
) -> tuple[int, int] | None:
    """(rows, features) of a window of the fold plan: ``"train"`` (fold `fold`'s training window) or
    ``"tuning"`` (the study's: fold `fold`'s own, or with None the single one). Rows are the manifest's rows of
    the tables inside the window (a table spanning several days counted by its share of them); None while the
    manifest or the plan does not exist yet (a dry run, a DAG parse before the features)."""
    manifest, plan = _read_json(manifest_path), _read_json(folds_path)
    if not isinstance(manifest, Mapping) or not isinstance(plan, Mapping):
        return None
    try:
        if window == "train":
            first, last = plan["folds"][fold]["train"]["day_index"]
        elif fold is None:
            first, last = plan["tuning"]["day_index"]
        else:
            first, last = plan["folds"][fold]["tuning"]["day_index"]
        days = plan["trading_days"]
        position = {day: i for i, day in enumerate(days)}
        rows = 0.0
        for entry in manifest["files"]:
            if (
                not entry.get("rows")
                or entry["first_day"] not in position
                or entry["last_day"] not in position
            ):
                continue
            start, stop = position[entry["first_day"]], position[entry["last_day"]] + 1
            inside = min(stop, last) - max(start, first)
            if inside > 0:
                rows += entry["rows"] * inside / (stop - start)
        n_features = int(manifest.get("n_features") or DEFAULT_FEATURES)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return int(rows), n_features


def window_cells(
    manifest_path: str | Path, folds_path: str | Path, window: str, fold: int | None
) -> int | None:
    """Cells (rows x features) of a window of the fold plan (`window_rows`); None before its inputs exist."""
    size = window_rows(manifest_path, folds_path, window, fold)
    return None if size is None else size[0] * size[1]


def _default_rows(config: Mapping[str, Any], window: str) -> tuple[int, int]:
    """(rows, features) assumed before the manifest and plan exist: the longest window the config allows, at the
    demo's bars per day. Snakemake evaluates the request again once the inputs exist, before the job starts."""
    folds = config["folds"]
    if window == "tuning":
        days = folds["tuning_days"]
    else:
        history = config["data"]["demo"]["days"] if config["data"]["source"] == "demo" else 250
        cap = folds.get("max_train_days")
        days = history if cap is None else min(history, cap)
    return days * DEFAULT_ROWS_PER_DAY, DEFAULT_FEATURES


def matrix_cells(model: str, rows: int, features: int, window: int, max_train_rows: int | None) -> int:
    """Cells of the flattened matrix a job of `model` holds besides its table: LightGBM's, its rows capped by
    training.max_train_rows (the sample it fits) times features times its window; 0 for the other models."""
    if model_kind(model) not in FLATTENING_MAX_WINDOW:
        return 0
    if max_train_rows is not None:
        rows = min(rows, max_train_rows)
    return rows * features * window


def within_limit(request_mb: int, limit_mb: int | None) -> int:
    """A request no larger than the memory Snakemake was given (``--resources mem_mb=``; None: no limit): a job
    that needs more than the whole limit then runs alone instead of failing the run ("Job needs mem_mb=...")."""
    return request_mb if limit_mb is None else max(min(request_mb, limit_mb), 1)


def model_mem_mb(model: str, cells: int, matrix_cells: int = 0, seeds: int = 5) -> int:
    """MB a job of `model` training `seeds` seeds on a window of `cells` cells (and a flattened matrix of
    `matrix_cells`) requests."""
    return memory_model(model).request_mb(cells, 1 if model in DETERMINISTIC else seeds, matrix_cells)


def _request(config: Mapping[str, Any], model: str, size: tuple[int, int], window: int, seeds: int) -> int:
    rows, features = size
    cap = config.get("training", {}).get("max_train_rows")
    return model_mem_mb(model, rows * features, matrix_cells(model, rows, features, window, cap), seeds)


def train_mem_mb(
    config: Mapping[str, Any],
    model: str,
    fold: int,
    manifest_path: str | Path,
    folds_path: str | Path,
    hparams_path: str | Path | None = None,
) -> int:
    """`resources: mem_mb` of the train job of `model` x `fold` (rules/train.smk); `hparams_path` its best
    hyperparameters (LightGBM's window)."""
    size = window_rows(manifest_path, folds_path, "train", fold) or _default_rows(config, "train")
    window = flattened_window(model, hparams_path)
    return _request(config, model, size, window, config["training"]["seeds"])


def train_folds_mem_mb(
    config: Mapping[str, Any],
    model: str,
    folds: Sequence[int],
    manifest_path: str | Path,
    folds_path: str | Path,
    hparams_path: str | Path | None = None,
) -> int:
    """`resources: mem_mb` of the fold-batched train job of `model` (training.batch_folds): it holds every
    fold's training window and trains folds x seeds at once."""
    sizes = [window_rows(manifest_path, folds_path, "train", fold) for fold in folds]
    if any(size is None for size in sizes):
        sizes = [_default_rows(config, "train")] * len(folds)
    rows = sum(size[0] for size in sizes if size is not None)
    features = max(size[1] for size in sizes if size is not None)
    window = flattened_window(model, hparams_path)
    return _request(config, model, (rows, features), window, config["training"]["seeds"] * len(folds))


def tuning_mem_mb(
    config: Mapping[str, Any], model: str, fold: int | None, manifest_path: str | Path, folds_path: str | Path
) -> int:
    """`resources: mem_mb` of a hyperopt worker of `model` (of `fold`'s study under hyperopt.per_fold)."""
    size = window_rows(manifest_path, folds_path, "tuning", fold) or _default_rows(config, "tuning")
    window = flattened_window(model, None)  # a trial may draw the search space's largest window
    return _request(config, model, size, window, config["hyperopt"]["seeds_per_trial"])
