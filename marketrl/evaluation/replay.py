"""A second opinion on marketrl's PnL: one position series replayed through NautilusTrader (`make replay`).

marketrl's side is its own accounting (`marketrl.env.position_results`, the function evaluation scores with),
turned into currency with the notional each return is a fraction of. Nautilus's side is its backtest engine
(`marketrl.evaluation.nautilus_replay`) with the same contract specs, fed market orders that move its position to
the same targets at the same instants, and filled either at the bar's close (``fill="close"``, marketrl's
``env.fill: close``; each fill pays as a per-contract fee exactly the cost marketrl charges for it: commission
plus the half-spread, the quote's or the configured one) or at the quote (``fill="quotes"``: a buy at the ask, a
sell at the bid, commission only). The page and JSON put both per day and in total, and split the gap into
fill price, fees and chain ends (docs/REPLAY.md).

CLI: ``python -m marketrl.evaluation.replay --positions FILE | --rule RULE --prices GLOB --config FILE --out DIR``.
"""

from __future__ import annotations

import argparse
import glob
import html
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from marketrl.data.definitions import resolve_definitions
from marketrl.data.quotes import bar_quotes, quotes_at_bars
from marketrl.data.reader import parse_bar_size, read_bars
from marketrl.env import EnvConfig, MarketData, position_results, rule_positions
from marketrl.env.config import QUOTE_KEYS
from marketrl.env.market_data import cost_fractions, quote_half_spreads
from marketrl.evaluation.nautilus_replay import (
    Contract,
    EngineResult,
    PriceEvent,
    ReplayEngineError,
    nautilus_version,
    run_nautilus,
)
from marketrl.instruments.costs import CostModel, Costs, InstrumentCosts, costs_from_config
from marketrl.instruments.symbols import symbol_root
from marketrl.runtime.io import atomic_writes, json_text
from marketrl.settings import paths
from marketrl.settings.config import load_config

FILLS = ("close", "quotes")
BAR_NS = 60_000_000_000


class ReplayError(ValueError):
    """Bad replay input: a one-line message naming the file or option."""


@dataclass(frozen=True)
class Prepared:
    """The rows in marketrl's series order, its MarketData and the target of each row (units of contracts)."""

    rows: pl.DataFrame
    data: MarketData
    target: np.ndarray
    costs: Costs
    env: EnvConfig


def _spec(costs: Costs, symbol: str) -> CostModel:
    return costs.for_symbol(symbol) if isinstance(costs, InstrumentCosts) else costs


