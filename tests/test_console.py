"""`make run`'s console (marketrl/workflow/console.py): Snakemake's output in, one line per finished job out, the
report's path and verdict at the end, a failed job's one-line error and log path last.

The formatter is fed recorded Snakemake output (tests/recorded/: a run of the tiny config reduced to one fold, and
a features job failing on a corrupt file) with a fake clock; one real Snakemake run through the console checks
the failure form end to end.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from marketrl.settings import paths
from marketrl.workflow.console import Console, format_duration
from tests.conftest import REPO_ROOT

RECORDED = Path(__file__).resolve().parent / "recorded"
JOB_LINE = re.compile(r"^\[\s*(\d+)/(\d+)\s+(\d+)%\] (\S+)")
FAILED_LOG = "results/logs/features/glbx-mdp3-20240102.ohlcv-1m.log"
ERROR = (
    "DataFileError: /home/user/data/glbx-mdp3-20240102.ohlcv-1m.dbn.zst: truncated zstd stream "
    "(frame ends before its last block)"
)


def replay(
    lines: list[str], cwd: Path, returncode: int, *, report_target: bool = True, step: float = 0.5
) -> list[tuple[str, bool]]:
    """What the console prints for `lines` (a fake clock advancing `step` seconds per line): (text, to stderr)."""
    out: list[tuple[str, bool]] = []
    clock = itertools.count(0.0, step)
    console = Console(
        lambda text, error: out.append((text, error)),
        clock=lambda: next(clock),
        report_target=report_target,
        cwd=cwd,
    )
    for line in lines:
        console.feed(line.replace("/home/user/run", str(cwd)))  # the recorded run's directory
    console.finish(returncode, elapsed=30.0)
    return out


def recorded(name: str) -> list[str]:
    return (RECORDED / name).read_text(encoding="utf-8").splitlines(keepends=True)


def write_report(cwd: Path, sentence: str) -> None:
    (cwd / paths.REPORT).parent.mkdir(parents=True, exist_ok=True)
    (cwd / paths.REPORT).write_text("<html></html>\n", encoding="utf-8")
    (cwd / paths.VERDICT).write_text(json.dumps({"sentence": sentence, "winners": []}), encoding="utf-8")


def test_a_recorded_run_prints_one_line_per_job_then_the_report_and_its_verdict(tmp_path: Path) -> None:
    sentence = "No model beats every baseline at family-wise 5% over all 2 model(s)."
    write_report(tmp_path, sentence)
    snakemake_lines = recorded("snakemake_tiny_run.txt")
    out = replay(snakemake_lines, tmp_path, 0)
    text = [line for line, _ in out]

    jobs = [JOB_LINE.match(line) for line in text]
    done = [m for m in jobs if m]
    assert len(snakemake_lines) > 300 and len(text) == len(done) + 5  # 372 lines in, one per job + 5 out
    assert [int(m.group(1)) for m in done] == list(range(1, 21)) and {m.group(2) for m in done} == {"20"}
    assert [m.group(4) for m in done[:2]] == ["demo_data", "features"] and done[-1].group(4) == "report"
    assert "train dqn fold 0 (" in "\n".join(text) and "hyperopt_worker ppo worker 0 (" in "\n".join(text)
    assert (
        all("left" in line for line in text[2:-4]) and "left" not in text[-4]
    )  # nothing left after the last
    assert text[0].startswith("marketrl: 20 jobs to run on 2 cores (demo_data 1, features 7,")
    assert text[-3].startswith("Done: 20 jobs in 30s. Snakemake's log: .snakemake/log/")
    assert text[-2:] == [f"Report: {paths.REPORT}", f"Verdict: {sentence}"]
    assert not any(error for _, error in out)
    for noise in ("input:", "reason:", "jobid", "Select jobs", "SNAKEMAKE", "Shell command"):
        assert not any(noise in line for line in text), noise


def test_the_verdict_is_named_only_when_the_report_was_asked_for(tmp_path: Path) -> None:
    write_report(tmp_path, "At family-wise 5% over all 2 model(s) of this run: ppo beats every baseline.")
    out = replay(recorded("snakemake_tiny_run.txt"), tmp_path, 0, report_target=False)
    assert out[-1][0].startswith("Done: 20 jobs")


def test_an_up_to_date_run_still_ends_with_the_report_and_verdict(tmp_path: Path) -> None:
    write_report(tmp_path, "the sentence")
    lines = [
        "Using workflow specific profile profiles/default for setting default command line arguments.\n",
        "Building DAG of jobs...\n",
        "Nothing to be done (all requested files are present and up to date).\n",
    ]
    out = [line for line, _ in replay(lines, tmp_path, 0)]
    assert out == [
        "Nothing to do: every requested output is up to date.",
        f"Report: {paths.REPORT}",
        "Verdict: the sentence",
    ]


def test_a_failed_job_ends_with_its_one_line_error_and_its_log(tmp_path: Path) -> None:
    log = tmp_path / FAILED_LOG
    log.parent.mkdir(parents=True)
    log.write_text(
        f"2026-12-05 10:22:00,1 ERROR marketrl: {ERROR}\nTraceback (most recent call last):\n  File x\n",
        encoding="utf-8",
    )
    out = replay(recorded("snakemake_failed_job.txt"), tmp_path, 1)
    text = [line for line, _ in out]
    assert text[-2:] == [f"marketrl error: {ERROR}", f"  log: {FAILED_LOG}"]
    assert re.match(r"^\[0/1\s+0%\] features glbx-mdp3-20240102.ohlcv-1m FAILED after", text[2])
    assert any(line.startswith("Snakemake's log: .snakemake/log/") for line in text)
    assert len(text) == 6 and sum("marketrl error" in line for line in text) == 1
    assert all(error for _, error in out[2:])  # the failure goes to stderr


def test_without_its_log_the_error_comes_from_the_jobs_stderr(tmp_path: Path) -> None:
    text = [line for line, _ in replay(recorded("snakemake_failed_job.txt"), tmp_path, 1)]
    assert text[-2:] == [f"marketrl error: {ERROR}", f"  log: {FAILED_LOG}"]


def test_a_bugs_traceback_passes_through_and_the_error_still_ends_the_output(tmp_path: Path) -> None:
    lines = recorded("snakemake_failed_job.txt")
    at = next(i for i, line in enumerate(lines) if line.startswith("marketrl error:"))
    bug = "marketrl error: KeyError: 'x'\n"
    traceback = [
        "Traceback (most recent call last):\n",
        '  File "job.py", line 3, in <module>\n',
        "KeyError: 'x'\n",
    ]
    lines = [*lines[:at], bug, *traceback, *lines[at + 1 :]]
    text = [line for line, _ in replay(lines, tmp_path, 1)]
    assert [line.rstrip("\n") for line in traceback] == text[2:5]  # a bug keeps its traceback on the console
    assert text[-2:] == [bug.strip(), f"  log: {FAILED_LOG}"]


def test_a_failure_without_a_marketrl_error_shows_snakemakes_own_account(tmp_path: Path) -> None:
    lines = [line for line in recorded("snakemake_failed_job.txt") if not line.startswith("marketrl error:")]
    text = [line for line, _ in replay(lines, tmp_path, 1)]
    assert "Error in rule features:" in text and any("CalledProcessError" in line for line in text)
    assert text[-1] == f"  log: {FAILED_LOG}"


def test_a_config_error_is_passed_through_as_the_last_line(tmp_path: Path) -> None:
    error = "marketrl config error: config key 'training.totl_steps': unknown key; expected one of: models"
    lines = ["Using workflow specific profile profiles/default for setting default command line arguments.\n"]
    out = replay([*lines, error + "\n"], tmp_path, 1)
    assert out == [(error, True)]


def test_the_time_left_weighs_each_stage_by_its_own_mean_run_time(tmp_path: Path) -> None:
    now = [0.0]
    out: list[str] = []
    console = Console(lambda text, _: out.append(text), clock=lambda: now[0], cwd=tmp_path)

    def at(t: float, *lines: str) -> None:
        now[0] = t
        for line in lines:
            console.feed(line)

    def start(t: float, rule: str, jobid: int) -> None:
        at(t, f"rule {rule}:", f"    jobid: {jobid}", f"    wildcards: fold={jobid}", "Shell command: None")

    at(0.0, "Provided cores: 1", "Job stats:", "job count", "----- -----", "fast 2", "slow 2", "total 4", "")
    assert out[0] == "marketrl: 4 jobs to run on 1 core (fast 2, slow 2)"
    assert console.time_left(0.0) is None  # nothing to go on before a job finishes
    start(0.0, "fast", 1)
    at(70.0, "Finished jobid: 1 (Rule: fast)", "1 of 4 steps (25%) done")
    # no slow job has finished: its stage is left out of the estimate, which says so
    assert out[-1] == "[1/4  25%] fast fold 1 (1m10s), at least 1m left (not timed yet: slow)"
    start(70.0, "slow", 2)
    at(170.0, "Finished jobid: 2 (Rule: slow)", "2 of 4 steps (50%) done")
    assert console.time_left(170.0) == (pytest.approx(70.0 + 100.0), [])  # one fast and one slow job to go
    start(170.0, "slow", 3)
    at(210.0)
    assert console.time_left(210.0) == (pytest.approx(70.0 + 60.0), [])  # the running one has 60 s to go
    assert console.status() == "[2/4  50%] · about 2m left · running: slow fold 3 (40s)"


def test_the_features_batches_share_one_run_time(tmp_path: Path) -> None:
    # features.batch: one rule per month (features_2024_02, ...): a finished month times the months to go
    now = [0.0]
    console = Console(lambda *_: None, clock=lambda: now[0], cwd=tmp_path)
    stats = ["features_2024_02 1", "features_2024_03 1", "features_2024_04 1", "total 3"]
    for line in ["Provided cores: 1", "Job stats:", "job count", "----- -----", *stats, ""]:
        console.feed(line)
    for line in ["rule features_2024_02:", "    jobid: 1", "Shell command: None"]:
        console.feed(line)
    now[0] = 30.0
    console.feed("Finished jobid: 1 (Rule: features_2024_02)")
    assert console.time_left(30.0) == (pytest.approx(60.0), [])  # two months to go at 30 s each


def test_durations_read_like_a_clock() -> None:
    assert [format_duration(s) for s in (0.04, 9.2, 42, 250, 3900)] == [
        "0.0s",
        "9.2s",
        "42s",
        "4m10s",
        "1h05m",
    ]


def test_make_run_goes_through_the_console_with_cores() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\nrun: ", 1)[1].splitlines()[1].strip()
    # $(RESOURCES): the memory Snakemake may hand out (docs/PERFORMANCE.md "Bounded memory")
    assert recipe == (
        "$(BIN)/python -m marketrl.workflow.console $(RESOURCES) --cores $(CORES) results/eval_report.html"
    )


def test_a_real_failing_job_ends_with_the_one_line_error_and_its_log_path(tmp_path: Path) -> None:
    """The console around a real Snakemake run whose one job fails on a corrupt file (the fault of
    tests/test_faults_workflow.py): exit status 1, the job's one-line error and log path last, no traceback."""
    from marketrl.data.demo import generate_demo_files
    from tests.faults.pipeline import fast_tiny_config, new_workdir
    from tests.test_reader import BAD_INPUTS

    data = tmp_path / "data"
    generate_demo_files(data, "2024-01-03", 1, seed=2)
    corrupt = BAD_INPUTS["truncated zstd on a record boundary"][0](tmp_path)
    corrupt = corrupt.rename(data / "glbx-mdp3-20240102.ohlcv-1m.dbn.zst")
    workdir = new_workdir(
        fast_tiny_config(data={"source": "files", "files": str(data / "*.dbn.zst")}), tmp_path / "runs"
    )
    target = "results/features/glbx-mdp3-20240102.ohlcv-1m.parquet"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "marketrl.workflow.console",
            "-s",
            str(REPO_ROOT / "Snakefile"),
            "--cores",
            "1",
            target,
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout
    assert lines[-2].startswith(f"marketrl error: DataFileError: {corrupt}") and "truncated zstd" in lines[-2]
    batch_log = "results/logs/features/2024-01.log"  # features.batch: month, the month of both files
    assert lines[-1] == f"  log: {batch_log}" and (workdir / batch_log).exists()
    assert "Traceback" not in result.stdout and len(lines) < 10, result.stdout
