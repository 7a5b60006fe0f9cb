"""Forecast quality of the supervised models: information coefficients and calibration bins."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from marketrl.scoring.metrics import (
    daily_information_coefficients,
    summarize_information_coefficients,
)
from marketrl.verdict.inputs import (
    ReportInputError,
)
from marketrl.verdict.strategies import Strategy

# ------------------------------------------------------------------------------ forecast quality (forecasters)

#: prediction bins of the calibration panel (equal-count bins of the pooled predictions: deciles)
CALIBRATION_BINS = 10


@dataclass
class ForecastQuality:
    """IC, Rank IC and ICIR of one forecaster by session day (docs/METRICS.md, "Forecast quality").

    Every summary is a dict ``{"ic", "rank_ic", "icir", "rank_icir", "n_days"}``: per seed per fold, per seed
    pooled over the folds (the daily ICs of all test days together), and their mean over seeds.
    """

    model: str
    horizon: int | None
    folds: list[int]
    seeds: list[int]
    seed_fold: dict[int, dict[int, dict[str, float]]]  # seed -> fold -> summary
    seed_pooled: dict[int, dict[str, float]]
    fold_mean: dict[int, dict[str, float]]  # fold -> mean over seeds
    pooled_mean: dict[str, float]
    daily: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]  # seed -> (days, IC, Rank IC), pooled
    calibration_prediction: np.ndarray  # [CALIBRATION_BINS] mean prediction per bin, mean over seeds
    calibration_realized: np.ndarray  # [CALIBRATION_BINS] mean realized forward return per bin
    n_pairs: int  # (prediction, realized) pairs of one seed, pooled (the same bars for every seed)


_IC_KEYS = ("ic", "rank_ic", "icir", "rank_icir", "n_days")


def _mean_summary(summaries: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean over seeds of each IC statistic (NaN when any seed's is undefined: no seed is dropped silently)."""
    return {key: float(np.mean([s[key] for s in summaries])) if summaries else math.nan for key in _IC_KEYS}


def calibration_bins(
    prediction: np.ndarray, realized: np.ndarray, n_bins: int = CALIBRATION_BINS
) -> tuple[np.ndarray, np.ndarray]:
    """(mean prediction, mean realized) in ``n_bins`` equal-count bins of the prediction (ties split by
    order); rows with a non-finite side are dropped; NaN bins when there are fewer rows than bins."""
    keep = np.isfinite(prediction) & np.isfinite(realized)
    x, y = prediction[keep], realized[keep]
    if x.size < n_bins:
        return np.full(n_bins, math.nan), np.full(n_bins, math.nan)
    order = np.argsort(x, kind="stable")
    bins = np.empty(x.size, dtype=np.int64)
    bins[order] = np.arange(x.size) * n_bins // x.size
    counts = np.bincount(bins, minlength=n_bins)
    return (
        np.bincount(bins, weights=x, minlength=n_bins) / counts,
        np.bincount(bins, weights=y, minlength=n_bins) / counts,
    )


def forecast_quality(model: str, agents: Sequence[Strategy], horizon: int | None = None) -> ForecastQuality:
    """The forecast-quality statistics of one forecaster from its runs' ``prediction``/``forward_return``."""
    members = sorted((a for a in agents if a.name == model), key=lambda a: a.seed_index or 0)
    if not members or any(run.forecasts is None for m in members for run in m.fold_runs.values()):
        raise ReportInputError(f"report: {model} has runs without predictions (not a forecaster)")
    folds = sorted(members[0].fold_runs)
    seed_fold: dict[int, dict[int, dict[str, float]]] = {}
    seed_pooled: dict[int, dict[str, float]] = {}
    daily: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    bins_x, bins_y = [], []
    n_pairs = 0
    for member in members:
        seed = member.seed_index or 0
        seed_fold[seed] = {}
        parts = []
        for fold in folds:
            frame = member.fold_runs[fold].forecasts
            assert frame is not None
            days, ic, rank_ic = daily_information_coefficients(
                frame["trading_day"], frame["prediction"], frame["forward_return"]
            )
            seed_fold[seed][fold] = summarize_information_coefficients(ic, rank_ic)
            parts.append((days, ic, rank_ic, frame))
        # Test windows never overlap, so pooling the folds is concatenating their days.
        days = np.concatenate([p[0] for p in parts])
        ic = np.concatenate([p[1] for p in parts])
        rank_ic = np.concatenate([p[2] for p in parts])
        order = np.argsort(days, kind="stable")
        daily[seed] = (days[order], ic[order], rank_ic[order])
        seed_pooled[seed] = summarize_information_coefficients(ic, rank_ic)
        prediction = np.concatenate([p[3]["prediction"].to_numpy() for p in parts])
        realized = np.concatenate([p[3]["forward_return"].to_numpy() for p in parts])
        n_pairs = int((np.isfinite(prediction) & np.isfinite(realized)).sum())
        x, y = calibration_bins(prediction, realized)
        bins_x.append(x)
        bins_y.append(y)
    seeds = sorted(seed_fold)
    return ForecastQuality(
        model=model,
        horizon=horizon,
        folds=folds,
        seeds=seeds,
        seed_fold=seed_fold,
        seed_pooled=seed_pooled,
        fold_mean={f: _mean_summary([seed_fold[s][f] for s in seeds]) for f in folds},
        pooled_mean=_mean_summary([seed_pooled[s] for s in seeds]),
        daily=daily,
        calibration_prediction=np.mean(bins_x, axis=0),
        calibration_realized=np.mean(bins_y, axis=0),
        n_pairs=n_pairs,
    )
