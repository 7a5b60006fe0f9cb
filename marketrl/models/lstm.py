"""LSTM over the lookback window (oldest row first); the hidden state after row t feeds a linear head.

`RecurrentRegressor` takes the recurrent cell as an argument, so gru.py reuses it with `nn.GRU`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from marketrl.loop.hparams import check_ranges
from marketrl.models.base import NeuralHParams, Trial, sequence_space
from marketrl.models.supervised_trainer import torch_model_spec

__all__ = ["SPEC", "RecurrentHParams", "RecurrentRegressor", "search_space"]


@dataclass(frozen=True)
class RecurrentHParams(NeuralHParams):
    """Shared neural hyperparameters plus the number of stacked layers (hidden size = hidden_dim_base)."""

    window: int = 16
    num_layers: int = 1

    def validate(self) -> None:
        """Ranges."""
        super().validate()
        check_ranges(self, at_least_one=("num_layers",))


def search_space(trial: Trial) -> dict[str, Any]:
    """`sequence_space` (bounded window and width) plus 1-2 layers."""
    return {**sequence_space(trial), "num_layers": trial.suggest_int("num_layers", 1, 2)}


class RecurrentRegressor(nn.Module):
    """windows [B, window, F] -> predicted forward return [B], with an LSTM or GRU ``cell``."""

    def __init__(self, hp: RecurrentHParams, n_features: int, cell: type[nn.RNNBase] = nn.LSTM) -> None:
        super().__init__()
        width = hp.hidden_dim_base
        between = hp.dropout if hp.num_layers > 1 else 0.0
        self.rnn = cell(n_features, width, hp.num_layers, batch_first=True, dropout=between)
        self.head = nn.Sequential(nn.Dropout(hp.dropout), nn.Linear(width, 1))

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Predictions [B] from the output after the window's last row (row t)."""
        outputs, _ = self.rnn(windows)
        return self.head(outputs[:, -1]).squeeze(-1)


def build(hp: RecurrentHParams, n_features: int) -> RecurrentRegressor:
    """The LSTM regressor."""
    return RecurrentRegressor(hp, n_features, nn.LSTM)


SPEC = torch_model_spec("lstm", RecurrentHParams, search_space, build)
