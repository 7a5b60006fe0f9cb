"""DBN reader: real samples of every schema and DBN version, price/UNDEF/symbol handling, the bad-input matrix."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import databento
import databento_dbn as dbn
import numpy as np
import polars as pl
import pytest
import zstandard
from polars.testing import assert_frame_equal

from marketrl.calendars.sessions import DEFAULT_CALENDARS
from marketrl.data import reader
from marketrl.data.dbn_writer import MappingInterval, SymbolMapping, encode_dbn, write_dbn
from marketrl.data.reader import (
    SUPPORTED_SCHEMAS,
    DataFileError,
    parse_bar_size,
    read_bars,
)
from tests.support.synthetic import ohlcv_messages, random_walk_bars, trade_messages

MINUTE_NS = 60_000_000_000
NAUTILUS_BARS = "nautilus_trader/historical_bars_catalog/databento"
OHLCV_1M_ES_NQ = f"{NAUTILUS_BARS}/futures_ohlcv-1m_2024-07-01T23-40_2024-07-02T00-10.dbn.zst"
TRADES_ESU4 = f"{NAUTILUS_BARS}/futures_trades_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"
MBP1_ESU4 = f"{NAUTILUS_BARS}/futures_mbp-1_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"


def _all_samples() -> list[str]:
    root = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dbn-samples"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.dbn*")) if root.is_dir() else []


def _header_schema(path: Path) -> str | None:
    store = databento.DBNStore.from_file(path)
    return None if store.schema is None else str(store.schema)


@pytest.mark.parametrize("name", _all_samples() or ["<no samples>"])
def test_every_real_sample_decodes_or_is_cleanly_rejected(dbn_samples: Path, name: str) -> None:
    path = dbn_samples / name
    schema = _header_schema(path)
    dataset = str(databento.DBNStore.from_file(path).metadata.dataset)
    # Datasets without a default calendar need data.session; UTC days exercise their decoding all the same.
    session = None if dataset in DEFAULT_CALENDARS else {"timezone": "UTC", "open": "00:00"}
    try:
        bar_file = read_bars(
            path, "1s" if schema in (None, "ohlcv-1s") or "ohlcv" not in schema else "1d", session=session
        )
    except DataFileError as exc:
        message = str(exc)
        assert "\n" not in message and path.name in message
        if schema is None:
            assert "mixed-schema" in message
        elif schema not in SUPPORTED_SCHEMAS:
            assert "unsupported schema" in message
        else:
            assert "no records" in message  # the header-only ohlcv-1d samples
            assert len(databento.DBNStore.from_file(path).to_ndarray()) == 0
        return
    assert schema in SUPPORTED_SCHEMAS
    bars = bar_file.bars
    assert bars["instrument_id"].dtype == pl.UInt32 and bars["ts_event"].dtype == pl.Datetime("ns", "UTC")
    assert bars.equals(bars.sort("instrument_id", "ts_event"))
    if bars.height:
        assert (bars["high"] >= bars["low"]).all() and (bars["low"] > 0).all()
        assert bars["symbol"].null_count() == 0


@pytest.mark.parametrize("schema", ["ohlcv-1s", "ohlcv-1m", "trades", "tbbo", "mbp-1", "mbp-10", "mbo"])
def test_dbn_versions_1_2_3_decode_identically(dbn_samples: Path, schema: str) -> None:
    files = [read_bars(dbn_samples / f"databento-dbn/test_data.{schema}.v{v}.dbn.zst") for v in (1, 2, 3)]
    assert [f.dbn_version for f in files] == [1, 2, 3]
    assert files[0].records > 0
    for other in files[1:]:
        assert other.records == files[0].records
        assert_frame_equal(other.bars, files[0].bars)


def test_real_ohlcv_prices_scaled_and_two_symbols_mapped(dbn_samples: Path) -> None:
    path = dbn_samples / OHLCV_1M_ES_NQ
    bars = read_bars(path, "1m").bars
    assert sorted(bars["symbol"].unique()) == ["ESU4", "NQU4"]
    assert bars.group_by("symbol").len().sort("symbol")["len"].to_list() == [30, 30]
    # Compare with databento's own float conversion and symbol mapping.
    ref = databento.DBNStore.from_file(path).to_df().reset_index()
    ref_frame = pl.DataFrame(
        {
            "ts_event": ref["ts_event"].astype("int64").to_numpy(),
            "symbol": ref["symbol"].astype(str).to_numpy(),
            "close": ref["close"].to_numpy(),
            "volume": ref["volume"].to_numpy().astype(np.float64),
        }
    ).sort("symbol", "ts_event")
    ours = bars.select(pl.col("ts_event").cast(pl.Int64), "symbol", "close", "volume").sort(
        "symbol", "ts_event"
    )
    assert_frame_equal(ours, ref_frame, check_dtypes=False, rel_tol=1e-12)
    es_close = bars.filter(pl.col("symbol") == "ESU4")["close"]
    assert 5000 < es_close.min() < es_close.max() < 6500  # E-mini S&P in July 2024: the 1e-9 scale is right


def test_real_trades_and_mbp1_give_the_same_bars(dbn_samples: Path) -> None:
    """The mbp-1 file's trade records are the trades file: both must give identical OHLCV bars."""
    trades = read_bars(dbn_samples / TRADES_ESU4, "1s")
    mbp1 = read_bars(dbn_samples / MBP1_ESU4, "1s")
    ohlcv = ["ts_event", "instrument_id", "symbol", "open", "high", "low", "close", "volume"]
    assert trades.bars.height == 44
    assert_frame_equal(trades.bars.select(ohlcv), mbp1.bars.select(ohlcv))
    assert mbp1.has_book and not trades.has_book
    book = mbp1.bars.select("bid_px", "ask_px")
    assert book.null_count().row(0) == (0, 0)
    assert (book["ask_px"] >= book["bid_px"]).all()
    assert trades.bars["volume"].sum() == float(
        databento.DBNStore.from_file(dbn_samples / TRADES_ESU4).to_ndarray()["size"].sum()
    )


