"""Demo data: what a GLBX.MDP3 ohlcv-1m download looks like (UTC-day files, CME hours, DST, a holiday halt cleared
under the next trade date, the quarterly roll under continuous symbology, a definition file), valid DBN that databento reads back exactly,
realistic enough, and byte-reproducible."""

from __future__ import annotations

import datetime as dt
import hashlib
import zoneinfo
from pathlib import Path

import databento as db
import numpy as np
import pandas as pd
import polars as pl
import pytest
import yaml

from marketrl.data.definitions import read_contract_specs, resolve_definitions
from marketrl.data.demo import (
    DEFINITIONS_DIR,
    DEMO_INSTRUMENTS,
    calendar_spread,
    demo_contract,
    demo_definition_path,
    generate_demo_files,
)
from marketrl.data.file_order import demo_file_name, demo_quote_file_name
from marketrl.data.quotes import load_quotes, quotes_at_bars, read_quotes
from marketrl.data.reader import DataFileError, read_bars
from marketrl.instruments.costs import costs_from_config
from marketrl.settings.config import ConfigError, validate_config
from marketrl.workflow.pipeline import demo_files

REPO_ROOT = Path(__file__).resolve().parents[1]
CHICAGO = zoneinfo.ZoneInfo("America/Chicago")
DEFAULT = validate_config({})["data"]["demo"]
SYMBOLS = {inst.symbol for inst in DEMO_INSTRUMENTS}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default window (config.yaml's and the schema's data.demo), seed 5."""
    out = tmp_path_factory.mktemp("demo")
    generate_demo_files(out, DEFAULT["start"], DEFAULT["days"], seed=5)
    return out


def _ohlcv_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.ohlcv-1m.dbn.zst"))


@pytest.fixture(scope="module")
def bars(demo_dir: Path) -> pl.DataFrame:
    """Every bar as read by the pipeline's reader (trading_day from marketrl.calendars.sessions), with its file's day."""
    frames = [
        read_bars(path).bars.with_columns(pl.lit(path.name).alias("file")) for path in _ohlcv_files(demo_dir)
    ]
    return pl.concat(frames).sort("ts_event", "instrument_id")


# The US holidays of the demo's years, written out by hand (CME: no trade date on any of them).
HOLIDAYS_2024 = {
    dt.date(2024, m, d)
    for m, d in ((1, 1), (1, 15), (2, 19), (3, 29), (5, 27), (6, 19), (7, 4), (9, 2), (11, 28), (12, 25))
}


def _expected_trading_day(ts_utc: dt.datetime) -> dt.date | None:
    """CME Globex by hand: the session opening at 17:00 CT belongs to the next local date, 16:00-17:00 CT is the
    halt, no session ends on a Saturday or Sunday (None: outside every session), and a session ending on a
    holiday is cleared under the next weekday that is not one."""
    local = ts_utc.astimezone(CHICAGO)
    if dt.time(16, 0) <= local.time() < dt.time(17, 0):
        return None
    day = local.date() + dt.timedelta(days=1 if local.time() >= dt.time(17, 0) else 0)
    if day.weekday() >= 5:
        return None
    while day in HOLIDAYS_2024 or day.weekday() >= 5:
        day += dt.timedelta(days=1)
    return day


# --- the download's layout ----------------------------------------------------------------------------------


def test_one_file_per_utc_day_with_data_named_like_databento(demo_dir: Path, bars: pl.DataFrame) -> None:
    names = [p.name for p in _ohlcv_files(demo_dir)]
    assert names == [Path(p).name for p in demo_files({"data": {"demo": DEFAULT}})]
    assert names[0] == demo_file_name(dt.date(2024, 2, 12)) == "glbx-mdp3-20240212.ohlcv-1m.dbn.zst"
    days = [dt.datetime.strptime(n[10:18], "%Y%m%d").date() for n in names]
    assert not [d for d in days if d.weekday() == 5]  # no Saturday file
    sundays = [d for d in days if d.weekday() == 6]
    assert sundays == [dt.date(2024, 2, 18) + dt.timedelta(weeks=w) for w in range(6)]
    # 30 trading days (2024-02-12 .. 03-25: Presidents' Day is none) in 31 weekday files and 6 Sunday files
    assert len(days) == 37 and days[-1] == dt.date(2024, 3, 25) and dt.date(2024, 2, 19) in days
    # every bar lies in its file's UTC day, and every Sunday file opens at 17:00 CT
    assert (bars["ts_event"].dt.strftime("%Y%m%d") == bars["file"].str.slice(10, 8)).all()
    for sunday in sundays:
        first = bars.filter(pl.col("file") == demo_file_name(sunday))["ts_event"].min()
        assert first.astimezone(CHICAGO).time() == dt.time(17, 0)
    # a session spans two UTC files; the trading day after Presidents' Day three (Sunday, Monday, Tuesday)
    per_day = dict(bars.group_by("trading_day").agg(pl.col("file").n_unique()).rows())
    assert per_day.pop(dt.date(2024, 2, 20)) == 3 and max(per_day.values()) == 2


def test_round_trip_through_databento_with_continuous_symbology(demo_dir: Path) -> None:
    for path in _ohlcv_files(demo_dir):
        store = db.DBNStore.from_file(path)
        assert store.schema == db.Schema.OHLCV_1M
        assert store.metadata.dataset == "GLBX.MDP3"
        assert store.metadata.stype_in == db.SType.CONTINUOUS
        df = store.to_df()  # symbol mapping through the file's own symbology
        assert len(df) == len(store.to_ndarray()) > 0
        assert set(df["symbol"]) == SYMBOLS
        assert (df["low"] <= df[["open", "close"]].min(axis=1)).all()
        assert (df["high"] >= df[["open", "close"]].max(axis=1)).all()
        assert (df["volume"] > 0).all()
        for inst in DEMO_INSTRUMENTS:
            prices = df.loc[df["symbol"] == inst.symbol, ["open", "high", "low", "close"]].to_numpy()
            np.testing.assert_allclose(prices / inst.tick_size, np.round(prices / inst.tick_size), atol=1e-6)


def test_trading_day_of_every_bar_matches_an_independent_cme_calendar(bars: pl.DataFrame) -> None:
    expected = [_expected_trading_day(ts) for ts in bars["ts_event"].to_list()]
    assert None not in expected  # no bar in the daily halt or on a weekend
    assert bars["trading_day"].to_list() == expected
    sessions = bars["trading_day"].unique().sort().to_list()
    assert len(sessions) == DEFAULT["days"] == 30
    assert sessions[0] == dt.date(2024, 2, 12)


def test_window_covers_the_dst_change(bars: pl.DataFrame) -> None:
    opens = bars.group_by("trading_day").agg(pl.col("ts_event").min()).sort("trading_day")
    hours = {day: ts.hour for day, ts in opens.rows() if day != dt.date(2024, 2, 12)}  # first: from 00:00 UTC
    assert {h for d, h in hours.items() if d <= dt.date(2024, 3, 8)} == {23}  # 17:00 CST
    assert {h for d, h in hours.items() if d >= dt.date(2024, 3, 11)} == {22}  # 17:00 CDT after 2024-03-10
    closes = bars.group_by("trading_day").agg(pl.col("ts_event").max())
    local_close = {day: ts.astimezone(CHICAGO).time() for day, ts in closes.rows()}
    assert set(local_close.values()) <= {
        dt.time(15, 59),
        dt.time(15, 58),
    }  # every trading day ends at 16:00 CT


def test_presidents_day_halts_early_and_clears_under_tuesday(bars: pl.DataFrame) -> None:
    local = bars.with_columns(pl.col("ts_event").dt.convert_time_zone("America/Chicago").alias("local"))
    assert dt.date(2024, 2, 19) not in bars["trading_day"].to_list()  # a holiday is never a trading day
    holiday = local.filter(pl.col("local").dt.date() == dt.date(2024, 2, 19))
    times = holiday["local"].dt.time()
    assert times.filter(times >= dt.time(12, 0)).min() == dt.time(
        17, 0
    )  # nothing from 12:00 until the reopen
    assert holiday["trading_day"].unique().to_list() == [dt.date(2024, 2, 20)]  # before and after the halt
    # Tuesday's trading day: Sunday 17:00 CT to the 12:00 CT halt, then Monday 17:00 CT to Tuesday 16:00 CT
    tuesday = local.filter(pl.col("trading_day") == dt.date(2024, 2, 20))["local"].sort()
    assert tuesday[0] == dt.datetime(2024, 2, 18, 17, 0, tzinfo=CHICAGO)
    gaps = tuesday.diff().drop_nulls()
    # one break inside the day: 12:00 -> 17:00 CT Monday (bar open times, 11:59 -> 17:00 unless a bar is absent)
    assert dt.timedelta(hours=5) < gaps.max() < dt.timedelta(hours=5, minutes=10)
    assert (gaps > dt.timedelta(minutes=30)).sum() == 1
    assert tuesday.filter(tuesday.dt.date() == dt.date(2024, 2, 20)).dt.time().max() >= dt.time(15, 55)
    per_day = bars.group_by("trading_day").len()
    assert per_day["len"].max() == per_day.filter(pl.col("trading_day") == dt.date(2024, 2, 20))["len"][0]


def test_cme_hours_clear_holiday_sessions_under_the_next_trade_date() -> None:
    from marketrl.calendars.cme_hours import cme_sessions, trading_days

    def local(ns: int) -> dt.datetime:
        return dt.datetime.fromtimestamp(ns // 10**9, tz=CHICAGO).replace(tzinfo=None)

    sessions = cme_sessions(dt.date(2024, 1, 2), 250)
    days = trading_days(dt.date(2024, 1, 2), 250)
    assert len(days) == 250 and not set(days) & HOLIDAYS_2024 and all(d.weekday() < 5 for d in days)
    segments: dict[dt.date, list[tuple[dt.datetime, dt.datetime]]] = {}
    for session in sessions:
        segments.setdefault(session.trading_day, []).append((local(session.open_ns), local(session.close_ns)))
    assert sorted(segments) == days
    # Thanksgiving: Wednesday 17:00 CT to Thursday 12:00 CT, then Thursday 17:00 CT to Friday 16:00 CT
    assert segments[dt.date(2024, 11, 29)] == [
        (dt.datetime(2024, 11, 27, 17), dt.datetime(2024, 11, 28, 12)),
        (dt.datetime(2024, 11, 28, 17), dt.datetime(2024, 11, 29, 16)),
    ]
    # Christmas and Good Friday are closed: the next trade date opens at 17:00 CT on the holiday / on Sunday
    assert segments[dt.date(2024, 12, 26)] == [(dt.datetime(2024, 12, 25, 17), dt.datetime(2024, 12, 26, 16))]
    assert segments[dt.date(2024, 4, 1)] == [(dt.datetime(2024, 3, 31, 17), dt.datetime(2024, 4, 1, 16))]
    two = {day for day, parts in segments.items() if len(parts) == 2}
    assert two == {
        dt.date(2024, m, d) for m, d in ((1, 16), (2, 20), (5, 28), (6, 20), (7, 5), (9, 3), (11, 29))
    }
    # the national day of mourning 2025-01-09: the overnight session to 08:30 CT belongs to Friday
    jan_10 = cme_sessions(dt.date(2025, 1, 10), 1)
    assert [s.trading_day for s in jan_10] == [dt.date(2025, 1, 10)] * 2
    assert (local(jan_10[0].open_ns), local(jan_10[0].close_ns)) == (
        dt.datetime(2025, 1, 8, 17),
        dt.datetime(2025, 1, 9, 8, 30),
    )


def test_the_quarterly_roll_changes_instrument_id_once_under_each_continuous_symbol(
    demo_dir: Path, bars: pl.DataFrame
) -> None:
    roll_day = dt.date(2024, 3, 14)
    for inst in DEMO_INSTRUMENTS:
        old, new = demo_contract(inst.root, 2024, 3), demo_contract(inst.root, 2024, 6)
        assert (old.raw_symbol, new.raw_symbol) == (f"{inst.root}H4", f"{inst.root}M4")
        rows = bars.filter(pl.col("symbol") == inst.symbol)
        ids = rows["instrument_id"].to_numpy()
        changes = np.flatnonzero(np.diff(ids))
        assert len(changes) == 1 and ids[0] == old.instrument_id and ids[-1] == new.instrument_id
        first_new = rows.row(int(changes[0]) + 1, named=True)
        last_old = rows.row(int(changes[0]), named=True)
        assert first_new["ts_event"].date() == roll_day and first_new["ts_event"].hour == 0
        # priced at the calendar spread (cost of carry, about 1% for ES, 1.2% for NQ), not at the old price
        spread = np.log(first_new["open"] / last_old["close"])
        assert abs(spread - calendar_spread(inst, old)) < 0.004
        assert 0.008 < calendar_spread(inst, old) < 0.014
    # each file's mapping interval is its own UTC day, naming the instrument_id of its bars
    for path in _ohlcv_files(demo_dir):
        store = db.DBNStore.from_file(path)
        day = dt.datetime.strptime(path.name[10:18], "%Y%m%d").date()
        ids_in_file = {int(i) for i in store.to_ndarray()["instrument_id"]}
        mapped = set()
        for symbol, intervals in store.metadata.mappings.items():
            assert symbol in SYMBOLS
            (interval,) = intervals
            assert (interval["start_date"], interval["end_date"]) == (day, day + dt.timedelta(days=1))
            mapped.add(int(interval["symbol"]))
            root = symbol.split(".")[0]
            month = 3 if day < roll_day else 6
            assert int(interval["symbol"]) == demo_contract(root, 2024, month).instrument_id
        assert ids_in_file == mapped


# --- the definition file and contract specs ------------------------------------------------------------------


def test_definition_file_describes_the_contracts(demo_dir: Path) -> None:
    path = demo_definition_path(demo_dir, DEFAULT["start"], DEFAULT["days"])
    assert path.parent.name == DEFINITIONS_DIR
    assert path.name == "glbx-mdp3-20240212-20240325.definition.dbn.zst"
    store = db.DBNStore.from_file(path)
    assert store.schema == db.Schema.DEFINITION
    records = {r.raw_symbol: r for r in store}
    assert set(records) == {"ESH4", "ESM4", "NQH4", "NQM4"}
    es, nq = records["ESH4"], records["NQM4"]
    assert (es.pretty_min_price_increment, es.pretty_unit_of_measure_qty, es.currency) == (0.25, 50.0, "USD")
    assert (nq.pretty_min_price_increment, nq.pretty_unit_of_measure_qty) == (0.25, 20.0)
    assert es.instrument_id == 17077 and records["ESM4"].instrument_id == 5602  # GLBX's own ids
    assert str(es.instrument_class) == "F" and es.pretty_expiration.date() == dt.date(2024, 3, 15)


def _costs_with_definitions(definitions: str, instruments: dict | None = None) -> dict:
    config = validate_config(
        {"data": {"definitions": definitions}, "costs": {"instruments": instruments or {}}}
    )
    return resolve_definitions(config)["costs"]


def test_definitions_give_es_and_nq_their_own_costs(demo_dir: Path) -> None:
    path = str(demo_definition_path(demo_dir, DEFAULT["start"], DEFAULT["days"]))
    costs = costs_from_config(_costs_with_definitions(path))
    # by hand, per side and contract: commission 1.0 + 0.5 tick × tick value (ES 12.50, NQ 5.00)
    for symbol, tick_value, per_side in (("ES.c.0", 12.5, 7.25), ("NQ.c.0", 5.0, 3.5), ("ESM4", 12.5, 7.25)):
        spec = costs.for_symbol(symbol)
        assert (spec.tick_size, spec.tick_value, spec.currency) == (0.25, tick_value, "USD")
        assert spec.commission_per_contract + spec.half_spread_ticks * spec.tick_value == per_side
        point_value = tick_value / 0.25
        assert spec.cost_fraction(5000.0) == pytest.approx(per_side / (5000.0 * point_value))
    with pytest.raises(ValueError, match=r"no contract spec for instrument 'CL.c.0' \(root 'CL'\)"):
        costs.for_symbol("CL.c.0")
    # config.yaml's explicit entries are exactly what the demo's definitions say
    explicit = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())["costs"]
    assert costs_from_config({**explicit, "instruments": explicit["instruments"]}) == costs


def test_explicit_instrument_entries_win_and_must_agree(demo_dir: Path) -> None:
    path = str(demo_definition_path(demo_dir, DEFAULT["start"], DEFAULT["days"]))
    costs = costs_from_config(
        _costs_with_definitions(
            path, {"NQ": {"commission_per_contract": 2.0}, "CL": {"tick_size": 0.01, "tick_value": 10.0}}
        )
    )
    nq = costs.for_symbol("NQ.c.0")
    assert (nq.commission_per_contract, nq.tick_value) == (
        2.0,
        5.0,
    )  # explicit commission, defined tick value
    assert costs.for_symbol("CL.c.0").tick_value == 10.0
    with pytest.raises(
        ConfigError, match=r"^config key 'costs.instruments.NQ': tick .* disagrees with NQ[HM]4 in "
    ):
        _costs_with_definitions(path, {"NQ": {"tick_size": 0.25, "tick_value": 12.5}})
    with pytest.raises(
        ConfigError, match=r"^config key 'data.definitions': '/nonexistent/\*.dbn.zst' matched no files$"
    ):
        _costs_with_definitions("/nonexistent/*.dbn.zst")
    ohlcv = str(_ohlcv_files(demo_dir)[0])
    with pytest.raises(ConfigError, match=r"schema ohlcv-1m, expected a definition file$"):
        _costs_with_definitions(ohlcv)


def test_real_definition_samples_give_the_real_specs(dbn_samples: Path) -> None:
    catalog = dbn_samples / "nautilus_trader" / "historical_bars_catalog" / "databento"
    specs = read_contract_specs([catalog / "futures_definition.dbn.zst"])  # ESU4, NQU4 from GLBX.MDP3
    assert {root: (s.tick_size, s.tick_value, s.currency) for root, s in specs.items()} == {
        "ES": (0.25, 12.5, "USD"),
        "NQ": (0.25, 5.0, "USD"),
    }
    # options, spreads and stocks carry no futures spec
    assert (
        read_contract_specs([dbn_samples / "nautilus_trader" / "definition-glbx-es-futspread.dbn.zst"]) == {}
    )


# --- statistical properties ----------------------------------------------------------------------------------


def test_stylized_facts(bars: pl.DataFrame) -> None:
    es = bars.filter(pl.col("instrument_id") == demo_contract("ES", 2024, 3).instrument_id)[
        "close"
    ].to_numpy()
    returns = np.diff(np.log(es))
    standardized = (returns - returns.mean()) / returns.std()
    assert np.mean(standardized**4) > 4.0  # fat tails (a normal has 3)
    absolute = np.abs(returns)
    assert np.corrcoef(absolute[:-1], absolute[1:])[0, 1] > 0.05  # volatility clustering / seasonality


def test_instruments_are_correlated(bars: pl.DataFrame) -> None:
    wide = bars.to_pandas().pivot_table(index="ts_event", columns="symbol", values="close")
    log_returns = np.log(wide).diff().dropna()  # bars missing in either instrument drop out of the alignment
    log_returns = log_returns[log_returns.abs().max(axis=1) < 0.005]  # the roll's spread is not a return
    assert log_returns.corr().loc["ES.c.0", "NQ.c.0"] > 0.6


def test_intraday_volume_seasonality_follows_chicago_time(bars: pl.DataFrame) -> None:
    local_hour = bars["ts_event"].dt.convert_time_zone("America/Chicago").dt.hour()
    volume = pd.Series(bars["volume"].to_numpy()).groupby(local_hour.to_numpy()).mean()
    assert volume.loc[8] > 2 * volume.loc[22]  # US cash open (08:30 CT) busier than the Asian night
    assert 16 not in volume.index  # the daily halt


def test_same_seed_same_bytes_different_seed_different(tmp_path: Path) -> None:
    def digest(out: Path, seed: int) -> list[str]:
        paths = generate_demo_files(out, "2024-03-07", 3, seed=seed)
        paths += sorted(out.glob("bbo-1m/*.bbo-1m.dbn.zst"))  # the quotes are reproducible too
        paths.append(demo_definition_path(out, "2024-03-07", 3))
        return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]

    assert digest(tmp_path / "a", 9) == digest(tmp_path / "b", 9)
    assert digest(tmp_path / "a", 9)[:-1] != digest(tmp_path / "c", 10)[:-1]


# --- the quotes (bbo-1m beside each ohlcv-1m file) -----------------------------------------------------------


@pytest.fixture(scope="module")
def quotes(demo_dir: Path, bars: pl.DataFrame) -> pl.DataFrame:
    """Every demo quote, with its spread in ticks, the Chicago time and the product."""
    files = sorted((demo_dir / "bbo-1m").glob("*.dbn.zst"))
    assert [p.name for p in files] == [demo_quote_file_name(d) for d in _file_days(demo_dir)]
    frame = pl.concat([read_quotes(p).quotes for p in files])
    roots = bars.select("instrument_id", pl.col("symbol").str.slice(0, 2).alias("root")).unique()
    local = pl.col("quote_ts").dt.convert_time_zone("America/Chicago")
    minutes = (local.dt.hour().cast(pl.Int32) * 60 + local.dt.minute() - 17 * 60) % (24 * 60)
    return frame.join(roots, on="instrument_id").with_columns(
        ((pl.col("ask_px") - pl.col("bid_px")) / 0.25).alias("ticks"), minutes.alias("since_open")
    )


def _file_days(directory: Path) -> list[dt.date]:
    return [dt.datetime.strptime(p.name[10:18], "%Y%m%d").date() for p in _ohlcv_files(directory)]


def test_demo_quotes_are_one_tick_most_of_the_day_and_wider_at_the_open_and_overnight(
    quotes: pl.DataFrame,
) -> None:
    assert quotes["ticks"].min() >= 1.0 and (quotes["ticks"] == quotes["ticks"].round()).all()
    es = quotes.filter(pl.col("root") == "ES")
    day = es.filter(pl.col("since_open").is_between(930, 1334))  # 08:30-15:15 CT
    at_open = es.filter(pl.col("since_open") < 15)
    overnight = es.filter(pl.col("since_open").is_between(60, 929))
    assert (day["ticks"] == 1).mean() > 0.9  # ES: one tick in the day session (wider at a roll, a big move)
    assert at_open["ticks"].mean() > overnight["ticks"].mean() > day["ticks"].mean()
    nq = quotes.filter(pl.col("root") == "NQ")
    assert nq["ticks"].mean() > es["ticks"].mean()  # NQ: the thinner book


def test_demo_quotes_bracket_the_bars_and_join_to_every_bar(demo_dir: Path) -> None:
    path = demo_dir / demo_file_name(dt.date(2024, 2, 14))
    bar_file = read_bars(path)
    paired = [demo_dir / "bbo-1m" / demo_quote_file_name(dt.date(2024, 2, d)) for d in (14, 13, 15)]
    joined = quotes_at_bars(
        bar_file.bars, load_quotes(paired, bar_file.bars, path, bar_file.bar_ns), bar_file.bar_ns
    )
    assert joined.select(pl.col("bid_px", "open_bid_px").null_count()).row(0) == (0, 0)
    inside = (pl.col("bid_px") <= pl.col("close")) & (pl.col("close") <= pl.col("ask_px"))
    assert joined.select(inside.all()).item()


def test_a_demo_quote_file_of_another_day_is_an_error_naming_it(demo_dir: Path) -> None:
    path = demo_dir / demo_file_name(dt.date(2024, 2, 14))
    bar_file = read_bars(path)
    other = demo_dir / "bbo-1m" / demo_quote_file_name(dt.date(2024, 2, 21))
    with pytest.raises(
        DataFileError, match=r"glbx-mdp3-20240221\.bbo-1m\.dbn\.zst: no quote inside the span"
    ):
        load_quotes([other], bar_file.bars, path, bar_file.bar_ns)


# --- planted edge (data.demo.edge) ---------------------------------------------------------------------------

EDGE_DAYS = 150  # enough days that the paired comparison below is tight; generated in a few seconds


def _oracle_sharpe(
    n_days: int, seed: int, edge: float, kind: str = "momentum", oracle_kind: str | None = None
) -> float:
    """Realized annualized net Sharpe of the oracle (momentum: sign of the `ret_15` feature, log close_t − log
    close_{t−15} rows back, per instrument; reversion: minus the sign of `ret_5`), scored by the project's env
    and metrics with config.yaml's costs, fill at close. `oracle_kind`: trade another kind's oracle on the data."""
    from marketrl.data.demo import EDGE_KINDS, simulate_demo_bars
    from marketrl.env import MarketData, evaluate_positions
    from marketrl.env.market_data import series_order
    from marketrl.scoring.metrics import performance_summary
    from marketrl.splits.datasets import cost_model_from_config

    columns: dict[str, list] = {
        "ts_event": [],
        "trading_day": [],
        "instrument_id": [],
        "symbol": [],
        "open": [],
        "close": [],
    }
    lookback, sign = EDGE_KINDS[oracle_kind or kind]
    for day, day_bars in simulate_demo_bars("2024-01-02", n_days, seed, edge, kind):
        for bars in day_bars:
            columns["ts_event"].append(bars.ts_event)
            columns["trading_day"].append(np.full(bars.minutes.size, np.datetime64(day, "D")))
            columns["instrument_id"].append(np.full(bars.minutes.size, bars.instrument.instrument_id))
            columns["symbol"].append(np.full(bars.minutes.size, bars.instrument.symbol))
            columns["open"].append(bars.open)
            columns["close"].append(bars.close)
    df = (
        pl.DataFrame({name: np.concatenate(parts) for name, parts in columns.items()})
        .with_columns(pl.col("ts_event").cast(pl.Datetime("ns", "UTC")), pl.col("trading_day").cast(pl.Date))
        .sort("instrument_id", "ts_event")
    )
    log_close = np.log(df["close"].to_numpy())
    instrument = df["instrument_id"].to_numpy()
    known = np.zeros(df.height, dtype=bool)
    known[lookback:] = instrument[lookback:] == instrument[:-lookback]
    trailing = np.zeros(df.height)
    trailing[lookback:] = log_close[lookback:] - log_close[:-lookback]
    positions = np.where(known, sign * np.sign(trailing), 0.0)
    ts_ns = df["ts_event"].dt.epoch("ns").to_numpy()
    # MarketData keeps each continuous symbol's contracts in time order (series order): align the oracle with it
    order, _ = series_order(instrument, ts_ns, df["symbol"].to_numpy())
    if order is not None:
        positions = positions[order]
    costs = cost_model_from_config(yaml.safe_load((REPO_ROOT / "config.yaml").read_text())["costs"])
    data = MarketData.from_arrays(
        np.zeros((df.height, 1)),
        opens=df["open"].to_numpy(),
        closes=df["close"].to_numpy(),
        instrument_id=instrument,
        ts_event_ns=df["ts_event"].dt.epoch("ns").to_numpy(),
        cost_model=costs,
        symbols=df["symbol"].to_numpy(),
        rows=df.select("ts_event", "trading_day", "instrument_id", "symbol"),
    )
    return performance_summary(evaluate_positions(data, positions))["sharpe"]


def test_edge_is_calibrated_for_the_default_costs() -> None:
    from marketrl.data.demo import CALIBRATION_COSTS
    from marketrl.splits.datasets import cost_model_from_config

    costs = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())["costs"]
    assert cost_model_from_config(costs) == CALIBRATION_COSTS


def test_planted_edge_gives_the_oracle_the_requested_sharpe() -> None:
    from marketrl.data.demo import _calibration_sample, edge_coefficient, expected_oracle_sharpe

    expected_no_edge = expected_oracle_sharpe(*_calibration_sample(), 0.0)  # pure cost drag
    with_edge = _oracle_sharpe(EDGE_DAYS, seed=11, edge=2.0)
    without = _oracle_sharpe(EDGE_DAYS, seed=11, edge=0.0)
    # A realized Sharpe over N days has a standard error of about sqrt(252/N · (1 + SR_daily²/2)), ≈ 1.3 here:
    # each run must lie within 3 of them of its target.
    tolerance = 3.0 * np.sqrt(252 / EDGE_DAYS * (1 + (2.0 / np.sqrt(252)) ** 2 / 2))
    assert abs(with_edge - 2.0) < tolerance
    assert abs(without - expected_no_edge) < tolerance
    # Paired on the same innovations, the unpredictable part of the two P&Ls nearly cancels: the edge's own
    # contribution is pinned far tighter.
    assert abs((with_edge - without) - (2.0 - expected_no_edge)) < 1.5
    assert 0 < edge_coefficient(2.0) < edge_coefficient(4.0) < 1.0 / 15  # stronger edge, stationary process


def test_reversion_edge_gives_its_oracle_the_requested_sharpe_and_differs_from_momentum() -> None:
    """The second planted kind: 5-minute mean reversion. Its oracle (against the sign of ret_5) earns the
    requested net Sharpe; the momentum oracle on the same data earns far less than on momentum data (the signal
    is not one the momentum baseline trades)."""
    from marketrl.data.demo import _calibration_sample, edge_coefficient, expected_oracle_sharpe

    target = 6.0
    realized = _oracle_sharpe(EDGE_DAYS, seed=11, edge=target, kind="reversion")
    tolerance = 3.0 * np.sqrt(252 / EDGE_DAYS * (1 + (target / np.sqrt(252)) ** 2 / 2))
    assert abs(realized - target) < tolerance
    phi = edge_coefficient(target, "reversion")
    assert 0 < phi < 1.0 / 5 and phi != edge_coefficient(target, "momentum")
    assert expected_oracle_sharpe(*_calibration_sample(), phi, "reversion") == pytest.approx(target, abs=1e-3)
    # a momentum trader has nothing to follow in reversion data: it loses more than its costs (the no-edge drag)
    expected_no_edge = expected_oracle_sharpe(*_calibration_sample(), 0.0)
    momentum_on_reversion = _oracle_sharpe(EDGE_DAYS, 11, target, "reversion", oracle_kind="momentum")
    assert momentum_on_reversion < expected_no_edge - tolerance
    with pytest.raises(ValueError, match=r"data\.demo\.edge_kind: expected one of momentum, reversion"):
        edge_coefficient(2.0, "carry")


def test_edge_zero_is_the_unplanted_process_and_bad_edge_fails() -> None:
    from marketrl.data.demo import edge_coefficient, simulate_demo_bars

    plain = simulate_demo_bars("2024-01-02", 2, seed=3)
    explicit = simulate_demo_bars("2024-01-02", 2, seed=3, edge=0.0)
    planted = simulate_demo_bars("2024-01-02", 2, seed=3, edge=2.0)
    for (_, default_bars), (_, zero_bars) in zip(plain, explicit, strict=True):
        for a, b in zip(default_bars, zero_bars, strict=True):
            assert np.array_equal(a.close, b.close)
    assert not np.array_equal(plain[1][1][0].close, planted[1][1][0].close)
    with pytest.raises(ValueError, match=r"data\.demo\.edge"):
        edge_coefficient(-1.0)
