"""Attention LSTM: a tanh input projection, an LSTM over the window, attention pooling over its outputs; the
pooled context and the last output (row t) feed the head.

The attention weights are a softmax over the window's own rows (t-window+1..t), so it never sees later bars.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from marketrl.loop.profile import ModelProfile
from marketrl.models.base import NeuralHParams, Trial, sequence_space, zero_head
from marketrl.models.lstm import Recurrent
from marketrl.models.supervised_trainer import SMALL_HPARAMS, torch_model_spec, torch_trial_cost

__all__ = ["ALSTM", "PROFILE", "SPEC", "ALSTMHParams", "search_space"]


@dataclass(frozen=True)
class ALSTMHParams(NeuralHParams):
    """The shared neural hyperparameters (hidden size = hidden_dim_base, attention width = half of it)."""

    window: int = 16


def search_space(trial: Trial) -> dict[str, Any]:
    """`sequence_space` (bounded window and width)."""
    return sequence_space(trial)


class ALSTM(nn.Module):
    """windows [B, window, F] -> predicted forward return [B]."""

    def __init__(self, hp: ALSTMHParams, n_features: int) -> None:
        super().__init__()
        width = hp.hidden_dim_base
        self.project = nn.Sequential(nn.Linear(n_features, width), nn.Tanh())
        self.rnn = Recurrent("lstm", width, width)
        self.score = nn.Sequential(
            nn.Linear(width, width // 2), nn.Tanh(), nn.Linear(width // 2, 1, bias=False)
        )
        self.head = nn.Sequential(nn.Dropout(hp.dropout), zero_head(nn.Linear(2 * width, 1)))

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Predictions [B]."""
        outputs = self.rnn(self.project(windows))
        weights = torch.softmax(self.score(outputs).float(), dim=1).to(outputs.dtype)  # [B, window, 1]
        context = (weights * outputs).sum(dim=1)
        return self.head(torch.cat([context, outputs[:, -1]], dim=1)).squeeze(-1)


def multiply_adds(hp: Mapping[str, Any], n_features: int) -> int:
    """One sample's forward pass: projection, LSTM and attention over each row of the window."""
    width = hp["hidden_dim_base"]
    return hp["window"] * (n_features * width + 4 * width * 2 * width + width * width // 2)


#: Its cost-driving bounds and trial cost, small test sizes and docs row (`marketrl.loop.profile`).
PROFILE = ModelProfile(
    bounds={"window": (2, 8), "hidden_dim_base": (16, 32), "batch_size": (128, 1024)},
    trial_cost=torch_trial_cost(multiply_adds, sequence=True),
    small=SMALL_HPARAMS,
    summary=(
        "tanh projection to `b` → LSTM → attention pooling (`b → b/2 → 1`, softmax over the window) → "
        "[context, last output] → linear"
    ),
    own_hyperparameters="window 2…8, `b` {16, 32}",
)
SPEC = torch_model_spec("alstm", ALSTMHParams, search_space, ALSTM, PROFILE)
