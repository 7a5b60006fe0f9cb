"""``env.fill_delay`` (issue 38 item 1): a fill meets the quote that many seconds after the decision, joined at
feature build time into the quote columns; only the fill's cost moves, never what the models see."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import databento_dbn as dbn
import numpy as np
import polars as pl
import pytest

from marketrl.data.dbn_writer import encode_dbn, write_dbn
from marketrl.data.quotes import FINE_QUOTE_SCHEMAS, quotes_at_bars, read_quotes
from marketrl.data.reader import QUOTE_SCHEMAS, DataConfigError
from marketrl.env import EnvConfig, MarketData
from marketrl.env.rollout import position_results
from marketrl.features import build_feature_file
from marketrl.instruments.costs import CostModel
from marketrl.settings.config import ConfigError, validate_config
from marketrl.splits.datasets import feature_names_of
from marketrl.splits.normalize import FeatureNormalizer
from marketrl.workflow import stages
from tests.support.synthetic import bbo_message, ohlcv_messages, random_walk_bars, trade_messages

ES = CostModel(
    kind="futures", commission_per_contract=1.0, half_spread_ticks=0.5, tick_size=0.25, tick_value=12.5
)
POINT = ES.tick_value / ES.tick_size
START = dt.datetime(2024, 5, 9, 10, 0, tzinfo=dt.UTC)
T0 = int(START.timestamp()) * 10**9
SECOND = 10**9
MINUTE = 60 * SECOND
N_BARS = 160
DELAY = 3  # seconds
PLANTED_BAR = 140  # a feature row (the first 103 bars are warm-up)


def _bars() -> pl.DataFrame:
    return random_walk_bars(N_BARS, {5602: 5000.0}, start=START, gap_probability=0.0, seed=3)


def _bar_file(path: Path) -> Path:
    data = encode_dbn(
        ohlcv_messages(_bars()),
        schema="ohlcv-1m",
        start_ns=T0,
        end_ns=T0 + N_BARS * MINUTE,
        symbols={"ESM4": 5602},
    )
    return write_dbn(path, data)


def _regular_quotes(step_s: int) -> list[tuple[int, float, float]]:
    """One-tick-wide quotes every ``step_s`` seconds over the bars' span, at each bar's close price."""
    closes = _bars()["close"].to_numpy()
    stamps = T0 + np.arange(0, N_BARS * 60 + 1, step_s) * SECOND
    out = []
    for ts in stamps:
        bid = float(closes[min(int((ts - T0) // MINUTE), N_BARS - 1)])
        out.append((int(ts), bid, bid + 0.25))
    return out


def _quote_file(path: Path, quotes: list[tuple[int, float, float]], schema: str = "bbo-1s") -> Path:
    rtype = dbn.RType.BBO_1S if schema == "bbo-1s" else dbn.RType.BBO_1M
    messages = [bbo_message(ts, bid, ask, rtype=rtype) for ts, bid, ask in sorted(quotes)]
    day = T0 // (86_400 * SECOND) * 86_400 * SECOND
    data = encode_dbn(
        messages, schema=schema, start_ns=day, end_ns=day + 86_400 * SECOND, symbols={"ESM4": 5602}
    )
    return write_dbn(path, data)


def _close_of(bar: int) -> int:
    return T0 + (bar + 1) * MINUTE


def _planted(at_ns: int) -> list[tuple[int, float, float]]:
    """The regular quotes plus a quote 2 points wider on each side stamped at ``at_ns``."""
    closes = _bars()["close"].to_numpy()
    bid = float(closes[PLANTED_BAR])
    return [*_regular_quotes(5), (at_ns, bid - 1.0, bid + 1.25)]


def _table(tmp_path: Path, name: str, quotes: list[tuple[int, float, float]], delay: float) -> pl.DataFrame:
    src = _bar_file(tmp_path / f"{name}.ohlcv-1m.dbn.zst")
    quote_src = _quote_file(tmp_path / f"{name}.bbo-1s.dbn.zst", quotes)
    dst = tmp_path / f"{name}.parquet"
    build_feature_file(src, dst, quote_srcs=[quote_src], fill_delay=delay)
    return pl.read_parquet(dst)


def _market(table: pl.DataFrame, normalizer: FeatureNormalizer | None = None) -> MarketData:
    names = feature_names_of(table)
    normalizer = normalizer or FeatureNormalizer().fit(table, names)
    return MarketData.from_frame(table, names, normalizer, ES)


def _trade_cost_at(data: MarketData, bar_ts_ns: int) -> float:
    """The cost of buying one contract at the close of the bar opening at ``bar_ts_ns`` (flat before and after)."""
    row = int(np.flatnonzero(data.rows["ts_event"].dt.epoch("ns").to_numpy() == bar_ts_ns)[0])
    positions = np.zeros(data.n_rows, dtype=np.float32)
    positions[row] = 1.0
    return float(position_results(data, positions, EnvConfig(fill="close")).cost.numpy()[row])


# ---------------------------------------------------------------------------------------------- the join


def test_the_delayed_join_takes_the_quote_at_close_plus_delay_and_never_a_later_one() -> None:
    rows = pl.DataFrame(
        {
            "ts_event": pl.Series([T0, T0 + MINUTE]).cast(pl.Datetime("ns", "UTC")),
            "instrument_id": pl.Series([5602, 5602], dtype=pl.UInt32),
        }
    )
    stamps = [
        T0,
        T0 + DELAY * SECOND,
        T0 + MINUTE,
        T0 + MINUTE + DELAY * SECOND,
        T0 + MINUTE + DELAY * SECOND + 1,
    ]
    quotes = pl.DataFrame(
        {
            "quote_ts": pl.Series(stamps).cast(pl.Datetime("ns", "UTC")),
            "instrument_id": pl.Series([5602] * 5, dtype=pl.UInt32),
            "bid_px": [1.0, 2.0, 3.0, 4.0, 5.0],
            "ask_px": [1.25, 2.25, 3.25, 4.25, 5.25],
        }
    )
    delayed = quotes_at_bars(rows, quotes, MINUTE, DELAY * SECOND)
    assert delayed["open_bid_px"].to_list() == [2.0, 4.0]  # open + 3 s
    # close + 3 s: bar 0's is the quote stamped exactly then, never the one 1 ns later
    assert delayed["bid_px"].to_list() == [4.0, 5.0]
    assert quotes_at_bars(rows, quotes, MINUTE, 0).equals(quotes_at_bars(rows, quotes, MINUTE))
    assert quotes_at_bars(rows, quotes, MINUTE)["bid_px"].to_list() == [3.0, 5.0]


# --------------------------------------------------------------------------------- through the feature stage


def test_a_planted_quote_at_decision_plus_delay_costs_exactly_its_spread(tmp_path: Path) -> None:
    decision = _close_of(PLANTED_BAR)
    plain = _table(tmp_path, "plain", _regular_quotes(5), DELAY)
    planted = _table(tmp_path, "planted", _planted(decision + DELAY * SECOND), DELAY)
    plain_data = _market(plain)
    planted_data = _market(planted, FeatureNormalizer().fit(plain, feature_names_of(plain)))
    bar_ts = T0 + PLANTED_BAR * MINUTE
    close = float(_bars()["close"][PLANTED_BAR])
    extra = _trade_cost_at(planted_data, bar_ts) - _trade_cost_at(plain_data, bar_ts)
    # 1 point more on each side: the buy pays exactly 1 point more, as a fraction of the notional
    assert extra * close * POINT == pytest.approx(1.0 * POINT, rel=1e-4)
    # a trade at any other bar costs the same
    other = T0 + (PLANTED_BAR - 5) * MINUTE
    assert _trade_cost_at(planted_data, other) == _trade_cost_at(plain_data, other)
    # ...and the planted quote is a fill price only: every observation is the same
    assert torch_equal(planted_data.obs_table, plain_data.obs_table)
    names = feature_names_of(plain)
    assert planted.select(names).equals(plain.select(names))
    assert pq_metadata(tmp_path / "planted.parquet")[b"marketrl.fill_delay"] == b"3"


def test_a_quote_after_the_delay_or_a_zero_delay_ignores_the_planted_quote(tmp_path: Path) -> None:
    decision = _close_of(PLANTED_BAR)
    plain = _table(tmp_path, "plain", _regular_quotes(5), DELAY)
    late = _table(tmp_path, "late", _planted(decision + DELAY * SECOND + 1), DELAY)
    assert late.equals(plain)  # stamped 1 ns after decision + delay: not yet known to the fill
    undelayed = _table(tmp_path, "undelayed", _planted(decision + DELAY * SECOND), 0)
    assert undelayed.equals(_table(tmp_path, "plain0", _regular_quotes(5), 0))


def test_delay_zero_writes_the_same_table_byte_for_byte(tmp_path: Path) -> None:
    src = _bar_file(tmp_path / "bars.ohlcv-1m.dbn.zst")
    quote_src = _quote_file(tmp_path / "q.bbo-1s.dbn.zst", _planted(_close_of(PLANTED_BAR) + SECOND))
    build_feature_file(src, tmp_path / "default.parquet", quote_srcs=[quote_src])
    build_feature_file(src, tmp_path / "zero.parquet", quote_srcs=[quote_src], fill_delay=0)
    digest = [
        hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() for n in ("default.parquet", "zero.parquet")
    ]
    assert digest[0] == digest[1]
    assert b"marketrl.fill_delay" not in pq_metadata(tmp_path / "zero.parquet")


def test_quote_schema_bars_take_the_delayed_quote_from_their_own_records(tmp_path: Path) -> None:
    """mbp-1 bars: a trade every 10 s, each record carrying the book; the delayed quote is the book of the
    last record at or before close + delay, not the bar's last book."""
    n_bars = 120
    stamps = T0 + np.arange(0, n_bars * 60, 10) * SECOND + 2 * SECOND  # records at :02, :12, ... :52
    rng = np.random.default_rng(0)
    mid = 5000.0 + np.round(np.cumsum(rng.normal(0, 0.5, len(stamps))) * 4) / 4
    wide = (stamps - T0) % MINUTE == 2 * SECOND  # the record 2 s after each close is 2 ticks wide
    trades = pl.DataFrame(
        {
            "ts_event": stamps,
            "instrument_id": np.full(len(stamps), 5602, dtype=np.uint32),
            "price": mid,
            "size": np.ones(len(stamps), dtype=np.int64),
            "bid_px": mid - np.where(wide, 0.25, 0.0),
            "ask_px": mid + np.where(wide, 0.5, 0.25),
            "bid_sz": np.full(len(stamps), 3),
            "ask_sz": np.full(len(stamps), 3),
        }
    )
    data = encode_dbn(
        trade_messages(trades, "mbp-1"),
        schema="mbp-1",
        start_ns=T0,
        end_ns=T0 + n_bars * MINUTE,
        symbols={"ESM4": 5602},
    )
    src = write_dbn(tmp_path / "book.mbp-1.dbn.zst", data)
    build_feature_file(src, tmp_path / "d0.parquet")
    build_feature_file(src, tmp_path / "d3.parquet", fill_delay=DELAY)
    at_close = pl.read_parquet(tmp_path / "d0.parquet")
    delayed = pl.read_parquet(tmp_path / "d3.parquet")
    spread = lambda t: (t["ask_px"] - t["bid_px"]).to_numpy()  # noqa: E731
    assert np.allclose(spread(at_close), 0.25)  # the bar's last book (its :52 record): one tick
    # close + 3 s: the :02 record of the next minute; the file's last bar has none after its close (the next
    # day's file is not read), so it keeps its last record's
    assert np.allclose(spread(delayed)[:-1], 0.75) and spread(delayed)[-1] == 0.25
    names = feature_names_of(at_close)
    assert delayed.select(names).equals(at_close.select(names))  # the book features do not move