def load_prices(pattern: str, *, days: set[Any] | None = None, bar_size: str = "1m") -> pl.DataFrame:
    """Bars of every file matching ``pattern``: marketrl feature tables (``.parquet``) or Databento files
    (``.dbn.zst``/``.dbn``, decoded by `marketrl.data.reader.read_bars`; a quote schema's top of book gives the
    quote columns), kept to ``days`` (trading days) when given, sorted by (instrument_id, ts_event)."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise ReplayError(f"{pattern}: no price file matches")
    keep = ["ts_event", "trading_day", "instrument_id", "symbol", "open", "high", "low", "close", *QUOTE_KEYS]
    frames = []
    for path in paths:
        if path.endswith(".parquet"):
            frame = pl.read_parquet(path)
            if days is not None:
                frame = frame.filter(pl.col("trading_day").is_in(sorted(days)))
        elif path.endswith((".dbn.zst", ".dbn")):
            bars = read_bars(path, bar_size).bars
            frame = bars.drop([c for c in ("bid_px", "ask_px") if c in bars.columns])
            if "bid_px" in bars.columns:
                frame = quotes_at_bars(
                    frame, bar_quotes(bars, parse_bar_size(bar_size)), parse_bar_size(bar_size)
                )
        else:
            raise ReplayError(f"{path}: expected a feature table (.parquet) or a Databento file (.dbn.zst)")
        missing = [c for c in keep[:8] if c not in frame.columns]
        if missing:
            raise ReplayError(f"{path}: column {missing[0]!r} is missing")
        frames.append(frame.select([c for c in keep if c in frame.columns]))
    prices = pl.concat(frames, how="diagonal_relaxed").sort("instrument_id", "ts_event")
    if prices.is_empty():
        raise ReplayError(f"{pattern}: no bars on the positions' trading days")
    return prices


def load_positions(path: str | Path, *, strategy: str | None = None) -> pl.DataFrame:
    """A per-bar position file: an evaluation's ``bars.parquet``, a baseline's with ``strategy``, or any parquet
    with its key columns: ``symbol``, ``ts_event`` (the bar the decision earns over, i.e. the next bar of the
    series), ``trading_day`` and ``position`` (contracts)."""
    path = Path(path)
    if not path.is_file():
        raise ReplayError(f"{path}: positions file is missing (run `make run` first, or pass --positions)")
    try:
        frame = pl.read_parquet(path)
    except Exception as exc:  # any unreadable file is one line naming it
        raise ReplayError(f"{path}: cannot read positions: {str(exc).splitlines()[0]}") from exc
    if "strategy" in frame.columns:
        if strategy is None:
            names = sorted(frame["strategy"].unique().to_list())
            raise ReplayError(
                f"{path}: holds several strategies ({', '.join(names[:4])}, ...); pass --strategy"
            )
        frame = frame.filter(pl.col("strategy") == strategy)
        if frame.is_empty():
            raise ReplayError(f"{path}: no rows of strategy {strategy!r}")
    for column in ("symbol", "ts_event", "position", "trading_day"):
        if column not in frame.columns:
            raise ReplayError(f"{path}: column {column!r} is missing")
    return frame


def prepare(
    prices: pl.DataFrame,
    positions: pl.DataFrame | None,
    config: dict[str, Any],
    *,
    rule: str = "",
    lookback: int = 30,
    source: str = "positions",
) -> Prepared:
    """marketrl's view of the replay: its MarketData over ``prices`` and each row's target (from ``positions``
    keyed by (instrument_id, decision_ts_event), or the baseline ``rule``)."""
    env = EnvConfig.from_config(config["env"])
    if env.fill != "close":
        raise ReplayError(f"{source}: env.fill {env.fill!r}: the replay supports env.fill close only")
    costs = costs_from_config(config["costs"])
    quotes = all(c in prices.columns for c in QUOTE_KEYS)
    rows = prices.with_row_index("_row")
    data = MarketData.from_arrays(
        np.zeros((rows.height, 1), dtype=np.float32),
        opens=rows["open"].to_numpy(),
        closes=rows["close"].to_numpy(),
        instrument_id=rows["instrument_id"].to_numpy(),
        ts_event_ns=rows["ts_event"].dt.epoch("ns").to_numpy(),
        cost_model=costs,
        symbols=rows["symbol"].to_numpy(),
        max_gap=env.max_gap,
        rows=rows,
        quotes={c: rows[c].cast(pl.Float64).fill_null(np.nan).to_numpy() for c in QUOTE_KEYS}
        if quotes
        else None,
    )
    ordered = data.rows
    assert ordered is not None
    if positions is None:
        target = rule_positions(data, rule, lookback=lookback).cpu().numpy().astype(np.float64)
    else:
        target = _targets_of(ordered, data, positions, env, source)
    target = np.where(data.is_decision.cpu().numpy(), target, 0.0)
    return Prepared(rows=ordered, data=data, target=target, costs=costs, env=env)


def _decision_keys(ordered: pl.DataFrame, data: MarketData) -> pl.DataFrame:
    """Each row's key in a bars.parquet: its symbol and the time of the bar it earns over (the next row in
    series order); null on rows that decide nothing."""
    decision = pl.Series(data.is_decision.cpu().numpy())
    return ordered.select(
        pl.when(decision).then(pl.col("symbol")).alias("symbol"),
        pl.when(decision).then(pl.col("ts_event").shift(-1)).alias("ts_event"),
    )


def _targets_of(
    ordered: pl.DataFrame, data: MarketData, positions: pl.DataFrame, env: EnvConfig, source: str
) -> np.ndarray:
    """Each row's target (units of env.contracts) from a position file keyed like bars.parquet: ``symbol`` and
    ``ts_event`` of the bar the decision earns over."""
    keyed = positions.select(
        pl.col("symbol").cast(pl.String),
        pl.col("ts_event").cast(ordered.schema["ts_event"]),
        (pl.col("position").cast(pl.Float64) / env.contracts).alias("_target"),
    )
    if keyed.select("symbol", "ts_event").is_duplicated().any():
        raise ReplayError(f"{source}: two positions for one bar")
    joined = _decision_keys(ordered, data).join(
        keyed, on=["symbol", "ts_event"], how="left", maintain_order="left"
    )
    found = int(joined["_target"].is_not_null().sum())
    if found != positions.height:
        raise ReplayError(
            f"{source}: {positions.height - found} of {positions.height} positions are at bars missing from "
            "the price files (pass the feature tables of the run's test days)"
        )
    return joined["_target"].fill_null(0.0).to_numpy()


def _row_arrays(prep: Prepared) -> dict[str, np.ndarray]:
    rows, data = prep.rows, prep.data
    symbols = rows["symbol"].to_numpy()
    n = rows.height
    point_value = np.array(
        [_spec(prep.costs, s).tick_value / _spec(prep.costs, s).tick_size for s in symbols]
    )
    quotes = (
        {c: rows[c].cast(pl.Float64).fill_null(np.nan).to_numpy() for c in QUOTE_KEYS}
        if data.quoted
        else None
    )
    spread_close, spread_open = quote_half_spreads(quotes, n)
    closes, opens = rows["close"].to_numpy(), rows["open"].to_numpy()
    return {
        "close": closes,
        "open": opens,
        "high": rows["high"].to_numpy(),
        "low": rows["low"].to_numpy(),
        "pv": point_value,
        "iid": rows["instrument_id"].cast(pl.Int64).to_numpy(),
        "ts_open": rows["ts_event"].dt.epoch("ns").to_numpy(),
        "day": np.array([str(d) for d in rows["trading_day"].to_list()]),
        "decision": data.is_decision.cpu().numpy(),
        "roll": data.is_roll.cpu().numpy(),
        "chain_start": data.chain_start.cpu().numpy(),
        # marketrl's cost per contract (currency) of a fill at close_t / at open_t: its own cost fractions x notional
        "fee_close": cost_fractions(prep.costs, closes, symbols, spread_close) * closes * point_value,
        "fee_open": cost_fractions(prep.costs, opens, symbols, spread_open) * opens * point_value,
        "bid": quotes["bid_px"] if quotes else np.full(n, np.nan),
        "ask": quotes["ask_px"] if quotes else np.full(n, np.nan),
        "open_bid": quotes["open_bid_px"] if quotes else np.full(n, np.nan),
        "open_ask": quotes["open_ask_px"] if quotes else np.full(n, np.nan),
        "tick": np.array([_spec(prep.costs, s).tick_size for s in symbols]),
        "commission": np.array([_spec(prep.costs, s).commission_per_contract for s in symbols]),
        "ticks_close": data.half_spread_ticks_close,
        "ticks_open": data.half_spread_ticks_open,
    }


def marketrl_dollars(prep: Prepared) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """marketrl's per-row gross PnL and cost in currency (decision rows; 0 elsewhere) and each row's day label
    (the trading day of the bar it earns over, as in bars.parquet). Its returns are fractions of one contract's
    notional at the fill price (close_t; at a roll: the new contract's open for the gain, each leg's own price
    for its cost), multiplied back here."""
    a = _row_arrays(prep)
    data = prep.data
    res = position_results(data, prep.target, prep.env)
    gross = res.gross_return.cpu().numpy().astype(np.float64)
    cost = res.cost.cpu().numpy().astype(np.float64)
    c = float(prep.env.contracts)
    target = prep.target
    previous = np.concatenate([[0.0], target[:-1]])
    previous = np.where(np.arange(len(target)) == a["chain_start"], 0.0, previous)
    nxt = np.minimum(np.arange(len(target)) + 1, len(target) - 1)
    notional = a["close"] * a["pv"]
    gross_usd = np.where(a["roll"], gross * a["open"][nxt] * a["pv"][nxt], gross * notional)
    roll_close = data.roll_cost_close.cpu().numpy().astype(np.float64)
    roll_open = data.roll_cost_open.cpu().numpy().astype(np.float64)
    roll_cost = c * (
        np.abs(previous) * roll_close * notional + np.abs(target) * roll_open * a["open"][nxt] * a["pv"][nxt]
    )
    cost_usd = np.where(a["roll"], roll_cost, cost * notional)
    decision = a["decision"]
    gross_usd = np.where(decision, gross_usd, 0.0)
    cost_usd = np.where(decision, cost_usd, 0.0)
    label = np.where(decision, a["day"][nxt], a["day"])
    return gross_usd, cost_usd, label


@dataclass(frozen=True)
class Schedule:
    """What Nautilus is fed: its contracts, price events in time order, targets, and for each scheduled instant
    marketrl's reference for the fill (price, fee per contract, the day the fill is labelled with, its kind) and,
    with quote fills, the quote's half-spread (price units; 0 with bar fills)."""

    contracts: dict[int, Contract]
    events: list[PriceEvent]
    targets: dict[tuple[int, int], float]
    reference: dict[tuple[int, int], tuple[float, float, str, str]]
    half_spread: dict[tuple[int, int], float]


