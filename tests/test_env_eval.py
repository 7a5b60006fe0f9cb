"""Evaluation: per-bar output by hand, agreement with TradingEnv rewards, segments, rule baselines."""

from __future__ import annotations

from datetime import date

import numpy as np
import polars as pl
import pytest
import torch

from marketrl.env import (
    EnvConfig,
    EnvConfigError,
    EnvDataError,
    MarketData,
    TradingEnv,
    evaluate,
    evaluate_positions,
    matched_random_positions,
    position_change_rate,
    position_results,
    rule_positions,
)
from tests.test_env import BPS10, CLOSE, OPEN, frame_from_bars, market_data, random_frame


def always(action: int):
    return lambda obs: torch.full((obs.shape[0],), action, dtype=torch.long)


def feature_and_position_policy(obs: torch.Tensor) -> torch.Tensor:
    """Long when the first feature is positive; otherwise short if flat or long, flat if short."""
    return torch.where(obs[:, 0] > 0, 2, torch.where(obs[:, -1] < 0, 1, 0))


def test_evaluate_by_hand_on_a_tiny_series() -> None:
    df = frame_from_bars(CLOSE, OPEN)
    result = evaluate(always(2), market_data(df), EnvConfig(contracts=2))
    assert result.columns[:3] == ["ts_event", "trading_day", "symbol"]
    assert {"position", "gross_return", "cost", "net_return", "decision_ts_event"} <= set(result.columns)
    assert result.schema["ts_event"] == pl.Datetime("ns", "UTC") and result.schema["trading_day"] == pl.Date
    assert result.schema["position"] == pl.Int32 and result.schema["net_return"] == pl.Float64
    assert result["ts_event"].to_list() == df["ts_event"][1:].to_list()  # labelled by the bar that earns
    assert result["decision_ts_event"].to_list() == df["ts_event"][:-1].to_list()
    assert result["position"].to_list() == [2, 2, 2, 2]
    gross = 2 * np.array([101 / 100 - 1, 99 / 101 - 1, 99 / 99 - 1, 102 / 99 - 1])
    np.testing.assert_allclose(result["gross_return"].to_numpy(), gross, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(result["cost"].to_numpy(), [2 * 0.001, 0, 0, 0], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(
        result["net_return"].to_numpy(), gross - [0.002, 0, 0, 0], rtol=1e-6, atol=1e-9
    )


@pytest.mark.parametrize("fill", ["close", "next_open"])
def test_evaluate_equals_the_env_rewards_of_a_full_episode(fill: str) -> None:
    data = market_data(random_frame(n_instruments=1, days=1, drop=0.0))
    assert data.segment_first.tolist() == [0]
    decisions = data.n_rows - 1
    config = EnvConfig(window=2, episode_length=decisions, n_envs=1, fill=fill)
    env = TradingEnv(data, config, seed=0)
    obs = env.reset([0])
    rewards, positions = [], []
    for _ in range(decisions):
        obs, reward, _, _ = env.step(feature_and_position_policy(obs))
        rewards.append(reward)
        positions.append(env.final_obs[:, -1])
    result = evaluate(feature_and_position_policy, data, config)
    assert result.height == decisions
    np.testing.assert_array_equal(result["position"].to_numpy(), torch.cat(positions).numpy())
    np.testing.assert_allclose(
        result["net_return"].to_numpy(), torch.cat(rewards).numpy(), rtol=1e-6, atol=1e-9
    )
    assert result["net_return"].sum() == pytest.approx(float(torch.cat(rewards).double().sum()), abs=1e-7)
    assert len(set(result["position"].to_list())) > 1  # the policy really trades


def test_every_segment_is_evaluated_in_parallel_and_starts_flat() -> None:
    data = market_data(random_frame(n_instruments=2, days=4, skip_days=(date(2024, 1, 3),)))
    assert len(data.segment_first) == 4
    result = evaluate(always(2), data)
    assert result.height == int(data.is_decision.sum())
    assert result.sort("instrument_id", "decision_ts_event").equals(result)
    pinned = evaluate_positions(data, rule_positions(data, "long"))
    assert result.equals(pinned)
    first_decision_of_segment = (result["segment"] != result["segment"].shift(1)).fill_null(True)
    np.testing.assert_array_equal((result["cost"] > 0).to_numpy(), first_decision_of_segment.to_numpy())

    # A policy that flips on its own position: long, short, long, ... restarting flat in every segment.
    flipping = evaluate(lambda obs: torch.where(obs[:, -1] > 0, 0, 2), data)
    index_in_segment = flipping.select(pl.int_range(pl.len()).over("segment")).to_series().to_numpy()
    np.testing.assert_array_equal(flipping["position"].to_numpy(), np.where(index_in_segment % 2 == 0, 1, -1))


def test_cost_sensitivity_scales_the_cost_column() -> None:
    df = random_frame(n_instruments=1, days=2)
    base = evaluate_positions(market_data(df), rule_positions(market_data(df), "random", seed=1))
    doubled_data = market_data(df, costs=BPS10.scaled(2.0))
    doubled = evaluate_positions(doubled_data, rule_positions(doubled_data, "random", seed=1))
    np.testing.assert_allclose(doubled["cost"].to_numpy(), 2 * base["cost"].to_numpy(), rtol=1e-6)
    np.testing.assert_array_equal(doubled["gross_return"].to_numpy(), base["gross_return"].to_numpy())


def test_rule_positions_by_hand() -> None:
    df = pl.concat(
        [
            frame_from_bars(CLOSE, instrument_id=1, symbol="A"),
            frame_from_bars(CLOSE[::-1], instrument_id=2, symbol="B"),
        ]
    )
    data = market_data(df)
    momentum = rule_positions(data, "momentum", lookback=2).tolist()
    # A: 99/100 < 1, 99/101 < 1, 102/99 > 1; B (102, 99, 99, 101, 100): 99/102, 101/99, 100/99
    assert momentum == [0, 0, -1, -1, 1, 0, 0, -1, 1, 1]
    assert rule_positions(data, "long").tolist() == [1.0] * 10
    assert rule_positions(data, "flat").tolist() == [0.0] * 10
    random = rule_positions(data, "random", seed=4)
    assert torch.equal(random, rule_positions(data, "random", seed=4))
    assert set(random.tolist()) <= {-1.0, 0.0, 1.0}
    assert not torch.equal(random, rule_positions(data, "random", seed=5))
    with pytest.raises(EnvConfigError, match="baseline rule"):
        rule_positions(data, "mean_reversion")


def test_evaluate_positions_rejects_bad_positions() -> None:
    data = market_data(frame_from_bars(CLOSE, OPEN))
    with pytest.raises(EnvDataError, match="5 values"):
        evaluate_positions(data, np.zeros(4))
    with pytest.raises(EnvDataError, match=r"\{-1, 0, 1\}"):
        evaluate_positions(data, np.full(5, 0.5))


def bar_arrays(df: pl.DataFrame) -> dict[str, np.ndarray]:
    """The per-bar host arrays MarketData.from_arrays takes besides the features."""
    return {
        "opens": df["open"].to_numpy(),
        "closes": df["close"].to_numpy(),
        "instrument_id": df["instrument_id"].to_numpy(),
        "ts_event_ns": df["ts_event"].dt.epoch("ns").to_numpy(),
    }


def test_arrays_without_row_labels_give_tensors_not_frames() -> None:
    df = frame_from_bars(CLOSE, OPEN)
    framed = market_data(df)
    features = framed.features.numpy()
    data = MarketData.from_arrays(features, **bar_arrays(df), cost_model=BPS10)
    positions = rule_positions(data, "long")
    results = position_results(data, positions)
    expected = evaluate_positions(framed, positions)
    for column in (
        "gross_return",
        "cost",
    ):  # the same float32 terms (net is differenced in float64 in the frame)
        np.testing.assert_array_equal(
            getattr(results, column)[data.is_decision].numpy(), expected[column].to_numpy()
        )
    with pytest.raises(EnvDataError, match="without row labels"):
        evaluate_positions(data, positions)
    with pytest.raises(EnvDataError, match="sorted"):
        MarketData.from_arrays(features, **bar_arrays(df.reverse()), cost_model=BPS10)
    with pytest.raises(EnvDataError, match="symbol of every row"):
        MarketData.from_arrays(features, **bar_arrays(df), cost_model={"ES": BPS10})
    with_nan = features.copy()
    with_nan[2, 1] = np.nan
    with pytest.raises(EnvDataError, match="column 'f1' holds NaN"):
        MarketData.from_arrays(with_nan, **bar_arrays(df), cost_model=BPS10)


def test_position_change_rate_by_hand() -> None:
    df = pl.concat(
        [
            frame_from_bars(CLOSE, instrument_id=1, symbol="A"),
            frame_from_bars(CLOSE[::-1], instrument_id=2, symbol="B"),
        ]
    )
    data = market_data(df)
    # A: decisions at rows 0-3 from flat: 1 (change), 1, -1 (change), -1; B restarts flat: 0, 0, 1 (change), 1
    positions = torch.tensor([1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    assert position_change_rate(data, positions) == 3 / 8


def test_matched_random_trader_trades_as_often_in_a_random_direction() -> None:
    data = market_data(random_frame(days=40, bars_per_day=36, seed=3))
    decisions = data.is_decision
    rng = np.random.default_rng(0)
    # an "agent" that trades about every 8th decision and is long after every change but one in ten
    changes = rng.random(data.n_rows) < 0.125
    agent = torch.as_tensor(np.where(np.cumsum(changes) % 10 == 0, -1.0, 1.0), dtype=torch.float32)
    agent = torch.where(decisions, agent, torch.zeros_like(agent))
    rate = position_change_rate(data, agent)
    n = int(decisions.sum())
    matched = [matched_random_positions(data, rate, seed=s) for s in range(20)]
    rates = np.array([position_change_rate(data, m) for m in matched])
    # the mean over 20 traders of a binomial share: within 4 standard errors of the agent's rate
    assert abs(rates.mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / (20 * n))
    # direction: the agent is long 90% of the time, the matched traders about a third of it each way
    long_share = np.mean([float((m[decisions] > 0).float().mean()) for m in matched])
    assert 0.25 < long_share < 0.42
    # it sees only the rate: the agent reversed (same trading times, opposite direction) gives the same trader
    assert torch.equal(matched_random_positions(data, position_change_rate(data, -agent), seed=0), matched[0])
    assert not torch.equal(matched[0], matched[1])
    for m in matched[:3]:
        assert set(m.tolist()) <= {-1.0, 0.0, 1.0}
        assert bool((m[~decisions] == 0).all())
    assert float((matched_random_positions(data, 0.0, seed=1) != 0).sum()) == 0
    with pytest.raises(EnvConfigError, match="change rate"):
        matched_random_positions(data, 1.5, seed=0)


def test_policies_stepped_together_choose_what_each_chooses_alone() -> None:
    # S greedy policies as one stacked act function (the seeds of a batch): the same positions as S lockstep
    # passes one policy at a time, each policy reading only its own held positions.
    from gpu_utils import resolve_precision
    from marketrl.agents.common import GreedyPolicies, GreedyPolicy
    from marketrl.agents.networks import mlp
    from marketrl.env import policies_positions, policy_positions
    from marketrl.loop.schedule import seeded

    data = market_data(random_frame(n_instruments=2, days=4, skip_days=(date(2024, 1, 3),)))
    plan = resolve_precision("fp32", "cpu")
    policies = []
    for seed in range(3):
        with seeded(seed):
            # the position input gets a large weight so each policy's own holdings steer its next action
            net = mlp(data.n_features + 1, [8], 3, "tanh")
            net[0].weight.data[:, -1] *= 20.0
        policies.append(GreedyPolicy(net, plan))
    together = policies_positions(GreedyPolicies(policies), len(policies), data)
    alone = torch.stack([policy_positions(policy, data) for policy in policies])
    assert together.shape == (3, data.n_rows)
    torch.testing.assert_close(together, alone, rtol=0, atol=0)
    assert not torch.equal(alone[0], alone[1]) or not torch.equal(alone[1], alone[2])  # the policies differ