# ------------------------------------------------------------------------------------------------ errors


def test_coarse_or_missing_quotes_or_a_delay_of_a_bar_are_one_line_errors(tmp_path: Path) -> None:
    src = _bar_file(tmp_path / "bars.ohlcv-1m.dbn.zst")
    coarse = _quote_file(tmp_path / "q.bbo-1m.dbn.zst", _regular_quotes(60), schema="bbo-1m")
    cases = [
        (
            {"quote_srcs": [coarse], "fill_delay": 2},
            r"q\.bbo-1m\.dbn\.zst: config key 'env\.fill_delay'.*found bbo-1m",
        ),
        ({"fill_delay": 2}, r"bars\.ohlcv-1m\.dbn\.zst: config key 'env\.fill_delay'.*found no quotes"),
        ({"quote_srcs": [coarse], "fill_delay": 60}, r"env\.fill_delay': 60 s is not shorter than a bar"),
    ]
    for kwargs, pattern in cases:
        with pytest.raises(DataConfigError, match=pattern) as err:
            build_feature_file(src, tmp_path / "out.parquet", on_bad_file="skip", **kwargs)
        assert "\n" not in str(err.value)
        assert not (tmp_path / "out.parquet").exists()


def test_the_config_check_rejects_what_it_can_know_before_any_file() -> None:
    def config(**env_data: object) -> dict[str, object]:
        data = env_data.pop("data", {})
        return {"env": {"fill_delay": env_data.pop("fill_delay")}, "data": data}

    with pytest.raises(
        ConfigError, match=r"^config key 'env\.fill_delay': 2 s needs .*found the demo's bbo-1m"
    ):
        validate_config(config(fill_delay=2, data={"quotes": "demo"}))
    with pytest.raises(ConfigError, match=r"^config key 'env\.fill_delay': .*found no quotes"):
        validate_config(config(fill_delay=2, data={"quotes": ""}))
    with pytest.raises(
        ConfigError, match=r"^config key 'env\.fill_delay': .*data\.databento\.schema ohlcv-1m"
    ):
        validate_config(config(fill_delay=2, data={"source": "databento"}))
    with pytest.raises(
        ConfigError, match=r"'env\.fill_delay': 60 s is not shorter than a bar \(data\.bar_size 1m\)"
    ):
        validate_config(config(fill_delay=60, data={"source": "databento", "databento": {"schema": "mbp-1"}}))
    with pytest.raises(ConfigError, match=r"env\.fill_delay"):
        validate_config(config(fill_delay=-1))
    ok = validate_config(
        config(fill_delay=0.5, data={"source": "databento", "databento": {"schema": "mbp-1"}})
    )
    assert ok["env"]["fill_delay"] == 0.5
    assert validate_config({})["env"]["fill_delay"] == 0


