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
