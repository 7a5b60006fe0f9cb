"""Faults through real Snakemake jobs: the job fails (non-zero exit), prints one `marketrl error:` line naming the
culprit and no traceback (that goes to the job log, with the line), and leaves no output (Snakemake would otherwise
treat it as done next time).

The real Snakemake runs are `slow` (make test-slow); the two checks that stop at DAG parse run rules/common.smk's
checks in process (tests/support/dag_parse.py) and are in make test.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from marketrl.data.demo import generate_demo_files
from marketrl.workflow import pipeline
from tests.faults.pipeline import baseline_run, damaged_files, fast_tiny_config, new_workdir, run_snakemake
from tests.support.dag_parse import dag_parse
from tests.test_reader import BAD_INPUTS


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("marketrl error:")]


@pytest.mark.slow
def test_corrupt_dbn_file_fails_its_features_job(tmp_path: Path) -> None:
    data = tmp_path / "data"
    generate_demo_files(data, "2024-01-03", 1, seed=2)
    # Its header is intact (the DAG orders files by it); the records are cut at a frame boundary.
    bad = BAD_INPUTS["truncated zstd on a record boundary"][0](tmp_path)
    corrupt = bad.rename(data / "glbx-mdp3-20240102.ohlcv-1m.dbn.zst")  # starts first: no previous-day input
    config = fast_tiny_config(data={"source": "files", "files": str(data / "*.dbn.zst")})
    workdir = new_workdir(config, tmp_path / "runs")
    target = "results/features/glbx-mdp3-20240102.ohlcv-1m.parquet"
    result = run_snakemake(workdir, "--cores", "1", target, timeout=300)
    assert result.returncode != 0
    lines = error_lines(result.stdout + result.stderr)
    assert len(lines) == 1 and str(corrupt) in lines[0] and "truncated zstd" in lines[0]
    assert "Traceback" not in result.stdout + result.stderr
    log = (workdir / "results/logs/features/2024-01.log").read_text()  # features.batch: month, both files
    assert lines[0].removeprefix("marketrl error: ") in log
    assert "Traceback (most recent call last)" in log and "in read_bars" in log
    assert not (workdir / target).exists()
    assert list((workdir / "results/features").glob("*.parquet")) == []  # no table of the failed batch
    assert damaged_files(workdir / "results") == []  # and no temp file either


def test_file_without_a_readable_header_fails_the_dag_in_one_line(tmp_path: Path) -> None:
    # Input files are ordered by their header's start time when the DAG is built, so a file whose header cannot be
    # read stops the run there, naming the file, before any job starts (rules/common.smk, run in process).
    data = tmp_path / "data"
    generate_demo_files(data, "2024-01-03", 1, seed=2)
    corrupt = BAD_INPUTS["truncated zstd"][0](tmp_path).rename(data / "glbx-mdp3-20240102.ohlcv-1m.dbn.zst")
    parsed = dag_parse(fast_tiny_config(data={"source": "files", "files": str(data / "*.dbn.zst")}))
    assert parsed.status == 1
    (line,) = parsed.error_lines
    assert "config key 'data.files'" in line and str(corrupt) in line, line
    assert "no complete DBN metadata header" in line
    assert "Traceback" not in parsed.stderr


def test_file_without_a_readable_header_is_skipped_with_a_note_under_skip(tmp_path: Path) -> None:
    # With data.on_bad_file: skip the DAG builds; the note names the file, and the file stays an input, so its
    # features job is planned (it writes the empty, skipped table whose reason reaches the manifest and the report).
    data = tmp_path / "data"
    generate_demo_files(data, "2024-01-03", 1, seed=2)
    corrupt = BAD_INPUTS["truncated zstd"][0](tmp_path).rename(data / "glbx-mdp3-20240102.ohlcv-1m.dbn.zst")
    config = fast_tiny_config(
        data={"source": "files", "files": str(data / "*.dbn.zst"), "on_bad_file": "skip"}
    )
    parsed = dag_parse(config)
    assert parsed.status is None, parsed.stderr
    notes = {line for line in parsed.stderr.splitlines() if "skipping input file" in line}
    assert len(notes) == 1 and str(corrupt) in notes.pop()
    assert parsed.namespace["RAW_FILES"]["glbx-mdp3-20240102.ohlcv-1m"] == str(corrupt)
    features = pipeline.feature_files(parsed.config)
    assert "results/features/glbx-mdp3-20240102.ohlcv-1m.parquet" in features
    # a batch of its own (no month without a readable header): its skip touches no other file's job
    batches = pipeline.feature_batches(parsed.config)
    assert batches["glbx-mdp3-20240102.ohlcv-1m"] == ["glbx-mdp3-20240102.ohlcv-1m"]
    assert sorted(s for stems in batches.values() for s in stems) == sorted(parsed.namespace["RAW_FILES"])


@pytest.mark.slow
def test_a_skipped_file_gets_its_features_job_in_a_real_dry_run(tmp_path: Path) -> None:
    """The Snakemake form of the test above: the note on stderr, exit 0, and the skipped file's job planned."""
    data = tmp_path / "data"
    generate_demo_files(data, "2024-01-03", 1, seed=2)
    corrupt = BAD_INPUTS["truncated zstd"][0](tmp_path).rename(data / "glbx-mdp3-20240102.ohlcv-1m.dbn.zst")
    config = fast_tiny_config(
        data={"source": "files", "files": str(data / "*.dbn.zst"), "on_bad_file": "skip"}
    )
    workdir = new_workdir(config, tmp_path / "runs")
    result = run_snakemake(workdir, "--cores", "1", "-n", "results/features/manifest.json", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    notes = {line for line in result.stderr.splitlines() if "skipping input file" in line}
    assert len(notes) == 1 and str(corrupt) in notes.pop()
    assert "results/features/glbx-mdp3-20240102.ohlcv-1m.parquet" in result.stdout + result.stderr


@pytest.mark.slow
def test_hyperopt_json_with_wrong_types_fails_the_train_job(tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    shutil.copytree(baseline_run(), workdir, symlinks=True)  # copy2 keeps mtimes: nothing else looks stale
    hparams = workdir / "results" / "hyperopt" / "dqn.json"
    hparams.write_text('{"algo": "dqn", "best_params": {"learning_rate": "fast", "gamma": 0.9}}')
    target = "results/models/dqn/fold_0/seed_0/model.pt"
    result = run_snakemake(workdir, "--cores", "1", "-f", target, "--allowed-rules", "train", timeout=300)
    assert result.returncode != 0
    lines = error_lines(result.stdout + result.stderr)
    assert len(lines) == 1, result.stderr[-3000:]
    assert "HParamError: hparams.learning_rate: expected float, got str 'fast'" in lines[0]
    assert not (workdir / target).exists()
    assert not (workdir / target).with_name("train_log.json").exists()
    assert damaged_files(workdir / "results") == []
