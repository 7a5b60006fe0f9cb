"""Forecast quality of the supervised models: information coefficients and calibration bins."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from marketrl.scoring.metrics import summarize_information_coefficients
from marketrl.verdict.inputs import (
    ReportInputError,
)
from marketrl.verdict.strategies import Strategy

# ------------------------------------------------------------------------------ forecast quality (forecasters)


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


def forecast_quality(model: str, agents: Sequence[Strategy], horizon: int | None = None) -> ForecastQuality:
    """The forecast-quality statistics of one forecaster from its seeds' reduced forecasts (`SeedForecasts`)."""
    members = sorted((a for a in agents if a.name == model), key=lambda a: a.seed_index or 0)
    if not members or any(m.forecasts is None for m in members):
        raise ReportInputError(f"report: {model} has runs without predictions (not a forecaster)")
    folds = sorted(members[0].fold_runs)
    seed_fold: dict[int, dict[int, dict[str, float]]] = {}
    seed_pooled: dict[int, dict[str, float]] = {}
    daily: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    bins_x, bins_y = [], []
    n_pairs = 0
    for member in members:
        forecasts = member.forecasts
        assert forecasts is not None
        seed = member.seed_index or 0
        seed_fold[seed] = {
            fold: summarize_information_coefficients(*forecasts.daily_ic[fold][1:]) for fold in folds
        }
        # Test windows never overlap, so pooling the folds is concatenating their days.
        days, ic, rank_ic = (np.concatenate([forecasts.daily_ic[f][k] for f in folds]) for k in range(3))
        order = np.argsort(days, kind="stable")
        daily[seed] = (days[order], ic[order], rank_ic[order])
        seed_pooled[seed] = summarize_information_coefficients(ic, rank_ic)
        n_pairs = forecasts.n_pairs
        bins_x.append(forecasts.bins[0])
        bins_y.append(forecasts.bins[1])
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