def build_schedule(prep: Prepared, fill: str) -> Schedule:
    """The market orders of ``prep``'s targets, as Nautilus events: each decision at close_t is an order at the
    bar's close; at a roll the old contract is closed at close_a and the new one opened at open_b (an event at
    the new contract's open: its open price, or its open quote); at a chain's last bar the position is closed
    (marketrl drops it without a fill: the chain-end part of the gap)."""
    if fill not in FILLS:
        raise ReplayError(f"--fill: expected one of {', '.join(FILLS)}, got {fill!r}")
    a = _row_arrays(prep)
    if fill == "quotes" and not prep.data.quoted:
        raise ReplayError("--fill quotes: the price data carries no quotes (bid_px, ask_px)")
    c = float(prep.env.contracts)
    n = len(prep.target)
    contracts: dict[int, Contract] = {}
    symbols = prep.rows["symbol"].to_numpy()
    for i in range(n):
        iid = int(a["iid"][i])
        if iid not in contracts:
            spec = _spec(prep.costs, str(symbols[i]))
            if spec.kind != "futures":
                raise ReplayError(
                    "costs.model: the replay needs futures contract specs (costs.model futures)"
                )
            contracts[iid] = Contract(
                name=f"{symbol_root(str(symbols[i]))}-{iid}",
                tick_size=spec.tick_size,
                point_value=spec.tick_value / spec.tick_size,
                currency=spec.currency or "USD",
            )
    events: list[tuple[int, int, PriceEvent]] = []
    targets: dict[tuple[int, int], float] = {}
    reference: dict[tuple[int, int], tuple[float, float, str, str]] = {}
    half_spread: dict[tuple[int, int], float] = {}

    def quote(bid: float, ask: float, price: float, ticks: float, tick: float) -> tuple[float, float]:
        if np.isfinite(bid) and np.isfinite(ask) and 0 < bid < ask:
            return bid, ask
        half = ticks * tick  # marketrl's fallback: the configured half-spread around the trade price
        return price - half, price + half

    for i in range(n):
        iid, ts_close = int(a["iid"][i]), int(a["ts_open"][i]) + BAR_NS
        if fill == "quotes":
            bid, ask = quote(a["bid"][i], a["ask"][i], a["close"][i], a["ticks_close"][i], a["tick"][i])
            events.append((ts_close, 1, PriceEvent(iid, ts_close, bid=bid, ask=ask)))
            half_spread[(iid, ts_close)] = (ask - bid) / 2
        else:
            p = (a["open"][i], a["high"][i], a["low"][i], a["close"][i])
            events.append(
                (ts_close, 1, PriceEvent(iid, ts_close, open=p[0], high=p[1], low=p[2], close=p[3]))
            )
        fee_close = float(a["commission"][i] if fill == "quotes" else a["fee_close"][i])
        if not a["decision"][i]:
            targets[(iid, ts_close)] = 0.0
            reference[(iid, ts_close)] = (float(a["close"][i]), fee_close, str(a["day"][i]), "chain_end")
            continue
        label = str(a["day"][i + 1])
        if a["roll"][i]:
            targets[(iid, ts_close)] = 0.0
            reference[(iid, ts_close)] = (float(a["close"][i]), fee_close, label, "decision")
            b = i + 1
            new, ts_b = int(a["iid"][b]), int(a["ts_open"][b])
            if fill == "quotes":
                bid, ask = quote(
                    a["open_bid"][b], a["open_ask"][b], a["open"][b], a["ticks_open"][b], a["tick"][b]
                )
                events.append((ts_b, 0, PriceEvent(new, ts_b, bid=bid, ask=ask)))
                half_spread[(new, ts_b)] = (ask - bid) / 2
            else:
                o = float(a["open"][b])
                events.append((ts_b, 0, PriceEvent(new, ts_b, open=o, high=o, low=o, close=o)))
            targets[(new, ts_b)] = c * float(prep.target[i])
            fee_open = float(a["commission"][b] if fill == "quotes" else a["fee_open"][b])
            reference[(new, ts_b)] = (float(a["open"][b]), fee_open, label, "roll_open")
        else:
            targets[(iid, ts_close)] = c * float(prep.target[i])
            reference[(iid, ts_close)] = (float(a["close"][i]), fee_close, label, "decision")
    events.sort(key=lambda e: (e[0], e[1]))
    return Schedule(contracts, [e[2] for e in events], targets, reference, half_spread)


