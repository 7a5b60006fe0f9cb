"""bench/models.py --quick: every zoo model runs through its real train call and its floor in one process.

Checks what the figures must be, never their speed: every registered model is reported, the torch models read
the host once per `check_every` steps (and the floor never), the sample counts follow from steps × batch, and
the script's own parity checks (floor module = trainer's module, LightGBM floor = trained booster, ridge floor
= fitted weights) pass, or it exits non-zero.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.models import parse_args
from marketrl.features import CATALOG
from marketrl.models import MODELS

ROOT = Path(__file__).resolve().parent.parent


def test_quick_run_reports_every_model(tmp_path: Path) -> None:
    out = tmp_path / "models.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "models.py"), "--quick", "--clock", "cpu", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    args = report["args"]
    assert (args["steps"], args["check_every"], args["rounds"], args["repeats"]) == (10, 5, 10, 1)
    assert report["features"] == len(CATALOG)
    results = {r["model"]: r for r in report["results"]}
    assert list(results) == list(MODELS)
    for name, r in results.items():
        assert len(r["model_s"]) == len(r["floor_s"]) == 1, name
        assert r["model_samples_per_s"] > 0 and r["floor_samples_per_s"] > 0, name
        assert math.isfinite(r["model_over_floor"]) and r["model_over_floor"] > 0, name
        if MODELS[name].neural:
            assert r["steps"] == 10 and r["samples"] == 10 * r["batch"], name
            assert r["model_syncs"] == 2 and r["floor_syncs"] == 0, name  # one read per check_every steps
            # the cpu clock has no loop figure (the trainer's own rate is wall-clock)
            assert r["loop_s"] == [] and r["loop_over_floor"] is None, name
        else:
            assert r["model_syncs"] is None and r["floor_syncs"] is None, name
    assert results["lightgbm"]["samples"] == 10 * results["lightgbm"]["train_rows"]
    assert results["linear"]["samples"] == results["linear"]["train_rows"] > 0
    assert done.stdout.count("\n| ") == len(MODELS) + 1  # the markdown table: header and one row per model


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps: expected an integer >= 1, got 0"),
        (["--check-every", "-1"], "--check-every: expected an integer >= 1, got -1"),
        (["--only", "xgboost"], "invalid choice: 'xgboost'"),
    ],
)
def test_bad_arguments_fail_in_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_quick_and_full_defaults() -> None:
    quick, full = parse_args(["--quick"]), parse_args([])
    assert (quick.days, quick.steps, quick.rounds, quick.repeats) == (2, 10, 10, 1)
    assert (full.days, full.steps, full.rounds, full.check_every, full.repeats) == (20, 200, 100, 50, 3)
    assert parse_args(["--quick", "--steps", "4"]).steps == 4  # an explicit value beats the mode's default
