"""GRU over the lookback window: the LSTM model of lstm.py with a GRU cell (same hyperparameters and space)."""

from __future__ import annotations

from marketrl.models.lstm import RecurrentHParams, RecurrentRegressor, search_space
from marketrl.models.supervised_trainer import torch_model_spec

__all__ = ["SPEC", "build"]


def build(hp: RecurrentHParams, n_features: int) -> RecurrentRegressor:
    """The GRU regressor."""
    return RecurrentRegressor(hp, n_features, "gru")


SPEC = torch_model_spec("gru", RecurrentHParams, search_space, build)