def nautilus_daily(prep: Prepared, schedule: Schedule, result: EngineResult) -> dict[str, dict[str, float]]:
    """Nautilus's PnL per day label from its fills (price, quantity, commission as Nautilus made them), marked
    at the bars' closes: a fill's own part (its price against the bar's close, less its commission) goes to the
    day marketrl labels that decision with, a held position's bar-to-bar change to the day of the later bar.
    Also each day's gap parts: ``fill_price`` (Nautilus's price against marketrl's), ``fees`` (Nautilus's
    commissions) and ``chain_end`` (the closing fills at chains' last bars)."""
    a = _row_arrays(prep)
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    position: dict[int, float] = defaultdict(float)
    fills_at: dict[tuple[int, int], list[Any]] = defaultdict(list)
    for f in result.fills:
        key = (f.instrument_id, f.ts_ns)
        if key not in schedule.reference:
            raise ReplayError(
                f"nautilus: a fill of {schedule.contracts[f.instrument_id].name} at {f.ts_ns} was not scheduled"
            )
        fills_at[key].append(f)
    # walk each instrument's bars in time order; fills at an open come before that bar's close
    order = np.lexsort((a["ts_open"], a["iid"]))
    last_close: dict[int, float] = {}
    for i in order:
        iid, ts_open, ts_close = int(a["iid"][i]), int(a["ts_open"][i]), int(a["ts_open"][i]) + BAR_NS
        close, pv, day = float(a["close"][i]), float(a["pv"][i]), str(a["day"][i])
        opening = schedule.reference.get((iid, ts_open), (0.0, 0.0, "", ""))[3] == "roll_open"
        for f in fills_at.get((iid, ts_open), []) if opening else []:  # a roll's opening fill at this open
            ref, _fee, label, kind = schedule.reference[(iid, ts_open)]
            _book(out[label], f, close, ref, pv, kind, schedule.half_spread.get((iid, ts_open), 0.0))
            position[iid] += f.quantity
        if iid in last_close:
            out[day]["nautilus"] += position[iid] * (close - last_close[iid]) * pv
        last_close[iid] = close
        for f in fills_at.get((iid, ts_close), []):
            ref, _fee, label, kind = schedule.reference[(iid, ts_close)]
            _book(out[label], f, close, ref, pv, kind, schedule.half_spread.get((iid, ts_close), 0.0))
            position[iid] += f.quantity
    return {day: dict(parts) for day, parts in out.items()}


