"""Batched scoring of K traders (`marketrl.scoring.batched.score_positions`) gives the numbers of the per-trader
path (`evaluate_positions`, then `performance_summary` and the daily portfolio returns), on CME-shaped data: ES and
NQ continuous symbols, sessions that cross midnight UTC (trading day = the session's end date), a roll, a halt,
and bars one instrument lacks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from marketrl.env import EnvConfig, MarketData, decision_results, evaluate_positions, matched_random_positions
from marketrl.evaluation.evaluate import baselines_job
from marketrl.scoring.batched import score_positions
from marketrl.scoring.metrics import daily_returns, performance_summary, portfolio_bars
from marketrl.splits.normalize import FeatureNormalizer
from tests.support.cme import COSTS, MAX_GAP, cme_frame
from tests.support.runs import synthetic_job_inputs

#: the batched pass runs on the data's device; the GPU machine checks it there too
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.fixture(scope="module", params=DEVICES)
def data(request: pytest.FixtureRequest) -> MarketData:
    frame = cme_frame()
    names = ["f0", "f1"]
    normalizer = FeatureNormalizer().fit(frame, names)
    data = MarketData.from_frame(frame, names, normalizer, COSTS, request.param, max_gap=MAX_GAP)
    assert bool(data.is_roll.any())  # the setting this test is about
    assert len(data.chain_first) > 2  # the halt starts a new chain
    return data


def trader_positions(data: MarketData) -> torch.Tensor:
    """Flat, long, persistent random traders (holding periods of several bars) and matched random traders."""
    generator = torch.Generator().manual_seed(1)
    n = data.n_rows
    persistent = []
    for stay in (0.5, 0.9, 0.99):
        draws = torch.randint(-1, 2, (n,), generator=generator).float()
        keep = torch.rand(n, generator=generator) < stay
        series = draws.clone()
        for t in range(1, n):  # hold the previous position with probability `stay`
            if keep[t]:
                series[t] = series[t - 1]
        persistent.append(series)
    matched = [matched_random_positions(data, rate, seed=s) for s, rate in enumerate((0.02, 0.3))]
    fixed = [torch.zeros(n), torch.ones(n)]
    return torch.stack([*(p.to(data.device) for p in (*fixed, *persistent)), *matched])


def test_batched_scoring_equals_the_per_trader_path(data: MarketData) -> None:
    config = EnvConfig(max_gap=MAX_GAP, contracts=2, fill="next_open")
    positions = trader_positions(data)
    scores = score_positions(data, positions, config, chunk=3)  # chunks of 3: the last one is partial
    batch = decision_results(data, positions, config)
    assert scores.summaries is not None and len(scores.summaries) == positions.shape[0]
    for k in range(positions.shape[0]):
        bars = evaluate_positions(data, positions[k], config)
        # the batched rewards are the per-trader ones, exactly
        np.testing.assert_array_equal(batch.position[k].cpu().numpy().round(), bars["position"].to_numpy())
        np.testing.assert_array_equal(
            (batch.gross_return[k].double() - batch.cost[k].double()).cpu().numpy(),
            bars["net_return"].to_numpy(),
        )
        portfolio = portfolio_bars(bars)
        days, daily = daily_returns(portfolio["trading_day"], portfolio["portfolio_return"])
        np.testing.assert_array_equal(scores.days, np.asarray(days).astype("datetime64[D]"))
        np.testing.assert_allclose(scores.daily_net_returns[k], daily, rtol=1e-12, atol=1e-15)
        assert_same_summary(scores.summaries[k], performance_summary(bars))
    summaries = scores.summaries
    assert summaries[0]["n_trades"] == 0 and math.isnan(summaries[0]["trade_hit_rate"])  # flat
    assert summaries[1]["n_holding_periods"] > 1  # long: one holding period per chain and symbol
    assert summaries[1]["n_instruments"] == 2 and summaries[1]["n_days"] == 5


def test_daily_returns_only_skip_the_summaries(data: MarketData) -> None:
    config = EnvConfig(max_gap=MAX_GAP)
    positions = trader_positions(data)
    full = score_positions(data, positions, config)
    daily = score_positions(data, positions, config, summaries=False)
    assert daily.summaries is None
    np.testing.assert_array_equal(daily.daily_net_returns, full.daily_net_returns)


def assert_same_summary(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got[key]), key
        elif isinstance(value, str | int):
            assert got[key] == value, key
        else:
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_baselines_job_summaries_are_those_of_its_bars(tmp_path: Path) -> None:
    """The baselines job scores its strategies in one batched pass; each summary is `performance_summary` of that
    strategy's rows of the bars.parquet it writes."""
    _, manifest, folds, config = synthetic_job_inputs(tmp_path, n_instruments=2)
    out = tmp_path / "baselines"
    result = baselines_job(
        fold=0,
        manifest_path=str(manifest),
        folds_path=str(folds),
        config=config,
        metrics_path=str(out / "metrics.json"),
        bars_path=str(out / "bars.parquet"),
    )
    written = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert written["random_seeds"] == config["evaluation"]["random_baseline_seeds"] > 1
    bars = pl.read_parquet(out / "bars.parquet")
    for name in ("buy_and_hold", "flat", "momentum"):
        assert_same_summary(result["strategies"][name], performance_summary(bars.filter(strategy=name)))
    for i, summary in enumerate(result["random_per_seed"]):
        assert_same_summary(summary, performance_summary(bars.filter(strategy=f"random_{i}")))
    assert (
        result["random_per_seed"][0]["n_trades"] > 0
    )  # the random traders trade: the comparison means something
