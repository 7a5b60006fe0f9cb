"""Pipeline runs for the reliability tests: configs, Snakemake runs that can be killed, and checks of results/.

Whole-pipeline runs are the expensive part of these tests, so the two clean runs of the tiny config that several
test modules compare against are made once per pytest session (`baseline_run`, `guarded_run`).
"""

from __future__ import annotations

import atexit
import copy
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import torch
import yaml

from marketrl.runtime.testing_hooks import HOLD_AFTER, HOLD_FILE
from tests.conftest import REPO_ROOT

TINY = REPO_ROOT / "tests" / "configs" / "tiny.yaml"
NO_NETWORK_DIR = Path(__file__).resolve().parent / "no_network"
SENTINEL_KEY = "db-SENTINEL-marketrl-3f9c2a7e51d04b"
# The tiny config reduced to one fold (both algorithms, one seed: 2 models), the fewest days that fold needs and
# fewer env steps: the reliability runs stay cheap while every stage, checkpoint and trial still runs. Both
# trainers' walk-forward over several folds is covered by tests/test_pipeline_e2e.py.
FAST = {
    "data": {"demo": {"days": 6}},
    "folds": {"n": 1},
    "hyperopt": {"trial_steps": 1000},
    "training": {"total_steps": 2000, "checkpoint_every": 400},
}


def fast_counts() -> dict[str, int]:
    """How many models, folds and metrics files (models plus one baselines file per fold) a FAST run makes."""
    config = fast_tiny_config()
    models = len(config["training"]["models"]) * config["folds"]["n"] * config["training"]["seeds"]
    return {"models": models, "folds": config["folds"]["n"], "metrics": models + config["folds"]["n"]}