def _book(day: dict[str, float], f: Any, close: float, ref: float, pv: float, kind: str, half: float) -> None:
    own = f.quantity * (close - f.price) * pv - f.commission
    day["nautilus"] += own
    if kind == "chain_end":
        day["chain_end"] += own
    else:
        day["fill_price"] += f.quantity * (ref - f.price) * pv
        day["fill_spread"] -= abs(f.quantity) * half * pv
        day["nautilus_fees"] += f.commission


def replay(prep: Prepared, fill: str = "close") -> dict[str, Any]:
    """Replay ``prep`` through NautilusTrader and compare: per day and in total, marketrl's PnL, Nautilus's, the
    gap (Nautilus − marketrl) and its parts (fill price, fees, chain ends, residual), in currency."""
    schedule = build_schedule(prep, fill)
    schedule_fees = {key: ref[1] for key, ref in schedule.reference.items()}
    result = run_nautilus(
        schedule.contracts, schedule.events, schedule.targets, quotes=fill == "quotes", fees=schedule_fees
    )
    gross, cost, label = marketrl_dollars(prep)
    ours: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for g, c_, d in zip(gross, cost, label, strict=True):
        ours[d][0] += g
        ours[d][1] += c_
    theirs = nautilus_daily(prep, schedule, result)
    days = []
    for day in sorted(set(ours) | set(theirs)):
        m_gross, m_cost = ours.get(day, [0.0, 0.0])
        parts = theirs.get(day, {})
        marketrl = m_gross - m_cost
        naut = parts.get("nautilus", 0.0)
        gap = naut - marketrl
        fill_part = parts.get("fill_price", 0.0)
        fees_part = m_cost - parts.get("nautilus_fees", 0.0)
        chain_part = parts.get("chain_end", 0.0)
        days.append(
            {
                "day": day,
                "marketrl": marketrl,
                "marketrl_costs": m_cost,
                "nautilus": naut,
                "nautilus_commissions": parts.get("nautilus_fees", 0.0),
                "gap": gap,
                "fill_price": fill_part,
                # fill_price = the half-spread paid at the quote + the rest: the trade price against the mid
                "fill_spread": parts.get("fill_spread", 0.0),
                "fill_bounce": fill_part - parts.get("fill_spread", 0.0),
                "fees": fees_part,
                "chain_end": chain_part,
                "residual": gap - fill_part - fees_part - chain_part,
            }
        )
    total = {k: float(sum(d[k] for d in days)) for k in days[0] if k != "day"} if days else {}
    abs_pnl = sum(abs(d["marketrl"]) for d in days)
    data = prep.data
    return {
        "fill": fill,
        "nautilus_trader": nautilus_version(),
        "contracts": {
            c.name: {"tick_size": c.tick_size, "point_value": c.point_value, "currency": c.currency}
            for c in schedule.contracts.values()
        },
        "env": {"fill": prep.env.fill, "contracts": prep.env.contracts},
        "costs": prep.costs.to_config() if hasattr(prep.costs, "to_config") else {},
        "rows": prep.rows.height,
        "decisions": int(data.is_decision.sum()),
        "rolls": int(data.is_roll.sum()),
        "chains": len(data.chain_first),
        "orders": result.orders,
        "fills": len(result.fills),
        "days": days,
        "total": total,
        "max_abs_day_gap": max((abs(d["gap"]) for d in days), default=0.0),
        "gap_share_of_abs_daily_pnl": (sum(abs(d["gap"]) for d in days) / abs_pnl) if abs_pnl else None,
        "nautilus_account": {
            "balance_change": result.balance_change,
            "unrealized": result.unrealized,
            "total": result.total,
        },
    }


