"""Vectorized, tensor-resident trading environment over one split of a feature table.

N environments step in one batched tensor operation on the data's device: no Python loop over environments and no
host round-trip inside `TradingEnv.step`. The semantics (observation, reward, fills, costs, episodes and segments)
are documented in docs/ENV.md; `PlainGymEnv` is a plain single-environment numpy implementation of the same
semantics (reference and benchmark baseline), `GymVectorEnv` and `make_sb3_vec_env` adapt `TradingEnv` to
gymnasium and Stable-Baselines3.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Literal

import gymnasium
import numpy as np
import polars as pl
import torch
from gymnasium.vector import AutoresetMode

from marketrl.costs import CostModel
from marketrl.normalize import FeatureNormalizer

FillMode = Literal["close", "next_open"]
DEFAULT_MAX_GAP = timedelta(hours=6)
REQUIRED_COLUMNS = ("ts_event", "trading_day", "instrument_id", "symbol", "open", "close")
#: Action index → target position in units of `contracts` (short, flat, long).
ACTION_POSITIONS = (-1.0, 0.0, 1.0)
N_ACTIONS = len(ACTION_POSITIONS)
_NS_PER_DAY = 86_400 * 10**9
_START_POOL_STEPS = 64
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


class EnvConfigError(ValueError):
    """An `env.*` configuration value is invalid."""


class EnvDataError(ValueError):
    """The feature table cannot feed the environment (missing columns, bad order, bad prices, no episodes)."""


# --------------------------------------------------------------------------------------------------- configuration


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
        """Build from the `env` config mapping; `max_gap` accepts '90m', '6h', '2d', seconds or null."""
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise EnvConfigError(f"env.{unknown[0]}: unknown key (allowed: {', '.join(sorted(known))})")
        values = dict(config)
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


# ------------------------------------------------------------------------------------------------------ market data


@dataclass
class MarketData:
    """One split's rows as device tensors, built once. Row t is bar t of the frame (sorted by instrument, time).

    Per-row step parameters (decision at the close of row t, earning over bar t+1; zero where t is the last row
    of its segment, which is never a decision row):
      ret_close_close  close_{t+1}/close_t − 1
      ret_close_open   open_{t+1}/close_t − 1      (next_open fill: the old position bears this gap)
      ret_open_close   close_{t+1}/open_{t+1} − 1  (next_open fill: the new position earns this)
      cost_close       cost fraction at close_t
      cost_next_open   cost fraction at open_{t+1}
    """

    obs_table: torch.Tensor  # [T, F + 1] float32: normalized features and a zero column for the position
    ret_close_close: torch.Tensor  # [T] float32
    ret_close_open: torch.Tensor  # [T] float32
    ret_open_close: torch.Tensor  # [T] float32
    cost_close: torch.Tensor  # [T] float32
    cost_next_open: torch.Tensor  # [T] float32
    close: torch.Tensor  # [T] float64, for rule baselines (momentum)
    segment_start: torch.Tensor  # [T] int64, first row of the row's segment
    segment_id: torch.Tensor  # [T] int64
    is_decision: torch.Tensor  # [T] bool, row t+1 exists in the same segment
    segment_first: np.ndarray  # [S] int64, host copy
    segment_last: np.ndarray  # [S] int64, host copy (inclusive)
    rows: pl.DataFrame  # host: ts_event, trading_day, instrument_id, symbol per row
    feature_names: list[str]
    max_gap: timedelta | None
    # |normalized feature| <= feature_clip (the normalizer's clip); None: unbounded
    feature_clip: float | None
    device: torch.device
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def features(self) -> torch.Tensor:
        """Normalized features [T, F] float32 (a view of `obs_table`)."""
        return self.obs_table[:, :-1]

    @property
    def n_rows(self) -> int:
        """Number of bars (rows) in the split."""
        return int(self.features.shape[0])

    @property
    def n_features(self) -> int:
        """Number of feature columns F."""
        return int(self.features.shape[1])

    @classmethod
    def from_frame(
        cls,
        df: pl.DataFrame,
        feature_names: Sequence[str],
        normalizer: FeatureNormalizer,
        cost_model: CostModel | Mapping[str, CostModel],
        device: torch.device | str = "cpu",
        *,
        max_gap: timedelta | None = DEFAULT_MAX_GAP,
    ) -> MarketData:
        """Validate the feature table and build every tensor the environment needs, once, on `device`.

        `normalizer` must be fitted on the training split (pass the same one for validation/test splits);
        `cost_model` is one model or one per symbol.
        """
        names = list(feature_names)
        _validate_frame(df, names)
        if list(normalizer.feature_names) != names:
            raise EnvDataError(
                "normalizer: fitted on different feature_names than the ones passed to MarketData"
            )
        features = normalizer.transform_numpy(df)
        opens = df["open"].cast(pl.Float64).to_numpy()
        closes = df["close"].cast(pl.Float64).to_numpy()
        segment_id = _segment_ids(df, max_gap)
        n_rows = df.height

        is_new = np.ones(n_rows, dtype=bool)
        is_new[1:] = segment_id[1:] != segment_id[:-1]
        segment_first = np.flatnonzero(is_new).astype(np.int64)
        segment_last = np.append(segment_first[1:] - 1, n_rows - 1).astype(np.int64)
        segment_start = np.repeat(segment_first, segment_last - segment_first + 1)
        is_decision = np.zeros(n_rows, dtype=bool)
        is_decision[:-1] = segment_id[1:] == segment_id[:-1]

        next_open = np.append(opens[1:], np.nan)
        next_close = np.append(closes[1:], np.nan)
        with np.errstate(invalid="ignore"):
            ret_close_close = np.where(is_decision, next_close / closes - 1.0, 0.0)
            ret_close_open = np.where(is_decision, next_open / closes - 1.0, 0.0)
            ret_open_close = np.where(is_decision, next_close / next_open - 1.0, 0.0)
        cost_close = _cost_fractions(df, cost_model, closes)
        cost_next_open = np.where(
            is_decision, _cost_fractions(df, cost_model, np.where(is_decision, next_open, 1.0)), 0.0
        )

        device = torch.device(device)

        def f32(values: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(values, dtype=np.float32), device=device)

        return cls(
            obs_table=f32(np.concatenate([features, np.zeros((n_rows, 1), dtype=np.float32)], axis=1)),
            ret_close_close=f32(ret_close_close),
            ret_close_open=f32(ret_close_open),
            ret_open_close=f32(ret_open_close),
            cost_close=f32(cost_close),
            cost_next_open=f32(cost_next_open),
            close=torch.tensor(closes, device=device),
            segment_start=torch.as_tensor(segment_start, device=device),
            segment_id=torch.as_tensor(segment_id, device=device),
            is_decision=torch.as_tensor(is_decision, device=device),
            segment_first=segment_first,
            segment_last=segment_last,
            rows=df.select("ts_event", "trading_day", "instrument_id", "symbol"),
            feature_names=names,
            max_gap=max_gap,
            feature_clip=normalizer.clip,
            device=device,
        )

    def to(self, device: torch.device | str) -> MarketData:
        """A copy with every tensor on `device`."""
        device = torch.device(device)
        values = {
            item.name: getattr(self, item.name) for item in fields(self) if not item.name.startswith("_")
        }
        moved = {name: value.to(device) for name, value in values.items() if isinstance(value, torch.Tensor)}
        return MarketData(**{**values, **moved, "device": device})

    def step_parameters(self, fill: FillMode) -> torch.Tensor:
        """[3, T] float32: gap return of the old position, return of the new position, cost fraction (cached)."""
        key = ("step_parameters", fill)
        if key not in self._cache:
            if fill == "close":
                parts = [torch.zeros_like(self.ret_close_close), self.ret_close_close, self.cost_close]
            else:
                parts = [self.ret_close_open, self.ret_open_close, self.cost_next_open]
            self._cache[key] = torch.stack(parts)
        return self._cache[key]

    def host_arrays(self, fill: FillMode) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host copies for `PlainGymEnv` (cached, shared by every copy): features [T, F], step parameters
        [T, 3] (row-major, one row per bar) and segment_start [T]."""
        key = ("host_arrays", fill)
        if key not in self._cache:
            self._cache[key] = (
                np.ascontiguousarray(self.features.cpu().numpy()),
                np.ascontiguousarray(self.step_parameters(fill).cpu().numpy().T),
                self.segment_start.cpu().numpy(),
            )
        return self._cache[key]

    def episode_starts(self, episode_length: int) -> np.ndarray:
        """Rows where an episode of `episode_length` decisions fits inside one segment (host int64, cached)."""
        key = ("episode_starts", episode_length)
        if key not in self._cache:
            room = self.segment_last - episode_length  # the last decision row must be < segment_last
            starts = [
                np.arange(first, last + 1)
                for first, last in zip(self.segment_first, room, strict=True)
                if last >= first
            ]
            self._cache[key] = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
        return self._cache[key]

    def observe(self, rows: torch.Tensor, positions: torch.Tensor, window: int) -> torch.Tensor:
        """Observations [N, window·F + 1]: feature rows t−W+1..t (oldest first) then the position held into t.

        Window rows before the segment's first row repeat that first row, so a window never reaches across a
        segment boundary or into another instrument.
        """
        if window == 1:  # fast path: one gather, then the position goes into the zero column
            obs = self.obs_table.index_select(0, rows)
            obs[:, -1] = positions
            return obs
        n, n_features = rows.shape[0], self.n_features
        offsets = torch.arange(window - 1, -1, -1, device=rows.device)
        index = torch.maximum(rows[:, None] - offsets, self.segment_start.index_select(0, rows)[:, None])
        gathered = self.obs_table.index_select(0, index.reshape(-1)).view(n, window, n_features + 1)
        obs = torch.empty(n, window * n_features + 1, dtype=self.obs_table.dtype, device=rows.device)
        obs[:, :-1].view(n, window, n_features).copy_(gathered[:, :, :-1])
        obs[:, -1] = positions
        return obs


