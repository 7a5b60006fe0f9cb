"""A throwaway forecaster that lives in tests/, registered only by config (``training.extra_models``):
tests/test_registry.py runs it through hyperopt, training, evaluation and the report, and through the checks every
registered model gets from its profile (pinned bounds, corners within 4x of the median trial, small test sizes,
its docs row), to show that a model is one file plus one registry line: this file defines everything, and no
other code names the model. One linear layer over the flattened window, built with the zoo's `torch_model_spec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from marketrl.loop.profile import ModelProfile
from marketrl.models.base import NeuralHParams, Trial, common_space
from marketrl.models.supervised_trainer import torch_model_spec, torch_trial_cost

__all__ = ["PROFILE", "SPEC", "ThrowawayHParams", "search_space"]


@dataclass(frozen=True)
class ThrowawayHParams(NeuralHParams):
    """The shared neural hyperparameters, with a short window."""

    window: int = 2


def search_space(trial: Trial) -> dict[str, Any]:
    """A tiny space: the shared window and trading-rule keys, one width and a learning rate."""
    return {
        **common_space(trial, max_window=4),
        "hidden_dim_base": trial.suggest_categorical("hidden_dim_base", [4]),
        "learning_rate": trial.suggest_float("learning_rate", 1e-3, 1e-2, log=True),
    }


class Throwaway(nn.Module):
    """windows [B, window, F] -> predicted forward return [B], one linear layer."""

    def __init__(self, hp: ThrowawayHParams, n_features: int) -> None:
        super().__init__()
        self.head = nn.Linear(hp.window * n_features, 1)

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Predictions [B]."""
        return self.head(windows.flatten(1)).squeeze(-1)


def multiply_adds(hp: Mapping[str, Any], n_features: int) -> int:
    """One sample's forward pass: the one linear layer."""
    return hp["window"] * n_features


PROFILE = ModelProfile(
    bounds={"window": (1, 4)},
    trial_cost=torch_trial_cost(multiply_adds, sequence=False),
    small={"window": 2, "hidden_dim_base": 4, "batch_size": 16, "learning_rate": 3e-2},
    summary="one linear layer over the flattened window (tests/support/throwaway_model.py)",
    own_hyperparameters="window 1…4, `learning_rate` 1e-3…1e-2 log",
)
SPEC = torch_model_spec("throwaway", ThrowawayHParams, search_space, Throwaway, PROFILE)
