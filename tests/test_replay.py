"""`make replay`: one position series replayed through NautilusTrader beside marketrl's own accounting
(marketrl.evaluation.replay). The engine tests need the optional `replay` extra and skip with the reason where it
is missing; `make test-replay` (a step of .ci/run) installs it and runs this file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from marketrl.evaluation import replay as rp
from marketrl.evaluation.nautilus_replay import nautilus_version
from marketrl.instruments.symbols import symbol_root
from marketrl.settings.config import load_config
from tests.conftest import DBN_SAMPLES, REPO_ROOT

NAUTILUS = nautilus_version()
needs_nautilus = pytest.mark.skipif(
    NAUTILUS is None,
    reason="nautilus_trader is not installed (the optional `replay` extra; `make test-replay` installs it)",
)
CATALOG = DBN_SAMPLES / "nautilus_trader" / "historical_bars_catalog" / "databento"
OHLCV = CATALOG / "futures_ohlcv-1m_2024-07-01T23-40_2024-07-02T00-10.dbn.zst"
MBP_1 = CATALOG / "futures_mbp-1_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"
DEFINITIONS = CATALOG / "futures_definition.dbn.zst"
needs_samples = pytest.mark.skipif(not OHLCV.exists(), reason=f"DBN samples missing: {CATALOG}")
MINUTE = 60 * 10**9
T0 = 1_709_200_800 * 10**9  # 2024-02-29 10:00 UTC (a Thursday)


def _config(**costs: Any) -> dict[str, Any]:
    config = load_config(REPO_ROOT / "config.yaml")
    for key, value in costs.items():
        config["costs"][key] = value
        for entry in config["costs"]["instruments"].values():
            entry[key] = value
    return config


def _sample(path: Path, rule: str, lookback: int = 5, **costs: Any) -> rp.Prepared:
    config = _config(**costs)
    config["data"]["definitions"] = str(DEFINITIONS)
    config = rp.resolve_definitions(config)
    return rp.prepare(rp.load_prices(str(path)), None, config, rule=rule, lookback=lookback)


def _rolled(n_old: int = 8, n_new: int = 8, gap_minutes: int = 0) -> pl.DataFrame:
    """ES.c.0 over two contracts (a roll), then (gap_minutes > 0) a data gap longer than env.max_gap inside the
    new contract: two chains."""
    rng = np.random.default_rng(3)
    n = n_old + n_new
    ts = T0 + np.arange(n) * MINUTE
    if gap_minutes:
        ts[n_old + n_new // 2 :] += gap_minutes * MINUTE
    closes = 5000.0 + np.round(np.cumsum(rng.normal(0, 1.0, n)) * 4) / 4
    closes[n_old:] += 40.0  # the new contract trades at a premium: the price gap nobody earns
    opens = np.concatenate([[closes[0]], closes[:-1]]) + 0.25
    opens[n_old] = closes[n_old] - 1.0
    ts_col = pl.Series(ts).cast(pl.Datetime("ns", "UTC"))
    return pl.DataFrame(
        {
            "ts_event": ts_col,
            "trading_day": ts_col.dt.date(),
            "instrument_id": pl.Series([11] * n_old + [22] * n_new, dtype=pl.UInt32),
            "symbol": ["ES.c.0"] * n,
            "open": opens,
            "high": np.maximum(opens, closes) + 0.25,
            "low": np.minimum(opens, closes) - 0.25,
            "close": closes,
        }
    ).sort("instrument_id", "ts_event")


def _check_agreement(summary: dict[str, Any]) -> None:
    """Bar fills with marketrl's own fees: the gap is the chain ends' closing fills, and rounding."""
    total = summary["total"]
    assert total["fill_price"] == 0.0
    assert abs(total["fees"]) < 1e-3  # float32 cost fractions; a wrong fee is cents at least
    assert abs(total["residual"]) < 1e-2
    assert max(abs(day["residual"]) for day in summary["days"]) < 1e-2
    assert abs(total["gap"] - total["chain_end"]) < 1e-2
    # Nautilus's own account (its realized PnL, commissions and open positions) says the same as its fills marked
    # at the bars' closes
    assert summary["nautilus_account"]["total"] == pytest.approx(total["nautilus"], abs=1e-6)


def test_package_imports_without_nautilus() -> None:
    """The replay modules import without nautilus_trader; running the engine then says how to install it."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'nautilus_trader':\n"
        "            raise ImportError('blocked', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import marketrl.evaluation.replay\n"
        "from marketrl.evaluation.nautilus_replay import run_nautilus, ReplayEngineError, nautilus_version\n"
        "assert nautilus_version() is None\n"
        "try:\n"
        "    run_nautilus({}, [], {}, quotes=False, fees={})\n"
        "except ReplayEngineError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True
    )
    assert "not installed" in out.stdout and "make replay" in out.stdout


