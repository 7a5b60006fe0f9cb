"""Quote-aware fills (issue 38 item 1): a buy fills at the ask and a sell at the bid of the quote at the fill time,
the as-of join of quote files to bars, the fallback to the configured half-spread, and the quote files' checks."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from marketrl.data.dbn_writer import encode_dbn, write_dbn
from marketrl.data.quotes import QUOTE_COLUMNS, load_quotes, quotes_at_bars, read_quotes
from marketrl.data.reader import DataFileError, read_bars
from marketrl.env import EnvConfig, MarketData
from marketrl.env.config import QUOTE_KEYS
from marketrl.env.rollout import evaluate_positions, fill_columns, position_results
from marketrl.instruments.costs import CostModel
from marketrl.settings.config import ConfigError
from marketrl.workflow import pipeline
from tests.support.synthetic import bbo_message, ohlcv_messages

SAMPLES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dbn-samples" / "nautilus_trader"
BBO_1M = SAMPLES / "options_catalog/databento/futures_bbo-1m_2024-05-09T09-55_2024-05-09T10-05.dbn.zst"
OHLCV_1M = SAMPLES / "options_catalog/databento/futures_ohlcv-1m_2024-05-09T09-55_2024-05-09T10-05.dbn.zst"
MBP_1 = SAMPLES / "historical_bars_catalog/databento/futures_mbp-1_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"

ES = CostModel(
    kind="futures", commission_per_contract=1.0, half_spread_ticks=0.5, tick_size=0.25, tick_value=12.5
)
POINT = ES.tick_value / ES.tick_size  # $50 a point
T0 = 1_715_248_800 * 10**9  # 2024-05-09 10:00 UTC
MINUTE = 60 * 10**9


def _rows(n: int) -> pl.DataFrame:
    ts = pl.Series(T0 + np.arange(n) * MINUTE).cast(pl.Datetime("ns", "UTC"))
    return pl.DataFrame(
        {"ts_event": ts, "trading_day": ts.dt.date(), "instrument_id": [5602] * n, "symbol": ["ESM4"] * n}
    )


def _data(closes, opens, quotes) -> MarketData:
    n = len(closes)
    return MarketData.from_arrays(
        np.zeros((n, 1), dtype=np.float32),
        rows=_rows(n),
        opens=np.asarray(opens, dtype=float),
        closes=np.asarray(closes, dtype=float),
        instrument_id=np.full(n, 5602),
        ts_event_ns=T0 + np.arange(n) * MINUTE,
        cost_model=ES,
        quotes={key: np.asarray(quotes[key], dtype=float) for key in QUOTE_KEYS},
    )


# Five bars whose closes and opens sit at their quotes' mid; bar 2 is quoted two ticks wide.
CLOSES = [5000.125, 5001.125, 5002.25, 5001.125, 5000.125]
OPENS = [5000.125, 5000.375, 5001.125, 5002.125, 5001.125]
QUOTES = {
    "bid_px": [5000.0, 5001.0, 5002.0, 5001.0, 5000.0],
    "ask_px": [5000.25, 5001.25, 5002.5, 5001.25, 5000.25],
    "open_bid_px": [5000.0, 5000.25, 5001.0, 5002.0, 5001.0],
    "open_ask_px": [5000.25, 5000.5, 5001.25, 5002.25, 5001.25],
}


def _fill_prices(data: MarketData, positions: list[float], fill: str) -> list[float]:
    """The price each trade effectively paid: the reference price moved against the trader by the cost less
    the commission (one contract)."""
    config = EnvConfig(max_gap=data.max_gap, fill=fill)
    cost = position_results(data, np.asarray(positions, dtype=np.float32), config).cost.numpy()
    reference = np.asarray(CLOSES if fill == "close" else [*OPENS[1:], np.nan])
    previous = np.concatenate([[0.0], positions[:-1]])
    prices = []
    for t, (before, after) in enumerate(zip(previous, positions, strict=True)):
        if after != before:
            slippage = (cost[t] * reference[t] * POINT - ES.commission_per_contract) / POINT
            prices.append(float(reference[t] + np.sign(after - before) * slippage))
    return prices


def test_close_fill_buys_at_the_ask_and_sells_at_the_bid() -> None:
    data = _data(CLOSES, OPENS, QUOTES)
    # buy at bar 0's close, sell it at bar 1's, go short at bar 2's (a sale), cover at bar 3's (a buy)
    prices = _fill_prices(data, [1.0, 0.0, -1.0, 0.0, 0.0], "close")
    assert prices == pytest.approx([5000.25, 5001.0, 5002.0, 5001.25], abs=1e-6)
    assert not data.fallback_close.any()
    assert data.half_spread_ticks_close.tolist() == pytest.approx([0.5, 0.5, 1.0, 0.5, 0.5])


def test_next_open_fill_trades_at_the_next_bars_open_quote() -> None:
    data = _data(CLOSES, OPENS, QUOTES)
    # decided at bar 0's close: bought at bar 1's open ask; decided at bar 1: sold at bar 2's open bid
    prices = _fill_prices(data, [1.0, 0.0, 0.0, 0.0, 0.0], "next_open")
    assert prices == pytest.approx([QUOTES["open_ask_px"][1], QUOTES["open_bid_px"][2]], abs=1e-6)
    columns = fill_columns(
        data, np.array([1.0, 0.0, 0.0, 0.0, 0.0]), EnvConfig(max_gap=data.max_gap, fill="next_open")
    )
    assert columns["half_spread_ticks"][:2].tolist() == pytest.approx([0.5, 0.5])
    assert columns["traded"][:2].tolist() == [1.0, 1.0]


def test_a_wide_spread_on_one_bar_costs_exactly_that_spread_more() -> None:
    wide = {key: list(values) for key, values in QUOTES.items()}
    wide["bid_px"][3] -= 1.0  # bar 3 quoted 2 points wider: 1 point more on each side
    wide["ask_px"][3] += 1.0
    config = EnvConfig(fill="close")
    trade = np.array([0.0, 0.0, 0.0, 1.0, 0.0], dtype=np.float32)  # buy at bar 3's close
    narrow_cost = position_results(_data(CLOSES, OPENS, QUOTES), trade, config).cost.numpy()[3]
    wide_cost = position_results(_data(CLOSES, OPENS, wide), trade, config).cost.numpy()[3]
    assert (wide_cost - narrow_cost) * CLOSES[3] * POINT == pytest.approx(1.0 * POINT, rel=1e-5)


def test_missing_zero_or_crossed_quotes_fall_back_and_are_counted() -> None:
    bad = {key: list(values) for key, values in QUOTES.items()}
    bad["bid_px"][1] = np.nan  # missing
    bad["bid_px"][2] = 0.0  # zero
    bad["bid_px"][3], bad["ask_px"][3] = 5001.5, 5001.0  # crossed
    data = _data(CLOSES, OPENS, bad)
    assert data.fallback_close.tolist() == [False, True, True, True, False]
    configured = ES.cost_fraction(np.asarray(CLOSES))
    assert data.cost_close.numpy()[1:4] == pytest.approx(configured[1:4], rel=1e-6)
    assert data.half_spread_ticks_close[1:4].tolist() == [0.5, 0.5, 0.5]
    bars = evaluate_positions(data, np.array([0.0, 1.0, 1.0, 0.0, 0.0]), EnvConfig(fill="close"))
    # two trades at fallback bars (bought at 1, sold at 3); bar 2 held, no fill there
    assert bars["quote_fallback"].to_list() == [False, True, False, True]
    assert bars["traded"].to_list() == [0.0, 1.0, 0.0, 1.0]


def test_without_quotes_every_fill_pays_the_configured_half_spread() -> None:
    n = len(CLOSES)
    data = MarketData.from_arrays(
        np.zeros((n, 1), dtype=np.float32),
        rows=_rows(n),
        opens=np.asarray(OPENS),
        closes=np.asarray(CLOSES),
        instrument_id=np.full(n, 5602),
        ts_event_ns=T0 + np.arange(n) * MINUTE,
        cost_model=ES,
    )
    assert data.cost_close.numpy() == pytest.approx(ES.cost_fraction(np.asarray(CLOSES)), rel=1e-6)
    assert not data.quoted and not data.fallback_close.any()
    bars = evaluate_positions(data, np.array([1.0, 0.0, 0.0, 0.0, 0.0]))
    assert bars["quote_fallback"].null_count() == bars.height  # nothing to fall back from


# ------------------------------------------------------------------------------------------- the as-of join


def _bars(n: int = 4) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "ts_event": pl.Series(T0 + np.arange(n) * MINUTE).cast(pl.Datetime("ns", "UTC")),
            "instrument_id": pl.Series([5602] * n, dtype=pl.UInt32),
        }
    )


def _quotes(stamps: list[int], bids: list[float], instrument_id: int = 5602) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "quote_ts": pl.Series(stamps).cast(pl.Datetime("ns", "UTC")),
            "instrument_id": pl.Series([instrument_id] * len(stamps), dtype=pl.UInt32),
            "bid_px": bids,
            "ask_px": [b + 0.25 for b in bids],
        }
    )


def test_the_join_takes_the_quote_as_of_the_close_and_never_a_later_one() -> None:
    stamps = [T0 + k * MINUTE for k in range(5)]  # bbo-1m: each bar's quote stamped at its close
    quotes = _quotes(stamps, [100.0, 101.0, 102.0, 103.0, 104.0])
    joined = quotes_at_bars(_bars(), quotes, MINUTE)
    assert joined.columns[-4:] == list(QUOTE_COLUMNS)
    assert joined["bid_px"].to_list() == [101.0, 102.0, 103.0, 104.0]  # at each close
    assert joined["open_bid_px"].to_list() == [100.0, 101.0, 102.0, 103.0]  # at each open
    # a quote stamped one nanosecond after bar 1's close, however different, changes nothing at bar 1 or before
    later = pl.concat([quotes, _quotes([T0 + 2 * MINUTE + 1], [50.0])]).sort("quote_ts")
    perturbed = quotes_at_bars(_bars(), later, MINUTE)
    assert perturbed.head(2).equals(joined.head(2))
    assert perturbed["open_bid_px"][2] == 102.0 and perturbed["bid_px"][2] == 103.0


def test_the_join_keeps_instruments_apart_and_ignores_stale_quotes() -> None:
    quotes = pl.concat(
        [_quotes([T0 - 20 * MINUTE], [99.0]), _quotes([T0 + MINUTE], [200.0], instrument_id=13743)]
    )
    joined = quotes_at_bars(_bars(2), quotes, MINUTE)
    assert joined["bid_px"].to_list() == [None, None]  # another instrument's, or older than 15 minutes


# ------------------------------------------------------------------------------------------- quote files


def _quote_file(
    path: Path, quotes: list[tuple[int, float, float]], symbol: str = "ESM4", iid: int = 5602
) -> Path:
    day = T0 // (86_400 * 10**9) * 86_400 * 10**9
    messages = [bbo_message(ts, bid, ask, instrument_id=iid) for ts, bid, ask in quotes]
    data = encode_dbn(
        messages, schema="bbo-1m", start_ns=day, end_ns=day + 86_400 * 10**9, symbols={symbol: iid}
    )
    return write_dbn(path, data)


def _bar_file(path: Path, n: int = 5) -> Path:
    bars = pl.DataFrame(
        {
            "ts_event": T0 + np.arange(n) * MINUTE,
            "instrument_id": [5602] * n,
            "open": [5000.0] * n,
            "high": [5000.5] * n,
            "low": [4999.75] * n,
            "close": [5000.25] * n,
            "volume": [10] * n,
        }
    )
    data = encode_dbn(
        ohlcv_messages(bars), schema="ohlcv-1m", start_ns=T0, end_ns=T0 + n * MINUTE, symbols={"ESM4": 5602}
    )
    return write_dbn(path, data)


def test_a_quote_file_mostly_crossed_or_zero_is_an_error_naming_it(tmp_path: Path) -> None:
    quotes = [(T0 + k * MINUTE, 5000.0, 5000.25) for k in range(50)]
    quotes[3] = (T0 + 3 * MINUTE, 5000.5, 5000.25)  # crossed
    quotes[7] = (T0 + 7 * MINUTE, 0.0, 5000.25)  # zero
    path = _quote_file(tmp_path / "bad.bbo-1m.dbn.zst", quotes)
    with pytest.raises(DataFileError, match=r"bad\.bbo-1m\.dbn\.zst: 2 of 50 quotes crossed or zero") as err:
        read_quotes(path)
    assert "\n" not in str(err.value)
    one = _quote_file(
        tmp_path / "ok.bbo-1m.dbn.zst",
        quotes[:3] + [(T0 + k * MINUTE, 5000.0, 5000.25) for k in range(3, 200)],
    )
    assert read_quotes(one).quotes.height == 200  # a few fall back, bar by bar


def test_quotes_of_another_instrument_or_day_are_errors_naming_the_quote_file(tmp_path: Path) -> None:
    bar_path = _bar_file(tmp_path / "bars.ohlcv-1m.dbn.zst")
    bars = read_bars(bar_path)
    good = [(T0 + k * MINUTE, 5000.0, 5000.25) for k in range(1, 6)]
    ok = _quote_file(tmp_path / "ok.bbo-1m.dbn.zst", good)
    assert load_quotes([ok], bars.bars, bar_path, bars.bar_ns).height == 5
    other = _quote_file(tmp_path / "nq.bbo-1m.dbn.zst", good, symbol="NQM4")
    with pytest.raises(
        DataFileError, match=r"nq\.bbo-1m\.dbn\.zst: maps instrument 5602 to NQ.*another instrument"
    ):
        load_quotes([other], bars.bars, bar_path, bars.bar_ns)
    nq_id = _quote_file(tmp_path / "id.bbo-1m.dbn.zst", good, symbol="NQM4", iid=13743)
    with pytest.raises(DataFileError, match=r"id\.bbo-1m\.dbn\.zst: no quote of ESM4 \(5602\)"):
        load_quotes([nq_id], bars.bars, bar_path, bars.bar_ns)
    late = _quote_file(tmp_path / "day.bbo-1m.dbn.zst", [(T0 + 600 * MINUTE, 5000.0, 5000.25)])
    with pytest.raises(DataFileError, match=r"day\.bbo-1m\.dbn\.zst: no quote inside the span.*another day"):
        load_quotes([late], bars.bars, bar_path, bars.bar_ns)


def test_a_quote_file_without_its_bars_is_a_config_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "bars").mkdir()
    (tmp_path / "quotes").mkdir()
    _bar_file(tmp_path / "bars" / "es.ohlcv-1m.dbn.zst")
    own = _quote_file(tmp_path / "quotes" / "a.bbo-1m.dbn.zst", [(T0 + MINUTE, 5000.0, 5000.25)])
    config = {
        "data": {
            "source": "files",
            "files": str(tmp_path / "bars" / "*.dbn.zst"),
            "quotes": str(tmp_path / "quotes" / "*.dbn.zst"),
            "on_bad_file": "error",
        }
    }
    assert pipeline.quote_inputs(config) == {"es.ohlcv-1m": [str(own)]}
    stray = tmp_path / "quotes" / "b.bbo-1m.dbn.zst"
    next_week = T0 + 7 * 86_400 * 10**9
    data = encode_dbn(
        [bbo_message(next_week, 5000.0, 5000.25, instrument_id=5602)],
        schema="bbo-1m",
        start_ns=next_week - MINUTE,
        end_ns=next_week + MINUTE,
        symbols={"ESM4": 5602},
    )
    write_dbn(stray, data)
    with pytest.raises(
        ConfigError, match=r"data\.quotes.*b\.bbo-1m\.dbn\.zst covers the span of no bar file"
    ):
        pipeline.quote_inputs(config)


def test_the_demo_quotes_pair_each_day_with_its_neighbours() -> None:
    config = {"data": {"source": "demo", "quotes": "demo", "demo": {"start": "2024-02-12", "days": 3}}}
    paired = pipeline.quote_inputs(config)
    assert all(files[0].endswith(".bbo-1m.dbn.zst") for files in paired.values())
    assert all(
        Path(p).name.split(".")[0] == stem.split(".")[0] for stem, files in paired.items() for p in files[:1]
    )
    assert pipeline.quote_inputs({**config, "data": {**config["data"], "source": "files"}}) == {}


def test_the_margin_of_the_pairing_covers_the_joins_maximum_age() -> None:
    from marketrl.data.quotes import QUOTE_MAX_AGE

    assert pipeline.QUOTE_MARGIN_NS >= QUOTE_MAX_AGE.total_seconds() * 1e9
    assert tuple(QUOTE_COLUMNS) == QUOTE_KEYS


# ------------------------------------------------------------------------------------------- real samples


@pytest.mark.skipif(not BBO_1M.is_file(), reason=f"real Databento sample absent: {BBO_1M}")
def test_a_real_bbo_1m_sample_joins_to_its_ohlcv_1m_bars() -> None:
    bars = read_bars(OHLCV_1M)
    quotes = load_quotes([BBO_1M], bars.bars, OHLCV_1M, bars.bar_ns)
    joined = quotes_at_bars(bars.bars, quotes, bars.bar_ns)
    assert joined["bid_px"].null_count() == 0 and joined["open_bid_px"].null_count() == 0
    assert (joined["bid_px"] < joined["ask_px"]).all()
    es = joined.filter(pl.col("symbol") == "ESM4")
    spread_ticks = ((es["ask_px"] - es["bid_px"]) / 0.25).to_list()
    assert spread_ticks == [1.0] * es.height  # ES trades one tick wide at 10:00 UTC
    first = es.row(0, named=True)  # the 09:55 bar closes at 09:56: the record stamped (ts_recv) 09:56:00
    assert (first["bid_px"], first["ask_px"]) == (5198.75, 5199.0)
    assert first["ts_event"] == dt.datetime(2024, 5, 9, 9, 55, tzinfo=dt.UTC)


@pytest.mark.skipif(not MBP_1.is_file(), reason=f"real Databento sample absent: {MBP_1}")
def test_a_real_mbp_1_sample_decodes_as_quotes() -> None:
    quotes = read_quotes(MBP_1)
    assert quotes.schema == "mbp-1" and quotes.roots == {118: {"ES"}}
    frame = quotes.quotes
    assert frame.height > 2000 and (frame["bid_px"] <= frame["ask_px"]).all()
    assert frame["quote_ts"].is_sorted()


def test_a_new_file_pairs_with_its_days_quotes_or_fails_naming_it(tmp_path: Path) -> None:
    """predict.files: a new file's quotes are paired as a training file's are; quote files of its days are no
    stray files for the training pairing; a new file with no quote file of its span fails in one line."""
    for folder in ("bars", "quotes", "new"):
        (tmp_path / folder).mkdir()
    _bar_file(tmp_path / "bars" / "es.ohlcv-1m.dbn.zst")
    own = _quote_file(tmp_path / "quotes" / "a.bbo-1m.dbn.zst", [(T0 + MINUTE, 5000.0, 5000.25)])
    week = 7 * 86_400 * 10**9
    new_bars = pl.DataFrame(
        {
            "ts_event": T0 + week + np.arange(5) * MINUTE,
            "instrument_id": [5602] * 5,
            "open": [5000.0] * 5,
            "high": [5000.5] * 5,
            "low": [4999.75] * 5,
            "close": [5000.25] * 5,
            "volume": [10] * 5,
        }
    )
    new = tmp_path / "new" / "later.ohlcv-1m.dbn.zst"
    write_dbn(
        new,
        encode_dbn(
            ohlcv_messages(new_bars),
            schema="ohlcv-1m",
            start_ns=T0 + week,
            end_ns=T0 + week + 5 * MINUTE,
            symbols={"ESM4": 5602},
        ),
    )
    config = {
        "data": {
            "source": "files",
            "files": str(tmp_path / "bars" / "*.dbn.zst"),
            "quotes": str(tmp_path / "quotes" / "*.dbn.zst"),
            "on_bad_file": "error",
        },
        "predict": {"files": str(tmp_path / "new" / "*.dbn.zst")},
    }
    with pytest.raises(
        ConfigError, match=r"no quote file covers the span of the new file .*later\.ohlcv-1m"
    ) as err:
        pipeline.predict_quote_inputs(config, "later.ohlcv-1m")
    assert "\n" not in str(err.value)
    later = tmp_path / "quotes" / "later.bbo-1m.dbn.zst"
    write_dbn(
        later,
        encode_dbn(
            [bbo_message(T0 + week + MINUTE, 5000.0, 5000.25, instrument_id=5602)],
            schema="bbo-1m",
            start_ns=T0 + week,
            end_ns=T0 + week + 5 * MINUTE,
            symbols={"ESM4": 5602},
        ),
    )
    assert pipeline.predict_quote_inputs(config, "later.ohlcv-1m") == [str(later)]
    assert pipeline.quote_inputs(config) == {"es.ohlcv-1m": [str(own)]}  # the new file's: no stray file
    no_quotes = {**config, "data": {**config["data"], "quotes": ""}}
    assert pipeline.predict_quote_inputs(no_quotes, "later.ohlcv-1m") == []


def test_a_file_of_several_days_takes_a_later_contracts_quotes_from_a_later_days_file(tmp_path: Path) -> None:
    """A new file spanning a roll (predict.files): the next contract's bars come after the first day, and so do
    its quotes; one quoted in none of the files its span overlaps is still an error naming the quote file."""
    day = 86_400 * 10**9
    bars = pl.DataFrame(
        {
            "ts_event": pl.Series([T0, T0 + MINUTE, T0 + day, T0 + day + MINUTE]).cast(
                pl.Datetime("ns", "UTC")
            ),
            "instrument_id": pl.Series([5602, 5602, 17077, 17077], dtype=pl.UInt32),
            "symbol": ["ES.c.0"] * 4,
        }
    )
    first = _quote_file(tmp_path / "d1.bbo-1m.dbn.zst", [(T0 + MINUTE, 5000.0, 5000.25)])
    start = T0 // day * day + day
    second = tmp_path / "d2.bbo-1m.dbn.zst"
    write_dbn(
        second,
        encode_dbn(
            [bbo_message(T0 + day + MINUTE, 5050.0, 5050.25, instrument_id=17077)],
            schema="bbo-1m",
            start_ns=start,
            end_ns=start + day,
            symbols={"ESM4": 17077},
        ),
    )
    joined = quotes_at_bars(bars, load_quotes([first, second], bars, Path("new.dbn.zst"), MINUTE), MINUTE)
    assert joined["bid_px"].to_list() == [5000.0, 5000.0, 5050.0, 5050.0]
    with pytest.raises(DataFileError, match=r"d1\.bbo-1m\.dbn\.zst: no quote of ES\.c\.0 \(17077\)"):
        load_quotes([first], bars, Path("new.dbn.zst"), MINUTE)