def _validate_frame(df: pl.DataFrame, feature_names: list[str]) -> None:
    missing = [name for name in (*REQUIRED_COLUMNS, *feature_names) if name not in df.columns]
    if missing:
        raise EnvDataError(f"feature table: column {missing[0]!r} is missing")
    if not isinstance(df.schema["ts_event"], pl.Datetime):
        raise EnvDataError(
            f"feature table: column 'ts_event' must be a Datetime, got {df.schema['ts_event']}"
        )
    if df.height < 2:
        raise EnvDataError(f"feature table: expected at least 2 rows, got {df.height}")
    if df["ts_event"].null_count() or df["instrument_id"].null_count():
        raise EnvDataError("feature table: ts_event and instrument_id must not contain nulls")
    order = df.select(
        (pl.col("instrument_id").diff() < 0).any().alias("instrument_back"),
        ((pl.col("instrument_id").diff() == 0) & (pl.col("ts_event").dt.epoch("ns").diff() <= 0))
        .any()
        .alias("time_back"),
    ).row(0, named=True)
    if order["instrument_back"] or order["time_back"]:
        raise EnvDataError(
            "feature table: rows must be sorted by (instrument_id, ts_event) with unique timestamps per instrument"
        )
    for column in ("open", "close"):
        bad = df.select(
            ~(pl.col(column).cast(pl.Float64).is_finite() & (pl.col(column) > 0)).fill_null(True).any()
        )
        if bad.item():
            raise EnvDataError(f"feature table: column {column!r} must hold finite prices > 0")