def test_missing_positions_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "results/eval/dqn/fold_0/seed_0/bars.parquet"
    code = rp.main(["--positions", str(missing), "--prices", "x/*.parquet", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(missing) in err and "make run" in err
    assert not (tmp_path / "out").exists()


def test_positions_at_unknown_bars_name_the_file(tmp_path: Path) -> None:
    prices = _rolled()
    positions = pl.DataFrame(
        {
            "ts_event": pl.Series([T0 + 999 * MINUTE]).cast(pl.Datetime("ns", "UTC")),
            "trading_day": [prices["trading_day"][0]],
            "symbol": ["ES.c.0"],
            "position": [1],
        }
    )
    with pytest.raises(rp.ReplayError, match=r"pos\.parquet: 1 of 1 positions are at bars missing"):
        rp.prepare(prices, positions, _config(), source="pos.parquet")


@needs_nautilus
def test_roll_and_chain_end_agree() -> None:
    """A long held through a roll and across a data gap: both engines close the old contract at its last close and
    open the new one at its first open; the only gap is the closing fill Nautilus pays at each chain's end."""
    prep = rp.prepare(_rolled(gap_minutes=8 * 60), None, _config(), rule="long")
    assert int(prep.data.is_roll.sum()) == 1 and len(prep.data.chain_first) == 2
    summary = rp.replay(prep, "close")
    _check_agreement(summary)
    assert summary["rolls"] == 1
    # two chain ends, each a one-contract closing fill of ES: commission 1 + half a tick (12.5 / 2)
    assert summary["total"]["chain_end"] == pytest.approx(-2 * (1.0 + 0.5 * 12.5), abs=1e-9)
    assert summary["total"]["marketrl"] != 0.0


@needs_nautilus
def test_a_wrong_fee_or_fill_price_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: a commission off by 0.50 per contract, or fills a tick off the close, each opens a
    gap of exactly that size, and the breakdown names it."""
    prep = rp.prepare(_rolled(), None, _config(), rule="momentum", lookback=2)
    base = rp.replay(prep, "close")
    _check_agreement(base)
    real = rp.run_nautilus

    def dearer(*args: Any, fees: dict[Any, float], **kwargs: Any) -> Any:
        return real(*args, fees={key: fee + 0.5 for key, fee in fees.items()}, **kwargs)

    monkeypatch.setattr(rp, "run_nautilus", dearer)
    perturbed = rp.replay(prep, "close")
    # every fill paid (1 + 6.25) per contract: the decisions' commissions and the chain end's closing fill
    traded = (base["total"]["nautilus_commissions"] - base["total"]["chain_end"]) / (1.0 + 0.5 * 12.5)
    assert traded >= 4
    assert perturbed["total"]["gap"] - base["total"]["gap"] == pytest.approx(-0.5 * traded, abs=1e-6)
    named = {key: perturbed["total"][key] - base["total"][key] for key in ("fees", "chain_end", "residual")}
    assert named["fees"] + named["chain_end"] == pytest.approx(-0.5 * traded, abs=1e-6)
    assert named["fees"] < 0 and abs(named["residual"]) < 1e-6

    def shifted(contracts_: Any, events: list[Any], *args: Any, **kwargs: Any) -> Any:
        moved = [
            type(e)(e.instrument_id, e.ts_ns, e.open + 0.25, e.high + 0.25, e.low + 0.25, e.close + 0.25)
            for e in events
        ]
        return real(contracts_, moved, *args, **kwargs)

    monkeypatch.setattr(rp, "run_nautilus", shifted)
    moved = rp.replay(prep, "close")
    assert abs(moved["total"]["fill_price"]) > 0
    assert moved["total"]["gap"] - moved["total"]["chain_end"] == pytest.approx(
        moved["total"]["fill_price"], abs=1e-2
    )


@needs_nautilus
@needs_samples
@pytest.mark.parametrize("rule", ["momentum", "long"])
def test_real_ohlcv_sample_agrees(rule: str) -> None:
    """ESU4 + NQU4 ohlcv-1m (Databento, via NautilusTrader's test data) with their definition file's specs."""
    prep = _sample(OHLCV, rule)
    summary = rp.replay(prep, "close")
    _check_agreement(summary)
    assert {symbol_root(name.split("-")[0]) for name in summary["contracts"]} == {"ES", "NQ"}
    assert summary["contracts"]["ES-118"]["point_value"] == 50.0
    assert summary["total"]["nautilus_commissions"] > 0


@needs_nautilus
@needs_samples
def test_real_mbp1_sample_quotes() -> None:
    """ESU4 mbp-1: bar fills agree; quote fills buy at the ask and sell at the bid, and what differs is the fill
    price (spread and bounce) and the fees (commission only), nothing else."""
    prep = _sample(MBP_1, "momentum", lookback=1)
    assert prep.data.quoted
    _check_agreement(rp.replay(prep, "close"))
    schedule = rp.build_schedule(prep, "quotes")
    fees = {key: ref[1] for key, ref in schedule.reference.items()}
    result = rp.run_nautilus(schedule.contracts, schedule.events, schedule.targets, quotes=True, fees=fees)
    quotes = {(e.instrument_id, e.ts_ns): (e.bid, e.ask) for e in schedule.events}
    assert result.fills
    for fill in result.fills:
        bid, ask = quotes[(fill.instrument_id, fill.ts_ns)]
        assert fill.price == (ask if fill.quantity > 0 else bid)
        assert fill.commission == pytest.approx(abs(fill.quantity) * 1.0)
    summary = rp.replay(prep, "quotes")
    total = summary["total"]
    assert abs(total["residual"]) < 1e-2
    decided = [f for f in result.fills if schedule.reference[(f.instrument_id, f.ts_ns)][3] != "chain_end"]
    assert total["nautilus_commissions"] == pytest.approx(sum(abs(f.quantity) for f in decided))
    # the quote fills differ from marketrl's only by the fill price and the fees (plus the chain end's close)
    assert total["gap"] == pytest.approx(total["fill_price"] + total["fees"] + total["chain_end"], abs=1e-2)
    # marketrl charges the same quote's half-spread that Nautilus pays in the price: what is left is the bounce
    assert total["fees"] + total["fill_spread"] == pytest.approx(0.0, abs=1e-2)
    assert total["fill_bounce"] == pytest.approx(total["fill_price"] - total["fill_spread"])


@needs_nautilus
@needs_samples
def test_cli_writes_page_and_json(tmp_path: Path) -> None:
    out = tmp_path / "replay"
    code = rp.main(
        [
            "--rule", "long", "--prices", str(OHLCV), "--definitions", str(DEFINITIONS),
            "--config", str(REPO_ROOT / "config.yaml"), "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    summary = json.loads((out / "replay.json").read_text())
    page = (out / "replay.html").read_text()
    assert summary["nautilus_trader"] == NAUTILUS and summary["days"] and summary["explanation"]
    assert "chain ends" in page and summary["days"][0]["day"] in page
    assert sorted(p.name for p in out.iterdir()) == ["replay.html", "replay.json"]


def test_make_replay_reads_the_runs_positions_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Makefile's check of the positions file names paths.EVAL_BARS's file, and so does the CLI's --model."""
    from marketrl.settings import paths

    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    line = next(line for line in makefile.splitlines() if line.startswith("REPLAY_POSITIONS :="))
    pattern = line.split(":=", 1)[1].strip()
    expected = paths.EVAL_BARS.format(model="$(REPLAY_MODEL)", fold="$(REPLAY_FOLD)", seed="$(REPLAY_SEED)")
    assert pattern == expected
    code = rp.main(
        ["--model", "dqn", "--results", str(tmp_path), "--prices", "x", "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert str(tmp_path / paths.EVAL_BARS.format(model="dqn", fold=0, seed=0)) in err and "make run" in err
