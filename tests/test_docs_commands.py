"""Every `snakemake` command that README.md and docs/*.md show works as written: it plans successfully (`-n`).

Commands are found by parsing, so a new doc or a new example is covered without touching this file: every line of
a fenced shell block (bash, sh, shell, console), every `snakemake ...` line of any other fenced block, and every
inline code span that starts with a Snakemake program. Each one dry-runs in a temp copy of the checkout (never in
its own results/), with a placeholder for a config file the example names but the checkout lacks (`my.yaml`).
Commands of other programs in shell blocks must be listed in `EXEMPT_PROGRAMS` with the reason they are not run;
an unlisted one fails, so a new kind of example is looked at rather than skipped. The dry-runs are `slow` (one
Snakemake start-up each: make test-slow); the parser and the classification of every command run in make test.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

DOCS = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
TINY = REPO_ROOT / "tests" / "configs" / "tiny.yaml"
# Not copied into the temp checkout: what .gitignore lists, and git's own data.
NOT_COPIED = (".git", ".venv", "results", ".snakemake", "__pycache__", "*.pyc", "*.egg-info", ".pytest_cache",
              ".ruff_cache", ".hypothesis", "build")  # fmt: skip

EXEMPT_PROGRAMS = {
    "make": "sets up .venv and runs the pipeline or the whole suite; `make test` is this suite's own entry point",
    "pip": "installs packages into an environment; never run by the tests",
    ".venv/bin/pip": "installs packages into the shared .venv; never run by the tests",
    "tail": "follows a log file of a running job; nothing to plan",
    "cp": "copies a profile for the user to edit; nothing to plan",
    "psql": "creates the user's database on their PostgreSQL server; tests/postgres starts its own throwaway one",
    "echo": "writes the user's ~/.pgpass; a secret stays out of the tests",
    "export": "sets MARKETRL_OPTUNA_STORAGE in the user's shell; tests/postgres sets it per test",
}
# Snakemake commands that cannot be dry-run here, keyed by a piece of the command that identifies them.
EXEMPT_SNAKEMAKE = {
    "--sdm conda": "builds the conda environments from envs/: needs conda, which the test set-up does not install",
}
# Commands that need an optional extra: dry-run where it is installed (`.ci/run` installs it), skipped elsewhere.
NEEDS_MODULE = {
    "profiles/slurm": "snakemake_executor_plugin_slurm"
}  # the `slurm` extra; a dry run needs no cluster
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


@dataclass(frozen=True)
class DocCommand:
    """A command shown in the docs: where it is (file:line), its text, and whether it sits in a shell block."""

    where: str
    text: str
    in_shell_block: bool

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)


def snakemake_args(argv: list[str]) -> list[str] | None:
    """The arguments after the Snakemake program (`snakemake`, `.venv/bin/snakemake`, `python -m snakemake`)."""
    if argv and Path(argv[0]).name == "snakemake":
        return argv[1:]
    if len(argv) >= 3 and Path(argv[0]).name.startswith("python") and argv[1:3] == ["-m", "snakemake"]:
        return argv[3:]
    return None


def commands_in(markdown: str, name: str) -> list[DocCommand]:
    """The commands a Markdown text shows (see the module docstring for what counts)."""
    found: list[DocCommand] = []
    lines = markdown.splitlines()
    fence: str | None = None
    lang = ""
    pending, start = "", 0
    for number, line in enumerate(lines, 1):
        opening = FENCE.match(line)
        if fence is None:
            if opening:
                fence, lang = opening.group(1), opening.group(2).lower()
                continue
            for span in INLINE.findall(line):
                command = DocCommand(f"{name}:{number}", span.strip(), False)
                if snakemake_args(_split(command.text)) is not None:
                    found.append(command)
            continue
        if opening and opening.group(1).startswith(fence) and not opening.group(2):
            fence = None
            continue
        text = line.strip().removeprefix("$ ")
        if not pending:
            start = number
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        text, pending = (pending + text).strip(), ""
        if not text or text.startswith("#"):
            continue
        command = DocCommand(f"{name}:{start}", text, lang in SHELL_LANGS)
        if command.in_shell_block or snakemake_args(_split(text)) is not None:
            found.append(command)
    return found


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # prose in backticks with an unbalanced quote is not a command
        return []


def documented_commands() -> list[DocCommand]:
    """Every command in README.md and docs/*.md."""
    return [command for path in DOCS for command in commands_in(path.read_text(encoding="utf-8"), path.name)]


def exemption(command: DocCommand) -> str | None:
    """Why a documented command is not dry-run, or None when it must be."""
    if snakemake_args(command.argv) is None:
        return EXEMPT_PROGRAMS.get(command.argv[0])
    return next((why for piece, why in EXEMPT_SNAKEMAKE.items() if piece in command.text), None)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout without results/, .snakemake/ or any other ignored file: a fresh clone."""
    copy = tmp_path_factory.mktemp("docs-checkout") / "marketrl"
    shutil.copytree(REPO_ROOT, copy, ignore=shutil.ignore_patterns(*NOT_COPIED), symlinks=True)
    return copy


def dry_run(args: list[str], checkout: Path) -> subprocess.CompletedProcess[str]:
    """`snakemake -n ARGS` from this venv in `checkout`; a config file the command names but `checkout` lacks is
    created there from tests/configs/tiny.yaml (the docs' placeholder for the user's own config)."""
    for i, arg in enumerate(args):
        if arg.startswith("--configfile"):
            names = [arg.split("=", 1)[1]] if "=" in arg else args[i + 1 : i + 2]
            for config in names:
                if config.endswith((".yaml", ".yml")) and not (checkout / config).exists():
                    shutil.copyfile(TINY, checkout / config)
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", *args],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        timeout=300,
    )


COMMANDS = documented_commands()
# Each distinct command runs once (a bare `snakemake` in prose appears more than once), named by its first place.
SNAKEMAKE_COMMANDS = list(
    {
        c.text: c for c in reversed(COMMANDS) if snakemake_args(c.argv) is not None and exemption(c) is None
    }.values()
)[::-1]


@pytest.mark.slow  # one Snakemake start-up per documented command (make test-slow)
@pytest.mark.parametrize("command", SNAKEMAKE_COMMANDS, ids=[c.where for c in SNAKEMAKE_COMMANDS])
def test_documented_snakemake_command_plans(command: DocCommand, checkout: Path) -> None:
    for piece, module in NEEDS_MODULE.items():
        if piece in command.text:
            pytest.importorskip(
                module, reason=f"{command.where}: `{command.text}` needs the optional {module}"
            )
    result = dry_run(snakemake_args(command.argv), checkout)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{command.where}: `{command.text}` fails:\n{output[-2000:]}"
    if "--unlock" not in command.argv:
        assert "This was a dry-run" in output, f"{command.where}: `{command.text}` planned nothing:\n{output}"


def test_every_documented_command_is_checked_or_exempt_with_a_reason() -> None:
    unclassified = [
        f"{c.where}: {c.text}" for c in COMMANDS if snakemake_args(c.argv) is None and exemption(c) is None
    ]
    assert unclassified == [], "add these to EXEMPT_PROGRAMS with the reason, or make them snakemake commands"
    # The docs show the recovery and single-fold commands; a parser that found none would check nothing.
    assert len(SNAKEMAKE_COMMANDS) >= 4


def test_parser_reads_blocks_continuations_and_inline_spans() -> None:
    markdown = "\n".join(
        [
            "Run `snakemake --cores 2 results/folds.json` first; `make run` is prose, `x = 1` too.",
            "```bash",
            "$ snakemake --cores 1 \\",
            "    -f results/folds.json   # a comment",
            "# a whole-line comment",
            "tail -f results/logs/report.log",
            "```",
            "  ```yaml",
            "  seed: 3",
            "  ```",
            "```",
            "config key 'folds.n_folds': unknown key",
            ".venv/bin/snakemake -n",
            "```",
        ]
    )
    found = [(c.where, c.argv, c.in_shell_block) for c in commands_in(markdown, "X.md")]
    assert found == [
        ("X.md:1", ["snakemake", "--cores", "2", "results/folds.json"], False),
        ("X.md:3", ["snakemake", "--cores", "1", "-f", "results/folds.json"], True),
        ("X.md:6", ["tail", "-f", "results/logs/report.log"], True),
        ("X.md:13", [".venv/bin/snakemake", "-n"], False),
    ]


@pytest.mark.slow
def test_a_target_swallowed_by_configfile_fails_the_check(checkout: Path) -> None:
    """The form the README once showed: --configfile takes several files, so it reads the target as a config."""
    swallowed = dry_run(["--cores", "4", "--configfile", "my.yaml", "results/eval_report.html"], checkout)
    assert swallowed.returncode != 0 and "results/eval_report.html" in swallowed.stdout + swallowed.stderr
    with_equals = dry_run(["--cores", "4", "--configfile=my.yaml", "results/eval_report.html"], checkout)
    assert with_equals.returncode == 0, (with_equals.stdout + with_equals.stderr)[-2000:]
