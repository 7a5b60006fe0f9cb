"""Test-only hold points: let a crash test SIGKILL a job while it is provably inside a given step.

A test sets ``MARKETRL_TEST_HOLD_AFTER`` to a glob pattern of event names and ``MARKETRL_TEST_HOLD_FILE`` to a
marker path. The first process that reaches a matching :func:`hold_point` creates the marker (naming the event and
its pid) and then waits until a file ``<marker>.release`` appears, which in a crash test never happens: the test
waits for the marker and kills the job there. Only that first process holds (the marker exists already for every
later one), so the rest of the run goes on around it. Without the variables (every normal run) a hold point only
reads the environment and returns.

Events (the library's call sites): ``hyperopt_trial_reported:{model}:{trial number}`` (after each validation report
of a trial; the first one reached holds), ``training_checkpoint_saved:{path}`` (a resume checkpoint was written),
``atomic_write_before_rename:{destination}`` (an output's temp file is complete, the rename not yet done).
"""

from __future__ import annotations

import fnmatch
import os
import time
from pathlib import Path

__all__ = ["HOLD_AFTER", "HOLD_FILE", "hold_point", "release_path"]

HOLD_AFTER = "MARKETRL_TEST_HOLD_AFTER"
HOLD_FILE = "MARKETRL_TEST_HOLD_FILE"
_POLL_S = 0.05


def release_path(marker: str | os.PathLike[str]) -> Path:
    """The file whose appearance lets a held process continue."""
    return Path(f"{os.fspath(marker)}.release")


def hold_point(event: str) -> None:
    """Hold here if ``MARKETRL_TEST_HOLD_AFTER`` matches ``event``: write the marker, wait for the release."""
    pattern = os.environ.get(HOLD_AFTER)
    if not pattern or not fnmatch.fnmatchcase(event, pattern):
        return
    marker = os.environ.get(HOLD_FILE)
    if not marker:
        raise RuntimeError(f"{HOLD_AFTER} is set but {HOLD_FILE} (the marker path) is not")
    # Written under a temp name, then hard-linked: the link is atomic and fails if another process holds already.
    partial = Path(f"{marker}.{os.getpid()}.partial")
    partial.write_text(f"{event}\n{os.getpid()}\n", encoding="utf-8")
    try:
        os.link(partial, marker)
    except FileExistsError:
        return
    finally:
        partial.unlink()
    release = release_path(marker)
    while not release.exists():
        time.sleep(_POLL_S)
