"""The test-only hold point that crash tests use to SIGKILL a job inside a given step (marketrl.runtime.testing_hooks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marketrl.runtime.testing_hooks import HOLD_AFTER, HOLD_FILE, hold_point, release_path
from tests.conftest import REPO_ROOT

HOLDER = "import sys; from marketrl.runtime.testing_hooks import hold_point; hold_point(sys.argv[1])"


def _holder(event: str, pattern: str, marker: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), HOLD_AFTER: pattern, HOLD_FILE: str(marker)}
    return subprocess.Popen([sys.executable, "-c", HOLDER, event], env=env)


def _wait_for_file(path: Path, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"the holder exited ({process.returncode}) before writing {path}"
        assert time.monotonic() < deadline, f"no {path} after {timeout:.0f}s"
        time.sleep(0.02)


def test_without_the_variables_a_hold_point_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HOLD_AFTER, raising=False)
    monkeypatch.setenv(HOLD_FILE, str(tmp_path / "marker"))
    hold_point("training_checkpoint_saved:results/models/dqn/fold_0/seed_0/resume.pt")
    assert list(tmp_path.iterdir()) == []


def test_a_non_matching_event_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOLD_AFTER, "hyperopt_trial_reported:dqn:1")
    monkeypatch.setenv(HOLD_FILE, str(tmp_path / "marker"))
    hold_point("hyperopt_trial_reported:dqn:0")
    hold_point("hyperopt_trial_reported:ppo:1")
    assert list(tmp_path.iterdir()) == []


def test_a_pattern_without_marker_path_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOLD_AFTER, "*")
    monkeypatch.delenv(HOLD_FILE, raising=False)
    with pytest.raises(RuntimeError, match=HOLD_FILE):
        hold_point("anything")


def test_first_matching_process_holds_until_released_later_ones_pass(tmp_path: Path) -> None:
    marker = tmp_path / "held"
    pattern = "atomic_write_before_rename:*/features/*.parquet"
    first = _holder("atomic_write_before_rename:results/features/a.parquet", pattern, marker)
    try:
        _wait_for_file(marker, first)
        event, pid = marker.read_text().splitlines()
        assert event == "atomic_write_before_rename:results/features/a.parquet" and int(pid) == first.pid
        # A second process reaching a matching point goes on: only one job of a run is held.
        second = _holder("atomic_write_before_rename:results/features/b.parquet", pattern, marker)
        assert second.wait(60) == 0
        assert first.poll() is None  # still held: no release file yet
        release_path(marker).touch()
        assert first.wait(60) == 0
    finally:
        first.kill()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held", "held.release"]  # no partial marker left
