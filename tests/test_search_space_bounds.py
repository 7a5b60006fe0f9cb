"""Every model's search space keeps a hyperopt trial's cost within 4x of its median trial (issue 24, part 3).

The ranges of the parameters that drive a trial's cost at a fixed step budget are pinned here where
`bench/hyperopt_cost.py` measured every corner of the space within 4x of the median trial (docs/HYPEROPT.md,
docs/PERFORMANCE.md). The bench's analytic `cost_proxy` (which it reports correlating with the measured CPU
seconds) must stay within 4x of its median over the space at every corner, with the budgets of config.yaml, so a
wider range or a larger budget that breaks the bound fails here before a study takes longer than planned.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import pytest

from bench.hyperopt_cost import COST_DRIVERS, Sizes, corners, cost_proxy, declared, random_trials
from marketrl.training.zoo import ZOO, AgentEntry
from marketrl.workflow.config import load_config
from tests.conftest import REPO_ROOT

#: (lowest, highest) value each cost-driving parameter may take.
BOUNDS: dict[str, dict[str, tuple[float, float]]] = {
    "dqn": {"hidden_dim_base": (64, 512), "batch_size": (64, 512), "gradient_steps": (1, 4)},
    "ppo": {
        "hidden_dim_base": (64, 256),
        "n_steps": (32, 128),
        "n_epochs": (2, 8),
        "batch_size": (256, 2048),
    },
    "linear": {"window": (2, 16)},
    "lightgbm": {
        "window": (1, 8),
        "n_estimators": (50, 1000),  # capped at hyperopt.trial_updates rounds in a trial
        "num_leaves": (4, 32),
        "feature_fraction": (0.3, 1.0),
        "bagging_fraction": (0.5, 1.0),
    },
    "mlp": {"window": (2, 8), "hidden_dim_base": (16, 128), "batch_size": (128, 1024)},
    "lstm": {"window": (2, 8), "hidden_dim_base": (16, 32), "batch_size": (128, 1024), "num_layers": (1, 2)},
    "gru": {"window": (2, 8), "hidden_dim_base": (16, 32), "batch_size": (128, 1024), "num_layers": (1, 2)},
    "alstm": {"window": (2, 8), "hidden_dim_base": (16, 32), "batch_size": (128, 1024)},
    "tcn": {
        "window": (2, 8),
        "hidden_dim_base": (16, 32),
        "batch_size": (128, 1024),
        "kernel_size": (2, 2),
        "levels": (1, 2),
    },
    "transformer": {
        "window": (2, 8),
        "hidden_dim_base": (16, 32),
        "batch_size": (128, 1024),
        "n_heads": (1, 4),
        "n_layers": (1, 1),
    },
    "dlinear": {
        "window": (2, 8),
        "hidden_dim_base": (16, 64),
        "batch_size": (128, 1024),
        "kernel_size": (3, 15),
    },
}
MAX_RATIO = 4.0


def space_of(name: str) -> Callable[[Any], dict[str, Any]]:
    """The model's space as hyperopt samples it; an agent's batch sizes within its widest bounds (any device)."""
    entry = ZOO[name]
    if isinstance(entry, AgentEntry):
        return lambda trial: entry.spec.search_space(trial, entry.spec.batch_limits)
    return entry.spec.search_space


def run_sizes() -> Sizes:
    """`Sizes` with config.yaml's budgets (the demo's tuning-window rows are the bench's)."""
    config = load_config(REPO_ROOT / "config.yaml")
    return Sizes(
        trial_steps=config["hyperopt"]["trial_steps"],
        trial_updates=config["hyperopt"]["trial_updates"],
        epochs=config["training"]["epochs"],
        n_envs=config["training"]["n_envs"],
    )


def worst_corner_ratio(name: str, space: Callable[[Any], dict[str, Any]], sizes: Sizes) -> tuple[float, dict]:
    """The largest cost_proxy over the corners / its median over 2001 random draws of the space."""
    median = statistics.median(cost_proxy(name, hp, sizes) for hp in random_trials(space, 2001, seed=1))
    worst = max(corners(space, COST_DRIVERS[name]), key=lambda hp: cost_proxy(name, hp, sizes))
    return cost_proxy(name, worst, sizes) / median, worst


def test_every_model_is_bounded() -> None:
    assert set(BOUNDS) == set(ZOO) == set(COST_DRIVERS)


@pytest.mark.parametrize("name", list(ZOO))
def test_cost_driving_ranges_are_pinned(name: str) -> None:
    params = declared(space_of(name))
    assert set(COST_DRIVERS[name]) <= set(BOUNDS[name]), name  # every driver is pinned
    for param, expected in BOUNDS[name].items():
        assert params[param].extremes() == expected, f"{name}.{param}: {params[param].extremes()}"
    neural = isinstance(ZOO[name], AgentEntry) or ZOO[name].spec.neural
    assert ("hidden_dim_base" in params) == neural, name  # every neural space still tunes its width


@pytest.mark.parametrize("name", list(ZOO))
def test_no_corner_costs_more_than_four_median_trials(name: str) -> None:
    ratio, worst = worst_corner_ratio(name, space_of(name), run_sizes())
    assert ratio <= MAX_RATIO, f"{name}: corner {worst} costs {ratio:.2f}x the median trial (proxy)"


def test_the_bound_fails_an_unbounded_space() -> None:
    """The LSTM space before the bound (window 1-32, widths 16-128): its largest corner is far above 4x (28x)."""

    def unbounded(trial: Any) -> dict[str, Any]:
        return {
            "window": trial.suggest_int("window", 1, 32, log=True),
            "hidden_dim_base": trial.suggest_categorical("hidden_dim_base", [16, 32, 64, 128]),
            "batch_size": trial.suggest_categorical("batch_size", [128, 256, 512, 1024]),
            "num_layers": trial.suggest_int("num_layers", 1, 2),
        }

    ratio, worst = worst_corner_ratio("lstm", unbounded, run_sizes())
    assert ratio > 5 * MAX_RATIO
    assert (worst["window"], worst["hidden_dim_base"], worst["num_layers"]) == (32, 128, 2)
