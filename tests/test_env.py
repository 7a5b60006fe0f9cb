"""TradingEnv: hand-checked rewards and costs, no look-ahead, segments, episodes, resets, determinism, host syncs.

Also holds the synthetic feature-table builders the other env tests import.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import numpy as np
import polars as pl
import pytest
import torch

from gpu_utils.sync import SyncCounter
from marketrl.env import (
    EnvConfig,
    EnvConfigError,
    EnvDataError,
    MarketData,
    TradingEnv,
    parse_duration,
)
from marketrl.instruments.costs import CostModel
from marketrl.splits.normalize import FeatureNormalizer

BPS10 = CostModel(kind="bps", bps=10.0)  # 0.001 of notional per unit of |Δposition|
ES_COSTS = CostModel(
    kind="futures", commission_per_contract=2.0, half_spread_ticks=0.5, tick_size=0.25, tick_value=12.5
)


# ------------------------------------------------------------------------------------------------------- builders


def frame_from_bars(
    close: list[float],
    open_: list[float] | None = None,
    *,
    timestamps: list[datetime] | None = None,
    instrument_id: int = 1,
    symbol: str = "ES",
    features: np.ndarray | None = None,
) -> pl.DataFrame:
    """One instrument's bars (one minute apart unless `timestamps`), with 2 feature columns f0, f1."""
    n = len(close)
    timestamps = timestamps or [
        datetime(2024, 1, 2, 14, 0, tzinfo=UTC) + timedelta(minutes=i) for i in range(n)
    ]
    if features is None:
        features = np.stack([np.arange(n, dtype=np.float32), np.arange(n, dtype=np.float32) ** 2], axis=1)
    close_array = np.asarray(close, dtype=np.float64)
    return pl.DataFrame(
        {
            "ts_event": pl.Series(timestamps, dtype=pl.Datetime("ns", "UTC")),
            "trading_day": pl.Series([t.date() for t in timestamps], dtype=pl.Date),
            "instrument_id": pl.Series([instrument_id] * n, dtype=pl.UInt32),
            "symbol": [symbol] * n,
            "open": np.asarray(open_ if open_ is not None else close, dtype=np.float64),
            "high": close_array * 1.01,
            "low": close_array * 0.99,
            "close": close_array,
            "volume": np.ones(n),
            "bar_return": pl.Series(
                np.append(np.nan, close_array[1:] / close_array[:-1] - 1), dtype=pl.Float32
            ),
            **{f"f{j}": features[:, j].astype(np.float32) for j in range(features.shape[1])},
        }
    )


def random_frame(
    *,
    n_instruments: int = 2,
    days: int = 6,
    bars_per_day: int = 30,
    n_features: int = 3,
    seed: int = 0,
    drop: float = 0.05,
    skip_days: tuple[date, ...] = (),
) -> pl.DataFrame:
    """Bars every 40 minutes from 00:00 UTC on weekdays (a daily break before midnight), some bars missing."""
    rng = np.random.default_rng(seed)
    parts = []
    for instrument in range(n_instruments):
        timestamps: list[datetime] = []
        day, made = date(2024, 1, 1), 0
        while made < days:
            if day.weekday() < 5:
                made += 1
                if day not in skip_days:
                    midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
                    timestamps += [midnight + timedelta(minutes=40 * b) for b in range(bars_per_day)]
            day += timedelta(days=1)
        keep = rng.random(len(timestamps)) >= drop
        keep[0] = True
        timestamps = [t for t, k in zip(timestamps, keep, strict=True) if k]
        n = len(timestamps)
        close = 100.0 * (1 + instrument) * np.exp(np.cumsum(rng.normal(0.0, 0.002, n)))
        opens = np.append(close[0], close[:-1]) * (1 + rng.normal(0.0, 5e-4, n))
        features = rng.normal(0.0, 1.0, (n, n_features)).astype(np.float32)
        parts.append(
            frame_from_bars(
                list(close),
                list(opens),
                timestamps=timestamps,
                instrument_id=instrument + 1,
                symbol=f"S{instrument}",
                features=features,
            )
        )
    return pl.concat(parts)


def feature_names(df: pl.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith("f") and c[1:].isdigit()]


def market_data(df: pl.DataFrame, costs: CostModel = BPS10, **kwargs: object) -> MarketData:
    names = feature_names(df)
    return MarketData.from_frame(df, names, FeatureNormalizer().fit(df, names), costs, **kwargs)