def test_real_mbo_uses_trade_actions_only(dbn_samples: Path) -> None:
    path = dbn_samples / "nautilus_trader/esh4-glbx-mdp3-20231225.mbo.dbn.zst"
    records = databento.DBNStore.from_file(path).to_ndarray()
    is_trade = records["action"] == b"T"
    bars = read_bars(path, "1m").bars
    assert bars["volume"].sum() == float(records["size"][is_trade].sum())
    assert bars.height == 60 and bars["symbol"].unique().to_list() == ["ESH4"]


def _ohlcv_file(tmp_path: Path, bars: pl.DataFrame, name: str = "bars.dbn.zst", **kwargs: object) -> Path:
    start, end = int(bars["ts_event"].cast(pl.Int64).min()), int(bars["ts_event"].cast(pl.Int64).max())
    kwargs.setdefault("symbols", {f"S{iid}": iid for iid in bars["instrument_id"].unique()})
    return write_dbn(
        tmp_path / name,
        encode_dbn(ohlcv_messages(bars), schema="ohlcv-1m", start_ns=start, end_ns=end + MINUTE_NS, **kwargs),
    )


def test_trades_aggregate_to_time_bars(tmp_path: Path) -> None:
    base = 1_704_153_600 * 1_000_000_000  # 2024-01-02 00:00 UTC
    trades = pl.DataFrame(
        {
            "ts_event": [base + 5, base + 10, base + 20, base + MINUTE_NS + 1, base + 3 * MINUTE_NS + 7],
            "instrument_id": [4, 4, 4, 4, 4],
            "price": [100.0, 101.5, 99.25, 100.5, 102.0],
            "size": [1, 2, 3, 4, 5],
            "action": ["T", "T", "T", "T", "T"],
        }
    )
    path = write_dbn(
        tmp_path / "t.dbn.zst",
        encode_dbn(
            trade_messages(trades),
            schema="trades",
            start_ns=base,
            end_ns=base + 4 * MINUTE_NS,
            symbols={"X": 4},
        ),
    )
    bars = read_bars(path, "1m").bars
    assert bars["ts_event"].cast(pl.Int64).to_list() == [base, base + MINUTE_NS, base + 3 * MINUTE_NS]
    assert bars.select("open", "high", "low", "close", "volume").rows() == [
        (100.0, 101.5, 99.25, 99.25, 6.0),
        (100.5, 100.5, 100.5, 100.5, 4.0),
        (102.0, 102.0, 102.0, 102.0, 5.0),
    ]  # the empty minute (base+2m) has no bar


