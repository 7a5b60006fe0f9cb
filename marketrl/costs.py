"""Transaction-cost model: commission and half-spread slippage (futures) or basis points, per side.

Costs are expressed as a fraction of one contract's notional at the fill price, so that they subtract directly from
the per-bar simple returns the environment pays as rewards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch

CostKind = Literal["futures", "bps"]

_FUTURES_KEYS = ("commission_per_contract", "half_spread_ticks", "tick_size", "tick_value")
_ALLOWED_KEYS = {"kind", "bps", *_FUTURES_KEYS}


class CostConfigError(ValueError):
    """A `costs.*` configuration value is missing or invalid."""


@dataclass(frozen=True)
class CostModel:
    """Per-side transaction costs.

    futures: cost per contract per side = commission_per_contract + half_spread_ticks × tick_value (currency);
             one contract's notional = price × point value, with point value = tick_value / tick_size.
    bps:     cost per side = bps × 1e-4 of the traded notional.
    """

    kind: CostKind
    commission_per_contract: float = 0.0
    half_spread_ticks: float = 0.0
    tick_size: float = 0.0
    tick_value: float = 0.0
    bps: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("futures", "bps"):
            raise CostConfigError(f"costs.kind: expected 'futures' or 'bps', got {self.kind!r}")
        if self.kind == "futures":
            for key in ("tick_size", "tick_value"):
                _check_number(key, getattr(self, key), positive=True)
            for key in ("commission_per_contract", "half_spread_ticks"):
                _check_number(key, getattr(self, key), positive=False)
        else:
            _check_number("bps", self.bps, positive=False)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> CostModel:
        """Build from the `costs` config mapping; errors name the offending `costs.<key>`."""
        if not isinstance(config, Mapping):
            raise CostConfigError(f"costs: expected a mapping, got {type(config).__name__}")
        unknown = sorted(set(config) - _ALLOWED_KEYS)
        if unknown:
            raise CostConfigError(
                f"costs.{unknown[0]}: unknown key (allowed: {', '.join(sorted(_ALLOWED_KEYS))})"
            )
        if "kind" not in config:
            raise CostConfigError("costs.kind: missing (expected 'futures' or 'bps')")
        kind = config["kind"]
        if kind == "futures":
            missing = [key for key in ("tick_size", "tick_value") if key not in config]
            if missing:
                raise CostConfigError(f"costs.{missing[0]}: required when costs.kind is 'futures'")
            if "bps" in config:
                raise CostConfigError("costs.bps: only allowed when costs.kind is 'bps'")
            values = {key: config[key] for key in _FUTURES_KEYS if key in config}
        elif kind == "bps":
            if "bps" not in config:
                raise CostConfigError("costs.bps: required when costs.kind is 'bps'")
            extra = [key for key in _FUTURES_KEYS if key in config]
            if extra:
                raise CostConfigError(f"costs.{extra[0]}: only allowed when costs.kind is 'futures'")
            values = {"bps": config["bps"]}
        else:
            raise CostConfigError(f"costs.kind: expected 'futures' or 'bps', got {kind!r}")
        for key, value in values.items():
            _check_number(key, value, positive=key in ("tick_size", "tick_value"))
        return cls(kind=kind, **{key: float(value) for key, value in values.items()})

    def to_config(self) -> dict[str, Any]:
        """Inverse of `from_config` (only the keys relevant to `kind`)."""
        if self.kind == "bps":
            return {"kind": "bps", "bps": self.bps}
        return {"kind": "futures", **{key: getattr(self, key) for key in _FUTURES_KEYS}}

    def scaled(self, multiplier: float) -> CostModel:
        """The same model with every cost component multiplied (cost-sensitivity analysis: 0.5×, 1×, 2×)."""
        _check_number("multiplier", multiplier, positive=False, prefix="")
        if self.kind == "bps":
            return replace(self, bps=self.bps * multiplier)
        return replace(
            self,
            commission_per_contract=self.commission_per_contract * multiplier,
            half_spread_ticks=self.half_spread_ticks * multiplier,
        )

    def cost_fraction(self, price: float | np.ndarray | torch.Tensor) -> Any:
        """Cost per unit of |Δposition| (one contract, one side) as a fraction of one contract's notional at `price`."""
        if self.kind == "bps":
            if isinstance(price, torch.Tensor):
                return torch.full_like(price, self.bps * 1e-4)
            if isinstance(price, np.ndarray):
                return np.full_like(price, self.bps * 1e-4, dtype=np.float64)
            return self.bps * 1e-4
        cost_per_contract = self.commission_per_contract + self.half_spread_ticks * self.tick_value
        point_value = self.tick_value / self.tick_size
        return cost_per_contract / (price * point_value)


def _check_number(key: str, value: Any, *, positive: bool, prefix: str = "costs.") -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CostConfigError(f"{prefix}{key}: expected a finite number, got {value!r}")
    if positive and value <= 0:
        raise CostConfigError(f"{prefix}{key}: expected a number > 0, got {value!r}")
    if not positive and value < 0:
        raise CostConfigError(f"{prefix}{key}: expected a number >= 0, got {value!r}")
