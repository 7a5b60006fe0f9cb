"""The supervised model zoo: forecasters of the forward return behind one protocol (docs/MODELS.md).

`MODELS[name]` is a `ModelSpec` (hyperparameter dataclass, search space, train, load): every entry of the model
registry (`marketrl.settings.registry.REGISTRY`) whose spec lives in this package. `save_model` / `load_model`
write and read a model checkpoint (plain data, `torch.load(weights_only=True)`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from marketrl.models.base import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    ModelSpec,
    RunSettings,
    TrainedModel,
    TrainHooks,
)
from marketrl.runtime.io import atomic_write
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


def save_model(path: str | os.PathLike[str], model: TrainedModel, **extra: Any) -> None:
    """Write the model's checkpoint dict atomically; ``extra`` is plain data (normalizer state, fold, seed...)."""
    with atomic_write(path) as tmp:
        torch.save(model.checkpoint(**extra), tmp)


def model_from_checkpoint(
    checkpoint: Mapping[str, Any], device: torch.device | str = "cpu", spec: ModelSpec | None = None
) -> TrainedModel:
    """Rebuild a trained model from a checkpoint dict (as `TrainedModel.checkpoint` makes it), with ``spec``
    (default: the model of this package its ``model`` names)."""
    if checkpoint.get("format") != CHECKPOINT_FORMAT or checkpoint.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint: expected format {CHECKPOINT_FORMAT!r} version {CHECKPOINT_VERSION}")
    return (spec or get_model(str(checkpoint["model"]))).load(checkpoint, device)


def load_model(path: str | os.PathLike[str], device: torch.device | str = "cpu") -> TrainedModel:
    """Load a checkpoint file with `torch.load(weights_only=True)` and rebuild the model on ``device``."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return model_from_checkpoint(checkpoint, device)