def _explain(summary: dict[str, Any]) -> list[str]:
    t = summary["total"]
    lines = [
        f"Total gap (Nautilus − marketrl): {t['gap']:+,.2f}: fill price {t['fill_price']:+,.2f}, fees "
        f"{t['fees']:+,.2f}, chain ends {t['chain_end']:+,.2f}, residual {t['residual']:+,.2f}.",
        "fill price: Nautilus's fill against marketrl's price (close_t; at a roll close_a and open_b); 0 with bar "
        f"fills; with --fill quotes the half-spread paid at the quote ({t['fill_spread']:+,.2f}) and the bid-ask "
        f"bounce, the trade price against the quote's mid ({t['fill_bounce']:+,.2f}).",
        "fees: marketrl's costs less Nautilus's commissions on the same fills; with bar fills Nautilus is charged "
        "marketrl's own cost per contract (commission + half-spread), so only rounding remains; with quote fills "
        "the commission alone (the spread is in the fill price).",
        "chain ends: marketrl drops a position open at a chain's last bar (before a data gap longer than "
        "env.max_gap, or the end of the data) without a fill; Nautilus closes it there and pays its fee.",
        "rolls: both close the old contract at its last close and open the new one at its first open; the price "
        "gap between the contracts is earned by neither.",
        "residual: marketrl stores returns and costs as float32 fractions of one contract's notional; converted "
        "back to currency they round by about 1e-7 of the notional per bar.",
    ]
    return lines


