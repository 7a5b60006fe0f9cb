"""Transaction-cost model: commission and half-spread slippage (futures) or basis points, per side, per instrument.

Costs are expressed as a fraction of one contract's notional at the fill price, so that they subtract directly from
the per-bar simple returns the environment pays as rewards.

Contract specs are per instrument, keyed by symbol root (``symbol_root``: ESH4 -> ES, NQZ24 -> NQ, ES.c.0 -> ES):
``costs.instruments: {ES: {tick_size: 0.25, tick_value: 12.5}, ...}`` (``InstrumentCosts``); an instrument
without an entry is an error unless the user wrote a ``default`` entry. Without ``costs.instruments`` the flat
``costs.tick_size`` and ``costs.tick_value``, where the user wrote both, are the one spec of every instrument
(``CostModel``); futures with neither are an error, never a silent default spec (docs/ENV.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch

# Re-exported: the cost models' users import them from here.
from marketrl.instruments.symbols import is_continuous as is_continuous
from marketrl.instruments.symbols import symbol_root as symbol_root
from marketrl.settings.contract_specs import contract_spec_problem

CostKind = Literal["futures", "bps"]

_FUTURES_KEYS = ("commission_per_contract", "half_spread_ticks", "tick_size", "tick_value")
_ALLOWED_KEYS = {"kind", "bps", "currency", *_FUTURES_KEYS}
# Keys of one costs.instruments entry; commission, half spread and bps default to the flat costs.* keys.
_INSTRUMENT_KEYS = (
    "tick_size",
    "tick_value",
    "multiplier",
    "commission_per_contract",
    "half_spread_ticks",
    "bps",
)
_INSTRUMENT_ALLOWED = {*_INSTRUMENT_KEYS, "currency"}
DEFAULT_SPEC = "default"


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
    currency: str | None = None  # of commission and tick_value; recorded only (a cost fraction has no unit)

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
        currency = config.get("currency")
        return cls(kind=kind, currency=currency, **{key: float(value) for key, value in values.items()})

    def to_config(self) -> dict[str, Any]:
        """Inverse of `from_config` (only the keys relevant to `kind`; the currency where set)."""
        currency = {} if self.currency is None else {"currency": self.currency}
        if self.kind == "bps":
            return {"kind": "bps", "bps": self.bps, **currency}
        return {"kind": "futures", **{key: getattr(self, key) for key in _FUTURES_KEYS}, **currency}

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

    def quoted_cost_fraction(self, price: np.ndarray, half_spread: np.ndarray) -> np.ndarray:
        """`cost_fraction` with the market's own half-spread: where ``half_spread`` (price units, (ask − bid) / 2
        of the quote at the fill) is finite, cost per contract = commission + half_spread × point value, i.e. a
        buy fills at the ask and a sell at the bid of a quote whose mid is ``price``; elsewhere (NaN: no usable
        quote) the configured ``half_spread_ticks``. A ``bps`` model has no spread term and ignores quotes."""
        price = np.asarray(price, dtype=np.float64)
        configured = np.asarray(self.cost_fraction(price), dtype=np.float64)
        if self.kind == "bps":
            return configured
        point_value = self.tick_value / self.tick_size
        quoted = (self.commission_per_contract + np.asarray(half_spread) * point_value) / (
            price * point_value
        )
        return np.where(np.isfinite(half_spread), quoted, configured)


def _check_number(key: str, value: Any, *, positive: bool, prefix: str = "costs.") -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CostConfigError(f"{prefix}{key}: expected a finite number, got {value!r}")
    if positive and value <= 0:
        raise CostConfigError(f"{prefix}{key}: expected a number > 0, got {value!r}")
    if not positive and value < 0:
        raise CostConfigError(f"{prefix}{key}: expected a number >= 0, got {value!r}")


@dataclass(frozen=True)
class InstrumentCosts:
    """One ``CostModel`` per symbol root (``costs.instruments``), with ``default`` only where the user wrote one."""

    specs: Mapping[str, CostModel]

    def __post_init__(self) -> None:
        if not self.specs:
            raise CostConfigError("costs.instruments: expected at least one instrument entry")
        if len({model.kind for model in self.specs.values()}) > 1:
            raise CostConfigError("costs.instruments: every entry must use the same costs.model")

    @property
    def kind(self) -> CostKind:
        """The cost kind shared by every entry."""
        return next(iter(self.specs.values())).kind

    def for_symbol(self, symbol: str) -> CostModel:
        """The spec of ``symbol``'s root (or the ``default`` entry); a one-line error naming it if there is none."""
        root = symbol_root(str(symbol))
        model = self.specs.get(root) or self.specs.get(DEFAULT_SPEC)
        if model is None:
            raise CostConfigError(
                f"costs.instruments: no contract spec for instrument {symbol!r} (root {root!r}); "
                f"add costs.instruments.{root} (tick_size, tick_value) or a costs.instruments.{DEFAULT_SPEC} entry"
            )
        return model

    def scaled(self, multiplier: float) -> InstrumentCosts:
        """Every entry's costs multiplied (see ``CostModel.scaled``)."""
        return InstrumentCosts({root: model.scaled(multiplier) for root, model in self.specs.items()})

    def to_config(self) -> dict[str, Any]:
        """``{"kind": ..., "instruments": {root: CostModel.to_config()}}``; ``costs_from_record`` inverts it."""
        return {
            "kind": self.kind,
            "instruments": {root: model.to_config() for root, model in sorted(self.specs.items())},
        }


