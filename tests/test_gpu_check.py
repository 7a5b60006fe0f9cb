"""bench/gpu/gpu_check.py --dry: the GPU check's whole code path on the CPU, without polars/optuna/gymnasium/databento.

The GPU machine has torch, numpy, pyarrow and nvidia-ml-py only, so the check must run with the heavy
dependencies unimportable (tests/faults/no_heavy_deps/sitecustomize.py); the unblocked run checks the same
figures in this worktree. Values are checked for what they must be (sync counts added by doubling the step
loop, dtypes inside the step, budget predictions), never for speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCKER = ROOT / "tests" / "faults" / "no_heavy_deps"
SECTIONS = (
    "precision",
    "host_syncs",
    "env",
    "bf16_vs_fp32",
    "utilization",
    "vram",
    "seeds",
    "gae",
    "capture",
    "folds",
)


def run_dry(out: Path, *, blocked: bool) -> tuple[subprocess.CompletedProcess[str], dict]:
    path = [str(BLOCKER)] if blocked else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)]), "OUT": ""}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu" / "gpu_check.py"), "--dry", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=out,
    )
    report_file = out / "gpu_check.json"
    assert report_file.exists(), done.stdout + done.stderr
    return done, json.loads(report_file.read_text())


@pytest.mark.parametrize("blocked", [True, False], ids=["heavy-deps-blocked", "full-env"])
def test_dry_run_reports_every_section(tmp_path: Path, blocked: bool) -> None:
    done, report = run_dry(tmp_path, blocked=blocked)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sections = report["sections"]
    assert tuple(sections) == SECTIONS
    assert report["dry"] is True and report["device"] == "cpu"
    assert (tmp_path / "gpu_check.md").read_text().count("\n") == len(SECTIONS) + 2
    for name, section in sections.items():
        assert section["status"] == "ok" or section["status"].startswith("skipped: no CUDA"), (name, section)

    precision = sections["precision"]
    assert precision["plan"]["mode"] == "fp32" and precision["target_met"] is True
    assert precision["optim_step"]["bf16"]["linear_output_dtypes"] == {"bfloat16": 2}
    for algo in ("dqn", "ppo"):
        assert set(precision["trainers"]["auto"][algo]["linear_output_dtypes"]) == {"float32"}
        assert set(precision["trainers"]["bf16"][algo]["linear_output_dtypes"]) == {"bfloat16"}
        assert precision["trainers"]["bf16"][algo]["loss_dtype"] == "float32"

    syncs = sections["host_syncs"]
    assert syncs["status"].startswith("skipped: no CUDA") and syncs["target_met"] is True
    for algo in ("dqn", "ppo"):
        short, long = syncs[algo]["short"], syncs[algo]["long"]
        assert long["env_steps"] == 2 * short["env_steps"]
        assert short["sync_counter"] == long["sync_counter"] > 0  # the periodic checks, and only those
        assert syncs[algo]["sync_counter_added_by_doubling"] == 0
        assert short["cuda_sync_warnings"] == "skipped: no CUDA"

    env = sections["env"]["results"]
    assert [row["n_envs"] for row in env] == report["sizes"]["env_ns"]
    assert all(row["steps_per_second"] > 0 for row in env)

    for algo in ("dqn", "ppo"):
        speed = sections["bf16_vs_fp32"][algo]
        assert (speed["fp32"]["precision"], speed["bf16"]["precision"]) == ("fp32", "bf16")
        assert speed["bf16_over_fp32"] > 0

    utilization = sections["utilization"]
    assert utilization["status"].startswith("skipped: no CUDA") and utilization["target_met"] is None
    assert utilization["ppo"]["samples"] > 0 and utilization["ppo"]["cpu_util"]["mean"] > 0

    vram = sections["vram"]
    low, high = vram["bounds"]
    assert 0 < low <= high <= vram["memory_bound_batch"]
    assert vram["overshoot_batch"] == int(vram["memory_bound_batch"] * 1.5)
    assert vram["overshoot_predicted_to_fit"] is False

    gae = sections["gae"]
    assert [row["columns"] for row in gae["rows"]] == report["sizes"]["gae_columns"]
    assert all(row["host_ms"] > 0 and row["device_ms"] > 0 for row in gae["rows"])
    assert gae["rule_columns"] > 0

    for algo in ("ppo", "dqn"):
        capture = sections["capture"][algo]
        assert capture["eager"]["captured"] is False and capture["captured"]["captured"] is False  # the CPU
        assert capture["max_weight_difference"] == 0.0  # the capture flag changes nothing on the CPU
        folds = sections["folds"][algo]
        assert folds["folds_by_memory"] == report["sizes"]["folds"]  # the dry run's folds fit in RAM
        assert folds["folds_batched"]["copies"] == report["sizes"]["folds"] * report["sizes"]["capture_seeds"]
        assert folds["batched_over_one_fold"] > 0