def test_quote_schema_bars_carry_book_at_bar_close(tmp_path: Path) -> None:
    base = 1_704_153_600 * 1_000_000_000
    rows = {
        "ts_event": [base + 1, base + 2, base + 3, base + MINUTE_NS + 1],
        "instrument_id": [4] * 4,
        "price": [100.0, 0.0, 100.25, 100.5],
        "size": [1, 7, 2, 3],
        "action": ["T", "A", "T", "T"],  # the add (A) moves the book but is no trade
        "bid_px": [99.75, 100.0, 100.0, 100.25],
        "ask_px": [100.25, 100.25, 100.5, 100.75],
        "bid_sz": [5, 12, 10, 4],
        "ask_sz": [6, 6, 2, 9],
    }
    path = write_dbn(
        tmp_path / "q.dbn.zst",
        encode_dbn(
            trade_messages(pl.DataFrame(rows), "mbp-1"),
            schema="mbp-1",
            start_ns=base,
            end_ns=base + 2 * MINUTE_NS,
        ),
    )
    bars = read_bars(path, "1m").bars
    assert bars.select("open", "close", "volume", "bid_px", "ask_px", "bid_sz", "ask_sz").rows() == [
        (100.0, 100.25, 3.0, 100.0, 100.5, 10.0, 2.0),
        (100.5, 100.5, 3.0, 100.25, 100.75, 4.0, 9.0),
    ]
    assert bars["symbol"].to_list() == ["4", "4"]  # no mappings in the header → str(instrument_id)


def test_decoding_in_small_chunks_gives_the_same_bars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 5 records split instruments and days across chunks."""
    bars = random_walk_bars(60, {3: 100.0, 8: 50.0, 5: 20.0}, seed=9)
    msgs = ohlcv_messages(bars)
    start, end = int(bars["ts_event"].min()), int(bars["ts_event"].max()) + MINUTE_NS
    path = write_dbn(
        tmp_path / "c.dbn.zst",
        encode_dbn(msgs, schema="ohlcv-1m", start_ns=start, end_ns=end, symbols={"A": 3, "B": 8}),
    )
    whole = read_bars(path, "1m").bars
    monkeypatch.setattr(reader, "DECODE_CHUNK_RECORDS", 5)
    chunked = read_bars(path, "1m").bars
    assert_frame_equal(chunked, whole)
    expected = bars.with_columns(pl.col("ts_event").cast(pl.Datetime("ns", "UTC")))
    assert_frame_equal(
        chunked.select(expected.columns), expected.sort("instrument_id", "ts_event"), check_dtypes=False
    )
    assert chunked["symbol"].unique().sort().to_list() == ["5", "A", "B"]


def test_quote_book_decoded_in_small_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    n = 120
    base = 1_704_153_600 * 1_000_000_000
    price = 100 + np.round(np.cumsum(rng.normal(0, 0.1, n)) * 4) / 4
    rows = pl.DataFrame(
        {
            "ts_event": base + np.sort(rng.integers(0, 5 * MINUTE_NS, n)),
            "instrument_id": rng.choice([4, 6], n),
            "price": price,
            "size": rng.integers(1, 9, n),
            "action": rng.choice(["T", "A", "C"], n),
            "bid_px": price - 0.25,
            "ask_px": price + 0.25,
            "bid_sz": rng.integers(1, 50, n),
            "ask_sz": rng.integers(1, 50, n),
        }
    )
    path = write_dbn(
        tmp_path / "q.dbn.zst",
        encode_dbn(trade_messages(rows, "mbp-1"), schema="mbp-1", start_ns=base, end_ns=base + 5 * MINUTE_NS),
    )
    whole = read_bars(path, "1m").bars
    monkeypatch.setattr(reader, "DECODE_CHUNK_RECORDS", 7)
    assert_frame_equal(read_bars(path, "1m").bars, whole)
    assert whole["instrument_id"].unique().to_list() == [4, 6] and whole["bid_px"].null_count() == 0


def test_undef_price_and_undef_timestamp(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bars = random_walk_bars(10, {3: 100.0}, seed=2, gap_probability=0.0)
    msgs = ohlcv_messages(bars)
    start = int(bars["ts_event"].min())
    undef_price = dbn.OHLCVMsg(dbn.RType.OHLCV_1M, 1, 3, start + 20 * MINUTE_NS, dbn.UNDEF_PRICE, 1, 1, 1, 1)
    undef_ts = dbn.OHLCVMsg(dbn.RType.OHLCV_1M, 1, 3, dbn.UNDEF_TIMESTAMP, 1, 1, 1, 1, 1)
    path = write_dbn(
        tmp_path / "u.dbn.zst",
        encode_dbn(
            [*msgs, undef_price, undef_ts, undef_ts],
            schema="ohlcv-1m",
            start_ns=start,
            end_ns=start + 30 * MINUTE_NS,
            symbols={"Z": 3},
        ),
    )
    with caplog.at_level("WARNING"):
        bar_file = read_bars(path, "1m")
    assert bar_file.dropped_undef_ts == 2 and "2 record(s) with undefined ts_event" in caplog.text
    assert bar_file.records == 13 and bar_file.bars.height == 10  # the UNDEF_PRICE bar is left out
    assert_frame_equal(
        bar_file.bars.select("open", "high", "low", "close"), bars.select("open", "high", "low", "close")
    )


def test_symbol_follows_mapping_intervals(tmp_path: Path) -> None:
    """An instrument_id re-used for another symbol on a later day (e.g. a roll) maps per UTC date, as
    Databento's mappings do, whatever the trading day (here one CME session spans both UTC dates)."""
    day1 = dt.datetime(2024, 3, 5, 23, 0, tzinfo=dt.UTC)  # 17:00 CST, the session open of Wednesday
    bars = random_walk_bars(120, {9: 50.0}, start=day1, seed=3, gap_probability=0.0)  # 23:00 → 00:59
    mappings = [
        SymbolMapping("OLD", [MappingInterval(dt.date(2024, 3, 5), dt.date(2024, 3, 6), "9")]),
        SymbolMapping("NEW", [MappingInterval(dt.date(2024, 3, 6), dt.date(2024, 3, 7), "9")]),
    ]
    path = _ohlcv_file(tmp_path, bars, mappings=mappings)
    out = read_bars(path, "1m").bars
    by_day = out.group_by(pl.col("ts_event").dt.date()).agg(pl.col("symbol").unique()).sort("ts_event")
    assert by_day["symbol"].to_list() == [["OLD"], ["NEW"]]
    assert out["trading_day"].unique().to_list() == [dt.date(2024, 3, 6)]


