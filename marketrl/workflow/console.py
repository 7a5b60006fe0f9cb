"""`make run`'s console: Snakemake with one line per finished job, a time-left estimate and the verdict at the end.

``python -m marketrl.workflow.console <snakemake arguments>`` runs ``python -m snakemake <arguments>`` and reads
its output (Snakemake's log and the jobs' stderr, one stream) line by line. It prints one line per finished job
(stage, wildcards, its run time, jobs done out of the total and an estimate of the time left) instead of
Snakemake's block of inputs, outputs and reasons per job; on a terminal a status line below them names the
running jobs and is redrawn every second. When the report is one of the targets, a successful run ends with the
report's path and its headline sentence, read from `paths.VERDICT` (the report stage writes it there). A failed
job ends the output with its one-line ``marketrl error:`` (from the job's log, where `marketrl.runtime.jobs`
writes it) and the job's log path. The full output stays where it always is: Snakemake's in
``.snakemake/log/``, each job's in ``results/logs/``; a line this module does not recognise (a traceback, a
config error, a Snakemake message it has no rule for) is passed through unchanged, so nothing is hidden.

`Console` is the formatter (lines in, lines out; a test feeds it recorded output and a fake clock); `main` runs
Snakemake and exits with its status. Standard library only: marketrl.workflow stays light.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from marketrl.settings import paths

__all__ = ["Console", "format_duration", "main"]

ERROR_PREFIX = "marketrl error: "
_TIMESTAMP = re.compile(r"^\[(Mon|Tue|Wed|Thu|Fri|Sat|Sun) .+\]$")
_JOB_START = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")
_FINISHED = re.compile(r"^Finished jobid: (\d+)(?: \(Rule: (\S+)\))?")
_STEPS = re.compile(r"^(\d+) of (\d+) steps \(\d+%\) done$")
_STATS_ROW = re.compile(r"^(\S+)\s+(\d+)$")
_ERROR_IN_RULE = re.compile(r"^Error in rule (\S+):$")
_FIELD = re.compile(r"^\s+(\w+): (.*)$")
_JOB_LOG_ERROR = re.compile(r" ERROR marketrl: (.*)$")
# Snakemake's framing lines, dropped: its full log in .snakemake/log/ keeps them.
_DROPPED = (
    "Using workflow specific profile",
    "Assuming unrestricted shared filesystem usage",
    "Building DAG of jobs...",
    "Using shell:",
    "Rules claiming more threads will be scaled down.",
    "Provided resources:",
    "Conda environments:",
    "Select jobs to execute...",
    "Execute ",
    "Shell command: None",
    "Shutting down, this might take some time.",
    "Exiting because a job execution failed.",
    "Elapsed time:",
    "At least one job did not complete successfully.",
)


def format_duration(seconds: float) -> str:
    """``42s``, ``4m10s``, ``1h05m``."""
    if seconds < 9.95:
        return f"{max(seconds, 0.0):.1f}s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _time_left(seconds: float) -> str:
    """A coarse estimate: ``under a minute``, ``about 3m``, ``about 1h05m``."""
    if seconds < 60:
        return "under a minute left"
    minutes = round(seconds / 60)
    return f"about {minutes}m left" if minutes < 60 else f"about {minutes // 60}h{minutes % 60:02d}m left"


@dataclass
class _Job:
    rule: str
    label: str
    log: str = ""
    started: float = 0.0


def _timing_key(rule: str) -> str:
    """Whose run times estimate a rule's jobs: the features batches' rules (one per month, ``features_2024_03``:
    marketrl.workflow.pipeline.feature_rule_name) share the features stage's; any other rule has its own."""
    return "features" if rule.startswith("features_") else rule


def _label(rule: str, wildcards: str) -> str:
    """``train dqn fold 0`` from rule ``train`` and ``model=dqn, fold=0``: a name's value alone, a number with its
    wildcard's name."""
    parts = [rule]
    for item in filter(None, (w.strip() for w in wildcards.split(","))):
        key, _, value = item.partition("=")
        parts.append(f"{key} {value}" if value.isdigit() else value)
    return " ".join(parts)


