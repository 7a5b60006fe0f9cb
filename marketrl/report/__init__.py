"""The self-contained eval_report.html: statistics over the fan-out's outputs, rendered offline (docs/REPORT.md)."""

from __future__ import annotations

from marketrl.report.build import SECTIONS, build_report
from marketrl.verdict.inputs import ReportInputError

__all__ = ["SECTIONS", "ReportInputError", "build_report"]
