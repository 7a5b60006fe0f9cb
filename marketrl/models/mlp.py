"""MLP on the flattened lookback window: ``window·F -> b -> b/2 -> 1`` (ReLU, dropout), b = hidden_dim_base."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from marketrl.loop.profile import ModelProfile
from marketrl.models.base import NeuralHParams, Trial, neural_space, zero_head
from marketrl.models.supervised_trainer import SMALL_HPARAMS, torch_model_spec, torch_trial_cost

__all__ = ["MLP", "PROFILE", "SPEC", "MLPHParams", "search_space"]


@dataclass(frozen=True)
class MLPHParams(NeuralHParams):
    """The shared neural hyperparameters; a short default window (the MLP sees it flattened)."""

    window: int = 4


def search_space(trial: Trial) -> dict[str, Any]:
    """`neural_space` with windows of 2-8 rows (16 rows cost 5x the median trial, bench/speed/hyperopt_cost.py)."""
    return neural_space(trial, max_window=8, min_window=2)


class MLP(nn.Module):
    """windows [B, window, F] -> predicted forward return [B]."""

    #: S seeds vectorized with vmap pay on the CPU too (supervised_trainer.vectorize_seeds)
    seeds_vmap_on_cpu = True

    def __init__(self, hp: MLPHParams, n_features: int) -> None:
        super().__init__()
        width = hp.hidden_dim_base
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(hp.window * n_features, width),
            nn.ReLU(),
            nn.Dropout(hp.dropout),
            nn.Linear(width, width // 2),
            nn.ReLU(),
            nn.Dropout(hp.dropout),
            zero_head(nn.Linear(width // 2, 1)),
        )

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Predictions [B]."""
        return self.net(windows).squeeze(-1)


def multiply_adds(hp: Mapping[str, Any], n_features: int) -> int:
    """One sample's forward pass: window·F -> b -> b/2."""
    width = hp["hidden_dim_base"]
    return hp["window"] * n_features * width + width * width // 2


#: Its cost-driving bounds and trial cost, small test sizes and docs row (`marketrl.loop.profile`).
PROFILE = ModelProfile(
    bounds={"window": (2, 8), "hidden_dim_base": (16, 128), "batch_size": (128, 1024)},
    trial_cost=torch_trial_cost(multiply_adds, sequence=False),
    small=SMALL_HPARAMS,
    summary="flatten → `b` → `b/2` → 1, ReLU, dropout",
    own_hyperparameters="window 2…8, `b` {16, 32, 64, 128}",
)
SPEC = torch_model_spec("mlp", MLPHParams, search_space, MLP, PROFILE)
