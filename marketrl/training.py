"""Per-fold, per-seed training jobs (issue: walk-forward folds, hyperopt and fan-out).

Not built yet: every entry point fails loudly instead of writing plausible output.
"""

from __future__ import annotations

from typing import Any


def train_job(**kwargs: Any) -> None:
    """Not implemented yet."""
    raise NotImplementedError(
        "marketrl stage 'training' (train_job) is not implemented yet; see the open issues"
    )
