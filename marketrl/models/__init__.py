"""The supervised model zoo: forecasters of the forward return behind one protocol (docs/MODELS.md).

`MODELS[name]` is a `ModelSpec` (hyperparameter dataclass, search space, train, load): every entry of the model
registry (`marketrl.settings.registry.REGISTRY`) whose spec lives in this package. A trained model's file is
written and read by its spec's one save/load pair by path (`ModelSpec.save`, `ModelSpec.load_path`, as for every
model); `save_model` / `load_model` are the same format for the callers that hold a bare `TrainedModel` or path
(plain data, `torch.load(weights_only=True)`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from marketrl.models.base import (
    ModelSpec,
    RunSettings,
    TrainedModel,
    TrainHooks,
    check_checkpoint,
    save_model,
)
from marketrl.settings.registry import REGISTRY, load_spec, names_under

__all__ = [
    "MODELS",
    "ModelSpec",
    "RunSettings",
    "TrainHooks",
    "TrainedModel",
    "get_model",
    "load_model",
    "model_from_checkpoint",
    "save_model",
]

MODELS: dict[str, ModelSpec] = {name: load_spec(REGISTRY[name]) for name in names_under(__name__)}


def get_model(name: str) -> ModelSpec:
    """The registry entry, or a one-line error naming the known models."""
    if name not in MODELS:
        raise KeyError(f"training.models: unknown model {name!r} (known: {', '.join(MODELS)})")
    return MODELS[name]


def model_from_checkpoint(
    checkpoint: Mapping[str, Any], device: torch.device | str = "cpu", spec: ModelSpec | None = None
) -> TrainedModel:
    """Rebuild a trained model from a checkpoint dict (as `TrainedModel.checkpoint` makes it), with ``spec``
    (default: the model of this package its ``model`` names)."""
    check_checkpoint(checkpoint)
    return (spec or get_model(str(checkpoint["model"]))).load(checkpoint, device)


def load_model(path: str | os.PathLike[str], device: torch.device | str = "cpu") -> TrainedModel:
    """Load a checkpoint file with `torch.load(weights_only=True)` and rebuild the model on ``device``."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return model_from_checkpoint(checkpoint, device)