# the page's columns and their decimals (the gap and its parts to 1/100 of a cent: the residual is that small)
_COLUMNS = (
    ("marketrl", 2),
    ("nautilus", 2),
    ("gap", 4),
    ("fill_price", 4),
    ("fees", 4),
    ("chain_end", 4),
    ("residual", 4),
)


def _page(summary: dict[str, Any], title: str) -> str:
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(d['day'])}</td>"
        + "".join(f"<td>{d[k]:,.{places}f}</td>" for k, places in _COLUMNS)
        + "</tr>"
        for d in summary["days"]
    )
    t = summary["total"]
    total = "".join(f"<td><b>{t[k]:,.{places}f}</b></td>" for k, places in _COLUMNS)
    notes = "".join(f"<li>{esc(line)}</li>" for line in summary["explanation"])
    share = summary["gap_share_of_abs_daily_pnl"]
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>"
        + esc(title)
        + "</title><style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}"
        "td:first-child{text-align:left}table{border-collapse:collapse}tr:nth-child(even){background:#f4f4f4}"
        "</style></head><body><h1>"
        + esc(title)
        + "</h1><p>"
        + esc(
            f"Positions: {summary['source']}. Fills: {summary['fill']}. NautilusTrader "
            f"{summary['nautilus_trader']}. {summary['decisions']} decisions, {summary['orders']} orders, "
            f"{summary['fills']} fills, {summary['rolls']} rolls, {summary['chains']} chains. Largest daily gap "
            f"{summary['max_abs_day_gap']:,.2f}; sum of |daily gap| / sum of |marketrl daily PnL| = "
            + ("n/a" if share is None else f"{share:.2e}")
            + "."
        )
        + "</p><table><tr><th>day</th><th>marketrl</th><th>Nautilus</th><th>gap</th><th>fill price</th>"
        "<th>fees</th><th>chain ends</th><th>residual</th></tr>"
        + rows
        + "<tr><td><b>total</b></td>"
        + total
        + "</tr></table><h2>The gap</h2><ul>"
        + notes
        + "</ul></body></html>\n"
    )


