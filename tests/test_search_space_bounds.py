"""Every model's search space keeps a hyperopt trial's cost within 4x of its median trial (issue 24, part 3).

The ranges of the parameters that drive a trial's cost at a fixed step budget are pinned in each model's own file
(its spec's `ModelProfile.bounds`, marketrl/loop/profile.py) where `bench/speed/hyperopt_cost.py` measured every
corner of the space within 4x of the median trial (docs/HYPEROPT.md, docs/PERFORMANCE.md); the space must declare
exactly those ranges. The profile's analytic `trial_cost` (which the bench reports correlating with the measured
CPU seconds) must stay within 4x of its median over the space at every corner, with the budgets of config.yaml, so
a wider range or a larger budget that breaks the bound fails here before a study takes longer than planned. The
models are the registry's; tests/test_registry.py runs the same checks on a model registered by config.
"""

from __future__ import annotations

from typing import Any

import pytest

from marketrl.settings.config import load_config
from marketrl.training.zoo import ZOO, AgentEntry
from tests.conftest import REPO_ROOT
from tests.support.search_cost import (
    MAX_RATIO,
    TrialSizes,
    declared,
    profile_of,
    search_space_of,
    worst_corner_ratio,
)


def run_sizes() -> TrialSizes:
    """`TrialSizes` with config.yaml's budgets (the demo's tuning-window rows are the bench's)."""
    config = load_config(REPO_ROOT / "config.yaml")
    return TrialSizes(
        trial_steps=config["hyperopt"]["trial_steps"],
        trial_updates=config["hyperopt"]["trial_updates"],
        epochs=config["training"]["epochs"],
        n_envs=config["training"]["n_envs"],
    )


def check_pinned_ranges(model: str | Any, neural: bool) -> None:
    """The space declares exactly the profile's bounds, and a neural space still tunes its width."""
    profile = profile_of(model)
    assert profile.bounds and callable(profile.trial_cost), model
    params = declared(search_space_of(model))
    for param, expected in profile.bounds.items():
        assert params[param].extremes() == expected, f"{model}.{param}: {params[param].extremes()}"
    assert ("hidden_dim_base" in params) == neural, model  # every neural space still tunes its width


def check_corners(model: str | Any) -> None:
    ratio, worst = worst_corner_ratio(model, run_sizes())
    assert ratio <= MAX_RATIO, f"{model}: corner {worst} costs {ratio:.2f}x the median trial (proxy)"


@pytest.mark.parametrize("name", list(ZOO))
def test_cost_driving_ranges_are_pinned(name: str) -> None:
    check_pinned_ranges(name, isinstance(ZOO[name], AgentEntry) or ZOO[name].spec.neural)


@pytest.mark.parametrize("name", list(ZOO))
def test_no_corner_costs_more_than_four_median_trials(name: str) -> None:
    check_corners(name)


def test_the_bound_fails_an_unbounded_space() -> None:
    """The LSTM space before the bound (window 1-32, widths 16-128): its largest corner is far above 4x (28x)."""

    def unbounded(trial: Any) -> dict[str, Any]:
        return {
            "window": trial.suggest_int("window", 1, 32, log=True),
            "hidden_dim_base": trial.suggest_categorical("hidden_dim_base", [16, 32, 64, 128]),
            "batch_size": trial.suggest_categorical("batch_size", [128, 256, 512, 1024]),
            "num_layers": trial.suggest_int("num_layers", 1, 2),
        }

    ratio, worst = worst_corner_ratio("lstm", run_sizes(), unbounded)
    assert ratio > 5 * MAX_RATIO
    assert (worst["window"], worst["hidden_dim_base"], worst["num_layers"]) == (32, 128, 2)
