"""The self-contained eval_report.html.

Not built yet: the entry point fails loudly instead of writing plausible output.
"""

from __future__ import annotations

from typing import Any


def build_report(**kwargs: Any) -> None:
    """Not implemented yet."""
    raise NotImplementedError(
        "marketrl stage 'report' (build_report) is not implemented yet; see the open issues"
    )