Costs = CostModel | InstrumentCosts


def costs_from_config(costs: Mapping[str, Any]) -> Costs:
    """The ``costs`` section of config.yaml: ``model`` (futures | bps), the flat keys, optional ``instruments``.

    With ``instruments`` each entry needs ``tick_size`` and ``tick_value`` (or ``multiplier``, = tick_value /
    tick_size) for futures; its ``commission_per_contract``, ``half_spread_ticks`` and ``bps`` default to the flat
    keys. Without it (or with ``{}``) futures need the flat ``tick_size`` and ``tick_value``, written by the user as
    the catch-all of every instrument; without them, a one-line error names ``costs.instruments`` (no silent spec).
    """
    if not isinstance(costs, Mapping):
        raise CostConfigError(f"costs: expected a mapping, got {type(costs).__name__}")
    kind = costs.get("model", "futures")
    instruments = costs.get("instruments") or {}
    if not isinstance(instruments, Mapping):
        raise CostConfigError(f"costs.instruments: expected a mapping root -> spec, got {instruments!r}")
    problem = contract_spec_problem(costs)
    if problem is not None:
        raise CostConfigError(f"{problem[0]}: {problem[1]}")
    if not instruments:
        if kind == "bps":
            return CostModel.from_config({"kind": "bps", "bps": costs.get("bps", 0.0)})
        return CostModel.from_config(
            {"kind": kind, **{key: costs[key] for key in _FUTURES_KEYS if costs.get(key) is not None}}
        )
    return InstrumentCosts(
        {str(root): _instrument_spec(str(root), spec, costs, kind) for root, spec in instruments.items()}
    )


def _instrument_spec(root: str, spec: Any, flat: Mapping[str, Any], kind: Any) -> CostModel:
    prefix = f"costs.instruments.{root}."
    if not isinstance(spec, Mapping):
        raise CostConfigError(f"{prefix[:-1]}: expected a mapping of contract specs, got {spec!r}")
    unknown = sorted(set(spec) - _INSTRUMENT_ALLOWED)
    if unknown:
        raise CostConfigError(
            f"{prefix}{unknown[0]}: unknown key (allowed: {', '.join(sorted(_INSTRUMENT_ALLOWED))})"
        )
    for key in _INSTRUMENT_KEYS:
        if key in spec:
            _check_number(
                key, spec[key], positive=key in ("tick_size", "tick_value", "multiplier"), prefix=prefix
            )
    currency = spec.get("currency")
    if currency is not None and not (isinstance(currency, str) and currency):
        raise CostConfigError(f"{prefix}currency: expected a currency code such as 'USD', got {currency!r}")
    if kind == "bps":
        return CostModel(kind="bps", bps=float(spec.get("bps", flat.get("bps", 0.0))), currency=currency)
    if kind != "futures":
        raise CostConfigError(f"costs.model: expected 'futures' or 'bps', got {kind!r}")
    if "tick_size" not in spec:
        raise CostConfigError(f"{prefix}tick_size: required for a futures contract spec")
    if ("tick_value" in spec) == ("multiplier" in spec):
        raise CostConfigError(f"{prefix}tick_value: give exactly one of tick_value and multiplier")
    tick_size = float(spec["tick_size"])
    tick_value = float(spec["tick_value"]) if "tick_value" in spec else float(spec["multiplier"]) * tick_size
    return CostModel(
        kind="futures",
        commission_per_contract=float(
            spec.get("commission_per_contract", flat.get("commission_per_contract", 0.0))
        ),
        half_spread_ticks=float(spec.get("half_spread_ticks", flat.get("half_spread_ticks", 0.0))),
        tick_size=tick_size,
        tick_value=tick_value,
        currency=currency,
    )


def costs_from_record(record: Mapping[str, Any]) -> Costs:
    """Inverse of ``to_config`` of either cost type (the form checkpoints record)."""
    if "instruments" in record:
        return InstrumentCosts(
            {root: CostModel.from_config(spec) for root, spec in dict(record["instruments"]).items()}
        )
    return CostModel.from_config(record)
