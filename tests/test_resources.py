"""Memory requests of the rules (marketrl.workflow.resources, rules/common.smk): monotone in the window, bounded
by the training-window cap, covering the measured peaks, and declared by every rule."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import pytest

from marketrl.settings.registry import MODEL_NAMES
from marketrl.splits.folds import FoldConfig, make_fold_plan
from marketrl.workflow import pipeline, resources
from marketrl.workflow.resources import (
    MEMORY_MODELS,
    flattened_window,
    memory_model,
    model_mem_mb,
    train_mem_mb,
    window_cells,
)
from tests.conftest import REPO_ROOT

# Measured peak RSS (MB) of train jobs, docs/PERFORMANCE.md "Bounded memory": the 500-day demo's first fold and
# each model's largest (training.seeds 5, 51 features; LightGBM's tuned window 1, its rows capped at 250,000) and
# one LightGBM job at window 8: (model, cells, matrix cells, max_rss_mb). Cells: the window's rows x features;
# matrix cells: LightGBM's sampled rows x features x window. The model must cover each with its headroom and stay
# near it.
MEASURED: list[tuple[str, int, int, float]] = [
    ("dqn", 14_342_271, 0, 882.86),  # fold 0
    ("dqn", 35_596_368, 0, 1511.50),  # fold 13
    ("ppo", 14_342_271, 0, 859.83),
    ("ppo", 35_654_814, 0, 1556.51),
    ("linear", 14_342_271, 0, 791.90),
    ("linear", 35_655_936, 0, 1663.11),
    ("lightgbm", 14_342_271, 12_750_000, 930.40),
    ("lightgbm", 35_656_089, 12_750_000, 1609.88),
    ("lightgbm", 35_561_178, 102_000_000, 2399.00),  # fold 19 at window 8
    ("mlp", 14_342_271, 0, 925.47),
    ("mlp", 35_654_406, 0, 1638.02),
    ("gru", 14_342_271, 0, 933.67),
    ("gru", 35_706_069, 0, 1740.85),
    ("alstm", 35_706_069, 0, 1666.23),
    ("lstm", 35_561_178, 0, 1656.32),
    ("tcn", 14_342_271, 0, 826.05),
    ("tcn", 34_182_291, 0, 1624.61),
    ("transformer", 14_342_271, 0, 844.52),
    ("transformer", 35_656_038, 0, 1601.96),
    ("dlinear", 14_342_271, 0, 983.87),
    ("dlinear", 35_561_178, 0, 1638.45),
]
SEEDS = {"training": {"seeds": 5}, "hyperopt": {"seeds_per_trial": 1}}
# DQN at training.seeds 1 and 5 (fold 0 of a 150-day demo, 30 days): (model, cells, seeds, max_rss_mb).
MEASURED_SEEDS: list[tuple[str, int, int, float]] = [
    ("dqn", 4_204_644, 1, 510.43),
    ("dqn", 4_204_644, 5, 588.89),
]


@pytest.mark.parametrize("kind", sorted(MEMORY_MODELS))
def test_requests_grow_with_the_window_and_cover_the_estimate(kind: str) -> None:
    model = MEMORY_MODELS[kind]
    cells = [0, 10**5, 10**6, 10**7, 5 * 10**7, 10**8, 10**9]
    requests = [model.request_mb(c) for c in cells]
    assert requests == sorted(requests) and requests[0] < requests[-1]
    for c, request in zip(cells, requests, strict=True):
        assert (
            model.estimate_mb(c) * resources.HEADROOM
            <= request
            < model.estimate_mb(c) * resources.HEADROOM + 100
        )
        assert request % 100 == 0
    assert model.base_mb > 0 and model.mb_per_mcell > 0


def test_every_registered_model_has_a_model_and_an_unknown_one_the_largest() -> None:
    largest = max(m.request_mb(10**8) for m in MEMORY_MODELS.values())
    for name in MODEL_NAMES:
        assert memory_model(name) in MEMORY_MODELS.values()
    assert memory_model("not_registered").request_mb(10**8) == largest
    assert memory_model("linear") is MEMORY_MODELS["linear"]
    assert memory_model("dqn") is MEMORY_MODELS["agent"] and memory_model("ppo") is MEMORY_MODELS["agent"]
    assert memory_model("lightgbm") is MEMORY_MODELS["boosted"]
    assert memory_model("mlp") is MEMORY_MODELS["forecaster"]


@pytest.mark.parametrize(("model", "cells", "matrix", "max_rss_mb"), MEASURED)
def test_requests_cover_every_measured_peak(model: str, cells: int, matrix: int, max_rss_mb: float) -> None:
    _covers(model, cells, 5, max_rss_mb, matrix)


@pytest.mark.parametrize(("model", "cells", "seeds", "max_rss_mb"), MEASURED_SEEDS)
def test_requests_follow_the_seeds(model: str, cells: int, seeds: int, max_rss_mb: float) -> None:
    _covers(model, cells, seeds, max_rss_mb)
    assert model_mem_mb(model, cells, seeds=seeds) <= model_mem_mb(model, cells, seeds=seeds + 4)
    assert model_mem_mb("linear", cells, seeds=1) == model_mem_mb("linear", cells, seeds=5)  # one run


def _covers(model: str, cells: int, seeds: int, max_rss_mb: float, matrix: int = 0) -> None:
    assert model_mem_mb(model, cells, matrix, seeds=seeds) >= max_rss_mb
    # and is not far above it: the request is what the scheduler packs jobs by
    assert memory_model(model).estimate_mb(cells, seeds, matrix) == pytest.approx(max_rss_mb, rel=0.2)


def _write_inputs(root: Path, n_days: int, cap: int | None, rows_per_day: int = 1000) -> tuple[Path, Path]:
    """A manifest of one table per trading day and a 3-fold expanding plan over `n_days` days."""
    days = [date(2020, 1, 1) + timedelta(days=i) for i in range(n_days)]
    manifest = {
        "n_features": 50,
        "files": [
            {
                "path": f"t{i}.parquet",
                "rows": rows_per_day,
                "first_day": d.isoformat(),
                "last_day": d.isoformat(),
            }
            for i, d in enumerate(days)
        ],
    }
    cfg = FoldConfig(
        n=3, scheme="expanding", train_days=10, test_days=20, validation_days=2, embargo_bars=30,
        tuning_days=10, tuning_validation_days=4, max_train_days=cap,
    )  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps(manifest))
    make_fold_plan(days, cfg).save(root / "folds.json")
    return root / "manifest.json", root / "folds.json"


def test_window_cells_count_the_windows_rows_times_features(tmp_path: Path) -> None:
    manifest, folds = _write_inputs(tmp_path, n_days=100, cap=None)
    # folds test the last 60 days: fold 0 trains on 40 days, fold 2 on 80
    assert window_cells(manifest, folds, "train", 0) == 40 * 1000 * 50
    assert window_cells(manifest, folds, "train", 2) == 80 * 1000 * 50
    assert window_cells(manifest, folds, "tuning", None) == 10 * 1000 * 50
    assert window_cells(manifest, folds, "tuning", 2) == 10 * 1000 * 50
    # a table spanning two days counts by its share of the window
    data = json.loads(manifest.read_text())
    data["files"][0]["last_day"] = data["files"][1]["first_day"]
    data["files"][0]["rows"] = 2000
    del data["files"][1]
    manifest.write_text(json.dumps(data))
    assert window_cells(manifest, folds, "train", 0) == 40 * 1000 * 50
    assert window_cells(tmp_path / "missing.json", folds, "train", 0) is None


def test_the_cap_bounds_the_request_whatever_the_history(tmp_path: Path) -> None:
    config = {
        "folds": {"max_train_days": 250, "tuning_days": 10},
        "data": {"source": "files", "demo": {}},
        **SEEDS,
    }
    capped, uncapped = [], []
    for years in (2, 5, 10):
        n_days = 252 * years
        capped.append(
            train_mem_mb(config, "lightgbm", 2, *_write_inputs(tmp_path / f"c{years}", n_days, 250))
        )
        uncapped.append(
            train_mem_mb(config, "lightgbm", 2, *_write_inputs(tmp_path / f"u{years}", n_days, None))
        )
    # no hyperparameters yet: LightGBM's largest window (8) flattens each cell 8 times
    window_cells = 250 * 1000 * 50
    assert capped[0] == capped[1] == capped[2] == model_mem_mb("lightgbm", window_cells, window_cells * 8)
    assert uncapped[0] < uncapped[1] < uncapped[2]
    assert capped[2] < uncapped[2]


def test_the_row_cap_bounds_lightgbms_matrix_and_only_its(tmp_path: Path) -> None:
    """training.max_train_rows caps the rows of LightGBM's flattened matrix; the table every model reads (and
    the other models' whole request) follows the window whatever the cap."""
    config = {"folds": {"max_train_days": None}, "data": {"source": "files", "demo": {}}, **SEEDS}
    capped = {**config, "training": {**SEEDS["training"], "max_train_rows": 30_000}}
    manifest, folds = _write_inputs(
        tmp_path / "w", n_days=100, cap=None
    )  # fold 0: 40,000 rows, fold 2: 80,000
    assert resources.matrix_cells("lightgbm", 80_000, 50, 8, 30_000) == 30_000 * 50 * 8
    assert resources.matrix_cells("lightgbm", 20_000, 50, 8, 30_000) == 20_000 * 50 * 8
    assert resources.matrix_cells("lightgbm", 80_000, 50, 8, None) == 80_000 * 50 * 8
    for model in ("dqn", "mlp", "linear"):
        assert resources.matrix_cells(model, 80_000, 50, 8, 30_000) == 0
        assert train_mem_mb(capped, model, 2, manifest, folds) == train_mem_mb(
            config, model, 2, manifest, folds
        )
    for fold, rows in ((0, 40_000), (2, 80_000)):
        assert train_mem_mb(capped, "lightgbm", fold, manifest, folds) == model_mem_mb(
            "lightgbm", rows * 50, 30_000 * 50 * 8
        )
    assert train_mem_mb(capped, "lightgbm", 2, manifest, folds) < train_mem_mb(
        config, "lightgbm", 2, manifest, folds
    )