# The hand-checked series: closes and opens of five one-minute bars.
CLOSE = [100.0, 101.0, 99.0, 99.0, 102.0]
OPEN = [100.0, 100.5, 100.0, 98.0, 100.0]
LONG_LONG_SHORT_FLAT = [2, 2, 0, 1]


def run_episode(
    data: MarketData, config: EnvConfig, actions: list[int], start: int = 0
) -> list[torch.Tensor]:
    env = TradingEnv(data, config, seed=0)
    env.reset([start] * config.n_envs)
    out = []
    for action in actions:
        _, reward, _, _ = env.step(torch.full((config.n_envs,), action, dtype=torch.long))
        out.append(reward)
    return out


# -------------------------------------------------------------------------------------------- rewards by hand


def test_close_fill_rewards_and_costs_by_hand() -> None:
    data = market_data(frame_from_bars(CLOSE, OPEN))
    rewards = run_episode(data, EnvConfig(episode_length=4, n_envs=1), LONG_LONG_SHORT_FLAT)
    expected = [
        1 * (101 / 100 - 1) - 1 * 0.001,  # flat → long at close 100, hold bar 1
        1 * (99 / 101 - 1),  # stay long
        -1 * (99 / 99 - 1) - 2 * 0.001,  # long → short: |Δp| = 2
        0.0 - 1 * 0.001,  # short → flat: no exposure over bar 4
    ]
    np.testing.assert_allclose(torch.cat(rewards).numpy(), expected, rtol=1e-6, atol=1e-9)