def _segment_ids(df: pl.DataFrame, max_gap: timedelta | None) -> np.ndarray:
    """Consecutive ids; a new segment starts at each new instrument and after each weekday-time gap > max_gap."""
    instrument = df["instrument_id"].to_numpy()
    new_segment = np.zeros(df.height, dtype=bool)
    new_segment[1:] = instrument[1:] != instrument[:-1]
    if max_gap is not None:
        weekday_ns = _weekday_time_ns(df["ts_event"].dt.epoch("ns").to_numpy())
        max_gap_ns = int(max_gap.total_seconds() * 1e9)
        new_segment[1:] |= np.diff(weekday_ns) > max_gap_ns
    return np.cumsum(new_segment).astype(np.int64)


def _weekday_time_ns(epoch_ns: np.ndarray) -> np.ndarray:
    """Nanoseconds since 1970-01-01 counting only Monday–Friday (UTC): weekend time stands still."""
    days = np.floor_divide(epoch_ns, _NS_PER_DAY)
    dates = days.astype("datetime64[D]")
    weekdays_before = np.busday_count(np.datetime64("1970-01-01", "D"), dates).astype(np.int64)
    time_of_day = np.where(np.is_busday(dates), epoch_ns - days * _NS_PER_DAY, 0)
    return weekdays_before * _NS_PER_DAY + time_of_day


