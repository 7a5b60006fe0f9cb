"""From a predicted forward return to a target position: a cost-aware threshold with an optional hold band.

At the close of row t, with prediction p_t and round-trip cost c_t = 2 x (cost fraction of one side at close_t,
the price known at t, from the run settings' cost model):
  * |p_t| > multiplier x c_t                      -> enter (or stay) sign(p_t)
  * hold band: band x threshold < |p_t| <= threshold and the position held into t is sign(p_t) -> keep it
  * otherwise                                     -> flat
hold_band = 1 switches the band off. Each chain starts flat and a position held into a roll carries on (as in
`position_results`); the last row of a chain (no decision) is flat. Vectorized: a band row keeps its position
exactly when an unbroken run of same-sign band rows leads back to an entry row, found with one cumulative max,
so no loop over time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from marketrl.env import MarketData
from marketrl.instruments.costs import CostModel, Costs

__all__ = ["FORECASTER_HOW_TO_USE", "TradingRule", "cost_model", "round_trip_cost"]


#: export.json's ``how_to_use`` of a forecaster: its predictor and this trading rule (`marketrl.training.export`)
FORECASTER_HOW_TO_USE = (
    "Normalize each raw feature row with `normalizer` (columns in `feature_names` order). For bar t with a full "
    "window (rows t-window+1..t of the same session, oldest first) the model maps windows [B, window, F] to the "
    "predicted forward return p_t over `trading_rule.horizon` bars; bars without a full window get p_t = 0. "
    "Position rule at the close of bar t: threshold_t = threshold_multiplier * round-trip cost fraction at close_t "
    "(`trading_rule.round_trip_cost`); |p_t| > threshold_t -> sign(p_t); else if |p_t| > hold_band * threshold_t "
    "and the position held into t equals sign(p_t) -> keep it; else flat. Start each session flat. Positions are "
    "unit positions in {-1, 0, 1}; multiply by `observation.contracts` for contracts."
)


def cost_model(costs: Mapping[str, Any]) -> Costs:
    """A CostModel from a `costs` config slice (`model: futures | bps`, as in config.yaml) or CostModel fields
    (`kind: ...`); an InstrumentCosts where the slice has `costs.instruments` (`round_trip_cost` refuses it)."""
    if "kind" in costs:
        return CostModel.from_config(costs)
    from marketrl.splits.datasets import cost_model_from_config  # polars is needed only there

    return cost_model_from_config(costs)


def round_trip_cost(data: MarketData, costs: Costs | None = None) -> torch.Tensor:
    """[T] round-trip cost as a return fraction at close_t (entering and leaving one contract): from ``costs`` at
    the close prices, or, without it, the data's own per-row cost fractions (the run's cost model, per symbol)."""
    if costs is None:
        return 2.0 * data.cost_close
    if not isinstance(costs, CostModel):  # InstrumentCosts: a spec per symbol root, which MarketData applied
        raise ValueError(
            "costs: a per-instrument cost model (costs.instruments) has no single cost fraction; leave the run "
            "settings' costs empty so the trading rule uses the data's per-row cost fractions"
        )
    return (2.0 * costs.cost_fraction(data.close)).to(torch.float32)


@dataclass(frozen=True)
class TradingRule:
    """threshold = multiplier x round-trip cost; keep a position while |prediction| > band x threshold."""

    threshold_multiplier: float = 1.0
    hold_band: float = 1.0

    def __post_init__(self) -> None:
        if not self.threshold_multiplier >= 0:
            raise ValueError(f"threshold_multiplier: expected >= 0, got {self.threshold_multiplier!r}")
        if not 0 < self.hold_band <= 1:
            raise ValueError(f"hold_band: expected a number in (0, 1], got {self.hold_band!r}")

    def positions(
        self, predictions: torch.Tensor, data: MarketData, costs: Costs | None = None
    ) -> torch.Tensor:
        """Target positions [T] float32 in {-1, 0, 1} on the data's device (costs: see `round_trip_cost`)."""
        threshold = self.threshold_multiplier * round_trip_cost(data, costs)
        strength = predictions.abs()
        direction = torch.sign(predictions)
        entry = strength > threshold
        band = ~entry & (strength > self.hold_band * threshold) & (direction != 0)
        rows = torch.arange(data.n_rows, device=data.device)
        starts_chain = rows == data.chain_start
        previous_direction = torch.cat([direction.new_zeros(1), direction[:-1]])
        # A band row continues the run of the row before it when it has the same sign in the same chain.
        continues = band & ~starts_chain & (direction == previous_direction)
        run_start = torch.cummax(torch.where(continues, torch.zeros_like(rows), rows), dim=0).values
        held = entry | (band & entry.index_select(0, run_start) & (run_start != rows))
        target = torch.where(held, direction, torch.zeros_like(direction))
        return torch.where(data.is_decision, target, torch.zeros_like(target)).to(torch.float32)
