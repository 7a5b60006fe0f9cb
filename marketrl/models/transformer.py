"""Transformer encoder over the window: linear embedding plus a learned position embedding, pre-norm encoder
layers, and the last row's token (row t) through a layer norm and a linear head.

Attention is over the window's own rows t-window+1..t only, so no mask is needed to keep later bars out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from marketrl.loop.hparams import check_ranges, require
from marketrl.loop.profile import ModelProfile
from marketrl.models.base import NeuralHParams, Trial, sequence_space, zero_head
from marketrl.models.supervised_trainer import SMALL_HPARAMS, torch_model_spec, torch_trial_cost

__all__ = ["PROFILE", "SPEC", "TransformerHParams", "TransformerRegressor", "search_space"]


@dataclass(frozen=True)
class TransformerHParams(NeuralHParams):
    """Shared neural hyperparameters (model width = hidden_dim_base, feed-forward 2x) plus heads and layers."""

    window: int = 16
    n_heads: int = 2
    n_layers: int = 1

    def validate(self) -> None:
        """Ranges; the width must split evenly over the heads."""
        super().validate()
        check_ranges(self, at_least_one=("n_heads", "n_layers"))
        require(
            self.hidden_dim_base % self.n_heads == 0, "n_heads", "a divisor of hidden_dim_base", self.n_heads
        )


def search_space(trial: Trial) -> dict[str, Any]:
    """`sequence_space` (bounded window and width) plus heads (1, 2, 4), one layer."""
    return {
        # A step costs window x (width x FFN + window x width) per row and layer: at window 28, width 128 and 3
        # layers one 256-row step took ~0.35 s on one CPU core, one trial ~8 minutes of the demo's study, and at
        # window 15 five seeds of training ~12 job-minutes: more than make run's budget allows this one model.
        # A second layer doubled a trial's cost at the largest window and width (bench/speed/hyperopt_cost.py).
        **sequence_space(trial),
        "n_heads": trial.suggest_categorical("n_heads", [1, 2, 4]),
        "n_layers": trial.suggest_categorical("n_layers", [1]),  # suggested: best_params carry it
    }


class TransformerRegressor(nn.Module):
    """windows [B, window, F] -> predicted forward return [B]."""

    def __init__(self, hp: TransformerHParams, n_features: int) -> None:
        super().__init__()
        width = hp.hidden_dim_base
        self.embed = nn.Linear(n_features, width)
        self.position = nn.Parameter(torch.randn(hp.window, width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            width, hp.n_heads, 2 * width, hp.dropout, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, hp.n_layers, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(width), zero_head(nn.Linear(width, 1)))

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Predictions [B]."""
        tokens = self.encoder(self.embed(windows) + self.position)
        return self.head(tokens[:, -1]).squeeze(-1)


def multiply_adds(hp: Mapping[str, Any], n_features: int) -> int:
    """One sample's forward pass: the embedding, then per layer attention (projections and window x window
    scores) and the feed-forward block, at each row."""
    width, window = hp["hidden_dim_base"], hp["window"]
    layer = 4 * width * width + 4 * width * width + 2 * window * width
    return window * (n_features * width + hp["n_layers"] * layer)


#: Its cost-driving bounds and trial cost, small test sizes and docs row (`marketrl.loop.profile`).
PROFILE = ModelProfile(
    bounds={
        "window": (2, 8),
        "hidden_dim_base": (16, 32),
        "batch_size": (128, 1024),
        "n_heads": (1, 4),
        "n_layers": (1, 1),
    },
    trial_cost=torch_trial_cost(multiply_adds, sequence=True),
    small=SMALL_HPARAMS,
    summary=(
        "linear embedding to `b` + learned positions → pre-norm encoder layers (feed-forward `2b`) → "
        "row-t token → LayerNorm → linear"
    ),
    own_hyperparameters="`n_heads` {1, 2, 4} (must divide `b`), `n_layers` 1 (fixed); window 2…8, `b` {16, 32}",
)
SPEC = torch_model_spec("transformer", TransformerHParams, search_space, TransformerRegressor, PROFILE)
