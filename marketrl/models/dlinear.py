"""DLinear: each feature's window is split into a trend (centred moving average over the window, edges
replicated) and a remainder; one linear map over time per part gives ``hidden_dim_base`` values per feature,
and a linear head maps all features' values to the prediction. Linear end to end. Dropout drops whole features
(all ``hidden_dim_base`` values of one feature in one sample): a head that cannot lean on any one feature, at one
random draw per feature instead of one per value (per-value dropout's random numbers were 40% of a fold's
training CPU, bench/speed/models.py).

The moving average runs over the window's own rows only (t-window+1..t), so it never reads a later bar. The head
starts at zero: the untrained model predicts the mean and trades nothing (docs/PERFORMANCE.md "Do no harm").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from marketrl.loop.hparams import check_ranges
from marketrl.loop.profile import ModelProfile
from marketrl.models.base import NeuralHParams, Trial, neural_space, zero_head
from marketrl.models.supervised_trainer import SMALL_HPARAMS, torch_model_spec, torch_trial_cost

__all__ = ["PROFILE", "SPEC", "DLinear", "DLinearHParams", "search_space"]


@dataclass(frozen=True)
class DLinearHParams(NeuralHParams):
    """Shared neural hyperparameters plus the moving-average kernel (made odd and at most the window)."""

    window: int = 16
    kernel_size: int = 5

    def validate(self) -> None:
        """Ranges."""
        super().validate()
        check_ranges(self, at_least_one=("kernel_size",))


def search_space(trial: Trial) -> dict[str, Any]:
    """`neural_space` with windows of 2-8 rows and widths up to 64 (window 32 at width 128 cost 10x the median
    trial, bench/speed/hyperopt_cost.py), plus the kernel (capped by the window)."""
    return {
        **neural_space(trial, max_window=8, widths=(16, 32, 64), min_window=2),
        "kernel_size": trial.suggest_categorical("kernel_size", [3, 5, 9, 15]),
    }


class DLinear(nn.Module):
    """windows [B, window, F] -> predicted forward return [B]."""

    def __init__(self, hp: DLinearHParams, n_features: int) -> None:
        super().__init__()
        kernel = min(hp.kernel_size, hp.window)
        self.kernel = kernel if kernel % 2 == 1 else kernel - 1
        self.trend = nn.Linear(hp.window, hp.hidden_dim_base)
        self.remainder = nn.Linear(hp.window, hp.hidden_dim_base)
        self.drop = nn.Dropout1d(hp.dropout)  # [B, F, hidden]: drops features
        # A linear regression from zero on the random time maps' features, not a random map trading its noise.
        self.head = zero_head(nn.Linear(n_features * hp.hidden_dim_base, 1))

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Predictions [B]."""
        series = windows.transpose(1, 2)  # [B, F, window]
        half = (self.kernel - 1) // 2
        padded = nn.functional.pad(series, (half, half), mode="replicate") if half else series
        trend = nn.functional.avg_pool1d(padded, self.kernel, stride=1)
        mixed = self.trend(trend) + self.remainder(series - trend)  # [B, F, hidden]
        return self.head(self.drop(mixed).flatten(1)).squeeze(-1)


def multiply_adds(hp: Mapping[str, Any], n_features: int) -> int:
    """One sample's forward pass: two linear maps over time per feature, then the head."""
    width = hp["hidden_dim_base"]
    return n_features * hp["window"] * width * 2 + n_features * width


#: Its cost-driving bounds and trial cost, small test sizes and docs row (`marketrl.loop.profile`).
PROFILE = ModelProfile(
    bounds={
        "window": (2, 8),
        "hidden_dim_base": (16, 64),
        "batch_size": (128, 1024),
        "kernel_size": (3, 15),
    },
    trial_cost=torch_trial_cost(multiply_adds, sequence=False),
    small=SMALL_HPARAMS,
    summary=(
        "per feature: trend = centred moving average over the window (edges replicated), remainder = "
        "rest; `Linear(L → b)` on each, summed; `Linear(F·b → 1)` head"
    ),
    own_hyperparameters="`kernel_size` {3, 5, 9, 15} (made odd, ≤ L); window 2…8, `b` {16, 32, 64}",
)
SPEC = torch_model_spec("dlinear", DLinearHParams, search_space, DLinear, PROFILE)