def test_flattening_models_count_their_window(tmp_path: Path) -> None:
    hparams = tmp_path / "lightgbm.json"
    hparams.write_text(json.dumps({"best_params": {"window": 3, "num_leaves": 8}}))
    assert flattened_window("lightgbm", hparams) == 3
    assert flattened_window("lightgbm", tmp_path / "missing.json") == 8
    assert flattened_window("linear", None) == 1  # ridge sums its normal equations chunk by chunk: no matrix
    assert flattened_window("dqn", hparams) == flattened_window("mlp", hparams) == 1
    manifest, folds = _write_inputs(tmp_path / "w", n_days=100, cap=None)
    config = {"folds": {"max_train_days": None}, "data": {"source": "files", "demo": {}}, **SEEDS}
    assert train_mem_mb(config, "lightgbm", 0, manifest, folds, hparams) == model_mem_mb(
        "lightgbm", 40 * 1000 * 50, 40 * 1000 * 50 * 3
    )
    assert train_mem_mb(config, "lightgbm", 0, manifest, folds, hparams) < train_mem_mb(
        config, "lightgbm", 0, manifest, folds
    )


def test_a_request_never_exceeds_the_limit_snakemake_was_given() -> None:
    assert resources.within_limit(15100, None) == 15100
    assert resources.within_limit(15100, 12000) == 12000  # runs alone rather than failing the run
    assert resources.within_limit(900, 12000) == 900