def merged(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` merged in recursively (mappings merge, other values replace)."""
    result = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def fast_tiny_config(**overrides: Any) -> dict[str, Any]:
    """tests/configs/tiny.yaml with `FAST` and then `overrides` merged in."""
    return merged(merged(yaml.safe_load(TINY.read_text()), FAST), overrides)


def new_workdir(config: Mapping[str, Any], parent: Path) -> Path:
    """A fresh directory holding config.yaml (the Snakefile reads ./config.yaml)."""
    parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="run-", dir=parent))
    (workdir / "config.yaml").write_text(yaml.safe_dump(dict(config)))
    return workdir


def snakemake_command(*args: str) -> list[str]:
    """The workflow's Snakemake from this venv."""
    return [sys.executable, "-m", "snakemake", "-s", str(REPO_ROOT / "Snakefile"), *args]


def run_snakemake(
    workdir: Path, *args: str, env: Mapping[str, str] | None = None, timeout: int = 900
) -> subprocess.CompletedProcess[str]:
    """Run Snakemake to completion in `workdir`, capturing its output."""
    return subprocess.run(
        snakemake_command(*args),
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


class KillableRun:
    """A Snakemake run in its own process group, so that SIGKILL reaches it and every job it started."""

    def __init__(self, workdir: Path, *args: str, env: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.log = open(workdir / f"snakemake-{time.monotonic_ns()}.out", "w")  # closed by kill()
        self.process = subprocess.Popen(
            snakemake_command(*args),
            cwd=workdir,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 300.0) -> None:
        """Poll `condition` every 20 ms; fail if the run ends or `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(f"the run ended (exit {self.process.returncode}) before {what}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the whole process group and wait until none of its processes is left."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        self.log.close()

    def output(self) -> str:
        """What Snakemake printed so far."""
        return Path(self.log.name).read_text(errors="replace")


def hold_env(pattern: str, marker: Path) -> dict[str, str]:
    """Environment that holds the first job process reaching a hold point matching `pattern` until it is killed.

    The held process writes `marker` first (marketrl.runtime.testing_hooks), so a test that waits for the marker knows the
    job is inside that step, not merely past it.
    """
    return {HOLD_AFTER: pattern, HOLD_FILE: str(marker)}


def resume(workdir: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    """The documented recovery after a killed run: remove the stale lock, then rerun incomplete jobs."""
    unlocked = run_snakemake(workdir, "--unlock")
    assert unlocked.returncode == 0, unlocked.stderr[-2000:]
    return run_snakemake(workdir, "--cores", "2", "--rerun-incomplete", timeout=timeout)


# ------------------------------------------------------------------------------------------------ result checks


def damaged_files(results: Path, *, allow_temps: bool = False) -> list[str]:
    """Every file under `results` that does not load (Parquet, JSON, torch, HTML), and every temp leftover.

    `allow_temps`: right after a SIGKILL the hidden temp files of killed writers may remain (the writer's rerun
    removes them); they are not outputs, so they are skipped.
    """
    problems = []
    for path in sorted(p for p in results.rglob("*") if p.is_file()):
        name = str(path.relative_to(results))
        if ".tmp" in path.name:
            if not allow_temps:
                problems.append(f"{name}: temp file left behind")
            continue
        try:
            if path.suffix == ".parquet":
                pl.read_parquet(path)
            elif path.suffix == ".json":
                json.loads(path.read_text(encoding="utf-8"))
            elif path.suffix == ".pt":
                torch.load(path, weights_only=True)
            elif path.suffix == ".html" and not path.read_text(encoding="utf-8").rstrip().endswith("</html>"):
                problems.append(f"{name}: HTML without its closing tag")
        except Exception as exc:  # any loader error means a damaged output
            problems.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return problems


def metrics_bytes(workdir: Path) -> dict[str, bytes]:
    """Every results/eval/**/metrics.json, as raw bytes keyed by relative path."""
    root = workdir / "results" / "eval"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("metrics.json"))}


def model_tensors(workdir: Path) -> dict[str, dict[str, torch.Tensor]]:
    """The state-dict tensors of every results/models/**/model.pt, keyed by model path and network."""
    root = workdir / "results" / "models"
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for path in sorted(root.rglob("model.pt")):
        checkpoint = torch.load(path, weights_only=True)
        for network, state in checkpoint["state_dicts"].items():
            tensors[f"{path.relative_to(root)}:{network}"] = state
    return tensors


def differing_tensors(
    left: dict[str, dict[str, torch.Tensor]], right: dict[str, dict[str, torch.Tensor]]
) -> list[str]:
    """Names of networks/parameters that differ in any bit (or exist on one side only)."""
    if left.keys() != right.keys():
        return sorted(set(left) ^ set(right))
    return [
        f"{model}/{key}"
        for model in left
        for key in sorted(set(left[model]) | set(right[model]))
        if key not in left[model]
        or key not in right[model]
        or not torch.equal(left[model][key], right[model][key])
    ]


_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
# Provenance rows of input files that record durations (hyperopt trial timings, training wall time).
_TIMED_INPUT = re.compile(
    r"(<tr><td><code>results/(?:hyperopt/\w+\.json|models/[^<]*/train_log\.json)</code></td>)"
    r'<td class="n">[^<]*</td><td class="hash">[^<]*</td>'
)
_CELL = re.compile(r"<t[dh][^>]*>.*?</t[dh]>", re.S)
_TIMED_COLUMNS = ("Wall (s)", "Steps/s")


def _mask_timed_columns(table: str) -> str:
    """Blank the cells of the training table's timing columns (found by their header), row by row."""
    rows = table.split("<tr>")
    header = [re.sub(r"<[^>]+>", "", cell) for cell in _CELL.findall(rows[1])]
    timed = {header.index(name) for name in _TIMED_COLUMNS}
    masked = [rows[0], rows[1]]
    for row in rows[2:]:
        pieces = _CELL.split(row)  # text between cells; the cells themselves come from findall
        cells = ["<td>-</td>" if i in timed else cell for i, cell in enumerate(_CELL.findall(row))]
        masked.append("".join(p + c for p, c in zip(pieces, [*cells, ""], strict=True)))
    return "<tr>".join(masked)


def normalized_report(html: str) -> str:
    """The report with its timestamps and durations masked: what two runs of the same inputs must share.

    Masked: the generation timestamp; the Wall (s) and Steps/s columns of the training table; the size and
    hash of input files that contain durations. Everything else (numbers, figures, metric and bar file hashes)
    is kept.
    """
    html = _TIMESTAMP.sub("<timestamp>", html)
    html = _TIMED_INPUT.sub(r'\1<td class="n">-</td><td class="hash">-</td>', html)
    header = html.index('<th class="n">Wall (s)</th>')
    start, end = html.rindex("<table", 0, header), html.index("</table>", header)
    return html[:start] + _mask_timed_columns(html[start:end]) + html[end:]


# --------------------------------------------------------------------------------------- shared pipeline runs


@functools.cache
def _session_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="marketrl-reliability-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def session_workdir(config: Mapping[str, Any]) -> Path:
    """A new workdir under this session's temp folder (removed when the session ends)."""
    return new_workdir(config, _session_dir())


def _complete_run(workdir: Path, env: Mapping[str, str] | None = None) -> Path:
    result = run_snakemake(workdir, "--cores", "2", env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return workdir


def _baseline() -> Path:
    return _complete_run(session_workdir(fast_tiny_config()))


def _guard_env(workdir: Path) -> tuple[dict[str, str], Path]:
    """The sentinel DATABENTO_API_KEY and blocked inet sockets, with the log of blocked attempts in `workdir`."""
    network_log = workdir / "blocked_network.log"
    network_log.touch()
    env = {
        "DATABENTO_API_KEY": SENTINEL_KEY,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(NO_NETWORK_DIR), os.environ.get("PYTHONPATH")])),
        "MARKETRL_NETWORK_LOG": str(network_log),
    }
    return env, network_log


