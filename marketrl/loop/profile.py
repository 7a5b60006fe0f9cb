"""A model's profile: what the tests, the benchmarks and the docs read of a model, declared in the model's own file
(its `ModelSpec` or `AgentSpec` carries it as ``profile``), so that a new model is its file plus one registry line
(docs/ARCHITECTURE.md, "Adding a model"). Nothing outside the model's file lists these per model: the tests, the
bench and the docs table derive theirs from the registry's specs.

    bounds              the range of each hyperparameter that drives a hyperopt trial's cost at a fixed step
                        budget, as the search space declares it (lowest, highest); tests/test_search_space_bounds.py
                        checks the space against it, so widening a cost-driving range is a deliberate edit of both.
                        Every combination of their ends is a corner of that test and of bench/speed/hyperopt_cost.py
                        (`cost_drivers`: the bounds whose ends differ)
    trial_cost          ``trial_cost(hparams, sizes) -> float``: a trial's work in multiply-adds, up to a constant,
                        at the run's `TrialSizes` (the analytic proxy the bench correlates with measured CPU seconds,
                        which the test bounds within 4x of the median trial at every corner)
    small               hyperparameters small enough for the per-model unit tests (tests/test_models.py)
    summary             what the model is, and
    own_hyperparameters its own hyperparameters and ranges: its row of docs/MODELS.md, "The models" (`models_table`)

Plain data and functions, torch-free: nothing here runs a model.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "MODELS_TABLE_HEADER",
    "ModelProfile",
    "Profiled",
    "TrialCost",
    "TrialSizes",
    "dense_weights",
    "models_table",
]


@dataclass(frozen=True)
class TrialSizes:
    """What a hyperopt trial's work depends on besides its hyperparameters: the budget, the data and the env
    (defaults: config.yaml's budgets on the demo's default tuning window, the bench's data)."""

    trial_steps: int = 15_000  # hyperopt.trial_steps (agents' env steps)
    trial_updates: int = 150  # hyperopt.trial_updates (forecasters' optimizer steps / boosting rounds)
    epochs: int = 2  # training.epochs (forecasters' passes, capped by trial_updates)
    n_envs: int = 64  # training.n_envs
    train_rows: int = 21_418  # tuning train rows (8 demo days, 2 instruments)
    validation_rows: int = 13_099  # tuning validation rows (4 demo days)
    features: int = 51
    obs_dim: int = 52  # features x env.window + position
    learning_starts: int = 1_000  # DQN default (env steps before the first gradient step)


#: trial_cost(hparams, sizes) -> a trial's work in multiply-adds, up to a constant
TrialCost = Callable[[Mapping[str, Any], TrialSizes], float]


@dataclass(frozen=True)
class ModelProfile:
    """What tests, benchmarks and docs read of one model (see the module docstring)."""

    bounds: Mapping[str, tuple[float, float]]
    trial_cost: TrialCost
    small: Mapping[str, Any] = field(default_factory=dict)
    summary: str = ""
    own_hyperparameters: str = ""

    @property
    def cost_drivers(self) -> tuple[str, ...]:
        """The parameters whose corners the bench and the bound test visit: those of ``bounds`` whose ends differ
        (a bound with one value pins a structural choice, e.g. a fixed kernel size)."""
        return tuple(name for name, (low, high) in self.bounds.items() if low != high)


def dense_weights(widths: list[int]) -> int:
    """Weights of a stack of dense layers of these widths (input first), biases left out."""
    return sum(a * b for a, b in itertools.pairwise(widths))


class Profiled(Protocol):
    """A model spec (`ModelSpec`, `AgentSpec`): it carries its profile."""

    @property
    def profile(self) -> ModelProfile | None: ...


MODELS_TABLE_HEADER = "| model | what it is | own hyperparameters (search space) |\n|---|---|---|"


def models_table(specs: Mapping[str, Profiled]) -> str:
    """The markdown table of docs/MODELS.md, "The models" (``models_table(marketrl.models.MODELS)``): one row per
    model, in the order given (the registry's), from each profile's ``summary`` and ``own_hyperparameters``."""
    rows = []
    for name, spec in specs.items():
        if spec.profile is None:
            raise ValueError(f"{name}: its spec has no profile (marketrl.loop.profile.ModelProfile)")
        rows.append(f"| `{name}` | {spec.profile.summary} | {spec.profile.own_hyperparameters or '—'} |")
    return "\n".join([MODELS_TABLE_HEADER, *rows])
