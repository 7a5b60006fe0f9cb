"""Security: the API key never lands anywhere, checkpoints load as plain data only, hostile symbols render as
text, and the demo pipeline makes no network connection.

The pipeline checks read the session's runs (tests/faults/pipeline.py): the shared finished run (`shared_run`) ran
the tiny config with a sentinel DATABENTO_API_KEY and every inet socket blocked; `load_run` (slow) ran on data whose
first instrument is called `<script>alert(1)</script>`.
"""

from __future__ import annotations

import ast
import html
import re
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.faults.pipeline import (
    NO_NETWORK_DIR,
    SENTINEL_KEY,
    XSS_SYMBOL,
    fast_tiny_config,
    load_run,
    new_workdir,
    run_snakemake,
    shared_network_log,
)

SOURCE_DIRS = ("marketrl", "gpu_utils", "workflow_scripts", "bench")


def files_containing(root: Path, needle: bytes) -> list[str]:
    """Every file under `root` (hidden ones included) whose bytes contain `needle`."""
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


# ------------------------------------------------------------------------------------------------- the API key


def test_api_key_in_environment_is_never_written(shared_run: Path) -> None:
    workdir, network_log = shared_run, shared_network_log()
    armed = [line for line in network_log.read_text().splitlines() if " armed " in line]
    # Positive control: the jobs really ran with the key in their environment ...
    assert any("train.py" in line and "key_set=True" in line for line in armed)
    # ... and it is in no output, log, benchmark, report, Snakemake log or metadata file.
    assert files_containing(workdir, SENTINEL_KEY.encode()) == []


@pytest.mark.slow
def test_failed_databento_download_does_not_leak_the_key(tmp_path: Path) -> None:
    """The one stage that uses the key, failing offline: neither its error nor its log may show the key."""
    config = fast_tiny_config(data={"source": "databento"})
    workdir = new_workdir(config, tmp_path)
    network_log = tmp_path / "network.log"
    env = {
        "DATABENTO_API_KEY": SENTINEL_KEY,
        "PYTHONPATH": str(NO_NETWORK_DIR),
        "MARKETRL_NETWORK_LOG": str(network_log),
    }
    target = "results/data/databento/glbx-mdp3-20240102.ohlcv-1m.dbn.zst"
    result = run_snakemake(workdir, "--cores", "1", target, env=env, timeout=300)
    assert result.returncode != 0  # no network: the download fails ...
    assert " blocked " in network_log.read_text()  # ... because it really tried to connect
    assert SENTINEL_KEY not in result.stdout + result.stderr
    assert files_containing(workdir, SENTINEL_KEY.encode()) == []
    assert not (workdir / target).exists()


# ----------------------------------------------------------------------------------------------- torch.load


def torch_load_calls(path: Path) -> list[tuple[int, bool]]:
    """(line, has weights_only=True) for every call of torch.load / a bare `load` imported from torch."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    aliases = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "torch"
        for alias in node.names
        if alias.name == "load"
    }
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        is_torch_load = (
            isinstance(func, ast.Attribute)
            and func.attr == "load"
            and isinstance(func.value, ast.Name)
            and func.value.id == "torch"
        ) or (isinstance(func, ast.Name) and func.id in aliases)
        if is_torch_load:
            safe = any(
                kw.arg == "weights_only" and isinstance(kw.value, ast.Constant) and kw.value.value is True
                for kw in node.keywords
            )
            calls.append((node.lineno, safe))
    return calls


def test_every_torch_load_uses_weights_only() -> None:
    sources = [p for d in SOURCE_DIRS if (REPO_ROOT / d).is_dir() for p in (REPO_ROOT / d).rglob("*.py")]
    assert len(sources) > 20
    calls = {str(p.relative_to(REPO_ROOT)): torch_load_calls(p) for p in sources}
    unsafe = [f"{path}:{line}" for path, found in calls.items() for line, safe in found if not safe]
    assert unsafe == []
    assert sum(len(found) for found in calls.values()) >= 2  # the checkpoint loaders were seen


def test_no_pickle_based_loading_in_the_library() -> None:
    pattern = re.compile(r"^\s*(import pickle|from pickle|import dill|import joblib)|pickle\.loads?\(", re.M)
    hits = [
        str(p.relative_to(REPO_ROOT))
        for d in SOURCE_DIRS
        if (REPO_ROOT / d).is_dir()
        for p in (REPO_ROOT / d).rglob("*.py")
        if pattern.search(p.read_text(encoding="utf-8"))
    ]
    assert hits == []


def test_the_check_finds_an_unsafe_call(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import torch\nfrom torch import load as tload\n"
        "a = torch.load('x', weights_only=True)\nb = torch.load('x')\nc = tload('x', weights_only=False)\n"
    )
    assert torch_load_calls(sample) == [(3, True), (4, False), (5, False)]


# ------------------------------------------------------------------------------------------ hostile symbol


@pytest.mark.slow
def test_script_symbol_renders_as_text_in_the_report() -> None:
    workdir, _ = load_run()
    report = (workdir / "results" / "eval_report.html").read_text(encoding="utf-8")
    assert XSS_SYMBOL not in report
    assert html.escape(XSS_SYMBOL) in report  # shown, as text
    assert "<script" not in report.lower()  # the report carries no script at all


# --------------------------------------------------------------------------------------------- no network


def test_demo_run_makes_no_network_connection(shared_run: Path) -> None:
    workdir, network_log = shared_run, shared_network_log()
    lines = network_log.read_text().splitlines()
    assert [line for line in lines if " blocked " in line] == []
    armed = " ".join(line for line in lines if " armed " in line)
    for job in ("demo_data.py", "features.py", "hyperopt_worker.py", "train.py", "evaluate.py", "report.py"):
        assert job in armed, f"the {job} job did not run with sockets blocked"
    assert (workdir / "results" / "eval_report.html").is_file()
