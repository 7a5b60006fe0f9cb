"""Demo data: valid DBN that databento reads back exactly, realistic enough, and byte-reproducible."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import databento as db
import numpy as np
import pandas as pd
import pytest

from marketrl.data.demo import DEMO_INSTRUMENTS, SESSION_BARS, generate_demo_files
from marketrl.pipeline import demo_file_name


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    generate_demo_files(out, "2024-01-04", 12, seed=5)  # Thursday start: crosses a weekend
    return out


def _frames(directory: Path) -> list:
    return [db.DBNStore.from_file(p) for p in sorted(directory.glob("*.dbn.zst"))]


def test_one_file_per_weekday_named_like_databento(demo_dir: Path) -> None:
    names = sorted(p.name for p in demo_dir.glob("*.dbn.zst"))
    assert len(names) == 12
    assert names[0] == demo_file_name(dt.date(2024, 1, 4)) == "glbx-mdp3-20240104.ohlcv-1m.dbn.zst"
    assert "glbx-mdp3-20240106.ohlcv-1m.dbn.zst" not in names  # Saturday


def test_round_trip_through_databento(demo_dir: Path) -> None:
    for store in _frames(demo_dir):
        assert store.schema == db.Schema.OHLCV_1M
        assert store.metadata.dataset == "GLBX.MDP3"
        records = store.to_ndarray()
        df = store.to_df()  # symbol mapping through the file's own symbology
        assert len(df) == len(records) > 0
        assert set(df["symbol"]) == {inst.symbol for inst in DEMO_INSTRUMENTS}
        day = df.index[0].date()
        assert (df.index.date == day).all()
        minutes = df.index.hour * 60 + df.index.minute
        assert minutes.max() < SESSION_BARS  # nothing during the session break
        assert (df["low"] <= df[["open", "close"]].min(axis=1)).all()
        assert (df["high"] >= df[["open", "close"]].max(axis=1)).all()
        assert (df["volume"] > 0).all()
        for inst in DEMO_INSTRUMENTS:
            prices = df.loc[df["symbol"] == inst.symbol, ["open", "high", "low", "close"]].to_numpy()
            np.testing.assert_allclose(prices / inst.tick_size, np.round(prices / inst.tick_size), atol=1e-6)


def _closes(directory: Path) -> dict[str, np.ndarray]:
    frames = [store.to_df() for store in _frames(directory)]
    out = {}
    for inst in DEMO_INSTRUMENTS:
        out[inst.symbol] = np.concatenate(
            [f.loc[f["symbol"] == inst.symbol, "close"].to_numpy() for f in frames]
        )
    return out


def test_stylized_facts(demo_dir: Path) -> None:
    closes = _closes(demo_dir)
    returns = {k: np.diff(np.log(v)) for k, v in closes.items()}
    es = returns["SYNTH-ES"]
    standardized = (es - es.mean()) / es.std()
    assert np.mean(standardized**4) > 4.0  # fat tails (a normal has 3)
    absolute = np.abs(es)
    lag1 = np.corrcoef(absolute[:-1], absolute[1:])[0, 1]
    assert lag1 > 0.05  # volatility clustering / seasonality


def test_instruments_are_correlated(demo_dir: Path) -> None:
    frames = [store.to_df() for store in _frames(demo_dir)]
    df = pd.concat(frames)
    wide = df.pivot_table(index=df.index, columns="symbol", values="close")
    log_returns = np.log(wide).diff().dropna()  # bars missing in either instrument drop out of the alignment
    assert log_returns.corr().loc["SYNTH-ES", "SYNTH-NQ"] > 0.6


def test_intraday_volume_seasonality(demo_dir: Path) -> None:
    df = db.DBNStore.from_file(sorted(demo_dir.glob("*.dbn.zst"))[1]).to_df()
    hour_volume = df.groupby(df.index.hour)["volume"].mean()
    assert hour_volume.loc[14] > 2 * hour_volume.loc[4]  # US cash open busier than the Asian night


def test_same_seed_same_bytes_different_seed_different(tmp_path: Path) -> None:
    def digest(out: Path, seed: int) -> list[str]:
        paths = generate_demo_files(out, "2024-01-02", 2, seed=seed)
        return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]

    assert digest(tmp_path / "a", 9) == digest(tmp_path / "b", 9)
    assert digest(tmp_path / "a", 9) != digest(tmp_path / "c", 10)


# --- planted edge (data.demo.edge) ---------------------------------------------------------------------------

EDGE_DAYS = 150  # enough days that the paired comparison below is tight; generated in a few seconds


def _oracle_sharpe(n_days: int, seed: int, edge: float) -> float:
    """Realized annualized net Sharpe of the oracle (sign of the `ret_15` feature: log close_t − log close_{t−15}
    rows back, per instrument), scored by the project's env and metrics with config.yaml's costs, fill at close."""
    import polars as pl
    import yaml

    from marketrl.data.demo import EDGE_LOOKBACK, simulate_demo_bars
    from marketrl.datasets import cost_model_from_config
    from marketrl.env import MarketData, evaluate_positions
    from marketrl.metrics import performance_summary

    columns: dict[str, list] = {"ts_event": [], "instrument_id": [], "symbol": [], "open": [], "close": []}
    for day, day_bars in simulate_demo_bars("2024-01-02", n_days, seed, edge):
        day_start = np.datetime64(day, "ns")
        for bars in day_bars:
            columns["ts_event"].append(day_start + bars.minutes.astype("timedelta64[m]"))
            columns["instrument_id"].append(np.full(bars.minutes.size, bars.instrument.instrument_id))
            columns["symbol"].append(np.full(bars.minutes.size, bars.instrument.symbol))
            columns["open"].append(bars.open)
            columns["close"].append(bars.close)
    df = (
        pl.DataFrame({name: np.concatenate(parts) for name, parts in columns.items()})
        .with_columns(pl.col("ts_event").dt.replace_time_zone("UTC"))
        .with_columns(trading_day=pl.col("ts_event").dt.date())
        .sort("instrument_id", "ts_event")
    )
    log_close = np.log(df["close"].to_numpy())
    instrument = df["instrument_id"].to_numpy()
    known = np.zeros(df.height, dtype=bool)
    known[EDGE_LOOKBACK:] = instrument[EDGE_LOOKBACK:] == instrument[:-EDGE_LOOKBACK]
    ret_15 = np.zeros(df.height)
    ret_15[EDGE_LOOKBACK:] = log_close[EDGE_LOOKBACK:] - log_close[:-EDGE_LOOKBACK]
    positions = np.where(known, np.sign(ret_15), 0.0)
    costs = cost_model_from_config(yaml.safe_load(Path("config.yaml").read_text())["costs"])
    data = MarketData.from_arrays(
        np.zeros((df.height, 1)),
        opens=df["open"].to_numpy(),
        closes=df["close"].to_numpy(),
        instrument_id=instrument,
        ts_event_ns=df["ts_event"].dt.epoch("ns").to_numpy(),
        cost_model=costs,
        rows=df.select("ts_event", "trading_day", "instrument_id", "symbol"),
    )
    return performance_summary(evaluate_positions(data, positions))["sharpe"]


def test_edge_is_calibrated_for_the_default_costs() -> None:
    import yaml

    from marketrl.data.demo import CALIBRATION_COSTS
    from marketrl.datasets import cost_model_from_config

    costs = yaml.safe_load(Path("config.yaml").read_text())["costs"]
    assert cost_model_from_config(costs) == CALIBRATION_COSTS


def test_planted_edge_gives_the_oracle_the_requested_sharpe() -> None:
    from marketrl.data.demo import _calibration_sample, edge_coefficient, expected_oracle_sharpe

    expected_no_edge = expected_oracle_sharpe(*_calibration_sample(), 0.0)  # pure cost drag, about −9
    with_edge = _oracle_sharpe(EDGE_DAYS, seed=11, edge=2.0)
    without = _oracle_sharpe(EDGE_DAYS, seed=11, edge=0.0)
    # A realized Sharpe over N days has a standard error of about sqrt(252/N · (1 + SR_daily²/2)), ≈ 1.3 here:
    # each run must lie within 3 of them of its target.
    tolerance = 3.0 * np.sqrt(252 / EDGE_DAYS * (1 + (2.0 / np.sqrt(252)) ** 2 / 2))
    assert abs(with_edge - 2.0) < tolerance
    assert abs(without - expected_no_edge) < tolerance
    # Paired on the same innovations, the unpredictable part of the two P&Ls nearly cancels: the edge's own
    # contribution is pinned far tighter (seeds 0-3 gave 10.2-11.6 against 10.95 expected).
    assert abs((with_edge - without) - (2.0 - expected_no_edge)) < 1.5
    assert 0 < edge_coefficient(2.0) < edge_coefficient(4.0) < 1.0 / 15  # stronger edge, stationary process


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
