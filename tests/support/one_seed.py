"""One seed through a model's only training entry, ``train_seeds``: the tests' shorthand for a batch of one.

`train_forecaster(spec, train, validation, settings, hparams, precision, device, seed, hooks)` calls
``spec.train_seeds(..., [seed], hooks)`` with ``hooks.on_validation(step, model) -> score`` taken per model;
`train_agent(trainer, train, run_config, hparams, precision, device, seed, on_eval=, checkpoint=)` calls
``trainer.train_seeds(..., [seed], on_eval=, checkpoint=)`` (``trainer``: an agent module or its `AgentSpec`)
with ``on_eval(step, policy) -> score`` taken per policy. Both return the one result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from marketrl.models.base import TrainHooks

__all__ = ["train_agent", "train_forecaster"]


def train_forecaster(
    spec: Any,
    train_data: Any,
    validation_data: Any,
    settings: Any,
    hparams: Mapping[str, Any] | None,
    precision: Any = "fp32",
    device: Any = "cpu",
    seed: int = 0,
    hooks: TrainHooks | None = None,
) -> Any:
    """The one model of ``spec.train_seeds`` with ``[seed]``."""
    if hooks is not None and hooks.on_validation is not None:
        single = hooks.on_validation
        hooks = dataclasses.replace(hooks, on_validation=lambda step, models: [single(step, models[0])])
    return spec.train_seeds(train_data, validation_data, settings, hparams, precision, device, [seed], hooks)[
        0
    ]


def train_agent(
    trainer: Any,
    train_data: Any,
    run_config: Any,
    hparams: Mapping[str, Any] | None,
    precision: Any = "fp32",
    device: Any = "cpu",
    seed: int = 0,
    on_eval: Callable[[int, Any], float] | None = None,
    checkpoint: Any = None,
) -> Any:
    """The one result of ``trainer.train_seeds`` with ``[seed]``."""
    on_evals = None if on_eval is None else (lambda step, policies: [on_eval(step, policies[0])])
    return trainer.train_seeds(
        train_data, run_config, hparams, precision, device, [seed], on_eval=on_evals, checkpoint=checkpoint
    )[0]