def _cost_fractions(
    df: pl.DataFrame, cost_model: CostModel | Mapping[str, CostModel], prices: np.ndarray
) -> np.ndarray:
    if isinstance(cost_model, CostModel):
        return np.asarray(cost_model.cost_fraction(prices), dtype=np.float64)
    symbols = df["symbol"].to_numpy()
    out = np.empty(len(prices), dtype=np.float64)
    for symbol in np.unique(symbols):
        if symbol not in cost_model:
            raise EnvDataError(f"costs: no cost model for symbol {symbol!r}")
        mask = symbols == symbol
        out[mask] = cost_model[symbol].cost_fraction(prices[mask])
    return out


def step_rewards(
    params: torch.Tensor, previous: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(gross, cost) for positions previous → target (in {−1, 0, 1}); `params` [3, N] are rows of
    `step_parameters` already multiplied by contracts.

    gross = previous × gap return + target × holding return; cost = |target − previous| × cost fraction.
    The single definition shared by `TradingEnv.step` and evaluation (`PlainGymEnv` mirrors it in numpy).
    """
    gross = torch.addcmul(target * params[1], previous, params[0])
    cost = (target - previous).abs_().mul_(params[2])
    return gross, cost


# ---------------------------------------------------------------------------------------------- the vectorized env


class TradingEnv:
    """N trading environments on one device, stepped in one batched tensor operation.

    `reset() -> obs [N, W·F + 1]`; `step(actions) -> (obs, reward, terminated, truncated)`, all device tensors.
    Episodes last exactly `episode_length` decisions, then auto-reset: the obs returned for a finished env is the
    first obs of its next episode, and `final_obs` holds the obs each env would have seen next in its old episode
    (use it to bootstrap on `truncated`). `terminated` is always False: episodes end only by the time limit.
    """

    def __init__(
        self, data: MarketData, config: EnvConfig, seed: int = 0, device: torch.device | str | None = None
    ) -> None:
        if config.max_gap != data.max_gap:
            raise EnvConfigError(
                f"env.max_gap: the MarketData was segmented with max_gap={data.max_gap}, config says {config.max_gap}"
            )
        if device is not None and torch.device(device) != data.device:
            data = data.to(device)
        self.data = data
        self.config = config
        self.device = data.device
        self.n_envs = config.n_envs
        self.window = config.window
        self.obs_dim = config.window * data.n_features + 1
        starts = data.episode_starts(config.episode_length)
        if starts.size == 0:
            raise EnvDataError(
                f"env.episode_length: no segment has more than {config.episode_length} bars; shorten episodes or "
                f"raise env.max_gap (longest segment: {int((data.segment_last - data.segment_first).max()) + 1} bars)"
            )
        self.start_rows = torch.as_tensor(starts, device=self.device)
        self._valid_start = np.zeros(data.n_rows, dtype=bool)
        self._valid_start[starts] = True
        self._params = data.step_parameters(config.fill) * config.contracts
        self._action_positions = torch.tensor(ACTION_POSITIONS, dtype=torch.float32, device=self.device)
        self._generator = torch.Generator(device=self.device)
        self.seed(seed)
        n = self.n_envs
        self.row = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.position = torch.zeros(n, dtype=torch.float32, device=self.device)
        self.elapsed = torch.zeros(n, dtype=torch.int64, device=self.device)
        self._final_state: tuple[torch.Tensor, torch.Tensor] | None = None
        self.last_cost: torch.Tensor | None = None

    def seed(self, seed: int) -> None:
        """Re-seed the device generator that draws episode starts (drops starts drawn in advance)."""
        self._generator.manual_seed(int(seed))
        self._start_pool = torch.zeros(0, self.n_envs, dtype=torch.int64, device=self.device)
        self._pool_cursor = 0

    def state_dict(self) -> dict[str, Any]:
        """Everything later steps depend on besides the data: rows, positions, clocks and the start RNG."""
        return {
            "generator": self._generator.get_state(),
            "start_pool": self._start_pool,
            "pool_cursor": self._pool_cursor,
            "row": self.row,
            "position": self.position,
            "elapsed": self.elapsed,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly where `state_dict` was taken (for resumable training)."""
        self._generator.set_state(state["generator"])
        self._start_pool = state["start_pool"].to(self.device)
        self._pool_cursor = int(state["pool_cursor"])
        self.row = state["row"].to(self.device)
        self.position = state["position"].to(self.device)
        self.elapsed = state["elapsed"].to(self.device)
        self._final_state = None

    def _draw_starts(self) -> torch.Tensor:
        # Starts are drawn for _START_POOL_STEPS steps at once: one random draw and gather per pool, not per step.
        if self._pool_cursor == self._start_pool.shape[0]:
            pick = torch.randint(
                0,
                self.start_rows.shape[0],
                (_START_POOL_STEPS * self.n_envs,),
                generator=self._generator,
                device=self.device,
            )
            self._start_pool = self.start_rows.index_select(0, pick).view(_START_POOL_STEPS, self.n_envs)
            self._pool_cursor = 0
        self._pool_cursor += 1
        return self._start_pool[self._pool_cursor - 1]

    def reset(self, start_rows: torch.Tensor | np.ndarray | Sequence[int] | None = None) -> torch.Tensor:
        """Start every env flat at a random valid row (or at `start_rows`, checked); returns obs [N, obs_dim]."""
        if start_rows is None:
            rows = self._draw_starts()
        else:
            host_rows = np.asarray(torch.as_tensor(start_rows).cpu(), dtype=np.int64).reshape(-1)
            if host_rows.shape != (self.n_envs,):
                raise EnvDataError(f"start_rows: expected {self.n_envs} rows, got {host_rows.shape[0]}")
            inside = (host_rows >= 0) & (host_rows < self.data.n_rows)
            if not inside.all() or not self._valid_start[host_rows].all():
                raise EnvDataError(
                    "start_rows: every row must be a valid episode start (see MarketData.episode_starts)"
                )
            rows = torch.as_tensor(host_rows, device=self.device)
        self.row = rows
        self.position = torch.zeros(self.n_envs, dtype=torch.float32, device=self.device)
        self.elapsed = torch.zeros(self.n_envs, dtype=torch.int64, device=self.device)
        self._final_state = None
        return self.data.observe(self.row, self.position, self.window)

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Apply actions (LongTensor [N] in {0, 1, 2} = short/flat/long) to every env at once, without host syncs."""
        target = self._action_positions.index_select(0, actions)
        params = self._params.index_select(1, self.row)
        gross, cost = step_rewards(params, self.position, target)
        self.last_cost = cost

        next_row = self.row + 1
        elapsed = self.elapsed + 1
        truncated = elapsed >= self.config.episode_length
        self._final_state = (next_row, target)
        self.row = torch.where(truncated, self._draw_starts(), next_row)
        self.position = torch.where(truncated, 0.0, target)
        self.elapsed = torch.where(truncated, 0, elapsed)
        obs = self.data.observe(self.row, self.position, self.window)
        return obs, gross - cost, torch.zeros_like(truncated), truncated

    @property
    def final_obs(self) -> torch.Tensor | None:
        """Obs at t+1 of the last step's old episode, for every env (equal to the returned obs where not done).

        Computed on access (one gather), so callers that do not bootstrap on truncation pay nothing.
        """
        if self._final_state is None:
            return None
        rows, positions = self._final_state
        return self.data.observe(rows, positions, self.window)


# ------------------------------------------------------------------------------------------------------ evaluation


def evaluate_positions(
    data: MarketData, positions: torch.Tensor | np.ndarray, config: EnvConfig | None = None
) -> pl.DataFrame:
    """Per-bar results of holding `positions[t]` (target in {−1, 0, 1}, decided at the close of row t).

    Each segment starts flat; non-decision rows (the last bar of each segment) are ignored. `positions[t]` must
    use only information known at the close of bar t. See `evaluate` for the output columns.
    """
    config = config or EnvConfig(max_gap=data.max_gap)
    target = torch.as_tensor(positions, device=data.device).to(torch.float32).reshape(-1)
    if target.shape[0] != data.n_rows:
        raise EnvDataError(f"positions: expected {data.n_rows} values (one per row), got {target.shape[0]}")
    if not bool(torch.isin(target, torch.tensor(ACTION_POSITIONS, device=target.device)).all()):
        raise EnvDataError("positions: expected target positions in {-1, 0, 1} (units of env.contracts)")
    rows = torch.arange(data.n_rows, device=data.device)
    previous = torch.cat([target.new_zeros(1), target[:-1]])
    previous = torch.where(rows == data.segment_start, torch.zeros_like(previous), previous)
    gross, cost = step_rewards(data.step_parameters(config.fill) * config.contracts, previous, target)
    decision = data.is_decision.cpu().numpy()
    decision_rows = np.flatnonzero(decision)
    host = {
        "position": (target.cpu().numpy() * config.contracts).round().astype(np.int32),
        "gross_return": gross.cpu().numpy().astype(np.float64),
        "cost": cost.cpu().numpy().astype(np.float64),
        "segment": data.segment_id.cpu().numpy(),
    }
    earning = data.rows[decision_rows + 1]
    decided = data.rows[decision_rows]
    return pl.DataFrame(
        {
            "ts_event": earning["ts_event"],
            "trading_day": earning["trading_day"],
            "symbol": decided["symbol"],
            "instrument_id": decided["instrument_id"],
            "decision_ts_event": decided["ts_event"],
            "segment": pl.Series(host["segment"][decision_rows], dtype=pl.UInt32),
            "position": host["position"][decision_rows],
            "gross_return": host["gross_return"][decision_rows],
            "cost": host["cost"][decision_rows],
        }
    ).with_columns(net_return=pl.col("gross_return") - pl.col("cost"))


def evaluate(
    policy: Callable[[torch.Tensor], torch.Tensor], data: MarketData, config: EnvConfig | None = None
) -> pl.DataFrame:
    """One deterministic pass over every decision bar of the split, all segments in parallel as one batch.

    `policy(obs [K, W·F + 1]) -> actions LongTensor [K]` (K = number of segments; obs as in `TradingEnv`).
    Returns one row per decision bar t, labelled by the bar it earns over (t+1):
      ts_event, trading_day   of bar t+1 (the bar whose return the position earns)
      symbol, instrument_id, decision_ts_event (bar t), segment
      position                after the decision at t, in contracts
      gross_return, cost, net_return   the `TradingEnv.step` reward terms (fractions of one contract's notional)
    """
    config = config or EnvConfig(max_gap=data.max_gap)
    segments = np.flatnonzero(data.segment_last > data.segment_first)  # segments with at least one decision
    positions = torch.zeros(data.n_rows + 1, dtype=torch.float32, device=data.device)  # + a scratch slot
    if segments.size:
        with torch.no_grad():
            _run_policy(policy, data, config.window, segments, positions)
    return evaluate_positions(data, positions[:-1], config)


def _run_policy(
    policy: Callable[[torch.Tensor], torch.Tensor],
    data: MarketData,
    window: int,
    segments: np.ndarray,
    positions: torch.Tensor,
) -> None:
    """Step `policy` through `segments` in lockstep (one batch row per segment), writing each decision into
    `positions[row]`; segments that have finished keep stepping on their last row and write to the scratch slot."""
    first = torch.as_tensor(data.segment_first[segments], device=data.device)
    last_decision = torch.as_tensor(data.segment_last[segments] - 1, device=data.device)
    scratch_row = torch.full_like(first, data.n_rows)
    action_positions = torch.tensor(ACTION_POSITIONS, dtype=torch.float32, device=data.device)
    held = torch.zeros(segments.size, dtype=torch.float32, device=data.device)
    n_steps = int((data.segment_last[segments] - data.segment_first[segments]).max())
    for step in range(n_steps):
        row = torch.minimum(first + step, last_decision)
        active = first + step <= last_decision
        target = action_positions.index_select(0, policy(data.observe(row, held, window)).reshape(-1))
        held = torch.where(active, target, held)
        positions.index_copy_(0, torch.where(active, row, scratch_row), target)


def rule_positions(data: MarketData, rule: str, *, seed: int = 0, lookback: int = 20) -> torch.Tensor:
    """Target positions [T] for rule baselines: 'long' (buy and hold), 'short', 'flat', 'random' (uniform over
    {−1, 0, 1}, seeded), 'momentum' (sign of close_t / close_{t−lookback} − 1 within the segment; flat until
    `lookback` bars of the segment exist). Feed the result to `evaluate_positions`."""
    n = data.n_rows
    if rule in ("long", "short", "flat"):
        return torch.full((n,), {"long": 1.0, "short": -1.0, "flat": 0.0}[rule], device=data.device)
    if rule == "random":
        generator = torch.Generator(device=data.device).manual_seed(seed)
        draws = torch.randint(0, N_ACTIONS, (n,), generator=generator, device=data.device)
        return draws.to(torch.float32) - 1.0
    if rule == "momentum":
        if lookback < 1:
            raise EnvConfigError(f"momentum lookback: expected an integer >= 1, got {lookback!r}")
        rows = torch.arange(n, device=data.device)
        past = rows - lookback
        known = past >= data.segment_start
        past_close = data.close.index_select(0, past.clamp(min=0))
        signal = torch.sign(data.close / past_close - 1.0).to(torch.float32)
        return torch.where(known, signal, torch.zeros_like(signal))
    raise EnvConfigError(f"baseline rule: expected long, short, flat, random or momentum, got {rule!r}")


# -------------------------------------------------------------------------------------------------------- adapters


def _observation_box(data: MarketData, window: int) -> gymnasium.spaces.Box:
    """Features within ±feature_clip (unbounded without a clip), then the position in [−1, 1]."""
    bound = np.inf if data.feature_clip is None else data.feature_clip
    high = np.append(np.full(window * data.n_features, bound, dtype=np.float32), np.float32(1.0))
    return gymnasium.spaces.Box(low=-high, high=high, dtype=np.float32)


class GymVectorEnv(gymnasium.vector.VectorEnv):
    """gymnasium 1.x vector adapter over `TradingEnv` (numpy in/out), autoreset mode SAME_STEP.

    As in `TradingEnv`, a finished env's returned obs is the first of its next episode; its last obs is in
    `infos["final_obs"]` (object array, None elsewhere) with the mask `infos["_final_obs"]`.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012 - gymnasium's API

    def __init__(self, env: TradingEnv) -> None:
        self.env = env
        self.num_envs = env.n_envs
        self.single_observation_space = _observation_box(env.data, env.window)
        self.single_action_space = gymnasium.spaces.Discrete(N_ACTIONS)
        self.observation_space = gymnasium.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, self.num_envs)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset all envs; `options={"start_rows": [...]}` pins the starts."""
        if seed is not None:
            self.env.seed(seed)
        obs = self.env.reset((options or {}).get("start_rows"))
        return obs.cpu().numpy(), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step all envs; actions are N integers in {0, 1, 2}."""
        actions = np.asarray(actions, dtype=np.int64).reshape(-1)
        if actions.shape != (self.num_envs,) or actions.min() < 0 or actions.max() >= N_ACTIONS:
            raise ValueError(
                f"actions: expected {self.num_envs} integers in [0, {N_ACTIONS}), got {actions!r}"
            )
        obs, reward, terminated, truncated = self.env.step(torch.as_tensor(actions, device=self.env.device))
        done = (terminated | truncated).cpu().numpy()
        infos: dict[str, Any] = {}
        if done.any():
            final = np.full(self.num_envs, None, dtype=object)
            final_obs = self.env.final_obs.cpu().numpy()
            for index in np.flatnonzero(done):
                final[index] = final_obs[index]
            infos = {"final_obs": final, "_final_obs": done, "final_info": {}, "_final_info": done}
        return (
            obs.cpu().numpy(),
            reward.cpu().numpy(),
            terminated.cpu().numpy(),
            truncated.cpu().numpy(),
            infos,
        )


def make_sb3_vec_env(env: TradingEnv) -> Any:
    """A Stable-Baselines3 `VecEnv` over `env` (requires the `bench` extra: stable-baselines3).

    SB3 conventions: `dones = terminated | truncated`; a finished env's last obs is in
    `infos[i]["terminal_observation"]` and `infos[i]["TimeLimit.truncated"]` marks time-limit ends.
    """
    from stable_baselines3.common.vec_env import VecEnv

    class SB3VecEnv(VecEnv):
        def __init__(self, inner: TradingEnv) -> None:
            self.inner = inner
            self._actions: torch.Tensor | None = None
            super().__init__(
                inner.n_envs, _observation_box(inner.data, inner.window), gymnasium.spaces.Discrete(N_ACTIONS)
            )

        def reset(self) -> np.ndarray:
            if any(seed is not None for seed in self._seeds):
                self.inner.seed(self._seeds[0])
            self._reset_seeds()
            return self.inner.reset().cpu().numpy()

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = torch.as_tensor(
                np.asarray(actions, dtype=np.int64).reshape(-1), device=self.inner.device
            )

        def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
            obs, reward, terminated, truncated = self.inner.step(self._actions)
            dones = (terminated | truncated).cpu().numpy()
            truncated_host = truncated.cpu().numpy()
            infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
            if dones.any():
                final_obs = self.inner.final_obs.cpu().numpy()
                for index in np.flatnonzero(dones):
                    infos[index] = {
                        "terminal_observation": final_obs[index],
                        "TimeLimit.truncated": bool(truncated_host[index]),
                    }
            return obs.cpu().numpy(), reward.cpu().numpy(), dones, infos

        def close(self) -> None:
            pass

        def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
            value = None if attr_name == "render_mode" else getattr(self.inner, attr_name)
            return [value] * len(self._get_indices(indices))

        def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
            setattr(self.inner, attr_name, value)

        def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
            result = getattr(self.inner, method_name)(*args, **kwargs)
            return [result] * len(self._get_indices(indices))

        def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
            return [False] * len(self._get_indices(indices))

    return SB3VecEnv(env)


# ------------------------------------------------------------------------------------- plain single-env reference


class PlainGymEnv(gymnasium.Env):
    """One trading environment in plain numpy with the same semantics as `TradingEnv` (reference and baseline).

    No auto-reset (gymnasium single-env convention): after `truncated`, call `reset()`.
    `reset(options={"start_row": r})` pins the start row.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's API

    def __init__(self, data: MarketData, config: EnvConfig, seed: int | None = None) -> None:
        self.config = config
        self.window = config.window
        self.features, self.params, self.segment_start = data.host_arrays(config.fill)
        self.starts = data.episode_starts(config.episode_length)
        if self.starts.size == 0:
            raise EnvDataError(f"env.episode_length: no segment has more than {config.episode_length} bars")
        self.observation_space = _observation_box(data, config.window)
        self.action_space = gymnasium.spaces.Discrete(N_ACTIONS)
        self._seed = seed
        self.row = 0
        self.position = np.float32(0.0)
        self.elapsed = 0

    def _observe(self, row: int, position: np.float32) -> np.ndarray:
        first = max(row - self.window + 1, int(self.segment_start[row]))
        window = self.features[first : row + 1]
        if window.shape[0] < self.window:  # repeat the segment's first row, as TradingEnv does
            window = np.concatenate([np.repeat(window[:1], self.window - window.shape[0], axis=0), window])
        return np.concatenate([window.reshape(-1), np.array([position], dtype=np.float32)])

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start flat at a random valid row (or `options["start_row"]`)."""
        if seed is None:  # the constructor's seed applies to the first reset
            seed = self._seed
        self._seed = None
        super().reset(seed=seed)
        start = (options or {}).get("start_row")
        self.row = (
            int(self.starts[self.np_random.integers(self.starts.size)]) if start is None else int(start)
        )
        self.position = np.float32(0.0)
        self.elapsed = 0
        return self._observe(self.row, self.position), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Move to target position ACTION_POSITIONS[action]; reward as in `step_rewards`."""
        target = np.float32(ACTION_POSITIONS[int(action)])
        gap_return, hold_return, cost_fraction = self.params[self.row]
        contracts = np.float32(self.config.contracts)
        gross = target * (hold_return * contracts) + self.position * (gap_return * contracts)
        cost = abs(target - self.position) * (cost_fraction * contracts)
        self.row += 1
        self.elapsed += 1
        self.position = target
        truncated = self.elapsed >= self.config.episode_length
        return (
            self._observe(self.row, self.position),
            float(gross - cost),
            False,
            truncated,
            {"cost": float(cost)},
        )
