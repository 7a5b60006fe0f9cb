"""Shared test fixtures: one torch thread (rule 6), the path to the shared real DBN samples, the session's one
finished pipeline run (`shared_run`), and the hermetic guard (the session fails if it changed the checkout's own
results/ or .snakemake/; tests/hermetic_guard.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.hermetic_guard import pytest_sessionfinish, pytest_sessionstart  # noqa: F401  (pytest hooks)

torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
DBN_SAMPLES = REPO_ROOT.parent / "shared" / "data" / "dbn-samples"


@pytest.fixture(scope="session")
def shared_run() -> Path:
    """The session's one finished run of tests/configs/tiny.yaml (tests/faults/pipeline.py:shared_run), for tests
    that only read it. A test that changes it must work on `tests.faults.pipeline.copy_of_shared_run`."""
    from tests.faults.pipeline import shared_run as run

    return run()[0]


@pytest.hookimpl(trylast=True)  # after -k / -m deselected what they do: only a selected test starts the run
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Start the shared run in the background as soon as a selected test needs it: its serial stretches (hyperopt,
    the report) then overlap with the single-threaded unit tests instead of adding to them."""
    if config.option.collectonly:
        return
    if any("shared_run" in getattr(item, "fixturenames", ()) for item in items):
        from tests.faults.pipeline import start_shared_run

        start_shared_run()


@pytest.fixture(scope="session")
def dbn_samples() -> Path:
    """Real Databento files; skipped with a reason where ../shared is absent (it is in CI and for developers)."""
    if not DBN_SAMPLES.is_dir():
        pytest.skip(f"real DBN samples not found at {DBN_SAMPLES} (../shared is absent)")
    return DBN_SAMPLES
