"""One split's bars as device tensors: returns, cost fractions, segments, rolls and the observation table.

`MarketData.from_arrays` needs only numpy and torch; `MarketData.from_frame` reads a polars feature table through
`marketrl.env.frames`, imported on first use, so the tensor env runs where polars is not installed.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from marketrl.env.config import DEFAULT_MAX_GAP, QUOTE_KEYS, EnvDataError, FillMode
from marketrl.instruments.costs import CostConfigError, CostModel, InstrumentCosts, is_continuous

if TYPE_CHECKING:
    import polars as pl


class FeatureNormalizer(Protocol):
    """What `MarketData.from_frame` needs of a fitted normalizer (`marketrl.splits.normalize.FeatureNormalizer`,
    a layer above: it is fitted on a fold's training rows)."""

    feature_names: list[str]
    clip: float | None

    def transform_numpy(self, df: pl.DataFrame) -> np.ndarray: ...


_NS_PER_DAY = 86_400 * 10**9


@dataclass
class MarketData:
    """One split's rows as device tensors, built once, in *series order*: the frame's order (instrument, time),
    except that the contracts of one continuous symbol (ES.c.0: ESH4, then ESM4) follow one another in time.

    A segment is a run of rows of one instrument with no gap over `max_gap`; a chain is a run of segments joined
    by rolls (the same continuous symbol, the next contract, no gap over `max_gap`): positions carry along a
    chain and every chain starts flat. A roll row is the old contract's last row of a chain that goes on.

    Per-row step parameters (decision at the close of row t, earning over bar t+1; zero where t is the last row
    of its chain, which is never a decision row):
      ret_close_close  close_{t+1}/close_t − 1
      ret_close_open   open_{t+1}/close_t − 1      (next_open fill: the old position bears this gap)
      ret_open_close   close_{t+1}/open_{t+1} − 1  (next_open fill: the new position earns this)
      cost_close       cost fraction at close_t (every row: the price the agent has just seen)
      cost_next_open   cost fraction at open_{t+1}
    At a roll row the old position is closed at close_t on the old contract (roll_cost_close) and the new one
    opened at open_{t+1} on the new contract (roll_cost_open), whatever the fill: ret_close_close and
    ret_open_close are close_{t+1}/open_{t+1} − 1, ret_close_open and cost_next_open are 0, so the price gap
    between the contracts is never earned.
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
    is_decision: torch.Tensor  # [T] bool, row t+1 exists in the same chain
    segment_first: np.ndarray  # [S] int64, host copy
    segment_last: np.ndarray  # [S] int64, host copy (inclusive)
    is_roll: torch.Tensor  # [T] bool, row t is a contract's last row and its position rolls into row t+1
    roll_cost_close: torch.Tensor  # [T] float32, cost closing the old contract at close_t (roll rows, else 0)
    roll_cost_open: torch.Tensor  # [T] float32, cost opening the new contract at open_{t+1} (roll rows)
    chain_start: torch.Tensor  # [T] int64, first row of the row's chain (where positions start flat)
    chain_first: np.ndarray  # [C] int64, host copy
    chain_last: np.ndarray  # [C] int64, host copy (inclusive)
    # The half-spread each fill pays, in ticks (host, [T] float64; NaN under a bps cost model), at close_t and at
    # open_t, and where a quote was wanted but missing, zero or crossed (the configured half-spread paid
    # instead; [T] bool, all False without quotes). `quoted`: the rows carried quotes (quote-aware fills).
    half_spread_ticks_close: np.ndarray
    half_spread_ticks_open: np.ndarray
    fallback_close: np.ndarray
    fallback_open: np.ndarray
    quoted: bool
    # host labels per row (polars: ts_event, trading_day, instrument_id, symbol); None when built from arrays
    rows: pl.DataFrame | None
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
        cost_model: CostModel | InstrumentCosts | Mapping[str, CostModel],
        device: torch.device | str = "cpu",
        *,
        max_gap: timedelta | None = DEFAULT_MAX_GAP,
    ) -> MarketData:
        """Validate a polars feature table and build every tensor the environment needs, once, on `device`.

        `normalizer` must be fitted on the training split (pass the same one for validation/test splits);
        `cost_model` is one model, one per symbol root (`InstrumentCosts`) or one per symbol.
        """
        from marketrl.env import frames  # polars is needed only here, for reading a frame

        names = list(feature_names)
        columns = frames.frame_columns(df, names)
        if list(normalizer.feature_names) != names:
            raise EnvDataError(
                "normalizer: fitted on different feature_names than the ones passed to MarketData"
            )
        return cls.from_arrays(
            normalizer.transform_numpy(df),
            cost_model=cost_model,
            device=device,
            feature_names=names,
            feature_clip=normalizer.clip,
            max_gap=max_gap,
            rows=frames.row_labels(df),
            **columns,
        )

    @classmethod
    def from_arrays(
        cls,
        features: np.ndarray,
        *,
        opens: np.ndarray,
        closes: np.ndarray,
        instrument_id: np.ndarray,
        ts_event_ns: np.ndarray,
        cost_model: CostModel | InstrumentCosts | Mapping[str, CostModel],
        device: torch.device | str = "cpu",
        symbols: np.ndarray | None = None,
        feature_names: Sequence[str] | None = None,
        feature_clip: float | None = None,
        max_gap: timedelta | None = DEFAULT_MAX_GAP,
        rows: pl.DataFrame | None = None,
        quotes: Mapping[str, np.ndarray] | None = None,
    ) -> MarketData:
        """Build from host arrays, one value (or feature row) per bar, sorted by (instrument_id, ts_event).

        `features` [T, F] are already normalized (float32); `ts_event_ns` is bar open time in UTC epoch
        nanoseconds; `symbols` is needed with a per-symbol `cost_model` and for rolls (rows whose symbol is a
        continuous one, such as ES.c.0, form one series across contracts). `rows` are the per-row labels
        `evaluate` writes out (from_frame passes them; without them only the tensor outputs are available).
        The rows are put in series order (see the class docstring), the labels with them.
        `quotes`: ``bid_px``, ``ask_px`` (the quote as of each bar's close) and ``open_bid_px``, ``open_ask_px``
        (as of its open), NaN where none: a fill pays the quote's half-spread (`quote_half_spreads`).
        """
        features = np.asarray(features, dtype=np.float32)
        opens = np.asarray(opens, dtype=np.float64)
        closes = np.asarray(closes, dtype=np.float64)
        instrument_id = np.asarray(instrument_id).astype(np.int64)
        ts_event_ns = np.asarray(ts_event_ns).astype(np.int64)
        n_rows = features.shape[0] if features.ndim == 2 else -1
        _check_arrays(features, opens, closes, instrument_id, ts_event_ns, n_rows)
        names = (
            list(feature_names) if feature_names is not None else [f"f{j}" for j in range(features.shape[1])]
        )
        if len(names) != features.shape[1]:
            raise EnvDataError(f"feature_names: expected {features.shape[1]} names, got {len(names)}")
        finite = np.isfinite(features).all(axis=0)
        if not finite.all():  # the normalizer maps NaN to 0; arrays from elsewhere must do the same
            raise EnvDataError(f"features: column {names[int(np.argmin(finite))]!r} holds NaN or inf")
        order, series = series_order(instrument_id, ts_event_ns, symbols)
        if order is not None:
            features, opens, closes = features[order], opens[order], closes[order]
            instrument_id, ts_event_ns = instrument_id[order], ts_event_ns[order]
            symbols = np.asarray(symbols)[order]
            rows = rows[order] if rows is not None else None
            quotes = None if quotes is None else {name: np.asarray(v)[order] for name, v in quotes.items()}
        new_segment, new_chain = segment_breaks(instrument_id, series, ts_event_ns, max_gap)
        segment_id = np.cumsum(new_segment).astype(np.int64) - 1
        segment_first, segment_last, segment_start = _runs(new_segment)
        chain_first, chain_last, chain_start = _runs(new_chain)
        is_decision = np.zeros(n_rows, dtype=bool)
        is_decision[:-1] = ~new_chain[1:]
        is_roll = np.zeros(n_rows, dtype=bool)
        is_roll[:-1] = new_segment[1:] & ~new_chain[1:]
        in_segment = is_decision & ~is_roll

        next_open = np.append(opens[1:], np.nan)
        next_close = np.append(closes[1:], np.nan)
        with np.errstate(invalid="ignore"):
            ret_open_close = np.where(is_decision, next_close / next_open - 1.0, 0.0)
            ret_close_close = np.where(in_segment, next_close / closes - 1.0, ret_open_close)
            ret_close_open = np.where(in_segment, next_open / closes - 1.0, 0.0)
        spread_close, spread_open = quote_half_spreads(quotes, n_rows)
        next_spread_open = np.append(spread_open[1:], np.nan)
        cost_close = cost_fractions(cost_model, closes, symbols, spread_close)
        cost_next_open = np.where(
            in_segment,
            cost_fractions(cost_model, np.where(in_segment, next_open, 1.0), symbols, next_spread_open),
            0.0,
        )
        roll_rows = np.flatnonzero(is_roll)
        roll_cost_close = np.where(is_roll, cost_close, 0.0)
        roll_cost_open = np.zeros(n_rows, dtype=np.float64)
        if roll_rows.size:  # the new contract's own spec, at its first open
            new_symbols = None if symbols is None else np.asarray(symbols)[roll_rows + 1]
            roll_cost_open[roll_rows] = cost_fractions(
                cost_model, opens[roll_rows + 1], new_symbols, spread_open[roll_rows + 1]
            )
        ticks_close = half_spread_ticks(cost_model, symbols, spread_close, n_rows)
        ticks_open = half_spread_ticks(cost_model, symbols, spread_open, n_rows)
        priced = np.isfinite(ticks_close)  # a bps model has no spread and no fallback
        quoted = quotes is not None

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
            is_roll=torch.as_tensor(is_roll, device=device),
            roll_cost_close=f32(roll_cost_close),
            roll_cost_open=f32(roll_cost_open),
            chain_start=torch.as_tensor(chain_start, device=device),
            chain_first=chain_first,
            chain_last=chain_last,
            half_spread_ticks_close=ticks_close,
            half_spread_ticks_open=ticks_open,
            fallback_close=quoted & priced & ~np.isfinite(spread_close),
            fallback_open=quoted & priced & ~np.isfinite(spread_open),
            quoted=quoted,
            rows=rows,
            feature_names=names,
            max_gap=max_gap,
            feature_clip=feature_clip,
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
        """[5, T] float32 (cached): gap return of the old position, return of the new position, cost fraction per
        unit of |Δposition|, and at roll rows the cost fractions per unit of |old| (closing the old contract)
        and of |new| (opening the new one); see `step_rewards`."""
        key = ("step_parameters", fill)
        if key not in self._cache:
            if fill == "close":
                trade_cost = torch.where(self.is_roll, 0.0, self.cost_close)
                parts = [torch.zeros_like(self.ret_close_close), self.ret_close_close, trade_cost]
            else:
                parts = [self.ret_close_open, self.ret_open_close, self.cost_next_open]
            self._cache[key] = torch.stack([*parts, self.roll_cost_close, self.roll_cost_open])
        return self._cache[key]

    def host_arrays(self, fill: FillMode) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host copies for numpy reference envs (cached, shared by every copy): features [T, F], step
        parameters [T, 5] (row-major, one row per bar) and segment_start [T]."""
        key = ("host_arrays", fill)
        if key not in self._cache:
            self._cache[key] = (
                np.ascontiguousarray(self.features.cpu().numpy()),
                np.ascontiguousarray(self.step_parameters(fill).cpu().numpy().T),
                self.segment_start.cpu().numpy(),
            )
        return self._cache[key]

    def episode_starts(self, episode_length: int) -> np.ndarray:
        """Rows where an episode of `episode_length` decisions fits inside one chain (host int64, cached): an
        episode may run through a roll, never through a gap."""
        key = ("episode_starts", episode_length)
        if key not in self._cache:
            room = self.chain_last - episode_length  # the last decision row must be < chain_last
            starts = [
                np.arange(first, last + 1)
                for first, last in zip(self.chain_first, room, strict=True)
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


def stack_market_data(parts: Sequence[MarketData]) -> tuple[MarketData, list[tuple[int, int]]]:
    """Several splits' rows as one `MarketData` (folds on the batch axis, `TradingEnv`'s ``block_rows``), and the
    rows [start, stop) each part holds in it.

    Each part keeps its own rows, normalization and costs; a part's last row ends its chain, so no segment,
    chain, window or episode reaches from one part into the next. The parts must share features, segmentation,
    feature clip and device. One part comes back as it is.
    """
    if not parts:
        raise EnvDataError("stack_market_data: expected at least one part")
    first = parts[0]
    for index, part in enumerate(parts[1:], start=1):
        for name in ("feature_names", "max_gap", "feature_clip", "device"):
            if getattr(part, name) != getattr(first, name):
                raise EnvDataError(
                    f"stack_market_data: part {index} has {name}={getattr(part, name)!r}, "
                    f"part 0 {getattr(first, name)!r}"
                )
    starts = np.cumsum([0] + [part.n_rows for part in parts]).astype(np.int64)
    ranges = [(int(start), int(stop)) for start, stop in itertools.pairwise(starts)]
    if len(parts) == 1:
        return first, ranges
    n_segments = np.cumsum([0] + [part.segment_first.shape[0] for part in parts])

    def cat(name: str) -> Any:
        values = [getattr(part, name) for part in parts]
        return torch.cat(values) if isinstance(values[0], torch.Tensor) else np.concatenate(values)

    def shifted(name: str, offsets: Sequence[int]) -> Any:
        values = [getattr(part, name) + int(offset) for part, offset in zip(parts, offsets, strict=True)]
        return torch.cat(values) if isinstance(values[0], torch.Tensor) else np.concatenate(values)

    labels = [part.rows for part in parts]
    rows = None
    if all(label is not None for label in labels):
        import polars as pl  # only where the parts carry row labels (read from a frame)

        rows = pl.concat(labels, how="vertical")
    plain = {
        name: cat(name)
        for name in (
            "obs_table", "ret_close_close", "ret_close_open", "ret_open_close", "cost_close", "cost_next_open",
            "close", "is_decision", "is_roll", "roll_cost_close", "roll_cost_open", "half_spread_ticks_close",
            "half_spread_ticks_open", "fallback_close", "fallback_open",
        )
    }  # fmt: skip
    row_offsets = starts[:-1]
    return (
        MarketData(
            **plain,
            segment_start=shifted("segment_start", row_offsets),
            segment_id=shifted("segment_id", n_segments[:-1]),
            segment_first=shifted("segment_first", row_offsets),
            segment_last=shifted("segment_last", row_offsets),
            chain_start=shifted("chain_start", row_offsets),
            chain_first=shifted("chain_first", row_offsets),
            chain_last=shifted("chain_last", row_offsets),
            quoted=any(part.quoted for part in parts),
            rows=rows,
            feature_names=list(first.feature_names),
            max_gap=first.max_gap,
            feature_clip=first.feature_clip,
            device=first.device,
        ),
        ranges,
    )


def _check_arrays(
    features: np.ndarray,
    opens: np.ndarray,
    closes: np.ndarray,
    instrument_id: np.ndarray,
    ts_event_ns: np.ndarray,
    n_rows: int,
) -> None:
    """Shapes, order and prices; messages name the column as a feature table calls it."""
    if n_rows < 0:
        raise EnvDataError(f"features: expected a 2-d array [rows, features], got shape {features.shape}")
    for name, values in (
        ("open", opens),
        ("close", closes),
        ("instrument_id", instrument_id),
        ("ts_event", ts_event_ns),
    ):
        if values.shape != (n_rows,):
            raise EnvDataError(
                f"feature table: column {name!r} has shape {values.shape}, expected ({n_rows},)"
            )
    if n_rows < 2:
        raise EnvDataError(f"feature table: expected at least 2 rows, got {n_rows}")
    same_instrument = np.diff(instrument_id) == 0
    if (np.diff(instrument_id) < 0).any() or (same_instrument & (np.diff(ts_event_ns) <= 0)).any():
        raise EnvDataError(
            "feature table: rows must be sorted by (instrument_id, ts_event) with unique timestamps per instrument"
        )
    for name, prices in (("open", opens), ("close", closes)):
        if not (np.isfinite(prices) & (prices > 0)).all():
            raise EnvDataError(f"feature table: column {name!r} must hold finite prices > 0")


def series_order(
    instrument_id: np.ndarray, ts_event_ns: np.ndarray, symbols: np.ndarray | None
) -> tuple[np.ndarray | None, np.ndarray]:
    """The row order that puts each continuous symbol's rows (all its contracts) in time order, and each row's
    series in that order: one per continuous symbol (ES.c.0), else the row's instrument.

    Rows sorted by (instrument_id, ts_event) come in; without continuous symbols the order is unchanged (None).
    Series keep the order of their first row. Two contracts of one continuous symbol at the same time is an
    error: a continuous symbol maps to one contract at a time.
    """
    n_rows = instrument_id.shape[0]
    if symbols is None:
        return None, instrument_id
    symbols = np.asarray(symbols, dtype=object)
    # Work on runs of equal (instrument, symbol): symbols change at a roll or a new instrument, not per row.
    new_run = np.ones(n_rows, dtype=bool)
    new_run[1:] = (instrument_id[1:] != instrument_id[:-1]) | (symbols[1:] != symbols[:-1])
    run_first = np.flatnonzero(new_run)
    run_symbols = [str(symbol) for symbol in symbols[run_first]]
    if not any(is_continuous(symbol) for symbol in run_symbols):
        return None, instrument_id
    series_of_key: dict[tuple[str, Any], int] = {}
    run_series = np.array(
        [
            series_of_key.setdefault(
                ("symbol", symbol) if is_continuous(symbol) else ("instrument", int(instrument)),
                len(series_of_key),
            )
            for symbol, instrument in zip(run_symbols, instrument_id[run_first], strict=True)
        ],
        dtype=np.int64,
    )
    row_series = np.repeat(run_series, np.diff(np.append(run_first, n_rows)))
    order = np.lexsort((ts_event_ns, row_series))  # stable: by series, then time
    series, ts = row_series[order], ts_event_ns[order]
    clash = np.flatnonzero((series[1:] == series[:-1]) & (ts[1:] == ts[:-1]))
    if clash.size:
        first, second = order[clash[0]], order[clash[0] + 1]
        raise EnvDataError(
            f"feature table: continuous symbol {symbols[first]!r} has bars of two instruments "
            f"({instrument_id[first]}, {instrument_id[second]}) at "
            f"{np.datetime_as_string(np.datetime64(int(ts[clash[0]]), 'ns'), unit='s')}Z; "
            "a continuous symbol maps to one contract at a time"
        )
    return order, series


def segment_breaks(
    instrument_id: np.ndarray, series: np.ndarray, ts_event_ns: np.ndarray, max_gap: timedelta | None
) -> tuple[np.ndarray, np.ndarray]:
    """(new_segment, new_chain) [T] bool for rows in series order: a segment starts at each new instrument, new
    series and weekday-time gap > max_gap; a chain only at a new series or such a gap, so it runs through the
    rolls of a continuous symbol."""
    new_chain = np.ones(instrument_id.shape[0], dtype=bool)
    new_chain[1:] = series[1:] != series[:-1]
    if max_gap is not None:
        weekday_ns = _weekday_time_ns(ts_event_ns)
        max_gap_ns = int(max_gap.total_seconds() * 1e9)
        new_chain[1:] |= np.diff(weekday_ns) > max_gap_ns
    new_segment = new_chain.copy()
    new_segment[1:] |= instrument_id[1:] != instrument_id[:-1]
    return new_segment, new_chain


def _runs(is_new: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first rows, last rows inclusive, first row of each row's run) of the runs that `is_new` [T] starts."""
    first = np.flatnonzero(is_new).astype(np.int64)
    last = np.append(first[1:] - 1, is_new.shape[0] - 1).astype(np.int64)
    return first, last, np.repeat(first, last - first + 1)


def _weekday_time_ns(epoch_ns: np.ndarray) -> np.ndarray:
    """Nanoseconds since 1970-01-01 counting only Monday–Friday (UTC): weekend time stands still."""
    days = np.floor_divide(epoch_ns, _NS_PER_DAY)
    dates = days.astype("datetime64[D]")
    weekdays_before = np.busday_count(np.datetime64("1970-01-01", "D"), dates).astype(np.int64)
    time_of_day = np.where(np.is_busday(dates), epoch_ns - days * _NS_PER_DAY, 0)
    return weekdays_before * _NS_PER_DAY + time_of_day


def quote_half_spreads(quotes: Mapping[str, np.ndarray] | None, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Half-spreads (ask − bid) / 2 in price units of the quote as of each bar's close and as of its open, [T]
    float64 each; NaN where there is no usable quote (missing, zero or crossed: bid <= 0 or ask <= bid) and
    everywhere without `quotes`."""
    if quotes is None:
        return np.full(n_rows, np.nan), np.full(n_rows, np.nan)
    missing = [key for key in QUOTE_KEYS if key not in quotes]
    if missing:
        raise EnvDataError(f"feature table: quote column {missing[0]!r} is missing")
    halves = []
    for bid_key, ask_key in (("bid_px", "ask_px"), ("open_bid_px", "open_ask_px")):
        bid = np.asarray(quotes[bid_key], dtype=np.float64)
        ask = np.asarray(quotes[ask_key], dtype=np.float64)
        with np.errstate(invalid="ignore"):
            usable = np.isfinite(bid) & np.isfinite(ask) & (bid > 0) & (ask > bid)
        halves.append(np.where(usable, (ask - bid) / 2.0, np.nan))
    return halves[0], halves[1]


def _models_by_row(
    cost_model: CostModel | InstrumentCosts | Mapping[str, CostModel], symbols: np.ndarray | None, n_rows: int
) -> list[tuple[CostModel, np.ndarray | slice]]:
    """(model, rows) pairs covering every row: one model, or each symbol's own (per root or per symbol)."""
    if isinstance(cost_model, CostModel):
        return [(cost_model, slice(0, n_rows))]
    if symbols is None:
        raise EnvDataError("costs: a cost model per instrument needs the symbol of every row")
    symbols = np.asarray(symbols)
    pairs: list[tuple[CostModel, np.ndarray | slice]] = []
    for symbol in np.unique(symbols):
        if isinstance(cost_model, InstrumentCosts):
            try:
                model = cost_model.for_symbol(str(symbol))
            except CostConfigError as exc:
                raise EnvDataError(str(exc)) from None
        elif symbol in cost_model:
            model = cost_model[symbol]
        else:
            raise EnvDataError(f"costs: no cost model for symbol {symbol!r}")
        pairs.append((model, symbols == symbol))
    return pairs


def cost_fractions(
    cost_model: CostModel | InstrumentCosts | Mapping[str, CostModel],
    prices: np.ndarray,
    symbols: np.ndarray | None,
    half_spread: np.ndarray | None = None,
) -> np.ndarray:
    """Cost per unit of |Δposition| as a fraction of notional at `prices`, from one model, one per symbol root
    (`InstrumentCosts`: each row priced with its own contract's spec) or one per symbol; with `half_spread`
    (price units, NaN: none) the quote's half-spread replaces the configured one (`CostModel.quoted_cost_fraction`)."""
    prices = np.asarray(prices, dtype=np.float64)
    out = np.empty(len(prices), dtype=np.float64)
    for model, rows in _models_by_row(cost_model, symbols, len(prices)):
        if half_spread is None:
            out[rows] = model.cost_fraction(prices[rows])
        else:
            out[rows] = model.quoted_cost_fraction(prices[rows], half_spread[rows])
    return out


def half_spread_ticks(
    cost_model: CostModel | InstrumentCosts | Mapping[str, CostModel],
    symbols: np.ndarray | None,
    half_spread: np.ndarray,
    n_rows: int,
) -> np.ndarray:
    """The half-spread a fill pays per row, in ticks of the row's contract: the quote's (`half_spread`, price
    units) where finite, else the configured ``half_spread_ticks``; NaN under a bps model (no ticks)."""
    out = np.full(n_rows, np.nan)
    for model, rows in _models_by_row(cost_model, symbols, n_rows):
        if model.kind == "futures":
            quoted = half_spread[rows] / model.tick_size
            out[rows] = np.where(np.isfinite(quoted), quoted, model.half_spread_ticks)
    return out
