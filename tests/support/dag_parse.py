"""The config checks Snakemake runs when it parses the workflow, run in this process instead of in `snakemake -n`.

`rules/common.smk` opens with a block that validates the config, merges data.definitions, checks contract specs
and resolves the input files; a bad config prints one `marketrl config error: ...` line and exits 1 before any job.
`dag_parse(config)` executes that same block, read from the file (not a copy of it), with `config` as Snakemake
would pass it, so a test of a config error costs milliseconds instead of a Snakemake start-up (~2 s of CPU).
tests/test_workflow.py keeps one real `snakemake` run of the one-line form.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import REPO_ROOT

COMMON_SMK = REPO_ROOT / "rules" / "common.smk"
# The parse-time block ends with the line that stops Snakemake on a config error.
END_OF_CHECKS = "    sys.exit(1)\n"


def parse_time_block(path: Path = COMMON_SMK) -> str:
    """The head of rules/common.smk up to the config-error exit: plain Python (imports, try/except)."""
    text = path.read_text(encoding="utf-8")
    if END_OF_CHECKS not in text:
        raise AssertionError(
            f"{path}: no '{END_OF_CHECKS.strip()}' line; tests/support/dag_parse.py needs updating"
        )
    return text[: text.index(END_OF_CHECKS) + len(END_OF_CHECKS)]


@dataclass
class ParseResult:
    """What the parse-time block did: its exit status (None: it went on to the rules), stderr and namespace."""

    status: int | None
    stderr: str
    namespace: dict[str, Any] = field(repr=False)

    @property
    def config(self) -> dict[str, Any]:
        """The config after validation and the definitions merge (what the rules read)."""
        return self.namespace["config"]

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("marketrl config error: ")]


def dag_parse(config: Mapping[str, Any]) -> ParseResult:
    """Run rules/common.smk's parse-time checks on `config` (the config.yaml mapping), capturing stderr."""
    namespace: dict[str, Any] = {"__name__": "common_smk", "config": copy.deepcopy(dict(config))}
    stderr = io.StringIO()
    status: int | None = None
    code = compile(parse_time_block(), str(COMMON_SMK), "exec")
    with contextlib.redirect_stderr(stderr):
        try:
            exec(code, namespace)  # the workflow's own file
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
    return ParseResult(status, stderr.getvalue(), namespace)
