"""The report reads the random traders one at a time and keeps only their days and summaries
(marketrl.verdict.strategies.digest): the same report, number for number, as holding every trader's per-bar table."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from marketrl.report.build import build_context, render, verdict_record
from marketrl.scoring.metrics import portfolio_bars
from marketrl.verdict.inputs import RandomTraders, ReportInputError, ReportInputs, load_inputs
from marketrl.verdict.strategies import DailyReturns, random_seed_strategies
from tests.report_fixtures import PipelineOutputs, write_pipeline_outputs


def _add_fills(outputs: PipelineOutputs) -> None:
    """The fill columns (marketrl.env.rollout.fill_columns) on every per-bar table, some quotes missing."""
    rng = np.random.default_rng(7)
    for path in outputs.bar_files:
        bars = pl.read_parquet(path)
        change = (pl.col("position") - pl.col("position").shift(1).over("symbol").fill_null(0)).abs()
        ticks = rng.choice([0.5, 0.5, 1.0, 1.5, np.nan], bars.height).astype(np.float32)
        fallback = pl.Series(rng.random(bars.height) < 0.05).set(
            pl.Series(rng.random(bars.height) < 0.1), None
        )
        bars.with_columns(
            traded=change.cast(pl.Float32),
            half_spread_ticks=pl.Series(ticks).fill_nan(None),
            quote_fallback=fallback,
        ).write_parquet(path)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> PipelineOutputs:
    outputs = write_pipeline_outputs(
        tmp_path_factory.mktemp("stream") / "run", n_folds=3, random_seeds=6, bars_per_day=120
    )
    _add_fills(outputs)
    return outputs


def _inputs(outputs: PipelineOutputs) -> ReportInputs:
    return load_inputs(
        outputs.eval_files, outputs.bar_files, outputs.hyperopt_files, outputs.folds_path, outputs.train_logs
    )


def _held_in_memory(inputs: ReportInputs) -> ReportInputs:
    """The report's inputs as they were before the traders were streamed: every trader's per-bar table held."""
    traders = inputs.random_traders
    runs = [run for seed in traders.seeds for run in traders.runs(seed)]
    return dataclasses.replace(inputs, random_seed_runs=runs, random_traders=RandomTraders())


def test_streamed_traders_give_the_report_of_the_per_bar_tables(outputs: PipelineOutputs) -> None:
    inputs = _inputs(outputs)
    assert inputs.random_seed_runs == [] and inputs.random_traders.seeds == list(range(6))
    streamed = build_context(inputs, outputs.config)
    held = build_context(_held_in_memory(inputs), outputs.config)
    held["generated_at"] = streamed["generated_at"]

    def record(context: dict) -> dict:
        result = verdict_record(
            context["verdicts"],
            context["family"],
            outputs.config,
            outputs.eval_files,
            context["learning"],
            context["leaderboard"],
        )
        return {key: value for key, value in result.items() if key != "provenance"}

    assert record(streamed) == record(held)
    assert [row for row in streamed["fill_rows"] if row["name"] == "random"] == [
        row for row in held["fill_rows"] if row["name"] == "random"
    ]
    assert any(row["name"] == "random" and row["fallback_fills"] for row in streamed["fill_rows"])
    assert render(streamed) == render(held)


def test_a_digested_trader_keeps_its_daily_returns_and_no_bars(outputs: PipelineOutputs) -> None:
    """Each day's return is the compounded portfolio return of that day's bars, bit for bit (in bar order)."""
    inputs = _inputs(outputs)
    traders = random_seed_strategies(inputs)
    assert [t.seed_index for t in traders] == inputs.random_traders.seeds
    trader = traders[3]
    assert isinstance(trader.pooled, DailyReturns)
    assert all(run.bars.is_empty() and run.fills is not None for run in trader.fold_runs.values())
    bars = pl.concat(
        [
            pl.read_parquet(p).filter(pl.col("strategy") == "random_3")
            for p in outputs.bar_files
            if "baselines" in p
        ]
    )
    portfolio = portfolio_bars(bars.drop("strategy"))
    for multiplier, column in ((1.0, "portfolio_return"), (0.0, "gross_return")):
        per_day = portfolio.group_by("trading_day", maintain_order=True).agg(pl.col(column))
        expected = [math.prod(1.0 + r for r in returns) - 1.0 for returns in per_day[column].to_list()]
        days, daily = trader.pooled.daily(multiplier)
        np.testing.assert_array_equal(days, per_day["trading_day"].to_numpy())
        np.testing.assert_array_equal(daily, np.array(expected))
    with pytest.raises(ValueError, match="only 0x and 1x"):
        trader.pooled.daily(2.0)


def test_a_trader_table_is_checked_when_the_inputs_are_loaded(
    outputs: PipelineOutputs, tmp_path: Path
) -> None:
    """The traders are read again later, but a malformed one is still a one-line error of load_inputs."""
    path = next(p for p in outputs.bar_files if "baselines" in p)
    bars = pl.read_parquet(path)
    broken = tmp_path / "bars.parquet"
    bars.with_columns(
        cost=pl.when(pl.col("strategy") == "random_4").then(-1.0).otherwise(pl.col("cost"))
    ).write_parquet(broken)
    bar_files = [str(broken) if p == path else p for p in outputs.bar_files]
    with pytest.raises(ReportInputError, match=r"bars\.parquet: per-bar table: column 'cost' must be ≥ 0"):
        load_inputs(
            outputs.eval_files, bar_files, outputs.hyperopt_files, outputs.folds_path, outputs.train_logs
        )
