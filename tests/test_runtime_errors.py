"""Known errors (bad data, bad config) against bugs: the table in marketrl.runtime.errors covers every error class,
and a job script under `job_context` prints one line for a known error, a traceback for a bug, and always logs the
traceback."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from marketrl.runtime.errors import INTERNAL_ERRORS, KNOWN_ERRORS, is_known_error, one_line
from tests.conftest import REPO_ROOT


def _resolve(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _error_classes() -> list[str]:
    """Dotted names of every class named ``*Error`` defined at module level in marketrl/ and gpu_utils/."""
    names = []
    for package in ("marketrl", "gpu_utils"):
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names += [f"{module}.{node.name}" for node in tree.body if isinstance(node, ast.ClassDef)]
    return [name for name in names if name.endswith("Error")]


@pytest.mark.parametrize("dotted", sorted(KNOWN_ERRORS | INTERNAL_ERRORS))
def test_every_listed_name_is_an_exception_class(dotted: str) -> None:
    cls = _resolve(dotted)
    assert isinstance(cls, type) and issubclass(cls, Exception), dotted
    assert f"{cls.__module__}.{cls.__qualname__}" == dotted  # not a re-export under another name


def test_every_error_class_is_either_known_or_internal() -> None:
    found = _error_classes()
    assert "marketrl.data.checks.DataFileError" in found and "marketrl.settings.config.ConfigError" in found
    unclassified, both = [], []
    for dotted in found:
        cls = _resolve(dotted)
        known = is_known_error(cls.__new__(cls))
        if known and dotted in INTERNAL_ERRORS:
            both.append(dotted)
        elif not known and dotted not in INTERNAL_ERRORS:
            unclassified.append(dotted)
    assert unclassified == [], "add them to KNOWN_ERRORS or INTERNAL_ERRORS in marketrl/runtime/errors.py"
    assert both == []


def test_subclasses_of_a_known_error_are_known() -> None:
    from marketrl.data.reader import DataConfigError, DataFileError

    assert is_known_error(DataConfigError("x.dbn.zst", "no session calendar"))
    assert is_known_error(DataFileError("x.dbn.zst", "empty file"))
    assert not is_known_error(KeyError("bug"))
    assert not is_known_error(ValueError("bug"))


def test_one_line_keeps_the_first_line_with_the_type() -> None:
    assert one_line(ValueError("first\nsecond")) == "ValueError: first"


JOB = """
import sys
from marketrl.runtime.jobs import job_context
from marketrl.settings.config import ConfigError

with job_context(sys.argv[1]):
    def inner():
        raise {error}
    inner()
"""


def _run_job(tmp_path: Path, error: str) -> tuple[subprocess.CompletedProcess[str], str]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB.format(error=error)))
    log = tmp_path / "logs" / "job.log"
    result = subprocess.run(
        [sys.executable, str(script), str(log)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60
    )
    return result, log.read_text(encoding="utf-8")


def test_a_known_error_prints_one_line_and_logs_the_traceback(tmp_path: Path) -> None:
    result, log = _run_job(tmp_path, "ConfigError(\"config key 'folds.n': expected >= 1\\nsecond line\")")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == "marketrl error: ConfigError: config key 'folds.n': expected >= 1\n"
    assert "Traceback (most recent call last)" in log and "in inner" in log
    assert "ConfigError: config key 'folds.n': expected >= 1" in log


def test_a_bug_keeps_its_traceback_on_the_console(tmp_path: Path) -> None:
    result, log = _run_job(tmp_path, "KeyError('missing')")
    assert result.returncode == 1
    assert result.stderr.startswith("marketrl error: KeyError: 'missing'\nTraceback (most recent call last)")
    assert "in inner" in result.stderr
    assert "Traceback (most recent call last)" in log and "in inner" in log
