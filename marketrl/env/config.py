"""Environment settings (`env.*` in config.yaml), the action set and the env's error types (torch/numpy only)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, Literal

#: Columns a feature table must carry besides its features.
REQUIRED_COLUMNS = ("ts_event", "trading_day", "instrument_id", "symbol", "open", "close")
#: Quote columns of a feature table (marketrl.data.quotes.QUOTE_COLUMNS): as of each bar's close, then its open.
QUOTE_KEYS = ("bid_px", "ask_px", "open_bid_px", "open_ask_px")
FillMode = Literal["close", "next_open"]
DEFAULT_MAX_GAP = timedelta(hours=6)
#: Action index → target position in units of `contracts` (short, flat, long).
ACTION_POSITIONS = (-1.0, 0.0, 1.0)
N_ACTIONS = len(ACTION_POSITIONS)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


class EnvConfigError(ValueError):
    """An `env.*` configuration value is invalid."""


class EnvDataError(ValueError):
    """The feature table cannot feed the environment (missing columns, bad order, bad prices, no episodes)."""


#: `env` keys applied when the feature tables are built, not by the env: env.fill_delay moves the quotes a fill
#: reads (marketrl.data.quotes), so the table's quote columns already hold them.
BUILD_TIME_KEYS = ("fill_delay",)


@dataclass(frozen=True)
class EnvConfig:
    """Environment settings (`env.*` in config.yaml).

    max_gap: the largest gap between consecutive bars of one instrument that an episode may cross, measured in
    weekday time (Saturdays and Sundays UTC do not count), so the daily session break and the weekend stay inside a
    segment while a missing weekday of data splits it. None: split only between instruments.
    """

    window: int = 1
    contracts: int = 1
    episode_length: int = 256
    fill: FillMode = "close"
    n_envs: int = 64
    max_gap: timedelta | None = DEFAULT_MAX_GAP

    def __post_init__(self) -> None:
        for key in ("window", "contracts", "episode_length", "n_envs"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EnvConfigError(f"env.{key}: expected an integer >= 1, got {value!r}")
        if self.fill not in ("close", "next_open"):
            raise EnvConfigError(f"env.fill: expected 'close' or 'next_open', got {self.fill!r}")
        if self.max_gap is not None and (
            not isinstance(self.max_gap, timedelta) or self.max_gap.total_seconds() <= 0
        ):
            raise EnvConfigError(f"env.max_gap: expected a positive duration or None, got {self.max_gap!r}")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> EnvConfig:
        """Build from the `env` config mapping; `max_gap` accepts '90m', '6h', '2d', seconds or null. The keys of
        `BUILD_TIME_KEYS` are accepted and left to the feature tables."""
        known = {item.name for item in fields(cls)} | set(BUILD_TIME_KEYS)
        unknown = sorted(set(config) - known)
        if unknown:
            raise EnvConfigError(f"env.{unknown[0]}: unknown key (allowed: {', '.join(sorted(known))})")
        values = {key: value for key, value in config.items() if key not in BUILD_TIME_KEYS}
        if "max_gap" in values:
            values["max_gap"] = parse_duration(values["max_gap"], key="env.max_gap")
        return cls(**values)


def parse_duration(value: Any, *, key: str) -> timedelta | None:
    """'45s', '90m', '6h', '2d', a number of seconds, a timedelta, or None."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return timedelta(seconds=value)
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", value)
        if match:
            return timedelta(seconds=float(match.group(1)) * _DURATION_UNITS[match.group(2)])
    raise EnvConfigError(f"{key}: expected a duration such as '90m', '6h' or '2d' (or null), got {value!r}")


def format_duration(value: timedelta | None) -> str:
    """The shortest config spelling of a duration ('6h', '90m', '45s'; 'null' for None), for messages."""
    if value is None:
        return "null"
    seconds = value.total_seconds()
    for unit in ("d", "h", "m"):
        size = _DURATION_UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