def test_coarser_bars_from_ohlcv_and_bar_size_errors(tmp_path: Path) -> None:
    bars = random_walk_bars(30, {3: 100.0}, seed=4, gap_probability=0.0)
    path = _ohlcv_file(tmp_path, bars)
    five = read_bars(path, "5m").bars
    assert five.height == 6
    first = bars.head(5)
    assert five.row(0, named=True)["high"] == first["high"].max()
    assert five.row(0, named=True)["volume"] == first["volume"].sum()
    assert five.row(0, named=True)["close"] == first["close"][-1]
    with pytest.raises(DataFileError, match="cannot be built from ohlcv-1m"):
        read_bars(path, "1s")
    for bad in ("7m", "1w", "", "0s", "m1"):
        with pytest.raises(ValueError, match="bar_size"):
            parse_bar_size(bad)
    assert parse_bar_size("15m") == 15 * MINUTE_NS


# ---------------------------------------------------------------- bad input matrix


def _good_payload() -> bytes:
    bars = random_walk_bars(20, {3: 100.0}, seed=5, gap_probability=0.0)
    start = int(bars["ts_event"].min())
    return encode_dbn(
        ohlcv_messages(bars), schema="ohlcv-1m", start_ns=start, end_ns=start + 20 * MINUTE_NS, compress=False
    )


def _bad_empty(tmp: Path) -> Path:
    return write_dbn(tmp / "empty.dbn.zst", b"")


