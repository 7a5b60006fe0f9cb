"""The report never holds a run's per-bar tables: load_inputs leaves the model runs' tables on disk, the strategies
are built one at a time and reduced to days, summaries and a bounded path for the figures
(marketrl.verdict.strategies.digest), and the random traders are read one at a time. The same report, number for
number, as from every per-bar table held in memory, and what each digest keeps is what the bars say."""

from __future__ import annotations

import dataclasses
import gc
import math
import weakref
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from marketrl.report.build import build_context, build_report, render, verdict_record
from marketrl.scoring.metrics import (
    daily_information_coefficients,
    drawdown_series,
    performance_summary,
    portfolio_bars,
)
from marketrl.verdict import inputs as inputs_module
from marketrl.verdict.inputs import RandomTraders, ReportInputError, ReportInputs, Run, load_inputs
from marketrl.verdict.strategies import (
    PATH_POINTS,
    DailyReturns,
    ReturnSeries,
    build_strategies,
    calibration_bins,
    random_seed_strategies,
    trading_share,
)
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
        tmp_path_factory.mktemp("stream") / "run",
        models=("dqn", "linear"),
        n_folds=3,
        random_seeds=6,
        bars_per_day=480,  # 4,320 test bars a seed: more than an equity path keeps
    )
    _add_fills(outputs)
    return outputs


def _inputs(outputs: PipelineOutputs) -> ReportInputs:
    return load_inputs(
        outputs.eval_files, outputs.bar_files, outputs.hyperopt_files, outputs.folds_path, outputs.train_logs
    )


def _held_in_memory(inputs: ReportInputs) -> ReportInputs:
    """The report's inputs with every per-bar table in memory: the model runs read, every trader's table held."""
    traders = inputs.random_traders
    runs = [run for seed in traders.seeds for run in traders.runs(seed)]
    models = [run.read() for run in inputs.model_runs]
    assert all(not run.deferred and run.bars.height for run in models)
    return dataclasses.replace(
        inputs, model_runs=models, random_seed_runs=runs, random_traders=RandomTraders()
    )


def test_streamed_runs_give_the_report_of_the_per_bar_tables(outputs: PipelineOutputs) -> None:
    inputs = _inputs(outputs)
    assert inputs.random_seed_runs == [] and inputs.random_traders.seeds == list(range(6))
    assert all(run.deferred and run.bars.is_empty() for run in inputs.model_runs)
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
    with pytest.raises(ValueError, match="only 0x, 1x costs are kept, not 2x"):
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


def test_a_digested_model_keeps_what_its_bars_say(outputs: PipelineOutputs) -> None:
    """A model seed's digest against its per-bar tables: daily returns at every configured cost multiple, the
    summaries, the shares, the figures' path (wealth and drawdown at the bars it keeps), the forecasts."""
    inputs = _inputs(outputs)
    multipliers = [float(m) for m in outputs.config["evaluation"]["cost_multipliers"]]
    runs = [run for run in inputs.model_runs if run.strategy == "linear" and run.seed_index == 1]
    (strategy,) = build_strategies(runs, multipliers=multipliers)
    assert all(run.bars.is_empty() and run.forecasts is None for run in strategy.fold_runs.values())
    read = [run.read() for run in sorted(runs, key=lambda run: run.fold)]
    bars = pl.concat([run.bars for run in read])
    assert strategy.pooled_summary == performance_summary(bars)
    assert strategy.fold_summaries == {run.fold: performance_summary(run.bars) for run in read}
    assert strategy.trading_share == trading_share(bars) and strategy.symbols == ("SYNTH-ES", "SYNTH-NQ")
    assert strategy.bars_per_day == 480
    series = ReturnSeries.from_bars(bars)
    assert isinstance(strategy.pooled, DailyReturns) and sorted(strategy.pooled.returns) == sorted(
        {0.0, 1.0, *multipliers}
    )
    for multiplier in multipliers:
        days, daily = strategy.pooled.daily(multiplier)
        np.testing.assert_array_equal(days, series.daily(multiplier)[0])
        np.testing.assert_array_equal(daily, series.daily(multiplier)[1])
    path = strategy.path
    assert path is not None and path.net.size == PATH_POINTS < series.net.size
    kept = np.linspace(0, series.net.size - 1, PATH_POINTS).round().astype(np.int64)
    np.testing.assert_allclose(path.net, np.cumprod(1.0 + series.net)[kept], rtol=1e-12)
    np.testing.assert_allclose(path.gross, np.cumprod(1.0 + series.gross)[kept], rtol=1e-12)
    np.testing.assert_array_equal(path.drawdown, drawdown_series(series.net)[kept])
    np.testing.assert_array_equal(path.day, series.day.astype("datetime64[D]")[kept])
    assert 0.0 <= path.place.min() and path.place.max() < 1.0 and path.place[0] == 0.0
    assert path.place[-1] == 479 / 480  # the last kept bar is the last of its day
    assert path.fold_starts == {run.fold: np.datetime64(run.bars["trading_day"].min(), "D") for run in read}
    forecasts = strategy.forecasts
    assert forecasts is not None
    for run in read:
        frame = run.forecasts
        assert frame is not None
        for got, want in zip(
            forecasts.daily_ic[run.fold],
            daily_information_coefficients(
                frame["trading_day"], frame["prediction"], frame["forward_return"]
            ),
            strict=True,
        ):
            np.testing.assert_array_equal(got, want)
    frames = pl.concat([run.forecasts for run in read if run.forecasts is not None])
    x, y = calibration_bins(frames["prediction"].to_numpy(), frames["forward_return"].to_numpy())
    np.testing.assert_array_equal(forecasts.bins[0], x)
    np.testing.assert_array_equal(forecasts.bins[1], y)


