"""Out-of-sample evaluation of agents and baselines (issue: fan-out).

Not built yet: every entry point fails loudly instead of writing plausible output.
"""

from __future__ import annotations

from typing import Any


def evaluate_job(**kwargs: Any) -> None:
    """Not implemented yet."""
    raise NotImplementedError(
        "marketrl stage 'evaluation' (evaluate_job) is not implemented yet; see the open issues"
    )


def baselines_job(**kwargs: Any) -> None:
    """Not implemented yet."""
    raise NotImplementedError(
        "marketrl stage 'evaluation' (baselines_job) is not implemented yet; see the open issues"
    )
