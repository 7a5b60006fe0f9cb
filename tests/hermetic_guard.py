"""Pytest plugin: the test session must leave the checkout's own results/ and .snakemake/ exactly as it found them.

Tests run the pipeline in temp directories; a user's `make run` output in the checkout is theirs. At session start
every file and folder under the guarded folders is recorded (path, size, mtime); at the end the session fails,
listing what changed, if anything was created, modified or removed there.

The guarded checkout is this repository; `MARKETRL_GUARDED_ROOT` points the plugin at another folder (only
tests/test_hermetic.py does so, to show that the guard fails a session that writes there).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

GUARDED = ("results", ".snakemake")
ROOT_VARIABLE = "MARKETRL_GUARDED_ROOT"

Snapshot = dict[str, tuple[str, int, int]]


def guarded_root() -> Path:
    """The checkout whose results/ and .snakemake/ the session must not touch."""
    return Path(os.environ.get(ROOT_VARIABLE) or Path(__file__).resolve().parents[1])


def snapshot(root: Path) -> Snapshot:
    """Every file and folder under root's guarded folders, as {relative path: (kind, size, mtime_ns)}."""
    entries: Snapshot = {}
    for name in GUARDED:
        top = root / name
        if not top.exists():
            continue
        for path in [top, *top.rglob("*")]:
            info = path.lstat()
            kind = "dir" if path.is_dir() and not path.is_symlink() else "file"
            # A folder's own mtime changes whenever an entry is added or removed, which the entries show.
            entries[str(path.relative_to(root))] = (
                kind,
                0 if kind == "dir" else info.st_size,
                info.st_mtime_ns,
            )
    return entries


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What differs between two snapshots, one line per path ("created", "removed", "modified")."""
    lines = [f"created  {path}" for path in sorted(after.keys() - before.keys())]
    lines += [f"removed  {path}" for path in sorted(before.keys() - after.keys())]
    lines += [
        f"modified {path}"
        for path in sorted(before.keys() & after.keys())
        if before[path] != after[path] and before[path][0] == "file"
    ]
    return lines


_state: dict[str, object] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    root = guarded_root()
    _state["root"], _state["before"] = root, snapshot(root)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    root = _state.get("root")
    if not isinstance(root, Path):
        return
    found = changes(_state["before"], snapshot(root))  # type: ignore[arg-type]
    if not found:
        return
    shown = "\n  ".join(found[:20]) + (f"\n  ... and {len(found) - 20} more" if len(found) > 20 else "")
    message = (
        f"hermetic guard: the test session changed {root}'s {' / '.join(GUARDED)} (tests must use temp "
        f"directories):\n  {shown}"
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(message, red=True, bold=True)
    else:
        print(message, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
