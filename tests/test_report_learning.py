"""Did each model learn? The convergence rule, the degenerate-policy flags and their one-line summary, in the
report's table and in verdict.json (marketrl.verdict.diagnostics; docs/METRICS.md, "Did each model learn?")."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marketrl.report import ReportInputError, build_report
from marketrl.verdict import diagnostics
from marketrl.verdict.diagnostics import (
    ALWAYS_FLAT,
    CHURNS,
    CONVERGED,
    IN_MARKET,
    SET_FLAT,
    STILL_MOVING,
    UNKNOWN,
    UNSTABLE,
    judge_curve,
    policy_flags,
)
from marketrl.verdict.inputs import load_inputs
from tests.report_fixtures import PipelineOutputs, write_pipeline_outputs
from tests.test_report import _parse

N_FOLDS, N_SEEDS = 2, 3
ALL_RUNS = [(fold, seed) for fold in range(N_FOLDS) for seed in range(N_SEEDS)]

# ------------------------------------------------------------------------------------------ convergence rule


def test_a_curve_still_rising_is_still_moving() -> None:
    label, drift, _, tolerance = judge_curve([0.1, 0.5, 0.9, 1.3, 1.7])
    assert label == STILL_MOVING and drift == pytest.approx(0.8) and tolerance < drift
    assert judge_curve([2.0, 1.6, 1.1, 0.7, 0.2])[0] == STILL_MOVING  # falling moves too


def test_a_flat_tail_has_converged_even_after_a_rise() -> None:
    assert judge_curve([-1.0, 0.5, 1.0, 1.01, 0.99])[0] == CONVERGED
    assert judge_curve([0.0] * 5)[0] == CONVERGED  # a flat policy's constant curve
    assert judge_curve([0.3, -0.2, 0.25, -0.15, 0.2, 0.1, 0.05, 0.15, 0.12, 0.08])[0] == CONVERGED


def test_a_tail_swinging_without_a_trend_is_unstable() -> None:
    label, drift, swing, tolerance = judge_curve([0.0, 0.0, 0.0, 3.0, 0.0], noise=0.5)
    assert label == UNSTABLE and abs(drift) <= tolerance < swing
    assert judge_curve([0.0, 0.0, 0.0, 3.0, 0.0], noise=2.0)[0] == CONVERGED  # the model is that noisy


def test_the_models_noise_is_what_a_drift_is_measured_against() -> None:
    curve = [0.0, 0.1, 0.2, 0.3, 0.4]  # a steady rise of 0.2 over the tail
    assert judge_curve(curve)[0] == STILL_MOVING  # its own noise: none
    assert judge_curve(curve, noise=0.05)[0] == STILL_MOVING
    assert judge_curve(curve, noise=0.5)[0] == CONVERGED  # the model's curves jump far more than it moves
    steady = np.arange(5.0)
    assert diagnostics.model_noise([steady, 2 * steady, steady[:2]]) == 0.0  # a trend is not noise
    noisy = np.array([0.0, 1.0, 0.0, 1.0, 0.0])
    assert diagnostics.model_noise([noisy, steady]) == pytest.approx(
        math.sqrt(np.var(np.diff(noisy), ddof=1) / 4)
    )


def test_too_short_a_curve_is_unknown() -> None:
    assert judge_curve([0.1, 0.2])[0] == UNKNOWN
    assert judge_curve([0.1, math.nan, 0.2, math.inf])[0] == UNKNOWN


# -------------------------------------------------------------------------------------------------- flags


def _flags(**overrides: Any) -> list[str]:
    numbers = {"gross": 2.0, "cost_drag": 0.5, "flat_share": 0.3, "turnover": 3.0, "n_set_flat": 0}
    return policy_flags(**(numbers | overrides))


def test_flags_of_a_policy_that_trades_with_an_edge() -> None:
    assert _flags() == []


def test_always_flat_by_share_or_by_never_trading() -> None:
    assert _flags(flat_share=0.995) == [ALWAYS_FLAT]
    assert _flags(flat_share=0.5, turnover=0.0) == [ALWAYS_FLAT]
    assert _flags(flat_share=0.98) == []


def test_always_in_the_market() -> None:
    assert _flags(flat_share=0.0) == [IN_MARKET]
    assert _flags(flat_share=0.02) == []


def test_churns_when_costs_take_more_than_the_gross_edge() -> None:
    assert _flags(gross=0.4, cost_drag=14.4) == [CHURNS]
    assert _flags(gross=-1.0, cost_drag=0.5) == [CHURNS]  # no edge at all: any material drag is churning
    assert _flags(gross=3.0, cost_drag=2.9) == []  # the edge pays its costs
    assert _flags(gross=-1.0, cost_drag=0.05) == []  # immaterial turnover: a bad model, not a churning one
    assert _flags(gross=0.0, cost_drag=5.0, flat_share=1.0) == [ALWAYS_FLAT]  # never both


def test_set_flat_by_its_validation() -> None:
    assert _flags(n_set_flat=2) == [SET_FLAT]
    assert _flags(flat_share=1.0, turnover=0.0, n_set_flat=6) == [ALWAYS_FLAT, SET_FLAT]


def _diagnosis(flags: list[str], turnover: float, flat_share: float, n_set_flat: int) -> str:
    return diagnostics.LearningDiagnostics(
        model="m",
        gross_sharpe=5.1,
        net_sharpe=4.75,
        turnover=turnover,
        short_share=(1 - flat_share) / 2,
        flat_share=flat_share,
        long_share=(1 - flat_share) / 2,
        n_runs=3,
        n_gate_recorded=3,
        n_set_flat=n_set_flat,
        n_set_flat_by_record=0,
        gates=(),
        convergence=diagnostics.Convergence(()),
        flags=tuple(flags),
    ).summary


def test_a_model_flat_on_almost_every_bar_that_still_trades_is_not_called_flat() -> None:
    """A rare trader earns something: the summary says what, not "stays flat" (linear on a clear-edge demo)."""
    rare = _diagnosis([ALWAYS_FLAT, SET_FLAT], turnover=7.0, flat_share=0.995, n_set_flat=2)
    assert rare.startswith("trades rarely (0.5% of bars in the market): gross 5.1, cost drag 0.3")
    assert "set flat by its validation on 2 of 3 seed-folds" in rare
    barely = _diagnosis([ALWAYS_FLAT, SET_FLAT], turnover=0.2, flat_share=0.9998, n_set_flat=2)
    assert barely.startswith("trades rarely (< 0.1% of bars in the market)")
    never = _diagnosis([ALWAYS_FLAT], turnover=0.0, flat_share=1.0, n_set_flat=0)
    assert never.startswith("did not learn to trade: it stays flat")


# ------------------------------------------------------------------------------- report and verdict.json


def _build(outputs: PipelineOutputs, root: Path) -> tuple[str, dict[str, Any]]:
    verdict = root / "verdict.json"
    build_report(**outputs.report_kwargs(root / "eval_report.html"), verdict_path=str(verdict))
    html = (root / "eval_report.html").read_text(encoding="utf-8")
    return html, json.loads(verdict.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def degenerate(tmp_path_factory: pytest.TempPathFactory) -> tuple[PipelineOutputs, str, dict[str, Any]]:
    """dqn never trades; every ppo run is set flat by its validation gate; linear is gated on 2 of its 6
    seed-folds and its validation curves still rise; lstm trades and is not gated (no record). Both forecasters
    have an edge (IC 0.3) worth their costs."""
    root = tmp_path_factory.mktemp("learning")
    outputs = write_pipeline_outputs(
        root / "run",
        models=("dqn", "ppo", "linear", "lstm"),
        n_folds=N_FOLDS,
        n_seeds=N_SEEDS,
        random_seeds=3,
        flat_models=("dqn",),
        gated={"ppo": ALL_RUNS, "linear": [(0, 0), (1, 2)]},
        validation_trend={"linear": 0.5},
        forecast_ic={"linear": 0.3, "lstm": 0.3},
        seed=3,
    )
    return (outputs, *_build(outputs, root))


def _row(html: str, model: str) -> dict[str, str]:
    rows = [attrs for tag, attrs in _parse(html).tags if tag == "tr" and "data-flags" in attrs]
    (row,) = [r for r in rows if r["data-algo"] == model]
    return row


def test_always_flat_model_did_not_learn_to_trade(degenerate: tuple[PipelineOutputs, str, dict]) -> None:
    _, html, record = degenerate
    dqn = record["models"]["dqn"]["diagnostics"]
    assert dqn["flags"] == [ALWAYS_FLAT]
    assert dqn["summary"].startswith("did not learn to trade: it stays flat")
    assert dqn["positions"] == {"short": 0.0, "flat": 1.0, "long": 0.0}
    assert dqn["avg_daily_turnover"] == 0.0
    assert dqn["flat_gate"]["recorded"] == 0  # no gate record: not gated
    assert _row(html, "dqn")["data-flags"] == ALWAYS_FLAT
    assert "did not learn to trade: it stays flat" in html


def test_gated_model_says_its_validation_set_it_flat(degenerate: tuple[PipelineOutputs, str, dict]) -> None:
    _, html, record = degenerate
    ppo = record["models"]["ppo"]["diagnostics"]
    n = N_FOLDS * N_SEEDS
    assert SET_FLAT in ppo["flags"] and ALWAYS_FLAT in ppo["flags"]
    assert ppo["summary"].startswith(
        f"did not learn to trade: set flat by its validation on {n} of {n} seed-folds"
    )
    assert ppo["flat_gate"]["set_flat"] == ppo["flat_gate"]["recorded"] == n
    gate = ppo["flat_gate"]["per_run"][0]
    assert gate["set_flat"] is True and gate["min_t"] == 1.0 and {"t_stat", "net_sharpe"} <= set(gate)
    cell = _parse(html).cell("learned-set-flat", algo="ppo")
    assert cell["data-value"] == str(n)


def test_partly_gated_model_that_still_moves(degenerate: tuple[PipelineOutputs, str, dict]) -> None:
    _, html, record = degenerate
    linear = record["models"]["linear"]["diagnostics"]
    assert linear["flags"] == [SET_FLAT]
    assert linear["summary"].startswith("trades: gross ")
    assert "set flat by its validation on 2 of 6 seed-folds" in linear["summary"]
    assert linear["convergence"]["label"] == STILL_MOVING and linear["convergence"]["converged"] == 0
    assert linear["summary"].endswith("still moving (only 0 of 6 runs converged)")
    assert {run["label"] for run in linear["convergence"]["per_run"]} == {STILL_MOVING}
    assert _row(html, "linear")["data-convergence"] == STILL_MOVING


def test_a_trading_model_gets_its_gross_edge_and_cost_drag(
    degenerate: tuple[PipelineOutputs, str, dict],
) -> None:
    _, html, record = degenerate
    lstm = record["models"]["lstm"]["diagnostics"]
    assert lstm["flags"] == []
    assert lstm["cost_drag"] == pytest.approx(lstm["gross_sharpe"] - lstm["net_sharpe"])
    assert lstm["summary"].startswith(
        f"trades: gross {lstm['gross_sharpe']:.1f}, cost drag {lstm['cost_drag']:.1f}"
    )
    assert sum(lstm["positions"].values()) == pytest.approx(1.0)
    assert 0.0 < lstm["positions"]["flat"] < 0.5
    # the leaderboard's gross edge and cost drag, not a second computation
    parsed = _parse(html)
    leaderboard = float(parsed.cell("lb-cost-drag", leaderboard="lstm")["data-value"])
    assert leaderboard == pytest.approx(lstm["cost_drag"], rel=1e-9)
    assert "Did each model learn?" in html


def test_churning_model_is_flagged(tmp_path: Path) -> None:
    """Decisions every bar at ten times the default cost: the costs take far more Sharpe than any edge."""
    outputs = write_pipeline_outputs(
        tmp_path / "run", models=("dqn",), n_folds=N_FOLDS, n_seeds=N_SEEDS, hold_bars=1, cost_per_side=2e-4
    )
    html, record = _build(outputs, tmp_path)
    dqn = record["models"]["dqn"]["diagnostics"]
    assert dqn["flags"] == [CHURNS]
    assert dqn["cost_drag"] > max(dqn["gross_sharpe"], 0.0) + diagnostics.MIN_CHURN_DRAG
    assert dqn["summary"].startswith(
        f"churns: cost drag {dqn['cost_drag']:.1f} above gross edge {dqn['gross_sharpe']:.1f}"
    )
    assert _row(html, "dqn")["data-flags"] == CHURNS


def test_flat_gate_is_carried_on_the_run_and_checked(tmp_path: Path) -> None:
    outputs = write_pipeline_outputs(
        tmp_path / "run", models=("ppo",), n_folds=2, random_seeds=2, gated={"ppo": [(1, 0)]}
    )
    args = (
        outputs.eval_files,
        outputs.bar_files,
        outputs.hyperopt_files,
        outputs.folds_path,
        outputs.train_logs,
    )
    runs = {(run.fold, run.seed_index): run for run in load_inputs(*args).model_runs}
    assert runs[(1, 0)].flat_gate is not None and runs[(1, 0)].flat_gate["set_flat"] is True
    assert runs[(0, 0)].flat_gate is not None and runs[(0, 0)].flat_gate["set_flat"] is False
    path = Path(next(p for p in outputs.eval_files if "/ppo/fold_0/seed_0/" in p))
    data = json.loads(path.read_text())
    data["flat_gate"] = {"set_flat": "yes"}
    path.write_text(json.dumps(data))
    with pytest.raises(ReportInputError) as caught:
        load_inputs(*args)
    assert str(path) in str(caught.value) and "flat_gate" in str(caught.value)
    del data["flat_gate"]  # older runs: no record, not gated
    path.write_text(json.dumps(data))
    runs = {(run.fold, run.seed_index): run for run in load_inputs(*args).model_runs}
    assert runs[(0, 0)].flat_gate is None


def test_convergence_pools_the_noise_over_the_models_runs(tmp_path: Path) -> None:
    """Fold 0's runs rise steadily; fold 1's jump about: against the model's noise (mostly fold 1's) fold 0's rise
    is within it; alone, fold 0's runs are still moving."""
    outputs = write_pipeline_outputs(tmp_path / "run", models=("ppo",), n_folds=2, n_seeds=3, random_seeds=2)
    for path in outputs.train_logs:
        log = json.loads(Path(path).read_text())
        jumps = np.array([0.0, 1.5, -1.5, 1.5, 0.0]) if log["fold"] == 1 else np.zeros(5)
        curve = 0.1 * np.arange(5) + jumps
        log["validation"] = [{"step": 100 * i, "val_sharpe": v, "elapsed_s": i} for i, v in enumerate(curve)]
        Path(path).write_text(json.dumps(log))
    args = (
        outputs.eval_files,
        outputs.bar_files,
        outputs.hyperopt_files,
        outputs.folds_path,
        outputs.train_logs,
    )
    logs = load_inputs(*args).train_logs
    assert {c.label for c in diagnostics.convergence(logs).runs} == {CONVERGED}
    fold_0 = diagnostics.convergence([log for log in logs if log.fold == 0])
    assert {c.label for c in fold_0.runs} == {STILL_MOVING} and fold_0.label == STILL_MOVING
    assert fold_0.to_record()["converged"] == 0 and fold_0.to_record()["runs"] == 3
