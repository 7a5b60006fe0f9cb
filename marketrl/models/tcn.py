"""Temporal convolutional network: residual blocks of causal dilated 1-d convolutions (dilation 2^level) over
the window; the channels at the window's last row feed a linear head.

Causal: each convolution is padded on the left only, so the output at a row sees that row and earlier ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from marketrl.loop.hparams import check_ranges
from marketrl.loop.profile import ModelProfile
from marketrl.models.base import NeuralHParams, Trial, sequence_space, zero_head
from marketrl.models.supervised_trainer import SMALL_HPARAMS, torch_model_spec, torch_trial_cost

__all__ = ["PROFILE", "SPEC", "TCN", "TCNHParams", "search_space"]


@dataclass(frozen=True)
class TCNHParams(NeuralHParams):
    """Shared neural hyperparameters (channels = hidden_dim_base) plus kernel size and number of levels."""

    window: int = 16
    kernel_size: int = 3
    levels: int = 2

    def validate(self) -> None:
        """Ranges."""
        super().validate()
        check_ranges(self, at_least_one=("levels",))
        check_ranges(self, at_least_one=("kernel_size",))


def search_space(trial: Trial) -> dict[str, Any]:
    """`sequence_space` (bounded window and width) plus the depth; kernel 2, whose two levels (dilations 1, 2)
    see 7 rows, nearly the longest window (8). Kernels 3-5 and a third level multiplied the cost of a step
    (bench/speed/hyperopt_cost.py) and reached rows beyond the window."""
    # one choice, still suggested: the study's best_params (what training reads) then carry it
    return {
        **sequence_space(trial),
        "kernel_size": trial.suggest_categorical("kernel_size", [2]),
        "levels": trial.suggest_int("levels", 1, 2),
    }


class CausalBlock(nn.Module):
    """Two causal dilated convolutions with ReLU and dropout, plus a residual (1x1 when widths differ)."""

    def __init__(
        self, in_channels: int, channels: int, kernel_size: int, dilation: int, dropout: float
    ) -> None:
        super().__init__()
        self.left_pad = (kernel_size - 1) * dilation
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size, dilation=dilation)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size, dilation=dilation)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout)
        self.skip = nn.Conv1d(in_channels, channels, 1) if in_channels != channels else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C_in, window] -> [B, C, window]."""
        h = self.drop(self.act(self.conv1(nn.functional.pad(x, (self.left_pad, 0)))))
        h = self.drop(self.act(self.conv2(nn.functional.pad(h, (self.left_pad, 0)))))
        return self.act(h + self.skip(x))


class TCN(nn.Module):
    """windows [B, window, F] -> predicted forward return [B]."""

    def __init__(self, hp: TCNHParams, n_features: int) -> None:
        super().__init__()
        width = hp.hidden_dim_base
        self.blocks = nn.Sequential(
            *(
                CausalBlock(n_features if level == 0 else width, width, hp.kernel_size, 2**level, hp.dropout)
                for level in range(hp.levels)
            )
        )
        self.head = zero_head(nn.Linear(width, 1))

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Predictions [B] from the channels at the last row."""
        return self.head(self.blocks(windows.transpose(1, 2))[:, :, -1]).squeeze(-1)


def multiply_adds(hp: Mapping[str, Any], n_features: int) -> int:
    """One sample's forward pass, at each row: the features into `b` channels (the first block's skip), and two
    convolutions per level."""
    width = hp["hidden_dim_base"]
    return hp["window"] * (n_features * width + 2 * hp["levels"] * hp["kernel_size"] * width * width)


#: Its cost-driving bounds and trial cost, small test sizes and docs row (`marketrl.loop.profile`).
PROFILE = ModelProfile(
    bounds={
        "window": (2, 8),
        "hidden_dim_base": (16, 32),
        "batch_size": (128, 1024),
        "kernel_size": (2, 2),
        "levels": (1, 2),
    },
    trial_cost=torch_trial_cost(multiply_adds, sequence=True),
    small=SMALL_HPARAMS,
    summary=(
        "residual blocks of two causal dilated Conv1d (`b` channels, dilation 2^level, left padding only)"
        " → channels at row t → linear"
    ),
    own_hyperparameters="`kernel_size` 2 (fixed), `levels` 1…2; window 2…8, `b` {16, 32}",
)
SPEC = torch_model_spec("tcn", TCNHParams, search_space, TCN, PROFILE)
