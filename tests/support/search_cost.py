"""A search space probed without Optuna, and a hyperopt trial's analytic cost (test and benchmark support).

`declared`, `corners` and `random_trials` read a model's search space through `ProbeTrial`, a stand-in for
`optuna.Trial`. What differs per model comes from the model's own file, its spec's `ModelProfile`
(`marketrl.loop.profile`): the cost-driving `bounds` (whose ends are the corners) and `trial_cost`, a trial's work
in multiply-adds, up to a constant, fitted to the figures of bench/speed/hyperopt_cost.py (which measures every
corner and reports how this proxy correlates with the CPU seconds) and bounded by tests/test_search_space_bounds.py.
Every function takes a registered model's name or a spec (e.g. of a model registered by config); nothing here
names a model.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from marketrl.loop.profile import ModelProfile, TrialSizes

__all__ = [
    "MAX_RATIO",
    "Param",
    "ProbeTrial",
    "TrialSizes",
    "corners",
    "cost_drivers",
    "cost_proxy",
    "declared",
    "profile_of",
    "random_trials",
    "search_space_of",
    "spec_of",
    "worst_corner_ratio",
]

#: No corner of a search space may cost more than this many median trials (tests/test_search_space_bounds.py).
MAX_RATIO = 4.0


# ------------------------------------------------------------------------------------------ probing a space


@dataclass(frozen=True)
class Param:
    """One parameter as the space declares it: a range (int or float, maybe log) or numeric choices."""

    name: str
    kind: str  # "int" | "float" | "categorical"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[Any, ...] = ()

    def extremes(self) -> tuple[Any, Any]:
        """(lowest, highest) value the space allows."""
        if self.kind == "categorical":
            return min(self.choices), max(self.choices)
        return self.low, self.high

    def middle(self) -> Any:
        """A value in the middle of the range (geometric for log ranges), or the middle choice."""
        if self.kind == "categorical":
            return sorted(self.choices)[len(self.choices) // 2]
        mid = math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2
        return round(mid) if self.kind == "int" else mid

    def sample(self, rng: np.random.Generator) -> Any:
        """A random value, as Optuna's random sampler draws it (log-uniform for log ranges)."""
        if self.kind == "categorical":
            return self.choices[int(rng.integers(len(self.choices)))]
        if self.kind == "int":
            if self.log:
                return round(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
            return int(rng.integers(self.low, self.high + 1))
        if self.log:
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return float(rng.uniform(self.low, self.high))


class ProbeTrial:
    """A stand-in for `optuna.Trial`: records every parameter the space declares and answers with
    ``values[name]`` where given, else with `Param.middle` (the `marketrl.models.base.Trial` protocol)."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self.values = dict(values or {})
        self.params: dict[str, Param] = {}

    def _answer(self, param: Param) -> Any:
        self.params[param.name] = param
        return self.values.get(param.name, param.middle())

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return self._answer(Param(name, "int", low, high, log))

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float:
        return self._answer(Param(name, "float", low, high, log))

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self._answer(Param(name, "categorical", choices=tuple(choices)))


SpaceFn = Callable[[Any], dict[str, Any]]


def declared(space: SpaceFn) -> dict[str, Param]:
    """Every parameter of a (static) search space with its declared range."""
    probe = ProbeTrial()
    space(probe)
    return probe.params


def corners(space: SpaceFn, drivers: tuple[str, ...]) -> list[dict[str, Any]]:
    """The hyperparameters of every corner: each driver at its low or high extreme, the rest at the middle."""
    params = declared(space)
    missing = [name for name in drivers if name not in params]
    if missing:
        raise KeyError(f"cost drivers {missing} are not in the space ({', '.join(params)})")
    out = []
    for values in itertools.product(*(sorted(set(params[name].extremes())) for name in drivers)):
        out.append(space(ProbeTrial(dict(zip(drivers, values, strict=True)))))
    return out


def random_trials(space: SpaceFn, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` random draws from the whole space."""
    params = declared(space)
    rng = np.random.default_rng(seed)
    return [space(ProbeTrial({name: p.sample(rng) for name, p in params.items()})) for _ in range(n)]


# ------------------------------------------------------------------------------------------- a model's profile


def spec_of(model: str | Any) -> Any:
    """The spec of a registered model's name, or the spec itself."""
    if isinstance(model, str):
        from marketrl.training.zoo import ZOO

        return ZOO[model].spec
    return model


def profile_of(model: str | Any) -> ModelProfile:
    """The `ModelProfile` a model's spec carries (every registered model has one)."""
    spec = spec_of(model)
    if spec.profile is None:
        raise ValueError(f"{spec.name}: its spec has no profile (marketrl.loop.profile.ModelProfile)")
    return spec.profile


def search_space_of(model: str | Any) -> SpaceFn:
    """The model's space as hyperopt samples it; an agent's batch sizes within its widest bounds (any device)."""
    spec = spec_of(model)
    batch_limits = getattr(spec, "batch_limits", None)
    if batch_limits is not None:  # an AgentSpec: search_space(trial, batch_bounds)
        return lambda trial: spec.search_space(trial, batch_limits)
    return spec.search_space


def cost_drivers(model: str | Any) -> tuple[str, ...]:
    """The parameters whose value changes what a trial computes at a fixed step budget (the others, learning
    rates, discounts, coefficients, regularization, change the numbers but not the work): its profile's bounds."""
    return profile_of(model).cost_drivers


def cost_proxy(model: str | Any, hp: Mapping[str, Any], sizes: TrialSizes | None = None) -> float:
    """A trial's work in multiply-adds, up to a constant: the model's `ModelProfile.trial_cost` (default sizes:
    `TrialSizes()`, config.yaml's budgets on the bench's data)."""
    return profile_of(model).trial_cost(hp, sizes or TrialSizes())


def worst_corner_ratio(
    model: str | Any, sizes: TrialSizes, space: SpaceFn | None = None
) -> tuple[float, dict[str, Any]]:
    """The largest `cost_proxy` over the corners of the space (default: the model's own) / its median over 2001
    random draws, and that corner's hyperparameters."""
    space = space or search_space_of(model)
    median = statistics.median(cost_proxy(model, hp, sizes) for hp in random_trials(space, 2001, seed=1))
    worst = max(corners(space, cost_drivers(model)), key=lambda hp: cost_proxy(model, hp, sizes))
    return cost_proxy(model, worst, sizes) / median, worst
