"""GRU over the lookback window: the LSTM model of lstm.py with a GRU cell (same hyperparameters and space)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from marketrl.models import lstm
from marketrl.models.lstm import RecurrentHParams, RecurrentRegressor, search_space
from marketrl.models.supervised_trainer import torch_model_spec, torch_trial_cost

__all__ = ["PROFILE", "SPEC", "build"]


def build(hp: RecurrentHParams, n_features: int) -> RecurrentRegressor:
    """The GRU regressor."""
    return RecurrentRegressor(hp, n_features, "gru")


def multiply_adds(hp: Mapping[str, Any], n_features: int) -> int:
    """One sample's forward pass: the LSTM's with three gates instead of four."""
    return lstm.multiply_adds(hp, n_features, gates=3)


#: The LSTM's profile (same space and bounds) with the GRU's trial cost and docs row.
PROFILE = dataclasses.replace(
    lstm.PROFILE,
    trial_cost=torch_trial_cost(multiply_adds, sequence=True),
    summary="the same with a GRU cell (`lstm.RecurrentRegressor`)",
)
SPEC = torch_model_spec("gru", RecurrentHParams, search_space, build, PROFILE)