def _bad_truncated_zstd(tmp: Path) -> Path:
    data = zstandard.ZstdCompressor().compress(_good_payload())
    return write_dbn(tmp / "truncated.dbn.zst", data[: len(data) * 2 // 3])


def _bad_truncated_zstd_at_record_boundary(tmp: Path) -> Path:
    # Cut after whole records at a block boundary (no trailing partial record): the frame walk names it.
    payload = _good_payload()
    cobj = zstandard.ZstdCompressor().compressobj()
    data = cobj.compress(payload) + cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    return write_dbn(tmp / "cut_on_record.dbn.zst", data)


def _bad_truncated_raw_record(tmp: Path) -> Path:
    return write_dbn(
        tmp / "partial_record.dbn", _good_payload()[:-13]
    )  # uncompressed DBN: databento only warns


def _bad_random_bytes(tmp: Path) -> Path:
    return write_dbn(tmp / "random.dbn.zst", np.random.default_rng(0).bytes(4096))


def _bad_zstd_garbage(tmp: Path) -> Path:
    return write_dbn(
        tmp / "garbage.dbn.zst", zstandard.ZstdCompressor().compress(np.random.default_rng(1).bytes(4096))
    )


def _bad_schema_mismatch(tmp: Path) -> Path:
    base = 1_704_153_600 * 1_000_000_000
    trades = pl.DataFrame(
        {
            "ts_event": [base + k for k in range(7)],
            "instrument_id": [1] * 7,
            "price": [1.0] * 7,
            "size": [1] * 7,
        }
    )
    # Header says ohlcv-1m; the records are trades (48 bytes each, rtype 0).
    return write_dbn(
        tmp / "mislabelled.dbn.zst",
        encode_dbn(trade_messages(trades), schema="ohlcv-1m", start_ns=base, end_ns=base + 10),
    )


def _bad_schema_mismatch_same_size(tmp: Path) -> Path:
    bars = random_walk_bars(5, {3: 100.0}, seed=6)
    start = int(bars["ts_event"].min())
    # ohlcv-1h header over ohlcv-1m records: same 56-byte layout, only the rtype tells.
    return write_dbn(
        tmp / "wrong_rtype.dbn.zst",
        encode_dbn(ohlcv_messages(bars), schema="ohlcv-1h", start_ns=start, end_ns=start + 1),
    )


def _bad_no_records(tmp: Path) -> Path:
    return write_dbn(tmp / "header_only.dbn.zst", encode_dbn([], schema="trades", start_ns=0, end_ns=1))


BAD_INPUTS = {
    "empty file": (_bad_empty, "empty file"),
    "truncated zstd": (_bad_truncated_zstd, "truncated zstd"),
    "truncated zstd on a record boundary": (_bad_truncated_zstd_at_record_boundary, "truncated zstd"),
    "partial record (databento warning escalated)": (_bad_truncated_raw_record, "truncated DBN data"),
    "random bytes": (_bad_random_bytes, "not a DBN file"),
    "zstd wrapping garbage": (_bad_zstd_garbage, "not a valid DBN stream"),
    "header schema != record type": (_bad_schema_mismatch, "does not match|byte record"),
    "header schema != rtype (same size)": (_bad_schema_mismatch_same_size, "does not match record type"),
    "no records": (_bad_no_records, "no records"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_error_naming_file(tmp_path: Path, case: str) -> None:
    make, fault = BAD_INPUTS[case]
    path = make(tmp_path)
    with pytest.raises(DataFileError, match=fault) as info:
        read_bars(path, "1m")
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "\n" not in message and message.startswith(str(path))


@pytest.mark.parametrize(
    ("name", "fault"),
    [
        ("databento-dbn/test_data.definition.v1.dbn.zst", "unsupported schema 'definition'"),
        ("databento-dbn/test_data.statistics.v3.dbn.zst", "unsupported schema 'statistics'"),
        ("databento-dbn/test_data.status.v2.dbn.zst", "unsupported schema 'status'"),
        ("databento-dbn/test_data.imbalance.v2.dbn.zst", "unsupported schema 'imbalance'"),
        ("databento-dbn/test_data.bbo-1s.v3.dbn.zst", "unsupported schema 'bbo-1s'"),
        ("databento-python/LIVE/test_data.live.dbn.zst", "mixed-schema file"),
        ("databento-dbn/test_data.ohlcv-1d.v2.dbn.zst", "no records"),
    ],
)
def test_real_unsupported_files_are_rejected(dbn_samples: Path, name: str, fault: str) -> None:
    with pytest.raises(DataFileError, match=fault) as info:
        read_bars(dbn_samples / name, "1d")
    assert "\n" not in str(info.value)


def test_good_baseline_of_the_bad_matrix_decodes(tmp_path: Path) -> None:
    """The matrix above corrupts this payload; intact (raw or zstd) it decodes, so the faults are the cause."""
    payload = _good_payload()
    raw = write_dbn(tmp_path / "ok.dbn", payload)
    packed = write_dbn(tmp_path / "ok.dbn.zst", zstandard.ZstdCompressor().compress(payload))
    assert read_bars(raw, "1m").bars.height == read_bars(packed, "1m").bars.height == 20
    # A multi-frame zstd stream is legal and must pass the frame walk.
    half = len(payload) // 2
    two_frames = zstandard.ZstdCompressor().compress(payload[:half]) + zstandard.ZstdCompressor().compress(
        payload[half:]
    )
    assert read_bars(write_dbn(tmp_path / "two.dbn.zst", two_frames), "1m").bars.height == 20


def test_unreadable_path_is_a_data_file_error(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="cannot read file"):
        read_bars(tmp_path / "missing.dbn.zst")
    if os.name == "posix":
        with pytest.raises(DataFileError, match="cannot read file"):
            read_bars(tmp_path)  # a directory