def write_replay(
    summary: dict[str, Any], out_dir: str | Path, title: str = "Replay through NautilusTrader"
) -> tuple[Path, Path]:
    """Write ``replay.json`` and ``replay.html`` into ``out_dir``, both or neither."""
    summary = {**summary, "explanation": _explain(summary)}
    out = Path(out_dir)
    paths = (out / "replay.json", out / "replay.html")
    text, page = json_text(summary), _page(summary, title)
    with atomic_writes(paths) as (tmp_json, tmp_html):
        tmp_json.write_text(text, encoding="utf-8")
        tmp_html.write_text(page, encoding="utf-8")
    return paths


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The CLI's work: load, replay, write; returns the summary."""
    parser = argparse.ArgumentParser(
        prog="python -m marketrl.evaluation.replay", description=__doc__.splitlines()[0]
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--positions", help="bars.parquet of an evaluation (or a baseline's, with --strategy)"
    )
    source.add_argument("--rule", help="a baseline rule instead: long, short, flat, random or momentum")
    source.add_argument(
        "--model", help="a run's model: its paths.EVAL_BARS of --fold and --seed (under --results)"
    )
    parser.add_argument("--fold", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0, help="the seed index")
    parser.add_argument("--results", default=".", help="the run's checkout (where results/ is), for --model")
    parser.add_argument("--strategy", help="which strategy of a baselines bars.parquet")
    parser.add_argument("--lookback", type=int, default=30, help="--rule momentum: bars of the signal")
    parser.add_argument(
        "--prices", required=True, help="glob of feature tables (.parquet) or .dbn.zst bar files"
    )
    parser.add_argument("--config", default="config.yaml", help="the run's config (costs.*, env.*)")
    parser.add_argument(
        "--definitions", default="", help="glob of Databento definition files (data.definitions)"
    )
    parser.add_argument(
        "--commission", type=float, help="override costs.commission_per_contract (every root)"
    )
    parser.add_argument(
        "--half-spread-ticks", type=float, help="override costs.half_spread_ticks (every root)"
    )
    parser.add_argument(
        "--no-quotes", action="store_true", help="drop the quote columns (configured half-spread)"
    )
    parser.add_argument("--fill", default="close", choices=FILLS)
    parser.add_argument("--out", required=True, help="output folder (replay.json, replay.html)")
    args = parser.parse_args(argv)
    if args.model:  # the run's positions file: checked first, before anything heavy
        run_bars = paths.EVAL_BARS.format(model=args.model, fold=args.fold, seed=args.seed)
        args.positions = str(Path(args.results) / run_bars)
        if not Path(args.positions).is_file():
            raise ReplayError(f"{args.positions}: positions file is missing (run `make run` first)")
    if not Path(args.config).is_file():
        raise ReplayError(f"{args.config}: config file is missing")
    config = load_config(args.config)
    if args.definitions:
        config["data"]["definitions"] = args.definitions
    config = resolve_definitions(config)
    for key, value in (
        ("commission_per_contract", args.commission),
        ("half_spread_ticks", args.half_spread_ticks),
    ):
        if value is not None:
            config["costs"][key] = value
            for entry in (config["costs"].get("instruments") or {}).values():
                entry[key] = value
    positions = None
    days = None
    if args.positions:
        positions = load_positions(args.positions, strategy=args.strategy)
        days = set(positions["trading_day"].unique().to_list())
    prices = load_prices(args.prices, days=days)
    if args.no_quotes:
        prices = prices.drop([c for c in QUOTE_KEYS if c in prices.columns])
    label = args.positions or f"rule {args.rule}"
    prep = prepare(prices, positions, config, rule=args.rule or "", lookback=args.lookback, source=label)
    summary = replay(prep, args.fill)
    summary["source"] = label + (f" (strategy {args.strategy})" if args.strategy else "")
    summary["prices"] = args.prices
    if positions is not None and "net_return" in positions.columns:
        summary["file_vs_env_max_abs_net_return"] = _file_vs_env(prep, positions)
    json_path, html_path = write_replay(summary, args.out)
    t = summary["total"]
    print(
        f"replay: marketrl {t['marketrl']:,.2f}, Nautilus {t['nautilus']:,.2f}, gap {t['gap']:+,.2f} "
        f"(largest daily {summary['max_abs_day_gap']:,.2f}); {json_path}, {html_path}"
    )
    return summary


def _file_vs_env(prep: Prepared, positions: pl.DataFrame) -> float:
    """Largest |net_return| difference between the positions file and marketrl's env on these prices: 0 up to
    float32 when the price files are the ones the evaluation read."""
    res = position_results(prep.data, prep.target, prep.env)
    env_rows = _decision_keys(prep.rows, prep.data).with_columns(
        _env=pl.Series(res.net_return.cpu().numpy().astype(np.float64))
    )
    joined = positions.select(
        pl.col("symbol").cast(pl.String),
        pl.col("ts_event").cast(env_rows.schema["ts_event"]),
        pl.col("net_return").cast(pl.Float64),
    ).join(env_rows.drop_nulls("ts_event"), on=["symbol", "ts_event"], how="left")
    return float((joined["net_return"] - joined["_env"]).abs().max() or 0.0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: a bad input is one line on stderr and exit status 2."""
    try:
        run(argv)
    except (ReplayError, ReplayEngineError, OSError, ValueError) as exc:
        print(f"replay: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