def _guarded() -> tuple[Path, Path]:
    workdir = session_workdir(fast_tiny_config())
    env, network_log = _guard_env(workdir)
    return _complete_run(workdir, env), network_log


def _shared() -> tuple[Path, Path]:
    workdir = session_workdir(yaml.safe_load(TINY.read_text()))
    env, network_log = _guard_env(workdir)
    return _complete_run(workdir, env), network_log


@functools.cache
def _shared_future() -> Future[tuple[Path, Path]]:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="shared-run").submit(_shared)


def start_shared_run() -> None:
    """Start the shared finished run in the background (if not started yet), without waiting for it."""
    _shared_future()


def shared_run() -> tuple[Path, Path]:
    """THE finished run of the session: tests/configs/tiny.yaml as it is (10 sessions, 2 folds, dqn and ppo), run
    once with a sentinel DATABENTO_API_KEY set and every inet socket blocked.

    Returns the workdir and the log of blocked network attempts. Every test that only reads a finished run reads
    this one (the `shared_run` fixture of tests/conftest.py); a test that changes anything in it works on a copy
    (`copy_of_shared_run`), so no later reader sees a changed run.
    """
    return _shared_future().result()


def shared_network_log() -> Path:
    """The shared run's log of blocked network attempts (empty when nothing tried to connect)."""
    return shared_run()[1]


def copy_of_shared_run(destination: Path) -> Path:
    """A copy of the shared run at `destination`, mtimes and .snakemake metadata kept: nothing in it looks stale."""
    shutil.copytree(shared_run()[0], destination, symlinks=True)  # copy2 keeps mtimes
    return destination


@functools.cache
def _clean_runs() -> tuple[Future[Path], Future[tuple[Path, Path]]]:
    # Both runs start together: each has serial stretches (hyperopt, the report) that the other fills, so the
    # pair takes about as long as its CPU time on two cores rather than the sum of two wall times.
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pipeline-run")
    return pool.submit(_baseline), pool.submit(_guarded)


def start_clean_runs() -> None:
    """Start the two shared clean runs in the background (if not started yet), without waiting for them."""
    _clean_runs()


def baseline_run() -> Path:
    """One clean run of the fast tiny config, shared by every test module of the session."""
    return _clean_runs()[0].result()


def guarded_run() -> tuple[Path, Path]:
    """A second clean run of the same config, with a sentinel DATABENTO_API_KEY set and inet sockets blocked.

    Returns the workdir and the log of blocked network attempts (empty when nothing tried to connect).
    """
    return _clean_runs()[1].result()


# ------------------------------------------------------------------------------------------------- load run

XSS_SYMBOL = "<script>alert(1)</script>"
# Many small jobs: 2 folds x 2 models x 1 seed with two hyperopt workers per study (25 jobs), on 5 days of demo-like
# data whose first instrument is named XSS_SYMBOL (the report must show it as text).
LOAD = {
    "data": {"source": "files"},
    "folds": {
        "n": 2,
        "scheme": "expanding",
        "train_days": 3,
        "validation_days": 1,
        "test_days": 1,
        "tuning_days": 3,
        "tuning_validation_days": 2,
    },
    "hyperopt": {"n_trials": 4, "workers": 2, "trial_steps": 256},
    "training": {"seeds": 1, "total_steps": 512, "checkpoint_every": 128, "n_envs": 8},
    "evaluation": {"random_baseline_seeds": 3, "bootstrap_samples": 100},
    # XSS_SYMBOL has no symbol root: a deliberate catch-all prices it as the ES contract it stands in for.
    "costs": {"instruments": {"default": {"tick_size": 0.25, "tick_value": 12.5}}},
}
LOAD_DAYS = 5


def write_hostile_demo_data(out_dir: Path, days: int) -> list[Path]:
    """Demo DBN files whose first instrument's symbol is XSS_SYMBOL (same prices as the demo data)."""
    import dataclasses

    from marketrl.data import demo

    original = demo.DEMO_INSTRUMENTS
    demo.DEMO_INSTRUMENTS = (dataclasses.replace(original[0], symbol=XSS_SYMBOL), *original[1:])
    try:
        return demo.generate_demo_files(out_dir, "2024-01-02", days, seed=5)
    finally:
        demo.DEMO_INSTRUMENTS = original


@functools.cache
def load_run() -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The many-small-jobs run (with `--cores 2`); returns the workdir and Snakemake's output."""
    data = _session_dir() / "hostile-data"
    write_hostile_demo_data(data, LOAD_DAYS)
    config = fast_tiny_config(**merged(LOAD, {"data": {"files": str(data / "*.dbn.zst")}}))
    workdir = session_workdir(config)
    result = run_snakemake(workdir, "--cores", "2")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return workdir, result
