"""Continuous contracts: at a roll (instrument_id changes under one continuous symbol) no return spans the two
contracts, whatever the price gap between them, each contract is priced with its own spec, and a position held
into the roll is closed on the old contract and reopened on the new one (two one-side costs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from marketrl.env import (
    EnvConfig,
    EnvDataError,
    MarketData,
    TradingEnv,
    evaluate_positions,
    policy_positions,
    position_change_rate,
    position_results,
)
from marketrl.instruments.costs import costs_from_config
from marketrl.models.trading_rule import TradingRule
from marketrl.splits.datasets import write_feature_manifest
from marketrl.splits.normalize import FeatureNormalizer

MINUTE_NS = 60_000_000_000


def _roll_data() -> MarketData:
    # ES.c.0 across a roll: ESH4 (id 11) trades at ~5000, ESM4 (id 12) at ~5060, one minute after ESH4's last bar.
    old = np.array([5000.0, 5001.0, 5002.0, 5003.0])
    new = np.array([5060.0, 5061.0, 5059.0])
    closes = np.concatenate([old, new])
    ts = np.concatenate([np.arange(4), np.arange(4, 7)]) * MINUTE_NS
    costs = costs_from_config(
        {
            "model": "futures",
            "commission_per_contract": 1.0,
            "half_spread_ticks": 0.5,
            "instruments": {"ES": {"tick_size": 0.25, "tick_value": 12.5}},
        }
    )
    return MarketData.from_arrays(
        np.zeros((7, 2), dtype=np.float32),
        opens=closes,
        closes=closes,
        instrument_id=np.array([11] * 4 + [12] * 3),
        ts_event_ns=ts,
        symbols=np.array(["ESH4"] * 4 + ["ESM4"] * 3),
        cost_model=costs,
    )


def test_no_return_spans_a_roll() -> None:
    data = _roll_data()
    assert data.segment_id.tolist() == [0, 0, 0, 0, 1, 1, 1]
    last_old = 3
    assert not bool(data.is_decision[last_old])  # the old contract's last bar is never a decision bar
    for name in ("ret_close_close", "ret_close_open", "ret_open_close", "cost_next_open"):
        assert getattr(data, name)[last_old].item() == 0.0, name
    jumps = data.ret_close_close.numpy()
    assert np.abs(jumps).max() < 0.001  # the 60-point gap between the contracts (1.2 %) is nowhere
    assert data.ret_close_close[4].item() == pytest.approx(5061 / 5060 - 1, rel=1e-6)
    # Both contracts of the root use the ES spec.
    np.testing.assert_allclose(
        data.cost_close.numpy()[[3, 4]], 7.25 / (np.array([5003.0, 5060.0]) * 50), rtol=1e-6
    )


def test_no_episode_crosses_a_roll() -> None:
    data = _roll_data()
    starts = data.episode_starts(2)
    assert starts.tolist() == [0, 1, 4]  # episodes of 2 decisions fit inside one contract only


# --- Positions carried through a roll of a continuous symbol -------------------------------------------------
# ES.c.0 rolls from ESH4 (id 11, rows at minutes 0-3) to ESM4 (id 5, minutes 4-6). The new contract's id is the
# smaller one, so in the (instrument_id, ts_event) order a feature table has it comes first: MarketData puts the
# series in time order. The new contract trades 55 points (1.1 %) above the old one.
ES_SPEC = {"ES": {"tick_size": 0.25, "tick_value": 12.5}}
ES_COSTS = costs_from_config(
    {"model": "futures", "commission_per_contract": 1.0, "half_spread_ticks": 0.5, "instruments": ES_SPEC}
)
OLD_CLOSE = [5000.0, 5001.0, 5002.0, 5003.0]
NEW_OPEN, NEW_CLOSE = [5058.0, 5061.0, 5060.0], [5060.0, 5059.0, 5062.0]


def _side(price: float) -> float:
    """One side of one ES contract as a fraction of its notional: (1 + 0.5 x 12.5) / (price x 50)."""
    return 7.25 / (price * 50.0)


def _continuous(minutes_new: list[int] | None = None, **kwargs: object) -> MarketData:
    minutes_new = minutes_new or [4, 5, 6]
    ts = np.array([*minutes_new, 0, 1, 2, 3]) * MINUTE_NS
    return MarketData.from_arrays(
        np.arange(14, dtype=np.float32).reshape(7, 2),
        opens=np.array(NEW_OPEN + OLD_CLOSE),
        closes=np.array(NEW_CLOSE + OLD_CLOSE),
        instrument_id=np.array([5] * 3 + [11] * 4),
        ts_event_ns=ts,
        symbols=np.array(["ES.c.0"] * 7),
        cost_model=ES_COSTS,
        **kwargs,
    )


def test_series_order_and_chain_through_the_roll() -> None:
    data = _continuous()
    np.testing.assert_array_equal(data.close.numpy(), OLD_CLOSE + NEW_CLOSE)  # time order across contracts
    np.testing.assert_array_equal(data.features[:, 0].numpy(), [6, 8, 10, 12, 0, 2, 4])  # rows moved together
    assert data.segment_id.tolist() == [0, 0, 0, 0, 1, 1, 1]  # windows and forecasts stay in one contract
    assert data.chain_first.tolist() == [0] and data.chain_last.tolist() == [6]
    assert data.is_roll.tolist() == [False, False, False, True, False, False, False]
    assert data.is_decision.tolist() == [True] * 6 + [False]
    assert data.episode_starts(5).tolist() == [0, 1]  # an episode may run through the roll


def test_roll_costs_close_old_and_open_new_and_earn_no_gap() -> None:
    data = _continuous()
    long = position_results(data, np.ones(7))
    roll = 3
    # Held long into the roll and after it: close one ESH4 at 5003 and open one ESM4 at its first open.
    assert long.cost[roll].item() == pytest.approx(_side(5003.0) + _side(5058.0), rel=1e-6)
    # The new position earns the new contract's first bar from its open; the 55-point gap is earned nowhere.
    assert long.gross_return[roll].item() == pytest.approx(5060.0 / 5058.0 - 1, rel=1e-5)
    gross = long.gross_return.numpy()[:6]
    expected = [
        5001 / 5000 - 1,
        5002 / 5001 - 1,
        5003 / 5002 - 1,
        5060 / 5058 - 1,
        5059 / 5060 - 1,
        5062 / 5059 - 1,
    ]
    np.testing.assert_allclose(gross, expected, rtol=1e-5)
    # Holding on either side of the roll trades nothing; the first entry pays one side at close_0.
    np.testing.assert_allclose(long.cost.numpy()[[0, 1, 2, 4, 5]], [_side(5000.0), 0, 0, 0, 0], rtol=1e-6)
    # A reversal through the roll closes one old contract and opens one new one: still two sides, not four.
    reverse = position_results(data, np.array([1, 1, 1, -1, -1, -1, 0.0]))
    assert reverse.cost[roll].item() == pytest.approx(_side(5003.0) + _side(5058.0), rel=1e-6)


@pytest.mark.parametrize(
    ("before", "at_roll", "sides"),
    [(0.0, 0.0, []), (1.0, 0.0, [5003.0]), (0.0, -1.0, [5058.0]), (-1.0, -1.0, [5003.0, 5058.0])],
)
def test_roll_charges_only_the_sides_that_trade(before: float, at_roll: float, sides: list[float]) -> None:
    data = _continuous()
    positions = np.array([0.0, 0.0, before, at_roll, at_roll, at_roll, 0.0])
    results = position_results(data, positions)
    assert results.cost[3].item() == pytest.approx(sum(_side(p) for p in sides), abs=1e-12)
    if not sides:
        assert results.gross_return[3].item() == 0.0 and results.net_return[3].item() == 0.0


def test_next_open_fill_rolls_the_same_way() -> None:
    data = _continuous()
    results = position_results(data, np.ones(7), EnvConfig(fill="next_open"))
    assert results.cost[3].item() == pytest.approx(_side(5003.0) + _side(5058.0), rel=1e-6)
    assert results.gross_return[3].item() == pytest.approx(5060.0 / 5058.0 - 1, rel=1e-5)  # no close→open gap
    # The bar after the roll: the carried position bears the new contract's close→open gap, as any bar.
    assert results.gross_return[4].item() == pytest.approx(
        5061.0 / 5060.0 - 1 + 5059.0 / 5061.0 - 1, rel=1e-5
    )


def test_training_env_carries_the_position_and_matches_evaluation() -> None:
    data = _continuous()
    config = EnvConfig(episode_length=6, n_envs=1)
    env = TradingEnv(data, config, seed=0)
    obs = env.reset(torch.tensor([0]))
    long = torch.tensor([2])
    rewards, positions_seen = [], [obs[0, -1].item()]
    for _ in range(6):
        obs, reward, _, truncated = env.step(long)
        rewards.append(reward.item())
        positions_seen.append(env.final_obs[0, -1].item())
    assert bool(truncated)
    assert positions_seen == [0.0] + [1.0] * 6  # the row after the roll sees the position carried into it
    expected = position_results(data, np.ones(7), config).net_return.numpy()[:6]
    np.testing.assert_allclose(rewards, expected, rtol=1e-6)
    # Greedy evaluation steps the chain through the roll with the same held position in the observation.
    seen: list[float] = []

    def policy(batch: torch.Tensor) -> torch.Tensor:
        seen.append(batch[0, -1].item())
        return torch.full((batch.shape[0],), 2)

    assert policy_positions(policy, data, config).tolist() == [1.0] * 6 + [0.0]
    assert seen == [0.0] + [1.0] * 5


def test_a_missing_day_is_not_a_roll_and_still_starts_flat() -> None:
    # Same instrument, a weekday without data between two bars: two chains, each starting flat, as before.
    day = 24 * 60
    data = MarketData.from_arrays(
        np.zeros((5, 1), dtype=np.float32),
        opens=np.array([*OLD_CLOSE, 5010.0]),
        closes=np.array([*OLD_CLOSE, 5010.0]),
        instrument_id=np.array([11] * 5),
        ts_event_ns=np.array([0, 1, 2, 3, 2 * day])
        * MINUTE_NS,  # 1970-01-01 is a Thursday: Saturday, skipped
        symbols=np.array(["ES.c.0"] * 5),
        cost_model=ES_COSTS,
    )
    assert not data.is_roll.any() and data.chain_first.tolist() == [0, 4]
    assert not bool(data.is_decision[3])
    # A roll across a gap longer than max_gap is no carried roll either: the new contract starts flat.
    gapped = _continuous(minutes_new=[4 + 2 * day, 5 + 2 * day, 6 + 2 * day])
    assert not gapped.is_roll.any() and gapped.chain_first.tolist() == [0, 4]
    results = position_results(gapped, np.ones(7))
    assert results.cost[3].item() == 0.0 and results.gross_return[3].item() == 0.0
    assert results.cost[4].item() == pytest.approx(_side(5060.0), rel=1e-6)  # a fresh entry at close
    # Without a continuous symbol (outright ESH4 / ESM4 rows) nothing is carried: the old behaviour.
    assert not _roll_data().is_roll.any()


def test_holding_through_a_roll_is_no_position_change() -> None:
    data = _continuous()
    assert position_change_rate(data, torch.ones(7)) == pytest.approx(1 / 6)


def test_one_continuous_symbol_with_two_contracts_at_once_is_an_error() -> None:
    with pytest.raises(
        EnvDataError,
        match=r"continuous symbol 'ES.c.0' has bars of two instruments \(5, 11\) at 1970-01-01T00:03:00Z",
    ):
        _continuous(minutes_new=[3, 4, 5])


def test_per_bar_frame_labels_the_roll_decision_by_the_new_contracts_bar() -> None:
    ts = (np.array([4, 5, 6, 0, 1, 2, 3]) * MINUTE_NS).astype("datetime64[ns]")
    frame = pl.DataFrame(
        {
            "ts_event": ts,
            "trading_day": ts.astype("datetime64[D]"),
            "instrument_id": [5] * 3 + [11] * 4,
            "symbol": ["ES.c.0"] * 7,
            "open": NEW_OPEN + OLD_CLOSE,
            "close": NEW_CLOSE + OLD_CLOSE,
            "f0": np.arange(7, dtype=np.float32),
        }
    ).with_columns(pl.col("ts_event").dt.replace_time_zone("UTC"))
    data = MarketData.from_frame(frame, ["f0"], FeatureNormalizer().fit(frame, ["f0"]), ES_COSTS)
    bars = evaluate_positions(data, np.ones(7))
    assert bars["instrument_id"].to_list() == [
        11,
        11,
        11,
        11,
        5,
        5,
    ]  # decided on: the roll row is the old one
    minutes = (bars["ts_event"].dt.epoch("ns") // MINUTE_NS).to_list()
    assert minutes == [1, 2, 3, 4, 5, 6]  # earned over: the roll decision earns the new contract's first bar
    assert bars["cost"][3] == pytest.approx(_side(5003.0) + _side(5058.0), rel=1e-6)


def test_numpy_reference_env_rolls_the_same_way() -> None:
    adapters = pytest.importorskip("tests.support.adapters")
    data = _continuous()
    config = EnvConfig(episode_length=6, n_envs=1)
    plain = adapters.PlainGymEnv(data, config, seed=0)
    plain.reset(options={"start_row": 0})
    rewards = [plain.step(action)[1] for action in (2, 2, 2, 0, 0, 1)]
    expected = position_results(data, np.array([1, 1, 1, -1, -1, 0, 0.0]), config).net_return.numpy()[:6]
    np.testing.assert_allclose(rewards, expected, rtol=1e-6)


def _day_table(path: Path, day: int, contracts: dict[str, int]) -> Path:
    """A feature table's label columns: one bar an hour on UTC day `day`, one contract per continuous symbol."""
    start = np.datetime64("2024-03-14", "ns") + np.timedelta64(day, "D")
    ts = start + np.arange(0, 24, dtype="timedelta64[h]")
    frame = pl.concat(
        pl.DataFrame({"ts_event": ts, "instrument_id": [iid] * 24, "symbol": [symbol] * 24})
        for symbol, iid in contracts.items()
    ).with_columns(
        pl.col("ts_event").dt.replace_time_zone("UTC"),
        pl.col("instrument_id").cast(pl.UInt32),
        trading_day=pl.col("ts_event").dt.date(),
    )
    frame.write_parquet(path)
    return path