class Console:
    """Snakemake's output in, the console's lines out (`write(text, error)`); `finish` prints the ending.

    `clock` gives the time of each fed line (seconds, any origin); `report_target` is whether the run asked for
    the report, so that a finished run names it and its verdict; `cwd` is the run's working directory (the job
    logs and the verdict are read relative to it).
    """

    def __init__(
        self,
        write: Callable[[str, bool], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        report_target: bool = False,
        cwd: str | os.PathLike[str] = ".",
    ) -> None:
        self._write = write
        self._clock = clock
        self._report_target = report_target
        self._cwd = Path(cwd)
        self._state = "normal"  # header | stats | job | error | exception
        self._block: dict[str, str] = {}
        self._block_rule = ""
        self._block_lines: list[str] = []
        self.stats: dict[str, int] = {}
        self.total = 0
        self.done = 0
        self.cores = 0
        self.jobs: dict[str, _Job] = {}
        self.running: dict[str, _Job] = {}
        self.durations: dict[str, list[float]] = {}
        self.done_by_rule: dict[str, int] = {}
        self.failed: list[tuple[_Job, list[str]]] = []
        self.stream_errors: list[str] = []
        self.snakemake_log = ""
        self.nothing_to_do = False
        self._exception_lines: list[str] = []
        self._first_start: float | None = None

    # ------------------------------------------------------------------------------------------------ input

    def feed(self, line: str) -> None:
        """One line of Snakemake's output (with or without its line break)."""
        line = line.rstrip("\r\n")
        now = self._clock()
        if self._state == "header":
            if line.startswith("  ") or line.startswith("=") or not line.strip():
                return
            self._state = "normal"
        elif self._state == "stats":
            self._stats_line(line)
            return
        elif self._state == "job":
            if self._field(line):
                return
            self._start_job(now)
        elif self._state == "error":
            if self._field(line):
                self._block_lines.append(line)
                return
            self._job_failed()
        elif self._state == "exception":
            if line and not _TIMESTAMP.match(line) and not _ERROR_IN_RULE.match(line):
                self._exception_lines.append(line)
                return
            self._state = "normal"
        self._normal(line, now)

    def _field(self, line: str) -> bool:
        match = _FIELD.match(line)
        if match:
            self._block[match.group(1)] = match.group(2)
        return match is not None

    def _normal(self, line: str, now: float) -> None:
        if not line.strip() or _TIMESTAMP.match(line) or line.startswith(_DROPPED):
            return
        if line == "SNAKEMAKE":
            self._state = "header"
        elif line == "Job stats:":
            self._state, self.stats = "stats", {}
        elif line.startswith("Provided cores: "):
            self.cores = int(line.split()[-1]) if line.split()[-1].isdigit() else 0
        elif match := _JOB_START.match(line):
            self._state, self._block_rule, self._block = "job", match.group(1), {}
        elif match := _FINISHED.match(line):
            self._job_finished(match.group(1), match.group(2) or "", now)
        elif match := _STEPS.match(line):
            self.done, self.total = int(match.group(1)), int(match.group(2))
        elif match := _ERROR_IN_RULE.match(line):
            self._state, self._block_rule, self._block, self._block_lines = (
                "error",
                match.group(1),
                {},
                [line],
            )
        elif line in ("RuleException:", "WorkflowError:"):
            self._state, self._exception_lines = "exception", [line]
        elif line.startswith("Complete log(s): "):
            self.snakemake_log = self._relative(line.removeprefix("Complete log(s): ").strip())
        elif line.startswith("Nothing to be done"):
            self.nothing_to_do = True
        elif line.startswith(ERROR_PREFIX):
            self.stream_errors.append(line)
        else:
            self._write(line, True)

    def _stats_line(self, line: str) -> None:
        match = _STATS_ROW.match(line)
        if match and match.group(1) == "total":
            self.total = int(match.group(2))
            self._state = "normal"
            rules = ", ".join(f"{rule} {n}" for rule, n in self.stats.items())
            cores = f" on {self.cores} core{'s' if self.cores != 1 else ''}" if self.cores else ""
            self._write(
                f"marketrl: {self.total} job{'s' if self.total != 1 else ''} to run{cores} ({rules})", False
            )
            self._write(
                "  every job logs to results/logs/, Snakemake to .snakemake/log/; "
                "a running job's progress: tail -f its log",
                False,
            )
        elif match and match.group(1) != "job":
            self.stats[match.group(1)] = int(match.group(2))

    def _start_job(self, now: float) -> None:
        self._state = "normal"
        jobid = self._block.get("jobid", "")
        job = _Job(
            self._block_rule,
            _label(self._block_rule, self._block.get("wildcards", "")),
            self._block.get("log", ""),
        )
        job.started = now
        self._first_start = now if self._first_start is None else self._first_start
        self.jobs[jobid] = self.running[jobid] = job

    def _job_finished(self, jobid: str, rule: str, now: float) -> None:
        job = self.running.pop(jobid, None) or self.jobs.get(jobid) or _Job(rule, rule, started=now)
        took = now - job.started
        self.durations.setdefault(_timing_key(job.rule), []).append(took)
        self.done_by_rule[job.rule] = self.done_by_rule.get(job.rule, 0) + 1
        self.done = max(self.done, sum(self.done_by_rule.values()))
        left = self.time_left_text(now)
        tail = f", {left}" if left else ""
        self._write(f"{self._counter()} {job.label} ({format_duration(took)}){tail}", False)

    def _job_failed(self) -> None:
        self._state = "normal"
        jobid = self._block.get("jobid", "")
        job = (
            self.running.pop(jobid, None) or self.jobs.get(jobid) or _Job(self._block_rule, self._block_rule)
        )
        job.log = job.log or self._block.get("log", "").removesuffix(" (check log file(s) for error details)")
        self.failed.append((job, [*self._exception_lines, *self._block_lines]))
        self._exception_lines = []
        took = f" after {format_duration(self._clock() - job.started)}" if job.started else ""
        self._write(f"{self._counter()} {job.label} FAILED{took}", True)

    def _counter(self) -> str:
        total = max(self.total, self.done)
        width = len(str(total))
        percent = f"{100 * self.done // total:3d}%" if total else "   ?"
        return f"[{self.done:>{width}}/{total} {percent}]"

    def _relative(self, path: str) -> str:
        """`path` relative to the run's directory when it lies under it."""
        try:
            return str(Path(path).relative_to(self._cwd.resolve()))
        except ValueError:
            return path

    # ------------------------------------------------------------------------------------------------ estimates

    def time_left(self, now: float) -> tuple[float, list[str]] | None:
        """(seconds until the last job ends, the stages it leaves out). Every pending and running job counts at
        its stage's mean run time so far, divided by how many jobs ran at once on average; a stage none of whose
        jobs has finished yet is left out and named, so the seconds are then a lower bound. None before the first
        job finishes."""
        finished = [d for ds in self.durations.values() for d in ds]
        if not finished or self._first_start is None:
            return None
        running_by_rule: dict[str, int] = {}
        untimed: list[str] = []
        work = 0.0
        for job in self.running.values():
            running_by_rule[job.rule] = running_by_rule.get(job.rule, 0) + 1
        for rule in [*self.stats, *(r for r in running_by_rule if r not in self.stats)]:
            pending = max(
                self.stats.get(rule, 0) - self.done_by_rule.get(rule, 0) - running_by_rule.get(rule, 0), 0
            )
            if not pending and not running_by_rule.get(rule):
                continue
            own = self.durations.get(_timing_key(rule))
            if not own:
                if _timing_key(rule) not in untimed:
                    untimed.append(_timing_key(rule))
                continue
            mean = sum(own) / len(own)
            work += pending * mean
            work += sum(max(mean - (now - j.started), 0.0) for j in self.running.values() if j.rule == rule)
        busy = sum(finished) + sum(now - job.started for job in self.running.values())
        at_once = max(1.0, busy / max(now - self._first_start, 1e-9))
        if self.cores:
            at_once = min(at_once, float(self.cores))
        return work / at_once, untimed

    def time_left_text(self, now: float) -> str:
        """``about 3m left``; ``at least 3m left (not timed yet: report)``, ``at least 3m left (4 stages not timed
        yet)``; empty when nothing is left."""
        estimate = self.time_left(now)
        if estimate is None or self.done >= self.total:
            return ""
        seconds, untimed = estimate
        if not untimed:
            return _time_left(seconds)
        stages = (
            f"not timed yet: {', '.join(untimed)}"
            if len(untimed) <= 2
            else f"{len(untimed)} stages not timed yet"
        )
        if seconds < 1:
            return f"time left not known yet ({stages})"
        bound = f"{round(seconds)}s" if seconds < 60 else _time_left(seconds).removeprefix("about ")
        return f"at least {bound.removesuffix(' left')} left ({stages})"

    def status(self) -> str:
        """The terminal's live line: progress, the running jobs with their run time so far, the time left."""
        now = self._clock()
        if not self.total:
            return "Snakemake is building the job graph..."
        running = ", ".join(
            f"{job.label} ({format_duration(now - job.started)})"
            for job in sorted(self.running.values(), key=lambda j: j.started)
        )
        left = self.time_left_text(now)
        # the time left before the running jobs, whose list a narrow terminal cuts
        parts = [self._counter(), *([left] if left else []), f"running: {running}" if running else "waiting"]
        return " · ".join(parts)

    # ------------------------------------------------------------------------------------------------ ending

    def finish(self, returncode: int, elapsed: float) -> None:
        """The last lines: on success the report and its verdict (when asked for), on failure each failed job's
        one-line error and log path, the error last."""
        if self._state == "error":
            self._job_failed()
        elif self._state == "job":
            self._start_job(self._clock())
        full_log = f"Snakemake's log: {self.snakemake_log}" if self.snakemake_log else ""
        if returncode == 0:
            if self.nothing_to_do:
                self._write("Nothing to do: every requested output is up to date.", False)
            else:
                done = f"{self.done} job{'s' if self.done != 1 else ''}"
                self._write(
                    f"Done: {done} in {format_duration(elapsed)}." + (f" {full_log}" if full_log else ""),
                    False,
                )
            if self._report_target:
                self._verdict_lines()
            return
        if full_log:
            self._write(full_log, True)
        for job, snakemake_lines in self.failed:
            error = self._job_error(job)
            if error is None:
                for line in snakemake_lines:  # no marketrl error: Snakemake's own account of the failure
                    self._write(line, True)
            else:
                self._write(error, True)
            if job.log:
                self._write(f"  log: {job.log}", True)
        if not self.failed:
            for line in self._exception_lines:
                self._write(line, True)
            for line in self.stream_errors:
                self._write(line, True)

    def _job_error(self, job: _Job) -> str | None:
        """The job's one-line error: the last ``ERROR marketrl:`` record of its log (`job_context` writes it
        there and to stderr), else the only ``marketrl error:`` line seen on the stream."""
        if job.log:
            try:
                text = (self._cwd / job.log).read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            found = [m.group(1) for m in map(_JOB_LOG_ERROR.search, text.splitlines()) if m]
            if found:
                return ERROR_PREFIX + found[-1]
        if len(self.failed) == 1 and self.stream_errors:
            return self.stream_errors[-1]
        return None

    def _verdict_lines(self) -> None:
        report = self._cwd / paths.REPORT
        if not report.exists():
            return
        self._write(f"Report: {paths.REPORT}", False)
        try:
            verdict = json.loads((self._cwd / paths.VERDICT).read_text(encoding="utf-8"))
            sentence = verdict.get("sentence")
            models = verdict.get("models") or {}
        except (OSError, ValueError, AttributeError):
            sentence, models = None, {}
        self._write(f"Verdict: {sentence}" if sentence else f"Verdict: see {paths.REPORT}", False)
        # one line per model: did it learn to trade, stay flat, get set flat by its validation, or churn?
        for model, record in models.items() if isinstance(models, dict) else ():
            summary = (record.get("diagnostics") or {}).get("summary") if isinstance(record, dict) else None
            if summary:
                self._write(f"  {model}: {summary}", False)


# ---------------------------------------------------------------------------------------------------- runner


class _Terminal:
    """Writes the console's lines; on a terminal also keeps the status line below them, redrawn every second.
    `lock` guards the console's state too: the redraw reads it from another thread."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._status: Callable[[], str] | None = None
        self._stop = threading.Event()
        self._shown = False
        self._thread: threading.Thread | None = None

    def start(self, status: Callable[[], str]) -> None:
        self._status = status
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def write(self, text: str, error: bool) -> None:
        with self.lock:
            self._clear()
            stream = sys.stderr if error else sys.stdout
            stream.write(text + "\n")
            stream.flush()
            self._draw()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self.lock:
            self._clear()

    def _clear(self) -> None:
        if self._shown:
            sys.stdout.write("\r\x1b[K")
            sys.stdout.flush()
            self._shown = False

    def _draw(self) -> None:
        if self._status is None or self._stop.is_set():
            return
        width = shutil.get_terminal_size().columns - 1
        sys.stdout.write(self._status()[:width])
        sys.stdout.flush()
        self._shown = True

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self.lock:
                self._clear()
                self._draw()


def _asks_for_report(args: Sequence[str]) -> bool:
    return paths.REPORT in args or "all" in args


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m snakemake ARGV`` through the console; returns Snakemake's exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    terminal = _Terminal()
    console = Console(terminal.write, report_target=_asks_for_report(args))
    process = subprocess.Popen(
        [sys.executable, "-m", "snakemake", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
    )
    assert process.stdout is not None
    # A SIGTERM for the console is one for Snakemake (which stops its jobs); Ctrl-C reaches both already.
    signal.signal(signal.SIGTERM, lambda *_: process.terminate())
    if sys.stdout.isatty():
        terminal.start(console.status)
    try:
        while True:
            try:
                for line in process.stdout:
                    with terminal.lock:
                        console.feed(line)
                break
            except KeyboardInterrupt:  # Snakemake got the same SIGINT: read on while it stops its jobs
                continue
        returncode = process.wait()
    finally:
        terminal.stop()
    console.finish(returncode, time.monotonic() - started)
    return returncode


if __name__ == "__main__":
    sys.exit(main())
