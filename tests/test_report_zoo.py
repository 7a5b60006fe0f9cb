"""The report over the model zoo: agents and forecasters side by side in the leaderboard, the forecast-quality
section (IC, Rank IC, ICIR and calibration, checked against scipy on the bars), every section covering every
model, and runs of agents only, forecasters only and all eleven models."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from marketrl.report import ReportInputError, build_report
from marketrl.report.figures import training_metrics_present
from marketrl.scoring.metrics import (
    daily_information_coefficients,
    information_coefficient_summary,
    summarize_information_coefficients,
)
from marketrl.verdict.inputs import TrainLog, configured_models
from marketrl.verdict.strategies import calibration_bins
from tests.report_fixtures import AGENTS, FORECASTERS, PipelineOutputs, write_pipeline_outputs
from tests.test_report import SIZE_BUDGET_BYTES, _build, _Cells, _parse

ZOO = ("dqn", "ppo", "linear", "lightgbm")
BASELINE_ROWS = {"buy_and_hold", "flat", "momentum", "random", "matched_random"}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[PipelineOutputs, str]:
    """Two agents (ppo with look-ahead skill) and two forecasters (lightgbm informative, linear not), 12 test
    days and 5 seeds: above the default minimums, so the verdict makes claims."""
    root = tmp_path_factory.mktemp("zoo")
    outputs = write_pipeline_outputs(
        root / "run",
        models=ZOO,
        skill={"ppo": 0.95},
        forecast_ic={"lightgbm": 0.4, "linear": 0.0},
        test_days=4,
        n_seeds=5,
        random_seeds=4,
        seed=3,
    )
    return outputs, _build(outputs, root / "eval_report.html")


# ---------------------------------------------------------------------------------------- IC (the library)


def test_daily_ic_matches_scipy_with_missing_pairs_dropped() -> None:
    rng = np.random.default_rng(5)
    days = np.repeat(np.array(["2024-01-03", "2024-01-02", "2024-01-04"], dtype="datetime64[D]"), 40)
    pred = rng.normal(size=days.size).round(1)  # ties, as Spearman's average ranks must handle
    real = 0.3 * pred + rng.normal(size=days.size)
    real[::7] = np.nan  # no realized forward return (end of a segment)
    pred[3] = np.nan
    found, ic, rank_ic = daily_information_coefficients(days, pred, real)
    assert found.tolist() == sorted(set(days.tolist()))
    for k, day in enumerate(found):
        mask = (days == day) & np.isfinite(pred) & np.isfinite(real)
        assert ic[k] == pytest.approx(stats.pearsonr(pred[mask], real[mask])[0], rel=1e-12)
        assert rank_ic[k] == pytest.approx(stats.spearmanr(pred[mask], real[mask])[0], rel=1e-12)
    summary = summarize_information_coefficients(ic, rank_ic)
    assert summary["ic"] == pytest.approx(np.mean(ic))
    assert summary["icir"] == pytest.approx(np.mean(ic) / np.std(ic, ddof=1))
    assert summary["rank_icir"] == pytest.approx(np.mean(rank_ic) / np.std(rank_ic, ddof=1))
    assert summary["n_days"] == 3
    # polars input with nulls (how bars.parquet stores a missing forward return) gives the same numbers
    frame = pl.DataFrame({"d": days, "p": pred, "r": real}).with_columns(pl.col("r").fill_nan(None))
    assert information_coefficient_summary(frame["d"], frame["p"], frame["r"]) == pytest.approx(summary)


def test_a_day_without_enough_pairs_or_spread_has_no_ic() -> None:
    days = np.array([1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
    pred = np.array([0.1, 0.2, 0.5, 0.5, 0.5, 0.5, 0.1, 0.2, 0.3, np.nan])
    real = np.array([1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 1.0, 3.0, 2.0, 5.0])
    _, ic, rank_ic = daily_information_coefficients(days, pred, real)
    # day 1: 2 pairs; day 2: a constant prediction; day 3: 3 pairs once the NaN is dropped
    assert math.isnan(ic[0]) and math.isnan(ic[1]) and math.isnan(rank_ic[1])
    assert ic[2] == pytest.approx(stats.pearsonr([0.1, 0.2, 0.3], [1.0, 3.0, 2.0])[0])
    summary = summarize_information_coefficients(ic, rank_ic)
    assert summary["n_days"] == 1 and summary["ic"] == pytest.approx(ic[2])
    assert math.isnan(summary["icir"]), "one scored day has no spread: no ICIR"
    empty = summarize_information_coefficients(np.full(2, np.nan), np.full(2, np.nan))
    assert empty["n_days"] == 0 and math.isnan(empty["ic"]) and math.isnan(empty["rank_icir"])


def test_perfect_predictor_scores_one_and_a_shuffled_one_about_zero() -> None:
    rng = np.random.default_rng(11)
    days = np.repeat(np.arange(20), 500)
    real = rng.standard_t(4, days.size) * 1e-4
    _, ic, rank_ic = daily_information_coefficients(days, 3.0 * real + 1e-5, real)
    np.testing.assert_allclose(ic, 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rank_ic, 1.0, rtol=0, atol=1e-12)
    _, ic, rank_ic = daily_information_coefficients(days, np.tanh(real * 1e4) ** 3, real)
    np.testing.assert_allclose(rank_ic, 1.0, atol=1e-12)  # a monotone transform keeps every rank
    assert np.all(ic < 0.999)
    shuffled = rng.permutation(real)
    summary = information_coefficient_summary(days, shuffled, real)
    # 20 days × 500 pairs: the mean of 20 null ICs has standard error ≈ 1/√10000 = 0.01
    assert abs(summary["ic"]) < 0.04 and abs(summary["rank_ic"]) < 0.04


def test_calibration_bins_are_equal_count_deciles() -> None:
    rng = np.random.default_rng(2)
    pred = rng.normal(size=1000)
    real = 0.5 * pred + rng.normal(size=1000)
    real[:30] = np.nan
    x, y = calibration_bins(pred, real)
    keep = np.isfinite(real)
    order = np.argsort(pred[keep], kind="stable")
    chunks = np.array_split(order, 10)
    np.testing.assert_allclose(x, [pred[keep][c].mean() for c in chunks])
    np.testing.assert_allclose(y, [real[keep][c].mean() for c in chunks])
    assert np.all(np.diff(x) > 0)
    assert np.isnan(calibration_bins(pred[:5], real[:5])[0]).all()


# --------------------------------------------------------------------------------------------- leaderboard


def _rows(parsed: _Cells) -> list[dict[str, str]]:
    return [attrs for tag, attrs in parsed.tags if tag == "tr" and "data-leaderboard" in attrs]


def _lb(parsed: _Cells, metric: str, name: str) -> str:
    return parsed.cell(metric, leaderboard=name)["data-value"]


def test_leaderboard_has_every_model_and_baseline_sorted_by_net_sharpe(
    zoo: tuple[PipelineOutputs, str],
) -> None:
    _, html = zoo
    parsed = _parse(html)
    rows = _rows(parsed)
    assert {r["data-leaderboard"] for r in rows} == set(ZOO) | BASELINE_ROWS
    assert {r["data-leaderboard"]: r["data-kind"] for r in rows if r["data-kind"] != "baseline"} == {
        "dqn": "agent",
        "ppo": "agent",
        "linear": "forecaster",
        "lightgbm": "forecaster",
    }
    sharpes = [float(_lb(parsed, "lb-sharpe", r["data-leaderboard"])) for r in rows]
    assert sharpes == sorted(sharpes, reverse=True)
    assert rows[0]["data-leaderboard"] == "ppo"
    # the model rows carry the verdict's Sharpe and interval
    for model in ZOO:
        verdict = parsed.cell("sharpe", algo=model, seed="model")
        board = parsed.cell("lb-sharpe", leaderboard=model)
        assert (board["data-value"], board["data-lo"], board["data-hi"]) == (
            verdict["data-value"],
            verdict["data-lo"],
            verdict["data-hi"],
        )
        assert _lb(parsed, "lb-dsr", model) == parsed.cell("dsr", algo=model)["data-value"] != ""


def test_leaderboard_ic_only_for_forecasters_and_marks_follow_the_family_test(
    zoo: tuple[PipelineOutputs, str],
) -> None:
    _, html = zoo
    parsed = _parse(html)
    for name in ("dqn", "ppo", *BASELINE_ROWS):
        assert _lb(parsed, "lb-ic", name) == _lb(parsed, "lb-icir", name) == "", name
    for model in ("linear", "lightgbm"):
        pooled = parsed.cell("ic", algo=model, window="pooled")["data-value"]
        assert _lb(parsed, "lb-ic", model) == pooled != ""
    assert float(_lb(parsed, "lb-ic", "lightgbm")) > 0.3 > abs(float(_lb(parsed, "lb-ic", "linear")))
    verdicts = {
        attrs["data-algo"]: attrs["data-verdict"] for _, attrs in parsed.tags if "data-verdict" in attrs
    }
    assert verdicts["ppo"] == "beats"
    marks_html = {
        model: html.split(f'data-leaderboard="{model}"', 1)[1].split("</tr>", 1)[0] for model in ZOO
    }
    labels = {
        "buy_and_hold": "B&amp;H",
        "flat": "flat",
        "momentum": "mom",
        "random": "rand",
        "matched_random": "TMR",
    }
    marked = 0
    for model in ZOO:
        assert f'data-verdict-mark="{verdicts[model]}"' in marks_html[model]
        for baseline, label in labels.items():
            claim = parsed.cell(f"diff-{baseline}", algo=model, seed="model")["data-claim"]
            sign = {"beats": "&gt;", "worse": "&lt;"}.get(claim)
            mark = f'<span class="claim {claim}">{sign} {label}</span>'
            if verdicts[model] == "beats":
                assert 'class="claim beats">beats every baseline' in marks_html[model]
            elif sign:
                assert mark in marks_html[model]
                marked += 1
            else:
                assert f"{label}</span>" not in marks_html[model]
    assert marked, "lightgbm beats some baselines but not all: its row lists them"


def test_leaderboard_cost_drag_and_turnover_from_the_bars(zoo: tuple[PipelineOutputs, str]) -> None:
    outputs, html = zoo
    parsed = _parse(html)

    def pooled(model: str, seed: int) -> pl.DataFrame:
        return pl.concat(
            pl.read_parquet(outputs.root / f"results/eval/{model}/fold_{k}/seed_{seed}/bars.parquet")
            for k in range(3)
        )

    def sharpe(bars: pl.DataFrame, column: str) -> float:
        table = bars.sort("ts_event", "symbol")
        per_bar = table.group_by("ts_event", maintain_order=True).agg(
            pl.col("trading_day").first(), pl.col(column).cast(pl.Float64).mean()
        )
        daily = per_bar.group_by("trading_day").agg((pl.col(column) + 1).product() - 1)[column].to_numpy()
        return float(daily.mean() / daily.std(ddof=1) * math.sqrt(252))

    drags = [
        sharpe(pooled("lightgbm", s), "gross_return") - sharpe(pooled("lightgbm", s), "net_return")
        for s in range(5)
    ]
    assert float(_lb(parsed, "lb-cost-drag", "lightgbm")) == pytest.approx(np.mean(drags), rel=1e-6)
    assert float(_lb(parsed, "lb-cost-drag", "flat")) == 0.0
    assert float(_lb(parsed, "lb-turnover", "buy_and_hold")) < float(_lb(parsed, "lb-turnover", "dqn"))


# --------------------------------------------------------------------------------------- forecast quality


def _independent_quality(outputs: PipelineOutputs, model: str) -> tuple[dict[int, float], float, float]:
    """(per-fold mean IC, pooled mean IC, pooled ICIR), each per seed then the mean over seeds, with scipy."""
    fold_ic: dict[int, list[float]] = {k: [] for k in range(3)}
    pooled_ic, pooled_icir = [], []
    for seed in range(5):
        seed_days = []
        for fold in range(3):
            bars = pl.read_parquet(
                outputs.root / f"results/eval/{model}/fold_{fold}/seed_{seed}/bars.parquet"
            )
            bars = bars.drop_nulls("forward_return")
            days = [
                stats.pearsonr(group["prediction"], group["forward_return"])[0]
                for _, group in bars.group_by("trading_day")
            ]
            fold_ic[fold].append(float(np.mean(days)))
            seed_days += days
        pooled_ic.append(float(np.mean(seed_days)))
        pooled_icir.append(float(np.mean(seed_days) / np.std(seed_days, ddof=1)))
    return (
        {k: float(np.mean(v)) for k, v in fold_ic.items()},
        float(np.mean(pooled_ic)),
        float(np.mean(pooled_icir)),
    )


def test_forecast_section_matches_scipy_on_the_bars(zoo: tuple[PipelineOutputs, str]) -> None:
    outputs, html = zoo
    parsed = _parse(html)
    for model in ("linear", "lightgbm"):
        per_fold, pooled, icir = _independent_quality(outputs, model)
        for fold, value in per_fold.items():
            assert float(parsed.cell("ic", algo=model, window=f"fold {fold}")["data-value"]) == pytest.approx(
                value
            )
        assert float(parsed.cell("ic", algo=model, window="pooled")["data-value"]) == pytest.approx(pooled)
        assert float(parsed.cell("icir", algo=model, window="pooled")["data-value"]) == pytest.approx(icir)
        assert float(parsed.cell("ic-days", algo=model, window="pooled")["data-value"]) == 12


def test_each_forecaster_has_a_predictions_vs_realized_panel(zoo: tuple[PipelineOutputs, str]) -> None:
    _, html = zoo
    panels = {
        attrs["data-algo"] for tag, attrs in _parse(html).tags if attrs.get("class") == "forecast-panel"
    }
    assert panels == {"linear", "lightgbm"}
    for model in panels:
        panel = html.split(f'<div class="forecast-panel" data-algo="{model}">', 1)[1].split("</div>", 1)[0]
        assert f'aria-label="Predictions vs realized forward returns and daily IC of {model}"' in panel


# ------------------------------------------------------------------------------- every section, every model


def test_every_section_covers_every_model(zoo: tuple[PipelineOutputs, str]) -> None:
    _, html = zoo
    parsed = _parse(html)
    n_baselines = len(BASELINE_ROWS)
    # the primary family holds one hypothesis per model; each secondary family one per model × baseline
    assert re.search(rf"runs across the\s+{len(ZOO)} model\(s\)", html)
    assert f"the {len(ZOO) * n_baselines} model × baseline comparisons" in html
    cards = {attrs["data-algo"] for tag, attrs in parsed.tags if "data-verdict" in attrs}
    hyperopt = {attrs["data-algo"] for tag, attrs in parsed.tags if attrs.get("class") == "card"}
    costs = {attrs["data-strategy"] for tag, attrs in parsed.tags if tag == "tr" and "data-strategy" in attrs}
    assert cards == hyperopt == set(ZOO) and set(ZOO) <= costs
    for model in ZOO:
        assert parsed.cell("dsr", algo=model) and parsed.cell("seed-sharpe", algo=model, seed="4")
        assert f'aria-label="Training curves of {model}"' in html
        assert f'aria-label="Optimization history of {model}"' in html
        # one combined seed-spread row per model: the IQM of its 5 seeds' pooled Sharpes (weights .3/.4/.3)
        seeds = sorted(
            float(parsed.cell("seed-sharpe", algo=model, seed=str(k))["data-value"]) for k in range(5)
        )
        iqm = 0.3 * seeds[1] + 0.4 * seeds[2] + 0.3 * seeds[3]
        assert float(parsed.cell("seed-iqm-pooled", algo=model)["data-value"]) == pytest.approx(iqm, rel=1e-9)
        assert f"{model}" in html.split('id="positions"', 1)[1].split("</section>", 1)[0]


def test_agent_only_run_and_old_files_without_kind(tmp_path: Path) -> None:
    outputs = write_pipeline_outputs(tmp_path / "run", n_folds=2, n_seeds=2, random_seeds=2)
    for path in outputs.eval_files:
        data = json.loads(Path(path).read_text())
        data.pop("kind", None)  # written before the model zoo
        Path(path).write_text(json.dumps(data))
    del outputs.config["training"][
        next(iter(k for k in ("models", "algos") if k in outputs.config["training"]))
    ]
    outputs.config["training"]["algos"] = ["dqn", "ppo"]
    html = _build(outputs, tmp_path / "eval_report.html")
    assert "No forecaster in this run" in html
    kinds = {r["data-leaderboard"]: r["data-kind"] for r in _rows(_parse(html))}
    assert kinds["dqn"] == kinds["ppo"] == "agent"


def test_forecaster_only_run(tmp_path: Path) -> None:
    outputs = write_pipeline_outputs(
        tmp_path / "run",
        models=("linear", "mlp"),
        n_folds=2,
        n_seeds=2,
        random_seeds=2,
        forecast_ic={"mlp": 0.2},
    )
    html = _build(outputs, tmp_path / "eval_report.html")
    parsed = _parse(html)
    assert {r["data-leaderboard"] for r in _rows(parsed) if r["data-kind"] == "forecaster"} == {
        "linear",
        "mlp",
    }
    assert not [r for r in _rows(parsed) if r["data-kind"] == "agent"]
    # supervised logs: losses in history, validation Sharpes only in "validation"; both are plotted
    training = html.split('id="training"', 1)[1].split("</section>", 1)[0]
    assert 'aria-label="Training curves of linear"' in training and "holds no history" not in training
    log = json.loads(Path(outputs.train_logs[0]).read_text())
    panels = training_metrics_present([TrainLog("linear", 0, 0, Path("log.json"), log["history"], log)])
    # known curves first (val_sharpe from the validation records), counters such as the batch count never
    assert [key for key, _ in panels] == ["val_sharpe", "loss", "validation_loss", "grad_norm"]


def test_all_eleven_models_stay_readable_and_under_the_size_budget(tmp_path: Path) -> None:
    """Eleven models × 2 seeds × 3 folds of 3 test days (390 bars a day; the line decimation bounds the
    figures whatever the bar count)."""
    models = AGENTS + FORECASTERS
    outputs = write_pipeline_outputs(tmp_path / "run", models=models, bars_per_day=390, random_seeds=3)
    out = tmp_path / "eval_report.html"
    build_report(**outputs.report_kwargs(out))
    assert out.stat().st_size < SIZE_BUDGET_BYTES
    parsed = _parse(out.read_text(encoding="utf-8"))
    assert {r["data-leaderboard"] for r in _rows(parsed)} == set(models) | BASELINE_ROWS
    assert {a["data-algo"] for _, a in parsed.tags if a.get("class") == "forecast-panel"} == set(FORECASTERS)


# ------------------------------------------------------------------------------------------- bad inputs


def test_model_list_comes_from_training_models_or_algos(tmp_path: Path) -> None:
    assert configured_models({"training": {"models": ["dqn", "linear"]}}) == ["dqn", "linear"]
    assert configured_models({"training": {"algos": ["ppo"]}}) == ["ppo"]
    with pytest.raises(ReportInputError, match=r"training\.models"):
        configured_models({"training": {"models": []}})
    outputs = write_pipeline_outputs(tmp_path / "run", models=("ppo", "linear"), n_folds=2, random_seeds=2)
    training = outputs.config["training"]
    training.pop("algos", None)
    training["models"] = ["ppo", "linear", "gru"]
    kwargs = outputs.report_kwargs(tmp_path / "eval_report.html")
    with pytest.raises(
        ReportInputError, match=r"no evaluation of \['gru'\], listed in config key 'training.models'"
    ):
        build_report(**kwargs)
    kwargs["config"]["training"]["models"] = ["ppo"]
    with pytest.raises(ReportInputError, match=r"evaluations of \['linear'\], not listed"):
        build_report(**kwargs)
    assert not (tmp_path / "eval_report.html").exists()


def test_malformed_forecaster_outputs_are_named(tmp_path: Path) -> None:
    outputs = write_pipeline_outputs(tmp_path / "run", models=("linear",), n_folds=2, random_seeds=2)
    metrics = Path(next(f for f in outputs.eval_files if "/linear/" in f))
    bars = metrics.with_name("bars.parquet")
    kwargs = outputs.report_kwargs(tmp_path / "eval_report.html")
    table = pl.read_parquet(bars)
    table.drop("prediction").write_parquet(bars)
    with pytest.raises(ReportInputError, match="missing column") as caught:
        build_report(**kwargs)
    assert str(bars) in str(caught.value) and "\n" not in str(caught.value)
    table.write_parquet(bars)
    data = json.loads(metrics.read_text())
    for change, message in (({"kind": "oracle"}, "'kind' must be one of"), ({"horizon": None}, "'horizon'")):
        metrics.write_text(json.dumps(data | change))
        with pytest.raises(ReportInputError, match=message) as caught:
            build_report(**kwargs)
        assert str(metrics) in str(caught.value)


def test_a_forecaster_with_constant_predictions_has_no_ic_and_builds(tmp_path: Path) -> None:
    outputs = write_pipeline_outputs(tmp_path / "run", models=("linear", "dqn"), n_folds=2, random_seeds=2)
    for bars_path in outputs.bar_files:
        if "/linear/" in bars_path:
            table = pl.read_parquet(bars_path)
            table.with_columns(pl.lit(0.0).alias("prediction")).write_parquet(bars_path)
    parsed = _parse(_build(outputs, tmp_path / "eval_report.html"))
    assert parsed.cell("ic", algo="linear", window="pooled")["data-value"] == ""
    assert parsed.cell("ic-days", algo="linear", window="pooled")["data-value"] == "0"
    assert _lb(parsed, "lb-ic", "linear") == "" and _lb(parsed, "lb-sharpe", "linear") != ""