def test_feature_manifest_lists_the_rolls_of_each_continuous_symbol(tmp_path: Path) -> None:
    # ES.c.0 rolls from id 11 to id 5 between the two files; NQ.c.0 keeps its contract; outright ESH4 never rolls.
    files = [
        _day_table(tmp_path / "d0.parquet", 0, {"ES.c.0": 11, "NQ.c.0": 20, "ESH4": 11}),
        _day_table(tmp_path / "d1.parquet", 1, {"ES.c.0": 5, "NQ.c.0": 20, "ESH4": 11}),
    ]
    manifest = write_feature_manifest(files, tmp_path / "manifest.json")
    assert manifest["rolls"] == [
        {
            "symbol": "ES.c.0",
            "trading_day": "2024-03-15",
            "old_instrument_id": 11,
            "new_instrument_id": 5,
            "old_last_bar": "2024-03-14T23:00:00+00:00",
            "new_first_bar": "2024-03-15T00:00:00+00:00",
        }
    ]
    # Tables written without marketrl metadata have no source file or drop counts to report.
    assert manifest["files"][0]["source_file"] is None and manifest["files"][0]["dropped_in_halt"] is None


def test_forecasters_trading_rule_holds_its_band_through_a_roll() -> None:
    # Entry-strength predictions on the old contract, then band-strength ones across the roll: the position the
    # rule holds into the roll carries on, as position_results scores it (the band restarts only at a chain start).
    data = _continuous()
    threshold = 2.0 * data.cost_close.numpy()  # round trip at each close
    predictions = torch.tensor(np.r_[threshold[:3] * 2.0, threshold[3:6] * 0.75, 0.0], dtype=torch.float32)
    positions = TradingRule(threshold_multiplier=1.0, hold_band=0.5).positions(predictions, data)
    assert positions.tolist() == [1.0] * 6 + [0.0]
