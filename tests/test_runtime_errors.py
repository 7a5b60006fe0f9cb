"""Known errors (bad data, bad config) against bugs: the table in marketrl.runtime.errors covers every error class,
and a job script under `job_context` prints one line for a known error, a traceback for a bug, and always logs the
traceback."""

from __future__ import annotations

import ast
import importlib
import os
import re
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


THREADED_JOB = """
import sys
from types import SimpleNamespace

snakemake = SimpleNamespace(threads=1, log=[sys.argv[1]])  # what Snakemake's preamble defines first
sys.path.insert(0, "workflow_scripts")
import _checkout  # noqa: F401  (a job script's first import)
import polars as pl

from marketrl.runtime.jobs import job_context

with job_context(snakemake.log[0], snakemake.threads):
    print(pl.thread_pool_size())
    sum(i * i for i in range(2_000_000))  # some CPU work for the cost line
"""


def test_a_job_caps_polars_at_its_threads_and_logs_its_cost(tmp_path: Path) -> None:
    """The first import of a job script caps polars' pool at the rule's threads (polars reads it when imported, so
    job_context alone would be too late), and the job's log ends with its exact cost."""
    script = tmp_path / "job.py"
    script.write_text(THREADED_JOB)
    log = tmp_path / "job.log"
    env = {key: value for key, value in os.environ.items() if key != "POLARS_MAX_THREADS"}
    result = subprocess.run(
        [sys.executable, str(script), str(log)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1\n"  # this machine has more cores than that
    match = re.search(
        r"job cost: ([\d.]+) s wall since the process started, ([\d.]+) CPU-s, peak RSS (\d+) MB",
        log.read_text(),
    )
    assert match is not None
    wall, cpu, rss = float(match[1]), float(match[2]), int(match[3])
    assert 0 < cpu and 0 < wall < 60 and rss > 10
