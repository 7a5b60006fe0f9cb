"""gpu_utils knows nothing of marketrl: no imports of it, no agent/env vocabulary, and it imports without the
data and tuning stacks (the GPU check bench runs it with torch and numpy only)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

PACKAGE = Path(REPO_ROOT) / "gpu_utils"
# Words that would mean gpu_utils has learned about what it trains (identifiers, strings and comments).
DOMAIN_WORDS = re.compile(
    r"\b(marketrl|dqn|ppo|agents?|envs?|environments?|obs|observations?|replay|rollouts?)\b", re.I
)
#: torch's own names that contain one of those words: a CUDA graph's ``replay()``.
TORCH_NAMES = re.compile(r"\.replay\(\)")


def _sources() -> dict[Path, str]:
    files = sorted(PACKAGE.glob("*.py"))
    assert files, f"no sources under {PACKAGE}"
    return {path: path.read_text(encoding="utf-8") for path in files}


def test_gpu_utils_imports_nothing_from_marketrl() -> None:
    offending = []
    for path, source in _sources().items():
        for node in ast.walk(ast.parse(source, filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            offending += [
                f"{path.name}:{node.lineno} {name}" for name in names if name.split(".")[0] == "marketrl"
            ]
    assert offending == []


def test_gpu_utils_has_no_domain_vocabulary() -> None:
    hits = [
        f"{path.name}:{number}: {line.strip()}"
        for path, source in _sources().items()
        for number, line in enumerate(source.splitlines(), start=1)
        if DOMAIN_WORDS.search(TORCH_NAMES.sub("", line))
    ]
    assert hits == []


def test_gpu_utils_imports_with_torch_and_numpy_only() -> None:
    blocked = ["marketrl", "polars", "optuna", "gymnasium", "pandas", "databento"]
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None  # any import of them now fails\n"
        "import gpu_utils, gpu_utils.budget, gpu_utils.metrics, gpu_utils.step, gpu_utils.sync\n"
        "print(len(gpu_utils.__all__))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 10
