"""K traders on the same test rows scored at once: positions [K, T] in, per-trader daily returns and performance
summaries out, with the same numbers as the per-trader path (`evaluate_positions` then `performance_summary`).

The per-bar work (rewards, the equal-weight portfolio, daily compounding, position changes and holding periods)
runs as batched tensor ops on the data's device, with scatter sums and products over precomputed group ids; only
the per-day statistics (a few numbers per trader) run per trader, through `marketrl.scoring.metrics.summarize`.
No polars frame per trader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from marketrl.env import EnvConfig, MarketData, decision_results
from marketrl.scoring.metrics import MetricsInputError, summarize

#: traders per batch: bounds the [chunk, decision bars] float64 temporaries (~28 MB each at 64 × 55k bars)
DEFAULT_CHUNK = 64
#: on the CPU fewer: [8, 55k] float64 temporaries stay in cache, and 255 traders of a demo fold score in 0.8 CPU-s
#: instead of 1.2-1.9 at 64 (docs/PERFORMANCE.md, Evaluation); a trader's scores do not depend on its chunk
CPU_CHUNK = 8


@dataclass(frozen=True)
class BarLayout:
    """How the decision bars of one MarketData group, as `performance_summary` groups the per-bar table.

    bar_id [D]: the portfolio bar (distinct ts_event of the bar it earns over) of each decision bar; day_id [B]:
    the session day of each portfolio bar; by_symbol [D]: the decision bars in (symbol, ts_event) order;
    symbol_start [D]: in that order, True at each symbol's first bar. Device tensors except `days`.
    """

    bar_id: torch.Tensor
    day_id: torch.Tensor
    by_symbol: torch.Tensor
    symbol_start: torch.Tensor
    days: np.ndarray  # [n_days] datetime64[D], ascending
    n_bars: int
    n_instruments: int

    @classmethod
    def of(cls, data: MarketData) -> BarLayout:
        """The layout of `data`'s decision bars (labelled like `marketrl.env.frames.bar_frame`)."""
        if data.rows is None:
            raise MetricsInputError(
                "batched scoring: the MarketData has no row labels (use MarketData.from_frame)"
            )
        decision_rows = np.flatnonzero(data.is_decision.cpu().numpy())
        earning = data.rows[
            decision_rows + 1
        ]  # a decision bar earns over the next bar, and is labelled by it
        ts = earning["ts_event"].dt.epoch("ns").to_numpy()
        trading_day = earning["trading_day"].to_numpy().astype("datetime64[D]")
        symbol = data.rows["symbol"].to_numpy()[decision_rows]
        if decision_rows.size == 0:
            raise MetricsInputError("per-bar table: expected at least one bar, got an empty table")
        bar_ts, bar_id = np.unique(ts, return_inverse=True)
        bar_day = np.empty(bar_ts.size, dtype="datetime64[D]")
        bar_day[bar_id] = trading_day
        days, day_id = np.unique(bar_day, return_inverse=True)
        symbols, symbol_id = np.unique(symbol, return_inverse=True)
        by_symbol = np.lexsort((ts, symbol_id))
        sorted_symbol = symbol_id[by_symbol]
        symbol_start = np.r_[True, sorted_symbol[1:] != sorted_symbol[:-1]]

        def device(values: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(values, device=data.device)

        return cls(
            bar_id=device(bar_id.astype(np.int64)),
            day_id=device(day_id.astype(np.int64)),
            by_symbol=device(by_symbol.astype(np.int64)),
            symbol_start=device(symbol_start),
            days=days,
            n_bars=int(bar_ts.size),
            n_instruments=int(symbols.size),
        )


@dataclass(frozen=True)
class TraderScores:
    """Scores of K traders: session days [n_days] (datetime64[D]), daily net portfolio returns [K, n_days], and
    each trader's `performance_summary` and daily gross returns [K, n_days] (both None when not asked for)."""

    days: np.ndarray
    daily_net_returns: np.ndarray
    summaries: list[dict[str, Any]] | None
    daily_gross_returns: np.ndarray | None = None


def _group_sum(values: torch.Tensor, group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Per-row sums [K, n_groups] of `values` [K, N] over the columns of each group id `group` [N]."""
    out = values.new_zeros(values.shape[0], n_groups)
    return out.index_add_(1, group, values)


def _group_prod(values: torch.Tensor, group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Per-row products [K, n_groups] of `values` [K, N] over the columns of each group id `group` [N]."""
    out = values.new_ones(values.shape[0], n_groups)
    return out.scatter_reduce_(1, group.expand_as(values), values, reduce="prod")


def score_positions(
    data: MarketData,
    positions: torch.Tensor,
    config: EnvConfig,
    *,
    summaries: bool = True,
    layout: BarLayout | None = None,
    chunk: int | None = None,
) -> TraderScores:
    """Score K traders' target positions [K, T] (as `evaluate_positions` would, one at a time) on `data`: daily
    net portfolio returns per trader and, with `summaries`, each trader's `performance_summary`. `chunk` traders
    are scored at a time (default CPU_CHUNK on the CPU, DEFAULT_CHUNK elsewhere)."""
    layout = layout or BarLayout.of(data)
    chunk = chunk or (CPU_CHUNK if data.device.type == "cpu" else DEFAULT_CHUNK)
    daily, daily_gross, per_trader = [], [], []
    for first in range(0, positions.shape[0], chunk):
        chunk_daily, chunk_gross, chunk_summaries = _score_chunk(
            data, positions[first : first + chunk], config, layout, summaries
        )
        daily.append(chunk_daily)
        daily_gross.append(chunk_gross)
        per_trader.extend(chunk_summaries)
    empty = np.zeros((0, layout.days.size))
    daily_returns = np.concatenate(daily) if daily else empty
    if not summaries:
        return TraderScores(layout.days, daily_returns, None)
    gross_returns = np.concatenate(daily_gross) if daily_gross else empty
    return TraderScores(layout.days, daily_returns, per_trader, gross_returns)


def bar_net_returns(
    data: MarketData, positions: torch.Tensor, config: EnvConfig, layout: BarLayout | None = None
) -> np.ndarray:
    """Net portfolio return per bar [K, n_bars] (float64) of K traders' target positions [K, T], the series
    `performance_summary`'s ``bar_sharpe`` is taken over."""
    layout = layout or BarLayout.of(data)
    results = decision_results(data, positions, config)
    net = results.gross_return.double() - results.cost.double()
    return (_group_sum(net, layout.bar_id, layout.n_bars) / layout.n_instruments).cpu().numpy()


def _score_chunk(
    data: MarketData, positions: torch.Tensor, config: EnvConfig, layout: BarLayout, summaries: bool
) -> tuple[np.ndarray, np.ndarray | None, list[dict[str, Any]]]:
    results = decision_results(data, positions, config)
    # float64 from here on, as the per-bar table stores them; net = gross − cost in float64, as it does
    gross = results.gross_return.double()
    cost = results.cost.double()
    net = gross - cost
    if not bool(torch.isfinite(net).all()):
        raise MetricsInputError("per-bar table: column 'net_return' must be finite (found NaN or inf)")
    n_days = layout.days.size
    bar_net = _group_sum(net, layout.bar_id, layout.n_bars) / layout.n_instruments
    day_net = _group_prod(1.0 + bar_net, layout.day_id, n_days) - 1.0
    if not summaries:
        return day_net.cpu().numpy(), None, []
    bar_gross = _group_sum(gross, layout.bar_id, layout.n_bars) / layout.n_instruments
    day_gross = _group_prod(1.0 + bar_gross, layout.day_id, n_days) - 1.0
    total_cost = (_group_sum(cost, layout.bar_id, layout.n_bars) / layout.n_instruments).sum(1)

    # Position changes and holding periods per symbol, in (symbol, ts_event) order; flat before a symbol's first bar.
    position = results.position.double().round().index_select(1, layout.by_symbol)
    net_by_symbol = net.index_select(1, layout.by_symbol)
    previous = torch.cat([position.new_zeros(position.shape[0], 1), position[:, :-1]], dim=1)
    previous = torch.where(layout.symbol_start, torch.zeros_like(previous), previous)
    abs_change = (position - previous).abs()
    starts_period = layout.symbol_start | (position != previous)
    period = starts_period.long().cumsum(1) - 1  # holding-period id, unique across symbols
    held = position != 0
    # a holding period's trade return compounds its bars' net returns (flat periods are no trade)
    growth = _group_prod(torch.where(held, 1.0 + net_by_symbol, 1.0), period, position.shape[1])
    trade_won = (growth.gather(1, period) - 1.0 > 0) & starts_period & held
    n_holding = (starts_period & held).sum(1)
    aggregates = {
        "total_abs_position_change": abs_change.sum(1),
        "n_holding_periods": n_holding,
        "trade_wins": trade_won.sum(1),
        "exposure": held.double().mean(1),
        "n_trades": (abs_change > 0).sum(1),
        "total_cost": total_cost,
    }
    host = {name: values.cpu().numpy() for name, values in aggregates.items()}
    day_net_host, day_gross_host, bar_net_host = (x.cpu().numpy() for x in (day_net, day_gross, bar_net))
    out = []
    for k in range(positions.shape[0]):
        n_periods = int(host["n_holding_periods"][k])
        out.append(
            summarize(
                days=layout.days,
                day_returns=day_net_host[k],
                gross_day_returns=day_gross_host[k],
                bar_returns=bar_net_host[k],
                n_instruments=layout.n_instruments,
                total_abs_position_change=float(host["total_abs_position_change"][k]),
                trade_hit_rate=int(host["trade_wins"][k]) / n_periods if n_periods else float("nan"),
                n_holding_periods=n_periods,
                exposure=float(host["exposure"][k]),
                n_trades=int(host["n_trades"][k]),
                total_cost=float(host["total_cost"][k]),
            )
        )
    return day_net_host, day_gross_host, out
