"""The top-level imports of a job script, as a fresh interpreter runs them (test and benchmark support: what
bench/speed/job_imports.py times and tests/test_imports.py runs)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def script_imports(stage: str) -> list[str]:
    """The top-level import statements of workflow_scripts/{stage}.py, without `_checkout`."""
    tree = ast.parse((ROOT / "workflow_scripts" / f"{stage}.py").read_text())
    statements = [ast.unparse(node) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    return [line for line in statements if "_checkout" not in line]