def test_the_report_holds_one_strategys_tables_at_a_time(
    outputs: PipelineOutputs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every model run is read once, when its strategy is built, and no earlier strategy's table is still alive
    when the next strategy's are read: the report's memory does not grow with models × seeds × folds."""
    read = inputs_module._read_model_run
    alive: list[weakref.ref] = []
    held: list[int] = []
    reads: list[tuple[str, int | None, int]] = []

    def watched(run: Run) -> Run:
        gc.collect()
        held.append(sum(ref() is not None for ref in alive))
        result = read(run)
        alive.append(weakref.ref(result.bars))
        reads.append((run.strategy, run.seed_index, run.fold))
        return result

    monkeypatch.setattr(inputs_module, "_read_model_run", watched)
    inputs = _inputs(outputs)
    assert reads == []  # load_inputs reads no model table
    build_context(inputs, outputs.config)
    assert sorted(reads) == sorted({(r.strategy, r.seed_index, r.fold) for r in inputs.model_runs})
    n_folds = len(inputs.folds)
    assert max(held) < n_folds  # only the current strategy's earlier folds
    assert held[::n_folds] == [0] * (len(reads) // n_folds)  # each strategy starts with nothing held


def test_a_damaged_model_table_is_named_when_its_strategy_is_built(
    outputs: PipelineOutputs, tmp_path: Path
) -> None:
    """A model table is read only when its strategy is built, but a bad value is still a one-line error naming
    it, and no report is written."""
    path = next(p for p in outputs.bar_files if "/dqn/fold_1/seed_0/" in p)
    broken = tmp_path / "fold_1" / "bars.parquet"
    broken.parent.mkdir()
    pl.read_parquet(path).with_columns(cost=pl.lit(-1.0)).write_parquet(broken)
    kwargs = outputs.report_kwargs(tmp_path / "eval_report.html")
    kwargs["bar_files"] = [str(broken) if p == path else p for p in outputs.bar_files]
    with pytest.raises(ReportInputError) as caught:
        build_report(**kwargs)
    message = str(caught.value)
    assert message.startswith(f"{broken}: per-bar table: column 'cost' must be ≥ 0") and "\n" not in message
    assert not (tmp_path / "eval_report.html").exists()


def test_the_fill_table_is_what_the_per_bar_fills_say(outputs: PipelineOutputs) -> None:
    """Each run keeps its fills as contracts per distinct half-spread: the fill table's contracts, weighted mean
    and 95th percentile, wide share and fallbacks are those of every fill of the per-bar tables."""
    context = build_context(_inputs(outputs), outputs.config)
    rows = {row["name"]: row for row in context["fill_rows"]}
    for name, marker in (("dqn", "/dqn/"), ("linear", "/linear/")):
        bars = pl.concat([pl.read_parquet(p) for p in outputs.bar_files if marker in p])
        traded = bars["traded"].to_numpy().astype(np.float64)
        ticks = bars["half_spread_ticks"].fill_null(np.nan).to_numpy().astype(np.float64)
        filled = (traded > 0) & np.isfinite(ticks)
        weight, paid = traded[filled], ticks[filled]
        order = np.argsort(paid, kind="stable")
        share = np.cumsum(weight[order]) / weight.sum()
        row = rows[name]
        assert row["contracts"] == pytest.approx(weight.sum(), rel=1e-12)
        assert row["mean_ticks"] == pytest.approx(np.average(paid, weights=weight), rel=1e-12)
        assert row["p95_ticks"] == paid[order][np.searchsorted(share, 0.95)]
        assert row["wide_share"] == pytest.approx(weight[paid > 0.5].sum() / weight.sum(), rel=1e-12)
        assert row["fallback_fills"] == int(bars["quote_fallback"].fill_null(False).sum()) > 0
    kept = next(iter(build_strategies(_inputs(outputs).model_runs)[0].fold_runs.values())).fills
    assert kept is not None and kept.ticks.tolist() == [0.5, 1.0, 1.5]  # the fixture's half-spreads
