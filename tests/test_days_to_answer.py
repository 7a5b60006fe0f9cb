"""How many days would answer (marketrl.verdict.days): the projection's arithmetic, the projection against the
family's own bootstrap on simulated returns at two day counts, and the report's table and verdict.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from marketrl.calendars.annual import ANNUALIZER
from marketrl.report import build_report
from marketrl.verdict.days import EDGES, days_to_answer
from marketrl.verdict.strategies import VerdictRules
from marketrl.verdict.verdicts import family_result
from tests.report_fixtures import write_pipeline_outputs

RULES = VerdictRules(n_boot=500, min_test_days=8, min_seeds=5)
SD = 0.01  # daily return spread of every simulated column
MODEL_A, MODEL_B, BASELINES = [0, 1, 2], [3, 4, 5], [6, 7]


def test_an_edge_half_the_detectable_one_needs_four_times_the_days() -> None:
    rows = days_to_answer(detectable=6.0, one_comparison=3.0, n_days=60, test_days_per_fold=20, edges=EDGES)
    by_edge = {row.edge: row for row in rows}
    assert by_edge[3.0].days == 240 and by_edge[3.0].folds == 12  # (6 / 3)^2 x 60
    assert by_edge[2.0].days == 540 and by_edge[1.0].days == 2160
    assert by_edge[3.0].one_comparison_days == 60 and by_edge[1.0].one_comparison_days == 540
    (same,) = days_to_answer(6.0, 3.0, 60, 20, edges=[6.0])
    assert same.days == 60 and same.folds == 3  # the run's own figure needs the run's own days
    (undefined,) = days_to_answer(math.nan, 3.0, 60, 20, edges=[1.0])
    assert undefined.days is None and undefined.folds is None and undefined.one_comparison_days == 540


def _weights(columns: list[int], minus: int | None = None) -> np.ndarray:
    row = np.zeros(8)
    row[columns] = 1.0 / len(columns)
    if minus is not None:
        row[minus] -= 1.0
    return row


def _family(matrix: np.ndarray, seed: int):
    pairs = [_weights(model, b) for model in (MODEL_A, MODEL_B) for b in BASELINES]
    return family_result(matrix, [_weights(MODEL_A), _weights(MODEL_B)], pairs, [[0, 1], [2, 3]], RULES, seed)


def _headline(n_days: int, replicate: int) -> float:
    """The run's figure (largest over the models, annualised) on a simulated run without any edge."""
    matrix = np.random.default_rng(1000 * n_days + replicate).normal(0.0, SD, (n_days, 8))
    return float(np.nanmax(_family(matrix, replicate).detectable)) * ANNUALIZER


def _power(n_days: int, edge: float, runs: int = 120) -> float:
    """How often the primary claim finds model A (every seed `edge` above both baselines) beating every one."""
    hits = 0
    for replicate in range(runs):
        matrix = np.random.default_rng(7_000_000 + replicate).normal(0.0, SD, (n_days, 8))
        matrix[:, MODEL_A] += edge / ANNUALIZER * SD
        hits += bool(_family(matrix, replicate).primary.reject[0])
    return hits / runs


def test_the_projection_holds_against_the_familys_own_bootstrap_at_two_day_counts() -> None:
    # the figure measured on 40 days, projected to 160: half as large (sqrt(40 / 160))
    measured_40 = float(np.mean([_headline(40, r) for r in range(6)]))
    measured_160 = float(np.mean([_headline(160, r) for r in range(6)]))
    projected_160 = measured_40 * math.sqrt(40 / 160)
    assert measured_160 == pytest.approx(projected_160, rel=0.12)
    # the edge that projection says 160 days detect with 80% power: detected about that often there (the
    # projection holds c at the 40-day run's, slightly larger, so it errs towards more days), and far less
    # often on a quarter of the days
    (row,) = days_to_answer(measured_40, math.nan, 40, 20, edges=[projected_160])
    assert row.days == 160
    assert 0.75 <= _power(160, projected_160) <= 0.97
    assert _power(40, projected_160) < 0.5


def test_the_report_and_verdict_json_carry_the_days_to_answer(tmp_path: Path) -> None:
    outputs = write_pipeline_outputs(tmp_path / "run", models=("dqn", "linear"), n_folds=2, n_seeds=5, seed=4)
    verdict = tmp_path / "verdict.json"
    build_report(**outputs.report_kwargs(tmp_path / "eval_report.html"), verdict_path=str(verdict))
    record = json.loads(verdict.read_text(encoding="utf-8"))
    rows = record["days_to_answer"]
    assert [row["edge"] for row in rows] == list(EDGES)
    detectable, n_days = record["detectable_sharpe_difference"], record["pooled_test_days"]
    for row in rows:
        assert row["days"] == math.ceil(n_days * (detectable / row["edge"]) ** 2 - 1e-9)
    html = (tmp_path / "eval_report.html").read_text(encoding="utf-8")
    assert 'id="days-to-answer-table"' in html
    assert f'data-edge="1.0" data-days="{rows[0]["days"]}"' in html
