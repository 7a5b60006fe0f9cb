"""Shared test fixtures: one torch thread (rule 6), the path to the shared real DBN samples, and the hermetic guard
(the session fails if it changed the checkout's own results/ or .snakemake/; tests/hermetic_guard.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.hermetic_guard import pytest_sessionfinish, pytest_sessionstart  # noqa: F401  (pytest hooks)

torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
DBN_SAMPLES = REPO_ROOT.parent / "shared" / "data" / "dbn-samples"


@pytest.fixture(scope="session")
def dbn_samples() -> Path:
    """Real Databento files; skipped with a reason where ../shared is absent (it is in CI and for developers)."""
    if not DBN_SAMPLES.is_dir():
        pytest.skip(f"real DBN samples not found at {DBN_SAMPLES} (../shared is absent)")
    return DBN_SAMPLES