def test_the_delay_reruns_the_features_and_everything_after_them() -> None:
    config = validate_config({})
    assert stages.stage_config(config, "features")["env"] == {"fill_delay": 0}
    reruns = dict(
        (row.split("|")[1].strip(" `"), row.split("|")[3].strip())
        for row in stages.config_key_table(config).splitlines()[2:]
    )
    assert reruns["env.fill_delay"] == reruns["data.quotes"]  # what a change of the quotes reruns


def torch_equal(a: object, b: object) -> bool:
    import torch

    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    return bool(torch.equal(a, b))


def pq_metadata(path: Path) -> dict[bytes, bytes]:
    import pyarrow.parquet as pq

    return pq.read_schema(path).metadata or {}


def test_the_reports_cost_sentence_states_the_delay() -> None:
    from marketrl.report.build import _cost_model_text

    rows = [{"fallback_fills": 0}]
    config = validate_config({"data": {"quotes": "demo"}})
    assert "of the quote at the fill time (env.fill: close" in _cost_model_text(config, rows)
    config["env"]["fill_delay"] = 2
    assert "of the quote 2 s after the fill time (env.fill_delay) (env.fill: close" in _cost_model_text(
        config, rows
    )


SAMPLES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dbn-samples" / "databento-python"
BOOK_SAMPLES = [SAMPLES / "GLBX.MDP3" / f"test_data.{schema}.dbn.zst" for schema in ("tbbo", "mbp-10")]


@pytest.mark.parametrize("path", BOOK_SAMPLES, ids=lambda p: p.name)
def test_real_quote_schema_bar_files_read_as_their_own_quotes(path: Path) -> None:
    """The delayed quotes of tbbo/mbp-10 bars come from their own records (Databento's samples)."""
    if not path.is_file():
        pytest.skip(f"real Databento sample absent: {path}")
    quotes = read_quotes(path, QUOTE_SCHEMAS)
    assert quotes.schema in FINE_QUOTE_SCHEMAS and quotes.quotes.height > 0
    assert (quotes.quotes["bid_px"] < quotes.quotes["ask_px"]).all() and quotes.quotes["quote_ts"].is_sorted()