def test_next_open_fill_rewards_and_costs_by_hand() -> None:
    data = market_data(frame_from_bars(CLOSE, OPEN))
    rewards = run_episode(data, EnvConfig(episode_length=4, n_envs=1, fill="next_open"), LONG_LONG_SHORT_FLAT)
    expected = [
        0 * (100.5 / 100 - 1)
        + 1 * (101 / 100.5 - 1)
        - 0.001,  # old position bears close→open, new open→close
        1 * (100 / 101 - 1) + 1 * (99 / 100 - 1),
        1 * (98 / 99 - 1) - 1 * (99 / 98 - 1) - 2 * 0.001,
        -1 * (100 / 99 - 1) + 0 * (102 / 100 - 1) - 0.001,
    ]
    np.testing.assert_allclose(torch.cat(rewards).numpy(), expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("fill", ["close", "next_open"])
def test_futures_costs_at_the_fill_price_and_contracts_scale(fill: str) -> None:
    close = [4000.0, 4010.0, 3990.0]
    opens = [4000.0, 4004.0, 3996.0]
    data = market_data(frame_from_bars(close, opens), costs=ES_COSTS)
    one = torch.cat(run_episode(data, EnvConfig(episode_length=2, n_envs=1, fill=fill), [2, 0]))
    three = torch.cat(
        run_episode(data, EnvConfig(episode_length=2, n_envs=1, fill=fill, contracts=3), [2, 0])
    )
    per_side = 2.0 + 0.5 * 12.5  # currency per contract
    point_value = 12.5 / 0.25
    if fill == "close":
        expected = [
            (4010 / 4000 - 1) - per_side / (4000 * point_value),
            -(3990 / 4010 - 1) - 2 * per_side / (4010 * point_value),
        ]
    else:
        expected = [
            (4010 / 4004 - 1) - per_side / (4004 * point_value),
            (3996 / 4010 - 1) - (3990 / 3996 - 1) - 2 * per_side / (3996 * point_value),
        ]
    np.testing.assert_allclose(one.numpy(), expected, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(three.numpy(), 3 * np.array(expected), rtol=1e-5, atol=1e-9)


def test_all_envs_in_a_batch_match_their_single_env_runs() -> None:
    data = market_data(random_frame())
    config = EnvConfig(episode_length=10, n_envs=3)
    env = TradingEnv(data, config, seed=0)
    starts = data.episode_starts(10)[[0, 50, 120]]
    env.reset(starts)
    actions = torch.tensor([[0, 1, 2], [2, 2, 0], [1, 0, 0]])
    batched = torch.stack([env.step(a)[1] for a in actions])
    single_config = EnvConfig(episode_length=10, n_envs=1)
    for i, start in enumerate(starts):
        single = run_episode(data, single_config, actions[:, i].tolist(), start=int(start))
        torch.testing.assert_close(batched[:, i], torch.cat(single))


# ----------------------------------------------------------------------------------------------- no look-ahead


@pytest.mark.parametrize("fill", ["close", "next_open"])
def test_perturbing_bars_after_t_changes_nothing_seen_or_earned_up_to_t(fill: str) -> None:
    df = random_frame(n_instruments=1, days=3, drop=0.0)
    names = feature_names(df)
    normalizer = FeatureNormalizer().fit(df, names)  # fitted once, as on a training split
    start, steps, cut = 5, 12, 5 + 8  # rows after `cut` are perturbed
    later = pl.int_range(pl.len()) > cut
    perturbed = df.with_columns(
        *[pl.when(later).then(pl.col(c) * 3.0 + 1.0).otherwise(pl.col(c)) for c in (*names, "open", "close")]
    )
    config = EnvConfig(episode_length=steps, n_envs=1, fill=fill, window=3)
    actions = [2, 0, 1, 2, 2, 0, 0, 1, 2, 0, 2, 1]

    def trace(frame: pl.DataFrame) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        env = TradingEnv(MarketData.from_frame(frame, names, normalizer, BPS10), config, seed=0)
        observations, rewards = [env.reset([start])], []
        for action in actions:
            obs, reward, _, _ = env.step(torch.tensor([action]))
            observations.append(obs)
            rewards.append(reward)
        return observations, rewards

    obs_a, rewards_a = trace(df)
    obs_b, rewards_b = trace(perturbed)
    decided = cut - start  # the observation at row `cut` is the last one built only from unperturbed rows
    for step in range(decided + 1):
        torch.testing.assert_close(obs_a[step], obs_b[step], rtol=0, atol=0)
    for step in range(decided):  # the reward of the decision at row t uses rows <= t + 1 <= cut
        torch.testing.assert_close(rewards_a[step], rewards_b[step], rtol=0, atol=0)
    # Sanity: the perturbation is visible right after the cut.
    assert not torch.equal(obs_a[decided + 1], obs_b[decided + 1])
    assert not torch.equal(rewards_a[decided], rewards_b[decided])


# --------------------------------------------------------------------------------------- segments and episodes


def test_segments_split_instruments_and_missing_days_not_session_breaks_or_weekends() -> None:
    # 2024-01-05 is a Friday: bars Friday evening, over the weekend, through Monday with a 3 h daily break,
    # then Wednesday (Tuesday missing).
    timestamps = [
        datetime(2024, 1, 5, 20, 0, tzinfo=UTC),
        datetime(2024, 1, 5, 21, 0, tzinfo=UTC),
        datetime(2024, 1, 7, 23, 0, tzinfo=UTC),  # weekend: 3 h of weekday time since Friday 21:00
        *[datetime(2024, 1, 8, hour, 0, tzinfo=UTC) for hour in (0, 5, 10, 15, 20)],  # 5 h apart
        datetime(2024, 1, 8, 23, 0, tzinfo=UTC),  # daily break of 3 h
        datetime(2024, 1, 10, 1, 0, tzinfo=UTC),  # Tuesday missing: 26 h gap
        datetime(2024, 1, 10, 2, 0, tzinfo=UTC),
    ]
    closes = [100.0 + i for i in range(len(timestamps))]
    first = frame_from_bars(closes, timestamps=timestamps, instrument_id=1, symbol="A")
    second = frame_from_bars(closes, timestamps=timestamps, instrument_id=2, symbol="B")
    both = pl.concat([first, second])
    data = market_data(both)
    np.testing.assert_array_equal(data.segment_id.numpy(), [0] * 9 + [1] * 2 + [2] * 9 + [3] * 2)
    np.testing.assert_array_equal(data.segment_first, [0, 9, 11, 20])
    np.testing.assert_array_equal(data.segment_last, [8, 10, 19, 21])
    assert not data.is_decision.numpy()[[8, 10, 19, 21]].any() and data.is_decision.numpy().sum() == 18
    assert (
        data.cost_close.numpy()[8] > 0 and data.ret_close_close.numpy()[8] == 0.0
    )  # no return across a split
    np.testing.assert_array_equal(data.episode_starts(3), [0, 1, 2, 3, 4, 5, 11, 12, 13, 14, 15, 16])

    tight = market_data(both, max_gap=timedelta(hours=4))  # the 5 h gaps now split, the weekend does not
    assert tight.segment_first.tolist() == [0, 4, 5, 6, 7, 9, 11, 15, 16, 17, 18, 20]
    loose = market_data(both, max_gap=None)
    assert loose.segment_first.tolist() == [0, 11]


def test_episodes_never_cross_segments_and_auto_reset_flat() -> None:
    data = market_data(random_frame(skip_days=(date(2024, 1, 3),)))
    config = EnvConfig(episode_length=7, n_envs=16, window=2)
    env = TradingEnv(data, config, seed=3)
    obs = env.reset()
    assert torch.all(obs[:, -1] == 0)
    segment, is_decision = data.segment_id, data.is_decision
    valid_start = torch.zeros(data.n_rows, dtype=torch.bool)
    valid_start[torch.as_tensor(data.episode_starts(7))] = True
    generator = torch.Generator().manual_seed(0)
    episode_segment = segment[env.row]
    previous_row = env.row.clone()
    assert valid_start[env.row].all()
    for step in range(1, 3 * 7 + 1):
        assert is_decision[env.row].all()
        actions = torch.randint(0, 3, (16,), generator=generator)
        rows_before = env.row.clone()
        obs, _, terminated, truncated = env.step(actions)
        assert not terminated.any()
        assert bool(truncated.all()) == (step % 7 == 0) and bool(truncated.any()) == (step % 7 == 0)
        if step % 7 == 0:
            assert torch.all(obs[:, -1] == 0) and torch.all(env.position == 0)
            assert valid_start[env.row].all()
            final = env.final_obs
            torch.testing.assert_close(final[:, -1], torch.tensor([-1.0, 0.0, 1.0])[actions])
            torch.testing.assert_close(final, data.observe(rows_before + 1, final[:, -1], 2))
            episode_segment = segment[env.row]
        else:
            assert torch.equal(env.row, previous_row + 1)
            assert torch.equal(segment[env.row], episode_segment)
            assert torch.equal(obs, env.final_obs)  # not done: the returned obs is the final obs
            torch.testing.assert_close(obs[:, -1], torch.tensor([-1.0, 0.0, 1.0])[actions])
        previous_row = env.row.clone()


def test_window_rows_are_oldest_first_and_never_cross_a_segment_start() -> None:
    df = random_frame(n_instruments=2, days=2, drop=0.0, n_features=2)
    data = market_data(df)
    features = data.features
    second_start = int(data.segment_first[1])
    rows = torch.tensor([second_start, second_start + 1, second_start + 5])
    obs = data.observe(rows, torch.tensor([1.0, 0.0, -1.0]), window=3)
    f = features
    torch.testing.assert_close(
        obs[0], torch.cat([f[second_start], f[second_start], f[second_start], torch.tensor([1.0])])
    )
    torch.testing.assert_close(
        obs[1], torch.cat([f[second_start], f[second_start], f[second_start + 1], torch.tensor([0.0])])
    )
    torch.testing.assert_close(
        obs[2],
        torch.cat([f[second_start + 3], f[second_start + 4], f[second_start + 5], torch.tensor([-1.0])]),
    )
    assert obs.dtype == torch.float32 and obs.shape == (3, 3 * 2 + 1)


# ------------------------------------------------------------------------------------- resets and determinism


def test_same_seed_same_run_and_different_seed_different_starts() -> None:
    data = market_data(random_frame())
    config = EnvConfig(episode_length=5, n_envs=8)

    def run(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        env = TradingEnv(data, config, seed=seed)
        observations, rewards = [env.reset()], []
        generator = torch.Generator().manual_seed(1)
        for _ in range(12):
            obs, reward, _, _ = env.step(torch.randint(0, 3, (8,), generator=generator))
            observations.append(obs)
            rewards.append(reward)
        return torch.stack(observations), torch.stack(rewards)

    first, again, other = run(7), run(7), run(8)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])


def test_seed_blocks_are_independent_single_seed_envs() -> None:
    """A sequence of seeds gives one block of n_envs envs per seed; block i replays the env seeded alone with
    seed i (starts, observations, rewards), over several start pools and through a state_dict round trip."""
    data = market_data(random_frame())
    config = EnvConfig(episode_length=3, n_envs=4)
    actions = torch.randint(0, 3, (150, 4), generator=torch.Generator().manual_seed(2))

    def run(env: TradingEnv, blocks: int) -> list[torch.Tensor]:
        out = [env.reset()]
        for t in range(150):
            if t == 70:  # resume mid-pool into a fresh env
                state = env.state_dict()
                env = TradingEnv(data, config, seed=[0] * blocks if blocks > 1 else 0)
                env.load_state_dict(state)
            obs, reward, _, _ = env.step(actions[t].repeat(blocks))
            out += [obs, reward[:, None]]
        return out

    batched = run(TradingEnv(data, config, seed=[7, 8, 9]), 3)
    assert batched[0].shape[0] == 12
    for block, seed in enumerate([7, 8, 9]):
        alone = run(TradingEnv(data, config, seed=seed), 1)
        for got, expected in zip(batched, alone, strict=True):
            assert torch.equal(got[4 * block : 4 * block + 4], expected)
    assert not torch.equal(batched[0][:4], batched[0][4:8])
    with pytest.raises(EnvConfigError, match="expected 3 seeds"):
        TradingEnv(data, config, seed=[1, 2, 3]).seed(1)


def test_reset_rejects_invalid_start_rows() -> None:
    data = market_data(frame_from_bars(CLOSE, OPEN))
    env = TradingEnv(data, EnvConfig(episode_length=4, n_envs=1), seed=0)
    with pytest.raises(EnvDataError, match="start_rows"):
        env.reset([1])  # an episode of 4 from row 1 would reach the last bar
    with pytest.raises(EnvDataError, match="start_rows"):
        env.reset([0, 0])


def test_step_performs_no_host_sync() -> None:
    data = market_data(random_frame())
    env = TradingEnv(data, EnvConfig(episode_length=9, n_envs=32, window=2), seed=0)
    actions = torch.randint(0, 3, (150, 32), generator=torch.Generator().manual_seed(0))
    env.reset()
    with SyncCounter(count_cpu=True) as counter:
        for step_actions in actions:  # 150 steps: several auto-resets and start-pool refills
            env.step(step_actions)
    assert counter.count == 0, dict(counter.by_kind)
    with SyncCounter(count_cpu=True) as counter:  # the counter does see a sync where there is one
        bool(env.step(actions[0])[3].any())
    assert counter.count == 1


# ------------------------------------------------------------------------------------------------ bad input


def test_env_config_from_config_and_errors() -> None:
    config = EnvConfig.from_config({"window": 4, "fill": "next_open", "max_gap": "90m"})
    assert config.window == 4 and config.max_gap == timedelta(minutes=90)
    assert EnvConfig.from_config({"max_gap": None}).max_gap is None
    assert parse_duration("2d", key="env.max_gap") == timedelta(days=2)
    assert parse_duration(3600, key="env.max_gap") == timedelta(hours=1)
    for bad, key in [
        ({"window": 0}, "env.window"),
        ({"fill": "vwap"}, "env.fill"),
        ({"max_gap": "soon"}, "env.max_gap"),
        ({"episode_length": 2.5}, "env.episode_length"),
        ({"horizon": 3}, "env.horizon"),
    ]:
        with pytest.raises(EnvConfigError, match=key.replace(".", r"\.")):
            EnvConfig.from_config(bad)


def test_bad_frames_raise_one_line_errors() -> None:
    df = frame_from_bars(CLOSE, OPEN)
    with pytest.raises(EnvDataError, match="'close'"):
        market_data(df.drop("close"))
    with pytest.raises(EnvDataError, match="'ts_event' must be a Datetime"):
        market_data(df.with_columns(pl.col("ts_event").dt.epoch("ns")))
    with pytest.raises(EnvDataError, match="sorted"):
        market_data(df.reverse())
    with pytest.raises(EnvDataError, match="'open'"):
        market_data(df.with_columns(open=pl.lit(0.0)))
    with pytest.raises(EnvDataError, match="normalizer"):
        MarketData.from_frame(df, ["f0"], FeatureNormalizer().fit(df, ["f1"]), BPS10)
    with pytest.raises(EnvDataError, match=r"env\.episode_length"):
        TradingEnv(market_data(df), EnvConfig(episode_length=5, n_envs=1))
    with pytest.raises(EnvConfigError, match=r"env\.max_gap"):
        TradingEnv(market_data(df), EnvConfig(episode_length=2, n_envs=1, max_gap=None))
    with pytest.raises(EnvDataError, match="symbol 'ES'"):
        market_data(df, costs={"NQ": BPS10})


def test_cost_models_per_symbol() -> None:
    df = pl.concat(
        [
            frame_from_bars(CLOSE, instrument_id=1, symbol="A"),
            frame_from_bars(CLOSE, instrument_id=2, symbol="B"),
        ]
    )
    data = market_data(df, costs={"A": BPS10, "B": BPS10.scaled(2.0)})
    np.testing.assert_allclose(data.cost_close.numpy(), [1e-3] * 5 + [2e-3] * 5, rtol=1e-6)
