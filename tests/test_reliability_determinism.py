"""Determinism: two clean runs of the tiny config give byte-identical metrics, identical weights and the same report.

The two runs (tests/faults/pipeline.py) are shared with the crash tests; the second one runs with a sentinel API
key and blocked sockets, neither of which may change a result. Comparing two runs needs two pipeline runs, so those
tests are `slow` (make test-slow); the checks of a single run read the session's shared run (make test).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from marketrl.settings.config import derive_seed
from tests.faults.pipeline import (
    baseline_run,
    differing_tensors,
    fast_counts,
    fast_tiny_config,
    guarded_run,
    metrics_bytes,
    model_tensors,
    normalized_report,
)

slow = pytest.mark.slow


@slow
def test_metrics_json_byte_identical() -> None:
    first, second = metrics_bytes(baseline_run()), metrics_bytes(guarded_run()[0])
    assert len(first) == fast_counts()["metrics"]  # every model's, and each fold's baselines
    assert first.keys() == second.keys()
    assert [path for path in first if first[path] != second[path]] == []


@slow
def test_model_weights_identical() -> None:
    first, second = model_tensors(baseline_run()), model_tensors(guarded_run()[0])
    # dqn: q; ppo: policy and value; per fold
    assert len(first) == 3 * fast_counts()["folds"] and fast_tiny_config()["training"]["models"] == [
        "dqn",
        "ppo",
    ]
    assert differing_tensors(first, second) == []


@slow
def test_hyperopt_chooses_the_same_parameters() -> None:
    for model in ("dqn", "ppo"):
        first, second = (
            json.loads((run / f"results/hyperopt/{model}.json").read_text())
            for run in (baseline_run(), guarded_run()[0])
        )
        assert (first["best_params"], first["best_value"]) == (second["best_params"], second["best_value"])
        assert [t["value"] for t in first["trials"]] == [t["value"] for t in second["trials"]]


@slow
def test_report_differs_only_in_timestamps_and_durations() -> None:
    first, second = (
        (run / "results" / "eval_report.html").read_text(encoding="utf-8")
        for run in (baseline_run(), guarded_run()[0])
    )
    assert normalized_report(first) == normalized_report(second)
    # The masks are narrow: metric and bar file hashes are still compared.
    assert "results/eval/dqn/fold_0/seed_0/metrics.json" in normalized_report(first)


def test_metrics_hold_no_run_specific_values(shared_run: Path) -> None:
    """No wall times, timestamps or absolute paths in the files compared byte for byte."""
    run = shared_run
    assert len(metrics_bytes(run)) == 2 * 2 + 2  # 2 folds x (dqn, ppo) x 1 seed, and each fold's baselines
    for text in (b.decode() for b in metrics_bytes(run).values()):
        assert str(run) not in text and "/tmp/" not in text
        assert not any(key in text for key in ('"wall_s"', '"elapsed', '"started', '"created'))


def test_seeds_derive_from_job_identity(shared_run: Path) -> None:
    seeds = {
        (model, fold, index): derive_seed(11, "train", model, fold, index)
        for model in ("dqn", "ppo")
        for fold in range(3)
        for index in range(3)
    }
    assert len(set(seeds.values())) == len(seeds)  # every job its own seed
    assert derive_seed(12, "train", "dqn", 0, 0) != derive_seed(11, "train", "dqn", 0, 0)
    checked = 0
    for path, raw in metrics_bytes(shared_run).items():
        if path.startswith("baselines"):
            continue
        checked += 1
        metrics = json.loads(raw)
        expected = derive_seed(11, "train", metrics["algo"], metrics["fold"], metrics["seed_index"])
        assert metrics["seed"] == expected
    # Every model's metrics were looked at; derive_seed's values themselves are pinned in tests/test_config.py.
    assert checked == 4


def test_report_normalization_masks_only_timings(shared_run: Path) -> None:
    report = (shared_run / "results" / "eval_report.html").read_text(encoding="utf-8")
    normalized = normalized_report(report)
    slower = report.replace("Generated 20", "Generated 19", 1)
    steps_and_wall = r'<td class="n">(\d\u2009\d{3})</td><td class="n">([^<]*)</td>'  # Steps (thin-space thousands), Wall (s)
    wall_cell = re.search(steps_and_wall, report)
    assert wall_cell is not None
    steps = wall_cell.group(1)
    slower = slower.replace(wall_cell.group(0), f'<td class="n">{steps}</td><td class="n">999.9</td>', 1)
    assert normalized_report(slower) == normalized
    for number in ("NQ.c.0", "2104828805", "results/eval/dqn/fold_0/seed_0/bars.parquet"):
        assert number in report
        assert normalized_report(report.replace(number, number[:-1] + "#", 1)) != normalized