def test_before_the_inputs_exist_the_request_is_the_configs_longest_window(tmp_path: Path) -> None:
    config = {
        **SEEDS,
        "folds": {"max_train_days": 250, "tuning_days": 12},
        "data": {"source": "demo", "demo": {"days": 72}},
    }
    request = train_mem_mb(config, "dqn", 0, tmp_path / "manifest.json", tmp_path / "folds.json")
    days = 72  # the demo's whole history, below the cap
    assert request == model_mem_mb("dqn", days * resources.DEFAULT_ROWS_PER_DAY * resources.DEFAULT_FEATURES)
    config["data"] = {"source": "files", "demo": {}}
    longer = train_mem_mb(config, "dqn", 0, tmp_path / "manifest.json", tmp_path / "folds.json")
    assert longer == model_mem_mb("dqn", 250 * resources.DEFAULT_ROWS_PER_DAY * resources.DEFAULT_FEATURES)


def test_every_rule_declares_mem_mb(tmp_path: Path) -> None:
    """Every rule that runs a job declares resources mem_mb (the fixed ones by name from FIXED_MB), as Snakemake
    itself parses the workflow: a dry run of the whole DAG, calibration and predict included, prints it per job."""
    names = set()
    for path in (REPO_ROOT / "rules").glob("*.smk"):
        names |= set(re.findall(r"^rule (\w+):", path.read_text(), re.MULTILINE))
    for name in names - {"train", "train_folds", "hyperopt_worker"}:
        assert name in resources.FIXED_MB, name
    (tmp_path / "config.yaml").write_text((REPO_ROOT / "config.yaml").read_text())
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO_ROOT / "Snakefile"), "-n", "--cores", "2",
         "results/eval_report.html", "results/calibration/calibration.html"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = re.findall(r"^rule (\w+):\n((?:    .*\n)+)", result.stdout, re.MULTILINE)
    # a features batch's rule is features_<batch> (rules/features.smk)
    assert {pipeline.rule_stage(rule) for rule, _ in jobs} >= {
        "demo_data",
        "features",
        "folds",
        "train",
        "evaluate",
        "report",
    }
    for rule, block in jobs:
        match = re.search(r"mem_mb=(\d+)", block)
        assert match and int(match.group(1)) >= 500, (rule, block)
