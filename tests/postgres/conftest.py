"""A throwaway PostgreSQL cluster per test session (skipped with the reason where PostgreSQL is missing)."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.postgres import cluster as pg

_names = itertools.count()


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg.Cluster]:
    """A running cluster in a temp dir, stopped and removed at the end of the session."""
    reason = pg.unavailable()
    if reason:
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix="marketrl-pg-"))
    try:
        yield pg.start(directory)
    finally:
        pg.stop(directory)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def database(postgres: pg.Cluster) -> Callable[[], str]:
    """Make a fresh empty database and return its URL (one study per database: tests stay independent)."""
    return lambda: postgres.create_database(f"study_{next(_names)}")
