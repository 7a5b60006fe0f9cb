"""Optuna hyperparameter search (issue: walk-forward folds, hyperopt and fan-out).

Not built yet: every entry point fails loudly instead of writing plausible output.
"""

from __future__ import annotations

from typing import Any


def run_worker(**kwargs: Any) -> None:
    """Not implemented yet."""
    raise NotImplementedError(
        "marketrl stage 'hyperopt' (run_worker) is not implemented yet; see the open issues"
    )


def write_study_summary(**kwargs: Any) -> None:
    """Not implemented yet."""
    raise NotImplementedError(
        "marketrl stage 'hyperopt' (write_study_summary) is not implemented yet; see the open issues"
    )
