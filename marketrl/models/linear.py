"""Ridge regression of the forward return on the flattened lookback window, solved in closed form (float64).

The intercept is not penalized (features and target are centred first); ``alpha`` is the penalty per training
row, so its meaning does not change with the size of the split. One solve, no iterations: ``settings`` budgets
and cadences do not apply, the checkpoint hook is not used (nothing to resume), and ``on_validation`` is called
once with the fitted model. Deterministic: every seed gives the same fit, so `train_seeds` fits once and returns
a list of one model (``SPEC.deterministic``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from marketrl.env import MarketData
from marketrl.loop.hparams import check_ranges, parse_hparams
from marketrl.loop.profile import ModelProfile, TrialSizes
from marketrl.models.base import (
    FORECASTER_TRIAL_OVERHEAD,
    CommonHParams,
    ModelSpec,
    Predictor,
    RunSettings,
    TrainedModel,
    TrainHooks,
    Trial,
    common_space,
    distinct_seeds,
)
from marketrl.models.supervised_data import SupervisedRows, training_rows

__all__ = ["PROFILE", "SPEC", "RidgeHParams", "fit_ridge", "search_space"]


@dataclass(frozen=True)
class RidgeHParams(CommonHParams):
    """Ridge hyperparameters: the shared window and trading rule, and the L2 penalty per row."""

    window: int = 4
    alpha: float = 1.0

    def validate(self) -> None:
        """Ranges."""
        super().validate()
        check_ranges(self, non_negative=("alpha",))


def search_space(trial: Trial) -> dict[str, Any]:
    """Window (2-16 rows: the normal equations cost window^2), trading rule and the log-uniform penalty."""
    return {
        **common_space(trial, 16, min_window=2),
        "alpha": trial.suggest_float("alpha", 1e-4, 1e2, log=True),
    }


def fit_ridge(rows: SupervisedRows, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [window·F], intercept []) in float64 from sums accumulated chunk by chunk on the device."""
    width = rows.window * rows.features.shape[1]
    device = rows.features.device
    sum_x = torch.zeros(width, dtype=torch.float64, device=device)
    sum_xx = torch.zeros(width, width, dtype=torch.float64, device=device)
    sum_y = torch.zeros((), dtype=torch.float64, device=device)
    sum_xy = torch.zeros(width, dtype=torch.float64, device=device)
    for part in rows.chunks():
        windows, target = rows.batch(part)
        x, y = windows.reshape(part.shape[0], width).double(), target.double()
        sum_x += x.sum(dim=0)
        sum_xx += x.T @ x
        sum_y += y.sum()
        sum_xy += x.T @ y
    n = rows.n_rows
    mean_x, mean_y = sum_x / n, sum_y / n
    scatter = sum_xx - n * torch.outer(mean_x, mean_x)
    cross = sum_xy - n * mean_x * mean_y
    eye = torch.eye(width, dtype=torch.float64, device=device)
    # A tiny floor keeps alpha = 0 solvable when two window columns are collinear.
    weights = torch.linalg.solve(scatter + (alpha * n + 1e-9 * n) * eye, cross)
    return weights, mean_y - mean_x @ weights


class RidgeModule(torch.nn.Module):
    """The fit as a torch module (export): windows [B, window, F] -> predictions [B] float32, computed in float64
    exactly as the predictor does."""

    def __init__(self, weights: torch.Tensor, intercept: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weights", weights.detach().double().cpu())
        self.register_buffer("intercept", intercept.detach().double().cpu())

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Predictions [B] float32."""
        flat = windows.reshape(windows.shape[0], -1).double()
        return (flat @ self.weights + self.intercept).float()


def _predictor(weights: torch.Tensor, intercept: torch.Tensor) -> Predictor:
    def predict(windows: torch.Tensor) -> torch.Tensor:
        flat = windows.reshape(windows.shape[0], -1).double()
        w, b = weights.to(windows.device), intercept.to(windows.device)
        return (flat @ w + b).float()

    return predict


def _trained(
    hp: RidgeHParams,
    n_features: int,
    weights: torch.Tensor,
    intercept: torch.Tensor,
    settings: dict[str, Any],
    log: dict[str, Any],
) -> TrainedModel:
    return TrainedModel(
        name="linear",
        hparams=dataclasses.asdict(hp),
        n_features=n_features,
        predictor=_predictor(weights, intercept),
        state={"weights": weights.cpu(), "intercept": intercept.cpu()},
        settings=settings,
        precision={"mode": "fp64"},
        log=log,
        module=RidgeModule(weights, intercept),
    )


def train_seeds(
    train_data: MarketData,
    validation_data: MarketData | None,
    settings: RunSettings,
    hparams: Mapping[str, Any] | None,
    precision: Any = "fp32",
    device: torch.device | str = "cpu",
    seeds: Sequence[int] = (0,),
    hooks: TrainHooks | None = None,
) -> list[TrainedModel]:
    """One ridge fit for all ``seeds`` (they cannot differ): a list of one model (``precision`` and the seeds do not
    apply: it is a float64 closed form); ``hooks.on_validation(1, [model]) -> [score]``."""
    distinct_seeds(seeds)
    hooks = hooks or TrainHooks()
    hp = parse_hparams(RidgeHParams, hparams, "linear")
    rows = training_rows(train_data.to(device), hp.window, settings.horizon, settings.max_train_rows)
    weights, intercept = fit_ridge(rows, hp.alpha)
    model = _trained(hp, train_data.n_features, weights, intercept, settings.to_dict(), {})
    record = {"step": 1, "train_rows": rows.n_rows}
    if hooks.log is not None:
        hooks.log(record)
    scores = hooks.on_validation(1, [model]) if hooks.on_validation is not None else None
    model.log = {
        "model": "linear",
        "steps": 1,
        "train_rows": rows.n_rows,
        "evals": [[1, None if scores is None else scores[0]]],
        "history": [record],
    }
    return [model]


def load(checkpoint: Mapping[str, Any], device: torch.device | str = "cpu") -> TrainedModel:
    """Rebuild the fitted model from its checkpoint dict."""
    hp = parse_hparams(RidgeHParams, checkpoint["hparams"], "linear")
    state = checkpoint["state"]
    weights, intercept = state["weights"].to(device), state["intercept"].to(device)
    return _trained(hp, int(checkpoint["n_features"]), weights, intercept, dict(checkpoint["settings"]), {})


def trial_cost(hp: Mapping[str, Any], s: TrialSizes) -> float:
    """A hyperopt trial's work (`ModelProfile.trial_cost`): the normal equations, rows x columns^2."""
    return FORECASTER_TRIAL_OVERHEAD + float(s.train_rows * (hp["window"] * s.features) ** 2)


#: Its cost-driving bounds and trial cost, small test sizes and docs row (`marketrl.loop.profile`).
PROFILE = ModelProfile(
    bounds={"window": (2, 16)},
    trial_cost=trial_cost,
    small={"window": 2},
    summary=(
        "ridge regression on the flattened window, closed form in float64 (centred, intercept unpenalized; "
        "`alpha` per training row)"
    ),
    own_hyperparameters="`alpha` 1e-4…1e2 log; window 2…16",
)
SPEC = ModelSpec(
    "linear",
    RidgeHParams,
    search_space,
    train_seeds,
    load,
    neural=False,
    deterministic=True,
    profile=PROFILE,
)
