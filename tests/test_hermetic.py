"""The hermetic guard (tests/hermetic_guard.py) is active, and fails a session that touches results/ or .snakemake/."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import hermetic_guard
from tests.conftest import REPO_ROOT


def _inner_session(tmp_path: Path, guarded: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run one test (`body`, given `guarded` as a Path) in a separate pytest session with the guard on `guarded`."""
    test_file = tmp_path / "inner" / "test_inner.py"
    test_file.parent.mkdir()
    test_file.write_text(
        "from pathlib import Path\n\n\ndef test_inner():\n"
        f"    guarded = Path({str(guarded)!r})\n" + textwrap.indent(textwrap.dedent(body), "    ")
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), hermetic_guard.ROOT_VARIABLE: str(guarded)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.hermetic_guard",
            "-p",
            "no:cacheprovider",
            str(test_file),
        ],
        cwd=tmp_path / "inner",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A stand-in checkout with the output of an earlier `make run`."""
    root = tmp_path / "checkout"
    (root / "results" / "eval").mkdir(parents=True)
    (root / "results" / "eval" / "metrics.json").write_text("{}\n")
    (root / ".snakemake" / "metadata").mkdir(parents=True)
    return root


def test_guard_is_active_in_this_session(request: pytest.FixtureRequest) -> None:
    impls = request.config.pluginmanager.hook.pytest_sessionfinish.get_hookimpls()
    assert hermetic_guard.pytest_sessionfinish in [impl.function for impl in impls]
    assert hermetic_guard._state.get("root") == REPO_ROOT  # snapshot taken at this session's start


@pytest.mark.parametrize(
    ("body", "change"),
    [
        ("(guarded / 'results' / 'folds.json').write_text('{}')\n", "created  results/folds.json"),
        (
            "(guarded / 'results' / 'eval' / 'metrics.json').write_text('{\"x\": 1}\\n')\n",
            "modified results/eval",
        ),
        ("(guarded / 'results' / 'eval' / 'metrics.json').unlink()\n", "removed  results/eval/metrics.json"),
        ("(guarded / '.snakemake' / 'locks').mkdir()\n", "created  .snakemake/locks"),
    ],
)
def test_guard_fails_a_session_that_touches_the_checkout(
    tmp_path: Path, checkout: Path, body: str, change: str
) -> None:
    result = _inner_session(tmp_path, checkout, body)
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "1 passed" in output  # the test itself passed; the guard failed the session
    assert "hermetic guard" in output and change in output


def test_guard_passes_a_session_that_uses_temp_dirs(tmp_path: Path, checkout: Path) -> None:
    body = "(guarded / 'results' / 'eval' / 'metrics.json').read_text()\n"
    result = _inner_session(tmp_path, checkout, body)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hermetic guard" not in result.stdout + result.stderr


def test_snapshot_sees_size_and_mtime_changes(checkout: Path) -> None:
    before = hermetic_guard.snapshot(checkout)
    target = checkout / "results" / "eval" / "metrics.json"
    stat = target.stat()
    target.write_text("{}\n")  # same size
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert hermetic_guard.changes(before, hermetic_guard.snapshot(checkout)) == [
        "modified results/eval/metrics.json"
    ]
